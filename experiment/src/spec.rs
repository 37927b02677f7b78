//! The experiment file: what to run (benchmark, probes, base
//! configuration), how often (`repeats`, `warmup`), in which order (`seed`,
//! `order`), and the variables swept.
//!
//! ```toml
//! name = "fio_sweep"
//! benchmark = "fio"
//! probes = ["quanta_runtime"]
//! repeats = 2
//!
//! [config.benchmarks.fio]      # base configuration, as in --config FILE
//! runtime = "2s"
//!
//! [variables.bs]               # a list
//! key = "benchmarks.fio.bs"
//! values = ["4k", "64k"]
//!
//! [variables.jobs]             # an integer range, end inclusive
//! key = "benchmarks.fio.numjobs"
//! range = { start = 1, end = 4, step = 1 }
//!
//! [variables.size]             # labels, each for a value
//! key = "benchmarks.fio.size"
//! labels = { small = "16m", large = "256m" }
//! when = { bs = "64k" }        # only in runs where bs is 64k
//! ```
//!
//! Variables combine as a cartesian product in the order they are written.
//! A variable with `when` applies only in runs where each named (earlier)
//! variable has one of the given values (a value, or a list of them; a
//! label table's variable is matched by label); elsewhere it does not
//! multiply the runs and its column is empty.
//!
//! `default = VALUE` on a variable (one of its values; a label for a label
//! table) names the level a user gets without the experiment: the regret
//! of `experiment results --best-by` is measured against it.
//!
//! A variable whose key is `probes` (the key may be left out when the
//! variable is named `probes`) sweeps the probe set instead of a
//! configuration key: each value is a list of probe names, `[]` a baseline
//! without probes, so one experiment measures the collector's own effect
//! (`experiment results` then reports each probed set against the
//! baseline). Its column shows each set by name: `none` for `[]`, the
//! probes joined by `+` otherwise (or the labels of a label table). The
//! file's top-level `probes` is then left out.
//!
//! ```toml
//! [variables.probes]
//! values = [[], ["quanta_runtime"], ["quanta_runtime", "process_trace"]]
//! ```
//!
//! `[build]` (commands run once per node before the first run, cached by
//! a hash of their inputs) is parsed here and carried out by
//! [`crate::build`].

use std::{collections::BTreeMap, path::Path};

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::{
    roles::{RawRole, Roles},
    ExperimentError, Result,
};

/// Runs per variable combination when the file does not say.
pub const DEFAULT_REPEATS: u32 = 3;
/// Most runs an experiment may plan unless its file (`max_runs`) or
/// `--max-runs` says otherwise: a typo in a range should not plan a
/// million runs. Runs are counted before any is built.
pub const MAX_RUNS: usize = 100_000;
/// The highest `max_runs` may be set, and so the most values one variable
/// may have.
pub const MAX_RUNS_CEILING: usize = 10_000_000;
/// Most repeats of one combination.
pub const MAX_REPEATS: u32 = 10_000;
/// Most warm-up runs.
pub const MAX_WARMUP: u32 = 1_000;
/// The key of a variable that sweeps the probe set.
pub const PROBES_KEY: &str = "probes";
/// The column value of the empty probe set (a baseline).
pub const NO_PROBES: &str = "none";
/// Most probe sets one `probes` variable may list, and probes one set may
/// name.
pub const MAX_PROBE_SETS: usize = 256;

/// Column names the results table uses itself; variables may not take them.
pub const RESERVED_COLUMNS: [&str; 14] = [
    "repeat",
    "run_id",
    "combo_id",
    "collection_id",
    "status",
    "run_class",
    "state",
    "exit_code",
    "duration_s",
    "wall_time_s",
    "overall_score",
    "error",
    "benchmark",
    "component",
];
/// Prefixes of the results table's figure columns.
pub const RESERVED_PREFIXES: [&str; 5] = ["result_", "param_", "ru_", "rows_", "lost_"];

/// The order runs are carried out in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// Shuffled with the experiment's seed, so drift over time does not
    /// line up with a variable.
    #[default]
    Shuffled,
    /// Combinations in the order the variables declare them, repeats of
    /// each together.
    Sequential,
}

/// One value a variable takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Level {
    /// The label of a label table (`labels = { small = "16m" }`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The value set at the variable's key.
    pub value: Json,
}

impl Level {
    /// What the results table shows for this level: the label, or the value.
    pub fn column(&self) -> Json {
        match &self.label {
            Some(l) => Json::String(l.clone()),
            None => self.value.clone(),
        }
    }

    /// Whether `wanted` (from a `when` condition) names this level: its
    /// label, or an equal value (numbers compare by value).
    pub fn matches(&self, wanted: &Json) -> bool {
        if let (Some(label), Json::String(w)) = (&self.label, wanted) {
            return label == w;
        }
        json_eq(&self.value, wanted)
    }
}

fn json_eq(a: &Json, b: &Json) -> bool {
    match (a, b) {
        (Json::Number(x), Json::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// `when = { variable = value-or-values }`: one of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Condition {
    pub variable: String,
    pub any_of: Vec<Json>,
}

/// How a variable's values were written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Form {
    Values,
    Range,
    Labels,
}

/// The type of a variable's column in the results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColumnType {
    Int,
    Float,
    Bool,
    String,
}

/// One swept variable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Variable {
    pub name: String,
    /// The configuration key it sets, e.g. `benchmarks.fio.bs`.
    pub key: String,
    pub form: Form,
    pub levels: Vec<Level>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<Condition>,
    /// `default = ...`: the level used when the variable is not set (its
    /// column value: the label, or the value), one of the levels; the
    /// regret of `experiment results --best-by` is this level's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Json>,
}

impl Variable {
    /// The column type of its levels: labels are strings; integers stay
    /// integers; integers and floats are floats; anything mixed or
    /// structured is a string.
    pub fn column_type(&self) -> ColumnType {
        column_type(self.levels.iter().map(Level::column))
    }

