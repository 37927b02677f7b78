//! What a run changes on the machine, recorded on disk before it is
//! changed, and undone when the run ends, at once by the run's guardian if
//! the host dies, or else by the next `kernmlops` start or `kernmlops
//! repair`, which say what they did.
//!
//! A run with a benchmark, or with kernel knobs to set (`[machine]`), gets
//! a [`RunGuard`]:
//! - a state folder `/run/kernmlops/<collection_id>/` (root's only,
//!   emptied by a reboot like the changes it lists), locked by the host as
//!   long as it lives, and given to the benchmark as `StartArgs::state_dir`.
//!   Its `undo.jsonl` (the SDK's `workload::UndoLog` format) lists what to
//!   undo: kernel settings to write back (`restore`), files and folders to
//!   remove (`remove`), and the run's workload cgroup to kill (`cgroup`).
//! - a workload cgroup `<cgroup2>/kernmlops/<collection_id>`: the host runs
//!   the benchmark's `setup` and `launch` inside it, so every process they
//!   start is in it, however it daemonises, changes user or leaves its
//!   process group; killing the cgroup (`cgroup.kill`) stops them all.
//! - a guardian: this binary in a hidden mode ([`guardian_main`]) whose
//!   standard input is a pipe from the host. However the host dies, even
//!   by SIGKILL, the kernel closes the pipe; the guardian then takes the
//!   state folder's lock and undoes the run.

use std::{
    fs::{DirBuilder, File},
    io::{self, Read, Write},
    os::{
        fd::AsRawFd,
        unix::fs::{DirBuilderExt, MetadataExt},
    },
    path::{Component, Path, PathBuf},
    process::{Child, ChildStdin, Command, ExitCode, Stdio},
    time::{Duration, Instant},
};

/// Where run state folders live (a tmpfs: a reboot empties it, and undoes
/// what its folders list anyway).
pub const STATE_ROOT: &str = "/run/kernmlops";
/// The undo log of a state folder (the SDK's `workload::UNDO_LOG`).
pub const UNDO_LOG: &str = "undo.jsonl";
/// A state folder's note of the collection folder, for messages.
const COLLECTION_NOTE: &str = "collection";
/// The hidden first argument that runs this binary as a run's guardian.
pub const GUARDIAN_ARG: &str = "__kernmlops-guardian";

/// Why a run's changes cannot be tied to it.
#[derive(Debug, thiserror::Error)]
pub enum UndoError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    /// The state folder's parent is not root's alone.
    #[error("{} is not a folder only root can write ({why}); remove it", path.display())]
    Unsafe { path: PathBuf, why: String },
    /// A kernel file refused a write (the OS error without its code).
    #[error("{}: {why}", path.display())]
    Write { path: PathBuf, why: String },
    /// Neither cgroup hierarchy offers the cpuset controller.
    #[error("this machine has no cpuset controller to confine the benchmark with (not in the cgroup v2 hierarchy{}, and no cgroup v1 cpuset hierarchy)", v2_parent.as_ref().map(|p| format!(" at {}", p.display())).unwrap_or_default())]
    NoCpuset { v2_parent: Option<PathBuf> },
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> UndoError + '_ {
    move |source| UndoError::Io {
        path: path.to_owned(),
        source,
    }
}

/// One thing to undo, as the undo log records it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    /// Write `value` back to the kernel setting `path`.
    Restore { path: PathBuf, value: String },
    /// Remove a file, or a folder with everything in it.
    Remove { path: PathBuf },
    /// Kill every process of a workload cgroup, then remove it.
    Cgroup { path: PathBuf },
    /// Remove the run's private cgroup v1 cpuset group (`cpus`), stopping
    /// any process left in it.
    Cpuset { path: PathBuf },
}

impl Action {
    fn to_line(&self) -> String {
        let v = match self {
            Self::Restore { path, value } => {
                serde_json::json!({"restore": path.to_string_lossy(), "value": value})
            }
            Self::Remove { path } => serde_json::json!({"remove": path.to_string_lossy()}),
            Self::Cgroup { path } => serde_json::json!({"cgroup": path.to_string_lossy()}),
            Self::Cpuset { path } => serde_json::json!({"cpuset": path.to_string_lossy()}),
        };
        format!("{v}\n")
    }

