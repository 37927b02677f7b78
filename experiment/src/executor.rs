//! Carrying out planned runs. [`perform_run`] does exactly one: it takes
//! the run's lock, moves a cut-off attempt aside, writes the run's
//! configuration, and starts `kernmlops run --collection-dir
//! <dir>/runs/<run_id>` as a child process whose output goes to the run's
//! log. An [`Executor`] decides where and when runs are performed:
//! [`LocalExecutor`] performs them one after another on this machine; a
//! cluster executor (`slurm::SlurmExecutor`) submits them (each task
//! calling `kernmlops experiment exec DIR RUN_ID`, which is
//! [`perform_run`]) and returns at once.

use std::{
    fs::OpenOptions,
    io::Write,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use super::{
    plan::{Identity, PlannedRun},
    record::{hostname, write_atomic, ExpDir, Lock},
    spec::json_to_toml,
    state::{self, Observed, RunState},
    ExperimentError, Result,
};

/// What an experiment's runs share.
#[derive(Debug, Clone)]
pub struct RunContext {
    pub dir: ExpDir,
    /// The `kernmlops` binary each run starts.
    pub exe: PathBuf,
    /// The plugin folder each run uses.
    pub plugin_dir: PathBuf,
    pub identity: Identity,
    /// Set by SIGINT/SIGTERM: the current run is stopped (and redone on
    /// resume), no further run starts.
    pub stop: Arc<AtomicBool>,
    /// Redo failed runs (their data is moved to `partial/`).
    pub retry_failed: bool,
    /// How long to wait for a run another process is still carrying out
    /// before leaving it to that process.
    pub busy_wait: Duration,
    /// Pass `--allow-insecure-plugins` to each run.
    pub allow_insecure_plugins: bool,
    /// The experiment's device (name, folder): each run's configuration is
    /// made concrete for it (`device::materialize`).
    pub device: Option<(String, String)>,
    /// The Slurm job a run is carried out in (`experiment exec` inside
    /// one): a run's roles start on its nodes, one each
    /// (`roles_run::Placement`). `None`: every role on this machine.
    pub slurm_job: Option<String>,
}

impl RunContext {
    /// The configuration a run is given: the planned one, with the
    /// device's placeholders filled in.
    pub fn run_config(&self, planned: &serde_json::Value) -> serde_json::Value {
        match &self.device {
            Some((name, dir)) => crate::device::materialize(planned, name, dir),
            None => planned.clone(),
        }
    }
}

/// What became of one run.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub observed: Observed,
    /// Wall time of the `kernmlops run` process, when one was started.
    pub seconds: Option<f64>,
    /// Why nothing was started (already done, another process has it).
    pub skipped: Option<String>,
    /// Where a cut-off attempt's folder went.
    pub moved_aside: Option<PathBuf>,
}

/// Told what an executor does, for progress display.
pub trait RunObserver {
    /// Run `index` (0-based) of `total` starts.
    fn started(&mut self, index: usize, total: usize, run: &PlannedRun);
    /// Called often while a run goes on.
    fn tick(&mut self) {}
    fn finished(&mut self, index: usize, total: usize, run: &PlannedRun, outcome: &RunOutcome);
    /// Anything else worth a line.
    fn note(&mut self, text: &str);
}

/// An observer that says nothing.
pub struct Silent;

impl RunObserver for Silent {
    fn started(&mut self, _: usize, _: usize, _: &PlannedRun) {}
    fn finished(&mut self, _: usize, _: usize, _: &PlannedRun, _: &RunOutcome) {}
    fn note(&mut self, _: &str) {}
}

/// What an executor did with the runs it was given.
#[derive(Debug)]
pub enum Dispatch {
    /// Each run was carried out here; one outcome per run attempted (fewer
    /// than given when stopped).
    Completed(Vec<RunOutcome>),
    /// The runs were handed to a scheduler, which carries them out later.
    Submitted { id: String, runs: usize },
}

/// Where and when planned runs are carried out.
pub trait Executor {
    /// `local`, `slurm`, ...
    fn name(&self) -> &'static str;
    /// Carries out (or submits) `runs`, in order. Each is performed by
    /// [`perform_run`], here or in `kernmlops experiment exec` elsewhere.
    fn execute(
        &mut self,
        ctx: &RunContext,
        runs: &[PlannedRun],
        observer: &mut dyn RunObserver,
    ) -> Result<Dispatch>;
}

/// Runs one after another on this machine.
pub struct LocalExecutor;

impl Executor for LocalExecutor {
    fn name(&self) -> &'static str {
        "local"
    }

    fn execute(
        &mut self,
        ctx: &RunContext,
        runs: &[PlannedRun],
        observer: &mut dyn RunObserver,
    ) -> Result<Dispatch> {
        let mut outcomes = Vec::new();
        for (i, run) in runs.iter().enumerate() {
            if ctx.stop.load(Ordering::Relaxed) {
                break;
            }
            observer.started(i, runs.len(), run);
            let outcome = {
                let mut tick = || observer.tick();
                perform_run(ctx, run, &mut tick)?
            };
            if let Some(to) = &outcome.moved_aside {
                observer.note(&format!(
                    "run {}: an earlier attempt was cut off; moved to {}",
                    run.run_id,
                    to.display()
                ));
            }
            observer.finished(i, runs.len(), run, &outcome);
            outcomes.push(outcome);
        }
        Ok(Dispatch::Completed(outcomes))
    }
}

