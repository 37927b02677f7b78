// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* block_io: one row per completed block request, joined in the kernel.
 *
 * block_rq_issue (request handed to the driver) stores the issue time and
 * what the request is (disk, sector, size, flags, issuing task) in
 * `inflight`, keyed by the request pointer, and counts it in its disk's
 * queue depth. block_rq_complete looks it up, emits the row with the
 * latency, takes it off the depth and deletes the entry. block_rq_requeue
 * (request sent back to the queue) also takes it off, so the re-issue is
 * counted once, and remembers its submitter for the re-issue.
 *
 * Completions whose issue was not seen (issued before the probe started, or
 * `inflight` full) are skipped and counted in `unmatched_completions`,
 * except an fsync's empty pre-flush write, which the kernel completes
 * without issuing it: that gets a row (see preflush_write).
 *
 * Filters: completions often run in interrupt context, so --tgid/--pid/
 * --cgroup are applied to the task that issued the request. That is the
 * task that submitted it, seen at block_io_start (Linux 6.5+, in the
 * submitter's context, kept in `submitters` until the issue), since
 * block_rq_issue may run later in a kblockd worker; without block_io_start
 * (older kernels, or requests it does not see such as the flush machinery's
 * own) it is the task current at block_rq_issue. Every request still
 * counts in its disk's queue depth; only wanted ones get rows. */
/* A fast device under fio completes hundreds of thousands of requests a
 * second: stage rows per CPU (completions on one CPU, in interrupt or task
 * context, share its batch; see kml.bpf.h). */
#define KML_STAGED
#include "kml.bpf.h"
#include "block_io.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define TABLE_BLOCK_IO 0

/* The low REQ_OP_BITS bits of cmd_flags are the operation (since 4.10). */
#define REQ_OP_BITS 8
#define REQ_OP_MASK ((1u << REQ_OP_BITS) - 1)

KML_RING(events);

/* Keep the record type in BTF so the skeleton generates it. */
struct block_io_event block_io_event_btf = {};

/* What block_rq_issue saw, until the completion. */
struct issue {
	__u64 issue_ns; /* CLOCK_BOOTTIME, ns */
	__u64 sector;
	__u64 bytes;
	__u32 device;
	__u32 segments;
	__u32 flags;
	__u32 pid;
	__u32 tgid;
	__u32 wanted; /* passed the host's filters: emit a row */
};

/* Allocated per entry, not preallocated: a preallocated map of the
 * default 65,536 entries is 7.5 MiB the kernel zeroes at every start, for
 * the few hundred requests a machine has in flight. An entry that cannot
 * be allocated is a full map: the completion is counted as unmatched. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u64); /* struct request * */
	__type(value, struct issue);
} inflight SEC(".maps");

/* Per disk: requests and bytes in flight (issued, not yet completed or
 * requeued), counted since the probe started. Signed so that a transient
 * underflow under concurrent updates reads as 0, never as a huge value. */
struct depth {
	__s64 requests;
	__s64 bytes;
};

/* The task that submitted a request, from block_io_start to its issue. LRU:
 * a request freed without being issued is forgotten, never fills it. */
struct submitter {
	__u64 submit_ns; /* CLOCK_BOOTTIME, ns; set for a data-less write only */
	__u32 pid;
	__u32 tgid;
	__u32 wanted;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64); /* struct request * */
	__type(value, struct submitter);
} submitters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); /* dev_t of the disk */
	__type(value, struct depth);
} depths SEC(".maps");

/* Completions skipped because their issue was not seen. */
__u64 unmatched_total = 0;

/* Kernels before 5.17 kept the disk in the request. */
struct request___old {
	struct gendisk *rq_disk;
} __attribute__((preserve_access_index));

/* Kernels before 6.0 named the operations enum req_opf. */
enum req_opf___old {
	REQ_OP_READ___old = 0,
	REQ_OP_WRITE___old = 1,
	REQ_OP_FLUSH___old = 2,
	REQ_OP_DISCARD___old = 3,
	REQ_OP_SECURE_ERASE___old = 5,
	REQ_OP_ZONE_APPEND___old = 13,
	REQ_OP_WRITE_ZEROES___old = 9,
	REQ_OP_ZONE_OPEN___old = 10,
	REQ_OP_ZONE_CLOSE___old = 11,
	REQ_OP_ZONE_FINISH___old = 12,
	REQ_OP_ZONE_RESET___old = 15,
	REQ_OP_ZONE_RESET_ALL___old = 17,
	REQ_OP_DRV_IN___old = 34,
	REQ_OP_DRV_OUT___old = 35,
};

static __always_inline struct gendisk *rq_disk(struct request *rq)
{
	struct request_queue *q = rq->q;

	if (bpf_core_field_exists(q->disk))
		return q->disk;
	return ((struct request___old *)rq)->rq_disk;
}

