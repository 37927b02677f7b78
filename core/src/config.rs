//! Run configuration: typed defaults in code, a user file merged on top
//! (tables merge, values replace), then command-line flags. The host's
//! own sections are settings structs like a plugin's (`[collect]` is
//! declared with the SDK's `settings!`, its durations are
//! [`HumanDuration`]s and its ring size a [`RingSize`], parsed when the
//! file is loaded), and `kernmlops.toml` at the repository root is their
//! serialised `Default` with comments ([`defaults_file`]), checked by a
//! test, not kept equal by hand. An unknown key or a wrong type is an
//! error naming the key and the file; so is a value a component's own
//! rules refuse ([`Config::check_rules`]), all before anything runs. A
//! file that does not parse is quoted at the offending line, with
//! non-printable bytes escaped.

use std::{collections::BTreeMap, path::Path, str::FromStr, time::Duration};

use kernmlops_plugin_sdk::settings as sdk_settings;
use kernmlops_sys::duration::DurationError;
pub use kernmlops_sys::duration::HumanDuration;
use serde::{Deserialize, Serialize};

use crate::plugin::{Plugin, Registry};

/// The benchmark setting the host turns into the `machine.thp_mode` knob.
pub const THP_MODE: &str = "thp_mode";

/// The benchmarks' settings as a benchmark is given them: without the
/// settings the host applies itself (`thp_mode`, a kernel knob of the run:
/// [`Config::knobs_for`]).
pub fn strip_host_settings(
    mut benchmarks: BTreeMap<String, serde_json::Value>,
) -> BTreeMap<String, serde_json::Value> {
    for v in benchmarks.values_mut() {
        if let Some(o) = v.as_object_mut() {
            o.remove(THP_MODE);
        }
    }
    benchmarks
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub collect: CollectConfig,
    /// Each probe's own settings, `[probes.<probe name>]`, passed to the
    /// probe as a JSON object; the probe checks its keys when it starts.
    #[serde(default)]
    pub probes: BTreeMap<String, toml::Table>,
    /// Each benchmark's settings, `[benchmarks.<name>]`, checked against the
    /// defaults the benchmark declares.
    #[serde(default)]
    pub benchmarks: BTreeMap<String, toml::Table>,
    /// Power sources, slots and attribution (`[power]`).
    #[serde(default)]
    pub power: crate::power::PowerConfig,
    /// Kernel knobs the run sets and restores (`[machine]`: `sysctl`,
    /// `sysfs`, `block.<disk>`), resolved and checked by
    /// [`Config::knobs`] when the configuration is loaded.
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub machine: toml::Table,
    /// Where the user's settings came from, for error messages.
    #[serde(skip)]
    pub source: String,
}

kernmlops_plugin_sdk::settings! {
    /// `[collect]`: what a run collects, where it goes, and how the
    /// collector drains and flushes. Each field's doc comment is its
    /// comment in `kernmlops.toml`.
    pub struct CollectConfig {
        /// Probes to run when `kernmlops run` gets no --plugins.
        pub plugins: Vec<String> = vec!["quanta_runtime".into(), "process_trace".into()],
        /// Collections are written to <output>/<collection_id>/.
        pub output: String = "data".into(),
        /// Folder searched for plugin .so files (relative to the working directory;
        /// if missing there, next to the kernmlops binary's workspace).
        pub plugin_dir: String = "plugins".into(),
        /// How long to collect: "10s", "5m"; "0s" collects until Ctrl+C or SIGTERM.
        pub duration: HumanDuration = HumanDuration::from_secs(0),
        /// Size of each probe ring buffer: "auto" sizes each table's ring from the
        /// event rate its probe declares (64KiB to 16MiB, an eighth of a second of events),
        /// or a power of two from 16KiB to 1GiB for every ring. Larger rings lose
        /// fewer events under bursts (see README, Performance).
        pub ring_size: RingSize = RingSize::Auto,
        /// Longest wait between two drains of a probe's rings. Probes also wake the
        /// collector early when a ring is a quarter full.
        pub drain_interval: DrainInterval = Interval::from_millis(100),
        /// Collected rows reach the file at least this often: a crash or SIGKILL
        /// loses at most this much data.
        pub flush_interval: FlushInterval = Interval::from_millis(1000),
        /// ... or as soon as this many rows of a table are buffered (a full record
        /// batch, 65536 rows, is always written at once, so larger values act as it).
        pub flush_rows: u64 = crate::sink::BATCH_ROWS as u64,
        /// Fail the whole run when any probe fails, instead of continuing without it.
        pub strict: bool = false,
        /// Longest a call into a probe may take (its start, a drain beyond its own
        /// wait, its stop) before the probe is given up: reported, its tables closed
        /// with the rows they hold, and the run goes on without it.
        pub plugin_timeout: PluginTimeout = PluginTimeout::from_secs(5),
    }
}

impl CollectConfig {
    /// The rules beyond each value's type; errors name the key.
    pub fn check(&self) -> Result<(), SettingError> {
        if self.flush_rows == 0 {
            return Err(SettingError::Zero {
                key: "collect.flush_rows",
            });
        }
        Ok(())
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            collect: CollectConfig::default(),
            probes: Default::default(),
            benchmarks: Default::default(),
            power: Default::default(),
            machine: Default::default(),
            source: BUILT_IN.into(),
        }
    }
}

const BUILT_IN: &str = "built-in defaults";

/// The head of `kernmlops.toml`.
const FILE_HEAD: &str = "\
# kernmlops configuration: every key with its default.
# A user file given with `--config FILE` is merged on top: tables merge,
# values replace. An unknown key or a wrong type is an error, reported
# before anything is collected. Command-line flags override both.
";

/// What `kernmlops.toml` says between `[collect]` and `[power]`.
const PROBES_NOTE: &str = "\
# Each probe's own settings go in a table named after the probe, e.g.
#   [probes.memory_usage]
#   interval = \"500ms\"
# `kernmlops config defaults` lists every loaded probe's keys with their
# defaults. A probe that is not loaded, a key the probe does not declare, or
# a value of another type is an error before anything is collected.
";

