//! `cargo xtask build-plugins`: builds the host and every plugin crate under
//! `plugins/` in one cargo invocation, then places each plugin's `.so` in the
//! plugin folder, replacing old ones atomically.

use std::{
    fs::{self, Permissions},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::{cargo, cargo_metadata, display, replace_with, workspace_root};

/// The package of the `kernmlops` command, built along with the plugins
/// when it exists.
const HOST_PACKAGE: &str = "kernmlops-cli";
/// The command's binary, in the target folder.
const HOST_BINARY: &str = "kernmlops";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Build the dev profile (target/debug) instead of release.
    #[arg(long)]
    debug: bool,
    /// Where to place the .so files [default: <workspace>/plugins].
    #[arg(long, value_name = "DIR")]
    plugin_dir: Option<PathBuf>,
}

/// A plugin crate of the workspace.
#[derive(Debug)]
struct Plugin {
    package: String,
    /// Its library's crate name: the built file is `lib<lib_name>.so`.
    lib_name: String,
}

/// What `cargo metadata` says about the workspace.
#[derive(Debug)]
struct Workspace {
    target_dir: PathBuf,
    plugins: Vec<Plugin>,
    has_host: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let root = workspace_root();
    let ws = read_workspace(&root)?;
    if ws.plugins.is_empty() {
        bail!(
            "no plugin crates under {}: create one with `cargo xtask new-plugin NAME`",
            root.join("plugins").display()
        );
    }

    let profile = if args.debug { "debug" } else { "release" };
    let mut build = Command::new(cargo());
    build.current_dir(&root).arg("build");
    if !args.debug {
        build.arg("--release");
    }
    if ws.has_host {
        build.args(["-p", HOST_PACKAGE]);
    }
    for plugin in &ws.plugins {
        build.args(["-p", &plugin.package]);
    }
    let status = build.status().context("running cargo build")?;
    if !status.success() {
        bail!("cargo build failed ({status})");
    }

    let plugin_dir = args
        .plugin_dir
        .clone()
        .unwrap_or_else(|| root.join("plugins"));
    make_plugin_dir(&plugin_dir)?;
    let built_dir = ws.target_dir.join(profile);
    for plugin in &ws.plugins {
        let built = built_dir.join(format!("lib{}.so", plugin.lib_name));
        if !built.is_file() {
            bail!(
                "cargo built {} but {} is missing",
                plugin.package,
                built.display()
            );
        }
        let placed = place(&built, &plugin_dir, &plugin.lib_name)?;
        let size = fs::metadata(&placed).map(|m| m.len()).unwrap_or(0);
        println!(
            "placed {} ({} KiB, from {})",
            display(&placed),
            size.div_ceil(1024),
            display(&built)
        );
    }
    warn_stale(&plugin_dir, &ws.plugins);
    if ws.has_host {
        println!("host: {}", display(&built_dir.join(HOST_BINARY)));
    }
    Ok(())
}

/// Writes the debug information of `built` into `out` (`objcopy
/// --only-keep-debug`).
fn split_debug(built: &Path, out: &Path) -> std::io::Result<()> {
    objcopy(&[
        "--only-keep-debug".as_ref(),
        built.as_os_str(),
        out.as_os_str(),
    ])
}

/// Strips debug information and local symbols from `file` in place and
/// links it to its debug file by name.
fn strip_debug(file: &Path, debug: &Path) -> std::io::Result<()> {
    let link = format!("--add-gnu-debuglink={}", debug.display());
    objcopy(&[
        "--strip-debug".as_ref(),
        "--strip-unneeded".as_ref(),
        link.as_ref(),
        file.as_os_str(),
    ])
}

fn objcopy(args: &[&std::ffi::OsStr]) -> std::io::Result<()> {
    let out = Command::new("objcopy").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "objcopy {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Reads the workspace's plugin crates (every member under `plugins/` with a
/// cdylib), whether the host package exists, and the target folder (which
/// honours `CARGO_TARGET_DIR` and cargo config).
fn read_workspace(root: &Path) -> Result<Workspace> {
    parse_metadata(&cargo_metadata(root)?)
}

fn parse_metadata(meta: &Value) -> Result<Workspace> {
    let text = |v: &Value, key: &str| -> Result<String> {
        v.get(key)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .with_context(|| format!("cargo metadata has no {key}"))
    };
    let root = PathBuf::from(text(meta, "workspace_root")?);
    let target_dir = PathBuf::from(text(meta, "target_directory")?);
    let plugins_dir = root.join("plugins");
    let packages = meta
        .get("packages")
        .and_then(Value::as_array)
        .context("cargo metadata has no packages")?;

    let mut plugins = Vec::new();
    let mut has_host = false;
    for package in packages {
        let name = text(package, "name")?;
        if name == HOST_PACKAGE {
            has_host = true;
        }
        let manifest = PathBuf::from(text(package, "manifest_path")?);
        let in_plugins = manifest
            .parent()
            .and_then(Path::parent)
            .is_some_and(|dir| dir == plugins_dir);
        if !in_plugins {
            continue;
        }
        let cdylib = package
            .get("targets")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|t| {
                t.get("crate_types")
                    .and_then(Value::as_array)
                    .is_some_and(|types| types.iter().any(|k| k == "cdylib"))
            });
        match cdylib {
            Some(target) => plugins.push(Plugin {
                lib_name: text(target, "name")?.replace('-', "_"),
                package: name,
            }),
            None => eprintln!(
                "warning: {} has no cdylib target, so it is not a plugin; skipped",
                display(&manifest)
            ),
        }
    }
    plugins.sort_by(|a, b| a.package.cmp(&b.package));
    Ok(Workspace {
        target_dir,
        plugins,
        has_host,
    })
}

