//! Counting events with `perf_event_open`: perf's generic event names, PMU
//! events and formats from sysfs, model-specific event names through
//! libpfm4 (loaded at run time, [`pfm`]), event-name parsing and the
//! open/read calls. Depends on `libc` only; shared by the `perf` plugin and
//! `kernmlops perf-list`, so both build event attributes one way. Nothing
//! here starts a process.

use std::{
    fs, io,
    os::fd::{FromRawFd, OwnedFd, RawFd},
    path::{Path, PathBuf},
};

pub mod pfm;

pub const PERF_TYPE_HARDWARE: u32 = 0;
pub const PERF_TYPE_SOFTWARE: u32 = 1;
pub const PERF_TYPE_TRACEPOINT: u32 = 2;
pub const PERF_TYPE_HW_CACHE: u32 = 3;
pub const PERF_TYPE_RAW: u32 = 4;

/// `read_format`: the read returns time enabled and time running after the
/// count, so multiplexed counts can be scaled.
const PERF_FORMAT_TOTAL_TIME_ENABLED: u64 = 1;
const PERF_FORMAT_TOTAL_TIME_RUNNING: u64 = 2;
/// `flags` bit: children created after the open are counted too.
const ATTR_FLAG_INHERIT: u64 = 1 << 1;
/// `flags` bits: leave out what runs in the kernel and the hypervisor (an
/// unprivileged process may count only itself in user space).
const ATTR_FLAG_EXCLUDE_KERNEL: u64 = 1 << 5;
const ATTR_FLAG_EXCLUDE_HV: u64 = 1 << 6;
/// `perf_event_open` flag: `pid` is a cgroup folder's file descriptor.
pub const PERF_FLAG_PID_CGROUP: libc::c_ulong = 1 << 2;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// Where sysfs lists the machine's PMUs.
pub const PMU_ROOT: &str = "/sys/bus/event_source/devices";

/// `struct perf_event_attr` up to `PERF_ATTR_SIZE_VER5` (112 bytes), which
/// every kernel since 4.1 accepts.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved_2: u16,
}

/// What `perf_event_open` needs to know about an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventSpec {
    pub type_: u32,
    pub config: u64,
    pub config1: u64,
    pub config2: u64,
}

impl std::fmt::Display for EventSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "type {} config {:#x}", self.type_, self.config)?;
        if self.config1 != 0 {
            write!(f, " config1 {:#x}", self.config1)?;
        }
        if self.config2 != 0 {
            write!(f, " config2 {:#x}", self.config2)?;
        }
        Ok(())
    }
}

/// One of perf's generic events (hardware, software, hardware cache).
#[derive(Debug, Clone)]
pub struct Generic {
    /// perf's name, e.g. `dTLB-load-misses`.
    pub name: String,
    /// perf's short names for it (`cs` for `context-switches`).
    pub aliases: &'static [&'static str],
    pub spec: EventSpec,
    /// `hardware`, `software` or `hw_cache`.
    pub kind: &'static str,
    pub description: String,
}

const HARDWARE: &[(&str, &[&str], u64, &str)] = &[
    ("cpu-cycles", &["cycles"], 0, "CPU cycles"),
    ("instructions", &[], 1, "instructions retired"),
    (
        "cache-references",
        &[],
        2,
        "cache accesses (usually last-level cache)",
    ),
    (
        "cache-misses",
        &[],
        3,
        "cache misses (usually last-level cache)",
    ),
    (
        "branch-instructions",
        &["branches"],
        4,
        "branch instructions retired",
    ),
    ("branch-misses", &[], 5, "mispredicted branches"),
    ("bus-cycles", &[], 6, "bus cycles"),
    (
        "stalled-cycles-frontend",
        &["idle-cycles-frontend"],
        7,
        "cycles the front end issued nothing",
    ),
    (
        "stalled-cycles-backend",
        &["idle-cycles-backend"],
        8,
        "cycles the back end retired nothing",
    ),
    (
        "ref-cycles",
        &[],
        9,
        "reference cycles (not scaled by frequency changes)",
    ),
];

