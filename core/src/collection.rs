//! The one reader of collections: a collection folder's manifest, its
//! tables (Arrow IPC files), their schemas and batches, and typed column
//! access that understands the encodings the host writes (dictionary-encoded
//! `collection_id`, integers of every width). `dump`, `export`, `graph`,
//! experiments and the tests read collections through it.

use std::{
    fs::File,
    path::{Path, PathBuf},
};

use arrow_array::{
    cast::AsArray,
    types::{
        Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type,
        TimestampMicrosecondType, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
    },
    Array, ArrayRef, RecordBatch,
};
use arrow_ipc::reader::FileReader;
use arrow_schema::{DataType, SchemaRef, TimeUnit};

use crate::manifest::Manifest;

/// Why a collection or one of its tables cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum CollectionError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not a collection's manifest: {source}", path.display())]
    Manifest {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{}: {source} (if the run crashed, run `kernmlops repair` on its folder)", path.display())]
    Arrow {
        path: PathBuf,
        source: arrow_schema::ArrowError,
    },
    #[error("table {table} has no column {column}")]
    NoColumn { table: String, column: String },
    #[error("column {column} of table {table} is {found}, not {wanted}")]
    ColumnType {
        table: String,
        column: String,
        found: DataType,
        wanted: &'static str,
    },
}

type Result<T, E = CollectionError> = std::result::Result<T, E>;

/// Appends the values of array `$a` to `$out` through `$conv` (each value
/// an `Option` of the array's native type) when its type is one of the
/// primitive `$dt => $t` pairs, or through the matching `$other` arm;
/// evaluates to whether the type was listed.
macro_rules! widen {
    ($a:ident, $out:ident, $conv:expr; $($dt:pat => $t:ty),+; $($other:pat => $e:expr)?) => {
        match $a.data_type() {
            $($dt => {
                $out.extend($a.as_primitive::<$t>().iter().map($conv));
                true
            })+
            $($other => {
                $e;
                true
            })?
            _ => false,
        }
    };
}

/// A collection folder: `manifest.json` and one `<table>.arrow` per table.
#[derive(Debug, Clone)]
pub struct Collection {
    dir: PathBuf,
    manifest: Manifest,
}

impl Collection {
    /// Opens the collection in `dir`, reading its manifest.
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join("manifest.json");
        let text = std::fs::read_to_string(&path).map_err(|source| CollectionError::Io {
            path: path.clone(),
            source,
        })?;
        let manifest = serde_json::from_str(&text)
            .map_err(|source| CollectionError::Manifest { path, source })?;
        Ok(Self {
            dir: dir.to_owned(),
            manifest,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Names of the tables on disk (`<name>.arrow`), sorted.
    pub fn table_names(&self) -> Result<Vec<String>> {
        table_names(&self.dir)
    }

    /// The file of a table.
    pub fn table_path(&self, table: &str) -> PathBuf {
        self.dir.join(format!("{table}.arrow"))
    }

    /// Reads a whole table.
    pub fn read(&self, table: &str) -> Result<Table> {
        read_table(&self.table_path(table))
    }

    /// A table's schema, without reading its rows.
    pub fn schema(&self, table: &str) -> Result<SchemaRef> {
        let path = self.table_path(table);
        Ok(open_reader(&path)?.schema())
    }
}

/// Names of the `<name>.arrow` files in `dir`, sorted.
pub fn table_names(dir: &Path) -> Result<Vec<String>> {
    let entries = std::fs::read_dir(dir).map_err(|source| CollectionError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".arrow"))
                .map(str::to_owned)
        })
        .collect();
    names.sort();
    Ok(names)
}

fn open_reader(path: &Path) -> Result<FileReader<File>> {
    let file = File::open(path).map_err(|source| CollectionError::Io {
        path: path.to_owned(),
        source,
    })?;
    FileReader::try_new(file, None).map_err(|source| CollectionError::Arrow {
        path: path.to_owned(),
        source,
    })
}

/// The schema of an Arrow IPC file, without reading its rows.
pub fn read_schema(path: &Path) -> Result<SchemaRef> {
    Ok(open_reader(path)?.schema())
}

/// Reads a whole Arrow IPC file (a collection's table, an experiment's
/// `results.arrow`).
pub fn read_table(path: &Path) -> Result<Table> {
    let reader = open_reader(path)?;
    let schema = reader.schema();
    let batches = reader
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|source| CollectionError::Arrow {
            path: path.to_owned(),
            source,
        })?;
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(Table {
        name,
        schema,
        batches,
    })
}

/// A table read whole: its schema and record batches.
#[derive(Debug, Clone)]
pub struct Table {
    pub name: String,
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
}

