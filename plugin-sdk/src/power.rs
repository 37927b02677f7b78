//! Power sources: what a meter plugin implements ([`PowerSourceImpl`]) and
//! the parts every meter shares, so that RAPL, hwmon, the perf power PMU and
//! a vendor's own interface differ only in where they read:
//!
//! - [`WrapCounter`]: a cumulative hardware counter made monotonic: the
//!   first sample is the baseline, a wrap at the counter's range is
//!   corrected, a counter that went backwards is an error;
//! - [`PowerIntegrator`]: power samples (µW) integrated into energy (µJ)
//!   over time, for sensors that report power only;
//! - [`SysfsRoot`]: the `sysfs_root` setting (default `/sys`) every
//!   sysfs-reading source takes, so that its tests read a tree they write;
//! - [`read_u64`] and [`read_text`]: one sysfs value with an error that
//!   says what happened (vanished, permission, not a number).
//!
//! ```ignore
//! kernmlops_plugin_sdk::export_plugin! {
//!     description: "My board's power meter",
//!     power_sources: [MyMeter],
//! }
//! ```
//!
//! A source declares its zones once started ([`Zone`]: name, scope,
//! socket, measured or modelled, update interval) and returns, for each
//! zone at each read, its energy since start in microjoules. The host reads
//! every source at the same slot boundaries, writes the `energy` table and
//! attributes energy to processes; the source writes no table.

use std::{
    io,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};

pub use kernmlops_plugin_api::{PowerReading, PowerScope, PowerZone};

use crate::{settings::Settings, Result, StartArgs};

/// A power source written in plain Rust. [`export_plugin!`](crate::export_plugin)
/// (`power_sources: [...]`) turns it into an ABI power source with every
/// call guarded against panics, its zones fixed at start, a zone's failure
/// kept (reported once by the host), and energy that never decreases.
pub trait PowerSourceImpl: Sized + Send + 'static {
    /// The source's name, as users type it in `--power`.
    const NAME: &'static str;
    /// One line saying what it reads.
    const DESCRIPTION: &'static str;
    /// The scope it mainly measures (its zones say their own).
    const SCOPE: PowerScope;
    /// How often its counters typically update.
    const UPDATE_INTERVAL: Duration;
    /// Its settings (`[power.settings.<name>]`); [`NoSettings`](crate::NoSettings) for none.
    type Settings: Settings;

    /// Finds the zones and opens what it reads. A machine without the
    /// interface is an error of kind `UNSUPPORTED` saying what is missing.
    fn start(args: &StartArgs, settings: Self::Settings) -> Result<Self>;

    /// The zones, in the order of [`PowerSourceImpl::read`]'s readings.
    fn zones(&self) -> Vec<Zone>;

    /// Reads every zone at `now_us` (`CLOCK_BOOTTIME` µs): `out` is cleared
    /// and gets, per zone, its energy since the source started in µJ (0 at
    /// the first read) or why it could not be read.
    fn read(&mut self, now_us: u64, out: &mut Vec<ZoneReading>) -> Result<()>;

    /// What was skipped because this machine lacks it, one sentence each.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }

    /// For modelled zones: the model and its coefficients, recorded in the
    /// run's manifest. `None` for a meter.
    fn model(&self) -> Option<serde_json::Value> {
        None
    }
}

/// One zone's reading: energy since start in µJ, or why it failed.
pub type ZoneReading = std::result::Result<u64, String>;

/// A zone as a source declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct Zone {
    /// Unique within the source, lowercase: `package-0`, `dram-1`.
    pub name: String,
    pub scope: PowerScope,
    /// CPU socket (physical package id); `None` for several or none.
    pub socket: Option<u32>,
    /// False for a model's estimate.
    pub measured: bool,
    pub update_interval: Duration,
    /// The zone of the same source containing this one.
    pub parent: Option<String>,
    pub description: String,
}

