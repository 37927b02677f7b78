//! Server benchmarks: a private server on a free loopback port, loaded by
//! its own benchmark client; both are stopped in `kill`. The client's
//! report (kept in the output folder) is the benchmark's result.

use std::process::{Command, Stdio};

use kernmlops_plugin_sdk::{
    benchmark::{MachineSettings, Run},
    serde_json, settings,
    workload::{self, Workload},
    BenchmarkImpl, Result, StartArgs,
};

use crate::{
    accepts, at_least_one, free_port, indicator, reports,
    split::{
        check_memcached_load, check_redis_load, memcached, memcslap, redis_benchmark, spawn_server,
    },
};

// ---------------------------------------------------------------- redis

settings! {
    /// `[benchmarks.redis]` settings.
    pub struct RedisSettings {
        #[flatten]
        pub machine: MachineSettings,
        /// Requests in total (redis-benchmark -n).
        pub requests: u64 = 100_000,
        /// Parallel connections (redis-benchmark -c).
        pub clients: u32 = 50,
        /// Commands to benchmark (redis-benchmark -t), comma-separated.
        pub tests: String = "set,get".into(),
    }
    validate(s) {
        check_redis_load(s.requests, s.clients, &s.tests)
    }
}

/// A private redis-server (its `--dir` and log in the run's private
/// folder) loaded by redis-benchmark.
pub struct Redis {
    settings: RedisSettings,
    run: Run,
    port: u16,
}

impl Redis {
    /// The loopback port of the server (0 before `launch`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id, once launched.
    pub fn server_pid(&self) -> Option<u32> {
        self.run.server().map(Workload::pid)
    }

    fn answers_ping(port: u16) -> bool {
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "ping"])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .is_ok_and(|o| o.status.success() && o.stdout.starts_with(b"PONG"))
    }
}

impl BenchmarkImpl for Redis {
    const NAME: &'static str = "redis";
    const DESCRIPTION: &'static str =
        "A private redis-server on a free loopback port, loaded by redis-benchmark";

    type Settings = RedisSettings;

    fn create(args: &StartArgs, settings: RedisSettings) -> Result<Self> {
        Ok(Self {
            settings,
            run: Run::new(Self::NAME, args),
            port: 0,
        })
    }

    fn is_configured(&self) -> Result<()> {
        workload::require_program("redis-server", "apt-get install redis-server redis-tools")?;
        workload::require_program("redis-cli", "apt-get install redis-tools")?;
        workload::require_program("redis-benchmark", "apt-get install redis-tools")?;
        Ok(())
    }

    fn setup(&mut self) -> Result<()> {
        self.run.private_dir(None)?;
        self.run.prepare(&self.settings.machine)
    }

    fn launch(&mut self) -> Result<()> {
        let dir = self.run.private_path_for_launch()?;
        self.port = free_port()?;
        let port = self.port.to_string();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port, "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(dir.join("redis-server.log"))
            .stdout(Stdio::null());
        let what = format!(
            "redis-server on port {port} (log: {})",
            dir.join("redis-server.log").display()
        );
        let p = self.port;
        let server = spawn_server(cmd, "redis-server", None, &what, || Self::answers_ping(p))?;
        self.run.start_server(server);

        let s = &self.settings;
        let cmd = redis_benchmark("127.0.0.1", p, s.requests, s.clients, &s.tests);
        self.run.start_captured(cmd, "redis-benchmark")
    }

    fn run(&mut self) -> &mut Run {
        &mut self.run
    }

    /// Requests per second and latencies per test from redis-benchmark's
    /// CSV (its standard output).
    fn result(&self) -> Result<Option<serde_json::Value>> {
        let client = self.run.finished("redis-benchmark")?;
        let csv = client.read_stdout()?;
        let ind = indicator(Self::NAME, "redis", &self.settings, &self.run)?
            .with_results(reports::redis_csv(&csv)?);
        Ok(Some(ind.to_value()?))
    }
}

// ---------------------------------------------------------------- memcached

settings! {
    /// `[benchmarks.memcached]` settings.
    pub struct MemcachedSettings {
        #[flatten]
        pub machine: MachineSettings,
        /// Item memory of the server in MiB (memcached -m).
        pub memory_mb: u32 = 64,
        /// Test to perform (memcslap --test): get, mget or set.
        pub test: String = "set".into(),
        /// Client threads (memcslap --concurrency).
        pub concurrency: u32 = 4,
        /// Operations per thread (memcslap --execute-number).
        pub execute_number: u64 = 10_000,
    }
    validate(s) {
        at_least_one("memory_mb", u64::from(s.memory_mb))?;
        check_memcached_load(&s.test, s.concurrency, s.execute_number)
    }
}

/// A private memcached loaded by libmemcached's memcslap.
pub struct Memcached {
    settings: MemcachedSettings,
    run: Run,
    port: u16,
}

impl Memcached {
    /// The loopback port of the server (0 before `launch`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id, once launched.
    pub fn server_pid(&self) -> Option<u32> {
        self.run.server().map(Workload::pid)
    }
}

impl BenchmarkImpl for Memcached {
    const NAME: &'static str = "memcached";
    const DESCRIPTION: &'static str =
        "A private memcached on a free loopback port, loaded by memcslap (libmemcached-tools)";

    type Settings = MemcachedSettings;

    fn create(args: &StartArgs, settings: MemcachedSettings) -> Result<Self> {
        Ok(Self {
            settings,
            run: Run::new(Self::NAME, args),
            port: 0,
        })
    }

    fn is_configured(&self) -> Result<()> {
        workload::require_program("memcached", "apt-get install memcached libmemcached-tools")?;
        workload::require_program("memcslap", "apt-get install libmemcached-tools")?;
        Ok(())
    }

    fn setup(&mut self) -> Result<()> {
        self.run.prepare(&self.settings.machine)
    }

    fn launch(&mut self) -> Result<()> {
        self.port = free_port()?;
        let port = self.port.to_string();
        let s = &self.settings;
        let cmd = memcached("127.0.0.1", self.port, s.memory_mb);
        let p = self.port;
        let what = format!("memcached on port {port}");
        let server = spawn_server(cmd, "memcached", None, &what, || accepts(p))?;
        self.run.start_server(server);

        let cmd = memcslap("127.0.0.1", p, &s.test, s.concurrency, s.execute_number);
        self.run.start_captured(cmd, "memcslap")
    }

    fn run(&mut self) -> &mut Run {
        &mut self.run
    }

    /// Operations per second and mean latency from memcslap's report (its
    /// standard output).
    fn result(&self) -> Result<Option<serde_json::Value>> {
        let client = self.run.finished("memcslap")?;
        let report = client.read_stdout()?;
        let ind = indicator(Self::NAME, "memcached", &self.settings, &self.run)?
            .with_results(reports::memcslap(&report)?);
        Ok(Some(ind.to_value()?))
    }
}
