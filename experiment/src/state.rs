//! Where each planned run stands, read from the experiment folder alone:
//! its collection's `manifest.json`, the run's lock and pid file, and its
//! log. Other views (a cluster scheduler's queue: `slurm::SlurmView`)
//! refine what the folder says through [`StateView`].

use std::path::Path;

use kernmlops::manifest::{Manifest, RunClass, Status, StopReason};
use serde::Serialize;

use super::{
    plan::PlannedRun,
    record::{hostname, ExpDir, Lock, Record},
    run_files::RunManifest,
};

/// A planned run's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Not carried out yet.
    Pending,
    /// Handed to a scheduler, waiting for a machine (known from the
    /// scheduler's view only; the folder cannot tell it from pending).
    Queued,
    /// Being carried out now.
    Running,
    /// Finished with a complete collection.
    Done,
    /// Finished, but the benchmark or a probe failed (its data is kept),
    /// or the run left no collection at all (the host refused it).
    Failed,
    /// Started, then cut off (crash, SIGKILL, power loss, a signal that
    /// stopped the benchmark early): redone on resume, its folder moved to
    /// `partial/`.
    CutOff,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::CutOff => "cut off",
        }
    }
}

/// What is known of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Observed {
    pub run_id: String,
    pub state: RunState,
    /// The run class, the failure or what cut it off, or who runs it.
    pub detail: String,
    /// Whether `runs/<run_id>/` holds a finished collection.
    pub has_collection: bool,
}

impl Observed {
    /// Whether a resume carries this run out (again): pending and cut-off
    /// runs, runs that left no collection, and, when asked, failed ones.
    /// Queued runs are the scheduler's to carry out.
    pub fn needs_run(&self, retry_failed: bool) -> bool {
        match self.state {
            RunState::Pending | RunState::CutOff => true,
            RunState::Failed => retry_failed || !self.has_collection,
            RunState::Running | RunState::Queued | RunState::Done => false,
        }
    }
}

/// A source of knowledge about runs beyond the folder, such as a cluster
/// scheduler's queue. It may change what the folder says (a run the folder
/// shows as cut off that the scheduler still runs, or has queued).
pub trait StateView {
    /// Refines `observed` (read from the folder) for `run`.
    fn refine(&self, run: &PlannedRun, observed: &mut Observed);
}

/// The state of a collection folder, from its manifest. `live` says
/// whether a process is carrying the run out now.
pub fn classify(run_dir: &Path, live: Option<&str>) -> (RunState, String, bool) {
    if !run_dir.exists() {
        return match live {
            Some(who) => (RunState::Running, who.to_owned(), false),
            None => (RunState::Pending, String::new(), false),
        };
    }
    // An unreadable manifest (not JSON, or a key of the wrong type) counts
    // as none.
    let Ok(RunManifest { manifest: m, .. }) = RunManifest::read(run_dir) else {
        return match live {
            Some(who) => (RunState::Running, who.to_owned(), false),
            None => (RunState::CutOff, "no manifest.json".into(), false),
        };
    };
    let class = m.run_class.as_str();
    let stopped_by = m.benchmark.as_ref().and_then(|b| b.stopped_by);
    match m.status {
        Status::Running => match live {
            Some(who) => (RunState::Running, who.to_owned(), false),
            None => (
                RunState::CutOff,
                "its manifest still says running".into(),
                false,
            ),
        },
        Status::Repaired => (
            RunState::CutOff,
            "repaired after being cut off".into(),
            false,
        ),
        _ if stopped_by == Some(StopReason::Signal) => (
            RunState::CutOff,
            "a signal stopped its benchmark".into(),
            false,
        ),
        _ if m.status == Status::Failed || m.run_class == RunClass::Failed => (
            RunState::Failed,
            failure(&m).unwrap_or_else(|| class.to_owned()),
            true,
        ),
        _ => (RunState::Done, class.to_owned(), true),
    }
}

/// The first reason a manifest gives for a failure.
fn failure(m: &Manifest) -> Option<String> {
    let bench = m.benchmark.as_ref();
    if let Some(e) = bench.and_then(|b| b.error.as_ref()) {
        return Some(e.clone());
    }
    if let Some(e) = m.errors.first() {
        return Some(e.clone());
    }
    bench
        .and_then(|b| b.exit_code)
        .filter(|c| *c != 0)
        .map(|c| format!("the benchmark exited with {c}"))
}

/// Who is carrying out a run now, if anyone: the holder of its lock, or a
/// live `kernmlops run` process recorded in its pid file.
pub fn live(dir: &ExpDir, run_id: &str) -> Option<String> {
    Lock::holder(&dir.run_lock(run_id)).or_else(|| run_process(dir, run_id))
}

/// The `kernmlops run` process of a run, from its pid file, if it still
/// lives. A process on another machine cannot be checked from here and
/// counts as alive (a scheduler's [`StateView`] knows better).
pub fn run_process(dir: &ExpDir, run_id: &str) -> Option<String> {
    let (pid, host) = pid_file(dir, run_id)?;
    if host != hostname() {
        return Some(format!("pid {pid} on {host}"));
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    String::from_utf8_lossy(&cmdline)
        .contains(run_id)
        .then(|| format!("pid {pid} on {host}"))
}

/// The pid and host a run's pid file names (left behind when its process
/// was killed outright).
pub fn pid_file(dir: &ExpDir, run_id: &str) -> Option<(u32, String)> {
    let text = std::fs::read_to_string(dir.run_pid(run_id)).ok()?;
    let mut parts = text.split_whitespace();
    let pid: u32 = parts.next()?.parse().ok()?;
    Some((pid, parts.next().unwrap_or("").to_owned()))
}

/// The last `error:` line of a run's log, if it has one.
fn logged_error(dir: &ExpDir, run_id: &str) -> Option<String> {
    let text = std::fs::read_to_string(dir.log(run_id)).ok()?;
    text.lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("error: ").map(str::to_owned))
}

