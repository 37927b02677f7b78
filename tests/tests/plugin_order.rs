//! The order of `--plugins` does not change what is recorded: a short idle
//! run with `file_data,perf` and with `perf,file_data` records the same
//! file opens, and no helper process runs (the `perf` probe resolves its
//! events in process, with libpfm4, instead of running `perf list`, which
//! put 34,163 rows in file_data's table here when file_data started first,
//! and 11 the other way round). `process_trace` starts before both, so it
//! would see any program the collector runs. Start-up times are printed.
//!
//! Each run is confined to a fresh cgroup with `--cgroup`, the collector
//! inside it, so the probes see the collector and anything it starts, and
//! not the rest of a busy machine.

use std::path::{Path, PathBuf};

use kernmlops_e2e::*;

/// What one run recorded.
struct Recorded {
    order: String,
    attach_ms: f64,
    /// file_data rows in all, and those of processes other than the
    /// collector (helpers it started).
    file_rows: usize,
    helper_file_rows: usize,
    /// process_trace rows: (name, cap_type).
    process_rows: Vec<(String, String)>,
}

/// `kernmlops run --duration 3s --plugins ORDER --cgroup CG`, started from
/// inside the cgroup so the collector is one of its tasks.
fn run_in_cgroup(order: &str, plugins: &Path, cgroup: &Path, output: &Path) -> Recorded {
    let bin = kernmlops_bin();
    let args = [
        "run",
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        order,
        "--duration",
        "3s",
        "--cgroup",
        cgroup.to_str().expect("utf8"),
        "--output",
        output.to_str().expect("utf8"),
    ];
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec \"$0\" \"$@\"",
        cgroup.display()
    );
    let child = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(&bin)
        .args(args)
        .current_dir(workspace_root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting kernmlops run");
    // sh execs the collector: same process id.
    let collector = u64::from(child.id());
    let out = child.wait_with_output().expect("waiting for kernmlops");
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{order}: kernmlops failed:\n{stderr}");
    let attach_ms: f64 = stderr
        .lines()
        .find_map(|l| {
            l.split_once("(attached in ")?
                .1
                .split_once(" ms)")?
                .0
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("{order}: no \"attached in N ms\" line:\n{stderr}"));
    let dir = PathBuf::from(
        text(&out.stdout)
            .lines()
            .find_map(|l| {
                l.strip_prefix("collection ")?
                    .split_once(" in ")
                    .map(|(_, d)| d.trim().to_owned())
            })
            .unwrap_or_else(|| panic!("{order}: no collection folder printed:\n{stderr}")),
    );
    let files = read_table(&dir.join("file_data.arrow"));
    let tgids = column_u64(&files, "tgid");
    let processes = read_table(&dir.join("process_trace.arrow"));
    let names = column_str(&processes, "name");
    let kinds = column_str(&processes, "cap_type");
    Recorded {
        order: order.to_owned(),
        attach_ms,
        file_rows: tgids.len(),
        helper_file_rows: tgids.iter().filter(|&&t| t != collector).count(),
        process_rows: names
            .into_iter()
            .zip(kinds)
            .map(|(n, k)| (n.unwrap_or_default(), k.unwrap_or_default()))
            .collect(),
    }
}

/// Both orders record file opens within noise of each other, none by a
/// helper process; no `perf` (or any) program is executed in the
/// collector's cgroup. What may differ is the collector's own reads while
/// the probes after file_data start (the perf probe reads sysfs and loads
/// libpfm4: about 15 opens here), so the tolerance is 32 rows; `perf list`
/// processes made tens of thousands.
#[test]
fn root_plugin_order_does_not_change_file_data() {
    let test = "root_plugin_order_does_not_change_file_data";
    if !require_root(test) {
        return;
    }
    let Some(mount) = cgroup2_mount() else {
        assert!(!in_ci(), "{test}: CI needs a cgroup v2 mount");
        eprintln!("SKIP {test}: no cgroup v2 mount");
        return;
    };
    let _serial = serial();
    let plugins = plugin_dir(
        "plugin-order",
        &[
            ("file_data", "file_data"),
            ("perf", "perf"),
            ("process_trace", "process_trace"),
        ],
    );
    let mut runs = Vec::new();
    for (i, order) in [
        "process_trace,file_data,perf",
        "process_trace,perf,file_data",
    ]
    .iter()
    .enumerate()
    {
        let cgroup = mount.join(format!("kml-plugin-order-{}-{i}", std::process::id()));
        std::fs::create_dir_all(&cgroup).expect("creating a cgroup");
        let output = temp_dir(&format!("plugin-order-out-{i}"));
        let r = run_in_cgroup(order, &plugins, &cgroup, &output);
        let _ = std::fs::remove_dir(&cgroup);
        eprintln!(
            "--plugins {}: attached in {:.0} ms; file_data {} rows ({} by other processes than the collector); process_trace {:?}",
            r.order, r.attach_ms, r.file_rows, r.helper_file_rows, r.process_rows
        );
        runs.push(r);
    }
    for r in &runs {
        assert_eq!(
            r.helper_file_rows, 0,
            "--plugins {}: processes other than the collector opened files",
            r.order
        );
        assert!(
            !r.process_rows
                .iter()
                .any(|(name, kind)| name == "perf" || kind == "exec"),
            "--plugins {}: a program was executed during the run: {:?}",
            r.order,
            r.process_rows
        );
    }
    let (a, b) = (runs[0].file_rows, runs[1].file_rows);
    assert!(
        a.abs_diff(b) <= 32,
        "file_data recorded {a} rows with --plugins {} and {b} with --plugins {}",
        runs[0].order,
        runs[1].order
    );
}
