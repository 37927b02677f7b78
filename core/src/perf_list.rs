//! `kernmlops perf-list`: the performance events of this machine (perf's
//! generic events, every PMU event sysfs lists, and libpfm4's tables for the
//! model-specific PMUs it detects here), each with its PMU, unit masks,
//! encoding, description and whether it opens here, so a user can map a
//! `perf` probe counter to a new machine; and `--resolve`, what one event
//! name becomes here.

use std::path::Path;

use serde::Serialize;

/// The `perf` plugin's event code, shared by source: the host must not
/// depend on a plugin crate, and both must build attributes the same way.
use kernmlops_perf_events as events;

use events::pfm;

/// Where `list` reads PMUs.
pub const PMU_ROOT: &str = events::PMU_ROOT;

/// Everything `perf-list` shows.
#[derive(Debug, Clone, Serialize)]
pub struct Listing {
    /// How many hardware events open here, and why, when none does.
    pub hardware: HardwareSummary,
    /// libpfm4: where it was loaded from and which PMUs it detected, or why
    /// it is unavailable.
    pub libpfm4: LibpfmSummary,
    pub events: Vec<PerfEvent>,
}

/// The hardware events (perf's generic hardware and cache events, and the
/// events of CPU PMUs) and how many of them open here.
#[derive(Debug, Clone, Serialize)]
pub struct HardwareSummary {
    pub listed: usize,
    pub open: usize,
    /// Not tried for lack of privileges.
    pub unchecked: usize,
    /// The CPU PMUs sysfs lists (`cpu`, `cpu_core`, `armv8_pmuv3_0`, ...).
    pub cpu_pmus: Vec<String>,
    /// One line: the count, and why none opens when none does.
    pub summary: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct LibpfmSummary {
    pub available: bool,
    /// The file it was loaded from.
    pub path: Option<String>,
    /// The PMUs it detected here (libpfm4's names).
    pub pmus: Vec<String>,
    /// One line: the above, or why it is unavailable and how to install it.
    pub summary: String,
}

/// A unit mask of a libpfm4 event.
#[derive(Debug, Clone, Serialize)]
pub struct Umask {
    pub name: String,
    pub description: String,
    /// libpfm4's code for it, in hex.
    pub code: String,
    /// Used when the event is named without a unit mask.
    pub default: bool,
}

/// One event of `perf-list`.
#[derive(Debug, Clone, Serialize)]
pub struct PerfEvent {
    /// perf's name (`dTLB-load-misses`), the sysfs event name, or libpfm4's
    /// event name (`TLB_FLUSH`).
    pub name: String,
    /// The PMU it belongs to: `hardware`, `software`, `hw_cache` for
    /// generic events, the sysfs PMU (`cpu`, `msr`, ...), or libpfm4's PMU
    /// (`skl`, `amd64_fam19h_zen4`, ...).
    pub pmu: String,
    /// Where it was found: `generic`, `sysfs` or `libpfm4`.
    pub source: &'static str,
    /// `hardware` (CPU counters), `software` or `other` (uncore, msr, ...).
    pub class: &'static str,
    /// The event's unit masks (libpfm4 events; the choices after `:`).
    pub umasks: Vec<Umask>,
    /// The event's modifiers (libpfm4 events: `e`, `i`, `c`, `u`, `k`, ...).
    pub modifiers: Vec<String>,
    /// `perf_event_attr.type`.
    #[serde(rename = "type")]
    pub type_: u32,
    /// `perf_event_attr.config`, in hex.
    pub config: String,
    /// `config1` and `config2`, in hex, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config1: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config2: Option<String>,
    /// The sysfs encoding (`event=0x08,umask=0x10`), empty otherwise.
    pub encoding: String,
    /// How to name it in `[[probes.perf.events]] event = ...`.
    pub event: String,
    /// Whether a counting event opens here; `None` when it could not be
    /// told (privileges).
    pub supported: Option<bool>,
    /// Where the open was tried: `system-wide on CPU 0` as root, else `for
    /// this process (user space)`.
    pub checked: String,
    /// Why it is not supported (the kernel's or libpfm4's error), if not.
    pub reason: Option<String>,
    /// What it counts (sysfs has no descriptions).
    pub description: String,
}

fn hex(v: u64) -> String {
    format!("{v:#x}")
}

fn nonzero_hex(v: u64) -> Option<String> {
    (v != 0).then(|| hex(v))
}

/// An event with its attribute and the verdict of opening it.
fn entry(
    name: String,
    pmu: String,
    source: &'static str,
    class: &'static str,
    spec: &events::EventSpec,
    check: Result<events::OpenCheck, String>,
) -> PerfEvent {
    let (supported, checked, reason) = match check {
        Ok(c) => (c.opens, c.scope.to_string(), c.error),
        Err(e) => (Some(false), String::new(), Some(e)),
    };
    PerfEvent {
        event: name.clone(),
        name,
        pmu,
        source,
        class,
        umasks: Vec::new(),
        modifiers: Vec::new(),
        type_: spec.type_,
        config: hex(spec.config),
        config1: nonzero_hex(spec.config1),
        config2: nonzero_hex(spec.config2),
        encoding: String::new(),
        supported,
        checked,
        reason,
        description: String::new(),
    }
}

/// perf's generic events.
fn generic() -> Vec<PerfEvent> {
    events::generic_events()
        .into_iter()
        .map(|g| {
            let class = if g.kind == "software" {
                "software"
            } else {
                "hardware"
            };
            let mut e = entry(
                g.name,
                g.kind.to_owned(),
                "generic",
                class,
                &g.spec,
                Ok(events::try_open(&g.spec)),
            );
            e.description = g.description;
            e
        })
        .collect()
}

/// Every event of every PMU sysfs lists under `root`.
fn sysfs(root: &Path) -> Vec<PerfEvent> {
    let mut out = Vec::new();
    for pmu in events::pmus(root) {
        let class = match events::pmu_class(&pmu) {
            events::PmuClass::Cpu => "hardware",
            events::PmuClass::Software => "software",
            events::PmuClass::Other => "other",
        };
        for (name, encoding) in events::pmu_events(&pmu) {
            let (spec, check) = match events::pmu_spec(&pmu, &encoding) {
                Ok(spec) => (spec, Ok(events::try_open(&spec))),
                Err(e) => (
                    events::EventSpec {
                        type_: pmu.type_,
                        ..Default::default()
                    },
                    Err(e),
                ),
            };
            let mut e = entry(name, pmu.name.clone(), "sysfs", class, &spec, check);
            e.event = format!("{}/{}/", pmu.name, e.name);
            e.encoding = encoding;
            out.push(e);
        }
    }
    out
}

/// The events of libpfm4's model-specific PMUs detected here (its `perf`
/// and `perf_raw` PMUs hold perf's generic events, listed already under
/// perf's names).
fn libpfm(lib: &pfm::Libpfm) -> Vec<PerfEvent> {
    let mut out = Vec::new();
    for pmu in lib.pmus() {
        if pmu.kind == pfm::PmuKind::OsGeneric {
            continue;
        }
        let class = if pmu.kind == pfm::PmuKind::Core {
            "hardware"
        } else {
            "other"
        };
        for ev in lib.events(&pmu) {
            // Events whose unit mask must be chosen are tried with the
            // first one.
            let mut name = format!("{}::{}", pmu.name, ev.name);
            let mut encoded = lib.encode(&name);
            if let (Err(e), Some(first)) = (&encoded, ev.umasks.first()) {
                if e.code == pfm::PFM_ERR_UMASK {
                    name = format!("{name}:{}", first.name);
                    encoded = lib.encode(&name);
                }
            }
            let (spec, check) = match encoded {
                Ok(enc) => (enc.spec, Ok(events::try_open(&enc.spec))),
                Err(e) => (events::EventSpec::default(), Err(e.message)),
            };
            let mut e = entry(
                ev.name.clone(),
                pmu.name.clone(),
                "libpfm4",
                class,
                &spec,
                check,
            );
            e.event = name;
            e.description = match &ev.equiv {
                Some(equiv) => format!("{} (same as {equiv})", ev.description),
                None => ev.description.clone(),
            };
            e.umasks = ev
                .umasks
                .iter()
                .map(|u| Umask {
                    name: u.name.clone(),
                    description: u.description.clone(),
                    code: hex(u.code),
                    default: u.is_default,
                })
                .collect();
            e.modifiers = ev.modifiers;
            out.push(e);
        }
    }
    out
}

fn libpfm_summary() -> LibpfmSummary {
    match pfm::libpfm() {
        Ok(lib) => LibpfmSummary {
            available: true,
            path: Some(lib.path().to_owned()),
            pmus: lib.pmus().into_iter().map(|p| p.name).collect(),
            summary: pfm::summary(),
        },
        Err(e) => LibpfmSummary {
            available: false,
            path: None,
            pmus: Vec::new(),
            summary: e.to_owned(),
        },
    }
}

fn hardware_summary(root: &Path, list: &[PerfEvent]) -> HardwareSummary {
    let hardware: Vec<&PerfEvent> = list.iter().filter(|e| e.class == "hardware").collect();
    let open = hardware
        .iter()
        .filter(|e| e.supported == Some(true))
        .count();
    let unchecked = hardware.iter().filter(|e| e.supported.is_none()).count();
    let cpu_pmus: Vec<String> = events::pmus(root)
        .into_iter()
        .filter(|p| events::pmu_class(p) == events::PmuClass::Cpu)
        .map(|p| p.name)
        .collect();
    let listed = hardware.len();
    let cycles = hardware
        .iter()
        .find(|e| e.name == "cpu-cycles")
        .and_then(|e| e.reason.clone())
        .map(|r| format!("; perf_event_open(cpu-cycles): {r}"))
        .unwrap_or_default();
    let summary = if open > 0 {
        format!(
            "hardware events: {open} of {listed} open here (perf's generic hardware and cache events, CPU PMU events)"
        )
    } else if unchecked > 0 {
        format!(
            "hardware events: {listed} listed, {unchecked} not checked: opening them needs root or CAP_PERFMON{cycles}"
        )
    } else if cpu_pmus.is_empty() {
        format!(
            "hardware events: none of {listed} opens here: the kernel drives no CPU PMU (no cpu, cpu_core, cpu_atom or armv* PMU in {}), as in most VMs without a virtual PMU{cycles}",
            root.display()
        )
    } else {
        format!(
            "hardware events: none of {listed} opens here although the kernel has PMU {}{cycles}",
            cpu_pmus.join(", ")
        )
    };
    HardwareSummary {
        listed,
        open,
        unchecked,
        cpu_pmus,
        summary,
    }
}

/// Every generic event, every sysfs PMU event under `root` (normally
/// `/sys/bus/event_source/devices`), and libpfm4's model-specific events,
/// each tried here.
pub fn list(root: &Path) -> Listing {
    let mut list = generic();
    list.extend(sysfs(root));
    if let Ok(lib) = pfm::libpfm() {
        list.extend(libpfm(lib));
    }
    Listing {
        hardware: hardware_summary(root, &list),
        libpfm4: libpfm_summary(),
        events: list,
    }
}

/// Splits comma-joined unit mask names into lines of at most `width`
/// characters (a single longer name gets a line of its own).
fn wrap(names: &[String], width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for (i, n) in names.iter().enumerate() {
        let piece = if i + 1 < names.len() {
            format!("{n},")
        } else {
            n.clone()
        };
        if !line.is_empty() && line.len() + piece.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        line.push_str(&piece);
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

/// The listing as a table, one event a line (long unit mask lists wrap
/// under their column), then the summaries.
pub fn render(listing: &Listing) -> String {
    use std::fmt::Write;
    const UMASK_WIDTH: usize = 36;
    let code = |e: &PerfEvent| {
        if e.encoding.is_empty() {
            format!("{}/{}", e.type_, e.config)
        } else {
            format!("{}/{} ({})", e.type_, e.config, e.encoding)
        }
    };
    let width = |f: &dyn Fn(&PerfEvent) -> usize, header: &str| {
        listing
            .events
            .iter()
            .map(f)
            .max()
            .unwrap_or(0)
            .max(header.len())
    };
    let wn = width(&|e| e.name.len(), "NAME");
    let wp = width(&|e| e.pmu.len(), "PMU");
    let wc = width(&|e| code(e).len(), "TYPE/CONFIG");
    let wu = width(
        &|e| {
            wrap(
                &e.umasks.iter().map(|u| u.name.clone()).collect::<Vec<_>>(),
                UMASK_WIDTH,
            )
            .iter()
            .map(String::len)
            .max()
            .unwrap_or(0)
        },
        "UMASKS",
    )
    .max(1);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<wn$}  {:<wp$}  {:<5}  {:<wc$}  {:<wu$}  DESCRIPTION",
        "NAME", "PMU", "OPENS", "TYPE/CONFIG", "UMASKS"
    );
    for e in &listing.events {
        let opens = match e.supported {
            Some(true) => "yes",
            Some(false) => "no",
            None => "?",
        };
        let names: Vec<String> = e
            .umasks
            .iter()
            .map(|u| {
                if u.default {
                    format!("{}*", u.name)
                } else {
                    u.name.clone()
                }
            })
            .collect();
        let umasks = if names.is_empty() {
            vec!["-".to_owned()]
        } else {
            wrap(&names, UMASK_WIDTH)
        };
        let _ = writeln!(
            out,
            "{:<wn$}  {:<wp$}  {opens:<5}  {:<wc$}  {:<wu$}  {}",
            e.name,
            e.pmu,
            code(e),
            umasks[0],
            e.description
        );
        for more in &umasks[1..] {
            let _ = writeln!(out, "{:<w$}  {more}", "", w = wn + wp + wc + 5 + 6);
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "{}", listing.hardware.summary);
    let _ = writeln!(out, "{}", listing.libpfm4.summary);
    let _ = write!(
        out,
        "\nUse an event in [[probes.perf.events]] event = \"...\" (`--json` gives each event's exact name) or a generic name in [probes.perf] counters.\n\
         UMASKS: the event's unit masks (name one as EVENT:UMASK; * marks the default). sysfs events carry no description.\n\
         OPENS: perf_event_open tried system-wide on one CPU as root, else for this process; \"?\" means it could not be told (privileges).\n\
         `kernmlops perf-list --resolve NAME` shows what one name resolves to here.\n"
    );
    out
}

/// What one event name resolves to here.
#[derive(Debug, Clone, Serialize)]
pub struct Resolution {
    pub name: String,
    /// Where it was found (`generic hardware event cpu-cycles`, `PMU cpu
    /// event ...`, `libpfm4 event skl::TLB_FLUSH:STLB_ANY`).
    pub source: String,
    /// `hardware`, `software`, `hw_cache`, `raw`, `tracepoint` or `pmu`.
    pub kind: String,
    #[serde(rename = "type")]
    pub type_: u32,
    pub config: String,
    pub config1: String,
    pub config2: String,
    pub supported: Option<bool>,
    pub checked: String,
    pub reason: Option<String>,
}

/// Why an event name resolves to nothing here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The name is malformed (the `perf` probe's own message).
    #[error("{0}")]
    Malformed(String),
    /// No source has it; `why` says what each lacks.
    #[error("no event {name:?} here: {why}")]
    Missing { name: String, why: String },
}

/// Resolves `name` the way the `perf` probe does (generic names, sysfs
/// under `root`, tracepoints, raw codes, then libpfm4) and tries to open
/// it. `Err` is one line: the name is malformed, or which sources lack it.
pub fn resolve(root: &Path, name: &str) -> Result<Resolution, ResolveError> {
    let Some(r) = events::resolve_event(root, name).map_err(ResolveError::Malformed)? else {
        return Err(ResolveError::Missing {
            name: name.to_owned(),
            why: events::why_missing(&[name.to_owned()]),
        });
    };
    let check = events::try_open(&r.spec);
    Ok(Resolution {
        name: name.to_owned(),
        source: r.source,
        kind: r.kind.to_owned(),
        type_: r.spec.type_,
        config: hex(r.spec.config),
        config1: hex(r.spec.config1),
        config2: hex(r.spec.config2),
        supported: check.opens,
        checked: check.scope.to_string(),
        reason: check.error,
    })
}

/// A resolution as two lines of text.
pub fn render_resolution(r: &Resolution) -> String {
    let opens = match (r.supported, &r.reason) {
        (Some(true), _) => format!("yes, {}", r.checked),
        (Some(false), Some(why)) => format!("no, {}: {why}", r.checked),
        (Some(false), None) => format!("no, {}", r.checked),
        (None, why) => format!("not known: {}", why.as_deref().unwrap_or("")),
    };
    let mut code = format!("type {} config {}", r.type_, r.config);
    for (field, value) in [("config1", &r.config1), ("config2", &r.config2)] {
        if value != "0x0" {
            code.push_str(&format!(" {field} {value}"));
        }
    }
    format!(
        "{}: {code} ({}), from {}\nopens here: {opens}\n",
        r.name, r.kind, r.source
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn umask_lists_wrap_at_commas() {
        let names: Vec<String> = ["ALPHA", "BETA", "GAMMA", "DELTA"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        assert_eq!(wrap(&names, 11), ["ALPHA,BETA,", "GAMMA,DELTA"]);
        assert_eq!(wrap(&names, 10), ["ALPHA,", "BETA,", "GAMMA,", "DELTA"]);
        assert_eq!(wrap(&names, 100), ["ALPHA,BETA,GAMMA,DELTA"]);
        assert_eq!(wrap(&[], 10), [""]);
    }
}
