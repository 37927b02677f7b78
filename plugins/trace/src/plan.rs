//! Planning: each parsed event becomes the fetches the generic BPF
//! programs run (which argument, which pointer chain, how many bytes, as a
//! number or a string) and the columns of its table, from the
//! tracepoint's format file or from the kernel's BTF. Every unknown name is
//! one error line listing what exists, nearest names first.
//!
//! A fetch starts from a base value `v`: a classic tracepoint's record
//! address, or argument `arg` of the program's context (`ctx[arg]` for
//! tp_btf, raw_tp, fentry and fexit; a `pt_regs` register for uprobes).
//! Then `v = *(u64 *)(v + d)` for each `derefs` offset `d`, and the
//! [`Op`] reads at `v + last` (or takes `v` itself).

use kernmlops_sys::btf::{Btf, Kind as BtfKind};

use crate::{
    format::{FieldType, Format},
    spec::{EventSpec, Field, Kind, Target, MAX_PATH_STEPS},
};

/// `arg` of the return value (`PT_REGS_RC` for uretprobes; fexit reads it
/// after the arguments, at `ctx[nr_args]`).
pub const ARG_RET: u8 = 0xff;

/// What a fetch does at its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The value `v` itself, its low `size` bytes.
    Value,
    /// `size` bytes at `v + last`.
    Load,
    /// A NUL-terminated string at `v` (`str(arg1)` of a `char *`).
    StrValue,
    /// A char array at `v + last` (`comm[16]`), up to its length.
    StrInline,
    /// A string through the pointer at `v + last` (`str(file->name)`).
    StrPtr,
    /// A `__data_loc` string: the u32 at `v + last` holds length << 16 |
    /// offset from `v` (from the end of the u32 for `__rel_loc`).
    DynStr { relative: bool },
}

/// The type of a column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColType {
    Int {
        size: u8,
        signed: bool,
    },
    Bool,
    /// Text of at most this many bytes (with its NUL).
    Str(u32),
    /// An enum whose values are 0..labels.len(): stored as `size` bytes.
    Label {
        size: u8,
        labels: Vec<String>,
    },
}

impl ColType {
    /// Bytes of the column in a record.
    pub fn size(&self) -> u32 {
        match self {
            Self::Int { size, .. } | Self::Label { size, .. } => u32::from(*size),
            Self::Bool => 1,
            Self::Str(n) => *n,
        }
    }
}

/// One column's fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    pub column: String,
    /// Argument index, or [`ARG_RET`]; 0 for a classic tracepoint (the
    /// record).
    pub arg: u8,
    /// Pointer steps before the last: `v = *(u64 *)(v + d)`.
    pub derefs: Vec<u32>,
    /// Offset of the last read from `v` (unused by `Value`/`StrValue`).
    pub last: u32,
    pub op: Op,
    /// Bytes read (numbers) or the string's capacity with its NUL.
    pub size: u32,
    /// Read from user memory (`bpf_probe_read_user*`).
    pub user: bool,
    pub ty: ColType,
    pub description: String,
    /// A string that may be cut at `size`: the table gets a
    /// `<column>_truncated` flag.
    pub truncatable: bool,
}

/// Where an event's program attaches and what it records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventPlan {
    pub spec: EventSpec,
    pub fetches: Vec<Fetch>,
    /// Fields left out (an event's format field no column can hold), one
    /// sentence each, for notes.
    pub skipped: Vec<String>,
}

/// Planning options from the settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Capacity of a string column, NUL included.
    pub string_bytes: u32,
}

impl Default for Options {
    fn default() -> Self {
        Self { string_bytes: 64 }
    }
}

/// Why an event cannot be planned: one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("trace event {event:?}: {problem}")]
pub struct PlanError {
    pub event: String,
    pub problem: String,
}

/// Where planning gets its facts: BTF (for typed kinds) and format files.
pub struct Sources<'a> {
    pub btf: Option<&'a Btf>,
    /// Reads a tracepoint's format file (system, event).
    pub format: &'a dyn Fn(&str, &str) -> Result<Format, String>,
}

/// Levenshtein distance, for nearest names.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// `names`, nearest to `wanted` first (a prefix or substring counts as
/// near), at most `max` of them, with how many more exist.
pub fn nearest<'a>(wanted: &str, names: impl IntoIterator<Item = &'a str>, max: usize) -> String {
    let mut all: Vec<(usize, &str)> = names
        .into_iter()
        .map(|n| {
            let d = if n.contains(wanted) || wanted.contains(n) {
                0
            } else {
                distance(wanted, n)
            };
            (d, n)
        })
        .collect();
    all.sort_unstable();
    all.dedup_by(|a, b| a.1 == b.1);
    let total = all.len();
    let shown: Vec<&str> = all.iter().take(max).map(|(_, n)| *n).collect();
    if total == 0 {
        "none".to_owned()
    } else if total > max {
        format!("{} (and {} more)", shown.join(", "), total - max)
    } else {
        shown.join(", ")
    }
}

