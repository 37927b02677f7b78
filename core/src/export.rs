//! `kernmlops export`: turns collection folders (`manifest.json` plus one
//! `<table>.arrow` per table) into the dataset researchers train from, in a
//! file format ([`ExportFormat`], Parquet today) and one of two layouts
//! ([`Layout`]):
//!
//! - classes (the default):
//!   `<to>/{curated,baseline,failed}/<table>/<collection_id>.<benchmark>.parquet`;
//! - Hive-partitioned:
//!   `<to>/<table>/run_class=<class>/benchmark=<benchmark>/<collection_id>.parquet`,
//!   so Spark, DataFusion, DuckDB and polars read every collection of a
//!   table, from any number of machines, as one table with `run_class` and
//!   `benchmark` as partition columns.
//!
//! The Arrow schema travels inside each Parquet file (types, field
//! metadata), so readers get the declared types back. In the Hive layout
//! dictionary-encoded columns (`collection_id`) become plain strings: every
//! file of a table then has the same schema, which engines need to union
//! the files and to join them (with an experiment's `results.parquet`, on
//! `collection_id`).

use std::{
    fs::File,
    path::{Path, PathBuf},
    sync::Arc,
};

use arrow_array::{cast::AsArray, Array, ArrayRef, RecordBatch, StringArray};
use arrow_ipc::reader::FileReader;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::{arrow::ArrowWriter, basic::Compression, file::properties::WriterProperties};

/// Why an export stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// Reading or writing a file or folder.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// An Arrow file that cannot be read, or a Parquet file that cannot be
    /// written.
    #[error("{}: {message}", path.display())]
    Format { path: PathBuf, message: String },
    /// A collection's manifest that cannot be read.
    #[error("{}/manifest.json: {message}", dir.display())]
    Manifest { dir: PathBuf, message: String },
    /// A collection selector that matches no folder.
    #[error("no collection {selector:?} under {} (a collection id or its prefix)", data.display())]
    NoMatch { selector: String, data: PathBuf },
    /// A table the Hive layout cannot hold.
    #[error("table {table} has a column named {column}, a partition column of the Hive layout; export it with --layout classes")]
    PartitionColumn { table: String, column: String },
}

impl ExportError {
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Self::Io {
            path: path.to_owned(),
            source,
        }
    }

    fn format<E: std::fmt::Display>(path: &Path) -> impl FnOnce(E) -> Self + '_ {
        move |e| Self::Format {
            path: path.to_owned(),
            message: e.to_string(),
        }
    }
}

use crate::manifest::{Manifest, RunClass, Status};

/// The run classes a collection is exported under.
pub const CLASSES: [&str; 3] = ["curated", "baseline", "failed"];

/// The partition columns of the Hive layout, outermost first.
pub const HIVE_PARTITIONS: [&str; 2] = ["run_class", "benchmark"];

/// The file format of an export: one file per table of a collection.
/// Adding one: a variant here, its file extension in
/// [`ExportFormat::extension`], its writer in [`ExportFormat::write`], and
/// its name in `kernmlops export --format` (`cli/src/args.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExportFormat {
    /// Snappy-compressed Parquet with the Arrow schema inside each file.
    #[default]
    Parquet,
}

impl ExportFormat {
    /// The extension of its files, without the dot.
    pub fn extension(self) -> &'static str {
        match self {
            Self::Parquet => "parquet",
        }
    }

    /// Writes the Arrow IPC file `src` as `dst` in this format for
    /// `layout` (the Hive layout's schema has plain strings for
    /// dictionary columns and no partition column), atomically; returns
    /// the row count.
    pub fn write(
        self,
        layout: Layout,
        src: &Path,
        dst: &Path,
        table: &str,
    ) -> Result<u64, ExportError> {
        match (self, layout) {
            (Self::Parquet, Layout::Classes) => arrow_to_parquet(src, dst),
            (Self::Parquet, Layout::Hive) => arrow_to_parquet_plain(src, dst, table),
        }
    }
}

