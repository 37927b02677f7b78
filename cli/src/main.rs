//! The `kernmlops` command: collect kernel-behaviour datasets from probe
//! plugins into Arrow IPC files.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{atomic::AtomicBool, Arc, Once, OnceLock},
};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use kernmlops::{
    collect::FileRepair,
    collect::{self, Filter, RunOptions},
    config::{self, Config},
    plugin::Registry,
    preflight,
    sink::{FlushPolicy, RepairOutcome},
    trust::{self, Policy},
};

/// Collect kernel-behaviour datasets for machine learning.
///
/// Probes are plugins (.so files in the plugin folder) that attach BPF
/// programs to the running kernel; each table they declare becomes an Arrow
/// IPC file under <output>/<collection_id>/, with a manifest.json and a
/// one-row system_info table.
#[derive(Parser, Debug)]
#[command(name = "kernmlops", version, propagate_version = true)]
struct Cli {
    /// Configuration file merged over the defaults (see `kernmlops.toml`).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Folder holding plugin .so files [default: collect.plugin_dir, "plugins"].
    #[arg(long, global = true, value_name = "DIR", env = "KERNMLOPS_PLUGIN_DIR")]
    plugin_dir: Option<PathBuf>,
    /// Load plugins, plugin folders, ./overrides.toml, --config and
    /// experiment files even when others can write them or another user
    /// owns them, with a warning
    /// (development only: whoever can write them runs code as root). The
    /// ELF check still applies; the run's manifest records the flag.
    #[arg(long, global = true)]
    allow_insecure_plugins: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Collect data from probes until the duration ends or Ctrl+C/SIGTERM.
    #[command(after_help = "Examples:
  kernmlops run --duration 30s
  kernmlops run --plugins quanta_runtime,process_trace --output /data/runs
  kernmlops run --plugins quanta_runtime --ring-size 64MiB --strict
  kernmlops run --plugins quanta_runtime,process_trace --power auto --benchmark stress_ng
  kernmlops run --duration 1m --power rapl,estimate --power-interval 500ms

Each run writes <output>/<collection_id>/<table>.arrow, system_info.arrow and
manifest.json, and prints each table's rows and lost events. If the process is
killed, `kernmlops repair <collection folder>` makes the files readable.")]
    Run(RunArgs),
    /// List discovered plugins, their probes, tables and columns, and the
    /// plugins that were refused with the reason.
    Plugins,
    /// Load, verify, attach and detach probes; exit non-zero if any fails.
    Check {
        /// Probes to check, comma-separated [default: every probe found].
        #[arg(long, value_delimiter = ',')]
        plugins: Vec<String>,
    },
    /// List this machine's performance events (perf's generic events, sysfs
    /// PMU events and libpfm4's tables for this CPU) with their PMU, unit
    /// masks, encoding, description and whether they open here, to choose
    /// `perf` probe counters.
    PerfList {
        /// Print JSON (the summaries and an `events` array) instead of a
        /// table.
        #[arg(long)]
        json: bool,
        /// Show what one event name resolves to here (source, type, config)
        /// and whether it opens, instead of the whole list.
        #[arg(long, value_name = "EVENT")]
        resolve: Option<String>,
    },
    /// List the installed power sources, whether each can be read on this
    /// machine and why not, and the zones each sees (scope, socket,
    /// measured or modelled, update interval).
    #[command(after_help = "Examples:
  kernmlops power-list
  kernmlops power-list --json
  sudo kernmlops power-list    # RAPL's energy_uj is readable by root only

Reading a source here starts it with your [power.settings.<name>] and reads
every zone once; `kernmlops run --power` records the ones that work.")]
    PowerList {
        /// Print JSON (a `sources` array, `refused` and `attribution`).
        #[arg(long)]
        json: bool,
    },
    /// Print the configuration: every key with its default, or the merged
    /// result of the defaults, your file and each probe's settings.
    Config {
        #[command(subcommand)]
        what: ConfigCommand,
    },
    /// Render the graphs of a collection (PNG and SVG, into its graphs/
    /// folder): every graph whose tables the collection has.
    Graph {
        /// A collection id, id prefix or folder [default: the newest].
        collection: Option<String>,
        /// Folder holding collections [default: collect.output].
        #[arg(long)]
        data: Option<PathBuf>,
    },
    /// Make the table files of a crashed collection readable again.
    Repair {
        /// A collection folder (<output>/<collection_id>).
        collection: PathBuf,
    },
    /// Write collections as the training dataset:
    /// <to>/{curated,baseline,failed}/<table>/<collection_id>.<benchmark>.parquet,
    /// or Hive-partitioned (--layout hive).
    #[command(after_help = "Examples:
  kernmlops export --parquet
  kernmlops export --parquet --data /data/runs --to /data/dataset 3f2a
  kernmlops export --parquet --layout hive --data experiments/sweep/runs --to /data/dataset

The class is the run's: curated, baseline or failed. <benchmark> is `none`
without one. Exporting again overwrites. Read the result in Python with
python/kernmlops_data.py: read_parquet_dir(\"data/curated\").

--layout hive writes <to>/<table>/run_class=<class>/benchmark=<benchmark>/<collection_id>.parquet
with collection_id as a plain string: Spark, DataFusion, DuckDB and polars read all
collections of a table as one table, e.g. in DuckDB
  SELECT * FROM read_parquet('/data/dataset/quanta_runtime/**/*.parquet', hive_partitioning = true)
and join an experiment's results.parquet on collection_id.")]
    Export {
        /// Write Parquet files (the only format).
        #[arg(long, required = true)]
        parquet: bool,
        /// `classes`: <to>/<class>/<table>/<id>.<benchmark>.parquet; `hive`:
        /// <to>/<table>/run_class=<class>/benchmark=<benchmark>/<id>.parquet.
        #[arg(long, value_enum, default_value_t = ExportLayout::Classes)]
        layout: ExportLayout,
        /// Folder holding the collections [default: collect.output, "data"].
        #[arg(long, value_name = "DIR")]
        data: Option<PathBuf>,
        /// Where the class folders go [default: the data folder].
        #[arg(long, value_name = "DIR")]
        to: Option<PathBuf>,
        /// Collection ids or id prefixes [default: every collection].
        collections: Vec<String>,
    },
    /// Summarise each table of a collection: rows, lost events, time span,
    /// min/mean/max of its numeric columns.
    Dump {
        /// Folder holding the collections [default: collect.output, "data"].
        #[arg(long, value_name = "DIR")]
        data: Option<PathBuf>,
        /// A collection id, id prefix or folder [default: the newest].
        collection: Option<String>,
    },
    /// Sweep a benchmark over variables with repeats, resume after a crash,
    /// and summarise the results (see `kernmlops experiment --help`).
    Experiment(kernmlops::experiment::cli::ExperimentArgs),
}

/// `kernmlops export --layout`.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
enum ExportLayout {
    /// One folder per run class, then per table.
    Classes,
    /// One folder per table, partitioned by run_class and benchmark.
    Hive,
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Every key with its default and comment, including each loaded
    /// probe's `[probes.<name>]` settings.
    Defaults,
    /// The configuration in effect: defaults, then --config FILE (or
    /// ./overrides.toml), with probe settings merged.
    Show,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Probes to run, comma-separated [default: collect.plugins].
    #[arg(long, short, value_delimiter = ',')]
    plugins: Vec<String>,
    /// How long to collect, e.g. 10s, 500ms, 5m [default: until Ctrl+C].
    #[arg(long, short)]
    duration: Option<String>,
    /// Output folder; each run gets its own sub-folder [default: data].
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Write the collection into exactly this folder, which must not exist
    /// yet, instead of a new sub-folder of --output (used by experiments).
    #[arg(long, value_name = "DIR", conflicts_with = "output")]
    collection_dir: Option<PathBuf>,
    /// Size of each probe ring buffer, e.g. 16MiB, or `auto` (each table's
    /// ring sized from its probe's declared event rate) [default:
    /// collect.ring_size, auto].
    #[arg(long)]
    ring_size: Option<String>,
    /// Longest time collected rows stay in memory before reaching disk.
    #[arg(long)]
    flush_interval: Option<String>,
    /// Fail the run if any probe fails, instead of continuing without it.
    #[arg(long)]
    strict: bool,
    /// Record only this process (thread group id), filtered in the kernel.
    #[arg(long, value_name = "TGID")]
    tgid: Option<u32>,
    /// Record only this thread (thread id), filtered in the kernel.
    #[arg(long, value_name = "PID")]
    pid: Option<u32>,
    /// Run this workload benchmark and collect for its lifetime (see
    /// `kernmlops plugins` for the available ones).
    #[arg(long, short, value_name = "NAME")]
    benchmark: Option<String>,
    /// Render the collection's graphs when the run ends.
    #[arg(long)]
    graphs: bool,
    /// With --benchmark: run it without probes, as a baseline.
    #[arg(long, requires = "benchmark", conflicts_with = "plugins")]
    baseline: bool,
    /// Record only tasks in this cgroup v2 folder and the cgroups below it
    /// (e.g. /sys/fs/cgroup/system.slice/redis.service), filtered in the
    /// kernel.
    #[arg(long, value_name = "PATH")]
    cgroup: Option<PathBuf>,
    /// With --cgroup: only tasks directly in that cgroup, not in the
    /// cgroups below it.
    #[arg(long, requires = "cgroup")]
    cgroup_exact: bool,
    /// Record the collector's own process too (by default every probe
    /// leaves it out in the kernel, so it is not in its own data).
    #[arg(long)]
    include_self: bool,
    /// Record energy from these power sources, in order of preference
    /// (comma-separated; `auto`: every source that works here, meters
    /// before models; `none`: no power) into the energy and
    /// energy_attribution tables [default: power.sources; the bare flag is
    /// auto]. `kernmlops power-list` shows the sources.
    #[arg(
        long,
        value_name = "SOURCES",
        num_args = 0..=1,
        default_missing_value = "auto",
        value_delimiter = ','
    )]
    power: Option<Vec<String>>,
    /// Length of a power slot, e.g. 1s, 500ms [default: power.interval].
    #[arg(long, value_name = "DURATION")]
    power_interval: Option<String>,
}

