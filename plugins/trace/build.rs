//! Compiles the probe's generic BPF program into a skeleton.
fn main() {
    kernmlops_plugin_build::build_bpf("trace");
}
