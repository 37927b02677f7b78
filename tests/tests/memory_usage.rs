//! The memory_usage probe on the running kernel, checked against the test's
//! own reads of `/proc/meminfo` taken while it collects.

use std::{
    collections::HashMap,
    path::Path,
    time::{Duration, Instant},
};

use kernmlops_e2e::*;

const INTERVAL_MS: u64 = 100;

/// `/proc/meminfo` as field name -> (value, in kB).
fn meminfo() -> HashMap<String, (u64, bool)> {
    let text = std::fs::read_to_string("/proc/meminfo").expect("reading /proc/meminfo");
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let mut words = rest.split_whitespace();
            let value = words.next()?.parse().ok()?;
            Some((name.trim().to_owned(), (value, words.next() == Some("kB"))))
        })
        .collect()
}

fn write_config(dir: &Path, body: &str) -> String {
    let path = dir.join("kernmlops.toml");
    std::fs::write(&path, body).expect("writing config");
    path.to_str().expect("utf8").to_owned()
}

/// Collects at 100 ms while reading `/proc/meminfo` itself: constant fields
/// agree exactly, slowly moving ones within 3% at the nearest sample, and
/// there is one row per interval.
#[test]
fn root_memory_usage_agrees_with_proc_meminfo() {
    if !require_root("root_memory_usage_agrees_with_proc_meminfo") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("memusage", &[("memory_usage", "memory_usage")]);
    let output = temp_dir("memusage-out");
    let config = write_config(
        &temp_dir("memusage-config"),
        &format!("[probes.memory_usage]\ninterval = \"{INTERVAL_MS}ms\"\n"),
    );
    let t_begin = uptime_us();
    let c = Collector::start(&[
        "--config",
        &config,
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "memory_usage",
        "--output",
        output.to_str().expect("utf8"),
    ]);
    let t_started = uptime_us();
    let mut readings = Vec::new();
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(230));
        readings.push((uptime_us(), meminfo()));
    }
    let t_stop = uptime_us();
    let done = c.signal_and_wait(libc::SIGINT);
    let t_end = uptime_us();
    assert!(done.status.success(), "kernmlops failed:\n{}", done.stderr);
    let dir = done.dir.expect("collection folder printed");
    let batches = read_table(&dir.join("memory_usage.arrow"));

    // One column per field of this kernel's file.
    let fields = meminfo();
    let columns = batches[0].schema().fields().len();
    assert_eq!(
        columns,
        fields.len() + 2,
        "expected ts_uptime_us, collection_id and one column per /proc/meminfo field"
    );

    let ts = column_u64(&batches, "ts_uptime_us");
    assert!(
        ts.iter().all(|&t| t >= t_begin && t <= t_end),
        "timestamps outside the run [{t_begin}, {t_end}]: {ts:?}"
    );
    let window_ms = (t_stop - t_started) as f64 / 1e3;
    let expected = window_ms / INTERVAL_MS as f64;
    let rows = ts.len() as f64;
    eprintln!("{rows} rows in {window_ms:.0} ms (expected about {expected:.1})");
    assert!(
        (rows - expected).abs() <= 0.2 * expected + 1.0,
        "{rows} rows in {window_ms:.0} ms at {INTERVAL_MS} ms"
    );

    // Constant fields, in every row.
    let kb = |name: &str| fields.get(name).map(|&(v, _)| v);
    let mem_total = column_u64(&batches, "mem_total_bytes");
    let expected_total = kb("MemTotal").expect("MemTotal") * 1024;
    assert!(
        mem_total.iter().all(|&v| v == expected_total),
        "mem_total_bytes differs from MemTotal {expected_total} bytes"
    );
    if let Some(huge) = kb("HugePages_Total") {
        let col = column_u64(&batches, "hugepages_total");
        assert!(
            col.iter().all(|&v| v == huge),
            "hugepages_total is a count: expected {huge}, got {col:?}"
        );
        let size = kb("Hugepagesize").expect("Hugepagesize") * 1024;
        let col = column_u64(&batches, "hugepagesize_bytes");
        assert!(col.iter().all(|&v| v == size), "hugepagesize_bytes");
    }

    // Moving fields, at the sample nearest each reading.
    let free = column_u64(&batches, "mem_free_bytes");
    let available = column_u64(&batches, "mem_available_bytes");
    assert!(readings.len() >= 10, "only {} readings", readings.len());
    for (t, reading) in &readings {
        let (i, &row_ts) = ts
            .iter()
            .enumerate()
            .min_by_key(|(_, &r)| r.abs_diff(*t))
            .expect("rows");
        assert!(
            row_ts.abs_diff(*t) <= 2 * INTERVAL_MS * 1000,
            "no sample within two intervals of {t} (nearest {row_ts})"
        );
        for (column, field, values) in [
            ("mem_free_bytes", "MemFree", &free),
            ("mem_available_bytes", "MemAvailable", &available),
        ] {
            let want = reading[field].0 * 1024;
            let got = values[i];
            let diff = got.abs_diff(want) as f64 / want as f64;
            assert!(
                diff <= 0.03,
                "{column} at {row_ts}: {got} vs {field} {want} bytes read at {t}"
            );
        }
    }
}

/// A key the probe does not know fails it with a message naming the key.
#[test]
fn root_memory_usage_rejects_an_unknown_setting() {
    if !require_root("root_memory_usage_rejects_an_unknown_setting") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("memusage-bad", &[("memory_usage", "memory_usage")]);
    let output = temp_dir("memusage-bad-out");
    let config = write_config(
        &temp_dir("memusage-bad-config"),
        "[probes.memory_usage]\nbogus = 1\n",
    );
    let out = kernmlops(&[
        "run",
        "--config",
        &config,
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "memory_usage",
        "--duration",
        "1s",
        "--output",
        output.to_str().expect("utf8"),
    ]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "a bad setting must fail the run");
    assert!(
        stderr.contains("memory_usage") && stderr.contains("bogus"),
        "the error should name the probe and the key:\n{stderr}"
    );
}
