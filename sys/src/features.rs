//! Which tracing features this kernel has, found by asking the kernel
//! rather than reading version numbers: BTF, kprobe and uprobe PMUs, fentry
//! (a do-nothing trampoline program is loaded, attached and closed through
//! the raw `bpf` syscall), a hardware PMU (a counter is opened and closed),
//! and whether a given kernel function or tracepoint can be attached to.
//!
//! Each check returns "available or not, and why not" instead of assuming:
//! some machines (VMs, locked-down kernels) refuse kprobes, fentry or
//! hardware counters while tracepoints work.

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::Path,
};

use crate::{
    btf::{Btf, Kind},
    tracefs::{self, BTF_VMLINUX},
};

/// Why a probe cannot attach where it asks to, or a feature it needs is
/// refused: the step that failed and what the kernel said.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeatureError {
    #[error("this kernel has no kprobes ({detail})")]
    NoKprobes { detail: String },
    #[error("{function} is not a kernel symbol (/proc/kallsyms)")]
    NotASymbol { function: String },
    #[error("/proc/kallsyms is not readable")]
    KallsymsUnreadable,
    #[error("{function} is on the kernel's kprobe blacklist")]
    KprobeBlacklisted { function: String },
    #[error("fentry needs kernel BTF: {why}")]
    NoBtf { why: String },
    #[error("{function} is not a function in the kernel's BTF (inlined, static without BTF, or missing)")]
    NotInBtf { function: String },
    #[error("fentry on {function}: loading a program: {why}")]
    FentryLoad { function: String, why: String },
    #[error("fentry on {function}: attaching the loaded program: {why}")]
    FentryAttach { function: String, why: String },
    /// The tracepoint's id could not be read (missing, tracefs, permission).
    #[error("{why}")]
    TracepointId { why: String },
    #[error("tracepoint {system}:{event}: loading a program: {why}")]
    TracepointLoad {
        system: String,
        event: String,
        why: String,
    },
    #[error("tracepoint {system}:{event}: opening its perf event: {why}")]
    TracepointOpen {
        system: String,
        event: String,
        why: String,
    },
    #[error("tracepoint {system}:{event}: attaching a program: {why}")]
    TracepointAttach {
        system: String,
        event: String,
        why: String,
    },
    #[error("loading a raw_tp program: {why}")]
    RawTpLoad { why: String },
    #[error("running a raw_tp program on CPU {cpu} (BPF_F_TEST_RUN_ON_CPU, Linux 5.10): {why}")]
    RunOnCpu { cpu: u32, why: String },
}

/// One feature: available or not, and why (empty when there is nothing to
/// add).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Feature {
    pub available: bool,
    pub detail: String,
}

impl Feature {
    /// Available, with an optional detail ("loaded on vfs_read").
    pub fn yes(detail: impl Into<String>) -> Self {
        Self {
            available: true,
            detail: detail.into(),
        }
    }

    /// Unavailable, and why.
    pub fn no(detail: impl Into<String>) -> Self {
        Self {
            available: false,
            detail: detail.into(),
        }
    }
}

/// The kernel features probes may use, as recorded in `system_info` and
/// the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelFeatures {
    pub btf: Feature,
    pub kprobes: Feature,
    pub uprobes: Feature,
    pub fentry: Feature,
    pub hardware_pmu: Feature,
}

impl KernelFeatures {
    /// Asks the kernel about every feature (a few milliseconds; the fentry
    /// and hardware checks need root or CAP_BPF/CAP_PERFMON to succeed).
    pub fn detect() -> Self {
        Self {
            btf: btf(),
            kprobes: kprobes(),
            uprobes: uprobes(),
            fentry: fentry(),
            hardware_pmu: hardware_pmu(),
        }
    }

