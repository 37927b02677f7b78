//! Experiments with roles through `--executor slurm` on a two-node
//! `scripts/slurm-local` cluster (taken down after each test, pass or
//! fail). The shipped two-role example (Debian's redis-server measured on
//! one node, redis-benchmark on the other, over the nodes' bridge), two
//! values of a variable and two repeats: one job of two nodes per run, every
//! run's manifest naming two different nodes, the server's collection and
//! the client's result, one results row per run; the nodes share this
//! machine's kernel, so the server's collection is filtered to the
//! server's processes (redis-server's, none of redis-benchmark's on the
//! other node); one run's job cancelled
//! (`scancel`) while its server runs is cut off, and `experiment resume
//! --executor slurm` redoes it alone, whole. A server role that never
//! becomes ready fails its run with the reason after its timeout, leaving
//! no redis-server, srun or job on any node.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use kernmlops_e2e::*;
use serde_json::Value;

#[path = "support/slurm_cluster.rs"]
mod slurm_cluster;
use slurm_cluster::{
    count, experiment, require, submission_runs, submitted_job, wait_for_states, Cluster,
};

fn plugins(test: &str) -> PathBuf {
    plugin_dir(
        test,
        &[
            ("workloads", "workloads"),
            ("quanta_runtime", "quanta_runtime"),
            ("process_trace", "process_trace"),
        ],
    )
}

fn require_redis(test: &str) -> bool {
    require(test) && require_tool(test, "redis-server") && require_tool(test, "redis-benchmark")
}

/// The shipped two-role example, its scripts named by absolute path.
fn redis_example(work: &Path) -> PathBuf {
    let examples = workspace_root().join("examples/experiments");
    let text = std::fs::read_to_string(examples.join("redis_roles.toml")).expect("example");
    let file = work.join("redis_roles.toml");
    let text = text
        .replace(
            "\"./redis_server.sh\"",
            &format!("{:?}", s(&examples.join("redis_server.sh"))),
        )
        .replace(
            "\"./redis_load.sh\"",
            &format!("{:?}", s(&examples.join("redis_load.sh"))),
        )
        .replace(
            "probes = [\"quanta_runtime\"]",
            "probes = [\"quanta_runtime\", \"process_trace\"]",
        );
    assert!(text.contains("redis_server.sh\"") && !text.contains("\"./"));
    std::fs::write(&file, text).expect("experiment file");
    file
}

