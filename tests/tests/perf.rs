//! The `perf` probe and `kernmlops perf-list` on the running kernel, checked
//! against perf itself: `perf stat` counts of the same workload, and perf's
//! own verdict on which events this machine supports.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use kernmlops_e2e::*;

/// A page-fault burst (100k fresh 4 KiB pages, huge pages refused) and a
/// context-switch burst (about 100k switches), as one shell script.
const WORKLOAD: &str = r#"
python3 -c '
import mmap
n = 100000 * 4096
m = mmap.mmap(-1, n)
m.madvise(mmap.MADV_NOHUGEPAGE)
for i in range(0, n, 4096):
    m[i] = 1
'
perf bench sched pipe -l 50000 > /dev/null
"#;

/// The counters compared with perf stat: (table, perf's event name).
const SOFTWARE: &[(&str, &str)] = &[
    ("page_faults", "page-faults"),
    ("context_switches", "context-switches"),
];

fn perf_plugins(name: &str) -> PathBuf {
    plugin_dir(name, &[("perf", "perf")])
}

fn write_config(name: &str, text: &str) -> PathBuf {
    let path = temp_dir(name).join("kernmlops.toml");
    std::fs::write(&path, text).expect("writing config");
    path
}

/// Parses `perf stat -x,` output into event -> count (None when perf says
/// `<not supported>` or `<not counted>`). With `-G`, the cgroup is a column
/// after the event name; the event name stays the third field.
fn perf_counts(csv: &str) -> BTreeMap<String, Option<u64>> {
    csv.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            Some((f.get(2)?.to_string(), f.first()?.parse().ok()))
        })
        .collect()
}

/// Runs `perf stat -x, ARGS` and returns its counts.
fn perf_stat(name: &str, args: &[&str]) -> BTreeMap<String, Option<u64>> {
    let csv = temp_dir(name).join("perf.csv");
    let status = Command::new("perf")
        .args(["stat", "-x,", "-o"])
        .arg(&csv)
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("running perf stat");
    assert!(status.success(), "perf stat {args:?} failed");
    perf_counts(&std::fs::read_to_string(&csv).expect("perf stat output"))
}

/// The sum over CPUs of the counter's growth between each CPU's last
/// sample at or before `t0` and its first sample at or after `t1`, and the
/// earliest and latest of those samples' times.
fn bracketed_delta(dir: &Path, table: &str, t0: u64, t1: u64) -> (u64, u64, u64) {
    let batches = read_table(&dir.join(format!("{table}.arrow")));
    let ts = column_u64(&batches, "ts_uptime_us");
    let cpu = column_u64(&batches, "cpu");
    let count = column_u64(&batches, "count");
    let mut before: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut after: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for i in 0..ts.len() {
        if ts[i] <= t0 {
            let e = before.entry(cpu[i]).or_insert((ts[i], count[i]));
            if ts[i] >= e.0 {
                *e = (ts[i], count[i]);
            }
        }
        if ts[i] >= t1 {
            let e = after.entry(cpu[i]).or_insert((ts[i], count[i]));
            if ts[i] <= e.0 {
                *e = (ts[i], count[i]);
            }
        }
    }
    assert!(
        !before.is_empty() && before.keys().eq(after.keys()),
        "{table}: every CPU needs a sample before and after the window: {before:?} {after:?}"
    );
    let mut delta = 0;
    for (c, (_, b)) in &before {
        let a = after[c].1;
        assert!(a >= *b, "{table}: count went down on CPU {c}");
        delta += a - b;
    }
    let first = before.values().map(|v| v.0).min().unwrap_or(t0);
    let last = after.values().map(|v| v.0).max().unwrap_or(t1);
    (delta, first, last)
}

/// The counter's rate (events/s, all CPUs) over `[from, to]`, from the
/// samples nearest inside it.
fn rate(dir: &Path, table: &str, from: u64, to: u64) -> f64 {
    let batches = read_table(&dir.join(format!("{table}.arrow")));
    let ts = column_u64(&batches, "ts_uptime_us");
    let cpu = column_u64(&batches, "cpu");
    let count = column_u64(&batches, "count");
    let mut first: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut last: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for i in (0..ts.len()).filter(|&i| ts[i] >= from && ts[i] <= to) {
        first.entry(cpu[i]).or_insert((ts[i], count[i]));
        last.insert(cpu[i], (ts[i], count[i]));
    }
    let mut r = 0.0;
    for (c, (t_a, n_a)) in &first {
        let (t_b, n_b) = last[c];
        if t_b > *t_a {
            r += (n_b - n_a) as f64 / ((t_b - t_a) as f64 / 1e6);
        }
    }
    r
}

