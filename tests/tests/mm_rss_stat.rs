//! mm_rss_stat on the running kernel: a process that maps and touches
//! 64 MiB of anonymous memory shows its anon page count grow by that much,
//! and its last count agrees with the kernel's own `/proc/PID/status`;
//! every row's four counters equal the kernel's own `kmem:rss_stat` values
//! replayed by `perf`; and the per-mm map forgets the mms that are gone.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
};

use kernmlops_e2e::*;

const MIB: u64 = 64;
const PAGE: u64 = 4096;

/// Says it is ready, waits for a line on stdin, maps and touches MIB MiB,
/// reports its RssAnon from /proc, then waits for another line to exit.
const TOUCHER: &str = r#"
import mmap, sys
n = int(sys.argv[1]) << 20
print("ready", flush=True)
sys.stdin.readline()
m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for i in range(0, n, 4096):
    m[i] = 1
rss = [l for l in open("/proc/self/status") if l.startswith("RssAnon:")][0]
print(rss.split()[1], flush=True)
sys.stdin.readline()
"#;

#[test]
fn root_mm_rss_stat_sees_anon_pages_grow() {
    if !require_root("root_mm_rss_stat_sees_anon_pages_grow")
        || !require_tool("mm_rss_stat", "python3")
    {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("mm_rss", &[("mm_rss_stat", "mm_rss_stat")]);
    let output = temp_dir("mm-rss-out");

    let mut child = Command::new("python3")
        .args(["-c", TOUCHER, &MIB.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting python3");
    let tgid = child.id();
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout piped"));
    let mut line = String::new();
    // Started up (exec and interpreter set-up done) before collecting.
    stdout
        .read_line(&mut line)
        .expect("reading python3's ready");
    assert_eq!(line.trim(), "ready", "python3 did not start");
    let c = Collector::start(&[
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "mm_rss_stat",
        "--tgid",
        &tgid.to_string(),
        "--output",
        output.to_str().expect("utf8"),
    ]);
    // The kernel's exact counts while the process waits: its first row,
    // the first change of an mm that existed before the collection, must
    // carry them for the three counters it did not change.
    let before = proc_counters(tgid);
    let mut stdin = child.stdin.take().expect("stdin piped");
    stdin.write_all(b"go\n").expect("writing to python3");
    stdin.flush().expect("flushing");
    line.clear();
    stdout
        .read_line(&mut line)
        .expect("reading python3's report");
    let rss_anon_kib: u64 = line
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("python3 reported {line:?}: {e}"));

    // Stop collecting while the process still holds its memory: its exit
    // would add rows that count the pages down again.
    let done = c.signal_and_wait(libc::SIGINT);
    stdin.write_all(b"done\n").expect("writing to python3");
    drop(stdin);
    let status = child.wait().expect("waiting for python3");
    assert!(status.success(), "python3 failed");
    assert!(done.status.success(), "kernmlops failed:\n{}", done.stderr);
    let dir = done.dir.expect("collection folder printed");

    let batches = read_table(&dir.join("mm_rss_stat.arrow"));
    let tgids = column_u64(&batches, "tgid");
    let anon = column_u64(&batches, "anon_pages");
    let mm_ids = column_u64(&batches, "mm_id");
    let members = column_str(&batches, "member");
    assert!(!tgids.is_empty(), "no rows for the toucher (tgid {tgid})");
    assert!(
        tgids.iter().all(|&t| t == u64::from(tgid)),
        "--tgid {tgid} let other processes through: {:?}",
        tgids
            .iter()
            .filter(|&&t| t != u64::from(tgid))
            .take(5)
            .collect::<Vec<_>>()
    );
    assert!(
        mm_ids.windows(2).all(|w| w[0] == w[1]),
        "one process, one mm: mm_id should not change"
    );
    for m in &members {
        assert!(
            matches!(m.as_deref(), Some("file" | "anon" | "swap" | "shmem")),
            "unexpected member {m:?}"
        );
    }
    let anon_rows = members
        .iter()
        .filter(|m| m.as_deref() == Some("anon"))
        .count();
    let expected = (MIB << 20) / PAGE;
    assert!(
        anon_rows as u64 >= expected / 2,
        "{anon_rows} anon rows for {expected} touched pages"
    );

    let (min, max) = (
        anon.iter().copied().min().unwrap_or(0),
        anon.iter().copied().max().unwrap_or(0),
    );
    let grew = max - min;
    eprintln!(
        "{} rows, anon_pages {min}..{max} (+{grew}, expected {expected}), RssAnon {rss_anon_kib} KiB",
        anon.len()
    );
    assert!(
        grew.abs_diff(expected) * 10 <= expected,
        "anon_pages grew by {grew} pages, expected {expected} within 10%"
    );
    // The kernel's own count, read by the process after touching, against
    // the latest row (rows of different CPUs reach the file in batches, not
    // in time order).
    let ts = column_u64(&batches, "ts_uptime_us");
    let last = ts
        .iter()
        .zip(&anon)
        .max_by_key(|(t, _)| **t)
        .map_or(0, |(_, a)| *a);
    let proc_pages = rss_anon_kib * 1024 / PAGE;
    assert!(
        last.abs_diff(proc_pages) * 10 <= proc_pages,
        "last anon_pages {last} vs /proc RssAnon {proc_pages} pages"
    );
    let man = manifest(&dir);
    assert_eq!(
        man["tables"]["mm_rss_stat"]["lost_events"], 0,
        "lost events"
    );
    let ts = column_u64(&batches, "ts_uptime_us");
    let first = (0..ts.len()).min_by_key(|&i| ts[i]).expect("rows");
    let member = members[first].as_deref().unwrap_or("");
    let row: Vec<u64> = COUNTERS
        .iter()
        .map(|c| column_u64(&batches, &format!("{c}_pages"))[first])
        .collect();
    eprintln!("first row: {member} changed, {row:?}; /proc before: {before:?}");
    for (k, name) in COUNTERS.iter().enumerate() {
        if *name != member {
            assert_eq!(
                row[k], before[k],
                "first row ({member} changed): {name}_pages {} but /proc/{tgid}/status said {} just before",
                row[k], before[k]
            );
        }
    }
    assert_eq!(column_u64(&batches, "estimated")[first], 0, "estimated");
}

/// file, anon, swap and shmem pages of a process, from `/proc/PID/status`
/// (RssFile, RssAnon, VmSwap, RssShmem: the counters' exact sums).
fn proc_counters(pid: u32) -> [u64; 4] {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("reading status");
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{key} in /proc/{pid}/status"))
    };
    [
        kib("RssFile:"),
        kib("RssAnon:"),
        kib("VmSwap:"),
        kib("RssShmem:"),
    ]
    .map(|k| k * 1024 / PAGE)
}

/// Maps MIB MiB of a file, of private anonymous memory and of shared
/// anonymous memory (shmem), and touches them a page of each at a time, so
/// rows of every counter but swap come interleaved; then exits, which
/// counts them down again.
const INTERLEAVER: &str = r#"
import mmap, sys
n = int(sys.argv[1]) << 20
f = open(sys.argv[2], "rb")
fm = mmap.mmap(f.fileno(), n, prot=mmap.PROT_READ)
a = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
s = mmap.mmap(-1, n, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
x = 0
for i in range(0, n, 4096):
    a[i] = 1
    x += fm[i]
    s[i] = 1
"#;

/// One `kmem:rss_stat` event as `perf script` prints it: "comm tid [cpu]
/// ts: kmem:rss_stat: mm_id=N curr=1 type=MM_ANONPAGES size=123456B".
#[derive(Debug, Clone, Copy, PartialEq)]
struct PerfEvent {
    tid: u32,
    mm_id: u64,
    /// MM_FILEPAGES .. MM_SHMEMPAGES as 0..3.
    member: usize,
    pages: u64,
}

const COUNTERS: [&str; 4] = ["file", "anon", "swap", "shmem"];

fn perf_events(script: &str) -> Vec<PerfEvent> {
    let mut out = Vec::new();
    for line in script.lines() {
        let mut words = line.split_whitespace();
        let _comm = words.next();
        let Some(tid) = words.next().and_then(|w| w.parse::<u32>().ok()) else {
            continue;
        };
        let field = |key: &str| line.split_whitespace().find_map(|w| w.strip_prefix(key));
        let (Some(mm), Some(kind), Some(size)) = (field("mm_id="), field("type="), field("size="))
        else {
            continue;
        };
        let member = match kind {
            "MM_FILEPAGES" => 0,
            "MM_ANONPAGES" => 1,
            "MM_SWAPENTS" => 2,
            "MM_SHMEMPAGES" => 3,
            _ => continue,
        };
        let (Ok(mm_id), Some(Ok(bytes))) = (
            mm.parse::<u64>(),
            size.strip_suffix('B').map(str::parse::<u64>),
        ) else {
            continue;
        };
        out.push(PerfEvent {
            tid,
            mm_id,
            member,
            pages: bytes / PAGE,
        });
    }
    out
}

/// Every row of a process whose whole address space lived inside the
/// collection carries all four counters exactly, checked against an
/// independent oracle: the kernel's own `kmem:rss_stat` events recorded by
/// `perf record`, each the exact value of the counter it changed. Replaying
/// them over the mm from its birth at exec (all four at zero) gives each
/// counter's value after every event; each of our rows must be one of those
/// events, with the same four values.
#[test]
fn root_mm_rss_stat_every_counter_is_exact() {
    if !require_root("root_mm_rss_stat_every_counter_is_exact")
        || !require_tool("root_mm_rss_stat_every_counter_is_exact", "python3")
        || !require_tool("root_mm_rss_stat_every_counter_is_exact", "perf")
    {
        return;
    }
    const TOUCH_MIB: u64 = 8;
    let _serial = serial();
    let plugins = plugin_dir("mm_rss_exact", &[("mm_rss_stat", "mm_rss_stat")]);
    let work = temp_dir("mm-rss-exact");
    let output = work.join("data");
    let file = work.join("mapped");
    std::fs::write(&file, vec![3u8; (TOUCH_MIB << 20) as usize]).expect("writing the file");
    let perf_data = work.join("perf.data");
    let mut perf = KillOnDrop(
        Command::new("perf")
            .args([
                "record",
                "-q",
                "-m",
                "2048",
                "-e",
                "kmem:rss_stat",
                "-a",
                "-o",
            ])
            .arg(&perf_data)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting perf record"),
    );
    // No --tgid: every mm is followed, the toucher's among them.
    let c = Collector::start(&[
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "mm_rss_stat",
        "--output",
        output.to_str().expect("utf8"),
    ]);
    std::thread::sleep(std::time::Duration::from_millis(700));
    let toucher = Command::new("python3")
        .args(["-c", INTERLEAVER, &TOUCH_MIB.to_string()])
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting python3");
    let pid = u64::from(toucher.id());
    let toucher = toucher.wait_with_output().expect("waiting for python3");
    assert!(
        toucher.status.success(),
        "python3 failed: {}",
        text(&toucher.stderr)
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    // SAFETY: signalling a child we spawned and still own.
    unsafe { libc::kill(perf.id() as i32, libc::SIGINT) };
    let mut perf_out = String::new();
    if let Some(mut err) = perf.0.stderr.take() {
        use std::io::Read;
        let _ = err.read_to_string(&mut perf_out);
    }
    let _ = perf.0.wait();
    let done = c.signal_and_wait(libc::SIGINT);
    assert!(done.status.success(), "kernmlops failed:\n{}", done.stderr);
    assert!(
        !perf_out.contains("lost"),
        "perf record lost events, no oracle: {perf_out}"
    );
    let script = Command::new("perf")
        .args(["script", "-i"])
        .arg(&perf_data)
        .output()
        .expect("perf script");
    let events = perf_events(&text(&script.stdout));
    let dir = done.dir.expect("collection folder printed");
    let batches = read_table(&dir.join("mm_rss_stat.arrow"));
    let (ts, tgid, mm_id) = (
        column_u64(&batches, "ts_uptime_us"),
        column_u64(&batches, "tgid"),
        column_u64(&batches, "mm_id"),
    );
    let counters: Vec<Vec<u64>> = COUNTERS
        .iter()
        .map(|c| column_u64(&batches, &format!("{c}_pages")))
        .collect();
    let estimated = column_u64(&batches, "estimated");
    let members: Vec<usize> = column_str(&batches, "member")
        .into_iter()
        .map(|m| {
            let m = m.expect("member has no nulls");
            COUNTERS
                .iter()
                .position(|c| *c == m)
                .unwrap_or_else(|| panic!("member {m}"))
        })
        .collect();

    // The toucher's address space is the one its last event changed (its
    // exit tearing it down), in perf's data and in ours.
    let perf_mm = events
        .iter()
        .rev()
        .find(|e| u64::from(e.tid) == pid)
        .map(|e| e.mm_id)
        .expect("perf saw the toucher");
    // An address is reused by later mms (and was by earlier ones): the
    // toucher's mm lives from its first event to its last.
    let mine = |e: &PerfEvent| u64::from(e.tid) == pid && e.mm_id == perf_mm;
    let (Some(born), Some(gone)) = (events.iter().position(mine), events.iter().rposition(mine))
    else {
        panic!("perf saw no event of the toucher's mm");
    };
    let oracle: Vec<PerfEvent> = events[born..=gone]
        .iter()
        .copied()
        .filter(|e| e.mm_id == perf_mm)
        .collect();
    let our_mm = (0..ts.len())
        .rev()
        .find(|&i| tgid[i] == pid)
        .map(|i| mm_id[i])
        .expect("rows of the toucher");
    let mut ours: Vec<usize> = (0..ts.len()).filter(|&i| mm_id[i] == our_mm).collect();
    ours.sort_by_key(|&i| ts[i]);
    let (Some(born), Some(gone)) = (
        ours.iter().position(|&i| tgid[i] == pid),
        ours.iter().rposition(|&i| tgid[i] == pid),
    ) else {
        panic!("no row of the toucher's mm");
    };
    let ours = &ours[born..=gone];
    let expected_rows = 3 * (TOUCH_MIB << 20) / PAGE / 16;
    assert!(
        oracle.len() as u64 > expected_rows,
        "perf saw {} events of the toucher's mm",
        oracle.len()
    );

    let mut state = [0u64; 4];
    let (mut next, mut missing, mut wrong) = (0, 0, Vec::new());
    let mut checked = [0usize; 4];
    for (n, &i) in ours.iter().enumerate() {
        let (member, value) = (members[i], counters[members[i]][i]);
        let from = next;
        while next < oracle.len() && (oracle[next].member, oracle[next].pages) != (member, value) {
            state[oracle[next].member] = oracle[next].pages;
            next += 1;
        }
        assert!(
            next < oracle.len() && next - from <= 2,
            "our row {n} ({} = {value}) is not the kernel's next event: perf from {from}: {:?}",
            COUNTERS[member],
            &oracle[from..(from + 4).min(oracle.len())]
        );
        missing += next - from;
        state[member] = value;
        next += 1;
        assert_eq!(estimated[i], 0, "our row {n}: estimated");
        let row: [u64; 4] = std::array::from_fn(|k| counters[k][i]);
        if row != state {
            wrong.push((n, COUNTERS[member], row, state));
        }
        checked[member] += 1;
    }
    missing += oracle.len() - next;
    eprintln!(
        "mm_rss_stat: {} rows of the toucher's mm checked (file {}, anon {}, swap {}, shmem {}), \
         {} with a counter unlike the kernel's, {missing} of perf's {} events missing",
        ours.len(),
        checked[0],
        checked[1],
        checked[2],
        checked[3],
        wrong.len(),
        oracle.len()
    );
    assert!(
        checked[0] > 50 && checked[1] > 100 && checked[3] > 100,
        "too few rows of a kind: {checked:?}"
    );
    assert!(
        wrong.is_empty(),
        "{} of {} rows have a counter unlike the kernel's (row, changed, ours [file, anon, swap, shmem], kernel's); first: {:?}",
        wrong.len(),
        ours.len(),
        &wrong[..wrong.len().min(8)]
    );
    assert!(
        missing * 1000 <= oracle.len(),
        "{missing} of perf's {} events have no row",
        oracle.len()
    );
}

/// Entries of the collector's `carried` map (the per-mm values): the BPF
/// map that process `pid` holds open with that map's shape (LRU hash, 8-byte
/// key, 40-byte value, 16,384 entries), counted with `bpftool map dump`.
fn carried_entries(pid: u32) -> usize {
    let mut found = Vec::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fdinfo")).expect("fdinfo") {
        let Ok(info) = std::fs::read_to_string(fd.expect("fd").path()) else {
            continue;
        };
        let field = |key: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().to_owned())
        };
        if field("map_type:").as_deref() == Some("9")
            && field("key_size:").as_deref() == Some("8")
            && field("value_size:").as_deref() == Some("40")
            && field("max_entries:").as_deref() == Some("16384")
        {
            found.extend(field("map_id:"));
        }
    }
    found.sort();
    found.dedup();
    assert_eq!(found.len(), 1, "the collector's carried map: {found:?}");
    let out = Command::new("bpftool")
        .args(["--json", "map", "dump", "id", &found[0]])
        .output()
        .expect("bpftool map dump");
    assert!(out.status.success(), "bpftool: {}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bpftool JSON");
    v.as_array().expect("a list of entries").len()
}

