//! What a run says about power: the manifest's `power` section (sources,
//! each zone with its scope, measured or modelled and total energy, zone
//! failures, the attribution and its cost, cross-checks between meters)
//! and the lines of the run's summary.

use serde::{Deserialize, Serialize};

/// The manifest's `power` section.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PowerManifest {
    /// `--power` or `[power] sources` as given.
    pub requested: Vec<String>,
    /// Slot length in microseconds.
    pub interval_us: u64,
    /// Sources read in this run, in order of preference.
    pub sources: Vec<SourceEntry>,
    /// Sources asked for (or found by `auto`) that could not be used here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<Unavailable>,
    /// Slots written (the first read is a baseline, not a slot).
    pub slots: u64,
    pub attribution: AttributionEntry,
    /// Totals of zones of the same scope and socket from different meters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cross_checks: Vec<CrossCheck>,
    /// How close to the slot boundaries the sources were read.
    pub timing: Timing,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SourceEntry {
    pub name: String,
    pub plugin: String,
    /// True when every zone is measured; false when any is modelled.
    pub measured: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The model and its coefficients, for a source with modelled zones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<serde_json::Value>,
    pub zones: Vec<ZoneEntry>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ZoneStatus {
    #[default]
    Ok,
    /// Its reading failed during the run; its rows stop there.
    Failed,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ZoneEntry {
    pub name: String,
    pub scope: String,
    /// CPU socket; absent for several or none.
    pub socket: Option<u32>,
    /// `measured` or `modelled`.
    pub kind: String,
    pub update_interval_us: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    pub description: String,
    /// Energy over the run's slots (up to the failure, if it failed).
    pub energy_uj: u64,
    /// Mean power over the time the zone was read.
    pub mean_power_uw: u64,
    pub status: ZoneStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_at_uptime_us: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Unavailable {
    pub name: String,
    pub plugin: String,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AttributionStatus {
    /// `[power] attribution = false`.
    #[default]
    Off,
    Ok,
    /// The cpu_time probe is missing or could not start, or failed.
    Failed,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AttributionEntry {
    pub status: AttributionStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How shares are decided: `cpu_time`.
    pub model: String,
    /// The probe that measures on-CPU time, and its plugin.
    pub probe: String,
    pub plugin: String,
    /// Per scope: the source whose energy was split and the totals.
    pub scopes: Vec<ScopeEntry>,
    /// Slots with no CPU time to split by (not attributed).
    pub slots_without_cpu_time: u64,
    /// The probe's BPF programs: runs and kernel time (statistics enabled
    /// for the run); `ns_per_run` for sched_switch is the cost per context
    /// switch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub programs: Vec<ProgramCost>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProgramCost {
    pub name: String,
    pub run_cnt: u64,
    pub run_time_ns: u64,
    pub ns_per_run: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ScopeEntry {
    pub scope: String,
    /// The sources split, in the order used (a later one only after an
    /// earlier one's zone failed).
    pub sources: Vec<String>,
    /// False when any split energy was modelled.
    pub measured: bool,
    pub energy_uj: u64,
    pub attributed_uj: u64,
    pub idle_uj: u64,
    pub slots: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CrossCheck {
    pub scope: String,
    pub socket: Option<u32>,
    /// `source/zone` of each meter, with its total.
    pub zones: Vec<String>,
    pub energy_uj: Vec<u64>,
    /// Largest difference from the first meter, in percent of it.
    pub difference_pct: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Timing {
    /// Latest read after its slot boundary, in microseconds.
    pub max_late_us: u64,
    /// Mean time to read every source and the attribution probe.
    pub mean_read_us: u64,
}

/// The summary lines of a run with power.
pub fn render_summary(m: &PowerManifest) -> String {
    let mut out = format!(
        "  power: {} slot(s) of {}\n",
        m.slots,
        kernmlops_sys::duration::format_duration(std::time::Duration::from_micros(m.interval_us))
    );
    for s in &m.sources {
        for z in &s.zones {
            let failed = match z.status {
                ZoneStatus::Ok => String::new(),
                ZoneStatus::Failed => format!("  FAILED: {}", z.error.as_deref().unwrap_or("")),
            };
            out += &format!(
                "    {:<24} {:<8} {:<9} {:>12.3} J {:>10.3} W mean{failed}\n",
                format!("{}/{}", s.name, z.name),
                z.scope,
                z.kind,
                z.energy_uj as f64 / 1e6,
                z.mean_power_uw as f64 / 1e6,
            );
        }
    }
    for u in &m.unavailable {
        out += &format!("    {} not used: {}\n", u.name, u.reason);
    }
    let a = &m.attribution;
    match a.status {
        AttributionStatus::Off => {
            out += "    energy not attributed ([power] attribution = false)\n"
        }
        AttributionStatus::Failed => {
            out += &format!(
                "    energy not attributed: {}\n",
                a.error.as_deref().unwrap_or("the cpu_time probe failed")
            )
        }
        AttributionStatus::Ok => {
            for s in &a.scopes {
                out += &format!(
                    "    attributed by {}: {} from {} ({}): {:.3} J to processes, {:.3} J idle\n",
                    a.model,
                    s.scope,
                    s.sources.join(", then "),
                    if s.measured { "measured" } else { "modelled" },
                    s.attributed_uj as f64 / 1e6,
                    s.idle_uj as f64 / 1e6
                );
            }
            if let Some(p) = a.programs.iter().find(|p| p.run_cnt > 0) {
                out += &format!(
                    "    {} cost {:.0} ns per context switch ({} switches)\n",
                    a.probe, p.ns_per_run, p.run_cnt
                );
            }
        }
    }
    for c in &m.cross_checks {
        out += &format!(
            "    cross-check {}{}: {} differ by {:.2}%\n",
            c.scope,
            c.socket.map(|s| format!(" socket {s}")).unwrap_or_default(),
            c.zones.join(" vs "),
            c.difference_pct
        );
    }
    out
}
