//! block_io on the running kernel, checked against fio's own report: one
//! row per completed request fio issued, with sane latency, size, flags and
//! queue depth; the --tgid filter applied to the issuing task; a clean
//! attach/detach with `kernmlops check`; and fsyncs on a loop device, whose
//! rows by operation equal the device's `/proc/diskstats` counts exactly.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use kernmlops_e2e::*;

fn block_io_plugins(name: &str) -> PathBuf {
    plugin_dir(name, &[("block_io", "block_io")])
}

/// fio arguments for direct 4 KiB random reads and writes on files in `dir`.
/// `--thread` runs the jobs as threads of the fio process, so every request
/// they issue carries fio's pid as tgid; two jobs keep more than one request
/// in flight at times.
fn fio_args(dir: &Path) -> Vec<String> {
    [
        "--name=kml_block_io",
        "--direct=1",
        "--rw=randrw",
        "--bs=4k",
        "--size=16m",
        "--ioengine=psync",
        "--numjobs=2",
        "--thread",
        "--output-format=json",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("--directory={}", dir.display())])
    .collect()
}

/// Lays out fio's files before collecting, so the run's only I/O is the
/// job's own reads and writes.
fn fio_layout(dir: &Path) {
    let out = Command::new("fio")
        .args(fio_args(dir))
        .arg("--create_only=1")
        .output()
        .expect("running fio --create_only");
    assert!(
        out.status.success(),
        "fio layout failed:\n{}",
        text(&out.stderr)
    );
}

/// What fio reports for one direction, summed over its jobs.
#[derive(Debug, Clone, Copy)]
struct FioDir {
    /// Completed I/Os (`total_ios`).
    ios: u64,
    /// Mean submission-to-completion latency (`lat_ns.mean`), in us.
    mean_lat_us: f64,
}

/// fio's read and write reports, from its JSON (which may follow warnings
/// on stdout).
fn fio_report(json: &str) -> (FioDir, FioDir) {
    let start = json.find('{').expect("fio printed JSON");
    let report: serde_json::Value = serde_json::from_str(&json[start..]).expect("fio JSON parses");
    let jobs = report["jobs"].as_array().expect("fio JSON has jobs");
    let dir = |d: &str| {
        let (mut ios, mut lat_sum) = (0u64, 0f64);
        for j in jobs {
            let n = j[d]["total_ios"].as_u64().expect("total_ios is a number");
            let mean = j[d]["lat_ns"]["mean"]
                .as_f64()
                .expect("lat_ns.mean is a number");
            ios += n;
            lat_sum += mean * n as f64;
        }
        FioDir {
            ios,
            mean_lat_us: lat_sum / ios.max(1) as f64 / 1000.0,
        }
    };
    (dir("read"), dir("write"))
}

/// The rows of one collection's block_io table, by column.
struct Rows {
    u64s: HashMap<&'static str, Vec<u64>>,
    flags_readable: Vec<String>,
    op: Vec<String>,
    disk_name: Vec<String>,
    error: Vec<i32>,
}

impl Rows {
    fn read(dir: &Path) -> Self {
        let batches = read_table(&dir.join("block_io.arrow"));
        let mut u64s = HashMap::new();
        for name in [
            "ts_uptime_us",
            "issue_ts_uptime_us",
            "latency_us",
            "device",
            "device_major",
            "device_minor",
            "sector",
            "segments",
            "bytes",
            "flags",
            "queue_depth",
            "queue_depth_4k",
            "unmatched_completions",
            "pid",
            "tgid",
        ] {
            u64s.insert(name, column_u64(&batches, name));
        }
        let strings = |name: &str| -> Vec<String> {
            column_str(&batches, name)
                .into_iter()
                .map(|v| v.unwrap_or_else(|| panic!("{name} has a null")))
                .collect()
        };
        let error = {
            use arrow_array::{cast::AsArray, types::Int32Type};
            batches
                .iter()
                .flat_map(|b| {
                    b.column_by_name("error")
                        .expect("error column")
                        .as_primitive::<Int32Type>()
                        .values()
                        .to_vec()
                })
                .collect()
        };
        // `op` is a label column: read it as strings whatever its encoding.
        let op = batches
            .iter()
            .flat_map(|b| {
                let col = b.column_by_name("op").expect("op column");
                let col = arrow_cast_to_strings(col.as_ref());
                col.into_iter()
            })
            .collect();
        Self {
            u64s,
            flags_readable: strings("flags_readable"),
            op,
            disk_name: strings("disk_name"),
            error,
        }
    }

