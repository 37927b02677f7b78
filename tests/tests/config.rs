//! Configuration as a user meets it: defaults that include each probe's
//! declared settings, a user file merged on top (or ./overrides.toml), and
//! bad keys rejected with their path and file before anything is collected.

use std::process::Command;

use kernmlops_e2e::*;

fn plugins(name: &str) -> std::path::PathBuf {
    plugin_dir(
        name,
        &[
            ("memory_usage", "memory_usage"),
            ("quanta_runtime", "quanta_runtime"),
        ],
    )
}

#[test]
fn defaults_list_every_probes_settings() {
    let dir = plugins("cfg-defaults");
    let out = kernmlops(&[
        "--plugin-dir",
        dir.to_str().expect("utf8"),
        "config",
        "defaults",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("[collect]") && stdout.contains("flush_interval = \"1s\""),
        "{stdout}"
    );
    assert!(
        stdout.contains("[probes.memory_usage]") && stdout.contains("interval = \"1s\""),
        "{stdout}"
    );
    let parsed = Command::new("python3")
        .args(["-c", "import sys, tomllib; tomllib.loads(sys.stdin.read())"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin
                .take()
                .expect("stdin")
                .write_all(stdout.as_bytes())?;
            c.wait()
        });
    if let Ok(status) = parsed {
        assert!(
            status.success(),
            "config defaults is not valid TOML:\n{stdout}"
        );
    }
}

#[test]
fn user_file_and_overrides_toml_merge_over_the_defaults() {
    let dir = plugins("cfg-show");
    let cwd = temp_dir("cfg-cwd");
    std::fs::write(
        cwd.join("overrides.toml"),
        "[probes.memory_usage]\ninterval = \"250ms\"\n",
    )
    .expect("write");
    let show = |extra: &[&str]| {
        let out = Command::new(kernmlops_bin())
            .current_dir(&cwd)
            .args(extra)
            .args([
                "--plugin-dir",
                dir.to_str().expect("utf8"),
                "config",
                "show",
            ])
            .output()
            .expect("kernmlops");
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let from_overrides = show(&[]);
    assert!(
        from_overrides.contains("interval = \"250ms\"")
            && from_overrides.contains("overrides.toml"),
        "{from_overrides}"
    );
    let file = cwd.join("mine.toml");
    std::fs::write(&file, "[collect]\nduration = \"7s\"\n").expect("write");
    let from_flag = show(&["--config", file.to_str().expect("utf8")]);
    assert!(from_flag.contains("duration = \"7s\""), "{from_flag}");
    assert!(
        from_flag.contains("interval = \"1s\""),
        "--config replaces overrides.toml:\n{from_flag}"
    );
}

#[test]
fn bad_settings_fail_with_key_path_and_file_before_collecting() {
    let dir = plugins("cfg-bad");
    let work = temp_dir("cfg-bad-work");
    for (body, needle) in [
        ("[collect]\nbogus = 1\n", "collect.bogus: unknown key"),
        (
            "[collect]\nflush_rows = \"many\"\n",
            "collect.flush_rows: expected an integer, found a string",
        ),
        (
            "[probes.memory_usage]\nintervall = \"1s\"\n",
            "probes.memory_usage.intervall: unknown key (known: interval)",
        ),
        (
            "[probes.memory_usage]\ninterval = 5\n",
            "probes.memory_usage.interval: expected a string, found an integer",
        ),
        (
            "[probes.no_such_probe]\nx = 1\n",
            "probes.no_such_probe: no loaded plugin has a probe named no_such_probe",
        ),
    ] {
        let file = work.join("bad.toml");
        std::fs::write(&file, body).expect("write");
        let output = work.join("out");
        let out = kernmlops(&[
            "--config",
            file.to_str().expect("utf8"),
            "run",
            "--plugin-dir",
            dir.to_str().expect("utf8"),
            "--plugins",
            "memory_usage",
            "--duration",
            "1s",
            "--output",
            output.to_str().expect("utf8"),
        ]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{body:?} was accepted");
        assert!(
            stderr.starts_with(&format!("error: {}: ", file.display())) && stderr.contains(needle),
            "{body:?}: {stderr}"
        );
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(!output.exists(), "{body:?}: nothing may be collected");
    }
}

/// A standard output whose reading end is already closed, as `| head` leaves
/// it once head has exited: the first write gets EPIPE, whatever the timing.
fn closed_pipe() -> std::process::Stdio {
    use std::os::fd::{FromRawFd, OwnedFd};

    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 returns.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(r, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors are fresh and owned here alone.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    std::process::Stdio::from(write)
}

/// A reader that stops early (`kernmlops config defaults | head -1`) ends a
/// command that only prints as it ends `ls`: no panic, no error line.
#[test]
fn printing_commands_end_quietly_when_the_reader_stops() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;

    ensure_built();
    let dir = plugins("cfg-closed-pipe");
    for args in [
        vec![
            "--plugin-dir",
            dir.to_str().expect("utf8"),
            "config",
            "defaults",
        ],
        vec!["perf-list"],
    ] {
        let out = Command::new(kernmlops_bin())
            .args(&args)
            .stdout(closed_pipe())
            .stderr(Stdio::piped())
            .output()
            .expect("run kernmlops");
        let stderr = text(&out.stderr);
        assert!(
            !stderr.contains("panicked") && !stderr.contains("error"),
            "{args:?}: {stderr}"
        );
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGPIPE),
            "{args:?} ended with {:?}: {stderr}",
            out.status
        );
    }
}

/// A run whose reader stops early (`kernmlops run | head -1`) still
/// finishes and closes its files: it ignores SIGPIPE and drops its lines.
#[test]
fn root_a_run_finishes_when_its_reader_stops() {
    use std::process::Stdio;

    if !require_root("root_a_run_finishes_when_its_reader_stops") {
        return;
    }
    ensure_built();
    let dir = plugins("cfg-run-closed-pipe");
    let out = temp_dir("cfg-run-closed-pipe-out");
    let done = Command::new(kernmlops_bin())
        .args([
            "--plugin-dir",
            dir.to_str().expect("utf8"),
            "run",
            "--plugins",
            "memory_usage",
            "--duration",
            "500ms",
            "--output",
            out.to_str().expect("utf8"),
        ])
        .stdout(closed_pipe())
        .stderr(Stdio::piped())
        .output()
        .expect("run kernmlops");
    let stderr = text(&done.stderr);
    assert!(done.status.success(), "{:?}: {stderr}", done.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let collection = only_collection(&out);
    assert_eq!(manifest(&collection)["status"], "complete", "{stderr}");
    assert!(!read_table(&collection.join("memory_usage.arrow")).is_empty());
    let _ = std::fs::remove_dir_all(&out);
}

/// The manifest records the run's typed configuration: `[collect]` with
/// the flags over it, each text setting written back in its type's form,
/// every probe's merged settings, the file and the filter flags, and
/// nothing patched in beside them. Written back as a file, its
/// `[collect]` loads to the same values.
#[test]
fn root_the_manifest_records_the_runs_typed_configuration() {
    if !require_root("root_the_manifest_records_the_runs_typed_configuration") {
        return;
    }
    ensure_built();
    let dir = plugins("cfg-recorded");
    let work = temp_dir("cfg-recorded-work");
    let file = work.join("mine.toml");
    std::fs::write(
        &file,
        "[collect]\ndrain_interval = \"50ms\"\nplugin_timeout = \"2m\"\n\n[probes.memory_usage]\ninterval = \"250ms\"\n",
    )
    .expect("write");
    let output = work.join("out");
    let tgid = std::process::id().to_string();
    let out = kernmlops(&[
        "--config",
        file.to_str().expect("utf8"),
        "run",
        "--plugin-dir",
        dir.to_str().expect("utf8"),
        "--plugins",
        "memory_usage",
        "--duration",
        "1s",
        "--ring-size",
        "64KiB",
        "--flush-interval",
        "500ms",
        "--tgid",
        &tgid,
        "--output",
        output.to_str().expect("utf8"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let config = manifest(&only_collection(&output))["config"].clone();
    let keys = |v: &serde_json::Value| -> Vec<String> {
        let mut k: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(
        keys(&config),
        [
            "benchmarks",
            "collect",
            "config_file",
            "filter",
            "power",
            "probes"
        ],
        "{config:#}"
    );
    assert_eq!(
        config["collect"],
        serde_json::json!({
            "plugins": ["memory_usage"],
            "output": "data",
            "plugin_dir": "plugins",
            "duration": "1s",
            "ring_size": "64KiB",
            "drain_interval": "50ms",
            "flush_interval": "500ms",
            "flush_rows": 65536,
            "strict": false,
            "plugin_timeout": "2m",
        })
    );
    assert_eq!(config["probes"]["memory_usage"]["interval"], "250ms");
    assert_eq!(config["config_file"], file.to_str().expect("utf8"));
    assert_eq!(
        config["filter"],
        serde_json::json!({
            "tgid": std::process::id(),
            "pid": null,
            "cgroup": null,
            "cgroup_descendants": false,
        })
    );
    assert_eq!(config["power"]["interval"], "1s");
    assert_eq!(config["power"]["max_watts"]["dram"], 500);

    // The recorded [collect], as a file (each value's JSON is its TOML
    // here: strings, integers, booleans, a list of strings), loads to
    // what was recorded.
    let mut replay = String::from("[collect]\n");
    for (key, value) in config["collect"].as_object().expect("collect") {
        replay.push_str(&format!("{key} = {value}\n"));
    }
    let loaded = kernmlops::config::Config::from_text("replay.toml", replay.as_bytes())
        .unwrap_or_else(|e| panic!("{e}\n{replay}"));
    assert_eq!(
        serde_json::to_value(&loaded.collect).expect("json"),
        config["collect"]
    );
    let _ = std::fs::remove_dir_all(&work);
}
