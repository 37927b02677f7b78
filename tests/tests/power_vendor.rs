//! A vendor's power plugin, as a vendor makes it: `examples/vendor_power`
//! copied out of the workspace, its SDK dependency pointed at this
//! checkout, built with cargo on its own (sharing the workspace's target
//! folder so nothing already built is built again), its `.so` dropped into
//! a scratch plugin folder, and a collection that records its energy. The
//! same plugin with a zone of an unknown scope is refused with the reason.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use kernmlops_e2e::*;

/// Copies the example to a folder of its own, applies `patch` to its
/// source, builds it in release mode and returns a plugin folder holding
/// its `.so` with the memory_usage and cpu_time plugins.
fn build_vendor(name: &str, patch: impl Fn(String) -> String) -> PathBuf {
    let example = workspace_root().join("examples/vendor_power");
    let project = temp_dir(&format!("{name}-project"));
    std::fs::create_dir_all(project.join("src")).expect("src folder");
    let manifest = std::fs::read_to_string(example.join("Cargo.toml")).expect("example manifest");
    let sdk = workspace_root().join("plugin-sdk");
    let manifest = manifest.replace(
        "path = \"../../plugin-sdk\"",
        &format!("path = {:?}", s(&sdk)),
    );
    assert!(manifest.contains(s(&sdk)), "the SDK dependency is a path");
    std::fs::write(project.join("Cargo.toml"), manifest).expect("writing manifest");
    let source = std::fs::read_to_string(example.join("src/lib.rs")).expect("example source");
    std::fs::write(project.join("src/lib.rs"), patch(source)).expect("writing source");
    // The workspace's lock file: the same dependency versions, already
    // built and downloaded.
    std::fs::copy(
        workspace_root().join("Cargo.lock"),
        project.join("Cargo.lock"),
    )
    .expect("copying Cargo.lock");
    let target = artifact_dir().parent().expect("target folder").to_owned();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(&project)
        .env("CARGO_TARGET_DIR", &target)
        .args(["build", "--release", "--offline", "--quiet"])
        .output()
        .expect("running cargo");
    assert!(
        out.status.success(),
        "building the vendor example out of tree failed:\n{}",
        text(&out.stderr)
    );
    let plugins = plugin_dir(
        &format!("{name}-plugins"),
        &[("memory_usage", "memory_usage"), ("cpu_time", "cpu_time")],
    );
    std::fs::copy(
        target.join("release/libvendor_power.so"),
        plugins.join("vendor_power.so"),
    )
    .expect("installing the vendor plugin");
    plugins
}

/// A meter file and a configuration naming it.
fn meter(name: &str) -> (PathBuf, PathBuf) {
    let dir = temp_dir(name);
    let file = dir.join("energy");
    let config = dir.join("kernmlops.toml");
    std::fs::write(
        &config,
        format!(
            "[power.settings.vendor_meter]\nmeter_file = \"{}\"\n",
            s(&file)
        ),
    )
    .expect("config");
    (file, config)
}

fn write_meter(file: &Path, board: u64, soc: u64, dram: u64) {
    let tmp = file.with_extension("tmp");
    std::fs::write(
        &tmp,
        format!("# ACME board energy counters, uJ since power-on (32-bit)\nboard {board}\nsoc {soc}\ndram {dram}\n"),
    )
    .expect("writing the meter");
    std::fs::rename(&tmp, file).expect("renaming the meter");
}

