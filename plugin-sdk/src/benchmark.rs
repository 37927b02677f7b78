//! What every benchmark shares beyond its own settings: the machine
//! settings (flattened into each benchmark's settings struct), and the
//! [`Run`] that holds what a benchmark started and changed, so one `poll`
//! and one `kill` serve every benchmark.
//!
//! `thp_mode` is a benchmark setting the host applies itself: it turns it
//! into the run's `machine.thp_mode` kernel knob (set, read back, recorded
//! and restored with every knob) and passes the benchmark its settings
//! without it, so a benchmark only reads the mode in force.
//!
//! ```ignore
//! settings! {
//!     /// `[benchmarks.fio]` settings.
//!     pub struct FioSettings {
//!         #[flatten]
//!         pub machine: MachineSettings,
//!         /// Block size (fio --bs).
//!         pub bs: String = "4k".into(),
//!     }
//! }
//! ```

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use kernmlops_sys::private::TempDir;
use serde::{Deserialize, Serialize};

use crate::{
    workload::{self, OutputDir, UndoLog, Workload},
    Error, Result, StartArgs,
};

/// How long a stopped workload gets between SIGTERM and SIGKILL.
pub const GRACE: Duration = Duration::from_secs(3);

/// The transparent huge page mode a benchmark runs under. Written as text
/// in settings: `""` leaves the mode as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum ThpMode {
    /// `""`: the mode in force stays.
    #[default]
    Unchanged,
    Always,
    Madvise,
    Never,
}

impl ThpMode {
    /// The word of `/sys/kernel/mm/transparent_hugepage/enabled`; `""` for
    /// [`ThpMode::Unchanged`].
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unchanged => "",
            Self::Always => "always",
            Self::Madvise => "madvise",
            Self::Never => "never",
        }
    }
}

/// A `thp_mode` that is not one of the kernel's modes (or `""`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("thp_mode = {mode:?}: use \"\" (leave as is), \"always\", \"madvise\" or \"never\"")]
pub struct ThpModeError {
    pub mode: String,
}

impl TryFrom<String> for ThpMode {
    type Error = ThpModeError;

    fn try_from(mode: String) -> std::result::Result<Self, ThpModeError> {
        match mode.as_str() {
            "" => Ok(Self::Unchanged),
            "always" => Ok(Self::Always),
            "madvise" => Ok(Self::Madvise),
            "never" => Ok(Self::Never),
            _ => Err(ThpModeError { mode }),
        }
    }
}

impl From<ThpMode> for String {
    fn from(mode: ThpMode) -> Self {
        mode.as_str().to_owned()
    }
}

crate::settings! {
    /// The machine settings every benchmark shares, flattened into its
    /// `[benchmarks.<name>]` table.
    pub struct MachineSettings {
        /// Drop the page cache before the run.
        pub drop_page_cache: bool = true,
        /// Transparent huge pages during the run: "" leaves the mode as is; always, madvise or never.
        pub thp_mode: ThpMode = ThpMode::Unchanged,
    }
}

/// The section a benchmark's settings errors start with.
pub fn section(name: &str) -> String {
    format!("[benchmarks.{name}]")
}

/// What one benchmark started and changed: its workload (whose exit code
/// is the benchmark's), the servers it loads, a private folder, its output
/// folder and the machine settings it changed (each change recorded in the
/// run's undo log first). [`Run::poll`] and [`Run::kill`] are the
/// default `poll` and `kill` of every benchmark.
pub struct Run {
    name: &'static str,
    undo: UndoLog,
    run_dir: String,
    out: Option<OutputDir>,
    dir: Option<TempDir>,
    work: Option<Workload>,
    servers: Vec<Workload>,
    /// The THP mode during the run, once `prepare` ran (`None` on a kernel
    /// without THP).
    thp_in_force: Option<String>,
}

impl Run {
    /// The run of benchmark `name` with the host's start arguments (its
    /// state folder for the undo log, its collection folder for output).
    pub fn new(name: &'static str, args: &StartArgs) -> Self {
        Self {
            name,
            undo: UndoLog::new(&args.state_dir),
            run_dir: args.output_dir.to_string(),
            out: None,
            dir: None,
            work: None,
            servers: Vec::new(),
            thp_in_force: None,
        }
    }

    /// The run's undo log.
    pub fn undo(&self) -> &UndoLog {
        &self.undo
    }

