//! collapse_huge_pages on the running kernel: the test maps a 2 MiB-aligned
//! anonymous range, touches it page by page and asks the kernel to collapse
//! it (`madvise(MADV_COLLAPSE)`, Linux 6.1+). The kernel's own account of
//! the range (`AnonHugePages` in `/proc/self/smaps`) says whether it became
//! a huge page; the tables must show that collapse and its PMD scan for
//! this process.

use std::{fs, path::Path};

use kernmlops_e2e::*;

const HUGE: usize = 2 << 20;
const MADV_COLLAPSE: i32 = 25;
const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// Sets THP to `madvise` (small pages on fault, so there is something to
/// collapse) and restores the previous mode when dropped.
struct ThpMode(Option<String>);

impl ThpMode {
    fn madvise() -> Self {
        let text = fs::read_to_string(THP_ENABLED).unwrap_or_default();
        // The active mode is the bracketed one: "always [madvise] never".
        let active = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
            .map(str::to_owned);
        match active {
            Some(mode) if mode != "madvise" => {
                fs::write(THP_ENABLED, "madvise").expect("setting THP to madvise");
                Self(Some(mode))
            }
            _ => Self(None),
        }
    }
}

impl Drop for ThpMode {
    fn drop(&mut self) {
        if let Some(mode) = &self.0 {
            let _ = fs::write(THP_ENABLED, mode);
        }
    }
}

/// `AnonHugePages` in kB of the smaps entry starting at `start`.
fn anon_huge_kb(start: usize) -> Option<u64> {
    let smaps = fs::read_to_string("/proc/self/smaps").ok()?;
    let mut in_range = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ') {
            if let Some((from, _)) = range.split_once('-') {
                if from.chars().all(|c| c.is_ascii_hexdigit()) && !from.is_empty() {
                    in_range = usize::from_str_radix(from, 16).ok() == Some(start);
                    continue;
                }
            }
        }
        if in_range {
            if let Some(rest) = line.strip_prefix("AnonHugePages:") {
                return rest.split_whitespace().next()?.parse().ok();
            }
        }
    }
    None
}

/// Maps 4 MiB, touches the 2 MiB-aligned range inside it, collapses it and
/// returns madvise's result (0 or an errno) and the range's AnonHugePages.
fn collapse_one_huge_page() -> (i32, Option<u64>) {
    // SAFETY: a fresh private anonymous mapping, touched and unmapped only
    // here; the aligned range lies inside it.
    unsafe {
        let len = 2 * HUGE;
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert!(p != libc::MAP_FAILED, "mmap failed");
        let base = p as usize;
        let aligned = (base + HUGE - 1) & !(HUGE - 1);
        // Split the mapping so the aligned range is a VMA of its own.
        if aligned > base {
            libc::munmap(p, aligned - base);
        }
        let end = aligned + HUGE;
        if base + len > end {
            libc::munmap(end as *mut libc::c_void, base + len - end);
        }
        for off in (0..HUGE).step_by(4096) {
            std::ptr::write_volatile((aligned + off) as *mut u8, 1);
        }
        let ret = libc::madvise(aligned as *mut libc::c_void, HUGE, MADV_COLLAPSE);
        let err = if ret == 0 {
            0
        } else {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
        };
        let huge = anon_huge_kb(aligned);
        libc::munmap(aligned as *mut libc::c_void, HUGE);
        (err, huge)
    }
}

#[test]
fn root_collapse_huge_pages_sees_madv_collapse() {
    if !require_root("root_collapse_huge_pages_sees_madv_collapse") {
        return;
    }
    assert!(
        Path::new(THP_ENABLED).exists(),
        "this kernel has no transparent huge pages ({THP_ENABLED})"
    );
    let _serial = serial();
    let _thp = ThpMode::madvise();
    let plugins = plugin_dir(
        "collapse",
        &[("collapse_huge_pages", "collapse_huge_pages")],
    );
    let output = temp_dir("collapse-out");
    let me = std::process::id();
    let c = Collector::start(&[
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "collapse_huge_pages",
        "--tgid",
        &me.to_string(),
        "--output",
        output.to_str().expect("utf8"),
    ]);
    let (err, huge_kb) = collapse_one_huge_page();
    let done = c.signal_and_wait(libc::SIGINT);
    assert!(done.status.success(), "kernmlops failed:\n{}", done.stderr);
    let dir = done.dir.expect("collection folder printed");
    assert_eq!(
        err, 0,
        "madvise(MADV_COLLAPSE) failed with errno {err} (needs Linux 6.1+)"
    );
    assert_eq!(
        huge_kb,
        Some(2048),
        "the kernel did not report the range as one huge page"
    );

    let collapse = read_table(&dir.join("collapse_huge_page.arrow"));
    let tgids = column_u64(&collapse, "tgid");
    let mm_tgids = column_u64(&collapse, "mm_tgid");
    let statuses = column_str(&collapse, "status");
    eprintln!("collapse rows: tgid {tgids:?} mm_tgid {mm_tgids:?} status {statuses:?}");
    let succeeded = (0..tgids.len())
        .filter(|&i| {
            tgids[i] == u64::from(me)
                && mm_tgids[i] == u64::from(me)
                && statuses[i].as_deref() == Some("succeed")
        })
        .count();
    assert_eq!(
        succeeded, 1,
        "one successful collapse by and of this process (pid {me})"
    );
    let isolated = arrow_array::cast::AsArray::as_boolean(
        collapse[0]
            .column_by_name("isolated")
            .expect("an isolated column"),
    )
    .iter()
    .any(|v| v == Some(true));
    assert!(isolated, "a successful collapse isolated its pages");

    let scans = read_table(&dir.join("khugepaged_scan_pmd.arrow"));
    let scan_status = column_str(&scans, "status");
    let scan_mm = column_u64(&scans, "mm_tgid");
    let referenced = column_u64(&scans, "referenced");
    let none_or_zero = column_u64(&scans, "none_or_zero");
    eprintln!(
        "scan rows: status {scan_status:?} referenced {referenced:?} none_or_zero {none_or_zero:?}"
    );
    let scanned = (0..scan_status.len())
        .find(|&i| scan_mm[i] == u64::from(me) && scan_status[i].as_deref() == Some("succeed"));
    let i = scanned.expect("a successful PMD scan of this process");
    assert_eq!(
        none_or_zero[i], 0,
        "every page of the range was touched, none is empty"
    );
    let man = manifest(&dir);
    for table in ["collapse_huge_page", "khugepaged_scan_pmd"] {
        assert_eq!(
            man["tables"][table]["lost_events"], 0,
            "{table} lost events"
        );
    }
}
