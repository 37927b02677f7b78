//! The collector is not in its own data, filters follow cgroup trees, and
//! mm_rss_stat's counters agree with the kernel's own `rss_stat` values:
//! end-to-end on the running kernel, as root.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use arrow_array::{cast::AsArray, Array, RecordBatch};
use kernmlops_e2e::*;

/// Every table of a collection with a `tgid` column, and its values.
fn tgids_by_table(dir: &Path) -> BTreeMap<String, Vec<u64>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("collection folder").flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "arrow") {
            continue;
        }
        let batches = read_table(&path);
        if batches
            .first()
            .is_some_and(|b| b.column_by_name("tgid").is_some())
        {
            let table = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            out.insert(table, column_u64(&batches, "tgid"));
        }
    }
    out
}

/// The BPF probes that record a task's tgid.
const PROBES: &str = "quanta_runtime,process_trace,process_metadata,file_data,mm_rss_stat,block_io";

/// Runs every tgid-recording probe for two seconds while this test opens
/// files and starts processes, and returns the collection and the
/// collector's pid.
fn collect(name: &str, extra: &[&str]) -> (PathBuf, u32, PathBuf) {
    let out = temp_dir(name);
    let mut args = vec!["--plugins", PROBES, "--output", out.to_str().expect("utf8")];
    args.extend_from_slice(extra);
    let c = Collector::start(&args);
    let pid = c.pid();
    for _ in 0..20 {
        let _ = std::fs::read_to_string("/etc/hostname");
        let _ = Command::new("true").status();
        std::thread::sleep(Duration::from_millis(100));
    }
    let done = c.signal_and_wait(libc::SIGINT);
    assert!(done.status.success(), "{}", done.stderr);
    (done.dir.expect("collection folder"), pid, out)
}

