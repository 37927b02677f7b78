//! Record layout: each planned event's table (header columns, then one
//! column per fetch) and the `struct trace_slot` the BPF programs run, both
//! from the same offsets, so table and record cannot drift apart.
//!
//! Header: `ts_uptime_us` u64 @0, `pid` u32 @8, `tgid` u32 @12, `cpu` u32
//! @16, the slot (u16 @20, not a column), then `comm` (16 bytes) when
//! asked, `latency_ns` u64 for joined events, then the fields, each integer
//! at its natural alignment. A field named like a header column gets the
//! suffix `_field` (`sched_process_exec`'s `pid` is `pid_field`).

use kernmlops_plugin_sdk::{api::ColumnDecl, ColumnKind, TableDecl};

use crate::{
    plan::{ColType, EventPlan, Op},
    spec::Kind,
};

pub const MAX_SLOTS: usize = 16;
pub const MAX_FIELDS: usize = 32;
pub const MAX_DEREFS: usize = 8;
pub const MAX_RECORD: u32 = 4096;
/// Largest read of one fetch (`TRACE_MAX_READ` - 1).
pub const MAX_READ: u32 = 511;
pub const SLOT_OFFSET: usize = 20;
const HEADER: u32 = 24;
const FETCH_BYTES: usize = 48;
const SLOT_HEADER_BYTES: usize = 24;
/// `sizeof(struct trace_slot)`.
pub const SLOT_BYTES: usize = SLOT_HEADER_BYTES + MAX_FIELDS * FETCH_BYTES;

/// Slot flags (trace.h).
const TRACE_COMM: u32 = 1;
const TRACE_LATENCY: u32 = 2;
const TRACE_COUNT: u32 = 4;
const TRACE_KEY_PID: u32 = 8;
const TRACE_KEY_TGID: u32 = 16;
const TRACE_KEY_CPU: u32 = 32;

/// Bytes of a count event's key (`TRACE_COUNT_KEY`): the record's bytes
/// from offset 8 (after `ts_uptime_us`), header columns not in the key
/// zeroed, the slot included.
pub const COUNT_KEY: u32 = 128;
/// Where a counted record's key starts.
const KEY_START: u32 = 8;
/// A count event's record: its key, then `latency_ns` (outside the key).
const COUNT_RECORD: u32 = KEY_START + COUNT_KEY + 8;

/// How a count event's rows are made from its kernel map (`trace_counts`):
/// each row copies its key columns out of the map's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountLayout {
    /// (offset in the map's key, offset in the row, bytes), per key column.
    pub copies: Vec<(u32, u32, u32)>,
    /// Offset of `count` (u64) in the row.
    pub count_out: u32,
    /// Offset of `latency_total_ns`, followed by `latency_min_ns` and
    /// `latency_max_ns` (u64 each), for latency events.
    pub latency_out: Option<u32>,
    /// The interval, microseconds.
    pub interval_us: u64,
}

/// An event laid out: its table and its slot's bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Laid {
    pub table: TableDecl,
    /// `struct trace_slot`, little endian.
    pub slot: Vec<u8>,
    /// The entry and exit are joined (latency, or a uprobe's ret).
    pub joined: bool,
    /// Count mode: how rows are made from the kernel's counts.
    pub count: Option<CountLayout>,
}

fn op_code(op: Op) -> u8 {
    match op {
        Op::Value => 0,
        Op::Load => 1,
        Op::StrValue => 2,
        Op::StrInline => 3,
        Op::StrPtr => 4,
        Op::DynStr { relative: false } => 5,
        Op::DynStr { relative: true } => 6,
    }
}

fn kind_of(ty: &ColType) -> ColumnKind {
    match ty {
        ColType::Int { size, signed } => match (size, signed) {
            (1, false) => ColumnKind::U8,
            (2, false) => ColumnKind::U16,
            (4, false) => ColumnKind::U32,
            (8, false) => ColumnKind::U64,
            (1, true) => ColumnKind::I8,
            (2, true) => ColumnKind::I16,
            (4, true) => ColumnKind::I32,
            _ => ColumnKind::I64,
        },
        ColType::Bool => ColumnKind::BOOL,
        ColType::Str(_) => ColumnKind::STR,
        ColType::Label { .. } => ColumnKind::LABEL,
    }
}

