//! Files and folders a root process creates where other users may have been
//! first: fresh private temporary folders with unpredictable names, files
//! created exclusively without following a symlink, and the one atomic
//! write (temporary file, fsync, rename, fsync of the folder).
//!
//! Every entry is created relative to a folder descriptor with
//! `O_EXCL | O_NOFOLLOW` (or `mkdirat`, which never follows), so a name
//! planted in advance, as a file, a folder or a symlink to a root-only file,
//! makes the call fail or picks another name; it is never written through.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// How many random names are tried before giving up (each clash is a name
/// somebody created first; 2^64 names make an honest clash impossible).
const ATTEMPTS: usize = 64;

/// 64 random bits from the kernel (`getrandom(2)`), as 16 hex digits.
pub fn random_hex() -> io::Result<String> {
    let mut bytes = [0u8; 8];
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: the pointer and length describe the unfilled tail of
        // `bytes`, a local that outlives the call.
        let n = unsafe {
            libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn cstring(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: a name with a NUL byte", name.to_string_lossy()),
        )
    })
}

/// A plain name (one path component): no `/`, not `.` or `..`, not empty.
fn check_name(name: &OsStr) -> io::Result<()> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a plain file name", name.to_string_lossy()),
        ));
    }
    Ok(())
}

/// Opens a folder for `*at` calls. The last component must not be a
/// symlink (`O_NOFOLLOW`); the folders above it are the caller's to trust.
pub fn open_dir(path: &Path) -> io::Result<File> {
    let c = cstring(path.as_os_str())?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(with_path(e, path));
    }
    // SAFETY: `fd` is a descriptor we just opened and own.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn with_path(e: io::Error, path: &Path) -> io::Error {
    let why = match e.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::ENOTDIR) => "is a symlink or not a folder".to_owned(),
        _ => strip_os_error(&e),
    };
    io::Error::new(e.kind(), format!("{}: {why}", path.display()))
}

/// An error's text without the " (os error N)" std appends, for messages
/// that already say what failed.
pub fn strip_os_error(e: &io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(i) if text.ends_with(')') => text[..i].to_owned(),
        _ => text,
    }
}

/// Creates `name` inside `dir` exclusively (`O_CREAT | O_EXCL |
/// O_NOFOLLOW`) with `mode`, open for writing. Fails with `AlreadyExists`
/// when anything has that name, a symlink included.
pub fn create_new_at(dir: &File, name: &OsStr, mode: u32) -> io::Result<File> {
    check_name(name)?;
    open_at(
        dir,
        &cstring(name)?,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        mode,
    )
}

/// Opens an existing regular file `name` inside `dir` for reading, never
/// through a symlink.
pub fn open_read_at(dir: &File, name: &OsStr) -> io::Result<File> {
    check_name(name)?;
    open_at(dir, &cstring(name)?, libc::O_RDONLY | libc::O_NOFOLLOW, 0)
}

