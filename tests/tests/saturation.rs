//! No loss on a saturated machine: the `saturation` benchmark's combined
//! load, shortened (CPU hogs outnumbering the CPUs, `dd` filling the page
//! cache of the disk the collection writes to under lowered dirty limits,
//! `perf bench sched pipe`), with the default probes at default settings:
//! `quanta_runtime` must lose nothing, and the drain threads, which only
//! empty rings, are never caught in dirty-page throttling.

use std::process::Command;

use kernmlops_e2e::*;

#[test]
fn root_a_saturated_machine_loses_no_quanta_runtime_event() {
    if !require_root("root_a_saturated_machine_loses_no_quanta_runtime_event")
        || !require_tool(
            "root_a_saturated_machine_loses_no_quanta_runtime_event",
            "perf",
        )
    {
        return;
    }
    let _serial = serial();
    ensure_built();
    let bench = artifact_dir().join("saturation");
    assert!(bench.is_file(), "{} was not built", bench.display());
    // 15 s of collection (plus 2 s for the load to build up) bounds the
    // test well under a minute.
    let out = Command::new(&bench)
        .arg("15")
        .arg(kernmlops_bin())
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
        "quanta_runtime lost events under the load ({}); the samples point to: {}",
        quanta,
        run["mechanism"]
    );
    assert!(
        run["samples"].as_u64() > Some(0),
        "the drain threads were sampled"
    );
    // The drain threads never write, so the kernel never throttles them
    // for the dirty pages the writer made (it did in 1.7-2.3% of samples
    // when they wrote their own files).
    assert_eq!(
        run["dirty_throttled"].as_u64(),
        Some(0),
        "drain threads blocked in dirty-page throttling: {run}"
    );
}
