//! The `trace` probe against `perf record -e` on many tracepoints at once,
//! and `tp_btf` pointer chains against the `block_io` table.
//!
//! Thirteen tracepoints across the scheduler, block, memory, writeback,
//! network (loopback) and syscall subsystems are recorded by `trace` (every
//! field of each format) and by `perf record -e` at once while a workload
//! of the test's own runs. perf's raw field values come from a `perf
//! script` Python handler (no print-format rendering), so every field
//! compares as the kernel wrote it. Per tracepoint and CPU, perf's events
//! of the window are found in trace's recording by content (hot events
//! such as page allocations leave no quiet instant to cut both at by
//! time), and from the first to the last they must be the same events,
//! as many, in the same order, with equal values in every field, strings
//! included, and equal pid and tgid. Three things of perf's are allowed
//! for: a sample it delivers twice is dropped; rows its classic
//! tracepoint path is known to miss (switches away from the idle task,
//! wake-ups raised while the idle task runs) may be in trace's alone; and
//! so may a whole run of a task on a CPU of which perf recorded nothing
//! at all (at most a few a recording, else it is made again).

use std::{
    collections::{BTreeMap, HashMap},
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use arrow_array::{cast::AsArray, types::*, Array, RecordBatch};
use kernmlops_e2e::*;

/// The tracepoints compared, by subsystem, each with the fewest events
/// the test's workload makes of it in the window (so no comparison passes
/// on nothing): 5 forks and a thread, 4 fsyncs of 512 KiB each, 64
/// writes of 32 KiB to a file and 50 of 1000 bytes on a loopback TCP
/// connection, with sleeps between.
const EVENTS: &[(&str, usize)] = &[
    ("sched:sched_switch", 50),
    ("sched:sched_wakeup", 20),
    ("sched:sched_process_fork", 6),
    ("block:block_rq_issue", 4),
    ("block:block_rq_complete", 4),
    ("kmem:mm_page_alloc", 500),
    ("filemap:mm_filemap_add_to_page_cache", 16),
    ("writeback:writeback_dirty_folio", 16),
    ("net:net_dev_xmit", 50),
    ("net:netif_receive_skb", 50),
    ("syscalls:sys_enter_write", 114),
    ("syscalls:sys_exit_write", 114),
    ("syscalls:sys_enter_fsync", 4),
];

/// Header columns of every trace table; a tracepoint field of the same
/// name is `<name>_field`.
const HEADER: &[&str] = &["ts_uptime_us", "pid", "tgid", "cpu", "comm"];

/// A `perf script` handler printing each event as one JSON line: its
/// name, CPU, time, pid and tgid, and its raw fields (char arrays cut at
/// their first NUL, as the kernel's print format does).
const PERF_DUMP: &str = r#"
import json, sys
out = open(sys.argv[1], "w")
def trace_unhandled(event_name, context, fields, sample):
    s = sample["sample"]
    row = {"event": event_name, "cpu": s["cpu"], "time": s["time"],
           "pid": s["tid"], "tgid": s["pid"], "fields": {}}
    for k, v in fields.items():
        if k.startswith("common_"):
            continue
        if isinstance(v, (bytes, bytearray)):
            v = v.decode("utf-8", "replace")
        if isinstance(v, str):
            v = v.split("\0", 1)[0]
        row["fields"][k] = v
    out.write(json.dumps(row) + "\n")
def trace_end():
    out.close()
"#;

/// One field value, integers of every width and sign as i128.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Val {
    Int(i128),
    Str(String),
}

/// Every value of a column, integers, booleans and strings alike.
fn values(batches: &[RecordBatch], name: &str) -> Vec<Val> {
    let mut out = Vec::new();
    for b in batches {
        let col = b
            .column_by_name(name)
            .unwrap_or_else(|| panic!("no column {name}"));
        out.extend(column_values(col.as_ref()));
    }
    out
}

fn column_values(col: &dyn Array) -> Vec<Val> {
    macro_rules! try_type {
        ($($t:ty),*) => {
            $(
                if let Some(a) = col.as_primitive_opt::<$t>() {
                    return a.values().iter().map(|v| Val::Int(*v as i128)).collect();
                }
            )*
        };
    }
    try_type!(
        Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type
    );
    if let Some(b) = col.as_boolean_opt() {
        return (0..b.len())
            .map(|i| Val::Int(i128::from(b.value(i))))
            .collect();
    }
    if let Some(s) = col.as_string_opt::<i32>() {
        return (0..s.len())
            .map(|i| Val::Str(s.value(i).to_owned()))
            .collect();
    }
    panic!("unexpected column type {:?}", col.data_type());
}

fn json_val(v: &serde_json::Value) -> Val {
    match v {
        serde_json::Value::String(s) => Val::Str(s.clone()),
        serde_json::Value::Number(n) => Val::Int(
            n.as_i64()
                .map(i128::from)
                .or_else(|| n.as_u64().map(i128::from))
                .unwrap_or_else(|| panic!("{n} is not an integer")),
        ),
        serde_json::Value::Bool(b) => Val::Int(i128::from(*b)),
        other => panic!("unexpected perf value {other}"),
    }
}

