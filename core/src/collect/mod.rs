//! A collection run: start the chosen probes, drain each on its own thread
//! into its tables' sinks until the duration ends, the benchmark ends or a
//! signal arrives, then stop, drain what is left, finish the files and
//! complete the manifest.
//!
//! A probe that fails to start, or fails while running, is reported and
//! recorded; the other probes keep running and its rows already collected
//! stay on disk. So does a probe stuck in a call into its plugin (start,
//! drain, stop) past the plugin timeout: the watchdog gives it up, closes
//! its tables with what they hold, and the run ends on time without it.
//!
//! - [`drain`]: probe threads, sinks and live counters;
//! - [`bench`]: the benchmark's lifecycle and its result;
//! - [`record`]: the manifest, kept true at every step;
//! - [`status`]: the live status line;
//! - [`startup`]: start-up timings (`KERNMLOPS_STARTUP_TIMES`);
//! - [`check`] and [`repair`]: `kernmlops check` and `kernmlops repair`.

mod bench;
mod bench_thread;
mod check;
mod drain;
mod overhead;
mod record;
mod repair;
pub mod startup;
mod status;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use kernmlops_plugin_api::{ProbeDecl, StartArgs};

pub use check::{check, check_within, CheckResult};
pub use drain::{drain_loop, run_tables, DrainEnds, TableCounters, WriteFailure};
pub use overhead::{CollectorOverhead, ProbeCost, ProgramCost};
pub use repair::{repair_collection, FileRepair, RepairError, RepairReport};

use self::{
    bench::BenchmarkRun,
    drain::{RunningProbe, SinkSetup},
    record::RunRecord,
    status::StatusLine,
};
use kernmlops_sys::clock;

use crate::{
    manifest::{RunClass, StopReason, TableEntry},
    plugin::{Plugin, Registry},
    sink::{self, FlushPolicy},
    system_info::SystemInfo,
    undo::RunGuard,
};

/// Everything a run needs besides the plugins.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub probes: Vec<String>,
    pub output: PathBuf,
    /// Write the collection into exactly this folder (created, must not
    /// exist) instead of `<output>/<collection_id>/`.
    pub collection_dir: Option<PathBuf>,
    /// `None`: until stopped.
    pub duration: Option<Duration>,
    pub ring_bytes: u64,
    pub drain_interval: Duration,
    pub flush: FlushPolicy,
    pub strict: bool,
    pub filter: Filter,
    /// Record the collector's own process too (`--include-self`).
    pub include_self: bool,
    /// Each probe's own settings (`[probes.<name>]`), passed to it as JSON.
    pub probe_config: BTreeMap<String, serde_json::Value>,
    /// The merged configuration, recorded in the manifest.
    pub config: serde_json::Value,
    pub command: Vec<String>,
    /// The workload to run while collecting; the run lasts its lifetime.
    pub benchmark: Option<String>,
    /// Each benchmark's settings (`[benchmarks.<name>]`) as JSON.
    pub benchmark_config: BTreeMap<String, serde_json::Value>,
    /// The run's state folder (`StartArgs::state_dir`), set by [`run`] for
    /// a benchmark run: see [`crate::undo`].
    pub state_dir: Option<PathBuf>,
    /// Power sources, slots and attribution (`--power`, `[power]`).
    pub power: crate::power::PowerOptions,
    /// How long a call into a probe may take (beyond a drain's own wait)
    /// before the probe is given up (`collect.plugin_timeout`); zero means
    /// [`DEFAULT_PLUGIN_TIMEOUT`].
    pub plugin_timeout: Duration,
    /// Kernel knobs to set for the run (`[machine]`, resolved and checked
    /// by `Config::knobs`): each old value journalled in the run's undo
    /// log, then written and read back before anything is collected, and
    /// restored when the run ends.
    pub knobs: Vec<crate::machine::Knob>,
    /// Record only the benchmark's own processes: the filter's cgroup is
    /// the run's workload cgroup, below it included, made before the
    /// probes start (`--cgroup-workload`).
    pub cgroup_workload: bool,
}

/// The plugin timeout when none is configured: far above any probe's
/// start-up (verifying and attaching takes well under a second) or drain.
pub const DEFAULT_PLUGIN_TIMEOUT: Duration = Duration::from_secs(5);

impl RunOptions {
    /// The plugin timeout in force.
    pub fn plugin_timeout(&self) -> Duration {
        if self.plugin_timeout.is_zero() {
            DEFAULT_PLUGIN_TIMEOUT
        } else {
            self.plugin_timeout
        }
    }
}

