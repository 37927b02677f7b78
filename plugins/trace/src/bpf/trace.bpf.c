// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* trace: generic programs, attached once per traced event. What each
 * event records is data, not code: the slot's fetch plan (see trace.h),
 * every read checked (a failed read leaves zeros): kernel reads of up to
 * 16 bytes are guarded plain loads where the kernel has them (Linux
 * 6.17+), others helper calls. Classic tracepoints and
 * user functions run one program per kind with the event's slot as its BPF
 * cookie and the plan in `trace_slots`, field by field with bpf_loop. Raw
 * and BTF tracepoints, the hot ones, run one program per slot with the
 * plan in read-only data (`trace_plan`): the verifier specialises each on
 * its plan, so it reads its arguments from the context and its fields in a
 * plain loop, with no cookie, copy or callback calls. Records go to one
 * ring; user space routes them to their tables by the slot in the header. */
#include "kml.bpf.h"
#include "trace.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

KML_RING(trace_ring);

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TRACE_MAX_SLOTS);
	__type(key, __u32);
	__type(value, struct trace_slot);
} trace_slots SEC(".maps");

#define TRACE_STAGE_BYTES 8192

/* Staged output (below). Set by user space before load: 0 where the host
 * cannot run the flush on a chosen CPU; the batch limit (at most
 * TRACE_STAGE_BYTES). Ahead of the plans: on the cache lines the filters
 * and a first slot's plan share. */
const volatile __u32 trace_stage_on = 0;
const volatile __u32 trace_stage_limit = TRACE_STAGE_BYTES;

/* The fetch plans again, as read-only data written before load, for the
 * raw tracepoint programs (one per slot): their verifier knows every value. */
const volatile struct trace_slot trace_plan[TRACE_MAX_SLOTS] = {};

/* Records lost per slot (a full ring, a latency entry with no room). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TRACE_MAX_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} trace_lost SEC(".maps");

/* Exits seen without their entry (the entry predates the probe, or was
 * pushed out), per slot. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TRACE_MAX_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} trace_unmatched SEC(".maps");

struct kml_trace_buf {
	__u8 rec[TRACE_MAX_RECORD + TRACE_MAX_READ];
};

struct kml_trace_scratch {
	struct kml_trace_buf buf;
	__u64 args[TRACE_MAX_ARGS];
	__u64 ret;
	struct trace_count_key key;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kml_trace_scratch);
} trace_scratch SEC(".maps");

/* Latency events: the record built at entry, waiting for the exit. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct trace_entry_key);
	__type(value, struct kml_trace_buf);
} trace_inflight SEC(".maps");

/* Latency events: entries in flight per thread and slot (recursion). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct trace_entry_key);
	__type(value, __u32);
} trace_depth SEC(".maps");

/* Count mode: per key (slot included) and CPU, sized by user space. A full
 * map counts the event lost. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1);
	__type(key, struct trace_count_key);
	__type(value, struct trace_count);
} trace_counts SEC(".maps");

/* Staged output: a slot's records gathered per CPU and sent to the ring a
 * batch at a time (one ring reservation per batch, not per record), for
 * slots below TRACE_STAGE_SLOTS; the host sends a quiet CPU's partial
 * batch with `kml_flush` (BPF_PROG_TEST_RUN on that CPU) and every CPU's
 * at the stop (kernmlops_plugin_bpf::stage). The maps' names, the header's
 * layout and the flush program's name are the ones of kml.bpf.h's
 * KML_STAGED; a record is built in place in the stage, so the data holds
 * a whole record's reach past the batch limit. A stage taken (an
 * interrupt on the same CPU) or off sends the record straight to the
 * ring. */
#define TRACE_STAGE_SLOTS 8


struct kml_stage_head {
	__u32 busy;
	__u32 len;
	__u64 batches;
};

struct trace_stage_data {
	__u8 bytes[TRACE_STAGE_BYTES + TRACE_MAX_RECORD + TRACE_MAX_READ];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TRACE_STAGE_SLOTS);
	__type(key, __u32);
	__type(value, struct kml_stage_head);
} kml_stage_head SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TRACE_STAGE_SLOTS);
	__type(key, __u32);
	__type(value, struct trace_stage_data);
} kml_stage_data SEC(".maps");

