//! `kernmlops run --cgroup-workload`: the probes record only the
//! benchmark's own processes (its workload cgroup, made before the probes
//! start, and below), filtered in the kernel. A busy process outside the
//! run switches and starts `sleep` processes all along: with the flag its
//! rows are gone, without it they are there (so the check can fail).

use std::{collections::BTreeSet, path::Path, process::Command};

use kernmlops_e2e::*;

/// The benchmark: a shell that writes its pid, then becomes a python
/// process that switches often for about two seconds, and prints its
/// indicator.
const WORKLOAD: &str = "#!/bin/sh\necho $$ > \"$KML_OUTPUT_DIR/workload.pid\"\n\
exec python3 -c 'import time\nfor _ in range(800): time.sleep(0.002)\n\
print(\"{\\\"name\\\": \\\"w\\\", \\\"component\\\": \\\"test\\\", \\\"@result\\\": {\\\"value\\\": 1}}\")'\n";

/// One run of the workload with quanta_runtime and process_trace, with
/// `extra` flags: the collection folder.
fn run(work: &Path, plugins: &Path, extra: &[&str]) -> std::path::PathBuf {
    let output = work.join(format!("out{}", extra.len()));
    let config = work.join("config.toml");
    let mut args = vec![
        "--config",
        s(&config),
        "run",
        "--plugin-dir",
        s(plugins),
        "--plugins",
        "quanta_runtime,process_trace",
        "--benchmark",
        "script",
        "--output",
        s(&output),
    ];
    args.extend_from_slice(extra);
    let out = kernmlops(&args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{extra:?}: {stdout}\n{stderr}");
    only_collection(&output)
}

#[test]
fn root_cgroup_workload_records_the_benchmarks_processes_and_nobody_elses() {
    let test = "root_cgroup_workload_records_the_benchmarks_processes_and_nobody_elses";
    if !require_root(test) || !require_tool(test, "python3") {
        return;
    }
    if cgroup2_mount().is_none() {
        assert!(!in_ci(), "cgroup v2 is needed for --cgroup-workload");
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir(
        "cgroup-workload",
        &[
            ("workloads", "workloads"),
            ("quanta_runtime", "quanta_runtime"),
            ("process_trace", "process_trace"),
        ],
    );
    let work = temp_dir("cgroup-workload");
    let script = work.join("workload.sh");
    std::fs::write(&script, WORKLOAD).expect("script");
    let chmod = Command::new("chmod").arg("755").arg(&script).status();
    assert!(chmod.is_ok_and(|s| s.success()));
    std::fs::write(
        work.join("config.toml"),
        format!(
            "[benchmarks.script]\ncommand = [{:?}]\ndrop_page_cache = false\n",
            s(&script)
        ),
    )
    .expect("config");
    // Outside the run: switches, and starts a `sleep` every few ms.
    let noise = KillOnDrop(
        Command::new("sh")
            .args(["-c", "while :; do sleep 0.002; done"])
            .spawn()
            .expect("spawning the busy process"),
    );
    let noise_pid = u64::from(noise.id());

    let filtered = run(&work, &plugins, &["--cgroup-workload"]);
    let unfiltered = run(&work, &plugins, &[]);
    drop(noise);

    let pid_of = |dir: &Path| -> u64 {
        let text = std::fs::read_to_string(dir.join("workload.pid")).expect("workload.pid");
        text.trim().parse().expect("a pid")
    };
    let tgids = |dir: &Path| -> Vec<u64> {
        column_u64(&read_table(&dir.join("quanta_runtime.arrow")), "tgid")
    };
    let names = |dir: &Path| -> Vec<String> {
        column_str(&read_table(&dir.join("process_trace.arrow")), "name")
            .into_iter()
            .flatten()
            .collect()
    };

    // With the flag: the workload's rows, and only those of processes it
    // started (a `python3` may be a shim that runs helpers first), none of
    // the busy process nor of anything that ran before the run.
    let workload = pid_of(&filtered);
    let rows = tgids(&filtered);
    assert!(
        rows.iter().filter(|&&t| t == workload).count() > 100,
        "the workload switches often: {} rows",
        rows.len()
    );
    let trace = read_table(&filtered.join("process_trace.arrow"));
    let its_own: BTreeSet<u64> = column_u64(&trace, "tgid").into_iter().collect();
    assert!(its_own.contains(&workload), "{its_own:?}");
    let others: BTreeSet<u64> = rows
        .iter()
        .copied()
        .filter(|t| !its_own.contains(t))
        .collect();
    assert!(others.is_empty(), "rows of other processes: {others:?}");
    assert!(!rows.contains(&noise_pid), "rows of the busy process");
    let started = names(&filtered);
    assert!(started.iter().any(|n| n == "python3"), "{started:?}");
    assert!(!started.iter().any(|n| n == "sleep"), "{started:?}");
    let m = manifest(&filtered);
    let filter = &m["config"]["filter"];
    assert_eq!(filter["cgroup_workload"], true, "{m}");
    assert_eq!(filter["cgroup_descendants"], true, "{m}");

    // Without it, on the same kernel: the busy process is there.
    let rows = tgids(&unfiltered);
    assert!(
        rows.contains(&noise_pid),
        "unfiltered: no row of {noise_pid}"
    );
    assert!(names(&unfiltered).iter().any(|n| n == "sleep"));
    let m = manifest(&unfiltered);
    assert!(
        m["config"]["filter"].get("cgroup_workload").is_none(),
        "{m}"
    );

    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

/// Without a benchmark, or with another filter, the flag is refused in
/// one line before anything runs.
#[test]
fn cgroup_workload_needs_a_benchmark_and_no_other_filter() {
    for (args, needle) in [
        (
            &["run", "--cgroup-workload"][..],
            "the following required arguments were not provided",
        ),
        (
            &[
                "run",
                "--cgroup-workload",
                "--benchmark",
                "script",
                "--tgid",
                "1",
            ][..],
            "cannot be used with",
        ),
        (
            &[
                "run",
                "--cgroup-workload",
                "--benchmark",
                "script",
                "--cgroup",
                "/",
            ][..],
            "cannot be used with",
        ),
    ] {
        let out = kernmlops(args);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            stderr.lines().next().is_some_and(|l| l.contains("error:")) && stderr.contains(needle),
            "{args:?}: {stderr}"
        );
    }
}
