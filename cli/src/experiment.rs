//! `kernmlops experiment`: the clap tree of its subcommands, turned into
//! the experiment library's options (`kernmlops-experiment`, which holds
//! the commands' bodies).

use std::{path::PathBuf, process::ExitCode};

use anyhow::Result;
use kernmlops_experiment::{
    commands::{self as exp, CommonOptions, Env, ExecOptions, ExecutorOptions},
    spec::Order,
};

use crate::context::Context;

/// `kernmlops experiment`: the experiment layer, which starts `kernmlops run`
/// once per run with the plugin folder resolved here.
pub(crate) fn run(
    ctx: &Context,
    config_file: Option<PathBuf>,
    allow_insecure_plugins: bool,
    args: ExperimentArgs,
) -> Result<ExitCode> {
    let env = Env {
        config_file,
        plugin_flag: ctx.plugin_flag.clone(),
        plugin_dir: ctx.plugin_dir().map_err(|e| crate::chain_line(&e)),
        allow_insecure_plugins,
    };
    Ok(match args.command {
        ExperimentCommand::Run(a) => exp::run(
            exp::RunOptions {
                file: a.file,
                dir: a.dir,
                order: a.order.map(Order::from),
                dry_run: a.dry_run,
                max_runs: a.max_runs,
                common: a.common.into(),
            },
            &env,
        )?,
        ExperimentCommand::Resume(a) => exp::resume(
            exp::ResumeOptions {
                dir: a.dir,
                common: a.common.into(),
            },
            &env,
        )?,
        ExperimentCommand::Status { dir, json } => exp::status(dir, json, &env)?,
        ExperimentCommand::Results {
            dir,
            no_graphs,
            figures,
            reference,
            best_by,
            over,
            minimize,
        } => exp::results(
            exp::ResultsOptions {
                dir,
                no_graphs,
                figures,
                reference,
                best_by: best_by.zip(over),
                minimize,
            },
            &env,
        )?,
        ExperimentCommand::Compare { a, b, out } => exp::compare(a, b, out, &env)?,
        ExperimentCommand::Build { dir } => exp::build(dir, &env)?,
        ExperimentCommand::Exec {
            dir,
            run_id,
            allow_plugin_change,
            retry_failed,
            warmup,
            binary_sha256,
        } => {
            let opts = ExecOptions {
                allow_plugin_change,
                retry_failed,
                warmup,
                binary_sha256,
            };
            exp::exec(dir, &run_id, &opts, &env)?
        }
    })
}

/// Sweep a benchmark over variables, repeated and shuffled; resume; results;
/// comparisons and labels.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  kernmlops experiment run examples/experiments/fio_sweep.toml
  kernmlops experiment run sweep.toml --dir experiments/sweep --order sequential
  kernmlops experiment run sweep.toml --adaptive --metric read_iops --target 0.05 --max-repeats 10
  kernmlops experiment status experiments/sweep
  kernmlops experiment resume experiments/sweep
  kernmlops experiment results experiments/sweep
  kernmlops experiment results experiments/sweep --reference bs=4k --best-by read_iops --over jobs
  kernmlops experiment compare experiments/before experiments/after
  kernmlops experiment run sweep.toml --dir /shared/sweep --executor slurm --partition batch --time 00:10:00
  kernmlops experiment resume /shared/sweep --executor slurm