/* Count mode: each slot's current interval, advanced by user space. */
volatile __u64 trace_count_gen[TRACE_MAX_SLOTS];

/* Keep the shared types in BTF so the skeleton generates them. */
struct trace_slot _trace_slot = {};
struct trace_entry_key _trace_entry_key = {};
struct trace_count _trace_count = {};

static __always_inline void count_n(void *map, __u32 slot, __u64 by)
{
	__u64 *n = bpf_map_lookup_elem(map, &slot);

	if (n)
		*n += by;
}

static __always_inline void count(void *map, __u32 slot)
{
	count_n(map, slot, 1);
}

/* Kernel memory read with plain loads where the kernel allows them: a
 * pointer cast with bpf_rdonly_cast(, 0) is read-only memory whose loads
 * the JIT guards (a faulting load gives zero, as a failed helper read
 * leaves zeros), so a field costs a load, not a helper call. Before
 * Linux 6.17 (no cast to void) the reads are helper calls. */
extern void *bpf_rdonly_cast(const void *obj__ign, __u32 btf_id__k) __ksym __weak;

static __always_inline bool plain_loads(void)
{
	return bpf_core_enum_value_exists(enum bpf_features, BPF_FEAT_RDONLY_CAST_TO_VOID);
}

/* The u64 at kernel address `src` (0 where it cannot be read); `*ok`:
 * false where the helper read failed (a faulting plain load cannot tell,
 * but gives 0, and every read through 0 fails too). */
static __always_inline __u64 load_u64(__u64 src, bool *ok)
{
	__u64 v = 0;

	if (plain_loads())
		return *(const __u64 *)bpf_rdonly_cast((void *)src, 0);
	*ok = !bpf_probe_read_kernel(&v, sizeof(v), (void *)src);
	return v;
}

/* Copies `size` bytes (at most 16) of kernel memory at `src` to `dst` with
 * plain loads, widest first; false: not possible here (old kernel, a
 * larger read), use the helper. */
static __always_inline bool load_small(__u8 *dst, __u32 size, __u64 src)
{
	const __u8 *p;
	__u32 at = 0;

	if (!plain_loads() || size > 16)
		return false;
	p = bpf_rdonly_cast((void *)src, 0);
	if (size >= 8) {
		*(__u64 *)dst = *(const __u64 *)p;
		at = 8;
	}
	if (size - at >= 8) {
		*(__u64 *)(dst + 8) = *(const __u64 *)(p + 8);
		at = 16;
	}
	if (size - at >= 4) {
		*(__u32 *)(dst + at) = *(const __u32 *)(p + at);
		at += 4;
	}
	if (size - at >= 2) {
		*(__u16 *)(dst + at) = *(const __u16 *)(p + at);
		at += 2;
	}
	if (size - at >= 1)
		dst[at] = p[at];
	return true;
}

static __always_inline long read_mem(void *dst, __u32 size, __u64 src, bool user)
{
	if (user)
		return bpf_probe_read_user(dst, size, (void *)src);
	return bpf_probe_read_kernel(dst, size, (void *)src);
}

static __always_inline long read_str(void *dst, __u32 size, __u64 src, bool user)
{
	if (user)
		return bpf_probe_read_user_str(dst, size, (void *)src);
	return bpf_probe_read_kernel_str(dst, size, (void *)src);
}

/* Zeroes `size` bytes at `dst`: a read from address 0 fails, and a failed
 * read clears its destination. */
static __always_inline void zero(void *dst, __u32 size)
{
	bpf_probe_read_kernel(dst, size, (void *)0);
}

/* Stores the low `size` bytes (at most 8) of `v` at `dst`. */
static __always_inline void store_value(__u8 *dst, __u32 size, __u64 v)
{
	switch (size) {
	case 8:
		*(__u64 *)dst = v;
		break;
	case 4:
		*(__u32 *)dst = v;
		break;
	case 2:
		*(__u16 *)dst = v;
		break;
	case 1:
		*dst = v;
		break;
	default:
		bpf_probe_read_kernel(dst, size, &v);
	}
}

