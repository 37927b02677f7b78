//! __NAME__: __DESCRIPTION__
//!
//! Scaffolded by `cargo xtask new-plugin`: one table, `__NAME__`, with one
//! row per context switch from `tp_btf/sched_switch`. To measure something
//! else, change together the hook (`src/bpf/__NAME__.bpf.c`), the record
//! (`struct __NAME___event`, `src/bpf/__NAME__.h`), its columns below (one
//! line each: `field [unit]: "what it is"`), and `README.md`.

use kernmlops_plugin_bpf::{bpf_probe, export_plugin, BpfProbe};

bpf_probe! {
    probe: __Name__,
    name: "__NAME__",
    description: "__DESCRIPTION__",
    tables: [
        // Table name (ring buffer map, record struct, rows per second on a
        // busy machine: it sizes the ring).
        __NAME__(events, __NAME___event, rate = 100_000): "One row per context switch" {
            ts_uptime_us [us]: "when the switch happened (CLOCK_BOOTTIME)",
            cpu: "CPU the switch happened on",
            pid: "thread id of the task switched in",
            tgid: "process id of the task switched in",
        },
    ],
}

export_plugin! {
    description: "__DESCRIPTION__",
    probes: [BpfProbe<__Name__>],
}