/* The kernel's MKDEV (MINORBITS 20), as in /proc/self/mountinfo's st_dev. */
static __always_inline __u32 disk_dev(struct gendisk *disk)
{
	if (!disk)
		return 0;
	return ((__u32)disk->major << 20) | (__u32)disk->first_minor;
}

/* True when `op` is the kernel's value of REQ_OP_<name>, whichever enum the
 * running kernel has. */
#define OP_IS(op, name)                                                        \
	(bpf_core_enum_value_exists(enum req_op, REQ_OP_##name)                \
		 ? (op) == bpf_core_enum_value(enum req_op, REQ_OP_##name)     \
		 : (bpf_core_enum_value_exists(enum req_opf___old,             \
					       REQ_OP_##name##___old) &&       \
		    (op) == bpf_core_enum_value(enum req_opf___old,            \
						REQ_OP_##name##___old)))

/* A global function: the verifier checks it once, on its own, and its
 * caller continues with one state for any result, not one per operation
 * (fifteen copies of the rest of the program to verify). */
__noinline __u32 block_io_op_index(__u32 op)
{
	if (OP_IS(op, READ))
		return BLOCK_IO_OP_READ;
	if (OP_IS(op, WRITE))
		return BLOCK_IO_OP_WRITE;
	if (OP_IS(op, FLUSH))
		return BLOCK_IO_OP_FLUSH;
	if (OP_IS(op, DISCARD))
		return BLOCK_IO_OP_DISCARD;
	if (OP_IS(op, SECURE_ERASE))
		return BLOCK_IO_OP_SECURE_ERASE;
	if (OP_IS(op, ZONE_APPEND))
		return BLOCK_IO_OP_ZONE_APPEND;
	if (OP_IS(op, WRITE_ZEROES))
		return BLOCK_IO_OP_WRITE_ZEROES;
	if (OP_IS(op, ZONE_OPEN))
		return BLOCK_IO_OP_ZONE_OPEN;
	if (OP_IS(op, ZONE_CLOSE))
		return BLOCK_IO_OP_ZONE_CLOSE;
	if (OP_IS(op, ZONE_FINISH))
		return BLOCK_IO_OP_ZONE_FINISH;
	if (OP_IS(op, ZONE_RESET))
		return BLOCK_IO_OP_ZONE_RESET;
	if (OP_IS(op, ZONE_RESET_ALL))
		return BLOCK_IO_OP_ZONE_RESET_ALL;
	if (OP_IS(op, DRV_IN))
		return BLOCK_IO_OP_DRV_IN;
	if (OP_IS(op, DRV_OUT))
		return BLOCK_IO_OP_DRV_OUT;
	return BLOCK_IO_OP_UNKNOWN;
}

/* True when cmd_flags has REQ_<name> set; bit numbers from CO-RE. */
#define HAS_FLAG(flags, name)                                                  \
	(bpf_core_enum_value_exists(enum req_flag_bits, __REQ_##name)          \
		 ? ((flags) >> bpf_core_enum_value(enum req_flag_bits, __REQ_##name)) & 1 \
		 : 0)

/* flags_readable for each set of the four flags shown (bit 0 Preflush, 1
 * FUA, 2 Meta, 3 Sync) and each operation (BLOCK_IO_OP_*):
 * "[Preflush-][FUA-][Meta-][Sync-]<Op>", like bcc's biolatency --flags.
 * Written by user space before load (src/lib.rs), so the program copies
 * one string instead of building it (a branch per flag and operation, each
 * a path for the verifier to walk). */
const volatile char readable_names[BLOCK_IO_FLAG_SETS * BLOCK_IO_OPS][BLOCK_IO_FLAGS_LEN] = {};

/* The string of `flags` and operation `op` (at most BLOCK_IO_OP_UNKNOWN). */
static __always_inline void flags_readable(char *buf, __u32 flags, __u32 op)
{
	__u32 set = HAS_FLAG(flags, PREFLUSH) | HAS_FLAG(flags, FUA) << 1 |
		    HAS_FLAG(flags, META) << 2 | HAS_FLAG(flags, SYNC) << 3;
	__u32 i = ((set & (BLOCK_IO_FLAG_SETS - 1)) * BLOCK_IO_OPS + op) &
		  (BLOCK_IO_FLAG_SETS * BLOCK_IO_OPS - 1);

	__builtin_memcpy(buf, (const char *)readable_names[i], BLOCK_IO_FLAGS_LEN);
}

/* Adds `requests` and `bytes` to the disk's depth. */
static __always_inline void depth_add(__u32 dev, __s64 requests, __s64 bytes)
{
	struct depth *d = bpf_map_lookup_elem(&depths, &dev);

	if (!d) {
		struct depth zero = {};

		bpf_map_update_elem(&depths, &dev, &zero, BPF_NOEXIST);
		d = bpf_map_lookup_elem(&depths, &dev);
		if (!d)
			return;
	}
	__sync_fetch_and_add(&d->requests, requests);
	__sync_fetch_and_add(&d->bytes, bytes);
}

/* Takes one request of `bytes` off the disk's depth and returns what is
 * left in flight, never below zero. */
static __always_inline void depth_sub(__u32 dev, __u64 bytes, __u32 *requests_after,
				      __u64 *bytes_after)
{
	struct depth *d = bpf_map_lookup_elem(&depths, &dev);
	__s64 r, b;

	*requests_after = 0;
	*bytes_after = 0;
	if (!d)
		return;
	__sync_fetch_and_add(&d->requests, -1);
	__sync_fetch_and_add(&d->bytes, -(__s64)bytes);
	/* Read back after the update: other CPUs' concurrent issues and
	 * completions on the same disk may be included. */
	r = d->requests;
	b = d->bytes;
	*requests_after = r > 0 ? (__u32)r : 0;
	*bytes_after = b > 0 ? (__u64)b : 0;
}

/* Optional (Linux 6.5+): the plugin turns it off where the kernel has no
 * block_io_start tracepoint. */
SEC("tp_btf/block_io_start")
int BPF_PROG(handle_block_io_start, struct request *rq)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 key = (__u64)rq;
	struct submitter s = {};

	s.pid = task->pid;
	s.tgid = task->tgid;
	s.wanted = kml_wanted_tgid(task, s.tgid);
	/* A data-less write (an fsync's empty pre-flush write) is never
	 * issued: its row's "issue" time is its submission. */
	if (rq->__data_len == 0)
		s.submit_ns = bpf_ktime_get_boot_ns();
	bpf_map_update_elem(&submitters, &key, &s, BPF_ANY);
	return 0;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(handle_block_rq_issue, struct request *rq)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 key = (__u64)rq;
	struct submitter *s;
	struct issue *old;
	struct issue in = {};

	in.issue_ns = bpf_ktime_get_boot_ns();
	in.sector = rq->__sector;
	in.bytes = rq->__data_len;
	in.device = disk_dev(rq_disk(rq));
	in.segments = rq->nr_phys_segments;
	in.flags = rq->cmd_flags;
	s = bpf_map_lookup_elem(&submitters, &key);
	if (s) {
		in.pid = s->pid;
		in.tgid = s->tgid;
		in.wanted = s->wanted;
		bpf_map_delete_elem(&submitters, &key);
	} else {
		in.pid = task->pid;
		in.tgid = task->tgid;
		in.wanted = kml_wanted_tgid(task, in.tgid);
	}

	if (bpf_map_update_elem(&inflight, &key, &in, BPF_NOEXIST) == 0) {
		depth_add(in.device, 1, (__s64)in.bytes);
		return 0;
	}
	/* The entry exists (or the map is full): issued again without a
	 * completion or requeue seen. Replace the stale entry, keeping the
	 * request counted once. */
	old = bpf_map_lookup_elem(&inflight, &key);
	if (!old)
		return 0;
	depth_add(old->device, -1, -(__s64)old->bytes);
	if (bpf_map_update_elem(&inflight, &key, &in, BPF_ANY) == 0)
		depth_add(in.device, 1, (__s64)in.bytes);
	return 0;
}

SEC("tp_btf/block_rq_requeue")
int BPF_PROG(handle_block_rq_requeue, struct request *rq)
{
	__u64 key = (__u64)rq;
	struct issue *in = bpf_map_lookup_elem(&inflight, &key);
	struct submitter s = {};

	if (!in)
		return 0;
	/* The re-issue often runs in a kblockd worker: keep the submitter. */
	s.pid = in->pid;
	s.tgid = in->tgid;
	s.wanted = in->wanted;
	bpf_map_update_elem(&submitters, &key, &s, BPF_ANY);
	depth_add(in->device, -1, -(__s64)in->bytes);
	bpf_map_delete_elem(&inflight, &key);
	return 0;
}

KML_FLUSH_PROGRAM(kml_flush_table(&events, TABLE_BLOCK_IO, sizeof(struct block_io_event)))

/* Stages one row. A global function, checked by the verifier once on its
 * own rather than once for each way the completion reaches it. */
__noinline int block_io_stage_row(struct block_io_event *e)
{
	if (!e)
		return 0;
	kml_stage_output(&events, e, sizeof(*e), TABLE_BLOCK_IO);
	return 0;
}

/* A write with no data is the flush machinery's: the empty write that a
 * flush (fsync's REQ_PREFLUSH) is submitted as. The kernel never issues it
 * to the driver (block_rq_issue sees the separate flush request, a Flush
 * row); it completes it when the flush is done, and /proc/diskstats counts
 * it as a write. It gets a row from its submission (block_io_start) to that
 * completion, with bytes 0, instead of counting as unmatched. */
static __always_inline int preflush_write(struct request *rq, struct issue *in, __u64 now_ns)
{
	struct task_struct *task;
	struct submitter *s;
	__u64 key = (__u64)rq;
	__u32 flags = rq->cmd_flags;

	if (rq->__data_len != 0 || !OP_IS(flags & REQ_OP_MASK, WRITE))
		return 0;
	/* The kernel cleared REQ_PREFLUSH when it took the flush over: the
	 * row keeps the flags as submitted. */
	if (bpf_core_enum_value_exists(enum req_flag_bits, __REQ_PREFLUSH))
		flags |= 1u << bpf_core_enum_value(enum req_flag_bits, __REQ_PREFLUSH);
	in->issue_ns = now_ns;
	in->device = disk_dev(rq_disk(rq));
	in->flags = flags;
	s = bpf_map_lookup_elem(&submitters, &key);
	if (s) {
		if (s->submit_ns && s->submit_ns <= now_ns)
			in->issue_ns = s->submit_ns;
		in->pid = s->pid;
		in->tgid = s->tgid;
		in->wanted = s->wanted;
		bpf_map_delete_elem(&submitters, &key);
	} else {
		/* No block_io_start (before Linux 6.5), or forgotten: the task
		 * current at completion stands in. */
		task = bpf_get_current_task_btf();
		in->pid = task->pid;
		in->tgid = task->tgid;
		in->wanted = kml_wanted_tgid(task, in->tgid);
	}
	return 1;
}

/* What is in flight on the disk, without changing it. */
static __always_inline void depth_get(__u32 dev, __u32 *requests_after, __u64 *bytes_after)
{
	struct depth *d = bpf_map_lookup_elem(&depths, &dev);
	__s64 r, b;

	*requests_after = 0;
	*bytes_after = 0;
	if (!d)
		return;
	r = d->requests;
	b = d->bytes;
	*requests_after = r > 0 ? (__u32)r : 0;
	*bytes_after = b > 0 ? (__u64)b : 0;
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(handle_block_rq_complete, struct request *rq, blk_status_t error,
	     unsigned int nr_bytes)
{
	__u64 key = (__u64)rq;
	struct block_io_event rec, *e = &rec;
	struct gendisk *disk;
	struct issue *found, in;
	__u32 requests_after;
	__u64 bytes_after;
	__u64 now_ns;

	found = bpf_map_lookup_elem(&inflight, &key);
	if (found) {
		/* A partial completion leaves the rest of the request in
		 * flight: the row comes with the last part. */
		if (nr_bytes < rq->__data_len)
			return 0;
		in = *found;
		bpf_map_delete_elem(&inflight, &key);
		now_ns = bpf_ktime_get_boot_ns();
		depth_sub(in.device, in.bytes, &requests_after, &bytes_after);
	} else {
		now_ns = bpf_ktime_get_boot_ns();
		__builtin_memset(&in, 0, sizeof(in));
		if (!preflush_write(rq, &in, now_ns)) {
			__sync_fetch_and_add(&unmatched_total, 1);
			return 0;
		}
		depth_get(in.device, &requests_after, &bytes_after);
	}
	if (!in.wanted)
		return 0;

	/* Clear padding and the strings' tails. */
	__builtin_memset(e, 0, sizeof(*e));
	e->ts_uptime_us = now_ns / 1000;
	e->issue_ts_uptime_us = in.issue_ns / 1000;
	e->latency_us = now_ns > in.issue_ns ? (now_ns - in.issue_ns) / 1000 : 0;
	e->sector = in.sector;
	e->bytes = in.bytes;
	e->queue_depth_4k = bytes_after / 4096;
	e->unmatched_completions = unmatched_total;
	e->device = in.device;
	e->device_major = in.device >> 20;
	e->device_minor = in.device & ((1u << 20) - 1);
	e->segments = in.segments;
	e->flags = in.flags;
	e->op = block_io_op_index(in.flags & REQ_OP_MASK);
	if (e->op > BLOCK_IO_OP_UNKNOWN)
		e->op = BLOCK_IO_OP_UNKNOWN;
	e->error = error;
	e->queue_depth = requests_after;
	e->pid = in.pid;
	e->tgid = in.tgid;
	disk = rq_disk(rq);
	if (disk)
		BPF_CORE_READ_STR_INTO(&e->disk_name, disk, disk_name);
	flags_readable(e->flags_readable, e->flags, e->op);
	block_io_stage_row(e);
	return 0;
}
