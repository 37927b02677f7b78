//! Declaring a table from its record type: one line per column, the name
//! taken from the field, the kind inferred from the field's type, sizes and
//! offsets from the compiler (`size_of`, `offset_of!`), never hand-written.
//!
//! ```ignore
//! let decl = table!(types::quanta_runtime_event => "quanta_runtime",
//!     "One row per context switch: how long the switched-out task ran", {
//!     ts_uptime_us [us]: "when the quantum ended (CLOCK_BOOTTIME)",
//!     cpu: "CPU the task ran on",
//!     preempted as bool: "the task was still runnable",
//!     op as label(OP_LABELS): "the request's operation",
//! });
//! ```
//! A column is `field [unit]: "description"` with the unit optional;
//! `as bool`, `as label(LABELS)` (an integer indexing `LABELS`) and `as
//! str` override the inferred kind, which is the integer or float kind of
//! the field, or `str` for a byte array (a C `char[N]`).

use abi_stable::std_types::RVec;
use kernmlops_plugin_api::{ColumnDecl, ColumnKind, TableDecl};

/// Builds a [`TableDecl`] for records of type `T`.
pub struct TableBuilder {
    decl: TableDecl,
}

impl TableBuilder {
    pub fn new<T>(name: &str, description: &str) -> Self {
        Self::with_record_size(name, description, std::mem::size_of::<T>())
    }

    pub fn with_record_size(name: &str, description: &str, record_size: usize) -> Self {
        Self {
            decl: TableDecl {
                name: name.into(),
                description: description.into(),
                record_size: u32::try_from(record_size).unwrap_or(u32::MAX),
                columns: RVec::new(),
            },
        }
    }

    /// Adds a column at `offset` of `size` bytes.
    pub fn column(
        mut self,
        name: &str,
        kind: ColumnKind,
        offset: usize,
        size: usize,
        unit: &str,
        description: &str,
    ) -> Self {
        self.decl.columns.push(ColumnDecl {
            unit: unit.into(),
            description: description.into(),
            ..placed(name, kind, offset, size)
        });
        self
    }

    /// Adds a [`ColumnKind::LABEL`] column: the integer at `offset` indexes
    /// `labels`.
    pub fn label_column(
        mut self,
        name: &str,
        offset: usize,
        size: usize,
        labels: &[&str],
        description: &str,
    ) -> Self {
        self.decl.columns.push(ColumnDecl {
            description: description.into(),
            labels: labels.iter().map(|l| (*l).into()).collect(),
            ..placed(name, ColumnKind::LABEL, offset, size)
        });
        self
    }

    pub fn build(self) -> TableDecl {
        self.decl
    }
}

/// A column named `name` at `offset` of `size` bytes; an offset or size past
/// `u32` becomes `u32::MAX`, which validation refuses.
fn placed(name: &str, kind: ColumnKind, offset: usize, size: usize) -> ColumnDecl {
    let to_u32 = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    ColumnDecl::new(name, kind, to_u32(offset), to_u32(size))
}

/// A field type a column can hold, and the kind it is declared as.
pub trait ColumnType {
    const KIND: ColumnKind;
}

macro_rules! column_types {
    ($($t:ty => $k:ident),* $(,)?) => {
        $(impl ColumnType for $t {
            const KIND: ColumnKind = ColumnKind::$k;
        })*
    };
}

column_types! {
    u8 => U8, u16 => U16, u32 => U32, u64 => U64,
    i8 => I8, i16 => I16, i32 => I32, i64 => I64,
    f32 => F32, f64 => F64, bool => BOOL,
}

/// A C `char[N]`, as libbpf-cargo generates it: text up to its first NUL.
impl<const N: usize> ColumnType for [i8; N] {
    const KIND: ColumnKind = ColumnKind::STR;
}

/// A byte array: text up to its first NUL.
impl<const N: usize> ColumnType for [u8; N] {
    const KIND: ColumnKind = ColumnKind::STR;
}

/// Size of the value a raw pointer points to, without reading it.
pub const fn size_of_pointee<T>(_: *const T) -> usize {
    std::mem::size_of::<T>()
}

/// The inferred kind of the value a raw pointer points to.
pub const fn kind_of_pointee<T: ColumnType>(_: *const T) -> ColumnKind {
    T::KIND
}

