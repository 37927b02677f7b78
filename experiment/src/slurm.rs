//! The Slurm executor and Slurm's view of an experiment's runs.
//!
//! [`SlurmExecutor`] submits the runs it is given as one Slurm job array
//! (several when the cluster's `MaxArraySize` is smaller), one task per
//! run, each on a whole node (`--exclusive`), or on as many whole nodes as
//! the run has roles (`--nodes=N`: the task's `experiment exec` starts
//! each role as a job step on a node of its own, `roles_run::Placement`),
//! and returns at once. A task
//! carries out its run with `kernmlops experiment exec DIR RUN_ID`, which
//! checks the node's `kernmlops` binary and plugins against the experiment
//! first. The array index maps to a run id through the submission's own
//! file, so nothing about the record's order matters:
//!
//! ```text
//! <dir>/slurm/submit-<n>.runs   run ids, one a line; array task i runs line i
//! <dir>/slurm/submit-<n>.sh     the batch script every task of the array runs
//! <dir>/slurm/submit-<n>.json   job id, run ids and the sbatch command line
//! <dir>/logs/slurm-<job>_<task>.log  each task's output (exec's own lines)
//! ```
//!
//! [`SlurmView`] refines the folder's view of each run with Slurm's: the
//! latest task submitted for it is looked up with `squeue --states=all`
//! (queued, running, and ended tasks the controller still remembers, for
//! `MinJobAge`), then `sacct` (when the cluster keeps accounting), and
//! otherwise the folder alone decides.

use std::{
    collections::{BTreeMap, HashMap},
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

use super::{
    executor::{Dispatch, Executor, RunContext, RunObserver},
    plan::PlannedRun,
    record::{hostname, sha256_file, write_atomic, ExpDir},
    state::{self, Observed, RunState, StateView},
    ExperimentError, Result,
};

/// Array size when the cluster's `MaxArraySize` cannot be read (Slurm's
/// default).
const DEFAULT_MAX_ARRAY_SIZE: usize = 1001;
/// Longest wait for `squeue`, `sacct` or `scontrol` (a controller that does
/// not answer makes them retry for a long time).
const QUERY_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest wait for `sbatch`.
const SUBMIT_TIMEOUT: Duration = Duration::from_secs(120);

/// What `--partition`, `--time` and `--sbatch-arg` ask of Slurm.
#[derive(Debug, Clone, Default)]
pub struct SlurmOptions {
    pub partition: Option<String>,
    /// Each task's time limit, in sbatch's notation.
    pub time: Option<String>,
    /// Further sbatch arguments, passed last.
    pub sbatch_args: Vec<String>,
}

impl SlurmOptions {
    /// Checks the options before anything is written or submitted.
    pub fn check(&self) -> Result<()> {
        if let Some(p) = &self.partition {
            if p.is_empty() || p.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(ExperimentError::Usage(format!(
                    "--partition {p:?}: a partition name (or a comma-separated list), without spaces"
                )));
            }
        }
        if let Some(t) = &self.time {
            if !valid_time(t) {
                return Err(ExperimentError::Usage(format!(
                    "--time {t:?}: not a Slurm time limit; use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 00:10:00)"
                )));
            }
        }
        if let Some(a) = self.sbatch_args.iter().find(|a| !a.starts_with('-')) {
            return Err(ExperimentError::Usage(format!(
                "--sbatch-arg {a:?}: each one is an sbatch option, e.g. --sbatch-arg=--account=lab"
            )));
        }
        Ok(())
    }

    /// The sbatch options every submission of an experiment shares, after
    /// `--array`: each task (a run) on `nodes` whole nodes, one per role.
    fn args(&self, nodes: usize) -> Vec<String> {
        let mut args = vec![
            format!("--nodes={nodes}"),
            format!("--ntasks={nodes}"),
            "--exclusive".to_owned(),
        ];
        if let Some(p) = &self.partition {
            args.push(format!("--partition={p}"));
        }
        if let Some(t) = &self.time {
            args.push(format!("--time={t}"));
        }
        args.extend(self.sbatch_args.iter().cloned());
        args
    }
}

/// Whether `t` is a time limit sbatch takes: `MM`, `MM:SS`, `HH:MM:SS`,
/// `D-HH`, `D-HH:MM`, `D-HH:MM:SS`, or `UNLIMITED`/`INFINITE`.
pub fn valid_time(t: &str) -> bool {
    if matches!(t, "UNLIMITED" | "INFINITE" | "unlimited" | "infinite") {
        return true;
    }
    let number = |s: &str| !s.is_empty() && s.len() <= 9 && s.bytes().all(|b| b.is_ascii_digit());
    let (days, rest) = match t.split_once('-') {
        Some((d, r)) => (Some(d), r),
        None => (None, t),
    };
    if days.is_some_and(|d| !number(d)) {
        return false;
    }
    // MM, MM:SS, HH:MM:SS; after days: HH, HH:MM, HH:MM:SS.
    let parts: Vec<&str> = rest.split(':').collect();
    parts.len() <= 3 && parts.iter().all(|p| number(p))
}