fn column(
    name: &str,
    kind: ColumnKind,
    offset: u32,
    size: u32,
    unit: &str,
    desc: &str,
) -> ColumnDecl {
    ColumnDecl {
        name: name.into(),
        kind,
        offset,
        size,
        unit: unit.into(),
        description: desc.into(),
        labels: Vec::new().into(),
    }
}

/// The table of exits seen without their entry, declared when an event
/// joins entry and exit.
pub const UNMATCHED_TABLE: &str = "trace_unmatched_exits";
/// Its record: ts_uptime_us u64 | unmatched_exits u64 | event u16 | pad.
pub const UNMATCHED_RECORD: u32 = 24;

/// `trace_unmatched_exits`: per joined event, the exits that came without
/// their entry since its previous row (the entry predates the probe, or a
/// thread's entries piled up past TRACE_MAX_DEPTH); `event` names the
/// event's table among `tables`.
pub fn unmatched_table(tables: &[TableDecl]) -> TableDecl {
    let mut event = column(
        "event",
        ColumnKind::LABEL,
        16,
        2,
        "",
        "table of the joined event whose exits these are",
    );
    event.labels = tables.iter().map(|t| t.name.clone()).collect();
    TableDecl {
        name: UNMATCHED_TABLE.into(),
        description: "Exits of joined (latency) events seen without their entry, per event: no row was made for them".into(),
        record_size: UNMATCHED_RECORD,
        columns: vec![
            column(
                "ts_uptime_us",
                ColumnKind::U64,
                0,
                8,
                "us",
                "when the drain read the count (CLOCK_BOOTTIME)",
            ),
            column(
                "unmatched_exits",
                ColumnKind::U64,
                8,
                8,
                "count",
                "exits without their entry since the event's previous row",
            ),
            event,
        ]
        .into(),
    }
}

/// One `struct trace_fetch`: a read into the record.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SlotFetch {
    last: u32,
    derefs: Vec<u32>,
    out: u32,
    /// Bytes read, or a string's capacity.
    read: u32,
    trunc_out: u32,
    arg: u8,
    op: u8,
    user: bool,
}

impl SlotFetch {
    /// Appends its `struct trace_fetch` bytes (little endian).
    fn encode(&self, b: &mut Vec<u8>) {
        let start = b.len();
        b.extend_from_slice(&self.last.to_le_bytes());
        for i in 0..MAX_DEREFS {
            b.extend_from_slice(&self.derefs.get(i).copied().unwrap_or(0).to_le_bytes());
        }
        b.extend_from_slice(&(self.out as u16).to_le_bytes());
        b.extend_from_slice(&(self.read as u16).to_le_bytes());
        b.extend_from_slice(&(self.trunc_out as u16).to_le_bytes());
        b.push(self.arg);
        b.push(self.derefs.len() as u8);
        b.push(self.op);
        b.push(u8::from(self.user));
        b.extend_from_slice(&[0, 0]);
        debug_assert_eq!(b.len() - start, FETCH_BYTES);
    }

    /// `next` continues this read: the same kernel memory right after it
    /// (same argument and pointer chain), into the record right after it,
    /// so one read does both (`prev->pid, prev->tgid`: one read of 8 bytes
    /// instead of two of 4; each read is a helper call).
    fn continued_by(&self, next: &SlotFetch) -> bool {
        let plain_load = |f: &SlotFetch| f.op == op_code(Op::Load) && !f.user && f.trunc_out == 0;
        plain_load(self)
            && plain_load(next)
            && self.arg == next.arg
            && self.derefs == next.derefs
            && self.last.checked_add(self.read) == Some(next.last)
            && self.out + self.read == next.out
            && self.read + next.read <= MAX_READ
    }
}

/// The fetches with each run of reads that continue one another merged
/// into one read: a failed read zeroes them all, as it would each (they
/// follow the same pointers).
fn merge_adjacent(fetches: Vec<SlotFetch>) -> Vec<SlotFetch> {
    let mut out: Vec<SlotFetch> = Vec::with_capacity(fetches.len());
    for f in fetches {
        match out.last_mut() {
            Some(prev) if prev.continued_by(&f) => prev.read += f.read,
            _ => out.push(f),
        }
    }
    out
}

/// A record being laid out: its columns so far, where the next starts, and
/// the slot's flags and header offsets.
struct Record {
    cols: Vec<ColumnDecl>,
    end: u32,
    flags: u32,
    comm_out: u16,
    latency_out: u16,
    /// Arguments the fields read.
    nargs: u32,
}