/// The comment of each `[power]` key, in the file's order (the section's
/// type lives in `power::config`).
const POWER_DOCS: &[(&str, &str)] = &[
    (
        "sources",
        "Power sources recorded in every run, in order of preference: their names
(`kernmlops power-list` shows them), or [\"auto\"] for every source that
works here, meters before models. [] (or [\"none\"]) records no power.
`kernmlops run --power rapl,estimate` (or a bare --power, meaning auto)
overrides it.",
    ),
    (
        "interval",
        "Length of a time slot: every source is read, and energy attributed, at
the same boundaries (CLOCK_BOOTTIME). At least 10ms, and never shorter
than a source's update interval.",
    ),
    (
        "attribution",
        "Split each slot's energy between the processes that ran, by their on-CPU
time from the kernel (the cpu_time probe); idle energy stays idle.",
    ),
];

const MAX_WATTS_NOTE: &str = "\
# The most power a zone of each scope can physically draw, in watts. A slot
# whose energy implies more (a sensor reading 2^64-1 uW, a counter jumping
# by kilojoules) fails the zone, like a counter going backwards: one error
# line, the zone marked failed in the manifest, no rows from then on, and
# the run's exit status is non-zero.
";

/// `[power.max_watts]`'s keys in the file's order, without comments.
const MAX_WATTS_KEYS: &[(&str, &str)] = &[
    ("package", ""),
    ("core", ""),
    ("uncore", ""),
    ("dram", ""),
    ("platform", ""),
    ("device", ""),
];

const POWER_SETTINGS_NOTE: &str = "\
# Each power source's own settings go in a table named after the source,
# e.g.
#   [power.settings.estimate]
#   idle_watts_per_cpu = 1.5
#   full_load_watts_per_cpu = 6.0
# `kernmlops config defaults` lists every loaded source's keys.
";

const MACHINE_NOTE: &str = "\
# Kernel knobs the run sets before anything is collected and restores when
# it ends (also after a SIGKILL: the run's guardian, or else the next
# kernmlops start, writes the old values back). Every knob is checked
# first (the file exists under /proc/sys or /sys, is writable, and the
# value is one the file offers where it lists them, as `scheduler` does);
# a knob that fails, or a value the kernel refuses, is one error line with
# nothing collected and nothing left set. The value read back after writing
# (the kernel may round or clamp) goes to the manifest's `machine` section
# and to the experiment results' `machine.<knob>` columns. Root only.
#   [machine.sysctl]               # any file under /proc/sys
#   \"vm.swappiness\" = 10           # or unquoted: vm.swappiness = 10
#   [machine.sysfs]                # any file under /sys
#   \"kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs\" = 100
#   [machine.block.nvme0n1]        # /sys/block/<disk>/queue/<setting>
#   read_ahead_kb = 512            # also scheduler, nr_requests,
#                                  # rotational, max_sectors_kb
# An experiment variable sets one with a dotted key:
#   key = \"machine.sysctl.vm.swappiness\"
#   key = \"machine.sysfs.kernel.mm.transparent_hugepage.khugepaged.scan_sleep_millisecs\"
#   key = \"machine.block.loop0.read_ahead_kb\"
";

/// The default configuration file, every key with its default and its
/// comment: `[collect]` is [`CollectConfig`]'s `Default` shown as a
/// plugin's settings are (`settings::defaults_toml`), `[power]` the
/// `Default` of [`crate::power::PowerConfig`]. `kernmlops.toml` at the
/// repository root is this text (a test checks it; `UPDATE_DEFAULTS=1`
/// rewrites it), and `kernmlops config defaults` prints it.
pub fn defaults_file() -> String {
    let power = crate::power::PowerConfig::default();
    [
        FILE_HEAD,
        "\n[collect]\n",
        &sdk_settings::defaults_toml::<CollectConfig>(),
        "\n",
        PROBES_NOTE,
        "\n[power]\n",
        &documented(&power, POWER_DOCS),
        "\n",
        MAX_WATTS_NOTE,
        "[power.max_watts]\n",
        &documented(&power.max_watts, MAX_WATTS_KEYS),
        "\n",
        POWER_SETTINGS_NOTE,
        "[power.settings]\n\n",
        MACHINE_NOTE,
        "[machine]\n",
    ]
    .concat()
}

/// The keys `docs` names of `value` serialised, in that order, each after
/// its comment: the form of `settings::defaults_toml`, for sections whose
/// type is not a settings struct.
fn documented(value: &impl Serialize, docs: &[(&str, &str)]) -> String {
    let table = match toml::Table::try_from(value) {
        Ok(t) => t,
        Err(e) => return format!("# (defaults could not be shown: {e})\n"),
    };
    let mut out = String::new();
    for (key, doc) in docs {
        let Some(v) = table.get(*key) else { continue };
        for line in doc.lines() {
            out.push_str(format!("# {line}").trim_end());
            out.push('\n');
        }
        out.push_str(&format!("{key} = {v}\n"));
    }
    out
}

/// Why a text setting (a duration, an interval, a ring size) is refused;
/// the message quotes the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error(transparent)]
    Duration(#[from] DurationError),
    /// An interval below its minimum.
    #[error("{text:?} is shorter than the minimum, {}ms (a zero interval would keep a CPU busy)", .min.as_millis())]
    ShortInterval { text: String, min: Duration },
    /// A plugin timeout below [`MIN_PLUGIN_TIMEOUT`].
    #[error("{text:?} is shorter than the minimum, 1s (a probe's start alone can take most of a second)")]
    ShortTimeout { text: String },
    #[error("{0:?} is not a size (try 16MiB)")]
    NotASize(String),
    #[error("unknown unit {unit:?} in {text:?} (use KiB, MiB or GiB)")]
    SizeUnit { unit: String, text: String },
    /// A ring size that is no power of two, or out of range.
    #[error("{0:?} must be a power of two between 16KiB and 1GiB")]
    RingRange(String),
}

/// Why a key of a configuration is refused: one line naming the key path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    /// A key in a section that has none.
    #[error("{at}: unknown key ({section} has no settings)")]
    NoSettings { at: String, section: String },
    /// A key the section does not declare; `known` lists those it does.
    #[error("{at}: unknown key (known: {known})")]
    UnknownKey { at: String, known: String },
    #[error("{at}: expected {expected}, found {found}")]
    WrongType {
        at: String,
        expected: &'static str,
        found: &'static str,
    },
    /// A text its type refuses (the message of [`ValueError`], through
    /// serde).
    #[error("{key}: {message}")]
    Value { key: String, message: String },
    #[error("{key}: must be at least 1")]
    Zero { key: &'static str },
    /// `[power]`'s own check (its message names the key).
    #[error("{0}")]
    Power(#[from] crate::power::PowerConfigError),
}

/// Why a file is not TOML: where, and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SyntaxError {
    /// `at`: `line L, column C: `the line``, quoted with non-printable
    /// bytes escaped.
    #[error("{at}: not UTF-8 text")]
    NotUtf8 { at: String },
    #[error("{}", located(.at.as_deref(), .message))]
    Toml { at: Option<String>, message: String },
}

fn located(at: Option<&str>, message: &str) -> String {
    match at {
        Some(at) => format!("{at}: {message}"),
        None => message.to_owned(),
    }
}

/// Why a command setting is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// The program, or a file it names, is not found or fails the trust
    /// checks (the message names the file).
    #[error("{0}")]
    Refused(String),
    /// [`CommandError::Refused`] at the key that set it.
    #[error("benchmarks.{benchmark}.{key}: {reason}")]
    Setting {
        benchmark: String,
        key: &'static str,
        reason: String,
    },
}

/// A text setting: shown with `Display`, read with `FromStr`, so it is
/// parsed when the configuration is loaded and written back as text.
macro_rules! text_setting {
    ($ty:ty $(, const $c:ident)?) => {
        impl<$(const $c: u64)?> serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de $(, const $c: u64)?> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// A duration setting, a newtype of [`HumanDuration`]: `get`, parsing
/// with `$parse` (text to a `Duration` or an `$err`), shown as the
/// duration's text, and a [`text_setting!`].
macro_rules! duration_setting {
    ($ty:ty, $err:ty, $parse:expr $(, const $c:ident)?) => {
        impl<$(const $c: u64)?> $ty {
            /// The duration.
            pub const fn get(self) -> std::time::Duration {
                self.0.get()
            }
        }

        impl<$(const $c: u64)?> std::str::FromStr for $ty {
            type Err = $err;

            fn from_str(s: &str) -> Result<Self, $err> {
                ($parse)(s).map(|d| Self($crate::config::HumanDuration(d)))
            }
        }

        impl<$(const $c: u64)?> std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Display::fmt(&self.0, f)
            }
        }

        $crate::config::text_setting!($ty $(, const $c)?);
    };
}

pub(crate) use {duration_setting, text_setting};

/// `collect.ring_size`: `auto`, or one size for every ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingSize {
    /// Each table's ring sized from the rate its probe declares.
    Auto,
    /// A power of two from [`MIN_RING_BYTES`] to 1 GiB.
    Bytes(u64),
}

impl RingSize {
    /// The byte count, 0 for `auto` (as the collector takes it).
    pub fn bytes(self) -> u64 {
        match self {
            Self::Auto => 0,
            Self::Bytes(b) => b,
        }
    }
}

impl FromStr for RingSize {
    type Err = ValueError;

    fn from_str(s: &str) -> Result<Self, ValueError> {
        Ok(match ring_bytes(s)? {
            0 => Self::Auto,
            b => Self::Bytes(b),
        })
    }
}

impl std::fmt::Display for RingSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = match self {
            Self::Auto => return f.write_str("auto"),
            Self::Bytes(b) => *b,
        };
        match [(30, "GiB"), (20, "MiB"), (10, "KiB")]
            .into_iter()
            .find(|(shift, _)| b >= 1 << shift && b % (1 << shift) == 0)
        {
            Some((shift, unit)) => write!(f, "{}{unit}", b >> shift),
            None => write!(f, "{b}"),
        }
    }
}

