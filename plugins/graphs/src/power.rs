//! Power graphs: `power` (the mean power of every source's zone per slot,
//! modelled zones marked, the benchmark's start and end as vertical lines)
//! and `energy_by_process` (the ten processes with the most attributed
//! energy, stacked, then the other processes and idle on top, so the top
//! line is the scope's power).

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
};

use kernmlops_plugin_sdk::{graph::GraphData, serde_json, GraphImpl, Result, StartArgs};

use crate::{
    data::Collection,
    plot::{Axis, Drawable, Kind, Series},
};

/// Processes drawn one by one; the rest are summed.
pub const TOP_PROCESSES: usize = 10;

/// Whether each `source/zone` of the manifest's power section is modelled,
/// and the benchmark's start and end (CLOCK_BOOTTIME µs), when there is one.
struct PowerFacts {
    modelled: HashMap<String, bool>,
    bench: (Option<u64>, Option<u64>),
}

fn facts(c: &Collection) -> PowerFacts {
    let m: serde_json::Value = c.manifest().unwrap_or_default();
    let mut modelled = HashMap::new();
    for s in m["power"]["sources"].as_array().into_iter().flatten() {
        let source = s["name"].as_str().unwrap_or("");
        for z in s["zones"].as_array().into_iter().flatten() {
            let zone = z["name"].as_str().unwrap_or("");
            modelled.insert(format!("{source}/{zone}"), z["kind"] == "modelled");
        }
    }
    let b = &m["benchmark"];
    PowerFacts {
        modelled,
        bench: (b["start_uptime_us"].as_u64(), b["end_uptime_us"].as_u64()),
    }
}

/// Vertical lines at the benchmark's start and end, up to `top`.
fn bench_marks(c: &Collection, f: &PowerFacts, top: f64) -> Vec<Series> {
    [("benchmark start", f.bench.0), ("benchmark end", f.bench.1)]
        .into_iter()
        .filter_map(|(name, at)| {
            let x = c.secs(at?);
            Some(Series::new(name, vec![(x, 0.0), (x, top)], Kind::Line))
        })
        .collect()
}

/// Mean power in watts of `energy_uj` over `start..end` µs.
fn watts(energy_uj: u64, start: u64, end: u64) -> f64 {
    energy_uj as f64 / end.saturating_sub(start).max(1) as f64
}

graph! {
    /// Power per zone over time, with the benchmark's start and end marked.
    pub struct Power = "power",
        "Mean power per power-source zone and slot (W), modelled zones marked, benchmark start and end as vertical lines";
    table "energy";
    render(c, t, out) {
        let f = facts(&c);
        let start = t.u64s("slot_start_us")?;
        let end = t.u64s("ts_uptime_us")?;
        let energy = t.u64s("energy_uj")?;
        let source = t.strings("source")?;
        let zone = t.strings("zone")?;
        let mut by_zone: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for i in 0..end.len() {
            by_zone
                .entry(format!("{}/{}", source[i], zone[i]))
                .or_default()
                .push((c.secs(start[i]), watts(energy[i], start[i], end[i])));
        }
        let mut top: f64 = 0.0;
        let mut series: Vec<Series> = by_zone
            .into_iter()
            .map(|(name, mut points)| {
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                // Hold the last slot's power to its end.
                if let Some(&(_, y)) = points.last() {
                    let last_end = end.iter().max().copied().unwrap_or(0);
                    points.push((c.secs(last_end), y));
                }
                top = points.iter().map(|p| p.1).fold(top, f64::max);
                let label = if f.modelled.get(&name).copied().unwrap_or(false) {
                    format!("{name} (modelled)")
                } else {
                    name
                };
                Series::new(label, points, Kind::Step)
            })
            .collect();
        series.extend(bench_marks(&c, &f, top * 1.05));
        let y = Axis::linear("W (mean over each slot)");
        c.figure("power", "Power per zone", y, series).render(out)
    }
}

/// `(slot_start_us, slot_end_us, tgid, comm, energy_uj)`.
pub type AttributedRow = (u64, u64, u64, String, u64);

/// `(slot_start_us, slot_end_us, cumulative watts per layer)`.
pub type StackedSlot = (u64, u64, Vec<f64>);