    /// The key as path segments.
    pub fn path(&self) -> Vec<&str> {
        self.key.split('.').collect()
    }

    /// Whether the variable sweeps the probe set (key `probes`).
    pub fn is_probes(&self) -> bool {
        self.key == PROBES_KEY
    }

    /// The column value of its empty probe set (the baseline), if it is a
    /// `probes` variable that has one.
    pub fn baseline(&self) -> Option<Json> {
        self.is_probes()
            .then(|| {
                self.levels
                    .iter()
                    .find(|l| l.value.as_array().is_some_and(Vec::is_empty))
                    .map(Level::column)
            })
            .flatten()
    }
}

/// The probe names of a `probes` variable's level value (a list of names).
pub fn probe_set(value: &Json) -> Option<Vec<String>> {
    value
        .as_array()?
        .iter()
        .map(|p| p.as_str().map(str::to_owned))
        .collect()
}

/// How a probe set shows in the results: `none` for the empty set, the
/// names joined by `+` otherwise.
pub fn probe_set_name(probes: &[String]) -> String {
    if probes.is_empty() {
        NO_PROBES.to_owned()
    } else {
        probes.join("+")
    }
}

/// The common type of JSON scalars, as [`Variable::column_type`] says.
pub fn column_type(values: impl IntoIterator<Item = Json>) -> ColumnType {
    let mut t: Option<ColumnType> = None;
    for v in values {
        let this = match &v {
            Json::Null => continue,
            Json::Bool(_) => ColumnType::Bool,
            Json::Number(n) if n.is_i64() => ColumnType::Int,
            Json::Number(_) => ColumnType::Float,
            _ => ColumnType::String,
        };
        t = Some(match (t, this) {
            (None, x) => x,
            (Some(a), b) if a == b => a,
            (Some(ColumnType::Int), ColumnType::Float)
            | (Some(ColumnType::Float), ColumnType::Int) => ColumnType::Float,
            _ => ColumnType::String,
        });
    }
    t.unwrap_or(ColumnType::String)
}

/// A parsed, checked experiment file.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// The file as given, for messages.
    pub file: String,
    /// Its text, copied into the experiment folder.
    pub text: String,
    pub name: String,
    pub benchmark: String,
    /// Probes to run; `None`: the configuration's `collect.plugins`; empty:
    /// a baseline (the benchmark without probes).
    pub probes: Option<Vec<String>>,
    /// Power sources, passed to `kernmlops run --power` (checked against the
    /// installed sources when the plan is made).
    pub power: Option<Vec<String>>,
    /// The base configuration (`[config]`), as a `--config` file would hold.
    pub config: toml::Table,
    pub repeats: u32,
    pub warmup: u32,
    pub seed: Option<u64>,
    pub order: Order,
    pub variables: Vec<Variable>,
    /// Most runs the plan may have (`max_runs`, default [`MAX_RUNS`]).
    pub max_runs: usize,
    /// The block device measured (`[device]`, see [`crate::device`]).
    pub device: Option<crate::device::DeviceSpec>,
    /// `[roles.NAME]` tables (see [`super::roles`]); with roles,
    /// `benchmark` is the result role's.
    pub roles: Roles,
    /// `[build]`: commands run once per node before its first run (see
    /// [`crate::build`]).
    pub build: Option<crate::build::BuildSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    name: String,
    benchmark: Option<String>,
    probes: Option<Vec<String>>,
    power: Option<toml::Value>,
    #[serde(default)]
    config: toml::Table,
    repeats: Option<i64>,
    warmup: Option<i64>,
    seed: Option<i64>,
    order: Option<Order>,
    max_runs: Option<i64>,
    #[serde(default)]
    variables: BTreeMap<String, toml::Spanned<RawVariable>>,
    device: Option<crate::device::DeviceSpec>,
    #[serde(default)]
    roles: BTreeMap<String, toml::Spanned<RawRole>>,
    build: Option<crate::build::BuildSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVariable {
    key: Option<String>,
    values: Option<Vec<toml::Value>>,
    range: Option<RawRange>,
    labels: Option<BTreeMap<String, toml::Spanned<toml::Value>>>,
    when: Option<BTreeMap<String, toml::Value>>,
    default: Option<toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRange {
    start: i64,
    end: i64,
    step: Option<i64>,
}

/// A TOML value as JSON (dates become their text).
pub fn toml_to_json(v: &toml::Value) -> Json {
    match v {
        toml::Value::String(s) => Json::String(s.clone()),
        toml::Value::Integer(i) => Json::from(*i),
        toml::Value::Float(f) => serde_json::Number::from_f64(*f).map_or(Json::Null, Json::Number),
        toml::Value::Boolean(b) => Json::Bool(*b),
        toml::Value::Datetime(d) => Json::String(d.to_string()),
        toml::Value::Array(a) => Json::Array(a.iter().map(toml_to_json).collect()),
        toml::Value::Table(t) => Json::Object(
            t.iter()
                .map(|(k, v)| (k.clone(), toml_to_json(v)))
                .collect(),
        ),
    }
}

/// A JSON value as TOML; `None` for null, which TOML cannot hold.
pub fn json_to_toml(v: &Json) -> Option<toml::Value> {
    Some(match v {
        Json::Null => return None,
        Json::Bool(b) => toml::Value::Boolean(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => toml::Value::Integer(i),
            None => toml::Value::Float(n.as_f64()?),
        },
        Json::String(s) => toml::Value::String(s.clone()),
        Json::Array(a) => toml::Value::Array(a.iter().filter_map(json_to_toml).collect()),
        Json::Object(m) => toml::Value::Table(
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), json_to_toml(v)?)))
                .collect(),
        ),
    })
}

