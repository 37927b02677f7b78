//! estimate: a modelled CPU power for machines with no meter (virtual
//! machines, most cloud instances), from CPU utilisation. Every zone is
//! modelled, never measured, and the model with its coefficients goes into
//! the run's manifest.
//!
//! The model, per logical CPU and slot: `P = idle + (full_load - idle) *
//! utilisation`, where utilisation is the CPU's busy share of the slot
//! from `/proc/stat` (user, nice, system, irq and softirq time over all
//! time, idle, iowait and steal included). The machine's power is the sum
//! over its logical CPUs; energy is power times the slot's length. The
//! default coefficients, 0.74 W idle and 3.5 W at full load per logical
//! CPU, are Cloud Carbon Footprint's averages for cloud vCPUs; set your
//! machine's in `[power.settings.estimate]`.
//!
//! Arithmetic is in integers (picojoules), so the energy of a slot is the
//! same whatever the order of reads, and never decreases.

use std::{path::PathBuf, time::Duration};

use kernmlops_plugin_sdk::{
    export_plugin,
    power::{PowerScope, PowerSourceImpl, Zone, ZoneReading},
    serde_json::json,
    settings, Error, Result, StartArgs,
};

/// `/proc/stat` counts in USER_HZ ticks, 100 per second on Linux.
const TICK: Duration = Duration::from_millis(10);

settings! {
    /// `[power.settings.estimate]` settings.
    pub struct Settings {
        /// Watts one logical CPU draws when idle (default: Cloud Carbon
        /// Footprint's average for cloud vCPUs).
        pub idle_watts_per_cpu: f64 = 0.74,
        /// Watts one logical CPU draws at full load (default: Cloud Carbon
        /// Footprint's average for cloud vCPUs).
        pub full_load_watts_per_cpu: f64 = 3.5,
        /// Where procfs is mounted (tests point it at a tree they write).
        pub proc_root: String = "/proc".into(),
    }
    validate(s) {
        let watts = [
            ("idle_watts_per_cpu", s.idle_watts_per_cpu),
            ("full_load_watts_per_cpu", s.full_load_watts_per_cpu),
        ];
        for (key, w) in watts {
            if !w.is_finite() || !(0.0..=10_000.0).contains(&w) {
                return Err(format!("{key}: {w} is not a number of watts from 0 to 10000"));
            }
        }
        if s.full_load_watts_per_cpu < s.idle_watts_per_cpu {
            return Err(format!(
                "full_load_watts_per_cpu ({}) is below idle_watts_per_cpu ({})",
                s.full_load_watts_per_cpu, s.idle_watts_per_cpu
            ));
        }
        Ok(())
    }
}

/// One CPU's times from `/proc/stat`, in ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuTimes {
    /// user + nice + system + irq + softirq.
    pub busy: u64,
    /// busy + idle + iowait + steal.
    pub total: u64,
}

/// The per-CPU lines (`cpu0 ...`) of a `/proc/stat` text, by CPU number.
pub fn parse_stat(text: &str) -> Result<Vec<(u32, CpuTimes)>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let Some(label) = words.next() else { continue };
        let Some(cpu) = label.strip_prefix("cpu").filter(|n| !n.is_empty()) else {
            continue;
        };
        let cpu: u32 = cpu
            .parse()
            .map_err(|_| format!("/proc/stat line {line:?}: {label} is not cpuN"))?;
        let v: Vec<u64> = words
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| format!("/proc/stat line {line:?} has a field that is not a number"))?;
        if v.len() < 8 {
            return Err(format!(
                "/proc/stat line {line:?} has {} fields, expected at least 8",
                v.len()
            ));
        }
        // user nice system idle iowait irq softirq steal [guest guest_nice]:
        // guest time is already counted in user and nice.
        let busy = v[0] + v[1] + v[2] + v[5] + v[6];
        out.push((
            cpu,
            CpuTimes {
                busy,
                total: busy + v[3] + v[4] + v[7],
            },
        ));
    }
    if out.is_empty() {
        return Err("/proc/stat has no cpuN line".into());
    }
    Ok(out)
}

