//! mm_rss_stat: one row per change of an mm's resident-page counters (the
//! kernel's `rss_stat` tracepoint), with the file, anon, swap and shmem page
//! counts of that mm; the changed counter is the value the kernel computed
//! for the event, the other three carried exactly per mm.

use std::{collections::hash_map::RandomState, hash::BuildHasher};

use kernmlops_plugin_bpf::{
    bpf_probe, export_plugin, sdk::NoSettings, BpfHooks, BpfProbe, LoadContext, Open, Result,
};

/// Labels of `member`, indexed by the `MM_RSS_*` values of `mm_rss_stat.h`
/// (the kernel's `MM_FILEPAGES`, `MM_ANONPAGES`, `MM_SWAPENTS`,
/// `MM_SHMEMPAGES`); `unknown` for an index a newer kernel may add.
pub const MEMBERS: &[&str] = &["file", "anon", "swap", "shmem", "unknown"];

/// One record of the `mm_rss_stat` table, generated from `src/bpf/mm_rss_stat.h`.
pub type MmRssStatEvent = skel::types::mm_rss_stat_event;

bpf_probe! {
    probe: MmRssStat,
    name: "mm_rss_stat",
    description: "Per-mm resident page counts (file, anon, swap, shmem) at every rss_stat change",
    hooks: custom,
    tables: [
        // One row per page fault of a program touching fresh memory: the
        // rate a burst reaches, so the ring holds one.
        mm_rss_stat(events, mm_rss_stat_event, rate = 400_000):
            "One row per change of an mm's rss counter, with all four counters of that mm" {
            ts_uptime_us [us]: "when the counter changed (CLOCK_BOOTTIME)",
            pid: "thread id of the task that changed it",
            tgid: "process id of the task that changed it",
            mm_id: "the address space: a keyed hash of the mm's address, unique within a collection",
            member as label(MEMBERS): "the counter that changed: file, anon, swap or shmem",
            file_pages [pages]: "resident file-backed pages (MM_FILEPAGES)",
            anon_pages [pages]: "resident anonymous pages (MM_ANONPAGES)",
            swap_pages [pages]: "swap entries (MM_SWAPENTS)",
            shmem_pages [pages]: "resident shared-memory pages (MM_SHMEMPAGES)",
            estimated: "counters of this row that are not exact: 1 file, 2 anon, 4 swap, 8 shmem; 0 when all four are (see README)",
        },
    ],
}

/// The `mm_rss_stat` probe.
#[derive(Default)]
pub struct MmRssStat;

impl BpfHooks for MmRssStat {
    fn before_load(
        &mut self,
        open: &mut Open<Self>,
        _cx: &mut LoadContext<'_, NoSettings>,
    ) -> Result<()> {
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            // A fresh random key per collection: ids do not reveal kernel
            // addresses and are not comparable across collections.
            ro.mm_id_key = RandomState::new().hash_one(std::process::id());
            // SAFETY: sysconf has no preconditions.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            // Every possible CPU's pending per-CPU delta is summed.
            ro.nr_cpus = kernmlops_plugin_bpf::libbpf_rs::num_possible_cpus()
                .ok()
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(1);
            ro.page_shift = u64::try_from(page)
                .ok()
                .filter(|p| p.is_power_of_two())
                .map_or(12, u64::trailing_zeros);
        }
        Ok(())
    }
}

export_plugin! {
    description: "Per-mm resident page counts (file, anon, swap, shmem) at every rss_stat change",
    probes: [BpfProbe<MmRssStat>],
}
