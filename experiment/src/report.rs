//! Printing what an experiment is and did: the plan of a dry run, what was
//! submitted to Slurm, the results summary and `experiment status`.

use std::{collections::BTreeMap, path::Path, process::ExitCode};

use serde_json::Value as Json;

use crate::{
    commands::{observe, Env},
    graphs,
    plan::{label, Identity, PlannedRun},
    record::{ExpDir, Record},
    results::{self, Results},
    spec::{self, Order, Spec},
    state::{self, RunState},
    ExperimentError, Result,
};

pub(crate) fn order_name(o: Order) -> &'static str {
    match o {
        Order::Shuffled => "shuffled",
        Order::Sequential => "sequential",
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn print_plan(
    spec: &Spec,
    variables: &[spec::Variable],
    runs: &[PlannedRun],
    seed: u64,
    seed_from: &str,
    order: Order,
    identity: &Identity,
    dir: &ExpDir,
) {
    let combos: std::collections::BTreeSet<&str> =
        runs.iter().map(|r| r.combo_id.as_str()).collect();
    kernmlops::outln!(
        "experiment {}: {} runs ({} combinations), benchmark {}, probes {}, order {}, seed {}{}",
        spec.name,
        runs.len(),
        combos.len(),
        identity.benchmark,
        match variables.iter().find(|v| v.is_probes()) {
            Some(v) => format!("set by variable {}", v.name),
            None if identity.probes.is_empty() => "none (baseline)".to_owned(),
            None => identity.probes.join(","),
        },
        order_name(order),
        seed,
        if seed_from == "random" {
            " (random: set seed = N in the file to keep it)"
        } else {
            ""
        }
    );
    kernmlops::outln!("folder: {}", dir.root.display());
    let width = runs.len().to_string().len();
    for (i, r) in runs.iter().enumerate() {
        kernmlops::outln!(
            "  {:>width$}  {}  repeat {}  {}",
            i + 1,
            r.run_id,
            r.repeat,
            label(variables, &r.variables)
        );
    }
}

/// What was submitted, and how to follow it.
pub(crate) fn print_submitted(dir: &ExpDir, id: &str, runs: usize) {
    let d = dir.root.display();
    kernmlops::outln!(
        "submitted {runs} run{} to Slurm as job {id} (an array task per run, on whole nodes: one per run, or one per role)",
        if runs == 1 { "" } else { "s" }
    );
    kernmlops::outln!("follow:  kernmlops experiment status {d}   (squeue --jobs {id})");
    kernmlops::outln!("results: kernmlops experiment results {d}   (what has finished so far)");
    kernmlops::outln!("redo what died: kernmlops experiment resume {d} --executor slurm");
}

/// Writes the results (and graphs), prints the summary; failure when runs
/// are missing or failed.
pub(crate) fn report(
    dir: &ExpDir,
    record: &Record,
    draw: Option<(&Env, &Path)>,
    only: &[String],
) -> Result<ExitCode> {
    let observed = observe(dir, record).1;
    let results = Results::collect(dir, record, &observed);
    report_collected(dir, record, &observed, &results, draw, only)
}

/// [`report`] of results already collected (`observed` the runs' states).
pub(crate) fn report_collected(
    dir: &ExpDir,
    record: &Record,
    observed: &[state::Observed],
    results: &Results,
    draw: Option<(&Env, &Path)>,
    only: &[String],
) -> Result<ExitCode> {
    results.write(dir)?;
    let counts = state::counts(observed);
    print_header(record, dir, &counts);
    kernmlops::outln!(
        "results: {} ({} row{}), {}",
        dir.results_parquet().display(),
        results.rows,
        if results.rows == 1 { "" } else { "s" },
        dir.results_arrow().display()
    );
    if let (Some((env, plugin_dir)), true) = (draw, results.rows > 0) {
        match env
            .registry(plugin_dir)
            .and_then(|r| graphs::render(&r, dir))
        {
            Ok(files) => {
                kernmlops::outln!("graphs: {} ({} files)", dir.graphs().display(), files.len())
            }
            Err(e) => eprintln!("warning: graphs not drawn: {e}"),
        }
    }
    let stale = state::stale(dir, record);
    if !stale.is_empty() {
        kernmlops::outln!(
            "note: {} collection(s) in {} belong to an earlier version of the experiment and are left out",
            stale.len(),
            dir.runs().display()
        );
    }
    let mut summaries = results::summarize(record, results);
    if !only.is_empty() {
        let known: Vec<String> = results::figure_columns(results)
            .iter()
            .map(|c| c.name.trim_start_matches("result_").to_owned())
            .collect();
        if let Some(bad) = only.iter().find(|f| !known.contains(f)) {
            return Err(ExperimentError::Usage(format!(
                "--figures {bad}: no such numeric figure (known: {})",
                known.join(", ")
            )));
        }
        for s in &mut summaries {
            s.figures
                .retain(|(c, _)| only.iter().any(|f| f == c.trim_start_matches("result_")));
        }
    }
    if !summaries.is_empty() {
        kernmlops::outln!();
        kernmlops::out!("{}", results::render(&summaries));
    }
    let unfinished = observed
        .iter()
        .filter(|o| o.state != RunState::Done)
        .count();
    // Runs still under way (a Slurm array) are not a failure of the
    // results: they are read again next time.
    let under_way = observed
        .iter()
        .filter(|o| matches!(o.state, RunState::Queued | RunState::Running))
        .count();
    Ok(if unfinished == 0 {
        ExitCode::SUCCESS
    } else if unfinished == under_way {
        kernmlops::outln!(
            "note: {under_way} of {} runs are still queued or running; `kernmlops experiment results {}` again reads them once done",
            record.runs.len(),
            dir.root.display()
        );
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "error: {unfinished} of {} runs are not done (see `kernmlops experiment status {}`)",
            record.runs.len(),
            dir.root.display()
        );
        ExitCode::FAILURE
    })
}

