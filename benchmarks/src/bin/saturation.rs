//! Events lost on a saturated machine, and what starves the drain: CPU hogs
//! outnumbering the CPUs (four per CPU, nice 0), a heavy buffered writer
//! (`dd`, 1 GiB at a time) to the disk the collection writes to, with the
//! machine's dirty limits lowered for the run (`vm.dirty_bytes` 2 MiB,
//! background 1 MiB, restored after: every writer then meets the kernel's
//! dirty-page throttling within seconds, as on a machine whose page cache
//! is full of dirty pages), and `perf bench sched pipe` as the event
//! source, while `kernmlops run` collects the default probes at default
//! settings.
//!
//! While it runs, the collector's threads named `kml-*` are sampled every
//! 2 ms (`/proc/<pid>/task/<tid>/{stat,wchan}`): samples blocked in the
//! kernel's dirty-page throttling (`balance_dirty_pages`) or other
//! uninterruptible waits, samples runnable but not running, and each
//! thread's run-queue wait (`schedstat`). The lost events per table come
//! from the run's manifest.
//!
//! Needs root, `perf` and `dd`, and a release build (`cargo xtask
//! build-plugins`):
//! `cargo run --release -p kernmlops-benchmarks --bin saturation -- [SECONDS] [BINARY...]`
//! Each binary (default: this workspace's) runs the same load in turn, so
//! a build before a change and one after are compared in one run. The last
//! line is JSON.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use kernmlops_benchmarks::{release_host, workspace, Collecting};

/// CPU hogs per CPU.
const HOGS_PER_CPU: usize = 4;

/// The lowered dirty limits, so a writer reaches throttling in seconds.
const DIRTY_BYTES: u64 = 2 << 20;
const DIRTY_BACKGROUND_BYTES: u64 = 1 << 20;

