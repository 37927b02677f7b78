/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Types of the cpu_time probe, shared by kernel and user side. */
#ifndef CPU_TIME_H
#define CPU_TIME_H

#define CPU_TIME_COMM_LEN 16
#define CPU_TIME_CGROUP_LEN 128

/* Value of map tgid_time, keyed by process id (tgid). Written in the
 * kernel, read (and, for processes gone, deleted) in user space. */
struct cpu_time_value {
	__u64 cpu_ns;    /* on-CPU time since the probe started */
	__u64 cgroup_id; /* cgroup v2 id, at first switch and at exec */
	char comm[CPU_TIME_COMM_LEN]; /* the group leader's comm */
};

/* Processes whose time a CPU keeps before adding it to tgid_time. */
#define CPU_TIME_PENDING 8

/* Per CPU (map cpu_now): who runs there since when, the CPU's idle time,
 * and the time of the last few processes that ran here, not yet added to
 * tgid_time: a CPU that alternates between a few processes and idle, the
 * common case, touches no shared map at all. Times are the run queue's
 * task clock (ns). */
struct cpu_now {
	__u64 since_ns; /* run queue task clock at the last switch; 0: none */
	__u64 idle_ns;  /* the idle task's time on this CPU */
	__u64 pending_ns[CPU_TIME_PENDING];   /* time not yet in tgid_time */
	__u32 tgid;  /* who runs now; CPU_TIME_UNRECORDED: filtered out */
	__u32 evict; /* the pending slot to reuse next */
	__u32 pending_tgid[CPU_TIME_PENDING]; /* 0: slot free */
};

#define CPU_TIME_UNRECORDED 0xffffffffu

/* Table cpu_time: one row per process and interval, made in user space
 * from the maps. */
struct cpu_time_event {
	__u64 ts_uptime_us;  /* end of the interval */
	__u64 slot_start_us; /* start of the interval */
	__u64 cpu_time_us;   /* on-CPU time in the interval */
	__u64 cgroup_id;
	__u32 tgid; /* 0: the idle tasks */
	__u32 _pad;
	char comm[CPU_TIME_COMM_LEN];
	char cgroup[CPU_TIME_CGROUP_LEN];
};

#endif