/// Where an export puts each table file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// `<to>/<class>/<table>/<collection_id>.<benchmark>.<extension>`, the
    /// declared schema as it is.
    #[default]
    Classes,
    /// `<to>/<table>/run_class=<class>/benchmark=<benchmark>/<collection_id>.<extension>`,
    /// dictionary columns as plain strings.
    Hive,
}

impl Layout {
    /// Where one table file of one collection goes in `format`.
    pub fn path(
        self,
        format: ExportFormat,
        to: &Path,
        table: &str,
        class: &str,
        bench: &str,
        id: &str,
    ) -> PathBuf {
        let ext = format.extension();
        match self {
            Self::Classes => to
                .join(class)
                .join(table)
                .join(format!("{id}.{bench}.{ext}")),
            Self::Hive => to
                .join(table)
                .join(format!("run_class={}", hive_value(class)))
                .join(format!("benchmark={}", hive_value(bench)))
                .join(format!("{id}.{ext}")),
        }
    }
}

/// A partition value as Hive writes it: characters outside letters,
/// digits, `_`, `-` and `.` as `%XX`.
pub fn hive_value(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.is_empty() || out.starts_with('.') {
        out.insert_str(0, "%00");
    }
    out
}

/// One table file written.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    pub table: String,
    pub path: PathBuf,
    pub rows: u64,
}

/// What happened to one collection.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Exported {
        collection_id: String,
        class: String,
        files: Vec<Written>,
    },
    /// Not exported; the reason says what to do.
    Skipped {
        collection_id: String,
        reason: String,
    },
}

/// Collection folders under `data` (those holding a `manifest.json`),
/// sorted by name; with `selectors`, only those whose folder name equals or
/// starts with one of them. A selector matching nothing is an error.
pub fn find_collections(data: &Path, selectors: &[String]) -> Result<Vec<PathBuf>, ExportError> {
    let entries = std::fs::read_dir(data).map_err(ExportError::io(data))?;
    let mut all: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("manifest.json").is_file())
        .collect();
    all.sort();
    if selectors.is_empty() {
        return Ok(all);
    }
    let name = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let mut chosen = Vec::new();
    for sel in selectors {
        let hits: Vec<&PathBuf> = all.iter().filter(|p| name(p).starts_with(sel)).collect();
        if hits.is_empty() {
            return Err(ExportError::NoMatch {
                selector: sel.clone(),
                data: data.to_owned(),
            });
        }
        for h in hits {
            if !chosen.contains(h) {
                chosen.push(h.clone());
            }
        }
    }
    chosen.sort();
    Ok(chosen)
}

/// The class a collection is exported under, or why it is not exported.
pub fn export_class(man: &Manifest) -> Result<&'static str, &'static str> {
    match man.run_class {
        RunClass::Curated | RunClass::Baseline | RunClass::Failed => Ok(man.run_class.as_str()),
        // Crashed, then made readable by `kernmlops repair`.
        RunClass::Running if man.status == Status::Repaired => Ok("failed"),
        RunClass::Running => Err(
            "still running or crashed; if it crashed, run `kernmlops repair <collection folder>` first",
        ),
    }
}

/// `<benchmark name>` or `none`, as used in file names.
pub fn benchmark_label(man: &Manifest) -> String {
    man.benchmark
        .as_ref()
        .map(|b| b.name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "none".into())
}

/// The `<table>.arrow` files of a collection folder, by table name.
pub fn table_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, ExportError> {
    let entries = std::fs::read_dir(dir).map_err(ExportError::io(dir))?;
    let mut tables: Vec<(String, PathBuf)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "arrow"))
        .filter_map(|p| Some((p.file_stem()?.to_str()?.to_owned(), p.clone())))
        .collect();
    tables.sort();
    Ok(tables)
}

