//! Graphs of an experiment's results: the graph plugin's
//! `experiment_results` graph, given the experiment's `results.arrow` (as
//! table `results`, read by the host) and its record, draws into
//! `graphs/`.

use std::path::PathBuf;

use kernmlops_plugin_api::GraphInput;

use super::{record::ExpDir, ExperimentError, Result};
use kernmlops::{collection, graph, plugin::Registry};

/// The graph that draws results.
pub const GRAPH: &str = "experiment_results";

/// Renders the results graphs with a plugin of `registry`; the files
/// written. An error when no loaded plugin offers the graph.
pub fn render(registry: &Registry, dir: &ExpDir) -> Result<Vec<PathBuf>> {
    let Some(plugin) = registry
        .plugins
        .iter()
        .find(|p| p.graphs.iter().any(|g| g.name.as_str() == GRAPH))
    else {
        let refused = if registry.failures.is_empty() {
            String::new()
        } else {
            format!(
                "; {} plugin(s) there were refused, see `kernmlops plugins`",
                registry.failures.len()
            )
        };
        return Err(ExperimentError::Plugins(format!(
            "no plugin in {} offers the {GRAPH} graph (build the graphs plugin with `cargo xtask build-plugins`){refused}",
            registry.dir.display()
        )));
    };
    let out = dir.graphs();
    std::fs::create_dir_all(&out).map_err(ExperimentError::io(&out))?;
    let Some(root) = dir.root.to_str() else {
        return Err(ExperimentError::Usage(format!(
            "{} is not a UTF-8 path",
            dir.root.display()
        )));
    };
    let results = dir.root.join("results.arrow");
    let mut table = collection::read_table(&results)
        .and_then(|t| graph::graph_table(&t))
        .map_err(|e| ExperimentError::Plugins(format!("graph {GRAPH}: {e}")))?;
    table.name = "results".into();
    let record = std::fs::read_to_string(dir.root.join("experiment.json")).unwrap_or_default();
    let input = GraphInput {
        dir: root.into(),
        manifest_json: record.into(),
        tables: vec![table].into(),
    };
    graph::render_one(plugin, GRAPH, &input, &out).map_err(|e| {
        ExperimentError::Plugins(format!("graph {GRAPH} (plugin {}): {e}", plugin.name()))
    })
}
