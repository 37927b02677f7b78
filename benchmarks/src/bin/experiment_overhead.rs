//! Time the experiment layer adds per run beyond the collection itself:
//! a 20-run sweep of a trivial `script` benchmark through `kernmlops
//! experiment run`, against the same 20 runs as plain `kernmlops run`
//! invocations with the very configuration files the experiment wrote.
//! The difference, divided by 20, is what planning, the record, locks,
//! state reading, the results table and statistics (and, in the second
//! figure, the graphs) cost per run.
//!
//! Then the kernel knobs' cost per run: `KNOB_RUNS` runs of the same
//! benchmark with three knobs (a sysctl, a sysfs file and the benchmark's
//! CPUs, each set to the value it has, so the machine does not change)
//! against as many without, interleaved; the difference of the medians is
//! what checking, journalling, setting, reading back and restoring them
//! cost (the issue asks for under 50 ms).
//!
//! Needs root and a release build (`cargo xtask build-plugins`):
//! `cargo run --release -p kernmlops-benchmarks --bin experiment_overhead -- [ROUNDS] [PLUGIN_DIR]`
//! (`EXPERIMENT_OVERHEAD_ONLY=knobs` measures the knobs alone).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Result};
use kernmlops_benchmarks::{median, release_host, run_checked, workspace, Args};

/// Runs in the sweep.
const RUNS: usize = 20;
/// Runs each way (with knobs, without) for the knobs' cost.
const KNOB_RUNS: usize = 30;

fn quiet(cmd: &mut Command) -> Result<()> {
    let what = format!("{cmd:?}");
    run_checked(cmd.stdout(Stdio::null()).stderr(Stdio::null()), &what)
}

/// Seconds for the whole experiment, and its folder.
fn experiment(bin: &Path, plugins: &Path, file: &Path, dir: &Path, graphs: bool) -> Result<f64> {
    let _ = std::fs::remove_dir_all(dir);
    let mut cmd = Command::new(bin);
    cmd.arg("--plugin-dir")
        .arg(plugins)
        .args(["experiment", "run"])
        .arg(file)
        .arg("--dir")
        .arg(dir)
        .args(["--order", "sequential"]);
    if !graphs {
        cmd.arg("--no-graphs");
    }
    let t = Instant::now();
    quiet(&mut cmd)?;
    Ok(t.elapsed().as_secs_f64())
}

