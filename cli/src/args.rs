//! The clap tree of the `kernmlops` command: global flags, the commands and
//! their flags (the `experiment` subcommands' are in `experiment.rs`).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Collect kernel-behaviour datasets for machine learning.
///
/// Probes are plugins (.so files in the plugin folder) that attach BPF
/// programs to the running kernel; each table they declare becomes an Arrow
/// IPC file under <output>/<collection_id>/, with a manifest.json and a
/// one-row system_info table.
#[derive(Parser, Debug)]
#[command(name = "kernmlops", version, propagate_version = true)]
pub(crate) struct Cli {
    /// Configuration file merged over the defaults (see `kernmlops.toml`).
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Folder holding plugin .so files [default: collect.plugin_dir, "plugins"].
    #[arg(long, global = true, value_name = "DIR", env = "KERNMLOPS_PLUGIN_DIR")]
    pub(crate) plugin_dir: Option<PathBuf>,
    /// Load plugins, plugin folders, ./overrides.toml, --config and
    /// experiment files even when others can write them or another user
    /// owns them, with a warning
    /// (development only: whoever can write them runs code as root). The
    /// ELF check still applies; the run's manifest records the flag.
    #[arg(long, global = true)]
    pub(crate) allow_insecure_plugins: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Collect data from probes until the duration ends or Ctrl+C/SIGTERM.
    #[command(after_help = "Examples:
  kernmlops run --duration 30s
  kernmlops run --plugins quanta_runtime,process_trace --output /data/runs
  kernmlops run --plugins quanta_runtime --ring-size 64MiB --strict
  kernmlops run --plugins quanta_runtime,process_trace --power auto --benchmark stress_ng
  kernmlops run --duration 1m --power rapl,estimate --power-interval 500ms
  kernmlops run --trace sched:sched_process_exec --trace 'block:block_rq_issue(dev, sector, nr_sector)'
  kernmlops run --trace-preset sched,block --duration 10s

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
    /// List what the `trace` probe can trace here: tracepoints with their
    /// fields and the column type each becomes, kernel functions with their
    /// BTF prototypes, and for each kind of hook whether this kernel lets it
    /// attach, and why not.
    #[command(after_help = "Examples:
  kernmlops trace-list                     # the hook kinds, every tracepoint by name
  kernmlops trace-list sched:sched_switch  # its fields and column types
  kernmlops trace-list 'block:*'           # * any run, ? one character
  kernmlops trace-list do_madvise --json   # the kernel function's prototype, as JSON

A PATTERN without * or ? matches anywhere in a name. Fields and prototypes
are shown when at most 50 names match. Trace what you found with
  kernmlops run --trace sched:sched_switch --duration 10s
or [probes.trace] events = [\"sched:sched_switch\"] in a configuration file.
Reading tracepoints' formats needs root.")]
    TraceList {
        /// Names to list: a substring, or a glob with * and ?.
        pattern: Option<String>,
        /// Print JSON (`kinds`, `tracepoints` with `fields`, `functions`
        /// with `prototype`, `notes`) instead of text.
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
        /// The numeric column whose distribution the `trace` graph draws
        /// for each trace table that has it [default: latency_ns].
        #[arg(long, value_name = "COLUMN")]
        trace_field: Option<String>,
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
  kernmlops export
  kernmlops export --data /data/runs --to /data/dataset 3f2a
  kernmlops export --format parquet --layout hive --data experiments/sweep/runs --to /data/dataset

The class is the run's: curated, baseline or failed. <benchmark> is `none`
without one. Exporting again overwrites. Read the result in Python with
python/kernmlops_data.py: read_parquet_dir(\"data/curated\").

--layout hive writes <to>/<table>/run_class=<class>/benchmark=<benchmark>/<collection_id>.parquet
with collection_id as a plain string: Spark, DataFusion, DuckDB and polars read all
collections of a table as one table, e.g. in DuckDB
  SELECT * FROM read_parquet('/data/dataset/quanta_runtime/**/*.parquet', hive_partitioning = true)
and join an experiment's results.parquet on collection_id.")]
    Export {
        /// The file format of the table files.
        #[arg(long, value_enum, default_value_t = ExportFormatArg::Parquet)]
        format: ExportFormatArg,
        /// Same as --format parquet (kept so older commands still work).
        #[arg(long, hide = true, conflicts_with = "format")]
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
    Experiment(crate::experiment::ExperimentArgs),
}

/// `kernmlops export --format`: one value per `kernmlops::export::ExportFormat`.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub(crate) enum ExportFormatArg {
    /// Snappy-compressed Parquet, the Arrow schema inside each file.
    Parquet,
}

impl ExportFormatArg {
    /// The format to write: Parquet when the hidden `--parquet` was given.
    pub(crate) fn or_parquet(self, parquet: bool) -> kernmlops::export::ExportFormat {
        if parquet {
            return kernmlops::export::ExportFormat::Parquet;
        }
        match self {
            Self::Parquet => kernmlops::export::ExportFormat::Parquet,
        }
    }
}

/// `kernmlops export --layout`.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub(crate) enum ExportLayout {
    /// One folder per run class, then per table.
    Classes,
    /// One folder per table, partitioned by run_class and benchmark.
    Hive,
}

#[derive(Subcommand, Debug)]
pub(crate) enum ConfigCommand {
    /// Every key with its default and comment, including each loaded
    /// probe's `[probes.<name>]` settings.
    Defaults,
    /// The configuration in effect: defaults, then --config FILE (or
    /// ./overrides.toml), with probe settings merged.
    Show,
}

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// Probes to run, comma-separated [default: collect.plugins].
    #[arg(long, short, value_delimiter = ',')]
    pub(crate) plugins: Vec<String>,
    /// How long to collect, e.g. 10s, 500ms, 5m [default: until Ctrl+C].
    #[arg(long, short)]
    pub(crate) duration: Option<String>,
    /// Output folder; each run gets its own sub-folder [default: data].
    #[arg(long, short)]
    pub(crate) output: Option<PathBuf>,
    /// Write the collection into exactly this folder, which must not exist
    /// yet, instead of a new sub-folder of --output (used by experiments).
    #[arg(long, value_name = "DIR", conflicts_with = "output")]
    pub(crate) collection_dir: Option<PathBuf>,
    /// Size of each probe ring buffer, e.g. 16MiB, or `auto` (each table's
    /// ring sized from its probe's declared event rate) [default:
    /// collect.ring_size, auto].
    #[arg(long)]
    pub(crate) ring_size: Option<String>,
    /// Longest time collected rows stay in memory before reaching disk.
    #[arg(long)]
    pub(crate) flush_interval: Option<String>,
    /// Fail the run if any probe fails, instead of continuing without it.
    #[arg(long)]
    pub(crate) strict: bool,
    /// Record only this process (thread group id), filtered in the kernel.
    #[arg(long, value_name = "TGID")]
    pub(crate) tgid: Option<u32>,
    /// Record only this thread (thread id), filtered in the kernel.
    #[arg(long, value_name = "PID")]
    pub(crate) pid: Option<u32>,
    /// Run this workload benchmark and collect for its lifetime (see
    /// `kernmlops plugins` for the available ones).
    #[arg(long, short, value_name = "NAME")]
    pub(crate) benchmark: Option<String>,
    /// Render the collection's graphs when the run ends.
    #[arg(long)]
    pub(crate) graphs: bool,
    /// With --benchmark: run it without probes, as a baseline.
    #[arg(long, requires = "benchmark", conflicts_with = "plugins")]
    pub(crate) baseline: bool,
    /// Record only tasks in this cgroup v2 folder and the cgroups below it
    /// (e.g. /sys/fs/cgroup/system.slice/redis.service), filtered in the
    /// kernel.
    #[arg(long, value_name = "PATH")]
    pub(crate) cgroup: Option<PathBuf>,
    /// With --cgroup: only tasks directly in that cgroup, not in the
    /// cgroups below it.
    #[arg(long, requires = "cgroup")]
    pub(crate) cgroup_exact: bool,
    /// With --benchmark: record only the benchmark's own processes (its
    /// workload cgroup, made before the probes start, and the cgroups
    /// below it), filtered in the kernel. Needs cgroup v2.
    #[arg(long, requires = "benchmark", conflicts_with_all = ["cgroup", "tgid", "pid"])]
    pub(crate) cgroup_workload: bool,
    /// Record the collector's own process too (by default every probe
    /// leaves it out in the kernel, so it is not in its own data).
    #[arg(long)]
    pub(crate) include_self: bool,
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
    pub(crate) power: Option<Vec<String>>,
    /// Length of a power slot, e.g. 1s, 500ms [default: power.interval].
    #[arg(long, value_name = "DURATION")]
    pub(crate) power_interval: Option<String>,
    /// Trace this event into its own table (repeatable): adds the `trace`
    /// probe and appends EVENT to [probes.trace] events, e.g.
    /// sched:sched_switch or 'tp_btf:block_rq_insert(rq->__sector)'.
    /// `kernmlops trace-list` shows what exists here.
    #[arg(long, value_name = "EVENT", conflicts_with = "baseline")]
    pub(crate) trace: Vec<String>,
    /// Trace a shipped set of events (repeatable or comma-separated): sched,
    /// block, syscalls-open, mm, page_cache, reclaim, migration, cpufreq,
    /// net, writeback, syscalls; added to [probes.trace] presets.
    #[arg(
        long,
        value_name = "NAME",
        value_delimiter = ',',
        conflicts_with = "baseline"
    )]
    pub(crate) trace_preset: Vec<String>,
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;
    use kernmlops::export::ExportFormat;

    use super::{Cli, Command};

    /// The format `kernmlops export ARGS` writes, or clap's error.
    fn export_format(args: &[&str]) -> Result<ExportFormat, String> {
        let argv = ["kernmlops", "export"].iter().chain(args);
        match Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            Command::Export {
                format, parquet, ..
            } => Ok(format.or_parquet(parquet)),
            other => Err(format!("not export: {other:?}")),
        }
    }

    #[test]
    fn export_format_defaults_to_parquet_and_keeps_the_old_flag() {
        assert_eq!(export_format(&[]), Ok(ExportFormat::Parquet));
        assert_eq!(
            export_format(&["--format", "parquet"]),
            Ok(ExportFormat::Parquet)
        );
        assert_eq!(export_format(&["--parquet"]), Ok(ExportFormat::Parquet));
        let e = export_format(&["--format", "csv"]).expect_err("unknown format");
        assert!(e.contains("invalid value 'csv'"), "{e}");
        let e = export_format(&["--parquet", "--format", "parquet"]).expect_err("both");
        assert!(e.contains("cannot be used with"), "{e}");
        let help = Cli::try_parse_from(["kernmlops", "export", "--help"])
            .expect_err("help")
            .to_string();
        assert!(
            help.contains("--format") && !help.contains("--parquet"),
            "{help}"
        );
    }
}
