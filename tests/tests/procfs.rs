//! The procfs probe on the running kernel: its samples bracketed by the
//! test's own reads of the same files just before and after, its deltas
//! checked against its values, and its cgroup table on a cgroup the test
//! makes and on a benchmark's cgroup.

use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use kernmlops_e2e::*;

const INTERVAL_MS: u64 = 50;

/// Counter values of one read of a file, by series name (`pgfault`,
/// `sda reads_completed`, ...).
type Values = HashMap<String, u64>;

/// One read by the test: CLOCK_BOOTTIME just before and just after, and
/// what it held.
struct Read {
    start: u64,
    end: u64,
    values: Values,
}

/// Reads a file's monotonic counters by series name.
type Parser = fn(&str) -> Values;

/// The files the test reads and how their monotonic counters are named.
const FILES: &[(&str, Parser)] = &[
    ("/proc/vmstat", vmstat),
    ("/proc/diskstats", diskstats),
    ("/proc/pressure/cpu", pressure),
    ("/proc/net/dev", net_dev),
];

/// `/proc/vmstat` event counters (the `nr_*` gauges left out, with the
/// one other gauge).
fn vmstat(text: &str) -> Values {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            let counter = !k.starts_with("nr_") && k != "workingset_nodes";
            Some((k.to_owned(), v.trim().parse().ok()?)).filter(|_| counter)
        })
        .collect()
}

/// The diskstats columns the probe declares, in the kernel's order.
const DISK: [&str; 17] = [
    "reads_completed",
    "reads_merged",
    "sectors_read",
    "read_time_ms",
    "writes_completed",
    "writes_merged",
    "sectors_written",
    "write_time_ms",
    "in_flight",
    "io_time_ms",
    "weighted_io_time_ms",
    "discards_completed",
    "discards_merged",
    "sectors_discarded",
    "discard_time_ms",
    "flushes_completed",
    "flush_time_ms",
];

fn diskstats(text: &str) -> Values {
    let mut out = Values::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        for (i, w) in words.iter().skip(3).enumerate().take(DISK.len()) {
            // in_flight is a gauge.
            if i != 8 {
                if let Ok(v) = w.parse() {
                    out.insert(format!("{} {}", words[2], DISK[i]), v);
                }
            }
        }
    }
    out
}

fn pressure(text: &str) -> Values {
    text.lines()
        .filter_map(|l| {
            let (kind, rest) = l.split_once(' ')?;
            let total = rest
                .split_whitespace()
                .find_map(|w| w.strip_prefix("total="))?;
            Some((format!("cpu {kind}_total_us"), total.parse().ok()?))
        })
        .collect()
}

const NET: [&str; 16] = [
    "rx_bytes",
    "rx_packets",
    "rx_errs",
    "rx_drop",
    "rx_fifo",
    "rx_frame",
    "rx_compressed",
    "rx_multicast",
    "tx_bytes",
    "tx_packets",
    "tx_errs",
    "tx_drop",
    "tx_fifo",
    "tx_colls",
    "tx_carrier",
    "tx_compressed",
];

fn net_dev(text: &str) -> Values {
    let mut out = Values::new();
    for line in text.lines().skip(2) {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        for (i, w) in rest.split_whitespace().enumerate().take(NET.len()) {
            if let Ok(v) = w.parse() {
                out.insert(format!("{} {}", name.trim(), NET[i]), v);
            }
        }
    }
    out
}

/// A row's series: (timestamp, series name, value, delta).
type Row = (u64, String, u64, Option<u64>);

/// Rows of a long table as series `key` (`key cpu<n>` in per-CPU tables).
fn long_rows(dir: &Path, table: &str) -> Vec<Row> {
    let b = read_table(&dir.join(format!("{table}.arrow")));
    let ts = column_u64(&b, "ts_uptime_us");
    let keys = column_str(&b, "key");
    let values = column_u64(&b, "value");
    let deltas = column_u64(&b, "delta");
    let per_cpu = b
        .first()
        .is_some_and(|b| b.schema().field_with_name("cpu").is_ok());
    let cpus = if per_cpu {
        column_u64(&b, "cpu")
    } else {
        Vec::new()
    };
    (0..ts.len())
        .map(|i| {
            let mut key = keys[i].clone().expect("key");
            if let Some(cpu) = cpus.get(i) {
                key.push_str(&format!(" cpu{cpu}"));
            }
            (ts[i], key, values[i], Some(deltas[i]))
        })
        .collect()
}

