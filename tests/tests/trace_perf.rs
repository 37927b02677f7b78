//! The `trace` probe against `perf record -e` on many tracepoints at once,
//! and `tp_btf` pointer chains against the `block_io` table.
//!
//! Thirteen tracepoints across the scheduler, block, memory, writeback,
//! network (loopback) and syscall subsystems are recorded by `trace` (every
//! field of each format) and by `perf record -e` over the same window while
//! a workload of the test's own runs. perf's raw field values come from a
//! `perf script` Python handler (no print-format rendering), so every field
//! compares as the kernel wrote it: per event and CPU, the same number of
//! events, in the same order, with equal values in every field, strings
//! included, and equal pid, tgid and CPU. Two things of perf's are allowed
//! for: a sample it delivers twice is dropped, and switches away from the
//! idle task, some of which its classic tracepoint path misses on this
//! kernel (README, "Performance"), need only all be in trace's.

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use arrow_array::{cast::AsArray, types::*, Array, RecordBatch};
use kernmlops_e2e::*;

/// The tracepoints compared, by subsystem.
const EVENTS: &[&str] = &[
    "sched:sched_switch",
    "sched:sched_wakeup",
    "sched:sched_process_fork",
    "block:block_rq_issue",
    "block:block_rq_complete",
    "kmem:mm_page_alloc",
    "filemap:mm_filemap_add_to_page_cache",
    "writeback:writeback_dirty_folio",
    "net:net_dev_xmit",
    "net:netif_receive_skb",
    "syscalls:sys_enter_write",
    "syscalls:sys_exit_write",
    "syscalls:sys_enter_fsync",
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

/// Gap around each window edge, in us: both tools timestamp the same
/// event within a few microseconds of each other, so an edge with no
/// event this close cuts no event differently for the two.
const EDGE_GAP_US: f64 = 200.0;

/// Most time between the two tools' timestamps of one event, in us.
const SAME_EVENT_US: f64 = 50_000.0;

/// `[a, b]` moved inwards until no event of `evs` lies within
/// [`EDGE_GAP_US`] of either edge.
fn quiet_window(evs: &[Ev], mut a: f64, mut b: f64) -> (f64, f64) {
    let mut ts: Vec<f64> = evs.iter().map(|e| e.ts_us).collect();
    ts.sort_by(f64::total_cmp);
    for t in &ts {
        if (t - a).abs() < EDGE_GAP_US {
            a = t + EDGE_GAP_US;
        }
    }
    for t in ts.iter().rev() {
        if (t - b).abs() < EDGE_GAP_US {
            b = t - EDGE_GAP_US;
        }
    }
    (a, b)
}

/// Events of one CPU inside `[a, b]`, in time order (ties keep the
/// recorded order).
fn of_cpu(evs: &[Ev], cpu: i128, a: f64, b: f64) -> Vec<&Ev> {
    let mut v: Vec<&Ev> = evs
        .iter()
        .filter(|e| e.cpu == cpu && e.ts_us >= a && e.ts_us <= b)
        .collect();
    v.sort_by(|x, y| x.ts_us.total_cmp(&y.ts_us));
    v
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
fn perf_pid_of_dead_task(
    event: &str,
    ours: &Ev,
    perf: &Ev,
    tgids: &std::collections::HashMap<i128, i128>,
) -> Ev {
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
/// `LOST` counts, the tables' `lost_events`) cannot compare and is made
/// again, up to [`ATTEMPTS`] times; in a complete one, any difference
/// fails the test.
#[test]
#[ignore = "not yet reliable: kmem:mm_page_alloc leaves no quiet window edge on a busy machine, and perf misses sched_wakeup raised in the idle task's interrupts, which trace records"]
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

fn compare_once(attempt: usize) -> Result<String, String> {
    let work = temp_dir(&format!("trace-perf-many-{attempt}"));
    let cfg = work.join("kernmlops.toml");
    let list: Vec<String> = EVENTS.iter().map(|e| format!("  \"{e}\",\n")).collect();
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
    let mut args: Vec<&str> = vec!["record", "-q", "-a", "-k", "monotonic", "-m", "4096"];
    for e in EVENTS {
        args.extend(["-e", e]);
    }
    let perf = Command::new("perf")
        .args(&args)
        .arg("-o")
        .arg(&perf_data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("perf record");
    let mut perf = KillOnDrop(perf);
    std::thread::sleep(Duration::from_millis(1000));
    let t0 = uptime_us() as f64;
    std::thread::sleep(Duration::from_millis(100));
    workload(&work);
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
    for event in EVENTS {
        let table = event.split_once(':').expect("sys:event").1;
        let lost = m["tables"][table]["lost_events"]
            .as_u64()
            .unwrap_or_else(|| panic!("{table}: no lost_events in the manifest"));
        if lost > 0 {
            return Err(format!("trace lost {lost} {table} events"));
        }
    }

    let script = work.join("dump.py");
    std::fs::write(&script, PERF_DUMP).expect("writing the perf script handler");
    let dump = work.join("perf.jsonl");
    let out = Command::new("perf")
        .args(["script", "-i"])
        .arg(&perf_data)
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
    let lines: Vec<serde_json::Value> = unique
        .iter()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let offset = boot_minus_mono_ns();
    let tgids: std::collections::HashMap<i128, i128> = lines
        .iter()
        .filter_map(|l| match (json_val(&l["pid"]), json_val(&l["tgid"])) {
            (Val::Int(p), Val::Int(t))
                if t != i128::from(u32::MAX) && p != i128::from(u32::MAX) =>
            {
                Some((p, t))
            }
            _ => None,
        })
        .collect();

    let mut report = Vec::new();
    for event in EVENTS {
        let table = event.split_once(':').expect("sys:event").1;
        let ours = trace_rows(&dir, event);
        let theirs = perf_rows(&lines, event, offset);
        let (a, b) = quiet_window(&ours, t0, t1);
        if b - a <= 0.5 * (t1 - t0) {
            // Events so dense at the edges (a busy machine) that no cut
            // is clean: a recording that cannot compare, made again.
            return Err(format!(
                "{event}: no quiet edges in the window ({a}..{b} of {t0}..{t1})"
            ));
        }
        let mut compared = 0;
        let cpus: std::collections::BTreeSet<i128> = ours
            .iter()
            .chain(&theirs)
            .filter(|e| e.ts_us >= a && e.ts_us <= b)
            .map(|e| e.cpu)
            .collect();
        for cpu in cpus {
            let mut o = of_cpu(&ours, cpu, a, b);
            let mut t = of_cpu(&theirs, cpu, a, b);
            if *event == "sched:sched_switch" {
                // perf's classic tracepoint path misses some switches away
                // from the idle task (README, "Performance": the kernel
                // quirk), which BPF sees: those compare as a subset, every
                // one perf saw is in trace's, and the rest event for event.
                let idle = |e: &&Ev| e.vals.get("field:prev_pid") == Some(&Val::Int(0));
                let mut ours_idle: Vec<_> = o.iter().filter(|e| idle(e)).map(|e| &e.vals).collect();
                for p in t.iter().filter(|e| idle(e)) {
                    let at = ours_idle
                        .iter()
                        .position(|v| **v == p.vals)
                        .unwrap_or_else(|| {
                            panic!("{event} on CPU {cpu}: perf's {p:?} is not in trace's")
                        });
                    ours_idle.remove(at);
                }
                o.retain(|e| !idle(e));
                t.retain(|e| !idle(e));
            }
            if o.len() != t.len() {
                let first = o
                    .iter()
                    .zip(&t)
                    .position(|(x, y)| x.vals != perf_pid_of_dead_task(event, x, y, &tgids).vals)
                    .unwrap_or(o.len().min(t.len()));
                let near = |v: &[&Ev]| -> Vec<String> {
                    v.iter()
                        .skip(first.saturating_sub(1))
                        .take(4)
                        .map(|e| format!("{:.1} {:?}", e.ts_us, e.vals))
                        .collect()
                };
                panic!(
                    "{event} on CPU {cpu}: trace {} events, perf {}; first difference at {first}:\ntrace {:#?}\nperf {:#?}",
                    o.len(),
                    t.len(),
                    near(&o),
                    near(&t)
                );
            }
            for (x, y) in o.iter().zip(&t) {
                assert_eq!(
                    x.vals.keys().collect::<Vec<_>>(),
                    y.vals.keys().collect::<Vec<_>>(),
                    "{event}: the same fields"
                );
                let y = perf_pid_of_dead_task(event, x, y, &tgids);
                assert_eq!(x.vals, y.vals, "{event} on CPU {cpu} at {} us", y.ts_us);
                // The same event: the two clocks are read in the same
                // tracepoint call, apart by the other tool's handler (and,
                // for the syscall tracepoints, which run preemptible, by
                // any preemption in between on a busy machine).
                assert!(
                    (x.ts_us - y.ts_us).abs() < SAME_EVENT_US,
                    "{event}: times {} and {} us",
                    x.ts_us,
                    y.ts_us
                );
            }
            compared += o.len();
        }
        report.push(format!("{table} {compared}"));
        assert!(compared > 0, "{event}: no event in the window");
    }
    Ok(format!(
        "{} (perf samples delivered twice, dropped: {doubled})",
        report.join(", ")
    ))
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
