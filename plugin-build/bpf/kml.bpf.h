/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Helpers shared by every kernmlops BPF program.
 *
 * - One clock: CLOCK_BOOTTIME in microseconds (kml_now_us), as in user space.
 * - Lost events are counted per table in `kml_lost`, which the plugin SDK
 *   reads and reports; a record is never dropped silently.
 * - Ring buffer wake-ups are batched: the consumer is woken only once a
 *   quarter of a table's ring is waiting (`kml_wakeup_bytes[table]`, set
 *   per ring by the SDK), otherwise it drains on its own timer. Waking per
 *   event would make sched_switch events that wake it again.
 * - The collector's own process is left out in the kernel (kml_wanted),
 *   unless the run asks to keep it (--include-self).
 * - Tunables are `const volatile` and set by the SDK before load.
 */
#ifndef KML_BPF_H
#define KML_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#define KML_MAX_TABLES 8

/* What a classic tracepoint program (SEC("tp/...")) returns. The kernel
 * hands a tracepoint event to perf's other users (`perf record -e`) only
 * when the BPF programs on it return non-zero: returning 0 would hide the
 * event from them. kernmlops never changes what other tools see. */
#define KML_TP_PASS 1

/* Set by the SDK from StartArgs before load. */
const volatile __u32 kml_filter_tgid = 0;      /* 0: every process */
const volatile __u32 kml_filter_pid = 0;       /* 0: every thread */
const volatile __u64 kml_filter_cgroup_id = 0; /* 0: every cgroup (v2 id) */
const volatile __u32 kml_filter_cgroup_descendants = 0; /* and cgroups below */
const volatile __u32 kml_self_tgid = 0; /* the collector, left out; 0: kept */
/* Per table: wake the consumer once this many bytes wait in its ring. */
const volatile __u64 kml_wakeup_bytes[KML_MAX_TABLES] = {};
/* Per table: check the fill level every (mask + 1) records, a power of two
 * small enough that the ring cannot fill between two checks. */
const volatile __u32 kml_wakeup_mask[KML_MAX_TABLES] = {};
/* Staged output (KML_STAGED) in use; 0 where the host cannot run the flush
 * program on a chosen CPU (before Linux 5.10): records go straight to the
 * ring. */
const volatile __u32 kml_stage_on = 1;
/* Per table: a staged batch goes out past this many bytes; 0 or more than
 * KML_STAGE_BYTES: KML_STAGE_BYTES. Set smaller where every CPU's full
 * batch would not fit below the ring's wake-up threshold (an explicit
 * --ring-size, or more CPUs than a 16 MiB ring allows). */
const volatile __u32 kml_stage_limit[KML_MAX_TABLES] = {};

/* Records submitted per CPU slot, to space out the fill checks. */
#define KML_SUBMIT_SLOTS 1024
__u32 kml_submits[KML_SUBMIT_SLOTS] = {};

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

/* A duration in ns as us. The JIT turns a division into x86 `div` (tens of
 * cycles) and clang has no multiply-high for BPF to avoid it, so durations
 * below 2^32 ns (4.29 s) multiply and shift instead: exact for every such
 * value, as 0x10624DD3 * 1000 - 2^38 = 56 <= 2^(38-32). Timestamps are
 * larger: divide them once per event. */
static __always_inline __u64 kml_ns_to_us(__u64 ns)
{
	if (ns >> 32)
		return ns / 1000;
	return (ns * 0x10624DD3ULL) >> 38;
}

/* Deepest cgroup level searched for --cgroup's descendants. */
#define KML_MAX_CGROUP_DEPTH 32

/* The --cgroup cgroup's level plus one, once a task in it or below it has
 * been seen (0: not yet). A cgroup's level never changes, so from then on
 * a check reads only the task's ancestor at that level, not every one. */
__u32 kml_cgroup_level_plus1 = 0;

/* Whether ancestors[i] of `cg` is the --cgroup one. */
static __always_inline bool kml_cgroup_ancestor_is(struct cgroup *cg, __u32 i)
{
	struct cgroup *up = NULL;

	bpf_core_read(&up, sizeof(up), &cg->ancestors[i & (KML_MAX_CGROUP_DEPTH - 1)]);
	return up && BPF_CORE_READ(up, kn, id) == kml_filter_cgroup_id;
}

/* Whether the cgroup `cg` (its id and level read by the caller) is the
 * --cgroup one or, with descendants, below it: cgroup->ancestors[] holds
 * every ancestor by level. */
static __always_inline bool kml_cgroup_matches(struct cgroup *cg, __u64 id, __u32 level)
{
	if (id == kml_filter_cgroup_id) {
		kml_cgroup_level_plus1 = level + 1;
		return true;
	}
	if (!kml_filter_cgroup_descendants)
		return false;
	__u32 known = kml_cgroup_level_plus1;
	if (known)
		return known - 1 < level && kml_cgroup_ancestor_is(cg, known - 1);
	for (__u32 i = 0; i < KML_MAX_CGROUP_DEPTH; i++) {
		if (i >= level)
			break;
		if (kml_cgroup_ancestor_is(cg, i)) {
			kml_cgroup_level_plus1 = i + 1;
			return true;
		}
	}
	return false;
}

