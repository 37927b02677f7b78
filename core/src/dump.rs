//! `kernmlops dump`: a compact per-table summary of one collection (rows,
//! lost events, time span, and min/mean/max of every numeric column), to
//! see at a glance what a run recorded.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use arrow_array::{
    cast::AsArray,
    types::{
        Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type,
        UInt32Type, UInt64Type, UInt8Type,
    },
    Array, ArrayRef, ArrowPrimitiveType, PrimitiveArray,
};
use arrow_schema::DataType;

use crate::{
    collection::{self, CollectionError},
    export,
    manifest::Manifest,
};

/// Min, mean and max of a numeric column's non-null values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ColumnStats {
    pub name: String,
    pub count: u64,
    pub min: f64,
    pub max: f64,
    sum: f64,
}

impl ColumnStats {
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum / self.count as f64
        }
    }

    fn add(&mut self, v: f64) {
        if self.count == 0 {
            self.min = v;
            self.max = v;
        } else {
            self.min = self.min.min(v);
            self.max = self.max.max(v);
        }
        self.sum += v;
        self.count += 1;
    }
}

/// One table's summary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableSummary {
    pub table: String,
    pub rows: u64,
    /// From the manifest; `None` for tables it does not list (system_info).
    pub lost_events: Option<u64>,
    /// min/max `ts_uptime_us`, in microseconds.
    pub span_us: Option<(u64, u64)>,
    pub columns: Vec<ColumnStats>,
}

/// A widening conversion to f64 for every Arrow numeric native type (u64
/// and i64 lose precision above 2^53, fine for a summary).
trait ToF64 {
    fn to_f64(self) -> f64;
}

