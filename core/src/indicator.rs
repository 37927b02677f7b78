//! A benchmark run's own result, next to the kernel data: `indicator.json`
//! in the performance-indicator format (`name`, `component`,
//! `@parameters`, `@result`, optional `overall_score`) with the runner's
//! additions (exit code, wall time, the 16 `getrusage(RUSAGE_CHILDREN)`
//! figures of the benchmark's processes), and the same figures as the
//! one-row `performance_indicator` table, flattened into `param_*` and
//! `result_*` columns so it joins the kernel tables by `collection_id`.

use std::{path::Path, sync::Arc};

use arrow_array::{
    ArrayRef, BooleanArray, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
    UInt64Array,
};
use arrow_schema::DataType;
use serde_json::{Map, Value};

use crate::decode::{self, HostColumn};

/// The table the figures go to.
pub const TABLE: &str = "performance_indicator";
/// The file beside the tables.
pub const FILE: &str = "indicator.json";

/// Why a benchmark's reported result is not a valid indicator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndicatorError {
    #[error("the benchmark's result is not JSON: {0}")]
    NotJson(String),
    #[error("the benchmark's result is not a JSON object")]
    NotAnObject,
    #[error("the benchmark's result has no \"@result\" object")]
    MissingResult,
    #[error("\"{0}\" must be a JSON object")]
    NotATable(&'static str),
    #[error("key {0:?} is in both \"@parameters\" and \"@result\"")]
    Collision(String),
    #[error("\"overall_score\" must be a number")]
    BadScore,
}

/// The benchmark's part of an indicator, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Indicator {
    pub name: String,
    pub component: String,
    pub parameters: Map<String, Value>,
    pub result: Map<String, Value>,
    pub overall_score: Option<f64>,
}

impl Indicator {
    /// Parses and checks what a benchmark reported. `name` and `component`
    /// default to the benchmark's name when missing.
    pub fn parse(text: &str, benchmark: &str) -> Result<Self, IndicatorError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| IndicatorError::NotJson(e.to_string()))?;
        let Value::Object(mut obj) = value else {
            return Err(IndicatorError::NotAnObject);
        };
        let text_of = |v: Option<Value>| match v {
            Some(Value::String(s)) if !s.is_empty() => Some(s),
            _ => None,
        };
        let name = text_of(obj.remove("name")).unwrap_or_else(|| benchmark.to_owned());
        // Older indicators say `framework`.
        let component = text_of(obj.remove("component"))
            .or_else(|| text_of(obj.remove("framework")))
            .unwrap_or_else(|| benchmark.to_owned());
        let table = |obj: &mut Map<String, Value>, key: &'static str, required: bool| match obj
            .remove(key)
        {
            Some(Value::Object(m)) => Ok(m),
            None | Some(Value::Null) if !required => Ok(Map::new()),
            None => Err(IndicatorError::MissingResult),
            Some(_) => Err(IndicatorError::NotATable(key)),
        };
        let parameters = table(&mut obj, "@parameters", false)?;
        let result = table(&mut obj, "@result", true)?;
        if let Some(k) = parameters.keys().find(|k| result.contains_key(*k)) {
            return Err(IndicatorError::Collision(k.clone()));
        }
        let overall_score = match obj.remove("overall_score") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => n.as_f64(),
            Some(_) => return Err(IndicatorError::BadScore),
        };
        Ok(Self {
            name,
            component,
            parameters,
            result,
            overall_score,
        })
    }

    /// An indicator with no result, for benchmarks that report none.
    pub fn empty(benchmark: &str) -> Self {
        Self {
            name: benchmark.to_owned(),
            component: benchmark.to_owned(),
            parameters: Map::new(),
            result: Map::new(),
            overall_score: None,
        }
    }
}

/// The 16 `getrusage` figures, in the names of `struct rusage`. Times are
/// seconds, `ru_maxrss` KiB, the rest counts.
pub const RUSAGE_FIELDS: [(&str, &str, &str); 16] = [
    ("ru_utime", "s", "user CPU time"),
    ("ru_stime", "s", "system CPU time"),
    (
        "ru_maxrss",
        "KiB",
        "largest resident set of any one process",
    ),
    (
        "ru_ixrss",
        "",
        "integral shared memory size (unused by Linux)",
    ),
    (
        "ru_idrss",
        "",
        "integral unshared data size (unused by Linux)",
    ),
    (
        "ru_isrss",
        "",
        "integral unshared stack size (unused by Linux)",
    ),
    ("ru_minflt", "count", "page faults served without I/O"),
    ("ru_majflt", "count", "page faults that needed I/O"),
    ("ru_nswap", "count", "swaps (unused by Linux)"),
    ("ru_inblock", "count", "block input operations"),
    ("ru_oublock", "count", "block output operations"),
    ("ru_msgsnd", "count", "IPC messages sent (unused by Linux)"),
    (
        "ru_msgrcv",
        "count",
        "IPC messages received (unused by Linux)",
    ),
    ("ru_nsignals", "count", "signals received (unused by Linux)"),
    ("ru_nvcsw", "count", "voluntary context switches"),
    ("ru_nivcsw", "count", "involuntary context switches"),
];