    fn col(&self, name: &str) -> &[u64] {
        &self.u64s[name]
    }

    fn len(&self) -> usize {
        self.col("ts_uptime_us").len()
    }

    /// Indices of rows issued by process `tgid`.
    fn of_tgid(&self, tgid: u64) -> Vec<usize> {
        let t = self.col("tgid");
        (0..self.len()).filter(|&i| t[i] == tgid).collect()
    }
}

/// A dictionary- or plain-string Arrow column as strings.
fn arrow_cast_to_strings(col: &dyn arrow_array::Array) -> Vec<String> {
    use arrow_array::{cast::AsArray, types::*, Array};
    use arrow_schema::DataType;
    match col.data_type() {
        DataType::Utf8 => {
            let s = col.as_string::<i32>();
            (0..s.len()).map(|i| s.value(i).to_owned()).collect()
        }
        DataType::Dictionary(key, _) => {
            macro_rules! dict {
                ($k:ty) => {{
                    let d = col.as_dictionary::<$k>();
                    let values = d.values().as_string::<i32>();
                    d.keys()
                        .values()
                        .iter()
                        .map(|&k| values.value(k as usize).to_owned())
                        .collect()
                }};
            }
            match key.as_ref() {
                DataType::UInt8 => dict!(UInt8Type),
                DataType::UInt16 => dict!(UInt16Type),
                DataType::UInt32 => dict!(UInt32Type),
                DataType::Int8 => dict!(Int8Type),
                DataType::Int16 => dict!(Int16Type),
                DataType::Int32 => dict!(Int32Type),
                t => panic!("op: unexpected dictionary key {t}"),
            }
        }
        t => panic!("op: unexpected type {t}"),
    }
}

