//! `kernmlops run`: the run's flags resolved against the configuration in
//! one place, its components' settings checked, one collection, and its
//! summary.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{atomic::AtomicBool, Arc},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};
use kernmlops::{
    collect::{self, Filter, RunOptions, Summary},
    config::{self, Config},
    plugin::Registry,
    power::PowerOptions,
    preflight,
    sink::FlushPolicy,
    trust,
};

use crate::{
    args::RunArgs,
    context::{report_refused, Context},
    trace_flags,
};

/// `kernmlops run`.
pub(crate) fn run(ctx: &Context, args: RunArgs) -> Result<ExitCode> {
    let flags = Flags::resolve(&ctx.cfg, &args)?;
    let registry = ctx.run_registry(
        &flags.probes,
        args.benchmark.is_some(),
        args.power.as_deref(),
    )?;
    trace_flags::check(&ctx.cfg, &registry, &args)?;
    let cfg = trace_flags::apply(&ctx.cfg, &args);
    let settings = Settings::check(&cfg, &registry, &flags.probes, &args)?;
    report_refused(&registry);
    preflight::require_bpf_privileges("run").map_err(anyhow::Error::msg)?;
    preflight::require_btf().map_err(anyhow::Error::msg)?;
    if let Err(e) = preflight::ensure_tracefs() {
        eprintln!("warning: {e}");
    }
    let stop = install_signals()?;
    let opts = run_options(&cfg, &args, flags, settings)?;
    let summary = collect::run(&registry, &opts, stop)?;
    print_summary(&summary);
    if args.graphs {
        crate::data::render_graphs(ctx, &summary.dir)?;
    }
    if summary.errors.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "error: {} error(s) during the run (see above); the data was still written",
            summary.errors.len()
        );
        Ok(ExitCode::FAILURE)
    }
}

/// The run's low-level flags over `[collect]`, each as given (what the
/// manifest records) and parsed, checked before any plugin is loaded.
struct Flags {
    duration_text: String,
    duration: Duration,
    ring_text: String,
    ring_bytes: u64,
    flush_text: String,
    flush_interval: Duration,
    drain_interval: Duration,
    plugin_timeout: Duration,
    /// The probes to run: none for a baseline, else the flag's or
    /// `collect.plugins`.
    probes: Vec<String>,
}

impl Flags {
    fn resolve(cfg: &Config, args: &RunArgs) -> Result<Self> {
        let c = &cfg.collect;
        let duration_text = args.duration.clone().unwrap_or_else(|| c.duration.clone());
        let duration = config::parse_duration(&duration_text)
            .map_err(anyhow::Error::msg)
            .context("--duration")?;
        let ring_text = args
            .ring_size
            .clone()
            .unwrap_or_else(|| c.ring_size.clone());
        let ring_bytes = config::ring_bytes(&ring_text)
            .map_err(anyhow::Error::msg)
            .context("--ring-size")?;
        let flush_text = args
            .flush_interval
            .clone()
            .unwrap_or_else(|| c.flush_interval.clone());
        let flush_interval = config::interval(&flush_text, config::MIN_FLUSH_INTERVAL)
            .map_err(anyhow::Error::msg)
            .context("--flush-interval")?;
        let drain_interval = config::interval(&c.drain_interval, config::MIN_DRAIN_INTERVAL)
            .map_err(anyhow::Error::msg)
            .context("collect.drain_interval")?;
        let plugin_timeout = config::plugin_timeout(&c.plugin_timeout)
            .map_err(anyhow::Error::msg)
            .context("collect.plugin_timeout")?;
        for (what, path) in [
            ("--output", args.output.as_deref()),
            ("--collection-dir", args.collection_dir.as_deref()),
            ("collect.output", Some(Path::new(&c.output))),
        ] {
            check_printable_path(what, path)?;
        }
        if let Some(tgid) = args.tgid {
            preflight::check_task("--tgid", tgid, false)?;
        }
        if let Some(pid) = args.pid {
            preflight::check_task("--pid", pid, true)?;
        }
        let mut probes = if args.baseline {
            Vec::new()
        } else if args.plugins.is_empty() {
            c.plugins.clone()
        } else {
            args.plugins.clone()
        };
        if trace_flags::given(args) && !probes.iter().any(|p| p == trace_flags::TRACE_PROBE) {
            probes.push(trace_flags::TRACE_PROBE.to_owned());
        }
        Ok(Self {
            duration_text,
            duration,
            ring_text,
            ring_bytes,
            flush_text,
            flush_interval,
            drain_interval,
            plugin_timeout,
            probes,
        })
    }
}

