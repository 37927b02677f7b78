//! quanta_runtime: per-task on-CPU run length and run-queue wait, from the
//! scheduler's `sched_switch`, `sched_wakeup` and `sched_wakeup_new`
//! tracepoints (`tp_btf`).

use std::mem::MaybeUninit;

use kernmlops_plugin_sdk::{
    bpf::{size_rings, BpfProbe, BpfSpec},
    column, export_plugin, set_common_rodata,
    table::TableBuilder,
    ColumnKind, ProbeDecl, StartArgs,
};
use libbpf_rs::{
    skel::{OpenSkel, SkelBuilder},
    OpenObject,
};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/quanta_runtime.skel.rs"));
}
use skel::{types, QuantaRuntimeSkel, QuantaRuntimeSkelBuilder};

pub struct QuantaRuntime;

impl BpfSpec for QuantaRuntime {
    const NAME: &'static str = "quanta_runtime";
    const RINGS: &'static [&'static str] = &["runtime_ring", "queued_ring"];
    type Skel = QuantaRuntimeSkel<'static>;

    fn decl() -> ProbeDecl {
        type Run = types::quanta_runtime_event;
        type Queued = types::quanta_queued_event;
        let runtime = TableBuilder::new::<Run>(
            "quanta_runtime",
            "One row per context switch: how long the switched-out task ran",
        );
        let runtime = column!(
            runtime,
            Run,
            cpu,
            "cpu",
            ColumnKind::U32,
            "",
            "CPU the task ran on"
        );
        let runtime = column!(runtime, Run, pid, "pid", ColumnKind::U32, "", "thread id");
        let runtime = column!(
            runtime,
            Run,
            tgid,
            "tgid",
            ColumnKind::U32,
            "",
            "process id"
        );
        let runtime = column!(
            runtime,
            Run,
            ts_uptime_us,
            "ts_uptime_us",
            ColumnKind::U64,
            "us",
            "when the quantum ended (CLOCK_BOOTTIME)"
        );
        let runtime = column!(
            runtime,
            Run,
            quanta_run_length_us,
            "quanta_run_length_us",
            ColumnKind::U64,
            "us",
            "how long the task ran before the switch"
        );

        let queued = TableBuilder::new::<Queued>(
            "quanta_queued_time",
            "One row per switch to a task that was waiting runnable",
        );
        let queued = column!(
            queued,
            Queued,
            cpu,
            "cpu",
            ColumnKind::U32,
            "",
            "CPU the task runs on"
        );
        let queued = column!(queued, Queued, pid, "pid", ColumnKind::U32, "", "thread id");
        let queued = column!(
            queued,
            Queued,
            tgid,
            "tgid",
            ColumnKind::U32,
            "",
            "process id"
        );
        let queued = column!(
            queued,
            Queued,
            ts_uptime_us,
            "ts_uptime_us",
            ColumnKind::U64,
            "us",
            "when the task got the CPU (CLOCK_BOOTTIME)"
        );
        let queued = column!(
            queued,
            Queued,
            quanta_queued_time_us,
            "quanta_queued_time_us",
            ColumnKind::U64,
            "us",
            "how long it waited since wake-up or preemption"
        );

        ProbeDecl {
            name: Self::NAME.into(),
            description: "Scheduler quanta: on-CPU run length and run-queue wait per task".into(),
            tables: vec![runtime.build(), queued.build()].into(),
        }
    }

    fn load(
        storage: &'static mut MaybeUninit<OpenObject>,
        args: &StartArgs,
    ) -> libbpf_rs::Result<Self::Skel> {
        let mut open = QuantaRuntimeSkelBuilder::default().open(storage)?;
        set_common_rodata!(open, args);
        size_rings(open.open_object_mut(), args)?;
        open.load()
    }
}

export_plugin! {
    description: "Scheduler quanta: per-task on-CPU run length and run-queue wait",
    probes: [BpfProbe<QuantaRuntime>],
}