/// Checks the rows in `idx` against fio's read and write counts and the
/// column invariants; `what` names the run in messages.
fn check_fio_rows(rows: &Rows, idx: &[usize], fio: (FioDir, FioDir), what: &str) {
    let (reads, writes) = (fio.0.ios, fio.1.ios);
    let kind = |i: usize| rows.flags_readable[i].rsplit('-').next().unwrap_or("");
    let read_rows = idx.iter().filter(|&&i| kind(i) == "Read").count() as u64;
    let write_rows = idx.iter().filter(|&&i| kind(i) == "Write").count() as u64;
    // For a mismatch: who else issued 4 KiB sync requests, and how many
    // completions had no issue seen.
    let mut others: HashMap<u64, u64> = HashMap::new();
    let mine: std::collections::HashSet<usize> = idx.iter().copied().collect();
    for i in (0..rows.len()).filter(|i| !mine.contains(i)) {
        if rows.col("bytes")[i] == 4096 && rows.flags_readable[i].starts_with("Sync-") {
            *others.entry(rows.col("tgid")[i]).or_default() += 1;
        }
    }
    eprintln!(
        "{what}: fio read {reads}, write {writes}; rows read {read_rows}, write {write_rows}, all {}; \
         unmatched completions {}; other 4 KiB sync rows by tgid {others:?}",
        idx.len(),
        rows.col("unmatched_completions").iter().max().unwrap_or(&0),
    );
    assert!(
        reads > 100 && writes > 100,
        "{what}: fio did too little I/O"
    );
    for (kind, got, want) in [("read", read_rows, reads), ("write", write_rows, writes)] {
        let ratio = got as f64 / want as f64;
        assert!(
            (ratio - 1.0).abs() <= 0.05,
            "{what}: {got} {kind} rows vs fio's {want} {kind}s (ratio {ratio:.3})"
        );
    }
    let total = reads + writes;
    assert!(
        (idx.len() as f64 / total as f64 - 1.0).abs() <= 0.05,
        "{what}: {} rows of fio's process vs {total} I/Os",
        idx.len()
    );

    let (ts, issue, lat) = (
        rows.col("ts_uptime_us"),
        rows.col("issue_ts_uptime_us"),
        rows.col("latency_us"),
    );
    let (bytes, depth, depth_4k) = (
        rows.col("bytes"),
        rows.col("queue_depth"),
        rows.col("queue_depth_4k"),
    );
    let (device, major, minor) = (
        rows.col("device"),
        rows.col("device_major"),
        rows.col("device_minor"),
    );
    let (flags, segments) = (rows.col("flags"), rows.col("segments"));
    for &i in idx {
        let row = format!("{what}: row {i}");
        assert!(lat[i] > 0, "{row}: latency_us is 0");
        assert!(issue[i] <= ts[i], "{row}: issued after it completed");
        assert!(
            (ts[i] - issue[i]).abs_diff(lat[i]) <= 1,
            "{row}: latency_us {} is not completion - issue ({} - {})",
            lat[i],
            ts[i],
            issue[i]
        );
        assert!(bytes[i] % 512 == 0, "{row}: bytes {}", bytes[i]);
        assert_eq!(rows.error[i], 0, "{row}: fio's I/O failed");
        assert_eq!(device[i], major[i] << 20 | minor[i], "{row}: MKDEV");
        assert_eq!(
            rows.op[i],
            kind(i),
            "{row}: op label and flags_readable disagree"
        );
        // fio's own requests; the process may also cause the odd flush or
        // metadata request, which has no data to check.
        if let Some(op_bits) = match kind(i) {
            "Read" => Some(0),
            "Write" => Some(1),
            _ => None,
        } {
            assert_eq!(flags[i] & 0xff, op_bits, "{row}: REQ_OP bits of flags");
            assert!(bytes[i] > 0, "{row}: no bytes");
            assert!(segments[i] >= 1, "{row}: no segments");
        }
        // Direct psync I/O is REQ_SYNC for writes (O_DIRECT).
        if kind(i) == "Write" {
            assert!(
                rows.flags_readable[i].contains("Sync-"),
                "{row}: direct write is not Sync: {}",
                rows.flags_readable[i]
            );
        }
        // Never below zero, which an unsigned count shows as a wrap-around.
        assert!(depth[i] < 1 << 20, "{row}: queue_depth {}", depth[i]);
        assert!(
            depth_4k[i] < 1 << 40,
            "{row}: queue_depth_4k {}",
            depth_4k[i]
        );
        // The disk's dev_t, from the kernel's own sysfs.
        let sysfs = std::fs::read_to_string(format!("/sys/block/{}/dev", rows.disk_name[i]))
            .unwrap_or_else(|e| panic!("{row}: disk {}: {e}", rows.disk_name[i]));
        assert_eq!(
            sysfs.trim(),
            format!("{}:{}", major[i], minor[i]),
            "{row}: device of {}",
            rows.disk_name[i]
        );
    }
    // Each request's issue-to-completion lies inside fio's submission-to-
    // completion of the same I/O, so the means compare: never above fio's,
    // and the same order of magnitude (a unit error would be 1000x off).
    for (kind, dir) in [("Read", fio.0), ("Write", fio.1)] {
        let lats: Vec<u64> = idx
            .iter()
            .filter(|&&i| rows.flags_readable[i].ends_with(kind) && bytes[i] == 4096)
            .map(|&i| lat[i])
            .collect();
        let mean = lats.iter().sum::<u64>() as f64 / lats.len().max(1) as f64;
        eprintln!(
            "{what}: {kind} mean latency {mean:.1} us, fio's {:.1} us",
            dir.mean_lat_us
        );
        assert!(
            mean <= dir.mean_lat_us + 1.0 && mean >= dir.mean_lat_us * 0.1,
            "{what}: {kind} mean latency_us {mean:.1} vs fio's mean {:.1} us",
            dir.mean_lat_us
        );
    }
    // fio's two psync threads have at most two requests in flight, so after
    // one completes at most one of fio's is left: the median depth, other
    // I/O on the disk included, is at most 1 (double counting would show).
    let mut depths: Vec<u64> = idx.iter().map(|&i| depth[i]).collect();
    depths.sort_unstable();
    let median = depths.get(depths.len() / 2).copied().unwrap_or(0);
    assert!(
        median <= 1,
        "{what}: median queue_depth {median} with two psync jobs"
    );
    let max_depth = idx.iter().map(|&i| depth[i]).max().unwrap_or(0);
    assert!(
        max_depth > 0,
        "{what}: two fio jobs never had a request in flight at another's completion"
    );
    let kinds: Vec<&str> = idx
        .iter()
        .map(|&i| rows.flags_readable[i].as_str())
        .collect();
    assert!(kinds.iter().any(|k| k.ends_with("Read")), "{what}: no Read");
    assert!(
        kinds.iter().any(|k| k.ends_with("Write")),
        "{what}: no Write"
    );
}