/// Which tasks probes record, applied in the kernel (0: no filter).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Filter {
    pub tgid: u32,
    pub pid: u32,
    pub cgroup_id: u64,
    /// With `cgroup_id`: tasks of cgroups below it too.
    pub cgroup_descendants: bool,
}

/// Why a run could not go on.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The probes or benchmark asked for are not there.
    #[error("{0}")]
    Selection(String),
    /// The benchmark cannot run, or its set-up failed.
    #[error("{0}")]
    Benchmark(String),
    #[error("creating collection folder {}: {source}", path.display())]
    Folder {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing {}: {source}", path.display())]
    Manifest {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no probe could start; see {}", manifest.display())]
    NoProbe { manifest: PathBuf },
    /// A write failed (a full disk): collecting stopped and every file was
    /// closed; the line says what is on disk and what to do.
    #[error("{0}")]
    Stopped(String),
    #[error("{0}")]
    Host(String),
}

/// What a run produced.
#[derive(Debug)]
pub struct Summary {
    pub run_class: RunClass,
    pub collection_id: String,
    pub dir: PathBuf,
    pub tables: BTreeMap<String, TableEntry>,
    pub errors: Vec<String>,
    pub attach_ms: f64,
    /// What collecting cost.
    pub overhead: Option<CollectorOverhead>,
    /// Power sources, zones, energy and attribution, when recorded.
    pub power: Option<crate::power::PowerManifest>,
    /// The benchmark's result, when one was launched.
    pub benchmark: Option<crate::indicator::RunFigures>,
}

/// A new collection id: UTC start time and 48 random bits, so runs started
/// in the same microsecond differ; the folder is still created exclusively,
/// with a new id on a clash (`record::create_dir`).
pub fn new_collection_id() -> String {
    let now = clock::unix_us();
    let suffix = record::random_u64() & 0xffff_ffff_ffff;
    format!("{}-{suffix:012x}", clock::compact_stamp(now))
}

/// Builds the arguments a component gets: its settings from `settings`
/// and the run's ring size and filters.
pub fn start_args(
    component: &str,
    opts: &RunOptions,
    settings: &BTreeMap<String, serde_json::Value>,
) -> StartArgs {
    let config = settings
        .get(component)
        .map_or_else(|| "{}".to_owned(), |v| v.to_string());
    let state_dir = opts
        .state_dir
        .as_ref()
        .map_or_else(String::new, |d| d.display().to_string());
    StartArgs::new(&config)
        .with_ring_bytes(opts.ring_bytes)
        .with_filter_tgid(opts.filter.tgid)
        .with_filter_pid(opts.filter.pid)
        .with_filter_cgroup(opts.filter.cgroup_id, opts.filter.cgroup_descendants)
        .with_include_self(opts.include_self)
        .with_state_dir(&state_dir)
}

/// Runs a collection. `stop` ends it early (set by the signal handlers).
pub fn run(
    registry: &Registry,
    opts: &RunOptions,
    stop: Arc<AtomicBool>,
) -> Result<Summary, RunError> {
    startup::mark("run checked");
    let selected = registry
        .resolve(&opts.probes)
        .map_err(RunError::Selection)?;
    let mut p = prepare(registry, opts)?;
    let (mut record, system_info_due) = open_record(&mut p, registry, &selected)?;
    // Before the probes load, so their programs' statistics cover the run.
    let meter = overhead::CostMeter::start();
    let attach_start = Instant::now();
    let starts = Starts::launch(&selected, &p.opts);
    if let Some(sys) = system_info_due {
        write_system_info(&mut record, &sys, &p.collection_id)?;
        startup::mark("system_info written");
    }
    let setup = SinkSetup {
        dir: &p.dir,
        collection_id: &p.collection_id,
        flush: p.opts.flush,
        drain_interval: p.opts.drain_interval,
        failure: Arc::default(),
        deadline: p.opts.duration.map(|d| Instant::now() + d),
        plugin_timeout: p.opts.plugin_timeout(),
    };
    let running = start_probes(&selected, starts, &p.opts, &setup, &stop, &mut record);
    let attach_ms = attach_start.elapsed().as_secs_f64() * 1e3;
    startup::mark("probes started");
    if let Err(e) = record.write() {
        setup.failure.report(e.to_string());
        stop.store(true, Ordering::SeqCst);
    }
    if running.is_empty() && !selected.is_empty() {
        let cgroup = p.guard.as_ref().and_then(RunGuard::workload_cgroup);
        let bench = p.bench.take();
        return Err(fail_without_probes(
            bench,
            cgroup,
            &p.knobs,
            &p.collection_id,
            record,
        ));
    }
    let power = p.power.take().and_then(|pw| {
        let started = pw.start(registry, &p.dir, &p.collection_id, p.opts.flush);
        started.map_err(|e| eprintln!("error: power: {e}")).ok()
    });
    record.man.power = power.as_ref().map(|p| p.manifest.clone());
    startup::mark("collecting");
    announce(
        &running,
        &p.dir,
        attach_ms,
        p.bench.as_ref(),
        p.opts.duration,
    );
    if let Some(b) = p.bench.as_mut().filter(|_| !stop.load(Ordering::SeqCst)) {
        if !in_cgroup(&mut p.guard, || b.launch(&mut record)) {
            stop.store(true, Ordering::SeqCst);
        }
    }
    let failure = setup.failure.clone();
    let ends = DrainEnds {
        stop: &stop,
        failure: &failure,
        deadline: setup.deadline,
    };
    let stopped_by = wait_for_end(&p.opts, ends, p.bench.as_mut(), &running, &mut record);
    stop.store(true, Ordering::SeqCst);
    let figures = end_workload(&mut p, &mut record, stopped_by);
    drain::wake_until_ended(&running, |r, why| record.probe_hung(r, why));
    let joined = join_probes(running, &failure, &mut record);
    let ending = Ending {
        power,
        meter,
        joined,
        failure,
        attach_ms,
        figures,
    };
    complete(p, record, ending)
}

/// A run made ready to collect: its folder created and locked, what it
/// changes on the machine guarded, its benchmark created, its power sources
/// checked and its knobs set.
struct Prepared {
    /// The run's options with its state folder and, with
    /// `cgroup_workload`, the workload cgroup's filter.
    opts: RunOptions,
    collection_id: String,
    dir: PathBuf,
    /// The folder's lock, handed to the run's record.
    lock: Option<std::fs::File>,
    guard: Option<RunGuard>,
    bench: Option<BenchmarkRun>,
    power: Option<crate::power::Prepared>,
    knobs: Vec<crate::machine::Applied>,
    cpus: Option<crate::machine::Applied>,
}

/// Everything that can refuse the run before anything is collected: the
/// guard, the benchmark, the power sources, the CPUs and knobs, then the
/// collection folder.
fn prepare(registry: &Registry, opts: &RunOptions) -> Result<Prepared, RunError> {
    let mut collection_id = new_collection_id();
    let planned_dir = opts
        .collection_dir
        .clone()
        .unwrap_or_else(|| opts.output.join(&collection_id));
    if opts.benchmark.is_none() {
        if let Some(k) = opts
            .knobs
            .iter()
            .find(|k| k.how == crate::machine::How::Cpuset)
        {
            return Err(RunError::Selection(format!(
                "machine.{}: the CPUs a benchmark may run on; this run has no benchmark (--benchmark)",
                k.name
            )));
        }
    }
    // What the benchmark changes, and the knobs the run sets, are recorded
    // first, and undone even if this process dies.
    let mut guard = guard_for(opts, &collection_id, &planned_dir)?;
    let opts = RunOptions {
        state_dir: guard
            .as_ref()
            .filter(|_| opts.benchmark.is_some())
            .map(|g| g.state_dir().to_owned()),
        filter: workload_filter(opts, guard.as_ref())?,
        ..opts.clone()
    };
    // A benchmark that cannot run is refused before anything is collected.
    let mut bench = BenchmarkRun::create(registry, &opts, &planned_dir)?;
    // So are power sources that cannot be read as asked.
    let power = crate::power::prepare(registry, &opts.power)
        .map_err(|e| RunError::Selection(e.to_string()))?;
    // And CPUs the benchmark cannot be confined to (the guard removes its
    // cpuset), or a knob the kernel refuses: the ones already set are put
    // back.
    let cpus = set_cpus(guard.as_mut(), &opts.knobs)?;
    let knobs = set_knobs(guard.as_ref(), &opts.knobs)?;
    let created = record::create_dir(&opts, &collection_id)?;
    if created.id != collection_id {
        // Another run took that id first: the benchmark gets the new folder.
        collection_id = created.id.clone();
        bench = BenchmarkRun::create(registry, &opts, &created.dir)?;
    }
    startup::mark("collection folder created");
    Ok(Prepared {
        opts,
        collection_id,
        dir: created.dir,
        lock: Some(created.lock),
        guard,
        bench,
        power,
        knobs,
        cpus,
    })
}

/// The filter the probes get: with `cgroup_workload`, the run's workload
/// cgroup and every cgroup below it, made by the guard before any probe
/// starts; otherwise the one asked for.
fn workload_filter(opts: &RunOptions, guard: Option<&RunGuard>) -> Result<Filter, RunError> {
    if !opts.cgroup_workload {
        return Ok(opts.filter);
    }
    let refuse = |why: String| RunError::Selection(format!("--cgroup-workload: {why}"));
    if opts.benchmark.is_none() {
        return Err(refuse(
            "records a benchmark's processes; this run has no benchmark (--benchmark)".into(),
        ));
    }
    if kernmlops_sys::cgroup::cgroup2_mount().is_none() {
        return Err(refuse(
            "this machine has no cgroup v2 mount to hold the benchmark's processes".into(),
        ));
    }
    let Some(cgroup) = guard.and_then(RunGuard::workload_cgroup) else {
        return Err(refuse(
            "the benchmark's workload cgroup could not be made (see the warning above); nothing was collected".into(),
        ));
    };
    let id = kernmlops_sys::cgroup::cgroup_id(cgroup).map_err(|e| refuse(e.to_string()))?;
    Ok(Filter {
        cgroup_id: id,
        cgroup_descendants: true,
        ..opts.filter
    })
}

/// The run's record, written, with `system_info` written too when there
/// is a benchmark (returned to write while the probes load otherwise),
/// and the benchmark set up in its workload cgroup.
fn open_record(
    p: &mut Prepared,
    registry: &Registry,
    selected: &[(&Plugin, &ProbeDecl)],
) -> Result<(RunRecord, Option<SystemInfo>), RunError> {
    // Described while the plugins loaded, unless knobs were set since.
    let sys = startup::system_info(p.opts.knobs.is_empty());
    startup::mark("system described");
    // What spoils measurements, said once per run (never refused).
    for w in sys.state.warnings() {
        eprintln!("warning: {w}");
    }
    let mut record = RunRecord::new(
        p.dir.clone(),
        &p.collection_id,
        registry,
        selected,
        &p.opts,
        &sys,
        p.bench
            .as_ref()
            .map(|b| (b.name.as_str(), b.plugin.as_str())),
    );
    record.man.machine = p.knobs.iter().cloned().chain(p.cpus.take()).collect();
    // Held until the process ends: `kernmlops repair` refuses the folder
    // while this run writes it.
    record.lock = p.lock.take();
    record.write()?;
    // Written before anything is collected, so a killed run has it too:
    // before a benchmark's setup, or else while the probes load.
    let mut due = Some(sys);
    if p.bench.is_some() {
        if let Some(sys) = due.take() {
            write_system_info(&mut record, &sys, &p.collection_id)?;
        }
    }
    if let Some(b) = p.bench.as_mut() {
        in_cgroup(&mut p.guard, || b.setup(&mut record))?;
    }
    startup::mark("manifest written, benchmark set up");
    Ok((record, due))
}

/// Ends a run none of whose probes started: the benchmark is stopped and
/// the knobs restored, and the manifest says it failed.
fn fail_without_probes(
    bench: Option<BenchmarkRun>,
    cgroup: Option<&std::path::Path>,
    knobs: &[crate::machine::Applied],
    collection_id: &str,
    mut record: RunRecord,
) -> RunError {
    if let Some(b) = bench {
        b.finish(&mut record, None, collection_id, cgroup);
    }
    for line in crate::machine::restore(knobs) {
        eprintln!("error: {line}");
        record.error(line);
    }
    if let Err(e) = record.fail_early() {
        return e;
    }
    RunError::NoProbe {
        manifest: record.manifest_path(),
    }
}

/// Stops the benchmark (its figures), restores the knobs and undoes what
/// the benchmark changed, once collecting ended.
fn end_workload(
    p: &mut Prepared,
    record: &mut RunRecord,
    stopped_by: Option<StopReason>,
) -> Option<crate::indicator::RunFigures> {
    let cgroup = p.guard.as_ref().and_then(RunGuard::workload_cgroup);
    let figures = p
        .bench
        .take()
        .and_then(|b| b.finish(record, stopped_by, &p.collection_id, cgroup));
    for line in crate::machine::restore(&p.knobs) {
        eprintln!("error: {line}");
        record.error(line);
    }
    for left in p.guard.take().map(RunGuard::finish).unwrap_or_default() {
        eprintln!("warning: the benchmark left a change behind: {left}");
    }
    figures
}

/// What the probes' threads left once joined.
struct Joined {
    /// A probe failed or was given up.
    failed: bool,
    /// Probes that were running.
    running: usize,
    /// Each joined probe's BPF program statistics.
    stats: Vec<(String, Vec<kernmlops_plugin_api::BpfProgramStats>)>,
}

/// Joins every probe's thread (a given-up one is left behind), recording
/// how each ended and its tables' final counts.
fn join_probes(
    running: Vec<RunningProbe>,
    failure: &WriteFailure,
    record: &mut RunRecord,
) -> Joined {
    let mut joined = Joined {
        failed: false,
        running: running.len(),
        stats: Vec::new(),
    };
    for r in running {
        if r.watch.given_up().is_some() {
            // Recorded when it was given up; its thread is left behind,
            // never joined (the process's exit ends it).
            joined.failed = true;
            record.record_tables(&r.name, &r.tables, &r.counters);
            continue;
        }
        let outcome = r
            .handle
            .join()
            .unwrap_or_else(|_| Err("collector thread panicked".to_owned()));
        // After a write error, one line below says it all.
        let quiet = failure.get().is_some();
        joined.failed |= record.probe_ended(&r.name, &r.plugin, &outcome, quiet);
        // The threads are joined: the counts are final.
        record.record_tables(&r.name, &r.tables, &r.counters);
        let stats = r.stats.lock().map(|s| s.clone()).unwrap_or_default();
        joined.stats.push((r.name.clone(), stats));
        for (t, c) in r.tables.iter().zip(&r.counters) {
            let malformed = c.malformed.load(Ordering::Relaxed);
            if malformed > 0 {
                let msg = format!(
                    "table {t}: {malformed} records had a size other than the table's record size and were left out"
                );
                eprintln!("error: probe {}: {msg}", r.name);
                record.error(format!("probe {}: {msg}", r.name));
            }
        }
    }
    joined
}

/// What the end of a run hands to [`complete`].
struct Ending {
    power: Option<crate::power::PowerRunning>,
    meter: overhead::CostMeter,
    joined: Joined,
    failure: Arc<WriteFailure>,
    attach_ms: f64,
    figures: Option<crate::indicator::RunFigures>,
}

/// Finishes the power tables and the collector's overhead, completes the
/// manifest and sums the run up.
fn complete(p: Prepared, mut record: RunRecord, end: Ending) -> Result<Summary, RunError> {
    let mut probe_stats = end.joined.stats;
    if let Some(pw) = end.power.map(crate::power::PowerRunning::finish) {
        pw.tables
            .iter()
            .for_each(|(t, rows)| record.host_table(t, *rows));
        pw.errors.into_iter().for_each(|e| record.error(e));
        probe_stats.extend(pw.probe_stats);
        record.man.power = Some(pw.manifest);
    }
    let rows = record.man.tables.values().map(|t| t.rows).sum();
    let cost = end.meter.finish(&probe_stats, rows);
    write_overhead(&mut record, &cost, &p.collection_id);
    record.man.collector_overhead = Some(cost);
    if let Some(e) = end.failure.get() {
        let line = record.write_failed(&e);
        // The manifest keeps the error and the rows if there is room.
        let _ = record.complete(true, end.joined.running);
        return Err(RunError::Stopped(line));
    }
    record.complete(end.joined.failed, end.joined.running)?;
    Ok(Summary {
        run_class: record.man.run_class,
        collection_id: p.collection_id,
        dir: p.dir,
        tables: record.man.tables.clone(),
        errors: record.man.errors.clone(),
        attach_ms: end.attach_ms,
        overhead: record.man.collector_overhead.clone(),
        power: record.man.power.clone(),
        benchmark: end.figures,
    })
}

/// The run's guard: with a benchmark, its ties to this process (a warning
/// when they cannot be made); with kernel knobs, required, since their old
/// values must be on disk before any is set.
fn guard_for(
    opts: &RunOptions,
    collection_id: &str,
    collection: &std::path::Path,
) -> Result<Option<RunGuard>, RunError> {
    if opts.knobs.is_empty() {
        return Ok(opts
            .benchmark
            .as_ref()
            .and_then(|_| tie_to_host(collection_id, collection)));
    }
    let g = RunGuard::start(collection_id, collection).map_err(|e| {
        RunError::Host(format!(
            "machine: the kernel knobs' old values cannot be recorded ({e}); nothing was set"
        ))
    })?;
    for w in &g.warnings {
        eprintln!("warning: {w}");
    }
    Ok(Some(g))
}

/// Sets the kernel knobs, each one's old value journalled in the run's
/// undo log first; a knob the kernel keeps at another value than asked is
/// said in a warning (the value kept is what is recorded).
fn set_knobs(
    guard: Option<&RunGuard>,
    knobs: &[crate::machine::Knob],
) -> Result<Vec<crate::machine::Applied>, RunError> {
    let Some(guard) = guard.filter(|_| !knobs.is_empty()) else {
        return Ok(Vec::new());
    };
    let applied = crate::machine::apply(knobs, |path, old| guard.journal_restore(path, old))
        .map_err(|e| RunError::Selection(e.to_string()))?;
    for a in applied.iter().filter(|a| a.value != a.requested.trim()) {
        eprintln!(
            "warning: machine.{}: the kernel kept {:?} for {} (asked {:?})",
            a.name,
            a.value,
            a.path.display(),
            a.requested
        );
    }
    Ok(applied)
}

/// Confines the benchmark to the `cpus` knob's CPUs through the run's
/// guard; the cpuset, and so the setting, goes with the guard.
fn set_cpus(
    guard: Option<&mut RunGuard>,
    knobs: &[crate::machine::Knob],
) -> Result<Option<crate::machine::Applied>, RunError> {
    let Some(k) = knobs.iter().find(|k| k.how == crate::machine::How::Cpuset) else {
        return Ok(None);
    };
    let Some(guard) = guard else {
        return Ok(None);
    };
    let (path, previous, value) = guard
        .set_cpus(&k.value)
        .map_err(|e| RunError::Selection(format!("machine.{}: {e}", k.name)))?;
    Ok(Some(crate::machine::Applied {
        name: k.name.clone(),
        path,
        requested: k.value.clone(),
        previous,
        value,
    }))
}

/// The run's ties to this process (state folder, workload cgroup,
/// guardian); `None`, with a warning, when they cannot be made.
fn tie_to_host(collection_id: &str, collection: &std::path::Path) -> Option<RunGuard> {
    match RunGuard::start(collection_id, collection) {
        Ok(g) => {
            for w in &g.warnings {
                eprintln!("warning: {w}");
            }
            Some(g)
        }
        Err(e) => {
            eprintln!(
                "warning: the benchmark's changes to the machine are not recorded ({e}): if kernmlops is killed, undo them by hand"
            );
            None
        }
    }
}

/// Runs `f` (the benchmark's `setup` or `launch`) inside the run's workload
/// cgroup, so every process it starts is stopped with the run.
fn in_cgroup<T>(guard: &mut Option<RunGuard>, f: impl FnOnce() -> T) -> T {
    match guard {
        Some(g) => g.in_workload_cgroup(f),
        None => f(),
    }
}

/// Starts every selected probe with its drain thread. The probes load and
/// attach in parallel (each is its own plugin with its own libbpf, and
/// loading is mostly waiting on the kernel), so start-up takes as long as
/// the slowest probe rather than all of them; their results are then taken
/// in the order given. A probe that fails to start is recorded; under
/// `--strict` the first failure stops the run.
fn start_probes(
    selected: &[(&Plugin, &ProbeDecl)],
    starts: Starts,
    opts: &RunOptions,
    setup: &SinkSetup<'_>,
    stop: &Arc<AtomicBool>,
    record: &mut RunRecord,
) -> Vec<RunningProbe> {
    let mut running: Vec<RunningProbe> = Vec::new();
    // Tables of this run, by name, with the probe writing each.
    let mut table_owner: BTreeMap<String, String> = BTreeMap::new();
    for ((plugin, decl), (started, attach_ms)) in selected.iter().zip(starts.results()) {
        let name = decl.name.to_string();
        let mut notes = Vec::new();
        let outcome = started.and_then(|probe| {
            notes = probe.notes().into_iter().map(String::from).collect();
            for note in &notes {
                eprintln!("warning: probe {name}: {note}");
            }
            if opts.strict && !notes.is_empty() {
                return Err(format!("--strict: {}", notes.join("; ")));
            }
            let tables = run_tables(&probe, &table_owner)?;
            for t in &tables {
                table_owner.insert(t.name.to_string(), name.clone());
            }
            drain::spawn(probe, &name, plugin.name(), &tables, setup, stop.clone())
        });
        match outcome {
            Ok(probe) => {
                record.probe_running(&name, plugin.name(), attach_ms, notes);
                running.push(probe);
            }
            Err(e) => {
                record.probe_failed_to_start(&name, plugin.name(), attach_ms, notes, e);
                if opts.strict {
                    stop.store(true, Ordering::SeqCst);
                    break;
                }
            }
        }
    }
    running
}

/// Set (to anything) in the environment, probes start one after another,
/// each within the plugin timeout, as before they started in parallel:
/// for the `footprint` benchmark, which measures both in one run.
pub const SERIAL_START_ENV: &str = "KERNMLOPS_SERIAL_START";

/// What one probe's start gave, and how long it took in milliseconds.
type Started = (Result<kernmlops_plugin_api::ProbeBox, String>, f64);

/// The selected probes' starts, under way: each on a thread of its own,
/// launched at once, their results taken later in the order given. A
/// start that has not returned within the plugin timeout is given up: that
/// probe fails to start, its thread is left behind, and a probe it hands
/// back later is freed at once.
enum Starts {
    /// Started in parallel, all within one plugin timeout.
    Parallel {
        rx: std::sync::mpsc::Receiver<(usize, Result<kernmlops_plugin_api::ProbeBox, String>, f64)>,
        /// `Some` for a start that could not be launched.
        starts: Vec<Option<Started>>,
        t0: Instant,
        limit: Duration,
    },
    /// Not launched: made one after another when the results are taken
    /// (`KERNMLOPS_SERIAL_START`).
    Serial(Vec<Started>),
}

impl Starts {
    /// Launches the starts of `selected` (with [`SERIAL_START_ENV`], makes
    /// them one after another, each within the plugin timeout).
    fn launch(selected: &[(&Plugin, &ProbeDecl)], opts: &RunOptions) -> Self {
        if std::env::var_os(SERIAL_START_ENV).is_some() {
            return Self::Serial(
                selected
                    .iter()
                    .flat_map(|one| Self::parallel(std::slice::from_ref(one), opts).results())
                    .collect(),
            );
        }
        Self::parallel(selected, opts)
    }

    /// Launches every start of `selected` on a thread of its own.
    fn parallel(selected: &[(&Plugin, &ProbeDecl)], opts: &RunOptions) -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        let t0 = Instant::now();
        let mut starts: Vec<Option<Started>> = Vec::new();
        for (i, (plugin, decl)) in selected.iter().enumerate() {
            let name = decl.name.to_string();
            let args = start_args(&name, opts, &opts.probe_config);
            let starter = plugin.starter();
            let tx = tx.clone();
            let spawned = thread::Builder::new()
                .name(format!("kml-start-{name}"))
                .spawn(move || {
                    let t = Instant::now();
                    let cpu = startup::cpu_ms(libc::RUSAGE_THREAD);
                    let started = starter.start_probe(&name, &args).map_err(|e| e.to_string());
                    let (wall, cpu) = (
                        t.elapsed().as_secs_f64() * 1e3,
                        startup::cpu_ms(libc::RUSAGE_THREAD) - cpu,
                    );
                    startup::probe_started(&name, wall, cpu);
                    // Too late: the run gave it up, so it is dropped
                    // (stopped) here, on this thread.
                    let _ = tx.send((i, started, wall));
                });
            starts.push(match spawned {
                Ok(_) => None,
                Err(e) => Some((Err(format!("starting its thread: {e}")), 0.0)),
            });
        }
        Self::Parallel {
            rx,
            starts,
            t0,
            limit: opts.plugin_timeout(),
        }
    }

    /// Each start's result, in the order given, waiting at most until the
    /// plugin timeout after the launch.
    fn results(self) -> Vec<Started> {
        let (rx, mut starts, t0, limit) = match self {
            Self::Serial(done) => return done,
            Self::Parallel {
                rx,
                starts,
                t0,
                limit,
            } => (rx, starts, t0, limit),
        };
        while starts.iter().any(Option::is_none) {
            let left = (t0 + limit).saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((i, started, ms)) => starts[i] = Some((started, ms)),
                Err(_) => break,
            }
        }
        let waited_ms = t0.elapsed().as_secs_f64() * 1e3;
        starts
            .into_iter()
            .map(|s| {
                s.unwrap_or_else(|| {
                    let why = drain::overdue_message(
                        drain::PluginCall::Start,
                        Duration::from_secs_f64(waited_ms / 1e3),
                        limit,
                    );
                    (Err(why), waited_ms)
                })
            })
            .collect()
    }
}

