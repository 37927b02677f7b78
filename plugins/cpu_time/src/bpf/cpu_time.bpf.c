// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* cpu_time: on-CPU time per process (tgid), accumulated in the kernel at
 * every context switch, with no record per switch. Each CPU keeps, in its
 * own slot of cpu_now, who runs since when, its idle time, and the time of
 * the last few processes that ran on it; only when a process outside those
 * runs there is the oldest one's time added to its total in the shared
 * hash map. A CPU that alternates between a few processes and idle, the
 * common case, costs a few loads, compares and adds per switch.
 *
 * No clock is read: the scheduler has just updated the run queue's task
 * clock, and stamped it into the task being switched in (`se.exec_start`,
 * set by every class's set_next_task) and, by update_curr, into the task
 * switched out. Time is therefore the scheduler's own task time, which
 * leaves out interrupt and steal time, for busy and idle alike.
 *
 * User space makes every CPU switch (a pinned thread per CPU wakes) before
 * it reads the totals and the per-CPU counts, so a run still going on is
 * counted up to the read. */
#include "kml.bpf.h"
#include "cpu_time.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define TABLE_CPU_TIME 0

/* The table's rows are made in user space from these maps (the probe
 * declares it `from_maps`: no ring). kml_lost[0] counts runs that found
 * the map full. */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384); /* set from the settings before load */
	__type(key, __u32);
	__type(value, struct cpu_time_value);
} tgid_time SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cpu_now);
} cpu_now SEC(".maps");

/* Keep the record types in BTF so the skeleton generates them. */
struct cpu_time_event _cpu_time_event = {};
struct cpu_time_value _cpu_time_value = {};
struct cpu_now _cpu_now = {};

static __always_inline void describe(struct cpu_time_value *v,
				     struct task_struct *t)
{
	struct task_struct *leader = BPF_CORE_READ(t, group_leader);

	v->cgroup_id = BPF_CORE_READ(t, cgroups, dfl_cgrp, kn, id);
	bpf_probe_read_kernel_str(v->comm, sizeof(v->comm), &leader->comm);
}

/* The key a task's time counts under: 0 for the idle tasks, its tgid, or
 * CPU_TIME_UNRECORDED for tasks the run's filters leave out. Without
 * filters (how the host runs it) the verifier drops the filter code. */
static __always_inline __u32 key_of(struct task_struct *t)
{
	if (t->pid == 0)
		return 0;
	if (!kml_self_tgid && !kml_filter_tgid && !kml_filter_pid &&
	    !kml_filter_cgroup_id)
		return t->tgid;
	return kml_wanted_tgid(t, t->tgid) ? t->tgid : CPU_TIME_UNRECORDED;
}

static __always_inline void count_lost(void)
{
	__u32 table = TABLE_CPU_TIME;
	__u64 *lost = bpf_map_lookup_elem(&kml_lost, &table);

	if (lost)
		*lost += 1;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(cpu_time_switch, bool preempt, struct task_struct *prev,
	     struct task_struct *next)
{
	/* The run queue's task clock at this switch (see the top). */
	__u64 now = next->pid ? next->se.exec_start : prev->se.exec_start;
	__u32 zero = 0;
	struct cpu_now *c = bpf_map_lookup_elem(&cpu_now, &zero);

	if (!c)
		return 0;
	__u64 since = c->since_ns;
	/* The task switched out ran since this CPU's last switch. (Its key,
	 * not the one saved at that switch: where a switch goes unseen, the
	 * time goes to the task that really leaves, and its name matches.) */
	__u32 key = key_of(prev);

	c->since_ns = now;
	c->tgid = key_of(next);
	if (!since || key == CPU_TIME_UNRECORDED || now < since)
		return 0;
	__u64 ran = now - since;

	if (key == 0) {
		c->idle_ns += ran;
		return 0;
	}
	/* One of the processes this CPU keeps time for? */
#pragma unroll
	for (int i = 0; i < CPU_TIME_PENDING; i++) {
		if (c->pending_tgid[i] == key) {
			c->pending_ns[i] += ran;
			return 0;
		}
	}
	/* No: free a slot by adding its process's time to its total (its
	 * entry was made when it got the slot; gone if user space removed a
	 * process that ended, whose time it has counted). */
	__u32 slot = c->evict & (CPU_TIME_PENDING - 1);
	__u32 old = c->pending_tgid[slot];

	c->evict = slot + 1;
	if (old) {
		struct cpu_time_value *v = bpf_map_lookup_elem(&tgid_time, &old);

		if (v)
			__sync_fetch_and_add(&v->cpu_ns, c->pending_ns[slot]);
	}
	c->pending_tgid[slot] = key;
	c->pending_ns[slot] = ran;
	/* Make sure the new one has an entry, named while its task is here. */
	if (!bpf_map_lookup_elem(&tgid_time, &key)) {
		struct cpu_time_value fresh = {};

		describe(&fresh, prev);
		if (bpf_map_update_elem(&tgid_time, &key, &fresh, BPF_NOEXIST) &&
		    !bpf_map_lookup_elem(&tgid_time, &key)) {
			/* The map is full: this process's time is not kept. */
			c->pending_tgid[slot] = 0;
			c->pending_ns[slot] = 0;
			count_lost();
		}
	}
	return 0;
}

/* A program executed: the process's name (and maybe cgroup) changed. */
SEC("tp_btf/sched_process_exec")
int BPF_PROG(cpu_time_exec, struct task_struct *p)
{
	__u32 tgid = p->tgid;
	struct cpu_time_value *v = bpf_map_lookup_elem(&tgid_time, &tgid);

	if (v)
		describe(v, p);
	return 0;
}
