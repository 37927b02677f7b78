//! Power and energy in a run. Power sources are plugin components (RAPL,
//! the perf power PMU, hwmon, a model, a vendor's meter); the host picks
//! them (`--power`, `[power] sources`), checks their zones and update
//! intervals before anything is collected, reads them all at the same slot
//! boundaries, writes the `energy` table, and splits each slot's energy
//! between the processes that ran, by their on-CPU time from the kernel
//! (the `cpu_time` probe), into `energy_attribution`.
//!
//! - [`config`]: `[power]` and the run's [`PowerOptions`];
//! - [`registry`]: the installed sources, checked and unique;
//! - [`sampler`]: the power thread (slots, rows, zone failures);
//! - [`attribution`]: the exact split of a slot's energy;
//! - [`tables`]: the two tables' declarations and rows;
//! - [`report`]: the manifest's `power` section and summary lines;
//! - [`list`]: `kernmlops power-list`.
//!
//! The host loads no BPF itself: on-CPU time comes from the `cpu_time`
//! probe plugin, which the power thread starts and drains.

pub mod attribution;
pub mod config;
pub mod list;
pub mod registry;
pub mod report;
mod sampler;
pub mod tables;

use std::{
    path::Path,
    sync::mpsc::{channel, Sender},
    thread::JoinHandle,
};

use abi_stable::std_types::RVec;
use kernmlops_plugin_api::{
    validate_power_zones, Batch, BpfProgramStats, PowerSourceBox, PowerZone, StartArgs,
};

pub use config::{PowerConfig, PowerConfigError, PowerInterval, PowerOptions, Selection};
pub use report::{render_summary, PowerManifest};

use self::{
    config::Choice,
    registry::PowerSources,
    report::{AttributionEntry, AttributionStatus, SourceEntry, Unavailable, ZoneEntry},
    sampler::{Attribution, Sampler},
};
use crate::{
    decode::TableDecoder,
    plugin::Registry,
    sink::{FlushPolicy, IpcSink},
};

/// The probe on-CPU time comes from.
pub const CPU_TIME_PROBE: &str = "cpu_time";

/// Why power cannot be collected as asked.
#[derive(Debug, thiserror::Error)]
pub enum PowerError {
    /// `[power]` or `--power` is wrong.
    #[error("{0}")]
    Config(String),
    /// A named source is not installed, or refused.
    #[error("{0}")]
    Selection(String),
    /// No source asked for works on this machine.
    #[error("{0}")]
    NoSource(String),
    /// The slot is shorter than a source's update interval.
    #[error("{0}")]
    Interval(String),
    /// The power tables cannot be created.
    #[error("{0}")]
    Tables(String),
}

/// A started source with what it said about itself.
pub(crate) struct StartedSource {
    pub name: String,
    pub plugin: String,
    pub zones: Vec<PowerZone>,
    pub notes: Vec<String>,
    pub model: Option<serde_json::Value>,
    pub source: PowerSourceBox,
}

impl StartedSource {
    fn measured(&self) -> bool {
        self.zones.iter().all(|z| z.measured)
    }
}

/// Sources started and checked, before the collection folder exists.
pub struct Prepared {
    options: PowerOptions,
    sources: Vec<StartedSource>,
    unavailable: Vec<Unavailable>,
}

fn format_us(us: u64) -> String {
    kernmlops_sys::duration::format_duration(std::time::Duration::from_micros(us))
}

/// A named source must be installed and not refused.
fn check_installed(installed: &PowerSources<'_>, name: &str) -> Result<(), PowerError> {
    if installed.find(name).is_some() {
        return Ok(());
    }
    Err(PowerError::Selection(match installed.refused(name) {
        Some(r) => format!(
            "power source {name} (plugin {}) is refused: {}",
            r.plugin, r.reason
        ),
        None => format!(
            "no power source named {name}; installed: {} (see `kernmlops power-list`)",
            if installed.sources.is_empty() {
                "none".to_owned()
            } else {
                installed.names().join(", ")
            }
        ),
    }))
}

/// Checks a source list as `--power` takes it against the installed
/// sources, without starting any: for plans made before the runs.
pub fn check_selection(registry: &Registry, list: &[String]) -> Result<(), PowerError> {
    let Selection::Sources(choices) =
        Selection::parse(list).map_err(|e| PowerError::Selection(e.to_string()))?
    else {
        return Ok(());
    };
    let installed = PowerSources::of(registry);
    for choice in &choices {
        if let Choice::Named(name) = choice {
            check_installed(&installed, name)?;
        }
    }
    Ok(())
}

