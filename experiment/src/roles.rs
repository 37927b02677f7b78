//! Roles: a run made of several programs, each on its own node, such as a
//! server measured on one node and its load generator on another.
//!
//! ```toml
//! name = "redis_remote"
//!
//! [roles.server]                # collected: the kernel being measured
//! benchmark = "redis_server"
//! probes = ["quanta_runtime"]
//! ready = { port = 6379 }       # or { file = "..." } or { line = "..." }
//!
//! [roles.client]
//! benchmark = "script"
//! script = "bench/load.sh"
//! probes = []                   # not collected
//! after = "server"              # starts once the server is ready
//! result = true                 # this role's figures are the run's result
//! filter = "auto"               # or "workload", "none": see RoleFilter
//!
//! [variables.clients]
//! key = "roles.client.parameters.clients"
//! values = [1, 8, 64]
//! ```
//!
//! This module reads and checks the `[roles.NAME]` tables: each role's
//! benchmark (a `script` benchmark names its script), probes, readiness
//! check and `after` (roles it waits for: known roles, no cycle), exactly
//! one `result = true` role, and the order roles start in (each after
//! those it waits for, otherwise as declared). [`Roles::check_nodes`]
//! refuses more roles than the partition has nodes, and [`preflight`] does
//! these checks for `experiment run` before anything is written.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

use super::{slurm::SlurmOptions, spec::Spec, ExperimentError, Result};

/// Most roles one experiment may have (a role is a node of its own).
pub const MAX_ROLES: usize = 64;
/// Longest role name (it names a folder and environment variables).
pub const MAX_NAME: usize = 32;
/// Seconds a role may take to become ready unless `ready.timeout_s` says.
pub const DEFAULT_READY_TIMEOUT_S: u32 = 60;
/// The longest `ready.timeout_s`.
pub const MAX_READY_TIMEOUT_S: u32 = 3600;

/// How a role shows that the roles after it may start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadyCheck {
    /// A TCP port on the role's node that accepts a connection.
    Port(u16),
    /// A file (relative to the role's collection folder) that exists.
    File(String),
    /// A line of the role's output that contains this text.
    Line(String),
}

/// Whether a role's collection records only its own benchmark's
/// processes (its workload cgroup and below, `kernmlops run
/// --cgroup-workload`), as `filter = "..."` of its table says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RoleFilter {
    /// Filtered when another role of the run runs on the same kernel
    /// (every role with `--executor local`; nodes of one machine, such as
    /// `scripts/slurm-local`'s, under Slurm), since its collection would
    /// otherwise see that role's processes.
    #[default]
    Auto,
    /// Always filtered.
    Workload,
    /// Never filtered: the role's collection sees the whole kernel.
    None,
}

impl RoleFilter {
    /// The value as the file writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Workload => "workload",
            Self::None => "none",
        }
    }

    /// Whether a collected role with this setting is filtered, given
    /// whether another role shares its kernel.
    pub fn applies(self, shares_kernel: bool) -> bool {
        match self {
            Self::Auto => shares_kernel,
            Self::Workload => true,
            Self::None => false,
        }
    }
}

/// Why the roles of a file, a run or a Slurm job do not fit, each as one
/// line.
#[derive(Debug, thiserror::Error)]
pub enum RolesError {
    #[error("{roles} roles ({names}) need {roles} nodes, but partition {partition} has {nodes}; use fewer roles or a larger partition (--partition)")]
    TooFewNodes {
        roles: usize,
        names: String,
        partition: String,
        nodes: usize,
    },
    #[error("{key:?} sets a role, but the file has no [roles.NAME] tables")]
    NoRoles { key: String },
    #[error("{key:?}: no role {name:?} (roles: {names})")]
    UnknownRole {
        key: String,
        name: String,
        names: String,
    },
    #[error("{key:?}: a role's variable sets one of its parameters, as \"roles.{name}.parameters.NAME\"")]
    NotAParameter { key: String, name: String },
    /// A run's `roles` table that does not read back as roles.
    #[error("{key}: {message}")]
    Config { key: String, message: String },
    #[error("Slurm job {job_id}: SLURM_JOB_NODELIST is not set, so its nodes are unknown")]
    NoNodeList { job_id: String },
    #[error("Slurm job {job_id} has {found} node(s) ({list}), but the run's {roles} roles need one each; `--executor slurm` allocates them")]
    JobTooSmall {
        job_id: String,
        found: usize,
        list: String,
        roles: usize,
    },
    /// A Slurm tool answered with an error.
    #[error("{command}: {message}")]
    Tool { command: String, message: String },
    /// A Slurm tool could not be run.
    #[error(transparent)]
    Slurm(Box<ExperimentError>),
}

