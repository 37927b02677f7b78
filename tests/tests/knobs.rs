//! Kernel knobs (`[machine]`) end to end, as root: a sysctl, a sysfs file
//! and a loop device's `read_ahead_kb` swept in an experiment (each run's
//! manifest and results row hold the value read back, the script saw it in
//! force, every file holds its original value afterwards); SIGKILL of the
//! host mid-run restored by its guardian, and with the guardian killed too
//! by the next `kernmlops` start; a refused value, a path outside the
//! kernel's trees and a missing block device refused in one line each with
//! nothing set; a run without a benchmark sets and restores them too.
//! The CPU knobs: `cpus` confines the benchmark (its Cpus_allowed_list is
//! the knob's) through a cpuset removed at the end and after SIGKILL, a
//! CPU that is not online is one line; cpufreq and SMT are set where the
//! kernel has them, else one line each naming what is missing; `thp_mode`
//! from `[machine]` and from the benchmark's key is one knob; and
//! `system_info`'s reproducibility columns read back with pyarrow.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use arrow_array::{Array, Int64Array, RecordBatch};
use kernmlops_e2e::*;

const SYSCTL: &str = "/proc/sys/vm/dirty_expire_centisecs";
const SYSFS: &str = "/sys/kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs";

/// The set-up of the tests over all three kinds of file (a sysctl, a
/// sysfs file and a loop device's read-ahead): the machine to itself, the
/// workloads plugin, a work folder, the loop device, the files' originals
/// (written back on drop, first) and a script benchmark reporting the
/// values it sees.
struct ThreeKnobs {
    originals: Originals,
    dev: LoopDevice,
    plugins: PathBuf,
    work: PathBuf,
    script: PathBuf,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl ThreeKnobs {
    /// `None` (the test skips) without root or losetup; the script runs
    /// `wait` before it reports.
    fn start(test: &str, tag: &str, wait: &str) -> Option<Self> {
        if !require_root(test) || !require_tool(test, "losetup") {
            return None;
        }
        let serial = serial();
        let plugins = plugin_dir(tag, &[("workloads", "workloads")]);
        let work = temp_dir(tag);
        let backing = work.join("loop.img");
        std::fs::write(&backing, vec![0u8; 4 << 20]).expect("backing file");
        let dev = LoopDevice::attach(&backing);
        let ra = read_ahead(&dev);
        let originals = Originals::of(&[SYSCTL, SYSFS, &ra]);
        let script = script(&work, &ra, wait);
        Some(Self {
            originals,
            dev,
            plugins,
            work,
            script,
            _serial: serial,
        })
    }

    /// The loop device's `read_ahead_kb` file.
    fn read_ahead(&self) -> String {
        read_ahead(&self.dev)
    }

    /// Two values other than the original for each file (sysctl, sysfs,
    /// read-ahead), from the pairs given.
    fn others(&self, sysctl: (i64, i64), sysfs: (i64, i64), ra: (i64, i64)) -> [(i64, i64); 3] {
        [
            (SYSCTL.to_owned(), sysctl),
            (SYSFS.to_owned(), sysfs),
            (self.read_ahead(), ra),
        ]
        .map(|(file, (a, b))| two_others(self.originals.value(&file), a, b))
    }

    /// Writes the files back, detaches the device, removes the folders.
    fn finish(self) {
        let Self {
            originals,
            dev,
            plugins,
            work,
            ..
        } = self;
        drop(originals);
        drop(dev);
        let _ = std::fs::remove_dir_all(&work);
        let _ = std::fs::remove_dir_all(&plugins);
    }
}

/// A loop device's `read_ahead_kb` file.
fn read_ahead(dev: &LoopDevice) -> String {
    format!("/sys/block/{}/queue/read_ahead_kb", dev.name())
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
    let Some(t) = ThreeKnobs::start(test, "knobs-sweep", "") else {
        return;
    };
    let [(c1, c2), (f1, f2), (r1, r2)] = t.others((1500, 2500), (5000, 7000), (64, 512));
    let (plugins, work, dev, originals, script) =
        (&t.plugins, &t.work, &t.dev, &t.originals, &t.script);
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
            script = s(script),
        ),
    )
    .expect("experiment file");
    let dir = work.join("exp");
    let t0 = Instant::now();
    let out = Command::new(kernmlops_bin())
        .arg("--plugin-dir")
        .arg(plugins)
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
    t.finish();
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
    let Some(t) = ThreeKnobs::start(test, "knobs-kill", "sleep 60") else {
        return;
    };
    let [(c, _), (f, _), (r, _)] = t.others((1700, 2700), (6000, 8000), (256, 1024));
    let (plugins, work, dev, originals, script) =
        (&t.plugins, &t.work, &t.dev, &t.originals, &t.script);
    let cfg = work.join("knobs.toml");
    std::fs::write(
        &cfg,
        format!(
            "[benchmarks.script]\ncommand = [{script:?}]\ndrop_page_cache = false\n\
             [machine.sysctl]\nvm.dirty_expire_centisecs = {c}\n\
             [machine.sysfs]\n\"kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs\" = {f}\n\
             [machine.block.{}]\nread_ahead_kb = {r}\n",
            dev.name(),
            script = s(script),
        ),
    )
    .expect("config");
    for kill_guardian in [false, true] {
        let output = work.join(format!("out-{kill_guardian}"));
        let collector = Collector::start(&[
            "--config",
            s(&cfg),
            "--plugin-dir",
            s(plugins),
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
            (t.read_ahead(), r.to_string()),
        ];
        for (path, want) in &set {
            assert_eq!(
                &read_setting(path),
                want,
                "{path} is set while the run runs"
            );
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
    t.finish();
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
    assert_eq!(read_setting(SYSCTL), c.to_string(), "set while collecting");
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

/// The run's private cgroup v1 cpuset groups now (`kernmlops-<id>`).
fn cpuset_groups() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup/cpuset")
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("kernmlops-"))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The last online CPU, as a list of one.
fn last_online_cpu() -> String {
    let online = read_setting("/sys/devices/system/cpu/online");
    let last = online.rsplit([',', '-']).next().expect("a CPU").to_owned();
    last
}

#[test]
fn root_cpus_confine_the_benchmark_and_are_undone_even_after_sigkill() {
    let test = "root_cpus_confine_the_benchmark_and_are_undone_even_after_sigkill";
    if !require_root(test) {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("knobs-cpus", &[("workloads", "workloads")]);
    let work = temp_dir("knobs-cpus");
    let before = cpuset_groups();
    let cpu = last_online_cpu();
    let seen = work.join("seen-cpus");
    let script = work.join("cpus.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ngrep Cpus_allowed_list /proc/self/status | cut -f2 > {seen}\n\"$@\"\n\
             echo '{{\"name\": \"cpus\", \"component\": \"sh\", \"@result\": {{\"x\": 1}}}}'\n",
            seen = s(&seen)
        ),
    )
    .expect("script");
    assert!(Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()
        .is_ok_and(|st| st.success()));
    let config = |name: &str, cpus: &str, args: &str| {
        let cfg = work.join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[benchmarks.script]\ncommand = [{script:?}{args}]\ndrop_page_cache = false\n\
                 [machine]\ncpus = {cpus:?}\n",
                script = s(&script)
            ),
        )
        .expect("config");
        cfg
    };

    // The benchmark runs on the CPUs asked, and the manifest says so.
    let cfg = config("one", &cpu, "");
    let output = work.join("out-one");
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
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        read_setting(s(&seen)),
        cpu,
        "the benchmark's Cpus_allowed_list is the knob's"
    );
    let m = manifest(&only_collection(&output));
    let entry = m["machine"]
        .as_array()
        .and_then(|a| a.iter().find(|k| k["name"] == "cpus"))
        .unwrap_or_else(|| panic!("no cpus knob in {}", m["machine"]));
    assert_eq!(entry["requested"], cpu.as_str());
    assert_eq!(entry["value"], cpu.as_str(), "the list read back");
    assert_eq!(cpuset_groups(), before, "the run's cpuset was removed");

    // A CPU that does not exist: one line, nothing made, nothing set.
    let cfg = config("bad", "4095", "");
    let output = work.join("out-bad");
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
    assert!(!out.status.success());
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(
        lines[0].starts_with(&format!(
            "error: {}: machine.cpus: CPU 4095 is not online on this machine (online: ",
            s(&cfg)
        )),
        "{stderr}"
    );
    assert!(!output.exists(), "a folder was made");
    assert_eq!(cpuset_groups(), before);

    // SIGKILL of the host mid-run: the guardian removes the cpuset.
    let cfg = config("kill", &cpu, ", \"sleep\", \"60\"");
    let output = work.join("out-kill");
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
    let during = cpuset_groups();
    assert_eq!(
        during.len(),
        before.len() + 1,
        "the run's cpuset: {during:?}"
    );
    let made = during
        .iter()
        .find(|p| !before.contains(p))
        .expect("a new cpuset")
        .clone();
    assert_eq!(read_setting(s(&made.join("cpuset.cpus"))), cpu);
    assert!(
        wait_for(Duration::from_secs(10), || !read_setting(s(
            &made.join("cgroup.procs")
        ))
        .is_empty()),
        "the benchmark never joined {}",
        made.display()
    );
    let done = collector.signal_and_wait(libc::SIGKILL);
    assert!(!done.status.success());
    assert!(
        wait_for(Duration::from_secs(15), || !made.exists()),
        "the guardian left {}",
        made.display()
    );
    let _ = kernmlops(&["repair", s(&only_collection(&output))]);
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

