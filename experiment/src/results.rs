//! The results table: one row per run that left a finished collection,
//! written as `results.parquet` and `results.arrow` (the same table), and
//! the statistics per variable combination that `experiment results`
//! prints.
//!
//! Columns, in order: the variables (typed from their values: integers
//! stay integers; null where a conditional variable does not apply); the
//! run (`repeat`, `run_id`, `combo_id`, `collection_id`, `status`,
//! `run_class`, `hostname`, `slurm_job`: `<array job>_<task>` when Slurm
//! ran it, `exit_code`, `duration_s`: the collection's, `wall_time_s`:
//! the benchmark's, `overall_score`); every `@result` figure as
//! `result_<key>` and `@parameters` entry as `param_<key>`; the 16
//! `ru_*` rusage figures; `rows_<table>` and `lost_<table>` per table;
//! `energy_<source>_<zone>_j` per power zone when runs recorded power
//! (metadata: `kernmlops.kind` measured or modelled, `kernmlops.scope`,
//! `unit`); `machine.<knob>` per kernel knob the runs set (the value read
//! back); and `error`. Each field's metadata has `kernmlops.role`
//! (variable, run, result, parameter, rusage, table, energy, machine); variables also carry
//! `kernmlops.key` and `kernmlops.levels` (their values in declared order).

use std::{collections::HashMap, sync::Arc};

use arrow_array::{ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use serde_json::Value as Json;

use super::{
    plan::{label, PlannedRun},
    record::{ExpDir, Lock, Record},
    run_files::RunManifest,
    spec::{column_type, ColumnType},
    state::Observed,
    stats::Summary,
    ExperimentError, Result,
};
use kernmlops::{
    files,
    indicator::{IndicatorFile, CGROUP_FIELDS, RUSAGE_FIELDS},
    machine::Applied,
};

/// What a column holds, as `kernmlops.role` in its field metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Variable,
    Run,
    Result,
    Parameter,
    Rusage,
    Table,
    Energy,
    Machine,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Variable => "variable",
            Self::Run => "run",
            Self::Result => "result",
            Self::Parameter => "parameter",
            Self::Rusage => "rusage",
            Self::Table => "table",
            Self::Energy => "energy",
            Self::Machine => "machine",
        }
    }
}

/// One column of the results.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    pub role: Role,
    pub kind: ColumnType,
    pub values: Vec<Json>,
    pub metadata: HashMap<String, String>,
}

/// The results table of an experiment.
#[derive(Debug, Clone)]
pub struct Results {
    pub experiment: String,
    pub benchmark: String,
    pub rows: usize,
    pub columns: Vec<Column>,
}

/// A name as a column name part: lower case, anything but letters and
/// digits as `_`.
fn snake(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// A typed value as its JSON (an enum as its name in the files).
fn json_of<T: serde::Serialize>(value: &T) -> Json {
    serde_json::to_value(value).unwrap_or(Json::Null)
}

/// Text that is null where it is empty (a key the file did not have).
fn text_or_null(text: &str) -> Json {
    if text.is_empty() {
        Json::Null
    } else {
        Json::from(text)
    }
}

/// Names in order of first appearance, each once.
fn first_seen<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for name in names {
        if !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// Names sorted, each once.
fn sorted<'a>(names: impl IntoIterator<Item = &'a String>) -> Vec<&'a String> {
    let mut out: Vec<&String> = names.into_iter().collect();
    out.sort();
    out.dedup();
    out
}

/// The kernel knobs the runs set (`[machine]`, the manifest's `machine`
/// section), one `machine.<knob>` column each (`machine.sysctl.vm.swappiness`,
/// `machine.block.loop0.read_ahead_kb`) holding the value read back after
/// writing, in the order the knobs were first set: integers when every
/// value is one, else strings; null in runs that did not set it.
fn machine_columns(runs: &[&[Applied]]) -> Vec<(String, ColumnType, Vec<Json>)> {
    let names = first_seen(runs.iter().flat_map(|r| r.iter().map(|k| k.name.as_str())));
    names
        .into_iter()
        .map(|name| {
            let texts: Vec<Option<&str>> = runs
                .iter()
                .map(|run| {
                    run.iter()
                        .find(|k| k.name == name)
                        .map(|k| k.value.as_str())
                })
                .collect();
            let ints = texts.iter().flatten().all(|v| v.parse::<i64>().is_ok());
            let values = texts
                .iter()
                .map(|v| match v {
                    None => Json::Null,
                    Some(v) if ints => v.parse::<i64>().map_or(Json::Null, Json::from),
                    Some(v) => Json::from(*v),
                })
                .collect();
            let kind = if ints {
                ColumnType::Int
            } else {
                ColumnType::String
            };
            (format!("machine.{name}"), kind, values)
        })
        .collect()
}