fn main() -> ExitCode {
    let mut raw = std::env::args_os().skip(1);
    if raw
        .next()
        .is_some_and(|a| a == kernmlops::undo::GUARDIAN_ARG)
    {
        let state = raw.next().map(PathBuf::from).unwrap_or_default();
        return kernmlops::undo::guardian_main(&state);
    }
    let cli = Cli::parse();
    kernmlops::tune_allocator();
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            // One line, whatever the error carries (a user's bytes, a
            // plugin's message): control characters are escaped.
            eprintln!(
                "error: {}",
                trust::printable(chain_line(&e).trim_end().as_bytes())
            );
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, `outer: cause: ...`, each cause
/// once: an error whose message already quotes its source (`path: No such
/// file or directory (os error 2)`) does not get it appended again.
fn chain_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line
}

/// Who may own plugins and files found in the current directory; set once
/// from `--allow-insecure-plugins` before anything is loaded.
static TRUST: OnceLock<Policy> = OnceLock::new();

fn trust_policy() -> &'static Policy {
    TRUST.get_or_init(Policy::default)
}

/// Commands that only print: a reader that stops early (`| head`) ends them
/// quietly, as it ends `ls`. The others keep SIGPIPE ignored: a run must
/// close its files whatever happens to its terminal.
fn report_only(command: &Command) -> bool {
    matches!(
        command,
        Command::Plugins
            | Command::Check { .. }
            | Command::Config { .. }
            | Command::PerfList { .. }
            | Command::PowerList { .. }
            | Command::Dump { .. }
    )
}

