//! quanta_runtime: per-task on-CPU run length and run-queue wait, from the
//! scheduler's `sched_switch`, `sched_wakeup` and `sched_wakeup_new`
//! tracepoints (`tp_btf`).

use kernmlops_plugin_bpf::{bpf_probe, export_plugin, BpfProbe};

bpf_probe! {
    probe: QuantaRuntime,
    name: "quanta_runtime",
    description: "Scheduler quanta: on-CPU run length and run-queue wait per task",
    tables: [
        quanta_runtime(runtime_ring, quanta_runtime_event, rate = 400_000):
            "One row per context switch: how long the switched-out task ran" {
            cpu: "CPU the task ran on",
            pid: "thread id",
            tgid: "process id",
            ts_uptime_us [us]: "when the quantum ended (CLOCK_BOOTTIME)",
            quanta_run_length_us [us]: "how long the task ran before the switch",
        },
        quanta_queued_time(queued_ring, quanta_queued_event, rate = 400_000):
            "One row per switch to a task that was waiting runnable" {
            cpu: "CPU the task runs on",
            pid: "thread id",
            tgid: "process id",
            ts_uptime_us [us]: "when the task got the CPU (CLOCK_BOOTTIME)",
            quanta_queued_time_us [us]: "how long it waited since wake-up or preemption",
        },
    ],
}

export_plugin! {
    description: "Scheduler quanta: per-task on-CPU run length and run-queue wait",
    probes: [BpfProbe<QuantaRuntime>],
}
