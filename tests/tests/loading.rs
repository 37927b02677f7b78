//! Loading errors: every kind of bad plugin is refused with a clear reason,
//! and the good plugins beside it still load and run.

use kernmlops_e2e::*;

/// A plugin folder with good plugins and one of each kind of bad file.
fn mixed_dir(name: &str) -> std::path::PathBuf {
    let dir = plugin_dir(
        name,
        &[
            ("quanta_runtime", "quanta_runtime"),
            ("process_trace", "process_trace"),
            ("fixture_not_a_plugin", "not_a_plugin"),
            ("fixture_abi_mismatch", "abi_mismatch"),
            ("fixture_bad_table", "bad_table"),
            ("fixture_faulty", "faulty"),
        ],
    );
    std::fs::write(dir.join("garbage.so"), b"this is not an ELF file\n").expect("write");
    dir
}

#[test]
fn plugins_lists_good_ones_and_refuses_bad_ones_with_reasons() {
    let dir = mixed_dir("list");
    let out = kernmlops(&["plugins", "--plugin-dir", dir.to_str().expect("utf8")]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "kernmlops plugins failed: {}",
        text(&out.stderr)
    );
    for needle in [
        "probe quanta_runtime",
        "table quanta_runtime",
        "table quanta_queued_time",
        "quanta_run_length_us",
        "probe process_trace",
        "table process_trace",
        "probe ticker",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?} in:\n{stdout}");
    }
    let refused = stdout
        .split("refused:")
        .nth(1)
        .unwrap_or_else(|| panic!("no refused section:\n{stdout}"));
    for (file, reason) in [
        ("not_a_plugin.so", "not a kernmlops plugin"),
        ("garbage.so", "not a kernmlops plugin"),
        ("abi_mismatch.so", "incompatible plugin ABI"),
        ("bad_table.so", "has no ts_uptime_us column"),
    ] {
        let line = refused
            .lines()
            .find(|l| l.contains(file))
            .unwrap_or_else(|| panic!("{file} not listed as refused:\n{refused}"));
        assert!(
            line.contains(reason),
            "{file}: expected {reason:?}, got {line:?}"
        );
    }
    // The ABI refusal is one short line naming the first differing type
    // and field, not abi_stable's whole report.
    let abi = refused
        .lines()
        .find(|l| l.contains("abi_mismatch.so"))
        .unwrap_or_default();
    for needle in [
        "first difference at PluginMod",
        "package: expected kernmlops-plugin-api, found fixture_abi_mismatch",
        "first differing field PluginMod.info: expected fn()->PluginInfo, found fn()->u64",
    ] {
        assert!(abi.contains(needle), "missing {needle:?} in {abi:?}");
    }
    assert!(
        abi.len() < 400 && !abi.contains("Type Layout"),
        "one short line: {abi:?}"
    );
}

/// Two plugins claiming one table (or plugin name): who is refused does not
/// depend on the file names' order, and each refusal names the other file.
#[test]
fn plugins_declaring_the_same_table_are_refused_whatever_their_file_names() {
    // (case, plugin files as (package, file name), files refused and the
    // file each one's refusal names, files kept)
    type Case<'a> = (
        &'a str,
        Vec<(&'a str, &'a str)>,
        Vec<(&'a str, &'a str)>,
        Vec<&'a str>,
    );
    let cases: Vec<Case> = [
        ("a_impostor", "process_trace"),
        ("z_impostor", "process_trace"),
    ]
    .into_iter()
    .map(|(impostor, shipped)| -> Case {
        (
            "a third-party plugin declaring an in-tree plugin's table",
            vec![("fixture_impostor", impostor), ("process_trace", shipped)],
            vec![(impostor, shipped)],
            vec![shipped],
        )
    })
    .chain(
        [("faulty_a", "faulty_b"), ("faulty_b", "faulty_a")].map(|(x, y)| -> Case {
            (
                "two third-party plugins",
                vec![("fixture_faulty", x), ("fixture_faulty", y)],
                vec![(x, y), (y, x)],
                vec![],
            )
        }),
    )
    .chain(
        [
            ("quanta_runtime", "quanta_runtime_copy"),
            ("quanta_runtime", "a_quanta_runtime_copy"),
        ]
        .map(|(x, y)| -> Case {
            (
                "two copies of an in-tree plugin",
                vec![("quanta_runtime", x), ("quanta_runtime", y)],
                vec![(x, y), (y, x)],
                vec![],
            )
        }),
    )
    .collect();
    for (i, (case, files, refused_files, kept)) in cases.into_iter().enumerate() {
        let dir = plugin_dir(&format!("dup{i}"), &files);
        let out = kernmlops(&["plugins", "--plugin-dir", dir.to_str().expect("utf8")]);
        let stdout = text(&out.stdout);
        let refused = stdout
            .split("\nrefused:\n")
            .nth(1)
            .unwrap_or_else(|| panic!("{case}: no refusal:\n{stdout}"));
        for (file, names) in &refused_files {
            let line = refused
                .lines()
                .find(|l| l.contains(&format!("/{file}.so: ")))
                .unwrap_or_else(|| panic!("{case}: {file}.so not refused:\n{stdout}"));
            assert!(
                line.contains(&format!("/{names}.so")) && line.contains("declares "),
                "{case}: {file}.so's refusal must name {names}.so: {line:?}"
            );
        }
        for file in &kept {
            assert!(
                !refused.contains(&format!("/{file}.so: ")),
                "{case}: the shipped plugin {file}.so is kept:\n{stdout}"
            );
            assert!(
                stdout.contains(&format!("probe {file}")),
                "{case}: {file} still loads:\n{stdout}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn unknown_plugin_name_lists_the_available_ones() {
    let dir = mixed_dir("unknown");
    let out = kernmlops(&[
        "run",
        "--plugin-dir",
        dir.to_str().expect("utf8"),
        "--plugins",
        "quanta_runtime,no_such_probe",
        "--duration",
        "1s",
    ]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "an unknown plugin must fail");
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("error: unknown plugin \"no_such_probe\"")
            && first.contains("available: ")
            && first.contains("process_trace, quanta_runtime"),
        "unexpected error: {stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "one clear line, got:\n{stderr}");
}

#[test]
fn bad_cli_input_is_one_clear_line() {
    let dir = plugin_dir("cli", &[("quanta_runtime", "quanta_runtime")]);
    let d = dir.to_str().expect("utf8");
    for (args, needle) in [
        (
            vec!["run", "--plugin-dir", d, "--duration", "ten"],
            "--duration",
        ),
        (
            vec!["run", "--plugin-dir", d, "--ring-size", "3MiB"],
            "--ring-size",
        ),
        (
            vec!["run", "--plugin-dir", "/nonexistent/plugins"],
            "does not exist",
        ),
    ] {
        let out = kernmlops(&args);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(needle),
            "{args:?}: {stderr}"
        );
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{args:?}: one line expected:\n{stderr}"
        );
    }
}

