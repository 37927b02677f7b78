//! Collector overhead on `perf bench sched pipe`, events lost at that rate,
//! the kernel cost per event of each BPF program, and start-up time (load,
//! verify, attach) of the default plugins. A third mode runs the
//! `empty_switch` fixture (empty programs on the same tracepoints) for the
//! floor: what attaching there costs before a program does anything; a
//! fourth adds a program that only reads `CLOCK_BOOTTIME`, for that read's
//! cost (its cost per event less the empty program's).
//! `pinned_ratio_above_floor` is the pinned ratio less the empty programs':
//! what the collection costs beyond attaching to the tracepoints at all.
//!
//! Needs root and a release build (`cargo xtask build-plugins`, and
//! `cargo build --release -p fixture_empty_switch`):
//! `cargo run --release -p kernmlops-benchmarks --bin sched_overhead -- [RUNS] [LOOPS]`

use std::{path::Path, process::Command, time::Instant};

use anyhow::{bail, Context, Result};
use kernmlops_benchmarks::{median, release_host, sched_pipe, workspace, Args, Collecting};

/// Runs the benchmark once and returns its wall time in seconds.
fn bench(loops: u32, pinned: bool) -> Result<f64> {
    let t = Instant::now();
    sched_pipe(loops, pinned)?;
    Ok(t.elapsed().as_secs_f64())
}

struct Collected {
    bench_s: f64,
    startup_ms: f64,
    rows: u64,
    lost: u64,
    seconds: f64,
    /// Kernel nanoseconds per event of each BPF program, from the run's
    /// `collector_overhead`.
    ns_per_event: Vec<(String, f64)>,
}

/// What a run collects: its plugins, the folder they are in and a
/// configuration file.
struct Setup<'a> {
    plugins: &'a str,
    plugin_dir: &'a Path,
    config: Option<&'a Path>,
}

fn collected(bin: &Path, setup: &Setup, out: &Path, loops: u32, pinned: bool) -> Result<Collected> {
    let mut run = Command::new(bin);
    run.args(["run", "--plugins", setup.plugins, "--plugin-dir"])
        .arg(setup.plugin_dir)
        .arg("--output")
        .arg(out);
    if let Some(config) = setup.config {
        run.arg("--config").arg(config);
    }
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
    let ns_per_event = man["collector_overhead"]["programs"]
        .as_array()
        .map(|programs| {
            programs
                .iter()
                .filter_map(|p| {
                    Some((
                        p["program"].as_str()?.to_owned(),
                        p["ns_per_event"].as_f64()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Collected {
        bench_s,
        startup_ms,
        rows,
        lost,
        seconds,
        ns_per_event,
    })
}

/// A plugin folder holding the `empty_switch` fixture (empty programs on
/// the tracepoints `quanta_runtime` uses), for the floor of the cost.
fn floor_plugins(out: &Path) -> Result<std::path::PathBuf> {
    let built = workspace().join("target/release/libfixture_empty_switch.so");
    if !built.is_file() {
        bail!(
            "{} missing: run `cargo build --release -p fixture_empty_switch` first",
            built.display()
        );
    }
    let dir = out.join("floor-plugins");
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let placed = dir.join("empty_switch.so");
    std::fs::copy(&built, &placed)?;
    std::fs::set_permissions(&placed, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(dir)
}

fn main() -> Result<()> {
    let mut args = Args::from_env();
    let runs: usize = args.next_or(5)?;
    let loops: u32 = args.next_or(200_000)?;
    let bin = release_host()?;
    let plugins = workspace().join("plugins");
    let out = std::env::temp_dir().join(format!("kml-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&out)?;
    let floor_dir = floor_plugins(&out)?;
    let clock_config = out.join("clock.toml");
    std::fs::write(&clock_config, "[probes.empty_switch]\nclock = true\n")?;
    let default = Setup {
        plugins: "quanta_runtime,process_trace",
        plugin_dir: &plugins,
        config: None,
    };
    let floor = Setup {
        plugins: "empty_switch",
        plugin_dir: &floor_dir,
        config: None,
    };
    let clock = Setup {
        config: Some(&clock_config),
        ..floor
    };

    bench(loops / 10, false)?; // warm up
    let mut startup = Vec::new();
    let mut modes = serde_json::Map::new();
    for (mode, setup, pinned) in [
        ("spread", &default, false),
        ("pinned_cpu0", &default, true),
        ("pinned_cpu0_empty_programs", &floor, true),
        ("pinned_cpu0_clock_read", &clock, true),
    ] {
        let (mut base, mut with, mut rates) = (vec![], vec![], vec![]);
        let mut lost = 0;
        let mut costs: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
        for _ in 0..runs {
            base.push(bench(loops, pinned)?);
            let c = collected(&bin, setup, &out, loops, pinned)?;
            with.push(c.bench_s);
            // Start-up is reported for the default probes only.
            if setup.plugins == default.plugins {
                startup.push(c.startup_ms);
            }
            rates.push(c.rows as f64 / c.seconds);
            lost += c.lost;
            for (program, ns) in c.ns_per_event {
                costs.entry(program).or_default().push(ns);
            }
        }
        let (b, w) = (median(&mut base), median(&mut with));
        let costs: serde_json::Map<String, serde_json::Value> = costs
            .into_iter()
            .map(|(program, mut ns)| (program, (median(&mut ns).round()).into()))
            .collect();
        modes.insert(
            mode.into(),
            serde_json::json!({
                "baseline_s_median": b,
                "collected_s_median": w,
                "overhead_ratio": w / b,
                "switch_rows_per_s_median": median(&mut rates).round(),
                "lost_events_total": lost,
                "kernel_ns_per_event_median": costs,
            }),
        );
    }
    // What collecting costs beyond attaching at all: the pinned ratio less
    // the empty programs' (this machine's floor with statistics on).
    let ratio = |mode: &str| modes.get(mode).and_then(|m| m["overhead_ratio"].as_f64());
    let above_floor = ratio("pinned_cpu0")
        .zip(ratio("pinned_cpu0_empty_programs"))
        .map(|(r, floor)| r - floor);
    println!(
        "{}",
        serde_json::json!({
            "benchmark": "sched_overhead",
            "runs": runs,
            "loops": loops,
            "modes": modes,
            "pinned_ratio_above_floor": above_floor,
            "startup_ms_median": median(&mut startup),
        })
    );
    std::fs::remove_dir_all(&out).ok();
    Ok(())
}
