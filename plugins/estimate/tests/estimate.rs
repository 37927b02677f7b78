//! The estimate source against `/proc/stat` trees the test writes and
//! advances, and against this machine's own `/proc`.

use std::{path::PathBuf, time::Duration};

use estimate::{energy_pj, parse_stat, CpuTimes, Estimate, Settings};
use kernmlops_plugin_sdk::{
    api::{validate_power_source, validate_power_zones, PowerScope},
    power::{PowerSourceImpl, ZoneReading},
    settings::parse,
};

/// A fresh folder holding a `stat` file; removed on drop.
struct Tree(PathBuf);

impl Tree {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("kml-estimate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        Self(d)
    }

    /// Writes `/proc/stat` with one line per CPU: (busy user ticks, idle ticks).
    fn write(&self, cpus: &[(u64, u64)]) {
        let mut text = String::from("cpu  0 0 0 0 0 0 0 0 0 0\n");
        for (i, (busy, idle)) in cpus.iter().enumerate() {
            text += &format!("cpu{i} {busy} 0 0 {idle} 0 0 0 0 0 0\n");
        }
        text += "intr 1 2 3\nctxt 100\n";
        std::fs::write(self.0.join("stat"), text).expect("writing stat");
    }

    fn settings(&self, idle: f64, full: f64) -> Settings {
        Settings {
            idle_watts_per_cpu: idle,
            full_load_watts_per_cpu: full,
            proc_root: self.0.display().to_string(),
        }
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn args() -> kernmlops_plugin_sdk::StartArgs {
    kernmlops_plugin_testing::start_args("{}")
}

fn read(e: &mut Estimate, now_us: u64) -> ZoneReading {
    let mut out = Vec::new();
    e.read(now_us, &mut out).expect("read");
    assert_eq!(out.len(), 1, "one zone");
    out.remove(0)
}

#[test]
fn declaration_and_defaults_meet_the_rules() {
    kernmlops_plugin_testing::check_settings_defaults::<Settings>("[power.settings.estimate]");
    let decl = kernmlops_plugin_sdk::power::declaration::<Estimate>();
    validate_power_source(&decl).expect("declaration");
    let s = Settings::default();
    assert_eq!(
        (s.idle_watts_per_cpu, s.full_load_watts_per_cpu),
        (0.74, 3.5)
    );
    for bad in [
        r#"{"idle_watts_per_cpu": -1}"#,
        r#"{"idle_watts_per_cpu": 4, "full_load_watts_per_cpu": 3}"#,
        r#"{"watts": 3}"#,
    ] {
        assert!(
            parse::<Settings>("[power.settings.estimate]", bad).is_err(),
            "{bad}"
        );
    }
}

/// One CPU fully busy and one idle for a second is idle + full-load watts;
/// half busy is halfway; every zone is modelled.
#[test]
fn energy_follows_the_linear_model_exactly() {
    let tree = Tree::new("model");
    tree.write(&[(0, 0), (0, 0)]);
    let mut e = Estimate::start(&args(), tree.settings(1.0, 3.0)).expect("start");
    let zones: Vec<_> = e.zones().iter().map(|z| z.to_abi()).collect();
    validate_power_zones(&zones).expect("zones");
    assert_eq!(zones[0].scope, PowerScope::PACKAGE);
    assert!(!zones[0].measured, "an estimate is never measured");
    assert_eq!(
        read(&mut e, 1_000_000),
        Ok(0),
        "the first read is the baseline"
    );
    // cpu0 busy the whole second, cpu1 idle: 3 W + 1 W.
    tree.write(&[(100, 0), (0, 100)]);
    assert_eq!(read(&mut e, 2_000_000), Ok(4_000_000));
    // Both half busy for half a second: 2 * (1 + 2 * 0.5) W * 0.5 s = 2 J.
    tree.write(&[(125, 25), (25, 125)]);
    assert_eq!(read(&mut e, 2_500_000), Ok(6_000_000));
    // Idle: 2 W for a second.
    tree.write(&[(125, 125), (25, 225)]);
    assert_eq!(read(&mut e, 3_500_000), Ok(8_000_000));
    let model = e.model().expect("a model");
    assert_eq!(model["idle_watts_per_cpu"], 1.0);
    assert_eq!(model["full_load_watts_per_cpu"], 3.0);
    assert_eq!(model["logical_cpus"], 2);
    assert_eq!(model["measured"], false);
}

#[test]
fn a_vanished_stat_file_fails_the_zone_with_a_reason() {
    let tree = Tree::new("vanish");
    tree.write(&[(0, 0)]);
    let mut e = Estimate::start(&args(), tree.settings(1.0, 2.0)).expect("start");
    assert_eq!(read(&mut e, 1), Ok(0));
    std::fs::remove_file(tree.0.join("stat")).expect("remove");
    let err = read(&mut e, 2).expect_err("vanished");
    assert!(err.contains("vanished"), "{err}");
    let missing = Estimate::start(
        &args(),
        Settings {
            proc_root: "/nonexistent".into(),
            ..Settings::default()
        },
    );
    assert!(missing.is_err());
}

#[test]
fn stat_parsing_and_integer_energy() {
    let cpus = parse_stat(
        "cpu  10 0 0 0 0 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\ncpu1 1 1 1 1 1 1 1 1\nctxt 5\n",
    )
    .expect("parses");
    assert_eq!(
        cpus,
        vec![
            (
                0,
                CpuTimes {
                    busy: 1 + 2 + 3 + 6 + 7,
                    total: 19 + 4 + 5 + 8
                }
            ),
            (1, CpuTimes { busy: 5, total: 8 }),
        ]
    );
    assert!(parse_stat("cpu0 1 2\n").is_err());
    assert!(parse_stat("intr 5\n").is_err());
    // A CPU that came online between samples adds nothing until sampled twice.
    let before = [(0, CpuTimes { busy: 0, total: 0 })];
    let after = [
        (
            0,
            CpuTimes {
                busy: 50,
                total: 100,
            },
        ),
        (
            1,
            CpuTimes {
                busy: 100,
                total: 100,
            },
        ),
    ];
    assert_eq!(
        energy_pj(&before, &after, 1_000_000, 1_000_000, 2_000_000),
        2_000_000_000_000
    );
}

/// The same code on this machine's `/proc`: energy grows between reads and
/// stays within the model's bounds.
#[test]
fn this_machines_proc_stat() {
    let s = Settings::default();
    let mut e = Estimate::start(&args(), s.clone()).expect("start on /proc");
    let cpus = parse_stat(&std::fs::read_to_string("/proc/stat").expect("stat"))
        .expect("this kernel's /proc/stat parses")
        .len() as f64;
    let t0 = kernmlops_plugin_testing::uptime_us();
    assert_eq!(read(&mut e, t0), Ok(0));
    std::thread::sleep(Duration::from_millis(300));
    let t1 = kernmlops_plugin_testing::uptime_us();
    let uj = read(&mut e, t1).expect("reads") as f64;
    let secs = (t1 - t0) as f64 / 1e6;
    let (low, high) = (
        cpus * s.idle_watts_per_cpu * secs * 1e6,
        cpus * s.full_load_watts_per_cpu * secs * 1e6,
    );
    assert!(
        uj >= low * 0.999 && uj <= high * 1.001,
        "{uj} uJ in {secs}s is outside {low}..{high}"
    );
}