/// `getrusage(RUSAGE_CHILDREN)`: resources of every child this process has
/// waited for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rusage([f64; 16]);

impl Rusage {
    pub fn children() -> Self {
        // SAFETY: rusage is plain old data, filled by the call.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: a valid, writable rusage.
        unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Self([
            secs(ru.ru_utime),
            secs(ru.ru_stime),
            ru.ru_maxrss as f64,
            ru.ru_ixrss as f64,
            ru.ru_idrss as f64,
            ru.ru_isrss as f64,
            ru.ru_minflt as f64,
            ru.ru_majflt as f64,
            ru.ru_nswap as f64,
            ru.ru_inblock as f64,
            ru.ru_oublock as f64,
            ru.ru_msgsnd as f64,
            ru.ru_msgrcv as f64,
            ru.ru_nsignals as f64,
            ru.ru_nvcsw as f64,
            ru.ru_nivcsw as f64,
        ])
    }

    /// What the benchmark's processes used: `after - before`, except
    /// `ru_maxrss`, a maximum, which is the value after.
    pub fn since(self, before: Self) -> Self {
        let mut out = self.0;
        for (i, v) in out.iter_mut().enumerate() {
            if RUSAGE_FIELDS[i].0 != "ru_maxrss" {
                *v = (*v - before.0[i]).max(0.0);
            }
        }
        Self(out)
    }

    /// `(name, value)` pairs in the order of [`RUSAGE_FIELDS`].
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, f64)> + '_ {
        RUSAGE_FIELDS.iter().zip(self.0).map(|(f, v)| (f.0, v))
    }
}

/// The benchmark cgroup's totals at the end of the run, `(name, unit,
/// description)`: the cgroup's own accounting, which also covers processes
/// that left the benchmark's process tree (daemons) and I/O it caused.
pub const CGROUP_FIELDS: [(&str, &str, &str); 9] = [
    (
        "cgroup_cpu_usage_us",
        "us",
        "CPU time of the benchmark's cgroup (cpu.stat usage_usec)",
    ),
    (
        "cgroup_cpu_user_us",
        "us",
        "user CPU time of the benchmark's cgroup (cpu.stat user_usec)",
    ),
    (
        "cgroup_cpu_system_us",
        "us",
        "system CPU time of the benchmark's cgroup (cpu.stat system_usec)",
    ),
    (
        "cgroup_memory_peak_bytes",
        "bytes",
        "peak memory of the benchmark's cgroup (memory.peak; null without the memory controller)",
    ),
    (
        "cgroup_io_read_bytes",
        "bytes",
        "bytes read by the benchmark's cgroup, all devices (io.stat rbytes; null without the io controller)",
    ),
    (
        "cgroup_io_write_bytes",
        "bytes",
        "bytes written by the benchmark's cgroup, all devices (io.stat wbytes; null without the io controller)",
    ),
    (
        "cgroup_cpu_pressure_us",
        "us",
        "time some of the cgroup's tasks waited for a CPU (cpu.pressure some total)",
    ),
    (
        "cgroup_memory_pressure_us",
        "us",
        "time some of the cgroup's tasks waited for memory (memory.pressure some total)",
    ),
    (
        "cgroup_io_pressure_us",
        "us",
        "time some of the cgroup's tasks waited for I/O (io.pressure some total)",
    ),
];

/// The values of [`CGROUP_FIELDS`], in order; `None` where this kernel or
/// cgroup does not have the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CgroupTotals(pub [Option<u64>; 9]);

