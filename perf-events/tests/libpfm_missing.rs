//! A machine without libpfm4 (the library pointed at a missing file): model
//! specific names do not resolve and the reason says to install libpfm4,
//! while generic, sysfs and tracepoint events resolve as before.

use std::path::Path;

use kernmlops_perf_events::{self as events, pfm};

#[test]
fn without_libpfm_generic_events_still_resolve() {
    // One test in this binary: set before libpfm4 is first looked for.
    std::env::set_var(pfm::PATH_ENV, "/nonexistent/libpfm.so.4");
    let e = pfm::libpfm().expect_err("the file does not exist");
    assert!(e.contains(pfm::INSTALL_HINT), "{e}");
    assert!(e.contains("/nonexistent/libpfm.so.4"), "{e}");

    let root = Path::new(events::PMU_ROOT);
    for name in [
        "cpu-cycles",
        "context-switches",
        "dTLB-load-misses",
        "r01bd",
    ] {
        assert!(
            events::resolve_event(root, name)
                .expect("well formed")
                .is_some(),
            "{name} must resolve without libpfm4"
        );
    }
    assert!(events::resolve_event(root, "tlb_flush.stlb_any")
        .expect("well formed")
        .is_none());
    let why = events::why_missing(&["tlb_flush.stlb_any".to_owned()]);
    assert!(
        why.contains("install libpfm4 to resolve model-specific events")
            && why.contains("tlb_flush.stlb_any"),
        "{why}"
    );
    assert!(pfm::summary().contains(pfm::INSTALL_HINT));
}
