//! Harness for the end-to-end tests: builds and finds the binary and plugin
//! `.so` files, runs collections the way a user does, and reads the results.
//!
//! Tests that need root are named `root_*` and call [`require_root`]: without
//! root they skip with a printed reason, except under `CI=true`, where a skip
//! is a failure.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{mpsc, Mutex, MutexGuard, Once},
    time::{Duration, Instant},
};

use arrow_array::RecordBatch;

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_owned()
}

/// `target/release` (the tests always use release artifacts, built once).
pub fn artifact_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let target = if target.is_absolute() {
        target
    } else {
        workspace_root().join(target)
    };
    target.join("release")
}

/// Builds the workspace (binary, every plugin, fixtures) in release mode
/// once per test process, as `scripts/test` builds it (without
/// kernmlops-plugin-build as a library of its own, whose dependencies would
/// change the features the plugins and the host are built with), so a
/// no-op after its build. Set `KERNMLOPS_E2E_SKIP_BUILD=1` to use the
/// artifacts as they are.
pub fn ensure_built() {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| {
        if std::env::var_os("KERNMLOPS_E2E_SKIP_BUILD").is_some() {
            return;
        }
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.current_dir(workspace_root())
            .args(["build", "--release", "--quiet", "--workspace"])
            .args(["--exclude", "kernmlops-plugin-build"]);
        let out = cmd.output().expect("running cargo build");
        assert!(
            out.status.success(),
            "building test artifacts failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// A `Command` for the Python interpreter itself (`sys.executable`), not
/// `python3` as `PATH` finds it: a version manager's shim there runs a
/// shell script with children of its own before the interpreter, and a
/// test that places a worker in a cgroup, or counts its rows, must see one
/// process.
pub fn python3() -> Command {
    static EXE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let exe = EXE.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("running python3");
        assert!(out.status.success(), "python3: {}", text(&out.stderr));
        PathBuf::from(text(&out.stdout).trim())
    });
    Command::new(exe)
}

pub fn kernmlops_bin() -> PathBuf {
    ensure_built();
    artifact_dir().join("kernmlops")
}

/// Path of a built cdylib by package name.
pub fn built_so(package: &str) -> PathBuf {
    ensure_built();
    let p = artifact_dir().join(format!("lib{package}.so"));
    assert!(p.is_file(), "{} was not built", p.display());
    p
}

/// Temporary folders made by [`temp_dir`], removed when the test process
/// exits, pass or fail.
static TEMP_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

extern "C" fn remove_temp_dirs() {
    if let Ok(dirs) = TEMP_DIRS.lock() {
        for d in dirs.iter() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// A fresh temporary folder for one test, removed when the test process
/// exits, whether its tests passed or failed; `KERNMLOPS_KEEP_TMP=1` keeps
/// it for debugging.
pub fn temp_dir(name: &str) -> PathBuf {
    static REGISTER: Once = Once::new();
    let d = std::env::temp_dir().join(format!("kml-e2e-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("creating temp dir");
    if std::env::var_os("KERNMLOPS_KEEP_TMP").is_none_or(|v| v != "1") {
        REGISTER.call_once(|| {
            // SAFETY: registers a function without arguments that only
            // removes folders; it runs once, when the process exits.
            unsafe { libc::atexit(remove_temp_dirs) };
        });
        if let Ok(mut dirs) = TEMP_DIRS.lock() {
            dirs.push(d.clone());
        }
    }
    d
}

/// A plugin folder holding copies of the named packages' `.so` files, each
/// as `<file name>.so`.
pub fn plugin_dir(name: &str, plugins: &[(&str, &str)]) -> PathBuf {
    let dir = temp_dir(&format!("{name}-plugins"));
    for (package, file) in plugins {
        std::fs::copy(built_so(package), dir.join(format!("{file}.so"))).expect("copying plugin");
    }
    dir
}

/// Package names of every plugin crate under `plugins/`.
pub fn plugin_packages() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(workspace_root().join("plugins"))
        .expect("reading plugins/")
        .filter_map(|e| e.ok().map(|e| e.path().join("Cargo.toml")))
        .filter_map(|manifest| std::fs::read_to_string(manifest).ok())
        .filter_map(|text| {
            text.lines().find_map(|l| {
                let v = l.trim().strip_prefix("name")?.trim().strip_prefix('=')?;
                Some(v.trim().trim_matches('"').to_owned())
            })
        })
        .collect();
    names.sort();
    names
}

/// A plugin folder holding every plugin of the workspace.
pub fn all_plugins_dir(name: &str) -> PathBuf {
    let packages = plugin_packages();
    let pairs: Vec<(&str, &str)> = packages.iter().map(|p| (p.as_str(), p.as_str())).collect();
    plugin_dir(name, &pairs)
}

/// Where cgroup v2 is mounted (`/sys/fs/cgroup`, or `.../unified` on a
/// hybrid hierarchy): the collector's own answer, from `kernmlops_sys`.
pub use kernmlops_sys::cgroup::cgroup2_mount;

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Returns false (and says why) when a root-only test must skip; panics
/// instead under CI, where every test must run.
pub fn require_root(test: &str) -> bool {
    if is_root() {
        return true;
    }
    assert!(
        !in_ci(),
        "{test} needs root, and CI must run it: run the tests as root"
    );
    eprintln!("SKIP {test}: needs root (run the tests with sudo)");
    false
}

/// Returns false (and says why) when a tool is missing; panics under CI.
pub fn require_tool(test: &str, tool: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return true;
    }
    assert!(
        !in_ci(),
        "{test} needs {tool}, which CI must install (scripts/setup.sh)"
    );
    eprintln!("SKIP {test}: {tool} is not installed");
    false
}

/// Collector tests take the whole machine's scheduler activity into account,
/// so they run one at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `kernmlops ARGS` to completion.
pub fn kernmlops(args: &[&str]) -> Output {
    Command::new(kernmlops_bin())
        .args(args)
        .current_dir(workspace_root())
        .output()
        .expect("running kernmlops")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

// ---- Shared set-up of experiment and kernel-knob tests -------------------
// (experiment.rs, comparisons.rs, experiment_hardening.rs, khugepaged.rs,
// readahead.rs, knobs.rs, build.rs, build_slurm.rs, split_servers.rs,
// slurm.rs): paths as arguments, `kernmlops experiment`,
// results read back with polars, kernel settings put back.

/// A path as an argument (the tests' paths are UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// `kernmlops [PRE..] --plugin-dir PLUGINS experiment ARGS`, run in `cwd`
/// (`None`: the test's own current folder), to completion.
pub fn experiment_cmd(cwd: Option<&Path>, plugins: &Path, pre: &[&str], args: &[&str]) -> Output {
    let mut cmd = Command::new(kernmlops_bin());
    cmd.args(pre)
        .arg("--plugin-dir")
        .arg(plugins)
        .arg("experiment")
        .args(args);
    if let Some(cwd) = cwd {
        cmd.current_dir(cwd);
    }
    cmd.output().expect("running kernmlops experiment")
}

/// An experiment folder's `results.parquet` read with polars: the dtype of
/// each column (a JSON object) and every row as JSON.
pub fn polars_results(dir: &Path) -> (serde_json::Value, Vec<serde_json::Value>) {
    let out = Command::new("python3")
        .arg("-c")
        .arg(
            r#"
import json, sys, polars as pl
df = pl.read_parquet(sys.argv[1])
print(json.dumps({name: str(dtype) for name, dtype in df.schema.items()}))
print(json.dumps(df.to_dicts()))
"#,
        )
        .arg(dir.join("results.parquet"))
        .output()
        .expect("running python3");
    assert!(
        out.status.success(),
        "polars could not read the results:\n{}",
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    let mut lines = stdout.lines();
    let dtypes = serde_json::from_str(lines.next().unwrap_or("")).expect("dtypes JSON");
    let rows = serde_json::from_str(lines.next().unwrap_or("")).expect("rows JSON");
    (dtypes, rows)
}

/// A kernel setting's value (the file's text, trimmed).
pub fn read_setting(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {path}: {e}"))
        .trim()
        .to_owned()
}

/// Asks `ok` every 20 ms until it holds or `limit` has passed; its last
/// answer.
pub fn wait_for(limit: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ok()
}

/// Kernel settings' original values, written back however the test ends.
pub struct Originals(Vec<(String, String)>);

impl Originals {
    /// The values the files hold now.
    pub fn of(paths: &[&str]) -> Self {
        Self(
            paths
                .iter()
                .map(|p| (p.to_string(), read_setting(p)))
                .collect(),
        )
    }

    /// Files that do not hold their original value, as text.
    pub fn changed(&self) -> Vec<String> {
        self.0
            .iter()
            .filter(|(p, v)| read_setting(p) != *v)
            .map(|(p, v)| format!("{p} holds {} (was {v})", read_setting(p)))
            .collect()
    }

    /// The original value of `path` (the same file by its real path).
    pub fn value(&self, path: &str) -> &str {
        let real = |p: &str| std::fs::canonicalize(p).unwrap_or_else(|e| panic!("{p}: {e}"));
        let want = real(path);
        &self
            .0
            .iter()
            .find(|(p, _)| real(p) == want)
            .unwrap_or_else(|| panic!("{path} is not a file of the test"))
            .1
    }
}

impl Drop for Originals {
    fn drop(&mut self) {
        for (p, v) in &self.0 {
            let _ = std::fs::write(p, v);
        }
    }
}

/// `kernmlops --plugin-dir PLUGINS experiment ARGS` in the workspace
/// root, to completion.
pub fn experiment_in_root(plugins: &Path, args: &[&str]) -> Output {
    experiment_cmd(Some(&workspace_root()), plugins, &[], args)
}

/// A JSON file, read and parsed (a failure names the file).
pub fn read_json(path: &Path) -> serde_json::Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Writes an executable script (mode 755).
pub fn write_exec(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

/// This machine's host name as kernmlops records a node
/// (`/proc/sys/kernel/hostname`).
pub fn this_node() -> String {
    read_setting("/proc/sys/kernel/hostname")
}

/// A loopback TCP port nothing listens on now.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Process ids whose command name (`/proc/PID/comm`) is `comm`.
pub fn pids_named(comm: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
        })
        .collect()
}

/// Every log of an experiment folder (`logs/*`), each after a line naming
/// it, for failure messages.
pub fn experiment_logs(dir: &Path) -> String {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir.join("logs"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    paths.sort();
    let mut all = String::new();
    for p in paths {
        all += &format!("--- {}\n", p.display());
        all += &std::fs::read_to_string(&p).unwrap_or_default();
        all += "\n";
    }
    all
}

// ---- End of the experiment and kernel-knob set-up ------------------------

/// CLOCK_BOOTTIME in microseconds, the collector's clock (the same function
/// the collector uses).
pub use kernmlops_sys::clock::uptime_us;

/// A `kernmlops run` in the background.
pub struct Collector {
    child: Child,
    stderr_lines: mpsc::Receiver<String>,
    pub stderr: Vec<String>,
}

/// What a finished collection left.
#[derive(Debug)]
pub struct Finished {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// The collection folder, from the first `collection <id> in <dir>` line.
    pub dir: Option<PathBuf>,
}

impl Collector {
    /// Starts `kernmlops run ARGS` and waits until its probes are attached.
    pub fn start(args: &[&str]) -> Self {
        let mut cmd = Command::new(kernmlops_bin());
        cmd.arg("run").args(args).current_dir(workspace_root());
        Self::spawn(cmd)
    }

    /// Starts `cmd` (a `kernmlops run` command, its environment and
    /// folder as the caller set them) and waits until its probes are
    /// attached.
    pub fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting kernmlops run");
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().expect("stderr piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut c = Self {
            child,
            stderr_lines: rx,
            stderr: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match c.stderr_lines.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => {
                    let attached = line.starts_with("collecting ");
                    c.stderr.push(line);
                    if attached {
                        return c;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Ok(Some(status)) = c.child.try_wait() {
                        panic!(
                            "kernmlops exited early ({status}):\n{}",
                            c.stderr.join("\n")
                        );
                    }
                    assert!(
                        Instant::now() < deadline,
                        "kernmlops did not attach in 30 s:\n{}",
                        c.stderr.join("\n")
                    );
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = c.child.wait().expect("wait");
                    panic!(
                        "kernmlops exited early ({status}):\n{}",
                        c.stderr.join("\n")
                    );
                }
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` and waits for the process to end.
    pub fn signal_and_wait(self, signal: i32) -> Finished {
        // SAFETY: kill with a pid we spawned and still own.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        self.wait()
    }

    /// Waits for the process to end by itself.
    pub fn wait(mut self) -> Finished {
        let mut stdout = String::new();
        if let Some(mut out) = self.child.stdout.take() {
            use std::io::Read;
            let _ = out.read_to_string(&mut stdout);
        }
        let status = self.child.wait().expect("waiting for kernmlops");
        while let Ok(line) = self.stderr_lines.recv_timeout(Duration::from_millis(500)) {
            self.stderr.push(line);
        }
        let dir = stdout.lines().find_map(|l| {
            let rest = l.strip_prefix("collection ")?;
            let (_, dir) = rest.split_once(" in ")?;
            Some(PathBuf::from(dir.trim()))
        });
        Finished {
            status,
            stdout,
            stderr: self.stderr.join("\n"),
            dir,
        }
    }
}

/// The collection folder created under `output` (for runs killed before
/// they could print it).
pub fn only_collection(output: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(output)
        .expect("reading output folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(
        dirs.len(),
        1,
        "expected one collection in {}: {dirs:?}",
        output.display()
    );
    dirs[0].clone()
}

/// Reads every batch of an Arrow IPC file, through the host's collection
/// reader.
pub fn read_table(path: &Path) -> Vec<RecordBatch> {
    kernmlops::collection::read_table(path)
        .unwrap_or_else(|e| panic!("{} is not a readable Arrow file: {e}", path.display()))
        .batches
}

fn table_of(batches: &[RecordBatch]) -> kernmlops::collection::Table {
    kernmlops::collection::Table {
        name: "table".into(),
        schema: batches.first().map_or_else(
            || std::sync::Arc::new(arrow_schema::Schema::empty()),
            |b| b.schema(),
        ),
        batches: batches.to_vec(),
    }
}

/// Values of an unsigned integer column across batches, as u64 (none for
/// a table without batches: no rows, and so no schema to check).
pub fn column_u64(batches: &[RecordBatch], name: &str) -> Vec<u64> {
    if batches.is_empty() {
        return Vec::new();
    }
    table_of(batches)
        .u64s(name)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Values of a text column across batches (nulls as None).
pub fn column_str(batches: &[RecordBatch], name: &str) -> Vec<Option<String>> {
    if batches.is_empty() {
        return Vec::new();
    }
    table_of(batches)
        .strings(name)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The collection's manifest.
pub fn manifest(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("manifest.json")).expect("reading manifest.json");
    serde_json::from_str(&text).expect("manifest.json is JSON")
}

/// A child process killed when the test ends, pass or fail.
pub struct KillOnDrop(pub std::process::Child);

impl KillOnDrop {
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A cgroup v2 folder of the test's own (`<name>-<pid>` under the mount),
/// removed on drop with its sub-folders, their processes killed first, so
/// a failing test leaves nothing running.
pub struct TestCgroup {
    pub dir: PathBuf,
    /// Its path as `/proc/<pid>/cgroup` shows it.
    pub path: String,
}

impl TestCgroup {
    /// `None` without cgroup v2 or when the folder cannot be made.
    pub fn create(name: &str) -> Option<Self> {
        let mount = cgroup2_mount()?;
        let leaf = format!("{name}-{}", std::process::id());
        let dir = mount.join(&leaf);
        std::fs::create_dir(&dir).ok()?;
        Some(Self {
            dir,
            path: format!("/{leaf}"),
        })
    }

    /// A sub-folder, made now.
    pub fn child(&self, name: &str) -> PathBuf {
        let dir = self.dir.join(name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        dir
    }

    /// Processes directly in the cgroup.
    pub fn procs(&self) -> Vec<i32> {
        procs_of(&self.dir)
    }
}

fn procs_of(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect()
}

/// `dir` and every cgroup below it, deepest first.
fn cgroup_tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(cgroup_tree(&e.path()));
            }
        }
    }
    out.push(dir.to_owned());
    out
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for dir in cgroup_tree(&self.dir) {
            for pid in procs_of(&dir) {
                // SAFETY: killing processes this test put in its own cgroup.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while !procs_of(&dir).is_empty() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

/// A loop device over a file of the test's own, detached on drop.
pub struct LoopDevice {
    /// `/dev/loopN`.
    pub path: PathBuf,
}

impl LoopDevice {
    /// Attaches `backing` to the first free loop device.
    pub fn attach(backing: &Path) -> Self {
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(backing)
            .output()
            .expect("running losetup");
        assert!(
            out.status.success(),
            "losetup --find --show failed:\n{}",
            text(&out.stderr)
        );
        Self {
            path: PathBuf::from(text(&out.stdout).trim()),
        }
    }

    /// `loopN`, as /proc/diskstats and sysfs name it.
    pub fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .expect("a loop device has a name")
    }

    /// The device's major and minor numbers, from sysfs.
    pub fn major_minor(&self) -> (u64, u64) {
        let dev = std::fs::read_to_string(format!("/sys/block/{}/dev", self.name()))
            .expect("reading the device's number");
        let (major, minor) = dev.trim().split_once(':').expect("major:minor");
        (major.parse().expect("major"), minor.parse().expect("minor"))
    }

    /// The device's line of /proc/diskstats, fields from the fourth on
    /// (Documentation/admin-guide/iostats.rst: reads, reads merged, ...).
    pub fn diskstats(&self) -> Vec<u64> {
        let name = self.name();
        let all = std::fs::read_to_string("/proc/diskstats").expect("reading /proc/diskstats");
        let line = all
            .lines()
            .find(|l| l.split_whitespace().nth(2) == Some(name.as_str()))
            .unwrap_or_else(|| panic!("{name} is not in /proc/diskstats"));
        line.split_whitespace()
            .skip(3)
            .map(|f| f.parse().unwrap_or_else(|e| panic!("{line:?}: {e}")))
            .collect()
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
    }
}

/// What a role's collection saw: the process ids of its `quanta_runtime`
/// rows that are not among the processes its `process_trace` saw start or
/// exec (none when it holds only what its benchmark started), and the
/// command names `process_trace` saw.
pub fn role_view(
    collection: &Path,
) -> (
    std::collections::BTreeSet<u64>,
    std::collections::BTreeSet<String>,
) {
    let trace = read_table(&collection.join("process_trace.arrow"));
    let own: std::collections::BTreeSet<u64> = column_u64(&trace, "tgid").into_iter().collect();
    let names = column_str(&trace, "name").into_iter().flatten().collect();
    let quanta = column_u64(
        &read_table(&collection.join("quanta_runtime.arrow")),
        "tgid",
    );
    let foreign = quanta.into_iter().filter(|t| !own.contains(t)).collect();
    (foreign, names)
}

/// Processes whose command line contains every one of `needles` (other
/// than this one), as `PID: command line`.
pub fn processes_with(needles: &[&str]) -> Vec<String> {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) || name == me {
            continue;
        }
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        if needles.iter().all(|n| cmdline.contains(n)) {
            found.push(format!("{name}: {cmdline}"));
        }
    }
    found
}
