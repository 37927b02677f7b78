//! Tracepoint format files (`/sys/kernel/tracing/events/<sys>/<ev>/format`):
//! each field's declaration, offset, size and sign, and what it becomes in
//! a table (an integer of its width and sign, a boolean, a fixed char
//! array or a `__data_loc`/`__rel_loc` string).
//!
//! A line looks like
//! `\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;`; the
//! `common_` fields (type, flags, preempt count, pid) come first.

use std::{fmt, path::Path};

/// What a field holds, read from its declaration, size and sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldType {
    /// An integer of `size` bytes (1, 2, 4, 8); `pointer` when declared
    /// with `*` (a string can be read through it with `str(...)`).
    Int {
        size: u8,
        signed: bool,
        pointer: bool,
    },
    Bool,
    /// A fixed char array (`char comm[16]`), NUL-terminated or full.
    Chars(u32),
    /// A fixed array of integers (`unsigned long args[6]`): `count`
    /// elements of `size` bytes.
    Array {
        size: u8,
        signed: bool,
        count: u32,
    },
    /// `__data_loc char[]`: a u32 holding length << 16 | offset from the
    /// record's start; `relative` for `__rel_loc` (offset from the end of
    /// the field).
    DynStr {
        relative: bool,
    },
    /// Something no column can hold (a struct by value, a dynamic array of
    /// non-chars): the reason.
    Unsupported(&'static str),
}

/// One field of a format file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatField {
    pub name: String,
    /// The C declaration's type (`unsigned long`, `__data_loc char[]`).
    pub decl: String,
    pub offset: u32,
    pub size: u32,
    pub signed: bool,
    pub ty: FieldType,
}

impl FormatField {
    /// One of the fields every tracepoint starts with.
    pub fn is_common(&self) -> bool {
        self.name.starts_with("common_")
    }
}

/// A parsed format file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Format {
    pub name: String,
    pub id: u64,
    /// Every field, the `common_` ones first, in file order.
    pub fields: Vec<FormatField>,
}

impl Format {
    /// The fields after the `common_` ones.
    pub fn own_fields(&self) -> impl Iterator<Item = &FormatField> {
        self.fields.iter().filter(|f| !f.is_common())
    }

    /// The field named `name`.
    pub fn field(&self, name: &str) -> Option<&FormatField> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// The size of the fixed part of a record: the end of the last field.
    pub fn fixed_size(&self) -> u32 {
        self.fields
            .iter()
            .map(|f| f.offset.saturating_add(f.size))
            .max()
            .unwrap_or(0)
    }
}

/// Why a format file could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    Io { path: String, error: String },
    Line { line: usize, problem: String },
    Missing(&'static str),
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { path, error } => write!(f, "{path}: {error}"),
            Self::Line { line, problem } => write!(f, "line {line}: {problem}"),
            Self::Missing(what) => write!(f, "no {what} line"),
        }
    }
}

impl std::error::Error for FormatError {}

impl fmt::Display for FieldType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int { size, signed, .. } => {
                write!(
                    f,
                    "{}{}",
                    if *signed { "i" } else { "u" },
                    u32::from(*size) * 8
                )
            }
            Self::Bool => f.write_str("bool"),
            Self::Chars(n) => write!(f, "char[{n}]"),
            Self::Array {
                size,
                signed,
                count,
            } => write!(
                f,
                "{}{}[{count}]",
                if *signed { "i" } else { "u" },
                u32::from(*size) * 8
            ),
            Self::DynStr { .. } => f.write_str("string"),
            Self::Unsupported(why) => write!(f, "unsupported ({why})"),
        }
    }
}

/// Reads and parses `<tracefs>/events/<system>/<event>/format`.
pub fn read(tracefs: &Path, system: &str, event: &str) -> Result<Format, FormatError> {
    let path = tracefs
        .join("events")
        .join(system)
        .join(event)
        .join("format");
    let text = std::fs::read_to_string(&path).map_err(|e| FormatError::Io {
        path: path.display().to_string(),
        error: crate::private::strip_os_error(&e),
    })?;
    parse(&text)
}

