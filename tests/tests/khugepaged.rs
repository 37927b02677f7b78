//! The khugepaged example: it parses and plans (THP mode x scan interval,
//! the interval only where khugepaged has work), and a brief run of it
//! (1 s runs, one repeat) records the interval read back in each row and
//! leaves the THP mode and the interval as they were.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use kernmlops_e2e::*;
use serde_json::Value;

const SCAN: &str = "/sys/kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs";
const ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
const COLUMN: &str = "machine.sysfs.kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs";

fn experiment(plugins: &Path, args: &[&str]) -> Output {
    experiment_cmd(None, plugins, &[], args)
}

fn example() -> PathBuf {
    workspace_root().join("examples/experiments/khugepaged.toml")
}

#[test]
fn root_khugepaged_example_plans_and_runs_briefly() {
    let test = "root_khugepaged_example_plans_and_runs_briefly";
    if !require_root(test) || !require_tool(test, "stress-ng") || !require_tool(test, "python3") {
        return;
    }
    let plugins = plugin_dir("khugepaged", &[("workloads", "workloads")]);
    let work = temp_dir("khugepaged");

    // The example as written: 2 + 2 + 1 combinations x 3 repeats.
    let out = experiment(&plugins, &["run", s(&example()), "--dry-run"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("15 runs (5 combinations)"), "{stdout}");
    assert_eq!(stdout.matches("thp=never").count(), 3, "{stdout}");
    assert!(!stdout.contains("thp=never scan_sleep_ms"), "{stdout}");
    let planned = |label: &str| stdout.lines().filter(|l| l.ends_with(label)).count();
    assert_eq!(planned("thp=always scan_sleep_ms=100"), 3, "{stdout}");
    assert_eq!(planned("thp=madvise scan_sleep_ms=10000"), 3, "{stdout}");

    // Briefly: 1 s runs, one repeat, 64 MiB per worker.
    let brief = work.join("khugepaged.toml");
    let text_brief = std::fs::read_to_string(example())
        .expect("example")
        .replace("repeats = 3", "repeats = 1")
        .replace("timeout = \"5s\"", "timeout = \"1s\"")
        .replace("\"256m\"", "\"64m\"");
    std::fs::write(&brief, text_brief).expect("brief file");
    let (scan_before, enabled_before) = (read_setting(SCAN), read_setting(ENABLED));
    let dir = work.join("exp");
    let out = {
        let _serial = serial();
        experiment(
            &plugins,
            &["run", s(&brief), "--dir", s(&dir), "--no-graphs"],
        )
    };
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("5 runs: 5 done"), "{stdout}");
    assert_eq!(
        read_setting(SCAN),
        scan_before,
        "the scan interval was not restored"
    );
    assert_eq!(
        read_setting(ENABLED),
        enabled_before,
        "the THP mode was not restored"
    );

    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, polars as pl\nprint(json.dumps(pl.read_parquet(sys.argv[1]).to_dicts()))",
        ])
        .arg(dir.join("results.parquet"))
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: Vec<Value> = serde_json::from_str(&text(&out.stdout)).expect("rows");
    assert_eq!(rows.len(), 5);
    for r in &rows {
        // The value read back from the kernel, where the variable applies.
        assert_eq!(r[COLUMN], r["scan_sleep_ms"], "{r}");
        assert_eq!(r["scan_sleep_ms"].is_null(), r["thp"] == "never", "{r}");
        assert!(
            r["result_vm_bogo_ops_per_s"]
                .as_f64()
                .is_some_and(|x| x > 0.0),
            "{r}"
        );
    }
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}
