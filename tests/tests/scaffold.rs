//! `cargo xtask new-plugin` in a scratch copy of the workspace produces a
//! plugin that builds, passes its own test, loads and collects rows with no
//! edits.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use kernmlops_e2e::*;

/// Copies the workspace source (no build output, data, git or built .so),
/// each file with its modification time: cargo names a workspace crate's
/// build by its path relative to the workspace, so in a shared target
/// folder the copied crates are as fresh as the workspace's own and only
/// the new crate compiles.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir").flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if ["target", "data", ".git"].contains(&name.as_ref()) || name.ends_with(".so") {
            continue;
        }
        let path = entry.path();
        let dest = to.join(&*name);
        if path.is_dir() {
            copy_tree(&path, &dest);
        } else {
            std::fs::copy(&path, &dest).expect("copy");
            let modified = entry.metadata().and_then(|m| m.modified()).expect("mtime");
            std::fs::File::options()
                .write(true)
                .open(&dest)
                .and_then(|f| f.set_modified(modified))
                .expect("keeping the mtime");
        }
    }
}

fn cargo(dir: &Path, target: &Path, args: &[&str]) {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.env("CARGO_TARGET_DIR", target);
    succeed(cmd, dir, "cargo", args);
}

/// Runs `cmd ARGS` in `dir`; a failure shows its output.
fn succeed(mut cmd: Command, dir: &Path, what: &str, args: &[&str]) {
    let out = cmd
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} {args:?} failed in {}:\n{}\n{}",
        dir.display(),
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// `cargo xtask ARGS` in the workspace copy `dir`, as cargo runs it there:
/// the workspace's xtask binary (built in `target` now, a no-op after
/// `scripts/test`'s `cargo xtask build-plugins`) with `CARGO_MANIFEST_DIR`
/// naming the copy's xtask folder, which xtask takes as its workspace.
/// Building the copy's own xtask would compile it and its dependencies in
/// a target of their own: in a shared one, the copy's binary would be
/// uplifted over the real one.
fn xtask_in(dir: &Path, target: &Path, args: &[&str]) {
    cargo(
        &workspace_root(),
        target,
        &["build", "--quiet", "--package", "xtask"],
    );
    let mut xtask = Command::new(target.join("debug/xtask"));
    xtask.env("CARGO_MANIFEST_DIR", dir.join("xtask"));
    succeed(xtask, dir, "xtask", args);
}

#[test]
fn root_new_plugin_scaffold_builds_loads_and_collects() {
    if !require_root("root_new_plugin_scaffold_builds_loads_and_collects") {
        return;
    }
    ensure_built();
    let scratch = temp_dir("scaffold").join("workspace");
    copy_tree(&workspace_root(), &scratch);
    // Share the build output so only the new crate compiles.
    let target: PathBuf = artifact_dir().parent().expect("target dir").to_owned();

    xtask_in(&scratch, &target, &["new-plugin", "demo_probe"]);
    for f in [
        "Cargo.toml",
        "build.rs",
        "README.md",
        "src/lib.rs",
        "src/bpf/demo_probe.bpf.c",
        "src/bpf/demo_probe.h",
    ] {
        assert!(
            scratch.join("plugins/demo_probe").join(f).is_file(),
            "scaffold lacks {f}"
        );
    }
    cargo(
        &scratch,
        &target,
        &["build", "--release", "--quiet", "-p", "demo_probe"],
    );
    cargo(
        &scratch,
        &target,
        &["test", "--release", "--quiet", "-p", "demo_probe"],
    );

    let plugins = temp_dir("scaffold-plugins");
    std::fs::copy(
        target.join("release/libdemo_probe.so"),
        plugins.join("demo_probe.so"),
    )
    .expect("copy .so");
    let output = temp_dir("scaffold-out");
    let _serial = serial();
    let c = Collector::start(&[
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "demo_probe",
        "--duration",
        "2s",
        "--output",
        output.to_str().expect("utf8"),
    ]);
    let done = c.wait();
    assert!(
        done.status.success(),
        "collecting with the new plugin failed:\n{}",
        done.stderr
    );
    let dir = done.dir.expect("collection folder printed");
    let rows: usize = read_table(&dir.join("demo_probe.arrow"))
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert!(rows > 0, "the scaffolded probe collected no rows");
    let _ = std::fs::remove_file(target.join("release/libdemo_probe.so"));
}

/// A plugin built outside this repository: `cargo xtask new-plugin
/// --out-of-tree` writes a crate of its own that depends on the SDK crates
/// by path (no checkout paths in its build.rs: kernmlops-plugin-build
/// carries the BPF headers); it builds, passes its own tests, and the host
/// loads it from a plugin folder and collects its rows.
#[test]
fn root_out_of_tree_plugin_builds_loads_and_collects() {
    if !require_root("root_out_of_tree_plugin_builds_loads_and_collects") {
        return;
    }
    ensure_built();
    let base = temp_dir("out-of-tree");
    let crate_dir = base.join("oot_probe");
    let target: PathBuf = artifact_dir().parent().expect("target dir").to_owned();
    cargo(
        &workspace_root(),
        &workspace_root().join("target"),
        &[
            "xtask",
            "new-plugin",
            "oot_probe",
            "--out-of-tree",
            crate_dir.to_str().expect("utf8"),
        ],
    );
    let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).expect("Cargo.toml");
    assert!(manifest.contains("[workspace]"), "a workspace of its own");
    let build_rs = std::fs::read_to_string(crate_dir.join("build.rs")).expect("build.rs");
    assert!(
        !build_rs.contains(workspace_root().to_str().expect("utf8"))
            && !build_rs.contains("KERNMLOPS_BPF_INCLUDE"),
        "build.rs names no checkout path: {build_rs}"
    );
    // Sharing the build output reuses the SDK crates the workspace built.
    cargo(&crate_dir, &target, &["build", "--release", "--quiet"]);
    cargo(&crate_dir, &target, &["test", "--release", "--quiet"]);

    let plugins = base.join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin folder");
    std::fs::copy(
        target.join("release/liboot_probe.so"),
        plugins.join("oot_probe.so"),
    )
    .expect("copy .so");
    let _ = std::fs::remove_file(target.join("release/liboot_probe.so"));
    let output = base.join("data");
    let _serial = serial();
    let done = Collector::start(&[
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "oot_probe",
        "--duration",
        "2s",
        "--output",
        output.to_str().expect("utf8"),
    ])
    .wait();
    assert!(done.status.success(), "{}", done.stderr);
    let dir = done.dir.expect("collection folder printed");
    let rows: usize = read_table(&dir.join("oot_probe.arrow"))
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert!(rows > 0, "the out-of-tree probe collected no rows");

    // The same plugin built with panic = "abort" does not compile: a panic
    // it could not unwind would kill the host.
    let manifest = manifest.replace("panic = \"unwind\"", "panic = \"abort\"");
    std::fs::write(crate_dir.join("Cargo.toml"), manifest).expect("Cargo.toml");
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&crate_dir)
        .env("CARGO_TARGET_DIR", &target)
        .args(["check", "--release"])
        .output()
        .expect("running cargo check");
    assert!(!out.status.success(), "a panic = \"abort\" plugin compiled");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("kernmlops plugins must be built with panic = \"unwind\""),
        "{stderr}"
    );
    std::fs::remove_dir_all(&base).ok();
}
