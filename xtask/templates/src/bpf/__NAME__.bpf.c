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
 * are not available on every machine: load them only as an option
 * (bpf_program__set_autoload(false) by default), since one program that
 * fails to load fails the whole skeleton. */
#include "kml.bpf.h"
#include "__NAME__.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Index of each table in the plugin's declaration (src/lib.rs), used to
 * count lost records per table. */
#define TABLE_EVENTS 0

/* One ring buffer per table, named in `RINGS` in src/lib.rs, in table
 * order. The SDK sets its size before load. */
KML_RING(events);

/* Keep the record type in BTF so the skeleton generates it. */
struct __NAME___event __NAME___event_btf = {};

/* HOOK: change the section and the arguments to attach elsewhere. For a
 * tp_btf program the arguments are those of the tracepoint's TP_PROTO
 * (see include/trace/events/ in the kernel, or `bpftool btf dump`). */
SEC("tp_btf/sched_switch")
int BPF_PROG(handle_sched_switch, bool preempt, struct task_struct *prev,
	     struct task_struct *next, unsigned int prev_state)
{
	__u32 tgid = BPF_CORE_READ(next, tgid);

	/* Honour the host's --tgid/--pid/--cgroup filters. To leave out the
	 * collector's own threads too, add `|| tgid == kml_self_tgid`. */
	if (!kml_wanted(next))
		return 0;

	struct __NAME___event *e = kml_reserve(&events, sizeof(*e), TABLE_EVENTS);
	if (!e)
		return 0; /* counted as lost by kml_reserve */

	/* COLUMNS: set every field of the record (the ring buffer is not
	 * zeroed); a new field goes in __NAME__.h and in decl() in src/lib.rs. */
	e->ts_uptime_us = kml_now_us();
	e->cpu = bpf_get_smp_processor_id();
	e->pid = BPF_CORE_READ(next, pid);
	e->tgid = tgid;
	e->_pad = 0;
	kml_submit(&events, e);
	return 0;
}
