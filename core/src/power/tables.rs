//! The two tables the host writes for power, declared like a probe's (so
//! the same decoder and sink write them) with packed little-endian records:
//! `energy` (one row per source, zone and slot) and `energy_attribution`
//! (one row per slot, scope and process that ran, plus the idle row).

use abi_stable::std_types::RVec;
use kernmlops_plugin_api::{ColumnDecl, ColumnKind, PowerScope, TableDecl};

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

/// A table declared column by column, each packed after the previous one.
struct Builder {
    decl: TableDecl,
    offset: u32,
}

impl Builder {
    fn new(name: &str, description: &str) -> Self {
        Self {
            decl: TableDecl {
                name: name.into(),
                description: description.into(),
                record_size: 0,
                columns: RVec::new(),
            },
            offset: 0,
        }
    }

    fn col(mut self, name: &str, kind: ColumnKind, size: u32, unit: &str, what: &str) -> Self {
        self.decl.columns.push(ColumnDecl {
            name: name.into(),
            kind,
            offset: self.offset,
            size,
            unit: unit.into(),
            description: what.into(),
            labels: RVec::new(),
        });
        self.offset += size;
        self
    }

    fn label(mut self, name: &str, labels: &[&str], what: &str) -> Self {
        self = self.col(name, ColumnKind::LABEL, 4, "", what);
        if let Some(c) = self.decl.columns.last_mut() {
            c.labels = labels.iter().map(|l| (*l).into()).collect();
        }
        self
    }

    fn build(mut self) -> TableDecl {
        self.decl.record_size = self.offset;
        self.decl
    }
}

/// The `energy` table.
pub fn energy_table() -> TableDecl {
    Builder::new(
        ENERGY,
        "Energy per power source, zone and time slot, on the slots of [power] interval",
    )
    .col(
        "ts_uptime_us",
        ColumnKind::U64,
        8,
        "us",
        "end of the slot (CLOCK_BOOTTIME)",
    )
    .col(
        "slot_start_us",
        ColumnKind::U64,
        8,
        "us",
        "start of the slot (CLOCK_BOOTTIME)",
    )
    .col(
        "source",
        ColumnKind::STR,
        SOURCE_LEN as u32,
        "",
        "the power source (plugin component)",
    )
    .col(
        "zone",
        ColumnKind::STR,
        ZONE_LEN as u32,
        "",
        "the source's zone, e.g. package-0, dram-0, cpu",
    )
    .label("scope", &scope_labels(), "what the zone covers")
    .col(
        "socket",
        ColumnKind::I32,
        4,
        "",
        "CPU socket of the zone; -1 for several sockets or none",
    )
    .col(
        "energy_uj",
        ColumnKind::U64,
        8,
        "uJ",
        "energy in the slot, corrected for counter wrap-around",
    )
    .col(
        "power_uw",
        ColumnKind::U64,
        8,
        "uW",
        "mean power over the slot",
    )
    .col(
        "measured",
        ColumnKind::BOOL,
        1,
        "",
        "true when a meter measured it; false for a modelled estimate",
    )
    .build()
}

/// The `energy_attribution` table.
pub fn attribution_table() -> TableDecl {
    Builder::new(
        ATTRIBUTION,
        "Energy per time slot, scope and process that ran, split by on-CPU time; tgid 0 (idle) holds the rest",
    )
    .col("ts_uptime_us", ColumnKind::U64, 8, "us", "end of the slot (CLOCK_BOOTTIME)")
    .col("slot_start_us", ColumnKind::U64, 8, "us", "start of the slot (CLOCK_BOOTTIME)")
    .col("tgid", ColumnKind::U32, 4, "", "process id; 0 for idle, the energy no process used")
    .col("comm", ColumnKind::STR, COMM_LEN as u32, "", "the process's name; idle for tgid 0")
    .col("cgroup_id", ColumnKind::U64, 8, "", "cgroup v2 id of the process, 0 when unknown")
    .col("cgroup", ColumnKind::STR, CGROUP_LEN as u32, "", "cgroup v2 path of the process")
    .col("cpu_time_us", ColumnKind::U64, 8, "us", "on-CPU time in the slot; for idle, the CPUs' idle time")
    .col("share", ColumnKind::F64, 8, "", "energy_uj over the scope's energy in the slot")
    .col("energy_uj", ColumnKind::U64, 8, "uJ", "energy attributed; per slot and scope the rows add up to the scope's energy exactly")
    .label("scope", &scope_labels(), "the scope whose energy is split")
    .label("model", MODELS, "what the split follows: cpu_time (on-CPU time)")
    .col("source", ColumnKind::STR, SOURCE_LEN as u32, "", "the power source whose energy is split")
    .col("measured", ColumnKind::BOOL, 1, "", "true when the split energy was measured; false when modelled")
    .build()
}

/// Appends one packed record, field by field in declaration order.
pub struct Row<'a>(pub &'a mut Vec<u8>);

impl Row<'_> {
    pub fn u64(self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u32(self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn i32(self, v: i32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn f64(self, v: f64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn bool(self, v: bool) -> Self {
        self.0.push(u8::from(v));
        self
    }

    /// Text cut to `len` bytes at a character boundary, NUL-padded.
    pub fn text(self, v: &str, len: usize) -> Self {
        let mut end = v.len().min(len);
        while !v.is_char_boundary(end) {
            end -= 1;
        }
        self.0.extend_from_slice(&v.as_bytes()[..end]);
        self.0.extend(std::iter::repeat_n(0u8, len - end));
        self
    }
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
        Row(buf)
            .u64(self.end_us)
            .u64(self.start_us)
            .text(self.source, SOURCE_LEN)
            .text(self.zone, ZONE_LEN)
            .u32(scope_index(self.scope))
            .i32(self.socket)
            .u64(self.energy_uj)
            .u64(u64::try_from(power_uw).unwrap_or(u64::MAX))
            .bool(self.measured);
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
        Row(buf)
            .u64(self.end_us)
            .u64(self.start_us)
            .u32(self.tgid)
            .text(self.comm, COMM_LEN)
            .u64(self.cgroup_id)
            .text(self.cgroup, CGROUP_LEN)
            .u64(self.cpu_time_us)
            .f64(share)
            .u64(self.energy_uj)
            .u32(scope_index(self.scope))
            .u32(MODEL_CPU_TIME)
            .text(self.source, SOURCE_LEN)
            .bool(self.measured);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::TableDecoder;
    use arrow_array::cast::AsArray;

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
        assert_eq!(buf.len(), energy_table().record_size as usize);
        let batch = TableDecoder::new(&energy_table(), "c")
            .decode(&buf)
            .expect("decodes");
        let col = |n: &str| batch.column_by_name(n).expect(n).clone();
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
        assert_eq!(buf.len(), attribution_table().record_size as usize);
        let batch = TableDecoder::new(&attribution_table(), "c")
            .decode(&buf)
            .expect("decodes");
        let col = |n: &str| batch.column_by_name(n).expect(n).clone();
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
