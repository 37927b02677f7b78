//! What the kernel-cost benchmarks (`probe_cost`, `trace_cost`) share: one
//! collecting run's per-program cost, and their scratch folder.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};
use kernmlops_benchmarks::{workspace, Collecting};

/// A folder removed when dropped, whatever happened.
pub struct Scratch(pub PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One `kernmlops run` of `plugin` (with the options `extra`) around
/// `workload`: each of its programs that ran but the flush, as (program,
/// events, ns per event), from the run's `collector_overhead` (the
/// kernel's BPF run-time statistics).
pub fn program_costs(
    bin: &Path,
    out: &Path,
    plugin: &str,
    extra: &[&OsStr],
    workload: &dyn Fn() -> Result<()>,
) -> Result<Vec<(String, u64, f64)>> {
    let mut run = Command::new(bin);
    run.args(["run", "--plugins", plugin, "--plugin-dir"])
        .arg(workspace().join("plugins"))
        .arg("--output")
        .arg(out)
        .args(extra);
    let collecting = Collecting::start(run)?;
    let done = workload();
    collecting.interrupt();
    let man = collecting.wait()?.manifest;
    done?;
    let programs = man["collector_overhead"]["programs"]
        .as_array()
        .context("no collector_overhead.programs in the manifest")?;
    Ok(programs
        .iter()
        .filter(|p| p["probe"] == plugin)
        .filter_map(|p| {
            Some((
                p["program"].as_str()?.to_owned(),
                p["events"].as_u64()?,
                p["ns_per_event"].as_f64()?,
            ))
        })
        .filter(|(name, events, _)| name != "kml_flush" && *events > 0)
        .collect())
}
