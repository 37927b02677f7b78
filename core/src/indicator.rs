//! A benchmark run's own result, next to the kernel data: `indicator.json`
//! in the performance-indicator format (`name`, `component`,
//! `@parameters`, `@result`, optional `overall_score`) with the runner's
//! additions (exit code, wall time, the 16 `getrusage(RUSAGE_CHILDREN)`
//! figures of the benchmark's processes), and the same figures as the
//! one-row `performance_indicator` table, flattened into `param_*` and
//! `result_*` columns so it joins the kernel tables by `collection_id`.

use std::{fmt, marker::PhantomData, path::Path, sync::Arc};

use arrow_array::{
    ArrayRef, BooleanArray, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
    UInt64Array,
};
use arrow_schema::DataType;
use serde::{
    de::{IgnoredAny, MapAccess, Visitor},
    ser::SerializeMap,
    Deserialize, Deserializer, Serialize, Serializer,
};
use serde_json::Value;

use crate::decode::{self, HostColumn};

/// The performance-indicator format has one parser and validator, the
/// SDK's: what a benchmark reports is checked by the same rules its plugin
/// built it with.
pub use kernmlops_plugin_sdk::indicator::{Indicator, IndicatorError};

/// The table the figures go to.
pub const TABLE: &str = "performance_indicator";
/// The file beside the tables.
pub const FILE: &str = "indicator.json";
/// The largest `indicator.json` [`IndicatorFile::read`] reads: an
/// indicator of the SDK's largest size, pretty-printed, with the runner's
/// figures, fits many times over.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

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

/// Whether a [`RUSAGE_FIELDS`] figure is a time in seconds (a float in
/// `indicator.json` and the tables); the others are whole numbers.
pub fn is_seconds(name: &str) -> bool {
    name.ends_with("time")
}

/// The [`RUSAGE_FIELDS`] figures as `indicator.json` holds them, one key
/// each; `None` where a file lacks one (an older version's).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RusageFigures(pub [Option<f64>; 16]);

impl From<Rusage> for RusageFigures {
    fn from(r: Rusage) -> Self {
        Self(r.0.map(Some))
    }
}

impl RusageFigures {
    /// `(name, value)` in the order of [`RUSAGE_FIELDS`], each value as
    /// JSON: seconds as floats, the rest whole numbers, null where absent.
    pub fn entries(&self) -> impl Iterator<Item = (&'static str, Value)> + '_ {
        RUSAGE_FIELDS.iter().zip(self.0).map(|((name, _, _), v)| {
            let value = match v {
                None => Value::Null,
                Some(v) if is_seconds(name) => Value::from(v),
                Some(v) => Value::from(v as i64),
            };
            (*name, value)
        })
    }
}

/// `Serialize` and `Deserialize` of a figures type as one key per figure
/// (to be flattened into a file's object): its `$pairs` method gives the
/// `(name, value)` pairs, `$fields` the table whose first items are names.
macro_rules! named_serde {
    ($ty:ident, $pairs:ident, $fields:ident) => {
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                serialize_named(s, self.$pairs())
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                deserialize_named(d, $fields.map(|f| f.0)).map(Self)
            }
        }
    };
}

named_serde!(RusageFigures, entries, RUSAGE_FIELDS);

