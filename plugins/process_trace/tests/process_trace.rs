//! The tests every probe crate shares, on the running kernel as root.

use kernmlops_plugin_bpf::BpfProbe;
use process_trace::ProcessTrace;

kernmlops_plugin_testing::probe_tests!(BpfProbe<ProcessTrace>, rows_in = "process_trace");