/* kml_cgroup_matches for any task pointer (CO-RE reads). */
static __always_inline bool kml_in_cgroup(struct task_struct *task)
{
	struct cgroup *cg = BPF_CORE_READ(task, cgroups, dfl_cgrp);

	return cg && kml_cgroup_matches(cg, BPF_CORE_READ(cg, kn, id), BPF_CORE_READ(cg, level));
}

/* kml_cgroup_matches for a BTF task pointer (plain loads). */
static __always_inline bool kml_in_cgroup_btf(struct task_struct *task)
{
	struct cgroup *cg = task->cgroups->dfl_cgrp;

	return cg && kml_cgroup_matches(cg, cg->kn->id, cg->level);
}

/* The host's filters and the collector's exclusion, given the task's tgid,
 * pid and cgroup check. Filters that are off cost nothing: the tunables
 * are read-only, so the verifier drops their branches at load. */
#define KML_WANTED(tgid, pid_expr, in_cgroup_expr)                          \
	(!(kml_self_tgid && (tgid) == kml_self_tgid) &&                      \
	 !(kml_filter_tgid && (tgid) != kml_filter_tgid) &&                  \
	 !(kml_filter_pid && (pid_expr) != kml_filter_pid) &&                \
	 !(kml_filter_cgroup_id && !(in_cgroup_expr)))

/* kml_wanted for a BTF pointer (a tp_btf argument, bpf_get_current_task_btf)
 * whose tgid the caller has already read: the pid and the cgroup are plain
 * loads too, where CO-RE reads make a helper call per field. */
static __always_inline bool kml_wanted_tgid(struct task_struct *task, __u32 tgid)
{
	return KML_WANTED(tgid, task->pid, kml_in_cgroup_btf(task));
}

/* True when events of this task pass the host's --tgid, --pid and --cgroup
 * filters and the task is not the collector itself. The checks are in the
 * kernel, so filtered-out events cost no ring space. Works on any task
 * pointer (CO-RE reads); kml_wanted_tgid is cheaper for a BTF pointer. */
static __always_inline bool kml_wanted(struct task_struct *task)
{
	__u32 tgid = BPF_CORE_READ(task, tgid);

	return KML_WANTED(tgid, BPF_CORE_READ(task, pid), kml_in_cgroup(task));
}

/* Counts `n` lost records of `table`. */
static __always_inline void kml_count_lost_n(__u32 table, __u64 n)
{
	__u64 *lost = bpf_map_lookup_elem(&kml_lost, &table);

	if (lost)
		*lost += n;
}

/* Counts a lost record of `table`. */
static __always_inline void kml_count_lost(__u32 table)
{
	kml_count_lost_n(table, 1);
}

/* Reserves a record for `table` (its index in the plugin's declaration),
 * counting a failure as a lost event. */
static __always_inline void *kml_reserve(void *ring, __u64 size, __u32 table)
{
	void *rec = bpf_ringbuf_reserve(ring, size, 0);

	if (!rec)
		kml_count_lost(table);
	return rec;
}

/* BPF_RB_FORCE_WAKEUP when the ring of `table` is past its fill
 * threshold, else BPF_RB_NO_WAKEUP (one helper call). */
static __always_inline __u64 kml_fill_flag(void *ring, __u32 table)
{
	__u64 threshold = table < KML_MAX_TABLES ? kml_wakeup_bytes[table] : 0;

	return bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA) >= threshold ? BPF_RB_FORCE_WAKEUP
									: BPF_RB_NO_WAKEUP;
}

/* The wake-up flag for a record of `table`: its ring's fill flag, checked
 * every kml_wakeup_mask[table] + 1 records only (a per-CPU count, no helper
 * call), since each check is a helper call on the hot path. */
static __always_inline __u64 kml_wakeup_flag(void *ring, __u32 table)
{
	__u32 slot = bpf_get_smp_processor_id() & (KML_SUBMIT_SLOTS - 1);
	__u32 mask = table < KML_MAX_TABLES ? kml_wakeup_mask[table] : 0;
	__u32 n = kml_submits[slot]++;

	if (n & mask)
		return BPF_RB_NO_WAKEUP;
	return kml_fill_flag(ring, table);
}

/* Submits a record of `table` reserved with kml_reserve, waking the
 * consumer only past its ring's fill threshold. */
static __always_inline void kml_submit(void *ring, void *rec, __u32 table)
{
	bpf_ringbuf_submit(rec, kml_wakeup_flag(ring, table));
}

/* Copies a record of `table` built on the stack into its ring in one
 * helper call (cheaper than reserve and submit for small records),
 * counting a failure as a lost event. */
static __always_inline void kml_output(void *ring, void *rec, __u64 size, __u32 table)
{
	if (bpf_ringbuf_output(ring, rec, size, kml_wakeup_flag(ring, table)) < 0)
		kml_count_lost(table);
}