    /// Every feature with its name, in a fixed order.
    pub fn named(&self) -> [(&'static str, &Feature); 5] {
        [
            ("btf", &self.btf),
            ("kprobes", &self.kprobes),
            ("uprobes", &self.uprobes),
            ("fentry", &self.fentry),
            ("hardware_pmu", &self.hardware_pmu),
        ]
    }

    /// `btf,uprobes` style list of what is available.
    pub fn available_list(&self) -> String {
        self.named()
            .iter()
            .filter(|(_, f)| f.available)
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The kernel exposes its BTF, which CO-RE programs need.
pub fn btf() -> Feature {
    if Path::new(BTF_VMLINUX).is_file() {
        Feature::yes("")
    } else {
        Feature::no(format!("{BTF_VMLINUX} is missing"))
    }
}

/// kprobe events: the kernel registers a `kprobe` PMU when it has them.
pub fn kprobes() -> Feature {
    pmu_registered("kprobe")
}

/// uprobe events: the kernel registers a `uprobe` PMU when it has them.
pub fn uprobes() -> Feature {
    pmu_registered("uprobe")
}

/// Whether a kprobe can be placed on `kernel_function` here: the kernel
/// has kprobes (a `kprobe` PMU), and the function is neither missing from
/// `/proc/kallsyms` nor on the kprobe blacklist (read where debugfs shows
/// it). Reads files only; attaches nothing. The error says which.
pub fn kprobe_attachable(kernel_function: &str) -> Result<(), FeatureError> {
    let pmu = kprobes();
    if !pmu.available {
        return Err(FeatureError::NoKprobes { detail: pmu.detail });
    }
    let listed = |path: &str, column: usize| -> Option<bool> {
        let text = std::fs::read_to_string(path).ok()?;
        Some(text.lines().any(|l| {
            l.split_whitespace()
                .nth(column)
                .is_some_and(|f| f == kernel_function)
        }))
    };
    match listed("/proc/kallsyms", 2) {
        Some(false) => {
            return Err(FeatureError::NotASymbol {
                function: kernel_function.to_owned(),
            })
        }
        None => return Err(FeatureError::KallsymsUnreadable),
        Some(true) => {}
    }
    // Lines are "0xstart-0xend\tsymbol".
    if listed("/sys/kernel/debug/kprobes/blacklist", 1) == Some(true) {
        return Err(FeatureError::KprobeBlacklisted {
            function: kernel_function.to_owned(),
        });
    }
    Ok(())
}

fn pmu_registered(name: &str) -> Feature {
    if Path::new("/sys/bus/event_source/devices")
        .join(name)
        .is_dir()
    {
        Feature::yes("")
    } else {
        Feature::no(format!("no {name} PMU in /sys/bus/event_source/devices"))
    }
}

fn errno_text(e: &io::Error) -> String {
    io::Error::from_raw_os_error(e.raw_os_error().unwrap_or(0)).to_string()
}

/// Kernel functions tried, in order, for the general fentry check:
/// `bpf_fentry_test1` exists for exactly this purpose where BPF selftests
/// are built in.
const FENTRY_CANDIDATES: &[&str] = &["bpf_fentry_test1", "vfs_read", "do_nanosleep"];

/// fentry/fexit: a do-nothing fentry program loads and attaches on a
/// kernel function.
pub fn fentry() -> Feature {
    let btf = match Btf::vmlinux() {
        Ok(btf) => btf,
        Err(e) => return Feature::no(format!("needs BTF: {e}")),
    };
    let Some((func, btf_id)) = FENTRY_CANDIDATES
        .iter()
        .find_map(|f| btf.type_id_of_kind(f, Kind::Func).map(|id| (*f, id)))
    else {
        return Feature::no("no known kernel function in BTF to attach to");
    };
    match fentry_attach_check(btf_id) {
        Ok(()) => Feature::yes(format!("loaded and attached on {func}")),
        Err(FentryFailure::Load(f)) => Feature::no(format!("loading on {func}: {f}")),
        Err(FentryFailure::Attach(e)) => {
            Feature::no(format!("attaching on {func}: {}", errno_text(&e)))
        }
    }
}

/// Whether a fentry program can attach to `kernel_function` here: finds its
/// BTF id, loads a do-nothing `fentry` program for it and attaches it for
/// an instant. The error says which step failed and what the kernel said.
pub fn fentry_attachable(kernel_function: &str) -> Result<(), FeatureError> {
    let btf = Btf::vmlinux().map_err(|e| FeatureError::NoBtf { why: e.to_string() })?;
    fentry_attachable_id(
        kernel_function,
        btf.type_id_of_kind(kernel_function, Kind::Func),
    )
}

/// [`fentry_attachable`] for a caller that has looked up the function's
/// BTF id (`FUNC`) itself (`None`: not in BTF), from a BTF it already has.
pub fn fentry_attachable_id(
    kernel_function: &str,
    btf_id: Option<u32>,
) -> Result<(), FeatureError> {
    let function = || kernel_function.to_owned();
    let btf_id = btf_id.ok_or_else(|| FeatureError::NotInBtf {
        function: function(),
    })?;
    fentry_attach_check(btf_id).map_err(|e| match e {
        FentryFailure::Load(f) => FeatureError::FentryLoad {
            function: function(),
            why: f.to_string(),
        },
        FentryFailure::Attach(e) => FeatureError::FentryAttach {
            function: function(),
            why: errno_text(&e),
        },
    })
}

/// Whether a `tp/<system>/<event>` program can attach here: the tracepoint
/// exists in tracefs, a do-nothing tracepoint program loads, and it
/// attaches to a (disabled) perf event of that tracepoint.
pub fn tracepoint_attachable(system: &str, event: &str) -> Result<(), FeatureError> {
    let (system, event) = (system.to_owned(), event.to_owned());
    let id = tracefs::tracepoint_id(&system, &event)
        .map_err(|e| FeatureError::TracepointId { why: e.to_string() })?;
    let prog =
        load_program(PROG_TYPE_TRACEPOINT, 0, 0).map_err(|f| FeatureError::TracepointLoad {
            system: system.clone(),
            event: event.clone(),
            why: f.to_string(),
        })?;
    let attr = perf_attr(PERF_TYPE_TRACEPOINT, id);
    let event_fd = perf_open_cpu0(&attr).map_err(|e| FeatureError::TracepointOpen {
        system: system.clone(),
        event: event.clone(),
        why: errno_text(&e),
    })?;
    // SAFETY: both descriptors are open and owned here; the ioctl takes the
    // program descriptor by value.
    let rc = unsafe {
        libc::ioctl(
            event_fd.as_raw_fd(),
            PERF_EVENT_IOC_SET_BPF as _,
            prog.as_raw_fd(),
        )
    };
    if rc != 0 {
        return Err(FeatureError::TracepointAttach {
            system,
            event,
            why: errno_text(&io::Error::last_os_error()),
        });
    }
    Ok(())
}

/// Opens the hardware instructions counter on CPU 0 for all tasks.
pub fn hardware_pmu() -> Feature {
    let mut attr = perf_attr(PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS);
    put_u64(&mut attr, 40, ATTR_FLAG_DISABLED);
    match perf_open_cpu0(&attr) {
        Ok(_counter) => Feature::yes(""),
        Err(e) => Feature::no(format!("hardware counter instructions: {}", errno_text(&e))),
    }
}

// perf_event_attr: type @0, size @4, config @8, flags @40 (bit 0: disabled).
// 112 bytes is PERF_ATTR_SIZE_VER5, which every kernel since 4.1 accepts.
const PERF_ATTR_SIZE: usize = 112;
const PERF_TYPE_HARDWARE: u32 = 0;
const PERF_TYPE_TRACEPOINT: u32 = 2;
const PERF_COUNT_HW_INSTRUCTIONS: u64 = 1;
const ATTR_FLAG_DISABLED: u64 = 1;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// `_IOW('$', 8, __u32)`: the ioctl direction bits differ by architecture.
const PERF_EVENT_IOC_SET_BPF: u64 = IOC_WRITE | (4 << 16) | ((b'$' as u64) << 8) | 8;
/// `_IOC_WRITE` in its place: 4 << 29 where the direction takes three
/// bits, 1 << 30 elsewhere.
const IOC_WRITE: u64 = if cfg!(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
)) {
    4 << 29
} else {
    1 << 30
};

// bpf(2) commands and union bpf_attr offsets (include/uapi/linux/bpf.h).
const BPF_PROG_LOAD: i32 = 5;
const BPF_RAW_TRACEPOINT_OPEN: i32 = 17;
const PROG_TYPE_TRACEPOINT: u32 = 5;
const PROG_TYPE_TRACING: u32 = 26;
const BPF_TRACE_FENTRY: u32 = 24;
/// Large enough for every field used here; the kernel requires the bytes
/// it does not know to be zero, and they are.
const BPF_ATTR_SIZE: usize = 128;
const VERIFIER_LOG_SIZE: usize = 16 * 1024;

fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put_u64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// Takes ownership of a descriptor a syscall returned, or its error.
fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("descriptor out of range"))?;
    // SAFETY: the kernel just returned this descriptor to us; nothing else
    // owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A `perf_event_attr` of an event's type and config, the rest zero.
fn perf_attr(type_: u32, config: u64) -> [u8; PERF_ATTR_SIZE] {
    let mut attr = [0u8; PERF_ATTR_SIZE];
    put_u32(&mut attr, 0, type_);
    put_u32(&mut attr, 4, PERF_ATTR_SIZE as u32);
    put_u64(&mut attr, 8, config);
    attr
}

/// `perf_event_open` of `attr` on CPU 0 for all tasks, close-on-exec.
fn perf_open_cpu0(attr: &[u8; PERF_ATTR_SIZE]) -> io::Result<OwnedFd> {
    // SAFETY: perf_event_open reads `attr`, valid for its declared size.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            -1i32,
            0i32,
            -1i32,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    owned(fd)
}

fn bpf(cmd: i32, attr: &[u8; BPF_ATTR_SIZE]) -> io::Result<OwnedFd> {
    // SAFETY: bpf(2) reads `attr` (valid for the size given) and the
    // buffers it points to, which the caller keeps alive for the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_ptr(), BPF_ATTR_SIZE as u32) };
    owned(fd)
}

/// Capability bits (include/uapi/linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Effective capability bits of this process, from /proc/self/status
/// (none when it cannot be read).
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

/// True when this process may load and attach BPF tracing programs: root
/// (`CAP_SYS_ADMIN`), or `CAP_BPF` and `CAP_PERFMON`.
pub fn has_bpf_privileges() -> bool {
    let caps = effective_caps();
    let has = |c: u32| caps & (1u64 << c) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

/// A program the kernel would not load: its errno and the verifier log's
/// last line.
struct LoadFailure {
    error: io::Error,
    verifier: String,
}

impl std::fmt::Display for LoadFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", errno_text(&self.error))?;
        if self.error.raw_os_error() == Some(libc::EPERM) {
            if has_bpf_privileges() {
                write!(
                    f,
                    " (refused despite BPF privileges: this kernel does not support or allow it)"
                )?;
            } else {
                write!(f, " (needs root, or CAP_BPF and CAP_PERFMON)")?;
            }
        }
        if !self.verifier.is_empty() {
            write!(f, "; verifier: {}", self.verifier)?;
        }
        Ok(())
    }
}

