//! The probe's eight tables: their record types and declarations. Long
//! tables (one row per counter per sample) share the shape `ts_uptime_us`,
//! `key`, optional `cpu`, `value`, `delta`; wide tables (one row per sample,
//! per resource, CPU, device or interface) have one column per field and,
//! for each counter, a `<column>_delta`.

use std::mem::offset_of;

use kernmlops_plugin_sdk::{
    api::TIMESTAMP_COLUMN, table, table::TableBuilder, ColumnKind, Record, TableDecl,
};

use crate::parse::{DISK_FIELDS, NET_FIELDS};

/// Bytes of a long table's `key` (text up to its first NUL; a longer key
/// is cut).
pub const KEY_BYTES: usize = 52;
/// Bytes of `procfs_vmstat`'s `key`.
pub const VMSTAT_KEY_BYTES: usize = 56;
/// `DISK_NAME_LEN` of the kernel.
pub const DEVICE_BYTES: usize = 32;
/// `IFNAMSIZ` of the kernel.
pub const INTERFACE_BYTES: usize = 16;

pub const PRESSURE: &str = "procfs_pressure";
pub const VMSTAT: &str = "procfs_vmstat";
pub const CPUFREQ: &str = "procfs_cpufreq";
pub const INTERRUPTS: &str = "procfs_interrupts";
pub const SOFTIRQS: &str = "procfs_softirqs";
pub const DISKSTATS: &str = "procfs_diskstats";
pub const NET_DEV: &str = "procfs_net_dev";
pub const CGROUP: &str = "procfs_cgroup";

/// The tables in `drain`'s batch order; `T_*` index it.
pub const TABLES: [&str; 8] = [
    PRESSURE, VMSTAT, CPUFREQ, INTERRUPTS, SOFTIRQS, DISKSTATS, NET_DEV, CGROUP,
];
pub const T_PRESSURE: usize = 0;
pub const T_VMSTAT: usize = 1;
pub const T_CPUFREQ: usize = 2;
pub const T_INTERRUPTS: usize = 3;
pub const T_SOFTIRQS: usize = 4;
pub const T_DISKSTATS: usize = 5;
pub const T_NET_DEV: usize = 6;
pub const T_CGROUP: usize = 7;

/// `resource` labels, the files under `/proc/pressure/`.
pub const RESOURCES: &[&str] = &["cpu", "memory", "io"];
/// `file` labels of `procfs_cgroup`.
pub const CGROUP_FILES: &[&str] = &[
    "cpu.stat",
    "memory.stat",
    "io.stat",
    "cpu.pressure",
    "memory.pressure",
    "io.pressure",
];

/// `/proc/diskstats` fields: column, unit, whether it is a counter (the
/// in-flight count is not), meaning.
pub const DISK_COLUMNS: [(&str, &str, bool, &str); DISK_FIELDS] = [
    ("reads_completed", "count", true, "reads completed"),
    ("reads_merged", "count", true, "adjacent reads merged"),
    ("sectors_read", "sectors", true, "512-byte sectors read"),
    ("read_time_ms", "ms", true, "time spent reading"),
    ("writes_completed", "count", true, "writes completed"),
    ("writes_merged", "count", true, "adjacent writes merged"),
    (
        "sectors_written",
        "sectors",
        true,
        "512-byte sectors written",
    ),
    ("write_time_ms", "ms", true, "time spent writing"),
    (
        "in_flight",
        "count",
        false,
        "I/Os in progress (a gauge: no delta)",
    ),
    (
        "io_time_ms",
        "ms",
        true,
        "time the device had I/O in progress",
    ),
    (
        "weighted_io_time_ms",
        "ms",
        true,
        "I/O time weighted by I/Os in progress",
    ),
    (
        "discards_completed",
        "count",
        true,
        "discards completed (Linux 4.18+, else 0)",
    ),
    (
        "discards_merged",
        "count",
        true,
        "discards merged (Linux 4.18+, else 0)",
    ),
    (
        "sectors_discarded",
        "sectors",
        true,
        "512-byte sectors discarded (Linux 4.18+, else 0)",
    ),
    (
        "discard_time_ms",
        "ms",
        true,
        "time spent discarding (Linux 4.18+, else 0)",
    ),
    (
        "flushes_completed",
        "count",
        true,
        "flush requests completed (Linux 5.5+, else 0)",
    ),
    (
        "flush_time_ms",
        "ms",
        true,
        "time spent flushing (Linux 5.5+, else 0)",
    ),
];