impl Zone {
    /// A measured zone with no socket and no parent.
    pub fn measured(name: impl Into<String>, scope: PowerScope, update_interval: Duration) -> Self {
        Self {
            name: name.into(),
            scope,
            socket: None,
            measured: true,
            update_interval,
            parent: None,
            description: String::new(),
        }
    }

    /// A modelled zone (an estimate, never reported as measured).
    pub fn modelled(name: impl Into<String>, scope: PowerScope, update_interval: Duration) -> Self {
        Self {
            measured: false,
            ..Self::measured(name, scope, update_interval)
        }
    }

    pub fn socket(mut self, socket: u32) -> Self {
        self.socket = Some(socket);
        self
    }

    pub fn parent(mut self, parent: impl Into<String>) -> Self {
        self.parent = Some(parent.into());
        self
    }

    pub fn describe(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// The zone as it crosses the ABI.
    pub fn to_abi(&self) -> PowerZone {
        PowerZone {
            name: self.name.as_str().into(),
            scope: self.scope,
            socket: self
                .socket
                .and_then(|s| i32::try_from(s).ok())
                .unwrap_or(-1),
            measured: self.measured,
            update_interval_us: u64::try_from(self.update_interval.as_micros()).unwrap_or(u64::MAX),
            parent: self.parent.as_deref().unwrap_or("").into(),
            description: self.description.as_str().into(),
        }
    }
}

/// Why a counter's new value cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterError {
    /// Lower than the previous value, and not a wrap at the range.
    Backwards { from: u64, to: u64 },
    /// Above the range the counter declares.
    AboveRange { value: u64, range: u64 },
}

impl std::fmt::Display for CounterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Backwards { from, to } => write!(
                f,
                "the counter went backwards from {from} to {to} without wrapping around"
            ),
            Self::AboveRange { value, range } => {
                write!(f, "the counter read {value}, above its range {range}")
            }
        }
    }
}

impl std::error::Error for CounterError {}

/// A cumulative hardware counter (RAPL's `energy_uj`, a perf count, an
/// hwmon `energy*_input`) made monotonic from its first sample.
///
/// With a range (`max_energy_range_uj`), a value below the previous one is
/// a wrap when the implied increase, `(range - prev) + cur`, is under half
/// the range: a counter read far more often than it wraps (RAPL wraps after
/// tens of minutes) never moves that far between two reads, whereas a
/// counter that went back a little (a reset, a glitch) would imply almost a
/// whole range at once. Without a range, any decrease is an error.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WrapCounter {
    range: Option<u64>,
    last: Option<u64>,
    total: u64,
}

impl WrapCounter {
    /// A counter that wraps at `range` (`None`: never expected to wrap).
    pub fn new(range: Option<u64>) -> Self {
        Self {
            range: range.filter(|&r| r > 0),
            last: None,
            total: 0,
        }
    }

    /// Takes a raw value and returns the increase since the first one. On
    /// an error the counter keeps its state.
    pub fn update(&mut self, raw: u64) -> std::result::Result<u64, CounterError> {
        if let Some(range) = self.range {
            if raw > range {
                return Err(CounterError::AboveRange { value: raw, range });
            }
        }
        let Some(prev) = self.last else {
            self.last = Some(raw);
            return Ok(0);
        };
        let delta = if raw >= prev {
            raw - prev
        } else {
            match self.range {
                Some(range) if (range - prev).saturating_add(raw) < range / 2 => {
                    (range - prev) + raw
                }
                _ => {
                    return Err(CounterError::Backwards {
                        from: prev,
                        to: raw,
                    })
                }
            }
        };
        self.last = Some(raw);
        self.total = self.total.saturating_add(delta);
        Ok(self.total)
    }

    /// The increase since the first value.
    pub fn total(&self) -> u64 {
        self.total
    }
}

/// Power samples (µW) integrated into energy (µJ) with the trapezoid rule,
/// exactly: the sum is kept in picojoules (µW × µs), so no rounding
/// accumulates. The first sample starts the integral.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PowerIntegrator {
    last: Option<(u64, u64)>,
    total_pj: u128,
}