/// A readiness check and how long to wait for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    pub check: ReadyCheck,
    pub timeout_s: u32,
}

/// One role of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Role {
    pub name: String,
    /// The workload benchmark this role runs.
    pub benchmark: String,
    /// The script of a `script` benchmark.
    pub script: Option<String>,
    /// Probes of its collection; `None`: the configuration's
    /// `collect.plugins`; empty: not collected.
    pub probes: Option<Vec<String>>,
    /// Roles that must be ready before this one starts.
    pub after: Vec<String>,
    /// Whether this role's figures are the run's result.
    pub result: bool,
    /// Parameters of its benchmark (`roles.NAME.parameters.KEY`, which
    /// variables may set).
    pub parameters: toml::Table,
    /// When it counts as ready; `None`: once started.
    pub ready: Option<Ready>,
    /// Whether its collection records only its own processes.
    pub filter: RoleFilter,
}

/// The roles of an experiment, as declared; empty when the file has none.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Roles {
    roles: Vec<Role>,
    /// Indices into `roles` in the order they start.
    order: Vec<usize>,
}

/// A `[roles.NAME]` table as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRole {
    benchmark: Option<String>,
    script: Option<String>,
    probes: Option<Vec<String>>,
    after: Option<toml::Value>,
    result: Option<bool>,
    #[serde(default)]
    parameters: toml::Table,
    ready: Option<RawReady>,
    filter: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReady {
    port: Option<i64>,
    file: Option<String>,
    line: Option<String>,
    timeout_s: Option<i64>,
}

/// An error at a key: `(key, message)`, as the experiment file reports it.
type KeyError = (String, String);

impl Roles {
    /// Checks the `[roles.NAME]` tables (in the order the file declares
    /// them) against the top-level `benchmark` and `probes`, which a file
    /// with roles leaves to each role.
    pub fn from_raw(
        declared: Vec<(String, RawRole)>,
        top_benchmark: Option<&str>,
        top_probes: Option<&Vec<String>>,
    ) -> std::result::Result<Self, KeyError> {
        if declared.is_empty() {
            return Ok(Self::default());
        }
        let err = |key: &str, m: String| Err((key.to_owned(), m));
        if top_benchmark.is_some() {
            return err(
                "benchmark",
                "with [roles.NAME] tables each role names its own benchmark: move it into the roles".into(),
            );
        }
        if top_probes.is_some() {
            return err(
                "probes",
                "with [roles.NAME] tables each role names its own probes: move them into the roles"
                    .into(),
            );
        }
        if declared.len() > MAX_ROLES {
            return err(
                "roles",
                format!(
                    "{} roles: at most {MAX_ROLES} (each is a node of its own)",
                    declared.len()
                ),
            );
        }
        let mut roles = Vec::with_capacity(declared.len());
        let mut upper: HashMap<String, String> = HashMap::new();
        for (name, raw) in declared {
            let role = role(&name, raw).map_err(|(key, m)| {
                (
                    if key.is_empty() {
                        format!("roles.{name}")
                    } else {
                        format!("roles.{name}.{key}")
                    },
                    m,
                )
            })?;
            // Names become KML_ROLE_<NAME>_HOST: two may not differ only in case.
            if let Some(other) = upper.insert(name.to_ascii_uppercase(), name.clone()) {
                return err(
                    &format!("roles.{name}"),
                    format!("differs from role {other:?} only in case; their environment variables (KML_ROLE_{}_...) would be the same", name.to_ascii_uppercase()),
                );
            }
            roles.push(role);
        }
        // `after` names other, known roles.
        for r in &roles {
            for a in &r.after {
                if *a == r.name {
                    return err(
                        &format!("roles.{}.after", r.name),
                        "a role cannot wait for itself".into(),
                    );
                }
                if !roles.iter().any(|o| o.name == *a) {
                    return err(
                        &format!("roles.{}.after", r.name),
                        format!("{a:?} is not a role (roles: {})", names(&roles)),
                    );
                }
            }
        }
        // Exactly one result role.
        let results: Vec<&str> = roles
            .iter()
            .filter(|r| r.result)
            .map(|r| r.name.as_str())
            .collect();
        match results.as_slice() {
            [_] => {}
            [] => {
                return err(
                    "roles",
                    format!(
                        "no role has result = true: mark the one whose figures are the run's result (roles: {})",
                        names(&roles)
                    ),
                )
            }
            many => {
                return err(
                    &format!("roles.{}.result", many[1]),
                    format!(
                        "{} roles have result = true ({}): exactly one role's figures are the run's result",
                        many.len(),
                        many.join(", ")
                    ),
                )
            }
        }
        let order = start_order(&roles)?;
        Ok(Self { roles, order })
    }