/// Seconds for the same runs as plain `kernmlops run`, one after another,
/// with the configuration files the experiment wrote.
fn direct(bin: &Path, plugins: &Path, exp_dir: &Path, out: &Path) -> Result<f64> {
    let mut configs: Vec<PathBuf> = std::fs::read_dir(exp_dir.join("configs"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    configs.sort();
    if configs.len() != RUNS {
        bail!("{} run configurations, expected {RUNS}", configs.len());
    }
    let _ = std::fs::remove_dir_all(out);
    std::fs::create_dir_all(out)?;
    let t = Instant::now();
    for (i, config) in configs.iter().enumerate() {
        quiet(
            Command::new(bin)
                .arg("--plugin-dir")
                .arg(plugins)
                .arg("--config")
                .arg(config)
                .arg("run")
                .arg("--collection-dir")
                .arg(out.join(i.to_string()))
                .args(["--benchmark", "script", "--baseline"]),
        )?;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Seconds for one `kernmlops run` of the script benchmark with `cfg`.
fn one_run(bin: &Path, plugins: &Path, cfg: &Path, out: &Path) -> Result<f64> {
    let _ = std::fs::remove_dir_all(out);
    let t = Instant::now();
    quiet(
        Command::new(bin)
            .arg("--plugin-dir")
            .arg(plugins)
            .arg("--config")
            .arg(cfg)
            .arg("run")
            .arg("--collection-dir")
            .arg(out)
            .args(["--benchmark", "script", "--baseline"]),
    )?;
    Ok(t.elapsed().as_secs_f64())
}

/// The knobs' cost per run: medians of runs with three knobs and without,
/// interleaved, in milliseconds.
fn knobs_cost(bin: &Path, plugins: &Path, work: &Path, script: &Path) -> Result<serde_json::Value> {
    let read = |p: &str| -> Result<String> { Ok(std::fs::read_to_string(p)?.trim().to_owned()) };
    let bench = format!(
        "[benchmarks.script]\ncommand = [{:?}]\ndrop_page_cache = false\n",
        script.display().to_string()
    );
    let plain = work.join("plain.toml");
    std::fs::write(&plain, &bench)?;
    let knobs = work.join("knobs.toml");
    std::fs::write(
        &knobs,
        format!(
            "{bench}[machine]\ncpus = {:?}\n[machine.sysctl]\n\"vm.dirty_expire_centisecs\" = {}\n\
             [machine.sysfs]\n\"kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs\" = {}\n",
            read("/sys/devices/system/cpu/online")?,
            read("/proc/sys/vm/dirty_expire_centisecs")?,
            read("/sys/kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs")?,
        ),
    )?;
    let out = work.join("knob-run");
    // Warm-up.
    one_run(bin, plugins, &plain, &out)?;
    one_run(bin, plugins, &knobs, &out)?;
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for i in 0..KNOB_RUNS {
        // Alternate which goes first, so drift does not favour one.
        if i % 2 == 0 {
            with.push(one_run(bin, plugins, &knobs, &out)? * 1e3);
            without.push(one_run(bin, plugins, &plain, &out)? * 1e3);
        } else {
            without.push(one_run(bin, plugins, &plain, &out)? * 1e3);
            with.push(one_run(bin, plugins, &knobs, &out)? * 1e3);
        }
    }
    let (w, wo) = (median(&mut with), median(&mut without));
    Ok(serde_json::json!({
        "knob_runs_each_way": KNOB_RUNS,
        "knobs": ["cpus", "sysctl.vm.dirty_expire_centisecs", "sysfs.kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs"],
        "run_with_knobs_ms_median": w,
        "run_without_knobs_ms_median": wo,
        "knobs_cost_per_run_ms": w - wo,
        "with_over_without": w / wo,
    }))
}

fn main() -> Result<()> {
    let mut args = Args::from_env();
    let rounds: usize = args.next_or(3)?;
    let plugins: PathBuf = args.next_or(workspace().join("plugins"))?;
    let bin = release_host()?;
    let work = std::env::temp_dir().join(format!("kml-experiment-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let script = work.join("noop.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\necho '{\"name\": \"noop\", \"component\": \"sh\", \"@result\": {\"x\": 1}}'\n",
    )?;
    quiet(Command::new("chmod").arg("+x").arg(&script))?;
    let file = work.join("sweep.toml");
    std::fs::write(
        &file,
        format!(
            "name = \"overhead\"\nbenchmark = \"script\"\nprobes = []\nrepeats = 2\nseed = 1\n\
             [config.benchmarks.script]\ncommand = [{:?}]\ndrop_page_cache = false\n\
             [variables.n]\nrange = {{ start = 1, end = {} }}\n",
            script.display().to_string(),
            RUNS / 2
        ),
    )?;
    if std::env::var("EXPERIMENT_OVERHEAD_ONLY").as_deref() == Ok("knobs") {
        println!("{}", knobs_cost(&bin, &plugins, &work, &script)?);
        std::fs::remove_dir_all(&work).ok();
        return Ok(());
    }
    let exp_dir = work.join("exp");
    let out = work.join("direct");

    // Warm-up: caches, and the configuration files for the direct runs.
    experiment(&bin, &plugins, &file, &exp_dir, false)?;
    direct(&bin, &plugins, &exp_dir, &out)?;

    let (mut with_graphs, mut without, mut plain) = (vec![], vec![], vec![]);
    let (mut per_run, mut per_run_graphs) = (vec![], vec![]);
    for round in 0..rounds {
        // Alternate which goes first, so drift does not favour one.
        let (e, d) = if round % 2 == 0 {
            let e = experiment(&bin, &plugins, &file, &exp_dir, false)?;
            (e, direct(&bin, &plugins, &exp_dir, &out)?)
        } else {
            let d = direct(&bin, &plugins, &exp_dir, &out)?;
            (experiment(&bin, &plugins, &file, &exp_dir, false)?, d)
        };
        let g = experiment(&bin, &plugins, &file, &exp_dir, true)?;
        per_run.push((e - d) / RUNS as f64);
        per_run_graphs.push((g - d) / RUNS as f64);
        without.push(e);
        with_graphs.push(g);
        plain.push(d);
    }
    println!(
        "{}",
        serde_json::json!({
            "benchmark": "experiment_overhead",
            "runs_per_sweep": RUNS,
            "rounds": rounds,
            "plain_runs_s_median": median(&mut plain),
            "experiment_s_median": median(&mut without),
            "experiment_with_graphs_s_median": median(&mut with_graphs),
            "overhead_per_run_s": per_run.clone(),
            "overhead_per_run_s_median": median(&mut per_run),
            "overhead_per_run_with_graphs_s_median": median(&mut per_run_graphs),
            "knobs": knobs_cost(&bin, &plugins, &work, &script)?,
        })
    );
    std::fs::remove_dir_all(&work).ok();
    Ok(())
}
