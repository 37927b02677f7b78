//! The split forms of the server benchmarks, for experiments whose roles
//! put a server and its load generator on different nodes: `redis_server`
//! and `memcached_server` run the server alone until they are stopped;
//! `redis_load` and `memcached_load` run the load generator alone against
//! an address. Addresses come from the settings or, when left out, from
//! the roles' environment: a server binds `KML_ROLE_<ITS ROLE>_HOST` and
//! listens on `KML_ROLE_<ITS ROLE>_PORT` (its role from `KML_ROLE`), a
//! load generator connects to `KML_ROLE_<SERVER_ROLE>_HOST` and `_PORT`.

use std::{
    net::{TcpStream, ToSocketAddrs},
    process::{Command, Stdio},
    time::Duration,
};

use kernmlops_plugin_sdk::{
    benchmark::{MachineSettings, Run, GRACE},
    indicator::Indicator,
    serde_json, settings,
    workload::{Capture, Workload},
    BenchmarkImpl, Error, Result, StartArgs,
};

use crate::{at_least_one, bench::StdoutReport, reports, wait_ready};

/// How long a server gets to answer after it starts.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// redis-server's port when neither the settings nor the role give one.
pub const REDIS_PORT: u16 = 6379;
/// memcached's port when neither the settings nor the role give one.
pub const MEMCACHED_PORT: u16 = 11211;
/// Where a server binds outside a role when `bind` is left out.
const LOOPBACK: &str = "127.0.0.1";

/// `KML_ROLE_<ROLE>_<WHAT>` (role upper-cased), when set and not empty.
fn role_env(role: &str, what: &str) -> Option<String> {
    let key = format!("KML_ROLE_{}_{what}", role.to_ascii_uppercase());
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

/// A port setting: 0 (left out) or 1 to 65535.
fn check_port(port: u32) -> std::result::Result<(), String> {
    if port > u32::from(u16::MAX) {
        return Err(format!("port = {port}: use 1 to 65535 (0: from the role)"));
    }
    Ok(())
}

/// A host setting: empty (from the role) or a name or address.
fn check_host(key: &str, host: &str) -> std::result::Result<(), String> {
    if host.starts_with('-') || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{key} = {host:?}: give a host name or address"));
    }
    Ok(())
}

/// The port of a role's environment, checked.
fn env_port(role: &str) -> Result<Option<u16>> {
    role_env(role, "PORT")
        .map(|p| {
            p.parse::<u16>().ok().filter(|&n| n > 0).ok_or_else(|| {
                Error::new(format!(
                    "KML_ROLE_{}_PORT = {p:?} is not a port",
                    role.to_ascii_uppercase()
                ))
            })
        })
        .transpose()
}

/// Where a server listens: the settings, else its own role's address
/// (`KML_ROLE` names the role), else the loopback address and `default`.
fn server_address(bind: &str, port: u32, default: u16) -> Result<(String, u16)> {
    let role = std::env::var("KML_ROLE").ok().filter(|r| !r.is_empty());
    let host = match (bind, &role) {
        ("", Some(r)) => role_env(r, "HOST").unwrap_or_else(|| LOOPBACK.into()),
        ("", None) => LOOPBACK.into(),
        (b, _) => b.to_owned(),
    };
    let port = match (port, &role) {
        (0, Some(r)) => env_port(r)?.unwrap_or(default),
        (0, None) => default,
        (p, _) => p as u16,
    };
    Ok((host, port))
}

/// Where a load generator connects: the settings, else the server role's
/// address from the environment.
fn load_address(host: &str, port: u32, server_role: &str, default: u16) -> Result<(String, u16)> {
    let host = match host {
        "" => role_env(server_role, "HOST").ok_or_else(|| {
            Error::new(format!(
                "no server address: set host (and port), or run as a role of an experiment with a role {server_role:?} (KML_ROLE_{}_HOST), or set server_role",
                server_role.to_ascii_uppercase()
            ))
        })?,
        h => h.to_owned(),
    };
    let port = match port {
        0 => env_port(server_role)?.unwrap_or(default),
        p => p as u16,
    };
    Ok((host, port))
}

/// Whether something accepts TCP connections at `host:port` (a wildcard
/// bind is asked on the loopback address).
fn answers(host: &str, port: u16) -> bool {
    let host = if host == "0.0.0.0" || host == "::" {
        LOOPBACK
    } else {
        host
    };
    (host, port).to_socket_addrs().is_ok_and(|mut addrs| {
        addrs.any(|a| TcpStream::connect_timeout(&a, Duration::from_millis(200)).is_ok())
    })
}

/// A load generator's indicator with the address it used as its `host`
/// and `port` parameters (not the settings' "" and 0).
fn with_address(mut ind: Indicator, address: Option<&(String, u16)>) -> Indicator {
    if let Some((host, port)) = address {
        ind.parameters.insert("host".into(), host.clone().into());
        ind.parameters.insert("port".into(), (*port).into());
    }
    ind
}

