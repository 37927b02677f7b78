//! Derives the host's lists of in-tree plugins from `plugins/*/Cargo.toml`,
//! so adding a plugin folder needs no hand-kept list:
//! - `$OUT_DIR/in_tree_plugins.rs`: `IN_TREE_PLUGINS`, every package name
//!   under `plugins/`, sorted;
//! - `$OUT_DIR/power_preference.rs`: `PREFERENCE`, the plugins whose
//!   meters `auto` prefers, ordered by their
//!   `[package.metadata.kernmlops] power_preference = N` (lower first).
//!
//! Outside a checkout (no `plugins/` folder) both lists are empty. Cargo
//! reruns this when the workspace's lock file changes (a new member) or a
//! plugin's manifest does; the plugin folder itself is not watched, since
//! `cargo xtask build-plugins` places the built `.so` files there.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
};

/// What one plugin's manifest says.
struct Manifest {
    name: String,
    power_preference: Option<u32>,
}

/// The value of `key = value` on `line`, quotes removed.
fn value_of<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let (k, v) = line.split_once('=')?;
    if k.trim() != key {
        return None;
    }
    let v = v.split('#').next().unwrap_or("").trim();
    Some(v.trim_matches('"'))
}

/// The package name and power preference of a plugin manifest. The
/// manifests are the workspace's own, written in one shape; the host's
/// unit test `in_tree_plugins_are_the_plugins_folder` reads them with a
/// full TOML parser and checks the result.
fn read_manifest(text: &str) -> Option<Manifest> {
    let mut section = String::new();
    let mut name = None;
    let mut power_preference = None;
    for line in text.lines().map(str::trim) {
        if let Some(header) = line.strip_prefix('[') {
            section = header.trim_end_matches(']').trim().to_owned();
            continue;
        }
        match section.as_str() {
            "package" => {
                if let Some(v) = value_of(line, "name") {
                    name = Some(v.to_owned());
                }
            }
            "package.metadata.kernmlops" => {
                if let Some(v) = value_of(line, "power_preference") {
                    power_preference = v.parse().ok();
                }
            }
            _ => {}
        }
    }
    Some(Manifest {
        name: name?,
        power_preference,
    })
}

fn manifests(plugins: &Path) -> Vec<Manifest> {
    let Ok(entries) = fs::read_dir(plugins) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    dirs.sort();
    dirs.iter()
        .filter_map(|d| {
            let manifest = d.join("Cargo.toml");
            println!("cargo:rerun-if-changed={}", manifest.display());
            read_manifest(&fs::read_to_string(manifest).ok()?)
        })
        .collect()
}

/// `pub const NAME: &[&str] = &[...];` with a doc comment.
fn const_list(doc: &str, name: &str, items: &[&str]) -> String {
    let mut out = String::new();
    for line in doc.lines() {
        let _ = writeln!(out, "/// {line}");
    }
    let _ = writeln!(out, "pub const {name}: &[&str] = &[");
    for item in items {
        let _ = writeln!(out, "    {item:?},");
    }
    out.push_str("];\n");
    out
}

/// Writes `text` to `path` unless it already holds it, so an unchanged
/// list does not make cargo rebuild the crate.
fn write_if_changed(path: &Path, text: &str) {
    if fs::read_to_string(path).is_ok_and(|old| old == text) {
        return;
    }
    if let Err(e) = fs::write(path, text) {
        panic!("writing {}: {e}", path.display());
    }
}

fn main() {
    // Read when the script runs, not when it was compiled: a build script
    // compiled in one checkout can be run for another (a copied target).
    let root = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()),
    );
    let workspace = root.parent().unwrap_or(&root);
    println!("cargo:rerun-if-changed=build.rs");
    println!(
        "cargo:rerun-if-changed={}",
        workspace.join("Cargo.lock").display()
    );
    let found = manifests(&workspace.join("plugins"));

    let mut names: Vec<&str> = found.iter().map(|m| m.name.as_str()).collect();
    names.sort_unstable();
    let mut preferred: Vec<(u32, &str)> = found
        .iter()
        .filter_map(|m| Some((m.power_preference?, m.name.as_str())))
        .collect();
    preferred.sort_unstable();
    let preferred: Vec<&str> = preferred.into_iter().map(|(_, n)| n).collect();

    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        panic!("cargo sets OUT_DIR for build scripts");
    };
    write_if_changed(
        &out.join("in_tree_plugins.rs"),
        &const_list(
            "The plugins shipped in this repository (`plugins/<name>`), by plugin\n\
             name, read from their `Cargo.toml` at build time (`core/build.rs`).\n\
             When a third-party plugin declares what one of these declares, the\n\
             third-party plugin is the one refused.",
            "IN_TREE_PLUGINS",
            &names,
        ),
    );
    write_if_changed(
        &out.join("power_preference.rs"),
        &const_list(
            "In-tree plugins whose meters `auto` prefers, in that order, before\n\
             third-party meters (each plugin's `[package.metadata.kernmlops]\n\
             power_preference`, read at build time by `core/build.rs`); modelled\n\
             sources come last whatever their plugin.",
            "PREFERENCE",
            &preferred,
        ),
    );
}
