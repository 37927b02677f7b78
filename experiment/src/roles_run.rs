//! Running a run's roles: each on this machine (`--executor local`), or
//! each on its own node of the run's Slurm job (`--executor slurm`).
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
//! role, its node, its collection, whether its collection was filtered to
//! its own processes and how it ended; `indicator.json` is the result
//! role's.
//!
//! Roles that share a kernel see each other's processes, so a collected
//! role whose `filter` is `auto` (the default) records only its own
//! benchmark's processes (`kernmlops run --cgroup-workload`) when another
//! role runs on the same kernel: always with `--executor local`, and in a
//! Slurm job when two of its nodes have the same boot id
//! (`/proc/sys/kernel/random/boot_id`, read by one job step on every
//! node), as the nodes `scripts/slurm-local` makes on one machine do.
//! `filter = "workload"` always filters, `"none"` never.
//!
//! A role not ready in time, or ended before it was ready, fails the run
//! with that reason, after every started role was stopped.

use std::{
    io::{Read, Seek, SeekFrom},
    net::{IpAddr, SocketAddr, TcpStream},
    os::unix::process::ExitStatusExt,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus},
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
    roles::{ReadyCheck, Role, RoleFilter, Roles, RolesError},
    run_files::{RoleEntry, RunManifest},
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
            .map_err(|e| invalid(spec, &format!("roles.{}.script", role.name), e.to_string()))?;
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
pub fn of(config: &toml::Table) -> Option<std::result::Result<Roles, RolesError>> {
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
            Some(Err(e)) => return Err(invalid(spec, "roles", e.to_string())),
            None => continue,
        };
        for role in roles.declared() {
            let at = format!("roles.{}", role.name);
            registry
                .find_benchmark(&role.benchmark)
                .map_err(|e| invalid(spec, &format!("{at}.benchmark"), e.to_string()))?;
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
                .map_err(|e| invalid(spec, &at, e.to_string()))
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

/// A node a role runs on: its name and the address the other roles reach
/// it at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub host: String,
}

/// Where a run's roles start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Every role on this machine, a child process each.
    Here { node: String },
    /// The role declared i-th on node i of this Slurm job, a job step each.
    Job { job_id: String, nodes: Vec<Node> },
}

/// The most nodes of a job's node list looked at.
const MAX_JOB_NODES: usize = 4096;

impl Placement {
    /// The placement of a run's roles: on the nodes of `ctx.slurm_job`
    /// when the run is carried out inside one, else here. A job with
    /// fewer nodes than roles is refused (the reason as one line).
    pub fn for_run(ctx: &RunContext, roles: &Roles) -> std::result::Result<Self, RolesError> {
        let Some(job_id) = &ctx.slurm_job else {
            return Ok(Self::Here { node: hostname() });
        };
        let list = std::env::var("SLURM_JOB_NODELIST")
            .or_else(|_| std::env::var("SLURM_NODELIST"))
            .map_err(|_| RolesError::NoNodeList {
                job_id: job_id.clone(),
            })?;
        let out = super::slurm::tool(
            "scontrol",
            &["show".into(), "hostnames".into(), list.clone()],
            SLURM_QUERY,
        )
        .map_err(|e| RolesError::Slurm(Box::new(e)))?;
        if !out.success {
            return Err(RolesError::Tool {
                command: format!("scontrol show hostnames {list}"),
                message: out.error_text(),
            });
        }
        let names: Vec<String> = out
            .stdout
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .take(MAX_JOB_NODES)
            .map(str::to_owned)
            .collect();
        if names.len() < roles.len() {
            return Err(RolesError::JobTooSmall {
                job_id: job_id.clone(),
                found: names.len(),
                list,
                roles: roles.len(),
            });
        }
        let nodes = names
            .into_iter()
            .take(roles.len())
            .map(|name| {
                let host = node_address(&name)?;
                Ok(Node { name, host })
            })
            .collect::<std::result::Result<_, RolesError>>()?;
        Ok(Self::Job {
            job_id: job_id.clone(),
            nodes,
        })
    }

    /// The node of the role declared `index`-th.
    fn node(&self, index: usize) -> Node {
        match self {
            Self::Here { node } => Node {
                name: node.clone(),
                host: LOCAL_HOST.to_owned(),
            },
            Self::Job { nodes, .. } => nodes.get(index).cloned().unwrap_or_else(|| Node {
                name: "?".into(),
                host: LOCAL_HOST.to_owned(),
            }),
        }
    }