#[test]
fn root_the_collector_is_not_in_its_data_unless_asked() {
    if !require_root("root_the_collector_is_not_in_its_data_unless_asked") {
        return;
    }
    let _serial = serial();
    let (dir, pid, out) = collect("purity-default", &[]);
    let tables = tgids_by_table(&dir);
    assert!(tables.len() >= 5, "tables with tgid: {:?}", tables.keys());
    for (table, tgids) in &tables {
        let own = tgids.iter().filter(|&&t| t == u64::from(pid)).count();
        assert_eq!(own, 0, "{table}: {own} rows of the collector ({pid})");
    }
    assert_eq!(manifest(&dir)["include_self"], false);
    std::fs::remove_dir_all(&out).ok();

    let (dir, pid, out) = collect("purity-self", &["--include-self"]);
    let tables = tgids_by_table(&dir);
    let own: usize = tables
        .values()
        .map(|t| t.iter().filter(|&&t| t == u64::from(pid)).count())
        .sum();
    assert!(own > 0, "--include-self kept no row of the collector");
    let switches = tables["quanta_runtime"]
        .iter()
        .filter(|&&t| t == u64::from(pid))
        .count();
    assert!(switches > 0, "the collector's threads ran and switched");
    assert_eq!(manifest(&dir)["include_self"], true);
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn root_cgroup_filter_follows_descendants_unless_exact() {
    if !require_root("root_cgroup_filter_follows_descendants_unless_exact") {
        return;
    }
    let _serial = serial();
    let Some(cg) = TestCgroup::create("kml-e2e-nested") else {
        assert!(!in_ci(), "cgroup v2 is needed for this test");
        eprintln!("SKIP: no cgroup v2 here");
        return;
    };
    // A worker in the child cgroup that sleeps a millisecond at a time, so
    // it leaves the CPU about a thousand times a second. (A busy loop on an
    // idle machine may keep its CPU for the whole second and give no row.)
    let worker = KillOnDrop(
        python3()
            .args(["-c", "import time\nwhile True: time.sleep(0.001)"])
            .stdout(Stdio::null())
            .spawn()
            .expect("starting python3 as the worker"),
    );
    std::fs::write(
        cg.child("child").join("cgroup.procs"),
        worker.id().to_string(),
    )
    .expect("moving the worker into the child cgroup");
    let mut rows = Vec::new();
    for exact in [false, true] {
        let out = temp_dir(&format!("nested-{exact}"));
        let mut args = vec![
            "--plugins",
            "quanta_runtime",
            "--output",
            out.to_str().expect("utf8"),
            "--cgroup",
            cg.dir.to_str().expect("utf8"),
            "--duration",
            "1s",
        ];
        if exact {
            args.push("--cgroup-exact");
        }
        let done = Collector::start(&args).wait();
        assert!(done.status.success(), "{}", done.stderr);
        let dir = done.dir.expect("collection");
        let tgids = column_u64(&read_table(&dir.join("quanta_runtime.arrow")), "tgid");
        let worker_rows = tgids
            .iter()
            .filter(|&&t| t == u64::from(worker.id()))
            .count();
        assert_eq!(
            worker_rows,
            tgids.len(),
            "only the worker is in the cgroup tree"
        );
        rows.push(worker_rows);
        std::fs::remove_dir_all(&out).ok();
    }
    drop(worker);
    assert!(
        rows[0] > 100,
        "the parent's filter sees the child cgroup's task: {} rows in 1 s",
        rows[0]
    );
    assert_eq!(
        rows[1], 0,
        "--cgroup-exact sees only the parent cgroup itself"
    );
}

/// `perf script` lines of `kmem:rss_stat` for one pid: (member, pages) in
/// order.
fn perf_rss_values(script: &str, pid: u32) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for line in script.lines() {
        // "perl  1234 [000] 12.345: kmem:rss_stat: mm_id=... curr=1 type=MM_ANONPAGES size=123456B"
        let mut words = line.split_whitespace();
        let _comm = words.next();
        let Some(p) = words.next().and_then(|w| w.parse::<u32>().ok()) else {
            continue;
        };
        if p != pid {
            continue;
        }
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .map(str::to_owned)
        };
        let (Some(kind), Some(size)) = (field("type="), field("size=")) else {
            continue;
        };
        let member = match kind.as_str() {
            "MM_FILEPAGES" => "file",
            "MM_ANONPAGES" => "anon",
            "MM_SWAPENTS" => "swap",
            "MM_SHMEMPAGES" => "shmem",
            _ => continue,
        };
        let Some(bytes) = size.strip_suffix('B').and_then(|b| b.parse::<u64>().ok()) else {
            continue;
        };
        out.push((member.to_owned(), bytes / 4096));
    }
    out
}

fn str_column(batches: &[RecordBatch], name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        let col = b.column_by_name(name).expect("column");
        if let Some(dict) = col.as_any_dictionary_opt() {
            let values = dict.values().as_string::<i32>();
            for k in dict.normalized_keys() {
                out.push(values.value(k).to_owned());
            }
        } else {
            let s = col.as_string::<i32>();
            out.extend((0..s.len()).map(|i| s.value(i).to_owned()));
        }
    }
    out
}