/// The energy in picojoules of the CPUs between two samples `dt_us` apart,
/// with idle and dynamic power per CPU in µW: for each CPU in both samples,
/// `dt * (idle + dynamic * busy / total)`, in integers.
pub fn energy_pj(
    before: &[(u32, CpuTimes)],
    after: &[(u32, CpuTimes)],
    dt_us: u64,
    idle_uw: u64,
    dynamic_uw: u64,
) -> u128 {
    let dt = u128::from(dt_us);
    let mut pj = 0u128;
    for (cpu, now) in after {
        let Some((_, then)) = before.iter().find(|(c, _)| c == cpu) else {
            continue;
        };
        let busy = u128::from(now.busy.saturating_sub(then.busy));
        let total = u128::from(now.total.saturating_sub(then.total));
        pj += dt * u128::from(idle_uw);
        pj += (dt * u128::from(dynamic_uw) * busy.min(total))
            .checked_div(total)
            .unwrap_or(0);
    }
    pj
}

/// The running source.
pub struct Estimate {
    stat: PathBuf,
    idle_uw: u64,
    dynamic_uw: u64,
    settings: Settings,
    cpus: usize,
    last: Option<(u64, Vec<(u32, CpuTimes)>)>,
    total_pj: u128,
}

impl Estimate {
    fn sample(&self) -> Result<Vec<(u32, CpuTimes)>, String> {
        let text = std::fs::read_to_string(&self.stat)
            .map_err(|e| kernmlops_plugin_sdk::power::describe_read_error(&self.stat, &e))?;
        parse_stat(&text)
    }
}

fn microwatts(watts: f64) -> u64 {
    (watts * 1e6).round() as u64
}

impl PowerSourceImpl for Estimate {
    const NAME: &'static str = "estimate";
    const DESCRIPTION: &'static str =
        "Modelled CPU power from CPU utilisation (/proc/stat), for machines without a meter; never measured";
    const SCOPE: PowerScope = PowerScope::PACKAGE;
    const UPDATE_INTERVAL: Duration = TICK;
    type Settings = Settings;

    fn start(_args: &StartArgs, settings: Settings) -> Result<Self> {
        let stat = PathBuf::from(&settings.proc_root).join("stat");
        let mut s = Self {
            stat,
            idle_uw: microwatts(settings.idle_watts_per_cpu),
            dynamic_uw: microwatts(settings.full_load_watts_per_cpu)
                .saturating_sub(microwatts(settings.idle_watts_per_cpu)),
            settings,
            cpus: 0,
            last: None,
            total_pj: 0,
        };
        let first = s.sample().map_err(Error::unsupported)?;
        s.cpus = first.len();
        Ok(s)
    }

    fn zones(&self) -> Vec<Zone> {
        vec![
            Zone::modelled("cpu", PowerScope::PACKAGE, TICK).describe(format!(
                "modelled power of the {} logical CPUs from their utilisation (not measured)",
                self.cpus
            )),
        ]
    }

    fn read(&mut self, now_us: u64, out: &mut Vec<ZoneReading>) -> Result<()> {
        match self.sample() {
            Ok(sample) => {
                if let Some((then, before)) = &self.last {
                    let dt = now_us.saturating_sub(*then);
                    self.total_pj += energy_pj(before, &sample, dt, self.idle_uw, self.dynamic_uw);
                }
                self.last = Some((now_us, sample));
                out.push(Ok(
                    u64::try_from(self.total_pj / 1_000_000).unwrap_or(u64::MAX)
                ));
            }
            Err(e) => out.push(Err(e)),
        }
        Ok(())
    }

    fn model(&self) -> Option<kernmlops_plugin_sdk::serde_json::Value> {
        Some(json!({
            "model": "cpu_utilisation_linear",
            "formula": "P = sum over logical CPUs of idle_watts_per_cpu + (full_load_watts_per_cpu - idle_watts_per_cpu) * utilisation",
            "utilisation": "per CPU and slot, from /proc/stat: (user + nice + system + irq + softirq) / (those + idle + iowait + steal)",
            "idle_watts_per_cpu": self.settings.idle_watts_per_cpu,
            "full_load_watts_per_cpu": self.settings.full_load_watts_per_cpu,
            "logical_cpus": self.cpus,
            "defaults_from": "Cloud Carbon Footprint's average coefficients for cloud vCPUs (0.74 W idle, 3.5 W at full load)",
            "measured": false,
        }))
    }
}

export_plugin! {
    description: "Modelled CPU power from CPU utilisation, for machines without a power meter",
    power_sources: [Estimate],
}