/* Does fetch `f` from base value `v` into `rec`. `f` is a plan in the
 * `trace_slots` map (values the verifier does not know) or in `trace_plan`
 * (read-only data: values it knows, so it keeps only the path `f` takes). */
static __always_inline void fetch(const volatile struct trace_fetch *f, __u8 *rec, __u64 v)
{
	__u64 p = 0, src;
	__u32 out, size, k, n;
	bool user, ok, truncated = false;
	long got;

	user = f->user;
	out = f->out & (TRACE_MAX_RECORD - 1);
	size = f->size & (TRACE_MAX_READ - 1);
	n = f->nderefs;
	for (k = 0; k < TRACE_MAX_DEREFS; k++) {
		if (k >= n)
			break;
		/* Pointer chains run through kernel memory; `user` is for the
		 * final read (a syscall's string argument, a uprobe's). */
		ok = true;
		p = load_u64(v + f->derefs[k], &ok);
		if (!ok) {
			zero(rec + out, size);
			return;
		}
		v = p;
	}
	src = v + f->last;
	switch (f->op) {
	case TRACE_OP_VALUE:
		if (size > 8)
			size = 8;
		store_value(rec + out, size, v);
		break;
	case TRACE_OP_LOAD:
	case TRACE_OP_STR_INLINE:
		if (!load_small(rec + out, size, src))
			read_mem(rec + out, size, src, false);
		break;
	case TRACE_OP_STR_PTR:
		ok = true;
		p = load_u64(src, &ok);
		if (!ok) {
			zero(rec + out, size);
			break;
		}
		src = p;
		/* fall through */
	case TRACE_OP_STR_VALUE:
		if (f->op == TRACE_OP_STR_VALUE)
			src = v;
		if (size == 0)
			break;
		got = read_str(rec + out, size, src, user);
		if (got == size) {
			__u8 last = 0;

			read_mem(&last, 1, src + size - 1, user);
			truncated = last != 0;
		}
		break;
	case TRACE_OP_DYN_STR:
	case TRACE_OP_REL_STR: {
		__u32 loc = 0;

		if (read_mem(&loc, sizeof(loc), src, false) || size == 0)
			break;
		p = v + (loc & 0xffff);
		if (f->op == TRACE_OP_REL_STR)
			p += f->last + 4;
		read_str(rec + out, size, p, false);
		truncated = (loc >> 16) > size;
		break;
	}
	}
	if (f->trunc_out)
		rec[f->trunc_out & (TRACE_MAX_RECORD - 1)] = truncated;
}

struct fetch_ctx {
	struct trace_slot *slot;
	__u8 *rec;
	__u64 *args;
	__u64 ret;
	/* 0: every field but the return value's; 1: the return value's only
	 * (a latency event's exit); 2: every field. */
	__u32 phase;
};

static long fetch_one(__u64 i, void *data)
{
	struct fetch_ctx *c = data;
	struct trace_fetch *f;

	if (i >= TRACE_MAX_FIELDS)
		return 1;
	f = &c->slot->fields[i & (TRACE_MAX_FIELDS - 1)];
	if (c->phase == 0 && f->arg == TRACE_ARG_RET)
		return 0;
	if (c->phase == 1 && f->arg != TRACE_ARG_RET)
		return 0;
	fetch(f, c->rec, f->arg == TRACE_ARG_RET ? c->ret : c->args[f->arg & (TRACE_MAX_ARGS - 1)]);
	return 0;
}

/* The raw tracepoint's argument `i`, read from the context at a constant
 * offset: the verifier refuses a variable one. Each per-slot program knows
 * its `i`s (read-only data), so it reads only the arguments its plan names:
 * a program reading past a tracepoint's arguments is refused at attach. The
 * loads are in assembly so the compiler cannot merge them into one load at
 * a variable offset. */
