//! Checks before collecting: privileges, tracefs and BTF, each failing with
//! one line that says what to do.

use std::{ffi::CString, path::Path};

pub const TRACEFS: &str = "/sys/kernel/tracing";
pub const BTF_VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Effective capability bits of this process, from /proc/self/status.
fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// True when the process may load and attach BPF tracing programs.
pub fn has_bpf_privileges() -> bool {
    let caps = effective_caps();
    let has = |c: u32| caps & (1u64 << c) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

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

/// Makes sure tracefs is mounted at /sys/kernel/tracing, mounting it if
/// needed (`tp/` programs attach through it).
pub fn ensure_tracefs() -> Result<Tracefs, String> {
    if Path::new(TRACEFS).join("events").is_dir() {
        return Ok(Tracefs::Mounted);
    }
    let how = format!("mount it with `mount -t tracefs nodev {TRACEFS}`");
    let (Ok(src), Ok(target), Ok(fstype)) = (
        CString::new("nodev"),
        CString::new(TRACEFS),
        CString::new("tracefs"),
    ) else {
        return Err(format!("tracefs is not mounted: {how}"));
    };
    // SAFETY: all pointers are valid NUL-terminated strings that outlive the
    // call; a null data pointer is allowed for tracefs.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 && Path::new(TRACEFS).join("events").is_dir() {
        Ok(Tracefs::MountedNow)
    } else {
        Err(format!(
            "tracefs is not mounted at {TRACEFS} and mounting it failed ({}): {how}",
            std::io::Error::last_os_error()
        ))
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
