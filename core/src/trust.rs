//! Whether kernmlops, usually running as root, may use a file: a plugin
//! `.so`, the plugin folder, or an `overrides.toml` found in the current
//! directory. Checked before any plugin code runs.
//!
//! **Ownership and permissions** (what module loaders, sudo and ssh demand).
//! The file and every folder above it, up to `/`, must be owned by root or
//! by the invoking user (the real user id; under sudo, the user who ran sudo,
//! from `SUDO_UID`), and must not be writable by group or others. A
//! group-writable mode also covers POSIX ACLs that grant anyone write access
//! (the group bits are the ACL mask).
//!
//! One exception: a folder *above* what is checked may be writable by
//! others when it has the sticky bit (like `/tmp`). In a sticky folder only
//! an entry's owner (or the folder's owner, or root) can rename or remove
//! it; the folder itself must be owned by root or the invoking user, and so
//! must the next component, so nobody else can swap anything on the path.
//! What is checked itself gets no such exception: a plugin folder that is
//! sticky but world-writable is refused, since anyone could add files to
//! the folder kernmlops reads as "every `.so` here". (A file someone else
//! adds there would be refused for its owner, but kernmlops does not
//! read folders that invite that.)
//!
//! The checks run on open descriptors, not on names: the file is opened
//! once, its real path is read back from `/proc/self/fd`, and that path is
//! walked from `/` with `O_PATH | O_NOFOLLOW` descriptors, each checked
//! with `fstat`; the last entry must be the very inode that was opened. A
//! symlink is followed to its target, and the target's folders are the
//! ones checked. The plugin's bytes are then copied from the same
//! descriptor into a sealed memory file, and that copy is what
//! [`check_elf`] checks and what is loaded (`crate::plugin`).
//!
//! **ELF sanity** ([`check_elf`]): before `dlopen`, a plugin must be a
//! complete shared library for this machine's class, byte order and
//! architecture, every segment and section inside the file (a truncated
//! file otherwise dies with SIGBUS inside the dynamic loader), exporting
//! abi_stable's root-module symbol. So a file that is not a plugin never
//! gets its constructors run.

use std::{
    ffi::{CString, OsStr},
    fmt,
    fs::File,
    io,
    os::{
        fd::{AsRawFd, FromRawFd},
        unix::{ffi::OsStrExt, fs::FileExt, fs::MetadataExt, fs::PermissionsExt},
    },
    path::{Component, Path, PathBuf},
};

/// Who may own what kernmlops loads, and whether unsafe files are loaded
/// anyway (`--allow-insecure-plugins`).
#[derive(Debug, Clone)]
pub struct Policy {
    trusted: Vec<u32>,
    /// Ownership and permission problems become warnings instead of
    /// refusals. The ELF check still applies.
    pub allow_insecure: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Self::for_this_process(false)
    }
}

impl Policy {
    /// Root, this process's real and effective user, and under sudo (real
    /// user root) the user who ran sudo.
    pub fn for_this_process(allow_insecure: bool) -> Self {
        // SAFETY: getuid and geteuid have no preconditions and cannot fail.
        let (uid, euid) = unsafe { (libc::getuid(), libc::geteuid()) };
        let mut trusted = vec![0, uid, euid];
        if uid == 0 {
            // Set by sudo itself; whoever controls root's environment is
            // root already.
            if let Some(sudo_uid) = std::env::var("SUDO_UID")
                .ok()
                .and_then(|v| v.parse::<u32>().ok())
            {
                trusted.push(sudo_uid);
            }
        }
        Self::with_trusted(&trusted, allow_insecure)
    }

    /// A policy trusting exactly `uids` (and root).
    pub fn with_trusted(uids: &[u32], allow_insecure: bool) -> Self {
        let mut trusted = vec![0];
        trusted.extend_from_slice(uids);
        trusted.sort_unstable();
        trusted.dedup();
        Self {
            trusted,
            allow_insecure,
        }
    }

    pub fn trusts(&self, uid: u32) -> bool {
        self.trusted.contains(&uid)
    }

    /// "root" or "root or uid 1000 (alice)".
    fn trusted_owners(&self) -> String {
        let mut names = vec!["root".to_owned()];
        names.extend(self.trusted.iter().filter(|&&u| u != 0).map(|&u| user(u)));
        names.join(" or ")
    }
}