text_setting!(RingSize);

/// A duration setting of at least `MIN_MS` milliseconds (a zero interval
/// would keep a CPU busy), read through [`HumanDuration`]'s parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval<const MIN_MS: u64>(HumanDuration);

impl<const MIN_MS: u64> Interval<MIN_MS> {
    /// The smallest value accepted.
    pub const MIN: Duration = Duration::from_millis(MIN_MS);

    /// A value known to be valid (a default).
    const fn from_millis(ms: u64) -> Self {
        Self(HumanDuration::from_millis(ms))
    }
}

duration_setting!(Interval<MIN_MS>, ValueError, |s| interval(s, Self::MIN), const MIN_MS);

/// `collect.drain_interval`: at least [`MIN_DRAIN_INTERVAL`].
pub type DrainInterval = Interval<1>;
/// `collect.flush_interval` (and `--flush-interval`): at least
/// [`MIN_FLUSH_INTERVAL`].
pub type FlushInterval = Interval<10>;

/// `collect.plugin_timeout`: at least [`MIN_PLUGIN_TIMEOUT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginTimeout(HumanDuration);

impl PluginTimeout {
    const fn from_secs(s: u64) -> Self {
        Self(HumanDuration::from_secs(s))
    }
}

duration_setting!(PluginTimeout, ValueError, plugin_timeout);

/// Name of a TOML value's type, for messages.
fn type_name(v: &toml::Value) -> &'static str {
    match v {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a number",
        toml::Value::Boolean(_) => "true or false",
        toml::Value::Datetime(_) => "a date",
        toml::Value::Array(_) => "a list",
        toml::Value::Table(_) => "a table",
    }
}

/// Checks `user` against `known`: every key must exist there with a value of
/// the same type (an integer may stand for a number). A table whose default
/// is an empty table (`parameters = {}`) is free-form: any keys and values
/// go in it. Errors name the key path.
fn check_keys(path: &str, known: &toml::Table, user: &toml::Table) -> Result<(), SettingError> {
    for (key, value) in user {
        let at = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        let Some(default) = known.get(key) else {
            let mut names: Vec<&str> = known.keys().map(String::as_str).collect();
            names.sort_unstable();
            return Err(if names.is_empty() {
                SettingError::NoSettings {
                    at,
                    section: path.to_owned(),
                }
            } else {
                SettingError::UnknownKey {
                    at,
                    known: names.join(", "),
                }
            });
        };
        match (default, value) {
            (toml::Value::Table(k), toml::Value::Table(_)) if k.is_empty() => {}
            (toml::Value::Table(k), toml::Value::Table(u)) => check_keys(&at, k, u)?,
            (toml::Value::Float(_), toml::Value::Integer(_)) => {}
            (d, v) if std::mem::discriminant(d) != std::mem::discriminant(v) => {
                return Err(SettingError::WrongType {
                    at,
                    expected: type_name(d),
                    found: type_name(v),
                });
            }
            _ => {}
        }
    }
    Ok(())
}

/// A configuration problem, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: {message}")]
    Invalid { file: String, message: String },
    #[error("{file}: {error}")]
    Setting { file: String, error: SettingError },
    #[error("{file}: {error}")]
    Syntax { file: String, error: SyntaxError },
    #[error("{file}: {error}")]
    Command { file: String, error: CommandError },
    /// The I/O error is part of the message, not a source, so a chain
    /// printed with `{:#}` shows it once.
    #[error("{file}: {error}")]
    Read { file: String, error: std::io::Error },
}

/// Merges `over` into `base`: tables key by key, any other value replaced.
pub fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// A TOML parse error as one line: where, what, and the offending line
/// quoted with non-printable bytes escaped.
fn parse_error(text: &str, e: &toml::de::Error) -> SyntaxError {
    SyntaxError::Toml {
        at: e.span().map(|span| quote_at(text.as_bytes(), span.start)),
        message: e.message().trim().replace('\n', " "),
    }
}

/// `line L, column C: `…`` for byte `at` of `bytes`, the line quoted with
/// non-printable bytes (and anything not UTF-8) escaped.
fn quote_at(bytes: &[u8], at: usize) -> String {
    let at = at.min(bytes.len());
    let start = bytes[..at]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let end = bytes[at..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(bytes.len(), |i| at + i);
    let line_no = bytes[..start].iter().filter(|&&b| b == b'\n').count() + 1;
    let column = String::from_utf8_lossy(&bytes[start..at]).chars().count() + 1;
    let mut line = crate::trust::printable(&bytes[start..end]);
    if line.chars().count() > 120 {
        line = line.chars().take(117).collect::<String>() + "...";
    }
    format!("line {line_no}, column {column}: `{line}`")
}

/// Parses TOML from a file's bytes: not UTF-8, or not TOML, is one line
/// quoting the offending line.
fn parse_toml(bytes: &[u8]) -> Result<toml::Table, SyntaxError> {
    let text = std::str::from_utf8(bytes).map_err(|e| SyntaxError::NotUtf8 {
        at: quote_at(bytes, e.valid_up_to()),
    })?;
    toml::from_str(text).map_err(|e| parse_error(text, &e))
}

fn one_line(e: &dyn std::fmt::Display) -> String {
    e.to_string()
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with('|') && !l.chars().all(|c| c == '^' || c == ' ')
        })
        .collect::<Vec<_>>()
        .join(" ")
}

