//! The one-row `system_info` table: the machine (CPU topology, caches,
//! frequency limits, memory, swap, huge pages), the kernel and the tracing
//! features it has, and the run.

use std::{collections::BTreeSet, path::Path, sync::Arc};

use arrow_array::{
    ArrayRef, BooleanArray, Float64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
    UInt32Array, UInt64Array,
};
use kernmlops_sys::clock;
use serde::Serialize;

use crate::{
    decode::{self, HostColumn},
    features::KernelFeatures,
};

/// Facts about this machine, read once per run. `None`: not exposed here
/// (a VM without cpufreq, say).
#[derive(Debug, Clone, Serialize)]
pub struct SystemInfo {
    pub hostname: String,
    pub os: String,
    pub kernel_release: String,
    pub kernel_version: String,
    pub architecture: String,
    pub cpu_vendor: String,
    pub cpu_model: String,
    pub sockets: u32,
    pub cores: u32,
    pub logical_cores: u32,
    pub cpu_min_freq_khz: Option<u64>,
    pub cpu_max_freq_khz: Option<u64>,
    pub l1d_cache_bytes: Option<u64>,
    pub l1i_cache_bytes: Option<u64>,
    pub l2_cache_bytes: Option<u64>,
    pub l3_cache_bytes: Option<u64>,
    pub memory_bytes: u64,
    pub swap_bytes: u64,
    pub swappiness: Option<u64>,
    pub thp_enabled: String,
    pub thp_defrag: String,
    pub hugepages_total: u64,
    pub hugepage_size_bytes: u64,
    pub is_vm: bool,
    pub boot_time_unix_us: i64,
    pub features: KernelFeatures,
    /// The state that spoils measurements, with its warnings.
    pub state: MachineState,
}

/// The machine state that makes measurements vary from run to run (as
/// pyperf's system check reads it): each fact `None` where this machine
/// does not expose it (no cpufreq in a VM, say), and then said nothing of.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MachineState {
    /// The cpufreq governors of the CPU frequency policies, comma-separated.
    pub cpufreq_governor: Option<String>,
    /// Turbo boost on (`cpufreq/boost`, or `intel_pstate/no_turbo` = 0).
    pub cpu_boost: Option<bool>,
    /// `smt/control` (`on`, `off`, `forceoff`, `notsupported`, ...).
    pub smt_control: Option<String>,
    /// Sibling hardware threads are online (`smt/active`).
    pub smt_active: Option<bool>,
    /// The cpuidle driver in use.
    pub cpuidle_driver: Option<String>,
    /// The C-state limit on the kernel's command line or module parameter
    /// (`intel_idle.max_cstate`, `processor.max_cstate`).
    pub cpu_max_cstate: Option<u64>,
    /// The wake-up latency of the deepest idle state enabled on CPU 0.
    pub cpuidle_max_latency_us: Option<u64>,
    /// `kernel.randomize_va_space` (2: full ASLR).
    pub aslr: Option<u64>,
    /// `mitigations=` on the kernel's command line (`auto` when absent).
    pub cpu_mitigations: Option<String>,
    /// The CPU vulnerabilities the kernel reports unmitigated
    /// (`vulnerabilities/*` saying "Vulnerable"), comma-separated.
    pub cpu_vulnerable: Option<String>,
    /// The 1-minute load average at the start.
    pub loadavg_1m: Option<f64>,
    /// Tasks runnable at the start (`/proc/loadavg`, this one included).
    pub runnable_tasks: Option<u64>,
}

/// A 1-minute load average at or above this much says other work is
/// running on the machine.
pub const BUSY_LOAD: f64 = 1.0;
/// A deepest idle state slower than this to wake from makes wake-ups vary.
pub const DEEP_IDLE_US: u64 = 20;

impl MachineState {
    /// The state of this machine.
    pub fn read() -> Self {
        Self::read_in(Path::new("/"))
    }

