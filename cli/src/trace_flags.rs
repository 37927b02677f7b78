//! `kernmlops run --trace EVENT` and `--trace-preset NAME`: the `trace`
//! probe's events and presets from the command line, appended to
//! `[probes.trace]` as if a configuration file held them, and checked
//! with the probe's own rules before anything is created.

use anyhow::{bail, Result};
use kernmlops::{config::Config, plugin::Registry};

use crate::args::RunArgs;

/// The probe the flags configure.
pub(crate) const TRACE_PROBE: &str = "trace";

/// Whether the run names events or presets on the command line.
pub(crate) fn given(args: &RunArgs) -> bool {
    !args.trace.is_empty() || !args.trace_preset.is_empty()
}

/// The configuration with the flags' events appended to `[probes.trace]
/// events` and their presets to `presets` (a value already there is not
/// repeated), so the run and its manifest see them as a file's.
pub(crate) fn apply(cfg: &Config, args: &RunArgs) -> Config {
    let mut cfg = cfg.clone();
    if given(args) {
        let section = cfg.probes.entry(TRACE_PROBE.to_owned()).or_default();
        append(section, "events", &args.trace);
        append(section, "presets", &args.trace_preset);
    }
    cfg
}

fn append(section: &mut toml::Table, key: &str, values: &[String]) {
    if values.is_empty() {
        return;
    }
    let list = section
        .entry(key)
        .or_insert_with(|| toml::Value::Array(Vec::new()));
    // A value of another type is left for the settings check to refuse.
    if let toml::Value::Array(list) = list {
        for v in values {
            let v = toml::Value::String(v.clone());
            if !list.contains(&v) {
                list.push(v);
            }
        }
    }
}

/// Runs the `trace` probe's rules (the planning its start does: the
/// tracepoint, each field, the kind's attach path on this kernel) on the
/// flags' events alone, then on their presets alone, over the
/// configuration's other trace settings, then on everything together, so
/// a refusal is one line naming the flag and the event.
pub(crate) fn check(cfg: &Config, registry: &Registry, args: &RunArgs) -> Result<()> {
    if !given(args) {
        return Ok(());
    }
    let Some((plugin, _)) = registry.find_probe(TRACE_PROBE) else {
        bail!(
            "--trace and --trace-preset need the trace probe, which no plugin in the plugin folder offers (build it with `cargo xtask build-plugins`)"
        );
    };
    // The trace probe's rules on these settings: the message without its
    // section.
    let rules = |settings: &toml::Table| -> Result<()> {
        let json = serde_json::to_value(settings)?.to_string();
        plugin.check_config(TRACE_PROBE, &json).map_err(|e| {
            let message = e.message.as_str();
            anyhow::anyhow!(
                "{}",
                message.strip_prefix("[probes.trace]: ").unwrap_or(message)
            )
        })
    };
    let merged = cfg.probe_settings(registry.config_defaults())?;
    let base = merged.get(TRACE_PROBE).cloned().unwrap_or_default();
    let strings = |v: &[String]| {
        toml::Value::Array(v.iter().map(|s| toml::Value::String(s.clone())).collect())
    };
    let flags: [(&str, &[String], &[String]); 2] = [
        ("--trace", &args.trace, &[]),
        ("--trace-preset", &[], &args.trace_preset),
    ];
    for (flag, events, presets) in flags {
        if events.is_empty() && presets.is_empty() {
            continue;
        }
        let mut settings = base.clone();
        settings.insert("events".into(), strings(events));
        settings.insert("presets".into(), strings(presets));
        settings.insert("event".into(), toml::Value::Array(Vec::new()));
        if let Err(message) = rules(&settings) {
            bail!("{flag}: {message}");
        }
    }
    // Then together with the configuration's own events (two with one
    // table name): the configuration's own mistakes are left for the
    // settings check, which names its file.
    let applied = apply(cfg, args).probe_settings(registry.config_defaults())?;
    let together = applied.get(TRACE_PROBE).cloned().unwrap_or_default();
    if let Err(message) = rules(&together) {
        if rules(&base).is_ok() {
            bail!(
                "--trace/--trace-preset with [probes.trace] of {}: {message}",
                cfg.source
            );
        }
    }
    Ok(())
}
