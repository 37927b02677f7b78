//! A cluster of `scripts/slurm-local up --nodes N` for the Slurm tests
//! (`slurm.rs`, `slurm_local.rs`, `roles_slurm.rs`, `build_slurm.rs`), in
//! a folder, on ports and in a /24 of the test process's own, taken down
//! when dropped, pass or fail, and checked to leave nothing behind.

// Each test file uses the part it needs.
#![allow(dead_code)]

use std::{
    path::PathBuf,
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
};

use kernmlops_e2e::*;

/// Clusters made by this test process so far (each gets its own ports and
/// /24).
pub static CLUSTERS: AtomicU32 = AtomicU32::new(0);

/// Where and on what a cluster of `scripts/slurm-local` lives: a folder,
/// ports and a /24 of this test process's own.
pub struct Place {
    pub dir: PathBuf,
    pub port: u32,
    pub net: String,
}

impl Place {
    pub fn new() -> Self {
        let pid = std::process::id();
        let k = CLUSTERS.fetch_add(1, Ordering::SeqCst);
        Self {
            dir: PathBuf::from(format!("/run/kml-slurm-local-e2e-{pid}-{k}")),
            port: 26000 + (pid % 1500) * 4 + (k % 2) * 2,
            net: format!("10.201.{}", 1 + (pid + k) % 250),
        }
    }

    pub fn script(&self, args: &[&str]) -> Output {
        self.script_command(args)
            .output()
            .expect("running scripts/slurm-local")
    }

    pub fn script_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(workspace_root().join("scripts/slurm-local"));
        cmd.args(args)
            .env("KERNMLOPS_SLURM_DIR", &self.dir)
            .env("KERNMLOPS_SLURM_PORT", self.port.to_string())
            .env("KERNMLOPS_SLURM_NET", &self.net);
        cmd
    }

    pub fn conf(&self) -> PathBuf {
        self.dir.join("slurm.conf")
    }

    /// What of this place exists: network namespaces and links named
    /// after its port, its folder, and processes whose command line names
    /// the folder (the daemons are started with paths inside it).
    pub fn leftovers(&self) -> Vec<String> {
        let tag = format!("kml{}", self.port);
        let mut left = Vec::new();
        let netns = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip netns list");
        left.extend(
            text(&netns.stdout)
                .lines()
                .filter(|l| l.starts_with(&format!("{tag}-")))
                .map(|l| format!("netns {l}")),
        );
        let links = Command::new("ip")
            .args(["-o", "link", "show"])
            .output()
            .expect("ip link");
        left.extend(
            text(&links.stdout)
                .lines()
                .filter_map(|l| l.split(": ").nth(1))
                .filter(|name| name.starts_with(&tag))
                .map(|name| format!("link {name}")),
        );
        if self.dir.exists() {
            left.push(format!("folder {}", self.dir.display()));
        }
        let needle = self.dir.to_string_lossy().into_owned();
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.bytes().all(|b| b.is_ascii_digit()) || name == std::process::id().to_string() {
                continue;
            }
            if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
                let cmdline = text(&cmdline).replace('\0', " ");
                if cmdline.contains(&needle) {
                    left.push(format!("process {name}: {cmdline}"));
                }
            }
        }
        left
    }
}

/// A cluster of `nodes` nodes, taken down (its jobs cancelled, daemons
/// stopped, namespaces, bridge, veths and folder removed) when dropped,
/// also when the test fails.
pub struct Cluster {
    pub place: Place,
}

