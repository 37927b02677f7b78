//! Experiments end to end, with the shipped example files: a 2x2 fio sweep
//! with 2 repeats (8 collections, results in polars agreeing with fio's
//! own JSON, bigger blocks giving more bandwidth), a conditional variable
//! planning exactly its runs and leaving its column null where it does not
//! apply, resume after SIGKILL redoing only what is missing, and bad input
//! as one error line.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use kernmlops_e2e::*;
use serde_json::Value;

/// A plugin folder with what experiments use: the workloads (fio,
/// stress_ng, script), quanta_runtime and process_trace (the default
/// probes), and the graphs.
fn plugins(test: &str) -> PathBuf {
    plugin_dir(
        test,
        &[
            ("workloads", "workloads"),
            ("quanta_runtime", "quanta_runtime"),
            ("process_trace", "process_trace"),
            ("graphs", "graphs"),
        ],
    )
}

/// `kernmlops --plugin-dir P experiment ARGS`, from the workspace root (the
/// example files name paths relative to it).
fn experiment(plugins: &Path, args: &[&str]) -> Output {
    experiment_cmd(Some(&workspace_root()), plugins, &[], args)
}

fn example(name: &str) -> String {
    workspace_root()
        .join("examples/experiments")
        .join(name)
        .display()
        .to_string()
}

/// Reads `results.parquet` with polars: the dtypes and every row as JSON.
fn read_results(dir: &Path) -> (BTreeMap<String, String>, Vec<Value>) {
    let (dtypes, rows) = polars_results(dir);
    (
        serde_json::from_value(dtypes).expect("dtypes as text"),
        rows,
    )
}

fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn folders(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn root_experiment_fio_sweep_gives_8_collections_and_results_agreeing_with_fio() {
    let test = "root_experiment_fio_sweep_gives_8_collections_and_results_agreeing_with_fio";
    if !require_root(test) || !require_tool(test, "fio") || !require_tool(test, "python3") {
        return;
    }
    let plugins = plugins("experiment-fio");
    let work = temp_dir("experiment-fio");
    let dir = work.join("fio");
    let out = {
        let _serial = serial();
        experiment(
            &plugins,
            &["run", &example("fio_sweep.toml"), "--dir", s(&dir)],
        )
    };
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("8 runs: 8 done"), "{stdout}");

    // 8 collections, one per run, each complete.
    let runs = folders(&dir.join("runs"));
    assert_eq!(runs.len(), 8, "{runs:?}");
    for r in &runs {
        let m = manifest(r);
        assert_eq!(m["status"], "complete", "{}", r.display());
        assert_eq!(m["run_class"], "curated", "{}", r.display());
    }
    // The experiment describes itself.
    for f in ["experiment.toml", "config.toml", "experiment.json"] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    let record = read_json(&dir.join("experiment.json"));
    assert_eq!(record["seed"], 1);
    assert_eq!(record["runs"].as_array().map(Vec::len), Some(8));
    assert!(
        record["plugins"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p["file"] == "workloads.so"
                && p["sha256"].as_str().is_some_and(|h| h.len() == 64))),
        "plugin hashes recorded: {}",
        record["plugins"]
    );

    // results.parquet: 8 rows, typed, read back by polars.
    let (dtypes, rows) = read_results(&dir);
    assert_eq!(rows.len(), 8);
    for (col, want) in [
        ("bs", "String"),
        ("rw", "String"),
        ("repeat", "Int64"),
        ("run_id", "String"),
        ("result_bw_bytes_per_s", "Int64"),
        ("rows_quanta_runtime", "Int64"),
        ("ru_utime", "Float64"),
    ] {
        assert_eq!(
            dtypes.get(col).map(String::as_str),
            Some(want),
            "{col}: {dtypes:?}"
        );
    }
    // IOPS in the results are fio's own figures of that run.
    for row in &rows {
        let run_id = row["run_id"].as_str().expect("run_id");
        let run_dir = dir.join("runs").join(run_id);
        let fio = read_json(&run_dir.join("benchmark.fio.json"));
        let job = &fio["jobs"][0];
        let indicator = read_json(&run_dir.join("indicator.json"));
        for side in ["read", "write"] {
            let in_results = row[format!("result_{side}_iops")].as_f64().expect("iops");
            let from_fio = job[side]["iops"].as_f64().expect("fio iops");
            let from_indicator = indicator["@result"][format!("{side}_iops")]
                .as_f64()
                .expect("indicator iops");
            assert!(
                close(in_results, from_fio),
                "{run_id} {side}: {in_results} vs fio {from_fio}"
            );
            assert!(close(in_results, from_indicator), "{run_id} {side}");
        }
        assert_eq!(row["collection_id"], manifest(&run_dir)["collection_id"]);
        assert!(row["rows_quanta_runtime"].as_i64().is_some_and(|n| n > 0));
    }
    // Bigger blocks move more bytes per second, reading and writing.
    let mean_bw = |bs: &str, rw: &str| {
        let v: Vec<f64> = rows
            .iter()
            .filter(|r| r["bs"] == bs && r["rw"] == rw)
            .filter_map(|r| r["result_bw_bytes_per_s"].as_f64())
            .collect();
        assert_eq!(v.len(), 2, "{bs} {rw}: two repeats");
        v.iter().sum::<f64>() / v.len() as f64
    };
    for rw in ["randread", "randwrite"] {
        let (small, big) = (mean_bw("4k", rw), mean_bw("64k", rw));
        assert!(big > small, "{rw}: 64k {big} B/s not above 4k {small} B/s");
    }
    // Graphs, PNG and SVG.
    let graphs = folders(&dir.join("graphs"));
    for ext in ["png", "svg"] {
        assert!(
            graphs
                .iter()
                .any(|g| g.ends_with(format!("bw_bytes_per_s_vs_bs.{ext}"))),
            "{graphs:?}"
        );
    }

    // status and results read the folder again.
    let status = experiment(&plugins, &["status", s(&dir)]);
    assert!(
        text(&status.stdout).contains("8 runs: 8 done"),
        "{}",
        text(&status.stdout)
    );
    let summary = experiment(
        &plugins,
        &["results", s(&dir), "--no-graphs", "--figures", "read_iops"],
    );
    let summary_text = text(&summary.stdout);
    assert!(summary.status.success(), "{}", text(&summary.stderr));
    for combo in ["bs=4k rw=randread: 2 runs", "bs=64k rw=randwrite: 2 runs"] {
        assert!(summary_text.contains(combo), "{combo}:\n{summary_text}");
    }
    assert!(summary_text.contains("95% CI") && summary_text.contains("read_iops"));
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

/// Parses `--dry-run` output: (run_id, repeat, label) per planned run.
fn planned(stdout: &str) -> Vec<(String, u32, String)> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            f.next()?.parse::<usize>().ok()?;
            let id = f.next()?.to_owned();
            (f.next()? == "repeat").then_some(())?;
            let repeat = f.next()?.parse().ok()?;
            Some((id, repeat, f.collect::<Vec<_>>().join(" ")))
        })
        .collect()
}