/// Sets the dirty limits for the run and restores them when dropped.
struct DirtyLimits {
    saved: Vec<(&'static str, String)>,
}

impl DirtyLimits {
    fn lower() -> Result<Self> {
        let keys = [
            "/proc/sys/vm/dirty_bytes",
            "/proc/sys/vm/dirty_background_bytes",
            "/proc/sys/vm/dirty_ratio",
            "/proc/sys/vm/dirty_background_ratio",
        ];
        let mut saved = Vec::new();
        for k in keys {
            saved.push((k, std::fs::read_to_string(k).with_context(|| k)?));
        }
        let me = Self { saved };
        std::fs::write(keys[0], DIRTY_BYTES.to_string()).context("vm.dirty_bytes")?;
        std::fs::write(keys[1], DIRTY_BACKGROUND_BYTES.to_string())
            .context("vm.dirty_background_bytes")?;
        Ok(me)
    }
}

impl Drop for DirtyLimits {
    fn drop(&mut self) {
        // A ratio written back clears the byte value and the other way
        // round: the non-zero one of each pair goes last.
        for (k, v) in &self.saved {
            if v.trim() == "0" {
                let _ = std::fs::write(k, v.trim());
            }
        }
        for (k, v) in &self.saved {
            if v.trim() != "0" {
                let _ = std::fs::write(k, v.trim());
            }
        }
    }
}

/// Processes of the load, killed when dropped.
struct Load {
    children: Vec<Child>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Starts the hogs, the writer and the event source.
fn start_load(dir: &Path, cpus: usize) -> Result<Load> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Load {
        children: Vec::new(),
        stop: stop.clone(),
        threads: Vec::new(),
    };
    for _ in 0..HOGS_PER_CPU * cpus {
        load.children.push(
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .context("starting a CPU hog")?,
        );
    }
    // dd again and again: a buffered writer always over the dirty limit.
    let file = dir.join("dd.bin");
    let s = stop.clone();
    load.threads.push(std::thread::spawn(move || {
        while !s.load(Ordering::SeqCst) {
            let _ = Command::new("dd")
                .arg("if=/dev/zero")
                .arg(format!("of={}", file.display()))
                .args(["bs=1M", "count=1024"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_file(&file);
    }));
    let s = stop.clone();
    load.threads.push(std::thread::spawn(move || {
        while !s.load(Ordering::SeqCst) {
            let _ = Command::new("perf")
                .args(["bench", "sched", "pipe", "-l", "200000"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }));
    Ok(load)
}

/// What the sampler saw of the collector's `kml-*` threads.
#[derive(Debug, Default, Clone)]
struct Samples {
    total: u64,
    /// Blocked in dirty-page throttling.
    dirty_throttled: u64,
    /// Other uninterruptible waits (I/O).
    blocked: u64,
    /// Runnable, waiting for a CPU (or running).
    runnable: u64,
    /// Run-queue wait summed over the threads, in seconds (`schedstat`).
    run_delay_s: f64,
    /// Wait channels of blocked samples, by name.
    wchans: BTreeMap<String, u64>,
}

/// The collector's drain threads (`kml-<probe>`) and, apart, its writer
/// threads (`kml-w-<probe>`, in builds that have them).
fn kml_threads(pid: u32) -> Vec<(PathBuf, bool)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .map(|t| t.path())
        .filter_map(|t| {
            let comm = std::fs::read_to_string(t.join("comm")).ok()?;
            let kml = comm.starts_with("kml-") && !comm.starts_with("kml-start");
            kml.then(|| (t, comm.starts_with("kml-w-")))
        })
        .collect()
}

/// Samples the drain threads, and the writer threads apart.
fn sample(pid: u32, stop: &AtomicBool) -> (Samples, Samples) {
    let (mut drain, mut writer) = (Samples::default(), Samples::default());
    let mut delays: BTreeMap<PathBuf, (f64, bool)> = BTreeMap::new();
    while !stop.load(Ordering::SeqCst) {
        for (t, is_writer) in kml_threads(pid) {
            let s = if is_writer { &mut writer } else { &mut drain };
            let Ok(stat) = std::fs::read_to_string(t.join("stat")) else {
                continue;
            };
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, r)| r.chars().next())
                .unwrap_or('?');
            s.total += 1;
            match state {
                'D' => {
                    let wchan = std::fs::read_to_string(t.join("wchan")).unwrap_or_default();
                    if wchan.contains("dirty") {
                        s.dirty_throttled += 1;
                    } else {
                        s.blocked += 1;
                    }
                    *s.wchans.entry(wchan).or_default() += 1;
                }
                'R' => s.runnable += 1,
                _ => {}
            }
            if let Some(delay) = std::fs::read_to_string(t.join("schedstat"))
                .ok()
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            {
                delays.insert(t, (delay / 1e9, is_writer));
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    for (d, is_writer) in delays.values() {
        if *is_writer {
            writer.run_delay_s += d;
        } else {
            drain.run_delay_s += d;
        }
    }
    (drain, writer)
}

/// One collection under the load.
struct Outcome {
    bin: PathBuf,
    /// table: (rows, lost)
    tables: BTreeMap<String, (u64, u64)>,
    /// The drain threads, and the writer threads.
    samples: Samples,
    writers: Samples,
    seconds: f64,
}

fn collect(bin: &Path, seconds: u64, cpus: usize) -> Result<Outcome> {
    // The collection goes to the disk the writer fills.
    let base = Path::new("/var/tmp");
    let dir = kernmlops_sys::private::TempDir::new_in(base, "kernmlops-saturation-")
        .context("a temporary folder under /var/tmp")?;
    let _limits = DirtyLimits::lower()?;
    let load = start_load(dir.path(), cpus)?;
    // Let the writer reach the dirty limit and the hogs spread out.
    std::thread::sleep(Duration::from_secs(2));
    let mut run = Command::new(bin);
    run.current_dir(workspace())
        .args(["run", "--duration", &format!("{seconds}s"), "--output"])
        .arg(dir.join("out"));
    let t = Instant::now();
    let collecting = Collecting::start(run)?;
    let stop = Arc::new(AtomicBool::new(false));
    let pid = collecting.pid();
    let s = stop.clone();
    let sampler = std::thread::spawn(move || sample(pid, &s));
    let stopped = collecting.wait();
    stop.store(true, Ordering::SeqCst);
    let (samples, writers) = sampler.join().unwrap_or_default();
    drop(load);
    let stopped = stopped?;
    let mut tables = BTreeMap::new();
    if let Some(t) = stopped.manifest["tables"].as_object() {
        for (name, e) in t {
            if e["probe"] == "host" {
                continue;
            }
            tables.insert(
                name.clone(),
                (
                    e["rows"].as_u64().unwrap_or(0),
                    e["lost_events"].as_u64().unwrap_or(0),
                ),
            );
        }
    }
    Ok(Outcome {
        bin: bin.to_owned(),
        tables,
        samples,
        writers,
        seconds: t.elapsed().as_secs_f64(),
    })
}

/// What the samples point to.
fn mechanism(s: &Samples) -> &'static str {
    let share = |n: u64| n as f64 / s.total.max(1) as f64;
    if share(s.dirty_throttled) >= 0.01 {
        "dirty-page throttling of the drain thread's writes"
    } else if share(s.runnable) >= 0.05 {
        "CPU starvation of the drain threads"
    } else if share(s.blocked) >= 0.01 {
        "drain threads blocked on I/O"
    } else {
        "none seen"
    }
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let seconds: u64 = match args.next() {
        Some(s) => s.parse().context("SECONDS: a whole number")?,
        None => 20,
    };
    let mut bins: Vec<PathBuf> = args.map(PathBuf::from).collect();
    if bins.is_empty() {
        bins.push(release_host()?);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("needs root (BPF, and the dirty limits it lowers for the run)");
    }
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let mut json = Vec::new();
    for bin in &bins {
        let o = collect(bin, seconds, cpus)?;
        let s = &o.samples;
        println!(
            "{} ({:.1} s under {} hogs on {cpus} CPUs, dd to the same disk, perf bench sched pipe):",
            o.bin.display(),
            o.seconds,
            HOGS_PER_CPU * cpus
        );
        let mut tables = serde_json::Map::new();
        for (t, (rows, lost)) in &o.tables {
            let ratio = *lost as f64 / (rows + lost).max(1) as f64;
            println!(
                "  {t:<22} {rows:>10} rows {lost:>10} lost ({:.2}%)",
                ratio * 100.0
            );
            tables.insert(
                t.clone(),
                serde_json::json!({"rows": rows, "lost": lost, "lost_ratio": ratio}),
            );
        }
        println!(
            "  drain threads (kml-<probe>): {} samples, {:.1}% in dirty-page throttling, {:.1}% other blocked, {:.1}% runnable; run-queue wait {:.2} s",
            s.total,
            100.0 * s.dirty_throttled as f64 / s.total.max(1) as f64,
            100.0 * s.blocked as f64 / s.total.max(1) as f64,
            100.0 * s.runnable as f64 / s.total.max(1) as f64,
            s.run_delay_s
        );
        let w = &o.writers;
        if w.total > 0 {
            println!(
                "  writer threads: {} samples, {:.1}% in dirty-page throttling, {:.1}% other blocked, {:.1}% runnable",
                w.total,
                100.0 * w.dirty_throttled as f64 / w.total as f64,
                100.0 * w.blocked as f64 / w.total as f64,
                100.0 * w.runnable as f64 / w.total as f64,
            );
        }
        let top: Vec<String> = {
            let mut w: Vec<_> = s.wchans.iter().collect();
            w.sort_by(|a, b| b.1.cmp(a.1));
            w.iter().take(4).map(|(k, v)| format!("{k} {v}")).collect()
        };
        if !top.is_empty() {
            println!("  blocked in: {}", top.join(", "));
        }
        println!("  points to: {}", mechanism(s));
        json.push(serde_json::json!({
            "binary": o.bin.display().to_string(),
            "seconds": o.seconds,
            "tables": tables,
            "samples": s.total,
            "dirty_throttled": s.dirty_throttled,
            "blocked": s.blocked,
            "runnable": s.runnable,
            "run_delay_s": s.run_delay_s,
            "mechanism": mechanism(s),
            "writer_samples": o.writers.total,
            "writer_dirty_throttled": o.writers.dirty_throttled,
        }));
    }
    println!("{}", serde_json::Value::Array(json));
    Ok(())
}
