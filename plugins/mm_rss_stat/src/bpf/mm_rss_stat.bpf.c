// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* mm_rss_stat: one row each time one of an mm's resident-page counters
 * changes (the kernel's rss_stat tracepoint), with all four counters of
 * that mm: file, anon, swap entries and shmem, in pages.
 *
 * Counters: since Linux 6.2 mm->rss_stat[] is an array of percpu_counter,
 * read as its `.count` (what the kernel itself reports in /proc/PID/status
 * and in the tracepoint: per-CPU deltas below the batch are not folded in).
 * Before, mm->rss_stat was a struct holding atomic_long_t count[]. Both
 * layouts are handled with CO-RE field checks.
 *
 * Counter indices are the kernel's anonymous enum (MM_FILEPAGES = 0,
 * MM_ANONPAGES, MM_SWAPENTS, MM_SHMEMPAGES), in this order since Linux 4.5;
 * an anonymous enum cannot be relocated by name, so the values come from
 * vmlinux.h and the header's MM_RSS_* must equal them (checked below). */
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
};

struct mm_struct___old {
	struct mm_rss_stat___old rss_stat;
};

/* Kernels since 6.2. */
struct mm_struct___new {
	struct percpu_counter rss_stat[NR_COUNTERS];
};

/* splitmix64's finaliser: a bijection, so distinct mms get distinct ids. */
static __always_inline __u64 mix(__u64 z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static __always_inline __u64 read_counter(struct mm_struct *mm, int i)
{
	long v = 0;

	if (i < 0 || i >= NR_COUNTERS)
		return 0;
	if (bpf_core_field_exists(((struct mm_struct___new *)0)->rss_stat)) {
		struct mm_struct___new *m = (void *)mm;
		v = BPF_CORE_READ(m, rss_stat[i].count);
	} else if (bpf_core_field_exists(((struct mm_struct___old *)0)->rss_stat)) {
		struct mm_struct___old *m = (void *)mm;
		v = BPF_CORE_READ(m, rss_stat.count[i].counter);
	}
	/* Per-CPU batching can leave a counter briefly below zero. */
	return v > 0 ? (__u64)v : 0;
}

_Static_assert(MM_FILEPAGES == MM_RSS_FILE && MM_ANONPAGES == MM_RSS_ANON &&
		       MM_SWAPENTS == MM_RSS_SWAP && MM_SHMEMPAGES == MM_RSS_SHMEM &&
		       NR_MM_COUNTERS == NR_COUNTERS,
	       "MM_RSS_* follow the kernel's mm counter indices");

SEC("tp_btf/rss_stat")
int BPF_PROG(handle_rss_stat, struct mm_struct *mm, int member)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct mm_rss_stat_event *e;
	__u64 addr = 0;

	if (!mm || !kml_wanted(task))
		return 0;
	e = kml_reserve(&events, sizeof(*e), TABLE_MM_RSS_STAT);
	if (!e)
		return 0; /* counted as lost by kml_reserve */
	e->ts_uptime_us = kml_now_us();
	/* The verifier allows no arithmetic on a trusted pointer: copy the
	 * argument out of the context as a plain number. */
	bpf_probe_read_kernel(&addr, sizeof(addr), &ctx[0]);
	e->mm_id = mix(addr ^ mm_id_key);
	e->file_pages = read_counter(mm, MM_RSS_FILE);
	e->anon_pages = read_counter(mm, MM_RSS_ANON);
	e->swap_pages = read_counter(mm, MM_RSS_SWAP);
	e->shmem_pages = read_counter(mm, MM_RSS_SHMEM);
	e->pid = task->pid;
	e->tgid = task->tgid;
	e->member = member >= 0 && member < NR_COUNTERS ? member : MM_RSS_UNKNOWN;
	e->_pad = 0;
	kml_submit(&events, e);
	return 0;
}
