//! Graphs of an experiment's results: the graph plugin's
//! `experiment_results` graph, given the experiment folder as its
//! collection folder, reads `results.arrow` and draws into `graphs/`.

use std::path::PathBuf;

use abi_stable::std_types::RResult;

use super::{record::ExpDir, ExperimentError, Result};
use crate::{
    collect::{start_args, RunOptions},
    plugin::Registry,
};

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
    let (Some(root), Some(out_text)) = (dir.root.to_str(), out.to_str()) else {
        return Err(ExperimentError::Usage(format!(
            "{} is not a UTF-8 path",
            dir.root.display()
        )));
    };
    let args = start_args(GRAPH, &RunOptions::default(), &Default::default());
    let mut graph = plugin
        .start_graph(GRAPH, &args)
        .map_err(ExperimentError::Plugins)?;
    match graph.render(root.into(), out_text.into()) {
        RResult::ROk(files) => Ok(files
            .into_iter()
            .map(|f| PathBuf::from(f.as_str()))
            .collect()),
        RResult::RErr(e) => Err(ExperimentError::Plugins(format!(
            "graph {GRAPH} (plugin {}): {e}",
            plugin.name()
        ))),
    }
}
