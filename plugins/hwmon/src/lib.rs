//! hwmon: energy and power sensors of the hwmon class
//! (`/sys/class/hwmon/hwmonN`): `energyK_input` counters (µJ) where a
//! device has them, otherwise its `powerK_average` or `powerK_input`
//! sensors (µW) integrated over time (trapezoids between reads, on the
//! clock of the reads), as Kepler does. Each zone is named after the
//! device and the sensor's label (`amd_energy-esocket0`,
//! `power_meter-power1`).
//!
//! The scope comes from the label and the device name: package for CPU,
//! socket and SoC sensors, core for per-core ones, DRAM for memory, the
//! platform for ACPI power meters, PSUs and whole-system sensors, device
//! for anything else (a GPU, a NIC). The update interval is the sensor's
//! `powerK_average_interval` or the device's `update_interval` when the
//! driver says, else the `update_interval` setting.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use kernmlops_plugin_sdk::{
    api::MAX_ZONE_NAME,
    export_plugin,
    power::{
        read_text, read_u64, PowerIntegrator, PowerScope, PowerSourceImpl, SysfsRoot, WrapCounter,
        Zone, ZoneReading,
    },
    settings, Error, HumanDuration, Result, StartArgs,
};

settings! {
    /// `[power.settings.hwmon]` settings.
    pub struct Settings {
        /// Where sysfs is mounted (tests point it at a tree they write).
        pub sysfs_root: SysfsRoot = SysfsRoot::default(),
        /// Update interval of sensors whose driver does not say.
        pub update_interval: HumanDuration = HumanDuration::from_millis(100),
    }
    validate(s) {
        if s.update_interval.get().is_zero() {
            return Err("update_interval must be more than 0".into());
        }
        Ok(())
    }
}

/// How a zone is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A cumulative counter in µJ.
    Energy,
    /// Power in µW, integrated.
    Power,
}

/// One sensor found.
#[derive(Debug, Clone, PartialEq)]
pub struct Sensor {
    pub zone: Zone,
    pub file: PathBuf,
    pub kind: Kind,
}

/// A zone name from the device's name and the sensor's label: lowercase,
/// other characters as `_`, at most the host's limit.
pub fn zone_name(device: &str, label: &str) -> String {
    let mut name: String = format!("{device}-{label}")
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    name.truncate(MAX_ZONE_NAME);
    name
}

/// The scope and socket a sensor covers, from its label and device name.
pub fn classify(device: &str, label: &str) -> (PowerScope, Option<u32>) {
    let l = label.to_lowercase();
    let d = device.to_lowercase();
    let number = || {
        let digits: String = l
            .chars()
            .rev()
            .take_while(char::is_ascii_digit)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        digits.parse().ok()
    };
    let has = |words: &[&str]| words.iter().any(|w| l.contains(w));
    if has(&["socket", "package", "pkg"]) {
        (PowerScope::PACKAGE, number())
    } else if has(&["core"]) {
        (PowerScope::CORE, None)
    } else if has(&["dram", "mem", "dimm"]) {
        (PowerScope::DRAM, None)
    } else if has(&["cpu", "soc", "apu"]) {
        (PowerScope::PACKAGE, None)
    } else if d == "power_meter"
        || d.contains("psu")
        || has(&[
            "total",
            "system",
            "platform",
            "psu",
            "node",
            "input power",
            "pin",
        ])
    {
        (PowerScope::PLATFORM, None)
    } else {
        (PowerScope::DEVICE, None)
    }
}