impl CgroupTotals {
    /// Reads the totals of the cgroup folder `dir` (files of at most 64 KiB).
    pub fn read(dir: &Path) -> Self {
        let text = |name: &str| -> Option<String> {
            use std::io::Read;
            let f = std::fs::File::open(dir.join(name)).ok()?;
            let mut s = String::new();
            f.take(64 * 1024).read_to_string(&mut s).ok()?;
            Some(s)
        };
        let keyed = |content: &str, key: &str| -> Option<u64> {
            content.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse().ok()).flatten()
            })
        };
        let cpu = text("cpu.stat");
        let io = text("io.stat").map(|s| {
            let (mut r, mut w) = (0u64, 0u64);
            for field in s.split_whitespace() {
                if let Some(v) = field
                    .strip_prefix("rbytes=")
                    .and_then(|v| v.parse::<u64>().ok())
                {
                    r = r.saturating_add(v);
                } else if let Some(v) = field
                    .strip_prefix("wbytes=")
                    .and_then(|v| v.parse::<u64>().ok())
                {
                    w = w.saturating_add(v);
                }
            }
            (r, w)
        });
        let some_total = |name: &str| -> Option<u64> {
            let s = text(name)?;
            let line = s.lines().find(|l| l.starts_with("some "))?;
            line.split_whitespace()
                .find_map(|f| f.strip_prefix("total="))
                .and_then(|v| v.parse().ok())
        };
        Self([
            cpu.as_deref().and_then(|c| keyed(c, "usage_usec")),
            cpu.as_deref().and_then(|c| keyed(c, "user_usec")),
            cpu.as_deref().and_then(|c| keyed(c, "system_usec")),
            text("memory.peak").and_then(|s| s.trim().parse().ok()),
            io.map(|x| x.0),
            io.map(|x| x.1),
            some_total("cpu.pressure"),
            some_total("memory.pressure"),
            some_total("io.pressure"),
        ])
    }

    /// `(name, value)` pairs in the order of [`CGROUP_FIELDS`].
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, Option<u64>)> + '_ {
        CGROUP_FIELDS.iter().zip(self.0).map(|(f, v)| (f.0, v))
    }
}

/// Everything a benchmark run records about itself.
#[derive(Debug, Clone)]
pub struct RunFigures {
    pub indicator: Indicator,
    /// The reason the benchmark's own result could not be used.
    pub error: Option<String>,
    pub exit_code: Option<i32>,
    pub wall_time_s: f64,
    pub rusage: Rusage,
    /// The benchmark cgroup's totals; `None` when the run had no cgroup.
    pub cgroup: Option<CgroupTotals>,
    /// When the benchmark ended (CLOCK_BOOTTIME).
    pub end_uptime_us: u64,
}

impl RunFigures {
    /// `indicator.json`'s content.
    pub fn to_json(&self) -> Value {
        let i = &self.indicator;
        let mut obj = Map::new();
        obj.insert("name".into(), i.name.clone().into());
        obj.insert("component".into(), i.component.clone().into());
        obj.insert("@parameters".into(), Value::Object(i.parameters.clone()));
        obj.insert("@result".into(), Value::Object(i.result.clone()));
        if let Some(s) = i.overall_score {
            obj.insert("overall_score".into(), s.into());
        }
        obj.insert("exit_code".into(), self.exit_code.into());
        obj.insert("wall_time_s".into(), self.wall_time_s.into());
        for (k, v) in self.rusage.fields() {
            let v = if k.ends_with("time") {
                Value::from(v)
            } else {
                Value::from(v as i64)
            };
            obj.insert(k.into(), v);
        }
        for (k, v) in self.cgroup.unwrap_or_default().fields() {
            obj.insert(k.into(), v.into());
        }
        if let Some(e) = &self.error {
            obj.insert("error".into(), e.clone().into());
        }
        Value::Object(obj)
    }