const SOFTWARE: &[(&str, &[&str], u64, &str)] = &[
    ("cpu-clock", &[], 0, "CPU clock time (ns)"),
    ("task-clock", &[], 1, "task clock time (ns)"),
    (
        "page-faults",
        &["faults"],
        2,
        "page faults (minor and major)",
    ),
    ("context-switches", &["cs"], 3, "context switches"),
    (
        "cpu-migrations",
        &["migrations"],
        4,
        "tasks moved to another CPU",
    ),
    ("minor-faults", &[], 5, "page faults served without I/O"),
    ("major-faults", &[], 6, "page faults that needed I/O"),
    (
        "alignment-faults",
        &[],
        7,
        "unaligned accesses fixed up by the kernel",
    ),
    (
        "emulation-faults",
        &[],
        8,
        "instructions emulated by the kernel",
    ),
    (
        "cgroup-switches",
        &[],
        11,
        "context switches to a task in another cgroup",
    ),
];

/// perf's cache names: (name, cache id, op, result, description).
const HW_CACHE: &[(&str, u64, u64, u64, &str)] = &[
    ("L1-dcache-loads", 0, 0, 0, "level-1 data cache loads"),
    (
        "L1-dcache-load-misses",
        0,
        0,
        1,
        "level-1 data cache load misses",
    ),
    ("L1-dcache-stores", 0, 1, 0, "level-1 data cache stores"),
    (
        "L1-dcache-store-misses",
        0,
        1,
        1,
        "level-1 data cache store misses",
    ),
    (
        "L1-dcache-prefetches",
        0,
        2,
        0,
        "level-1 data cache prefetches",
    ),
    (
        "L1-icache-loads",
        1,
        0,
        0,
        "level-1 instruction cache loads",
    ),
    (
        "L1-icache-load-misses",
        1,
        0,
        1,
        "level-1 instruction cache load misses",
    ),
    ("LLC-loads", 2, 0, 0, "last-level cache loads"),
    ("LLC-load-misses", 2, 0, 1, "last-level cache load misses"),
    ("LLC-stores", 2, 1, 0, "last-level cache stores"),
    ("LLC-store-misses", 2, 1, 1, "last-level cache store misses"),
    ("dTLB-loads", 3, 0, 0, "data TLB loads"),
    ("dTLB-load-misses", 3, 0, 1, "data TLB load misses"),
    ("dTLB-stores", 3, 1, 0, "data TLB stores"),
    ("dTLB-store-misses", 3, 1, 1, "data TLB store misses"),
    ("iTLB-loads", 4, 0, 0, "instruction TLB loads"),
    ("iTLB-load-misses", 4, 0, 1, "instruction TLB load misses"),
    ("branch-loads", 5, 0, 0, "branch predictor lookups"),
    ("branch-load-misses", 5, 0, 1, "branch predictor misses"),
    ("node-loads", 6, 0, 0, "local NUMA node memory loads"),
    (
        "node-load-misses",
        6,
        0,
        1,
        "loads served by another NUMA node",
    ),
];

/// Every generic event perf knows by name, in perf's order.
pub fn generic_events() -> Vec<Generic> {
    let mut out = Vec::new();
    for &(name, aliases, config, description) in HARDWARE {
        out.push(Generic {
            name: name.to_owned(),
            aliases,
            spec: EventSpec {
                type_: PERF_TYPE_HARDWARE,
                config,
                ..EventSpec::default()
            },
            kind: "hardware",
            description: description.to_owned(),
        });
    }
    for &(name, aliases, config, description) in SOFTWARE {
        out.push(Generic {
            name: name.to_owned(),
            aliases,
            spec: EventSpec {
                type_: PERF_TYPE_SOFTWARE,
                config,
                ..EventSpec::default()
            },
            kind: "software",
            description: description.to_owned(),
        });
    }
    for &(name, cache, op, result, description) in HW_CACHE {
        out.push(Generic {
            name: name.to_owned(),
            aliases: &[],
            spec: EventSpec {
                type_: PERF_TYPE_HW_CACHE,
                config: cache | (op << 8) | (result << 16),
                ..EventSpec::default()
            },
            kind: "hw_cache",
            description: description.to_owned(),
        });
    }
    out
}

