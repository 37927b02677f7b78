//! rapl: the CPU's RAPL energy counters through the powercap sysfs tree
//! (`/sys/class/powercap/intel-rapl:N[:M]`, which AMD CPUs expose too):
//! every package zone and its sub-zones (core, uncore, DRAM) per socket,
//! and psys (the platform) where the CPU has it. Each zone's `energy_uj` is
//! read at every slot boundary and corrected for the wrap at its
//! `max_energy_range_uj`; the first read is the baseline.
//!
//! Zone names say what and where: `package-0`, `core-0`, `uncore-0`,
//! `dram-1`, `psys`. Core and uncore are inside their package (`parent`),
//! so the host never adds them to it; DRAM and psys are zones of their own
//! scope. The MMIO interface (`intel-rapl-mmio:N`) repeats the package
//! zone of the MSR one and is used only where the MSR one is missing.
//!
//! `energy_uj` is readable by root only since Linux 5.10; without root,
//! `perf_power` reads the same counters with CAP_PERFMON.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use kernmlops_plugin_sdk::{
    export_plugin,
    power::{
        read_text, read_u64, PowerScope, PowerSourceImpl, SysfsRoot, WrapCounter, Zone, ZoneReading,
    },
    settings, Error, Result, StartArgs,
};

/// RAPL counters update about every millisecond.
pub const UPDATE_INTERVAL: Duration = Duration::from_millis(1);

settings! {
    /// `[power.settings.rapl]` settings.
    pub struct Settings {
        /// Where sysfs is mounted (tests point it at a tree they write).
        pub sysfs_root: SysfsRoot = SysfsRoot::default(),
    }
}

/// A zone found in the powercap tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub zone: Zone,
    /// The zone's folder (holding `energy_uj`).
    pub dir: PathBuf,
    /// `max_energy_range_uj`: where `energy_uj` wraps.
    pub range_uj: Option<u64>,
}

/// `intel-rapl:0:1` -> (`intel-rapl`, [0, 1]); `None` for other entries.
fn parse_entry(name: &str) -> Option<(&str, Vec<u32>)> {
    let mut parts = name.split(':');
    let kind = parts.next()?;
    if !kind.contains("rapl") {
        return None;
    }
    let idx: Vec<u32> = parts.map(|p| p.parse().ok()).collect::<Option<_>>()?;
    (!idx.is_empty() && idx.len() <= 2).then_some((kind, idx))
}

