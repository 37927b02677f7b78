//! The experiment folder and its record, `experiment.json`: everything an
//! executor needs to carry out any planned run on any machine that sees
//! the folder (the runs with their configurations, the seed, the plugin
//! set with hashes), written atomically.
//!
//! ```text
//! <dir>/experiment.toml        the experiment file, as given
//! <dir>/config.toml            the base configuration every run starts from
//! <dir>/experiment.json        the record (this module)
//! <dir>/configs/<run_id>.toml  each run's merged configuration (--config)
//! <dir>/runs/<run_id>/         each run's collection
//! <dir>/partial/<run_id>-<n>/  runs cut off mid-way, moved aside
//! <dir>/logs/<run_id>.log      each run's output, every attempt
//! <dir>/locks/                 who is running what
//! <dir>/slurm/                 Slurm submissions (see `slurm`)
//! <dir>/results.parquet, results.arrow, graphs/
//! ```

use std::{
    fs::File,
    io::{Read, Write},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{
    plan::{Identity, PlannedRun},
    spec::{Order, Variable},
    ExperimentError, Result,
};

/// Version of the record's layout.
pub const FORMAT: u32 = 1;

/// Paths inside an experiment folder.
#[derive(Debug, Clone)]
pub struct ExpDir {
    pub root: PathBuf,
}

/// Declares an [`ExpDir`] method for each fixed file or folder at its root:
/// `name => "file"` is `pub fn name(&self) -> PathBuf`.
macro_rules! at_root {
    ($($(#[doc = $doc:literal])* $name:ident => $file:literal,)*) => {
        impl ExpDir {
            $(
                $(#[doc = $doc])*
                pub fn $name(&self) -> PathBuf {
                    self.root.join($file)
                }
            )*
        }
    };
}

at_root! {
    record => "experiment.json",
    experiment_file => "experiment.toml",
    base_config => "config.toml",
    runs => "runs",
    partial => "partial",
    locks => "locks",
    results_parquet => "results.parquet",
    results_arrow => "results.arrow",
    graphs => "graphs",
    warmup => "warmup",
    /// Slurm submissions: `submit-<n>.{runs,sh,json}`.
    slurm => "slurm",
}

impl ExpDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
    pub fn run(&self, run_id: &str) -> PathBuf {
        self.runs().join(run_id)
    }
    pub fn config(&self, run_id: &str) -> PathBuf {
        self.root.join("configs").join(format!("{run_id}.toml"))
    }
    pub fn log(&self, run_id: &str) -> PathBuf {
        self.root.join("logs").join(format!("{run_id}.log"))
    }
    /// Held (flock) by whoever carries out the run.
    pub fn run_lock(&self, run_id: &str) -> PathBuf {
        self.locks().join(format!("{run_id}.lock"))
    }
    /// `<pid> <host>` of the `kernmlops run` process of a run in progress.
    pub fn run_pid(&self, run_id: &str) -> PathBuf {
        self.locks().join(format!("{run_id}.pid"))
    }
    /// Held (flock) by the process driving the experiment here.
    pub fn experiment_lock(&self) -> PathBuf {
        self.locks().join("experiment.lock")
    }
    /// Held by whoever writes `results.parquet` and `results.arrow`, so
    /// concurrent writers take turns.
    pub fn results_lock(&self) -> PathBuf {
        self.locks().join("results.lock")
    }

    /// Creates the folder and its sub-folders.
    pub fn create(&self) -> Result<()> {
        for d in [
            self.root.clone(),
            self.runs(),
            self.root.join("configs"),
            self.root.join("logs"),
            self.locks(),
        ] {
            std::fs::create_dir_all(&d).map_err(ExperimentError::io(&d))?;
        }
        Ok(())
    }

    /// Moves a cut-off run's folder to `partial/<run_id>-<n>/` (the first
    /// free n from 1), returning where it went.
    pub fn move_aside(&self, run_id: &str) -> Result<PathBuf> {
        let partial = self.partial();
        std::fs::create_dir_all(&partial).map_err(ExperimentError::io(&partial))?;
        let mut n = 1;
        let dest = loop {
            let d = partial.join(format!("{run_id}-{n}"));
            if !d.exists() {
                break d;
            }
            n += 1;
        };
        let from = self.run(run_id);
        std::fs::rename(&from, &dest).map_err(ExperimentError::io(&from))?;
        Ok(dest)
    }
}

/// One plugin file and its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginHash {
    pub file: String,
    pub sha256: String,
}

/// Settings of adaptive repeats, kept so a resume goes on with them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Adaptive {
    /// The `@result` figure watched (without the `result_` prefix).
    pub metric: String,
    /// Largest relative half-width of its 95% confidence interval.
    pub target: f64,
    /// Most runs of one combination.
    pub max_repeats: u32,
}

/// `experiment.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub format: u32,
    pub name: String,
    pub created_utc: String,
    pub updated_utc: String,
    pub kernmlops_version: String,
    /// SHA-256 of the `kernmlops` binary that planned the experiment.
    #[serde(default)]
    pub kernmlops_sha256: String,
    /// The experiment file as it was given (copied to `experiment.toml`).
    pub source_file: String,
    #[serde(flatten)]
    pub identity: Identity,
    pub seed: u64,
    /// Where the seed came from: `file` or `random`.
    pub seed_from: String,
    pub order: Order,
    pub repeats: u32,
    pub warmup: u32,
    pub variables: Vec<Variable>,
    /// The plugin folder the runs use, and every plugin in it.
    pub plugin_dir: String,
    pub plugins: Vec<PluginHash>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<Adaptive>,
    /// The file's `[device]`: made ready again by `resume`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<crate::device::DeviceSpec>,
    /// Every planned run, in the order they are carried out.
    pub runs: Vec<PlannedRun>,
}

