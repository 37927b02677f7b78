//! The table specification every probe must meet, checked by the host when
//! it loads a plugin and by plugin crates in their own tests
//! (`kernmlops_plugin_sdk::testing`). The same declaration is later used to
//! decode records, so a table that passes cannot be misread. Pure Rust: no
//! dependency beyond this crate and `kernmlops_sys` (its naming rule).

use std::{collections::HashMap, fmt};

use crate::{
    ColumnKind, ProbeDecl, TableDecl, COLLECTION_ID_COLUMN, DATA_CONTRACT_VERSION, TIMESTAMP_COLUMN,
};

/// Tables the host writes itself; plugins may not declare them.
pub const RESERVED_TABLES: &[&str] = &[
    "system_info",
    "manifest",
    "performance_indicator",
    "collector_overhead",
    "energy",
    "energy_attribution",
    "results",
];

/// Largest record a table may declare, in bytes.
pub const MAX_RECORD_SIZE: u32 = 64 * 1024;

/// Why a declaration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValidationError {
    TableName(String),
    ReservedTable(String),
    RecordSize {
        table: String,
        size: u32,
    },
    NoColumns(String),
    ColumnName {
        table: String,
        column: String,
    },
    DuplicateColumn {
        table: String,
        column: String,
    },
    ReservedColumn {
        table: String,
    },
    UnknownKind {
        table: String,
        column: String,
        kind: u32,
    },
    KindSize {
        table: String,
        column: String,
        kind: &'static str,
        expected: String,
        size: u32,
    },
    NoLabels {
        table: String,
        column: String,
    },
    OutOfRecord {
        table: String,
        column: String,
        offset: u32,
        end: u64,
        record_size: u32,
    },
    Overlap {
        table: String,
        first: String,
        second: String,
    },
    MissingTimestamp(String),
    TimestampKind {
        table: String,
        kind: String,
    },
    DuplicateTable {
        table: String,
        owner: String,
    },
    DataContract {
        found: u32,
    },
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ValidationError as E;
        match self {
            E::TableName(t) => write!(f, "table name {t:?} is not lowercase snake_case"),
            E::ReservedTable(t) => write!(f, "table name {t:?} is reserved for the host"),
            E::RecordSize { table, size } => write!(
                f,
                "table {table}: record size {size} is not between 1 and {MAX_RECORD_SIZE} bytes"
            ),
            E::NoColumns(t) => write!(f, "table {t}: declares no columns"),
            E::ColumnName { table, column } => {
                write!(f, "table {table}: column name {column:?} is not lowercase snake_case")
            }
            E::DuplicateColumn { table, column } => {
                write!(f, "table {table}: column {column} is declared twice")
            }
            E::ReservedColumn { table } => write!(
                f,
                "table {table}: column {COLLECTION_ID_COLUMN} is added by the host and cannot be declared"
            ),
            E::UnknownKind { table, column, kind } => write!(
                f,
                "table {table}: column {column} has unknown type {kind} (plugin built for a newer kernmlops?)"
            ),
            E::KindSize { table, column, kind, expected, size } => write!(
                f,
                "table {table}: column {column} of type {kind} must be {expected} bytes, not {size}"
            ),
            E::NoLabels { table, column } => {
                write!(f, "table {table}: column {column} is label-typed but declares no labels")
            }
            E::OutOfRecord { table, column, offset, end, record_size } => write!(
                f,
                "table {table}: column {column} (bytes {offset}..{end}) lies outside the {record_size}-byte record"
            ),
            E::Overlap { table, first, second } => {
                write!(f, "table {table}: columns {first} and {second} overlap")
            }
            E::MissingTimestamp(t) => write!(
                f,
                "table {t}: has no {TIMESTAMP_COLUMN} column (every time-series table needs one)"
            ),
            E::TimestampKind { table, kind } => {
                write!(f, "table {table}: {TIMESTAMP_COLUMN} must be u64, not {kind}")
            }
            E::DuplicateTable { table, owner } => {
                write!(f, "table {table} is already declared by plugin {owner}")
            }
            E::DataContract { found } => write!(
                f,
                "built for data contract {found}, this host speaks {DATA_CONTRACT_VERSION}"
            ),
        }
    }
}

impl std::error::Error for ValidationError {}

/// True for `lowercase_snake_case` starting with a letter (the one rule,
/// from `kernmlops_sys::names`).
pub use kernmlops_sys::names::is_snake_case;

/// Checks one table declaration of a plugin against every rule.
pub fn validate_table(t: &TableDecl) -> Result<(), ValidationError> {
    if RESERVED_TABLES.contains(&t.name.as_str()) {
        return Err(ValidationError::ReservedTable(t.name.to_string()));
    }
    validate_host_table(t)
}