/// Numbers `K` of files `<prefix>K_<suffix>` in `dir`, sorted.
fn indexes(dir: &Path, prefix: &str, suffix: &str) -> Vec<u32> {
    let mut out: Vec<u32> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix(prefix)?
                .strip_suffix(suffix)?
                .parse()
                .ok()
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// An interval file in milliseconds.
fn interval_ms(path: &Path) -> Option<Duration> {
    read_u64(path)
        .ok()
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
}

/// Every energy or power sensor under `root`. A device with energy
/// counters contributes those only.
pub fn discover(root: &SysfsRoot, default_interval: Duration) -> Result<Vec<Sensor>> {
    let class = root.join("class/hwmon");
    let entries = std::fs::read_dir(&class).map_err(|e| {
        let hint = root.vm_hint("power sensors");
        Error::unsupported(format!(
            "no hwmon power or energy sensor here: {} {}{hint}",
            class.display(),
            if e.kind() == std::io::ErrorKind::NotFound {
                "does not exist".to_owned()
            } else {
                format!("cannot be read ({e})")
            }
        ))
    })?;
    let mut devices: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    devices.sort_by_key(|p| {
        let n = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        (n.len(), n)
    });
    let mut sensors = Vec::new();
    for dev in devices {
        // Older drivers keep their attributes under device/.
        let dir = if dev.join("name").exists() || !dev.join("device/name").exists() {
            dev.clone()
        } else {
            dev.join("device")
        };
        let device = read_text(&dir.join("name")).unwrap_or_else(|_| {
            dev.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
        let device_interval = interval_ms(&dir.join("update_interval"));
        let energy = indexes(&dir, "energy", "_input");
        let (kind, list): (Kind, Vec<(u32, PathBuf, Option<Duration>)>) = if !energy.is_empty() {
            (
                Kind::Energy,
                energy
                    .into_iter()
                    .map(|k| (k, dir.join(format!("energy{k}_input")), None))
                    .collect(),
            )
        } else {
            let mut power: Vec<u32> = indexes(&dir, "power", "_average");
            power.extend(indexes(&dir, "power", "_input"));
            power.sort_unstable();
            power.dedup();
            (
                Kind::Power,
                power
                    .into_iter()
                    .map(|k| {
                        let average = dir.join(format!("power{k}_average"));
                        let file = if average.exists() {
                            average
                        } else {
                            dir.join(format!("power{k}_input"))
                        };
                        (
                            k,
                            file,
                            interval_ms(&dir.join(format!("power{k}_average_interval"))),
                        )
                    })
                    .collect(),
            )
        };
        let prefix = if kind == Kind::Energy {
            "energy"
        } else {
            "power"
        };
        for (k, file, own_interval) in list {
            let label = read_text(&dir.join(format!("{prefix}{k}_label")))
                .unwrap_or_else(|_| format!("{prefix}{k}"));
            let (scope, socket) = classify(&device, &label);
            let interval = own_interval.or(device_interval).unwrap_or(default_interval);
            let mut zone =
                Zone::measured(zone_name(&device, &label), scope, interval).describe(format!(
                    "hwmon {device} sensor {label:?} ({})",
                    if kind == Kind::Energy {
                        "energy counter"
                    } else {
                        "power, integrated over time"
                    }
                ));
            if let Some(s) = socket {
                zone = zone.socket(s);
            }
            if sensors.iter().any(|s: &Sensor| s.zone.name == zone.name) {
                zone.name = zone_name(&device, &format!("{label}-{}", sensors.len()));
            }
            sensors.push(Sensor {
                zone,
                file,
                kind: kind.clone(),
            });
        }
    }
    if sensors.is_empty() {
        return Err(Error::unsupported(format!(
            "no hwmon power or energy sensor here: no device under {} has energy*_input, power*_input or power*_average",
            class.display()
        )));
    }
    Ok(sensors)
}

enum State {
    Counter(WrapCounter),
    Integral(PowerIntegrator),
}

/// The running source.
pub struct Hwmon {
    sensors: Vec<Sensor>,
    state: Vec<State>,
}

impl PowerSourceImpl for Hwmon {
    const NAME: &'static str = "hwmon";
    const DESCRIPTION: &'static str =
        "hwmon energy counters, else power sensors integrated over time, with their labels";
    const SCOPE: PowerScope = PowerScope::PLATFORM;
    const UPDATE_INTERVAL: Duration = Duration::from_millis(100);
    type Settings = Settings;

    fn start(_args: &StartArgs, settings: Settings) -> Result<Self> {
        let sensors = discover(&settings.sysfs_root, settings.update_interval.get())?;
        let state = sensors
            .iter()
            .map(|s| match s.kind {
                Kind::Energy => State::Counter(WrapCounter::new(None)),
                Kind::Power => State::Integral(PowerIntegrator::new()),
            })
            .collect();
        Ok(Self { sensors, state })
    }

    fn zones(&self) -> Vec<Zone> {
        self.sensors.iter().map(|s| s.zone.clone()).collect()
    }

    fn read(&mut self, now_us: u64, out: &mut Vec<ZoneReading>) -> Result<()> {
        for (s, state) in self.sensors.iter().zip(&mut self.state) {
            let value = read_u64(&s.file);
            out.push(value.and_then(|v| {
                match state {
                    State::Counter(c) => c
                        .update(v)
                        .map_err(|e| format!("{}: {e}", s.file.display())),
                    State::Integral(p) => p.add(now_us, v),
                }
            }));
        }
        Ok(())
    }
}

export_plugin! {
    description: "hwmon energy and power sensors",
    power_sources: [Hwmon],
}
