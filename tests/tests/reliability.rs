//! Reliability of a root collector under adversarial use: runs started
//! together never share a collection, rows reach the disk within a flush
//! interval whether or not their table gets more, repeated SIGKILLs lose
//! nothing older than that, a full disk is a clean stop, a killed host
//! leaves no workload, THP mode or temporary file behind, `repair` refuses
//! a collection still being written, and the smallest ring wakes its reader
//! early. Each test prints the figures the README's Reliability section
//! reports.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use kernmlops_e2e::*;

/// The children of process `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let list = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            out.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

const THP: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

fn thp_mode() -> String {
    let text = std::fs::read_to_string(THP).expect("THP mode");
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
        .expect("a selected mode")
        .to_owned()
}

/// Puts the THP mode back when dropped, whatever the test did.
struct ThpGuard(String);

impl Drop for ThpGuard {
    fn drop(&mut self) {
        let _ = std::fs::write(THP, &self.0);
    }
}

/// Waits up to `limit` for `done`.
fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    done()
}

/// A tmpfs of `size` mounted on a fresh folder, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn new(name: &str, size: &str) -> Self {
        let dir = temp_dir(name);
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mounting a tmpfs on {}", dir.display());
        Self(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Rows of a table file.
fn rows(path: &Path) -> usize {
    read_table(path).iter().map(|b| b.num_rows()).sum()
}

/// `kernmlops repair DIR`, which must succeed; returns its stdout.
fn repair(dir: &Path) -> String {
    let out = kernmlops(&["repair", s(dir)]);
    assert!(
        out.status.success(),
        "repair {}: {}",
        dir.display(),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Two runs started together, fifty times, into one output folder: a
/// hundred distinct, complete collections.
#[test]
fn root_fifty_pairs_started_together_make_a_hundred_collections() {
    if !require_root("root_fifty_pairs_started_together_make_a_hundred_collections") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("pairs", &[("memory_usage", "memory_usage")]);
    let output = temp_dir("pairs-out");
    let run = || {
        Command::new(kernmlops_bin())
            .args([
                "run",
                "--plugin-dir",
                s(&plugins),
                "--plugins",
                "memory_usage",
            ])
            .args(["--duration", "100ms", "--output", s(&output)])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting kernmlops")
    };
    for pair in 0..50 {
        let (a, b) = (run(), run());
        for child in [a, b] {
            let out = child.wait_with_output().expect("waiting");
            assert!(out.status.success(), "pair {pair}: {}", text(&out.stderr));
        }
    }
    let mut ids = BTreeSet::new();
    let dirs: Vec<PathBuf> = std::fs::read_dir(&output)
        .expect("output")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(dirs.len(), 100, "collections: {dirs:?}");
    for dir in &dirs {
        let man = manifest(dir);
        assert_eq!(man["status"], "complete", "{}", dir.display());
        let id = man["collection_id"].as_str().expect("id").to_owned();
        assert_eq!(dir.file_name().and_then(|n| n.to_str()), Some(id.as_str()));
        assert!(rows(&dir.join("memory_usage.arrow")) >= 1);
        assert_eq!(rows(&dir.join("system_info.arrow")), 1);
        ids.insert(id);
    }
    assert_eq!(ids.len(), 100, "two collections shared an id");
    eprintln!("reliability: 50 pairs started together gave 100 distinct complete collections");
    std::fs::remove_dir_all(&output).expect("clean up");
    std::fs::remove_dir_all(&plugins).expect("clean up");
}

/// A table that gets a few rows and then none: killed 5 s later, every row
/// is on disk (the run's system_info too, written at start).
#[test]
fn root_a_quiet_table_has_its_rows_on_disk_when_killed() {
    if !require_root("root_a_quiet_table_has_its_rows_on_disk_when_killed") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("quiet", &[("process_trace", "process_trace")]);
    let output = temp_dir("quiet-out");
    let cg = TestCgroup::create("kml-e2e-quiet").expect("cgroup v2 is mounted");
    let c = Collector::start(&[
        "--plugin-dir",
        s(&plugins),
        "--plugins",
        "process_trace",
        "--cgroup",
        s(&cg.dir),
        "--output",
        s(&output),
    ]);
    // Three programs in the cgroup, then nothing but a long sleep.
    let script = format!(
        "echo $$ > {}/cgroup.procs; /bin/true; /bin/true; /bin/true; exec sleep 60",
        cg.dir.display()
    );
    let mut sh = Command::new("sh")
        .args(["-c", &script])
        .spawn()
        .expect("sh");
    std::thread::sleep(Duration::from_secs(5));
    let done = c.signal_and_wait(libc::SIGKILL);
    assert!(!done.status.success());
    let dir = only_collection(&output);
    assert_eq!(
        rows(&dir.join("system_info.arrow")),
        1,
        "a killed run has its system_info"
    );
    let report = repair(&dir);
    assert!(report.contains("process_trace.arrow"), "{report}");
    let table = read_table(&dir.join("process_trace.arrow"));
    let names = column_str(&table, "name");
    let kinds = column_str(&table, "cap_type");
    let execs = |n: &str| {
        names
            .iter()
            .zip(&kinds)
            .filter(|(name, kind)| name.as_deref() == Some(n) && kind.as_deref() == Some("exec"))
            .count()
    };
    assert_eq!(
        execs("true"),
        3,
        "rows of 5 s ago lost: {names:?} {kinds:?}"
    );
    assert_eq!(execs("sleep"), 1, "{names:?}");
    let _ = sh.kill();
    let _ = sh.wait();
    eprintln!(
        "reliability: a quiet table killed 5 s after its last row kept all {} rows",
        names.len()
    );
    drop(cg);
    std::fs::remove_dir_all(&output).expect("clean up");
    std::fs::remove_dir_all(&plugins).expect("clean up");
}

/// Rows of `tgid` in a quanta table.
fn rows_of(dir: &Path, table: &str, tgid: u32) -> usize {
    let t = read_table(&dir.join(format!("{table}.arrow")));
    column_u64(&t, "tgid")
        .iter()
        .filter(|&&g| g == u64::from(tgid))
        .count()
}

/// A single-threaded process that joins `cg` before it runs anything,
/// sleeps 2 ms `sleeps` times, says so on stdout, then sleeps `then`
/// seconds.
struct Sleeper {
    child: std::process::Child,
}

impl Sleeper {
    fn start(cg: &TestCgroup, sleeps: u32, then: u32) -> Self {
        Self::start_on(cg, sleeps, then, None)
    }

    /// The same, kept on `cpu` (after its start-up).
    fn start_on(cg: &TestCgroup, sleeps: u32, then: u32, cpu: Option<u32>) -> Self {
        use std::os::unix::process::CommandExt;
        let procs = std::ffi::CString::new(format!("{}/cgroup.procs", cg.dir.display()))
            .expect("path without NUL");
        let mut cmd = python3();
        cmd.args([
            "-c",
            &format!(
                "import os, sys, time\n{pin}for _ in range({sleeps}): time.sleep(0.002)\nprint('slept', flush=True)\ntime.sleep({then})",
                pin = cpu.map(|c| format!("os.sched_setaffinity(0, {{{c}}})\n")).unwrap_or_default()
            ),
        ])
        .stdout(Stdio::piped());
        // SAFETY: between fork and exec the hook only calls open, write
        // and close, which are async-signal-safe, on memory prepared
        // before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
                Ok(())
            });
        }
        Self {
            child: cmd.spawn().expect("python3"),
        }
    }

    /// Waits for its sleeps to end; returns how many times it has been
    /// switched out (it is asleep, so no more come).
    fn slept(&mut self) -> usize {
        use std::io::BufRead;
        let out = self.child.stdout.take().expect("stdout");
        let mut line = String::new();
        std::io::BufReader::new(out)
            .read_line(&mut line)
            .expect("reading python3");
        assert_eq!(line.trim(), "slept");
        // Let it reach its last sleep.
        std::thread::sleep(Duration::from_millis(20));
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("status of the sleeper");
        status
            .lines()
            .filter(|l| {
                l.starts_with("voluntary_ctxt_switches")
                    || l.starts_with("nonvoluntary_ctxt_switches")
            })
            .filter_map(|l| l.split_whitespace().last()?.parse::<usize>().ok())
            .sum()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Switches a [`Sleeper`] makes: enough to leave partial batches.
const SLEEPS: u32 = 40;

/// A `quanta_runtime` run following one test cgroup, for the staged-output
/// tests: its plugin folder, output folder and cgroup.
struct StagedRun {
    plugins: PathBuf,
    output: PathBuf,
    cg: TestCgroup,
    /// Drains once a second and keeps rows in memory until the stop.
    slow: PathBuf,
}

impl StagedRun {
    fn new(name: &str) -> Self {
        let plugins = plugin_dir(name, &[("quanta_runtime", "quanta_runtime")]);
        let output = temp_dir(&format!("{name}-out"));
        let cg = TestCgroup::create(&format!("kml-e2e-{name}")).expect("cgroup v2 is mounted");
        let slow = output.join("slow.toml");
        std::fs::write(
            &slow,
            "[collect]\ndrain_interval = \"1s\"\nflush_interval = \"30s\"\n",
        )
        .expect("config");
        Self {
            plugins,
            output,
            cg,
            slow,
        }
    }

    /// Starts the run, with the slow drain when `slow`.
    fn start(&self, slow: bool) -> Collector {
        let mut args = vec![
            "--plugin-dir",
            s(&self.plugins),
            "--plugins",
            "quanta_runtime",
            "--cgroup",
            s(&self.cg.dir),
            "--output",
            s(&self.output),
        ];
        if slow {
            args.extend(["--config", s(&self.slow)]);
        }
        Collector::start(&args)
    }

    fn finish(self) {
        drop(self.cg);
        std::fs::remove_dir_all(&self.output).expect("clean up");
        std::fs::remove_dir_all(&self.plugins).expect("clean up");
    }
}

/// `quanta_runtime` stages its rows per CPU and sends them a batch at a
/// time; a process followed alone (`--cgroup`) leaves partial batches.
/// They still reach the disk: a SIGKILL 3 s after the process went to
/// sleep finds every one of its switches on disk (sent by the drain, as
/// they waited), and a run stopped right after its last switch has them
/// too (sent when the probe stops). Checked against the kernel's own count
/// of the process's context switches.
#[test]
fn root_staged_rows_of_a_quiet_cpu_reach_the_disk() {
    if !require_root("root_staged_rows_of_a_quiet_cpu_reach_the_disk") {
        return;
    }
    let _serial = serial();
    let setup = StagedRun::new("staged");
    // Every switch away is a quanta_runtime row, and the sleeper runs
    // after every wake-up, a quanta_queued_time row.
    let check = |dir: &Path, pid: u32, switches: usize, when: &str| {
        let run = rows_of(dir, "quanta_runtime", pid);
        let queued = rows_of(dir, "quanta_queued_time", pid);
        assert!(
            switches >= SLEEPS as usize,
            "the sleeper switched out {switches} times"
        );
        // Its switches between the fork and joining the cgroup are not
        // followed (one or none seen), nor the wake-up that started it.
        eprintln!("{when}: {run} quanta_runtime and {queued} quanta_queued_time rows, {switches} switches");
        assert!(
            run <= switches && run + 2 >= switches,
            "{when}: {run} quanta_runtime rows of a process the kernel switched out {switches} times"
        );
        assert!(
            queued <= run + 1 && queued + 2 >= run,
            "{when}: {queued} quanta_queued_time rows of a process switched out {switches} times"
        );
        (run, queued)
    };

    let c = setup.start(false);
    let mut quiet = Sleeper::start(&setup.cg, SLEEPS, 60);
    let switches = quiet.slept();
    std::thread::sleep(Duration::from_secs(3));
    let done = c.signal_and_wait(libc::SIGKILL);
    assert!(!done.status.success());
    let dir = only_collection(&setup.output);
    repair(&dir);
    check(
        &dir,
        quiet.child.id(),
        switches,
        "killed 3 s after its last switch",
    );
    drop(quiet);
    std::fs::remove_dir_all(&dir).expect("clean up");

    // The second run drains once a second (and its rows wait for the
    // stop), so what is staged is all but always still there when it is
    // stopped 20 ms after the last switch: the stop has to send it.
    let c = setup.start(true);
    let mut brief = Sleeper::start(&setup.cg, SLEEPS, 10);
    let switches = brief.slept();
    let done = c.signal_and_wait(libc::SIGINT);
    assert!(done.status.success(), "{}", done.stderr);
    let dir = done.dir.expect("collection folder printed");
    let (run, queued) = check(&dir, brief.child.id(), switches, "stopped right after");
    drop(brief);
    eprintln!(
        "reliability: staged rows of a quiet CPU: {run} quanta_runtime and {queued} quanta_queued_time rows for {switches} switches, after a SIGKILL and after a stop"
    );
    setup.finish();
}

/// Takes a CPU offline, and back online when dropped (panic or not).
struct OfflineCpu(u32);

impl OfflineCpu {
    fn online_file(cpu: u32) -> PathBuf {
        PathBuf::from(format!("/sys/devices/system/cpu/cpu{cpu}/online"))
    }

    fn take(cpu: u32) -> Self {
        std::fs::write(Self::online_file(cpu), "0")
            .unwrap_or_else(|e| panic!("taking CPU {cpu} offline: {e}"));
        Self(cpu)
    }
}

impl Drop for OfflineCpu {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(Self::online_file(self.0), "1") {
            eprintln!("bringing CPU {} back online: {e}", self.0);
        }
    }
}

/// A CPU taken offline cannot run the flush program: when the probe stops,
/// the host reads that CPU's partial batches from the map, so the rows of
/// a process that ran there alone are all on disk.
#[test]
fn root_staged_rows_of_an_offline_cpu_are_kept() {
    if !require_root("root_staged_rows_of_an_offline_cpu_are_kept") {
        return;
    }
    let _serial = serial();
    let last = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32 - 1;
    assert!(
        last > 0 && OfflineCpu::online_file(last).exists(),
        "needs a second CPU that can be taken offline"
    );
    // Drains once a second, so the partial batches are still staged when
    // the CPU goes offline.
    let setup = StagedRun::new("offline");
    let c = setup.start(true);
    let mut sleeper = Sleeper::start_on(&setup.cg, SLEEPS, 10, Some(last));
    let switches = sleeper.slept();
    let offline = OfflineCpu::take(last);
    let done = c.signal_and_wait(libc::SIGINT);
    drop(offline);
    assert!(done.status.success(), "{}", done.stderr);
    let dir = done.dir.expect("collection folder printed");
    let run = rows_of(&dir, "quanta_runtime", sleeper.child.id());
    eprintln!("reliability: offline CPU {last}: {run} quanta_runtime rows for {switches} switches");
    assert!(
        run <= switches && run + 2 >= switches,
        "{run} quanta_runtime rows of a process the kernel switched out {switches} times, on a CPU taken offline before the stop"
    );
    drop(sleeper);
    setup.finish();
}

/// A stop does not wait out the drain: with a 30 s drain interval, a run of
/// a BPF probe and two sampling probes ends within a second of SIGINT, its
/// files complete.
#[test]
fn root_a_stop_does_not_wait_for_the_drain_interval() {
    if !require_root("root_a_stop_does_not_wait_for_the_drain_interval") {
        return;
    }
    let _serial = serial();
    let output = temp_dir("prompt-stop");
    let slow = output.join("slow.toml");
    std::fs::write(&slow, "[collect]\ndrain_interval = \"30s\"\n").expect("config");
    let c = Collector::start(&[
        "--config",
        s(&slow),
        "--plugins",
        "quanta_runtime,memory_usage,perf",
        "--power",
        "none",
        "--output",
        s(&output),
    ]);
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    let done = c.signal_and_wait(libc::SIGINT);
    let took = t.elapsed();
    assert!(done.status.success(), "{}", done.stderr);
    eprintln!(
        "reliability: stopped in {} ms with a 30 s drain interval",
        took.as_millis()
    );
    assert!(took < Duration::from_secs(2), "the stop took {took:?}");
    let dir = done.dir.expect("collection folder printed");
    assert_eq!(manifest(&dir)["status"], "complete");
    assert!(rows(&dir.join("quanta_runtime.arrow")) > 0);
    std::fs::remove_dir_all(&output).expect("clean up");
}

/// Five SIGKILLs at different points of a heavy collection (a ticker at
/// 200,000 rows/s, every context switch, every process): each time
/// `repair` recovers every row older than a flush interval, checked
/// against the processes the test started (which the kernel reported) and
/// the ticker's own row numbers.
#[test]
fn root_five_kills_during_a_heavy_collection_lose_nothing_older_than_a_flush() {
    if !require_root("root_five_kills_during_a_heavy_collection_lose_nothing_older_than_a_flush") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir(
        "crash",
        &[
            ("fixture_faulty", "faulty"),
            ("quanta_runtime", "quanta_runtime"),
            ("process_trace", "process_trace"),
        ],
    );
    let work = temp_dir("crash");
    let cfg = work.join("heavy.toml");
    std::fs::write(&cfg, "[probes.ticker]\nrows_per_drain = 2000\n").expect("config");
    // The flush interval, plus a drain interval and scheduling slack for a
    // row to reach the host.
    const FLUSH: Duration = Duration::from_millis(500);
    const SLACK_US: u64 = 250_000;
    let older_than = FLUSH.as_micros() as u64 + SLACK_US;
    let (mut kept, mut spawned_total) = (0usize, 0usize);
    for (round, after_ms) in [1700u64, 2900, 3600, 2200, 4100].into_iter().enumerate() {
        let output = work.join(format!("out-{round}"));
        let c = Collector::start(&[
            "--config",
            s(&cfg),
            "--plugin-dir",
            s(&plugins),
            "--plugins",
            "ticker,quanta_runtime,process_trace",
            "--flush-interval",
            "500ms",
            "--output",
            s(&output),
        ]);
        // The kernel side: processes started at known times.
        let mut spawned: Vec<(u32, u64)> = Vec::new();
        let until = Instant::now() + Duration::from_millis(after_ms);
        while Instant::now() < until {
            let t = uptime_us();
            let mut child = Command::new("/bin/true").spawn().expect("true");
            spawned.push((child.id(), t));
            let _ = child.wait();
            std::thread::sleep(Duration::from_millis(20));
        }
        let killed_at = uptime_us();
        let done = c.signal_and_wait(libc::SIGKILL);
        assert!(!done.status.success());
        let dir = only_collection(&output);
        repair(&dir);
        assert_eq!(manifest(&dir)["status"], "repaired");

        let trace = read_table(&dir.join("process_trace.arrow"));
        let pids = column_u64(&trace, "pid");
        let kinds = column_str(&trace, "cap_type");
        let execs: BTreeSet<u64> = pids
            .iter()
            .zip(&kinds)
            .filter(|(_, k)| k.as_deref() == Some("exec"))
            .map(|(p, _)| *p)
            .collect();
        let old: Vec<&(u32, u64)> = spawned
            .iter()
            .filter(|(_, t)| *t + older_than < killed_at)
            .collect();
        let missing: Vec<u32> = old
            .iter()
            .filter(|(p, _)| !execs.contains(&u64::from(*p)))
            .map(|(p, _)| *p)
            .collect();
        assert!(
            missing.is_empty(),
            "round {round}: {} of {} processes started more than {older_than} us before the kill are missing: {missing:?}",
            missing.len(),
            old.len()
        );

        let ticks = read_table(&dir.join("ticker.arrow"));
        let seq = column_u64(&ticks, "seq");
        let ts = column_u64(&ticks, "ts_uptime_us");
        assert!(
            seq.iter().enumerate().all(|(i, &s)| s == i as u64),
            "round {round}: the ticker's rows are not all there from 0"
        );
        let last = ts.iter().copied().max().expect("ticker rows");
        assert!(
            killed_at.saturating_sub(last) < older_than,
            "round {round}: the last ticker row is {} us older than the kill",
            killed_at - last
        );
        let round_rows = rows(&dir.join("ticker.arrow"))
            + trace.iter().map(|b| b.num_rows()).sum::<usize>()
            + rows(&dir.join("quanta_runtime.arrow"));
        kept += round_rows;
        spawned_total += old.len();
        eprintln!(
            "reliability: kill {} at {after_ms} ms: {round_rows} rows recovered, {} of {} processes older than a flush found",
            round + 1,
            old.len(),
            old.len()
        );
    }
    eprintln!(
        "reliability: 5 kills survived, {kept} rows recovered, {spawned_total} processes checked"
    );
    std::fs::remove_dir_all(&work).expect("clean up");
    std::fs::remove_dir_all(&plugins).expect("clean up");
}

/// A small tmpfs as output under a high row rate: the run stops at the
/// first write error with one error line saying the rows on disk, every
/// file is closed and readable with those rows, and `repair` then works in
/// place without leaving any file of its own; `dump` reads the result.
#[test]
fn root_a_full_disk_is_a_clean_stop() {
    if !require_root("root_a_full_disk_is_a_clean_stop") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir(
        "full",
        &[
            ("fixture_faulty", "faulty"),
            ("memory_usage", "memory_usage"),
        ],
    );
    let disk = Tmpfs::new("full-disk", "8m");
    let work = temp_dir("full-work");
    let cfg = work.join("fast.toml");
    std::fs::write(&cfg, "[probes.ticker]\nrows_per_drain = 5000\n").expect("config");
    let started = Instant::now();
    let out = Command::new(kernmlops_bin())
        .args(["--config", s(&cfg), "run", "--plugin-dir", s(&plugins)])
        .args(["--plugins", "ticker,memory_usage", "--duration", "60s"])
        .args(["--flush-interval", "200ms", "--output", s(&disk.0)])
        .output()
        .expect("kernmlops");
    let took = started.elapsed();
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success(),
        "a full disk went unnoticed: {stderr}"
    );
    assert!(took < Duration::from_secs(30), "took {took:?} to stop");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "one error line: {stderr}");
    let line = errors[0];
    for needle in [
        "No space left on device",
        "rows on disk",
        "ticker ",
        "kernmlops repair",
    ] {
        assert!(line.contains(needle), "{needle:?} not in {line}");
    }
    let dir = only_collection(&disk.0);
    let names = |d: &Path| -> Vec<String> {
        std::fs::read_dir(d)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect()
    };
    // Every table file is closed and holds the rows the run reported.
    let man = manifest(&dir);
    assert_eq!(man["status"], "complete_with_errors", "{man}");
    for (table, entry) in man["tables"].as_object().expect("tables") {
        let file = dir.join(entry["file"].as_str().expect("file"));
        if file.exists() {
            assert_eq!(
                rows(&file) as u64,
                entry["rows"].as_u64().expect("rows"),
                "{table}"
            );
        }
    }
    let ticker_rows = man["tables"]["ticker"]["rows"]
        .as_u64()
        .expect("ticker rows");
    assert!(
        ticker_rows > 0 && line.contains(&format!("ticker {ticker_rows}")),
        "{line}"
    );
    // Repair in place on the still-full disk: nothing to do, nothing made.
    let report = repair(&dir);
    assert!(!report.contains("failed"), "{report}");
    assert!(
        names(&dir)
            .iter()
            .all(|n| !n.ends_with(".tmp") && !n.contains("repairing")),
        "{:?}",
        names(&dir)
    );
    let dump = kernmlops(&["dump", s(&dir)]);
    assert!(dump.status.success(), "dump: {}", text(&dump.stderr));
    eprintln!(
        "reliability: an 8 MiB disk filled in {took:.1?}; the run stopped with {ticker_rows} ticker rows on disk, all readable"
    );
    drop(disk);
    std::fs::remove_dir_all(&work).expect("clean up");
    std::fs::remove_dir_all(&plugins).expect("clean up");
}

