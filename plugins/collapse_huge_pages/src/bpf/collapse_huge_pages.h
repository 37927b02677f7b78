/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Records of the collapse_huge_pages probe, shared by kernel and user side. */
#ifndef COLLAPSE_HUGE_PAGES_H
#define COLLAPSE_HUGE_PAGES_H

/* The kernel's enum scan_result (mm/khugepaged.c), by name, in the order of
 * the `status` column's labels (lower case, without SCAN_): the program
 * maps the kernel's value of each name to its position here with CO-RE, so
 * renumbering kernels still give the right label. The last four are names
 * other kernel versions have (page_ro, no_referenced_page, swap_cache_page:
 * older; page_dirty_or_writeback: newer). A value matching none of them is labelled `unknown`
 * (index COLLAPSE_STATUS_UNKNOWN) and kept as a number in status_code.
 * src/lib.rs checks that its labels follow this list. */
#define COLLAPSE_SCAN_RESULTS \
	X(SCAN_FAIL) \
	X(SCAN_SUCCEED) \
	X(SCAN_PMD_NULL) \
	X(SCAN_PMD_NONE) \
	X(SCAN_PMD_MAPPED) \
	X(SCAN_EXCEED_NONE_PTE) \
	X(SCAN_EXCEED_SWAP_PTE) \
	X(SCAN_EXCEED_SHARED_PTE) \
	X(SCAN_PTE_NON_PRESENT) \
	X(SCAN_PTE_UFFD_WP) \
	X(SCAN_PTE_MAPPED_HUGEPAGE) \
	X(SCAN_LACK_REFERENCED_PAGE) \
	X(SCAN_PAGE_NULL) \
	X(SCAN_SCAN_ABORT) \
	X(SCAN_PAGE_COUNT) \
	X(SCAN_PAGE_LRU) \
	X(SCAN_PAGE_LOCK) \
	X(SCAN_PAGE_ANON) \
	X(SCAN_PAGE_COMPOUND) \
	X(SCAN_ANY_PROCESS) \
	X(SCAN_VMA_NULL) \
	X(SCAN_VMA_CHECK) \
	X(SCAN_ADDRESS_RANGE) \
	X(SCAN_DEL_PAGE_LRU) \
	X(SCAN_ALLOC_HUGE_PAGE_FAIL) \
	X(SCAN_CGROUP_CHARGE_FAIL) \
	X(SCAN_TRUNCATED) \
	X(SCAN_PAGE_HAS_PRIVATE) \
	X(SCAN_STORE_FAILED) \
	X(SCAN_COPY_MC) \
	X(SCAN_PAGE_FILLED) \
	X(SCAN_PAGE_RO) \
	X(SCAN_NO_REFERENCED_PAGE) \
	X(SCAN_SWAP_CACHE_PAGE) \
	X(SCAN_PAGE_DIRTY_OR_WRITEBACK)

#define X(name) COLLAPSE_STATUS_##name,
enum collapse_status {
	COLLAPSE_SCAN_RESULTS
	COLLAPSE_STATUS_UNKNOWN
};
#undef X

/* The fields both records start with (the program's FILL_HEAD fills them). */
#define COLLAPSE_RECORD_HEAD                                                  \
	__u64 ts_uptime_us; /* when it ended (CLOCK_BOOTTIME, us) */            \
	__u32 pid;          /* thread id of the current task */                 \
	__u32 tgid;         /* process id of the current task */                \
	__u32 mm_tgid;      /* process owning the mm (0: unknown) */            \
	__u32 status;       /* enum collapse_status */                          \
	__s32 status_code;  /* the kernel's scan_result value */

/* Table 0, collapse_huge_page: one row per attempt to collapse a PMD range
 * of small pages into a huge page (khugepaged or MADV_COLLAPSE). */
struct collapse_huge_page_event {
	COLLAPSE_RECORD_HEAD
	__u8 isolated;      /* 1: the small pages were isolated */
	__u8 _pad[3];
};

/* Table 1, khugepaged_scan_pmd: one row per PMD range scanned for
 * collapse. */
struct khugepaged_scan_pmd_event {
	COLLAPSE_RECORD_HEAD
	__u32 referenced;   /* young (recently referenced) PTEs in the range */
	__u32 none_or_zero; /* empty or zero-page PTEs */
	__u32 unmapped;     /* swapped-out PTEs */
};

#endif
