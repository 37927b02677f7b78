//! Decoding packed records into Arrow columns, driven by the table's
//! declaration (the same one validated at load). Plugins never link Arrow.

use std::{collections::HashMap, sync::Arc};

use arrow_array::{
    types::{
        Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type,
        UInt32Type, UInt64Type, UInt8Type,
    },
    ArrayRef, ArrowPrimitiveType, BooleanArray, DictionaryArray, Int32Array, PrimitiveArray,
    RecordBatch, StringArray,
};
use arrow_buffer::ScalarBuffer;
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use kernmlops_plugin_api::{ColumnDecl, ColumnKind, TableDecl, COLLECTION_ID_COLUMN};

/// Arrow type of a declared column.
pub fn arrow_type(kind: ColumnKind) -> Option<DataType> {
    Some(match kind {
        ColumnKind::U8 => DataType::UInt8,
        ColumnKind::U16 => DataType::UInt16,
        ColumnKind::U32 => DataType::UInt32,
        ColumnKind::U64 => DataType::UInt64,
        ColumnKind::I8 => DataType::Int8,
        ColumnKind::I16 => DataType::Int16,
        ColumnKind::I32 => DataType::Int32,
        ColumnKind::I64 => DataType::Int64,
        ColumnKind::F32 => DataType::Float32,
        ColumnKind::F64 => DataType::Float64,
        ColumnKind::BOOL => DataType::Boolean,
        ColumnKind::STR | ColumnKind::LABEL => DataType::Utf8,
        _ => return None,
    })
}

/// Arrow type of the `collection_id` column every table carries.
pub fn collection_id_type() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

/// The `collection_id` field.
pub fn collection_id_field() -> Field {
    Field::new(COLLECTION_ID_COLUMN, collection_id_type(), false)
}

/// A `collection_id` column of `rows` rows, all `id`.
pub fn collection_id_column(id: &str, rows: usize) -> ArrayRef {
    let keys = Int32Array::new(ScalarBuffer::from(vec![0i32; rows]), None);
    let values: ArrayRef = Arc::new(StringArray::from(vec![id]));
    // Every key is 0 and there is one value, so this cannot fail; fall back
    // to an empty dictionary column rather than panic.
    match DictionaryArray::<Int32Type>::try_new(keys, values) {
        Ok(d) => Arc::new(d),
        Err(_) => arrow_array::new_empty_array(&collection_id_type()),
    }
}

/// A column's field metadata: its unit (when it has one) and description.
pub fn column_metadata(unit: &str, description: &str) -> HashMap<String, String> {
    let mut meta = HashMap::new();
    if !unit.is_empty() {
        meta.insert("unit".to_owned(), unit.to_owned());
    }
    if !description.is_empty() {
        meta.insert("description".to_owned(), description.to_owned());
    }
    meta
}

/// One column of a table the host builds itself (`system_info`,
/// `performance_indicator`, `collector_overhead`): name, unit, description
/// and values.
pub struct HostColumn {
    pub name: String,
    pub unit: &'static str,
    pub description: String,
    pub values: ArrayRef,
    /// Whether the column may hold nulls in some collection, so its schema
    /// is the same in every one.
    pub nullable: bool,
}

impl HostColumn {
    pub fn new(
        name: impl Into<String>,
        unit: &'static str,
        description: impl Into<String>,
        values: ArrayRef,
    ) -> Self {
        Self {
            name: name.into(),
            unit,
            description: description.into(),
            values,
            nullable: false,
        }
    }

    /// Marks the column as one that may hold nulls.
    pub fn nullable(mut self) -> Self {
        self.nullable = true;
        self
    }
}

/// A table the host builds itself, laid out like declared ones:
/// `collection_id` first, then the columns, each with its unit and
/// description, and the table's name and description in the schema. The
/// same rules as for declared tables are checked: snake_case table and
/// column names, unique columns, reserved names left alone, `ts_uptime_us`
/// a u64 in microseconds, a description for every column, as many values
/// in every column.
pub fn host_table(
    table: &str,
    description: &str,
    collection_id: &str,
    columns: Vec<HostColumn>,
) -> Result<RecordBatch, ArrowError> {
    check_host_table(table, &columns)
        .map_err(|e| ArrowError::InvalidArgumentError(format!("host table {table}: {e}")))?;
    let rows = columns.first().map_or(0, |c| c.values.len());
    let mut fields = vec![collection_id_field()];
    let mut arrays = vec![collection_id_column(collection_id, rows)];
    for c in columns {
        fields.push(
            Field::new(
                &c.name,
                c.values.data_type().clone(),
                c.values.null_count() > 0,
            )
            .with_metadata(column_metadata(c.unit, &c.description)),
        );
        arrays.push(c.values);
    }
    let mut meta = HashMap::new();
    meta.insert("table".to_owned(), table.to_owned());
    meta.insert("description".to_owned(), description.to_owned());
    RecordBatch::try_new(Arc::new(Schema::new(fields).with_metadata(meta)), arrays)
}