/// Built out of tree, the plugin loads, `power-list` shows its zones, and a
/// collection records them: measured, the board's 32-bit counter wrapping
/// on the way, each zone's energy what the meter counted between the first
/// and last reads, attributed per scope.
#[test]
fn root_the_vendor_example_builds_out_of_tree_loads_and_records_energy() {
    let name = "root_the_vendor_example_builds_out_of_tree_loads_and_records_energy";
    if !require_root(name) {
        return;
    }
    let _serial = serial();
    let plugins = build_vendor("vendor", |s| s);
    let (file, config) = meter("vendor-meter");
    // Steps per write: board 50 mJ, SoC 25 mJ, DRAM 5 mJ.
    const STEP: [u64; 3] = [50_000, 25_000, 5_000];
    let wrap = 1u64 << 32;
    let board0 = wrap - 3 * STEP[0] - 1;
    write_meter(&file, board0, 0, 0);

    let list = kernmlops(&[
        "--config",
        s(&config),
        "--plugin-dir",
        s(&plugins),
        "power-list",
    ]);
    let listed = text(&list.stdout);
    assert!(
        listed.contains("vendor_meter (plugin vendor_power)") && listed.contains("readable here"),
        "{listed}\n{}",
        text(&list.stderr)
    );
    for zone in ["zone board", "zone soc", "zone dram"] {
        assert!(listed.contains(zone), "{zone} listed:\n{listed}");
    }

    let output = temp_dir("vendor-out");
    let c = Collector::start(&[
        "--config",
        s(&config),
        "--plugin-dir",
        s(&plugins),
        "--plugins",
        "memory_usage",
        "--power",
        "vendor_meter",
        "--power-interval",
        "200ms",
        "--output",
        s(&output),
    ]);
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, writes, file) = (stop.clone(), writes.clone(), file.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let k = writes.load(Ordering::SeqCst) + 1;
                write_meter(
                    &file,
                    (board0 + k * STEP[0]) % wrap,
                    k * STEP[1],
                    k * STEP[2],
                );
                writes.store(k, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(2500));
    let before_stop = writes.load(Ordering::SeqCst);
    let done = c.signal_and_wait(libc::SIGINT);
    stop.store(true, Ordering::SeqCst);
    writer.join().expect("meter writer");
    let after_stop = writes.load(Ordering::SeqCst);
    assert!(
        done.status.success(),
        "kernmlops failed:\n{}\n{}",
        done.stdout,
        done.stderr
    );
    let dir = done.dir.expect("collection folder printed");

    let energy = read_table(&dir.join("energy.arrow"));
    let source: Vec<String> = column_str(&energy, "source")
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect();
    let zone: Vec<String> = column_str(&energy, "zone")
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect();
    let uj = column_u64(&energy, "energy_uj");
    assert!(source.iter().all(|s| s == "vendor_meter"));
    let m = manifest(&dir);
    let src = &m["power"]["sources"][0];
    assert_eq!(src["name"], "vendor_meter");
    assert_eq!(src["plugin"], "vendor_power");
    assert_eq!(src["measured"], true);
    for (i, z) in ["board", "soc", "dram"].into_iter().enumerate() {
        let total: u64 = (0..uj.len()).filter(|&r| zone[r] == z).map(|r| uj[r]).sum();
        let entry = src["zones"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["name"] == z))
            .unwrap_or_else(|| panic!("zone {z} in the manifest"));
        assert_eq!(
            entry["energy_uj"], total,
            "zone {z}: manifest and rows agree"
        );
        assert_eq!(entry["kind"], "measured");
        assert_eq!(
            total % STEP[i],
            0,
            "zone {z}: whole meter steps, {total} uJ"
        );
        let steps = total / STEP[i];
        assert!(
            steps + 1 >= before_stop && steps <= after_stop,
            "zone {z}: {steps} steps counted, {before_stop} written before the stop, {after_stop} in all"
        );
    }
    let scopes: Vec<&str> = m["power"]["attribution"]["scopes"]
        .as_array()
        .expect("attributed scopes")
        .iter()
        .filter_map(|s| s["scope"].as_str())
        .collect();
    for scope in ["package", "dram", "platform"] {
        assert!(scopes.contains(&scope), "{scope} attributed: {scopes:?}");
    }
}

/// The same plugin declaring its board zone with scope 42, which no host
/// knows: listed as refused with the reason, and a run asking for it fails
/// with that reason before collecting.
#[test]
fn root_a_vendor_zone_with_an_unknown_scope_is_refused_with_the_reason() {
    let name = "root_a_vendor_zone_with_an_unknown_scope_is_refused_with_the_reason";
    if !require_root(name) {
        return;
    }
    let _serial = serial();
    let plugins = build_vendor("vendor-bad", |source| {
        // The board rail's scope, the first PLATFORM after "board".
        let at = source
            .find("\"board\"")
            .and_then(|b| source[b..].find("PowerScope::PLATFORM").map(|p| b + p))
            .expect("the example declares the board rail with PowerScope::PLATFORM");
        let end = at + "PowerScope::PLATFORM".len();
        format!("{}PowerScope(42){}", &source[..at], &source[end..])
    });
    let (file, config) = meter("vendor-bad-meter");
    write_meter(&file, 1, 1, 1);
    let reason = "zone board declares unknown scope 42 (known: package, core, uncore, dram, platform, device)";

    let list = kernmlops(&[
        "--config",
        s(&config),
        "--plugin-dir",
        s(&plugins),
        "power-list",
    ]);
    let listed = text(&list.stdout);
    assert!(
        listed.contains(&format!("not available here: refused: {reason}")),
        "{listed}"
    );

    let output = temp_dir("vendor-bad-out");
    let out = kernmlops(&[
        "--config",
        s(&config),
        "--plugin-dir",
        s(&plugins),
        "run",
        "--plugins",
        "memory_usage",
        "--power",
        "vendor_meter",
        "--duration",
        "2s",
        "--output",
        s(&output),
    ]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "the run is refused:\n{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("error:") && l.contains(reason)),
        "{stderr}"
    );
    assert!(
        std::fs::read_dir(&output).map_or(true, |mut d| d.next().is_none()),
        "nothing was collected"
    );
}