/// Starts `cmd` as the benchmark's workload (output kept in the
/// collection as `server.stdout`/`server.stderr`) once it answers at
/// `host:port`; a server that does not answer is stopped and the reason
/// returned.
fn start_server(run: &mut Run, cmd: Command, tool: &str, host: &str, port: u16) -> Result<()> {
    let out = run.output_dir()?;
    let capture = Capture::both(out.path(), "server");
    let what = format!("{tool} on {host}:{port}");
    let server = spawn_server(cmd, tool, Some(&capture), &what, || answers(host, port))?;
    eprintln!("{tool}: ready on {host}:{port}");
    run.start(server);
    Ok(())
}

/// Starts a server (its output captured when `capture` is given) and waits
/// until `ready` says it answers, for [`READY_TIMEOUT`]; one that exits
/// first or never answers is stopped, and the reason, naming it `what`,
/// returned. The split servers and the servers the `redis` and
/// `memcached` benchmarks load all start this way.
pub(crate) fn spawn_server(
    cmd: Command,
    tool: &str,
    capture: Option<&Capture>,
    what: &str,
    ready: impl FnMut() -> bool,
) -> Result<Workload> {
    let mut server = match capture {
        Some(capture) => Workload::spawn_captured(cmd, tool, capture)?,
        None => Workload::spawn(cmd, tool)?,
    };
    if let Err(e) = wait_ready(&mut server, what, READY_TIMEOUT, ready) {
        let _ = server.kill(GRACE);
        return Err(e);
    }
    Ok(server)
}

// ---------------------------------------------------------------- redis

/// Checks redis-benchmark's settings (shared by `redis` and `redis_load`).
pub(crate) fn check_redis_load(
    requests: u64,
    clients: u32,
    tests: &str,
) -> std::result::Result<(), String> {
    at_least_one("requests", requests)?;
    at_least_one("clients", u64::from(clients))?;
    if clients > 10_000 {
        return Err(format!(
            "clients = {clients}: use at most 10000 (redis-benchmark's limit)"
        ));
    }
    if tests.trim().is_empty() || tests.starts_with('-') {
        return Err(format!(
            "tests = {tests:?}: name the commands, e.g. \"set,get\""
        ));
    }
    Ok(())
}

/// redis-benchmark's CSV on standard output (`redis` and `redis_load`).
pub(crate) const REDIS_BENCHMARK: StdoutReport = StdoutReport {
    tool: "redis-benchmark",
    parse: reports::redis_csv,
};

/// redis-benchmark against `host:port`, its CSV on standard output.
pub(crate) fn redis_benchmark(
    host: &str,
    port: u16,
    requests: u64,
    clients: u32,
    tests: &str,
) -> Command {
    let mut cmd = Command::new("redis-benchmark");
    cmd.args(["-h", host, "-p", &port.to_string()])
        .args(["-n", &requests.to_string()])
        .args(["-c", &clients.to_string()])
        .args(["-t", tests, "--csv"]);
    cmd
}

settings! {
    /// `[benchmarks.redis_server]` settings.
    pub struct RedisServerSettings {
        #[flatten]
        pub machine: MachineSettings,
        /// Address to listen on: "" for the role's (KML_ROLE_<ROLE>_HOST), else 127.0.0.1.
        pub bind: String = String::new(),
        /// Port to listen on: 0 for the role's (KML_ROLE_<ROLE>_PORT), else 6379.
        pub port: u32 = 0,
    }
    validate(s) {
        check_host("bind", &s.bind)?;
        check_port(s.port)
    }
}

benchmark! {
    /// redis-server alone (no persistence, its `--dir` private), serving until
    /// the run stops it; no result (a server has no figures of its own, its
    /// load generator does).
    pub struct RedisServer(RedisServerSettings) = "redis_server",
        "redis-server alone on an address (a role's, by default), serving until stopped";
    requires "redis-server" => "apt-get install redis-server";
    setup private;
    {
        fn launch(&mut self) -> Result<()> {
            let dir = self.run.private_path_for_launch()?;
            let (host, port) = server_address(&self.settings.bind, self.settings.port, REDIS_PORT)?;
            let mut cmd = Command::new("redis-server");
            cmd.args(["--port", &port.to_string(), "--bind", &host, "--save", ""])
                .args(["--appendonly", "no", "--daemonize", "no"])
                .args(["--protected-mode", "no"])
                .arg("--dir")
                .arg(&dir)
                .stdin(Stdio::null());
            start_server(&mut self.run, cmd, "redis-server", &host, port)
        }
    }
}

