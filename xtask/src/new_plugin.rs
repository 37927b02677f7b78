//! `cargo xtask new-plugin NAME`: scaffolds `plugins/NAME/` from the
//! templates in `xtask/templates/`, a one-table sched_switch probe that
//! builds, loads and collects rows before any edit.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::{display, workspace_root};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Plugin name, lowercase snake_case: also its crate, probe, table and
    /// BPF file name.
    name: String,
    /// One line saying what the probe measures.
    #[arg(long, value_name = "TEXT")]
    description: Option<String>,
    /// Create a plugin of its own outside this repository, in DIR (which
    /// must not exist), depending on this checkout's SDK crates by path.
    #[arg(long, value_name = "DIR")]
    out_of_tree: Option<PathBuf>,
}

/// Every template file: its path in the new plugin (placeholders allowed)
/// and its text. Placeholders: `__NAME__` (snake_case), `__Name__`
/// (CamelCase, as libbpf-cargo names the skeleton), `__NAME_UPPER__`,
/// `__DESCRIPTION__`.
const TEMPLATES: &[(&str, &str)] = &[
    ("Cargo.toml", include_str!("../templates/Cargo.toml.tmpl")),
    ("build.rs", include_str!("../templates/build.rs")),
    ("README.md", include_str!("../templates/README.md")),
    ("src/lib.rs", include_str!("../templates/src/lib.rs")),
    (
        "src/bpf/__NAME__.bpf.c",
        include_str!("../templates/src/bpf/__NAME__.bpf.c"),
    ),
    (
        "src/bpf/__NAME__.h",
        include_str!("../templates/src/bpf/__NAME__.h"),
    ),
    (
        "tests/__NAME__.rs",
        include_str!("../templates/tests/__NAME__.rs"),
    ),
];

/// Words a crate name cannot be: Rust keywords (strict and reserved, all
/// editions) and the crates every Rust program can name.
const RESERVED_WORDS: &[&str] = &[
    "abstract",
    "alloc",
    "as",
    "async",
    "await",
    "become",
    "box",
    "break",
    "const",
    "continue",
    "core",
    "crate",
    "do",
    "dyn",
    "else",
    "enum",
    "extern",
    "false",
    "final",
    "fn",
    "for",
    "gen",
    "if",
    "impl",
    "in",
    "let",
    "loop",
    "macro",
    "match",
    "mod",
    "move",
    "mut",
    "override",
    "priv",
    "proc_macro",
    "pub",
    "ref",
    "return",
    "self",
    "static",
    "std",
    "struct",
    "super",
    "test",
    "trait",
    "true",
    "try",
    "type",
    "typeof",
    "unsafe",
    "unsized",
    "use",
    "virtual",
    "where",
    "while",
    "yield",
];

/// Names the template's `src/lib.rs` imports: the probe's CamelCase type
/// may not be one of them.
const TEMPLATE_IMPORTS: &[&str] = &["BpfProbe", "BpfSpec"];

/// Tables the host writes itself (reserved in `plugin-api/src/spec.rs`).
const HOST_TABLES: &[&str] = &["system_info", "manifest"];

/// The kernel types header BPF programs compile against.
const VMLINUX_H: &str = "plugin-build/bpf/vmlinux.h";

const DEFAULT_DESCRIPTION: &str = "TODO: one line saying what this probe measures";

