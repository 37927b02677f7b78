//! Power sources end to end: the modelled `estimate` source with energy
//! attributed to a pinned `stress-ng` (its share against `/proc`, and
//! conservation in every slot to the microjoule), the tables read back in
//! polars and the graphs; a RAPL zone that vanishes mid-run (reported once,
//! the rest goes on) over a powercap tree the test writes and advances; a
//! slot shorter than a source's update interval; and `power-list` on this
//! machine.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use arrow_array::{cast::AsArray, Array, RecordBatch};
use kernmlops_e2e::*;
use kernmlops_plugin_testing::proc_stat;

/// Values of a column of any integer, float or bool type, as f64.
fn column_f64(batches: &[RecordBatch], name: &str) -> Vec<f64> {
    use arrow_array::types::*;
    let mut out = Vec::new();
    for b in batches {
        let c = b
            .column_by_name(name)
            .unwrap_or_else(|| panic!("no column {name}"));
        match c.data_type() {
            arrow_schema::DataType::Float64 => {
                out.extend(c.as_primitive::<Float64Type>().values().iter().copied())
            }
            arrow_schema::DataType::Int32 => out.extend(
                c.as_primitive::<Int32Type>()
                    .values()
                    .iter()
                    .map(|&v| f64::from(v)),
            ),
            arrow_schema::DataType::Boolean => {
                let b = c.as_boolean();
                out.extend((0..b.len()).map(|i| if b.value(i) { 1.0 } else { 0.0 }))
            }
            _ => out.extend(
                column_u64(std::slice::from_ref(b), name)
                    .iter()
                    .map(|&v| v as f64),
            ),
        }
    }
    out
}

fn strings(batches: &[RecordBatch], name: &str) -> Vec<String> {
    column_str(batches, name)
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect()
}