settings! {
    /// `[benchmarks.redis_load]` settings.
    pub struct RedisLoadSettings {
        #[flatten]
        pub machine: MachineSettings,
        /// Server address: "" for the server role's (KML_ROLE_<SERVER_ROLE>_HOST).
        pub host: String = String::new(),
        /// Server port: 0 for the server role's (KML_ROLE_<SERVER_ROLE>_PORT), else 6379.
        pub port: u32 = 0,
        /// The role whose address is used when host or port is left out.
        pub server_role: String = "server".into(),
        /// Requests in total (redis-benchmark -n).
        pub requests: u64 = 100_000,
        /// Parallel connections (redis-benchmark -c).
        pub clients: u32 = 50,
        /// Commands to benchmark (redis-benchmark -t), comma-separated.
        pub tests: String = "set,get".into(),
    }
    validate(s) {
        check_host("host", &s.host)?;
        check_port(s.port)?;
        check_host("server_role", &s.server_role)?;
        check_redis_load(s.requests, s.clients, &s.tests)
    }
}

// ---------------------------------------------------------------- memcached

/// Checks memcslap's settings (shared by `memcached` and `memcached_load`).
pub(crate) fn check_memcached_load(
    test: &str,
    concurrency: u32,
    execute_number: u64,
) -> std::result::Result<(), String> {
    if !["get", "mget", "set"].contains(&test) {
        return Err(format!("test = {test:?}: use get, mget or set"));
    }
    at_least_one("concurrency", u64::from(concurrency))?;
    at_least_one("execute_number", execute_number)
}

/// memcslap's report on standard output (`memcached` and
/// `memcached_load`).
pub(crate) const MEMCSLAP: StdoutReport = StdoutReport {
    tool: "memcslap",
    parse: reports::memcslap,
};

/// memcslap against `host:port`, its report on standard output.
pub(crate) fn memcslap(
    host: &str,
    port: u16,
    test: &str,
    concurrency: u32,
    execute_number: u64,
) -> Command {
    let mut cmd = Command::new("memcslap");
    cmd.arg(format!("--servers={host}:{port}"))
        .arg(format!("--test={test}"))
        .arg(format!("--concurrency={concurrency}"))
        .arg(format!("--execute-number={execute_number}"));
    cmd
}

/// memcached on `host:port` with `memory_mb` of items (as `nobody` when
/// run as root, which memcached otherwise refuses).
pub(crate) fn memcached(host: &str, port: u16, memory_mb: u32) -> Command {
    let mut cmd = Command::new("memcached");
    cmd.args(["-l", host, "-p", &port.to_string(), "-U", "0"])
        .args(["-m", &memory_mb.to_string()]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.args(["-u", "nobody"]);
    }
    cmd
}

settings! {
    /// `[benchmarks.memcached_server]` settings.
    pub struct MemcachedServerSettings {
        #[flatten]
        pub machine: MachineSettings,
        /// Address to listen on: "" for the role's (KML_ROLE_<ROLE>_HOST), else 127.0.0.1.
        pub bind: String = String::new(),
        /// Port to listen on: 0 for the role's (KML_ROLE_<ROLE>_PORT), else 11211.
        pub port: u32 = 0,
        /// Item memory of the server in MiB (memcached -m).
        pub memory_mb: u32 = 64,
    }
    validate(s) {
        check_host("bind", &s.bind)?;
        check_port(s.port)?;
        at_least_one("memory_mb", u64::from(s.memory_mb))
    }
}

benchmark! {
    /// memcached alone, serving until the run stops it; no result, as
    /// `redis_server`.
    pub struct MemcachedServer(MemcachedServerSettings) = "memcached_server",
        "memcached alone on an address (a role's, by default), serving until stopped";
    requires "memcached" => "apt-get install memcached";
    {
        fn launch(&mut self) -> Result<()> {
            let s = &self.settings;
            let (host, port) = server_address(&s.bind, s.port, MEMCACHED_PORT)?;
            let mut cmd = memcached(&host, port, s.memory_mb);
            cmd.stdin(Stdio::null());
            start_server(&mut self.run, cmd, "memcached", &host, port)
        }
    }
}

settings! {
    /// `[benchmarks.memcached_load]` settings.
    pub struct MemcachedLoadSettings {
        #[flatten]
        pub machine: MachineSettings,
        /// Server address: "" for the server role's (KML_ROLE_<SERVER_ROLE>_HOST).
        pub host: String = String::new(),
        /// Server port: 0 for the server role's (KML_ROLE_<SERVER_ROLE>_PORT), else 11211.
        pub port: u32 = 0,
        /// The role whose address is used when host or port is left out.
        pub server_role: String = "server".into(),
        /// Test to perform (memcslap --test): get, mget or set.
        pub test: String = "set".into(),
        /// Client threads (memcslap --concurrency).
        pub concurrency: u32 = 4,
        /// Operations per thread (memcslap --execute-number).
        pub execute_number: u64 = 10_000,
    }
    validate(s) {
        check_host("host", &s.host)?;
        check_port(s.port)?;
        check_host("server_role", &s.server_role)?;
        check_memcached_load(&s.test, s.concurrency, s.execute_number)
    }
}