/// Names a field may not take: the header's (it gets `_field`).
const HEADER_NAMES: [&str; 6] = ["ts_uptime_us", "pid", "tgid", "cpu", "comm", "latency_ns"];

impl Record {
    /// The header: time, pid, tgid and cpu, then `comm` when asked and
    /// `latency_ns` for a joined event (a counted one keeps it outside the
    /// key, after it).
    fn header(comm: bool, joined: bool, count: bool) -> Record {
        let mut r = Record {
            cols: vec![
                column(
                    "ts_uptime_us",
                    ColumnKind::U64,
                    0,
                    8,
                    "us",
                    "when the event happened (CLOCK_BOOTTIME; a joined event's entry)",
                ),
                column(
                    "pid",
                    ColumnKind::U32,
                    8,
                    4,
                    "",
                    "thread id of the current task",
                ),
                column(
                    "tgid",
                    ColumnKind::U32,
                    12,
                    4,
                    "",
                    "process id of the current task",
                ),
                column(
                    "cpu",
                    ColumnKind::U32,
                    16,
                    4,
                    "",
                    "CPU the event happened on",
                ),
            ],
            end: HEADER,
            flags: 0,
            comm_out: 0,
            latency_out: 0,
            nargs: 0,
        };
        if comm {
            r.cols.push(column(
                "comm",
                ColumnKind::STR,
                r.end,
                16,
                "",
                "command name of the current task",
            ));
            r.comm_out = r.end as u16;
            r.flags |= TRACE_COMM;
            r.end += 16;
        }
        if joined && count {
            r.latency_out = (KEY_START + COUNT_KEY) as u16;
            r.flags |= TRACE_LATENCY;
        } else if joined {
            r.end = r.end.next_multiple_of(8);
            r.cols.push(column(
                "latency_ns",
                ColumnKind::U64,
                r.end,
                8,
                "ns",
                "time from the function's entry to its return",
            ));
            r.latency_out = r.end as u16;
            r.flags |= TRACE_LATENCY;
            r.end += 8;
        }
        r
    }

    /// Adds a field's column (and its `_truncated` flag) at its natural
    /// alignment; its fetch.
    fn field(&mut self, f: &crate::plan::Fetch) -> Result<SlotFetch, String> {
        let mut name = f.column.clone();
        if HEADER_NAMES.contains(&name.as_str()) {
            name.push_str("_field");
        }
        if self.cols.iter().any(|c| c.name.as_str() == name) {
            return Err(format!("column {name} twice: rename one with alias="));
        }
        let size = f.ty.size();
        if size == 0 || size > MAX_READ {
            return Err(format!(
                "{name}: a read of {size} bytes (at most {MAX_READ})"
            ));
        }
        if f.derefs.len() > MAX_DEREFS {
            return Err(format!("{name}: more than {MAX_DEREFS} pointer steps"));
        }
        let align = match f.ty {
            ColType::Int { size, .. } | ColType::Label { size, .. } => u32::from(size),
            _ => 1,
        };
        self.end = self.end.next_multiple_of(align);
        let out = self.end;
        let mut col = column(&name, kind_of(&f.ty), out, size, "", &f.description);
        if let ColType::Label { labels, .. } = &f.ty {
            col.labels = labels
                .iter()
                .map(|l| l.as_str().into())
                .collect::<Vec<_>>()
                .into();
        }
        self.cols.push(col);
        self.end += size;
        let mut trunc_out = 0u32;
        if f.truncatable {
            self.cols.push(column(
                &format!("{name}_truncated"),
                ColumnKind::BOOL,
                self.end,
                1,
                "",
                &format!("{name} was longer than {} bytes and is cut", size - 1),
            ));
            trunc_out = self.end;
            self.end += 1;
        }
        if self.end > MAX_RECORD {
            return Err(format!(
                "records of more than {MAX_RECORD} bytes: record fewer or shorter fields"
            ));
        }
        if f.arg != crate::plan::ARG_RET {
            self.nargs = self.nargs.max(u32::from(f.arg) + 1);
        }
        // Numbers read their size; strings their capacity.
        let read = if matches!(f.op, Op::Value | Op::Load | Op::StrInline) {
            f.size.min(size)
        } else {
            size
        };
        Ok(SlotFetch {
            last: f.last,
            derefs: f.derefs.clone(),
            out,
            read,
            trunc_out,
            arg: f.arg,
            op: op_code(f.op),
            user: f.user,
        })
    }

