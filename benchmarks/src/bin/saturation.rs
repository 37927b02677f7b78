//! Events lost on a saturated machine, and what starves the drain. The load
//! combines what a shared research machine does at once:
//! - CPU hogs outnumbering the CPUs (four per CPU, nice 0);
//! - two heavy buffered writers (`dd`, 1 GiB at a time) to the disk the
//!   collection writes to, with the machine's dirty limits lowered for the
//!   run (`vm.dirty_bytes` 512 KiB, background half of it, restored after),
//!   so every writer meets the kernel's dirty-page throttling at once, as
//!   on a machine whose page cache is full of dirty pages;
//! - a build-like load: one C compiler per CPU, again and again, each
//!   writing its object file to the same disk;
//! - another collector (`kernmlops run --plugins quanta_runtime`) writing
//!   to the same disk;
//! - `perf bench sched pipe`, two per CPU, as the event source;
//!
//! while `kernmlops run` collects the default probes at default settings
//! (or with the run arguments given after `--`).
//!
//! While it runs, the collector's threads named `kml-*` are sampled every
//! 2 ms (`/proc/<pid>/task/<tid>/{stat,wchan,stack}`): samples blocked in
//! the kernel's dirty-page throttling (`balance_dirty_pages`) or other
//! uninterruptible waits, samples runnable, and each thread's run-queue
//! wait (`schedstat`). Drain threads (`kml-<probe>`) and writer threads
//! (`kml-w-<probe>`, in builds that have them) are counted apart. The lost
//! events per table come from the run's manifest.
//!
//! Needs root, `perf`, `dd` and `cc`, and a release build (`cargo xtask
//! build-plugins`):
//! `cargo run --release -p kernmlops-benchmarks --bin saturation -- [SECONDS] [BINARY...] [-- RUN ARGS...]`
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
use kernmlops_sys::private::TempDir;

/// How harsh the load is; the defaults are what the README's figures and
/// the test use, the environment variables try others (with 1 pipe per
/// CPU, 1 writer and 2048 KiB, `main` before the writer threads lost
/// nothing; with 512 KiB alone it lost 5%, with all three 51%).
#[derive(Debug, Clone, Copy)]
struct Knobs {
    /// CPU hogs per CPU (`SATURATION_HOGS_PER_CPU`, 4).
    hogs_per_cpu: usize,
    /// `perf bench sched pipe` instances per CPU (`SATURATION_PIPES_PER_CPU`, 2).
    pipes_per_cpu: usize,
    /// `dd` writers (`SATURATION_WRITERS`, 2).
    writers: usize,
    /// `vm.dirty_bytes` for the run, KiB (`SATURATION_DIRTY_KIB`, 512);
    /// the background limit is half of it.
    dirty_kib: u64,
}

impl Knobs {
    fn from_env() -> Result<Self> {
        fn var(name: &str, default: u64) -> Result<u64> {
            match std::env::var(name) {
                Ok(v) => v
                    .parse()
                    .with_context(|| format!("{name}: a whole number, not {v:?}")),
                Err(_) => Ok(default),
            }
        }
        let usize_var = |name, default| {
            var(name, default).and_then(|v| usize::try_from(v).context("too large"))
        };
        Ok(Self {
            hogs_per_cpu: usize_var("SATURATION_HOGS_PER_CPU", 4)?,
            pipes_per_cpu: usize_var("SATURATION_PIPES_PER_CPU", 2)?,
            writers: usize_var("SATURATION_WRITERS", 2)?,
            dirty_kib: var("SATURATION_DIRTY_KIB", 512)?.max(8),
        })
    }
}

/// The dirty-limit settings, saved before the run and restored after.
const DIRTY_KEYS: [&str; 4] = [
    "/proc/sys/vm/dirty_bytes",
    "/proc/sys/vm/dirty_background_bytes",
    "/proc/sys/vm/dirty_ratio",
    "/proc/sys/vm/dirty_background_ratio",
];