/// Loads `r0 = 0; exit` as a program of `prog_type`. On failure it loads
/// again with the verifier log on, to report the log's last line (what the
/// kernel objected to).
fn load_program(
    prog_type: u32,
    attach_type: u32,
    attach_btf_id: u32,
) -> Result<OwnedFd, LoadFailure> {
    // r0 = 0 (BPF_ALU64 | BPF_MOV | BPF_K); exit (BPF_JMP | BPF_EXIT)
    let insns: [u64; 2] = [
        u64::from_le_bytes([0xb7, 0, 0, 0, 0, 0, 0, 0]),
        u64::from_le_bytes([0x95, 0, 0, 0, 0, 0, 0, 0]),
    ];
    let license = c"GPL";
    let mut log = vec![0u8; VERIFIER_LOG_SIZE];
    let mut attr = [0u8; BPF_ATTR_SIZE];
    put_u32(&mut attr, 0, prog_type);
    put_u32(&mut attr, 4, insns.len() as u32);
    put_u64(&mut attr, 8, insns.as_ptr() as u64);
    put_u64(&mut attr, 16, license.as_ptr() as u64);
    attr[48..48 + 11].copy_from_slice(b"kml_feature"); // prog_name
    put_u32(&mut attr, 68, attach_type);
    put_u32(&mut attr, 108, attach_btf_id);
    let error = match bpf(BPF_PROG_LOAD, &attr) {
        Ok(fd) => return Ok(fd),
        Err(e) => e,
    };
    put_u32(&mut attr, 24, 1); // log_level
    put_u32(&mut attr, 28, log.len() as u32);
    put_u64(&mut attr, 32, log.as_mut_ptr() as u64);
    // Only the log is wanted from this second try.
    drop(bpf(BPF_PROG_LOAD, &attr));
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    let text = String::from_utf8_lossy(&log[..end]);
    let verifier = text
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_owned();
    Err(LoadFailure { error, verifier })
}

