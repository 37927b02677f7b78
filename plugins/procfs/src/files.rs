//! Opening and reading the sampled files: each opened once, checked to be a
//! regular file whose real path (after any symlink) stays under its root
//! (`/proc`, the sysfs root, the cgroup v2 mount), then read from offset 0
//! at every sample into one reused buffer, never past a bound. Also where
//! the benchmark's cgroup is found.

use std::{
    fs::{File, OpenOptions},
    io::{self, Read, Seek, SeekFrom},
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::{Path, PathBuf},
};

/// Largest file read: the rest of a longer one is not read (a note says
/// so). `/proc/interrupts` of a 256-CPU machine is about 1 MiB.
pub const MAX_FILE_BYTES: usize = 4 << 20;
/// Bytes read from the run's undo log to find the benchmark's cgroup.
const MAX_UNDO_LOG_BYTES: usize = 1 << 20;

/// A file opened for sampling.
#[derive(Debug)]
pub struct Source {
    pub file: File,
    /// Its path, for notes.
    pub path: PathBuf,
    /// Failed reads during the run, with the last error.
    pub failures: u64,
    pub last_error: Option<String>,
    /// Reads cut at [`MAX_FILE_BYTES`].
    pub truncated: u64,
}

impl Source {
    /// Opens `path`, a regular file whose real path is under `root` (a
    /// canonical path).
    pub fn open(path: &Path, root: &Path) -> io::Result<Self> {
        Ok(Self {
            file: open_within(path, root)?,
            path: path.to_owned(),
            failures: 0,
            last_error: None,
            truncated: 0,
        })
    }

    /// Reads the whole file (up to the bound) into `buf`; on failure counts
    /// it and returns false.
    pub fn read(&mut self, buf: &mut Vec<u8>) -> bool {
        match read_bounded(&self.file, buf, MAX_FILE_BYTES) {
            Ok(cut) => {
                if cut {
                    self.truncated += 1;
                }
                true
            }
            Err(e) => {
                self.failures += 1;
                self.last_error = Some(e.to_string());
                false
            }
        }
    }
}

/// Opens `path` for reading (non-blocking, so a symlink to a FIFO cannot
/// hang the probe) and checks that it is a regular file whose real path,
/// as the kernel resolved it, is under `root`.
pub fn open_within(path: &Path, root: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    let real = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    if !real.starts_with(root) {
        return Err(io::Error::other(format!(
            "it resolves to {}, outside {}",
            real.display(),
            root.display()
        )));
    }
    Ok(file)
}

/// Reads `file` from offset 0 into `buf` (cleared first, its capacity
/// kept for the next sample), at most `max` bytes; true when the file was
/// longer. Seeking to 0 makes procfs and sysfs produce the file anew.
pub fn read_bounded(file: &File, buf: &mut Vec<u8>, max: usize) -> io::Result<bool> {
    buf.clear();
    let mut f = file;
    f.seek(SeekFrom::Start(0))?;
    // One byte past the bound says whether the file goes on.
    f.take(max as u64 + 1).read_to_end(buf)?;
    if buf.len() > max {
        buf.truncate(max);
        return Ok(true);
    }
    Ok(false)
}

/// The text of a read buffer, up to its last complete line (a file cut at
/// the bound ends mid-line); `None` when it is not UTF-8.
pub fn text(buf: &[u8], truncated: bool) -> Option<&str> {
    let end = if truncated {
        buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)
    } else {
        buf.len()
    };
    std::str::from_utf8(&buf[..end]).ok()
}

/// The benchmark's workload cgroup, from the run's undo log
/// (`<state_dir>/undo.jsonl`, where the host records `{"cgroup": PATH}`
/// before it makes the cgroup); `None` outside a benchmark run.
pub fn benchmark_cgroup(state_dir: &str) -> Option<PathBuf> {
    if state_dir.is_empty() {
        return None;
    }
    let file = File::open(Path::new(state_dir).join("undo.jsonl")).ok()?;
    let mut buf = Vec::new();
    read_bounded(&file, &mut buf, MAX_UNDO_LOG_BYTES).ok()?;
    cgroup_in_undo_log(&String::from_utf8_lossy(&buf))
}