/// Waits until a run of `order` is under way (its server's collection
/// exists, the run's own manifest not yet) and cancels its job; its id.
fn cancel_a_running_run(cluster: &Cluster, dir: &Path, job: &str, order: &[String]) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let going = order.iter().enumerate().find(|(_, id)| {
            let run = dir.join("runs").join(id);
            run.join("server/manifest.json").is_file() && !run.join("manifest.json").exists()
        });
        if let Some((i, id)) = going {
            let task = format!("{job}_{i}");
            let out = cluster.tool("scancel", &[&task]);
            assert!(out.status.success(), "scancel: {}", text(&out.stderr));
            return id.clone();
        }
        assert!(Instant::now() < deadline, "no run under way in 120 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `results.parquet` as JSON rows, read by polars.
fn result_rows(dir: &Path) -> Vec<Value> {
    let py = Command::new("python3")
        .arg("-c")
        .arg("import json, sys, polars as pl\nprint(json.dumps(pl.read_parquet(sys.argv[1]).to_dicts()))")
        .arg(dir.join("results.parquet"))
        .output()
        .expect("python3");
    assert!(py.status.success(), "{}", text(&py.stderr));
    serde_json::from_str(text(&py.stdout).trim()).expect("rows")
}

#[test]
fn root_roles_slurm_server_and_client_on_two_nodes_and_a_cancelled_run_redone_whole() {
    let test = "root_roles_slurm_server_and_client_on_two_nodes_and_a_cancelled_run_redone_whole";
    if !require_redis(test) {
        return;
    }
    let _serial = serial();
    let plugins = plugins("roles-slurm");
    let work = temp_dir("roles-slurm");
    let file = redis_example(&work);
    let dir = work.join("exp");
    let cluster = Cluster::up(2);
    let net = cluster.place.net.clone();

    let out = experiment(
        &cluster,
        &plugins,
        &["run", s(&file), "--dir", s(&dir), "--executor", "slurm"],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let job = submitted_job(&stdout, 4);
    let order = submission_runs(&dir, 1);
    assert_eq!(order.len(), 4);
    let sub = read_json(&dir.join("slurm/submit-0001.json"));
    let command: Vec<&str> = sub["command"]
        .as_array()
        .expect("command")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        command.contains(&"--nodes=2") && command.contains(&"--exclusive"),
        "{command:?}"
    );

    // One run's job cancelled while its server runs: cut off.
    let victim = cancel_a_running_run(&cluster, &dir, &job, &order);
    let st = wait_for_states(
        &cluster,
        &plugins,
        &dir,
        Duration::from_secs(240),
        "the array to end",
        |by_id| count(by_id, "done") == 3 && count(by_id, "queued") + count(by_id, "running") == 0,
    );
    let victim_state = st["runs"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["run_id"] == victim.as_str()))
        .expect("victim")
        .clone();
    assert_eq!(victim_state["state"], "cut_off", "{st:#}");
    let kept: Vec<(String, Value)> = order
        .iter()
        .filter(|id| **id != victim)
        .map(|id| {
            let m = read_json(&dir.join("runs").join(id).join("manifest.json"));
            (id.clone(), m["collection_id"].clone())
        })
        .collect();

    // Resume submits that run alone, and it is redone whole.
    let out = experiment(
        &cluster,
        &plugins,
        &["resume", s(&dir), "--executor", "slurm"],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let again = submitted_job(&stdout, 1);
    assert_eq!(submission_runs(&dir, 2), std::slice::from_ref(&victim));
    wait_for_states(
        &cluster,
        &plugins,
        &dir,
        Duration::from_secs(120),
        "4 runs done",
        |by_id| count(by_id, "done") == 4,
    );
    let aside = dir.join("partial").join(format!("{victim}-1"));
    assert!(aside.join("server").is_dir(), "{}", aside.display());
    for (id, collection_id) in &kept {
        let m = read_json(&dir.join("runs").join(id).join("manifest.json"));
        assert_eq!(&m["collection_id"], collection_id, "{id} was redone");
    }

    // Every run: the server on one node, the client on the other, each
    // with its own collection; the server's collected, the client's result.
    for id in &order {
        let run = dir.join("runs").join(id);
        let m = read_json(&run.join("manifest.json"));
        assert_eq!(m["status"], "complete", "{id}: {m}");
        assert_eq!(m["executor"], "slurm", "{m}");
        let node = |role: &str| m["roles"][role]["node"].as_str().unwrap_or("").to_owned();
        let nodes: BTreeSet<String> = [node("server"), node("client")].into();
        assert_eq!(
            nodes,
            ["kml-n1".to_owned(), "kml-n2".to_owned()].into(),
            "{id}: two different nodes: {m}"
        );
        for role in ["server", "client"] {
            let own = read_json(&run.join(role).join("manifest.json"));
            assert_eq!(own["hostname"], node(role).as_str(), "{role}: {own}");
            assert_eq!(own["slurm"]["node"], node(role).as_str(), "{role}: {own}");
            let host = m["roles"][role]["host"].as_str().unwrap_or("");
            assert!(host.starts_with(&format!("{net}.")), "{role}: {m}");
        }
        let server = read_json(&run.join("server/manifest.json"));
        assert!(
            server["tables"]["quanta_runtime"]["rows"]
                .as_u64()
                .is_some_and(|n| n > 0),
            "{server}"
        );
        // One kernel under both nodes (equal boot ids): the server's
        // collection holds the server's processes alone.
        assert_eq!(m["roles"]["server"]["filtered"], true, "{id}: {m}");
        assert_eq!(m["roles"]["client"]["filtered"], false, "{id}: {m}");
        let (foreign, names) = role_view(&run.join("server"));
        assert!(
            foreign.is_empty(),
            "{id}: rows of other processes: {foreign:?}"
        );
        assert!(names.contains("redis-server"), "{id}: {names:?}");
        assert!(!names.contains("redis-benchmark"), "{id}: {names:?}");
        let ind = read_json(&run.join("indicator.json"));
        assert!(
            ind["@result"]["get_per_s"]
                .as_f64()
                .is_some_and(|x| x > 0.0),
            "{ind}"
        );
    }
    let redone = read_json(&dir.join("runs").join(&victim).join("manifest.json"));
    assert_eq!(redone["slurm"]["array_job_id"].to_string(), again);

    // results.parquet: one row per run, each naming the two nodes.
    let out = experiment(&cluster, &plugins, &["results", s(&dir), "--no-graphs"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows = result_rows(&dir);
    assert_eq!(rows.len(), 4, "{rows:?}");
    let ids: BTreeSet<&str> = rows.iter().filter_map(|r| r["run_id"].as_str()).collect();
    assert_eq!(ids, order.iter().map(String::as_str).collect());
    let mut clients: Vec<i64> = rows.iter().filter_map(|r| r["clients"].as_i64()).collect();
    clients.sort();
    assert_eq!(clients, [1, 1, 8, 8]);
    for row in &rows {
        assert_ne!(row["node_server"], row["node_client"], "{row}");
        assert!(
            row["rows_server_quanta_runtime"]
                .as_i64()
                .is_some_and(|x| x > 0),
            "{row}"
        );
    }
    // No server outlived its run.
    let left = processes_with(&["redis-server", &format!("{net}.")]);
    assert!(left.is_empty(), "left running: {left:?}");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn root_roles_slurm_a_role_never_ready_fails_its_run_leaving_nothing_on_any_node() {
    let test = "root_roles_slurm_a_role_never_ready_fails_its_run_leaving_nothing_on_any_node";
    if !require_redis(test) {
        return;
    }
    let _serial = serial();
    let plugins = plugins("roles-slurm-never");
    let work = temp_dir("roles-slurm-never");
    // A redis-server on the port after its ready port: it runs, but the
    // port checked never answers.
    let server = work.join("server.sh");
    std::fs::write(
        &server,
        "#!/bin/sh\nexec redis-server --bind \"$KML_ROLE_SERVER_HOST\" --port $((KML_ROLE_SERVER_PORT + 1)) --save '' --appendonly no\n",
    )
    .expect("script");
    let client = work.join("client.sh");
    std::fs::write(
        &client,
        "#!/bin/sh\necho '{\"name\": \"c\", \"component\": \"test\", \"@result\": {\"value\": 1}}'\n",
    )
    .expect("script");
    let chmod = Command::new("chmod")
        .arg("755")
        .arg(&server)
        .arg(&client)
        .status();
    assert!(chmod.is_ok_and(|st| st.success()));
    let port = 6391;
    let file = work.join("never.toml");
    std::fs::write(
        &file,
        format!(
            "name = \"never\"\nrepeats = 1\n\
             [config.benchmarks.script]\ndrop_page_cache = false\n\
             [roles.server]\nbenchmark = \"script\"\nscript = {:?}\nprobes = []\n\
             ready = {{ port = {port}, timeout_s = 3 }}\n\
             [roles.client]\nbenchmark = \"script\"\nscript = {:?}\nprobes = []\n\
             after = \"server\"\nresult = true\n",
            s(&server),
            s(&client)
        ),
    )
    .expect("experiment file");
    let dir = work.join("exp");
    let cluster = Cluster::up(2);
    let net = cluster.place.net.clone();
    let out = experiment(
        &cluster,
        &plugins,
        &["run", s(&file), "--dir", s(&dir), "--executor", "slurm"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    submitted_job(&text(&out.stdout), 1);
    wait_for_states(
        &cluster,
        &plugins,
        &dir,
        Duration::from_secs(120),
        "the run to fail",
        |by_id| count(by_id, "failed") == 1,
    );
    // The job ends with its run.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cluster.active_jobs().is_empty() {
        assert!(Instant::now() < deadline, "{:?}", cluster.active_jobs());
        std::thread::sleep(Duration::from_millis(200));
    }
    let run = dir.join("runs").join(&submission_runs(&dir, 1)[0]);
    let m = read_json(&run.join("manifest.json"));
    assert_eq!(m["status"], "failed", "{m}");
    let reason = m["errors"][0].as_str().unwrap_or_default();
    assert!(
        reason.contains("role server was not ready after 3 s")
            && reason.contains(&format!("nothing answered on port {port}")),
        "{reason}"
    );
    assert_eq!(m["executor"], "slurm", "{m}");
    assert_eq!(m["roles"]["client"]["started"], false, "{m}");
    assert_eq!(m["roles"]["server"]["stopped_by_run"], true, "{m}");
    assert!(
        m["roles"]["server"]["node"]
            .as_str()
            .is_some_and(|n| n.starts_with("kml-n")),
        "{m}"
    );
    // The server's own collection says it was stopped by a signal.
    let own = read_json(&run.join("server/manifest.json"));
    assert_eq!(own["status"], "complete", "{own}");
    // Nothing left on any node: no redis-server, no srun, no role.
    let left = processes_with(&["redis-server", &format!("{net}.")]);
    assert!(left.is_empty(), "left running: {left:?}");
    let left = processes_with(&["srun", s(&dir)]);
    assert!(left.is_empty(), "left running: {left:?}");
    let left = processes_with(&[s(&dir)]);
    assert!(left.is_empty(), "left running: {left:?}");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}
