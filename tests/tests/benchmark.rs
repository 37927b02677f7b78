//! Collections around a workload: the run lasts the benchmark's lifetime,
//! is classified `curated`, `baseline` or `failed` (with its data kept), a
//! benchmark that cannot run is refused before anything is collected, and
//! nothing the workload started is left running.

use std::path::{Path, PathBuf};

use kernmlops_e2e::*;

fn config(dir: &Path, script: &str) -> PathBuf {
    let file = dir.join("bench.toml");
    std::fs::write(&file, format!("[benchmarks.shell]\nscript = {script:?}\n")).expect("write");
    file
}

/// Processes whose command line contains `needle`.
fn processes_with(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(needle)
                })
                .unwrap_or(false)
        })
        .collect()
}

fn run_with(name: &str, script: &str, extra: &[&str]) -> (Finished, PathBuf) {
    let plugins = plugin_dir(name, &[("fixture_faulty", "faulty")]);
    let work = temp_dir(&format!("{name}-work"));
    let cfg = config(&work, script);
    let output = work.join("out");
    let mut args = vec![
        "--config",
        cfg.to_str().expect("utf8"),
        "run",
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--benchmark",
        "shell",
        "--output",
        output.to_str().expect("utf8"),
    ];
    args.extend_from_slice(extra);
    let out = kernmlops(&args);
    let stdout = text(&out.stdout);
    let dir = stdout.lines().find_map(|l| {
        l.strip_prefix("collection ")?
            .split_once(" in ")
            .map(|(_, d)| PathBuf::from(d.trim()))
    });
    (
        Finished {
            status: out.status,
            stdout,
            stderr: text(&out.stderr),
            dir: dir.clone(),
        },
        output,
    )
}

#[test]
fn root_successful_benchmark_gives_curated_data_for_its_lifetime() {
    if !require_root("root_successful_benchmark_gives_curated_data_for_its_lifetime") {
        return;
    }
    let _serial = serial();
    let (done, _) = run_with("bench-ok", "sleep 1.5", &["--plugins", "ticker"]);
    assert!(done.status.success(), "{}\n{}", done.stdout, done.stderr);
    assert!(
        done.stdout.contains("run class: curated"),
        "{}",
        done.stdout
    );
    let dir = done.dir.expect("collection folder");
    let man = manifest(&dir);
    assert_eq!(man["run_class"], "curated");
    assert_eq!(man["benchmark"]["name"], "shell");
    assert_eq!(man["benchmark"]["exit_code"], 0);
    let start = man["benchmark"]["start_uptime_us"].as_u64().expect("start");
    let end = man["benchmark"]["end_uptime_us"].as_u64().expect("end");
    assert!(
        (1_400_000..4_000_000).contains(&(end - start)),
        "the run lasted the benchmark: {} us",
        end - start
    );
    let ts = column_u64(&read_table(&dir.join("ticker.arrow")), "ts_uptime_us");
    assert!(
        !ts.is_empty()
            && ts
                .iter()
                .all(|&t| t >= start.saturating_sub(1_000_000) && t <= end + 1_000_000)
    );
}

#[test]
fn root_failing_benchmark_lands_in_failed_with_its_data() {
    if !require_root("root_failing_benchmark_lands_in_failed_with_its_data") {
        return;
    }
    let _serial = serial();
    let (done, _) = run_with("bench-fail", "sleep 0.5; exit 3", &["--plugins", "ticker"]);
    assert!(
        !done.status.success(),
        "a failed benchmark must fail the command"
    );
    assert!(
        done.stderr.contains("benchmark shell exited with code 3"),
        "{}",
        done.stderr
    );
    let dir = done.dir.expect("collection folder");
    let man = manifest(&dir);
    assert_eq!(man["run_class"], "failed");
    assert_eq!(man["benchmark"]["exit_code"], 3);
    let rows: usize = read_table(&dir.join("ticker.arrow"))
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert!(rows > 0, "the failed run's data is kept");
}

#[test]
fn root_baseline_runs_without_probes() {
    if !require_root("root_baseline_runs_without_probes") {
        return;
    }
    let _serial = serial();
    let (done, _) = run_with("bench-base", "sleep 0.3", &["--baseline"]);
    assert!(done.status.success(), "{}", done.stderr);
    let man = manifest(&done.dir.expect("collection folder"));
    assert_eq!(man["run_class"], "baseline");
    assert_eq!(man["probes"].as_array().map(Vec::len), Some(0));
}

