//! Probes while they run: each started probe gets its tables' sinks, one
//! drain thread that empties its rings, and one writer thread that decodes
//! and writes what the drain thread hands it, with live row and loss
//! counters the status line and the manifest read.
//!
//! The drain thread never writes: a write can block for up to 200 ms a time
//! in the kernel's dirty-page throttling when other processes fill the page
//! cache, and a ring holds an eighth of a second. Passes go to the writer
//! through a channel (at most [`WRITE_BACKLOG_BYTES`] waiting), and drain
//! threads run at nice -10 where the process may raise them, so CPU hogs
//! that outnumber the CPUs do not keep them from their rings either.
//!
//! The writer flushes the sinks whose oldest row has waited a flush
//! interval, so quiet tables reach the disk in time too. The first write
//! error (a full disk) is reported in [`WriteFailure`], which stops the
//! whole run: every probe stops and every file is closed.
//!
//! A stop does not wait out a drain: [`wake_until_ended`] interrupts each
//! drain thread's wait with a signal (a BPF probe's `epoll_wait` returns
//! EINTR) until the thread has ended.
//!
//! A watchdog bounds every call into a probe ([`Watch`]): a drain may take
//! its wait plus the plugin timeout, a stop, a statistics read or freeing
//! the probe the timeout. A probe whose call is overdue is given up
//! ([`watchdog`]): its sinks, which only its writer thread holds, and only
//! while it writes, are taken and closed with the rows they hold, and its thread is left
//! behind, never joined (the process's exit ends it). Should the call
//! return after all, the thread finds its sinks gone, frees the probe and
//! ends.

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
use kernmlops_plugin_api::{
    spec::{validate_table, ValidationError},
    Batch, BpfProgramStats, ProbeBox, TableDecl,
};
use kernmlops_sys::clock::uptime_us;

use crate::{
    decode::TableDecoder,
    sink::{FlushPolicy, IpcSink},
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

/// A probe's sinks, one per table, held by its drain thread between calls
/// into the probe; `None` once the watchdog has taken and closed them.
pub type SharedSinks = Arc<Mutex<Option<Vec<IpcSink>>>>;

fn lock_sinks(sinks: &SharedSinks) -> std::sync::MutexGuard<'_, Option<Vec<IpcSink>>> {
    // A thread that panicked holding the sinks left them usable: each
    // sink's state is updated before it writes.
    sinks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A call into a plugin that the watchdog bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PluginCall {
    Start = 1,
    Drain = 2,
    Stop = 3,
    Stats = 4,
    Free = 5,
}

impl PluginCall {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Start,
            2 => Self::Drain,
            3 => Self::Stop,
            4 => Self::Stats,
            5 => Self::Free,
            _ => return None,
        })
    }

    /// The call's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Drain => "drain",
            Self::Stop => "stop",
            Self::Stats => "statistics",
            Self::Free => "release",
        }
    }
}

/// The call a probe's thread is making into its plugin, if any, and by when
/// it must return; read by the watchdog on the run's main thread.
#[derive(Debug, Default)]
pub struct Watch {
    /// The [`PluginCall`] in progress; 0 between calls.
    call: std::sync::atomic::AtomicU8,
    /// CLOCK_BOOTTIME µs when the call began.
    began_us: AtomicU64,
    /// CLOCK_BOOTTIME µs by which it must have returned.
    due_us: AtomicU64,
    /// Set once the watchdog has given the probe up, with why.
    given_up: Mutex<Option<String>>,
}

/// Marks the end of a watched call when dropped.
pub struct CallGuard<'a>(&'a Watch);

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        self.0.call.store(0, Ordering::Release);
    }
}