/// Plans one event.
pub fn plan_event(
    spec: &EventSpec,
    src: &Sources<'_>,
    opts: Options,
) -> Result<EventPlan, PlanError> {
    let err = |problem: String| PlanError {
        event: spec.text.clone(),
        problem,
    };
    let mut plan = EventPlan {
        spec: spec.clone(),
        fetches: Vec::new(),
        skipped: Vec::new(),
    };
    match (&spec.kind, &spec.target) {
        (Kind::Tracepoint, Target::Tracepoint { system, event }) => {
            let format = (src.format)(system, event).map_err(err)?;
            plan_tracepoint(&mut plan, &format, system, opts).map_err(err)?;
        }
        (Kind::TpBtf, Target::Name(name)) => {
            let btf = src
                .btf
                .ok_or_else(|| err("tp_btf: needs the kernel's BTF".into()))?;
            let typedef = format!("btf_trace_{name}");
            let proto = btf
                .type_id(&typedef)
                .and_then(|id| btf.func_proto(id))
                .ok_or_else(|| {
                    let names = btf
                        .names_of_kind(BtfKind::Typedef)
                        .filter_map(|n| n.strip_prefix("btf_trace_"));
                    err(format!(
                        "no BTF tracepoint {name} (btf_trace_{name}); nearest: {}",
                        nearest(name, names, 8)
                    ))
                })?;
            // The first parameter is the tracepoint's private data.
            let names = tracepoint_param_names(btf, name, &proto.params);
            let params: Vec<(String, u32)> = proto
                .params
                .iter()
                .zip(names)
                .skip(1)
                .map(|((_, t), n)| (n, *t))
                .collect();
            plan_btf_args(&mut plan, btf, &params, None, opts).map_err(err)?;
        }
        (Kind::Fentry | Kind::Fexit | Kind::Func, Target::Name(name)) => {
            let btf = src
                .btf
                .ok_or_else(|| err(format!("{}: needs the kernel's BTF", spec.kind)))?;
            let proto = btf
                .type_id_of_kind(name, BtfKind::Func)
                .and_then(|id| btf.func_proto(id))
                .ok_or_else(|| {
                    err(format!(
                        "no kernel function {name} in BTF; nearest: {}",
                        nearest(name, btf.names_of_kind(BtfKind::Func), 8)
                    ))
                })?;
            let params: Vec<(String, u32)> = proto
                .params
                .iter()
                .map(|(n, t)| ((*n).to_owned(), *t))
                .collect();
            let ret = (spec.ret || spec.kind == Kind::Fexit).then_some(proto.ret);
            plan_btf_args(&mut plan, btf, &params, ret, opts).map_err(err)?;
        }
        (Kind::RawTp | Kind::Kprobe | Kind::Kretprobe | Kind::Uprobe | Kind::Uretprobe, _) => {
            plan_untyped(&mut plan, opts).map_err(err)?;
        }
        (kind, target) => {
            return Err(err(format!("{kind}: does not take {target:?}")));
        }
    }
    if let Some((system, event)) = &spec.exit {
        // The exit tracepoint must exist; its fields are not recorded.
        (src.format)(system, event).map_err(|e| err(format!("exit={system}:{event}: {e}")))?;
    }
    if spec.count {
        keep_keys(&mut plan).map_err(err)?;
    }
    Ok(plan)
}

/// Columns every event's record has, which a count event may key by.
pub const HEADER_KEYS: [&str; 4] = ["pid", "tgid", "cpu", "comm"];

/// A count event records its key fields only: the fetches of the columns
/// `by` names (a header column, or a field, also by its `_field` name where
/// it clashes with a header column), in the order named. Fields left out
/// of the key are not read.
fn keep_keys(plan: &mut EventPlan) -> Result<(), String> {
    let keys = plan.spec.keys();
    let mut kept = Vec::new();
    for k in &keys {
        if HEADER_KEYS.contains(&k.as_str()) {
            continue;
        }
        let found = plan.fetches.iter().position(|f| {
            f.column == *k
                || (HEADER_KEYS.contains(&f.column.as_str()) && format!("{}_field", f.column) == *k)
        });
        match found {
            Some(i) => kept.push(plan.fetches[i].clone()),
            None => {
                let names: Vec<String> = HEADER_KEYS
                    .iter()
                    .map(|h| (*h).to_owned())
                    .chain(plan.fetches.iter().map(|f| {
                        if HEADER_KEYS.contains(&f.column.as_str()) {
                            format!("{}_field", f.column)
                        } else {
                            f.column.clone()
                        }
                    }))
                    .collect();
                return Err(format!(
                    "count key {k} is no column of this event; keys: {}",
                    nearest(k, names.iter().map(String::as_str), 16)
                ));
            }
        }
    }
    plan.fetches = kept;
    Ok(())
}

