//! The two tables the host writes for power, declared like a probe's, with
//! the SDK's `table!` over a record struct (so the same decoder and sink
//! write them):
//! `energy` (one row per source, zone and slot) and `energy_attribution`
//! (one row per slot, scope and process that ran, plus the idle row).

use kernmlops_plugin_api::{PowerScope, TableDecl};
use kernmlops_plugin_sdk::{
    record::{bytes_of, Record},
    table,
};

pub const ENERGY: &str = "energy";
pub const ATTRIBUTION: &str = "energy_attribution";

/// Bytes of the text columns (the last byte stays NUL only when shorter).
pub const SOURCE_LEN: usize = 32;
pub const ZONE_LEN: usize = 48;
pub const COMM_LEN: usize = 16;
pub const CGROUP_LEN: usize = 128;

/// Labels of `model`: how a process's share is decided.
pub const MODELS: &[&str] = &["cpu_time", "instructions"];
pub const MODEL_CPU_TIME: u32 = 0;

/// Labels of `scope`, index = `PowerScope` value - 1.
pub fn scope_labels() -> Vec<&'static str> {
    PowerScope::KNOWN.iter().filter_map(|s| s.name()).collect()
}

/// The `scope` label index of a known scope.
pub fn scope_index(scope: PowerScope) -> u32 {
    PowerScope::KNOWN
        .iter()
        .position(|s| *s == scope)
        .map_or(0, |i| i as u32)
}

/// The bytes of `v` cut to `N` at a character boundary, NUL-padded.
fn text<const N: usize>(v: &str) -> [u8; N] {
    let mut end = v.len().min(N);
    while !v.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = [0u8; N];
    out[..end].copy_from_slice(&v.as_bytes()[..end]);
    out
}

/// A record of the `energy` table.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EnergyRecord {
    pub ts_uptime_us: u64,
    pub slot_start_us: u64,
    pub energy_uj: u64,
    pub power_uw: u64,
    pub scope: u32,
    pub socket: i32,
    pub source: [u8; SOURCE_LEN],
    pub zone: [u8; ZONE_LEN],
    pub measured: u8,
    pub _pad: [u8; 7],
}

// SAFETY: repr(C) of integers and byte arrays, padded explicitly to its
// alignment (its size is checked below); every bit pattern is valid.
unsafe impl Record for EnergyRecord {}
const _: () = assert!(std::mem::size_of::<EnergyRecord>() == 128);

/// A record of the `energy_attribution` table.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AttributionRecord {
    pub ts_uptime_us: u64,
    pub slot_start_us: u64,
    pub cgroup_id: u64,
    pub cpu_time_us: u64,
    pub share: f64,
    pub energy_uj: u64,
    pub tgid: u32,
    pub scope: u32,
    pub model: u32,
    pub comm: [u8; COMM_LEN],
    pub cgroup: [u8; CGROUP_LEN],
    pub source: [u8; SOURCE_LEN],
    pub measured: u8,
    pub _pad: [u8; 3],
}

// SAFETY: as for `EnergyRecord`.
unsafe impl Record for AttributionRecord {}
const _: () = assert!(std::mem::size_of::<AttributionRecord>() == 240);

/// The `energy` table.
pub fn energy_table() -> TableDecl {
    table!(EnergyRecord => ENERGY,
        "Energy per power source, zone and time slot, on the slots of [power] interval", {
        ts_uptime_us [us]: "end of the slot (CLOCK_BOOTTIME)",
        slot_start_us [us]: "start of the slot (CLOCK_BOOTTIME)",
        source: "the power source (plugin component)",
        zone: "the source's zone, e.g. package-0, dram-0, cpu",
        scope as label(&scope_labels()): "what the zone covers",
        socket: "CPU socket of the zone; -1 for several sockets or none",
        energy_uj [uJ]: "energy in the slot, corrected for counter wrap-around",
        power_uw [uW]: "mean power over the slot",
        measured as bool: "true when a meter measured it; false for a modelled estimate",
    })
}

/// The `energy_attribution` table.
pub fn attribution_table() -> TableDecl {
    table!(AttributionRecord => ATTRIBUTION,
        "Energy per time slot, scope and process that ran, split by on-CPU time; tgid 0 (idle) holds the rest", {
        ts_uptime_us [us]: "end of the slot (CLOCK_BOOTTIME)",
        slot_start_us [us]: "start of the slot (CLOCK_BOOTTIME)",
        tgid: "process id; 0 for idle, the energy no process used",
        comm: "the process's name; idle for tgid 0",
        cgroup_id: "cgroup v2 id of the process, 0 when unknown",
        cgroup: "cgroup v2 path of the process",
        cpu_time_us [us]: "on-CPU time in the slot; for idle, the CPUs' idle time",
        share: "energy_uj over the scope's energy in the slot",
        energy_uj [uJ]: "energy attributed; per slot and scope the rows add up to the scope's energy exactly",
        scope as label(&scope_labels()): "the scope whose energy is split",
        model as label(MODELS): "what the split follows: cpu_time (on-CPU time)",
        source: "the power source whose energy is split",
        measured as bool: "true when the split energy was measured; false when modelled",
    })
}

