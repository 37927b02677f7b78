//! The run record: the collection folder's `manifest.json`, kept true at
//! every step of a run (written at start, refreshed while collecting,
//! completed at the end), and the run's final classification.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{atomic::Ordering, Arc},
};

use kernmlops_plugin_api::ProbeDecl;

use super::{
    drain::{RunningProbe, TableCounters},
    RunError, RunOptions,
};
use crate::{
    manifest::{
        self, BenchmarkEntry, Manifest, PluginEntry, ProbeEntry, ProbeStatus, RefusedPlugin,
        RunClass, Status, TableEntry,
    },
    plugin::{Plugin, Registry},
    system_info::SystemInfo,
};

/// A collection folder and its manifest.
pub(super) struct RunRecord {
    pub dir: PathBuf,
    pub man: Manifest,
}

impl RunRecord {
    /// The manifest of a run that is starting (`running`), not yet written.
    pub fn new(
        dir: PathBuf,
        collection_id: &str,
        registry: &Registry,
        selected: &[(&Plugin, &ProbeDecl)],
        opts: &RunOptions,
        sys: &SystemInfo,
        benchmark: Option<(&str, &str)>,
    ) -> Self {
        let man = Manifest {
            kernmlops_version: env!("CARGO_PKG_VERSION").into(),
            collection_id: collection_id.to_owned(),
            status: Status::Running,
            command: opts.command.clone(),
            config: opts.config.clone(),
            hostname: sys.hostname.clone(),
            kernel_release: sys.kernel_release.clone(),
            kernel_version: sys.kernel_version.clone(),
            kernel_features: serde_json::to_value(&sys.features).unwrap_or_default(),
            start: manifest::Instant::now(),
            end: None,
            plugins: plugin_entries(selected),
            refused_plugins: registry
                .failures
                .iter()
                .map(|(p, e)| RefusedPlugin {
                    path: p.display().to_string(),
                    reason: e.to_string(),
                })
                .collect(),
            probes: Vec::new(),
            tables: BTreeMap::new(),
            errors: Vec::new(),
            run_class: RunClass::Running,
            benchmark: benchmark.map(|(name, plugin)| BenchmarkEntry {
                name: name.to_owned(),
                plugin: plugin.to_owned(),
                ..BenchmarkEntry::default()
            }),
            include_self: opts.include_self,
            collector_overhead: None,
        };
        Self { dir, man }
    }

    /// Writes the manifest atomically.
    pub fn write(&self) -> Result<(), RunError> {
        self.man
            .write(&self.dir)
            .map_err(|source| RunError::Manifest {
                path: self.dir.join("manifest.json"),
                source,
            })
    }

    pub fn manifest_path(&self) -> PathBuf {
        self.dir.join("manifest.json")
    }

    pub fn benchmark(&mut self) -> Option<&mut BenchmarkEntry> {
        self.man.benchmark.as_mut()
    }

    pub fn probe_running(&mut self, name: &str, plugin: &str, attach_ms: f64, notes: Vec<String>) {
        self.man.probes.push(ProbeEntry {
            name: name.to_owned(),
            plugin: plugin.to_owned(),
            status: ProbeStatus::Running,
            error: None,
            attach_ms,
            notes,
        });
    }

    /// Records a probe that could not start, with its error.
    pub fn probe_failed_to_start(
        &mut self,
        name: &str,
        plugin: &str,
        attach_ms: f64,
        notes: Vec<String>,
        error: String,
    ) {
        let msg = format!("probe {name} (plugin {plugin}): {error}");
        eprintln!("error: {}", indent_detail(&msg));
        self.man.probes.push(ProbeEntry {
            name: name.to_owned(),
            plugin: plugin.to_owned(),
            status: ProbeStatus::Failed,
            error: Some(error),
            attach_ms,
            notes,
        });
        self.man.errors.push(msg);
    }

    /// Records how a probe's thread ended; true when it failed.
    pub fn probe_ended(&mut self, name: &str, plugin: &str, outcome: &Result<(), String>) -> bool {
        let Some(p) = self.man.probes.iter_mut().find(|p| p.name == name) else {
            return false;
        };
        match outcome {
            Ok(()) => {
                p.status = ProbeStatus::Ok;
                false
            }
            Err(e) => {
                p.status = ProbeStatus::Failed;
                p.error = Some(e.clone());
                let msg = format!("probe {name} (plugin {plugin}): {e}");
                eprintln!("error: {}", indent_detail(&msg));
                self.man.errors.push(msg);
                true
            }
        }
    }

