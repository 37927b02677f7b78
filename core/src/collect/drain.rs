//! Probes while they run: each started probe gets its tables' sinks and one
//! drain thread that moves its batches into them, with live row and loss
//! counters the status line and the manifest read.
//!
//! Every pass of a drain thread flushes the sinks whose oldest row has
//! waited a flush interval, so quiet tables reach the disk in time too. The
//! first write error (a full disk) is reported in [`WriteFailure`], which
//! stops the whole run: every probe stops and every file is closed.
//!
//! A stop does not wait out a drain: [`wake_until_ended`] interrupts each
//! drain thread's wait with a signal (a BPF probe's `epoll_wait` returns
//! EINTR) until the thread has ended.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use abi_stable::std_types::{RResult, RVec};
use kernmlops_plugin_api::{Batch, BpfProgramStats, ProbeBox, TableDecl};

use crate::{
    decode::TableDecoder,
    sink::{FlushPolicy, IpcSink},
    validate::{validate_table, ValidationError},
};

/// The kernel's run-time statistics of a probe's BPF programs, taken by its
/// drain thread just before the probe is dropped.
pub type ProbeStats = Arc<Mutex<Vec<BpfProgramStats>>>;

/// Rows and losses of one table, updated live by its probe's thread.
#[derive(Debug, Default)]
pub struct TableCounters {
    pub rows: AtomicU64,
    pub lost: AtomicU64,
    /// Records of the wrong size the probe left out.
    pub malformed: AtomicU64,
}

/// The run's first write error, shared by every drain thread and the
/// collection loop: once set, the run stops.
#[derive(Debug, Default)]
pub struct WriteFailure {
    failed: AtomicBool,
    first: Mutex<Option<String>>,
}

impl WriteFailure {
    /// Records `error` unless one came first.
    pub fn report(&self, error: String) {
        if let Ok(mut first) = self.first.lock() {
            first.get_or_insert(error);
        }
        self.failed.store(true, Ordering::SeqCst);
    }

    /// The first write error, once there was one.
    pub fn get(&self) -> Option<String> {
        if !self.failed.load(Ordering::SeqCst) {
            return None;
        }
        self.first.lock().ok().and_then(|f| f.clone())
    }
}

/// A probe whose drain thread is running.
pub(super) struct RunningProbe {
    pub name: String,
    pub plugin: String,
    pub tables: Vec<String>,
    pub counters: Vec<Arc<TableCounters>>,
    pub stats: ProbeStats,
    pub handle: thread::JoinHandle<Result<(), String>>,
}

/// The signal that interrupts a drain thread's wait. Its default action is
/// to ignore it, so the no-op handler changes nothing else.
const WAKE_SIGNAL: libc::c_int = libc::SIGURG;

/// Interrupts the wait of the drain thread `handle` runs, once its no-op
/// handler is installed (with `SA_RESTART`, so only waits that are never
/// restarted, such as `epoll_wait`, return early).
fn interrupt<T>(handle: &thread::JoinHandle<T>) {
    use std::os::unix::thread::JoinHandleExt;
    static HANDLER: std::sync::Once = std::sync::Once::new();
    extern "C" fn wake(_: libc::c_int) {}
    HANDLER.call_once(|| {
        // SAFETY: sigaction is plain old data; zero is a valid value, then
        // filled: a handler that does nothing (async-signal-safe).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = wake as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(WAKE_SIGNAL, &sa, std::ptr::null_mut());
        }
    });
    // SAFETY: the thread is not joined yet, so its pthread_t is valid (a
    // thread that has returned but is not joined still has one).
    unsafe { libc::pthread_kill(handle.as_pthread_t(), WAKE_SIGNAL) };
}

