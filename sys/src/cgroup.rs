//! cgroup v2: where the hierarchy is mounted, the id BPF sees for a cgroup
//! folder (`bpf_get_current_cgroup_id()`: the folder's inode number), and
//! which cgroup a process is in.

use std::{
    ffi::CString,
    fs, io,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

/// `statfs` type of a cgroup v2 file system (`CGROUP2_SUPER_MAGIC`).
pub const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` on a hybrid system), from
/// `/proc/self/mountinfo`; `None` when it is not mounted.
pub fn cgroup2_mount() -> Option<PathBuf> {
    cgroup2_mount_in(&fs::read_to_string("/proc/self/mountinfo").ok()?)
}

/// The cgroup v2 mount point in a `/proc/<pid>/mountinfo` text. A mount of
/// the hierarchy's root wins over a bind mount of a folder inside it.
pub fn cgroup2_mount_in(mountinfo: &str) -> Option<PathBuf> {
    // Line: id parent major:minor root mount_point options [optional...] - fstype source super_options
    let mounts: Vec<(String, PathBuf)> = mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            if right.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            let mut fields = left.split_whitespace().skip(3);
            let root = unescape(fields.next()?);
            let mount_point = unescape(fields.next()?);
            Some((root, PathBuf::from(mount_point)))
        })
        .collect();
    mounts
        .iter()
        .find(|(root, _)| root == "/")
        .or_else(|| mounts.first())
        .map(|(_, mount_point)| mount_point.clone())
}

/// Undoes mountinfo's octal escapes (`\040` is a space, `\134` a backslash).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| {
            bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)) && d[0] <= b'3'
        });
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The id BPF sees for a cgroup v2 folder (`bpf_get_current_cgroup_id()`,
/// `kml_wanted`'s filter): the folder's inode number. Refuses a path that
/// is not a folder on a cgroup2 file system, with a message naming where
/// cgroup v2 is mounted.
pub fn cgroup_id(path: &Path) -> io::Result<u64> {
    let shown = path.display();
    let meta = fs::metadata(path).map_err(|e| io::Error::new(e.kind(), format!("{shown}: {e}")))?;
    let c_path = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{shown}: the path contains a NUL byte"),
        )
    })?;
    // SAFETY: statfs is plain old data; all zeroes is a valid value.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a writable statfs, both alive
    // for the call.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), &mut stat) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{shown}: statfs: {e}")));
    }
    #[allow(clippy::unnecessary_cast)] // f_type's width differs by architecture
    let on_cgroup2 = stat.f_type as i64 == CGROUP2_SUPER_MAGIC;
    if !meta.is_dir() || !on_cgroup2 {
        let mounted = match cgroup2_mount() {
            Some(m) => format!("cgroup v2 is mounted at {}", m.display()),
            None => "this machine has no cgroup v2 mount".to_owned(),
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{shown}: not a cgroup v2 folder; {mounted}"),
        ));
    }
    Ok(meta.ino())
}

/// The cgroup v2 path of a process, as its `/proc/<pid>/cgroup` `0::` line
/// gives it (`/user.slice/session-1.scope`): relative to the hierarchy's
/// root as this process's cgroup namespace sees it.
pub fn cgroup_path_of_pid(pid: u32) -> io::Result<String> {
    let file = format!("/proc/{pid}/cgroup");
    let text =
        fs::read_to_string(&file).map_err(|e| io::Error::new(e.kind(), format!("{file}: {e}")))?;
    cgroup2_path_in(&text).map(str::to_owned).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{file}: no cgroup v2 entry (no `0::` line)"),
        )
    })
}

/// The cgroup v2 path in a `/proc/<pid>/cgroup` text (its `0::` line).
pub fn cgroup2_path_in(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"))
}

/// The folder of a process's cgroup under the cgroup v2 mount.
pub fn cgroup_dir_of_pid(pid: u32) -> io::Result<PathBuf> {
    let path = cgroup_path_of_pid(pid)?;
    let mount = cgroup2_mount().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "this machine has no cgroup v2 mount",
        )
    })?;
    Ok(mount.join(path.trim_start_matches('/')))
}

/// The cgroup v2 folder whose id (inode number) is `id`, found by walking
/// the hierarchy under the cgroup2 mount: the way back from an id a BPF
/// program recorded, or one a user passed, to a folder. Errors when cgroup
/// v2 is not mounted or no folder has that id (the cgroup is gone).
pub fn cgroup_dir_by_id(id: u64) -> io::Result<PathBuf> {
    let mount = cgroup2_mount().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "this machine has no cgroup v2 mount",
        )
    })?;
    let mut pending = vec![mount.clone()];
    while let Some(dir) = pending.pop() {
        if fs::metadata(&dir).is_ok_and(|m| m.ino() == id) {
            return Ok(dir);
        }
        // A cgroup removed during the walk is simply not searched.
        if let Ok(entries) = fs::read_dir(&dir) {
            pending.extend(
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("no cgroup with id {id} under {}", mount.display()),
    ))
}

/// Cgroup v2 ids (inode numbers of cgroup folders, what BPF sees) to paths
/// relative to the mount ("/system.slice/x"), from walks of the hierarchy:
/// one at creation, then one more only when unknown ids show up. Ids a walk
/// did not find (cgroups already removed) are not searched again.
#[derive(Debug, Default)]
pub struct CgroupPaths {
    mount: Option<PathBuf>,
    paths: std::collections::HashMap<u64, String>,
    missing: std::collections::HashSet<u64>,
}

impl CgroupPaths {
    /// Maps the cgroup2 mount of this system (none: every path is empty).
    pub fn new() -> Self {
        Self::at(cgroup2_mount())
    }

    /// Maps the hierarchy mounted at `mount`.
    pub fn at(mount: Option<PathBuf>) -> Self {
        let mut c = Self {
            mount,
            ..Self::default()
        };
        c.walk();
        c
    }

    fn walk(&mut self) {
        let Some(mount) = self.mount.clone() else {
            return;
        };
        let mut stack = vec![mount.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(meta) = fs::metadata(&dir) else {
                continue;
            };
            let rel = dir.strip_prefix(&mount).unwrap_or(Path::new(""));
            self.paths
                .insert(meta.ino(), format!("/{}", rel.to_string_lossy()));
            for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
        }
    }

    /// Resolves the ids not seen before with one walk for all of them.
    pub fn learn(&mut self, ids: impl IntoIterator<Item = u64>) {
        let unknown: Vec<u64> = ids
            .into_iter()
            .filter(|id| *id != 0 && !self.paths.contains_key(id) && !self.missing.contains(id))
            .collect();
        if unknown.is_empty() {
            return;
        }
        self.walk();
        for id in unknown {
            if !self.paths.contains_key(&id) {
                self.missing.insert(id);
            }
        }
    }

    /// Where the mapped hierarchy is mounted; `None` when it is not.
    pub fn mount(&self) -> Option<&Path> {
        self.mount.as_deref()
    }

    /// The path of cgroup `id`, "" when unknown.
    pub fn path(&self, id: u64) -> &str {
        self.paths.get(&id).map_or("", String::as_str)
    }

    /// The id of the cgroup at `path` (relative to the mount), 0 if unknown.
    pub fn id_of(&self, path: &str) -> u64 {
        let Some(mount) = &self.mount else {
            return 0;
        };
        fs::metadata(mount.join(path.trim_start_matches('/'))).map_or(0, |m| m.ino())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_paths_follow_the_tree_and_learn_new_folders() {
        let root = std::env::temp_dir().join(format!("kml-cgpaths-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("a/b")).expect("tree");
        let ino = |rel: &str| fs::metadata(root.join(rel)).expect("meta").ino();
        let mut c = CgroupPaths::at(Some(root.clone()));
        assert_eq!(c.path(ino("a/b")), "/a/b");
        assert_eq!(c.path(ino("")), "/");
        assert_eq!(c.id_of("/a/b"), ino("a/b"));
        assert_eq!(c.id_of("/gone"), 0);
        // A folder made later is found by the walk its id triggers.
        fs::create_dir(root.join("a/c")).expect("later");
        assert_eq!(c.path(ino("a/c")), "");
        c.learn([ino("a/c"), 0, u64::MAX]);
        assert_eq!(c.path(ino("a/c")), "/a/c");
        assert_eq!(c.path(u64::MAX), "");
        assert!(c.missing.contains(&u64::MAX) && !c.missing.contains(&0));
        fs::remove_dir_all(&root).expect("clean up");
        assert_eq!(CgroupPaths::at(None).path(1), "");
    }

    #[test]
    fn finds_the_mount_in_mountinfo_text() {
        let text = "\
22 1 0:21 / /proc rw,nosuid - proc proc rw
25 22 0:23 / /sys rw,nosuid - sysfs sysfs rw
30 25 0:26 /inner /srv/bind\\040mount rw shared:9 - cgroup2 cgroup2 rw
31 25 0:26 / /sys/fs/cgroup\\040x rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate
";
        assert_eq!(
            cgroup2_mount_in(text),
            Some(PathBuf::from("/sys/fs/cgroup x")),
            "the root mount, with \\040 read as a space"
        );
        let bind_only = text.lines().take(3).collect::<Vec<_>>().join("\n");
        assert_eq!(
            cgroup2_mount_in(&bind_only),
            Some(PathBuf::from("/srv/bind mount"))
        );
        assert_eq!(
            cgroup2_mount_in("22 1 0:21 / /proc rw - proc proc rw\n"),
            None
        );
        assert_eq!(unescape(r"a\134b\011c\9x\0"), "a\\b\tc\\9x\\0");
    }

    #[test]
    fn the_cgroup2_mount_id_is_its_inode() {
        let mount = cgroup2_mount().expect("this machine mounts cgroup v2 (/proc/self/mountinfo)");
        let ino = fs::metadata(&mount).expect("stat the cgroup2 mount").ino();
        assert_eq!(cgroup_id(&mount).expect("cgroup_id of the mount"), ino);
        assert_eq!(cgroup_dir_by_id(ino).expect("the root by its id"), mount);
        let err = cgroup_dir_by_id(u64::MAX).expect_err("no such id");
        assert!(err.to_string().contains("no cgroup with id"), "{err}");
    }

    #[test]
    fn refuses_folders_that_are_not_cgroup2() {
        let mount = cgroup2_mount().expect("this machine mounts cgroup v2");
        let err = cgroup_id(Path::new("/tmp")).expect_err("/tmp is not a cgroup");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let message = err.to_string();
        assert!(
            message.contains("/tmp: not a cgroup v2 folder")
                && message.contains(&mount.display().to_string()),
            "{message}"
        );
        let file = mount.join("cgroup.procs");
        let err = cgroup_id(&file).expect_err("a cgroup file is not a folder");
        assert!(err.to_string().contains("not a cgroup v2 folder"), "{err}");
        let err = cgroup_id(Path::new("/no/such/cgroup")).expect_err("missing");
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
        assert!(err.to_string().starts_with("/no/such/cgroup: "), "{err}");
    }

    #[test]
    fn finds_this_process_cgroup() {
        assert_eq!(
            cgroup2_path_in("4:memory:/x\n0::/system.slice/foo.service\n"),
            Some("/system.slice/foo.service")
        );
        assert_eq!(cgroup2_path_in("4:memory:/x\n"), None);
        let path = cgroup_path_of_pid(std::process::id()).expect("own cgroup");
        assert!(path.starts_with('/'), "{path}");
        let dir = cgroup_dir_of_pid(std::process::id()).expect("own cgroup folder");
        let procs = fs::read_to_string(dir.join("cgroup.procs")).expect("cgroup.procs");
        assert!(
            procs
                .lines()
                .any(|l| l.trim() == std::process::id().to_string()),
            "{} does not list this process",
            dir.display()
        );
        let id = cgroup_id(&dir).expect("own cgroup id");
        assert_eq!(cgroup_dir_by_id(id).expect("found by id"), dir);
        assert!(cgroup_path_of_pid(u32::MAX).is_err());
    }
}