/// `/proc/net/dev` counters: column, unit.
pub const NET_COLUMNS: [(&str, &str); NET_FIELDS] = [
    ("rx_bytes", "bytes"),
    ("rx_packets", "count"),
    ("rx_errs", "count"),
    ("rx_drop", "count"),
    ("rx_fifo", "count"),
    ("rx_frame", "count"),
    ("rx_compressed", "count"),
    ("rx_multicast", "count"),
    ("tx_bytes", "bytes"),
    ("tx_packets", "count"),
    ("tx_errs", "count"),
    ("tx_drop", "count"),
    ("tx_fifo", "count"),
    ("tx_colls", "count"),
    ("tx_carrier", "count"),
    ("tx_compressed", "count"),
];

const TS_DESC: &str = "when the file was read (CLOCK_BOOTTIME, taken just before the read)";
const DELTA_DESC: &str = "increase of value since the previous sample of the same key (and cpu): 0 in the first sample, and 0 when it went backwards (a counter reset, or a gauge going down)";

/// A row of `procfs_pressure`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PressureRow {
    pub ts_uptime_us: u64,
    pub some_avg10_pct: f64,
    pub some_avg60_pct: f64,
    pub some_avg300_pct: f64,
    pub some_total_us: u64,
    pub some_total_us_delta: u64,
    pub full_avg10_pct: f64,
    pub full_avg60_pct: f64,
    pub full_avg300_pct: f64,
    pub full_total_us: u64,
    pub full_total_us_delta: u64,
    pub resource: u32,
    pub _pad: u32,
}
// SAFETY: repr(C), u64/f64 fields then two u32: no padding, every bit
// pattern valid.
unsafe impl Record for PressureRow {}

/// A row of `procfs_vmstat`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct VmstatRow {
    pub ts_uptime_us: u64,
    pub value: u64,
    pub delta: u64,
    pub key: [u8; VMSTAT_KEY_BYTES],
}
// SAFETY: repr(C), three u64 then 56 bytes: no padding, any bits valid.
unsafe impl Record for VmstatRow {}

/// A row of `procfs_interrupts` and `procfs_softirqs`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CpuCounterRow {
    pub ts_uptime_us: u64,
    pub value: u64,
    pub delta: u64,
    pub cpu: u32,
    pub key: [u8; KEY_BYTES],
}
// SAFETY: repr(C), three u64, a u32 and 52 bytes (80, a multiple of 8):
// no padding, any bits valid.
unsafe impl Record for CpuCounterRow {}

/// A row of `procfs_cgroup`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CgroupRow {
    pub ts_uptime_us: u64,
    pub value: u64,
    pub delta: u64,
    pub file: u32,
    pub key: [u8; KEY_BYTES],
}
// SAFETY: as CpuCounterRow.
unsafe impl Record for CgroupRow {}

/// A row of `procfs_cpufreq`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CpufreqRow {
    pub ts_uptime_us: u64,
    pub khz: u64,
    pub cpu: u32,
    pub _pad: u32,
}
// SAFETY: repr(C), two u64 and two u32: no padding, any bits valid.
unsafe impl Record for CpufreqRow {}

/// A row of `procfs_diskstats`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DiskRow {
    pub ts_uptime_us: u64,
    pub values: [u64; DISK_FIELDS],
    /// Per field; the in-flight gauge's slot stays 0 and is not a column.
    pub deltas: [u64; DISK_FIELDS],
    pub major: u32,
    pub minor: u32,
    pub device: [u8; DEVICE_BYTES],
}
// SAFETY: repr(C), u64s, two u32 and 32 bytes: no padding, any bits valid.
unsafe impl Record for DiskRow {}

/// A row of `procfs_net_dev`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetRow {
    pub ts_uptime_us: u64,
    pub values: [u64; NET_FIELDS],
    pub deltas: [u64; NET_FIELDS],
    pub interface: [u8; INTERFACE_BYTES],
}
// SAFETY: repr(C), u64s and 16 bytes: no padding, any bits valid.
unsafe impl Record for NetRow {}

/// Copies `text` into a fixed text field, cut to its size, the rest zeroed.
pub fn set_text<const N: usize>(field: &mut [u8; N], text: &str) {
    let n = text.len().min(N);
    field[..n].copy_from_slice(&text.as_bytes()[..n]);
    field[n..].fill(0);
}

