//! `[build]` under `--executor slurm` on `scripts/slurm-local` clusters
//! (taken down after each test, pass or fail). A two-role experiment on two
//! nodes: the first job builds on both of its nodes (one step, a task per
//! node) before its roles start, later jobs find both builds up to date
//! (counted per node in `build/<node>.json`), and each role runs the tool
//! built on its own node; a changed input builds again once per node. A
//! failing build is one error line in the run's log and its task's log,
//! with no role started and no job left. A one-node experiment (no roles)
//! builds once on its node for all its runs.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    time::Duration,
};

use kernmlops_e2e::*;
use serde_json::Value;

#[path = "support/slurm_cluster.rs"]
mod slurm_cluster;
use slurm_cluster::{count, require, submission_runs, submit, wait_for_states, Cluster};

#[path = "support/build_fixture.rs"]
mod build_fixture;
use build_fixture::{bench, build_table, builds, counts, one_benchmark, tool, USE};

const NODES: [&str; 2] = ["kml-n1", "kml-n2"];

/// A two-role experiment in `work`: `server` checks that its node's tool
/// was built, says it is ready and serves until stopped; `client` (the
/// result) runs its node's tool. Its `[build]` runs `commands`.
fn two_roles(work: &Path, commands: &str, repeats: u32) -> PathBuf {
    bench(work, 42);
    let server = work.join("server.sh");
    write_exec(
        &server,
        "#!/bin/sh\nset -eu\nnode=$(cat /proc/sys/kernel/hostname)\n\
         test -x \"$(dirname \"$0\")/out/$node/tool\"\n\
         echo \"server ready on $node\" >&2\nwhile :; do sleep 1; done\n",
    );
    let client = work.join("client.sh");
    write_exec(&client, USE);
    let file = work.join("built_roles.toml");
    std::fs::write(
        &file,
        format!(
            "name = \"built_roles\"\nrepeats = {repeats}\nseed = 1\n{}\
             [config.benchmarks.script]\ndrop_page_cache = false\n\
             [roles.server]\nbenchmark = \"script\"\nscript = {:?}\nprobes = []\n\
             ready = {{ line = \"server ready\", timeout_s = 60 }}\n\
             [roles.client]\nbenchmark = \"script\"\nscript = {:?}\nprobes = []\n\
             after = \"server\"\nresult = true\n",
            build_table(commands),
            s(&server),
            s(&client)
        ),
    )
    .expect("experiment file");
    file
}

/// Every run of `ids`: complete, its roles on the two nodes, its result
/// from the tool built on the client's node, printing `value`.
fn check_runs(dir: &Path, ids: &[String], value: u64) {
    for id in ids {
        let run = dir.join("runs").join(id);
        let m = read_json(&run.join("manifest.json"));
        assert_eq!(m["status"], "complete", "{id}: {m}");
        let node = |role: &str| m["roles"][role]["node"].as_str().unwrap_or("").to_owned();
        let nodes: BTreeSet<String> = [node("server"), node("client")].into();
        assert_eq!(nodes, NODES.map(str::to_owned).into(), "{id}: {m}");
        let ind = read_json(&run.join("indicator.json"));
        assert_eq!(ind["@result"]["value"], value, "{id}: {ind}");
        assert_eq!(
            ind["@result"]["built_on"],
            node("client").as_str(),
            "{id}: the client ran its own node's build: {ind}"
        );
    }
}

#[test]
fn root_build_slurm_runs_once_on_each_node_of_a_two_role_job_and_again_on_a_changed_input() {
    let test =
        "root_build_slurm_runs_once_on_each_node_of_a_two_role_job_and_again_on_a_changed_input";
    if !require(test) {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("build-slurm", &[("workloads", "workloads")]);
    let work = temp_dir("build-slurm");
    let file = two_roles(&work, "[\"./bench/make.sh\"]", 2);
    let dir = work.join("exp");
    let cluster = Cluster::up(2);

    // Two runs, one job of two nodes each, one after the other: the first
    // builds on both nodes, the second finds both up to date.
    let args = ["run", s(&file), "--dir", s(&dir), "--executor", "slurm"];
    let job = submit(&cluster, &plugins, &args, 2);
    let first = submission_runs(&dir, 1);
    wait_for_states(
        &cluster,
        &plugins,
        &dir,
        Duration::from_secs(240),
        "2 runs done",
        |by_id| count(by_id, "done") == 2,
    );
    let built: BTreeSet<String> = builds(&work).into_iter().collect();
    assert_eq!(builds(&work).len(), 2, "{:?}", builds(&work));
    assert_eq!(built, NODES.map(str::to_owned).into());
    for node in NODES {
        assert_eq!(counts(&dir, node), (1, 1), "{node}");
        let log = std::fs::read_to_string(dir.join("build").join(format!("{node}.log")))
            .expect("the node's build log");
        assert!(log.contains(&format!("on {node} in ")), "{log}");
    }
    check_runs(&dir, &first, 42);
    let task_logs: String = (0..2)
        .map(|i| {
            let log = dir.join("logs").join(format!("slurm-{job}_{i}.log"));
            std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()))
        })
        .collect();
    for node in NODES {
        for what in ["ran in ", "up to date"] {
            let line = format!("build on {node}: {what}");
            assert_eq!(task_logs.matches(&line).count(), 1, "{line}:\n{task_logs}");
        }
    }

    // A changed input, and a third repeat: its job builds again, once on
    // each node, and its client runs the new build.
    std::fs::write(work.join("bench/tool.in"), tool(43)).expect("tool.in");
    let file = two_roles_again(&work, 3);
    let args = ["run", s(&file), "--dir", s(&dir), "--executor", "slurm"];
    submit(&cluster, &plugins, &args, 1);
    let third = submission_runs(&dir, 2);
    wait_for_states(
        &cluster,
        &plugins,
        &dir,
        Duration::from_secs(180),
        "3 runs done",
        |by_id| count(by_id, "done") == 3,
    );
    assert_eq!(builds(&work).len(), 4, "{:?}", builds(&work));
    for node in NODES {
        assert_eq!(counts(&dir, node), (2, 1), "{node}");
    }
    check_runs(&dir, &third, 43);
    cluster.wait_for_no_jobs();
    drop(cluster);
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

