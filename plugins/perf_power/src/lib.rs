//! perf_power: RAPL energy through the perf `power` PMU
//! (`/sys/bus/event_source/devices/power`): `energy-pkg`, `energy-cores`,
//! `energy-gpu`, `energy-ram` and `energy-psys`, each counted system-wide
//! on one CPU per package (the PMU's `cpumask`), scaled to microjoules by
//! the event's `.scale` (Joules per count) after checking its `.unit`.
//! Unlike powercap's `energy_uj`, root-only since Linux 5.10, these open
//! with CAP_PERFMON. Counts are 64-bit (the kernel handles the hardware
//! counter's wrap); a count that goes backwards fails its zone.
//!
//! Zone names match the `rapl` source's (`package-0`, `core-0`, `dram-1`,
//! `psys`), so the host can cross-check the two when both run.

use std::{io, os::fd::OwnedFd, path::Path, time::Duration};

use kernmlops_perf_events::{open_counter, pmu_at, pmu_spec, read_counter, EventSpec};
use kernmlops_plugin_sdk::{
    api::ErrorKind,
    export_plugin,
    power::{read_text, PowerScope, PowerSourceImpl, SysfsRoot, WrapCounter, Zone, ZoneReading},
    settings, Error, Result, StartArgs,
};

/// RAPL counters update about every millisecond.
pub const UPDATE_INTERVAL: Duration = Duration::from_millis(1);

/// The PMU's events: name, scope, zone name prefix.
pub const EVENTS: &[(&str, PowerScope, &str)] = &[
    ("energy-pkg", PowerScope::PACKAGE, "package"),
    ("energy-cores", PowerScope::CORE, "core"),
    ("energy-gpu", PowerScope::UNCORE, "uncore"),
    ("energy-ram", PowerScope::DRAM, "dram"),
    ("energy-psys", PowerScope::PLATFORM, "psys"),
];

settings! {
    /// `[power.settings.perf_power]` settings.
    pub struct Settings {
        /// Where sysfs is mounted (tests point it at a tree they write).
        pub sysfs_root: SysfsRoot = SysfsRoot::default(),
    }
}

/// One counter to open: a zone, its event, the CPU it counts on, and
/// microjoules per count.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub zone: Zone,
    pub event: String,
    pub spec: EventSpec,
    pub cpu: u32,
    pub uj_per_count: f64,
}

/// CPUs of a list like `0,28` or `0-1`.
fn cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.trim().parse::<u32>().ok()?..=b.trim().parse().ok()?),
            None => out.push(part.trim().parse().ok()?),
        }
    }
    Some(out)
}

/// The counters the PMU under `root` offers, and notes for what was
/// skipped. No PMU, or no usable event, is an error saying why.
pub fn plan(root: &SysfsRoot) -> Result<(Vec<Planned>, Vec<String>)> {
    let devices = root.join("bus/event_source/devices");
    let Some(pmu) = pmu_at(&devices, "power") else {
        let hint = root.vm_hint("RAPL");
        return Err(Error::unsupported(format!(
            "no power PMU here: {} has no readable type (the rapl perf driver is not loaded or the CPU has no RAPL){hint}",
            devices.join("power").display()
        )));
    };
    let cpumask = pmu.dir.join("cpumask");
    let cpus = read_text(&cpumask)
        .ok()
        .and_then(|t| cpu_list(&t))
        .filter(|c| !c.is_empty())
        .ok_or_else(|| Error::unsupported(format!("{} lists no CPU", cpumask.display())))?;
    let socket_of = |cpu: u32, i: usize| {
        read_text(&root.join(format!(
            "devices/system/cpu/cpu{cpu}/topology/physical_package_id"
        )))
        .ok()
        .and_then(|t| t.parse::<u32>().ok())
        .unwrap_or(i as u32)
    };
    let mut planned = Vec::new();
    let mut notes = Vec::new();
    let has_pkg = pmu.dir.join("events/energy-pkg").exists();
    for &(event, scope, prefix) in EVENTS {
        let file = pmu.dir.join("events").join(event);
        if !file.exists() {
            continue;
        }
        let unit =
            read_text(&pmu.dir.join("events").join(format!("{event}.unit"))).unwrap_or_default();
        if unit != "Joules" {
            notes.push(format!(
                "power/{event}/ counts in {unit:?}, not Joules; skipped"
            ));
            continue;
        }
        let scale_file = pmu.dir.join("events").join(format!("{event}.scale"));
        let scale = read_text(&scale_file)
            .ok()
            .and_then(|t| t.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0);
        let Some(scale) = scale else {
            notes.push(format!(
                "power/{event}/ has no usable scale ({}); skipped",
                scale_file.display()
            ));
            continue;
        };
        let spec = match pmu_spec(&pmu, event) {
            Ok(s) => s,
            Err(e) => {
                notes.push(format!("power/{event}/: {e}; skipped"));
                continue;
            }
        };
        // psys covers the platform: counted once.
        let on: &[u32] = if scope == PowerScope::PLATFORM {
            &cpus[..1]
        } else {
            &cpus
        };
        for (i, &cpu) in on.iter().enumerate() {
            let socket = socket_of(cpu, i);
            let mut zone = if scope == PowerScope::PLATFORM {
                Zone::measured("psys", scope, UPDATE_INTERVAL)
            } else {
                Zone::measured(format!("{prefix}-{socket}"), scope, UPDATE_INTERVAL).socket(socket)
            };
            zone = zone.describe(format!("perf power/{event}/ on CPU {cpu}"));
            if matches!(scope, PowerScope::CORE | PowerScope::UNCORE) && has_pkg {
                zone = zone.parent(format!("package-{socket}"));
            }
            planned.push(Planned {
                zone,
                event: event.to_owned(),
                spec,
                cpu,
                uj_per_count: scale * 1e6,
            });
        }
    }
    if planned.is_empty() {
        return Err(Error::unsupported(format!(
            "no power PMU event here: {} has none of {}{}",
            pmu.dir.join("events").display(),
            EVENTS.iter().map(|e| e.0).collect::<Vec<_>>().join(", "),
            if notes.is_empty() {
                String::new()
            } else {
                format!(" usable ({})", notes.join("; "))
            }
        )));
    }
    Ok((planned, notes))
}