/// Why a table the host builds breaks the table rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum HostTableError {
    #[error("the table name is not snake_case")]
    TableName,
    #[error("column {0:?} is not snake_case")]
    ColumnName(String),
    #[error("column {0} is declared twice or reserved")]
    Duplicate(String),
    #[error("column {0} has no description")]
    NoDescription(String),
    #[error("column {column} has {values} values, not {rows}")]
    Length {
        column: String,
        values: usize,
        rows: usize,
    },
    #[error("{} must be a u64 in us", kernmlops_plugin_api::TIMESTAMP_COLUMN)]
    Timestamp,
}

fn check_host_table(table: &str, columns: &[HostColumn]) -> Result<(), HostTableError> {
    use kernmlops_sys::names::is_snake_case;
    if !is_snake_case(table) {
        return Err(HostTableError::TableName);
    }
    let rows = columns.first().map_or(0, |c| c.values.len());
    let mut seen = std::collections::BTreeSet::new();
    for c in columns {
        let name = || c.name.clone();
        if !is_snake_case(&c.name) {
            return Err(HostTableError::ColumnName(name()));
        }
        if c.name == COLLECTION_ID_COLUMN || !seen.insert(c.name.as_str()) {
            return Err(HostTableError::Duplicate(name()));
        }
        if c.description.is_empty() {
            return Err(HostTableError::NoDescription(name()));
        }
        if c.values.len() != rows {
            return Err(HostTableError::Length {
                column: name(),
                values: c.values.len(),
                rows,
            });
        }
        if c.name == kernmlops_plugin_api::TIMESTAMP_COLUMN
            && (c.values.data_type() != &DataType::UInt64 || c.unit != "us")
        {
            return Err(HostTableError::Timestamp);
        }
    }
    Ok(())
}

/// The Arrow schema of a declared table: `collection_id`, then the declared
/// columns in order, with each column's unit and description as metadata.
pub fn schema_for(decl: &TableDecl) -> SchemaRef {
    let mut fields = vec![collection_id_field()];
    for c in decl.columns.iter() {
        let dt = arrow_type(c.kind).unwrap_or(DataType::Null);
        let meta = column_metadata(&c.unit, &c.description);
        fields
            .push(Field::new(c.name.as_str(), dt, c.kind == ColumnKind::LABEL).with_metadata(meta));
    }
    let mut meta = HashMap::new();
    meta.insert("table".to_owned(), decl.name.to_string());
    if !decl.description.is_empty() {
        meta.insert("description".to_owned(), decl.description.to_string());
    }
    Arc::new(Schema::new(fields).with_metadata(meta))
}

/// Decodes packed records of one table.
#[derive(Debug, Clone)]
pub struct TableDecoder {
    decl: TableDecl,
    schema: SchemaRef,
    collection_id: String,
}

impl TableDecoder {
    /// `decl` must have passed [`kernmlops_plugin_api::spec::validate_table`].
    pub fn new(decl: &TableDecl, collection_id: &str) -> Self {
        Self {
            decl: decl.clone(),
            schema: schema_for(decl),
            collection_id: collection_id.to_owned(),
        }
    }

    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    pub fn table(&self) -> &str {
        self.decl.name.as_str()
    }

    pub fn record_size(&self) -> usize {
        self.decl.record_size as usize
    }

    /// Decodes `data`, which holds whole records back to back.
    pub fn decode(&self, data: &[u8]) -> Result<RecordBatch, ArrowError> {
        let rs = self.record_size();
        if data.len() % rs != 0 {
            return Err(ArrowError::InvalidArgumentError(format!(
                "table {}: {} bytes is not a whole number of {rs}-byte records",
                self.table(),
                data.len()
            )));
        }
        let rows = data.len() / rs;
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.decl.columns.len() + 1);
        columns.push(collection_id_column(&self.collection_id, rows));
        for c in self.decl.columns.iter() {
            columns.push(decode_column(c, data, rs)?);
        }
        RecordBatch::try_new(self.schema.clone(), columns)
    }
}

fn primitive<T: ArrowPrimitiveType, const N: usize>(
    data: &[u8],
    rs: usize,
    off: usize,
    from_le: impl Fn([u8; N]) -> T::Native,
) -> ArrayRef {
    let values: Vec<T::Native> = data
        .chunks_exact(rs)
        .map(|r| {
            let mut b = [0u8; N];
            b.copy_from_slice(&r[off..off + N]);
            from_le(b)
        })
        .collect();
    Arc::new(PrimitiveArray::<T>::new(ScalarBuffer::from(values), None))
}

fn text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end])
}