/// fio's direct random reads and writes: block_io's rows of fio's process
/// agree with fio's own I/O counts within 5%, mean latency within fio's own
/// mean (each request is part of one fio I/O), with latency > 0, whole
/// sectors, consistent flags, devices as sysfs names them, and a queue depth
/// that is never negative and sometimes above zero.
#[test]
fn root_block_io_rows_agree_with_fio() {
    if !require_root("root_block_io_rows_agree_with_fio")
        || !require_tool("root_block_io_rows_agree_with_fio", "fio")
    {
        return;
    }
    let _serial = serial();
    let plugins = block_io_plugins("block_io");
    let output = temp_dir("block_io-out");
    let data = temp_dir("block_io-fio");
    fio_layout(&data);

    let c = Collector::start(&[
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "block_io",
        "--output",
        output.to_str().expect("utf8"),
    ]);
    let t0 = uptime_us();
    let fio = Command::new("fio")
        .args(fio_args(&data))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting fio");
    let fio_pid = u64::from(fio.id());
    let out = fio.wait_with_output().expect("waiting for fio");
    let t1 = uptime_us();
    assert!(out.status.success(), "fio failed:\n{}", text(&out.stderr));
    let done = c.signal_and_wait(libc::SIGINT);
    assert!(done.status.success(), "kernmlops failed:\n{}", done.stderr);
    let dir = done.dir.expect("collection folder printed");

    let fio = fio_report(&text(&out.stdout));
    let rows = Rows::read(&dir);
    let idx = rows.of_tgid(fio_pid);
    check_fio_rows(&rows, &idx, fio, "unfiltered");
    let ts = rows.col("ts_uptime_us");
    for &i in &idx {
        assert!(
            ts[i] >= t0 && ts[i] <= t1 + 1_000_000,
            "row {i}: ts_uptime_us {} outside fio's run [{t0}, {t1}]",
            ts[i]
        );
    }
    let man = manifest(&dir);
    assert_eq!(man["tables"]["block_io"]["lost_events"], 0, "lost events");
    assert_eq!(
        man["tables"]["block_io"]["rows"].as_u64(),
        Some(rows.len() as u64)
    );
    let _ = std::fs::remove_dir_all(&data);
}

/// With --tgid, only requests issued by that process have rows, even though
/// their completions run in interrupt context: the filter is applied at
/// issue. fio is started through a shell that waits for the collector and
/// then execs it, so its pid is known before collecting.
#[test]
fn root_block_io_tgid_filter_applies_to_the_issuer() {
    if !require_root("root_block_io_tgid_filter_applies_to_the_issuer")
        || !require_tool("root_block_io_tgid_filter_applies_to_the_issuer", "fio")
    {
        return;
    }
    let _serial = serial();
    let plugins = block_io_plugins("block_io-tgid");
    let output = temp_dir("block_io-tgid-out");
    let data = temp_dir("block_io-tgid-fio");
    fio_layout(&data);
    let go = data.join("go");

    // The shell waits for `go`, then becomes fio (same pid).
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.05; done; exec fio \"$@\"",
        go.display()
    );
    let fio = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .args(fio_args(&data))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting fio");
    let fio_pid = fio.id();
    let tgid = fio_pid.to_string();
    let c = Collector::start(&[
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "block_io",
        "--tgid",
        &tgid,
        "--output",
        output.to_str().expect("utf8"),
    ]);
    std::fs::write(&go, b"").expect("writing go file");
    let out = fio.wait_with_output().expect("waiting for fio");
    // Some other I/O after fio, which the filter must drop.
    let other = data.join("other");
    std::fs::write(&other, vec![7u8; 1 << 20]).expect("writing other file");
    let _ = Command::new("sync").status();
    let done = c.signal_and_wait(libc::SIGINT);
    assert!(out.status.success(), "fio failed:\n{}", text(&out.stderr));
    assert!(done.status.success(), "kernmlops failed:\n{}", done.stderr);
    let dir = done.dir.expect("collection folder printed");

    let fio = fio_report(&text(&out.stdout));
    let rows = Rows::read(&dir);
    let strangers: Vec<u64> = rows
        .col("tgid")
        .iter()
        .copied()
        .filter(|&t| t != u64::from(fio_pid))
        .collect();
    assert!(
        strangers.is_empty(),
        "--tgid {fio_pid} kept rows of other processes: {strangers:?}"
    );
    let idx: Vec<usize> = (0..rows.len()).collect();
    check_fio_rows(&rows, &idx, fio, "--tgid");
    let _ = std::fs::remove_dir_all(&data);
}