/// Parses the text of a format file.
pub fn parse(text: &str) -> Result<Format, FormatError> {
    let mut name = None;
    let mut id = None;
    let mut fields = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let bad = |problem: String| FormatError::Line {
            line: line_no,
            problem,
        };
        let t = line.trim();
        if let Some(n) = t.strip_prefix("name:") {
            name = Some(n.trim().to_owned());
        } else if let Some(n) = t.strip_prefix("ID:") {
            id = Some(
                n.trim()
                    .parse::<u64>()
                    .map_err(|_| bad(format!("ID {:?} is not a number", n.trim())))?,
            );
        } else if t.starts_with("field:") {
            fields.push(parse_field(t).map_err(bad)?);
        } else if t.starts_with("print fmt:") {
            break;
        }
    }
    Ok(Format {
        name: name.ok_or(FormatError::Missing("name:"))?,
        id: id.ok_or(FormatError::Missing("ID:"))?,
        fields,
    })
}

/// `field:DECL;\toffset:N;\tsize:N;\tsigned:N;`
fn parse_field(line: &str) -> Result<FormatField, String> {
    let mut decl = None;
    let (mut offset, mut size, mut signed) = (None, None, None);
    for part in line.split(';') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (key, value) = part
            .split_once(':')
            .ok_or_else(|| format!("{part:?} is not key:value"))?;
        let number = || {
            value
                .trim()
                .parse::<u32>()
                .map_err(|_| format!("{key} {value:?} is not a number"))
        };
        match key {
            "field" => decl = Some(value.trim()),
            "offset" => offset = Some(number()?),
            "size" => size = Some(number()?),
            "signed" => signed = Some(number()? != 0),
            _ => {}
        }
    }
    let decl = decl.ok_or("no field: part")?;
    let (offset, size) = (offset.ok_or("no offset")?, size.ok_or("no size")?);
    let signed = signed.unwrap_or(false);
    // The name is the last word; an array's size follows it in brackets.
    let (ty_decl, name_part) = decl
        .rsplit_once(|c: char| c.is_whitespace() || c == '*')
        .map(|(t, n)| {
            // Keep the `*` of `char *name` with the type.
            let star = decl[t.len()..].starts_with('*');
            (if star { &decl[..=t.len()] } else { t }, n)
        })
        .ok_or_else(|| format!("declaration {decl:?} has no type"))?;
    let ty_decl = ty_decl.trim();
    let (name, count) = match name_part.split_once('[') {
        Some((n, rest)) => {
            let inner = rest
                .strip_suffix(']')
                .ok_or_else(|| format!("declaration {decl:?}: unclosed ["))?;
            (n, Some(inner.trim()))
        }
        None => (name_part, None),
    };
    if name.is_empty() || !name.chars().all(|c| c == '_' || c.is_ascii_alphanumeric()) {
        return Err(format!(
            "declaration {decl:?}: {name:?} is not a field name"
        ));
    }
    let ty = classify(ty_decl, count, size, signed);
    Ok(FormatField {
        name: name.to_owned(),
        decl: ty_decl.to_owned(),
        offset,
        size,
        signed,
        ty,
    })
}

fn is_char(ty: &str) -> bool {
    let ty = ty.strip_prefix("const ").unwrap_or(ty).trim();
    matches!(
        ty,
        "char" | "signed char" | "unsigned char" | "u8" | "__u8" | "s8"
    )
}

