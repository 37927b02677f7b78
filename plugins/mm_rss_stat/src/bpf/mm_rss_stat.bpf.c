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
 * The other counters are carried per mm (see `carried`): exact, as the
 * kernel's own sums. Since Linux 6.2 mm->rss_stat[] is an array of
 * percpu_counter, summed over its per-CPU deltas at an mm's first event;
 * before, mm->rss_stat was a struct holding atomic_long_t count[]. Both
 * layouts are handled with CO-RE field checks.
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
/* Possible CPUs (the highest possible CPU + 1), set by user space. */
const volatile __u32 nr_cpus = 1;

/* Each counter's last exact value per mm, keyed by the mm's address.
 *
 * Every change of a counter fires the tracepoint with the counter's exact
 * value, so once an mm's four values are known, carrying each one from its
 * last event keeps all four exact. They become known at the mm's first
 * event seen: the changed one from the event, the other three summed from
 * the per-CPU counter (its global count plus every CPU's pending delta,
 * what percpu_counter_sum, /proc/PID/status and the tracepoint read).
 *
 * An entry is deleted when all four reach zero (an mm's teardown at exit
 * or exec ends so; the kernel checks it when the mm is freed), so a freed
 * mm's address reused by a new mm starts fresh. When an event is missed
 * (a half of it did not run) the carried value of its counter would be
 * stale: carry_gen moves on, and every entry of an older generation is
 * summed again at its next event. LRU: an entry evicted from a full map is
 * summed again at its mm's next event, exact all the same. */
struct carry {
	__u64 pages[NR_COUNTERS];
	__u32 gen;
	__u32 estimated; /* bit per counter: not exact, see the README */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); /* the mm's address */
	__type(value, struct carry);
} carried SEC(".maps");

__u32 carry_gen = 0;

/* Only its per-CPU addresses are used: they give each CPU's per-CPU offset
 * (the address of its copy minus the per-CPU pointer the map holds). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} cpu_probe SEC(".maps");

/* A pointer's value as a plain number, which the verifier allows no
 * arithmetic on otherwise: copied through a read of the stack slot. */
static __always_inline __u64 ptr_value(const void *p)
{
	const void *slot = p;
	__u64 n = 0;

	bpf_probe_read_kernel(&n, sizeof(n), &slot);
	return n;
}

struct sum_ctx {
	__u64 counters; /* the percpu_counter's per-CPU pointer */
	__u64 base;     /* cpu_probe's per-CPU pointer */
	__s64 sum;
	__u32 failed;
};

static long add_cpu(__u64 cpu, void *data)
{
	struct sum_ctx *s = data;
	__u32 zero = 0;
	void *mine = bpf_map_lookup_percpu_elem(&cpu_probe, &zero, (__u32)cpu);
	__s32 delta = 0;

	if (!mine) {
		s->failed = 1;
		return 1;
	}
	if (bpf_probe_read_kernel(&delta, sizeof(delta),
				  (void *)(s->counters + (ptr_value(mine) - s->base)))) {
		s->failed = 1;
		return 1;
	}
	s->sum += delta;
	return 0;
}

/* Counter `k` of the mm at `mm`, read by address (`k` is not a constant
 * here): its exact value, the per-CPU counter's sum. A CPU folding its
 * delta into the global count during the sum would count it twice or not
 * at all: the count is read before and after, and the sum tried again when
 * it moved. When it cannot be exact, the global count, with `*estimated`
 * set. A global function, verified once on its own. */