/// A submission of runs as one job array, as `slurm/submit-<n>.json` holds
/// it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Submission {
    /// `submit-<n>`: the names of its files in `slurm/`.
    pub name: String,
    /// The array's job id (`SLURM_ARRAY_JOB_ID`).
    pub job_id: String,
    /// Run ids; array task i carries out `runs[i]`.
    pub runs: Vec<String>,
    pub submitted_utc: String,
    /// The sbatch command line.
    pub command: Vec<String>,
}

impl Submission {
    /// Every submission of an experiment, oldest first.
    pub fn all(dir: &ExpDir) -> Vec<Submission> {
        let Ok(entries) = std::fs::read_dir(dir.slurm()) else {
            return Vec::new();
        };
        let mut subs: Vec<(u64, Submission)> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .filter_map(|p| {
                let text = std::fs::read_to_string(&p).ok()?;
                let sub: Submission = serde_json::from_str(&text).ok()?;
                let n = sub.name.strip_prefix("submit-")?.parse().ok()?;
                Some((n, sub))
            })
            .collect();
        subs.sort_by_key(|(n, _)| *n);
        subs.into_iter().map(|(_, s)| s).collect()
    }
}

/// The next free `submit-<n>` of an experiment's `slurm/` folder.
fn next_name(dir: &ExpDir) -> String {
    let used: Vec<u64> = std::fs::read_dir(dir.slurm())
        .map(|r| {
            r.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let stem = name.split('.').next()?.to_owned();
                    stem.strip_prefix("submit-")?.parse().ok()
                })
                .collect()
        })
        .unwrap_or_default();
    format!("submit-{:04}", used.iter().max().map_or(1, |n| n + 1))
}

/// Submits runs to Slurm as job arrays.
#[derive(Debug, Clone, Default)]
pub struct SlurmExecutor {
    pub options: SlurmOptions,
    /// Warm-up runs each task does on its node before its run.
    pub warmup: u32,
    /// Pass `--allow-plugin-change` to each task.
    pub allow_plugin_change: bool,
}

impl SlurmExecutor {
    /// Asks sbatch whether it would take an array of `runs` tasks with
    /// these options (`--test-only`: nothing is submitted), so a missing
    /// Slurm, an unknown partition or a bad option is one error before
    /// anything is written.
    pub fn preflight(&self, runs: &[PlannedRun]) -> Result<()> {
        self.options.check()?;
        let nodes = nodes_per_run(runs);
        let size = runs.len().clamp(1, max_array_size());
        let mut args = vec![
            "--test-only".to_owned(),
            "--job-name=kernmlops-check".to_owned(),
            format!("--array=0-{}", size - 1),
            "--output=/dev/null".to_owned(),
        ];
        args.extend(self.options.args(nodes));
        args.push("--wrap=true".to_owned());
        let out = tool("sbatch", &args, SUBMIT_TIMEOUT)?;
        if !out.success {
            // The user's own options, which are what to fix.
            let mut given: Vec<String> = self.options.args(nodes).split_off(3);
            given.insert(0, "sbatch".into());
            return Err(ExperimentError::SlurmRefused(format!(
                "{}: {}",
                given.join(" "),
                out.error_text()
            )));
        }
        Ok(())
    }

