//! `kernmlops check`: start (load, verify, attach) each probe, validate the
//! tables it fills with the same rules a run applies, drain it once, stop
//! and detach, reporting each step's failure. A probe stuck in any of these
//! calls past the plugin timeout is reported as hung and the check goes on.

use std::{
    collections::BTreeMap,
    sync::{mpsc, Arc},
    thread,
    time::{Duration, Instant},
};

use abi_stable::std_types::{RResult, RVec};
use kernmlops_plugin_api::{Batch, StartArgs};

use super::{
    drain::{run_tables, PluginCall, Watch},
    start_args, Filter, RunError, RunOptions, DEFAULT_PLUGIN_TIMEOUT,
};
use kernmlops_sys::clock::uptime_us;

use crate::plugin::{ProbeStarter, Registry};

/// Result of `kernmlops check` for one probe.
#[derive(Debug)]
pub struct CheckResult {
    pub probe: String,
    pub plugin: String,
    /// Attach time in milliseconds, or what failed.
    pub outcome: Result<f64, String>,
}

/// Checks each probe in turn, with every call into a probe bounded by
/// [`DEFAULT_PLUGIN_TIMEOUT`]; see [`check_within`].
pub fn check(
    registry: &Registry,
    probes: &[String],
    ring_bytes: u64,
    probe_config: &BTreeMap<String, serde_json::Value>,
) -> Result<Vec<CheckResult>, RunError> {
    check_within(
        registry,
        probes,
        ring_bytes,
        probe_config,
        DEFAULT_PLUGIN_TIMEOUT,
    )
}

/// Checks each probe in turn. Each probe's calls (start, drain, stop,
/// drain, release) run on a thread of their own, each bounded by `limit`
/// (the drain by its 10 ms wait more): a probe stuck in one is reported as
/// hung, naming the call, its thread is left behind, and the check goes on
/// with the next probe.
pub fn check_within(
    registry: &Registry,
    probes: &[String],
    ring_bytes: u64,
    probe_config: &BTreeMap<String, serde_json::Value>,
    limit: Duration,
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
        let outcome = check_one(plugin.starter(), &name, args, limit);
        out.push(CheckResult {
            probe: name,
            plugin: plugin.name().to_owned(),
            outcome,
        });
    }
    Ok(out)
}

/// Checks one probe on a thread of its own, watching its calls.
fn check_one(
    starter: ProbeStarter,
    name: &str,
    args: StartArgs,
    limit: Duration,
) -> Result<f64, String> {
    let watch = Arc::new(Watch::default());
    let (tx, rx) = mpsc::channel();
    let probe_name = name.to_owned();
    let watched = watch.clone();
    thread::Builder::new()
        .name(format!("kml-check-{name}"))
        .spawn(move || {
            let _ = tx.send(start_drain_stop(
                &starter,
                &probe_name,
                &args,
                &watched,
                limit,
            ));
        })
        .map_err(|e| format!("starting its thread: {e}"))?;
    loop {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(outcome) => return outcome,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err("its check thread ended without a result".into())
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if let Some((call, running_for)) = watch.overdue(uptime_us()) {
            return Err(format!(
                "hung: its {} call has not returned in {:.1} s (limit collect.plugin_timeout = {}); the probe was given up",
                call.name(),
                running_for.as_secs_f64(),
                kernmlops_sys::duration::format_duration(limit),
            ));
        }
    }
}

/// Starts (loads, verifies, attaches) the probe, validates its tables,
/// drains it once, stops and detaches it, drains again and frees it; the
/// attach time in milliseconds.
fn start_drain_stop(
    starter: &ProbeStarter,
    name: &str,
    args: &StartArgs,
    watch: &Watch,
    limit: Duration,
) -> Result<f64, String> {
    let t0 = Instant::now();
    let call = watch.enter(PluginCall::Start, limit);
    let started = starter.start_probe(name, args).map_err(|e| e.to_string());
    drop(call);
    let mut probe = started?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    for note in probe.notes() {
        eprintln!("warning: probe {name}: {note}");
    }
    let checked = (|| {
        let tables = run_tables(&probe, &BTreeMap::new())?;
        let mut batches: RVec<Batch> = tables.iter().map(|_| Batch::default()).collect();
        let _call = watch.enter(PluginCall::Drain, limit + Duration::from_millis(10));
        if let RResult::RErr(e) = probe.drain(10, &mut batches) {
            return Err(format!("draining: {e}"));
        }
        let _call = watch.enter(PluginCall::Stop, limit);
        if let RResult::RErr(e) = probe.stop() {
            return Err(format!("detaching: {e}"));
        }
        let _call = watch.enter(PluginCall::Drain, limit);
        if let RResult::RErr(e) = probe.drain(0, &mut batches) {
            return Err(format!("draining after detach: {e}"));
        }
        Ok(ms)
    })();
    let _call = watch.enter(PluginCall::Free, limit);
    drop(probe);
    checked
}
