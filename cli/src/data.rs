//! The commands on collected data: `repair`, `export`, `dump` and `graph`.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::{bail, Context as _, Result};
use kernmlops::{
    collect::{self, FileRepair},
    sink::RepairOutcome,
    trust,
};

use crate::{args::ExportLayout, context::Context};

/// `kernmlops repair`.
pub(crate) fn repair(dir: &Path) -> Result<ExitCode> {
    let report = collect::repair_collection(dir)?;
    for (file, outcome) in &report.files {
        let file = file.display();
        match outcome {
            FileRepair::Done(RepairOutcome::Intact { rows }) => {
                kernmlops::outln!("intact    {file} ({rows} rows)")
            }
            FileRepair::Done(RepairOutcome::Repaired { rows, batches }) => {
                kernmlops::outln!("repaired  {file} ({rows} rows in {batches} batches kept)")
            }
            FileRepair::Rebuilt => {
                kernmlops::outln!("rebuilt   {file} (from the manifest and this machine)")
            }
            FileRepair::Removed(why) => {
                kernmlops::outln!("removed   {file} ({why}: nothing to keep)")
            }
            FileRepair::Failed(why) => {
                kernmlops::outln!("failed    {file}: {}", trust::printable(why.as_bytes()))
            }
        }
    }
    if let Some(e) = &report.manifest_error {
        bail!("the files were repaired but the manifest was not updated: {e}");
    }
    match report.failures() {
        0 => Ok(ExitCode::SUCCESS),
        n => bail!(
            "{n} file(s) of {} could not be repaired (see above); the others were",
            dir.display()
        ),
    }
}

/// `kernmlops export`.
pub(crate) fn export(
    ctx: &Context,
    data: Option<PathBuf>,
    to: Option<PathBuf>,
    selectors: &[String],
    layout: ExportLayout,
    format: kernmlops::export::ExportFormat,
) -> Result<ExitCode> {
    let layout = match layout {
        ExportLayout::Classes => kernmlops::export::Layout::Classes,
        ExportLayout::Hive => kernmlops::export::Layout::Hive,
    };
    let data = data.unwrap_or_else(|| PathBuf::from(&ctx.cfg.collect.output));
    let to = to.unwrap_or_else(|| data.clone());
    let dirs = kernmlops::export::find_collections(&data, selectors).map_err(anyhow::Error::msg)?;
    let (mut files, mut rows) = (0, 0);
    for dir in dirs {
        match kernmlops::export::export_collection_in(&dir, &to, layout, format)
            .map_err(anyhow::Error::msg)?
        {
            kernmlops::export::Outcome::Exported {
                collection_id,
                class,
                files: written,
            } => {
                kernmlops::outln!("{collection_id} ({class})");
                for w in written {
                    kernmlops::outln!("  {:>10} rows  {}", w.rows, w.path.display());
                    files += 1;
                    rows += w.rows;
                }
            }
            kernmlops::export::Outcome::Skipped {
                collection_id,
                reason,
            } => eprintln!("warning: {collection_id} not exported: {reason}"),
        }
    }
    kernmlops::outln!("{files} files, {rows} rows under {}", to.display());
    Ok(ExitCode::SUCCESS)
}

/// A collection folder from a path, an id or an id prefix under the data
/// folder; the newest one when none is given.
fn resolve_collection(
    ctx: &Context,
    data: Option<PathBuf>,
    collection: Option<String>,
) -> Result<PathBuf> {
    let data = data.unwrap_or_else(|| PathBuf::from(&ctx.cfg.collect.output));
    Ok(match collection {
        None => kernmlops::dump::newest_collection(&data).map_err(anyhow::Error::msg)?,
        Some(c) if Path::new(&c).join("manifest.json").is_file() => PathBuf::from(c),
        Some(c) => {
            let found = kernmlops::export::find_collections(&data, std::slice::from_ref(&c))
                .map_err(anyhow::Error::msg)?;
            if found.len() > 1 {
                bail!(
                    "{c:?} matches {} collections; give more of the id",
                    found.len()
                );
            }
            found.into_iter().next().context("no collection")?
        }
    })
}

/// `kernmlops graph`.
pub(crate) fn graph(
    ctx: &Context,
    data: Option<PathBuf>,
    collection: Option<String>,
    trace_field: Option<String>,
) -> Result<ExitCode> {
    let dir = resolve_collection(ctx, data, collection)?;
    let mut settings = std::collections::BTreeMap::new();
    if let Some(f) = trace_field {
        settings.insert("trace".to_owned(), serde_json::json!({ "field": f }));
    }
    render_graphs_with(ctx, &dir, &settings)
}

/// Renders the graphs of the collection in `dir`.
pub(crate) fn render_graphs(ctx: &Context, dir: &Path) -> Result<ExitCode> {
    render_graphs_with(ctx, dir, &Default::default())
}

/// Renders the graphs of the collection in `dir`, with settings by graph
/// name.
fn render_graphs_with(
    ctx: &Context,
    dir: &Path,
    settings: &std::collections::BTreeMap<String, serde_json::Value>,
) -> Result<ExitCode> {
    let registry = ctx.registry()?;
    let rendered = kernmlops::graph::render_collection_with(&registry, dir, settings)
        .map_err(anyhow::Error::msg)?;
    if rendered.is_empty() {
        kernmlops::outln!(
            "no graph applies to {} (see `kernmlops plugins` for graphs and their tables)",
            dir.display()
        );
    }
    let mut ok = true;
    for r in rendered {
        match r.outcome {
            Ok(files) if files.is_empty() => {
                kernmlops::outln!("graph {}: nothing to draw", r.graph)
            }
            Ok(files) => {
                for f in files {
                    kernmlops::outln!("graph {}: {}", r.graph, f.display());
                }
            }
            Err(e) => {
                ok = false;
                eprintln!("error: graph {} (plugin {}): {e}", r.graph, r.plugin);
            }
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `kernmlops dump`.
pub(crate) fn dump(
    ctx: &Context,
    data: Option<PathBuf>,
    collection: Option<String>,
) -> Result<ExitCode> {
    let dir = resolve_collection(ctx, data, collection)?;
    kernmlops::outln!("collection {}", dir.display());
    let tables = kernmlops::dump::summarize_collection(&dir).map_err(anyhow::Error::msg)?;
    for t in &tables {
        kernmlops::out!("{}", kernmlops::dump::render(t));
    }
    Ok(ExitCode::SUCCESS)
}
