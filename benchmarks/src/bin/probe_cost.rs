//! Kernel cost per event of BPF programs under the workloads they are made
//! for: `block_io` under `fio` 4 KiB direct random reads (two jobs),
//! `mm_rss_stat` under a process touching 32 MiB page by page, and
//! `quanta_runtime` under `perf bench sched pipe` with and without a
//! `--cgroup` filter (for the filter's own cost). The figures are the
//! kernel's BPF run-time statistics, read from each run's
//! `collector_overhead`; the median of the runs is printed per program,
//! with the events each run saw.
//!
//! Needs root, `fio`, `perl`, `perf`, cgroup v2 and a release build
//! (`cargo xtask build-plugins`); fio's files go in `/var/tmp` (on a block
//! device, not tmpfs) and are removed:
//! `cargo run --release -p kernmlops-benchmarks --bin probe_cost -- [RUNS]`

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{bail, Context, Result};
use common::{program_costs, Scratch};
use kernmlops_benchmarks::{median, release_host, run_checked, sched_pipe};

mod common;

/// Seconds of fio random reads per run.
const FIO_SECONDS: u32 = 6;

fn fio(dir: &Path, extra: &[&str]) -> Result<()> {
    run_checked(
        Command::new("fio")
            .args([
                "--name=kml_probe_cost",
                "--size=64m",
                "--bs=4k",
                "--direct=1",
                "--ioengine=psync",
                "--numjobs=2",
                "--thread",
            ])
            .arg(format!("--directory={}", dir.display()))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        "fio (apt-get install fio)",
    )
}

fn touch_memory() -> Result<()> {
    for _ in 0..3 {
        run_checked(
            Command::new("perl").args([
                "-e",
                "my $x = \"a\" x (32*1024*1024); select(undef,undef,undef,0.1);",
            ]),
            "perl",
        )?;
    }
    Ok(())
}

/// `perf bench sched pipe`, both ends free to move.
fn sched_pipe_free() -> Result<()> {
    sched_pipe(200_000, false)
}

/// A cgroup v2 folder removed when dropped.
struct TestCgroup(PathBuf);

impl TestCgroup {
    fn create() -> Result<Self> {
        let mounts = std::fs::read_to_string("/proc/self/mounts")?;
        let root = mounts
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.len() > 2 && f[2] == "cgroup2")
            .map(|f| PathBuf::from(f[1]))
            .context("no cgroup v2 mount")?;
        let dir = root.join(format!("kml-probe-cost-{}", std::process::id()));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn report(plugin: &str, what: &str, runs: &[Vec<(String, u64, f64)>]) {
    let mut per_program: BTreeMap<&str, (Vec<f64>, Vec<u64>)> = BTreeMap::new();
    for run in runs {
        for (name, events, ns) in run {
            let e = per_program.entry(name).or_default();
            e.0.push(*ns);
            e.1.push(*events);
        }
    }
    println!("{plugin} ({what}), {} runs:", runs.len());
    for (name, (mut ns, events)) in per_program {
        let m = median(&mut ns);
        let lo = ns.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ns.iter().copied().fold(0.0, f64::max);
        println!(
            "  {name:<28} {m:>7.0} ns/event (runs {lo:.0}-{hi:.0}), events per run {events:?}"
        );
    }
    // All programs' kernel time over the busiest program's events: the
    // cost of one event of the workload (one request, one counter change).
    let mut per_event: Vec<f64> = runs
        .iter()
        .map(|run| {
            let total: f64 = run.iter().map(|(_, e, ns)| *e as f64 * ns).sum();
            let events = run.iter().map(|(_, e, _)| *e).max().unwrap_or(0);
            total / events.max(1) as f64
        })
        .collect();
    println!(
        "  {:<28} {:>7.0} ns per workload event, all programs",
        "total",
        median(&mut per_event)
    );
}

fn main() -> Result<()> {
    let runs: usize = match std::env::args().nth(1) {
        Some(a) => a
            .parse()
            .with_context(|| format!("RUNS {a:?}: a whole number"))?,
        None => 3,
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("needs root (BPF programs and their kernel statistics)");
    }
    let bin = release_host()?;
    let scratch = Scratch(PathBuf::from(format!(
        "/var/tmp/kml-probe-cost-{}",
        std::process::id()
    )));
    let data = scratch.0.join("data");
    let files = scratch.0.join("fio");
    std::fs::create_dir_all(&data)?;
    std::fs::create_dir_all(&files)?;
    // Lay the files out first, so the measured runs only read.
    fio(&files, &["--rw=write", "--bs=1m"])?;
    let runtime = format!("--runtime={FIO_SECONDS}");
    let read = || fio(&files, &["--rw=randread", "--time_based", &runtime]);
    let mut block = Vec::new();
    for _ in 0..runs {
        block.push(program_costs(&bin, &data, "block_io", &[], &read)?);
    }
    report("block_io", "fio 4 KiB direct random reads, 2 jobs", &block);
    let mut rss = Vec::new();
    for _ in 0..runs {
        rss.push(program_costs(
            &bin,
            &data,
            "mm_rss_stat",
            &[],
            &touch_memory,
        )?);
    }
    report(
        "mm_rss_stat",
        "three processes touching 32 MiB page by page",
        &rss,
    );
    // The --cgroup filter's own cost: a cgroup none of the tasks is in, so
    // every event is checked and none recorded.
    let cgroup = TestCgroup::create()?;
    let filtered = [std::ffi::OsStr::new("--cgroup"), cgroup.0.as_os_str()];
    for (what, extra) in [
        ("perf bench sched pipe, no filter", &[][..]),
        (
            "perf bench sched pipe, --cgroup of an empty cgroup",
            &filtered[..],
        ),
    ] {
        let mut quanta = Vec::new();
        for _ in 0..runs {
            quanta.push(program_costs(
                &bin,
                &data,
                "quanta_runtime",
                extra,
                &sched_pipe_free,
            )?);
        }
        report("quanta_runtime", what, &quanta);
    }
    Ok(())
}