/// The state a benchmark run left: its workload cgroup, its state folder
/// and temporary folders matching `temp_glob` (`<folder>`, `<prefix>`).
struct Leftovers {
    cgroup: PathBuf,
    state: PathBuf,
    temp: (PathBuf, String),
}

impl Leftovers {
    fn of(collection: &Path, temp_base: &str, bench: &str) -> Self {
        let id = collection
            .file_name()
            .and_then(|n| n.to_str())
            .expect("collection id")
            .to_owned();
        Self {
            cgroup: cgroup2_mount()
                .expect("cgroup2")
                .join("kernmlops")
                .join(&id),
            state: Path::new("/run/kernmlops").join(&id),
            // Temporary folders are `kernmlops-<bench>.<random>`: private,
            // with a name nobody can predict.
            temp: (PathBuf::from(temp_base), format!("kernmlops-{bench}.")),
        }
    }

    fn temp_dirs(&self) -> Vec<PathBuf> {
        std::fs::read_dir(&self.temp.0)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with(&self.temp.1))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn procs(&self) -> Vec<u32> {
        std::fs::read_to_string(self.cgroup.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect()
    }

    /// What is still there, as text; empty when everything is gone.
    fn remaining(&self, thp_before: &str) -> Vec<String> {
        let mut left = Vec::new();
        if self.cgroup.exists() {
            left.push(format!(
                "cgroup {} with {:?}",
                self.cgroup.display(),
                self.procs()
            ));
        }
        if self.state.exists() {
            left.push(format!("state {}", self.state.display()));
        }
        for d in self.temp_dirs() {
            left.push(format!("temporary {}", d.display()));
        }
        if thp_mode() != thp_before {
            left.push(format!("THP mode {} (was {thp_before})", thp_mode()));
        }
        left
    }
}

/// SIGKILL during a benchmark leaves nothing behind: with the guardian
/// alive it undoes everything at once; with the guardian killed too, the
/// next `kernmlops` start (here `repair`) does, and says so.
fn sigkill_during(bench: &str, settings: &str, ready: &str, temp_base: &str, kill_guardian: bool) {
    let plugins = plugin_dir(
        &format!("kill-{bench}"),
        &[("workloads", "workloads"), ("memory_usage", "memory_usage")],
    );
    let work = temp_dir(&format!("kill-{bench}"));
    let thp_before = thp_mode();
    let _restore = ThpGuard(thp_before.clone());
    let thp_run = if thp_before == "never" {
        "always"
    } else {
        "never"
    };
    let cfg = work.join("bench.toml");
    std::fs::write(
        &cfg,
        format!(
            "[benchmarks.{bench}]\ndrop_page_cache = false\nthp_mode = \"{thp_run}\"\n{settings}"
        ),
    )
    .expect("config");
    let output = work.join("out");
    let c = Collector::start(&[
        "--config",
        s(&cfg),
        "--plugin-dir",
        s(&plugins),
        "--plugins",
        "memory_usage",
        "--benchmark",
        bench,
        "--duration",
        "120s",
        "--output",
        s(&output),
    ]);
    let host = c.pid();
    let dir = only_collection(&output);
    let left = Leftovers::of(&dir, temp_base, bench);
    assert!(
        wait_for(Duration::from_secs(20), || left
            .procs()
            .iter()
            .any(|p| std::fs::read_to_string(format!("/proc/{p}/comm"))
                .is_ok_and(|c| c.trim() == ready))),
        "{ready} never ran in {}",
        left.cgroup.display()
    );
    assert_eq!(thp_mode(), thp_run, "the benchmark set the THP mode");
    assert!(!left.temp_dirs().is_empty(), "no temporary folder was made");
    let workload = left.procs();
    let guardian: Vec<u32> = children(host)
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("__kernmlops-guardian"))
        })
        .collect();
    assert_eq!(guardian.len(), 1, "one guardian per run");
    if kill_guardian {
        // SAFETY: the guardian this test's collector started.
        unsafe { libc::kill(guardian[0] as i32, libc::SIGKILL) };
    }
    let t0 = Instant::now();
    if kill_guardian {
        // SAFETY: the collector this test started.
        unsafe { libc::kill(host as i32, libc::SIGKILL) };
        // Its locks go with it; until a kernmlops starts, nothing undoes
        // the run (any kernmlops start would, so this runs one at once).
        // A zombie leader's other threads may still be exiting, holding
        // the open files (and the run's lock) they share: wait for them too.
        assert!(wait_for(Duration::from_secs(5), || {
            let zombie = std::fs::read_to_string(format!("/proc/{host}/stat"))
                .map_or(true, |st| st.contains(") Z "));
            let threads = std::fs::read_dir(format!("/proc/{host}/task")).map_or(0, |d| d.count());
            zombie && threads <= 1
        }));
        let pending = left.remaining(&thp_before);
        let out = kernmlops(&["repair", s(&dir)]);
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "repair: {stderr}");
        if pending.is_empty() {
            eprintln!("note: another kernmlops started first and undid the run");
        } else {
            assert!(
                stderr.contains("ended without undoing its changes")
                    && stderr.contains("restored")
                    && stderr.contains("removed"),
                "repair does not say what it undid ({pending:?}): {stderr}"
            );
        }
    }
    let done = c.signal_and_wait(libc::SIGKILL);
    assert!(!done.status.success());
    assert!(
        wait_for(Duration::from_secs(15), || left
            .remaining(&thp_before)
            .is_empty()),
        "{bench}: left behind: {:?}",
        left.remaining(&thp_before)
    );
    let survivors: Vec<u32> = workload.iter().copied().filter(|&p| alive(p)).collect();
    assert!(
        survivors.is_empty(),
        "{bench}: workload processes alive: {survivors:?}"
    );
    eprintln!(
        "reliability: SIGKILL during {bench}{}: {} workload processes stopped, THP restored, temporary files removed in {:.1?}",
        if kill_guardian { " (guardian killed too, undone by the next start)" } else { "" },
        workload.len(),
        t0.elapsed()
    );
    if !kill_guardian {
        repair(&dir);
    }
    std::fs::remove_dir_all(&work).expect("clean up");
    std::fs::remove_dir_all(&plugins).expect("clean up");
}

