//! The readahead example on the loop device the experiment creates: every
//! run's results row holds the read_ahead_kb read back from the device;
//! the label for sequential reads is a larger read_ahead_kb than the
//! smallest tried, significantly better than it (Holm-corrected p < 0.05 on
//! fio's mean completion latency); the loop device, its
//! mount and its private folder are gone afterwards, also when the
//! experiment is refused after the device was made.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use kernmlops_e2e::*;
use serde_json::Value;

fn experiment(plugins: &Path, args: &[&str]) -> Output {
    experiment_cmd(None, plugins, &[], args)
}

fn example() -> PathBuf {
    workspace_root().join("examples/experiments/readahead.toml")
}

/// The experiments' private device folders, mounts and loop devices now.
fn devices() -> (BTreeSet<String>, usize, usize) {
    let folders = std::fs::read_dir("/var/tmp")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("kernmlops-device-"))
                .collect()
        })
        .unwrap_or_default();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("/kernmlops-device-"))
        .count();
    let loops = Command::new("losetup")
        .args(["--list", "--noheadings", "--output", "BACK-FILE"])
        .output()
        .map(|o| {
            text(&o.stdout)
                .lines()
                .filter(|l| l.contains("/kernmlops-device-"))
                .count()
        })
        .unwrap_or(0);
    (folders, mounts, loops)
}

/// Reads a Parquet file with polars: every row as JSON.
fn rows(path: &Path) -> Vec<Value> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, polars as pl\nprint(json.dumps(pl.read_parquet(sys.argv[1]).to_dicts()))",
        ])
        .arg(path)
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_str(&text(&out.stdout)).expect("rows JSON")
}

#[test]
fn root_readahead_example_labels_sequential_reads_with_a_larger_readahead() {
    let test = "root_readahead_example_labels_sequential_reads_with_a_larger_readahead";
    if !require_root(test)
        || !require_tool(test, "fio")
        || !require_tool(test, "mkfs.ext4")
        || !require_tool(test, "losetup")
        || !require_tool(test, "python3")
    {
        return;
    }
    let plugins = plugin_dir("readahead", &[("workloads", "workloads")]);
    let work = temp_dir("readahead");
    let dir = work.join("exp");
    let before = devices();

    let out = {
        let _serial = serial();
        experiment(
            &plugins,
            &["run", s(&example()), "--dir", s(&dir), "--no-graphs"],
        )
    };
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("30 runs: 30 done"), "{stdout}");
    assert_eq!(devices(), before, "the loop device outlived the experiment");

    // Each row: the device's read_ahead_kb as read back, the variable's.
    let results = rows(&dir.join("results.parquet"));
    assert_eq!(results.len(), 30);
    for r in &results {
        let knob = r
            .as_object()
            .and_then(|m| {
                m.iter().find(|(k, _)| {
                    k.starts_with("machine.block.loop") && k.ends_with(".read_ahead_kb")
                })
            })
            .map(|(_, v)| v.clone());
        assert_eq!(knob.as_ref(), Some(&r["read_ahead_kb"]), "{r}");
        assert!(
            r["result_read_bw_bytes_per_s"]
                .as_f64()
                .is_some_and(|b| b > 0.0),
            "{r}"
        );
    }

    let out = experiment(
        &plugins,
        &[
            "results",
            s(&dir),
            "--no-graphs",
            "--reference",
            "read_ahead_kb=0",
            "--best-by",
            "read_clat_mean_us",
            "--over",
            "read_ahead_kb",
            "--minimize",
        ],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let labels = rows(&dir.join("labels.parquet"));
    let best = labels
        .iter()
        .find(|r| r["pattern"] == "read")
        .map(|r| r["best"].clone())
        .expect("a label for sequential reads");
    assert!(
        best.as_i64().is_some_and(|b| b > 0),
        "sequential reads labelled with read_ahead_kb={best}:\n{stdout}"
    );
    // That level against the smallest: significantly faster, after Holm's
    // correction over every comparison of the figure. The figure is a time
    // (fio's mean completion latency), not a bandwidth: a run that gets
    // the machine to itself is a bounded outlier in time but an unbounded
    // one in bandwidth, which would swamp a test on means.
    let comparisons = rows(&dir.join("comparisons.parquet"));
    let row = comparisons
        .iter()
        .find(|r| {
            r["pattern"] == "read"
                && r["read_ahead_kb"] == best
                && r["figure"] == "read_clat_mean_us"
        })
        .expect("the comparison row");
    assert!(
        row["p_holm"].as_f64().is_some_and(|p| p < 0.05),
        "{row}\n{stdout}"
    );
    assert!(row["ratio"].as_f64().is_some_and(|r| r < 1.0), "{row}");

    // Refused after the device was made (a scheduler the device does not
    // offer): one error line, and the device is gone.
    let bad = work.join("bad.toml");
    let text_bad = std::fs::read_to_string(example()).expect("example")
        + "\n[variables.sched]\nkey = \"device.scheduler\"\nvalues = [\"no-such-scheduler\"]\n";
    std::fs::write(&bad, text_bad).expect("bad file");
    let out = experiment(
        &plugins,
        &["run", s(&bad), "--dir", s(&work.join("bad")), "--no-graphs"],
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "accepted: {stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.starts_with("warning:"))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].starts_with("error:") && errors[0].contains("no-such-scheduler"),
        "{stderr}"
    );
    assert!(!work.join("bad").exists(), "nothing written");
    assert_eq!(devices(), before, "the loop device outlived the refusal");
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}