/// Parameter names of BTF tracepoint `name`: the `btf_trace_<name>`
/// typedef has types only, so the names come from the `__bpf_trace_<class>`
/// function the kernel generates for the event's class, the one with the
/// same parameter types and the longest name in common with the event
/// (`__bpf_trace_block_rq` for `block_rq_insert`); `argN` when none has.
fn tracepoint_param_names(btf: &Btf, name: &str, params: &[(&str, u32)]) -> Vec<String> {
    let types: Vec<u32> = params.iter().map(|(_, t)| *t).collect();
    let fallback = || {
        (0..params.len())
            .map(|i| format!("arg{}", i.saturating_sub(1)))
            .collect()
    };
    let common = |a: &str| {
        a.bytes()
            .zip(name.bytes())
            .take_while(|(x, y)| x == y)
            .count()
    };
    let exact = format!("__bpf_trace_{name}");
    let best = btf
        .names_of_kind(BtfKind::Func)
        .filter_map(|f| f.strip_prefix("__bpf_trace_").map(|class| (f, class)))
        .filter_map(|(f, class)| {
            let proto = btf
                .type_id_of_kind(f, BtfKind::Func)
                .and_then(|id| btf.func_proto(id))?;
            let same = proto.params.len() == types.len()
                && proto
                    .params
                    .iter()
                    .zip(&types)
                    .all(|((_, a), b)| btf.resolve(*a) == btf.resolve(*b));
            let score = if f == exact {
                usize::MAX
            } else {
                common(class)
            };
            same.then_some((score, proto))
        })
        .max_by_key(|(score, _)| *score);
    match best {
        Some((_, proto)) => proto
            .params
            .iter()
            .enumerate()
            .map(|(i, (n, _))| {
                if n.is_empty() {
                    format!("arg{}", i.saturating_sub(1))
                } else {
                    (*n).to_owned()
                }
            })
            .collect(),
        None => fallback(),
    }
}

/// The columns of a classic tracepoint: its own fields, or those asked
/// for.
fn plan_tracepoint(
    plan: &mut EventPlan,
    format: &Format,
    system: &str,
    opts: Options,
) -> Result<(), String> {
    let own: Vec<&str> = format.own_fields().map(|f| f.name.as_str()).collect();
    let wanted: Vec<Field> = match &plan.spec.fields {
        Some(fields) => fields.clone(),
        None => format
            .own_fields()
            .map(|f| Field {
                root: f.name.clone(),
                steps: Vec::new(),
                string: false,
                column: crate::spec::snake(&f.name),
            })
            .collect(),
    };
    let all_fields = plan.spec.fields.is_none();
    for w in &wanted {
        let Some(f) = format.field(&w.root) else {
            return Err(format!(
                "tracepoint {} has no field {}; its fields: {}",
                format.name,
                w.root,
                nearest(&w.root, own.iter().copied(), 12)
            ));
        };
        if !w.steps.is_empty() {
            return Err(format!(
                "{}: a tracepoint's fields have no members (paths need tp_btf:{})",
                w.path(),
                format.name
            ));
        }
        let description = format!("{} {} (tracepoint field)", f.decl, f.name);
        let base = Fetch {
            column: w.column.clone(),
            arg: 0,
            derefs: Vec::new(),
            last: f.offset,
            op: Op::Load,
            size: f.size,
            user: false,
            ty: ColType::Bool,
            description,
            truncatable: false,
        };
        let fetch = match f.ty {
            FieldType::Int {
                size,
                signed,
                pointer,
            } => {
                if w.string {
                    if !pointer {
                        return Err(format!(
                            "str({}): the field is {}, not a pointer to a string",
                            f.name, f.decl
                        ));
                    }
                    Fetch {
                        op: Op::StrPtr,
                        size: opts.string_bytes,
                        // Syscall arguments point into the caller's memory.
                        user: system == "syscalls",
                        ty: ColType::Str(opts.string_bytes),
                        truncatable: true,
                        ..base
                    }
                } else {
                    Fetch {
                        ty: ColType::Int { size, signed },
                        ..base
                    }
                }
            }
            FieldType::Bool => Fetch {
                ty: ColType::Bool,
                ..base
            },
            FieldType::Chars(n) => Fetch {
                op: Op::StrInline,
                ty: ColType::Str(n),
                size: n,
                ..base
            },
            FieldType::DynStr { relative } => Fetch {
                op: Op::DynStr { relative },
                size: opts.string_bytes,
                ty: ColType::Str(opts.string_bytes),
                truncatable: true,
                ..base
            },
            FieldType::Array {
                size,
                signed,
                count,
            } => {
                // One column per element.
                for i in 0..count {
                    plan.fetches.push(Fetch {
                        column: format!("{}_{i}", w.column),
                        last: f.offset + i * u32::from(size),
                        size: u32::from(size),
                        ty: ColType::Int { size, signed },
                        description: format!("{} {}[{i}] (tracepoint field)", f.decl, f.name),
                        ..base.clone()
                    });
                }
                continue;
            }
            FieldType::Unsupported(why) => {
                if all_fields {
                    plan.skipped.push(format!(
                        "field {} of {} is {why}: left out",
                        f.name, format.name
                    ));
                    continue;
                }
                return Err(format!("field {} is {why}: no column can hold it", f.name));
            }
        };
        if w.string && !matches!(fetch.op, Op::StrPtr | Op::StrInline | Op::DynStr { .. }) {
            return Err(format!(
                "str({}): the field is {}, not a string",
                f.name, f.decl
            ));
        }
        plan.fetches.push(fetch);
    }
    Ok(())
}

