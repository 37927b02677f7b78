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
    Preset {
        name: "page_cache",
        description: "pages added to and deleted from the page cache, and readahead",
        events: &[
            "filemap:mm_filemap_add_to_page_cache",
            "filemap:mm_filemap_delete_from_page_cache",
            "readahead:page_cache_sync_ra",
            "readahead:page_cache_async_ra",
        ],
    },
    Preset {
        name: "reclaim",
        description: "kswapd, direct and cgroup reclaim, the inactive list shrunk, and compaction",
        events: &[
            "vmscan:mm_vmscan_kswapd_wake",
            "vmscan:mm_vmscan_kswapd_sleep",
            "vmscan:mm_vmscan_direct_reclaim_begin",
            "vmscan:mm_vmscan_direct_reclaim_end",
            "vmscan:mm_vmscan_memcg_reclaim_begin",
            "vmscan:mm_vmscan_memcg_reclaim_end",
            "vmscan:mm_vmscan_lru_shrink_inactive",
            "compaction:mm_compaction_begin",
            "compaction:mm_compaction_end",
        ],
    },
    Preset {
        name: "migration",
        description: "tasks moved between CPUs (load balancing, wake-up placement) and NUMA nodes, and idle CPUs woken without an interrupt",
        events: &[
            "sched:sched_migrate_task",
            "sched:sched_move_numa",
            "sched:sched_swap_numa",
            "sched:sched_wake_idle_without_ipi",
        ],
    },
    Preset {
        name: "cpufreq",
        description: "CPU frequency changes and limits, idle state entries and exits",
        events: &[
            "power:cpu_frequency",
            "power:cpu_frequency_limits",
            "power:cpu_idle",
            "power:cpu_idle_miss",
        ],
    },
    Preset {
        name: "net",
        description: "packets sent by a device, received (queued and processed), and TCP retransmits",
        events: &[
            "net:net_dev_xmit",
            "net:netif_rx",
            "net:netif_receive_skb",
            "tcp:tcp_retransmit_skb(skaddr, state, sport, dport, family, err)",
        ],
    },
    Preset {
        name: "writeback",
        description: "folios dirtied, writeback work started and done, inodes written, and writers throttled",
        events: &[
            "writeback:writeback_dirty_folio",
            "writeback:writeback_start",
            "writeback:writeback_written",
            "writeback:writeback_single_inode",
            "writeback:balance_dirty_pages",
        ],
    },
    Preset {
        name: "syscalls",
        description: "every system call's count and latency per process and syscall number, every 100 ms",
        events: &[
            "raw_syscalls:sys_enter(id) latency exit=raw_syscalls:sys_exit count by=tgid,id",
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
            // An event two presets share is traced once.
            for e in p.events {
                if !all.iter().any(|a| a == e) {
                    all.push((*e).to_owned());
                }
            }
        }
        // Together too: every table name is distinct across presets.
        parse_all(&all, &[]).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn unknown_preset_lists_the_known_ones() {
        let e = find("schde").expect_err("unknown");
        assert!(
            e.contains(
                "sched, block, syscalls-open, mm, page_cache, reclaim, migration, cpufreq, net, writeback, syscalls"
            ),
            "{e}"
        );
        assert!(find("sched").is_ok());
    }
}