    /// One line for the run's summary: how the benchmark ended and what it
    /// reported, e.g. `benchmark redis: exit 0 after 2.1 s; get_rps
    /// 118000.5, set_rps 112994.35`.
    pub fn summary(&self) -> String {
        let i = &self.indicator;
        let ended = match self.exit_code {
            Some(code) => format!("exit {code}"),
            None => "stopped by kernmlops".to_owned(),
        };
        let mut line = format!(
            "benchmark {}: {ended} after {:.1} s; ",
            i.name, self.wall_time_s
        );
        let mut figures: Vec<String> = i
            .result
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k} {s}"),
                v => format!("{k} {v}"),
            })
            .collect();
        if let Some(score) = i.overall_score {
            figures.push(format!("overall_score {score}"));
        }
        match (&self.error, figures.is_empty()) {
            (Some(_), _) => line.push_str("no usable result (see the message above)"),
            (None, true) => line.push_str("no result reported"),
            (None, false) => line.push_str(&figures.join(", ")),
        }
        line
    }

    /// Writes `indicator.json` in `dir` atomically (a fresh hidden
    /// temporary name, never a planted one).
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(&self.to_json()).map_err(std::io::Error::other)?;
        crate::files::write_atomic(&dir.join(FILE), (text + "\n").as_bytes())
    }

    /// The one-row `performance_indicator` table.
    pub fn to_batch(&self, collection_id: &str) -> Result<RecordBatch, arrow_schema::ArrowError> {
        let i = &self.indicator;
        let mut columns = vec![
            HostColumn::new(
                "ts_uptime_us",
                "us",
                "when the benchmark ended (CLOCK_BOOTTIME)",
                Arc::new(UInt64Array::from(vec![self.end_uptime_us])) as ArrayRef,
            ),
            HostColumn::new(
                "name",
                "",
                "the benchmark",
                Arc::new(StringArray::from(vec![i.name.as_str()])),
            ),
            HostColumn::new(
                "component",
                "",
                "what the benchmark measured",
                Arc::new(StringArray::from(vec![i.component.as_str()])),
            ),
            HostColumn::new(
                "overall_score",
                "",
                "the benchmark's overall score, if it gives one",
                Arc::new(Float64Array::from(vec![i.overall_score])),
            )
            .nullable(),
            HostColumn::new(
                "exit_code",
                "",
                "the benchmark's exit code (null when the host stopped it)",
                Arc::new(Int32Array::from(vec![self.exit_code])),
            )
            .nullable(),
            HostColumn::new(
                "wall_time_s",
                "s",
                "from launch to the benchmark's end",
                Arc::new(Float64Array::from(vec![self.wall_time_s])),
            ),
        ];
        for ((name, unit, desc), value) in RUSAGE_FIELDS.iter().zip(self.rusage.0) {
            let values: ArrayRef = if name.ends_with("time") {
                Arc::new(Float64Array::from(vec![value]))
            } else {
                Arc::new(Int64Array::from(vec![value as i64]))
            };
            columns.push(HostColumn::new(*name, unit, *desc, values));
        }
        for ((name, unit, desc), value) in
            CGROUP_FIELDS.iter().zip(self.cgroup.unwrap_or_default().0)
        {
            columns.push(
                HostColumn::new(*name, unit, *desc, Arc::new(UInt64Array::from(vec![value])))
                    .nullable(),
            );
        }
        let mut taken: std::collections::BTreeSet<String> =
            columns.iter().map(|c| c.name.clone()).collect();
        for (prefix, map, what) in [
            ("param_", &i.parameters, "benchmark setting"),
            ("result_", &i.result, "benchmark result"),
        ] {
            for (key, value) in map {
                let mut name = format!("{prefix}{}", column_name(key));
                while !taken.insert(name.clone()) {
                    name.push('_');
                }
                columns.push(HostColumn::new(
                    name,
                    "",
                    format!("{what} {key:?}"),
                    json_array(value),
                ));
            }
        }
        decode::host_table(
            TABLE,
            "The benchmark's own result and the resources its processes used",
            collection_id,
            columns,
        )
    }
}

/// A JSON key as a lowercase_snake_case column name.
pub fn column_name(key: &str) -> String {
    let mut out = String::new();
    for c in key.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('_') {
            out.push('_');
        }
    }
    let out = out.trim_matches('_').to_owned();
    if out.is_empty() {
        "value".into()
    } else {
        out
    }
}

/// One JSON value as a one-row column: integers stay integers, numbers are
/// f64, text and booleans keep their type, anything else is its JSON text.
fn json_array(value: &Value) -> ArrayRef {
    match value {
        Value::Bool(b) => Arc::new(BooleanArray::from(vec![*b])),
        Value::Number(n) if n.is_i64() => Arc::new(Int64Array::from(vec![n.as_i64()])),
        Value::Number(n) => Arc::new(Float64Array::from(vec![n.as_f64()])),
        Value::String(s) => Arc::new(StringArray::from(vec![s.as_str()])),
        Value::Null => Arc::new(StringArray::from(vec![None::<&str>])),
        other => Arc::new(StringArray::from(vec![other.to_string()])),
    }
}

