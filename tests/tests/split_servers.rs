//! The split server benchmarks as two roles under `--executor local`:
//! `redis_server` + `redis_load` (the shipped example, on a port of the
//! test's own) and `memcached_server` + `memcached_load`, with real
//! redis-server and memcached from Debian. The server role's own
//! collection holds the server's probe rows and no result; the load role's
//! figures are the run's result, measured against the server role's
//! address from the roles' environment; no server is left running.

use std::path::PathBuf;

use kernmlops_e2e::*;

/// The memcached pair, written like the shipped redis example.
fn memcached_file(port: u16) -> String {
    format!(
        "name = \"memcached_split\"\nrepeats = 2\n\
         [roles.server]\nbenchmark = \"memcached_server\"\nprobes = [\"quanta_runtime\"]\n\
         ready = {{ port = {port}, timeout_s = 30 }}\nparameters = {{ memory_mb = 32 }}\n\
         [roles.client]\nbenchmark = \"memcached_load\"\nprobes = []\nafter = \"server\"\n\
         result = true\nparameters = {{ execute_number = 2000 }}\n\
         [variables.concurrency]\nkey = \"roles.client.parameters.concurrency\"\nvalues = [1, 2]\n"
    )
}

/// The shipped redis example on `port`, with fewer requests.
fn redis_file(port: u16) -> String {
    let example = workspace_root().join("examples/experiments/redis_split.toml");
    let text = std::fs::read_to_string(&example).expect("example");
    assert!(text.contains("port = 6391"), "the example's ready port");
    text.replace("port = 6391", &format!("port = {port}"))
        .replace("requests = 20000", "requests = 5000")
}

/// A pair: its name, the tools it needs, its experiment file for a port,
/// the load's figure checked, the server's command name.
type Case = (
    &'static str,
    &'static [&'static str],
    fn(u16) -> String,
    &'static str,
    &'static str,
);

#[test]
fn root_split_server_and_load_benchmarks_run_as_two_roles() {
    let test = "root_split_server_and_load_benchmarks_run_as_two_roles";
    if !require_root(test) {
        return;
    }
    let cases: [Case; 2] = [
        (
            "redis",
            &["redis-server", "redis-benchmark"],
            redis_file,
            "get_rps",
            "redis-server",
        ),
        (
            "memcached",
            &["memcached", "memcslap"],
            memcached_file,
            "ops_per_s",
            "memcached",
        ),
    ];
    let plugins = plugin_dir(
        "split-servers",
        &[
            ("workloads", "workloads"),
            ("quanta_runtime", "quanta_runtime"),
        ],
    );
    for (name, tools, file_text, figure, server) in cases {
        if !tools.iter().all(|t| require_tool(test, t)) {
            continue;
        }
        let work = temp_dir(&format!("split-{name}"));
        let port = free_port();
        let file = work.join(format!("{name}.toml"));
        std::fs::write(&file, file_text(port)).expect("experiment file");
        let before = pids_named(server);
        let dir = work.join("exp");
        let out = {
            let _serial = serial();
            experiment_in_root(
                &plugins,
                &[
                    "run",
                    s(&file),
                    "--dir",
                    s(&dir),
                    "--no-graphs",
                    "--executor",
                    "local",
                ],
            )
        };
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(
            out.status.success(),
            "{name}: {stdout}\n{stderr}\n{}",
            experiment_logs(&dir)
        );
        assert!(
            stdout.contains("4 runs: 4 done"),
            "{name}: {stdout}\n{stderr}"
        );
        let mut runs: Vec<PathBuf> = std::fs::read_dir(dir.join("runs"))
            .expect("runs/")
            .flatten()
            .map(|e| e.path())
            .collect();
        runs.sort();
        assert_eq!(runs.len(), 4, "{name}: {runs:?}");
        for run in &runs {
            let m = read_json(&run.join("manifest.json"));
            assert_eq!(m["status"], "complete", "{name}: {m}");
            assert_eq!(m["roles"]["server"]["stopped_by_run"], true, "{name}: {m}");
            // The server's collection: its probe saw the server run, and it
            // reported no figures of its own.
            let srv = read_json(&run.join("server/manifest.json"));
            let rows = srv["tables"]["quanta_runtime"]["rows"]
                .as_u64()
                .unwrap_or(0);
            assert!(rows > 0, "{name}: the server's quanta_runtime rows: {srv}");
            let own = read_json(&run.join("server/indicator.json"));
            assert_eq!(own["@result"], serde_json::json!({}), "{name}: {own}");
            let server_log = std::fs::read_dir(run.join("server"))
                .expect("server collection")
                .flatten()
                .any(|e| e.file_name() == "server.stdout");
            assert!(server_log, "{name}: the server's output in its collection");
            // The load's figures are the run's, measured against the
            // server role's port.
            let ind = read_json(&run.join("indicator.json"));
            assert!(
                ind["@result"][figure].as_f64().is_some_and(|x| x > 0.0),
                "{name}: {ind}"
            );
            assert_eq!(
                ind["@parameters"]["port"], port,
                "{name}: the role's port: {ind}"
            );
            assert_eq!(ind["@parameters"]["host"], "127.0.0.1", "{name}: {ind}");
            assert_eq!(ind, read_json(&run.join("client/indicator.json")));
        }
        let left: Vec<u32> = pids_named(server)
            .into_iter()
            .filter(|p| !before.contains(p))
            .collect();
        assert!(left.is_empty(), "{name}: {server} left running: {left:?}");
        let _ = std::fs::remove_dir_all(&work);
    }
    let _ = std::fs::remove_dir_all(&plugins);
}
