//! Compiles the probe's BPF program into a skeleton.
fn main() {
    kernmlops_plugin_build::build_bpf("cpu_time");
}
