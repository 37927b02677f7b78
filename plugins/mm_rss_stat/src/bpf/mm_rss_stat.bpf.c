// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* mm_rss_stat: one row each time one of an mm's resident-page counters
 * changes (the kernel's rss_stat tracepoint), with all four counters of
 * that mm: file, anon, swap entries and shmem, in pages.
 *
 * The counter that changed is the value the kernel itself computed for the
 * tracepoint (its `size`, in bytes), read by a classic tracepoint program
 * (tp/kmem/rss_stat). That event names the mm only by an obfuscated hash,
 * so a raw tracepoint program (tp_btf/rss_stat) on the same event takes
 * the mm pointer, from which the other three counters are read. Both
 * halves of one event run in one thread on one CPU (the tracepoint keeps
 * preemption, or on PREEMPT_RT migration, off across its probes), in the
 * order the two probes were registered: the classic program's through its
 * perf event, which keeps the perf probe registered for the whole run, so
 * the order cannot change while both are attached. The second half joins
 * them (see second_half below); an event whose first half did not run is
 * counted as lost, never joined with another event's half.
 *
 * The other counters: since Linux 6.2 mm->rss_stat[] is an array of
 * percpu_counter, read as its `.count` (per-CPU deltas below the batch are
 * not folded in); before, mm->rss_stat was a struct holding atomic_long_t
 * count[]. Both layouts are handled with CO-RE field checks.
 *
 * Counter indices are the kernel's anonymous enum (MM_FILEPAGES = 0,
 * MM_ANONPAGES, MM_SWAPENTS, MM_SHMEMPAGES), in this order since Linux 4.5;
 * an anonymous enum cannot be relocated by name, so the values come from
 * vmlinux.h and the header's MM_RSS_* must equal them (checked below). */
/* A memory-touching burst makes hundreds of thousands of rows a second:
 * stage them per CPU. */
#define KML_STAGED
#include "kml.bpf.h"
#include "mm_rss_stat.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define TABLE_MM_RSS_STAT 0
#define NR_COUNTERS 4

/* Key of the mm_id hash, random per collection (set by user space). */
const volatile __u64 mm_id_key = 0;

KML_RING(events);

/* Keep the record type in BTF so the skeleton generates it. */
struct mm_rss_stat_event mm_rss_stat_event_btf = {};

/* Kernels before 6.2: struct mm_rss_stat { atomic_long_t count[]; }. */
struct mm_rss_stat___old {
	atomic_long_t count[NR_COUNTERS];
} __attribute__((preserve_access_index));

struct mm_struct___old {
	struct mm_rss_stat___old rss_stat;
} __attribute__((preserve_access_index));

/* Kernels since 6.2. */
struct mm_struct___new {
	struct percpu_counter rss_stat[NR_COUNTERS];
} __attribute__((preserve_access_index));

/* splitmix64's finaliser: a bijection, so distinct mms get distinct ids. */
static __always_inline __u64 mix(__u64 z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* One counter of the mm, through its BTF pointer (the raw tracepoint's
 * argument): plain loads, no helper calls. `i` must be a constant. */
static __always_inline __u64 read_counter(struct mm_struct *mm, int i)
{
	long v = 0;

	if (i < 0 || i >= NR_COUNTERS)
		return 0;
	if (bpf_core_field_exists(((struct mm_struct___new *)0)->rss_stat)) {
		struct mm_struct___new *m = (void *)mm;
		v = m->rss_stat[i].count;
	} else if (bpf_core_field_exists(((struct mm_struct___old *)0)->rss_stat)) {
		struct mm_struct___old *m = (void *)mm;
		v = m->rss_stat.count[i].counter;
	}
	/* Per-CPU batching can leave a counter briefly below zero. */
	return v > 0 ? (__u64)v : 0;
}

/* The four counters, in pages, indexed by MM_RSS_*. */
struct counters {
	__u64 pages[NR_COUNTERS];
};

static __always_inline void read_counters(struct mm_struct *mm, struct counters *c)
{
	c->pages[MM_RSS_FILE] = read_counter(mm, MM_RSS_FILE);
	c->pages[MM_RSS_ANON] = read_counter(mm, MM_RSS_ANON);
	c->pages[MM_RSS_SWAP] = read_counter(mm, MM_RSS_SWAP);
	c->pages[MM_RSS_SHMEM] = read_counter(mm, MM_RSS_SHMEM);
}

_Static_assert(MM_FILEPAGES == MM_RSS_FILE && MM_ANONPAGES == MM_RSS_ANON &&
		       MM_SWAPENTS == MM_RSS_SWAP && MM_SHMEMPAGES == MM_RSS_SHMEM &&
		       NR_MM_COUNTERS == NR_COUNTERS,
	       "MM_RSS_* follow the kernel's mm counter indices");

/* Page size as a shift, set by user space. */
const volatile __u32 page_shift = 12;

/* Which half of an event runs first is fixed for a run (the order the two
 * probes were registered in) but not known in advance. Until the first
 * join shows it, a half joins only a half of the other kind from the same
 * thread at most KML_PAIR_NS old; once known, the second half joins only
 * the first half of the same thread, however long an interrupt kept them
 * apart, and never waits itself: after a missed first half, it cannot pair
 * with the next event's (which would give that event this one's value). */
#define KML_PAIR_NS 50000
#define HALF_RAW 1
#define HALF_CLASSIC 2
/* The kind of half that runs second: 0 until the first join. */
__u32 second_half = 0;

/* One event's first half, per CPU, until its second half arrives. */
struct half {
	__u64 ns;     /* when it ran, while the order is not known */
	__u64 mm;     /* the mm's address, from a raw half */
	struct counters counters; /* the mm's counters, from a raw half */
	__s64 size;   /* the counter's value in bytes, from a classic half */
	__s32 member;
	__u32 tid;    /* thread that ran it */
	__u32 kind;   /* HALF_RAW, HALF_CLASSIC or 0: none waiting */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct half);
} halves SEC(".maps");

