// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* quanta_runtime: how long each task runs on a CPU (quanta_runtime) and how
 * long it waits runnable before it runs (quanta_queued_time).
 *
 * A task's quantum starts at the previous switch on its CPU, so the start is
 * kept per CPU. Waiting starts at wake-up, or at a switch that leaves the
 * task on the run queue (a preemption, a yield). */
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

/* When each runnable task started waiting, in ns (0: not waiting), by
 * thread id: an array, which the JIT looks up inline, sized by the plugin
 * to kernel.pid_max at start. An entry is set only while its thread waits
 * and cleared when the thread gets a CPU, and a thread must run to exit,
 * so a reused id starts at 0. Ids past the array (pid_max raised during a
 * run) fall back to task storage, a helper call per lookup. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 32768);
	__type(key, __u32);
	__type(value, __u64);
} queued_since_ns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);
} queued_since_late_ns SEC(".maps");

/* The waiting start of `p` (not the idle task); `create` makes the late
 * storage when it is missing. NULL: no entry. */
static __always_inline __u64 *queued_since(struct task_struct *p, bool create)
{
	__u32 tid = p->pid;
	__u64 *since = bpf_map_lookup_elem(&queued_since_ns, &tid);

	if (since)
		return since;
	return bpf_task_storage_get(&queued_since_late_ns, p, 0,
				    create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
}

KML_FLUSH_PROGRAM(
	kml_flush_table(&runtime_ring, TABLE_RUNTIME, sizeof(struct quanta_runtime_event));
	kml_flush_table(&queued_ring, TABLE_QUEUED, sizeof(struct quanta_queued_event)))

/* Keep the record types in BTF so the skeleton generates them. */
struct quanta_runtime_event _quanta_runtime_event = {};
struct quanta_queued_event _quanta_queued_event = {};

/* Marks a woken task runnable from now. Arguments come from tp_btf, so
 * task fields are read directly (no helper call).
 *
 * A task on a CPU is not waiting: a wake-up of the running task (it was
 * about to sleep) marks nothing. The wake-up runs under the task's run
 * queue lock, which its CPU holds from the switch away from it until
 * on_cpu is cleared, so on_cpu is exact here. A task already waiting (it
 * was preempted while about to sleep, then woken) keeps its start: the
 * start is cleared whenever the task gets a CPU, so it is set only while
 * the task waits. */
static __always_inline void mark_queued(struct task_struct *p, __u64 now_ns)
{
	__u64 *since;

	if (p->pid == 0 || p->on_cpu || !kml_wanted_tgid(p, p->tgid))
		return;
	since = queued_since(p, true);
	if (since && *since == 0)
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
	__u64 now_us = now_ns / 1000;
	__u32 cpu = bpf_get_smp_processor_id();
	__u32 prev_tgid = prev->tgid;
	bool prev_wanted = kml_wanted_tgid(prev, prev_tgid);

	if (cpu < KML_MAX_CPUS) {
		__u64 started = last_switch_ns[cpu];

		last_switch_ns[cpu] = now_ns;
		if (started && prev_wanted) {
			struct quanta_runtime_event e = {
				.ts_uptime_us = now_us,
				.quanta_run_length_us = kml_ns_to_us(now_ns - started),
				.cpu = cpu,
				.pid = prev->pid,
				.tgid = prev_tgid,
			};
			kml_stage_output(&runtime_ring, &e, sizeof(e), TABLE_RUNTIME);
		}
	}

	/* A preempted task stays on the run queue whatever its state (it may
	 * have been about to sleep), and so does one switched away from
	 * while runnable (a yield): both start waiting now. */
	if ((preempt || prev_state == TASK_RUNNING) && prev_wanted && prev->pid != 0) {
		__u64 *since = queued_since(prev, true);
		if (since)
			*since = now_ns;
	}

	if (next->pid == 0)
		return 0;
	__u64 *since = queued_since(next, false);
	if (since && *since) {
		__u64 waited_ns = now_ns > *since ? now_ns - *since : 0;
		struct quanta_queued_event e = {
			.ts_uptime_us = now_us,
			.quanta_queued_time_us = kml_ns_to_us(waited_ns),
			.cpu = cpu,
			.pid = next->pid,
			.tgid = next->tgid,
		};

		*since = 0;
		kml_stage_output(&queued_ring, &e, sizeof(e), TABLE_QUEUED);
	}
	return 0;
}
