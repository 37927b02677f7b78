//! Drives each benchmark through its whole lifecycle with the real programs:
//! is_configured, setup, launch, poll until it ends (or kill), and checks
//! exit codes, removed files, that nothing is left running, and that the
//! result each reports holds the tool's own, plausible figures.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use kernmlops_plugin_sdk::{indicator::Indicator, serde_json, BenchmarkImpl};
use kernmlops_plugin_testing as testing;
use workloads::{Faux, Fio, Gap, LinuxBuild, Memcached, Redis, Script, StressNg};

/// Setup drops the page cache, so small tests skip it: they run unprivileged
/// too. Root tests keep it.
const NO_DROP: &str = r#""drop_page_cache": false"#;

fn new<B: BenchmarkImpl>(json: &str) -> B {
    new_in::<B>(json, "")
}

/// A benchmark whose output folder (`StartArgs::output_dir`) is `dir`.
fn new_in<B: BenchmarkImpl>(json: &str, dir: &str) -> B {
    let mut args = testing::start_args(json);
    args.output_dir = dir.into();
    let b = B::new(&args).unwrap_or_else(|e| panic!("{}: {e}", B::NAME));
    b.is_configured()
        .unwrap_or_else(|e| panic!("{} is not configured: {e}", B::NAME));
    b
}

/// A fresh, empty folder for one test, removed by [`TempDir`]'s drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("kml-workloads-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }

    fn str(&self) -> &str {
        self.0.to_str().expect("utf8 temp dir")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The benchmark's result, which must be a valid indicator named after it.
fn result_of<B: BenchmarkImpl>(b: &B) -> Indicator {
    let value = b
        .result()
        .unwrap_or_else(|e| panic!("{} result: {e}", B::NAME))
        .unwrap_or_else(|| panic!("{} reported no result", B::NAME));
    let ind = Indicator::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{} result is not an indicator: {e}\n{value}", B::NAME));
    assert!(!ind.result.is_empty(), "{} reported no figures", B::NAME);
    ind
}

/// A figure of `@result` as a number.
fn figure(ind: &Indicator, key: &str) -> f64 {
    ind.result
        .get(key)
        .and_then(serde_json::Value::as_f64)
        .unwrap_or_else(|| panic!("no number {key} in {:?}", ind.result))
}

/// Polls until the benchmark reports its exit code, or kills it and fails
/// after `limit`.
fn run_to_end<B: BenchmarkImpl>(b: &mut B, limit: Duration) -> i32 {
    b.setup()
        .unwrap_or_else(|e| panic!("{} setup: {e}", B::NAME));
    b.launch()
        .unwrap_or_else(|e| panic!("{} launch: {e}", B::NAME));
    let deadline = Instant::now() + limit;
    let code = loop {
        match b.poll() {
            Ok(Some(code)) => break code,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                let _ = b.kill();
                panic!("{} still running after {limit:?}", B::NAME);
            }
            Err(e) => {
                let _ = b.kill();
                panic!("{} poll: {e}", B::NAME);
            }
        }
    };
    b.kill().unwrap_or_else(|e| panic!("{} kill: {e}", B::NAME));
    code
}

/// Processes (pid, command line) whose command line contains `needle`,
/// read from /proc: independent of the benchmark's own bookkeeping.
fn processes_with(needle: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        if cmdline.contains(needle) && pid != std::process::id() {
            found.push((pid, cmdline));
        }
    }
    found
}

/// True while process `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

#[test]
fn stress_ng_exits_zero_and_reports_bogo_ops() {
    let out = TempDir::new("stress-ng");
    let mut b: StressNg = new_in(
        &format!(r#"{{{NO_DROP}, "stressor": "cpu", "workers": 1, "timeout": "2s"}}"#),
        out.str(),
    );
    let started = Instant::now();
    assert_eq!(run_to_end(&mut b, Duration::from_secs(20)), 0);
    // stress-ng honoured its timeout: it ran about 2 s, not until our limit.
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(10),
        "{took:?}"
    );
    let ind = result_of(&b);
    assert_eq!(ind.name, "stress_ng");
    assert_eq!(ind.parameters["stressor"], "cpu");
    assert_eq!(ind.parameters["workers"], 1);
    let ops = figure(&ind, "cpu_bogo_ops");
    let rate = figure(&ind, "cpu_bogo_ops_per_s");
    // About 2 s of work: the rate is the count over roughly that time.
    assert!(ops > 0.0 && rate > 0.0, "{:?}", ind.result);
    assert!(
        (ops / rate - 2.0).abs() < 0.5,
        "{ops} bogo ops at {rate}/s is not about 2 s"
    );
    let yaml = std::fs::read_to_string(out.0.join("benchmark.stress-ng.yaml")).expect("yaml kept");
    assert!(
        yaml.contains(&format!("bogo-ops: {ops}")),
        "figure not from stress-ng's YAML"
    );
}

