// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* process_metadata: who each new task is, recorded when it is created
 * (sched_process_fork) and when it runs a new program (sched_process_exec),
 * so that even a task that lives for a microsecond has its row.
 *
 * The kernel-side facts come from the task_struct: ids, comm, real parent,
 * nice, start time and cgroup v2 id. The command line is read from the
 * task's argument area (mm->arg_start..arg_end) with bpf_probe_read_user:
 * at exec the task is current; at fork the parent is current and the child's
 * memory is a copy of (or the same as) the parent's, at the same addresses.
 * User space resolves the cgroup id to a path and turns the NULs between
 * arguments into spaces. Tasks that exist when the probe starts are read
 * from /proc by user space. */
#include "kml.bpf.h"
#include "process_metadata.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define TABLE_PROCESS_METADATA 0
#define NICE_0_PRIO 120 /* MAX_RT_PRIO + NICE_WIDTH / 2 */

KML_RING(metadata_ring);

/* Never written. Every record starts as a copy of it (ring memory is not
 * zeroed, and the record is too large for an inline memset); it also keeps
 * the record type in BTF for the skeleton. */
const struct process_metadata_event zero_event = {};

/* Before Linux 5.5 the boot-based start time was real_start_time. */
struct task_struct___pre_5_5 {
	__u64 real_start_time;
} __attribute__((preserve_access_index));

static __always_inline __u64 start_boottime_ns(struct task_struct *task)
{
	struct task_struct___pre_5_5 *old = (void *)task;

	if (bpf_core_field_exists(task->start_boottime))
		return BPF_CORE_READ(task, start_boottime);
	return BPF_CORE_READ(old, real_start_time);
}

/* Reads the command line of `mm`'s owner; the caller's address space must
 * hold the same argument area (current is the task, or its fork parent). */
static __always_inline void read_cmdline(struct process_metadata_event *e,
					 struct mm_struct *mm)
{
	__u64 arg_start, arg_end, len;

	if (!mm)
		return; /* a kernel thread: no command line, as in /proc */
	arg_start = BPF_CORE_READ(mm, arg_start);
	arg_end = BPF_CORE_READ(mm, arg_end);
	if (arg_end <= arg_start)
		return;
	len = arg_end - arg_start;
	if (len > PROCESS_METADATA_CMDLINE_LEN) {
		len = PROCESS_METADATA_CMDLINE_LEN;
		e->cmdline_truncated = 1;
	}
	/* On failure (pages not resident) the helper zeroes the buffer: the
	 * row keeps an empty command line. */
	bpf_probe_read_user(e->cmdline, len, (void *)arg_start);
}

static __always_inline void emit(struct task_struct *task)
{
	struct process_metadata_event *e;

	if (!kml_wanted(task))
		return;
	e = kml_reserve(&metadata_ring, sizeof(*e), TABLE_PROCESS_METADATA);
	if (!e)
		return;
	bpf_probe_read_kernel(e, sizeof(*e), &zero_event);
	e->ts_uptime_us = kml_now_us();
	e->start_time_uptime_us = start_boottime_ns(task) / 1000;
	e->cgroup_id = BPF_CORE_READ(task, cgroups, dfl_cgrp, kn, id);
	e->pid = BPF_CORE_READ(task, pid);
	e->tgid = BPF_CORE_READ(task, tgid);
	e->ppid = BPF_CORE_READ(task, real_parent, tgid);
	e->nice = BPF_CORE_READ(task, static_prio) - NICE_0_PRIO;
	e->source = PROCESS_METADATA_NEW;
	BPF_CORE_READ_STR_INTO(&e->name, task, comm);
	read_cmdline(e, BPF_CORE_READ(task, mm));
	kml_submit(&metadata_ring, e, TABLE_PROCESS_METADATA);
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(handle_sched_process_fork, struct task_struct *parent,
	     struct task_struct *child)
{
	emit(child);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(handle_sched_process_exec, struct task_struct *p, pid_t old_pid,
	     struct linux_binprm *bprm)
{
	emit(p);
	return 0;
}