static __always_inline __u64 raw_arg(struct bpf_raw_tracepoint_args *ctx, __u32 i)
{
	__u64 v = 0;

#define TRACE_RAW_ARG(n, off)                                                                      \
	case n:                                                                                    \
		asm volatile("%0 = *(u64 *)(%1 + " #off ")" : "=r"(v) : "r"(ctx));                 \
		break;
	switch (i) {
		TRACE_RAW_ARG(0, 0)
		TRACE_RAW_ARG(1, 8)
		TRACE_RAW_ARG(2, 16)
		TRACE_RAW_ARG(3, 24)
		TRACE_RAW_ARG(4, 32)
		TRACE_RAW_ARG(5, 40)
		TRACE_RAW_ARG(6, 48)
		TRACE_RAW_ARG(7, 56)
		TRACE_RAW_ARG(8, 64)
		TRACE_RAW_ARG(9, 72)
		TRACE_RAW_ARG(10, 80)
		TRACE_RAW_ARG(11, 88)
	}
#undef TRACE_RAW_ARG
	return v;
}

/* A raw tracepoint's fields, by a bounded loop over its plan in read-only
 * data: no callback call per field, and no copy of the arguments. */
static __always_inline void fetch_raw(const volatile struct trace_slot *plan, __u8 *rec,
				      struct bpf_raw_tracepoint_args *ctx)
{
	__u32 n = plan->nfields;

#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < TRACE_MAX_FIELDS; i++) {
		const volatile struct trace_fetch *f;

		if (i >= n)
			break;
		f = &plan->fields[i];
		fetch(f, rec, raw_arg(ctx, f->arg));
	}
}

static __always_inline struct trace_slot *slot_of(__u32 slot)
{
	return bpf_map_lookup_elem(&trace_slots, &slot);
}

/* Records up to this size are cleared with plain stores, larger ones with
 * a helper call (calls are dear where returns are mitigated). */
#define TRACE_INLINE_ZERO 128

/* The header and every field but (phase 0) the return value's. The pid
 * and tgid are those of `task`, the current one, read through its BTF
 * pointer. A raw tracepoint's per-slot program passes its context `raw`
 * and its plan in `trace_plan` as `slot`: its fields are read by a bounded
 * loop; other programs pass NULL and their plan in `trace_slots`, run with
 * bpf_loop. `raw_plan` says which, a constant at each inlined call, so
 * each program holds one of the two ways only. */
static __always_inline void build(const volatile struct trace_slot *slot, struct task_struct *task,
				  __u32 id, __u8 *rec, __u64 *args, __u64 ret, __u32 phase,
				  __u64 now_ns, struct bpf_raw_tracepoint_args *raw, const bool raw_plan)
{
	__u32 size = slot->record_size;

	if (size <= TRACE_INLINE_ZERO) {
		/* Records are whole multiples of 8 bytes. */
#pragma clang loop unroll(full)
		for (__u32 i = 0; i < TRACE_INLINE_ZERO / 8; i++)
			if (i * 8 < size)
				((__u64 *)rec)[i] = 0;
	} else {
		zero(rec, size & (TRACE_MAX_RECORD - 1));
	}
	*(__u64 *)rec = now_ns / 1000;
	*(__u32 *)(rec + 8) = task->pid;
	*(__u32 *)(rec + 12) = task->tgid;
	*(__u32 *)(rec + 16) = bpf_get_smp_processor_id();
	*(__u16 *)(rec + TRACE_SLOT_OFFSET) = id;
	if (slot->flags & TRACE_COMM) {
		__u8 *comm = rec + (slot->comm_out & (TRACE_MAX_RECORD - 1));

		/* The kernel pads comm with zeros (strscpy_pad) as the helper
		 * does, on every kernel with plain loads. */
		if (!load_small(comm, 16, (__u64)task->comm))
			bpf_get_current_comm(comm, 16);
	}
	if (!raw_plan) {
		if (slot->nfields) {
			/* Not read-only data here: a `trace_slots` map value. */
			struct fetch_ctx c = {
				.slot = (struct trace_slot *)slot, .rec = rec, .args = args,
				.ret = ret, .phase = phase,
			};

			bpf_loop(slot->nfields, fetch_one, &c, 0);
		}
	} else {
		fetch_raw(slot, rec, raw);
	}
}

