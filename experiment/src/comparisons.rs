//! Comparisons and labels: `experiment results --reference` (each
//! combination against a reference combination: ratio of means with
//! Fieller's interval, Welch's p-value Holm-corrected per figure, median,
//! MAD and outlier runs), `experiment results --best-by FIGURE --over VAR`
//! (the best value of a variable per combination of the others: the
//! training labels, one row per run so they join the runs' kernel tables
//! by `collection_id`) and `experiment compare A B` (the comparison between
//! two experiments matched on their variables).
//!
//! `comparisons.parquet` (and the file of `experiment compare`) has one
//! row per (combination, figure): the combination's variables,
//! `combo_id`, `reference_combo_id`, `is_reference`, `figure`, `n`,
//! `mean`, `sd`, `median`, `mad`, `outlier_runs` (list of the
//! `collection_id`s flagged: modified z-score above 3.5; flagged, not
//! dropped), the same four for the reference, `ratio` (mean / reference
//! mean), `ratio_lo`, `ratio_hi` (95%, Fieller; null when unbounded), `t`,
//! `df`, `p` (Welch, two-sided), `p_holm` (Holm over the combinations
//! compared for that figure) and `significant` (`p_holm` < 0.05).
//!
//! `labels.parquet` has one row per (combination of the other variables,
//! run): those variables, `figure`, `minimize`, the run's own value of the
//! variable (column named after it), `run_id`, `collection_id`, `value`
//! (the run's figure), then the label of its combination: `best`,
//! `best_mean`, `runner_up`, `runner_up_mean`, `margin` (relative to the
//! runner-up), `p` (Welch, best against runner-up), `significant`
//! (p < 0.05), `default`, `default_mean`, `regret` (relative to the best).
//! One row per run, not a list column: `kernel_table.join(labels,
//! on="collection_id")` in polars needs no `explode`.
//!
//! `overhead.parquet` (written by every `experiment results` when a
//! `probes` variable sweeps the probe set and lists `[]`) has the columns
//! of `comparisons.parquet`, each combination against the baseline
//! (`probes=none`) with the same other variables: the collector's effect
//! on each figure as a ratio with its 95% interval.

use std::{collections::HashMap, path::Path, sync::Arc};

use arrow_array::{
    builder::{ListBuilder, StringBuilder},
    ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray,
};
use arrow_schema::{Field, Schema};
use serde_json::Value as Json;

use crate::{
    compare::{self, Robust},
    plan::canonical_json,
    record::{ExpDir, Lock, Record},
    results::{self, number, Results, Role},
    spec::{ColumnType, Variable},
    ExperimentError, Result,
};
use kernmlops::files;

/// Significance level of `significant`.
pub const ALPHA: f64 = 0.05;

/// One variable combination of a results table.
#[derive(Debug, Clone)]
pub struct Combo {
    pub combo_id: String,
    /// The value of each variable column (in `variables` order; null where
    /// a conditional variable does not apply).
    pub values: Vec<Json>,
    /// Its rows in the results.
    pub rows: Vec<usize>,
}

/// The combinations of a results table and the names of its variables.
pub fn combos(results: &Results) -> (Vec<String>, Vec<Combo>) {
    let names: Vec<String> = results
        .columns
        .iter()
        .filter(|c| c.role == Role::Variable)
        .map(|c| c.name.clone())
        .collect();
    let combos = results::groups(results)
        .into_iter()
        .map(|(combo_id, rows)| {
            let values = names
                .iter()
                .map(|n| {
                    results
                        .column(n)
                        .and_then(|c| rows.first().and_then(|&i| c.values.get(i)))
                        .cloned()
                        .unwrap_or(Json::Null)
                })
                .collect();
            Combo {
                combo_id,
                values,
                rows,
            }
        })
        .collect();
    (names, combos)
}