/// A PMU listed in sysfs.
#[derive(Debug, Clone)]
pub struct Pmu {
    pub name: String,
    pub dir: PathBuf,
    /// The `type` perf_event_open expects for its events.
    pub type_: u32,
}

/// Every PMU under `root` (normally [`PMU_ROOT`]), sorted by name.
pub fn pmus(root: &Path) -> Vec<Pmu> {
    let Ok(entries) = fs::read_dir(root) else {
        return Vec::new();
    };
    let mut out: Vec<Pmu> = entries
        .filter_map(Result::ok)
        .filter_map(|e| pmu_at(root, &e.file_name().to_string_lossy()))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The PMU `name` under `root`, if sysfs lists it (reads its `type` only).
pub fn pmu_at(root: &Path, name: &str) -> Option<Pmu> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return None;
    }
    let dir = root.join(name);
    let type_ = fs::read_to_string(dir.join("type"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Pmu {
        name: name.to_owned(),
        dir,
        type_,
    })
}

/// A PMU's named events: (name, encoding as written in sysfs, e.g.
/// `event=0x08,umask=0x10`), sorted by name.
pub fn pmu_events(pmu: &Pmu) -> Vec<(String, String)> {
    let Ok(entries) = fs::read_dir(pmu.dir.join("events")) else {
        return Vec::new();
    };
    let mut out: Vec<(String, String)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            // Side files describe an event: its unit, scale, per-package flag.
            if name.contains('.')
                && [".unit", ".scale", ".per-pkg", ".snapshot"]
                    .iter()
                    .any(|s| name.ends_with(s))
            {
                return None;
            }
            let text = fs::read_to_string(e.path()).ok()?;
            Some((name, text.trim().to_owned()))
        })
        .collect();
    out.sort();
    out
}

/// Parses a number the way perf writes them: `0x1f`, `31`.
fn parse_number(text: &str) -> Option<u64> {
    let t = text.trim();
    match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => t.parse().ok(),
    }
}

/// Places `value` into `spec` according to a sysfs format description such
/// as `config:0-7`, `config1:0-63` or `config:0-7,32-35`.
fn apply_format(spec: &mut EventSpec, format: &str, value: u64, term: &str) -> Result<(), String> {
    let (field, ranges) = format
        .trim()
        .split_once(':')
        .ok_or_else(|| format!("format of {term} is not understood: {format:?}"))?;
    let target = match field {
        "config" => &mut spec.config,
        "config1" => &mut spec.config1,
        "config2" => &mut spec.config2,
        _ => return Err(format!("{term} is set in {field}, which is not supported")),
    };
    let mut rest = value;
    for range in ranges.split(',') {
        let (lo, hi) = match range.split_once('-') {
            Some((lo, hi)) => (lo.trim().parse::<u32>(), hi.trim().parse::<u32>()),
            None => (range.trim().parse::<u32>(), range.trim().parse::<u32>()),
        };
        let (Ok(lo), Ok(hi)) = (lo, hi) else {
            return Err(format!("format of {term} is not understood: {format:?}"));
        };
        if hi < lo || hi > 63 {
            return Err(format!("format of {term} is not understood: {format:?}"));
        }
        let width = hi - lo + 1;
        let mask = if width == 64 {
            u64::MAX
        } else {
            (1u64 << width) - 1
        };
        *target |= (rest & mask) << lo;
        rest = if width == 64 { 0 } else { rest >> width };
    }
    if rest != 0 {
        return Err(format!(
            "value {value:#x} does not fit in {term} ({format})"
        ));
    }
    Ok(())
}