    pub fn is_empty(&self) -> bool {
        self.roles.is_empty()
    }

    pub fn len(&self) -> usize {
        self.roles.len()
    }

    /// The roles as the file declares them.
    pub fn declared(&self) -> impl Iterator<Item = &Role> {
        self.roles.iter()
    }

    /// The roles in the order they start: each after every role it waits
    /// for, otherwise in the order the file declares them.
    pub fn start_order(&self) -> impl Iterator<Item = &Role> {
        self.order.iter().map(|&i| &self.roles[i])
    }

    pub fn get(&self, name: &str) -> Option<&Role> {
        self.roles.iter().find(|r| r.name == name)
    }

    /// The role whose figures are the run's result.
    pub fn result(&self) -> Option<&Role> {
        self.roles.iter().find(|r| r.result)
    }

    /// Refuses more roles than `nodes`, the nodes of `partition`: each
    /// role runs on a node of its own.
    pub fn check_nodes(
        &self,
        partition: &str,
        nodes: usize,
    ) -> std::result::Result<(), RolesError> {
        if self.roles.len() > nodes {
            return Err(RolesError::TooFewNodes {
                roles: self.roles.len(),
                names: names(&self.roles),
                partition: partition.to_owned(),
                nodes,
            });
        }
        Ok(())
    }

    /// Checks a variable's key that sets something of a role
    /// (`roles.NAME.parameters.KEY`): the role exists and the key names
    /// one of its parameters. Keys outside `roles.` are left to the
    /// configuration's checks.
    pub fn check_key(&self, key: &str) -> std::result::Result<(), RolesError> {
        let Some(rest) = key.strip_prefix("roles.") else {
            return Ok(());
        };
        if self.roles.is_empty() {
            return Err(RolesError::NoRoles {
                key: key.to_owned(),
            });
        }
        let mut parts = rest.splitn(3, '.');
        let (name, section, param) = (parts.next(), parts.next(), parts.next());
        let Some(name) = name.filter(|n| self.get(n).is_some()) else {
            return Err(RolesError::UnknownRole {
                key: key.to_owned(),
                name: name.unwrap_or("").to_owned(),
                names: names(&self.roles),
            });
        };
        match (section, param) {
            (Some("parameters"), Some(p)) if !p.is_empty() => Ok(()),
            _ => Err(RolesError::NotAParameter {
                key: key.to_owned(),
                name: name.to_owned(),
            }),
        }
    }
}

/// Role names as a list for messages.
fn names(roles: &[Role]) -> String {
    roles
        .iter()
        .map(|r| r.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Checks one role on its own. Errors are `(key under the role, message)`.
fn role(name: &str, raw: RawRole) -> std::result::Result<Role, KeyError> {
    let err = |key: &str, m: String| Err((key.to_owned(), m));
    if !is_identifier(name) || name.len() > MAX_NAME {
        return err(
            "",
            format!("{name:?} is not a role name: up to {MAX_NAME} letters, digits and '_', not starting with a digit (it names a folder and environment variables)"),
        );
    }
    let benchmark = match raw.benchmark {
        Some(b) if !b.trim().is_empty() => b,
        Some(_) => return err("benchmark", "empty: name the role's workload benchmark (see `kernmlops plugins`)".into()),
        None => return err("benchmark", "missing: name the role's workload benchmark (see `kernmlops plugins`), or \"script\" with script = \"PATH\"".into()),
    };
    let script = match (benchmark.as_str(), raw.script) {
        ("script", Some(s)) if !s.trim().is_empty() => Some(s),
        ("script", Some(_)) => return err("script", "empty: the path of the script to run".into()),
        ("script", None) => {
            return err(
                "script",
                "missing: a role with benchmark = \"script\" names its script (script = \"PATH\")"
                    .into(),
            )
        }
        (_, Some(_)) => {
            return err(
                "script",
                format!(
                    "only a \"script\" benchmark runs a script, and this role runs {benchmark:?}"
                ),
            )
        }
        (_, None) => None,
    };
    if let Some(probes) = &raw.probes {
        let mut seen = std::collections::HashSet::new();
        for p in probes {
            if p.is_empty() {
                return err("probes", "an empty probe name".into());
            }
            if !seen.insert(p) {
                return err("probes", format!("{p:?} is listed twice"));
            }
        }
    }
    let after = parse_after(raw.after)?;
    let ready = raw.ready.map(parse_ready).transpose()?;
    let filter = match raw.filter.as_deref() {
        None | Some("auto") => RoleFilter::Auto,
        Some("workload") => RoleFilter::Workload,
        Some("none") => RoleFilter::None,
        Some(other) => return err(
            "filter",
            format!("{other:?}: \"auto\" (only its own processes when another role shares its kernel), \"workload\" (always) or \"none\" (the whole kernel)"),
        ),
    };
    Ok(Role {
        name: name.to_owned(),
        benchmark,
        script,
        probes: raw.probes,
        after,
        result: raw.result.unwrap_or(false),
        parameters: raw.parameters,
        ready,
        filter,
    })
}

/// A role's `after`: a role name or a list of distinct role names.
fn parse_after(after: Option<toml::Value>) -> std::result::Result<Vec<String>, KeyError> {
    let err = |key: &str, m: String| Err((key.to_owned(), m));
    let after = match after {
        None => Vec::new(),
        Some(toml::Value::String(s)) => vec![s],
        Some(toml::Value::Array(a)) => {
            let list = a
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    (
                        "after".to_owned(),
                        "must be a role name or a list of role names".to_owned(),
                    )
                })?;
            if let Some(d) = list
                .iter()
                .enumerate()
                .find_map(|(i, a)| list[..i].contains(a).then_some(a))
            {
                return err("after", format!("{d:?} is listed twice"));
            }
            list
        }
        Some(_) => {
            return err(
                "after",
                "must be a role name or a list of role names".into(),
            )
        }
    };
    Ok(after)
}