/* Staged output: records of a high-rate table gathered per CPU and sent to
 * the ring KML_STAGE_BYTES at a time, one ring reservation per batch
 * instead of one per record. A program opts in by defining KML_STAGED
 * before including this file, writing with kml_stage_output, and naming its
 * rings in KML_FLUSH_PROGRAM.
 *
 * - A CPU's batch goes to the ring when it is full. The host sends partial
 *   batches that have waited too long: it reads each CPU's header
 *   (`kml_stage_head`: staged bytes and batches sent) and runs `kml_flush`
 *   on that CPU (BPF_PROG_TEST_RUN with BPF_F_TEST_RUN_ON_CPU), and on
 *   every CPU when the probe stops.
 * - `busy` is taken with an atomic exchange: a writer or flush that finds
 *   the stage taken (an interrupt, or a preempted writer on the same CPU)
 *   sends its record straight to the ring instead, so nothing waits on it.
 * - A sample in a staged ring holds a whole number of records; the host
 *   splits it. Records of one CPU stay in order; across CPUs they are
 *   ordered within one flush of the stage. */
#ifdef KML_STAGED

/* 8 KiB: a ring reservation and its commit cost a few hundred ns, so a
 * batch of 256 32-byte records makes that about 1 ns per record (2 KiB
 * batches cost a context switch of quanta_runtime ~7 ns more). */
#ifndef KML_STAGE_BYTES
#define KML_STAGE_BYTES 8192
#endif

struct kml_stage_head {
	__u32 busy;    /* a writer or flush holds the stage */
	__u32 len;     /* bytes staged */
	__u64 batches; /* batches sent to the ring */
};

struct kml_stage_data {
	__u8 bytes[KML_STAGE_BYTES];
};

/* One entry per table (the SDK sets max_entries to the table count). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, KML_MAX_TABLES);
	__type(key, __u32);
	__type(value, struct kml_stage_head);
} kml_stage_head SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, KML_MAX_TABLES);
	__type(key, __u32);
	__type(value, struct kml_stage_data);
} kml_stage_data SEC(".maps");

/* Sends `len` staged bytes of `table` (records of `size` bytes) in one
 * sample, waking the consumer past the ring's fill threshold. */
static __always_inline void kml_stage_send(void *ring, struct kml_stage_head *h,
					   struct kml_stage_data *d, __u32 len,
					   __u32 size, __u32 table, __u64 flags)
{
	if (len == 0 || len > KML_STAGE_BYTES)
		return;
	if (bpf_ringbuf_output(ring, d->bytes, len, flags) < 0)
		kml_count_lost_n(table, size ? len / size : 1);
	h->batches += 1;
}

/* Adds a record of `table` to this CPU's batch, sending the batch when the
 * next record would not fit. Falls back to kml_output when the stage is
 * taken or the record cannot be staged. */
static __always_inline void kml_stage_output(void *ring, void *rec, __u32 size, __u32 table)
{
	struct kml_stage_head *h = bpf_map_lookup_elem(&kml_stage_head, &table);
	struct kml_stage_data *d = bpf_map_lookup_elem(&kml_stage_data, &table);

	if (!kml_stage_on || !h || !d || size == 0 || size > KML_STAGE_BYTES) {
		kml_output(ring, rec, size, table);
		return;
	}
	if (__sync_lock_test_and_set(&h->busy, 1)) {
		kml_output(ring, rec, size, table);
		return;
	}
	__u32 len = h->len;
	if (len > KML_STAGE_BYTES - size) {
		/* Never with one record size per table (a full batch is sent
		 * below); bounds `len` for the verifier. */
		kml_stage_send(ring, h, d, len, size, table, kml_fill_flag(ring, table));
		len = 0;
	}
	__builtin_memcpy(d->bytes + len, rec, size);
	len += size;
	__u32 limit = table < KML_MAX_TABLES ? kml_stage_limit[table] : 0;
	if (limit == 0 || limit > KML_STAGE_BYTES)
		limit = KML_STAGE_BYTES;
	if (len + size > limit) {
		kml_stage_send(ring, h, d, len, size, table, kml_fill_flag(ring, table));
		len = 0;
	}
	h->len = len;
	asm volatile("" ::: "memory");
	h->busy = 0;
}

/* Sends this CPU's partial batch of `table` (records of `size` bytes);
 * used by the flush program. */
static __always_inline void kml_flush_table(void *ring, __u32 table, __u32 size)
{
	struct kml_stage_head *h = bpf_map_lookup_elem(&kml_stage_head, &table);
	struct kml_stage_data *d = bpf_map_lookup_elem(&kml_stage_data, &table);

	if (!h || !d || __sync_lock_test_and_set(&h->busy, 1))
		return;
	kml_stage_send(ring, h, d, h->len, size, table, BPF_RB_NO_WAKEUP);
	h->len = 0;
	asm volatile("" ::: "memory");
	h->busy = 0;
}

/* The program the host runs on a CPU to send its partial batches: `body`
 * calls kml_flush_table for every staged table. Never attached. */
#define KML_FLUSH_PROGRAM(body)            \
	SEC("raw_tp")                      \
	int kml_flush(void *ctx)           \
	{                                  \
		body;                      \
		return 0;                  \
	}

#endif /* KML_STAGED */

#endif /* KML_BPF_H */
