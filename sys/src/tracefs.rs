//! tracefs: where it is mounted, which tracepoints this kernel has, and
//! mounting it when it is missing (`tp/` programs attach through it). Also
//! the path of the kernel's BTF, which the same checks need.

use std::{
    ffi::CString,
    fs, io,
    path::{Path, PathBuf},
};

/// Where tracefs may be mounted, in the order they are tried.
pub const TRACEFS_PATHS: &[&str] = &["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The kernel's own BTF (`CONFIG_DEBUG_INFO_BTF=y`).
pub const BTF_VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// The first of [`TRACEFS_PATHS`] where tracefs is mounted (it has an
/// `events` folder).
pub fn tracefs_root() -> Option<PathBuf> {
    TRACEFS_PATHS
        .iter()
        .map(Path::new)
        .find(|p| p.join("events").is_dir())
        .map(Path::to_path_buf)
}

/// A tracefs folder name is one path component: not empty, no `/`, not
/// `.` or `..`. Anything else could point outside `events/`.
fn is_component(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && name != "." && name != ".."
}

/// The tracepoint's folder, `<tracefs>/events/<system>/<event>`.
fn tracepoint_dir(system: &str, event: &str) -> Option<PathBuf> {
    if !is_component(system) || !is_component(event) {
        return None;
    }
    let dir = tracefs_root()?.join("events").join(system).join(event);
    dir.is_dir().then_some(dir)
}

/// True when tracefs is mounted and lists `<system>:<event>`.
pub fn tracepoint_exists(system: &str, event: &str) -> bool {
    tracepoint_dir(system, event).is_some()
}

/// The tracepoint's id (its `id` file), which `perf_event_open` takes as
/// the config of a `PERF_TYPE_TRACEPOINT` event. Reading it needs root on
/// most systems.
pub fn tracepoint_id(system: &str, event: &str) -> io::Result<u64> {
    let dir = tracepoint_dir(system, event).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            match tracefs_root() {
                Some(root) => format!("no tracepoint {system}:{event} in {}", root.display()),
                None => format!("tracefs is not mounted, so no tracepoint {system}:{event}"),
            },
        )
    })?;
    let file = dir.join("id");
    let text = fs::read_to_string(&file)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
    text.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: {:?} is not a tracepoint id",
                file.display(),
                text.trim()
            ),
        )
    })
}

/// True when the kernel has both `syscalls:sys_enter_<name>` and
/// `syscalls:sys_exit_<name>` (`CONFIG_FTRACE_SYSCALLS`, and the syscall on
/// this architecture).
pub fn syscall_tracepoints_exist(name: &str) -> bool {
    tracepoint_exists("syscalls", &format!("sys_enter_{name}"))
        && tracepoint_exists("syscalls", &format!("sys_exit_{name}"))
}

/// What [`mount_tracefs`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TracefsMount {
    /// tracefs was already mounted here.
    AlreadyMounted(PathBuf),
    /// This call mounted it here.
    MountedNow(PathBuf),
}

/// Makes sure tracefs is mounted: returns where it already is, or mounts it
/// at `/sys/kernel/tracing` (needs `CAP_SYS_ADMIN`). The error says what
/// failed and the command that would mount it.
pub fn mount_tracefs() -> io::Result<TracefsMount> {
    if let Some(root) = tracefs_root() {
        return Ok(TracefsMount::AlreadyMounted(root));
    }
    let target = TRACEFS_PATHS[0];
    let how = format!("mount it with `mount -t tracefs nodev {target}`");
    let (Ok(source), Ok(c_target), Ok(fstype)) = (
        CString::new("nodev"),
        CString::new(target),
        CString::new("tracefs"),
    ) else {
        // The literals have no NUL byte; kept as an error, not a panic.
        return Err(io::Error::other(format!("tracefs is not mounted: {how}")));
    };
    // SAFETY: all pointers are valid NUL-terminated strings that outlive the
    // call; a null data pointer is allowed for tracefs.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            c_target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    let mount_error = io::Error::last_os_error();
    if rc == 0 && Path::new(target).join("events").is_dir() {
        return Ok(TracefsMount::MountedNow(PathBuf::from(target)));
    }
    let cause = if rc == 0 {
        "it has no events folder after mounting".to_owned()
    } else {
        mount_error.to_string()
    };
    Err(io::Error::new(
        if rc == 0 {
            io::ErrorKind::NotFound
        } else {
            mount_error.kind()
        },
        format!("tracefs is not mounted at {target} and mounting it failed ({cause}): {how}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_tracepoints_of_this_kernel() {
        let root = tracefs_root().expect("tracefs is mounted here");
        assert!(TRACEFS_PATHS.iter().any(|p| Path::new(p) == root));
        assert!(tracepoint_exists("sched", "sched_switch"));
        for (system, event) in [
            ("sched", "sched_no_such_event_kml"),
            ("no_such_system_kml", "sched_switch"),
            ("sched", ""),
            ("", "sched_switch"),
            ("sched", "."),
            ("sched/..", "sched/sched_switch"),
            ("..", "events"),
        ] {
            assert!(
                !tracepoint_exists(system, event),
                "{system:?}:{event:?} should not exist"
            );
        }
        assert!(syscall_tracepoints_exist("openat"));
        assert!(!syscall_tracepoints_exist("no_such_syscall_kml"));
    }

    #[test]
    fn reads_tracepoint_ids() {
        let id = tracepoint_id("sched", "sched_switch").expect("sched_switch id");
        assert!(id > 0);
        let err = tracepoint_id("sched", "sched_no_such_event_kml").expect_err("made up");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(
            err.to_string().contains("sched:sched_no_such_event_kml"),
            "{err}"
        );
    }

    #[test]
    fn an_existing_mount_is_reported_not_remounted() {
        let root = tracefs_root().expect("tracefs is mounted here");
        assert_eq!(
            mount_tracefs().ok(),
            Some(TracefsMount::AlreadyMounted(root))
        );
    }
}
