//! Tests of the file_data probe: the tests every probe crate shares
//! (declaration, settings, a real load-attach-drain as root), its record
//! layout, and, as root, rows for a file this test opens, with the path it
//! chose before load reported as a note when it is not fexit.

use std::{mem::size_of, time::Duration};

use file_data::{FileData, FileDataEvent, Path};
use kernmlops_plugin_bpf::{sdk::ProbeImpl, BpfProbe, BpfSpec};
use kernmlops_plugin_testing::{self as testing, Running};

kernmlops_plugin_testing::probe_tests!(BpfProbe<FileData>, rows_in = "file_data");

#[test]
fn record_size_is_the_generated_event_struct() {
    let tables = FileData::tables();
    assert_eq!(tables.len(), FileData::RINGS.len(), "one ring per table");
    assert_eq!(
        tables[0].record_size as usize,
        size_of::<FileDataEvent>(),
        "record_size must be size_of the skeleton's file_data_event"
    );
}

#[test]
fn root_loads_attaches_and_collects_rows() {
    if !testing::require_root("root_loads_attaches_and_collects_rows") {
        return;
    }
    let mut run = Running::<BpfProbe<FileData>>::start("{}");
    let path = run.probe.hooks().path();
    let notes = run.probe.notes();
    match path {
        Path::Fexit => assert!(notes.is_empty(), "{notes:?}"),
        Path::Tracepoints => assert!(
            notes
                .iter()
                .any(|n| n.contains("using the syscall tracepoints")),
            "the fallback is reported: {notes:?}"
        ),
    }
    // This machine refuses fentry/fexit: the choice made before load must
    // agree with the kernel's own answer.
    assert_eq!(
        path == Path::Fexit,
        kernmlops_plugin_bpf::Features::default()
            .fentry_attachable(file_data::FEXIT_FUNCTION)
            .is_ok()
    );
    let got = run.drain_until(Duration::from_secs(5), |r| {
        let _ = std::fs::File::open("/etc/hostname");
        r.rows("file_data") > 0
    });
    run.stop();
    assert!(got, "no file_data rows within 5 s");
    run.assert_recent_timestamps("file_data");
}
