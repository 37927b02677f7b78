//! `[build]` of an experiment file under `--executor local`: the commands
//! run once on this machine before the first run, in the experiment
//! file's folder, and the artefact they build is what a script benchmark
//! runs; a second `run` or `resume` finds the build up to date (counted in
//! `build/<node>.json`), a changed input builds again, and a failing
//! command or an input others may write is one error line with no run
//! started.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Output,
};

use kernmlops_e2e::*;
use serde_json::Value;

#[path = "support/build_fixture.rs"]
mod build_fixture;
use build_fixture::{builds, tool};

fn plugins(test: &str) -> PathBuf {
    plugin_dir(test, &[("workloads", "workloads")])
}

fn experiment(plugins: &Path, args: &[&str]) -> Output {
    let _serial = serial();
    experiment_in_root(plugins, args)
}

/// An experiment folder `work` with the bench sources, the wrapper script
/// and an experiment file whose `[build]` runs `commands`.
fn setup(work: &Path, commands: &str) -> PathBuf {
    build_fixture::one_benchmark(work, "built", commands, 42)
}

/// `(runs, skips)` of this node's build record.
fn counts(dir: &Path) -> (u64, u64) {
    build_fixture::counts(dir, &this_node())
}

fn results_of_runs(dir: &Path) -> Vec<Value> {
    let mut v: Vec<Value> = std::fs::read_dir(dir.join("runs"))
        .expect("runs/")
        .flatten()
        .map(|e| read_json(&e.path().join("indicator.json")))
        .collect();
    v.sort_by_key(|i| i["@result"]["value"].as_u64());
    v
}

#[test]
fn root_build_runs_once_is_skipped_when_unchanged_and_runs_again_on_a_changed_input() {
    let test = "root_build_runs_once_is_skipped_when_unchanged_and_runs_again_on_a_changed_input";
    if !require_root(test) {
        return;
    }
    let plugins = plugins("build-cache");
    let work = temp_dir("build-cache");
    // The second command writes into the build's own inputs, which must
    // not make the next build look stale.
    let file = setup(
        &work,
        "[\"./bench/make.sh\", \"echo generated > bench/generated.txt\"]",
    );
    let dir = work.join("exp");
    let node = this_node();
    let progress = format!("build on {node}: ");

    let out = experiment(
        &plugins,
        &["run", s(&file), "--dir", s(&dir), "--no-graphs"],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("2 runs: 2 done"), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!("{progress}ran in ")),
        "progress line: {stderr}"
    );
    assert_eq!(
        builds(&work),
        std::slice::from_ref(&node),
        "built once for two runs"
    );
    assert_eq!(counts(&dir), (1, 0));
    // The runs ran the built artefact.
    let results = results_of_runs(&dir);
    assert_eq!(results.len(), 2);
    for ind in &results {
        assert_eq!(ind["@result"]["value"], 42, "{ind}");
        assert_eq!(ind["@result"]["built_on"], node.as_str(), "{ind}");
    }
    let log =
        std::fs::read_to_string(dir.join("build").join(format!("{node}.log"))).expect("build log");
    assert!(log.contains("./bench/make.sh"), "{log}");

    // Unchanged inputs: `resume` and `run` again skip it, counted.
    let out = experiment(&plugins, &["resume", s(&dir), "--no-graphs"]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("{progress}up to date")),
        "{stderr}"
    );
    let out = experiment(
        &plugins,
        &["run", s(&file), "--dir", s(&dir), "--no-graphs"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(builds(&work).len(), 1, "no build when nothing changed");
    assert_eq!(counts(&dir), (1, 2));

    // A changed input builds again; its runs then use the new artefact.
    std::fs::write(work.join("bench/tool.in"), tool(43)).expect("tool.in");
    let out = experiment(
        &plugins,
        &["resume", s(&dir), "--retry-failed", "--no-graphs"],
    );
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("{progress}ran in ")), "{stderr}");
    assert_eq!(builds(&work).len(), 2);
    assert_eq!(counts(&dir), (2, 2));
    let tool_now = std::fs::read_to_string(work.join("out").join(&node).join("tool"))
        .expect("out/<node>/tool");
    assert!(tool_now.contains("43"), "{tool_now}");

    // What a Slurm node does: `experiment build DIR` alone, and
    // `experiment exec DIR RUN_ID`, which builds first.
    std::fs::write(work.join("bench/tool.in"), tool(44)).expect("tool.in");
    for (args, wanted, count) in [
        (vec!["build", s(&dir)], "ran in ", (3, 2)),
        (vec!["build", s(&dir)], "up to date", (3, 3)),
    ] {
        let out = experiment(&plugins, &args);
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        assert!(stderr.contains(&format!("{progress}{wanted}")), "{stderr}");
        assert_eq!(counts(&dir), count, "{args:?}");
    }
    std::fs::write(work.join("bench/tool.in"), tool(45)).expect("tool.in");
    let record = read_json(&dir.join("experiment.json"));
    let run_id = record["runs"][0]["run_id"].as_str().expect("run_id");
    let out = experiment(&plugins, &["exec", s(&dir), run_id, "--retry-failed"]);
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&format!("{progress}ran in ")), "{stderr}");
    assert_eq!(counts(&dir), (4, 3));
    assert_eq!(builds(&work).len(), 4);
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn root_build_failing_or_untrusted_is_one_error_line_and_no_run() {
    let test = "root_build_failing_or_untrusted_is_one_error_line_and_no_run";
    if !require_root(test) {
        return;
    }
    let plugins = plugins("build-fail");
    for (case, commands, world_writable, wanted) in [
        (
            "failing",
            r#"["./bench/make.sh", "echo compiling; echo 'boom: no header x.h' >&2; exit 3"]"#,
            false,
            &["exit status: 3", "boom: no header x.h", "compiling"][..],
        ),
        (
            "untrusted",
            r#"["./bench/make.sh"]"#,
            true,
            &["refusing [build] input", "tool.in", "chmod"][..],
        ),
    ] {
        let work = temp_dir(&format!("build-{case}"));
        let file = setup(&work, commands);
        if world_writable {
            std::fs::set_permissions(
                work.join("bench/tool.in"),
                std::fs::Permissions::from_mode(0o666),
            )
            .expect("chmod");
        }
        let dir = work.join("exp");
        let out = experiment(
            &plugins,
            &["run", s(&file), "--dir", s(&dir), "--no-graphs"],
        );
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{case}: {stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
        assert_eq!(errors.len(), 1, "{case}: one error line: {stderr}");
        assert!(errors[0].starts_with("error: "), "{case}: {stderr}");
        for w in wanted {
            assert!(errors[0].contains(w), "{case}: {w:?} in {}", errors[0]);
        }
        // No run started.
        let runs = std::fs::read_dir(dir.join("runs"))
            .map(|r| r.count())
            .unwrap_or(0);
        assert_eq!(runs, 0, "{case}: no run may start after a failed build");
        let _ = std::fs::remove_dir_all(&work);
    }
    let _ = std::fs::remove_dir_all(&plugins);
}
