//! Tests of the collapse_huge_pages probe: its declaration against the rules the host
//! checks at load (no root needed), and, as root, that it loads, attaches and
//! drains.

use std::{collections::HashSet, mem::size_of, time::Duration};

use collapse_huge_pages::{CollapseEvent, CollapseHugePages};
use kernmlops_plugin_sdk::{
    api::TIMESTAMP_COLUMN,
    bpf::{BpfProbe, BpfSpec},
    Batch, ColumnKind, ProbeImpl, StartArgs, TableDecl,
};

fn table() -> TableDecl {
    let decl = CollapseHugePages::decl();
    assert_eq!(decl.name.as_str(), CollapseHugePages::NAME, "probe name");
    assert_eq!(
        decl.tables.len(),
        CollapseHugePages::RINGS.len(),
        "one ring buffer per table"
    );
    decl.tables
        .iter()
        .find(|t| t.name.as_str() == "collapse_huge_page")
        .cloned()
        .expect("a table named collapse_huge_page")
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
        size_of::<CollapseEvent>(),
        "record_size must be size_of the skeleton's collapse_huge_pages_event"
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
    for t in CollapseHugePages::decl().tables.iter() {
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

#[test]
fn root_loads_attaches_and_drains() {
    if !is_root() {
        // In CI a skipped root test is a failure.
        assert!(
            std::env::var_os("CI").is_none(),
            "root_loads_attaches_and_drains needs root, and CI must run it"
        );
        eprintln!("skipped root_loads_attaches_and_drains: loading BPF needs root");
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
    let mut probe = BpfProbe::<CollapseHugePages>::start(&args).unwrap_or_else(|e| panic!("{e}"));
    let decl = CollapseHugePages::decl();
    let index = decl
        .tables
        .iter()
        .position(|t| t.name.as_str() == "collapse_huge_page")
        .expect("a table named collapse_huge_page");
    let mut batches: Vec<Batch> = decl.tables.iter().map(|_| Batch::default()).collect();
    // Collapses are rare on an idle machine: this checks loading, attaching
    // and draining; tests/tests/collapse_huge_pages.rs makes one happen.
    probe
        .drain(Duration::from_millis(200), &mut batches)
        .unwrap_or_else(|e| panic!("{e}"));
    probe.stop().unwrap_or_else(|e| panic!("{e}"));
    let t = &decl.tables[index];
    let batch = &batches[index];
    assert_eq!(
        batch.data.len() as u64,
        batch.records * u64::from(t.record_size),
        "batch holds whole records"
    );
}