fn collect_config(name: &str) -> PathBuf {
    write_config(
        name,
        "[probes.perf]\ncounters = [\"page_faults\", \"context_switches\"]\nfrequency_hz = 100\n",
    )
}

/// System-wide: the workload under `perf stat -a` while the probe samples
/// every CPU at 100 Hz. The probe's samples bracketing the perf stat
/// command contain perf's counting window, so their growth is at least
/// perf's total (less 5%), and at most 5% above it plus what the rest of
/// the machine did in the extra bracket time (the rate measured by the
/// probe in the second before, times the whole bracket: generous, since
/// other builds may run on this machine).
#[test]
fn root_perf_system_wide_counts_agree_with_perf_stat() {
    let test = "root_perf_system_wide_counts_agree_with_perf_stat";
    if !require_root(test) || !require_tool(test, "perf") || !require_tool(test, "python3") {
        return;
    }
    let _serial = serial();
    let plugins = perf_plugins("perf-sys");
    let config = collect_config("perf-sys-config");
    let output = temp_dir("perf-sys-out");
    let c = Collector::start(&[
        "--config",
        config.to_str().expect("utf8"),
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "perf",
        "--output",
        output.to_str().expect("utf8"),
    ]);
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let t0 = uptime_us();
    let counts = perf_stat(
        "perf-sys-stat",
        &[
            "-a",
            "-e",
            "page-faults,context-switches",
            "--",
            "sh",
            "-c",
            WORKLOAD,
        ],
    );
    let t1 = uptime_us();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let done = c.signal_and_wait(libc::SIGTERM);
    assert!(done.status.success(), "kernmlops failed:\n{}", done.stderr);
    let dir = done.dir.expect("collection folder printed");

    for (table, event) in SOFTWARE {
        let reference = burst_count(&counts, event);
        let (delta, first, last) = bracketed_delta(&dir, table, t0, t1);
        let background = rate(&dir, table, t0.saturating_sub(1_000_000), t0);
        let extra = background * (last - first) as f64 / 1e6;
        eprintln!(
            "{table}: probe {delta} vs perf stat {reference} (ratio {:.4}); background {background:.0}/s, bracket {} us",
            delta as f64 / reference as f64,
            last - first
        );
        assert!(
            delta as f64 >= reference as f64 * 0.95,
            "{table}: the probe saw {delta}, fewer than perf stat's {reference} in a window containing perf's"
        );
        assert!(
            delta as f64 <= reference as f64 * 1.05 + extra,
            "{table}: the probe saw {delta}, more than perf stat's {reference} + 5% + {extra:.0} background"
        );
    }
}

/// perf stat's count of `event`, which the workload makes a burst of.
fn burst_count(counts: &BTreeMap<String, Option<u64>>, event: &str) -> u64 {
    let reference = counts
        .get(event)
        .copied()
        .flatten()
        .unwrap_or_else(|| panic!("perf stat did not count {event}: {counts:?}"));
    assert!(
        reference > 90_000,
        "the workload should make a burst of {event}, perf saw {reference}"
    );
    reference
}

