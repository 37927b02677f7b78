//! `manifest.json`: what a collection is, written when it starts, refreshed
//! while it runs and completed when it ends, so even a crashed run says
//! what it was.

use std::{collections::BTreeMap, path::Path};

use serde::{Deserialize, Serialize};

use kernmlops_sys::clock;

/// A point in time on both clocks.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Instant {
    pub uptime_us: u64,
    pub unix_us: i64,
    pub utc: String,
}

impl Instant {
    pub fn now() -> Self {
        let unix_us = clock::unix_us();
        Self {
            uptime_us: clock::uptime_us(),
            unix_us,
            utc: clock::rfc3339(unix_us),
        }
    }
}

/// Where a collection stands, as `status` in the manifest.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Being written, or the writer died (`kernmlops repair` fixes it).
    #[default]
    Running,
    Complete,
    /// Complete, but a probe or the benchmark reported errors.
    CompleteWithErrors,
    /// The writer died and `kernmlops repair` made the files readable.
    Repaired,
    /// Nothing was collected (no probe could start, set-up failed).
    Failed,
}

/// What a collection is good for, as `run_class` in the manifest.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RunClass {
    #[default]
    Running,
    /// The benchmark succeeded (or there was none) and every probe ran.
    Curated,
    /// `--baseline`: the benchmark without probes.
    Baseline,
    /// The benchmark or a probe failed; the data is kept apart.
    Failed,
}

impl RunClass {
    /// The name used in the manifest and the dataset layout.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Curated => "curated",
            Self::Baseline => "baseline",
            Self::Failed => "failed",
        }
    }
}

impl std::fmt::Display for RunClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A probe's state, as `status` of a manifest probe entry.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ProbeStatus {
    Running,
    Ok,
    Failed,
}

/// Why the host stopped a benchmark that had not ended by itself.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// `--duration` ran out.
    Duration,
    /// SIGINT or SIGTERM.
    Signal,
    /// Writing a table or the manifest failed (a full disk).
    WriteError,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PluginEntry {
    pub name: String,
    pub version: String,
    pub path: String,
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProbeEntry {
    pub name: String,
    pub plugin: String,
    pub status: ProbeStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Time to load, verify and attach, in milliseconds.
    pub attach_ms: f64,
    /// What the probe skipped because this machine lacks it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TableEntry {
    pub probe: String,
    pub file: String,
    pub rows: u64,
    pub lost_events: u64,
    /// The file lacks its footer (the disk filled before it could be
    /// closed): `kernmlops repair` on the folder closes it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub needs_repair: bool,
}

/// The workload a run collected around. Keys an older version did not
/// write read as their defaults.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct BenchmarkEntry {
    pub name: String,
    pub plugin: String,
    /// Its exit code, when it ended by itself.
    pub exit_code: Option<i32>,
    /// Why the host stopped it, when it did not end by itself.
    pub stopped_by: Option<StopReason>,
    /// Why it failed to set up, launch or run.
    pub error: Option<String>,
    pub start_uptime_us: Option<u64>,
    pub end_uptime_us: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RefusedPlugin {
    pub path: String,
    pub reason: String,
}

/// `manifest.json`. Its `Default` (an empty manifest) is only the base of
/// [`Manifest::from_value_tolerant`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub kernmlops_version: String,
    pub collection_id: String,
    pub status: Status,
    pub command: Vec<String>,
    pub config: serde_json::Value,
    pub hostname: String,
    pub kernel_release: String,
    pub kernel_version: String,
    /// BTF, kprobes, uprobes, fentry, hardware PMU: available or why not.
    #[serde(default)]
    pub kernel_features: serde_json::Value,
    pub start: Instant,
    pub end: Option<Instant>,
    pub plugins: Vec<PluginEntry>,
    pub refused_plugins: Vec<RefusedPlugin>,
    pub probes: Vec<ProbeEntry>,
    pub tables: BTreeMap<String, TableEntry>,
    pub errors: Vec<String>,
    #[serde(default)]
    pub run_class: RunClass,
    #[serde(default)]
    pub benchmark: Option<BenchmarkEntry>,
    /// Whether the collector's own process was recorded (`--include-self`);
    /// by default probes leave it out in the kernel.
    #[serde(default)]
    pub include_self: bool,
    /// `--allow-insecure-plugins`: plugin ownership and permissions were not
    /// checked for this run.
    #[serde(default)]
    pub allow_insecure_plugins: bool,
    /// What collecting cost (BPF programs' kernel time, the host's CPU and
    /// memory), once the run has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collector_overhead: Option<CollectorOverhead>,
    /// The process id of the collector that wrote the collection, named
    /// when `kernmlops repair` finds the folder still locked by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Power sources, each zone with its scope, measured or modelled and
    /// its energy, and the attribution (`--power`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<crate::power::PowerManifest>,
    /// The Slurm job (and array task) and node that ran the collection,
    /// when it ran inside one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmEntry>,
    /// The kernel knobs the run set (`[machine]`), in the order set: each
    /// one's name, file, the value asked for, the value before, and the
    /// value read back after writing (what the kernel kept). All were
    /// restored when the run ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machine: Vec<crate::machine::Applied>,
}

