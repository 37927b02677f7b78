//! The power thread of a run: reads every source at each slot boundary of
//! one grid (multiples of the interval on `CLOCK_BOOTTIME`; the first slot
//! starts at the baseline read, the last ends when the run stops), writes
//! one `energy` row per zone and slot, drains the `cpu_time` probe at the
//! same boundary and splits each attributed scope's energy between the
//! processes that ran and idle.
//!
//! A zone whose reading fails, or whose energy in a slot implies more
//! power than a zone of its scope can draw (`[power.max_watts]`), is
//! reported once (one `error:` line, the manifest) and has no rows from
//! then on; the other zones, sources and the
//! run go on. Attribution of a scope then falls to the next source that has
//! it.

use std::{
    collections::BTreeMap,
    sync::mpsc::{Receiver, RecvTimeoutError},
    time::Duration,
};

use abi_stable::std_types::{RResult, RVec};
use kernmlops_plugin_api::{Batch, BpfProgramStats, PowerReading, PowerScope, ProbeBox};
use kernmlops_sys::clock;

use super::{
    attribution::{split_slot, Activity, CpuTimeReader},
    config::MaxWatts,
    report::{
        AttributionStatus, CrossCheck, PowerManifest, ProgramCost, ScopeEntry, Timing, ZoneStatus,
    },
    tables::{AttributionRow, EnergyRow},
    StartedSource,
};
use crate::sink::IpcSink;

/// Scopes whose energy follows CPU activity closely enough to split by
/// on-CPU time; a device's (a GPU, a NIC) does not.
const ATTRIBUTED: &[PowerScope] = &[
    PowerScope::PACKAGE,
    PowerScope::CORE,
    PowerScope::UNCORE,
    PowerScope::DRAM,
    PowerScope::PLATFORM,
];

/// A source while it is read.
struct Source {
    s: StartedSource,
    readings: RVec<PowerReading>,
    /// Per zone: energy at the last read, failed or not.
    last: Vec<u64>,
    failed: Vec<bool>,
    /// Per zone: energy in the current slot, `None` when not read.
    delta: Vec<Option<u64>>,
    /// When the source was last read (`CLOCK_BOOTTIME` µs).
    read_us: u64,
}

/// The cpu_time probe while it is drained.
pub(super) struct Attribution {
    pub probe: ProbeBox,
    pub reader: CpuTimeReader,
    pub batches: RVec<Batch>,
}

/// Per attributed scope: totals for the manifest.
#[derive(Default)]
struct ScopeTotals {
    sources: Vec<String>,
    measured: bool,
    energy_uj: u64,
    attributed_uj: u64,
    idle_uj: u64,
    slots: u64,
}

pub(super) struct Sampler {
    pub interval_us: u64,
    max_watts: MaxWatts,
    sources: Vec<Source>,
    attribution: Option<Attribution>,
    energy: IpcSink,
    attributed: Option<IpcSink>,
    pub manifest: PowerManifest,
    pub errors: Vec<String>,
    scopes: BTreeMap<u32, ScopeTotals>,
    started_us: u64,
    last_us: u64,
    reads: u64,
    read_us_total: u64,
    rows: Vec<u8>,
    attribution_rows: Vec<u8>,
}

/// What the thread hands back.
pub(super) struct Finished {
    pub manifest: PowerManifest,
    pub errors: Vec<String>,
    pub tables: Vec<(String, u64)>,
    pub probe_stats: Option<(String, Vec<BpfProgramStats>)>,
}

impl Sampler {
    pub fn new(
        interval_us: u64,
        max_watts: MaxWatts,
        sources: Vec<StartedSource>,
        attribution: Option<Attribution>,
        energy: IpcSink,
        attributed: Option<IpcSink>,
        manifest: PowerManifest,
    ) -> Self {
        let sources = sources
            .into_iter()
            .map(|s| {
                let n = s.zones.len();
                Source {
                    s,
                    readings: RVec::new(),
                    last: vec![0; n],
                    failed: vec![false; n],
                    delta: vec![None; n],
                    read_us: 0,
                }
            })
            .collect();
        Self {
            interval_us,
            max_watts,
            sources,
            attribution,
            energy,
            attributed,
            manifest,
            errors: Vec::new(),
            scopes: BTreeMap::new(),
            started_us: 0,
            last_us: 0,
            reads: 0,
            read_us_total: 0,
            rows: Vec::new(),
            attribution_rows: Vec::new(),
        }
    }

