//! The `kernmlops experiment` commands' bodies: run, resume, status,
//! results, and `exec`, which performs one planned run (what a cluster task
//! calls); runs go to the local executor or, with the Slurm executor, to
//! Slurm. The command line (`kernmlops-cli`) parses into the options here.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use kernmlops::{plugin::Registry, trust::Policy};
use kernmlops_sys::clock;

use crate::{
    adaptive,
    checks::{
        base_config, check_config, check_folder, check_trusted, create_folder,
        only_start_leftovers, read_trusted_record, resolve_variable_commands, Checked,
    },
    comparisons,
    device::ActiveDevice,
    executor::{
        perform_run, perform_warmup, Dispatch, Executor, LocalExecutor, RunContext, RunObserver,
    },
    plan::{self, label, Identity, PlanInput, PlannedRun},
    progress::Progress,
    record::{plugin_difference, plugin_set, ExpDir, Lock, PluginHash, Record, FORMAT},
    report,
    results::Results,
    slurm::{SlurmExecutor, SlurmOptions, SlurmView},
    spec::{self, Order, Spec},
    state::{self, Observed, RunState, StateView},
    ExperimentError, Result,
};

/// `experiment run`: plan an experiment from its file and carry out its
/// runs; on an existing folder, only the runs it does not have yet.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The experiment file (TOML).
    pub file: PathBuf,
    /// The experiment folder [default: experiments/<name>-<UTC time>].
    pub dir: Option<PathBuf>,
    /// Run order, instead of the file's `order`.
    pub order: Option<Order>,
    /// Print the planned runs and stop (nothing is written).
    pub dry_run: bool,
    /// Most runs the plan may have, instead of the file's `max_runs`.
    pub max_runs: Option<usize>,
    pub common: CommonOptions,
}

/// `experiment resume`: carry out the runs of a folder that have no
/// finished collection.
#[derive(Debug, Clone)]
pub struct ResumeOptions {
    /// The experiment folder.
    pub dir: PathBuf,
    pub common: CommonOptions,
}

/// What `run` and `resume` share.
#[derive(Debug, Clone, Default)]
pub struct CommonOptions {
    /// Repeat each combination until `metric`'s 95% confidence interval is
    /// within `target` of its mean, or `max_repeats` runs.
    pub adaptive: bool,
    /// The `@result` figure adaptive repeats watch.
    pub metric: Option<String>,
    /// Largest relative half-width of that interval [default: 0.05].
    pub target: Option<f64>,
    /// Most runs of one combination [default: 10].
    pub max_repeats: Option<u32>,
    /// Also redo runs that failed (their data is moved to partial/).
    pub retry_failed: bool,
    /// Go on although the plugins differ from those the experiment recorded.
    pub allow_plugin_change: bool,
    /// Do not render graphs at the end.
    pub no_graphs: bool,
    pub executor: ExecutorOptions,
}

/// Where runs are carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExecutorKind {
    /// One after another on this machine.
    #[default]
    Local,
    /// One Slurm job array, a task per run on an exclusive node.
    Slurm,
}

/// The executor and its Slurm options.
#[derive(Debug, Clone, Default)]
pub struct ExecutorOptions {
    pub executor: ExecutorKind,
    /// The Slurm partition [default: the cluster's].
    pub partition: Option<String>,
    /// Each Slurm task's time limit, as sbatch takes it.
    pub time: Option<String>,
    /// More sbatch options, passed as given.
    pub sbatch_args: Vec<String>,
}