/// Where a BTF path walk stands: a value of a type, or an address
/// (`v + offset`) holding a value of a type.
#[derive(Clone, Copy)]
enum At {
    Value(u32),
    Addr(u32, u32),
}

/// The columns of an event with BTF-typed arguments (tp_btf, fentry,
/// fexit, func): the paths asked for, or every argument.
fn plan_btf_args(
    plan: &mut EventPlan,
    btf: &Btf,
    params: &[(String, u32)],
    ret: Option<u32>,
    opts: Options,
) -> Result<(), String> {
    let param_names = || params.iter().map(|(n, _)| n.as_str());
    let fields: Vec<Field> = match &plan.spec.fields {
        Some(f) => f.clone(),
        None => params
            .iter()
            .enumerate()
            .map(|(i, (n, _))| Field {
                root: if n.is_empty() {
                    format!("arg{i}")
                } else {
                    n.clone()
                },
                steps: Vec::new(),
                string: false,
                column: crate::spec::snake(if n.is_empty() { "arg" } else { n }),
            })
            .collect(),
    };
    for f in &fields {
        let (arg, ty) = if let Some(i) = params.iter().position(|(n, _)| *n == f.root) {
            (i, params[i].1)
        } else if let Some(i) = f
            .root
            .strip_prefix("arg")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&i| i < params.len())
        {
            (i, params[i].1)
        } else {
            return Err(format!(
                "no argument {}; the arguments: {}",
                f.root,
                nearest(&f.root, param_names(), 12)
            ));
        };
        let arg = u8::try_from(arg).map_err(|_| "more than 255 arguments".to_owned())?;
        plan.fetches.push(walk(btf, f, arg, ty, opts)?);
    }
    if let Some(ret) = ret {
        if ret == 0 {
            return Err("ret: the function returns void".into());
        }
        let f = Field {
            root: "ret".into(),
            steps: Vec::new(),
            string: false,
            column: "ret".into(),
        };
        if plan.fetches.iter().any(|x| x.column == "ret") {
            return Err("column ret is taken by an argument: rename it with alias=".into());
        }
        let mut fetch = walk(btf, &f, ARG_RET, ret, opts)?;
        fetch.description = format!("return value ({})", btf.c_name(ret));
        plan.fetches.push(fetch);
    }
    Ok(())
}

/// Walks `field`'s path from argument `arg` of type `ty` through BTF.
fn walk(btf: &Btf, field: &Field, arg: u8, ty: u32, opts: Options) -> Result<Fetch, String> {
    let (at, derefs, path) = walk_path(btf, field, ty)?;
    if derefs.len() > MAX_PATH_STEPS {
        return Err(format!("{path}: more than {MAX_PATH_STEPS} pointer steps"));
    }
    let (op_at, last, t) = match at {
        At::Value(t) => (false, 0, t),
        At::Addr(off, t) => (true, off, t),
    };
    let c = btf.c_name(t);
    let leaf = Leaf {
        description: format!("{path} ({c})"),
        field,
        arg,
        derefs,
        last,
        op_at,
        rt: btf.resolve(t),
        path,
        c,
    };
    if field.string {
        string_fetch(btf, &leaf, opts)
    } else {
        typed_fetch(btf, &leaf, opts)
    }
}

