//! Tests every plugin crate shares, as a dev-dependency (never compiled
//! into a plugin's `.so`): the probe's declaration against the rules the
//! host enforces at load (`kernmlops_plugin_api::spec`), its settings'
//! defaults, and a real load-attach-drain on the running kernel as root.
//!
//! ```ignore
//! // tests/quanta_runtime.rs
//! kernmlops_plugin_testing::probe_tests!(BpfProbe<QuantaRuntime>);
//! ```
//! generates `declaration_meets_the_spec`, `settings_defaults_parse_back`
//! and `root_loads_attaches_and_drains`. Plugins add their own tests with
//! [`Running`]:
//! ```ignore
//! let mut run = Running::<BpfProbe<MyProbe>>::start("{}");
//! assert!(run.drain_until(Duration::from_secs(5), |r| r.rows("my_table") > 0));
//! ```

pub mod proc_stat;

use std::time::{Duration, Instant};

use kernmlops_plugin_api::{spec, ColumnKind, TIMESTAMP_COLUMN};
use kernmlops_plugin_sdk::{
    settings::{self, Settings},
    Batch, BenchmarkImpl, ProbeImpl, StartArgs, TableDecl,
};

/// The clock of `ts_uptime_us`, for tests that compare timestamps.
pub use kernmlops_sys::clock::uptime_us;

/// Panics, naming the rule, unless `P`'s declaration would load in the host:
/// the probe's name matches `P::NAME`, every table passes the spec, and
/// timestamps are in microseconds.
pub fn check_declaration<P: ProbeImpl>() {
    let decl = P::decl();
    assert_eq!(
        decl.name.as_str(),
        P::NAME,
        "the declared probe name differs from NAME"
    );
    if let Err(e) = spec::validate_probe(&decl) {
        panic!("probe {} would be refused by the host: {e}", P::NAME);
    }
    for t in decl.tables.iter() {
        let ts = t
            .columns
            .iter()
            .find(|c| c.name.as_str() == TIMESTAMP_COLUMN);
        if let Some(ts) = ts {
            assert_eq!(
                ts.unit.as_str(),
                "us",
                "table {}: {TIMESTAMP_COLUMN} is in microseconds",
                t.name
            );
        }
    }
}

/// Panics unless the defaults users see (`kernmlops config defaults`) parse
/// back, through the host's TOML-to-JSON path, into the settings'
/// `Default`, and that default passes the settings' own rules.
pub fn check_settings_defaults<S: Settings + PartialEq + std::fmt::Debug>(name: &str) {
    let text = settings::defaults_toml::<S>();
    let table: toml::Table = toml::from_str(&text)
        .unwrap_or_else(|e| panic!("{name}: the defaults are not TOML: {e}\n{text}"));
    let json = serde_json::to_string(&table).unwrap_or_else(|e| panic!("{name}: {e}"));
    let parsed = settings::parse::<S>(name, &json)
        .unwrap_or_else(|e| panic!("{name}: the defaults do not parse back: {e}\n{text}"));
    assert_eq!(
        parsed,
        S::default(),
        "{name}: the shown defaults differ from Default"
    );
}

/// Panics unless the defaults `kernmlops config defaults` shows for `B`
/// parse as TOML into settings equal to `C::default()`.
pub fn check_benchmark_config_defaults<B, C>()
where
    B: BenchmarkImpl,
    C: serde::de::DeserializeOwned + Default + PartialEq + std::fmt::Debug,
{
    let text = settings::defaults_toml::<B::Settings>();
    let table: toml::Table = toml::from_str(&text)
        .unwrap_or_else(|e| panic!("{}: the defaults are not TOML: {e}", B::NAME));
    let json = serde_json::to_value(&table).unwrap_or_else(|e| panic!("{}: {e}", B::NAME));
    let parsed: C = serde_json::from_value(json)
        .unwrap_or_else(|e| panic!("{}: the defaults do not fit the settings: {e}", B::NAME));
    assert_eq!(
        parsed,
        C::default(),
        "{}: the shown defaults differ from Default",
        B::NAME
    );
}

/// True as root. Otherwise prints why the calling test is skipped, or
/// panics under `CI=true`, where every test must run.
pub fn require_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    assert!(
        !ci,
        "{test} needs root, and CI must run it: run the tests as root"
    );
    eprintln!("SKIP {test}: loading BPF programs needs root");
    false
}

