//! A benchmark's plugin calls, made on a thread of its own and each bounded
//! by the plugin timeout (`collect.plugin_timeout`), so a benchmark stuck in
//! a call cannot stall the run: the call is given up once it is overdue,
//! every later call is refused at once, and the thread is left behind,
//! never joined (the process's exit ends it).
//!
//! The thread creates the benchmark (the plugin's constructor is a call
//! like the others), then makes one call at a time as the host asks; the
//! benchmark is dropped on it when the host is done with it. A `poll` can
//! be left in flight ([`BenchThread::begin`], [`BenchThread::answer`]), so
//! the run's loop goes on while the benchmark answers.

use std::{
    sync::mpsc::{self, Receiver, RecvTimeoutError, Sender},
    thread,
    time::{Duration, Instant},
};

use abi_stable::std_types::RResult;
use kernmlops_plugin_api::{BenchmarkBox, BenchmarkStatus, StartArgs};

use crate::plugin::BenchmarkStarter;

/// A call into a benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Call {
    /// Creating it (the plugin's `new_benchmark`).
    Start,
    Configured,
    Setup,
    Launch,
    Poll,
    Kill,
    Result,
    /// Dropping it.
    Release,
}

impl Call {
    /// The call's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Configured => "is_configured",
            Self::Setup => "setup",
            Self::Launch => "launch",
            Self::Poll => "poll",
            Self::Kill => "kill",
            Self::Result => "result",
            Self::Release => "release",
        }
    }
}

/// What a call returned.
#[derive(Debug)]
pub(super) enum Answer {
    Done,
    Status(BenchmarkStatus),
    Text(String),
}

/// Why a call gave no answer.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum CallError {
    /// The benchmark returned this error.
    Failed(String),
    /// The call did not return within the plugin timeout; the benchmark is
    /// given up. The line says which call, for how long, and the limit.
    Hung(String),
    /// An earlier call hung: nothing was asked.
    GivenUp,
}

/// The benchmark's thread, seen from the host.
pub(super) struct BenchThread {
    /// `None` once the host let the thread go.
    jobs: Option<Sender<Call>>,
    answers: Receiver<Result<Answer, String>>,
    limit: Duration,
    /// The call in flight and when it began.
    pending: Option<(Call, Instant)>,
    given_up: bool,
}

/// "hung: its poll call has not returned in 5.0 s (limit ...)".
pub(super) fn hung_message(call: Call, running_for: Duration, limit: Duration) -> String {
    format!(
        "hung: its {} call has not returned in {:.1} s (limit collect.plugin_timeout = {}); the benchmark was given up",
        call.name(),
        running_for.as_secs_f64(),
        kernmlops_sys::duration::format_duration(limit),
    )
}

