//! Running a run's roles on this machine (`--executor local`).
//!
//! A run with roles is planned like any other: its configuration holds a
//! `roles` table ([`add_to_base`]: each role as its `[roles.NAME]` table
//! was written, scripts resolved, variables `roles.NAME.parameters.KEY`
//! set in it). [`perform`] carries it out: each role is its own `kernmlops
//! run --collection-dir runs/<run_id>/<role>` (its benchmark, its probes,
//! or `--baseline` for `probes = []`), started in dependency order, each
//! waited for until ready (a TCP port that answers, a file, a line of its
//! output) before the roles after it start, within its timeout. Every
//! role sees every role's address in `KML_ROLE_<NAME>_HOST`,
//! `KML_ROLE_<NAME>_PORT` (its ready port) and `KML_ROLE_<NAME>_NODE` (its
//! host name), and its own name in `KML_ROLE`. The run ends when the result
//! role's `kernmlops run` ends; the other roles are then sent SIGTERM, on
//! which each `kernmlops run` finishes its manifest and kills its
//! benchmark's cgroup (everything the role started).
//!
//! The run's own `runs/<run_id>/manifest.json` is written last: the result
//! role's manifest (status, benchmark, result, times), its tables renamed
//! `<role>_<table>` for every role, and a `roles` section naming each
//! role, its node, its collection and how it ended; `indicator.json` is the
//! result role's. A role not ready in time, or ended before it was ready,
//! fails the run with that reason, after every started role was stopped.

