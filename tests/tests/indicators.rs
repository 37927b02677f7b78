//! Every benchmark run reports its own result: `kernmlops run --benchmark`
//! with redis, fio and stress_ng writes `<collection>/indicator.json` whose
//! `@result` holds the tool's figures, and the `script` benchmark takes a
//! user's indicator as is (curated) or fails the run with the reason (a
//! key collision, output that is not JSON), its data kept.
//!
//! These tests read what the host writes from the benchmark's `result()`:
//! `indicator.json` (the indicator plus exit code, wall time and rusage)
//! and the manifest's `benchmark.error` for a result that is not valid.

use std::path::{Path, PathBuf};

use kernmlops_e2e::*;

/// Folders a test made, removed when it ends (passed or not).
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// `kernmlops run --benchmark NAME` with `config` as its configuration
/// file and quanta_runtime collecting; returns the run, its collection and
/// the folders to remove.
fn run_benchmark(test: &str, name: &str, config: &str) -> (Finished, PathBuf, Cleanup) {
    let plugins = plugin_dir(
        test,
        &[
            ("quanta_runtime", "quanta_runtime"),
            ("workloads", "workloads"),
        ],
    );
    let work = temp_dir(&format!("{test}-work"));
    let cleanup = Cleanup(vec![plugins.clone(), work.clone()]);
    let cfg = work.join("config.toml");
    std::fs::write(&cfg, config).expect("write config");
    let output = work.join("out");
    let out = kernmlops(&[
        "--config",
        cfg.to_str().expect("utf8"),
        "run",
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "quanta_runtime",
        "--benchmark",
        name,
        "--duration",
        "120s",
        "--output",
        output.to_str().expect("utf8"),
    ]);
    let stdout = text(&out.stdout);
    let dir = stdout.lines().find_map(|l| {
        l.strip_prefix("collection ")?
            .split_once(" in ")
            .map(|(_, d)| PathBuf::from(d.trim()))
    });
    let finished = Finished {
        status: out.status,
        stdout,
        stderr: text(&out.stderr),
        dir: dir.clone(),
    };
    let dir = dir.unwrap_or_else(|| only_collection(&output));
    (finished, dir, cleanup)
}

/// `<collection>/indicator.json`.
fn indicator(dir: &Path) -> serde_json::Value {
    let path = dir.join("indicator.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (the host writes it)", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The run succeeded, is curated, and its indicator's `@result` holds a
/// positive number under each of `keys`; returns the indicator.
fn check_curated(done: &Finished, dir: &Path, name: &str, keys: &[&str]) -> serde_json::Value {
    assert!(done.status.success(), "{}\n{}", done.stdout, done.stderr);
    let man = manifest(dir);
    assert_eq!(man["run_class"], "curated", "{man}");
    let ind = indicator(dir);
    assert_eq!(ind["name"], name, "{ind}");
    let result = ind["@result"].as_object().expect("@result is an object");
    assert!(!result.is_empty(), "empty @result: {ind}");
    for key in keys {
        let v = result
            .get(*key)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or_else(|| panic!("no number {key} in {ind}"));
        assert!(v > 0.0, "{key} = {v}");
    }
    assert_eq!(ind["exit_code"], 0, "{ind}");
    assert!(ind["ru_utime"].is_number(), "no rusage: {ind}");
    // The run's summary shows the same result in one line.
    let line = done
        .stdout
        .lines()
        .find(|l| l.starts_with(&format!("  benchmark {name}: exit 0 after ")))
        .unwrap_or_else(|| panic!("no benchmark line in the summary:\n{}", done.stdout));
    for (key, value) in result {
        let shown = match value {
            serde_json::Value::String(s) => format!("{key} {s}"),
            v => format!("{key} {v}"),
        };
        assert!(line.contains(&shown), "{shown:?} is not in {line:?}");
    }
    ind
}

#[test]
fn root_redis_run_writes_its_requests_per_second() {
    if !require_root("root_redis_run_writes_its_requests_per_second")
        || !require_tool(
            "root_redis_run_writes_its_requests_per_second",
            "redis-server",
        )
        || !require_tool(
            "root_redis_run_writes_its_requests_per_second",
            "redis-benchmark",
        )
    {
        return;
    }
    let _serial = serial();
    let (done, dir, _cleanup) = run_benchmark(
        "ind-redis",
        "redis",
        "[benchmarks.redis]\nrequests = 20000\nclients = 10\ntests = \"set,get\"\n",
    );
    let ind = check_curated(
        &done,
        &dir,
        "redis",
        &[
            "set_rps",
            "get_rps",
            "set_p50_latency_ms",
            "get_p99_latency_ms",
        ],
    );
    assert_eq!(ind["component"], "redis");
    assert_eq!(ind["@parameters"]["requests"], 20000);
    // redis-benchmark's CSV is kept beside the tables.
    let csv = std::fs::read_to_string(dir.join("benchmark.stdout")).expect("benchmark.stdout");
    assert!(csv.starts_with("\"test\",\"rps\""), "{csv}");
}

#[test]
fn root_fio_run_writes_fio_own_iops() {
    if !require_root("root_fio_run_writes_fio_own_iops")
        || !require_tool("root_fio_run_writes_fio_own_iops", "fio")
    {
        return;
    }
    let _serial = serial();
    let (done, dir, _cleanup) = run_benchmark(
        "ind-fio",
        "fio",
        "[benchmarks.fio]\nrw = \"randread\"\nsize = \"8m\"\nruntime = \"2s\"\n",
    );
    let ind = check_curated(
        &done,
        &dir,
        "fio",
        &["read_iops", "read_bw_bytes_per_s", "read_clat_p99_us"],
    );
    // The same IOPS as fio's own JSON report, kept in the collection.
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("benchmark.fio.json")).expect("benchmark.fio.json"),
    )
    .expect("fio's JSON");
    assert_eq!(
        ind["@result"]["read_iops"],
        report["jobs"][0]["read"]["iops"]
    );
    assert_eq!(ind["@parameters"]["rw"], "randread");
}