impl Cluster {
    pub fn up(nodes: u32) -> Self {
        let place = Place::new();
        let out = place.script(&["up", "--nodes", &nodes.to_string()]);
        let cluster = Self { place };
        assert!(
            out.status.success(),
            "scripts/slurm-local up --nodes {nodes} failed:\n{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        cluster
    }

    /// A Slurm client command against this cluster, for at most 120 s.
    pub fn tool(&self, program: &str, args: &[&str]) -> Output {
        Command::new("timeout")
            .arg("120")
            .arg(program)
            .args(args)
            .env("SLURM_CONF", self.place.conf())
            .output()
            .unwrap_or_else(|e| panic!("running {program}: {e}"))
    }

    pub fn ok(&self, program: &str, args: &[&str]) -> String {
        let out = self.tool(program, args);
        assert!(
            out.status.success(),
            "{program} {args:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// Waits (at most 60 s) until the controller has no job queued or
    /// running.
    pub fn wait_for_no_jobs(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !self.active_jobs().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "jobs left: {:?}",
                self.active_jobs()
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// Jobs the controller has queued or running.
    pub fn active_jobs(&self) -> Vec<String> {
        self.ok("squeue", &["--noheader", "--format=%i"])
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let out = self.place.script(&["down"]);
        if !out.status.success() {
            eprintln!("scripts/slurm-local down failed:\n{}", text(&out.stderr));
        }
        if !std::thread::panicking() {
            assert_eq!(self.place.leftovers(), Vec::<String>::new(), "left behind");
        }
    }
}

pub fn require(test: &str) -> bool {
    require_root(test)
        && require_tool(test, "sbatch")
        && require_tool(test, "srun")
        && require_tool(test, "slurmctld")
        && require_tool(test, "munged")
        && require_tool(test, "ip")
        && require_tool(test, "unshare")
        && require_tool(test, "nsenter")
        && require_tool(test, "python3")
}

/// `kernmlops --plugin-dir P experiment ARGS` against `cluster`.
pub fn experiment(cluster: &Cluster, plugins: &std::path::Path, args: &[&str]) -> Output {
    Command::new(kernmlops_bin())
        .arg("--plugin-dir")
        .arg(plugins)
        .arg("experiment")
        .args(args)
        .env("SLURM_CONF", cluster.place.conf())
        .current_dir(workspace_root())
        .output()
        .expect("running kernmlops experiment")
}

/// The job id of `submitted N runs to Slurm as job J ...`.
pub fn submitted_job(stdout: &str, runs: usize) -> String {
    let prefix = format!(
        "submitted {runs} run{} to Slurm as job ",
        if runs == 1 { "" } else { "s" }
    );
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no {prefix:?} line in:\n{stdout}"))
        .to_owned()
}

/// `experiment ARGS` (a `run` or `resume` with `--executor slurm`)
/// against `cluster`, which must succeed and submit `runs` runs; the job
/// id.
pub fn submit(cluster: &Cluster, plugins: &std::path::Path, args: &[&str], runs: usize) -> String {
    let out = experiment(cluster, plugins, args);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    submitted_job(&stdout, runs)
}

/// Run ids of submission `n`, in array order.
pub fn submission_runs(dir: &std::path::Path, n: u32) -> Vec<String> {
    let path = dir.join("slurm").join(format!("submit-{n:04}.runs"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Each run's state in `experiment status DIR --json`, by run id.
pub fn states(
    cluster: &Cluster,
    plugins: &std::path::Path,
    dir: &std::path::Path,
) -> (
    serde_json::Value,
    std::collections::BTreeMap<String, String>,
) {
    let out = experiment(
        cluster,
        plugins,
        &["status", dir.to_str().expect("utf-8"), "--json"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let st: serde_json::Value = serde_json::from_str(&text(&out.stdout)).expect("status JSON");
    let runs = by_id(&st);
    (st, runs)
}

/// Each run's state in `experiment status --json` output, by run id.
pub fn by_id(st: &serde_json::Value) -> std::collections::BTreeMap<String, String> {
    st["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| {
            (
                r["run_id"].as_str().expect("run_id").to_owned(),
                r["state"].as_str().expect("state").to_owned(),
            )
        })
        .collect()
}

/// Polls `experiment status` until `done` holds of the run states, for at
/// most `limit`; panics with the status and every log otherwise.
pub fn wait_for_states(
    cluster: &Cluster,
    plugins: &std::path::Path,
    dir: &std::path::Path,
    limit: std::time::Duration,
    what: &str,
    done: impl Fn(&std::collections::BTreeMap<String, String>) -> bool,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let (st, by_id) = states(cluster, plugins, dir);
        if done(&by_id) {
            return st;
        }
        if std::time::Instant::now() > deadline {
            panic!(
                "{what}: not after {} s:\n{st:#}\n{}",
                limit.as_secs(),
                experiment_logs(dir)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

/// How many runs are in `state`.
pub fn count(by_id: &std::collections::BTreeMap<String, String>, state: &str) -> usize {
    by_id.values().filter(|s| *s == state).count()
}
