//! The `[power]` section of the configuration and the options a run takes
//! from it and from `--power`: which sources, in what order, the slot
//! length, whether energy is attributed, the most a zone of each scope can
//! draw, and each source's settings.

use std::{collections::BTreeMap, time::Duration};

use kernmlops_plugin_api::PowerScope;
use kernmlops_sys::duration::HumanDuration;
use serde::{Deserialize, Serialize};

use super::PowerError;

/// What is wrong with a power setting (`[power]`, `--power`,
/// `--power-interval`); the caller names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PowerConfigError {
    #[error(transparent)]
    Duration(#[from] kernmlops_sys::duration::DurationError),
    #[error(
        "{text:?} is shorter than the minimum, {}",
        kernmlops_sys::duration::format_duration(MIN_INTERVAL)
    )]
    TooShort { text: String },
    #[error("\"none\" turns power off and cannot be combined with other sources (got {got})")]
    NoneWithOthers { got: String },
    #[error("power source name {name:?} {problem}")]
    BadName { name: String, problem: String },
    #[error("power.max_watts.{scope}: must be more than 0")]
    ZeroMaxWatts { scope: &'static str },
    /// `[power] sources` refused.
    #[error("power.sources: {0}")]
    Sources(Box<PowerConfigError>),
}

/// `[power]` in `kernmlops.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PowerConfig {
    /// Sources recorded in every run, in order of preference: names,
    /// `auto`, or nothing (`[]` or `["none"]`) for no power.
    pub sources: Vec<String>,
    /// Length of a slot: every source is read, and energy attributed, at
    /// these boundaries.
    pub interval: PowerInterval,
    /// Split each slot's energy between processes by on-CPU time.
    pub attribution: bool,
    /// The most a zone of each scope can draw (`[power.max_watts]`): a
    /// reading implying more is a failure of the zone, not energy.
    #[serde(default)]
    pub max_watts: MaxWatts,
    /// Each source's settings, `[power.settings.<name>]`, checked against
    /// the defaults the source declares once plugins are loaded.
    #[serde(default)]
    pub settings: BTreeMap<String, toml::Table>,
}

/// `[power.max_watts]`: per scope, the most power a zone of that scope can
/// physically draw, in watts. A slot whose energy implies more (a sensor
/// reading 2^64-1, a counter that jumped) fails the zone like a counter
/// going backwards. The defaults are far above any part sold today and far
/// below what a broken reading implies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MaxWatts {
    pub package: u64,
    pub core: u64,
    pub uncore: u64,
    pub dram: u64,
    pub platform: u64,
    pub device: u64,
}

impl Default for MaxWatts {
    fn default() -> Self {
        Self {
            package: 1000,
            core: 1000,
            uncore: 1000,
            dram: 500,
            platform: 5000,
            device: 3000,
        }
    }
}

impl MaxWatts {
    /// The bound of `scope` in watts; the largest bound for a scope this
    /// build does not know (the host refuses such zones anyway).
    pub fn of(&self, scope: PowerScope) -> u64 {
        match scope {
            PowerScope::PACKAGE => self.package,
            PowerScope::CORE => self.core,
            PowerScope::UNCORE => self.uncore,
            PowerScope::DRAM => self.dram,
            PowerScope::PLATFORM => self.platform,
            PowerScope::DEVICE => self.device,
            _ => self.platform.max(self.device),
        }
    }

    fn check(&self) -> Result<(), PowerConfigError> {
        for scope in PowerScope::KNOWN {
            if self.of(*scope) == 0 {
                return Err(PowerConfigError::ZeroMaxWatts {
                    scope: scope.name().unwrap_or("?"),
                });
            }
        }
        Ok(())
    }
}

impl Default for PowerConfig {
    fn default() -> Self {
        Self {
            sources: Vec::new(),
            interval: PowerInterval(HumanDuration::from_secs(1)),
            attribution: true,
            max_watts: MaxWatts::default(),
            settings: BTreeMap::new(),
        }
    }
}

/// Shortest slot: below it reading every source would cost more than the
/// 1% the collector allows itself on an idle machine.
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);

impl PowerConfig {
    /// Checks the values that parse as strings but must mean something
    /// (the interval was parsed when the configuration was read); errors
    /// name the key.
    pub fn check(&self) -> Result<(), PowerConfigError> {
        Selection::parse(&self.sources).map_err(|e| PowerConfigError::Sources(Box::new(e)))?;
        self.max_watts.check()
    }
}

/// A slot length: a duration of at least [`MIN_INTERVAL`].
pub fn parse_interval(text: &str) -> Result<Duration, PowerConfigError> {
    let d = kernmlops_sys::duration::parse_duration(text)?;
    if d < MIN_INTERVAL {
        return Err(PowerConfigError::TooShort {
            text: text.to_owned(),
        });
    }
    Ok(d)
}

/// `power.interval`: a slot length of at least [`MIN_INTERVAL`], parsed
/// when the configuration is read (through [`HumanDuration`]'s parser, as
/// `[collect]`'s durations and the plugins' are) and written back as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PowerInterval(HumanDuration);

crate::config::duration_setting!(PowerInterval, PowerConfigError, parse_interval);

/// Which sources a run records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Selection {
    /// No power (`none`, or nothing given).
    #[default]
    Off,
    /// In order of preference; `Auto` in the list stands for every other
    /// source that works here, measured ones first.
    Sources(Vec<Choice>),
}