impl Watch {
    /// Marks the start of `call`, which may take `allowed`.
    pub fn enter(&self, call: PluginCall, allowed: Duration) -> CallGuard<'_> {
        let now = uptime_us();
        let allowed_us = u64::try_from(allowed.as_micros()).unwrap_or(u64::MAX);
        self.began_us.store(now, Ordering::Relaxed);
        self.due_us
            .store(now.saturating_add(allowed_us), Ordering::Relaxed);
        // Release: a watchdog that sees the call sees its times.
        self.call.store(call as u8, Ordering::Release);
        CallGuard(self)
    }

    /// The call in progress past its due time, with how long it has run.
    pub fn overdue(&self, now_us: u64) -> Option<(PluginCall, Duration)> {
        let call = PluginCall::from_u8(self.call.load(Ordering::Acquire))?;
        // A newer call stores later times, so a stale pair never makes a
        // call that just began look overdue.
        let (began, due) = (
            self.began_us.load(Ordering::Relaxed),
            self.due_us.load(Ordering::Relaxed),
        );
        (now_us > due).then(|| (call, Duration::from_micros(now_us.saturating_sub(began))))
    }

    /// Why the probe was given up, once it was.
    pub fn given_up(&self) -> Option<String> {
        self.given_up
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn give_up(&self, why: String) {
        *self
            .given_up
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(why);
    }
}

/// "its drain call has not returned in 5.2 s (limit 5 s): ..." for a call
/// the watchdog gave up on.
pub fn overdue_message(call: PluginCall, running_for: Duration, limit: Duration) -> String {
    format!(
        "hung: its {} call has not returned in {:.1} s (limit collect.plugin_timeout = {}); \
         the probe was given up and the rest of the run went on without it",
        call.name(),
        running_for.as_secs_f64(),
        kernmlops_sys::duration::format_duration(limit),
    )
}

/// A probe whose drain thread is running.
pub(super) struct RunningProbe {
    pub name: String,
    pub plugin: String,
    pub tables: Vec<String>,
    pub counters: Vec<Arc<TableCounters>>,
    pub stats: ProbeStats,
    pub handle: thread::JoinHandle<Result<(), String>>,
    pub watch: Arc<Watch>,
    pub sinks: SharedSinks,
    /// How long a call into the probe may take beyond its own wait.
    pub limit: Duration,
}

impl RunningProbe {
    /// Whether the thread is done with: ended, or given up by the watchdog.
    pub fn settled(&self) -> bool {
        self.handle.is_finished() || self.watch.given_up().is_some()
    }
}