    /// Drops the page cache if asked and notes the THP mode in force (the
    /// host set it from `thp_mode` before the benchmark was created).
    pub fn prepare(&mut self, machine: &MachineSettings) -> Result<()> {
        if machine.drop_page_cache {
            workload::drop_page_cache()?;
        }
        self.thp_in_force = workload::thp_mode().ok();
        Ok(())
    }

    /// The THP mode in force during the run, once `prepare` ran.
    pub fn thp_in_force(&self) -> Option<&str> {
        self.thp_in_force.as_deref()
    }

    /// A fresh private folder `kernmlops-<name>.<random>` under `base`
    /// (the system's temporary folder when `None`), mode 0700, made with
    /// `mkdirat` so nothing planted in `base` is reused or followed,
    /// recorded in the undo log, and removed by `kill`. Made once: later
    /// calls return the same folder.
    pub fn private_dir(&mut self, base: Option<&Path>) -> Result<&Path> {
        if self.dir.is_none() {
            let base = base.map_or_else(std::env::temp_dir, Path::to_path_buf);
            let dir = self
                .undo
                .create_private_dir(&base, &format!("kernmlops-{}", self.name))?;
            self.dir = Some(dir);
        }
        self.private_path()
            .ok_or_else(|| Error::new(format!("{}: no private folder", self.name)))
    }

    /// The private folder, once made.
    pub fn private_path(&self) -> Option<&Path> {
        self.dir.as_ref().map(TempDir::path)
    }

    /// The private folder, or an error saying `launch` came before `setup`.
    pub fn private_path_for_launch(&self) -> Result<PathBuf> {
        self.private_path()
            .map(Path::to_path_buf)
            .ok_or_else(|| Error::new(format!("{}: launch before setup", self.name)))
    }

    /// The output folder, made on first use (see [`OutputDir::new`]: the
    /// run's collection folder, or a temporary one).
    pub fn output_dir(&mut self) -> Result<&OutputDir> {
        if self.out.is_none() {
            self.out = Some(OutputDir::new(&self.run_dir, self.name)?);
        }
        self.output()
            .ok_or_else(|| Error::new(format!("{}: no output folder", self.name)))
    }

    /// The output folder, once made.
    pub fn output(&self) -> Option<&OutputDir> {
        self.out.as_ref()
    }

    /// Starts keeping `work`, the workload whose exit code is the
    /// benchmark's.
    pub fn start(&mut self, work: Workload) {
        self.work = Some(work);
    }

    /// Starts `cmd` (`what` names it in errors) as the workload, its
    /// standard output and error in the output folder's `benchmark.*`
    /// files, and keeps it as [`Run::start`] does.
    pub fn start_captured(&mut self, cmd: std::process::Command, what: &str) -> Result<()> {
        let out = self.output_dir()?;
        let capture = workload::Capture::both(out.path(), "benchmark");
        let work = Workload::spawn_captured(cmd, what, &capture)?;
        self.start(work);
        Ok(())
    }

    /// Starts keeping `server`, a workload the benchmark's own loads;
    /// `kill` stops it after the workload.
    pub fn start_server(&mut self, server: Workload) -> &mut Workload {
        self.servers.push(server);
        let last = self.servers.len() - 1;
        &mut self.servers[last]
    }

    /// The workload, once started.
    pub fn workload(&self) -> Option<&Workload> {
        self.work.as_ref()
    }

    /// The first server, once started.
    pub fn server(&self) -> Option<&Workload> {
        self.servers.first()
    }

    /// The workload once it ended on its own (the one whose output a
    /// result reads); otherwise why there is no result. `tool` names it.
    pub fn finished(&self, tool: &str) -> Result<&Workload> {
        let name = self.name;
        let w = self
            .work
            .as_ref()
            .ok_or_else(|| Error::new(format!("{name}: no result: {tool} never started")))?;
        if w.was_killed() {
            return Err(Error::new(format!(
                "{name}: no result: {tool} was stopped before it finished"
            )));
        }
        if w.elapsed().is_none() {
            return Err(Error::new(format!(
                "{name}: no result yet: {tool} is still running"
            )));
        }
        Ok(w)
    }

    /// `Some(exit code)` once the workload has ended.
    pub fn poll(&mut self) -> Result<Option<i32>> {
        match self.work.as_mut() {
            Some(w) => w.poll(),
            None => Err(Error::new(format!("{}: poll before launch", self.name))),
        }
    }