/// `kernmlops check --plugins block_io` loads, attaches and detaches.
#[test]
fn root_block_io_check_attaches_and_detaches() {
    if !require_root("root_block_io_check_attaches_and_detaches") {
        return;
    }
    let _serial = serial();
    let plugins = block_io_plugins("block_io-check");
    let out = kernmlops(&[
        "check",
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "block_io",
    ]);
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "check failed:\n{all}");
    let line = all
        .lines()
        .find(|l| l.contains("block_io"))
        .unwrap_or_else(|| panic!("check said nothing about block_io:\n{all}"));
    assert!(
        line.starts_with("ok") && line.contains("attached") && line.contains("detached"),
        "check: {line}"
    );
}

/// A loop device over a file in `dir`, detached on drop.
struct LoopDev {
    /// `/dev/loopN`.
    path: PathBuf,
}

impl LoopDev {
    fn attach(backing: &Path) -> Self {
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(backing)
            .output()
            .expect("running losetup");
        assert!(
            out.status.success(),
            "losetup --find --show failed:\n{}",
            text(&out.stderr)
        );
        Self {
            path: PathBuf::from(text(&out.stdout).trim()),
        }
    }

    /// `loopN`, as /proc/diskstats and block_io's `disk_name` name it.
    fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .expect("a loop device has a name")
    }

    /// The kernel's own counters of the device: reads, sectors read,
    /// writes, sectors written and flushes completed (Documentation/
    /// admin-guide/iostats.rst: fields 1, 3, 5, 7 and 16).
    fn diskstats(&self) -> [u64; 5] {
        let name = self.name();
        let all = std::fs::read_to_string("/proc/diskstats").expect("reading /proc/diskstats");
        let line = all
            .lines()
            .find(|l| l.split_whitespace().nth(2) == Some(name.as_str()))
            .unwrap_or_else(|| panic!("{name} is not in /proc/diskstats"));
        let fields: Vec<u64> = line
            .split_whitespace()
            .skip(3)
            .map(|f| f.parse().unwrap_or_else(|e| panic!("{line:?}: {e}")))
            .collect();
        assert!(
            fields.len() >= 17,
            "/proc/diskstats has no flush counts (Linux 5.5+): {line:?}"
        );
        [fields[0], fields[2], fields[4], fields[6], fields[15]]
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
    }
}