/// Named figures as one key each, to be flattened into a file's object.
fn serialize_named<S: Serializer, T: Serialize>(
    s: S,
    entries: impl Iterator<Item = (&'static str, T)>,
) -> Result<S::Ok, S::Error> {
    let mut map = s.serialize_map(None)?;
    for (name, value) in entries {
        map.serialize_entry(name, &value)?;
    }
    map.end()
}

/// Reads the keys `names` of an object (the others are left for the other
/// fields), each `None` when absent or null.
fn deserialize_named<'de, D, T, const N: usize>(
    d: D,
    names: [&'static str; N],
) -> Result<[Option<T>; N], D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Copy,
{
    struct Named<T, const N: usize>([&'static str; N], PhantomData<T>);
    impl<'de, T: Deserialize<'de> + Copy, const N: usize> Visitor<'de> for Named<T, N> {
        type Value = [Option<T>; N];
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = [None; N];
            while let Some(key) = map.next_key::<String>()? {
                match self.0.iter().position(|n| *n == key) {
                    Some(i) => out[i] = map.next_value::<Option<T>>()?,
                    None => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(out)
        }
    }
    d.deserialize_map(Named(names, PhantomData))
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

named_serde!(CgroupTotals, fields, CGROUP_FIELDS);

/// `indicator.json`: the benchmark's indicator (the SDK's type) with the
/// runner's figures, written by the host and read back by the experiment
/// layer through this one type. Keys an older version did not write read
/// as absent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IndicatorFile {
    #[serde(flatten)]
    pub indicator: Indicator,
    /// The benchmark's exit code; null when the host stopped it.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// From launch to the benchmark's end, in seconds.
    #[serde(default)]
    pub wall_time_s: Option<f64>,
    /// The benchmark's processes' `getrusage` figures.
    #[serde(flatten)]
    pub rusage: RusageFigures,
    /// The benchmark cgroup's totals (null without a cgroup).
    #[serde(flatten)]
    pub cgroup: CgroupTotals,
    /// Why the benchmark's own result could not be used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl IndicatorFile {
    /// The file's text: pretty JSON with its keys in sorted order (as a
    /// JSON object's keys come out of `serde_json::Value`).
    pub fn to_text(&self) -> serde_json::Result<String> {
        let value = serde_json::to_value(self)?;
        Ok(serde_json::to_string_pretty(&value)? + "\n")
    }

    /// Reads `indicator.json` in `dir` (at most [`MAX_FILE_BYTES`]).
    pub fn read(dir: &Path) -> std::io::Result<Self> {
        use std::io::Read;
        let path = dir.join(FILE);
        let mut text = String::new();
        std::fs::File::open(&path)?
            .take(MAX_FILE_BYTES + 1)
            .read_to_string(&mut text)?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(std::io::Error::other(format!(
                "{}: larger than {MAX_FILE_BYTES} bytes",
                path.display()
            )));
        }
        serde_json::from_str(&text).map_err(std::io::Error::other)
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
    pub fn file(&self) -> IndicatorFile {
        IndicatorFile {
            indicator: self.indicator.clone(),
            exit_code: self.exit_code,
            wall_time_s: Some(self.wall_time_s),
            rusage: self.rusage.into(),
            cgroup: self.cgroup.unwrap_or_default(),
            error: self.error.clone(),
        }
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
        let text = self.file().to_text().map_err(std::io::Error::other)?;
        crate::files::write_atomic(&dir.join(FILE), text.as_bytes())
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
            let values: ArrayRef = if is_seconds(name) {
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

    fn indicator(text: &str) -> Indicator {
        Indicator::parse(text).expect("valid")
    }

    #[test]
    fn the_summary_line_shows_how_it_ended_and_every_result() {
        let figures = |text: &str, exit_code, error: Option<&str>| RunFigures {
            indicator: indicator(text),
            error: error.map(str::to_owned),
            exit_code,
            wall_time_s: 2.04,
            rusage: Rusage([0.0; 16]),
            cgroup: None,
            end_uptime_us: 0,
        };
        let ok = figures(
            r#"{"name":"fio","component":"fio","@result":{"read_iops":1250.5,"unit":"ops"},"overall_score":3}"#,
            Some(0),
            None,
        );
        assert_eq!(
            ok.summary(),
            "benchmark fio: exit 0 after 2.0 s; read_iops 1250.5, unit ops, overall_score 3"
        );
        let stopped = figures(
            r#"{"name":"script","component":"script","@result":{}}"#,
            None,
            None,
        );
        assert_eq!(
            stopped.summary(),
            "benchmark script: stopped by kernmlops after 2.0 s; no result reported"
        );
        let broken = RunFigures {
            indicator: Indicator::new("script", "script"),
            ..figures(
                r#"{"name":"s","component":"s","@result":{}}"#,
                Some(1),
                Some("x"),
            )
        };
        assert!(broken
            .summary()
            .ends_with("; no usable result (see the message above)"));
    }

    /// The host checks a benchmark's result by the SDK's rules: what a
    /// plugin could not have built is refused with the SDK's reason.
    #[test]
    fn the_host_takes_the_sdks_rules() {
        for (text, want) in [
            (r#"{"@result":{}}"#, "\"name\" is missing"),
            (
                r#"{"name":"a","component":"b","@result":3}"#,
                "\"@result\" must be an object",
            ),
            (
                r#"{"name":"a","component":"b","@parameters":{"k":1},"@result":{"k":2}}"#,
                "key \"k\" is in both",
            ),
        ] {
            let e = Indicator::parse(text).expect_err(text).to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    fn fixed_figures(cgroup: Option<CgroupTotals>, error: Option<&str>) -> RunFigures {
        let mut rusage = [0.0; 16];
        rusage[0] = 0.25;
        rusage[2] = 30480.0;
        RunFigures {
            indicator: indicator(
                r#"{"name":"sort","component":"coreutils","@parameters":{"lines":5,"b":"x"},
                    "@result":{"seconds":0.5,"n":7}}"#,
            ),
            error: error.map(str::to_owned),
            exit_code: Some(0),
            wall_time_s: 1.5,
            rusage: Rusage(rusage),
            cgroup,
            end_uptime_us: 9,
        }
    }

    /// `indicator.json` keeps its form: keys sorted, seconds as floats,
    /// counts as integers, every cgroup key (null without a cgroup), no
    /// `overall_score` or `error` unless there is one.
    #[test]
    fn indicator_json_keeps_its_form() {
        let text = fixed_figures(None, None).file().to_text().expect("text");
        let keys: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("  \""))
            .filter_map(|l| l.trim().strip_prefix('"')?.split('"').next())
            .collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        assert_eq!(keys, sorted, "{text}");
        assert_eq!(keys.len(), 2 + 2 + 2 + 16 + 9, "{text}");
        for line in [
            "  \"@parameters\": {\n    \"b\": \"x\",\n    \"lines\": 5\n  },",
            "  \"cgroup_cpu_usage_us\": null,",
            "  \"exit_code\": 0,",
            "  \"ru_maxrss\": 30480,",
            "  \"ru_stime\": 0.0,",
            "  \"ru_utime\": 0.25,",
            "  \"wall_time_s\": 1.5\n}\n",
        ] {
            assert!(text.contains(line), "{line:?} in {text}");
        }
        assert!(!text.contains("overall_score") && !text.contains("\"error\""));
        let with = fixed_figures(Some(CgroupTotals([Some(3); 9])), Some("bad"));
        let text = with.file().to_text().expect("text");
        assert!(text.contains("  \"cgroup_io_pressure_us\": 3,"), "{text}");
        assert!(text.contains("  \"error\": \"bad\","), "{text}");
    }

    /// What the host writes reads back as the same value; a file of an
    /// older version, without the runner's later figures, reads with them
    /// absent.
    #[test]
    fn indicator_json_reads_back_and_tolerates_older_files() {
        let dir = kernmlops_sys::private::TempDir::new("kernmlops-indicator-test").expect("temp");
        for figures in [
            fixed_figures(None, None),
            fixed_figures(Some(CgroupTotals([Some(1); 9])), Some("why")),
        ] {
            figures.write(dir.path()).expect("write");
            let back = IndicatorFile::read(dir.path()).expect("read");
            assert_eq!(back, figures.file());
            let json: Vec<(&str, Value)> = back.rusage.entries().collect();
            assert_eq!(json[0], ("ru_utime", Value::from(0.25)));
            assert!(json[2].1.is_i64() || json[2].1.is_u64(), "{json:?}");
        }
        std::fs::write(
            dir.path().join(FILE),
            r#"{"name": "a", "component": "b", "@result": {"x": 1}, "ru_utime": 0.5}"#,
        )
        .expect("older file");
        let old = IndicatorFile::read(dir.path()).expect("older file reads");
        assert_eq!(old.indicator.result["x"], 1);
        assert_eq!(
            (old.exit_code, old.wall_time_s, old.error),
            (None, None, None)
        );
        assert_eq!(old.rusage.0[0], Some(0.5));
        assert_eq!(old.rusage.0[1..], [None; 15]);
        assert_eq!(old.cgroup, CgroupTotals::default());
        // A key of the wrong type is an error, not a silent null.
        std::fs::write(
            dir.path().join(FILE),
            r#"{"name": "a", "component": "b", "@result": {}, "ru_maxrss": "big"}"#,
        )
        .expect("bad file");
        let e = IndicatorFile::read(dir.path()).expect_err("wrong type");
        assert!(e.to_string().contains("invalid type"), "{e}");
        // Bounded: a file past the limit is refused unread.
        let f = std::fs::File::create(dir.path().join(FILE)).expect("big file");
        f.set_len(MAX_FILE_BYTES + 1).expect("size");
        let e = IndicatorFile::read(dir.path()).expect_err("too large");
        assert!(e.to_string().contains("larger than"), "{e}");
    }

    #[test]
    fn the_table_flattens_parameters_and_results_with_types() {
        let i = indicator(
            r#"{"name":"fio","component":"fio","@parameters":{"Block Size":"4k","jobs":2},"@result":{"iops":1.5,"ok":true}}"#,
        );
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
        let json = serde_json::to_value(figures.file()).expect("json");
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
