//! The collector's footprint, as a new user meets it: time from process
//! start to "collecting" for (a) the default probes and (b) every probe
//! plugin with `procfs`, `cpu_time` and a `trace` of ten tracepoints, each
//! as now (only the plugins a run names are opened) and as before (every
//! plugin of the folder, `KERNMLOPS_LOAD_EVERY_PLUGIN`), interleaved in one
//! run, with the median of each start-up step's wall and CPU time
//! (`KERNMLOPS_STARTUP_TIMES`) and the machine's load average; every probe
//! plugin starting in parallel and one after another
//! (`KERNMLOPS_SERIAL_START`); the wall time of a `--duration 1ms` run of
//! the default probes, peak RSS of the default probes and of every probe
//! under `perf bench sched pipe`, the size of each installed plugin, and
//! the kernel cost per event of each BPF program under that load (from the
//! run's own `collector_overhead`).
//!
//! With `--before DIR` (a plugin folder of the previous code, e.g. a copy
//! of `plugins/` built from the commit to compare against), every probe
//! with the ten-event trace also starts from DIR, interleaved with the
//! others, and the report gives the ratio of each median to it. The
//! medians end up on standard error as a table too.
//!
//! Needs root and `cargo xtask build-plugins`:
//! `cargo run --release -p kernmlops-benchmarks --bin footprint -- [RUNS] [--before DIR]`
//! (RUNS, at least 10 by default, start-ups of each kind).

use std::{
    collections::BTreeMap,
    io::BufRead as _,
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result};
use kernmlops::{collect::startup, plugin::LOAD_EVERY_PLUGIN_ENV};
use kernmlops_benchmarks::{median, release_host, run_checked, sched_pipe, workspace, Collecting};

/// Every probe plugin this repository ships.
const ALL_PROBES: &str = "quanta_runtime,process_trace,process_metadata,file_data,block_io,mm_rss_stat,collapse_huge_pages,memory_usage,perf";
const DEFAULT_PROBES: &str = "quanta_runtime,process_trace";

/// Ten tracepoints for the `trace` probe, as a configuration file.
const TEN_EVENTS: &str = "[probes.trace]\nevents = [\"sched:sched_switch\", \"sched:sched_wakeup\", \"sched:sched_process_fork\", \"block:block_rq_issue\", \"block:block_rq_complete\", \"kmem:mm_page_alloc\", \"writeback:writeback_dirty_folio\", \"net:net_dev_xmit\", \"net:netif_receive_skb\", \"syscalls:sys_enter_write\"]\n";

/// How a start-up is made.
#[derive(Clone, Copy)]
struct Mode<'a> {
    /// Probes start one after another.
    serial: bool,
    /// Every plugin of the folder is opened, as before.
    every_plugin: bool,
    /// Plugins come from this folder instead of `plugins/`.
    plugin_dir: Option<&'a Path>,
}

const NOW: Mode<'static> = Mode {
    serial: false,
    every_plugin: false,
    plugin_dir: None,
};

/// One start-up: milliseconds from spawning `kernmlops run` to its
/// "collecting" line, and each step's (wall, CPU) milliseconds.
struct Startup {
    ms: f64,
    steps: Vec<(String, f64, f64)>,
}

/// Starts `kernmlops run --plugins PROBES --duration 1ms` (with `config`)
/// and times it to its "collecting" line.
fn startup(
    bin: &Path,
    out: &Path,
    probes: &str,
    mode: Mode<'_>,
    config: Option<&Path>,
) -> Result<Startup> {
    let mut run = Command::new(bin);
    if let Some(c) = config {
        run.arg("--config").arg(c);
    }
    if let Some(dir) = mode.plugin_dir {
        run.arg("--plugin-dir").arg(dir);
    }
    run.args(["run", "--plugins", probes, "--duration", "1ms", "--output"])
        .arg(out)
        .env(startup::TIMES_ENV, "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (var, on) in [
        (kernmlops::collect::SERIAL_START_ENV, mode.serial),
        (LOAD_EVERY_PLUGIN_ENV, mode.every_plugin),
    ] {
        if on {
            run.env(var, "1");
        } else {
            run.env_remove(var);
        }
    }
    let began = Instant::now();
    let mut child = run.spawn().context("starting kernmlops")?;
    let stderr = std::io::BufReader::new(child.stderr.take().context("stderr")?);
    let (mut ms, mut steps) = (None, Vec::new());
    // Read to the end (the run lasts 1 ms), so its pipe never fills.
    for line in stderr.lines() {
        let line = line?;
        if line.starts_with("collecting ") && ms.is_none() {
            ms = Some(began.elapsed().as_secs_f64() * 1e3);
        }
        steps.extend(startup::parse_line(&line));
    }
    let status = child.wait()?;
    anyhow::ensure!(status.success(), "kernmlops run {probes} failed ({status})");
    let ms = ms.context("kernmlops never said it was collecting")?;
    Ok(Startup { ms, steps })
}

