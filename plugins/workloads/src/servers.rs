//! Server benchmarks: a private server on a free loopback port, loaded by
//! its own benchmark client; both are stopped in `kill`. The client's
//! report (kept in the output folder) is the benchmark's result.

use std::process::{Command, Stdio};

use kernmlops_plugin_sdk::{
    benchmark::{MachineSettings, Run},
    serde_json, settings,
    workload::Workload,
    BenchmarkImpl, Result, StartArgs,
};

use crate::{
    accepts, at_least_one, free_port,
    split::{
        check_memcached_load, check_redis_load, memcached, memcslap, redis_benchmark, spawn_server,
        MEMCSLAP, REDIS_BENCHMARK,
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

benchmark! {
    /// A private redis-server (its `--dir` and log in the run's private
    /// folder) loaded by redis-benchmark.
    pub struct Redis(RedisSettings) = "redis",
        "A private redis-server on a free loopback port, loaded by redis-benchmark";
    field port: u16 = 0;
    requires "redis-server" => "apt-get install redis-server redis-tools",
        "redis-cli" => "apt-get install redis-tools",
        "redis-benchmark" => "apt-get install redis-tools";
    setup private;
    {
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
            let server = spawn_server(cmd, "redis-server", None, &what, || answers_ping(p))?;
            self.run.start_server(server);
            let s = &self.settings;
            let cmd = redis_benchmark("127.0.0.1", p, s.requests, s.clients, &s.tests);
            self.run.start_captured(cmd, "redis-benchmark")
        }

        /// Requests per second and latencies per test from redis-benchmark's
        /// CSV (its standard output).
        fn result(&self) -> Result<Option<serde_json::Value>> {
            let ind = REDIS_BENCHMARK.indicator(&self.run, (Self::NAME, "redis"), &self.settings)?;
            Ok(Some(ind.to_value()?))
        }
    }
}

/// Whether the redis-server on loopback `port` answers `PING`.
fn answers_ping(port: u16) -> bool {
    Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "ping"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout.starts_with(b"PONG"))
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

benchmark! {
    /// A private memcached loaded by libmemcached's memcslap.
    pub struct Memcached(MemcachedSettings) = "memcached",
        "A private memcached on a free loopback port, loaded by memcslap (libmemcached-tools)";
    field port: u16 = 0;
    requires "memcached" => "apt-get install memcached libmemcached-tools",
        "memcslap" => "apt-get install libmemcached-tools";
    {
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

        /// Operations per second and mean latency from memcslap's report (its
        /// standard output).
        fn result(&self) -> Result<Option<serde_json::Value>> {
            let ind = MEMCSLAP.indicator(&self.run, (Self::NAME, "memcached"), &self.settings)?;
            Ok(Some(ind.to_value()?))
        }
    }
}

/// The accessors of the benchmarks that load a private server of their
/// own on a free loopback port.
macro_rules! server_accessors {
    ($($bench:ident),+) => {$(
        impl $bench {
            /// The loopback port of the server (0 before `launch`).
            pub fn port(&self) -> u16 {
                self.port
            }

            /// The server's process id, once launched.
            pub fn server_pid(&self) -> Option<u32> {
                self.run.server().map(Workload::pid)
            }
        }
    )+};
}

server_accessors!(Redis, Memcached);
