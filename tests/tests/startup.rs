//! Probes start in parallel, and safely: two slow starts take about the
//! time of one (against one after another with `KERNMLOPS_SERIAL_START`),
//! and under `--strict` a probe the verifier rejects among real BPF probes
//! is the one named, the manifest keeps the order given, and once the run
//! has returned no BPF program, link or map of any probe is left in this
//! process (the run is made in process, so its descriptors are ours to
//! count).

use std::{
    collections::BTreeMap,
    sync::{atomic::AtomicBool, Arc},
    time::{Duration, Instant},
};

use kernmlops::{
    collect::{self, RunOptions},
    plugin::Registry,
    sink::FlushPolicy,
};
use kernmlops_e2e::*;

/// The "attached in N ms" of a run's "collecting" line.
fn attached_ms(stderr: &str) -> f64 {
    let at = stderr
        .find("(attached in ")
        .unwrap_or_else(|| panic!("no attach time:\n{stderr}"));
    let rest = &stderr[at + "(attached in ".len()..];
    rest[..rest.find(" ms").expect("ms")]
        .parse()
        .expect("a number of milliseconds")
}

/// Two fixture probes that each sleep 1 s in start attach together in
/// about 1 s; one after another (the benchmark's knob) they take 2 s.
#[test]
fn root_two_slow_probes_start_in_about_the_time_of_one() {
    if !require_root("root_two_slow_probes_start_in_about_the_time_of_one") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("slow-start", &[("fixture_hang", "hang")]);
    let output = temp_dir("slow-start-out");
    let attach = |serial_start: bool| {
        let mut cmd = std::process::Command::new(kernmlops_bin());
        cmd.args(["run", "--plugin-dir", plugins.to_str().expect("utf8")])
            .args(["--plugins", "starts_slowly_a,starts_slowly_b"])
            .args([
                "--duration",
                "1ms",
                "--output",
                output.to_str().expect("utf8"),
            ])
            .current_dir(workspace_root());
        if serial_start {
            cmd.env(collect::SERIAL_START_ENV, "1");
        } else {
            cmd.env_remove(collect::SERIAL_START_ENV);
        }
        let out = cmd.output().expect("running kernmlops");
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "the run succeeds:\n{stderr}");
        attached_ms(&stderr)
    };
    let parallel = attach(false);
    let serial = attach(true);
    eprintln!("two 1 s starts: parallel {parallel:.0} ms, one after another {serial:.0} ms");
    assert!(
        (1000.0..1600.0).contains(&parallel),
        "two 1 s starts in parallel attach in about 1 s: {parallel} ms"
    );
    assert!(
        serial >= 2000.0,
        "one after another they take 2 s (so the test can tell): {serial} ms"
    );
}

/// BPF objects (programs, links, maps) open in this process.
fn bpf_descriptors() -> Vec<String> {
    std::fs::read_dir("/proc/self/fd")
        .expect("reading /proc/self/fd")
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|l| l.to_string_lossy().into_owned())
        .filter(|l| l.starts_with("anon_inode:bpf"))
        .collect()
}

#[test]
fn root_a_probe_failing_among_parallel_starts_is_named_and_nothing_stays_attached() {
    if !require_root(
        "root_a_probe_failing_among_parallel_starts_is_named_and_nothing_stays_attached",
    ) {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir(
        "strict-start",
        &[
            ("quanta_runtime", "quanta_runtime"),
            ("process_trace", "process_trace"),
            ("block_io", "block_io"),
            ("fixture_bad_bpf", "bad_bpf"),
        ],
    );
    let output = temp_dir("strict-start-out");
    let registry = Registry::load_dir(&plugins).expect("loading the plugins");
    assert!(
        registry.failures.is_empty(),
        "every plugin loads: {:?}",
        registry.failures
    );
    assert_eq!(bpf_descriptors(), Vec::<String>::new(), "none before");
    // The count sees a started probe, and its release.
    let (plugin, _) = registry
        .resolve(&["quanta_runtime".to_owned()])
        .expect("quanta_runtime")[0];
    let args = collect::start_args("quanta_runtime", &RunOptions::default(), &BTreeMap::new());
    let probe = plugin
        .start_probe("quanta_runtime", &args)
        .expect("quanta_runtime starts");
    assert!(
        bpf_descriptors().iter().any(|d| d == "anon_inode:bpf-prog"),
        "a started probe holds programs: {:?}",
        bpf_descriptors()
    );
    drop(probe);
    assert_eq!(bpf_descriptors(), Vec::<String>::new(), "released");
    let order = ["quanta_runtime", "bad_bpf", "process_trace", "block_io"];
    let opts = RunOptions {
        probes: order.iter().map(|p| p.to_string()).collect(),
        output: output.clone(),
        duration: Some(Duration::from_secs(30)),
        drain_interval: Duration::from_millis(100),
        flush: FlushPolicy::default(),
        strict: true,
        probe_config: BTreeMap::new(),
        ..RunOptions::default()
    };
    let began = Instant::now();
    let summary = collect::run(&registry, &opts, Arc::new(AtomicBool::new(false)))
        .expect("the run ends with a summary");
    let took = began.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "--strict stops at the failure, not after 30 s: {took:?}"
    );
    let failures: Vec<&String> = summary
        .errors
        .iter()
        .filter(|e| e.starts_with("probe "))
        .collect();
    assert!(
        failures.len() == 1 && failures[0].starts_with("probe bad_bpf "),
        "the one failure named is bad_bpf's: {:?}",
        summary.errors
    );
    let man = manifest(&summary.dir);
    let probes: Vec<&str> = man["probes"]
        .as_array()
        .expect("probes")
        .iter()
        .map(|p| p["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        probes,
        ["quanta_runtime", "bad_bpf"],
        "the manifest keeps the order given, up to the first failure: {man}"
    );
    assert_eq!(
        bpf_descriptors(),
        Vec::<String>::new(),
        "no program, link or map of a started probe is left"
    );
}

/// The plugin files a process has mapped: the names of its sealed copies,
/// `/memfd:kernmlops:<file> (deleted)` in its maps.
fn mapped_plugin_files(pid: u32) -> std::collections::BTreeSet<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("reading its maps");
    maps.lines()
        .filter_map(|l| l.split_once("/memfd:kernmlops:").map(|(_, rest)| rest))
        .map(|rest| rest.trim_end_matches(" (deleted)").to_owned())
        .collect()
}

