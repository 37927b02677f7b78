// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* file_data: one row per successful file open or create, with the file's
 * inode number, its size at open and its name as the caller passed it.
 *
 * Two ways in, chosen by user space at load:
 * - fexit/do_filp_open (where fentry/fexit work): every open the kernel
 *   makes for a path, whatever the syscall (io_uring included), with the
 *   struct file it returns.
 * - the syscall tracepoints (tp/syscalls/sys_{enter,exit}_{open,openat,
 *   openat2,creat}): at entry the user's name pointer and flags are kept
 *   per thread; at exit, when the call returned a descriptor, the name is
 *   read from user memory and the file from current->files->fdt->fd[fd].
 * The user side turns on the programs of one way only (set_autoload). */
#include "kml.bpf.h"
#include "file_data.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define TABLE_FILE_DATA 0
#define O_CREAT 0100 /* asm-generic: x86, arm64, riscv */
#define FMODE_EXEC 0x20
#define MAX_ERRNO 4095

KML_RING(events);

/* Keep the record type in BTF so the skeleton generates it. */
struct file_data_event file_data_event_btf = {};

/* What a syscall's entry saw, until its exit. */
struct pending_open {
	const char *name; /* user pointer */
	__u64 flags;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); /* pid_tgid */
	__type(value, struct pending_open);
} pending SEC(".maps");

/* Copies a NUL-terminated name into e->name and sets name_truncated. The
 * helper returns the bytes copied with the NUL: a full buffer means the
 * name was 255 bytes long or more, and the byte at 255 says which. */
static __always_inline void read_name(struct file_data_event *e, const char *src,
				      bool user)
{
	long n;
	char next = 0;

	if (user)
		n = bpf_probe_read_user_str(e->name, sizeof(e->name), src);
	else
		n = bpf_probe_read_kernel_str(e->name, sizeof(e->name), src);
	if (n == sizeof(e->name)) {
		if (user)
			bpf_probe_read_user(&next, 1, src + sizeof(e->name) - 1);
		else
			bpf_probe_read_kernel(&next, 1, src + sizeof(e->name) - 1);
		e->name_truncated = next != 0;
	}
}

/* Fills everything but the name from the opened file. */
static __always_inline void fill(struct file_data_event *e, struct task_struct *task,
				 struct file *file, __u64 flags)
{
	struct inode *inode = BPF_CORE_READ(file, f_inode);

	e->ts_uptime_us = kml_now_us();
	e->inode = BPF_CORE_READ(inode, i_ino);
	e->size_bytes = BPF_CORE_READ(inode, i_size);
	e->pid = BPF_CORE_READ(task, pid);
	e->tgid = BPF_CORE_READ(task, tgid);
	e->flags = flags;
	e->open_kind = flags & O_CREAT ? FILE_DATA_CREATE : FILE_DATA_OPEN;
}

/* ---- fexit path ---- */

SEC("fexit/do_filp_open")
int BPF_PROG(fexit_do_filp_open, int dfd, struct filename *pathname,
	     const struct open_flags *op, struct file *file)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct file_data_event *e;

	if ((unsigned long)file >= (unsigned long)-MAX_ERRNO || !file)
		return 0;
	/* execve opens the program with do_filp_open too: not a file open. */
	if (BPF_CORE_READ(file, f_mode) & FMODE_EXEC)
		return 0;
	if (!kml_wanted(task))
		return 0;
	e = kml_reserve(&events, sizeof(*e), TABLE_FILE_DATA);
	if (!e)
		return 0;
	__builtin_memset(e, 0, sizeof(*e));
	fill(e, task, file, (__u32)BPF_CORE_READ(op, open_flag));
	read_name(e, BPF_CORE_READ(pathname, name), false);
	kml_submit(&events, e, TABLE_FILE_DATA);
	return 0;
}

/* ---- syscall tracepoint path ---- */

static __always_inline void enter(const char *name, __u64 flags)
{
	struct task_struct *task = (void *)bpf_get_current_task();
	__u64 id = bpf_get_current_pid_tgid();
	struct pending_open p = { .name = name, .flags = flags };

	if (!kml_wanted(task))
		return;
	bpf_map_update_elem(&pending, &id, &p, BPF_ANY);
}

static __always_inline void leave(long ret)
{
	struct task_struct *task = (void *)bpf_get_current_task();
	__u64 id = bpf_get_current_pid_tgid();
	struct pending_open *p = bpf_map_lookup_elem(&pending, &id);
	struct file_data_event *e;
	struct fdtable *fdt;
	struct file **fds;
	struct file *file = NULL;

	if (!p)
		return;
	if (ret < 0)
		goto out;
	fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt || ret >= BPF_CORE_READ(fdt, max_fds))
		goto out;
	fds = BPF_CORE_READ(fdt, fd);
	if (bpf_core_read(&file, sizeof(file), &fds[ret]) || !file)
		goto out;
	e = kml_reserve(&events, sizeof(*e), TABLE_FILE_DATA);
	if (!e)
		goto out;
	__builtin_memset(e, 0, sizeof(*e));
	fill(e, task, file, p->flags);
	read_name(e, p->name, true);
	kml_submit(&events, e, TABLE_FILE_DATA);
out:
	bpf_map_delete_elem(&pending, &id);
}

/* The entry program of syscall `sys` (tp_enter_<sys>): its file name and
 * flags are the expressions `name` and `flags` of the tracepoint's `ctx`. */
#define ENTER_PROGRAM(sys, name, flags)                                  \
	SEC("tp/syscalls/sys_enter_" #sys)                               \
	int tp_enter_##sys(struct trace_event_raw_sys_enter *ctx)        \
	{                                                                \
		enter((const char *)(name), (flags));                    \
		return KML_TP_PASS;                                      \
	}

/* The exit program of syscall `sys` (tp_exit_<sys>): its return value. */
#define EXIT_PROGRAM(sys)                                                \
	SEC("tp/syscalls/sys_exit_" #sys)                                \
	int tp_exit_##sys(struct trace_event_raw_sys_exit *ctx)          \
	{                                                                \
		leave(ctx->ret);                                         \
		return KML_TP_PASS;                                      \
	}

/* open(const char *filename, int flags, umode_t mode) */
ENTER_PROGRAM(open, ctx->args[0], ctx->args[1])
EXIT_PROGRAM(open)

/* openat(int dfd, const char *filename, int flags, umode_t mode) */
ENTER_PROGRAM(openat, ctx->args[1], ctx->args[2])
EXIT_PROGRAM(openat)

/* openat2(int dfd, const char *filename, struct open_how *how, size_t) */
SEC("tp/syscalls/sys_enter_openat2")
int tp_enter_openat2(struct trace_event_raw_sys_enter *ctx)
{
	struct open_how how = {};

	bpf_probe_read_user(&how, sizeof(how), (void *)ctx->args[2]);
	enter((const char *)ctx->args[1], how.flags);
	return KML_TP_PASS;
}

EXIT_PROGRAM(openat2)

/* creat(const char *pathname, umode_t mode): open(O_CREAT|O_WRONLY|O_TRUNC) */
ENTER_PROGRAM(creat, ctx->args[0], O_CREAT | 01 | 01000)
EXIT_PROGRAM(creat)