use std::{
    fs::OpenOptions,
    io::{Read, Seek, SeekFrom, Write},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    os::unix::process::{CommandExt, ExitStatusExt},
    path::{Path, PathBuf},
    process::{Child, ExitStatus, Stdio},
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use kernmlops::{plugin::Registry, trust::Policy};
use serde_json::{json, Value as Json};

use super::{
    checks::{check_config, folder_of, resolve_table_commands, Checked},
    commands::invalid,
    executor::RunContext,
    plan::PlannedRun,
    record::{hostname, write_atomic},
    roles::{ReadyCheck, Role, Roles},
    spec::{self, Spec},
    ExperimentError, Result,
};

/// The address every role has with `--executor local`.
const LOCAL_HOST: &str = "127.0.0.1";
/// How long the roles still running when the result role ends get to stop
/// after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(30);
/// The most of a role's output read when looking for its ready line.
const MAX_LINE_SCAN: u64 = 8 << 20;

/// Adds the file's roles to the base configuration as its `roles` table,
/// each `script` resolved against the experiment file's folder and checked
/// as a `script` benchmark's command is.
pub fn add_to_base(spec: &Spec, base: &mut toml::Table, policy: &Policy) -> Result<()> {
    let mut table = spec.roles.to_config();
    let folder = folder_of(Path::new(&spec.file))?;
    for role in spec.roles.declared() {
        let Some(script) = &role.script else { continue };
        let mut t: toml::Table = toml::from_str(&format!(
            "[benchmarks.script]\ncommand = [{}]\n",
            toml::Value::from(script.clone())
        ))
        .map_err(|e| invalid(spec, &format!("roles.{}.script", role.name), e.to_string()))?;
        resolve_table_commands(&mut t, &folder, policy)
            .map_err(|m| invalid(spec, &format!("roles.{}.script", role.name), m))?;
        let resolved = t
            .get("benchmarks")
            .and_then(|b| b.get("script"))
            .and_then(|s| s.get("command"))
            .and_then(|c| c.get(0))
            .cloned();
        if let (Some(path), Some(toml::Value::Table(rt))) = (resolved, table.get_mut(&role.name)) {
            rt.insert("script".into(), path);
        }
    }
    base.insert("roles".into(), table.into());
    Ok(())
}

/// A role's own configuration: the run's, without `roles`, with the role's
/// parameters as its benchmark's settings (a `script` role: its script as
/// `benchmarks.script.command`, its parameters as
/// `benchmarks.script.parameters`; any other benchmark: its parameters as
/// `benchmarks.<benchmark>` settings).
pub fn role_config(run_config: &toml::Table, role: &Role) -> toml::Table {
    let mut config = run_config.clone();
    config.remove("roles");
    let mut settings = toml::Table::new();
    if let Some(script) = &role.script {
        settings.insert("command".into(), vec![script.clone()].into());
        if !role.parameters.is_empty() {
            settings.insert("parameters".into(), role.parameters.clone().into());
        }
    } else {
        settings = role.parameters.clone();
    }
    let mut own = toml::Table::new();
    let mut benchmarks = toml::Table::new();
    benchmarks.insert(role.benchmark.clone(), settings.into());
    own.insert("benchmarks".into(), benchmarks.into());
    kernmlops::config::merge(&mut config, own);
    config
}

/// The probes of an experiment with roles, as its identity records them:
/// `ROLE:PROBE` for each probe of each role (a role without `probes`
/// has the configuration's `collect.plugins`).
pub fn identity_probes(roles: &Roles, default: &[String]) -> Vec<String> {
    roles
        .declared()
        .flat_map(|r| {
            r.probes
                .as_deref()
                .unwrap_or(default)
                .iter()
                .map(move |p| format!("{}:{p}", r.name))
        })
        .collect()
}

/// The roles of a planned run's configuration, `None` without roles.
pub fn of(config: &toml::Table) -> Option<std::result::Result<Roles, String>> {
    Roles::from_config(config)
}

/// Checks each role's configuration of each distinct combination as its
/// `kernmlops run` will check it (keys, its benchmark's settings, its
/// probes).
pub fn check_runs(
    registry: &Registry,
    spec: &Spec,
    power: Option<&[String]>,
    runs: &[PlannedRun],
) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for r in runs {
        if !seen.insert(r.combo_id.as_str()) {
            continue;
        }
        let Some(toml::Value::Table(config)) = spec::json_to_toml(&r.config) else {
            continue;
        };
        let roles = match of(&config) {
            Some(Ok(roles)) => roles,
            Some(Err(m)) => return Err(invalid(spec, "roles", m)),
            None => continue,
        };
        for role in roles.declared() {
            let at = format!("roles.{}", role.name);
            registry
                .find_benchmark(&role.benchmark)
                .map_err(|m| invalid(spec, &format!("{at}.benchmark"), m))?;
            let own = role_config(&config, role);
            let given = role.probes.clone().unwrap_or_default();
            let check = |probes: &[String]| {
                check_config(
                    registry,
                    &own,
                    &Checked {
                        probes,
                        benchmark: &role.benchmark,
                        power,
                    },
                )
                .map_err(|m| invalid(spec, &at, m))
            };
            let cfg = check(&given)?;
            let probes = role
                .probes
                .clone()
                .unwrap_or_else(|| cfg.collect.plugins.clone());
            registry
                .resolve(&probes)
                .map_err(|m| invalid(spec, &format!("{at}.probes"), m))?;
            if role.probes.is_none() {
                check(&probes)?;
            }
        }
    }
    Ok(())
}

/// One started role.
struct Running {
    name: String,
    child: Child,
    started: Instant,
    ready_s: Option<f64>,
    exit: Option<ExitStatus>,
    /// Stopped by the run (SIGTERM) rather than ending by itself.
    stopped: bool,
}

/// The environment every role gets: each role's address.
fn role_env(roles: &Roles) -> Vec<(String, String)> {
    let node = hostname();
    let mut env = Vec::new();
    for r in roles.declared() {
        let up = r.name.to_ascii_uppercase();
        env.push((format!("KML_ROLE_{up}_HOST"), LOCAL_HOST.to_owned()));
        env.push((format!("KML_ROLE_{up}_NODE"), node.clone()));
        if let Some(ReadyCheck::Port(p)) = r.ready.as_ref().map(|x| &x.check) {
            env.push((format!("KML_ROLE_{up}_PORT"), p.to_string()));
        }
    }
    env.push((
        "KML_ROLES".into(),
        roles
            .declared()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>()
            .join(","),
    ));
    env
}

