//! A small reader of BTF, the kernel's type information
//! (`/sys/kernel/btf/vmlinux`), so the host and plugins can ask what this
//! kernel has before loading a BPF program: a type, a struct field, a
//! function and its BTF id.
//!
//! Format (the kernel's `Documentation/bpf/btf.rst`): a header (magic
//! `0xeB9F` in the file's byte order, version 1, header length, then the
//! offsets and lengths of the type and string sections, relative to the
//! end of the header), a type section of `struct btf_type` records (12
//! bytes: name offset, info = kind << 24 | vlen, size or type) each followed
//! by kind-specific data, and a string section of NUL-terminated names
//! starting with an empty one. Type ids count from 1 in file order; 0 is
//! `void`. A header of 32 bytes or more may also describe a layout section
//! (the size of each kind's trailing data, added to the kernel in 2026),
//! which lets this reader skip kinds newer than it knows.
//!
//! The whole input is checked once when it is read: every record lies
//! inside the type section, every kind is known (or described by the
//! layout section) and every type name lies inside the string section.
//! Truncated or garbage input is an error, never a panic. Only base BTF is
//! read: a module's split BTF (which continues vmlinux's ids and strings)
//! is refused.
//!
//! Speed: the 6.18 vmlinux BTF of the development VM (5.5 MB, 126,565
//! types, 2 cores) is read in about 4 ms and parsed, checked and indexed in
//! about 5 ms in a release build (9 and 12 ms while other tests run beside
//! it); the `parses_this_kernels_btf` test prints the figures. A lookup is a
//! binary search on a hash of the name: well under a microsecond.

use std::{fmt, io, ops::Range};

pub use crate::tracefs::BTF_VMLINUX;

const MAGIC: u16 = 0xeb9f;
const HEADER_LEN: usize = 24;
/// Header length from which `layout_off` and `layout_len` are present.
const HEADER_WITH_LAYOUT_LEN: usize = 32;
const TYPE_RECORD_LEN: usize = 12;
/// How many typedefs and modifiers are followed to reach a type: more than
/// any real kernel type needs, and a bound on malformed input.
const MAX_DEPTH: usize = 32;

/// A BTF kind (`BTF_KIND_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Int,
    Ptr,
    Array,
    Struct,
    Union,
    Enum,
    Fwd,
    Typedef,
    Volatile,
    Const,
    Restrict,
    /// A function (its `type` is its `FuncProto`); what fentry attaches to.
    Func,
    FuncProto,
    Var,
    Datasec,
    Float,
    DeclTag,
    TypeTag,
    Enum64,
    /// A kind newer than this reader, skipped through the layout section.
    Other(u8),
}

impl Kind {
    fn from_raw(kind: u8) -> Option<Self> {
        Some(match kind {
            1 => Self::Int,
            2 => Self::Ptr,
            3 => Self::Array,
            4 => Self::Struct,
            5 => Self::Union,
            6 => Self::Enum,
            7 => Self::Fwd,
            8 => Self::Typedef,
            9 => Self::Volatile,
            10 => Self::Const,
            11 => Self::Restrict,
            12 => Self::Func,
            13 => Self::FuncProto,
            14 => Self::Var,
            15 => Self::Datasec,
            16 => Self::Float,
            17 => Self::DeclTag,
            18 => Self::TypeTag,
            19 => Self::Enum64,
            _ => return None,
        })
    }

    /// Bytes after the 12-byte record: fixed part plus `vlen` elements.
    fn trailing_len(self, vlen: usize) -> usize {
        match self {
            Self::Int | Self::Var | Self::DeclTag => 4,
            Self::Array => 12,
            Self::Struct | Self::Union | Self::Datasec | Self::Enum64 => vlen * 12,
            Self::Enum | Self::FuncProto => vlen * 8,
            Self::Ptr
            | Self::Fwd
            | Self::Typedef
            | Self::Volatile
            | Self::Const
            | Self::Restrict
            | Self::Func
            | Self::Float
            | Self::TypeTag
            | Self::Other(_) => 0,
        }
    }
}

/// Why bytes are not readable BTF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BtfError {
    /// Shorter than the header.
    TooShort {
        len: usize,
    },
    /// The first two bytes are not `0xeB9F` in either byte order.
    BadMagic([u8; 2]),
    UnsupportedVersion(u8),
    /// A header length below 24 bytes or past the end of the data.
    BadHeaderLen(u32),
    /// A section that does not lie inside the data.
    SectionOutOfBounds {
        section: &'static str,
        start: u64,
        end: u64,
        len: usize,
    },
    /// The string section does not start and end with a NUL byte.
    BadStringSection,
    /// A type record that runs past the end of the type section.
    TruncatedType {
        id: u32,
        offset: usize,
    },
    /// A kind this reader does not know and the layout does not describe.
    UnknownKind {
        id: u32,
        kind: u8,
    },
    /// A type name offset outside the string section.
    BadNameOffset {
        id: u32,
        name_off: u32,
    },
    /// More data than 32-bit offsets can index.
    TooLarge(usize),
}