/// Rows of a wide table as series `<name column> <column>`, with the
/// column's `_delta` when it has one.
fn wide_rows(dir: &Path, table: &str, name_column: &str, columns: &[&str]) -> Vec<Row> {
    let b = read_table(&dir.join(format!("{table}.arrow")));
    let ts = column_u64(&b, "ts_uptime_us");
    let names = column_str(&b, name_column);
    let schema = b.first().map(|b| b.schema());
    let mut out = Vec::new();
    for c in columns {
        let values = column_u64(&b, c);
        let delta_name = format!("{c}_delta");
        let deltas = schema
            .as_ref()
            .filter(|s| s.field_with_name(&delta_name).is_ok())
            .map(|_| column_u64(&b, &delta_name));
        for i in 0..ts.len() {
            let name = names[i].clone().expect("name");
            out.push((
                ts[i],
                format!("{name} {c}"),
                values[i],
                deltas.as_ref().map(|d| d[i]),
            ));
        }
    }
    out
}

/// Checks each row against the test's reads around it, and each delta
/// against the previous row of its series. A row's timestamp is taken just
/// before the probe reads its file, and the probe reads its files one after
/// another on one thread, so its read ended before the next timestamp it
/// recorded in any table (`after_ts`): the last test read that ended
/// before the row's timestamp saw no more than the probe, and the first
/// that started after that next timestamp no less (both within a second).
/// Returns how many rows were bracketed, and how many are of series the
/// test reads.
fn check(table: &str, rows: &[Row], reads: &[Read], after_ts: &[u64]) -> (usize, usize) {
    let mut bracketed = 0;
    let known = |s: &str| reads.iter().any(|r| r.values.contains_key(s));
    let candidates = rows.iter().filter(|r| known(&r.1)).count();
    for (ts, series, value, _) in rows {
        let next = after_ts.partition_point(|&t| t <= *ts);
        let Some(&read_done) = after_ts.get(next) else {
            continue;
        };
        let before = reads.iter().rev().find(|r| r.end <= *ts);
        let after = reads.iter().find(|r| r.start >= read_done);
        let (Some(before), Some(after)) = (before, after) else {
            continue;
        };
        if ts - before.end > 1_000_000 || after.start - ts > 1_000_000 {
            continue;
        }
        let (Some(lo), Some(hi)) = (before.values.get(series), after.values.get(series)) else {
            continue;
        };
        assert!(
            lo <= value && value <= hi,
            "{table} {series} at {ts} (next probe timestamp {read_done}): {value} is not between {lo} (read at {}..{}) and {hi} (read at {}..{})",
            before.start,
            before.end,
            after.start,
            after.end
        );
        bracketed += 1;
    }
    let mut series: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        series.entry(r.1.as_str()).or_default().push(r);
    }
    for (name, mut rs) in series {
        rs.sort_by_key(|r| r.0);
        if let Some(first) = rs.first().and_then(|r| r.3) {
            assert_eq!(first, 0, "{table} {name}: the first delta is 0");
        }
        for w in rs.windows(2) {
            let (prev, cur) = (w[0].2, w[1].2);
            if let Some(delta) = w[1].3 {
                let want = cur.saturating_sub(prev);
                assert_eq!(
                    delta, want,
                    "{table} {name} at {}: delta {delta}, values {prev} -> {cur}",
                    w[1].0
                );
            }
        }
    }
    (bracketed, candidates)
}

fn write_config(dir: &Path, body: &str) -> String {
    let path = dir.join("kernmlops.toml");
    std::fs::write(&path, body).expect("writing config");
    path.to_str().expect("utf8").to_owned()
}