/// Builds the attribute for `terms` (e.g. `event=0x08,umask=0x20` or an
/// event name of the PMU, `dtlb_load_misses.walk_duration`) of `pmu`, from
/// its sysfs `format/` and `events/` files.
pub fn pmu_spec(pmu: &Pmu, terms: &str) -> Result<EventSpec, String> {
    let mut spec = EventSpec {
        type_: pmu.type_,
        ..EventSpec::default()
    };
    apply_terms(pmu, terms, &mut spec, 0)?;
    Ok(spec)
}

/// Terms perf accepts in `pmu/.../` that set sampling or naming, not the
/// event: ignored when building a counting event.
const PSEUDO_TERMS: &[&str] = &[
    "period",
    "freq",
    "name",
    "percore",
    "metric-id",
    "call-graph",
    "stack-size",
    "time",
    "inherit",
    "no-inherit",
    "overwrite",
    "no-overwrite",
    "max-stack",
];

fn apply_terms(pmu: &Pmu, terms: &str, spec: &mut EventSpec, depth: u32) -> Result<(), String> {
    if depth > 4 {
        return Err(format!(
            "event {terms:?} of PMU {} refers to itself",
            pmu.name
        ));
    }
    for term in terms.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (key, value) = match term.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (term, None),
        };
        // perf's own settings, not part of the event's encoding.
        if PSEUDO_TERMS.contains(&key) {
            continue;
        }
        if let ("config" | "config1" | "config2", Some(v)) = (key, value) {
            let v = parse_number(v)
                .ok_or_else(|| format!("{key}={v} in PMU {}: not a number", pmu.name))?;
            match key {
                "config" => spec.config |= v,
                "config1" => spec.config1 |= v,
                _ => spec.config2 |= v,
            }
            continue;
        }
        let format_file = pmu.dir.join("format").join(key);
        if let Ok(format) = fs::read_to_string(&format_file) {
            let value = match value {
                None => 1,
                Some(v) => parse_number(v).ok_or_else(|| {
                    format!(
                        "{key}={v} in PMU {}: the value must be a number (sysfs writes ? where the user must choose one)",
                        pmu.name
                    )
                })?,
            };
            apply_format(spec, &format, value, key)?;
            continue;
        }
        let event_file = pmu.dir.join("events").join(key);
        match (fs::read_to_string(&event_file), value) {
            (Ok(text), None) => apply_terms(pmu, text.trim(), spec, depth + 1)?,
            _ => {
                return Err(format!(
                    "PMU {} has no format term or event named {key} (see {}/format and {}/events)",
                    pmu.name,
                    pmu.dir.display(),
                    pmu.dir.display()
                ))
            }
        }
    }
    Ok(())
}

/// An event name resolved to an attribute.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub spec: EventSpec,
    /// Where it came from, for messages: `generic hw_cache`, `PMU cpu`, `raw`.
    pub source: String,
    /// `hardware`, `software`, `hw_cache`, `raw`, `tracepoint` or `pmu`.
    pub kind: &'static str,
}