impl Config {
    /// Defaults with `file` (if any) merged on top.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let Some(path) = file else {
            return Self::merged(None);
        };
        let source = crate::trust::printable(path.as_os_str().as_encoded_bytes());
        let bytes = std::fs::read(path).map_err(|error| ConfigError::Read {
            file: source.clone(),
            error,
        })?;
        Self::merged(Some((&source, &bytes)))
    }

    /// Defaults with the TOML text `bytes` merged on top, as [`Config::load`]
    /// does with a file; `source` names it in errors. Nothing is written or
    /// read (the experiment planner checks each run's configuration so).
    pub fn from_text(source: &str, bytes: &[u8]) -> Result<Self, ConfigError> {
        Self::merged(Some((source, bytes)))
    }

    fn merged(user: Option<(&str, &[u8])>) -> Result<Self, ConfigError> {
        let mut base: toml::Table =
            toml::from_str(&defaults_file()).map_err(|e| ConfigError::Invalid {
                file: BUILT_IN.into(),
                message: one_line(&e),
            })?;
        let mut source = BUILT_IN.to_owned();
        let setting = |file: &str| {
            let file = file.to_owned();
            move |error| ConfigError::Setting { file, error }
        };
        if let Some((name, bytes)) = user {
            source = name.to_owned();
            let over = parse_toml(bytes).map_err(|error| ConfigError::Syntax {
                file: source.clone(),
                error,
            })?;
            // Probe sections are checked against each probe's own defaults
            // once plugins are loaded (`probe_settings`).
            let mut known = base.clone();
            let mut checked = over.clone();
            for section in ["probes", "benchmarks"] {
                known.insert(section.into(), toml::Value::Table(toml::Table::new()));
                if let Some(toml::Value::Table(_)) = checked.get(section) {
                    checked.insert(section.into(), toml::Value::Table(toml::Table::new()));
                }
            }
            check_keys("", &known, &checked).map_err(setting(&source))?;
            merge(&mut base, over);
        }
        if let Some(toml::Value::Table(collect)) = base.get("collect") {
            check_texts::<CollectConfig>("collect", collect).map_err(setting(&source))?;
        }
        if let Some(toml::Value::Table(power)) = base.get("power") {
            check_text::<crate::power::PowerInterval>("power", power, "interval")
                .map_err(setting(&source))?;
        }
        let mut cfg: Config =
            toml::Value::Table(base)
                .try_into()
                .map_err(|e: toml::de::Error| ConfigError::Invalid {
                    file: source.clone(),
                    message: one_line(&e),
                })?;
        cfg.check().map_err(setting(&source))?;
        cfg.source = source;
        cfg.knobs()?;
        Ok(cfg)
    }

    /// The kernel knobs of `[machine]`, each resolved to its file under
    /// `/proc/sys` or `/sys` and checked (it exists, is writable, the value
    /// is one the file offers where it lists them); nothing is written. An
    /// error names the file, the knob and why.
    pub fn knobs(&self) -> Result<Vec<crate::machine::Knob>, ConfigError> {
        self.knobs_for(None)
    }

    /// The kernel knobs of a run of `benchmark`: [`Config::knobs`], with the
    /// benchmark's `thp_mode` setting (`[benchmarks.<name>] thp_mode`) as
    /// the `machine.thp_mode` knob, so the host sets, reads back, records
    /// and restores it like every knob (the benchmark gets its settings
    /// without it: [`strip_host_settings`]).
    pub fn knobs_for(
        &self,
        benchmark: Option<&str>,
    ) -> Result<Vec<crate::machine::Knob>, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            file: self.source.clone(),
            message,
        };
        let mut machine = self.machine.clone();
        if let Some((name, mode)) = benchmark.and_then(|b| Some((b, self.benchmark_thp_mode(b)?))) {
            if machine.contains_key(THP_MODE) {
                return Err(invalid(format!(
                    "benchmarks.{name}.thp_mode and machine.thp_mode both set the THP mode; keep one"
                )));
            }
            machine.insert(THP_MODE.into(), toml::Value::String(mode));
        }
        if machine.is_empty() {
            return Ok(Vec::new());
        }
        crate::machine::knobs(&machine).map_err(|e| invalid(e.to_string()))
    }

    /// A benchmark's `thp_mode` setting, when it asks for one.
    fn benchmark_thp_mode(&self, benchmark: &str) -> Option<String> {
        let mode = self.benchmarks.get(benchmark)?.get(THP_MODE)?.as_str()?;
        (!mode.is_empty()).then(|| mode.to_owned())
    }

    /// Each probe's settings: the defaults it declares (`probes` gives
    /// probe name and defaults TOML for every loaded probe) with the user's
    /// `[probes.<name>]` merged on top. A section for an unknown probe, a key
    /// the probe does not declare, or a value of another type is an error
    /// naming the key path and the file.
    pub fn probe_settings<'a>(
        &self,
        probes: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<BTreeMap<String, toml::Table>, ConfigError> {
        self.component_settings("probes", "probe", &self.probes, probes)
    }

    /// Each benchmark's settings, as [`Config::probe_settings`] does for
    /// probes, from `[benchmarks.<name>]`.
    pub fn benchmark_settings<'a>(
        &self,
        benchmarks: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<BTreeMap<String, toml::Table>, ConfigError> {
        self.component_settings("benchmarks", "benchmark", &self.benchmarks, benchmarks)
    }

    /// Each power source's settings, as [`Config::probe_settings`] does for
    /// probes, from `[power.settings.<name>]`.
    pub fn power_settings<'a>(
        &self,
        sources: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<BTreeMap<String, toml::Table>, ConfigError> {
        self.component_settings(
            "power.settings",
            "power source",
            &self.power.settings,
            sources,
        )
    }

    fn component_settings<'a>(
        &self,
        section: &str,
        kind: &str,
        user_sections: &BTreeMap<String, toml::Table>,
        declared: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<BTreeMap<String, toml::Table>, ConfigError> {
        let invalid = |file: &str, message: String| ConfigError::Invalid {
            file: file.to_owned(),
            message,
        };
        let mut settings = BTreeMap::new();
        for (name, text) in declared {
            let defaults: toml::Table = toml::from_str(text)
                .map_err(|e| invalid(&format!("defaults of {kind} {name}"), one_line(&e)))?;
            settings.insert(name.to_owned(), defaults);
        }
        for (name, user) in user_sections {
            let Some(defaults) = settings.get_mut(name) else {
                let known: Vec<&str> = settings.keys().map(String::as_str).collect();
                return Err(invalid(
                    &self.source,
                    format!(
                        "{section}.{name}: no loaded plugin has a {kind} named {name} (loaded: {})",
                        known.join(", ")
                    ),
                ));
            };
            let mut user = user.clone();
            if section == "benchmarks" && !defaults.contains_key(THP_MODE) {
                // A host setting (the `machine.thp_mode` knob) even for a
                // benchmark that does not declare it.
                if let Some(v) = user.remove(THP_MODE) {
                    if !matches!(v.as_str(), Some("" | "always" | "madvise" | "never")) {
                        return Err(invalid(
                            &self.source,
                            format!(
                                "{section}.{name}.{THP_MODE} = {v}: use \"\" (leave as is), \"always\", \"madvise\" or \"never\""
                            ),
                        ));
                    }
                }
            }
            check_keys(&format!("{section}.{name}"), defaults, &user).map_err(|error| {
                ConfigError::Setting {
                    file: self.source.clone(),
                    error,
                }
            })?;
            merge(defaults, user);
        }
        Ok(settings)
    }

    /// Runs the rules of every configured probe and benchmark, and of the
    /// `probes` and `benchmarks` a run uses, on their settings (each
    /// plugin's `check_config`), as `kernmlops run` and `config show` do
    /// before anything is set up.
    pub fn check_component_rules(
        &self,
        registry: &Registry,
        probes: &[String],
        benchmarks: &[String],
    ) -> Result<(), ConfigError> {
        let check = |plugin: &Plugin, name: &str, json: &str| {
            plugin
                .check_config(name, json)
                .map_err(|e| e.message.to_string())
        };
        self.check_rules(
            "probes",
            registry.config_defaults(),
            probes,
            |name, json| match registry.find_probe(name) {
                Some((plugin, _)) => check(plugin, name, json),
                None => Ok(()),
            },
        )?;
        self.check_rules(
            "benchmarks",
            registry.benchmark_defaults(),
            benchmarks,
            |name, json| match registry.find_benchmark(name) {
                Ok((plugin, _)) => check(plugin, name, json),
                Err(_) => Ok(()),
            },
        )
    }

    /// Runs each component's own rules (`rules(name, settings JSON)`, the
    /// plugin's `check_config`) on its merged settings, for every component
    /// of `section` the user configured and every one in `selected`. A
    /// refusal is an error naming the file and the key path: when the
    /// plugin's message names no key, the user's keys are tried one at a
    /// time over the defaults to find the one refused.
    pub fn check_rules<'a>(
        &self,
        section: &str,
        declared: impl IntoIterator<Item = (&'a str, &'a str)>,
        selected: &[String],
        rules: impl Fn(&str, &str) -> Result<(), String>,
    ) -> Result<(), ConfigError> {
        let (kind, user_sections) = match section {
            "probes" => ("probe", &self.probes),
            _ => ("benchmark", &self.benchmarks),
        };
        let declared: Vec<(&str, &str)> = declared.into_iter().collect();
        let merged = self.component_settings(section, kind, user_sections, declared.clone())?;
        let json = |t: &toml::Table| serde_json::to_value(t).unwrap_or_default().to_string();
        let mut names: Vec<&String> = user_sections.keys().chain(selected).collect();
        names.sort();
        names.dedup();
        for name in names {
            let Some(settings) = merged.get(name) else {
                continue;
            };
            let Err(message) = rules(name, &json(settings)) else {
                continue;
            };
            let message = strip_section(&message);
            let path = format!("{section}.{name}");
            let invalid = |message: String| ConfigError::Invalid {
                file: self.source.clone(),
                message,
            };
            let Some(user) = user_sections.get(name) else {
                return Err(invalid(format!(
                    "{path}: {message} (the plugin refuses its own defaults)"
                )));
            };
            let defaults: toml::Table = declared
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, text)| toml::from_str(text).ok())
                .unwrap_or_default();
            for (key, value) in user {
                let mut one = defaults.clone();
                one.insert(key.clone(), value.clone());
                if let Err(m) = rules(name, &json(&one)) {
                    return Err(invalid(at_key(&path, key, strip_section(&m))));
                }
            }
            return Err(invalid(format!("{path}: {message}")));
        }
        Ok(())
    }

    /// Probe settings as the JSON objects probes receive.
    pub fn settings_json(
        settings: &BTreeMap<String, toml::Table>,
    ) -> BTreeMap<String, serde_json::Value> {
        settings
            .iter()
            .map(|(name, table)| {
                (
                    name.clone(),
                    serde_json::to_value(table).unwrap_or_default(),
                )
            })
            .collect()
    }

    /// The rules beyond each value's type (the texts were parsed when
    /// the configuration was read); errors name the key.
    pub fn check(&self) -> Result<(), SettingError> {
        self.collect.check()?;
        self.power.check().map_err(SettingError::Power)
    }
}