    fn parse(line: &str) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        let text = |key: &str| v.get(key).and_then(|s| s.as_str()).map(str::to_owned);
        if let Some(path) = text("restore") {
            return Some(Self::Restore {
                path: path.into(),
                value: text("value")?,
            });
        }
        if let Some(path) = text("remove") {
            return Some(Self::Remove { path: path.into() });
        }
        if let Some(path) = text("cpuset") {
            return Some(Self::Cpuset { path: path.into() });
        }
        text("cgroup").map(|path| Self::Cgroup { path: path.into() })
    }
}

/// Appends one action to a state folder's undo log, on disk before the
/// change it announces.
fn record(state: &Path, action: &Action) -> io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(state.join(UNDO_LOG))?;
    f.write_all(action.to_line().as_bytes())?;
    f.sync_data()
}

/// The lock of a state folder (`flock` on the folder itself), taken
/// without waiting unless `wait`.
fn lock(dir: &Path, wait: bool) -> io::Result<File> {
    let f = File::open(dir)?;
    let op = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    loop {
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
            return Ok(f);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `/run/kernmlops`, created root-only if missing, and refused when anyone
/// but root could write it (whoever could would choose what root undoes).
fn state_root() -> Result<PathBuf, UndoError> {
    let root = PathBuf::from(STATE_ROOT);
    match DirBuilder::new().mode(0o700).create(&root) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_at(&root)(e)),
    }
    check_root_only(&root)?;
    Ok(root)
}

fn check_root_only(dir: &Path) -> Result<(), UndoError> {
    let meta = std::fs::symlink_metadata(dir).map_err(io_at(dir))?;
    let why = if !meta.is_dir() {
        Some("not a folder".to_owned())
    } else if meta.uid() != 0 {
        Some(format!("owned by uid {}", meta.uid()))
    } else if meta.mode() & 0o022 != 0 {
        Some(format!("mode {:o}", meta.mode() & 0o7777))
    } else {
        None
    };
    match why {
        Some(why) => Err(UndoError::Unsafe {
            path: dir.to_owned(),
            why,
        }),
        None => Ok(()),
    }
}

/// A run's ties to the machine: its state folder and lock, its workload
/// cgroup and its guardian. Dropping it undoes what is left to undo.
pub struct RunGuard {
    state: PathBuf,
    _lock: File,
    cgroup: Option<Cgroup>,
    /// The run's private cgroup v1 cpuset group (`cpus` where the workload
    /// cgroup has no cpuset controller), and the one the host came from.
    cpuset_v1: Option<Cgroup>,
    guardian: Option<(Child, ChildStdin)>,
    /// Why processes are not tied to a cgroup, found while the guard is
    /// made; the caller says them. Later problems are said when they
    /// happen ([`warn_now`]).
    pub warnings: Vec<String>,
    finished: bool,
}

/// A problem found while a run goes on (joining or leaving a cgroup), said
/// at once on standard error: nothing is collected afterwards to say it.
fn warn_now(message: String) {
    eprintln!("warning: {message}");
}

/// A workload cgroup and the cgroup the host came from.
struct Cgroup {
    path: PathBuf,
    home: PathBuf,
}

impl RunGuard {
    /// Creates the state folder of run `id` (whose collection folder is
    /// `collection`), its workload cgroup and its guardian. Only the state
    /// folder is required; without a cgroup or a guardian the run goes on,
    /// with [`RunGuard::warnings`] saying what is not tied.
    pub fn start(id: &str, collection: &Path) -> Result<Self, UndoError> {
        let root = state_root()?;
        // Made under a hidden name and locked before it gets its own, so a
        // concurrent recovery never mistakes it for an abandoned one.
        let hidden = root.join(format!(".new-{id}"));
        DirBuilder::new()
            .mode(0o700)
            .create(&hidden)
            .map_err(io_at(&hidden))?;
        let lock = lock(&hidden, false).map_err(io_at(&hidden))?;
        std::fs::write(
            hidden.join(COLLECTION_NOTE),
            collection.as_os_str().as_encoded_bytes(),
        )
        .map_err(io_at(&hidden))?;
        let state = root.join(id);
        std::fs::rename(&hidden, &state).map_err(io_at(&state))?;
        let mut guard = Self {
            state,
            _lock: lock,
            cgroup: None,
            cpuset_v1: None,
            guardian: None,
            warnings: Vec::new(),
            finished: false,
        };
        match guard.make_cgroup(id) {
            Ok(cg) => guard.cgroup = Some(cg),
            Err(e) => guard.warnings.push(format!(
                "the benchmark's processes are not in a cgroup of their own ({e}): if kernmlops is killed, some may keep running"
            )),
        }
        match guard.spawn_guardian() {
            Ok(g) => guard.guardian = Some(g),
            Err(e) => guard.warnings.push(format!(
                "no guardian process ({e}): if kernmlops is killed, its changes are undone only by the next kernmlops start"
            )),
        }
        Ok(guard)
    }