/// Start arguments as the host passes them, with the component's settings
/// as a JSON object, no filter, and the test process itself recorded (a
/// test usually makes the activity it checks).
pub fn start_args(config_json: &str) -> StartArgs {
    StartArgs::new(config_json)
        .with_ring_bytes(4 << 20)
        .with_include_self(true)
}

/// A started probe with one batch per table it fills.
pub struct Running<P: ProbeImpl> {
    pub probe: P,
    pub tables: Vec<TableDecl>,
    pub batches: Vec<Batch>,
}

impl<P: ProbeImpl> Running<P> {
    /// Starts `P` with these settings, panicking with its error.
    pub fn start(config_json: &str) -> Self {
        Self::start_with(&start_args(config_json))
    }

    /// Starts `P` with these arguments, panicking with its error.
    pub fn start_with(args: &StartArgs) -> Self {
        Self::try_start_with(args).unwrap_or_else(|e| panic!("starting {}: {e}", P::NAME))
    }

    /// Starts `P` with these arguments, returning its error.
    pub fn try_start_with(args: &StartArgs) -> Result<Self, kernmlops_plugin_sdk::Error> {
        let section = format!("[probes.{}]", P::NAME);
        let settings = settings::parse::<P::Settings>(&section, &args.config_json)?;
        let probe = P::start(args, settings)?;
        let tables = probe.tables();
        for t in &tables {
            if let Err(e) = spec::validate_table(t) {
                panic!("{}: run-time table refused: {e}", P::NAME);
            }
        }
        let batches = tables.iter().map(|_| Batch::default()).collect();
        Ok(Self {
            probe,
            tables,
            batches,
        })
    }

    /// Drains every 100 ms until `done` holds or `timeout` passes; returns
    /// whether it held. `done` may also make activity for the probe to see.
    pub fn drain_until(&mut self, timeout: Duration, mut done: impl FnMut(&Self) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if done(self) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            self.drain_once(Duration::from_millis(100));
        }
    }

    /// One drain, checking that every batch holds whole records and none
    /// was malformed.
    pub fn drain_once(&mut self, timeout: Duration) {
        self.probe
            .drain(timeout, &mut self.batches)
            .unwrap_or_else(|e| panic!("draining {}: {e}", P::NAME));
        for (t, b) in self.tables.iter().zip(&self.batches) {
            assert_eq!(
                b.data.len() as u64,
                b.records * u64::from(t.record_size),
                "table {}: a batch must hold whole records",
                t.name
            );
            assert_eq!(
                b.malformed_total, 0,
                "table {}: records of the wrong size",
                t.name
            );
        }
    }

    /// Stops the probe and drains what is left.
    pub fn stop(&mut self) {
        self.probe
            .stop()
            .unwrap_or_else(|e| panic!("stopping {}: {e}", P::NAME));
        self.probe
            .drain(Duration::ZERO, &mut self.batches)
            .unwrap_or_else(|e| panic!("draining {} after stop: {e}", P::NAME));
    }

    fn index(&self, table: &str) -> usize {
        self.tables
            .iter()
            .position(|t| t.name.as_str() == table)
            .unwrap_or_else(|| panic!("{} fills no table {table}", P::NAME))
    }

    /// Rows collected so far in `table`.
    pub fn rows(&self, table: &str) -> u64 {
        self.batches[self.index(table)].records
    }

    /// Rows collected so far in every table.
    pub fn total_rows(&self) -> u64 {
        self.batches.iter().map(|b| b.records).sum()
    }

    /// Lost events reported for `table`.
    pub fn lost(&self, table: &str) -> u64 {
        self.batches[self.index(table)].lost_total
    }

    /// Values of an unsigned or boolean column, widened to u64.
    pub fn column_u64(&self, table: &str, column: &str) -> Vec<u64> {
        let i = self.index(table);
        let t = &self.tables[i];
        let c = t
            .columns
            .iter()
            .find(|c| c.name.as_str() == column)
            .unwrap_or_else(|| panic!("table {table} has no column {column}"));
        assert!(
            matches!(
                c.kind,
                ColumnKind::U8
                    | ColumnKind::U16
                    | ColumnKind::U32
                    | ColumnKind::U64
                    | ColumnKind::BOOL
                    | ColumnKind::LABEL
            ),
            "column {column} is not unsigned"
        );
        let (off, size) = (c.offset as usize, c.size as usize);
        self.batches[i]
            .data
            .chunks_exact(t.record_size as usize)
            .map(|r| {
                let mut b = [0u8; 8];
                b[..size].copy_from_slice(&r[off..off + size]);
                u64::from_le_bytes(b)
            })
            .collect()
    }

    /// Values of a text column (`STR`), up to the first NUL.
    pub fn column_str(&self, table: &str, column: &str) -> Vec<String> {
        let i = self.index(table);
        let t = &self.tables[i];
        let c = t
            .columns
            .iter()
            .find(|c| c.name.as_str() == column && c.kind == ColumnKind::STR)
            .unwrap_or_else(|| panic!("table {table} has no text column {column}"));
        let (off, size) = (c.offset as usize, c.size as usize);
        self.batches[i]
            .data
            .chunks_exact(t.record_size as usize)
            .map(|r| {
                let s = &r[off..off + size];
                let end = s.iter().position(|&b| b == 0).unwrap_or(size);
                String::from_utf8_lossy(&s[..end]).into_owned()
            })
            .collect()
    }

    /// Panics unless every row's `ts_uptime_us` in `table` is CLOCK_BOOTTIME
    /// microseconds from the last minute.
    pub fn assert_recent_timestamps(&self, table: &str) {
        let now = uptime_us();
        for ts in self.column_u64(table, TIMESTAMP_COLUMN) {
            assert!(
                ts <= now + 1_000_000 && ts + 60_000_000 >= now,
                "{table}: ts_uptime_us {ts} is not CLOCK_BOOTTIME in us (uptime {now} us)"
            );
        }
    }
}

