//! Tests of the collapse_huge_pages probe: its declaration against the specification
//! the host enforces at load (no root needed), and, as root, that it loads,
//! attaches and collects rows on the running kernel.

use std::{mem::size_of, time::Duration};

use collapse_huge_pages::{CollapseEvent, CollapseHugePages};
use kernmlops_plugin_sdk::{
    bpf::{BpfProbe, BpfSpec},
    testing::{self, Running},
};

#[test]
fn declaration_meets_the_spec() {
    testing::check_declaration::<BpfProbe<CollapseHugePages>>();
    assert_eq!(
        CollapseHugePages::decl().tables.len(),
        CollapseHugePages::RINGS.len(),
        "one ring buffer per table"
    );
}

#[test]
fn record_size_is_the_generated_event_struct() {
    let decl = CollapseHugePages::decl();
    let table = decl
        .tables
        .iter()
        .find(|t| t.name.as_str() == "collapse_huge_page")
        .expect("a table named collapse_huge_pages");
    assert_eq!(
        table.record_size as usize,
        size_of::<CollapseEvent>(),
        "record_size must be size_of the skeleton's collapse_huge_page_event"
    );
}

#[test]
fn root_loads_attaches_and_drains() {
    if !testing::require_root("root_loads_attaches_and_drains") {
        return;
    }
    // Collapses are rare on an idle machine: this checks loading, attaching
    // and draining; tests/tests/collapse_huge_pages.rs makes one happen.
    let mut run = Running::<BpfProbe<CollapseHugePages>>::start("{}");
    run.drain_until(Duration::from_millis(200), |_| false);
    run.stop();
    run.assert_recent_timestamps("collapse_huge_page");
}