static __always_inline void send(__u8 *rec, const volatile struct trace_slot *slot, __u32 id)
{
	__u64 size = slot->record_size & (TRACE_MAX_RECORD - 1);
	__u64 flags = bpf_ringbuf_query(&trace_ring, BPF_RB_AVAIL_DATA) > kml_wakeup_bytes[0]
			      ? BPF_RB_FORCE_WAKEUP
			      : BPF_RB_NO_WAKEUP;

	if (size < TRACE_HEADER_SIZE)
		return;
	if (bpf_ringbuf_output(&trace_ring, rec, size, flags))
		count(&trace_lost, id);
}

/* Sends a stage's `len` bytes (records of `size` bytes) in one sample. */
static __always_inline void stage_send(struct kml_stage_head *h, struct trace_stage_data *d,
				       __u32 len, __u32 size, __u32 id, __u64 flags)
{
	if (len == 0 || len > TRACE_STAGE_BYTES)
		return;
	if (bpf_ringbuf_output(&trace_ring, d->bytes, len, flags))
		count_n(&trace_lost, id, size ? len / size : 1);
	h->batches += 1;
}

/* Sends a full stage, waking the consumer past the ring's fill threshold.
 * Rare (once a batch): a call, so its code is off the lines each event
 * runs through. */
static __noinline int stage_send_full(struct kml_stage_head *h, struct trace_stage_data *d,
				      __u32 len, __u32 size, __u32 id)
{
	stage_send(h, d, len, size, id, kml_fill_flag(&trace_ring, 0));
	return 0;
}

/* A staged record: where it goes, and its stage, taken. */
struct staged {
	struct kml_stage_head *h;
	struct trace_stage_data *d;
	__u8 *rec;
};

/* Takes slot `id`'s stage on this CPU and finds room for a record of its
 * size; false: send the record straight to the ring. */
static __always_inline bool stage_begin(const volatile struct trace_slot *slot, __u32 id, struct staged *st)
{
	__u32 size = slot->record_size, len, limit = trace_stage_limit;

	if (!trace_stage_on || id >= TRACE_STAGE_SLOTS || size < TRACE_HEADER_SIZE ||
	    size > TRACE_STAGE_BYTES)
		return false;
	if (limit == 0 || limit > TRACE_STAGE_BYTES)
		limit = TRACE_STAGE_BYTES;
	st->h = bpf_map_lookup_elem(&kml_stage_head, &id);
	st->d = bpf_map_lookup_elem(&kml_stage_data, &id);
	if (!st->h || !st->d)
		return false;
	if (__sync_lock_test_and_set(&st->h->busy, 1))
		return false;
	len = st->h->len;
	if (len > limit - size) {
		/* Never with one record size per slot (a full batch is sent
		 * at the end); bounds `len` for the verifier. */
		stage_send_full(st->h, st->d, len, size, id);
		len = 0;
	}
	st->h->len = len;
	st->rec = st->d->bytes + (len & (TRACE_STAGE_BYTES - 1));
	return true;
}

/* The record at st->rec staged: the batch sent when the next would not
 * fit, the stage released. */
static __always_inline void stage_end(const volatile struct trace_slot *slot, __u32 id, struct staged *st)
{
	__u32 size = slot->record_size, limit = trace_stage_limit;
	__u32 len = st->h->len + size;

	if (limit == 0 || limit > TRACE_STAGE_BYTES)
		limit = TRACE_STAGE_BYTES;
	if (len + size > limit) {
		stage_send_full(st->h, st->d, len, size, id);
		len = 0;
	}
	st->h->len = len;
	asm volatile("" ::: "memory");
	st->h->busy = 0;
}

/* Sends this CPU's partial batches: run by the host on a chosen CPU,
 * never attached. */
SEC("raw_tp")
int kml_flush(void *ctx)
{
#pragma clang loop unroll(full)
	for (__u32 i = 0; i < TRACE_STAGE_SLOTS; i++) {
		__u32 id = i;
		struct kml_stage_head *h = bpf_map_lookup_elem(&kml_stage_head, &id);
		struct trace_stage_data *d = bpf_map_lookup_elem(&kml_stage_data, &id);
		struct trace_slot *slot = bpf_map_lookup_elem(&trace_slots, &id);

		if (!h || !d || !slot || __sync_lock_test_and_set(&h->busy, 1))
			continue;
		stage_send(h, d, h->len, slot->record_size, id, BPF_RB_NO_WAKEUP);
		h->len = 0;
		asm volatile("" ::: "memory");
		h->busy = 0;
	}
	return 0;
}

