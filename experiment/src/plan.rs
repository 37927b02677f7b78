//! From variables to runs: the cartesian product (conditional variables
//! multiply only the runs they apply to), each combination's merged
//! configuration, repeats, the seeded order, and the run ids.
//!
//! A run's id is the first 12 hex digits of the SHA-256 of the canonical
//! JSON (keys sorted, no spaces) of `{benchmark, probes, power, config,
//! repeat, seed}`, where `config` is the run's merged configuration (the
//! experiment's base configuration with the variables' values set). Any
//! change to what a run would do changes its id, so a resumed experiment
//! never reuses a stale result; nothing else (the variables' names, the
//! order, other runs) enters it. A combination's id is the same hash
//! without `repeat` and `seed`.
//!
//! A `probes` variable sets a run's probes, not a configuration key: the
//! run's `probes` and the `probes` its ids cover are that level's set.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

use super::{
    rng,
    spec::{toml_to_json, Level, Order, Variable, MAX_RUNS_CEILING},
    ExperimentError, Result,
};

/// Hex digits kept of a run or combination hash (48 bits).
pub const ID_HEX_DIGITS: usize = 12;

/// What every run of an experiment shares and its id covers besides its
/// configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub benchmark: String,
    /// The probes run; empty for a baseline.
    pub probes: Vec<String>,
    /// Power sources, when the experiment names any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<Vec<String>>,
}

impl Identity {
    /// This identity with the probes of `run` (a `probes` variable's level).
    pub fn of_run(&self, probes: Option<&Vec<String>>) -> Self {
        match probes {
            Some(p) => Self {
                probes: p.clone(),
                ..self.clone()
            },
            None => self.clone(),
        }
    }

    fn value(&self, config: &Json) -> Json {
        let mut m = serde_json::Map::new();
        m.insert("benchmark".into(), Json::from(self.benchmark.clone()));
        m.insert("probes".into(), Json::from(self.probes.clone()));
        if let Some(p) = &self.power {
            m.insert("power".into(), Json::from(p.clone()));
        }
        m.insert("config".into(), config.clone());
        Json::Object(m)
    }

    /// The id of a combination: its configuration, benchmark and probes.
    pub fn combo_id(&self, config: &Json) -> String {
        short_hash(&canonical_json(&self.value(config)))
    }

    /// The id of one run: the combination's, plus repeat index and seed.
    pub fn run_id(&self, config: &Json, repeat: u32, seed: u64) -> String {
        let mut v = self.value(config);
        if let Json::Object(m) = &mut v {
            m.insert("repeat".into(), Json::from(repeat));
            m.insert("seed".into(), Json::from(seed));
        }
        short_hash(&canonical_json(&v))
    }
}

/// One planned run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedRun {
    pub run_id: String,
    pub combo_id: String,
    /// 0-based repeat index within its combination.
    pub repeat: u32,
    /// Each variable's column value in this run; null where a conditional
    /// variable does not apply.
    pub variables: BTreeMap<String, Json>,
    /// The merged configuration the run gets as `--config`.
    pub config: Json,
    /// The probes of this run when a `probes` variable sets them (empty: a
    /// baseline); otherwise the experiment's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<Vec<String>>,
}

impl PlannedRun {
    /// Another repeat of the same combination (adaptive repeats).
    pub fn another_repeat(&self, identity: &Identity, repeat: u32, seed: u64) -> Self {
        Self {
            run_id: identity
                .of_run(self.probes.as_ref())
                .run_id(&self.config, repeat, seed),
            repeat,
            ..self.clone()
        }
    }

    /// The probes this run collects with.
    pub fn probes<'a>(&'a self, identity: &'a Identity) -> &'a [String] {
        self.probes.as_deref().unwrap_or(&identity.probes)
    }
}