    /// Writes one submission's files and submits it; its record is written
    /// once sbatch has answered.
    fn submit(
        &self,
        ctx: &RunContext,
        root: &Path,
        runs: &[PlannedRun],
        binary_sha256: &str,
    ) -> Result<Submission> {
        let dir = ExpDir::new(root);
        let slurm = dir.slurm();
        std::fs::create_dir_all(&slurm).map_err(ExperimentError::io(&slurm))?;
        let logs = root.join("logs");
        std::fs::create_dir_all(&logs).map_err(ExperimentError::io(&logs))?;
        let name = next_name(&dir);
        let runs_file = slurm.join(format!("{name}.runs"));
        let script = slurm.join(format!("{name}.sh"));
        let ids: Vec<String> = runs.iter().map(|r| r.run_id.clone()).collect();
        write_atomic(&runs_file, (ids.join("\n") + "\n").as_bytes())?;
        write_atomic(
            &script,
            self.script(ctx, root, &name, &runs_file, binary_sha256)
                .as_bytes(),
        )?;
        let mut args = vec![
            "--parsable".to_owned(),
            format!("--job-name=kml-{}", job_name(root)),
            format!("--array=0-{}", runs.len() - 1),
            format!("--output={}", logs.join("slurm-%A_%a.log").display()),
            "--open-mode=append".to_owned(),
            format!("--chdir={}", root.display()),
        ];
        args.extend(self.options.args(nodes_per_run(runs)));
        args.push(script.display().to_string());
        let out = tool("sbatch", &args, SUBMIT_TIMEOUT);
        let refused = |message: String| {
            let _ = std::fs::remove_file(&runs_file);
            let _ = std::fs::remove_file(&script);
            ExperimentError::SlurmRefused(message)
        };
        let out = match out {
            Ok(o) => o,
            Err(e @ ExperimentError::SlurmMissing { .. }) => {
                let _ = std::fs::remove_file(&runs_file);
                let _ = std::fs::remove_file(&script);
                return Err(e);
            }
            Err(e) => return Err(refused(e.to_string())),
        };
        if !out.success {
            return Err(refused(format!("sbatch: {}", out.error_text())));
        }
        let job_id = out
            .stdout
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .and_then(|l| l.split(';').next())
            .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
            .map(str::to_owned);
        let Some(job_id) = job_id else {
            return Err(refused(format!(
                "sbatch printed no job id: {:?}",
                out.stdout.trim()
            )));
        };
        let mut command = vec!["sbatch".to_owned()];
        command.extend(args);
        let sub = Submission {
            name: name.clone(),
            job_id: job_id.clone(),
            runs: ids,
            submitted_utc: kernmlops_sys::clock::rfc3339(kernmlops_sys::clock::unix_us()),
            command,
        };
        let json = serde_json::to_string_pretty(&sub).unwrap_or_default() + "\n";
        if let Err(e) = write_atomic(&slurm.join(format!("{name}.json")), json.as_bytes()) {
            // Without its record nobody could follow the job: take it back.
            cancel(&[job_id]);
            return Err(refused(format!(
                "{e}; the submitted job was cancelled again"
            )));
        }
        Ok(sub)
    }

    /// The batch script of one submission.
    fn script(
        &self,
        ctx: &RunContext,
        root: &Path,
        name: &str,
        runs_file: &Path,
        binary_sha256: &str,
    ) -> String {
        let q = |p: &Path| sh_quote(&p.display().to_string());
        let mut exec = vec![q(&ctx.exe)];
        if ctx.allow_insecure_plugins {
            exec.push("--allow-insecure-plugins".into());
        }
        exec.extend([
            "--plugin-dir".into(),
            q(&ctx.plugin_dir),
            "experiment".into(),
            "exec".into(),
            q(root),
            "\"$run_id\"".into(),
            "--binary-sha256".into(),
            binary_sha256.to_owned(),
        ]);
        if self.warmup > 0 {
            exec.push(format!("--warmup {}", self.warmup));
        }
        if ctx.retry_failed {
            exec.push("--retry-failed".into());
        }
        if self.allow_plugin_change {
            exec.push("--allow-plugin-change".into());
        }
        format!(
            r#"#!/bin/bash
# kernmlops experiment in {root}: Slurm submission {name}.
# Written by `kernmlops experiment run|resume --executor slurm`. Array task i
# carries out the run on line i (from 0) of {name}.runs with `kernmlops
# experiment exec`, which first checks this node's kernmlops binary and
# plugins against the experiment's record.
set -u
task=${{SLURM_ARRAY_TASK_ID:-}}
case "$task" in
    '' | *[!0-9]*)
        echo "error: not a Slurm array task (SLURM_ARRAY_TASK_ID is '$task')" >&2
        exit 2 ;;
esac
mapfile -t runs < {runs} || exit 2
run_id=${{runs[$task]:-}}
if [ -z "$run_id" ]; then
    echo "error: {runs_shown} has no run for array task $task" >&2
    exit 2
fi
echo "== job ${{SLURM_ARRAY_JOB_ID:-?}}_$task (job id ${{SLURM_JOB_ID:-?}}) on ${{SLURMD_NODENAME:-$(hostname)}}: run $run_id" >&2
exec {exec}
"#,
            root = root.display(),
            runs = q(runs_file),
            runs_shown = runs_file
                .display()
                .to_string()
                .replace(['"', '$', '`', '\\'], "_"),
            exec = exec.join(" "),
        )
    }
}

impl Executor for SlurmExecutor {
    fn name(&self) -> &'static str {
        "slurm"
    }

    fn execute(
        &mut self,
        ctx: &RunContext,
        runs: &[PlannedRun],
        observer: &mut dyn RunObserver,
    ) -> Result<Dispatch> {
        if runs.is_empty() {
            return Ok(Dispatch::Completed(Vec::new()));
        }
        self.options.check()?;
        let root =
            std::path::absolute(&ctx.dir.root).map_err(ExperimentError::io(&ctx.dir.root))?;
        let binary_sha256 = sha256_file(&ctx.exe)?;
        let size = max_array_size();
        let mut submitted: Vec<Submission> = Vec::new();
        for chunk in runs.chunks(size) {
            match self.submit(ctx, &root, chunk, &binary_sha256) {
                Ok(sub) => submitted.push(sub),
                Err(e) => {
                    // All or nothing: take back the arrays already submitted.
                    if !submitted.is_empty() {
                        let ids: Vec<String> = submitted.iter().map(|s| s.job_id.clone()).collect();
                        cancel(&ids);
                        for s in &submitted {
                            for ext in ["json", "runs", "sh"] {
                                let _ = std::fs::remove_file(
                                    ctx.dir.slurm().join(format!("{}.{ext}", s.name)),
                                );
                            }
                        }
                        observer.note(&format!(
                            "cancelled the arrays already submitted ({})",
                            ids.join(", ")
                        ));
                    }
                    return Err(e);
                }
            }
        }
        let ids: Vec<String> = submitted.iter().map(|s| s.job_id.clone()).collect();
        Ok(Dispatch::Submitted {
            id: ids.join(","),
            runs: runs.len(),
        })
    }
}