#[test]
fn root_cpufreq_and_smt_are_set_where_the_kernel_has_them_else_one_line_each() {
    let test = "root_cpufreq_and_smt_are_set_where_the_kernel_has_them_else_one_line_each";
    if !require_root(test) {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("knobs-cpufreq", &[("workloads", "workloads")]);
    let work = temp_dir("knobs-cpufreq");
    let script = script(&work, SYSCTL, "");
    let policy0 = Path::new("/sys/devices/system/cpu/cpufreq/policy0");
    let governor = policy0
        .join("scaling_governor")
        .exists()
        .then(|| read_setting("/sys/devices/system/cpu/cpufreq/policy0/scaling_governor"));
    let smt = std::fs::read_to_string("/sys/devices/system/cpu/smt/control")
        .ok()
        .map(|c| c.trim().to_owned());
    let cases = [
        (
            "governor",
            // The governor in force (nothing changes), or none here.
            format!(
                "[machine.cpufreq]\ngovernor = {:?}\n",
                governor.clone().unwrap_or_else(|| "performance".into())
            ),
            governor.is_none().then(|| {
                "machine.cpufreq.governor: this machine has no CPU frequency scaling (no cpufreq policy in /sys/devices/system/cpu/cpufreq)".to_owned()
            }),
        ),
        (
            "smt",
            format!(
                "[machine]\nsmt = {:?}\n",
                smt.clone().filter(|c| c == "on" || c == "off").unwrap_or_else(|| "off".into())
            ),
            match smt.as_deref() {
                Some("on" | "off") => None,
                Some(other) => Some(format!(
                    "machine.smt: the kernel does not allow switching SMT here (/sys/devices/system/cpu/smt/control says {other:?})"
                )),
                None => Some("machine.smt: this kernel has no SMT control".to_owned()),
            },
        ),
    ];
    for (name, machine, refused) in cases {
        let cfg = work.join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[benchmarks.script]\ncommand = [{:?}]\ndrop_page_cache = false\n{machine}",
                s(&script)
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
        match refused {
            Some(needle) => {
                let lines: Vec<&str> = stderr.lines().collect();
                assert!(!out.status.success(), "{name}: accepted");
                assert_eq!(lines.len(), 1, "{name}: one line: {stderr}");
                assert!(
                    lines[0].starts_with(&format!("error: {}: {needle}", s(&cfg))),
                    "{name}: {stderr}"
                );
                assert!(!output.exists(), "{name}: a folder was made");
            }
            None => {
                assert!(out.status.success(), "{name}: {stderr}");
                let m = manifest(&only_collection(&output));
                assert!(
                    !m["machine"].as_array().is_none_or(Vec::is_empty),
                    "{name}: {}",
                    m["machine"]
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

/// The THP mode file's selected value.
fn thp() -> String {
    let t = read_setting("/sys/kernel/mm/transparent_hugepage/enabled");
    t.split_whitespace()
        .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
        .expect("a selected mode")
        .to_owned()
}

#[test]
fn root_thp_mode_is_a_knob_from_machine_and_from_the_benchmark_key() {
    let test = "root_thp_mode_is_a_knob_from_machine_and_from_the_benchmark_key";
    if !require_root(test) {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("knobs-thp", &[("workloads", "workloads")]);
    let work = temp_dir("knobs-thp");
    let originals = Originals::of(&[THP_FILE]);
    let before = thp();
    let other = if before == "never" { "always" } else { "never" };
    let seen = work.join("seen-thp");
    let script = work.join("thp.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncat {THP_FILE} > {seen}\n\
             echo '{{\"name\": \"thp\", \"component\": \"sh\", \"@result\": {{\"x\": 1}}}}'\n",
            seen = s(&seen)
        ),
    )
    .expect("script");
    assert!(Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()
        .is_ok_and(|st| st.success()));
    for (case, section) in [
        ("machine", format!("[machine]\nthp_mode = \"{other}\"\n")),
        ("benchmark", format!("thp_mode = \"{other}\"\n")),
    ] {
        // The benchmark key goes in [benchmarks.script], the knob after it.
        let cfg = work.join(format!("{case}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[benchmarks.script]\ncommand = [{:?}]\ndrop_page_cache = false\n{section}",
                s(&script)
            ),
        )
        .expect("config");
        let output = work.join(format!("out-{case}"));
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
        assert!(out.status.success(), "{case}: {}", text(&out.stderr));
        assert!(
            read_setting(s(&seen)).contains(&format!("[{other}]")),
            "{case}: the benchmark ran under {}",
            read_setting(s(&seen))
        );
        assert_eq!(thp(), before, "{case}: restored");
        let dir = only_collection(&output);
        let m = manifest(&dir);
        let knobs = m["machine"].as_array().expect("a machine section");
        assert_eq!(knobs.len(), 1, "{case}: {}", m["machine"]);
        assert_eq!(knobs[0]["name"], "thp_mode");
        assert_eq!(knobs[0]["previous"], before.as_str());
        assert_eq!(knobs[0]["value"], other, "{case}: read back");
    }
    // Both at once: one line.
    let cfg = work.join("both.toml");
    std::fs::write(
        &cfg,
        format!(
            "[benchmarks.script]\ncommand = [{:?}]\nthp_mode = \"{other}\"\n[machine]\nthp_mode = \"{other}\"\n",
            s(&script)
        ),
    )
    .expect("config");
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
        s(&work.join("out-both")),
    ]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("both set the THP mode"), "{stderr}");
    assert_eq!(originals.changed(), Vec::<String>::new());
    drop(originals);
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}

const THP_FILE: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

#[test]
fn root_system_info_records_the_state_that_spoils_measurements() {
    let test = "root_system_info_records_the_state_that_spoils_measurements";
    if !require_root(test) {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("knobs-sysinfo", &[("workloads", "workloads")]);
    let work = temp_dir("knobs-sysinfo");
    let script = script(&work, SYSCTL, "");
    let cfg = work.join("run.toml");
    std::fs::write(
        &cfg,
        format!(
            "[benchmarks.script]\ncommand = [{:?}]\ndrop_page_cache = false\n",
            s(&script)
        ),
    )
    .expect("config");
    let output = work.join("out");
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
    assert!(out.status.success(), "{stderr}");
    let dir = only_collection(&output);
    let reader = r#"
import json, sys
import pyarrow as pa
path = sys.argv[1]
try:
    t = pa.ipc.open_file(path).read_all()
except pa.ArrowInvalid:
    t = pa.ipc.open_stream(path).read_all()
row = {c: t.column(c)[0].as_py() for c in t.column_names}
print(json.dumps({k: v for k, v in row.items() if not hasattr(v, "isoformat")}))
"#;
    let py = Command::new("python3")
        .arg("-c")
        .arg(reader)
        .arg(dir.join("system_info.arrow"))
        .output()
        .expect("python3");
    let pyerr = text(&py.stderr);
    if !py.status.success() && pyerr.contains("ModuleNotFoundError") {
        assert!(!in_ci(), "pyarrow missing in CI: {pyerr}");
        eprintln!("SKIP read-back: {pyerr}");
        return;
    }
    assert!(py.status.success(), "{pyerr}");
    let row: serde_json::Value = serde_json::from_slice(&py.stdout).expect("JSON");
    // What this machine says, read here the same way.
    let opt = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned());
    let aslr: u64 = read_setting("/proc/sys/kernel/randomize_va_space")
        .parse()
        .expect("a number");
    assert_eq!(row["aslr"], aslr);
    assert_eq!(
        row["smt_control"].as_str().map(str::to_owned),
        opt("/sys/devices/system/cpu/smt/control")
    );
    assert_eq!(
        row["smt_active"].as_bool(),
        opt("/sys/devices/system/cpu/smt/active").map(|a| a != "0")
    );
    assert_eq!(
        row["cpuidle_driver"].as_str().map(str::to_owned),
        opt("/sys/devices/system/cpu/cpuidle/current_driver")
    );
    let has_policy = std::fs::read_dir("/sys/devices/system/cpu/cpufreq").is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("policy"))
    });
    assert_eq!(
        row["cpufreq_governor"].is_null(),
        !has_policy,
        "the governor is null exactly without cpufreq: {row}"
    );
    if !has_policy {
        assert!(
            !stderr.contains("governor"),
            "nothing said of a governor there is none of: {stderr}"
        );
    }
    let vulnerable: Vec<String> = std::fs::read_dir("/sys/devices/system/cpu/vulnerabilities")
        .map(|d| {
            let mut v: Vec<String> = d
                .flatten()
                .filter(|e| {
                    std::fs::read_to_string(e.path()).is_ok_and(|t| t.starts_with("Vulnerable"))
                })
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        })
        .unwrap_or_default();
    assert_eq!(row["cpu_vulnerable"], vulnerable.join(","));
    let load = row["loadavg_1m"].as_f64().expect("a load average");
    assert!(load >= 0.0, "{row}");
    assert!(
        row["runnable_tasks"].as_u64().is_some_and(|r| r >= 1),
        "{row}"
    );
    // A warning for each fact against reproducibility, and only for those.
    let busy = stderr.contains("warning: the machine is busy (1-minute load average ");
    assert_eq!(busy, load >= 1.0, "load {load}: {stderr}");
    assert_eq!(
        stderr.contains("warning: kernel.randomize_va_space is"),
        aslr != 2,
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&plugins);
}
