//! The run record: the collection folder's `manifest.json`, kept true at
//! every step of a run (written at start, refreshed while collecting,
//! completed at the end), and the run's final classification; the
//! collection folder itself, created exclusively and locked while the run
//! writes it.

use std::{
    collections::BTreeMap,
    fs::File,
    io,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
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
    /// The folder's lock, held while the run writes it.
    pub lock: Option<File>,
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
            allow_insecure_plugins: registry.allow_insecure,
            collector_overhead: None,
            pid: Some(std::process::id()),
            power: None,
            slurm: manifest::SlurmEntry::from_env(),
            machine: Vec::new(),
        };
        Self {
            dir,
            man,
            lock: None,
        }
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

    /// Records how a probe's thread ended; true when it failed. `quiet`
    /// records an error without printing it.
    pub fn probe_ended(
        &mut self,
        name: &str,
        plugin: &str,
        outcome: &Result<(), String>,
        quiet: bool,
    ) -> bool {
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
                if !quiet {
                    eprintln!("error: {}", indent_detail(&msg));
                }
                self.man.errors.push(msg);
                true
            }
        }
    }

    /// Records a probe the watchdog gave up (`why` names the call), and
    /// prints it as one error line.
    pub fn probe_hung(&mut self, probe: &RunningProbe, why: String) {
        self.probe_ended(&probe.name, &probe.plugin, &Err(why), false);
        self.record_tables(&probe.name, &probe.tables, &probe.counters);
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
                    needs_repair: false,
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
                needs_repair: false,
            },
        );
    }

    pub fn error(&mut self, msg: String) {
        self.man.errors.push(msg);
    }

    /// Records the write error that stopped the run and returns the one
    /// line saying what is on disk and what to do (the tables' counts are
    /// the rows their files hold).
    pub fn write_failed(&mut self, error: &str) -> String {
        let mut open = Vec::new();
        for e in self.man.tables.values_mut() {
            e.needs_repair = super::repair::lacks_footer(&self.dir.join(&e.file));
            if e.needs_repair {
                open.push(e.file.clone());
            }
        }
        let on_disk: Vec<String> = self
            .man
            .tables
            .iter()
            .map(|(t, e)| format!("{t} {}", e.rows))
            .collect();
        let rows = if on_disk.is_empty() {
            "none".to_owned()
        } else {
            on_disk.join(", ")
        };
        let line = if open.is_empty() {
            format!(
                "{error}: collecting stopped and every file was closed; rows on disk: {rows}; no file needs `kernmlops repair`",
            )
        } else {
            format!(
                "{error}: collecting stopped; rows on disk: {rows}; without a footer: {}: free some space, then run `kernmlops repair {}`",
                open.join(", "),
                self.dir.display()
            )
        };
        self.man.errors.push(line.clone());
        line
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
                sha256: p
                    .sha256()
                    .map_or_else(|e| format!("unavailable: {e}"), str::to_owned),
            });
        }
    }
    out
}

/// A collection folder made for this run, and its lock.
pub(super) struct Created {
    pub dir: PathBuf,
    /// The collection id: the one asked for, or a new one when another run
    /// had taken it.
    pub id: String,
    pub lock: File,
}

/// Creates the collection folder exclusively (`create_dir`, never reusing
/// one) and locks it: exactly `opts.collection_dir` (which must not
/// exist), or `<output>/<collection_id>`, with a new id when another run
/// created that folder first.
pub(super) fn create_dir(opts: &RunOptions, collection_id: &str) -> Result<Created, RunError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| RunError::Folder { path, source }
    };
    let (parent, fixed) = match &opts.collection_dir {
        Some(dir) => (dir.parent().map(Path::to_owned), Some(dir.clone())),
        None => (Some(opts.output.clone()), None),
    };
    if let Some(parent) = parent.filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    }
    let mut id = collection_id.to_owned();
    for _ in 0..100 {
        let dir = fixed.clone().unwrap_or_else(|| opts.output.join(&id));
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                let lock = lock_dir(&dir).map_err(io(&dir))?;
                return Ok(Created { dir, id, lock });
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && fixed.is_none() => {
                id = super::new_collection_id();
            }
            Err(e) => return Err(io(&dir)(e)),
        }
    }
    Err(io(&opts.output)(io::Error::other(
        "100 new collection ids were all taken",
    )))
}

/// Takes the exclusive lock of a collection folder, held as long as the
/// returned descriptor is open (closed on exec: workloads never hold it).
pub(super) fn lock_dir(dir: &Path) -> io::Result<File> {
    let f = File::open(dir)?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(f)
}

/// 64 random bits from the kernel, or, should `getrandom` fail, from the
/// time, the process id and a counter.
pub(super) fn random_u64() -> u64 {
    let mut buf = [0u8; 8];
    // SAFETY: getrandom writes at most `buf.len()` bytes into `buf`.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n == buf.len() as isize {
        return u64::from_ne_bytes(buf);
    }
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut x = kernmlops_sys::clock::unix_us() as u64
        ^ (u64::from(std::process::id()) << 32)
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // splitmix64's finaliser, so nearby inputs give unrelated outputs.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_made_together_differ_and_folders_are_never_shared() {
        let out = std::env::temp_dir().join(format!("kml-ids-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let opts = RunOptions {
            output: out.clone(),
            ..RunOptions::default()
        };
        // Eight threads, each creating folders from one shared id: every
        // one gets a folder of its own.
        let same = super::super::new_collection_id();
        let made: Vec<(String, PathBuf)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        (0..25)
                            .map(|_| {
                                let c = create_dir(&opts, &same).expect("create");
                                (c.id, c.dir)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("thread"))
                .collect()
        });
        let ids: std::collections::BTreeSet<&String> = made.iter().map(|(i, _)| i).collect();
        assert_eq!(ids.len(), 200, "ids were shared");
        assert_eq!(std::fs::read_dir(&out).expect("out").count(), 200);
        let fresh: std::collections::BTreeSet<String> = (0..10_000)
            .map(|_| super::super::new_collection_id())
            .collect();
        assert_eq!(fresh.len(), 10_000, "ids made in one second collided");
        // A locked folder cannot be locked again.
        let (_, dir) = &made[0];
        let held = lock_dir(dir).expect("first lock");
        assert!(lock_dir(dir).is_err(), "locked twice");
        drop(held);
        lock_dir(dir).expect("free again");
        std::fs::remove_dir_all(&out).expect("clean up");
    }
}
