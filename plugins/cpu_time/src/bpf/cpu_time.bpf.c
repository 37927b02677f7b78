// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* cpu_time: on-CPU time per process (tgid), accumulated in the kernel at
 * every context switch. No record per switch: the switched-out task's run
 * is added to its process's total in a hash map, and user space reads the
 * totals once per interval. The idle tasks (pid 0) count under tgid 0, so
 * busy and idle time come from the same clock. */
#include "kml.bpf.h"
#include "cpu_time.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define TABLE_CPU_TIME 0

/* The SDK drains one ring per table; this probe's rows are made in user
 * space from the maps, so the ring stays empty. kml_lost[0] counts runs
 * that found the map full. */
KML_RING(cpu_time_ring);

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

/* The tgid a task's time counts under: 0 for the idle tasks, and
 * CPU_TIME_UNRECORDED for tasks the run's filters leave out. */
static __always_inline __u32 key_of(struct task_struct *t)
{
	if (t->pid == 0)
		return 0;
	return kml_wanted(t) ? t->tgid : CPU_TIME_UNRECORDED;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(cpu_time_switch, bool preempt, struct task_struct *prev,
	     struct task_struct *next)
{
	__u64 now = bpf_ktime_get_boot_ns();
	__u32 zero = 0;
	struct cpu_now *c = bpf_map_lookup_elem(&cpu_now, &zero);

	if (!c)
		return 0;
	__u64 since = c->since_ns;
	__u32 tgid = c->tgid;

	c->since_ns = now;
	c->tgid = key_of(next);
	if (!since || tgid == CPU_TIME_UNRECORDED || now < since)
		return 0;

	__u64 ran = now - since;
	struct cpu_time_value *v = bpf_map_lookup_elem(&tgid_time, &tgid);

	if (v) {
		__sync_fetch_and_add(&v->cpu_ns, ran);
		return 0;
	}
	struct cpu_time_value fresh = {};

	fresh.cpu_ns = ran;
	if (tgid)
		describe(&fresh, prev);
	if (bpf_map_update_elem(&tgid_time, &tgid, &fresh, BPF_NOEXIST) == 0)
		return 0;
	/* Another CPU inserted it meanwhile, or the map is full. */
	v = bpf_map_lookup_elem(&tgid_time, &tgid);
	if (v) {
		__sync_fetch_and_add(&v->cpu_ns, ran);
	} else {
		__u32 table = TABLE_CPU_TIME;
		__u64 *lost = bpf_map_lookup_elem(&kml_lost, &table);

		if (lost)
			*lost += 1;
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