/// Where a zone's count comes from: a perf counter, or a stand-in in tests.
pub trait Counter: Send {
    /// The count since the counter opened.
    fn count(&mut self) -> io::Result<u64>;
}

struct PerfCounter(OwnedFd);

impl Counter for PerfCounter {
    fn count(&mut self) -> io::Result<u64> {
        read_counter(&self.0).map(|r| r.count)
    }
}

/// Opens `p`'s counter system-wide on its CPU.
fn open(p: &Planned) -> Result<Box<dyn Counter>> {
    open_counter(&p.spec, -1, p.cpu as i32, false, 0)
        .map(|fd| Box::new(PerfCounter(fd)) as Box<dyn Counter>)
        .map_err(|e| {
            let what = format!("opening power/{}/ on CPU {}", p.event, p.cpu);
            match e.raw_os_error() {
                Some(libc::EACCES) | Some(libc::EPERM) => Error::of(
                    ErrorKind::PERMISSION,
                    format!("{what}: {e} (needs CAP_PERFMON or root, or kernel.perf_event_paranoid <= 0)"),
                ),
                _ => Error::unsupported(format!("{what}: {e}")),
            }
        })
}

/// The running source.
pub struct PerfPower {
    planned: Vec<Planned>,
    counters: Vec<Box<dyn Counter>>,
    wraps: Vec<WrapCounter>,
    notes: Vec<String>,
}

impl PerfPower {
    /// A source over counters already opened (one per planned zone), for
    /// tests and for counters read another way.
    pub fn with_counters(
        planned: Vec<Planned>,
        counters: Vec<Box<dyn Counter>>,
        notes: Vec<String>,
    ) -> Result<Self> {
        if planned.len() != counters.len() {
            return Err(Error::new(format!(
                "{} counters for {} zones",
                counters.len(),
                planned.len()
            )));
        }
        Ok(Self {
            wraps: planned.iter().map(|_| WrapCounter::new(None)).collect(),
            planned,
            counters,
            notes,
        })
    }
}

impl PowerSourceImpl for PerfPower {
    const NAME: &'static str = "perf_power";
    const DESCRIPTION: &'static str =
        "RAPL energy through the perf power PMU, system-wide per package, readable with CAP_PERFMON";
    const SCOPE: PowerScope = PowerScope::PACKAGE;
    const UPDATE_INTERVAL: Duration = UPDATE_INTERVAL;
    type Settings = Settings;

    fn start(_args: &StartArgs, settings: Settings) -> Result<Self> {
        let (planned, notes) = plan(&settings.sysfs_root)?;
        let counters = planned.iter().map(open).collect::<Result<Vec<_>>>()?;
        Self::with_counters(planned, counters, notes)
    }

    fn zones(&self) -> Vec<Zone> {
        self.planned.iter().map(|p| p.zone.clone()).collect()
    }

    fn read(&mut self, _now_us: u64, out: &mut Vec<ZoneReading>) -> Result<()> {
        for ((p, c), w) in self
            .planned
            .iter()
            .zip(&mut self.counters)
            .zip(&mut self.wraps)
        {
            out.push(
                c.count()
                    .map_err(|e| format!("reading power/{}/ on CPU {}: {e}", p.event, p.cpu))
                    .and_then(|raw| {
                        w.update(raw)
                            .map_err(|e| format!("power/{}/ on CPU {}: {e}", p.event, p.cpu))
                    })
                    .map(|counts| (counts as f64 * p.uj_per_count) as u64),
            );
        }
        Ok(())
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }
}

/// Whether `path` exists, for tests of a real machine.
pub fn has_power_pmu(root: &SysfsRoot) -> bool {
    Path::new(&root.join("bus/event_source/devices/power/type")).exists()
}

export_plugin! {
    description: "RAPL energy through the perf power PMU",
    power_sources: [PerfPower],
}