/// One line of a TOML error: `line N: message (at `text`)`.
fn toml_message(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim().replace('\n', " ");
    match e.span() {
        Some(span) => {
            let line_no = text[..span.start.min(text.len())].matches('\n').count() + 1;
            let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
            format!("line {line_no}: {message} (at `{line}`)")
        }
        None => message,
    }
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Spec {
    /// Reads and checks an experiment file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(ExperimentError::io(path))?;
        Self::parse(&path.display().to_string(), &text)
    }

    /// Parses and checks experiment-file text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Self> {
        let raw: RawSpec = toml::from_str(text).map_err(|e| ExperimentError::Parse {
            file: file.to_owned(),
            message: toml_message(text, &e),
        })?;
        let invalid = Invalid(file);
        check_experiment_name(&invalid, &raw.name)?;
        // Roles in the order the file declares them.
        let mut declared_roles: Vec<(String, toml::Spanned<RawRole>)> =
            raw.roles.into_iter().collect();
        declared_roles.sort_by_key(|(_, r)| r.span().start);
        let roles = Roles::from_raw(
            declared_roles
                .into_iter()
                .map(|(n, r)| (n, r.into_inner()))
                .collect(),
            raw.benchmark.as_deref(),
            raw.probes.as_ref(),
        )
        .map_err(|(key, message)| invalid.at(&key, message))?;
        let benchmark = workload(&invalid, raw.benchmark, &roles)?;
        let repeats = invalid.count(
            "repeats",
            raw.repeats,
            DEFAULT_REPEATS.into(),
            1,
            MAX_REPEATS.into(),
        )? as u32;
        let warmup = invalid.count("warmup", raw.warmup, 0, 0, MAX_WARMUP.into())? as u32;
        let max_runs = invalid.count(
            "max_runs",
            raw.max_runs,
            MAX_RUNS as u64,
            1,
            MAX_RUNS_CEILING as u64,
        )? as usize;
        let seed = match raw.seed {
            None => None,
            Some(s) if s >= 0 => Some(s as u64),
            Some(s) => return Err(invalid.at("seed", format!("{s}: must not be negative"))),
        };
        let power = power_names(&invalid, raw.power)?;
        if let Some(p) = raw.probes.iter().flatten().find(|p| p.is_empty()) {
            return Err(invalid.at("probes", format!("{p:?}: an empty probe name")));
        }
        let variables = variables(&invalid, raw.variables, &benchmark, &roles)?;
        check_sections(
            &invalid,
            &variables,
            &roles,
            raw.probes.is_some(),
            raw.device.as_ref(),
            raw.build.as_ref(),
        )?;
        Ok(Self {
            file: file.to_owned(),
            text: text.to_owned(),
            name: raw.name,
            benchmark,
            probes: raw.probes,
            power,
            config: raw.config,
            repeats,
            warmup,
            seed,
            order: raw.order.unwrap_or_default(),
            variables,
            max_runs,
            device: raw.device,
            roles,
            build: raw.build,
        })
    }
}

/// Errors about the experiment file named by the wrapped text.
struct Invalid<'a>(&'a str);

impl Invalid<'_> {
    /// The file's `key` is invalid.
    fn at(&self, key: &str, message: String) -> ExperimentError {
        ExperimentError::Invalid {
            file: self.0.to_owned(),
            key: key.to_owned(),
            message,
        }
    }

    /// A check's `(key under prefix, message)` failure, the key empty for
    /// the prefix itself.
    fn under(&self, prefix: &str, (key, message): (String, String)) -> ExperimentError {
        self.at(
            &if key.is_empty() {
                prefix.to_owned()
            } else {
                format!("{prefix}.{key}")
            },
            message,
        )
    }

    /// A count the file may give (`default` if not), within `min..=max`.
    fn count(&self, key: &str, v: Option<i64>, default: u64, min: i64, max: u64) -> Result<u64> {
        match v {
            None => Ok(default),
            Some(n) if n < min => Err(self.at(key, format!("{n}: must be at least {min}"))),
            Some(n) if n as u64 > max => Err(self.at(key, format!("{n}: at most {max}"))),
            Some(n) => Ok(n as u64),
        }
    }
}

/// The experiment's name names its folder.
fn check_experiment_name(invalid: &Invalid, name: &str) -> Result<()> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        || name.starts_with('.')
    {
        return Err(invalid.at(
            "name",
            format!(
                "{name:?}: use letters, digits, '_', '-' and '.' (it names the experiment's folder)"
            ),
        ));
    }
    Ok(())
}

/// The workload benchmark: the result role's with roles, else the file's
/// `benchmark`.
fn workload(invalid: &Invalid, benchmark: Option<String>, roles: &Roles) -> Result<String> {
    match (benchmark, roles.result()) {
        (_, Some(role)) => Ok(role.benchmark.clone()),
        (Some(b), None) if !b.is_empty() => Ok(b),
        (Some(_), None) => Err(invalid.at(
            "benchmark",
            "empty: name the workload benchmark (see `kernmlops plugins`)".into(),
        )),
        (None, None) => Err(invalid.at(
            "benchmark",
            "missing field `benchmark`: name the workload benchmark (see `kernmlops plugins`), or give [roles.NAME] tables".into(),
        )),
    }
}