impl Table {
    pub fn rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }

    /// The column's arrays, one per batch.
    fn arrays(&self, column: &str) -> Result<Vec<&ArrayRef>> {
        if self.schema.field_with_name(column).is_err() {
            return Err(CollectionError::NoColumn {
                table: self.name.clone(),
                column: column.to_owned(),
            });
        }
        Ok(self
            .batches
            .iter()
            .filter_map(|b| b.column_by_name(column))
            .collect())
    }

    fn wrong_type(&self, column: &str, found: &DataType, wanted: &'static str) -> CollectionError {
        CollectionError::ColumnType {
            table: self.name.clone(),
            column: column.to_owned(),
            found: found.clone(),
            wanted,
        }
    }

    /// Which rows of a column are null.
    pub fn nulls(&self, column: &str) -> Result<Vec<bool>> {
        let mut out = Vec::with_capacity(self.rows());
        for a in self.arrays(column)? {
            out.extend((0..a.len()).map(|i| a.is_null(i)));
        }
        Ok(out)
    }

    /// An unsigned integer or boolean column, widened to u64 (nulls as 0).
    pub fn u64s(&self, column: &str) -> Result<Vec<u64>> {
        self.gather(column, "an unsigned integer", |a, out| {
            widen!(a, out, |v| v.map_or(0, u64::from);
                DataType::UInt8 => UInt8Type,
                DataType::UInt16 => UInt16Type,
                DataType::UInt32 => UInt32Type,
                DataType::UInt64 => UInt64Type;
                DataType::Boolean => {
                    out.extend(a.as_boolean().iter().map(|v| u64::from(v.unwrap_or(false))))
                }
            )
        })
    }

    /// A signed integer or timestamp column, widened to i64 (nulls as 0).
    pub fn i64s(&self, column: &str) -> Result<Vec<i64>> {
        self.gather(column, "a signed integer", |a, out| {
            widen!(a, out, |v| v.map_or(0, i64::from);
                DataType::Int8 => Int8Type,
                DataType::Int16 => Int16Type,
                DataType::Int32 => Int32Type,
                DataType::Int64 => Int64Type,
                DataType::Timestamp(TimeUnit::Microsecond, _) => TimestampMicrosecondType;
            )
        })
    }

    /// Any numeric or boolean column as f64 (integers above 2^53 lose
    /// precision; nulls are NaN).
    // One `as f64` converts every listed type; for Float64 it is a no-op.
    #[allow(clippy::unnecessary_cast)]
    pub fn f64s(&self, column: &str) -> Result<Vec<f64>> {
        self.gather(column, "a number", |a, out| {
            widen!(a, out, |v| v.map_or(f64::NAN, |v| v as f64);
                DataType::UInt8 => UInt8Type,
                DataType::UInt16 => UInt16Type,
                DataType::UInt32 => UInt32Type,
                DataType::UInt64 => UInt64Type,
                DataType::Int8 => Int8Type,
                DataType::Int16 => Int16Type,
                DataType::Int32 => Int32Type,
                DataType::Int64 => Int64Type,
                DataType::Float32 => Float32Type,
                DataType::Float64 => Float64Type;
                DataType::Boolean => out.extend(
                    a.as_boolean()
                        .iter()
                        .map(|v| v.map_or(f64::NAN, |b| f64::from(u8::from(b)))),
                )
            )
        })
    }

    /// A column's values, batch by batch: `extend` appends one array's
    /// values and answers false for a type it does not take (`wanted`
    /// names the ones it does, for the error).
    fn gather<T>(
        &self,
        column: &str,
        wanted: &'static str,
        mut extend: impl FnMut(&ArrayRef, &mut Vec<T>) -> bool,
    ) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(self.rows());
        for a in self.arrays(column)? {
            if !extend(a, &mut out) {
                return Err(self.wrong_type(column, a.data_type(), wanted));
            }
        }
        Ok(out)
    }

    /// A text column, plain or dictionary-encoded (nulls as `None`).
    pub fn strings(&self, column: &str) -> Result<Vec<Option<String>>> {
        let mut out = Vec::with_capacity(self.rows());
        for a in self.arrays(column)? {
            if let Some(dict) = a.as_any_dictionary_opt() {
                let values = dict.values();
                let Some(values) = values.as_string_opt::<i32>() else {
                    return Err(self.wrong_type(column, a.data_type(), "text"));
                };
                let keys = dict.normalized_keys();
                for (i, k) in keys.into_iter().enumerate() {
                    out.push((!a.is_null(i)).then(|| values.value(k).to_owned()));
                }
                continue;
            }
            match a.data_type() {
                DataType::Utf8 => {
                    let s = a.as_string::<i32>();
                    out.extend(s.iter().map(|v| v.map(str::to_owned)));
                }
                DataType::LargeUtf8 => {
                    let s = a.as_string::<i64>();
                    out.extend(s.iter().map(|v| v.map(str::to_owned)));
                }
                t => return Err(self.wrong_type(column, t, "text")),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{StringArray, UInt32Array};
    use arrow_schema::{Field, Schema};

    use super::*;
    use crate::decode;

    #[test]
    fn columns_of_every_encoding_read_back() {
        let schema = Arc::new(Schema::new(vec![
            decode::collection_id_field(),
            Field::new("cpu", DataType::UInt32, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                decode::collection_id_column("c1", 2),
                Arc::new(UInt32Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("a"), None])),
            ],
        )
        .expect("batch");
        let t = Table {
            name: "t".into(),
            schema,
            batches: vec![batch.clone(), batch],
        };
        assert_eq!(t.rows(), 4);
        assert_eq!(t.u64s("cpu").expect("u64"), [1, 2, 1, 2]);
        assert_eq!(t.f64s("cpu").expect("f64"), [1.0, 2.0, 1.0, 2.0]);
        assert_eq!(
            t.strings("collection_id").expect("dictionary"),
            vec![Some("c1".to_owned()); 4]
        );
        assert_eq!(t.strings("name").expect("text")[1], None);
        assert!(matches!(
            t.u64s("name"),
            Err(CollectionError::ColumnType { .. })
        ));
        assert!(matches!(
            t.u64s("nope"),
            Err(CollectionError::NoColumn { .. })
        ));
    }
}
