//! block_io: one row per completed block I/O request, joined in BPF from
//! `tp_btf/block_rq_issue` and `tp_btf/block_rq_complete` (with the
//! submitting task from `tp_btf/block_io_start` where the kernel has it):
//! latency, disk, sector, size, flags, issuing task and the disk's queue
//! depth.

use kernmlops_plugin_bpf::{
    bpf_probe, export_plugin, settings, BpfHooks, BpfProbe, LoadContext, Open, Result,
};

/// One record of the `block_io` table, generated from `src/bpf/block_io.h`.
pub type BlockIoEvent = skel::types::block_io_event;

/// Labels of `op`, indexed by the `BLOCK_IO_OP_*` values of `block_io.h`.
pub const OP_LABELS: &[&str] = &[
    "Read",
    "Write",
    "Flush",
    "Discard",
    "SecureErase",
    "ZoneAppend",
    "WriteZeroes",
    "ZoneOpen",
    "ZoneClose",
    "ZoneFinish",
    "ZoneReset",
    "ZoneResetAll",
    "DrvIn",
    "DrvOut",
    "Unknown",
];

settings! {
    /// `[probes.block_io]` settings.
    pub struct Config {
        /// Requests tracked between issue and completion, over all disks.
        pub inflight_entries: u32 = 65536,
    }
    validate(c) {
        if c.inflight_entries == 0 {
            return Err("inflight_entries must be at least 1".into());
        }
        Ok(())
    }
}

bpf_probe! {
    probe: BlockIo,
    name: "block_io",
    description: "Block I/O requests: issue-to-completion latency, device, sector, bytes, flags and per-device queue depth",
    settings: Config,
    hooks: custom,
    tables: [
        block_io(events, block_io_event, rate = 100_000):
            "One row per completed block I/O request whose issue was seen, and per fsync's empty pre-flush write" {
            ts_uptime_us [us]: "when the request completed (CLOCK_BOOTTIME)",
            issue_ts_uptime_us [us]: "when the request was issued to the driver (CLOCK_BOOTTIME)",
            latency_us [us]: "issue to completion",
            device: "dev_t of the disk, the kernel's MKDEV(major, minor) = major << 20 | minor",
            device_major: "major number of the disk",
            device_minor: "first minor number of the disk (the whole disk, not the partition)",
            disk_name: "name of the disk, e.g. vda or nvme0n1",
            sector: "first 512-byte sector, on the whole disk, at issue",
            segments: "physical segments (rq->nr_phys_segments) at issue",
            bytes [bytes]: "size of the request at issue (0 for a flush or an empty pre-flush write)",
            flags: "rq->cmd_flags at issue: REQ_OP_* in the low 8 bits, REQ_* flags above",
            op as label(OP_LABELS): "the operation (REQ_OP_*) of flags",
            flags_readable: "[Preflush-][FUA-][Meta-][Sync-]<op>, e.g. Sync-Write",
            error: "blk_status_t of the completion, 0 = OK",
            queue_depth: "requests in flight on the disk after this completion (issued since the probe started)",
            queue_depth_4k: "bytes in flight on the disk after this completion, / 4096",
            unmatched_completions: "completions skipped so far, all disks, because their issue was not seen",
            pid: "thread that submitted the request (see README: the issuing task)",
            tgid: "process that submitted the request (see README: the issuing task)",
        },
    ],
}

/// The `block_io` probe.
#[derive(Default)]
pub struct BlockIo;

impl BpfHooks for BlockIo {
    fn before_load(
        &mut self,
        open: &mut Open<Self>,
        cx: &mut LoadContext<'_, Config>,
    ) -> Result<()> {
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            fill_readable_names(&mut ro.readable_names);
        }
        let entries = cx.settings.inflight_entries;
        let size = |e: kernmlops_plugin_bpf::libbpf_rs::Error| {
            kernmlops_plugin_bpf::Error::new(format!("sizing the in-flight maps: {e}"))
        };
        open.maps.inflight.set_max_entries(entries).map_err(size)?;
        open.maps
            .submitters
            .set_max_entries(entries)
            .map_err(size)?;
        // block_io_start (Linux 6.5+) names the submitting task; without it
        // the task current at block_rq_issue stands in.
        if !cx.features.btf_has_type("btf_trace_block_io_start") {
            open.progs.handle_block_io_start.set_autoload(false);
            cx.note(
                "this kernel has no block_io_start tracepoint (Linux 6.5+): pid and tgid are the task current when a request is issued, which for requests issued from a queue is not the one that submitted it",
            );
        }
        Ok(())
    }
}

