//! The tests every probe crate shares, on the running kernel as root.

use kernmlops_plugin_bpf::BpfProbe;
use quanta_runtime::QuantaRuntime;

kernmlops_plugin_testing::probe_tests!(BpfProbe<QuantaRuntime>, rows_in = "quanta_runtime");