/// A role's `ready` table: exactly one check, and its timeout.
fn parse_ready(r: RawReady) -> std::result::Result<Ready, KeyError> {
    let err = |key: &str, m: String| Err((key.to_owned(), m));
    let given = [r.port.is_some(), r.file.is_some(), r.line.is_some()];
    if given.iter().filter(|g| **g).count() != 1 {
        return err(
            "ready",
            "give exactly one of port = N (a TCP port that answers), file = \"PATH\" or line = \"TEXT\" (in the role's output)".into(),
        );
    }
    let check = if let Some(p) = r.port {
        match u16::try_from(p) {
            Ok(p) if p > 0 => ReadyCheck::Port(p),
            _ => return err("ready.port", format!("{p}: a TCP port, 1 to 65535")),
        }
    } else if let Some(f) = r.file {
        if f.is_empty() {
            return err(
                "ready.file",
                "empty: the file whose existence means ready".into(),
            );
        }
        ReadyCheck::File(f)
    } else {
        let l = r.line.unwrap_or_default();
        if l.is_empty() {
            return err(
                "ready.line",
                "empty: the text of the line that means ready".into(),
            );
        }
        ReadyCheck::Line(l)
    };
    let timeout_s = match r.timeout_s {
        None => DEFAULT_READY_TIMEOUT_S,
        Some(t) if t >= 1 && t <= i64::from(MAX_READY_TIMEOUT_S) => t as u32,
        Some(t) => {
            return err(
                "ready.timeout_s",
                format!("{t}: seconds, 1 to {MAX_READY_TIMEOUT_S}"),
            )
        }
    };
    Ok(Ready { check, timeout_s })
}

/// The start order (Kahn's algorithm, taking the earliest declared role
/// whose roles are all started), or the cycle that prevents one.
fn start_order(roles: &[Role]) -> std::result::Result<Vec<usize>, KeyError> {
    let index: HashMap<&str, usize> = roles
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name.as_str(), i))
        .collect();
    let waits: Vec<Vec<usize>> = roles
        .iter()
        .map(|r| r.after.iter().map(|a| index[a.as_str()]).collect())
        .collect();
    let mut started = vec![false; roles.len()];
    let mut order = Vec::with_capacity(roles.len());
    while order.len() < roles.len() {
        let next = (0..roles.len()).find(|&i| !started[i] && waits[i].iter().all(|&w| started[w]));
        match next {
            Some(i) => {
                started[i] = true;
                order.push(i);
            }
            None => {
                let cycle = find_cycle(&waits, &started);
                let path: Vec<&str> = cycle.iter().map(|&i| roles[i].name.as_str()).collect();
                return Err((
                    format!("roles.{}.after", path[0]),
                    format!(
                        "the roles wait for each other in a cycle ({}), so none of them could start",
                        path.join(" -> ")
                    ),
                ));
            }
        }
    }
    Ok(order)
}

