//! mm_rss_stat on the running kernel: a process that maps and touches
//! 64 MiB of anonymous memory shows its anon page count grow by that much,
//! and its last count agrees with the kernel's own `/proc/PID/status`.

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
    // The kernel's own count, read by the process after touching.
    let last = anon.last().copied().unwrap_or(0);
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
}
