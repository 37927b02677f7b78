//! Rendering a collection's graphs: every graph a loaded plugin offers whose
//! tables the collection has renders into `<collection>/graphs/`. The host
//! reads the tables a graph needs with its one collection reader and hands
//! them over as plain columns (`GraphInput`): graph plugins read no files.

use std::path::{Path, PathBuf};

use abi_stable::std_types::{RResult, RString, RVec};
use arrow_schema::{DataType, TimeUnit};
use kernmlops_plugin_api::{ColumnKind, GraphColumn, GraphDecl, GraphInput, GraphTable};

use crate::{
    collect::{start_args, RunOptions},
    collection::{self, CollectionError, Table},
    plugin::{Plugin, Registry},
};

/// Why graphs could not be rendered at all.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("{} is not a collection folder (no manifest.json)", .0.display())]
    NotACollection(PathBuf),
    #[error("{} is not a UTF-8 path", .0.display())]
    NotUtf8(PathBuf),
    #[error("creating {}: {source}", path.display())]
    Output {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Read(#[from] CollectionError),
    /// The plugin failed (its message, with the plugin's name).
    #[error("{0}")]
    Plugin(String),
}

/// One graph's outcome: the files it wrote, or why it failed.
#[derive(Debug)]
pub struct Rendered {
    pub graph: String,
    pub plugin: String,
    pub outcome: Result<Vec<PathBuf>, String>,
}

/// The tables of `dir` a graph takes: its declared ones and those whose
/// columns (besides `collection_id`) are exactly its column set. `None`
/// when a declared table is missing or, for a column set alone, no table
/// matches: the graph does not apply.
fn tables_for(decl: &GraphDecl, dir: &Path) -> Result<Option<Vec<String>>, GraphError> {
    let tables: Vec<&str> = decl.tables.iter().map(|t| t.as_str()).collect();
    let with: Vec<&str> = decl
        .tables_with_columns
        .iter()
        .map(|c| c.as_str())
        .collect();
    tables_matching(&tables, &with, dir)
}

/// A graph's declared table `probe:<name>` stands for every table the
/// manifest says probe `<name>` wrote (tables declared at run time, such
/// as the `trace` probe's, one per event).
pub const PROBE_TABLES_PREFIX: &str = "probe:";

/// The tables on disk that the manifest of `dir` attributes to `probe`,
/// sorted by name.
fn tables_of_probe(dir: &Path, probe: &str, on_disk: &[String]) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(dir.join("manifest.json")) else {
        return Vec::new();
    };
    let Ok(m) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    let Some(tables) = m.get("tables").and_then(|t| t.as_object()) else {
        return Vec::new();
    };
    let mut out: Vec<String> = tables
        .iter()
        .filter(|(_, e)| e.get("probe").and_then(|p| p.as_str()) == Some(probe))
        .map(|(name, _)| name.clone())
        .filter(|name| on_disk.contains(name))
        .collect();
    out.sort();
    out
}

/// The tables of `dir` named in `tables` (`probe:<name>`: every table of
/// that probe, see [`PROBE_TABLES_PREFIX`]), plus those whose columns
/// (besides `collection_id`) are exactly `with_columns`; `None` when the
/// graph does not apply (see [`tables_for`]).
pub fn tables_matching(
    names: &[&str],
    with_columns: &[&str],
    dir: &Path,
) -> Result<Option<Vec<String>>, GraphError> {
    let on_disk = collection::table_names(dir)?;
    let mut tables = Vec::new();
    for t in names {
        if let Some(probe) = t.strip_prefix(PROBE_TABLES_PREFIX) {
            let of_probe = tables_of_probe(dir, probe, &on_disk);
            if of_probe.is_empty() {
                return Ok(None);
            }
            for name in of_probe {
                if !tables.contains(&name) {
                    tables.push(name);
                }
            }
            continue;
        }
        if !on_disk.iter().any(|d| d == t) {
            return Ok(None);
        }
        tables.push((*t).to_owned());
    }
    if !with_columns.is_empty() {
        let mut want: Vec<&str> = with_columns.to_vec();
        want.sort_unstable();
        let mut matched = false;
        for t in &on_disk {
            let path = dir.join(format!("{t}.arrow"));
            // Unreadable files are not this graph's business.
            let Ok(schema) = collection::read_schema(&path) else {
                continue;
            };
            let mut cols: Vec<&str> = schema
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .filter(|n| *n != kernmlops_plugin_api::COLLECTION_ID_COLUMN)
                .collect();
            cols.sort_unstable();
            if cols == want && !tables.contains(t) {
                tables.push(t.clone());
                matched = true;
            }
        }
        if names.is_empty() && !matched {
            return Ok(None);
        }
    }
    Ok(Some(tables))
}

/// Key-value metadata as a JSON object's text.
fn metadata_json(pairs: impl Iterator<Item = (String, String)>) -> String {
    let map: serde_json::Map<String, serde_json::Value> = pairs
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect();
    serde_json::Value::Object(map).to_string()
}

