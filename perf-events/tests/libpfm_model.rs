//! Model-specific names resolved in process by libpfm4, on a CPU model
//! forced with `LIBPFM_FORCE_PMU=skl` (Skylake), so the check runs on any
//! machine. The expected codes are Intel's (SDM, Skylake events): TLB_FLUSH
//! is event 0xBD with unit masks 0x01 (DTLB_THREAD) and 0x20 (STLB_ANY);
//! DTLB_LOAD_MISSES.WALK_ACTIVE is event 0x08, unit mask 0x10, cmask 1.

use std::path::Path;

use kernmlops_perf_events::{self as events, pfm};

#[test]
fn skylake_names_resolve_to_intel_codes() {
    // One test in this binary: the variable is set before libpfm4 is
    // loaded, and nothing else runs meanwhile.
    std::env::set_var("LIBPFM_FORCE_PMU", "skl");
    let lib = match pfm::libpfm() {
        Ok(lib) => lib,
        Err(e) => {
            assert!(
                std::env::var("CI").is_err(),
                "CI must install libpfm4 (scripts/setup.sh): {e}"
            );
            eprintln!("SKIP skylake_names_resolve_to_intel_codes: {e}");
            return;
        }
    };
    let skl = lib
        .pmus()
        .into_iter()
        .find(|p| p.name == "skl")
        .expect("LIBPFM_FORCE_PMU=skl makes the skl PMU present");
    assert_eq!(skl.kind, pfm::PmuKind::Core);
    let tlb_flush = lib
        .events(&skl)
        .into_iter()
        .find(|e| e.name == "TLB_FLUSH")
        .expect("skl has TLB_FLUSH");
    let umasks: Vec<&str> = tlb_flush.umasks.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(umasks, ["DTLB_THREAD", "STLB_ANY"]);
    assert!(!tlb_flush.modifiers.is_empty(), "modifiers e, i, c, ...");

    let root = Path::new(events::PMU_ROOT);
    for (name, config) in [
        ("tlb_flush.dtlb_thread", 0x01bd),
        ("tlb_flush.stlb_any", 0x20bd),
        ("TLB_FLUSH:STLB_ANY", 0x20bd),
        ("skl::TLB_FLUSH:DTLB_THREAD", 0x01bd),
        ("dtlb_load_misses.walk_active", 0x0100_1008),
    ] {
        let r = events::resolve_event(root, name)
            .expect("well formed")
            .unwrap_or_else(|| {
                panic!(
                    "{name} does not resolve: {}",
                    events::why_missing(&[name.to_owned()])
                )
            });
        assert_eq!(
            (r.spec.type_, r.spec.config),
            (events::PERF_TYPE_RAW, config),
            "{name} ({})",
            r.source
        );
        assert_eq!(r.kind, "pmu");
        assert!(r.source.contains("skl::"), "{}", r.source);
    }
    // A unit mask Skylake lacks: no resolution, and the reason says so.
    let bad = "TLB_FLUSH:NO_SUCH_UMASK".to_owned();
    assert!(events::resolve_event(root, &bad)
        .expect("well formed")
        .is_none());
    let why = events::why_missing(std::slice::from_ref(&bad));
    assert!(
        why.contains("libpfm4's tables for") && why.contains("skl"),
        "{why}"
    );
}