    /// The state folder, for `StartArgs::state_dir`.
    pub fn state_dir(&self) -> &Path {
        &self.state
    }

    /// Records in the undo log, on disk before it returns, that the kernel
    /// setting `path` is to be written back to `value`: the run's guardian
    /// or the next `kernmlops` start restores it if the run cannot (the
    /// kernel knobs of `[machine]` are journalled so before each is set).
    pub fn journal_restore(&self, path: &Path, value: &str) -> io::Result<()> {
        record(
            &self.state,
            &Action::Restore {
                path: path.to_owned(),
                value: value.to_owned(),
            },
        )
    }

    fn make_cgroup(&self, id: &str) -> io::Result<Cgroup> {
        let mount = kernmlops_sys::cgroup::cgroup2_mount()
            .ok_or_else(|| io::Error::other("this machine has no cgroup v2 mount"))?;
        let home = kernmlops_sys::cgroup::cgroup_dir_of_pid(std::process::id())?;
        let base = mount.join("kernmlops");
        match std::fs::create_dir(&base) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let path = base.join(id);
        record(&self.state, &Action::Cgroup { path: path.clone() })?;
        std::fs::create_dir(&path)?;
        Ok(Cgroup { path, home })
    }

    fn spawn_guardian(&self) -> io::Result<(Child, ChildStdin)> {
        let mut child = Command::new("/proc/self/exe")
            .arg(GUARDIAN_ARG)
            .arg(&self.state)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| io::Error::other("no pipe to the guardian"))?;
        Ok((child, stdin))
    }

    /// Confines the benchmark to the CPUs `cpus` (a list already checked
    /// against the online CPUs): through the workload cgroup's cpuset where
    /// it offers one (cgroup v2), else through a private cgroup v1 cpuset
    /// group made for the run (journalled before it is made, removed at
    /// the end, by the guardian, or by the next start). Returns the file
    /// set, the CPUs its parent allows and the list read back.
    pub fn set_cpus(&mut self, cpus: &str) -> Result<(PathBuf, String, String), UndoError> {
        let read = |p: &Path| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_owned())
                .map_err(io_at(p))
        };
        let write = |p: &Path, v: &str| {
            std::fs::write(p, v).map_err(|e| UndoError::Write {
                path: p.to_owned(),
                why: kernmlops_sys::private::strip_os_error(&e),
            })
        };
        if let Some(cg) = &self.cgroup {
            let parent = cg.path.parent().unwrap_or(&cg.path).to_owned();
            let offered =
                std::fs::read_to_string(parent.join("cgroup.controllers")).unwrap_or_default();
            if offered.split_whitespace().any(|c| c == "cpuset") {
                let control = parent.join("cgroup.subtree_control");
                if !read(&control)?.split_whitespace().any(|c| c == "cpuset") {
                    write(&control, "+cpuset")?;
                }
                let file = cg.path.join("cpuset.cpus");
                let before = read(&parent.join("cpuset.cpus.effective"))?;
                write(&file, cpus)?;
                let now = read(&cg.path.join("cpuset.cpus"))?;
                return Ok((file, before, now));
            }
        }
        let Some(mount) = cpuset_v1_mount() else {
            return Err(UndoError::NoCpuset {
                v2_parent: self
                    .cgroup
                    .as_ref()
                    .and_then(|c| c.path.parent())
                    .map(Path::to_path_buf),
            });
        };
        let home = cpuset_v1_home(&mount).unwrap_or_else(|| mount.clone());
        let id = self
            .state
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let path = mount.join(format!("{CPUSET_PREFIX}{id}"));
        record(&self.state, &Action::Cpuset { path: path.clone() }).map_err(io_at(&self.state))?;
        std::fs::create_dir(&path).map_err(io_at(&path))?;
        self.cpuset_v1 = Some(Cgroup {
            path: path.clone(),
            home,
        });
        let mems = read(&mount.join("cpuset.effective_mems"))
            .or_else(|_| read(&mount.join("cpuset.mems")))?;
        write(&path.join("cpuset.mems"), &mems)?;
        let before = read(&mount.join("cpuset.effective_cpus"))
            .or_else(|_| read(&mount.join("cpuset.cpus")))?;
        let file = path.join("cpuset.cpus");
        write(&file, cpus)?;
        let now = read(&file)?;
        Ok((file, before, now))
    }

    /// The run's workload cgroup folder, when it has one.
    pub fn workload_cgroup(&self) -> Option<&Path> {
        self.cgroup.as_ref().map(|c| c.path.as_path())
    }

    /// Runs `f` with the host inside the workload cgroup, so every process
    /// `f` starts belongs to it; the host moves back before returning.
    pub fn in_workload_cgroup<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let pid = std::process::id().to_string();
        if let Some(cs) = &self.cpuset_v1 {
            // Every thread of the host, as for the v2 cgroup: the calls into
            // the benchmark are made on threads of their own.
            if let Err(e) = std::fs::write(cs.path.join("cgroup.procs"), &pid) {
                warn_now(format!(
                    "the benchmark's processes could not join {} ({e}): they may run on any CPU",
                    cs.path.display()
                ));
            }
        }
        let out = self.in_v2_cgroup(f);
        if let Some(cs) = &self.cpuset_v1 {
            if let Err(e) = std::fs::write(cs.home.join("cgroup.procs"), &pid) {
                warn_now(format!(
                    "kernmlops could not move back to {} ({e})",
                    cs.home.display()
                ));
            }
        }
        out
    }

    fn in_v2_cgroup<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let Some(cg) = &self.cgroup else {
            return f();
        };
        let pid = std::process::id().to_string();
        if let Err(e) = std::fs::write(cg.path.join("cgroup.procs"), &pid) {
            warn_now(format!(
                "the benchmark's processes could not join {} ({e}): if kernmlops is killed, some may keep running",
                cg.path.display()
            ));
            return f();
        }
        let out = f();
        if let Err(e) = std::fs::write(cg.home.join("cgroup.procs"), &pid) {
            // Never stay in the cgroup that is killed at the end.
            let parent = cg.path.parent().unwrap_or(&cg.home);
            let _ = std::fs::write(parent.join("cgroup.procs"), &pid);
            warn_now(format!(
                "kernmlops could not move back to {} ({e})",
                cg.home.display()
            ));
        }
        out
    }

    /// Undoes what is left (normally nothing: the benchmark undid its own
    /// changes), removes the state folder and lets the guardian go.
    /// Returns what had to be undone.
    pub fn finish(mut self) -> Vec<String> {
        self.close()
    }

    fn close(&mut self) -> Vec<String> {
        if self.finished {
            return Vec::new();
        }
        self.finished = true;
        let done = undo_state(&self.state);
        if let Some((mut child, stdin)) = self.guardian.take() {
            // EOF: the guardian finds the folder gone and exits.
            drop(stdin);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if !matches!(child.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        done
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        for m in self.close() {
            eprintln!("warning: {m}");
        }
    }
}

/// Undoes a state folder's log, newest first, and removes the folder.
/// Returns one line per change actually undone.
fn undo_state(state: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(state.join(UNDO_LOG)).unwrap_or_default();
    let actions: Vec<Action> = text.lines().filter_map(Action::parse).collect();
    let mut done = Vec::new();
    // Processes first: nothing may recreate a file once it is removed.
    let (cgroups, rest): (Vec<&Action>, Vec<&Action>) = actions
        .iter()
        .rev()
        .partition(|a| matches!(a, Action::Cgroup { .. }));
    let (cpusets, rest): (Vec<&Action>, Vec<&Action>) = rest
        .into_iter()
        .partition(|a| matches!(a, Action::Cpuset { .. }));
    for a in cgroups.into_iter().chain(cpusets).chain(rest) {
        match undo(a) {
            Ok(Some(m)) => done.push(m),
            Ok(None) => {}
            Err(e) => done.push(format!("could not undo: {e}")),
        }
    }
    let _ = std::fs::remove_dir_all(state);
    done
}

/// Undoes one action; `Ok(None)` when there was nothing to undo.
fn undo(action: &Action) -> Result<Option<String>, String> {
    match action {
        Action::Restore { path, value } => restore(path, value),
        Action::Remove { path } => remove(path),
        Action::Cgroup { path } => kill_cgroup(path),
        Action::Cpuset { path } => remove_cpuset(path),
    }
}

/// The name of a run's private cgroup v1 cpuset group: `kernmlops-<id>`
/// at the top of the cpuset hierarchy.
const CPUSET_PREFIX: &str = "kernmlops-";

/// Where a cgroup v1 hierarchy with the cpuset controller is mounted.
fn cpuset_v1_mount() -> Option<PathBuf> {
    cpuset_v1_mount_in(&std::fs::read_to_string("/proc/self/mountinfo").ok()?)
}

/// The cgroup v1 cpuset mount point in a mountinfo text (a mount of the
/// hierarchy's root).
fn cpuset_v1_mount_in(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut r = right.split_whitespace();
        if r.next()? != "cgroup" {
            return None;
        }
        let supers = r.nth(1)?;
        if !supers.split(',').any(|o| o == "cpuset") {
            return None;
        }
        let mut fields = left.split_whitespace().skip(3);
        let root = fields.next()?;
        let mount_point = fields.next()?;
        (root == "/").then(|| PathBuf::from(mount_point))
    })
}