impl PowerIntegrator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a sample of `power_uw` taken at `ts_us` and returns the energy
    /// since the first sample in µJ. A sample older than the previous one
    /// is an error (the clock only goes forward).
    pub fn add(&mut self, ts_us: u64, power_uw: u64) -> std::result::Result<u64, String> {
        if let Some((t0, p0)) = self.last {
            if ts_us < t0 {
                return Err(format!(
                    "a power sample at {ts_us} us comes before the previous one at {t0} us"
                ));
            }
            let dt = u128::from(ts_us - t0);
            let total = (u128::from(p0) + u128::from(power_uw))
                .checked_mul(dt)
                .map(|pj2| pj2 / 2)
                .and_then(|pj| self.total_pj.checked_add(pj))
                .filter(|&t| t / 1_000_000 <= u128::from(u64::MAX))
                .ok_or_else(|| {
                    format!(
                        "a power reading of {power_uw} uW makes the energy overflow 2^64 uJ: \
                         the sensor is not reading a real power"
                    )
                })?;
            self.total_pj = total;
        }
        self.last = Some((ts_us, power_uw));
        Ok(self.energy_uj())
    }

    /// Energy since the first sample in µJ (it never saturates: a sample
    /// that would overflow is refused by [`PowerIntegrator::add`]).
    pub fn energy_uj(&self) -> u64 {
        u64::try_from(self.total_pj / 1_000_000).unwrap_or(u64::MAX)
    }
}

/// The `sysfs_root` setting: where a source finds sysfs (`/sys` unless a
/// test points it at a tree it wrote).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SysfsRoot(pub PathBuf);

impl Default for SysfsRoot {
    fn default() -> Self {
        Self(PathBuf::from("/sys"))
    }
}

impl SysfsRoot {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self(path.into())
    }

    /// `relative` (`class/powercap`) under the root.
    pub fn join(&self, relative: impl AsRef<Path>) -> PathBuf {
        self.0.join(relative)
    }

    /// Whether this is the machine's own sysfs.
    pub fn is_real(&self) -> bool {
        self.0 == Path::new("/sys")
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The end of an error saying a meter is missing: on this machine's own
    /// sysfs, when it is a virtual machine, `; this is a KVM virtual
    /// machine, and hypervisors rarely expose {what}`; else empty (a test's
    /// tree says nothing of the machine).
    pub fn vm_hint(&self, what: &str) -> String {
        if !self.is_real() {
            return String::new();
        }
        virtual_machine()
            .map(|vm| format!("; this is {vm}, and hypervisors rarely expose {what}"))
            .unwrap_or_default()
    }
}

/// The first line of a sysfs file, trimmed, with an error naming the file
/// and saying what happened.
pub fn read_text(path: &Path) -> std::result::Result<String, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text.lines().next().unwrap_or("").trim().to_owned()),
        Err(e) => Err(describe_read_error(path, &e)),
    }
}

/// A sysfs file holding one unsigned number.
pub fn read_u64(path: &Path) -> std::result::Result<u64, String> {
    let text = read_text(path)?;
    text.parse()
        .map_err(|_| format!("{} holds {text:?}, not a number", path.display()))
}

/// What a failed read of `path` means, in words.
pub fn describe_read_error(path: &Path, e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::NotFound => format!("{} vanished (no such file)", path.display()),
        io::ErrorKind::PermissionDenied => {
            format!("permission denied reading {} (run as root)", path.display())
        }
        _ => format!("reading {}: {e}", path.display()),
    }
}