/// The line saying what is collected where, for how long.
fn announce(
    running: &[RunningProbe],
    dir: &std::path::Path,
    attach_ms: f64,
    bench: Option<&BenchmarkRun>,
    duration: Option<Duration>,
) {
    let names = running
        .iter()
        .map(|r| r.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    eprintln!(
        "collecting {} into {} (attached in {attach_ms:.0} ms){}",
        if names.is_empty() {
            "nothing (baseline)"
        } else {
            names.as_str()
        },
        dir.display(),
        match (bench.map(|b| b.name.as_str()), duration) {
            (Some(name), Some(d)) => format!(" while {name} runs, at most {:.1}s", d.as_secs_f64()),
            (Some(name), None) => format!(" while {name} runs; Ctrl+C stops it"),
            (None, Some(d)) => format!(" for {:.1}s", d.as_secs_f64()),
            (None, None) => "; press Ctrl+C to stop".into(),
        }
    );
}

/// Waits for the end of the run (signal, duration, the benchmark's end, or
/// under `--strict` a probe's end), refreshing the status line and the
/// manifest's counts. Returns why the host stopped a benchmark that was
/// still running.
fn wait_for_end(
    opts: &RunOptions,
    ends: DrainEnds<'_>,
    mut bench: Option<&mut BenchmarkRun>,
    running: &[RunningProbe],
    record: &mut RunRecord,
) -> Option<StopReason> {
    let stop = ends.stop;
    const MANIFEST_EVERY: Duration = Duration::from_secs(5);
    let begun = Instant::now();
    let mut last_manifest = Instant::now();
    let mut status = StatusLine::new();
    let stopped_by = loop {
        status.update(begun.elapsed(), running);
        if ends.failure.get().is_some() {
            break Some(StopReason::WriteError);
        }
        if stop.load(Ordering::SeqCst) {
            break Some(StopReason::Signal);
        }
        if opts.duration.is_some_and(|d| begun.elapsed() >= d) {
            break Some(StopReason::Duration);
        }
        if let Some(b) = bench.as_deref_mut() {
            if b.ended(record) {
                break None;
            }
        }
        if opts.strict && running.iter().any(RunningProbe::settled) {
            break None;
        }
        let hung = drain::watchdog(running);
        for (i, why) in &hung {
            record.probe_hung(&running[*i], why.clone());
        }
        if !hung.is_empty() || last_manifest.elapsed() >= MANIFEST_EVERY {
            record.fill_tables(running);
            if let Err(e) = record.write() {
                // The first write error stops the run like a table's does.
                ends.failure.report(e.to_string());
                stop.store(true, Ordering::SeqCst);
            }
            last_manifest = Instant::now();
        }
        thread::sleep(Duration::from_millis(20));
    };
    status.clear();
    stopped_by
}

/// Writes the `collector_overhead` table; a failure is recorded as an
/// error of the run.
fn write_overhead(record: &mut RunRecord, cost: &CollectorOverhead, collection_id: &str) {
    let path = record.dir.join(format!("{}.arrow", overhead::TABLE));
    let written = cost
        .to_batch(collection_id, clock::uptime_us())
        .map_err(|e| e.to_string())
        .and_then(|b| {
            let rows = b.num_rows() as u64;
            sink::write_table(&path, &b)
                .map(|()| rows)
                .map_err(|e| e.to_string())
        });
    match written {
        Ok(rows) => record.host_table(overhead::TABLE, rows),
        Err(e) => record.error(format!("writing {}: {e}", path.display())),
    }
}

/// Writes the one-row `system_info` table.
fn write_system_info(
    record: &mut RunRecord,
    sys: &SystemInfo,
    collection_id: &str,
) -> Result<(), RunError> {
    let plugin_names: Vec<String> = record.man.plugins.iter().map(|p| p.name.clone()).collect();
    let batch = sys
        .to_batch(
            collection_id,
            record.man.start.uptime_us,
            record.man.start.unix_us,
            &plugin_names,
        )
        .map_err(|e| RunError::Host(format!("building system_info: {e}")))?;
    sink::write_table(&record.dir.join("system_info.arrow"), &batch)
        .map_err(|e| RunError::Host(e.to_string()))?;
    record.host_table("system_info", 1);
    Ok(())
}