fn pressure() -> TableDecl {
    table!(PressureRow => PRESSURE,
        "One row per sample per resource of /proc/pressure/{cpu,memory,io} (pressure stall information): the share of time some (or all, full) runnable tasks stalled on the resource, and the total stall time", {
        ts_uptime_us [us]: TS_DESC,
        resource as label(RESOURCES): "the resource: cpu, memory or io",
        some_avg10_pct [percent]: "share of the last 10 s in which at least one task stalled",
        some_avg60_pct [percent]: "same over 60 s",
        some_avg300_pct [percent]: "same over 300 s",
        some_total_us [us]: "total time in which at least one task stalled, since boot",
        some_total_us_delta [us]: "increase of some_total_us since the previous sample (0 in the first)",
        full_avg10_pct [percent]: "share of the last 10 s in which all non-idle tasks stalled (0 where the kernel has no full line: CPU before Linux 5.13)",
        full_avg60_pct [percent]: "same over 60 s",
        full_avg300_pct [percent]: "same over 300 s",
        full_total_us [us]: "total time in which all non-idle tasks stalled, since boot",
        full_total_us_delta [us]: "increase of full_total_us since the previous sample (0 in the first)",
    })
}

fn vmstat() -> TableDecl {
    table!(VmstatRow => VMSTAT,
        "One row per counter per sample of /proc/vmstat: the kernel's virtual-memory event counters (pgfault, pswpin, ...) and page gauges (nr_*)", {
        ts_uptime_us [us]: TS_DESC,
        key: "the /proc/vmstat key (pgfault, nr_free_pages, ...)",
        value [count]: "the raw value: events since boot for counters, pages now for nr_* gauges",
        delta [count]: DELTA_DESC,
    })
}

fn per_cpu(name: &str, description: &str, key: &str) -> TableDecl {
    table!(CpuCounterRow => name, description, {
        ts_uptime_us [us]: TS_DESC,
        key: key,
        cpu: "the CPU; 4294967295 for counters the kernel keeps for the whole system (ERR, MIS)",
        value [count]: "the raw count since boot",
        delta [count]: DELTA_DESC,
    })
}

fn cgroup() -> TableDecl {
    table!(CgroupRow => CGROUP,
        "One row per counter per sample of the benchmark cgroup's cpu.stat, memory.stat, io.stat and {cpu,memory,io}.pressure (the --cgroup filter's cgroup in a run without a benchmark)", {
        ts_uptime_us [us]: TS_DESC,
        file as label(CGROUP_FILES): "the cgroup file",
        key: "the key in the file (usage_usec, anon, pgfault, `<maj:min> rbytes` for io.stat, some_total_us and full_total_us for pressure files)",
        value: "the raw value, in the file's unit (usec, bytes, count, us)",
        delta: DELTA_DESC,
    })
}

fn cpufreq() -> TableDecl {
    table!(CpufreqRow => CPUFREQ,
        "One row per sample per CPU of /sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq (no rows where the machine has no cpufreq)", {
        ts_uptime_us [us]: TS_DESC,
        cpu: "the CPU",
        khz [khz]: "the CPU's current frequency as cpufreq reports it",
    })
}

fn diskstats() -> TableDecl {
    let mut t = TableBuilder::new::<DiskRow>(
        DISKSTATS,
        "One row per sample per block device of /proc/diskstats: the kernel's I/O counters, raw and as increases since the previous sample",
    )
    .column(TIMESTAMP_COLUMN, ColumnKind::U64, 0, 8, "us", TS_DESC)
    .column("major", ColumnKind::U32, offset_of!(DiskRow, major), 4, "", "device major number")
    .column("minor", ColumnKind::U32, offset_of!(DiskRow, minor), 4, "", "device minor number")
    .column(
        "device",
        ColumnKind::STR,
        offset_of!(DiskRow, device),
        DEVICE_BYTES,
        "",
        "device name (sda, nvme0n1, loop0)",
    );
    for (i, (name, unit, _, what)) in DISK_COLUMNS.iter().enumerate() {
        t = t.column(
            name,
            ColumnKind::U64,
            offset_of!(DiskRow, values) + 8 * i,
            8,
            unit,
            what,
        );
    }
    for (i, (name, unit, counter, _)) in DISK_COLUMNS.iter().enumerate() {
        if *counter {
            t = t.column(
                &format!("{name}_delta"),
                ColumnKind::U64,
                offset_of!(DiskRow, deltas) + 8 * i,
                8,
                unit,
                &format!("increase of {name} since the previous sample of the device (0 in the first, and after a reset)"),
            );
        }
    }
    t.build()
}