/// Direct 4 KiB writes to a loop device, each followed by an fsync, and
/// direct reads back: block_io's rows of that device, by operation, equal
/// the kernel's own counts in /proc/diskstats exactly. Each fsync is an
/// empty pre-flush write, which the kernel completes (and counts as a
/// write) without issuing it, and a flush request: a `Write` row with
/// bytes 0 and `Preflush-` in its flags, and a `Flush` row; neither counts
/// in `unmatched_completions`.
#[test]
fn root_block_io_fsync_rows_match_diskstats() {
    if !require_root("root_block_io_fsync_rows_match_diskstats")
        || !require_tool("root_block_io_fsync_rows_match_diskstats", "losetup")
    {
        return;
    }
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    const WRITES: u64 = 24;
    const READS: u64 = 8;
    let _serial = serial();
    let plugins = block_io_plugins("block_io-fsync");
    let output = temp_dir("block_io-fsync-out");
    let work = temp_dir("block_io-fsync-dev");
    let backing = work.join("disk.img");
    std::fs::File::create(&backing)
        .and_then(|f| f.set_len(16 << 20))
        .expect("creating the loop device's file");
    let dev = LoopDev::attach(&backing);
    // Whatever probes a new disk (udev, blkid) is done before the window.
    std::thread::sleep(std::time::Duration::from_millis(500));

    let c = Collector::start(&[
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "block_io",
        "--output",
        output.to_str().expect("utf8"),
    ]);
    let mut buf = vec![0u8; 8192];
    let at = buf.as_ptr().align_offset(4096);
    let block = &mut buf[at..at + 4096];
    block.fill(0x5a);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&dev.path)
        .expect("opening the loop device O_DIRECT");
    let before = dev.diskstats();
    let t0 = uptime_us();
    for i in 0..WRITES {
        file.write_all_at(block, i * 8192).expect("direct write");
        file.sync_all().expect("fsync");
    }
    for i in 0..READS {
        file.read_exact_at(block, i * 8192).expect("direct read");
    }
    let t1 = uptime_us();
    let after = dev.diskstats();
    drop(file);
    let done = c.signal_and_wait(libc::SIGINT);
    assert!(done.status.success(), "kernmlops failed:\n{}", done.stderr);
    let dir = done.dir.expect("collection folder printed");
    let delta: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    let (reads, read_sectors, writes, write_sectors, flushes) =
        (delta[0], delta[1], delta[2], delta[3], delta[4]);

    let rows = Rows::read(&dir);
    let name = dev.name();
    let ts = rows.col("ts_uptime_us");
    let idx: Vec<usize> = (0..rows.len())
        .filter(|&i| rows.disk_name[i] == name && ts[i] >= t0 && ts[i] <= t1)
        .collect();
    let bytes = rows.col("bytes");
    let count = |op: &str| idx.iter().filter(|&&i| rows.op[i] == op).count() as u64;
    let sum_bytes = |op: &str| {
        idx.iter()
            .filter(|&&i| rows.op[i] == op)
            .map(|&i| bytes[i])
            .sum::<u64>()
    };
    let empty_writes: Vec<usize> = idx
        .iter()
        .copied()
        .filter(|&i| rows.op[i] == "Write" && bytes[i] == 0)
        .collect();
    eprintln!(
        "{name}: diskstats reads {reads} ({read_sectors} sectors), writes {writes} ({write_sectors} sectors), flushes {flushes}; \
         rows Read {}, Write {} ({} empty), Flush {}, all {}",
        count("Read"),
        count("Write"),
        empty_writes.len(),
        count("Flush"),
        idx.len()
    );
    // The workload is what the kernel counted: no other I/O on the device.
    assert_eq!(reads, READS, "diskstats reads");
    assert_eq!(writes, 2 * WRITES, "diskstats writes: data and pre-flush");
    assert_eq!(flushes, WRITES, "diskstats flushes");
    assert_eq!(count("Read"), reads, "Read rows vs diskstats reads");
    assert_eq!(count("Write"), writes, "Write rows vs diskstats writes");
    assert_eq!(count("Flush"), flushes, "Flush rows vs diskstats flushes");
    assert_eq!(sum_bytes("Read"), read_sectors * 512, "bytes read");
    assert_eq!(sum_bytes("Write"), write_sectors * 512, "bytes written");
    assert_eq!(idx.len() as u64, reads + writes + flushes, "other rows");
    assert_eq!(
        empty_writes.len() as u64,
        WRITES,
        "one empty write per fsync"
    );
    let me = u64::from(std::process::id());
    let (issue, lat) = (rows.col("issue_ts_uptime_us"), rows.col("latency_us"));
    for &i in &empty_writes {
        let row = format!("empty write row {i}");
        assert!(
            rows.flags_readable[i].starts_with("Preflush-") && rows.col("flags")[i] & 0xff == 1,
            "{row}: flags {:#x} {}",
            rows.col("flags")[i],
            rows.flags_readable[i]
        );
        assert_eq!(rows.col("tgid")[i], me, "{row}: submitted by this test");
        assert!(
            issue[i] >= t0 && issue[i] <= ts[i],
            "{row}: submitted in the window"
        );
        assert!(
            (ts[i] - issue[i]).abs_diff(lat[i]) <= 1,
            "{row}: latency_us {} is not completion - issue",
            lat[i]
        );
    }
    // The device's completions were all matched: the count did not move
    // over the window (it may hold other disks' requests in flight at start).
    let unmatched = rows.col("unmatched_completions");
    let (first, last) = (
        idx.first().map(|&i| unmatched[i]),
        idx.last().map(|&i| unmatched[i]),
    );
    assert_eq!(
        first, last,
        "unmatched_completions grew over the loop device's I/O"
    );
    assert_eq!(
        manifest(&dir)["tables"]["block_io"]["lost_events"],
        0,
        "lost events"
    );
}
