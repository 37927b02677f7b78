//! Graph plugins: figures of a collection's tables (quanta run length and
//! queued time, memory usage, block I/O queue depth and latency, perf
//! counter rates, trace tables' event rates and latency), each written as
//! a PNG and an SVG.

use std::path::{Path, PathBuf};

use kernmlops_plugin_sdk::{
    export_plugin,
    graph::{GraphData, TableView},
    GraphImpl, Result, StartArgs,
};

#[macro_use]
mod decl;
mod data;
mod experiment;
mod plot;
pub mod power;
pub mod trace;

use data::{group, Collection};
use plot::{Axis, Drawable, Kind, Series};
pub use plot::{FONT_PATH, MAX_POINTS, SIZE};

export_plugin! {
    description: "Graphs: quanta run length and queued time, memory usage, block I/O queue depth and latency, perf counter rates, trace event rates and latency",
    probes: [],
    graphs: [QuantaRuntime, QuantaQueued, MemoryUsage, BlockIo, PerfCounters, experiment::ExperimentResults, power::Power, power::EnergyByProcess, trace::TraceTables],
}

const GIB: f64 = (1u64 << 30) as f64;

/// A scatter of one u64 column of `table` over time, on a log y axis.
fn scatter(
    c: &Collection,
    t: &TableView,
    out: &Path,
    (table, column): (&str, &str),
    what: &str,
) -> Result<Vec<PathBuf>> {
    let ts = t.u64s("ts_uptime_us")?;
    let ys = t.u64s(column)?;
    let points = ts
        .iter()
        .zip(&ys)
        .map(|(&ts, &y)| (c.secs(ts), y as f64))
        .collect();
    let y = Axis::logarithmic(format!("{column} (log scale)"));
    let series = vec![Series::new("", points, Kind::Points)];
    c.figure(table, what, y, series).render(out)
}

