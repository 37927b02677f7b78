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