#[test]
fn root_stress_ng_run_writes_bogo_ops() {
    if !require_root("root_stress_ng_run_writes_bogo_ops")
        || !require_tool("root_stress_ng_run_writes_bogo_ops", "stress-ng")
    {
        return;
    }
    let _serial = serial();
    let (done, dir, _cleanup) = run_benchmark(
        "ind-stress-ng",
        "stress_ng",
        "[benchmarks.stress_ng]\nstressor = \"cpu\"\nworkers = 1\ntimeout = \"2s\"\n",
    );
    let ind = check_curated(
        &done,
        &dir,
        "stress_ng",
        &["cpu_bogo_ops", "cpu_bogo_ops_per_s"],
    );
    assert_eq!(ind["component"], "stress-ng");
}

/// A shell script printing `stdout_line` (and a line on stderr), as the
/// command of a `script` run.
fn script_config(work: &Path, stdout_line: &str) -> String {
    let script = work.join("bench.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"working on $KML_PARAM_SIZE\" >&2\ncat <<'EOF'\n{stdout_line}\nEOF\n"
        ),
    )
    .expect("write script");
    let status = std::process::Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()
        .expect("chmod");
    assert!(status.success());
    format!(
        "[benchmarks.script]\ncommand = [{:?}]\n[benchmarks.script.parameters]\nsize = 3\n",
        script.to_str().expect("utf8")
    )
}

#[test]
fn root_script_runs_are_curated_or_failed_by_their_indicator() {
    if !require_root("root_script_runs_are_curated_or_failed_by_their_indicator") {
        return;
    }
    let _serial = serial();
    // (case, stdout, curated?, reason in the manifest when failed)
    for (case, stdout, reason) in [
        (
            "valid",
            r#"{"name": "shell", "component": "sh", "@parameters": {"mode": "fast"}, "@result": {"rate_per_s": 12.5, "unit": "items"}}"#,
            None,
        ),
        (
            "collision",
            r#"{"name": "shell", "component": "sh", "@parameters": {"n": 1}, "@result": {"n": 2}}"#,
            Some("\"n\" is in both"),
        ),
        ("garbage", "this is not JSON", Some("not one JSON object")),
    ] {
        let test = format!("ind-script-{case}");
        let work = temp_dir(&format!("{test}-script"));
        let _script_dir = Cleanup(vec![work.clone()]);
        let config = script_config(&work, stdout);
        let (done, dir, _cleanup) = run_benchmark(&test, "script", &config);
        // The script's standard error is kept whatever its result.
        let stderr = std::fs::read_to_string(dir.join("benchmark.stderr"))
            .unwrap_or_else(|e| panic!("{case}: benchmark.stderr: {e}"));
        assert_eq!(stderr, "working on 3\n", "{case}");
        let man = manifest(&dir);
        match reason {
            None => {
                let ind = check_curated(&done, &dir, "shell", &["rate_per_s"]);
                assert_eq!(ind["@result"]["unit"], "items");
                assert_eq!(ind["@parameters"]["mode"], "fast");
                assert_eq!(
                    ind["@parameters"]["size"], 3,
                    "the configured parameter is added"
                );
            }
            Some(reason) => {
                assert!(!done.status.success(), "{case}: {}", done.stdout);
                assert_eq!(man["run_class"], "failed", "{case}: {man}");
                assert!(
                    done.stdout.lines().any(|l| l.starts_with("  benchmark ")
                        && l.ends_with("no usable result (see the message above)")),
                    "{case}: {}",
                    done.stdout
                );
                let error = man["benchmark"]["error"].as_str().unwrap_or_default();
                assert!(
                    error.contains(reason),
                    "{case}: the manifest's benchmark error {error:?} lacks {reason:?}: {man}"
                );
                let rows: usize = read_table(&dir.join("quanta_runtime.arrow"))
                    .iter()
                    .map(|b| b.num_rows())
                    .sum();
                assert!(rows > 0, "{case}: the failed run's data is kept");
            }
        }
    }
}