pub fn run(args: &Args) -> Result<()> {
    let root = workspace_root();
    let name = args.name.as_str();
    check_name(name)?;
    let description = args.description.as_deref().unwrap_or(DEFAULT_DESCRIPTION);
    check_description(description)?;
    if let Some(dir) = &args.out_of_tree {
        return out_of_tree(dir, name, description, &root);
    }
    check_unused(name, &root)?;

    let dest = root.join("plugins").join(name);
    // Render outside plugins/: cargo's `plugins/*` member glob refuses any
    // folder there without a Cargo.toml, so a half-written one would break
    // every cargo command in the workspace.
    let staging = root.join(format!(".new-plugin-{name}.tmp"));
    if staging.exists() {
        fs::remove_dir_all(&staging)
            .with_context(|| format!("removing leftover {}", staging.display()))?;
    }
    let written = write_plugin(&staging, name, description).and_then(|files| {
        fs::rename(&staging, &dest)
            .with_context(|| format!("moving {} to {}", staging.display(), dest.display()))?;
        Ok(files)
    });
    let files = match written {
        Ok(files) => files,
        Err(e) => {
            let _ = fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    format_rust(&dest, &files);

    println!("created {}/", display(&dest));
    for file in &files {
        println!("  {}", file.display());
    }
    let steps = [
        (
            format!("cargo test -p {name}"),
            "checks the declaration (the load test needs root)".to_owned(),
        ),
        (
            "cargo xtask build-plugins".to_owned(),
            format!(
                "builds the host (which counts {name} as in-tree: core/build.rs reads plugins/*/Cargo.toml) and places plugins/{name}.so"
            ),
        ),
        (
            format!("sudo target/release/kernmlops run --plugins {name} --duration 5s"),
            "collects for 5 s into data/".to_owned(),
        ),
    ];
    println!("\nnext steps:");
    for (command, what) in &steps {
        println!("  # {what}\n  {command}");
    }
    println!(
        "\nthen make it measure what it should: the hook in src/bpf/{name}.bpf.c, the\n\
         record in src/bpf/{name}.h, its columns in src/lib.rs (one line each) and\n\
         the TODOs in README.md. Table names must be unique across all plugins."
    );
    println!(
        "\na tracepoint's arguments (what a tp_btf program receives) are in {VMLINUX_H}:\n\
         \x20 grep -n 'btf_trace_sched_switch)' {VMLINUX_H}\n\
         shows `typedef void (*btf_trace_sched_switch)(void *, bool, struct task_struct *, ...)`:\n\
         the first `void *` is the context, the rest are the arguments, in order.\n\
         List every tracepoint with: grep -o 'btf_trace_[a-z0-9_]*' {VMLINUX_H}"
    );
    Ok(())
}

/// Creates the plugin as a crate of its own in `dir`, with the SDK crates
/// of the checkout at `root` as path dependencies and the workspace's lock
/// file, so it builds with the same dependency versions.
fn out_of_tree(dir: &Path, name: &str, description: &str, root: &Path) -> Result<()> {
    if dir.exists() {
        bail!("{} already exists: pick a new folder", display(dir));
    }
    let sdk = root
        .canonicalize()
        .with_context(|| format!("resolving {}", root.display()))?;
    let files = write_plugin(dir, name, description)?;
    fs::write(
        dir.join("Cargo.toml"),
        render(OUT_OF_TREE_MANIFEST, name, description)
            .replace("__SDK__", &sdk.display().to_string()),
    )
    .with_context(|| format!("writing {}", dir.join("Cargo.toml").display()))?;
    // Same versions as the SDK was built and tested with.
    let _ = fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock"));
    format_rust(dir, &files);
    println!(
        "created {}/ (outside the kernmlops workspace)",
        display(dir)
    );
    for file in &files {
        println!("  {}", file.display());
    }
    println!(
        "
next steps:
           cd {dir}
           cargo test                 # the declaration; the load test needs root
           cargo build --release      # target/release/lib{name}.so
           install -m 0644 target/release/lib{name}.so <plugin folder>/{name}.so
           sudo kernmlops run --plugin-dir <plugin folder> --plugins {name} --duration 5s",
        dir = display(dir)
    );
    Ok(())
}

/// `Cargo.toml` of a plugin outside the workspace (`__SDK__`: the checkout).
const OUT_OF_TREE_MANIFEST: &str = include_str!("../templates/Cargo.out-of-tree.toml.tmpl");

/// Checks that `name` works as a crate, Rust identifier, table and C
/// identifier prefix.
fn check_name(name: &str) -> Result<()> {
    let problem = if let Some(problem) = kernmlops_sys::names::snake_case_problem(name) {
        Some(problem)
    } else if name.len() > 64 {
        Some("is longer than 64 characters".to_owned())
    } else if RESERVED_WORDS.contains(&name) {
        Some("is a Rust keyword or a built-in crate name".to_owned())
    } else if HOST_TABLES.contains(&name) {
        Some("is a table the host writes itself".to_owned())
    } else if TEMPLATE_IMPORTS.contains(&camel_case(name).as_str()) {
        Some(format!(
            "would name the probe type {}, which the plugin imports",
            camel_case(name)
        ))
    } else {
        None
    };
    match problem {
        Some(p) => bail!("plugin name {name:?} {p}"),
        None => Ok(()),
    }
}

/// Checks that nothing in the workspace already uses `name`.
fn check_unused(name: &str, root: &Path) -> Result<()> {
    let dir = root.join("plugins").join(name);
    if dir.exists() {
        bail!("{} already exists: pick another name", display(&dir));
    }
    // A crate of the same name (workspace member or dependency) would make
    // `-p NAME` and `use NAME::` ambiguous.
    let members = crate::cargo_metadata(root)?;
    let member = members
        .get("packages")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("name").and_then(serde_json::Value::as_str))
        .any(|crate_name| same_crate(crate_name, name));
    if member {
        bail!("the workspace already has a crate named {name:?}: pick another name");
    }
    if let Ok(lock) = fs::read_to_string(root.join("Cargo.lock")) {
        if dependency_names(&lock).any(|crate_name| same_crate(crate_name, name)) {
            bail!("a dependency is already named {name:?} (Cargo.lock): pick another name");
        }
    }
    // The record type `struct NAME_event` must not clash with a kernel type.
    let vmlinux = root.join(VMLINUX_H);
    if let Ok(header) = fs::read_to_string(&vmlinux) {
        if header.contains(&format!("struct {name}_event {{")) {
            bail!(
                "the kernel already has a struct {name}_event ({VMLINUX_H}), which the probe's record would clash with: pick another name"
            );
        }
    }
    Ok(())
}

/// Crate names are compared as Rust sees them: `-` is `_`.
fn same_crate(a: &str, b: &str) -> bool {
    a.replace('-', "_") == b.replace('-', "_")
}

/// Names of the packages in a Cargo.lock that come from a registry or git
/// (those with a `source`). Path packages are left out: the lock may still
/// list a member that was just deleted.
fn dependency_names(lock: &str) -> impl Iterator<Item = &str> {
    lock.split("[[package]]").filter_map(|block| {
        let mut name = None;
        let mut sourced = false;
        for line in block.lines() {
            if let Some(n) = line.strip_prefix("name = \"") {
                name = n.strip_suffix('"');
            }
            sourced |= line.starts_with("source = ");
        }
        name.filter(|_| sourced)
    })
}

/// The description goes into TOML and Rust strings and a C comment: keep
/// it one plain line.
fn check_description(text: &str) -> Result<()> {
    if text.trim().is_empty() {
        bail!("--description is empty");
    }
    if let Some(c) = text
        .chars()
        .find(|c| c.is_control() || matches!(c, '"' | '\\'))
    {
        bail!("--description has {c:?}: use one line without quotes or backslashes");
    }
    if text.contains("*/") {
        bail!("--description has \"*/\", which would end a C comment");
    }
    Ok(())
}

/// `snake_case` to `CamelCase` as libbpf-cargo names skeleton types
/// (`quanta_runtime` -> `QuantaRuntime` -> `QuantaRuntimeSkel`).
fn camel_case(name: &str) -> String {
    name.split('_')
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|first| first.to_uppercase().chain(chars).collect::<String>())
                .unwrap_or_default()
        })
        .collect()
}