/// Starts the probe as the host would, drains for up to two seconds while
/// making some activity (processes, files, sleeps), stops it and checks the
/// batches: whole records, none malformed, recent timestamps. Returns the
/// rows per table.
pub fn load_attach_drain<P: ProbeImpl>() -> Vec<(String, u64)> {
    let mut run = Running::<P>::start("{}");
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        // Some activity most probes see: a process, a file, a few switches.
        let _ = std::process::Command::new("true").status();
        let _ = std::fs::read_to_string("/proc/self/status");
        run.drain_once(Duration::from_millis(100));
    }
    run.stop();
    for t in &run.tables {
        if t.columns
            .iter()
            .any(|c| c.name.as_str() == TIMESTAMP_COLUMN)
        {
            run.assert_recent_timestamps(t.name.as_str());
        }
    }
    run.tables
        .iter()
        .map(|t| (t.name.to_string(), run.rows(t.name.as_str())))
        .collect()
}

/// The tests every probe crate shares: `probe_tests!(ProbeType);` in a
/// test file, or `probe_tests!(ProbeType, rows_in = "table")` to also
/// require rows in that table after two seconds of ordinary activity.
#[macro_export]
macro_rules! probe_tests {
    ($probe:ty $(, rows_in = $table:expr)? $(,)?) => {
        #[test]
        fn declaration_meets_the_spec() {
            $crate::check_declaration::<$probe>();
        }

        #[test]
        fn settings_defaults_parse_back() {
            $crate::check_settings_defaults::<
                <$probe as $crate::__private::ProbeImpl>::Settings,
            >(<$probe as $crate::__private::ProbeImpl>::NAME);
        }

        #[test]
        fn root_loads_attaches_and_drains() {
            if !$crate::require_root("root_loads_attaches_and_drains") {
                return;
            }
            let rows = $crate::load_attach_drain::<$probe>();
            $(
                let table: &str = $table;
                let n = rows
                    .iter()
                    .find(|(t, _)| t == table)
                    .map(|(_, n)| *n)
                    .unwrap_or_else(|| panic!("no table {table} in {rows:?}"));
                assert!(n > 0, "no rows in {table} after two seconds: {rows:?}");
            )?
            let _ = rows;
        }
    };
}

/// Not public API: used by [`probe_tests!`].
#[doc(hidden)]
pub mod __private {
    pub use kernmlops_plugin_sdk::ProbeImpl;
}