fn dispatch(cli: Cli) -> Result<ExitCode> {
    if report_only(&cli.command) {
        // SAFETY: restoring a signal's default action has no preconditions.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let _ = TRUST.set(Policy::for_this_process(cli.allow_insecure_plugins));
    // A run that died left its machine changes recorded: undo them first.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        for line in kernmlops::undo::recover_abandoned() {
            eprintln!("warning: {}", trust::printable(line.as_bytes()));
        }
    }
    // A configuration can name commands that run as root (benchmarks):
    // --config FILE passes the plugins' checks or is refused, and without
    // it ./overrides.toml is the user's file only when present and safe.
    if let Some(path) = &cli.config {
        let checked = trust::check_instructions(path, "--config", trust_policy());
        if let Some(warning) = checked.map_err(anyhow::Error::msg)? {
            eprintln!("warning: {warning}");
        }
    }
    let file = cli.config.clone().or_else(|| {
        let here = PathBuf::from("overrides.toml");
        here.symlink_metadata().ok()?;
        match trust::check_file_path(&here, trust_policy()) {
            Ok(()) => Some(here),
            Err(e) if trust_policy().allow_insecure => {
                eprintln!(
                    "warning: using ./overrides.toml although {e} (--allow-insecure-plugins)"
                );
                Some(here)
            }
            Err(e) => {
                eprintln!("warning: ignoring ./overrides.toml: {e}");
                None
            }
        }
    });
    let mut cfg = Config::load(file.as_deref())?;
    // The commands a configuration names run as root: resolved against
    // the folder of the file that names them and checked like plugins,
    // before anything is created.
    let runs_commands = matches!(
        cli.command,
        Command::Run(_)
            | Command::Config {
                what: ConfigCommand::Show
            }
    );
    if let (Some(file), true) = (&file, runs_commands) {
        let absolute =
            std::path::absolute(file).with_context(|| format!("resolving {}", file.display()))?;
        let base = absolute.parent().unwrap_or(Path::new("/"));
        for warning in cfg.resolve_commands(base, trust_policy())? {
            eprintln!("warning: {}", trust::printable(warning.as_bytes()));
        }
    }
    match cli.command {
        Command::Run(args) => run(&cfg, cli.plugin_dir.as_deref(), args),
        Command::Plugins => plugins(&cfg, cli.plugin_dir.as_deref()),
        Command::Check { plugins } => check(&cfg, cli.plugin_dir.as_deref(), plugins),
        Command::Repair { collection } => repair(&collection),
        Command::Config { what } => config_command(&cfg, cli.plugin_dir.as_deref(), what),
        Command::PerfList { json, resolve } => perf_list(json, resolve.as_deref()),
        Command::PowerList { json } => power_list(&cfg, cli.plugin_dir.as_deref(), json),
        Command::Export {
            parquet: _,
            layout,
            data,
            to,
            collections,
        } => {
            let layout = match layout {
                ExportLayout::Classes => kernmlops::export::Layout::Classes,
                ExportLayout::Hive => kernmlops::export::Layout::Hive,
            };
            export(&cfg, data, to, &collections, layout)
        }
        Command::Dump { data, collection } => dump(&cfg, data, collection),
        Command::Experiment(args) => {
            let flags = (cli.config.as_deref(), cli.plugin_dir.as_deref());
            experiment(&cfg, flags, cli.allow_insecure_plugins, args)
        }
        Command::Graph { collection, data } => {
            let dir = resolve_collection(&cfg, data, collection)?;
            graphs(&cfg, cli.plugin_dir.as_deref(), &dir)
        }
    }
}

