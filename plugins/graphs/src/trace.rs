//! Figures of every table the `trace` probe wrote (one table per traced
//! event, declared at run time): the event rate over time per CPU, and the
//! distribution over time of `latency_ns` (or of the numeric column the
//! `field` setting names) as percentiles per time bin.

use std::path::{Path, PathBuf};

use kernmlops_plugin_sdk::{graph::GraphData, Error, GraphImpl, Result, StartArgs};

use crate::{
    data::{group, Collection},
    plot::{Axis, Drawable, Kind, Series},
};

/// The column drawn when no `field` is set: the joined events' duration.
pub const DEFAULT_FIELD: &str = "latency_ns";

/// Fewest and most time bins of a figure: the bin is the run's length over
/// [`TARGET_BINS`], rounded up to whole milliseconds, at least 10 ms.
pub const TARGET_BINS: u64 = 200;
pub const MIN_BIN_US: u64 = 10_000;

/// The percentiles drawn per bin (and the maximum).
pub const PERCENTILES: &[(&str, f64)] = &[("p50", 0.50), ("p90", 0.90), ("p99", 0.99)];

/// Every trace table: rate per CPU, and the distribution of one field.
pub struct TraceTables {
    field: String,
    /// The field was named in the settings (not the default): a field no
    /// table has is then an error.
    named: bool,
}

impl GraphImpl for TraceTables {
    const NAME: &'static str = "trace";
    const DESCRIPTION: &'static str = "Per trace table: events per second over time per CPU, and p50/p90/p99/max of latency_ns (or the column the field setting names) per time bin";
    // The tables are named after the traced events: the host gives every
    // table the manifest attributes to the `trace` probe.
    const TABLES: &'static [&'static str] = &["probe:trace"];

    fn new(args: &StartArgs) -> Result<Self> {
        let text = args.config_json.as_str().trim();
        let config: kernmlops_plugin_sdk::serde_json::Value = if text.is_empty() {
            kernmlops_plugin_sdk::serde_json::Value::Null
        } else {
            kernmlops_plugin_sdk::serde_json::from_str(text)
                .map_err(|e| Error::new(format!("graph trace settings: {e}")))?
        };
        let named = config.get("field").is_some();
        let field = match config.get("field") {
            None => DEFAULT_FIELD.to_owned(),
            Some(v) => {
                let f = v
                    .as_str()
                    .filter(|f| {
                        !f.is_empty()
                            && f.len() <= 128
                            && f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    })
                    .ok_or_else(|| {
                        Error::new(format!("graph trace: field must be a column name, not {v}"))
                    })?;
                f.to_owned()
            }
        };
        Ok(Self { field, named })
    }

    fn render(&mut self, data: GraphData<'_>, out: &Path) -> Result<Vec<PathBuf>> {
        let c = Collection::new(data)?;
        let tables = c.tables_of_probe("trace")?;
        if self.named
            && !tables
                .iter()
                .any(|t| c.table(t).is_ok_and(|t| t.has(&self.field)))
        {
            return Err(Error::new(format!(
                "graph trace: no trace table has a column {} (tables: {})",
                self.field,
                tables.join(", ")
            )));
        }
        let mut files = Vec::new();
        for table in tables {
            let t = c.table(&table)?;
            let ts = t.u64s("ts_uptime_us")?;
            if ts.is_empty() {
                continue;
            }
            let cpu = t.u64s("cpu")?;
            let bin = bin_us(&ts);
            let bin_label = if bin % 1_000_000 == 0 {
                format!("{} s", bin / 1_000_000)
            } else {
                format!("{} ms", bin / 1000)
            };
            let rates = event_rate(&ts, &cpu, bin)
                .into_iter()
                .map(|(cpu, points)| {
                    let points = points
                        .into_iter()
                        .map(|(t0, r)| (c.secs(t0 + bin / 2), r))
                        .collect();
                    Series::new(format!("cpu {cpu}"), points, Kind::Line)
                })
                .collect();
            let what = format!("{table} events per second ({bin_label} bins)");
            let y = Axis::linear("events per second");
            files.extend(
                c.figure(format!("trace_{table}_rate"), &what, y, rates)
                    .render(out)?,
            );
            if !t.has(&self.field) {
                continue;
            }
            let values = t.f64s(&self.field)?;
            let bins = distribution(&ts, &values, bin);
            let mut series: Vec<Series> = PERCENTILES
                .iter()
                .enumerate()
                .map(|(i, (name, _))| {
                    let points = bins
                        .iter()
                        .map(|(t0, q)| (c.secs(t0 + bin / 2), q[i]))
                        .collect();
                    Series::new(*name, points, Kind::Line)
                })
                .collect();
            let max = bins
                .iter()
                .map(|(t0, q)| (c.secs(t0 + bin / 2), q[PERCENTILES.len()]))
                .collect();
            series.push(Series::new("max", max, Kind::Points));
            let unit = t
                .column_metadata(&self.field)
                .get("unit")
                .and_then(|u| u.as_str())
                .filter(|u| !u.is_empty())
                .map(|u| format!(" ({u})"))
                .unwrap_or_default();
            let field = &self.field;
            let what = format!("{table} {field} per {bin_label}: p50, p90, p99, max");
            let y = Axis::logarithmic(format!("{field}{unit} (log scale)"));
            let stem = format!("trace_{table}_{field}");
            files.extend(c.figure(stem, &what, y, series).render(out)?);
        }
        Ok(files)
    }
}

