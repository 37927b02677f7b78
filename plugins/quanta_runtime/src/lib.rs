//! quanta_runtime: per-task on-CPU run length and run-queue wait, from the
//! scheduler's `sched_switch`, `sched_wakeup` and `sched_wakeup_new`
//! tracepoints (`tp_btf`).

use kernmlops_plugin_bpf::{
    bpf_probe, export_plugin, sdk::NoSettings, BpfHooks, BpfProbe, Error, LoadContext, Open, Result,
};

bpf_probe! {
    probe: QuantaRuntime,
    name: "quanta_runtime",
    description: "Scheduler quanta: on-CPU run length and run-queue wait per task",
    hooks: custom,
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

/// The `quanta_runtime` probe.
#[derive(Default)]
pub struct QuantaRuntime;

/// The largest `kernel.pid_max` (`PID_MAX_LIMIT` on 64-bit kernels).
const PID_MAX_LIMIT: u32 = 4 << 20;

/// Thread ids below this index the waiting-start array; `kernel.pid_max`
/// now, so every thread has its slot unless pid_max is raised during the
/// run (those fall back to task storage in the program).
fn thread_slots() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .map_or(32_768, |n| n.clamp(1, PID_MAX_LIMIT))
}

impl BpfHooks for QuantaRuntime {
    fn before_load(
        &mut self,
        open: &mut Open<Self>,
        _cx: &mut LoadContext<'_, NoSettings>,
    ) -> Result<()> {
        open.maps
            .queued_since_ns
            .set_max_entries(thread_slots())
            .map_err(|e| Error::new(format!("sizing the waiting-start array: {e}")))
    }
}

export_plugin! {
    description: "Scheduler quanta: per-task on-CPU run length and run-queue wait",
    probes: [BpfProbe<QuantaRuntime>],
}