/// Start-ups of one kind: the medians of the total and of each step.
#[derive(Default)]
struct Series {
    ms: Vec<f64>,
    steps: BTreeMap<String, (Vec<f64>, Vec<f64>)>,
    /// Step names in the order the first start-up printed them.
    order: Vec<String>,
}

impl Series {
    fn push(&mut self, s: Startup) {
        self.ms.push(s.ms);
        for (step, wall, cpu) in s.steps {
            if !self.steps.contains_key(&step) {
                self.order.push(step.clone());
            }
            let e = self.steps.entry(step).or_default();
            e.0.push(wall);
            e.1.push(cpu);
        }
    }

    fn median_ms(&mut self) -> f64 {
        median(&mut self.ms)
    }

    /// Median wall and CPU milliseconds of one step.
    fn step_median(&mut self, step: &str) -> Option<(f64, f64)> {
        let (wall, cpu) = self.steps.get_mut(step)?;
        Some((median(wall), median(cpu)))
    }

    /// The medians as lines for a reader: the total, then each step's wall
    /// and CPU time, with its CPU time's ratio to `before`'s when given.
    fn table(&mut self, title: &str, mut before: Option<&mut Series>) -> String {
        let mut out = format!(
            "{title}: {:.0} ms median from process start to \"collecting\" ({} runs)",
            self.median_ms(),
            self.ms.len()
        );
        if let Some(b) = before.as_deref_mut() {
            out += &format!(
                ", {:.0} ms before ({:.2}x)",
                b.median_ms(),
                self.median_ms() / b.median_ms()
            );
        }
        for step in self.order.clone() {
            let Some((wall, cpu)) = self.step_median(&step) else {
                continue;
            };
            out += &format!("\n  {step:<40} {wall:>7.1} ms wall {cpu:>7.1} ms cpu");
            if let Some((_, b)) = before.as_deref_mut().and_then(|b| b.step_median(&step)) {
                if b > 0.0 {
                    out += &format!("  (cpu {:.2}x of {b:.1})", cpu / b);
                }
            }
        }
        out
    }

    /// `{"ms_median", "ms", "steps": [[step, wall median, cpu median], ...]}`.
    fn report(&mut self) -> serde_json::Value {
        let round = |v: f64| (v * 10.0).round() / 10.0;
        let order = self.order.clone();
        let steps: Vec<serde_json::Value> = order
            .iter()
            .filter_map(|step| {
                let (wall, cpu) = self.steps.get_mut(step)?;
                Some(serde_json::json!([
                    step,
                    round(median(wall)),
                    round(median(cpu))
                ]))
            })
            .collect();
        serde_json::json!({
            "ms_median": self.median_ms().round(),
            "ms": self.ms.iter().map(|v| v.round()).collect::<Vec<_>>(),
            "steps_wall_cpu_ms_median": steps,
        })
    }
}

/// The load averages over 1, 5 and 15 minutes.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Wall seconds of a whole `kernmlops run --duration 1ms`.
fn short_run_s(bin: &Path, out: &Path, probes: &str) -> Result<f64> {
    let t = Instant::now();
    run_checked(
        Command::new(bin)
            .args(["run", "--plugins", probes, "--duration", "1ms", "--output"])
            .arg(out)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        "kernmlops run",
    )?;
    Ok(t.elapsed().as_secs_f64())
}

/// Collects with `probes` while `perf bench sched pipe` runs pinned to CPU
/// 0, and returns the run's manifest.
fn under_load(bin: &Path, out: &Path, probes: &str, loops: u32) -> Result<serde_json::Value> {
    let mut run = Command::new(bin);
    run.args(["run", "--plugins", probes, "--output"]).arg(out);
    let collecting = Collecting::start(run)?;
    sched_pipe(loops, true)?;
    collecting.interrupt();
    Ok(collecting.wait()?.manifest)
}

/// `[RUNS] [--before DIR]`.
fn parse_args() -> Result<(usize, Option<std::path::PathBuf>)> {
    let (mut runs, mut before) = (10, None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--before" {
            before = Some(
                args.next()
                    .context("--before needs a plugin folder")?
                    .into(),
            );
        } else {
            runs = arg
                .parse()
                .with_context(|| format!("{arg}: not a number of runs"))?;
        }
    }
    Ok((runs, before))
}

