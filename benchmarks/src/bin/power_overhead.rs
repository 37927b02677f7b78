//! What power sampling and energy attribution cost: on an idle machine at
//! the default 1 s interval, the collector's CPU time with `--power
//! estimate` against the same run with `--power none` (the difference is
//! power's, start-up included), plus the attribution program's kernel time
//! from the kernel's BPF statistics; and under `perf bench sched pipe`, the
//! attribution program's nanoseconds per context switch and the
//! benchmark's slowdown.
//!
//! Needs root and a release build (`cargo xtask build-plugins`):
//! `cargo run --release -p kernmlops-benchmarks --bin power_overhead -- [SECONDS] [RUNS] [LOOPS]`

use std::{path::Path, process::Command, time::Instant};

use anyhow::Result;
use kernmlops_benchmarks::{median, release_host, sched_pipe, workspace, Args, Collecting};

/// User + system CPU time of this process's reaped children, in seconds.
fn children_cpu_s() -> f64 {
    // SAFETY: rusage is plain old data and getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// One collection's figures.
struct Run {
    /// The collector's CPU time, start to end, in seconds.
    cpu_s: f64,
    wall_s: f64,
    /// The attribution program's runs and kernel time.
    switches: u64,
    bpf_ns: u64,
    /// The workload's wall time, when one ran.
    bench_s: Option<f64>,
}

/// Runs a collection with `--power power` for `seconds`, or while
/// `perf bench sched pipe -l loops` runs when `loops` is given.
fn collect(
    bin: &Path,
    plugins: &Path,
    out: &Path,
    power: &str,
    seconds: u64,
    loops: Option<u32>,
) -> Result<Run> {
    let before = children_cpu_s();
    let started = Instant::now();
    let mut run = Command::new(bin);
    run.args([
        "run",
        "--plugins",
        "memory_usage",
        "--power",
        power,
        "--plugin-dir",
    ])
    .arg(plugins)
    .arg("--output")
    .arg(out);
    if loops.is_none() {
        run.args(["--duration", &format!("{seconds}s")]);
    }
    let collecting = Collecting::start(run)?;
    let bench_s = match loops {
        None => None,
        Some(loops) => {
            let t = Instant::now();
            sched_pipe(loops, false)?;
            collecting.interrupt();
            Some(t.elapsed().as_secs_f64())
        }
    };
    let man = collecting.wait()?.manifest;
    let wall_s = started.elapsed().as_secs_f64();
    let cpu_s = children_cpu_s() - before;
    let program = man["power"]["attribution"]["programs"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "cpu_time_switch"));
    let switches = program.and_then(|p| p["run_cnt"].as_u64()).unwrap_or(0);
    let bpf_ns = program.and_then(|p| p["run_time_ns"].as_u64()).unwrap_or(0);
    Ok(Run {
        cpu_s,
        wall_s,
        switches,
        bpf_ns,
        bench_s,
    })
}

fn bench_alone(loops: u32) -> Result<f64> {
    let t = Instant::now();
    sched_pipe(loops, false)?;
    Ok(t.elapsed().as_secs_f64())
}

fn main() -> Result<()> {
    let mut args = Args::from_env();
    let seconds: u64 = args.next_or(30)?;
    let runs: usize = args.next_or(3)?;
    let loops: u32 = args.next_or(300_000)?;
    let bin = release_host()?;
    let plugins = workspace().join("plugins");
    let out = std::env::temp_dir().join(format!("kml-power-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&out)?;

    // Idle: power against no power, same probes, same length.
    let (mut host_pct, mut bpf_pct, mut total_pct, mut switch_rate) =
        (vec![], vec![], vec![], vec![]);
    for _ in 0..runs {
        let none = collect(&bin, &plugins, &out, "none", seconds, None)?;
        let with = collect(&bin, &plugins, &out, "estimate", seconds, None)?;
        let host = (with.cpu_s / with.wall_s - none.cpu_s / none.wall_s) * 100.0;
        let bpf = with.bpf_ns as f64 / 1e9 / with.wall_s * 100.0;
        host_pct.push(host);
        bpf_pct.push(bpf);
        total_pct.push(host + bpf);
        switch_rate.push(with.switches as f64 / with.wall_s);
    }

    // Context-switch heavy: the program's cost per switch.
    bench_alone(loops / 10)?; // warm up
    let (mut per_switch, mut slowdown) = (vec![], vec![]);
    for _ in 0..runs {
        let alone = bench_alone(loops)?;
        let with = collect(&bin, &plugins, &out, "estimate", 0, Some(loops))?;
        if with.switches > 0 {
            per_switch.push(with.bpf_ns as f64 / with.switches as f64);
        }
        slowdown.push(with.bench_s.unwrap_or(alone) / alone);
    }
    println!(
        "{}",
        serde_json::json!({
            "benchmark": "power_overhead",
            "runs": runs,
            "idle": {
                "seconds": seconds,
                "interval": "1s",
                "host_cpu_percent_of_one_cpu_median": median(&mut host_pct),
                "bpf_cpu_percent_of_one_cpu_median": median(&mut bpf_pct),
                "total_cpu_percent_of_one_cpu_median": median(&mut total_pct),
                "context_switches_per_s_median": median(&mut switch_rate).round(),
            },
            "sched_pipe": {
                "loops": loops,
                "ns_per_context_switch_median": median(&mut per_switch),
                "slowdown_ratio_median": median(&mut slowdown),
            },
        })
    );
    std::fs::remove_dir_all(&out).ok();
    Ok(())
}
