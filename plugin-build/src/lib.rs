//! `build.rs` helper for kernmlops plugins: compiles `src/bpf/<name>.bpf.c`
//! into a libbpf-cargo skeleton in `OUT_DIR`, with the shared BPF headers
//! this crate carries (`kml.bpf.h`, the helpers every program uses, and a
//! `vmlinux.h` of kernel types; CO-RE keeps it portable), and tells cargo
//! when to rebuild. A plugin built outside this repository needs nothing
//! else: no checkout path, no headers of its own.
//!
//! Besides `<name>.skel.rs` it writes `kml_skel.rs`, which includes the
//! skeleton and names its types the same way for every plugin (`Builder`,
//! `Open`, `Loaded`, `types`), so `kernmlops-plugin-bpf`'s `bpf_probe!`
//! needs no per-plugin names.

use std::{
    env,
    path::{Path, PathBuf},
};

use libbpf_cargo::SkeletonBuilder;

/// `kml.bpf.h`: the clock, filters, loss counting and wake-ups every
/// kernmlops BPF program uses.
pub const KML_BPF_H: &str = include_str!("../bpf/kml.bpf.h");

/// `vmlinux.h`: kernel types from BTF (regenerate with `cargo xtask
/// vmlinux`).
pub const VMLINUX_H: &str = include_str!("../bpf/vmlinux.h");

/// Writes the shared headers into `dir` (created), for a build that wants
/// them on disk, and returns it.
pub fn write_headers(dir: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    for (name, text) in [("kml.bpf.h", KML_BPF_H), ("vmlinux.h", VMLINUX_H)] {
        let path = dir.join(name);
        // Unchanged files keep their times, so clang's inputs look the same.
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text) {
            std::fs::write(&path, text)?;
        }
    }
    Ok(dir.to_owned())
}

/// Builds the skeleton of `src/bpf/<name>.bpf.c` as `$OUT_DIR/<name>.skel.rs`
/// and `$OUT_DIR/kml_skel.rs`.
///
/// The shared headers come from this crate. `KERNMLOPS_BPF_INCLUDE` names
/// a folder to use instead (one holding `kml.bpf.h` and `vmlinux.h`), and
/// `KERNMLOPS_VMLINUX_H` a different `vmlinux.h` alone.
///
/// # Panics
/// When the program does not compile; the build script fails with clang's
/// message, which is what a developer needs to see.
pub fn build_bpf(name: &str) {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let include = match env::var_os("KERNMLOPS_BPF_INCLUDE") {
        Some(dir) => PathBuf::from(dir),
        None => write_headers(&out_dir.join("kml-include"))
            .unwrap_or_else(|e| panic!("writing the BPF headers into OUT_DIR: {e}")),
    };
    let mut include_dirs = vec![include.clone()];
    if let Some(vmlinux) = env::var_os("KERNMLOPS_VMLINUX_H") {
        let vmlinux = PathBuf::from(vmlinux);
        let dir = out_dir.join("kml-vmlinux");
        std::fs::create_dir_all(&dir).expect("creating OUT_DIR/kml-vmlinux");
        std::fs::copy(&vmlinux, dir.join("vmlinux.h"))
            .unwrap_or_else(|e| panic!("KERNMLOPS_VMLINUX_H={}: {e}", vmlinux.display()));
        include_dirs.insert(0, dir);
        println!("cargo:rerun-if-changed={}", vmlinux.display());
    }
    let src_dir = manifest_dir.join("src/bpf");
    let source = src_dir.join(format!("{name}.bpf.c"));
    let skel = out_dir.join(format!("{name}.skel.rs"));

    // v3: 32-bit subregisters and atomics (the staged output's exchange);
    // every kernel kernmlops supports (5.8+) runs it.
    let mut args = vec![
        "-Wall".into(),
        "-Wno-unused-function".into(),
        "-mcpu=v3".into(),
    ];
    args.extend(include_dirs.iter().map(|d| format!("-I{}", d.display())));
    args.push(format!("-I{}", src_dir.display()));
    if let Err(e) = SkeletonBuilder::new()
        .source(&source)
        .clang_args(args)
        .build_and_generate(&skel)
    {
        panic!("compiling {}: {e:#}", source.display());
    }
    // The skeleton names libbpf-rs; use the SDK's, so a plugin needs no
    // libbpf-rs dependency of its own and the versions cannot differ.
    let generated = std::fs::read_to_string(&skel)
        .unwrap_or_else(|e| panic!("reading {}: {e}", skel.display()));
    std::fs::write(&skel, use_sdk_libbpf(&generated))
        .unwrap_or_else(|e| panic!("writing {}: {e}", skel.display()));
    std::fs::write(out_dir.join("kml_skel.rs"), aliases(name))
        .unwrap_or_else(|e| panic!("writing OUT_DIR/kml_skel.rs: {e}"));

    println!("cargo:rerun-if-env-changed=KERNMLOPS_BPF_INCLUDE");
    println!("cargo:rerun-if-env-changed=KERNMLOPS_VMLINUX_H");
    rerun_for_headers(&src_dir);
    if env::var_os("KERNMLOPS_BPF_INCLUDE").is_some() {
        rerun_for_headers(&include);
    }
    println!("cargo:rerun-if-changed={}", source.display());
}

/// `kml_skel.rs`: the skeleton, and its types under names every plugin
/// shares.
fn aliases(name: &str) -> String {
    let camel = camel_case(name);
    format!(
        "include!(concat!(env!(\"OUT_DIR\"), \"/{name}.skel.rs\"));\n\
         pub type Builder = {camel}SkelBuilder;\n\
         pub type Open = Open{camel}Skel<'static>;\n\
         pub type Loaded = {camel}Skel<'static>;\n"
    )
}

/// Rewrites the skeleton's `libbpf_rs::` paths to the copy re-exported by
/// `kernmlops-plugin-bpf`.
fn use_sdk_libbpf(code: &str) -> String {
    const PATH: &str = "libbpf_rs::";
    let mut out = String::with_capacity(code.len() + 4096);
    let mut rest = code;
    while let Some(i) = rest.find(PATH) {
        let before = rest[..i].chars().next_back();
        out.push_str(&rest[..i]);
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            out.push_str(PATH);
        } else {
            out.push_str("::kernmlops_plugin_bpf::libbpf_rs::");
        }
        rest = &rest[i + PATH.len()..];
    }
    out.push_str(rest);
    out
}

/// `quanta_runtime` -> `QuantaRuntime`, as libbpf-cargo names skeletons.
fn camel_case(name: &str) -> String {
    name.split('_')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut c = p.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skeleton_names_follow_libbpf_cargo() {
        assert_eq!(camel_case("quanta_runtime"), "QuantaRuntime");
        assert_eq!(camel_case("mm_rss_stat"), "MmRssStat");
        assert!(aliases("block_io").contains("pub type Builder = BlockIoSkelBuilder;"));
    }

    #[test]
    fn the_skeleton_uses_the_sdk_libbpf() {
        assert_eq!(
            use_sdk_libbpf("use libbpf_rs::skel::Skel; x: libbpf_rs::Result<()>, my_libbpf_rs::y"),
            "use ::kernmlops_plugin_bpf::libbpf_rs::skel::Skel; x: ::kernmlops_plugin_bpf::libbpf_rs::Result<()>, my_libbpf_rs::y"
        );
    }

    #[test]
    fn the_headers_travel_with_the_crate() {
        assert!(KML_BPF_H.contains("kml_reserve"));
        assert!(VMLINUX_H.contains("struct task_struct {"));
    }
}