/// One event as both tools saw it: time (CLOCK_BOOTTIME, us), CPU, and
/// the compared values by name (pid, tgid and each field).
#[derive(Debug, Clone)]
struct Ev {
    ts_us: f64,
    cpu: i128,
    vals: BTreeMap<String, Val>,
    /// The running task's command name (trace's `comm` column; perf's
    /// rows have none): it changes at an exec.
    comm: Option<Val>,
}

/// The trace table of `event`: its rows with the fields named as the
/// tracepoint names them.
fn trace_rows(dir: &Path, event: &str) -> Vec<Ev> {
    let table = event.split_once(':').expect("sys:event").1;
    let batches = read_table(&dir.join(format!("{table}.arrow")));
    let Some(schema) = batches.first().map(|b| b.schema()) else {
        return Vec::new();
    };
    let ts = values(&batches, "ts_uptime_us");
    let cpu = values(&batches, "cpu");
    let comm = values(&batches, "comm");
    let mut cols: Vec<(String, Vec<Val>)> = Vec::new();
    for f in schema.fields() {
        let name = f.name().as_str();
        if matches!(name, "collection_id" | "ts_uptime_us" | "cpu" | "comm")
            || name.ends_with("_truncated")
        {
            continue;
        }
        let field = name.strip_suffix("_field").unwrap_or(name);
        let key = if HEADER.contains(&field) && field != name {
            format!("field:{field}")
        } else if matches!(name, "pid" | "tgid") {
            format!("header:{name}")
        } else {
            format!("field:{name}")
        };
        cols.push((key, values(&batches, name)));
    }
    // Every string kept whole: a cut one would not compare.
    for f in schema.fields() {
        if f.name().ends_with("_truncated") {
            let cut = values(&batches, f.name());
            assert!(
                cut.iter().all(|v| *v == Val::Int(0)),
                "{event}: {} set",
                f.name()
            );
        }
    }
    (0..ts.len())
        .map(|i| Ev {
            ts_us: match ts[i] {
                Val::Int(v) => v as f64,
                _ => unreachable!(),
            },
            cpu: match cpu[i] {
                Val::Int(v) => v,
                _ => unreachable!(),
            },
            vals: cols
                .iter()
                .map(|(k, v)| (k.clone(), v[i].clone()))
                .collect(),
            comm: Some(comm[i].clone()),
        })
        .collect()
}

/// A tracepoint field's column name, as the trace README states it:
/// snake case, no leading or trailing underscores (`__syscall_nr` is
/// `syscall_nr`).
fn column_name(field: &str) -> String {
    let mut out = String::new();
    for c in field.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('_') {
            out.push('_');
        }
    }
    out.trim_end_matches('_').to_owned()
}

/// perf's events of `event`, its times moved to CLOCK_BOOTTIME.
fn perf_rows(lines: &[serde_json::Value], event: &str, boot_minus_mono_ns: i128) -> Vec<Ev> {
    let name = event.replace(':', "__");
    lines
        .iter()
        .filter(|l| l["event"] == name.as_str())
        .map(|l| {
            let mut vals = BTreeMap::new();
            vals.insert("header:pid".into(), json_val(&l["pid"]));
            vals.insert("header:tgid".into(), json_val(&l["tgid"]));
            for (k, v) in l["fields"].as_object().expect("fields") {
                vals.insert(format!("field:{}", column_name(k)), json_val(v));
            }
            let Val::Int(time) = json_val(&l["time"]) else {
                panic!("time")
            };
            let Val::Int(cpu) = json_val(&l["cpu"]) else {
                panic!("cpu")
            };
            Ev {
                ts_us: (time + boot_minus_mono_ns) as f64 / 1000.0,
                cpu,
                vals,
                comm: None,
            }
        })
        .collect()
}

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(clock, &mut t) };
    i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec)
}

/// CLOCK_BOOTTIME minus CLOCK_MONOTONIC (perf's `-k monotonic`), in ns.
fn boot_minus_mono_ns() -> i128 {
    let m0 = clock_ns(libc::CLOCK_MONOTONIC);
    let b = clock_ns(libc::CLOCK_BOOTTIME);
    let m1 = clock_ns(libc::CLOCK_MONOTONIC);
    b - (m0 + m1) / 2
}

/// Most time between the two tools' timestamps of one event, in us.
const SAME_EVENT_US: f64 = 50_000.0;

/// Events of one CPU, in time order (ties keep the recorded order).
fn of_cpu(evs: &[Ev], cpu: i128) -> Vec<&Ev> {
    let mut v: Vec<&Ev> = evs.iter().filter(|e| e.cpu == cpu).collect();
    v.sort_by(|x, y| x.ts_us.total_cmp(&y.ts_us));
    v
}

