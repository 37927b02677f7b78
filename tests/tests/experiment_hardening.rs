//! Experiments cannot be turned against the machine they run on as root,
//! and are checked and bounded before anything is written: an untrusted
//! script is refused (a warning under `--allow-insecure-plugins`), a
//! relative script is the one beside the experiment file whatever the
//! current folder, the planner leaves no temporary file to plant a symlink
//! at, experiment folders others can write are refused, a plan of 10^9
//! runs is refused at once, every benchmark and power rule is applied at
//! plan time with no folder created, a SIGKILL early in `experiment run`
//! leaves a folder the command it names carries on, and a timeout too long
//! for a duration is one error line.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use kernmlops_e2e::*;

/// `nobody` on Debian.
const NOBODY: u32 = 65534;

/// A plugin folder with the workloads (the `script` benchmark) alone.
fn plugins(test: &str) -> PathBuf {
    plugin_dir(test, &[("workloads", "workloads")])
}

/// `kernmlops [PRE..] --plugin-dir P experiment ARGS` run in `cwd`.
fn experiment_in(cwd: &Path, plugins: &Path, pre: &[&str], args: &[&str]) -> Output {
    experiment_cmd(Some(cwd), plugins, pre, args)
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// An executable script `name` in `dir` that appends `tag` to `marker`
/// and prints one performance indicator.
fn script(dir: &Path, name: &str, marker: &Path, tag: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\necho {tag} >> {marker}\necho '{{\"name\": \"t\", \"component\": \"sh\", \"@result\": {{\"value\": 1}}}}'\n",
            marker = marker.display()
        ),
    )
    .expect("script");
    chmod(&path, 0o755);
    path
}

/// An experiment file of `runs` baseline runs of `command` (TOML list
/// text), with `extra` lines in its `[config.benchmarks.script]`.
fn experiment_file(path: &Path, command: &str, runs: u32, extra: &str) {
    std::fs::write(
        path,
        format!(
            "name = \"hard\"\nbenchmark = \"script\"\nprobes = []\nrepeats = {runs}\nseed = 3\n\
             [config.benchmarks.script]\ncommand = {command}\ndrop_page_cache = false\n{extra}"
        ),
    )
    .expect("experiment file");
}