/* Count mode: the record's key counted, with its latency. */
static __always_inline void tally(struct kml_trace_scratch *s, __u8 *rec, const volatile struct trace_slot *slot,
				  __u32 id)
{
	struct trace_count *c, init = {};
	__u64 lat = 0, gen;
	__u32 flags = slot->flags, h;

	__builtin_memcpy(s->key.b, rec + 8, TRACE_COUNT_KEY);
	if (!(flags & TRACE_KEY_PID))
		*(__u32 *)(s->key.b + 0) = 0;
	if (!(flags & TRACE_KEY_TGID))
		*(__u32 *)(s->key.b + 4) = 0;
	if (!(flags & TRACE_KEY_CPU))
		*(__u32 *)(s->key.b + 8) = 0;
	if (flags & TRACE_LATENCY)
		lat = *(__u64 *)(rec + 8 + TRACE_COUNT_KEY);
	gen = trace_count_gen[id & (TRACE_MAX_SLOTS - 1)];
	h = gen & 1;
	c = bpf_map_lookup_elem(&trace_counts, &s->key);
	if (!c) {
		init.count = 1;
		init.total_ns = lat;
		init.min_ns[h] = lat;
		init.max_ns[h] = lat;
		init.gen[h] = gen;
		if (!bpf_map_update_elem(&trace_counts, &s->key, &init, BPF_NOEXIST))
			return;
		/* Another CPU added the key meanwhile, or the map is full. */
		c = bpf_map_lookup_elem(&trace_counts, &s->key);
		if (!c) {
			count(&trace_lost, id);
			return;
		}
	}
	c->total_ns += lat;
	c->count += 1;
	if (c->gen[h] != gen) {
		c->gen[h] = gen;
		c->min_ns[h] = lat;
		c->max_ns[h] = lat;
	} else {
		if (lat < c->min_ns[h])
			c->min_ns[h] = lat;
		if (lat > c->max_ns[h])
			c->max_ns[h] = lat;
	}
}

/* A finished record: counted (count mode), staged or sent. */
static __always_inline void finish(struct kml_trace_scratch *s, __u8 *rec, const volatile struct trace_slot *slot,
				   __u32 id)
{
	struct staged st;

	if (slot->flags & TRACE_COUNT) {
		tally(s, rec, slot, id);
	} else if (stage_begin(slot, id, &st)) {
		bpf_probe_read_kernel(st.rec, slot->record_size & (TRACE_MAX_RECORD - 1), rec);
		stage_end(slot, id, &st);
	} else {
		send(rec, slot, id);
	}
}

/* The current task when its events pass the filters, else NULL. */
static __always_inline struct task_struct *wanted(void)
{
	struct task_struct *task = bpf_get_current_task_btf();

	return kml_wanted_tgid(task, task->tgid) ? task : NULL;
}

static __always_inline struct kml_trace_scratch *scratch(void)
{
	__u32 zero_key = 0;

	return bpf_map_lookup_elem(&trace_scratch, &zero_key);
}

/* A raw plan's row built outside the stage (a count, a stage taken or
 * off), then counted or sent: a call, so the staged path's code stays
 * short. */
static __noinline int emit_unstaged_raw(const volatile struct trace_slot *slot,
					struct task_struct *task, __u32 id,
					struct bpf_raw_tracepoint_args *raw)
{
	struct kml_trace_scratch *s = scratch();

	if (!s)
		return 0;
	build(slot, task, id, s->buf.rec, NULL, 0, 2, bpf_ktime_get_boot_ns(), raw, true);
	finish(s, s->buf.rec, slot, id);
	return 0;
}

/* One row per event, built now: in place in the stage where it can be
 * (`raw`: see build). A raw plan reads no scratch arguments: its caller
 * passes no scratch `s`, looked up here only for a record built outside
 * the stage. */
