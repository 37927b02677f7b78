//! Running a benchmark's workload: each command in a process group of its
//! own, so stopping it stops everything it started; plus the machine setup
//! benchmarks share (dropping the page cache, the transparent huge page
//! mode) and finding the software they need.

use std::{
    os::unix::process::{CommandExt, ExitStatusExt},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{Error, Result};

/// A running command and its process group.
pub struct Workload {
    what: String,
    child: Child,
    exit: Option<i32>,
}

impl Workload {
    /// Starts `cmd` as the leader of a new process group, standard input
    /// closed. `what` names it in errors.
    pub fn spawn(mut cmd: Command, what: &str) -> Result<Self> {
        cmd.process_group(0).stdin(Stdio::null());
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
        })
    }

    /// The leader's process id (and the group's id).
    pub fn pid(&self) -> u32 {
        self.child.id()
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

const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// The transparent huge page mode in force (`always`, `madvise`, `never`).
pub fn thp_mode() -> Result<String> {
    let text = std::fs::read_to_string(THP_ENABLED)
        .map_err(|e| Error::new(format!("{THP_ENABLED}: {e}")))?;
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
        .map(str::to_owned)
        .ok_or_else(|| Error::new(format!("{THP_ENABLED}: no selected mode in {text:?}")))
}

/// Sets the transparent huge page mode, returning the previous one.
pub fn set_thp_mode(mode: &str) -> Result<String> {
    let before = thp_mode()?;
    if !["always", "madvise", "never"].contains(&mode) {
        return Err(Error::new(format!(
            "THP mode {mode:?} is not always, madvise or never"
        )));
    }
    std::fs::write(THP_ENABLED, mode)
        .map_err(|e| Error::new(format!("setting {THP_ENABLED} to {mode}: {e}")))?;
    Ok(before)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
