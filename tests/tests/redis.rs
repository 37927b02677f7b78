//! The whole path with a real server: `kernmlops run --benchmark redis`
//! with quanta_runtime and process_trace gives curated data in which the
//! redis-server process appears, and leaves nothing running.

use std::path::PathBuf;

use kernmlops_e2e::*;

#[test]
fn root_redis_run_is_curated_and_leaves_nothing_running() {
    if !require_root("root_redis_run_is_curated_and_leaves_nothing_running")
        || !require_tool("redis", "redis-server")
        || !require_tool("redis", "redis-benchmark")
    {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir(
        "redis",
        &[
            ("quanta_runtime", "quanta_runtime"),
            ("process_trace", "process_trace"),
            ("workloads", "workloads"),
        ],
    );
    let work = temp_dir("redis-work");
    let cfg = work.join("redis.toml");
    std::fs::write(&cfg, "[benchmarks.redis]\nrequests = 20000\nclients = 10\n").expect("write");
    let before = pids_named("redis-server");
    let output = work.join("out");
    let out = kernmlops(&[
        "--config",
        cfg.to_str().expect("utf8"),
        "run",
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "quanta_runtime,process_trace",
        "--benchmark",
        "redis",
        "--duration",
        "120s",
        "--output",
        output.to_str().expect("utf8"),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let dir: PathBuf = stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("collection ")?
                .split_once(" in ")
                .map(|(_, d)| PathBuf::from(d.trim()))
        })
        .expect("collection folder printed");
    let man = manifest(&dir);
    assert_eq!(man["run_class"], "curated", "{man}");
    assert_eq!(man["benchmark"]["exit_code"], 0);

    let trace = read_table(&dir.join("process_trace.arrow"));
    let names = column_str(&trace, "name");
    let kinds = column_str(&trace, "cap_type");
    let server_execs = names
        .iter()
        .zip(&kinds)
        .filter(|(n, k)| n.as_deref() == Some("redis-server") && k.as_deref() == Some("exec"))
        .count();
    assert!(
        server_execs >= 1,
        "redis-server's exec is not in process_trace"
    );
    let rows: usize = read_table(&dir.join("quanta_runtime.arrow"))
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert!(
        rows > 1000,
        "a redis benchmark switches a lot; got {rows} quanta rows"
    );

    let left: Vec<u32> = pids_named("redis-server")
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert!(
        left.is_empty(),
        "redis-server processes left running: {left:?}"
    );
    assert!(
        pids_named("redis-benchmark").is_empty(),
        "redis-benchmark left running"
    );
}