/// Whether `row` of trace's is one perf's classic tracepoint path is
/// known to miss on its own, so that it may be absent from perf's
/// recording (never the reverse): switches away from the idle task
/// (README, "Performance": the kernel quirk), and wake-ups raised while
/// the idle task runs (in its interrupts). Every other row, idle context
/// included (a block request completing in an idle CPU's interrupt),
/// must be in both, unless its whole run is one perf was blind to
/// ([`Blind`]).
fn idle_quirk(event: &str, row: &Ev) -> bool {
    let idle = Some(&Val::Int(0));
    match event {
        "sched:sched_switch" => row.vals.get("field:prev_pid") == idle,
        "sched:sched_wakeup" => row.vals.get("header:pid") == idle,
        _ => false,
    }
}

/// Time either side of a run within which perf's rows of its task are
/// looked for, in us (perf stamps an event a few us after trace).
const RUN_SLACK_US: f64 = 20.0;

/// Most runs perf was blind to in a recording that compares; more make
/// the recording again.
const MOST_BLIND_RUNS: usize = 4;

/// A run of one task on one CPU (trace's consecutive rows, all thirteen
/// tracepoints merged, with the same current task and command name) of
/// which perf recorded nothing at all. perf's CPU-wide events are, now
/// and then, delivered nothing while one task runs: seen here for the
/// just-forked children of a process-spawning daemon, from their first
/// switch-in until their exec (page allocations, writes, wake-ups, the
/// switch away: none in perf's ring buffer, none lost, while BPF on the
/// same tracepoints saw them, and perf saw the same task's events again
/// right after the exec). Such a run's rows may be in trace's alone; a
/// run perf saw a part of must be whole in both.
#[derive(Debug)]
struct Blind {
    cpu: i128,
    pid: Val,
    comm: Option<Val>,
    from: f64,
    to: f64,
}

impl Blind {
    fn covers(&self, row: &Ev) -> bool {
        row.cpu == self.cpu
            && row.ts_us >= self.from
            && row.ts_us <= self.to
            && row.vals.get("header:pid") == Some(&self.pid)
            && row.comm == self.comm
    }
}

/// The runs perf was blind to ([`Blind`]), from every tracepoint's rows
/// of both tools.
fn blind_runs(ours: &[Vec<Ev>], theirs: &[Vec<Ev>]) -> Vec<Blind> {
    let pid = |e: &Ev| e.vals.get("header:pid").cloned();
    let mut o: Vec<&Ev> = ours.iter().flatten().collect();
    let mut t: Vec<&Ev> = theirs.iter().flatten().collect();
    let order = |a: &&Ev, b: &&Ev| a.cpu.cmp(&b.cpu).then(a.ts_us.total_cmp(&b.ts_us));
    o.sort_by(order);
    t.sort_by(order);
    // perf's pid of a task that has left its pid namespace.
    let gone = Some(Val::Int(i128::from(u32::MAX)));
    let mut blind = Vec::new();
    for run in o.chunk_by(|a, b| a.cpu == b.cpu && pid(a) == pid(b) && a.comm == b.comm) {
        let (first, last) = (run[0], run[run.len() - 1]);
        let (cpu, from, to) = (first.cpu, first.ts_us, last.ts_us);
        let Some(task) = pid(first) else { continue };
        let start = t.partition_point(|e| (e.cpu, e.ts_us) < (cpu, from - RUN_SLACK_US));
        let seen = t[start..]
            .iter()
            .take_while(|e| e.cpu == cpu && e.ts_us <= to + RUN_SLACK_US)
            .any(|e| pid(e) == Some(task.clone()) || pid(e) == gone);
        if !seen {
            blind.push(Blind {
                cpu,
                pid: task,
                comm: first.comm.clone(),
                from,
                to,
            });
        }
    }
    blind
}

/// Why perf may lack a row of trace's, if it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Missable {
    No,
    IdleQuirk,
    /// In this run of [`blind_runs`].
    BlindRun(usize),
}

/// One CPU's events of one tracepoint, as both tools recorded them.
struct Streams<'a> {
    event: &'a str,
    cpu: i128,
    /// trace's, the whole recording (it starts before perf and stops
    /// after it).
    ours: Vec<&'a Ev>,
    /// perf's inside the compared window, by perf's clock.
    theirs: Vec<&'a Ev>,
    tgids: &'a HashMap<i128, i128>,
    blind: &'a [Blind],
}

/// How two streams aligned: perf's rows matched, and trace's rows
/// between the first and last match that perf may miss and did, by why.
#[derive(Debug, Default, Clone)]
struct Aligned {
    matched: usize,
    idle_quirk: usize,
    blind_run: usize,
    /// The runs of [`blind_runs`] rows were missing in.
    blind_used: std::collections::BTreeSet<usize>,
    /// trace's rows matched to perf's first and last.
    first: usize,
    last: usize,
}

/// Where a walk stopped: the rows of trace's and perf's that differ.
#[derive(Debug)]
struct Stop {
    ours_at: usize,
    theirs_at: usize,
}