/// The plugin folder: the flag (or env), else the configured one relative to
/// the working directory, else the one of the workspace holding this binary.
fn plugin_dir(cfg: &Config, flag: Option<&Path>) -> Result<PathBuf> {
    if let Some(dir) = flag {
        if !dir.is_dir() {
            bail!("plugin folder {} does not exist", dir.display());
        }
        return Ok(dir.to_owned());
    }
    let configured = PathBuf::from(&cfg.collect.plugin_dir);
    if configured.is_absolute() {
        return Ok(configured);
    }
    // Found in the current directory: used only when it is safe.
    if configured.is_dir() {
        match trust::check_dir_path(&configured, trust_policy()) {
            Ok(()) => return Ok(configured),
            Err(_) if trust_policy().allow_insecure => return Ok(configured),
            Err(e) => eprintln!(
                "warning: ignoring plugin folder ./{} in the current directory: {e}",
                trust::printable(configured.as_os_str().as_encoded_bytes())
            ),
        }
    }
    let beside_binary = std::env::current_exe().ok().and_then(|exe| {
        exe.ancestors()
            .skip(1)
            .map(|d| d.join(&configured))
            .find(|d| d.is_dir())
    });
    beside_binary.with_context(|| {
        format!(
            "no plugin folder {:?} here or above the kernmlops binary; build plugins with `cargo xtask build-plugins` or pass --plugin-dir",
            cfg.collect.plugin_dir
        )
    })
}