/// Carries out one planned run, unless it is done already (or failed with
/// its data kept, without `retry_failed`) or another process has it.
pub fn perform_run(
    ctx: &RunContext,
    run: &PlannedRun,
    tick: &mut dyn FnMut(),
) -> Result<RunOutcome> {
    let dir = &ctx.dir;
    let id = &run.run_id;
    let skipped = |why: String| RunOutcome {
        observed: state::observe_run(dir, run),
        seconds: None,
        skipped: Some(why),
        moved_aside: None,
    };
    // A run another process is at (say a `kernmlops run` still stopping
    // after its experiment was killed): wait a while for it.
    let deadline = Instant::now() + ctx.busy_wait;
    let lock = loop {
        match Lock::try_take(&dir.run_lock(id))? {
            Ok(lock) => match state::run_process(dir, id) {
                None => break lock,
                Some(who) if Instant::now() >= deadline => {
                    return Ok(skipped(format!("still carried out by {who}")))
                }
                Some(_) => drop(lock),
            },
            Err(who) if Instant::now() >= deadline => {
                return Ok(skipped(format!("carried out by {who}")))
            }
            Err(_) => {}
        }
        tick();
        std::thread::sleep(Duration::from_millis(100));
    };

    let run_dir = dir.run(id);
    let (state, _, has_collection) = state::classify(&run_dir, None);
    let mut moved_aside = None;
    match state {
        RunState::Done => return Ok(skipped("already done".into())),
        RunState::Failed if has_collection && !ctx.retry_failed => {
            return Ok(skipped(
                "failed earlier (pass --retry-failed to redo)".into(),
            ))
        }
        RunState::Pending => {}
        _ => moved_aside = Some(dir.move_aside(id)?),
    }

    let config_path = dir.config(id);
    let config = json_to_toml(&ctx.run_config(&run.config))
        .map(|v| toml::to_string_pretty(&v))
        .transpose()
        .map_err(|e| ExperimentError::Corrupt {
            path: dir.record(),
            message: format!("run {id}: configuration: {e}"),
        })?
        .unwrap_or_default();
    write_atomic(&config_path, config.as_bytes())?;

    let started = Instant::now();
    let roles = match json_to_toml(&run.config) {
        Some(toml::Value::Table(config)) => super::roles_run::of(&config).map(|r| (config, r)),
        _ => None,
    };
    let status = match roles {
        // A run with roles: each role its own `kernmlops run`.
        Some((config, roles)) => {
            let roles = roles.map_err(|e| ExperimentError::Corrupt {
                path: config_path.clone(),
                message: e.to_string(),
            })?;
            super::roles_run::perform(ctx, id, &run_dir, &config, &roles, tick)?
        }
        None => launch(
            ctx,
            run.probes(&ctx.identity),
            &run_dir,
            &config_path,
            &dir.log(id),
            Some(id),
            tick,
        )?,
    };
    drop(lock);
    let mut observed = state::observe_run(dir, run);
    if !status.success() && observed.state == RunState::Pending {
        // The host refused the run before writing anything.
        observed.state = RunState::Failed;
        observed.detail = format!("no collection ({status}); see {}", dir.log(id).display());
    }
    Ok(RunOutcome {
        observed,
        seconds: Some(started.elapsed().as_secs_f64()),
        skipped: None,
        moved_aside,
    })
}

/// Runs a planned run's configuration without recording it, into
/// `warmup/<run_id>-<n>` (removed afterwards, and `warmup/` with it once
/// empty: tasks on other machines may be warming up beside it).
pub fn perform_warmup(
    ctx: &RunContext,
    run: &PlannedRun,
    n: u32,
    tick: &mut dyn FnMut(),
) -> Result<std::process::ExitStatus> {
    let dir = &ctx.dir;
    let base = dir.warmup();
    std::fs::create_dir_all(&base).map_err(ExperimentError::io(&base))?;
    let collection = base.join(format!("{}-{n}", run.run_id));
    let _ = std::fs::remove_dir_all(&collection);
    let config_path = base.join(format!("{}-{n}.toml", run.run_id));
    let config = json_to_toml(&ctx.run_config(&run.config))
        .and_then(|v| toml::to_string_pretty(&v).ok())
        .unwrap_or_default();
    write_atomic(&config_path, config.as_bytes())?;
    let status = launch(
        ctx,
        run.probes(&ctx.identity),
        &collection,
        &config_path,
        &dir.root.join("logs").join("warmup.log"),
        None,
        tick,
    );
    let _ = std::fs::remove_dir_all(&collection);
    let _ = std::fs::remove_file(&config_path);
    let _ = std::fs::remove_dir(&base);
    status
}

