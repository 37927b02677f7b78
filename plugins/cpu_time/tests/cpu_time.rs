//! The cpu_time probe on the running kernel, as root: the shared probe
//! tests, and a busy child process whose CPU time the table must agree with
//! `/proc/<pid>/stat`, with busy and idle time covering every CPU.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use cpu_time::CpuTime;
use kernmlops_plugin_testing::{proc_stat, require_root, start_args, Running};

kernmlops_plugin_testing::probe_tests!(CpuTime, rows_in = "cpu_time");

#[test]
fn root_a_busy_process_gets_its_cpu_time_and_every_cpu_is_accounted() {
    if !require_root("root_a_busy_process_gets_its_cpu_time_and_every_cpu_is_accounted") {
        return;
    }
    let mut run = Running::<CpuTime>::start_with(&start_args(r#"{"interval":"0s"}"#));
    run.drain_once(Duration::from_millis(10));
    let first_rows = run.rows("cpu_time");
    // A shell loop busy for about 2 s: one process, one thread, no child.
    let mut child = Command::new("sh")
        .args(["-c", "i=0; while [ $i -lt 2000000 ]; do i=$((i+1)); done"])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawning a busy shell");
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    while proc_stat::state(pid) != 'Z' {
        assert!(Instant::now() < deadline, "the busy shell did not end");
        std::thread::sleep(Duration::from_millis(100));
        run.drain_once(Duration::from_millis(0));
    }
    let proc_us = proc_stat::cpu_us(pid, false);
    child.wait().expect("reaping");
    std::thread::sleep(Duration::from_millis(50));
    run.drain_once(Duration::from_millis(0));
    run.stop();

    let tgids = run.column_u64("cpu_time", "tgid");
    let cpu = run.column_u64("cpu_time", "cpu_time_us");
    let start = run.column_u64("cpu_time", "slot_start_us");
    let end = run.column_u64("cpu_time", "ts_uptime_us");
    let comms = run.column_str("cpu_time", "comm");
    let mine: u64 = tgids
        .iter()
        .zip(&cpu)
        .filter(|(t, _)| **t == u64::from(pid))
        .map(|(_, c)| *c)
        .sum();
    let diff = (mine as f64 - proc_us as f64).abs() / proc_us as f64;
    assert!(
        proc_us > 500_000 && diff < 0.02,
        "the table says {mine} us for pid {pid}, /proc says {proc_us} us"
    );
    assert!(
        tgids
            .iter()
            .zip(&comms)
            .any(|(t, c)| *t == u64::from(pid) && c == "sh"),
        "the process's name is recorded"
    );
    // Busy + idle time covers every CPU for the reads' span: within 5% over
    // the run, within 15% (or 5 ms a CPU) per read. The scheduler's task
    // clock leaves out interrupt and steal time, and a read's CPU times end
    // at its CPUs' last switch, a little before its timestamp.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let mut by_slot: std::collections::BTreeMap<(u64, u64), u64> = Default::default();
    for i in first_rows as usize..tgids.len() {
        *by_slot.entry((start[i], end[i])).or_default() += cpu[i];
    }
    assert!(by_slot.len() >= 10, "{} reads", by_slot.len());
    let (mut all_cpu, mut all_span) = (0, 0);
    for ((s, e), total) in by_slot {
        let want = (e - s) * cpus;
        let off = total.abs_diff(want);
        assert!(
            off * 100 <= want * 15 || off <= 5_000 * cpus,
            "slot {s}..{e}: {total} us of CPU time for {want} us of {cpus} CPUs"
        );
        all_cpu += total;
        all_span += want;
    }
    assert!(
        all_cpu.abs_diff(all_span) * 20 <= all_span,
        "{all_cpu} us of CPU time over {all_span} us of {cpus} CPUs"
    );
}
