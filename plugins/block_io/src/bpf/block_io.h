/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Records of the block_io probe, shared by kernel and user side.
 *
 * The Rust side gets this struct from the skeleton (`types::block_io_event`)
 * and declares its columns in src/lib.rs; never copy it by hand. Fields are
 * in descending size and the record is a multiple of 8 bytes, so the layout
 * is the same in BPF and in Rust. */
#ifndef BLOCK_IO_H
#define BLOCK_IO_H

#define BLOCK_IO_DISK_NAME_LEN 32 /* DISK_NAME_LEN */
#define BLOCK_IO_FLAGS_LEN 64     /* longest: "Preflush-FUA-Meta-Sync-ZoneResetAll" */

/* Values of `op`, in the order of the column's labels (OP_LABELS in
 * src/lib.rs). The BPF side maps the kernel's REQ_OP_* values, which differ
 * between kernels, onto these with CO-RE. */
#define BLOCK_IO_OP_READ 0
#define BLOCK_IO_OP_WRITE 1
#define BLOCK_IO_OP_FLUSH 2
#define BLOCK_IO_OP_DISCARD 3
#define BLOCK_IO_OP_SECURE_ERASE 4
#define BLOCK_IO_OP_ZONE_APPEND 5
#define BLOCK_IO_OP_WRITE_ZEROES 6
#define BLOCK_IO_OP_ZONE_OPEN 7
#define BLOCK_IO_OP_ZONE_CLOSE 8
#define BLOCK_IO_OP_ZONE_FINISH 9
#define BLOCK_IO_OP_ZONE_RESET 10
#define BLOCK_IO_OP_ZONE_RESET_ALL 11
#define BLOCK_IO_OP_DRV_IN 12
#define BLOCK_IO_OP_DRV_OUT 13
#define BLOCK_IO_OP_UNKNOWN 14
/* Room for every op in the flags_readable table (a power of two). */
#define BLOCK_IO_OPS 16
/* Sets of the flags flags_readable shows: Preflush, FUA, Meta, Sync. */
#define BLOCK_IO_FLAG_SETS 16

/* Table 0, block_io: one row per completed block request. */
struct block_io_event {
	__u64 ts_uptime_us;          /* completion time (CLOCK_BOOTTIME, us) */
	__u64 issue_ts_uptime_us;    /* issue time (CLOCK_BOOTTIME, us) */
	__u64 latency_us;            /* completion - issue, us (from ns) */
	__u64 sector;                /* first 512-byte sector at issue */
	__u64 bytes;                 /* request size at issue, bytes */
	__u64 queue_depth_4k;        /* in-flight bytes on the disk after it / 4096 */
	__u64 unmatched_completions; /* completions skipped so far (issue unseen) */
	__u32 device;                /* dev_t of the disk, MKDEV(major, minor) */
	__u32 device_major;          /* disk major number */
	__u32 device_minor;          /* disk first minor number */
	__u32 segments;              /* rq->nr_phys_segments at issue */
	__u32 flags;                 /* rq->cmd_flags at issue (REQ_OP_* | REQ_*) */
	__u32 op;                    /* BLOCK_IO_OP_* */
	__s32 error;                 /* blk_status_t at completion, 0 = OK */
	__u32 queue_depth;           /* requests in flight on the disk after it */
	__u32 pid;                   /* thread that issued the request */
	__u32 tgid;                  /* process that issued the request */
	char disk_name[BLOCK_IO_DISK_NAME_LEN];    /* e.g. "vda", "nvme0n1" */
	char flags_readable[BLOCK_IO_FLAGS_LEN];   /* e.g. "Sync-Write" */
};

#endif
