//! The one clock of kernmlops: `CLOCK_BOOTTIME` in microseconds, the same
//! clock BPF programs read with `bpf_ktime_get_boot_ns()`. Every table's
//! `ts_uptime_us` is on it. Wall-clock time (`unix_us`, `rfc3339`) appears
//! only in metadata (manifest, system_info).

use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since boot, including time suspended (`CLOCK_BOOTTIME`).
///
/// `clock_gettime(CLOCK_BOOTTIME)` cannot fail on Linux: its only errors
/// are `EFAULT` (a bad pointer; ours is a local) and `EINVAL` (an unknown
/// clock; Linux has had `CLOCK_BOOTTIME` since 2.6.39, and BPF, which
/// kernmlops needs, came later). So this returns the value and has no error
/// path; should a kernel ever break that promise, it panics with the errno
/// rather than put a made-up timestamp in a dataset.
pub fn uptime_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec that outlives the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    assert!(
        rc == 0,
        "clock_gettime(CLOCK_BOOTTIME) failed: {}",
        std::io::Error::last_os_error()
    );
    // Time since boot is never negative, and tv_nsec is below 10^9.
    (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1_000
}

/// Microseconds since the Unix epoch (wall clock); negative before 1970.
pub fn unix_us() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_micros()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_micros())
            .map(|us| -us)
            .unwrap_or(i64::MIN),
    }
}

/// Formats Unix microseconds as RFC 3339 UTC, e.g. `2026-11-21T05:12:33.123456Z`.
pub fn rfc3339(unix_us: i64) -> String {
    let secs = unix_us.div_euclid(1_000_000);
    let micros = unix_us.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Compact UTC stamp for identifiers, e.g. `20261121-051233`.
pub fn compact_stamp(unix_us: i64) -> String {
    let secs = unix_us.div_euclid(1_000_000);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        for (us, rfc, compact) in [
            (0, "1970-01-01T00:00:00.000000Z", "19700101-000000"),
            (
                951_782_400_000_001,
                "2000-02-29T00:00:00.000001Z",
                "20000229-000000",
            ),
            (
                1_795_237_953_000_000,
                "2026-11-21T05:12:33.000000Z",
                "20261121-051233",
            ),
            (-1, "1969-12-31T23:59:59.999999Z", "19691231-235959"),
        ] {
            assert_eq!(rfc3339(us), rfc, "rfc3339({us})");
            assert_eq!(compact_stamp(us), compact, "compact_stamp({us})");
        }
    }

    #[test]
    fn uptime_is_monotonic_and_nonzero() {
        let a = uptime_us();
        let b = uptime_us();
        assert!(a > 0 && b >= a, "uptime went from {a} to {b}");
    }

    /// /proc/uptime's first field is CLOCK_BOOTTIME in seconds with two
    /// decimals, so the two agree to well within a second.
    #[test]
    fn uptime_matches_proc_uptime() {
        let before = uptime_us();
        let text = std::fs::read_to_string("/proc/uptime").expect("reading /proc/uptime");
        let after = uptime_us();
        let secs: f64 = text
            .split_whitespace()
            .next()
            .and_then(|f| f.parse().ok())
            .unwrap_or_else(|| panic!("/proc/uptime is not `<secs> <idle>`: {text:?}"));
        let proc_us = (secs * 1e6) as u64;
        assert!(
            proc_us + 1_000_000 >= before && proc_us <= after + 1_000_000,
            "/proc/uptime says {proc_us} us, uptime_us said {before}..{after}"
        );
    }

    #[test]
    fn unix_time_is_now() {
        // 2024-01-01 and 2100-01-01: a sanity range, not a clock check.
        let now = unix_us();
        assert!(
            (1_704_067_200_000_000..4_102_444_800_000_000).contains(&now),
            "{now}"
        );
    }
}