/// With `--cgroup`, only the cgroup's tasks count: the workload joins a
/// fresh cgroup under `perf stat -a -G`, so the probe and perf count the
/// same events whatever else the machine does, and agree within 5%.
#[test]
fn root_perf_cgroup_counts_agree_with_perf_stat() {
    let test = "root_perf_cgroup_counts_agree_with_perf_stat";
    if !require_root(test) || !require_tool(test, "perf") || !require_tool(test, "python3") {
        return;
    }
    let Some(mount) = cgroup2_mount() else {
        assert!(!in_ci(), "{test}: CI needs a cgroup v2 mount");
        eprintln!("SKIP {test}: no cgroup v2 mount");
        return;
    };
    let _serial = serial();
    let name = format!("kml-perf-test-{}", std::process::id());
    let cgroup = mount.join(&name);
    std::fs::create_dir_all(&cgroup).expect("creating a cgroup");
    let plugins = perf_plugins("perf-cg");
    let config = collect_config("perf-cg-config");
    let output = temp_dir("perf-cg-out");
    let c = Collector::start(&[
        "--config",
        config.to_str().expect("utf8"),
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "perf",
        "--cgroup",
        cgroup.to_str().expect("utf8"),
        "--output",
        output.to_str().expect("utf8"),
    ]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let script = format!("echo $$ > {}/cgroup.procs\n{WORKLOAD}", cgroup.display());
    let t0 = uptime_us();
    let counts = perf_stat(
        "perf-cg-stat",
        &[
            "-a",
            "-e",
            "page-faults,context-switches",
            "-G",
            &format!("{name},{name}"),
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    let t1 = uptime_us();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let done = c.signal_and_wait(libc::SIGTERM);
    let _ = std::fs::remove_dir(&cgroup);
    assert!(done.status.success(), "kernmlops failed:\n{}", done.stderr);
    let dir = done.dir.expect("collection folder printed");

    for (table, event) in SOFTWARE {
        let reference = burst_count(&counts, event);
        let (delta, _, _) = bracketed_delta(&dir, table, t0, t1);
        let ratio = delta as f64 / reference as f64;
        eprintln!("{table} in cgroup: probe {delta} vs perf stat {reference} (ratio {ratio:.4})");
        assert!(
            (ratio - 1.0).abs() <= 0.05,
            "{table}: the probe saw {delta}, perf stat {reference}"
        );
    }
}

/// Whether perf itself can count `event` here (`<not supported>` otherwise).
fn perf_supports(event: &str) -> bool {
    let counts = perf_stat(
        &format!("perf-support-{event}"),
        &["-a", "-e", event, "--", "true"],
    );
    counts.get(event).copied().flatten().is_some()
}

/// The default counters on this machine: each TLB hardware counter perf
/// cannot count here is skipped with a note on stderr and in the manifest,
/// and its table is absent (no file, not in the summary); the software ones
/// are collected; exit 0. With `--strict` the same notes fail the run.
#[test]
fn root_perf_missing_counters_are_notes() {
    let test = "root_perf_missing_counters_are_notes";
    if !require_root(test) || !require_tool(test, "perf") {
        return;
    }
    let _serial = serial();
    let plugins = perf_plugins("perf-notes");
    let output = temp_dir("perf-notes-out");
    let args = [
        "run",
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "perf",
        "--duration",
        "1s",
        "--output",
        output.to_str().expect("utf8"),
    ];
    let out = kernmlops(&args);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "kernmlops failed:\n{stderr}");
    let dir = PathBuf::from(
        text(&out.stdout)
            .lines()
            .find_map(|l| {
                l.strip_prefix("collection ")?
                    .split_once(" in ")
                    .map(|(_, d)| d.trim().to_owned())
            })
            .expect("collection folder printed"),
    );
    let man = manifest(&dir);
    let probe = man["probes"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "perf"))
        .expect("perf in the manifest");
    let notes: Vec<&str> = probe["notes"]
        .as_array()
        .map(|n| n.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();

    let mut expected_notes = Vec::new();
    for (table, event) in [
        ("dtlb_misses", "dTLB-load-misses"),
        ("itlb_misses", "iTLB-load-misses"),
    ] {
        let file = dir.join(format!("{table}.arrow"));
        if perf_supports(event) {
            assert!(
                file.is_file(),
                "{table}: perf counts {event} here, so the table must exist"
            );
            assert!(!column_u64(&read_table(&file), "count").is_empty());
        } else {
            let note = format!(
                "hardware counter {table} ({event}) is not supported on this machine: skipped"
            );
            assert!(stderr.contains(&note), "stderr lacks {note:?}:\n{stderr}");
            assert!(
                notes.contains(&note.as_str()),
                "manifest notes lack {note:?}: {notes:?}"
            );
            assert!(
                !file.exists(),
                "{table}: a skipped counter has no table file"
            );
            expected_notes.push(note);
        }
    }
    for (table, _) in SOFTWARE {
        let rows = column_u64(&read_table(&dir.join(format!("{table}.arrow"))), "count");
        assert!(!rows.is_empty(), "{table} has rows");
    }

    if !notes.is_empty() {
        let mut strict = args.to_vec();
        strict.push("--strict");
        let out = kernmlops(&strict);
        let stderr = text(&out.stderr);
        assert!(
            !out.status.success(),
            "--strict must fail with notes:\n{stderr}"
        );
        assert!(stderr.contains("--strict: "), "{stderr}");
        for note in &expected_notes {
            assert!(
                stderr.contains(note.as_str()),
                "--strict error lacks {note:?}:\n{stderr}"
            );
        }
    }
}

/// `perf-list --json` is JSON with the summaries and an `events` array;
/// the software events open; each hardware event's `supported` matches what
/// perf stat says about it here, and the hardware summary agrees (how many
/// open, and why none does); every sysfs PMU event is listed; the text form
/// has its columns and the same summary line.
#[test]
fn root_perf_list_agrees_with_perf() {
    let test = "root_perf_list_agrees_with_perf";
    if !require_root(test) || !require_tool(test, "perf") {
        return;
    }
    let out = kernmlops(&["perf-list", "--json"]);
    assert!(
        out.status.success(),
        "perf-list failed: {}",
        text(&out.stderr)
    );
    let listing: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("perf-list --json prints JSON");
    let events = listing["events"].as_array().expect("an events array");
    for e in events {
        for key in [
            "name",
            "pmu",
            "source",
            "class",
            "umasks",
            "type",
            "config",
            "event",
            "supported",
            "checked",
            "description",
        ] {
            assert!(e.get(key).is_some(), "event lacks {key}: {e}");
        }
        assert!(e["umasks"].is_array(), "{e}");
    }
    let find = |name: &str| {
        events
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("perf-list lacks {name}"))
    };
    for name in ["page-faults", "context-switches"] {
        assert_eq!(find(name)["supported"], true, "{name} opens here");
        assert_eq!(find(name)["pmu"], "software");
        assert_eq!(find(name)["checked"], "system-wide on CPU 0", "as root");
    }
    let mut unsupported = 0;
    for name in [
        "cpu-cycles",
        "instructions",
        "dTLB-load-misses",
        "iTLB-load-misses",
    ] {
        let supported = perf_supports(name);
        assert_eq!(
            find(name)["supported"],
            supported,
            "{name}: perf-list and perf stat disagree"
        );
        assert_eq!(find(name)["class"], "hardware");
        unsupported += usize::from(!supported);
    }
    let hardware = &listing["hardware"];
    let summary = hardware["summary"].as_str().expect("hardware summary");
    let open = hardware["open"].as_u64().expect("hardware open count");
    eprintln!("{summary}");
    if unsupported == 4 {
        assert!(
            summary.contains("none of") && summary.contains("opens here"),
            "{summary}"
        );
        if !Path::new("/sys/bus/event_source/devices/cpu").exists() {
            assert_eq!(open, 0, "no CPU PMU, yet {open} hardware events opened");
            assert!(summary.contains("no CPU PMU"), "{summary}");
        }
    } else {
        assert!(open > 0, "perf counts hardware events here: {summary}");
    }
    let libpfm4 = listing["libpfm4"]["summary"]
        .as_str()
        .expect("libpfm4 summary");
    eprintln!("{libpfm4}");
    // Every sysfs PMU event is listed under its PMU.
    for pmu in std::fs::read_dir("/sys/bus/event_source/devices")
        .expect("sysfs PMUs")
        .flatten()
    {
        let Ok(evs) = std::fs::read_dir(pmu.path().join("events")) else {
            continue;
        };
        for ev in evs.flatten() {
            let name = ev.file_name().to_string_lossy().into_owned();
            if name.contains(".scale")
                || name.contains(".unit")
                || name.ends_with(".per-pkg")
                || name.ends_with(".snapshot")
            {
                continue;
            }
            let pmu_name = pmu.file_name().to_string_lossy().into_owned();
            assert!(
                events.iter().any(|e| e["name"] == name.as_str()
                    && e["pmu"] == pmu_name.as_str()
                    && e["source"] == "sysfs"),
                "perf-list lacks {pmu_name}/{name}"
            );
        }
    }
    let out = kernmlops(&["perf-list"]);
    let table = text(&out.stdout);
    assert!(out.status.success());
    let header: Vec<&str> = table
        .lines()
        .next()
        .expect("a header line")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "PMU",
            "OPENS",
            "TYPE/CONFIG",
            "UMASKS",
            "DESCRIPTION"
        ],
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("page-faults ") && l.contains(" yes ")),
        "{table}"
    );
    assert!(table.lines().any(|l| l == summary), "{table}");
    assert!(table.lines().any(|l| l == libpfm4), "{table}");
}

