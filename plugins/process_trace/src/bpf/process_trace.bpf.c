// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* process_trace: one row each time a task is created (start), runs a new
 * program (exec) or exits (end).
 *
 * Tasks are threads: a new thread is a start, and every thread's exit is an
 * end. At sched_process_exec a non-leader thread that called execve has
 * already taken over the thread group leader's identity (de_thread), so its
 * pid equals its tgid; the pid it had before is the tracepoint's old_pid. */
#include "kml.bpf.h"
#include "process_trace.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define TABLE_PROCESS_TRACE 0

KML_RING(process_ring);

/* Keep the record type in BTF so the skeleton generates it. */
struct process_trace_event _process_trace_event = {};

/* `task` is the tracepoint's BTF pointer: its fields are plain loads. */
static __always_inline void emit(struct task_struct *task, __u32 cap_type)
{
	__u32 tgid = task->tgid;
	struct process_trace_event *e;

	if (!kml_wanted_tgid(task, tgid))
		return;
	e = kml_reserve(&process_ring, sizeof(*e), TABLE_PROCESS_TRACE);
	if (!e)
		return;
	/* Ring memory is not zeroed: clear padding and the name's tail. */
	__builtin_memset(e, 0, sizeof(*e));
	e->ts_uptime_us = kml_now_us();
	e->pid = task->pid;
	e->tgid = tgid;
	e->cap_type = cap_type;
	/* On failure the helper leaves an empty string; the buffer stays zero. */
	BPF_CORE_READ_STR_INTO(&e->name, task, comm);
	kml_submit(&process_ring, e, TABLE_PROCESS_TRACE);
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(handle_sched_process_fork, struct task_struct *parent,
	     struct task_struct *child)
{
	emit(child, PROCESS_TRACE_START);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(handle_sched_process_exec, struct task_struct *p, pid_t old_pid,
	     struct linux_binprm *bprm)
{
	emit(p, PROCESS_TRACE_EXEC);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(handle_sched_process_exit, struct task_struct *p, bool group_dead)
{
	emit(p, PROCESS_TRACE_END);
	return 0;
}