#[test]
fn stress_ng_failure_reports_nonzero() {
    let mut b: StressNg = new(&format!(
        r#"{{{NO_DROP}, "timeout": "2s", "extra_args": ["--bogus-option"]}}"#
    ));
    let code = run_to_end(&mut b, Duration::from_secs(20));
    assert_ne!(code, 0, "stress-ng accepted --bogus-option");
}

#[test]
fn fio_exits_zero_removes_its_files_and_reports_iops() {
    // The default directory is /var/tmp; O_DIRECT needs it disk-backed.
    let base = Path::new("/var/tmp");
    let direct = !is_tmpfs(base);
    let out = TempDir::new("fio");
    let mut b: Fio = new_in(
        &format!(r#"{{{NO_DROP}, "size": "8m", "runtime": "2s", "direct": {direct}}}"#),
        out.str(),
    );
    b.setup().expect("setup");
    let dir = b.data_dir().expect("data dir after setup").to_path_buf();
    assert!(dir.starts_with(base) && dir.is_dir(), "{}", dir.display());
    b.launch().expect("launch");
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(code) = b.poll().expect("poll") {
            break code;
        }
        if Instant::now() > deadline {
            let _ = b.kill();
            panic!("fio still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // fio laid out its 8 MiB file in the directory.
    let bytes: u64 = std::fs::read_dir(&dir)
        .expect("fio dir")
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    assert_eq!(bytes, 8 << 20, "fio's files in {}", dir.display());
    b.kill().expect("kill");
    assert_eq!(code, 0);
    assert!(!dir.exists(), "{} left behind", dir.display());

    let ind = result_of(&b);
    assert_eq!(ind.parameters["bs"], "4k");
    assert_eq!(ind.parameters["directory"], "/var/tmp");
    // The figures are fio's own: equal to its JSON report, kept in the
    // output folder.
    let json = b.json_path().expect("json path");
    assert_eq!(json, out.0.join("benchmark.fio.json"));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("fio's JSON kept"))
            .expect("fio's JSON parses");
    let job = &report["jobs"][0];
    for dir in ["read", "write"] {
        let iops = figure(&ind, &format!("{dir}_iops"));
        assert_eq!(Some(iops), job[dir]["iops"].as_f64(), "{dir} iops");
        assert!(iops > 0.0, "randrw does {dir}s");
        // 4 KiB blocks: bandwidth is IOPS times 4096 bytes.
        let bw = figure(&ind, &format!("{dir}_bw_bytes_per_s"));
        assert!(
            (bw / (iops * 4096.0) - 1.0).abs() < 0.02,
            "{dir}: {bw} B/s at {iops} IOPS of 4 KiB"
        );
        let mean = figure(&ind, &format!("{dir}_clat_mean_us"));
        let p99 = figure(&ind, &format!("{dir}_clat_p99_us"));
        assert!(
            mean > 0.0 && p99 >= mean * 0.5,
            "{dir}: mean {mean} us, p99 {p99} us"
        );
    }
    // The whole 8 MiB file was read or written, unless the 2 s ran out.
    let moved = figure(&ind, "read_io_bytes") + figure(&ind, "write_io_bytes");
    assert!(moved > 0.0 && moved <= (8 << 20) as f64, "{moved} bytes");
}

fn is_tmpfs(path: &Path) -> bool {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return false;
    };
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2).then(|| (f[1].to_owned(), f[2].to_owned()))
        })
        .filter(|(mnt, _)| path.starts_with(mnt))
        .max_by_key(|(mnt, _)| mnt.len())
        .is_some_and(|(_, fs)| fs == "tmpfs")
}

#[test]
fn faux_runs_until_killed() {
    let mut b: Faux = new(&format!("{{{NO_DROP}}}"));
    b.setup().expect("setup");
    b.launch().expect("launch");
    let pid = b.pid().expect("pid after launch");
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        assert_eq!(b.poll().expect("poll"), None, "faux ended on its own");
        std::thread::sleep(Duration::from_millis(100));
    }
    // By now the child has exec'd: /proc shows the workload's command line.
    assert!(
        processes_with("sleep infinity")
            .iter()
            .any(|(p, _)| *p == pid),
        "faux's sleep infinity ({pid}) is not running"
    );
    b.kill().expect("kill");
    assert!(!alive(pid), "faux's sleep {pid} survived kill()");
    assert_eq!(b.result().expect("result"), None, "faux measures nothing");
}