/// Follows `field`'s steps from a value of type `ty`: where they end, the
/// offsets of the pointers read on the way, and the path as written.
fn walk_path(btf: &Btf, field: &Field, ty: u32) -> Result<(At, Vec<u32>, String), String> {
    let mut derefs = Vec::new();
    let mut at = At::Value(ty);
    let mut path = field.root.clone();
    for (name, deref) in &field.steps {
        let not_pointer = |t: u32| {
            format!(
                "{path} is {}, not a pointer: use . for a member",
                btf.c_name(t)
            )
        };
        let struct_ty = match (at, *deref) {
            (At::Value(t), true) => btf.pointee(t).ok_or_else(|| not_pointer(t))?,
            (At::Addr(off, t), true) => {
                let p = btf.pointee(t).ok_or_else(|| not_pointer(t))?;
                derefs.push(off);
                p
            }
            (At::Addr(_, t), false) => t,
            (At::Value(t), false) => {
                return Err(format!(
                    "{path} is {}: write {path}->{name} to go through a pointer",
                    btf.c_name(t)
                ))
            }
        };
        let base = match at {
            At::Addr(off, _) if !*deref => off,
            _ => 0,
        };
        let sty = btf.resolve(struct_ty);
        if !matches!(btf.kind(sty), Some(BtfKind::Struct | BtfKind::Union)) {
            return Err(format!(
                "{path} leads to {}, which has no members",
                btf.c_name(struct_ty)
            ));
        }
        let m = btf.find_member(sty, name).ok_or_else(|| {
            format!(
                "{} has no member {name}; its members: {}",
                btf.c_name(struct_ty),
                nearest(name, btf.member_names(sty), 12)
            )
        })?;
        if m.bitfield_bits != 0 || m.bit_offset % 8 != 0 {
            return Err(format!(
                "{path}{}{name} is a bitfield, which cannot be fetched yet",
                if *deref { "->" } else { "." }
            ));
        }
        at = At::Addr(base + m.bit_offset / 8, m.type_id);
        path.push_str(if *deref { "->" } else { "." });
        path.push_str(name);
    }
    Ok((at, derefs, path))
}

/// Where a walk ended, for the fetch made there.
struct Leaf<'a> {
    field: &'a Field,
    arg: u8,
    derefs: Vec<u32>,
    last: u32,
    /// The path ends in memory (`last` past the last pointer), not in the
    /// argument's value.
    op_at: bool,
    /// The type there, resolved.
    rt: u32,
    path: String,
    /// The type's C name.
    c: String,
    description: String,
}

impl Leaf<'_> {
    fn fetch(&self, op: Op, size: u32, ty: ColType, truncatable: bool) -> Fetch {
        Fetch {
            column: self.field.column.clone(),
            arg: self.arg,
            derefs: self.derefs.clone(),
            last: self.last,
            op,
            size,
            user: false,
            ty,
            description: self.description.clone(),
            truncatable,
        }
    }

    /// A load where the path ends in memory, else the value itself.
    fn op(&self) -> Op {
        if self.op_at {
            Op::Load
        } else {
            Op::Value
        }
    }
}

/// `str(path)`: a char pointer, or a char array in memory.
fn string_fetch(btf: &Btf, leaf: &Leaf<'_>, opts: Options) -> Result<Fetch, String> {
    let (rt, path, c) = (leaf.rt, &leaf.path, &leaf.c);
    let is_char = |id: u32| btf.int_info(id).is_some_and(|i| i.size == 1);
    if let Some(p) = btf.pointee(rt) {
        if !is_char(p) {
            return Err(format!("str({path}): {path} is {c}, not a char pointer"));
        }
        let op = if leaf.op_at { Op::StrPtr } else { Op::StrValue };
        return Ok(leaf.fetch(op, opts.string_bytes, ColType::Str(opts.string_bytes), true));
    }
    if let (Some((elem, n)), true) = (btf.array(rt), leaf.op_at) {
        if is_char(elem) && n > 0 {
            let n = n.min(opts.string_bytes.max(16));
            return Ok(leaf.fetch(Op::StrInline, n, ColType::Str(n), false));
        }
    }
    Err(format!("str({path}): {path} is {c}, not a string"))
}

/// A number (integer, bool, pointer, enum: a label when dense) or a char
/// array, by the type where the path ends.
fn typed_fetch(btf: &Btf, leaf: &Leaf<'_>, opts: Options) -> Result<Fetch, String> {
    let (rt, path, c, op) = (leaf.rt, &leaf.path, &leaf.c, leaf.op());
    match btf.kind(rt) {
        Some(BtfKind::Int) => {
            let i = btf.int_info(rt).ok_or("unreadable int")?;
            if i.is_bool && i.size == 1 {
                return Ok(leaf.fetch(op, 1, ColType::Bool, false));
            }
            let size = u8::try_from(i.size)
                .ok()
                .filter(|s| matches!(s, 1 | 2 | 4 | 8))
                .ok_or_else(|| format!("{path} is {c}, an integer of {} bytes", i.size))?;
            Ok(leaf.fetch(
                op,
                i.size,
                ColType::Int {
                    size,
                    signed: i.signed,
                },
                false,
            ))
        }
        Some(BtfKind::Ptr) => Ok(leaf.fetch(
            op,
            8,
            ColType::Int {
                size: 8,
                signed: false,
            },
            false,
        )),
        Some(BtfKind::Enum | BtfKind::Enum64) => enum_fetch(btf, leaf),
        Some(BtfKind::Struct | BtfKind::Union) => Err(format!(
            "{path} is {c}: name a member, one of {}",
            nearest("", btf.member_names(rt), 12)
        )),
        Some(BtfKind::Array) if leaf.op_at => {
            let (elem, n) = btf.array(rt).ok_or("unreadable array")?;
            if btf.int_info(elem).is_some_and(|i| i.size == 1 && i.is_char) {
                let n = n.min(opts.string_bytes.max(16));
                return Ok(leaf.fetch(Op::StrInline, n, ColType::Str(n), false));
            }
            Err(format!(
                "{path} is {c}, an array (only char arrays can be fetched)"
            ))
        }
        _ => Err(format!("{path} is {c}, which cannot be fetched")),
    }
}