/// The one `error:` line of a refusal (stderr holds nothing else).
fn one_error_line(out: &Output, what: &str) -> String {
    let stderr = text(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        !out.status.success() && lines.len() == 1 && lines[0].starts_with("error: "),
        "{what}: expected one error line, got (exit {}):\n{stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    lines[0].to_owned()
}

#[test]
fn root_an_untrusted_script_is_refused_and_warned_under_allow_insecure() {
    let test = "root_an_untrusted_script_is_refused_and_warned_under_allow_insecure";
    if !require_root(test) {
        return;
    }
    let plugins = plugins("hard-untrusted");
    let work = temp_dir("hard-untrusted");
    let marker = work.join("marker");
    let nobodys = work.join("nobodys");
    std::fs::create_dir(&nobodys).expect("folder");
    for (case, folder, mode, file_owner, folder_owner) in [
        ("world-writable script", &work, 0o777, 0, 0),
        ("script in a folder nobody owns", &nobodys, 0o755, 0, NOBODY),
        ("script nobody owns", &work, 0o755, NOBODY, 0),
    ] {
        let path = script(folder, "s.sh", &marker, "ran");
        chmod(&path, mode);
        std::os::unix::fs::chown(&path, Some(file_owner), Some(file_owner)).expect("chown");
        std::os::unix::fs::chown(folder, Some(folder_owner), Some(folder_owner)).expect("chown");
        let file = work.join("exp.toml");
        experiment_file(&file, &format!("[{:?}]", s(&path)), 1, "");
        let dir = work.join("exp");
        let out = experiment_in(
            &work,
            &plugins,
            &[],
            &["run", s(&file), "--dir", s(&dir), "--no-graphs"],
        );
        let line = one_error_line(&out, case);
        assert!(
            line.contains("refusing to run the program") && line.contains("fix: ch"),
            "{case}: {line}"
        );
        assert!(!dir.exists(), "{case}: nothing is created");
        assert!(!marker.exists(), "{case}: the script never ran");
        // As an interpreter's script argument, relative to the experiment
        // file's folder: checked the same way.
        if folder == &work {
            experiment_file(&file, "[\"sh\", \"s.sh\"]", 1, "");
            let out = experiment_in(&work, &plugins, &[], &["run", s(&file), "--dry-run"]);
            let line = one_error_line(&out, &format!("{case}, as sh's argument"));
            assert!(line.contains("refusing to run the file"), "{case}: {line}");
        }
        // Under --allow-insecure-plugins: planned, with a warning.
        experiment_file(&file, &format!("[{:?}]", s(&path)), 1, "");
        let out = experiment_in(
            &work,
            &plugins,
            &["--allow-insecure-plugins"],
            &["run", s(&file), "--dry-run"],
        );
        let stderr = text(&out.stderr);
        assert!(
            out.status.success()
                && stderr.contains("warning: running the program")
                && stderr.contains("(--allow-insecure-plugins)"),
            "{case} under --allow-insecure-plugins:\n{stderr}"
        );
        std::os::unix::fs::chown(folder, Some(0), Some(0)).expect("chown back");
        std::fs::remove_file(&path).expect("clean up");
    }
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn root_a_relative_script_is_the_one_beside_the_experiment_file() {
    let test = "root_a_relative_script_is_the_one_beside_the_experiment_file";
    if !require_root(test) {
        return;
    }
    let plugins = plugins("hard-relative");
    let work = temp_dir("hard-relative");
    let marker = work.join("marker");
    // The experiment and its script, in a folder root owns.
    let mine = work.join("mine");
    std::fs::create_dir(&mine).expect("folder");
    script(&mine, "bench.sh", &marker, "good");
    let file = mine.join("exp.toml");
    experiment_file(&file, "[\"./bench.sh\"]", 2, "");
    // The current folder: another user's, with a script of the same name
    // at the same relative path.
    let theirs = work.join("theirs");
    std::fs::create_dir(&theirs).expect("folder");
    script(&theirs, "bench.sh", &marker, "evil");
    for p in [&theirs, &theirs.join("bench.sh")] {
        std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).expect("chown");
    }
    let dir = work.join("exp");
    let out = {
        let _serial = serial();
        experiment_in(
            &theirs,
            &plugins,
            &[],
            &["run", s(&file), "--dir", s(&dir), "--no-graphs"],
        )
    };
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let ran = std::fs::read_to_string(&marker).unwrap_or_default();
    assert_eq!(ran.lines().collect::<Vec<_>>(), ["good", "good"], "{ran}");
    // The record and each run's configuration hold the absolute path of
    // the checked script, so a resume anywhere runs that file.
    let want = s(&mine.join("bench.sh")).to_owned();
    let record = std::fs::read_to_string(dir.join("experiment.json")).expect("record");
    assert!(record.contains(&format!("{want:?}")), "{record}");
    for entry in std::fs::read_dir(dir.join("configs")).expect("configs") {
        let config = std::fs::read_to_string(entry.expect("entry").path()).expect("config");
        assert!(config.contains(&format!("{want:?}")), "{config}");
    }
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

/// Starts `kernmlops ... experiment ARGS` stopped before it runs (`sh`
/// stops itself, then `exec`s it under the same pid), so a test can plant
/// files at paths named after that pid first; returns the child.
fn spawn_stopped(plugins: &Path, args: &[&str]) -> std::process::Child {
    let child = Command::new("sh")
        .arg("-c")
        .arg("kill -STOP $$; exec \"$@\"")
        .arg("sh")
        .arg(kernmlops_bin())
        .arg("--plugin-dir")
        .arg(plugins)
        .arg("experiment")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning");
    let stat = format!("/proc/{}/stat", child.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&stat).is_ok_and(|t| {
        t.rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('T'))
    }) {
        assert!(Instant::now() < deadline, "the child never stopped");
        std::thread::sleep(Duration::from_millis(5));
    }
    child
}

#[test]
fn the_planner_leaves_no_temporary_file_to_plant_a_symlink_at() {
    let plugins = plugins("hard-temp");
    let work = temp_dir("hard-temp");
    let victim = work.join("victim");
    std::fs::write(&victim, "precious\n").expect("victim");
    let file = work.join("exp.toml");
    for (case, extra) in [
        ("a good plan", ""),
        ("a plan refused by a rule", "thp_mode = \"sometimes\"\n"),
    ] {
        experiment_file(&file, "[\"/bin/true\"]", 1, extra);
        let child = spawn_stopped(&plugins, &["run", s(&file), "--dry-run"]);
        let pid = child.id();
        let planted = std::env::temp_dir().join(format!("kernmlops-experiment-{pid}.toml"));
        let _ = std::fs::remove_file(&planted);
        std::os::unix::fs::symlink(&victim, &planted).expect("planting");
        // SAFETY: kill(2) on our own stopped child.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) };
        let out = child.wait_with_output().expect("waiting");
        assert_eq!(
            out.status.success(),
            extra.is_empty(),
            "{case}: {}",
            text(&out.stderr)
        );
        assert_eq!(
            std::fs::read_to_string(&victim).expect("victim"),
            "precious\n",
            "{case}: the file behind the planted symlink was written"
        );
        let still = planted.symlink_metadata().expect("planted");
        assert!(still.file_type().is_symlink(), "{case}: replaced");
        std::fs::remove_file(&planted).expect("removing the plant");
        // Nothing of the planner's is left in the temporary folder.
        let left: Vec<String> = std::fs::read_dir(std::env::temp_dir())
            .expect("tmp")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(&format!("experiment-{pid}")))
            .collect();
        assert!(left.is_empty(), "{case}: left behind: {left:?}");
    }
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn root_experiment_folders_others_can_write_are_refused() {
    let test = "root_experiment_folders_others_can_write_are_refused";
    if !require_root(test) {
        return;
    }
    let plugins = plugins("hard-folders");
    let work = temp_dir("hard-folders");
    let marker = work.join("marker");
    let bench = script(&work, "bench.sh", &marker, "ran");
    let file = work.join("exp.toml");
    experiment_file(&file, &format!("[{:?}]", s(&bench)), 1, "");

    // `run --dir` on an empty folder another user owns: refused, nothing
    // written into it.
    let theirs = work.join("theirs");
    std::fs::create_dir(&theirs).expect("folder");
    std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).expect("chown");
    let out = experiment_in(
        &work,
        &plugins,
        &[],
        &["run", s(&file), "--dir", s(&theirs), "--no-graphs"],
    );
    let line = one_error_line(&out, "run --dir on nobody's folder");
    assert!(
        line.contains("refusing experiment folder") && line.contains("owned by"),
        "{line}"
    );
    assert_eq!(std::fs::read_dir(&theirs).expect("read").count(), 0);
    assert!(!marker.exists());

    // A finished experiment whose folder becomes writable by its group,
    // then another user's: results, status and resume refuse it.
    let dir = work.join("exp");
    let out = {
        let _serial = serial();
        experiment_in(
            &work,
            &plugins,
            &[],
            &["run", s(&file), "--dir", s(&dir), "--no-graphs"],
        )
    };
    assert!(out.status.success(), "{}", text(&out.stderr));
    let commands: [&[&str]; 3] = [
        &["results", s(&dir), "--no-graphs"],
        &["status", s(&dir)],
        &["resume", s(&dir), "--no-graphs"],
    ];
    for (case, mode, owner) in [
        ("group-writable", 0o775, 0),
        ("owned by nobody", 0o755, NOBODY),
    ] {
        chmod(&dir, mode);
        std::os::unix::fs::chown(&dir, Some(owner), Some(owner)).expect("chown");
        for args in commands {
            let out = experiment_in(&work, &plugins, &[], args);
            let line = one_error_line(&out, &format!("{case}: {args:?}"));
            assert!(
                line.starts_with("error: refusing experiment folder") && line.contains("fix: "),
                "{case}: {args:?}: {line}"
            );
            let out = experiment_in(&work, &plugins, &["--allow-insecure-plugins"], args);
            let stderr = text(&out.stderr);
            assert!(
                out.status.success() && stderr.contains("(--allow-insecure-plugins)"),
                "{case}: {args:?} under --allow-insecure-plugins:\n{stderr}"
            );
        }
    }
    std::os::unix::fs::chown(&dir, Some(0), Some(0)).expect("chown back");
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn a_plan_of_a_billion_runs_is_refused_at_once() {
    let plugins = plugins("hard-billion");
    let work = temp_dir("hard-billion");
    let file = work.join("exp.toml");
    let mut body = String::from(
        "name = \"big\"\nbenchmark = \"script\"\nprobes = []\nrepeats = 1\n\
         [config.benchmarks.script]\ncommand = [\"/bin/true\"]\n",
    );
    for v in ["a", "b", "c"] {
        body.push_str(&format!(
            "[variables.{v}]\nrange = {{ start = 1, end = 1000 }}\n"
        ));
    }
    std::fs::write(&file, body).expect("file");
    let dir = work.join("exp");
    for extra in [
        &["--dry-run"][..],
        &["--dir", s(&dir)],
        &["--dry-run", "--max-runs", "10000000"],
    ] {
        let started = Instant::now();
        let mut args = vec!["run", s(&file)];
        args.extend(extra);
        let out = experiment_in(&work, &plugins, &[], &args);
        let elapsed = started.elapsed();
        let line = one_error_line(&out, &format!("{extra:?}"));
        assert!(
            line.contains("the plan has more than") && line.contains("1000000000 combinations"),
            "{line}"
        );
        // A bound on the refusal (it took a minute and all the memory),
        // not a performance claim.
        assert!(
            elapsed < Duration::from_secs(1),
            "{extra:?}: took {elapsed:?}"
        );
        assert!(!dir.exists());
    }
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn plan_time_rules_refuse_in_one_line_with_no_folder_created() {
    let plugins = plugins("hard-rules");
    let work = temp_dir("hard-rules");
    let file = work.join("exp.toml");
    let dir = work.join("exp");
    let head = "name = \"rules\"\nbenchmark = \"script\"\nprobes = []\nrepeats = 1\n";
    let script = "[config.benchmarks.script]\ncommand = [\"/bin/true\"]\n";
    for (case, body, needle) in [
        (
            "bad thp_mode",
            format!("{head}{script}thp_mode = \"sometimes\"\n"),
            "thp_mode",
        ),
        (
            "bad timeout",
            format!("{head}{script}timeout = \"soon\"\n"),
            "timeout",
        ),
        (
            "timeout too long for a duration",
            format!("{head}{script}timeout = \"100000000000000000000000s\"\n"),
            "too long",
        ),
        (
            "timeout written as 1e23s",
            format!("{head}{script}timeout = \"1e23s\"\n"),
            "timeout",
        ),
        (
            "clashing parameter names",
            format!("{head}{script}[variables.a]\nvalues = [1]\n[variables.A]\nvalues = [2]\n"),
            "both become KML_PARAM_A",
        ),
        (
            "a command that does not exist",
            format!("{head}[config.benchmarks.script]\ncommand = [\"./no-such-bench.sh\"]\n"),
            "does not exist",
        ),
        (
            "an empty program",
            format!("{head}[config.benchmarks.script]\ncommand = [\"\"]\n"),
            "empty",
        ),
        (
            "a bad command in a variable",
            format!(
                "{head}{script}[variables.cmd]\nkey = \"benchmarks.script.command\"\nvalues = [[\"/bin/true\"], [\"/no/such/program\"]]\n"
            ),
            "does not exist",
        ),
        (
            "an unknown power source",
            format!("{head}power = [\"no_such_meter\"]\n{script}"),
            "no_such_meter",
        ),
        (
            "a bad power interval",
            format!("{head}{script}[config.power]\ninterval = \"often\"\n"),
            "power.interval",
        ),
    ] {
        std::fs::write(&file, &body).expect("file");
        let out = experiment_in(
            &work,
            &plugins,
            &[],
            &["run", s(&file), "--dir", s(&dir), "--no-graphs"],
        );
        let line = one_error_line(&out, case);
        assert!(line.contains(needle), "{case}: {line}");
        assert!(!dir.exists(), "{case}: the folder was created");
    }
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn a_timeout_too_long_for_a_duration_is_one_error_line() {
    let plugins = plugins("hard-timeout");
    let work = temp_dir("hard-timeout");
    for timeout in [
        "1e23s",
        "100000000000000000000000s",
        "99999999999999999999h",
    ] {
        let config = work.join("config.toml");
        std::fs::write(
            &config,
            format!("[benchmarks.script]\ncommand = [\"/bin/true\"]\ntimeout = {timeout:?}\n"),
        )
        .expect("config");
        let out = Command::new(kernmlops_bin())
            .arg("--plugin-dir")
            .arg(&plugins)
            .arg("--config")
            .arg(&config)
            .args(["config", "show"])
            .current_dir(&work)
            .output()
            .expect("config show");
        let line = one_error_line(&out, timeout);
        assert!(
            line.contains("benchmarks.script.timeout"),
            "{timeout}: {line}"
        );
    }
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn root_sigkill_early_in_experiment_run_then_resume_does_every_run_once() {
    let test = "root_sigkill_early_in_experiment_run_then_resume_does_every_run_once";
    if !require_root(test) {
        return;
    }
    let plugins = plugins("hard-sigkill");
    let work = temp_dir("hard-sigkill");
    let marker = work.join("marker");
    let bench = script(&work, "bench.sh", &marker, "ran");
    let file = work.join("exp.toml");
    experiment_file(&file, &format!("[{:?}]", s(&bench)), 2, "");
    let _serial = serial();
    for ms in (0..=100).step_by(10) {
        let dir = work.join(format!("exp-{ms}"));
        let mut child = Command::new(kernmlops_bin())
            .arg("--plugin-dir")
            .arg(&plugins)
            .args([
                "experiment",
                "run",
                s(&file),
                "--dir",
                s(&dir),
                "--no-graphs",
            ])
            .current_dir(&work)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("experiment run");
        std::thread::sleep(Duration::from_millis(ms));
        child.kill().expect("SIGKILL");
        let _ = child.wait();
        // A run it had started is told to stop (SIGTERM on its parent's
        // death) and may take a moment; the command the folder's state
        // names then carries on.
        let mut carried = None;
        let deadline = Instant::now() + Duration::from_secs(60);
        while carried.is_none() {
            let out = experiment_in(&work, &plugins, &[], &["resume", s(&dir), "--no-graphs"]);
            let stderr = text(&out.stderr);
            if out.status.success() {
                carried = Some(out);
            } else if stderr.contains("experiment run FILE --dir") {
                // Cut off before its record: the command the message names.
                let out = experiment_in(
                    &work,
                    &plugins,
                    &[],
                    &["run", s(&file), "--dir", s(&dir), "--no-graphs"],
                );
                assert!(
                    out.status.success(),
                    "{ms} ms: run --dir after {stderr}:\n{}",
                    text(&out.stderr)
                );
                carried = Some(out);
            } else {
                assert!(
                    stderr.contains("in use by another kernmlops process")
                        && Instant::now() < deadline,
                    "{ms} ms: resume: {stderr}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let out = carried.expect("carried on");
        let stdout = text(&out.stdout);
        assert!(stdout.contains("2 runs: 2 done"), "{ms} ms:\n{stdout}");
        let status = experiment_in(&work, &plugins, &[], &["status", s(&dir)]);
        assert!(
            text(&status.stdout).contains("2 runs: 2 done"),
            "{ms} ms: {}",
            text(&status.stdout)
        );
        // Every run once: one complete collection each, nothing extra.
        let runs: Vec<PathBuf> = std::fs::read_dir(dir.join("runs"))
            .expect("runs")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        assert_eq!(runs.len(), 2, "{ms} ms: {runs:?}");
        for r in &runs {
            let text = std::fs::read_to_string(r.join("manifest.json")).expect("manifest");
            let manifest: serde_json::Value = serde_json::from_str(&text).expect("manifest JSON");
            assert_eq!(manifest["status"], "complete", "{ms} ms: {}", r.display());
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}