    /// Count mode: the key's bound checked, the key flags set, the record
    /// the fixed size of a counted one.
    fn count_key(&mut self, keys: &[String]) -> Result<(), String> {
        if self.end > KEY_START + COUNT_KEY {
            return Err(format!(
                "a count key of {} bytes, at most {COUNT_KEY}: key by fewer or shorter columns (string_bytes)",
                self.end - KEY_START
            ));
        }
        self.flags |= TRACE_COUNT;
        for (name, flag) in [
            ("pid", TRACE_KEY_PID),
            ("tgid", TRACE_KEY_TGID),
            ("cpu", TRACE_KEY_CPU),
        ] {
            if keys.iter().any(|k| k == name) {
                self.flags |= flag;
            }
        }
        self.end = COUNT_RECORD;
        Ok(())
    }

    /// The record's size: a multiple of 8, at least the header.
    fn size(&self) -> u32 {
        self.end.next_multiple_of(8).max(HEADER)
    }

    /// `struct trace_slot`'s bytes, with `fetches`.
    fn slot(&self, fetches: &[SlotFetch]) -> Vec<u8> {
        let mut slot = Vec::with_capacity(SLOT_BYTES);
        slot.extend_from_slice(&(fetches.len() as u32).to_le_bytes());
        slot.extend_from_slice(&self.size().to_le_bytes());
        slot.extend_from_slice(&self.flags.to_le_bytes());
        slot.extend_from_slice(&self.nargs.to_le_bytes());
        slot.extend_from_slice(&self.comm_out.to_le_bytes());
        slot.extend_from_slice(&self.latency_out.to_le_bytes());
        slot.extend_from_slice(&0u32.to_le_bytes());
        for f in fetches {
            f.encode(&mut slot);
        }
        slot.resize(SLOT_BYTES, 0);
        slot
    }
}

/// Lays out one planned event: its record (header, then the fields),
/// table and slot.
pub fn lay_out(plan: &EventPlan, comm: bool) -> Result<Laid, String> {
    let spec = &plan.spec;
    if plan.fetches.len() > MAX_FIELDS {
        return Err(format!(
            "records {} fields, at most {MAX_FIELDS}",
            plan.fetches.len()
        ));
    }
    let joined = spec.latency || spec.ret && spec.kind == Kind::Uprobe;
    let keys = if spec.count { spec.keys() } else { Vec::new() };
    // A count event records its key only: comm when it is a key.
    let comm = if spec.count {
        keys.iter().any(|k| k == "comm")
    } else {
        comm
    };
    let mut record = Record::header(comm, joined, spec.count);
    let fetches = plan
        .fetches
        .iter()
        .map(|f| record.field(f))
        .collect::<Result<Vec<_>, _>>()?;
    let fetches = merge_adjacent(fetches);
    if spec.count {
        record.count_key(&keys)?;
    }
    let record_size = record.size();
    let slot = record.slot(&fetches);
    let cols = record.cols;
    let what = match spec.kind {
        Kind::Tracepoint => "tracepoint",
        Kind::TpBtf => "BTF tracepoint",
        Kind::RawTp => "raw tracepoint",
        Kind::Uprobe | Kind::Uretprobe => "user function",
        _ => "kernel function",
    };
    if spec.count {
        let (table, count) = count_table(spec, &keys, &cols, joined, what)?;
        return Ok(Laid {
            table,
            slot,
            joined,
            count: Some(count),
        });
    }
    let table = TableDecl {
        name: spec.table.as_str().into(),
        description: format!("trace: one row per {what} event {}", spec.text.trim()).into(),
        record_size,
        columns: cols.into(),
    };
    Ok(Laid {
        table,
        slot,
        joined,
        count: None,
    })
}

