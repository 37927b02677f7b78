//! process_trace: one row per task fork, exec and exit, from the
//! scheduler's `sched_process_fork`, `sched_process_exec` and
//! `sched_process_exit` tracepoints (`tp_btf`).

use kernmlops_plugin_bpf::{bpf_probe, export_plugin, BpfProbe};

/// Labels of `cap_type`, indexed by the `PROCESS_TRACE_*` values of
/// `process_trace.h`.
pub const CAP_TYPES: &[&str] = &["start", "exec", "end"];

bpf_probe! {
    probe: ProcessTrace,
    name: "process_trace",
    description: "Task lifecycle: fork, exec and exit of every thread",
    tables: [
        process_trace(process_ring, process_trace_event, rate = 20_000):
            "One row per task created (start), program executed (exec) or task exited (end)" {
            pid: "thread id",
            tgid: "process id",
            ts_uptime_us [us]: "when the event happened (CLOCK_BOOTTIME)",
            name: "the task's command name (comm), after exec for exec rows",
            cap_type as label(CAP_TYPES): "what happened: start (fork/clone), exec or end (exit)",
        },
    ],
}

export_plugin! {
    description: "Task lifecycle: fork, exec and exit of every thread",
    probes: [BpfProbe<ProcessTrace>],
}

#[cfg(test)]
mod tests {
    use kernmlops_plugin_bpf::{sdk::ColumnKind, BpfSpec};

    use super::*;

    #[test]
    fn cap_type_is_a_u32_label_over_the_header_values() {
        let tables = ProcessTrace::tables();
        let col = tables[0]
            .columns
            .iter()
            .find(|c| c.name.as_str() == "cap_type")
            .expect("cap_type column declared");
        assert_eq!(col.kind, ColumnKind::LABEL);
        assert_eq!(col.size, 4, "cap_type is a __u32 in process_trace.h");
        let labels: Vec<&str> = col.labels.iter().map(|l| l.as_str()).collect();
        assert_eq!(labels, CAP_TYPES);
    }

    #[test]
    fn name_holds_a_full_comm() {
        let tables = ProcessTrace::tables();
        let col = tables[0]
            .columns
            .iter()
            .find(|c| c.name.as_str() == "name")
            .expect("name column declared");
        assert_eq!(col.kind, ColumnKind::STR);
        assert_eq!(col.size, 16, "TASK_COMM_LEN");
    }
}