/// The per-mm map stays bounded by the live address spaces: each process's
/// mm is deleted from it when its teardown brings all four counters to
/// zero, so 100 processes that lived at the same time leave no entries
/// behind.
#[test]
fn root_mm_rss_stat_forgets_mms_that_are_gone() {
    if !require_root("root_mm_rss_stat_forgets_mms_that_are_gone")
        || !require_tool("root_mm_rss_stat_forgets_mms_that_are_gone", "bpftool")
    {
        return;
    }
    const PROCESSES: usize = 100;
    let _serial = serial();
    let plugins = plugin_dir("mm_rss_forget", &[("mm_rss_stat", "mm_rss_stat")]);
    let output = temp_dir("mm-rss-forget");
    let c = Collector::start(&[
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "mm_rss_stat",
        "--output",
        output.to_str().expect("utf8"),
    ]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = carried_entries(c.pid());
    // All alive at once, so their mms are at distinct addresses (one
    // after another, a freed mm's address is soon a new one's).
    let children: Vec<KillOnDrop> = (0..PROCESSES)
        .map(|_| {
            KillOnDrop(
                Command::new("sleep")
                    .arg("0.5")
                    .spawn()
                    .expect("starting sleep"),
            )
        })
        .collect();
    for mut child in children {
        let status = child.0.wait().expect("waiting for sleep");
        assert!(status.success());
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let after = carried_entries(c.pid());
    let done = c.signal_and_wait(libc::SIGINT);
    assert!(done.status.success(), "kernmlops failed:\n{}", done.stderr);
    let dir = done.dir.expect("collection folder printed");
    let batches = read_table(&dir.join("mm_rss_stat.arrow"));
    let rows = column_u64(&batches, "ts_uptime_us").len();
    eprintln!("carried: {before} entries, {after} after {PROCESSES} processes ({rows} rows)");
    assert!(before > 0, "nothing carried while the machine runs");
    assert!(
        after < before + PROCESSES / 10,
        "{before} entries before {PROCESSES} short-lived processes, {after} after: gone mms are kept"
    );
    assert!(
        rows >= PROCESSES,
        "{rows} rows for {PROCESSES} processes: their mms were not seen"
    );
}
