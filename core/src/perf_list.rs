//! `kernmlops perf-list`: the performance events of this machine (perf's
//! generic events and every PMU event sysfs lists), with their encoding and
//! whether they can be opened here, so a user can map a `perf` probe
//! counter to a new machine.

use std::path::Path;

use serde::Serialize;

/// The `perf` plugin's event code, shared by source: the host must not
/// depend on a plugin crate, and both must build attributes the same way.
#[allow(dead_code)]
use kernmlops_perf_events as events;

/// One event of `perf-list`.
#[derive(Debug, Clone, Serialize)]
pub struct PerfEvent {
    /// perf's name (`dTLB-load-misses`) or the sysfs event name.
    pub name: String,
    /// The PMU it belongs to: `hardware`, `software`, `hw_cache` for
    /// generic events, else the sysfs PMU (`cpu`, `msr`, ...).
    pub pmu: String,
    /// `perf_event_attr.type`.
    #[serde(rename = "type")]
    pub type_: u32,
    /// `perf_event_attr.config`, in hex.
    pub config: String,
    /// The sysfs encoding (`event=0x08,umask=0x10`), empty for generic ones.
    pub encoding: String,
    /// How to name it in `[[probes.perf.events]] event = ...`.
    pub event: String,
    /// Whether a counting event opens on CPU 0; `None` without the
    /// privileges to try.
    pub supported: Option<bool>,
    /// Why it is not supported (the kernel's error), if it is not.
    pub reason: Option<String>,
    /// What it counts (generic events only: sysfs has no descriptions).
    pub description: String,
}

/// Tries to open `spec` on CPU 0 for every task.
fn probe(spec: &events::EventSpec) -> (Option<bool>, Option<String>) {
    match events::open_counter(spec, -1, 0, false, 0) {
        Ok(_) => (Some(true), None),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)) => {
            (None, Some(format!("cannot check without root: {e}")))
        }
        Err(e) => (Some(false), Some(e.to_string())),
    }
}

/// Every generic event, then every sysfs PMU event under `root`
/// (normally `/sys/bus/event_source/devices`).
pub fn list(root: &Path) -> Vec<PerfEvent> {
    let mut out = Vec::new();
    for g in events::generic_events() {
        let (supported, reason) = probe(&g.spec);
        out.push(PerfEvent {
            event: g.name.clone(),
            name: g.name,
            pmu: g.kind.to_owned(),
            type_: g.spec.type_,
            config: format!("{:#x}", g.spec.config),
            encoding: String::new(),
            supported,
            reason,
            description: g.description,
        });
    }
    for pmu in events::pmus(root) {
        for (name, encoding) in events::pmu_events(&pmu) {
            let (spec, supported, reason) = match events::pmu_spec(&pmu, &encoding) {
                Ok(spec) => {
                    let (s, r) = probe(&spec);
                    (spec, s, r)
                }
                Err(e) => (
                    events::EventSpec {
                        type_: pmu.type_,
                        ..Default::default()
                    },
                    Some(false),
                    Some(e),
                ),
            };
            out.push(PerfEvent {
                event: format!("{}/{name}/", pmu.name),
                name,
                pmu: pmu.name.clone(),
                type_: spec.type_,
                config: format!("{:#x}", spec.config),
                encoding,
                supported,
                reason,
                description: String::new(),
            });
        }
    }
    out
}

/// Where `list` reads PMUs.
pub const PMU_ROOT: &str = events::PMU_ROOT;
