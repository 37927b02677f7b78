// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* quanta_runtime: how long each task runs on a CPU (quanta_runtime) and how
 * long it waits runnable before it runs (quanta_queued_time).
 *
 * A task's quantum starts at the previous switch on its CPU, so the start is
 * kept per CPU. Waiting starts at wake-up, or at the switch that preempted a
 * still-runnable task. */
/* Both tables take a row per context switch: stage them per CPU. */
#define KML_STAGED
#include "kml.bpf.h"
#include "quanta_runtime.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define TABLE_RUNTIME 0
#define TABLE_QUEUED 1
#define TASK_RUNNING 0

KML_RING(runtime_ring);
KML_RING(queued_ring);

/* Time of the last switch on each CPU, in ns: a plain array indexed by
 * CPU (no map lookup). CPUs past KML_MAX_CPUS record no run lengths. */
#define KML_MAX_CPUS 4096
__u64 last_switch_ns[KML_MAX_CPUS] = {};

/* When each runnable task started waiting, in ns (0: not waiting). Task
 * storage lives and dies with the task: no table to fill or leak. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);
} queued_since_ns SEC(".maps");

KML_FLUSH_PROGRAM(
	kml_flush_table(&runtime_ring, TABLE_RUNTIME, sizeof(struct quanta_runtime_event));
	kml_flush_table(&queued_ring, TABLE_QUEUED, sizeof(struct quanta_queued_event)))

/* Keep the record types in BTF so the skeleton generates them. */
struct quanta_runtime_event _quanta_runtime_event = {};
struct quanta_queued_event _quanta_queued_event = {};

/* Marks a task runnable from now. Arguments come from tp_btf, so task
 * fields are read directly (no helper call). */
static __always_inline void mark_queued(struct task_struct *p, __u64 now_ns)
{
	__u64 *since;

	if (p->pid == 0 || !kml_wanted_tgid(p, p->tgid))
		return;
	since = bpf_task_storage_get(&queued_since_ns, p, 0,
				     BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (since)
		*since = now_ns;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(handle_sched_wakeup, struct task_struct *p)
{
	mark_queued(p, bpf_ktime_get_boot_ns());
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(handle_sched_wakeup_new, struct task_struct *p)
{
	mark_queued(p, bpf_ktime_get_boot_ns());
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(handle_sched_switch, bool preempt, struct task_struct *prev,
	     struct task_struct *next, unsigned int prev_state)
{
	__u64 now_ns = bpf_ktime_get_boot_ns();
	__u32 cpu = bpf_get_smp_processor_id();
	__u32 prev_tgid = prev->tgid;
	bool prev_wanted = kml_wanted_tgid(prev, prev_tgid);

	if (cpu < KML_MAX_CPUS) {
		__u64 started = last_switch_ns[cpu];

		last_switch_ns[cpu] = now_ns;
		if (started && prev_wanted) {
			struct quanta_runtime_event e = {
				.ts_uptime_us = now_ns / 1000,
				.quanta_run_length_us = (now_ns - started) / 1000,
				.cpu = cpu,
				.pid = prev->pid,
				.tgid = prev_tgid,
			};
			kml_stage_output(&runtime_ring, &e, sizeof(e), TABLE_RUNTIME);
		}
	}

	/* A preempted task is still runnable: it starts waiting now. */
	if (prev_state == TASK_RUNNING && prev_wanted && prev->pid != 0) {
		__u64 *since = bpf_task_storage_get(&queued_since_ns, prev, 0,
						    BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (since)
			*since = now_ns;
	}

	/* Only tasks marked waiting have storage (never the idle task): the
	 * others cost one lookup. */
	if (next->pid == 0)
		return 0;
	__u64 *since = bpf_task_storage_get(&queued_since_ns, next, 0, 0);
	if (since && *since) {
		__u64 waited_ns = now_ns > *since ? now_ns - *since : 0;
		struct quanta_queued_event e = {
			.ts_uptime_us = now_ns / 1000,
			.quanta_queued_time_us = waited_ns / 1000,
			.cpu = cpu,
			.pid = next->pid,
			.tgid = next->tgid,
		};

		*since = 0;
		kml_stage_output(&queued_ring, &e, sizeof(e), TABLE_QUEUED);
	}
	return 0;
}