/// The settings of the run's components, checked against what the
/// plugins declare and against their own rules.
struct Settings {
    probes: BTreeMap<String, serde_json::Value>,
    benchmarks: BTreeMap<String, serde_json::Value>,
    power: PowerOptions,
    /// The power sources' settings, as the manifest records them.
    power_settings: serde_json::Value,
}

impl Settings {
    fn check(cfg: &Config, registry: &Registry, probes: &[String], args: &RunArgs) -> Result<Self> {
        registry.resolve(probes).map_err(anyhow::Error::msg)?;
        let settings = cfg.probe_settings(registry.config_defaults())?;
        let bench_settings = cfg.benchmark_settings(registry.benchmark_defaults())?;
        if let Some(b) = &args.benchmark {
            registry.find_benchmark(b).map_err(anyhow::Error::msg)?;
        }
        cfg.check_component_rules(registry, probes, args.benchmark.as_slice())?;
        let (power, power_settings) = power_options(cfg, registry, args)?;
        Ok(Self {
            probes: Config::settings_json(&settings),
            benchmarks: Config::settings_json(&bench_settings),
            power,
            power_settings,
        })
    }
}

/// SIGINT and SIGTERM stop the run; a second one while stopping exits at
/// once.
fn install_signals() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // A second signal while stopping exits at once; the files on disk
        // are then repairable with `kernmlops repair`.
        signal_hook::flag::register_conditional_shutdown(sig, 130, stop.clone())
            .context("installing signal handlers")?;
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    Ok(stop)
}

/// The configuration the manifest records: the merged configuration with
/// the flags that overrode it and every component's checked settings.
fn recorded_config(
    cfg: &Config,
    args: &RunArgs,
    flags: &Flags,
    settings: &Settings,
) -> Result<serde_json::Value> {
    let mut config_value = serde_json::to_value(cfg).context("recording the configuration")?;
    config_value["collect"]["plugins"] = serde_json::json!(flags.probes);
    config_value["collect"]["duration"] = serde_json::json!(flags.duration_text);
    config_value["collect"]["ring_size"] = serde_json::json!(flags.ring_text);
    config_value["collect"]["flush_interval"] = serde_json::json!(flags.flush_text);
    config_value["probes"] = serde_json::json!(settings.probes);
    config_value["benchmarks"] = serde_json::json!(settings.benchmarks);
    config_value["config_file"] = serde_json::json!(cfg.source);
    config_value["power"]["settings"] = serde_json::json!(settings.power_settings);
    config_value["filter"] = serde_json::json!({
        "tgid": args.tgid,
        "pid": args.pid,
        "cgroup": args.cgroup.as_ref().map(|p| p.display().to_string()),
        "cgroup_descendants": args.cgroup.is_some() && !args.cgroup_exact,
    });
    Ok(config_value)
}

