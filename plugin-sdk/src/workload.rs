//! Running a benchmark's workload: each command in a process group of its
//! own, so stopping it stops everything it started, its standard output and
//! error optionally kept in files for the benchmark to parse afterwards;
//! plus the machine setup benchmarks share (dropping the page cache, the
//! transparent huge page mode) and finding the software they need.
//!
//! What a benchmark changes on the machine (a kernel setting, a temporary
//! file or folder) is first recorded in its [`UndoLog`], in the state
//! folder the host passes (`StartArgs::state_dir`), so the host undoes it
//! even if it was killed before the benchmark's own `kill` ran. The
//! processes a workload starts need no record: the host runs `setup` and
//! `launch` inside a cgroup of its own, and kills that cgroup.

use std::{
    fs::File,
    os::unix::process::{CommandExt, ExitStatusExt},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use kernmlops_sys::private::{self, TempDir};

use crate::{Error, Result};

/// Mode of the files a benchmark creates for its tools' output.
const FILE_MODE: u32 = 0o644;

/// Creates `path`, which must not exist, exclusively and never through a
/// symlink (`O_CREAT | O_EXCL | O_NOFOLLOW` relative to its folder's
/// descriptor). `what` says what the file is for, in errors.
pub fn create_new_file(path: &Path, what: &str) -> Result<File> {
    let fail = |why: String| Error::new(format!("creating {} for {what}: {why}", path.display()));
    let name = path
        .file_name()
        .ok_or_else(|| fail("not a file path".into()))?;
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = private::open_dir(folder).map_err(|e| fail(private::strip_os_error(&e)))?;
    private::create_new_at(&dir, name, FILE_MODE).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            fail("it exists already (a new output folder holds nothing, so something else put it there); refusing to write through it".into())
        } else {
            fail(private::strip_os_error(&e))
        }
    })
}

/// Where a workload's standard output and error go: a file each, or (for
/// `None`) the host's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capture {
    pub stdout: Option<PathBuf>,
    pub stderr: Option<PathBuf>,
}

impl Capture {
    /// Both streams, into `<dir>/<stem>.stdout` and `<dir>/<stem>.stderr`.
    pub fn both(dir: &Path, stem: &str) -> Self {
        Self {
            stdout: Some(dir.join(format!("{stem}.stdout"))),
            stderr: Some(dir.join(format!("{stem}.stderr"))),
        }
    }

    /// Standard error only, into `path`; standard output stays the host's.
    pub fn stderr(path: PathBuf) -> Self {
        Self {
            stdout: None,
            stderr: Some(path),
        }
    }
}

/// Creates a capture file, which must not exist yet (exclusively, never
/// through a symlink), naming the stream in errors.
fn capture_file(path: &Path, stream: &str, what: &str) -> Result<File> {
    create_new_file(path, &format!("the {stream} of {what}"))
}

/// A running command and its process group.
pub struct Workload {
    what: String,
    child: Child,
    exit: Option<i32>,
    capture: Capture,
    started: Instant,
    ended: Option<Instant>,
    killed: bool,
}

impl Workload {
    /// Starts `cmd` as the leader of a new process group, standard input
    /// closed, standard output and error the host's. `what` names it in
    /// errors.
    pub fn spawn(cmd: Command, what: &str) -> Result<Self> {
        Self::spawn_captured(cmd, what, &Capture::default())
    }

