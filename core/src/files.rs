//! Files the host writes in collection and experiment folders, through
//! `kernmlops_sys::private`: whole files replaced atomically under fresh
//! hidden temporary names, new files created exclusively, files repaired in
//! place opened without following a symlink. A name planted in advance (a
//! symlink to a root-only file) is never written through.
//!
//! Errors carry the reason only: callers name the file themselves.

use std::{ffi::OsStr, fs::File, io, os::unix::fs::OpenOptionsExt, path::Path};

use kernmlops_sys::private::{self, AtomicFile};

/// Mode of the files the host writes (before the umask).
pub const MODE: u32 = 0o644;

/// `e` without the `<path>: ` its text starts with (the sys layer names the
/// file; the host's error types name it again), kind kept.
pub fn without_path(e: io::Error, path: &Path) -> io::Error {
    let text = private::strip_os_error(&e);
    let prefix = format!("{}: ", path.display());
    match text.strip_prefix(&prefix) {
        Some(reason) => io::Error::new(e.kind(), reason.to_owned()),
        None => e,
    }
}

/// Replaces `path` with `bytes` atomically and durably (see
/// [`private::write_atomic`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    private::write_atomic(path, bytes, MODE).map_err(|e| without_path(e, path))
}

/// Starts replacing `path` atomically: write into the returned file, then
/// `commit` it. Dropped uncommitted, nothing is left.
pub fn atomic(path: &Path) -> io::Result<AtomicFile> {
    AtomicFile::create(path, MODE).map_err(|e| without_path(e, path))
}

fn split(path: &Path) -> io::Result<(&Path, &OsStr)> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file path"))?;
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Ok((folder, name))
}

/// Creates `path`, which must not exist: exclusively and never through a
/// symlink, relative to its folder's descriptor. Anything already there
/// (a folder just made holds nothing, so it was put there by someone else)
/// is refused.
pub fn create_new(path: &Path) -> io::Result<File> {
    let (folder, name) = split(path)?;
    let dir = private::open_dir(folder).map_err(|e| without_path(e, folder))?;
    private::create_new_at(&dir, name, MODE).map_err(|e| {
        if e.kind() == io::ErrorKind::AlreadyExists {
            io::Error::new(
                e.kind(),
                "exists already (a new folder holds nothing, so something else put it there); refusing to write through it",
            )
        } else {
            e
        }
    })
}

/// Opens an existing file to read and write in place, never through a
/// symlink.
pub fn open_in_place(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => {
                io::Error::new(e.kind(), "is a symlink; refusing to write through it")
            }
            _ => e,
        })
}
