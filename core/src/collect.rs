//! A collection run: start the chosen probes, drain each on its own thread
//! into its tables' sinks until the duration ends or a signal arrives, then
//! stop, drain what is left, finish the files and complete the manifest.
//!
//! A probe that fails to start, or fails while running, is reported and
//! recorded; the other probes keep running and its rows already collected
//! stay on disk.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use abi_stable::std_types::{RResult, RVec};
use kernmlops_plugin_api::{Batch, ProbeBox, ProbeDecl, StartArgs, TableDecl};

use crate::{
    clock,
    decode::TableDecoder,
    manifest::{
        self, BenchmarkEntry, Manifest, PluginEntry, ProbeEntry, RefusedPlugin, TableEntry,
    },
    plugin::{Plugin, Registry},
    sink::{self, FlushPolicy, IpcSink},
    system_info::SystemInfo,
    validate::{validate_table, ValidationError},
};

/// Everything a run needs besides the plugins.
#[derive(Debug, Clone)]
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
    /// Each probe's own settings (`[probes.<name>]`), passed to it as JSON.
    pub probe_config: BTreeMap<String, serde_json::Value>,
    /// The merged configuration, recorded in the manifest.
    pub config: serde_json::Value,
    pub command: Vec<String>,
    /// The workload to run while collecting; the run lasts its lifetime.
    pub benchmark: Option<String>,
    /// Each benchmark's settings (`[benchmarks.<name>]`) as JSON.
    pub benchmark_config: BTreeMap<String, serde_json::Value>,
}

/// Which tasks probes record, applied in the kernel (0: no filter).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Filter {
    pub tgid: u32,
    pub pid: u32,
    pub cgroup_id: u64,
}

/// Rows and losses of one table, updated live by its probe's thread.
#[derive(Debug, Default)]
pub struct TableCounters {
    pub rows: AtomicU64,
    pub lost: AtomicU64,
}

/// What a run produced.
#[derive(Debug)]
pub struct Summary {
    /// `curated`, `baseline` or `failed`.
    pub run_class: String,
    pub collection_id: String,
    pub dir: PathBuf,
    pub tables: BTreeMap<String, TableEntry>,
    pub errors: Vec<String>,
    pub attach_ms: f64,
}

/// A new collection id: UTC start time and a short random suffix.
pub fn new_collection_id() -> String {
    let now = clock::unix_us();
    let noise = (now as u64 ^ (u64::from(std::process::id()) << 20) ^ clock::uptime_us()) & 0xffff;
    format!("{}-{noise:04x}", clock::compact_stamp(now))
}

struct Running {
    name: String,
    plugin: String,
    tables: Vec<String>,
    counters: Vec<Arc<TableCounters>>,
    handle: thread::JoinHandle<Result<(), String>>,
}

/// Builds the arguments a probe gets.
pub fn start_args(
    probe: &str,
    ring_bytes: u64,
    filter: Filter,
    probe_config: &BTreeMap<String, serde_json::Value>,
) -> StartArgs {
    let config = probe_config
        .get(probe)
        .map_or_else(|| "{}".to_owned(), |v| v.to_string());
    StartArgs {
        config_json: config.into(),
        ring_bytes,
        filter_tgid: filter.tgid,
        filter_pid: filter.pid,
        filter_cgroup_id: filter.cgroup_id,
        self_tgid: std::process::id(),
        include_self: false,
        filter_cgroup_descendants: false,
        output_dir: "".into(),
        state_dir: "".into(),
    }
}