impl Streams<'_> {
    fn missable(&self, row: &Ev) -> Missable {
        if idle_quirk(self.event, row) {
            Missable::IdleQuirk
        } else if let Some(i) = self.blind.iter().position(|b| b.covers(row)) {
            Missable::BlindRun(i)
        } else {
            Missable::No
        }
    }

    /// The same event with the same values: pid, tgid, every field.
    fn same(&self, ours: &Ev, theirs: &Ev) -> bool {
        ours.vals == perf_pid_of_dead_task(self.event, ours, theirs, self.tgids).vals
    }

    /// perf's rows matched in order from trace's row `from`, skipping only
    /// rows of trace's that perf may miss; a match is also close in time.
    fn walk(&self, from: usize) -> Result<Aligned, Stop> {
        let mut a = Aligned {
            first: from,
            last: from,
            ..Aligned::default()
        };
        let (mut i, mut j) = (from, 0);
        while j < self.theirs.len() {
            let Some(o) = self.ours.get(i) else {
                return Err(Stop {
                    ours_at: i,
                    theirs_at: j,
                });
            };
            let p = self.theirs[j];
            if self.same(o, p) && (o.ts_us - p.ts_us).abs() < SAME_EVENT_US {
                a.matched += 1;
                a.last = i;
                j += 1;
            } else {
                match self.missable(o) {
                    Missable::IdleQuirk => a.idle_quirk += 1,
                    Missable::BlindRun(run) => {
                        a.blind_run += 1;
                        a.blind_used.insert(run);
                    }
                    Missable::No => {
                        return Err(Stop {
                            ours_at: i,
                            theirs_at: j,
                        })
                    }
                }
            }
            i += 1;
        }
        Ok(a)
    }

    /// perf's window found in trace's recording by content, not by time:
    /// its first row is anchored on each row of trace's with the same
    /// values near its time, and from there every row of perf's must
    /// follow in trace's, in order, equal in every field, with nothing
    /// between them but rows perf may miss. The longest walk is reported
    /// when none reaches perf's last row.
    fn align(&self) -> Aligned {
        let Some(p0) = self.theirs.first() else {
            return Aligned::default();
        };
        let mut best: Option<Stop> = None;
        for (i, o) in self.ours.iter().enumerate() {
            if (o.ts_us - p0.ts_us).abs() >= SAME_EVENT_US || !self.same(o, p0) {
                continue;
            }
            match self.walk(i) {
                Ok(a) => return a,
                Err(stop) => {
                    if best.as_ref().is_none_or(|b| stop.theirs_at > b.theirs_at) {
                        best = Some(stop);
                    }
                }
            }
        }
        let (event, cpu) = (self.event, self.cpu);
        let Some(stop) = best else {
            panic!(
                "{event} on CPU {cpu}: perf's first row in the window is not in trace's:\n{}",
                show(&self.theirs, 0)
            );
        };
        panic!(
            "{event} on CPU {cpu}: perf's row {} of {} differs from trace's (or trace has a row perf lacks):\ntrace {}\nperf {}",
            stop.theirs_at,
            self.theirs.len(),
            show(&self.ours, stop.ours_at),
            show(&self.theirs, stop.theirs_at)
        );
    }
}

/// Rows around `at`, for a failure message.
fn show(rows: &[&Ev], at: usize) -> String {
    let lines: Vec<String> = rows
        .iter()
        .enumerate()
        .skip(at.saturating_sub(2))
        .take(5)
        .map(|(i, e)| {
            let mark = if i == at { ">" } else { " " };
            format!("{mark} {:.1} {:?}", e.ts_us, e.vals)
        })
        .collect();
    format!("[\n{}\n]", lines.join("\n"))
}

/// The workload: forks, buffered writes and fsync on the test's disk, and
/// a TCP conversation on loopback, with sleeps between so the scheduler
/// switches.
fn workload(dir: &Path) {
    for _ in 0..5 {
        let ok = Command::new("true").status().expect("running true");
        assert!(ok.success());
    }
    let mut f = std::fs::File::create(dir.join("written")).expect("creating a file");
    for i in 0..64u8 {
        f.write_all(&[i; 32 * 1024]).expect("writing");
        if i % 16 == 15 {
            f.sync_all().expect("fsync");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    drop(f);
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding on loopback");
    let addr = listener.local_addr().expect("address");
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut buf = [0u8; 4096];
        let mut total = 0;
        loop {
            let n = s.read(&mut buf).expect("read");
            if n == 0 {
                break total;
            }
            total += n;
        }
    });
    let mut c = TcpStream::connect(addr).expect("connecting on loopback");
    c.set_nodelay(true).expect("nodelay");
    for i in 0..50u8 {
        c.write_all(&[i; 1000]).expect("sending");
        std::thread::sleep(Duration::from_millis(2));
    }
    drop(c);
    assert_eq!(server.join().expect("server"), 50_000);
}