/// perf's own attribute for `event`: type and config of the first
/// `perf_event_attr` block `perf stat -vv` prints (perf leaves zero fields
/// out).
fn perf_attr(event: &str) -> (u64, u64) {
    let out = Command::new("perf")
        .args(["stat", "-vv", "-e", event, "true"])
        .output()
        .expect("running perf stat -vv");
    let err = text(&out.stderr);
    let block = err
        .split("perf_event_attr:")
        .nth(1)
        .unwrap_or_else(|| panic!("perf stat -vv -e {event} printed no attribute:\n{err}"));
    let block = block.split("------").next().unwrap_or("");
    let field = |name: &str| {
        block.lines().find_map(|l| {
            let mut words = l.split_whitespace();
            (words.next()? == name).then(|| words.next().map(str::to_owned))?
        })
    };
    let number = |v: String| {
        match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16),
            None => v.parse(),
        }
        .unwrap_or_else(|_| panic!("perf printed {v:?} for {event}"))
    };
    (
        field("type").map(number).unwrap_or(0),
        field("config").map(number).unwrap_or(0),
    )
}

/// `kernmlops perf-list --resolve NAME --json`.
fn resolve_json(name: &str, env: &[(&str, &str)]) -> serde_json::Value {
    let out = kernmlops_env(&["perf-list", "--resolve", name, "--json"], env);
    assert!(
        out.status.success(),
        "perf-list --resolve {name} failed: {}",
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("perf-list --resolve --json prints JSON")
}

fn kernmlops_env(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    Command::new(kernmlops_bin())
        .args(args)
        .envs(env.iter().copied())
        .current_dir(workspace_root())
        .output()
        .expect("running kernmlops")
}

fn hex(v: &serde_json::Value) -> u64 {
    let s = v.as_str().unwrap_or_else(|| panic!("{v} is not a string"));
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or_else(|_| panic!("{s}"))
}

/// libpfm4 initialises here and, in the collector's process, resolves
/// libpfm4's names of generic events (PERF_COUNT_HW_CPU_CYCLES,
/// PERF_COUNT_SW_CONTEXT_SWITCHES, ...) to the type and config perf itself
/// uses for the same events (`perf stat -vv`); perf's own names resolve the
/// same; an unknown name is one clear error line.
#[test]
fn root_perf_list_resolve_agrees_with_perf() {
    let test = "root_perf_list_resolve_agrees_with_perf";
    if !require_root(test) || !require_tool(test, "perf") {
        return;
    }
    let listing: serde_json::Value =
        serde_json::from_slice(&kernmlops(&["perf-list", "--json"]).stdout)
            .expect("perf-list --json prints JSON");
    assert_eq!(
        listing["libpfm4"]["available"], true,
        "libpfm4 must load here (scripts/setup.sh installs it): {}",
        listing["libpfm4"]["summary"]
    );
    for (pfm_name, perf_name) in [
        ("PERF_COUNT_HW_CPU_CYCLES", "cycles"),
        ("PERF_COUNT_HW_INSTRUCTIONS", "instructions"),
        ("PERF_COUNT_SW_CONTEXT_SWITCHES", "context-switches"),
        ("PERF_COUNT_SW_PAGE_FAULTS", "page-faults"),
        ("PERF_COUNT_HW_CACHE_DTLB:READ:MISS", "dTLB-load-misses"),
    ] {
        let reference = perf_attr(perf_name);
        let by_pfm = resolve_json(pfm_name, &[]);
        let by_perf = resolve_json(perf_name, &[]);
        eprintln!(
            "{pfm_name}: {} type {} config {}; perf's {perf_name}: type {} config {:#x}",
            by_pfm["source"], by_pfm["type"], by_pfm["config"], reference.0, reference.1
        );
        assert!(
            by_pfm["source"]
                .as_str()
                .is_some_and(|s| s.starts_with("libpfm4 event perf::")),
            "{pfm_name} is libpfm4's name: {by_pfm}"
        );
        for r in [&by_pfm, &by_perf] {
            assert_eq!(
                (r["type"].as_u64().expect("type"), hex(&r["config"])),
                reference,
                "{} resolves unlike perf's {perf_name}",
                r["name"]
            );
        }
        assert_eq!(by_pfm["supported"], by_perf["supported"]);
    }
    let out = kernmlops(&["perf-list", "--resolve", "no_such_event_kml"]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "an unknown event must fail");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.starts_with("error: no event \"no_such_event_kml\" here: ") && err.contains("libpfm4"),
        "{err}"
    );
}