/// Why a file may not be used, as one line naming the path and the fix.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error(
        "untrusted: {kind} {path} is writable by {who} (mode {mode:04o}), who could change what \
         kernmlops runs as root; fix: chmod {fix} {path}"
    )]
    Writable {
        kind: &'static str,
        path: Shown,
        who: &'static str,
        mode: u32,
        fix: &'static str,
    },
    #[error(
        "untrusted: {kind} {path} is owned by {owner}, not by {trusted}; fix: chown root:root \
         {path}, or move it somewhere root owns"
    )]
    Owner {
        kind: &'static str,
        path: Shown,
        owner: String,
        trusted: String,
    },
    #[error("{path} is not a regular file; remove it")]
    NotRegular { path: Shown },
    #[error("{path} changed while it was being checked (moved or replaced); try again")]
    Changed { path: Shown },
    #[error("checking {path}: {source}")]
    Io { path: Shown, source: io::Error },
    #[error("not a kernmlops plugin: not an ELF file (it starts with \"{start}\"); remove it from the plugin folder")]
    NotElf { start: String },
    #[error(
        "damaged plugin file: its {what} ends at byte {end}, past the end of the {size}-byte file \
         (truncated, or cut off while copying); copy or rebuild it"
    )]
    Truncated { what: String, end: u64, size: u64 },
    #[error("built for {found}, but this machine runs {expected}; rebuild it for this machine")]
    Foreign { found: String, expected: String },
    #[error("not a kernmlops plugin: an ELF {kind}, not a shared library; remove it from the plugin folder")]
    NotShared { kind: &'static str },
    #[error("malformed ELF file: {0}; rebuild it")]
    Malformed(String),
    #[error(
        "not a kernmlops plugin: it does not export abi_stable's root module ({symbol}); build it \
         with kernmlops-plugin-sdk's export_plugin!, or remove it from the plugin folder"
    )]
    NoRootModule { symbol: &'static str },
}

/// A path for messages: non-printable characters and bytes that are not
/// UTF-8 are escaped, so a file name cannot inject lines or raw bytes.
#[derive(Debug, Clone)]
pub struct Shown(pub PathBuf);

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&printable(self.0.as_os_str().as_bytes()))
    }
}

fn shown(path: &Path) -> Shown {
    Shown(path.to_owned())
}

/// `bytes` as text with control characters escaped (`\n`, `\u{1b}`) and
/// bytes that are not UTF-8 written as `\xNN`.
pub fn printable(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// "uid 65534 (nobody)".
fn user(uid: u32) -> String {
    match user_name(uid) {
        Some(name) => format!("uid {uid} ({})", printable(name.as_bytes())),
        None => format!("uid {uid}"),
    }
}

fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: passwd is plain old data that getpwuid_r fills.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call and buf's length is
    // passed; on success the strings in pwd point into buf.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() || pwd.pw_name.is_null() {
        return None;
    }
    // SAFETY: pw_name is a NUL-terminated string inside buf, alive here.
    let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
    Some(String::from_utf8_lossy(name.to_bytes()).into_owned())
}

/// Opens `path` for reading without blocking on a FIFO or taking a
/// terminal, close-on-exec. Symlinks are followed.
pub fn open_file(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(path)
}

/// Opens `name` inside the folder `dir` like [`open_file`].
pub fn open_file_at(dir: &File, name: &OsStr) -> io::Result<File> {
    openat(
        dir,
        name,
        libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK,
    )
}

/// Opens a folder for listing, close-on-exec.
pub fn open_dir(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_DIRECTORY)
        .open(path)
}

