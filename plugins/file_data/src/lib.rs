//! file_data: one row per successful file open or create, with the file's
//! inode, size and full name. Uses `fexit/do_filp_open` where the kernel
//! allows it, else the syscall tracepoints of open, openat, openat2 and
//! creat: decided before load from the kernel's features, as bcc's
//! libbpf-tools do, never by failing and retrying.

use kernmlops_plugin_bpf::{
    bpf_probe, export_plugin, sdk::NoSettings, BpfHooks, BpfProbe, Error, LoadContext, Open, Result,
};

/// One record of the `file_data` table, generated from `src/bpf/file_data.h`.
pub type FileDataEvent = skel::types::file_data_event;

/// Labels of `open_kind`, indexed by the `FILE_DATA_*` values of
/// `file_data.h`.
pub const OPEN_KINDS: &[&str] = &["open", "create"];

/// The syscalls the tracepoint path hooks, each with its
/// `sys_enter_<name>` and `sys_exit_<name>` tracepoints.
pub const SYSCALLS: &[&str] = &["open", "openat", "openat2", "creat"];

/// The kernel function the fexit path attaches to.
pub const FEXIT_FUNCTION: &str = "do_filp_open";

bpf_probe! {
    probe: FileData,
    name: "file_data",
    description: "File opens and creates: inode, size and full name",
    hooks: custom,
    tables: [
        file_data(events, file_data_event, rate = 50_000):
            "One row per successful file open or create, with inode, size and name" {
            ts_uptime_us [us]: "when the open returned (CLOCK_BOOTTIME)",
            pid: "thread id of the opener",
            tgid: "process id of the opener",
            inode: "inode number of the opened file (st_ino)",
            size_bytes [bytes]: "the file's size when it was opened (after O_TRUNC)",
            flags: "open flags (O_*) as passed",
            open_kind as label(OPEN_KINDS): "create when O_CREAT was given (the file may have existed), else open",
            name: "the file name as passed to open (first 255 bytes)",
            name_truncated as bool: "true when the name was longer than 255 bytes and cut",
        },
    ],
}

/// Which way into the kernel the probe uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Path {
    /// `fexit/do_filp_open`: every open the kernel makes for a path.
    #[default]
    Fexit,
    /// The syscall tracepoints present on this kernel.
    Tracepoints,
}

/// The `file_data` probe and the path it chose.
#[derive(Default)]
pub struct FileData {
    path: Path,
}

impl FileData {
    /// The way in chosen before load.
    pub fn path(&self) -> Path {
        self.path
    }
}

impl BpfHooks for FileData {
    fn before_load(
        &mut self,
        open: &mut Open<Self>,
        cx: &mut LoadContext<'_, NoSettings>,
    ) -> Result<()> {
        let p = &mut open.progs;
        let fexit = cx.features.fentry_attachable(FEXIT_FUNCTION);
        let pairs = [
            ("open", [&mut p.tp_enter_open, &mut p.tp_exit_open]),
            ("openat", [&mut p.tp_enter_openat, &mut p.tp_exit_openat]),
            ("openat2", [&mut p.tp_enter_openat2, &mut p.tp_exit_openat2]),
            ("creat", [&mut p.tp_enter_creat, &mut p.tp_exit_creat]),
        ];
        if fexit.is_ok() {
            for (_, progs) in pairs {
                for prog in progs {
                    prog.set_autoload(false);
                }
            }
            self.path = Path::Fexit;
            return Ok(());
        }
        let mut missing = Vec::new();
        for (syscall, progs) in pairs {
            let present = cx.features.syscall_tracepoints(syscall);
            if !present {
                missing.push(syscall);
            }
            for prog in progs {
                prog.set_autoload(present);
            }
        }
        p.fexit_do_filp_open.set_autoload(false);
        let why = fexit.err().map(|e| e.to_string()).unwrap_or_default();
        if missing.len() == SYSCALLS.len() {
            return Err(Error::unsupported(format!(
                "file_data needs fexit on {FEXIT_FUNCTION} or the syscall tracepoints \
                 (CONFIG_FTRACE_SYSCALLS, events/syscalls/sys_enter_openat in tracefs); \
                 this kernel has neither (fexit: {why})"
            )));
        }
        self.path = Path::Tracepoints;
        cx.note(format!(
            "fexit/{FEXIT_FUNCTION} is unavailable ({why}); using the syscall \
             tracepoints, which miss opens made without open/openat/openat2/creat \
             (io_uring, kernel-internal opens)"
        ));
        if !missing.is_empty() {
            cx.note(format!(
                "no syscall tracepoints for {} on this kernel: those opens are not recorded",
                missing.join(", ")
            ));
        }
        Ok(())
    }
}

export_plugin! {
    description: "File opens and creates: inode, size and full name",
    probes: [BpfProbe<FileData>],
}
