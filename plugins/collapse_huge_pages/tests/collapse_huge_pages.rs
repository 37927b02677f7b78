//! Tests of the collapse_huge_pages probe: the tests every probe crate
//! shares (declaration, settings, and as root a real load-attach-drain;
//! collapses are rare on an idle machine, so tests/tests/collapse_huge_pages.rs
//! makes one happen), and its record layout.

use std::mem::size_of;

use collapse_huge_pages::{CollapseEvent, CollapseHugePages, ScanEvent};
use kernmlops_plugin_bpf::{BpfProbe, BpfSpec};

kernmlops_plugin_testing::probe_tests!(BpfProbe<CollapseHugePages>);

#[test]
fn record_sizes_are_the_generated_event_structs() {
    let tables = CollapseHugePages::tables();
    assert_eq!(
        tables.len(),
        CollapseHugePages::RINGS.len(),
        "one ring per table"
    );
    assert_eq!(tables[0].record_size as usize, size_of::<CollapseEvent>());
    assert_eq!(tables[1].record_size as usize, size_of::<ScanEvent>());
}
