//! What the generic `trace` probe costs.
//!
//! (a) Kernel cost per event of the generic BPF program against a
//! hand-written plugin recording the same fields, from each run's
//! `collector_overhead` (the kernel's BPF run-time statistics):
//! `quanta_runtime`'s switch program against
//! `tp_btf:sched_switch(prev->pid, prev->tgid)` under a pinned
//! `perf bench sched pipe`, and `process_trace`'s exec program against
//! `tp_btf:sched_process_exec(p->pid)` under execs of `/bin/true` (both
//! rows: time, pid, tgid, and the comm for exec). Runs alternate.
//!
//! (b) A pinned `perf bench sched pipe` with `sched:sched_switch` (prev and
//! next pid, prev state) traced by `trace`, by `perf record -e` and by
//! `bpftrace` printing the same fields, side by side in one run (rounds
//! alternate the four): each one's slowdown against the untraced pipe,
//! and the events `trace` lost (its manifest's `lost_events`).
//!
//! Needs root, `perf`, `bpftrace` (installed with apt-get when missing)
//! and `cargo xtask build-plugins`:
//! `cargo run --release -p kernmlops-benchmarks --bin trace_cost -- [ROUNDS] [--cost-only]`
//! (`--cost-only`: part (a) only).

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use common::{program_costs, Scratch};
use kernmlops_benchmarks::{median, release_host, run_checked, sched_pipe, workspace, Collecting};

mod common;

/// Pipe round trips per measured `perf bench sched pipe`.
const PIPE_LOOPS: u32 = 200_000;
/// Execs per exec workload.
const EXECS: usize = 400;

/// A child killed and reaped when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn execs() -> Result<()> {
    for _ in 0..EXECS {
        run_checked(Command::new("/bin/true").stdout(Stdio::null()), "/bin/true")?;
    }
    Ok(())
}

fn pipe() -> Result<()> {
    sched_pipe(PIPE_LOOPS / 2, true)
}

/// One run of `probe` around `workload`; the per-event cost of the
/// program of `probe` whose name contains `program`: (events, ns/event).
fn cost_once(
    bin: &Path,
    out: &Path,
    probe: &str,
    config: Option<&Path>,
    program: &str,
    workload: &dyn Fn() -> Result<()>,
) -> Result<(u64, f64)> {
    let extra = match config {
        Some(c) => vec![OsStr::new("--config"), c.as_os_str()],
        None => Vec::new(),
    };
    program_costs(bin, out, probe, &extra, workload)?
        .into_iter()
        .filter(|(name, _, _)| name.contains(program))
        .map(|(_, events, ns)| (events, ns))
        .max_by_key(|(events, _)| *events)
        .with_context(|| format!("{probe}: no program {program} ran"))
}