/// Sets the dirty limits for the run and restores them when dropped.
struct DirtyLimits {
    saved: Vec<(&'static str, String)>,
}

/// What a signal must undo: the saved dirty limits and the temporary
/// folder (the load's processes are in this process's group).
static UNDO: std::sync::Mutex<Undo> = std::sync::Mutex::new((Vec::new(), None));

/// The saved dirty limits, and the temporary folder.
type Undo = (Vec<(&'static str, String)>, Option<PathBuf>);

/// Set by a signal: the load's loops start nothing more.
static STOPPING: AtomicBool = AtomicBool::new(false);

fn restore_limits(saved: &[(&'static str, String)]) {
    // Writing a ratio clears the byte value and the other way round: the
    // non-zero one of each pair goes last.
    for (k, v) in saved {
        if v.trim() == "0" {
            let _ = std::fs::write(k, v.trim());
        }
    }
    for (k, v) in saved {
        if v.trim() != "0" {
            let _ = std::fs::write(k, v.trim());
        }
    }
}

/// The signal that asked the benchmark to end, 0 until one did.
static SIGNALLED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// SIGINT, SIGTERM and SIGHUP end the benchmark cleanly: every other
/// process of its group (the load, the collectors) is killed, the dirty
/// limits are restored and the temporary folder removed. The handler only
/// records the signal (the processes started later keep the default
/// actions and an unblocked mask); a thread watching for it cleans up as
/// ordinary code. Call before starting any process.
fn clean_up_on_signals() {
    extern "C" fn record(sig: libc::c_int) {
        SIGNALLED.store(sig, Ordering::SeqCst);
    }
    // SAFETY: setpgid(0, 0) makes this process the leader of a new group
    // its children join; sigaction is plain old data, zero a valid value,
    // then filled with a handler that only stores an atomic
    // (async-signal-safe).
    unsafe {
        libc::setpgid(0, 0);
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = record as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
    std::thread::spawn(|| {
        let sig = loop {
            match SIGNALLED.load(Ordering::SeqCst) {
                0 => std::thread::sleep(Duration::from_millis(20)),
                sig => break sig,
            }
        };
        // SAFETY: getpgrp and getpid have no preconditions.
        let (group, me) = unsafe { (libc::getpgrp(), libc::getpid()) };
        STOPPING.store(true, Ordering::SeqCst);
        // Again after a moment: a loop may have been starting a process.
        for _ in 0..3 {
            for pid in group_members(group).into_iter().filter(|&p| p != me) {
                // SAFETY: signalling a process of our own group.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let undo = UNDO.lock().map(|u| u.clone()).unwrap_or_default();
        restore_limits(&undo.0);
        if let Some(dir) = undo.1 {
            let _ = std::fs::remove_dir_all(dir);
        }
        eprintln!("saturation: stopped by signal {sig}; the load is killed and the machine's dirty limits restored");
        std::process::exit(128 + sig);
    });
}

/// The processes of process group `group`, from `/proc`.
fn group_members(group: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|st| {
                    // Fields after the command's closing parenthesis:
                    // state, ppid, pgrp.
                    let rest = st.rsplit_once(") ")?.1;
                    rest.split_whitespace().nth(2)?.parse::<libc::pid_t>().ok()
                })
                == Some(group)
        })
        .collect()
}

impl DirtyLimits {
    fn lower(dirty_kib: u64) -> Result<Self> {
        let mut saved = Vec::new();
        for k in DIRTY_KEYS {
            saved.push((k, std::fs::read_to_string(k).with_context(|| k)?));
        }
        if let Ok(mut undo) = UNDO.lock() {
            undo.0.clone_from(&saved);
        }
        let me = Self { saved };
        std::fs::write(DIRTY_KEYS[0], (dirty_kib << 10).to_string()).context("vm.dirty_bytes")?;
        std::fs::write(DIRTY_KEYS[1], (dirty_kib << 9).to_string())
            .context("vm.dirty_background_bytes")?;
        Ok(me)
    }
}

impl Drop for DirtyLimits {
    fn drop(&mut self) {
        restore_limits(&self.saved);
        if let Ok(mut undo) = UNDO.lock() {
            undo.0.clear();
        }
    }
}

/// Processes of the load, killed when dropped (the other collector is
/// asked to stop, as Ctrl+C would, and waited for).
struct Load {
    children: Vec<Child>,
    collector: Option<Child>,
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
        if let Some(c) = &mut self.collector {
            // SAFETY: signalling a child we started and have not reaped.
            unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
            let _ = c.wait();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Load {
    /// Runs `make` again and again on a thread until the load stops.
    fn repeat(&mut self, make: impl Fn() -> Command + Send + 'static) {
        let stop = self.stop.clone();
        self.threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) && !STOPPING.load(Ordering::SeqCst) {
                let _ = make().stdout(Stdio::null()).stderr(Stdio::null()).status();
            }
        }));
    }
}

/// A C file that takes a compiler a moment, like a unit of a build.
const UNIT: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define F(n) static int f##n(int x) { int s = 0; for (int i = 0; i < x; i++) s += i * n ^ (s >> 3); return s; }
F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11) F(12) F(13) F(14) F(15)
int main(int argc, char **argv) {
    int s = 0;
    for (int i = 0; i < argc; i++) s += f0(i) + f1(i) + f2(i) + f3(i) + f4(i) + f5(i) + f6(i) + f7(i)
        + f8(i) + f9(i) + f10(i) + f11(i) + f12(i) + f13(i) + f14(i) + f15(i) + (int)strlen(argv[i]);
    printf("%d\n", s);
    return 0;
}
"#;

/// Starts the hogs, the writer, the build, the other collector and the
/// event source.
fn start_load(dir: &Path, cpus: usize, knobs: Knobs, bin: &Path, seconds: u64) -> Result<Load> {
    let mut load = Load {
        children: Vec::new(),
        collector: None,
        stop: Arc::new(AtomicBool::new(false)),
        threads: Vec::new(),
    };
    for _ in 0..knobs.hogs_per_cpu * cpus {
        load.children.push(
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .context("starting a CPU hog")?,
        );
    }
    // dd again and again: a buffered writer always over the dirty limit.
    for i in 0..knobs.writers {
        let file = dir.join(format!("dd{i}.bin"));
        load.repeat(move || {
            let mut c = Command::new("dd");
            c.arg("if=/dev/zero")
                .arg(format!("of={}", file.display()))
                .args(["bs=1M", "count=1024"]);
            c
        });
    }
    // The build: compilers writing object files to the same disk.
    let unit = dir.join("unit.c");
    std::fs::write(&unit, UNIT).context("writing the build's source")?;
    for i in 0..cpus {
        let (unit, obj) = (unit.clone(), dir.join(format!("unit{i}.o")));
        load.repeat(move || {
            let mut c = Command::new("cc");
            c.args(["-O2", "-g", "-c"]).arg(&unit).arg("-o").arg(&obj);
            c
        });
    }
    // Another collector, writing its own quanta_runtime table to the disk.
    let other = dir.join("other");
    std::fs::create_dir(&other).context("the other collector's folder")?;
    load.collector = Some(
        Command::new(bin)
            .current_dir(workspace())
            .args(["run", "--plugins", "quanta_runtime", "--duration"])
            .arg(format!("{}s", seconds + 10))
            .arg("--output")
            .arg(&other)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the other collector")?,
    );
    for _ in 0..knobs.pipes_per_cpu * cpus {
        load.repeat(|| {
            let mut c = Command::new("perf");
            c.args(["bench", "sched", "pipe", "-l", "200000"]);
            c
        });
    }
    Ok(load)
}

/// What the sampler saw of a kind of the collector's threads.
#[derive(Debug, Default, Clone)]
struct Samples {
    total: u64,
    /// Blocked in dirty-page throttling.
    dirty_throttled: u64,
    /// Other uninterruptible waits (I/O, locks).
    blocked: u64,
    /// Runnable: running or waiting for a CPU.
    runnable: u64,
    /// Run-queue wait summed over the threads, in seconds (`schedstat`).
    run_delay_s: f64,
    /// Where blocked samples were, by wait channel.
    wchans: BTreeMap<String, u64>,
}

impl Samples {
    fn share(&self, n: u64) -> f64 {
        n as f64 / self.total.max(1) as f64
    }
}

/// The collector's drain threads (`kml-<probe>`) and, apart, its writer
/// threads (`kml-w-<probe>`).
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
                    let stack = std::fs::read_to_string(t.join("stack")).unwrap_or_default();
                    if wchan.contains("dirty") || stack.contains("balance_dirty_pages") {
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
    peak_rss_mib: f64,
}

fn collect(
    bin: &Path,
    seconds: u64,
    cpus: usize,
    knobs: Knobs,
    run_args: &[String],
) -> Result<Outcome> {
    // The collection goes to the disk the writers fill.
    let dir = TempDir::new_in(Path::new("/var/tmp"), "kernmlops-saturation")
        .context("a temporary folder under /var/tmp")?;
    if let Ok(mut undo) = UNDO.lock() {
        undo.1 = Some(dir.path().to_owned());
    }
    // Dirty pages left by earlier work would all be over the lowered
    // limit: written back first, so the run measures its own load only.
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    let _limits = DirtyLimits::lower(knobs.dirty_kib)?;
    let load = start_load(dir.path(), cpus, knobs, bin, seconds)?;
    // Let the writer reach the dirty limit and the hogs spread out.
    std::thread::sleep(Duration::from_secs(2));
    let mut run = Command::new(bin);
    run.current_dir(workspace())
        .args(["run", "--duration", &format!("{seconds}s")])
        .args(run_args)
        .arg("--output")
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
    let peak_rss_mib = stopped.manifest["collector_overhead"]["peak_rss_bytes"]
        .as_f64()
        .map_or(f64::NAN, |b| b / f64::from(1 << 20));
    Ok(Outcome {
        bin: bin.to_owned(),
        tables,
        samples,
        writers,
        seconds: t.elapsed().as_secs_f64(),
        peak_rss_mib,
    })
}

/// What the samples point to.
fn mechanism(s: &Samples) -> &'static str {
    if s.share(s.dirty_throttled) >= 0.01 {
        "dirty-page throttling of the drain thread's writes"
    } else if s.share(s.runnable) >= 0.05 {
        "CPU starvation of the drain threads"
    } else if s.share(s.blocked) >= 0.01 {
        "drain threads blocked on I/O"
    } else {
        "none seen"
    }
}

fn print_samples(what: &str, s: &Samples) {
    println!(
        "  {what}: {} samples, {:.1}% in dirty-page throttling, {:.1}% other blocked, {:.1}% runnable; run-queue wait {:.2} s",
        s.total,
        100.0 * s.share(s.dirty_throttled),
        100.0 * s.share(s.blocked),
        100.0 * s.share(s.runnable),
        s.run_delay_s
    );
    let mut w: Vec<_> = s.wchans.iter().collect();
    w.sort_by(|a, b| b.1.cmp(a.1));
    let top: Vec<String> = w.iter().take(4).map(|(k, v)| format!("{k} {v}")).collect();
    if !top.is_empty() {
        println!("    blocked in: {}", top.join(", "));
    }
}

fn main() -> Result<()> {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let (ours, run_args) = match all.iter().position(|a| a == "--") {
        Some(i) => (&all[..i], &all[i + 1..]),
        None => (&all[..], &[][..]),
    };
    let mut ours = ours.iter();
    let seconds: u64 = match ours.next() {
        Some(s) => s.parse().context("SECONDS: a whole number")?,
        None => 20,
    };
    let mut bins: Vec<PathBuf> = ours.map(PathBuf::from).collect();
    if bins.is_empty() {
        bins.push(release_host()?);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("needs root (BPF, and the dirty limits it lowers for the run)");
    }
    clean_up_on_signals();
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let knobs = Knobs::from_env()?;
    let mut json = Vec::new();
    for bin in &bins {
        let o = match collect(bin, seconds, cpus, knobs, run_args) {
            Ok(o) => o,
            // The collector was killed by the clean-up, which ends the
            // process: its message is the one to see.
            Err(_) if SIGNALLED.load(Ordering::SeqCst) != 0 => loop {
                std::thread::sleep(Duration::from_secs(1));
            },
            Err(e) => return Err(e),
        };
        let s = &o.samples;
        println!(
            "{} {} ({:.1} s under {} hogs on {cpus} CPUs, {} dd, {cpus} compilers and another collector on the same disk with vm.dirty_bytes {} KiB, {} perf bench sched pipe; peak RSS {:.0} MiB):",
            o.bin.display(),
            run_args.join(" "),
            o.seconds,
            knobs.hogs_per_cpu * cpus,
            knobs.writers,
            knobs.dirty_kib,
            knobs.pipes_per_cpu * cpus,
            o.peak_rss_mib,
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
        print_samples("drain threads (kml-<probe>)", s);
        if o.writers.total > 0 {
            print_samples("writer threads (kml-w-<probe>)", &o.writers);
        }
        println!("  points to: {}", mechanism(s));
        json.push(serde_json::json!({
            "binary": o.bin.display().to_string(),
            "run_args": run_args,
            "knobs": format!("{knobs:?}"),
            "seconds": o.seconds,
            "peak_rss_mib": o.peak_rss_mib,
            "tables": tables,
            "samples": s.total,
            "dirty_throttled": s.dirty_throttled,
            "blocked": s.blocked,
            "runnable": s.runnable,
            "run_delay_s": s.run_delay_s,
            "mechanism": mechanism(s),
            "writer_samples": o.writers.total,
            "writer_dirty_throttled": o.writers.dirty_throttled,
            "writer_runnable": o.writers.runnable,
        }));
    }
    println!("{}", serde_json::Value::Array(json));
    Ok(())
}