/// Checks a table the host declares itself (one of [`RESERVED_TABLES`],
/// such as `energy`): every rule but the reserved names.
pub fn validate_host_table(t: &TableDecl) -> Result<(), ValidationError> {
    let table = t.name.to_string();
    if !is_snake_case(&table) {
        return Err(ValidationError::TableName(table));
    }
    if t.record_size == 0 || t.record_size > MAX_RECORD_SIZE {
        return Err(ValidationError::RecordSize {
            table,
            size: t.record_size,
        });
    }
    if t.columns.is_empty() {
        return Err(ValidationError::NoColumns(table));
    }

    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, c) in t.columns.iter().enumerate() {
        let column = c.name.to_string();
        if !is_snake_case(&column) {
            return Err(ValidationError::ColumnName { table, column });
        }
        if column == COLLECTION_ID_COLUMN {
            return Err(ValidationError::ReservedColumn { table });
        }
        if seen.insert(c.name.as_str(), i).is_some() {
            return Err(ValidationError::DuplicateColumn { table, column });
        }
        let Some(kind) = c.kind.name() else {
            return Err(ValidationError::UnknownKind {
                table,
                column,
                kind: c.kind.0,
            });
        };
        let size_ok = match c.kind {
            ColumnKind::STR => (1..=MAX_RECORD_SIZE).contains(&c.size),
            ColumnKind::LABEL => matches!(c.size, 1 | 2 | 4),
            k => k.fixed_size() == Some(c.size),
        };
        if !size_ok {
            let expected = match c.kind {
                ColumnKind::STR => "at least 1".to_owned(),
                ColumnKind::LABEL => "1, 2 or 4".to_owned(),
                k => k.fixed_size().unwrap_or(0).to_string(),
            };
            return Err(ValidationError::KindSize {
                table,
                column,
                kind,
                expected,
                size: c.size,
            });
        }
        if c.kind == ColumnKind::LABEL && c.labels.is_empty() {
            return Err(ValidationError::NoLabels { table, column });
        }
        let end = u64::from(c.offset) + u64::from(c.size);
        if end > u64::from(t.record_size) {
            return Err(ValidationError::OutOfRecord {
                table,
                column,
                offset: c.offset,
                end,
                record_size: t.record_size,
            });
        }
    }

    // Overlap: sort by offset and compare neighbours.
    let mut spans: Vec<_> = t
        .columns
        .iter()
        .map(|c| (c.offset, c.offset + c.size, c.name.as_str()))
        .collect();
    spans.sort_unstable();
    for pair in spans.windows(2) {
        let (_, end_a, a) = pair[0];
        let (start_b, _, b) = pair[1];
        if start_b < end_a {
            return Err(ValidationError::Overlap {
                table,
                first: a.to_owned(),
                second: b.to_owned(),
            });
        }
    }

    match t
        .columns
        .iter()
        .find(|c| c.name.as_str() == TIMESTAMP_COLUMN)
    {
        None => Err(ValidationError::MissingTimestamp(table)),
        Some(c) if c.kind != ColumnKind::U64 => Err(ValidationError::TimestampKind {
            table,
            kind: c.kind.name().unwrap_or("unknown").to_owned(),
        }),
        Some(_) => Ok(()),
    }
}

/// Checks a plugin's data contract version.
pub fn validate_contract(found: u32) -> Result<(), ValidationError> {
    if found == DATA_CONTRACT_VERSION {
        Ok(())
    } else {
        Err(ValidationError::DataContract { found })
    }
}