#[test]
fn root_sigkill_during_redis_leaves_nothing_behind() {
    if !require_root("root_sigkill_during_redis_leaves_nothing_behind")
        || !require_tool("redis", "redis-server")
        || !require_tool("redis", "redis-benchmark")
    {
        return;
    }
    let _serial = serial();
    sigkill_during(
        "redis",
        "requests = 100000000\nclients = 4\n",
        "redis-benchmark",
        &std::env::temp_dir().display().to_string(),
        false,
    );
}

#[test]
fn root_sigkill_during_fio_leaves_nothing_behind_even_without_its_guardian() {
    if !require_root("root_sigkill_during_fio_leaves_nothing_behind_even_without_its_guardian")
        || !require_tool("fio", "fio")
    {
        return;
    }
    let _serial = serial();
    sigkill_during(
        "fio",
        "size = \"512m\"\nruntime = \"60s\"\nrw = \"randwrite\"\ndirect = true\n",
        "fio",
        "/var/tmp",
        true,
    );
}

/// `repair` on a collection whose writer is alive refuses in one line and
/// changes nothing; the run then ends normally with every row it counted.
#[test]
fn root_repair_refuses_a_collection_still_being_written() {
    if !require_root("root_repair_refuses_a_collection_still_being_written") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("live", &[("fixture_faulty", "faulty")]);
    let output = temp_dir("live-out");
    let c = Collector::start(&[
        "--plugin-dir",
        s(&plugins),
        "--plugins",
        "ticker",
        "--output",
        s(&output),
    ]);
    std::thread::sleep(Duration::from_millis(1500));
    let dir = only_collection(&output);
    let out = kernmlops(&["repair", s(&dir)]);
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success(),
        "repair of a live collection: {stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("a running kernmlops (pid {})", c.pid())),
        "{stderr}"
    );
    let done = c.signal_and_wait(libc::SIGINT);
    assert!(done.status.success(), "{}", done.stderr);
    let man = manifest(&dir);
    assert_eq!(man["status"], "complete");
    let counted = man["tables"]["ticker"]["rows"].as_u64().expect("rows");
    assert_eq!(rows(&dir.join("ticker.arrow")) as u64, counted);
    assert!(repair(&dir).contains("intact"));
    std::fs::remove_dir_all(&output).expect("clean up");
    std::fs::remove_dir_all(&plugins).expect("clean up");
}