    /// Runs until `stop` sends (or its sender is dropped), then closes the
    /// last slot and the tables.
    pub fn run(mut self, stop: Receiver<()>) -> Finished {
        self.baseline();
        loop {
            let now = clock::uptime_us();
            let next = (now / self.interval_us + 1) * self.interval_us;
            match stop.recv_timeout(Duration::from_micros(next - now)) {
                Err(RecvTimeoutError::Timeout) => {
                    // The timeout runs on the monotonic clock; make sure the
                    // boot-time boundary has passed.
                    while clock::uptime_us() < next {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                    self.slot(next);
                }
                Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                    let end = clock::uptime_us();
                    if end > self.last_us {
                        self.slot(end);
                    }
                    break;
                }
            }
        }
        self.finish()
    }

    /// The first read: every counter's starting point, and the activity
    /// since the probe attached (not counted).
    fn baseline(&mut self) {
        let now = clock::uptime_us();
        for i in 0..self.sources.len() {
            self.read_source(i, now, true);
        }
        let _ = self.activity();
        self.started_us = now;
        self.last_us = now;
    }

    /// Reads source `i`, marking failed zones (once); with `baseline` only
    /// the starting points are kept.
    fn read_source(&mut self, i: usize, slot_end: u64, baseline: bool) {
        let max_watts = self.max_watts;
        let src = &mut self.sources[i];
        src.delta.iter_mut().for_each(|d| *d = None);
        if src.failed.iter().all(|f| *f) {
            return;
        }
        let now = clock::uptime_us();
        let elapsed_us = now.saturating_sub(src.read_us);
        src.read_us = now;
        let result = src.s.source.read(&mut src.readings);
        let mut failures: Vec<(usize, String)> = Vec::new();
        match result {
            RResult::RErr(e) => {
                for z in 0..src.failed.len() {
                    failures.push((z, e.to_string()));
                }
            }
            RResult::ROk(()) if src.readings.len() != src.s.zones.len() => {
                let msg = format!(
                    "the source returned {} readings for {} zones",
                    src.readings.len(),
                    src.s.zones.len()
                );
                for z in 0..src.failed.len() {
                    failures.push((z, msg.clone()));
                }
            }
            RResult::ROk(()) => {
                for (z, r) in src.readings.iter().enumerate() {
                    if src.failed[z] {
                        continue;
                    }
                    if !r.error.is_empty() {
                        failures.push((z, r.error.to_string()));
                    } else if r.energy_uj < src.last[z] && !baseline {
                        failures.push((
                            z,
                            format!(
                                "its energy went backwards from {} to {} uJ",
                                src.last[z], r.energy_uj
                            ),
                        ));
                    } else if let Some(msg) = (!baseline)
                        .then(|| {
                            implausible(
                                r.energy_uj - src.last[z],
                                elapsed_us,
                                &src.s.zones[z],
                                &max_watts,
                            )
                        })
                        .flatten()
                    {
                        failures.push((z, msg));
                    } else {
                        if !baseline {
                            src.delta[z] = Some(r.energy_uj - src.last[z]);
                        }
                        src.last[z] = r.energy_uj;
                    }
                }
            }
        }
        for (z, msg) in failures {
            self.fail_zone(i, z, &msg, slot_end);
        }
    }

    fn fail_zone(&mut self, i: usize, z: usize, msg: &str, at_us: u64) {
        let src = &mut self.sources[i];
        if src.failed[z] {
            return;
        }
        src.failed[z] = true;
        src.delta[z] = None;
        let line = format!(
            "power source {} zone {}: {msg}; its energy is no longer recorded (the run goes on)",
            src.s.name, src.s.zones[z].name
        );
        eprintln!("error: {line}");
        self.errors.push(line);
        if let Some(entry) = self
            .manifest
            .sources
            .get_mut(i)
            .and_then(|s| s.zones.get_mut(z))
        {
            entry.status = ZoneStatus::Failed;
            entry.error = Some(msg.to_owned());
            entry.failed_at_uptime_us = Some(at_us);
        }
    }

    /// What ran since the last drain; `None` without attribution.
    fn activity(&mut self) -> Option<Activity> {
        let a = self.attribution.as_mut()?;
        for b in a.batches.iter_mut() {
            b.data.clear();
            b.records = 0;
        }
        if let RResult::RErr(e) = a.probe.drain(0, &mut a.batches) {
            let msg = format!("the cpu_time probe failed: {e}");
            eprintln!("error: power: {msg}; energy is no longer attributed (the run goes on)");
            self.errors.push(format!("power attribution: {msg}"));
            self.manifest.attribution.status = AttributionStatus::Failed;
            self.manifest.attribution.error = Some(msg);
            self.stop_attribution();
            return None;
        }
        let batch = a.batches.first()?;
        Some(a.reader.read(&batch.data))
    }