fn openat(dir: &File, name: &OsStr, flags: libc::c_int) -> io::Result<File> {
    let c_name = CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file name contains NUL"))?;
    // SAFETY: dir is an open descriptor and c_name is NUL-terminated; the
    // call does not keep either.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c_name.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// The path the kernel has for an open descriptor.
pub fn fd_path(file: &File) -> io::Result<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// Checks an opened regular file and every folder above it.
pub fn check_file(file: &File, policy: &Policy) -> Result<(), TrustError> {
    check_opened(file, policy, false)
}

/// Checks an opened folder and every folder above it.
pub fn check_dir(dir: &File, policy: &Policy) -> Result<(), TrustError> {
    check_opened(dir, policy, true)
}

/// Opens the file at `path` and checks it; the path is what the message
/// shows when opening fails.
pub fn check_file_path(path: &Path, policy: &Policy) -> Result<(), TrustError> {
    let file = open_file(path).map_err(|source| TrustError::Io {
        path: shown(path),
        source,
    })?;
    check_file(&file, policy)
}

/// Checks a file kernmlops takes instructions from (`what`: `--config`, the
/// experiment file; both can name commands that run as root) like a
/// plugin. `Ok(None)`: safe. `Ok(Some(warning))`: unsafe, but the policy
/// allows insecure files. `Err(refusal)`: unsafe. A file that cannot be
/// opened passes: its reader says why it cannot read it.
pub fn check_instructions(
    path: &Path,
    what: &str,
    policy: &Policy,
) -> Result<Option<String>, String> {
    match check_file_path(path, policy) {
        Ok(()) | Err(TrustError::Io { .. }) => Ok(None),
        Err(e) if policy.allow_insecure => Ok(Some(format!(
            "using {what} although {e} (--allow-insecure-plugins)"
        ))),
        Err(e) => Err(format!("refusing {what}: {e}")),
    }
}

/// Opens the folder at `path` and checks it.
pub fn check_dir_path(path: &Path, policy: &Policy) -> Result<(), TrustError> {
    let dir = open_dir(path).map_err(|source| TrustError::Io {
        path: shown(path),
        source,
    })?;
    check_dir(&dir, policy)
}

/// Where the program a configuration names is: a name with a `/` is a
/// path, relative to `base` (the folder of the file that named it) unless
/// absolute; a bare name (`sh`, `python3`) is looked up on PATH (absolute
/// entries only: a relative entry would depend on the current folder).
/// It must be an executable regular file. The message is one line.
pub fn resolve_program(program: &str, base: &Path) -> Result<PathBuf, ProgramError> {
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.is_empty() {
        return Err(ProgramError::Empty);
    }
    if program.contains('/') {
        // Joined and cleaned of `.` parts (`./bench.sh`).
        let path: PathBuf = base.join(program).components().collect();
        return if executable(&path) {
            Ok(path)
        } else if path.exists() {
            Err(ProgramError::NotExecutable { path })
        } else {
            Err(ProgramError::Missing {
                path,
                base: base.to_owned(),
            })
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(program))
        .find(|p| executable(p))
        .ok_or_else(|| ProgramError::NotOnPath {
            name: program.to_owned(),
        })
}

/// Why [`resolve_program`] found no program to run. Each is one line, with
/// non-printable characters escaped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgramError {
    #[error("the program (its first item) is empty")]
    Empty,
    #[error("{} is not an executable file (chmod +x {})", show(.path), show(.path))]
    NotExecutable { path: PathBuf },
    /// A path with a `/`, relative to `base` unless absolute.
    #[error("{} does not exist (a relative path is taken from the folder of the file that names it, {})", show(.path), show(.base))]
    Missing { path: PathBuf, base: PathBuf },
    /// A bare name found in no absolute folder on PATH.
    #[error("{} is not on PATH (give its path, e.g. ./{})", printable(.name.as_bytes()), printable(.name.as_bytes()))]
    NotOnPath { name: String },
}

/// A path as a message shows it: non-printable bytes escaped.
fn show(p: &Path) -> String {
    printable(p.as_os_str().as_bytes())
}

/// Checks a file kernmlops is configured to run (`what`: "the program",
/// "the file") like a plugin: the file and every folder above it, and when
/// the path's last part is a symlink (`/usr/bin/sh`), the folder holding
/// the link as well. `Ok` holds the path to run: the real path of the
/// folder holding it (every folder of which was checked) with the name as
/// given, so a program that looks at its own name still sees it; and,
/// under `--allow-insecure-plugins`, a warning for an unsafe file. A file
/// that cannot be opened is refused too: it is about to be run.
pub fn check_program(
    path: &Path,
    what: &str,
    policy: &Policy,
) -> Result<(PathBuf, Option<String>), String> {
    let cannot = |e: &dyn fmt::Display| format!("{what} {}: {e}", shown(path));
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(cannot(&"not a file"));
    };
    let link = path
        .symlink_metadata()
        .is_ok_and(|m| m.file_type().is_symlink());
    let dir = open_dir(parent).map_err(|e| cannot(&kernmlops_sys::private::strip_os_error(&e)))?;
    let file = open_file_at(&dir, name)
        .map_err(|e| cannot(&kernmlops_sys::private::strip_os_error(&e)))?;
    let real_parent = fd_path(&dir).map_err(|e| cannot(&e))?;
    let mut checked = check_file(&file, policy);
    if checked.is_ok() && link {
        checked = check_dir(&dir, policy);
    }
    let run = real_parent.join(name);
    match checked {
        Ok(()) => Ok((run, None)),
        Err(e @ (TrustError::Writable { .. } | TrustError::Owner { .. }))
            if policy.allow_insecure =>
        {
            Ok((
                run,
                Some(format!(
                    "running {what} {} although {e} (--allow-insecure-plugins)",
                    shown(path)
                )),
            ))
        }
        Err(e) => Err(format!("refusing to run {what} {}: {e}", shown(path))),
    }
}