    /// Puts the current counts of every running probe's tables in the
    /// manifest.
    pub fn fill_tables(&mut self, running: &[RunningProbe]) {
        for r in running {
            self.record_tables(&r.name, &r.tables, &r.counters);
        }
    }

    /// Puts a probe's tables, with their current counts, in the manifest.
    pub fn record_tables(
        &mut self,
        probe: &str,
        tables: &[String],
        counters: &[Arc<TableCounters>],
    ) {
        for (t, c) in tables.iter().zip(counters) {
            self.man.tables.insert(
                t.clone(),
                TableEntry {
                    probe: probe.to_owned(),
                    file: format!("{t}.arrow"),
                    rows: c.rows.load(Ordering::Relaxed),
                    lost_events: c.lost.load(Ordering::Relaxed),
                },
            );
        }
    }

    /// Records a table the host wrote itself (`system_info`,
    /// `performance_indicator`).
    pub fn host_table(&mut self, table: &str, rows: u64) {
        self.man.tables.insert(
            table.to_owned(),
            TableEntry {
                probe: "host".into(),
                file: format!("{table}.arrow"),
                rows,
                lost_events: 0,
            },
        );
    }

    pub fn error(&mut self, msg: String) {
        self.man.errors.push(msg);
    }

    /// Marks a run that ended before collecting anything.
    pub fn fail_early(&mut self) -> Result<(), RunError> {
        self.man.status = Status::Failed;
        self.man.run_class = RunClass::Failed;
        self.man.end = Some(manifest::Instant::now());
        self.write()
    }

    /// Completes the manifest: status, class and end time.
    pub fn complete(&mut self, probes_failed: bool, running_probes: usize) -> Result<(), RunError> {
        self.man.status = if probes_failed || !self.man.errors.is_empty() {
            Status::CompleteWithErrors
        } else {
            Status::Complete
        };
        self.man.run_class = classify(&self.man, running_probes);
        if let Some(entry) = &self.man.benchmark {
            if self.man.run_class == RunClass::Failed {
                let why = match (&entry.error, entry.exit_code) {
                    (Some(e), _) => e.clone(),
                    (None, Some(code)) => {
                        format!("benchmark {} exited with code {code}", entry.name)
                    }
                    (None, None) => format!("benchmark {} failed", entry.name),
                };
                eprintln!("error: {why}; its data is kept in {}", self.dir.display());
                if !self.man.errors.contains(&why) {
                    self.man.errors.push(why);
                }
            }
        }
        self.man.end = Some(manifest::Instant::now());
        self.write()
    }
}

/// The run's class: `failed` when the benchmark failed (it could not start,
/// exited non-zero, or errored) or probes failed, `baseline` when no probe
/// ran, `curated` otherwise. A benchmark stopped by the duration or a
/// signal did not fail: the user chose the window.
fn classify(man: &Manifest, running_probes: usize) -> RunClass {
    let bench_failed = man
        .benchmark
        .as_ref()
        .is_some_and(|b| b.error.is_some() || b.exit_code.is_some_and(|c| c != 0));
    if bench_failed || man.status != Status::Complete {
        RunClass::Failed
    } else if running_probes == 0 {
        RunClass::Baseline
    } else {
        RunClass::Curated
    }
}

/// Shows the first line of an error and keeps multi-line detail (a
/// verifier log) indented below it.
pub(super) fn indent_detail(msg: &str) -> String {
    msg.replace('\n', "\n    ")
}

fn plugin_entries(selected: &[(&Plugin, &ProbeDecl)]) -> Vec<PluginEntry> {
    let mut out: Vec<PluginEntry> = Vec::new();
    for (p, _) in selected {
        if out.iter().all(|e| e.path != p.path.display().to_string()) {
            out.push(PluginEntry {
                name: p.name().to_owned(),
                version: p.info.version.to_string(),
                path: p.path.display().to_string(),
                sha256: p.sha256.clone(),
            });
        }
    }
    out
}

/// Creates the collection folder: exactly `opts.collection_dir` (which
/// must not exist), or `<output>/<collection_id>`.
pub(super) fn create_dir(opts: &RunOptions, collection_id: &str) -> Result<PathBuf, RunError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| RunError::Folder { path, source }
    };
    match &opts.collection_dir {
        Some(dir) => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(io(parent))?;
            }
            std::fs::create_dir(dir).map_err(io(dir))?;
            Ok(dir.clone())
        }
        None => {
            let dir = opts.output.join(collection_id);
            std::fs::create_dir_all(&dir).map_err(io(&dir))?;
            Ok(dir)
        }
    }
}
