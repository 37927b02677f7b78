//! The collector's footprint, as a new user meets it: time from process
//! start to "collecting" with every probe plugin attached (also with
//! `procfs`, `cpu_time` and a `trace` of ten tracepoints; probes starting in
//! parallel, and one after another as before, `KERNMLOPS_SERIAL_START`, the
//! two interleaved in one run), the wall time of
//! a `--duration 1ms` run of the default probes, peak RSS of the default
//! probes and of every probe under `perf bench sched pipe`, the size of
//! each installed plugin, and the kernel cost per event of each BPF program
//! under that load (from the run's own `collector_overhead`).
//!
//! Needs root and `cargo xtask build-plugins`:
//! `cargo run --release -p kernmlops-benchmarks --bin footprint -- [RUNS]`

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::Result;
use kernmlops_benchmarks::{median, release_host, run_checked, sched_pipe, workspace, Collecting};

/// Every probe plugin this repository ships.
const ALL_PROBES: &str = "quanta_runtime,process_trace,process_metadata,file_data,block_io,mm_rss_stat,collapse_huge_pages,memory_usage,perf";
const DEFAULT_PROBES: &str = "quanta_runtime,process_trace";

/// Ten tracepoints for the `trace` probe, as a configuration file.
const TEN_EVENTS: &str = "[probes.trace]\nevents = [\"sched:sched_switch\", \"sched:sched_wakeup\", \"sched:sched_process_fork\", \"block:block_rq_issue\", \"block:block_rq_complete\", \"kmem:mm_page_alloc\", \"writeback:writeback_dirty_folio\", \"net:net_dev_xmit\", \"net:netif_receive_skb\", \"syscalls:sys_enter_write\"]\n";

/// Milliseconds from spawning `kernmlops run` to its "collecting" line;
/// `serial`: probes start one after another.
fn startup_ms(bin: &Path, out: &Path, probes: &str, serial: bool) -> Result<f64> {
    startup_ms_with(bin, out, probes, serial, None)
}

/// [`startup_ms`] with a configuration file.
fn startup_ms_with(
    bin: &Path,
    out: &Path,
    probes: &str,
    serial: bool,
    config: Option<&Path>,
) -> Result<f64> {
    let mut run = Command::new(bin);
    if let Some(c) = config {
        run.arg("--config").arg(c);
    }
    run.args(["run", "--plugins", probes, "--duration", "1ms", "--output"])
        .arg(out);
    if serial {
        run.env(kernmlops::collect::SERIAL_START_ENV, "1");
    } else {
        run.env_remove(kernmlops::collect::SERIAL_START_ENV);
    }
    let collecting = Collecting::start(run)?;
    let ms = collecting.startup.as_secs_f64() * 1e3;
    collecting.wait()?;
    Ok(ms)
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

fn main() -> Result<()> {
    let runs: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(5);
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

    let (mut all_start, mut default_start, mut short) = (vec![], vec![], vec![]);
    let mut all_serial = vec![];
    let mut all_trace = vec![];
    let ten = out.join("ten-events.toml");
    std::fs::write(&ten, TEN_EVENTS)?;
    let all_and_trace = format!("{ALL_PROBES},procfs,cpu_time,trace");
    for _ in 0..runs {
        all_trace.push(startup_ms_with(
            &bin,
            &out,
            &all_and_trace,
            false,
            Some(&ten),
        )?);
        all_start.push(startup_ms(&bin, &out, ALL_PROBES, false)?);
        all_serial.push(startup_ms(&bin, &out, ALL_PROBES, true)?);
        default_start.push(startup_ms(&bin, &out, DEFAULT_PROBES, false)?);
        short.push(short_run_s(&bin, &out, DEFAULT_PROBES)? * 1e3);
    }
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
            "startup_all_probes_ms_median": median(&mut all_start).round(),
            "startup_every_probe_and_ten_event_trace_ms_median": median(&mut all_trace).round(),
            "startup_every_probe_and_ten_event_trace_ms": all_trace,
            "startup_all_probes_one_after_another_ms_median": median(&mut all_serial).round(),
            "startup_all_probes_parallel_over_one_after_another":
                (median(&mut all_start) / median(&mut all_serial) * 100.0).round() / 100.0,
            "startup_default_probes_ms_median": median(&mut default_start).round(),
            "run_1ms_default_probes_wall_ms_median": median(&mut short).round(),
            "peak_rss_mib_default_probes_under_pipe": rss_mib(&loaded_default),
            "peak_rss_mib_all_probes_under_pipe": rss_mib(&loaded_all),
            "default_probes_under_pipe": overhead(&loaded_default),
        })
    );
    std::fs::remove_dir_all(&out).ok();
    Ok(())
}
