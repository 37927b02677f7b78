//! Progress of an experiment on stderr: on a terminal, one status line
//! redrawn in place (runs done / total, the current run's variables,
//! elapsed and estimated remaining time, failures so far) above which each
//! finished run gets a line; when piped, plain lines only.

use std::{
    io::{IsTerminal, Write},
    time::{Duration, Instant},
};

use super::{
    executor::{RunObserver, RunOutcome},
    plan::{label, PlannedRun},
    spec::Variable,
    state::RunState,
};

/// `m:ss`, or `h:mm:ss` from an hour.
pub fn clock(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

/// The progress display.
pub struct Progress {
    variables: Vec<Variable>,
    tty: bool,
    start: Instant,
    durations: Vec<f64>,
    failed: usize,
    done: usize,
    total: usize,
    current: Option<(String, Instant)>,
    last_draw: Option<Instant>,
}

impl Progress {
    /// A display for runs with these variables; a status line only when
    /// stderr is a terminal.
    pub fn new(variables: &[Variable]) -> Self {
        Self {
            variables: variables.to_vec(),
            tty: std::io::stderr().is_terminal(),
            start: Instant::now(),
            durations: Vec::new(),
            failed: 0,
            done: 0,
            total: 0,
            current: None,
            last_draw: None,
        }
    }

    /// Failures so far.
    pub fn failed(&self) -> usize {
        self.failed
    }

    /// Estimated time left: the mean run time so far times the runs left,
    /// less what the current run has had.
    fn remaining(&self, total: usize) -> Option<Duration> {
        if self.durations.is_empty() {
            return None;
        }
        let mean = self.durations.iter().sum::<f64>() / self.durations.len() as f64;
        let left = total.saturating_sub(self.done) as f64 * mean;
        let in_current = self
            .current
            .as_ref()
            .map_or(0.0, |c| c.1.elapsed().as_secs_f64().min(mean));
        Some(Duration::from_secs_f64((left - in_current).max(0.0)))
    }

    fn status(&self, total: usize) -> String {
        let what = self
            .current
            .as_ref()
            .map_or(String::new(), |c| format!(" | running {}", c.0));
        format!(
            "{}/{total} done{what} | {} elapsed, {} left | {} failed",
            self.done,
            clock(self.start.elapsed()),
            self.remaining(total)
                .map_or("?".into(), |d| format!("~{}", clock(d))),
            self.failed
        )
    }

    fn draw(&mut self) {
        if self.total == 0 {
            return;
        }
        let mut line = self.status(self.total);
        let width = terminal_width();
        if line.chars().count() >= width {
            line = line.chars().take(width.saturating_sub(1)).collect();
        }
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
        self.last_draw = Some(Instant::now());
    }

    /// Prints a line, above the status line on a terminal.
    fn line(&mut self, text: &str) {
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[2K");
        }
        let _ = writeln!(err, "{text}");
        drop(err);
        if self.tty {
            self.draw();
        }
    }

    /// Clears the status line (at the end).
    pub fn finish(&mut self) {
        if self.tty && self.last_draw.is_some() {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
        self.current = None;
        self.total = 0;
    }
}

fn terminal_width() -> usize {
    // SAFETY: TIOCGWINSZ fills a winsize; on failure it stays zeroed.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor number and a writable winsize.
    let rc = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut ws) };
    if rc == 0 && ws.ws_col > 0 {
        usize::from(ws.ws_col)
    } else {
        100
    }
}

impl RunObserver for Progress {
    fn started(&mut self, index: usize, total: usize, run: &PlannedRun) {
        let what = label(&self.variables, &run.variables);
        let what = if what.is_empty() {
            format!("repeat {}", run.repeat)
        } else {
            format!("{what} #{}", run.repeat)
        };
        self.total = total;
        self.current = Some((what.clone(), Instant::now()));
        if self.tty {
            self.draw();
        } else {
            eprintln!("[{}/{total}] run {} {what}", index + 1, run.run_id);
        }
    }

    fn tick(&mut self) {
        if self.tty
            && self
                .last_draw
                .is_none_or(|t| t.elapsed() >= Duration::from_millis(250))
        {
            self.draw();
        }
    }

    fn finished(&mut self, index: usize, total: usize, run: &PlannedRun, outcome: &RunOutcome) {
        let what = self.current.take().map_or(String::new(), |c| c.0);
        self.done += 1;
        if let Some(s) = outcome.seconds {
            self.durations.push(s);
        }
        let o = &outcome.observed;
        if matches!(o.state, RunState::Failed | RunState::CutOff) && outcome.skipped.is_none() {
            self.failed += 1;
        }
        let how = match (&outcome.skipped, outcome.seconds) {
            (Some(why), _) => format!("skipped: {why}"),
            (None, Some(s)) if o.detail.is_empty() => format!("{} in {s:.1} s", o.state.as_str()),
            (None, Some(s)) => format!("{} ({}) in {s:.1} s", o.state.as_str(), o.detail),
            (None, None) => o.state.as_str().to_owned(),
        };
        let mut text = format!("[{}/{total}] {} {what}: {how}", index + 1, run.run_id);
        if !self.tty {
            text.push_str(&format!(
                " | {} elapsed, {} left | {} failed",
                clock(self.start.elapsed()),
                self.remaining(total)
                    .map_or("?".into(), |d| format!("~{}", clock(d))),
                self.failed
            ));
        }
        self.line(&text);
    }

    fn note(&mut self, text: &str) {
        self.line(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_formats_minutes_and_hours() {
        assert_eq!(clock(Duration::from_secs(0)), "0:00");
        assert_eq!(clock(Duration::from_secs(75)), "1:15");
        assert_eq!(clock(Duration::from_secs(3725)), "1:02:05");
    }
}