    /// Stops the workload (nothing when it never started).
    pub fn stop(&mut self) -> Result<()> {
        match self.work.as_mut() {
            Some(w) => w.kill(GRACE),
            None => Ok(()),
        }
    }

    /// Stops everything and undoes every change, in this order: the
    /// workload, the servers (last started first), the private folder.
    /// Every step runs; the first error is returned.
    pub fn kill(&mut self) -> Result<()> {
        let mut result = self.stop();
        for server in self.servers.iter_mut().rev() {
            result = result.and(server.kill(GRACE));
        }
        result.and(self.remove_private_dir())
    }

    fn remove_private_dir(&mut self) -> Result<()> {
        let Some(dir) = self.dir.take() else {
            return Ok(());
        };
        let dir = dir.keep();
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::new(format!("removing {}: {e}", dir.display()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;
    use crate::settings::{defaults_toml, parse};

    crate::settings! {
        /// Settings of a test benchmark.
        pub struct Demo {
            #[flatten]
            pub machine: MachineSettings,
            /// Worker count.
            pub workers: u32 = 2,
        }
        validate(s) {
            if s.workers == 0 {
                return Err("workers = 0: use 1 or more".into());
            }
            Ok(())
        }
    }

    fn args(state_dir: &str) -> StartArgs {
        StartArgs::new("{}").with_state_dir(state_dir)
    }

    #[test]
    fn machine_settings_are_flattened_with_their_comments() {
        assert_eq!(
            defaults_toml::<Demo>(),
            "# Drop the page cache before the run.\ndrop_page_cache = true\n\
             # Transparent huge pages during the run: \"\" leaves the mode as is; always, madvise or never.\nthp_mode = \"\"\n\
             # Worker count.\nworkers = 2\n"
        );
        let s: Demo = parse(
            "[benchmarks.demo]",
            r#"{"thp_mode": "never", "workers": 3}"#,
        )
        .expect("parses");
        assert_eq!(s.machine.thp_mode, ThpMode::Never);
        assert!(s.machine.drop_page_cache);
        assert_eq!(s.workers, 3);
        let e = parse::<Demo>("[benchmarks.demo]", r#"{"bogus": 1}"#).expect_err("unknown");
        assert!(
            e.message
                .starts_with("[benchmarks.demo]: unknown field `bogus`"),
            "{e}"
        );
        let e = parse::<Demo>("[benchmarks.demo]", r#"{"thp_mode": "huge"}"#).expect_err("mode");
        assert_eq!(
            e.message,
            "[benchmarks.demo]: thp_mode = \"huge\": use \"\" (leave as is), \"always\", \"madvise\" or \"never\""
        );
        let e = parse::<Demo>("[benchmarks.demo]", r#"{"workers": 0}"#).expect_err("rule");
        assert_eq!(e.message, "[benchmarks.demo]: workers = 0: use 1 or more");
        let e = parse::<Demo>("[benchmarks.demo]", r#"{"drop_page_cache": 1}"#).expect_err("type");
        assert!(e.message.contains("invalid type"), "{e}");
    }

    #[test]
    fn kill_stops_the_workload_and_servers_and_removes_the_private_folder() {
        let state = TempDir::new("kml-run-test").expect("temp dir");
        let mut run = Run::new("demo", &args(state.path().to_str().expect("utf8")));
        assert!(run.poll().is_err(), "poll before launch");
        let dir = run.private_dir(None).expect("private").to_owned();
        assert_eq!(run.private_dir(None).expect("again"), dir, "made once");
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let server = run
            .start_server(Workload::spawn(cmd, "server").expect("spawn"))
            .pid();
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        run.start(Workload::spawn(cmd, "work").expect("spawn"));
        assert_eq!(run.poll().expect("poll"), None);
        assert!(run.finished("sleep").is_err(), "still running");
        run.kill().expect("kill");
        assert_eq!(run.poll().expect("poll"), Some(128 + libc::SIGTERM));
        let e = run.finished("sleep").err().expect("killed");
        assert_eq!(
            e.message,
            "demo: no result: sleep was stopped before it finished"
        );
        // SAFETY: signal 0 only checks for existence.
        let alive = unsafe { libc::kill(server as i32, 0) } == 0;
        assert!(!alive, "server left running");
        assert!(!dir.exists(), "private folder left behind");
        let log = std::fs::read_to_string(state.path().join(workload::UNDO_LOG)).expect("log");
        assert!(log.contains(dir.to_str().expect("utf8")), "{log}");
    }
}
