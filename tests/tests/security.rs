//! Names a local user plants in advance are never followed by root: the
//! benchmarks' old predictable temporary paths (for the next few hundred
//! pids, with the files a benchmark writes there as symlinks to a root-only
//! file), the old temporary names of atomic writes in experiment and
//! collection folders, and 50 concurrent `experiment results` writers of
//! one folder, which must all succeed with readable results.

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use kernmlops_e2e::*;

const NOBODY: &str = "--reuid=65534";

/// Runs `python3 -c script` as user nobody.
fn as_nobody(script: &str) -> Output {
    Command::new("setpriv")
        .args([
            NOBODY,
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            script,
        ])
        .output()
        .expect("running setpriv")
}

/// A root-only file with known content, in a folder of its own that nobody
/// may enter (only root reaches it, through a symlink or not).
fn victim(work: &Path) -> (PathBuf, Vec<u8>) {
    let vault = work.join("vault");
    std::fs::create_dir_all(&vault).expect("vault");
    std::fs::set_permissions(&vault, std::fs::Permissions::from_mode(0o711)).expect("chmod");
    let path = vault.join("root-only");
    let content = b"root's precious bytes\n".repeat(100);
    std::fs::write(&path, &content).expect("victim");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    (path, content)
}

fn assert_unchanged(path: &Path, content: &[u8]) {
    let now = std::fs::read(path).expect("reading the victim");
    assert!(
        now == content,
        "{} was written through a planted symlink ({} bytes now, {} before)",
        path.display(),
        now.len(),
        content.len()
    );
}

/// The last pid the kernel gave out.
fn last_pid() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .expect("ns_last_pid")
}