/// `stress-ng --cpu 1` pinned to the last CPU for 5 s while `estimate` and
/// attribution run: every row modelled, every slot's attributed energy plus
/// idle equal to the slot's energy exactly, stress-ng's CPU time equal to
/// `/proc`'s within 2%, its energy share in each slot equal to its share
/// of CPU time; the manifest names the model and its coefficients; the
/// tables read back in polars with their declared types; the graphs render.
#[test]
fn root_estimate_splits_modelled_energy_by_cpu_time_and_conserves_it() {
    let name = "root_estimate_splits_modelled_energy_by_cpu_time_and_conserves_it";
    if !require_root(name) || !require_tool(name, "stress-ng") || !require_tool(name, "taskset") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir(
        "power-estimate",
        &[
            ("estimate", "estimate"),
            ("cpu_time", "cpu_time"),
            ("memory_usage", "memory_usage"),
            ("graphs", "graphs"),
        ],
    );
    let output = temp_dir("power-estimate-out");
    let c = Collector::start(&[
        "--plugin-dir",
        s(&plugins),
        "--plugins",
        "memory_usage",
        "--power",
        "estimate",
        "--output",
        s(&output),
        "--graphs",
    ]);
    std::thread::sleep(Duration::from_millis(1200));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut stress = Command::new("taskset")
        .args(["-c", &(cpus - 1).to_string()])
        .args(["stress-ng", "--cpu", "1", "--timeout", "5s", "--quiet"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting stress-ng");
    let pid = stress.id();
    // stress-ng and the workers it forks (other stress-ng processes on the
    // machine are not ours).
    let mut ours = std::collections::BTreeSet::from([u64::from(pid)]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while proc_stat::state(pid) != 'Z' {
        assert!(Instant::now() < deadline, "stress-ng did not end");
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        ours.extend(
            children
                .split_whitespace()
                .filter_map(|c| c.parse::<u64>().ok()),
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(ours.len() >= 2, "stress-ng's worker was seen: {ours:?}");
    let proc_us = proc_stat::cpu_us(pid, true);
    stress.wait().expect("reaping stress-ng");
    // Let the slot holding stress-ng's end be written.
    std::thread::sleep(Duration::from_millis(1500));
    let done = c.signal_and_wait(libc::SIGINT);
    assert!(
        done.status.success(),
        "kernmlops failed:\n{}\n{}",
        done.stdout,
        done.stderr
    );
    let dir = done.dir.expect("collection folder printed");
    assert!(
        done.stdout.contains("estimate/cpu") && done.stdout.contains("modelled"),
        "the summary names the modelled zone:\n{}",
        done.stdout
    );

    let energy = read_table(&dir.join("energy.arrow"));
    let attribution = read_table(&dir.join("energy_attribution.arrow"));
    for (table, batches) in [("energy", &energy), ("energy_attribution", &attribution)] {
        let measured = column_f64(batches, "measured");
        assert!(!measured.is_empty(), "{table} has rows");
        assert!(
            measured.iter().all(|m| *m == 0.0),
            "{table}: a modelled source's rows are never measured"
        );
    }

    // Conservation: per slot, attributed + idle = the zone's energy.
    let slot_energy: BTreeMap<u64, u64> = column_u64(&energy, "ts_uptime_us")
        .into_iter()
        .zip(column_u64(&energy, "energy_uj"))
        .collect();
    let ts = column_u64(&attribution, "ts_uptime_us");
    let tgid = column_u64(&attribution, "tgid");
    let uj = column_u64(&attribution, "energy_uj");
    let cpu = column_u64(&attribution, "cpu_time_us");
    let comm = strings(&attribution, "comm");
    let scope = strings(&attribution, "scope");
    assert!(scope.iter().all(|s| s == "package"), "estimate's scope");
    let mut sums: BTreeMap<u64, (u64, u64, u32)> = BTreeMap::new();
    for i in 0..ts.len() {
        let e = sums.entry(ts[i]).or_default();
        e.0 += uj[i];
        e.1 += cpu[i];
        e.2 += u32::from(tgid[i] == 0);
    }
    assert!(sums.len() >= 6, "{} slots attributed", sums.len());
    for (t, (attributed, _, idle_rows)) in &sums {
        assert_eq!(
            Some(attributed),
            slot_energy.get(t),
            "slot ending {t}: attributed + idle must equal the slot's energy exactly"
        );
        assert_eq!(*idle_rows, 1, "slot ending {t}: one idle row");
    }

    // stress-ng's CPU time against /proc, and its share per slot.
    let is_stress = |i: usize| ours.contains(&tgid[i]);
    assert!(
        (0..ts.len())
            .filter(|&i| is_stress(i))
            .all(|i| comm[i].starts_with("stress-ng")),
        "stress-ng's rows are named after it"
    );
    let stress_us: u64 = (0..ts.len())
        .filter(|&i| is_stress(i))
        .map(|i| cpu[i])
        .sum();
    let off = stress_us.abs_diff(proc_us) as f64 / proc_us as f64;
    assert!(
        proc_us > 1_000_000 && off <= 0.02,
        "stress-ng: {stress_us} us of CPU time in the table, {proc_us} us in /proc ({:.2}% off)",
        off * 100.0
    );
    let mut checked = 0;
    for i in (0..ts.len()).filter(|&i| is_stress(i) && cpu[i] >= 100_000) {
        let (slot_uj, slot_cpu, _) = sums[&ts[i]];
        let energy_share = uj[i] as f64 / slot_uj as f64;
        let cpu_share = cpu[i] as f64 / slot_cpu as f64;
        assert!(
            (energy_share - cpu_share).abs() <= 0.02 * cpu_share + 1.0 / slot_uj as f64,
            "slot ending {}: stress-ng has {energy_share:.4} of the energy and {cpu_share:.4} of the CPU time",
            ts[i]
        );
        checked += 1;
    }
    assert!(checked >= 3, "stress-ng ran in {checked} slots");

    // The manifest: the model, its coefficients, modelled everywhere.
    let m = manifest(&dir);
    let p = &m["power"];
    assert_eq!(p["sources"][0]["name"], "estimate");
    assert_eq!(p["sources"][0]["measured"], false);
    assert_eq!(p["sources"][0]["zones"][0]["kind"], "modelled");
    assert_eq!(p["sources"][0]["zones"][0]["scope"], "package");
    assert_eq!(p["sources"][0]["model"]["idle_watts_per_cpu"], 0.74);
    assert_eq!(p["sources"][0]["model"]["full_load_watts_per_cpu"], 3.5);
    let total: u64 = slot_energy.values().sum();
    assert_eq!(p["sources"][0]["zones"][0]["energy_uj"], total);
    assert_eq!(p["attribution"]["status"], "ok");
    assert_eq!(p["attribution"]["scopes"][0]["measured"], false);
    assert_eq!(m["tables"]["energy"]["rows"], slot_energy.len());
    let per_switch = p["attribution"]["programs"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["name"] == "cpu_time_switch"))
        .and_then(|x| x["ns_per_run"].as_f64())
        .expect("the sched_switch program's cost is recorded");
    eprintln!("cpu_time: {per_switch:.0} ns per context switch in this run");

    read_back_types(&dir);
    for graph in ["power", "energy_by_process"] {
        for ext in ["png", "svg"] {
            let f = dir.join("graphs").join(format!("{graph}.{ext}"));
            let size = std::fs::metadata(&f).map_or(0, |m| m.len());
            assert!(size > 1000, "{} was not rendered", f.display());
        }
    }
}

/// The energy tables as polars reads them: the declared types.
fn read_back_types(dir: &Path) {
    let script = workspace_root().join("tests/python/read_back.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(dir)
        .output()
        .expect("python3");
    let stderr = text(&out.stderr);
    if !out.status.success() && stderr.contains("ModuleNotFoundError") {
        assert!(!in_ci(), "pyarrow/polars missing in CI: {stderr}");
        eprintln!("SKIP read-back: {stderr}");
        return;
    }
    assert!(out.status.success(), "read_back.py failed: {stderr}");
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let expected: &[(&str, &[(&str, &str)])] = &[
        (
            "energy",
            &[
                ("ts_uptime_us", "UInt64"),
                ("slot_start_us", "UInt64"),
                ("source", "String"),
                ("zone", "String"),
                ("scope", "String"),
                ("socket", "Int32"),
                ("energy_uj", "UInt64"),
                ("power_uw", "UInt64"),
                ("measured", "Boolean"),
            ],
        ),
        (
            "energy_attribution",
            &[
                ("ts_uptime_us", "UInt64"),
                ("slot_start_us", "UInt64"),
                ("tgid", "UInt32"),
                ("comm", "String"),
                ("cgroup_id", "UInt64"),
                ("cgroup", "String"),
                ("cpu_time_us", "UInt64"),
                ("share", "Float64"),
                ("energy_uj", "UInt64"),
                ("scope", "String"),
                ("model", "String"),
                ("source", "String"),
                ("measured", "Boolean"),
            ],
        ),
    ];
    for (table, columns) in expected {
        let t = &got[*table];
        assert_eq!(
            t["pyarrow_rows"], t["polars_rows"],
            "{table}: pyarrow and polars read the same rows"
        );
        for (column, dtype) in *columns {
            assert_eq!(
                t["polars"][*column], *dtype,
                "{table}.{column} in polars: {}",
                t["polars"]
            );
        }
    }
}

/// Writes a file whole (a reader never sees it half written).
fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("writing");
    std::fs::rename(&tmp, path).expect("renaming");
}

/// A powercap zone folder under `root`.
fn rapl_zone(root: &Path, entry: &str, name: &str, range: u64) -> PathBuf {
    let dir = root.join("class/powercap").join(entry);
    std::fs::create_dir_all(&dir).expect("zone folder");
    std::fs::write(dir.join("name"), format!("{name}\n")).expect("name");
    std::fs::write(dir.join("max_energy_range_uj"), format!("{range}\n")).expect("range");
    dir
}

/// A RAPL tree the test advances every 50 ms (the package counter wrapping
/// at its range); DRAM's counter vanishes mid-run. One error line names the
/// zone, the manifest marks it failed with when and why, its rows stop
/// there, and the package zone goes on, every slot corrected for the wrap.
#[test]
fn root_a_zone_that_vanishes_mid_run_is_reported_once_and_the_rest_goes_on() {
    let name = "root_a_zone_that_vanishes_mid_run_is_reported_once_and_the_rest_goes_on";
    if !require_root(name) {
        return;
    }
    let _serial = serial();
    let tree = temp_dir("power-rapl-tree");
    const RANGE: u64 = 1_000_000;
    const STEP: u64 = 30_000;
    let pkg = rapl_zone(&tree, "intel-rapl:0", "package-0", RANGE);
    let dram = rapl_zone(&tree, "intel-rapl:0:0", "dram", RANGE);
    write_atomic(&pkg.join("energy_uj"), "950000\n");
    write_atomic(&dram.join("energy_uj"), "0\n");
    let config = temp_dir("power-rapl-config").join("kernmlops.toml");
    std::fs::write(
        &config,
        format!("[power.settings.rapl]\nsysfs_root = \"{}\"\n", s(&tree)),
    )
    .expect("config");
    let plugins = plugin_dir(
        "power-rapl",
        &[("rapl", "rapl"), ("memory_usage", "memory_usage")],
    );
    let output = temp_dir("power-rapl-out");
    let c = Collector::start(&[
        "--config",
        s(&config),
        "--plugin-dir",
        s(&plugins),
        "--plugins",
        "memory_usage",
        "--power",
        "rapl",
        "--power-interval",
        "200ms",
        "--output",
        s(&output),
    ]);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, pkg, dram) = (stop.clone(), pkg.clone(), dram.clone());
        std::thread::spawn(move || {
            let mut k = 0u64;
            let started = Instant::now();
            let mut vanished_at = None;
            while !stop.load(Ordering::SeqCst) {
                k += 1;
                write_atomic(
                    &pkg.join("energy_uj"),
                    &format!("{}\n", (950_000 + k * STEP) % RANGE),
                );
                if started.elapsed() < Duration::from_millis(1500) {
                    write_atomic(&dram.join("energy_uj"), &format!("{}\n", k * 1000));
                } else if vanished_at.is_none() {
                    let _ = std::fs::remove_file(dram.join("energy_uj"));
                    vanished_at = Some(uptime_us());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            vanished_at.expect("the DRAM counter was removed")
        })
    };
    std::thread::sleep(Duration::from_millis(3000));
    let done = c.signal_and_wait(libc::SIGINT);
    stop.store(true, Ordering::SeqCst);
    let vanished_at = writer.join().expect("writer thread");
    let dir = done.dir.clone().expect("collection folder printed");

    let lines: Vec<&str> = done
        .stderr
        .lines()
        .filter(|l| l.contains("zone dram-0"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "one line reports the zone:\n{}",
        done.stderr
    );
    assert!(
        lines[0].starts_with("error: power source rapl zone dram-0:")
            && lines[0].contains("vanished")
            && lines[0].contains("the run goes on"),
        "{}",
        lines[0]
    );
    assert!(
        !done.status.success(),
        "a failed zone is an error of the run"
    );

    let m = manifest(&dir);
    let zones = m["power"]["sources"][0]["zones"]
        .as_array()
        .expect("zones")
        .clone();
    let zone = |n: &str| {
        zones
            .iter()
            .find(|z| z["name"] == n)
            .unwrap_or_else(|| panic!("zone {n} in the manifest"))
            .clone()
    };
    assert_eq!(zone("package-0")["status"], "ok");
    let d = zone("dram-0");
    assert_eq!(d["status"], "failed");
    assert!(
        d["error"].as_str().is_some_and(|e| e.contains("vanished")),
        "{d}"
    );
    let failed_at = d["failed_at_uptime_us"].as_u64().expect("failure time");
    assert!(
        failed_at >= vanished_at,
        "failed at {failed_at}, removed at {vanished_at}"
    );

    let energy = read_table(&dir.join("energy.arrow"));
    let zone_col = strings(&energy, "zone");
    let ts = column_u64(&energy, "ts_uptime_us");
    let uj = column_u64(&energy, "energy_uj");
    let measured = column_f64(&energy, "measured");
    assert!(measured.iter().all(|m| *m == 1.0), "RAPL is measured");
    let pkg_rows: Vec<usize> = (0..ts.len())
        .filter(|&i| zone_col[i] == "package-0")
        .collect();
    assert!(
        pkg_rows.iter().any(|&i| ts[i] > failed_at + 200_000),
        "the package zone has rows after DRAM failed"
    );
    assert!(
        (0..ts.len()).all(|i| zone_col[i] != "dram-0" || ts[i] <= failed_at),
        "no DRAM rows after its failure"
    );
    // 30 mJ per 50 ms is 120 mJ per 200 ms slot; a wrap misread would be
    // close to the whole 1 J range.
    for &i in &pkg_rows {
        assert!(uj[i] <= 8 * STEP, "slot ending {}: {} uJ", ts[i], uj[i]);
    }
    let pkg_total: u64 = pkg_rows.iter().map(|&i| uj[i]).sum();
    assert_eq!(zone("package-0")["energy_uj"], pkg_total);
    assert!(
        pkg_total >= 30 * STEP,
        "the package counter wrapped several times: {pkg_total} uJ"
    );
}

/// A slot shorter than a source's update interval is refused before
/// anything is collected, naming the source's interval.
#[test]
fn root_a_slot_shorter_than_a_sources_update_interval_is_refused() {
    let name = "root_a_slot_shorter_than_a_sources_update_interval_is_refused";
    if !require_root(name) {
        return;
    }
    let _serial = serial();
    let tree = temp_dir("power-hwmon-tree");
    let dev = tree.join("class/hwmon/hwmon0");
    std::fs::create_dir_all(&dev).expect("hwmon tree");
    for (f, v) in [
        ("name", "power_meter"),
        ("power1_input", "5000000"),
        ("power1_average_interval", "2000"),
    ] {
        std::fs::write(dev.join(f), format!("{v}\n")).expect("writing");
    }
    let config = temp_dir("power-hwmon-config").join("kernmlops.toml");
    std::fs::write(
        &config,
        format!("[power.settings.hwmon]\nsysfs_root = \"{}\"\n", s(&tree)),
    )
    .expect("config");
    let plugins = plugin_dir(
        "power-hwmon",
        &[("hwmon", "hwmon"), ("memory_usage", "memory_usage")],
    );
    let output = temp_dir("power-hwmon-out");
    let out = kernmlops(&[
        "--config",
        s(&config),
        "--plugin-dir",
        s(&plugins),
        "run",
        "--plugins",
        "memory_usage",
        "--power",
        "hwmon",
        "--power-interval",
        "1s",
        "--duration",
        "2s",
        "--output",
        s(&output),
    ]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "refused:\n{stderr}");
    let error: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(error.len(), 1, "one error line:\n{stderr}");
    assert!(
        error[0].contains("shorter than power source hwmon's update interval, 2s")
            && error[0].contains("zone power_meter-power1"),
        "{}",
        error[0]
    );
    assert!(
        std::fs::read_dir(&output).map_or(true, |mut d| d.next().is_none()),
        "nothing was collected"
    );
}

/// `power-list` here: every missing meter said plainly, `estimate`
/// readable and modelled; the same as JSON.
#[test]
fn power_list_says_what_this_machine_has_and_lacks() {
    let plugins = plugin_dir(
        "power-list",
        &[
            ("rapl", "rapl"),
            ("perf_power", "perf_power"),
            ("hwmon", "hwmon"),
            ("estimate", "estimate"),
            ("cpu_time", "cpu_time"),
        ],
    );
    let out = kernmlops(&["--plugin-dir", s(&plugins), "power-list"]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "power-list failed: {}",
        text(&out.stderr)
    );
    // A source's header line and the indented lines below it.
    let section = |name: &str| -> String {
        let header = format!("{name} (plugin {name})");
        let mut lines = stdout.lines().skip_while(|l| !l.starts_with(&header));
        let first = lines
            .next()
            .unwrap_or_else(|| panic!("{name} is listed:\n{stdout}"));
        std::iter::once(first)
            .chain(lines.take_while(|l| l.starts_with("  ")))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if !Path::new("/sys/class/powercap").exists() {
        assert!(
            section("rapl").contains("no RAPL here"),
            "{}",
            section("rapl")
        );
    }
    if !Path::new("/sys/bus/event_source/devices/power").exists() {
        let p = section("perf_power");
        assert!(p.contains("no power PMU here"), "{p}");
    }
    if !Path::new("/sys/class/hwmon").exists() {
        let h = section("hwmon");
        assert!(h.contains("no hwmon power or energy sensor here"), "{h}");
    }
    let e = section("estimate");
    assert!(
        e.contains("readable here") && e.contains("zone cpu") && e.contains("modelled"),
        "{e}"
    );
    assert!(
        stdout.contains("energy is attributed to processes"),
        "{stdout}"
    );

    let json = kernmlops(&["--plugin-dir", s(&plugins), "power-list", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("power-list --json");
    let est = v["sources"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["name"] == "estimate"))
        .expect("estimate in JSON");
    assert_eq!(est["readable"], true);
    assert_eq!(est["zones"][0]["kind"], "modelled");
    assert_eq!(est["model"]["measured"], false);
}

/// Implausible readings over a tree the test writes: a RAPL package counter
/// that jumps by 87 kJ in one slot (under half its range, so not taken for
/// a wrap) and an hwmon power sensor that reads 2^64-1 uW. Each fails its
/// zone with one line and a manifest note, the run exits non-zero, and
/// neither zone has a row from then on (no saturated energy, no measured
/// 0 W after it); the DRAM zone goes on.
#[test]
fn root_implausible_power_readings_fail_their_zone() {
    let name = "root_implausible_power_readings_fail_their_zone";
    if !require_root(name) {
        return;
    }
    let _serial = serial();
    let tree = temp_dir("power-implausible-tree");
    // A real RAPL range: 262 kJ.
    const RANGE: u64 = 262_143_328_850;
    const STEP: u64 = 30_000;
    const JUMP: u64 = 87_000_000_000;
    let pkg = rapl_zone(&tree, "intel-rapl:0", "package-0", RANGE);
    let dram = rapl_zone(&tree, "intel-rapl:0:0", "dram", RANGE);
    write_atomic(&pkg.join("energy_uj"), "1000\n");
    write_atomic(&dram.join("energy_uj"), "0\n");
    let dev = tree.join("class/hwmon/hwmon0");
    std::fs::create_dir_all(&dev).expect("hwmon tree");
    std::fs::write(dev.join("name"), "power_meter\n").expect("name");
    write_atomic(&dev.join("power1_input"), "5000000\n");
    let config = temp_dir("power-implausible-config").join("kernmlops.toml");
    std::fs::write(
        &config,
        format!(
            "[power.settings.rapl]\nsysfs_root = \"{0}\"\n[power.settings.hwmon]\nsysfs_root = \"{0}\"\n",
            s(&tree)
        ),
    )
    .expect("config");
    let plugins = plugin_dir(
        "power-implausible",
        &[
            ("rapl", "rapl"),
            ("hwmon", "hwmon"),
            ("memory_usage", "memory_usage"),
        ],
    );
    let output = temp_dir("power-implausible-out");
    let c = Collector::start(&[
        "--config",
        s(&config),
        "--plugin-dir",
        s(&plugins),
        "--plugins",
        "memory_usage",
        "--power",
        "rapl,hwmon",
        "--power-interval",
        "200ms",
        "--output",
        s(&output),
    ]);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, pkg, dram, dev) = (stop.clone(), pkg.clone(), dram.clone(), dev.clone());
        std::thread::spawn(move || {
            let started = Instant::now();
            let (mut k, mut jumped) = (0u64, false);
            while !stop.load(Ordering::SeqCst) {
                k += 1;
                if !jumped && started.elapsed() > Duration::from_millis(1200) {
                    jumped = true;
                    write_atomic(&dev.join("power1_input"), &format!("{}\n", u64::MAX));
                }
                let extra = if jumped { JUMP } else { 0 };
                write_atomic(
                    &pkg.join("energy_uj"),
                    &format!("{}\n", 1000 + k * STEP + extra),
                );
                write_atomic(&dram.join("energy_uj"), &format!("{}\n", k * 1000));
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(3000));
    let done = c.signal_and_wait(libc::SIGINT);
    stop.store(true, Ordering::SeqCst);
    writer.join().expect("writer thread");
    let dir = done.dir.clone().expect("collection folder printed");

    for (zone, bound) in [
        ("rapl zone package-0", "power.max_watts.package = 1000 W"),
        (
            "hwmon zone power_meter-power1",
            "power.max_watts.platform = 5000 W",
        ),
    ] {
        let lines: Vec<&str> = done.stderr.lines().filter(|l| l.contains(zone)).collect();
        assert_eq!(lines.len(), 1, "one line for {zone}:\n{}", done.stderr);
        assert!(
            lines[0].starts_with(&format!("error: power source {zone}:"))
                && lines[0].contains("implausible")
                && lines[0].contains(bound)
                && lines[0].contains("the run goes on"),
            "{}",
            lines[0]
        );
    }
    assert!(
        !done.status.success(),
        "an implausible reading is an error of the run:\n{}",
        done.stderr
    );

    let m = manifest(&dir);
    let sources = m["power"]["sources"].as_array().expect("sources").clone();
    let zone = |src: &str, n: &str| {
        sources
            .iter()
            .find(|s| s["name"] == src)
            .and_then(|s| s["zones"].as_array())
            .and_then(|zs| zs.iter().find(|z| z["name"] == n))
            .unwrap_or_else(|| panic!("zone {src}/{n} in the manifest"))
            .clone()
    };
    assert_eq!(zone("rapl", "dram-0")["status"], "ok");
    let energy = read_table(&dir.join("energy.arrow"));
    let zone_col = strings(&energy, "zone");
    let ts = column_u64(&energy, "ts_uptime_us");
    let start = column_u64(&energy, "slot_start_us");
    let uj = column_u64(&energy, "energy_uj");
    for (src, n, watts) in [
        ("rapl", "package-0", 1.0),
        ("hwmon", "power_meter-power1", 5.0),
    ] {
        let z = zone(src, n);
        assert_eq!(z["status"], "failed", "{z}");
        assert!(
            z["error"]
                .as_str()
                .is_some_and(|e| e.contains("implausible")),
            "{z}"
        );
        let failed_at = z["failed_at_uptime_us"].as_u64().expect("failure time");
        let rows: Vec<usize> = (0..ts.len()).filter(|&i| zone_col[i] == n).collect();
        assert!(!rows.is_empty(), "{n} has rows before the failure");
        for &i in &rows {
            assert!(ts[i] <= failed_at, "{n}: a row after the failure");
            // The real power (0.6 W and 5 W) with slack for the writer's
            // and the reads' timing: never the jump or the saturation.
            let span = (ts[i] - start[i]).max(1) as f64;
            assert!(
                (uj[i] as f64) <= watts * 2.0 * span + 100_000.0,
                "{n}: {} uJ in {span} us",
                uj[i]
            );
        }
        if src == "hwmon" {
            assert!(
                rows.iter().all(|&i| uj[i] > 0),
                "a measured 0 W was recorded for {n}"
            );
        }
        assert!(
            z["energy_uj"].as_u64().is_some_and(|e| e < 1_000_000_000),
            "{z}"
        );
    }
}