/// `bpftrace` installed, with apt-get when missing.
fn ensure_bpftrace() -> Result<()> {
    let found = Command::new("sh")
        .args(["-c", "command -v bpftrace"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        eprintln!("installing bpftrace (apt-get install -y bpftrace)");
        run_checked(
            Command::new("apt-get")
                .args(["install", "-y", "-q", "bpftrace"])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .stdout(Stdio::null()),
            "apt-get install bpftrace",
        )?;
    }
    Ok(())
}

/// Seconds of one pinned `perf bench sched pipe`.
fn timed_pipe() -> Result<f64> {
    let t = Instant::now();
    sched_pipe(PIPE_LOOPS, true)?;
    Ok(t.elapsed().as_secs_f64())
}

/// Starts `bpftrace` printing each switch's prev and next pid and prev
/// state (to a file), once it records.
fn bpftrace(out: &Path) -> Result<Child> {
    // Switches are many a second: past its "Attaching 1 probe..." line the
    // file grows as soon as it records.
    start_recorder(
        "bpftrace",
        &[
            "-e",
            "tracepoint:sched:sched_switch { printf(\"%d %d %d\\n\", args->prev_pid, args->next_pid, args->prev_state); }",
            "-o",
        ],
        out,
        4096,
    )
}

/// Starts `perf record -e sched:sched_switch` system-wide into `out`.
fn perf_record(out: &Path) -> Result<Child> {
    // perf has no readiness signal: its file grows past the header once
    // it records.
    let child = start_recorder(
        "perf",
        &["record", "-q", "-a", "-e", "sched:sched_switch", "-o"],
        out,
        1,
    )?;
    std::thread::sleep(Duration::from_millis(500));
    Ok(child)
}

/// Starts `program` with `args` and then `out`, its output file, quiet;
/// returns once it has written `min_len` bytes there (it records), within
/// 60 s.
fn start_recorder(program: &str, args: &[&str], out: &Path, min_len: u64) -> Result<Child> {
    let mut child = Child(
        Command::new(program)
            .args(args)
            .arg(out)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {program}"))?,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::metadata(out).map_or(0, |m| m.len()) < min_len {
        if let Some(status) = child.0.try_wait()? {
            bail!("{program} exited ({status}) before recording");
        }
        if Instant::now() > deadline {
            bail!("{program} did not start recording in 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(child)
}

fn stop(child: Child) -> Result<()> {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGINT) };
    let mut child = child;
    child.0.wait()?;
    Ok(())
}

fn main() -> Result<()> {
    let mut rounds = 3;
    let mut cost_only = false;
    for a in std::env::args().skip(1) {
        if a == "--cost-only" {
            cost_only = true;
        } else {
            rounds = a
                .parse()
                .with_context(|| format!("ROUNDS {a:?}: a whole number, or --cost-only"))?;
        }
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("needs root (BPF programs and their kernel statistics)");
    }
    let bin = release_host()?;
    if !cost_only {
        ensure_bpftrace()?;
    }
    let scratch =
        Scratch(std::env::temp_dir().join(format!("kml-trace-cost-{}", std::process::id())));
    let data = scratch.0.join("data");
    std::fs::create_dir_all(&data)?;
    let write = |name: &str, text: &str| -> Result<PathBuf> {
        let p = scratch.0.join(name);
        std::fs::write(&p, text)?;
        Ok(p)
    };
    let switch_cfg = write(
        "switch.toml",
        "[probes.trace]\nevents = [\"tp_btf:sched_switch(prev->pid, prev->tgid)\"]\ncomm = false\n",
    )?;
    let exec_cfg = write(
        "exec.toml",
        "[probes.trace]\nevents = [\"tp_btf:sched_process_exec(p->pid)\"]\n",
    )?;
    let pipe_cfg = write(
        "pipe.toml",
        "[probes.trace]\nevents = [\"sched:sched_switch(prev_pid, next_pid, prev_state)\"]\ncomm = false\n",
    )?;

    // (a) Kernel cost per event, runs alternating.
    let (mut q, mut ts, mut p, mut te) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        q.push(cost_once(
            &bin,
            &data,
            "quanta_runtime",
            None,
            "switch",
            &pipe,
        )?);
        ts.push(cost_once(
            &bin,
            &data,
            "trace",
            Some(&switch_cfg),
            "trace",
            &pipe,
        )?);
        p.push(cost_once(
            &bin,
            &data,
            "process_trace",
            None,
            "exec",
            &execs,
        )?);
        te.push(cost_once(
            &bin,
            &data,
            "trace",
            Some(&exec_cfg),
            "trace",
            &execs,
        )?);
    }
    let ns = |v: &[(u64, f64)]| median(&mut v.iter().map(|x| x.1).collect::<Vec<_>>());
    let events = |v: &[(u64, f64)]| v.iter().map(|x| x.0).collect::<Vec<_>>();
    let cost = serde_json::json!({
        "switch": {
            "quanta_runtime_ns": ns(&q).round(),
            "trace_ns": ns(&ts).round(),
            "trace_over_hand_written": (ns(&ts) / ns(&q) * 100.0).round() / 100.0,
            "events_quanta_runtime": events(&q),
            "events_trace": events(&ts),
        },
        "exec": {
            "process_trace_ns": ns(&p).round(),
            "trace_ns": ns(&te).round(),
            "trace_over_hand_written": (ns(&te) / ns(&p) * 100.0).round() / 100.0,
            "events_process_trace": events(&p),
            "events_trace": events(&te),
        },
    });
    if cost_only {
        println!(
            "{}",
            serde_json::json!({"benchmark": "trace_cost", "rounds": rounds, "cost_per_event": cost})
        );
        return Ok(());
    }

    // (b) The pipe untraced and traced three ways, rounds alternating.
    let (mut base, mut tr, mut pr, mut bt) = (vec![], vec![], vec![], vec![]);
    let mut lost = Vec::new();
    let mut recorded = Vec::new();
    for _ in 0..rounds {
        base.push(timed_pipe()?);

        let mut run = Command::new(&bin);
        run.arg("--config")
            .arg(&pipe_cfg)
            .args(["run", "--plugins", "trace", "--plugin-dir"])
            .arg(workspace().join("plugins"))
            .arg("--output")
            .arg(&data);
        let collecting = Collecting::start(run)?;
        let t = timed_pipe();
        collecting.interrupt();
        let man = collecting.wait()?.manifest;
        tr.push(t?);
        lost.push(
            man["tables"]["sched_switch"]["lost_events"]
                .as_u64()
                .context("no lost_events for sched_switch")?,
        );
        recorded.push(man["tables"]["sched_switch"]["rows"].as_u64().unwrap_or(0));

        let perf_out = scratch.0.join("perf.data");
        let perf = perf_record(&perf_out)?;
        let t = timed_pipe();
        stop(perf)?;
        pr.push(t?);
        let _ = std::fs::remove_file(&perf_out);

        let bt_out = scratch.0.join("bpftrace.txt");
        let b = bpftrace(&bt_out)?;
        let t = timed_pipe();
        stop(b)?;
        bt.push(t?);
        let _ = std::fs::remove_file(&bt_out);
    }
    let b = median(&mut base);
    let slow = |v: &mut Vec<f64>| (median(v) / b * 1000.0).round() / 1000.0;
    println!(
        "{}",
        serde_json::json!({
            "benchmark": "trace_cost",
            "rounds": rounds,
            "cost_per_event": cost,
            "sched_pipe_pinned": {
                "loops": PIPE_LOOPS,
                "untraced_s_median": (b * 1000.0).round() / 1000.0,
                "slowdown_trace": slow(&mut tr),
                "slowdown_perf_record": slow(&mut pr),
                "slowdown_bpftrace": slow(&mut bt),
                "trace_lost_events": lost,
                "trace_rows": recorded,
            },
        })
    );
    Ok(())
}