/// The files of a role that hold its output: what its benchmark printed
/// (`*.stdout`, `*.stderr` in its collection). Not its log, whose lines
/// name the role, its paths and its probes.
fn output_files(collection: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![(collection.to_owned(), 0)];
    while let Some((d, depth)) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten().take(1000) {
            let Ok(t) = e.file_type() else { continue };
            let p = e.path();
            if t.is_dir() && depth < 3 {
                dirs.push((p, depth + 1));
            } else if t.is_file()
                && p.extension()
                    .is_some_and(|x| x == "stdout" || x == "stderr")
            {
                files.push(p);
            }
        }
    }
    files
}

/// Whether one of `files` has a line containing `text` (the first
/// [`MAX_LINE_SCAN`] bytes of each).
fn has_line(files: &[PathBuf], text: &str) -> bool {
    files.iter().any(|f| {
        let Ok(file) = std::fs::File::open(f) else {
            return false;
        };
        let mut buf = String::new();
        if file.take(MAX_LINE_SCAN).read_to_string(&mut buf).is_err() {
            // Not text: look at it lossily.
            let Ok(mut file) = std::fs::File::open(f) else {
                return false;
            };
            let mut bytes = Vec::new();
            let _ = file.seek(SeekFrom::Start(0));
            let _ = file.take(MAX_LINE_SCAN).read_to_end(&mut bytes);
            buf = String::from_utf8_lossy(&bytes).into_owned();
        }
        buf.lines().any(|l| l.contains(text))
    })
}

/// Whether a role is ready now.
fn is_ready(check: &ReadyCheck, collection: &Path) -> bool {
    match check {
        ReadyCheck::Port(p) => TcpStream::connect_timeout(
            &SocketAddr::from((Ipv4Addr::LOCALHOST, *p)),
            Duration::from_millis(200),
        )
        .is_ok(),
        ReadyCheck::File(f) => collection.join(f).exists(),
        ReadyCheck::Line(text) => has_line(&output_files(collection), text),
    }
}

/// What a check waits for, for messages.
fn describe(check: &ReadyCheck) -> String {
    match check {
        ReadyCheck::Port(p) => format!("nothing answered on port {p}"),
        ReadyCheck::File(f) => format!("file {f} did not appear in its collection"),
        ReadyCheck::Line(l) => format!("no line of its output contained {l:?}"),
    }
}

/// Starts one role's `kernmlops run`, output to `log`.
fn start(
    ctx: &RunContext,
    role: &Role,
    collection: &Path,
    config: &Path,
    log: &Path,
    env: &[(String, String)],
) -> Result<Child> {
    let mut out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(ExperimentError::io(log))?;
    let mut cmd = super::executor::collect_command(
        ctx,
        &role.benchmark,
        role.probes.as_deref(),
        collection,
        config,
    );
    writeln!(
        out,
        "== role {} {} on {}: {}",
        role.name,
        kernmlops_sys::clock::rfc3339(kernmlops_sys::clock::unix_us()),
        hostname(),
        super::executor::shown(&cmd)
    )
    .map_err(ExperimentError::io(log))?;
    let err = out.try_clone().map_err(ExperimentError::io(log))?;
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("KML_ROLE", &role.name);
    let parent = std::process::id();
    // SAFETY: between fork and exec only async-signal-safe calls (prctl,
    // getppid, raise): the role is told to stop when this process dies.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() as u32 != parent {
                libc::raise(libc::SIGTERM);
            }
            Ok(())
        });
    }
    cmd.spawn().map_err(|source| ExperimentError::Launch {
        program: ctx.exe.display().to_string(),
        source,
    })
}