/// Runs a collection. `stop` ends it early (set by the signal handlers).
pub fn run(
    registry: &Registry,
    opts: &RunOptions,
    stop: Arc<AtomicBool>,
) -> Result<Summary, String> {
    let selected = registry.resolve(&opts.probes)?;
    // A benchmark that cannot run is refused before anything is collected.
    let mut bench = match &opts.benchmark {
        Some(name) => {
            let (plugin, _) = registry.find_benchmark(name)?;
            let args = start_args(name, opts.ring_bytes, opts.filter, &opts.benchmark_config);
            let b = plugin
                .start_benchmark(name, &args)
                .map_err(|e| format!("benchmark {name}: {e}"))?;
            if let RResult::RErr(e) = b.is_configured() {
                return Err(format!("benchmark {name}: {e}"));
            }
            Some((name.clone(), plugin.name().to_owned(), b))
        }
        None => None,
    };
    let collection_id = new_collection_id();
    let dir = match &opts.collection_dir {
        Some(dir) => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("creating output folder {}: {e}", parent.display()))?;
            }
            std::fs::create_dir(dir)
                .map_err(|e| format!("creating collection folder {}: {e}", dir.display()))?;
            dir.clone()
        }
        None => {
            let dir = opts.output.join(&collection_id);
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("creating output folder {}: {e}", dir.display()))?;
            dir
        }
    };

    let sys = SystemInfo::gather();
    let start = manifest::Instant::now();
    let mut man = Manifest {
        kernmlops_version: env!("CARGO_PKG_VERSION").into(),
        collection_id: collection_id.clone(),
        status: "running".into(),
        command: opts.command.clone(),
        config: opts.config.clone(),
        hostname: sys.hostname.clone(),
        kernel_release: sys.kernel_release.clone(),
        kernel_version: sys.kernel_version.clone(),
        kernel_features: serde_json::to_value(&sys.features).unwrap_or_default(),
        start: start.clone(),
        end: None,
        plugins: plugin_entries(&selected),
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
        run_class: "running".into(),
        benchmark: bench.as_ref().map(|(name, plugin, _)| BenchmarkEntry {
            name: name.clone(),
            plugin: plugin.clone(),
            ..BenchmarkEntry::default()
        }),
    };
    let write_manifest = |m: &Manifest| {
        m.write(&dir)
            .map_err(|e| format!("writing {}: {e}", dir.join("manifest.json").display()))
    };
    write_manifest(&man)?;

    if let Some((name, _, b)) = bench.as_mut() {
        eprintln!("setting up benchmark {name}");
        if let RResult::RErr(e) = b.setup() {
            let _ = b.kill();
            let msg = format!("benchmark {name}: setup: {e}");
            if let Some(entry) = man.benchmark.as_mut() {
                entry.error = Some(msg.clone());
            }
            man.status = "failed".into();
            man.run_class = "failed".into();
            man.end = Some(manifest::Instant::now());
            write_manifest(&man)?;
            return Err(msg);
        }
    }

    let attach_start = Instant::now();
    let mut running: Vec<Running> = Vec::new();
    // Tables of this run, by name, with the probe writing each.
    let mut table_owner: BTreeMap<String, String> = BTreeMap::new();
    for (plugin, decl) in &selected {
        let name = decl.name.to_string();
        let t0 = Instant::now();
        let args = start_args(&name, opts.ring_bytes, opts.filter, &opts.probe_config);
        let started = plugin.start_probe(&name, &args);
        let attach_ms = t0.elapsed().as_secs_f64() * 1e3;
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
            let names = tables.iter().map(|t| t.name.to_string()).collect();
            spawn_probe(
                probe,
                &name,
                &tables,
                &dir,
                &collection_id,
                opts,
                stop.clone(),
            )
            .map(|spawned| (spawned, names))
        });
        match outcome {
            Ok(((handle, counters), tables)) => {
                man.probes.push(ProbeEntry {
                    name: name.clone(),
                    plugin: plugin.name().to_owned(),
                    status: "running".into(),
                    error: None,
                    attach_ms,
                    notes,
                });
                running.push(Running {
                    name,
                    plugin: plugin.name().to_owned(),
                    tables,
                    counters,
                    handle,
                });
            }
            Err(e) => {
                let msg = format!("probe {name} (plugin {}): {e}", plugin.name());
                eprintln!("error: {}", first_line_with_detail(&msg));
                man.probes.push(ProbeEntry {
                    name,
                    plugin: plugin.name().to_owned(),
                    status: "failed".into(),
                    error: Some(e),
                    attach_ms,
                    notes,
                });
                man.errors.push(msg);
                if opts.strict {
                    stop.store(true, Ordering::SeqCst);
                    break;
                }
            }
        }
    }
    let attach_ms = attach_start.elapsed().as_secs_f64() * 1e3;
    write_manifest(&man)?;

    if running.is_empty() && !selected.is_empty() {
        if let Some((_, _, b)) = bench.as_mut() {
            let _ = b.kill();
        }
        man.status = "failed".into();
        man.run_class = "failed".into();
        man.end = Some(manifest::Instant::now());
        write_manifest(&man)?;
        return Err(format!(
            "no probe could start; see {}",
            dir.join("manifest.json").display()
        ));
    }
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
        match (&bench, opts.duration) {
            (Some((name, _, _)), Some(d)) =>
                format!(" while {name} runs, at most {:.1}s", d.as_secs_f64()),
            (Some((name, _, _)), None) => format!(" while {name} runs; Ctrl+C stops it"),
            (None, Some(d)) => format!(" for {:.1}s", d.as_secs_f64()),
            (None, None) => "; press Ctrl+C to stop".into(),
        }
    );
    if let Some((name, _, b)) = bench.as_mut() {
        if let Some(entry) = man.benchmark.as_mut() {
            entry.start_uptime_us = Some(clock::uptime_us());
        }
        if let RResult::RErr(e) = b.launch() {
            let msg = format!("benchmark {name}: launch: {e}");
            eprintln!("error: {msg}");
            if let Some(entry) = man.benchmark.as_mut() {
                entry.error = Some(msg);
            }
            stop.store(true, Ordering::SeqCst);
        }
    }

    // Wait for the end, refreshing the manifest's counts now and then.
    let begun = Instant::now();
    let mut last_manifest = Instant::now();
    let mut last_poll = Instant::now();
    let mut stopped_by: Option<&str> = None;
    let mut status = StatusLine::new();
    loop {
        status.update(begun.elapsed(), &running);
        if stop.load(Ordering::SeqCst) {
            stopped_by = Some("signal");
            break;
        }
        if opts.duration.is_some_and(|d| begun.elapsed() >= d) {
            stopped_by = Some("duration");
            break;
        }
        if let Some((name, _, b)) = bench.as_mut() {
            if last_poll.elapsed() >= Duration::from_millis(100) {
                last_poll = Instant::now();
                match b.poll() {
                    RResult::ROk(st) if st.finished => {
                        if let Some(entry) = man.benchmark.as_mut() {
                            entry.exit_code = Some(st.exit_code);
                        }
                        break;
                    }
                    RResult::ROk(_) => {}
                    RResult::RErr(e) => {
                        let msg = format!("benchmark {name}: {e}");
                        eprintln!("error: {msg}");
                        if let Some(entry) = man.benchmark.as_mut() {
                            entry.error = Some(msg);
                        }
                        break;
                    }
                }
            }
        }
        if opts.strict && running.iter().any(|r| r.handle.is_finished()) {
            break;
        }
        if last_manifest.elapsed() >= Duration::from_secs(5) {
            fill_tables(&mut man, &running);
            write_manifest(&man)?;
            last_manifest = Instant::now();
        }
        thread::sleep(Duration::from_millis(20));
    }
    status.clear();
    stop.store(true, Ordering::SeqCst);
    if let Some((name, _, b)) = bench.as_mut() {
        // Always: whatever ended the run, nothing of the workload stays.
        if let RResult::RErr(e) = b.kill() {
            let msg = format!("benchmark {name}: stopping: {e}");
            eprintln!("error: {msg}");
            man.errors.push(msg);
        }
        if let Some(entry) = man.benchmark.as_mut() {
            entry.end_uptime_us = Some(clock::uptime_us());
            if entry.exit_code.is_none() && entry.error.is_none() {
                entry.stopped_by = stopped_by.map(str::to_owned);
            }
        }
    }

    let running_probes = running.len();
    let mut failed = false;
    let mut results = Vec::new();
    for r in running {
        let outcome = match r.handle.join() {
            Ok(res) => res,
            Err(_) => Err("collector thread panicked".to_owned()),
        };
        results.push((r.name, r.plugin, r.tables, r.counters, outcome));
    }
    for (name, plugin, tables, counters, outcome) in &results {
        if let Some(p) = man.probes.iter_mut().find(|p| &p.name == name) {
            match outcome {
                Ok(()) => p.status = "ok".into(),
                Err(e) => {
                    failed = true;
                    p.status = "failed".into();
                    p.error = Some(e.clone());
                    let msg = format!("probe {name} (plugin {plugin}): {e}");
                    eprintln!("error: {}", first_line_with_detail(&msg));
                    man.errors.push(msg);
                }
            }
        }
        // The threads are joined: the counts are final.
        record_tables(&mut man, name, tables, counters);
    }

    let plugin_names: Vec<String> = man.plugins.iter().map(|p| p.name.clone()).collect();
    let sys_batch = sys
        .to_batch(
            &collection_id,
            start.uptime_us,
            start.unix_us,
            &plugin_names,
        )
        .map_err(|e| format!("building system_info: {e}"))?;
    sink::write_table(&dir.join("system_info.arrow"), &sys_batch).map_err(|e| e.to_string())?;
    man.tables.insert(
        "system_info".into(),
        TableEntry {
            probe: "host".into(),
            file: "system_info.arrow".into(),
            rows: 1,
            lost_events: 0,
        },
    );

    man.status = if failed || !man.errors.is_empty() {
        "complete_with_errors".into()
    } else {
        "complete".into()
    };
    man.run_class = classify(&man, running_probes);
    if let Some(entry) = &man.benchmark {
        if man.run_class == "failed" {
            let why = match (&entry.error, entry.exit_code) {
                (Some(e), _) => e.clone(),
                (None, Some(code)) => format!("benchmark {} exited with code {code}", entry.name),
                (None, None) => format!("benchmark {} failed", entry.name),
            };
            eprintln!("error: {why}; its data is kept in {}", dir.display());
            man.errors.push(why);
        }
    }
    man.end = Some(manifest::Instant::now());
    write_manifest(&man)?;
    Ok(Summary {
        run_class: man.run_class.clone(),
        collection_id,
        dir,
        tables: man.tables.clone(),
        errors: man.errors.clone(),
        attach_ms,
    })
}

