//! Start-up timings, for finding what a run waits on before it collects:
//! with `KERNMLOPS_STARTUP_TIMES` set, each step of the way from the
//! command's start to the "collecting" line prints one line on standard
//! error, `startup: <step> at <wall> ms wall, <cpu> ms cpu`, times since
//! the first step (the process's CPU time counts every thread), and each
//! probe's start its own wall and thread CPU time. Unset, nothing is
//! measured or printed. The `footprint` benchmark reads these lines.
//!
//! Also what a run starts early so it need not wait for it later: the
//! description of the machine ([`describe_system_early`]), made on a thread
//! of its own while the plugins load.

use std::{
    sync::{Mutex, OnceLock},
    thread::JoinHandle,
    time::Instant,
};

use crate::system_info::SystemInfo;

/// The machine's description being made by [`describe_system_early`].
static EARLY_SYSTEM_INFO: Mutex<Option<JoinHandle<SystemInfo>>> = Mutex::new(None);

/// Starts describing the machine ([`SystemInfo::gather`]) on a thread of
/// its own, for the next run of this process to take instead of waiting
/// for it (once; later calls do nothing while one is pending).
pub fn describe_system_early() {
    let Ok(mut pending) = EARLY_SYSTEM_INFO.lock() else {
        return;
    };
    if pending.is_none() {
        *pending = std::thread::Builder::new()
            .name("kml-system-info".into())
            .spawn(SystemInfo::gather)
            .ok();
    }
}

/// The machine's description: the one [`describe_system_early`] started,
/// when `early_is_current` (nothing the run changed on the machine since,
/// such as kernel knobs), else one made now.
pub(crate) fn system_info(early_is_current: bool) -> SystemInfo {
    let pending = EARLY_SYSTEM_INFO.lock().ok().and_then(|mut p| p.take());
    match pending.filter(|_| early_is_current).map(JoinHandle::join) {
        Some(Ok(sys)) => sys,
        _ => SystemInfo::gather(),
    }
}

/// Set (to anything) in the environment, start-up steps are timed.
pub const TIMES_ENV: &str = "KERNMLOPS_STARTUP_TIMES";

/// The prefix of every timing line.
pub const LINE_PREFIX: &str = "startup: ";

/// When timing is on: the first step's wall clock and process CPU time.
fn origin() -> Option<&'static (Instant, f64)> {
    static ORIGIN: OnceLock<Option<(Instant, f64)>> = OnceLock::new();
    ORIGIN
        .get_or_init(|| {
            std::env::var_os(TIMES_ENV).map(|_| (Instant::now(), cpu_ms(libc::RUSAGE_SELF)))
        })
        .as_ref()
}

/// Whether start-up steps are timed.
pub fn enabled() -> bool {
    origin().is_some()
}

/// User and system CPU time in milliseconds of this process (every
/// thread, `RUSAGE_SELF`) or of the calling thread (`RUSAGE_THREAD`).
pub fn cpu_ms(who: libc::c_int) -> f64 {
    // SAFETY: rusage is plain old data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return 0.0;
    }
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(ru.ru_utime) + ms(ru.ru_stime)
}

/// Marks the end of a start-up step (the first call starts the clock).
pub fn mark(step: &str) {
    let Some((t0, cpu0)) = origin() else {
        return;
    };
    let wall = t0.elapsed().as_secs_f64() * 1e3;
    let cpu = cpu_ms(libc::RUSAGE_SELF) - cpu0;
    eprintln!("{LINE_PREFIX}{step} at {wall:.1} ms wall, {cpu:.1} ms cpu");
}

/// Reports one probe's start: its wall time and its thread's CPU time.
pub fn probe_started(probe: &str, wall_ms: f64, thread_cpu_ms: f64) {
    if enabled() {
        eprintln!(
            "{LINE_PREFIX}probe {probe} started in {wall_ms:.1} ms wall, {thread_cpu_ms:.1} ms cpu"
        );
    }
}

/// A timing line parsed back: (step, wall ms, cpu ms). `None` for any
/// other line.
pub fn parse_line(line: &str) -> Option<(String, f64, f64)> {
    let rest = line.strip_prefix(LINE_PREFIX)?;
    let (step, times) = rest
        .rsplit_once(" at ")
        .or_else(|| rest.rsplit_once(" started in "))?;
    let (wall, cpu) = times.split_once(" ms wall, ")?;
    let cpu = cpu.trim_end().strip_suffix(" ms cpu")?;
    Some((step.to_owned(), wall.parse().ok()?, cpu.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_lines_parse_back() {
        assert_eq!(
            parse_line("startup: plugins loaded at 12.5 ms wall, 30.0 ms cpu"),
            Some(("plugins loaded".into(), 12.5, 30.0))
        );
        assert_eq!(
            parse_line("startup: probe trace started in 80.2 ms wall, 41.3 ms cpu\n"),
            Some(("probe trace".into(), 80.2, 41.3))
        );
        assert_eq!(parse_line("collecting quanta_runtime into x"), None);
    }
}