#[test]
fn root_redis_exits_zero_leaves_nothing_and_reports_rps() {
    if !testing::require_root("root_redis_exits_zero_leaves_nothing_and_reports_rps") {
        return;
    }
    let mut b: Redis = new(r#"{"requests": 20000, "clients": 10}"#);
    b.setup().expect("setup");
    b.launch().expect("launch");
    let port = b.port();
    let server = b.server_pid().expect("server pid");
    let needle = format!("127.0.0.1:{port}");
    let running = processes_with(&needle);
    assert!(
        running
            .iter()
            .any(|(pid, cmd)| *pid == server && cmd.contains("redis-server")),
        "no redis-server on {needle}: {running:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(code) = b.poll().expect("poll") {
            break code;
        }
        if Instant::now() > deadline {
            let _ = b.kill();
            panic!("redis-benchmark still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, 0);
    // The server outlives the benchmark until kill().
    assert!(alive(server), "redis-server ended before kill()");
    b.kill().expect("kill");
    let left: Vec<_> = processes_with(&needle)
        .into_iter()
        .filter(|(pid, _)| alive(*pid))
        .collect();
    assert!(left.is_empty(), "left running: {left:?}");
    assert!(!alive(server), "redis-server {server} survived kill()");

    let ind = result_of(&b);
    assert_eq!(ind.component, "redis");
    assert_eq!(ind.parameters["requests"], 20000);
    for test in ["set", "get"] {
        let rps = figure(&ind, &format!("{test}_rps"));
        let p50 = figure(&ind, &format!("{test}_p50_latency_ms"));
        let p99 = figure(&ind, &format!("{test}_p99_latency_ms"));
        // Loopback on any machine: well above 1000 requests/s, and 10
        // clients waiting p50 each give about rps = 10 / p50.
        assert!(rps > 1000.0, "{test}: {rps} requests/s");
        assert!(
            0.0 < p50 && p50 <= p99,
            "{test}: p50 {p50} ms, p99 {p99} ms"
        );
        assert!(
            rps < 10.0 / (p50 / 1e3) * 10.0,
            "{test}: {rps} requests/s with 10 clients at p50 {p50} ms"
        );
    }
}

#[test]
fn root_memcached_exits_zero_leaves_nothing_and_reports_ops() {
    if !testing::require_root("root_memcached_exits_zero_leaves_nothing_and_reports_ops") {
        return;
    }
    let mut b: Memcached = new(r#"{"execute_number": 2000, "concurrency": 2}"#);
    b.setup().expect("setup");
    b.launch().expect("launch");
    let port = b.port();
    let server = b.server_pid().expect("server pid");
    let needle = format!("-p {port} ");
    let running = processes_with(&needle);
    assert!(
        running
            .iter()
            .any(|(pid, cmd)| *pid == server && cmd.starts_with("memcached")),
        "no memcached with {needle:?}: {running:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(code) = b.poll().expect("poll") {
            break code;
        }
        if Instant::now() > deadline {
            let _ = b.kill();
            panic!("memcslap still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, 0);
    b.kill().expect("kill");
    let left: Vec<_> = processes_with(&needle)
        .into_iter()
        .filter(|(pid, c)| alive(*pid) && c.contains("memcached"))
        .collect();
    assert!(left.is_empty(), "left running: {left:?}");
    assert!(!alive(server), "memcached {server} survived kill()");

    let ind = result_of(&b);
    assert_eq!(ind.component, "memcached");
    // memcslap ran execute_number operations on each of its 2 threads.
    assert_eq!(figure(&ind, "ops"), 4000.0);
    let rate = figure(&ind, "ops_per_s");
    let elapsed = figure(&ind, "elapsed_s");
    assert!(
        (rate * elapsed - 4000.0).abs() < 1.0,
        "{rate}/s over {elapsed} s"
    );
    let latency = figure(&ind, "mean_latency_us");
    assert!(
        (latency - elapsed * 2.0 / 4000.0 * 1e6).abs() < 1e-3,
        "{latency} us"
    );
}

/// The selected mode in the kernel's own THP file.
fn thp_now() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
        .map(str::to_owned)
}

/// `thp_mode` is applied by the host (as the `machine.thp_mode` knob), not
/// by the benchmark: a benchmark given the setting leaves the kernel's mode
/// as it found it, through setup and kill.
#[test]
fn thp_mode_setting_leaves_the_kernel_mode_to_the_host() {
    let Some(before) = thp_now() else {
        eprintln!("SKIP thp_mode_setting_leaves_the_kernel_mode_to_the_host: no transparent huge pages here");
        return;
    };
    let other = if before == "never" {
        "madvise"
    } else {
        "never"
    };
    let mut b: Faux = new(&format!(r#"{{{NO_DROP}, "thp_mode": "{other}"}}"#));
    b.setup().expect("setup");
    assert_eq!(thp_now(), Some(before.clone()), "setup changed THP");
    b.launch().expect("launch");
    b.kill().expect("kill");
    assert_eq!(thp_now(), Some(before), "kill changed THP");
}

/// `examples/<name>` of this crate.
fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
        .to_str()
        .expect("utf8 path")
        .to_owned()
}

/// A script benchmark running `command` (JSON list) with `extra` settings,
/// its output in `out`, run to its end.
fn run_script(out: &TempDir, command: &str, extra: &str) -> (Script, i32) {
    let mut b: Script = new_in(
        &format!(r#"{{{NO_DROP}, "command": {command}{extra}}}"#),
        out.str(),
    );
    let code = run_to_end(&mut b, Duration::from_secs(30));
    (b, code)
}

#[test]
fn script_examples_report_valid_indicators() {
    let out = TempDir::new("script-dd");
    let (b, code) = run_script(
        &out,
        &format!(r#"["{}"]"#, example("dd_throughput.sh")),
        r#", "parameters": {"block_size": "64k", "count": 512, "note": "from config"}"#,
    );
    assert_eq!(code, 0);
    let ind = result_of(&b);
    assert_eq!(ind.name, "dd_throughput");
    // The script saw its parameters (KML_PARAM_*): 512 blocks of 64 KiB.
    assert_eq!(figure(&ind, "bytes"), (512 * 64 * 1024) as f64);
    assert_eq!(ind.parameters["block_size"], "64k");
    assert_eq!(
        ind.parameters["note"], "from config",
        "configured parameters the script does not report are added"
    );
    assert!(figure(&ind, "bytes_per_s") > 0.0);
    // dd's own report went to standard error, kept as benchmark.stderr.
    let stderr = std::fs::read_to_string(out.0.join("benchmark.stderr")).expect("stderr kept");
    assert!(
        stderr.contains("bytes") && stderr.contains("copied"),
        "{stderr:?}"
    );

    if !Path::new("/usr/bin/python3").exists() {
        eprintln!("SKIP the python example: /usr/bin/python3 is not installed");
        return;
    }
    let out = TempDir::new("script-py");
    let (b, code) = run_script(
        &out,
        &format!(r#"["python3", "{}"]"#, example("sort_numbers.py")),
        r#", "parameters": {"n": 5000, "seed": 7}"#,
    );
    assert_eq!(code, 0);
    let ind = result_of(&b);
    assert_eq!(ind.name, "sort_numbers");
    assert_eq!(ind.parameters["n"], 5000, "read from KML_PARAMETERS");
    assert_eq!(ind.parameters["seed"], 7);
    assert!(figure(&ind, "items_per_s") > 0.0);
    assert!(ind.result["python"].is_string());
    let stderr = std::fs::read_to_string(out.0.join("benchmark.stderr")).expect("stderr kept");
    assert!(
        stderr.contains("sorting 5000 numbers (seed 7)"),
        "{stderr:?}"
    );
}

#[test]
fn script_with_a_bad_indicator_gives_the_reason() {
    let collide =
        r#"{"name": "c", "component": "sh", "@parameters": {"n": 1}, "@result": {"n": 2}}"#;
    for (name, script, extra, needle) in [
        (
            "garbage",
            "echo hello world".to_owned(),
            "",
            "not a performance indicator: not one JSON object",
        ),
        (
            "empty",
            "echo only on stderr >&2".to_owned(),
            "",
            "no output",
        ),
        (
            "no-result",
            r#"echo '{"name": "a", "component": "sh"}'"#.to_owned(),
            "",
            "\"@result\" is missing",
        ),
        (
            "collision",
            format!("echo '{collide}'"),
            "",
            "key \"n\" is in both",
        ),
        // A configured parameter the script also reports as a figure.
        (
            "parameter-collision",
            r#"echo '{"name": "a", "component": "sh", "@result": {"size": 3}}'"#.to_owned(),
            r#", "parameters": {"size": 3}"#,
            "key \"size\" is in both",
        ),
        (
            "two-objects",
            r#"echo '{"name": "a", "component": "sh", "@result": {}}'; echo '{}'"#.to_owned(),
            "",
            "trailing characters",
        ),
    ] {
        let out = TempDir::new(&format!("script-{name}"));
        let script = serde_json::to_string(&script).expect("json string");
        let (b, code) = run_script(&out, &format!(r#"["sh", "-c", {script}]"#), extra);
        assert_eq!(code, 0, "{name}");
        let e = b.result().expect_err(name);
        assert!(
            e.message.starts_with("script sh: ") && e.message.contains(needle),
            "{name}: {e}"
        );
    }
}

#[test]
fn script_timeout_stops_it_and_fails() {
    let out = TempDir::new("script-timeout");
    let marker = format!("kml-script-timeout-{}", std::process::id());
    let script = format!("sh -c 'sleep 30; : {marker}' & wait");
    let started = Instant::now();
    let (b, code) = run_script(
        &out,
        &format!(r#"["sh", "-c", "{script}"]"#),
        r#", "timeout": "500ms""#,
    );
    assert_eq!(code, workloads::TIMEOUT_EXIT_CODE);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let left: Vec<_> = processes_with(&marker)
        .into_iter()
        .filter(|(pid, _)| alive(*pid))
        .collect();
    assert!(left.is_empty(), "left running: {left:?}");
    let e = b.result().expect_err("timed out");
    assert!(e.message.contains("timeout of 500ms"), "{e}");
}

#[test]
fn script_stopped_early_has_no_result() {
    let out = TempDir::new("script-killed");
    let mut b: Script = new_in(
        &format!(r#"{{{NO_DROP}, "command": ["sleep", "30"]}}"#),
        out.str(),
    );
    b.setup().expect("setup");
    b.launch().expect("launch");
    assert_eq!(b.poll().expect("poll"), None);
    b.kill().expect("kill");
    let e = b.result().expect_err("killed");
    assert!(e.message.contains("stopped before it finished"), "{e}");
}

/// A directory that passes `linux_build`'s checks and whose "build" is a
/// real make run of about one second.
fn fake_kernel_tree() -> TempDir {
    let tree = TempDir::new("linux-tree");
    for d in ["kernel", "arch"] {
        std::fs::create_dir_all(tree.0.join(d)).expect("dir");
    }
    std::fs::write(tree.0.join("Kconfig"), "").expect("Kconfig");
    std::fs::write(tree.0.join(".config"), "").expect(".config");
    std::fs::write(
        tree.0.join("Makefile"),
        "vmlinux:\n\tsleep 1\n\t@echo built\nclean:\n\t@echo cleaned\n",
    )
    .expect("Makefile");
    tree
}

#[test]
fn linux_build_reports_its_build_time() {
    let tree = fake_kernel_tree();
    let out = TempDir::new("linux-out");
    let mut b: LinuxBuild = new_in(
        &format!(
            r#"{{{NO_DROP}, "source_dir": "{}", "jobs": 2}}"#,
            tree.str()
        ),
        out.str(),
    );
    assert_eq!(run_to_end(&mut b, Duration::from_secs(30)), 0);
    let ind = result_of(&b);
    assert_eq!(ind.parameters["jobs"], 2);
    let took = figure(&ind, "build_s");
    assert!((1.0..3.0).contains(&took), "a 1 s make took {took} s");
    let stdout = std::fs::read_to_string(out.0.join("benchmark.stdout")).expect("make's output");
    assert!(stdout.contains("built"), "{stdout:?}");
}

/// Needs a built GAP suite: `KML_GAPBS_DIR=/path/to/gapbs` (git clone
/// https://github.com/sbeamer/gapbs && make -C gapbs pr).
#[test]
fn gap_reports_trial_times() {
    let Some(suite) = std::env::var_os("KML_GAPBS_DIR") else {
        eprintln!("SKIP gap_reports_trial_times: set KML_GAPBS_DIR to a built GAP suite");
        return;
    };
    let suite = suite.to_str().expect("utf8 KML_GAPBS_DIR").to_owned();
    let mut b: Gap = new(&format!(
        r#"{{{NO_DROP}, "suite_dir": "{suite}", "scale": 12, "trials": 3}}"#
    ));
    assert_eq!(run_to_end(&mut b, Duration::from_secs(60)), 0);
    let ind = result_of(&b);
    let trials: Vec<f64> = (1..=3)
        .map(|i| figure(&ind, &format!("trial_{i}_s")))
        .collect();
    assert!(trials.iter().all(|t| *t > 0.0), "{trials:?}");
    let mean = figure(&ind, "mean_trial_s");
    // pr prints its average with 5 decimals.
    let ours = trials.iter().sum::<f64>() / 3.0;
    assert!(
        (mean - ours).abs() < 2e-5,
        "pr's mean {mean} against {ours}"
    );
}