/// An enum: labels by BTF name when its values are 0, 1, 2 ... (at most
/// 1024, at most 4 bytes), else a signed integer with the values named in
/// the description.
fn enum_fetch(btf: &Btf, leaf: &Leaf<'_>) -> Result<Fetch, String> {
    let (rt, path, c, op) = (leaf.rt, &leaf.path, &leaf.c, leaf.op());
    let size = btf.size_of(rt).unwrap_or(4);
    let values = btf.enum_values(rt).unwrap_or_default();
    let dense = !values.is_empty()
        && values.len() <= 1024
        && values.iter().enumerate().all(|(i, (_, v))| *v == i as i64);
    let size8 = u8::try_from(size)
        .ok()
        .filter(|s| matches!(s, 1 | 2 | 4 | 8))
        .ok_or_else(|| format!("{path} is {c} of {size} bytes"))?;
    if dense && size <= 4 {
        let labels = values.iter().map(|(n, _)| (*n).to_owned()).collect();
        return Ok(leaf.fetch(
            op,
            size,
            ColType::Label {
                size: size8,
                labels,
            },
            false,
        ));
    }
    let mut f = leaf.fetch(
        op,
        size,
        ColType::Int {
            size: size8,
            signed: true,
        },
        false,
    );
    let shown: Vec<String> = values
        .iter()
        .take(16)
        .map(|(n, v)| format!("{n}={v}"))
        .collect();
    f.description = format!("{}: {}", leaf.description, shown.join(", "));
    Ok(f)
}

/// Argument `arg` (or the return value) itself, 64 bits, as column
/// `column`.
fn arg_value(column: &str, arg: u8, user: bool, description: String) -> Fetch {
    Fetch {
        column: column.to_owned(),
        arg,
        derefs: Vec::new(),
        last: 0,
        op: Op::Value,
        size: 8,
        user,
        ty: ColType::Int {
            size: 8,
            signed: false,
        },
        description,
        truncatable: false,
    }
}

