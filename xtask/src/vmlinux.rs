//! `cargo xtask vmlinux`: regenerates `plugin-build/bpf/vmlinux.h`, the kernel types
//! every BPF program includes, from the kernel's BTF with bpftool.

use std::{fs, io::ErrorKind, path::PathBuf, process::Command};

use anyhow::{bail, Context, Result};

use crate::{display, replace_with, workspace_root};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// BTF of the kernel to describe.
    #[arg(long, value_name = "PATH", default_value = "/sys/kernel/btf/vmlinux")]
    btf: PathBuf,
    /// Header to write [default: <workspace>/plugin-build/bpf/vmlinux.h].
    #[arg(long, value_name = "PATH")]
    output: Option<PathBuf>,
}

pub fn run(args: &Args) -> Result<()> {
    if !args.btf.exists() {
        bail!(
            "no kernel BTF at {}: the kernel needs CONFIG_DEBUG_INFO_BTF=y, or pass --btf FILE",
            args.btf.display()
        );
    }
    let output = match Command::new("bpftool")
        .args(["btf", "dump", "file"])
        .arg(&args.btf)
        .args(["format", "c"])
        .output()
    {
        Ok(output) => output,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            bail!("bpftool not found: install bpftool (apt-get install bpftool)")
        }
        Err(e) => return Err(e).context("running bpftool"),
    };
    if !output.status.success() {
        bail!(
            "bpftool btf dump file {} failed ({}): {}",
            args.btf.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let header = output.stdout;
    if !header
        .windows(b"__VMLINUX_H__".len())
        .any(|w| w == b"__VMLINUX_H__")
    {
        bail!(
            "bpftool output for {} is not a vmlinux.h (no __VMLINUX_H__ guard)",
            args.btf.display()
        );
    }

    let dest = args
        .output
        .clone()
        .unwrap_or_else(|| workspace_root().join("plugin-build/bpf/vmlinux.h"));
    let unchanged = fs::read(&dest).is_ok_and(|old| old == header);
    if unchanged {
        println!("{} is up to date", display(&dest));
        return Ok(());
    }
    replace_with(&dest, |temp| fs::write(temp, &header))?;
    let lines = header.iter().filter(|&&b| b == b'\n').count();
    println!(
        "wrote {} ({lines} lines, from {})",
        display(&dest),
        args.btf.display()
    );
    Ok(())
}