/// Gives up every probe whose call into its plugin is overdue: its tables
/// are closed with the rows they hold (their counters then say those
/// rows), and its thread is left to itself. Returns each newly given-up
/// probe's index and why, for the caller to report and record.
pub(super) fn watchdog(running: &[RunningProbe]) -> Vec<(usize, String)> {
    let now = uptime_us();
    let mut out = Vec::new();
    for (i, r) in running.iter().enumerate() {
        if r.handle.is_finished() || r.watch.given_up().is_some() {
            continue;
        }
        let Some((call, running_for)) = r.watch.overdue(now) else {
            continue;
        };
        let mut why = overdue_message(call, running_for, r.limit);
        r.watch.give_up(why.clone());
        // Only the writer holds the sinks, and only while it writes: they
        // are free, or soon.
        let taken = lock_sinks(&r.sinks).take();
        for (sink, c) in taken.into_iter().flatten().zip(&r.counters) {
            let (rows, done) = sink.finish();
            c.rows.store(rows, Ordering::Relaxed);
            if let Err(e) = done {
                why.push_str(&format!("; finishing {e}"));
            }
        }
        out.push((i, why));
    }
    out
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
/// that lands just before a wait is missed, hence the repeats. A thread
/// stuck in its plugin is given up by the watchdog meanwhile; `on_hung`
/// gets each one.
pub(super) fn wake_until_ended(
    running: &[RunningProbe],
    mut on_hung: impl FnMut(&RunningProbe, String),
) {
    while running.iter().any(|r| !r.settled()) {
        for r in running.iter().filter(|r| !r.settled()) {
            interrupt(&r.handle);
        }
        for (i, why) in watchdog(running) {
            on_hung(&running[i], why);
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
    /// How long a call into a probe may take beyond its own wait before
    /// the watchdog gives the probe up.
    pub plugin_timeout: Duration,
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
    let sinks: SharedSinks = Arc::new(Mutex::new(Some(sinks)));
    let thread_sinks = sinks.clone();
    let watch = Arc::new(Watch::default());
    let thread_watch = watch.clone();
    let limit = setup.plugin_timeout;
    let handle = thread::Builder::new()
        .name(format!("kml-{name}"))
        .spawn(move || {
            let ends = DrainEnds {
                stop: &stop,
                failure: &failure,
                deadline,
            };
            let watched = Watched {
                watch: &thread_watch,
                limit,
            };
            drain_loop(
                probe,
                &thread_sinks,
                &thread_counters,
                drain_ms,
                ends,
                &thread_stats,
                watched,
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
        watch,
        sinks,
        limit,
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

/// How long a drain may wait: the drain interval, or less when the run's
/// duration ends sooner (rounded up to a millisecond). Flushes that fall
/// due are the writer thread's.
fn drain_wait(drain_ms: u32, deadline: Option<Instant>) -> u32 {
    deadline
        .map(|d| d.saturating_duration_since(Instant::now()))
        .map(|d| u32::try_from(d.as_micros().div_ceil(1000)).unwrap_or(u32::MAX))
        .map_or(drain_ms, |d| d.min(drain_ms))
        .max(1)
        .min(drain_ms.max(1))
}

/// Bytes of drained records a probe's writer may have waiting before the
/// drain thread waits for it: a few seconds of the busiest probe's rows,
/// so a write stalled by dirty-page throttling (up to 200 ms a pause) never
/// holds up the rings.
pub const WRITE_BACKLOG_BYTES: u64 = 16 << 20;

/// One drain pass's records, handed from a drain thread to its writer.
/// The writer hands each emptied buffer back, so a busy table's buffers
/// are reused rather than allocated every pass.
struct Drained {
    /// Per table: records' bytes, count, and the probe's malformed total.
    tables: Vec<(RVec<u8>, u64, u64)>,
    bytes: u64,
}

/// The drain threads' nice value: under CPU hogs that outnumber the CPUs a
/// drain thread still runs soon after its ring wakes it (each is mostly
/// asleep, so it takes little from the others). Without the privilege to
/// raise it, the thread runs at the process's priority.
const DRAIN_NICE: libc::c_int = -10;

fn raise_priority() {
    // SAFETY: gettid has no preconditions; setpriority on this thread's
    // own id changes only its nice value.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, DRAIN_NICE);
    }
}

/// The writer of one probe's tables: pushes what its drain thread hands
/// over into the sinks and flushes those whose rows are due, until the
/// drain thread is done (its sender dropped) or the watchdog took the
/// sinks. A write error stops the run (`failure`, `stop`); the first is
/// returned.
fn write_loop(
    rx: std::sync::mpsc::Receiver<Drained>,
    spare: std::sync::mpsc::Sender<RVec<u8>>,
    sinks: &SharedSinks,
    counters: &[Arc<TableCounters>],
    backlog: &AtomicU64,
    ends: DrainEnds<'_>,
) -> Option<String> {
    use std::sync::mpsc::RecvTimeoutError;
    let mut error: Option<String> = None;
    let report = |e: String, error: &mut Option<String>| {
        ends.failure.report(e.clone());
        ends.stop.store(true, Ordering::SeqCst);
        error.get_or_insert(e);
    };
    loop {
        let due = match lock_sinks(sinks).as_deref() {
            Some(s) => s.iter().filter_map(IpcSink::due_in).min(),
            // Given up: nothing more is written.
            None => return error,
        };
        let wait = due.map_or(WRITER_TICK, |d| d.min(WRITER_TICK));
        let pass = match rx.recv_timeout(wait) {
            Ok(pass) => Some(pass),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                // The drain thread is done: close the files here too, so
                // it never writes.
                if let Some(left) = lock_sinks(sinks).take() {
                    if let Some(e) = finish_sinks(left, counters, ends) {
                        error.get_or_insert(e);
                    }
                }
                return error;
            }
        };
        let mut held = lock_sinks(sinks);
        let Some(sinks) = held.as_mut() else {
            return error;
        };
        if let Some(pass) = pass {
            for ((sink, c), (mut data, records, malformed)) in
                sinks.iter_mut().zip(counters).zip(pass.tables)
            {
                if !sink.failed() && !data.is_empty() {
                    if let Err(e) = sink.push(&data, records) {
                        report(format!("writing {e}"), &mut error);
                    }
                }
                c.rows.store(sink.rows_accepted(), Ordering::Relaxed);
                c.malformed
                    .store(malformed + sink.rows_rejected(), Ordering::Relaxed);
                if data.capacity() > 0 {
                    data.clear();
                    // The drain thread may have ended: then it is freed.
                    let _ = spare.send(data);
                }
            }
            backlog.fetch_sub(pass.bytes, Ordering::Relaxed);
        }
        // Every table whose oldest row has waited a flush interval, also
        // while another table of the probe keeps the channel busy.
        for sink in sinks.iter_mut().filter(|s| !s.failed()) {
            if let Err(e) = sink.flush_if_due() {
                report(format!("writing {e}"), &mut error);
            }
        }
    }
}

/// The longest a writer waits for its drain thread before it looks at its
/// sinks' flushes again.
const WRITER_TICK: Duration = Duration::from_millis(100);

/// The watch a drain thread reports its calls to, and the plugin timeout.
#[derive(Clone, Copy)]
pub struct Watched<'a> {
    pub watch: &'a Watch,
    pub limit: Duration,
}

/// What a drain thread returns when the watchdog gave its probe up and the
/// call came back after all.
const GIVEN_UP: &str = "given up by the watchdog";

/// Drains a probe until `stop`, then stops it and drains the rest; each
/// pass goes to the probe's writer thread ([`write_loop`]), which writes it
/// into the sinks and finishes the files. On a probe error the rows already
/// taken are still written. A write error stops the whole run
/// (`ends.failure`); the files are then closed with the rows they hold, and
/// each table's counter ends as the rows on disk. Every call into the probe
/// is reported to `watched`; the drain thread never holds the sinks and the
/// writer only while it writes, so the watchdog can close them while a
/// call hangs.
pub fn drain_loop(
    mut probe: ProbeBox,
    sinks: &SharedSinks,
    counters: &[Arc<TableCounters>],
    drain_ms: u32,
    ends: DrainEnds<'_>,
    stats: &ProbeStats,
    watched: Watched<'_>,
) -> Result<(), String> {
    let Watched { watch, limit } = watched;
    raise_priority();
    let mut batches: RVec<Batch> = counters.iter().map(|_| Batch::default()).collect();
    let mut error: Option<String> = None;
    let backlog = AtomicU64::new(0);
    let written = thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::channel::<Drained>();
        let (spare_tx, spare_rx) = std::sync::mpsc::channel::<RVec<u8>>();
        let mut spare: Vec<RVec<u8>> = Vec::new();
        // "kml-w-<probe>" beside the drain thread's "kml-<probe>".
        let probe_name = thread::current()
            .name()
            .and_then(|n| n.strip_prefix("kml-"))
            .unwrap_or("probe")
            .to_owned();
        let writer = thread::Builder::new()
            .name(format!("kml-w-{probe_name}"))
            .spawn_scoped(scope, || {
                write_loop(rx, spare_tx, sinks, counters, &backlog, ends)
            });
        let writer = match writer {
            Ok(w) => w,
            Err(e) => return Err(format!("starting its writer thread: {e}")),
        };
        loop {
            let stopping = ends.stop.load(Ordering::Relaxed);
            if stopping {
                let stopped = {
                    let _call = watch.enter(PluginCall::Stop, limit);
                    probe.stop()
                };
                if let RResult::RErr(e) = stopped {
                    error = Some(format!("stopping: {e}"));
                }
            }
            let wait = if stopping {
                0
            } else {
                drain_wait(drain_ms, ends.deadline)
            };
            let drained = {
                let allowed = limit + Duration::from_millis(u64::from(wait));
                let _call = watch.enter(PluginCall::Drain, allowed);
                probe.drain(wait, &mut batches)
            };
            if watch.given_up().is_some() {
                // Given up while the call ran: the files are closed already.
                break;
            }
            spare.extend(spare_rx.try_iter());
            let pass = take_pass(&mut batches, counters, &mut spare);
            // The writer is far behind (a stalled disk): wait for it rather
            // than hold more in memory.
            while backlog.load(Ordering::Relaxed) > WRITE_BACKLOG_BYTES && !writer.is_finished() {
                thread::sleep(Duration::from_millis(1));
            }
            backlog.fetch_add(pass.bytes, Ordering::Relaxed);
            if tx.send(pass).is_err() {
                // The writer ended: the sinks were taken.
                break;
            }
            if let RResult::RErr(e) = drained {
                error.get_or_insert(e.to_string());
            }
            if stopping || error.is_some() || ends.failure.get().is_some() {
                break;
            }
        }
        drop(tx);
        Ok(writer
            .join()
            .unwrap_or_else(|_| Some("its writer thread panicked".into())))
    });
    match written {
        Ok(Some(e)) => {
            error.get_or_insert(e);
        }
        Ok(None) => {}
        Err(e) => {
            error.get_or_insert(e);
        }
    }
    finish_probe(probe, sinks, counters, ends, stats, watched, error)
}

/// Takes this pass's rows out of the probe's batches, giving each a spare
/// buffer in exchange (the largest to the busiest table), and stores each
/// table's lost count; spares beyond one per table are freed.
fn take_pass(
    batches: &mut RVec<Batch>,
    counters: &[Arc<TableCounters>],
    spare: &mut Vec<RVec<u8>>,
) -> Drained {
    let mut pass = Drained {
        tables: Vec::with_capacity(batches.len()),
        bytes: 0,
    };
    // Largest last: the busiest table takes the largest buffer.
    spare.sort_by_key(RVec::capacity);
    for (batch, c) in batches.iter_mut().zip(counters) {
        let data = if batch.data.is_empty() {
            RVec::new()
        } else {
            // A buffer the writer is done with, or one as large as
            // this pass's (the next likely needs as much).
            let next = spare
                .pop()
                .unwrap_or_else(|| RVec::with_capacity(batch.data.len()));
            std::mem::replace(&mut batch.data, next)
        };
        // What it holds in memory until written, not just its rows.
        pass.bytes += data.capacity() as u64;
        pass.tables
            .push((data, batch.records, batch.malformed_total));
        batch.records = 0;
        c.lost.store(batch.lost_total, Ordering::Relaxed);
    }
    // Spares beyond one per table are freed, the smallest first
    // (`spare` is still sorted).
    let extra = spare.len().saturating_sub(batches.len());
    spare.drain(..extra);
    pass
}

/// After the last pass: the programs' statistics, the probe freed, the
/// files closed if the writer did not close them; the first error, or
/// [`GIVEN_UP`] when the watchdog gave the probe up.
fn finish_probe(
    probe: ProbeBox,
    sinks: &SharedSinks,
    counters: &[Arc<TableCounters>],
    ends: DrainEnds<'_>,
    stats: &ProbeStats,
    watched: Watched<'_>,
    mut error: Option<String>,
) -> Result<(), String> {
    let Watched { watch, limit } = watched;
    if watch.given_up().is_some() {
        drop(probe);
        return Err(GIVEN_UP.into());
    }
    let program_stats = {
        let _call = watch.enter(PluginCall::Stats, limit);
        probe.bpf_stats().into_vec()
    };
    if let Ok(mut s) = stats.lock() {
        *s = program_stats;
    }
    {
        let _call = watch.enter(PluginCall::Free, limit);
        drop(probe);
    }
    // The writer closed the files; had it not started, they close here.
    if let Some(left) = lock_sinks(sinks).take() {
        if let Some(e) = finish_sinks(left, counters, ends) {
            error.get_or_insert(e);
        }
    }
    if watch.given_up().is_some() {
        return Err(GIVEN_UP.into());
    }
    error.map_or(Ok(()), Err)
}

/// Closes a probe's files; each table's counter ends as the rows on disk.
/// Returns the first error (a full disk also stops the run).
fn finish_sinks(
    sinks: Vec<IpcSink>,
    counters: &[Arc<TableCounters>],
    ends: DrainEnds<'_>,
) -> Option<String> {
    let mut error = None;
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
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_overdue_only_past_its_allowance_and_only_while_it_runs() {
        let watch = Watch::default();
        assert!(watch.overdue(uptime_us()).is_none(), "no call, nothing due");
        {
            let _call = watch.enter(PluginCall::Drain, Duration::from_millis(50));
            assert!(watch.overdue(uptime_us()).is_none(), "within its allowance");
            let later = uptime_us() + 60_000;
            let (call, running_for) = watch.overdue(later).expect("past its allowance");
            assert_eq!(call, PluginCall::Drain);
            assert!(running_for >= Duration::from_millis(60), "{running_for:?}");
        }
        assert!(
            watch.overdue(uptime_us() + 60_000).is_none(),
            "a call that returned is never overdue"
        );
        let _call = watch.enter(PluginCall::Stop, Duration::from_secs(5));
        let (call, _) = watch
            .overdue(uptime_us() + 6_000_000)
            .expect("the stop is overdue");
        assert_eq!(call.name(), "stop");
        let line = overdue_message(call, Duration::from_millis(5100), Duration::from_secs(5));
        assert_eq!(
            line,
            "hung: its stop call has not returned in 5.1 s (limit collect.plugin_timeout = 5s); \
             the probe was given up and the rest of the run went on without it"
        );
    }

    fn tick_sink(dir: &Path, name: &str, interval: Duration) -> IpcSink {
        let policy = FlushPolicy {
            interval,
            rows: u64::MAX,
        };
        IpcSink::create(
            &dir.join(format!("{name}.arrow")),
            crate::sink::tests::tick_decoder(name),
            policy,
        )
        .expect("sink")
    }

    fn ticks(n: u64) -> RVec<u8> {
        (0..n).flat_map(|v| v.to_le_bytes()).collect()
    }

    /// A busy table sends its writer a pass far more often than the flush
    /// interval; the quiet table's rows still reach the file within about
    /// a flush interval, every buffer comes back for reuse, and the files
    /// close with every row.
    #[test]
    fn the_writer_flushes_a_quiet_table_beside_a_busy_one_and_returns_buffers() {
        let dir = kernmlops_sys::private::TempDir::new("kml-drain-test").expect("temp dir");
        let interval = Duration::from_millis(50);
        let sinks: SharedSinks = Arc::new(Mutex::new(Some(vec![
            tick_sink(dir.path(), "busy", interval),
            tick_sink(dir.path(), "quiet", interval),
        ])));
        let counters: Vec<Arc<TableCounters>> = vec![Arc::default(), Arc::default()];
        let (stop, failure, backlog) = (
            AtomicBool::new(false),
            WriteFailure::default(),
            AtomicU64::new(0),
        );
        let ends = DrainEnds {
            stop: &stop,
            failure: &failure,
            deadline: None,
        };
        let (tx, rx) = std::sync::mpsc::channel::<Drained>();
        let (spare_tx, spare_rx) = std::sync::mpsc::channel::<RVec<u8>>();
        let quiet_written = thread::scope(|scope| {
            let writer =
                scope.spawn(|| write_loop(rx, spare_tx, &sinks, &counters, &backlog, ends));
            let mut quiet = Some(ticks(3));
            let mut quiet_written = None;
            let began = Instant::now();
            // A pass every 2 ms, far more often than the flush interval.
            for _ in 0..150 {
                let tables = vec![
                    (ticks(10), 10, 0),
                    quiet.take().map_or((RVec::new(), 0, 0), |q| (q, 3, 0)),
                ];
                tx.send(Drained { tables, bytes: 0 }).expect("writer alive");
                thread::sleep(Duration::from_millis(2));
                let written = lock_sinks(&sinks).as_ref().expect("sinks")[1].rows_written();
                if written == 3 && quiet_written.is_none() {
                    quiet_written = Some(began.elapsed());
                }
            }
            drop(tx);
            assert_eq!(writer.join().expect("writer"), None, "no write error");
            quiet_written
        });
        let quiet_written = quiet_written.expect("the quiet table's rows reached its file");
        assert!(
            quiet_written < interval * 4,
            "the quiet rows took {quiet_written:?}"
        );
        assert!(lock_sinks(&sinks).is_none(), "the writer closed the files");
        assert_eq!(counters[0].rows.load(Ordering::Relaxed), 1500);
        assert_eq!(counters[1].rows.load(Ordering::Relaxed), 3);
        assert!(
            spare_rx.try_iter().count() >= 150,
            "every non-empty buffer came back"
        );
        for (name, rows) in [("busy", 1500), ("quiet", 3)] {
            let file = std::fs::File::open(dir.join(format!("{name}.arrow"))).expect("file");
            let read: usize = arrow_ipc::reader::FileReader::try_new(file, None)
                .expect("a closed Arrow file")
                .map(|b| b.expect("batch").num_rows())
                .sum();
            assert_eq!(read, rows, "{name}");
        }
    }

    #[test]
    fn the_drain_waits_at_most_until_the_end_of_the_run() {
        assert_eq!(drain_wait(100, None), 100);
        let soon = Instant::now() + Duration::from_millis(20);
        assert!(drain_wait(100, Some(soon)) <= 20);
        assert_eq!(drain_wait(100, Some(Instant::now())), 1, "never zero");
    }
}
