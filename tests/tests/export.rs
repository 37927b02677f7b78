//! The dataset: `kernmlops export --parquet` writes
//! `<to>/{curated,baseline,failed}/<table>/<collection_id>.<benchmark>.parquet`
//! that polars reads back with the declared types and the manifest's row
//! counts, `python/kernmlops_data.py` loads a class folder by table name,
//! and `kernmlops dump` summarises a collection.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use kernmlops_e2e::*;

/// Runs `kernmlops ARGS`, returning the collection folder it printed.
fn collect(args: &[&str]) -> (std::process::Output, PathBuf) {
    let out = kernmlops(args);
    let stdout = text(&out.stdout);
    let dir = stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("collection ")?
                .split_once(" in ")
                .map(|(_, d)| PathBuf::from(d.trim()))
        })
        .unwrap_or_else(|| {
            panic!(
                "no collection folder printed:\n{stdout}\n{}",
                text(&out.stderr)
            )
        });
    (out, dir)
}

fn collection_id(dir: &Path) -> String {
    manifest(dir)["collection_id"]
        .as_str()
        .expect("collection_id")
        .to_owned()
}

/// Runs a Python script with `python/` on its path; returns its stdout.
fn python(script: &str, args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .env("PYTHONPATH", workspace_root().join("python"))
        .output()
        .expect("running python3");
    assert!(
        out.status.success(),
        "python failed:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Prints `rows` then `name=dtype` lines for one Parquet file.
const SCHEMA_OF: &str = r#"
import sys, polars as pl
df = pl.read_parquet(sys.argv[1])
print(df.height)
for name, dtype in df.schema.items():
    print(f"{name}={dtype}")
"#;

#[test]
fn root_export_writes_the_dataset_layout_polars_reads_back() {
    let test = "root_export_writes_the_dataset_layout_polars_reads_back";
    if !require_root(test) || !require_tool(test, "python3") {
        return;
    }
    let plugins = plugin_dir("export", &[("fixture_faulty", "faulty")]);
    let work = temp_dir("export-work");
    let data = work.join("out");
    let export = work.join("export");
    let cfg = work.join("bench.toml");
    std::fs::write(&cfg, "[benchmarks.shell]\nscript = \"sleep 0.5; exit 3\"\n").expect("config");
    let (plugins_s, data_s, export_s, cfg_s) = (
        plugins.to_str().expect("utf8"),
        data.to_str().expect("utf8"),
        export.to_str().expect("utf8"),
        cfg.to_str().expect("utf8"),
    );

    let (curated, failed) = {
        let _serial = serial();
        let (out, curated) = collect(&[
            "run",
            "--plugin-dir",
            plugins_s,
            "--plugins",
            "ticker",
            "--duration",
            "1s",
            "--output",
            data_s,
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let (out, failed) = collect(&[
            "--config",
            cfg_s,
            "run",
            "--plugin-dir",
            plugins_s,
            "--benchmark",
            "shell",
            "--plugins",
            "ticker",
            "--output",
            data_s,
        ]);
        assert!(!out.status.success(), "the benchmark exits with 3");
        (curated, failed)
    };
    assert_eq!(manifest(&curated)["run_class"], "curated");
    assert_eq!(manifest(&failed)["run_class"], "failed");

    let out = kernmlops(&["export", "--parquet", "--data", data_s, "--to", export_s]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));

    for (dir, class, bench) in [(&curated, "curated", "none"), (&failed, "failed", "shell")] {
        let id = collection_id(dir);
        let man = manifest(dir);
        let rows = man["tables"]["ticker"]["rows"].as_u64().expect("rows");
        assert!(rows > 0, "the ticker made rows");
        let file = export
            .join(class)
            .join("ticker")
            .join(format!("{id}.{bench}.parquet"));
        assert!(file.is_file(), "{} missing:\n{stdout}", file.display());
        assert!(
            stdout.contains(&file.display().to_string()),
            "export prints what it wrote:\n{stdout}"
        );
        // The independent reader: polars, against the manifest's count.
        let report = python(SCHEMA_OF, &[file.to_str().expect("utf8")]);
        let mut lines = report.lines();
        assert_eq!(lines.next(), Some(rows.to_string().as_str()), "{report}");
        let types: Vec<&str> = lines.collect();
        for want in [
            "ts_uptime_us=UInt64",
            "seq=UInt64",
            "value_i32=Int32",
            "flag=Boolean",
            "label=String",
            "text=String",
        ] {
            assert!(types.contains(&want), "{want} not in {types:?}");
        }
        // system_info is exported beside the probe tables.
        assert!(export
            .join(class)
            .join("system_info")
            .join(format!("{id}.{bench}.parquet"))
            .is_file());
    }

    // Idempotent: a second export overwrites, adding nothing.
    let count = |root: &Path| {
        walk(root)
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
            .count()
    };
    let before = count(&export);
    let again = kernmlops(&["export", "--parquet", "--data", data_s, "--to", export_s]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(count(&export), before);
    assert!(!walk(&export)
        .iter()
        .any(|p| p.to_string_lossy().ends_with(".tmp")));

    // The Python helper loads a class folder by table name.
    let curated_rows = manifest(&curated)["tables"]["ticker"]["rows"]
        .as_u64()
        .expect("rows");
    let loaded = python(
        r#"
import sys
from kernmlops_data import read_parquet_dir, read_collection
tables = read_parquet_dir(sys.argv[1])
print(",".join(sorted(tables)))
print(tables["ticker"].height)
raw = read_collection(sys.argv[2])
print(raw["ticker"].height, raw["ticker"].schema["ts_uptime_us"])
"#,
        &[
            export.join("curated").to_str().expect("utf8"),
            curated.to_str().expect("utf8"),
        ],
    );
    let mut lines = loaded.lines();
    let names = lines.next().unwrap_or_default();
    assert!(names.split(',').any(|n| n == "ticker"), "{loaded}");
    assert!(names.split(',').any(|n| n == "system_info"), "{loaded}");
    assert_eq!(lines.next(), Some(curated_rows.to_string().as_str()));
    assert_eq!(
        lines.next(),
        Some(format!("{curated_rows} UInt64").as_str())
    );

    // Exporting one collection by its id writes only that one.
    let only = work.join("only");
    let id = collection_id(&failed);
    let out = kernmlops(&[
        "export",
        "--parquet",
        "--data",
        data_s,
        "--to",
        only.to_str().expect("utf8"),
        &id,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(only.join("failed/ticker").is_dir());
    assert!(!only.join("curated").exists());
}

#[test]
fn root_dump_summarises_every_table() {
    let test = "root_dump_summarises_every_table";
    if !require_root(test) {
        return;
    }
    let plugins = plugin_dir("dump", &[("fixture_faulty", "faulty")]);
    let work = temp_dir("dump-work");
    let data = work.join("out");
    let dir = {
        let _serial = serial();
        let (out, dir) = collect(&[
            "run",
            "--plugin-dir",
            plugins.to_str().expect("utf8"),
            "--plugins",
            "ticker",
            "--duration",
            "1s",
            "--output",
            data.to_str().expect("utf8"),
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        dir
    };
    let man = manifest(&dir);
    // By default the newest collection under --data; also by id.
    for args in [
        vec!["dump", "--data", data.to_str().expect("utf8")],
        vec![
            "dump",
            "--data",
            data.to_str().expect("utf8"),
            man["collection_id"].as_str().expect("id"),
        ],
    ] {
        let out = kernmlops(&args);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
        for (table, entry) in man["tables"].as_object().expect("tables") {
            let rows = entry["rows"].as_u64().expect("rows");
            let lost = entry["lost_events"].as_u64().expect("lost");
            let head = format!("{table}: {rows} rows, {lost} lost events");
            assert!(stdout.contains(&head), "{head:?} not in:\n{stdout}");
        }
        assert!(stdout.contains("system_info: "), "{stdout}");
        // The numeric columns of the ticker, with the seq range the rows have.
        let rows = man["tables"]["ticker"]["rows"].as_u64().expect("rows");
        let seq = read_table(&dir.join("ticker.arrow"));
        let seq = column_u64(&seq, "seq");
        let (lo, hi) = (
            seq.iter().min().copied().unwrap_or(0),
            seq.iter().max().copied().unwrap_or(0),
        );
        assert_eq!(seq.len() as u64, rows);
        assert!(
            stdout.lines().any(|l| l.trim_start().starts_with("seq")
                && l.contains(&format!("min {lo} "))
                && l.ends_with(&format!("max {hi}"))),
            "seq {lo}..{hi} not in:\n{stdout}"
        );
    }
}

/// Every file under `root`.
fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}