/// Where Slurm placed a run, from the environment Slurm gives the job's
/// processes (`SLURM_JOB_ID`, `SLURM_ARRAY_JOB_ID`, `SLURM_ARRAY_TASK_ID`,
/// `SLURMD_NODENAME`, `SLURM_CLUSTER_NAME`, `SLURM_JOB_PARTITION`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SlurmEntry {
    /// This job's own id (an array task has one of its own).
    pub job_id: u64,
    /// The job array's id, for an array task.
    pub array_job_id: Option<u64>,
    /// The index within the array, for an array task.
    pub array_task_id: Option<u32>,
    /// The node the job ran on, by Slurm's name for it.
    pub node: Option<String>,
    pub cluster: Option<String>,
    pub partition: Option<String>,
}

impl SlurmEntry {
    /// The entry of this process, when it runs inside a Slurm job.
    pub fn from_env() -> Option<Self> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// The entry from variables looked up by `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let text = |k: &str| {
            var(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        Some(Self {
            job_id: text("SLURM_JOB_ID")?.parse().ok()?,
            array_job_id: text("SLURM_ARRAY_JOB_ID").and_then(|v| v.parse().ok()),
            array_task_id: text("SLURM_ARRAY_TASK_ID").and_then(|v| v.parse().ok()),
            node: text("SLURMD_NODENAME"),
            cluster: text("SLURM_CLUSTER_NAME"),
            partition: text("SLURM_JOB_PARTITION"),
        })
    }
}

impl Manifest {
    /// Writes atomically: a reader sees the old or the new manifest. When
    /// the new one cannot be written (a full disk) the old one stays and no
    /// temporary file is left. The temporary file has a fresh hidden name
    /// (`files::write_atomic`), so a name planted in the folder is never
    /// written through.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        crate::files::write_atomic(&dir.join("manifest.json"), (text + "\n").as_bytes())
    }

    pub fn read(dir: &Path) -> std::io::Result<Self> {
        let text = std::fs::read_to_string(dir.join("manifest.json"))?;
        serde_json::from_str(&text).map_err(std::io::Error::other)
    }

    /// A manifest from JSON, tolerant of top-level keys that an older
    /// version (or the experiment layer's record of a run that never
    /// collected) did not write: each takes its value in
    /// `Manifest::default()`. Keys that are present must have their types.
    /// [`Manifest::read`] stays strict: the collector repairs and exports
    /// only whole manifests.
    pub fn from_value_tolerant(value: serde_json::Value) -> serde_json::Result<Self> {
        let serde_json::Value::Object(mut given) = value else {
            return serde_json::from_value(value);
        };
        if let serde_json::Value::Object(defaults) = serde_json::to_value(Self::default())? {
            for (key, default) in defaults {
                given.entry(key).or_insert(default);
            }
        }
        serde_json::from_value(serde_json::Value::Object(given))
    }
}

/// Nanoseconds per event, when there were events.
pub(crate) fn per_event(ns: u64, events: u64) -> Option<f64> {
    (events > 0).then(|| ns as f64 / events as f64)
}