/// The nodes each run needs: one per role (the most roles of any run), one
/// for a run without roles.
fn nodes_per_run(runs: &[PlannedRun]) -> usize {
    runs.iter()
        .filter_map(|r| match super::spec::json_to_toml(&r.config) {
            Some(toml::Value::Table(config)) => super::roles_run::of(&config),
            _ => None,
        })
        .filter_map(|roles| roles.ok().map(|r| r.len()))
        .max()
        .unwrap_or(1)
        .max(1)
}

/// A name for the jobs: the experiment folder's, in characters every shell
/// and `squeue` show plainly.
fn job_name(root: &Path) -> String {
    let name: String = root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if name.is_empty() {
        "experiment".into()
    } else {
        name
    }
}

/// `s` in single quotes for a POSIX shell.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The cluster's largest job array (`MaxArraySize`).
fn max_array_size() -> usize {
    let Ok(out) = tool("scontrol", &["show".into(), "config".into()], QUERY_TIMEOUT) else {
        return DEFAULT_MAX_ARRAY_SIZE;
    };
    out.stdout
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "MaxArraySize").then(|| v.trim().parse().ok())?
        })
        .filter(|n: &usize| *n > 0)
        .unwrap_or(DEFAULT_MAX_ARRAY_SIZE)
}

/// Cancels jobs, best effort.
fn cancel(job_ids: &[String]) {
    if !job_ids.is_empty() {
        let _ = tool("scancel", job_ids, QUERY_TIMEOUT);
    }
}

/// What a Slurm tool printed.
#[derive(Debug)]
pub(crate) struct ToolOutput {
    pub(crate) success: bool,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl ToolOutput {
    /// stderr (else stdout) as one line: Slurm's `tool: error:` prefixes
    /// dropped, lines joined with "; ".
    pub(crate) fn error_text(&self) -> String {
        let text = if self.stderr.trim().is_empty() {
            &self.stdout
        } else {
            &self.stderr
        };
        let lines: Vec<String> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|l| {
                let l = l.split_once(": error: ").map_or(l, |(_, rest)| rest);
                kernmlops::trust::printable(l.as_bytes())
            })
            .collect();
        if lines.is_empty() {
            "failed without a message".into()
        } else {
            lines.join("; ")
        }
    }
}

/// Runs a Slurm tool found in `PATH`, for at most `timeout`.
pub(crate) fn tool(program: &str, args: &[String], timeout: Duration) -> Result<ToolOutput> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ExperimentError::SlurmMissing {
                program: program.to_owned(),
            },
            _ => ExperimentError::Launch {
                program: program.to_owned(),
                source: e,
            },
        })?;
    let read = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut p) = pipe {
                let mut bytes = Vec::new();
                let _ = p.read_to_end(&mut bytes);
                text = String::from_utf8_lossy(&bytes).into_owned();
            }
            text
        })
    };
    let stdout = read(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = read(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(source) => {
                return Err(ExperimentError::Launch {
                    program: program.to_owned(),
                    source,
                })
            }
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let mut stderr = stderr.join().unwrap_or_default();
    let success = match status {
        Some(s) => s.success(),
        None => {
            stderr = format!("{program} did not answer within {} s", timeout.as_secs());
            false
        }
    };
    Ok(ToolOutput {
        success,
        stdout,
        stderr,
    })
}

/// How a Slurm job state counts for a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for a node (or for a requeue).
    Queued,
    /// Its script runs.
    Live,
    /// Ending: its processes are being stopped.
    Ending,
    /// Over: it will not run again.
    Ended,
}

fn phase(state: &str) -> Option<Phase> {
    Some(match state {
        "PENDING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "RESV_DEL_HOLD"
        | "CONFIGURING" => Phase::Queued,
        "RUNNING" | "SUSPENDED" | "STOPPED" | "SIGNALING" | "RESIZING" => Phase::Live,
        "COMPLETING" | "STAGE_OUT" => Phase::Ending,
        "COMPLETED" | "FAILED" | "CANCELLED" | "TIMEOUT" | "NODE_FAIL" | "PREEMPTED"
        | "BOOT_FAIL" | "DEADLINE" | "OUT_OF_MEMORY" | "REVOKED" | "SPECIAL_EXIT" => Phase::Ended,
        _ => return None,
    })
}

