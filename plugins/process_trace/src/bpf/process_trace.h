/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Records of the process_trace probe, shared by kernel and user side. */
#ifndef PROCESS_TRACE_H
#define PROCESS_TRACE_H

#define PROCESS_TRACE_NAME_LEN 16 /* TASK_COMM_LEN */

/* Values of cap_type, in the order of the column's labels. */
#define PROCESS_TRACE_START 0 /* fork/clone: the new task */
#define PROCESS_TRACE_EXEC 1  /* execve: the task and its new comm */
#define PROCESS_TRACE_END 2   /* exit of a task (thread) */

/* Table 0, process_trace: one row per fork, exec or exit of a task. */
struct process_trace_event {
	__u64 ts_uptime_us; /* when it happened */
	__u32 pid;          /* thread id */
	__u32 tgid;         /* process id */
	__u32 cap_type;     /* PROCESS_TRACE_START, _EXEC or _END */
	char name[PROCESS_TRACE_NAME_LEN]; /* comm, NUL-terminated */
	__u32 _pad;
};

#endif