/// After `stop` is set: wakes every drain thread until it has ended, so
/// each stops its probe, drains the rest and closes its files now rather
/// than at the end of its current wait (up to `drain_interval`). A wake-up
/// that lands just before a wait is missed, hence the repeats.
pub(super) fn wake_until_ended(running: &[RunningProbe]) {
    while running.iter().any(|r| !r.handle.is_finished()) {
        for r in running.iter().filter(|r| !r.handle.is_finished()) {
            interrupt(&r.handle);
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// The tables a started probe fills, validated like declared ones and
/// unique within the run (`taken`: table name to the probe writing it).
/// `kernmlops check` applies the same rules with nothing taken.
pub fn run_tables(
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

/// Where a probe's tables go and how it is drained.
pub(super) struct SinkSetup<'a> {
    pub dir: &'a Path,
    pub collection_id: &'a str,
    pub flush: FlushPolicy,
    pub drain_interval: Duration,
    /// Where a drain thread reports a write error, stopping the run.
    pub failure: Arc<WriteFailure>,
    /// When `--duration` ends the run: no drain waits past it, so a short
    /// run is not held up by a drain interval.
    pub deadline: Option<Instant>,
}

/// Creates the probe's sinks and its drain thread.
pub(super) fn spawn(
    probe: ProbeBox,
    name: &str,
    plugin: &str,
    tables: &[TableDecl],
    setup: &SinkSetup<'_>,
    stop: Arc<AtomicBool>,
) -> Result<RunningProbe, String> {
    let mut sinks = Vec::new();
    for t in tables {
        let path = setup.dir.join(format!("{}.arrow", t.name));
        let sink = IpcSink::create(
            &path,
            TableDecoder::new(t, setup.collection_id),
            setup.flush,
        )
        .map_err(|e| e.to_string())?;
        sinks.push(sink);
    }
    let counters: Vec<Arc<TableCounters>> = sinks.iter().map(|_| Arc::default()).collect();
    let thread_counters = counters.clone();
    let stats = ProbeStats::default();
    let thread_stats = stats.clone();
    let drain_ms = u32::try_from(setup.drain_interval.as_millis()).unwrap_or(u32::MAX);
    let failure = setup.failure.clone();
    let deadline = setup.deadline;
    let handle = thread::Builder::new()
        .name(format!("kml-{name}"))
        .spawn(move || {
            let ends = DrainEnds {
                stop: &stop,
                failure: &failure,
                deadline,
            };
            drain_loop(
                probe,
                sinks,
                &thread_counters,
                drain_ms,
                ends,
                &thread_stats,
            )
        })
        .map_err(|e| format!("starting its thread: {e}"))?;
    Ok(RunningProbe {
        name: name.to_owned(),
        plugin: plugin.to_owned(),
        tables: tables.iter().map(|t| t.name.to_string()).collect(),
        counters,
        stats,
        handle,
    })
}

/// What ends a drain thread: the run's stop flag, and the run's write
/// failure, which a write error of this thread sets (and stops the run).
#[derive(Clone, Copy)]
pub struct DrainEnds<'a> {
    pub stop: &'a AtomicBool,
    pub failure: &'a WriteFailure,
    /// When the run's duration ends, if it has one.
    pub deadline: Option<Instant>,
}

/// How long a drain may wait: the drain interval, or less when a sink's
/// pending rows are due on disk sooner or the run's duration ends sooner
/// (rounded up to a millisecond, so a flush nearly due never spins).
fn drain_wait(drain_ms: u32, sinks: &[IpcSink], deadline: Option<Instant>) -> u32 {
    let until_end = deadline.map(|d| d.saturating_duration_since(Instant::now()));
    sinks
        .iter()
        .filter_map(IpcSink::due_in)
        .chain(until_end)
        .map(|d| u32::try_from(d.as_micros().div_ceil(1000)).unwrap_or(u32::MAX))
        .fold(drain_ms, u32::min)
        .max(1)
        .min(drain_ms.max(1))
}

/// Drains a probe into its sinks until `stop`, then stops it, drains the
/// rest and finishes the files. On a probe error the rows already taken are
/// still written. A write error stops the whole run (`ends.failure`); the
/// files are then closed with the rows they hold, and each table's counter
/// ends as the rows on disk.
pub fn drain_loop(
    mut probe: ProbeBox,
    mut sinks: Vec<IpcSink>,
    counters: &[Arc<TableCounters>],
    drain_ms: u32,
    ends: DrainEnds<'_>,
    stats: &ProbeStats,
) -> Result<(), String> {
    let mut batches: RVec<Batch> = sinks.iter().map(|_| Batch::default()).collect();
    let mut error: Option<String> = None;
    loop {
        let stopping = ends.stop.load(Ordering::Relaxed);
        if stopping {
            if let RResult::RErr(e) = probe.stop() {
                error = Some(format!("stopping: {e}"));
            }
        }
        let wait = if stopping {
            0
        } else {
            drain_wait(drain_ms, &sinks, ends.deadline)
        };
        let drained = probe.drain(wait, &mut batches);
        for ((batch, sink), c) in batches.iter_mut().zip(sinks.iter_mut()).zip(counters) {
            if !sink.failed() {
                let written = if batch.data.is_empty() {
                    sink.flush_if_due()
                } else {
                    sink.push(&batch.data, batch.records)
                };
                if let Err(e) = written {
                    let msg = format!("writing {e}");
                    ends.failure.report(msg.clone());
                    ends.stop.store(true, Ordering::SeqCst);
                    error.get_or_insert(msg);
                }
            }
            batch.data.clear();
            batch.records = 0;
            c.rows.store(sink.rows_accepted(), Ordering::Relaxed);
            c.lost.store(batch.lost_total, Ordering::Relaxed);
            c.malformed.store(
                batch.malformed_total + sink.rows_rejected(),
                Ordering::Relaxed,
            );
        }
        if let RResult::RErr(e) = drained {
            error.get_or_insert(e.to_string());
        }
        if stopping || error.is_some() {
            break;
        }
    }
    if let Ok(mut s) = stats.lock() {
        *s = probe.bpf_stats().into_vec();
    }
    drop(probe);
    for (sink, c) in sinks.into_iter().zip(counters) {
        let (rows, done) = sink.finish();
        c.rows.store(rows, Ordering::Relaxed);
        if let Err(e) = done {
            let msg = format!("finishing {e}");
            if e.is_out_of_space() {
                ends.failure.report(msg.clone());
            }
            error.get_or_insert(msg);
        }
    }
    error.map_or(Ok(()), Err)
}
