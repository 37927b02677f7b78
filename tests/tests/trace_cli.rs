//! The `trace` probe from the command line: `kernmlops trace-list`,
//! `kernmlops run --trace EVENT` and `--trace-preset NAME` with real BPF,
//! and the one-line refusals of bad events before any folder is created.

use std::{path::Path, process::Command};

use kernmlops_e2e::*;

fn utf8(p: &Path) -> &str {
    p.to_str().expect("utf8 path")
}

/// The lines of `stderr` that are not warnings about the environment.
fn error_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| !l.starts_with("warning:"))
        .collect()
}

#[test]
fn root_trace_list_shows_fields_json_and_refuses_a_bad_pattern() {
    if !require_root("root_trace_list_shows_fields_json_and_refuses_a_bad_pattern") {
        return;
    }
    let out = kernmlops(&["trace-list", "sched:sched_switch"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let prev_comm = stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some("prev_comm"))
        .unwrap_or_else(|| panic!("no prev_comm line:\n{stdout}"));
    assert!(prev_comm.contains("char[16]"), "{prev_comm}");
    assert!(stdout.contains("hooks on this kernel:"), "{stdout}");

    let out = kernmlops(&["trace-list", "sched:sched_switch", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json parses");
    let tp = &v["tracepoints"][0];
    assert_eq!(tp["name"], "sched:sched_switch", "{v}");
    let fields = tp["fields"].as_array().expect("fields");
    let f = fields
        .iter()
        .find(|f| f["name"] == "prev_comm")
        .expect("prev_comm in JSON");
    assert_eq!(f["column"], "char[16]");
    assert!(v["kinds"].as_array().is_some_and(|k| !k.is_empty()), "{v}");

    // An unprivileged user is told why no tracepoint is listed.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(kernmlops_bin())
        .args(["--plugin-dir", "/", "trace-list", "sched:sched_switch"])
        .current_dir("/")
        .output()
        .expect("setpriv");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("note: tracefs is not readable by this user (run as root)"),
        "{stdout}"
    );

    for bad in ["a/b", "sched:sched_switch;rm", ""] {
        let out = kernmlops(&["trace-list", bad]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{bad:?} accepted");
        let lines = error_lines(&stderr);
        assert_eq!(lines.len(), 1, "{bad:?}: {stderr}");
        assert!(lines[0].starts_with("error: pattern"), "{stderr}");
        assert!(out.stdout.is_empty(), "{bad:?} printed a listing");
    }
}

/// Every value of the boolean column `name` of `table` in `dir`.
fn bools(dir: &Path, table: &str, name: &str) -> Vec<bool> {
    read_table(&dir.join(format!("{table}.arrow")))
        .iter()
        .flat_map(|b| {
            let col = b
                .column_by_name(name)
                .unwrap_or_else(|| panic!("{table} has no column {name}"));
            let col = col
                .as_any()
                .downcast_ref::<arrow_array::BooleanArray>()
                .unwrap_or_else(|| panic!("{table}.{name} is not boolean"));
            (0..col.len()).map(|i| col.value(i)).collect::<Vec<_>>()
        })
        .collect()
}

/// Every value of column `name` of `table` in `dir` as text.
fn strings(dir: &Path, table: &str, name: &str) -> Vec<String> {
    column_str(&read_table(&dir.join(format!("{table}.arrow"))), name)
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect()
}

#[test]
fn root_run_trace_records_one_row_per_exec() {
    if !require_root("root_run_trace_records_one_row_per_exec") {
        return;
    }
    let _serial = serial();
    let work = temp_dir("trace-cli-exec");
    // A binary with a name nothing else runs, so its execs are countable.
    let bin = work.join("kmlexecprobe");
    std::fs::copy("/bin/true", &bin).expect("copying /bin/true");
    let plugins = plugin_dir(
        "trace-cli-exec",
        &[("trace", "trace"), ("process_trace", "process_trace")],
    );
    let out = work.join("data");
    // --plugins does not name trace: --trace adds it.
    let c = Collector::start(&[
        "--plugin-dir",
        utf8(&plugins),
        "--plugins",
        "process_trace",
        "--trace",
        "sched:sched_process_exec",
        "--duration",
        "2s",
        "--output",
        utf8(&out),
    ]);
    const SPAWNED: usize = 25;
    for _ in 0..SPAWNED {
        let ok = Command::new(&bin).status().expect("running the binary");
        assert!(ok.success());
    }
    let done = c.wait();
    assert!(done.status.success(), "{}", done.stderr);
    let dir = done.dir.expect("collection folder");
    let files = strings(&dir, "sched_process_exec", "filename");
    let cut = bools(&dir, "sched_process_exec", "filename_truncated");
    // A path longer than string_bytes (64 with its NUL) is cut and flagged:
    // the test folder's path decides which.
    let ours = files
        .iter()
        .zip(&cut)
        .filter(|(f, &cut)| {
            let full = utf8(&bin);
            if cut {
                f.len() == 63 && full.starts_with(f.as_str())
            } else {
                *f == full
            }
        })
        .count();
    assert_eq!(ours, SPAWNED, "exec rows of {}: {files:?}", bin.display());
    // process_trace saw the same execs.
    let names = strings(&dir, "process_trace", "name");
    let caps = strings(&dir, "process_trace", "cap_type");
    let seen = names
        .iter()
        .zip(&caps)
        .filter(|(n, c)| n.as_str() == "kmlexecprobe" && c.as_str() == "exec")
        .count();
    assert_eq!(seen, SPAWNED, "process_trace exec rows");
    // The manifest records the flag as configuration.
    let m = manifest(&dir);
    let config = &m["config"];
    assert_eq!(
        config["probes"]["trace"]["events"],
        serde_json::json!(["sched:sched_process_exec"]),
        "{config}"
    );
    assert_eq!(
        config["collect"]["plugins"],
        serde_json::json!(["process_trace", "trace"])
    );
}

#[test]
fn root_run_trace_preset_sched_makes_its_tables() {
    if !require_root("root_run_trace_preset_sched_makes_its_tables") {
        return;
    }
    let _serial = serial();
    let work = temp_dir("trace-cli-preset");
    let plugins = plugin_dir("trace-cli-preset", &[("trace", "trace")]);
    let out = work.join("data");
    let c = Collector::start(&[
        "--plugin-dir",
        utf8(&plugins),
        "--plugins",
        "trace",
        "--trace-preset",
        "sched",
        "--duration",
        "1s",
        "--output",
        utf8(&out),
    ]);
    // Wake-ups and switches: a few short sleeps in a child.
    let ok = Command::new("sh")
        .args(["-c", "for i in 1 2 3 4 5; do sleep 0.01; done"])
        .status()
        .expect("sh");
    assert!(ok.success());
    let done = c.wait();
    assert!(done.status.success(), "{}", done.stderr);
    let dir = done.dir.expect("collection folder");
    let m = manifest(&dir);
    assert_eq!(
        m["config"]["probes"]["trace"]["presets"],
        serde_json::json!(["sched"])
    );
    assert_eq!(
        m["config"]["probes"]["trace"]["events"],
        serde_json::json!([])
    );
    for table in [
        "sched_switch",
        "sched_wakeup",
        "sched_wakeup_new",
        "sched_migrate_task",
    ] {
        assert!(
            dir.join(format!("{table}.arrow")).is_file(),
            "no {table} table: {}",
            done.stdout
        );
    }
    // Not the default event: a preset replaces it.
    assert!(!dir.join("sched_process_exec.arrow").exists());
    for table in ["sched_switch", "sched_wakeup", "sched_wakeup_new"] {
        let rows = m["tables"][table]["rows"].as_u64().unwrap_or(0);
        assert!(rows > 0, "{table}: no rows in {}", done.stdout);
    }
    let comms = strings(&dir, "sched_switch", "prev_comm");
    assert!(comms.iter().any(|c| !c.is_empty()), "{comms:?}");
}

#[test]
fn root_bad_trace_flags_are_one_line_before_any_folder() {
    if !require_root("root_bad_trace_flags_are_one_line_before_any_folder") {
        return;
    }
    let work = temp_dir("trace-cli-bad");
    let plugins = plugin_dir("trace-cli-bad", &[("trace", "trace")]);
    let long = format!("sched:{}", "x".repeat(5000));
    // (flag, value, what the line must say)
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "--trace",
            "sched:sched_swich",
            &["--trace", "sched:sched_swich", "sched_switch"],
        ),
        (
            "--trace",
            "schde:sched_switch",
            &["no tracepoint system schde", "sched"],
        ),
        (
            "--trace",
            "sched:sched_switch(prev_pidd)",
            &["no field prev_pidd", "its fields: "],
        ),
        (
            "--trace",
            "tp_btf:block_rq_insert(rq->__sectr)",
            &["__sectr", "__sector"],
        ),
        (
            "--trace",
            "func:do_madvise(start) latency",
            &["do_madvise", "what works here"],
        ),
        ("--trace", "sched:", &["sched:"]),
        (
            "--trace",
            "uprobe:/no/such/binary:main",
            &["/no/such/binary"],
        ),
        (
            "--trace-preset",
            "schde",
            &["--trace-preset", "schde", "sched, block"],
        ),
        // Malformed: still one line each.
        ("--trace", "", &["--trace"]),
        ("--trace", "(((", &["--trace"]),
        ("--trace", "sched:sched_switch(", &["--trace"]),
        (
            "--trace",
            "tp_btf:sched_switch(prev->a->b->c->d->e->f->g->h->i)",
            &["--trace"],
        ),
        (
            "--trace",
            "tp_btf:sched_switch(prev->\u{1b}[31m)",
            &["--trace"],
        ),
        ("--trace", &long, &["--trace"]),
    ];
    for (i, (flag, value, needles)) in cases.iter().enumerate() {
        let output = work.join(format!("data-{i}"));
        let out = kernmlops(&[
            "run",
            "--plugin-dir",
            utf8(&plugins),
            "--plugins",
            "trace",
            flag,
            value,
            "--duration",
            "1s",
            "--output",
            utf8(&output),
        ]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{flag} {value} accepted: {stderr}");
        let lines = error_lines(&stderr);
        assert_eq!(lines.len(), 1, "{flag} {value}: {stderr}");
        assert!(lines[0].starts_with("error: "), "{stderr}");
        assert!(
            !lines[0].contains(['\u{1b}', '\u{7f}']),
            "a control character reached the terminal: {stderr:?}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        for n in *needles {
            assert!(
                lines[0].contains(n),
                "{flag} {value}: {n:?} not in {stderr}"
            );
        }
        assert!(
            !output.exists(),
            "{flag} {value}: {} was created",
            output.display()
        );
    }
    // A flag's event whose table a configuration file's event has: the
    // line names both, and the file.
    let cfg = work.join("kernmlops.toml");
    std::fs::write(&cfg, "[probes.trace]\nevents = [\"sched:sched_switch\"]\n")
        .expect("writing the config");
    let output = work.join("data-both");
    let out = kernmlops(&[
        "--config",
        utf8(&cfg),
        "run",
        "--plugin-dir",
        utf8(&plugins),
        "--plugins",
        "trace",
        "--trace",
        "tp_btf:sched_switch(prev->pid)",
        "--output",
        utf8(&output),
    ]);
    let stderr = text(&out.stderr);
    let lines = error_lines(&stderr);
    assert!(!out.status.success(), "{stderr}");
    assert_eq!(lines.len(), 1, "{stderr}");
    for n in [
        "--trace",
        utf8(&cfg),
        "tp_btf:sched_switch(prev->pid)",
        "\"sched:sched_switch\"",
    ] {
        assert!(lines[0].contains(n), "{n:?} not in {stderr}");
    }
    assert!(!output.exists());
}