/// Samples of /proc/vmstat, /proc/diskstats, /proc/pressure/cpu and
/// /proc/net/dev lie between the test's reads of the same files taken just
/// before and after them, and their deltas are the differences of
/// consecutive values.
#[test]
fn root_procfs_samples_are_bracketed_by_reads_of_the_same_files() {
    if !require_root("root_procfs_samples_are_bracketed_by_reads_of_the_same_files") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("procfs", &[("procfs", "procfs")]);
    let output = temp_dir("procfs-out");
    let config = write_config(
        &temp_dir("procfs-config"),
        &format!("[probes.procfs]\ninterval = \"{INTERVAL_MS}ms\"\n"),
    );
    let c = Collector::start(&[
        "--config",
        &config,
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "procfs",
        "--output",
        output.to_str().expect("utf8"),
    ]);
    let t_started = uptime_us();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut reads: Vec<Vec<Read>> = FILES.iter().map(|_| Vec::new()).collect();
            while !stop.load(Ordering::Relaxed) {
                for ((path, parse), out) in FILES.iter().zip(reads.iter_mut()) {
                    let start = uptime_us();
                    let Ok(text) = std::fs::read_to_string(path) else {
                        continue;
                    };
                    let end = uptime_us();
                    out.push(Read {
                        start,
                        end,
                        values: parse(&text),
                    });
                }
                std::thread::sleep(Duration::from_millis(3));
            }
            reads
        })
    };
    // Some disk and network activity for the counters to move.
    let scratch = temp_dir("procfs-io");
    for i in 0..30 {
        std::fs::write(scratch.join(format!("f{i}")), vec![7u8; 1 << 16]).expect("write");
        let _ = std::fs::File::open(scratch.join(format!("f{i}"))).and_then(|f| f.sync_all());
        let _ = std::net::TcpStream::connect_timeout(
            &"127.0.0.1:9".parse().expect("addr"),
            Duration::from_millis(10),
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    let reads = reader.join().expect("reader thread");
    let t_stop = uptime_us();
    let done = c.signal_and_wait(libc::SIGINT);
    assert!(done.status.success(), "kernmlops failed:\n{}", done.stderr);
    let dir = done.dir.expect("collection folder printed");

    // Every timestamp the probe recorded, in order.
    let mut all_ts: Vec<u64> = [
        "procfs_pressure",
        "procfs_vmstat",
        "procfs_cpufreq",
        "procfs_interrupts",
        "procfs_softirqs",
        "procfs_diskstats",
        "procfs_net_dev",
        "procfs_cgroup",
    ]
    .iter()
    .flat_map(|t| column_u64(&read_table(&dir.join(format!("{t}.arrow"))), "ts_uptime_us"))
    .collect();
    all_ts.sort_unstable();
    all_ts.dedup();
    let vm = long_rows(&dir, "procfs_vmstat");
    let samples: std::collections::BTreeSet<u64> = vm.iter().map(|r| r.0).collect();
    let expected = (t_stop - t_started) / (INTERVAL_MS * 1000);
    eprintln!(
        "{} vmstat samples, about {expected} expected",
        samples.len()
    );
    assert!(
        samples.len() as u64 >= expected / 2,
        "{} samples of /proc/vmstat in {} ms at {INTERVAL_MS} ms",
        samples.len(),
        (t_stop - t_started) / 1000
    );
    let disk_columns: Vec<&str> = DISK.iter().copied().filter(|c| *c != "in_flight").collect();
    let tables: [(&str, Vec<Row>); 4] = [
        ("procfs_vmstat", vm),
        (
            "procfs_diskstats",
            wide_rows(&dir, "procfs_diskstats", "device", &disk_columns),
        ),
        ("procfs_pressure", {
            let b = read_table(&dir.join("procfs_pressure.arrow"));
            let ts = column_u64(&b, "ts_uptime_us");
            let resource = column_str(&b, "resource");
            let mut rows = Vec::new();
            for kind in ["some", "full"] {
                let total = column_u64(&b, &format!("{kind}_total_us"));
                let delta = column_u64(&b, &format!("{kind}_total_us_delta"));
                // The test reads /proc/pressure/cpu: the cpu rows.
                for i in (0..ts.len()).filter(|&i| resource[i].as_deref() == Some("cpu")) {
                    rows.push((
                        ts[i],
                        format!("cpu {kind}_total_us"),
                        total[i],
                        Some(delta[i]),
                    ));
                }
            }
            rows
        }),
        (
            "procfs_net_dev",
            wide_rows(&dir, "procfs_net_dev", "interface", &NET),
        ),
    ];
    for ((table, rows), file_reads) in tables.iter().zip(&reads) {
        assert!(!rows.is_empty(), "no rows in {table}");
        let (bracketed, candidates) = check(table, rows, file_reads, &all_ts);
        eprintln!(
            "{table}: {bracketed} of {candidates} counter values bracketed ({} rows)",
            rows.len()
        );
        assert!(
            bracketed * 4 >= candidates * 3 && bracketed > 0,
            "{table}: only {bracketed} of {candidates} counter values had reads around them"
        );
    }
    // The other tables of this machine: per-CPU counts and a note for
    // cpufreq where it has none.
    for table in ["procfs_interrupts", "procfs_softirqs"] {
        let rows = long_rows(&dir, table);
        assert!(!rows.is_empty(), "no rows in {table}");
        check(table, &rows, &[], &[]);
    }
    let has_cpufreq = Path::new("/sys/devices/system/cpu/cpu0/cpufreq").exists();
    let notes = manifest(&dir)["probes"][0]["notes"].to_string();
    assert_eq!(
        notes.contains("no cpufreq"),
        !has_cpufreq,
        "a note exactly where cpufreq is missing: {notes}"
    );
}

/// A busy process in a cgroup the test makes, recorded through `--cgroup`:
/// its CPU time grows in `procfs_cgroup`, with deltas that add up.
#[test]
fn root_procfs_records_the_cgroup_given_with_cgroup() {
    if !require_root("root_procfs_records_the_cgroup_given_with_cgroup") {
        return;
    }
    let _serial = serial();
    let Some(cg) = TestCgroup::create("kml-e2e-procfs") else {
        panic!("cannot make a cgroup v2 folder");
    };
    let busy = KillOnDrop(
        std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .expect("spawning a busy loop"),
    );
    std::fs::write(cg.dir.join("cgroup.procs"), busy.id().to_string()).expect("moving it in");
    let plugins = plugin_dir("procfs-cg", &[("procfs", "procfs")]);
    let output = temp_dir("procfs-cg-out");
    let config = write_config(
        &temp_dir("procfs-cg-config"),
        "[probes.procfs]\ninterval = \"100ms\"\n",
    );
    let out = kernmlops(&[
        "run",
        "--config",
        &config,
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "procfs",
        "--cgroup",
        cg.dir.to_str().expect("utf8"),
        "--duration",
        "2s",
        "--output",
        output.to_str().expect("utf8"),
    ]);
    drop(busy);
    assert!(
        out.status.success(),
        "kernmlops failed:\n{}",
        text(&out.stderr)
    );
    let dir = only_collection(&output);
    let b = read_table(&dir.join("procfs_cgroup.arrow"));
    let files = column_str(&b, "file");
    let rows = long_rows(&dir, "procfs_cgroup");
    let usage: Vec<Row> = rows
        .iter()
        .zip(&files)
        .filter(|(r, f)| f.as_deref() == Some("cpu.stat") && r.1 == "usage_usec")
        .map(|(r, _)| r.clone())
        .collect();
    assert!(usage.len() >= 10, "{} usage_usec rows", usage.len());
    check("procfs_cgroup", &usage, &[], &[]);
    let used = usage.last().map_or(0, |r| r.2) - usage[0].2;
    let deltas: u64 = usage.iter().map(|r| r.3.unwrap_or(0)).sum();
    assert_eq!(deltas, used, "the deltas add up to the growth");
    assert!(
        used > 500_000,
        "the busy loop used {used} us of CPU in about 2 s of samples"
    );
    let direct = std::fs::read_to_string(cg.dir.join("cpu.stat")).expect("cpu.stat");
    let now: u64 = direct
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse().ok())
        .expect("usage_usec");
    assert!(
        usage.last().map_or(0, |r| r.2) <= now,
        "the last sample is not past the cgroup's own count"
    );
}

