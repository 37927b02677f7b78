//! `kernmlops repair`: make the table files of a crashed collection
//! readable again and bring its manifest's row counts up to date.

use std::path::{Path, PathBuf};

use crate::{
    manifest::{Manifest, Status, TableEntry},
    sink,
};

/// Repairs every table file of a collection after a crash and marks the
/// manifest, returning (file, outcome) pairs.
pub fn repair_collection(dir: &Path) -> Result<Vec<(PathBuf, sink::RepairOutcome)>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "arrow"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("{}: no .arrow files here", dir.display()));
    }
    let mut out = Vec::new();
    for f in files {
        let outcome = sink::repair(&f).map_err(|e| e.to_string())?;
        out.push((f, outcome));
    }
    if let Ok(mut man) = Manifest::read(dir) {
        for (f, outcome) in &out {
            let table = f
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let rows = match outcome {
                sink::RepairOutcome::Intact { rows }
                | sink::RepairOutcome::Repaired { rows, .. } => *rows,
            };
            man.tables
                .entry(table.clone())
                .or_insert_with(|| TableEntry {
                    probe: String::new(),
                    file: format!("{table}.arrow"),
                    rows,
                    lost_events: 0,
                })
                .rows = rows;
        }
        if man.status == Status::Running {
            man.status = Status::Repaired;
        }
        man.write(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    Ok(out)
}
