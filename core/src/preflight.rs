//! Checks before collecting: privileges, tracefs and BTF, each failing with
//! one line that says what to do. The probing itself is in
//! `kernmlops_sys` (`features`, `tracefs`).

use std::path::Path;

pub use kernmlops_sys::features::has_bpf_privileges;
pub use kernmlops_sys::tracefs::BTF_VMLINUX;
use kernmlops_sys::tracefs::{mount_tracefs, TracefsMount};

/// Why a collection cannot start on this machine, as the user reads it.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    #[error("kernmlops {command} needs root, or the CAP_BPF and CAP_PERFMON capabilities: re-run with sudo")]
    Privileges { command: String },
    #[error("this kernel has no BTF ({BTF_VMLINUX} is missing): kernmlops probes need a kernel built with CONFIG_DEBUG_INFO_BTF=y")]
    NoBtf,
    /// tracefs is mounted nowhere and mounting it failed.
    #[error("{0}")]
    Tracefs(#[from] std::io::Error),
}

/// Fails unless the process may load BPF programs.
pub fn require_bpf_privileges(command: &str) -> Result<(), PreflightError> {
    if has_bpf_privileges() {
        Ok(())
    } else {
        Err(PreflightError::Privileges {
            command: command.to_owned(),
        })
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
pub fn ensure_tracefs() -> Result<Tracefs, PreflightError> {
    match mount_tracefs()? {
        TracefsMount::AlreadyMounted(_) => Ok(Tracefs::Mounted),
        TracefsMount::MountedNow(_) => Ok(Tracefs::MountedNow),
    }
}

/// True when the kernel exposes its BTF, which CO-RE probes need.
pub fn has_btf() -> bool {
    Path::new(BTF_VMLINUX).is_file()
}

/// Fails unless the kernel has BTF.
pub fn require_btf() -> Result<(), PreflightError> {
    if has_btf() {
        Ok(())
    } else {
        Err(PreflightError::NoBtf)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_is_one_line_saying_what_to_do() {
        let e = PreflightError::Privileges {
            command: "run".into(),
        };
        assert_eq!(
            e.to_string(),
            "kernmlops run needs root, or the CAP_BPF and CAP_PERFMON capabilities: re-run with sudo"
        );
        assert_eq!(
            PreflightError::NoBtf.to_string(),
            "this kernel has no BTF (/sys/kernel/btf/vmlinux is missing): kernmlops probes need a kernel built with CONFIG_DEBUG_INFO_BTF=y"
        );
        let e = PreflightError::from(std::io::Error::other("mounting tracefs: refused"));
        assert_eq!(e.to_string(), "mounting tracefs: refused");
        // On this machine (root, BTF) the checks pass.
        assert_eq!(require_bpf_privileges("run").is_ok(), has_bpf_privileges());
        assert_eq!(require_btf().is_ok(), has_btf());
    }
}