/// `power`: a name or a list of names.
fn power_names(invalid: &Invalid, power: Option<toml::Value>) -> Result<Option<Vec<String>>> {
    let not_names = || invalid.at("power", "must be a name or a list of names".into());
    match power {
        None => Ok(None),
        Some(toml::Value::String(s)) => Ok(Some(vec![s])),
        Some(toml::Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .map(Some)
            .ok_or_else(not_names),
        Some(_) => Err(not_names()),
    }
}

/// The variables in the order the file declares them, each checked against
/// those before it and the roles; one at most sweeps the probes.
fn variables(
    invalid: &Invalid,
    raw: BTreeMap<String, toml::Spanned<RawVariable>>,
    benchmark: &str,
    roles: &Roles,
) -> Result<Vec<Variable>> {
    let mut declared: Vec<(String, toml::Spanned<RawVariable>)> = raw.into_iter().collect();
    declared.sort_by_key(|(_, v)| v.span().start);
    let mut variables: Vec<Variable> = Vec::new();
    for (name, raw_var) in declared {
        let at = format!("variables.{name}");
        let var = variable(&name, raw_var.into_inner(), benchmark, &variables)
            .map_err(|e| invalid.under(&at, e))?;
        roles
            .check_key(&var.key)
            .map_err(|message| invalid.at(&format!("{at}.key"), message.to_string()))?;
        variables.push(var);
    }
    let swept: Vec<&Variable> = variables.iter().filter(|v| v.is_probes()).collect();
    if let [first, second, ..] = swept.as_slice() {
        return Err(invalid.at(
            &format!("variables.{}", second.name),
            format!(
                "variable {} already sweeps the probes: one variable with key \"probes\" per experiment",
                first.name
            ),
        ));
    }
    Ok(variables)
}

/// `[device]` and `[build]`, and what may not go together: a probes
/// variable with top-level probes or with roles, a device with roles.
fn check_sections(
    invalid: &Invalid,
    variables: &[Variable],
    roles: &Roles,
    has_probes: bool,
    device: Option<&crate::device::DeviceSpec>,
    build: Option<&crate::build::BuildSpec>,
) -> Result<()> {
    if let Some(d) = device {
        d.check().map_err(|e| invalid.under("device", e))?;
    }
    if let Some(b) = build {
        b.check().map_err(|e| invalid.under("build", e))?;
    }
    let swept = variables.iter().find(|v| v.is_probes());
    if let (Some(v), true) = (swept, has_probes) {
        return Err(invalid.at(
            "probes",
            format!(
                "variable {} sweeps the probes: leave out the top-level probes list",
                v.name
            ),
        ));
    }
    if !roles.is_empty() {
        if let Some(v) = swept {
            return Err(invalid.at(
                &format!("variables.{}", v.name),
                "a probes variable with roles: set each role's probes instead".into(),
            ));
        }
        if device.is_some() {
            return Err(invalid.at(
                "device",
                "a [device] with roles is not supported yet: name the device in a role's configuration"
                    .into(),
            ));
        }
    }
    Ok(())
}

/// A variable's levels as a set, so that whether a `when` value names one
/// is one look-up ([`Level::matches`] for every level, in linear time).
pub struct LevelKeys {
    labels: std::collections::HashSet<String>,
    values: std::collections::HashSet<String>,
}

impl LevelKeys {
    pub fn of(levels: &[Level]) -> Self {
        let mut keys = Self {
            labels: Default::default(),
            values: Default::default(),
        };
        for l in levels {
            if let Some(label) = &l.label {
                keys.labels.insert(label.clone());
            }
            keys.values.insert(value_key(&l.value));
        }
        keys
    }

    /// Whether `wanted` names one of the levels, as [`Level::matches`]
    /// says for each: a string names a labelled level by its label, any
    /// other value a level by an equal value (numbers by value).
    pub fn matches(&self, wanted: &Json) -> bool {
        if let Json::String(w) = wanted {
            if !self.labels.is_empty() {
                return self.labels.contains(w);
            }
        }
        self.values.contains(&value_key(wanted))
    }
}

/// A value's identity for [`LevelKeys`]: numbers by their `f64` value (as
/// [`json_eq`] compares them), anything else by its canonical JSON.
fn value_key(v: &Json) -> String {
    match v {
        Json::Number(n) => format!("n{}", n.as_f64().unwrap_or(f64::NAN)),
        other => format!("j{}", super::plan::canonical_json(other)),
    }
}

/// A check's outcome under a variable: `(key under the variable, message)`
/// on failure.
type Keyed<T> = std::result::Result<T, (String, String)>;

/// The failure of a check under a variable's `key`.
fn keyed<T>(key: &str, message: String) -> Keyed<T> {
    Err((key.to_owned(), message))
}

/// Checks one variable against those declared before it. Errors are
/// `(key under the variable, message)`.
fn variable(
    name: &str,
    raw: RawVariable,
    benchmark: &str,
    earlier: &[Variable],
) -> Keyed<Variable> {
    check_variable_name(name)?;
    let key = variable_key(name, raw.key, benchmark)?;
    let (form, levels) = variable_levels(raw.values, raw.range, raw.labels)?;
    if levels.is_empty() {
        return keyed("", "has no values".into());
    }
    let levels = if key == PROBES_KEY {
        probe_levels(form, levels)?
    } else {
        levels
    };
    check_distinct(&levels)?;
    let when = conditions(name, raw.when.unwrap_or_default(), earlier)?;
    let default = default_level(raw.default, &levels)?;
    Ok(Variable {
        name: name.to_owned(),
        key,
        form,
        levels,
        when,
        default,
    })
}

/// A variable's name becomes a results column: an identifier the table
/// does not use itself.
fn check_variable_name(name: &str) -> Keyed<()> {
    if !is_identifier(name) {
        return keyed(
            "",
            format!("{name:?} is not a column name: use letters, digits and '_'"),
        );
    }
    if RESERVED_COLUMNS.contains(&name) || RESERVED_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return keyed(
            "",
            format!(
                "{name:?} is a name the results table uses itself ({}, or a name starting with {}); rename the variable",
                RESERVED_COLUMNS.join(", "),
                RESERVED_PREFIXES.join(", ")
            ),
        );
    }
    Ok(())
}

