//! The shared probe tests, and the plugin's own on the running kernel:
//! tracepoints with every kind of field, BTF paths, and a refusal of
//! kernel functions before anything loads.

use std::time::Duration;

use kernmlops_plugin_sdk::ColumnKind;
use kernmlops_plugin_testing::{require_root, Running};
use trace::Trace;

kernmlops_plugin_testing::probe_tests!(Trace, rows_in = "sched_process_exec");

/// Values of an integer column of any width and sign, widened to i64.
fn column_i64(run: &Running<Trace>, table: &str, column: &str) -> Vec<i64> {
    let i = run
        .tables
        .iter()
        .position(|t| t.name.as_str() == table)
        .unwrap_or_else(|| panic!("no table {table}"));
    let t = &run.tables[i];
    let c = t
        .columns
        .iter()
        .find(|c| c.name.as_str() == column)
        .unwrap_or_else(|| panic!("table {table} has no column {column}"));
    let signed = matches!(
        c.kind,
        ColumnKind::I8 | ColumnKind::I16 | ColumnKind::I32 | ColumnKind::I64
    );
    let (off, size) = (c.offset as usize, c.size as usize);
    run.batches[i]
        .data
        .chunks_exact(t.record_size as usize)
        .map(|r| {
            let bytes = &r[off..off + size];
            let fill = if signed && bytes[size - 1] & 0x80 != 0 {
                0xff
            } else {
                0
            };
            let mut b = [fill; 8];
            b[..size].copy_from_slice(bytes);
            i64::from_le_bytes(b)
        })
        .collect()
}

