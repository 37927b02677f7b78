//! The rapl source against powercap trees the test writes and advances:
//! sub-zone discovery, wrap-around at `max_energy_range_uj`, a counter that
//! goes backwards, a vanished file; and the same code on this machine's own
//! powercap tree when it has one.

use std::{path::PathBuf, time::Duration};

use kernmlops_plugin_sdk::{
    api::{validate_power_source, validate_power_zones, PowerScope},
    power::{PowerSourceImpl, SysfsRoot, ZoneReading},
};
use rapl::{discover, Rapl, Settings};

/// A written sysfs tree, removed on drop.
struct Tree(PathBuf);

impl Tree {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("kml-rapl-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("class/powercap/intel-rapl")).expect("tree");
        std::fs::write(d.join("class/powercap/intel-rapl/enabled"), "1\n").expect("control type");
        Self(d)
    }

    /// A zone folder with its name, range and counter.
    fn zone(&self, entry: &str, name: &str, range: u64, energy: u64) {
        let dir = self.0.join("class/powercap").join(entry);
        std::fs::create_dir_all(&dir).expect("zone dir");
        std::fs::write(dir.join("name"), format!("{name}\n")).expect("name");
        std::fs::write(dir.join("max_energy_range_uj"), format!("{range}\n")).expect("range");
        self.set(entry, energy);
    }

    fn set(&self, entry: &str, energy: u64) {
        let path = self.0.join("class/powercap").join(entry).join("energy_uj");
        std::fs::write(path, format!("{energy}\n")).expect("energy");
    }

