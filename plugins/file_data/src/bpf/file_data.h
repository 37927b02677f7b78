/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Records of the file_data probe, shared by kernel and user side. */
#ifndef FILE_DATA_H
#define FILE_DATA_H

/* Bytes kept of a file name, its NUL included: longer names keep their
 * first 255 bytes and set name_truncated. */
#define FILE_DATA_NAME_LEN 256

/* Values of open_kind, in the order of the column's labels. */
#define FILE_DATA_OPEN 0   /* opened without O_CREAT */
#define FILE_DATA_CREATE 1 /* opened with O_CREAT (creat() included) */

/* Table 0, file_data: one row per successful open or create of a file. */
struct file_data_event {
	__u64 ts_uptime_us; /* when the open returned (CLOCK_BOOTTIME, us) */
	__u64 inode;        /* the opened file's inode number */
	__u64 size_bytes;   /* the file's size when opened (i_size) */
	__u32 pid;          /* thread id of the opener */
	__u32 tgid;         /* process id of the opener */
	__u32 flags;        /* the open flags (O_*), as passed */
	__u32 open_kind;    /* FILE_DATA_OPEN or FILE_DATA_CREATE */
	__u8 name_truncated; /* 1: the name was longer than 255 bytes */
	__u8 _pad[7];
	char name[FILE_DATA_NAME_LEN]; /* the name as passed, NUL-terminated */
};

#endif