/// The flags `flags_readable` shows, by their bit in the BPF program's
/// table index.
const READABLE_FLAGS: [&str; 4] = ["Preflush-", "FUA-", "Meta-", "Sync-"];

/// `flags_readable` of flag set `set` (bit 0 Preflush, 1 FUA, 2 Meta, 3
/// Sync) and operation `op` (`BLOCK_IO_OP_*`; past the last, `Unknown`):
/// `[Preflush-][FUA-][Meta-][Sync-]<Op>`.
pub fn readable_name(set: usize, op: usize) -> String {
    let mut s: String = READABLE_FLAGS
        .iter()
        .enumerate()
        .filter(|(bit, _)| set >> bit & 1 == 1)
        .map(|(_, f)| *f)
        .collect();
    s.push_str(OP_LABELS[op.min(OP_LABELS.len() - 1)]);
    s
}

/// Writes every `flags_readable` string into the program's table, indexed
/// by flag set * ops + op, NUL-padded.
fn fill_readable_names<const N: usize>(table: &mut [[i8; N]]) {
    let ops = table.len() / (1 << READABLE_FLAGS.len());
    for (i, slot) in table.iter_mut().enumerate() {
        let name = readable_name(i / ops, i % ops);
        *slot = [0; N];
        // Names are ASCII (below 128) and at most 35 bytes: they fit, with
        // their NUL, in a C char each.
        for (d, b) in slot.iter_mut().zip(name.bytes().take(N - 1)) {
            *d = i8::try_from(b).unwrap_or(b'?' as i8);
        }
    }
}

export_plugin! {
    description: "Block I/O requests: issue-to-completion latency, device, sector, bytes, flags and per-device queue depth",
    probes: [BpfProbe<BlockIo>],
}

#[cfg(test)]
mod tests {
    use kernmlops_plugin_bpf::{
        sdk::{settings::parse, ColumnKind},
        BpfSpec,
    };

    use super::*;

    #[test]
    fn config_defaults_and_rejects_unknown_keys() {
        let parse = |json: &str| parse::<Config>("[probes.block_io]", json);
        let c = parse("{}").expect("empty config");
        assert_eq!(c.inflight_entries, 65536);
        let c = parse(r#"{"inflight_entries": 1024}"#).expect("inflight_entries");
        assert_eq!(c.inflight_entries, 1024);
        let e = parse(r#"{"inflight": 3}"#).expect_err("unknown key");
        assert!(e.message.contains("inflight"), "error names the key: {e}");
        assert!(parse(r#"{"inflight_entries": 0}"#).is_err());
    }

    #[test]
    fn readable_names_are_bcc_style_and_fit() {
        assert_eq!(readable_name(0, 0), "Read");
        assert_eq!(readable_name(8, 1), "Sync-Write");
        assert_eq!(readable_name(9, 1), "Preflush-Sync-Write");
        assert_eq!(readable_name(1, 2), "Preflush-Flush");
        assert_eq!(readable_name(6, 3), "FUA-Meta-Discard");
        assert_eq!(readable_name(15, 11), "Preflush-FUA-Meta-Sync-ZoneResetAll");
        assert_eq!(readable_name(0, 14), "Unknown");
        assert_eq!(readable_name(0, 15), "Unknown", "past the last op");
        let mut table = [[1i8; 64]; 256];
        fill_readable_names(&mut table);
        for (i, slot) in table.iter().enumerate() {
            let name = readable_name(i / 16, i % 16);
            let got: Vec<u8> = slot.iter().map(|&c| c as u8).collect();
            assert_eq!(&got[..name.len()], name.as_bytes());
            assert!(
                got[name.len()..].iter().all(|&c| c == 0),
                "{name}: NUL-padded"
            );
        }
    }

    #[test]
    fn op_is_a_u32_label_over_the_header_values() {
        let tables = BlockIo::tables();
        let col = tables[0]
            .columns
            .iter()
            .find(|c| c.name.as_str() == "op")
            .expect("op column declared");
        assert_eq!(col.kind, ColumnKind::LABEL);
        assert_eq!(col.size, 4, "op is a __u32 in block_io.h");
        // BLOCK_IO_OP_UNKNOWN is the last label.
        assert_eq!(OP_LABELS.len(), 15);
        assert_eq!(OP_LABELS.last(), Some(&"Unknown"));
    }
}