/* Both halves run after the counter changed and before anything else can
 * change the mm's counters on this CPU, so the raw half's reading of the
 * other three is the event's, whichever half runs second. */
static __always_inline void emit(struct task_struct *task, __u64 addr, int member,
				 __s64 size_bytes, const struct counters *c)
{
	struct mm_rss_stat_event rec = {}, *e = &rec;

	e->ts_uptime_us = kml_now_us();
	e->mm_id = mix(addr ^ mm_id_key);
	e->file_pages = c->pages[MM_RSS_FILE];
	e->anon_pages = c->pages[MM_RSS_ANON];
	e->swap_pages = c->pages[MM_RSS_SWAP];
	e->shmem_pages = c->pages[MM_RSS_SHMEM];
	/* The changed counter as the kernel computed it for the event. */
	__u64 pages = size_bytes > 0 ? (__u64)size_bytes >> page_shift : 0;
	switch (member) {
	case MM_RSS_FILE:
		e->file_pages = pages;
		break;
	case MM_RSS_ANON:
		e->anon_pages = pages;
		break;
	case MM_RSS_SWAP:
		e->swap_pages = pages;
		break;
	case MM_RSS_SHMEM:
		e->shmem_pages = pages;
		break;
	}
	e->pid = task->pid;
	e->tgid = task->tgid;
	e->member = member >= 0 && member < NR_COUNTERS ? member : MM_RSS_UNKNOWN;
	kml_stage_output(&events, e, sizeof(*e), TABLE_MM_RSS_STAT);
}

KML_FLUSH_PROGRAM(kml_flush_table(&events, TABLE_MM_RSS_STAT, sizeof(struct mm_rss_stat_event)))

static __always_inline struct half *this_cpu_half(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&halves, &zero);
}

/* Takes the waiting half that is this event's other half, if any: from the
 * same thread, for the same counter, and of the other kind. Returns
 * nonzero when it was taken. */
static __always_inline int take_other_half(struct half *h, __u32 kind, __u32 tid, int member)
{
	__u32 second = second_half;

	if (h->kind != 0 && h->kind != kind && h->tid == tid && h->member == member &&
	    (second == kind || (second == 0 && bpf_ktime_get_ns() - h->ns < KML_PAIR_NS))) {
		h->kind = 0;
		if (second == 0)
			second_half = kind;
		return 1;
	}
	return 0;
}

/* Leaves this half waiting for its other half, unless it is known to be an
 * event's second half, whose first half did not run: that event is lost. */
static __always_inline struct half *wait_for_other_half(struct half *h, __u32 kind, __u32 tid,
						       int member)
{
	__u32 second = second_half;

	if (second == kind) {
		h->kind = 0;
		kml_count_lost(TABLE_MM_RSS_STAT);
		return 0;
	}
	h->kind = kind;
	/* The time only matters until the order is known. */
	if (second == 0)
		h->ns = bpf_ktime_get_ns();
	h->tid = tid;
	h->member = member;
	return h;
}

SEC("tp_btf/rss_stat")
int BPF_PROG(handle_rss_stat_raw, struct mm_struct *mm, int member)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct half *h = this_cpu_half();
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct counters c;
	__u64 addr = 0;

	if (!h || !mm || !kml_wanted_tgid(task, task->tgid))
		return 0;
	/* The verifier allows no arithmetic on a trusted pointer: copy the
	 * argument out of the context as a plain number. */
	bpf_probe_read_kernel(&addr, sizeof(addr), &ctx[0]);
	read_counters(mm, &c);
	if (take_other_half(h, HALF_RAW, tid, member)) {
		emit(task, addr, member, h->size, &c);
		return 0;
	}
	h = wait_for_other_half(h, HALF_RAW, tid, member);
	if (h) {
		h->mm = addr;
		h->counters = c;
	}
	return 0;
}

SEC("tp/kmem/rss_stat")
int handle_rss_stat(struct trace_event_raw_rss_stat *ctx)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct half *h = this_cpu_half();
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	int member = ctx->member;
	__s64 size = ctx->size;

	if (!h || !kml_wanted_tgid(task, task->tgid))
		return KML_TP_PASS;
	if (take_other_half(h, HALF_CLASSIC, tid, member)) {
		emit(task, h->mm, member, size, &h->counters);
		return KML_TP_PASS;
	}
	h = wait_for_other_half(h, HALF_CLASSIC, tid, member);
	if (h)
		h->size = size;
	return KML_TP_PASS;
}