fn check_opened(target: &File, policy: &Policy, is_dir: bool) -> Result<(), TrustError> {
    let io_err = |path: &Path| {
        let path = shown(path);
        move |source| TrustError::Io { path, source }
    };
    let real = fd_path(target).map_err(io_err(Path::new("/proc/self/fd")))?;
    let meta = target.metadata().map_err(io_err(&real))?;
    let kind = if is_dir { "folder" } else { "file" };
    if is_dir != meta.is_dir() || (!is_dir && !meta.is_file()) {
        return Err(TrustError::NotRegular { path: shown(&real) });
    }
    let mut names = Vec::new();
    for c in real.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(n) => names.push(n),
            // The kernel's path is absolute and clean; anything else (a
            // file on an unreachable mount, "(deleted)") fails closed.
            _ => return Err(TrustError::Changed { path: shown(&real) }),
        }
    }
    if !real.is_absolute() {
        return Err(TrustError::Changed { path: shown(&real) });
    }
    let Some((last, parents)) = names.split_last() else {
        // The target is `/` itself.
        return check_entry(&real, &meta, policy, kind, false);
    };
    // From `/` down to the folder holding the target, each folder checked
    // on its own descriptor, the next one opened relative to it.
    let mut here = PathBuf::from("/");
    let mut dir = open_path_dir(&here).map_err(io_err(&here))?;
    for name in parents {
        let dmeta = dir.metadata().map_err(io_err(&here))?;
        check_entry(&here, &dmeta, policy, "folder", true)?;
        here.push(name);
        dir = openat(
            &dir,
            name,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        )
        .map_err(|_| TrustError::Changed { path: shown(&here) })?;
    }
    let dmeta = dir.metadata().map_err(io_err(&here))?;
    check_entry(&here, &dmeta, policy, "folder", true)?;
    here.push(last);
    let entry = openat(&dir, last, libc::O_PATH | libc::O_NOFOLLOW)
        .map_err(|_| TrustError::Changed { path: shown(&here) })?;
    let emeta = entry.metadata().map_err(io_err(&here))?;
    if (emeta.dev(), emeta.ino()) != (meta.dev(), meta.ino()) {
        return Err(TrustError::Changed { path: shown(&here) });
    }
    check_entry(&here, &meta, policy, kind, false)
}

fn open_path_dir(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_PATH | libc::O_DIRECTORY)
        .open(path)
}

/// Owner and mode of one path component. `sticky_ok`: a sticky
/// world-writable folder is accepted (it is above the target's folder, and
/// the next component's owner is checked next).
fn check_entry(
    path: &Path,
    meta: &std::fs::Metadata,
    policy: &Policy,
    kind: &'static str,
    sticky_ok: bool,
) -> Result<(), TrustError> {
    if !policy.trusts(meta.uid()) {
        return Err(TrustError::Owner {
            kind,
            path: shown(path),
            owner: user(meta.uid()),
            trusted: policy.trusted_owners(),
        });
    }
    let mode = meta.permissions().mode() & 0o7777;
    let sticky = mode & libc::S_ISVTX != 0;
    let (group, others) = (mode & 0o020 != 0, mode & 0o002 != 0);
    if (group || others) && !(sticky_ok && sticky && meta.is_dir()) {
        let (who, fix) = match (group, others) {
            (true, true) => ("group and others", "go-w"),
            (true, false) => ("its group", "g-w"),
            _ => ("others", "o-w"),
        };
        return Err(TrustError::Writable {
            kind,
            path: shown(path),
            who,
            mode,
            fix,
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// ELF sanity check

const ELFCLASS32: u8 = 1;
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const ELFDATA2MSB: u8 = 2;
const ET_DYN: u16 = 3;
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const SHT_NULL: u32 = 0;
const SHT_STRTAB: u32 = 3;
const SHT_NOBITS: u32 = 8;
const SHT_DYNSYM: u32 = 11;
/// Largest symbol or string table read, far above any plugin's.
const MAX_TABLE: u64 = 256 << 20;

/// This machine's class, byte order and `e_machine`.
const HOST_CLASS: u8 = if cfg!(target_pointer_width = "64") {
    ELFCLASS64
} else {
    ELFCLASS32
};
const HOST_DATA: u8 = if cfg!(target_endian = "little") {
    ELFDATA2LSB
} else {
    ELFDATA2MSB
};
const HOST_MACHINE: u16 = if cfg!(target_arch = "x86_64") {
    62
} else if cfg!(target_arch = "aarch64") {
    183
} else if cfg!(target_arch = "x86") {
    3
} else if cfg!(target_arch = "arm") {
    40
} else if cfg!(target_arch = "riscv64") {
    243
} else if cfg!(target_arch = "powerpc64") {
    21
} else if cfg!(target_arch = "s390x") {
    22
} else if cfg!(target_arch = "loongarch64") {
    258
} else {
    // Unknown here: the machine is not checked.
    0
};

fn machine_name(m: u16) -> String {
    let name = match m {
        3 => "i386",
        8 => "MIPS",
        20 => "PowerPC",
        21 => "PowerPC 64",
        22 => "s390",
        40 => "ARM",
        62 => "x86_64",
        183 => "aarch64",
        243 => "RISC-V",
        247 => "BPF",
        258 => "LoongArch",
        _ => return format!("ELF machine {m}"),
    };
    format!("{name} (ELF machine {m})")
}

/// Reads fields of one ELF file through `pread`, refusing any range past
/// the end of the file.
struct Elf<'a> {
    file: &'a File,
    size: u64,
    is64: bool,
    le: bool,
}

impl Elf<'_> {
    fn read(&self, offset: u64, len: u64, what: &str) -> Result<Vec<u8>, TrustError> {
        let end = offset
            .checked_add(len)
            .ok_or_else(|| TrustError::Malformed(format!("its {what} has an impossible size")))?;
        if end > self.size {
            return Err(TrustError::Truncated {
                what: what.to_owned(),
                end,
                size: self.size,
            });
        }
        if len > MAX_TABLE {
            return Err(TrustError::Malformed(format!("its {what} is {len} bytes")));
        }
        let mut buf = vec![0u8; len as usize];
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|e| TrustError::Malformed(format!("reading its {what}: {e}")))?;
        Ok(buf)
    }

    fn u16(&self, b: &[u8], at: usize) -> u16 {
        let v = [b[at], b[at + 1]];
        if self.le {
            u16::from_le_bytes(v)
        } else {
            u16::from_be_bytes(v)
        }
    }

    fn u32(&self, b: &[u8], at: usize) -> u32 {
        let v = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        if self.le {
            u32::from_le_bytes(v)
        } else {
            u32::from_be_bytes(v)
        }
    }

    fn u64(&self, b: &[u8], at: usize) -> u64 {
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[at..at + 8]);
        if self.le {
            u64::from_le_bytes(v)
        } else {
            u64::from_be_bytes(v)
        }
    }

    /// An address-sized field: offset `at32` in ELF32, `at64` in ELF64.
    fn word(&self, b: &[u8], at32: usize, at64: usize) -> u64 {
        if self.is64 {
            self.u64(b, at64)
        } else {
            u64::from(self.u32(b, at32))
        }
    }
}