/// Resolves an event as perf writes it: a generic name (`dTLB-load-misses`,
/// `cs`), `pmu/terms/` (`cpu/event=0x08,umask=0x20/`,
/// `cpu/dtlb_load_misses.walk_duration/`), a tracepoint (`tlb:tlb_flush`), a
/// raw `rHEX` code, or a PMU event name found in any PMU's sysfs `events/`
/// (`tlb_flush.dtlb_thread`).
/// `Ok(None)` means the name is well formed but this machine has no such
/// PMU or event.
pub fn resolve(root: &Path, text: &str) -> Result<Option<Resolved>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty event name".into());
    }
    for g in generic_events() {
        if g.name.eq_ignore_ascii_case(text)
            || g.aliases.iter().any(|a| a.eq_ignore_ascii_case(text))
        {
            return Ok(Some(Resolved {
                spec: g.spec,
                source: format!("generic {} event {}", g.kind, g.name),
                kind: g.kind,
            }));
        }
    }
    if let Some((pmu_name, rest)) = text.split_once('/') {
        let terms = rest
            .strip_suffix('/')
            .ok_or_else(|| format!("event {text:?}: expected pmu/terms/ with a closing slash"))?;
        let Some(pmu) = pmu_at(root, pmu_name) else {
            return Ok(None);
        };
        let spec = pmu_spec(&pmu, terms).map_err(|e| format!("event {text:?}: {e}"))?;
        return Ok(Some(Resolved {
            spec,
            source: format!("PMU {} event {terms}", pmu.name),
            kind: "pmu",
        }));
    }
    if let Some((system, name)) = text.split_once(':') {
        let id = kernmlops_sys::tracefs::tracepoint_id(system, name).ok();
        return Ok(id.map(|config| Resolved {
            spec: EventSpec {
                type_: PERF_TYPE_TRACEPOINT,
                config,
                ..EventSpec::default()
            },
            source: format!("tracepoint {text} (id {config})"),
            kind: "tracepoint",
        }));
    }
    if let Some(hex) = text.strip_prefix('r') {
        if !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit()) {
            let config = u64::from_str_radix(hex, 16)
                .map_err(|e| format!("event {text:?}: raw code: {e}"))?;
            return Ok(Some(Resolved {
                spec: EventSpec {
                    type_: PERF_TYPE_RAW,
                    config,
                    ..EventSpec::default()
                },
                source: format!("raw event {config:#x}"),
                kind: "raw",
            }));
        }
    }
    // A PMU event name: look for the file (a stat, not an open) before
    // reading anything, since a probe resolves names while others may
    // already be recording file opens.
    let lower = text.to_ascii_lowercase();
    if lower.contains('/') || lower.starts_with('.') {
        return Ok(None);
    }
    let Ok(entries) = fs::read_dir(root) else {
        return Ok(None);
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| root.join(n).join("events").join(&lower).is_file())
        .collect();
    names.sort();
    for name in names {
        let Some(pmu) = pmu_at(root, &name) else {
            continue;
        };
        let spec = pmu_spec(&pmu, &lower).map_err(|e| format!("event {text:?}: {e}"))?;
        return Ok(Some(Resolved {
            spec,
            source: format!("PMU {} event {lower}", pmu.name),
            kind: "pmu",
        }));
    }
    Ok(None)
}

/// Resolves like [`resolve`], then, for a name that is not `pmu/terms/`,
/// with libpfm4's event tables for this CPU: model-specific names such as
/// `tlb_flush.stlb_any`, `TLB_FLUSHES:ALL` or
/// `skl::DTLB_LOAD_MISSES:WALK_DURATION`, in process. `Ok(None)`: no source
/// knows the name here; [`why_missing`] says why.
pub fn resolve_event(root: &Path, text: &str) -> Result<Option<Resolved>, String> {
    if let Some(r) = resolve(root, text)? {
        return Ok(Some(r));
    }
    if text.contains('/') {
        return Ok(None);
    }
    Ok(pfm::resolve(text.trim()).ok())
}