/// A cycle among the roles not started: following `after` from any of
/// them must come back to a role already on the path. The path is closed
/// (its first role repeated at the end).
fn find_cycle(waits: &[Vec<usize>], started: &[bool]) -> Vec<usize> {
    let Some(mut at) = (0..waits.len()).find(|&i| !started[i]) else {
        return Vec::new();
    };
    let mut path: Vec<usize> = Vec::new();
    loop {
        if let Some(pos) = path.iter().position(|&p| p == at) {
            let mut cycle = path.split_off(pos);
            cycle.push(at);
            return cycle;
        }
        path.push(at);
        // A role not started waits for at least one role not started.
        match waits[at].iter().find(|&&w| !started[w]) {
            Some(&w) => at = w,
            None => return path,
        }
    }
}

/// The nodes of a Slurm partition (the default partition when `None`; of
/// a comma-separated list, the largest), counted by `sinfo`, and its name.
pub fn partition_nodes(partition: Option<&str>) -> Result<(String, usize)> {
    let mut args = vec![
        "--noheader".to_owned(),
        "--Node".to_owned(),
        "--format=%N|%P".to_owned(),
    ];
    if let Some(p) = partition {
        args.push(format!("--partition={p}"));
    }
    let out = super::slurm::tool("sinfo", &args, std::time::Duration::from_secs(20))?;
    if !out.success {
        return Err(ExperimentError::SlurmRefused(format!(
            "sinfo: {}",
            out.error_text()
        )));
    }
    Ok(count_partition_nodes(&out.stdout, partition))
}

/// Nodes per partition from `sinfo --Node --format=%N|%P` (a line per node
/// and partition; the default partition marked with `*`): the named
/// partitions' largest, or the default one's.
fn count_partition_nodes(text: &str, partition: Option<&str>) -> (String, usize) {
    let mut nodes: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    let mut default = None;
    for line in text.lines() {
        let Some((node, part)) = line.trim().split_once('|') else {
            continue;
        };
        let name = part.trim_end_matches('*').to_owned();
        if part.ends_with('*') {
            default = Some(name.clone());
        }
        nodes.entry(name).or_default().insert(node.to_owned());
    }
    let wanted: Vec<String> = match partition {
        Some(p) => p.split(',').map(str::to_owned).collect(),
        None => default.into_iter().collect(),
    };
    wanted
        .into_iter()
        .map(|p| {
            let n = nodes.get(&p).map_or(0, |s| s.len());
            (p, n)
        })
        .max_by_key(|(_, n)| *n)
        .unwrap_or_else(|| ("(default)".to_owned(), 0))
}

/// What `experiment run` does with a file that has roles, before anything
/// is written: with the Slurm executor, more roles than the partition has
/// nodes are refused; warm-up runs are refused (they are not run with
/// roles yet). Nothing is run or submitted.
pub fn preflight(spec: &Spec, slurm: Option<&SlurmOptions>) -> Result<()> {
    if spec.roles.is_empty() {
        return Ok(());
    }
    let refuse = |key: &str, message: String| ExperimentError::Invalid {
        file: spec.file.clone(),
        key: key.into(),
        message,
    };
    if spec.warmup > 0 {
        return Err(refuse(
            "warmup",
            format!("{}: warm-up runs are not run with roles yet; remove warmup (nothing was run or submitted)", spec.warmup),
        ));
    }
    if let Some(options) = slurm {
        let (partition, nodes) = partition_nodes(options.partition.as_deref())?;
        spec.roles
            .check_nodes(&partition, nodes)
            .map_err(|message| refuse("roles", format!("{message}; nothing was submitted")))?;
    }
    Ok(())
}

impl Roles {
    /// The roles as the `roles` table of a run's configuration, each as
    /// its `[roles.NAME]` table was written (`script` as given to it:
    /// the caller resolves it).
    pub fn to_config(&self) -> toml::Table {
        let mut out = toml::Table::new();
        for r in &self.roles {
            let mut t = toml::Table::new();
            t.insert("benchmark".into(), r.benchmark.clone().into());
            if let Some(s) = &r.script {
                t.insert("script".into(), s.clone().into());
            }
            if let Some(p) = &r.probes {
                t.insert("probes".into(), p.clone().into());
            }
            if !r.after.is_empty() {
                t.insert("after".into(), r.after.clone().into());
            }
            if r.result {
                t.insert("result".into(), true.into());
            }
            if !r.parameters.is_empty() {
                t.insert("parameters".into(), r.parameters.clone().into());
            }
            if let Some(ready) = &r.ready {
                let mut rt = toml::Table::new();
                match &ready.check {
                    ReadyCheck::Port(p) => rt.insert("port".into(), i64::from(*p).into()),
                    ReadyCheck::File(f) => rt.insert("file".into(), f.clone().into()),
                    ReadyCheck::Line(l) => rt.insert("line".into(), l.clone().into()),
                };
                rt.insert("timeout_s".into(), i64::from(ready.timeout_s).into());
                t.insert("ready".into(), rt.into());
            }
            if r.filter != RoleFilter::Auto {
                t.insert("filter".into(), r.filter.as_str().into());
            }
            out.insert(r.name.clone(), t.into());
        }
        out
    }

