//! The `trace` probe through `kernmlops run --config`, checked against
//! `perf record -e` over the same window: for a workload of our own (a
//! small C program with a name no other process has), the same events in
//! the same order with equal field values, strings included.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use arrow_array::{cast::AsArray, Array, RecordBatch};
use kernmlops_e2e::*;

/// The workload's name (its comm): opens marker files, sleeps between
/// them, and logs each name it opened.
const WORKLOAD_NAME: &str = "kmltracewl";

const WORKLOAD: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    char name[256];
    for (int i = 0; i < 20; i++) {
        snprintf(name, sizeof(name), "%s/marker-%d-%s", argv[1], i,
                 i % 2 ? "a-rather-long-name-to-see-that-strings-are-kept-whole" : "x");
        int fd = openat(AT_FDCWD, name, O_RDONLY | O_CLOEXEC);
        if (fd >= 0)
            close(fd);
        printf("%s\n", name);
        struct timespec d = {0, 2000000};
        nanosleep(&d, NULL);
    }
    return 0;
}
"#;

fn compile(work: &Path) -> PathBuf {
    let src = work.join("wl.c");
    let bin = work.join(WORKLOAD_NAME);
    std::fs::write(&src, WORKLOAD).expect("writing the workload");
    let ok = Command::new("gcc")
        .args(["-O1", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("running gcc")
        .success();
    assert!(ok, "gcc failed");
    bin
}

fn strings(batches: &[RecordBatch], name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        let col = b
            .column_by_name(name)
            .unwrap_or_else(|| panic!("no column {name}"));
        let s = col.as_string::<i32>();
        out.extend((0..s.len()).map(|i| s.value(i).to_owned()));
    }
    out
}

fn ints(batches: &[RecordBatch], name: &str) -> Vec<i64> {
    let mut out = Vec::new();
    for b in batches {
        let col = b
            .column_by_name(name)
            .unwrap_or_else(|| panic!("no column {name}"));
        let col = arrow_cast_i64(col.as_ref());
        out.extend(col);
    }
    out
}

/// Any integer or boolean column as i64.
fn arrow_cast_i64(col: &dyn Array) -> Vec<i64> {
    use arrow_array::types::*;
    macro_rules! try_type {
        ($($t:ty),*) => {
            $(
                if let Some(a) = col.as_primitive_opt::<$t>() {
                    return a.values().iter().map(|v| *v as i64).collect();
                }
            )*
        };
    }
    try_type!(
        Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type
    );
    if let Some(b) = col.as_boolean_opt() {
        return (0..b.len()).map(|i| i64::from(b.value(i))).collect();
    }
    panic!("not an integer column: {:?}", col.data_type());
}

/// `key=value` or `key: value` fields of a perf script line.
fn perf_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let eq = format!("{key}=");
    let colon = format!("{key}: ");
    if let Some(i) = line.find(&colon) {
        let rest = &line[i + colon.len()..];
        return Some(rest.split([',', ' ']).next().unwrap_or(rest));
    }
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(eq.as_str()))
}

fn hex(s: &str) -> i64 {
    i64::from_str_radix(s.trim_start_matches("0x"), 16)
        .or_else(|_| u64::from_str_radix(s.trim_start_matches("0x"), 16).map(|v| v as i64))
        .unwrap_or_else(|_| panic!("{s:?} is not hex"))
}

/// perf's `prev_state` letters as the tracepoint's value: `S` 1, `D` 2,
/// `T` 4, `t` 8, `X` 16, `Z` 32, `P` 64, `I` 128, `R` 0, `+` (preempted)
/// 256.
fn prev_state(s: &str) -> i64 {
    let (s, plus) = match s.strip_suffix('+') {
        Some(rest) => (rest, 256),
        None => (s, 0),
    };
    let bits: i64 = s
        .split('|')
        .map(|l| match l {
            "S" => 1,
            "D" => 2,
            "T" => 4,
            "t" => 8,
            "X" => 16,
            "Z" => 32,
            "P" => 64,
            "I" => 128,
            _ => 0,
        })
        .sum();
    bits | plus
}

