//! Rendering a collection's graphs: every graph a loaded plugin offers whose
//! tables all exist in the collection renders into `<collection>/graphs/`.

use std::path::{Path, PathBuf};

use abi_stable::std_types::RResult;

use crate::{
    collect::{start_args, RunOptions},
    plugin::Registry,
};

/// One graph's outcome: the files it wrote, or why it failed.
#[derive(Debug)]
pub struct Rendered {
    pub graph: String,
    pub plugin: String,
    pub outcome: Result<Vec<PathBuf>, String>,
}

/// Renders every applicable graph of the registry for `collection`.
pub fn render_collection(registry: &Registry, collection: &Path) -> Result<Vec<Rendered>, String> {
    if !collection.join("manifest.json").is_file() {
        return Err(format!(
            "{} is not a collection folder (no manifest.json)",
            collection.display()
        ));
    }
    let out_dir = collection.join("graphs");
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| format!("creating {}: {e}", out_dir.display()))?;
    let (Some(dir_text), Some(out_text)) = (collection.to_str(), out_dir.to_str()) else {
        return Err(format!("{} is not a UTF-8 path", collection.display()));
    };
    let mut out = Vec::new();
    for plugin in &registry.plugins {
        for g in &plugin.graphs {
            let applies = g
                .tables
                .iter()
                .all(|t| collection.join(format!("{t}.arrow")).is_file());
            if !applies {
                continue;
            }
            let name = g.name.to_string();
            let args = start_args(&name, &RunOptions::default(), &Default::default());
            let outcome = plugin.start_graph(&name, &args).and_then(|mut graph| {
                match graph.render(dir_text.into(), out_text.into()) {
                    RResult::ROk(files) => Ok(files
                        .into_iter()
                        .map(|f| PathBuf::from(f.as_str()))
                        .collect()),
                    RResult::RErr(e) => Err(e.to_string()),
                }
            });
            out.push(Rendered {
                graph: name,
                plugin: plugin.name().to_owned(),
                outcome,
            });
        }
    }
    Ok(out)
}
