//! Developer workflows of the kernmlops workspace (`cargo xtask ...`):
//! scaffolding a plugin, building plugins into the plugin folder, and
//! regenerating `plugin-build/bpf/vmlinux.h`. Not part of the product.

mod build_plugins;
mod new_plugin;
mod vmlinux;

use std::{
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "Developer workflows of the kernmlops workspace"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Scaffold plugins/NAME: a BPF probe of one table that builds, loads
    /// and collects rows as generated.
    NewPlugin(new_plugin::Args),
    /// Build the host and every plugin, and place each plugin's .so in the
    /// plugin folder.
    BuildPlugins(build_plugins::Args),
    /// Regenerate plugin-build/bpf/vmlinux.h from the running kernel's BTF.
    Vmlinux(vmlinux::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::NewPlugin(args) => new_plugin::run(&args),
        Command::BuildPlugins(args) => build_plugins::run(&args),
        Command::Vmlinux(args) => vmlinux::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root: the parent of this crate's folder.
/// The workspace holding xtask. `cargo run` sets `CARGO_MANIFEST_DIR` at run
/// time; it wins over the compile-time path, which is stale when another
/// checkout sharing the target folder built the binary last.
fn workspace_root() -> PathBuf {
    let xtask = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    xtask.parent().unwrap_or(&xtask).to_path_buf()
}

/// The cargo that runs us (`$CARGO`), else `cargo` from `PATH`.
fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// `cargo metadata --no-deps` of the workspace: its members, root and
/// target folder (which honours `CARGO_TARGET_DIR` and cargo config).
fn cargo_metadata(root: &Path) -> Result<serde_json::Value> {
    let output = std::process::Command::new(cargo())
        .current_dir(root)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        anyhow::bail!(
            "cargo metadata failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    serde_json::from_slice(&output.stdout).context("parsing cargo metadata output")
}

/// `path` relative to the working directory when it is below it, for
/// shorter messages.
fn display(path: &Path) -> String {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| path.to_path_buf())
        .display()
        .to_string()
}

/// A temporary name beside `dest` that no loader mistakes for the real
/// file: hidden, and not ending in the real extension.
fn temp_beside(dest: &Path) -> Result<PathBuf> {
    let name = dest
        .file_name()
        .with_context(|| format!("{} has no file name", dest.display()))?;
    let mut temp = OsString::from(".");
    temp.push(name);
    temp.push(format!(".tmp{}", std::process::id()));
    Ok(dest.with_file_name(temp))
}

/// Replaces `dest` by renaming a finished file over it, so a reader (or a
/// process with the old file mapped) sees the old or the new file, whole.
fn replace_with(dest: &Path, write: impl FnOnce(&Path) -> std::io::Result<()>) -> Result<()> {
    let temp = temp_beside(dest)?;
    let result = write(&temp)
        .with_context(|| format!("writing {}", temp.display()))
        .and_then(|()| {
            fs::rename(&temp, dest)
                .with_context(|| format!("renaming {} to {}", temp.display(), dest.display()))
        });
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}