/// Declares graphs that are each a [`scatter`] of one column of their one
/// table, named as the graph: struct = table, description, column, title.
macro_rules! scatter_graphs {
    ($( $(#[$meta:meta])* $name:ident = $table:literal, $desc:literal, $column:literal, $what:literal; )+) => {$(
        graph! {
            $(#[$meta])*
            pub struct $name = $table, $desc;
            table $table;
            render(c, t, out) {
                scatter(&c, &t, out, ($table, $column), $what)
            }
        }
    )+};
}

scatter_graphs! {
    /// Scatter of every quantum's run length (table `quanta_runtime`).
    QuantaRuntime = "quanta_runtime",
        "Scatter of quanta run length (us, log scale) over time",
        "quanta_run_length_us", "Quanta run length";
    /// Scatter of every wake-up's time on the run queue (table
    /// `quanta_queued_time`).
    QuantaQueued = "quanta_queued_time",
        "Scatter of quanta queued time (us, log scale) over time",
        "quanta_queued_time_us", "Quanta queued time";
}

graph! {
    /// Free, available, cached and anonymous memory in GiB over time.
    pub struct MemoryUsage = "memory_usage",
        "Free, available, cached and active anonymous memory (GiB) over time";
    table "memory_usage";
    render(c, t, out) {
        let ts = t.u64s("ts_uptime_us")?;
        let mut series = Vec::new();
        for column in [
            "mem_free_bytes",
            "mem_available_bytes",
            "cached_bytes",
            "active_anon_bytes",
            "anon_pages_bytes",
        ] {
            if !t.has(column) {
                continue;
            }
            let ys = t.u64s(column)?;
            let mut points: Vec<(f64, f64)> = ts
                .iter()
                .zip(&ys)
                .map(|(&ts, &y)| (c.secs(ts), y as f64 / GIB))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let name = column.trim_end_matches("_bytes");
            series.push(Series::new(name, points, Kind::Line));
        }
        c.figure("memory_usage", "Memory usage", Axis::linear("GiB"), series)
            .render(out)
    }
}

graph! {
    /// Per-disk queue depth (left axis) with each request's latency (right
    /// axis, log scale).
    pub struct BlockIo = "block_io",
        "Per-disk queue depth over time, with request latency (us, log scale) on a second axis";
    table "block_io";
    render(c, t, out) {
        let ts = t.u64s("ts_uptime_us")?;
        let depth = t.u64s("queue_depth")?;
        let latency = t.u64s("latency_us")?;
        let disks: Vec<String> = if t.has("disk_name") {
            t.strings("disk_name")?
        } else {
            t.u64s("device")?
                .iter()
                .map(|d| format!("{}:{}", d >> 20, d & 0xf_ffff))
                .collect()
        };
        let rows = disks
            .into_iter()
            .zip(ts.iter().zip(depth.iter().zip(&latency)))
            .map(|(disk, (&ts, (&d, &l)))| (disk, (c.secs(ts), d as f64, l as f64)));
        let mut series = Vec::new();
        let mut latencies = Vec::new();
        for (disk, mut rows) in group(rows) {
            rows.sort_by(|a, b| a.0.total_cmp(&b.0));
            let depths = rows.iter().map(|r| (r.0, r.1)).collect();
            series.push(Series::new(format!("{disk} queue depth"), depths, Kind::Step));
            let points = rows.iter().map(|r| (r.0, r.2)).collect();
            latencies.push(Series {
                secondary: true,
                ..Series::new(format!("{disk} latency"), points, Kind::Points)
            });
        }
        series.extend(latencies);
        let y = Axis::linear("requests in flight");
        let mut figure = c.figure("block_io", "Block I/O", y, series);
        figure.y2 = Some(Axis::logarithmic("latency_us (log scale)"));
        figure.render(out)
    }
}

graph! {
    /// Two figures per perf counter table: per-CPU rate and cumulative count.
    pub struct PerfCounters = "perf_counters",
        "Per perf counter table: per-CPU rate (events/ms, corrected for multiplexing) and cumulative count";
    // Counter tables are named after the configured counters: the host
    // gives every table with exactly the perf columns.
    tables &[];
    columns data::PERF_COLUMNS;
    {
        fn render(&mut self, data: GraphData<'_>, out: &Path) -> Result<Vec<PathBuf>> {
            let c = Collection::new(data)?;
            let mut files = Vec::new();
            for table in c.perf_tables() {
                let t = c.table(&table)?;
                let ts = t.u64s("ts_uptime_us")?;
                let cpu = t.u64s("cpu")?;
                let count = t.u64s("count")?;
                let enabled = t.u64s("time_enabled_ns")?;
                let running = t.u64s("time_running_ns")?;
                let rows = cpu.iter().zip(
                    ts.iter()
                        .zip(count.iter().zip(enabled.iter().zip(&running))),
                );
                let per_cpu =
                    group(rows.map(|(&cpu, (&ts, (&n, (&en, &run))))| (cpu, (ts, n, en, run))));
                let mut rates = Vec::new();
                let mut totals = Vec::new();
                for (cpu, mut samples) in per_cpu {
                    samples.sort_by_key(|s| s.0);
                    let points = rate(&samples)
                        .into_iter()
                        .map(|(ts, r)| (c.secs(ts), r))
                        .collect();
                    rates.push(Series::new(format!("cpu {cpu}"), points, Kind::Line));
                    let points = samples.iter().map(|s| (c.secs(s.0), s.1 as f64)).collect();
                    totals.push(Series::new(format!("cpu {cpu}"), points, Kind::Line));
                }
                let figure = |stem: &str, what: &str, y: &str, series| {
                    let stem = format!("perf_{table}_{stem}");
                    c.figure(stem, &format!("{table} {what}"), Axis::linear(y), series)
                };
                files.extend(figure("rate", "rate", "events per ms", rates).render(out)?);
                files.extend(figure("cumulative", "cumulative count", "events", totals).render(out)?);
            }
            Ok(files)
        }
    }
}

/// Events per millisecond between consecutive samples `(ts_us, count,
/// time_enabled_ns, time_running_ns)`, scaled by Δenabled / Δrunning when
/// the counter was multiplexed. Intervals where the counter never ran, or
/// with no time between samples, have no point.
pub fn rate(samples: &[(u64, u64, u64, u64)]) -> Vec<(u64, f64)> {
    samples
        .windows(2)
        .filter_map(|w| {
            let (t0, n0, e0, r0) = w[0];
            let (t1, n1, e1, r1) = w[1];
            let dt_ms = t1.checked_sub(t0)? as f64 / 1e3;
            let dn = n1.checked_sub(n0)? as f64;
            let de = e1.saturating_sub(e0) as f64;
            let dr = r1.saturating_sub(r0) as f64;
            if dt_ms <= 0.0 || (dr == 0.0 && de > 0.0) {
                return None;
            }
            let scale = if dr > 0.0 && de > dr { de / dr } else { 1.0 };
            Some((t1, dn * scale / dt_ms))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_scales_by_multiplexing() {
        // 1000 events in 10 ms, counter on the PMU half the time.
        let r = rate(&[(0, 0, 0, 0), (10_000, 1000, 10_000_000, 5_000_000)]);
        assert_eq!(r, vec![(10_000, 200.0)]);
        // Never running: no point.
        assert!(rate(&[(0, 0, 0, 0), (10_000, 0, 10_000_000, 0)]).is_empty());
    }

    #[test]
    fn numbers_are_compact() {
        assert_eq!(plot::number(1500.0), "1500");
        assert_eq!(plot::number(15000.0), "15k");
        assert_eq!(plot::number(2_500_000.0), "2.5M");
        assert_eq!(plot::number(0.25), "0.25");
        assert_eq!(plot::number(0.5), "0.5");
        assert_eq!(plot::number(2.0), "2");
    }
}