/// A value as it is typed on the command line and printed.
fn text(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn label(names: &[String], values: &[Json]) -> String {
    let parts: Vec<String> = names
        .iter()
        .zip(values)
        .filter(|(_, v)| !v.is_null())
        .map(|(n, v)| format!("{n}={}", text(v)))
        .collect();
    if parts.is_empty() {
        "all runs".into()
    } else {
        parts.join(" ")
    }
}

/// The figure's values over `rows` that count (runs not failed, finite
/// numbers), with each one's `collection_id`.
fn sample(results: &Results, figure: &str, rows: &[usize]) -> (Vec<f64>, Vec<String>) {
    let numbers = results.numbers(figure);
    let class = results.column("run_class");
    let ids = results.column("collection_id");
    let mut values = Vec::new();
    let mut collections = Vec::new();
    for &i in rows {
        let failed = class
            .and_then(|c| c.values.get(i))
            .and_then(Json::as_str)
            .is_none_or(|c| c == "failed");
        match numbers.get(i).copied().flatten() {
            Some(x) if !failed && x.is_finite() => {
                values.push(x);
                collections.push(
                    ids.and_then(|c| c.values.get(i))
                        .map(text)
                        .unwrap_or_default(),
                );
            }
            _ => {}
        }
    }
    (values, collections)
}

/// A numeric column of the results named by the user: `result_<key>`,
/// `<key>` of an `@result` figure, or any other numeric column by name.
pub fn resolve_figure(results: &Results, name: &str) -> Result<String> {
    let numeric = |c: &&results::Column| matches!(c.kind, ColumnType::Int | ColumnType::Float);
    let known: Vec<&results::Column> = results
        .columns
        .iter()
        .filter(numeric)
        .filter(|c| c.role != Role::Variable)
        .collect();
    for candidate in [format!("result_{name}"), name.to_owned()] {
        if let Some(c) = known.iter().find(|c| c.name == candidate) {
            return Ok(c.name.clone());
        }
    }
    Err(ExperimentError::Usage(format!(
        "--best-by {name}: not a numeric column of the results (figures: {})",
        results::figure_columns(results)
            .iter()
            .map(|c| c.name.trim_start_matches("result_"))
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

/// Parses `VAR=VALUE` pairs against the experiment's variables: each pair
/// names a variable and one of its values.
pub fn parse_reference(pairs: &[String], variables: &[Variable]) -> Result<Vec<(String, Json)>> {
    let usage = |m: String| ExperimentError::Usage(m);
    let mut out: Vec<(String, Json)> = Vec::new();
    for pair in pairs {
        let Some((name, value)) = pair.split_once('=') else {
            return Err(usage(format!(
                "--reference {pair}: give VAR=VALUE, e.g. --reference {}=...",
                variables.first().map_or("bs", |v| v.name.as_str())
            )));
        };
        let (name, value) = (name.trim(), value.trim());
        let Some(var) = variables.iter().find(|v| v.name == name) else {
            return Err(usage(format!(
                "--reference {pair}: no variable {name:?} in the experiment (variables: {})",
                variables
                    .iter()
                    .map(|v| v.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        if out.iter().any(|(n, _)| n == name) {
            return Err(usage(format!("--reference names {name} twice")));
        }
        let level = var.levels.iter().map(|l| l.column()).find(|c| {
            text(c) == value
                || matches!((c.as_f64(), value.parse::<f64>()), (Some(a), Ok(b)) if a == b)
        });
        let Some(level) = level else {
            return Err(usage(format!(
                "--reference {pair}: {value:?} is not a value of {name} (values: {})",
                var.levels
                    .iter()
                    .map(|l| text(&l.column()))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        out.push((name.to_owned(), level));
    }
    Ok(out)
}

/// One row of a comparison: a combination against its reference, for one
/// figure.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub values: Vec<Json>,
    pub combo_id: String,
    pub reference_combo_id: Option<String>,
    pub is_reference: bool,
    pub figure: String,
    pub subject: Side,
    pub reference: Side,
    pub ratio: Option<compare::Ratio>,
    pub welch: Option<compare::Welch>,
    pub p_holm: Option<f64>,
}

/// The statistics of one side of a comparison.
#[derive(Debug, Clone, Default)]
pub struct Side {
    pub n: usize,
    pub mean: Option<f64>,
    pub sd: Option<f64>,
    pub robust: Option<Robust>,
    pub outliers: Vec<String>,
}

impl Side {
    fn of(values: &[f64], collections: &[String]) -> Self {
        let summary = crate::stats::Summary::of(values);
        let robust = compare::robust(values);
        let outliers = robust
            .as_ref()
            .map(|r| {
                r.outlier
                    .iter()
                    .zip(collections)
                    .filter(|(o, _)| **o)
                    .map(|(_, c)| c.clone())
                    .collect()
            })
            .unwrap_or_default();
        Self {
            n: values.len(),
            mean: summary.as_ref().map(|s| s.mean),
            sd: summary.and_then(|s| s.sd),
            robust,
            outliers,
        }
    }
}

/// Compares `subject` against `reference` (both (values, collection ids)).
/// `is_reference`: the combination is its own reference (no test).
fn comparison(
    values: Vec<Json>,
    (combo_id, reference_combo_id, is_reference): (String, Option<String>, bool),
    figure: &str,
    subject: (Vec<f64>, Vec<String>),
    reference: Option<(Vec<f64>, Vec<String>)>,
) -> Comparison {
    let (ratio, welch) = match (&reference, is_reference) {
        (Some((r, _)), false) => (compare::ratio(&subject.0, r), compare::welch(&subject.0, r)),
        (Some((r, _)), true) => (
            compare::ratio(&subject.0, r).map(|x| compare::Ratio {
                ratio: x.ratio,
                ci: None,
            }),
            None,
        ),
        (None, _) => (None, None),
    };
    Comparison {
        values,
        combo_id,
        reference_combo_id,
        is_reference,
        figure: figure.to_owned(),
        subject: Side::of(&subject.0, &subject.1),
        reference: reference.map(|(v, c)| Side::of(&v, &c)).unwrap_or_default(),
        ratio,
        welch,
        p_holm: None,
    }
}

/// Holm's correction over the rows of each figure that have a p-value.
fn correct(rows: &mut [Comparison]) {
    let mut figures: Vec<String> = rows.iter().map(|r| r.figure.clone()).collect();
    figures.dedup();
    for f in figures {
        let idx: Vec<usize> = (0..rows.len())
            .filter(|&i| rows[i].figure == f && rows[i].welch.is_some())
            .collect();
        let p: Vec<f64> = idx
            .iter()
            .map(|&i| rows[i].welch.map_or(f64::NAN, |w| w.p))
            .collect();
        for (&i, adj) in idx.iter().zip(compare::holm(&p)) {
            rows[i].p_holm = Some(adj);
        }
    }
}

/// Each combination against its reference: the combination with the
/// reference's values for the variables it names and its own for the
/// others.
pub fn against_reference(results: &Results, reference: &[(String, Json)]) -> Vec<Comparison> {
    let (names, combos) = combos(results);
    let figures: Vec<String> = results::figure_columns(results)
        .iter()
        .map(|c| c.name.clone())
        .collect();
    let mut rows = Vec::new();
    for figure in &figures {
        for c in &combos {
            let mut target = c.values.clone();
            for (name, value) in reference {
                if let Some(i) = names.iter().position(|n| n == name) {
                    target[i] = value.clone();
                }
            }
            let r = combos.iter().find(|o| o.values == target);
            rows.push(comparison(
                c.values.clone(),
                (
                    c.combo_id.clone(),
                    r.map(|r| r.combo_id.clone()),
                    r.is_some_and(|r| r.combo_id == c.combo_id),
                ),
                figure,
                sample(results, figure, &c.rows),
                r.map(|r| sample(results, figure, &r.rows)),
            ));
        }
    }
    correct(&mut rows);
    rows
}

/// Experiment B's combinations against A's with the same variable values
/// (B relative to A), for the figures both have. Errors when the two do
/// not have the same variables or no figure in common.
pub fn between(a: &Results, b: &Results) -> Result<(Vec<String>, Vec<Comparison>, Vec<String>)> {
    let (names_a, combos_a) = combos(a);
    let (names_b, combos_b) = combos(b);
    let (mut sa, mut sb) = (names_a.clone(), names_b.clone());
    sa.sort();
    sb.sort();
    if sa != sb {
        return Err(ExperimentError::Usage(format!(
            "the experiments vary different variables ({} has {}; {} has {}): compare experiments over the same variables",
            a.experiment,
            if names_a.is_empty() { "none".into() } else { names_a.join(", ") },
            b.experiment,
            if names_b.is_empty() { "none".into() } else { names_b.join(", ") },
        )));
    }
    let figures_a: Vec<String> = results::figure_columns(a)
        .iter()
        .map(|c| c.name.clone())
        .collect();
    let figures: Vec<String> = results::figure_columns(b)
        .iter()
        .map(|c| c.name.clone())
        .filter(|f| figures_a.contains(f))
        .collect();
    if figures.is_empty() {
        return Err(ExperimentError::Usage(format!(
            "{} and {} have no numeric figure in common (or no finished runs)",
            a.experiment, b.experiment
        )));
    }
    // A's combinations keyed by their values in B's variable order.
    let key_a = |c: &Combo| -> String {
        names_b
            .iter()
            .map(|n| {
                names_a
                    .iter()
                    .position(|x| x == n)
                    .map_or(String::new(), |i| canonical_json(&c.values[i]))
            })
            .collect::<Vec<_>>()
            .join("\u{1f}")
    };
    let index: HashMap<String, &Combo> = combos_a.iter().map(|c| (key_a(c), c)).collect();
    let key_b = |c: &Combo| -> String {
        c.values
            .iter()
            .map(canonical_json)
            .collect::<Vec<_>>()
            .join("\u{1f}")
    };
    let mut unmatched = Vec::new();
    for c in &combos_b {
        if !index.contains_key(&key_b(c)) {
            unmatched.push(label(&names_b, &c.values));
        }
    }
    let mut rows = Vec::new();
    for figure in &figures {
        for c in &combos_b {
            let Some(r) = index.get(&key_b(c)) else {
                continue;
            };
            // Two experiments of the same configuration share combination
            // ids, but their runs differ: never "the reference itself".
            rows.push(comparison(
                c.values.clone(),
                (c.combo_id.clone(), Some(r.combo_id.clone()), false),
                figure,
                sample(b, figure, &c.rows),
                Some(sample(a, figure, &r.rows)),
            ));
        }
    }
    correct(&mut rows);
    Ok((names_b, rows, unmatched))
}

/// The label of one combination of the other variables.
#[derive(Debug, Clone)]
pub struct Label {
    /// Values of the other variables (in `others` order).
    pub values: Vec<Json>,
    pub best: Json,
    pub best_mean: f64,
    pub runner_up: Option<(Json, f64)>,
    pub margin: Option<f64>,
    pub p: Option<f64>,
    pub default: Option<(Json, Option<f64>, Option<f64>)>,
    /// (run row, the run's level of the variable).
    pub runs: Vec<(usize, Json)>,
}

/// The labels of `--best-by FIGURE --over VAR`.
#[derive(Debug, Clone)]
pub struct Labels {
    pub figure: String,
    pub over: String,
    pub over_type: ColumnType,
    pub minimize: bool,
    /// The other variables: (name, column type).
    pub others: Vec<(String, ColumnType)>,
    pub labels: Vec<Label>,
}

/// For each combination of the other variables, the best level of `over`.
pub fn best_by(
    variables: &[Variable],
    results: &Results,
    figure: &str,
    over: &str,
    minimize: bool,
) -> Result<Labels> {
    let Some(var) = variables.iter().find(|v| v.name == over) else {
        return Err(ExperimentError::Usage(format!(
            "--over {over}: no variable {over:?} in the experiment (variables: {})",
            variables
                .iter()
                .map(|v| v.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    let figure = resolve_figure(results, figure)?;
    let (names, combos) = combos(results);
    let at = names.iter().position(|n| n == over);
    let others: Vec<usize> = (0..names.len()).filter(|&i| Some(i) != at).collect();
    // Groups of combinations by the other variables, in first-seen order.
    let mut groups: Vec<(Vec<Json>, Vec<&Combo>)> = Vec::new();
    for c in &combos {
        let key: Vec<Json> = others.iter().map(|&i| c.values[i].clone()).collect();
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(c),
            None => groups.push((key, vec![c])),
        }
    }
    let mut labels = Vec::new();
    for (key, members) in groups {
        let level_of = |c: &Combo| at.map_or(Json::Null, |i| c.values[i].clone());
        // Candidates in the variable's declared order.
        let mut cands: Vec<(Json, String, Vec<f64>)> = Vec::new();
        for l in &var.levels {
            let col = l.column();
            let rows: Vec<usize> = members
                .iter()
                .filter(|c| level_of(c) == col)
                .flat_map(|c| c.rows.iter().copied())
                .collect();
            if rows.is_empty() {
                continue;
            }
            cands.push((col.clone(), text(&col), sample(results, &figure, &rows).0));
        }
        let view: Vec<(&str, &[f64])> = cands
            .iter()
            .map(|(_, t, v)| (t.as_str(), v.as_slice()))
            .collect();
        let Some(b) = compare::best(&view, minimize) else {
            continue;
        };
        let json_of = |t: &str| {
            cands
                .iter()
                .find(|(_, x, _)| x == t)
                .map_or(Json::Null, |(j, _, _)| j.clone())
        };
        let default = var.default.as_ref().map(|d| {
            let mean = cands
                .iter()
                .find(|(j, _, _)| j == d)
                .and_then(|(_, _, v)| crate::stats::Summary::of(v))
                .map(|s| s.mean);
            let regret = mean.and_then(|m| compare::regret(m, b.mean, minimize));
            (d.clone(), mean, regret)
        });
        let runs = members
            .iter()
            .flat_map(|c| c.rows.iter().map(move |&i| (i, level_of(c))))
            .collect();
        labels.push(Label {
            values: key,
            best: json_of(b.level),
            best_mean: b.mean,
            runner_up: b.runner_up.map(|(l, m)| (json_of(l), m)),
            margin: b.margin,
            p: b.p,
            default,
            runs,
        });
    }
    let others = others
        .iter()
        .map(|&i| {
            let name = names[i].clone();
            let t = results.column(&name).map_or(ColumnType::String, |c| c.kind);
            (name, t)
        })
        .collect();
    Ok(Labels {
        figure,
        over: over.to_owned(),
        over_type: var.column_type(),
        minimize,
        others,
        labels,
    })
}

/// Columns of an Arrow table, built one after another.
#[derive(Default)]
struct Table {
    fields: Vec<Field>,
    arrays: Vec<ArrayRef>,
}

impl Table {
    fn push(&mut self, name: &str, array: ArrayRef) {
        self.fields
            .push(Field::new(name, array.data_type().clone(), true));
        self.arrays.push(array);
    }
    fn str(&mut self, name: &str, v: Vec<Option<String>>) {
        self.push(name, Arc::new(StringArray::from(v)));
    }
    fn f64(&mut self, name: &str, v: Vec<Option<f64>>) {
        self.push(name, Arc::new(Float64Array::from(v)));
    }
    fn i64(&mut self, name: &str, v: Vec<Option<i64>>) {
        self.push(name, Arc::new(Int64Array::from(v)));
    }
    fn bool(&mut self, name: &str, v: Vec<Option<bool>>) {
        self.push(name, Arc::new(BooleanArray::from(v)));
    }
    fn list(&mut self, name: &str, v: Vec<Vec<String>>) {
        let mut b = ListBuilder::new(StringBuilder::new());
        for items in v {
            for s in items {
                b.values().append_value(s);
            }
            b.append(true);
        }
        self.push(name, Arc::new(b.finish()));
    }
    /// A column of JSON scalars as `kind` says (a variable's values).
    fn json(&mut self, name: &str, kind: ColumnType, v: Vec<Json>) {
        match kind {
            ColumnType::Int => self.i64(name, v.iter().map(Json::as_i64).collect()),
            ColumnType::Float => self.f64(name, v.iter().map(Json::as_f64).collect()),
            ColumnType::Bool => self.bool(name, v.iter().map(Json::as_bool).collect()),
            ColumnType::String => self.str(
                name,
                v.iter().map(|x| (!x.is_null()).then(|| text(x))).collect(),
            ),
        }
    }
    fn batch(
        self,
        rows: usize,
        metadata: HashMap<String, String>,
    ) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
        let schema = Schema::new(self.fields).with_metadata(metadata);
        let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(rows));
        RecordBatch::try_new_with_options(Arc::new(schema), self.arrays, &options)
    }
}

fn column_types(results: &Results, names: &[String]) -> Vec<ColumnType> {
    names
        .iter()
        .map(|n| results.column(n).map_or(ColumnType::String, |c| c.kind))
        .collect()
}

/// The comparison rows as a record batch.
pub fn comparisons_batch(
    names: &[String],
    types: &[ColumnType],
    rows: &[Comparison],
    metadata: HashMap<String, String>,
) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
    let mut t = Table::default();
    for (i, (name, kind)) in names.iter().zip(types).enumerate() {
        t.json(
            name,
            *kind,
            rows.iter().map(|r| r.values[i].clone()).collect(),
        );
    }
    t.str(
        "combo_id",
        rows.iter().map(|r| Some(r.combo_id.clone())).collect(),
    );
    t.str(
        "reference_combo_id",
        rows.iter().map(|r| r.reference_combo_id.clone()).collect(),
    );
    t.bool(
        "is_reference",
        rows.iter().map(|r| Some(r.is_reference)).collect(),
    );
    t.str(
        "figure",
        rows.iter()
            .map(|r| Some(r.figure.trim_start_matches("result_").to_owned()))
            .collect(),
    );
    for (prefix, side) in [("", false), ("reference_", true)] {
        let s = |r: &Comparison| -> Side {
            if side {
                r.reference.clone()
            } else {
                r.subject.clone()
            }
        };
        t.i64(
            &format!("{prefix}n"),
            rows.iter().map(|r| Some(s(r).n as i64)).collect(),
        );
        t.f64(
            &format!("{prefix}mean"),
            rows.iter().map(|r| s(r).mean).collect(),
        );
        t.f64(
            &format!("{prefix}sd"),
            rows.iter().map(|r| s(r).sd).collect(),
        );
        t.f64(
            &format!("{prefix}median"),
            rows.iter().map(|r| s(r).robust.map(|x| x.median)).collect(),
        );
        t.f64(
            &format!("{prefix}mad"),
            rows.iter().map(|r| s(r).robust.map(|x| x.mad)).collect(),
        );
        t.list(
            &format!("{prefix}outlier_runs"),
            rows.iter().map(|r| s(r).outliers).collect(),
        );
    }
    t.f64(
        "ratio",
        rows.iter().map(|r| r.ratio.map(|x| x.ratio)).collect(),
    );
    t.f64(
        "ratio_lo",
        rows.iter()
            .map(|r| r.ratio.and_then(|x| x.ci).map(|c| c.0))
            .collect(),
    );
    t.f64(
        "ratio_hi",
        rows.iter()
            .map(|r| r.ratio.and_then(|x| x.ci).map(|c| c.1))
            .collect(),
    );
    t.f64("t", rows.iter().map(|r| r.welch.map(|w| w.t)).collect());
    t.f64("df", rows.iter().map(|r| r.welch.map(|w| w.df)).collect());
    t.f64("p", rows.iter().map(|r| r.welch.map(|w| w.p)).collect());
    t.f64("p_holm", rows.iter().map(|r| r.p_holm).collect());
    t.bool(
        "significant",
        rows.iter().map(|r| r.p_holm.map(|p| p < ALPHA)).collect(),
    );
    t.batch(rows.len(), metadata)
}

/// The labels as a record batch, one row per run.
pub fn labels_batch(
    labels: &Labels,
    results: &Results,
) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
    let rows: Vec<(&Label, usize, &Json)> = labels
        .labels
        .iter()
        .flat_map(|l| l.runs.iter().map(move |(i, level)| (l, *i, level)))
        .collect();
    let mut t = Table::default();
    for (k, (name, kind)) in labels.others.iter().enumerate() {
        t.json(
            name,
            *kind,
            rows.iter().map(|r| r.0.values[k].clone()).collect(),
        );
    }
    let fig = labels.figure.trim_start_matches("result_").to_owned();
    t.str("figure", rows.iter().map(|_| Some(fig.clone())).collect());
    t.bool(
        "minimize",
        rows.iter().map(|_| Some(labels.minimize)).collect(),
    );
    t.json(
        &labels.over,
        labels.over_type,
        rows.iter().map(|r| r.2.clone()).collect(),
    );
    for key in ["run_id", "collection_id"] {
        let col = results.column(key);
        t.str(
            key,
            rows.iter()
                .map(|r| {
                    col.and_then(|c| c.values.get(r.1))
                        .and_then(|v| v.as_str().map(str::to_owned))
                })
                .collect(),
        );
    }
    let values = results.numbers(&labels.figure);
    t.f64(
        "value",
        rows.iter()
            .map(|r| values.get(r.1).copied().flatten())
            .collect(),
    );
    t.json(
        "best",
        labels.over_type,
        rows.iter().map(|r| r.0.best.clone()).collect(),
    );
    t.f64(
        "best_mean",
        rows.iter().map(|r| Some(r.0.best_mean)).collect(),
    );
    t.json(
        "runner_up",
        labels.over_type,
        rows.iter()
            .map(|r| r.0.runner_up.as_ref().map_or(Json::Null, |x| x.0.clone()))
            .collect(),
    );
    t.f64(
        "runner_up_mean",
        rows.iter()
            .map(|r| r.0.runner_up.as_ref().map(|x| x.1))
            .collect(),
    );
    t.f64("margin", rows.iter().map(|r| r.0.margin).collect());
    t.f64("p", rows.iter().map(|r| r.0.p).collect());
    t.bool(
        "significant",
        rows.iter().map(|r| r.0.p.map(|p| p < ALPHA)).collect(),
    );
    t.json(
        "default",
        labels.over_type,
        rows.iter()
            .map(|r| r.0.default.as_ref().map_or(Json::Null, |d| d.0.clone()))
            .collect(),
    );
    t.f64(
        "default_mean",
        rows.iter()
            .map(|r| r.0.default.as_ref().and_then(|d| d.1))
            .collect(),
    );
    t.f64(
        "regret",
        rows.iter()
            .map(|r| r.0.default.as_ref().and_then(|d| d.2))
            .collect(),
    );
    t.batch(
        rows.len(),
        HashMap::from([
            (
                "kernmlops.experiment".to_owned(),
                results.experiment.clone(),
            ),
            ("kernmlops.figure".to_owned(), fig),
            ("kernmlops.over".to_owned(), labels.over.clone()),
        ]),
    )
}

/// Writes `batch` to `path` as Parquet, atomically (a temporary file in the
/// same folder, renamed over it).
pub fn write_parquet(path: &Path, batch: &RecordBatch) -> Result<()> {
    let fail = |e: String| ExperimentError::Results {
        path: path.to_owned(),
        message: e,
    };
    let mut tmp = files::atomic(path).map_err(ExperimentError::io(path))?;
    let props = parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::SNAPPY)
        .build();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut tmp, batch.schema(), Some(props))
        .map_err(|e| fail(e.to_string()))?;
    w.write(batch)
        .and_then(|()| w.close().map(drop))
        .map_err(|e| fail(e.to_string()))?;
    tmp.commit()
        .map_err(|e| ExperimentError::io(path)(files::without_path(e, path)))
}

/// Writes into the experiment folder under its results lock.
fn write_in(dir: &ExpDir, name: &str, batch: &RecordBatch) -> Result<std::path::PathBuf> {
    let locks = dir.locks();
    if !locks.is_dir() {
        std::fs::create_dir_all(&locks).map_err(ExperimentError::io(&locks))?;
    }
    let _turn = Lock::take(&dir.results_lock())?;
    let path = dir.root.join(name);
    write_parquet(&path, batch)?;
    Ok(path)
}

fn opt(x: Option<f64>) -> String {
    x.map_or("-".into(), number)
}

fn p_text(p: Option<f64>) -> String {
    match p {
        None => "-".into(),
        Some(p) if p < 1e-4 => format!("{p:.1e}"),
        Some(p) => format!("{p:.4}"),
    }
}

/// The comparison as printed: a table per figure.
pub fn render_comparisons(names: &[String], rows: &[Comparison], against: &str) -> String {
    let mut out = String::new();
    let labels: Vec<String> = rows.iter().map(|r| label(names, &r.values)).collect();
    let width = labels.iter().map(String::len).max().unwrap_or(11).max(11);
    let mut figures: Vec<&str> = rows.iter().map(|r| r.figure.as_str()).collect();
    figures.dedup();
    for f in figures {
        out.push_str(&format!(
            "{} {against}:\n  {:<width$} {:>3} {:>12} {:>12} {:>10} {:>8} {:>9}  {:<23} {:>8} {:>8}\n",
            f.trim_start_matches("result_"),
            "combination",
            "n",
            "mean",
            "median",
            "MAD",
            "outliers",
            "ratio",
            "95% CI",
            "p",
            "p (Holm)"
        ));
        for (r, l) in rows.iter().zip(&labels).filter(|(r, _)| r.figure == f) {
            let ci = match r.ratio.and_then(|x| x.ci) {
                _ if r.is_reference => "(reference)".to_owned(),
                Some((lo, hi)) => format!("[{}, {}]", number(lo), number(hi)),
                None if r.ratio.is_some() => "unbounded".to_owned(),
                None => "-".to_owned(),
            };
            let mark = if r.p_holm.is_some_and(|p| p < ALPHA) {
                " *"
            } else {
                ""
            };
            out.push_str(&format!(
                "  {l:<width$} {:>3} {:>12} {:>12} {:>10} {:>8} {:>9}  {ci:<23} {:>8} {:>8}{mark}\n",
                r.subject.n,
                opt(r.subject.mean),
                opt(r.subject.robust.as_ref().map(|x| x.median)),
                opt(r.subject.robust.as_ref().map(|x| x.mad)),
                r.subject.outliers.len(),
                opt(r.ratio.map(|x| x.ratio)),
                p_text(r.welch.map(|w| w.p)),
                p_text(r.p_holm),
            ));
            if !r.subject.outliers.is_empty() {
                out.push_str(&format!(
                    "  {:<width$}     outlier runs (kept): {}\n",
                    "",
                    r.subject.outliers.join(", ")
                ));
            }
        }
    }
    out.push_str("* Holm-corrected p < 0.05\n");
    out
}

/// The labels as printed: one line per combination of the other variables.
pub fn render_labels(labels: &Labels) -> String {
    let names: Vec<String> = labels.others.iter().map(|(n, _)| n.clone()).collect();
    let mut out = format!(
        "best {} by {} ({}):\n",
        labels.over,
        labels.figure.trim_start_matches("result_"),
        if labels.minimize { "lowest" } else { "highest" }
    );
    for l in &labels.labels {
        let mut line = format!(
            "  {}: {}={} (mean {})",
            label(&names, &l.values),
            labels.over,
            text(&l.best),
            number(l.best_mean)
        );
        match (&l.runner_up, l.margin) {
            (Some((r, m)), margin) => line.push_str(&format!(
                ", runner-up {} (mean {}), margin {}, p {} ({})",
                text(r),
                number(*m),
                margin.map_or("-".into(), |x| format!("{:.1}%", x * 100.0)),
                p_text(l.p),
                if l.p.is_some_and(|p| p < ALPHA) {
                    "significant"
                } else {
                    "not significant"
                }
            )),
            (None, _) => line.push_str(", no runner-up"),
        }
        if let Some((d, _, regret)) = &l.default {
            line.push_str(&format!(
                "; default {} regret {}",
                text(d),
                regret.map_or("-".into(), |x| format!("{:.1}%", x * 100.0))
            ));
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// `experiment results DIR --reference ...`: writes `comparisons.parquet`
/// (every figure) and prints the table (the figures of `only`, when not
/// empty, as `--figures` says).
pub fn report_reference(
    dir: &ExpDir,
    record: &Record,
    results: &Results,
    pairs: &[String],
    only: &[String],
) -> Result<()> {
    let reference = parse_reference(pairs, &record.variables)?;
    let rows = against_reference(results, &reference);
    let against = format!(
        "against {}",
        reference
            .iter()
            .map(|(n, v)| format!("{n}={}", text(v)))
            .collect::<Vec<_>>()
            .join(",")
    );
    let written = Written {
        file: "comparisons.parquet",
        heading: "comparisons",
        reference: against.clone(),
        against,
    };
    written.write_and_print(dir, results, &rows, only)
}

/// One file of comparisons: its name, the heading it is printed under,
/// the reference recorded in its metadata and the one printed.
struct Written {
    file: &'static str,
    heading: &'static str,
    reference: String,
    against: String,
}

impl Written {
    /// Writes `rows` to the file and prints them (the figures of `only`,
    /// or all when it is empty).
    fn write_and_print(
        &self,
        dir: &ExpDir,
        results: &Results,
        rows: &[Comparison],
        only: &[String],
    ) -> Result<()> {
        let (names, _) = combos(results);
        let types = column_types(results, &names);
        let batch = comparisons_batch(
            &names,
            &types,
            rows,
            HashMap::from([
                (
                    "kernmlops.experiment".to_owned(),
                    results.experiment.clone(),
                ),
                ("kernmlops.reference".to_owned(), self.reference.clone()),
            ]),
        )
        .map_err(|e| ExperimentError::Results {
            path: dir.root.join(self.file),
            message: e.to_string(),
        })?;
        let path = write_in(dir, self.file, &batch)?;
        kernmlops::outln!();
        kernmlops::outln!("{}: {} ({} rows)", self.heading, path.display(), rows.len());
        let shown: Vec<Comparison> = rows
            .iter()
            .filter(|r| {
                only.is_empty()
                    || only
                        .iter()
                        .any(|f| f == r.figure.trim_start_matches("result_"))
            })
            .cloned()
            .collect();
        kernmlops::out!("{}", render_comparisons(&names, &shown, &self.against));
        Ok(())
    }
}

/// The collector's overhead, when a `probes` variable sweeps the probe
/// set and one of its sets is empty: each combination against the one with
/// the baseline (`probes=none`) and the same other variables, as
/// `--reference probes=none` would compare them. Written to
/// `overhead.parquet` (the columns of `comparisons.parquet`) and printed
/// (the figures of `only`, when not empty). Nothing without such a
/// variable.
pub fn report_overhead(
    dir: &ExpDir,
    record: &Record,
    results: &Results,
    only: &[String],
) -> Result<()> {
    let Some((var, baseline)) = record
        .variables
        .iter()
        .find_map(|v| v.baseline().map(|b| (v, b)))
    else {
        return Ok(());
    };
    if var.levels.len() < 2 {
        return Ok(());
    }
    let reference = [(var.name.clone(), baseline)];
    let rows = against_reference(results, &reference);
    let written = Written {
        file: "overhead.parquet",
        heading: "collector overhead",
        reference: format!("{}={}", var.name, text(&reference[0].1)),
        against: format!(
            "against {}={} (the collector's effect: probed runs / baseline)",
            var.name,
            text(&reference[0].1)
        ),
    };
    written.write_and_print(dir, results, &rows, only)
}

/// `experiment results DIR --best-by FIGURE --over VAR`: writes
/// `labels.parquet` and prints the labels.
pub fn report_labels(
    dir: &ExpDir,
    record: &Record,
    results: &Results,
    figure: &str,
    over: &str,
    minimize: bool,
) -> Result<()> {
    let labels = best_by(&record.variables, results, figure, over, minimize)?;
    let batch = labels_batch(&labels, results).map_err(|e| ExperimentError::Results {
        path: dir.root.join("labels.parquet"),
        message: e.to_string(),
    })?;
    let path = write_in(dir, "labels.parquet", &batch)?;
    kernmlops::outln!();
    kernmlops::outln!(
        "labels: {} ({} rows, one per run; join on collection_id)",
        path.display(),
        batch.num_rows()
    );
    kernmlops::out!("{}", render_labels(&labels));
    Ok(())
}

/// `experiment compare A B`: B against A, written to `out` and printed.
pub fn report_between(a: &Results, b: &Results, out: &Path) -> Result<()> {
    let (names, rows, unmatched) = between(a, b)?;
    let types = column_types(b, &names);
    let against = format!("{} against {}", b.experiment, a.experiment);
    let batch = comparisons_batch(
        &names,
        &types,
        &rows,
        HashMap::from([
            ("kernmlops.experiment_a".to_owned(), a.experiment.clone()),
            ("kernmlops.experiment_b".to_owned(), b.experiment.clone()),
        ]),
    )
    .map_err(|e| ExperimentError::Results {
        path: out.to_owned(),
        message: e.to_string(),
    })?;
    write_parquet(out, &batch)?;
    kernmlops::outln!("comparison: {} ({} rows)", out.display(), rows.len());
    if !unmatched.is_empty() {
        kernmlops::outln!(
            "note: {} combination(s) of {} have no match in {}: {}",
            unmatched.len(),
            b.experiment,
            a.experiment,
            unmatched.join("; ")
        );
    }
    kernmlops::out!("{}", render_comparisons(&names, &rows, &against));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        results::Column,
        spec::{Form, Level},
    };
    use arrow_schema::DataType;

    fn column(name: &str, role: Role, kind: ColumnType, values: Vec<Json>) -> Column {
        Column {
            name: name.into(),
            role,
            kind,
            values,
            metadata: HashMap::new(),
        }
    }

    /// Results of `mode` x `level` with the given values per combination
    /// (rows in combination order); the last run of each is failed when
    /// `fail_last`.
    fn fixture(name: &str, combos: &[(&str, i64, &[f64])], fail_last: bool) -> Results {
        let mut mode = Vec::new();
        let mut level = Vec::new();
        let mut combo = Vec::new();
        let mut coll = Vec::new();
        let mut class = Vec::new();
        let mut value = Vec::new();
        for (m, l, vals) in combos {
            for (k, v) in vals.iter().enumerate() {
                mode.push(Json::from(*m));
                level.push(Json::from(*l));
                combo.push(Json::from(format!("{m}{l}")));
                coll.push(Json::from(format!("{name}-{m}{l}-{k}")));
                let failed = fail_last && k + 1 == vals.len();
                class.push(Json::from(if failed { "failed" } else { "curated" }));
                value.push(Json::from(*v));
            }
        }
        let rows = value.len();
        Results {
            experiment: name.into(),
            benchmark: "script".into(),
            rows,
            columns: vec![
                column("mode", Role::Variable, ColumnType::String, mode),
                column("level", Role::Variable, ColumnType::Int, level),
                column("combo_id", Role::Run, ColumnType::String, combo),
                column("collection_id", Role::Run, ColumnType::String, coll),
                column("run_class", Role::Run, ColumnType::String, class),
                column("result_value", Role::Result, ColumnType::Float, value),
            ],
        }
    }

    fn variables() -> Vec<Variable> {
        let var = |name: &str, values: Vec<Json>, default: Option<Json>| Variable {
            name: name.into(),
            key: format!("benchmarks.script.parameters.{name}"),
            form: Form::Values,
            levels: values
                .into_iter()
                .map(|value| Level { label: None, value })
                .collect(),
            when: vec![],
            default,
        };
        vec![
            var("mode", vec![Json::from("up"), Json::from("down")], None),
            var(
                "level",
                vec![Json::from(1), Json::from(2), Json::from(3)],
                Some(Json::from(2)),
            ),
        ]
    }

    const UP1: &[f64] = &[10.0, 11.0, 10.5, 10.2];
    const UP2: &[f64] = &[20.0, 21.0, 20.5, 19.8];
    const UP3: &[f64] = &[30.0, 31.0, 30.2, 29.9];
    const DN1: &[f64] = &[30.1, 30.9, 30.4, 30.0];
    const DN2: &[f64] = &[20.2, 20.9, 20.1, 20.6];
    const DN3: &[f64] = &[10.3, 10.8, 10.1, 10.0];

    fn sweep(name: &str) -> Results {
        fixture(
            name,
            &[
                ("up", 1, UP1),
                ("up", 2, UP2),
                ("up", 3, UP3),
                ("down", 1, DN1),
                ("down", 2, DN2),
                ("down", 3, DN3),
            ],
            false,
        )
    }

    #[test]
    fn references_are_parsed_against_the_variables() {
        let vars = variables();
        let r = parse_reference(&["level=2".into(), "mode=down".into()], &vars).expect("ok");
        assert_eq!(
            r,
            [
                ("level".to_owned(), Json::from(2)),
                ("mode".to_owned(), Json::from("down"))
            ]
        );
        for (bad, want) in [
            ("nope=1", "no variable \"nope\""),
            ("level=7", "\"7\" is not a value of level (values: 1, 2, 3)"),
            ("level", "give VAR=VALUE"),
        ] {
            let e = parse_reference(&[bad.into()], &vars)
                .expect_err(bad)
                .to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
        let e = parse_reference(&["level=1".into(), "level=2".into()], &vars)
            .expect_err("twice")
            .to_string();
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn each_combination_against_its_reference_with_holm_per_figure() {
        let results = sweep("a");
        let reference = vec![("level".to_owned(), Json::from(2))];
        let rows = against_reference(&results, &reference);
        assert_eq!(rows.len(), 6);
        for r in &rows {
            // The reference keeps the row's own mode.
            let want = format!("{}2", r.values[0].as_str().expect("mode"));
            assert_eq!(r.reference_combo_id.as_deref(), Some(want.as_str()));
            assert_eq!(r.is_reference, r.combo_id == want);
            assert_eq!(r.welch.is_some(), !r.is_reference);
        }
        let up1 = rows.iter().find(|r| r.combo_id == "up1").expect("up1");
        let w = compare::welch(UP1, UP2).expect("welch");
        assert_eq!(up1.welch, Some(w));
        assert_eq!(up1.ratio, compare::ratio(UP1, UP2));
        // Holm over the four tested rows.
        let p: Vec<f64> = rows.iter().filter_map(|r| r.welch.map(|w| w.p)).collect();
        let adj = compare::holm(&p);
        let got: Vec<f64> = rows.iter().filter_map(|r| r.p_holm).collect();
        assert_eq!(got, adj);
        let batch = comparisons_batch(
            &["mode".into(), "level".into()],
            &[ColumnType::String, ColumnType::Int],
            &rows,
            HashMap::new(),
        )
        .expect("batch");
        assert_eq!(batch.num_rows(), 6);
        let schema = batch.schema();
        assert_eq!(
            schema.field_with_name("level").expect("level").data_type(),
            &DataType::Int64
        );
        assert!(matches!(
            schema
                .field_with_name("outlier_runs")
                .expect("list")
                .data_type(),
            DataType::List(_)
        ));
        let text = render_comparisons(&["mode".into(), "level".into()], &rows, "against level=2");
        assert!(
            text.contains("mode=up level=1") && text.contains("(reference)"),
            "{text}"
        );
    }

    #[test]
    fn outliers_are_flagged_by_collection_and_failed_runs_left_out() {
        let results = fixture(
            "o",
            &[("up", 1, &[10.0, 10.1, 9.9, 10.0, 10.1, 50.0, 99.0])],
            true,
        );
        let rows = against_reference(&results, &[]);
        let r = &rows[0];
        // 99 is the failed run: not counted; 50 is flagged and kept.
        assert_eq!(r.subject.n, 6);
        assert_eq!(r.subject.outliers, ["o-up1-5"]);
        assert!(r.is_reference && r.welch.is_none());
    }

    #[test]
    fn best_by_labels_each_combination_with_regret_of_the_default() {
        let results = sweep("b");
        let record_vars = variables();
        let labels = best_of(&record_vars, &results, "value", "level", false);
        assert_eq!(labels.labels.len(), 2);
        let up = &labels.labels[0];
        assert_eq!(up.values, [Json::from("up")]);
        assert_eq!(up.best, Json::from(3));
        assert_eq!(
            up.runner_up.as_ref().map(|r| r.0.clone()),
            Some(Json::from(2))
        );
        assert!(up.p.is_some_and(|p| p < ALPHA));
        let (d, mean, regret) = up.default.clone().expect("default");
        assert_eq!(d, Json::from(2));
        let m2 = crate::stats::Summary::of(UP2).expect("s").mean;
        assert_eq!(mean, Some(m2));
        assert!((regret.expect("regret") - (up.best_mean - m2) / up.best_mean).abs() < 1e-12);
        assert_eq!(up.runs.len(), 12, "every run of the group");
        let down = &labels.labels[1];
        assert_eq!(down.best, Json::from(1));
        let min = best_of(&record_vars, &results, "result_value", "level", true);
        assert_eq!(min.labels[0].best, Json::from(1));
        assert_eq!(min.labels[1].best, Json::from(3));

        let batch = labels_batch(&labels, &results).expect("batch");
        assert_eq!(batch.num_rows(), 24);
        let schema = batch.schema();
        for (name, dt) in [
            ("mode", DataType::Utf8),
            ("level", DataType::Int64),
            ("best", DataType::Int64),
            ("collection_id", DataType::Utf8),
            ("regret", DataType::Float64),
        ] {
            assert_eq!(schema.field_with_name(name).expect(name).data_type(), &dt);
        }
        let text = render_labels(&labels);
        assert!(
            text.contains("mode=up: level=3") && text.contains("significant"),
            "{text}"
        );

        for (figure, over, want) in [
            ("nope", "level", "--best-by nope: not a numeric column"),
            ("value", "nope", "--over nope"),
        ] {
            let e = best_by(&record_vars, &results, figure, over, false)
                .expect_err(figure)
                .to_string();
            assert!(e.contains(want), "{e}");
        }
    }

    fn best_of(vars: &[Variable], results: &Results, f: &str, over: &str, min: bool) -> Labels {
        best_by(vars, results, f, over, min).expect("labels")
    }

    #[test]
    fn two_experiments_are_matched_on_their_variables() {
        let a = sweep("a");
        let b = fixture(
            "b",
            &[
                ("down", 2, &[25.0, 25.5, 25.2]),
                ("up", 3, &[30.1, 30.5, 29.8]),
                ("up", 9, &[1.0, 2.0]),
            ],
            false,
        );
        let (names, rows, unmatched) = between(&a, &b).expect("between");
        assert_eq!(names, ["mode", "level"]);
        assert_eq!(unmatched, ["mode=up level=9"]);
        assert_eq!(rows.len(), 2);
        let d2 = &rows[0];
        assert_eq!(d2.reference_combo_id.as_deref(), Some("down2"));
        assert!(!d2.is_reference, "same combo id, different runs");
        assert_eq!(d2.welch, compare::welch(&[25.0, 25.5, 25.2], DN2));
        assert!(d2.p_holm.is_some_and(|p| p < ALPHA));
        let up3 = &rows[1];
        assert!(up3.p_holm.is_some_and(|p| p > ALPHA), "{up3:?}");

        let mut other = sweep("c");
        other.columns.retain(|c| c.name != "mode");
        let e = between(&a, &other)
            .expect_err("different variables")
            .to_string();
        assert!(e.contains("vary different variables"), "{e}");
    }
}