/// The Arrow type a JSON value becomes in the table (for tests and docs).
pub fn json_type(value: &Value) -> DataType {
    json_array(value).data_type().clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_indicator_parses() {
        let i = Indicator::parse(
            r#"{"name":"n","component":"c","@parameters":{"bs":"4k"},"@result":{"iops":12.5},"overall_score":3}"#,
            "script",
        )
        .expect("valid");
        assert_eq!(i.name, "n");
        assert_eq!(i.component, "c");
        assert_eq!(i.result["iops"], 12.5);
        assert_eq!(i.overall_score, Some(3.0));
    }

    #[test]
    fn the_summary_line_shows_how_it_ended_and_every_result() {
        let figures = |text: &str, exit_code, error: Option<&str>| RunFigures {
            indicator: Indicator::parse(text, "script").expect("valid"),
            error: error.map(str::to_owned),
            exit_code,
            wall_time_s: 2.04,
            rusage: Rusage([0.0; 16]),
            cgroup: None,
            end_uptime_us: 0,
        };
        let ok = figures(
            r#"{"name":"fio","@result":{"read_iops":1250.5,"unit":"ops"},"overall_score":3}"#,
            Some(0),
            None,
        );
        assert_eq!(
            ok.summary(),
            "benchmark fio: exit 0 after 2.0 s; read_iops 1250.5, unit ops, overall_score 3"
        );
        let stopped = figures(r#"{"@result":{}}"#, None, None);
        assert_eq!(
            stopped.summary(),
            "benchmark script: stopped by kernmlops after 2.0 s; no result reported"
        );
        let broken = figures(r#"{"@result":{}}"#, Some(1), Some("not JSON"));
        assert!(broken
            .summary()
            .ends_with("; no usable result (see the message above)"));
    }

    #[test]
    fn broken_indicators_say_why() {
        for (text, want) in [
            ("not json", "not JSON"),
            ("[1]", "not a JSON object"),
            (r#"{"name":"x"}"#, "no \"@result\""),
            (r#"{"@result":3}"#, "\"@result\" must be a JSON object"),
            (
                r#"{"@parameters":{"k":1},"@result":{"k":2}}"#,
                "key \"k\" is in both",
            ),
            (r#"{"@result":{},"overall_score":"x"}"#, "must be a number"),
        ] {
            let e = Indicator::parse(text, "b").expect_err(text).to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn the_table_flattens_parameters_and_results_with_types() {
        let i = Indicator::parse(
            r#"{"@parameters":{"Block Size":"4k","jobs":2},"@result":{"iops":1.5,"ok":true}}"#,
            "fio",
        )
        .expect("valid");
        let figures = RunFigures {
            indicator: i,
            error: None,
            exit_code: Some(0),
            wall_time_s: 1.0,
            rusage: Rusage::children(),
            cgroup: Some(CgroupTotals([
                Some(7),
                None,
                None,
                None,
                None,
                None,
                None,
                None,
                None,
            ])),
            end_uptime_us: 5,
        };
        let batch = figures.to_batch("c1").expect("batch");
        assert_eq!(batch.num_rows(), 1);
        let schema = batch.schema();
        let ty = |n: &str| {
            schema
                .field_with_name(n)
                .unwrap_or_else(|_| panic!("column {n}"))
                .data_type()
                .clone()
        };
        assert_eq!(ty("param_block_size"), DataType::Utf8);
        assert_eq!(ty("param_jobs"), DataType::Int64);
        assert_eq!(ty("result_iops"), DataType::Float64);
        assert_eq!(ty("result_ok"), DataType::Boolean);
        assert_eq!(ty("ru_nvcsw"), DataType::Int64);
        assert_eq!(ty("ru_utime"), DataType::Float64);
        assert!(schema.field_with_name("collection_id").is_ok());
        let json = figures.to_json();
        for (k, _, _) in RUSAGE_FIELDS {
            assert!(json.get(k).is_some(), "{k} in indicator.json");
        }
    }

    #[test]
    fn column_names_are_snake_case() {
        assert_eq!(column_name("Set RPS"), "set_rps");
        assert_eq!(column_name("p99.9-latency(ms)"), "p99_9_latency_ms");
        assert_eq!(column_name("__"), "value");
    }

    #[test]
    fn cgroup_totals_are_read_from_the_cgroup_files() {
        let dir = kernmlops_sys::private::TempDir::new("kernmlops-cgroup-test").expect("temp dir");
        let put = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        put(
            "cpu.stat",
            "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 0\n",
        );
        put("memory.peak", "4096\n");
        put(
            "io.stat",
            "8:0 rbytes=100 wbytes=20 rios=1 wios=1\n253:0 rbytes=5 wbytes=7 rios=1 wios=1\n",
        );
        put("cpu.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=42\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=1\n");
        let t = CgroupTotals::read(dir.path());
        assert_eq!(
            t.0,
            [
                Some(1500),
                Some(1000),
                Some(500),
                Some(4096),
                Some(105),
                Some(27),
                Some(42),
                None,
                None
            ]
        );
        assert_eq!(CgroupTotals::read(&dir.path().join("missing")).0, [None; 9]);
    }
}
