//! Experiments on a real one-node Slurm cluster (`scripts/slurm-local`,
//! brought up for each test and taken down again, pass or fail): a 4-run
//! stress_ng sweep submitted as a job array completes with each
//! collection's manifest naming its Slurm job, array task and node; a task
//! cancelled while it runs (`scancel`) is the only run `experiment resume
//! --executor slurm` submits again, and the results hold each run once;
//! Slurm missing, or sbatch refusing the options, is one error line with
//! nothing submitted and nothing written; a node whose plugins differ from
//! the experiment's record refuses its runs, with that reason.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use kernmlops_e2e::*;
use serde_json::Value;

#[path = "support/slurm_cluster.rs"]
mod slurm_cluster;
use slurm_cluster::{
    by_id, count, experiment, states, submission_runs, submit, submitted_job, wait_for_states,
    Cluster,
};

/// The plugins the sweeps use.
fn plugins(test: &str) -> PathBuf {
    plugin_dir(
        test,
        &[
            ("workloads", "workloads"),
            ("quanta_runtime", "quanta_runtime"),
        ],
    )
}

/// A stress_ng sweep: workers 1 and 2, two repeats each, `seconds` each.
fn sweep(work: &Path, name: &str, seconds: u32) -> PathBuf {
    let file = work.join(format!("{name}.toml"));
    std::fs::write(
        &file,
        format!(
            "name = \"{name}\"\nbenchmark = \"stress_ng\"\nprobes = [\"quanta_runtime\"]\nrepeats = 2\nseed = 3\n\
             [config.benchmarks.stress_ng]\ntimeout = \"{seconds}s\"\ndrop_page_cache = false\n\
             [variables.workers]\nkey = \"benchmarks.stress_ng.workers\"\nrange = {{ start = 1, end = 2 }}\n"
        ),
    )
    .expect("experiment file");
    file
}

/// `experiment status DIR --json`.
fn status(cluster: &Cluster, plugins: &Path, dir: &Path) -> Value {
    states(cluster, plugins, dir).0
}

/// `run_id` and `slurm_job` of each row of results.parquet, read by polars.
fn result_rows(dir: &Path) -> Vec<(String, String)> {
    polars_results(dir)
        .1
        .iter()
        .map(|r| {
            let field = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
            (field("run_id"), field("slurm_job"))
        })
        .collect()
}

/// The short host name, Slurm's name for the node `slurm-local` runs.
fn hostname() -> String {
    let out = Command::new("hostname")
        .arg("-s")
        .output()
        .expect("hostname");
    text(&out.stdout).trim().to_owned()
}

fn require(test: &str) -> bool {
    slurm_cluster::require(test) && require_tool(test, "stress-ng")
}