/// libpfm4's tables in perf-list and in resolution, on a Skylake forced
/// with `LIBPFM_FORCE_PMU=skl` so this runs on any machine (the codes are
/// Intel's: TLB_FLUSH is event 0xbd, unit masks DTLB_THREAD 0x01 and
/// STLB_ANY 0x20); and a machine without libpfm4 (the library pointed at a
/// missing file): generic and sysfs events are listed as before, with a
/// line saying to install libpfm4.
#[test]
fn perf_list_shows_libpfm_tables_and_their_absence() {
    let skl = [("LIBPFM_FORCE_PMU", "skl")];
    let out = kernmlops_env(&["perf-list", "--json"], &skl);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listing: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    if listing["libpfm4"]["available"] != true {
        assert!(
            !in_ci(),
            "CI must install libpfm4: {}",
            listing["libpfm4"]["summary"]
        );
        eprintln!(
            "SKIP perf_list_shows_libpfm_tables_and_their_absence: {}",
            listing["libpfm4"]["summary"]
        );
        return;
    }
    let events = listing["events"].as_array().expect("events");
    let tlb = events
        .iter()
        .find(|e| e["pmu"] == "skl" && e["name"] == "TLB_FLUSH")
        .unwrap_or_else(|| panic!("no skl TLB_FLUSH: {}", listing["libpfm4"]));
    assert_eq!(tlb["source"], "libpfm4");
    assert_eq!(tlb["class"], "hardware");
    let umasks: Vec<&str> = tlb["umasks"]
        .as_array()
        .expect("umasks")
        .iter()
        .filter_map(|u| u["name"].as_str())
        .collect();
    assert_eq!(umasks, ["DTLB_THREAD", "STLB_ANY"]);
    assert_eq!(tlb["event"], "skl::TLB_FLUSH:DTLB_THREAD");
    assert_eq!(hex(&tlb["config"]), 0x1bd);
    let r = resolve_json("tlb_flush.stlb_any", &skl);
    assert_eq!((r["type"].as_u64(), hex(&r["config"])), (Some(4), 0x20bd));
    assert_eq!(r["source"], "libpfm4 event skl::TLB_FLUSH:STLB_ANY");
    let out = kernmlops_env(&["perf-list"], &skl);
    let table = text(&out.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("TLB_FLUSH ") && l.contains(" DTLB_THREAD,STLB_ANY ")),
        "{table}"
    );

    let missing = [("KERNMLOPS_LIBPFM", "/nonexistent/libpfm.so.4")];
    let out = kernmlops_env(&["perf-list", "--json"], &missing);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listing: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(listing["libpfm4"]["available"], false);
    let hint = "install libpfm4 to resolve model-specific events";
    let summary = listing["libpfm4"]["summary"].as_str().expect("summary");
    assert!(summary.contains(hint), "{summary}");
    let events = listing["events"].as_array().expect("events");
    assert!(events.iter().all(|e| e["source"] != "libpfm4"));
    for name in ["cpu-cycles", "context-switches"] {
        assert!(events.iter().any(|e| e["name"] == name), "{name} listed");
    }
    let out = kernmlops_env(&["perf-list"], &missing);
    assert!(text(&out.stdout).lines().any(|l| l == summary));
    let out = kernmlops_env(&["perf-list", "--resolve", "tlb_flush.stlb_any"], &missing);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains(hint), "{}", text(&out.stderr));
}

