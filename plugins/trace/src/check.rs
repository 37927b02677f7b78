//! Which events the settings name (their own, their presets', or the
//! default) and whether this kernel can attach each one's kind: the checks
//! the settings' rules run before anything is created, and `start` again.

use std::path::{Path, PathBuf};

use kernmlops_plugin_sdk::sys::{features, tracefs};

use crate::{
    presets,
    spec::{parse_all, EventSpec, Kind, Target},
    Config, DEFAULT_EVENTS,
};

/// Kinds this probe attaches, for refusals.
pub const WORKING_KINDS: &str =
    "tracepoints (sys:event, tp:), raw_tp:, tp_btf:, uprobe: and uretprobe:";

/// Linux release from which raw tracepoints take a BPF cookie, which
/// `tp_btf:` and `raw_tp:` events need (their slot is the cookie).
const RAW_TP_COOKIE_RELEASE: (u32, u32) = (6, 10);

/// The tracefs folder of tracepoints when this process can read it (root,
/// or tracefs opened to it), else `None`: then only the syntax of events
/// can be checked, and `start` (which needs root) checks the rest.
pub fn readable_tracefs() -> Option<PathBuf> {
    let root = tracefs::tracefs_root()?;
    std::fs::read_dir(root.join("events")).ok()?;
    Some(root)
}

/// Whether tracepoint `system:event` exists under `root`.
pub fn tracepoint_exists(root: &Path, system: &str, event: &str) -> bool {
    root.join("events").join(system).join(event).is_dir()
}

/// The events the settings name, parsed: `events`, then those of each
/// preset (a preset event already named is not repeated; one whose
/// tracepoint `exists` says is missing is left out with a note), then the
/// long form. Without any, [`DEFAULT_EVENTS`].
pub fn event_specs(
    config: &Config,
    exists: &dyn Fn(&str, &str) -> bool,
) -> Result<(Vec<EventSpec>, Vec<String>), String> {
    let mut events = config.events.clone();
    let mut notes = Vec::new();
    for name in &config.presets {
        let preset = presets::find(name)?;
        for event in preset.events {
            if events.iter().any(|e| e == event) {
                continue;
            }
            let spec = crate::spec::parse_event(event).map_err(|e| e.to_string())?;
            let mut needed = Vec::new();
            if let Target::Tracepoint { system, event } = &spec.target {
                needed.push((system.as_str(), event.as_str()));
            }
            if let Some((system, event)) = &spec.exit {
                needed.push((system.as_str(), event.as_str()));
            }
            if let Some((system, tracepoint)) = needed.into_iter().find(|(s, e)| !exists(s, e)) {
                notes.push(format!(
                    "trace preset {name}: this kernel has no tracepoint {system}:{tracepoint}; left out"
                ));
                continue;
            }
            events.push((*event).to_owned());
        }
    }
    if events.is_empty() && config.event.is_empty() && config.presets.is_empty() {
        events = DEFAULT_EVENTS.iter().map(|s| (*s).to_owned()).collect();
    }
    let specs = parse_all(&events, &config.event).map_err(|e| e.to_string())?;
    Ok((specs, notes))
}