/// Declares the load generators run alone against a server elsewhere,
/// each from its settings (with `host`, `port` and `server_role`), name,
/// description, program (and what installs it), the server's default
/// port, its report and what that measures, and its command against
/// `host:port`. The result is the report's figures with the address used.
macro_rules! load_benchmarks {
    ($(
        $(#[$meta:meta])*
        $name:ident($settings:ident) = $bench:literal, $desc:literal;
        runs $program:literal => $hint:literal, default port $port:expr;
        reports $report:expr, measuring $component:literal;
        command |$s:ident, $host:ident, $p:ident| $cmd:expr;
    )+) => {$(
        benchmark! {
            $(#[$meta])*
            pub struct $name($settings) = $bench, $desc;
            /// The server's address, once launched.
            field address: Option<(String, u16)> = None;
            requires $program => $hint;
            {
                fn launch(&mut self) -> Result<()> {
                    let $s = &self.settings;
                    let ($host, $p) = load_address(&$s.host, $s.port, &$s.server_role, $port)?;
                    let cmd = $cmd;
                    self.address = Some(($host, $p));
                    self.run.start_captured(cmd, $report.tool)
                }

                fn result(&self) -> Result<Option<serde_json::Value>> {
                    let names = (Self::NAME, $component);
                    let ind = $report.indicator(&self.run, names, &self.settings)?;
                    Ok(Some(with_address(ind, self.address.as_ref()).to_value()?))
                }
            }
        }
    )+};
}

load_benchmarks! {
    /// redis-benchmark alone, against a server elsewhere; its result is the
    /// figures of `redis`, from redis-benchmark's CSV.
    RedisLoad(RedisLoadSettings) = "redis_load",
        "redis-benchmark alone against a redis server's address (a role's, by default)";
    runs "redis-benchmark" => "apt-get install redis-tools", default port REDIS_PORT;
    reports REDIS_BENCHMARK, measuring "redis";
    command |s, host, port| redis_benchmark(&host, port, s.requests, s.clients, &s.tests);

    /// memcslap alone, against a server elsewhere; its result is the figures
    /// of `memcached`, from memcslap's report.
    MemcachedLoad(MemcachedLoadSettings) = "memcached_load",
        "memcslap (libmemcached-tools) alone against a memcached's address (a role's, by default)";
    runs "memcslap" => "apt-get install libmemcached-tools", default port MEMCACHED_PORT;
    reports MEMCSLAP, measuring "memcached";
    command |s, host, port| memcslap(&host, port, &s.test, s.concurrency, s.execute_number);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_come_from_settings_then_roles() {
        // One test touches the environment, so nothing races it.
        std::env::remove_var("KML_ROLE");
        assert_eq!(
            server_address("", 0, REDIS_PORT).expect("addr"),
            (LOOPBACK.into(), REDIS_PORT)
        );
        std::env::set_var("KML_ROLE", "db");
        std::env::set_var("KML_ROLE_DB_HOST", "10.0.0.2");
        std::env::set_var("KML_ROLE_DB_PORT", "7000");
        assert_eq!(
            server_address("", 0, REDIS_PORT).expect("addr"),
            ("10.0.0.2".into(), 7000)
        );
        assert_eq!(
            server_address("0.0.0.0", 7001, REDIS_PORT).expect("addr"),
            ("0.0.0.0".into(), 7001)
        );
        assert_eq!(
            load_address("", 0, "db", MEMCACHED_PORT).expect("addr"),
            ("10.0.0.2".into(), 7000)
        );
        assert_eq!(
            load_address("h", 9, "db", MEMCACHED_PORT).expect("addr"),
            ("h".into(), 9)
        );
        let missing = load_address("", 0, "nobody_here", REDIS_PORT).expect_err("no address");
        assert!(
            missing.to_string().contains("KML_ROLE_NOBODY_HERE_HOST"),
            "{missing}"
        );
        std::env::set_var("KML_ROLE_DB_PORT", "x");
        assert!(server_address("", 0, REDIS_PORT).is_err());
        for k in ["KML_ROLE", "KML_ROLE_DB_HOST", "KML_ROLE_DB_PORT"] {
            std::env::remove_var(k);
        }
    }

    #[test]
    fn bad_ports_and_hosts_are_refused() {
        assert!(check_port(70_000).is_err());
        assert!(check_port(0).is_ok());
        assert!(check_host("host", "-oops").is_err());
        assert!(check_host("host", "a b").is_err());
        assert!(check_host("host", "node-2").is_ok());
    }
}