/// The configuration key a variable sets: as written, or implied by its
/// name (`probes`) or the benchmark (`script`'s parameters).
fn variable_key(name: &str, key: Option<String>, benchmark: &str) -> Keyed<String> {
    let key = match key {
        Some(k) => k,
        None if name == PROBES_KEY => PROBES_KEY.to_owned(),
        None if benchmark == "script" => format!("benchmarks.script.parameters.{name}"),
        None => {
            return keyed(
                "key",
                format!("missing: the configuration key this variable sets, e.g. key = \"benchmarks.{benchmark}.<setting>\" (see `kernmlops config defaults`)"),
            )
        }
    };
    if key.split('.').any(|s| {
        s.is_empty()
            || !s
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }) {
        return keyed(
            "key",
            format!("{key:?} is not a dotted key such as \"benchmarks.fio.bs\""),
        );
    }
    if key.split('.').count() < 2 && key != PROBES_KEY {
        return keyed(
            "key",
            format!(
                "{key:?} names a whole section: give one setting, such as \"benchmarks.fio.bs\""
            ),
        );
    }
    Ok(key)
}

/// A TOML value as a configuration value: anything but a date.
fn no_dates(v: &toml::Value, at: &str) -> Keyed<Json> {
    if let toml::Value::Datetime(_) = v {
        return keyed(at, "dates are not configuration values".into());
    }
    Ok(toml_to_json(v))
}

/// A variable's levels from the one form it is given in.
fn variable_levels(
    values: Option<Vec<toml::Value>>,
    range: Option<RawRange>,
    labels: Option<BTreeMap<String, toml::Spanned<toml::Value>>>,
) -> Keyed<(Form, Vec<Level>)> {
    let forms = [values.is_some(), range.is_some(), labels.is_some()];
    if forms.iter().filter(|f| **f).count() != 1 {
        return keyed(
            "",
            "give exactly one of values = [...], range = { start, end, step } or labels = { label = value, ... }".into(),
        );
    }
    if let Some(values) = values {
        value_levels(values)
    } else if let Some(r) = range {
        range_levels(r)
    } else {
        label_levels(labels.unwrap_or_default())
    }
}

/// The levels of `values = [...]`.
fn value_levels(values: Vec<toml::Value>) -> Keyed<(Form, Vec<Level>)> {
    if values.len() > MAX_RUNS_CEILING {
        return keyed(
            "values",
            format!(
                "{} values: more than {MAX_RUNS_CEILING}, the most a plan may have",
                values.len()
            ),
        );
    }
    let levels = values
        .iter()
        .map(|v| no_dates(v, "values").map(|value| Level { label: None, value }))
        .collect::<Keyed<Vec<_>>>()?;
    Ok((Form::Values, levels))
}

/// The levels of `range = { start, end, step }`, end inclusive.
fn range_levels(r: RawRange) -> Keyed<(Form, Vec<Level>)> {
    let step = r.step.unwrap_or(if r.end < r.start { -1 } else { 1 });
    if step == 0 {
        return keyed("range.step", "must not be 0".into());
    }
    if (i128::from(r.end) - i128::from(r.start)).signum() * i128::from(step.signum()) < 0 {
        return keyed(
            "range",
            format!(
                "from {} by {step} never reaches {} (the end is inclusive; use a {} step)",
                r.start,
                r.end,
                if step > 0 { "negative" } else { "positive" }
            ),
        );
    }
    // Counted in 128 bits before anything is built: the end minus the
    // start of two 64-bit integers can overflow 64.
    let n = (i128::from(r.end) - i128::from(r.start)) / i128::from(step) + 1;
    if n > MAX_RUNS_CEILING as i128 {
        return keyed(
            "range",
            format!("{n} values: more than {MAX_RUNS_CEILING}, the most a plan may have"),
        );
    }
    let levels = (0..n as i64)
        .map(|i| Level {
            label: None,
            value: Json::from(r.start + i * step),
        })
        .collect();
    Ok((Form::Range, levels))
}

/// The levels of `labels = { label = value, ... }`, in the order written.
fn label_levels(labels: BTreeMap<String, toml::Spanned<toml::Value>>) -> Keyed<(Form, Vec<Level>)> {
    let mut labels: Vec<(String, toml::Spanned<toml::Value>)> = labels.into_iter().collect();
    labels.sort_by_key(|(_, v)| v.span().start);
    let levels = labels
        .into_iter()
        .map(|(label, v)| {
            no_dates(v.get_ref(), &format!("labels.{label}")).map(|value| Level {
                label: Some(label),
                value,
            })
        })
        .collect::<Keyed<Vec<_>>>()?;
    Ok((Form::Labels, levels))
}

/// No column value twice. Duplicates through a set of each column's
/// canonical text: linear.
fn check_distinct(levels: &[Level]) -> Keyed<()> {
    let mut seen = std::collections::HashSet::with_capacity(levels.len());
    for l in levels {
        let column = l.column();
        if !seen.insert(super::plan::canonical_json(&column)) {
            return keyed("", format!("the value {column} is listed twice"));
        }
    }
    Ok(())
}