/// What Slurm says of one array task.
#[derive(Debug, Clone, PartialEq)]
struct Task {
    /// The job state, e.g. `RUNNING`, `CANCELLED`.
    state: String,
    node: String,
    /// Why it waits (squeue), or how it exited (sacct).
    reason: String,
}

/// Slurm's view of an experiment's runs: each run's latest task and what
/// `squeue` (and `sacct`, when the cluster keeps accounting) say of it.
#[derive(Debug, Clone)]
pub struct SlurmView {
    dir: ExpDir,
    /// Run id to its latest task, `<array job id>_<index>`.
    latest: HashMap<String, String>,
    /// Tasks Slurm knows, by `<array job id>_<index>`.
    tasks: HashMap<String, Task>,
    /// The array jobs submitted, oldest first.
    pub jobs: Vec<String>,
    /// Why Slurm could not be asked (then the folder alone decides).
    pub unavailable: Option<String>,
    /// Why finished tasks are judged from the folder (no accounting).
    pub no_history: Option<String>,
    here: String,
}

impl SlurmView {
    /// The view of an experiment with Slurm submissions; `None` for one
    /// that never used Slurm.
    pub fn load(dir: &ExpDir) -> Option<Self> {
        let subs = Submission::all(dir);
        if subs.is_empty() {
            return None;
        }
        let mut latest = HashMap::new();
        for s in &subs {
            for (i, run) in s.runs.iter().enumerate() {
                latest.insert(run.clone(), format!("{}_{i}", s.job_id));
            }
        }
        let mut jobs: Vec<String> = subs.iter().map(|s| s.job_id.clone()).collect();
        jobs.dedup();
        let mut view = Self {
            dir: dir.clone(),
            latest,
            tasks: HashMap::new(),
            jobs,
            unavailable: None,
            no_history: None,
            here: hostname(),
        };
        match squeue(&view.jobs) {
            Ok(tasks) => view.tasks = tasks,
            Err(e) => {
                view.unavailable = Some(e);
                return Some(view);
            }
        }
        let wanted: Vec<&String> = view
            .latest
            .values()
            .filter(|t| !view.tasks.contains_key(*t))
            .collect();
        if !wanted.is_empty() {
            match sacct(&view.jobs) {
                Ok(tasks) => {
                    for (k, t) in tasks {
                        view.tasks.entry(k).or_insert(t);
                    }
                }
                Err(e) => view.no_history = Some(e),
            }
        }
        Some(view)
    }

    /// The latest task submitted for a run, `<job>_<index>`.
    pub fn task_of(&self, run_id: &str) -> Option<&str> {
        self.latest.get(run_id).map(String::as_str)
    }

    /// The Slurm log of a task.
    fn log(&self, task: &str) -> PathBuf {
        self.dir.root.join("logs").join(format!("slurm-{task}.log"))
    }

    /// The host of a run's pid file, when it is not this one (its process
    /// cannot be checked from here).
    fn remote_holder(&self, run_id: &str) -> Option<String> {
        state::pid_file(&self.dir, run_id)
            .map(|(_, host)| host)
            .filter(|h| *h != self.here)
    }
}

impl StateView for SlurmView {
    fn refine(&self, run: &PlannedRun, o: &mut Observed) {
        if self.unavailable.is_some() {
            return;
        }
        let Some(key) = self.latest.get(&run.run_id) else {
            return;
        };
        let finished =
            matches!(o.state, RunState::Done) || (o.state == RunState::Failed && o.has_collection);
        if finished {
            return;
        }
        let Some(task) = self.tasks.get(key) else {
            // Slurm has forgotten the task (and keeps no accounting): it
            // ended long ago. A pid file of another machine is stale.
            if o.state == RunState::Running && self.remote_holder(&run.run_id).is_some() {
                o.state = RunState::CutOff;
                o.detail = format!("job {key} is no longer known to Slurm; {}", o.detail);
            }
            return;
        };
        let Some(phase) = phase(&task.state) else {
            o.detail = join(&o.detail, &format!("job {key} {}", task.state));
            return;
        };
        match (phase, o.state) {
            (Phase::Queued, RunState::Running) => {}
            (Phase::Queued, _) => {
                let again = if o.state == RunState::CutOff {
                    " again (its cut-off attempt is redone)"
                } else {
                    ""
                };
                o.state = RunState::Queued;
                o.detail = match task.reason.as_str() {
                    "" | "None" | "(null)" => format!("job {key} queued{again}"),
                    r => format!("job {key} queued{again} ({r})"),
                };
            }
            (Phase::Live, _) => {
                let on = if task.node.is_empty() {
                    format!("job {key}")
                } else {
                    format!("job {key} on {}", task.node)
                };
                o.detail = if o.state == RunState::Running {
                    join(&on, &o.detail)
                } else {
                    on
                };
                if task.state != "RUNNING" {
                    o.detail = format!("{} ({})", o.detail, task.state.to_lowercase());
                }
                o.state = RunState::Running;
            }
            (Phase::Ending, RunState::Running) => {
                o.detail = join(&format!("job {key} ending"), &o.detail);
            }
            (Phase::Ending, _) => {}
            (Phase::Ended, RunState::Running) => {
                // The folder cannot check a process on another machine;
                // Slurm says it is over.
                if self.remote_holder(&run.run_id).is_some() {
                    o.state = RunState::CutOff;
                    o.detail = format!("job {key} {} while running", ended(task));
                }
            }
            (Phase::Ended, RunState::CutOff) => {
                o.detail = join(&o.detail, &format!("job {key} {}", ended(task)));
            }
            (Phase::Ended, RunState::Pending) if before_start(&task.state) => {
                o.detail = format!("job {key} {} before the run started", ended(task));
            }
            (Phase::Ended, RunState::Pending | RunState::Failed) => {
                o.state = RunState::Failed;
                o.has_collection = false;
                if o.detail.is_empty() || o.detail.starts_with("job ") {
                    o.detail = format!(
                        "job {key} {} without a collection; see {}",
                        ended(task),
                        self.log(key).display()
                    );
                }
            }
            (Phase::Ended, _) => {}
        }
    }
}