/// The first text value of `table` (the section `section`) that its field
/// of `S` refuses, as an error naming the key: each text is read alone
/// over the defaults, as the whole section is read afterwards.
fn check_texts<S: sdk_settings::Settings>(
    section: &str,
    table: &toml::Table,
) -> Result<(), SettingError> {
    let documented = S::docs().iter().map(|(k, _)| *k);
    for key in documented.filter(|k| table.get(*k).is_some_and(toml::Value::is_str)) {
        let one = toml::Table::from_iter([(key.to_owned(), table[key].clone())]);
        if let Err(e) = toml::Value::Table(one).try_into::<S>() {
            return Err(SettingError::Value {
                key: format!("{section}.{key}"),
                message: e.message().trim().replace('\n', " "),
            });
        }
    }
    Ok(())
}

/// The text at `key` of `table` (the section `section`), parsed alone as
/// `T`, as an error naming the key: a section that is no settings struct
/// (`[power]`) has its text values parsed here, before the whole
/// configuration is read, as [`check_texts`] does for the others.
fn check_text<T: FromStr>(section: &str, table: &toml::Table, key: &str) -> Result<(), SettingError>
where
    T::Err: std::fmt::Display,
{
    match table
        .get(key)
        .and_then(toml::Value::as_str)
        .map(str::parse::<T>)
    {
        Some(Err(e)) => Err(SettingError::Value {
            key: format!("{section}.{key}"),
            message: e.to_string(),
        }),
        _ => Ok(()),
    }
}

/// Benchmark settings that name a program and its arguments, which a run
/// executes as root: `(benchmark, key)`. Resolved and checked by
/// [`resolve_command`] wherever a configuration is read for a run.
pub const COMMAND_SETTINGS: &[(&str, &str)] = &[("script", "command")];

/// Resolves and checks a command setting (`["./bench.sh", "--fast"]`) as
/// run by root, in place:
///
/// - the program (first item): a path with a `/` is taken relative to
///   `base`, the folder of the file that set it; a bare name is looked up
///   on PATH. The file found and every folder above it must pass the
///   plugins' owner and mode checks ([`crate::trust::check_program`]); it
///   is replaced by its absolute path (the real path of its folder and its
///   name), so a later run (a resumed experiment, a cluster task) runs the
///   file that was checked;
/// - each later item that is not an option (`-...`) and names an existing
///   file, relative to `base` or absolute (an interpreter's script, as in
///   `["bash", "bench.sh"]`), is checked and replaced the same way. Other
///   items (options, numbers, words, a shell's `-c` text) are left as they
///   are and not checked.
///
/// A value that is not a list of strings is left for the settings' type
/// check. Returns the warnings of `--allow-insecure-plugins`; the error is
/// one line.
pub fn resolve_command(
    value: &mut toml::Value,
    base: &Path,
    policy: &crate::trust::Policy,
) -> Result<Vec<String>, CommandError> {
    let Some(items) = value.as_array_mut() else {
        return Ok(Vec::new());
    };
    if items.iter().any(|v| !v.is_str()) {
        return Ok(Vec::new());
    }
    let mut warnings = Vec::new();
    for (i, item) in items.iter_mut().enumerate() {
        let text = item.as_str().unwrap_or_default().to_owned();
        let found = if i == 0 {
            crate::trust::resolve_program(&text, base)
                .map_err(|e| CommandError::Refused(e.to_string()))?
        } else {
            if text.is_empty() || text.starts_with('-') {
                continue;
            }
            let candidate: std::path::PathBuf = base.join(&text).components().collect();
            if !candidate.is_file() {
                continue;
            }
            candidate
        };
        let what = if i == 0 { "the program" } else { "the file" };
        let (real, warning) =
            crate::trust::check_program(&found, what, policy).map_err(CommandError::Refused)?;
        warnings.extend(warning);
        *item = toml::Value::String(real.to_string_lossy().into_owned());
    }
    Ok(warnings)
}