    /// The state as the trees under `root` (`root/sys`, `root/proc`) give it.
    pub fn read_in(root: &Path) -> Self {
        let cpu = root.join("sys/devices/system/cpu");
        let mut governors: Vec<String> = std::fs::read_dir(cpu.join("cpufreq"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("policy"))
                    .filter_map(|e| read_trim(e.path().join("scaling_governor")))
                    .collect()
            })
            .unwrap_or_default();
        governors.sort();
        governors.dedup();
        let cpu_boost = read_u64(cpu.join("cpufreq/boost"))
            .map(|b| b != 0)
            .or_else(|| read_u64(cpu.join("intel_pstate/no_turbo")).map(|n| n == 0));
        let idle = cpu.join("cpu0/cpuidle");
        let cpuidle_max_latency_us = std::fs::read_dir(&idle).ok().and_then(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("state"))
                .filter(|e| read_u64(e.path().join("disable")) != Some(1))
                .filter_map(|e| read_u64(e.path().join("latency")))
                .max()
        });
        let cpu_max_cstate = ["intel_idle", "processor"]
            .iter()
            .find_map(|m| read_u64(root.join(format!("sys/module/{m}/parameters/max_cstate"))));
        let cmdline = read_trim(root.join("proc/cmdline"));
        let cpu_mitigations = cmdline.map(|c| {
            c.split_whitespace()
                .find_map(|w| w.strip_prefix("mitigations="))
                .unwrap_or("auto")
                .to_owned()
        });
        let cpu_vulnerable = std::fs::read_dir(cpu.join("vulnerabilities"))
            .ok()
            .map(|d| {
                let mut v: Vec<String> = d
                    .flatten()
                    .filter(|e| read_trim(e.path()).is_some_and(|s| s.starts_with("Vulnerable")))
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                v.sort();
                v.join(",")
            });
        let loadavg = read_trim(root.join("proc/loadavg")).unwrap_or_default();
        let mut load = loadavg.split_whitespace();
        let loadavg_1m = load.next().and_then(|l| l.parse().ok());
        let runnable_tasks = load
            .nth(2)
            .and_then(|rt| rt.split_once('/'))
            .and_then(|(r, _)| r.parse().ok());
        Self {
            cpufreq_governor: (!governors.is_empty()).then(|| governors.join(",")),
            cpu_boost,
            smt_control: read_trim(cpu.join("smt/control")),
            smt_active: read_u64(cpu.join("smt/active")).map(|a| a != 0),
            cpuidle_driver: read_trim(cpu.join("cpuidle/current_driver")),
            cpu_max_cstate,
            cpuidle_max_latency_us,
            aslr: read_u64(root.join("proc/sys/kernel/randomize_va_space")),
            cpu_mitigations,
            cpu_vulnerable,
            loadavg_1m,
            runnable_tasks,
        }
    }

    /// One line per fact set against reproducible measurements, with what
    /// to do about it; nothing for a fact this machine does not expose.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(g) = &self.cpufreq_governor {
            if g.split(',').any(|g| g != "performance") {
                out.push(format!(
                    "the CPU frequency governor is {g}, not performance: the CPUs' speed follows the load (machine.cpufreq.governor = \"performance\")"
                ));
            }
        }
        if self.cpu_boost == Some(true) {
            out.push("turbo boost is on: the CPUs' speed depends on temperature and on the other cores' load (machine.cpufreq.boost = false)".into());
        }
        if self.smt_active == Some(true) {
            out.push("SMT is on: a benchmark's hardware thread shares its core with whatever runs on its sibling (machine.smt = false, or machine.cpus on one thread per core)".into());
        }
        if let Some(us) = self.cpuidle_max_latency_us.filter(|&us| us > DEEP_IDLE_US) {
            out.push(format!(
                "deep C-states are enabled (the deepest takes {us} us to wake from): wake-up times vary (limit them with intel_idle.max_cstate=1 or processor.max_cstate=1)"
            ));
        }
        if let Some(a) = self.aslr.filter(|&a| a != 2) {
            out.push(format!(
                "kernel.randomize_va_space is {a}, not 2 (full ASLR) as on most machines: memory layouts differ from a usual run"
            ));
        }
        if let Some(load) = self.loadavg_1m.filter(|&l| l >= BUSY_LOAD) {
            out.push(format!(
                "the machine is busy (1-minute load average {load:.2}, {} tasks runnable): other work competes with the run",
                self.runnable_tasks.map_or_else(|| "?".to_owned(), |r| r.to_string())
            ));
        }
        out
    }
}

