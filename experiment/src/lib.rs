//! Experiments reach the collector only through its binary (`kernmlops run`) and the files it writes; from the host library they take configuration, plugin checks, trust and file helpers, never `collect`.
//!
//! Experiments: a benchmark swept over variables, repeated, shuffled with a
//! recorded seed, each run a full collection in its own folder, resumable
//! after a crash, with the results as one table and statistics per
//! variable combination.
//!
//! The experiment layer drives the collector only through its binary and
//! its files: a run is one `kernmlops run --collection-dir <dir>/runs/<id>`
//! process, and what it did is read back from that folder's `manifest.json`
//! and `indicator.json`. A run that crashes cannot take the experiment down,
//! and a run cut off mid-way is recognised by its manifest.
//!
//! - [`spec`]: the experiment file (variables, conditions, repeats, order).
//! - [`plan`]: variables expanded into runs, each with a `run_id` hashed
//!   from its effective configuration, repeat index and seed.
//! - [`record`]: the experiment folder and `experiment.json`, the
//!   machine-readable record every executor works from.
//! - [`state`]: where each planned run stands, read from its folder.
//! - [`executor`]: the [`executor::Executor`] trait and the local executor;
//!   [`executor::perform_run`] carries out one planned run.
//! - [`roles`]: `[roles.NAME]` tables (several programs per run, each on
//!   its own node), their checks and start order; [`roles_run`] runs
//!   them on this machine (`--executor local`).
//! - [`build`]: `[build]`, commands run once per node before its first
//!   run, cached by a hash of their inputs, the commands and the node.
//! - [`slurm`]: the Slurm executor (one job array per submission, a task
//!   per run on an exclusive node) and Slurm's view of the runs.
//! - [`results`]: `results.parquet` / `results.arrow`, one row per run,
//!   from each run's files read through the host's types ([`run_files`]:
//!   `manifest.json` with a roles run's additions; `indicator.json` is
//!   `kernmlops::indicator::IndicatorFile`).
//! - [`stats`]: mean, standard deviation, Student-t confidence intervals and
//!   adaptive stopping.
//! - [`commands`]: the bodies of the `kernmlops experiment` commands (the
//!   command line itself is `kernmlops-cli`'s), with [`checks`] (what is
//!   checked before anything is trusted or run), [`adaptive`] (adaptive
//!   repeats) and [`report`] (what is printed).
//! - [`compare`]: Welch's t-test, Holm's correction, ratio intervals, robust
//!   spread and best levels, for comparisons and labels.
//! - [`comparisons`]: `comparisons.parquet` (`experiment results
//!   --reference`), `labels.parquet` (`--best-by`), `overhead.parquet`
//!   (the collector's effect, when a `probes` variable has a baseline) and
//!   `experiment compare`.

pub mod adaptive;
pub mod build;
pub mod checks;
pub mod commands;
pub mod compare;
pub mod comparisons;
pub mod device;
pub mod executor;
pub mod graphs;
pub mod plan;
pub mod progress;
pub mod record;
pub mod report;
pub mod results;
pub mod rng;
pub mod roles;
pub mod roles_run;
pub mod run_files;
pub mod slurm;
pub mod spec;
pub mod srun;
pub mod state;
pub mod stats;

use std::path::PathBuf;

/// What went wrong in the experiment layer. Messages are one line and name
/// the file, key or run concerned.
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    /// Bad input in an experiment file (or the configuration it builds).
    #[error("{file}: {key}: {message}")]
    Invalid {
        file: String,
        key: String,
        message: String,
    },
    /// The experiment file is not valid TOML or has an unknown key.
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    /// Reading or writing a file or folder failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file the experiment wrote is not what it should be.
    #[error("{}: {message}", path.display())]
    Corrupt { path: PathBuf, message: String },
    /// The folder is not an experiment folder.
    #[error("{} is not an experiment folder (no experiment.json); start one (or start again one cut off before its record was written) with `kernmlops experiment run FILE --dir {}`", dir.display(), dir.display())]
    NotAnExperiment { dir: PathBuf },
    /// Another process is running this experiment or this run.
    #[error("{what} is in use by another kernmlops process ({holder}); wait for it or stop it")]
    Busy { what: String, holder: String },
    /// The plugins here differ from those the experiment recorded.
    #[error("plugins differ from the experiment's record ({0}); use the same plugin build, or pass --allow-plugin-change to accept the new set")]
    PluginsChanged(String),
    /// A run id that the experiment does not plan.
    #[error("{dir}: no planned run {run_id} (see `kernmlops experiment status {dir}`)")]
    UnknownRun { dir: String, run_id: String },
    /// Starting a run's process failed.
    #[error("starting {program}: {source}")]
    Launch {
        program: String,
        source: std::io::Error,
    },
    /// Writing the results table failed.
    #[error("writing {}: {message}", path.display())]
    Results { path: PathBuf, message: String },
    /// A command-line option that does not fit the experiment.
    #[error("{0}")]
    Usage(String),
    /// The plugins could not be loaded or checked.
    #[error("{0}")]
    Plugins(String),
    /// A Slurm tool is not installed here.
    #[error("{program} not found: Slurm's client tools are not installed here (Debian: slurm-client; scripts/slurm-local runs a one-node cluster), or use --executor local; nothing was submitted")]
    SlurmMissing { program: String },
    /// sbatch refused a submission (or could not reach the controller).
    #[error("Slurm refused the submission, nothing was submitted: {0}")]
    SlurmRefused(String),
    /// This node's `kernmlops` is not the binary that submitted the run.
    #[error("{0}")]
    BinaryChanged(String),
}

impl ExperimentError {
    /// An [`ExperimentError::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
}

/// Result of the experiment layer.
pub type Result<T, E = ExperimentError> = std::result::Result<T, E>;