/// perf gives a task that has already left its pid namespace (an exiting
/// thread's last switches) the pid and tgid -1, where `trace` keeps the
/// kernel's own: such a switch compares on the thread the tracepoint names
/// (`prev_pid`) and on the tgid perf gave that thread in its other events
/// (`tgids`; a thread perf never saw alive has nothing to compare with).
fn perf_pid_of_dead_task(event: &str, ours: &Ev, perf: &Ev, tgids: &HashMap<i128, i128>) -> Ev {
    let none = Val::Int(i128::from(u32::MAX));
    let mut perf = perf.clone();
    if perf.vals.get("header:pid") == Some(&none) {
        // A switch names its thread; elsewhere (an exiting thread's last
        // wake-ups) perf has nothing to compare with.
        let pid = match perf.vals.get("field:prev_pid") {
            Some(prev) if event == "sched:sched_switch" => prev.clone(),
            _ => ours.vals["header:pid"].clone(),
        };
        perf.vals.insert("header:pid".into(), pid);
    }
    if perf.vals.get("header:tgid") == Some(&none) {
        let Val::Int(pid) = perf.vals["header:pid"] else {
            panic!("pid")
        };
        let tgid = tgids
            .get(&pid)
            .map(|t| Val::Int(*t))
            .unwrap_or_else(|| ours.vals["header:tgid"].clone());
        perf.vals.insert("header:tgid".into(), tgid);
    }
    perf
}

/// Recordings made before one where neither tool lost an event is given
/// up on.
const ATTEMPTS: usize = 3;

/// Every tracepoint compared, event for event, per CPU, between `trace`
/// and `perf record`. A recording where either tool lost events (perf's
/// `LOST` counts, the tables' `lost_events`), or where perf recorded
/// nothing of more than [`MOST_BLIND_RUNS`] task runs, cannot compare and
/// is made again, up to [`ATTEMPTS`] times; in a complete one, any
/// difference fails the test.
#[test]
fn root_trace_thirteen_tracepoints_agree_with_perf_record() {
    const NAME: &str = "root_trace_thirteen_tracepoints_agree_with_perf_record";
    if !require_root(NAME) || !require_tool(NAME, "perf") || !require_tool(NAME, "python3") {
        return;
    }
    let _serial = serial();
    let mut incomplete = Vec::new();
    for attempt in 0..ATTEMPTS {
        match compare_once(attempt) {
            Ok(report) => {
                eprintln!("events compared: {report}");
                return;
            }
            Err(why) => {
                eprintln!("recording {attempt} incomplete: {why}");
                incomplete.push(why);
            }
        }
    }
    panic!("no complete recording in {ATTEMPTS}: {incomplete:?}");
}

/// The sum of the `LOST` counts `perf report --stats` shows.
fn perf_lost(perf_data: &Path) -> u64 {
    let out = Command::new("perf")
        .args(["report", "--stats", "-i"])
        .arg(perf_data)
        .output()
        .expect("perf report --stats");
    text(&out.stdout)
        .lines()
        .filter(|l| l.contains("LOST"))
        .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
        .sum()
}

/// One recording by both tools of the same workload.
struct Recording {
    /// trace's collection folder.
    dir: std::path::PathBuf,
    /// perf's events, one JSON object each, copies dropped.
    lines: Vec<serde_json::Value>,
    /// perf's samples delivered twice.
    doubled: usize,
    /// The compared window (CLOCK_BOOTTIME, us): both tools record
    /// throughout it, and the workload runs inside it.
    t0: f64,
    t1: f64,
}

