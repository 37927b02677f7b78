//! Comparisons and labels end to end, on real experiments of a script
//! benchmark whose result depends on its variables plus random noise:
//! `experiment results --reference` writes p-values, Holm corrections,
//! ratio intervals, medians and MADs equal to scipy's and numpy's on the
//! same numbers; `--best-by` picks the right level in each combination,
//! significantly, with the default's regret, one row per run joining the
//! results on `collection_id`; `experiment compare` of two experiments
//! finds B above A; bad options are one error line each. A `probes`
//! variable gives a baseline and a probed combination, each run collecting
//! with exactly its set, and the collector's overhead as a ratio with its
//! interval (`overhead.parquet`, equal to scipy's).

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use kernmlops_e2e::*;
use serde_json::Value;

/// A script benchmark: `value` is `level * 10` (mode `up`) or
/// `40 - level * 10` (mode `down`), plus `shift`, plus up to 3 at random.
const SCRIPT: &str = r#"#!/bin/sh
v=$(awk -v seed="$$" -v l="$KML_PARAM_LEVEL" -v m="${KML_PARAM_MODE:-up}" -v s="${KML_PARAM_SHIFT:-0}" 'BEGIN {
  srand(seed); base = (m == "up") ? l * 10 : 40 - l * 10; printf "%.4f", base + s + 3 * rand() }')
echo "{\"name\": \"levels\", \"component\": \"sh\", \"@result\": {\"value\": $v}}"
"#;

fn plugins(test: &str) -> PathBuf {
    plugin_dir(
        test,
        &[
            ("workloads", "workloads"),
            ("quanta_runtime", "quanta_runtime"),
        ],
    )
}

fn experiment(plugins: &Path, cwd: &Path, args: &[&str]) -> Output {
    experiment_cmd(Some(cwd), plugins, &[], args)
}

/// Writes the script and an experiment file; `variables` is TOML text.
fn experiment_file(work: &Path, name: &str, shift: f64, repeats: u32, variables: &str) -> PathBuf {
    let script = work.join("levels.sh");
    if !script.exists() {
        std::fs::write(&script, SCRIPT).expect("script");
        let chmod = Command::new("chmod").arg("+x").arg(&script).status();
        assert!(chmod.is_ok_and(|s| s.success()));
    }
    let file = work.join(format!("{name}.toml"));
    std::fs::write(
        &file,
        format!(
            "name = \"{name}\"\nbenchmark = \"script\"\nprobes = []\nrepeats = {repeats}\nseed = 7\n\
             [config.benchmarks.script]\ncommand = [{:?}]\ndrop_page_cache = false\n\
             [config.benchmarks.script.parameters]\nshift = {shift}\n{variables}",
            s(&script)
        ),
    )
    .expect("experiment file");
    file
}

fn run_experiment(plugins: &Path, work: &Path, file: &Path, dir: &Path) {
    let out = {
        let _serial = serial();
        experiment(
            plugins,
            work,
            &["run", s(file), "--dir", s(dir), "--no-graphs"],
        )
    };
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// Recomputes every comparison row from the results with scipy (Welch's
/// t-test, Student-t quantile for Fieller's interval), numpy (median,
/// MAD) and Holm's procedure per figure; prints what differs, one line
/// each, then a JSON summary of the rows.
const CHECK: &str = r#"
import json, sys, math
import numpy as np, polars as pl
from scipy import stats
cmp = pl.read_parquet(sys.argv[1])
subj = pl.read_parquet(sys.argv[2])
ref = pl.read_parquet(sys.argv[3])
bad = []
def close(a, b, rel=1e-6, abs_=1e-9):
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= max(abs_, rel * max(abs(a), abs(b)))
def sample(df, combo, fig):
    col = fig if fig in df.columns else "result_" + fig
    d = df.filter((pl.col("combo_id") == combo) & (pl.col("run_class") != "failed"))
    d = d.filter(pl.col(col).is_not_null())
    return np.array(d[col].to_list(), dtype=float), d["collection_id"].to_list()
rows = cmp.to_dicts()
for r in rows:
    a, ids = sample(subj, r["combo_id"], r["figure"])
    if len(a) != r["n"]:
        bad.append(f"n {r['n']} != {len(a)} for {r['combo_id']} {r['figure']}")
        continue
    med = float(np.median(a)); mad = float(np.median(np.abs(a - med)))
    if not close(r["median"], med) or not close(r["mad"], mad):
        bad.append(f"median/MAD {r['median']}/{r['mad']} != {med}/{mad}")
    out = sorted(i for i, x in zip(ids, a) if mad > 0 and 0.6745 * abs(x - med) / mad > 3.5)
    if sorted(r["outlier_runs"]) != out:
        bad.append(f"outliers {r['outlier_runs']} != {out}")
    if r["p"] is None:
        continue
    b, _ = sample(ref, r["reference_combo_id"], r["figure"])
    t = stats.ttest_ind(a, b, equal_var=False)
    if not close(r["p"], float(t.pvalue)) or not close(r["t"], float(t.statistic)):
        bad.append(f"{r['combo_id']} {r['figure']}: p {r['p']} t {r['t']} != scipy {t.pvalue} {t.statistic}")
    x, y = a.mean(), b.mean()
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    q0 = x / y
    ta, tb = va, q0 * q0 * vb
    df = (ta + tb) ** 2 / (ta * ta / (len(a) - 1) + tb * tb / (len(b) - 1))
    q = stats.t.ppf(0.975, df)
    lead = y * y - q * q * vb
    disc = q * q * (x * x * vb + y * y * va - q * q * va * vb)
    lo = hi = None
    if lead > 0 and disc >= 0:
        lo, hi = (x * y - math.sqrt(disc)) / lead, (x * y + math.sqrt(disc)) / lead
    if not close(r["ratio"], q0) or not close(r["ratio_lo"], lo) or not close(r["ratio_hi"], hi):
        bad.append(f"ratio {r['ratio']} [{r['ratio_lo']}, {r['ratio_hi']}] != {q0} [{lo}, {hi}]")
for fig in set(r["figure"] for r in rows):
    tested = [r for r in rows if r["figure"] == fig and r["p"] is not None]
    order = sorted(range(len(tested)), key=lambda i: tested[i]["p"])
    m, running = len(tested), 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * tested[i]["p"]))
        if not close(tested[i]["p_holm"], running, 1e-9, 1e-12):
            bad.append(f"{fig}: Holm {tested[i]['p_holm']} != {running}")
