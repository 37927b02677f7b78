//! Test helpers for plugin crates: check a probe's declaration against the
//! specification the host enforces at load (`kernmlops_plugin_api::spec`),
//! and run the probe for real on the running kernel, the way the host does.
//!
//! ```ignore
//! #[test]
//! fn declaration_meets_the_spec() {
//!     testing::check_declaration::<BpfProbe<MyProbe>>();
//! }
//!
//! #[test]
//! fn root_collects_rows() {
//!     if !testing::require_root("root_collects_rows") {
//!         return;
//!     }
//!     let mut run = testing::Running::<BpfProbe<MyProbe>>::start("{}");
//!     assert!(run.drain_until(Duration::from_secs(5), |r| r.rows("my_table") > 0));
//! }
//! ```

use std::time::{Duration, Instant};

use kernmlops_plugin_api::{spec, ColumnKind, TIMESTAMP_COLUMN};

use crate::{Batch, BenchmarkImpl, ProbeImpl, StartArgs, TableDecl};

/// Panics, naming the rule, unless `P`'s declaration would load in the host:
/// the probe's name matches `P::NAME`, and every table passes the spec.
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

/// Panics unless `P::CONFIG_DEFAULTS` parses as TOML into settings equal to
/// `C::default()`: the defaults users see (`kernmlops config defaults`) are
/// the ones the probe uses.
pub fn check_config_defaults<P, C>()
where
    P: ProbeImpl,
    C: serde::de::DeserializeOwned + Default + PartialEq + std::fmt::Debug,
{
    check_defaults_text::<C>(P::NAME, P::CONFIG_DEFAULTS);
}

/// [`check_config_defaults`] for a benchmark.
pub fn check_benchmark_config_defaults<B, C>()
where
    B: BenchmarkImpl,
    C: serde::de::DeserializeOwned + Default + PartialEq + std::fmt::Debug,
{
    check_defaults_text::<C>(B::NAME, B::CONFIG_DEFAULTS);
}

fn check_defaults_text<C>(name: &str, text: &str)
where
    C: serde::de::DeserializeOwned + Default + PartialEq + std::fmt::Debug,
{
    let table: toml::Table =
        toml::from_str(text).unwrap_or_else(|e| panic!("{name}: CONFIG_DEFAULTS is not TOML: {e}"));
    let json = serde_json::to_value(&table).unwrap_or_else(|e| panic!("{name}: {e}"));
    let parsed: C = serde_json::from_value(json)
        .unwrap_or_else(|e| panic!("{name}: CONFIG_DEFAULTS does not fit the settings: {e}"));
    assert_eq!(
        parsed,
        C::default(),
        "{name}: CONFIG_DEFAULTS differs from the settings' Default"
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

/// Start arguments as the host passes them, with the probe's settings as a
/// JSON object and no filter.
pub fn start_args(config_json: &str) -> StartArgs {
    StartArgs {
        config_json: config_json.into(),
        ring_bytes: 4 << 20,
        filter_tgid: 0,
        filter_pid: 0,
        filter_cgroup_id: 0,
        self_tgid: std::process::id(),
        include_self: false,
        filter_cgroup_descendants: false,
        output_dir: "".into(),
        state_dir: "".into(),
    }
}

/// CLOCK_BOOTTIME now, in microseconds: the clock of `ts_uptime_us`.
pub fn uptime_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
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
        let probe = P::start(args).unwrap_or_else(|e| panic!("starting {}: {e}", P::NAME));
        let tables = probe.tables();
        for t in &tables {
            if let Err(e) = spec::validate_table(t) {
                panic!("{}: run-time table refused: {e}", P::NAME);
            }
        }
        let batches = tables.iter().map(|_| Batch::default()).collect();
        Self {
            probe,
            tables,
            batches,
        }
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
            self.probe
                .drain(Duration::from_millis(100), &mut self.batches)
                .unwrap_or_else(|e| panic!("draining {}: {e}", P::NAME));
            for (t, b) in self.tables.iter().zip(&self.batches) {
                assert_eq!(
                    b.data.len() as u64,
                    b.records * u64::from(t.record_size),
                    "table {}: a batch must hold whole records",
                    t.name
                );
            }
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