/// One section header's fields that matter here.
struct Section {
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
    entsize: u64,
}

/// Checks, from the opened file alone, that it is a complete shared
/// library for this machine exporting `symbol` (abi_stable's root module).
pub fn check_elf(file: &File, symbol: &'static str) -> Result<(), TrustError> {
    let elf = Elf::open(file)?;
    let h = elf.header()?;
    elf.check_segments(&h)?;
    let sections = elf.sections(&h)?;
    elf.find_root_module(&sections, symbol)
}

/// Where the ELF header says the program and section header tables are.
struct Header {
    phoff: u64,
    shoff: u64,
    phentsize: u64,
    phnum: u64,
    shentsize: u64,
    shnum: u64,
}

impl<'a> Elf<'a> {
    /// Reads the identification: an ELF file of this machine's class and
    /// byte order.
    fn open(file: &'a File) -> Result<Self, TrustError> {
        let size = file
            .metadata()
            .map_err(|e| TrustError::Malformed(format!("reading its size: {e}")))?
            .len();
        let mut ident = [0u8; 16];
        let got = read_up_to(file, &mut ident)
            .map_err(|e| TrustError::Malformed(format!("reading its header: {e}")))?;
        if got < 4 || ident[..4] != *b"\x7fELF" {
            return Err(TrustError::NotElf {
                start: printable(&ident[..got.min(8)]).replace('"', "\\\""),
            });
        }
        if got < 16 {
            return Err(TrustError::Truncated {
                what: "ELF identification".into(),
                end: 16,
                size,
            });
        }
        let (class, data) = (ident[4], ident[5]);
        if class != ELFCLASS32 && class != ELFCLASS64 {
            return Err(TrustError::Malformed(format!("unknown ELF class {class}")));
        }
        if data != ELFDATA2LSB && data != ELFDATA2MSB {
            return Err(TrustError::Malformed(format!("unknown byte order {data}")));
        }
        let describe = |class: u8, data: u8| {
            format!(
                "{}-bit {}",
                if class == ELFCLASS64 { 64 } else { 32 },
                if data == ELFDATA2LSB {
                    "little-endian"
                } else {
                    "big-endian"
                }
            )
        };
        if (class, data) != (HOST_CLASS, HOST_DATA) {
            return Err(TrustError::Foreign {
                found: describe(class, data),
                expected: describe(HOST_CLASS, HOST_DATA),
            });
        }
        Ok(Elf {
            file,
            size,
            is64: class == ELFCLASS64,
            le: data == ELFDATA2LSB,
        })
    }