/// A benchmark run (a `script` benchmark spinning on a CPU): the probe
/// finds the benchmark's workload cgroup and samples its cpu.stat, which
/// grows with the benchmark's CPU time.
#[test]
fn root_procfs_records_the_benchmark_cgroup() {
    if !require_root("root_procfs_records_the_benchmark_cgroup") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir(
        "procfs-bench",
        &[("procfs", "procfs"), ("workloads", "workloads")],
    );
    let output = temp_dir("procfs-bench-out");
    let config = write_config(
        &temp_dir("procfs-bench-config"),
        "[probes.procfs]\ninterval = \"100ms\"\n\
         [benchmarks.script]\ndrop_page_cache = false\n\
         command = [\"sh\", \"-c\", \"while :; do :; done\"]\n",
    );
    let out = kernmlops(&[
        "run",
        "--config",
        &config,
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "procfs",
        "--benchmark",
        "script",
        "--duration",
        "2s",
        "--output",
        output.to_str().expect("utf8"),
    ]);
    let dir = only_collection(&output);
    let b = read_table(&dir.join("procfs_cgroup.arrow"));
    let files = column_str(&b, "file");
    let rows = long_rows(&dir, "procfs_cgroup");
    let usage: Vec<Row> = rows
        .iter()
        .zip(&files)
        .filter(|(r, f)| f.as_deref() == Some("cpu.stat") && r.1 == "usage_usec")
        .map(|(r, _)| r.clone())
        .collect();
    assert!(
        usage.len() >= 10,
        "{} cpu.stat usage_usec rows of the benchmark's cgroup:\n{}",
        usage.len(),
        text(&out.stderr)
    );
    check("procfs_cgroup", &usage, &[], &[]);
    let used = usage.last().map_or(0, |r| r.2) - usage[0].2;
    assert!(
        used > 500_000,
        "the benchmark's busy loop used {used} us of CPU in about 2 s of samples"
    );
}