pub(crate) fn status(dir: &ExpDir, json: bool) -> Result<ExitCode> {
    let record = Record::read(dir)?;
    let (view, observed) = observe(dir, &record);
    let counts = state::counts(&observed);
    if json {
        let runs: Vec<Json> = record
            .runs
            .iter()
            .zip(&observed)
            .map(|(r, o)| {
                let mut run = serde_json::json!({
                    "run_id": r.run_id,
                    "combo_id": r.combo_id,
                    "repeat": r.repeat,
                    "variables": r.variables,
                    "state": o.state,
                    "detail": o.detail,
                });
                if let Some(task) = view.as_ref().and_then(|v| v.task_of(&r.run_id)) {
                    run["slurm_task"] = Json::from(task);
                }
                run
            })
            .collect();
        let counts: BTreeMap<&str, usize> = counts.iter().map(|(s, n)| (s.as_str(), *n)).collect();
        let mut doc = serde_json::json!({
            "name": record.name,
            "dir": dir.root.display().to_string(),
            "runs": runs,
            "counts": counts,
            "stale": state::stale(dir, &record),
        });
        if let Some(v) = &view {
            doc["slurm"] = serde_json::json!({
                "jobs": v.jobs,
                "unavailable": v.unavailable,
                "no_history": v.no_history,
            });
        }
        kernmlops::outln!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return Ok(ExitCode::SUCCESS);
    }
    print_header(&record, dir, &counts);
    if let Some(v) = &view {
        match &v.unavailable {
            Some(why) => {
                kernmlops::outln!(
                    "note: Slurm could not be asked ({why}); states from the folder alone"
                )
            }
            None => kernmlops::outln!("{}", crate::slurm::describe(v)),
        }
    }
    let labels: Vec<String> = record
        .runs
        .iter()
        .map(|r| {
            format!("{} #{}", label(&record.variables, &r.variables), r.repeat)
                .trim()
                .to_owned()
        })
        .collect();
    let width = labels.iter().map(String::len).max().unwrap_or(9).max(9);
    let n = record.runs.len().to_string().len().max(1);
    kernmlops::outln!(
        "  {:>n$}  {:<12}  {:<8}  {:<width$}  detail",
        "#",
        "run_id",
        "state",
        "variables"
    );
    for (i, ((r, o), l)) in record.runs.iter().zip(&observed).zip(&labels).enumerate() {
        kernmlops::outln!(
            "  {:>n$}  {:<12}  {:<8}  {l:<width$}  {}",
            i + 1,
            r.run_id,
            o.state.as_str(),
            o.detail
        );
    }
    let stale = state::stale(dir, &record);
    if !stale.is_empty() {
        kernmlops::outln!(
            "{} collection(s) in runs/ are not in the plan (an earlier version of the experiment): {}",
            stale.len(),
            stale.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The first line of a report: the experiment, its folder, and its runs by
/// state (`experiment sweep in DIR: 12 runs: 10 done, 2 failed`).
fn print_header(record: &Record, dir: &ExpDir, counts: &[(state::RunState, usize)]) {
    let count_text: Vec<String> = counts
        .iter()
        .map(|(s, n)| format!("{n} {}", s.as_str()))
        .collect();
    kernmlops::outln!(
        "experiment {} in {}: {} runs: {}",
        record.name,
        dir.root.display(),
        record.runs.len(),
        count_text.join(", ")
    );
}