/// `openat(dir, name, flags | O_CLOEXEC, mode)` as an owned file.
fn open_at(dir: &File, name: &CStr, flags: libc::c_int, mode: u32) -> io::Result<File> {
    // SAFETY: `dir` is an open descriptor and `name` NUL-terminated, both
    // alive for the call; `mode` is read only with O_CREAT.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a descriptor we just opened and own.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn rename_at(dir: &File, from: &CStr, to: &CStr) -> io::Result<()> {
    // SAFETY: `dir` is open and both names are NUL-terminated, alive for
    // the call. `renameat` replaces `to` itself, never what a symlink
    // named `to` points at.
    let rc =
        unsafe { libc::renameat(dir.as_raw_fd(), from.as_ptr(), dir.as_raw_fd(), to.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn unlink_at(dir: &File, name: &CStr) {
    // SAFETY: `dir` is open and `name` NUL-terminated; a failure leaves a
    // stray temporary file, which callers report no further.
    unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) };
}

/// A file being written under a fresh temporary name in its folder, renamed
/// over its final name by [`AtomicFile::commit`]. Dropped without a commit,
/// the temporary file is removed. Two writers of the same file never share
/// a temporary name, so concurrent writers each commit a whole file and the
/// last rename wins.
pub struct AtomicFile {
    dir: File,
    tmp: CString,
    name: CString,
    file: Option<File>,
    path: PathBuf,
}

impl AtomicFile {
    /// Starts writing `path` (its folder must exist; the folder itself is
    /// opened without following a final symlink). The temporary file is
    /// `.<name>.<random>.tmp`, mode `mode`.
    pub fn create(path: &Path, mode: u32) -> io::Result<Self> {
        let (folder, name) = split(path)?;
        let dir = open_dir(folder)?;
        Self::create_at(dir, name, mode, path)
    }

    /// As [`AtomicFile::create`], inside an open folder.
    pub fn create_at(dir: File, name: &OsStr, mode: u32, path: &Path) -> io::Result<Self> {
        check_name(name)?;
        for _ in 0..ATTEMPTS {
            let tmp_name = format!(".{}.{}.tmp", name.to_string_lossy(), random_hex()?);
            match create_new_at(&dir, OsStr::new(&tmp_name), mode) {
                Ok(file) => {
                    return Ok(Self {
                        tmp: cstring(OsStr::new(&tmp_name))?,
                        name: cstring(name)?,
                        dir,
                        file: Some(file),
                        path: path.to_owned(),
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(with_path(e, path)),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{}: no free temporary name beside it", path.display()),
        ))
    }

    /// The open temporary file, to write into.
    pub fn file(&mut self) -> &mut File {
        self.file
            .as_mut()
            .expect("an AtomicFile has its file until commit")
    }

    /// Makes the content durable and visible: fsync of the file, rename over
    /// the final name, fsync of the folder.
    pub fn commit(mut self) -> io::Result<()> {
        let file = self.file.take().expect("an AtomicFile commits once");
        file.sync_all().map_err(|e| with_path(e, &self.path))?;
        drop(file);
        rename_at(&self.dir, &self.tmp, &self.name).map_err(|e| with_path(e, &self.path))?;
        // The rename is done: nothing is left to remove.
        self.tmp = CString::default();
        self.dir.sync_all().map_err(|e| with_path(e, &self.path))
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.tmp.as_bytes().is_empty() {
            self.file = None;
            unlink_at(&self.dir, &self.tmp);
        }
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file().write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file().flush()
    }
}

fn split(path: &Path) -> io::Result<(&Path, &OsStr)> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a file path", path.display()),
        )
    })?;
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Ok((folder, name))
}

/// Writes `bytes` to `path` atomically and durably: a reader sees the old
/// or the new content, a crash leaves one of them, and a failure (a full
/// disk) leaves the old one and no temporary file.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let mut f = AtomicFile::create(path, mode)?;
    f.write_all(bytes).map_err(|e| with_path(e, path))?;
    f.commit()
}

/// A fresh private folder: created with a random name and mode 0700 by
/// `mkdirat` (which never follows a symlink and fails on any existing
/// entry), checked to be ours, and removed with everything in it when
/// dropped (unless [`TempDir::keep`] was called).
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
    dir: Option<File>,
    keep: bool,
}

impl TempDir {
    /// `<TMPDIR or /tmp>/<prefix>.<random>/`.
    pub fn new(prefix: &str) -> io::Result<Self> {
        Self::new_in(&std::env::temp_dir(), prefix)
    }