fn config(events: &[&str]) -> String {
    format!(r#"{{"events": {events:?}}}"#)
}

#[test]
fn root_tracepoint_fields_match_the_task() {
    if !require_root("root_tracepoint_fields_match_the_task") {
        return;
    }
    let mut run = Running::<Trace>::start(&config(&[
        "sched:sched_process_exec",
        "sched:sched_switch",
        "syscalls:sys_enter_openat(dfd, str(filename), flags)",
    ]));
    let marker = format!("/tmp/kml-trace-{}-no-such-file", std::process::id());
    let ok = run.drain_until(Duration::from_secs(5), |r| {
        let _ = std::fs::File::open(&marker);
        let _ = std::process::Command::new("/bin/true").status();
        r.rows("sched_process_exec") > 0
            && r.column_str("sys_enter_openat", "filename")
                .contains(&marker)
    });
    run.stop();
    if !ok {
        let names = run.column_str("sys_enter_openat", "filename");
        let tg = run.column_u64("sys_enter_openat", "tgid");
        eprintln!(
            "openat rows {}: {:?}",
            names.len(),
            names
                .iter()
                .zip(&tg)
                .filter(|(_, t)| **t == u64::from(std::process::id()))
                .take(20)
                .collect::<Vec<_>>()
        );
        eprintln!("exec rows {}", run.rows("sched_process_exec"));
    }
    assert!(ok, "no exec row or no openat of {marker}");
    run.assert_recent_timestamps("sched_switch");
    let files = run.column_str("sched_process_exec", "filename");
    assert!(files.iter().any(|f| f == "/bin/true"), "{files:?}");
    // The exec tracepoint's pid field is the exec'ing task's pid.
    let pids = column_i64(&run, "sched_process_exec", "pid");
    let exec_pids = column_i64(&run, "sched_process_exec", "pid_field");
    assert_eq!(pids, exec_pids);
    let comms = run.column_str("sched_switch", "prev_comm");
    assert!(!comms.is_empty() && comms.iter().all(|c| c.len() < 16));
    let me = u64::from(std::process::id());
    let tgids = run.column_u64("sys_enter_openat", "tgid");
    let names = run.column_str("sys_enter_openat", "filename");
    assert!(
        tgids
            .iter()
            .zip(&names)
            .any(|(t, n)| *t == me && *n == marker),
        "the test's own open of {marker} is missing"
    );
}

#[test]
fn root_btf_paths_through_pointers() {
    if !require_root("root_btf_paths_through_pointers") {
        return;
    }
    let mut run = Running::<Trace>::start(&config(&[
        "tp_btf:sched_switch(prev->pid, prev->tgid, str(prev->comm), next_pid=next->pid, prev->mm->owner->pid)",
    ]));
    let ok = run.drain_until(Duration::from_secs(5), |r| r.rows("sched_switch") > 100);
    run.stop();
    assert!(ok, "fewer than 100 switches in 5 s");
    // prev is the task switched out: the current task at the tracepoint.
    let pid = column_i64(&run, "sched_switch", "pid");
    assert_eq!(pid, column_i64(&run, "sched_switch", "prev_pid"));
    let tgid = column_i64(&run, "sched_switch", "tgid");
    assert_eq!(tgid, column_i64(&run, "sched_switch", "prev_tgid"));
    // A kernel thread has no mm: the chain stops at a NULL and reads 0.
    let owner = column_i64(&run, "sched_switch", "prev_mm_owner_pid");
    assert!(
        owner.iter().any(|&o| o != 0),
        "no owner pid read through mm"
    );
    assert_eq!(
        run.column_str("sched_switch", "comm"),
        run.column_str("sched_switch", "prev_comm")
    );
}

#[test]
fn kernel_functions_are_refused_before_load() {
    let args = kernmlops_plugin_testing::start_args(&config(&["func:do_madvise(start) latency"]));
    let e = Running::<Trace>::try_start_with(&args)
        .err()
        .expect("refused");
    let m = e.to_string();
    assert!(m.contains("what works here") && m.contains("uprobe"), "{m}");
    assert!(!m.contains('\n'), "{m}");
}

#[test]
fn unknown_tracepoints_name_the_nearest() {
    let args = kernmlops_plugin_testing::start_args(&config(&["sched:sched_swich"]));
    let Err(e) = Running::<Trace>::try_start_with(&args) else {
        panic!("started");
    };
    let m = e.to_string();
    if kernmlops_plugin_sdk::sys::tracefs::tracefs_root().is_some() {
        assert!(m.contains("sched_switch"), "{m}");
    }
}

/// A program that calls its own functions and logs, per call, what it was
/// given, what it returned and how long the call took (CLOCK_BOOTTIME).
const UPROBE_PROGRAM: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_BOOTTIME, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

__attribute__((noinline)) long kml_work(long a, const char *s) {
    struct timespec d = {0, (a + 1) * 1000000L};
    nanosleep(&d, NULL);
    __asm__ volatile("" ::: "memory");
    return a * 10 + (long)s[0];
}

__attribute__((noinline)) long kml_rec(long n) {
    __asm__ volatile("" ::: "memory");
    return n == 0 ? 0 : n + kml_rec(n - 1);
}

int main(void) {
    char name[32];
    for (long i = 0; i < 5; i++) {
        snprintf(name, sizeof(name), "call-%ld", i);
        long t0 = now_ns();
        long r = kml_work(i, name);
        long t1 = now_ns();
        printf("work %ld %s %ld %ld\n", i, name, r, t1 - t0);
    }
    printf("rec %ld\n", kml_rec(3));
    return 0;
}
"#;

#[test]
fn root_uprobe_arguments_returns_and_latency() {
    if !require_root("root_uprobe_arguments_returns_and_latency") {
        return;
    }
    let dir = kernmlops_sys::private::TempDir::new("kml-trace-uprobe").expect("temp dir");
    let src = dir.path().join("prog.c");
    let bin = dir.path().join("prog");
    std::fs::write(&src, UPROBE_PROGRAM).expect("writing the program");
    let built = std::process::Command::new("gcc")
        .args(["-O1", "-g", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("running gcc");
    assert!(built.success(), "gcc failed");
    let bin_s = bin.to_str().expect("utf-8 path");
    let events = [
        format!("uprobe:{bin_s}:kml_work(arg0, str(arg1)) latency"),
        format!("uprobe:{bin_s}:kml_rec(arg0) ret"),
    ];
    let events: Vec<&str> = events.iter().map(String::as_str).collect();
    let mut run = Running::<Trace>::start(&config(&events));
    let out = std::process::Command::new(&bin)
        .output()
        .expect("running the program");
    assert!(out.status.success());
    let ok = run.drain_until(Duration::from_secs(5), |r| {
        r.rows("kml_work") >= 5 && r.rows("kml_rec") >= 4
    });
    run.stop();
    assert!(
        ok,
        "rows: kml_work {}, kml_rec {}",
        run.rows("kml_work"),
        run.rows("kml_rec")
    );
    let log = String::from_utf8_lossy(&out.stdout);
    let calls: Vec<Vec<&str>> = log
        .lines()
        .filter(|l| l.starts_with("work "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    let args = column_i64(&run, "kml_work", "arg0");
    let names = run.column_str("kml_work", "arg1");
    let rets = column_i64(&run, "kml_work", "ret");
    let lat = column_i64(&run, "kml_work", "latency_ns");
    assert_eq!(args.len(), 5, "one row per call");
    for (i, call) in calls.iter().enumerate() {
        assert_eq!(args[i].to_string(), call[1], "arg0 of call {i}");
        assert_eq!(names[i], call[2], "arg1 of call {i}");
        assert_eq!(rets[i].to_string(), call[3], "ret of call {i}");
        let own: i64 = call[4].parse().expect("duration");
        // The probe's window lies inside the program's own, give or take
        // the probes' cost (well under a millisecond).
        assert!(
            lat[i] <= own && lat[i] + 1_000_000 >= own,
            "call {i}: latency {} ns, the program measured {own} ns",
            lat[i]
        );
    }
    // Recursion: kml_rec(3) calls itself down to 0; each exit joins its own
    // entry (deepest first).
    let n = column_i64(&run, "kml_rec", "arg0");
    let r = column_i64(&run, "kml_rec", "ret");
    assert_eq!(n, [0, 1, 2, 3]);
    assert_eq!(r, [0, 1, 3, 6]);
    assert!(log.contains("rec 6"), "{log}");
}

/// The same block requests seen through the classic tracepoint's fields
/// and through BTF paths from the raw tracepoint's `struct request *`:
/// equal sectors and lengths, under direct writes with `fio`.
#[test]
fn root_btf_paths_agree_with_the_tracepoint_fields() {
    if !require_root("root_btf_paths_agree_with_the_tracepoint_fields") {
        return;
    }
    if std::process::Command::new("fio")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var("CI").is_err(),
            "fio is needed in CI for root_btf_paths_agree_with_the_tracepoint_fields"
        );
        eprintln!("SKIP: no fio");
        return;
    }
    let dir = kernmlops_sys::private::TempDir::new_in(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
        ".kml-trace-fio",
    )
    .expect("temp dir on a disk");
    let long = kernmlops_spec_long(
        "tp_btf:block_rq_issue",
        "btf_rq_issue",
        &["sector=rq->__sector", "bytes=rq->__data_len"],
    );
    let cfg = format!(
        r#"{{"events": ["block:block_rq_issue(sector, bytes)"], "event": [{long}], "comm": false}}"#
    );
    let mut run = Running::<Trace>::start(&cfg);
    let out = std::process::Command::new("fio")
        .args([
            "--name=kml",
            "--rw=randwrite",
            "--bs=4k",
            "--size=4m",
            "--direct=1",
            "--ioengine=psync",
            "--numjobs=1",
        ])
        .arg(format!("--directory={}", dir.path().display()))
        .output()
        .expect("running fio");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::thread::sleep(Duration::from_millis(300));
    run.drain_once(Duration::from_millis(100));
    run.stop();
    let mut classic: Vec<(i64, i64, i64)> = column_i64(&run, "block_rq_issue", "pid")
        .into_iter()
        .zip(column_i64(&run, "block_rq_issue", "sector"))
        .zip(column_i64(&run, "block_rq_issue", "bytes"))
        .map(|((p, s), b)| (p, s, b))
        .collect();
    let mut btf: Vec<(i64, i64, i64)> = column_i64(&run, "btf_rq_issue", "pid")
        .into_iter()
        .zip(column_i64(&run, "btf_rq_issue", "sector"))
        .zip(column_i64(&run, "btf_rq_issue", "bytes"))
        .map(|((p, s), b)| (p, s, b))
        .collect();
    assert!(
        classic.len() >= 1024,
        "4 MiB in 4 KiB writes: {} requests",
        classic.len()
    );
    // The tracepoint shows "no sector" (all ones) as 0.
    for b in &mut btf {
        if b.1 == -1 {
            b.1 = 0;
        }
    }
    classic.sort_unstable();
    btf.sort_unstable();
    let mut rest = btf.clone();
    for c in &classic {
        let at = rest.binary_search(c).unwrap_or_else(|_| {
            panic!("{c:?} (pid, sector, bytes) from the tracepoint is not among the BTF rows")
        });
        rest.remove(at);
    }
    // Requests the classic program did not see (0 to 1 in 1,000 here, up to
    // 5% while other BPF tests ran on the machine): probably the kernel
    // skipping a perf-event tracepoint program while another BPF program
    // runs on the CPU (bpf_prog_active), which raw tracepoint programs do
    // not share; not yet confirmed with the programs' recursion misses.
    eprintln!(
        "{} requests; {} seen only through the raw tracepoint: {:?}",
        btf.len(),
        rest.len(),
        &rest[..rest.len().min(5)]
    );
    assert!(
        rest.len() * 10 <= btf.len(),
        "too many requests missing from the tracepoint's table"
    );
}

/// One `[[probes.trace.event]]` as JSON.
fn kernmlops_spec_long(event: &str, table: &str, fields: &[&str]) -> String {
    format!(r#"{{"event": "{event}", "table": "{table}", "fields": {fields:?}}}"#)
}
