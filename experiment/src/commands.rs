//! `kernmlops experiment`: run, resume, status, results, and the hidden
//! `exec` that performs one planned run (what a cluster task calls); runs
//! go to the local executor or, with `--executor slurm`, to Slurm.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use serde_json::Value as Json;

use super::{
    executor::{
        perform_run, perform_warmup, Dispatch, Executor, LocalExecutor, RunContext, RunObserver,
    },
    graphs,
    plan::{self, label, Identity, PlanInput, PlannedRun},
    progress::Progress,
    record::{plugin_difference, plugin_set, Adaptive, ExpDir, Lock, Record, FORMAT},
    results::{self, Results},
    slurm::{SlurmExecutor, SlurmOptions, SlurmView},
    spec::{Order, Spec},
    state::{self, Observed, RunState, StateView},
    stats, ExperimentError, Result,
};
use crate::{clock, config::Config, plugin::Registry, trust::Policy};

/// Sweep a benchmark over variables, repeated and shuffled; resume; results.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  kernmlops experiment run examples/experiments/fio_sweep.toml
  kernmlops experiment run sweep.toml --dir experiments/sweep --order sequential
  kernmlops experiment run sweep.toml --adaptive --metric read_iops --target 0.05 --max-repeats 10
  kernmlops experiment status experiments/sweep
  kernmlops experiment resume experiments/sweep
  kernmlops experiment results experiments/sweep
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

In Python: polars.read_parquet(\"experiments/sweep/results.parquet\").
Works while runs are still going: it reads what has finished.")]
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
    pub order: Option<Order>,
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

impl ExecutorArgs {
    /// The Slurm options, refused with the local executor.
    fn slurm(&self) -> Result<Option<SlurmOptions>> {
        let opts = SlurmOptions {
            partition: self.partition.clone(),
            time: self.time.clone(),
            sbatch_args: self.sbatch_args.clone(),
        };
        match self.executor {
            ExecutorKind::Slurm => {
                opts.check()?;
                Ok(Some(opts))
            }
            ExecutorKind::Local => {
                if opts.partition.is_some() || opts.time.is_some() || !opts.sbatch_args.is_empty() {
                    return Err(ExperimentError::Usage(
                        "--partition, --time and --sbatch-arg go with --executor slurm".into(),
                    ));
                }
                Ok(None)
            }
        }
    }
}

/// What the command line gives beyond the subcommand.
#[derive(Debug, Clone)]
pub struct Env {
    /// The global `--config FILE`, merged under the experiment's `[config]`.
    pub config_file: Option<PathBuf>,
    /// The global `--plugin-dir` (or its environment variable), if given.
    pub plugin_flag: Option<PathBuf>,
    /// The plugin folder `kernmlops run` would use, or why there is none.
    pub plugin_dir: std::result::Result<PathBuf, String>,
    /// The global `--allow-insecure-plugins`, passed on to every run.
    pub allow_insecure_plugins: bool,
}

impl Env {
    /// Loads the plugins of `dir` under the trust policy of this process.
    fn registry(&self, dir: &Path) -> Result<Registry> {
        let policy = crate::trust::Policy::for_this_process(self.allow_insecure_plugins);
        Registry::load_dir_with(dir, &policy).map_err(ExperimentError::io(dir))
    }
}

/// Default largest relative half-width for adaptive repeats.
pub const DEFAULT_TARGET: f64 = 0.05;
/// Default most runs per combination for adaptive repeats.
pub const DEFAULT_MAX_REPEATS: u32 = 10;
/// How long a run still carried out by another process is waited for.
const BUSY_WAIT: Duration = Duration::from_secs(60);

/// Runs an `experiment` subcommand.
pub fn main(args: ExperimentArgs, env: &Env) -> Result<ExitCode> {
    match args.command {
        ExperimentCommand::Run(a) => run(a, env),
        ExperimentCommand::Resume(a) => resume(a, env),
        ExperimentCommand::Status { dir, json } => {
            check_folder(&dir, env)?;
            status(&ExpDir::new(dir), json)
        }
        ExperimentCommand::Results {
            dir,
            no_graphs,
            figures,
        } => {
            check_folder(&dir, env)?;
            let dir = ExpDir::new(dir);
            let record = Record::read(&dir)?;
            let plugin_dir = match (no_graphs, resolve_plugin_dir(env, Some(&record))) {
                (true, _) => None,
                (false, Ok(d)) => Some(d),
                (false, Err(e)) => {
                    eprintln!("warning: graphs not drawn: {e}");
                    None
                }
            };
            let draw = plugin_dir.as_deref().map(|d| (env, d));
            report(&dir, &record, draw, &figures)?;
            Ok(ExitCode::SUCCESS)
        }
        ExperimentCommand::Exec {
            dir,
            run_id,
            allow_plugin_change,
            retry_failed,
            warmup,
            binary_sha256,
        } => {
            let dir = ExpDir::new(dir);
            let what = ExecArgs {
                allow: allow_plugin_change,
                retry_failed,
                warmup,
                binary_sha256,
            };
            exec(&dir, &run_id, &what, env).inspect_err(|e| log_error(&dir, &run_id, e))
        }
    }
}

fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).map_err(ExperimentError::io(p))
}

/// The plugin folder: the flag, else the recorded one if it still exists,
/// else the one `kernmlops run` would find.
fn resolve_plugin_dir(env: &Env, record: Option<&Record>) -> Result<PathBuf> {
    if let Some(flag) = &env.plugin_flag {
        return absolute(flag);
    }
    if let Some(r) = record {
        let recorded = PathBuf::from(&r.plugin_dir);
        if recorded.is_dir() {
            return Ok(recorded);
        }
    }
    match &env.plugin_dir {
        Ok(d) => absolute(d),
        Err(e) => Err(ExperimentError::Plugins(e.clone())),
    }
}

fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// The base configuration: `--config FILE` with the experiment's
/// `[config]` merged on top. Each table's commands (`[benchmarks.script]
/// command`) are resolved against the folder of the file that holds them
/// and checked like plugins (`config::resolve_commands`), before the merge.
fn base_config(spec: &Spec, env: &Env, policy: &Policy) -> Result<toml::Table> {
    let mut base = match &env.config_file {
        None => toml::Table::new(),
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(ExperimentError::io(path))?;
            let mut table: toml::Table =
                toml::from_str(&text).map_err(|e: toml::de::Error| ExperimentError::Parse {
                    file: path.display().to_string(),
                    message: e.message().to_owned(),
                })?;
            resolve_table_commands(&mut table, &folder_of(path)?, policy).map_err(|m| {
                ExperimentError::Invalid {
                    file: path.display().to_string(),
                    key: "config".into(),
                    message: m,
                }
            })?;
            table
        }
    };
    let mut own = spec.config.clone();
    resolve_table_commands(&mut own, &folder_of(Path::new(&spec.file))?, policy)
        .map_err(|m| invalid(spec, "config", m))?;
    merge(&mut base, own);
    Ok(base)
}

/// The absolute folder holding `file`.
fn folder_of(file: &Path) -> Result<PathBuf> {
    let file = absolute(file)?;
    Ok(file.parent().unwrap_or(Path::new("/")).to_owned())
}

/// Resolves and checks the command settings of a configuration table (its
/// `benchmarks` section) against `base`; warnings are printed.
fn resolve_table_commands(
    table: &mut toml::Table,
    base: &Path,
    policy: &Policy,
) -> std::result::Result<(), String> {
    let Some(toml::Value::Table(benchmarks)) = table.get_mut("benchmarks") else {
        return Ok(());
    };
    let sections = benchmarks.iter_mut().filter_map(|(name, v)| match v {
        toml::Value::Table(t) => Some((name, t)),
        _ => None,
    });
    for warning in crate::config::resolve_commands(sections, base, policy)? {
        eprintln!("warning: {}", crate::trust::printable(warning.as_bytes()));
    }
    Ok(())
}

/// Resolves and checks the commands variables set (a variable whose key is
/// a command setting, or a benchmark's whole table holding one), in each
/// of their levels, against the experiment file's folder: the plan, its
/// run ids and the record then hold the checked files' absolute paths.
fn resolve_variable_commands(
    spec: &Spec,
    variables: &mut [super::spec::Variable],
    policy: &Policy,
) -> Result<()> {
    let base = folder_of(Path::new(&spec.file))?;
    for var in variables.iter_mut() {
        for (bench, key) in crate::config::COMMAND_SETTINGS {
            let whole = format!("benchmarks.{bench}");
            let one = format!("{whole}.{key}");
            if var.key != whole && var.key != one {
                continue;
            }
            for level in &mut var.levels {
                let Some(mut value) = super::spec::json_to_toml(&level.value) else {
                    continue;
                };
                let target = if var.key == one {
                    Some(&mut value)
                } else {
                    value.as_table_mut().and_then(|t| t.get_mut(*key))
                };
                let Some(target) = target else {
                    continue;
                };
                let warnings =
                    crate::config::resolve_command(target, &base, policy).map_err(|m| {
                        invalid(
                            spec,
                            &format!("variables.{}", var.name),
                            format!("{one}: {m}"),
                        )
                    })?;
                for w in warnings {
                    eprintln!("warning: {}", crate::trust::printable(w.as_bytes()));
                }
                level.value = super::spec::toml_to_json(&value);
            }
        }
    }
    Ok(())
}

/// What a run is checked with besides its configuration: the probes it
/// runs, its benchmark and its power sources.
struct Checked<'a> {
    probes: &'a [String],
    benchmark: &'a str,
    power: Option<&'a [String]>,
}

/// Checks one configuration as `kernmlops run` will, from the text it is
/// given (no file is written): its keys and types, every probe's and
/// benchmark's settings, the component rules (`check_config`) of the
/// configured components, the run's probes and its benchmark, and the power
/// options. The host's message.
fn check_config(
    registry: &Registry,
    config: &toml::Table,
    run: &Checked<'_>,
) -> std::result::Result<Config, String> {
    const SOURCE: &str = "the run's configuration";
    let text = toml::to_string(config).map_err(|e| e.to_string())?;
    let strip = |e: String| {
        let prefix = format!("{SOURCE}: ");
        e.strip_prefix(&prefix).map(str::to_owned).unwrap_or(e)
    };
    let cfg = Config::from_text(SOURCE, text.as_bytes()).map_err(|e| strip(e.to_string()))?;
    cfg.probe_settings(registry.config_defaults())
        .map_err(|e| strip(e.to_string()))?;
    cfg.benchmark_settings(registry.benchmark_defaults())
        .map_err(|e| strip(e.to_string()))?;
    let benchmarks = [run.benchmark.to_owned()];
    crate::settings_rules::check_all(&cfg, registry, run.probes, &benchmarks)
        .map_err(|e| strip(e.to_string()))?;
    let declared = crate::power::registry::PowerSources::of(registry).defaults();
    let power = cfg
        .power_settings(declared.iter().map(|(n, t)| (n.as_str(), t.as_str())))
        .map_err(|e| strip(e.to_string()))?;
    crate::power::PowerOptions::new(&cfg.power, run.power, None, Config::settings_json(&power))
        .map_err(|e| strip(e.to_string()))?;
    Ok(cfg)
}

/// The folder a new experiment goes to: `experiments/<name>-<UTC time>`.
fn default_dir(name: &str) -> PathBuf {
    let stamp = clock::compact_stamp(clock::unix_us());
    let base = PathBuf::from("experiments").join(format!("{name}-{stamp}"));
    let mut dir = base.clone();
    let mut n = 2;
    while dir.exists() {
        dir = PathBuf::from(format!("{}-{n}", base.display()));
        n += 1;
    }
    dir
}

