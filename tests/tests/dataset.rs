//! A dataset any engine reads: collections from an experiment and from a
//! separate baseline run (as from another machine) exported with
//! `kernmlops export --parquet --layout hive` into one folder, read back by
//! DuckDB and by polars `scan_parquet` as one table per kernel table, with
//! the partition columns, each giving the row counts `kernmlops dump`
//! gives; and a DuckDB join of `quanta_runtime` with the experiment's
//! `results.parquet` on `collection_id`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use kernmlops_e2e::*;
use serde_json::Value;

/// Rows per table of one collection, as `kernmlops dump` prints them
/// (`<table>: <n> rows, ...`).
fn dump_rows(collection: &Path) -> BTreeMap<String, u64> {
    let out = kernmlops(&["dump", s(collection)]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    stdout
        .lines()
        .filter_map(|l| {
            let (table, rest) = l.split_once(": ")?;
            let n = rest
                .strip_suffix(" rows")
                .or_else(|| rest.split(" rows,").next())?;
            Some((table.trim().to_owned(), n.trim().parse().ok()?))
        })
        .collect()
}

/// What DuckDB and polars read from the dataset: per engine, table and
/// collection id, `[run_class, benchmark, rows]`; the type each engine gives
/// `collection_id`; and DuckDB's join with the results.
const READ_BACK: &str = r#"
import json, os, sys
import duckdb, polars as pl

ds, results = sys.argv[1], sys.argv[2]
out = {"duckdb": {}, "polars": {}, "types": {}, "join": []}
con = duckdb.connect()
for table in sorted(os.listdir(ds)):
    files = f"{ds}/{table}/**/*.parquet"
    rel = con.sql(
        f"SELECT collection_id, run_class, benchmark, count(*) AS n "
        f"FROM read_parquet('{files}', hive_partitioning = true) GROUP BY ALL"
    )
    out["duckdb"][table] = {c: [rc, b, n] for c, rc, b, n in rel.fetchall()}
    lf = pl.scan_parquet(files, hive_partitioning=True)
    df = lf.group_by("collection_id", "run_class", "benchmark").agg(pl.len().alias("n")).collect()
    out["polars"][table] = {r["collection_id"]: [r["run_class"], r["benchmark"], r["n"]] for r in df.to_dicts()}
    described = dict((row[0], row[1]) for row in con.sql(f"DESCRIBE SELECT * FROM read_parquet('{files}', hive_partitioning = true)").fetchall())
    out["types"][table] = [described.get("collection_id"), str(lf.collect_schema().get("collection_id"))]
out["join"] = con.sql(
    f"SELECT r.run_id, q.collection_id, r.rows_quanta_runtime, count(*) AS n "
    f"FROM read_parquet('{ds}/quanta_runtime/**/*.parquet', hive_partitioning = true) AS q "
    f"JOIN read_parquet('{results}') AS r USING (collection_id) GROUP BY ALL ORDER BY 1"
).fetchall()
print(json.dumps(out))
"#;

#[test]
fn root_dataset_hive_export_reads_the_same_in_duckdb_polars_and_dump() {
    let test = "root_dataset_hive_export_reads_the_same_in_duckdb_polars_and_dump";
    if !require_root(test) || !require_tool(test, "stress-ng") || !require_tool(test, "python3") {
        return;
    }
    let plugins = plugin_dir(
        "dataset",
        &[
            ("workloads", "workloads"),
            ("quanta_runtime", "quanta_runtime"),
            ("process_trace", "process_trace"),
        ],
    );
    let work = temp_dir("dataset");
    let _serial = serial();

    // An experiment of three short runs, here.
    let file = work.join("exp.toml");
    std::fs::write(
        &file,
        "name = \"dataset\"\nbenchmark = \"stress_ng\"\nprobes = [\"quanta_runtime\", \"process_trace\"]\n\
         repeats = 3\nseed = 1\n\
         [config.benchmarks.stress_ng]\ntimeout = \"1s\"\ndrop_page_cache = false\n",
    )
    .expect("experiment file");
    let exp = work.join("exp");
    let out = Command::new(kernmlops_bin())
        .arg("--plugin-dir")
        .arg(&plugins)
        .args([
            "experiment",
            "run",
            s(&file),
            "--dir",
            s(&exp),
            "--no-graphs",
        ])
        .output()
        .expect("kernmlops experiment");
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    // And a baseline collection of its own, as from another machine.
    let config = work.join("baseline.toml");
    std::fs::write(
        &config,
        "[benchmarks.stress_ng]\ntimeout = \"1s\"\ndrop_page_cache = false\n",
    )
    .expect("config");
    let other = work.join("other");
    let out = Command::new(kernmlops_bin())
        .arg("--plugin-dir")
        .arg(&plugins)
        .arg("--config")
        .arg(&config)
        .args([
            "run",
            "--benchmark",
            "stress_ng",
            "--baseline",
            "--output",
            s(&other),
        ])
        .output()
        .expect("kernmlops run");
    assert!(out.status.success(), "{}", text(&out.stderr));

    // Both exported into one Hive-partitioned dataset.
    let ds = work.join("dataset");
    for data in [exp.join("runs"), other.clone()] {
        let out = kernmlops(&[
            "export",
            "--parquet",
            "--layout",
            "hive",
            "--data",
            s(&data),
            "--to",
            s(&ds),
        ]);
        assert!(
            out.status.success(),
            "{}\n{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    assert!(ds
        .join("quanta_runtime/run_class=curated/benchmark=stress_ng")
        .is_dir());
    assert!(ds
        .join("performance_indicator/run_class=baseline/benchmark=stress_ng")
        .is_dir());

    // What dump says: rows per table and collection, and each collection's
    // class.
    let mut collections: Vec<PathBuf> = std::fs::read_dir(exp.join("runs"))
        .expect("runs")
        .chain(std::fs::read_dir(&other).expect("other"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    collections.sort();
    assert_eq!(collections.len(), 4, "{collections:?}");
    let mut want: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
    for c in &collections {
        let m = manifest(c);
        let id = m["collection_id"].as_str().expect("id").to_owned();
        for (table, rows) in dump_rows(c) {
            if rows > 0 {
                want.entry(table).or_default().insert(
                    id.clone(),
                    serde_json::json!([m["run_class"], "stress_ng", rows]),
                );
            }
        }
    }
    assert!(want["quanta_runtime"].len() == 3, "{want:?}");

    let results = exp.join("results.parquet");
    let out = Command::new("python3")
        .arg("-c")
        .arg(READ_BACK)
        .arg(&ds)
        .arg(&results)
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let got: Value = serde_json::from_str(&text(&out.stdout)).expect("read-back JSON");

    // Every engine reads every table as one, with the same rows per
    // collection as dump, and the partition columns filled in.
    for engine in ["duckdb", "polars"] {
        let tables: BTreeMap<String, BTreeMap<String, Value>> =
            serde_json::from_value(got[engine].clone()).expect("tables");
        assert_eq!(
            tables.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "{engine}: tables"
        );
        for (table, per_collection) in &want {
            assert_eq!(&tables[table], per_collection, "{engine}: {table}");
        }
    }
    for (table, types) in got["types"].as_object().expect("types") {
        assert_eq!(
            types,
            &serde_json::json!(["VARCHAR", "String"]),
            "{table}: collection_id a plain string in both engines"
        );
    }

    // The kernel table joins the experiment's results on collection_id:
    // one group per run, as many rows as the results and dump count.
    let join = got["join"].as_array().expect("join");
    assert_eq!(join.len(), 3, "{join:?}");
    for row in join {
        let (collection_id, in_results, joined) = (&row[1], &row[2], &row[3]);
        assert_eq!(in_results, joined, "{row}");
        let id = collection_id.as_str().expect("id");
        assert_eq!(want["quanta_runtime"][id][2], *joined, "{row}");
    }
}
