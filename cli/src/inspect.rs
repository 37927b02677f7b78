//! The commands that inspect without collecting: `plugins`, `check`,
//! `config`, `perf-list`, `power-list` and `trace-list`.

use std::{path::Path, process::ExitCode};

use anyhow::{Context as _, Result};
use kernmlops::{
    collect,
    config::{self, Config},
    preflight,
};

use crate::{args::ConfigCommand, context::Context};

/// `kernmlops plugins`.
pub(crate) fn plugins(ctx: &Context) -> Result<ExitCode> {
    let reg = ctx.registry()?;
    kernmlops::outln!("plugins in {}:", reg.dir.display());
    if reg.plugins.is_empty() {
        kernmlops::outln!("  none (build them with `cargo xtask build-plugins`)");
    }
    for p in &reg.plugins {
        kernmlops::outln!("  {} {}  {}", p.name(), p.info.version, p.path.display());
        if !p.info.description.is_empty() {
            kernmlops::outln!("    {}", p.info.description);
        }
        for b in &p.benchmarks {
            kernmlops::outln!("    benchmark {}: {}", b.name, b.description);
        }
        for g in &p.graphs {
            let tables: Vec<&str> = g.tables.iter().map(|t| t.as_str()).collect();
            kernmlops::outln!(
                "    graph {}: {} (needs: {})",
                g.name,
                g.description,
                tables.join(", ")
            );
        }
        for ps in p.power_sources().unwrap_or_default() {
            kernmlops::outln!(
                "    power source {}: {} (`kernmlops power-list` shows its zones)",
                ps.name,
                ps.description
            );
        }
        for probe in &p.probes {
            kernmlops::outln!("    probe {}: {}", probe.name, probe.description);
            for t in probe.tables.iter() {
                kernmlops::outln!(
                    "      table {} ({}-byte records): {}",
                    t.name,
                    t.record_size,
                    t.description
                );
                let w = t.columns.iter().map(|c| c.name.len()).max().unwrap_or(0);
                for c in t.columns.iter() {
                    let kind = match c.kind.name() {
                        Some("str") => format!("str[{}]", c.size),
                        Some(k) => k.to_owned(),
                        None => format!("kind {}", c.kind.0),
                    };
                    kernmlops::outln!(
                        "        {:<w$}  {:<8} {:<6} {}",
                        c.name.as_str(),
                        kind,
                        c.unit.as_str(),
                        c.description
                    );
                }
            }
        }
    }
    if !reg.failures.is_empty() {
        kernmlops::outln!("refused:");
        for (path, e) in &reg.failures {
            kernmlops::outln!("  {}: {e}", path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `kernmlops check`.
pub(crate) fn check(ctx: &Context, probes: Vec<String>) -> Result<ExitCode> {
    let cfg = &ctx.cfg;
    let reg = ctx.registry()?;
    let probes = if probes.is_empty() {
        reg.probe_names()
    } else {
        probes
    };
    let settings = Config::settings_json(&cfg.probe_settings(reg.config_defaults())?);
    reg.resolve(&probes).map_err(anyhow::Error::msg)?;
    preflight::require_bpf_privileges("check").map_err(anyhow::Error::msg)?;
    preflight::require_btf().map_err(anyhow::Error::msg)?;
    if let Err(e) = preflight::ensure_tracefs() {
        eprintln!("warning: {e}");
    }
    let ring = cfg.collect.ring_size.bytes();
    let mut ok = reg.failures.is_empty();
    for (path, e) in &reg.failures {
        kernmlops::outln!("FAIL {}: {e}", path.display());
    }
    let limit = cfg.collect.plugin_timeout.get();
    for r in collect::check_within(&reg, &probes, ring, &settings, limit)? {
        match r.outcome {
            Ok(ms) => kernmlops::outln!(
                "ok   {} ({}): attached in {ms:.0} ms, detached",
                r.probe,
                r.plugin
            ),
            Err(e) => {
                ok = false;
                kernmlops::outln!(
                    "FAIL {} ({}): {}",
                    r.probe,
                    r.plugin,
                    e.replace('\n', "\n     ")
                );
            }
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Name and defaults TOML pairs, borrowed.
fn borrowed(v: &[(String, String)]) -> Vec<(&str, &str)> {
    v.iter().map(|(n, t)| (n.as_str(), t.as_str())).collect()
}

/// `kernmlops config`.
pub(crate) fn config(ctx: &Context, what: ConfigCommand) -> Result<ExitCode> {
    let cfg = &ctx.cfg;
    // Component settings come from the plugins; without a plugin folder
    // only the host's keys can be shown.
    let registry = ctx.registry().ok();
    let owned = |pairs: Vec<(&str, &str)>| -> Vec<(String, String)> {
        pairs
            .into_iter()
            .map(|(n, t)| (n.to_owned(), t.to_owned()))
            .collect()
    };
    let probes = owned(registry.iter().flat_map(|r| r.config_defaults()).collect());
    let benchmarks = owned(
        registry
            .iter()
            .flat_map(|r| r.benchmark_defaults())
            .collect(),
    );
    match what {
        ConfigCommand::Defaults => {
            kernmlops::out!("{}", config::defaults_file());
            match &registry {
                None => kernmlops::outln!(
                    "\n# (no plugin folder found: probe and benchmark settings are not listed)"
                ),
                Some(r) => {
                    let power = kernmlops::power::registry::PowerSources::of(r).defaults();
                    let sections = [
                        ("probes", &probes),
                        ("benchmarks", &benchmarks),
                        ("power.settings", &power),
                    ];
                    for (section, list) in sections {
                        for (name, text) in list {
                            if !text.trim().is_empty() {
                                kernmlops::outln!(
                                    "\n[{section}.{name}]  # plugin folder {}\n{}",
                                    r.dir.display(),
                                    text.trim_end()
                                );
                            }
                        }
                    }
                }
            }
        }
        ConfigCommand::Show => {
            let probe_settings = cfg.probe_settings(borrowed(&probes))?;
            let bench_settings = cfg.benchmark_settings(borrowed(&benchmarks))?;
            if let Some(r) = &registry {
                ctx.check_component_rules(r, &[], &[])?;
            }
            let mut doc = toml::Table::new();
            doc.insert(
                "collect".into(),
                toml::Value::try_from(&cfg.collect).context("showing [collect]")?,
            );
            doc.insert(
                "power".into(),
                toml::Value::try_from(&cfg.power).context("showing [power]")?,
            );
            for (section, settings) in [("probes", probe_settings), ("benchmarks", bench_settings)]
            {
                let tables: toml::Table = settings
                    .into_iter()
                    .filter(|(_, t)| !t.is_empty())
                    .map(|(n, t)| (n, toml::Value::Table(t)))
                    .collect();
                doc.insert(section.into(), toml::Value::Table(tables));
            }
            kernmlops::outln!(
                "# merged from: built-in defaults{}",
                if cfg.source == "built-in defaults" {
                    String::new()
                } else {
                    format!(", {}", cfg.source)
                }
            );
            kernmlops::out!(
                "{}",
                toml::to_string_pretty(&doc).context("showing the configuration")?
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `kernmlops power-list`.
pub(crate) fn power_list(ctx: &Context, json: bool) -> Result<ExitCode> {
    let cfg = &ctx.cfg;
    let reg = ctx.registry()?;
    let declared = kernmlops::power::registry::PowerSources::of(&reg).defaults();
    let settings = cfg.power_settings(declared.iter().map(|(n, t)| (n.as_str(), t.as_str())))?;
    let listing = kernmlops::power::list::list(&reg, &Config::settings_json(&settings));
    if json {
        kernmlops::outln!("{}", serde_json::to_string_pretty(&listing)?);
    } else {
        kernmlops::out!("{}", kernmlops::power::list::render(&listing));
    }
    Ok(ExitCode::SUCCESS)
}

/// `kernmlops perf-list`.
pub(crate) fn perf_list(json: bool, resolve: Option<&str>) -> Result<ExitCode> {
    let root = Path::new(kernmlops::perf_list::PMU_ROOT);
    if let Some(name) = resolve {
        let r = kernmlops::perf_list::resolve(root, name).map_err(anyhow::Error::msg)?;
        if json {
            kernmlops::outln!("{}", serde_json::to_string_pretty(&r)?);
        } else {
            kernmlops::out!("{}", kernmlops::perf_list::render_resolution(&r));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let listing = kernmlops::perf_list::list(root);
    if json {
        kernmlops::outln!("{}", serde_json::to_string_pretty(&listing)?);
    } else {
        kernmlops::out!("{}", kernmlops::perf_list::render(&listing));
    }
    Ok(ExitCode::SUCCESS)
}

/// `kernmlops trace-list`.
pub(crate) fn trace_list(pattern: Option<&str>, json: bool) -> Result<ExitCode> {
    let listing = kernmlops::trace_list::list(pattern)?;
    if json {
        kernmlops::outln!("{}", serde_json::to_string_pretty(&listing)?);
    } else {
        kernmlops::out!("{}", kernmlops::trace_list::render(&listing));
    }
    Ok(ExitCode::SUCCESS)
}