/// Observes one run.
pub fn observe_run(dir: &ExpDir, run: &PlannedRun) -> Observed {
    let who = live(dir, &run.run_id);
    let (mut state, mut detail, has_collection) = classify(&dir.run(&run.run_id), who.as_deref());
    if state == RunState::Pending {
        if let Some(e) = logged_error(dir, &run.run_id) {
            state = RunState::Failed;
            detail = format!("no collection: {e}");
        }
    }
    Observed {
        run_id: run.run_id.clone(),
        state,
        detail,
        has_collection,
    }
}

/// Observes every planned run, refined by `views`.
pub fn observe(dir: &ExpDir, record: &Record, views: &[&dyn StateView]) -> Vec<Observed> {
    record
        .runs
        .iter()
        .map(|run| {
            let mut o = observe_run(dir, run);
            for v in views {
                v.refine(run, &mut o);
            }
            o
        })
        .collect()
}

/// Collections in `runs/` the record does not plan (left by an earlier
/// version of the experiment file); never used.
pub fn stale(dir: &ExpDir, record: &Record) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir.runs()) else {
        return Vec::new();
    };
    let mut out: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|id| record.find(id).is_none())
        .collect();
    out.sort();
    out
}

/// Counts per state, in the order of [`RunState`].
pub fn counts(observed: &[Observed]) -> Vec<(RunState, usize)> {
    [
        RunState::Done,
        RunState::Failed,
        RunState::Running,
        RunState::Queued,
        RunState::CutOff,
        RunState::Pending,
    ]
    .into_iter()
    .map(|s| (s, observed.iter().filter(|o| o.state == s).count()))
    .filter(|(_, n)| *n > 0)
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_classify_runs() {
        let d = std::env::temp_dir().join(format!("kml-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let run = d.join("run");
        let classify_with = |manifest: Option<&str>, live: Option<&str>| {
            let _ = std::fs::remove_dir_all(&run);
            std::fs::create_dir_all(&run).expect("dir");
            if let Some(m) = manifest {
                std::fs::write(run.join("manifest.json"), m).expect("write");
            }
            let (s, detail, has) = classify(&run, live);
            (s, detail, has)
        };
        // No folder: pending, or running when a process holds it.
        assert_eq!(classify(&d.join("none"), None).0, RunState::Pending);
        assert_eq!(
            classify(&d.join("none"), Some("pid 1")).0,
            RunState::Running
        );
        // A folder without a manifest, or still saying running: cut off
        // unless someone is at it.
        assert_eq!(classify_with(None, None).0, RunState::CutOff);
        assert_eq!(classify_with(None, Some("pid 1")).0, RunState::Running);
        assert_eq!(classify_with(Some("{not json"), None).0, RunState::CutOff);
        let running = r#"{"status": "running", "run_class": "running"}"#;
        assert_eq!(classify_with(Some(running), None).0, RunState::CutOff);
        assert_eq!(
            classify_with(Some(running), Some("pid 1")).0,
            RunState::Running
        );
        // Repaired after a crash, or its benchmark stopped by a signal: cut
        // off, whoever holds it.
        let repaired = r#"{"status": "repaired", "run_class": "curated"}"#;
        assert_eq!(classify_with(Some(repaired), None).0, RunState::CutOff);
        let signalled = r#"{"status": "complete", "run_class": "failed",
            "benchmark": {"stopped_by": "signal", "exit_code": null}}"#;
        assert_eq!(classify_with(Some(signalled), None).0, RunState::CutOff);
        // Finished.
        let done = r#"{"status": "complete", "run_class": "curated",
            "benchmark": {"stopped_by": null, "exit_code": 0}}"#;
        assert_eq!(
            classify_with(Some(done), None),
            (RunState::Done, "curated".into(), true)
        );
        let with_errors = r#"{"status": "complete_with_errors", "run_class": "failed", "errors": [],
            "benchmark": {"stopped_by": null, "exit_code": 3, "error": null}}"#;
        assert_eq!(
            classify_with(Some(with_errors), None),
            (RunState::Failed, "the benchmark exited with 3".into(), true)
        );
        let failed =
            r#"{"status": "failed", "run_class": "failed", "errors": ["no probe started"]}"#;
        assert_eq!(
            classify_with(Some(failed), None),
            (RunState::Failed, "no probe started".into(), true)
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn what_a_resume_redoes() {
        let o = |state, has_collection| Observed {
            run_id: "x".into(),
            state,
            detail: String::new(),
            has_collection,
        };
        assert!(o(RunState::Pending, false).needs_run(false));
        assert!(o(RunState::CutOff, false).needs_run(false));
        assert!(!o(RunState::Done, true).needs_run(true));
        assert!(!o(RunState::Running, false).needs_run(true));
        assert!(!o(RunState::Queued, false).needs_run(true));
        // A failed run keeps its data unless asked to retry; one that left
        // nothing is tried again.
        assert!(!o(RunState::Failed, true).needs_run(false));
        assert!(o(RunState::Failed, true).needs_run(true));
        assert!(o(RunState::Failed, false).needs_run(false));
    }
}