/// One run with a finished collection, its files read through the host's
/// types.
struct Row<'a> {
    run: &'a PlannedRun,
    manifest: RunManifest,
    /// `None` when the run wrote no readable `indicator.json`.
    indicator: Option<IndicatorFile>,
}

impl Row<'_> {
    /// The runner's figures of `indicator.json`, rusage then cgroup, each
    /// as JSON (null where absent).
    fn runner_figures(&self) -> Vec<Json> {
        match &self.indicator {
            None => vec![Json::Null; RUSAGE_FIELDS.len() + CGROUP_FIELDS.len()],
            Some(i) => i
                .rusage
                .entries()
                .map(|(_, v)| v)
                .chain(i.cgroup.fields().map(|(_, v)| Json::from(v)))
                .collect(),
        }
    }

    /// `<array job>_<task>` of the Slurm task that ran it, or the job.
    fn slurm_job(&self) -> Json {
        match &self.manifest.manifest.slurm {
            None => Json::Null,
            Some(s) => match (s.array_job_id, s.array_task_id) {
                (Some(j), Some(t)) => Json::from(format!("{j}_{t}")),
                _ => Json::from(s.job_id.to_string()),
            },
        }
    }

    /// The benchmark's exit code: the manifest's, else the indicator's.
    fn exit_code(&self) -> Json {
        let manifest = self.manifest.manifest.benchmark.as_ref();
        manifest
            .and_then(|b| b.exit_code)
            .or(self.indicator.as_ref().and_then(|i| i.exit_code))
            .map_or(Json::Null, Json::from)
    }

    /// The collection's length, from the manifest's start and end.
    fn duration_s(&self) -> Json {
        let m = &self.manifest.manifest;
        m.end.as_ref().map_or(Json::Null, |end| {
            Json::from((end.unix_us - m.start.unix_us) as f64 / 1e6)
        })
    }

    /// The first reason given for a failure: the benchmark's, the run's
    /// first error, or why the benchmark's result could not be used.
    fn error(&self) -> Json {
        let m = &self.manifest.manifest;
        m.benchmark
            .as_ref()
            .and_then(|b| b.error.clone())
            .or_else(|| m.errors.first().cloned())
            .or_else(|| self.indicator.as_ref().and_then(|i| i.error.clone()))
            .map_or(Json::Null, Json::from)
    }

    /// Energy of zone `zone` of power source `source`, in joules.
    fn energy_j(&self, source: &str, zone: &str) -> Json {
        let power = self.manifest.manifest.power.as_ref();
        power
            .into_iter()
            .flat_map(|p| &p.sources)
            .filter(|s| s.name == source)
            .flat_map(|s| &s.zones)
            .find(|z| z.name == zone)
            .map_or(Json::Null, |z| Json::from(z.energy_uj as f64 / 1e6))
    }
}

/// Reads every run with a finished collection (`observed` in the record's
/// run order), sorted by combination (variables in declared order) and
/// repeat. A run whose manifest cannot be read is left out.
fn read_rows<'a>(dir: &ExpDir, record: &'a Record, observed: &[Observed]) -> Vec<Row<'a>> {
    let mut rows: Vec<Row<'a>> = record
        .runs
        .iter()
        .zip(observed)
        .filter(|(_, o)| o.has_collection)
        .filter_map(|(run, _)| {
            let d = dir.run(&run.run_id);
            Some(Row {
                run,
                manifest: RunManifest::read(&d).ok()?,
                indicator: IndicatorFile::read(&d).ok(),
            })
        })
        .collect();
    let position = |run: &PlannedRun| -> Vec<Option<usize>> {
        record
            .variables
            .iter()
            .map(|v| {
                let value = run.variables.get(&v.name).unwrap_or(&Json::Null);
                v.levels.iter().position(|l| &l.column() == value)
            })
            .collect()
    };
    rows.sort_by_key(|r| (position(r.run), r.run.repeat));
    rows
}

/// The columns, built in their order from the rows.
struct Builder<'a> {
    rows: &'a [Row<'a>],
    columns: Vec<Column>,
}

impl<'a> Builder<'a> {
    /// Adds a column; its type is `kind`, or inferred from its values.
    fn push(
        &mut self,
        name: String,
        role: Role,
        kind: Option<ColumnType>,
        values: Vec<Json>,
    ) -> &mut Column {
        let kind = kind.unwrap_or_else(|| column_type(values.iter().cloned()));
        self.columns.push(Column {
            name,
            role,
            kind,
            values,
            metadata: HashMap::from([("kernmlops.role".to_owned(), role.as_str().to_owned())]),
        });
        let last = self.columns.len() - 1;
        &mut self.columns[last]
    }