impl Record {
    pub fn read(dir: &ExpDir) -> Result<Self> {
        let path = dir.record();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ExperimentError::NotAnExperiment {
                    dir: dir.root.clone(),
                })
            }
            Err(e) => return Err(ExperimentError::io(&path)(e)),
        };
        let record: Self = serde_json::from_str(&text).map_err(|e| ExperimentError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if record.format != FORMAT {
            return Err(ExperimentError::Corrupt {
                path,
                message: format!(
                    "record format {} (this kernmlops reads {FORMAT})",
                    record.format
                ),
            });
        }
        Ok(record)
    }

    pub fn write(&self, dir: &ExpDir) -> Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(|e| ExperimentError::Corrupt {
            path: dir.record(),
            message: e.to_string(),
        })?;
        write_atomic(&dir.record(), (text + "\n").as_bytes())
    }

    pub fn find(&self, run_id: &str) -> Option<&PlannedRun> {
        self.runs.iter().find(|r| r.run_id == run_id)
    }
}

/// Writes a file through a temporary one and a rename, so a reader sees
/// the old or the new content (`files::write_atomic`: a fresh hidden
/// temporary name per writer, never a planted one).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    kernmlops::files::write_atomic(path, bytes).map_err(ExperimentError::io(path))
}

/// SHA-256 of a file, in hex.
pub fn sha256_file(p: &Path) -> Result<String> {
    let mut f = File::open(p).map_err(ExperimentError::io(p))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf).map_err(ExperimentError::io(p))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// SHA-256 of every `*.so` in `dir`, sorted by file name.
pub fn plugin_set(dir: &Path) -> Result<Vec<PluginHash>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(ExperimentError::io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "so") && p.is_file())
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            Ok(PluginHash {
                file: p
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                sha256: sha256_file(p)?,
            })
        })
        .collect()
}

/// What differs between the recorded plugin set and this one; `None` when
/// they are the same.
pub fn plugin_difference(recorded: &[PluginHash], here: &[PluginHash]) -> Option<String> {
    let mut diffs = Vec::new();
    for r in recorded {
        match here.iter().find(|h| h.file == r.file) {
            None => diffs.push(format!("{} is missing", r.file)),
            Some(h) if h.sha256 != r.sha256 => diffs.push(format!(
                "{} changed (sha256 {} recorded, {} here)",
                r.file,
                &r.sha256[..12.min(r.sha256.len())],
                &h.sha256[..12.min(h.sha256.len())]
            )),
            Some(_) => {}
        }
    }
    for h in here {
        if !recorded.iter().any(|r| r.file == h.file) {
            diffs.push(format!("{} is new", h.file));
        }
    }
    (!diffs.is_empty()).then(|| diffs.join(", "))
}

/// This machine's host name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// An exclusive lock on a whole file (an open-file-description lock,
/// `F_OFD_SETLK`), released when dropped or when the process dies, however
/// it dies. Unlike `flock`, whether it is held can be asked without taking
/// it, so `experiment status` never gets in an executor's way.
#[derive(Debug)]
pub struct Lock {
    _file: File,
}

/// `F_OFD_SETLK` / `F_OFD_GETLK` on the whole of `file`.
fn ofd_lock(file: &File, cmd: libc::c_int, kind: libc::c_int) -> std::io::Result<libc::flock> {
    // SAFETY: flock is plain old data; zeroed is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: fcntl on a descriptor `file` owns, with a valid, writable
    // struct flock (l_pid must be 0 for OFD locks: zeroed above).
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl) };
    if rc == 0 {
        Ok(fl)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Opens (creating) a lock file, never through a symlink: a lock file
/// planted as a symlink to another file is refused, not truncated.
fn open_lock_file(path: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => ExperimentError::io(path)(std::io::Error::new(
                e.kind(),
                "is a symlink; refusing to write through it",
            )),
            _ => ExperimentError::io(path)(e),
        })
}