fn read_trim(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

fn read_u64(path: impl AsRef<Path>) -> Option<u64> {
    read_trim(path)?.parse().ok()
}

/// The selected value of a sysfs choice like `always [madvise] never`.
fn selected(choice: &str) -> String {
    choice
        .split_whitespace()
        .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
        .unwrap_or(choice)
        .to_owned()
}

/// A /proc/meminfo value in bytes (kB fields) or as a count.
fn meminfo(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?.trim();
        let (num, unit) = rest.split_once(' ').unwrap_or((rest, ""));
        let v: u64 = num.parse().ok()?;
        Some(if unit.trim() == "kB" { v * 1024 } else { v })
    })
}

/// Cache sizes of CPU 0 by (level, type): `32K` style values in bytes.
fn cache_size(level: u32, kind: &str) -> Option<u64> {
    let dir = Path::new("/sys/devices/system/cpu/cpu0/cache");
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let p = e.path();
        if read_u64(p.join("level")) != Some(u64::from(level))
            || read_trim(p.join("type")).as_deref() != Some(kind)
        {
            return None;
        }
        let size = read_trim(p.join("size"))?;
        let (num, mult) = match size.strip_suffix('K') {
            Some(n) => (n, 1024),
            None => match size.strip_suffix('M') {
                Some(n) => (n, 1024 * 1024),
                None => (size.as_str(), 1),
            },
        };
        num.parse::<u64>().ok().map(|n| n * mult)
    })
}

/// (sockets, cores, logical CPUs) from sysfs topology of online CPUs.
fn topology() -> (u32, u32, u32) {
    let mut packages = BTreeSet::new();
    let mut cores = BTreeSet::new();
    let mut logical = 0;
    if let Ok(entries) = std::fs::read_dir("/sys/devices/system/cpu") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(n) = name.strip_prefix("cpu") else {
                continue;
            };
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let topo = e.path().join("topology");
            let (Some(pkg), Some(core)) = (
                read_u64(topo.join("physical_package_id")),
                read_u64(topo.join("core_id")),
            ) else {
                continue;
            };
            logical += 1;
            packages.insert(pkg);
            cores.insert((pkg, core));
        }
    }
    if logical == 0 {
        let n = std::thread::available_parallelism().map_or(0, |n| n.get() as u32);
        return (1, n, n);
    }
    (packages.len() as u32, cores.len() as u32, logical)
}

fn uname() -> (String, String, String, String) {
    // SAFETY: utsname is plain old data; uname fills it with NUL-terminated
    // strings.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return Default::default();
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    (
        field(&u.nodename),
        field(&u.release),
        field(&u.version),
        field(&u.machine),
    )
}