/// The first `cgroup` entry of an undo log's text.
pub fn cgroup_in_undo_log(text: &str) -> Option<PathBuf> {
    text.lines().find_map(|line| {
        let v: kernmlops_plugin_sdk::serde_json::Value =
            kernmlops_plugin_sdk::serde_json::from_str(line).ok()?;
        v.get("cgroup")?.as_str().map(PathBuf::from)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernmlops_plugin_sdk::sys::private::TempDir;

    #[test]
    fn reads_are_bounded_and_cut_at_a_line() {
        let dir = TempDir::new("procfs-read").expect("temp dir");
        let path = dir.join("f");
        std::fs::write(&path, "a 1\nb 2\nc 3\n").expect("write");
        let file = File::open(&path).expect("open");
        let mut buf = Vec::new();
        assert!(!read_bounded(&file, &mut buf, 100).expect("read"));
        assert_eq!(buf, b"a 1\nb 2\nc 3\n");
        assert!(read_bounded(&file, &mut buf, 6).expect("read"));
        assert_eq!(buf, b"a 1\nb ");
        assert_eq!(text(&buf, true), Some("a 1\n"));
        assert!(
            !read_bounded(&file, &mut buf, 12).expect("read"),
            "exactly the bound"
        );
        // Read again from the start, into the same buffer.
        std::fs::write(&path, "z 9\n").expect("write");
        assert!(!read_bounded(&file, &mut buf, 100).expect("read"));
        assert_eq!(text(&buf, false), Some("z 9\n"));
    }

    #[test]
    fn real_files_proc_symlinks_included_stay_under_their_roots() {
        let proc_root = Path::new("/proc");
        // /proc/net is a symlink to self/net: still under /proc.
        Source::open(Path::new("/proc/net/dev"), proc_root).expect("/proc/net/dev");
        let dir = TempDir::new("procfs-root").expect("temp dir");
        let root = std::fs::canonicalize(dir.path()).expect("canonical");
        std::fs::write(dir.join("inside"), "1\n").expect("write");
        std::os::unix::fs::symlink(dir.join("inside"), dir.join("link_in")).expect("symlink");
        std::os::unix::fs::symlink("/proc/vmstat", dir.join("link_out")).expect("symlink");
        std::fs::create_dir(dir.join("sub")).expect("mkdir");
        open_within(&dir.join("inside"), &root).expect("inside");
        open_within(&dir.join("link_in"), &root).expect("a symlink inside the root");
        let e = open_within(&dir.join("link_out"), &root).expect_err("out of the root");
        assert!(e.to_string().contains("outside"), "{e}");
        assert!(open_within(&dir.join("sub"), &root).is_err(), "a folder");
    }

    #[test]
    fn the_benchmark_cgroup_is_the_undo_logs_cgroup_entry() {
        let log = "{\"restore\":\"/sys/kernel/mm/transparent_hugepage/enabled\",\"previous\":\"always\"}\n\
                   {\"cgroup\":\"/sys/fs/cgroup/kernmlops/abc\"}\nnot json\n";
        assert_eq!(
            cgroup_in_undo_log(log),
            Some(PathBuf::from("/sys/fs/cgroup/kernmlops/abc"))
        );
        assert_eq!(cgroup_in_undo_log("{\"remove\":\"/tmp/x\"}\n"), None);
        assert_eq!(benchmark_cgroup(""), None);
        let dir = TempDir::new("procfs-state").expect("temp dir");
        std::fs::write(dir.join("undo.jsonl"), log).expect("write");
        assert_eq!(
            benchmark_cgroup(dir.path().to_str().expect("utf8")),
            Some(PathBuf::from("/sys/fs/cgroup/kernmlops/abc"))
        );
    }
}
