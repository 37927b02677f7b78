//! `kernmlops check`: start (load, verify, attach) each probe, validate the
//! tables it fills with the same rules a run applies, drain it once, stop
//! and detach, reporting each step's failure.

use std::{collections::BTreeMap, time::Instant};

use abi_stable::std_types::{RResult, RVec};
use kernmlops_plugin_api::Batch;

use super::{drain::run_tables, start_args, Filter, RunError, RunOptions};
use crate::plugin::Registry;

/// Result of `kernmlops check` for one probe.
#[derive(Debug)]
pub struct CheckResult {
    pub probe: String,
    pub plugin: String,
    /// Attach time in milliseconds, or what failed.
    pub outcome: Result<f64, String>,
}

/// Checks each probe in turn.
pub fn check(
    registry: &Registry,
    probes: &[String],
    ring_bytes: u64,
    probe_config: &BTreeMap<String, serde_json::Value>,
) -> Result<Vec<CheckResult>, RunError> {
    let selected = registry.resolve(probes).map_err(RunError::Selection)?;
    let opts = RunOptions {
        ring_bytes,
        filter: Filter::default(),
        ..RunOptions::default()
    };
    let mut out = Vec::new();
    for (plugin, decl) in selected {
        let name = decl.name.to_string();
        let args = start_args(&name, &opts, probe_config);
        let t0 = Instant::now();
        let outcome = plugin
            .start_probe(&name, &args)
            .map_err(|e| e.to_string())
            .and_then(|mut probe| {
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                for note in probe.notes() {
                    eprintln!("warning: probe {name}: {note}");
                }
                let tables = run_tables(&probe, &BTreeMap::new())?;
                let mut batches: RVec<Batch> = tables.iter().map(|_| Batch::default()).collect();
                if let RResult::RErr(e) = probe.drain(10, &mut batches) {
                    return Err(format!("draining: {e}"));
                }
                if let RResult::RErr(e) = probe.stop() {
                    return Err(format!("detaching: {e}"));
                }
                if let RResult::RErr(e) = probe.drain(0, &mut batches) {
                    return Err(format!("draining after detach: {e}"));
                }
                Ok(ms)
            });
        out.push(CheckResult {
            probe: name,
            plugin: plugin.name().to_owned(),
            outcome,
        });
    }
    Ok(out)
}