/// Exports one collection folder under `to` in the classes layout,
/// overwriting earlier exports.
pub fn export_collection(dir: &Path, to: &Path) -> Result<Outcome, ExportError> {
    export_collection_as(dir, to, Layout::Classes)
}

/// Exports one collection folder under `to` in `layout` as Parquet,
/// overwriting earlier exports of it (also under another run class).
pub fn export_collection_as(dir: &Path, to: &Path, layout: Layout) -> Result<Outcome, ExportError> {
    export_collection_in(dir, to, layout, ExportFormat::Parquet)
}

/// Exports one collection folder under `to` in `layout` and `format`,
/// overwriting earlier exports of it (also under another run class).
pub fn export_collection_in(
    dir: &Path,
    to: &Path,
    layout: Layout,
    format: ExportFormat,
) -> Result<Outcome, ExportError> {
    let man = Manifest::read(dir).map_err(|e| ExportError::Manifest {
        dir: dir.to_owned(),
        message: e.to_string(),
    })?;
    let collection_id = if man.collection_id.is_empty() {
        dir.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        man.collection_id.clone()
    };
    let class = match export_class(&man) {
        Ok(c) => c,
        Err(reason) => {
            return Ok(Outcome::Skipped {
                collection_id,
                reason: reason.into(),
            });
        }
    };
    let bench = benchmark_label(&man);
    let mut files = Vec::new();
    for (table, src) in table_files(dir)? {
        let dst = layout.path(format, to, &table, class, &bench, &collection_id);
        let rows = format.write(layout, &src, &dst, &table)?;
        files.push(Written {
            table,
            path: dst,
            rows,
        });
    }
    // The same collection exported earlier under another class (e.g.
    // repaired since) must not stay there too.
    for other in CLASSES.iter().filter(|c| **c != class) {
        for w in &files {
            let stale = layout.path(format, to, &w.table, other, &bench, &collection_id);
            if stale.is_file() {
                std::fs::remove_file(&stale).map_err(ExportError::io(&stale))?;
            }
        }
    }
    Ok(Outcome::Exported {
        collection_id,
        class: class.into(),
        files,
    })
}

/// Copies an Arrow IPC file into a Snappy-compressed Parquet file with the
/// same schema, written atomically (a reader sees the old or the new file).
/// Returns the row count.
pub fn arrow_to_parquet(src: &Path, dst: &Path) -> Result<u64, ExportError> {
    copy_to_parquet(src, dst, |schema| Ok((schema, None)))
}

/// [`arrow_to_parquet`] with every dictionary-encoded string column as a
/// plain string column (field metadata kept), for the Hive layout; a
/// column named like a partition column is refused.
pub fn arrow_to_parquet_plain(src: &Path, dst: &Path, table: &str) -> Result<u64, ExportError> {
    copy_to_parquet(src, dst, |schema| {
        if let Some(f) = schema
            .fields()
            .iter()
            .find(|f| HIVE_PARTITIONS.contains(&f.name().as_str()))
        {
            return Err(ExportError::PartitionColumn {
                table: table.to_owned(),
                column: f.name().clone(),
            });
        }
        let plain = plain_schema(&schema);
        let changed = plain != schema;
        Ok((plain, changed.then_some(plain_batch as BatchMap)))
    })
}

/// A batch transformation, given the schema it must produce.
type BatchMap = fn(&RecordBatch, &SchemaRef) -> Result<RecordBatch, arrow_schema::ArrowError>;

/// `schema` with dictionary-of-string fields as plain `Utf8` fields.
fn plain_schema(schema: &SchemaRef) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Dictionary(_, v) if **v == DataType::Utf8 => {
                f.as_ref().clone().with_data_type(DataType::Utf8)
            }
            _ => f.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// A batch with its dictionary-of-string columns decoded to plain strings.