    /// `<base>/<prefix>.<random>/`. `base` may be world-writable and
    /// sticky (`/tmp`, `/var/tmp`): the new folder's name cannot be
    /// guessed, and it is checked after creation to be a folder of this
    /// process's user, mode 0700, reached without a symlink.
    pub fn new_in(base: &Path, prefix: &str) -> io::Result<Self> {
        check_name(OsStr::new(prefix))?;
        let parent = open_dir(base)?;
        for _ in 0..ATTEMPTS {
            let name = format!("{prefix}.{}", random_hex()?);
            let c = cstring(OsStr::new(&name))?;
            // SAFETY: `parent` is open and `c` NUL-terminated, alive for the call.
            let rc = unsafe { libc::mkdirat(parent.as_raw_fd(), c.as_ptr(), 0o700) };
            if rc != 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::AlreadyExists {
                    continue;
                }
                return Err(with_path(e, &base.join(&name)));
            }
            let path = base.join(&name);
            // O_NOFOLLOW refuses a symlink swapped in.
            let dir = open_at(
                &parent,
                &c,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                0,
            )
            .map_err(|e| with_path(e, &path))?;
            let meta = dir.metadata()?;
            // SAFETY: geteuid has no failure mode.
            let me = unsafe { libc::geteuid() };
            if meta.uid() != me || meta.mode() & 0o777 != 0o700 {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{}: the new folder is not private (owner {}, mode {:o})",
                        path.display(),
                        meta.uid(),
                        meta.mode() & 0o777
                    ),
                ));
            }
            return Ok(Self {
                path,
                dir: Some(dir),
                keep: false,
            });
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{}: no free name for a temporary folder", base.display()),
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `<folder>/<name>`.
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path.join(name)
    }

    /// The folder's descriptor, for `*at` calls.
    pub fn dir(&self) -> &File {
        self.dir.as_ref().expect("a TempDir keeps its descriptor")
    }

    /// Creates `name` in the folder, exclusively and without following a
    /// symlink.
    pub fn create_file(&self, name: &str, mode: u32) -> io::Result<File> {
        create_new_at(self.dir(), OsStr::new(name), mode)
            .map_err(|e| with_path(e, &self.path.join(name)))
    }

    /// Leaves the folder in place when this value is dropped; returns its path.
    pub fn keep(mut self) -> PathBuf {
        self.keep = true;
        self.path.clone()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        self.dir = None;
        if !self.keep {
            // std's remove_dir_all opens every level with O_NOFOLLOW and
            // unlinks symlinks without following them.
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::{symlink, PermissionsExt};

    #[test]
    fn temp_dirs_are_private_unique_and_removed() {
        let a = TempDir::new("kml-private-test").expect("temp dir");
        let b = TempDir::new("kml-private-test").expect("temp dir");
        assert_ne!(a.path(), b.path());
        let mode = std::fs::metadata(a.path())
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        let path = a.path().to_owned();
        a.create_file("x", 0o600)
            .and_then(|mut f| f.write_all(b"x"))
            .expect("file");
        drop(a);
        assert!(!path.exists(), "removed on drop");
        let kept = b.keep();
        assert!(kept.is_dir());
        std::fs::remove_dir_all(kept).expect("cleanup");
    }

    #[test]
    fn names_planted_in_advance_are_never_followed() {
        let scratch = TempDir::new("kml-private-plant").expect("temp dir");
        let victim = scratch.join("victim");
        std::fs::write(&victim, b"precious").expect("victim");
        // A symlink where an exclusive create goes fails, and leaves the target alone.
        symlink(&victim, scratch.join("planted")).expect("symlink");
        let err = scratch
            .create_file("planted", 0o600)
            .expect_err("planted name");
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        // A folder reached through a symlink is refused.
        symlink(scratch.path(), scratch.join("dirlink")).expect("symlink");
        let err = open_dir(&scratch.join("dirlink")).expect_err("symlinked folder");
        assert!(err.to_string().contains("symlink"), "{err}");
        assert!(TempDir::new_in(&scratch.join("dirlink"), "x").is_err());
        // An atomic write replaces a symlink at the final name, never its target.
        write_atomic(&scratch.join("planted"), b"new", 0o644).expect("atomic");
        let mut s = String::new();
        File::open(&victim)
            .and_then(|mut f| f.read_to_string(&mut s))
            .expect("read");
        assert_eq!(s, "precious");
        assert_eq!(
            std::fs::read(scratch.join("planted")).expect("read"),
            b"new"
        );
    }

    #[test]
    fn atomic_writes_leave_no_temporary_file() {
        let scratch = TempDir::new("kml-private-atomic").expect("temp dir");
        let path = scratch.join("f.json");
        write_atomic(&path, b"1", 0o644).expect("first");
        {
            let mut f = AtomicFile::create(&path, 0o644).expect("second");
            f.write_all(b"2").expect("write");
            // dropped without commit
        }
        assert_eq!(std::fs::read(&path).expect("read"), b"1");
        let names: Vec<_> = std::fs::read_dir(scratch.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![OsStr::new("f.json").to_owned()]);
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o644 & !umask());
    }

    fn umask() -> u32 {
        // SAFETY: umask has no failure mode; it is set back at once.
        unsafe {
            let m = libc::umask(0o022);
            libc::umask(m);
            m
        }
    }

    #[test]
    fn os_error_suffix_is_stripped_once() {
        let e = io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(strip_os_error(&e), "No such file or directory");
    }
}