/// The command line of one run, with its probes (`--baseline` for none).
pub fn run_command(
    ctx: &RunContext,
    probes: &[String],
    collection: &Path,
    config: &Path,
) -> Command {
    collect_command(
        ctx,
        &ctx.identity.benchmark,
        Some(probes),
        collection,
        config,
    )
}

/// The `kernmlops run` command line of `benchmark` collected into
/// `collection`: with `probes` those probes (`--baseline` for none),
/// without them the configuration's own.
pub(crate) fn collect_command(
    ctx: &RunContext,
    benchmark: &str,
    probes: Option<&[String]>,
    collection: &Path,
    config: &Path,
) -> Command {
    let mut cmd = Command::new(&ctx.exe);
    if ctx.allow_insecure_plugins {
        cmd.arg("--allow-insecure-plugins");
    }
    cmd.arg("--plugin-dir")
        .arg(&ctx.plugin_dir)
        .arg("--config")
        .arg(config)
        .arg("run")
        .arg("--collection-dir")
        .arg(collection)
        .arg("--benchmark")
        .arg(benchmark);
    match probes {
        Some([]) => {
            cmd.arg("--baseline");
        }
        Some(probes) => {
            cmd.arg("--plugins").arg(probes.join(","));
        }
        None => {}
    }
    if let Some(power) = &ctx.identity.power {
        cmd.arg("--power").arg(power.join(","));
    }
    cmd
}

/// A command as its log shows it: the program and its arguments.
pub(crate) fn shown(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Appends `header` as a line to the log at `log` and sends `cmd`'s output
/// there after it (input from /dev/null). `cmd` is also told to stop
/// (SIGTERM: it finishes its manifest and stops its benchmark) when this
/// process dies, so a killed experiment leaves no run going on unobserved.
pub(crate) fn output_to_log(cmd: &mut Command, log: &Path, header: &str) -> Result<()> {
    let mut out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(ExperimentError::io(log))?;
    writeln!(out, "{header}").map_err(ExperimentError::io(log))?;
    let err = out.try_clone().map_err(ExperimentError::io(log))?;
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    let parent = std::process::id();
    // SAFETY: between fork and exec only async-signal-safe calls: prctl,
    // getppid and raise.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() as u32 != parent {
                libc::raise(libc::SIGTERM);
            }
            Ok(())
        });
    }
    Ok(())
}

/// How long a run may take to stop by itself once the experiment was told
/// to stop, before it is sent SIGTERM.
const FORWARD_STOP_AFTER: Duration = Duration::from_secs(3);

/// Starts `kernmlops run` for `collection` and waits for it, output
/// appended to `log`. With a `run_id`, its pid file says who runs it.
fn launch(
    ctx: &RunContext,
    probes: &[String],
    collection: &Path,
    config: &Path,
    log: &Path,
    run_id: Option<&str>,
    tick: &mut dyn FnMut(),
) -> Result<std::process::ExitStatus> {
    if let Some(parent) = log.parent() {
        std::fs::create_dir_all(parent).map_err(ExperimentError::io(parent))?;
    }
    let mut cmd = run_command(ctx, probes, collection, config);
    let header = format!(
        "== {} on {}: {}",
        kernmlops_sys::clock::rfc3339(kernmlops_sys::clock::unix_us()),
        hostname(),
        shown(&cmd)
    );
    output_to_log(&mut cmd, log, &header)?;
    let mut child = cmd.spawn().map_err(|source| ExperimentError::Launch {
        program: ctx.exe.display().to_string(),
        source,
    })?;
    let pid_file = run_id.map(|id| ctx.dir.run_pid(id));
    if let Some(p) = &pid_file {
        write_atomic(p, format!("{} {}\n", child.id(), hostname()).as_bytes())?;
    }
    // When told to stop: the child often got the same signal (Ctrl+C
    // reaches the terminal's whole process group; Slurm signals every
    // process of a cancelled or timed-out job), and a second one would make
    // it exit at once instead of stopping cleanly. So it gets a moment to
    // stop by itself, then SIGTERM, then SIGKILL.
    let mut stopping: Option<Instant> = None;
    let mut forwarded = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => return Err(ExperimentError::io(log)(e)),
        }
        if ctx.stop.load(Ordering::Relaxed) {
            let since = *stopping.get_or_insert_with(Instant::now);
            if !forwarded && since.elapsed() >= FORWARD_STOP_AFTER {
                signal(child.id(), libc::SIGTERM);
                forwarded = true;
            } else if since.elapsed() > FORWARD_STOP_AFTER + Duration::from_secs(30) {
                // It had long enough to stop cleanly.
                let _ = child.kill();
            }
        }
        tick();
        std::thread::sleep(Duration::from_millis(20));
    };
    if let Some(p) = &pid_file {
        let _ = std::fs::remove_file(p);
    }
    Ok(status)
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on our own child's pid, which it still is (not yet
    // waited for, so the pid cannot have been reused).
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}