/// Points out `.so` files in the plugin folder that no crate builds any more:
/// the host would still load them.
fn warn_stale(plugin_dir: &Path, plugins: &[Plugin]) {
    let Ok(entries) = fs::read_dir(plugin_dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        let is_so = path.extension().is_some_and(|e| e == "so");
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        if is_so && !plugins.iter().any(|p| p.lib_name == stem) {
            eprintln!(
                "warning: {} is not built by any plugin crate, but the host will load it; delete it if it is stale",
                display(&path)
            );
        }
    }
}

/// Creates the plugin folder if needed. The host refuses plugins in a
/// folder, or files, that group or others can write, so what this makes is
/// 0755 whatever the umask (a folder that already exists is left as it is:
/// the host says what is wrong with it).
fn make_plugin_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(dir).with_context(|| format!("creating plugin folder {}", dir.display()))?;
    fs::set_permissions(dir, Permissions::from_mode(0o755))
        .with_context(|| format!("setting the mode of {}", dir.display()))
}

/// Places `built` as `<dir>/<lib_name>.so` (mode 0755) and its debug
/// information as `<lib_name>.so.debug` (0644) beside it, and returns the
/// placed library. A running host may have the old file mapped: never
/// write into it, rename a finished copy over it. The placed library is
/// stripped and linked to its debug file by .gnu_debuglink, so panics stay
/// symbolised; when the split fails it is placed whole, with a warning.
fn place(built: &Path, dir: &Path, lib_name: &str) -> Result<PathBuf> {
    let placed = dir.join(format!("{lib_name}.so"));
    let debug = dir.join(format!("{lib_name}.so.debug"));
    let mut split = true;
    replace_with(&debug, |temp| {
        split_debug(built, temp)?;
        fs::set_permissions(temp, Permissions::from_mode(0o644))
    })
    .unwrap_or_else(|e| {
        split = false;
        eprintln!(
            "warning: {}: debug information not split off ({e:#}); placing it whole",
            display(built)
        );
    });
    replace_with(&placed, |temp| {
        fs::copy(built, temp)?;
        if split {
            strip_debug(temp, &debug)?;
        }
        fs::set_permissions(temp, Permissions::from_mode(0o755))
    })
    .with_context(|| format!("placing {}", placed.display()))?;
    Ok(placed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cdylib_plugins_and_the_host() {
        let meta = serde_json::json!({
            "workspace_root": "/ws",
            "target_directory": "/ws/target",
            "packages": [
                {"name": "kernmlops", "manifest_path": "/ws/core/Cargo.toml",
                 "targets": [{"name": "kernmlops", "crate_types": ["lib"]}]},
                {"name": "kernmlops-cli", "manifest_path": "/ws/cli/Cargo.toml",
                 "targets": [{"name": "kernmlops", "crate_types": ["bin"]}]},
                {"name": "b_probe", "manifest_path": "/ws/plugins/b_probe/Cargo.toml",
                 "targets": [{"name": "b_probe", "crate_types": ["cdylib", "rlib"]}]},
                {"name": "a-probe", "manifest_path": "/ws/plugins/a-probe/Cargo.toml",
                 "targets": [{"name": "a-probe", "crate_types": ["cdylib"]}]},
                {"name": "helper", "manifest_path": "/ws/plugins/helper/Cargo.toml",
                 "targets": [{"name": "helper", "crate_types": ["lib"]}]},
                {"name": "xtask", "manifest_path": "/ws/xtask/Cargo.toml",
                 "targets": [{"name": "xtask", "crate_types": ["bin"]}]}
            ]
        });
        let ws = parse_metadata(&meta).expect("valid metadata");
        assert!(ws.has_host, "kernmlops-cli is the host");
        assert_eq!(ws.target_dir, PathBuf::from("/ws/target"));
        let found: Vec<(&str, &str)> = ws
            .plugins
            .iter()
            .map(|p| (p.package.as_str(), p.lib_name.as_str()))
            .collect();
        assert_eq!(found, [("a-probe", "a_probe"), ("b_probe", "b_probe")]);
    }

    #[test]
    fn placed_files_are_not_group_writable_whatever_the_umask() {
        // SAFETY: umask has no preconditions; other tests here only make
        // files, which a looser umask does not break.
        let old = unsafe { libc::umask(0o002) };
        let root = std::env::temp_dir().join(format!("kml-xtask-place-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).expect("scratch");
        // What a linker leaves under umask 002: a group-writable library.
        let built = root.join("libfake.so");
        fs::write(&built, b"not an ELF file").expect("built");
        fs::set_permissions(&built, Permissions::from_mode(0o775)).expect("chmod");
        let dir = root.join("plugins");
        make_plugin_dir(&dir).expect("plugin folder");
        let placed = place(&built, &dir, "fake").expect("placed");
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        let mode = |p: &Path| fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o755);
        assert_eq!(placed, dir.join("fake.so"));
        assert_eq!(mode(&placed), 0o755);
        assert_eq!(fs::read(&placed).expect("read"), b"not an ELF file");
        fs::remove_dir_all(&root).expect("clean up");
    }
}