/// When this machine is a virtual machine, a phrase naming its hypervisor
/// (`a KVM virtual machine`), for messages saying why a meter is missing:
/// hypervisors rarely pass power meters through.
pub fn virtual_machine() -> Option<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flagged = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .is_some_and(|l| l.split_whitespace().any(|f| f == "hypervisor"));
    let vendor = read_text(Path::new("/sys/devices/virtual/dmi/id/sys_vendor")).unwrap_or_default();
    let product =
        read_text(Path::new("/sys/devices/virtual/dmi/id/product_name")).unwrap_or_default();
    let known = [
        ("QEMU", "QEMU/KVM"),
        ("KVM", "KVM"),
        ("VMware", "VMware"),
        ("VirtualBox", "VirtualBox"),
        ("Xen", "Xen"),
        ("Microsoft Corporation", "Hyper-V"),
        ("Amazon EC2", "Amazon EC2"),
        ("Google", "Google Compute Engine"),
    ];
    let named = known
        .iter()
        .find(|(needle, _)| vendor.contains(needle) || product.contains(needle))
        .map(|(_, name)| *name);
    match (named, flagged) {
        (Some(name), _) => Some(format!("a {name} virtual machine")),
        (None, true) => Some("a virtual machine".to_owned()),
        (None, false) => None,
    }
}

/// The declaration the plugin exports for `S`, for its own tests (with
/// `kernmlops_plugin_sdk::api::validate_power_source`, the host's rule).
pub fn declaration<S: PowerSourceImpl>() -> kernmlops_plugin_api::PowerSourceDecl {
    crate::guard::power_source_decl::<S>()
}

