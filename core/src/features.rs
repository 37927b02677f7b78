//! Which kernel tracing features this machine has, found by asking the
//! kernel rather than reading version numbers: BTF, kprobes, uprobes,
//! fentry (a minimal BPF trampoline program is loaded and closed), and a
//! hardware PMU (a hardware counter is opened and closed).

use std::{ffi::CString, path::Path};

use serde::Serialize;

/// One feature: available or not, and why not.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Feature {
    pub available: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl Feature {
    fn yes(detail: impl Into<String>) -> Self {
        Self {
            available: true,
            detail: detail.into(),
        }
    }

    fn no(detail: impl Into<String>) -> Self {
        Self {
            available: false,
            detail: detail.into(),
        }
    }
}

/// The kernel features probes may use.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct KernelFeatures {
    pub btf: Feature,
    pub kprobes: Feature,
    pub uprobes: Feature,
    pub fentry: Feature,
    pub hardware_pmu: Feature,
}

impl KernelFeatures {
    pub fn detect() -> Self {
        Self {
            btf: if Path::new(crate::preflight::BTF_VMLINUX).is_file() {
                Feature::yes("")
            } else {
                Feature::no(format!("{} is missing", crate::preflight::BTF_VMLINUX))
            },
            kprobes: pmu_registered("kprobe"),
            uprobes: pmu_registered("uprobe"),
            fentry: fentry(),
            hardware_pmu: hardware_pmu(),
        }
    }

    /// `btf,uprobes` style list of what is available.
    pub fn available_list(&self) -> String {
        [
            ("btf", &self.btf),
            ("kprobes", &self.kprobes),
            ("uprobes", &self.uprobes),
            ("fentry", &self.fentry),
            ("hardware_pmu", &self.hardware_pmu),
        ]
        .iter()
        .filter(|(_, f)| f.available)
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(",")
    }
}

/// kprobe and uprobe events register a PMU of that name when the kernel
/// supports them.
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

fn errno_text(e: i32) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}

/// Opens the hardware instructions counter on CPU 0 for all tasks.
fn hardware_pmu() -> Feature {
    // perf_event_attr is 136 bytes in current kernels; zeroed fields are
    // defaults. type @0 (PERF_TYPE_HARDWARE = 0), size @4, config @8
    // (PERF_COUNT_HW_INSTRUCTIONS = 1), flags @40 (bit 0: disabled).
    let mut attr = [0u8; 136];
    attr[4..8].copy_from_slice(&136u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&1u64.to_ne_bytes());
    attr[40..48].copy_from_slice(&1u64.to_ne_bytes());
    // SAFETY: perf_event_open reads `attr` (valid for its declared size).
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            -1i32,
            0i32,
            -1i32,
            0u64,
        )
    };
    if fd >= 0 {
        // SAFETY: closing the descriptor just opened.
        unsafe { libc::close(fd as i32) };
        Feature::yes("")
    } else {
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        Feature::no(format!("hardware counter instructions: {}", errno_text(e)))
    }
}

/// Finds a kernel function's BTF type id by name in vmlinux BTF.
fn btf_func_id(btf: &[u8], wanted: &str) -> Option<u32> {
    let u32_at = |off: usize| -> Option<u32> {
        btf.get(off..off + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    if btf.get(0..2) != Some(&[0x9f, 0xeb]) {
        return None; // not little-endian BTF
    }
    let hdr_len = u32_at(4)? as usize;
    let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
    let (str_off, str_len) = (u32_at(16)? as usize, u32_at(20)? as usize);
    let types = hdr_len + type_off;
    let strings = btf.get(hdr_len + str_off..hdr_len + str_off + str_len)?;
    let name_at = |off: usize| -> Option<&[u8]> {
        let s = strings.get(off..)?;
        Some(&s[..s.iter().position(|&b| b == 0)?])
    };
    let mut pos = types;
    let mut id = 1u32;
    while pos + 12 <= types + type_len {
        let name_off = u32_at(pos)? as usize;
        let info = u32_at(pos + 4)?;
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        if kind == 12 && name_at(name_off) == Some(wanted.as_bytes()) {
            return Some(id);
        }
        let extra = match kind {
            1 | 14 | 17 => 4,          // INT, VAR, DECL_TAG
            3 => 12,                   // ARRAY
            4 | 5 => vlen * 12,        // STRUCT, UNION
            6 | 13 => vlen * 8,        // ENUM, FUNC_PROTO
            15 | 19 => vlen * 12,      // DATASEC, ENUM64
            2 | 7..=12 | 16 | 18 => 0, // PTR, FWD, TYPEDEF.., FUNC, FLOAT, TYPE_TAG
            _ => return None,          // a kind this parser does not know
        };
        pos += 12 + extra;
        id += 1;
    }
    None
}

/// Loads (and closes) a do-nothing fentry program on a kernel function.
fn fentry() -> Feature {
    let Ok(btf) = std::fs::read(crate::preflight::BTF_VMLINUX) else {
        return Feature::no("needs BTF");
    };
    let Some((func, btf_id)) = ["bpf_fentry_test1", "vfs_read", "do_nanosleep"]
        .iter()
        .find_map(|f| btf_func_id(&btf, f).map(|id| (*f, id)))
    else {
        return Feature::no("no known kernel function in BTF to attach to");
    };
    // r0 = 0; exit
    let insns: [u64; 2] = [
        u64::from_le_bytes([0xb7, 0, 0, 0, 0, 0, 0, 0]),
        u64::from_le_bytes([0x95, 0, 0, 0, 0, 0, 0, 0]),
    ];
    let Ok(license) = CString::new("GPL") else {
        return Feature::no("internal error");
    };
    // union bpf_attr for BPF_PROG_LOAD: prog_type @0 (BPF_PROG_TYPE_TRACING
    // = 26), insn_cnt @4, insns @8, license @16, expected_attach_type @68
    // (BPF_TRACE_FENTRY = 24), attach_btf_id @108.
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&26u32.to_ne_bytes());
    attr[4..8].copy_from_slice(&2u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    attr[68..72].copy_from_slice(&24u32.to_ne_bytes());
    attr[108..112].copy_from_slice(&btf_id.to_ne_bytes());
    // SAFETY: bpf(BPF_PROG_LOAD = 5) reads `attr` and the buffers it points
    // to, all alive for the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, 5i32, attr.as_ptr(), attr.len() as u32) };
    if fd >= 0 {
        // SAFETY: closing the descriptor just returned.
        unsafe { libc::close(fd as i32) };
        Feature::yes(format!("loaded on {func}"))
    } else {
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        Feature::no(format!("loading on {func}: {}", errno_text(e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_functions_in_this_kernels_btf() {
        let Ok(btf) = std::fs::read(crate::preflight::BTF_VMLINUX) else {
            eprintln!("SKIP: no kernel BTF here");
            return;
        };
        assert!(
            btf_func_id(&btf, "vfs_read").is_some(),
            "vfs_read is in every kernel's BTF"
        );
        assert_eq!(btf_func_id(&btf, "no_such_function_kml"), None);
        assert_eq!(btf_func_id(b"not btf at all", "vfs_read"), None);
    }
}