/// The one value the collection runs from.
fn run_options(
    cfg: &Config,
    args: &RunArgs,
    flags: Flags,
    settings: Settings,
) -> Result<RunOptions> {
    let c = &cfg.collect;
    let config = recorded_config(cfg, args, &flags, &settings)?;
    Ok(RunOptions {
        probes: flags.probes,
        output: args
            .output
            .clone()
            .unwrap_or_else(|| PathBuf::from(&c.output)),
        collection_dir: args.collection_dir.clone(),
        duration: (!flags.duration.is_zero()).then_some(flags.duration),
        ring_bytes: flags.ring_bytes,
        drain_interval: flags.drain_interval,
        flush: FlushPolicy {
            interval: flags.flush_interval,
            rows: c.flush_rows,
        },
        strict: args.strict || c.strict,
        filter: Filter {
            tgid: args.tgid.unwrap_or(0),
            pid: args.pid.unwrap_or(0),
            cgroup_id: match &args.cgroup {
                Some(path) => kernmlops_sys::cgroup::cgroup_id(path)
                    .map_err(|e| anyhow::anyhow!("--cgroup {e}"))?,
                None => 0,
            },
            cgroup_descendants: !args.cgroup_exact,
        },
        include_self: args.include_self,
        probe_config: settings.probes,
        benchmark: args.benchmark.clone(),
        // The host sets the THP mode (a knob); the benchmark leaves it be.
        benchmark_config: config::strip_host_settings(settings.benchmarks),
        config,
        command: std::env::args().collect(),
        state_dir: None,
        power: settings.power,
        plugin_timeout: flags.plugin_timeout,
        knobs: cfg.knobs_for(args.benchmark.as_deref())?,
    })
}

/// Where the collection went, each table's rows and lost events, and the
/// benchmark's, overhead's and power's summaries.
fn print_summary(summary: &Summary) {
    kernmlops::outln!(
        "collection {} in {}",
        summary.collection_id,
        summary.dir.display()
    );
    kernmlops::outln!("  run class: {}", summary.run_class);
    let width = summary
        .tables
        .keys()
        .map(String::len)
        .max()
        .unwrap_or(5)
        .max(5);
    kernmlops::outln!("  {:<width$} {:>12} {:>10}  file", "table", "rows", "lost");
    for (name, t) in &summary.tables {
        kernmlops::outln!(
            "  {name:<width$} {:>12} {:>10}  {}",
            t.rows,
            t.lost_events,
            summary.dir.join(&t.file).display()
        );
    }
    kernmlops::outln!(
        "  manifest: {}",
        summary.dir.join("manifest.json").display()
    );
    if let Some(figures) = &summary.benchmark {
        kernmlops::outln!("  {}", figures.summary());
    }
    if let Some(cost) = &summary.overhead {
        kernmlops::outln!("  {}", cost.summary());
    }
    if let Some(power) = &summary.power {
        kernmlops::out!("{}", kernmlops::power::render_summary(power));
    }
}

/// The run's power options: `[power]` with `--power` and
/// `--power-interval` over it, and each source's settings checked against
/// the defaults it declares (also returned, for the manifest).
fn power_options(
    cfg: &Config,
    registry: &Registry,
    args: &RunArgs,
) -> Result<(PowerOptions, serde_json::Value)> {
    let declared = kernmlops::power::registry::PowerSources::of(registry).defaults();
    let settings = cfg.power_settings(declared.iter().map(|(n, t)| (n.as_str(), t.as_str())))?;
    let json = Config::settings_json(&settings);
    let opts = PowerOptions::new(
        &cfg.power,
        args.power.as_deref(),
        args.power_interval.as_deref(),
        json.clone(),
    )?;
    Ok((opts, serde_json::json!(json)))
}

/// Refuses a folder name holding a control character (a pasted escape
/// sequence, a stray newline): it would make a folder nobody can type, and
/// echo the character to the terminal.
fn check_printable_path(what: &str, path: Option<&Path>) -> Result<()> {
    let Some(path) = path else {
        return Ok(());
    };
    let bytes = path.as_os_str().as_encoded_bytes();
    if bytes.iter().any(|&b| b < 0x20 || b == 0x7f) {
        bail!(
            "{what} {}: the path holds a control character; give a plain folder name",
            trust::printable(bytes)
        );
    }
    Ok(())
}