/// This kernel's release as (major, minor), from `/proc/sys/kernel/osrelease`.
fn kernel_release() -> Option<(u32, u32)> {
    let text = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let mut parts = text.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Why this kernel cannot attach `spec`'s kind, with what works here, or
/// `None` when it can (kernel functions are refused by the caller, which
/// says what each of their attach paths lacks).
pub fn kind_refusal(spec: &EventSpec) -> Option<String> {
    let refuse = |why: String| {
        Some(format!(
            "trace event {:?}: {why}; what works here: {WORKING_KINDS}",
            spec.text
        ))
    };
    match (&spec.kind, &spec.target) {
        (Kind::TpBtf | Kind::RawTp, _) => {
            let btf = features::btf();
            if spec.kind == Kind::TpBtf && !btf.available {
                return refuse(format!("{}: needs kernel BTF ({})", spec.kind, btf.detail));
            }
            match kernel_release() {
                Some(r) if r < RAW_TP_COOKIE_RELEASE => refuse(format!(
                    "{}: needs Linux {}.{} or later (BPF cookies on raw tracepoints); this is {}.{}",
                    spec.kind, RAW_TP_COOKIE_RELEASE.0, RAW_TP_COOKIE_RELEASE.1, r.0, r.1
                )),
                _ => None,
            }
        }
        (Kind::Uprobe | Kind::Uretprobe, Target::User { path, .. }) => {
            let up = features::uprobes();
            if !up.available {
                return refuse(format!("this kernel cannot attach uprobes ({})", up.detail));
            }
            if !Path::new(path).is_file() {
                return Some(format!(
                    "trace event {:?}: no file {path} to place the uprobe in",
                    spec.text
                ));
            }
            None
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(events: &[&str], presets: &[&str]) -> Config {
        Config {
            events: events.iter().map(|s| (*s).to_owned()).collect(),
            presets: presets.iter().map(|s| (*s).to_owned()).collect(),
            ..Config::default()
        }
    }

    fn tables(specs: &[EventSpec]) -> Vec<&str> {
        specs.iter().map(|s| s.table.as_str()).collect()
    }

    #[test]
    fn nothing_named_traces_the_default() {
        let (specs, notes) = event_specs(&config(&[], &[]), &|_, _| true).expect("specs");
        assert_eq!(tables(&specs), ["sched_process_exec"]);
        assert!(notes.is_empty());
    }

    #[test]
    fn presets_add_their_events_once_and_skip_missing_ones() {
        let has = |system: &str, event: &str| !(system == "sched" && event == "sched_wakeup_new");
        let (specs, notes) =
            event_specs(&config(&["sched:sched_switch"], &["sched"]), &has).expect("specs");
        assert_eq!(
            tables(&specs),
            ["sched_switch", "sched_wakeup", "sched_migrate_task"]
        );
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("sched:sched_wakeup_new"), "{notes:?}");
        let (specs, _) = event_specs(&config(&[], &["syscalls-open"]), &|_, _| true).expect("ok");
        assert_eq!(tables(&specs), ["sys_enter_openat", "sys_exit_openat"]);
    }

    #[test]
    fn an_unknown_preset_lists_the_known_ones() {
        let e = event_specs(&config(&[], &["nope"]), &|_, _| true).expect_err("unknown");
        assert!(e.contains("\"nope\"") && e.contains("sched, block"), "{e}");
    }

    #[test]
    fn the_rules_plan_events_where_tracefs_is_readable() {
        use kernmlops_plugin_sdk::Settings as _;
        let bad = config(&["sched:sched_swich"], &[]);
        let field = config(&["sched:sched_switch(prev_pidd)"], &[]);
        if readable_tracefs().is_some() {
            let e = bad.validate().expect_err("unknown tracepoint");
            assert!(e.contains("nearest in sched: sched_switch"), "{e}");
            let e = field.validate().expect_err("unknown field");
            assert!(e.contains("no field prev_pidd; its fields:"), "{e}");
            let good = config(&["sched:sched_switch"], &["block"]);
            assert_eq!(good.validate(), Ok(()));
        } else {
            // Only the syntax can be checked.
            assert_eq!(bad.validate(), Ok(()));
            assert!(config(&["sched:"], &[]).validate().is_err());
        }
        assert!(config(&[], &["nope"]).validate().is_err());
    }

    #[test]
    fn a_uprobe_on_a_missing_file_is_refused() {
        let spec = crate::spec::parse_event("uprobe:/no/such/binary:main").expect("parses");
        if features::uprobes().available {
            let e = kind_refusal(&spec).expect("refused");
            assert!(e.contains("no file /no/such/binary"), "{e}");
        }
        let spec = crate::spec::parse_event("sched:sched_switch").expect("parses");
        assert_eq!(kind_refusal(&spec), None);
    }
}