/// A table read by the host, as a graph gets it.
pub fn graph_table(table: &Table) -> Result<GraphTable, CollectionError> {
    let mut columns = RVec::new();
    for field in table.schema.fields() {
        let name = field.name();
        let arrow_type = ("arrow_type".to_owned(), field.data_type().to_string());
        let meta = metadata_json(
            field
                .metadata()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .chain([arrow_type]),
        );
        let mut col = GraphColumn {
            name: name.as_str().into(),
            metadata_json: meta.into(),
            ..GraphColumn::default()
        };
        let dt = match field.data_type() {
            DataType::Dictionary(_, v) => v.as_ref(),
            other => other,
        };
        match dt {
            DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
            | DataType::Boolean => {
                col.kind = ColumnKind::U64;
                col.u64s = table.u64s(name)?.into();
            }
            DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
                col.kind = ColumnKind::I64;
                col.i64s = table.i64s(name)?.into();
            }
            DataType::Timestamp(TimeUnit::Microsecond, _) => {
                col.kind = ColumnKind::I64;
                col.i64s = table.i64s(name)?.into();
            }
            DataType::Float32 | DataType::Float64 => {
                col.kind = ColumnKind::F64;
                col.f64s = table.f64s(name)?.into();
            }
            DataType::Utf8 | DataType::LargeUtf8 => {
                col.kind = ColumnKind::STR;
                col.texts = table
                    .strings(name)?
                    .into_iter()
                    .map(|s| RString::from(s.unwrap_or_default()))
                    .collect();
            }
            // Nothing a graph draws from.
            _ => continue,
        }
        let nulls = table.nulls(name)?;
        if nulls.iter().any(|&n| n) {
            col.nulls = nulls.into();
        }
        columns.push(col);
    }
    Ok(GraphTable {
        name: table.name.as_str().into(),
        metadata_json: metadata_json(
            table
                .schema
                .metadata()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        )
        .into(),
        rows: table.rows() as u64,
        columns,
    })
}

/// Runs one graph of `plugin` on `input`, writing into `out_dir`.
pub fn render_one(
    plugin: &Plugin,
    graph: &str,
    input: &GraphInput,
    out_dir: &Path,
) -> Result<Vec<PathBuf>, String> {
    render_one_with(plugin, graph, input, out_dir, &Default::default())
}

/// [`render_one`] with settings by graph name (each graph gets its own
/// entry as its `config_json`, `{}` without one).
pub fn render_one_with(
    plugin: &Plugin,
    graph: &str,
    input: &GraphInput,
    out_dir: &Path,
    settings: &std::collections::BTreeMap<String, serde_json::Value>,
) -> Result<Vec<PathBuf>, String> {
    let out_text = out_dir
        .to_str()
        .ok_or_else(|| format!("{} is not a UTF-8 path", out_dir.display()))?;
    let args = start_args(graph, &RunOptions::default(), settings);
    let mut g = plugin
        .start_graph(graph, &args)
        .map_err(|e| e.to_string())?;
    match g.render_input(input, out_text.into()) {
        RResult::ROk(files) => Ok(files
            .into_iter()
            .map(|f| PathBuf::from(f.as_str()))
            .collect()),
        RResult::RErr(e) => Err(e.to_string()),
    }
}

/// What a graph gets from `collection`: the named tables read by the host,
/// with the manifest.
pub fn collection_input(collection: &Path, tables: &[String]) -> Result<GraphInput, GraphError> {
    let Some(dir_text) = collection.to_str() else {
        return Err(GraphError::NotUtf8(collection.to_owned()));
    };
    let manifest_path = collection.join("manifest.json");
    let manifest_json =
        std::fs::read_to_string(&manifest_path).map_err(|source| CollectionError::Io {
            path: manifest_path.clone(),
            source,
        })?;
    let tables = tables
        .iter()
        .map(|t| collection::read_table(&collection.join(format!("{t}.arrow"))))
        .map(|t| t.and_then(|t| graph_table(&t)))
        .collect::<Result<RVec<_>, _>>()?;
    Ok(GraphInput {
        dir: dir_text.into(),
        manifest_json: manifest_json.into(),
        tables,
    })
}

/// Renders every applicable graph of the registry for `collection`.
pub fn render_collection(
    registry: &Registry,
    collection: &Path,
) -> Result<Vec<Rendered>, GraphError> {
    render_collection_with(registry, collection, &Default::default())
}

/// [`render_collection`] with settings by graph name (as
/// [`render_one_with`] takes them).
pub fn render_collection_with(
    registry: &Registry,
    collection: &Path,
    settings: &std::collections::BTreeMap<String, serde_json::Value>,
) -> Result<Vec<Rendered>, GraphError> {
    if !collection.join("manifest.json").is_file() {
        return Err(GraphError::NotACollection(collection.to_owned()));
    }
    let out_dir = collection.join("graphs");
    let mut out = Vec::new();
    for plugin in &registry.plugins {
        for g in &plugin.graphs {
            let Some(tables) = tables_for(g, collection)? else {
                continue;
            };
            std::fs::create_dir_all(&out_dir).map_err(|source| GraphError::Output {
                path: out_dir.clone(),
                source,
            })?;
            let name = g.name.to_string();
            let outcome = collection_input(collection, &tables)
                .map_err(|e| e.to_string())
                .and_then(|input| render_one_with(plugin, &name, &input, &out_dir, settings));
            out.push(Rendered {
                graph: name,
                plugin: plugin.name().to_owned(),
                outcome,
            });
        }
    }
    Ok(out)
}