#[test]
fn experiment_conditional_variable_plans_exactly_its_runs() {
    let plugins = plugins("experiment-plan");
    let out = experiment(
        &plugins,
        &[
            "run",
            &example("stress_ng_conditional.toml"),
            "--dry-run",
            "--order",
            "sequential",
        ],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let runs = planned(&stdout);
    // cpu x workers 1, 2; vm x workers 1, 2 x vm_bytes small, large; each
    // twice: vm_bytes multiplies only the vm runs.
    let mut labels: Vec<String> = runs.iter().map(|r| format!("{} #{}", r.2, r.1)).collect();
    labels.sort();
    let mut want = Vec::new();
    for combo in [
        "stressor=cpu workers=1",
        "stressor=cpu workers=2",
        "stressor=vm workers=1 vm_bytes=small",
        "stressor=vm workers=1 vm_bytes=large",
        "stressor=vm workers=2 vm_bytes=small",
        "stressor=vm workers=2 vm_bytes=large",
    ] {
        for r in 0..2 {
            want.push(format!("{combo} #{r}"));
        }
    }
    want.sort();
    assert_eq!(labels, want, "{stdout}");
    let mut ids: Vec<&str> = runs.iter().map(|r| r.0.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 12, "one id per run");
    // Planning writes nothing.
    assert!(stdout.contains("folder: experiments/stress_ng_conditional-"));
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn root_experiment_script_conditional_variable_is_null_where_it_does_not_apply() {
    let test = "root_experiment_script_conditional_variable_is_null_where_it_does_not_apply";
    if !require_root(test) || !require_tool(test, "python3") {
        return;
    }
    let plugins = plugins("experiment-script");
    let work = temp_dir("experiment-script");
    let dir = work.join("sort");
    let out = {
        let _serial = serial();
        experiment(
            &plugins,
            &[
                "run",
                &example("sort_script.toml"),
                "--dir",
                s(&dir),
                "--no-graphs",
            ],
        )
    };
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    // 3 line counts x (plain + parallel x 2 thread counts) x 3 repeats.
    assert!(stdout.contains("27 runs: 27 done"), "{stdout}");
    let (dtypes, rows) = read_results(&dir);
    assert_eq!(rows.len(), 27);
    assert_eq!(dtypes["lines"], "Int64", "integers stay integers");
    assert_eq!(dtypes["threads"], "Int64");
    assert_eq!(dtypes["variant"], "String");
    for row in &rows {
        let plain = row["variant"] == "plain";
        assert_eq!(row["threads"].is_null(), plain, "{row}");
        assert_eq!(row["run_class"], "baseline", "no probes: a baseline run");
        assert!(
            row["result_lines_per_s"].as_f64().is_some_and(|r| r > 0.0),
            "{row}"
        );
        // The script's parameters came through the configuration.
        assert_eq!(row["param_lines"], row["lines"], "{row}");
    }
    let combos: std::collections::BTreeSet<&str> =
        rows.iter().filter_map(|r| r["combo_id"].as_str()).collect();
    assert_eq!(combos.len(), 9);
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

/// A script benchmark that appends its `n` to a file each time it starts,
/// then takes a second.
const COUNTING_SCRIPT: &str = r#"#!/bin/sh
echo "$KML_PARAM_N" >> "$KML_PARAM_COUNTER"
sleep 1
echo "{\"name\": \"count\", \"component\": \"sh\", \"@result\": {\"value\": $KML_PARAM_N}}"
"#;

fn launches(counter: &Path) -> Vec<String> {
    std::fs::read_to_string(counter)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn root_experiment_resume_after_sigkill_redoes_only_the_missing_runs() {
    let test = "root_experiment_resume_after_sigkill_redoes_only_the_missing_runs";
    if !require_root(test) || !require_tool(test, "python3") {
        return;
    }
    let plugins = plugins("experiment-resume");
    let work = temp_dir("experiment-resume");
    let script = work.join("count.sh");
    std::fs::write(&script, COUNTING_SCRIPT).expect("script");
    let chmod = Command::new("chmod").arg("+x").arg(&script).status();
    assert!(chmod.is_ok_and(|s| s.success()));
    let counter = work.join("launches");
    let file = work.join("resume.toml");
    let body = format!(
            "name = \"resume\"\nbenchmark = \"script\"\nprobes = [\"quanta_runtime\"]\nrepeats = 2\nseed = 5\n\
             [config.benchmarks.script]\ncommand = [{script:?}]\ndrop_page_cache = false\n\
             [config.benchmarks.script.parameters]\ncounter = {counter:?}\n\
             [variables.n]\nrange = {{ start = 1, end = 3 }}\n",
        script = s(&script),
        counter = s(&counter),
    );
    std::fs::write(&file, &body).expect("experiment file");
    let dir = work.join("exp");
    let _serial = serial();

    // Start it, and SIGKILL it once the third run's benchmark has started.
    let mut child = Command::new(kernmlops_bin())
        .arg("--plugin-dir")
        .arg(&plugins)
        .args([
            "experiment",
            "run",
            s(&file),
            "--dir",
            s(&dir),
            "--order",
            "sequential",
        ])
        .current_dir(workspace_root())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the experiment");
    let deadline = Instant::now() + Duration::from_secs(60);
    while launches(&counter).len() < 3 {
        assert!(Instant::now() < deadline, "the third run never started");
        assert!(
            child.try_wait().ok().flatten().is_none(),
            "the experiment ended early"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let record = read_json(&dir.join("experiment.json"));
    let order: Vec<String> = record["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| r["run_id"].as_str().expect("run_id").to_owned())
        .collect();
    assert_eq!(order.len(), 6);
    let third = &order[2];

    // Resume: only the runs without a finished collection.
    let out = experiment(&plugins, &["resume", s(&dir), "--no-graphs"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("6 runs: 6 done"), "{stdout}");
    assert!(stderr.contains("4 to do"), "{stderr}");
    // Two launches before the kill finished, the third was cut off and is
    // redone, then the last three: 3 + 4 launches, in the sequential order.
    assert_eq!(launches(&counter), ["1", "1", "2", "2", "2", "3", "3"]);
    // The cut-off attempt was moved aside, never mixed in.
    let partial = folders(&dir.join("partial"));
    assert_eq!(
        partial,
        [dir.join("partial").join(format!("{third}-1"))],
        "{stderr}"
    );
    assert!(partial[0].join("manifest.json").is_file());
    let runs = folders(&dir.join("runs"));
    assert_eq!(runs.len(), 6);

    // Each run once in the results.
    let (_, rows) = read_results(&dir);
    let mut ids: Vec<&str> = rows.iter().filter_map(|r| r["run_id"].as_str()).collect();
    ids.sort_unstable();
    let mut want: Vec<&str> = order.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(ids, want);

    // A second resume has nothing to do.
    let again = experiment(&plugins, &["resume", s(&dir), "--no-graphs"]);
    assert!(again.status.success());
    assert_eq!(launches(&counter).len(), 7, "nothing ran again");

    // One planned run, as a cluster task performs it: done already.
    let exec = experiment(&plugins, &["exec", s(&dir), third]);
    assert!(exec.status.success(), "{}", text(&exec.stderr));
    assert!(
        text(&exec.stdout).contains("already done"),
        "{}",
        text(&exec.stdout)
    );
    let unknown = experiment(&plugins, &["exec", s(&dir), "000000000000"]);
    assert!(!unknown.status.success());
    assert!(text(&unknown.stderr).contains("no planned run 000000000000"));
    assert_eq!(launches(&counter).len(), 7);

    // The file gains a value: the runs it had keep their ids and are not
    // redone; only the new value's runs execute.
    std::fs::write(&file, body.replace("end = 3", "end = 4")).expect("grown file");
    let grown = experiment(
        &plugins,
        &["run", s(&file), "--dir", s(&dir), "--no-graphs"],
    );
    let grown_out = text(&grown.stdout);
    assert!(
        grown.status.success(),
        "{grown_out}\n{}",
        text(&grown.stderr)
    );
    assert!(grown_out.contains("8 runs: 8 done"), "{grown_out}");
    assert_eq!(launches(&counter)[7..], ["4", "4"]);

    // A changed setting changes every run's id: nothing old is reused, and
    // the old collections are left out of the results.
    let changed = body.replace("end = 3", "end = 1").replace(
        "drop_page_cache = false",
        "drop_page_cache = false\ntimeout = \"60s\"",
    );
    std::fs::write(&file, changed).expect("changed file");
    let redo = experiment(
        &plugins,
        &["run", s(&file), "--dir", s(&dir), "--no-graphs"],
    );
    let redo_out = text(&redo.stdout);
    assert!(redo.status.success(), "{redo_out}\n{}", text(&redo.stderr));
    assert!(redo_out.contains("2 runs: 2 done"), "{redo_out}");
    assert!(redo_out.contains("8 collection(s)"), "{redo_out}");
    assert_eq!(launches(&counter)[9..], ["1", "1"]);
    let (_, rows) = read_results(&dir);
    assert_eq!(rows.len(), 2);
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn experiment_bad_input_is_one_error_line_naming_file_and_key() {
    let plugins = plugins("experiment-errors");
    let work = temp_dir("experiment-errors");
    for (body, needles) in [
        (
            "name = \"x\"\nbenchmark = \"fio\"\n[variables.bs]\nkey = \"benchmarks.fio.bsz\"\nvalues = [\"4k\"]\n",
            &["bad.toml: variables.bs: key benchmarks.fio.bsz", "unknown key"][..],
        ),
        (
            "name = \"x\"\nbenchmark = \"fio\"\nrepeat = 3\n",
            &["bad.toml: line 3: unknown field `repeat`"][..],
        ),
        (
            "name = \"x\"\nbenchmark = \"nope\"\n",
            &["bad.toml: benchmark:", "unknown benchmark \"nope\""][..],
        ),
        (
            "name = \"x\"\nbenchmark = \"fio\"\nprobes = [\"nope\"]\n",
            &["bad.toml: probes:"][..],
        ),
        (
            "name = \"x\"\nbenchmark = \"fio\"\n[config.benchmarks.fio]\nbogus = 1\n",
            &["bad.toml: config: benchmarks.fio.bogus: unknown key"][..],
        ),
    ] {
        let file = work.join("bad.toml");
        std::fs::write(&file, body).expect("write");
        let out = experiment(&plugins, &["run", s(&file), "--dry-run"]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{body}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(stderr.starts_with("error: "), "{stderr}");
        for n in needles {
            assert!(stderr.contains(n), "{body:?}: {n:?} not in {stderr}");
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

/// A script benchmark whose `value` is 100 plus up to `noise` at random.
const NOISY_SCRIPT: &str = r#"#!/bin/sh
v=$(awk -v seed="$$" -v n="$KML_PARAM_NOISE" 'BEGIN { srand(seed); printf "%.3f", 100 + n * rand() }')
echo "{\"name\": \"noisy\", \"component\": \"sh\", \"@result\": {\"value\": $v}}"
"#;

#[test]
fn root_experiment_adaptive_repeats_until_the_interval_is_tight() {
    let test = "root_experiment_adaptive_repeats_until_the_interval_is_tight";
    if !require_root(test) || !require_tool(test, "python3") {
        return;
    }
    let plugins = plugins("experiment-adaptive");
    let work = temp_dir("experiment-adaptive");
    let script = work.join("noisy.sh");
    std::fs::write(&script, NOISY_SCRIPT).expect("script");
    let chmod = Command::new("chmod").arg("+x").arg(&script).status();
    assert!(chmod.is_ok_and(|s| s.success()));
    let file = work.join("adaptive.toml");
    std::fs::write(
        &file,
        format!(
            "name = \"adaptive\"\nbenchmark = \"script\"\nprobes = []\nrepeats = 2\n\
             [config.benchmarks.script]\ncommand = [{:?}]\ndrop_page_cache = false\n\
             [variables.noise]\nvalues = [0, 100]\n",
            s(&script)
        ),
    )
    .expect("experiment file");
    let dir = work.join("exp");
    let out = {
        let _serial = serial();
        experiment(
            &plugins,
            &[
                "run",
                s(&file),
                "--dir",
                s(&dir),
                "--no-graphs",
                "--adaptive",
                "--metric",
                "value",
                "--target",
                "0.05",
                "--max-repeats",
                "5",
            ],
        )
    };
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    // Without noise the interval is 0 after the two planned runs; with
    // noise of ±30% it stays wide, so runs are added up to the maximum.
    assert!(stdout.contains("noise=0: 2 runs"), "{stdout}");
    assert!(stdout.contains("noise=100: 5 runs"), "{stdout}");
    let (_, rows) = read_results(&dir);
    assert_eq!(rows.len(), 7);
    let record = read_json(&dir.join("experiment.json"));
    assert_eq!(record["adaptive"]["metric"], "value");
    assert_eq!(record["runs"].as_array().map(Vec::len), Some(7));
    let repeats: Vec<i64> = rows
        .iter()
        .filter(|r| r["noise"] == 100)
        .filter_map(|r| r["repeat"].as_i64())
        .collect();
    assert_eq!(repeats, [0, 1, 2, 3, 4]);
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

/// An experiment with power sources: each run records energy, and the
/// results carry it per zone, labelled modelled, equal to each run's
/// manifest; two busy workers use more modelled energy than one.
#[test]
fn root_experiment_with_power_puts_each_runs_energy_in_the_results() {
    let test = "root_experiment_with_power_puts_each_runs_energy_in_the_results";
    if !require_root(test) || !require_tool(test, "stress-ng") || !require_tool(test, "python3") {
        return;
    }
    let plugins = plugin_dir(
        "experiment-power",
        &[
            ("workloads", "workloads"),
            ("estimate", "estimate"),
            ("cpu_time", "cpu_time"),
        ],
    );
    let work = temp_dir("experiment-power");
    let file = work.join("power.toml");
    std::fs::write(
        &file,
        "name = \"power\"\nbenchmark = \"stress_ng\"\nprobes = []\npower = [\"estimate\"]\n\
         repeats = 1\n[config.benchmarks.stress_ng]\nstressor = \"cpu\"\ntimeout = \"2s\"\n\
         drop_page_cache = false\n[variables.workers]\nkey = \"benchmarks.stress_ng.workers\"\n\
         values = [1, 2]\n",
    )
    .expect("writing experiment");
    let dir = work.join("exp");
    let out = {
        let _serial = serial();
        experiment(
            &plugins,
            &["run", s(&file), "--dir", s(&dir), "--no-graphs"],
        )
    };
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let (dtypes, rows) = read_results(&dir);
    let col = "energy_estimate_cpu_j";
    assert_eq!(
        dtypes.get(col).map(String::as_str),
        Some("Float64"),
        "{dtypes:?}"
    );
    assert_eq!(rows.len(), 2);
    let mut by_workers = BTreeMap::new();
    for row in &rows {
        let j = row[col]
            .as_f64()
            .unwrap_or_else(|| panic!("no energy: {row}"));
        let id = row["run_id"].as_str().expect("run_id");
        let manifest = read_json(&dir.join("runs").join(id).join("manifest.json"));
        let zone = &manifest["power"]["sources"][0]["zones"][0];
        assert_eq!(zone["kind"], "modelled", "{manifest}");
        let uj = zone["energy_uj"].as_u64().expect("zone energy");
        assert!(close(j, uj as f64 / 1e6), "{j} J vs {uj} µJ");
        by_workers.insert(row["workers"].as_i64().expect("workers"), j);
    }
    assert!(by_workers[&2] > by_workers[&1], "{by_workers:?}");
    // The column says what it is.
    let meta = Command::new("python3")
        .arg("-c")
        .arg(
            "import sys, pyarrow.parquet as pq\n\
             f = pq.read_schema(sys.argv[1]).field('energy_estimate_cpu_j')\n\
             print(f.metadata[b'kernmlops.kind'].decode(), f.metadata[b'unit'].decode())",
        )
        .arg(dir.join("results.parquet"))
        .output()
        .expect("python3");
    assert_eq!(
        text(&meta.stdout).trim(),
        "modelled J",
        "{}",
        text(&meta.stderr)
    );
    // A source that is not installed is one error line naming the key.
    let bad = work.join("bad.toml");
    std::fs::write(
        &bad,
        "name = \"x\"\nbenchmark = \"stress_ng\"\nprobes = []\npower = [\"rapl\"]\n",
    )
    .expect("write");
    let out = experiment(&plugins, &["run", s(&bad), "--dry-run"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("bad.toml: power: no power source named rapl"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}
