//! Time the experiment layer adds per run beyond the collection itself:
//! a 20-run sweep of a trivial `script` benchmark through `kernmlops
//! experiment run`, against the same 20 runs as plain `kernmlops run`
//! invocations with the very configuration files the experiment wrote.
//! The difference, divided by 20, is what planning, the record, locks,
//! state reading, the results table and statistics (and, in the second
//! figure, the graphs) cost per run.
//!
//! Needs root and a release build (`cargo xtask build-plugins`):
//! `cargo run --release -p kernmlops-benchmarks --bin experiment_overhead -- [ROUNDS] [PLUGIN_DIR]`

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Result};
use kernmlops_benchmarks::{median, release_host, run_checked, workspace};

/// Runs in the sweep.
const RUNS: usize = 20;

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

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(3);
    let plugins = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("plugins"));
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
        })
    );
    std::fs::remove_dir_all(&work).ok();
    Ok(())
}