/// `name=value` for each variable that applies, in declared order.
pub fn label(variables: &[Variable], values: &BTreeMap<String, Json>) -> String {
    variables
        .iter()
        .filter_map(|v| match values.get(&v.name) {
            None | Some(Json::Null) => None,
            Some(Json::String(s)) => Some(format!("{}={s}", v.name)),
            Some(other) => Some(format!("{}={other}", v.name)),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// JSON with object keys sorted and no white space: the same bytes for the
/// same value, whatever the map order.
pub fn canonical_json(v: &Json) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Json, out: &mut String) {
    match v {
        Json::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Json::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&m[k], out);
            }
            out.push('}');
        }
        Json::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

fn short_hash(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest
        .iter()
        .take(ID_HEX_DIGITS / 2)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every variable's `when` conditions, decided per level once: for each
/// condition, the index of the variable it names and, per level of that
/// variable, whether the condition holds. Whether a variable applies in a
/// combination is then one look-up per condition, however long the lists.
struct Conditions(Vec<Vec<(usize, Vec<bool>)>>);

impl Conditions {
    fn of(variables: &[Variable]) -> Self {
        Self(
            variables
                .iter()
                .map(|var| {
                    var.when
                        .iter()
                        .map(|cond| {
                            // A condition on an unknown variable never
                            // holds (the file's checks refuse it first).
                            let Some(idx) = variables.iter().position(|v| v.name == cond.variable)
                            else {
                                return (usize::MAX, Vec::new());
                            };
                            let wanted = Wanted::of(&cond.any_of);
                            let holds = variables[idx]
                                .levels
                                .iter()
                                .map(|l| wanted.names(l))
                                .collect();
                            (idx, holds)
                        })
                        .collect()
                })
                .collect(),
        )
    }

    /// Whether variable `var`'s conditions hold for the levels chosen so far.
    fn applies(&self, var: usize, chosen: &[Option<usize>]) -> bool {
        self.0[var].iter().all(|(idx, holds)| {
            chosen
                .get(*idx)
                .copied()
                .flatten()
                .is_some_and(|level| holds.get(level).copied().unwrap_or(false))
        })
    }
}

/// The values of one `when` condition as sets, so that whether one names a
/// level is what [`Level::matches`] says, in one look-up.
struct Wanted {
    strings: HashSet<String>,
    all: HashSet<String>,
    not_strings: HashSet<String>,
}

impl Wanted {
    fn of(any_of: &[Json]) -> Self {
        let key = |v: &Json| match v {
            Json::Number(n) => format!("n{}", n.as_f64().unwrap_or(f64::NAN)),
            other => format!("j{}", canonical_json(other)),
        };
        Self {
            strings: any_of
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            all: any_of.iter().map(key).collect(),
            not_strings: any_of.iter().filter(|v| !v.is_string()).map(key).collect(),
        }
    }

    fn names(&self, level: &Level) -> bool {
        let key = match &level.value {
            Json::Number(n) => format!("n{}", n.as_f64().unwrap_or(f64::NAN)),
            other => format!("j{}", canonical_json(other)),
        };
        match &level.label {
            Some(label) => self.strings.contains(label) || self.not_strings.contains(&key),
            None => self.all.contains(&key),
        }
    }
}

/// Every combination of levels, as one level index per variable (`None`
/// where a conditional variable does not apply), the first variable
/// varying slowest. Count them first ([`count_combinations`]): this builds
/// them all.
pub fn combinations(variables: &[Variable]) -> Vec<Vec<Option<usize>>> {
    let conditions = Conditions::of(variables);
    let mut combos: Vec<Vec<Option<usize>>> = vec![Vec::new()];
    for (i, var) in variables.iter().enumerate() {
        let mut next = Vec::new();
        for c in combos {
            if conditions.applies(i, &c) {
                for l in 0..var.levels.len() {
                    let mut with = c.clone();
                    with.push(Some(l));
                    next.push(with);
                }
            } else {
                let mut without = c;
                without.push(None);
                next.push(without);
            }
        }
        combos = next;
    }
    combos
}

/// How many combinations the variables make (conditional variables
/// multiplying only the combinations they apply to), or `None` as soon as
/// there are more than `cap`: the time taken is bounded by `cap`, whatever
/// the variables would make, and nothing is built.
pub fn count_combinations(variables: &[Variable], cap: u64) -> Option<u64> {
    fn walk(
        i: usize,
        variables: &[Variable],
        conditions: &Conditions,
        chosen: &mut Vec<Option<usize>>,
        total: &mut u64,
        cap: u64,
    ) -> bool {
        if i == variables.len() {
            *total += 1;
            return *total <= cap;
        }
        if !conditions.applies(i, chosen) {
            chosen.push(None);
            let ok = walk(i + 1, variables, conditions, chosen, total, cap);
            chosen.pop();
            return ok;
        }
        for l in 0..variables[i].levels.len() {
            chosen.push(Some(l));
            let ok = walk(i + 1, variables, conditions, chosen, total, cap);
            chosen.pop();
            if !ok {
                return false;
            }
        }
        true
    }
    let conditions = Conditions::of(variables);
    let mut chosen = Vec::with_capacity(variables.len());
    let mut total = 0;
    walk(0, variables, &conditions, &mut chosen, &mut total, cap).then_some(total)
}

/// The most combinations the variables could make (every variable applying):
/// the product of their sizes, saturating. For messages.
pub fn most_combinations(variables: &[Variable]) -> u128 {
    variables
        .iter()
        .fold(1u128, |n, v| n.saturating_mul(v.levels.len() as u128))
}

/// Refuses, in one line naming `file`, a plan of more than `max_runs` runs
/// (combinations times `repeats`), counted without building it. The count
/// of runs when it is within the limit.
pub fn check_size(
    file: &str,
    variables: &[Variable],
    repeats: u32,
    max_runs: usize,
) -> Result<u64> {
    let repeats = u64::from(repeats.max(1));
    let cap = max_runs as u64 / repeats;
    match count_combinations(variables, cap) {
        Some(combos) => Ok(combos * repeats),
        None => Err(ExperimentError::Invalid {
            file: file.to_owned(),
            key: "variables".into(),
            message: format!(
                "the plan has more than {max_runs} runs (up to {} combinations x {repeats} repeats); narrow the variables or the repeats, or raise the limit with max_runs = N in the file or --max-runs N (at most {MAX_RUNS_CEILING})",
                most_combinations(variables)
            ),
        }),
    }
}

/// Why a variable's key cannot be set in the base configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum SetKeyError {
    #[error("an empty key")]
    Empty,
    /// `prefix` holds a value where the key needs a table.
    #[error("{prefix} is a value in the base configuration, not a table")]
    NotATable { prefix: String },
}

/// Sets `value` at the dotted `key` of `table`, creating tables on the way.
fn set_key(
    table: &mut toml::Table,
    key: &str,
    value: toml::Value,
) -> std::result::Result<(), SetKeyError> {
    let parts: Vec<&str> = key.split('.').collect();
    let (last, path) = parts.split_last().ok_or(SetKeyError::Empty)?;
    let mut t = table;
    for (i, p) in path.iter().enumerate() {
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = match entry {
            toml::Value::Table(inner) => inner,
            _ => {
                return Err(SetKeyError::NotATable {
                    prefix: parts[..=i].join("."),
                })
            }
        };
    }
    t.insert(last.to_string(), value);
    Ok(())
}

/// What [`plan`] needs besides the variables.
pub struct PlanInput<'a> {
    /// The experiment file, for messages.
    pub file: &'a str,
    pub variables: &'a [Variable],
    /// The base configuration every run starts from.
    pub base: &'a toml::Table,
    pub identity: &'a Identity,
    pub repeats: u32,
    pub seed: u64,
    pub order: Order,
}