/// Checks every table of a probe, and that the probe does not declare a
/// table twice.
pub fn validate_probe(probe: &ProbeDecl) -> Result<(), ValidationError> {
    let mut seen = std::collections::HashSet::new();
    for t in probe.tables.iter() {
        validate_table(t)?;
        if !seen.insert(t.name.as_str()) {
            return Err(ValidationError::DuplicateTable {
                table: t.name.to_string(),
                owner: probe.name.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ColumnDecl;
    use abi_stable::std_types::RVec;

    fn col(name: &str, kind: ColumnKind, offset: u32, size: u32) -> ColumnDecl {
        let labels = if kind == ColumnKind::LABEL {
            vec!["a".into()].into()
        } else {
            RVec::new()
        };
        ColumnDecl {
            labels,
            ..ColumnDecl::new(name, kind, offset, size)
        }
    }

    /// A valid 24-byte table: ts (0..8), pid (8..12), cpu (12..16), name (16..24).
    fn good() -> TableDecl {
        TableDecl {
            name: "good_table".into(),
            description: "".into(),
            record_size: 24,
            columns: vec![
                col("ts_uptime_us", ColumnKind::U64, 0, 8),
                col("pid", ColumnKind::U32, 8, 4),
                col("cpu", ColumnKind::LABEL, 12, 4),
                col("name", ColumnKind::STR, 16, 8),
            ]
            .into(),
        }
    }

    #[test]
    fn accepts_a_valid_table() {
        assert_eq!(validate_table(&good()), Ok(()));
    }

    #[test]
    fn refuses_every_table_the_host_writes() {
        for name in RESERVED_TABLES {
            let mut t = good();
            t.name = (*name).into();
            assert_eq!(
                validate_table(&t),
                Err(ValidationError::ReservedTable((*name).to_owned())),
                "{name}"
            );
        }
    }

    /// Each case: what it breaks, how, and the error variant expected.
    #[test]
    fn rejects_each_bad_declaration() {
        type Mutate = fn(&mut TableDecl);
        type Expect = fn(&ValidationError) -> bool;
        let cases: Vec<(&str, Mutate, Expect)> = vec![
            (
                "upper-case table name",
                |t| t.name = "BadName".into(),
                |e| matches!(e, ValidationError::TableName(_)),
            ),
            (
                "table name with a dash",
                |t| t.name = "bad-name".into(),
                |e| matches!(e, ValidationError::TableName(_)),
            ),
            (
                "empty table name",
                |t| t.name = "".into(),
                |e| matches!(e, ValidationError::TableName(_)),
            ),
            (
                "reserved table name",
                |t| t.name = "system_info".into(),
                |e| matches!(e, ValidationError::ReservedTable(_)),
            ),
            (
                "zero record size",
                |t| t.record_size = 0,
                |e| matches!(e, ValidationError::RecordSize { .. }),
            ),
            (
                "huge record size",
                |t| t.record_size = MAX_RECORD_SIZE + 1,
                |e| matches!(e, ValidationError::RecordSize { .. }),
            ),
            (
                "no columns",
                |t| t.columns.clear(),
                |e| matches!(e, ValidationError::NoColumns(_)),
            ),
            (
                "column name with capitals",
                |t| t.columns[1].name = "Pid".into(),
                |e| matches!(e, ValidationError::ColumnName { .. }),
            ),
            (
                "duplicate column",
                |t| t.columns[2] = col("pid", ColumnKind::U32, 12, 4),
                |e| matches!(e, ValidationError::DuplicateColumn { .. }),
            ),
            (
                "declares collection_id",
                |t| t.columns[1].name = "collection_id".into(),
                |e| matches!(e, ValidationError::ReservedColumn { .. }),
            ),
            (
                "unknown column kind",
                |t| t.columns[1].kind = ColumnKind(999),
                |e| matches!(e, ValidationError::UnknownKind { kind: 999, .. }),
            ),
            (
                "u32 of 8 bytes",
                |t| t.columns[1].size = 8,
                |e| matches!(e, ValidationError::KindSize { .. }),
            ),
            (
                "label of 3 bytes",
                |t| t.columns[2].size = 3,
                |e| matches!(e, ValidationError::KindSize { .. }),
            ),
            (
                "empty str",
                |t| t.columns[3].size = 0,
                |e| matches!(e, ValidationError::KindSize { .. }),
            ),
            (
                "label without labels",
                |t| t.columns[2].labels.clear(),
                |e| matches!(e, ValidationError::NoLabels { .. }),
            ),
            (
                "column past the record",
                |t| t.columns[3].offset = 20,
                |e| matches!(e, ValidationError::OutOfRecord { .. }),
            ),
            (
                "offset overflowing u32",
                |t| t.columns[3].offset = u32::MAX,
                |e| matches!(e, ValidationError::OutOfRecord { .. }),
            ),
            (
                "overlapping columns",
                |t| t.columns[1].offset = 4,
                |e| matches!(e, ValidationError::Overlap { .. }),
            ),
            (
                "no timestamp",
                |t| t.columns[0].name = "ts".into(),
                |e| matches!(e, ValidationError::MissingTimestamp(_)),
            ),
            (
                "timestamp not u64",
                |t| t.columns[0].kind = ColumnKind::I64,
                |e| matches!(e, ValidationError::TimestampKind { .. }),
            ),
        ];
        for (what, mutate, expected) in cases {
            let mut t = good();
            mutate(&mut t);
            match validate_table(&t) {
                Err(e) if expected(&e) => {
                    assert!(
                        e.to_string().contains("table") || e.to_string().contains("name"),
                        "{what}: message {e} names nothing"
                    );
                }
                other => panic!("{what}: expected a matching rejection, got {other:?}"),
            }
        }
    }

    #[test]
    fn snake_case_rule() {
        for ok in ["a", "quanta_runtime", "dtlb_misses2"] {
            assert!(is_snake_case(ok), "{ok} should be accepted");
        }
        for bad in ["", "_a", "a_", "a__b", "2a", "aB", "a-b", "a b", "é"] {
            assert!(!is_snake_case(bad), "{bad:?} should be refused");
        }
    }

    #[test]
    fn data_contract_must_match() {
        assert!(validate_contract(DATA_CONTRACT_VERSION).is_ok());
        assert!(matches!(
            validate_contract(DATA_CONTRACT_VERSION + 1),
            Err(ValidationError::DataContract { .. })
        ));
    }
}
