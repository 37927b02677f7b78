/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Helpers shared by every kernmlops BPF program.
 *
 * - One clock: CLOCK_BOOTTIME in microseconds (kml_now_us), as in user space.
 * - Lost events are counted per table in `kml_lost`, which the plugin SDK
 *   reads and reports; a record is never dropped silently.
 * - Ring buffer wake-ups are batched: the consumer is woken only once
 *   `kml_wakeup_bytes` are waiting, otherwise it drains on its own timer.
 *   Waking per event would make sched_switch events that wake it again.
 * - Tunables are `const volatile` and set by the SDK before load.
 */
#ifndef KML_BPF_H
#define KML_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#define KML_MAX_TABLES 8

/* Set by the SDK from StartArgs before load. */
const volatile __u32 kml_filter_tgid = 0;      /* 0: every process */
const volatile __u32 kml_filter_pid = 0;       /* 0: every thread */
const volatile __u64 kml_filter_cgroup_id = 0; /* 0: every cgroup (v2 id) */
const volatile __u32 kml_self_tgid = 0;        /* the collector itself */
const volatile __u64 kml_wakeup_bytes = 256 * 1024;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, KML_MAX_TABLES);
	__type(key, __u32);
	__type(value, __u64);
} kml_lost SEC(".maps");

/* Declares a ring buffer map; its size is set by the SDK before load. */
#define KML_RING(name)                                  \
	struct {                                        \
		__uint(type, BPF_MAP_TYPE_RINGBUF);     \
		__uint(max_entries, 4 * 1024 * 1024);   \
	} name SEC(".maps")

static __always_inline __u64 kml_now_us(void)
{
	return bpf_ktime_get_boot_ns() / 1000;
}

/* True when events of this task pass the host's --tgid, --pid and --cgroup
 * filters. The checks are in the kernel, so filtered-out events cost no
 * ring space. */
static __always_inline bool kml_wanted(struct task_struct *task)
{
	if (kml_filter_tgid && BPF_CORE_READ(task, tgid) != kml_filter_tgid)
		return false;
	if (kml_filter_pid && BPF_CORE_READ(task, pid) != kml_filter_pid)
		return false;
	if (kml_filter_cgroup_id &&
	    BPF_CORE_READ(task, cgroups, dfl_cgrp, kn, id) != kml_filter_cgroup_id)
		return false;
	return true;
}

/* Reserves a record for `table` (its index in the plugin's declaration),
 * counting a failure as a lost event. */
static __always_inline void *kml_reserve(void *ring, __u64 size, __u32 table)
{
	void *rec = bpf_ringbuf_reserve(ring, size, 0);
	if (!rec) {
		__u64 *lost = bpf_map_lookup_elem(&kml_lost, &table);
		if (lost)
			*lost += 1;
	}
	return rec;
}

/* Submits a record, waking the consumer only past the fill threshold. */
static __always_inline void kml_submit(void *ring, void *rec)
{
	__u64 avail = bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA);
	bpf_ringbuf_submit(rec, avail >= kml_wakeup_bytes ? BPF_RB_FORCE_WAKEUP
							  : BPF_RB_NO_WAKEUP);
}

#endif /* KML_BPF_H */