fn render(text: &str, name: &str, description: &str) -> String {
    text.replace("__NAME_UPPER__", &name.to_ascii_uppercase())
        .replace("__NAME__", name)
        .replace("__Name__", &camel_case(name))
        .replace("__DESCRIPTION__", description)
}

/// Writes every template into `dir`; returns the paths written, relative
/// to `dir`.
fn write_plugin(dir: &Path, name: &str, description: &str) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for (path, text) in TEMPLATES {
        let rel = PathBuf::from(render(path, name, description));
        let path = dir.join(&rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        fs::write(&path, render(text, name, description))
            .with_context(|| format!("writing {}", path.display()))?;
        files.push(rel);
    }
    Ok(files)
}

/// Formats the generated Rust, whose line lengths depend on the name, so
/// that `cargo fmt --check` passes on a fresh plugin. Best effort.
fn format_rust(dir: &Path, files: &[PathBuf]) {
    let rust: Vec<PathBuf> = files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
        .map(|f| dir.join(f))
        .collect();
    let status = Command::new("rustfmt")
        .args(["--edition", "2021"])
        .args(&rust)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => eprintln!("warning: rustfmt failed ({s}); run `cargo fmt` in the new plugin"),
        Err(e) => eprintln!("warning: could not run rustfmt ({e}); run `cargo fmt` later"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn camel_case_matches_libbpf_cargo() {
        for (snake, camel) in [
            ("quanta_runtime", "QuantaRuntime"),
            ("demo_probe", "DemoProbe"),
            ("x", "X"),
            ("tlb2_misses", "Tlb2Misses"),
            ("a_1b", "A1b"),
        ] {
            assert_eq!(camel_case(snake), camel, "camel_case({snake})");
        }
    }

    #[test]
    fn names_are_checked() {
        for good in ["demo_probe", "x", "tlb2_misses", "block_io"] {
            assert!(check_name(good).is_ok(), "{good} should be accepted");
        }
        for bad in [
            "",
            "Demo",
            "2fast",
            "_x",
            "x_",
            "a__b",
            "demo-probe",
            "démo",
            "type",
            "async",
            "std",
            "system_info",
            "bpf_spec",
            "bpf_probe",
        ] {
            assert!(check_name(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn only_sourced_lock_packages_are_dependencies() {
        let lock = r#"
version = 4

[[package]]
name = "libbpf-rs"
version = "0.27.0"
source = "registry+https://github.com/rust-lang/crates.io-index"

[[package]]
name = "demo_probe"
version = "0.1.0"
dependencies = [
 "libbpf-rs",
]
"#;
        let names: Vec<&str> = dependency_names(lock).collect();
        assert_eq!(names, ["libbpf-rs"]);
        assert!(same_crate("libbpf-rs", "libbpf_rs"));
    }

    #[test]
    fn descriptions_are_checked() {
        assert!(check_description("Page faults per process").is_ok());
        for bad in [
            "",
            "  ",
            "a \"quoted\" b",
            "a\\b",
            "two\nlines",
            "ends */ comment",
        ] {
            assert!(check_description(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn rendering_leaves_no_placeholder() {
        for (path, text) in TEMPLATES {
            let out = render(&format!("{path}\n{text}"), "demo_probe", "Demo");
            for placeholder in ["__NAME", "__Name__", "__DESCRIPTION__"] {
                assert!(
                    !out.contains(placeholder),
                    "{path}: {placeholder} left after rendering"
                );
            }
        }
    }

    #[test]
    fn rendering_names_the_skeleton_and_record() {
        let lib = render(
            include_str!("../templates/src/lib.rs"),
            "demo_probe",
            "Demo",
        );
        for expected in [
            "probe: DemoProbe,",
            "name: \"demo_probe\",",
            "demo_probe(events, demo_probe_event, rate = ",
            "probes: [BpfProbe<DemoProbe>]",
        ] {
            assert!(lib.contains(expected), "lib.rs lacks {expected:?}");
        }
        let header = render(
            include_str!("../templates/src/bpf/__NAME__.h"),
            "demo_probe",
            "Demo",
        );
        assert!(header.contains("#ifndef DEMO_PROBE_H"), "header guard");
        assert!(
            header.contains("struct demo_probe_event {"),
            "record struct"
        );
    }
}