    /// A run column of type `kind`: `value` of each row.
    fn run(&mut self, name: &str, kind: ColumnType, value: impl Fn(&Row<'a>) -> Json) {
        let values = self.rows.iter().map(value).collect();
        self.push(name.into(), Role::Run, Some(kind), values);
    }

    /// The variables, typed by their levels, with their key and levels.
    fn variables(&mut self, record: &Record) {
        for v in &record.variables {
            let values = self
                .rows
                .iter()
                .map(|r| r.run.variables.get(&v.name).cloned().unwrap_or(Json::Null))
                .collect();
            let column = self.push(
                v.name.clone(),
                Role::Variable,
                Some(v.column_type()),
                values,
            );
            column
                .metadata
                .insert("kernmlops.key".into(), v.key.clone());
            let levels: Vec<Json> = v.levels.iter().map(|l| l.column()).collect();
            column
                .metadata
                .insert("kernmlops.levels".into(), Json::from(levels).to_string());
        }
    }

    /// What identifies each run and how it went.
    fn run_columns(&mut self) {
        use ColumnType::{Float, Int, String};
        self.run("repeat", Int, |r| Json::from(r.run.repeat));
        self.run("run_id", String, |r| Json::from(r.run.run_id.clone()));
        self.run("combo_id", String, |r| Json::from(r.run.combo_id.clone()));
        self.run("collection_id", String, |r| {
            text_or_null(&r.manifest.manifest.collection_id)
        });
        self.run("status", String, |r| json_of(&r.manifest.manifest.status));
        self.run("run_class", String, |r| {
            json_of(&r.manifest.manifest.run_class)
        });
        self.run("hostname", String, |r| {
            text_or_null(&r.manifest.manifest.hostname)
        });
        self.run("slurm_job", String, Row::slurm_job);
        self.run("exit_code", Int, Row::exit_code);
        self.run("duration_s", Float, Row::duration_s);
        self.run("wall_time_s", Float, |r| {
            Json::from(r.indicator.as_ref().and_then(|i| i.wall_time_s))
        });
        self.run("overall_score", Float, |r| {
            Json::from(r.indicator.as_ref().and_then(|i| i.indicator.overall_score))
        });
    }

    /// Every `@result` figure as `result_<key>`, then every `@parameters`
    /// entry as `param_<key>`, keys sorted, typed from their values.
    fn indicator_columns(&mut self) {
        type Section = fn(&IndicatorFile) -> &serde_json::Map<std::string::String, Json>;
        let sections: [(&str, Role, Section); 2] = [
            ("result_", Role::Result, |i| &i.indicator.result),
            ("param_", Role::Parameter, |i| &i.indicator.parameters),
        ];
        for (prefix, role, section) in sections {
            let rows = self.rows;
            let keys = sorted(
                rows.iter()
                    .flat_map(|r| r.indicator.iter().flat_map(|i| section(i).keys())),
            );
            for key in keys {
                let values = rows
                    .iter()
                    .map(|r| {
                        r.indicator
                            .as_ref()
                            .and_then(|i| section(i).get(key).cloned())
                            .unwrap_or(Json::Null)
                    })
                    .collect();
                self.push(format!("{prefix}{key}"), role, None, values);
            }
        }
    }

    /// The rusage figures, then the cgroup's, each where any run has it.
    fn runner_columns(&mut self) {
        let per_row: Vec<Vec<Json>> = self.rows.iter().map(Row::runner_figures).collect();
        let names = RUSAGE_FIELDS.iter().chain(&CGROUP_FIELDS).map(|f| f.0);
        for (k, name) in names.enumerate() {
            if per_row.iter().any(|figures| !figures[k].is_null()) {
                let values = per_row.iter().map(|figures| figures[k].clone()).collect();
                self.push(name.into(), Role::Rusage, None, values);
            }
        }
    }

    /// `rows_<table>` then `lost_<table>` per table of any run, sorted.
    fn table_columns(&mut self) {
        let rows = self.rows;
        let tables = sorted(rows.iter().flat_map(|r| r.manifest.manifest.tables.keys()));
        for (prefix, lost) in [("rows_", false), ("lost_", true)] {
            for t in &tables {
                let values = rows
                    .iter()
                    .map(|r| {
                        let entry = r.manifest.manifest.tables.get(*t);
                        entry.map_or(Json::Null, |e| {
                            Json::from(if lost { e.lost_events } else { e.rows })
                        })
                    })
                    .collect();
                self.push(
                    format!("{prefix}{t}"),
                    Role::Table,
                    Some(ColumnType::Int),
                    values,
                );
            }
        }
    }

    /// Runs with roles: `node_<role>`, each role's node.
    fn role_columns(&mut self) {
        let rows = self.rows;
        for role in sorted(rows.iter().flat_map(|r| r.manifest.roles.keys())) {
            self.run(&format!("node_{role}"), ColumnType::String, |r| {
                r.manifest
                    .roles
                    .get(role)
                    .map_or(Json::Null, |e| Json::from(e.node.clone()))
            });
        }
    }

    /// Energy per power zone (`--power`), in joules, in the order zones
    /// first appear; the zone's source, name, kind (measured or modelled)
    /// and scope in the field's metadata.
    fn energy_columns(&mut self) {
        let rows = self.rows;
        let zones = rows
            .iter()
            .filter_map(|r| r.manifest.manifest.power.as_ref())
            .flat_map(|p| &p.sources)
            .flat_map(|s| s.zones.iter().map(move |z| (s, z)));
        let mut seen: Vec<(&str, &str)> = Vec::new();
        for (source, zone) in zones {
            if seen.contains(&(source.name.as_str(), zone.name.as_str())) {
                continue;
            }
            seen.push((&source.name, &zone.name));
            let values = rows
                .iter()
                .map(|r| r.energy_j(&source.name, &zone.name))
                .collect();
            let name = format!("energy_{}_{}_j", snake(&source.name), snake(&zone.name));
            let column = self.push(name, Role::Energy, Some(ColumnType::Float), values);
            for (key, value) in [
                ("kernmlops.source", &source.name),
                ("kernmlops.zone", &zone.name),
                ("kernmlops.kind", &zone.kind),
                ("kernmlops.scope", &zone.scope),
            ] {
                column.metadata.insert(key.into(), value.clone());
            }
            column.metadata.insert("unit".into(), "J".into());
        }
    }
}

impl Results {
    /// Reads every run with a finished collection (`observed` in the
    /// record's run order), rows sorted by combination (variables in
    /// declared order) and repeat.
    pub fn collect(dir: &ExpDir, record: &Record, observed: &[Observed]) -> Self {
        let rows = read_rows(dir, record, observed);
        let mut b = Builder {
            rows: &rows,
            columns: Vec::new(),
        };
        b.variables(record);
        b.run_columns();
        b.indicator_columns();
        b.runner_columns();
        b.table_columns();
        b.role_columns();
        b.energy_columns();
        let knobs: Vec<&[Applied]> = rows
            .iter()
            .map(|r| &r.manifest.manifest.machine[..])
            .collect();
        for (name, kind, values) in machine_columns(&knobs) {
            b.push(name, Role::Machine, Some(kind), values);
        }
        b.run("error", ColumnType::String, Row::error);
        Self {
            experiment: record.name.clone(),
            benchmark: record.identity.benchmark.clone(),
            rows: rows.len(),
            columns: b.columns,
        }
    }

    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The table as one Arrow record batch.
    pub fn to_batch(&self) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
        let mut fields = Vec::new();
        let mut arrays: Vec<ArrayRef> = Vec::new();
        for c in &self.columns {
            let (dt, array): (DataType, ArrayRef) = match c.kind {
                ColumnType::Int => (
                    DataType::Int64,
                    Arc::new(Int64Array::from(
                        c.values.iter().map(Json::as_i64).collect::<Vec<_>>(),
                    )),
                ),
                ColumnType::Float => (
                    DataType::Float64,
                    Arc::new(Float64Array::from(
                        c.values.iter().map(Json::as_f64).collect::<Vec<_>>(),
                    )),
                ),
                ColumnType::Bool => (
                    DataType::Boolean,
                    Arc::new(BooleanArray::from(
                        c.values.iter().map(Json::as_bool).collect::<Vec<_>>(),
                    )),
                ),
                ColumnType::String => (
                    DataType::Utf8,
                    Arc::new(StringArray::from(
                        c.values
                            .iter()
                            .map(|v| match v {
                                Json::Null => None,
                                Json::String(s) => Some(s.clone()),
                                other => Some(other.to_string()),
                            })
                            .collect::<Vec<_>>(),
                    )),
                ),
            };
            fields.push(Field::new(&c.name, dt, true).with_metadata(c.metadata.clone()));
            arrays.push(array);
        }
        let variables: Vec<&str> = self
            .columns
            .iter()
            .filter(|c| c.role == Role::Variable)
            .map(|c| c.name.as_str())
            .collect();
        let schema = Schema::new(fields).with_metadata(HashMap::from([
            ("kernmlops.experiment".to_owned(), self.experiment.clone()),
            ("kernmlops.benchmark".to_owned(), self.benchmark.clone()),
            (
                "kernmlops.variables".to_owned(),
                Json::from(variables).to_string(),
            ),
        ]));
        let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(self.rows));
        RecordBatch::try_new_with_options(Arc::new(schema), arrays, &options)
    }

    /// Writes `results.parquet` and `results.arrow`, each atomically.
    /// Writers of one folder take turns (the `locks/results.lock` lock),
    /// and each streams into a temporary file of its own with a fresh
    /// hidden name, so no writer sees or replaces another's half-written
    /// file, and a reader finds whole results files from the first write
    /// on.
    pub fn write(&self, dir: &ExpDir) -> Result<()> {
        let parquet_path = dir.results_parquet();
        let fail = |path: &std::path::Path| {
            let path = path.to_owned();
            move |e: String| ExperimentError::Results { path, message: e }
        };
        let batch = self
            .to_batch()
            .map_err(|e| fail(&parquet_path)(e.to_string()))?;
        let locks = dir.locks();
        if !locks.is_dir() {
            std::fs::create_dir_all(&locks).map_err(ExperimentError::io(&locks))?;
        }
        let _turn = Lock::take(&dir.results_lock())?;

        let mut tmp = files::atomic(&parquet_path).map_err(ExperimentError::io(&parquet_path))?;
        let props = parquet::file::properties::WriterProperties::builder()
            .set_compression(parquet::basic::Compression::SNAPPY)
            .build();
        let mut w = parquet::arrow::ArrowWriter::try_new(&mut tmp, batch.schema(), Some(props))
            .map_err(|e| fail(&parquet_path)(e.to_string()))?;
        w.write(&batch)
            .and_then(|()| w.close().map(drop))
            .map_err(|e| fail(&parquet_path)(e.to_string()))?;
        tmp.commit().map_err(|e| {
            ExperimentError::io(&parquet_path)(files::without_path(e, &parquet_path))
        })?;

        let arrow_path = dir.results_arrow();
        let mut tmp = files::atomic(&arrow_path).map_err(ExperimentError::io(&arrow_path))?;
        let mut w = arrow_ipc::writer::FileWriter::try_new(&mut tmp, &batch.schema())
            .map_err(|e| fail(&arrow_path)(e.to_string()))?;
        w.write(&batch)
            .and_then(|()| w.finish())
            .map_err(|e| fail(&arrow_path)(e.to_string()))?;
        drop(w);
        tmp.commit()
            .map_err(|e| ExperimentError::io(&arrow_path)(files::without_path(e, &arrow_path)))
    }

    /// Each row's value of a numeric column (None where null or not a
    /// number).
    pub fn numbers(&self, name: &str) -> Vec<Option<f64>> {
        self.column(name)
            .map(|c| c.values.iter().map(Json::as_f64).collect())
            .unwrap_or_else(|| vec![None; self.rows])
    }

    /// Names of the `@result` figures present, without the prefix.
    pub fn result_keys(&self) -> Vec<String> {
        self.columns
            .iter()
            .filter(|c| c.role == Role::Result)
            .map(|c| c.name.trim_start_matches("result_").to_owned())
            .collect()
    }
}