/// One `energy` row.
#[derive(Debug, Clone, PartialEq)]
pub struct EnergyRow<'a> {
    pub end_us: u64,
    pub start_us: u64,
    pub source: &'a str,
    pub zone: &'a str,
    pub scope: PowerScope,
    pub socket: i32,
    pub energy_uj: u64,
    pub measured: bool,
}

impl EnergyRow<'_> {
    pub fn write(&self, buf: &mut Vec<u8>) {
        let span = self.end_us.saturating_sub(self.start_us).max(1);
        let power_uw = u128::from(self.energy_uj) * 1_000_000 / u128::from(span);
        let record = EnergyRecord {
            ts_uptime_us: self.end_us,
            slot_start_us: self.start_us,
            energy_uj: self.energy_uj,
            power_uw: u64::try_from(power_uw).unwrap_or(u64::MAX),
            scope: scope_index(self.scope),
            socket: self.socket,
            source: text(self.source),
            zone: text(self.zone),
            measured: u8::from(self.measured),
            _pad: [0; 7],
        };
        buf.extend_from_slice(bytes_of(&record));
    }
}

/// One `energy_attribution` row.
#[derive(Debug, Clone, PartialEq)]
pub struct AttributionRow<'a> {
    pub end_us: u64,
    pub start_us: u64,
    pub tgid: u32,
    pub comm: &'a str,
    pub cgroup_id: u64,
    pub cgroup: &'a str,
    pub cpu_time_us: u64,
    pub energy_uj: u64,
    /// The scope's energy in the slot, for `share`.
    pub scope_energy_uj: u64,
    pub scope: PowerScope,
    pub source: &'a str,
    pub measured: bool,
}

impl AttributionRow<'_> {
    pub fn write(&self, buf: &mut Vec<u8>) {
        let share = if self.scope_energy_uj == 0 {
            0.0
        } else {
            self.energy_uj as f64 / self.scope_energy_uj as f64
        };
        let record = AttributionRecord {
            ts_uptime_us: self.end_us,
            slot_start_us: self.start_us,
            cgroup_id: self.cgroup_id,
            cpu_time_us: self.cpu_time_us,
            share,
            energy_uj: self.energy_uj,
            tgid: self.tgid,
            scope: scope_index(self.scope),
            model: MODEL_CPU_TIME,
            comm: text(self.comm),
            cgroup: text(self.cgroup),
            source: text(self.source),
            measured: u8::from(self.measured),
            _pad: [0; 3],
        };
        buf.extend_from_slice(bytes_of(&record));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::TableDecoder;
    use arrow_array::{cast::AsArray, ArrayRef};

    /// Decodes the one row `buf` holds of `table`, checking that it fills a
    /// record exactly; the columns by name.
    fn one_row(table: TableDecl, buf: &[u8]) -> impl Fn(&str) -> ArrayRef {
        assert_eq!(buf.len(), table.record_size as usize);
        let batch = TableDecoder::new(&table, "c").decode(buf).expect("decodes");
        move |n| batch.column_by_name(n).expect(n).clone()
    }

    #[test]
    fn tables_meet_the_spec_and_rows_fill_them_exactly() {
        for t in [energy_table(), attribution_table()] {
            kernmlops_plugin_api::spec::validate_host_table(&t)
                .unwrap_or_else(|e| panic!("table {}: {e}", t.name));
        }
        let mut buf = Vec::new();
        EnergyRow {
            end_us: 2_000_000,
            start_us: 1_000_000,
            source: "rapl",
            zone: "package-0",
            scope: PowerScope::PACKAGE,
            socket: 0,
            energy_uj: 5_000_000,
            measured: true,
        }
        .write(&mut buf);
        let col = one_row(energy_table(), &buf);
        assert_eq!(col("zone").as_string::<i32>().value(0), "package-0");
        assert_eq!(col("scope").as_string::<i32>().value(0), "package");
        assert_eq!(
            col("power_uw")
                .as_primitive::<arrow_array::types::UInt64Type>()
                .value(0),
            5_000_000
        );
        assert!(col("measured").as_boolean().value(0));

        let mut buf = Vec::new();
        AttributionRow {
            end_us: 2,
            start_us: 1,
            tgid: 42,
            comm: "stress-ng-cpu-with-a-long-name",
            cgroup_id: 7,
            cgroup: "/user.slice",
            cpu_time_us: 10,
            energy_uj: 25,
            scope_energy_uj: 100,
            scope: PowerScope::DRAM,
            source: "estimate",
            measured: false,
        }
        .write(&mut buf);
        let col = one_row(attribution_table(), &buf);
        assert_eq!(col("comm").as_string::<i32>().value(0), "stress-ng-cpu-wi");
        assert_eq!(col("scope").as_string::<i32>().value(0), "dram");
        assert_eq!(col("model").as_string::<i32>().value(0), "cpu_time");
        assert_eq!(
            col("share")
                .as_primitive::<arrow_array::types::Float64Type>()
                .value(0),
            0.25
        );
        assert!(!col("measured").as_boolean().value(0));
    }
}