fn decode_column(c: &ColumnDecl, data: &[u8], rs: usize) -> Result<ArrayRef, ArrowError> {
    let off = c.offset as usize;
    let size = c.size as usize;
    Ok(match c.kind {
        ColumnKind::U8 => primitive::<UInt8Type, 1>(data, rs, off, u8::from_le_bytes),
        ColumnKind::U16 => primitive::<UInt16Type, 2>(data, rs, off, u16::from_le_bytes),
        ColumnKind::U32 => primitive::<UInt32Type, 4>(data, rs, off, u32::from_le_bytes),
        ColumnKind::U64 => primitive::<UInt64Type, 8>(data, rs, off, u64::from_le_bytes),
        ColumnKind::I8 => primitive::<Int8Type, 1>(data, rs, off, i8::from_le_bytes),
        ColumnKind::I16 => primitive::<Int16Type, 2>(data, rs, off, i16::from_le_bytes),
        ColumnKind::I32 => primitive::<Int32Type, 4>(data, rs, off, i32::from_le_bytes),
        ColumnKind::I64 => primitive::<Int64Type, 8>(data, rs, off, i64::from_le_bytes),
        ColumnKind::F32 => primitive::<Float32Type, 4>(data, rs, off, f32::from_le_bytes),
        ColumnKind::F64 => primitive::<Float64Type, 8>(data, rs, off, f64::from_le_bytes),
        ColumnKind::BOOL => Arc::new(BooleanArray::from_iter(
            data.chunks_exact(rs).map(|r| Some(r[off] != 0)),
        )),
        ColumnKind::STR => Arc::new(StringArray::from_iter_values(
            data.chunks_exact(rs).map(|r| text(&r[off..off + size])),
        )),
        ColumnKind::LABEL => {
            let labels: Vec<&str> = c.labels.iter().map(|l| l.as_str()).collect();
            Arc::new(StringArray::from_iter(data.chunks_exact(rs).map(|r| {
                let b = &r[off..off + size];
                let idx = match size {
                    1 => usize::from(b[0]),
                    2 => usize::from(u16::from_le_bytes([b[0], b[1]])),
                    _ => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize,
                };
                labels.get(idx).copied()
            })))
        }
        k => {
            return Err(ArrowError::InvalidArgumentError(format!(
                "column {} has unknown type {}",
                c.name, k.0
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{cast::AsArray, Array};
    use kernmlops_plugin_api::ColumnDecl;

    fn col(name: &str, kind: ColumnKind, offset: u32, size: u32, labels: &[&str]) -> ColumnDecl {
        ColumnDecl {
            name: name.into(),
            kind,
            offset,
            size,
            unit: "us".into(),
            description: "d".into(),
            labels: labels.iter().map(|l| (*l).into()).collect(),
        }
    }

    #[test]
    fn decodes_every_kind() {
        // ts u64 @0, i32 @8, bool @12, label u8 @13, str[6] @14 -> 20 bytes.
        let decl = TableDecl {
            name: "t".into(),
            description: "".into(),
            record_size: 20,
            columns: vec![
                col("ts_uptime_us", ColumnKind::U64, 0, 8, &[]),
                col("delta", ColumnKind::I32, 8, 4, &[]),
                col("flag", ColumnKind::BOOL, 12, 1, &[]),
                col("kind", ColumnKind::LABEL, 13, 1, &["start", "end"]),
                col("name", ColumnKind::STR, 14, 6, &[]),
            ]
            .into(),
        };
        let mut data = Vec::new();
        for (ts, delta, flag, kind, name) in [
            (u64::MAX, -5i32, 1u8, 1u8, &b"abc\0zz"[..]),
            (7, 9, 0, 9, &b"sixsix"[..]),
        ] {
            data.extend_from_slice(&ts.to_le_bytes());
            data.extend_from_slice(&delta.to_le_bytes());
            data.push(flag);
            data.push(kind);
            data.extend_from_slice(name);
        }
        let batch = TableDecoder::new(&decl, "cid")
            .decode(&data)
            .expect("decode");
        assert_eq!(batch.num_rows(), 2);
        let ts = batch.column(1).as_primitive::<UInt64Type>();
        assert_eq!(
            ts.values().to_vec(),
            vec![u64::MAX, 7],
            "u64 keeps all 64 bits"
        );
        assert_eq!(
            batch
                .column(2)
                .as_primitive::<Int32Type>()
                .values()
                .to_vec(),
            vec![-5, 9]
        );
        let flag = batch.column(3).as_boolean();
        assert!(flag.value(0) && !flag.value(1));
        let kind = batch.column(4).as_string::<i32>();
        assert_eq!(kind.value(0), "end");
        assert!(
            kind.is_null(1),
            "out-of-range label is null, not a wrong label"
        );
        let name = batch.column(5).as_string::<i32>();
        assert_eq!((name.value(0), name.value(1)), ("abc", "sixsix"));
        let cid = batch.column(0).as_dictionary::<Int32Type>();
        assert_eq!(cid.values().as_string::<i32>().value(0), "cid");
        assert_eq!(
            batch
                .schema()
                .field(1)
                .metadata()
                .get("unit")
                .map(String::as_str),
            Some("us")
        );
    }

    #[test]
    fn refuses_partial_records() {
        let decl = TableDecl {
            name: "t".into(),
            description: "".into(),
            record_size: 8,
            columns: vec![col("ts_uptime_us", ColumnKind::U64, 0, 8, &[])].into(),
        };
        assert!(TableDecoder::new(&decl, "c").decode(&[0u8; 12]).is_err());
        let empty = TableDecoder::new(&decl, "c")
            .decode(&[])
            .expect("empty decodes");
        assert_eq!(empty.num_rows(), 0);
    }
}