    /// As [`Workload::spawn`], with standard output and error written to
    /// the files `capture` names (created; they must not exist yet, and a
    /// symlink in their place is refused, never followed). The files stay
    /// after the workload ends: read them with [`Workload::read_stdout`]
    /// and [`Workload::read_stderr`].
    pub fn spawn_captured(mut cmd: Command, what: &str, capture: &Capture) -> Result<Self> {
        cmd.process_group(0).stdin(Stdio::null());
        if let Some(path) = &capture.stdout {
            cmd.stdout(capture_file(path, "standard output", what)?);
        }
        if let Some(path) = &capture.stderr {
            cmd.stderr(capture_file(path, "standard error", what)?);
        }
        let child = cmd.spawn().map_err(|e| {
            let program = cmd.get_program().to_string_lossy().into_owned();
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::new(format!(
                    "starting {what}: {program} is not installed or not on PATH"
                ))
            } else {
                Error::new(format!("starting {what} ({program}): {e}"))
            }
        })?;
        Ok(Self {
            what: what.to_owned(),
            child,
            exit: None,
            capture: capture.clone(),
            started: Instant::now(),
            ended: None,
            killed: false,
        })
    }

    /// The leader's process id (and the group's id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The file standard output goes to, when captured.
    pub fn stdout_path(&self) -> Option<&Path> {
        self.capture.stdout.as_deref()
    }

    /// The file standard error goes to, when captured.
    pub fn stderr_path(&self) -> Option<&Path> {
        self.capture.stderr.as_deref()
    }

    /// What the workload wrote on standard output so far (all of it once
    /// it has ended); an error when it was not captured or is unreadable.
    pub fn read_stdout(&self) -> Result<String> {
        self.read_capture(self.stdout_path(), "standard output")
    }

    /// As [`Workload::read_stdout`], for standard error.
    pub fn read_stderr(&self) -> Result<String> {
        self.read_capture(self.stderr_path(), "standard error")
    }

    fn read_capture(&self, path: Option<&Path>, stream: &str) -> Result<String> {
        let path = path
            .ok_or_else(|| Error::new(format!("the {stream} of {} was not captured", self.what)))?;
        let bytes = std::fs::read(path).map_err(|e| {
            Error::new(format!(
                "reading the {stream} of {} ({}): {e}",
                self.what,
                path.display()
            ))
        })?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// How long the leader ran: from the start until `poll` (or `kill`)
    /// first saw it end, so within one polling interval. `None` while it
    /// runs.
    pub fn elapsed(&self) -> Option<Duration> {
        self.ended.map(|end| end - self.started)
    }

    /// True when [`Workload::kill`] stopped the leader before it ended on
    /// its own: its output may be incomplete.
    pub fn was_killed(&self) -> bool {
        self.killed
    }

    /// `Some(exit code)` once the leader has ended; a signal counts as
    /// 128 + its number, like a shell.
    pub fn poll(&mut self) -> Result<Option<i32>> {
        if self.exit.is_some() {
            return Ok(self.exit);
        }
        let status = self
            .child
            .try_wait()
            .map_err(|e| Error::new(format!("waiting for {}: {e}", self.what)))?;
        self.exit = status.map(|s| s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)));
        if self.exit.is_some() {
            self.ended = Some(Instant::now());
        }
        Ok(self.exit)
    }

    /// True while any process of the group is alive.
    fn group_alive(&self) -> bool {
        let pgid = self.child.id() as i32;
        // SAFETY: signal 0 only checks for existence.
        unsafe { libc::kill(-pgid, 0) == 0 }
    }

    /// Stops the whole group: SIGTERM, then SIGKILL after `grace`, and
    /// waits until no process of it is left.
    pub fn kill(&mut self, grace: Duration) -> Result<()> {
        let pgid = self.child.id() as i32;
        if self.exit.is_none() {
            // A last look, so a leader that already ended counts as ended
            // on its own.
            let _ = self.poll();
        }
        let ended_before = self.exit.is_some();
        // SAFETY: signalling a process group this workload created.
        unsafe { libc::kill(-pgid, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        while self.group_alive() && Instant::now() < deadline {
            let _ = self.poll();
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.group_alive() {
            // SAFETY: as above.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
        let status = self
            .child
            .wait()
            .map_err(|e| Error::new(format!("waiting for {} to end: {e}", self.what)))?;
        if self.exit.is_none() {
            self.exit = Some(
                status
                    .code()
                    .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
            );
            self.ended = Some(Instant::now());
        }
        if !ended_before {
            self.killed = true;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.group_alive() {
            if Instant::now() >= deadline {
                return Err(Error::new(format!(
                    "{}: processes of group {pgid} survived SIGKILL",
                    self.what
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        if self.group_alive() || self.exit.is_none() {
            let _ = self.kill(Duration::from_secs(1));
        }
    }
}

/// The folder a benchmark keeps its tools' output in (captured standard
/// output and error, result files), so it can parse them once the workload
/// has ended.
#[derive(Debug)]
pub struct OutputDir {
    path: PathBuf,
    /// The temporary fallback, removed when dropped.
    temporary: Option<TempDir>,
}

impl OutputDir {
    /// The run's collection folder, `output_dir` (`StartArgs::output_dir`),
    /// created if it does not exist yet. When it is empty (outside a run,
    /// in tests, or from a host that does not pass the collection folder
    /// yet) a fresh private temporary folder
    /// (`<TMPDIR>/kernmlops-<benchmark>-output.<random>`, mode 0700),
    /// removed when this value is dropped.
    pub fn new(output_dir: &str, benchmark: &str) -> Result<Self> {
        if output_dir.is_empty() {
            let prefix = format!("kernmlops-{benchmark}-output");
            let temp = TempDir::new(&prefix).map_err(|e| {
                Error::new(format!(
                    "creating a temporary output folder of {benchmark}: {}",
                    private::strip_os_error(&e)
                ))
            })?;
            return Ok(Self {
                path: temp.path().to_owned(),
                temporary: Some(temp),
            });
        }
        let path = PathBuf::from(output_dir);
        std::fs::create_dir_all(&path).map_err(|e| {
            Error::new(format!(
                "creating the output folder {} of {benchmark}: {e}",
                path.display()
            ))
        })?;
        Ok(Self {
            path,
            temporary: None,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `<folder>/<file>`.
    pub fn join(&self, file: &str) -> PathBuf {
        self.path.join(file)
    }

    /// True for the temporary fallback, which is removed on drop.
    pub fn is_temporary(&self) -> bool {
        self.temporary.is_some()
    }

    /// Creates the empty file `<folder>/<file>` exclusively (never through
    /// a symlink) for a tool to write its report into, and returns its
    /// path: the tool then opens a regular file this benchmark made.
    pub fn new_report(&self, file: &str, tool: &str) -> Result<PathBuf> {
        let path = self.join(file);
        create_new_file(&path, &format!("the report of {tool}"))?;
        Ok(path)
    }
}

/// The path of `program` on PATH, or an error saying what to install.
pub fn require_program(program: &str, install_hint: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| Error::new(format!("{program} is not installed: {install_hint}")))
}

/// Writes dirty pages and drops the page cache, so every run starts cold.
pub fn drop_page_cache() -> Result<()> {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").map_err(|e| {
        Error::new(format!(
            "dropping the page cache (/proc/sys/vm/drop_caches): {e}"
        ))
    })
}

/// The file of the transparent huge page mode.
pub const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// The transparent huge page mode in force (`always`, `madvise`, `never`).
pub fn thp_mode() -> Result<String> {
    let text = std::fs::read_to_string(THP_ENABLED)
        .map_err(|e| Error::new(format!("{THP_ENABLED}: {e}")))?;
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
        .map(str::to_owned)
        .ok_or_else(|| Error::new(format!("{THP_ENABLED}: no selected mode in {text:?}")))
}

/// The undo log's file in the state folder: one JSON object per line,
/// `{"restore": PATH, "value": TEXT}` (write `TEXT` back to the kernel
/// setting `PATH`, under `/sys` or `/proc/sys`) or `{"remove": PATH}`
/// (remove the file or folder `PATH` with everything in it). The host
/// (`kernmlops` `undo.rs`) replays it, newest first, after a run.
pub const UNDO_LOG: &str = "undo.jsonl";

/// Where a benchmark records what it is about to change on the machine,
/// before changing it, so the host can undo it after a crash. Made from
/// `StartArgs::state_dir`; without a state folder (outside a run, in
/// tests) it records nothing and every change proceeds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UndoLog {
    file: Option<PathBuf>,
}

impl UndoLog {
    /// The log of the state folder `state_dir` (`""`: none).
    pub fn new(state_dir: &str) -> Self {
        Self {
            file: (!state_dir.is_empty()).then(|| Path::new(state_dir).join(UNDO_LOG)),
        }
    }

    /// True when changes are recorded.
    pub fn is_active(&self) -> bool {
        self.file.is_some()
    }

    /// Records that the kernel setting `path` is to be set back to
    /// `previous`; call before writing a new value to it.
    pub fn restore_later(&self, path: &Path, previous: &str) -> Result<()> {
        self.append(&serde_json::json!({
            "restore": path.to_string_lossy(),
            "value": previous,
        }))
    }

    /// Records that `path` (a file, or a folder and everything in it) is to
    /// be removed; call before creating it.
    pub fn remove_later(&self, path: &Path) -> Result<()> {
        self.append(&serde_json::json!({ "remove": path.to_string_lossy() }))
    }

    /// Creates a fresh private folder `<base>/<prefix>.<random>` (mode
    /// 0700, `mkdirat`, never reusing or following anything planted in
    /// `base`) and records it for removal before anything is put in it. A
    /// crash between the two leaves one empty private folder; it is never
    /// a predictable path. Removed when the returned value is dropped.
    pub fn create_private_dir(&self, base: &Path, prefix: &str) -> Result<TempDir> {
        let dir = TempDir::new_in(base, prefix).map_err(|e| {
            Error::new(format!(
                "creating a private folder in {}: {}",
                base.display(),
                private::strip_os_error(&e)
            ))
        })?;
        self.remove_later(dir.path())?;
        Ok(dir)
    }

    /// Appends one record as one line in one write, and syncs it: the
    /// record is on disk before the change it announces.
    fn append(&self, record: &serde_json::Value) -> Result<()> {
        use std::io::Write;
        let Some(file) = &self.file else {
            return Ok(());
        };
        let line = format!("{record}\n");
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
            .and_then(|mut f| {
                f.write_all(line.as_bytes())?;
                f.sync_data()
            })
            .map_err(|e| {
                Error::new(format!(
                    "recording the change to undo in {}: {e}",
                    file.display()
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_undo_log_records_before_each_change() {
        let dir = std::env::temp_dir().join(format!("kml-undo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let log = UndoLog::new(dir.to_str().expect("utf8"));
        assert!(log.is_active() && !UndoLog::new("").is_active());
        let made = log.create_private_dir(&dir, "scratch").expect("create");
        assert!(made.path().is_dir() && made.path().starts_with(&dir));
        let made = made.keep();
        log.restore_later(Path::new("/sys/x"), "a \"b\"\n")
            .expect("restore");
        let text = std::fs::read_to_string(dir.join(UNDO_LOG)).expect("log");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON object per line"))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["remove"], made.to_str().expect("utf8"));
        assert_eq!(lines[1]["restore"], "/sys/x");
        assert_eq!(lines[1]["value"], "a \"b\"\n");
        // Without a state folder nothing is recorded and changes proceed.
        let other = UndoLog::new("")
            .create_private_dir(&dir, "other")
            .expect("create");
        let other_path = other.path().to_owned();
        drop(other);
        assert!(!other_path.exists(), "a private folder is removed on drop");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn kill_stops_the_whole_group() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 30 & sleep 30 & wait"]);
        let mut w = Workload::spawn(cmd, "test workload").expect("spawn");
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(w.poll().expect("poll"), None);
        w.kill(Duration::from_secs(2)).expect("kill");
        assert!(!w.group_alive(), "a child of the workload survived");
        assert_eq!(w.poll().expect("poll"), Some(128 + libc::SIGTERM));
    }

    #[test]
    fn exit_codes_and_missing_programs() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "exit 3"]);
        let mut w = Workload::spawn(cmd, "failing").expect("spawn");
        let deadline = Instant::now() + Duration::from_secs(5);
        while w.poll().expect("poll").is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(w.poll().expect("poll"), Some(3));
        let err = Workload::spawn(Command::new("no-such-program-kml"), "ghost")
            .err()
            .expect("fails");
        assert!(err.message.contains("not installed"), "{err}");
        assert!(require_program("sh", "").is_ok());
        assert!(require_program("no-such-program-kml", "apt-get install x").is_err());
    }

    fn wait_exit(w: &mut Workload) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(code) = w.poll().expect("poll") {
                return code;
            }
            assert!(
                Instant::now() < deadline,
                "workload still running after 10 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn captures_stdout_and_stderr_into_files() {
        let out = OutputDir::new("", "capture-test").expect("output dir");
        assert!(out.is_temporary() && out.path().is_dir());
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo to-out; echo to-err >&2; sh -c 'echo child-out'"]);
        let mut w = Workload::spawn_captured(cmd, "capture", &Capture::both(out.path(), "bench"))
            .expect("spawn");
        assert_eq!(wait_exit(&mut w), 0);
        assert_eq!(w.read_stdout().expect("stdout"), "to-out\nchild-out\n");
        assert_eq!(w.read_stderr().expect("stderr"), "to-err\n");
        assert_eq!(w.stdout_path(), Some(out.join("bench.stdout").as_path()));
        assert!(!w.was_killed());
        let took = w.elapsed().expect("ended");
        assert!(took < Duration::from_secs(5), "{took:?}");
        w.kill(Duration::from_secs(1)).expect("kill after exit");
        assert!(!w.was_killed(), "it ended on its own before kill");

        // Standard output not captured: reading it says so.
        let mut cmd = Command::new("true");
        cmd.stdout(Stdio::null());
        let mut w = Workload::spawn_captured(cmd, "quiet", &Capture::stderr(out.join("q.err")))
            .expect("spawn");
        wait_exit(&mut w);
        let e = w.read_stdout().expect_err("not captured");
        assert!(
            e.message
                .contains("standard output of quiet was not captured"),
            "{e}"
        );
        assert_eq!(w.read_stderr().expect("stderr"), "");

        // A capture file that cannot be created is named.
        let bad = Capture::both(Path::new("/no/such/dir-kml"), "x");
        let e = Workload::spawn_captured(Command::new("true"), "nowhere", &bad)
            .err()
            .expect("fails");
        assert!(e.message.contains("/no/such/dir-kml/x.stdout"), "{e}");

        // A name planted where a capture file goes is refused, its target
        // untouched.
        let victim = out.join("victim");
        std::fs::write(&victim, "precious").expect("victim");
        std::os::unix::fs::symlink(&victim, out.join("p.stdout")).expect("symlink");
        let e = Workload::spawn_captured(
            Command::new("true"),
            "planted",
            &Capture::both(out.path(), "p"),
        )
        .err()
        .expect("refused");
        assert!(e.message.contains("exists already"), "{e}");
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "precious");

        let path = out.path().to_path_buf();
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        assert!(name.starts_with("kernmlops-capture-test-output."), "{name}");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).expect("meta").permissions(),
        );
        assert_eq!(mode & 0o777, 0o700, "the temporary folder is private");
        drop(out);
        assert!(!path.exists(), "temporary output folder left behind");
    }

    #[test]
    fn kill_of_a_captured_group_keeps_the_output() {
        let dir = std::env::temp_dir().join(format!("kml-workload-{}", std::process::id()));
        let out = OutputDir::new(dir.to_str().expect("utf8"), "kept").expect("output dir");
        assert!(!out.is_temporary());
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo started; sleep 30 & wait"]);
        let mut w = Workload::spawn_captured(cmd, "sleeper", &Capture::both(out.path(), "s"))
            .expect("spawn");
        let deadline = Instant::now() + Duration::from_secs(5);
        while w.read_stdout().expect("stdout").is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        w.kill(Duration::from_secs(2)).expect("kill");
        assert!(w.was_killed());
        assert!(!w.group_alive());
        assert!(w.elapsed().is_some());
        assert_eq!(w.read_stdout().expect("stdout"), "started\n");
        drop(w);
        drop(out);
        assert!(dir.join("s.stdout").is_file(), "a run's folder is kept");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