    /// One slot ending at `end_us`.
    fn slot(&mut self, end_us: u64) {
        let t0 = clock::uptime_us();
        let start_us = self.last_us;
        for i in 0..self.sources.len() {
            self.read_source(i, end_us, false);
        }
        let activity = self.activity();
        let read_us = clock::uptime_us().saturating_sub(t0);
        self.manifest.timing.max_late_us = self
            .manifest
            .timing
            .max_late_us
            .max(t0.saturating_sub(end_us));
        self.reads += 1;
        self.read_us_total += read_us;

        self.rows.clear();
        let mut rows = 0u64;
        for (i, src) in self.sources.iter().enumerate() {
            for (z, zone) in src.s.zones.iter().enumerate() {
                let Some(delta) = src.delta[z] else { continue };
                EnergyRow {
                    end_us,
                    start_us,
                    source: &src.s.name,
                    zone: &zone.name,
                    scope: zone.scope,
                    socket: zone.socket,
                    energy_uj: delta,
                    measured: zone.measured,
                }
                .write(&mut self.rows);
                rows += 1;
                if let Some(e) = self.manifest.sources[i].zones.get_mut(z) {
                    e.energy_uj += delta;
                }
            }
        }
        if rows > 0 {
            if let Err(e) = self.energy.push(&self.rows, rows) {
                self.table_error("energy", &e.to_string());
            }
        }
        self.manifest.slots += 1;
        self.last_us = end_us;
        if self.manifest.attribution.status == AttributionStatus::Ok {
            match activity {
                Some(a) => self.attribute(start_us, end_us, &a),
                None => self.manifest.attribution.slots_without_cpu_time += 1,
            }
        }
    }

    /// Splits each attributed scope's energy of the slot.
    fn attribute(&mut self, start_us: u64, end_us: u64, activity: &Activity) {
        let cpu: Vec<u64> = activity.processes.iter().map(|p| p.cpu_time_us).collect();
        if activity.busy_us() + activity.idle_us == 0 {
            self.manifest.attribution.slots_without_cpu_time += 1;
            return;
        }
        self.attribution_rows.clear();
        let mut rows = 0u64;
        for scope in ATTRIBUTED {
            // The first source in order of preference whose zones of this
            // scope were all read in this slot.
            let chosen = self.sources.iter().find_map(|src| {
                let zones: Vec<usize> = (0..src.s.zones.len())
                    .filter(|&z| src.s.zones[z].scope == *scope)
                    .collect();
                if zones.is_empty() || zones.iter().any(|&z| src.delta[z].is_none()) {
                    return None;
                }
                let energy: u64 = zones.iter().filter_map(|&z| src.delta[z]).sum();
                let measured = zones.iter().all(|&z| src.s.zones[z].measured);
                Some((src.s.name.as_str(), energy, measured))
            });
            let Some((source, energy, measured)) = chosen else {
                continue;
            };
            let (parts, idle) = split_slot(energy, &cpu, activity.idle_us);
            // The idle row, written last; the processes' rows are it with
            // their own figures.
            let idle_row = AttributionRow {
                end_us,
                start_us,
                tgid: 0,
                comm: "idle",
                cgroup_id: 0,
                cgroup: "",
                cpu_time_us: activity.idle_us,
                energy_uj: idle,
                scope_energy_uj: energy,
                scope: *scope,
                source,
                measured,
            };
            for (p, &uj) in activity.processes.iter().zip(&parts) {
                AttributionRow {
                    tgid: p.tgid,
                    comm: &p.comm,
                    cgroup_id: p.cgroup_id,
                    cgroup: &p.cgroup,
                    cpu_time_us: p.cpu_time_us,
                    energy_uj: uj,
                    ..idle_row
                }
                .write(&mut self.attribution_rows);
                rows += 1;
            }
            idle_row.write(&mut self.attribution_rows);
            rows += 1;
            let t = self.scopes.entry(scope.0).or_insert_with(|| ScopeTotals {
                measured: true,
                ..ScopeTotals::default()
            });
            if !t.sources.iter().any(|s| s == source) {
                t.sources.push(source.to_owned());
            }
            t.measured &= measured;
            t.energy_uj += energy;
            t.idle_uj += idle;
            t.attributed_uj += energy - idle;
            t.slots += 1;
        }
        if rows > 0 {
            if let Some(sink) = self.attributed.as_mut() {
                if let Err(e) = sink.push(&self.attribution_rows, rows) {
                    self.table_error("energy_attribution", &e.to_string());
                }
            }
        }
    }

    fn table_error(&mut self, table: &str, e: &str) {
        let line = format!("power: writing table {table}: {e}");
        if !self.errors.contains(&line) {
            eprintln!("error: {line}");
            self.errors.push(line);
        }
    }

    fn stop_attribution(&mut self) -> Option<(String, Vec<BpfProgramStats>)> {
        let mut a = self.attribution.take()?;
        let _ = a.probe.stop();
        let stats = a.probe.bpf_stats().into_vec();
        Some(("cpu_time".to_owned(), stats))
    }