#[test]
fn root_trace_tracepoints_agree_with_perf_record() {
    if !require_root("root_trace_tracepoints_agree_with_perf_record")
        || !require_tool("root_trace_tracepoints_agree_with_perf_record", "perf")
        || !require_tool("root_trace_tracepoints_agree_with_perf_record", "gcc")
    {
        return;
    }
    let _serial = serial();
    let work = temp_dir("trace-perf");
    let bin = compile(&work);
    let cfg = work.join("kernmlops.toml");
    std::fs::write(
        &cfg,
        "[probes.trace]\nevents = [\n  \"sched:sched_process_exec\",\n  \"sched:sched_switch\",\n  \"syscalls:sys_enter_openat(dfd, str(filename), flags, mode)\",\n]\nstring_bytes = 256\n",
    )
    .expect("writing the config");
    let plugins = plugin_dir("trace-perf", &[("trace", "trace")]);
    let out = work.join("data");
    let c = Collector::start(&[
        "--config",
        cfg.to_str().expect("utf8"),
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "trace",
        "--output",
        out.to_str().expect("utf8"),
    ]);
    let perf_data = work.join("perf.data");
    let mut perf = Command::new("perf")
        .args([
            "record",
            "-q",
            "-a",
            "-e",
            "sched:sched_process_exec",
            "-e",
            "sched:sched_switch",
            "-e",
            "syscalls:sys_enter_openat",
            "-o",
        ])
        .arg(&perf_data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("perf record");
    std::thread::sleep(Duration::from_millis(700));
    let wl = Command::new(&bin)
        .arg(&work)
        .output()
        .expect("running the workload");
    assert!(wl.status.success());
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling a child we spawned.
    unsafe { libc::kill(perf.id() as i32, libc::SIGINT) };
    let _ = perf.wait();
    let done = c.signal_and_wait(libc::SIGINT);
    assert!(done.status.success(), "{}", done.stderr);
    let dir = done.dir.expect("collection");
    let script = Command::new("perf")
        .args(["script", "-F", "comm,pid,event,trace", "-i"])
        .arg(&perf_data)
        .output()
        .expect("perf script");
    let script = String::from_utf8_lossy(&script.stdout).into_owned();
    let mine: Vec<&str> = script
        .lines()
        .filter(|l| l.trim_start().starts_with(WORKLOAD_NAME))
        .collect();

    // Exec: the workload's own, with its file name and pids.
    let exec = read_table(&dir.join("sched_process_exec.arrow"));
    let comm = strings(&exec, "comm");
    let rows: Vec<usize> = (0..comm.len())
        .filter(|&i| comm[i] == WORKLOAD_NAME)
        .collect();
    let perf_exec: Vec<&&str> = mine
        .iter()
        .filter(|l| l.contains("sched_process_exec"))
        .collect();
    assert_eq!(
        rows.len(),
        perf_exec.len(),
        "exec events: ours {rows:?}, perf {perf_exec:?}"
    );
    assert_eq!(rows.len(), 1);
    let filename = strings(&exec, "filename");
    let pid = ints(&exec, "pid_field");
    let old_pid = ints(&exec, "old_pid");
    let p = perf_exec[0];
    assert_eq!(Some(filename[rows[0]].as_str()), perf_field(p, "filename"));
    assert_eq!(
        Some(pid[rows[0]].to_string().as_str()),
        perf_field(p, "pid")
    );
    assert_eq!(
        Some(old_pid[rows[0]].to_string().as_str()),
        perf_field(p, "old_pid")
    );
    assert_eq!(filename[rows[0]], bin.to_str().expect("utf8"));

    // openat: the same calls in the same order, equal numbers, and the
    // names the workload logged (perf shows only the pointer).
    let opens = read_table(&dir.join("sys_enter_openat.arrow"));
    let comm = strings(&opens, "comm");
    let rows: Vec<usize> = (0..comm.len())
        .filter(|&i| comm[i] == WORKLOAD_NAME)
        .collect();
    let perf_open: Vec<&&str> = mine
        .iter()
        .filter(|l| l.contains("sys_enter_openat"))
        .collect();
    assert_eq!(rows.len(), perf_open.len(), "openat events of the workload");
    let (dfd, flags, mode) = (
        ints(&opens, "dfd"),
        ints(&opens, "flags"),
        ints(&opens, "mode"),
    );
    for (r, p) in rows.iter().zip(&perf_open) {
        assert_eq!(dfd[*r], hex(perf_field(p, "dfd").expect("dfd")), "{p}");
        assert_eq!(
            flags[*r],
            hex(perf_field(p, "flags").expect("flags")),
            "{p}"
        );
        assert_eq!(mode[*r], hex(perf_field(p, "mode").expect("mode")), "{p}");
    }
    let names = strings(&opens, "filename");
    let truncated = ints(&opens, "filename_truncated");
    let opened: Vec<String> = rows.iter().map(|&r| names[r].clone()).collect();
    let logged: Vec<String> = String::from_utf8_lossy(&wl.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(logged.len(), 20);
    let markers: Vec<&String> = opened.iter().filter(|n| n.contains("/marker-")).collect();
    assert_eq!(markers, logged.iter().collect::<Vec<_>>(), "file names");
    assert!(rows.iter().all(|&r| truncated[r] == 0));

    // Switches away from the workload: every field as perf prints it.
    let sw = read_table(&dir.join("sched_switch.arrow"));
    let prev_comm = strings(&sw, "prev_comm");
    let rows: Vec<usize> = (0..prev_comm.len())
        .filter(|&i| prev_comm[i] == WORKLOAD_NAME)
        .collect();
    let perf_sw: Vec<&&str> = mine
        .iter()
        .filter(|l| {
            l.contains("sched_switch") && l.contains(&format!("prev_comm={WORKLOAD_NAME} "))
        })
        .collect();
    assert!(
        rows.len() >= 20,
        "the workload slept 20 times: {} switches",
        rows.len()
    );
    assert_eq!(rows.len(), perf_sw.len(), "switches of the workload");
    let next_comm = strings(&sw, "next_comm");
    let cols: Vec<(&str, Vec<i64>)> = [
        "prev_pid",
        "prev_prio",
        "next_pid",
        "next_prio",
        "prev_state",
    ]
    .iter()
    .map(|c| (*c, ints(&sw, c)))
    .collect();
    for (r, p) in rows.iter().zip(&perf_sw) {
        for (name, values) in &cols {
            let want = perf_field(p, name).unwrap_or_else(|| panic!("{name} in {p}"));
            let want = if *name == "prev_state" {
                prev_state(want)
            } else {
                want.parse().unwrap_or_else(|_| panic!("{name}={want}"))
            };
            assert_eq!(values[*r], want, "{name} of {p}");
        }
        let next = p
            .split("next_comm=")
            .nth(1)
            .and_then(|s| s.split(" next_pid=").next());
        assert_eq!(Some(next_comm[*r].as_str()), next, "{p}");
    }
    let m = manifest(&dir);
    for t in ["sched_process_exec", "sched_switch", "sys_enter_openat"] {
        assert_eq!(
            m["tables"][t]["lost_events"].as_u64(),
            Some(0),
            "{t} lost events"
        );
    }
}

#[test]
fn root_trace_passes_kernmlops_check() {
    if !require_root("root_trace_passes_kernmlops_check") {
        return;
    }
    let plugins = plugin_dir("trace-check", &[("trace", "trace")]);
    let out = kernmlops(&[
        "check",
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "trace",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("ok   trace"), "{stdout}");
}

#[test]
fn root_trace_refuses_kernel_functions_in_one_line() {
    if !require_root("root_trace_refuses_kernel_functions_in_one_line") {
        return;
    }
    let work = temp_dir("trace-func");
    let cfg = work.join("kernmlops.toml");
    std::fs::write(
        &cfg,
        "[probes.trace]\nevents = [\"func:do_madvise(start, len_in, behavior) latency\"]\n",
    )
    .expect("writing the config");
    let plugins = plugin_dir("trace-func", &[("trace", "trace")]);
    let out = kernmlops(&[
        "--config",
        cfg.to_str().expect("utf8"),
        "run",
        "--strict",
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "trace",
        "--duration",
        "1s",
        "--output",
        work.join("data").to_str().expect("utf8"),
    ]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("do_madvise"))
        .unwrap_or_else(|| panic!("no line names the event: {stderr}"));
    assert!(line.contains("what works here"), "{line}");
}

/// Calls getppid(2) `argv[1]` times, sleeping 20 ms after every hundredth
/// call (so the calls span several count intervals), in `argv[2]` threads
/// at once when given; prints its pid.
const COUNT_WORKLOAD: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int calls;

static void *run(void *unused) {
    (void)unused;
    for (int i = 0; i < calls; i++) {
        getppid();
        if (i % 100 == 99) {
            struct timespec d = {0, 20000000};
            nanosleep(&d, NULL);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    calls = atoi(argv[1]);
    int threads = argc > 2 ? atoi(argv[2]) : 0;
    if (threads <= 0) {
        run(NULL);
    } else {
        pthread_t t[64];
        if (threads > 64)
            threads = 64;
        for (int i = 0; i < threads; i++)
            pthread_create(&t[i], NULL, run, NULL);
        for (int i = 0; i < threads; i++)
            pthread_join(t[i], NULL);
    }
    printf("%d\n", getpid());
    return 0;
}
"#;

/// The count workload's name (its comm).
const COUNT_NAME: &str = "kmlgetppid";

fn compile_count_workload(work: &Path) -> PathBuf {
    let src = work.join("getppid.c");
    let bin = work.join(COUNT_NAME);
    std::fs::write(&src, COUNT_WORKLOAD).expect("writing the workload");
    let ok = Command::new("gcc")
        .args(["-O1", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("running gcc")
        .success();
    assert!(ok, "gcc failed");
    bin
}

/// Runs the count workload; returns its pid.
fn run_count_workload(bin: &Path, calls: u32, threads: u32) -> u32 {
    let out = Command::new(bin)
        .arg(calls.to_string())
        .arg(threads.to_string())
        .output()
        .expect("running the workload");
    assert!(out.status.success());
    text(&out.stdout)
        .trim()
        .parse()
        .expect("the workload's pid")
}

/// A `trace` collection with configuration `toml`, around `workload`.
fn traced(name: &str, toml: &str, workload: impl FnOnce(&Path)) -> (PathBuf, String) {
    let work = temp_dir(name);
    let cfg = work.join("kernmlops.toml");
    std::fs::write(&cfg, toml).expect("writing the config");
    let plugins = plugin_dir(name, &[("trace", "trace")]);
    let out = work.join("data");
    let c = Collector::start(&[
        "--config",
        cfg.to_str().expect("utf8"),
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "trace",
        "--output",
        out.to_str().expect("utf8"),
    ]);
    workload(&work);
    std::thread::sleep(Duration::from_millis(300));
    let done = c.signal_and_wait(libc::SIGINT);
    assert!(done.status.success(), "{}", done.stderr);
    (done.dir.expect("collection"), done.stderr)
}

/// The indexes of the rows whose integer column `key` is `value`.
fn rows_where(batches: &[RecordBatch], key: &str, value: i64) -> Vec<usize> {
    let keys = ints(batches, key);
    (0..keys.len()).filter(|&i| keys[i] == value).collect()
}

#[test]
fn root_trace_count_mode_counts_every_call_per_key_and_interval() {
    const TEST: &str = "root_trace_count_mode_counts_every_call_per_key_and_interval";
    if !require_root(TEST) || !require_tool(TEST, "gcc") {
        return;
    }
    let _serial = serial();
    let build = temp_dir("trace-count-build");
    let bin = compile_count_workload(&build);
    let calls = [700u32, 1300];
    let mut pids = Vec::new();
    let (dir, stderr) = traced(
        "trace-count",
        r#"[probes.trace]
events = [
  "syscalls:sys_enter_getppid count",
  "raw_syscalls:sys_enter(id) latency exit=raw_syscalls:sys_exit count by=tgid,id",
]

[[probes.trace.event]]
event = "syscalls:sys_enter_getppid"
table = "getppid_by_thread"
mode = "count"
by = ["pid", "comm"]
interval = "50ms"
"#,
        |_| {
            for n in calls {
                pids.push(run_count_workload(&bin, n, 0));
            }
        },
    );
    let m = manifest(&dir);
    for t in ["sys_enter_getppid_count", "getppid_by_thread"] {
        assert_eq!(
            m["tables"][t]["lost_events"].as_u64(),
            Some(0),
            "{t} lost events: {stderr}"
        );
    }

    // Per tgid, every 100 ms: the counts add up to the calls made, over
    // more than one interval, each interval ending later than the last.
    let per_tgid = read_table(&dir.join("sys_enter_getppid_count.arrow"));
    let schema = per_tgid[0].schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["collection_id", "ts_uptime_us", "tgid", "count"]);
    let counts = ints(&per_tgid, "count");
    let ends = ints(&per_tgid, "ts_uptime_us");
    for (pid, n) in pids.iter().zip(calls) {
        let rows = rows_where(&per_tgid, "tgid", i64::from(*pid));
        let sum: i64 = rows.iter().map(|&r| counts[r]).sum();
        assert_eq!(sum, i64::from(n), "getppid calls of {pid}: rows {rows:?}");
        assert!(rows.len() >= 2, "{n} calls in one interval: {rows:?}");
        assert!(rows.iter().all(|&r| counts[r] > 0));
        let times: Vec<i64> = rows.iter().map(|&r| ends[r]).collect();
        assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
    }

    // Per thread and comm, every 50 ms: the same sums, under the
    // workload's name.
    let per_thread = read_table(&dir.join("getppid_by_thread.arrow"));
    let counts = ints(&per_thread, "count");
    let comms = strings(&per_thread, "comm");
    for (pid, n) in pids.iter().zip(calls) {
        let rows = rows_where(&per_thread, "pid", i64::from(*pid));
        let sum: i64 = rows.iter().map(|&r| counts[r]).sum();
        assert_eq!(sum, i64::from(n), "getppid calls of thread {pid}");
        assert!(rows.iter().all(|&r| comms[r] == COUNT_NAME));
        assert!(rows.len() >= 3, "50 ms intervals: {rows:?}");
    }

    // raw_syscalls entry and exit joined per thread, counted per tgid and
    // syscall number: every getppid call, and every 20 ms sleep with a
    // latency of at least 20 ms.
    let sys = read_table(&dir.join("sys_enter_count.arrow"));
    let (tgid, id, count) = (ints(&sys, "tgid"), ints(&sys, "id"), ints(&sys, "count"));
    let (total, min, max) = (
        ints(&sys, "latency_total_ns"),
        ints(&sys, "latency_min_ns"),
        ints(&sys, "latency_max_ns"),
    );
    for (pid, n) in pids.iter().zip(calls) {
        let of = |nr: i64| -> Vec<usize> {
            (0..tgid.len())
                .filter(|&r| tgid[r] == i64::from(*pid) && id[r] == nr)
                .collect()
        };
        // Counts and totals add up exactly over the intervals; every call
        // lies between the least and greatest latency of all the rows.
        let getppid = of(libc::SYS_getppid);
        let sum: i64 = getppid.iter().map(|&r| count[r]).sum();
        assert_eq!(sum, i64::from(n), "joined getppid calls of {pid}");
        let least = getppid.iter().map(|&r| min[r]).min().expect("rows");
        let most = getppid.iter().map(|&r| max[r]).max().expect("rows");
        let spent: i64 = getppid.iter().map(|&r| total[r]).sum();
        assert!(0 < least && least <= most, "{least} {most}");
        assert!(
            least * sum <= spent && spent <= most * sum,
            "{least} {most} {spent}"
        );
        let sleeps = of(libc::SYS_clock_nanosleep);
        let slept: i64 = sleeps.iter().map(|&r| count[r]).sum();
        assert_eq!(slept, i64::from(n / 100), "sleeps of {pid}");
        let spent: i64 = sleeps.iter().map(|&r| total[r]).sum();
        assert!(
            spent >= 20_000_000 * slept,
            "{slept} sleeps of 20 ms in {spent} ns"
        );
        for &r in &sleeps {
            assert!(min[r] >= 20_000_000, "a 20 ms sleep took {} ns", min[r]);
        }
    }
}

#[test]
fn root_trace_count_mode_full_map_counts_lost_events() {
    const TEST: &str = "root_trace_count_mode_full_map_counts_lost_events";
    if !require_root(TEST) || !require_tool(TEST, "gcc") {
        return;
    }
    let _serial = serial();
    let build = temp_dir("trace-count-full-build");
    let bin = compile_count_workload(&build);
    // 40 threads of 50 calls each, keyed by thread, in a map of 16 keys.
    let (threads, calls) = (40u32, 50u32);
    let mut pid = 0;
    let (dir, stderr) = traced(
        "trace-count-full",
        "[probes.trace]\nevents = [\"syscalls:sys_enter_getppid count by=pid,tgid\"]\ncount_entries = 16\n",
        |_| pid = run_count_workload(&bin, calls, threads),
    );
    let t = read_table(&dir.join("sys_enter_getppid_count.arrow"));
    let rows = rows_where(&t, "tgid", i64::from(pid));
    let counts = ints(&t, "count");
    let counted: i64 = rows.iter().map(|&r| counts[r]).sum();
    let threads_seen: std::collections::BTreeSet<i64> = {
        let p = ints(&t, "pid");
        rows.iter().map(|&r| p[r]).collect()
    };
    let all_keys: std::collections::BTreeSet<(i64, i64)> = {
        let (p, g) = (ints(&t, "pid"), ints(&t, "tgid"));
        (0..p.len()).map(|r| (p[r], g[r])).collect()
    };
    let lost = manifest(&dir)["tables"]["sys_enter_getppid_count"]["lost_events"]
        .as_u64()
        .expect("lost events") as i64;
    let made = i64::from(threads * calls);
    assert!(
        all_keys.len() <= 16,
        "{} keys in a map of 16",
        all_keys.len()
    );
    assert!(
        !threads_seen.is_empty() && counted < made,
        "{counted} of {made}"
    );
    assert!(lost > 0, "a full map lost nothing: {stderr}");
    // Every call is counted or lost (other processes' calls may be lost
    // too).
    assert!(
        counted + lost >= made,
        "{counted} counted + {lost} lost < {made}"
    );
    // A counted thread's calls are all there: its key was made at its
    // first call.
    let p = ints(&t, "pid");
    for th in &threads_seen {
        let sum: i64 = rows
            .iter()
            .filter(|&&r| p[r] == *th)
            .map(|&r| counts[r])
            .sum();
        assert_eq!(sum, i64::from(calls), "thread {th}");
    }
}

/// A cgroup v1 memory cgroup of the test's own with a 16 MiB limit,
/// removed (its processes killed first) on drop.
struct MemoryLimit(PathBuf);

impl MemoryLimit {
    fn create(name: &str) -> Option<Self> {
        let root = Path::new("/sys/fs/cgroup/memory");
        if !root.join("memory.limit_in_bytes").is_file() {
            return None;
        }
        let dir = root.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        let limit = Self(dir);
        std::fs::write(limit.0.join("memory.limit_in_bytes"), "16777216").ok()?;
        Some(limit)
    }
}

impl Drop for MemoryLimit {
    fn drop(&mut self) {
        for _ in 0..50 {
            let procs = std::fs::read_to_string(self.0.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.parse::<i32>().ok()) {
                // SAFETY: killing processes this test put in its own cgroup.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if std::fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn sh(script: &str) {
    let out = Command::new("sh")
        .args(["-c", script])
        .output()
        .expect("running sh");
    assert!(out.status.success(), "{script}: {}", text(&out.stderr));
}

fn inode(path: &Path) -> i64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).expect("stat").ino() as i64
}

/// Rows of `table` in the collection (0 when the run did not write it).
fn rows_of(dir: &Path, table: &str) -> Vec<RecordBatch> {
    let path = dir.join(format!("{table}.arrow"));
    assert!(path.is_file(), "no table {table} in {}", dir.display());
    read_table(&path)
}

fn row_count(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::num_rows).sum()
}

#[test]
fn root_trace_presets_record_their_events() {
    const TEST: &str = "root_trace_presets_record_their_events";
    if !require_root(TEST)
        || !require_tool(TEST, "gcc")
        || !require_tool(TEST, "dd")
        || !require_tool(TEST, "python3")
    {
        return;
    }
    let _serial = serial();
    let build = temp_dir("trace-presets-build");
    let bin = compile_count_workload(&build);
    let presets: &[(&str, &[&str])] = &[
        (
            "page_cache",
            &[
                "mm_filemap_add_to_page_cache",
                "mm_filemap_delete_from_page_cache",
                "page_cache_sync_ra",
                "page_cache_async_ra",
            ],
        ),
        (
            "writeback",
            &[
                "writeback_dirty_folio",
                "writeback_start",
                "writeback_written",
                "writeback_single_inode",
                "balance_dirty_pages",
            ],
        ),
        (
            "reclaim",
            &[
                "mm_vmscan_kswapd_wake",
                "mm_vmscan_kswapd_sleep",
                "mm_vmscan_direct_reclaim_begin",
                "mm_vmscan_direct_reclaim_end",
                "mm_vmscan_memcg_reclaim_begin",
                "mm_vmscan_memcg_reclaim_end",
                "mm_vmscan_lru_shrink_inactive",
                "mm_compaction_begin",
                "mm_compaction_end",
            ],
        ),
        (
            "migration",
            &[
                "sched_migrate_task",
                "sched_move_numa",
                "sched_swap_numa",
                "sched_wake_idle_without_ipi",
            ],
        ),
        (
            "cpufreq",
            &[
                "cpu_frequency",
                "cpu_frequency_limits",
                "cpu_idle",
                "cpu_idle_miss",
            ],
        ),
        (
            "net",
            &[
                "net_dev_xmit",
                "netif_rx",
                "netif_receive_skb",
                "tcp_retransmit_skb",
            ],
        ),
        ("syscalls", &["sys_enter_count"]),
    ];
    for (preset, tables) in presets {
        let mut file = PathBuf::new();
        let mut pid = 0;
        let mut reclaimed = false;
        let (dir, stderr) = traced(
            &format!("trace-preset-{preset}"),
            &format!("[probes.trace]\npresets = [\"{preset}\"]\n"),
            |work| {
                file = work.join("file");
                let f = file.to_str().expect("utf8");
                match *preset {
                    // Written, dropped from the cache, read back (pages
                    // added, read ahead) and dropped again (deleted).
                    "page_cache" => sh(&format!(
                        "dd if=/dev/zero of={f} bs=1M count=16 conv=fsync status=none \
                         && dd if={f} iflag=nocache count=0 status=none \
                         && dd if={f} of=/dev/null bs=64K status=none \
                         && dd if={f} iflag=nocache count=0 status=none"
                    )),
                    // Dirtied, then written back by the flusher for syncfs.
                    "writeback" => sh(&format!(
                        "dd if=/dev/zero of={f} bs=1M count=16 status=none && sync -f {f}"
                    )),
                    // 64 MiB written from a cgroup limited to 16 MiB.
                    "reclaim" => match MemoryLimit::create("kml-trace-reclaim") {
                        Some(limit) => {
                            sh(&format!(
                                "echo $$ > {}/cgroup.procs && exec dd if=/dev/zero of={f} bs=1M count=64 status=none",
                                limit.0.display()
                            ));
                            reclaimed = true;
                        }
                        None => eprintln!("{TEST}: note: no cgroup v1 memory controller to reclaim in"),
                    },
                    // Four busy processes on two CPUs.
                    "migration" => sh(
                        "for k in 1 2 3 4; do (i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done) & done; wait",
                    ),
                    "net" => sh(
                        "python3 -c 'import socket\n\
                         s = socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(1)\n\
                         c = socket.create_connection(s.getsockname()); a, _ = s.accept()\n\
                         for i in range(50):\n    c.sendall(b\"x\" * 100); a.recv(100)\n\
                         c.close(); a.close(); s.close()'",
                    ),
                    "syscalls" => pid = run_count_workload(&bin, 500, 0),
                    _ => std::thread::sleep(Duration::from_millis(500)),
                }
            },
        );
        assert!(!stderr.contains("error"), "{preset}: {stderr}");
        let mut summary = Vec::new();
        for t in *tables {
            // Every event exists here; one that did not would be a note.
            if !dir.join(format!("{t}.arrow")).is_file() {
                assert!(
                    stderr.contains(&format!(":{t}; left out")),
                    "{preset}: no table {t} and no note: {stderr}"
                );
                continue;
            }
            summary.push(format!("{t} {}", row_count(&rows_of(&dir, t))));
        }
        eprintln!("{TEST}: {preset}: {}", summary.join(", "));
        match *preset {
            "page_cache" => {
                let ino = inode(&file);
                for t in [
                    "mm_filemap_add_to_page_cache",
                    "mm_filemap_delete_from_page_cache",
                ] {
                    let b = rows_of(&dir, t);
                    assert!(
                        !rows_where(&b, "i_ino", ino).is_empty(),
                        "{t}: no row of the file's inode {ino}"
                    );
                }
                let ra: usize = ["page_cache_sync_ra", "page_cache_async_ra"]
                    .iter()
                    .map(|t| rows_where(&rows_of(&dir, t), "i_ino", ino).len())
                    .sum();
                assert!(ra > 0, "no readahead of the file");
            }
            "writeback" => {
                let ino = inode(&file);
                for t in ["writeback_dirty_folio", "writeback_single_inode"] {
                    assert!(
                        !rows_where(&rows_of(&dir, t), "ino", ino).is_empty(),
                        "{t}: no row of the file's inode {ino}"
                    );
                }
                for t in ["writeback_start", "writeback_written"] {
                    assert!(row_count(&rows_of(&dir, t)) > 0, "{t}: no rows");
                }
            }
            "reclaim" if reclaimed => {
                for t in [
                    "mm_vmscan_memcg_reclaim_begin",
                    "mm_vmscan_memcg_reclaim_end",
                    "mm_vmscan_lru_shrink_inactive",
                ] {
                    assert!(row_count(&rows_of(&dir, t)) > 0, "{t}: no rows");
                }
                let freed: i64 = ints(
                    &rows_of(&dir, "mm_vmscan_memcg_reclaim_end"),
                    "nr_reclaimed",
                )
                .iter()
                .sum();
                assert!(freed > 0, "cgroup reclaim freed nothing");
            }
            "migration" => {
                assert!(
                    row_count(&rows_of(&dir, "sched_migrate_task")) > 0,
                    "no task moved between CPUs"
                );
            }
            "net" => {
                for t in ["net_dev_xmit", "netif_rx", "netif_receive_skb"] {
                    let b = rows_of(&dir, t);
                    let lo = strings(&b, "name").iter().filter(|n| *n == "lo").count();
                    assert!(lo >= 50, "{t}: {lo} packets on lo");
                }
            }
            "syscalls" => {
                let b = rows_of(&dir, "sys_enter_count");
                let (tgid, id, count) = (ints(&b, "tgid"), ints(&b, "id"), ints(&b, "count"));
                let calls: i64 = (0..tgid.len())
                    .filter(|&r| tgid[r] == i64::from(pid) && id[r] == libc::SYS_getppid)
                    .map(|r| count[r])
                    .sum();
                assert_eq!(calls, 500, "getppid calls counted per syscall");
            }
            _ => {}
        }
    }
}

#[test]
fn root_trace_count_mode_refusals_are_one_line() {
    if !require_root("root_trace_count_mode_refusals_are_one_line") {
        return;
    }
    let plugins = plugin_dir("trace-count-bad", &[("trace", "trace")]);
    let work = temp_dir("trace-count-bad");
    let out = work.join("data");
    for (events, needle) in [
        (
            vec!["raw_syscalls:sys_enter count by=idd"],
            "count key idd is no column of this event; keys: id",
        ),
        (
            vec!["sched:sched_switch count interval=5ms"],
            "a count interval is 10ms to 1h",
        ),
        (
            vec!["raw_syscalls:sys_enter latency"],
            "latency on a tracepoint needs exit=",
        ),
        (
            vec!["raw_syscalls:sys_enter latency exit=raw_syscalls:sys_exitt"],
            "nearest in raw_syscalls: sys_exit",
        ),
        (
            vec![],
            "5 events attach to tracepoint sched:sched_switch: at most 4",
        ),
    ] {
        // Five events on one tracepoint, each with a table of its own.
        let many = work.join("many.toml");
        let mut toml = String::from("[probes.trace]\nevents = [\"sched:sched_switch\"]\n");
        for (i, by) in ["cpu", "pid", "tgid", "comm"].iter().enumerate() {
            toml.push_str(&format!(
                "[[probes.trace.event]]\nevent = \"sched:sched_switch count by={by}\"\ntable = \"switches_{i}\"\n"
            ));
        }
        std::fs::write(&many, toml).expect("writing the config");
        let mut args = if events.is_empty() {
            vec![
                "--config",
                many.to_str().expect("utf8"),
                "run",
                "--plugins",
                "trace",
            ]
        } else {
            vec!["run"]
        };
        args.extend([
            "--plugin-dir",
            plugins.to_str().expect("utf8"),
            "--duration",
            "1s",
            "--output",
            out.to_str().expect("utf8"),
        ]);
        for e in &events {
            args.extend(["--trace", e]);
        }
        let r = kernmlops(&args);
        let stderr = text(&r.stderr);
        assert!(!r.status.success(), "{events:?}: {stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{events:?}: {stderr}");
        assert!(errors[0].contains(needle), "{events:?}: {}", errors[0]);
        assert!(!out.exists(), "a refused run made {}", out.display());
    }
}

/// Threads that sleep until told to go (`go` on standard input), then
/// sleep `SHORT` times more and end; each thread's id is printed first.
const UNMATCHED_WORKLOAD: &str = r#"
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define THREADS 4
#define SHORT 5

static void woken(int sig) { (void)sig; }

static void *sleeper(void *arg) {
    (void)arg;
    struct timespec long_sleep = {3600, 0}, short_sleep = {0, 5000000};
    printf("%ld\n", (long)syscall(SYS_gettid));
    fflush(stdout);
    nanosleep(&long_sleep, NULL);
    for (int i = 0; i < SHORT; i++)
        nanosleep(&short_sleep, NULL);
    return NULL;
}

int main(void) {
    pthread_t t[THREADS];
    struct sigaction sa;
    char line[16];
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = woken;
    sigaction(SIGUSR1, &sa, NULL);
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, sleeper, NULL);
    if (!fgets(line, sizeof(line), stdin))
        return 1;
    for (int i = 0; i < THREADS; i++)
        pthread_kill(t[i], SIGUSR1);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    return 0;
}
"#;

/// Exits of a joined event whose entries came before the probe attached
/// are counted in `trace_unmatched_exits`, per event: exactly the sleeps
/// in progress at the start, while every later sleep is a row.
#[test]
fn root_trace_unmatched_exits_are_a_table() {
    const TEST: &str = "root_trace_unmatched_exits_are_a_table";
    if !require_root(TEST) || !require_tool(TEST, "gcc") {
        return;
    }
    let _serial = serial();
    let (threads, short) = (4usize, 5usize);
    let work = temp_dir("trace-unmatched");
    let src = work.join("sleepers.c");
    let bin = work.join("kmlsleepers");
    std::fs::write(&src, UNMATCHED_WORKLOAD).expect("writing the workload");
    let built = Command::new("gcc")
        .args(["-O1", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("running gcc");
    assert!(built.success(), "gcc failed");
    // Built before the sleepers start: their long sleep must outlast it.
    let plugins = plugin_dir("trace-unmatched", &[("trace", "trace")]);
    /// The sleepers, killed and reaped if the test ends early.
    struct Sleepers(std::process::Child);
    impl Drop for Sleepers {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut wl = Sleepers(
        Command::new(&bin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the sleepers"),
    );
    let wl = &mut wl.0;
    // Every thread printed its id just before its long sleep.
    let mut out = std::io::BufReader::new(wl.stdout.take().expect("stdout"));
    for _ in 0..threads {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).expect("a thread id");
        assert!(line.trim().parse::<u32>().is_ok(), "{line:?}");
    }
    std::thread::sleep(Duration::from_millis(200));
    let cfg = work.join("kernmlops.toml");
    std::fs::write(
        &cfg,
        "[probes.trace]\nevents = [\"syscalls:sys_enter_clock_nanosleep(which_clock) latency exit=syscalls:sys_exit_clock_nanosleep\"]\n",
    )
    .expect("writing the config");
    let data = work.join("data");
    let tgid = wl.id().to_string();
    let c = Collector::start(&[
        "--config",
        cfg.to_str().expect("utf8"),
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "trace",
        "--tgid",
        &tgid,
        "--output",
        data.to_str().expect("utf8"),
    ]);
    {
        use std::io::Write;
        let mut stdin = wl.stdin.take().expect("stdin");
        stdin
            .write_all(b"go\n")
            .expect("telling the sleepers to go");
    }
    let status = wl.wait().expect("waiting for the sleepers");
    assert!(status.success(), "the sleepers failed: {status}");
    std::thread::sleep(Duration::from_millis(300));
    let done = c.signal_and_wait(libc::SIGINT);
    assert!(done.status.success(), "{}", done.stderr);
    let dir = done.dir.expect("collection");

    let sleeps = read_table(&dir.join("sys_enter_clock_nanosleep.arrow"));
    let lat = ints(&sleeps, "latency_ns");
    assert_eq!(lat.len(), threads * short, "joined sleeps: {lat:?}");
    assert!(lat.iter().all(|&ns| ns >= 5_000_000), "{lat:?}");
    let t = read_table(&dir.join("trace_unmatched_exits.arrow"));
    let events = strings(&t, "event");
    let unmatched: i64 = ints(&t, "unmatched_exits").iter().sum();
    assert!(unmatched > 0, "no unmatched exits: {}", done.stderr);
    assert_eq!(
        unmatched, threads as i64,
        "one exit without its entry per sleep in progress at the start"
    );
    assert!(
        events.iter().all(|e| e == "sys_enter_clock_nanosleep"),
        "{events:?}"
    );
    let man = manifest(&dir);
    assert_eq!(
        man["tables"]["trace_unmatched_exits"]["rows"].as_u64(),
        Some(t.iter().map(|b| b.num_rows() as u64).sum())
    );
    let _ = std::fs::remove_dir_all(&work);
}