/// The experiment file of [`two_roles`] again with `repeats` (the sources
/// as they are now).
fn two_roles_again(work: &Path, repeats: u32) -> PathBuf {
    let file = work.join("built_roles.toml");
    let text = std::fs::read_to_string(&file).expect("experiment file");
    let text = text.replacen("repeats = 2\n", &format!("repeats = {repeats}\n"), 1);
    std::fs::write(&file, text).expect("experiment file");
    file
}

#[test]
fn root_build_slurm_failing_is_one_error_line_with_no_role_started_and_no_job_left() {
    let test = "root_build_slurm_failing_is_one_error_line_with_no_role_started_and_no_job_left";
    if !require(test) {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("build-slurm-fail", &[("workloads", "workloads")]);
    let work = temp_dir("build-slurm-fail");
    let file = two_roles(
        &work,
        r#"["./bench/make.sh", "echo compiling; echo 'boom: no header x.h' >&2; exit 3"]"#,
        1,
    );
    let dir = work.join("exp");
    let cluster = Cluster::up(2);
    let args = ["run", s(&file), "--dir", s(&dir), "--executor", "slurm"];
    let job = submit(&cluster, &plugins, &args, 1);
    let st = wait_for_states(
        &cluster,
        &plugins,
        &dir,
        Duration::from_secs(120),
        "the run to fail",
        |by_id| count(by_id, "failed") == 1,
    );
    cluster.wait_for_no_jobs();
    let id = &submission_runs(&dir, 1)[0];
    // The reason: the failing command, its status and output, on a node.
    let detail = st["runs"][0]["detail"].as_str().unwrap_or_default();
    for wanted in ["[build] on kml-n", "exit status: 3", "boom: no header x.h"] {
        assert!(detail.contains(wanted), "{wanted:?} in {st:#}");
    }
    // One error line in the run's log and in its task's log.
    for log in [dir.join("logs").join(format!("{id}.log")), {
        dir.join("logs").join(format!("slurm-{job}_0.log"))
    }] {
        let body = std::fs::read_to_string(&log).unwrap_or_default();
        let errors: Vec<&str> = body.lines().filter(|l| l.contains("error")).collect();
        assert_eq!(errors.len(), 1, "{}:\n{body}", log.display());
        assert!(errors[0].starts_with("error: [build] on kml-n"), "{body}");
    }
    // Both nodes tried, neither ran a role: no collection, no process.
    for node in NODES {
        assert!(dir.join("build").join(format!("{node}.log")).is_file());
    }
    assert!(!dir.join("runs").join(id).exists(), "no role started");
    let left = processes_with(&[s(&dir)]);
    assert!(left.is_empty(), "left running: {left:?}");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn root_build_slurm_one_node_runs_build_once_for_all_its_runs() {
    let test = "root_build_slurm_one_node_runs_build_once_for_all_its_runs";
    if !require(test) {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("build-slurm-one", &[("workloads", "workloads")]);
    let work = temp_dir("build-slurm-one");
    let file = one_benchmark(&work, "built_one", "[\"./bench/make.sh\"]", 7);
    let dir = work.join("exp");
    let cluster = Cluster::up(1);
    let args = ["run", s(&file), "--dir", s(&dir), "--executor", "slurm"];
    submit(&cluster, &plugins, &args, 2);
    wait_for_states(
        &cluster,
        &plugins,
        &dir,
        Duration::from_secs(180),
        "2 runs done",
        |by_id| count(by_id, "done") == 2,
    );
    let node = this_node();
    assert_eq!(builds(&work), std::slice::from_ref(&node));
    assert_eq!(counts(&dir, &node), (1, 1));
    for id in submission_runs(&dir, 1) {
        let ind: Value = read_json(&dir.join("runs").join(&id).join("indicator.json"));
        assert_eq!(ind["@result"]["value"], 7, "{ind}");
        assert_eq!(ind["@result"]["built_on"], node.as_str(), "{ind}");
    }
    cluster.wait_for_no_jobs();
    drop(cluster);
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}
