//! The tests every probe crate shares, on the running kernel as root; the
//! `/proc` scan guarantees rows at the first drain.

use kernmlops_plugin_bpf::BpfProbe;
use process_metadata::ProcessMetadata;

kernmlops_plugin_testing::probe_tests!(BpfProbe<ProcessMetadata>, rows_in = "process_metadata");
