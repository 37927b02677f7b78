//! Tests of the __NAME__ probe: its declaration against the rules the host
//! enforces at load and its settings (no root needed), and, as root, that
//! it loads, attaches and collects rows on the running kernel, in the first
//! table it declares.

use kernmlops_plugin_bpf::BpfProbe;
use __NAME__::__Name__;

kernmlops_plugin_testing::probe_tests!(BpfProbe<__Name__>, rows_in = first_table());

/// The first declared table's name, from the declaration itself.
fn first_table() -> &'static str {
    use kernmlops_plugin_bpf::BpfSpec;
    let name = __Name__::tables()[0].name.to_string();
    Box::leak(name.into_boxed_str())
}
