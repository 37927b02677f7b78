//! Collector overhead on `perf bench sched pipe`, events lost at that rate,
//! and start-up time (load, verify, attach) of the default plugins.
//!
//! Needs root and a release build (`cargo xtask build-plugins`):
//! `cargo run --release -p kernmlops-benchmarks --bin sched_overhead -- [RUNS] [LOOPS]`

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context, Result};
use kernmlops_benchmarks::{median, release_host, workspace, Collecting};

/// Runs the benchmark once and returns its wall time in seconds. Pinned to
/// CPU 0, both ends of the pipe share a CPU: no idle in between, the highest
/// switch rate.
fn bench(loops: u32, pinned: bool) -> Result<f64> {
    let t = Instant::now();
    let mut cmd = if pinned {
        let mut c = Command::new("taskset");
        c.args(["-c", "0", "perf"]);
        c
    } else {
        Command::new("perf")
    };
    let status = cmd
        .args(["bench", "sched", "pipe", "-l", &loops.to_string()])
        .stdout(Stdio::null())
        .status()
        .context("running perf bench (apt-get install linux-perf)")?;
    if !status.success() {
        bail!("perf bench failed");
    }
    Ok(t.elapsed().as_secs_f64())
}

struct Collected {
    bench_s: f64,
    startup_ms: f64,
    rows: u64,
    lost: u64,
    seconds: f64,
}

fn collected(
    bin: &Path,
    plugins: &Path,
    out: &Path,
    loops: u32,
    pinned: bool,
) -> Result<Collected> {
    let mut run = Command::new(bin);
    run.args([
        "run",
        "--plugins",
        "quanta_runtime,process_trace",
        "--plugin-dir",
    ])
    .arg(plugins)
    .arg("--output")
    .arg(out);
    let collecting = Collecting::start(run)?;
    let startup_ms = collecting.startup.as_secs_f64() * 1e3;
    let t = Instant::now();
    let bench_s = bench(loops, pinned)?;
    let seconds = t.elapsed().as_secs_f64();
    collecting.interrupt();
    let man = collecting.wait()?.manifest;
    let tables = man["tables"].as_object().context("tables")?;
    let rows = tables
        .get("quanta_runtime")
        .and_then(|t| t["rows"].as_u64())
        .unwrap_or(0);
    let lost = tables
        .values()
        .filter_map(|t| t["lost_events"].as_u64())
        .sum();
    Ok(Collected {
        bench_s,
        startup_ms,
        rows,
        lost,
        seconds,
    })
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(5);
    let loops: u32 = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(200_000);
    let bin = release_host()?;
    let plugins = workspace().join("plugins");
    let out = std::env::temp_dir().join(format!("kml-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&out)?;

    bench(loops / 10, false)?; // warm up
    let mut startup = Vec::new();
    let mut modes = serde_json::Map::new();
    for (mode, pinned) in [("spread", false), ("pinned_cpu0", true)] {
        let (mut base, mut with, mut rates) = (vec![], vec![], vec![]);
        let mut lost = 0;
        for _ in 0..runs {
            base.push(bench(loops, pinned)?);
            let c = collected(&bin, &plugins, &out, loops, pinned)?;
            with.push(c.bench_s);
            startup.push(c.startup_ms);
            rates.push(c.rows as f64 / c.seconds);
            lost += c.lost;
        }
        let (b, w) = (median(&mut base), median(&mut with));
        modes.insert(
            mode.into(),
            serde_json::json!({
                "baseline_s_median": b,
                "collected_s_median": w,
                "overhead_ratio": w / b,
                "switch_rows_per_s_median": median(&mut rates).round(),
                "lost_events_total": lost,
            }),
        );
    }
    println!(
        "{}",
        serde_json::json!({
            "benchmark": "sched_overhead",
            "runs": runs,
            "loops": loops,
            "modes": modes,
            "startup_ms_median": median(&mut startup),
        })
    );
    std::fs::remove_dir_all(&out).ok();
    Ok(())
}