/// A run naming one probe maps the sealed copy of that probe's plugin and
/// of every third-party plugin, and of no other in-tree plugin; with
/// `KERNMLOPS_LOAD_EVERY_PLUGIN` (as before) it maps every one, so the
/// test can tell.
#[test]
fn root_a_run_naming_one_probe_opens_no_unrelated_in_tree_plugin() {
    if !require_root("root_a_run_naming_one_probe_opens_no_unrelated_in_tree_plugin") {
        return;
    }
    let _serial = serial();
    let plugins = all_plugins_dir("one-probe");
    std::fs::copy(built_so("fixture_hang"), plugins.join("third_party.so")).expect("copying");
    let output = temp_dir("one-probe-out");
    let every: std::collections::BTreeSet<String> = std::fs::read_dir(&plugins)
        .expect("reading the plugin folder")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(every.len() > 10, "every plugin is there: {every:?}");
    let mapped = |load_every: bool| {
        let mut cmd = std::process::Command::new(kernmlops_bin());
        cmd.args(["run", "--plugin-dir", plugins.to_str().expect("utf8")])
            .args(["--plugins", "memory_usage", "--duration", "60s", "--output"])
            .arg(&output)
            .current_dir(&output);
        if load_every {
            cmd.env(kernmlops::plugin::LOAD_EVERY_PLUGIN_ENV, "1");
        } else {
            cmd.env_remove(kernmlops::plugin::LOAD_EVERY_PLUGIN_ENV);
        }
        let collector = Collector::spawn(cmd);
        let files = mapped_plugin_files(collector.pid());
        let finished = collector.signal_and_wait(libc::SIGINT);
        assert!(
            finished.status.success(),
            "the run ends well:\n{}",
            finished.stderr
        );
        files
    };
    let wanted: std::collections::BTreeSet<String> = ["memory_usage.so", "third_party.so"]
        .map(String::from)
        .into();
    assert_eq!(
        mapped(false),
        wanted,
        "only the named probe's plugin and the third-party one are opened"
    );
    assert_eq!(mapped(true), every, "as before, every plugin is opened");
}

/// Every in-tree plugin offers at most the probe named after it: a run
/// leaves out the files of in-tree plugins whose names it does not ask
/// for (`plugin::Needed`), so this must hold.
#[test]
fn every_in_tree_plugin_offers_only_its_own_probe() {
    let plugins = all_plugins_dir("own-probe");
    let registry = Registry::load_dir(&plugins).expect("loading the plugins");
    assert!(registry.failures.is_empty(), "{:?}", registry.failures);
    assert_eq!(registry.plugins.len(), plugin_packages().len());
    for p in &registry.plugins {
        assert!(p.is_in_tree(), "{} ships with kernmlops", p.name());
        let probes: Vec<&str> = p.probes.iter().map(|d| d.name.as_str()).collect();
        assert!(
            probes.is_empty() || probes == [p.name()],
            "in-tree plugin {} offers probes {probes:?}: only one named after it may be offered, \
             or a run naming them would not load it (see plugin::Needed)",
            p.name()
        );
        let file = p.path.file_name().expect("a file").to_string_lossy();
        assert_eq!(file, format!("{}.so", p.name()), "installed under its name");
    }
}

/// Loading for named probes leaves out in-tree files that cannot offer
/// them; a probe none of the files loaded offers (here, a third-party
/// plugin installed under an in-tree plugin's file name) makes the rest
/// load too.
#[test]
fn loading_for_named_probes_skips_in_tree_files_and_falls_back_to_all() {
    use kernmlops::{plugin::Needed, trust::Policy};
    let plugins = plugin_dir(
        "needed",
        &[
            ("memory_usage", "memory_usage"),
            ("procfs", "procfs"),
            ("fixture_hang", "workloads"),
        ],
    );
    let policy = Policy::default();
    let load = |probe: &str| {
        let needed = Needed::Probes([probe.to_owned()].into());
        Registry::load_dir_for(&plugins, &policy, &needed).expect("loading")
    };
    let only = load("memory_usage");
    let names: Vec<&str> = only.plugins.iter().map(|p| p.name()).collect();
    assert_eq!(names, ["memory_usage"], "{:?}", only.failures);
    assert_eq!(
        only.skipped,
        [plugins.join("procfs.so"), plugins.join("workloads.so")]
    );
    let all = load("starts_slowly_a");
    assert!(all.skipped.is_empty(), "{:?}", all.skipped);
    assert!(
        all.find_probe("starts_slowly_a").is_some(),
        "found in workloads.so: {:?}",
        all.failures
    );
    assert_eq!(all.plugins.len(), 3, "{:?}", all.failures);
}