/// Statistics of one variable combination.
#[derive(Debug, Clone)]
pub struct ComboSummary {
    pub combo_id: String,
    /// `name=value ...` of its variables.
    pub label: String,
    /// Runs with data, and how many of them failed (failed runs are not in
    /// the statistics).
    pub runs: usize,
    pub failed: usize,
    /// (column, summary) of each numeric figure.
    pub figures: Vec<(String, Summary)>,
}

/// The numeric figures summarised: every numeric `@result` figure, then
/// `overall_score`, the benchmark's wall time and each power zone's energy.
pub fn figure_columns(results: &Results) -> Vec<&Column> {
    let numeric = |c: &&Column| matches!(c.kind, ColumnType::Int | ColumnType::Float);
    let mut out: Vec<&Column> = results
        .columns
        .iter()
        .filter(|c| c.role == Role::Result)
        .filter(numeric)
        .collect();
    out.extend(
        ["overall_score", "wall_time_s"]
            .iter()
            .filter_map(|n| results.column(n))
            .filter(|c| c.values.iter().any(|v| !v.is_null())),
    );
    out.extend(results.columns.iter().filter(|c| c.role == Role::Energy));
    out
}

/// Row indices per combination, in row order.
pub fn groups(results: &Results) -> Vec<(String, Vec<usize>)> {
    let mut out: Vec<(String, Vec<usize>)> = Vec::new();
    let Some(combos) = results.column("combo_id") else {
        return out;
    };
    for (i, c) in combos.values.iter().enumerate() {
        let id = c.as_str().unwrap_or("").to_owned();
        match out.iter_mut().find(|(k, _)| *k == id) {
            Some((_, rows)) => rows.push(i),
            None => out.push((id, vec![i])),
        }
    }
    out
}