/// [`resolve_command`] for every command setting of `benchmarks` (a
/// configuration's `[benchmarks]`: name to settings table). The error
/// names the key (`benchmarks.script.command: ...`).
pub fn resolve_commands<'a>(
    benchmarks: impl IntoIterator<Item = (&'a String, &'a mut toml::Table)>,
    base: &Path,
    policy: &crate::trust::Policy,
) -> Result<Vec<String>, CommandError> {
    let mut warnings = Vec::new();
    for (name, table) in benchmarks {
        for (bench, key) in COMMAND_SETTINGS {
            if name != bench {
                continue;
            }
            if let Some(value) = table.get_mut(*key) {
                let found =
                    resolve_command(value, base, policy).map_err(|e| CommandError::Setting {
                        benchmark: name.clone(),
                        key,
                        reason: e.to_string(),
                    })?;
                warnings.extend(found);
            }
        }
    }
    Ok(warnings)
}

impl Config {
    /// Resolves and checks the command settings of the user's file (see
    /// [`resolve_command`]) against `base`, the folder of that file.
    pub fn resolve_commands(
        &mut self,
        base: &Path,
        policy: &crate::trust::Policy,
    ) -> Result<Vec<String>, ConfigError> {
        resolve_commands(self.benchmarks.iter_mut(), base, policy).map_err(|error| {
            ConfigError::Command {
                file: self.source.clone(),
                error,
            }
        })
    }
}

/// Durations in settings and flags (`250ms`, `1.5s`, `2m`; a bare number
/// is seconds): the one parser of `kernmlops_sys`.
pub use kernmlops_sys::duration::parse_duration;

/// Shortest plugin timeout: a probe's start (loading and verifying BPF
/// programs) can take a good part of a second on a slow machine.
pub const MIN_PLUGIN_TIMEOUT: Duration = Duration::from_secs(1);

/// `collect.plugin_timeout`: at least [`MIN_PLUGIN_TIMEOUT`].
pub fn plugin_timeout(text: &str) -> Result<Duration, ValueError> {
    let d = parse_duration(text)?;
    if d < MIN_PLUGIN_TIMEOUT {
        return Err(ValueError::ShortTimeout { text: text.into() });
    }
    Ok(d)
}

/// Shortest drain interval: a drain thread waits at least this long for
/// data (shorter would spin a CPU for nothing).
pub const MIN_DRAIN_INTERVAL: Duration = DrainInterval::MIN;
/// Shortest flush interval: each flush writes a record batch per table.
pub const MIN_FLUSH_INTERVAL: Duration = FlushInterval::MIN;

/// A duration that must be at least `min` (zero would busy-spin).
pub fn interval(text: &str, min: Duration) -> Result<Duration, ValueError> {
    let d = parse_duration(text)?;
    if d < min {
        return Err(ValueError::ShortInterval {
            text: text.into(),
            min,
        });
    }
    Ok(d)
}

/// A component's message without the `[probes.name]: ` the SDK starts it
/// with (the host names the section itself).
fn strip_section(message: &str) -> &str {
    let m = message.trim();
    if m.starts_with('[') {
        if let Some((_, rest)) = m.split_once("]: ") {
            return rest;
        }
        if let Some((head, rest)) = m.split_once("] ") {
            if !head.contains(' ') {
                return rest;
            }
        }
    }
    m
}

/// `path.key` and the message, without naming the key twice when the
/// message starts with it (`inflight_entries must be at least 1`).
fn at_key(path: &str, key: &str, message: &str) -> String {
    if let Some(rest) = message.strip_prefix(key) {
        if rest.is_empty() || rest.starts_with([' ', ':']) {
            return format!("{path}.{key}{rest}");
        }
    }
    format!("{path}.{key}: {message}")
}

/// The smallest ring accepted. A ring wakes its reader when a quarter full;
/// under `perf bench sched pipe` 4 KiB rings still lost 0.7-28% of
/// sched_switch events and 8 KiB rings up to 0.5% where 16 KiB rings lost
/// at most 0.03% (README, Reliability).
pub const MIN_RING_BYTES: u64 = 16 << 10;