/// Ended states that mean the task's script never ran.
fn before_start(state: &str) -> bool {
    matches!(state, "CANCELLED" | "BOOT_FAIL" | "DEADLINE" | "REVOKED")
}

/// How a task ended, for a detail: `cancelled`, `failed (exit 1:0)`.
fn ended(task: &Task) -> String {
    let state = task.state.to_lowercase().replace('_', " ");
    match task.reason.as_str() {
        "" | "0:0" | "None" => state,
        r => format!("{state} ({r})"),
    }
}

fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_owned(),
        (_, true) => a.to_owned(),
        _ => format!("{a}; {b}"),
    }
}

/// `program --noheader OPTIONS --jobs=JOBS --format=FORMAT`: a Slurm query
/// (`squeue`, `sacct`) of these jobs' tasks, one line each.
fn query_tasks(
    program: &str,
    options: &[&str],
    jobs: &[String],
    format: &str,
) -> std::result::Result<ToolOutput, String> {
    let mut args = vec!["--noheader".to_owned()];
    args.extend(options.iter().map(|o| (*o).to_owned()));
    args.push(format!("--jobs={}", jobs.join(",")));
    args.push(format!("--format={format}"));
    tool(program, &args, QUERY_TIMEOUT).map_err(|e| e.to_string())
}

/// The tasks `squeue` knows of these array jobs, in any state the
/// controller still holds.
fn squeue(jobs: &[String]) -> std::result::Result<HashMap<String, Task>, String> {
    let out = query_tasks("squeue", &["--array", "--states=all"], jobs, "%i|%T|%N|%r")?;
    if !out.success {
        let text = out.error_text();
        // One job id the controller has forgotten is an error to squeue;
        // it simply knows no task of it.
        if text.contains("Invalid job id") {
            return Ok(HashMap::new());
        }
        return Err(format!("squeue: {text}"));
    }
    Ok(parse_tasks(&out.stdout, |f| Task {
        state: f.get(1).copied().unwrap_or("").to_owned(),
        node: f.get(2).copied().unwrap_or("").to_owned(),
        reason: f.get(3).copied().unwrap_or("").to_owned(),
    }))
}

/// The tasks of these array jobs in Slurm's accounting.
fn sacct(jobs: &[String]) -> std::result::Result<HashMap<String, Task>, String> {
    let out = query_tasks(
        "sacct",
        &["--parsable2", "--allocations"],
        jobs,
        "JobID,State,NodeList,ExitCode",
    )?;
    if !out.success {
        return Err(format!("sacct: {}", out.error_text()));
    }
    Ok(parse_tasks(&out.stdout, |f| Task {
        // `CANCELLED by 0`
        state: f
            .get(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap_or("")
            .to_owned(),
        node: f.get(2).copied().unwrap_or("").to_owned(),
        reason: f
            .get(3)
            .map(|e| format!("exit {e}"))
            .filter(|e| e != "exit 0:0")
            .unwrap_or_default(),
    }))
}

/// `<job>_<index>|...` lines into tasks; ranges of pending tasks
/// (`12_[3-5]`) are left out (`--array` lists every task).
fn parse_tasks(text: &str, task: impl Fn(&[&str]) -> Task) -> HashMap<String, Task> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.trim().split('|').collect();
        let Some(id) = fields
            .first()
            .filter(|id| id.contains('_') && !id.contains('['))
        else {
            continue;
        };
        out.insert((*id).to_owned(), task(&fields));
    }
    out
}

