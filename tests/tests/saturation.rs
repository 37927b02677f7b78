//! No loss on a saturated machine: the `saturation` benchmark's combined
//! load, shortened (CPU hogs outnumbering the CPUs, two `dd` writers, a
//! build and another collector on the disk the collection writes to, under
//! dirty limits lowered to 512 KiB, `perf bench sched pipe`), with the
//! default probes at default settings: `quanta_runtime` must lose nothing,
//! and the drain threads, which only empty rings, are never caught in
//! dirty-page throttling. (Before the writer threads, the same load lost
//! about half of `quanta_runtime`'s events: the drain threads were
//! throttled in a third of the samples.)
//!
//! `KERNMLOPS_SATURATION_RUN_ARGS` adds `kernmlops run` arguments, to see
//! the test fail: `--ring-size 16k` loses events under this load.

use std::process::Command;

use kernmlops_e2e::*;

#[test]
fn root_a_saturated_machine_loses_no_quanta_runtime_event() {
    const NAME: &str = "root_a_saturated_machine_loses_no_quanta_runtime_event";
    if !require_root(NAME) || !require_tool(NAME, "perf") || !require_tool(NAME, "cc") {
        return;
    }
    let _serial = serial();
    ensure_built();
    let bench = artifact_dir().join("saturation");
    assert!(bench.is_file(), "{} was not built", bench.display());
    let extra = std::env::var("KERNMLOPS_SATURATION_RUN_ARGS").unwrap_or_default();
    // 15 s of collection, 2 s for the load to build up and the stop, whose
    // last writes are throttled too, bound the test well under a minute.
    let out = Command::new(&bench)
        .arg("15")
        .arg(kernmlops_bin())
        .arg("--")
        .args(extra.split_whitespace())
        .current_dir(workspace_root())
        .output()
        .expect("running the saturation benchmark");
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "the saturation benchmark failed:\n{stdout}\n{}",
        text(&out.stderr)
    );
    eprintln!("{stdout}");
    let last = stdout.lines().last().expect("a JSON line");
    let runs: serde_json::Value = serde_json::from_str(last).expect("the last line is JSON");
    let run = &runs[0];
    let quanta = &run["tables"]["quanta_runtime"];
    let rows = quanta["rows"].as_u64().expect("quanta_runtime rows");
    assert!(rows > 100_000, "the load made switches to record: {rows}");
    assert_eq!(
        quanta["lost"].as_u64(),
        Some(0),
        "quanta_runtime lost events under the load ({quanta}); the samples point to: {}",
        run["mechanism"]
    );
    assert!(
        run["samples"].as_u64() > Some(0),
        "the drain threads were sampled"
    );
    // The writers did meet the throttling (the load is what it claims).
    assert!(
        run["writer_dirty_throttled"].as_u64() > Some(0),
        "no writer thread was ever throttled: {run}"
    );
    // The drain threads never write, so the kernel never throttles them
    // for the dirty pages the writer made.
    assert_eq!(
        run["dirty_throttled"].as_u64(),
        Some(0),
        "drain threads blocked in dirty-page throttling: {run}"
    );
}