    /// `executor` in the run's manifest.
    fn executor(&self) -> &'static str {
        match self {
            Self::Here { .. } => "local",
            Self::Job { .. } => "slurm",
        }
    }

    /// The command that starts `cmd` for the role declared `index`-th:
    /// itself here, a job step on its node in a Slurm job (the step's
    /// environment is this process's plus what the caller adds).
    fn command(&self, index: usize, name: &str, cmd: Command) -> Command {
        match self {
            Self::Here { .. } => cmd,
            Self::Job { .. } => crate::srun::step(
                &format!("kml-role-{name}"),
                crate::srun::Span::Node(index),
                &cmd,
            ),
        }
    }

    /// Tells a started role to stop: SIGTERM to its `kernmlops run`, or
    /// SIGINT to its `srun`, which forwards it to the step's task (srun
    /// answers SIGTERM by killing the step).
    fn ask_to_stop(&self, child: &Child) {
        let sig = match self {
            Self::Here { .. } => libc::SIGTERM,
            Self::Job { .. } => libc::SIGINT,
        };
        // SAFETY: kill(2) on our own child, not yet waited for.
        unsafe {
            libc::kill(child.id() as libc::pid_t, sig);
        }
    }

    /// Ends a role that did not stop in time: SIGKILL here; in a job,
    /// SIGTERM to its `srun` (which kills the step on its node), a moment,
    /// then SIGKILL to srun.
    fn force_stop(&self, child: &mut Child) -> Option<ExitStatus> {
        if let Self::Job { .. } = self {
            // SAFETY: as in ask_to_stop.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(s)) = child.try_wait() {
                    return Some(s);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = child.kill();
        child.wait().ok()
    }
}

/// Longest wait for `scontrol`.
const SLURM_QUERY: Duration = Duration::from_secs(20);
/// Longest wait for the job step that reads every node's boot id.
const BOOT_ID_QUERY: Duration = Duration::from_secs(60);
/// The kernel's id for this boot: equal on two nodes exactly when they
/// run on one kernel (namespaces or containers of one machine).
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// Whether a role is collected (it has probes, or the configuration's).
fn collected(role: &Role) -> bool {
    role.probes.as_ref().is_none_or(|p| !p.is_empty())
}

/// For each role as declared, whether its collection is filtered to its
/// own processes (see the module's documentation). The nodes' boot ids
/// are read only when a collected role's `filter` is `auto`.
fn filtered_roles(
    roles: &Roles,
    placement: &Placement,
) -> std::result::Result<Vec<bool>, RolesError> {
    let auto = roles
        .declared()
        .any(|r| collected(r) && r.filter == RoleFilter::Auto);
    let shared = match placement {
        _ if !auto => vec![false; roles.len()],
        Placement::Here { .. } => vec![roles.len() > 1; roles.len()],
        Placement::Job { nodes, .. } => shares_a_kernel(&boot_ids(nodes.len())?),
    };
    Ok(roles
        .declared()
        .zip(shared)
        .map(|(r, shares)| collected(r) && r.filter.applies(shares))
        .collect())
}

/// Each of the job's first `n` nodes' boot id, by one job step with a
/// task on each (`srun --label`: a line `I: ID` from the task on node I).
fn boot_ids(n: usize) -> std::result::Result<Vec<String>, RolesError> {
    let mut cat = Command::new("cat");
    cat.arg(BOOT_ID);
    let nodes = u32::try_from(n).unwrap_or(u32::MAX);
    // Task i on the job's node i, each output line led by its task number.
    let srun = crate::srun::step_with(
        "kml-boot-id",
        crate::srun::Span::Each(nodes),
        &["--relative=0", "--label"],
        &cat,
    );
    let args: Vec<String> = srun
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let out = super::slurm::tool("srun", &args, BOOT_ID_QUERY)
        .map_err(|e| RolesError::Slurm(Box::new(e)))?;
    let command = format!("srun cat {BOOT_ID} on {n} node(s)");
    if !out.success {
        return Err(RolesError::Tool {
            command,
            message: out.error_text(),
        });
    }
    parse_boot_ids(&out.stdout, n).map_err(|message| RolesError::Tool { command, message })
}

