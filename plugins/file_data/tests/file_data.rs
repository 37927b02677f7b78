//! Tests of the file_data probe: its declaration against the specification
//! the host enforces at load (no root needed), and, as root, that it loads,
//! attaches and collects rows on the running kernel.

use std::{mem::size_of, time::Duration};

use file_data::{FileData, FileDataEvent, TracepointPath};
use kernmlops_plugin_sdk::{
    bpf::BpfSpec,
    testing::{self, Running},
    ProbeImpl,
};

#[test]
fn declaration_meets_the_spec() {
    testing::check_declaration::<FileData>();
    assert_eq!(
        FileData::decl().tables.len(),
        TracepointPath::RINGS.len(),
        "one ring buffer per table"
    );
}

#[test]
fn record_size_is_the_generated_event_struct() {
    let decl = FileData::decl();
    let table = decl
        .tables
        .iter()
        .find(|t| t.name.as_str() == "file_data")
        .expect("a table named file_data");
    assert_eq!(
        table.record_size as usize,
        size_of::<FileDataEvent>(),
        "record_size must be size_of the skeleton's file_data_event"
    );
}

#[test]
fn root_loads_attaches_and_collects_rows() {
    if !testing::require_root("root_loads_attaches_and_collects_rows") {
        return;
    }
    let mut run = Running::<FileData>::start("{}");
    let got = run.drain_until(Duration::from_secs(5), |r| {
        let _ = std::fs::File::open("/etc/hostname");
        r.rows("file_data") > 0
    });
    run.stop();
    assert!(got, "no file_data rows within 5 s");
    run.assert_recent_timestamps("file_data");
}
