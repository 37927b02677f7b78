//! Kernel knobs (`[machine]`) end to end, as root: a sysctl, a sysfs file
//! and a loop device's `read_ahead_kb` swept in an experiment (each run's
//! manifest and results row hold the value read back, the script saw it in
//! force, every file holds its original value afterwards); SIGKILL of the
//! host mid-run restored by its guardian, and with the guardian killed too
//! by the next `kernmlops` start; a refused value, a path outside the
//! kernel's trees and a missing block device refused in one line each with
//! nothing set; a run without a benchmark sets and restores them too.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use arrow_array::{Array, Int64Array, RecordBatch};
use kernmlops_e2e::*;

const SYSCTL: &str = "/proc/sys/vm/dirty_expire_centisecs";
const SYSFS: &str = "/sys/kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs";

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {path}: {e}"))
        .trim()
        .to_owned()
}

/// Writes every file's original value back however the test ends.
struct Originals(Vec<(String, String)>);

impl Originals {
    fn of(paths: &[&str]) -> Self {
        Self(paths.iter().map(|p| (p.to_string(), read(p))).collect())
    }

    /// Files that do not hold their original value, as text.
    fn changed(&self) -> Vec<String> {
        self.0
            .iter()
            .filter(|(p, v)| read(p) != *v)
            .map(|(p, v)| format!("{p} holds {} (was {v})", read(p)))
            .collect()
    }

    /// The original value of `path` (the same file by its real path).
    fn value(&self, path: &str) -> &str {
        let real = |p: &str| std::fs::canonicalize(p).unwrap_or_else(|e| panic!("{p}: {e}"));
        let want = real(path);
        &self
            .0
            .iter()
            .find(|(p, _)| real(p) == want)
            .unwrap_or_else(|| panic!("{path} is not a file of the test"))
            .1
    }
}

impl Drop for Originals {
    fn drop(&mut self) {
        for (p, v) in &self.0 {
            let _ = std::fs::write(p, v);
        }
    }
}

/// A loop device over a small file, detached on drop.
struct Loop {
    dev: String,
}

