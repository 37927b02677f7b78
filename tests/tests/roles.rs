//! Experiments with roles under `--executor local`: every role on this
//! machine. The shipped two-role example's scripts (Debian's redis-server
//! as the measured server, redis-benchmark as its client) over two values
//! of a variable and two repeats give every run the server's collection
//! and the client's result, named with their node in the run's manifest,
//! and one results row per run, the server's collection holding only the
//! server's processes (roles on one kernel are filtered to their own
//! cgroup, unless `filter = "none"`); roles ready by a line of their output and
//! by a file start in dependency order and see every role's address; a
//! role that never becomes ready fails its run with the reason after its
//! timeout and leaves no process behind.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use kernmlops_e2e::*;
use serde_json::Value;

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

/// The run folders of an experiment.
fn runs(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("runs"))
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn hostname() -> String {
    let out = Command::new("hostname").output().expect("hostname");
    text(&out.stdout).trim().to_owned()
}

#[test]
fn root_roles_redis_server_and_client_run_locally_with_one_row_per_run() {
    let test = "root_roles_redis_server_and_client_run_locally_with_one_row_per_run";
    if !require_root(test)
        || !require_tool(test, "redis-server")
        || !require_tool(test, "redis-benchmark")
        || !require_tool(test, "python3")
    {
        return;
    }
    let plugins = plugins("roles-redis");
    let work = temp_dir("roles-redis");
    let port = free_port();
    // The shipped example, on a port of this test's own.
    let example = workspace_root().join("examples/experiments/redis_roles.toml");
    let text_of = std::fs::read_to_string(&example).expect("example");
    assert!(text_of.contains("port = 6390"), "the example's ready port");
    let examples = workspace_root().join("examples/experiments");
    let file = work.join("redis_roles.toml");
    std::fs::write(
        &file,
        text_of
            .replace("port = 6390", &format!("port = {port}"))
            .replace(
                "\"./redis_server.sh\"",
                &format!("{:?}", s(&examples.join("redis_server.sh"))),
            )
            .replace(
                "\"./redis_load.sh\"",
                &format!("{:?}", s(&examples.join("redis_load.sh"))),
            )
            .replace("requests = 20000", "requests = 5000")
            .replace(
                "probes = [\"quanta_runtime\"]",
                "probes = [\"quanta_runtime\", \"process_trace\"]",
            ),
    )
    .expect("experiment file");
    let dir = work.join("exp");
    let out = {
        let _serial = serial();
        experiment(
            &plugins,
            &["run", s(&file), "--dir", s(&dir), "--no-graphs"],
        )
    };
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("4 runs: 4 done"), "{stdout}\n{stderr}");

    let node = hostname();
    let run_dirs = runs(&dir);
    assert_eq!(run_dirs.len(), 4, "{run_dirs:?}");
    for run in &run_dirs {
        let m = read_json(&run.join("manifest.json"));
        assert_eq!(m["status"], "complete", "{}: {m}", run.display());
        assert_eq!(m["executor"], "local");
        // Every role named, with its node and its collection.
        for role in ["server", "client"] {
            let r = &m["roles"][role];
            assert_eq!(r["node"], node.as_str(), "{role}: {m}");
            assert_eq!(r["collection"], role);
            assert!(run.join(role).join("manifest.json").is_file(), "{role}");
        }
        assert_eq!(m["roles"]["server"]["stopped_by_run"], true, "{m}");
        assert!(m["roles"]["server"]["ready_after_s"].as_f64().is_some());
        // The server's own full collection, with its probe's rows.
        let server = read_json(&run.join("server/manifest.json"));
        let rows = server["tables"]["quanta_runtime"]["rows"]
            .as_u64()
            .unwrap_or(0);
        assert!(rows > 0, "the server's quanta_runtime rows: {server}");
        assert!(run.join("server/quanta_runtime.arrow").is_file());
        // On one kernel, the server's collection holds only the server's
        // processes: redis-server, never the client's redis-benchmark.
        assert_eq!(m["roles"]["server"]["filtered"], true, "{m}");
        assert_eq!(m["roles"]["client"]["filtered"], false, "{m}");
        assert_eq!(server["config"]["filter"]["cgroup_workload"], true);
        let (foreign, names) = role_view(&run.join("server"));
        assert!(foreign.is_empty(), "rows of other processes: {foreign:?}");
        assert!(names.contains("redis-server"), "{names:?}");
        assert!(!names.contains("redis-benchmark"), "{names:?}");
        // The client: no probe, its result is the run's.
        let client = read_json(&run.join("client/manifest.json"));
        assert_eq!(client["run_class"], "baseline", "{client}");
        assert!(!run.join("client/quanta_runtime.arrow").exists());
        let ind = read_json(&run.join("indicator.json"));
        assert!(
            ind["@result"]["get_per_s"]
                .as_f64()
                .is_some_and(|x| x > 0.0),
            "{ind}"
        );
        assert_eq!(ind, read_json(&run.join("client/indicator.json")));
    }

    // results.parquet: one row per run, each with the client's figures and
    // each role's node, rows and lost events.
    let py = Command::new("python3")
        .arg("-c")
        .arg(
            r#"
import json, sys, polars as pl
df = pl.read_parquet(sys.argv[1])
print(json.dumps(df.to_dicts()))
"#,
        )
        .arg(dir.join("results.parquet"))
        .output()
        .expect("python3");
    assert!(py.status.success(), "{}", text(&py.stderr));
    let rows: Vec<Value> = serde_json::from_str(text(&py.stdout).trim()).expect("rows");
    assert_eq!(rows.len(), 4);
    let mut clients: Vec<i64> = rows.iter().filter_map(|r| r["clients"].as_i64()).collect();
    clients.sort();
    assert_eq!(clients, [1, 1, 8, 8]);
    for row in &rows {
        assert_eq!(row["param_clients"], row["clients"], "{row}");
        assert!(
            row["result_set_per_s"].as_f64().is_some_and(|x| x > 0.0),
            "{row}"
        );
        assert_eq!(row["node_server"], node.as_str(), "{row}");
        assert_eq!(row["node_client"], node.as_str(), "{row}");
        assert!(
            row["rows_server_quanta_runtime"]
                .as_i64()
                .is_some_and(|x| x > 0),
            "{row}"
        );
        assert!(
            row["lost_server_quanta_runtime"].as_i64().is_some(),
            "{row}"
        );
    }
    // Every server was stopped with the run.
    let left = processes_with(&[&format!("--port {port}")]);
    assert!(left.is_empty(), "left running: {left:?}");

    // filter = "none": the same kernel seen whole, the client's
    // redis-benchmark among the server's processes.
    let whole = work.join("whole.toml");
    let text_of = std::fs::read_to_string(&file).expect("experiment file");
    std::fs::write(
        &whole,
        text_of
            .replace("repeats = 2", "repeats = 1")
            .replace("values = [1, 8]", "values = [8]")
            .replace("ready = {", "filter = \"none\"\nready = {"),
    )
    .expect("experiment file");
    let dir = work.join("whole");
    let out = {
        let _serial = serial();
        experiment(
            &plugins,
            &["run", s(&whole), "--dir", s(&dir), "--no-graphs"],
        )
    };
    let both = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(both.contains("1 runs: 1 done"), "{both}");
    let run = &runs(&dir)[0];
    let m = read_json(&run.join("manifest.json"));
    assert_eq!(m["roles"]["server"]["filtered"], false, "{m}");
    let (foreign, names) = role_view(&run.join("server"));
    assert!(names.contains("redis-benchmark"), "{names:?}");
    assert!(
        !foreign.is_empty(),
        "unfiltered, yet only the server's rows"
    );
    let left = processes_with(&[&format!("--port {port}")]);
    assert!(left.is_empty(), "left running: {left:?}");
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn root_roles_a_role_never_ready_fails_its_run_after_the_timeout_leaving_nothing() {
    let test = "root_roles_a_role_never_ready_fails_its_run_after_the_timeout_leaving_nothing";
    if !require_root(test) {
        return;
    }
    let plugins = plugins("roles-never-ready");
    let work = temp_dir("roles-never-ready");
    let port = free_port();
    // A server that never listens, and the child it starts.
    let server = work.join(format!("never-ready-{}.sh", std::process::id()));
    std::fs::write(
        &server,
        "#!/bin/sh\n[ \"${1:-}\" = child ] || \"$0\" child &\nwhile :; do sleep 1; done\n",
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
    assert!(chmod.is_ok_and(|s| s.success()));
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
    let started = Instant::now();
    let out = {
        let _serial = serial();
        experiment(
            &plugins,
            &["run", s(&file), "--dir", s(&dir), "--no-graphs"],
        )
    };
    let took = started.elapsed();
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    let both = format!("{stdout}\n{stderr}");
    assert!(both.contains("1 failed"), "{both}");
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(60),
        "{took:?}"
    );
    let run_dirs = runs(&dir);
    assert_eq!(run_dirs.len(), 1);
    let m = read_json(&run_dirs[0].join("manifest.json"));
    assert_eq!(m["status"], "failed", "{m}");
    let reason = m["errors"][0].as_str().unwrap_or_default();
    assert!(
        reason.contains("role server was not ready after 3 s")
            && reason.contains(&format!("nothing answered on port {port}")),
        "{reason}"
    );
    assert!(both.contains("not ready after 3 s"), "{both}");
    // The client never started; the server was stopped with its child.
    assert_eq!(m["roles"]["client"]["started"], false, "{m}");
    assert_eq!(m["roles"]["server"]["stopped_by_run"], true, "{m}");
    assert!(!run_dirs[0].join("client").exists());
    let name = server.file_name().and_then(|n| n.to_str()).unwrap_or("?");
    let left = processes_with(&[name]);
    assert!(left.is_empty(), "left running: {left:?}");
    // results.parquet has the failed run's row with its reason.
    assert!(dir.join("results.parquet").is_file());
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn root_roles_ready_by_line_and_by_file_start_in_order_and_see_each_other() {
    let test = "root_roles_ready_by_line_and_by_file_start_in_order_and_see_each_other";
    if !require_root(test) {
        return;
    }
    let plugins = plugins("roles-line-file");
    let work = temp_dir("roles-line-file");
    let seen = work.join("seen");
    // `logger` is ready once it printed its line (after a second), `marker`
    // once the file `up` is in its collection (KML_OUTPUT_DIR), after
    // `logger`; `client` waits for both and writes down what it sees.
    let logger = work.join("logger.sh");
    std::fs::write(
        &logger,
        "#!/bin/sh\nsleep 1\necho \"logger listening at $(date +%s%N)\" >&2\nwhile :; do sleep 1; done\n",
    )
    .expect("script");
    let marker = work.join("marker.sh");
    std::fs::write(
        &marker,
        format!(
            "#!/bin/sh\necho \"marker $(date +%s%N)\" >> {seen:?}\nsleep 1\ntouch \"$KML_OUTPUT_DIR/up\"\nwhile :; do sleep 1; done\n"
        ),
    )
    .expect("script");
    let client = work.join("client.sh");
    std::fs::write(
        &client,
        format!(
            "#!/bin/sh\n{{ echo \"client $(date +%s%N)\"; env | grep '^KML_ROLE' | sort; }} >> {seen:?}\n\
             echo '{{\"name\": \"c\", \"component\": \"test\", \"@result\": {{\"value\": 1}}}}'\n"
        ),
    )
    .expect("script");
    let chmod = Command::new("chmod")
        .arg("755")
        .args([&logger, &marker, &client])
        .status();
    assert!(chmod.is_ok_and(|s| s.success()));
    let file = work.join("three.toml");
    std::fs::write(
        &file,
        format!(
            "name = \"three\"\nrepeats = 1\n\
             [config.benchmarks.script]\ndrop_page_cache = false\n\
             [roles.client]\nbenchmark = \"script\"\nscript = {:?}\nprobes = []\n\
             after = [\"marker\", \"logger\"]\nresult = true\n\
             [roles.marker]\nbenchmark = \"script\"\nscript = {:?}\nprobes = []\n\
             after = \"logger\"\nready = {{ file = \"up\", timeout_s = 20 }}\n\
             [roles.logger]\nbenchmark = \"script\"\nscript = {:?}\nprobes = []\n\
             ready = {{ line = \"logger listening\", timeout_s = 20 }}\n",
            s(&client),
            s(&marker),
            s(&logger)
        ),
    )
    .expect("experiment file");
    let dir = work.join("exp");
    let out = {
        let _serial = serial();
        experiment(
            &plugins,
            &["run", s(&file), "--dir", s(&dir), "--no-graphs"],
        )
    };
    let both = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{both}");
    assert!(both.contains("1 runs: 1 done"), "{both}");
    let run = &runs(&dir)[0];
    let m = read_json(&run.join("manifest.json"));
    for role in ["logger", "marker"] {
        let r = &m["roles"][role];
        assert!(
            r["ready_after_s"].as_f64().is_some_and(|s| s >= 0.9),
            "{role} became ready only after its second: {m}"
        );
        assert_eq!(r["stopped_by_run"], true, "{m}");
    }
    assert!(run.join("marker/up").is_file());
    // The logger's line was in its output before the marker started, and
    // the marker's file before the client started.
    let logged = std::fs::read_to_string(run.join("logger/benchmark.stderr")).expect("stderr");
    let at = |text: &str, word: &str| -> u128 {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(word)
                    .and_then(|r| r.split_whitespace().last())
                    .and_then(|n| n.parse().ok())
            })
            .unwrap_or_else(|| panic!("no {word} line in {text}"))
    };
    let order = std::fs::read_to_string(&seen).expect("seen");
    let logger_ready = at(&logged, "logger listening");
    let marker_started = at(&order, "marker ");
    let client_started = at(&order, "client ");
    assert!(logger_ready < marker_started, "{logged}\n{order}");
    assert!(marker_started + 900_000_000 < client_started, "{order}");
    // Every role's address, in every role's environment.
    for role in ["LOGGER", "MARKER", "CLIENT"] {
        assert!(
            order.contains(&format!("KML_ROLE_{role}_HOST=127.0.0.1")),
            "{order}"
        );
        assert!(order.contains(&format!("KML_ROLE_{role}_NODE={}", hostname())));
    }
    assert!(order.contains("KML_ROLE=client"), "{order}");
    let mut listed: Vec<&str> = order
        .lines()
        .find_map(|l| l.strip_prefix("KML_ROLES="))
        .unwrap_or_else(|| panic!("no KML_ROLES: {order}"))
        .split(',')
        .collect();
    listed.sort();
    assert_eq!(listed, ["client", "logger", "marker"]);
    for script in ["logger.sh", "marker.sh"] {
        let left = processes_with(&[s(&work.join(script))]);
        assert!(left.is_empty(), "left running: {left:?}");
    }
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}