#[test]
fn root_failing_and_panicking_probes_do_not_stop_the_others() {
    if !require_root("root_failing_and_panicking_probes_do_not_stop_the_others") {
        return;
    }
    let _serial = serial();
    let dir = plugin_dir("faulty-run", &[("fixture_faulty", "faulty")]);
    let output = temp_dir("faulty-out");
    let c = Collector::start(&[
        "--plugin-dir",
        dir.to_str().expect("utf8"),
        "--plugins",
        "ticker,fails_on_start,panics_on_start,panics_on_drain,errors_on_drain",
        "--duration",
        "2s",
        "--output",
        output.to_str().expect("utf8"),
    ]);
    let done = c.wait();
    assert!(
        !done.status.success(),
        "probe failures must make the exit status non-zero"
    );
    for needle in [
        "probe fails_on_start",
        "fixture: start refused",
        "probe panics_on_start",
        "panicked",
        "probe panics_on_drain",
        "probe errors_on_drain",
    ] {
        assert!(
            done.stderr.contains(needle),
            "missing {needle:?} in:\n{}",
            done.stderr
        );
    }
    let dir = done.dir.expect("collection folder printed");
    let rows = read_table(&dir.join("ticker.arrow"))
        .iter()
        .map(|b| b.num_rows())
        .sum::<usize>();
    assert!(rows > 0, "the healthy ticker probe kept collecting");
    let man = manifest(&dir);
    assert_eq!(man["status"], "complete_with_errors");
    let status_of = |name: &str| {
        man["probes"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == name))
            .map(|p| p["status"].as_str().unwrap_or_default().to_owned())
    };
    assert_eq!(status_of("ticker").as_deref(), Some("ok"));
    for failed in [
        "fails_on_start",
        "panics_on_start",
        "panics_on_drain",
        "errors_on_drain",
    ] {
        assert_eq!(status_of(failed).as_deref(), Some("failed"), "{failed}");
    }
}

#[test]
fn root_without_capabilities_is_refused_clearly() {
    if !require_root("root_without_capabilities_is_refused_clearly")
        || !require_tool("root_without_capabilities", "setpriv")
    {
        return;
    }
    let dir = plugin_dir("nocaps", &[("quanta_runtime", "quanta_runtime")]);
    let out = std::process::Command::new("setpriv")
        .args(["--inh-caps=-all", "--bounding-set=-all", "--"])
        .arg(kernmlops_bin())
        .args([
            "run",
            "--plugin-dir",
            dir.to_str().expect("utf8"),
            "--plugins",
            "quanta_runtime",
            "--duration",
            "1s",
        ])
        .output()
        .expect("running setpriv");
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("needs root, or the CAP_BPF and CAP_PERFMON capabilities"),
        "unexpected: {stderr}"
    );
}

/// A program the verifier rejects fails its probe with the verifier's own
/// words and the offending source line, not a bare permission error.
#[test]
fn root_verifier_rejection_shows_the_verifier_log() {
    if !require_root("root_verifier_rejection_shows_the_verifier_log") {
        return;
    }
    let dir = plugin_dir(
        "verifier",
        &[
            ("fixture_bad_bpf", "bad_bpf"),
            ("process_trace", "process_trace"),
        ],
    );
    let out = kernmlops(&["check", "--plugin-dir", dir.to_str().expect("utf8")]);
    let stdout = text(&out.stdout);
    assert!(
        !out.status.success(),
        "a rejected program must fail check:\n{stdout}"
    );
    for needle in [
        "FAIL bad_bpf",
        "the kernel's BPF verifier rejected a program",
        "libbpf log:",
        "invalid access to map value",
        "bad_bpf.bpf.c:21",
        "ok   process_trace",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?} in:\n{stdout}");
    }
}