/// Whether row `i` counts in the statistics (its run did not fail).
fn counts(results: &Results, i: usize) -> bool {
    results
        .column("run_class")
        .and_then(|c| c.values[i].as_str())
        .is_some_and(|class| class != "failed")
}

/// Values of `column` over the rows of a combination that count.
pub fn values(results: &Results, column: &str, rows: &[usize]) -> Vec<f64> {
    let all = results.numbers(column);
    rows.iter()
        .filter(|&&i| counts(results, i))
        .filter_map(|&i| all[i])
        .collect()
}

/// Statistics per combination.
pub fn summarize(record: &Record, results: &Results) -> Vec<ComboSummary> {
    let figures = figure_columns(results);
    groups(results)
        .into_iter()
        .map(|(combo_id, rows)| {
            let run = record.runs.iter().find(|r| r.combo_id == combo_id);
            let label = run
                .map(|r| label(&record.variables, &r.variables))
                .unwrap_or_default();
            let failed = rows.iter().filter(|&&i| !counts(results, i)).count();
            let figures = figures
                .iter()
                .filter_map(|c| {
                    Summary::of(&values(results, &c.name, &rows)).map(|s| (c.name.clone(), s))
                })
                .collect();
            ComboSummary {
                combo_id,
                label,
                runs: rows.len(),
                failed,
                figures,
            }
        })
        .collect()
}