/// Records the workload with `trace` and `perf record` at once; a
/// recording where either tool lost events is an `Err`.
fn record(work: &Path, attempt: usize) -> Result<Recording, String> {
    let cfg = work.join("kernmlops.toml");
    let list: Vec<String> = EVENTS
        .iter()
        .map(|(e, _)| format!("  \"{e}\",\n"))
        .collect();
    std::fs::write(
        &cfg,
        format!(
            "[probes.trace]\nevents = [\n{}]\nstring_bytes = 256\n",
            list.concat()
        ),
    )
    .expect("writing the config");
    let plugins = plugin_dir(&format!("trace-perf-many-{attempt}"), &[("trace", "trace")]);
    let out = work.join("data");
    // The collector's own events are kept, as perf keeps them.
    let c = Collector::start(&[
        "--config",
        cfg.to_str().expect("utf8"),
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "trace",
        "--include-self",
        "--output",
        out.to_str().expect("utf8"),
    ]);
    let perf_data = work.join("perf.data");
    let (ctl, ack) = (work.join("perf-ctl"), work.join("perf-ack"));
    for fifo in [&ctl, &ack] {
        let c = std::ffi::CString::new(fifo.to_str().expect("utf8")).expect("a path");
        // SAFETY: mkfifo reads the NUL-terminated path we own.
        let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(r, 0, "mkfifo {}", fifo.display());
    }
    // perf starts with its events off and turns them on when told to, so
    // the window starts when both record (its start-up, reading every
    // process on a busy machine, can take seconds).
    let mut args: Vec<&str> = vec!["record", "-q", "-a", "-k", "monotonic", "-m", "4096"];
    for (e, _) in EVENTS {
        args.extend(["-e", e]);
    }
    let perf = Command::new("perf")
        .args(&args)
        .args(["-D", "-1", "--control"])
        .arg(format!("fifo:{},{}", ctl.display(), ack.display()))
        .arg("-o")
        .arg(&perf_data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("perf record");
    let mut perf = KillOnDrop(perf);
    perf_enable(&mut perf, &ctl, &ack);
    std::thread::sleep(Duration::from_millis(100));
    let t0 = uptime_us() as f64;
    std::thread::sleep(Duration::from_millis(100));
    workload(work);
    std::thread::sleep(Duration::from_millis(100));
    let t1 = uptime_us() as f64;
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling a child we spawned.
    unsafe { libc::kill(perf.id() as i32, libc::SIGINT) };
    let _ = perf.0.wait().expect("waiting for perf");
    let done = c.signal_and_wait(libc::SIGINT);
    assert!(done.status.success(), "{}", done.stderr);
    let dir = done.dir.expect("collection");
    let lost = perf_lost(&perf_data);
    if lost > 0 {
        return Err(format!("perf lost {lost} events"));
    }
    let m = manifest(&dir);
    for (event, _) in EVENTS {
        let table = event.split_once(':').expect("sys:event").1;
        let lost = m["tables"][table]["lost_events"]
            .as_u64()
            .unwrap_or_else(|| panic!("{table}: no lost_events in the manifest"));
        if lost > 0 {
            return Err(format!("trace lost {lost} {table} events"));
        }
    }
    let (lines, doubled) = perf_script(work, &perf_data);
    Ok(Recording {
        dir,
        lines,
        doubled,
        t0,
        t1,
    })
}

/// Tells `perf record --control fifo:CTL,ACK` to turn its events on, and
/// waits for its acknowledgement: then it records on every CPU.
fn perf_enable(perf: &mut KillOnDrop, ctl: &Path, ack: &Path) {
    // Both FIFOs opened for reading and writing: no open waits for perf's.
    let fifo = |p: &Path| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .unwrap_or_else(|e| panic!("opening {}: {e}", p.display()))
    };
    let (mut ctl, mut ack) = (fifo(ctl), fifo(ack));
    ctl.write_all(b"enable\n")
        .expect("writing to perf's control FIFO");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4];
        let _ = tx.send(ack.read_exact(&mut buf).map(|()| buf));
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(Ok(buf)) => {
                assert_eq!(&buf, b"ack\n", "perf's acknowledgement");
                return;
            }
            Ok(Err(e)) => panic!("reading perf's acknowledgement: {e}"),
            Err(_) => {
                if let Ok(Some(status)) = perf.0.try_wait() {
                    panic!("perf record exited before recording ({status})");
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "perf record did not turn its events on in 120 s"
                );
            }
        }
    }
}

/// perf's events as JSON objects through the [`PERF_DUMP`] handler, and
/// how many samples it delivered twice.
fn perf_script(work: &Path, perf_data: &Path) -> (Vec<serde_json::Value>, usize) {
    let script = work.join("dump.py");
    std::fs::write(&script, PERF_DUMP).expect("writing the perf script handler");
    let dump = work.join("perf.jsonl");
    let out = Command::new("perf")
        .args(["script", "-i"])
        .arg(perf_data)
        .arg("-s")
        .arg(&script)
        .arg(&dump)
        .output()
        .expect("perf script");
    assert!(out.status.success(), "perf script: {}", text(&out.stderr));
    let dumped = std::fs::read_to_string(&dump).expect("reading perf's events");
    // perf sometimes delivers a sample twice: the same event, CPU, time to
    // the nanosecond, thread and fields, which two events of the kernel
    // never share (each reads the clock anew). The copy is dropped; were
    // two real events ever merged so, trace would have one more and the
    // test fail, never pass wrongly.
    let mut seen = std::collections::HashSet::new();
    let unique: Vec<&str> = dumped.lines().filter(|l| seen.insert(*l)).collect();
    let doubled = dumped.lines().count() - unique.len();
    let lines = unique
        .iter()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    (lines, doubled)
}

fn compare_once(attempt: usize) -> Result<String, String> {
    let work = temp_dir(&format!("trace-perf-many-{attempt}"));
    let rec = record(&work, attempt)?;
    let offset = boot_minus_mono_ns();
    let none = i128::from(u32::MAX);
    let tgids: HashMap<i128, i128> = rec
        .lines
        .iter()
        .filter_map(|l| match (json_val(&l["pid"]), json_val(&l["tgid"])) {
            (Val::Int(p), Val::Int(t)) if t != none && p != none => Some((p, t)),
            _ => None,
        })
        .collect();
    let ours: Vec<Vec<Ev>> = EVENTS
        .iter()
        .map(|(event, _)| trace_rows(&rec.dir, event))
        .collect();
    let theirs: Vec<Vec<Ev>> = EVENTS
        .iter()
        .map(|(event, _)| perf_rows(&rec.lines, event, offset))
        .collect();
    let blind = blind_runs(&ours, &theirs);
    let mut used = std::collections::BTreeSet::new();
    let report: Vec<String> = EVENTS
        .iter()
        .zip(ours.iter().zip(&theirs))
        .map(|(&(event, least), (o, t))| {
            let ctx = (&tgids, blind.as_slice());
            let (line, runs) = compare_event(event, least, &rec, (o, t), ctx);
            used.extend(runs);
            line
        })
        .collect();
    let used: Vec<&Blind> = used.into_iter().map(|i| &blind[i]).collect();
    if used.len() > MOST_BLIND_RUNS {
        return Err(format!(
            "perf recorded nothing of {} task runs that trace has rows of (at most {MOST_BLIND_RUNS}): {used:?}",
            used.len()
        ));
    }
    Ok(format!(
        "{} (perf samples delivered twice, dropped: {}; task runs perf recorded nothing of: {used:?})",
        report.join(", "),
        rec.doubled
    ))
}