/// Untyped arguments (raw_tp, kprobe, uprobe): `argN` as u64,
/// `str(argN)`, and `ret`.
fn plan_untyped(plan: &mut EventPlan, opts: Options) -> Result<(), String> {
    let user = plan.spec.kind.is_user_function();
    let max_args: usize = match plan.spec.kind {
        Kind::RawTp => 12,
        _ => 6,
    };
    for f in plan.spec.fields.clone().unwrap_or_default() {
        let i = f
            .root
            .strip_prefix("arg")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&i| i < max_args)
            .ok_or_else(|| {
                format!(
                    "{}: {} has no types here: name arguments by position, arg0 to arg{}",
                    f.root,
                    plan.spec.kind,
                    max_args - 1
                )
            })?;
        if !f.steps.is_empty() {
            return Err(format!(
                "{}: {} arguments are untyped, so they have no members",
                f.path(),
                plan.spec.kind
            ));
        }
        let arg = u8::try_from(i).map_err(|_| "argument index too large".to_owned())?;
        plan.fetches.push(if f.string {
            Fetch {
                op: Op::StrValue,
                size: opts.string_bytes,
                ty: ColType::Str(opts.string_bytes),
                truncatable: true,
                ..arg_value(&f.column, arg, user, format!("string at argument {i}"))
            }
        } else {
            arg_value(
                &f.column,
                arg,
                user,
                format!("argument {i} (64 bits, untyped)"),
            )
        });
    }
    // A joined event (latency) has its exit at hand: its return value too.
    if plan.spec.ret || plan.spec.latency || plan.spec.kind.is_return() {
        plan.fetches.push(Fetch {
            ty: ColType::Int {
                size: 8,
                signed: true,
            },
            ..arg_value(
                "ret",
                ARG_RET,
                user,
                "return value (64 bits, untyped)".into(),
            )
        });
    }
    if plan.fetches.iter().filter(|f| f.column == "ret").count() > 1 {
        return Err("column ret is asked for twice: rename the argument with alias=".into());
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::OnceLock;

    use super::*;
    use crate::spec::parse_event;

    fn btf() -> &'static Btf {
        static BTF: OnceLock<Btf> = OnceLock::new();
        BTF.get_or_init(|| Btf::vmlinux().expect("this kernel's BTF"))
    }

    /// The format of `event` from the test data (`tests/data/<event>.format`).
    pub(crate) fn test_format(system: &str, event: &str) -> Result<Format, String> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(format!("{event}.format"));
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{system}:{event}: {e}"))?;
        crate::format::parse(&text).map_err(|e| e.to_string())
    }

    fn plan(s: &str) -> Result<EventPlan, String> {
        let spec = parse_event(s).map_err(|e| e.to_string())?;
        let src = Sources {
            btf: Some(btf()),
            format: &test_format,
        };
        plan_event(&spec, &src, Options::default()).map_err(|e| e.to_string())
    }

    fn ok(s: &str) -> EventPlan {
        plan(s).unwrap_or_else(|e| panic!("{e}"))
    }

    fn bad(s: &str, needles: &[&str]) {
        let e = plan(s).expect_err(s);
        for n in needles {
            assert!(e.contains(n), "{s}: {e:?} lacks {n:?}");
        }
        assert!(!e.contains('\n'), "{e}");
    }

    /// Byte offset of `member` in struct `s`, for expectations.
    fn offset(s: &str, member: &str) -> u32 {
        let id = btf().type_id_of_kind(s, BtfKind::Struct).expect(s);
        btf().find_member(id, member).expect(member).bit_offset / 8
    }

    #[test]
    fn block_rq_insert_sectors_and_lengths() {
        let p = ok("tp_btf:block_rq_insert(rq->__sector, rq->__data_len, rq->cmd_flags)");
        let f = &p.fetches;
        assert_eq!(f.len(), 3);
        assert_eq!(f[0].arg, 0, "rq is the first argument after __data");
        assert_eq!(f[0].derefs, Vec::<u32>::new());
        assert_eq!(f[0].last, offset("request", "__sector"));
        assert_eq!(f[0].op, Op::Load);
        assert_eq!(
            f[0].ty,
            ColType::Int {
                size: 8,
                signed: false
            }
        );
        assert_eq!(f[1].last, offset("request", "__data_len"));
        assert_eq!(
            f[1].ty,
            ColType::Int {
                size: 4,
                signed: false
            }
        );
        assert!(
            f[0].description.contains("rq->__sector"),
            "{}",
            f[0].description
        );
    }

    #[test]
    fn sched_switch_prev_pid_and_comm() {
        let p = ok("tp_btf:sched_switch(prev->pid, str(next->comm), preempt, prev->mm->mmap_base)");
        let f = &p.fetches;
        // (bool preempt, struct task_struct *prev, *next, unsigned int prev_state)
        assert_eq!(
            (f[0].arg, f[0].last, f[0].op),
            (1, offset("task_struct", "pid"), Op::Load)
        );
        assert_eq!(
            f[0].ty,
            ColType::Int {
                size: 4,
                signed: true
            }
        );
        assert_eq!((f[1].arg, f[1].op, f[1].size), (2, Op::StrInline, 16));
        assert_eq!(
            (f[2].arg, f[2].op, f[2].ty.clone()),
            (0, Op::Value, ColType::Bool)
        );
        assert_eq!(f[3].derefs, vec![offset("task_struct", "mm")]);
        assert_eq!(f[3].last, offset("mm_struct", "mmap_base"));
        // Every argument when none is named.
        let all = ok("tp_btf:sched_switch");
        let cols: Vec<&str> = all.fetches.iter().map(|f| f.column.as_str()).collect();
        assert_eq!(cols, ["preempt", "prev", "next", "prev_state"]);
    }

    #[test]
    fn can_migrate_task_and_deep_paths() {
        let p = ok("func:can_migrate_task(p->pid, env->src_cpu, env->dst_rq->cpu) ret");
        let f = &p.fetches;
        assert_eq!((f[0].arg, f[0].last), (0, offset("task_struct", "pid")));
        assert_eq!(f[1].arg, 1);
        assert_eq!(f[1].last, offset("lb_env", "src_cpu"));
        assert_eq!(f[2].derefs, vec![offset("lb_env", "dst_rq")]);
        assert_eq!(f.last().expect("ret").arg, ARG_RET);
        assert_eq!(f.last().expect("ret").column, "ret");
        // Four pointer steps and an embedded member.
        let deep = ok("tp_btf:sched_switch(prev->mm->owner->mm->owner->pid, prev->se.vruntime)");
        assert_eq!(deep.fetches[0].derefs.len(), 4);
        assert_eq!(
            deep.fetches[1].last,
            offset("task_struct", "se") + offset("sched_entity", "vruntime")
        );
        assert!(deep.fetches[1].derefs.is_empty());
    }

    #[test]
    fn enums_become_labels() {
        // enum cpu_idle_type is dense from 0 (__CPU_NOT_IDLE, CPU_IDLE, ...).
        let p = ok("func:can_migrate_task(env->idle)");
        match &p.fetches[0].ty {
            ColType::Label { labels, .. } => assert_eq!(labels[1], "CPU_IDLE"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_names_list_what_exists() {
        bad(
            "tp_btf:block_rq_insrt",
            &["no BTF tracepoint", "block_rq_insert"],
        );
        bad(
            "tp_btf:block_rq_insert(rq->__sectr)",
            &["no member __sectr", "__sector"],
        );
        bad(
            "tp_btf:block_rq_insert(r->__sector)",
            &["no argument r", "rq"],
        );
        bad(
            "func:can_migrate_tsk",
            &["no kernel function", "can_migrate_task"],
        );
        bad("tp_btf:block_rq_insert(rq.__sector)", &["rq->__sector"]);
        bad("tp_btf:sched_switch(prev->pid->x)", &["not a pointer"]);
        bad(
            "tp_btf:block_rq_insert(rq->q->x_nope)",
            &["struct request_queue has no member x_nope"],
        );
        bad(
            "tp_btf:sched_switch(prev->se)",
            &["name a member", "vruntime"],
        );
        bad("tp_btf:sched_switch(str(prev->pid))", &["not a string"]);
        bad(
            "sched:sched_switch(prev_pd)",
            &["no field prev_pd", "prev_pid"],
        );
        bad("sched:sched_switch(str(prev_pid))", &["not a pointer"]);
        bad(
            "sched:sched_switch count by=prev_pidd",
            &["count key prev_pidd", "prev_pid"],
        );
        bad("raw_tp:sched_switch(prev)", &["arg0"]);
    }

    #[test]
    fn tracepoint_fields_from_the_format_file() {
        let p = ok("sched:sched_switch");
        let cols: Vec<&str> = p.fetches.iter().map(|f| f.column.as_str()).collect();
        assert_eq!(
            cols,
            [
                "prev_comm",
                "prev_pid",
                "prev_prio",
                "prev_state",
                "next_comm",
                "next_pid",
                "next_prio"
            ]
        );
        assert_eq!(p.fetches[0].op, Op::StrInline);
        assert_eq!((p.fetches[1].last, p.fetches[1].op), (24, Op::Load));
        let exec = ok("sched:sched_process_exec");
        assert_eq!(exec.fetches[0].op, Op::DynStr { relative: false });
        assert!(exec.fetches[0].truncatable);
        let open = ok("syscalls:sys_enter_openat(dfd, str(filename), flags)");
        assert_eq!(
            (open.fetches[1].op, open.fetches[1].user),
            (Op::StrPtr, true)
        );
        let args = ok("raw_syscalls:sys_enter");
        assert_eq!(args.fetches.len(), 7, "id and six args");
        assert_eq!(args.fetches[6].column, "args_5");
    }

    #[test]
    fn untyped_kinds() {
        let p = ok("uprobe:/bin/true:main(arg0, str(arg1)) latency");
        assert_eq!(p.fetches.len(), 3, "two arguments and the return value");
        assert_eq!(p.fetches[2].arg, ARG_RET);
        assert!(p.fetches[1].user && p.fetches[1].op == Op::StrValue);
        let r = ok("uretprobe:/bin/true:main");
        assert_eq!(r.fetches[0].arg, ARG_RET);
        bad("uprobe:/bin/true:main(arg9)", &["arg0 to arg5"]);
    }

    #[test]
    fn count_events_record_their_keys_only() {
        let p =
            ok("raw_syscalls:sys_enter(id) latency exit=raw_syscalls:sys_exit count by=tgid,id");
        let cols: Vec<&str> = p.fetches.iter().map(|f| f.column.as_str()).collect();
        assert_eq!(cols, ["id"]);
        // Without an argument list: every field planned, the keys kept, in
        // the order named.
        let p = ok("raw_syscalls:sys_enter count by=args_1,cpu,id");
        let cols: Vec<&str> = p.fetches.iter().map(|f| f.column.as_str()).collect();
        assert_eq!(cols, ["args_1", "id"]);
        assert!(ok("sched:sched_switch count").fetches.is_empty());
        let p = ok("sched:sched_process_exec count by=pid_field");
        assert_eq!(p.fetches.len(), 1);
        assert_eq!(p.fetches[0].column, "pid");
        bad(
            "raw_syscalls:sys_enter count by=idd",
            &["count key idd", "keys: id", "tgid"],
        );
        bad(
            "raw_syscalls:sys_enter(id) latency exit=raw_syscalls:sys_exitt count",
            &["exit=raw_syscalls:sys_exitt"],
        );
    }

    #[test]
    fn nearest_names_first() {
        assert_eq!(
            nearest("pid", ["tgid", "pid", "comm"], 2),
            "pid, tgid (and 1 more)"
        );
        assert_eq!(nearest("x", std::iter::empty(), 3), "none");
    }
}
