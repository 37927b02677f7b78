//! Tests of the block_io probe: the tests every probe crate shares
//! (declaration, settings, a real load-attach-drain as root), its record
//! layout, and, as root, that it collects rows for I/O this test makes.

use std::{mem::size_of, time::Duration};

use block_io::{BlockIo, BlockIoEvent};
use kernmlops_plugin_bpf::{BpfProbe, BpfSpec};
use kernmlops_plugin_testing::{self as testing, Running};

kernmlops_plugin_testing::probe_tests!(BpfProbe<BlockIo>);

#[test]
fn record_size_is_the_generated_event_struct() {
    let tables = BlockIo::tables();
    assert_eq!(tables.len(), BlockIo::RINGS.len(), "one ring per table");
    assert_eq!(
        tables[0].record_size as usize,
        size_of::<BlockIoEvent>(),
        "record_size must be size_of the skeleton's block_io_event"
    );
}

#[test]
fn root_loads_attaches_and_collects_rows() {
    if !testing::require_root("root_loads_attaches_and_collects_rows") {
        return;
    }
    let mut run = Running::<BpfProbe<BlockIo>>::start("{}");
    // Make block I/O of our own: a file written and synced on the temp
    // folder's disk issues write requests from this process.
    let scratch = std::env::temp_dir().join(format!("kml-block_io-unit-{}", std::process::id()));
    let got = run.drain_until(Duration::from_secs(5), |r| {
        let written = std::fs::File::create(&scratch).and_then(|mut f| {
            std::io::Write::write_all(&mut f, &[1u8; 64 * 1024])?;
            f.sync_all()
        });
        written.unwrap_or_else(|e| panic!("writing {}: {e}", scratch.display()));
        r.rows("block_io") > 0
    });
    run.stop();
    let _ = std::fs::remove_file(&scratch);
    assert!(got, "no block_io rows within 5 s");
    run.assert_recent_timestamps("block_io");
}