/// Every RAPL zone under `root`, with notes for what was skipped. No zone
/// at all is an error saying why.
pub fn discover(root: &SysfsRoot) -> Result<(Vec<Found>, Vec<String>)> {
    let dir = root.join("class/powercap");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) => {
            let hint = root.vm_hint("RAPL");
            return Err(Error::unsupported(format!(
                "no RAPL here: {} {} (no powercap driver: intel_rapl_msr is not loaded or the CPU has no RAPL){hint}",
                dir.display(),
                if e.kind() == std::io::ErrorKind::NotFound {
                    "does not exist".to_owned()
                } else {
                    format!("cannot be read ({e})")
                }
            )));
        }
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    // MSR before MMIO, packages before their sub-zones.
    names.sort_by_key(|n| {
        let (kind, idx) = parse_entry(n).unwrap_or(("~", vec![u32::MAX]));
        (kind.contains("mmio"), idx)
    });
    let mut found: Vec<Found> = Vec::new();
    let mut notes = Vec::new();
    // (kind, package index) -> socket, from the package zones.
    let mut sockets: Vec<((String, u32), Option<u32>, String)> = Vec::new();
    let mut psys = 0;
    for entry in names {
        let Some((kind, idx)) = parse_entry(&entry) else {
            continue;
        };
        let zone_dir = dir.join(&entry);
        if !zone_dir.join("energy_uj").exists() {
            continue;
        }
        let label = read_text(&zone_dir.join("name")).unwrap_or_default();
        let range_uj = read_u64(&zone_dir.join("max_energy_range_uj")).ok();
        let top = (kind.to_owned(), idx[0]);
        let parent = sockets.iter().find(|(k, _, _)| *k == top).cloned();
        let zone = if let Some(socket) = label.strip_prefix("package-") {
            let socket: Option<u32> = socket.parse().ok();
            let name = format!("package-{}", socket.unwrap_or(idx[0]));
            sockets.push((top, socket, name.clone()));
            let z = Zone::measured(&name, PowerScope::PACKAGE, UPDATE_INTERVAL).describe(format!(
                "RAPL package domain of socket {}",
                socket.unwrap_or(idx[0])
            ));
            match socket {
                Some(s) => z.socket(s),
                None => z,
            }
        } else if label == "psys" {
            psys += 1;
            let name = if psys == 1 {
                "psys".to_owned()
            } else {
                format!("psys-{}", psys - 1)
            };
            Zone::measured(name, PowerScope::PLATFORM, UPDATE_INTERVAL)
                .describe("RAPL platform (psys) domain: the whole SoC platform")
        } else if let Some(scope) = match label.as_str() {
            "core" => Some(PowerScope::CORE),
            "uncore" => Some(PowerScope::UNCORE),
            "dram" => Some(PowerScope::DRAM),
            _ => None,
        } {
            let socket = parent.as_ref().and_then(|p| p.1);
            let suffix = socket.map_or_else(|| idx[0].to_string(), |s| s.to_string());
            let mut z = Zone::measured(format!("{label}-{suffix}"), scope, UPDATE_INTERVAL)
                .describe(format!("RAPL {label} domain of socket {suffix}"));
            if let Some(s) = socket {
                z = z.socket(s);
            }
            // Core and uncore are parts of the package's energy; DRAM is
            // not, whatever the tree's nesting.
            if scope != PowerScope::DRAM {
                if let Some((_, _, pkg)) = &parent {
                    z = z.parent(pkg.clone());
                }
            }
            z
        } else {
            notes.push(format!(
                "{}: RAPL domain {label:?} is not one this source knows; skipped",
                zone_dir.display()
            ));
            continue;
        };
        if let Some(other) = found.iter().find(|f| f.zone.name == zone.name) {
            notes.push(format!(
                "{} repeats zone {} of {}; skipped",
                zone_dir.display(),
                zone.name,
                other.dir.display()
            ));
            continue;
        }
        found.push(Found {
            zone,
            dir: zone_dir,
            range_uj,
        });
    }
    if found.is_empty() {
        return Err(Error::unsupported(format!(
            "no RAPL here: {} has no RAPL zone (intel-rapl:N with energy_uj)",
            dir.display()
        )));
    }
    Ok((found, notes))
}

/// The running source.
pub struct Rapl {
    zones: Vec<Found>,
    counters: Vec<WrapCounter>,
    notes: Vec<String>,
}

fn energy_path(dir: &Path) -> PathBuf {
    dir.join("energy_uj")
}

impl PowerSourceImpl for Rapl {
    const NAME: &'static str = "rapl";
    const DESCRIPTION: &'static str =
        "RAPL energy counters through powercap sysfs: package, core, uncore, DRAM and psys per socket";
    const SCOPE: PowerScope = PowerScope::PACKAGE;
    const UPDATE_INTERVAL: Duration = UPDATE_INTERVAL;
    type Settings = Settings;

    fn start(_args: &StartArgs, settings: Settings) -> Result<Self> {
        let (zones, notes) = discover(&settings.sysfs_root)?;
        // energy_uj is root-only since Linux 5.10: say so before the run.
        for z in &zones {
            let path = energy_path(&z.dir);
            if let Err(e) = std::fs::read_to_string(&path) {
                return Err(if e.kind() == std::io::ErrorKind::PermissionDenied {
                    Error::of(
                        kernmlops_plugin_sdk::api::ErrorKind::PERMISSION,
                        format!(
                            "{} is readable by root only (since Linux 5.10); run as root, or use perf_power with CAP_PERFMON",
                            path.display()
                        ),
                    )
                } else {
                    Error::new(format!("reading {}: {e}", path.display()))
                });
            }
        }
        let counters = zones.iter().map(|z| WrapCounter::new(z.range_uj)).collect();
        Ok(Self {
            zones,
            counters,
            notes,
        })
    }

    fn zones(&self) -> Vec<Zone> {
        self.zones.iter().map(|f| f.zone.clone()).collect()
    }

    fn read(&mut self, _now_us: u64, out: &mut Vec<ZoneReading>) -> Result<()> {
        for (z, c) in self.zones.iter().zip(&mut self.counters) {
            let path = energy_path(&z.dir);
            out.push(read_u64(&path).and_then(|raw| {
                c.update(raw)
                    .map_err(|e| format!("{}: {e}", path.display()))
            }));
        }
        Ok(())
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }
}

export_plugin! {
    description: "RAPL energy counters through powercap sysfs",
    power_sources: [Rapl],
}
