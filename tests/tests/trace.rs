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