/// Every run of the experiment, in the order they are to be carried out.
pub fn plan(input: &PlanInput<'_>) -> Result<Vec<PlannedRun>> {
    // The caller checks its own limit first; this one bounds what is built
    // whatever the caller did.
    let total = check_size(input.file, input.variables, input.repeats, MAX_RUNS_CEILING)? as usize;
    let combos = combinations(input.variables);
    let mut runs = Vec::with_capacity(total);
    for combo in &combos {
        let mut config = input.base.clone();
        let mut values = BTreeMap::new();
        // Keys set so far in this combination (and every folder above
        // them), each with the variable that set it: a conflict is a look-up
        // per key segment.
        let mut set_keys: HashMap<&str, &str> = HashMap::new();
        let mut set_above: HashMap<&str, &str> = HashMap::new();
        let mut probes = None;
        for (var, level) in input.variables.iter().zip(combo) {
            let Some(level) = level else {
                values.insert(var.name.clone(), Json::Null);
                continue;
            };
            let level = &var.levels[*level];
            if var.is_probes() {
                probes = super::spec::probe_set(&level.value);
                values.insert(var.name.clone(), level.column());
                continue;
            }
            let invalid = |message: String| ExperimentError::Invalid {
                file: input.file.to_owned(),
                key: format!("variables.{}", var.name),
                message,
            };
            let key = var.key.as_str();
            let above = key.match_indices('.').map(|(i, _)| &key[..i]);
            let clash = set_keys
                .get(key)
                .or_else(|| set_above.get(key))
                .or_else(|| above.clone().find_map(|p| set_keys.get(p)));
            if let Some(other) = clash {
                return Err(invalid(format!(
                    "sets {}, which variable {other} also sets in the same runs (use `when` to keep them apart)",
                    var.key
                )));
            }
            let value = super::spec::json_to_toml(&level.value)
                .ok_or_else(|| invalid("null is not a configuration value".into()))?;
            set_key(&mut config, &var.key, value).map_err(|e| invalid(e.to_string()))?;
            set_keys.insert(key, &var.name);
            for p in above {
                set_above.entry(p).or_insert(&var.name);
            }
            values.insert(var.name.clone(), level.column());
        }
        let config = toml_to_json(&toml::Value::Table(config));
        let identity = input.identity.of_run(probes.as_ref());
        let combo_id = identity.combo_id(&config);
        for repeat in 0..input.repeats {
            runs.push(PlannedRun {
                run_id: identity.run_id(&config, repeat, input.seed),
                combo_id: combo_id.clone(),
                repeat,
                variables: values.clone(),
                config: config.clone(),
                probes: probes.clone(),
            });
        }
    }
    if input.order == Order::Shuffled {
        rng::shuffle(&mut runs, input.seed);
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Spec;

    fn spec(vars: &str) -> Spec {
        Spec::parse(
            "exp.toml",
            &format!("name = \"t\"\nbenchmark = \"fio\"\n{vars}"),
        )
        .expect("valid spec")
    }

    fn identity() -> Identity {
        Identity {
            benchmark: "fio".into(),
            probes: vec!["quanta_runtime".into()],
            power: None,
        }
    }

    fn try_plan(s: &Spec, repeats: u32, seed: u64, order: Order) -> Result<Vec<PlannedRun>> {
        plan(&PlanInput {
            file: "exp.toml",
            variables: &s.variables,
            base: &s.config,
            identity: &identity(),
            repeats,
            seed,
            order,
        })
    }

    fn plan_of(s: &Spec, repeats: u32, seed: u64, order: Order) -> Vec<PlannedRun> {
        try_plan(s, repeats, seed, order).expect("plan")
    }

    /// The error of planning `s` once, sequentially, with seed 0.
    fn plan_error(s: &Spec) -> String {
        try_plan(s, 1, 0, Order::Sequential)
            .expect_err("a plan error")
            .to_string()
    }

    const SWEEP: &str = "[config.benchmarks.fio]\nruntime = \"2s\"\n\
        [variables.bs]\nkey = \"benchmarks.fio.bs\"\nvalues = [\"4k\", \"64k\"]\n\
        [variables.rw]\nkey = \"benchmarks.fio.rw\"\nvalues = [\"randread\", \"randwrite\"]\n";

    #[test]
    fn cartesian_product_times_repeats() {
        let s = spec(SWEEP);
        let runs = plan_of(&s, 2, 1, Order::Sequential);
        assert_eq!(runs.len(), 8);
        let labels: Vec<String> = runs
            .iter()
            .map(|r| format!("{} #{}", label(&s.variables, &r.variables), r.repeat))
            .collect();
        assert_eq!(
            labels,
            [
                "bs=4k rw=randread #0",
                "bs=4k rw=randread #1",
                "bs=4k rw=randwrite #0",
                "bs=4k rw=randwrite #1",
                "bs=64k rw=randread #0",
                "bs=64k rw=randread #1",
                "bs=64k rw=randwrite #0",
                "bs=64k rw=randwrite #1",
            ]
        );
        // The base configuration is kept and each variable set.
        assert_eq!(runs[2].config["benchmarks"]["fio"]["runtime"], "2s");
        assert_eq!(runs[2].config["benchmarks"]["fio"]["bs"], "4k");
        assert_eq!(runs[2].config["benchmarks"]["fio"]["rw"], "randwrite");
        // Ids: unique per run, shared per combination.
        let mut ids: Vec<&str> = runs.iter().map(|r| r.run_id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 8);
        assert_eq!(runs[0].combo_id, runs[1].combo_id);
        assert_ne!(runs[1].combo_id, runs[2].combo_id);
    }

    /// Three variables, `paths` and `depth` only where earlier ones have
    /// some values: 8 combinations.
    const CONDITIONAL: &str = "[variables.variant]\nkey = \"benchmarks.fio.ioengine\"\nvalues = [\"psync\", \"multipath\", \"libaio\"]\n\
         [variables.paths]\nkey = \"benchmarks.fio.numjobs\"\nrange = { start = 1, end = 4 }\nwhen = { variant = \"multipath\" }\n\
         [variables.depth]\nkey = \"benchmarks.fio.size\"\nvalues = [\"1m\", \"2m\"]\nwhen = { variant = [\"libaio\", \"multipath\"], paths = [1, 4] }\n";

    #[test]
    fn conditional_variables_multiply_only_where_they_apply() {
        let s = spec(CONDITIONAL);
        let combos = combinations(&s.variables);
        // psync: 1; multipath: paths 1..4, depth only for paths 1 and 4
        // (2 + 1 + 1 + 2 = 6); libaio: paths does not apply, so depth's
        // condition on paths fails: 1.
        assert_eq!(combos.len(), 1 + 6 + 1, "{combos:?}");
        let runs = plan_of(&s, 1, 0, Order::Sequential);
        let labels: Vec<String> = runs
            .iter()
            .map(|r| label(&s.variables, &r.variables))
            .collect();
        assert_eq!(
            labels,
            [
                "variant=psync",
                "variant=multipath paths=1 depth=1m",
                "variant=multipath paths=1 depth=2m",
                "variant=multipath paths=2",
                "variant=multipath paths=3",
                "variant=multipath paths=4 depth=1m",
                "variant=multipath paths=4 depth=2m",
                "variant=libaio",
            ]
        );
        // Where a variable does not apply its value is null and its key is
        // not set.
        assert_eq!(runs[0].variables["paths"], Json::Null);
        assert!(runs[0].config["benchmarks"]["fio"].get("numjobs").is_none());
        assert_eq!(runs[3].config["benchmarks"]["fio"]["numjobs"], 2);
    }

    #[test]
    fn run_ids_are_stable_and_follow_the_configuration() {
        let s = spec(SWEEP);
        let a = plan_of(&s, 2, 5, Order::Sequential);
        let b = plan_of(&s, 2, 5, Order::Shuffled);
        let ids = |runs: &[PlannedRun]| {
            let mut v: Vec<String> = runs.iter().map(|r| r.run_id.clone()).collect();
            v.sort();
            v
        };
        assert_eq!(ids(&a), ids(&b), "the order does not change ids");
        // A fixed configuration has a fixed id, forever: experiments are
        // resumed by it. (Checked independently: sha256 of
        // {"benchmark":"fio","config":{...},"probes":["quanta_runtime"],"repeat":0,"seed":42}.)
        let config: Json =
            serde_json::json!({"benchmarks": {"fio": {"bs": "4k", "runtime": "2s"}}});
        assert_eq!(identity().run_id(&config, 0, 42), "d7ffdb383bac");
        assert_eq!(identity().combo_id(&config), "6ed55546102f");
        // Key order does not matter; any change of value, repeat, seed,
        // benchmark, probes or power does.
        let reordered: Json =
            serde_json::from_str(r#"{"benchmarks": {"fio": {"runtime": "2s", "bs": "4k"}}}"#)
                .expect("json");
        let id = identity().run_id(&config, 0, 42);
        assert_eq!(identity().run_id(&reordered, 0, 42), id);
        let changed = serde_json::json!({"benchmarks": {"fio": {"bs": "8k", "runtime": "2s"}}});
        assert_ne!(identity().run_id(&changed, 0, 42), id);
        assert_ne!(identity().run_id(&config, 1, 42), id);
        assert_ne!(identity().run_id(&config, 0, 43), id);
        let mut other = identity();
        other.probes.clear();
        assert_ne!(other.run_id(&config, 0, 42), id);
        let mut powered = identity();
        powered.power = Some(vec!["rapl".into()]);
        assert_ne!(powered.run_id(&config, 0, 42), id);
        // Another repeat of a run is the run planned with that repeat.
        let runs = plan_of(&s, 3, 5, Order::Sequential);
        let again = runs[0].another_repeat(&identity(), 2, 5);
        assert_eq!(again, runs[2]);
    }

    #[test]
    fn shuffled_order_is_seeded() {
        let s = spec(SWEEP);
        let order = |seed| -> Vec<String> {
            plan_of(&s, 2, seed, Order::Shuffled)
                .into_iter()
                .map(|r| r.run_id)
                .collect()
        };
        assert_eq!(order(9), order(9));
        let seq: Vec<String> = plan_of(&s, 2, 9, Order::Sequential)
            .into_iter()
            .map(|r| r.run_id)
            .collect();
        assert_ne!(order(9), seq);
        // Another seed: other ids (the seed is part of them) in another order.
        assert_ne!(order(9), order(10));
    }

    #[test]
    fn variables_setting_the_same_key_must_be_kept_apart() {
        let s = spec(
            "[variables.a]\nkey = \"benchmarks.fio.bs\"\nvalues = [\"4k\"]\n\
             [variables.b]\nkey = \"benchmarks.fio.bs\"\nvalues = [\"8k\"]\n",
        );
        let e = plan_error(&s);
        assert!(
            e.contains("exp.toml: variables.b: sets benchmarks.fio.bs, which variable a also sets"),
            "{e}"
        );
        // Kept apart by conditions, they are fine.
        let s = spec(
            "[variables.v]\nkey = \"benchmarks.fio.rw\"\nvalues = [\"read\", \"write\"]\n\
             [variables.a]\nkey = \"benchmarks.fio.bs\"\nvalues = [\"4k\"]\nwhen = { v = \"read\" }\n\
             [variables.b]\nkey = \"benchmarks.fio.bs\"\nvalues = [\"8k\"]\nwhen = { v = \"write\" }\n",
        );
        assert_eq!(plan_of(&s, 1, 0, Order::Sequential).len(), 2);
        // A key through a value of the base configuration.
        let s = spec(
            "[config.benchmarks]\nfio = 3\n[variables.a]\nkey = \"benchmarks.fio.bs\"\nvalues = [\"4k\"]\n",
        );
        let e = plan_error(&s);
        assert!(e.contains("benchmarks.fio is a value"), "{e}");
    }

    #[test]
    fn runs_are_counted_before_they_are_built() {
        // The count agrees with the combinations, conditions included.
        let s = spec(CONDITIONAL);
        assert_eq!(count_combinations(&s.variables, 100), Some(8));
        assert_eq!(count_combinations(&s.variables, 7), None);
        assert_eq!(check_size("exp.toml", &s.variables, 3, 24).ok(), Some(24));
        let e = check_size("exp.toml", &s.variables, 3, 23)
            .expect_err("above")
            .to_string();
        assert!(
            e.starts_with("exp.toml: variables: the plan has more than 23 runs"),
            "{e}"
        );
        // 10^9 combinations: refused by counting at most the limit.
        let s = spec(
            "[variables.a]\nkey = \"benchmarks.fio.numjobs\"\nrange = { start = 1, end = 1000 }\n\
             [variables.b]\nkey = \"benchmarks.fio.size\"\nrange = { start = 1, end = 1000 }\n\
             [variables.c]\nkey = \"benchmarks.fio.bs\"\nrange = { start = 1, end = 1000 }\n",
        );
        assert_eq!(most_combinations(&s.variables), 1_000_000_000);
        let e = check_size("exp.toml", &s.variables, 1, MAX_RUNS_CEILING)
            .expect_err("10^9")
            .to_string();
        assert!(
            e.contains("up to 1000000000 combinations x 1 repeats"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn no_variables_is_one_combination() {
        let s = spec("");
        let runs = plan_of(&s, 3, 0, Order::Sequential);
        assert_eq!(runs.len(), 3);
        assert!(runs.iter().all(|r| r.combo_id == runs[0].combo_id));
    }

    #[test]
    fn canonical_json_sorts_keys() {
        let v: Json =
            serde_json::from_str(r#"{"b": [1, {"d": 2, "c": "x"}], "a": 1.5}"#).expect("json");
        assert_eq!(canonical_json(&v), r#"{"a":1.5,"b":[1,{"c":"x","d":2}]}"#);
    }

    #[test]
    fn a_probes_variable_sets_each_runs_probes_and_ids() {
        let s = spec(
            "[variables.probes]\nvalues = [[], [\"quanta_runtime\"]]\n\
             [variables.bs]\nkey = \"benchmarks.fio.bs\"\nvalues = [\"4k\"]\n",
        );
        let runs = plan_of(&s, 2, 3, Order::Sequential);
        assert_eq!(runs.len(), 4);
        assert_eq!(runs[0].probes, Some(vec![]));
        assert_eq!(runs[2].probes, Some(vec!["quanta_runtime".to_owned()]));
        assert_eq!(runs[0].variables["probes"], "none");
        assert_eq!(runs[2].variables["probes"], "quanta_runtime");
        // The configuration is the same; the probes are not a key of it.
        assert_eq!(runs[0].config, runs[2].config);
        assert!(runs[0].config.get("probes").is_none());
        assert_ne!(runs[0].combo_id, runs[2].combo_id);
        // The ids are those of an experiment with these probes at the top.
        let mut baseline = identity();
        baseline.probes.clear();
        assert_eq!(runs[0].run_id, baseline.run_id(&runs[0].config, 0, 3));
        assert_eq!(runs[2].run_id, identity().run_id(&runs[2].config, 0, 3));
        assert_eq!(runs[0].probes(&identity()), &[] as &[String]);
        assert_eq!(runs[0].another_repeat(&identity(), 1, 3), runs[1]);
    }
}