/// The boot ids in `srun --label` output, by task: every one of the `n`
/// tasks must have printed one.
fn parse_boot_ids(text: &str, n: usize) -> std::result::Result<Vec<String>, String> {
    let mut ids = vec![String::new(); n];
    for line in text.lines() {
        let Some((task, id)) = line.split_once(':') else {
            continue;
        };
        if let Some(slot) = task
            .trim()
            .parse::<usize>()
            .ok()
            .and_then(|t| ids.get_mut(t))
        {
            id.trim().clone_into(slot);
        }
    }
    match ids.iter().position(String::is_empty) {
        Some(task) => Err(format!("task {task} printed no boot id")),
        None => Ok(ids),
    }
}

/// For each node, whether another node has the same boot id.
fn shares_a_kernel(ids: &[String]) -> Vec<bool> {
    ids.iter()
        .enumerate()
        .map(|(i, id)| ids.iter().enumerate().any(|(j, o)| j != i && o == id))
        .collect()
}

/// A Slurm node's address (`NodeAddr`, as an IPv4 address where it is a
/// name that resolves to one).
fn node_address(name: &str) -> std::result::Result<String, RolesError> {
    let out = super::slurm::tool(
        "scontrol",
        &[
            "--oneliner".into(),
            "show".into(),
            "node".into(),
            name.into(),
        ],
        SLURM_QUERY,
    )
    .map_err(|e| RolesError::Slurm(Box::new(e)))?;
    if !out.success {
        return Err(RolesError::Tool {
            command: format!("scontrol show node {name}"),
            message: out.error_text(),
        });
    }
    let addr = out
        .stdout
        .split_whitespace()
        .find_map(|f| f.strip_prefix("NodeAddr="))
        .filter(|a| !a.is_empty())
        .unwrap_or(name);
    if addr.parse::<std::net::IpAddr>().is_ok() {
        return Ok(addr.to_owned());
    }
    let resolved = std::net::ToSocketAddrs::to_socket_addrs(&(addr, 0))
        .ok()
        .and_then(|mut a| a.find(SocketAddr::is_ipv4))
        .map(|a| a.ip().to_string());
    Ok(resolved.unwrap_or_else(|| addr.to_owned()))
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
fn role_env(roles: &Roles, placement: &Placement) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for (i, r) in roles.declared().enumerate() {
        let up = r.name.to_ascii_uppercase();
        let node = placement.node(i);
        env.push((format!("KML_ROLE_{up}_HOST"), node.host));
        env.push((format!("KML_ROLE_{up}_NODE"), node.name));
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

/// Whether a role whose address is `host` is ready now.
fn is_ready(check: &ReadyCheck, collection: &Path, host: &str) -> bool {
    match check {
        ReadyCheck::Port(p) => {
            let addr = match host.parse::<IpAddr>() {
                Ok(ip) => Some(SocketAddr::from((ip, *p))),
                Err(_) => std::net::ToSocketAddrs::to_socket_addrs(&(host, *p))
                    .ok()
                    .and_then(|mut a| a.next()),
            };
            addr.is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_millis(200)).is_ok())
        }
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

/// Starts one role's `kernmlops run` (the role declared `index`-th) where
/// `placement` puts it, output to `log`.
#[allow(clippy::too_many_arguments)]
fn start(
    ctx: &RunContext,
    placement: &Placement,
    index: usize,
    role: &Role,
    collection: &Path,
    config: &Path,
    log: &Path,
    env: &[(String, String)],
    filtered: bool,
) -> Result<Child> {
    let mut run = super::executor::collect_command(
        ctx,
        &role.benchmark,
        role.probes.as_deref(),
        collection,
        config,
    );
    if filtered {
        run.arg("--cgroup-workload");
    }
    let mut cmd = placement.command(index, &role.name, run);
    let header = format!(
        "== role {} {} on {} (node {}): {}",
        role.name,
        kernmlops_sys::clock::rfc3339(kernmlops_sys::clock::unix_us()),
        hostname(),
        placement.node(index).name,
        super::executor::shown(&cmd)
    );
    super::executor::output_to_log(&mut cmd, log, &header)?;
    cmd.envs(env.iter().map(|(k, v)| (k, v)))
        .env("KML_ROLE", &role.name);
    cmd.spawn().map_err(|source| ExperimentError::Launch {
        program: ctx.exe.display().to_string(),
        source,
    })
}

/// Tells every role still running to stop, then waits for them (each
/// `kernmlops run` stops its benchmark's cgroup and finishes its manifest);
/// forced after [`STOP_GRACE`].
fn stop_all(running: &mut [Running], placement: &Placement, tick: &mut dyn FnMut()) {
    for r in running.iter_mut().rev() {
        if r.exit.is_none() {
            if let Ok(Some(s)) = r.child.try_wait() {
                r.exit = Some(s);
                continue;
            }
            placement.ask_to_stop(&r.child);
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
                r.exit = placement.force_stop(&mut r.child);
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
    let mut run = Started {
        ctx,
        run_id,
        run_dir,
        config,
        roles,
        placement: Placement::Here { node: hostname() },
        running: Vec::new(),
        failure: None,
        signalled: false,
        filtered: Vec::new(),
    };
    match Placement::for_run(ctx, roles) {
        Ok(p) => run.placement = p,
        Err(e) => {
            run.failure = Some(e.to_string());
            if let Some(job_id) = &ctx.slurm_job {
                run.placement = Placement::Job {
                    job_id: job_id.clone(),
                    nodes: Vec::new(),
                };
            }
        }
    }
    if run.failure.is_none() {
        match filtered_roles(roles, &run.placement) {
            Ok(f) => run.filtered = f,
            Err(e) => {
                run.failure = Some(format!(
                    "telling whether the roles' nodes share a kernel: {e}; filter = \"workload\" or \"none\" in each collected role skips this"
                ))
            }
        }
    }
    if run.failure.is_none() {
        run.start_roles(tick)?;
    }
    if run.failure.is_none() && !run.signalled {
        run.wait_for_result(tick)?;
    }
    stop_all(&mut run.running, &run.placement, tick);
    let _ = std::fs::remove_file(dir.run_pid(run_id));
    let ok = write_manifest(&run)?;
    Ok(ExitStatus::from_raw(if ok { 0 } else { 1 << 8 }))
}

/// A run with roles under way.
struct Started<'a> {
    ctx: &'a RunContext,
    run_id: &'a str,
    run_dir: &'a Path,
    config: &'a toml::Table,
    roles: &'a Roles,
    placement: Placement,
    running: Vec<Running>,
    /// Why the run failed (a role not ready, not started).
    failure: Option<String>,
    /// Told to stop by a signal.
    signalled: bool,
    /// For each role as declared, whether its collection is filtered to
    /// its own processes.
    filtered: Vec<bool>,
}

impl Started<'_> {
    /// A role's collection, configuration file and log.
    fn paths(&self, r: &Role) -> (PathBuf, PathBuf, PathBuf) {
        let root = &self.ctx.dir.root;
        (
            self.run_dir.join(&r.name),
            root.join("configs")
                .join(format!("{}.{}.toml", self.run_id, r.name)),
            root.join("logs")
                .join(format!("{}.{}.log", self.run_id, r.name)),
        )
    }

    /// Starts the roles in start order, each waited for until ready
    /// before the next; stops at the first that fails.
    fn start_roles(&mut self, tick: &mut dyn FnMut()) -> Result<()> {
        let env = role_env(self.roles, &self.placement);
        let index = |name: &str| self.roles.declared().position(|r| r.name == name);
        for role in self.roles.start_order() {
            let i = index(&role.name).unwrap_or_default();
            let (collection, config_path, log) = self.paths(role);
            let text = toml::to_string_pretty(&role_config(self.config, role)).unwrap_or_default();
            write_atomic(&config_path, text.as_bytes())?;
            let started = start(
                self.ctx,
                &self.placement,
                i,
                role,
                &collection,
                &config_path,
                &log,
                &env,
                self.filtered.get(i).copied().unwrap_or(false),
            );
            let child = match started {
                Ok(c) => c,
                Err(e) => {
                    self.failure = Some(format!("role {}: {e}", role.name));
                    return Ok(());
                }
            };
            self.running.push(Running {
                name: role.name.clone(),
                child,
                started: Instant::now(),
                ready_s: None,
                exit: None,
                stopped: false,
            });
            let host = self.placement.node(i).host;
            if !self.wait_until_ready(role, &collection, &host, &log, tick) {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Waits for the role just started to be ready; false (with the
    /// failure or signal noted) when it is not.
    fn wait_until_ready(
        &mut self,
        role: &Role,
        collection: &Path,
        host: &str,
        log: &Path,
        tick: &mut dyn FnMut(),
    ) -> bool {
        let Some(r) = self.running.last_mut() else {
            return false;
        };
        let Some(ready) = &role.ready else {
            r.ready_s = Some(0.0);
            return true;
        };
        let timeout = Duration::from_secs(ready.timeout_s.into());
        loop {
            if self.ctx.stop.load(Ordering::Relaxed) {
                self.signalled = true;
                return false;
            }
            if is_ready(&ready.check, collection, host) {
                r.ready_s = Some(r.started.elapsed().as_secs_f64());
                return true;
            }
            if let Ok(Some(s)) = r.child.try_wait() {
                r.exit = Some(s);
                self.failure = Some(format!(
                    "role {} ended ({s}) before it was ready ({}); see {}",
                    role.name,
                    describe(&ready.check),
                    log.display()
                ));
                return false;
            }
            if r.started.elapsed() >= timeout {
                self.failure = Some(format!(
                    "role {} was not ready after {} s ({}); every role was stopped; see {}",
                    role.name,
                    ready.timeout_s,
                    describe(&ready.check),
                    log.display()
                ));
                return false;
            }
            tick();
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the result role's end, which ends the run.
    fn wait_for_result(&mut self, tick: &mut dyn FnMut()) -> Result<()> {
        let result_name = self
            .roles
            .result()
            .map(|r| r.name.clone())
            .unwrap_or_default();
        let Some(r) = self.running.iter_mut().find(|r| r.name == result_name) else {
            return Ok(());
        };
        let mut since: Option<Instant> = None;
        loop {
            match r.child.try_wait() {
                Ok(Some(s)) => {
                    r.exit = Some(s);
                    return Ok(());
                }
                Ok(None) => {}
                Err(e) => return Err(ExperimentError::io(self.run_dir)(e)),
            }
            if self.ctx.stop.load(Ordering::Relaxed) {
                self.signalled = true;
                // It likely got the signal too: a moment to stop by
                // itself, then it is stopped with the others.
                let at = *since.get_or_insert_with(Instant::now);
                if at.elapsed() >= Duration::from_secs(3) {
                    return Ok(());
                }
            }
            tick();
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The result role's manifest as its collector wrote it: the run's
/// manifest is that file with the roles run's keys added, every key kept
/// (read as JSON so nothing the collector wrote is dropped on the way).
fn read_json(path: &Path) -> Option<Json> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// Writes the run's manifest (and its indicator, the result role's);
/// whether the run succeeded.
fn write_manifest(run: &Started) -> Result<bool> {
    let (run_dir, roles, running) = (run.run_dir, run.roles, &run.running);
    let (failure, signalled) = (run.failure.as_deref(), run.signalled);
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
    for (i, role) in roles.declared().enumerate() {
        let node = run.placement.node(i);
        // The role's own collection, read through the host's types.
        let own = RunManifest::read(&run_dir.join(&role.name))
            .ok()
            .map(|m| m.manifest);
        for (t, v) in own.iter().flat_map(|m| &m.tables) {
            let v = serde_json::to_value(v).unwrap_or(Json::Null);
            tables.insert(format!("{}_{t}", role.name), v);
        }
        let ran = running.iter().find(|r| r.name == role.name);
        let entry = RoleEntry {
            node: node.name,
            host: node.host,
            collection: role.name.clone(),
            benchmark: role.benchmark.clone(),
            probes: role.probes.clone(),
            result: role.result,
            started: ran.is_some(),
            ready_after_s: ran.and_then(|r| r.ready_s),
            stopped_by_run: ran.is_some_and(|r| r.stopped),
            exit_code: ran.and_then(|r| r.exit).and_then(|s| s.code()),
            status: own.as_ref().map(|m| m.status),
            run_class: own.as_ref().map(|m| m.run_class),
            filtered: run.filtered.get(i).copied().unwrap_or(false),
        };
        described.insert(
            role.name.clone(),
            serde_json::to_value(&entry).unwrap_or(Json::Null),
        );
    }
    manifest["tables"] = Json::Object(tables);
    manifest["roles"] = Json::Object(described);
    manifest["executor"] = json!(run.placement.executor());
    if let Placement::Job { job_id, .. } = &run.placement {
        manifest["slurm_job"] = json!(job_id);
    }
    if manifest["hostname"].is_null() {
        manifest["hostname"] = json!(hostname());
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
    fn roles_sharing_a_kernel_are_filtered_unless_told_otherwise() {
        let here = Placement::Here { node: hostname() };
        // Every role here shares this kernel; the client is not collected.
        assert_eq!(
            filtered_roles(&roles(TWO), &here).expect("here"),
            [true, false]
        );
        let none = TWO.replace("ready = {", "filter = \"none\"\nready = {");
        assert_eq!(
            filtered_roles(&roles(&none), &here).expect("here"),
            [false, false]
        );
        // One role alone shares its kernel with no other role.
        let alone = "name = \"a\"\n[roles.s]\nbenchmark = \"fio\"\nresult = true\n";
        assert_eq!(filtered_roles(&roles(alone), &here).expect("here"), [false]);
        let always = alone.replace("result = true", "result = true\nfilter = \"workload\"");
        assert_eq!(
            filtered_roles(&roles(&always), &here).expect("here"),
            [true]
        );
        // With no collected role left to `auto`, no job step asks the nodes.
        let job = Placement::Job {
            job_id: "7".into(),
            nodes: Vec::new(),
        };
        assert_eq!(
            filtered_roles(&roles(&none), &job).expect("no step"),
            [false, false]
        );
    }

    #[test]
    fn boot_ids_tell_which_nodes_share_a_kernel() {
        let ids = parse_boot_ids("1: bbb\n0: aaa\n 2: aaa\nsrun: noise\n", 3).expect("ids");
        assert_eq!(ids, ["aaa", "bbb", "aaa"]);
        assert_eq!(shares_a_kernel(&ids), [true, false, true]);
        let e = parse_boot_ids("0: aaa\n", 2).expect_err("task 1 missing");
        assert_eq!(e, "task 1 printed no boot id");
        let distinct: Vec<String> = vec!["a".into(), "b".into()];
        assert_eq!(shares_a_kernel(&distinct), [false, false]);
    }

    #[test]
    fn every_role_learns_every_address() {
        let here = Placement::Here { node: hostname() };
        let env: std::collections::HashMap<String, String> =
            role_env(&roles(TWO), &here).into_iter().collect();
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
        assert!(!is_ready(
            &ReadyCheck::Line("ready".into()),
            &tmp,
            LOCAL_HOST
        ));
        std::fs::write(tmp.join("sub/benchmark.stderr"), "x\nserver ready on 1\n").expect("w");
        assert!(is_ready(
            &ReadyCheck::Line("ready on".into()),
            &tmp,
            LOCAL_HOST
        ));
        assert!(!is_ready(&ReadyCheck::File("up".into()), &tmp, LOCAL_HOST));
        std::fs::write(tmp.join("up"), "").expect("w");
        assert!(is_ready(&ReadyCheck::File("up".into()), &tmp, LOCAL_HOST));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        assert!(is_ready(&ReadyCheck::Port(port), &tmp, LOCAL_HOST));
        assert!(is_ready(&ReadyCheck::Port(port), &tmp, "localhost"));
        assert!(!is_ready(
            &ReadyCheck::Port(port),
            &tmp,
            "no-such-host.invalid"
        ));
        drop(listener);
        assert!(!is_ready(&ReadyCheck::Port(port), &tmp, LOCAL_HOST));
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn in_a_slurm_job_each_role_is_a_step_on_its_own_node() {
        let job = Placement::Job {
            job_id: "7".into(),
            nodes: vec![
                Node {
                    name: "kml-n1".into(),
                    host: "10.0.0.1".into(),
                },
                Node {
                    name: "kml-n2".into(),
                    host: "10.0.0.2".into(),
                },
            ],
        };
        let env: std::collections::HashMap<String, String> =
            role_env(&roles(TWO), &job).into_iter().collect();
        assert_eq!(env["KML_ROLE_SERVER_HOST"], "10.0.0.1");
        assert_eq!(env["KML_ROLE_SERVER_NODE"], "kml-n1");
        assert_eq!(env["KML_ROLE_CLIENT_HOST"], "10.0.0.2");
        assert_eq!(env["KML_ROLE_CLIENT_NODE"], "kml-n2");
        let mut cmd = Command::new("/bin/kernmlops");
        cmd.args(["run", "--benchmark", "script"]);
        let step = job.command(1, "client", cmd);
        assert_eq!(
            crate::executor::shown(&step),
            "srun --disable-status --nodes=1 --ntasks=1 --relative=1 --job-name=kml-role-client --export=ALL /bin/kernmlops run --benchmark script"
        );
        assert_eq!(job.executor(), "slurm");
        let here = Placement::Here { node: "h".into() };
        let same = here.command(0, "server", Command::new("/bin/true"));
        assert_eq!(crate::executor::shown(&same), "/bin/true");
        assert_eq!(here.node(0).host, LOCAL_HOST);
    }
}