fn main() -> Result<()> {
    let (runs, before_dir) = parse_args()?;
    let bin = release_host()?;
    let plugins = workspace().join("plugins");
    let out = std::env::temp_dir().join(format!("kml-footprint-{}", std::process::id()));
    std::fs::create_dir_all(&out)?;

    let mut sizes = serde_json::Map::new();
    for entry in std::fs::read_dir(&plugins)?.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "so") {
            let name = path.file_stem().map(|s| s.to_string_lossy().into_owned());
            let kib = entry.metadata()?.len().div_ceil(1024);
            sizes.insert(name.unwrap_or_default(), kib.into());
        }
    }

    let ten = out.join("ten-events.toml");
    std::fs::write(&ten, TEN_EVENTS)?;
    let all_and_trace = format!("{ALL_PROBES},procfs,cpu_time,trace");
    let before = Mode {
        every_plugin: true,
        ..NOW
    };
    let serial = Mode {
        serial: true,
        ..NOW
    };
    let load_before = load_average();
    let (mut default_now, mut default_before) = (Series::default(), Series::default());
    let (mut trace_now, mut trace_before) = (Series::default(), Series::default());
    let (mut all_parallel, mut all_serial) = (Series::default(), Series::default());
    let mut trace_previous_code = Series::default();
    let previous_code = Mode {
        plugin_dir: before_dir.as_deref(),
        ..NOW
    };
    let mut short = vec![];
    for _ in 0..runs {
        default_now.push(startup(&bin, &out, DEFAULT_PROBES, NOW, None)?);
        default_before.push(startup(&bin, &out, DEFAULT_PROBES, before, None)?);
        trace_now.push(startup(&bin, &out, &all_and_trace, NOW, Some(&ten))?);
        if before_dir.is_some() {
            trace_previous_code.push(startup(
                &bin,
                &out,
                &all_and_trace,
                previous_code,
                Some(&ten),
            )?);
        }
        trace_before.push(startup(&bin, &out, &all_and_trace, before, Some(&ten))?);
        all_parallel.push(startup(&bin, &out, ALL_PROBES, NOW, None)?);
        all_serial.push(startup(&bin, &out, ALL_PROBES, serial, None)?);
        short.push(short_run_s(&bin, &out, DEFAULT_PROBES)? * 1e3);
    }
    let load_after = load_average();
    let ratio = |now: &mut Series, before: &mut Series| {
        (now.median_ms() / before.median_ms() * 100.0).round() / 100.0
    };
    let previous = before_dir.as_ref().map(|dir| {
        serde_json::json!({
            "plugin_dir": dir,
            "every_probe_and_ten_event_trace": trace_previous_code.report(),
            "now_over_previous_code": ratio(&mut trace_now, &mut trace_previous_code),
        })
    });
    eprintln!("load average {load_before} before, {load_after} after");
    eprintln!("{}", default_now.table("the default probes", None));
    eprintln!(
        "{}",
        trace_now.table(
            "every probe and the ten-event trace",
            before_dir.is_some().then_some(&mut trace_previous_code)
        )
    );
    let startup_report = serde_json::json!({
        "previous_code": previous,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "default_probes": default_now.report(),
        "default_probes_every_plugin_opened": default_before.report(),
        "default_probes_now_over_before": ratio(&mut default_now, &mut default_before),
        "every_probe_and_ten_event_trace": trace_now.report(),
        "every_probe_and_ten_event_trace_every_plugin_opened": trace_before.report(),
        "every_probe_and_ten_event_trace_now_over_before": ratio(&mut trace_now, &mut trace_before),
        "all_probes_parallel_over_one_after_another": ratio(&mut all_parallel, &mut all_serial),
    });
    let loaded_default = under_load(&bin, &out, DEFAULT_PROBES, 200_000)?;
    let loaded_all = under_load(&bin, &out, ALL_PROBES, 200_000)?;
    let overhead = |m: &serde_json::Value| m["collector_overhead"].clone();
    let rss_mib = |m: &serde_json::Value| {
        m["collector_overhead"]["peak_rss_bytes"]
            .as_f64()
            .map(|b| (b / (1 << 20) as f64).round())
    };
    println!(
        "{}",
        serde_json::json!({
            "benchmark": "footprint",
            "runs": runs,
            "plugin_kib": sizes,
            "startup": startup_report,
            "startup_default_probes_ms_median": default_now.median_ms().round(),
            "startup_every_probe_and_ten_event_trace_ms_median": trace_now.median_ms().round(),
            "startup_all_probes_ms_median": all_parallel.median_ms().round(),
            "startup_all_probes_one_after_another_ms_median": all_serial.median_ms().round(),
            "run_1ms_default_probes_wall_ms_median": median(&mut short).round(),
            "peak_rss_mib_default_probes_under_pipe": rss_mib(&loaded_default),
            "peak_rss_mib_all_probes_under_pipe": rss_mib(&loaded_all),
            "default_probes_under_pipe": overhead(&loaded_default),
        })
    );
    std::fs::remove_dir_all(&out).ok();
    Ok(())
}