/// A live one-line status on a terminal (elapsed time, rows per table, row
/// rate, lost events), redrawn twice a second; silent when stderr is not a
/// terminal, so logs and pipes stay clean.
struct StatusLine {
    enabled: bool,
    shown: bool,
    last: Instant,
    last_rows: u64,
}

impl StatusLine {
    fn new() -> Self {
        // SAFETY: isatty only inspects the descriptor.
        let enabled = unsafe { libc::isatty(2) } == 1;
        Self {
            enabled,
            shown: false,
            last: Instant::now(),
            last_rows: 0,
        }
    }

    fn update(&mut self, elapsed: Duration, running: &[Running]) {
        if !self.enabled || self.last.elapsed() < Duration::from_millis(500) {
            return;
        }
        let mut rows = 0;
        let mut lost = 0;
        let mut parts = Vec::new();
        for r in running {
            for (t, c) in r.tables.iter().zip(&r.counters) {
                let n = c.rows.load(Ordering::Relaxed);
                rows += n;
                lost += c.lost.load(Ordering::Relaxed);
                parts.push(format!("{t} {n}"));
            }
        }
        let rate = (rows.saturating_sub(self.last_rows)) as f64 / self.last.elapsed().as_secs_f64();
        self.last = Instant::now();
        self.last_rows = rows;
        let mut line = format!(
            "{:>7.1}s  {:>9.0} rows/s  lost {lost}  |  {}",
            elapsed.as_secs_f64(),
            rate,
            parts.join("  ")
        );
        // Keep to one terminal line.
        let width = terminal_width();
        if line.chars().count() >= width {
            line = line
                .chars()
                .take(width.saturating_sub(2))
                .collect::<String>()
                + "…";
        }
        eprint!("\r\x1b[2K{line}");
        self.shown = true;
    }

