//! Adaptive repeats: one more run for each variable combination whose
//! confidence interval is still wider than the target, round after round.

use std::sync::atomic::Ordering;

use kernmlops_sys::clock;

use crate::{
    commands::{
        carry_out, observe, write_run_config, CommonOptions, DEFAULT_MAX_REPEATS, DEFAULT_TARGET,
    },
    executor::{Executor, RunContext, RunObserver},
    plan::PlannedRun,
    progress::Progress,
    record::{Adaptive, ExpDir, Record},
    results::{self, Results},
    spec::{self, Order},
    stats, ExperimentError, Result,
};

pub(crate) fn settings(common: &CommonOptions, repeats: u32) -> Result<Option<Adaptive>> {
    if !common.adaptive {
        return Ok(None);
    }
    let metric = common.metric.clone().unwrap_or_default();
    let metric = metric.strip_prefix("result_").unwrap_or(&metric).to_owned();
    let target = common.target.unwrap_or(DEFAULT_TARGET);
    if !(target > 0.0 && target.is_finite()) {
        return Err(ExperimentError::Usage(format!(
            "--target {target}: must be a positive fraction such as 0.05"
        )));
    }
    let max_repeats = common
        .max_repeats
        .unwrap_or(DEFAULT_MAX_REPEATS.max(repeats));
    if max_repeats < 2 {
        return Err(ExperimentError::Usage(
            "--max-repeats: at least 2 (an interval needs two runs)".into(),
        ));
    }
    if max_repeats > spec::MAX_REPEATS {
        return Err(ExperimentError::Usage(format!(
            "--max-repeats {max_repeats}: at most {}",
            spec::MAX_REPEATS
        )));
    }
    Ok(Some(Adaptive {
        metric,
        target,
        max_repeats,
    }))
}

/// Adds and carries out repeats, round after round, until no combination's
/// interval of `a.metric` is wider than `a.target`, every combination has
/// `a.max_repeats` runs, or a signal stops it. The job id and run count
/// when a scheduler took a round: the rounds after it go on at `resume`.
pub(crate) fn repeat(
    dir: &ExpDir,
    record: &mut Record,
    a: &Adaptive,
    executor: &mut dyn Executor,
    ctx: &RunContext,
    progress: &mut Progress,
) -> Result<Option<(String, usize)>> {
    let mut round = 0u64;
    while !ctx.stop.load(Ordering::Relaxed) {
        let observed = observe(dir, record).1;
        let results = Results::collect(dir, record, &observed);
        let column = format!("result_{}", a.metric);
        if results.rows > 0 && results.column(&column).is_none() {
            progress.finish();
            // Not kept for resume: the setting is wrong, not pending.
            record.adaptive = None;
            results.write(dir)?;
            record.write(dir)?;
            return Err(ExperimentError::Usage(format!(
                "--metric {}: no run reported @result.{} (reported: {}); the runs so far are done and in the results",
                a.metric,
                a.metric,
                results.result_keys().join(", ")
            )));
        }
        let mut extra = next_round(record, &results, a, &column);
        if extra.is_empty() {
            break;
        }
        round += 1;
        if record.order == Order::Shuffled {
            crate::rng::shuffle(&mut extra, record.seed ^ round.wrapping_mul(0x9E37_79B9));
        }
        progress.note(&format!(
            "adaptive round {round}: {} combination(s) above ±{:.1}% on {}",
            extra.len(),
            a.target * 100.0,
            a.metric
        ));
        for r in &extra {
            write_run_config(dir, r)?;
        }
        record.runs.extend(extra.iter().cloned());
        record.updated_utc = clock::rfc3339(clock::unix_us());
        record.write(dir)?;
        let dispatched = carry_out(dir, executor, ctx, &extra, progress)?;
        if dispatched.is_some() {
            return Ok(dispatched);
        }
    }
    Ok(None)
}

/// One more repeat of each combination whose interval is still too wide
/// and that has fewer than `a.max_repeats` runs.
fn next_round(record: &Record, results: &Results, a: &Adaptive, column: &str) -> Vec<PlannedRun> {
    let mut extra = Vec::new();
    for (combo_id, rows) in results::groups(results) {
        let planned: Vec<&PlannedRun> = record
            .runs
            .iter()
            .filter(|r| r.combo_id == combo_id)
            .collect();
        let values = results::values(results, column, &rows);
        if planned.len() < a.max_repeats as usize
            && stats::needs_more(&values, a.target, usize::MAX)
        {
            let next = planned.iter().map(|r| r.repeat).max().unwrap_or(0) + 1;
            extra.push(planned[0].another_repeat(&record.identity, next, record.seed));
        }
    }
    extra
}