fn adaptive_of(common: &CommonArgs, repeats: u32) -> Result<Option<Adaptive>> {
    if !common.adaptive {
        return Ok(None);
    }
    let metric = common.metric.clone().unwrap_or_default();
    let metric = metric.strip_prefix("result_").unwrap_or(&metric).to_owned();
    let target = common.target.unwrap_or(DEFAULT_TARGET);
    if !(target > 0.0 && target.is_finite()) {
        return Err(ExperimentError::Usage(format!(
            "--target {target}: must be a positive fraction such as 0.05"
        )));
    }
    let max_repeats = common
        .max_repeats
        .unwrap_or(DEFAULT_MAX_REPEATS.max(repeats));
    if max_repeats < 2 {
        return Err(ExperimentError::Usage(
            "--max-repeats: at least 2 (an interval needs two runs)".into(),
        ));
    }
    if max_repeats > super::spec::MAX_REPEATS {
        return Err(ExperimentError::Usage(format!(
            "--max-repeats {max_repeats}: at most {}",
            super::spec::MAX_REPEATS
        )));
    }
    Ok(Some(Adaptive {
        metric,
        target,
        max_repeats,
    }))
}

fn install_signals() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // A second signal exits at once (the running `kernmlops run` is
        // told to stop as this process dies).
        signal_hook::flag::register_conditional_shutdown(sig, 130, stop.clone())
            .and_then(|_| signal_hook::flag::register(sig, stop.clone()))
            .map_err(|e| ExperimentError::Usage(format!("installing signal handlers: {e}")))?;
    }
    Ok(stop)
}

/// Checks a file the experiment takes commands from like a plugin (see
/// `trust::check_instructions`): refused in one line when others could
/// change it, or used with a warning under `--allow-insecure-plugins`.
fn check_trusted(path: &Path, what: &str, env: &Env) -> Result<()> {
    let policy = crate::trust::Policy::for_this_process(env.allow_insecure_plugins);
    let checked = crate::trust::check_instructions(path, what, &policy);
    if let Some(warning) = checked.map_err(ExperimentError::Usage)? {
        eprintln!("warning: {warning}");
    }
    Ok(())
}

/// Reads the record of an experiment whose runs this process carries out:
/// the record holds each run's configuration, and so the commands a
/// `script` benchmark runs as root.
fn read_trusted_record(dir: &ExpDir, env: &Env) -> Result<Record> {
    check_trusted(&dir.record(), "the experiment record", env)?;
    Record::read(dir)
}

/// Refuses an experiment folder another user owns or others can write
/// (and any folder above it), like a plugin folder, in one line with the
/// fix; under `--allow-insecure-plugins`, a warning. A folder that cannot
/// be opened passes: the command's own reading says why.
fn check_folder(root: &Path, env: &Env) -> Result<()> {
    use crate::trust::TrustError;
    let policy = Policy::for_this_process(env.allow_insecure_plugins);
    match crate::trust::check_dir_path(root, &policy) {
        Ok(()) | Err(TrustError::Io { .. }) => Ok(()),
        Err(e @ (TrustError::Writable { .. } | TrustError::Owner { .. }))
            if policy.allow_insecure =>
        {
            eprintln!(
                "warning: using experiment folder {} although {e} (--allow-insecure-plugins)",
                crate::trust::printable(root.as_os_str().as_encoded_bytes())
            );
            Ok(())
        }
        Err(e) => Err(ExperimentError::Usage(format!(
            "refusing experiment folder {}: {e}",
            crate::trust::printable(root.as_os_str().as_encoded_bytes())
        ))),
    }
}