fn classify(ty: &str, count: Option<&str>, size: u32, signed: bool) -> FieldType {
    let dyn_loc = ty
        .strip_prefix("__data_loc ")
        .map(|t| (t, false))
        .or_else(|| ty.strip_prefix("__rel_loc ").map(|t| (t, true)));
    if let Some((inner, relative)) = dyn_loc {
        let inner = inner.trim_end_matches("[]").trim();
        let plain_char = inner.strip_prefix("const ").unwrap_or(inner).trim() == "char";
        return if plain_char && size == 4 {
            FieldType::DynStr { relative }
        } else {
            FieldType::Unsupported("a dynamic array of other than char")
        };
    }
    let int = |size: u32| -> Option<u8> { matches!(size, 1 | 2 | 4 | 8).then_some(size as u8) };
    if let Some(count) = count {
        if count.is_empty() {
            return FieldType::Unsupported("a flexible array (ftrace's own events)");
        }
        let Ok(n) = count.parse::<u32>() else {
            return FieldType::Unsupported("an array of a size that is not a number");
        };
        if n == 0 || size == 0 {
            return FieldType::Unsupported("an empty array");
        }
        // `char comm[16]`; `unsigned char`/`u8` arrays are bytes (MAC and IP
        // addresses), kept as numbers.
        let plain = ty.strip_prefix("const ").unwrap_or(ty).trim();
        if plain == "char" && size == n {
            return FieldType::Chars(n);
        }
        if size % n != 0 {
            return FieldType::Unsupported("an array whose size is not a multiple of its length");
        }
        return match int(size / n) {
            Some(elem) if !ty.contains("struct ") => FieldType::Array {
                size: elem,
                signed,
                count: n,
            },
            _ => FieldType::Unsupported("an array of structures"),
        };
    }
    if matches!(ty, "bool" | "_Bool") && size == 1 {
        return FieldType::Bool;
    }
    let pointer = ty.ends_with('*');
    if !pointer && (ty.starts_with("struct ") || ty.starts_with("union ")) {
        return FieldType::Unsupported("a structure by value");
    }
    match int(size) {
        Some(size) => FieldType::Int {
            size,
            signed,
            pointer,
        },
        None => FieldType::Unsupported("a size that is not 1, 2, 4 or 8 bytes"),
    }
}