/// `[power.settings.<name>]`, the section a power source's settings errors
/// name.
pub fn settings_section(name: &str) -> String {
    format!("[power.settings.{name}]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_sample_is_the_baseline_and_wraps_are_corrected() {
        let mut c = WrapCounter::new(Some(1000));
        assert_eq!(c.update(900), Ok(0));
        assert_eq!(c.update(950), Ok(50));
        // Wrapped: (1000 - 950) + 30 = 80 more.
        assert_eq!(c.update(30), Ok(130));
        assert_eq!(c.update(30), Ok(130));
        assert_eq!(c.total(), 130);
    }

    #[test]
    fn going_backwards_is_an_error_not_a_wrap() {
        let mut c = WrapCounter::new(Some(1000));
        c.update(500).expect("baseline");
        // 490 would imply 990 in one read: almost a whole range.
        assert_eq!(
            c.update(490),
            Err(CounterError::Backwards { from: 500, to: 490 })
        );
        // The state is kept: the next good value continues from 500.
        assert_eq!(c.update(520), Ok(20));
        assert_eq!(
            c.update(2000),
            Err(CounterError::AboveRange {
                value: 2000,
                range: 1000
            })
        );
        let mut open = WrapCounter::new(None);
        open.update(10).expect("baseline");
        assert!(open.update(9).is_err());
    }

    #[test]
    fn power_integrates_exactly_with_the_trapezoid_rule() {
        let mut p = PowerIntegrator::new();
        assert_eq!(p.add(1_000_000, 5_000_000), Ok(0));
        // 5 W for one second: 5 J.
        assert_eq!(p.add(2_000_000, 5_000_000), Ok(5_000_000));
        // 5 W -> 7 W over half a second: 3 J.
        assert_eq!(p.add(2_500_000, 7_000_000), Ok(8_000_000));
        // 1 µW for 1 µs a million times is 1 µJ, with no rounding lost.
        let mut q = PowerIntegrator::new();
        q.add(0, 1).expect("first");
        for t in 1..=1_000_000u64 {
            q.add(t, 1).expect("sample");
        }
        assert_eq!(q.energy_uj(), 1);
        assert!(q.add(5, 1).is_err(), "time going backwards");
    }

    #[test]
    fn energy_that_would_overflow_is_refused_not_saturated() {
        let mut p = PowerIntegrator::new();
        p.add(0, 5_000_000).expect("first");
        assert!(p.add(1_000_000, u64::MAX).is_ok(), "half of 2^64 uJ fits");
        let e = p.add(3_000_000, u64::MAX).expect_err("overflow");
        assert!(e.contains("overflow"), "{e}");
        assert!(p.energy_uj() < u64::MAX, "never saturated");
    }

    #[test]
    fn zones_cross_the_abi_with_their_facts() {
        let z = Zone::measured("core", PowerScope::CORE, Duration::from_millis(1))
            .socket(1)
            .parent("package-1")
            .describe("cores of socket 1");
        let a = z.to_abi();
        assert_eq!(a.socket, 1);
        assert_eq!(a.update_interval_us, 1000);
        assert_eq!(a.parent.as_str(), "package-1");
        assert!(a.measured);
        let m = Zone::modelled("cpu", PowerScope::PACKAGE, Duration::from_millis(10)).to_abi();
        assert_eq!((m.socket, m.measured), (-1, false));
    }

    /// A source whose readings the test scripts: zone 0 counts up, zone 1
    /// fails once then would work again, zone 2 goes backwards.
    struct Scripted {
        step: u64,
    }

    impl PowerSourceImpl for Scripted {
        const NAME: &'static str = "scripted";
        const DESCRIPTION: &'static str = "test source";
        const SCOPE: PowerScope = PowerScope::PACKAGE;
        const UPDATE_INTERVAL: Duration = Duration::from_millis(1);
        type Settings = crate::NoSettings;

        fn start(_: &StartArgs, _: crate::NoSettings) -> Result<Self> {
            Ok(Self { step: 0 })
        }

        fn zones(&self) -> Vec<Zone> {
            ["a", "b", "c"]
                .iter()
                .map(|n| Zone::measured(*n, PowerScope::PACKAGE, Duration::from_millis(1)))
                .collect()
        }

        fn read(&mut self, _now: u64, out: &mut Vec<ZoneReading>) -> Result<()> {
            self.step += 1;
            out.push(Ok(self.step * 10));
            out.push(if self.step == 2 {
                Err("b vanished".into())
            } else {
                Ok(self.step)
            });
            out.push(Ok(if self.step >= 3 { 1 } else { self.step * 100 }));
            Ok(())
        }
    }

    #[test]
    fn the_guard_keeps_failures_and_refuses_decreasing_energy() {
        use kernmlops_plugin_api::abi_stable::std_types::{RResult, RVec};
        let args = StartArgs::new("{}").with_self_tgid(0);
        let RResult::ROk(mut src) = crate::guard::new_power_source::<Scripted>(&args) else {
            panic!("starting the scripted source");
        };
        assert_eq!(src.zones().len(), 3);
        let mut r = RVec::new();
        let mut read = |r: &mut RVec<PowerReading>| {
            assert!(src.read(r).is_rok());
            r.iter()
                .map(|x| (x.energy_uj, x.error.to_string()))
                .collect::<Vec<_>>()
        };
        assert_eq!(read(&mut r)[1], (1, String::new()));
        let second = read(&mut r);
        assert_eq!(second[0], (20, String::new()));
        assert_eq!(second[1], (1, "b vanished".into()));
        let third = read(&mut r);
        assert_eq!(
            third[1],
            (1, "b vanished".into()),
            "a failed zone stays failed"
        );
        assert_eq!(third[2].0, 200, "the last good energy is kept");
        assert!(
            third[2].1.contains("went backwards from 200 to 1"),
            "{third:?}"
        );
        assert_eq!(third[0], (30, String::new()), "the other zones go on");
        assert!(r.iter().all(|x| x.ts_uptime_us > 0));
    }

    #[test]
    fn sysfs_reads_say_what_happened() {
        let dir = std::env::temp_dir().join(format!("kml-sdk-power-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("n"), "42\n").expect("write");
        std::fs::write(dir.join("bad"), "x\n").expect("write");
        assert_eq!(read_u64(&dir.join("n")), Ok(42));
        assert!(read_u64(&dir.join("bad"))
            .expect_err("bad")
            .contains("not a number"));
        assert!(read_u64(&dir.join("gone"))
            .expect_err("gone")
            .contains("vanished"));
        std::fs::remove_dir_all(&dir).expect("cleanup");
        assert_eq!(
            SysfsRoot::default().join("class"),
            PathBuf::from("/sys/class")
        );
        assert!(SysfsRoot::default().is_real());
    }
}
