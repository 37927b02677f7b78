/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Records of the __NAME__ probe, shared by kernel and user side.
 *
 * The Rust side gets this struct from the skeleton
 * (`skel::types::__NAME___event`) and declares its columns in src/lib.rs;
 * never copy it by hand.
 *
 * To add a column: add a field here, fill it in __NAME__.bpf.c, add its
 * line to the table in src/lib.rs. Keep fields in descending size (u64 first)
 * and pad explicitly to a multiple of 8 bytes, so the layout is the same in
 * BPF and in Rust and no byte is left uninitialised. */
#ifndef __NAME_UPPER___H
#define __NAME_UPPER___H

/* Table 0, __NAME__: one row per context switch. */
struct __NAME___event {
	__u64 ts_uptime_us; /* when the switch happened (CLOCK_BOOTTIME, us) */
	__u32 cpu;          /* CPU the switch happened on */
	__u32 pid;          /* thread id of the task switched in */
	__u32 tgid;         /* process id of the task switched in */
	__u32 _pad;         /* keeps the record a multiple of 8 bytes */
};

#endif
