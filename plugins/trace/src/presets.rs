//! Shipped sets of events (`presets = ["sched"]`, `kernmlops run
//! --trace-preset sched`): each a name and the events it adds. An event of
//! a preset that this kernel lacks is left out with a note.

/// One shipped set of events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    pub name: &'static str,
    pub description: &'static str,
    pub events: &'static [&'static str],
}

/// The shipped presets.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "sched",
        description: "context switches, wake-ups and task migrations between CPUs",
        events: &[
            "sched:sched_switch",
            "sched:sched_wakeup",
            "sched:sched_wakeup_new",
            "sched:sched_migrate_task",
        ],
    },
    Preset {
        name: "block",
        description: "block requests issued to the device and completed",
        events: &["block:block_rq_issue", "block:block_rq_complete"],
    },
    Preset {
        name: "syscalls-open",
        description: "openat calls with the file name, and their results",
        events: &[
            "syscalls:sys_enter_openat(dfd, str(filename), flags, mode)",
            "syscalls:sys_exit_openat",
        ],
    },
    Preset {
        name: "mm",
        description: "page allocations and frees, and direct reclaim",
        events: &[
            "kmem:mm_page_alloc",
            "kmem:mm_page_free",
            "vmscan:mm_vmscan_direct_reclaim_begin",
            "vmscan:mm_vmscan_direct_reclaim_end",
        ],
    },
];

/// The names of the shipped presets, comma-separated.
pub fn names() -> String {
    PRESETS
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The preset called `name`, or an error listing the known ones.
pub fn find(name: &str) -> Result<&'static Preset, String> {
    PRESETS.iter().find(|p| p.name == name).ok_or_else(|| {
        format!(
            "unknown trace preset {:?}; the presets are: {}",
            name.chars().take(64).collect::<String>(),
            names()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse_all;

    #[test]
    fn every_preset_parses_with_distinct_tables() {
        let mut all = Vec::new();
        for p in PRESETS {
            assert!(!p.events.is_empty(), "{}", p.name);
            all.extend(p.events.iter().map(|e| (*e).to_owned()));
        }
        // Together too: every table name is distinct across presets.
        parse_all(&all, &[]).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn unknown_preset_lists_the_known_ones() {
        let e = find("schde").expect_err("unknown");
        assert!(e.contains("sched, block, syscalls-open, mm"), "{e}");
        assert!(find("sched").is_ok());
    }
}