#[test]
fn root_stopping_early_kills_the_whole_workload() {
    if !require_root("root_stopping_early_kills_the_whole_workload") {
        return;
    }
    let _serial = serial();
    let marker = format!("kml-bench-marker-{}", std::process::id());
    // A workload that forks children which would outlive a plain kill.
    let script = format!("sleep 300 {marker} & sleep 300 {marker} & wait");
    let script = script.replace(
        &format!("sleep 300 {marker}"),
        &format!("sh -c 'sleep 300; : {marker}'"),
    );
    let (done, _) = run_with(
        "bench-kill",
        &script,
        &["--plugins", "ticker", "--duration", "1s"],
    );
    assert!(
        done.status.success(),
        "stopping at --duration is not a failure: {}",
        done.stderr
    );
    let man = manifest(&done.dir.expect("collection folder"));
    assert_eq!(man["benchmark"]["stopped_by"], "duration");
    assert_eq!(man["run_class"], "curated");
    let left = processes_with(&marker);
    assert!(left.is_empty(), "workload processes left running: {left:?}");
}

#[test]
fn benchmark_that_cannot_run_is_refused_before_collecting() {
    let (done, output) = run_with("bench-refuse", "refuse", &["--plugins", "ticker"]);
    assert!(!done.status.success());
    // Refused while the configuration is checked (the plugin's own rules),
    // naming the file and the key.
    assert!(
        done.stderr.starts_with("error: ")
            && done.stderr.contains(
                "bench.toml: benchmarks.shell.script: fixture: shell refuses this script"
            ),
        "{}",
        done.stderr
    );
    assert!(!output.exists(), "nothing may be collected");
    let (unknown, _) = {
        let plugins = plugin_dir("bench-unknown", &[("fixture_faulty", "faulty")]);
        let out = kernmlops(&[
            "run",
            "--plugin-dir",
            plugins.to_str().expect("utf8"),
            "--plugins",
            "ticker",
            "--benchmark",
            "nope",
        ]);
        (text(&out.stderr), out.status)
    };
    assert!(
        unknown.starts_with("error: unknown benchmark \"nope\"")
            && unknown.contains("available: shell"),
        "{unknown}"
    );
}

#[test]
fn root_the_benchmark_cgroup_totals_are_recorded_beside_rusage() {
    if !require_root("root_the_benchmark_cgroup_totals_are_recorded_beside_rusage") {
        return;
    }
    // A grandchild that the benchmark does not wait for (its parent exits
    // at once, so rusage misses it, the cgroup does not) spins a fixed
    // amount of work (about 0.4 s of CPU here), whatever the load; the
    // benchmark ends once it has.
    let script = "f=$(mktemp); \
                  ( (i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; echo done > \"$f\") & ); \
                  until [ -s \"$f\" ]; do sleep 0.05; done; rm -f \"$f\"";
    let _serial = serial();
    let (f, _output) = run_with("cgroup-totals", script, &["--plugins", "ticker"]);
    assert!(f.status.success(), "{}", f.stderr);
    let dir = f.dir.expect("collection");
    let ind: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("indicator.json")).unwrap())
            .unwrap();
    let ru_us = (ind["ru_utime"].as_f64().unwrap() + ind["ru_stime"].as_f64().unwrap()) * 1e6;
    let cg_us = ind["cgroup_cpu_usage_us"]
        .as_u64()
        .expect("cgroup_cpu_usage_us") as f64;
    // The cgroup counts what rusage counts (the waited-for processes) and
    // the grandchild's work besides.
    assert!(
        cg_us >= ru_us * 0.95,
        "cgroup {cg_us} us < rusage {ru_us} us"
    );
    assert!(
        cg_us - ru_us >= 150_000.0,
        "cgroup {cg_us} us - rusage {ru_us} us: the grandchild's work is missing"
    );
    let user = ind["cgroup_cpu_user_us"].as_u64().unwrap();
    let system = ind["cgroup_cpu_system_us"].as_u64().unwrap();
    assert!(
        (user + system).abs_diff(cg_us as u64) <= 2_000,
        "{user} + {system} vs {cg_us}"
    );
    // The same figures in the performance_indicator table, with units.
    let batches = read_table(&dir.join("performance_indicator.arrow"));
    assert_eq!(
        column_u64(&batches, "cgroup_cpu_usage_us"),
        vec![cg_us as u64]
    );
    let schema = batches[0].schema();
    let field = schema.field_with_name("cgroup_cpu_usage_us").unwrap();
    assert_eq!(field.metadata().get("unit").map(String::as_str), Some("us"));
}