#[test]
fn root_mm_rss_stat_agrees_with_the_kernel_tracepoint() {
    if !require_root("root_mm_rss_stat_agrees_with_the_kernel_tracepoint")
        || !require_tool("root_mm_rss_stat_agrees_with_the_kernel_tracepoint", "perf")
    {
        return;
    }
    let _serial = serial();
    let work = temp_dir("rss-perf");
    let out = work.join("data");
    let c = Collector::start(&[
        "--plugins",
        "mm_rss_stat",
        "--output",
        out.to_str().expect("utf8"),
    ]);
    let perf_data = work.join("perf.data");
    let mut perf = Command::new("perf")
        .args(["record", "-q", "-e", "kmem:rss_stat", "-a", "-o"])
        .arg(&perf_data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("perf record");
    std::thread::sleep(Duration::from_millis(700));
    // A program that touches 32 MiB of anonymous memory it knows about.
    let toucher = Command::new("perl")
        .args([
            "-e",
            "my $x = \"a\" x (32*1024*1024); select(undef,undef,undef,0.3);",
        ])
        .spawn()
        .expect("perl");
    let toucher_pid = toucher.id();
    let status = toucher.wait_with_output().expect("perl").status;
    assert!(status.success());
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: signalling a child we spawned.
    unsafe { libc::kill(perf.id() as i32, libc::SIGINT) };
    let _ = perf.wait();
    let done = c.signal_and_wait(libc::SIGINT);
    assert!(done.status.success(), "{}", done.stderr);
    let script = Command::new("perf")
        .args(["script", "-i"])
        .arg(&perf_data)
        .output()
        .expect("perf script");
    let script_text = String::from_utf8_lossy(&script.stdout);
    let want = perf_rss_values(&script_text, toucher_pid);

    let dir = done.dir.expect("collection");
    let batches = read_table(&dir.join("mm_rss_stat.arrow"));
    let ts = column_u64(&batches, "ts_uptime_us");
    let tgid = column_u64(&batches, "tgid");
    let pid = column_u64(&batches, "pid");
    let member = str_column(&batches, "member");
    let mut ours: Vec<(u64, String, u64)> = Vec::new();
    for i in 0..ts.len() {
        if pid[i] != u64::from(toucher_pid) || tgid[i] != u64::from(toucher_pid) {
            continue;
        }
        let value = column_u64(&batches, &format!("{}_pages", member[i]))[i];
        ours.push((ts[i], member[i].clone(), value));
    }
    ours.sort_by_key(|r| r.0);
    let ours: Vec<(String, u64)> = ours.into_iter().map(|(_, m, v)| (m, v)).collect();
    assert!(
        want.len() > 100,
        "perf saw {} rss_stat events of the toucher ({toucher_pid}) in {} lines; perf script: {}",
        want.len(),
        script_text.lines().count(),
        String::from_utf8_lossy(&script.stderr)
    );
    // Our rows are perf's rows in order, each with the tracepoint's value.
    // An event one of whose halves did not run (the kernel skips a program
    // it would re-enter) is missing (about one in 100,000 here), never
    // wrong: a wrong value matches no row nearby and leaves a long gap.
    let mut next = 0;
    let mut missing = 0;
    for (i, row) in ours.iter().enumerate() {
        let from = next;
        while next < want.len() && want[next] != *row {
            next += 1;
        }
        assert!(
            next < want.len(),
            "our row {i} {row:?} is not among perf's rows from {from} on: ours {:?}, perf {:?}",
            &ours[i.saturating_sub(3)..(i + 3).min(ours.len())],
            &want[from.saturating_sub(3)..(from + 3).min(want.len())]
        );
        assert!(
            next - from <= 2,
            "perf has {} rows ours lacks before our row {i} {row:?}: a wrong value, not a missed event; perf {:?}",
            next - from,
            &want[from..(from + 6).min(want.len())]
        );
        missing += next - from;
        next += 1;
    }
    missing += want.len() - next;
    let lost = manifest(&dir)["tables"]["mm_rss_stat"]["lost_events"]
        .as_u64()
        .expect("lost_events");
    assert!(
        missing * 1000 <= want.len(),
        "{missing} of perf's {} rss_stat events of the toucher are missing from ours, {lost} counted lost; the run said:\n{}",
        want.len(),
        done.stdout
    );
    eprintln!(
        "mm_rss_stat: {} rows equal to the tracepoint's, {missing} of {} events missed, {lost} counted lost in the whole table",
        ours.len(),
        want.len()
    );
    let peak_anon = ours
        .iter()
        .filter(|(m, _)| m == "anon")
        .map(|(_, v)| *v)
        .max()
        .unwrap_or(0);
    assert!(
        peak_anon >= 32 * 256,
        "32 MiB touched, anon peaked at {peak_anon} pages"
    );
    std::fs::remove_dir_all(&work).ok();
}