/// Sends SIGTERM to every role still running, then waits for them (each
/// `kernmlops run` stops its benchmark's cgroup and finishes its manifest);
/// SIGKILL after [`STOP_GRACE`].
fn stop_all(running: &mut [Running], tick: &mut dyn FnMut()) {
    for r in running.iter_mut().rev() {
        if r.exit.is_none() {
            if let Ok(Some(s)) = r.child.try_wait() {
                r.exit = Some(s);
                continue;
            }
            // SAFETY: kill(2) on our own child, not yet waited for.
            unsafe {
                libc::kill(r.child.id() as libc::pid_t, libc::SIGTERM);
            }
            r.stopped = true;
        }
    }
    let deadline = Instant::now() + STOP_GRACE;
    loop {
        let mut left = false;
        for r in running.iter_mut().filter(|r| r.exit.is_none()) {
            match r.child.try_wait() {
                Ok(Some(s)) => r.exit = Some(s),
                Ok(None) => left = true,
                Err(_) => r.exit = Some(ExitStatus::from_raw(1 << 8)),
            }
        }
        if !left {
            return;
        }
        if Instant::now() >= deadline {
            for r in running.iter_mut().filter(|r| r.exit.is_none()) {
                let _ = r.child.kill();
                r.exit = r.child.wait().ok();
            }
            return;
        }
        tick();
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Carries out a run with roles in `run_dir` (fresh); its status is the
/// result role's `kernmlops run`'s, or a failure when a role was not
/// ready.
pub fn perform(
    ctx: &RunContext,
    run_id: &str,
    run_dir: &Path,
    config: &toml::Table,
    roles: &Roles,
    tick: &mut dyn FnMut(),
) -> Result<ExitStatus> {
    let dir = &ctx.dir;
    std::fs::create_dir_all(run_dir).map_err(ExperimentError::io(run_dir))?;
    let logs = dir.root.join("logs");
    std::fs::create_dir_all(&logs).map_err(ExperimentError::io(&logs))?;
    write_atomic(
        &dir.run_pid(run_id),
        format!("{} {}\n", std::process::id(), hostname()).as_bytes(),
    )?;
    let env = role_env(roles);
    let mut running: Vec<Running> = Vec::new();
    let mut failure: Option<String> = None;
    let mut signalled = false;
    let paths = |r: &Role| {
        (
            run_dir.join(&r.name),
            dir.root
                .join("configs")
                .join(format!("{run_id}.{}.toml", r.name)),
            logs.join(format!("{run_id}.{}.log", r.name)),
        )
    };
    'start: for role in roles.start_order() {
        let (collection, config_path, log) = paths(role);
        let text = toml::to_string_pretty(&role_config(config, role)).unwrap_or_default();
        write_atomic(&config_path, text.as_bytes())?;
        let child = match start(ctx, role, &collection, &config_path, &log, &env) {
            Ok(c) => c,
            Err(e) => {
                failure = Some(format!("role {}: {e}", role.name));
                break;
            }
        };
        running.push(Running {
            name: role.name.clone(),
            child,
            started: Instant::now(),
            ready_s: None,
            exit: None,
            stopped: false,
        });
        let Some(ready) = &role.ready else {
            if let Some(r) = running.last_mut() {
                r.ready_s = Some(0.0);
            }
            continue;
        };
        let timeout = Duration::from_secs(ready.timeout_s.into());
        let Some(r) = running.last_mut() else { break };
        loop {
            if ctx.stop.load(Ordering::Relaxed) {
                signalled = true;
                break 'start;
            }
            if is_ready(&ready.check, &collection) {
                r.ready_s = Some(r.started.elapsed().as_secs_f64());
                break;
            }
            if let Ok(Some(s)) = r.child.try_wait() {
                r.exit = Some(s);
                failure = Some(format!(
                    "role {} ended ({s}) before it was ready ({}); see {}",
                    role.name,
                    describe(&ready.check),
                    log.display()
                ));
                break 'start;
            }
            if r.started.elapsed() >= timeout {
                failure = Some(format!(
                    "role {} was not ready after {} s ({}); every role was stopped; see {}",
                    role.name,
                    ready.timeout_s,
                    describe(&ready.check),
                    log.display()
                ));
                break 'start;
            }
            tick();
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // The result role's end ends the run.
    let result_name = roles.result().map(|r| r.name.clone()).unwrap_or_default();
    if failure.is_none() && !signalled {
        if let Some(r) = running.iter_mut().find(|r| r.name == result_name) {
            let mut since: Option<Instant> = None;
            loop {
                match r.child.try_wait() {
                    Ok(Some(s)) => {
                        r.exit = Some(s);
                        break;
                    }
                    Ok(None) => {}
                    Err(e) => return Err(ExperimentError::io(run_dir)(e)),
                }
                if ctx.stop.load(Ordering::Relaxed) {
                    signalled = true;
                    // It likely got the signal too: a moment to stop by
                    // itself, then it is stopped with the others.
                    let at = *since.get_or_insert_with(Instant::now);
                    if at.elapsed() >= Duration::from_secs(3) {
                        break;
                    }
                }
                tick();
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    stop_all(&mut running, tick);
    let _ = std::fs::remove_file(dir.run_pid(run_id));
    let ok = write_manifest(run_dir, roles, &running, failure.as_deref(), signalled)?;
    Ok(ExitStatus::from_raw(if ok { 0 } else { 1 << 8 }))
}

fn read_json(path: &Path) -> Option<Json> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// Writes the run's manifest (and its indicator, the result role's);
/// whether the run succeeded.
fn write_manifest(
    run_dir: &Path,
    roles: &Roles,
    running: &[Running],
    failure: Option<&str>,
    signalled: bool,
) -> Result<bool> {
    let node = hostname();
    let result_role = roles.result().map(|r| r.name.as_str()).unwrap_or_default();
    let mut manifest = match failure {
        None => read_json(&run_dir.join(result_role).join("manifest.json"))
            .filter(Json::is_object)
            .unwrap_or_else(|| {
                json!({"status": "failed", "run_class": "failed",
                       "errors": [format!("role {result_role} wrote no manifest.json")]})
            }),
        Some(reason) => json!({"status": "failed", "run_class": "failed", "errors": [reason]}),
    };
    if signalled {
        manifest["benchmark"]["stopped_by"] = json!("signal");
        if manifest["status"] == "running" || failure.is_some() {
            manifest["status"] = json!("stopped");
        }
    }
    let mut tables = serde_json::Map::new();
    let mut described = serde_json::Map::new();
    for role in roles.declared() {
        let m = read_json(&run_dir.join(&role.name).join("manifest.json")).unwrap_or(Json::Null);
        for (t, v) in m["tables"].as_object().into_iter().flatten() {
            tables.insert(format!("{}_{t}", role.name), v.clone());
        }
        let ran = running.iter().find(|r| r.name == role.name);
        described.insert(
            role.name.clone(),
            json!({
                "node": node,
                "host": LOCAL_HOST,
                "collection": role.name,
                "benchmark": role.benchmark,
                "probes": role.probes,
                "result": role.result,
                "started": ran.is_some(),
                "ready_after_s": ran.and_then(|r| r.ready_s),
                "stopped_by_run": ran.is_some_and(|r| r.stopped),
                "exit_code": ran.and_then(|r| r.exit).and_then(|s| s.code()),
                "status": m["status"],
                "run_class": m["run_class"],
            }),
        );
    }
    manifest["tables"] = Json::Object(tables);
    manifest["roles"] = Json::Object(described);
    manifest["executor"] = json!("local");
    if manifest["hostname"].is_null() {
        manifest["hostname"] = json!(node);
    }
    let text = serde_json::to_vec_pretty(&manifest).unwrap_or_default();
    if failure.is_none() {
        if let Ok(ind) = std::fs::read(run_dir.join(result_role).join("indicator.json")) {
            write_atomic(&run_dir.join("indicator.json"), &ind)?;
        }
    }
    write_atomic(&run_dir.join("manifest.json"), &text)?;
    let exit_ok = running
        .iter()
        .find(|r| r.name == result_role)
        .and_then(|r| r.exit)
        .is_some_and(|s| s.success());
    Ok(failure.is_none() && !signalled && exit_ok && manifest["status"] != "failed")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roles(text: &str) -> Roles {
        Spec::parse("exp.toml", text).expect("valid").roles
    }

    const TWO: &str = "name = \"t\"\n\
        [roles.server]\nbenchmark = \"script\"\nscript = \"/bin/srv\"\nprobes = [\"quanta_runtime\"]\nready = { port = 6379, timeout_s = 5 }\n\
        [roles.client]\nbenchmark = \"script\"\nscript = \"/bin/cli\"\nprobes = []\nafter = \"server\"\nresult = true\nparameters = { clients = 4 }\n";

    #[test]
    fn roles_survive_a_runs_configuration_with_variables_set() {
        let r = roles(TWO);
        let mut config = toml::Table::new();
        config.insert("roles".into(), r.to_config().into());
        // A variable roles.client.parameters.clients = 8.
        if let Some(toml::Value::Table(c)) =
            config.get_mut("roles").and_then(|t| t.get_mut("client"))
        {
            c.insert("parameters".into(), toml::toml! { clients = 8 }.into());
        }
        let back = of(&config).expect("roles").expect("valid");
        let order: Vec<&str> = back.start_order().map(|r| r.name.as_str()).collect();
        assert_eq!(order, ["server", "client"]);
        let client = back.get("client").expect("client");
        assert_eq!(
            client.parameters.get("clients"),
            Some(&toml::Value::from(8))
        );
        let server = back.get("server").expect("server");
        assert_eq!(
            server.ready.as_ref().map(|x| (&x.check, x.timeout_s)),
            Some((&ReadyCheck::Port(6379), 5))
        );
        // Each role's own configuration: no roles, its script and parameters.
        let own = role_config(&config, client);
        assert!(own.get("roles").is_none());
        let s = &own["benchmarks"]["script"];
        assert_eq!(s["command"], toml::Value::from(vec!["/bin/cli"]));
        assert_eq!(s["parameters"]["clients"], toml::Value::from(8));
        assert!(of(&toml::Table::new()).is_none());
        assert_eq!(
            identity_probes(&r, &["process_trace".to_owned()]),
            ["server:quanta_runtime"]
        );
    }

    #[test]
    fn every_role_learns_every_address() {
        let env: std::collections::HashMap<String, String> =
            role_env(&roles(TWO)).into_iter().collect();
        assert_eq!(env["KML_ROLE_SERVER_HOST"], LOCAL_HOST);
        assert_eq!(env["KML_ROLE_SERVER_PORT"], "6379");
        assert_eq!(env["KML_ROLE_CLIENT_HOST"], LOCAL_HOST);
        assert!(!env.contains_key("KML_ROLE_CLIENT_PORT"));
        assert_eq!(env["KML_ROLE_SERVER_NODE"], hostname());
        assert_eq!(env["KML_ROLES"], "server,client");
    }

    #[test]
    fn readiness_by_port_file_and_line() {
        let tmp = std::env::temp_dir().join(format!("kml-roles-ready-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        // Made fresh here (create_dir fails on anything left in its place).
        std::fs::create_dir(&tmp).expect("tmp");
        std::fs::create_dir(tmp.join("sub")).expect("tmp/sub");
        // Not the role's log (it names the role and its paths).
        std::fs::write(tmp.join("x.log"), "ready\n").expect("log");
        std::fs::write(tmp.join("sub/benchmark.stdout"), "starting\n").expect("w");
        assert!(!is_ready(&ReadyCheck::Line("ready".into()), &tmp));
        std::fs::write(tmp.join("sub/benchmark.stderr"), "x\nserver ready on 1\n").expect("w");
        assert!(is_ready(&ReadyCheck::Line("ready on".into()), &tmp));
        assert!(!is_ready(&ReadyCheck::File("up".into()), &tmp));
        std::fs::write(tmp.join("up"), "").expect("w");
        assert!(is_ready(&ReadyCheck::File("up".into()), &tmp));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        assert!(is_ready(&ReadyCheck::Port(port), &tmp));
        drop(listener);
        assert!(!is_ready(&ReadyCheck::Port(port), &tmp));
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