/// Entries of `dir` whose name starts with `prefix`.
fn entries(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|r| {
            r.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// A fresh benchmark folder: `<prefix>.<16 hex digits>`, a folder of root,
/// mode 0700.
fn assert_private(dir: &Path, prefix: &str) {
    let name = dir
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let suffix = name
        .strip_prefix(prefix)
        .and_then(|s| s.strip_prefix('.'))
        .unwrap_or("");
    assert!(
        suffix.len() == 16 && suffix.chars().all(|c| c.is_ascii_hexdigit()),
        "{}: not a random name",
        dir.display()
    );
    let meta = std::fs::symlink_metadata(dir).expect("meta");
    assert!(meta.is_dir() && meta.uid() == 0, "{}", dir.display());
    assert_eq!(
        meta.mode() & 0o777,
        0o700,
        "{} is not private",
        dir.display()
    );
}

/// Runs `kernmlops run --baseline --benchmark <bench>` while watching
/// `base` for folders named `<prefix>.*`; the folders seen during the run.
fn run_watching(
    plugins: &Path,
    cfg: &Path,
    bench: &str,
    base: &Path,
    prefix: &str,
) -> Vec<PathBuf> {
    let work = cfg.parent().expect("work");
    let mut child = Command::new(kernmlops_bin())
        .arg("--config")
        .arg(cfg)
        .arg("run")
        .arg("--plugin-dir")
        .arg(plugins)
        .args([
            "--baseline",
            "--benchmark",
            bench,
            "--duration",
            "60s",
            "--output",
        ])
        .arg(work.join(format!("out-{bench}")))
        .current_dir(workspace_root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kernmlops run");
    let before = entries(base, &format!("{prefix}."));
    let mut seen: Vec<PathBuf> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        for d in entries(base, &format!("{prefix}.")) {
            if !before.contains(&d) && !seen.contains(&d) {
                assert_private(&d, prefix);
                seen.push(d);
            }
        }
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("kernmlops run --benchmark {bench} still running after 90 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().expect("output");
    assert!(
        out.status.success(),
        "{bench}: {}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    for d in &seen {
        assert!(!d.exists(), "{} left behind", d.display());
    }
    seen
}

#[test]
fn root_benchmarks_never_follow_names_planted_at_their_old_temporary_paths() {
    let test = "root_benchmarks_never_follow_names_planted_at_their_old_temporary_paths";
    if !require_root(test)
        || !require_tool(test, "setpriv")
        || !require_tool(test, "python3")
        || !require_tool(test, "fio")
        || !require_tool(test, "redis-server")
        || !require_tool(test, "redis-benchmark")
    {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("security-bench", &[("workloads", "workloads")]);
    let work = temp_dir("security-bench");
    let (target, content) = victim(&work);
    // As nobody: the old paths for the next 300 pids, each file a benchmark
    // wrote there a symlink to the root-only file.
    let first = last_pid() + 1;
    // One python process plants everything (no fork per file, so the pids
    // planted for stay ahead of the pids used up planting).
    let plant = format!(
        r#"
import os
t = "{t}"
def plant(d, names):
    os.makedirs(d, exist_ok=True)
    for n in names:
        p = os.path.join(d, n)
        if not os.path.lexists(p):
            os.symlink(t, p)
for p in range({first}, {first} + 300):
    for n in (0, 1):
        plant(f"/tmp/kernmlops-redis-{{p}}-{{n}}", ["redis-server.log"])
        plant(f"/var/tmp/kernmlops-fio-{{p}}-{{n}}", ["kernmlops.0.0"])
        for b in ("fio", "redis"):
            plant(f"/tmp/kernmlops-{{b}}-output-{{p}}-{{n}}",
                  ["benchmark.stdout", "benchmark.stderr", "benchmark.fio.json"])
"#,
        t = target.display()
    );
    let planted = as_nobody(&plant);
    let cleanup = || {
        for base in ["/tmp", "/var/tmp"] {
            for d in entries(Path::new(base), "kernmlops-") {
                let owner = std::fs::symlink_metadata(&d).map(|m| m.uid()).unwrap_or(0);
                if owner == 65534 {
                    let _ = std::fs::remove_dir_all(&d);
                }
            }
        }
    };
    if !planted.status.success() {
        cleanup();
        panic!("planting as nobody failed: {}", text(&planted.stderr));
    }

    let cfg = work.join("bench.toml");
    std::fs::write(
        &cfg,
        "[benchmarks.fio]\nsize = \"4m\"\nruntime = \"2s\"\ndirect = false\ndrop_page_cache = false\n\
         [benchmarks.redis]\nrequests = 5000\nclients = 5\ndrop_page_cache = false\n",
    )
    .expect("config");
    let fio = run_watching(
        &plugins,
        &cfg,
        "fio",
        Path::new("/var/tmp"),
        "kernmlops-fio",
    );
    // redis' folder goes where the run's TMPDIR says (the test suite's
    // scratch folder under scripts/test, else /tmp).
    let redis = run_watching(
        &plugins,
        &cfg,
        "redis",
        &std::env::temp_dir(),
        "kernmlops-redis",
    );
    cleanup();
    assert_unchanged(&target, &content);
    assert_eq!(fio.len(), 1, "fio's data folder was not seen: {fio:?}");
    assert_eq!(redis.len(), 1, "redis' folder was not seen: {redis:?}");
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

/// A script benchmark reporting one figure.
const SCRIPT: &str = r#"#!/bin/sh
echo "{\"name\": \"one\", \"component\": \"sh\", \"@result\": {\"value\": $KML_PARAM_N}}"
"#;

/// A small experiment (script benchmark, no probes, 4 runs) in
/// `<work>/exp`, run to its end.
fn small_experiment(work: &Path, plugins: &Path) -> PathBuf {
    let script = work.join("one.sh");
    std::fs::write(&script, SCRIPT).expect("script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let file = work.join("small.toml");
    std::fs::write(
        &file,
        format!(
            "name = \"small\"\nbenchmark = \"script\"\nprobes = []\nrepeats = 2\n\
             [config.benchmarks.script]\ncommand = [{:?}]\ndrop_page_cache = false\n\
             [variables.n]\nvalues = [1, 2]\n",
            script.to_str().expect("utf8")
        ),
    )
    .expect("experiment file");
    let dir = work.join("exp");
    let out = experiment(
        plugins,
        &["run", path(&file), "--dir", path(&dir), "--no-graphs"],
    );
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    dir
}

fn experiment(plugins: &Path, args: &[&str]) -> Output {
    Command::new(kernmlops_bin())
        .arg("--plugin-dir")
        .arg(plugins)
        .arg("experiment")
        .args(args)
        .current_dir(workspace_root())
        .output()
        .expect("running kernmlops experiment")
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Reads both results files with pyarrow; their row counts.
fn pyarrow_rows(dir: &Path) -> (usize, usize) {
    let out = Command::new("python3")
        .arg("-c")
        .arg(
            r#"
import sys, pyarrow.parquet as pq, pyarrow.ipc as ipc
p = pq.read_table(sys.argv[1] + "/results.parquet")
a = ipc.open_file(sys.argv[1] + "/results.arrow").read_all()
assert p.schema.names == a.schema.names, (p.schema.names, a.schema.names)
print(p.num_rows, a.num_rows)
"#,
        )
        .arg(dir)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "pyarrow could not read the results: {}",
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    let mut n = stdout
        .split_whitespace()
        .map(|w| w.parse().expect("a count"));
    (
        n.next().expect("parquet rows"),
        n.next().expect("arrow rows"),
    )
}

#[test]
fn root_planted_temporary_names_in_experiment_and_collection_folders_are_not_followed() {
    let test = "root_planted_temporary_names_in_experiment_and_collection_folders_are_not_followed";
    if !require_root(test) || !require_tool(test, "python3") {
        return;
    }
    let plugins = plugin_dir("security-tmp", &[("workloads", "workloads")]);
    let work = temp_dir("security-tmp");
    let dir = {
        let _serial = serial();
        small_experiment(&work, &plugins)
    };
    let (target, content) = victim(&work);
    // The temporary names the writers used before: planted as symlinks.
    for name in ["results.parquet.tmp", "results.arrow.tmp"] {
        std::os::unix::fs::symlink(&target, dir.join(name)).expect("plant");
    }
    let out = experiment(&plugins, &["results", path(&dir), "--no-graphs"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_unchanged(&target, &content);
    assert_eq!(pyarrow_rows(&dir), (4, 4));
    // A collection's manifest, rewritten by `kernmlops repair`.
    let run = std::fs::read_dir(dir.join("runs"))
        .expect("runs")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.join("manifest.json").is_file())
        .expect("a collection");
    for name in ["manifest.json.tmp", "indicator.json.tmp"] {
        std::os::unix::fs::symlink(&target, run.join(name)).expect("plant");
    }
    let out = kernmlops(&["repair", path(&run)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_unchanged(&target, &content);
    // A table file planted as a symlink is refused by repair, not written.
    std::os::unix::fs::symlink(&target, run.join("planted.arrow")).expect("plant");
    let out = kernmlops(&["repair", path(&run)]);
    assert!(
        text(&out.stdout).contains("symlink") || text(&out.stderr).contains("symlink"),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_unchanged(&target, &content);
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn root_fifty_concurrent_experiment_results_all_succeed() {
    let test = "root_fifty_concurrent_experiment_results_all_succeed";
    if !require_root(test) || !require_tool(test, "python3") {
        return;
    }
    let plugins = plugin_dir("security-results", &[("workloads", "workloads")]);
    let work = temp_dir("security-results");
    let dir = {
        let _serial = serial();
        small_experiment(&work, &plugins)
    };
    let children: Vec<_> = (0..50)
        .map(|_| {
            Command::new(kernmlops_bin())
                .arg("--plugin-dir")
                .arg(&plugins)
                .args(["experiment", "results", path(&dir), "--no-graphs"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let failed: Vec<String> = children
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait"))
        .filter(|o| !o.status.success())
        .map(|o| format!("{}: {}", o.status, text(&o.stderr).trim()))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 50 failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert_eq!(pyarrow_rows(&dir), (4, 4));
    let left: Vec<_> = std::fs::read_dir(&dir)
        .expect("list")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}
