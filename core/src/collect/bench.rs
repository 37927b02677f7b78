//! The benchmark of a run, from creation to its result: checked before
//! anything is collected, set up before the probes start, launched once
//! they are attached, polled, always killed, and asked for its own result,
//! which becomes `indicator.json` and the `performance_indicator` table.
//!
//! Every call into the benchmark's plugin is bounded by the plugin timeout
//! ([`super::bench_thread`]): a benchmark stuck in a call is given up, the
//! manifest's benchmark entry names the call, and the run stops on time
//! (its workload is stopped through the run's cgroup, as after a crash).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use kernmlops_plugin_api::BenchmarkStatus;

use super::{
    bench_thread::{Answer, BenchThread, Call, CallError},
    record::RunRecord,
    start_args, RunError, RunOptions,
};
use kernmlops_sys::clock;

use crate::{
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
    bench: BenchThread,
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
        let (plugin, _) = registry
            .find_benchmark(name)
            .map_err(|e| RunError::Selection(e.to_string()))?;
        let mut args = start_args(name, opts, &opts.benchmark_config);
        args.output_dir = dir.display().to_string().into();
        let refused = |e: CallError| {
            RunError::Benchmark(match e {
                CallError::Failed(e) | CallError::Hung(e) => format!("benchmark {name}: {e}"),
                CallError::GivenUp => format!("benchmark {name}: given up"),
            })
        };
        let mut bench = BenchThread::start(
            plugin.benchmark_starter(),
            name,
            args,
            opts.plugin_timeout(),
        )
        .map_err(refused)?;
        bench.call(Call::Configured).map_err(refused)?;
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
        let msg = match self.bench.call(Call::Setup) {
            Ok(_) => return Ok(()),
            Err(CallError::Failed(e)) => format!("benchmark {}: setup: {e}", self.name),
            Err(CallError::Hung(e)) => format!("benchmark {}: {e}", self.name),
            Err(CallError::GivenUp) => format!("benchmark {}: given up", self.name),
        };
        let _ = self.bench.call(Call::Kill);
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
        match self.bench.call(Call::Launch) {
            Ok(_) => true,
            Err(e) => {
                self.failed(record, "launch: ", e);
                false
            }
        }
    }

    /// Polls at most every [`POLL_EVERY`]; true once the benchmark has
    /// ended by itself, failed, or hung in its poll (recorded). A poll
    /// does not hold up the run: one that has not answered within a few
    /// milliseconds is looked at again on the next call, until it is
    /// overdue.
    pub fn ended(&mut self, record: &mut RunRecord) -> bool {
        if !self.bench.pending() {
            if self.last_poll.elapsed() < POLL_EVERY {
                return false;
            }
            self.last_poll = Instant::now();
            if let Err(e) = self.bench.begin(Call::Poll) {
                self.call_failed(record, e);
                return true;
            }
        }
        match self.bench.answer(Duration::from_millis(5)) {
            None => false,
            Some(answer) => self.polled(record, answer),
        }
    }

    /// Takes a poll's answer; true when the benchmark is over.
    fn polled(&mut self, record: &mut RunRecord, answer: Result<Answer, CallError>) -> bool {
        match answer {
            Ok(Answer::Status(BenchmarkStatus {
                finished: true,
                exit_code,
            })) => {
                self.exit_code = Some(exit_code);
                if let Some(entry) = record.benchmark() {
                    entry.exit_code = Some(exit_code);
                }
                true
            }
            Ok(_) => false,
            Err(e) => {
                self.failed(record, "", e);
                true
            }
        }
    }

    /// Records a failed call: one the benchmark refused (its message after
    /// `what`) printed now and as the benchmark's error, a hung one as
    /// [`Self::call_failed`] does.
    fn failed(&self, record: &mut RunRecord, what: &str, e: CallError) {
        let CallError::Failed(e) = e else {
            return self.call_failed(record, e);
        };
        let msg = format!("benchmark {}: {what}{e}", self.name);
        eprintln!("error: {msg}");
        if let Some(entry) = record.benchmark() {
            entry.error = Some(msg);
        }
    }

    /// Records a call that hung in the run's errors and as the benchmark's
    /// error, unless it already has one: then it is printed now, as the
    /// manifest's completion prints only the benchmark's error, so it is
    /// said once either way. Nothing for a benchmark given up before.
    fn call_failed(&self, record: &mut RunRecord, e: CallError) {
        let msg = match e {
            CallError::Hung(e) | CallError::Failed(e) => format!("benchmark {}: {e}", self.name),
            CallError::GivenUp => return,
        };
        match record.benchmark() {
            Some(entry) if entry.error.is_none() => entry.error = Some(msg.clone()),
            _ => eprintln!("error: {msg}"),
        }
        record.error(msg);
    }

    /// Kills whatever is left of the workload (always, whatever ended the
    /// run), then records its result: `indicator.json` and the
    /// `performance_indicator` table. Returns the result, when the
    /// benchmark was launched.
    /// `cgroup` is the benchmark's workload cgroup, whose totals are read
    /// once its processes are stopped.
    pub fn finish(
        mut self,
        record: &mut RunRecord,
        stopped_by: Option<StopReason>,
        collection_id: &str,
        cgroup: Option<&std::path::Path>,
    ) -> Option<RunFigures> {
        // A poll still in flight answers first: the benchmark may have
        // ended by itself meanwhile.
        if self.bench.pending() {
            let answer = self.bench.wait();
            self.polled(record, answer);
        }
        match self.bench.call(Call::Kill) {
            Ok(_) => {}
            Err(CallError::Failed(e)) => {
                let msg = format!("benchmark {}: stopping: {e}", self.name);
                eprintln!("error: {msg}");
                record.error(msg);
            }
            Err(e) => self.call_failed(record, e),
        }
        let end_uptime_us = clock::uptime_us();
        if let Some(entry) = record.benchmark() {
            entry.end_uptime_us = Some(end_uptime_us);
            if entry.exit_code.is_none() && entry.error.is_none() {
                entry.stopped_by = stopped_by;
            }
        }
        let Some((launched_at, rusage_before)) = self.launched.take() else {
            self.release(record);
            return None;
        };
        let mut figures = self.figures(launched_at, rusage_before, end_uptime_us, record);
        figures.cgroup = cgroup.map(indicator::CgroupTotals::read);
        self.release(record);
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

    /// Lets the benchmark's thread drop it, within the plugin timeout.
    fn release(&mut self, record: &mut RunRecord) {
        if let Err(e) = self.bench.release() {
            self.call_failed(record, e);
        }
    }

    /// The benchmark's result with the runner's figures. A result that is
    /// not a valid indicator fails the run when the benchmark ended by
    /// itself (it should have reported one); when the host stopped it, the
    /// reason is only noted.
    fn figures(
        &mut self,
        launched_at: Instant,
        rusage_before: Rusage,
        end_uptime_us: u64,
        record: &mut RunRecord,
    ) -> RunFigures {
        let wall_time_s = launched_at.elapsed().as_secs_f64();
        let rusage = Rusage::children().since(rusage_before);
        let reported = match self.bench.call(Call::Result) {
            Ok(Answer::Text(text)) if text.trim().is_empty() => {
                Ok(Indicator::new(&self.name, &self.name))
            }
            Ok(Answer::Text(text)) => {
                Indicator::parse(&text).map_err(|e| format!("not a performance indicator: {e}"))
            }
            Ok(_) => Ok(Indicator::new(&self.name, &self.name)),
            Err(CallError::Failed(e)) => Err(e),
            Err(e) => {
                let msg = match &e {
                    CallError::Hung(m) => format!("benchmark {}: result: {m}", self.name),
                    _ => format!("benchmark {}: result: given up", self.name),
                };
                self.call_failed(record, e);
                return RunFigures {
                    indicator: Indicator::new(&self.name, &self.name),
                    error: Some(msg),
                    exit_code: self.exit_code,
                    wall_time_s,
                    rusage,
                    cgroup: None,
                    end_uptime_us,
                };
            }
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
                (Indicator::new(&self.name, &self.name), Some(msg))
            }
        };
        RunFigures {
            indicator,
            error,
            exit_code: self.exit_code,
            wall_time_s,
            rusage,
            cgroup: None,
            end_uptime_us,
        }
    }
}