/// One tracepoint compared on every CPU: perf's events of the window
/// aligned in trace's (see [`Streams::align`]), and every row of trace's
/// well inside the window (farther than [`SAME_EVENT_US`] from its
/// edges, where perf's cut by its own clock may differ) within the
/// aligned part or one perf may miss. At least `least` rows must
/// compare.
fn compare_event(
    event: &str,
    least: usize,
    rec: &Recording,
    (ours, theirs): (&[Ev], &[Ev]),
    (tgids, blind): (&HashMap<i128, i128>, &[Blind]),
) -> (String, std::collections::BTreeSet<usize>) {
    let cpus: std::collections::BTreeSet<i128> = ours.iter().chain(theirs).map(|e| e.cpu).collect();
    let (mut matched, mut quirk, mut blind_run) = (0, 0, 0);
    let mut used = std::collections::BTreeSet::new();
    for cpu in cpus {
        let s = Streams {
            event,
            cpu,
            ours: of_cpu(ours, cpu),
            theirs: of_cpu(theirs, cpu)
                .into_iter()
                .filter(|e| e.ts_us >= rec.t0 && e.ts_us <= rec.t1)
                .collect(),
            tgids,
            blind,
        };
        let a = s.align();
        let (inner0, inner1) = (rec.t0 + SAME_EVENT_US, rec.t1 - SAME_EVENT_US);
        let outside = s.ours.iter().enumerate().find(|&(i, e)| {
            let aligned = a.matched > 0 && i >= a.first && i <= a.last;
            e.ts_us > inner0 && e.ts_us < inner1 && !aligned && s.missable(e) == Missable::No
        });
        if let Some((i, _)) = outside {
            panic!(
                "{event} on CPU {cpu}: trace's row is inside the window ({:.1}..{:.1} us) but not in perf's ({} rows aligned{}):\n{}",
                rec.t0,
                rec.t1,
                a.matched,
                match (s.ours.get(a.first), s.ours.get(a.last)) {
                    (Some(f), Some(l)) if a.matched > 0 => format!(", {:.1}..{:.1} us", f.ts_us, l.ts_us),
                    _ => String::new(),
                },
                show(&s.ours, i)
            );
        }
        matched += a.matched;
        quirk += a.idle_quirk;
        blind_run += a.blind_run;
        used.extend(a.blind_used);
    }
    assert!(
        matched >= least,
        "{event}: {matched} events compared, fewer than the workload makes ({least})"
    );
    let table = event.split_once(':').expect("sys:event").1;
    let line = match (quirk, blind_run) {
        (0, 0) => format!("{table} {matched}"),
        _ => format!("{table} {matched} (+{quirk} idle quirk, +{blind_run} in blind runs)"),
    };
    (line, used)
}

/// Puts a scheduler on a block device's queue for the test, and the old
/// one back on drop.
struct Scheduler {
    file: std::path::PathBuf,
    old: String,
}

impl Scheduler {
    fn set(disk: &str, name: &str) -> Self {
        let file = std::path::PathBuf::from(format!("/sys/block/{disk}/queue/scheduler"));
        let text = std::fs::read_to_string(&file).expect("reading the queue's scheduler");
        let old = text
            .split_whitespace()
            .find_map(|s| s.strip_prefix('[')?.strip_suffix(']'))
            .expect("a scheduler in use")
            .to_owned();
        std::fs::write(&file, name).expect("setting the queue's scheduler");
        let now = std::fs::read_to_string(&file).expect("reading the queue's scheduler");
        assert!(now.contains(&format!("[{name}]")), "{now}");
        Self { file, old }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.file, &self.old);
    }
}

/// A column of integers (any width) as u64.
fn u64s(batches: &[RecordBatch], name: &str) -> Vec<u64> {
    values(batches, name)
        .into_iter()
        .map(|v| match v {
            Val::Int(i) => i as u64,
            Val::Str(s) => panic!("{name}: {s:?} is not an integer"),
        })
        .collect()
}

