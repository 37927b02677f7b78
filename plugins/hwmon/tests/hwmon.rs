//! The hwmon source against hwmon trees the test writes and advances: a
//! device with only power sensors integrates to the right energy, energy
//! counters win over power sensors, labels give zones and scopes, units
//! (µW, µJ) scale right, a counter going backwards fails its zone; and the
//! same code on this machine's hwmon tree when it has one.

use std::{path::PathBuf, time::Duration};

use hwmon::{classify, zone_name, Hwmon, Settings};
use kernmlops_plugin_sdk::{
    api::{validate_power_source, validate_power_zones, PowerScope},
    power::{PowerSourceImpl, SysfsRoot, ZoneReading},
    HumanDuration,
};

struct Tree(PathBuf);

impl Tree {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("kml-hwmon-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("class/hwmon")).expect("tree");
        Self(d)
    }

    fn write(&self, device: &str, file: &str, value: &str) {
        let dir = self.0.join("class/hwmon").join(device);
        std::fs::create_dir_all(&dir).expect("device dir");
        std::fs::write(dir.join(file), format!("{value}\n")).expect("write");
    }

    fn start(&self) -> Hwmon {
        Hwmon::start(
            &kernmlops_plugin_testing::start_args("{}"),
            Settings {
                sysfs_root: SysfsRoot::new(&self.0),
                update_interval: HumanDuration::from_millis(100),
            },
        )
        .expect("start")
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn read(h: &mut Hwmon, now_us: u64) -> Vec<ZoneReading> {
    let mut out = Vec::new();
    h.read(now_us, &mut out).expect("read");
    out
}

#[test]
fn declaration_and_defaults_meet_the_rules() {
    kernmlops_plugin_testing::check_settings_defaults::<Settings>("[power.settings.hwmon]");
    validate_power_source(&kernmlops_plugin_sdk::power::declaration::<Hwmon>()).expect("decl");
}

/// Only `power1_input` in µW: 5 W for a second is 5 J (5 000 000 µJ); then
/// 5 W rising to 7 W over half a second is 3 J more (trapezoid).
#[test]
fn power_only_sensors_integrate_to_the_right_energy() {
    let t = Tree::new("power");
    t.write("hwmon0", "name", "power_meter");
    t.write("hwmon0", "power1_input", "5000000");
    t.write("hwmon0", "power1_average_interval", "250");
    let mut h = t.start();
    let zones: Vec<_> = h.zones().iter().map(|z| z.to_abi()).collect();
    validate_power_zones(&zones).expect("zones");
    assert_eq!(zones.len(), 1);
    assert_eq!(zones[0].name.as_str(), "power_meter-power1");
    assert_eq!(zones[0].scope, PowerScope::PLATFORM);
    assert_eq!(
        zones[0].update_interval_us, 250_000,
        "power1_average_interval"
    );
    assert!(zones[0].measured);
    assert_eq!(read(&mut h, 10_000_000), vec![Ok(0)]);
    assert_eq!(read(&mut h, 11_000_000), vec![Ok(5_000_000)]);
    t.write("hwmon0", "power1_input", "7000000");
    assert_eq!(read(&mut h, 11_500_000), vec![Ok(8_000_000)]);
    // Down to 1 mW a millisecond later: (7 W + 1 mW) / 2 x 1 ms = 3500.5 uJ,
    // kept exactly inside and shown whole.
    t.write("hwmon0", "power1_input", "1000");
    assert_eq!(read(&mut h, 11_501_000), vec![Ok(8_003_500)]);
}

/// A device with energy counters uses them (µJ as they are) and not its
/// power sensors; labels name the zones and decide the scope.
#[test]
fn energy_counters_come_first_and_labels_name_zones() {
    let t = Tree::new("energy");
    t.write("hwmon3", "name", "amd_energy");
    t.write("hwmon3", "energy1_input", "1000");
    t.write("hwmon3", "energy1_label", "Esocket0");
    t.write("hwmon3", "energy2_input", "70");
    t.write("hwmon3", "energy2_label", "Ecore000");
    t.write("hwmon3", "power1_input", "9999");
    t.write("hwmon1", "name", "nvme");
    t.write("hwmon1", "temp1_input", "40000");
    let mut h = t.start();
    let zones: Vec<_> = h.zones().iter().map(|z| z.to_abi()).collect();
    let names: Vec<&str> = zones.iter().map(|z| z.name.as_str()).collect();
    assert_eq!(names, ["amd_energy-esocket0", "amd_energy-ecore000"]);
    assert_eq!((zones[0].scope, zones[0].socket), (PowerScope::PACKAGE, 0));
    assert_eq!(zones[1].scope, PowerScope::CORE);
    assert_eq!(read(&mut h, 0), vec![Ok(0), Ok(0)]);
    t.write("hwmon3", "energy1_input", "3500");
    t.write("hwmon3", "energy2_input", "60");
    let out = read(&mut h, 1);
    assert_eq!(out[0], Ok(2500));
    assert!(
        out[1]
            .clone()
            .expect_err("backwards")
            .contains("went backwards from 70 to 60"),
        "{out:?}"
    );
}

#[test]
fn labels_give_scopes_and_safe_names() {
    for (device, label, scope) in [
        ("power_meter", "power1", PowerScope::PLATFORM),
        ("xgene_hwmon", "SoC power", PowerScope::PACKAGE),
        ("xgene_hwmon", "DRAM power", PowerScope::DRAM),
        ("amdgpu", "PPT", PowerScope::DEVICE),
        ("corsairpsu", "power total", PowerScope::PLATFORM),
    ] {
        assert_eq!(classify(device, label).0, scope, "{device} {label}");
    }
    assert_eq!(zone_name("dev", "SoC Power (W)"), "dev-soc_power__w_");
    assert_eq!(zone_name("d", &"x".repeat(80)).len(), 47);
}

#[test]
fn no_sensor_is_a_plain_reason() {
    let t = Tree::new("none");
    t.write("hwmon0", "name", "coretemp");
    t.write("hwmon0", "temp1_input", "40000");
    let e = hwmon::discover(&SysfsRoot::new(&t.0), Duration::from_millis(100))
        .expect_err("no power sensor");
    assert!(
        e.message
            .starts_with("no hwmon power or energy sensor here"),
        "{e}"
    );
}

/// The same code on this machine's hwmon tree, when it has power sensors.
#[test]
fn this_machines_hwmon_tree() {
    match hwmon::discover(&SysfsRoot::default(), Duration::from_millis(100)) {
        Err(e) => {
            assert!(
                e.message
                    .starts_with("no hwmon power or energy sensor here"),
                "{e}"
            );
            eprintln!("no real hwmon power sensor to test against: {e}");
        }
        Ok(sensors) => {
            let abi: Vec<_> = sensors.iter().map(|s| s.zone.to_abi()).collect();
            validate_power_zones(&abi).expect("real zones pass the host's rules");
            let mut h = Hwmon::start(
                &kernmlops_plugin_testing::start_args("{}"),
                Settings::default(),
            )
            .expect("start");
            let t0 = kernmlops_plugin_testing::uptime_us();
            assert!(read(&mut h, t0).iter().all(Result::is_ok));
            std::thread::sleep(Duration::from_millis(300));
            assert!(read(&mut h, t0 + 300_000).iter().all(Result::is_ok));
        }
    }
}
