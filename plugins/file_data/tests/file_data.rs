//! Tests of the file_data probe: its declaration against the rules the host
//! checks at load (no root needed), and, as root, that it loads, attaches and
//! collects rows.

use std::{
    collections::HashSet,
    mem::size_of,
    time::{Duration, Instant},
};

use file_data::{FileData, FileDataEvent, TracepointPath};
use kernmlops_plugin_sdk::{
    api::TIMESTAMP_COLUMN, bpf::BpfSpec, Batch, ColumnKind, ProbeImpl, StartArgs, TableDecl,
};

fn table() -> TableDecl {
    let decl = FileData::decl();
    assert_eq!(decl.name.as_str(), FileData::NAME, "probe name");
    assert_eq!(
        decl.tables.len(),
        TracepointPath::RINGS.len(),
        "one ring buffer per table"
    );
    decl.tables
        .iter()
        .find(|t| t.name.as_str() == "file_data")
        .cloned()
        .expect("a table named file_data")
}

fn is_snake_case(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
        && !name.ends_with('_')
        && !name.contains("__")
}

#[test]
fn record_size_is_the_generated_event_struct() {
    assert_eq!(
        table().record_size as usize,
        size_of::<FileDataEvent>(),
        "record_size must be size_of the skeleton's file_data_event"
    );
}

#[test]
fn has_a_u64_timestamp_column() {
    let t = table();
    let ts = t
        .columns
        .iter()
        .find(|c| c.name.as_str() == TIMESTAMP_COLUMN)
        .expect("a ts_uptime_us column");
    assert_eq!(ts.kind, ColumnKind::U64, "ts_uptime_us must be u64");
    assert_eq!(ts.unit.as_str(), "us", "ts_uptime_us is in microseconds");
}

#[test]
fn columns_follow_the_declaration_rules() {
    for t in FileData::decl().tables.iter() {
        assert!(
            is_snake_case(&t.name),
            "table name {} not snake_case",
            t.name
        );
        assert!(!t.columns.is_empty(), "table {} has no columns", t.name);
        let mut names = HashSet::new();
        let mut spans = Vec::new();
        for c in t.columns.iter() {
            let what = format!("table {} column {}", t.name, c.name);
            assert!(is_snake_case(&c.name), "{what}: not snake_case");
            assert!(names.insert(c.name.as_str()), "{what}: declared twice");
            assert!(c.kind.name().is_some(), "{what}: unknown type");
            if let Some(size) = c.kind.fixed_size() {
                assert_eq!(c.size, size, "{what}: size does not match its type");
            }
            assert!(
                c.offset + c.size <= t.record_size,
                "{what}: outside the {}-byte record",
                t.record_size
            );
            spans.push((c.offset, c.offset + c.size, c.name.as_str()));
        }
        spans.sort_unstable();
        for pair in spans.windows(2) {
            assert!(
                pair[1].0 >= pair[0].1,
                "table {}: columns {} and {} overlap",
                t.name,
                pair[0].2,
                pair[1].2
            );
        }
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// CLOCK_BOOTTIME now, in microseconds (`/proc/uptime` counts from boot,
/// suspend included, like `bpf_ktime_get_boot_ns`).
fn uptime_us() -> u64 {
    let uptime = std::fs::read_to_string("/proc/uptime").expect("reading /proc/uptime");
    let secs: f64 = uptime
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .expect("parsing /proc/uptime");
    (secs * 1e6) as u64
}

#[test]
fn root_loads_attaches_and_collects_rows() {
    if !is_root() {
        // In CI a skipped root test is a failure.
        assert!(
            std::env::var_os("CI").is_none(),
            "root_loads_attaches_and_collects_rows needs root, and CI must run it"
        );
        eprintln!("skipped root_loads_attaches_and_collects_rows: loading BPF needs root");
        return;
    }
    let args = StartArgs {
        config_json: "{}".into(),
        ring_bytes: 4 << 20,
        filter_tgid: 0,
        filter_pid: 0,
        filter_cgroup_id: 0,
        self_tgid: std::process::id(),
    };
    let mut probe = FileData::start(&args).unwrap_or_else(|e| panic!("{e}"));
    let decl = FileData::decl();
    let index = decl
        .tables
        .iter()
        .position(|t| t.name.as_str() == "file_data")
        .expect("a table named file_data");
    let mut batches: Vec<Batch> = decl.tables.iter().map(|_| Batch::default()).collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while batches[index].records == 0 && Instant::now() < deadline {
        probe
            .drain(Duration::from_millis(100), &mut batches)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    probe.stop().unwrap_or_else(|e| panic!("{e}"));

    let t = &decl.tables[index];
    let batch = &batches[index];
    assert!(batch.records > 0, "no file_data rows within 5 s");
    assert_eq!(
        batch.data.len() as u64,
        batch.records * u64::from(t.record_size),
        "batch holds whole records"
    );
    let ts = t
        .columns
        .iter()
        .find(|c| c.name.as_str() == TIMESTAMP_COLUMN)
        .expect("a ts_uptime_us column");
    let at = ts.offset as usize;
    let first = u64::from_le_bytes(batch.data[at..at + 8].try_into().expect("8 bytes"));
    let now = uptime_us();
    assert!(
        first <= now + 1_000_000 && first + 60_000_000 >= now,
        "first ts_uptime_us {first} is not CLOCK_BOOTTIME in us (uptime {now} us)"
    );
}