/// Why a fentry program did not attach.
enum FentryFailure {
    Load(LoadFailure),
    Attach(io::Error),
}

/// Loads a do-nothing fentry program for BTF function `btf_id` and attaches
/// it (BPF_RAW_TRACEPOINT_OPEN with no name: the program's own target);
/// both are closed on return.
fn fentry_attach_check(btf_id: u32) -> Result<(), FentryFailure> {
    let prog =
        load_program(PROG_TYPE_TRACING, BPF_TRACE_FENTRY, btf_id).map_err(FentryFailure::Load)?;
    let mut attr = [0u8; BPF_ATTR_SIZE];
    // raw_tracepoint { u64 name; u32 prog_fd; }
    put_u32(&mut attr, 8, prog.as_raw_fd() as u32);
    match bpf(BPF_RAW_TRACEPOINT_OPEN, &attr) {
        Ok(_link) => Ok(()),
        Err(e) => Err(FentryFailure::Attach(e)),
    }
}

/// `BPF_ENABLE_STATS` (include/uapi/linux/bpf.h).
const BPF_ENABLE_STATS: i32 = 32;
/// `BPF_STATS_RUN_TIME`: count each program's runs and their time.
const BPF_STATS_RUN_TIME: u32 = 0;

/// Turns on the kernel's BPF run-time statistics (`run_cnt`,
/// `run_time_ns` of every program) for as long as the returned descriptor
/// is open; closing it turns them back off unless someone else (the
/// `kernel.bpf_stats_enabled` sysctl, another holder) keeps them on. Needs
/// CAP_SYS_ADMIN.
pub fn enable_bpf_stats() -> io::Result<OwnedFd> {
    let mut attr = [0u8; BPF_ATTR_SIZE];
    put_u32(&mut attr, 0, BPF_STATS_RUN_TIME);
    bpf(BPF_ENABLE_STATS, &attr)
}