static __always_inline void emit(struct kml_trace_scratch *s, const volatile struct trace_slot *slot,
				 struct task_struct *task, __u32 id,
				 struct bpf_raw_tracepoint_args *raw, const bool raw_plan)
{
	struct staged st;

	if (!(slot->flags & TRACE_COUNT) && stage_begin(slot, id, &st)) {
		build(slot, task, id, st.rec, raw_plan ? NULL : s->args, raw_plan ? 0 : s->ret, 2,
		      bpf_ktime_get_boot_ns(), raw, raw_plan);
		stage_end(slot, id, &st);
		return;
	}
	if (raw_plan) {
		emit_unstaged_raw(slot, task, id, raw);
		return;
	}
	build(slot, task, id, s->buf.rec, s->args, s->ret, 2, bpf_ktime_get_boot_ns(), NULL,
	      false);
	finish(s, s->buf.rec, slot, id);
}

/* Entry of a joined event: the record, built now, waits for the exit. */
static __always_inline void join_entry(struct kml_trace_scratch *s, struct trace_slot *slot,
				       struct task_struct *task, __u32 id)
{
	struct trace_entry_key key = {};
	__u32 *depth, first = 1;
	__u64 now = bpf_ktime_get_boot_ns();

	build(slot, task, id, s->buf.rec, s->args, 0, 0, now, NULL, false);
	*(__u64 *)(s->buf.rec + (slot->latency_out & (TRACE_MAX_RECORD - 1))) = now;
	key.pid_tgid = bpf_get_current_pid_tgid();
	key.slot = id;
	depth = bpf_map_lookup_elem(&trace_depth, &key);
	if (depth) {
		if (*depth >= TRACE_MAX_DEPTH) {
			count(&trace_lost, id);
			return;
		}
		key.depth = *depth;
		*depth += 1;
	} else {
		bpf_map_update_elem(&trace_depth, &key, &first, BPF_ANY);
	}
	if (bpf_map_update_elem(&trace_inflight, &key, &s->buf, BPF_ANY))
		count(&trace_lost, id);
}

/* Exit of a joined event: the entry's record completed with the duration
 * and (phase 1) the return value. */
static __always_inline void join_exit(struct kml_trace_scratch *s, struct trace_slot *slot, __u32 id)
{
	struct trace_entry_key key = {};
	struct kml_trace_buf *entry;
	__u32 *depth;
	__u64 *started;

	key.pid_tgid = bpf_get_current_pid_tgid();
	key.slot = id;
	depth = bpf_map_lookup_elem(&trace_depth, &key);
	if (!depth || *depth == 0) {
		count(&trace_unmatched, id);
		return;
	}
	*depth -= 1;
	key.depth = *depth;
	entry = bpf_map_lookup_elem(&trace_inflight, &key);
	if (!entry) {
		count(&trace_unmatched, id);
		return;
	}
	started = (__u64 *)(entry->rec + (slot->latency_out & (TRACE_MAX_RECORD - 1)));
	*started = bpf_ktime_get_boot_ns() - *started;
	{
		struct fetch_ctx c = {
			.slot = slot, .rec = entry->rec, .args = s->args, .ret = s->ret, .phase = 1,
		};

		bpf_loop(slot->nfields, fetch_one, &c, 0);
	}
	finish(s, entry->rec, slot, id);
	bpf_map_delete_elem(&trace_inflight, &key);
}

/* An event of the slot `id` (a plan in `trace_slots`): its plan, the
 * current task and the scratch, when its events pass the filters. */
static __always_inline bool begin(__u32 id, struct trace_slot **slot, struct task_struct **task,
				  struct kml_trace_scratch **s)
{
	return (*slot = slot_of(id)) && (*task = wanted()) && (*s = scratch());
}

/* One tracepoint takes a program once: events sharing a tracepoint (a
 * pair's exit, the same tracepoint counted and recorded) attach copies,
 * TRACE_COPIES of them; user space loads only the copies it needs. */
