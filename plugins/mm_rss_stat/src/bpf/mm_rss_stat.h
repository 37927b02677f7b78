/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Records of the mm_rss_stat probe, shared by kernel and user side. */
#ifndef MM_RSS_STAT_H
#define MM_RSS_STAT_H

/* Values of `member`, in the order of the column's labels. They are the
 * kernel's MM_FILEPAGES, MM_ANONPAGES, MM_SWAPENTS and MM_SHMEMPAGES, read
 * with CO-RE in the program, so a kernel that renumbers them still maps
 * to these. */
#define MM_RSS_FILE 0
#define MM_RSS_ANON 1
#define MM_RSS_SWAP 2
#define MM_RSS_SHMEM 3
#define MM_RSS_UNKNOWN 4

/* Table 0, mm_rss_stat: one row per change of an mm's rss counters. */
struct mm_rss_stat_event {
	__u64 ts_uptime_us; /* when the counter changed (CLOCK_BOOTTIME, us) */
	__u64 mm_id;        /* the mm, as a keyed hash of its address */
	__u64 file_pages;   /* MM_FILEPAGES after the change */
	__u64 anon_pages;   /* MM_ANONPAGES after the change */
	__u64 swap_pages;   /* MM_SWAPENTS after the change */
	__u64 shmem_pages;  /* MM_SHMEMPAGES after the change */
	__u32 pid;          /* thread id of the current task */
	__u32 tgid;         /* process id of the current task */
	__u32 member;       /* MM_RSS_*: the counter that changed */
	__u32 estimated;    /* bit 1 << MM_RSS_*: that counter is not exact */
};

#endif