/// Context switches at a steady rate for `secs`: two threads passing a
/// byte back and forth, resting 2 ms every 50 round trips (some 50,000
/// switches a second on a small machine). Returns the round trips made.
fn ping_pong(secs: u64) -> u64 {
    use std::{
        io::{Read, Write},
        os::unix::net::UnixStream,
    };
    let (mut a, mut b) = UnixStream::pair().expect("socket pair");
    let echo = std::thread::spawn(move || {
        let mut byte = [0u8; 1];
        while b.read_exact(&mut byte).is_ok() && byte[0] != 0 {
            if b.write_all(&byte).is_err() {
                break;
            }
        }
    });
    let until = Instant::now() + Duration::from_secs(secs);
    let mut trips = 0u64;
    let mut byte = [1u8; 1];
    while Instant::now() < until {
        for _ in 0..50 {
            a.write_all(&[1]).expect("ping");
            a.read_exact(&mut byte).expect("pong");
            trips += 1;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    a.write_all(&[0]).expect("stop");
    echo.join().expect("echo thread");
    trips
}

/// The smallest ring accepted wakes its reader early: with a drain interval
/// of 10 s only the quarter-full wake-up drains it (a 16 KiB ring holds
/// some 400 switches, so without the wake-up nearly all would be lost), and
/// at the same event rate it loses no more than a ring sixteen times
/// larger. Rings below 16 KiB are refused.
#[test]
fn root_the_smallest_ring_wakes_its_reader_early() {
    if !require_root("root_the_smallest_ring_wakes_its_reader_early") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("ring", &[("quanta_runtime", "quanta_runtime")]);
    let work = temp_dir("ring");
    let cfg = work.join("slow-drain.toml");
    std::fs::write(&cfg, "[collect]\ndrain_interval = \"10s\"\n").expect("config");
    let refused = kernmlops(&[
        "run",
        "--plugin-dir",
        s(&plugins),
        "--ring-size",
        "8KiB",
        "--output",
        s(&work.join("never")),
    ]);
    assert!(
        text(&refused.stderr).contains("between 16KiB and 1GiB"),
        "{}",
        text(&refused.stderr)
    );
    let mut lost = Vec::new();
    for ring in ["16KiB", "256KiB"] {
        let output = work.join(format!("out-{ring}"));
        let c = Collector::start(&[
            "--config",
            s(&cfg),
            "--plugin-dir",
            s(&plugins),
            "--plugins",
            "quanta_runtime",
            "--ring-size",
            ring,
            "--output",
            s(&output),
        ]);
        let trips = ping_pong(3);
        let done = c.signal_and_wait(libc::SIGINT);
        assert!(done.status.success(), "{}", done.stderr);
        let man = manifest(&only_collection(&output));
        let t = &man["tables"]["quanta_runtime"];
        let rows = t["rows"].as_u64().unwrap_or(0);
        let lost_events = t["lost_events"].as_u64().unwrap_or(0);
        assert!(rows > trips, "{ring}: {rows} rows for {trips} round trips");
        let fraction = lost_events as f64 / (rows + lost_events) as f64;
        eprintln!(
            "reliability: {ring} ring, 10 s drain interval, {trips} round trips: {rows} rows, {lost_events} lost ({:.2}%)",
            fraction * 100.0
        );
        lost.push(fraction);
    }
    assert!(
        lost[0] < 0.05,
        "the smallest ring lost {:.1}%",
        lost[0] * 100.0
    );
    assert!(
        lost[0] <= lost[1] + 0.02,
        "the smallest ring lost {:.2}%, a 256 KiB ring {:.2}%",
        lost[0] * 100.0,
        lost[1] * 100.0
    );
    std::fs::remove_dir_all(&work).expect("clean up");
    std::fs::remove_dir_all(&plugins).expect("clean up");
}

/// A value a component's rules refuse stops the run before any set-up: the
/// benchmark never changed the THP mode, and no folder was made.
#[test]
fn root_bad_settings_stop_a_run_before_set_up() {
    if !require_root("root_bad_settings_stop_a_run_before_set_up") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir(
        "rules",
        &[
            ("workloads", "workloads"),
            ("memory_usage", "memory_usage"),
            ("block_io", "block_io"),
        ],
    );
    let work = temp_dir("rules");
    let thp_before = thp_mode();
    let _restore = ThpGuard(thp_before.clone());
    let other = if thp_before == "never" {
        "always"
    } else {
        "never"
    };
    for (body, needle) in [
        (
            "[probes.block_io]\ninflight_entries = 0\n",
            "probes.block_io.inflight_entries must be at least 1",
        ),
        (
            "drop_page_cache = 7\n",
            "benchmarks.faux.drop_page_cache: expected true or false",
        ),
        (
            "[probes.memory_usage]\ninterval = \"0s\"\n",
            "probes.memory_usage.interval",
        ),
    ] {
        let cfg = work.join("bad.toml");
        std::fs::write(
            &cfg,
            format!("[benchmarks.faux]\nthp_mode = \"{other}\"\n{body}"),
        )
        .expect("config");
        let output = work.join("out");
        let out = kernmlops(&[
            "--config",
            s(&cfg),
            "run",
            "--plugin-dir",
            s(&plugins),
            "--plugins",
            "memory_usage",
            "--benchmark",
            "faux",
            "--duration",
            "2s",
            "--output",
            s(&output),
        ]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{body}: accepted");
        assert!(
            stderr.starts_with(&format!("error: {}: ", cfg.display())) && stderr.contains(needle),
            "{body}: {stderr}"
        );
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(!output.exists(), "{body}: a folder was made");
        assert_eq!(thp_mode(), thp_before, "{body}: set-up ran");
    }
    std::fs::remove_dir_all(&work).expect("clean up");
    std::fs::remove_dir_all(&plugins).expect("clean up");
}
