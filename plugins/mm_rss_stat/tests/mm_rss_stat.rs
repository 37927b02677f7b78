//! Tests of the mm_rss_stat probe: the tests every probe crate shares (its
//! declaration against the host's spec, its settings, and as root a real
//! load-attach-drain), and its record layout.

use std::mem::size_of;

use kernmlops_plugin_bpf::{BpfProbe, BpfSpec};
use mm_rss_stat::{MmRssStat, MmRssStatEvent};

kernmlops_plugin_testing::probe_tests!(BpfProbe<MmRssStat>, rows_in = "mm_rss_stat");

#[test]
fn record_size_is_the_generated_event_struct() {
    let tables = MmRssStat::tables();
    assert_eq!(tables.len(), MmRssStat::RINGS.len(), "one ring per table");
    assert_eq!(
        tables[0].record_size as usize,
        size_of::<MmRssStatEvent>(),
        "record_size must be size_of the skeleton's mm_rss_stat_event"
    );
}