/// A count event's table: `ts_uptime_us` (the interval's end), its key
/// columns in the order `by` names them (each string key followed by its
/// `_truncated` flag), `count`, and for latency events the total, least
/// and greatest latency. `record` is the kernel record's columns.
fn count_table(
    spec: &crate::spec::EventSpec,
    keys: &[String],
    record: &[ColumnDecl],
    joined: bool,
    what: &str,
) -> Result<(TableDecl, CountLayout), String> {
    let mut cols = vec![column(
        "ts_uptime_us",
        ColumnKind::U64,
        0,
        8,
        "us",
        "end of the interval the row counts (CLOCK_BOOTTIME)",
    )];
    let mut copies = Vec::new();
    let mut end = 8u32;
    for k in keys {
        let mut names = vec![k.clone()];
        let truncated = format!("{k}_truncated");
        if record.iter().any(|c| c.name.as_str() == truncated) {
            names.push(truncated);
        }
        for name in names {
            let Some(src) = record.iter().find(|c| c.name.as_str() == name) else {
                return Err(format!("count key {name} is not recorded"));
            };
            if src.offset < KEY_START || src.offset + src.size > KEY_START + COUNT_KEY {
                return Err(format!("count key {name} lies outside the key"));
            }
            let align = if src.kind == ColumnKind::STR || src.kind == ColumnKind::BOOL {
                1
            } else {
                src.size.max(1)
            };
            end = end.next_multiple_of(align);
            let mut c = src.clone();
            c.offset = end;
            cols.push(c);
            copies.push((src.offset - KEY_START, end, src.size));
            end += src.size;
        }
    }
    end = end.next_multiple_of(8);
    let count_out = end;
    cols.push(column(
        "count",
        ColumnKind::U64,
        end,
        8,
        "",
        "events with this key in the interval",
    ));
    end += 8;
    let latency_out = joined.then_some(end);
    if joined {
        for (name, desc) in [
            (
                "latency_total_ns",
                "sum of the latencies (entry to exit) of the interval's events with this key",
            ),
            (
                "latency_min_ns",
                "least latency of the interval's events with this key",
            ),
            (
                "latency_max_ns",
                "greatest latency of the interval's events with this key",
            ),
        ] {
            cols.push(column(name, ColumnKind::U64, end, 8, "ns", desc));
            end += 8;
        }
    }
    let table = TableDecl {
        name: spec.table.as_str().into(),
        description: format!(
            "trace: {what} events {} counted per {} every {}",
            spec.text.trim(),
            keys.join(", "),
            kernmlops_sys::duration::format_duration(std::time::Duration::from_micros(
                spec.interval_us
            ))
        )
        .into(),
        record_size: end,
        columns: cols.into(),
    };
    Ok((
        table,
        CountLayout {
            copies,
            count_out,
            latency_out,
            interval_us: spec.interval_us,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        plan::{plan_event, tests::test_format, Options, Sources},
        spec::parse_event,
    };

    fn laid(s: &str, comm: bool) -> Laid {
        let src = Sources {
            btf: None,
            format: &test_format,
        };
        let plan =
            plan_event(&parse_event(s).expect("spec"), &src, Options::default()).expect("plan");
        lay_out(&plan, comm).expect("layout")
    }

    /// (nfields, then per fetch: last, out, read) of a slot's bytes.
    fn fetches_of(slot: &[u8]) -> (u32, Vec<(u32, u16, u16)>) {
        let u32_at = |o: usize| u32::from_le_bytes(slot[o..o + 4].try_into().expect("4 bytes"));
        let u16_at = |o: usize| u16::from_le_bytes(slot[o..o + 2].try_into().expect("2 bytes"));
        let n = u32_at(0);
        let fetches = (0..n as usize)
            .map(|i| {
                let f = SLOT_HEADER_BYTES + i * FETCH_BYTES;
                (u32_at(f), u16_at(f + 36), u16_at(f + 38))
            })
            .collect();
        (n, fetches)
    }

    #[test]
    fn adjacent_reads_into_adjacent_columns_are_one_read() {
        // prev_pid (int @24), prev_prio (int @28), prev_state (long @32):
        // one run of the record, into columns 24, 28 and 32.
        let l = laid("sched:sched_switch(prev_pid, prev_prio, prev_state)", false);
        assert_eq!(fetches_of(&l.slot), (1, vec![(24, 24, 16)]));
        let names: Vec<&str> = l.table.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names[4..], ["prev_pid", "prev_prio", "prev_state"]);
        // Out of order in the record, or a string between: separate reads.
        let l = laid("sched:sched_switch(prev_prio, prev_pid)", false);
        assert_eq!(fetches_of(&l.slot), (2, vec![(28, 24, 4), (24, 28, 4)]));
        let l = laid("sched:sched_switch(prev_pid, next_comm, next_pid)", false);
        assert_eq!(fetches_of(&l.slot).0, 3);
    }

    #[test]
    fn tables_meet_the_spec_and_slots_match_the_c_struct() {
        for (event, comm) in [
            ("sched:sched_switch", true),
            ("sched:sched_process_exec", false),
            ("syscalls:sys_enter_openat(dfd, str(filename), flags)", true),
            ("block:block_rq_issue", true),
            ("raw_syscalls:sys_enter", false),
            ("uprobe:/bin/true:main(arg0, str(arg1)) latency", true),
        ] {
            let l = laid(event, comm);
            kernmlops_plugin_sdk::api::spec::validate_table(&l.table)
                .unwrap_or_else(|e| panic!("{event}: {e}"));
            assert_eq!(l.slot.len(), SLOT_BYTES);
            assert_eq!(l.table.record_size % 8, 0);
        }
        assert_eq!(
            SLOT_BYTES,
            std::mem::size_of::<crate::skel::types::trace_slot>()
        );
        assert_eq!(
            FETCH_BYTES,
            std::mem::size_of::<crate::skel::types::trace_fetch>()
        );
    }

    #[test]
    fn count_tables_copy_their_keys_from_the_map_key() {
        let l = laid(
            "raw_syscalls:sys_enter(id) latency exit=raw_syscalls:sys_exit count by=tgid,id",
            true,
        );
        kernmlops_plugin_sdk::api::spec::validate_table(&l.table).expect("valid");
        let names: Vec<&str> = l.table.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "ts_uptime_us",
                "tgid",
                "id",
                "count",
                "latency_total_ns",
                "latency_min_ns",
                "latency_max_ns"
            ]
        );
        let c = l.count.expect("count layout");
        // tgid: record offset 12, key offset 4; id: record offset 24 (no
        // comm in a count record unless it is a key), key offset 16.
        assert_eq!(c.copies, [(4, 8, 4), (16, 16, 8)]);
        assert_eq!(c.count_out, 24);
        assert_eq!(c.latency_out, Some(32));
        assert_eq!(l.table.record_size, 56);
        let flags = u32::from_le_bytes(l.slot[8..12].try_into().expect("4"));
        assert_eq!(flags, TRACE_LATENCY | TRACE_COUNT | TRACE_KEY_TGID);
        let record = u32::from_le_bytes(l.slot[4..8].try_into().expect("4"));
        assert_eq!(record, COUNT_RECORD);
        let latency_out = u16::from_le_bytes(l.slot[18..20].try_into().expect("2"));
        assert_eq!(u32::from(latency_out), KEY_START + COUNT_KEY);

        // comm as a key: the string and its place in the key.
        let l = laid("sched:sched_process_exec count by=comm,cpu", false);
        let c = l.count.expect("count layout");
        assert_eq!(c.copies, [(16, 8, 16), (8, 24, 4)]);
        assert_eq!(c.latency_out, None);
        let flags = u32::from_le_bytes(l.slot[8..12].try_into().expect("4"));
        assert_eq!(flags, TRACE_COMM | TRACE_COUNT | TRACE_KEY_CPU);
        // A string key brings its truncation flag.
        let l = laid("sched:sched_process_exec count by=filename", false);
        let names: Vec<&str> = l.table.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["ts_uptime_us", "filename", "filename_truncated", "count"]
        );
    }

    #[test]
    fn a_count_key_longer_than_the_map_key_is_refused() {
        let src = Sources {
            btf: None,
            format: &test_format,
        };
        let spec = parse_event("sched:sched_process_exec count by=filename,comm").expect("spec");
        let plan = plan_event(&spec, &src, Options { string_bytes: 256 }).expect("plan");
        let e = lay_out(&plan, true).expect_err("too long");
        assert!(e.contains("at most 128"), "{e}");
    }

    #[test]
    fn header_clashes_are_renamed_and_strings_flagged() {
        let l = laid("sched:sched_process_exec", true);
        let names: Vec<&str> = l.table.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "ts_uptime_us",
                "pid",
                "tgid",
                "cpu",
                "comm",
                "filename",
                "filename_truncated",
                "pid_field",
                "old_pid"
            ]
        );
        let j = laid("uprobe:/bin/true:main(arg0) ret", false);
        assert!(j.joined);
        assert!(j
            .table
            .columns
            .iter()
            .any(|c| c.name.as_str() == "latency_ns"));
        assert!(j.table.columns.iter().any(|c| c.name.as_str() == "ret"));
    }
}