/// The host's own cgroup v1 cpuset group (`/proc/self/cgroup`).
fn cpuset_v1_home(mount: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if !controllers.split(',').any(|c| c == "cpuset") {
            return None;
        }
        let rel = path.trim_start_matches('/');
        let dir = mount.join(rel);
        let plain = Path::new(rel)
            .components()
            .all(|c| matches!(c, Component::Normal(_)));
        (plain && dir.is_dir()).then_some(dir)
    })
}

/// Removes a run's private cpuset group: its processes (the workload's;
/// the host moves out) stopped first.
fn remove_cpuset(path: &Path) -> Result<Option<String>, String> {
    let mount = cpuset_v1_mount()
        .ok_or_else(|| "no cgroup v1 cpuset hierarchy to find the run's cpuset in".to_owned())?;
    let ours = path.parent() == Some(mount.as_path())
        && path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(CPUSET_PREFIX) && n.len() > CPUSET_PREFIX.len())
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !ours {
        return Err(format!("{}: not a kernmlops cpuset group", path.display()));
    }
    if !path.is_dir() {
        return Ok(None);
    }
    let count = leave_group(path, &mount)?.len();
    kill_until_empty(path)?;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match std::fs::remove_dir(path) {
            Ok(()) => break,
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("removing {}: {e}", path.display()))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    Ok(stopped(count))
}