/// The `when` table: each named variable declared earlier, each wanted
/// value one of its levels.
fn conditions(
    name: &str,
    when: BTreeMap<String, toml::Value>,
    earlier: &[Variable],
) -> Keyed<Vec<Condition>> {
    let mut conditions = Vec::new();
    for (other, wanted) in when {
        let at = format!("when.{other}");
        let Some(target) = earlier.iter().find(|v| v.name == other) else {
            return keyed(
                &at,
                if other == name {
                    "a variable cannot depend on itself".into()
                } else {
                    format!(
                        "no variable {other:?} is declared before this one (declared: {})",
                        earlier
                            .iter()
                            .map(|v| v.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                },
            );
        };
        let any_of: Vec<Json> = match wanted {
            toml::Value::Array(a) => a.iter().map(toml_to_json).collect(),
            v => vec![toml_to_json(&v)],
        };
        if any_of.is_empty() {
            return keyed(&at, "an empty list never applies".into());
        }
        let target_keys = LevelKeys::of(&target.levels);
        for w in &any_of {
            if !target_keys.matches(w) {
                return keyed(
                    &at,
                    format!(
                        "{w} is not a value of variable {other} ({}), so this never applies",
                        columns(&target.levels)
                    ),
                );
            }
        }
        conditions.push(Condition {
            variable: other,
            any_of,
        });
    }
    Ok(conditions)
}

/// The level `default = VALUE` names, as its column value.
fn default_level(default: Option<toml::Value>, levels: &[Level]) -> Keyed<Option<Json>> {
    let Some(d) = default else {
        return Ok(None);
    };
    let wanted = no_dates(&d, "default")?;
    match levels.iter().find(|l| l.matches(&wanted)) {
        Some(l) => Ok(Some(l.column())),
        None => keyed(
            "default",
            format!(
                "{wanted} is not one of the variable's values ({})",
                columns(levels)
            ),
        ),
    }
}

/// Levels' column values, listed for an error.
fn columns(levels: &[Level]) -> String {
    levels
        .iter()
        .map(|l| l.column().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks a `probes` variable's levels (lists of distinct probe names, not
/// a range) and names each set of a plain list (`none`, `a+b`).
fn probe_levels(form: Form, levels: Vec<Level>) -> Keyed<Vec<Level>> {
    let at = match form {
        Form::Range => return Err((
            "range".into(),
            "the probes are lists of probe names: give values = [[], [\"quanta_runtime\"], ...]"
                .into(),
        )),
        Form::Values => "values",
        Form::Labels => "labels",
    };
    if levels.len() > MAX_PROBE_SETS {
        return Err((
            at.into(),
            format!("{} probe sets: at most {MAX_PROBE_SETS}", levels.len()),
        ));
    }
    levels
        .into_iter()
        .map(|l| {
            let Some(set) = probe_set(&l.value) else {
                return Err((
                    at.into(),
                    format!(
                        "{}: each value is a list of probe names, [] for none (a baseline)",
                        l.value
                    ),
                ));
            };
            let mut seen = std::collections::HashSet::new();
            if set.len() > MAX_PROBE_SETS {
                return Err((
                    at.into(),
                    format!("{} probes in one set: at most {MAX_PROBE_SETS}", set.len()),
                ));
            }
            for p in &set {
                if p.is_empty() || !seen.insert(p.as_str()) {
                    return Err((
                        at.into(),
                        format!("{}: an empty or repeated probe name", l.value),
                    ));
                }
            }
            let label = match (form, l.label) {
                (Form::Labels, Some(label)) => label,
                _ => probe_set_name(&set),
            };
            Ok(Level {
                label: Some(label),
                value: l.value,
            })
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Spec> {
        Spec::parse("exp.toml", text)
    }

    /// Parses `head` followed by each case's body as `exp.toml` and checks
    /// that it is refused with an error containing the case's needle (and,
    /// with `one_line`, an error of one line).
    pub(crate) fn assert_parse_errors(head: &str, cases: &[(&str, &str)], one_line: bool) {
        for (body, needle) in cases {
            let text = format!("{head}{body}");
            let e = parse(&text).expect_err(&text).to_string();
            assert!(e.contains(needle), "{body:?}: {e}");
            if one_line {
                assert!(!e.contains('\n'), "one line: {e}");
            }
        }
    }

    fn err(text: &str) -> String {
        parse(text).expect_err(text).to_string()
    }

    const HEAD: &str = "name = \"t\"\nbenchmark = \"fio\"\n";

    #[test]
    fn defaults_and_declared_order() {
        let s = parse(&format!(
            "{HEAD}[variables.zz]\nkey = \"benchmarks.fio.bs\"\nvalues = [\"4k\", \"64k\"]\n\
             [variables.aa]\nkey = \"benchmarks.fio.numjobs\"\nrange = {{ start = 1, end = 3 }}\n"
        ))
        .expect("valid");
        assert_eq!(s.repeats, DEFAULT_REPEATS);
        assert_eq!((s.warmup, s.seed, s.order), (0, None, Order::Shuffled));
        assert_eq!(s.probes, None);
        let names: Vec<&str> = s.variables.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["zz", "aa"], "declared order, not sorted");
        assert_eq!(s.variables[0].column_type(), ColumnType::String);
        assert_eq!(s.variables[1].column_type(), ColumnType::Int);
    }

    #[test]
    fn ranges_include_their_end() {
        let levels = |r: &str| -> Vec<Json> {
            let s = parse(&format!(
                "{HEAD}[variables.n]\nkey = \"benchmarks.fio.numjobs\"\nrange = {r}\n"
            ))
            .expect(r);
            s.variables[0]
                .levels
                .iter()
                .map(|l| l.value.clone())
                .collect()
        };
        assert_eq!(
            levels("{ start = 1, end = 4 }"),
            [1, 2, 3, 4].map(Json::from)
        );
        assert_eq!(
            levels("{ start = 1, end = 8, step = 3 }"),
            [1, 4, 7].map(Json::from)
        );
        assert_eq!(
            levels("{ start = 0, end = 8, step = 4 }"),
            [0, 4, 8].map(Json::from)
        );
        assert_eq!(levels("{ start = 3, end = 1 }"), [3, 2, 1].map(Json::from));
        assert_eq!(levels("{ start = 5, end = 5 }"), [5].map(Json::from));
        for (r, needle) in [
            (
                "{ start = 1, end = 4, step = 0 }",
                "range.step: must not be 0",
            ),
            ("{ start = 1, end = 4, step = -1 }", "never reaches 4"),
            ("{ start = 0, end = 1000000000 }", "more than"),
            ("{ start = 1 }", "missing field `end`"),
        ] {
            let e = err(&format!(
                "{HEAD}[variables.n]\nkey = \"benchmarks.fio.numjobs\"\nrange = {r}\n"
            ));
            assert!(e.contains(needle) && e.starts_with("exp.toml"), "{r}: {e}");
        }
    }

    #[test]
    fn long_lists_and_extreme_ranges_are_checked_in_linear_time() {
        // 150,000 values, one listed twice at the end: found at once.
        let mut values: Vec<String> = (0..150_000).map(|i| i.to_string()).collect();
        values.push("7".into());
        let started = std::time::Instant::now();
        let e = err(&format!(
            "{HEAD}[variables.n]\nkey = \"benchmarks.fio.numjobs\"\nvalues = [{}]\n",
            values.join(",")
        ));
        assert!(e.contains("the value 7 is listed twice"), "{e}");
        // A bound on a quadratic check (minutes before), not a timing claim.
        assert!(started.elapsed().as_secs() < 30);
        // The whole range of i64: no overflow, refused by its size.
        let e = err(&format!(
            "{HEAD}[variables.n]\nkey = \"benchmarks.fio.numjobs\"\nrange = {{ start = {}, end = {} }}\n",
            i64::MIN,
            i64::MAX
        ));
        assert!(e.contains("values: more than"), "{e}");
        assert_parse_errors(
            HEAD,
            &[
                ("repeats = 10001\n", "repeats: 10001: at most 10000"),
                ("warmup = 1001\n", "warmup: 1001: at most 1000"),
                ("max_runs = 0\n", "max_runs: 0: must be at least 1"),
                (
                    "max_runs = 10000001\n",
                    "max_runs: 10000001: at most 10000000",
                ),
            ],
            false,
        );
        assert_eq!(
            parse(&format!("{HEAD}max_runs = 5\n"))
                .expect("valid")
                .max_runs,
            5
        );
    }

    #[test]
    fn labels_keep_their_order_and_show_as_labels() {
        let s = parse(&format!(
            "{HEAD}[variables.size]\nkey = \"benchmarks.fio.size\"\nlabels = {{ small = \"16m\", large = \"1g\", medium = \"64m\" }}\n"
        ))
        .expect("valid");
        let v = &s.variables[0];
        let labels: Vec<Json> = v.levels.iter().map(Level::column).collect();
        assert_eq!(labels, ["small", "large", "medium"].map(Json::from));
        assert_eq!(v.levels[1].value, "1g");
        assert_eq!(v.form, Form::Labels);
    }

    #[test]
    fn script_variables_default_to_script_parameters() {
        let s =
            parse("name = \"s\"\nbenchmark = \"script\"\n[variables.threads]\nvalues = [1, 2]\n")
                .expect("valid");
        assert_eq!(s.variables[0].key, "benchmarks.script.parameters.threads");
    }

    #[test]
    fn conditions_name_earlier_variables_and_their_values() {
        let base = format!(
            "{HEAD}[variables.variant]\nkey = \"benchmarks.fio.rw\"\nvalues = [\"read\", \"randread\"]\n"
        );
        let s = parse(&format!(
            "{base}[variables.jobs]\nkey = \"benchmarks.fio.numjobs\"\nvalues = [1, 2]\nwhen = {{ variant = \"randread\" }}\n"
        ))
        .expect("valid");
        assert_eq!(
            s.variables[1].when,
            [Condition {
                variable: "variant".into(),
                any_of: vec![Json::from("randread")]
            }]
        );
        for (when, needle) in [
            (
                "{ variant = \"write\" }",
                "variables.jobs.when.variant: \"write\" is not a value of variable variant",
            ),
            (
                "{ later = 1 }",
                "no variable \"later\" is declared before this one",
            ),
            ("{ jobs = 1 }", "cannot depend on itself"),
            ("{ variant = [] }", "an empty list never applies"),
        ] {
            let e = err(&format!(
                "{base}[variables.jobs]\nkey = \"benchmarks.fio.numjobs\"\nvalues = [1, 2]\nwhen = {when}\n"
            ));
            assert!(e.contains(needle), "{when}: {e}");
        }
    }

    #[test]
    fn bad_input_names_the_file_and_key() {
        assert_parse_errors(
            "",
            &[
            ("name = \"t\"\n", "missing field `benchmark`"),
            (
                &format!("{HEAD}repeat = 2\n"),
                "exp.toml: line 3: unknown field `repeat`",
            ),
            (&format!("{HEAD}repeats = 0\n"), "exp.toml: repeats: 0: must be at least 1"),
            (&format!("{HEAD}seed = -1\n"), "seed: -1: must not be negative"),
            (&format!("{HEAD}order = \"random\"\n"), "unknown variant `random`"),
            ("name = \"a b\"\nbenchmark = \"fio\"\n", "exp.toml: name:"),
            (
                &format!("{HEAD}[variables.bs]\nvalues = [\"4k\"]\n"),
                "variables.bs.key: missing",
            ),
            (
                &format!("{HEAD}[variables.bs]\nkey = \"benchmarks..bs\"\nvalues = [1]\n"),
                "variables.bs.key: \"benchmarks..bs\" is not a dotted key",
            ),
            (
                &format!("{HEAD}[variables.bs]\nkey = \"benchmarks\"\nvalues = [1]\n"),
                "names a whole section",
            ),
            (
                &format!("{HEAD}[variables.bs]\nkey = \"benchmarks.fio.bs\"\n"),
                "variables.bs: give exactly one of",
            ),
            (
                &format!("{HEAD}[variables.bs]\nkey = \"benchmarks.fio.bs\"\nvalues = []\n"),
                "variables.bs: has no values",
            ),
            (
                &format!("{HEAD}[variables.bs]\nkey = \"benchmarks.fio.bs\"\nvalues = [\"4k\", \"4k\"]\n"),
                "listed twice",
            ),
            (
                &format!("{HEAD}[variables.repeat]\nkey = \"benchmarks.fio.bs\"\nvalues = [1]\n"),
                "variables.repeat: \"repeat\" is a name the results table uses itself",
            ),
            (
                &format!("{HEAD}[variables.result_x]\nkey = \"benchmarks.fio.bs\"\nvalues = [1]\n"),
                "rename the variable",
            ),
            (
                &format!("{HEAD}[variables.bs]\nkey = \"benchmarks.fio.bs\"\nvalues = [1]\nbogus = 2\n"),
                "unknown field `bogus`",
            ),
            ],
            true,
        );
    }

    #[test]
    fn column_types_follow_the_values() {
        use ColumnType::*;
        let t = |vals: &[Json]| column_type(vals.iter().cloned());
        assert_eq!(t(&[Json::from(1), Json::from(2)]), Int);
        assert_eq!(t(&[Json::from(1), Json::from(2.5)]), Float);
        assert_eq!(t(&[Json::from(true)]), Bool);
        assert_eq!(t(&[Json::from(1), Json::from("x")]), String);
        assert_eq!(t(&[Json::from(true), Json::from(1)]), String);
        assert_eq!(t(&[Json::Null, Json::from(3)]), Int, "nulls do not count");
    }

    #[test]
    fn toml_and_json_convert_both_ways() {
        let t: toml::Table =
            toml::from_str("a = 1\nb = 2.5\nc = \"x\"\nd = [true]\n[e]\nf = 1\n").expect("toml");
        let j = toml_to_json(&toml::Value::Table(t.clone()));
        assert_eq!(json_to_toml(&j), Some(toml::Value::Table(t)));
        assert_eq!(json_to_toml(&Json::Null), None);
    }

    #[test]
    fn a_default_must_be_one_of_the_values() {
        let s = parse(&format!(
            "{HEAD}[variables.bs]\nkey = \"benchmarks.fio.bs\"\nvalues = [\"4k\", \"64k\"]\ndefault = \"64k\"\n\
             [variables.size]\nkey = \"benchmarks.fio.size\"\nlabels = {{ small = \"16m\", large = \"1g\" }}\ndefault = \"small\"\n\
             [variables.n]\nkey = \"benchmarks.fio.numjobs\"\nrange = {{ start = 1, end = 3 }}\ndefault = 2\n"
        ))
        .expect("valid");
        let defaults: Vec<Option<Json>> = s.variables.iter().map(|v| v.default.clone()).collect();
        assert_eq!(
            defaults,
            [
                Some(Json::from("64k")),
                Some(Json::from("small")),
                Some(Json::from(2))
            ]
        );
        let e = err(&format!(
            "{HEAD}[variables.bs]\nkey = \"benchmarks.fio.bs\"\nvalues = [\"4k\"]\ndefault = \"8k\"\n"
        ));
        assert!(
            e.contains("variables.bs.default") && e.contains("\"8k\" is not one of"),
            "{e}"
        );
    }

    #[test]
    fn a_probes_variable_sweeps_probe_sets() {
        let s = parse(&format!(
            "{HEAD}[variables.probes]\nvalues = [[], [\"quanta_runtime\"], [\"a\", \"b\"]]\ndefault = []\n"
        ))
        .expect("valid");
        let v = &s.variables[0];
        assert!(v.is_probes());
        let columns: Vec<Json> = v.levels.iter().map(Level::column).collect();
        assert_eq!(columns, ["none", "quanta_runtime", "a+b"].map(Json::from));
        assert_eq!(v.baseline(), Some(Json::from("none")));
        assert_eq!(v.default, Some(Json::from("none")));
        assert_eq!(v.column_type(), ColumnType::String);
        // A label table keeps its labels; no empty set, no baseline.
        let s = parse(&format!(
            "{HEAD}[variables.set]\nkey = \"probes\"\nlabels = {{ light = [\"a\"], heavy = [\"a\", \"b\"] }}\n"
        ))
        .expect("valid");
        assert_eq!(s.variables[0].levels[1].column(), Json::from("heavy"));
        assert_eq!(s.variables[0].baseline(), None);
        assert_parse_errors(
            HEAD,
            &[
            (
                "[variables.probes]\nvalues = [\"quanta_runtime\"]\n",
                "variables.probes.values: \"quanta_runtime\": each value is a list of probe names",
            ),
            (
                "[variables.probes]\nrange = { start = 1, end = 2 }\n",
                "variables.probes.range: the probes are lists of probe names",
            ),
            (
                "[variables.probes]\nvalues = [[\"a\", \"a\"]]\n",
                "an empty or repeated probe name",
            ),
            (
                "[variables.probes]\nvalues = [[], []]\n",
                "the value \"none\" is listed twice",
            ),
            (
                "[variables.probes]\nvalues = [[]]\n[variables.more]\nkey = \"probes\"\nvalues = [[\"a\"]]\n",
                "variables.more: variable probes already sweeps the probes",
            ),
            (
                "probes = [\"a\"]\n[variables.probes]\nvalues = [[]]\n",
                "exp.toml: probes: variable probes sweeps the probes: leave out the top-level probes list",
            ),
            ],
            false,
        );
    }

    #[test]
    fn a_device_section_is_checked() {
        let s = parse(&format!("{HEAD}[device]\nloop_size = \"64m\"\n")).expect("valid");
        assert_eq!(s.device.and_then(|d| d.loop_size), Some("64m".to_owned()));
        assert_parse_errors(
            HEAD,
            &[
                (
                    "[device]\nloop_size = \"1k\"\n",
                    "exp.toml: device.loop_size: \"1k\": give a size",
                ),
                ("[device]\n", "exp.toml: device: give loop_size"),
                (
                    "[device]\nname = \"sdb\"\n",
                    "device.directory: missing or not absolute",
                ),
                (
                    "[device]\nname = \"../sda\"\ndirectory = \"/mnt\"\n",
                    "device.name: \"../sda\"",
                ),
                (
                    "[device]\nloop_size = \"64m\"\nbogus = 1\n",
                    "unknown field `bogus`",
                ),
            ],
            true,
        );
    }
}