    fn clear(&mut self) {
        if self.shown {
            eprint!("\r\x1b[2K");
            self.shown = false;
        }
    }
}

/// Columns of the terminal on stderr, 80 when unknown.
fn terminal_width() -> usize {
    // SAFETY: winsize is plain old data, filled by the ioctl.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes a winsize into a valid pointer.
    let rc = unsafe { libc::ioctl(2, libc::TIOCGWINSZ, &mut ws) };
    if rc == 0 && ws.ws_col > 0 {
        usize::from(ws.ws_col)
    } else {
        80
    }
}

/// The run's class: `failed` when the benchmark failed (it could not start,
/// exited non-zero, or errored) or probes failed, `baseline` when no probe
/// ran, `curated` otherwise. A benchmark stopped by the duration or a
/// signal did not fail: the user chose the window.
fn classify(man: &Manifest, running_probes: usize) -> String {
    let bench_failed = man
        .benchmark
        .as_ref()
        .is_some_and(|b| b.error.is_some() || b.exit_code.is_some_and(|c| c != 0));
    if bench_failed || man.status != "complete" {
        "failed"
    } else if running_probes == 0 {
        "baseline"
    } else {
        "curated"
    }
    .into()
}

/// Shows the first line of an error and keeps multi-line detail (a
/// verifier log) indented below it.
fn first_line_with_detail(msg: &str) -> String {
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

fn fill_tables(man: &mut Manifest, running: &[Running]) {
    for r in running {
        record_tables(man, &r.name, &r.tables, &r.counters);
    }
}

/// Puts a probe's tables, with their current counts, in the manifest.
fn record_tables(
    man: &mut Manifest,
    probe: &str,
    tables: &[String],
    counters: &[Arc<TableCounters>],
) {
    for (t, c) in tables.iter().zip(counters) {
        man.tables.insert(
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

type Spawned = (
    thread::JoinHandle<Result<(), String>>,
    Vec<Arc<TableCounters>>,
);

/// The tables a started probe fills, validated like declared ones and
/// unique within the run.
fn run_tables(
    probe: &ProbeBox,
    taken: &BTreeMap<String, String>,
) -> Result<Vec<TableDecl>, String> {
    let tables = probe.tables().into_vec();
    if tables.is_empty() {
        return Err("the probe fills no table".into());
    }
    for t in &tables {
        validate_table(t).map_err(|e| e.to_string())?;
        if let Some(owner) = taken.get(t.name.as_str()) {
            return Err(ValidationError::DuplicateTable {
                table: t.name.to_string(),
                owner: owner.clone(),
            }
            .to_string());
        }
    }
    Ok(tables)
}

/// Creates the probe's sinks and its drain thread.
fn spawn_probe(
    probe: ProbeBox,
    name: &str,
    tables: &[TableDecl],
    dir: &Path,
    collection_id: &str,
    opts: &RunOptions,
    stop: Arc<AtomicBool>,
) -> Result<Spawned, String> {
    let mut sinks = Vec::new();
    for t in tables {
        let path = dir.join(format!("{}.arrow", t.name));
        let sink = IpcSink::create(&path, TableDecoder::new(t, collection_id), opts.flush)
            .map_err(|e| e.to_string())?;
        sinks.push(sink);
    }
    let counters: Vec<Arc<TableCounters>> = sinks.iter().map(|_| Arc::default()).collect();
    let thread_counters = counters.clone();
    let drain_ms = u32::try_from(opts.drain_interval.as_millis()).unwrap_or(u32::MAX);
    let handle = thread::Builder::new()
        .name(format!("kml-{name}"))
        .spawn(move || drain_loop(probe, sinks, &thread_counters, drain_ms, &stop))
        .map_err(|e| format!("starting its thread: {e}"))?;
    Ok((handle, counters))
}

/// Drains a probe into its sinks until `stop`, then stops it, drains the
/// rest and finishes the files. On a probe error the rows already taken are
/// still written.
pub fn drain_loop(
    mut probe: ProbeBox,
    mut sinks: Vec<IpcSink>,
    counters: &[Arc<TableCounters>],
    drain_ms: u32,
    stop: &AtomicBool,
) -> Result<(), String> {
    let mut batches: RVec<Batch> = sinks.iter().map(|_| Batch::default()).collect();
    let mut error: Option<String> = None;
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        if stopping {
            if let RResult::RErr(e) = probe.stop() {
                error = Some(format!("stopping: {e}"));
            }
        }
        let drained = probe.drain(if stopping { 0 } else { drain_ms }, &mut batches);
        for ((batch, sink), c) in batches.iter_mut().zip(sinks.iter_mut()).zip(counters) {
            if !batch.data.is_empty() && error.is_none() {
                if let Err(e) = sink.push(&batch.data) {
                    error = Some(e.to_string());
                }
            }
            batch.data.clear();
            batch.records = 0;
            c.rows.store(sink.rows_accepted(), Ordering::Relaxed);
            c.lost.store(batch.lost_total, Ordering::Relaxed);
        }
        if let RResult::RErr(e) = drained {
            error.get_or_insert(e.to_string());
        }
        if stopping || error.is_some() {
            break;
        }
    }
    drop(probe);
    for sink in sinks {
        let path = sink.path().to_owned();
        if let Err(e) = sink.finish() {
            error.get_or_insert(format!("finishing {}: {e}", path.display()));
        }
    }
    error.map_or(Ok(()), Err)
}

/// Result of `kernmlops check` for one probe.
#[derive(Debug)]
pub struct CheckResult {
    pub probe: String,
    pub plugin: String,
    pub outcome: Result<f64, String>,
}

/// Starts (loads, verifies, attaches) each probe, drains it once, stops it
/// and detaches, reporting each step's failure.
pub fn check(
    registry: &Registry,
    probes: &[String],
    ring_bytes: u64,
    probe_config: &BTreeMap<String, serde_json::Value>,
) -> Result<Vec<CheckResult>, String> {
    let selected = registry.resolve(probes)?;
    let mut out = Vec::new();
    for (plugin, decl) in selected {
        let name = decl.name.to_string();
        let args = start_args(&name, ring_bytes, Filter::default(), probe_config);
        let t0 = Instant::now();
        let outcome = plugin.start_probe(&name, &args).and_then(|mut probe| {
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            for note in probe.notes() {
                eprintln!("warning: probe {name}: {note}");
            }
            let tables = probe.tables();
            if tables.is_empty() {
                return Err("the probe fills no table".into());
            }
            for t in tables.iter() {
                validate_table(t).map_err(|e| e.to_string())?;
            }
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

/// Repairs every table file of a collection after a crash and marks the
/// manifest, returning (file, outcome) pairs.
pub fn repair_collection(dir: &Path) -> Result<Vec<(PathBuf, sink::RepairOutcome)>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "arrow"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("{}: no .arrow files here", dir.display()));
    }
    let mut out = Vec::new();
    for f in files {
        let outcome = sink::repair(&f).map_err(|e| e.to_string())?;
        out.push((f, outcome));
    }
    if let Ok(mut man) = Manifest::read(dir) {
        for (f, outcome) in &out {
            let table = f
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let rows = match outcome {
                sink::RepairOutcome::Intact { rows }
                | sink::RepairOutcome::Repaired { rows, .. } => *rows,
            };
            man.tables
                .entry(table.clone())
                .or_insert_with(|| TableEntry {
                    probe: String::new(),
                    file: format!("{table}.arrow"),
                    rows,
                    lost_events: 0,
                })
                .rows = rows;
        }
        if man.status == "running" {
            man.status = "repaired".into();
        }
        man.write(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    Ok(out)
}