/// Loads the plugin folder; prints its warnings (and, once, that trust
/// checks are off) on stderr.
fn load_registry(cfg: &Config, flag: Option<&Path>) -> Result<Registry> {
    let policy = trust_policy();
    if policy.allow_insecure {
        static WARNED: Once = Once::new();
        WARNED.call_once(|| {
            eprintln!(
                "warning: --allow-insecure-plugins: plugin files and folders that others can write, or that another user owns, are loaded anyway"
            )
        });
    }
    let dir = plugin_dir(cfg, flag)?;
    let reg = Registry::load_dir_with(&dir, policy).with_context(|| {
        format!(
            "reading plugin folder {}",
            trust::printable(dir.as_os_str().as_encoded_bytes())
        )
    })?;
    for w in &reg.warnings {
        eprintln!("warning: {w}");
    }
    Ok(reg)
}

fn report_refused(reg: &Registry) {
    for (path, e) in &reg.failures {
        eprintln!(
            "warning: plugin {} refused: {e}",
            trust::printable(path.as_os_str().as_encoded_bytes())
        );
    }
}

fn run(cfg: &Config, plugin_flag: Option<&Path>, args: RunArgs) -> Result<ExitCode> {
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
        check_task("--tgid", tgid, false)?;
    }
    if let Some(pid) = args.pid {
        check_task("--pid", pid, true)?;
    }
    let probes = if args.baseline {
        Vec::new()
    } else if args.plugins.is_empty() {
        c.plugins.clone()
    } else {
        args.plugins.clone()
    };

    let registry = load_registry(cfg, plugin_flag)?;
    registry.resolve(&probes).map_err(anyhow::Error::msg)?;
    let settings = cfg.probe_settings(registry.config_defaults())?;
    let bench_settings = cfg.benchmark_settings(registry.benchmark_defaults())?;
    if let Some(b) = &args.benchmark {
        registry.find_benchmark(b).map_err(anyhow::Error::msg)?;
    }
    check_component_rules(cfg, &registry, &probes, args.benchmark.as_slice())?;
    let (power, power_settings) = power_options(cfg, &registry, &args)?;
    report_refused(&registry);
    preflight::require_bpf_privileges("run").map_err(anyhow::Error::msg)?;
    preflight::require_btf().map_err(anyhow::Error::msg)?;
    if let Err(e) = preflight::ensure_tracefs() {
        eprintln!("warning: {e}");
    }

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // A second signal while stopping exits at once; the files on disk
        // are then repairable with `kernmlops repair`.
        signal_hook::flag::register_conditional_shutdown(sig, 130, stop.clone())
            .context("installing signal handlers")?;
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }

    let mut config_value = serde_json::to_value(cfg).context("recording the configuration")?;
    config_value["collect"]["plugins"] = serde_json::json!(probes);
    config_value["collect"]["duration"] = serde_json::json!(duration_text);
    config_value["collect"]["ring_size"] = serde_json::json!(ring_text);
    config_value["collect"]["flush_interval"] = serde_json::json!(flush_text);
    config_value["probes"] = serde_json::json!(Config::settings_json(&settings));
    config_value["benchmarks"] = serde_json::json!(Config::settings_json(&bench_settings));
    config_value["config_file"] = serde_json::json!(cfg.source);
    config_value["power"]["settings"] = serde_json::json!(power_settings);
    config_value["filter"] = serde_json::json!({
        "tgid": args.tgid,
        "pid": args.pid,
        "cgroup": args.cgroup.as_ref().map(|p| p.display().to_string()),
        "cgroup_descendants": args.cgroup.is_some() && !args.cgroup_exact,
    });
    let opts = RunOptions {
        probes,
        output: args
            .output
            .clone()
            .unwrap_or_else(|| PathBuf::from(&c.output)),
        collection_dir: args.collection_dir.clone(),
        duration: (!duration.is_zero()).then_some(duration),
        ring_bytes,
        drain_interval,
        flush: FlushPolicy {
            interval: flush_interval,
            rows: c.flush_rows,
        },
        strict: args.strict || c.strict,
        filter: Filter {
            tgid: args.tgid.unwrap_or(0),
            pid: args.pid.unwrap_or(0),
            cgroup_id: match &args.cgroup {
                Some(path) => cgroup_id(path)?,
                None => 0,
            },
            cgroup_descendants: !args.cgroup_exact,
        },
        include_self: args.include_self,
        probe_config: Config::settings_json(&settings),
        benchmark: args.benchmark.clone(),
        benchmark_config: Config::settings_json(&bench_settings),
        config: config_value,
        command: std::env::args().collect(),
        state_dir: None,
        power,
        plugin_timeout,
    };
    let summary = collect::run(&registry, &opts, stop)?;

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
    if args.graphs {
        graphs(cfg, plugin_flag, &summary.dir)?;
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

/// Refuses a `--tgid` (process) or `--pid` (thread) that is not running:
/// a filter on it would record nothing, silently.
fn check_task(flag: &str, id: u32, thread: bool) -> Result<()> {
    let what = if thread { "thread" } else { "process" };
    if id == 0 {
        bail!("{flag} 0: not a {what} id; give the id of a running {what}");
    }
    let status = std::fs::read_to_string(format!("/proc/{id}/status"))
        .map_err(|_| anyhow::anyhow!("{flag} {id}: no {what} {id} is running"))?;
    if !thread {
        let tgid = status
            .lines()
            .find_map(|l| l.strip_prefix("Tgid:"))
            .and_then(|v| v.trim().parse::<u32>().ok());
        if let Some(tgid) = tgid.filter(|&t| t != id) {
            bail!("{flag} {id}: {id} is a thread of process {tgid}; use --tgid {tgid}, or --pid {id} for this thread alone");
        }
    }
    Ok(())
}

/// Runs the rules of every configured probe and benchmark, and of those
/// this run uses, on their settings (each plugin's `check_config`), before
/// anything is set up.
fn check_component_rules(
    cfg: &Config,
    registry: &Registry,
    probes: &[String],
    benchmarks: &[String],
) -> Result<()> {
    Ok(kernmlops::settings_rules::check_all(
        cfg, registry, probes, benchmarks,
    )?)
}

/// The id BPF sees for a cgroup v2 folder: its inode number.
fn cgroup_id(path: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    let meta = std::fs::metadata(path).with_context(|| format!("--cgroup {}", path.display()))?;
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .with_context(|| format!("--cgroup {}", path.display()))?;
    // SAFETY: statfs is plain old data, filled by the call.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a writable statfs.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), &mut fs) };
    if rc != 0 || !meta.is_dir() || fs.f_type as i64 != CGROUP2_SUPER_MAGIC {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let v2 = mounts
            .lines()
            .find(|l| l.split_whitespace().nth(2) == Some("cgroup2"))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned));
        bail!(
            "--cgroup {}: not a cgroup v2 folder; {}",
            path.display(),
            match v2 {
                Some(m) => format!("cgroup v2 is mounted at {m}"),
                None => "this machine has no cgroup v2 mount".to_owned(),
            }
        );
    }
    Ok(meta.ino())
}