impl BenchThread {
    /// Starts the thread and creates the benchmark `name` on it, waiting at
    /// most `limit`.
    pub fn start(
        starter: BenchmarkStarter,
        name: &str,
        args: StartArgs,
        limit: Duration,
    ) -> Result<Self, CallError> {
        let (jobs, calls) = mpsc::channel::<Call>();
        let (answer, answers) = mpsc::channel();
        let bench_name = name.to_owned();
        thread::Builder::new()
            .name(format!("kml-bench-{name}"))
            .spawn(move || {
                let mut bench = match starter.start_benchmark(&bench_name, &args) {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = answer.send(Err(e.to_string()));
                        return;
                    }
                };
                if answer.send(Ok(Answer::Done)).is_err() {
                    return;
                }
                for call in calls {
                    if answer.send(serve(&mut bench, call)).is_err() {
                        return;
                    }
                }
                // The host let it go: dropped here, then the channel
                // closes, which is what `release` waits for.
                drop(bench);
            })
            .map_err(|e| CallError::Failed(format!("starting its thread: {e}")))?;
        let mut t = Self {
            jobs: Some(jobs),
            answers,
            limit,
            pending: Some((Call::Start, Instant::now())),
            given_up: false,
        };
        t.wait().map(|_| t)
    }

    /// Whether a call is in flight.
    pub fn pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Makes `call` and waits for its answer, within the plugin timeout. A
    /// call still in flight is waited for first (its answer is dropped).
    pub fn call(&mut self, call: Call) -> Result<Answer, CallError> {
        if self.pending.is_some() {
            self.wait()?;
        }
        self.begin(call)?;
        self.wait()
    }

    /// Sends `call` without waiting; its answer comes from
    /// [`Self::answer`] or [`Self::wait`].
    pub fn begin(&mut self, call: Call) -> Result<(), CallError> {
        if self.given_up {
            return Err(CallError::GivenUp);
        }
        debug_assert!(self.pending.is_none(), "one call at a time");
        let sent = self.jobs.as_ref().is_some_and(|j| j.send(call).is_ok());
        if !sent {
            // The thread ended: only a panic that escaped the plugin's
            // guard does that.
            self.given_up = true;
            return Err(CallError::Failed(format!(
                "its thread ended before the {} call",
                call.name()
            )));
        }
        self.pending = Some((call, Instant::now()));
        Ok(())
    }

    /// The answer of the call in flight if it comes within `wait`; its
    /// hang once it is overdue; `None` while it may still answer (or when
    /// no call is in flight).
    pub fn answer(&mut self, wait: Duration) -> Option<Result<Answer, CallError>> {
        let (call, began) = self.pending?;
        let due = began + self.limit;
        let wait = wait.min(due.saturating_duration_since(Instant::now()));
        match self.answers.recv_timeout(wait) {
            Ok(a) => {
                self.pending = None;
                Some(a.map_err(CallError::Failed))
            }
            Err(RecvTimeoutError::Timeout) if Instant::now() < due => None,
            Err(RecvTimeoutError::Timeout) => Some(Err(self.give_up(call, began))),
            Err(RecvTimeoutError::Disconnected) => {
                self.pending = None;
                self.given_up = true;
                Some(Err(CallError::Failed(format!(
                    "its thread ended during the {} call",
                    call.name()
                ))))
            }
        }
    }

    /// Waits for the answer of the call in flight, at most until it is
    /// overdue.
    pub fn wait(&mut self) -> Result<Answer, CallError> {
        loop {
            match self.answer(self.limit) {
                Some(a) => return a,
                None if self.pending.is_none() => return Ok(Answer::Done),
                None => {}
            }
        }
    }

    /// Lets the thread drop the benchmark and waits until it has, within
    /// the plugin timeout. Nothing is waited for once the benchmark was
    /// given up.
    pub fn release(&mut self) -> Result<(), CallError> {
        if self.given_up {
            return Err(CallError::GivenUp);
        }
        if self.pending.is_some() {
            self.wait()?;
        }
        if self.jobs.take().is_none() {
            return Ok(());
        }
        let began = Instant::now();
        loop {
            let left = (began + self.limit).saturating_duration_since(Instant::now());
            match self.answers.recv_timeout(left) {
                // Nothing is asked any more: an answer is stale.
                Ok(_) => continue,
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
                Err(RecvTimeoutError::Timeout) => {
                    return Err(self.give_up(Call::Release, began));
                }
            }
        }
    }

    fn give_up(&mut self, call: Call, began: Instant) -> CallError {
        self.given_up = true;
        self.pending = None;
        CallError::Hung(hung_message(call, began.elapsed(), self.limit))
    }
}

impl Drop for BenchThread {
    /// Frees the benchmark as dropping it in place did, bounded like any
    /// call; a hang here has nobody left to report to.
    fn drop(&mut self) {
        let _ = self.release();
    }
}

/// Makes one call on the benchmark's thread.
fn serve(bench: &mut BenchmarkBox, call: Call) -> Result<Answer, String> {
    let unit = |r: RResult<(), _>| r.into_result().map(|()| Answer::Done);
    match call {
        Call::Start | Call::Release => Ok(Answer::Done),
        Call::Configured => unit(bench.is_configured()),
        Call::Setup => unit(bench.setup()),
        Call::Launch => unit(bench.launch()),
        Call::Poll => bench.poll().into_result().map(Answer::Status),
        Call::Kill => unit(bench.kill()),
        Call::Result => bench.result().into_result().map(|t| Answer::Text(t.into())),
    }
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_call_its_time_and_the_limit() {
        let line = hung_message(
            Call::Poll,
            Duration::from_millis(5040),
            Duration::from_secs(5),
        );
        assert!(
            line.starts_with(
                "hung: its poll call has not returned in 5.0 s (limit collect.plugin_timeout = 5s)"
            ),
            "{line}"
        );
    }
}