__noinline __u64 mm_rss_stat_exact_counter(__u64 mm, __u32 k, __u64 base, __u32 *estimated)
{
	__s64 count = 0;

	if (!estimated)
		return 0;
	k &= NR_COUNTERS - 1;
	if (bpf_core_field_exists(((struct mm_struct___new *)0)->rss_stat)) {
		__u64 pc = mm + bpf_core_field_offset(((struct mm_struct___new *)0)->rss_stat) +
			   k * bpf_core_type_size(struct percpu_counter);
		__u64 at_count = pc + bpf_core_field_offset(((struct percpu_counter *)0)->count);
		struct sum_ctx s = {};
		__s64 after = 0;

		bpf_probe_read_kernel(&count, sizeof(count), (void *)at_count);
		if (base &&
		    !bpf_probe_read_kernel(&s.counters, sizeof(s.counters),
					   (void *)(pc + bpf_core_field_offset(
								 ((struct percpu_counter *)0)->counters)))) {
			s.base = base;
			for (int attempt = 0; attempt < 3; attempt++) {
				s.sum = count;
				s.failed = 0;
				bpf_loop(nr_cpus, add_cpu, &s, 0);
				bpf_probe_read_kernel(&after, sizeof(after), (void *)at_count);
				if (!s.failed && after == count)
					return s.sum > 0 ? (__u64)s.sum : 0;
				count = after;
			}
		}
		*estimated |= 1u << k;
	} else if (bpf_core_field_exists(((struct mm_struct___old *)0)->rss_stat)) {
		/* Before 6.2 the counter is one atomic value: exact as it is. */
		bpf_probe_read_kernel(&count, sizeof(count),
				      (void *)(mm +
					       bpf_core_field_offset(((struct mm_struct___old *)0)->rss_stat) +
					       k * sizeof(atomic_long_t)));
	} else {
		*estimated |= 1u << k;
	}
	return count > 0 ? (__u64)count : 0;
}

/* Sums the counters of an mm seen for the first time (or whose carried
 * values are of an older generation) into `c`, all but `member`, whose
 * value comes from the event. A global function: the verifier checks it
 * once, on its own, not at every place that calls it. */
__noinline int mm_rss_stat_carry_init(__u64 mm, int member, struct carry *c)
{
	if (!c)
		return 0;
	__u64 base = 0, map = ptr_value(&cpu_probe);

	/* cpu_probe's per-CPU pointer, from the kernel's struct bpf_array. */
	if (map)
		bpf_probe_read_kernel(&base, sizeof(base),
				      (void *)(map + bpf_core_field_offset(
							     ((struct bpf_array *)0)->pptrs)));
	c->estimated = 0;
	for (__u32 k = 0; k < NR_COUNTERS; k++) {
		if ((int)k == member)
			continue;
		c->pages[k] = mm_rss_stat_exact_counter(mm, k, base, &c->estimated);
	}
	return 0;
}

/* The carried values of `mm`, set up at its first event (only for an mm a
 * wanted task changes: `create`); NULL when it is not carried. */
static __always_inline struct carry *carry_of(__u64 addr, int member, bool create)
{
	struct carry *c = bpf_map_lookup_elem(&carried, &addr);
	__u32 gen = carry_gen;
	struct carry fresh = {};

	if (c && c->gen == gen)
		return c;
	if (!c && !create)
		return 0;
	mm_rss_stat_carry_init(addr, member, &fresh);
	fresh.gen = gen;
	if (c) {
		*c = fresh;
		return c;
	}
	/* Another CPU may have set it up meanwhile: keep that one. */
	bpf_map_update_elem(&carried, &addr, &fresh, BPF_NOEXIST);
	return bpf_map_lookup_elem(&carried, &addr);
}

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
	struct counters counters; /* shared counts, from a raw half, when not carried */
	__s64 size;   /* the counter's value in bytes, from a classic half */
	__s32 member;
	__u32 tid;    /* thread that ran it */
	__u32 kind;   /* HALF_RAW, HALF_CLASSIC or 0: none waiting */
	__u32 wanted; /* from a raw half: the task passes the host's filters */
	__u32 carried; /* from a raw half: the mm has an entry in `carried` */
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct half);
} halves SEC(".maps");

KML_FLUSH_PROGRAM(kml_flush_table(&events, TABLE_MM_RSS_STAT, sizeof(struct mm_rss_stat_event)))

/* Stages one row. A global function, verified once on its own rather than
 * with every path of its caller. */
__noinline int mm_rss_stat_stage_row(struct mm_rss_stat_event *e)
{
	if (!e)
		return 0;
	kml_stage_output(&events, e, sizeof(*e), TABLE_MM_RSS_STAT);
	return 0;
}

/* The event's row: the changed counter is the value the kernel computed
 * for the event; it is carried for the mm, and the other three are the
 * carried ones. Without an entry (`c` NULL: the map could not take it),
 * the other three are the shared counts in `shared`, marked estimated. */