/// `tp_btf:block_rq_insert` with pointer chains (`rq->__sector`,
/// `rq->__data_len`, `rq->cmd_flags`, and `rq->part->bd_dev` to tell the
/// disk) under fio's direct random reads and writes on a loop device of
/// the test's own, with `block_io` in the same run.
///
/// "Agree" means: the loop device's queue has a scheduler (mq-deadline),
/// so every request passes `block_rq_insert` before it is issued; fio runs
/// one job of synchronous I/O, so at most one request is queued at a time
/// and none can merge, which the device's merge counters in
/// /proc/diskstats confirm (unchanged over the run). Then each request is
/// issued exactly as it was inserted, and the multiset of (sector, bytes,
/// cmd_flags) of the device's `block_rq_insert` rows equals that of its
/// `block_io` rows (`sector`, `bytes`, `flags`), which count as many
/// requests as the kernel's own counters.
#[test]
fn root_trace_block_rq_insert_agrees_with_block_io() {
    const NAME: &str = "root_trace_block_rq_insert_agrees_with_block_io";
    if !require_root(NAME) || !require_tool(NAME, "fio") || !require_tool(NAME, "losetup") {
        return;
    }
    let _serial = serial();
    let work = temp_dir("trace-rq-insert");
    let backing = work.join("disk.img");
    std::fs::File::create(&backing)
        .and_then(|f| f.set_len(32 << 20))
        .expect("creating the loop device's file");
    let dev = LoopDevice::attach(&backing);
    let _sched = Scheduler::set(&dev.name(), "mq-deadline");
    let (major, minor) = dev.major_minor();
    // Whatever probes a new disk (udev, blkid) is done before the window.
    std::thread::sleep(Duration::from_millis(500));

    let cfg = work.join("kernmlops.toml");
    std::fs::write(
        &cfg,
        "[probes.trace]\nevents = [\"tp_btf:block_rq_insert(rq->__sector, rq->__data_len, rq->cmd_flags, rq->part->bd_dev)\"]\n",
    )
    .expect("writing the config");
    let plugins = plugin_dir(
        "trace-rq-insert",
        &[("trace", "trace"), ("block_io", "block_io")],
    );
    let out = work.join("data");
    let c = Collector::start(&[
        "--config",
        cfg.to_str().expect("utf8"),
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "trace,block_io",
        "--output",
        out.to_str().expect("utf8"),
    ]);
    let before = dev.diskstats();
    let fio = Command::new("fio")
        .args([
            "--name=kml_trace_rq_insert",
            "--direct=1",
            "--rw=randrw",
            "--bs=4k",
            "--size=8m",
            "--ioengine=psync",
            "--numjobs=1",
            "--thread",
            "--output-format=json",
        ])
        .arg(format!("--filename={}", dev.path.display()))
        .output()
        .expect("running fio");
    assert!(fio.status.success(), "fio: {}", text(&fio.stderr));
    std::thread::sleep(Duration::from_millis(200));
    let after = dev.diskstats();
    let done = c.signal_and_wait(libc::SIGINT);
    assert!(done.status.success(), "{}", done.stderr);
    let dir = done.dir.expect("collection");

    let (reads, read_merges, writes, write_merges) = (
        after[0] - before[0],
        after[1] - before[1],
        after[4] - before[4],
        after[5] - before[5],
    );
    assert_eq!((read_merges, write_merges), (0, 0), "merges on the device");
    assert!(reads + writes >= 2048, "fio's 8 MiB in 4 KiB requests");

    let ins = read_table(&dir.join("block_rq_insert.arrow"));
    let kdev = (major << 20) | minor;
    let dev_col = u64s(&ins, "rq_part_bd_dev");
    let (sector, len) = (u64s(&ins, "rq_sector"), u64s(&ins, "rq_data_len"));
    let flags = u64s(&ins, "rq_cmd_flags");
    let mut inserted: Vec<(u64, u64, u64)> = (0..dev_col.len())
        .filter(|&i| dev_col[i] == kdev)
        .map(|i| (sector[i], len[i], flags[i]))
        .collect();
    let io = read_table(&dir.join("block_io.arrow"));
    let (maj, min) = (
        column_u64(&io, "device_major"),
        column_u64(&io, "device_minor"),
    );
    let (io_sector, io_bytes) = (column_u64(&io, "sector"), column_u64(&io, "bytes"));
    let io_flags = column_u64(&io, "flags");
    let mut issued: Vec<(u64, u64, u64)> = (0..maj.len())
        .filter(|&i| (maj[i], min[i]) == (major, minor))
        .map(|i| (io_sector[i], io_bytes[i], io_flags[i]))
        .collect();
    assert_eq!(
        issued.len() as u64,
        reads + writes,
        "block_io rows of the device vs the kernel's counters"
    );
    assert!(
        inserted.iter().all(|&(_, l, _)| l == 4096),
        "fio's requests are 4 KiB"
    );
    inserted.sort_unstable();
    issued.sort_unstable();
    assert_eq!(
        inserted.len(),
        issued.len(),
        "inserted vs completed requests"
    );
    assert_eq!(
        inserted, issued,
        "(sector, bytes, cmd_flags) of inserted and completed requests"
    );
    let m = manifest(&dir);
    for t in ["block_rq_insert", "block_io"] {
        assert_eq!(
            m["tables"][t]["lost_events"].as_u64(),
            Some(0),
            "{t} lost events"
        );
    }
}