fn plugins(cfg: &Config, plugin_flag: Option<&Path>) -> Result<ExitCode> {
    let reg = load_registry(cfg, plugin_flag)?;
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

fn check(cfg: &Config, plugin_flag: Option<&Path>, probes: Vec<String>) -> Result<ExitCode> {
    let reg = load_registry(cfg, plugin_flag)?;
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
    let ring = config::ring_bytes(&cfg.collect.ring_size).map_err(anyhow::Error::msg)?;
    let mut ok = reg.failures.is_empty();
    for (path, e) in &reg.failures {
        kernmlops::outln!("FAIL {}: {e}", path.display());
    }
    for r in collect::check(&reg, &probes, ring, &settings)? {
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

fn config_command(
    cfg: &Config,
    plugin_flag: Option<&Path>,
    what: ConfigCommand,
) -> Result<ExitCode> {
    // Component settings come from the plugins; without a plugin folder
    // only the host's keys can be shown.
    let registry = load_registry(cfg, plugin_flag).ok();
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
            kernmlops::out!("{}", config::DEFAULTS_TOML);
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
                check_component_rules(cfg, r, &[], &[])?;
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

fn repair(dir: &Path) -> Result<ExitCode> {
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

fn export(
    cfg: &Config,
    data: Option<PathBuf>,
    to: Option<PathBuf>,
    selectors: &[String],
    layout: kernmlops::export::Layout,
) -> Result<ExitCode> {
    let data = data.unwrap_or_else(|| PathBuf::from(&cfg.collect.output));
    let to = to.unwrap_or_else(|| data.clone());
    let dirs = kernmlops::export::find_collections(&data, selectors).map_err(anyhow::Error::msg)?;
    let (mut files, mut rows) = (0, 0);
    for dir in dirs {
        match kernmlops::export::export_collection_as(&dir, &to, layout)
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
    cfg: &Config,
    data: Option<PathBuf>,
    collection: Option<String>,
) -> Result<PathBuf> {
    let data = data.unwrap_or_else(|| PathBuf::from(&cfg.collect.output));
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

fn graphs(cfg: &Config, plugin_flag: Option<&Path>, dir: &Path) -> Result<ExitCode> {
    let registry = load_registry(cfg, plugin_flag)?;
    let rendered =
        kernmlops::graph::render_collection(&registry, dir).map_err(anyhow::Error::msg)?;
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

fn dump(cfg: &Config, data: Option<PathBuf>, collection: Option<String>) -> Result<ExitCode> {
    let dir = resolve_collection(cfg, data, collection)?;
    kernmlops::outln!("collection {}", dir.display());
    let tables = kernmlops::dump::summarize_collection(&dir).map_err(anyhow::Error::msg)?;
    for t in &tables {
        kernmlops::out!("{}", kernmlops::dump::render(t));
    }
    Ok(ExitCode::SUCCESS)
}

/// The run's power options: `[power]` with `--power` and
/// `--power-interval` over it, and each source's settings checked against
/// the defaults it declares (also returned, for the manifest).
fn power_options(
    cfg: &Config,
    registry: &Registry,
    args: &RunArgs,
) -> Result<(kernmlops::power::PowerOptions, serde_json::Value)> {
    let declared = kernmlops::power::registry::PowerSources::of(registry).defaults();
    let settings = cfg.power_settings(declared.iter().map(|(n, t)| (n.as_str(), t.as_str())))?;
    let json = Config::settings_json(&settings);
    let opts = kernmlops::power::PowerOptions::new(
        &cfg.power,
        args.power.as_deref(),
        args.power_interval.as_deref(),
        json.clone(),
    )?;
    Ok((opts, serde_json::json!(json)))
}

/// `kernmlops power-list`.
fn power_list(cfg: &Config, plugin_flag: Option<&Path>, json: bool) -> Result<ExitCode> {
    let reg = load_registry(cfg, plugin_flag)?;
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

fn perf_list(json: bool, resolve: Option<&str>) -> Result<ExitCode> {
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

/// `kernmlops experiment`: the experiment layer, which starts `kernmlops run`
/// once per run with the plugin folder resolved here.
fn experiment(
    cfg: &Config,
    (config_file, plugin_flag): (Option<&Path>, Option<&Path>),
    allow_insecure_plugins: bool,
    args: kernmlops::experiment::cli::ExperimentArgs,
) -> Result<ExitCode> {
    let env = kernmlops::experiment::cli::Env {
        config_file: config_file.map(Path::to_owned),
        plugin_flag: plugin_flag.map(Path::to_owned),
        plugin_dir: plugin_dir(cfg, plugin_flag).map_err(|e| chain_line(&e)),
        allow_insecure_plugins,
    };
    Ok(kernmlops::experiment::cli::main(args, &env)?)
}