/// Why none of `names` resolves here ([`resolve_event`] gave `None` for
/// each): the PMU sysfs lacks, or what sysfs and libpfm4 lack (with
/// libpfm4's reason where it is more than "not found", and how to get
/// libpfm4 when it is missing).
pub fn why_missing(names: &[String]) -> String {
    let pmus: Vec<&str> = names
        .iter()
        .filter_map(|c| c.split_once('/').map(|(pmu, _)| pmu))
        .collect();
    if !names.is_empty() && pmus.len() == names.len() {
        return format!("{PMU_ROOT} has no PMU {}", pmus.join(" or "));
    }
    let listed = names.join(" or ");
    let lib = match pfm::libpfm() {
        Ok(lib) => lib,
        Err(e) => return format!("{PMU_ROOT} does not list {listed}, and {e}"),
    };
    let pfm_pmus = lib.pmus();
    let pmu_names = pfm_pmus
        .iter()
        .map(|p| p.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let tables = if pfm_pmus.iter().any(|p| p.kind != pfm::PmuKind::OsGeneric) {
        format!("libpfm4's tables for {pmu_names}")
    } else {
        format!(
            "libpfm4 (no event table for this CPU, {}; it has {pmu_names})",
            cpu_model()
        )
    };
    let reasons: Vec<String> = names
        .iter()
        .filter(|n| !n.contains('/'))
        .filter_map(|n| match lib.encode(n.trim()) {
            Err(e) if e.code != pfm::PFM_ERR_NOTFOUND => {
                Some(format!("{n}: {}", lib.strerror(e.code)))
            }
            _ => None,
        })
        .collect();
    let reasons = if reasons.is_empty() {
        String::new()
    } else {
        format!(" (libpfm4: {})", reasons.join("; "))
    };
    format!("neither {PMU_ROOT} nor {tables} list {listed}{reasons}")
}

/// This CPU as `/proc/cpuinfo` names it: `GenuineIntel family 6 model 85`,
/// `AuthenticAMD family 26 model 2`, or the implementer and part on Arm.
pub fn cpu_model() -> String {
    static MODEL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    MODEL.get_or_init(read_cpu_model).clone()
}

fn read_cpu_model() -> String {
    let Ok(text) = fs::read_to_string("/proc/cpuinfo") else {
        return "unknown CPU (/proc/cpuinfo unreadable)".into();
    };
    let field = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_owned())
        })
    };
    match (field("vendor_id"), field("cpu family"), field("model")) {
        (Some(v), Some(f), Some(m)) => format!("{v} family {f} model {m}"),
        _ => match (field("CPU implementer"), field("CPU part")) {
            (Some(i), Some(p)) => format!("CPU implementer {i} part {p}"),
            _ => "unknown CPU".into(),
        },
    }
}

/// What a PMU listed in sysfs counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PmuClass {
    /// The processor's own counters (`cpu`, `cpu_core`, `cpu_atom`,
    /// `armv8_pmuv3_0`, ...): hardware events.
    Cpu,
    /// Kernel-side sources: `software`, `tracepoint`, `breakpoint`,
    /// `kprobe`, `uprobe`.
    Software,
    /// Everything else: uncore, `msr`, `power`, ...
    Other,
}

/// The class of a sysfs PMU: core PMUs have the raw type (x86), a `cpu`
/// name, or a `cpus` file (Arm and hybrid x86); uncore PMUs have `cpumask`.
pub fn pmu_class(pmu: &Pmu) -> PmuClass {
    if ["software", "tracepoint", "breakpoint", "kprobe", "uprobe"].contains(&pmu.name.as_str()) {
        return PmuClass::Software;
    }
    if pmu.type_ == PERF_TYPE_RAW
        || pmu.name == "cpu"
        || pmu.name.starts_with("cpu_")
        || pmu.name.starts_with("armv")
        || pmu.dir.join("cpus").exists()
    {
        return PmuClass::Cpu;
    }
    PmuClass::Other
}

/// How [`try_open`] tried an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenScope {
    /// Every task on this CPU (needs root, `CAP_PERFMON` or a permissive
    /// `perf_event_paranoid`).
    SystemWide { cpu: u32 },
    /// The calling process in user space, what an unprivileged user may
    /// count.
    ThisProcess,
}

impl std::fmt::Display for OpenScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::SystemWide { cpu } => write!(f, "system-wide on CPU {cpu}"),
            Self::ThisProcess => f.write_str("for this process (user space)"),
        }
    }
}

/// The verdict of [`try_open`].
#[derive(Debug)]
pub struct OpenCheck {
    /// `Some(true)`: it opens; `Some(false)`: the kernel cannot count it
    /// here; `None`: it could not be told (privileges).
    pub opens: Option<bool>,
    pub scope: OpenScope,
    /// The kernel's refusal, when it did not open.
    pub error: Option<String>,
}

fn is_privilege_error(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM))
}

