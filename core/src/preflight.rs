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
