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

/// An event laid out: its table and its slot's bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Laid {
    pub table: TableDecl,
    /// `struct trace_slot`, little endian.
    pub slot: Vec<u8>,
    /// The entry and exit are joined (latency, or a uprobe's ret).
    pub joined: bool,
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

/// Lays out one planned event for slot `slot_id`.
pub fn lay_out(plan: &EventPlan, comm: bool) -> Result<Laid, String> {
    let spec = &plan.spec;
    if plan.fetches.len() > MAX_FIELDS {
        return Err(format!(
            "records {} fields, at most {MAX_FIELDS}",
            plan.fetches.len()
        ));
    }
    let joined = spec.latency || spec.ret && spec.kind == Kind::Uprobe;
    let mut cols = vec![
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
    ];
    let mut end = HEADER;
    let mut flags = 0u32;
    let (mut comm_out, mut latency_out) = (0u16, 0u16);
    if comm {
        cols.push(column(
            "comm",
            ColumnKind::STR,
            end,
            16,
            "",
            "command name of the current task",
        ));
        comm_out = end as u16;
        flags |= TRACE_COMM;
        end += 16;
    }
    if joined {
        end = end.next_multiple_of(8);
        cols.push(column(
            "latency_ns",
            ColumnKind::U64,
            end,
            8,
            "ns",
            "time from the function's entry to its return",
        ));
        latency_out = end as u16;
        flags |= TRACE_LATENCY;
        end += 8;
    }
    let header_names = ["ts_uptime_us", "pid", "tgid", "cpu", "comm", "latency_ns"];
    let mut fetch_bytes = Vec::with_capacity(plan.fetches.len());
    let mut nargs = 0u32;
    for f in &plan.fetches {
        let mut name = f.column.clone();
        if header_names.contains(&name.as_str()) {
            name.push_str("_field");
        }
        if cols.iter().any(|c| c.name.as_str() == name) {
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
        end = end.next_multiple_of(align);
        let out = end;
        let mut col = column(&name, kind_of(&f.ty), out, size, "", &f.description);
        if let ColType::Label { labels, .. } = &f.ty {
            col.labels = labels
                .iter()
                .map(|l| l.as_str().into())
                .collect::<Vec<_>>()
                .into();
        }
        cols.push(col);
        end += size;
        let mut trunc_out = 0u32;
        if f.truncatable {
            let tname = format!("{name}_truncated");
            cols.push(column(
                &tname,
                ColumnKind::BOOL,
                end,
                1,
                "",
                &format!("{name} was longer than {} bytes and is cut", size - 1),
            ));
            trunc_out = end;
            end += 1;
        }
        if end > MAX_RECORD {
            return Err(format!(
                "records of more than {MAX_RECORD} bytes: record fewer or shorter fields"
            ));
        }
        if f.arg != crate::plan::ARG_RET {
            nargs = nargs.max(u32::from(f.arg) + 1);
        }
        let mut b = Vec::with_capacity(FETCH_BYTES);
        b.extend_from_slice(&f.last.to_le_bytes());
        for i in 0..MAX_DEREFS {
            b.extend_from_slice(&f.derefs.get(i).copied().unwrap_or(0).to_le_bytes());
        }
        b.extend_from_slice(&(out as u16).to_le_bytes());
        // Numbers read their size; strings their capacity.
        let read = if matches!(f.op, Op::Value | Op::Load | Op::StrInline) {
            f.size.min(size)
        } else {
            size
        };
        b.extend_from_slice(&(read as u16).to_le_bytes());
        b.extend_from_slice(&(trunc_out as u16).to_le_bytes());
        b.push(f.arg);
        b.push(f.derefs.len() as u8);
        b.push(op_code(f.op));
        b.push(u8::from(f.user));
        b.extend_from_slice(&[0, 0]);
        debug_assert_eq!(b.len(), FETCH_BYTES);
        fetch_bytes.push(b);
    }
    let record_size = end.next_multiple_of(8).max(HEADER);
    let mut slot = Vec::with_capacity(SLOT_BYTES);
    slot.extend_from_slice(&(plan.fetches.len() as u32).to_le_bytes());
    slot.extend_from_slice(&record_size.to_le_bytes());
    slot.extend_from_slice(&flags.to_le_bytes());
    slot.extend_from_slice(&nargs.to_le_bytes());
    slot.extend_from_slice(&comm_out.to_le_bytes());
    slot.extend_from_slice(&latency_out.to_le_bytes());
    slot.extend_from_slice(&0u32.to_le_bytes());
    for b in &fetch_bytes {
        slot.extend_from_slice(b);
    }
    slot.resize(SLOT_BYTES, 0);
    let what = match spec.kind {
        Kind::Tracepoint => "tracepoint",
        Kind::TpBtf => "BTF tracepoint",
        Kind::RawTp => "raw tracepoint",
        Kind::Uprobe | Kind::Uretprobe => "user function",
        _ => "kernel function",
    };
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        plan::{plan_event, Options, Sources},
        spec::parse_event,
    };

    fn laid(s: &str, comm: bool) -> Laid {
        let format = |_: &str, event: &str| {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data")
                .join(format!("{event}.format"));
            let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
            crate::format::parse(&text).map_err(|e| e.to_string())
        };
        let src = Sources {
            btf: None,
            format: &format,
        };
        let plan =
            plan_event(&parse_event(s).expect("spec"), &src, Options::default()).expect("plan");
        lay_out(&plan, comm).expect("layout")
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
