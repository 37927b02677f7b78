//! libpfm4 as installed on this machine: it loads and initialises, agrees
//! with perf's generic event tables on every generic name it knows, and
//! refuses unknown names with a clear error.

use std::path::Path;

use kernmlops_perf_events::{self as events, pfm};

/// libpfm4, or None (and why) where it is not installed; CI must have it.
fn lib(test: &str) -> Option<&'static pfm::Libpfm> {
    match pfm::libpfm() {
        Ok(lib) => Some(lib),
        Err(e) => {
            assert!(
                std::env::var("CI").is_err(),
                "{test}: CI must install libpfm4 (scripts/setup.sh): {e}"
            );
            eprintln!("SKIP {test}: {e}");
            None
        }
    }
}

#[test]
fn libpfm_initialises_with_perf_generic_pmu() {
    let Some(lib) = lib("libpfm_initialises_with_perf_generic_pmu") else {
        return;
    };
    let pmus = lib.pmus();
    eprintln!("libpfm4 {}: {}", lib.path(), pfm::summary());
    assert!(
        pmus.iter()
            .any(|p| p.name == "perf" && p.kind == pfm::PmuKind::OsGeneric),
        "libpfm4 detected no perf PMU on Linux: {pmus:?}"
    );
    let perf = pmus
        .iter()
        .find(|p| p.name == "perf")
        .expect("perf PMU present");
    let events = lib.events(perf);
    assert_eq!(
        events.len(),
        usize::try_from(perf.nevents).expect("event count"),
        "every event of the perf PMU is listed"
    );
    let dtlb = events
        .iter()
        .find(|e| e.name == "PERF_COUNT_HW_CACHE_DTLB")
        .expect("libpfm4 lists the DTLB cache event");
    let umasks: Vec<&str> = dtlb.umasks.iter().map(|u| u.name.as_str()).collect();
    for u in ["READ", "WRITE", "ACCESS", "MISS"] {
        assert!(umasks.contains(&u), "DTLB lacks unit mask {u}: {umasks:?}");
    }
}

/// Every perf generic name libpfm4 knows encodes to the attribute perf's
/// own tables give, and libpfm4's names for a few of them too.
#[test]
fn libpfm_agrees_with_perf_generic_tables() {
    let Some(lib) = lib("libpfm_agrees_with_perf_generic_tables") else {
        return;
    };
    let generic = events::generic_events();
    let spec_of = |name: &str| {
        generic
            .iter()
            .find(|g| g.name == name)
            .unwrap_or_else(|| panic!("no generic event {name}"))
            .spec
    };
    let mut known = 0;
    for g in &generic {
        match lib.encode(&g.name) {
            Ok(enc) => {
                assert_eq!(
                    (enc.spec.type_, enc.spec.config),
                    (g.spec.type_, g.spec.config),
                    "{}: libpfm4 ({}) and perf's table disagree",
                    g.name,
                    enc.canonical
                );
                known += 1;
            }
            Err(e) => assert_eq!(
                e.code,
                pfm::PFM_ERR_NOTFOUND,
                "{}: libpfm4 failed other than not knowing it: {e}",
                g.name
            ),
        }
    }
    eprintln!(
        "libpfm4 knows {known} of perf's {} generic names",
        generic.len()
    );
    assert!(known * 2 > generic.len(), "libpfm4 knows only {known}");
    for (pfm_name, perf_name) in [
        ("PERF_COUNT_HW_CPU_CYCLES", "cpu-cycles"),
        ("cycles", "cpu-cycles"),
        ("PERF_COUNT_HW_INSTRUCTIONS", "instructions"),
        ("PERF_COUNT_SW_CONTEXT_SWITCHES", "context-switches"),
        ("PERF_COUNT_SW_PAGE_FAULTS", "page-faults"),
        ("PERF_COUNT_HW_CACHE_DTLB:READ:MISS", "dTLB-load-misses"),
        ("PERF_COUNT_HW_CACHE_ITLB:READ:MISS", "iTLB-load-misses"),
    ] {
        let enc = lib
            .encode(pfm_name)
            .unwrap_or_else(|e| panic!("{pfm_name}: {e}"));
        assert_eq!(enc.spec, spec_of(perf_name), "{pfm_name} vs {perf_name}");
    }
    // Through the resolver the probe uses: libpfm4's name is found there.
    let r = events::resolve_event(
        Path::new(events::PMU_ROOT),
        "PERF_COUNT_SW_CONTEXT_SWITCHES",
    )
    .expect("well formed")
    .expect("libpfm4 resolves it");
    assert_eq!(r.spec, spec_of("context-switches"));
    assert_eq!(r.kind, "software");
    assert!(r.source.contains("libpfm4"), "{}", r.source);
    let r = events::resolve_event(Path::new(events::PMU_ROOT), "PERF_COUNT_HW_CPU_CYCLES")
        .expect("well formed")
        .expect("libpfm4 resolves it");
    assert_eq!((r.spec, r.kind), (spec_of("cpu-cycles"), "hardware"));
}

#[test]
fn unknown_event_is_a_clear_error() {
    let Some(lib) = lib("unknown_event_is_a_clear_error") else {
        return;
    };
    let name = "no_such_event_kml";
    let e = lib.encode(name).expect_err("unknown name");
    assert_eq!(e.code, pfm::PFM_ERR_NOTFOUND, "{e}");
    assert!(
        e.message.contains(name) && e.message.contains("not found"),
        "{e}"
    );
    let root = Path::new(events::PMU_ROOT);
    assert!(events::resolve_event(root, name)
        .expect("well formed")
        .is_none());
    let why = events::why_missing(&[name.to_owned()]);
    assert!(
        why.contains(name) && why.contains("libpfm4") && why.contains(events::PMU_ROOT),
        "{why}"
    );
    // A known event with a unit mask it lacks: libpfm4's reason is kept.
    let e = lib
        .encode("PERF_COUNT_HW_CACHE_DTLB:NO_SUCH_UMASK")
        .expect_err("unknown unit mask");
    assert_ne!(e.code, pfm::PFM_ERR_NOTFOUND, "{e}");
    let why = events::why_missing(&["PERF_COUNT_HW_CACHE_DTLB:NO_SUCH_UMASK".to_owned()]);
    assert!(
        why.contains("(libpfm4: PERF_COUNT_HW_CACHE_DTLB:NO_SUCH_UMASK: "),
        "{why}"
    );
}