macro_rules! to_f64 {
    ($($t:ty),*) => {$(
        impl ToF64 for $t {
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    )*};
}
to_f64!(u8, u16, u32, u64, i8, i16, i32, i64, f32, f64);

fn add_primitive<T: ArrowPrimitiveType>(stats: &mut ColumnStats, a: &PrimitiveArray<T>)
where
    T::Native: ToF64,
{
    for v in a.iter().flatten() {
        stats.add(v.to_f64());
    }
}

/// Adds a column's values; false when the type is not numeric.
fn add_column(stats: &mut ColumnStats, col: &ArrayRef) -> bool {
    match col.data_type() {
        DataType::UInt8 => add_primitive(stats, col.as_primitive::<UInt8Type>()),
        DataType::UInt16 => add_primitive(stats, col.as_primitive::<UInt16Type>()),
        DataType::UInt32 => add_primitive(stats, col.as_primitive::<UInt32Type>()),
        DataType::UInt64 => add_primitive(stats, col.as_primitive::<UInt64Type>()),
        DataType::Int8 => add_primitive(stats, col.as_primitive::<Int8Type>()),
        DataType::Int16 => add_primitive(stats, col.as_primitive::<Int16Type>()),
        DataType::Int32 => add_primitive(stats, col.as_primitive::<Int32Type>()),
        DataType::Int64 => add_primitive(stats, col.as_primitive::<Int64Type>()),
        DataType::Float32 => add_primitive(stats, col.as_primitive::<Float32Type>()),
        DataType::Float64 => add_primitive(stats, col.as_primitive::<Float64Type>()),
        _ => return false,
    }
    true
}

/// Why a collection cannot be summarised.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error(transparent)]
    Read(#[from] CollectionError),
    #[error(transparent)]
    Find(crate::export::ExportError),
    #[error("no collection under {}", .0.display())]
    NoCollection(PathBuf),
}

/// Summarises one Arrow IPC table file.
pub fn summarize_file(table: &str, path: &Path) -> Result<TableSummary, DumpError> {
    let read = collection::read_table(path)?;
    let schema = &read.schema;
    let mut columns: Vec<Option<ColumnStats>> = schema
        .fields()
        .iter()
        .map(|f| {
            f.data_type().is_numeric().then(|| ColumnStats {
                name: f.name().clone(),
                ..Default::default()
            })
        })
        .collect();
    let ts_index = schema.index_of("ts_uptime_us").ok();
    let mut span: Option<(u64, u64)> = None;
    let mut rows = 0u64;
    for batch in &read.batches {
        rows += batch.num_rows() as u64;
        for (i, slot) in columns.iter_mut().enumerate() {
            if let Some(stats) = slot {
                add_column(stats, batch.column(i));
            }
        }
        if let Some(ts) = ts_index
            .map(|i| batch.column(i))
            .and_then(|c| c.as_primitive_opt::<UInt64Type>())
        {
            for t in ts.iter().flatten() {
                span = Some(match span {
                    None => (t, t),
                    Some((lo, hi)) => (lo.min(t), hi.max(t)),
                });
            }
        }
    }
    Ok(TableSummary {
        table: table.into(),
        rows,
        lost_events: None,
        span_us: span,
        columns: columns.into_iter().flatten().collect(),
    })
}

/// Summaries of every table of a collection folder, with lost events from
/// its manifest when it has one.
pub fn summarize_collection(dir: &Path) -> Result<Vec<TableSummary>, DumpError> {
    let man = Manifest::read(dir).ok();
    let mut out = Vec::new();
    for table in collection::table_names(dir)? {
        let path = dir.join(format!("{table}.arrow"));
        let mut s = summarize_file(&table, &path)?;
        s.lost_events = man
            .as_ref()
            .and_then(|m| m.tables.get(&table))
            .map(|t| t.lost_events);
        out.push(s);
    }
    Ok(out)
}

/// The newest collection under `data`, by its manifest's start time.
pub fn newest_collection(data: &Path) -> Result<PathBuf, DumpError> {
    export::find_collections(data, &[])
        .map_err(DumpError::Find)?
        .into_iter()
        .filter_map(|d| Manifest::read(&d).ok().map(|m| (m.start.unix_us, d)))
        .max_by_key(|(t, d)| (*t, d.clone()))
        .map(|(_, d)| d)
        .ok_or_else(|| DumpError::NoCollection(data.to_owned()))
}

fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else if v.abs() >= 1e15 || (v.abs() < 1e-3 && v != 0.0) {
        format!("{v:.4e}")
    } else if v.abs() >= 1000.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// The text block printed for one table.
pub fn render(s: &TableSummary) -> String {
    let mut out = String::new();
    let lost = s
        .lost_events
        .map(|l| l.to_string())
        .unwrap_or_else(|| "-".into());
    let _ = write!(out, "{}: {} rows, {lost} lost events", s.table, s.rows);
    if let Some((lo, hi)) = s.span_us {
        let _ = write!(
            out,
            ", ts_uptime_us {:.3}s .. {:.3}s ({:.3}s)",
            lo as f64 / 1e6,
            hi as f64 / 1e6,
            (hi - lo) as f64 / 1e6
        );
    }
    out.push('\n');
    let width = s.columns.iter().map(|c| c.name.len()).max().unwrap_or(0);
    for c in s.columns.iter().filter(|c| c.count > 0) {
        let _ = writeln!(
            out,
            "  {:<width$}  min {}  mean {}  max {}",
            c.name,
            number(c.min),
            number(c.mean()),
            number(c.max)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::tests::{collection, tempdir};

    #[test]
    fn summarizes_rows_span_and_columns() {
        let data = tempdir("dump");
        let dir = collection(&data, "d1", "curated", None);
        let sums = summarize_collection(&dir).expect("summary");
        assert_eq!(sums.len(), 1);
        let s = &sums[0];
        assert_eq!(s.table, "ticks");
        assert_eq!(s.rows, 3);
        assert_eq!(s.lost_events, Some(2));
        assert_eq!(s.span_us, Some((1_000_000, 4_000_000)));
        assert_eq!(s.columns.len(), 1, "only numeric columns: {:?}", s.columns);
        let ts = &s.columns[0];
        assert_eq!((ts.min, ts.max), (1e6, 4e6));
        assert!((ts.mean() - 7e6 / 3.0).abs() < 1e-3);
        let text = render(s);
        assert!(
            text.starts_with("ticks: 3 rows, 2 lost events, ts_uptime_us 1.000s .. 4.000s"),
            "{text}"
        );
        assert!(text.contains("ts_uptime_us  min 1000000"), "{text}");
    }

    #[test]
    fn newest_is_the_latest_start() {
        let data = tempdir("newest");
        collection(&data, "zz_old", "curated", None);
        let newer = collection(&data, "aa_new", "curated", None);
        let path = newer.join("manifest.json");
        let text = std::fs::read_to_string(&path)
            .expect("read")
            .replace("\"unix_us\":1", "\"unix_us\":99");
        std::fs::write(&path, text).expect("write");
        assert_eq!(newest_collection(&data).expect("newest"), newer);
    }
}
