//! collapse_huge_pages: huge page collapse attempts and the PMD scans
//! before them (khugepaged and `madvise(MADV_COLLAPSE)`), from the
//! `mm_collapse_huge_page` and `mm_khugepaged_scan_pmd` tracepoints
//! (`tp_btf`).

use kernmlops_plugin_bpf::{bpf_probe, export_plugin, BpfProbe};

/// One record of the `collapse_huge_page` table.
pub type CollapseEvent = skel::types::collapse_huge_page_event;
/// One record of the `khugepaged_scan_pmd` table.
pub type ScanEvent = skel::types::khugepaged_scan_pmd_event;

/// Labels of `status`: the kernel's `enum scan_result` names without
/// `SCAN_`, lower case, in the order of `COLLAPSE_SCAN_RESULTS` in
/// `collapse_huge_pages.h`, then `unknown`.
pub const STATUSES: &[&str] = &[
    "fail",
    "succeed",
    "pmd_null",
    "pmd_none",
    "pmd_mapped",
    "exceed_none_pte",
    "exceed_swap_pte",
    "exceed_shared_pte",
    "pte_non_present",
    "pte_uffd_wp",
    "pte_mapped_hugepage",
    "lack_referenced_page",
    "page_null",
    "scan_abort",
    "page_count",
    "page_lru",
    "page_lock",
    "page_anon",
    "page_compound",
    "any_process",
    "vma_null",
    "vma_check",
    "address_range",
    "del_page_lru",
    "alloc_huge_page_fail",
    "cgroup_charge_fail",
    "truncated",
    "page_has_private",
    "store_failed",
    "copy_mc",
    "page_filled",
    "page_ro",
    "no_referenced_page",
    "swap_cache_page",
    "page_dirty_or_writeback",
    "unknown",
];

bpf_probe! {
    probe: CollapseHugePages,
    name: "collapse_huge_pages",
    description: "Huge page collapses and PMD scans (khugepaged, MADV_COLLAPSE)",
    tables: [
        collapse_huge_page(collapse_ring, collapse_huge_page_event, rate = 1_000):
            "One row per attempt to collapse a PMD range of small pages into a huge page" {
            ts_uptime_us [us]: "when the attempt ended (CLOCK_BOOTTIME)",
            pid: "thread id of the current task (khugepaged, or the MADV_COLLAPSE caller)",
            tgid: "process id of the current task",
            mm_tgid: "process owning the memory (mm->owner; 0 when the kernel has no mm->owner)",
            isolated as bool: "whether the small pages were isolated for the copy",
            status as label(STATUSES): "result: the kernel's scan_result name (succeed, or why it failed)",
            status_code: "the kernel's scan_result value, as a number",
        },
        khugepaged_scan_pmd(scan_ring, khugepaged_scan_pmd_event, rate = 10_000):
            "One row per PMD range scanned for collapse" {
            ts_uptime_us [us]: "when the scan ended (CLOCK_BOOTTIME)",
            pid: "thread id of the current task (khugepaged, or the MADV_COLLAPSE caller)",
            tgid: "process id of the current task",
            mm_tgid: "process owning the memory (mm->owner; 0 when the kernel has no mm->owner)",
            referenced: "PTEs in the range marked young (recently referenced)",
            none_or_zero: "PTEs in the range that are empty or map the zero page",
            unmapped: "PTEs in the range that are swapped out",
            status as label(STATUSES): "result: the kernel's scan_result name (succeed: worth collapsing)",
            status_code: "the kernel's scan_result value, as a number",
        },
    ],
}

export_plugin! {
    description: "khugepaged and MADV_COLLAPSE huge page collapses and PMD scans",
    probes: [BpfProbe<CollapseHugePages>],
}

#[cfg(test)]
mod tests {
    use super::STATUSES;

    /// The labels follow the header's list, which orders the BPF side's
    /// status indices.
    #[test]
    fn statuses_follow_the_header() {
        let header = include_str!("bpf/collapse_huge_pages.h");
        let from_header: Vec<String> = header
            .split("X(")
            .skip(1)
            .filter_map(|rest| rest.split(')').next())
            .filter_map(|name| name.strip_prefix("SCAN_"))
            .map(str::to_lowercase)
            .chain(std::iter::once("unknown".to_owned()))
            .collect();
        assert_eq!(from_header, STATUSES);
    }
}