impl Lock {
    /// Takes the lock without waiting. `Ok(Err(holder))` when another
    /// process holds it, with what that process wrote into the file.
    pub fn try_take(path: &Path) -> Result<std::result::Result<Self, String>> {
        let mut file = open_lock_file(path)?;
        if let Err(err) = ofd_lock(&file, libc::F_OFD_SETLK, libc::F_WRLCK) {
            if matches!(err.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) {
                return Ok(Err(holder(&mut file)));
            }
            return Err(ExperimentError::io(path)(err));
        }
        Self::held(file, path).map(Ok)
    }

    /// Takes the lock, waiting while another process (or another open of
    /// the file in this one) holds it.
    pub fn take(path: &Path) -> Result<Self> {
        let file = open_lock_file(path)?;
        loop {
            match ofd_lock(&file, libc::F_OFD_SETLKW, libc::F_WRLCK) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ExperimentError::io(path)(e)),
            }
        }
        Self::held(file, path)
    }

    /// Writes who holds the lock into its file.
    fn held(mut file: File, path: &Path) -> Result<Self> {
        let me = format!("pid {} on {}", std::process::id(), hostname());
        file.set_len(0)
            .and_then(|()| file.write_all(me.as_bytes()))
            .map_err(ExperimentError::io(path))?;
        Ok(Self { _file: file })
    }

    /// Who holds the lock at `path` now, if anyone, without taking it (a
    /// missing file is not held, and is not created).
    pub fn holder(path: &Path) -> Option<String> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .ok()?;
        let fl = ofd_lock(&file, libc::F_OFD_GETLK, libc::F_WRLCK).ok()?;
        (i32::from(fl.l_type) != libc::F_UNLCK).then(|| holder(&mut file))
    }
}

/// What the holder of a lock wrote into its file.
fn holder(file: &mut File) -> String {
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    let text = text.trim();
    if text.is_empty() {
        "unknown process".into()
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kml-record-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    #[test]
    fn plugin_sets_compare_by_file_and_hash() {
        let d = temp("plugins");
        std::fs::write(d.join("a.so"), b"one").expect("write");
        std::fs::write(d.join("b.so"), b"two").expect("write");
        std::fs::write(d.join("notes.txt"), b"not a plugin").expect("write");
        let set = plugin_set(&d).expect("hashes");
        assert_eq!(set.len(), 2);
        assert_eq!(set[0].file, "a.so");
        // sha256("one")
        assert_eq!(
            set[0].sha256,
            "7692c3ad3540bb803c020b3aee66cd8887123234ea0c6e7143c0add73ff431ed"
        );
        assert_eq!(plugin_difference(&set, &set), None);
        std::fs::write(d.join("b.so"), b"three").expect("write");
        std::fs::remove_file(d.join("a.so")).expect("remove");
        std::fs::write(d.join("c.so"), b"new").expect("write");
        let now = plugin_set(&d).expect("hashes");
        let diff = plugin_difference(&set, &now).expect("different");
        assert!(
            diff.contains("a.so is missing")
                && diff.contains("b.so changed")
                && diff.contains("c.so is new"),
            "{diff}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn locks_exclude_and_release_on_drop() {
        let d = temp("locks");
        let path = d.join("x.lock");
        let held = Lock::try_take(&path).expect("io").expect("free");
        // The lock is per open file description: a second open conflicts
        // even within one process.
        let other = Lock::try_take(&path).expect("io");
        let holder = other.expect_err("held");
        assert!(
            holder.contains(&format!("pid {}", std::process::id())),
            "{holder}"
        );
        assert_eq!(Lock::holder(&path), Some(holder));
        drop(held);
        assert_eq!(Lock::holder(&path), None);
        // Asking does not create the file.
        assert_eq!(Lock::holder(&d.join("none.lock")), None);
        assert!(!d.join("none.lock").exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn move_aside_numbers_attempts() {
        let d = temp("aside");
        let dir = ExpDir::new(&d);
        dir.create().expect("layout");
        for n in 1..=2 {
            std::fs::create_dir_all(dir.run("abc")).expect("run dir");
            let to = dir.move_aside("abc").expect("moved");
            assert_eq!(to, dir.partial().join(format!("abc-{n}")));
            assert!(!dir.run("abc").exists());
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
