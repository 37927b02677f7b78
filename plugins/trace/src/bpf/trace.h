/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The fetch plan of the trace plugin's generic programs, shared by the
 * kernel and user side: one `struct trace_slot` per traced event (the
 * `trace_slots` array, keyed by the slot the attach cookie names, and the
 * same in read-only data, `trace_plan`, for the raw tracepoint programs,
 * one per slot), each with up to TRACE_MAX_FIELDS fetches.
 *
 * A fetch starts from a base value: argument `arg` (for a classic
 * tracepoint, arg 0 is the record's address), then follows `nderefs`
 * pointers (v = *(u64 *)(v + derefs[i])) and does `op` at v + last.
 *
 * Record (little endian, the table's layout):
 *   0 ts_uptime_us u64 | 8 pid u32 | 12 tgid u32 | 16 cpu u32 |
 *   20 slot u16 (not a column: routes the record to its table) | 22 pad |
 *   24.. comm[16] when asked, latency_ns u64 for latency events, then the
 *   fields at the offsets the plan gives. */
#ifndef TRACE_H
#define TRACE_H

#define TRACE_MAX_SLOTS 16
#define TRACE_MAX_FIELDS 32
#define TRACE_MAX_DEREFS 8
/* Arguments copied from the context: raw tracepoints have at most 12. */
#define TRACE_MAX_ARGS 16
#define TRACE_ARG_RET 0xff
/* A record's largest size (a power of two). */
#define TRACE_MAX_RECORD 4096
/* The largest single read (string capacity). */
#define TRACE_MAX_READ 512
/* Entries of one thread in flight per latency event (recursion). */
#define TRACE_MAX_DEPTH 8

#define TRACE_SLOT_OFFSET 20
#define TRACE_HEADER_SIZE 24

enum trace_op {
	TRACE_OP_VALUE = 0,
	TRACE_OP_LOAD = 1,
	TRACE_OP_STR_VALUE = 2,
	TRACE_OP_STR_INLINE = 3,
	TRACE_OP_STR_PTR = 4,
	TRACE_OP_DYN_STR = 5,
	TRACE_OP_REL_STR = 6,
};

/* Slot flags. */
#define TRACE_COMM 1
#define TRACE_LATENCY 2
/* Count mode: the record is counted in `trace_counts`, not sent; the key
 * holds the header's pid, tgid and cpu only where these flags say. */
#define TRACE_COUNT 4
#define TRACE_KEY_PID 8
#define TRACE_KEY_TGID 16
#define TRACE_KEY_CPU 32

/* Count mode: the key is the record's TRACE_COUNT_KEY bytes from offset 8
 * (pid, tgid, cpu, the slot, comm when a key, the key fields); a joined
 * event's latency_ns is at 8 + TRACE_COUNT_KEY, outside it. */
#define TRACE_COUNT_KEY 128

/* Attach cookie of a tracepoint that ends a joined tracepoint event
 * (exit=): the slot | TRACE_EXIT_COOKIE. */
#define TRACE_EXIT_COOKIE 0x10000

/* Copies of the tracepoint programs: events one tracepoint can take. */
#define TRACE_COPIES 4

struct trace_fetch {
	__u32 last;
	__u32 derefs[TRACE_MAX_DEREFS];
	__u16 out;       /* offset of the value in the record */
	__u16 size;      /* bytes read, or the string's capacity */
	__u16 trunc_out; /* offset of the _truncated flag; 0: none */
	__u8 arg;        /* argument index, or TRACE_ARG_RET */
	__u8 nderefs;
	__u8 op;         /* enum trace_op */
	__u8 user;       /* read user memory */
	__u8 _pad[2];
};

struct trace_slot {
	__u32 nfields;
	__u32 record_size;
	__u32 flags;     /* TRACE_COMM, TRACE_LATENCY */
	__u32 nargs;     /* arguments the fields read */
	__u16 comm_out;
	__u16 latency_out;
	__u32 _pad;
	struct trace_fetch fields[TRACE_MAX_FIELDS];
};

/* A thread's entry to a latency event, waiting for its exit. */
struct trace_entry_key {
	__u64 pid_tgid;
	__u32 slot;
	__u32 depth;
};

struct trace_count_key {
	__u8 b[TRACE_COUNT_KEY];
};

/* Per key and CPU: count and total latency since the key's first event
 * (user space takes differences); least and greatest latency of the
 * events that saw the slot's generation gen[h], in half h = generation & 1
 * (user space starts a generation per interval, then reads the half no
 * longer written). Generations start at 1: a value zeroed by another
 * CPU's insert matches none. */
struct trace_count {
	__u64 count;
	__u64 total_ns;
	__u64 min_ns[2];
	__u64 max_ns[2];
	__u64 gen[2];
};

#endif
