/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Records of the process_metadata probe, shared by kernel and user side. */
#ifndef PROCESS_METADATA_H
#define PROCESS_METADATA_H

#define PROCESS_METADATA_NAME_LEN 16      /* TASK_COMM_LEN */
#define PROCESS_METADATA_CMDLINE_LEN 4096 /* longest command line kept */
#define PROCESS_METADATA_CGROUP_LEN 512   /* longest cgroup path kept */

/* Values of source, in the order of the column's labels. */
#define PROCESS_METADATA_EXISTING 0 /* found in /proc when the probe started */
#define PROCESS_METADATA_NEW 1      /* fork or exec seen while collecting */

/* Table 0, process_metadata: one row per task found at start, and per task
 * created or program executed while collecting. The BPF side fills every
 * field but cgroup, which user space resolves from cgroup_id; user space
 * also turns the NULs between arguments of cmdline into spaces. */
struct process_metadata_event {
	__u64 ts_uptime_us;         /* when the row was recorded */
	__u64 start_time_uptime_us; /* when the task started (CLOCK_BOOTTIME) */
	__u64 cgroup_id;            /* cgroup v2 id (inode of its folder) */
	__u32 pid;                  /* thread id */
	__u32 tgid;                 /* process id */
	__u32 ppid;                 /* process id of the real parent */
	__s32 nice;                 /* static_prio - 120 */
	__u32 source;               /* PROCESS_METADATA_EXISTING or _NEW */
	__u8 cmdline_truncated;     /* 1: the arguments were longer than cmdline */
	__u8 _pad[3];
	char name[PROCESS_METADATA_NAME_LEN];        /* comm */
	char cmdline[PROCESS_METADATA_CMDLINE_LEN];  /* arguments */
	char cgroup[PROCESS_METADATA_CGROUP_LEN];    /* cgroup v2 path */
};

#endif