/// Starts the sources `opts` selects, in order of preference, and checks
/// their zones and update intervals. `None` when power is off. A source
/// that cannot start is left out (a warning when it was named); none
/// working is an error, as is a named source whose update interval is
/// longer than the slot.
pub fn prepare(registry: &Registry, opts: &PowerOptions) -> Result<Option<Prepared>, PowerError> {
    let Selection::Sources(choices) = &opts.selection else {
        return Ok(None);
    };
    let installed = PowerSources::of(registry);
    // (name, explicit, position of its choice)
    let mut order: Vec<(String, bool, usize)> = Vec::new();
    for (pos, choice) in choices.iter().enumerate() {
        match choice {
            Choice::Named(name) => {
                check_installed(&installed, name)?;
                order.retain(|(n, explicit, _)| *explicit || n != name);
                if !order.iter().any(|(n, _, _)| n == name) {
                    order.push((name.clone(), true, pos));
                }
            }
            Choice::Auto => {
                for s in &installed.sources {
                    if !order.iter().any(|(n, _, _)| n == s.name()) {
                        order.push((s.name().to_owned(), false, pos));
                    }
                }
            }
        }
    }
    let interval_us = u64::try_from(opts.interval.as_micros()).unwrap_or(u64::MAX);
    let mut started: Vec<(StartedSource, bool, usize)> = Vec::new();
    let mut unavailable = Vec::new();
    let mut warnings = Vec::new();
    for (name, explicit, pos) in order {
        let Some(inst) = installed.find(&name) else {
            continue;
        };
        let config = opts
            .settings
            .get(&name)
            .map_or_else(|| "{}".to_owned(), |v| v.to_string());
        let mut skip = |reason: String| {
            if explicit {
                warnings.push(format!("power source {name} not used: {reason}"));
            }
            unavailable.push(Unavailable {
                name: name.clone(),
                plugin: inst.plugin.name().to_owned(),
                reason,
            });
        };
        let source = match inst.start(&config) {
            Ok(s) => s,
            // The user's settings are wrong: say so, whoever chose the source.
            Err(e) if e.kind == kernmlops_plugin_api::ErrorKind::CONFIG => {
                return Err(PowerError::Config(e.to_string()))
            }
            Err(e) => {
                skip(e.to_string());
                continue;
            }
        };
        let zones = source.zones().into_vec();
        if let Err(e) = validate_power_zones(&zones) {
            skip(format!("refused: {e}"));
            continue;
        }
        if let Some(slow) = zones
            .iter()
            .filter(|z| z.update_interval_us > interval_us)
            .max_by_key(|z| z.update_interval_us)
        {
            let msg = format!(
                "the power interval {} is shorter than power source {name}'s update interval, {} (zone {}); set [power] interval or --power-interval to at least {}",
                format_us(interval_us),
                format_us(slow.update_interval_us),
                slow.name,
                format_us(slow.update_interval_us)
            );
            if explicit {
                return Err(PowerError::Interval(msg));
            }
            skip(msg);
            continue;
        }
        let model = Some(source.model().to_string())
            .filter(|m| !m.is_empty())
            .and_then(|m| serde_json::from_str(&m).ok());
        started.push((
            StartedSource {
                notes: source.notes().into_iter().map(String::from).collect(),
                name: name.clone(),
                plugin: inst.plugin.name().to_owned(),
                zones,
                model,
                source,
            },
            explicit,
            pos,
        ));
    }
    if started.is_empty() {
        let why: Vec<String> = unavailable
            .iter()
            .map(|u| format!("{}: {}", u.name, u.reason))
            .collect();
        return Err(PowerError::NoSource(if why.is_empty() {
            "no power source is installed (build them with `cargo xtask build-plugins`)".into()
        } else {
            format!("no power source works here: {}", why.join("; "))
        }));
    }
    for w in warnings {
        eprintln!("warning: {w}");
    }
    // Named sources in the order given; those `auto` found where it
    // stood, meters before models.
    started.sort_by_key(|(s, explicit, pos)| (*pos, !*explicit && !s.measured()));
    Ok(Some(Prepared {
        options: opts.clone(),
        sources: started.into_iter().map(|(s, _, _)| s).collect(),
        unavailable,
    }))
}

/// The power thread of a running collection.
pub struct PowerRunning {
    stop: Sender<()>,
    handle: JoinHandle<sampler::Finished>,
    /// The manifest section as it stood at the start.
    pub manifest: PowerManifest,
}

/// What the power thread leaves: the manifest section, errors for the
/// run's list, the tables with their rows, and the cpu_time probe's BPF
/// statistics (for the run's cost).
pub struct PowerOutcome {
    pub manifest: PowerManifest,
    pub errors: Vec<String>,
    pub tables: Vec<(String, u64)>,
    pub probe_stats: Option<(String, Vec<BpfProgramStats>)>,
}

impl Prepared {
    /// The manifest section before any slot.
    fn manifest(&self) -> PowerManifest {
        PowerManifest {
            requested: self.options.requested.clone(),
            interval_us: u64::try_from(self.options.interval.as_micros()).unwrap_or(u64::MAX),
            sources: self
                .sources
                .iter()
                .map(|s| SourceEntry {
                    name: s.name.clone(),
                    plugin: s.plugin.clone(),
                    measured: s.measured(),
                    notes: s.notes.clone(),
                    model: s.model.clone(),
                    zones: s
                        .zones
                        .iter()
                        .map(|z| ZoneEntry {
                            name: z.name.to_string(),
                            scope: z.scope.name().unwrap_or("?").to_owned(),
                            socket: u32::try_from(z.socket).ok(),
                            kind: if z.measured { "measured" } else { "modelled" }.into(),
                            update_interval_us: z.update_interval_us,
                            parent: Some(z.parent.to_string()).filter(|p| !p.is_empty()),
                            description: z.description.to_string(),
                            ..ZoneEntry::default()
                        })
                        .collect(),
                })
                .collect(),
            unavailable: self.unavailable.clone(),
            attribution: AttributionEntry {
                model: "cpu_time".into(),
                probe: CPU_TIME_PROBE.into(),
                ..AttributionEntry::default()
            },
            ..PowerManifest::default()
        }
    }

