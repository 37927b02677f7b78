//! vendor_power: an example power source a hardware vendor ships as a
//! closed `.so`, built outside the kernmlops workspace against the plugin
//! SDK. The "ACME board" exposes its energy counters in a text file (the
//! `meter_file` setting), one line per rail:
//!
//! ```text
//! # ACME board energy counters, microjoules since power-on (32-bit)
//! board 1234567
//! soc 456789
//! dram 98765
//! ```
//!
//! The counters are 32-bit and wrap at 2^32 µJ (about 4.3 kJ), which the
//! SDK's `WrapCounter` corrects. The source declares its three zones: the
//! whole board (platform scope), the SoC (package) and its DRAM, all
//! measured, updated every 100 ms.

use std::{collections::HashMap, path::PathBuf, time::Duration};

use kernmlops_plugin_sdk::{
    export_plugin,
    power::{describe_read_error, PowerScope, PowerSourceImpl, WrapCounter, Zone, ZoneReading},
    settings, Error, Result, StartArgs,
};

/// Where the board's counters wrap.
const COUNTER_RANGE: u64 = 1 << 32;
/// How often the board updates its counters.
const UPDATE_INTERVAL: Duration = Duration::from_millis(100);

settings! {
    /// `[power.settings.vendor_meter]` settings.
    pub struct Settings {
        /// The file where the board's driver publishes its energy counters.
        pub meter_file: String = "/run/acme-board/energy".into(),
    }
    validate(s) {
        if s.meter_file.trim().is_empty() {
            return Err("meter_file must name a file".into());
        }
        Ok(())
    }
}

/// The board's rails: name in the file, zone scope, what it covers.
const RAILS: &[(&str, PowerScope, &str)] = &[
    (
        "board",
        PowerScope::PLATFORM,
        "the whole board at its input",
    ),
    ("soc", PowerScope::PACKAGE, "the board's SoC"),
    ("dram", PowerScope::DRAM, "the SoC's DRAM"),
];

/// The running source.
pub struct VendorMeter {
    file: PathBuf,
    counters: Vec<WrapCounter>,
}

impl VendorMeter {
    /// The counters in the file, by rail name.
    fn read_file(&self) -> std::result::Result<HashMap<String, u64>, String> {
        let text =
            std::fs::read_to_string(&self.file).map_err(|e| describe_read_error(&self.file, &e))?;
        Ok(text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| {
                let (name, value) = l.split_once(char::is_whitespace)?;
                Some((name.to_owned(), value.trim().parse().ok()?))
            })
            .collect())
    }
}

impl PowerSourceImpl for VendorMeter {
    const NAME: &'static str = "vendor_meter";
    const DESCRIPTION: &'static str = "ACME board energy counters (example vendor plugin)";
    const SCOPE: PowerScope = PowerScope::PLATFORM;
    const UPDATE_INTERVAL: Duration = UPDATE_INTERVAL;
    type Settings = Settings;

    fn start(_args: &StartArgs, settings: Settings) -> Result<Self> {
        let s = Self {
            file: PathBuf::from(&settings.meter_file),
            counters: RAILS
                .iter()
                .map(|_| WrapCounter::new(Some(COUNTER_RANGE)))
                .collect(),
        };
        // A machine without the board says so before the run starts.
        s.read_file()
            .map_err(|e| Error::unsupported(format!("no ACME board here: {e}")))?;
        Ok(s)
    }

    fn zones(&self) -> Vec<Zone> {
        RAILS
            .iter()
            .map(|(name, scope, what)| {
                let z = Zone::measured(*name, *scope, UPDATE_INTERVAL).describe(*what);
                if *scope == PowerScope::PLATFORM {
                    z
                } else {
                    z.socket(0)
                }
            })
            .collect()
    }

    fn read(&mut self, _now_us: u64, out: &mut Vec<ZoneReading>) -> Result<()> {
        let values = self.read_file();
        for ((name, _, _), counter) in RAILS.iter().zip(&mut self.counters) {
            out.push(match &values {
                Err(e) => Err(e.clone()),
                Ok(v) => match v.get(*name) {
                    None => Err(format!(
                        "{} has no line for rail {name}",
                        self.file.display()
                    )),
                    Some(&raw) => counter.update(raw).map_err(|e| format!("rail {name}: {e}")),
                },
            });
        }
        Ok(())
    }
}

export_plugin! {
    description: "ACME board energy counters (example vendor power plugin)",
    power_sources: [VendorMeter],
}
