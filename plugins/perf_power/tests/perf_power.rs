//! The perf_power source against PMU trees the test writes: event
//! discovery per package, scale and unit (counts to microjoules), counts
//! that go backwards; and the real PMU when this machine has one.

use std::{
    io,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use kernmlops_plugin_sdk::{
    api::{validate_power_source, validate_power_zones, PowerScope},
    power::{PowerSourceImpl, SysfsRoot, ZoneReading},
};
use perf_power::{has_power_pmu, plan, Counter, PerfPower, Settings};

struct Tree(PathBuf);

impl Tree {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("kml-perfpower-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        Self(d)
    }

    fn write(&self, rel: &str, text: &str) {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("dirs");
        std::fs::write(p, format!("{text}\n")).expect("write");
    }

    /// A two-package machine's PMU: pkg, cores, ram, psys.
    fn machine(&self) {
        let pmu = "bus/event_source/devices/power";
        self.write(&format!("{pmu}/type"), "23");
        self.write(&format!("{pmu}/cpumask"), "0,2");
        self.write(&format!("{pmu}/format/event"), "config:0-7");
        for (e, code, scale) in [
            ("energy-pkg", "0x02", "2.3283064365386962890625e-10"),
            ("energy-cores", "0x01", "2.3283064365386962890625e-10"),
            ("energy-ram", "0x03", "6.103515625e-05"),
            ("energy-psys", "0x05", "2.3283064365386962890625e-10"),
        ] {
            self.write(&format!("{pmu}/events/{e}"), &format!("event={code}"));
            self.write(&format!("{pmu}/events/{e}.scale"), scale);
            self.write(&format!("{pmu}/events/{e}.unit"), "Joules");
        }
        self.write(&format!("{pmu}/events/energy-gpu"), "event=0x04");
        self.write(&format!("{pmu}/events/energy-gpu.scale"), "1e-6");
        self.write(&format!("{pmu}/events/energy-gpu.unit"), "Watts");
        self.write("devices/system/cpu/cpu0/topology/physical_package_id", "0");
        self.write("devices/system/cpu/cpu2/topology/physical_package_id", "1");
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A counter whose count the test sets.
#[derive(Clone, Default)]
struct Fake(Arc<Mutex<u64>>);

impl Counter for Fake {
    fn count(&mut self) -> io::Result<u64> {
        Ok(*self.0.lock().expect("lock"))
    }
}

impl Fake {
    fn set(&self, v: u64) {
        *self.0.lock().expect("lock") = v;
    }
}

fn read(p: &mut PerfPower) -> Vec<ZoneReading> {
    let mut out = Vec::new();
    p.read(0, &mut out).expect("read");
    out
}

#[test]
fn declaration_and_defaults_meet_the_rules() {
    kernmlops_plugin_testing::check_settings_defaults::<Settings>("[power.settings.perf_power]");
    validate_power_source(&kernmlops_plugin_sdk::power::declaration::<PerfPower>()).expect("decl");
}

#[test]
fn events_become_zones_per_package() {
    let t = Tree::new("plan");
    t.machine();
    let (planned, notes) = plan(&SysfsRoot::new(&t.0)).expect("plan");
    let zones: Vec<(String, PowerScope, i32, String, u32, u64)> = planned
        .iter()
        .map(|p| {
            let z = p.zone.to_abi();
            (
                z.name.to_string(),
                z.scope,
                z.socket,
                z.parent.to_string(),
                p.cpu,
                p.spec.config,
            )
        })
        .collect();
    let z = |n: &str, s, k, p: &str, cpu, config| (n.to_owned(), s, k, p.to_owned(), cpu, config);
    assert_eq!(
        zones,
        vec![
            z("package-0", PowerScope::PACKAGE, 0, "", 0, 2),
            z("package-1", PowerScope::PACKAGE, 1, "", 2, 2),
            z("core-0", PowerScope::CORE, 0, "package-0", 0, 1),
            z("core-1", PowerScope::CORE, 1, "package-1", 2, 1),
            z("dram-0", PowerScope::DRAM, 0, "", 0, 3),
            z("dram-1", PowerScope::DRAM, 1, "", 2, 3),
            z("psys", PowerScope::PLATFORM, -1, "", 0, 5),
        ]
    );
    assert!(
        notes.len() == 1 && notes[0].contains("energy-gpu") && notes[0].contains("Watts"),
        "an event in another unit is skipped: {notes:?}"
    );
    let abi: Vec<_> = planned.iter().map(|p| p.zone.to_abi()).collect();
    validate_power_zones(&abi).expect("the host accepts the zones");
}

/// 2^32 counts of 2^-32 J is one joule; DRAM's 6.1e-5 J counts scale by
/// their own factor; the first read is the baseline.
#[test]
fn counts_scale_to_microjoules() {
    let t = Tree::new("scale");
    t.machine();
    let (planned, notes) = plan(&SysfsRoot::new(&t.0)).expect("plan");
    let fakes: Vec<Fake> = planned.iter().map(|_| Fake::default()).collect();
    let counters = fakes
        .iter()
        .map(|f| Box::new(f.clone()) as Box<dyn Counter>)
        .collect();
    let mut p = PerfPower::with_counters(planned, counters, notes).expect("source");
    for f in &fakes {
        f.set(1000);
    }
    assert!(read(&mut p).iter().all(|r| *r == Ok(0)));
    fakes[0].set(1000 + (1u64 << 32)); // package-0: 1 J
    fakes[4].set(1000 + 16_384); // dram-0: 16384 x 6.103515625e-05 J = 1 J
    fakes[1].set(1000 + (3u64 << 31)); // package-1: 1.5 J
    let out = read(&mut p);
    assert_eq!(out[0], Ok(1_000_000));
    assert_eq!(out[1], Ok(1_500_000));
    assert_eq!(out[4], Ok(1_000_000));
    assert_eq!(out[2], Ok(0));
    fakes[6].set(10);
    let out = read(&mut p);
    assert!(
        out[6]
            .clone()
            .expect_err("backwards")
            .contains("went backwards from 1000 to 10"),
        "{out:?}"
    );
}

#[test]
fn no_pmu_is_a_plain_reason() {
    let t = Tree::new("none");
    t.write("bus/event_source/devices/cpu/type", "4");
    let e = plan(&SysfsRoot::new(&t.0)).expect_err("no PMU");
    assert!(e.message.starts_with("no power PMU here"), "{e}");
}

/// The same code on this machine's PMU when it has one: counters open (as
/// root or with CAP_PERFMON) and count up.
#[test]
fn this_machines_power_pmu() {
    let root = SysfsRoot::default();
    if !has_power_pmu(&root) {
        let e = plan(&root).expect_err("no PMU here");
        assert!(e.message.starts_with("no power PMU here"), "{e}");
        eprintln!("no real power PMU to test against: {e}");
        return;
    }
    let mut p = match PerfPower::start(
        &kernmlops_plugin_testing::start_args("{}"),
        Settings::default(),
    ) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("power PMU present but not openable here: {e}");
            return;
        }
    };
    let abi: Vec<_> = p.zones().iter().map(|z| z.to_abi()).collect();
    validate_power_zones(&abi).expect("real zones pass the host's rules");
    read(&mut p);
    std::thread::sleep(Duration::from_millis(200));
    let out = read(&mut p);
    assert!(out.iter().all(Result::is_ok), "{out:?}");
}
