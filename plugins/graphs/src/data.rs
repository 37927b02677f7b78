//! Reading a collection folder: manifest.json for the title and the time
//! origin, `<table>.arrow` files for the data.

use std::{
    collections::HashMap,
    fs::File,
    path::{Path, PathBuf},
};

use arrow_array::{cast::AsArray, types, Array, RecordBatch};
use arrow_ipc::reader::FileReader;
use arrow_schema::DataType;
use kernmlops_plugin_sdk::{serde_json, Error, Result};

/// What every figure of one collection shares.
pub struct Collection {
    pub dir: PathBuf,
    /// `<collection id>` or `<collection id> (<benchmark>)`.
    pub title: String,
    /// CLOCK_BOOTTIME microseconds of x = 0.
    pub origin_us: u64,
    /// What x = 0 is, for the axis label.
    pub origin_name: &'static str,
}

impl Collection {
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join("manifest.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::new(format!("reading {}: {e}", path.display())))?;
        let m: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::new(format!("parsing {}: {e}", path.display())))?;
        let id = m
            .get("collection_id")
            .and_then(|v| v.as_str())
            .ok_or_else(|| Error::new(format!("{}: no collection_id", path.display())))?;
        let bench = m.get("benchmark").filter(|b| !b.is_null());
        let bench_start = bench
            .and_then(|b| b.get("start_uptime_us"))
            .and_then(|v| v.as_u64());
        let bench_name = bench.and_then(|b| b.get("name")).and_then(|v| v.as_str());
        let start = m
            .get("start")
            .and_then(|s| s.get("uptime_us"))
            .and_then(|v| v.as_u64());
        let (origin_us, origin_name) = match (bench_start, start) {
            (Some(b), _) => (b, "benchmark start"),
            (None, Some(s)) => (s, "collection start"),
            (None, None) => {
                return Err(Error::new(format!(
                    "{}: neither benchmark.start_uptime_us nor start.uptime_us",
                    path.display()
                )))
            }
        };
        let title = match bench_name {
            Some(b) => format!("{id} ({b})"),
            None => id.to_owned(),
        };
        Ok(Self {
            dir: dir.to_owned(),
            title,
            origin_us,
            origin_name,
        })
    }

    /// Seconds since the origin of a `ts_uptime_us` value.
    pub fn secs(&self, ts_us: u64) -> f64 {
        (ts_us as f64 - self.origin_us as f64) / 1e6
    }

    pub fn x_label(&self) -> String {
        format!("seconds since {}", self.origin_name)
    }

    pub fn table(&self, name: &str) -> Result<Table> {
        Table::read(&self.dir.join(format!("{name}.arrow")))
    }

    /// Tables whose columns are exactly those of a perf counter table,
    /// sorted by name.
    pub fn perf_tables(&self) -> Result<Vec<String>> {
        const COLUMNS: [&str; 6] = [
            "collection_id",
            "ts_uptime_us",
            "cpu",
            "count",
            "time_enabled_ns",
            "time_running_ns",
        ];
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| Error::new(format!("reading {}: {e}", self.dir.display())))?;
        let mut names = Vec::new();
        for entry in entries {
            let path = entry
                .map_err(|e| Error::new(format!("reading {}: {e}", self.dir.display())))?
                .path();
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".arrow"))
            else {
                continue;
            };
            let Ok(file) = File::open(&path) else {
                continue;
            };
            let Ok(reader) = FileReader::try_new(file, None) else {
                continue;
            };
            let schema = reader.schema();
            let mut cols: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            cols.sort_unstable();
            let mut want = COLUMNS;
            want.sort_unstable();
            if cols == want {
                names.push(name.to_owned());
            }
        }
        names.sort();
        Ok(names)
    }
}

/// One table's batches.
pub struct Table {
    path: PathBuf,
    batches: Vec<RecordBatch>,
}

impl Table {
    pub fn read(path: &Path) -> Result<Self> {
        let file =
            File::open(path).map_err(|e| Error::new(format!("opening {}: {e}", path.display())))?;
        let reader = FileReader::try_new(file, None)
            .map_err(|e| Error::new(format!("reading {}: {e}", path.display())))?;
        let batches = reader
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::new(format!("reading {}: {e}", path.display())))?;
        Ok(Self {
            path: path.to_owned(),
            batches,
        })
    }

    pub fn has(&self, column: &str) -> bool {
        self.batches
            .first()
            .is_some_and(|b| b.schema().column_with_name(column).is_some())
    }

    /// An integer column as u64 (negative values clamp to 0, nulls to 0).
    pub fn u64s(&self, column: &str) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        for b in &self.batches {
            let a = b
                .column_by_name(column)
                .ok_or_else(|| self.missing(column))?;
            macro_rules! take {
                ($t:ty) => {
                    out.extend(
                        a.as_primitive::<$t>()
                            .iter()
                            .map(|v| v.map_or(0, |v| u64::try_from(v).unwrap_or(0))),
                    )
                };
            }
            match a.data_type() {
                DataType::UInt64 => take!(types::UInt64Type),
                DataType::UInt32 => take!(types::UInt32Type),
                DataType::UInt16 => take!(types::UInt16Type),
                DataType::UInt8 => take!(types::UInt8Type),
                DataType::Int64 => take!(types::Int64Type),
                DataType::Int32 => take!(types::Int32Type),
                DataType::Int16 => take!(types::Int16Type),
                DataType::Int8 => take!(types::Int8Type),
                other => {
                    return Err(Error::new(format!(
                        "{}: column {column} is {other}, not an integer",
                        self.path.display()
                    )))
                }
            }
        }
        Ok(out)
    }

    /// A string column (Utf8, LargeUtf8 or a dictionary of Utf8).
    pub fn strings(&self, column: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for b in &self.batches {
            let a = b
                .column_by_name(column)
                .ok_or_else(|| self.missing(column))?;
            match a.data_type() {
                DataType::Utf8 => out.extend(
                    a.as_string::<i32>()
                        .iter()
                        .map(|v| v.unwrap_or("").to_owned()),
                ),
                DataType::LargeUtf8 => out.extend(
                    a.as_string::<i64>()
                        .iter()
                        .map(|v| v.unwrap_or("").to_owned()),
                ),
                DataType::Dictionary(_, v) if **v == DataType::Utf8 => {
                    let d = a.as_any_dictionary();
                    let values = d.values().as_string::<i32>();
                    let keys = d.normalized_keys();
                    for (i, k) in keys.iter().enumerate() {
                        out.push(if d.is_null(i) || *k >= values.len() {
                            String::new()
                        } else {
                            values.value(*k).to_owned()
                        });
                    }
                }
                other => {
                    return Err(Error::new(format!(
                        "{}: column {column} is {other}, not a string",
                        self.path.display()
                    )))
                }
            }
        }
        Ok(out)
    }

    fn missing(&self, column: &str) -> Error {
        Error::new(format!("{}: no column {column}", self.path.display()))
    }
}

/// Groups `(key, value)` pairs by key, keys sorted.
pub fn group<K: Ord + Clone + std::hash::Hash, V>(
    pairs: impl IntoIterator<Item = (K, V)>,
) -> Vec<(K, Vec<V>)> {
    let mut map: HashMap<K, Vec<V>> = HashMap::new();
    for (k, v) in pairs {
        map.entry(k).or_default().push(v);
    }
    let mut out: Vec<_> = map.into_iter().collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}