/// The probe's model-specific counters come from libpfm4, in process: on a
/// forced Skylake, tlb_flushes resolves to tlb_flush.dtlb_thread (then
/// opens, or is skipped because the kernel has no such PMU, as here);
/// without libpfm4 the note says to install it. The software counters are
/// collected either way.
#[test]
fn root_perf_model_specific_counters_follow_libpfm() {
    let test = "root_perf_model_specific_counters_follow_libpfm";
    if !require_root(test) {
        return;
    }
    let _serial = serial();
    let plugins = perf_plugins("perf-pfm");
    let run = |name: &str, env: &[(&str, &str)]| {
        let output = temp_dir(name);
        let out = kernmlops_env(
            &[
                "run",
                "--plugin-dir",
                plugins.to_str().expect("utf8"),
                "--plugins",
                "perf",
                "--duration",
                "1s",
                "--output",
                output.to_str().expect("utf8"),
            ],
            env,
        );
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "kernmlops failed:\n{stderr}");
        let dir = PathBuf::from(
            text(&out.stdout)
                .lines()
                .find_map(|l| {
                    l.strip_prefix("collection ")?
                        .split_once(" in ")
                        .map(|(_, d)| d.trim().to_owned())
                })
                .expect("collection folder printed"),
        );
        for (table, _) in SOFTWARE {
            let rows = column_u64(&read_table(&dir.join(format!("{table}.arrow"))), "count");
            assert!(!rows.is_empty(), "{table} has rows");
        }
        (stderr, dir)
    };
    let (stderr, dir) = run("perf-pfm-skl", &[("LIBPFM_FORCE_PMU", "skl")]);
    if !dir.join("tlb_flushes.arrow").exists() {
        let note =
            "PMU counter tlb_flushes (tlb_flush.dtlb_thread) is not supported on this machine: skipped";
        assert!(stderr.contains(note), "stderr lacks {note:?}:\n{stderr}");
    }
    let (stderr, dir) = run(
        "perf-pfm-missing",
        &[("KERNMLOPS_LIBPFM", "/nonexistent/libpfm.so.4")],
    );
    if !dir.join("tlb_flushes.arrow").exists() {
        assert!(
            stderr.lines().any(|l| l.contains("tlb_flushes")
                && l.contains("install libpfm4 to resolve model-specific events")),
            "{stderr}"
        );
    }
}