fn restore(path: &Path, value: &str) -> Result<Option<String>, String> {
    let real = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !(real.starts_with("/sys/") || real.starts_with("/proc/sys/")) || value.len() > 4096 {
        return Err(format!(
            "{}: only kernel settings under /sys and /proc/sys are restored",
            path.display()
        ));
    }
    let now = std::fs::read_to_string(&real).unwrap_or_default();
    let now = now.trim();
    // Settings with choices show the one in force in brackets.
    if now == value.trim()
        || now
            .split_whitespace()
            .any(|w| w == format!("[{}]", value.trim()))
    {
        return Ok(None);
    }
    std::fs::write(&real, value).map_err(|e| format!("restoring {}: {e}", real.display()))?;
    Ok(Some(format!(
        "restored {} to {}",
        real.display(),
        value.trim()
    )))
}

fn remove(path: &Path) -> Result<Option<String>, String> {
    let plain = path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && path.components().count() >= 3
        && !["/proc", "/sys", "/dev", "/run/kernmlops"]
            .iter()
            .any(|p| path.starts_with(p));
    if !plain {
        return Err(format!(
            "{}: not a path kernmlops removes (absolute, two levels deep, outside /proc, /sys and /dev)",
            path.display()
        ));
    }
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(None);
    };
    let removed = if meta.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    removed.map_err(|e| format!("removing {}: {e}", path.display()))?;
    Ok(Some(format!("removed {}", path.display())))
}

