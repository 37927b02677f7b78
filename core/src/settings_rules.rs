//! A component's own settings rules (`PluginMod::check_config`: ranges,
//! non-empty lists), run while the configuration is checked, before any
//! set-up or collection.

use crate::{
    config::{Config, ConfigError},
    plugin::{Plugin, Registry},
};

/// Runs the rules of every configured probe and benchmark, and of the
/// `probes` and `benchmarks` a run uses, on their settings (each plugin's
/// `check_config`), as `kernmlops run` and `config show` do before anything
/// is set up.
pub fn check_all(
    cfg: &Config,
    registry: &Registry,
    probes: &[String],
    benchmarks: &[String],
) -> Result<(), ConfigError> {
    cfg.check_rules(
        "probes",
        registry.config_defaults(),
        probes,
        |name, json| match registry.find_probe(name) {
            Some((plugin, _)) => check(plugin, name, json),
            None => Ok(()),
        },
    )?;
    cfg.check_rules(
        "benchmarks",
        registry.benchmark_defaults(),
        benchmarks,
        |name, json| match registry.find_benchmark(name) {
            Ok((plugin, _)) => check(plugin, name, json),
            Err(_) => Ok(()),
        },
    )
}

/// Runs `component`'s own rules on `config_json` (the object it would get).
/// `Ok` for plugins built before components could be checked.
pub fn check(plugin: &Plugin, component: &str, config_json: &str) -> Result<(), String> {
    plugin
        .check_config(component, config_json)
        .map_err(|e| e.message.to_string())
}