    /// The offset of a field at `in32` in ELF32 and `in64` in ELF64.
    fn at(&self, in32: usize, in64: usize) -> usize {
        if self.is64 {
            in64
        } else {
            in32
        }
    }

    /// The ELF header: a shared object for this machine, and where its
    /// tables are.
    fn header(&self) -> Result<Header, TrustError> {
        let h = self.read(0, if self.is64 { 64 } else { 52 }, "ELF header")?;
        let e_type = self.u16(&h, 16);
        if e_type != ET_DYN {
            let kind = match e_type {
                1 => "relocatable object (.o)",
                2 => "executable",
                4 => "core dump",
                _ => "file of unknown type",
            };
            return Err(TrustError::NotShared { kind });
        }
        let machine = self.u16(&h, 18);
        if HOST_MACHINE != 0 && machine != HOST_MACHINE {
            return Err(TrustError::Foreign {
                found: machine_name(machine),
                expected: machine_name(HOST_MACHINE),
            });
        }
        Ok(Header {
            phoff: self.word(&h, 28, 32),
            shoff: self.word(&h, 32, 40),
            phentsize: u64::from(self.u16(&h, self.at(42, 54))),
            phnum: u64::from(self.u16(&h, self.at(44, 56))),
            shentsize: u64::from(self.u16(&h, self.at(46, 58))),
            shnum: u64::from(self.u16(&h, self.at(48, 60))),
        })
    }

    /// Program headers: every loadable segment and the dynamic section must
    /// lie inside the file, or the loader maps pages that do not exist.
    fn check_segments(&self, h: &Header) -> Result<(), TrustError> {
        let (phnum, phentsize, size) = (h.phnum, h.phentsize, self.size);
        let want_ph = if self.is64 { 56 } else { 32 };
        if phnum == 0 || phentsize != want_ph {
            return Err(TrustError::Malformed(format!(
                "{phnum} program headers of {phentsize} bytes"
            )));
        }
        let ph = self.read(h.phoff, phnum * phentsize, "program header table")?;
        let (mut loads, mut dynamic) = (0, false);
        for i in 0..phnum as usize {
            let p = &ph[i * want_ph as usize..(i + 1) * want_ph as usize];
            let kind = self.u32(p, 0);
            let offset = self.word(p, 4, 8);
            let filesz = self.word(p, 16, 32);
            let memsz = self.word(p, 20, 40);
            let what = match kind {
                PT_LOAD => format!("loadable segment {i}"),
                PT_DYNAMIC => "dynamic section".to_owned(),
                _ => continue,
            };
            let end = offset.checked_add(filesz).ok_or_else(|| {
                TrustError::Malformed(format!("its {what} has an impossible size"))
            })?;
            if end > size {
                return Err(TrustError::Truncated { what, end, size });
            }
            if kind == PT_LOAD {
                if filesz > memsz {
                    return Err(TrustError::Malformed(format!(
                        "{what} is larger in the file than in memory"
                    )));
                }
                loads += 1;
            } else {
                dynamic = true;
            }
        }
        if loads == 0 || !dynamic {
            return Err(TrustError::Malformed(
                "no loadable segment or no dynamic section".into(),
            ));
        }
        Ok(())
    }

    /// Section headers: all present and inside the file.
    fn sections(&self, h: &Header) -> Result<Vec<Section>, TrustError> {
        let (shoff, shentsize, size) = (h.shoff, h.shentsize, self.size);
        let want_sh = if self.is64 { 64 } else { 40 };
        if shoff == 0 {
            return Err(TrustError::Malformed(
                "no section headers, so its dynamic symbols cannot be found".into(),
            ));
        }
        if shentsize != want_sh {
            return Err(TrustError::Malformed(format!(
                "section headers of {shentsize} bytes"
            )));
        }
        let section = |b: &[u8]| Section {
            kind: self.u32(b, 4),
            offset: self.word(b, 16, 24),
            size: self.word(b, 20, 32),
            link: self.u32(b, self.at(24, 40)),
            entsize: self.word(b, 36, 56),
        };
        let mut shnum = h.shnum;
        if shnum == 0 {
            // More sections than fit in e_shnum: the count is in section 0.
            shnum = section(&self.read(shoff, want_sh, "section header table")?).size;
        }
        let sh = self.read(shoff, shnum * want_sh, "section header table")?;
        let sections: Vec<Section> = sh.chunks_exact(want_sh as usize).map(section).collect();
        for (i, s) in sections.iter().enumerate() {
            if s.kind == SHT_NULL || s.kind == SHT_NOBITS {
                continue;
            }
            let end = s.offset.checked_add(s.size).ok_or_else(|| {
                TrustError::Malformed(format!("section {i} has an impossible size"))
            })?;
            if end > size {
                return Err(TrustError::Truncated {
                    what: format!("section {i}"),
                    end,
                    size,
                });
            }
        }
        Ok(sections)
    }