/// One slot's power per stacked layer, the layers' names, bottom first:
/// the top processes by energy, `other processes`, `idle`. Rows are
/// `(slot_start, slot_end, tgid, comm, energy_uj)` of one scope.
pub fn stack(rows: &[AttributedRow]) -> (Vec<String>, Vec<StackedSlot>) {
    let mut per_tgid: HashMap<u64, (u64, String)> = HashMap::new();
    for (_, _, tgid, comm, e) in rows.iter().filter(|r| r.2 != 0) {
        let entry = per_tgid.entry(*tgid).or_insert((0, comm.clone()));
        entry.0 += e;
    }
    let mut ranked: Vec<(u64, u64, String)> =
        per_tgid.into_iter().map(|(t, (e, c))| (e, t, c)).collect();
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    ranked.truncate(TOP_PROCESSES);
    let mut names: Vec<String> = ranked
        .iter()
        .map(|(_, t, c)| format!("{c} ({t})"))
        .collect();
    names.push("other processes".into());
    names.push("idle".into());
    let layer = |tgid: u64| {
        if tgid == 0 {
            ranked.len() + 1
        } else {
            ranked
                .iter()
                .position(|r| r.1 == tgid)
                .unwrap_or(ranked.len())
        }
    };
    let mut slots: BTreeMap<(u64, u64), Vec<f64>> = BTreeMap::new();
    for (start, end, tgid, _, e) in rows {
        let v = slots
            .entry((*start, *end))
            .or_insert_with(|| vec![0.0; names.len()]);
        v[layer(*tgid)] += watts(*e, *start, *end);
    }
    let stacked = slots
        .into_iter()
        .map(|((s, e), v)| {
            let mut sum = 0.0;
            let cumulative = v
                .into_iter()
                .map(|w| {
                    sum += w;
                    sum
                })
                .collect();
            (s, e, cumulative)
        })
        .collect();
    (names, stacked)
}

graph! {
    /// The processes with the most attributed energy, stacked over time.
    pub struct EnergyByProcess = "energy_by_process",
        "Top 10 processes by attributed energy, stacked (W), with other processes and idle on top";
    table "energy_attribution";
    render(c, t, out) {
        let f = facts(&c);
        let scope = t.strings("scope")?;
        let source = t.strings("source")?;
        // One scope: the package when there is one.
        let Some(chosen) = ["package", "platform", "core", "dram", "uncore"]
            .into_iter()
            .find(|s| scope.iter().any(|x| x == s))
        else {
            return Ok(Vec::new());
        };
        let start = t.u64s("slot_start_us")?;
        let end = t.u64s("ts_uptime_us")?;
        let tgid = t.u64s("tgid")?;
        let comm = t.strings("comm")?;
        let energy = t.u64s("energy_uj")?;
        let rows: Vec<AttributedRow> = (0..end.len())
            .filter(|&i| scope[i] == chosen)
            .map(|i| (start[i], end[i], tgid[i], comm[i].clone(), energy[i]))
            .collect();
        let split: std::collections::HashSet<&str> = (0..end.len())
            .filter(|&i| scope[i] == chosen)
            .map(|i| source[i].as_str())
            .collect();
        let modelled = f
            .modelled
            .iter()
            .any(|(k, m)| *m && k.split('/').next().is_some_and(|s| split.contains(s)));
        let (names, stacked) = stack(&rows);
        let mut series: Vec<Series> = names
            .iter()
            .enumerate()
            .map(|(layer, name)| {
                let mut points: Vec<(f64, f64)> = stacked
                    .iter()
                    .map(|(s, _, v)| (c.secs(*s), v[layer]))
                    .collect();
                if let (Some((_, e, v)), true) = (stacked.last(), !points.is_empty()) {
                    points.push((c.secs(*e), v[layer]));
                }
                Series::new(name.clone(), points, Kind::Step)
            })
            .collect();
        let top = stacked
            .iter()
            .filter_map(|(_, _, v)| v.last().copied())
            .fold(0.0, f64::max);
        series.extend(bench_marks(&c, &f, top * 1.05));
        let modelled = if modelled { " (modelled)" } else { "" };
        let what = format!("{chosen} power by process, stacked{modelled}");
        let y = Axis::linear("W, stacked (each line adds the layer below it)");
        c.figure("energy_by_process", &what, y, series).render(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_stack_to_the_scope_power() {
        let row =
            |s: u64, tgid: u64, comm: &str, e: u64| (s, s + 1_000_000, tgid, comm.to_owned(), e);
        let mut rows = vec![row(0, 0, "idle", 1_000_000)];
        // Twelve processes: the two smallest go to "other processes".
        for t in 1..=12u64 {
            rows.push(row(0, t, &format!("p{t}"), t * 100_000));
        }
        rows.push(row(1_000_000, 12, "p12", 2_000_000));
        let (names, stacked) = stack(&rows);
        assert_eq!(names.len(), TOP_PROCESSES + 2);
        assert_eq!(names[0], "p12 (12)", "the most energy at the bottom");
        assert_eq!(names[TOP_PROCESSES], "other processes");
        let (_, _, first) = &stacked[0];
        let total: f64 = 1.0 + (1..=12).map(|t| t as f64 * 0.1).sum::<f64>();
        assert!((first.last().copied().unwrap_or(0.0) - total).abs() < 1e-9);
        assert!(first.windows(2).all(|w| w[0] <= w[1]), "stacked: {first:?}");
        // "other processes" holds p1 + p2 = 0.3 W.
        let other = first[TOP_PROCESSES] - first[TOP_PROCESSES - 1];
        assert!((other - 0.3).abs() < 1e-9, "{other}");
        assert_eq!(stacked.len(), 2);
        assert!((stacked[1].2[0] - 2.0).abs() < 1e-9);
    }
}
