//! Tests of the mm_rss_stat probe: its declaration against the specification
//! the host enforces at load (no root needed), and, as root, that it loads,
//! attaches and collects rows on the running kernel.

use std::{mem::size_of, time::Duration};

use kernmlops_plugin_sdk::{
    bpf::{BpfProbe, BpfSpec},
    testing::{self, Running},
};
use mm_rss_stat::{MmRssStat, MmRssStatEvent};

#[test]
fn declaration_meets_the_spec() {
    testing::check_declaration::<BpfProbe<MmRssStat>>();
    assert_eq!(
        MmRssStat::decl().tables.len(),
        MmRssStat::RINGS.len(),
        "one ring buffer per table"
    );
}

#[test]
fn record_size_is_the_generated_event_struct() {
    let decl = MmRssStat::decl();
    let table = decl
        .tables
        .iter()
        .find(|t| t.name.as_str() == "mm_rss_stat")
        .expect("a table named mm_rss_stat");
    assert_eq!(
        table.record_size as usize,
        size_of::<MmRssStatEvent>(),
        "record_size must be size_of the skeleton's mm_rss_stat_event"
    );
}

#[test]
fn root_loads_attaches_and_collects_rows() {
    if !testing::require_root("root_loads_attaches_and_collects_rows") {
        return;
    }
    let mut run = Running::<BpfProbe<MmRssStat>>::start("{}");
    let got = run.drain_until(Duration::from_secs(5), |r| r.rows("mm_rss_stat") > 0);
    run.stop();
    assert!(got, "no mm_rss_stat rows within 5 s");
    run.assert_recent_timestamps("mm_rss_stat");
}
