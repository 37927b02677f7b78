//! Declaring a table from a record type: sizes and offsets come from the
//! compiler (`size_of`, `offset_of!`), never from hand-written numbers.

use abi_stable::std_types::RVec;
use kernmlops_plugin_api::{ColumnDecl, ColumnKind, TableDecl};

/// Builds a [`TableDecl`] for records of type `T`.
///
/// ```ignore
/// TableBuilder::new::<types::quanta_event>("quanta_runtime", "on-CPU run length")
///     .column("cpu", ColumnKind::U32, offset_of!(types::quanta_event, cpu), 4, "", "CPU it ran on")
///     .build()
/// ```
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
            name: name.into(),
            kind,
            offset: u32::try_from(offset).unwrap_or(u32::MAX),
            size: u32::try_from(size).unwrap_or(u32::MAX),
            unit: unit.into(),
            description: description.into(),
            labels: RVec::new(),
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
            name: name.into(),
            kind: ColumnKind::LABEL,
            offset: u32::try_from(offset).unwrap_or(u32::MAX),
            size: u32::try_from(size).unwrap_or(u32::MAX),
            unit: "".into(),
            description: description.into(),
            labels: labels.iter().map(|l| (*l).into()).collect(),
        });
        self
    }

    pub fn build(self) -> TableDecl {
        self.decl
    }
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

/// Size of the value a raw pointer points to, without reading it.
pub const fn size_of_pointee<T>(_: *const T) -> usize {
    std::mem::size_of::<T>()
}