/// A process that waits for a line on stdin, touches 100k fresh pages,
/// prints how many page faults the kernel charged it for that (minflt +
/// majflt from /proc/self/stat), and waits for another line to exit.
const FAULTER: &str = r#"
import mmap, sys
def faults():
    f = open('/proc/self/stat').read().rsplit(')', 1)[1].split()
    return int(f[7]) + int(f[9])
sys.stdin.readline()
a = faults()
n = 100000 * 4096
m = mmap.mmap(-1, n)
m.madvise(mmap.MADV_NOHUGEPAGE)
for i in range(0, n, 4096):
    m[i] = 1
print(faults() - a, flush=True)
sys.stdin.readline()
"#;

/// With `--tgid`, only that process counts: its page faults during the
/// burst agree within 5% with the kernel's own per-process fault counters,
/// whatever else the machine does.
#[test]
fn root_perf_tgid_filter_counts_the_process() {
    use std::io::{BufRead, Write};
    let test = "root_perf_tgid_filter_counts_the_process";
    if !require_root(test) || !require_tool(test, "python3") {
        return;
    }
    let _serial = serial();
    let mut child = Command::new("python3")
        .args(["-c", FAULTER])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("starting python3");
    let plugins = perf_plugins("perf-tgid");
    let config = collect_config("perf-tgid-config");
    let output = temp_dir("perf-tgid-out");
    let tgid = child.id().to_string();
    let c = Collector::start(&[
        "--config",
        config.to_str().expect("utf8"),
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "perf",
        "--tgid",
        &tgid,
        "--output",
        output.to_str().expect("utf8"),
    ]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut stdin = child.stdin.take().expect("stdin piped");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout piped"));
    let t0 = uptime_us();
    writeln!(stdin, "go").expect("starting the burst");
    let mut line = String::new();
    stdout
        .read_line(&mut line)
        .expect("reading the fault count");
    let t1 = uptime_us();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let done = c.signal_and_wait(libc::SIGTERM);
    writeln!(stdin, "end").expect("ending the child");
    let _ = child.wait();
    assert!(done.status.success(), "kernmlops failed:\n{}", done.stderr);
    let dir = done.dir.expect("collection folder printed");

    let reference: u64 = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("the child printed {line:?}"));
    assert!(
        reference > 90_000,
        "the child faulted only {reference} times"
    );
    let (delta, _, _) = bracketed_delta(&dir, "page_faults", t0, t1);
    let ratio = delta as f64 / reference as f64;
    eprintln!(
        "--tgid page_faults: probe {delta} vs /proc/<pid>/stat {reference} (ratio {ratio:.4})"
    );
    assert!(
        (ratio - 1.0).abs() <= 0.05,
        "the probe saw {delta} page faults of the process, the kernel charged it {reference}"
    );
}
