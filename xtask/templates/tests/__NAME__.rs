//! Tests of the __NAME__ probe: its declaration against the specification
//! the host enforces at load (no root needed), and, as root, that it loads,
//! attaches and collects rows on the running kernel.

use std::{mem::size_of, time::Duration};

use __NAME__::{__Name__, __Name__Event};
use kernmlops_plugin_sdk::{
    bpf::{BpfProbe, BpfSpec},
    testing::{self, Running},
};

#[test]
fn declaration_meets_the_spec() {
    testing::check_declaration::<BpfProbe<__Name__>>();
    assert_eq!(__Name__::decl().tables.len(), __Name__::RINGS.len(), "one ring buffer per table");
}

#[test]
fn record_size_is_the_generated_event_struct() {
    let decl = __Name__::decl();
    let table = decl.tables.iter().find(|t| t.name.as_str() == "__NAME__").expect("a table named __NAME__");
    assert_eq!(
        table.record_size as usize,
        size_of::<__Name__Event>(),
        "record_size must be size_of the skeleton's __NAME___event"
    );
}

#[test]
fn root_loads_attaches_and_collects_rows() {
    if !testing::require_root("root_loads_attaches_and_collects_rows") {
        return;
    }
    let mut run = Running::<BpfProbe<__Name__>>::start("{}");
    let got = run.drain_until(Duration::from_secs(5), |r| r.rows("__NAME__") > 0);
    run.stop();
    assert!(got, "no __NAME__ rows within 5 s");
    run.assert_recent_timestamps("__NAME__");
}