impl SystemInfo {
    pub fn gather() -> Self {
        let (hostname, kernel_release, kernel_version, architecture) = uname();
        let os = read_trim("/etc/os-release")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim_matches('"').to_owned())
            .unwrap_or_default();
        let cpuinfo = read_trim("/proc/cpuinfo").unwrap_or_default();
        let cpu_field = |key: &str| {
            cpuinfo
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    (k.trim() == key).then(|| v.trim().to_owned())
                })
                .unwrap_or_default()
        };
        let flags = cpu_field("flags");
        let mem = read_trim("/proc/meminfo").unwrap_or_default();
        let (sockets, cores, logical_cores) = topology();
        let thp = Path::new("/sys/kernel/mm/transparent_hugepage");
        let freq = Path::new("/sys/devices/system/cpu/cpu0/cpufreq");
        Self {
            hostname,
            os,
            kernel_release,
            kernel_version,
            architecture,
            cpu_vendor: cpu_field("vendor_id"),
            cpu_model: cpu_field("model name"),
            sockets,
            cores,
            logical_cores,
            cpu_min_freq_khz: read_u64(freq.join("cpuinfo_min_freq")),
            cpu_max_freq_khz: read_u64(freq.join("cpuinfo_max_freq")),
            l1d_cache_bytes: cache_size(1, "Data"),
            l1i_cache_bytes: cache_size(1, "Instruction"),
            l2_cache_bytes: cache_size(2, "Unified"),
            l3_cache_bytes: cache_size(3, "Unified"),
            memory_bytes: meminfo(&mem, "MemTotal").unwrap_or(0),
            swap_bytes: meminfo(&mem, "SwapTotal").unwrap_or(0),
            swappiness: read_u64("/proc/sys/vm/swappiness"),
            thp_enabled: read_trim(thp.join("enabled"))
                .map(|s| selected(&s))
                .unwrap_or_default(),
            thp_defrag: read_trim(thp.join("defrag"))
                .map(|s| selected(&s))
                .unwrap_or_default(),
            hugepages_total: meminfo(&mem, "HugePages_Total").unwrap_or(0),
            hugepage_size_bytes: meminfo(&mem, "Hugepagesize").unwrap_or(0),
            is_vm: flags.split_whitespace().any(|f| f == "hypervisor"),
            boot_time_unix_us: clock::unix_us() - clock::uptime_us() as i64,
            features: KernelFeatures::detect(),
            state: MachineState::read(),
        }
    }

    /// The table's single row.
    pub fn to_batch(
        &self,
        collection_id: &str,
        ts_uptime_us: u64,
        collection_start_unix_us: i64,
        plugins: &[String],
    ) -> Result<RecordBatch, arrow_schema::ArrowError> {
        let mut cols = vec![HostColumn::new(
            "ts_uptime_us",
            "us",
            "when the collection started (CLOCK_BOOTTIME)",
            Arc::new(UInt64Array::from(vec![ts_uptime_us])) as ArrayRef,
        )];
        cols.extend(self.identity_columns(plugins));
        cols.extend(self.size_columns());
        cols.extend(self.state_columns());
        cols.extend(self.flag_and_time_columns(collection_start_unix_us));
        decode::host_table(
            "system_info",
            "The machine, the kernel and the run, one row",
            collection_id,
            cols,
        )
    }

    /// The machine and the run as text and counts: host, OS, kernel, CPU, THP
    /// modes, plugins, kernel features; sockets, cores, logical CPUs.
    fn identity_columns(&self, plugins: &[String]) -> Vec<HostColumn> {
        let f = &self.features;
        let mut cols = Vec::new();
        for (name, desc, v) in [
            (
                "hostname",
                "the machine's host name",
                self.hostname.as_str(),
            ),
            (
                "os",
                "the operating system (os-release PRETTY_NAME)",
                &self.os,
            ),
            ("kernel_release", "uname -r", &self.kernel_release),
            ("kernel_version", "uname -v", &self.kernel_version),
            ("architecture", "uname -m", &self.architecture),
            ("cpu_vendor", "the CPU's vendor id", &self.cpu_vendor),
            ("cpu_model", "the CPU's model name", &self.cpu_model),
            (
                "thp_enabled",
                "transparent huge pages mode at the start",
                &self.thp_enabled,
            ),
            (
                "thp_defrag",
                "transparent huge pages defrag mode at the start",
                &self.thp_defrag,
            ),
            (
                "plugins",
                "plugins of the run, comma-separated",
                &plugins.join(","),
            ),
            (
                "kernel_features",
                "tracing features the kernel has, comma-separated",
                &f.available_list(),
            ),
        ] {
            cols.push(HostColumn::new(
                name,
                "",
                desc,
                Arc::new(StringArray::from(vec![v])),
            ));
        }
        for (name, desc, v) in [
            ("sockets", "CPU packages", self.sockets),
            ("cores", "physical cores", self.cores),
            (
                "logical_cores",
                "logical CPUs (hardware threads)",
                self.logical_cores,
            ),
        ] {
            cols.push(HostColumn::new(
                name,
                "count",
                desc,
                Arc::new(UInt32Array::from(vec![v])),
            ));
        }
        cols
    }

    /// Memory, huge page and cache sizes, swappiness and CPU frequency range
    /// (null where unknown).
    fn size_columns(&self) -> Vec<HostColumn> {
        let mut cols = Vec::new();
        for (name, unit, desc, v) in [
            ("memory_bytes", "bytes", "MemTotal", Some(self.memory_bytes)),
            ("swap_bytes", "bytes", "SwapTotal", Some(self.swap_bytes)),
            (
                "hugepages_total",
                "count",
                "persistent huge pages configured",
                Some(self.hugepages_total),
            ),
            (
                "hugepage_size_bytes",
                "bytes",
                "the default huge page size",
                Some(self.hugepage_size_bytes),
            ),
            ("swappiness", "", "vm.swappiness", self.swappiness),
            (
                "cpu_min_freq_khz",
                "kHz",
                "lowest CPU frequency (cpufreq; null without it)",
                self.cpu_min_freq_khz,
            ),
            (
                "cpu_max_freq_khz",
                "kHz",
                "highest CPU frequency (cpufreq; null without it)",
                self.cpu_max_freq_khz,
            ),
            (
                "l1d_cache_bytes",
                "bytes",
                "CPU 0's L1 data cache",
                self.l1d_cache_bytes,
            ),
            (
                "l1i_cache_bytes",
                "bytes",
                "CPU 0's L1 instruction cache",
                self.l1i_cache_bytes,
            ),
            (
                "l2_cache_bytes",
                "bytes",
                "CPU 0's L2 cache",
                self.l2_cache_bytes,
            ),
            (
                "l3_cache_bytes",
                "bytes",
                "CPU 0's L3 cache",
                self.l3_cache_bytes,
            ),
        ] {
            cols.push(
                HostColumn::new(name, unit, desc, Arc::new(UInt64Array::from(vec![v]))).nullable(),
            );
        }
        cols
    }

    /// The machine state at the start (`MachineState`): governors, SMT,
    /// idle, mitigations, boost, C-states, ASLR, load.
    fn state_columns(&self) -> Vec<HostColumn> {
        let st = &self.state;
        let mut cols = Vec::new();
        for (name, desc, v) in [
            (
                "cpufreq_governor",
                "the CPU frequency governors, comma-separated (null without cpufreq)",
                st.cpufreq_governor.as_deref(),
            ),
            (
                "smt_control",
                "smt/control: on, off, forceoff, notsupported (null without it)",
                st.smt_control.as_deref(),
            ),
            (
                "cpuidle_driver",
                "the cpuidle driver (null without cpuidle)",
                st.cpuidle_driver.as_deref(),
            ),
            (
                "cpu_mitigations",
                "mitigations= on the kernel command line (auto when absent)",
                st.cpu_mitigations.as_deref(),
            ),
            (
                "cpu_vulnerable",
                "CPU vulnerabilities the kernel reports unmitigated, comma-separated",
                st.cpu_vulnerable.as_deref(),
            ),
        ] {
            cols.push(
                HostColumn::new(name, "", desc, Arc::new(StringArray::from(vec![v]))).nullable(),
            );
        }
        for (name, desc, v) in [
            (
                "cpu_boost",
                "turbo boost on (null without a boost switch)",
                st.cpu_boost,
            ),
            (
                "smt_active",
                "sibling hardware threads online (null without smt/active)",
                st.smt_active,
            ),
        ] {
            cols.push(
                HostColumn::new(name, "", desc, Arc::new(BooleanArray::from(vec![v]))).nullable(),
            );
        }
        for (name, unit, desc, v) in [
            (
                "cpu_max_cstate",
                "",
                "the C-state limit (intel_idle or processor max_cstate; null without one)",
                st.cpu_max_cstate,
            ),
            (
                "cpuidle_max_latency_us",
                "us",
                "wake-up latency of CPU 0's deepest enabled idle state",
                st.cpuidle_max_latency_us,
            ),
            (
                "aslr",
                "",
                "kernel.randomize_va_space (2: full ASLR)",
                st.aslr,
            ),
            (
                "runnable_tasks",
                "count",
                "tasks runnable at the start, this one included (/proc/loadavg)",
                st.runnable_tasks,
            ),
        ] {
            cols.push(
                HostColumn::new(name, unit, desc, Arc::new(UInt64Array::from(vec![v]))).nullable(),
            );
        }
        cols.push(
            HostColumn::new(
                "loadavg_1m",
                "",
                "the 1-minute load average at the start",
                Arc::new(Float64Array::from(vec![st.loadavg_1m])),
            )
            .nullable(),
        );
        cols
    }

    /// What the machine is and has (VM, BTF, probes), and when it booted and
    /// the collection started.
    fn flag_and_time_columns(&self, collection_start_unix_us: i64) -> Vec<HostColumn> {
        let f = &self.features;
        let mut cols = Vec::new();
        for (name, desc, v) in [
            ("is_vm", "a virtual machine (hypervisor flag)", self.is_vm),
            ("has_btf", "the kernel has BTF", f.btf.available),
            ("has_kprobes", "kprobes can be used", f.kprobes.available),
            ("has_uprobes", "uprobes can be used", f.uprobes.available),
            (
                "has_fentry",
                "fentry/fexit programs load",
                f.fentry.available,
            ),
            (
                "has_hardware_pmu",
                "hardware performance counters open",
                f.hardware_pmu.available,
            ),
        ] {
            cols.push(HostColumn::new(
                name,
                "",
                desc,
                Arc::new(BooleanArray::from(vec![v])),
            ));
        }
        for (name, desc, v) in [
            (
                "boot_time",
                "when the machine booted (UTC)",
                self.boot_time_unix_us,
            ),
            (
                "collection_time",
                "when the collection started (UTC)",
                collection_start_unix_us,
            ),
        ] {
            cols.push(HostColumn::new(
                name,
                "",
                desc,
                Arc::new(TimestampMicrosecondArray::from(vec![v]).with_timezone("UTC")),
            ));
        }
        cols
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tree::Tree;

    #[test]
    fn parses_sysfs_and_meminfo_formats() {
        assert_eq!(selected("always [madvise] never"), "madvise");
        assert_eq!(selected("[always] never"), "always");
        let mem =
            "MemTotal:       24576000 kB\nHugePages_Total:       4\nHugepagesize:       2048 kB\n";
        assert_eq!(meminfo(mem, "MemTotal"), Some(24_576_000 * 1024));
        assert_eq!(
            meminfo(mem, "HugePages_Total"),
            Some(4),
            "counts are not multiplied"
        );
        assert_eq!(meminfo(mem, "Hugepagesize"), Some(2048 * 1024));
        assert_eq!(meminfo(mem, "SwapTotal"), None);
    }

    #[test]
    fn the_state_against_reproducibility_is_read_and_warned_of() {
        let cpu = "sys/devices/system/cpu";
        let t = Tree::new("sysinfo-spoiled");
        t.file(
            &format!("{cpu}/cpufreq/policy0/scaling_governor"),
            "powersave\n",
        )
        .file(
            &format!("{cpu}/cpufreq/policy1/scaling_governor"),
            "performance\n",
        )
        .file(&format!("{cpu}/intel_pstate/no_turbo"), "0\n")
        .file(&format!("{cpu}/smt/control"), "on\n")
        .file(&format!("{cpu}/smt/active"), "1\n")
        .file(&format!("{cpu}/cpuidle/current_driver"), "intel_idle\n")
        .file(&format!("{cpu}/cpu0/cpuidle/state0/latency"), "0\n")
        .file(&format!("{cpu}/cpu0/cpuidle/state1/latency"), "2\n")
        .file(&format!("{cpu}/cpu0/cpuidle/state2/latency"), "170\n")
        .file(&format!("{cpu}/cpu0/cpuidle/state3/latency"), "900\n")
        .file(&format!("{cpu}/cpu0/cpuidle/state3/disable"), "1\n")
        .file(&format!("{cpu}/vulnerabilities/meltdown"), "Not affected\n")
        .file(
            &format!("{cpu}/vulnerabilities/spectre_v2"),
            "Vulnerable: no microcode\n",
        )
        .file(&format!("{cpu}/vulnerabilities/mds"), "Vulnerable\n")
        .file("proc/sys/kernel/randomize_va_space", "0\n")
        .file("proc/cmdline", "ro quiet mitigations=off\n")
        .file("proc/loadavg", "3.50 2.00 1.00 5/300 4242\n");
        let st = MachineState::read_in(&t.0);
        assert_eq!(
            st,
            MachineState {
                cpufreq_governor: Some("performance,powersave".into()),
                cpu_boost: Some(true),
                smt_control: Some("on".into()),
                smt_active: Some(true),
                cpuidle_driver: Some("intel_idle".into()),
                cpu_max_cstate: None,
                cpuidle_max_latency_us: Some(170),
                aslr: Some(0),
                cpu_mitigations: Some("off".into()),
                cpu_vulnerable: Some("mds,spectre_v2".into()),
                loadavg_1m: Some(3.5),
                runnable_tasks: Some(5),
            }
        );
        let w = st.warnings();
        let starts = [
            "the CPU frequency governor is performance,powersave, not performance",
            "turbo boost is on",
            "SMT is on",
            "deep C-states are enabled (the deepest takes 170 us",
            "kernel.randomize_va_space is 0, not 2",
            "the machine is busy (1-minute load average 3.50, 5 tasks runnable)",
        ];
        assert_eq!(w.len(), starts.len(), "{w:#?}");
        for (line, start) in w.iter().zip(starts) {
            assert!(
                line.starts_with(start),
                "{line:?} should start with {start:?}"
            );
        }

        // A tuned machine: nothing said.
        let t = Tree::new("sysinfo-tuned");
        t.file(
            &format!("{cpu}/cpufreq/policy0/scaling_governor"),
            "performance\n",
        )
        .file(&format!("{cpu}/cpufreq/boost"), "0\n")
        .file(&format!("{cpu}/smt/control"), "off\n")
        .file(&format!("{cpu}/smt/active"), "0\n")
        .file(&format!("{cpu}/cpu0/cpuidle/state0/latency"), "0\n")
        .file(&format!("{cpu}/cpu0/cpuidle/state1/latency"), "170\n")
        .file(&format!("{cpu}/cpu0/cpuidle/state1/disable"), "1\n")
        .file("sys/module/intel_idle/parameters/max_cstate", "1\n")
        .file("proc/sys/kernel/randomize_va_space", "2\n")
        .file("proc/loadavg", "0.10 0.05 0.01 1/300 4242\n");
        let st = MachineState::read_in(&t.0);
        assert_eq!(st.cpu_boost, Some(false));
        assert_eq!(st.cpu_max_cstate, Some(1));
        assert_eq!(st.cpuidle_max_latency_us, Some(0));
        assert_eq!(st.warnings(), Vec::<String>::new());

        // Nothing exposed (a VM without cpufreq, a container): all null,
        // nothing said.
        let t = Tree::new("sysinfo-bare");
        let st = MachineState::read_in(&t.0);
        assert_eq!(st, MachineState::default());
        assert!(st.warnings().is_empty());
    }

    #[test]
    fn gathers_a_consistent_row() {
        let info = SystemInfo::gather();
        assert!(
            info.logical_cores >= info.cores && info.cores >= info.sockets && info.sockets >= 1
        );
        assert!(info.memory_bytes > 0);
        let batch = info.to_batch("c", 1, 2, &["p".into()]).expect("row");
        assert_eq!(batch.num_rows(), 1);
        for col in [
            "hostname",
            "logical_cores",
            "l2_cache_bytes",
            "thp_enabled",
            "has_btf",
            "boot_time",
            "cpufreq_governor",
            "cpu_boost",
            "smt_active",
            "aslr",
            "cpu_vulnerable",
            "loadavg_1m",
        ] {
            assert!(batch.column_by_name(col).is_some(), "missing {col}");
        }
    }
}
