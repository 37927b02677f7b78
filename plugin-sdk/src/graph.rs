//! What a graph renders from: the host reads the collection's tables (with
//! its one collection reader) and hands the graph plain columns, so graph
//! plugins link no Arrow reader. [`GraphData`] is the graph's typed view.

use std::path::Path;

use kernmlops_plugin_api::{ColumnKind, GraphColumn, GraphInput, GraphTable};

use crate::{Error, Result};

/// A graph's input: the manifest and the tables the host read for it.
#[derive(Clone, Copy)]
pub struct GraphData<'a> {
    input: &'a GraphInput,
}

impl<'a> GraphData<'a> {
    pub fn new(input: &'a GraphInput) -> Self {
        Self { input }
    }

    /// The folder the data comes from.
    pub fn dir(&self) -> &'a Path {
        Path::new(self.input.dir.as_str())
    }

    /// The collection's manifest (or an experiment's record) as JSON.
    pub fn manifest(&self) -> Result<serde_json::Value> {
        serde_json::from_str(&self.input.manifest_json).map_err(|e| {
            Error::new(format!(
                "{}: the manifest is not JSON: {e}",
                self.dir().display()
            ))
        })
    }

    /// Every table given, in the host's order.
    pub fn tables(&self) -> impl Iterator<Item = TableView<'a>> + 'a {
        self.input.tables.iter().map(|t| TableView { t })
    }

    /// The named table.
    pub fn table(&self, name: &str) -> Result<TableView<'a>> {
        self.input
            .tables
            .iter()
            .find(|t| t.name.as_str() == name)
            .map(|t| TableView { t })
            .ok_or_else(|| {
                Error::new(format!(
                    "{}: the host gave no table {name}",
                    self.dir().display()
                ))
            })
    }
}

/// One table of a graph's input.
#[derive(Clone, Copy)]
pub struct TableView<'a> {
    t: &'a GraphTable,
}

impl<'a> TableView<'a> {
    pub fn name(&self) -> &'a str {
        self.t.name.as_str()
    }

    pub fn rows(&self) -> usize {
        usize::try_from(self.t.rows).unwrap_or(usize::MAX)
    }

    /// Column names, in the table's order.
    pub fn column_names(&self) -> impl Iterator<Item = &'a str> + 'a {
        self.t.columns.iter().map(|c| c.name.as_str())
    }

    pub fn has(&self, column: &str) -> bool {
        self.column(column).is_ok()
    }

    /// The table's schema metadata.
    pub fn metadata(&self) -> serde_json::Value {
        serde_json::from_str(&self.t.metadata_json).unwrap_or_default()
    }

    /// A column's field metadata (`unit`, `description`, ...).
    pub fn column_metadata(&self, column: &str) -> serde_json::Value {
        self.column(column)
            .ok()
            .and_then(|c| serde_json::from_str(&c.metadata_json).ok())
            .unwrap_or_default()
    }

    fn column(&self, column: &str) -> Result<&'a GraphColumn> {
        self.t
            .columns
            .iter()
            .find(|c| c.name.as_str() == column)
            .ok_or_else(|| Error::new(format!("table {}: no column {column}", self.name())))
    }

    /// Which rows are null (all false when none is).
    pub fn nulls(&self, column: &str) -> Result<Vec<bool>> {
        let c = self.column(column)?;
        Ok(if c.nulls.is_empty() {
            vec![false; self.rows()]
        } else {
            c.nulls.to_vec()
        })
    }

    /// The column's type in the collection's file (`Int64`, `Utf8`, ...).
    pub fn arrow_type(&self, column: &str) -> String {
        self.column_metadata(column)["arrow_type"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The column's kind: `U64`, `I64`, `F64` or `STR`.
    pub fn kind(&self, column: &str) -> Result<ColumnKind> {
        Ok(self.column(column)?.kind)
    }

    /// An integer column as u64 (negative values clamp to 0).
    pub fn u64s(&self, column: &str) -> Result<Vec<u64>> {
        let c = self.column(column)?;
        match c.kind {
            ColumnKind::U64 => Ok(c.u64s.to_vec()),
            ColumnKind::I64 => Ok(c
                .i64s
                .iter()
                .map(|&v| u64::try_from(v).unwrap_or(0))
                .collect()),
            _ => Err(Error::new(format!(
                "table {}: column {column} is not an integer",
                self.name()
            ))),
        }
    }

    /// A numeric column as f64.
    pub fn f64s(&self, column: &str) -> Result<Vec<f64>> {
        let c = self.column(column)?;
        match c.kind {
            ColumnKind::U64 => Ok(c.u64s.iter().map(|&v| v as f64).collect()),
            ColumnKind::I64 => Ok(c.i64s.iter().map(|&v| v as f64).collect()),
            ColumnKind::F64 => Ok(c.f64s.to_vec()),
            _ => Err(Error::new(format!(
                "table {}: column {column} is not a number",
                self.name()
            ))),
        }
    }

    /// A text column.
    pub fn strings(&self, column: &str) -> Result<Vec<String>> {
        let c = self.column(column)?;
        match c.kind {
            ColumnKind::STR => Ok(c.texts.iter().map(|s| s.to_string()).collect()),
            _ => Err(Error::new(format!(
                "table {}: column {column} is not text",
                self.name()
            ))),
        }
    }
}