impl Loop {
    fn create(work: &Path) -> Self {
        let file = work.join("loop.img");
        std::fs::write(&file, vec![0u8; 4 << 20]).expect("backing file");
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&file)
            .output()
            .expect("running losetup");
        assert!(out.status.success(), "losetup: {}", text(&out.stderr));
        let dev = text(&out.stdout).trim().to_owned();
        assert!(dev.starts_with("/dev/loop"), "losetup gave {dev:?}");
        Self { dev }
    }

    /// `loop3` for `/dev/loop3`.
    fn name(&self) -> &str {
        self.dev.trim_start_matches("/dev/")
    }

    fn read_ahead(&self) -> String {
        format!("/sys/block/{}/queue/read_ahead_kb", self.name())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

/// Two values other than `now`, for a sweep.
fn two_others(now: &str, a: i64, b: i64) -> (i64, i64) {
    let now: i64 = now.parse().expect("a number");
    if now == a || now == b {
        (a + 1, b + 1)
    } else {
        (a, b)
    }
}

fn wait_for(limit: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ok()
}

/// A script benchmark that reports the three files' values as it sees
/// them, so the test knows the knobs were in force while it ran.
fn script(work: &Path, ra: &str, wait: &str) -> PathBuf {
    let path = work.join("seen.sh");
    let body = format!(
        "#!/bin/sh\n{wait}\n\
         echo \"{{\\\"name\\\": \\\"seen\\\", \\\"component\\\": \\\"sh\\\", \\\"@result\\\": {{\\\"sysctl\\\": $(cat {SYSCTL}), \\\"sysfs\\\": $(cat {SYSFS}), \\\"ra\\\": $(cat {ra})}}}}\"\n"
    );
    std::fs::write(&path, body).expect("script");
    let chmod = Command::new("chmod").arg("+x").arg(&path).status();
    assert!(chmod.is_ok_and(|s| s.success()));
    path
}

/// An Int64 column of the results as values (nulls as None).
fn ints(batches: &[RecordBatch], name: &str) -> Vec<Option<i64>> {
    batches
        .iter()
        .flat_map(|b| {
            let col = b
                .column_by_name(name)
                .unwrap_or_else(|| panic!("no column {name} in {:?}", b.schema()));
            let col = col
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap_or_else(|| panic!("{name} is {:?}, not Int64", col.data_type()));
            (0..col.len())
                .map(|i| (!col.is_null(i)).then(|| col.value(i)))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn root_knobs_swept_in_an_experiment_are_recorded_and_restored() {
    let test = "root_knobs_swept_in_an_experiment_are_recorded_and_restored";
    if !require_root(test) || !require_tool(test, "losetup") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("knobs-sweep", &[("workloads", "workloads")]);
    let work = temp_dir("knobs-sweep");
    let dev = Loop::create(&work);
    let originals = Originals::of(&[SYSCTL, SYSFS, &dev.read_ahead()]);
    let (c1, c2) = two_others(originals.value(SYSCTL), 1500, 2500);
    let (f1, f2) = two_others(originals.value(SYSFS), 5000, 7000);
    let (r1, r2) = two_others(originals.value(&dev.read_ahead()), 64, 512);
    let script = script(&work, &dev.read_ahead(), "");
    let file = work.join("knobs.toml");
    std::fs::write(
        &file,
        format!(
            "name = \"knobs\"\nbenchmark = \"script\"\nprobes = []\nrepeats = 1\n\
             [config.benchmarks.script]\ncommand = [{script:?}]\ndrop_page_cache = false\n\
             [variables.expire]\nkey = \"machine.sysctl.vm.dirty_expire_centisecs\"\nvalues = [{c1}, {c2}]\n\
             [variables.scan]\nkey = \"machine.sysfs.kernel.mm.transparent_hugepage.khugepaged.scan_sleep_millisecs\"\nvalues = [{f1}, {f2}]\n\
             [variables.ra]\nkey = \"machine.block.{}.read_ahead_kb\"\nvalues = [{r1}, {r2}]\n",
            dev.name(),
            script = s(&script),
        ),
    )
    .expect("experiment file");
    let dir = work.join("exp");
    let t0 = Instant::now();
    let out = Command::new(kernmlops_bin())
        .arg("--plugin-dir")
        .arg(&plugins)
        .args([
            "experiment",
            "run",
            s(&file),
            "--dir",
            s(&dir),
            "--no-graphs",
        ])
        .current_dir(workspace_root())
        .output()
        .expect("running kernmlops experiment");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("8 runs: 8 done"), "{stdout}\n{stderr}");
    eprintln!("knobs: 8 runs with 3 knobs each in {:.1?}", t0.elapsed());
    assert_eq!(
        originals.changed(),
        Vec::<String>::new(),
        "the experiment left knobs set"
    );

    let batches = read_table(&dir.join("results.arrow"));
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    assert_eq!(rows, 8);
    let ra_col = format!("machine.block.{}.read_ahead_kb", dev.name());
    for (variable, column, result) in [
        (
            "expire",
            "machine.sysctl.vm.dirty_expire_centisecs",
            "result_sysctl",
        ),
        (
            "scan",
            "machine.sysfs.kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs",
            "result_sysfs",
        ),
        ("ra", ra_col.as_str(), "result_ra"),
    ] {
        let asked = ints(&batches, variable);
        let read_back = ints(&batches, column);
        assert_eq!(read_back, asked, "{column}: the value read back per run");
        let seen: Vec<Option<i64>> = batches
            .iter()
            .flat_map(|b| {
                let c = b.column_by_name(result).expect("result column");
                let c = arrow_cast_f64(c.as_ref());
                c.into_iter()
                    .map(|v| v.map(|v| v as i64))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(seen, asked, "{result}: the benchmark saw the knob in force");
    }

    // Each run's manifest: three knobs, asked, before and read back.
    let mut manifests = 0;
    for run in std::fs::read_dir(dir.join("runs"))
        .expect("runs folder")
        .flatten()
    {
        let m = manifest(&run.path());
        let knobs = m["machine"].as_array().expect("a machine section");
        assert_eq!(knobs.len(), 3, "{}", m["machine"]);
        for k in knobs {
            let path = k["path"].as_str().expect("path");
            assert_eq!(k["value"], k["requested"], "{k}");
            assert_eq!(
                k["previous"].as_str(),
                Some(originals.value(path)),
                "{k}: the value before"
            );
        }
        manifests += 1;
    }
    assert_eq!(manifests, 8);
    drop(originals);
    drop(dev);
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

/// A results column of numbers as f64 (the script's `@result` figures).
fn arrow_cast_f64(col: &dyn Array) -> Vec<Option<f64>> {
    if let Some(f) = col.as_any().downcast_ref::<arrow_array::Float64Array>() {
        return (0..f.len())
            .map(|i| (!f.is_null(i)).then(|| f.value(i)))
            .collect();
    }
    if let Some(n) = col.as_any().downcast_ref::<Int64Array>() {
        return (0..n.len())
            .map(|i| (!n.is_null(i)).then(|| n.value(i) as f64))
            .collect();
    }
    panic!("a result column of type {:?}", col.data_type());
}

/// The guardian process of the collector `host`.
fn guardian_of(host: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            ppid == Some(host)
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains("__kernmlops-guardian"))
        })
        .collect()
}

#[test]
fn root_knobs_are_restored_after_sigkill_by_the_guardian_or_the_next_start() {
    let test = "root_knobs_are_restored_after_sigkill_by_the_guardian_or_the_next_start";
    if !require_root(test) || !require_tool(test, "losetup") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("knobs-kill", &[("workloads", "workloads")]);
    let work = temp_dir("knobs-kill");
    let dev = Loop::create(&work);
    let originals = Originals::of(&[SYSCTL, SYSFS, &dev.read_ahead()]);
    let (c, _) = two_others(originals.value(SYSCTL), 1700, 2700);
    let (f, _) = two_others(originals.value(SYSFS), 6000, 8000);
    let (r, _) = two_others(originals.value(&dev.read_ahead()), 256, 1024);
    let script = script(&work, &dev.read_ahead(), "sleep 60");
    let cfg = work.join("knobs.toml");
    std::fs::write(
        &cfg,
        format!(
            "[benchmarks.script]\ncommand = [{script:?}]\ndrop_page_cache = false\n\
             [machine.sysctl]\nvm.dirty_expire_centisecs = {c}\n\
             [machine.sysfs]\n\"kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs\" = {f}\n\
             [machine.block.{}]\nread_ahead_kb = {r}\n",
            dev.name(),
            script = s(&script),
        ),
    )
    .expect("config");
    for kill_guardian in [false, true] {
        let output = work.join(format!("out-{kill_guardian}"));
        let collector = Collector::start(&[
            "--config",
            s(&cfg),
            "--plugin-dir",
            s(&plugins),
            "--benchmark",
            "script",
            "--baseline",
            "--duration",
            "120s",
            "--output",
            s(&output),
        ]);
        let host = collector.pid();
        let set = [
            (SYSCTL.to_owned(), c.to_string()),
            (SYSFS.to_owned(), f.to_string()),
            (dev.read_ahead(), r.to_string()),
        ];
        for (path, want) in &set {
            assert_eq!(&read(path), want, "{path} is set while the run runs");
        }
        let guardian = guardian_of(host);
        assert_eq!(guardian.len(), 1, "one guardian per run");
        if kill_guardian {
            // SAFETY: the guardian of the collector this test started.
            unsafe { libc::kill(guardian[0] as i32, libc::SIGKILL) };
            assert!(wait_for(Duration::from_secs(5), || !Path::new(&format!(
                "/proc/{}/cmdline",
                guardian[0]
            ))
            .exists()
                || std::fs::read_to_string(format!(
                    "/proc/{}/stat",
                    guardian[0]
                ))
                .is_ok_and(|st| st.contains(") Z "))));
        }
        let done = collector.signal_and_wait(libc::SIGKILL);
        assert!(!done.status.success());
        let dir = only_collection(&output);
        if kill_guardian {
            // Nothing undoes the run until a kernmlops starts.
            std::thread::sleep(Duration::from_millis(300));
            let pending = originals.changed();
            let out = kernmlops(&["repair", s(&dir)]);
            let stderr = text(&out.stderr);
            assert!(out.status.success(), "repair: {stderr}");
            if pending.is_empty() {
                eprintln!("note: another kernmlops started first and undid the run");
            } else {
                assert_eq!(pending.len(), 3, "{pending:?}");
                assert!(
                    stderr.contains("ended without undoing its changes")
                        && stderr.contains(&format!("restored {SYSCTL} to")),
                    "the next start does not say what it restored ({pending:?}): {stderr}"
                );
            }
            assert_eq!(originals.changed(), Vec::<String>::new());
        } else {
            assert!(
                wait_for(Duration::from_secs(10), || originals.changed().is_empty()),
                "the guardian did not restore: {:?}",
                originals.changed()
            );
            let _ = kernmlops(&["repair", s(&dir)]);
        }
        let m = manifest(&dir);
        assert_eq!(
            m["machine"].as_array().map(Vec::len),
            Some(3),
            "the manifest names the knobs from the start: {}",
            m["machine"]
        );
    }
    drop(originals);
    drop(dev);
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn root_bad_knobs_are_one_error_line_each_and_set_nothing() {
    let test = "root_bad_knobs_are_one_error_line_each_and_set_nothing";
    if !require_root(test) {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("knobs-bad", &[("workloads", "workloads")]);
    let work = temp_dir("knobs-bad");
    let originals = Originals::of(&[SYSCTL, "/proc/sys/vm/dirty_ratio"]);
    let (c, _) = two_others(originals.value(SYSCTL), 1900, 2900);
    let script = script(&work, SYSCTL, "");
    for (name, machine, needle) in [
        (
            "refused",
            // Sorted, dirty_expire_centisecs is set first; dirty_ratio
            // refuses 1000 (at most 100), and the first is put back.
            format!("[machine.sysctl]\n\"vm.dirty_expire_centisecs\" = {c}\n\"vm.dirty_ratio\" = 1000\n"),
            "machine.sysctl.vm.dirty_ratio: the kernel refused \"1000\" for /proc/sys/vm/dirty_ratio: ",
        ),
        (
            "outside",
            "[machine.sysfs]\n\"../etc/passwd\" = \"x\"\n".to_owned(),
            "machine.sysfs.../etc/passwd: \"../etc/passwd\" is not a plain relative path",
        ),
        (
            "no-disk",
            "[machine.block.nosuchdisk9]\nread_ahead_kb = 128\n".to_owned(),
            "machine.block.nosuchdisk9: /sys/block/nosuchdisk9 does not exist on this machine",
        ),
    ] {
        let cfg = work.join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[benchmarks.script]\ncommand = [{script:?}]\ndrop_page_cache = false\n{machine}",
                script = s(&script)
            ),
        )
        .expect("config");
        let output = work.join(format!("out-{name}"));
        let out = kernmlops(&[
            "--config",
            s(&cfg),
            "--plugin-dir",
            s(&plugins),
            "run",
            "--benchmark",
            "script",
            "--baseline",
            "--output",
            s(&output),
        ]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{name}: accepted: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{name}: one line: {stderr}");
        assert!(
            lines[0].starts_with("error: ") && lines[0].contains(needle),
            "{name}: {stderr}"
        );
        if name != "refused" {
            assert!(lines[0].contains(s(&cfg)), "{name}: names the file: {stderr}");
        }
        let made: Vec<_> = std::fs::read_dir(&output)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(made.is_empty(), "{name}: left {made:?}");
        assert_eq!(originals.changed(), Vec::<String>::new(), "{name}: set");
    }
    drop(originals);
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn root_knobs_apply_to_a_run_without_a_benchmark_too() {
    let test = "root_knobs_apply_to_a_run_without_a_benchmark_too";
    if !require_root(test) {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("knobs-plain", &[("memory_usage", "memory_usage")]);
    let work = temp_dir("knobs-plain");
    let originals = Originals::of(&[SYSCTL]);
    let (c, _) = two_others(originals.value(SYSCTL), 1800, 2800);
    let cfg = work.join("knobs.toml");
    std::fs::write(
        &cfg,
        format!("[machine.sysctl]\nvm.dirty_expire_centisecs = {c}\n"),
    )
    .expect("config");
    let output = work.join("out");
    let collector = Collector::start(&[
        "--config",
        s(&cfg),
        "--plugin-dir",
        s(&plugins),
        "--plugins",
        "memory_usage",
        "--duration",
        "2s",
        "--output",
        s(&output),
    ]);
    assert_eq!(read(SYSCTL), c.to_string(), "set while collecting");
    let done = collector.wait();
    assert!(done.status.success(), "{}", done.stderr);
    assert_eq!(
        originals.changed(),
        Vec::<String>::new(),
        "restored at the end"
    );
    let m = manifest(&only_collection(&output));
    assert_eq!(m["machine"][0]["value"], c.to_string(), "{}", m["machine"]);
    assert_eq!(
        m["machine"][0]["previous"].as_str(),
        Some(originals.value(SYSCTL))
    );
    drop(originals);
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}