    fn settings(&self) -> Settings {
        Settings {
            sysfs_root: SysfsRoot::new(&self.0),
        }
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn read(r: &mut Rapl) -> Vec<ZoneReading> {
    let mut out = Vec::new();
    r.read(0, &mut out).expect("read");
    out
}

fn start(tree: &Tree) -> Rapl {
    Rapl::start(&kernmlops_plugin_testing::start_args("{}"), tree.settings()).expect("start")
}

#[test]
fn declaration_and_defaults_meet_the_rules() {
    kernmlops_plugin_testing::check_settings_defaults::<Settings>("[power.settings.rapl]");
    validate_power_source(&kernmlops_plugin_sdk::power::declaration::<Rapl>()).expect("decl");
    assert_eq!(Settings::default().sysfs_root, SysfsRoot::new("/sys"));
}

/// Two sockets with core, uncore and DRAM sub-zones, psys, and an MMIO
/// copy of package 0: every zone found once, with scope, socket and parent.
#[test]
fn sub_zones_are_found_with_scope_socket_and_parent() {
    let t = Tree::new("discover");
    t.zone("intel-rapl:0", "package-0", 262_143_328_850, 1);
    t.zone("intel-rapl:0:0", "core", 262_143_328_850, 1);
    t.zone("intel-rapl:0:1", "uncore", 262_143_328_850, 1);
    t.zone("intel-rapl:0:2", "dram", 65_712_999_613, 1);
    t.zone("intel-rapl:1", "package-1", 262_143_328_850, 1);
    t.zone("intel-rapl:1:0", "dram", 65_712_999_613, 1);
    t.zone("intel-rapl:2", "psys", 262_143_328_850, 1);
    t.zone("intel-rapl-mmio:0", "package-0", 262_143_328_850, 1);
    let (found, notes) = discover(&t.settings().sysfs_root).expect("discovers");
    let zones: Vec<(String, PowerScope, i32, String)> = found
        .iter()
        .map(|f| {
            let a = f.zone.to_abi();
            (a.name.to_string(), a.scope, a.socket, a.parent.to_string())
        })
        .collect();
    let want = |n: &str, s, k, p: &str| (n.to_owned(), s, k, p.to_owned());
    assert_eq!(
        zones,
        vec![
            want("package-0", PowerScope::PACKAGE, 0, ""),
            want("core-0", PowerScope::CORE, 0, "package-0"),
            want("uncore-0", PowerScope::UNCORE, 0, "package-0"),
            want("dram-0", PowerScope::DRAM, 0, ""),
            want("package-1", PowerScope::PACKAGE, 1, ""),
            want("dram-1", PowerScope::DRAM, 1, ""),
            want("psys", PowerScope::PLATFORM, -1, ""),
        ]
    );
    assert_eq!(notes.len(), 1, "the MMIO copy is noted: {notes:?}");
    assert!(notes[0].contains("intel-rapl-mmio:0"), "{notes:?}");
    let abi: Vec<_> = found.iter().map(|f| f.zone.to_abi()).collect();
    validate_power_zones(&abi).expect("the host accepts the zones");
    assert!(abi
        .iter()
        .all(|z| z.measured && z.update_interval_us == 1000));
}

/// The first read is the baseline; a counter that passes
/// `max_energy_range_uj` continues from it.
#[test]
fn wrap_around_is_corrected() {
    let t = Tree::new("wrap");
    t.zone("intel-rapl:0", "package-0", 1_000_000, 900_000);
    let mut r = start(&t);
    assert_eq!(read(&mut r), vec![Ok(0)]);
    t.set("intel-rapl:0", 950_000);
    assert_eq!(read(&mut r), vec![Ok(50_000)]);
    // Wrapped: 50 000 to the range, then 30 000 more.
    t.set("intel-rapl:0", 30_000);
    assert_eq!(read(&mut r), vec![Ok(130_000)]);
    t.set("intel-rapl:0", 130_000);
    assert_eq!(read(&mut r), vec![Ok(230_000)]);
}

/// A counter that goes back a little is not a wrap: its zone fails with
/// the values, the others go on.
#[test]
fn a_backwards_counter_fails_its_zone_only() {
    let t = Tree::new("backwards");
    t.zone("intel-rapl:0", "package-0", 1_000_000, 500_000);
    t.zone("intel-rapl:0:2", "dram", 1_000_000, 100);
    let mut r = start(&t);
    assert_eq!(read(&mut r), vec![Ok(0), Ok(0)]);
    t.set("intel-rapl:0", 490_000);
    t.set("intel-rapl:0:2", 200);
    let out = read(&mut r);
    let err = out[0].clone().expect_err("backwards");
    assert!(
        err.contains("went backwards from 500000 to 490000"),
        "{err}"
    );
    assert_eq!(out[1], Ok(100));
}

#[test]
fn a_vanished_counter_says_so() {
    let t = Tree::new("vanish");
    t.zone("intel-rapl:0", "package-0", 1_000_000, 5);
    let mut r = start(&t);
    read(&mut r);
    std::fs::remove_file(t.0.join("class/powercap/intel-rapl:0/energy_uj")).expect("remove");
    let err = read(&mut r)[0].clone().expect_err("vanished");
    assert!(err.contains("vanished"), "{err}");
}

#[test]
fn no_powercap_tree_is_a_plain_reason() {
    let t = Tree::new("empty");
    let e = discover(&t.settings().sysfs_root).expect_err("no zones");
    assert!(e.message.starts_with("no RAPL here:"), "{e}");
    let e = discover(&SysfsRoot::new("/nonexistent")).expect_err("no tree");
    assert!(e.message.contains("does not exist"), "{e}");
}

/// The same code on this machine's powercap tree, when it has one (and
/// root can read it); otherwise the reason it has none.
#[test]
fn this_machines_powercap_tree() {
    match discover(&SysfsRoot::default()) {
        Err(e) => {
            assert!(e.message.starts_with("no RAPL here:"), "{e}");
            eprintln!("no real RAPL to test against: {e}");
        }
        Ok((found, _)) => {
            let abi: Vec<_> = found.iter().map(|f| f.zone.to_abi()).collect();
            validate_power_zones(&abi).expect("real zones pass the host's rules");
            let Ok(mut r) = Rapl::start(
                &kernmlops_plugin_testing::start_args("{}"),
                Settings::default(),
            ) else {
                eprintln!("RAPL found but not readable (not root)");
                return;
            };
            assert!(read(&mut r).iter().all(|x| *x == Ok(0)));
            std::thread::sleep(Duration::from_millis(200));
            let second = read(&mut r);
            assert!(second.iter().all(Result::is_ok), "{second:?}");
            assert!(
                second.iter().any(|x| *x.as_ref().unwrap_or(&0) > 0),
                "some zone used energy in 200 ms: {second:?}"
            );
        }
    }
}
