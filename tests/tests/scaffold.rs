//! `cargo xtask new-plugin` in a scratch copy of the workspace produces a
//! plugin that builds, passes its own test, loads and collects rows with no
//! edits.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use kernmlops_e2e::*;

/// Copies the workspace source (no build output, data, git or built .so).
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
        }
    }
}

fn cargo(dir: &Path, target: &Path, args: &[&str]) {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target)
        .args(args)
        .output()
        .expect("running cargo");
    assert!(
        out.status.success(),
        "cargo {args:?} failed in {}:\n{}\n{}",
        dir.display(),
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn root_new_plugin_scaffold_builds_loads_and_collects() {
    if !require_root("root_new_plugin_scaffold_builds_loads_and_collects") {
        return;
    }
    ensure_built();
    let scratch = temp_dir("scaffold").join("workspace");
    copy_tree(&workspace_root(), &scratch);
    // Share the build output so only the new crate and path crates compile.
    let target: PathBuf = artifact_dir().parent().expect("target dir").to_owned();

    // xtask builds in a target of its own: a shared one would get the
    // scratch copy's xtask binary uplifted over the real one.
    cargo(
        &scratch,
        &scratch.join("target"),
        &["xtask", "new-plugin", "demo_probe"],
    );
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
