//! Checks before collecting: privileges, tracefs and BTF, each failing with
//! one line that says what to do. The probing itself is in
//! `kernmlops_sys` (`features`, `tracefs`).

use std::path::Path;

pub use kernmlops_sys::features::has_bpf_privileges;
pub use kernmlops_sys::tracefs::BTF_VMLINUX;
use kernmlops_sys::tracefs::{mount_tracefs, TracefsMount};

/// Fails unless the process may load BPF programs.
pub fn require_bpf_privileges(command: &str) -> Result<(), String> {
    if has_bpf_privileges() {
        Ok(())
    } else {
        Err(format!(
            "kernmlops {command} needs root, or the CAP_BPF and CAP_PERFMON capabilities: re-run with sudo"
        ))
    }
}

/// State of tracefs after [`ensure_tracefs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tracefs {
    Mounted,
    MountedNow,
}

/// Makes sure tracefs is mounted (`tp/` programs attach through it),
/// mounting it at /sys/kernel/tracing if it is nowhere.
pub fn ensure_tracefs() -> Result<Tracefs, String> {
    match mount_tracefs() {
        Ok(TracefsMount::AlreadyMounted(_)) => Ok(Tracefs::Mounted),
        Ok(TracefsMount::MountedNow(_)) => Ok(Tracefs::MountedNow),
        Err(e) => Err(e.to_string()),
    }
}

/// True when the kernel exposes its BTF, which CO-RE probes need.
pub fn has_btf() -> bool {
    Path::new(BTF_VMLINUX).is_file()
}

/// Fails unless the kernel has BTF.
pub fn require_btf() -> Result<(), String> {
    if has_btf() {
        Ok(())
    } else {
        Err(format!(
            "this kernel has no BTF ({BTF_VMLINUX} is missing): kernmlops probes need a kernel built with CONFIG_DEBUG_INFO_BTF=y"
        ))
    }
}

/// Why a `--tgid` (process) or `--pid` (thread) filter would record
/// nothing.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("{flag} 0: not a {what} id; give the id of a running {what}")]
    Zero { flag: String, what: &'static str },
    #[error("{flag} {id}: no {what} {id} is running")]
    NotRunning {
        flag: String,
        id: u32,
        what: &'static str,
    },
    #[error("{flag} {id}: {id} is a thread of process {tgid}; use --tgid {tgid}, or --pid {id} for this thread alone")]
    ThreadOfProcess { flag: String, id: u32, tgid: u32 },
}

/// Refuses a process (`thread` false: a thread group id) or thread id that
/// is not running, and a process id that is another process's thread: a
/// filter on it would record nothing, silently. `flag` names it.
pub fn check_task(flag: &str, id: u32, thread: bool) -> Result<(), TaskError> {
    let what = if thread { "thread" } else { "process" };
    let flag = flag.to_owned();
    if id == 0 {
        return Err(TaskError::Zero { flag, what });
    }
    let status = std::fs::read_to_string(format!("/proc/{id}/status")).map_err(|_| {
        TaskError::NotRunning {
            flag: flag.clone(),
            id,
            what,
        }
    })?;
    if !thread {
        let tgid = status
            .lines()
            .find_map(|l| l.strip_prefix("Tgid:"))
            .and_then(|v| v.trim().parse::<u32>().ok());
        if let Some(tgid) = tgid.filter(|&t| t != id) {
            return Err(TaskError::ThreadOfProcess { flag, id, tgid });
        }
    }
    Ok(())
}