/// Counts of a view's runs by Slurm state, for `experiment status`.
pub fn describe(view: &SlurmView) -> String {
    let mut by_state: BTreeMap<&str, usize> = BTreeMap::new();
    for key in view.latest.values() {
        let s = view.tasks.get(key).map_or("unknown", |t| t.state.as_str());
        *by_state.entry(s).or_default() += 1;
    }
    let states: Vec<String> = by_state
        .iter()
        .map(|(s, n)| format!("{n} {}", s.to_lowercase()))
        .collect();
    format!(
        "Slurm job{} {}: {}",
        if view.jobs.len() == 1 { "" } else { "s" },
        view.jobs.join(", "),
        states.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_limits_as_sbatch_takes_them() {
        for ok in [
            "10",
            "10:00",
            "00:10:00",
            "1-0",
            "1-12",
            "1-12:30",
            "2-00:00:00",
            "UNLIMITED",
        ] {
            assert!(valid_time(ok), "{ok}");
        }
        for bad in ["", "10m", "1:2:3:4", "-1", "1-", "a:b", "1-2:3:4:5", "1h"] {
            assert!(!valid_time(bad), "{bad}");
        }
    }

    #[test]
    fn options_are_checked_before_anything_is_submitted() {
        let opts = |partition: Option<&str>, time: Option<&str>, extra: &[&str]| SlurmOptions {
            partition: partition.map(str::to_owned),
            time: time.map(str::to_owned),
            sbatch_args: extra.iter().map(|s| (*s).to_owned()).collect(),
        };
        assert!(opts(Some("debug"), Some("00:10:00"), &["--account=lab"])
            .check()
            .is_ok());
        let err = opts(None, Some("10 minutes"), &[])
            .check()
            .expect_err("time");
        assert!(err.to_string().contains("--time"), "{err}");
        let err = opts(Some("a b"), None, &[]).check().expect_err("partition");
        assert!(err.to_string().contains("--partition"), "{err}");
        let err = opts(None, None, &["account=lab"]).check().expect_err("arg");
        assert!(err.to_string().contains("--sbatch-arg"), "{err}");
        assert_eq!(
            opts(Some("p"), Some("5"), &["--qos=x"]).args(1),
            [
                "--nodes=1",
                "--ntasks=1",
                "--exclusive",
                "--partition=p",
                "--time=5",
                "--qos=x"
            ]
        );
    }

    #[test]
    fn squeue_and_sacct_lines_become_tasks() {
        let text = "12_0|RUNNING|node1|None\n12_[2-3]|PENDING||Resources\n12_1|PENDING||Priority\n13|RUNNING|n|None\n";
        let tasks = parse_tasks(text, |f| Task {
            state: f[1].into(),
            node: f[2].into(),
            reason: f[3].into(),
        });
        assert_eq!(tasks.len(), 2, "{tasks:?}");
        assert_eq!(tasks["12_0"].node, "node1");
        assert_eq!(tasks["12_1"].reason, "Priority");
        assert_eq!(phase("CANCELLED"), Some(Phase::Ended));
        assert_eq!(phase("REQUEUED"), Some(Phase::Queued));
        assert_eq!(phase("COMPLETING"), Some(Phase::Ending));
        assert_eq!(phase("SOMETHING_NEW"), None);
        let e = ToolOutput {
            success: false,
            stdout: String::new(),
            stderr: "sbatch: error: invalid partition specified: nope\nsbatch: error: Batch job submission failed: Invalid partition name specified\n".into(),
        };
        assert_eq!(
            e.error_text(),
            "invalid partition specified: nope; Batch job submission failed: Invalid partition name specified"
        );
    }

    fn dir(name: &str) -> ExpDir {
        let d = std::env::temp_dir().join(format!("kml-slurm-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("slurm")).expect("dir");
        std::fs::create_dir_all(d.join("locks")).expect("dir");
        ExpDir::new(d)
    }

    fn view(dir: &ExpDir, tasks: &[(&str, &str, &str)]) -> SlurmView {
        let latest = [("r1", "7_0"), ("r2", "7_1"), ("r3", "9_0")]
            .into_iter()
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .collect();
        SlurmView {
            dir: dir.clone(),
            latest,
            tasks: tasks
                .iter()
                .map(|(k, s, r)| {
                    (
                        (*k).to_owned(),
                        Task {
                            state: (*s).into(),
                            node: "n1".into(),
                            reason: (*r).into(),
                        },
                    )
                })
                .collect(),
            jobs: vec!["7".into(), "9".into()],
            unavailable: None,
            no_history: None,
            here: "here".into(),
        }
    }

    #[test]
    fn slurm_refines_what_the_folder_says() {
        let d = dir("refine");
        let run = |id: &str| PlannedRun {
            run_id: id.into(),
            combo_id: String::new(),
            repeat: 0,
            variables: BTreeMap::new(),
            config: serde_json::Value::Null,
            probes: None,
        };
        let obs = |state, detail: &str, has_collection| Observed {
            run_id: String::new(),
            state,
            detail: detail.into(),
            has_collection,
        };
        let refine = |v: &SlurmView, id: &str, mut o: Observed| {
            v.refine(&run(id), &mut o);
            (o.state, o.detail)
        };
        let v = view(
            &d,
            &[
                ("7_0", "PENDING", "Resources"),
                ("7_1", "RUNNING", "None"),
                ("9_0", "CANCELLED", ""),
            ],
        );
        // Queued and running tasks: the folder cannot tell them from
        // pending.
        assert_eq!(
            refine(&v, "r1", obs(RunState::Pending, "", false)),
            (RunState::Queued, "job 7_0 queued (Resources)".into())
        );
        assert_eq!(
            refine(&v, "r2", obs(RunState::Pending, "", false)),
            (RunState::Running, "job 7_1 on n1".into())
        );
        // A requeued task redoes a cut-off run.
        assert_eq!(
            refine(&v, "r1", obs(RunState::CutOff, "no manifest.json", false)).0,
            RunState::Queued
        );
        // Finished runs are the folder's, whatever Slurm says.
        assert_eq!(
            refine(&v, "r2", obs(RunState::Done, "curated", true)).0,
            RunState::Done
        );
        // Cancelled before it started: still pending, so resume submits it.
        assert_eq!(
            refine(&v, "r3", obs(RunState::Pending, "", false)),
            (
                RunState::Pending,
                "job 9_0 cancelled before the run started".into()
            )
        );
        // A pid file of another machine whose task is over is stale.
        std::fs::write(d.run_pid("r3"), "123 elsewhere\n").expect("pid");
        let (s, detail) = refine(
            &v,
            "r3",
            obs(RunState::Running, "pid 123 on elsewhere", false),
        );
        assert_eq!(s, RunState::CutOff, "{detail}");
        assert!(
            detail.contains("job 9_0 cancelled while running"),
            "{detail}"
        );
        // ... and so is one whose task Slurm no longer knows.
        let forgotten = view(&d, &[]);
        assert_eq!(
            refine(
                &forgotten,
                "r3",
                obs(RunState::Running, "pid 123 on elsewhere", false)
            )
            .0,
            RunState::CutOff
        );
        // A task that ended without a collection failed (resume redoes it).
        let failed = view(&d, &[("7_0", "FAILED", "exit 1:0")]);
        let (s, detail) = refine(&failed, "r1", obs(RunState::Pending, "", false));
        assert_eq!(s, RunState::Failed);
        assert!(
            detail.contains("job 7_0 failed (exit 1:0) without a collection"),
            "{detail}"
        );
        // Runs Slurm never had are left alone, and so is everything when
        // Slurm cannot be asked.
        assert_eq!(
            refine(&v, "other", obs(RunState::Pending, "", false)).0,
            RunState::Pending
        );
        let mut down = view(&d, &[("7_0", "PENDING", "")]);
        down.unavailable = Some("squeue: not found".into());
        assert_eq!(
            refine(&down, "r1", obs(RunState::Pending, "", false)).0,
            RunState::Pending
        );
        let _ = std::fs::remove_dir_all(&d.root);
    }

    #[test]
    fn a_task_records_its_job_task_and_node() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let task = kernmlops::manifest::SlurmEntry::from_vars(env(&[
            ("SLURM_JOB_ID", "43"),
            ("SLURM_ARRAY_JOB_ID", "40"),
            ("SLURM_ARRAY_TASK_ID", "3"),
            ("SLURMD_NODENAME", "node7"),
            ("SLURM_JOB_PARTITION", "batch"),
        ]))
        .expect("inside a job");
        assert_eq!(
            (task.job_id, task.array_job_id, task.array_task_id),
            (43, Some(40), Some(3))
        );
        assert_eq!(task.node.as_deref(), Some("node7"));
        assert_eq!(task.cluster, None);
        assert_eq!(kernmlops::manifest::SlurmEntry::from_vars(env(&[])), None);
        assert_eq!(
            kernmlops::manifest::SlurmEntry::from_vars(env(&[("SLURM_JOB_ID", "x")])),
            None
        );
    }

    #[test]
    fn submissions_are_read_in_order_and_the_latest_task_counts() {
        let d = dir("subs");
        for (n, job, runs) in [(2, "20", vec!["b"]), (1, "10", vec!["a", "b"])] {
            let sub = Submission {
                name: format!("submit-{n:04}"),
                job_id: job.into(),
                runs: runs.into_iter().map(str::to_owned).collect(),
                submitted_utc: String::new(),
                command: Vec::new(),
            };
            std::fs::write(
                d.slurm().join(format!("{}.json", sub.name)),
                serde_json::to_string(&sub).expect("json"),
            )
            .expect("write");
        }
        let subs = Submission::all(&d);
        assert_eq!(
            subs.iter().map(|s| s.job_id.as_str()).collect::<Vec<_>>(),
            ["10", "20"]
        );
        assert_eq!(next_name(&d), "submit-0003");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(job_name(Path::new("/x/fio sweep-1")), "fio_sweep-1");
        let _ = std::fs::remove_dir_all(&d.root);
    }
}
