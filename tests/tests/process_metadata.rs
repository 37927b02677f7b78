//! The process_metadata probe on the running kernel: processes the test
//! starts before and during a collection, with known names, arguments, nice
//! value and cgroup, checked against what `/proc/<pid>/*` says about them.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use arrow_array::{cast::AsArray, types::Int32Type, RecordBatch};
use kernmlops_e2e::*;

fn column_i32(batches: &[RecordBatch], name: &str) -> Vec<i32> {
    batches
        .iter()
        .flat_map(|b| {
            let col = b
                .column_by_name(name)
                .unwrap_or_else(|| panic!("no column {name}"));
            col.as_primitive::<Int32Type>().values().to_vec()
        })
        .collect()
}

fn column_bool(batches: &[RecordBatch], name: &str) -> Vec<bool> {
    batches
        .iter()
        .flat_map(|b| {
            let col = b
                .column_by_name(name)
                .unwrap_or_else(|| panic!("no column {name}"));
            let col = col.as_boolean();
            (0..col.len()).map(|i| col.value(i)).collect::<Vec<_>>()
        })
        .collect()
}

/// What the test knows about one process it started.
struct Spawned {
    name: String,
    argv: Vec<String>,
    child: Child,
    pid: u32,
    /// From /proc/<pid>/stat field 22, in us.
    start_us: u64,
    /// From /proc/<pid>/cgroup.
    cgroup: String,
    new: bool,
}

fn clk_tck() -> u64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as u64 }
}

/// Longest command line the probe keeps (its README).
const CMDLINE_LIMIT: usize = 4096;

/// Starts `bin_dir/name` (a copy of dash waiting on stdin, or exiting at
/// once when `short`) under `nice -n 5`, in `cgroup` if any, with an
/// argument of `long` bytes; returns once the program runs under its own
/// name and its /proc facts are read.
fn spawn(
    bin_dir: &Path,
    name: &str,
    cgroup: Option<&TestCgroup>,
    new: bool,
    short: bool,
    long: usize,
) -> Spawned {
    let path = bin_dir.join(name);
    if !path.exists() {
        std::fs::copy("/bin/sh", &path).expect("copying /bin/sh");
    }
    let long: String = (0..long)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let argv: Vec<String> = vec![
        path.to_str().expect("utf8").to_owned(),
        "-c".into(),
        if short { "exit 0" } else { "read x" }.into(),
        name.to_owned(),
        long,
        "last".into(),
    ];
    let enter = match cgroup {
        Some(cg) => format!("echo $$ > {}/cgroup.procs && ", cg.dir.display()),
        None => String::new(),
    };
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!("{enter}exec nice -n 5 \"$0\" \"$@\""))
        .args(&argv)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawning sh");
    let pid = child.id();
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let deadline = Instant::now() + Duration::from_secs(5);
    // Wait until the final program runs (or, if short, has exited and is a
    // zombie whose /proc files still answer).
    let stat = loop {
        let stat = std::fs::read_to_string(proc_dir.join("stat")).expect("reading stat");
        let named = stat.contains(&format!("({name})"));
        let state = stat.rsplit_once(") ").map(|(_, r)| r.chars().next());
        if named && (!short || state == Some(Some('Z'))) {
            break stat;
        }
        assert!(Instant::now() < deadline, "{name} did not start: {stat}");
        std::thread::sleep(Duration::from_millis(5));
    };
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("stat has a comm")
        .1
        .split_whitespace()
        .collect();
    let start_ticks: u64 = fields[22 - 3].parse().expect("starttime");
    let cgroup_text = std::fs::read_to_string(proc_dir.join("cgroup")).unwrap_or_default();
    let cgroup = cgroup_text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_else(|| panic!("{name}: no 0:: line in {cgroup_text:?}"))
        .to_owned();
    Spawned {
        name: name.to_owned(),
        argv,
        child,
        pid,
        start_us: start_ticks * 1_000_000 / clk_tck(),
        cgroup,
        new,
    }
}

