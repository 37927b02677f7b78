//! Workload benchmarks: each runs a real program (stress-ng, fio, redis,
//! memcached, a kernel build, GAP PageRank, a user's script, or nothing at
//! all) in process groups of its own, so `kill` stops everything it
//! started, and reports its own result (a performance indicator) parsed
//! from the tool's output.

use std::{
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use kernmlops_plugin_sdk::{
    benchmark::{MachineSettings, Run},
    export_plugin,
    indicator::Indicator,
    serde_json, settings,
    workload::{self, Workload},
    BenchmarkImpl, Error, Result, StartArgs,
};
use serde::Serialize;

#[macro_use]
mod bench;
pub mod reports;
mod script;
mod servers;
mod split;
mod tools;

use bench::{launch_paths, read_report};

pub use script::{Script, ScriptSettings, TIMEOUT_EXIT_CODE};
pub use servers::{Memcached, MemcachedSettings, Redis, RedisSettings};
pub use split::{
    MemcachedLoad, MemcachedLoadSettings, MemcachedServer, MemcachedServerSettings, RedisLoad,
    RedisLoadSettings, RedisServer, RedisServerSettings,
};
pub use tools::{Gap, GapSettings, LinuxBuild, LinuxBuildSettings};

export_plugin! {
    description: "Workload benchmarks: faux, stress-ng, fio, redis, memcached (whole, or server and load apart), Linux build, GAP PageRank, a user's script",
    probes: [],
    benchmarks: [
        Faux, StressNg, Fio, Redis, Memcached, LinuxBuild, Gap, Script, RedisServer, RedisLoad,
        MemcachedServer, MemcachedLoad,
    ],
}

/// Refuses zero for a count that must be at least 1.
fn at_least_one(key: &str, value: u64) -> std::result::Result<(), String> {
    if value == 0 {
        Err(format!("{key} = 0: use 1 or more"))
    } else {
        Ok(())
    }
}

/// The start of a benchmark's indicator: its name, what it measures, and
/// its effective settings as `@parameters` (`thp_mode` as in force during
/// the run).
fn indicator<S: Serialize>(
    name: &str,
    component: &str,
    settings: &S,
    run: &Run,
) -> Result<Indicator> {
    let mut ind = Indicator::new(name, component).with_parameters(settings)?;
    if let Some(mode) = run.thp_in_force() {
        ind.parameters.insert("thp_mode".into(), mode.into());
    }
    Ok(ind)
}

/// A TCP port on the loopback interface that nothing listens on now.
fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::new(format!("finding a free loopback port: {e}")))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::new(format!("finding a free loopback port: {e}")))
}