    /// The dynamic symbol table exports `symbol`: defined, global or weak,
    /// default or protected visibility.
    fn find_root_module(
        &self,
        sections: &[Section],
        symbol: &'static str,
    ) -> Result<(), TrustError> {
        let Some(dynsym) = sections.iter().find(|s| s.kind == SHT_DYNSYM) else {
            return Err(TrustError::NoRootModule { symbol });
        };
        let strtab = sections
            .get(dynsym.link as usize)
            .filter(|s| s.kind == SHT_STRTAB)
            .ok_or_else(|| {
                TrustError::Malformed("its dynamic symbol table has no string table".into())
            })?;
        let sym_size = if self.is64 { 24 } else { 16 };
        if dynsym.entsize != 0 && dynsym.entsize != sym_size {
            return Err(TrustError::Malformed(format!(
                "dynamic symbols of {} bytes",
                dynsym.entsize
            )));
        }
        let syms = self.read(dynsym.offset, dynsym.size, "dynamic symbol table")?;
        let strs = self.read(strtab.offset, strtab.size, "dynamic string table")?;
        let wanted = symbol.as_bytes();
        for s in syms.chunks_exact(sym_size as usize) {
            let name_at = self.u32(s, 0) as usize;
            let (info, other, shndx) = if self.is64 {
                (s[4], s[5], self.u16(s, 6))
            } else {
                (s[12], s[13], self.u16(s, 14))
            };
            let Some(name) = strs.get(name_at..) else {
                continue;
            };
            let name = name.split(|&b| b == 0).next().unwrap_or_default();
            let bind = info >> 4;
            let visible = matches!(other & 3, 0 | 3); // default or protected
            if name == wanted && shndx != 0 && matches!(bind, 1 | 2) && visible {
                return Ok(());
            }
        }
        Err(TrustError::NoRootModule { symbol })
    }
}