impl ExecutorOptions {
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

/// What `experiment exec` is asked beyond the run.
#[derive(Debug, Clone, Default)]
pub struct ExecOptions {
    /// Run even if this machine's plugins differ from the recorded ones.
    pub allow_plugin_change: bool,
    /// Redo the run if it failed before.
    pub retry_failed: bool,
    /// Warm-up runs (not recorded) before the run, on this machine.
    pub warmup: u32,
    /// Refuse to run unless this kernmlops binary has this SHA-256.
    pub binary_sha256: Option<String>,
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
    pub(crate) fn registry(&self, dir: &Path) -> Result<Registry> {
        let policy = kernmlops::trust::Policy::for_this_process(self.allow_insecure_plugins);
        Registry::load_dir_with(dir, &policy).map_err(ExperimentError::io(dir))
    }
}

/// Default largest relative half-width for adaptive repeats.
pub const DEFAULT_TARGET: f64 = 0.05;
/// Default most runs per combination for adaptive repeats.
pub const DEFAULT_MAX_REPEATS: u32 = 10;
/// How long a run still carried out by another process is waited for.
const BUSY_WAIT: Duration = Duration::from_secs(60);

/// `experiment status`: each planned run's state.
pub fn status(dir: PathBuf, json: bool, env: &Env) -> Result<ExitCode> {
    check_folder(&dir, env)?;
    report::status(&ExpDir::new(dir), json)
}

/// `experiment results`: what to write and print besides the results.
#[derive(Debug, Clone, Default)]
pub struct ResultsOptions {
    /// The experiment folder.
    pub dir: PathBuf,
    /// Do not render graphs.
    pub no_graphs: bool,
    /// Print only these figures.
    pub figures: Vec<String>,
    /// `VAR=VALUE` pairs naming the reference combination: write
    /// `comparisons.parquet`.
    pub reference: Vec<String>,
    /// `--best-by FIGURE --over VAR`: write `labels.parquet`.
    pub best_by: Option<(String, String)>,
    /// The best value of `--best-by` is the lowest.
    pub minimize: bool,
}

/// `experiment results`: writes the results (and graphs), prints the
/// summary; with `--reference`, the comparisons; with `--best-by`, the
/// labels. Bad options are refused before anything is written.
pub fn results(opts: ResultsOptions, env: &Env) -> Result<ExitCode> {
    check_folder(&opts.dir, env)?;
    let dir = ExpDir::new(opts.dir);
    let record = Record::read(&dir)?;
    let reference = if opts.reference.is_empty() {
        None
    } else {
        comparisons::parse_reference(&opts.reference, &record.variables)?;
        Some(&opts.reference)
    };
    let observed = observe(&dir, &record).1;
    let results = Results::collect(&dir, &record, &observed);
    if let Some((figure, over)) = &opts.best_by {
        comparisons::best_by(&record.variables, &results, figure, over, opts.minimize)?;
    }
    let plugin_dir = match (opts.no_graphs, resolve_plugin_dir(env, Some(&record))) {
        (true, _) => None,
        (false, Ok(d)) => Some(d),
        (false, Err(e)) => {
            eprintln!("warning: graphs not drawn: {e}");
            None
        }
    };
    let draw = plugin_dir.as_deref().map(|d| (env, d));
    report::report_collected(&dir, &record, &observed, &results, draw, &opts.figures)?;
    comparisons::report_overhead(&dir, &record, &results, &opts.figures)?;
    if let Some(pairs) = reference {
        comparisons::report_reference(&dir, &record, &results, pairs, &opts.figures)?;
    }
    if let Some((figure, over)) = &opts.best_by {
        comparisons::report_labels(&dir, &record, &results, figure, over, opts.minimize)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `experiment compare A B`: B's combinations against A's with the same
/// variable values, written to `out` (default
/// `./compare-<A's name>-<B's name>.parquet`) and printed.
pub fn compare(a: PathBuf, b: PathBuf, out: Option<PathBuf>, env: &Env) -> Result<ExitCode> {
    let mut read = Vec::new();
    for d in [a, b] {
        check_folder(&d, env)?;
        let dir = ExpDir::new(d);
        let record = Record::read(&dir)?;
        let observed = observe(&dir, &record).1;
        read.push(Results::collect(&dir, &record, &observed));
    }
    let (ra, rb) = (&read[0], &read[1]);
    let out = out.unwrap_or_else(|| {
        PathBuf::from(format!(
            "compare-{}-{}.parquet",
            ra.experiment, rb.experiment
        ))
    });
    comparisons::report_between(ra, rb, &out)?;
    Ok(ExitCode::SUCCESS)
}

/// `experiment build`: makes the experiment's `[build]` current on this
/// node (what a cluster job runs on each of its nodes before the runs).
pub fn build(dir: PathBuf, env: &Env) -> Result<ExitCode> {
    check_folder(&dir, env)?;
    let dir = ExpDir::new(dir);
    let record = read_trusted_record(&dir, env)?;
    if crate::build::before_runs(&dir, &record.source_file, env.allow_insecure_plugins)?.is_none() {
        eprintln!("{}: the experiment has no [build]", dir.root.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `experiment exec`: performs exactly one planned run; a failure is also
/// appended to the run's log.
pub fn exec(dir: PathBuf, run_id: &str, opts: &ExecOptions, env: &Env) -> Result<ExitCode> {
    let dir = ExpDir::new(dir);
    exec_run(&dir, run_id, opts, env).inspect_err(|e| log_error(&dir, run_id, e))
}

pub(crate) fn absolute(p: &Path) -> Result<PathBuf> {
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

/// `experiment run`.
pub fn run(args: RunOptions, env: &Env) -> Result<ExitCode> {
    let slurm = args.common.executor.slurm()?;
    let policy = Policy::for_this_process(env.allow_insecure_plugins);
    check_trusted(&args.file, "the experiment file", env)?;
    let spec = Spec::load(&args.file)?;
    let max_runs = max_runs(args.max_runs, &spec)?;
    // Counted before anything is built or checked.
    plan::check_size(&spec.file, &spec.variables, spec.repeats, max_runs)?;
    crate::roles::preflight(&spec, slurm.as_ref())?;
    let dir = ExpDir::new(args.dir.clone().unwrap_or_else(|| default_dir(&spec.name)));
    if dir.root.exists() {
        check_folder(&dir.root, env)?;
    }
    let existing = existing_record(&dir, env)?;
    let plugin_dir = resolve_plugin_dir(env, None)?;
    let registry = env.registry(&plugin_dir)?;
    // The device first: its knobs are checked on it. Dropped (a loop
    // device unmounted and removed) when this returns, however it returns.
    let device = ready_device(spec.device.as_ref(), &spec.file, slurm.is_some())?;
    let (mut base, variables, identity) =
        check_experiment(&spec, &registry, env, &policy, device.as_ref())?;
    if !spec.roles.is_empty() {
        crate::roles_run::add_to_base(&spec, &mut base, &policy)?;
    }
    let order = args.order.unwrap_or(spec.order);
    let planned = plan_runs(&spec, &base, variables, identity, order, existing.as_ref())?;
    // Each distinct configuration, checked once as the host will check
    // it (keys, types, each component's rules, power), before anything is
    // written.
    check_runs(
        &registry,
        &spec,
        &planned.variables,
        &planned.identity,
        &planned.runs,
        device.as_ref(),
    )?;

    if args.dry_run {
        report::print_plan(
            &spec,
            &planned.variables,
            &planned.runs,
            planned.seed,
            &planned.seed_from,
            order,
            &planned.identity,
            &dir,
        );
        return Ok(ExitCode::SUCCESS);
    }
    // Slurm missing, or refusing these options: said before anything is
    // written.
    if let Some(options) = slurm {
        slurm_executor(options, spec.warmup, &args.common).preflight(&planned.runs)?;
    }
    let adaptive = match adaptive::settings(&args.common, spec.repeats)? {
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
    let record = new_record(
        &spec,
        &args.file,
        existing.as_ref(),
        planned,
        &plugin_dir,
        plugins,
        adaptive,
    )?;
    write_start(&dir, &record, &spec, &base, env)?;
    announce(&record, &dir);
    drive(
        &dir,
        record,
        &plugin_dir,
        &args.common,
        env,
        device.as_ref(),
    )
}

/// The runs `experiment run` planned, and what it planned them from, as
/// the record keeps them.
struct Planned {
    variables: Vec<spec::Variable>,
    identity: Identity,
    seed: u64,
    /// Where the seed came from: `file`, `random`, or as recorded before.
    seed_from: String,
    order: Order,
    runs: Vec<PlannedRun>,
}

/// Plans the runs with the file's seed, else the folder's recorded one,
/// else a random one; adaptive repeats added earlier stay planned while
/// their combination exists.
fn plan_runs(
    spec: &Spec,
    base: &toml::Table,
    variables: Vec<spec::Variable>,
    identity: Identity,
    order: Order,
    existing: Option<&Record>,
) -> Result<Planned> {
    let (seed, seed_from) = match (spec.seed, existing) {
        (Some(s), _) => (s, "file"),
        (None, Some(r)) => (r.seed, r.seed_from.as_str()),
        (None, None) => (crate::rng::random_seed(), "random"),
    };
    let mut runs = plan::plan(&PlanInput {
        file: &spec.file,
        variables: &variables,
        base,
        identity: &identity,
        repeats: spec.repeats,
        seed,
        order,
    })?;
    if let Some(r) = existing {
        keep_adaptive_repeats(&mut runs, r, spec.repeats, &identity, seed);
    }
    Ok(Planned {
        variables,
        identity,
        seed,
        seed_from: seed_from.to_owned(),
        order,
        runs,
    })
}

/// The experiment's record as first written (a folder started before
/// keeps its creation time).
fn new_record(
    spec: &Spec,
    source: &Path,
    existing: Option<&Record>,
    planned: Planned,
    plugin_dir: &Path,
    plugins: Vec<PluginHash>,
    adaptive: Option<crate::record::Adaptive>,
) -> Result<Record> {
    let now = clock::rfc3339(clock::unix_us());
    Ok(Record {
        format: FORMAT,
        name: spec.name.clone(),
        created_utc: existing.map_or_else(|| now.clone(), |r| r.created_utc.clone()),
        updated_utc: now,
        kernmlops_version: env!("CARGO_PKG_VERSION").to_owned(),
        kernmlops_sha256: std::env::current_exe()
            .ok()
            .and_then(|exe| crate::record::sha256_file(&exe).ok())
            .unwrap_or_default(),
        source_file: absolute(source)?.display().to_string(),
        identity: planned.identity,
        seed: planned.seed,
        seed_from: planned.seed_from,
        order: planned.order,
        repeats: spec.repeats,
        warmup: spec.warmup,
        variables: planned.variables,
        plugin_dir: plugin_dir.display().to_string(),
        plugins,
        adaptive,
        device: spec.device.clone(),
        runs: planned.runs,
    })
}

/// The line that starts an experiment: where, how many runs, in which
/// order, with which seed.
fn announce(record: &Record, dir: &ExpDir) {
    eprintln!(
        "experiment {} in {}: {} runs, order {}, seed {}{}",
        record.name,
        dir.root.display(),
        record.runs.len(),
        report::order_name(record.order),
        record.seed,
        if record.seed_from == "random" {
            " (random, recorded)"
        } else {
            ""
        }
    );
}

/// Makes the experiment's `[device]` ready (local executor only).
fn ready_device(
    spec: Option<&crate::device::DeviceSpec>,
    file: &str,
    slurm: bool,
) -> Result<Option<ActiveDevice>> {
    match spec {
        None => Ok(None),
        Some(_) if slurm => Err(ExperimentError::Usage(format!(
            "{file}: [device]: an experiment with a device runs with the local executor only (Slurm's nodes would not have it)"
        ))),
        Some(d) => ActiveDevice::setup(d, file).map(Some),
    }
}

/// The largest plan allowed: `--max-runs`, else the file's `max_runs`.
fn max_runs(flag: Option<usize>, spec: &Spec) -> Result<usize> {
    match flag {
        Some(n) if n == 0 || n > spec::MAX_RUNS_CEILING => Err(ExperimentError::Usage(format!(
            "--max-runs {n}: give 1 to {}",
            spec::MAX_RUNS_CEILING
        ))),
        Some(n) => Ok(n),
        None => Ok(spec.max_runs),
    }
}

/// Checks the experiment's components against the plugins (benchmark,
/// power sources, probes) and its base configuration as the host will;
/// the base configuration, the variables with their commands resolved,
/// and the experiment's identity.
fn check_experiment(
    spec: &Spec,
    registry: &Registry,
    env: &Env,
    policy: &Policy,
    device: Option<&ActiveDevice>,
) -> Result<(toml::Table, Vec<spec::Variable>, Identity)> {
    for (path, e) in &registry.failures {
        eprintln!("warning: plugin {} refused: {e}", path.display());
    }
    registry
        .find_benchmark(&spec.benchmark)
        .map_err(|e| invalid(spec, "benchmark", e.to_string()))?;
    if let Some(power) = &spec.power {
        kernmlops::power::check_selection(registry, power)
            .map_err(|e| invalid(spec, "power", e.to_string()))?;
    }
    let base = base_config(spec, env, policy)?;
    let mut variables = spec.variables.clone();
    resolve_variable_commands(spec, &mut variables, policy)?;
    let benchmark_only = Checked {
        probes: spec.probes.as_deref().unwrap_or(&[]),
        benchmark: &spec.benchmark,
        power: spec.power.as_deref(),
    };
    let cfg = check_config(registry, &concrete(&base, device), &benchmark_only)
        .map_err(|e| invalid(spec, "config", e.to_string()))?;
    let probes = if spec.roles.is_empty() {
        // A `probes` variable that applies in every run leaves no run to the
        // experiment's own probes.
        let swept_everywhere = variables.iter().any(|v| v.is_probes() && v.when.is_empty());
        let probes = match &spec.probes {
            Some(p) => p.clone(),
            None if swept_everywhere => Vec::new(),
            None => cfg.collect.plugins.clone(),
        };
        registry
            .resolve(&probes)
            .map_err(|m| invalid(spec, "probes", m))?;
        for var in variables.iter().filter(|v| v.is_probes()) {
            for level in &var.levels {
                let set = spec::probe_set(&level.value).unwrap_or_default();
                registry.resolve(&set).map_err(|m| {
                    invalid(
                        spec,
                        &format!("variables.{}", var.name),
                        format!("{}: {m}", spec::probe_set_name(&set)),
                    )
                })?;
            }
        }
        probes
    } else {
        // Each role's, checked per role (roles_run::check_runs).
        crate::roles_run::identity_probes(&spec.roles, &cfg.collect.plugins)
    };
    let identity = Identity {
        benchmark: spec.benchmark.clone(),
        probes,
        power: spec.power.clone(),
    };
    Ok((base, variables, identity))
}

/// The record of an experiment folder `run` starts in again, `None` for a
/// new folder (or one only an interrupted start left files in).
fn existing_record(dir: &ExpDir, env: &Env) -> Result<Option<Record>> {
    Ok(if dir.record().is_file() {
        Some(read_trusted_record(dir, env)?)
    } else {
        if dir.root.is_dir() && !only_start_leftovers(&dir.root)? {
            return Err(ExperimentError::Usage(format!(
                "--dir {}: the folder exists, holds other files and is not an experiment folder (no experiment.json); choose a new or empty folder",
                dir.root.display()
            )));
        }
        None
    })
}

/// Adds the adaptive repeats `existing` planned beyond the file's
/// `repeats` to `runs`, for the combinations `runs` still has.
fn keep_adaptive_repeats(
    runs: &mut Vec<PlannedRun>,
    existing: &Record,
    repeats: u32,
    identity: &Identity,
    seed: u64,
) {
    let mut first_of: std::collections::HashMap<&str, usize> = Default::default();
    for (i, x) in runs.iter().enumerate() {
        first_of.entry(x.combo_id.as_str()).or_insert(i);
    }
    let mut ids: std::collections::HashSet<String> =
        runs.iter().map(|x| x.run_id.clone()).collect();
    let mut again = Vec::new();
    for extra in existing.runs.iter().filter(|x| x.repeat >= repeats) {
        if let Some(&i) = first_of.get(extra.combo_id.as_str()) {
            let more = runs[i].another_repeat(identity, extra.repeat, seed);
            if ids.insert(more.run_id.clone()) {
                again.push(more);
            }
        }
    }
    runs.extend(again);
}

/// Checks each distinct configuration of `runs` once, as the host will
/// check it; an error names the variable whose key the host complains
/// about.
fn check_runs(
    registry: &Registry,
    spec: &Spec,
    variables: &[spec::Variable],
    identity: &Identity,
    runs: &[PlannedRun],
    device: Option<&ActiveDevice>,
) -> Result<()> {
    if !spec.roles.is_empty() {
        return crate::roles_run::check_runs(registry, spec, identity.power.as_deref(), runs);
    }
    let mut seen = std::collections::HashSet::new();
    for r in runs {
        if !seen.insert(r.combo_id.as_str()) {
            continue;
        }
        let checked_run = Checked {
            probes: r.probes(identity),
            benchmark: &identity.benchmark,
            power: identity.power.as_deref(),
        };
        let Some(toml::Value::Table(config)) = spec::json_to_toml(&r.config) else {
            continue;
        };
        let config = concrete(&config, device);
        if let Err(e) = check_config(registry, &config, &checked_run) {
            let m = e.to_string();
            // Name the variable whose key the host complains about.
            let culprit = variables
                .iter()
                .filter(|v| {
                    m.contains(&v.key) || v.key.starts_with(m.split(':').next().unwrap_or("\u{0}"))
                })
                .max_by_key(|v| v.key.len());
            return Err(match culprit {
                Some(v) => invalid(
                    spec,
                    &format!("variables.{}", v.name),
                    format!("key {}: {m}", v.key),
                ),
                None => invalid(
                    spec,
                    "config",
                    format!("{m} (in the run {})", label(variables, &r.variables)),
                ),
            });
        }
    }
    Ok(())
}

/// Writes the record, then the folder's layout, the copied experiment
/// file, the base configuration and each run's configuration.
fn write_start(
    dir: &ExpDir,
    record: &Record,
    spec: &Spec,
    base: &toml::Table,
    env: &Env,
) -> Result<()> {
    record.write(dir)?;
    dir.create()?;
    crate::record::write_atomic(&dir.experiment_file(), spec.text.as_bytes())?;
    let base_text = toml::to_string_pretty(base).unwrap_or_default();
    crate::record::write_atomic(
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
        write_run_config(dir, r)?;
    }
    Ok(())
}

/// A configuration made concrete for the device, as its runs get it.
fn concrete(config: &toml::Table, device: Option<&ActiveDevice>) -> toml::Table {
    let Some(d) = device else {
        return config.clone();
    };
    let json = d.materialize(&spec::toml_to_json(&toml::Value::Table(config.clone())));
    match spec::json_to_toml(&json) {
        Some(toml::Value::Table(t)) => t,
        _ => config.clone(),
    }
}

pub(crate) fn invalid(spec: &Spec, key: &str, message: String) -> ExperimentError {
    ExperimentError::Invalid {
        file: spec.file.clone(),
        key: key.to_owned(),
        message,
    }
}

pub(crate) fn write_run_config(dir: &ExpDir, run: &PlannedRun) -> Result<()> {
    let text = spec::json_to_toml(&run.config)
        .and_then(|v| toml::to_string_pretty(&v).ok())
        .unwrap_or_default();
    crate::record::write_atomic(&dir.config(&run.run_id), text.as_bytes())
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

fn check_plugins(record: &Record, here: &[PluginHash], allow: bool) -> Result<()> {
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
    common: &CommonOptions,
    env: &Env,
    stop: Arc<AtomicBool>,
    device: Option<&ActiveDevice>,
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
        device: device.map(|d| (d.name.clone(), d.dir.display().to_string())),
        slurm_job: None,
    })
}

/// `experiment resume`.
pub fn resume(args: ResumeOptions, env: &Env) -> Result<ExitCode> {
    let slurm = args.common.executor.slurm()?;
    check_folder(&args.dir, env)?;
    let dir = ExpDir::new(args.dir);
    let mut record = read_trusted_record(&dir, env)?;
    let plugin_dir = resolve_plugin_dir(env, Some(&record))?;
    if let Some(options) = slurm {
        slurm_executor(options, record.warmup, &args.common).preflight(&record.runs)?;
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
    if let Some(a) = adaptive::settings(&args.common, record.repeats)? {
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
    let device = ready_device(
        record.device.as_ref(),
        &record.source_file,
        args.common.executor.executor == ExecutorKind::Slurm,
    )?;
    eprintln!(
        "experiment {} in {}: resuming",
        record.name,
        dir.root.display()
    );
    drive(
        &dir,
        record,
        &plugin_dir,
        &args.common,
        env,
        device.as_ref(),
    )
}

/// Carries out what is missing (plus adaptive repeats), then writes and
/// prints the results.
fn drive(
    dir: &ExpDir,
    mut record: Record,
    plugin_dir: &Path,
    common: &CommonOptions,
    env: &Env,
    device: Option<&ActiveDevice>,
) -> Result<ExitCode> {
    let stop = install_signals()?;
    let ctx = context(dir, &record, plugin_dir, common, env, stop.clone(), device)?;
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
    // `[build]` on this machine before its first run; Slurm tasks build
    // on their own nodes (`experiment exec`).
    if local {
        crate::build::before_runs(dir, &record.source_file, env.allow_insecure_plugins)?;
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
    if let Some((id, n)) = carry_out(dir, executor.as_mut(), &ctx, &todo, &mut progress)? {
        progress.finish();
        report::print_submitted(dir, &id, n);
        return Ok(ExitCode::SUCCESS);
    }

    if let Some(a) = record.adaptive.clone() {
        let dispatched =
            adaptive::repeat(dir, &mut record, &a, executor.as_mut(), &ctx, &mut progress)?;
        if let Some((id, n)) = dispatched {
            progress.finish();
            report::print_submitted(dir, &id, n);
            kernmlops::outln!(
                "adaptive repeats go on with `kernmlops experiment resume {} --executor slurm` once these are done",
                dir.root.display()
            );
            return Ok(ExitCode::SUCCESS);
        }
    }
    progress.finish();
    let stopped = stop.load(Ordering::Relaxed);
    let draw = (!common.no_graphs).then_some((env, plugin_dir));
    let code = report::report(dir, &record, draw, &[])?;
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
/// took them. A refused submission's error says how to submit the kept
/// plan.
pub(crate) fn carry_out(
    dir: &ExpDir,
    executor: &mut dyn Executor,
    ctx: &RunContext,
    runs: &[PlannedRun],
    observer: &mut dyn RunObserver,
) -> Result<Option<(String, usize)>> {
    if runs.is_empty() {
        return Ok(None);
    }
    let dispatched = executor
        .execute(ctx, runs, observer)
        .map_err(|e| plan_kept(dir, e))?;
    Ok(match dispatched {
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

fn slurm_executor(options: SlurmOptions, warmup: u32, common: &CommonOptions) -> SlurmExecutor {
    SlurmExecutor {
        options,
        warmup,
        allow_plugin_change: common.allow_plugin_change,
    }
}

/// Every planned run's state: the folder's, refined by Slurm's view when
/// runs were submitted to Slurm.
pub(crate) fn observe(dir: &ExpDir, record: &Record) -> (Option<SlurmView>, Vec<Observed>) {
    let view = SlurmView::load(dir);
    let views: Vec<&dyn StateView> = view.iter().map(|v| v as &dyn StateView).collect();
    let observed = state::observe(dir, record, &views);
    (view, observed)
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
        crate::record::hostname(),
        kernmlops::trust::printable(e.to_string().as_bytes())
    );
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
}

fn exec_run(dir: &ExpDir, run_id: &str, what: &ExecOptions, env: &Env) -> Result<ExitCode> {
    let (allow, retry_failed) = (what.allow_plugin_change, what.retry_failed);
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
        let have = crate::record::sha256_file(&exe)?;
        if !have.eq_ignore_ascii_case(want) {
            return Err(ExperimentError::BinaryChanged(format!(
                "this machine's kernmlops ({}, SHA-256 {}) is not the binary that submitted the run ({}); install the same build on every node",
                exe.display(),
                &have[..12.min(have.len())],
                &want[..12.min(want.len())]
            )));
        }
    }
    if record.device.is_some() {
        return Err(ExperimentError::Usage(format!(
            "{}: the experiment has a [device], made ready by `experiment run` or `experiment resume` on this machine; its runs are not carried out one by one",
            dir.root.display()
        )));
    }
    let plugin_dir = resolve_plugin_dir(env, Some(&record))?;
    check_plugins(&record, &plugin_set(&plugin_dir)?, allow)?;
    let stop = install_signals()?;
    let common = CommonOptions {
        adaptive: false,
        metric: None,
        target: None,
        max_repeats: None,
        retry_failed,
        allow_plugin_change: allow,
        no_graphs: true,
        executor: ExecutorOptions::default(),
    };
    let mut ctx = context(dir, &record, &plugin_dir, &common, env, stop.clone(), None)?;
    ctx.busy_wait = Duration::ZERO;
    // Inside a Slurm job (the Slurm executor's batch script), a run's
    // roles start on the job's nodes.
    ctx.slurm_job = std::env::var("SLURM_JOB_ID")
        .ok()
        .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()));
    // `[build]` first, cached once per node: on this node, or on every
    // node of a job that has several (a run whose roles are steps on the
    // job's other nodes).
    match crate::build::job_nodes() {
        Some(nodes) if ctx.slurm_job.is_some() && nodes > 1 => {
            crate::build::on_every_node_of_job(dir, nodes, &ctx.exe, env.allow_insecure_plugins)?;
        }
        _ => {
            crate::build::before_runs(dir, &record.source_file, env.allow_insecure_plugins)?;
        }
    }
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
    kernmlops::outln!(
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