/// Whether `spec` opens here, by opening it (and closing it at once): a
/// counting event for every task on the first online CPU, or, where that is
/// not allowed, for this process in user space.
pub fn try_open(spec: &EventSpec) -> OpenCheck {
    let cpu = online_cpus()
        .ok()
        .and_then(|c| c.first().copied())
        .unwrap_or(0);
    let cpu_arg = i32::try_from(cpu).unwrap_or(0);
    let system = match open_attr(spec, -1, cpu_arg, 0, 0) {
        Ok(_) => {
            return OpenCheck {
                opens: Some(true),
                scope: OpenScope::SystemWide { cpu },
                error: None,
            }
        }
        Err(e) if !is_privilege_error(&e) => {
            return OpenCheck {
                opens: Some(false),
                scope: OpenScope::SystemWide { cpu },
                error: Some(e.to_string()),
            }
        }
        Err(e) => e,
    };
    let scope = OpenScope::ThisProcess;
    match open_attr(
        spec,
        0,
        -1,
        ATTR_FLAG_EXCLUDE_KERNEL | ATTR_FLAG_EXCLUDE_HV,
        0,
    ) {
        Ok(_) => OpenCheck {
            opens: Some(true),
            scope,
            error: None,
        },
        Err(e) if is_unsupported(&e) => OpenCheck {
            opens: Some(false),
            scope,
            error: Some(e.to_string()),
        },
        Err(e) => OpenCheck {
            opens: None,
            scope,
            error: Some(format!(
                "system-wide needs root or CAP_PERFMON ({system}); for this process: {e}"
            )),
        },
    }
}

/// Opens a counting event on `cpu` for `pid` (-1: every task; a cgroup
/// folder's descriptor with [`PERF_FLAG_PID_CGROUP`]), enabled at once and
/// reading count, time enabled and time running.
pub fn open_counter(
    spec: &EventSpec,
    pid: i32,
    cpu: i32,
    inherit: bool,
    flags: libc::c_ulong,
) -> io::Result<OwnedFd> {
    let attr_flags = if inherit { ATTR_FLAG_INHERIT } else { 0 };
    open_attr(spec, pid, cpu, attr_flags, flags)
}

/// `perf_event_open` of a counting event with `attr_flags` in the
/// attribute's flag word.
fn open_attr(
    spec: &EventSpec,
    pid: i32,
    cpu: i32,
    attr_flags: u64,
    flags: libc::c_ulong,
) -> io::Result<OwnedFd> {
    let attr = PerfEventAttr {
        type_: spec.type_,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: spec.config,
        config1: spec.config1,
        config2: spec.config2,
        read_format: PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING,
        flags: attr_flags,
        ..PerfEventAttr::default()
    };
    // SAFETY: `attr` is a valid perf_event_attr whose `size` field matches
    // the struct; the kernel reads at most `size` bytes and writes nothing.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            pid,
            cpu,
            -1 as libc::c_int,
            flags | PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::other("fd out of range"))?;
    // SAFETY: the kernel just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// One reading of a counter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    pub count: u64,
    pub time_enabled_ns: u64,
    pub time_running_ns: u64,
}

/// Reads count, time enabled and time running from a counter opened by
/// [`open_counter`].
pub fn read_counter(fd: &OwnedFd) -> io::Result<Reading> {
    use std::os::fd::AsRawFd;
    let mut buf = [0u64; 3];
    // SAFETY: `buf` is 24 writable bytes, the size of this read format.
    let n = unsafe {
        libc::read(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast::<libc::c_void>(),
            std::mem::size_of_val(&buf),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != std::mem::size_of_val(&buf) {
        return Err(io::Error::other(format!("short read of {n} bytes")));
    }
    Ok(Reading {
        count: buf[0],
        time_enabled_ns: buf[1],
        time_running_ns: buf[2],
    })
}

/// Whether an open failed because the machine lacks the event (as opposed
/// to a bad encoding or missing privileges).
pub fn is_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::ENODEV)
    )
}

/// The online CPUs, from `/sys/devices/system/cpu/online` (`0-3,5`).
pub fn online_cpus() -> io::Result<Vec<u32>> {
    let text = fs::read_to_string("/sys/devices/system/cpu/online")?;
    parse_cpu_list(&text)
        .ok_or_else(|| io::Error::other(format!("cannot parse CPU list {:?}", text.trim())))
}

fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<u32>().ok()?..=b.parse::<u32>().ok()?),
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_pmu(dir: &Path) -> Pmu {
        fs::create_dir_all(dir.join("format")).expect("mkdir");
        fs::create_dir_all(dir.join("events")).expect("mkdir");
        fs::write(dir.join("type"), "4\n").expect("write");
        fs::write(dir.join("format/event"), "config:0-7\n").expect("write");
        fs::write(dir.join("format/umask"), "config:8-15\n").expect("write");
        fs::write(dir.join("format/cmask"), "config:24-31\n").expect("write");
        fs::write(dir.join("format/split"), "config1:0-3,8-11\n").expect("write");
        fs::write(
            dir.join("events/dtlb_load_misses.walk_duration"),
            "event=0x08,umask=0x10,cmask=1\n",
        )
        .expect("write");
        fs::write(
            dir.join("events/dtlb_load_misses.walk_duration.scale"),
            "1\n",
        )
        .expect("write");
        Pmu {
            name: "cpu".into(),
            dir: dir.to_owned(),
            type_: 4,
        }
    }

    #[test]
    fn sysfs_terms_build_the_config() {
        let root = std::env::temp_dir().join(format!("kml-perf-events-{}", std::process::id()));
        let pmu = fake_pmu(&root.join("cpu"));
        assert_eq!(
            pmu_spec(&pmu, "event=0x08,umask=0x20").map(|s| s.config),
            Ok(0x2008)
        );
        assert_eq!(
            pmu_spec(&pmu, "dtlb_load_misses.walk_duration").map(|s| s.config),
            Ok(0x0100_1008)
        );
        assert_eq!(pmu_spec(&pmu, "split=0x25").map(|s| s.config1), Ok(0x205));
        assert!(pmu_spec(&pmu, "event=0x1ff").is_err());
        assert!(pmu_spec(&pmu, "umask=?").is_err());
        assert!(pmu_spec(&pmu, "nosuch=1").is_err());
        assert_eq!(
            pmu_spec(&pmu, "event=0xbd,period=100007,umask=0x1").map(|s| s.config),
            Ok(0x1bd)
        );
        assert_eq!(
            pmu_spec(&pmu, "config=0x5300c0,config1=7").map(|s| (s.config, s.config1)),
            Ok((0x5300c0, 7))
        );
        assert_eq!(
            pmu_events(&pmu),
            vec![(
                "dtlb_load_misses.walk_duration".to_owned(),
                "event=0x08,umask=0x10,cmask=1".to_owned()
            )]
        );
        let r = resolve(&root, "cpu/event=0x08,umask=0x20/")
            .expect("parses")
            .expect("found");
        assert_eq!((r.spec.type_, r.spec.config), (4, 0x2008));
        let r = resolve(&root, "DTLB_LOAD_MISSES.WALK_DURATION")
            .expect("parses")
            .expect("found");
        assert_eq!(r.spec.config, 0x0100_1008);
        assert!(resolve(&root, "nopmu/event=1/").expect("parses").is_none());
        assert!(resolve(&root, "cpu/event=1").is_err());
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn generic_names_and_aliases() {
        let root = Path::new("/nonexistent");
        let r = resolve(root, "dTLB-load-misses")
            .expect("ok")
            .expect("found");
        assert_eq!((r.spec.type_, r.spec.config), (PERF_TYPE_HW_CACHE, 0x10003));
        let r = resolve(root, "cs").expect("ok").expect("found");
        assert_eq!((r.spec.type_, r.spec.config), (PERF_TYPE_SOFTWARE, 3));
        let r = resolve(root, "r01bd").expect("ok").expect("found");
        assert_eq!((r.spec.type_, r.spec.config), (PERF_TYPE_RAW, 0x1bd));
        assert!(resolve(root, "no-such-event").expect("ok").is_none());
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,5\n"), Some(vec![0, 1, 2, 3, 5]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("x"), None);
    }
}