/// Reads up to `buf.len()` bytes from the start of `file`.
fn read_up_to(file: &File, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SYMBOL: &str = abi_stable::library::ROOT_MODULE_LOADER_NAME;

    /// A scratch folder under the target directory, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("kml-trust-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir(&dir).expect("creating scratch folder");
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
                .expect("chmod scratch folder");
            Self(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn me() -> Policy {
        Policy::for_this_process(false)
    }

    #[test]
    fn printable_escapes_control_characters_and_bad_bytes() {
        assert_eq!(printable(b"plain.so"), "plain.so");
        assert_eq!(printable(b"a\nb\0c\x1b"), "a\\nb\\u{0}c\\u{1b}");
        assert_eq!(printable(b"caf\xc3\xa9 \xff"), "caf\u{e9} \\xff");
    }

    #[test]
    fn a_safe_file_in_a_safe_folder_passes() {
        let s = Scratch::new("safe");
        let f = s.0.join("ok.toml");
        std::fs::write(&f, "x = 1\n").expect("write");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        check_file_path(&f, &me()).expect("a 0644 file in a 0755 folder under /tmp is fine");
        check_dir_path(&s.0, &me()).expect("the folder itself is fine");
    }

    #[test]
    fn writable_files_and_folders_are_refused_with_the_fix() {
        let s = Scratch::new("writable");
        let f = s.0.join("x.toml");
        std::fs::write(&f, "").expect("write");
        // (file mode, folder mode, expected fix naming the path)
        for (file_mode, dir_mode, fix, bad) in [
            (0o664, 0o755, "chmod g-w", f.clone()),
            (0o646, 0o755, "chmod o-w", f.clone()),
            (0o666, 0o755, "chmod go-w", f.clone()),
            (0o644, 0o777, "chmod go-w", s.0.clone()),
            (0o644, 0o775, "chmod g-w", s.0.clone()),
        ] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(file_mode))
                .expect("chmod");
            std::fs::set_permissions(&s.0, std::fs::Permissions::from_mode(dir_mode))
                .expect("chmod");
            let e = check_file_path(&f, &me())
                .expect_err("a file others can write, or in such a folder, is refused")
                .to_string();
            let want = format!("{fix} {}", bad.display());
            assert!(
                e.contains(&want),
                "file {file_mode:o}, folder {dir_mode:o}: want {want:?} in {e:?}"
            );
        }
        // A sticky folder above it is fine while the file is trusted; the
        // sticky folder itself, as a target, is not.
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        std::fs::set_permissions(&s.0, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        check_file_path(&f, &me()).expect("a trusted file in a sticky folder");
        let e = check_dir_path(&s.0, &me()).expect_err("a sticky world-writable folder");
        assert!(e.to_string().contains("chmod go-w"), "{e}");
        std::fs::set_permissions(&s.0, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }

    #[test]
    fn a_foreign_owner_is_refused() {
        let s = Scratch::new("owner");
        let f = s.0.join("x.toml");
        std::fs::write(&f, "").expect("write");
        // As root: the file belongs to nobody. Otherwise the scratch folder
        // belongs to this user, whom a root-only policy does not trust.
        if is_root() {
            std::os::unix::fs::chown(&f, Some(65534), Some(65534)).expect("chown");
        }
        let e = check_file_path(&f, &Policy::with_trusted(&[], false))
            .expect_err("foreign owner")
            .to_string();
        assert!(
            e.contains("is owned by uid")
                && e.contains("not by root;")
                && e.contains("chown root:root"),
            "{e}"
        );
    }

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn symlinks_are_checked_at_their_target() {
        let s = Scratch::new("link");
        let open = s.0.join("open");
        let safe = s.0.join("safe");
        std::fs::create_dir(&open).expect("mkdir");
        std::fs::create_dir(&safe).expect("mkdir");
        std::fs::write(open.join("x.toml"), "").expect("write");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        std::os::unix::fs::symlink(open.join("x.toml"), safe.join("x.toml")).expect("symlink");
        let e = check_file_path(&safe.join("x.toml"), &me())
            .expect_err("target folder is world-writable")
            .to_string();
        assert!(e.contains(&format!("chmod go-w {}", open.display())), "{e}");
    }

    /// This test binary: an ELF file of this machine with no root module.
    fn exe() -> Vec<u8> {
        std::fs::read("/proc/self/exe").expect("reading the test binary")
    }

    fn elf_verdict(path: &Path) -> Result<(), TrustError> {
        check_elf(&File::open(path).expect("open"), SYMBOL)
    }

    fn elf_verdict_of(s: &Scratch, name: &str, bytes: &[u8]) -> Result<(), TrustError> {
        let p = s.0.join(name);
        std::fs::write(&p, bytes).expect("write");
        elf_verdict(&p)
    }

    #[test]
    fn the_elf_check_refuses_what_dlopen_would_choke_on() {
        let s = Scratch::new("elf");
        let exe = exe();
        // The test binary is a PIE (ET_DYN) on Debian, or an executable.
        match elf_verdict_of(&s, "exe", &exe) {
            Err(TrustError::NoRootModule { .. }) | Err(TrustError::NotShared { .. }) => {}
            other => panic!("whole test binary: {other:?}"),
        }
        let e = elf_verdict_of(&s, "text", b"this is not an ELF file\n").expect_err("text");
        assert!(
            e.to_string().starts_with(
                "not a kernmlops plugin: not an ELF file (it starts with \"this is \")"
            ),
            "{e}"
        );
        assert!(matches!(
            elf_verdict_of(&s, "empty", b""),
            Err(TrustError::NotElf { .. })
        ));
        // Cut anywhere past the magic: refused as truncated, never read out
        // of bounds. Longest first, so one copy is cut shorter each time.
        let cut_file = s.0.join("cut");
        std::fs::write(&cut_file, &exe).expect("write");
        let mut cuts = vec![
            20,
            64,
            100,
            4096,
            exe.len() / 3,
            exe.len() / 2,
            exe.len() - 1,
        ];
        cuts.sort_unstable_by(|a, b| b.cmp(a));
        for cut in cuts {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&cut_file)
                .expect("open");
            f.set_len(cut as u64).expect("truncate");
            match elf_verdict(&cut_file) {
                Err(TrustError::Truncated { end, size, .. }) => {
                    assert!(end > size && size == cut as u64, "cut {cut}: {end} {size}")
                }
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
        if HOST_MACHINE != 0 {
            let other: u16 = if HOST_MACHINE == 183 { 62 } else { 183 };
            let mut foreign = exe.clone();
            foreign[18..20].copy_from_slice(&if cfg!(target_endian = "little") {
                other.to_le_bytes()
            } else {
                other.to_be_bytes()
            });
            let e = elf_verdict_of(&s, "foreign", &foreign).expect_err("other machine");
            assert!(
                matches!(e, TrustError::Foreign { .. }) && e.to_string().contains("rebuild it"),
                "{e:?}"
            );
        }
        let mut other_class = exe.clone();
        other_class[4] = if HOST_CLASS == ELFCLASS64 {
            ELFCLASS32
        } else {
            ELFCLASS64
        };
        let e = elf_verdict_of(&s, "class", &other_class).expect_err("other class");
        assert!(e.to_string().contains("-bit"), "{e}");
    }
}