for b in bad:
    print(b)
print(json.dumps([{k: r[k] for k in ("combo_id", "figure", "is_reference", "ratio", "ratio_lo", "ratio_hi", "p", "p_holm", "significant")} | {"vars": {k: r[k] for k in ("level", "mode", "probes") if k in r}} for r in rows]))
"#;

/// Runs [`CHECK`]; panics with the differences; returns the rows.
fn check_with_scipy(comparisons: &Path, subject: &Path, reference: &Path) -> Vec<Value> {
    let out = Command::new("python3")
        .args(["-c", CHECK])
        .args([comparisons, subject, reference])
        .output()
        .expect("running python3");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    let (last, differences) = lines.split_last().expect("output");
    assert!(
        differences.is_empty(),
        "comparisons differ from scipy's:\n{}",
        differences.join("\n")
    );
    serde_json::from_str(last).expect("rows JSON")
}

fn figure_rows<'a>(rows: &'a [Value], figure: &str) -> Vec<&'a Value> {
    rows.iter().filter(|r| r["figure"] == figure).collect()
}

#[test]
fn root_comparisons_equal_scipy_and_best_by_labels_the_right_level() {
    let test = "root_comparisons_equal_scipy_and_best_by_labels_the_right_level";
    if !require_root(test) || !require_tool(test, "python3") {
        return;
    }
    let plugins = plugins("comparisons-levels");
    let work = temp_dir("comparisons-levels");
    let file = experiment_file(
        &work,
        "levels",
        0.0,
        4,
        "[variables.mode]\nvalues = [\"up\", \"down\"]\n\
         [variables.level]\nvalues = [1, 2, 3]\ndefault = 2\n",
    );
    let dir = work.join("exp");
    run_experiment(&plugins, &work, &file, &dir);

    let out = experiment(
        &plugins,
        &work,
        &[
            "results",
            s(&dir),
            "--no-graphs",
            "--reference",
            "level=2",
            "--best-by",
            "value",
            "--over",
            "level",
        ],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("comparisons: "), "{stdout}");
    assert!(stdout.contains("(reference)"), "{stdout}");

    // Every number of comparisons.parquet equals scipy's.
    let results = dir.join("results.parquet");
    let rows = check_with_scipy(&dir.join("comparisons.parquet"), &results, &results);
    let value = figure_rows(&rows, "value");
    assert_eq!(value.len(), 6, "one row per combination: {value:?}");
    for r in &value {
        let level = r["vars"]["level"].as_i64().expect("level");
        let up = r["vars"]["mode"] == "up";
        if level == 2 {
            assert_eq!(r["is_reference"], true, "{r}");
            assert!(r["p"].is_null(), "{r}");
            continue;
        }
        // 10 apart out of 20 plus noise of at most 3: significant, and
        // the interval on the right side of 1.
        assert_eq!(r["significant"], true, "{r}");
        let above = (level == 3) == up;
        let (lo, hi) = (r["ratio_lo"].as_f64(), r["ratio_hi"].as_f64());
        assert!(lo.zip(hi).is_some(), "bounded: {r}");
        if above {
            assert!(lo.is_some_and(|lo| lo > 1.0), "{r}");
        } else {
            assert!(hi.is_some_and(|hi| hi < 1.0), "{r}");
        }
    }

    // The labels: level 3 when going up, 1 when going down, significant,
    // the default's regret as the means say; one row per run.
    let labels = Command::new("python3")
        .args([
            "-c",
            r#"
import json, sys, polars as pl
labels = pl.read_parquet(sys.argv[1])
results = pl.read_parquet(sys.argv[2])
joined = results.join(labels.select("collection_id", "best", "significant"), on="collection_id")
print(json.dumps({"rows": labels.to_dicts(), "joined": joined.height,
    "dtypes": {k: str(v) for k, v in labels.schema.items()}}))
"#,
        ])
        .arg(dir.join("labels.parquet"))
        .arg(&results)
        .output()
        .expect("python3");
    assert!(labels.status.success(), "{}", text(&labels.stderr));
    let labels: Value = serde_json::from_str(&text(&labels.stdout)).expect("labels JSON");
    assert_eq!(labels["joined"], 24, "every run joins its label");
    assert_eq!(labels["dtypes"]["best"], "Int64", "{labels}");
    let rows = labels["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 24);
    for r in rows {
        let up = r["mode"] == "up";
        assert_eq!(r["best"], if up { 3 } else { 1 }, "{r}");
        assert_eq!(r["runner_up"], 2, "{r}");
        assert_eq!(r["significant"], true, "{r}");
        assert_eq!(r["default"], 2, "{r}");
        let (best, default) = (
            r["best_mean"].as_f64().expect("best_mean"),
            r["default_mean"].as_f64().expect("default_mean"),
        );
        let regret = r["regret"].as_f64().expect("regret");
        assert!(((best - default) / best - regret).abs() < 1e-9, "{r}");
        assert!(r["margin"].as_f64().is_some_and(|m| m > 0.2), "{r}");
    }
    assert!(
        stdout.contains("mode=up: level=3") && stdout.contains("mode=down: level=1"),
        "{stdout}"
    );

    // Bad options: one error line each, nothing else on stderr.
    for (args, needle) in [
        (vec!["--reference", "nope=1"], "no variable \"nope\""),
        (
            vec!["--reference", "level=7"],
            "\"7\" is not a value of level",
        ),
        (vec!["--reference", "level"], "give VAR=VALUE"),
        (
            vec!["--best-by", "nope", "--over", "level"],
            "--best-by nope",
        ),
        (vec!["--best-by", "value", "--over", "nope"], "--over nope"),
    ] {
        let mut all = vec!["results", s(&dir), "--no-graphs"];
        all.extend(&args);
        let out = experiment(&plugins, &work, &all);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("error:") && stderr.contains(needle),
            "{args:?}: {stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn root_experiment_compare_finds_b_above_a() {
    let test = "root_experiment_compare_finds_b_above_a";
    if !require_root(test) || !require_tool(test, "python3") {
        return;
    }
    let plugins = plugins("comparisons-compare");
    let work = temp_dir("comparisons-compare");
    let vars = "[variables.level]\nvalues = [1, 2]\n";
    let file_a = experiment_file(&work, "before", 0.0, 3, vars);
    let file_b = experiment_file(&work, "after", 5.0, 3, vars);
    let (dir_a, dir_b) = (work.join("a"), work.join("b"));
    run_experiment(&plugins, &work, &file_a, &dir_a);
    run_experiment(&plugins, &work, &file_b, &dir_b);

    // Default output: in the current folder.
    let out = experiment(&plugins, &work, &["compare", s(&dir_a), s(&dir_b)]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let default = work.join("compare-before-after.parquet");
    assert!(default.is_file(), "{stdout}");
    let rows = check_with_scipy(
        &default,
        &dir_b.join("results.parquet"),
        &dir_a.join("results.parquet"),
    );
    let value = figure_rows(&rows, "value");
    assert_eq!(value.len(), 2, "{value:?}");
    for r in &value {
        // +5 on 10 or 20 with noise of at most 3.
        assert_eq!(r["significant"], true, "{r}");
        assert!(r["ratio_lo"].as_f64().is_some_and(|lo| lo > 1.0), "{r}");
    }

    // --out, and experiments over different variables refused.
    let out_file = work.join("k.parquet");
    let out = experiment(
        &plugins,
        &work,
        &["compare", s(&dir_a), s(&dir_b), "--out", s(&out_file)],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(out_file.is_file());
    let file_c = experiment_file(
        &work,
        "other",
        0.0,
        2,
        "[variables.mode]\nvalues = [\"up\"]\n",
    );
    let dir_c = work.join("c");
    {
        // The script needs a level: give it one in the base configuration.
        let text = std::fs::read_to_string(&file_c).expect("file");
        std::fs::write(&file_c, text.replace("shift = 0", "shift = 0\nlevel = 1")).expect("file");
    }
    run_experiment(&plugins, &work, &file_c, &dir_c);
    let out = experiment(&plugins, &work, &["compare", s(&dir_a), s(&dir_c)]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("vary different variables"), "{stderr}");
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn root_probes_variable_measures_the_collectors_overhead() {
    let test = "root_probes_variable_measures_the_collectors_overhead";
    if !require_root(test) || !require_tool(test, "python3") {
        return;
    }
    let plugins = plugins("comparisons-probes");
    let work = temp_dir("comparisons-probes");
    // The experiment file without a top-level probes list: the variable
    // sets them.
    let file = experiment_file(
        &work,
        "overhead",
        0.0,
        4,
        "[variables.probes]\nvalues = [[], [\"quanta_runtime\"]]\n\
         [variables.level]\nvalues = [2]\n",
    );
    let body = std::fs::read_to_string(&file).expect("file");
    std::fs::write(&file, body.replacen("probes = []\n", "", 1)).expect("file");
    // A set naming a probe that is not installed: one error line.
    let bad = work.join("bad.toml");
    std::fs::write(
        &bad,
        body.replacen("probes = []\n", "", 1)
            .replace("[\"quanta_runtime\"]", "[\"no_such_probe\"]"),
    )
    .expect("bad file");
    let out = experiment(&plugins, &work, &["run", s(&bad), "--dry-run"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "accepted: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error:")
            && stderr.contains("variables.probes: no_such_probe: unknown plugin"),
        "{stderr}"
    );
    let dir = work.join("exp");
    run_experiment(&plugins, &work, &file, &dir);

    // Each run collected with exactly its set: the baseline with none.
    let record: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("experiment.json")).expect("record"),
    )
    .expect("record JSON");
    let runs = record["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 8);
    for run in runs {
        let id = run["run_id"].as_str().expect("run_id");
        let man = manifest(&dir.join("runs").join(id));
        let probes: Vec<&str> = man["probes"]
            .as_array()
            .expect("probes")
            .iter()
            .filter_map(|p| p["name"].as_str())
            .collect();
        match run["variables"]["probes"].as_str() {
            Some("none") => {
                assert_eq!(run["probes"], serde_json::json!([]), "{run}");
                assert!(probes.is_empty(), "{id}: {probes:?}");
                assert_eq!(man["run_class"], "baseline", "{id}");
            }
            Some("quanta_runtime") => {
                assert_eq!(probes, ["quanta_runtime"], "{id}");
                assert_ne!(man["run_class"], "baseline", "{id}");
            }
            other => panic!("{id}: probes column {other:?}"),
        }
    }

    let out = experiment(&plugins, &work, &["results", s(&dir), "--no-graphs"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains("collector overhead: ")
            && stdout.contains("against probes=none (the collector's effect"),
        "{stdout}"
    );
    // The results' probes column names the set.
    let (_, rows) = polars_results(&dir);
    let mut sets: Vec<&str> = rows.iter().filter_map(|r| r["probes"].as_str()).collect();
    sets.sort_unstable();
    sets.dedup();
    assert_eq!(sets, ["none", "quanta_runtime"]);

    // overhead.parquet: every number equals scipy's; per figure, the
    // baseline is the reference and the probed set has a ratio with its
    // interval.
    let results = dir.join("results.parquet");
    let rows = check_with_scipy(&dir.join("overhead.parquet"), &results, &results);
    let value = figure_rows(&rows, "value");
    assert_eq!(value.len(), 2, "{value:?}");
    for r in &value {
        if r["vars"]["probes"] == "none" {
            assert_eq!(r["is_reference"], true, "{r}");
            assert_eq!(r["ratio"], 1.0, "{r}");
            continue;
        }
        assert_eq!(r["vars"]["probes"], "quanta_runtime", "{r}");
        assert_eq!(r["is_reference"], false, "{r}");
        let ratio = r["ratio"].as_f64().expect("ratio");
        let (lo, hi) = (
            r["ratio_lo"].as_f64().expect("bounded"),
            r["ratio_hi"].as_f64().expect("bounded"),
        );
        // 20 plus noise below 3 in both: a ratio near 1 inside its interval.
        assert!(lo < ratio && ratio < hi, "{r}");
        assert!(lo > 0.8 && hi < 1.25, "{r}");
        assert!(r["p"].as_f64().is_some(), "{r}");
    }
    // Wall time is a figure too: the collector's effect on it is reported
    // (its interval may be unbounded with so few short runs: null then).
    assert!(
        rows.iter().any(|r| r["figure"] == "wall_time_s"
            && r["vars"]["probes"] == "quanta_runtime"
            && r["ratio"].is_number()
            && r["p"].is_number()),
        "{rows:?}"
    );
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}