/// One entry of a source list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    Named(String),
    Auto,
}

impl Selection {
    /// Parses a list as `--power` and `[power] sources` take it: names,
    /// `auto`, or `none` alone. Names are checked against the installed
    /// sources later.
    pub fn parse(list: &[String]) -> Result<Self, PowerConfigError> {
        let items: Vec<&str> = list
            .iter()
            .flat_map(|s| s.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if items.is_empty() || items == ["none"] {
            return Ok(Self::Off);
        }
        if items.contains(&"none") {
            return Err(PowerConfigError::NoneWithOthers {
                got: items.join(","),
            });
        }
        let mut out: Vec<Choice> = Vec::new();
        for item in items {
            let choice = if item == "auto" {
                Choice::Auto
            } else if let Some(problem) = kernmlops_sys::names::snake_case_problem(item) {
                return Err(PowerConfigError::BadName {
                    name: item.to_owned(),
                    problem,
                });
            } else {
                Choice::Named(item.to_owned())
            };
            if !out.contains(&choice) {
                out.push(choice);
            }
        }
        Ok(Self::Sources(out))
    }

    pub fn is_off(&self) -> bool {
        *self == Self::Off
    }
}

/// What a run needs to know about power.
#[derive(Debug, Clone, PartialEq)]
pub struct PowerOptions {
    pub selection: Selection,
    /// Slot length.
    pub interval: Duration,
    pub attribution: bool,
    /// The most a zone of each scope can draw.
    pub max_watts: MaxWatts,
    /// Each source's settings as the JSON object it receives.
    pub settings: BTreeMap<String, serde_json::Value>,
    /// The list as the user gave it, for the manifest.
    pub requested: Vec<String>,
}

impl Default for PowerOptions {
    fn default() -> Self {
        Self {
            selection: Selection::Off,
            interval: Duration::from_secs(1),
            attribution: true,
            max_watts: MaxWatts::default(),
            settings: BTreeMap::new(),
            requested: Vec::new(),
        }
    }
}

impl PowerOptions {
    /// The options from the configuration, with `--power` (`flag`: the
    /// list given, `auto` for the bare flag) and `--power-interval`
    /// overriding it.
    pub fn new(
        config: &PowerConfig,
        flag: Option<&[String]>,
        interval_flag: Option<&str>,
        settings: BTreeMap<String, serde_json::Value>,
    ) -> Result<Self, PowerError> {
        let requested: Vec<String> =
            flag.map_or_else(|| config.sources.clone(), <[String]>::to_vec);
        let selection = Selection::parse(&requested).map_err(|e| {
            PowerError::Config(if flag.is_some() {
                format!("--power: {e}")
            } else {
                format!("power.sources: {e}")
            })
        })?;
        let interval = match interval_flag {
            Some(text) => parse_interval(text).map_err(|e| format!("--power-interval: {e}")),
            None => Ok(config.interval.get()),
        }
        .map_err(PowerError::Config)?;
        config
            .max_watts
            .check()
            .map_err(|e| PowerError::Config(e.to_string()))?;
        Ok(Self {
            selection,
            interval,
            attribution: config.attribution,
            max_watts: config.max_watts,
            settings,
            requested,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn selections_parse_as_users_type_them() {
        assert_eq!(Selection::parse(&[]), Ok(Selection::Off));
        assert_eq!(Selection::parse(&list(&["none"])), Ok(Selection::Off));
        assert_eq!(
            Selection::parse(&list(&["auto"])),
            Ok(Selection::Sources(vec![Choice::Auto]))
        );
        assert_eq!(
            Selection::parse(&list(&["rapl,estimate", "rapl"])),
            Ok(Selection::Sources(vec![
                Choice::Named("rapl".into()),
                Choice::Named("estimate".into())
            ]))
        );
        assert!(Selection::parse(&list(&["none", "rapl"]))
            .expect_err("none with others")
            .to_string()
            .contains("cannot be combined"));
        assert!(Selection::parse(&list(&["Rapl"])).is_err());
    }

    #[test]
    fn options_take_the_flag_over_the_file() {
        let config = PowerConfig {
            sources: list(&["estimate"]),
            ..PowerConfig::default()
        };
        let o = PowerOptions::new(&config, None, None, BTreeMap::new()).expect("config");
        assert_eq!(
            o.selection,
            Selection::Sources(vec![Choice::Named("estimate".into())])
        );
        assert_eq!(o.interval, Duration::from_secs(1));
        let none = list(&["none"]);
        let o =
            PowerOptions::new(&config, Some(&none), Some("500ms"), BTreeMap::new()).expect("flag");
        assert!(o.selection.is_off());
        assert_eq!(o.interval, Duration::from_millis(500));
        let e = PowerOptions::new(&config, None, Some("1ms"), BTreeMap::new())
            .expect_err("too short")
            .to_string();
        assert!(
            e.starts_with("--power-interval:") && e.contains("10ms"),
            "{e}"
        );
        // The file's interval is parsed when the configuration is read;
        // the error names the key.
        let e = crate::config::Config::from_text("mine.toml", b"[power]\ninterval = \"soon\"\n")
            .expect_err("bad interval");
        let crate::config::ConfigError::Setting { error, .. } = e else {
            panic!("{e}");
        };
        assert!(error.to_string().starts_with("power.interval:"));
    }
}
