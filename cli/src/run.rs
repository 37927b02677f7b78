//! `kernmlops run`: the run's flags resolved against the configuration in
//! one place into a typed [`RunConfig`] (what the manifest records,
//! serialised), its components' settings checked, one collection, and its
//! summary.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{atomic::AtomicBool, Arc},
};

use anyhow::{bail, Context as _, Result};
use kernmlops::{
    collect::{self, Filter, RunOptions, Summary},
    config::{self, CollectConfig, Config},
    plugin::Registry,
    power::{PowerConfig, PowerOptions},
    preflight,
    sink::FlushPolicy,
    trust,
};
use serde::Serialize;

use crate::{
    args::RunArgs,
    context::{report_refused, Context},
    trace_flags,
};

/// `kernmlops run`.
pub(crate) fn run(ctx: &Context, args: RunArgs) -> Result<ExitCode> {
    let collect = collect_for_run(&ctx.cfg.collect, &args)?;
    let registry = ctx.run_registry(
        &collect.plugins,
        args.benchmark.is_some(),
        args.power.as_deref(),
    )?;
    trace_flags::check(&ctx.cfg, &registry, &args)?;
    let cfg = trace_flags::apply(&ctx.cfg, &args);
    let options = RunConfig::resolve(&cfg, collect, &registry, &args)?;
    report_refused(&registry);
    preflight::require_bpf_privileges("run").map_err(anyhow::Error::msg)?;
    preflight::require_btf().map_err(anyhow::Error::msg)?;
    if let Err(e) = preflight::ensure_tracefs() {
        eprintln!("warning: {e}");
    }
    let stop = install_signals()?;
    let opts = options.run_options(&cfg, &args)?;
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

/// `[collect]` as this run uses it: `--duration`, `--ring-size` and
/// `--flush-interval` over the configuration's, each parsed as its typed
/// setting, and `plugins` the probes to run (none for a baseline, else
/// the flag's or the configuration's, with `trace` when trace flags are
/// given). The flags' folders, task ids and values are checked here,
/// before any plugin is loaded.
fn collect_for_run(configured: &CollectConfig, args: &RunArgs) -> Result<CollectConfig> {
    let mut c = configured.clone();
    if let Some(text) = &args.duration {
        c.duration = text.parse().context("--duration")?;
    }
    if let Some(text) = &args.ring_size {
        c.ring_size = text.parse().context("--ring-size")?;
    }
    if let Some(text) = &args.flush_interval {
        c.flush_interval = text.parse().context("--flush-interval")?;
    }
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
    if args.baseline {
        c.plugins.clear();
    } else if !args.plugins.is_empty() {
        c.plugins.clone_from(&args.plugins);
    }
    if trace_flags::given(args) && !c.plugins.iter().any(|p| p == trace_flags::TRACE_PROBE) {
        c.plugins.push(trace_flags::TRACE_PROBE.to_owned());
    }
    Ok(c)
}

/// What a run is asked to do, typed and resolved in one place: `[collect]`
/// with the flags over it, every component's settings checked against
/// what the plugins declare and their own rules, `[power]` with each
/// source's settings, the knobs and the filter flags. Serialised, it is the
/// configuration the manifest records; the collection's options are read
/// from it ([`RunConfig::run_options`]).
#[derive(Serialize)]
struct RunConfig {
    collect: CollectConfig,
    probes: BTreeMap<String, serde_json::Value>,
    benchmarks: BTreeMap<String, serde_json::Value>,
    /// `[power]` as configured, its `settings` every source's merged
    /// settings (what `--power` and `--power-interval` make of it is in
    /// `power_options`).
    power: PowerConfig,
    #[serde(skip_serializing_if = "toml::Table::is_empty")]
    machine: toml::Table,
    /// Where the user's settings came from.
    config_file: String,
    filter: FilterFlags,
    #[serde(skip)]
    power_options: PowerOptions,
}

/// The filter flags as the manifest records them.
#[derive(Serialize)]
struct FilterFlags {
    tgid: Option<u32>,
    pid: Option<u32>,
    cgroup: Option<String>,
    cgroup_descendants: bool,
    /// `--cgroup-workload`: the benchmark's workload cgroup and below
    /// (its path is known once the run starts). Left out when not given.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    cgroup_workload: bool,
}

impl RunConfig {
    fn resolve(
        cfg: &Config,
        collect: CollectConfig,
        registry: &Registry,
        args: &RunArgs,
    ) -> Result<Self> {
        registry
            .resolve(&collect.plugins)
            .map_err(anyhow::Error::msg)?;
        let probes = cfg.probe_settings(registry.config_defaults())?;
        let benchmarks = cfg.benchmark_settings(registry.benchmark_defaults())?;
        if let Some(b) = &args.benchmark {
            registry.find_benchmark(b).map_err(anyhow::Error::msg)?;
        }
        cfg.check_component_rules(registry, &collect.plugins, args.benchmark.as_slice())?;
        let declared = kernmlops::power::registry::PowerSources::of(registry).defaults();
        let power = PowerConfig {
            settings: cfg.power_settings(declared.iter().map(|(n, t)| (n.as_str(), t.as_str())))?,
            ..cfg.power.clone()
        };
        let power_options = PowerOptions::new(
            &power,
            args.power.as_deref(),
            args.power_interval.as_deref(),
            Config::settings_json(&power.settings),
        )?;
        Ok(Self {
            collect,
            probes: Config::settings_json(&probes),
            benchmarks: Config::settings_json(&benchmarks),
            power,
            machine: cfg.machine.clone(),
            config_file: cfg.source.clone(),
            filter: FilterFlags {
                tgid: args.tgid,
                pid: args.pid,
                cgroup: args.cgroup.as_ref().map(|p| p.display().to_string()),
                cgroup_descendants: (args.cgroup.is_some() && !args.cgroup_exact)
                    || args.cgroup_workload,
                cgroup_workload: args.cgroup_workload,
            },
            power_options,
        })
    }

    /// The one value the collection runs from, with this value serialised
    /// as its recorded configuration.
    fn run_options(self, cfg: &Config, args: &RunArgs) -> Result<RunOptions> {
        let config = serde_json::to_value(&self).context("recording the configuration")?;
        let c = self.collect;
        let duration = c.duration.get();
        Ok(RunOptions {
            output: args
                .output
                .clone()
                .unwrap_or_else(|| PathBuf::from(&c.output)),
            probes: c.plugins,
            collection_dir: args.collection_dir.clone(),
            duration: (!duration.is_zero()).then_some(duration),
            ring_bytes: c.ring_size.bytes(),
            drain_interval: c.drain_interval.get(),
            flush: FlushPolicy {
                interval: c.flush_interval.get(),
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
            cgroup_workload: args.cgroup_workload,
            probe_config: self.probes,
            benchmark: args.benchmark.clone(),
            // The host sets the THP mode (a knob); the benchmark leaves it be.
            benchmark_config: config::strip_host_settings(self.benchmarks),
            config,
            command: std::env::args().collect(),
            state_dir: None,
            power: self.power_options,
            plugin_timeout: c.plugin_timeout.get(),
            knobs: cfg.knobs_for(args.benchmark.as_deref())?,
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