#[test]
fn root_slurm_sweep_of_4_runs_completes_with_job_task_and_node_in_each_manifest() {
    let test = "root_slurm_sweep_of_4_runs_completes_with_job_task_and_node_in_each_manifest";
    if !require(test) {
        return;
    }
    let _serial = serial();
    let plugins = plugins("slurm-sweep");
    let work = temp_dir("slurm-sweep");
    let file = sweep(&work, "slurm_sweep", 1);
    let dir = work.join("exp");
    let cluster = Cluster::up(1);

    // Submitting returns at once, with the job id.
    let started = Instant::now();
    let out = experiment(
        &cluster,
        &plugins,
        &[
            "run",
            s(&file),
            "--dir",
            s(&dir),
            "--executor",
            "slurm",
            "--time",
            "00:05:00",
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "submitting took {:?}",
        started.elapsed()
    );
    let job = submitted_job(&stdout, 4);
    assert!(stdout.contains(&format!("squeue --jobs {job}")), "{stdout}");
    let order = submission_runs(&dir, 1);
    assert_eq!(order.len(), 4);

    // Slurm's view: every run is queued, running or done, none merely
    // pending, each with its task.
    let st = status(&cluster, &plugins, &dir);
    for r in st["runs"].as_array().expect("runs") {
        let state = r["state"].as_str().unwrap_or("");
        assert!(
            ["queued", "running", "done"].contains(&state),
            "{r} in {st:#}"
        );
        let i = order
            .iter()
            .position(|id| r["run_id"] == id.as_str())
            .expect("every run submitted");
        assert_eq!(r["slurm_task"], format!("{job}_{i}"), "{r}");
    }
    assert_eq!(st["slurm"]["jobs"], serde_json::json!([job]));
    // Results work while runs are still going: what has finished so far.
    let out = experiment(&cluster, &plugins, &["results", s(&dir), "--no-graphs"]);
    assert!(
        out.status.success(),
        "{}
{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(dir.join("results.parquet").is_file());

    wait_for_states(
        &cluster,
        &plugins,
        &dir,
        Duration::from_secs(180),
        "4 runs done",
        |by_id| count(by_id, "done") == 4,
    );

    // Each collection records its Slurm job, array task and node.
    let node = hostname();
    for (i, run_id) in order.iter().enumerate() {
        let run_dir = dir.join("runs").join(run_id);
        let m = manifest(&run_dir);
        assert_eq!(m["status"], "complete", "{run_id}");
        let slurm = &m["slurm"];
        assert_eq!(slurm["array_job_id"].to_string(), job, "{run_id}: {slurm}");
        assert_eq!(slurm["array_task_id"], i, "{run_id}: {slurm}");
        assert!(slurm["job_id"].as_u64().is_some(), "{slurm}");
        assert_eq!(slurm["node"], node.as_str(), "{slurm}");
        let log = std::fs::read_to_string(dir.join("logs").join(format!("slurm-{job}_{i}.log")))
            .expect("the task's log");
        assert!(log.contains(&format!("run {run_id}: done")), "{log}");
    }
    let jobs: BTreeSet<String> = order
        .iter()
        .map(|id| manifest(&dir.join("runs").join(id))["slurm"]["job_id"].to_string())
        .collect();
    assert_eq!(jobs.len(), 4, "each task is a job of its own: {jobs:?}");

    // Results: 4 rows, each with the task that ran it.
    let out = experiment(&cluster, &plugins, &["results", s(&dir), "--no-graphs"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("(4 rows)"), "{stdout}");
    let mut rows = result_rows(&dir);
    rows.sort();
    let mut want: Vec<(String, String)> = order
        .iter()
        .enumerate()
        .map(|(i, id)| (id.clone(), format!("{job}_{i}")))
        .collect();
    want.sort();
    assert_eq!(rows, want);
}

#[test]
fn root_slurm_cancelled_task_is_the_only_run_resume_submits_again() {
    let test = "root_slurm_cancelled_task_is_the_only_run_resume_submits_again";
    if !require(test) {
        return;
    }
    let _serial = serial();
    let plugins = plugins("slurm-cancel");
    let work = temp_dir("slurm-cancel");
    let file = sweep(&work, "slurm_cancel", 4);
    let dir = work.join("exp");
    let cluster = Cluster::up(1);

    let args = ["run", s(&file), "--dir", s(&dir), "--executor", "slurm"];
    let job = submit(&cluster, &plugins, &args, 4);
    let order = submission_runs(&dir, 1);

    // Cancel the first task seen running once its collection has begun.
    let st = wait_for_states(
        &cluster,
        &plugins,
        &dir,
        Duration::from_secs(120),
        "a run collecting",
        |runs| {
            runs.iter().any(|(id, state)| {
                state == "running" && dir.join("runs").join(id).join("manifest.json").is_file()
            })
        },
    );
    let victim = by_id(&st)
        .into_iter()
        .find(|(id, state)| {
            state == "running" && dir.join("runs").join(id).join("manifest.json").is_file()
        })
        .map(|(id, _)| id)
        .expect("a running run");
    let index = order
        .iter()
        .position(|id| *id == victim)
        .expect("submitted");
    let task = format!("{job}_{index}");
    let out = cluster.tool("scancel", &[&task]);
    assert!(out.status.success(), "scancel: {}", text(&out.stderr));

    // The array ends: three runs done, the cancelled one cut off (its
    // benchmark stopped by the signal).
    let st = wait_for_states(
        &cluster,
        &plugins,
        &dir,
        Duration::from_secs(180),
        "the array to end",
        |by_id| count(by_id, "done") == 3 && count(by_id, "queued") + count(by_id, "running") == 0,
    );
    let victim_status = st["runs"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["run_id"] == victim.as_str()))
        .expect("victim")
        .clone();
    assert_eq!(victim_status["state"], "cut_off", "{st:#}");
    assert!(
        victim_status["detail"]
            .as_str()
            .is_some_and(|d| d.contains(&format!("job {task} cancelled"))),
        "{victim_status}"
    );
    let kept: BTreeMap<String, Value> = order
        .iter()
        .filter(|id| **id != victim)
        .map(|id| {
            (
                id.clone(),
                manifest(&dir.join("runs").join(id))["collection_id"].clone(),
            )
        })
        .collect();

    // Resume submits that run alone.
    let again = submit(
        &cluster,
        &plugins,
        &["resume", s(&dir), "--executor", "slurm"],
        1,
    );
    assert_ne!(again, job);
    assert_eq!(submission_runs(&dir, 2), std::slice::from_ref(&victim));
    wait_for_states(
        &cluster,
        &plugins,
        &dir,
        Duration::from_secs(120),
        "4 runs done",
        |by_id| count(by_id, "done") == 4,
    );

    // The cut-off attempt was moved aside; the others were not touched.
    assert!(dir
        .join("partial")
        .join(format!("{victim}-1"))
        .join("manifest.json")
        .is_file());
    for (id, collection_id) in &kept {
        assert_eq!(
            &manifest(&dir.join("runs").join(id))["collection_id"],
            collection_id,
            "{id} was redone"
        );
    }
    let m = manifest(&dir.join("runs").join(&victim));
    assert_eq!(m["slurm"]["array_job_id"].to_string(), again);

    // Each run exactly once in the results.
    let out = experiment(&cluster, &plugins, &["results", s(&dir), "--no-graphs"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows = result_rows(&dir);
    let ids: BTreeSet<&str> = rows.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert_eq!(ids, order.iter().map(String::as_str).collect());
    assert!(
        rows.contains(&(victim.clone(), format!("{again}_0"))),
        "{rows:?}"
    );
}

/// `experiment run FILE --dir DIR --executor slurm` with the array held
/// (`--sbatch-arg=--hold`): its 4 runs submitted; the job id.
fn submit_held(cluster: &Cluster, plugins: &Path, file: &Path, dir: &Path) -> String {
    let args = [
        "run",
        s(file),
        "--dir",
        s(dir),
        "--executor",
        "slurm",
        "--sbatch-arg=--hold",
    ];
    submit(cluster, plugins, &args, 4)
}

/// One `error:` line on stderr, nothing else.
fn one_error_line(out: &Output) -> String {
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "expected a failure:\n{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line:\n{stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    lines[0].to_owned()
}

#[test]
fn root_slurm_missing_or_refusing_is_one_error_with_nothing_submitted_or_lost() {
    let test = "root_slurm_missing_or_refusing_is_one_error_with_nothing_submitted_or_lost";
    if !require(test) {
        return;
    }
    let _serial = serial();
    let plugins = plugins("slurm-errors");
    let work = temp_dir("slurm-errors");
    let file = sweep(&work, "slurm_errors", 1);
    let dir = work.join("exp");

    // Slurm not installed (no sbatch in PATH): nothing is written.
    let empty = work.join("empty-bin");
    std::fs::create_dir_all(&empty).expect("mkdir");
    let out = Command::new(kernmlops_bin())
        .arg("--plugin-dir")
        .arg(&plugins)
        .args(["experiment", "run", s(&file), "--dir", s(&dir)])
        .args(["--executor", "slurm"])
        .env("PATH", &empty)
        .output()
        .expect("kernmlops");
    let line = one_error_line(&out);
    assert!(line.contains("sbatch not found"), "{line}");
    assert!(line.contains("nothing was submitted"), "{line}");
    assert!(!dir.exists(), "nothing written");

    // Slurm options without --executor slurm, and a time sbatch would not
    // take.
    let out = experiment_in_root(
        &plugins,
        &["run", s(&file), "--dir", s(&dir), "--partition", "p"],
    );
    assert!(one_error_line(&out).contains("--executor slurm"));
    let out = experiment_in_root(
        &plugins,
        &[
            "run",
            s(&file),
            "--dir",
            s(&dir),
            "--executor",
            "slurm",
            "--time",
            "ten",
        ],
    );
    assert!(one_error_line(&out).contains("--time"));
    assert!(!dir.exists());

    let cluster = Cluster::up(1);
    // sbatch refuses the options: nothing submitted, nothing written.
    let out = experiment(
        &cluster,
        &plugins,
        &[
            "run",
            s(&file),
            "--dir",
            s(&dir),
            "--executor",
            "slurm",
            "--partition",
            "no_such_partition",
        ],
    );
    let line = one_error_line(&out);
    assert!(line.contains("no_such_partition"), "{line}");
    assert!(!dir.exists());
    assert_eq!(cluster.active_jobs(), Vec::<String>::new());

    // On an existing experiment (its array cancelled before it ran), a
    // refused resume loses nothing: the record and submissions stay as
    // they were, and no job is added.
    let job = submit_held(&cluster, &plugins, &file, &dir);
    let out = cluster.tool("scancel", &[&job]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    cluster.wait_for_no_jobs();
    let st = status(&cluster, &plugins, &dir);
    assert_eq!(
        count(&by_id(&st), "pending"),
        4,
        "cancelled before they ran: {st:#}"
    );
    let record = std::fs::read(dir.join("experiment.json")).expect("record");
    let out = experiment(
        &cluster,
        &plugins,
        &[
            "resume",
            s(&dir),
            "--executor",
            "slurm",
            "--sbatch-arg=--no-such-option",
        ],
    );
    let line = one_error_line(&out);
    assert!(line.contains("--no-such-option"), "{line}");
    assert_eq!(
        std::fs::read(dir.join("experiment.json")).expect("record"),
        record
    );
    let subs: Vec<String> = std::fs::read_dir(dir.join("slurm"))
        .expect("slurm folder")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    assert_eq!(subs.len(), 3, "only the first submission's files: {subs:?}");
    assert_eq!(cluster.active_jobs(), Vec::<String>::new());
}

#[test]
fn root_slurm_node_with_other_plugins_fails_its_runs_with_the_reason() {
    let test = "root_slurm_node_with_other_plugins_fails_its_runs_with_the_reason";
    if !require(test) {
        return;
    }
    let _serial = serial();
    let plugins = plugins("slurm-plugins");
    let work = temp_dir("slurm-plugins");
    let file = sweep(&work, "slurm_plugins", 1);
    let dir = work.join("exp");
    let cluster = Cluster::up(1);

    // Submitted held; the plugin folder the tasks will see changes before
    // they run.
    let job = submit_held(&cluster, &plugins, &file, &dir);
    let extra = plugins.join("process_trace.so");
    std::fs::copy(built_so("process_trace"), &extra).expect("copying a plugin");
    let out = cluster.tool("scontrol", &["release", &job]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    // Every task refuses its run with the reason; no data is mixed in.
    let st = wait_for_states(
        &cluster,
        &plugins,
        &dir,
        Duration::from_secs(120),
        "4 runs refused",
        |by_id| count(by_id, "failed") == 4,
    );
    for r in st["runs"].as_array().expect("runs") {
        let detail = r["detail"].as_str().unwrap_or("");
        assert!(
            detail.contains("plugins differ") && detail.contains("process_trace.so is new"),
            "{r}"
        );
        let id = r["run_id"].as_str().expect("run_id");
        assert!(
            !dir.join("runs").join(id).exists(),
            "{id} has no collection"
        );
    }

    // With the folder as recorded again, resume submits them all again.
    std::fs::remove_file(&extra).expect("removing the plugin");
    submit(
        &cluster,
        &plugins,
        &["resume", s(&dir), "--executor", "slurm"],
        4,
    );
    wait_for_states(
        &cluster,
        &plugins,
        &dir,
        Duration::from_secs(120),
        "4 runs done",
        |by_id| count(by_id, "done") == 4,
    );
}