impl fmt::Display for BtfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooShort { len } => write!(
                f,
                "BTF is {len} bytes, shorter than its {HEADER_LEN}-byte header"
            ),
            Self::BadMagic(m) => write!(
                f,
                "not BTF: starts with {:#04x} {:#04x}, not the magic 0xeB9F",
                m[0], m[1]
            ),
            Self::UnsupportedVersion(v) => write!(f, "BTF version {v} is not supported (only 1)"),
            Self::BadHeaderLen(l) => write!(f, "BTF header length {l} is invalid"),
            Self::SectionOutOfBounds {
                section,
                start,
                end,
                len,
            } => write!(
                f,
                "BTF {section} section {start}..{end} lies outside the {len} bytes given (truncated?)"
            ),
            Self::BadStringSection => write!(
                f,
                "BTF string section does not start and end with a NUL byte"
            ),
            Self::TruncatedType { id, offset } => write!(
                f,
                "BTF type {id} at byte {offset} runs past the end of the type section"
            ),
            Self::UnknownKind { id, kind } => write!(
                f,
                "BTF type {id} has kind {kind}, which this reader does not know and the file does not describe"
            ),
            Self::BadNameOffset { id, name_off } => write!(
                f,
                "BTF type {id} has name offset {name_off}, outside the string section (split BTF is not supported)"
            ),
            Self::TooLarge(len) => write!(f, "BTF of {len} bytes is too large"),
        }
    }
}

impl std::error::Error for BtfError {}

impl From<BtfError> for io::Error {
    fn from(e: BtfError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// FNV-1a: a fast, fixed hash for the name index (no dependency, same on
/// every run).
fn name_hash(name: &[u8]) -> u64 {
    name.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// An integer type's encoding (`BTF_KIND_INT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntInfo {
    /// Bytes.
    pub size: u32,
    /// Bits used (`nr_bits`).
    pub bits: u32,
    pub signed: bool,
    pub is_char: bool,
    pub is_bool: bool,
}

/// A member of a struct or union.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member<'a> {
    /// `""` for an anonymous member.
    pub name: &'a str,
    pub type_id: u32,
    /// Bits from the start of the struct.
    pub bit_offset: u32,
    /// Bits of a bitfield, 0 for an ordinary member.
    pub bitfield_bits: u32,
}

/// A function prototype: its return type (0 for void) and named
/// parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FuncProto<'a> {
    pub ret: u32,
    pub params: Vec<(&'a str, u32)>,
}

/// Parsed, checked BTF with an index of type names.
pub struct Btf {
    data: Vec<u8>,
    big_endian: bool,
    strings: Range<usize>,
    /// `offsets[id - 1]`: where type `id`'s record starts in `data`.
    offsets: Vec<u32>,
    /// (hash of name, id) of every named type, sorted.
    by_name: Vec<(u64, u32)>,
}

impl fmt::Debug for Btf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Btf")
            .field("bytes", &self.data.len())
            .field("types", &self.offsets.len())
            .field("big_endian", &self.big_endian)
            .finish()
    }
}

/// One type record, read.
#[derive(Debug, Clone, Copy)]
struct Record {
    offset: usize,
    name_off: u32,
    kind: Kind,
    vlen: usize,
    /// `size` or `type`, by kind.
    size_or_type: u32,
}

impl Btf {
    /// Reads this kernel's BTF from [`BTF_VMLINUX`]. The error names the
    /// file: missing (a kernel without `CONFIG_DEBUG_INFO_BTF`), unreadable,
    /// or not valid BTF.
    pub fn vmlinux() -> io::Result<Self> {
        Self::from_file(BTF_VMLINUX)
    }