fn plain_batch(
    batch: &RecordBatch,
    schema: &SchemaRef,
) -> Result<RecordBatch, arrow_schema::ArrowError> {
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|c| match c.as_any_dictionary_opt() {
            Some(dict) if *dict.values().data_type() == DataType::Utf8 => {
                let values = dict.values().as_string::<i32>();
                let keys = dict.normalized_keys();
                let strings: StringArray = (0..c.len())
                    .map(|i| (!c.is_null(i)).then(|| values.value(keys[i])))
                    .collect();
                Arc::new(strings) as ArrayRef
            }
            _ => c.clone(),
        })
        .collect();
    RecordBatch::try_new(schema.clone(), columns)
}

/// Copies `src` into `dst` (atomically) with the schema and batch
/// transformation `prepare` chooses from the file's schema.
fn copy_to_parquet(
    src: &Path,
    dst: &Path,
    prepare: impl FnOnce(SchemaRef) -> Result<(SchemaRef, Option<BatchMap>), ExportError>,
) -> Result<u64, ExportError> {
    let open = File::open(src).map_err(ExportError::io(src))?;
    let reader = FileReader::try_new(open, None).map_err(|e| ExportError::Format {
        path: src.to_owned(),
        message: format!("{e} (if the run crashed, run `kernmlops repair` on its folder)"),
    })?;
    let (schema, map) = prepare(reader.schema())?;
    let parent = dst.parent().ok_or_else(|| ExportError::Format {
        path: dst.to_owned(),
        message: "no parent folder".into(),
    })?;
    std::fs::create_dir_all(parent).map_err(ExportError::io(parent))?;
    // A fresh hidden temporary name beside `dst`, never a planted one.
    let mut out = crate::files::atomic(dst).map_err(ExportError::io(dst))?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    let mut writer = ArrowWriter::try_new(&mut out, schema.clone(), Some(props))
        .map_err(ExportError::format(dst))?;
    let mut rows = 0u64;
    for batch in reader {
        let batch = batch.map_err(ExportError::format(src))?;
        let batch = match map {
            Some(f) => f(&batch, &schema).map_err(ExportError::format(src))?,
            None => batch,
        };
        rows += batch.num_rows() as u64;
        writer.write(&batch).map_err(ExportError::format(dst))?;
    }
    writer.close().map_err(ExportError::format(dst))?;
    out.commit()
        .map_err(|e| ExportError::io(dst)(crate::files::without_path(e, dst)))?;
    Ok(rows)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::{collections::HashMap, sync::Arc};

    use arrow_array::{
        cast::AsArray, types::Int32Type, Array, DictionaryArray, RecordBatch, RecordBatchReader,
        StringArray, UInt64Array,
    };
    use arrow_ipc::writer::FileWriter;
    use arrow_schema::{DataType, Field, Schema};
    use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};

    use super::*;

    /// A scratch folder, removed when the test ends, pass or fail.
    pub(crate) struct Scratch(PathBuf);

    impl std::ops::Deref for Scratch {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl AsRef<Path> for Scratch {
        fn as_ref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The type of a column the schema must have.
    fn data_type<'a>(schema: &'a Schema, column: &str) -> &'a DataType {
        schema.field_with_name(column).expect(column).data_type()
    }

    /// The timestamp column keeps its unit in its metadata.
    fn assert_ts_in_us(schema: &Schema) {
        let ts = schema.field_with_name("ts_uptime_us").expect("ts");
        assert_eq!(ts.metadata()["unit"], "us");
    }

    fn parquet_reader(path: &Path) -> ParquetRecordBatchReader {
        ParquetRecordBatchReaderBuilder::try_new(File::open(path).expect("open"))
            .expect("parquet")
            .build()
            .expect("reader")
    }

    pub(crate) fn tempdir(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("kml-export-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        Scratch(d)
    }

    pub(crate) fn write_arrow(path: &Path, ts: &[u64]) {
        let meta = HashMap::from([("unit".to_string(), "us".to_string())]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("ts_uptime_us", DataType::UInt64, false).with_metadata(meta),
            Field::new("label", DataType::Utf8, true),
            Field::new(
                "collection_id",
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                false,
            ),
        ]));
        let n = ts.len();
        let labels: Vec<String> = (0..n).map(|i| format!("l{i}")).collect();
        let dict: DictionaryArray<Int32Type> = std::iter::repeat_n("c1", n).collect();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(UInt64Array::from(ts.to_vec())),
                Arc::new(StringArray::from(labels)),
                Arc::new(dict),
            ],
        )
        .expect("batch");
        let mut w =
            FileWriter::try_new(File::create(path).expect("create"), &schema).expect("writer");
        w.write(&batch).expect("write");
        w.finish().expect("finish");
    }

    fn manifest_json(id: &str, class: &str, bench: Option<&str>) -> String {
        let bench = match bench {
            Some(b) => format!(
                r#"{{"name":"{b}","plugin":"p","exit_code":0,"stopped_by":null,"error":null,"start_uptime_us":null,"end_uptime_us":null}}"#
            ),
            None => "null".into(),
        };
        format!(
            r#"{{"kernmlops_version":"0","collection_id":"{id}","status":"complete","command":[],"config":{{}},
"hostname":"h","kernel_release":"r","kernel_version":"v","start":{{"uptime_us":1,"unix_us":1,"utc":"x"}},
"end":null,"plugins":[],"refused_plugins":[],"probes":[],
"tables":{{"ticks":{{"probe":"t","file":"ticks.arrow","rows":3,"lost_events":2}}}},
"errors":[],"run_class":"{class}","benchmark":{bench}}}"#
        )
    }

    pub(crate) fn collection(data: &Path, id: &str, class: &str, bench: Option<&str>) -> PathBuf {
        let dir = data.join(id);
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("manifest.json"), manifest_json(id, class, bench))
            .expect("manifest");
        write_arrow(&dir.join("ticks.arrow"), &[1_000_000, 2_000_000, 4_000_000]);
        dir
    }

    #[test]
    fn exports_with_the_declared_types_and_layout() {
        let data = tempdir("layout");
        let dir = collection(&data, "abc123", "curated", Some("redis"));
        let to = data.join("export");
        let out = export_collection(&dir, &to).expect("export");
        let Outcome::Exported { class, files, .. } = out else {
            panic!("skipped: {out:?}")
        };
        assert_eq!(class, "curated");
        let path = to.join("curated/ticks/abc123.redis.parquet");
        assert_eq!(
            files,
            vec![Written {
                table: "ticks".into(),
                path: path.clone(),
                rows: 3
            }]
        );
        let reader = parquet_reader(&path);
        let schema = reader.schema();
        assert_eq!(data_type(&schema, "ts_uptime_us"), &DataType::UInt64);
        assert_ts_in_us(&schema);
        assert!(matches!(
            data_type(&schema, "collection_id"),
            DataType::Dictionary(_, _)
        ));
        let rows: usize = reader.map(|b| b.expect("batch").num_rows()).sum();
        assert_eq!(rows, 3);
        // Idempotent: exporting again overwrites the same file.
        export_collection(&dir, &to).expect("again");
        assert!(path.is_file());
        // No temporary file is left beside it.
        let names: Vec<_> = std::fs::read_dir(to.join("curated/ticks"))
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("abc123.redis.parquet")]
        );
    }

    #[test]
    fn classes_and_benchmark_names() {
        let data = tempdir("classes");
        let to = data.join("export");
        let failed = collection(&data, "f1", "failed", Some("shell"));
        export_collection(&failed, &to).expect("failed");
        assert!(to.join("failed/ticks/f1.shell.parquet").is_file());
        let base = collection(&data, "b1", "baseline", None);
        export_collection(&base, &to).expect("baseline");
        assert!(to.join("baseline/ticks/b1.none.parquet").is_file());
        let running = collection(&data, "r1", "running", None);
        let out = export_collection(&running, &to).expect("running");
        assert!(
            matches!(&out, Outcome::Skipped { reason, .. } if reason.contains("kernmlops repair")),
            "{out:?}"
        );
    }

    #[test]
    fn hive_layout_partitions_tables_with_plain_collection_ids() {
        let data = tempdir("hive");
        let to = data.join("dataset");
        let a = collection(&data, "a1", "curated", Some("fio"));
        let b = collection(&data, "b2", "baseline", None);
        for dir in [&a, &b] {
            export_collection_as(dir, &to, Layout::Hive).expect("export");
        }
        let path = to.join("ticks/run_class=curated/benchmark=fio/a1.parquet");
        let reader = parquet_reader(&path);
        let schema = reader.schema();
        // A plain string, so files of many collections union and join.
        assert_eq!(data_type(&schema, "collection_id"), &DataType::Utf8);
        assert_ts_in_us(&schema);
        let batches: Vec<RecordBatch> = reader.map(|b| b.expect("batch")).collect();
        let ids: Vec<String> = batches
            .iter()
            .flat_map(|b| {
                let c = b
                    .column_by_name("collection_id")
                    .expect("id")
                    .as_string::<i32>()
                    .clone();
                (0..c.len()).map(move |i| c.value(i).to_owned())
            })
            .collect();
        assert_eq!(ids, ["c1", "c1", "c1"]);
        assert!(to
            .join("ticks/run_class=baseline/benchmark=none/b2.parquet")
            .is_file());
        // Exported again under another class: only the new place holds it.
        std::fs::write(b.join("manifest.json"), manifest_json("b2", "failed", None))
            .expect("manifest");
        export_collection_as(&b, &to, Layout::Hive).expect("again");
        assert!(to
            .join("ticks/run_class=failed/benchmark=none/b2.parquet")
            .is_file());
        assert!(!to
            .join("ticks/run_class=baseline/benchmark=none/b2.parquet")
            .exists());
        // Partition values are escaped as Hive does.
        assert_eq!(hive_value("fio"), "fio");
        assert_eq!(hive_value("a b/c=d"), "a%20b%2Fc%3Dd");
        // A column named like a partition column cannot be partitioned.
        let odd = data.join("odd");
        std::fs::create_dir_all(&odd).expect("mkdir");
        std::fs::write(
            odd.join("manifest.json"),
            manifest_json("o3", "curated", None),
        )
        .expect("manifest");
        let schema = Arc::new(Schema::new(vec![Field::new(
            "benchmark",
            DataType::Utf8,
            false,
        )]));
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(vec!["x"]))])
                .expect("batch");
        let mut w =
            FileWriter::try_new(File::create(odd.join("t.arrow")).expect("create"), &schema)
                .expect("writer");
        w.write(&batch).expect("write");
        w.finish().expect("finish");
        let err = export_collection_as(&odd, &to, Layout::Hive)
            .expect_err("refused")
            .to_string();
        assert!(err.contains("--layout classes"), "{err}");
        export_collection_as(&odd, &to, Layout::Classes).expect("classes layout");
        let _ = std::fs::remove_dir_all(&data);
    }

    #[test]
    fn selects_collections_by_prefix() {
        let data = tempdir("select");
        collection(&data, "aa11", "curated", None);
        collection(&data, "aa22", "curated", None);
        collection(&data, "bb33", "curated", None);
        std::fs::create_dir_all(data.join("curated")).expect("mkdir");
        assert_eq!(find_collections(&data, &[]).expect("all").len(), 3);
        let aa = find_collections(&data, &["aa".into()]).expect("aa");
        assert_eq!(aa, vec![data.join("aa11"), data.join("aa22")]);
        let err = find_collections(&data, &["zz".into()])
            .expect_err("none")
            .to_string();
        assert!(err.contains("zz"), "{err}");
    }
}
