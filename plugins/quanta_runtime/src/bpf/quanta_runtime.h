/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Records of the quanta_runtime probe, shared by kernel and user side. */
#ifndef QUANTA_RUNTIME_H
#define QUANTA_RUNTIME_H

/* Table 0, quanta_runtime: one row per context switch away from a task. */
struct quanta_runtime_event {
	__u64 ts_uptime_us;         /* when the quantum ended */
	__u64 quanta_run_length_us; /* how long the task ran */
	__u32 cpu;
	__u32 pid;  /* thread id */
	__u32 tgid; /* process id */
	__u32 _pad;
};

/* Table 1, quanta_queued_time: one row per switch to a task that waited. */
struct quanta_queued_event {
	__u64 ts_uptime_us;          /* when the task got the CPU */
	__u64 quanta_queued_time_us; /* how long it waited runnable */
	__u32 cpu;
	__u32 pid;
	__u32 tgid;
	__u32 _pad;
};

#endif
