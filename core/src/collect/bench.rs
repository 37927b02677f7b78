//! The benchmark of a run, from creation to its result: checked before
//! anything is collected, set up before the probes start, launched once
//! they are attached, polled, always killed, and asked for its own result,
//! which becomes `indicator.json` and the `performance_indicator` table.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use abi_stable::std_types::RResult;
use kernmlops_plugin_api::BenchmarkBox;

use super::{record::RunRecord, start_args, RunError, RunOptions};
use crate::{
    clock,
    indicator::{self, Indicator, RunFigures, Rusage},
    manifest::StopReason,
    plugin::Registry,
    sink,
};

/// How often a running benchmark is polled.
pub(super) const POLL_EVERY: Duration = Duration::from_millis(100);

pub(super) struct BenchmarkRun {
    pub name: String,
    pub plugin: String,
    bench: BenchmarkBox,
    launched: Option<(Instant, Rusage)>,
    last_poll: Instant,
    /// Set once the benchmark ended by itself.
    pub exit_code: Option<i32>,
}

impl BenchmarkRun {
    /// Creates the run's benchmark with its settings and checks that it can
    /// run, before anything is collected.
    pub fn create(
        registry: &Registry,
        opts: &RunOptions,
        dir: &Path,
    ) -> Result<Option<Self>, RunError> {
        let Some(name) = &opts.benchmark else {
            return Ok(None);
        };
        let (plugin, _) = registry.find_benchmark(name).map_err(RunError::Selection)?;
        let mut args = start_args(name, opts, &opts.benchmark_config);
        args.output_dir = dir.display().to_string().into();
        let bench = plugin
            .start_benchmark(name, &args)
            .map_err(|e| RunError::Benchmark(format!("benchmark {name}: {e}")))?;
        if let RResult::RErr(e) = bench.is_configured() {
            return Err(RunError::Benchmark(format!("benchmark {name}: {e}")));
        }
        Ok(Some(Self {
            name: name.clone(),
            plugin: plugin.name().to_owned(),
            bench,
            launched: None,
            last_poll: Instant::now(),
            exit_code: None,
        }))
    }

    /// Prepares the machine; on failure the benchmark is killed and the
    /// run ends failed before any probe starts.
    pub fn setup(&mut self, record: &mut RunRecord) -> Result<(), RunError> {
        eprintln!("setting up benchmark {}", self.name);
        let RResult::RErr(e) = self.bench.setup() else {
            return Ok(());
        };
        let _ = self.bench.kill();
        let msg = format!("benchmark {}: setup: {e}", self.name);
        if let Some(entry) = record.benchmark() {
            entry.error = Some(msg.clone());
        }
        record.fail_early()?;
        Err(RunError::Benchmark(msg))
    }

    /// Starts the workload; false when it could not start (recorded).
    pub fn launch(&mut self, record: &mut RunRecord) -> bool {
        if let Some(entry) = record.benchmark() {
            entry.start_uptime_us = Some(clock::uptime_us());
        }
        self.launched = Some((Instant::now(), Rusage::children()));
        if let RResult::RErr(e) = self.bench.launch() {
            let msg = format!("benchmark {}: launch: {e}", self.name);
            eprintln!("error: {msg}");
            if let Some(entry) = record.benchmark() {
                entry.error = Some(msg);
            }
            return false;
        }
        true
    }

    /// Polls at most every [`POLL_EVERY`]; true once the benchmark has
    /// ended by itself or failed (recorded).
    pub fn ended(&mut self, record: &mut RunRecord) -> bool {
        if self.last_poll.elapsed() < POLL_EVERY {
            return false;
        }
        self.last_poll = Instant::now();
        match self.bench.poll() {
            RResult::ROk(st) if st.finished => {
                self.exit_code = Some(st.exit_code);
                if let Some(entry) = record.benchmark() {
                    entry.exit_code = Some(st.exit_code);
                }
                true
            }
            RResult::ROk(_) => false,
            RResult::RErr(e) => {
                let msg = format!("benchmark {}: {e}", self.name);
                eprintln!("error: {msg}");
                if let Some(entry) = record.benchmark() {
                    entry.error = Some(msg);
                }
                true
            }
        }
    }

    /// Kills whatever is left of the workload (always, whatever ended the
    /// run), then records its result: `indicator.json` and the
    /// `performance_indicator` table. Returns the result, when the
    /// benchmark was launched.
    pub fn finish(
        mut self,
        record: &mut RunRecord,
        stopped_by: Option<StopReason>,
        collection_id: &str,
    ) -> Option<RunFigures> {
        if let RResult::RErr(e) = self.bench.kill() {
            let msg = format!("benchmark {}: stopping: {e}", self.name);
            eprintln!("error: {msg}");
            record.error(msg);
        }
        let end_uptime_us = clock::uptime_us();
        if let Some(entry) = record.benchmark() {
            entry.end_uptime_us = Some(end_uptime_us);
            if entry.exit_code.is_none() && entry.error.is_none() {
                entry.stopped_by = stopped_by;
            }
        }
        let (launched_at, rusage_before) = self.launched.take()?;
        let figures = self.figures(launched_at, rusage_before, end_uptime_us, record);
        if let Err(e) = figures.write(&record.dir) {
            record.error(format!(
                "writing {}: {e}",
                record.dir.join(indicator::FILE).display()
            ));
        }
        let table = record.dir.join(format!("{}.arrow", indicator::TABLE));
        match figures
            .to_batch(collection_id)
            .map_err(|e| e.to_string())
            .and_then(|b| sink::write_table(&table, &b).map_err(|e| e.to_string()))
        {
            Ok(()) => record.host_table(indicator::TABLE, 1),
            Err(e) => record.error(format!("writing {}: {e}", table.display())),
        }
        Some(figures)
    }

    /// The benchmark's result with the runner's figures. A result that is
    /// not a valid indicator fails the run when the benchmark ended by
    /// itself (it should have reported one); when the host stopped it, the
    /// reason is only noted.
    fn figures(
        &self,
        launched_at: Instant,
        rusage_before: Rusage,
        end_uptime_us: u64,
        record: &mut RunRecord,
    ) -> RunFigures {
        let wall_time_s = launched_at.elapsed().as_secs_f64();
        let rusage = Rusage::children().since(rusage_before);
        let reported = match self.bench.result() {
            RResult::ROk(text) if text.trim().is_empty() => Ok(Indicator::empty(&self.name)),
            RResult::ROk(text) => Indicator::parse(&text, &self.name).map_err(|e| e.to_string()),
            RResult::RErr(e) => Err(e.to_string()),
        };
        let (indicator, error) = match reported {
            Ok(i) => (i, None),
            Err(e) => {
                let msg = format!("benchmark {}: result: {e}", self.name);
                if self.exit_code.is_some() {
                    eprintln!("error: {msg}");
                    if let Some(entry) = record.benchmark() {
                        entry.error.get_or_insert(msg.clone());
                    }
                } else {
                    eprintln!("warning: {msg}");
                }
                (Indicator::empty(&self.name), Some(msg))
            }
        };
        RunFigures {
            indicator,
            error,
            exit_code: self.exit_code,
            wall_time_s,
            rusage,
            end_uptime_us,
        }
    }
}