Each run is a full collection in <dir>/runs/<run_id>/; run_id is a hash of the
run's configuration, repeat and seed. See README.md, \"Experiments\", for the file
and \"Experiments on a Slurm cluster\".")]
pub struct ExperimentArgs {
    #[command(subcommand)]
    pub command: ExperimentCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum ExperimentCommand {
    /// Plan an experiment from its file and carry out its runs; on an
    /// existing folder, only the runs it does not have yet.
    #[command(after_help = "Examples:
  kernmlops experiment run examples/experiments/fio_sweep.toml
  kernmlops experiment run sweep.toml --dir experiments/sweep --dry-run
  kernmlops experiment run sweep.toml --adaptive --metric read_iops --max-repeats 8
  kernmlops experiment run sweep.toml --dir /shared/sweep --executor slurm --time 00:10:00
  kernmlops experiment run sweep.toml --dir /shared/sweep --executor slurm --partition batch \\
      --sbatch-arg=--account=lab --sbatch-arg=--constraint=skylake

With --executor slurm the runs are submitted as one Slurm job array (a task per
run, each on a whole node: --exclusive) and the command returns at once with the
job id; the folder must be on storage every node sees. Follow with `experiment
status`, read what has finished with `experiment results`.

The folder (default experiments/<name>-<UTC time>) gets a copy of the file
(experiment.toml), the merged base configuration (config.toml), the record
(experiment.json), one collection per run (runs/<run_id>/), results.parquet,
results.arrow and graphs/. A global --config FILE is merged under the file's
[config] table; ./overrides.toml is not read.")]
    Run(RunArgs),
    /// Carry out the runs of an experiment folder that have no finished
    /// collection: never started, cut off (moved to partial/ and redone), or
    /// refused by the host.
    #[command(after_help = "Examples:
  kernmlops experiment resume experiments/fio_sweep-20261123-101500
  kernmlops experiment resume experiments/sweep --retry-failed
  kernmlops experiment resume /shared/sweep --executor slurm --time 00:20:00

Runs Slurm still has queued or running are left to it; with --executor slurm,
only what is missing is submitted.")]
    Resume(ResumeArgs),
    /// Show each planned run's state: pending, queued, running, done, failed
    /// or cut off.
    #[command(after_help = "Examples:
  kernmlops experiment status experiments/sweep
  kernmlops experiment status experiments/sweep --json

States come from the experiment folder; for runs submitted to Slurm, refined
by Slurm's own view (squeue, and sacct where the cluster keeps accounting).")]
    Status {
        /// The experiment folder.
        dir: PathBuf,
        /// Print JSON (counts and every run) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Write results.parquet and results.arrow (one row per finished run)
    /// and the graphs, and print n, mean, standard deviation and 95%
    /// confidence interval of each result per variable combination.
    #[command(after_help = "Examples:
  kernmlops experiment results experiments/sweep
  kernmlops experiment results experiments/sweep --figures read_iops,write_iops --no-graphs
  kernmlops experiment results experiments/sweep --reference bs=4k
  kernmlops experiment results experiments/ra --best-by read_bw --over read_ahead_kb

In Python: polars.read_parquet(\"experiments/sweep/results.parquet\").
Works while runs are still going: it reads what has finished.

--reference compares every combination with the one that has the given
values (and its own values of the other variables): ratio of means with its
95% interval (Fieller), Welch's p-value Holm-corrected per figure, median, MAD
and outlier runs (flagged, kept), written to comparisons.parquet.
--best-by labels each combination of the other variables with the best value
of --over, its margin over the runner-up, Welch's p against it and the regret
of the variable's `default`, written to labels.parquet, one row per run (join
the runs' tables on collection_id).")]
    Results {
        /// The experiment folder.
        dir: PathBuf,
        /// Do not render graphs.
        #[arg(long)]
        no_graphs: bool,
        /// Print only these figures, comma-separated (`@result` keys,
        /// `overall_score`, `wall_time_s`) [default: all numeric ones].
        #[arg(long, value_delimiter = ',', value_name = "KEY,...")]
        figures: Vec<String>,
        /// Compare each combination with the reference one, named by
        /// variable values (comma-separated): writes comparisons.parquet.
        #[arg(long, value_delimiter = ',', value_name = "VAR=VALUE,...")]
        reference: Vec<String>,
        /// Label each combination of the other variables with the best
        /// value of --over by this figure: writes labels.parquet.
        #[arg(long, value_name = "FIGURE", requires = "over")]
        best_by: Option<String>,
        /// The variable --best-by chooses a value of.
        #[arg(long, value_name = "VAR", requires = "best_by")]
        over: Option<String>,
        /// With --best-by: the best is the lowest value (default: highest).
        #[arg(long, requires = "best_by")]
        minimize: bool,
    },
    /// Compare two experiments over the same variables, combination by
    /// combination (B relative to A): ratio of means with its 95% interval,
    /// Welch's p-value (Holm-corrected per figure), median, MAD, outliers.
    #[command(after_help = "Examples:
  kernmlops experiment compare experiments/before experiments/after
  kernmlops experiment compare experiments/kernel-6.8 experiments/kernel-6.12 --out k.parquet

Combinations are matched on their variables' values; the table is written to
compare-<A>-<B>.parquet in the current folder (or --out) and printed.")]
    Compare {
        /// The experiment folder compared against (A).
        a: PathBuf,
        /// The experiment folder compared (B).
        b: PathBuf,
        /// Where the table goes [default: ./compare-<A's name>-<B's name>.parquet].
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Make the experiment's [build] current on this node (used by cluster
    /// executors before a node's runs; `run` and `resume` build locally).
    #[command(hide = true)]
    Build {
        /// The experiment folder.
        dir: PathBuf,
    },
    /// Perform exactly one planned run of an experiment folder (used by
    /// cluster executors; `resume` is what users want).
    #[command(hide = true)]
    Exec {
        /// The experiment folder.
        dir: PathBuf,
        /// The run's id (see `experiment status`).
        run_id: String,
        /// Run even if this machine's plugins differ from the recorded ones.
        #[arg(long)]
        allow_plugin_change: bool,
        /// Redo the run if it failed before.
        #[arg(long)]
        retry_failed: bool,
        /// Warm-up runs (not recorded) before the run, on this machine.
        #[arg(long, value_name = "N", default_value_t = 0)]
        warmup: u32,
        /// Refuse to run unless this kernmlops binary has this SHA-256 (the
        /// submitting binary's).
        #[arg(long, value_name = "HEX")]
        binary_sha256: Option<String>,
    },
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The experiment file (TOML).
    pub file: PathBuf,
    /// The experiment folder [default: experiments/<name>-<UTC time>].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Run order, instead of the file's `order` [default: shuffled].
    #[arg(long, value_enum)]
    pub order: Option<OrderArg>,
    /// Print the planned runs and stop (nothing is written).
    #[arg(long)]
    pub dry_run: bool,
    /// Most runs the plan may have, instead of the file's `max_runs`
    /// [default: 100000]; a larger plan is refused before it is built.
    #[arg(long, value_name = "N")]
    pub max_runs: Option<usize>,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(clap::Args, Debug)]
pub struct ResumeArgs {
    /// The experiment folder.
    pub dir: PathBuf,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    /// Repeat each variable combination until the 95% confidence interval
    /// of --metric is within --target of its mean, or --max-repeats runs.
    #[arg(long, requires = "metric")]
    pub adaptive: bool,
    /// The `@result` figure adaptive repeats watch, e.g. read_iops.
    #[arg(long, value_name = "KEY", requires = "adaptive")]
    pub metric: Option<String>,
    /// Largest relative half-width of that interval [default: 0.05].
    #[arg(long, value_name = "FRACTION", requires = "adaptive")]
    pub target: Option<f64>,
    /// Most runs of one combination [default: 10].
    #[arg(long, value_name = "N", requires = "adaptive")]
    pub max_repeats: Option<u32>,
    /// Also redo runs that failed (their data is moved to partial/).
    #[arg(long)]
    pub retry_failed: bool,
    /// Go on although the plugins differ from those the experiment recorded
    /// (the record then lists the new set).
    #[arg(long)]
    pub allow_plugin_change: bool,
    /// Do not render graphs at the end.
    #[arg(long)]
    pub no_graphs: bool,
    #[command(flatten)]
    pub executor: ExecutorArgs,
}

/// Where runs are carried out.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExecutorKind {
    /// One after another on this machine.
    #[default]
    Local,
    /// One Slurm job array, a task per run on an exclusive node.
    Slurm,
}

#[derive(clap::Args, Debug, Clone, Default)]
pub struct ExecutorArgs {
    /// Where runs are carried out: `local` (one after another here) or
    /// `slurm` (submitted as one job array, a task per run on a whole node;
    /// returns at once).
    #[arg(long, value_enum, default_value_t = ExecutorKind::Local)]
    pub executor: ExecutorKind,
    /// With --executor slurm: the partition [default: the cluster's].
    #[arg(long, value_name = "NAME")]
    pub partition: Option<String>,
    /// With --executor slurm: each task's time limit, as sbatch takes it
    /// (MM, MM:SS, HH:MM:SS, D-HH:MM:SS).
    #[arg(long, value_name = "TIME")]
    pub time: Option<String>,
    /// With --executor slurm: one more sbatch option, passed as given
    /// (repeatable), e.g. --sbatch-arg=--account=lab.
    #[arg(long = "sbatch-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub sbatch_args: Vec<String>,
}

/// `--order`.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum OrderArg {
    /// Shuffled with the experiment's seed, so drift over time does not
    /// line up with a variable.
    Shuffled,
    /// Combinations in the order the variables declare them, repeats of
    /// each together.
    Sequential,
}

impl From<OrderArg> for Order {
    fn from(o: OrderArg) -> Self {
        match o {
            OrderArg::Shuffled => Order::Shuffled,
            OrderArg::Sequential => Order::Sequential,
        }
    }
}

impl From<CommonArgs> for CommonOptions {
    fn from(a: CommonArgs) -> Self {
        CommonOptions {
            adaptive: a.adaptive,
            metric: a.metric,
            target: a.target,
            max_repeats: a.max_repeats,
            retry_failed: a.retry_failed,
            allow_plugin_change: a.allow_plugin_change,
            no_graphs: a.no_graphs,
            executor: ExecutorOptions {
                executor: match a.executor.executor {
                    ExecutorKind::Local => exp::ExecutorKind::Local,
                    ExecutorKind::Slurm => exp::ExecutorKind::Slurm,
                },
                partition: a.executor.partition,
                time: a.executor.time,
                sbatch_args: a.executor.sbatch_args,
            },
        }
    }
}