/// True when a char-typed declaration (for tests and planning).
pub fn is_char_type(ty: &str) -> bool {
    is_char(ty)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An integer field's type.
    fn int(size: u8, signed: bool, pointer: bool) -> FieldType {
        FieldType::Int {
            size,
            signed,
            pointer,
        }
    }

    /// Format files saved from a kernel, kept beside the trace plugin's tests.
    fn data(name: &str) -> Format {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../plugins/trace/tests/data")
            .join(format!("{name}.format"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    #[test]
    fn sched_switch() {
        let f = data("sched_switch");
        assert_eq!(f.name, "sched_switch");
        assert_eq!(f.fields.len(), 11);
        assert_eq!(f.fields.iter().filter(|x| x.is_common()).count(), 4);
        let comm = f.field("prev_comm").expect("prev_comm");
        assert_eq!(
            (comm.offset, comm.size, comm.ty),
            (8, 16, FieldType::Chars(16))
        );
        let pid = f.field("prev_pid").expect("prev_pid");
        assert_eq!(pid.decl, "pid_t");
        assert_eq!(pid.ty, int(4, true, false));
        assert_eq!(
            f.field("prev_state").expect("state").ty,
            int(8, true, false)
        );
        assert_eq!(f.fixed_size(), 64);
        assert_eq!(f.own_fields().count(), 7);
    }

    #[test]
    fn data_loc_pointers_and_arrays() {
        let exec = data("sched_process_exec");
        assert_eq!(
            exec.field("filename").expect("filename").ty,
            FieldType::DynStr { relative: false }
        );
        let open = data("sys_enter_openat");
        let filename = open.field("filename").expect("filename");
        assert_eq!(filename.decl, "const char *");
        assert_eq!(filename.ty, int(8, false, true));
        // Declared int, eight bytes wide: the size wins.
        assert_eq!(open.field("dfd").expect("dfd").ty, int(8, false, false));
        let sys = data("sys_enter");
        assert_eq!(
            sys.field("args").expect("args").ty,
            FieldType::Array {
                size: 8,
                signed: false,
                count: 6
            }
        );
        let rq = data("block_rq_issue");
        assert_eq!(rq.field("rwbs").expect("rwbs").ty, FieldType::Chars(10));
        assert_eq!(
            rq.field("cmd").expect("cmd").ty,
            FieldType::DynStr { relative: false }
        );
        let migrate = data("sched_migrate_task");
        assert!(migrate.field("dest_cpu").is_some());
    }

    #[test]
    fn odd_declarations() {
        for (line, want) in [
            (
                "field:bool preempt;\toffset:8;\tsize:1;\tsigned:0;",
                FieldType::Bool,
            ),
            (
                "field:struct foo bar;\toffset:8;\tsize:16;\tsigned:0;",
                FieldType::Unsupported("a structure by value"),
            ),
            (
                "field:__data_loc u32[] ids;\toffset:8;\tsize:4;\tsigned:0;",
                FieldType::Unsupported("a dynamic array of other than char"),
            ),
            (
                "field:__rel_loc char[] name;\toffset:8;\tsize:4;\tsigned:0;",
                FieldType::DynStr { relative: true },
            ),
            (
                "field:char *name;\toffset:8;\tsize:8;\tsigned:0;",
                int(8, false, true),
            ),
            (
                "field:__u8 saddr[4];\toffset:8;\tsize:4;\tsigned:0;",
                FieldType::Array {
                    size: 1,
                    signed: false,
                    count: 4,
                },
            ),
        ] {
            let f = parse_field(line).unwrap_or_else(|e| panic!("{line}: {e}"));
            assert_eq!(f.ty, want, "{line}");
        }
        let f = parse_field("field:char *name;\toffset:8;\tsize:8;\tsigned:0;").expect("ptr");
        assert_eq!((f.name.as_str(), f.decl.as_str()), ("name", "char *"));
        for bad in [
            "field:int;\toffset:8;\tsize:4;",
            "field:int x;\toffset:eight;\tsize:4;",
            "field:int x;\tsize:4;",
            "field:int x[3;\toffset:8;\tsize:4;",
        ] {
            assert!(parse_field(bad).is_err(), "{bad}");
        }
        assert!(parse("ID: 3\n").is_err());
        assert!(parse("name: x\nID: y\n").is_err());
    }

    /// Every format file of this machine parses; a field no column can
    /// hold is counted by reason (each is a known kind of field).
    #[test]
    fn every_format_file_here_parses() {
        let Some(root) = crate::tracefs::tracefs_root() else {
            eprintln!("SKIP: tracefs is not mounted");
            return;
        };
        let Ok(systems) = std::fs::read_dir(root.join("events")) else {
            eprintln!("SKIP: {}/events is not readable", root.display());
            return;
        };
        let (mut files, mut fields) = (0, 0);
        let mut unsupported: std::collections::BTreeMap<&str, u32> = Default::default();
        let mut failures = Vec::new();
        for sys in systems.flatten() {
            let Ok(events) = std::fs::read_dir(sys.path()) else {
                continue;
            };
            for ev in events.flatten() {
                let path = ev.path().join("format");
                let Ok(text) = std::fs::read_to_string(&path) else {
                    continue;
                };
                files += 1;
                match parse(&text) {
                    Ok(f) => {
                        for field in &f.fields {
                            fields += 1;
                            if let FieldType::Unsupported(why) = field.ty {
                                *unsupported.entry(why).or_default() += 1;
                            }
                        }
                    }
                    Err(e) => failures.push(format!("{}: {e}", path.display())),
                }
            }
        }
        eprintln!("{files} format files, {fields} fields; unsupported: {unsupported:?}");
        assert!(failures.is_empty(), "{failures:#?}");
        assert!(files > 100, "only {files} format files");
    }
}