fn net_dev() -> TableDecl {
    let mut t = TableBuilder::new::<NetRow>(
        NET_DEV,
        "One row per sample per network interface of /proc/net/dev (the collector's network namespace): receive and transmit counters, raw and as increases since the previous sample",
    )
    .column(TIMESTAMP_COLUMN, ColumnKind::U64, 0, 8, "us", TS_DESC)
    .column(
        "interface",
        ColumnKind::STR,
        offset_of!(NetRow, interface),
        INTERFACE_BYTES,
        "",
        "interface name",
    );
    for (i, (name, unit)) in NET_COLUMNS.iter().enumerate() {
        t = t.column(
            name,
            ColumnKind::U64,
            offset_of!(NetRow, values) + 8 * i,
            8,
            unit,
            &format!("{name} since boot (or since the interface appeared)"),
        );
    }
    for (i, (name, unit)) in NET_COLUMNS.iter().enumerate() {
        t = t.column(
            &format!("{name}_delta"),
            ColumnKind::U64,
            offset_of!(NetRow, deltas) + 8 * i,
            8,
            unit,
            &format!("increase of {name} since the previous sample of the interface (0 in the first, and after a reset)"),
        );
    }
    t.build()
}

/// Every table, in [`TABLES`] order.
pub fn all() -> Vec<TableDecl> {
    vec![
        pressure(),
        vmstat(),
        cpufreq(),
        per_cpu(
            INTERRUPTS,
            "One row per counter per sample and CPU of /proc/interrupts: interrupts handled since boot",
            "the interrupt: `<irq>:<action>` for numbered ones (28:virtio0-config), the kernel's name for the others (LOC, NMI, ERR)",
        ),
        per_cpu(
            SOFTIRQS,
            "One row per counter per sample and CPU of /proc/softirqs: softirqs run since boot",
            "the softirq (HI, TIMER, NET_TX, NET_RX, BLOCK, IRQ_POLL, TASKLET, SCHED, HRTIMER, RCU)",
        ),
        diskstats(),
        net_dev(),
        cgroup(),
    ]
}

#[cfg(test)]
mod tests {
    use kernmlops_plugin_sdk::api::spec;

    use super::*;

    #[test]
    fn every_table_meets_the_spec_in_order_with_its_description() {
        let tables = all();
        assert_eq!(tables.len(), TABLES.len());
        for (t, name) in tables.iter().zip(TABLES) {
            assert_eq!(t.name.as_str(), name);
            spec::validate_table(t).unwrap_or_else(|e| panic!("{name}: {e}"));
            let long = t.columns.iter().any(|c| c.name.as_str() == "key");
            let start = if long {
                "One row per counter per sample"
            } else {
                "One row per sample"
            };
            assert!(
                t.description.starts_with(start),
                "{name}: {}",
                t.description
            );
        }
    }

    #[test]
    fn long_tables_have_the_shared_shape() {
        for t in all()
            .iter()
            .filter(|t| t.columns.iter().any(|c| c.name.as_str() == "key"))
        {
            let col = |n: &str| t.columns.iter().find(|c| c.name.as_str() == n);
            for (name, kind) in [
                (TIMESTAMP_COLUMN, ColumnKind::U64),
                ("value", ColumnKind::U64),
                ("delta", ColumnKind::U64),
                ("key", ColumnKind::STR),
            ] {
                let c = col(name).unwrap_or_else(|| panic!("{}: no {name}", t.name));
                assert_eq!(c.kind, kind, "{}.{name}", t.name);
            }
            if let Some(c) = col("cpu") {
                assert_eq!(c.kind, ColumnKind::U32);
            }
            assert!(col("delta").is_some_and(|c| c.description.contains("first sample")));
        }
    }

    #[test]
    fn text_fields_are_cut_and_zeroed() {
        let mut f = [9u8; 4];
        set_text(&mut f, "ab");
        assert_eq!(f, *b"ab\0\0");
        set_text(&mut f, "abcdef");
        assert_eq!(f, *b"abcd");
    }
}