/// Declares a column of a record struct with its size and offset taken from
/// the struct: `column!(builder, types::event, field, "name", ColumnKind::U32, "unit", "what")`.
#[macro_export]
macro_rules! column {
    ($b:expr, $ty:ty, $field:ident, $name:expr, $kind:expr, $unit:expr, $desc:expr) => {{
        let size = {
            let probe = ::core::mem::MaybeUninit::<$ty>::uninit();
            // SAFETY: only the field's address is taken, nothing is read.
            let field = unsafe { ::core::ptr::addr_of!((*probe.as_ptr()).$field) };
            $crate::table::size_of_pointee(field)
        };
        $b.column(
            $name,
            $kind,
            ::core::mem::offset_of!($ty, $field),
            size,
            $unit,
            $desc,
        )
    }};
}

/// Declares a table from its record type, one line per column (see the
/// module documentation for the column syntax). Evaluates to a
/// [`TableDecl`].
#[macro_export]
macro_rules! table {
    ($ty:ty => $name:expr, $desc:expr, {
        $($field:ident $(as $kind:ident $(($labels:expr))?)? $([$unit:ident])? : $cdesc:expr),* $(,)?
    }) => {{
        let t = $crate::table::TableBuilder::new::<$ty>($name, $desc);
        $(
            let t = $crate::__table_column!(t, $ty, $field, ($($kind $(($labels))?)?), ($($unit)?), $cdesc);
        )*
        t.build()
    }};
}

#[doc(hidden)]
#[macro_export]
macro_rules! __table_column {
    ($t:expr, $ty:ty, $field:ident, (label($labels:expr)), ($($unit:ident)?), $desc:expr) => {{
        let probe = ::core::mem::MaybeUninit::<$ty>::uninit();
        // SAFETY: only the field's address is taken, nothing is read.
        let field = unsafe { ::core::ptr::addr_of!((*probe.as_ptr()).$field) };
        $t.label_column(
            stringify!($field),
            ::core::mem::offset_of!($ty, $field),
            $crate::table::size_of_pointee(field),
            $labels,
            $desc,
        )
    }};
    ($t:expr, $ty:ty, $field:ident, ($($kind:ident)?), ($($unit:ident)?), $desc:expr) => {{
        let probe = ::core::mem::MaybeUninit::<$ty>::uninit();
        // SAFETY: only the field's address is taken, nothing is read.
        let field = unsafe { ::core::ptr::addr_of!((*probe.as_ptr()).$field) };
        let kind = $crate::__column_kind!(field; $($kind)?);
        $t.column(
            stringify!($field),
            kind,
            ::core::mem::offset_of!($ty, $field),
            $crate::table::size_of_pointee(field),
            ::core::concat!($(stringify!($unit))?),
            $desc,
        )
    }};
}

#[doc(hidden)]
#[macro_export]
macro_rules! __column_kind {
    ($field:ident;) => {
        $crate::table::kind_of_pointee($field)
    };
    ($field:ident; bool) => {
        $crate::ColumnKind::BOOL
    };
    ($field:ident; str) => {
        $crate::ColumnKind::STR
    };
}

#[cfg(test)]
mod tests {
    use kernmlops_plugin_api::{spec, ColumnKind};

    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Ev {
        ts_uptime_us: u64,
        size_bytes: u64,
        pid: u32,
        nice: i32,
        op: u32,
        truncated: u8,
        _pad: [u8; 3],
        name: [i8; 16],
    }

    const OPS: &[&str] = &["read", "write"];

    #[test]
    fn one_line_per_column_with_inferred_kinds() {
        let t = crate::table!(Ev => "events", "test events", {
            ts_uptime_us [us]: "when",
            size_bytes [bytes]: "how much",
            pid: "thread id",
            nice: "nice value",
            op as label(OPS): "operation",
            truncated as bool: "cut",
            name: "comm",
        });
        spec::validate_table(&t).expect("valid table");
        assert_eq!(t.record_size as usize, std::mem::size_of::<Ev>());
        let col = |n: &str| {
            t.columns
                .iter()
                .find(|c| c.name.as_str() == n)
                .unwrap_or_else(|| panic!("column {n}"))
        };
        assert_eq!(col("ts_uptime_us").kind, ColumnKind::U64);
        assert_eq!(col("ts_uptime_us").unit.as_str(), "us");
        assert_eq!(col("size_bytes").unit.as_str(), "bytes");
        assert_eq!(col("pid").kind, ColumnKind::U32);
        assert_eq!(col("pid").unit.as_str(), "");
        assert_eq!(col("nice").kind, ColumnKind::I32);
        assert_eq!(col("op").kind, ColumnKind::LABEL);
        assert_eq!(col("op").labels.len(), 2);
        assert_eq!(col("truncated").kind, ColumnKind::BOOL);
        assert_eq!(col("truncated").size, 1);
        assert_eq!(col("name").kind, ColumnKind::STR);
        assert_eq!(col("name").size, 16);
        assert_eq!(col("name").offset as usize, std::mem::offset_of!(Ev, name));
    }
}