    /// Reads BTF from a file (`/sys/kernel/btf/vmlinux`, or a raw `.BTF`
    /// section saved to a file).
    pub fn from_file(path: impl AsRef<std::path::Path>) -> io::Result<Self> {
        let path = path.as_ref();
        let data = std::fs::read(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Self::from_bytes(data).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })
    }

    /// Parses and checks raw BTF.
    pub fn from_bytes(data: impl Into<Vec<u8>>) -> Result<Self, BtfError> {
        let data = data.into();
        if u32::try_from(data.len()).is_err() {
            return Err(BtfError::TooLarge(data.len()));
        }
        if data.len() < HEADER_LEN {
            return Err(BtfError::TooShort { len: data.len() });
        }
        let magic = [data[0], data[1]];
        let big_endian = if u16::from_le_bytes(magic) == MAGIC {
            false
        } else if u16::from_be_bytes(magic) == MAGIC {
            true
        } else {
            return Err(BtfError::BadMagic(magic));
        };
        if data[2] != 1 {
            return Err(BtfError::UnsupportedVersion(data[2]));
        }
        let word = |off: usize| -> Option<u32> {
            let b: [u8; 4] = data.get(off..off + 4)?.try_into().ok()?;
            Some(if big_endian {
                u32::from_be_bytes(b)
            } else {
                u32::from_le_bytes(b)
            })
        };
        let hdr_len_raw = word(4).unwrap_or(0);
        let hdr_len = hdr_len_raw as usize;
        if hdr_len < HEADER_LEN || hdr_len > data.len() {
            return Err(BtfError::BadHeaderLen(hdr_len_raw));
        }
        let section = |name: &'static str, off_at: usize| -> Result<Range<usize>, BtfError> {
            let (off, len) = (word(off_at).unwrap_or(0), word(off_at + 4).unwrap_or(0));
            let start = hdr_len as u64 + u64::from(off);
            let end = start + u64::from(len);
            if end > data.len() as u64 {
                return Err(BtfError::SectionOutOfBounds {
                    section: name,
                    start,
                    end,
                    len: data.len(),
                });
            }
            Ok(start as usize..end as usize)
        };
        let types = section("type", 8)?;
        let strings = section("string", 16)?;
        let layout = if hdr_len >= HEADER_WITH_LAYOUT_LEN {
            section("layout", 24)?
        } else {
            0..0
        };
        if strings.is_empty() || data[strings.start] != 0 || data[strings.end - 1] != 0 {
            return Err(BtfError::BadStringSection);
        }
        let str_len = strings.len();

        let mut offsets = Vec::with_capacity(types.len() / 32);
        let mut by_name = Vec::with_capacity(types.len() / 32);
        let mut pos = types.start;
        while pos < types.end {
            let id =
                u32::try_from(offsets.len() + 1).map_err(|_| BtfError::TooLarge(data.len()))?;
            let truncated = BtfError::TruncatedType { id, offset: pos };
            if types.end - pos < TYPE_RECORD_LEN {
                return Err(truncated);
            }
            let (Some(name_off), Some(info)) = (word(pos), word(pos + 4)) else {
                return Err(truncated);
            };
            let raw_kind = ((info >> 24) & 0x1f) as u8;
            let vlen = (info & 0xffff) as usize;
            let trailing = match Kind::from_raw(raw_kind) {
                Some(kind) => kind.trailing_len(vlen),
                None => {
                    // btf_layout { u8 info_sz; u8 elem_sz; u16 flags; } per kind.
                    let at = layout.start + usize::from(raw_kind) * 4;
                    if raw_kind == 0 || at + 4 > layout.end {
                        return Err(BtfError::UnknownKind { id, kind: raw_kind });
                    }
                    usize::from(data[at]) + usize::from(data[at + 1]) * vlen
                }
            };
            let next = pos + TYPE_RECORD_LEN + trailing;
            if next > types.end {
                return Err(truncated);
            }
            if name_off as usize >= str_len {
                return Err(BtfError::BadNameOffset { id, name_off });
            }
            if name_off != 0 {
                let name = &data[strings.start + name_off as usize..strings.end];
                let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
                by_name.push((name_hash(name), id));
            }
            offsets.push(pos as u32);
            pos = next;
        }
        by_name.sort_unstable();
        Ok(Self {
            data,
            big_endian,
            strings,
            offsets,
            by_name,
        })
    }

    fn word(&self, off: usize) -> Option<u32> {
        let b: [u8; 4] = self.data.get(off..off.checked_add(4)?)?.try_into().ok()?;
        Some(if self.big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        })
    }

    /// The NUL-terminated string at `off` in the string section.
    fn string(&self, off: u32) -> Option<&[u8]> {
        let start = self.strings.start.checked_add(off as usize)?;
        let s = self.data.get(start..self.strings.end)?;
        Some(&s[..s.iter().position(|&b| b == 0)?])
    }

    fn record(&self, id: u32) -> Option<Record> {
        let offset = *self.offsets.get((id as usize).checked_sub(1)?)? as usize;
        let info = self.word(offset + 4)?;
        let raw_kind = ((info >> 24) & 0x1f) as u8;
        Some(Record {
            offset,
            name_off: self.word(offset)?,
            kind: Kind::from_raw(raw_kind).unwrap_or(Kind::Other(raw_kind)),
            vlen: (info & 0xffff) as usize,
            size_or_type: self.word(offset + 8)?,
        })
    }

    /// Number of types, not counting `void` (id 0); ids run 1..=count.
    pub fn type_count(&self) -> u32 {
        self.offsets.len() as u32
    }

    /// The kind of type `id`; `None` for `void` and ids past the end.
    pub fn kind(&self, id: u32) -> Option<Kind> {
        self.record(id).map(|r| r.kind)
    }

    /// The name of type `id` (`""` for an anonymous type); `None` for
    /// `void`, ids past the end and names that are not UTF-8.
    pub fn name(&self, id: u32) -> Option<&str> {
        std::str::from_utf8(self.string(self.record(id)?.name_off)?).ok()
    }

    /// Ids of every type named `name`, in id order.
    pub fn ids_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = u32> + 'a {
        let hash = name_hash(name.as_bytes());
        let first = self.by_name.partition_point(|&(h, _)| h < hash);
        self.by_name[first..]
            .iter()
            .take_while(move |&&(h, _)| h == hash)
            .map(|&(_, id)| id)
            .filter(move |&id| {
                self.record(id)
                    .and_then(|r| self.string(r.name_off))
                    .is_some_and(|n| n == name.as_bytes())
            })
    }

    /// The id of the first type named `name`, of any kind (struct, typedef,
    /// function, ...).
    pub fn type_id(&self, name: &str) -> Option<u32> {
        self.ids_named(name).next()
    }

    /// The id of the first type named `name` of kind `kind`.
    pub fn type_id_of_kind(&self, name: &str, kind: Kind) -> Option<u32> {
        self.ids_named(name).find(|&id| self.kind(id) == Some(kind))
    }

    /// True when some type is named `name` (a struct, union, enum, typedef
    /// such as `btf_trace_sched_switch`, function, variable, ...).
    pub fn has_type(&self, name: &str) -> bool {
        self.type_id(name).is_some()
    }

    /// True when the kernel has a function `name` in its BTF (a `FUNC`):
    /// a candidate for fentry/fexit.
    pub fn has_func(&self, name: &str) -> bool {
        self.type_id_of_kind(name, Kind::Func).is_some()
    }

    /// True when a struct or union named `struct_name` has a member named
    /// `field`, directly or inside an anonymous struct or union member (as
    /// C, and CO-RE field access, see it).
    pub fn has_struct_field(&self, struct_name: &str, field: &str) -> bool {
        self.ids_named(struct_name).any(|id| {
            matches!(self.kind(id), Some(Kind::Struct | Kind::Union))
                && self.has_member(id, field.as_bytes())
        })
    }

    /// Searches the members of struct or union `id` and of its anonymous
    /// members. Each anonymous type is searched once, so even a malformed
    /// file that nests a type in itself costs at most one pass over it.
    fn has_member(&self, id: u32, field: &[u8]) -> bool {
        let mut pending = vec![id];
        let mut seen = std::collections::HashSet::new();
        while let Some(id) = pending.pop() {
            let Some(r) = self.record(id) else {
                continue;
            };
            if !matches!(r.kind, Kind::Struct | Kind::Union) || !seen.insert(id) {
                continue;
            }
            for i in 0..r.vlen {
                // btf_member { u32 name_off; u32 type; u32 offset; }
                let at = r.offset + TYPE_RECORD_LEN + i * 12;
                let (Some(name_off), Some(member_type)) = (self.word(at), self.word(at + 4)) else {
                    break;
                };
                if name_off == 0 {
                    pending.push(self.skip_modifiers(member_type));
                } else if self.string(name_off) == Some(field) {
                    return true;
                }
            }
        }
        false
    }

    /// Follows typedefs and const/volatile/restrict/type-tag modifiers from
    /// `id` to the type they name (`id` itself when it is none of them).
    pub fn resolve(&self, id: u32) -> u32 {
        self.skip_modifiers(id)
    }

    /// The `kind_flag` bit of type `id`'s info word (bitfield offsets of a
    /// struct, signedness of an enum).
    fn kind_flag(&self, id: u32) -> bool {
        self.record(id)
            .and_then(|r| self.word(r.offset + 4))
            .is_some_and(|info| info >> 31 == 1)
    }

    /// The size in bytes of type `id` after modifiers: integers, enums,
    /// structs, unions, floats (their size), pointers (8 on 64-bit BTF,
    /// taken from `long`), arrays (element size times length).
    pub fn size_of(&self, id: u32) -> Option<u32> {
        let id = self.resolve(id);
        let r = self.record(id)?;
        match r.kind {
            Kind::Int | Kind::Enum | Kind::Enum64 | Kind::Struct | Kind::Union | Kind::Float => {
                Some(r.size_or_type)
            }
            Kind::Ptr => Some(self.pointer_size()),
            Kind::Array => {
                let (elem, n) = self.array(id)?;
                self.size_of(elem)?.checked_mul(n)
            }
            _ => None,
        }
    }

    /// The size of a pointer: that of `long` where the BTF has it, else 8.
    fn pointer_size(&self) -> u32 {
        self.ids_named("long")
            .find_map(|id| {
                let r = self.record(id)?;
                (r.kind == Kind::Int).then_some(r.size_or_type)
            })
            .unwrap_or(8)
    }

    /// What integer type `id` is (after modifiers): its encoding.
    pub fn int_info(&self, id: u32) -> Option<IntInfo> {
        let id = self.resolve(id);
        let r = self.record(id)?;
        if r.kind != Kind::Int {
            return None;
        }
        let enc = self.word(r.offset + TYPE_RECORD_LEN)?;
        Some(IntInfo {
            size: r.size_or_type,
            bits: enc & 0xff,
            signed: (enc >> 24) & 1 != 0,
            is_char: (enc >> 24) & 2 != 0,
            is_bool: (enc >> 24) & 4 != 0,
        })
    }

    /// The type a pointer `id` (after modifiers) points to, modifiers kept.
    pub fn pointee(&self, id: u32) -> Option<u32> {
        let r = self.record(self.resolve(id))?;
        (r.kind == Kind::Ptr).then_some(r.size_or_type)
    }

    /// The element type and length of array `id` (after modifiers).
    pub fn array(&self, id: u32) -> Option<(u32, u32)> {
        let r = self.record(self.resolve(id))?;
        if r.kind != Kind::Array {
            return None;
        }
        // btf_array { u32 type; u32 index_type; u32 nelems; }
        let at = r.offset + TYPE_RECORD_LEN;
        Some((self.word(at)?, self.word(at + 8)?))
    }

    /// The direct members of struct or union `id` (after modifiers), in
    /// order; anonymous members have the name `""`.
    pub fn members(&self, id: u32) -> Vec<Member<'_>> {
        let id = self.resolve(id);
        let Some(r) = self.record(id) else {
            return Vec::new();
        };
        if !matches!(r.kind, Kind::Struct | Kind::Union) {
            return Vec::new();
        }
        let bitfields = self.kind_flag(id);
        let mut out = Vec::with_capacity(r.vlen);
        for i in 0..r.vlen {
            // btf_member { u32 name_off; u32 type; u32 offset; }
            let at = r.offset + TYPE_RECORD_LEN + i * 12;
            let (Some(name_off), Some(ty), Some(off)) =
                (self.word(at), self.word(at + 4), self.word(at + 8))
            else {
                break;
            };
            let name = self
                .string(name_off)
                .and_then(|n| std::str::from_utf8(n).ok())
                .unwrap_or("");
            let (bit_offset, bitfield_bits) = if bitfields {
                (off & 0x00ff_ffff, off >> 24)
            } else {
                (off, 0)
            };
            out.push(Member {
                name,
                type_id: ty,
                bit_offset,
                bitfield_bits,
            });
        }
        out
    }

    /// Member `name` of struct or union `id`, searched in its anonymous
    /// members too (as C sees them), with its bit offset from the start of
    /// `id`. Each anonymous type is searched once (malformed input ends).
    pub fn find_member(&self, id: u32, name: &str) -> Option<Member<'_>> {
        let mut pending = vec![(self.resolve(id), 0u32)];
        let mut seen = std::collections::HashSet::new();
        while let Some((id, base)) = pending.pop() {
            if !seen.insert(id) {
                continue;
            }
            for m in self.members(id) {
                if m.name.is_empty() {
                    pending.push((self.resolve(m.type_id), base.saturating_add(m.bit_offset)));
                } else if m.name == name {
                    return Some(Member {
                        bit_offset: base.saturating_add(m.bit_offset),
                        ..m
                    });
                }
            }
        }
        None
    }

    /// Every member name of struct or union `id`, anonymous members'
    /// members included (for messages listing what exists).
    pub fn member_names(&self, id: u32) -> Vec<&str> {
        let mut out = Vec::new();
        let mut pending = vec![self.resolve(id)];
        let mut seen = std::collections::HashSet::new();
        while let Some(id) = pending.pop() {
            if !seen.insert(id) {
                continue;
            }
            for m in self.members(id) {
                if m.name.is_empty() {
                    pending.push(self.resolve(m.type_id));
                } else {
                    out.push(m.name);
                }
            }
        }
        out
    }

    /// The values of enum `id` (after modifiers), `ENUM` or `ENUM64`, in
    /// declaration order.
    pub fn enum_values(&self, id: u32) -> Option<Vec<(&str, i64)>> {
        let id = self.resolve(id);
        let r = self.record(id)?;
        let signed = self.kind_flag(id);
        let (step, wide) = match r.kind {
            Kind::Enum => (8, false),
            Kind::Enum64 => (12, true),
            _ => return None,
        };
        let mut out = Vec::with_capacity(r.vlen);
        for i in 0..r.vlen {
            let at = r.offset + TYPE_RECORD_LEN + i * step;
            let name = self
                .string(self.word(at)?)
                .and_then(|n| std::str::from_utf8(n).ok())
                .unwrap_or("");
            let lo = self.word(at + 4)?;
            let value = if wide {
                let hi = self.word(at + 8)?;
                ((u64::from(hi) << 32) | u64::from(lo)) as i64
            } else if signed {
                i64::from(lo as i32)
            } else {
                i64::from(lo)
            };
            out.push((name, value));
        }
        Some(out)
    }

    /// The prototype of a function: `id` is a `FUNC`, a `FUNC_PROTO`, or a
    /// pointer or typedef leading to one (`btf_trace_<name>`).
    pub fn func_proto(&self, id: u32) -> Option<FuncProto<'_>> {
        let mut id = self.resolve(id);
        for _ in 0..MAX_DEPTH {
            let r = self.record(id)?;
            match r.kind {
                Kind::Func | Kind::Ptr => id = self.resolve(r.size_or_type),
                Kind::FuncProto => {
                    let mut params = Vec::with_capacity(r.vlen);
                    for i in 0..r.vlen {
                        // btf_param { u32 name_off; u32 type; }
                        let at = r.offset + TYPE_RECORD_LEN + i * 8;
                        let name = self
                            .string(self.word(at)?)
                            .and_then(|n| std::str::from_utf8(n).ok())
                            .unwrap_or("");
                        params.push((name, self.word(at + 4)?));
                    }
                    return Some(FuncProto {
                        ret: r.size_or_type,
                        params,
                    });
                }
                _ => return None,
            }
        }
        None
    }

    /// Type `id` written as C (`struct request *`, `unsigned int`,
    /// `const char *`, `u8[16]`), for descriptions and messages.
    pub fn c_name(&self, id: u32) -> String {
        let mut suffix = String::new();
        let mut id = id;
        for _ in 0..MAX_DEPTH {
            let Some(r) = self.record(id) else {
                return format!("void{suffix}");
            };
            let name = self.name(id).unwrap_or("");
            let named = |prefix: &str| {
                if name.is_empty() {
                    format!("{prefix}(anonymous){suffix}")
                } else {
                    format!("{prefix}{name}{suffix}")
                }
            };
            match r.kind {
                Kind::Ptr => {
                    suffix.insert_str(0, " *");
                    id = r.size_or_type;
                }
                Kind::Const => {
                    let inner = self.c_name(r.size_or_type);
                    return format!("const {inner}{suffix}");
                }
                Kind::Volatile | Kind::Restrict | Kind::TypeTag => id = r.size_or_type,
                Kind::Array => {
                    let Some((elem, n)) = self.array(id) else {
                        return format!("?{suffix}");
                    };
                    suffix = format!("[{n}]{suffix}");
                    id = elem;
                }
                Kind::Struct => return named("struct "),
                Kind::Union => return named("union "),
                Kind::Enum | Kind::Enum64 => return named("enum "),
                Kind::FuncProto => return format!("function{suffix}"),
                _ => return named(""),
            }
        }
        format!("?{suffix}")
    }

    /// Names of every type of `kind` (for nearest-name suggestions).
    pub fn names_of_kind(&self, kind: Kind) -> impl Iterator<Item = &str> + '_ {
        (1..=self.type_count()).filter_map(move |id| {
            if self.kind(id) == Some(kind) {
                self.name(id).filter(|n| !n.is_empty())
            } else {
                None
            }
        })
    }

    /// Follows typedefs and const/volatile/restrict/type-tag modifiers to
    /// the type they name.
    fn skip_modifiers(&self, mut id: u32) -> u32 {
        for _ in 0..MAX_DEPTH {
            match self.record(id) {
                Some(r)
                    if matches!(
                        r.kind,
                        Kind::Typedef
                            | Kind::Const
                            | Kind::Volatile
                            | Kind::Restrict
                            | Kind::TypeTag
                    ) =>
                {
                    id = r.size_or_type;
                }
                _ => break,
            }
        }
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Builds BTF by hand: records are (name, kind, vlen, size_or_type,
    /// trailing words).
    struct Builder {
        big_endian: bool,
        types: Vec<u8>,
        strings: Vec<u8>,
        layout: Option<Vec<u8>>,
    }

    impl Builder {
        fn new(big_endian: bool) -> Self {
            Self {
                big_endian,
                types: Vec::new(),
                strings: vec![0],
                layout: None,
            }
        }

        fn put(&self, out: &mut Vec<u8>, v: u32) {
            out.extend_from_slice(&if self.big_endian {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            });
        }

        fn name(&mut self, name: &str) -> u32 {
            if name.is_empty() {
                return 0;
            }
            let off = self.strings.len() as u32;
            self.strings.extend_from_slice(name.as_bytes());
            self.strings.push(0);
            off
        }

        fn add(&mut self, name: &str, kind: u8, vlen: u32, size_or_type: u32, extra: &[u32]) {
            let name_off = self.name(name);
            let mut rec = Vec::new();
            self.put(&mut rec, name_off);
            self.put(&mut rec, (u32::from(kind) << 24) | vlen);
            self.put(&mut rec, size_or_type);
            for &w in extra {
                self.put(&mut rec, w);
            }
            self.types.extend_from_slice(&rec);
        }

        /// A member: (name, type, bit offset).
        fn member(&mut self, name: &str, ty: u32) -> [u32; 3] {
            [self.name(name), ty, 0]
        }

        /// An 8-byte struct of two members (their names added first).
        fn struct_of_two(&mut self, name: &str, members: [(&str, u32); 2]) {
            let words: Vec<u32> = members
                .iter()
                .flat_map(|&(n, ty)| self.member(n, ty))
                .collect();
            self.add(name, 4, 2, 8, &words);
        }

        fn build(&self) -> Vec<u8> {
            let hdr_len: u32 = if self.layout.is_some() { 32 } else { 24 };
            let mut out = Vec::new();
            out.extend_from_slice(&if self.big_endian {
                MAGIC.to_be_bytes()
            } else {
                MAGIC.to_le_bytes()
            });
            out.extend_from_slice(&[1, 0]);
            let types_len = self.types.len() as u32;
            let str_len = self.strings.len() as u32;
            for w in [hdr_len, 0, types_len, types_len, str_len] {
                self.put(&mut out, w);
            }
            if let Some(layout) = &self.layout {
                self.put(&mut out, types_len + str_len);
                self.put(&mut out, layout.len() as u32);
            }
            out.extend_from_slice(&self.types);
            out.extend_from_slice(&self.strings);
            if let Some(layout) = &self.layout {
                out.extend_from_slice(layout);
            }
            out
        }
    }

    /// Ids: 1 `int`, 2 `struct outer { int a; union { int inner; }; }`,
    /// 3 that anonymous union, 4 `typedef struct outer outer_t`, 5 a
    /// func_proto `int (int x)`, 6 `my_func` of that proto, 7 `const
    /// outer_t`, 8 `struct wrapper { const outer_t o; struct { int deep; };
    /// }`, 9 that anonymous struct.
    fn sample(big_endian: bool) -> Builder {
        let mut b = Builder::new(big_endian);
        b.add("int", 1, 0, 4, &[32]);
        b.struct_of_two("outer", [("a", 1), ("", 3)]);
        let inner = b.member("inner", 1);
        b.add("", 5, 1, 4, &inner);
        b.add("outer_t", 8, 0, 2, &[]);
        let param = [b.name("x"), 1];
        b.add("", 13, 1, 1, &param);
        b.add("my_func", 12, 1, 5, &[]);
        b.add("", 10, 0, 4, &[]);
        b.struct_of_two("wrapper", [("o", 7), ("", 9)]);
        let deep = b.member("deep", 1);
        b.add("", 4, 1, 4, &deep);
        b
    }

    #[test]
    fn reads_hand_built_btf_in_both_byte_orders() {
        for big_endian in [false, true] {
            let btf = Btf::from_bytes(sample(big_endian).build()).expect("sample BTF");
            assert_eq!(btf.type_count(), 9);
            assert_eq!(btf.type_id("outer"), Some(2));
            assert_eq!(btf.kind(2), Some(Kind::Struct));
            assert_eq!(btf.name(3), Some(""));
            assert_eq!(btf.name(0), None);
            assert_eq!(btf.kind(10), None);
            assert_eq!(btf.type_id_of_kind("my_func", Kind::Func), Some(6));
            assert!(btf.has_func("my_func") && !btf.has_func("outer"));
            assert!(btf.has_type("outer_t") && !btf.has_type("x") && !btf.has_type(""));
            for (s, field, want) in [
                ("outer", "a", true),
                ("outer", "inner", true),
                ("outer", "b", false),
                ("outer", "", false),
                ("wrapper", "o", true),
                ("wrapper", "deep", true),
                ("wrapper", "a", false),
                ("outer_t", "a", false),
                ("my_func", "x", false),
            ] {
                assert_eq!(
                    btf.has_struct_field(s, field),
                    want,
                    "{s}.{field} (big endian: {big_endian})"
                );
            }
        }
    }

    #[test]
    fn skips_kinds_the_layout_section_describes() {
        let mut b = sample(false);
        // Kind 25, unknown here: 8 fixed bytes plus 4 per element.
        b.add("future", 25, 2, 0, &[0, 0, 7, 7]);
        b.add("after_future", 1, 0, 4, &[32]);
        let without_layout = Btf::from_bytes(b.build()).expect_err("unknown kind");
        assert_eq!(without_layout, BtfError::UnknownKind { id: 10, kind: 25 });
        let mut layout = vec![0u8; 26 * 4];
        layout[25 * 4] = 8;
        layout[25 * 4 + 1] = 4;
        b.layout = Some(layout);
        let btf = Btf::from_bytes(b.build()).expect("described by the layout");
        assert_eq!(btf.kind(10), Some(Kind::Other(25)));
        assert_eq!(btf.type_id("after_future"), Some(11));
        assert_eq!(btf.kind(11), Some(Kind::Int));
    }

    #[test]
    fn refuses_bad_headers_and_sections() {
        let good = sample(false).build();
        let with = |at: usize, bytes: &[u8]| {
            let mut d = good.clone();
            d[at..at + bytes.len()].copy_from_slice(bytes);
            Btf::from_bytes(d)
        };
        assert_eq!(
            Btf::from_bytes(Vec::new()).err(),
            Some(BtfError::TooShort { len: 0 })
        );
        assert_eq!(
            Btf::from_bytes(b"not btf at all, not at all".to_vec()).err(),
            Some(BtfError::BadMagic([b'n', b'o']))
        );
        assert_eq!(with(2, &[2]).err(), Some(BtfError::UnsupportedVersion(2)));
        assert_eq!(
            with(4, &8u32.to_le_bytes()).err(),
            Some(BtfError::BadHeaderLen(8))
        );
        assert!(matches!(
            with(12, &u32::MAX.to_le_bytes()).err(),
            Some(BtfError::SectionOutOfBounds {
                section: "type",
                ..
            })
        ));
        // The string section's first byte must be NUL.
        let str_start = 24 + u32::from_le_bytes(good[16..20].try_into().expect("4")) as usize;
        assert_eq!(
            with(str_start, b"x").err(),
            Some(BtfError::BadStringSection)
        );
        // A name offset past the string section.
        assert_eq!(
            with(24, &0x00ff_ffffu32.to_le_bytes()).err(),
            Some(BtfError::BadNameOffset {
                id: 1,
                name_off: 0x00ff_ffff
            })
        );
        // Kind 0 is never valid.
        assert_eq!(
            with(28, &0u32.to_le_bytes()).err(),
            Some(BtfError::UnknownKind { id: 1, kind: 0 })
        );
        let message = io::Error::from(BtfError::TooShort { len: 3 }).to_string();
        assert!(message.contains("3 bytes"), "{message}");
    }

    #[test]
    fn corrupt_input_never_panics() {
        let good = sample(false).build();
        // Every truncation and every single-byte change of the sample.
        for len in 0..good.len() {
            assert!(Btf::from_bytes(&good[..len]).is_err(), "truncated to {len}");
        }
        for at in 0..good.len() {
            for value in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                let mut d = good.clone();
                d[at] = value;
                if let Ok(btf) = Btf::from_bytes(d) {
                    for id in 0..=btf.type_count() + 1 {
                        let name = btf.name(id).unwrap_or("").to_owned();
                        btf.has_struct_field(&name, "inner");
                        btf.has_func(&name);
                        btf.kind(id);
                    }
                }
            }
        }
    }

    /// A self-referencing anonymous member: ends, no stack overflow.
    #[test]
    fn cyclic_anonymous_members_end() {
        let mut b = Builder::new(false);
        let anon = b.member("", 1);
        b.add("loop", 4, 1, 4, &anon);
        b.add("t", 8, 0, 3, &[]);
        b.add("u", 8, 0, 2, &[]);
        let btf = Btf::from_bytes(b.build()).expect("cyclic but well-formed");
        assert!(!btf.has_struct_field("loop", "x"));
        assert_eq!(btf.skip_modifiers(2), btf.skip_modifiers(2));
    }

    fn vmlinux_bytes() -> Vec<u8> {
        std::fs::read(BTF_VMLINUX).unwrap_or_else(|e| {
            panic!("{BTF_VMLINUX}: {e} (this kernel has BTF; kernmlops needs it)")
        })
    }

    #[test]
    fn parses_this_kernels_btf() {
        let t0 = Instant::now();
        let data = vmlinux_bytes();
        let read = t0.elapsed();
        let t1 = Instant::now();
        let btf = Btf::from_bytes(data).expect("vmlinux BTF parses");
        let parsed = t1.elapsed();
        eprintln!(
            "vmlinux BTF: {} types; read in {read:?}, parsed and indexed in {parsed:?} \
             (release build: cargo test --release)",
            btf.type_count()
        );
        let t2 = Instant::now();
        let lookups = 10_000u32;
        let found = (0..lookups)
            .filter(|i| {
                btf.has_type(if i % 2 == 0 {
                    "task_struct"
                } else {
                    "kml_nope"
                })
            })
            .count();
        let per_lookup = t2.elapsed() / lookups;
        eprintln!("vmlinux BTF: one has_type lookup takes {per_lookup:?}");
        assert_eq!(found, lookups as usize / 2);
        assert!(btf.type_count() > 10_000, "{btf:?}");
        let task = btf
            .type_id_of_kind("task_struct", Kind::Struct)
            .expect("task_struct");
        assert_eq!(btf.name(task), Some("task_struct"));
        for (s, field) in [
            ("task_struct", "pid"),
            ("task_struct", "tgid"),
            ("task_struct", "comm"),
        ] {
            assert!(btf.has_struct_field(s, field), "{s}.{field}");
        }
        assert!(!btf.has_struct_field("task_struct", "kml_no_such_field"));
        assert!(!btf.has_struct_field("kml_no_such_struct", "pid"));
        assert!(btf.has_type("btf_trace_sched_switch"));
        assert_eq!(
            btf.kind(btf.type_id("btf_trace_sched_switch").expect("id")),
            Some(Kind::Typedef)
        );
        assert!(!btf.has_type("kml_made_up_type_name"));
        assert!(btf.has_func("vfs_read") && !btf.has_func("task_struct"));
        assert!(Btf::vmlinux().is_ok_and(|b| b.type_count() == btf.type_count()));
    }

    #[test]
    fn types_members_enums_and_prototypes() {
        let btf = Btf::from_bytes(sample(false).build()).expect("sample BTF");
        assert_eq!(btf.resolve(4), 2, "outer_t is struct outer");
        assert_eq!(btf.size_of(4), Some(8));
        let m = btf
            .find_member(4, "inner")
            .expect("through the anonymous union");
        assert_eq!((m.type_id, m.bit_offset, m.bitfield_bits), (1, 0, 0));
        assert_eq!(btf.member_names(8), ["o", "deep"]);
        assert_eq!(btf.members(2).len(), 2);
        assert!(btf.find_member(2, "nope").is_none());
        let proto = btf.func_proto(6).expect("my_func");
        assert_eq!((proto.ret, proto.params.clone()), (1, vec![("x", 1)]));
        assert_eq!(btf.int_info(1).map(|i| (i.size, i.bits)), Some((4, 32)));
        assert_eq!(btf.c_name(7), "const outer_t");
        assert_eq!(btf.c_name(2), "struct outer");

        let btf = Btf::from_bytes(vmlinux_bytes()).expect("vmlinux");
        let task = btf
            .type_id_of_kind("task_struct", Kind::Struct)
            .expect("task_struct");
        let pid = btf.find_member(task, "pid").expect("pid");
        let info = btf.int_info(pid.type_id).expect("pid_t is an int");
        assert!(info.signed && info.size == 4, "{info:?}");
        let mm = btf.find_member(task, "mm").expect("mm");
        let mm_struct = btf.pointee(mm.type_id).expect("mm is a pointer");
        assert_eq!(btf.c_name(mm.type_id), "struct mm_struct *");
        assert!(btf.find_member(mm_struct, "mmap_base").is_some());
        let comm = btf.find_member(task, "comm").expect("comm");
        assert_eq!(btf.array(comm.type_id).map(|(_, n)| n), Some(16));
        assert_eq!(btf.size_of(comm.type_id), Some(16));
        let proto = btf
            .func_proto(btf.type_id("btf_trace_sched_switch").expect("typedef"))
            .expect("prototype");
        assert_eq!(proto.params.len(), 5, "{proto:?}");
        assert_eq!(btf.c_name(proto.params[2].1), "struct task_struct *");
        let func = btf
            .type_id_of_kind("vfs_read", Kind::Func)
            .expect("vfs_read");
        let names: Vec<&str> = btf
            .func_proto(func)
            .expect("vfs_read prototype")
            .params
            .iter()
            .map(|(n, _)| *n)
            .collect();
        assert_eq!(names, ["file", "buf", "count", "pos"]);
        let values = btf
            .enum_values(
                btf.type_id_of_kind("cpu_idle_type", Kind::Enum)
                    .expect("enum"),
            )
            .expect("values");
        assert!(values.contains(&("CPU_IDLE", 1)), "{values:?}");
        assert!(btf.names_of_kind(Kind::Func).any(|n| n == "vfs_read"));
    }

    #[test]
    fn truncated_or_garbled_vmlinux_is_an_error() {
        let data = vmlinux_bytes();
        let n = data.len();
        let mut lengths: Vec<usize> = (0..64).collect();
        lengths.extend((1..40).map(|i| n * i / 40));
        lengths.extend([n - 1, n - 2, n - 100, n - 5000]);
        for len in lengths {
            let got = Btf::from_bytes(&data[..len]);
            assert!(got.is_err(), "truncated to {len} of {n} bytes parsed");
        }
        // Garbage in the type section: an error or a readable Btf, no panic.
        let type_start = 24usize;
        let mut x: u64 = 12345;
        for _ in 0..20 {
            let mut d = data.clone();
            for _ in 0..8 {
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let at = type_start + (x >> 33) as usize % (n / 2);
                d[at] = (x >> 16) as u8;
            }
            if let Ok(btf) = Btf::from_bytes(d) {
                btf.has_struct_field("task_struct", "pid");
            }
        }
        let err = Btf::from_bytes(&data[..n / 2]).expect_err("half");
        assert!(err.to_string().contains("outside"), "{err}");
    }
}