static __always_inline int tp_body(void *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 id = cookie & (TRACE_EXIT_COOKIE - 1);
	struct trace_slot *slot;
	struct task_struct *task;
	struct kml_trace_scratch *s;

	if (!begin(id, &slot, &task, &s))
		return KML_TP_PASS;
	s->args[0] = (__u64)ctx;
	s->ret = 0;
	if (cookie & TRACE_EXIT_COOKIE)
		join_exit(s, slot, id);
	else if (slot->flags & TRACE_LATENCY)
		join_entry(s, slot, task, id);
	else
		emit(s, slot, task, id, NULL, false);
	return KML_TP_PASS;
}

#define TRACE_TP_COPY(name)                                                                        \
	SEC("tp")                                                                                  \
	int name(void *ctx)                                                                        \
	{                                                                                          \
		return tp_body(ctx);                                                               \
	}

TRACE_TP_COPY(trace_tp)
TRACE_TP_COPY(trace_tp_1)
TRACE_TP_COPY(trace_tp_2)
TRACE_TP_COPY(trace_tp_3)

/* A raw (or BTF) tracepoint's event in slot `id`, a constant: one program
 * per slot, so no attach cookie, and its plan in `trace_plan` is known to
 * the verifier, which keeps only the reads and branches the plan takes
 * (the arguments straight from the context, a plain loop over the fields). */
static __always_inline int raw_slot_body(struct bpf_raw_tracepoint_args *ctx, const __u32 id)
{
	const volatile struct trace_slot *plan = &trace_plan[id];
	struct task_struct *task;

	if (!(task = wanted()))
		return 0;
	emit(NULL, plan, task, id, ctx, true);
	return 0;
}

#define TRACE_RAW_SLOT(n)                                                                          \
	SEC("raw_tp")                                                                              \
	int trace_raw_##n(struct bpf_raw_tracepoint_args *ctx)                                     \
	{                                                                                          \
		return raw_slot_body(ctx, n);                                                      \
	}

TRACE_RAW_SLOT(0)
TRACE_RAW_SLOT(1)
TRACE_RAW_SLOT(2)
TRACE_RAW_SLOT(3)
TRACE_RAW_SLOT(4)
TRACE_RAW_SLOT(5)
TRACE_RAW_SLOT(6)
TRACE_RAW_SLOT(7)
TRACE_RAW_SLOT(8)
TRACE_RAW_SLOT(9)
TRACE_RAW_SLOT(10)
TRACE_RAW_SLOT(11)
TRACE_RAW_SLOT(12)
TRACE_RAW_SLOT(13)
TRACE_RAW_SLOT(14)
TRACE_RAW_SLOT(15)

static __always_inline void regs_args(struct kml_trace_scratch *s, struct pt_regs *ctx)
{
	s->args[0] = PT_REGS_PARM1(ctx);
	s->args[1] = PT_REGS_PARM2(ctx);
	s->args[2] = PT_REGS_PARM3(ctx);
	s->args[3] = PT_REGS_PARM4(ctx);
	s->args[4] = PT_REGS_PARM5(ctx);
	s->args[5] = PT_REGS_PARM6(ctx);
}

/* A user function's entry, or (`ret`) its return: a latency event's entry
 * or exit joined, any other's row emitted (a return's with the value). */
static __always_inline int uprobe_body(struct pt_regs *ctx, const bool ret)
{
	__u32 id = bpf_get_attach_cookie(ctx);
	struct trace_slot *slot;
	struct task_struct *task;
	struct kml_trace_scratch *s;
	bool latency;

	if (!begin(id, &slot, &task, &s))
		return 0;
	s->ret = ret ? PT_REGS_RC(ctx) : 0;
	latency = slot->flags & TRACE_LATENCY;
	/* At a return the argument registers hold no arguments any more:
	 * a joined exit reads the return value only. */
	if (!(ret && latency))
		regs_args(s, ctx);
	if (latency && ret)
		join_exit(s, slot, id);
	else if (latency)
		join_entry(s, slot, task, id);
	else
		emit(s, slot, task, id, NULL, false);
	return 0;
}

SEC("uprobe")
int trace_uprobe(struct pt_regs *ctx)
{
	return uprobe_body(ctx, false);
}

SEC("uretprobe")
int trace_uretprobe(struct pt_regs *ctx)
{
	return uprobe_body(ctx, true);
}