/// Processes of a cgroup, from `cgroup.procs`.
fn cgroup_procs(path: &Path) -> Vec<i32> {
    std::fs::read_to_string(path.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The processes of the group at `path` but this one, which moves out
/// into the group at `to` first when it is in.
fn leave_group(path: &Path, to: &Path) -> Result<Vec<i32>, String> {
    let me = std::process::id() as i32;
    let mut procs = cgroup_procs(path);
    if procs.contains(&me) {
        std::fs::write(to.join("cgroup.procs"), me.to_string())
            .map_err(|e| format!("leaving {}: {e}", path.display()))?;
        procs.retain(|&p| p != me);
    }
    Ok(procs)
}

/// SIGKILLs the group's processes until none is left, for at most 10 s.
fn kill_until_empty(path: &Path) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = cgroup_procs(path);
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{}: {} processes survived SIGKILL",
                path.display(),
                left.len()
            ));
        }
        sigkill(&left);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGKILLs processes of a group of the run's own (never this process:
/// [`leave_group`] took it out).
fn sigkill(pids: &[i32]) {
    for pid in pids {
        // SAFETY: kill(2) with a pid and a signal; no memory is passed.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
}

/// What stopping `count` processes of the benchmark reports.
fn stopped(count: usize) -> Option<String> {
    (count > 0).then(|| {
        let s = if count == 1 { "" } else { "es" };
        format!("stopped {count} process{s} of the benchmark")
    })
}

fn kill_cgroup(path: &Path) -> Result<Option<String>, String> {
    let mount = kernmlops_sys::cgroup::cgroup2_mount()
        .ok_or_else(|| "no cgroup v2 mount to find the workload cgroup in".to_owned())?;
    let ours = path.starts_with(mount.join("kernmlops"))
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !ours {
        return Err(format!(
            "{}: not a kernmlops workload cgroup",
            path.display()
        ));
    }
    if !path.is_dir() {
        return Ok(None);
    }
    // Never kill ourselves: leave the cgroup first.
    let procs = leave_group(path, path.parent().unwrap_or(&mount))?;
    let count = procs.len();
    if count > 0 && std::fs::write(path.join("cgroup.kill"), "1").is_err() {
        // Kernels before 5.14 have no cgroup.kill.
        sigkill(&procs);
    }
    kill_until_empty(path)?;
    // The last processes may take a moment to leave after they died.
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::remove_dir(path).is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(stopped(count))
}

/// Undoes every run whose host and guardian are gone (their state folder
/// is unlocked). Returns one line per run saying what was undone; nothing
/// when there was nothing to do or no permission to look.
pub fn recover_abandoned() -> Vec<String> {
    let root = Path::new(STATE_ROOT);
    if check_root_only(root).is_err() {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        if name.starts_with('.') {
            // A state folder being made: recovered only once it is stale.
            let stale = e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|d| d > Duration::from_secs(60)));
            if !stale {
                continue;
            }
        }
        let Ok(_held) = lock(&path, false) else {
            continue;
        };
        if let Some(line) = recover(&path, &name) {
            out.push(line);
        }
    }
    out
}

/// Undoes one abandoned state folder (whose lock the caller holds).
fn recover(path: &Path, name: &str) -> Option<String> {
    let collection = std::fs::read(path.join(COLLECTION_NOTE))
        .map(|b| crate::trust::printable(&b))
        .unwrap_or_else(|_| name.to_owned());
    let done = undo_state(path);
    (!done.is_empty()).then(|| {
        format!(
            "the run writing {collection} ended without undoing its changes; kernmlops {}",
            done.join(", ")
        )
    })
}