/// Four processes started before the collector and four (one of them
/// short-lived) during it, one of each with a command line over the limit: each has exactly one row under its name, with
/// the right source, ids, parent, nice, full command line, cgroup and start
/// time.
#[test]
fn root_process_metadata_describes_existing_and_new_processes() {
    if !require_root("root_process_metadata_describes_existing_and_new_processes") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("procmeta", &[("process_metadata", "process_metadata")]);
    let output = temp_dir("procmeta-out");
    let bin_dir = temp_dir("procmeta-bins");
    let cgroup = TestCgroup::create("kml-e2e-procmeta");
    if let Some(cg) = &cgroup {
        eprintln!("children run in cgroup {}", cg.path);
    }
    let mut spawned = Vec::new();
    // The last of each kind has a command line longer than the limit.
    let long_of = |i: usize| if i == 3 { 5000 } else { 400 };
    for i in 0..4 {
        let name = format!("kmlt_meta_e{i}");
        let long = long_of(i);
        spawned.push(spawn(&bin_dir, &name, cgroup.as_ref(), false, false, long));
    }
    let c = Collector::start(&[
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "process_metadata",
        "--output",
        output.to_str().expect("utf8"),
    ]);
    for i in 0..4 {
        let name = format!("kmlt_meta_n{i}");
        let long = long_of(i);
        spawned.push(spawn(&bin_dir, &name, cgroup.as_ref(), true, i == 2, long));
    }
    std::thread::sleep(Duration::from_millis(300));
    let done = c.signal_and_wait(libc::SIGINT);
    for s in &mut spawned {
        drop(s.child.stdin.take());
        let _ = s.child.wait();
    }
    drop(cgroup);
    assert!(done.status.success(), "kernmlops failed:\n{}", done.stderr);
    let dir = done.dir.expect("collection folder printed");

    let batches = read_table(&dir.join("process_metadata.arrow"));
    let pid = column_u64(&batches, "pid");
    let tgid = column_u64(&batches, "tgid");
    let ppid = column_u64(&batches, "ppid");
    let start = column_u64(&batches, "start_time_uptime_us");
    let name = column_str(&batches, "name");
    let cmdline = column_str(&batches, "cmdline");
    let cgroup_col = column_str(&batches, "cgroup");
    let source = column_str(&batches, "source");
    let nice = column_i32(&batches, "nice");
    let truncated = column_bool(&batches, "cmdline_truncated");
    let me = u64::from(std::process::id());
    for s in &spawned {
        let rows: Vec<usize> = (0..pid.len())
            .filter(|&i| pid[i] == u64::from(s.pid) && name[i].as_deref() == Some(&s.name))
            .collect();
        let what = format!("{} (pid {})", s.name, s.pid);
        assert_eq!(rows.len(), 1, "{what}: expected one row, got {rows:?}");
        let i = rows[0];
        let want_source = if s.new { "new" } else { "existing" };
        assert_eq!(source[i].as_deref(), Some(want_source), "{what}: source");
        assert_eq!(tgid[i], u64::from(s.pid), "{what}: tgid");
        assert_eq!(ppid[i], me, "{what}: ppid is the test process");
        assert_eq!(nice[i], 5, "{what}: nice");
        let full = s.argv.join(" ");
        let cut = full.len() >= CMDLINE_LIMIT;
        let want = &full[..full.len().min(CMDLINE_LIMIT)];
        assert_eq!(cmdline[i].as_deref(), Some(want), "{what}: cmdline");
        assert_eq!(truncated[i], cut, "{what}: cmdline_truncated");
        assert_eq!(
            cgroup_col[i].as_deref(),
            Some(s.cgroup.as_str()),
            "{what}: cgroup"
        );
        assert!(
            start[i].abs_diff(s.start_us) <= 20_000,
            "{what}: start_time_uptime_us {} vs /proc/<pid>/stat {} us",
            start[i],
            s.start_us
        );
    }
}

/// With --tgid, only that process's tasks have rows, the /proc scan
/// included.
#[test]
fn root_process_metadata_honours_the_tgid_filter() {
    if !require_root("root_process_metadata_honours_the_tgid_filter") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("procmeta-f", &[("process_metadata", "process_metadata")]);
    let output = temp_dir("procmeta-f-out");
    let bin_dir = temp_dir("procmeta-f-bins");
    let mut wanted = spawn(&bin_dir, "kmlt_meta_f0", None, false, false, 10);
    let mut other = spawn(&bin_dir, "kmlt_meta_f1", None, false, false, 10);
    let c = Collector::start(&[
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "process_metadata",
        "--tgid",
        &wanted.pid.to_string(),
        "--output",
        output.to_str().expect("utf8"),
    ]);
    // Some new processes the filter must drop.
    for _ in 0..5 {
        let _ = Command::new("true").status();
    }
    std::thread::sleep(Duration::from_millis(200));
    let done = c.signal_and_wait(libc::SIGINT);
    for s in [&mut wanted, &mut other] {
        drop(s.child.stdin.take());
        let _ = s.child.wait();
    }
    assert!(done.status.success(), "kernmlops failed:\n{}", done.stderr);
    let dir = done.dir.expect("collection folder printed");
    let batches = read_table(&dir.join("process_metadata.arrow"));
    let tgid = column_u64(&batches, "tgid");
    assert!(!tgid.is_empty(), "no row for the filtered process");
    assert!(
        tgid.iter().all(|&t| t == u64::from(wanted.pid)),
        "rows of other processes with --tgid {}: {tgid:?}",
        wanted.pid
    );
}
