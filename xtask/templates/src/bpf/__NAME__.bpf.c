// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* __NAME__: __DESCRIPTION__
 *
 * Scaffolded by `cargo xtask new-plugin`: one row per context switch, from
 * the scheduler's sched_switch tracepoint (tp_btf, typed arguments). It
 * works as is on any kernel with BTF; replace the hook and the record with
 * what this probe should measure.
 *
 * Hooks that work everywhere: tp_btf/<tracepoint> (typed args, BTF),
 * raw_tp/<tracepoint>, tp/<category>/<name> (needs tracefs). fentry/kprobe
 * are not available on every machine: decide before load, in a
 * `before_load` hook (`hooks: custom` in src/lib.rs), with the feature
 * checks it is given, and turn the program off (`set_autoload(false)`)
 * where it cannot load: one program that fails to load fails the whole
 * skeleton. */
#include "kml.bpf.h"
#include "__NAME__.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Index of each table in the plugin's declaration (src/lib.rs), used to
 * count lost records per table. */
#define TABLE_EVENTS 0

/* One ring buffer per table, named next to its table in src/lib.rs. The
 * SDK sets its size before load. */
KML_RING(events);

/* Keep the record type in BTF so the skeleton generates it. */
struct __NAME___event __NAME___event_btf = {};

/* HOOK: change the section and the arguments to attach elsewhere. For a
 * tp_btf program the arguments are those of the tracepoint's TP_PROTO:
 * vmlinux.h has them as `typedef void (*btf_trace_<name>)(void *, ...)`
 * (grep 'btf_trace_sched_switch)' in the vmlinux.h kernmlops-plugin-build
 * carries, or `bpftool btf dump file /sys/kernel/btf/vmlinux format c`);
 * the first `void *` is the context, the rest are the arguments. */
SEC("tp_btf/sched_switch")
int BPF_PROG(handle_sched_switch, bool preempt, struct task_struct *prev,
	     struct task_struct *next, unsigned int prev_state)
{
	/* `next` is a BTF pointer: its fields are plain loads (next->tgid),
	 * where BPF_CORE_READ(next, tgid) would make a helper call. */
	__u32 tgid = next->tgid;

	/* The host's --tgid/--pid/--cgroup filters, and the collector itself
	 * left out unless --include-self. */
	if (!kml_wanted_tgid(next, tgid))
		return 0;

	struct __NAME___event *e = kml_reserve(&events, sizeof(*e), TABLE_EVENTS);
	if (!e)
		return 0; /* counted as lost by kml_reserve */

	/* COLUMNS: set every field of the record (the ring buffer is not
	 * zeroed); a new field goes in __NAME__.h and in the table's columns
	 * in src/lib.rs. */
	e->ts_uptime_us = kml_now_us();
	e->cpu = bpf_get_smp_processor_id();
	e->pid = next->pid;
	e->tgid = tgid;
	e->_pad = 0;
	kml_submit(&events, e, TABLE_EVENTS);
	return 0;
}

/* A table that takes a row per context switch or faster can save most of
 * the ring's cost per row by staging rows per CPU: `#define KML_STAGED`
 * before including kml.bpf.h, build the record on the stack and write it
 * with kml_stage_output(&events, &rec, sizeof(rec), TABLE_EVENTS), and add
 *   KML_FLUSH_PROGRAM(kml_flush_table(&events, TABLE_EVENTS,
 *                                     sizeof(struct __NAME___event)))
 * so the host can send a quiet CPU's partial batch (see quanta_runtime). */
