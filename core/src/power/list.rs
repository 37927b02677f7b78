//! `kernmlops power-list`: every installed power source, whether it can be
//! read on this machine (started with the configured settings and read
//! once) and why not, the zones it sees with their scope, socket, measured
//! or modelled and update interval, the refused sources, and whether
//! energy can be attributed to processes.

use std::collections::BTreeMap;

use abi_stable::std_types::RVec;
use serde::Serialize;

use super::{registry::PowerSources, CPU_TIME_PROBE};
use crate::plugin::Registry;

/// One source as listed.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Listed {
    pub name: String,
    pub plugin: String,
    pub description: String,
    /// The declared main scope and update interval.
    pub scope: String,
    pub update_interval_us: u64,
    /// True when it started and every zone was read.
    pub readable: bool,
    /// Why it cannot be used here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub zones: Vec<ListedZone>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ListedZone {
    pub name: String,
    pub scope: String,
    pub socket: Option<u32>,
    pub kind: String,
    pub update_interval_us: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Why this zone could not be read, when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The whole listing.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Listing {
    pub sources: Vec<Listed>,
    pub refused: Vec<RefusedEntry>,
    /// Whether energy can be attributed (the cpu_time probe is installed).
    pub attribution: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RefusedEntry {
    pub name: String,
    pub plugin: String,
    pub reason: String,
}

/// Lists every source, starting each with `settings[name]` (its JSON
/// settings) and reading it once.
pub fn list(registry: &Registry, settings: &BTreeMap<String, serde_json::Value>) -> Listing {
    let installed = PowerSources::of(registry);
    let mut sources = Vec::new();
    for s in &installed.sources {
        let config = settings
            .get(s.name())
            .map_or_else(|| "{}".to_owned(), |v| v.to_string());
        let mut entry = Listed {
            name: s.name().to_owned(),
            plugin: s.plugin.name().to_owned(),
            description: s.decl.description.to_string(),
            scope: s.decl.scope.name().unwrap_or("?").to_owned(),
            update_interval_us: s.decl.update_interval_us,
            readable: false,
            reason: None,
            zones: Vec::new(),
            notes: Vec::new(),
            model: None,
        };
        match s.start(&config) {
            Err(e) => entry.reason = Some(e.to_string()),
            Ok(mut source) => {
                let zones = source.zones().into_vec();
                entry.notes = source.notes().into_iter().map(String::from).collect();
                entry.model = Some(source.model().to_string())
                    .filter(|m| !m.is_empty())
                    .and_then(|m| serde_json::from_str(&m).ok());
                let mut readings = RVec::new();
                let read = source.read(&mut readings).into_result();
                entry.zones = zones
                    .iter()
                    .enumerate()
                    .map(|(i, z)| ListedZone {
                        name: z.name.to_string(),
                        scope: z
                            .scope
                            .name()
                            .map_or_else(|| format!("unknown ({})", z.scope.0), str::to_owned),
                        socket: u32::try_from(z.socket).ok(),
                        kind: if z.measured { "measured" } else { "modelled" }.into(),
                        update_interval_us: z.update_interval_us,
                        parent: Some(z.parent.to_string()).filter(|p| !p.is_empty()),
                        error: match &read {
                            Err(e) => Some(e.to_string()),
                            Ok(()) => readings
                                .get(i)
                                .map(|r| r.error.to_string())
                                .filter(|e| !e.is_empty()),
                        },
                    })
                    .collect();
                match kernmlops_plugin_api::validate_power_zones(&zones) {
                    Err(e) => entry.reason = Some(format!("refused: {e}")),
                    Ok(()) => {
                        entry.readable = entry.zones.iter().all(|z| z.error.is_none());
                        if !entry.readable {
                            entry.reason = Some("a zone cannot be read (see below)".into());
                        }
                    }
                }
            }
        }
        sources.push(entry);
    }
    let attribution = match registry.find_probe(CPU_TIME_PROBE) {
        Some((p, _)) => format!(
            "energy is attributed to processes by on-CPU time from the {CPU_TIME_PROBE} probe (plugin {})",
            p.name()
        ),
        None => format!(
            "energy cannot be attributed to processes: the {CPU_TIME_PROBE} probe is not installed"
        ),
    };
    Listing {
        sources,
        refused: installed
            .refused
            .iter()
            .map(|r| RefusedEntry {
                name: r.name.clone(),
                plugin: r.plugin.clone(),
                reason: r.reason.clone(),
            })
            .collect(),
        attribution,
    }
}

fn interval(us: u64) -> String {
    kernmlops_sys::duration::format_duration(std::time::Duration::from_micros(us))
}

/// The listing as text.
pub fn render(l: &Listing) -> String {
    let mut out = String::new();
    if l.sources.is_empty() {
        out += "no power source is installed (build them with `cargo xtask build-plugins`)\n";
    }
    for s in &l.sources {
        out += &format!("{} (plugin {}): {}\n", s.name, s.plugin, s.description);
        match (&s.reason, s.readable) {
            (_, true) => out += "  readable here\n",
            (Some(r), _) => out += &format!("  not available here: {r}\n"),
            (None, false) => out += "  not available here\n",
        }
        for z in &s.zones {
            out += &format!(
                "  zone {:<20} {:<9} socket {:<3} {:<9} updates every {}{}{}\n",
                z.name,
                z.scope,
                z.socket.map_or_else(|| "-".to_owned(), |s| s.to_string()),
                z.kind,
                interval(z.update_interval_us),
                z.parent
                    .as_ref()
                    .map(|p| format!(", inside {p}"))
                    .unwrap_or_default(),
                z.error
                    .as_ref()
                    .map(|e| format!("; cannot be read: {e}"))
                    .unwrap_or_default(),
            );
        }
        if s.zones.iter().any(|z| z.kind == "modelled") {
            out += "  modelled: an estimate from a model, not a measurement; rows say measured = false\n";
        }
        if let Some(m) = &s.model {
            out += &format!("  model: {m}\n");
        }
        for n in &s.notes {
            out += &format!("  note: {n}\n");
        }
    }
    for r in &l.refused {
        out += &format!("refused: {} (plugin {}): {}\n", r.name, r.plugin, r.reason);
    }
    out += &format!("{}\n", l.attribution);
    out
}