/// One BPF program's cost in the kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgramCost {
    pub probe: String,
    pub program: String,
    /// Times it ran.
    pub events: u64,
    pub kernel_time_ns: u64,
    pub ns_per_event: Option<f64>,
}

/// A probe's programs together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeCost {
    pub probe: String,
    pub events: u64,
    pub kernel_time_ns: u64,
    pub ns_per_event: Option<f64>,
}

/// What a run cost, as the manifest records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectorOverhead {
    /// `enabled`, or why the kernel's BPF statistics could not be.
    pub bpf_stats: String,
    /// From the probes' start to their end.
    pub wall_s: f64,
    /// The host's CPU time in that window (its threads, the plugins').
    pub user_cpu_s: f64,
    pub system_cpu_s: f64,
    /// User CPU time over wall time, in percent of one CPU.
    pub user_cpu_percent: f64,
    /// The host's largest resident set, whole process lifetime.
    pub peak_rss_bytes: u64,
    pub rows_written: u64,
    pub probes: Vec<ProbeCost>,
    pub programs: Vec<ProgramCost>,
}

impl CollectorOverhead {
    /// The summary's one line.
    pub fn summary(&self) -> String {
        let (events, ns) = self.probes.iter().fold((0u64, 0u64), |(e, t), p| {
            (e + p.events, t + p.kernel_time_ns)
        });
        let kernel = match per_event(ns, events) {
            Some(per) => format!("{:.2} us/event in kernel ({events} events)", per / 1000.0),
            None if self.bpf_stats == "enabled" => "no BPF events".to_owned(),
            None => "kernel cost unknown (BPF statistics unavailable)".to_owned(),
        };
        format!(
            "collector: {kernel}, {:.1}% CPU in user space, peak RSS {:.0} MiB",
            self.user_cpu_percent,
            self.peak_rss_bytes as f64 / (1 << 20) as f64
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            kernmlops_version: "1".into(),
            collection_id: "c1".into(),
            status: Status::CompleteWithErrors,
            hostname: "h".into(),
            start: Instant {
                uptime_us: 1,
                unix_us: 2,
                utc: "t".into(),
            },
            end: Some(Instant::default()),
            errors: vec!["e".into()],
            run_class: RunClass::Failed,
            benchmark: Some(BenchmarkEntry {
                name: "script".into(),
                exit_code: Some(3),
                ..BenchmarkEntry::default()
            }),
            slurm: Some(SlurmEntry {
                job_id: 7,
                ..SlurmEntry::default()
            }),
            ..Manifest::default()
        }
    }

    #[test]
    fn a_whole_manifest_reads_back_the_same_either_way() {
        let value = serde_json::to_value(sample()).expect("json");
        let strict: Manifest = serde_json::from_value(value.clone()).expect("strict");
        assert_eq!(strict, sample());
        assert_eq!(
            Manifest::from_value_tolerant(value).expect("tolerant"),
            sample()
        );
    }

    /// A run that never collected has only what the experiment layer
    /// wrote: the missing keys take their defaults, and strict reading
    /// still refuses it.
    #[test]
    fn tolerant_reading_fills_missing_keys_and_keeps_types() {
        let partial = serde_json::json!({
            "status": "failed", "run_class": "failed", "errors": ["role a was not ready"],
            "hostname": "n", "benchmark": {"stopped_by": "signal"}, "roles": {"a": {}},
        });
        assert!(serde_json::from_value::<Manifest>(partial.clone()).is_err());
        let m = Manifest::from_value_tolerant(partial).expect("tolerant");
        assert_eq!((m.status, m.run_class), (Status::Failed, RunClass::Failed));
        assert_eq!(m.errors, ["role a was not ready"]);
        assert_eq!(m.collection_id, "");
        assert_eq!(m.end, None);
        let bench = m.benchmark.expect("benchmark");
        assert_eq!(bench.stopped_by, Some(StopReason::Signal));
        assert_eq!(bench.name, "");
        // A present key of the wrong type is an error, not a default.
        for bad in [
            serde_json::json!({"status": "sideways"}),
            serde_json::json!({"tables": {"t": {"rows": "many"}}}),
            serde_json::json!([1]),
        ] {
            assert!(Manifest::from_value_tolerant(bad.clone()).is_err(), "{bad}");
        }
    }
}
