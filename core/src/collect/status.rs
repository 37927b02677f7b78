//! The live status line of a run on a terminal: elapsed time, rows per
//! table, row rate and lost events, redrawn twice a second; silent when
//! stderr is not a terminal, so logs and pipes stay clean.

use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use super::drain::RunningProbe;

pub(super) struct StatusLine {
    enabled: bool,
    shown: bool,
    last: Instant,
    last_rows: u64,
}

impl StatusLine {
    pub(super) fn new() -> Self {
        // SAFETY: isatty only inspects the descriptor.
        let enabled = unsafe { libc::isatty(2) } == 1;
        Self {
            enabled,
            shown: false,
            last: Instant::now(),
            last_rows: 0,
        }
    }

    pub(super) fn update(&mut self, elapsed: Duration, running: &[RunningProbe]) {
        if !self.enabled || self.last.elapsed() < Duration::from_millis(500) {
            return;
        }
        let mut rows = 0;
        let mut lost = 0;
        let mut parts = Vec::new();
        for r in running {
            for (t, c) in r.tables.iter().zip(&r.counters) {
                let n = c.rows.load(Ordering::Relaxed);
                rows += n;
                lost += c.lost.load(Ordering::Relaxed);
                parts.push(format!("{t} {n}"));
            }
        }
        let rate = (rows.saturating_sub(self.last_rows)) as f64 / self.last.elapsed().as_secs_f64();
        self.last = Instant::now();
        self.last_rows = rows;
        let mut line = format!(
            "{:>7.1}s  {:>9.0} rows/s  lost {lost}  |  {}",
            elapsed.as_secs_f64(),
            rate,
            parts.join("  ")
        );
        // Keep to one terminal line.
        let width = terminal_width();
        if line.chars().count() >= width {
            line = line
                .chars()
                .take(width.saturating_sub(2))
                .collect::<String>()
                + "…";
        }
        eprint!("\r\x1b[2K{line}");
        self.shown = true;
    }

    pub(super) fn clear(&mut self) {
        if self.shown {
            eprint!("\r\x1b[2K");
            self.shown = false;
        }
    }
}

/// Columns of the terminal on stderr, 80 when unknown.
fn terminal_width() -> usize {
    // SAFETY: winsize is plain old data, filled by the ioctl.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes a winsize into a valid pointer.
    let rc = unsafe { libc::ioctl(2, libc::TIOCGWINSZ, &mut ws) };
    if rc == 0 && ws.ws_col > 0 {
        usize::from(ws.ws_col)
    } else {
        80
    }
}