/// Parses a ring size (`16MiB`, `4M`, `65536`) into a power-of-two byte
/// count between [`MIN_RING_BYTES`] and 1 GiB; `auto` is 0: each table's
/// ring is sized from the rate its probe declares (64 KiB to 16 MiB).
pub fn ring_bytes(s: &str) -> Result<u64, ValueError> {
    let s = s.trim();
    if s == "auto" {
        return Ok(0);
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: u64 = num.parse().map_err(|_| ValueError::NotASize(s.into()))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        other => {
            return Err(ValueError::SizeUnit {
                unit: other.into(),
                text: s.into(),
            })
        }
    };
    let bytes = value.saturating_mul(scale);
    if !bytes.is_power_of_two() || !(MIN_RING_BYTES..=(1 << 30)).contains(&bytes) {
        return Err(ValueError::RingRange(s.into()));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `kernmlops.toml` is the defaults in code, as `config defaults`
    /// shows them; `UPDATE_DEFAULTS=1` writes it.
    #[test]
    fn kernmlops_toml_is_the_generated_defaults() {
        let generated = defaults_file();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernmlops.toml");
        let shipped = std::fs::read_to_string(&path).expect("kernmlops.toml");
        if shipped != generated && std::env::var_os("UPDATE_DEFAULTS").is_some() {
            std::fs::write(&path, &generated).expect("write kernmlops.toml");
            return;
        }
        assert!(
            shipped == generated,
            "kernmlops.toml is not the defaults in code; regenerate it with \
             `UPDATE_DEFAULTS=1 cargo test -p kernmlops --lib kernmlops_toml_is_the_generated_defaults`\n\
             --- generated:\n{generated}"
        );
        // Every default survives the text: read back, it is the Default.
        let back: toml::Table = toml::from_str(&generated).expect("TOML");
        let collect = back["collect"].clone().try_into::<CollectConfig>();
        assert_eq!(collect.expect("[collect]"), CollectConfig::default());
        let power = back["power"]
            .clone()
            .try_into::<crate::power::PowerConfig>();
        assert_eq!(
            power.expect("[power]"),
            crate::power::PowerConfig::default()
        );
    }

    #[test]
    fn text_settings_are_typed_at_load_with_messages_naming_the_key() {
        let cfg = Config::from_text(
            "mine.toml",
            b"[collect]\nduration = \"1.5s\"\nring_size = \"4M\"\ndrain_interval = \"2.5ms\"\nplugin_timeout = \"2m\"\n",
        )
        .expect("valid");
        let c = &cfg.collect;
        assert_eq!(c.duration.get(), Duration::from_millis(1500));
        assert_eq!(c.ring_size, RingSize::Bytes(4 << 20));
        assert_eq!(c.drain_interval.get(), Duration::from_micros(2500));
        assert_eq!(c.plugin_timeout.get(), Duration::from_secs(120));
        // Written back in the largest exact unit, and read back the same.
        let shown = toml::Table::try_from(c).expect("serialise");
        assert_eq!(shown["ring_size"].as_str(), Some("4MiB"));
        assert_eq!(shown["drain_interval"].as_str(), Some("2.5ms"));
        assert_eq!(shown["plugin_timeout"].as_str(), Some("2m"));
        let back: CollectConfig = toml::Value::Table(shown).try_into().expect("back");
        assert_eq!(&back, c);
        for (size, text) in [(16 << 10, "16KiB"), (1 << 30, "1GiB"), (3 << 20, "3MiB")] {
            assert_eq!(RingSize::Bytes(size).to_string(), text);
        }
        for (body, message) in [
            (
                "duration = \"ten\"",
                "mine.toml: collect.duration: \"ten\" is not a duration (try 10s, 500ms, 1.5s or 2m)",
            ),
            (
                "ring_size = \"3MiB\"",
                "mine.toml: collect.ring_size: \"3MiB\" must be a power of two between 16KiB and 1GiB",
            ),
            (
                "drain_interval = \"0ms\"",
                "mine.toml: collect.drain_interval: \"0ms\" is shorter than the minimum, 1ms (a zero interval would keep a CPU busy)",
            ),
            (
                "plugin_timeout = \"1ms\"",
                "mine.toml: collect.plugin_timeout: \"1ms\" is shorter than the minimum, 1s (a probe's start alone can take most of a second)",
            ),
            ("flush_rows = 0", "mine.toml: collect.flush_rows: must be at least 1"),
            (
                "flush_rows = -1",
                "mine.toml: invalid value: integer `-1`, expected u64 in `collect.flush_rows`",
            ),
            (
                "duration = 5",
                "mine.toml: collect.duration: expected a string, found an integer",
            ),
        ] {
            let text = format!("[collect]\n{body}\n");
            let e = Config::from_text("mine.toml", text.as_bytes()).expect_err(body);
            assert_eq!(e.to_string(), message, "{body}");
        }
        let e =
            Config::from_text("mine.toml", b"[power]\ninterval = \"1ms\"\n").expect_err("power");
        assert_eq!(
            e.to_string(),
            "mine.toml: power.interval: \"1ms\" is shorter than the minimum, 10ms"
        );
    }

    #[test]
    fn defaults_file_matches_code() {
        assert_eq!(
            Config::load(None).expect("defaults parse"),
            Config::default()
        );
    }

    #[test]
    fn user_file_merges_and_rejects_unknown_keys() {
        let dir = crate::export::tests::tempdir("config");
        let good = dir.join("good.toml");
        std::fs::write(&good, "[collect]\nduration = \"5s\"\n").expect("write");
        let cfg = Config::load(Some(&good)).expect("merge");
        assert_eq!(cfg.collect.duration, HumanDuration::from_secs(5));
        assert_eq!(cfg.collect.output, "data", "unset keys keep their defaults");

        for (body, needle) in [
            ("[collect]\nbogus = 1\n", "collect.bogus: unknown key"),
            (
                "[collect]\nflush_rows = \"many\"\n",
                "collect.flush_rows: expected an integer, found a string",
            ),
            ("[collect]\nring_size = \"3MiB\"\n", "collect.ring_size"),
            ("[nope]\n", "nope: unknown key"),
            (
                "[machine]\nturbo = true\n",
                "machine.turbo: unknown key (known: block, cpufreq, cpus, smt, sysctl, sysfs, thp_mode)",
            ),
            (
                "[machine]\ncpus = \"4095\"\n",
                "machine.cpus: CPU 4095 is not online on this machine (online: ",
            ),
            (
                "machine = 3\n",
                "machine: expected a table, found an integer",
            ),
            (
                "[machine.sysctl]\nvm.no_such_knob = 1\n",
                "machine.sysctl.vm.no_such_knob: /proc/sys/vm/no_such_knob does not exist",
            ),
        ] {
            let bad = dir.join("bad.toml");
            std::fs::write(&bad, body).expect("write");
            let err = Config::load(Some(&bad)).expect_err(body).to_string();
            assert!(
                err.contains(needle) && err.contains("bad.toml"),
                "{body:?} gave {err}"
            );
        }
    }

    #[test]
    fn a_benchmarks_thp_mode_becomes_the_machine_knob_and_leaves_its_settings() {
        let user = |text: &str| toml::from_str::<toml::Table>(text).expect("toml");
        let mut cfg = Config {
            source: "mine.toml".into(),
            ..Config::default()
        };
        cfg.benchmarks
            .insert("fio".into(), user("thp_mode = \"never\"\nbs = \"4k\""));
        cfg.benchmarks
            .insert("quiet".into(), user("thp_mode = \"\""));
        if std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
            let k = cfg.knobs_for(Some("fio")).expect("a knob");
            assert_eq!(k.len(), 1);
            assert_eq!(
                (k[0].name.as_str(), k[0].value.as_str()),
                ("thp_mode", "never")
            );
            // Only for the benchmark run; "" leaves the mode as it is.
            assert!(cfg.knobs_for(Some("quiet")).expect("none").is_empty());
            assert!(cfg.knobs_for(None).expect("none").is_empty());
            cfg.machine = user("thp_mode = \"always\"");
            let e = cfg.knobs_for(Some("fio")).expect_err("twice").to_string();
            assert_eq!(
                e,
                "mine.toml: benchmarks.fio.thp_mode and machine.thp_mode both set the THP mode; keep one"
            );
            cfg.machine = toml::Table::new();
        }
        // The benchmark is given its settings without the key.
        let json = Config::settings_json(&cfg.benchmarks);
        let stripped = strip_host_settings(json);
        assert_eq!(stripped["fio"], serde_json::json!({"bs": "4k"}));
        // A benchmark that does not declare it: still a host setting,
        // checked by the host.
        let declared = [("fio", "bs = \"1k\"\n"), ("quiet", "")];
        let got = cfg.benchmark_settings(declared).expect("accepted");
        assert!(!got["fio"].contains_key("thp_mode"));
        cfg.benchmarks
            .insert("fio".into(), user("thp_mode = \"sometimes\""));
        let e = cfg
            .benchmark_settings(declared)
            .expect_err("refused")
            .to_string();
        assert!(
            e.contains("benchmarks.fio.thp_mode = \"sometimes\": use"),
            "{e}"
        );
    }

    #[test]
    fn probe_settings_merge_over_declared_defaults() {
        let mut cfg = Config {
            source: "mine.toml".into(),
            ..Config::default()
        };
        let declared = [
            ("memory_usage", "interval = \"1s\"\nfields = [\"a\"]\n"),
            ("quiet", ""),
        ];
        let user = |text: &str| toml::from_str::<toml::Table>(text).expect("toml");

        cfg.probes
            .insert("memory_usage".into(), user("interval = \"250ms\""));
        let got = cfg.probe_settings(declared).expect("valid");
        assert_eq!(got["memory_usage"]["interval"].as_str(), Some("250ms"));
        assert!(
            got["memory_usage"].contains_key("fields"),
            "unset keys keep defaults"
        );
        assert!(got["quiet"].is_empty());

        for (probe, body, needle) in [
            (
                "memory_usage",
                "bogus = 1",
                "probes.memory_usage.bogus: unknown key (known: fields, interval)",
            ),
            (
                "memory_usage",
                "interval = 5",
                "probes.memory_usage.interval: expected a string, found an integer",
            ),
            (
                "quiet",
                "x = 1",
                "probes.quiet.x: unknown key (probes.quiet has no settings)",
            ),
            (
                "nobody",
                "x = 1",
                "probes.nobody: no loaded plugin has a probe named nobody",
            ),
        ] {
            let mut bad = cfg.clone();
            bad.probes.clear();
            bad.probes.insert(probe.into(), user(body));
            let err = bad.probe_settings(declared).expect_err(body).to_string();
            assert!(
                err.starts_with("mine.toml: ") && err.contains(needle),
                "{body}: {err}"
            );
        }
    }

    #[test]
    fn a_table_declared_empty_takes_any_keys() {
        let cfg = Config {
            source: "mine.toml".into(),
            ..Config::default()
        };
        let declared = [(
            "script",
            "command = []\nparameters = {}\n[limits]\ncpu = 1\n",
        )];
        let user = |text: &str| toml::from_str::<toml::Table>(text).expect("toml");
        let mut good = cfg.clone();
        good.benchmarks.insert(
            "script".into(),
            user("command = [\"./b.sh\"]\n[parameters]\nsize = 3\nmode = \"fast\"\n[parameters.nested]\nx = [1, 2]\n"),
        );
        let got = good.benchmark_settings(declared).expect("free-form table");
        let params = got["script"]["parameters"].as_table().expect("table");
        assert_eq!(params["size"].as_integer(), Some(3));
        assert_eq!(params["mode"].as_str(), Some("fast"));
        assert!(params["nested"].is_table());

        for (body, needle) in [
            (
                "parameters = 3",
                "benchmarks.script.parameters: expected a table, found an integer",
            ),
            (
                "[limits]\nmemory = 1",
                "benchmarks.script.limits.memory: unknown key (known: cpu)",
            ),
            ("bogus = 1", "benchmarks.script.bogus: unknown key"),
        ] {
            let mut bad = cfg.clone();
            bad.benchmarks.insert("script".into(), user(body));
            let err = bad
                .benchmark_settings(declared)
                .expect_err(body)
                .to_string();
            assert!(err.contains(needle), "{body}: {err}");
        }
    }

    #[test]
    fn parse_errors_quote_the_line_escaped() {
        for (bytes, needle) in [
            (&b"[collect]\nduration = \"5s\n"[..], "line 2, column"),
            (
                &b"a = 1\n\x01\x02 = 3\n"[..],
                "line 2, column 1: `\\u{1}\\u{2} = 3`",
            ),
            (
                &b"ok = 1\n\xff\xfe = 1\n"[..],
                "line 2, column 1: `\\xff\\xfe = 1`: not UTF-8 text",
            ),
            (&b"[x"[..], "line 1, column 3: `[x`"),
        ] {
            let e = parse_toml(bytes).expect_err("invalid").to_string();
            assert!(e.contains(needle), "{bytes:?}: {e}");
            assert!(
                !e.contains('\n') && e.chars().all(|c| !c.is_control()),
                "{e:?}"
            );
        }
    }

    #[test]
    fn zero_intervals_are_refused() {
        for (body, needle) in [
            (
                "[collect]\ndrain_interval = \"0s\"\n",
                "collect.drain_interval",
            ),
            (
                "[collect]\nflush_interval = \"0ms\"\n",
                "collect.flush_interval",
            ),
            (
                "[collect]\nflush_interval = \"1ms\"\n",
                "shorter than the minimum, 10ms",
            ),
        ] {
            let e = Config::from_text("mine.toml", body.as_bytes())
                .expect_err(body)
                .to_string();
            assert!(
                e.starts_with("mine.toml: ") && e.contains(needle),
                "{body}: {e}"
            );
        }
        assert_eq!(
            interval("1ms", MIN_DRAIN_INTERVAL),
            Ok(Duration::from_millis(1))
        );
    }

    #[test]
    fn component_rules_name_the_file_and_key() {
        let user = |text: &str| toml::from_str::<toml::Table>(text).expect("toml");
        let declared = [("block_io", "inflight_entries = 64\nname = \"x\"\n")];
        // The component's rules: inflight_entries from 1 to 1000; serde's
        // message for a wrong size names no key.
        let rules = |_: &str, json: &str| -> Result<(), String> {
            let v: serde_json::Value = serde_json::from_str(json).expect("json");
            match v["inflight_entries"].as_i64() {
                Some(n) if n > u32::MAX as i64 => {
                    Err("[probes.block_io]: invalid value: integer, expected u32".into())
                }
                Some(0) => Err("[probes.block_io]: inflight_entries must be at least 1".into()),
                Some(n) if n > 1000 => Err("[probes.block_io]: too large".into()),
                _ => Ok(()),
            }
        };
        for (body, needle) in [
            (
                "inflight_entries = 0",
                "mine.toml: probes.block_io.inflight_entries must be at least 1",
            ),
            (
                "inflight_entries = 5000000000\nname = \"y\"",
                "mine.toml: probes.block_io.inflight_entries: invalid value",
            ),
            (
                "inflight_entries = 2000",
                "mine.toml: probes.block_io.inflight_entries: too large",
            ),
        ] {
            let mut cfg = Config {
                source: "mine.toml".into(),
                ..Config::default()
            };
            cfg.probes.insert("block_io".into(), user(body));
            let e = cfg
                .check_rules("probes", declared, &[], rules)
                .expect_err(body)
                .to_string();
            assert!(e.starts_with(needle), "{body}: {e}");
        }
        let cfg = Config::default();
        cfg.check_rules("probes", declared, &["block_io".into()], rules)
            .expect("the defaults pass");
    }

    #[test]
    fn parses_durations_and_sizes() {
        use std::time::Duration;
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("ten").is_err() && parse_duration("5y").is_err());
        assert_eq!(ring_bytes("16MiB"), Ok(16 << 20));
        assert_eq!(ring_bytes("auto"), Ok(0));
        assert!(ring_bytes("1000").is_err() && ring_bytes("2GiB").is_err());
        assert!(ring_bytes("8KiB").is_err_and(|e| e.to_string().contains("between 16KiB")));
        assert_eq!(ring_bytes("16KiB"), Ok(MIN_RING_BYTES));
    }
}
