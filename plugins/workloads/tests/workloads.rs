//! Drives each benchmark through its whole lifecycle with the real programs:
//! is_configured, setup, launch, poll until it ends (or kill), and checks
//! exit codes, removed files and that nothing is left running.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use kernmlops_plugin_sdk::{testing, BenchmarkImpl};
use workloads::{Faux, Fio, Memcached, Redis, StressNg};

/// Setup drops the page cache, so small tests skip it: they run unprivileged
/// too. Root tests keep it.
const NO_DROP: &str = r#""drop_page_cache": false"#;

fn new<B: BenchmarkImpl>(json: &str) -> B {
    let b = B::new(&testing::start_args(json)).unwrap_or_else(|e| panic!("{}: {e}", B::NAME));
    b.is_configured()
        .unwrap_or_else(|e| panic!("{} is not configured: {e}", B::NAME));
    b
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
fn stress_ng_exits_zero() {
    let mut b: StressNg = new(&format!(
        r#"{{{NO_DROP}, "stressor": "cpu", "workers": 1, "timeout": "2s"}}"#
    ));
    let started = Instant::now();
    assert_eq!(run_to_end(&mut b, Duration::from_secs(20)), 0);
    // stress-ng honoured its timeout: it ran about 2 s, not until our limit.
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(10),
        "{took:?}"
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
fn fio_exits_zero_and_removes_its_files() {
    // The default directory is /var/tmp; O_DIRECT needs it disk-backed.
    let base = Path::new("/var/tmp");
    let direct = !is_tmpfs(base);
    let mut b: Fio = new(&format!(
        r#"{{{NO_DROP}, "size": "8m", "runtime": "2s", "direct": {direct}}}"#
    ));
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
}

#[test]
fn root_redis_exits_zero_and_leaves_nothing() {
    if !testing::require_root("root_redis_exits_zero_and_leaves_nothing") {
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
}

#[test]
fn root_memcached_exits_zero_and_leaves_nothing() {
    if !testing::require_root("root_memcached_exits_zero_and_leaves_nothing") {
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
}

/// The selected mode in the kernel's own THP file.
fn thp_now() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
        .map(str::to_owned)
}

#[test]
fn root_thp_mode_is_set_and_restored() {
    if !testing::require_root("root_thp_mode_is_set_and_restored") {
        return;
    }
    let Some(before) = thp_now() else {
        eprintln!("SKIP root_thp_mode_is_set_and_restored: no transparent huge pages here");
        return;
    };
    let other = if before == "never" {
        "madvise"
    } else {
        "never"
    };
    let mut b: Faux = new(&format!(r#"{{"thp_mode": "{other}"}}"#));
    b.setup().expect("setup");
    assert_eq!(thp_now().as_deref(), Some(other), "setup did not set THP");
    b.launch().expect("launch");
    b.kill().expect("kill");
    assert_eq!(thp_now(), Some(before), "kill did not restore THP");
}
