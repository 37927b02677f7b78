//! A collection as the host hands it to a graph: the manifest for the title
//! and the time origin, and the tables the graph asked for, read by the
//! host (this plugin reads no files).

use std::collections::HashMap;

use kernmlops_plugin_sdk::{
    graph::{GraphData, TableView},
    Result,
};

use crate::plot::{Axis, Figure, Series};

/// The columns of a perf counter table (besides `collection_id`): the
/// perf graph is given every table with exactly these.
pub const PERF_COLUMNS: &[&str] = &[
    "ts_uptime_us",
    "cpu",
    "count",
    "time_enabled_ns",
    "time_running_ns",
];

/// What every figure of one collection shares.
pub struct Collection<'a> {
    data: GraphData<'a>,
    /// `<collection id>` or `<collection id> (<benchmark>)`.
    pub title: String,
    /// CLOCK_BOOTTIME microseconds of x = 0.
    pub origin_us: u64,
    /// What x = 0 is, for the axis label.
    pub origin_name: &'static str,
}

impl<'a> Collection<'a> {
    pub fn new(data: GraphData<'a>) -> Result<Self> {
        let m = data.manifest()?;
        let id = m
            .get("collection_id")
            .and_then(|v| v.as_str())
            .ok_or_else(|| {
                kernmlops_plugin_sdk::Error::new(format!(
                    "{}: the manifest has no collection_id",
                    data.dir().display()
                ))
            })?;
        let bench = m.get("benchmark").filter(|b| !b.is_null());
        let bench_start = bench
            .and_then(|b| b.get("start_uptime_us"))
            .and_then(|v| v.as_u64());
        let bench_name = bench.and_then(|b| b.get("name")).and_then(|v| v.as_str());
        let start = m
            .get("start")
            .and_then(|s| s.get("uptime_us"))
            .and_then(|v| v.as_u64());
        let (origin_us, origin_name) = match (bench_start, start) {
            (Some(b), _) => (b, "benchmark start"),
            (None, Some(s)) => (s, "collection start"),
            (None, None) => {
                return Err(kernmlops_plugin_sdk::Error::new(format!(
                    "{}: neither benchmark.start_uptime_us nor start.uptime_us in the manifest",
                    data.dir().display()
                )))
            }
        };
        let title = match bench_name {
            Some(b) => format!("{id} ({b})"),
            None => id.to_owned(),
        };
        Ok(Self {
            data,
            title,
            origin_us,
            origin_name,
        })
    }

    /// The manifest, for what a graph needs beyond the title.
    pub fn manifest(&self) -> Result<kernmlops_plugin_sdk::serde_json::Value> {
        self.data.manifest()
    }

    /// Seconds since the origin of a `ts_uptime_us` value.
    pub fn secs(&self, ts_us: u64) -> f64 {
        (ts_us as f64 - self.origin_us as f64) / 1e6
    }

    pub fn x_label(&self) -> String {
        format!("seconds since {}", self.origin_name)
    }

    /// A figure over this collection's time, titled `<what>: <title>`,
    /// with one y axis.
    pub fn figure(
        &self,
        stem: impl Into<String>,
        what: &str,
        y: Axis,
        series: Vec<Series>,
    ) -> Figure {
        Figure {
            stem: stem.into(),
            title: format!("{what}: {}", self.title),
            x_label: self.x_label(),
            y,
            y2: None,
            series,
        }
    }

    pub fn table(&self, name: &str) -> Result<TableView<'a>> {
        self.data.table(name)
    }

    /// The tables given that the manifest says `probe` wrote (sorted by
    /// name).
    pub fn tables_of_probe(&self, probe: &str) -> Result<Vec<String>> {
        let m = self.data.manifest()?;
        let mut names: Vec<String> = self
            .data
            .tables()
            .map(|t| t.name().to_owned())
            .filter(|t| {
                m.get("tables")
                    .and_then(|ts| ts.get(t))
                    .and_then(|e| e.get("probe"))
                    .and_then(|p| p.as_str())
                    == Some(probe)
            })
            .collect();
        names.sort();
        Ok(names)
    }

    /// The perf counter tables given (sorted by name).
    pub fn perf_tables(&self) -> Vec<String> {
        let mut want: Vec<&str> = PERF_COLUMNS.to_vec();
        want.sort_unstable();
        let mut names: Vec<String> = self
            .data
            .tables()
            .filter(|t| {
                let mut cols: Vec<&str> =
                    t.column_names().filter(|c| *c != "collection_id").collect();
                cols.sort_unstable();
                cols == want
            })
            .map(|t| t.name().to_owned())
            .collect();
        names.sort();
        names
    }
}

/// Groups `(key, value)` pairs by key, keys sorted.
pub fn group<K: Ord + Clone + std::hash::Hash, V>(
    pairs: impl IntoIterator<Item = (K, V)>,
) -> Vec<(K, Vec<V>)> {
    let mut map: HashMap<K, Vec<V>> = HashMap::new();
    for (k, v) in pairs {
        map.entry(k).or_default().push(v);
    }
    let mut out: Vec<_> = map.into_iter().collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}