/// The guardian of a run: waits for its standard input (a pipe from the
/// host) to close, which happens when the host ends however it ends, then
/// undoes whatever the run left. Ignores the signals a terminal sends its
/// whole process group, so Ctrl+C stops the host but not its guardian.
pub fn guardian_main(state: &Path) -> ExitCode {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE] {
        // SAFETY: setting a signal's disposition to ignore.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    let mut buf = [0u8; 64];
    let mut stdin = io::stdin().lock();
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    // Waits for the host's lock: held until the host has undone the run
    // itself and removed the folder, or until it died.
    let Ok(_held) = lock(state, true) else {
        return ExitCode::SUCCESS;
    };
    if !state.join(COLLECTION_NOTE).exists() {
        return ExitCode::SUCCESS;
    }
    let name = state
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some(line) = recover(state, &name) {
        eprintln!("warning: kernmlops guardian: {line}");
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_read_back_and_unsafe_paths_are_refused() {
        for a in [
            Action::Restore {
                path: "/sys/kernel/mm/transparent_hugepage/enabled".into(),
                value: "madvise".into(),
            },
            Action::Remove {
                path: "/var/tmp/kernmlops-fio-1-0".into(),
            },
            Action::Cgroup {
                path: "/sys/fs/cgroup/kernmlops/x".into(),
            },
            Action::Cpuset {
                path: "/sys/fs/cgroup/cpuset/kernmlops-x".into(),
            },
        ] {
            assert_eq!(Action::parse(a.to_line().trim_end()), Some(a));
        }
        // The SDK writes the same format.
        assert_eq!(
            Action::parse(r#"{"remove":"/tmp/a/b"}"#),
            Some(Action::Remove {
                path: "/tmp/a/b".into()
            })
        );
        assert_eq!(Action::parse("not json"), None);
        for path in [
            "/",
            "/etc",
            "relative/a/b",
            "/tmp/../etc/x",
            "/proc/1/x",
            "/run/kernmlops/x",
        ] {
            assert!(remove(Path::new(path)).is_err(), "{path} accepted");
        }
        assert!(restore(Path::new("/etc/passwd"), "x").is_err());
        assert!(kill_cgroup(Path::new("/sys/fs/cgroup/user.slice")).is_err());
        if let Some(mount) = cpuset_v1_mount() {
            for bad in [
                "",
                "kernmlops-",
                "user.slice",
                "kernmlops-x/../y",
                "a/kernmlops-x",
            ] {
                assert!(remove_cpuset(&mount.join(bad)).is_err(), "{bad} accepted");
            }
        }
    }

    #[test]
    fn the_cgroup_v1_cpuset_hierarchy_is_found_in_mountinfo() {
        let info = "\
35 25 0:30 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
36 25 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
40 25 0:35 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        assert_eq!(
            cpuset_v1_mount_in(info),
            Some(PathBuf::from("/sys/fs/cgroup/cpuset"))
        );
        // A bind mount of a folder inside it is not the hierarchy's root.
        let bind = "36 25 0:31 /docker /mnt/cs rw - cgroup cgroup rw,cpuset\n";
        assert_eq!(cpuset_v1_mount_in(bind), None);
        assert_eq!(
            cpuset_v1_mount_in("40 25 0:35 / /sys/fs/cgroup cgroup2 rw - cgroup2 cgroup2 rw\n"),
            None
        );
    }

    #[test]
    fn a_state_folder_is_undone_newest_first() {
        let dir = std::env::temp_dir().join(format!("kml-undo-host-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let scratch = dir.join("scratch");
        std::fs::create_dir_all(scratch.join("deep")).expect("scratch");
        std::fs::write(scratch.join("deep/file"), "x").expect("file");
        let state = dir.join("state");
        std::fs::create_dir_all(&state).expect("state");
        let record_removal = || {
            let remove = Action::Remove {
                path: scratch.clone(),
            };
            record(&state, &remove).expect("record");
        };
        record_removal();
        std::fs::write(state.join(UNDO_LOG).with_extension("x"), "").expect("other");
        let done = undo_state(&state);
        assert_eq!(done, vec![format!("removed {}", scratch.display())]);
        assert!(!scratch.exists() && !state.exists());
        // Nothing left: nothing said.
        std::fs::create_dir_all(&state).expect("state");
        record_removal();
        assert!(undo_state(&state).is_empty());
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