/// The time bin of a table spanning `ts` (us): its length over
/// [`TARGET_BINS`], whole milliseconds, at least [`MIN_BIN_US`].
pub fn bin_us(ts: &[u64]) -> u64 {
    let (Some(lo), Some(hi)) = (ts.iter().min(), ts.iter().max()) else {
        return MIN_BIN_US;
    };
    let span = hi - lo;
    (span.div_ceil(TARGET_BINS).div_ceil(1000) * 1000).max(MIN_BIN_US)
}

/// Events per second in consecutive bins of `bin_us` per CPU, from the
/// first event's bin to the last's (bins without events are 0), bins
/// starting at multiples of `bin_us`: `(cpu, [(bin start us, rate)])`,
/// CPUs in order. Each bin's rate times its length is its event count.
pub fn event_rate(ts_us: &[u64], cpu: &[u64], bin_us: u64) -> Vec<(u64, Vec<(u64, f64)>)> {
    let bin_us = bin_us.max(1);
    let (Some(lo), Some(hi)) = (ts_us.iter().min(), ts_us.iter().max()) else {
        return Vec::new();
    };
    let (first, last) = (lo / bin_us, hi / bin_us);
    let n = (last - first + 1) as usize;
    let per_sec = 1e6 / bin_us as f64;
    group(cpu.iter().copied().zip(ts_us.iter().copied()))
        .into_iter()
        .map(|(cpu, ts)| {
            let mut counts = vec![0u64; n];
            for t in ts {
                counts[(t / bin_us - first) as usize] += 1;
            }
            let points = counts
                .into_iter()
                .enumerate()
                .map(|(i, k)| ((first + i as u64) * bin_us, k as f64 * per_sec))
                .collect();
            (cpu, points)
        })
        .collect()
}

/// Per bin of `bin_us` holding values: its start and the [`PERCENTILES`]
/// then the maximum of the values in it (nearest rank), bins in order.
pub fn distribution(ts_us: &[u64], values: &[f64], bin_us: u64) -> Vec<(u64, Vec<f64>)> {
    let bin_us = bin_us.max(1);
    let bins = group(
        ts_us
            .iter()
            .zip(values)
            .filter(|(_, v)| v.is_finite())
            .map(|(&t, &v)| (t / bin_us, v)),
    );
    bins.into_iter()
        .map(|(b, mut vs)| {
            vs.sort_by(f64::total_cmp);
            let mut q: Vec<f64> = PERCENTILES
                .iter()
                .map(|(_, p)| {
                    let rank = ((p * vs.len() as f64).ceil() as usize).clamp(1, vs.len());
                    vs[rank - 1]
                })
                .collect();
            q.push(vs[vs.len() - 1]);
            (b * bin_us, q)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_counts_every_event_once() {
        // CPU 0: 3 events in bin 0, none in bin 1, 1 in bin 2; CPU 1: 2 in
        // bin 1.
        let ts = [1_000, 2_000, 9_999, 25_000, 12_000, 15_000];
        let cpu = [0, 0, 0, 0, 1, 1];
        let r = event_rate(&ts, &cpu, 10_000);
        assert_eq!(
            r,
            vec![
                (0, vec![(0, 300.0), (10_000, 0.0), (20_000, 100.0)]),
                (1, vec![(0, 0.0), (10_000, 200.0), (20_000, 0.0)]),
            ]
        );
        assert!(event_rate(&[], &[], 10_000).is_empty());
    }

    #[test]
    fn percentiles_per_bin() {
        let ts: Vec<u64> = (0..100).chain(10_000..10_010).collect();
        let vs: Vec<f64> = (1..=100).chain(1..=10).map(f64::from).collect();
        let d = distribution(&ts, &vs, 10_000);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0], (0, vec![50.0, 90.0, 99.0, 100.0]));
        assert_eq!(d[1], (10_000, vec![5.0, 9.0, 10.0, 10.0]));
    }

    #[test]
    fn bins_are_whole_milliseconds() {
        assert_eq!(bin_us(&[0, 1_000_000]), 10_000);
        assert_eq!(bin_us(&[0, 10_000_000]), 50_000);
        assert_eq!(bin_us(&[5, 10_000_001]), 50_000);
        assert_eq!(bin_us(&[]), MIN_BIN_US);
    }
}