    /// The roles of a run's configuration (its `roles` table, as
    /// [`Roles::to_config`] wrote it and variables set), checked again.
    /// `None` when the configuration has no roles.
    pub fn from_config(config: &toml::Table) -> Option<std::result::Result<Self, RolesError>> {
        let bad = |key: String, message: String| Some(Err(RolesError::Config { key, message }));
        let table = match config.get("roles")? {
            toml::Value::Table(t) => t,
            _ => return bad("roles".into(), "not a table of roles".into()),
        };
        let mut declared = Vec::new();
        for (name, value) in table {
            match RawRole::deserialize(value.clone()) {
                Ok(raw) => declared.push((name.clone(), raw)),
                Err(e) => return bad(format!("roles.{name}"), e.message().to_owned()),
            }
        }
        Some(
            Self::from_raw(declared, None, None)
                .map_err(|(key, message)| RolesError::Config { key, message }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::tests::assert_parse_errors;

    fn parse(text: &str) -> Result<Spec> {
        Spec::parse("exp.toml", text)
    }

    fn err(text: &str) -> String {
        let e = parse(text).expect_err(text).to_string();
        assert!(!e.contains('\n'), "one line: {e}");
        e
    }

    const SERVER: &str =
        "[roles.server]\nbenchmark = \"redis_server\"\nprobes = [\"quanta_runtime\"]\n";
    const CLIENT: &str = "[roles.client]\nbenchmark = \"script\"\nscript = \"bench/load.sh\"\nprobes = []\nafter = \"server\"\nresult = true\n";

    fn order(s: &Spec) -> Vec<&str> {
        s.roles.start_order().map(|r| r.name.as_str()).collect()
    }

    #[test]
    fn the_issue_example_parses_with_its_roles_and_variable() {
        let s = parse(&format!(
            "name = \"redis_remote\"\nrepeats = 3\n{SERVER}ready = {{ port = 6379 }}\n{CLIENT}\
             [variables.clients]\nkey = \"roles.client.parameters.clients\"\nvalues = [1, 8, 64]\n"
        ))
        .expect("valid");
        assert_eq!(s.roles.len(), 2);
        let server = s.roles.get("server").expect("server");
        assert_eq!(server.benchmark, "redis_server");
        assert_eq!(server.probes, Some(vec!["quanta_runtime".to_owned()]));
        assert_eq!(
            server.ready,
            Some(Ready {
                check: ReadyCheck::Port(6379),
                timeout_s: DEFAULT_READY_TIMEOUT_S
            })
        );
        let client = s.roles.result().expect("a result role");
        assert_eq!(client.name, "client");
        assert_eq!(client.script.as_deref(), Some("bench/load.sh"));
        assert_eq!(client.probes, Some(vec![]));
        assert_eq!(client.after, ["server"]);
        assert_eq!(order(&s), ["server", "client"]);
        // The spec's benchmark is the result role's.
        assert_eq!(s.benchmark, "script");
        assert_eq!(s.variables[0].key, "roles.client.parameters.clients");
    }

    #[test]
    fn start_order_puts_each_role_after_those_it_waits_for() {
        // Declared client, db, web, cache; client waits for web, web for
        // db and cache.
        let s = parse(
            "name = \"o\"\n\
             [roles.client]\nbenchmark = \"b\"\nafter = \"web\"\nresult = true\n\
             [roles.db]\nbenchmark = \"b\"\n\
             [roles.web]\nbenchmark = \"b\"\nafter = [\"db\", \"cache\"]\n\
             [roles.cache]\nbenchmark = \"b\"\n",
        )
        .expect("valid");
        assert_eq!(order(&s), ["db", "cache", "web", "client"]);
        let declared: Vec<&str> = s.roles.declared().map(|r| r.name.as_str()).collect();
        assert_eq!(declared, ["client", "db", "web", "cache"]);
        // Without `after`: the declared order.
        let s = parse(
            "name = \"o\"\n[roles.z]\nbenchmark = \"b\"\n[roles.a]\nbenchmark = \"b\"\nresult = true\n",
        )
        .expect("valid");
        assert_eq!(order(&s), ["z", "a"]);
    }

    #[test]
    fn a_cycle_in_after_is_refused_naming_it() {
        let e = err("name = \"c\"\n\
             [roles.a]\nbenchmark = \"b\"\nafter = \"c\"\nresult = true\n\
             [roles.b]\nbenchmark = \"b\"\nafter = \"a\"\n\
             [roles.c]\nbenchmark = \"b\"\nafter = \"b\"\n\
             [roles.d]\nbenchmark = \"b\"\n");
        assert!(
            e.starts_with("exp.toml: roles.a.after: the roles wait for each other in a cycle (a -> c -> b -> a)"),
            "{e}"
        );
        // Two roles waiting for each other.
        let e = err(
            "name = \"c\"\n[roles.x]\nbenchmark = \"b\"\nafter = \"y\"\nresult = true\n[roles.y]\nbenchmark = \"b\"\nafter = [\"x\"]\n",
        );
        assert!(e.contains("cycle (x -> y -> x)"), "{e}");
        let e = err("name = \"c\"\n[roles.x]\nbenchmark = \"b\"\nafter = \"x\"\nresult = true\n");
        assert!(
            e.contains("roles.x.after: a role cannot wait for itself"),
            "{e}"
        );
    }

    #[test]
    fn an_unknown_role_in_after_is_refused() {
        let e = err(&format!(
            "name = \"u\"\n{SERVER}{}",
            CLIENT.replace("after = \"server\"", "after = \"sever\"")
        ));
        assert_eq!(
            e,
            "exp.toml: roles.client.after: \"sever\" is not a role (roles: server, client)"
        );
    }

    #[test]
    fn exactly_one_result_role() {
        let e = err(&format!("name = \"r\"\n{SERVER}result = true\n{CLIENT}"));
        assert!(
            e.contains("roles.client.result: 2 roles have result = true (server, client)"),
            "{e}"
        );
        let e = err(&format!(
            "name = \"r\"\n{SERVER}{}",
            CLIENT.replace("result = true\n", "")
        ));
        assert!(e.contains("roles: no role has result = true"), "{e}");
        // result = false is the same as leaving it out.
        let e = err(&format!(
            "name = \"r\"\n{SERVER}result = false\n{}",
            CLIENT.replace("result = true\n", "")
        ));
        assert!(e.contains("no role has result = true"), "{e}");
    }

    #[test]
    fn a_roles_benchmark_script_and_probes_are_checked() {
        assert_parse_errors(
            "name = \"p\"\n[roles.x]\n",
            &[
            ("probes = []\nresult = true\n", "roles.x.benchmark: missing"),
            (
                "benchmark = \"\"\nresult = true\n",
                "roles.x.benchmark: empty",
            ),
            (
                "benchmark = \"script\"\nresult = true\n",
                "roles.x.script: missing",
            ),
            (
                "benchmark = \"script\"\nscript = \"\"\nresult = true\n",
                "roles.x.script: empty",
            ),
            (
                "benchmark = \"fio\"\nscript = \"a.sh\"\nresult = true\n",
                "roles.x.script: only a \"script\" benchmark runs a script",
            ),
            (
                "benchmark = \"fio\"\nprobes = [\"\"]\nresult = true\n",
                "roles.x.probes: an empty probe name",
            ),
            (
                "benchmark = \"fio\"\nprobes = [\"a\", \"a\"]\nresult = true\n",
                "roles.x.probes: \"a\" is listed twice",
            ),
            (
                "benchmark = \"fio\"\nafter = 3\nresult = true\n",
                "roles.x.after: must be a role name",
            ),
            (
                "benchmark = \"fio\"\nready = {}\nresult = true\n",
                "roles.x.ready: give exactly one of",
            ),
            (
                "benchmark = \"fio\"\nready = { port = 70000 }\nresult = true\n",
                "roles.x.ready.port: 70000: a TCP port",
            ),
            (
                "benchmark = \"fio\"\nready = { line = \"up\", timeout_s = 0 }\nresult = true\n",
                "roles.x.ready.timeout_s: 0",
            ),
            (
                "benchmark = \"fio\"\nbogus = 1\nresult = true\n",
                "unknown field `bogus`",
            ),
            ],
            true,
        );
        let e = err("name = \"p\"\n[roles.1x]\nbenchmark = \"fio\"\nresult = true\n");
        assert!(e.contains("roles.1x: \"1x\" is not a role name"), "{e}");
        let e = err(
            "name = \"p\"\n[roles.db]\nbenchmark = \"fio\"\nresult = true\n[roles.DB]\nbenchmark = \"fio\"\n",
        );
        assert!(e.contains("only in case"), "{e}");
        // A file with roles leaves benchmark and probes to them.
        let e = err(&format!(
            "name = \"p\"\nbenchmark = \"fio\"\n{SERVER}{CLIENT}"
        ));
        assert!(
            e.contains("exp.toml: benchmark: with [roles.NAME] tables"),
            "{e}"
        );
        let e = err(&format!("name = \"p\"\nprobes = []\n{SERVER}{CLIENT}"));
        assert!(
            e.contains("exp.toml: probes: with [roles.NAME] tables"),
            "{e}"
        );
        // Without roles, a benchmark is still required.
        let e = err("name = \"p\"\n");
        assert!(e.contains("missing field `benchmark`"), "{e}");
    }

    #[test]
    fn variables_of_roles_name_a_role_and_a_parameter() {
        let base = format!("name = \"v\"\n{SERVER}{CLIENT}");
        for (key, needle) in [
            (
                "roles.nobody.parameters.n",
                "no role \"nobody\" (roles: server, client)",
            ),
            ("roles.client.script", "as \"roles.client.parameters.NAME\""),
            ("roles.client", "as \"roles.client.parameters.NAME\""),
        ] {
            let e = err(&format!(
                "{base}[variables.n]\nkey = \"{key}\"\nvalues = [1]\n"
            ));
            assert!(
                e.contains("variables.n.key") && e.contains(needle),
                "{key}: {e}"
            );
        }
        let e = err(
            "name = \"v\"\nbenchmark = \"fio\"\n[variables.n]\nkey = \"roles.a.parameters.n\"\nvalues = [1]\n",
        );
        assert!(e.contains("the file has no [roles.NAME] tables"), "{e}");
    }

    #[test]
    fn a_roles_filter_is_auto_workload_or_none_and_survives_its_configuration() {
        let s = parse(&format!("name = \"f\"\n{SERVER}{CLIENT}")).expect("valid");
        assert_eq!(
            s.roles.get("server").map(|r| r.filter),
            Some(RoleFilter::Auto)
        );
        let s = parse(&format!(
            "name = \"f\"\n{SERVER}filter = \"none\"\n{CLIENT}filter = \"workload\"\n"
        ))
        .expect("valid");
        assert_eq!(
            s.roles.get("server").map(|r| r.filter),
            Some(RoleFilter::None)
        );
        assert_eq!(
            s.roles.get("client").map(|r| r.filter),
            Some(RoleFilter::Workload)
        );
        let mut config = toml::Table::new();
        config.insert("roles".into(), s.roles.to_config().into());
        let back = Roles::from_config(&config).expect("roles").expect("valid");
        assert_eq!(back.get("server").map(|r| r.filter), Some(RoleFilter::None));
        assert_eq!(
            back.get("client").map(|r| r.filter),
            Some(RoleFilter::Workload)
        );
        let e = err(&format!(
            "name = \"f\"\n{SERVER}filter = \"cgroup\"\n{CLIENT}"
        ));
        assert!(
            e.starts_with("exp.toml: roles.server.filter: \"cgroup\": \"auto\""),
            "{e}"
        );
        assert!(RoleFilter::Auto.applies(true) && !RoleFilter::Auto.applies(false));
        assert!(RoleFilter::Workload.applies(false) && !RoleFilter::None.applies(true));
    }

    #[test]
    fn more_roles_than_nodes_is_refused() {
        let s = parse(&format!("name = \"n\"\n{SERVER}{CLIENT}")).expect("valid");
        assert!(s.roles.check_nodes("debug", 2).is_ok());
        assert!(s.roles.check_nodes("debug", 8).is_ok());
        let e = s.roles.check_nodes("debug", 1).expect_err("1 node");
        assert_eq!(
            e.to_string(),
            "2 roles (server, client) need 2 nodes, but partition debug has 1; use fewer roles or a larger partition (--partition)"
        );
        assert!(Roles::default().check_nodes("debug", 0).is_ok());
    }

    #[test]
    fn partition_nodes_are_counted_from_sinfo_lines() {
        let text = "kml-n1|debug*\nkml-n2|debug*\nkml-n1|big\nkml-n2|big\nkml-n3|big\nkml-n3|big\n";
        assert_eq!(count_partition_nodes(text, None), ("debug".into(), 2));
        assert_eq!(count_partition_nodes(text, Some("big")), ("big".into(), 3));
        assert_eq!(
            count_partition_nodes(text, Some("debug,big")),
            ("big".into(), 3)
        );
        assert_eq!(
            count_partition_nodes(text, Some("none")),
            ("none".into(), 0)
        );
        assert_eq!(count_partition_nodes("", None), ("(default)".into(), 0));
    }
}