/// Waits until `ready` holds, failing early if `server` ends or after
/// `timeout`.
fn wait_ready(
    server: &mut Workload,
    what: &str,
    timeout: Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(code) = server.poll()? {
            return Err(Error::new(format!(
                "{what} exited with code {code} before it answered"
            )));
        }
        if ready() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::new(format!(
                "{what} did not answer within {}s",
                timeout.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// True when something accepts TCP connections on 127.0.0.1:`port`.
fn accepts(port: u16) -> bool {
    TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// Runs `cmd` to completion (setup steps), failing on a non-zero exit.
fn run_to_end(mut cmd: Command, what: &str) -> Result<()> {
    cmd.stdin(Stdio::null());
    let status = cmd
        .status()
        .map_err(|e| Error::new(format!("{what}: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::new(format!("{what} failed: {status}")))
    }
}

// ---------------------------------------------------------------- faux

settings! {
    /// `[benchmarks.faux]` settings.
    pub struct FauxSettings {
        #[flatten]
        pub machine: MachineSettings,
    }
}

benchmark! {
    /// Runs nothing useful (`sleep infinity`) until the host stops it; an
    /// idle machine measures nothing of its own, so there is no result.
    pub struct Faux(FauxSettings) = "faux",
        "Runs no workload until Ctrl+C or --duration: collects an idle machine";
    requires "sleep" => "apt-get install coreutils";
    {
        fn launch(&mut self) -> Result<()> {
            let mut cmd = Command::new("sleep");
            cmd.arg("infinity");
            self.run
                .start(Workload::spawn(cmd, "faux (sleep infinity)")?);
            Ok(())
        }
    }
}

impl Faux {
    /// The process id of the idle workload, once launched.
    pub fn pid(&self) -> Option<u32> {
        self.run.workload().map(Workload::pid)
    }
}

// ---------------------------------------------------------------- stress_ng

settings! {
    /// `[benchmarks.stress_ng]` settings.
    pub struct StressNgSettings {
        #[flatten]
        pub machine: MachineSettings,
        /// The stress-ng stressor (stress-ng --stressor-list).
        pub stressor: String = "cpu".into(),
        /// Worker processes of the stressor (0: one per CPU).
        pub workers: u32 = 2,
        /// How long stress-ng runs (stress-ng's --timeout: 10s, 2m, ...).
        pub timeout: String = "10s".into(),
        /// More stress-ng arguments, as a list.
        pub extra_args: Vec<String> = Vec::new(),
    }
    validate(s) {
        if s.stressor.is_empty() || s.stressor.starts_with('-') {
            return Err(format!(
                "stressor = {:?}: name a stressor, e.g. \"cpu\"",
                s.stressor
            ));
        }
        if s.timeout.trim().is_empty() {
            return Err("timeout = \"\": give stress-ng a run time, e.g. \"10s\"".into());
        }
        Ok(())
    }
}

/// stress-ng's metrics file in the output folder.
const STRESS_NG_YAML: &str = "benchmark.stress-ng.yaml";

benchmark! {
    /// `stress-ng --<stressor> <workers> --timeout <timeout> --metrics --yaml
    /// <output>/benchmark.stress-ng.yaml <extra_args...>`, in a private
    /// folder (its `--temp-path` and working folder).
    pub struct StressNg(StressNgSettings) = "stress_ng",
        "stress-ng with a stressor, worker count and timeout from config";
    requires "stress-ng" => "apt-get install stress-ng";
    setup private;
    {
        fn launch(&mut self) -> Result<()> {
            let (tmp, yaml) = launch_paths(&mut self.run, STRESS_NG_YAML, "stress-ng")?;
            let s = &self.settings;
            let mut cmd = Command::new("stress-ng");
            cmd.current_dir(&tmp)
                .arg("--temp-path")
                .arg(&tmp)
                .arg(format!("--{}", s.stressor))
                .arg(s.workers.to_string())
                .arg("--timeout")
                .arg(&s.timeout)
                .arg("--metrics")
                .arg("--yaml")
                .arg(&yaml)
                .args(&s.extra_args);
            self.run.start_captured(cmd, "stress-ng")
        }

        /// Bogo-ops per stressor from stress-ng's YAML metrics.
        fn result(&self) -> Result<Option<serde_json::Value>> {
            let report = (STRESS_NG_YAML, "stress-ng's metrics");
            let text = read_report(&self.run, Self::NAME, "stress-ng", report)?;
            let mut settings = self.settings.clone();
            if settings.workers == 0 {
                // stress-ng's 0: one worker per online CPU.
                settings.workers =
                    std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
            }
            let ind = indicator(Self::NAME, "stress-ng", &settings, &self.run)?
                .with_results(reports::stress_ng_yaml(&text)?);
            Ok(Some(ind.to_value()?))
        }
    }
}

impl StressNg {
    /// stress-ng's YAML report, once launched.
    pub fn yaml_path(&self) -> Option<PathBuf> {
        self.run.output().map(|o| o.join(STRESS_NG_YAML))
    }
}

// ---------------------------------------------------------------- fio

/// fio's I/O patterns (`--rw`).
const FIO_PATTERNS: &[&str] = &[
    "read",
    "write",
    "randread",
    "randwrite",
    "rw",
    "readwrite",
    "randrw",
    "trim",
    "randtrim",
    "trimwrite",
];

settings! {
    /// `[benchmarks.fio]` settings.
    pub struct FioSettings {
        #[flatten]
        pub machine: MachineSettings,
        /// I/O pattern (fio --rw): read, write, randread, randwrite, rw, randrw.
        pub rw: String = "randrw".into(),
        /// Block size (fio --bs).
        pub bs: String = "4k".into(),
        /// File size per job (fio --size).
        pub size: String = "64m".into(),
        /// Longest run (fio --runtime); the job ends earlier once size is done.
        pub runtime: String = "10s".into(),
        /// O_DIRECT I/O, bypassing the page cache (needs a file system that supports it, not tmpfs).
        pub direct: bool = true,
        /// Where the job's files go, in a fresh subdirectory removed afterwards ("": /var/tmp).
        pub directory: String = String::new(),
        /// fio --ioengine.
        pub ioengine: String = "psync".into(),
        /// Parallel jobs (fio --numjobs).
        pub numjobs: u32 = 1,
    }
    validate(s) {
        at_least_one("numjobs", u64::from(s.numjobs))?;
        if !FIO_PATTERNS.contains(&s.rw.as_str()) {
            return Err(format!("rw = {:?}: use one of {}", s.rw, FIO_PATTERNS.join(", ")));
        }
        for (key, value) in [("bs", &s.bs), ("size", &s.size), ("runtime", &s.runtime), ("ioengine", &s.ioengine)] {
            if value.trim().is_empty() || value.starts_with('-') {
                return Err(format!("{key} = {value:?}: give fio a value"));
            }
        }
        if !s.directory.is_empty() && !s.directory.starts_with('/') {
            return Err(format!("directory = {:?}: give an absolute path", s.directory));
        }
        Ok(())
    }
}

/// fio's JSON report in the output folder.
const FIO_JSON: &str = "benchmark.fio.json";

benchmark! {
    /// One fio job from config, its files in a private directory (the run's)
    /// that `kill` removes, its JSON report in the output folder.
    pub struct Fio(FioSettings) = "fio",
        "fio with one job from config (pattern, block size, size, runtime)";
    setup custom;
    {
        fn is_configured(&self) -> Result<()> {
            workload::require_program("fio", "apt-get install fio")?;
            let d = &self.settings.directory;
            if !d.is_empty() && !Path::new(d).is_dir() {
                return Err(Error::new(format!(
                    "[benchmarks.fio] directory = {d:?} is not a directory"
                )));
            }
            Ok(())
        }

        fn setup(&mut self) -> Result<()> {
            let base = PathBuf::from(self.base_dir());
            self.run.private_dir(Some(&base))?;
            self.run.prepare(&self.settings.machine)
        }

        fn launch(&mut self) -> Result<()> {
            let (dir, json) = launch_paths(&mut self.run, FIO_JSON, "fio")?;
            let s = &self.settings;
            let mut cmd = Command::new("fio");
            cmd.arg("--name=kernmlops")
                .arg(format!("--directory={}", dir.display()))
                .arg(format!("--rw={}", s.rw))
                .arg(format!("--bs={}", s.bs))
                .arg(format!("--size={}", s.size))
                .arg(format!("--runtime={}", s.runtime))
                .arg(format!("--direct={}", u8::from(s.direct)))
                .arg(format!("--ioengine={}", s.ioengine))
                .arg(format!("--numjobs={}", s.numjobs))
                .arg("--group_reporting")
                .arg("--output-format=json")
                .arg(format!("--output={}", json.display()));
            self.run.start_captured(cmd, "fio")
        }

        /// IOPS, bandwidth and completion latency from fio's JSON report.
        fn result(&self) -> Result<Option<serde_json::Value>> {
            let report = (FIO_JSON, "fio's JSON report");
            let text = read_report(&self.run, Self::NAME, "fio", report)?;
            let mut settings = self.settings.clone();
            settings.directory = self.base_dir().to_owned();
            let ind = indicator(Self::NAME, "fio", &settings, &self.run)?
                .with_results(reports::fio_json(&text)?);
            Ok(Some(ind.to_value()?))
        }
    }
}

impl Fio {
    /// The directory the job's files are in (after `setup`).
    pub fn data_dir(&self) -> Option<&Path> {
        self.run.private_path()
    }

    /// fio's JSON report (`--output`), once launched.
    pub fn json_path(&self) -> Option<PathBuf> {
        self.run.output().map(|o| o.join(FIO_JSON))
    }

    /// The folder the job's directory is made in.
    fn base_dir(&self) -> &str {
        let d = &self.settings.directory;
        // /var/tmp rather than /tmp: /tmp is often tmpfs, which has no O_DIRECT.
        if d.is_empty() {
            "/var/tmp"
        } else {
            d.as_str()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults `B` shows parse into settings equal to `S::default()`.
    pub(crate) fn check_defaults<B: BenchmarkImpl, S>()
    where
        S: serde::de::DeserializeOwned + Default + PartialEq + std::fmt::Debug,
    {
        kernmlops_plugin_testing::check_benchmark_config_defaults::<B, S>();
    }

    pub(crate) fn new_err<B: BenchmarkImpl>(json: &str) -> String {
        match B::new(&kernmlops_plugin_testing::start_args(json)) {
            Ok(_) => panic!("{}: {json} accepted", B::NAME),
            Err(e) => e.message,
        }
    }

    #[test]
    fn defaults_match_settings() {
        check_defaults::<Faux, FauxSettings>();
        check_defaults::<StressNg, StressNgSettings>();
        check_defaults::<Fio, FioSettings>();
        check_defaults::<Redis, RedisSettings>();
        check_defaults::<Memcached, MemcachedSettings>();
        check_defaults::<LinuxBuild, LinuxBuildSettings>();
        check_defaults::<Gap, GapSettings>();
        check_defaults::<Script, ScriptSettings>();
        check_defaults::<RedisServer, RedisServerSettings>();
        check_defaults::<RedisLoad, RedisLoadSettings>();
        check_defaults::<MemcachedServer, MemcachedServerSettings>();
        check_defaults::<MemcachedLoad, MemcachedLoadSettings>();
    }

    #[test]
    fn bad_settings_name_the_key() {
        for e in [
            new_err::<Faux>(r#"{"bogus": 1}"#),
            new_err::<StressNg>(r#"{"bogus": 1}"#),
            new_err::<Fio>(r#"{"bogus": 1}"#),
            new_err::<Redis>(r#"{"bogus": 1}"#),
            new_err::<Memcached>(r#"{"bogus": 1}"#),
            new_err::<LinuxBuild>(r#"{"bogus": 1}"#),
            new_err::<Gap>(r#"{"bogus": 1}"#),
            new_err::<Script>(r#"{"bogus": 1}"#),
            new_err::<RedisServer>(r#"{"bogus": 1}"#),
            new_err::<RedisLoad>(r#"{"bogus": 1}"#),
            new_err::<MemcachedServer>(r#"{"bogus": 1}"#),
            new_err::<MemcachedLoad>(r#"{"bogus": 1}"#),
        ] {
            assert!(e.contains("bogus") && e.contains("[benchmarks."), "{e}");
        }
        let e = new_err::<StressNg>(r#"{"workers": "two"}"#);
        assert!(e.contains("stress_ng") && e.contains("invalid type"), "{e}");
        let e = new_err::<Fio>(r#"{"thp_mode": "sometimes"}"#);
        assert!(e.contains("thp_mode") && e.contains("sometimes"), "{e}");
        let e = new_err::<Fio>(r#"{"numjobs": 0}"#);
        assert!(e.contains("numjobs"), "{e}");
    }

    /// Out-of-range values are refused by each settings' `validate`, so
    /// the host's config check (the plugin's `check_config`) catches them
    /// before anything runs; each message starts with the key.
    #[test]
    fn ranges_are_checked_by_the_settings_rules() {
        type NewErr = fn(&str) -> String;
        let cases: &[(&str, NewErr, &str)] = &[
            ("faux", new_err::<Faux>, r#"{"thp_mode": "huge"}"#),
            ("stress_ng", new_err::<StressNg>, r#"{"stressor": "--cpu"}"#),
            ("stress_ng", new_err::<StressNg>, r#"{"timeout": " "}"#),
            ("fio", new_err::<Fio>, r#"{"numjobs": 0}"#),
            ("fio", new_err::<Fio>, r#"{"rw": "sideways"}"#),
            ("fio", new_err::<Fio>, r#"{"bs": ""}"#),
            ("fio", new_err::<Fio>, r#"{"directory": "relative/dir"}"#),
            ("redis", new_err::<Redis>, r#"{"requests": 0}"#),
            ("redis", new_err::<Redis>, r#"{"clients": 0}"#),
            ("redis", new_err::<Redis>, r#"{"clients": 20000}"#),
            ("redis", new_err::<Redis>, r#"{"tests": ""}"#),
            ("memcached", new_err::<Memcached>, r#"{"test": "put"}"#),
            ("memcached", new_err::<Memcached>, r#"{"memory_mb": 0}"#),
            ("memcached", new_err::<Memcached>, r#"{"concurrency": 0}"#),
            (
                "memcached",
                new_err::<Memcached>,
                r#"{"execute_number": 0}"#,
            ),
            ("redis_server", new_err::<RedisServer>, r#"{"port": 70000}"#),
            ("redis_server", new_err::<RedisServer>, r#"{"bind": "-x"}"#),
            ("redis_load", new_err::<RedisLoad>, r#"{"clients": 0}"#),
            ("redis_load", new_err::<RedisLoad>, r#"{"host": "a b"}"#),
            (
                "memcached_server",
                new_err::<MemcachedServer>,
                r#"{"memory_mb": 0}"#,
            ),
            (
                "memcached_load",
                new_err::<MemcachedLoad>,
                r#"{"test": "put"}"#,
            ),
            ("linux_build", new_err::<LinuxBuild>, r#"{"target": ""}"#),
            ("gap", new_err::<Gap>, r#"{"scale": 0}"#),
            ("gap", new_err::<Gap>, r#"{"scale": 40}"#),
            ("gap", new_err::<Gap>, r#"{"trials": 0}"#),
            ("script", new_err::<Script>, r#"{"timeout": "soon"}"#),
            ("script", new_err::<Script>, r#"{"command": [""]}"#),
        ];
        for (name, new, json) in cases {
            let e = new(json);
            let key = json
                .trim_start_matches("{\"")
                .split('"')
                .next()
                .expect("a key");
            let section = format!("[benchmarks.{name}]: ");
            assert!(
                e.starts_with(&section) && e.contains(key),
                "{name} {json}: {e}"
            );
        }
        // serde names no key for a number too large for its type: the host
        // finds the key by trying the user's keys one at a time.
        let e = new_err::<Gap>(r#"{"trials": 5000000000}"#);
        assert!(e.contains("expected u32"), "{e}");
    }

    #[test]
    fn missing_directory_is_reported() {
        let fio = Fio::new(&kernmlops_plugin_testing::start_args(
            r#"{"directory": "/no/such/dir-kml"}"#,
        ))
        .expect("settings");
        let e = fio.is_configured().expect_err("missing directory");
        assert!(e.message.contains("/no/such/dir-kml"), "{e}");
    }
}
