//! The watchdog on calls into plugins: a probe that hangs in its start,
//! drain or stop (the `fixture_hang` plugin) is reported once, given up with
//! its tables closed, and the run, with a real BPF probe beside it, ends on
//! time with a finished manifest, whether `--duration` or SIGTERM ends it.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use kernmlops_e2e::*;

/// The plugin timeout the runs use (the default).
const LIMIT: Duration = Duration::from_secs(5);
/// Slack for starting, stopping and writing on a loaded machine.
const SLACK: Duration = Duration::from_secs(4);

/// How a case's run ends.
#[derive(Clone, Copy, Debug)]
enum End {
    /// `--duration 4s`.
    Duration,
    /// SIGTERM one second after the probes attached, no duration.
    Sigterm,
}

struct Case {
    name: &'static str,
    /// Hanging probes of the fixture, with the call each hangs in.
    hung: &'static [(&'static str, &'static str)],
    end: End,
    /// The longest the whole run may take.
    bound: Duration,
}

/// A `kernmlops run` whose output goes to files, killed if the test fails.
struct Run {
    child: Child,
    stderr: PathBuf,
    stdout: PathBuf,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Run {
    /// Starts `cmd` in the workspace root, its output in `logs/stdout` and
    /// `logs/stderr`.
    fn start(mut cmd: Command, logs: &Path) -> Self {
        let (stdout, stderr) = (logs.join("stdout"), logs.join("stderr"));
        let child = cmd
            .current_dir(workspace_root())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .stdin(Stdio::null())
            .spawn()
            .expect("starting kernmlops run");
        Self {
            child,
            stderr,
            stdout,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits until the process ends, or panics past `deadline`.
    fn wait_until(&mut self, deadline: Instant) -> std::process::ExitStatus {
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for kernmlops") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "kernmlops did not end in time:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn pyarrow_rows(file: &Path) -> Option<u64> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys, pyarrow.ipc as ipc; print(ipc.open_file(sys.argv[1]).read_all().num_rows)",
        ])
        .arg(file)
        .output()
        .expect("running python3");
    let stderr = text(&out.stderr);
    if stderr.contains("ModuleNotFoundError") {
        assert!(!in_ci(), "pyarrow missing in CI: {stderr}");
        eprintln!("SKIP pyarrow read-back: {stderr}");
        return None;
    }
    assert!(
        out.status.success(),
        "pyarrow cannot read {}: {stderr}",
        file.display()
    );
    Some(text(&out.stdout).trim().parse().expect("a row count"))
}

fn run_case(case: &Case) {
    let plugins = plugin_dir(
        case.name,
        &[
            ("fixture_hang", "hang"),
            ("quanta_runtime", "quanta_runtime"),
        ],
    );
    let output = temp_dir(&format!("{}-out", case.name));
    let logs = temp_dir(&format!("{}-logs", case.name));
    let probes: Vec<&str> = case
        .hung
        .iter()
        .map(|(p, _)| *p)
        .chain(["quanta_runtime"])
        .collect();
    let probes = probes.join(",");
    let mut args = vec![
        "run",
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        &probes,
        "--output",
        output.to_str().expect("utf8"),
    ];
    if matches!(case.end, End::Duration) {
        args.extend(["--duration", "4s"]);
    }
    let began = Instant::now();
    let mut cmd = Command::new(kernmlops_bin());
    cmd.args(&args);
    let mut run = Run::start(cmd, &logs);
    let deadline = began + case.bound;
    if matches!(case.end, End::Sigterm) {
        while !run.stderr().contains("collecting ") {
            assert!(
                run.child.try_wait().expect("wait").is_none(),
                "kernmlops ended early:\n{}",
                run.stderr()
            );
            assert!(Instant::now() < deadline, "no attach:\n{}", run.stderr());
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_secs(1));
        // SAFETY: kill with the pid of a child this test spawned and has
        // not waited for.
        unsafe { libc::kill(run.child.id() as i32, libc::SIGTERM) };
    }
    let status = run.wait_until(deadline);
    let took = began.elapsed();
    let stderr = run.stderr();
    eprintln!(
        "{}: ended in {:.1} s (bound {:.0} s), {status}\n{stderr}",
        case.name,
        took.as_secs_f64(),
        case.bound.as_secs_f64()
    );
    assert!(
        !status.success() && status.code() == Some(1),
        "{}: a run with a hung probe exits 1, got {status}:\n{stderr}",
        case.name
    );
    let dir = only_collection(&output);
    let man = manifest(&dir);
    assert_eq!(
        man["status"], "complete_with_errors",
        "{}: the manifest is finished and says the run had errors",
        case.name
    );
    for (probe, call) in case.hung {
        let line = format!("error: probe {probe} (plugin fixture_hang): hung: its {call} call");
        assert_eq!(
            stderr.matches(&line).count(),
            1,
            "{}: one error line names {probe} and its {call} call:\n{stderr}",
            case.name
        );
        let entry = man["probes"]
            .as_array()
            .expect("probes")
            .iter()
            .find(|p| p["name"] == *probe)
            .unwrap_or_else(|| panic!("{probe} in the manifest: {man}"));
        assert_eq!(entry["status"], "failed", "{probe}: {entry}");
        let error = entry["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(&format!("its {call} call has not returned")),
            "{probe}: {error}"
        );
        if *call != "start" {
            // Its table is closed with what it holds: readable, and as long
            // as the manifest says.
            let rows = man["tables"][*probe]["rows"].as_u64().expect("rows");
            assert!(rows > 0, "{probe} drained rows before it hung");
            if let Some(read) = pyarrow_rows(&dir.join(format!("{probe}.arrow"))) {
                assert_eq!(read, rows, "{probe}: rows on disk");
            }
        }
    }
    let real = man["probes"]
        .as_array()
        .expect("probes")
        .iter()
        .find(|p| p["name"] == "quanta_runtime")
        .expect("quanta_runtime in the manifest");
    assert_eq!(real["status"], "ok", "the real probe went on: {real}");
    let rows = man["tables"]["quanta_runtime"]["rows"]
        .as_u64()
        .expect("rows");
    assert!(rows > 0, "quanta_runtime collected rows");
    if let Some(read) = pyarrow_rows(&dir.join("quanta_runtime.arrow")) {
        assert_eq!(read, rows, "quanta_runtime rows on disk");
    }
    let printed = std::fs::read_to_string(&run.stdout).unwrap_or_default();
    assert!(
        printed.contains("quanta_runtime"),
        "the summary was printed:\n{printed}"
    );
}

#[test]
fn root_probes_hung_in_a_plugin_call_are_given_up_and_the_run_ends_on_time() {
    if !require_root("root_probes_hung_in_a_plugin_call_are_given_up_and_the_run_ends_on_time") {
        return;
    }
    let _serial = serial();
    let cases = [
        Case {
            name: "hang-drain",
            hung: &[("hangs_in_drain", "drain")],
            end: End::Duration,
            // It hangs within the run's 4 s: given up at most LIMIT after.
            bound: Duration::from_secs(4) + LIMIT + SLACK,
        },
        Case {
            name: "hang-start-stop",
            hung: &[("hangs_on_start", "start"), ("hangs_on_stop", "stop")],
            end: End::Duration,
            // The start is given up, the run lasts 4 s, the stop is given up.
            bound: LIMIT + Duration::from_secs(4) + LIMIT + SLACK,
        },
    ];
    // The cases share nothing (each its own plugin, output and log
    // folders) and mostly wait on the limit, so they run side by side.
    std::thread::scope(|scope| {
        for case in &cases {
            scope.spawn(move || run_case(case));
        }
    });
}

/// SIGTERM while a probe hangs: the run still ends with a finished
/// manifest within the plugin timeout of the signal.
#[test]
fn root_sigterm_during_a_hang_ends_with_a_finished_manifest() {
    if !require_root("root_sigterm_during_a_hang_ends_with_a_finished_manifest") {
        return;
    }
    let _serial = serial();
    run_case(&Case {
        name: "hang-term",
        hung: &[("hangs_in_drain", "drain"), ("hangs_on_stop", "stop")],
        end: End::Sigterm,
        // Attach, one second, then at most a limit for the drain hang and
        // one for the stop hang.
        bound: Duration::from_secs(1) + LIMIT + LIMIT + SLACK + SLACK,
    });
}

/// A benchmark case: the call `fixture_hang`'s `hangs` benchmark hangs in,
/// the run's `--duration`, and whether a collection folder is made (a
/// benchmark that cannot be created or checked is refused before).
struct BenchCase {
    hang_in: &'static str,
    duration_s: u64,
    collection: bool,
    /// When the hanging call begins, roughly, from the start.
    hangs_after: Duration,
}

/// A benchmark that hangs in a call is given up once the call is past the
/// plugin timeout: one error line names the call, the run (with a real
/// probe beside it) ends on time, exits 1, and the manifest's benchmark
/// entry and errors name the call.
#[test]
fn root_a_benchmark_hung_in_a_call_is_given_up_and_the_run_ends_on_time() {
    if !require_root("root_a_benchmark_hung_in_a_call_is_given_up_and_the_run_ends_on_time") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir(
        "hang-bench",
        &[
            ("fixture_hang", "hang"),
            ("quanta_runtime", "quanta_runtime"),
        ],
    );
    let secs = Duration::from_secs;
    let cases = [
        // Five good polls (half a second), then one that hangs; the run
        // would last 60 s.
        BenchCase {
            hang_in: "poll",
            duration_s: 60,
            collection: true,
            hangs_after: secs(1),
        },
        BenchCase {
            hang_in: "kill",
            duration_s: 2,
            collection: true,
            hangs_after: secs(2),
        },
        BenchCase {
            hang_in: "result",
            duration_s: 2,
            collection: true,
            hangs_after: secs(2),
        },
        BenchCase {
            hang_in: "launch",
            duration_s: 60,
            collection: true,
            hangs_after: secs(1),
        },
        BenchCase {
            hang_in: "setup",
            duration_s: 60,
            collection: true,
            hangs_after: Duration::ZERO,
        },
        BenchCase {
            hang_in: "start",
            duration_s: 60,
            collection: false,
            hangs_after: Duration::ZERO,
        },
        BenchCase {
            hang_in: "is_configured",
            duration_s: 60,
            collection: false,
            hangs_after: Duration::ZERO,
        },
    ];
    // Each case has its own output and log folders and mostly waits on
    // the limit, so the cases run side by side.
    std::thread::scope(|scope| {
        for case in &cases {
            scope.spawn(|| run_bench_case(&plugins, case));
        }
    });
}

/// One case of the hung-benchmark test: runs it and checks its lines,
/// exit and manifest.
fn run_bench_case(plugins: &Path, case: &BenchCase) {
    let name = format!("hang-bench-{}", case.hang_in);
    let output = temp_dir(&format!("{name}-out"));
    let logs = temp_dir(&format!("{name}-logs"));
    let config = logs.join("config.toml");
    std::fs::write(
        &config,
        format!("[benchmarks.hangs]\nhang_in = \"{}\"\n", case.hang_in),
    )
    .expect("writing the configuration");
    let duration = format!("{}s", case.duration_s);
    let began = Instant::now();
    let mut cmd = Command::new(kernmlops_bin());
    cmd.args(["--config", config.to_str().expect("utf8"), "run"])
        .args(["--plugin-dir", plugins.to_str().expect("utf8")])
        .args(["--plugins", "quanta_runtime", "--benchmark", "hangs"])
        .args(["--duration", &duration])
        .args(["--output", output.to_str().expect("utf8")]);
    let mut run = Run::start(cmd, &logs);
    let bound = case.hangs_after + LIMIT + SLACK;
    let status = run.wait_until(began + bound);
    let stderr = run.stderr();
    eprintln!(
        "{name}: ended in {:.1} s (bound {:.0} s), {status}\n{stderr}",
        began.elapsed().as_secs_f64(),
        bound.as_secs_f64()
    );
    assert_eq!(status.code(), Some(1), "{name}: exits 1:\n{stderr}");
    let said = format!(
        "benchmark hangs: hung: its {} call has not returned in",
        case.hang_in
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("hung: its")).collect();
    assert!(
        lines.len() == 1 && lines[0].starts_with(&format!("error: {said}")),
        "{name}: one error line names the benchmark and its call:\n{stderr}"
    );
    assert!(
        lines[0].contains("(limit collect.plugin_timeout = 5s)"),
        "{name}: the line gives the limit: {}",
        lines[0]
    );
    if !case.collection {
        assert!(
            std::fs::read_dir(&output).expect("output").next().is_none(),
            "{name}: nothing was collected"
        );
        return;
    }
    let dir = only_collection(&output);
    let man = manifest(&dir);
    assert_eq!(man["run_class"], "failed", "{name}: {man}");
    let error = man["benchmark"]["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with(&said),
        "{name}: the benchmark entry names the call: {}",
        man["benchmark"]
    );
    if case.hang_in == "setup" {
        assert_eq!(man["status"], "failed", "{name}: no probe started: {man}");
        return;
    }
    assert_eq!(man["status"], "complete_with_errors", "{name}: {man}");
    let errors = man["errors"].as_array().expect("errors");
    assert_eq!(
        errors.iter().filter(|e| e.as_str() == Some(error)).count(),
        1,
        "{name}: the run's errors name it once: {errors:?}"
    );
    let real = &man["tables"]["quanta_runtime"]["rows"];
    assert!(
        real.as_u64().is_some_and(|r| r > 0),
        "{name}: the real probe collected: {man}"
    );
}

/// `kernmlops check` on probes that hang in start and in stop, beside a
/// real one: each hung probe gets one line naming it and its call, the
/// real probe is checked, and the check ends within a limit per hang.
#[test]
fn root_check_on_hanging_probes_ends_on_time_naming_them() {
    if !require_root("root_check_on_hanging_probes_ends_on_time_naming_them") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir(
        "hang-check",
        &[
            ("fixture_hang", "hang"),
            ("quanta_runtime", "quanta_runtime"),
        ],
    );
    let began = Instant::now();
    let out = Command::new(kernmlops_bin())
        .args(["check", "--plugin-dir", plugins.to_str().expect("utf8")])
        .args(["--plugins", "hangs_on_start,quanta_runtime,hangs_on_stop"])
        .current_dir(workspace_root())
        .stdin(Stdio::null())
        .output()
        .expect("running kernmlops check");
    let took = began.elapsed();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    eprintln!(
        "check ended in {:.1} s\n{stdout}{stderr}",
        took.as_secs_f64()
    );
    assert!(
        took < LIMIT + LIMIT + SLACK,
        "check ends within a limit per hung probe: {took:?}"
    );
    assert_eq!(out.status.code(), Some(1), "check fails:\n{stdout}{stderr}");
    for (probe, call) in [("hangs_on_start", "start"), ("hangs_on_stop", "stop")] {
        let line =
            format!("FAIL {probe} (fixture_hang): hung: its {call} call has not returned in");
        assert_eq!(
            stdout.matches(&line).count(),
            1,
            "one line names {probe} and its {call} call:\n{stdout}"
        );
    }
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("ok   quanta_runtime (quanta_runtime): attached in")),
        "the real probe is checked after the hung one:\n{stdout}"
    );
}
