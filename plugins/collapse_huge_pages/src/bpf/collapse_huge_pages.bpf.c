// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* collapse_huge_pages: huge page collapses and the PMD scans that lead to
 * them, from khugepaged's background work and from madvise(MADV_COLLAPSE).
 *
 * - mm_collapse_huge_page(mm, isolated, status): one attempt to replace a
 *   PMD range of small anonymous pages with a huge page.
 * - mm_khugepaged_scan_pmd(mm, folio, referenced, none_or_zero, status,
 *   unmapped): one PMD range scanned for collapse (Linux 6.5+ arguments;
 *   older kernels had a `writable` argument after the page, recognised
 *   with CO-RE and skipped).
 *
 * Rows carry the current task (khugepaged itself for background work, the
 * caller for MADV_COLLAPSE) and the process owning the mm (mm->owner, with
 * CONFIG_MEMCG). The host's filters apply to the owner when it is known,
 * so --tgid keeps khugepaged's work on that process. */
#include "kml.bpf.h"
#include "collapse_huge_pages.h"

/* Fills the fields both records start with: the time, the current task,
 * the mm's owner, and the outcome `status` (the kernel's scan_result). */
#define FILL_HEAD(e, task, owner, status)                                     \
	do {                                                                  \
		(e)->ts_uptime_us = kml_now_us();                             \
		(e)->pid = (task)->pid;                                       \
		(e)->tgid = (task)->tgid;                                     \
		(e)->mm_tgid = (owner) ? BPF_CORE_READ((owner), tgid) : 0;    \
		(e)->status = status_index(status);                           \
		(e)->status_code = (status);                                  \
	} while (0)

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define TABLE_COLLAPSE 0
#define TABLE_SCAN 1

KML_RING(collapse_ring);
KML_RING(scan_ring);

/* Keep the record types in BTF so the skeleton generates them. */
struct collapse_huge_page_event collapse_huge_page_event_btf = {};
struct khugepaged_scan_pmd_event khugepaged_scan_pmd_event_btf = {};

/* Every scan_result name this program knows, flavoured so that CO-RE
 * matches them by name against the running kernel's enum scan_result
 * (libbpf ignores the ___k suffix). */
#define X(name) name##___k,
enum scan_result___k { COLLAPSE_SCAN_RESULTS };
#undef X

/* The scan event's record before Linux 6.5 had a `writable` field, as its
 * prototype had a `bool writable` argument after the page: the field
 * tells which prototype the running kernel has. */
struct trace_event_raw_mm_khugepaged_scan_pmd___old {
	bool writable;
};

static __always_inline __u32 status_index(int code)
{
#define X(name)                                                                  \
	if (bpf_core_enum_value_exists(enum scan_result___k, name##___k) &&      \
	    code == bpf_core_enum_value(enum scan_result___k, name##___k))       \
		return COLLAPSE_STATUS_##name;
	COLLAPSE_SCAN_RESULTS
#undef X
	return COLLAPSE_STATUS_UNKNOWN;
}

/* The process owning `mm`: mm->owner where the kernel has it (CONFIG_MEMCG),
 * else NULL. */
static __always_inline struct task_struct *mm_owner(struct mm_struct *mm)
{
	if (bpf_core_field_exists(mm->owner))
		return BPF_CORE_READ(mm, owner);
	return NULL;
}

/* The task the host's filters apply to: the owner, or the current task. */
static __always_inline bool wanted(struct task_struct *owner, struct task_struct *current)
{
	return kml_wanted(owner ? owner : current);
}

SEC("tp_btf/mm_collapse_huge_page")
int BPF_PROG(handle_collapse_huge_page, struct mm_struct *mm, int isolated, int status)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct task_struct *owner = mm_owner(mm);
	struct collapse_huge_page_event *e;

	if (!wanted(owner, task))
		return 0;
	e = kml_reserve(&collapse_ring, sizeof(*e), TABLE_COLLAPSE);
	if (!e)
		return 0;
	__builtin_memset(e, 0, sizeof(*e));
	FILL_HEAD(e, task, owner, status);
	e->isolated = isolated != 0;
	kml_submit(&collapse_ring, e, TABLE_COLLAPSE);
	return 0;
}

SEC("tp_btf/mm_khugepaged_scan_pmd")
int BPF_PROG(handle_khugepaged_scan_pmd, struct mm_struct *mm)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct task_struct *owner = mm_owner(mm);
	struct khugepaged_scan_pmd_event *e;
	int referenced, none_or_zero, status, unmapped;

	/* The arguments after the page moved by one when `writable` went.
	 * The verifier allows only constant offsets into the context, so the
	 * arguments are copied out first and picked from the copy. */
	__u64 args[8] = {};
	int first = 2;

	if (bpf_core_field_exists(struct trace_event_raw_mm_khugepaged_scan_pmd___old,
				  writable)) {
		bpf_probe_read_kernel(args, 7 * sizeof(__u64), ctx);
		first = 3;
	} else {
		bpf_probe_read_kernel(args, 6 * sizeof(__u64), ctx);
	}
	referenced = (int)args[first & 7];
	none_or_zero = (int)args[(first + 1) & 7];
	status = (int)args[(first + 2) & 7];
	unmapped = (int)args[(first + 3) & 7];
	if (!wanted(owner, task))
		return 0;
	e = kml_reserve(&scan_ring, sizeof(*e), TABLE_SCAN);
	if (!e)
		return 0;
	FILL_HEAD(e, task, owner, status);
	e->referenced = referenced;
	e->none_or_zero = none_or_zero;
	e->unmapped = unmapped;
	kml_submit(&scan_ring, e, TABLE_SCAN);
	return 0;
}