/// `BPF_PROG_TEST_RUN`, `BPF_PROG_TYPE_RAW_TRACEPOINT` and
/// `BPF_F_TEST_RUN_ON_CPU` (include/uapi/linux/bpf.h).
const BPF_PROG_TEST_RUN: i32 = 10;
const PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
const BPF_F_TEST_RUN_ON_CPU: u32 = 1;

/// Whether a raw tracepoint program can be run on a chosen CPU
/// (`BPF_PROG_TEST_RUN` with `BPF_F_TEST_RUN_ON_CPU`, Linux 5.10), which is
/// how the host sends a CPU's staged records: loads a do-nothing raw_tp
/// program and runs it so on the calling CPU. The error says which step
/// failed and what the kernel said.
pub fn test_run_on_cpu() -> Result<(), FeatureError> {
    let prog = load_program(PROG_TYPE_RAW_TRACEPOINT, 0, 0)
        .map_err(|f| FeatureError::RawTpLoad { why: f.to_string() })?;
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = u32::try_from(unsafe { libc::sched_getcpu() }).unwrap_or(0);
    let mut attr = [0u8; BPF_ATTR_SIZE];
    // test { u32 prog_fd; ... u32 flags at 64; u32 cpu at 68; }
    put_u32(&mut attr, 0, prog.as_raw_fd() as u32);
    put_u32(&mut attr, 64, BPF_F_TEST_RUN_ON_CPU);
    put_u32(&mut attr, 68, cpu);
    // SAFETY: bpf(2) reads `attr`, valid for the size given; the test run
    // returns 0 or -1, not a descriptor.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            attr.as_ptr(),
            BPF_ATTR_SIZE as u32,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(FeatureError::RunOnCpu {
            cpu,
            why: errno_text(&io::Error::last_os_error()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn detects_every_feature_with_a_reason_when_missing() {
        let f = KernelFeatures::detect();
        assert!(f.btf.available, "this kernel has BTF: {:?}", f.btf);
        for (name, feature) in f.named() {
            assert!(
                feature.available || !feature.detail.is_empty(),
                "{name} is unavailable without a reason"
            );
        }
        let list = f.available_list();
        assert!(list.split(',').any(|n| n == "btf"), "{list}");
        for (name, feature) in f.named() {
            assert_eq!(
                list.split(',').any(|n| n == name),
                feature.available,
                "{list}"
            );
        }
        eprintln!("features here: {f:#?}");
    }

    /// The kprobe check agrees with the PMU check, and names what is
    /// missing: no kprobes at all, or no such function.
    #[test]
    fn kprobe_check_says_why_not() {
        let err = kprobe_attachable("kml_no_such_function_anywhere")
            .expect_err("no such symbol")
            .to_string();
        assert!(!err.is_empty() && !err.contains('\n'), "{err}");
        match kprobe_attachable("vfs_read") {
            Ok(()) => assert!(kprobes().available),
            Err(e) => {
                let e = e.to_string();
                eprintln!("kprobe_attachable(vfs_read): {e}");
                if !kprobes().available {
                    assert!(e.contains("no kprobes"), "{e}");
                }
            }
        }
    }

    /// This VM refuses fentry (no trampolines): the check must say so,
    /// with the step and the kernel's answer, not panic or claim success.
    #[test]
    fn fentry_is_refused_here_with_a_reason() {
        let err = fentry_attachable("vfs_read")
            .expect_err("the VM refuses fentry")
            .to_string();
        eprintln!("fentry_attachable(vfs_read): {err}");
        assert!(err.starts_with("fentry on vfs_read: "), "{err}");
        assert!(
            err.contains("loading") || err.contains("attaching"),
            "the failing step is named: {err}"
        );
        assert!(!fentry().available, "fentry() agrees: {:?}", fentry());
        let err = fentry_attachable("kml_no_such_function")
            .expect_err("made up")
            .to_string();
        assert!(err.contains("not a function in the kernel's BTF"), "{err}");
        let err = fentry_attachable("task_struct")
            .expect_err("a struct, not a function")
            .to_string();
        assert!(err.contains("not a function"), "{err}");
    }

    #[test]
    fn tracepoints_attach_here() {
        let err = tracepoint_attachable("sched", "kml_no_such_event")
            .expect_err("made up")
            .to_string();
        assert!(err.contains("sched:kml_no_such_event"), "{err}");
        let result = tracepoint_attachable("sched", "sched_switch");
        if is_root() {
            assert_eq!(result, Ok(()), "tp/sched/sched_switch works on this VM");
        } else {
            eprintln!("not root: tracepoint_attachable(sched, sched_switch) = {result:?}");
            assert!(result.is_err_and(|e| !e.to_string().is_empty()));
        }
    }

    #[test]
    fn ioctl_number_matches_the_kernel_header() {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        assert_eq!(PERF_EVENT_IOC_SET_BPF, 0x4004_2408);
    }

    #[test]
    fn a_raw_tp_program_runs_on_a_chosen_cpu_as_root() {
        if !is_root() {
            assert!(
                std::env::var("CI").map_or(true, |v| v != "true"),
                "needs root under CI"
            );
            return;
        }
        // This kernel is far past 5.10.
        assert_eq!(test_run_on_cpu(), Ok(()));
    }

    #[test]
    fn bpf_stats_can_be_enabled_as_root() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var("CI").map_or(true, |v| v != "true"),
                "needs root under CI"
            );
            return;
        }
        // The sysctl shows only its own setting, not holders of this
        // descriptor; that the counts grow is checked by the collector's
        // end-to-end tests (collector_overhead).
        let fd = enable_bpf_stats().expect("BPF_ENABLE_STATS as root");
        let again = enable_bpf_stats().expect("a second holder");
        drop((fd, again));
    }
}