    /// Creates the tables in `dir`, starts the cpu_time probe (when
    /// attributing) and the power thread, which takes the baseline reads
    /// at once.
    pub fn start(
        self,
        registry: &Registry,
        dir: &Path,
        collection_id: &str,
        flush: FlushPolicy,
    ) -> Result<PowerRunning, PowerError> {
        let mut manifest = self.manifest();
        let sink = |table: kernmlops_plugin_api::TableDecl| {
            let path = dir.join(format!("{}.arrow", table.name));
            if path.exists() {
                return Err(PowerError::Tables(format!(
                    "table {} is already written by a probe of this run; the host writes it for power sources",
                    table.name
                )));
            }
            IpcSink::create(&path, TableDecoder::new(&table, collection_id), flush)
                .map_err(|e| PowerError::Tables(e.to_string()))
        };
        let energy = sink(tables::energy_table())?;
        let mut attribution = None;
        let mut attributed = None;
        if self.options.attribution {
            match start_cpu_time(registry) {
                Ok((a, plugin)) => {
                    attributed = Some(sink(tables::attribution_table())?);
                    manifest.attribution.status = AttributionStatus::Ok;
                    manifest.attribution.plugin = plugin;
                    attribution = Some(a);
                }
                Err(e) => {
                    eprintln!("warning: power: energy is not attributed to processes: {e}");
                    manifest.attribution.status = AttributionStatus::Failed;
                    manifest.attribution.error = Some(e.to_string());
                }
            }
        }
        announce(&manifest);
        let interval_us = manifest.interval_us.max(1);
        let sampler = Sampler::new(
            interval_us,
            self.options.max_watts,
            self.sources,
            attribution,
            energy,
            attributed,
            manifest.clone(),
        );
        let (stop, rx) = channel();
        let handle = std::thread::Builder::new()
            .name("kml-power".into())
            .spawn(move || sampler.run(rx))
            .map_err(|e| PowerError::Tables(format!("starting the power thread: {e}")))?;
        Ok(PowerRunning {
            stop,
            handle,
            manifest,
        })
    }
}

/// Starts the cpu_time probe as the power thread drains it: a row per
/// process at every drain, every process (the collector too), no filter.
fn start_cpu_time(
    registry: &Registry,
) -> Result<(Attribution, String), attribution::AttributionError> {
    use attribution::AttributionError;
    let (plugin, _) = registry
        .find_probe(CPU_TIME_PROBE)
        .ok_or(AttributionError::NotInstalled)?;
    let args = StartArgs::new(r#"{"interval":"0s"}"#).with_include_self(true);
    let probe = plugin
        .start_probe(CPU_TIME_PROBE, &args)
        .map_err(AttributionError::Start)?;
    let tables = probe.tables().into_vec();
    let table = tables.first().ok_or(AttributionError::NoTable)?;
    let reader = attribution::CpuTimeReader::new(table)?;
    let batches: RVec<Batch> = tables.iter().map(|_| Batch::default()).collect();
    Ok((
        Attribution {
            probe,
            reader,
            batches,
        },
        plugin.name().to_owned(),
    ))
}

/// One line saying what power is collected.
fn announce(m: &PowerManifest) {
    let sources: Vec<String> = m
        .sources
        .iter()
        .map(|s| {
            format!(
                "{} ({} zone(s), {})",
                s.name,
                s.zones.len(),
                if s.measured { "measured" } else { "modelled" }
            )
        })
        .collect();
    let attributed = match m.attribution.status {
        AttributionStatus::Ok => "; energy attributed to processes by on-CPU time",
        _ => "",
    };
    eprintln!(
        "power: {} every {}{attributed}",
        sources.join(", "),
        format_us(m.interval_us)
    );
    let skipped: Vec<&str> = m.unavailable.iter().map(|u| u.name.as_str()).collect();
    if !skipped.is_empty() {
        eprintln!(
            "power: not available here: {} (see `kernmlops power-list`)",
            skipped.join(", ")
        );
    }
}

impl PowerRunning {
    /// Ends the last slot now, closes the tables and returns what the run
    /// records.
    pub fn finish(self) -> PowerOutcome {
        let _ = self.stop.send(());
        match self.handle.join() {
            Ok(f) => PowerOutcome {
                manifest: f.manifest,
                errors: f.errors,
                tables: f.tables,
                probe_stats: f.probe_stats,
            },
            Err(_) => PowerOutcome {
                manifest: self.manifest,
                errors: vec!["power: the power thread panicked; its tables may be incomplete (kernmlops repair closes them)".into()],
                tables: Vec::new(),
                probe_stats: None,
            },
        }
    }
}