    fn finish(mut self) -> Finished {
        let probe_stats = self.stop_attribution();
        if let Some((_, stats)) = &probe_stats {
            self.manifest.attribution.programs = stats
                .iter()
                .map(|s| ProgramCost {
                    name: s.name.to_string(),
                    run_cnt: s.run_cnt,
                    run_time_ns: s.run_time_ns,
                    ns_per_run: if s.run_cnt == 0 {
                        0.0
                    } else {
                        s.run_time_ns as f64 / s.run_cnt as f64
                    },
                })
                .collect();
        }
        for src in self.manifest.sources.iter_mut() {
            for e in src.zones.iter_mut() {
                let until = e.failed_at_uptime_us.unwrap_or(self.last_us);
                let span = until.saturating_sub(self.started_us).max(1);
                e.mean_power_uw =
                    u64::try_from(u128::from(e.energy_uj) * 1_000_000 / u128::from(span))
                        .unwrap_or(u64::MAX);
            }
        }
        self.manifest.attribution.scopes = self
            .scopes
            .iter()
            .map(|(&scope, t)| ScopeEntry {
                scope: PowerScope(scope).name().unwrap_or("?").to_owned(),
                sources: t.sources.clone(),
                measured: t.measured,
                energy_uj: t.energy_uj,
                attributed_uj: t.attributed_uj,
                idle_uj: t.idle_uj,
                slots: t.slots,
            })
            .collect();
        self.manifest.cross_checks = cross_checks(&self.manifest);
        self.manifest.timing = Timing {
            max_late_us: self.manifest.timing.max_late_us,
            mean_read_us: self.read_us_total.checked_div(self.reads).unwrap_or(0),
        };
        let mut tables = Vec::new();
        let (rows, result) = self.energy.finish();
        if let Err(e) = result {
            self.errors
                .push(format!("power: finishing table energy: {e}"));
        }
        tables.push(("energy".to_owned(), rows));
        if let Some(sink) = self.attributed.take() {
            let (rows, result) = sink.finish();
            if let Err(e) = result {
                self.errors
                    .push(format!("power: finishing table energy_attribution: {e}"));
            }
            tables.push(("energy_attribution".to_owned(), rows));
        }
        Finished {
            manifest: self.manifest,
            errors: self.errors,
            tables,
            probe_stats,
        }
    }
}

/// Why `delta_uj` read `elapsed_us` after the previous read cannot be the
/// energy of `zone`: more than its scope's bound can draw in that time,
/// plus the zone's update interval (a counter publishes energy up to one
/// update late). `None` when it can.
fn implausible(
    delta_uj: u64,
    elapsed_us: u64,
    zone: &kernmlops_plugin_api::PowerZone,
    max_watts: &MaxWatts,
) -> Option<String> {
    let max = max_watts.of(zone.scope);
    let window_us = elapsed_us.saturating_add(zone.update_interval_us).max(1);
    // W × µs = µJ.
    if u128::from(delta_uj) <= u128::from(max) * u128::from(window_us) {
        return None;
    }
    let scope = zone.scope.name().unwrap_or("?");
    Some(format!(
        "its energy rose by {:.3} J in {:.3} s ({:.0} W), more than a {scope} zone can draw \
         (power.max_watts.{scope} = {max} W): the reading is implausible",
        delta_uj as f64 / 1e6,
        elapsed_us as f64 / 1e6,
        delta_uj as f64 / elapsed_us.max(1) as f64,
    ))
}

/// Zones of the same scope and socket from different measured sources:
/// their totals side by side, and how far they differ.
fn cross_checks(m: &PowerManifest) -> Vec<CrossCheck> {
    // (scope, socket) -> (source/zone, total)
    type Group = Vec<(String, u64)>;
    let mut groups: BTreeMap<(String, Option<u32>), Group> = BTreeMap::new();
    for s in m.sources.iter().filter(|s| s.measured) {
        for z in s.zones.iter().filter(|z| z.status == ZoneStatus::Ok) {
            groups
                .entry((z.scope.clone(), z.socket))
                .or_default()
                .push((format!("{}/{}", s.name, z.name), z.energy_uj));
        }
    }
    groups
        .into_iter()
        .filter(|(_, zones)| {
            // From at least two different sources.
            let first = zones[0].0.split('/').next();
            zones.iter().any(|(n, _)| n.split('/').next() != first)
        })
        .map(|((scope, socket), zones)| {
            let base = zones[0].1.max(1) as f64;
            let diff = zones
                .iter()
                .map(|(_, e)| (*e as f64 - zones[0].1 as f64).abs() / base * 100.0)
                .fold(0.0, f64::max);
            CrossCheck {
                scope,
                socket,
                zones: zones.iter().map(|(n, _)| n.clone()).collect(),
                energy_uj: zones.iter().map(|(_, e)| *e).collect(),
                difference_pct: (diff * 100.0).round() / 100.0,
            }
        })
        .collect()
}