static __always_inline void record(struct task_struct *task, struct carry *c, __u64 addr,
				   int member, __s64 size_bytes, bool wanted,
				   const struct counters *shared)
{
	struct mm_rss_stat_event rec = {}, *e = &rec;
	__u64 pages = size_bytes > 0 ? (__u64)size_bytes >> page_shift : 0;
	int known = member >= 0 && member < NR_COUNTERS;

	if (c) {
		if (known) {
			c->pages[member & (NR_COUNTERS - 1)] = pages;
			c->estimated &= ~(1u << member);
		}
		e->file_pages = c->pages[MM_RSS_FILE];
		e->anon_pages = c->pages[MM_RSS_ANON];
		e->swap_pages = c->pages[MM_RSS_SWAP];
		e->shmem_pages = c->pages[MM_RSS_SHMEM];
		e->estimated = c->estimated;
		/* Torn down (exit, exec): forget it. */
		if (!(e->file_pages | e->anon_pages | e->swap_pages | e->shmem_pages))
			bpf_map_delete_elem(&carried, &addr);
	} else {
		if (!wanted)
			return;
		e->file_pages = shared->pages[MM_RSS_FILE];
		e->anon_pages = shared->pages[MM_RSS_ANON];
		e->swap_pages = shared->pages[MM_RSS_SWAP];
		e->shmem_pages = shared->pages[MM_RSS_SHMEM];
		e->estimated = (1u << NR_COUNTERS) - 1;
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
		if (known)
			e->estimated &= ~(1u << member);
	}
	if (!wanted)
		return;
	e->ts_uptime_us = kml_now_us();
	e->mm_id = mix(addr ^ mm_id_key);
	e->pid = task->pid;
	e->tgid = task->tgid;
	e->member = known ? member : MM_RSS_UNKNOWN;
	mm_rss_stat_stage_row(e);
}

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
 * event's second half, whose first half did not run: that event is lost
 * (counted when its task is wanted). A waiting half replaced by this one
 * is an event whose second half did not run. Either way a counter changed
 * unseen: the carried values start a new generation. */
static __always_inline struct half *wait_for_other_half(struct half *h, __u32 kind, __u32 tid,
						       int member, struct task_struct *task)
{
	__u32 second = second_half;

	if (second == kind) {
		h->kind = 0;
		__sync_fetch_and_add(&carry_gen, 1);
		if (kml_wanted_tgid(task, task->tgid))
			kml_count_lost(TABLE_MM_RSS_STAT);
		return 0;
	}
	if (h->kind != 0)
		__sync_fetch_and_add(&carry_gen, 1);
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
	struct counters shared = {};
	struct carry *c;
	__u64 addr = 0;
	bool wanted;
	int joined;

	if (!h || !mm)
		return 0;
	/* The verifier allows no arithmetic on a trusted pointer: copy the
	 * argument out of the context as a plain number. */
	bpf_probe_read_kernel(&addr, sizeof(addr), &ctx[0]);
	joined = take_other_half(h, HALF_RAW, tid, member);
	if (!joined) {
		h = wait_for_other_half(h, HALF_RAW, tid, member, task);
		if (!h)
			return 0;
	}
	wanted = kml_wanted_tgid(task, task->tgid);
	c = carry_of(addr, member, wanted);
	if (joined) {
		/* The classic half ran first: this event's value waits in h. */
		if (!c && wanted)
			read_counters(mm, &shared);
		record(task, c, addr, member, h->size, wanted, &shared);
		return 0;
	}
	h->mm = addr;
	h->wanted = wanted;
	h->carried = c != 0;
	if (!c && wanted)
		read_counters(mm, &h->counters);
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
	struct carry *c = 0;
	__u64 addr;

	if (!h)
		return KML_TP_PASS;
	if (take_other_half(h, HALF_CLASSIC, tid, member)) {
		addr = h->mm;
		if (h->carried)
			c = bpf_map_lookup_elem(&carried, &addr);
		record(task, c, addr, member, size, h->wanted, &h->counters);
		return KML_TP_PASS;
	}
	h = wait_for_other_half(h, HALF_CLASSIC, tid, member, task);
	if (h)
		h->size = size;
	return KML_TP_PASS;
}
