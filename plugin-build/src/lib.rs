//! `build.rs` helper for kernmlops plugins: compiles `src/bpf/<name>.bpf.c`
//! with the shared headers in `bpf/` into a libbpf-cargo skeleton in
//! `OUT_DIR`, and tells cargo when to rebuild.

use std::{
    env,
    path::{Path, PathBuf},
};

use libbpf_cargo::SkeletonBuilder;

/// Builds the skeleton of `src/bpf/<name>.bpf.c` as `$OUT_DIR/<name>.skel.rs`.
///
/// The shared headers are found in `KERNMLOPS_BPF_INCLUDE` if set, else in
/// the nearest `bpf/` folder holding `kml.bpf.h` above the plugin.
///
/// # Panics
/// When the program does not compile; the build script fails with clang's
/// message, which is what a developer needs to see.
pub fn build_bpf(name: &str) {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let include = shared_include_dir(&manifest_dir);
    let src_dir = manifest_dir.join("src/bpf");
    let source = src_dir.join(format!("{name}.bpf.c"));
    let skel = out_dir.join(format!("{name}.skel.rs"));

    if let Err(e) = SkeletonBuilder::new()
        .source(&source)
        .clang_args([
            "-Wall".into(),
            "-Wno-unused-function".into(),
            format!("-I{}", include.display()),
            format!("-I{}", src_dir.display()),
        ])
        .build_and_generate(&skel)
    {
        panic!("compiling {}: {e:#}", source.display());
    }

    println!("cargo:rerun-if-env-changed=KERNMLOPS_BPF_INCLUDE");
    for dir in [&src_dir, &include] {
        rerun_for_headers(dir);
    }
    println!("cargo:rerun-if-changed={}", source.display());
}

fn shared_include_dir(manifest_dir: &Path) -> PathBuf {
    if let Some(dir) = env::var_os("KERNMLOPS_BPF_INCLUDE") {
        return PathBuf::from(dir);
    }
    manifest_dir
        .ancestors()
        .map(|d| d.join("bpf"))
        .find(|d| d.join("kml.bpf.h").is_file())
        .unwrap_or_else(|| {
            panic!(
                "no bpf/kml.bpf.h above {}; set KERNMLOPS_BPF_INCLUDE to the folder holding it",
                manifest_dir.display()
            )
        })
}

fn rerun_for_headers(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "h") {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}