/// A number with about six significant digits, in scientific notation
/// when very large or small.
pub fn number(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let a = x.abs();
    if !(1e-3..1e9).contains(&a) {
        return format!("{x:.4e}");
    }
    let digits = a.log10().floor() as i32;
    let decimals = (5 - digits).clamp(0, 6) as usize;
    let text = format!("{x:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

/// The summary as `experiment results` prints it.
pub fn render(summaries: &[ComboSummary]) -> String {
    let mut out = String::new();
    // One width for every combination's table, so they line up.
    let width = summaries
        .iter()
        .flat_map(|s| &s.figures)
        .map(|(n, _)| n.trim_start_matches("result_").len())
        .max()
        .unwrap_or(6)
        .max(6);
    for s in summaries {
        let name = if s.label.is_empty() {
            "all runs"
        } else {
            s.label.as_str()
        };
        out.push_str(&format!(
            "{name}: {} run{}{}\n",
            s.runs,
            if s.runs == 1 { "" } else { "s" },
            if s.failed > 0 {
                format!(" ({} failed, not counted)", s.failed)
            } else {
                String::new()
            }
        ));
        if s.figures.is_empty() {
            out.push_str("  (no numeric results)\n");
            continue;
        }
        out.push_str(&format!(
            "  {:<width$} {:>3} {:>14} {:>12}  {:<31} {:>7}\n",
            "figure", "n", "mean", "sd", "95% CI", "±"
        ));
        for (col, f) in &s.figures {
            let name = col.trim_start_matches("result_");
            let sd = f.sd.map_or("-".into(), number);
            let (ci, rel) = match (f.ci(), f.relative_half_width()) {
                (Some((lo, hi)), Some(rel)) => (
                    format!("[{}, {}]", number(lo), number(hi)),
                    if rel.is_finite() {
                        format!("{:.1}%", rel * 100.0)
                    } else {
                        "-".into()
                    },
                ),
                _ => ("-".into(), "-".into()),
            };
            out.push_str(&format!(
                "  {name:<width$} {:>3} {:>14} {:>12}  {ci:<31} {rel:>7}\n",
                f.n,
                number(f.mean),
                sd
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        plan::{plan, Identity, PlanInput},
        record::FORMAT,
        spec::{Order, Spec},
        state::{observe, RunState},
    };

    /// A record of a 2x1 sweep with 2 repeats and fabricated collections.
    fn fixture(name: &str) -> (ExpDir, Record) {
        let root = std::env::temp_dir().join(format!("kml-results-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dir = ExpDir::new(&root);
        dir.create().expect("layout");
        let spec = Spec::parse(
            "exp.toml",
            "name = \"t\"\nbenchmark = \"script\"\n\
             [variables.n]\nvalues = [1, 2]\n\
             [variables.mode]\nvalues = [\"a\", \"b\"]\nwhen = { n = 2 }\n",
        )
        .expect("spec");
        let identity = Identity {
            benchmark: "script".into(),
            probes: vec![],
            power: None,
        };
        let runs = plan(&PlanInput {
            file: "exp.toml",
            variables: &spec.variables,
            base: &spec.config,
            identity: &identity,
            repeats: 2,
            seed: 1,
            order: Order::Shuffled,
        })
        .expect("plan");
        let record = Record {
            format: FORMAT,
            name: "t".into(),
            created_utc: String::new(),
            updated_utc: String::new(),
            kernmlops_version: String::new(),
            kernmlops_sha256: String::new(),
            source_file: String::new(),
            identity,
            seed: 1,
            seed_from: "file".into(),
            order: Order::Shuffled,
            repeats: 2,
            warmup: 0,
            variables: spec.variables.clone(),
            plugin_dir: String::new(),
            device: None,
            plugins: vec![],
            adaptive: None,
            runs,
        };
        (dir, record)
    }

    fn write_run(dir: &ExpDir, run_id: &str, class: &str, rate: f64, extra: &str) {
        let d = dir.run(run_id);
        std::fs::create_dir_all(&d).expect("run dir");
        std::fs::write(
            d.join("manifest.json"),
            format!(
                r#"{{"collection_id": "c-{run_id}", "status": "complete", "run_class": "{class}",
                "start": {{"uptime_us": 1, "unix_us": 1000000, "utc": "a"}},
                "end": {{"uptime_us": 2, "unix_us": 3500000, "utc": "b"}},
                "benchmark": {{"exit_code": 0, "stopped_by": null, "error": null}},
                "errors": [], "tables": {{"quanta_runtime": {{"probe": "quanta_runtime",
                    "file": "quanta_runtime.arrow", "rows": 10, "lost_events": 0}}}}}}"#
            ),
        )
        .expect("manifest");
        std::fs::write(
            d.join("indicator.json"),
            format!(
                r#"{{"name": "s", "component": "s", "@parameters": {{"size": 4}},
                "@result": {{"rate": {rate}, "ops": 7, "unit": "x"{extra}}},
                "exit_code": 0, "wall_time_s": 2.0, "ru_utime": 0.5, "ru_maxrss": 1000}}"#
            ),
        )
        .expect("indicator");
    }

    #[test]
    fn one_row_per_finished_run_with_typed_columns() {
        let (dir, record) = fixture("rows");
        // Five runs: four finished (one failed), one cut off, one pending.
        let ids: Vec<&str> = record.runs.iter().map(|r| r.run_id.as_str()).collect();
        for (k, id) in ids.iter().enumerate().take(4) {
            let class = if k == 3 { "failed" } else { "curated" };
            write_run(&dir, id, class, 100.5 + k as f64, "");
        }
        std::fs::create_dir_all(dir.run(ids[4])).expect("cut off");
        let observed = observe(&dir, &record, &[]);
        assert_eq!(observed[4].state, RunState::CutOff);
        let results = Results::collect(&dir, &record, &observed);
        assert_eq!(results.rows, 4);
        let batch = results.to_batch().expect("batch");
        assert_eq!(batch.num_rows(), 4);
        let schema = batch.schema();
        let dt = |n: &str| schema.field_with_name(n).expect(n).data_type().clone();
        assert_eq!(dt("n"), DataType::Int64, "integers stay integers");
        assert_eq!(dt("mode"), DataType::Utf8);
        assert_eq!(dt("repeat"), DataType::Int64);
        assert_eq!(dt("result_rate"), DataType::Float64);
        assert_eq!(dt("result_ops"), DataType::Int64);
        assert_eq!(dt("result_unit"), DataType::Utf8);
        assert_eq!(dt("param_size"), DataType::Int64);
        assert_eq!(dt("ru_utime"), DataType::Float64);
        assert_eq!(dt("ru_maxrss"), DataType::Int64);
        assert_eq!(dt("rows_quanta_runtime"), DataType::Int64);
        assert_eq!(dt("duration_s"), DataType::Float64);
        assert_eq!(
            schema.field_with_name("n").expect("n").metadata()["kernmlops.role"],
            "variable"
        );
        assert_eq!(
            schema.field_with_name("mode").expect("mode").metadata()["kernmlops.levels"],
            r#"["a","b"]"#
        );
        // Conditional: mode is null where n = 1.
        let n = &results.column("n").expect("n").values;
        let mode = &results.column("mode").expect("mode").values;
        for (n, mode) in n.iter().zip(mode) {
            assert_eq!(mode.is_null(), *n == 1, "n {n} mode {mode}");
        }
        assert_eq!(results.numbers("duration_s")[0], Some(2.5));
        // Rows are sorted by combination.
        let ns: Vec<i64> = n.iter().filter_map(Json::as_i64).collect();
        let mut sorted = ns.clone();
        sorted.sort_unstable();
        assert_eq!(ns, sorted);

        // Files: Parquet and Arrow, readable back.
        results.write(&dir).expect("write");
        let file = std::fs::File::open(dir.results_arrow()).expect("arrow");
        let reader = arrow_ipc::reader::FileReader::try_new(file, None).expect("reader");
        let rows: usize = reader.map(|b| b.expect("batch").num_rows()).sum();
        assert_eq!(rows, 4);
        let file = std::fs::File::open(dir.results_parquet()).expect("parquet");
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .expect("parquet reader")
            .build()
            .expect("build");
        let rows: usize = reader.map(|b| b.expect("batch").num_rows()).sum();
        assert_eq!(rows, 4);

        // Statistics leave the failed run out.
        let summaries = summarize(&record, &results);
        let total: usize = summaries.iter().map(|s| s.runs).sum();
        assert_eq!(total, 4);
        let failed: usize = summaries.iter().map(|s| s.failed).sum();
        assert_eq!(failed, 1);
        let text = render(&summaries);
        assert!(text.contains("rate") && text.contains("95% CI"), "{text}");
        assert!(!text.contains("result_unit"), "strings are not summarised");
        let _ = std::fs::remove_dir_all(&dir.root);
    }

    /// A roles run that never collected (only the experiment layer's
    /// manifest) is a row with what it has: no collection id, its status,
    /// error, tables and each role's node; the host's keys (Slurm, power)
    /// come through their types.
    #[test]
    fn a_roles_run_without_a_collection_and_typed_sections() {
        let (dir, record) = fixture("roles");
        let ids: Vec<&str> = record.runs.iter().map(|r| r.run_id.as_str()).collect();
        write_run(&dir, ids[0], "curated", 1.0, "");
        let manifest = |id: &str, text: &str| {
            let d = dir.run(id);
            std::fs::create_dir_all(&d).expect("run dir");
            std::fs::write(d.join("manifest.json"), text).expect("manifest");
        };
        manifest(
            ids[1],
            r#"{"status": "failed", "run_class": "failed", "errors": ["role s was not ready"],
                "hostname": "vm", "executor": "local",
                "tables": {"s_system_info": {"probe": "", "file": "f", "rows": 1, "lost_events": 0}},
                "roles": {"s": {"node": "vm", "started": true}, "c": {"node": "vm"}}}"#,
        );
        let observed = observe(&dir, &record, &[]);
        let results = Results::collect(&dir, &record, &observed);
        assert_eq!(results.rows, 2);
        let row = |name: &str| -> Vec<Json> {
            let c = results
                .column(name)
                .unwrap_or_else(|| panic!("column {name}"));
            c.values.clone()
        };
        let roles_row = row("run_id")
            .iter()
            .position(|v| v == ids[1])
            .expect("the roles run has a row");
        assert_eq!(row("collection_id")[roles_row], Json::Null);
        assert_eq!(row("status")[roles_row], "failed");
        assert_eq!(row("error")[roles_row], "role s was not ready");
        assert_eq!(row("duration_s")[roles_row], Json::Null);
        assert_eq!(row("rows_s_system_info")[roles_row], 1);
        assert_eq!(row("node_s")[roles_row], "vm");
        assert_eq!(row("node_c")[1 - roles_row], Json::Null);
        assert_eq!(row("wall_time_s")[1 - roles_row], 2.0);
        let _ = std::fs::remove_dir_all(&dir.root);
    }

    #[test]
    fn empty_results_still_have_their_schema() {
        let (dir, record) = fixture("empty");
        let observed = observe(&dir, &record, &[]);
        let results = Results::collect(&dir, &record, &observed);
        assert_eq!(results.rows, 0);
        let batch = results.to_batch().expect("batch");
        assert_eq!(batch.num_rows(), 0);
        assert!(batch.schema().field_with_name("n").is_ok());
        results.write(&dir).expect("write");
        assert!(summarize(&record, &results).is_empty());
        let _ = std::fs::remove_dir_all(&dir.root);
    }

    #[test]
    fn numbers_keep_six_digits() {
        assert_eq!(number(8568.912), "8568.91");
        assert_eq!(number(8568.9), "8568.9");
        assert_eq!(number(2.0), "2");
        assert_eq!(number(0.012345678), "0.012346");
        assert_eq!(number(35098482.0), "35098482");
        assert_eq!(number(2.5e10), "2.5000e10");
        assert_eq!(number(0.0), "0");
    }

    #[test]
    fn knobs_read_back_become_machine_columns() {
        let run = |knobs: &[(&str, &str)]| -> Vec<Applied> {
            knobs
                .iter()
                .map(|(n, v)| Applied {
                    name: (*n).into(),
                    path: "/x".into(),
                    requested: "1".into(),
                    previous: "0".into(),
                    value: (*v).into(),
                })
                .collect()
        };
        let a = run(&[
            ("sysctl.vm.swappiness", "10"),
            ("block.loop0.scheduler", "none"),
        ]);
        let b = run(&[("sysctl.vm.swappiness", "20")]);
        let c = run(&[]);
        let cols = machine_columns(&[&a, &b, &c]);
        assert_eq!(cols.len(), 2);
        assert_eq!(cols[0].0, "machine.sysctl.vm.swappiness");
        assert_eq!(cols[0].1, ColumnType::Int);
        assert_eq!(cols[0].2, vec![Json::from(10), Json::from(20), Json::Null]);
        assert_eq!(cols[1].0, "machine.block.loop0.scheduler");
        assert_eq!(cols[1].1, ColumnType::String);
        assert_eq!(cols[1].2, vec![Json::from("none"), Json::Null, Json::Null]);
    }
}
