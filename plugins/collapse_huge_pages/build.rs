//! Compiles the probe's BPF program into a skeleton.
fn main() {
    kernmlops_plugin_build::build_bpf("collapse_huge_pages");
}