/// Whether a folder without a record holds only what an interrupted start
/// of `experiment run` leaves (killed, or a full disk, before the record
/// was written): the layout's sub-folders with no collection or log, the
/// experiment lock, the copied experiment file and base configuration, run
/// configurations and temporary files of atomic writes. Such a folder is
/// started again as if it were empty.
fn only_start_leftovers(root: &Path) -> Result<bool> {
    let temporary = |n: &str| n.starts_with('.') || n.contains(".tmp");
    let names = |d: &Path| -> Result<Vec<String>> {
        std::fs::read_dir(d)
            .map_err(ExperimentError::io(d))?
            .map(|e| {
                e.map(|e| e.file_name().to_string_lossy().into_owned())
                    .map_err(ExperimentError::io(d))
            })
            .collect()
    };
    for name in names(root)? {
        let path = root.join(&name);
        let is_dir = path.symlink_metadata().is_ok_and(|m| m.is_dir());
        let ok = match name.as_str() {
            "experiment.toml" | "config.toml" => !is_dir,
            "locks" if is_dir => names(&path)?
                .iter()
                .all(|n| n == "experiment.lock" || temporary(n)),
            "configs" if is_dir => names(&path)?
                .iter()
                .all(|n| n.ends_with(".toml") || temporary(n)),
            "runs" | "logs" if is_dir => names(&path)?.is_empty(),
            n => !is_dir && temporary(n),
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Creates the folder of a new experiment (not its contents) and checks
/// it; a folder it created and refused is removed again.
fn create_folder(root: &Path, env: &Env) -> Result<()> {
    let existed = root.exists();
    std::fs::create_dir_all(root).map_err(ExperimentError::io(root))?;
    check_folder(root, env).inspect_err(|_| {
        if !existed {
            let _ = std::fs::remove_dir(root);
        }
    })
}

fn run(args: RunArgs, env: &Env) -> Result<ExitCode> {
    let slurm = args.common.executor.slurm()?;
    let policy = Policy::for_this_process(env.allow_insecure_plugins);
    check_trusted(&args.file, "the experiment file", env)?;
    let spec = Spec::load(&args.file)?;
    let max_runs = match args.max_runs {
        Some(n) if n == 0 || n > super::spec::MAX_RUNS_CEILING => {
            return Err(ExperimentError::Usage(format!(
                "--max-runs {n}: give 1 to {}",
                super::spec::MAX_RUNS_CEILING
            )))
        }
        Some(n) => n,
        None => spec.max_runs,
    };
    // Counted before anything is built or checked.
    plan::check_size(&spec.file, &spec.variables, spec.repeats, max_runs)?;
    let dir = ExpDir::new(args.dir.clone().unwrap_or_else(|| default_dir(&spec.name)));
    if dir.root.exists() {
        check_folder(&dir.root, env)?;
    }
    let existing = if dir.record().is_file() {
        Some(read_trusted_record(&dir, env)?)
    } else {
        if dir.root.is_dir() && !only_start_leftovers(&dir.root)? {
            return Err(ExperimentError::Usage(format!(
                "--dir {}: the folder exists, holds other files and is not an experiment folder (no experiment.json); choose a new or empty folder",
                dir.root.display()
            )));
        }
        None
    };
    let plugin_dir = resolve_plugin_dir(env, None)?;
    let registry = env.registry(&plugin_dir)?;
    for (path, e) in &registry.failures {
        eprintln!("warning: plugin {} refused: {e}", path.display());
    }
    registry
        .find_benchmark(&spec.benchmark)
        .map_err(|m| invalid(&spec, "benchmark", m))?;
    if let Some(power) = &spec.power {
        crate::power::check_selection(&registry, power)
            .map_err(|e| invalid(&spec, "power", e.to_string()))?;
    }
    let base = base_config(&spec, env, &policy)?;
    let mut variables = spec.variables.clone();
    resolve_variable_commands(&spec, &mut variables, &policy)?;
    let benchmark_only = Checked {
        probes: spec.probes.as_deref().unwrap_or(&[]),
        benchmark: &spec.benchmark,
        power: spec.power.as_deref(),
    };
    let cfg =
        check_config(&registry, &base, &benchmark_only).map_err(|m| invalid(&spec, "config", m))?;
    let probes = spec
        .probes
        .clone()
        .unwrap_or_else(|| cfg.collect.plugins.clone());
    registry
        .resolve(&probes)
        .map_err(|m| invalid(&spec, "probes", m))?;
    let identity = Identity {
        benchmark: spec.benchmark.clone(),
        probes,
        power: spec.power.clone(),
    };
    let (seed, seed_from) = match (spec.seed, &existing) {
        (Some(s), _) => (s, "file"),
        (None, Some(r)) => (r.seed, r.seed_from.as_str()),
        (None, None) => (super::rng::random_seed(), "random"),
    };
    let order = args.order.unwrap_or(spec.order);
    let mut runs = plan::plan(&PlanInput {
        file: &spec.file,
        variables: &variables,
        base: &base,
        identity: &identity,
        repeats: spec.repeats,
        seed,
        order,
    })?;
    // Adaptive repeats added earlier stay planned while their combination
    // exists.
    if let Some(r) = &existing {
        let mut first_of: std::collections::HashMap<&str, usize> = Default::default();
        for (i, x) in runs.iter().enumerate() {
            first_of.entry(x.combo_id.as_str()).or_insert(i);
        }
        let mut ids: std::collections::HashSet<String> =
            runs.iter().map(|x| x.run_id.clone()).collect();
        let mut again = Vec::new();
        for extra in r.runs.iter().filter(|x| x.repeat >= spec.repeats) {
            if let Some(&i) = first_of.get(extra.combo_id.as_str()) {
                let more = runs[i].another_repeat(&identity, extra.repeat, seed);
                if ids.insert(more.run_id.clone()) {
                    again.push(more);
                }
            }
        }
        runs.extend(again);
    }
    // Each distinct configuration, checked once as the host will check
    // it (keys, types, each component's rules, power), before anything is
    // written.
    let checked_run = Checked {
        probes: &identity.probes,
        benchmark: &identity.benchmark,
        power: identity.power.as_deref(),
    };
    let mut seen = std::collections::HashSet::new();
    for r in &runs {
        if !seen.insert(r.combo_id.as_str()) {
            continue;
        }
        let Some(toml::Value::Table(config)) = super::spec::json_to_toml(&r.config) else {
            continue;
        };
        if let Err(m) = check_config(&registry, &config, &checked_run) {
            // Name the variable whose key the host complains about.
            let culprit = variables
                .iter()
                .filter(|v| {
                    m.contains(&v.key) || v.key.starts_with(m.split(':').next().unwrap_or("\u{0}"))
                })
                .max_by_key(|v| v.key.len());
            return Err(match culprit {
                Some(v) => invalid(
                    &spec,
                    &format!("variables.{}", v.name),
                    format!("key {}: {m}", v.key),
                ),
                None => invalid(
                    &spec,
                    "config",
                    format!("{m} (in the run {})", label(&variables, &r.variables)),
                ),
            });
        }
    }

    if args.dry_run {
        print_plan(
            &spec, &variables, &runs, seed, seed_from, order, &identity, &dir,
        );
        return Ok(ExitCode::SUCCESS);
    }
    // Slurm missing, or refusing these options: said before anything is
    // written.
    if let Some(options) = slurm {
        slurm_executor(options, spec.warmup, &args.common).preflight(runs.len())?;
    }
    let adaptive = match adaptive_of(&args.common, spec.repeats)? {
        Some(a) => Some(a),
        None => existing.as_ref().and_then(|r| r.adaptive.clone()),
    };
    let plugins = plugin_set(&plugin_dir)?;
    if let Some(r) = &existing {
        check_plugins(r, &plugins, args.common.allow_plugin_change)?;
    }

    // The record first, atomically, before anything else marks the folder
    // as an experiment: a start cut off before it leaves a folder `run
    // --dir` starts again (only_start_leftovers), one cut off after it a
    // folder `resume` carries on.
    create_folder(&dir.root, env)?;
    let locks = dir.locks();
    std::fs::create_dir_all(&locks).map_err(ExperimentError::io(&locks))?;
    let _lock = experiment_lock(&dir)?;
    let now = clock::rfc3339(clock::unix_us());
    let record = Record {
        format: FORMAT,
        name: spec.name.clone(),
        created_utc: existing
            .as_ref()
            .map_or_else(|| now.clone(), |r| r.created_utc.clone()),
        updated_utc: now,
        kernmlops_version: env!("CARGO_PKG_VERSION").to_owned(),
        kernmlops_sha256: std::env::current_exe()
            .ok()
            .and_then(|exe| super::record::sha256_file(&exe).ok())
            .unwrap_or_default(),
        source_file: absolute(&args.file)?.display().to_string(),
        identity,
        seed,
        seed_from: seed_from.to_owned(),
        order,
        repeats: spec.repeats,
        warmup: spec.warmup,
        variables,
        plugin_dir: plugin_dir.display().to_string(),
        plugins,
        adaptive,
        runs,
    };
    record.write(&dir)?;
    dir.create()?;
    super::record::write_atomic(&dir.experiment_file(), spec.text.as_bytes())?;
    let base_text = toml::to_string_pretty(&base).unwrap_or_default();
    super::record::write_atomic(
        &dir.base_config(),
        format!(
            "# The base configuration of experiment {}: {}[config] of the experiment file.\n# Each run's own configuration (with its variables set) is configs/<run_id>.toml.\n{base_text}",
            spec.name,
            env.config_file
                .as_ref()
                .map_or(String::new(), |f| format!("{} with ", f.display()))
        )
        .as_bytes(),
    )?;
    for r in &record.runs {
        write_run_config(&dir, r)?;
    }
    eprintln!(
        "experiment {} in {}: {} runs, order {}, seed {}{}",
        record.name,
        dir.root.display(),
        record.runs.len(),
        order_name(order),
        seed,
        if seed_from == "random" {
            " (random, recorded)"
        } else {
            ""
        }
    );
    drive(&dir, record, &plugin_dir, &args.common, env)
}

fn order_name(o: Order) -> &'static str {
    match o {
        Order::Shuffled => "shuffled",
        Order::Sequential => "sequential",
    }
}

fn invalid(spec: &Spec, key: &str, message: String) -> ExperimentError {
    ExperimentError::Invalid {
        file: spec.file.clone(),
        key: key.to_owned(),
        message,
    }
}

fn write_run_config(dir: &ExpDir, run: &PlannedRun) -> Result<()> {
    let text = super::spec::json_to_toml(&run.config)
        .and_then(|v| toml::to_string_pretty(&v).ok())
        .unwrap_or_default();
    super::record::write_atomic(&dir.config(&run.run_id), text.as_bytes())
}

#[allow(clippy::too_many_arguments)]
fn print_plan(
    spec: &Spec,
    variables: &[super::spec::Variable],
    runs: &[PlannedRun],
    seed: u64,
    seed_from: &str,
    order: Order,
    identity: &Identity,
    dir: &ExpDir,
) {
    let combos: std::collections::BTreeSet<&str> =
        runs.iter().map(|r| r.combo_id.as_str()).collect();
    crate::outln!(
        "experiment {}: {} runs ({} combinations), benchmark {}, probes {}, order {}, seed {}{}",
        spec.name,
        runs.len(),
        combos.len(),
        identity.benchmark,
        if identity.probes.is_empty() {
            "none (baseline)".to_owned()
        } else {
            identity.probes.join(",")
        },
        order_name(order),
        seed,
        if seed_from == "random" {
            " (random: set seed = N in the file to keep it)"
        } else {
            ""
        }
    );
    crate::outln!("folder: {}", dir.root.display());
    let width = runs.len().to_string().len();
    for (i, r) in runs.iter().enumerate() {
        crate::outln!(
            "  {:>width$}  {}  repeat {}  {}",
            i + 1,
            r.run_id,
            r.repeat,
            label(variables, &r.variables)
        );
    }
}

fn experiment_lock(dir: &ExpDir) -> Result<Lock> {
    match Lock::try_take(&dir.experiment_lock())? {
        Ok(l) => Ok(l),
        Err(holder) => Err(ExperimentError::Busy {
            what: dir.root.display().to_string(),
            holder,
        }),
    }
}

fn check_plugins(record: &Record, here: &[super::record::PluginHash], allow: bool) -> Result<()> {
    match plugin_difference(&record.plugins, here) {
        Some(diff) if !allow => Err(ExperimentError::PluginsChanged(diff)),
        Some(diff) => {
            eprintln!("warning: plugins differ from the experiment's record: {diff}");
            Ok(())
        }
        None => Ok(()),
    }
}

fn context(
    dir: &ExpDir,
    record: &Record,
    plugin_dir: &Path,
    common: &CommonArgs,
    env: &Env,
    stop: Arc<AtomicBool>,
) -> Result<RunContext> {
    Ok(RunContext {
        dir: dir.clone(),
        exe: std::env::current_exe().map_err(ExperimentError::io("/proc/self/exe"))?,
        plugin_dir: plugin_dir.to_owned(),
        identity: record.identity.clone(),
        stop,
        retry_failed: common.retry_failed,
        busy_wait: BUSY_WAIT,
        allow_insecure_plugins: env.allow_insecure_plugins,
    })
}

fn resume(args: ResumeArgs, env: &Env) -> Result<ExitCode> {
    let slurm = args.common.executor.slurm()?;
    check_folder(&args.dir, env)?;
    let dir = ExpDir::new(args.dir);
    let mut record = read_trusted_record(&dir, env)?;
    let plugin_dir = resolve_plugin_dir(env, Some(&record))?;
    if let Some(options) = slurm {
        slurm_executor(options, record.warmup, &args.common).preflight(record.runs.len())?;
    }
    dir.create()?;
    let _lock = experiment_lock(&dir)?;
    let plugins = plugin_set(&plugin_dir)?;
    check_plugins(&record, &plugins, args.common.allow_plugin_change)?;
    let mut changed = false;
    if record.plugins != plugins {
        record.plugins = plugins;
        changed = true;
    }
    if let Some(a) = adaptive_of(&args.common, record.repeats)? {
        record.adaptive = Some(a);
        changed = true;
    }
    if record.plugin_dir != plugin_dir.display().to_string() {
        record.plugin_dir = plugin_dir.display().to_string();
        changed = true;
    }
    if changed {
        record.updated_utc = clock::rfc3339(clock::unix_us());
        record.write(&dir)?;
    }
    eprintln!(
        "experiment {} in {}: resuming",
        record.name,
        dir.root.display()
    );
    drive(&dir, record, &plugin_dir, &args.common, env)
}

/// Carries out what is missing (plus adaptive repeats), then writes and
/// prints the results.
fn drive(
    dir: &ExpDir,
    mut record: Record,
    plugin_dir: &Path,
    common: &CommonArgs,
    env: &Env,
) -> Result<ExitCode> {
    let stop = install_signals()?;
    let ctx = context(dir, &record, plugin_dir, common, env, stop.clone())?;
    let mut progress = Progress::new(&record.variables);
    let mut executor: Box<dyn Executor> = match common.executor.slurm()? {
        Some(options) => Box::new(slurm_executor(options, record.warmup, common)),
        None => Box::new(LocalExecutor),
    };
    let local = executor.name() == "local";
    let observed = observe(dir, &record).1;
    // Runs still going in another process (a `kernmlops run` finishing
    // after its experiment was killed) are waited for, then redone if they
    // were cut off. Runs Slurm has queued or running are left to it.
    let todo: Vec<PlannedRun> = record
        .runs
        .iter()
        .zip(&observed)
        .filter(|(_, o)| {
            o.needs_run(common.retry_failed) || (local && o.state == RunState::Running)
        })
        .map(|(r, _)| r.clone())
        .collect();
    let already = record.runs.len() - todo.len();
    if already > 0 {
        eprintln!(
            "{already} of {} runs need nothing more (done, or failed with their data kept); {} to do",
            record.runs.len(),
            todo.len()
        );
    }
    let waiting = observed
        .iter()
        .filter(|o| matches!(o.state, RunState::Queued | RunState::Running))
        .count();
    if !local && todo.is_empty() && waiting > 0 {
        eprintln!(
            "nothing to submit: {waiting} run(s) are queued or running (see `kernmlops experiment status {}`)",
            dir.root.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    // Slurm tasks warm up on their own nodes.
    if let Some(first) = todo.first().filter(|_| local) {
        for n in 1..=record.warmup {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            progress.note(&format!("warm-up {n}/{} (not recorded)", record.warmup));
            let mut tick = || progress.tick();
            let status = perform_warmup(&ctx, first, n, &mut tick)?;
            if !status.success() {
                progress.note(&format!("warning: warm-up {n} ended with {status}"));
            }
        }
    }
    let dispatched =
        execute(executor.as_mut(), &ctx, &todo, &mut progress).map_err(|e| plan_kept(dir, e))?;
    if let Some((id, n)) = dispatched {
        progress.finish();
        print_submitted(dir, &id, n);
        return Ok(ExitCode::SUCCESS);
    }

    // Adaptive repeats: one more run for each combination whose interval
    // is still too wide, round after round.
    if let Some(a) = record.adaptive.clone() {
        let mut round = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let observed = observe(dir, &record).1;
            let results = Results::collect(dir, &record, &observed);
            let column = format!("result_{}", a.metric);
            if results.rows > 0 && results.column(&column).is_none() {
                progress.finish();
                // Not kept for resume: the setting is wrong, not pending.
                record.adaptive = None;
                results.write(dir)?;
                record.write(dir)?;
                return Err(ExperimentError::Usage(format!(
                    "--metric {}: no run reported @result.{} (reported: {}); the runs so far are done and in the results",
                    a.metric,
                    a.metric,
                    results.result_keys().join(", ")
                )));
            }
            let mut extra = Vec::new();
            for (combo_id, rows) in results::groups(&results) {
                let planned: Vec<&PlannedRun> = record
                    .runs
                    .iter()
                    .filter(|r| r.combo_id == combo_id)
                    .collect();
                let values = results::values(&results, &column, &rows);
                if planned.len() < a.max_repeats as usize
                    && stats::needs_more(&values, a.target, usize::MAX)
                {
                    let next = planned.iter().map(|r| r.repeat).max().unwrap_or(0) + 1;
                    extra.push(planned[0].another_repeat(&record.identity, next, record.seed));
                }
            }
            if extra.is_empty() {
                break;
            }
            round += 1;
            if record.order == Order::Shuffled {
                super::rng::shuffle(&mut extra, record.seed ^ round.wrapping_mul(0x9E37_79B9));
            }
            progress.note(&format!(
                "adaptive round {round}: {} combination(s) above ±{:.1}% on {}",
                extra.len(),
                a.target * 100.0,
                a.metric
            ));
            for r in &extra {
                write_run_config(dir, r)?;
            }
            record.runs.extend(extra.iter().cloned());
            record.updated_utc = clock::rfc3339(clock::unix_us());
            record.write(dir)?;
            let dispatched = execute(executor.as_mut(), &ctx, &extra, &mut progress)
                .map_err(|e| plan_kept(dir, e))?;
            if let Some((id, n)) = dispatched {
                progress.finish();
                print_submitted(dir, &id, n);
                crate::outln!(
                    "adaptive repeats go on with `kernmlops experiment resume {} --executor slurm` once these are done",
                    dir.root.display()
                );
                return Ok(ExitCode::SUCCESS);
            }
        }
    }
    progress.finish();
    let stopped = stop.load(Ordering::Relaxed);
    let draw = (!common.no_graphs).then_some((env, plugin_dir));
    let code = report(dir, &record, draw, &[])?;
    if stopped {
        eprintln!(
            "stopped by a signal; carry on with `kernmlops experiment resume {}`",
            dir.root.display()
        );
        return Ok(ExitCode::from(130));
    }
    Ok(code)
}

/// Runs `runs` with `executor`; the job id and run count when a scheduler
/// took them.
fn execute(
    executor: &mut dyn Executor,
    ctx: &RunContext,
    runs: &[PlannedRun],
    observer: &mut dyn RunObserver,
) -> Result<Option<(String, usize)>> {
    if runs.is_empty() {
        return Ok(None);
    }
    Ok(match executor.execute(ctx, runs, observer)? {
        Dispatch::Completed(_) => None,
        Dispatch::Submitted { id, runs } => Some((id, runs)),
    })
}

/// A refused submission's error, saying how to submit the kept plan.
fn plan_kept(dir: &ExpDir, e: ExperimentError) -> ExperimentError {
    match e {
        ExperimentError::SlurmRefused(m) => ExperimentError::SlurmRefused(format!(
            "{m}; the plan is kept: `kernmlops experiment resume {} --executor slurm` submits it",
            dir.root.display()
        )),
        e => e,
    }
}

fn slurm_executor(options: SlurmOptions, warmup: u32, common: &CommonArgs) -> SlurmExecutor {
    SlurmExecutor {
        options,
        warmup,
        allow_plugin_change: common.allow_plugin_change,
    }
}

/// What was submitted, and how to follow it.
fn print_submitted(dir: &ExpDir, id: &str, runs: usize) {
    let d = dir.root.display();
    crate::outln!(
        "submitted {runs} run{} to Slurm as job {id} (an array task per run, each on a whole node)",
        if runs == 1 { "" } else { "s" }
    );
    crate::outln!("follow:  kernmlops experiment status {d}   (squeue --jobs {id})");
    crate::outln!("results: kernmlops experiment results {d}   (what has finished so far)");
    crate::outln!("redo what died: kernmlops experiment resume {d} --executor slurm");
}

/// Every planned run's state: the folder's, refined by Slurm's view when
/// runs were submitted to Slurm.
fn observe(dir: &ExpDir, record: &Record) -> (Option<SlurmView>, Vec<Observed>) {
    let view = SlurmView::load(dir);
    let views: Vec<&dyn StateView> = view.iter().map(|v| v as &dyn StateView).collect();
    let observed = state::observe(dir, record, &views);
    (view, observed)
}

/// Writes the results (and graphs), prints the summary; failure when runs
/// are missing or failed.
fn report(
    dir: &ExpDir,
    record: &Record,
    draw: Option<(&Env, &Path)>,
    only: &[String],
) -> Result<ExitCode> {
    let observed = observe(dir, record).1;
    let results = Results::collect(dir, record, &observed);
    results.write(dir)?;
    let counts = state::counts(&observed);
    let count_text: Vec<String> = counts
        .iter()
        .map(|(s, n)| format!("{n} {}", s.as_str()))
        .collect();
    crate::outln!(
        "experiment {} in {}: {} runs: {}",
        record.name,
        dir.root.display(),
        record.runs.len(),
        count_text.join(", ")
    );
    crate::outln!(
        "results: {} ({} row{}), {}",
        dir.results_parquet().display(),
        results.rows,
        if results.rows == 1 { "" } else { "s" },
        dir.results_arrow().display()
    );
    if let (Some((env, plugin_dir)), true) = (draw, results.rows > 0) {
        match env
            .registry(plugin_dir)
            .and_then(|r| graphs::render(&r, dir))
        {
            Ok(files) => {
                crate::outln!("graphs: {} ({} files)", dir.graphs().display(), files.len())
            }
            Err(e) => eprintln!("warning: graphs not drawn: {e}"),
        }
    }
    let stale = state::stale(dir, record);
    if !stale.is_empty() {
        crate::outln!(
            "note: {} collection(s) in {} belong to an earlier version of the experiment and are left out",
            stale.len(),
            dir.runs().display()
        );
    }
    let mut summaries = results::summarize(record, &results);
    if !only.is_empty() {
        let known: Vec<String> = results::figure_columns(&results)
            .iter()
            .map(|c| c.name.trim_start_matches("result_").to_owned())
            .collect();
        if let Some(bad) = only.iter().find(|f| !known.contains(f)) {
            return Err(ExperimentError::Usage(format!(
                "--figures {bad}: no such numeric figure (known: {})",
                known.join(", ")
            )));
        }
        for s in &mut summaries {
            s.figures
                .retain(|(c, _)| only.iter().any(|f| f == c.trim_start_matches("result_")));
        }
    }
    if !summaries.is_empty() {
        crate::outln!();
        crate::out!("{}", results::render(&summaries));
    }
    let unfinished = observed
        .iter()
        .filter(|o| o.state != RunState::Done)
        .count();
    // Runs still under way (a Slurm array) are not a failure of the
    // results: they are read again next time.
    let under_way = observed
        .iter()
        .filter(|o| matches!(o.state, RunState::Queued | RunState::Running))
        .count();
    Ok(if unfinished == 0 {
        ExitCode::SUCCESS
    } else if unfinished == under_way {
        crate::outln!(
            "note: {under_way} of {} runs are still queued or running; `kernmlops experiment results {}` again reads them once done",
            record.runs.len(),
            dir.root.display()
        );
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "error: {unfinished} of {} runs are not done (see `kernmlops experiment status {}`)",
            record.runs.len(),
            dir.root.display()
        );
        ExitCode::FAILURE
    })
}

fn status(dir: &ExpDir, json: bool) -> Result<ExitCode> {
    let record = Record::read(dir)?;
    let (view, observed) = observe(dir, &record);
    let counts = state::counts(&observed);
    if json {
        let runs: Vec<Json> = record
            .runs
            .iter()
            .zip(&observed)
            .map(|(r, o)| {
                let mut run = serde_json::json!({
                    "run_id": r.run_id,
                    "combo_id": r.combo_id,
                    "repeat": r.repeat,
                    "variables": r.variables,
                    "state": o.state,
                    "detail": o.detail,
                });
                if let Some(task) = view.as_ref().and_then(|v| v.task_of(&r.run_id)) {
                    run["slurm_task"] = Json::from(task);
                }
                run
            })
            .collect();
        let counts: BTreeMap<&str, usize> = counts.iter().map(|(s, n)| (s.as_str(), *n)).collect();
        let mut doc = serde_json::json!({
            "name": record.name,
            "dir": dir.root.display().to_string(),
            "runs": runs,
            "counts": counts,
            "stale": state::stale(dir, &record),
        });
        if let Some(v) = &view {
            doc["slurm"] = serde_json::json!({
                "jobs": v.jobs,
                "unavailable": v.unavailable,
                "no_history": v.no_history,
            });
        }
        crate::outln!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return Ok(ExitCode::SUCCESS);
    }
    let count_text: Vec<String> = counts
        .iter()
        .map(|(s, n)| format!("{n} {}", s.as_str()))
        .collect();
    crate::outln!(
        "experiment {} in {}: {} runs: {}",
        record.name,
        dir.root.display(),
        record.runs.len(),
        count_text.join(", ")
    );
    if let Some(v) = &view {
        match &v.unavailable {
            Some(why) => {
                crate::outln!(
                    "note: Slurm could not be asked ({why}); states from the folder alone"
                )
            }
            None => crate::outln!("{}", super::slurm::describe(v)),
        }
    }
    let labels: Vec<String> = record
        .runs
        .iter()
        .map(|r| {
            format!("{} #{}", label(&record.variables, &r.variables), r.repeat)
                .trim()
                .to_owned()
        })
        .collect();
    let width = labels.iter().map(String::len).max().unwrap_or(9).max(9);
    let n = record.runs.len().to_string().len().max(1);
    crate::outln!(
        "  {:>n$}  {:<12}  {:<8}  {:<width$}  detail",
        "#",
        "run_id",
        "state",
        "variables"
    );
    for (i, ((r, o), l)) in record.runs.iter().zip(&observed).zip(&labels).enumerate() {
        crate::outln!(
            "  {:>n$}  {:<12}  {:<8}  {l:<width$}  {}",
            i + 1,
            r.run_id,
            o.state.as_str(),
            o.detail
        );
    }
    let stale = state::stale(dir, &record);
    if !stale.is_empty() {
        crate::outln!(
            "{} collection(s) in runs/ are not in the plan (an earlier version of the experiment): {}",
            stale.len(),
            stale.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// What `experiment exec` is asked beyond the run.
struct ExecArgs {
    allow: bool,
    retry_failed: bool,
    warmup: u32,
    binary_sha256: Option<String>,
}

/// Appends a failed `exec`'s error to the run's log, where the folder's
/// view of the run finds it (a node whose plugins differ, say).
fn log_error(dir: &ExpDir, run_id: &str, e: &ExperimentError) {
    if matches!(
        e,
        ExperimentError::NotAnExperiment { .. } | ExperimentError::UnknownRun { .. }
    ) {
        return;
    }
    let log = dir.log(run_id);
    let line = format!(
        "== {} on {}: experiment exec {run_id}\nerror: {}\n",
        clock::rfc3339(clock::unix_us()),
        super::record::hostname(),
        crate::trust::printable(e.to_string().as_bytes())
    );
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
}

fn exec(dir: &ExpDir, run_id: &str, what: &ExecArgs, env: &Env) -> Result<ExitCode> {
    let (allow, retry_failed) = (what.allow, what.retry_failed);
    let record = read_trusted_record(dir, env)?;
    let run = record
        .find(run_id)
        .ok_or_else(|| ExperimentError::UnknownRun {
            dir: dir.root.display().to_string(),
            run_id: run_id.to_owned(),
        })?
        .clone();
    if let Some(want) = &what.binary_sha256 {
        let exe = std::env::current_exe().map_err(ExperimentError::io("/proc/self/exe"))?;
        let have = super::record::sha256_file(&exe)?;
        if !have.eq_ignore_ascii_case(want) {
            return Err(ExperimentError::BinaryChanged(format!(
                "this machine's kernmlops ({}, SHA-256 {}) is not the binary that submitted the run ({}); install the same build on every node",
                exe.display(),
                &have[..12.min(have.len())],
                &want[..12.min(want.len())]
            )));
        }
    }
    let plugin_dir = resolve_plugin_dir(env, Some(&record))?;
    check_plugins(&record, &plugin_set(&plugin_dir)?, allow)?;
    let stop = install_signals()?;
    let common = CommonArgs {
        adaptive: false,
        metric: None,
        target: None,
        max_repeats: None,
        retry_failed,
        allow_plugin_change: allow,
        no_graphs: true,
        executor: ExecutorArgs::default(),
    };
    let mut ctx = context(dir, &record, &plugin_dir, &common, env, stop.clone())?;
    ctx.busy_wait = Duration::ZERO;
    if !dir.config(run_id).is_file() {
        write_run_config(dir, &run)?;
    }
    // Warm-up runs on this machine, unless the run needs nothing more.
    let (before, _, _) = state::classify(&dir.run(run_id), None);
    if before != RunState::Done {
        for n in 1..=what.warmup {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let status = perform_warmup(&ctx, &run, n, &mut || {})?;
            if !status.success() {
                eprintln!("warning: warm-up {n} ended with {status}");
            }
        }
    }
    let outcome = perform_run(&ctx, &run, &mut || {})?;
    let o = &outcome.observed;
    crate::outln!(
        "run {run_id}: {}{}{}",
        o.state.as_str(),
        if o.detail.is_empty() {
            String::new()
        } else {
            format!(" ({})", o.detail)
        },
        match (&outcome.skipped, outcome.seconds) {
            (Some(why), _) => format!("; skipped: {why}"),
            (None, Some(s)) => format!(" in {s:.1} s"),
            _ => String::new(),
        }
    );
    Ok(if o.state == RunState::Done {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
