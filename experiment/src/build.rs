//! `[build]` of an experiment file: shell commands run once per node
//! before its first run (compiling a load generator, say), cached by a
//! hash of their inputs, the commands and the node.
//!
//! ```toml
//! [build]
//! commands = ["make -C bench/myclient"]   # each run by /bin/sh -c
//! inputs = ["bench/myclient"]             # files and folders hashed
//! ```
//!
//! Commands run in the experiment file's folder, one after another, with
//! stdin closed and their output appended to `build/<node>.log` in the
//! experiment folder. Inputs are relative to the same folder (no `..`, no
//! absolute paths); folders are walked without following symlinks (a
//! symlink is hashed as its target's text), every file and folder passes
//! the trust checks plugins pass (kernmlops runs as root), and more than
//! [`MAX_INPUT_FILES`] entries or [`MAX_INPUT_BYTES`] bytes are refused.
//!
//! `build/<node>.json` records the node's hash, how often the build ran
//! and how often it was up to date. A node whose hash is unchanged skips
//! the commands: the hash is taken before and again after a build, so
//! artefacts a build writes into its inputs do not make the next build
//! look stale. `build/<node>.lock` keeps two processes on one node from
//! building at once. Called by the local executor before its first run and
//! by `experiment exec` (a Slurm task) before its run; a task whose job has
//! several nodes (a run with roles) builds on each of them first, as one
//! job step ([`on_every_node_of_job`]).

use std::{
    fs::File,
    io::{BufRead, BufReader, Read, Seek, SeekFrom, Write},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Component, Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use kernmlops::trust::{Policy, TrustError};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{
    record::{hostname, write_atomic, ExpDir, Lock},
    ExperimentError, Result,
};

/// Most files and folders the inputs may hold together.
pub const MAX_INPUT_FILES: usize = 100_000;
/// Most bytes the input files may hold together.
pub const MAX_INPUT_BYTES: u64 = 1 << 30;
/// Most commands and inputs a `[build]` may list.
pub const MAX_ITEMS: usize = 256;
/// The lines of a failed command's output its error shows.
const TAIL_LINES: usize = 5;
/// The bytes read from the end of the log for that tail.
const TAIL_BYTES: u64 = 4096;

/// `[build]`: commands and the inputs their cache is keyed on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildSpec {
    pub commands: Vec<String>,
    #[serde(default)]
    pub inputs: Vec<String>,
}

impl BuildSpec {
    /// Checks the table; `Err((key, message))` names the offending key.
    pub fn check(&self) -> std::result::Result<(), (String, String)> {
        let err = |key: &str, message: String| Err((key.to_owned(), message));
        if self.commands.is_empty() {
            return err(
                "commands",
                "empty: give at least one command, e.g. [\"make -C bench\"]".into(),
            );
        }
        if self.commands.len() > MAX_ITEMS || self.inputs.len() > MAX_ITEMS {
            return err("", format!("at most {MAX_ITEMS} commands and inputs"));
        }
        if let Some(c) = self.commands.iter().find(|c| c.trim().is_empty()) {
            return err("commands", format!("{c:?}: an empty command"));
        }
        for input in &self.inputs {
            let p = Path::new(input);
            let inside = p
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
            if input.is_empty() || !inside {
                return err(
                    "inputs",
                    format!("{input:?}: give a path inside the experiment file's folder (relative, without '..')"),
                );
            }
        }
        Ok(())
    }
}

/// What `build/<node>.json` holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub node: String,
    /// The hash of the commands, the node and the inputs as the last build
    /// left them.
    pub hash: String,
    /// The same hash of the inputs as they were before the last build.
    #[serde(default)]
    pub hash_before: String,
    /// Builds carried out (commands run to success).
    pub runs: u64,
    /// Times the build was up to date and skipped.
    pub skips: u64,
    /// How long the last build took.
    pub last_seconds: f64,
    /// When the last build ended (RFC 3339).
    pub last_utc: String,
}

/// What [`ensure`] did on this node.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The commands ran, taking this many seconds.
    Ran(f64),
    /// The hash was unchanged: nothing ran.
    UpToDate,
}

/// The `[build]` of an experiment folder, read from its copy of the
/// experiment file; `None` when it has none.
pub fn of_folder(dir: &ExpDir) -> Result<Option<BuildSpec>> {
    let path = dir.experiment_file();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ExperimentError::io(path)(e)),
    };
    Ok(crate::spec::Spec::parse(&path.display().to_string(), &text)?.build)
}

/// Makes the experiment's `[build]` current on this node, if it has one
/// (the hook of the local executor and of `experiment exec`): the folder's
/// copy of the experiment file says what to build, the recorded source
/// file's folder is where. That copy is trust-checked first: its commands
/// run as root.
pub fn before_runs(
    dir: &ExpDir,
    source_file: &str,
    allow_insecure: bool,
) -> Result<Option<Outcome>> {
    let policy = Policy::for_this_process(allow_insecure);
    let copy = dir.experiment_file();
    if let Some(warning) =
        kernmlops::trust::check_instructions(&copy, "the experiment file", &policy)
            .map_err(ExperimentError::Usage)?
    {
        eprintln!("warning: {warning}");
    }
    let Some(spec) = of_folder(dir)? else {
        return Ok(None);
    };
    let base = Path::new(source_file)
        .parent()
        .unwrap_or(Path::new("/"))
        .to_owned();
    ensure(dir, &spec, &base, &policy).map(Some)
}

/// How many nodes this Slurm job has (`SLURM_JOB_NUM_NODES`), when it is
/// one.
pub fn job_nodes() -> Option<u32> {
    std::env::var("SLURM_JOB_NUM_NODES")
        .ok()?
        .parse()
        .ok()
        .filter(|&n| (1..=65_536).contains(&n))
}

/// Makes the `[build]` current on each of the `nodes` nodes of this Slurm
/// job: one step with a task per node, each running `kernmlops experiment
/// build` there (cached per node, as everywhere). A failure on any node is
/// the run's error, in one line: the failing node's own reason (the
/// nodes' `error:` lines are not passed on, so the run's log holds one).
pub fn on_every_node_of_job(
    dir: &ExpDir,
    nodes: u32,
    exe: &Path,
    allow_insecure: bool,
) -> Result<()> {
    if of_folder(dir)?.is_none() {
        return Ok(());
    }
    let mut build = Command::new(exe);
    if allow_insecure {
        build.arg("--allow-insecure-plugins");
    }
    build.args(["experiment", "build"]).arg(&dir.root);
    let mut srun = crate::srun::step("kml-build", crate::srun::Span::Each(nodes), &build);
    srun.stdin(Stdio::null()).stderr(Stdio::piped());
    let mut child = srun.spawn().map_err(|e| {
        ExperimentError::Usage(format!("[build] on the job's nodes: starting srun: {e}"))
    })?;
    let errors = relay_all_but_errors(child.stderr.take());
    let status = child
        .wait()
        .map_err(|e| ExperimentError::Usage(format!("[build] on the job's nodes: srun: {e}")))?;
    if status.success() {
        return Ok(());
    }
    Err(ExperimentError::Usage(step_failure(
        dir, nodes, status, &errors,
    )))
}

/// Error lines of a build step: the nodes' own (`error: ...`, without
/// the prefix) and srun's (`srun: error: ...`).
#[derive(Debug, Default)]
struct StepErrors {
    nodes: Vec<String>,
    srun: Vec<String>,
}

/// Copies a step's stderr to this process's, all but its error lines,
/// which are returned.
fn relay_all_but_errors(stderr: Option<std::process::ChildStderr>) -> StepErrors {
    let mut errors = StepErrors::default();
    let Some(stderr) = stderr else {
        return errors;
    };
    for line in BufReader::new(stderr)
        .lines()
        .map_while(std::io::Result::ok)
    {
        if let Some(e) = line.strip_prefix("error: ") {
            errors.nodes.push(e.to_owned());
        } else if line.starts_with("srun: error: ") {
            errors.srun.push(line);
        } else {
            eprintln!("{line}");
        }
    }
    errors
}

/// The one line a failed build step is: the first failing node's reason
/// (with how many others failed), or srun's when no node gave one.
fn step_failure(
    dir: &ExpDir,
    nodes: u32,
    status: std::process::ExitStatus,
    errors: &StepErrors,
) -> String {
    match errors.nodes.as_slice() {
        [first] => first.clone(),
        [first, rest @ ..] => format!("{first} (and on {} more node(s))", rest.len()),
        [] => format!(
            "[build] on the job's {nodes} nodes: srun ended with {status}{}; no run was started (logs: {})",
            if errors.srun.is_empty() {
                String::new()
            } else {
                format!(": {}", kernmlops::trust::printable(errors.srun.join(" | ").as_bytes()))
            },
            dir.root.join("build").display()
        ),
    }
}

/// A node name safe as a file name.
fn node_file_name(node: &str) -> String {
    let name: String = node
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    match name.trim_start_matches('.') {
        "" => "node".into(),
        n => n.to_owned(),
    }
}

/// `build/<node>.{json,log,lock}` of this node.
struct NodePaths {
    json: PathBuf,
    log: PathBuf,
    lock: PathBuf,
}

impl NodePaths {
    fn of(dir: &ExpDir, node: &str) -> Self {
        let base = dir.root.join("build");
        let name = node_file_name(node);
        Self {
            json: base.join(format!("{name}.json")),
            log: base.join(format!("{name}.log")),
            lock: base.join(format!("{name}.lock")),
        }
    }
}

/// Reads a node's record (a missing one is a node that never built).
pub fn read_node(dir: &ExpDir, node: &str) -> Result<NodeRecord> {
    let path = NodePaths::of(dir, node).json;
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| ExperimentError::Corrupt {
            path,
            message: format!("not a build record ({e}); remove it to build again"),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(NodeRecord {
            node: node.to_owned(),
            ..Default::default()
        }),
        Err(e) => Err(ExperimentError::io(path)(e)),
    }
}

/// Makes the build current on this node: runs the commands unless the
/// hash of the inputs, commands and node matches the node's record,
/// printing `build on NODE: ran in S s` or `build on NODE: up to date`.
/// `base` is the experiment file's folder. A failing command is one
/// error naming it, its exit status and the tail of its output.
pub fn ensure(dir: &ExpDir, spec: &BuildSpec, base: &Path, policy: &Policy) -> Result<Outcome> {
    let node = hostname();
    let paths = NodePaths::of(dir, &node);
    let folder = dir.root.join("build");
    std::fs::create_dir_all(&folder).map_err(ExperimentError::io(&folder))?;
    let _lock = Lock::take(&paths.lock)?;
    let mut record = read_node(dir, &node)?;
    record.node.clone_from(&node);
    let before = hash(spec, base, &node, policy)?;
    if !record.hash.is_empty() && (before == record.hash || before == record.hash_before) {
        record.skips += 1;
        write_node(&paths.json, &record)?;
        eprintln!("build on {node}: up to date");
        return Ok(Outcome::UpToDate);
    }
    let started = Instant::now();
    for command in &spec.commands {
        run_command(command, base, &paths.log, &node)?;
    }
    let seconds = started.elapsed().as_secs_f64();
    record.hash = hash(spec, base, &node, policy)?;
    record.hash_before = before;
    record.runs += 1;
    record.last_seconds = seconds;
    record.last_utc = kernmlops_sys::clock::rfc3339(kernmlops_sys::clock::unix_us());
    write_node(&paths.json, &record)?;
    eprintln!("build on {node}: ran in {seconds:.1} s");
    Ok(Outcome::Ran(seconds))
}

fn write_node(path: &Path, record: &NodeRecord) -> Result<()> {
    let text = serde_json::to_string_pretty(record).map_err(|e| ExperimentError::Corrupt {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    write_atomic(path, text.as_bytes())
}

/// Runs one command by `/bin/sh -c` in `base`, its output appended to
/// `log` (never through a symlink).
fn run_command(command: &str, base: &Path, log: &Path, node: &str) -> Result<()> {
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(log)
        .map_err(ExperimentError::io(log))?;
    let start = out
        .seek(SeekFrom::End(0))
        .map_err(ExperimentError::io(log))?;
    writeln!(
        out,
        "== {} on {node} in {}: {command}",
        kernmlops_sys::clock::rfc3339(kernmlops_sys::clock::unix_us()),
        base.display()
    )
    .map_err(ExperimentError::io(log))?;
    let err = out.try_clone().map_err(ExperimentError::io(log))?;
    let status = Command::new("/bin/sh")
        .arg("-c")
        .arg(command)
        .current_dir(base)
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(ExperimentError::io(log))?)
        .stderr(err)
        .status()
        .map_err(|source| ExperimentError::Launch {
            program: "/bin/sh".into(),
            source,
        })?;
    if status.success() {
        return Ok(());
    }
    let tail = tail(&mut out, start);
    Err(ExperimentError::Usage(format!(
        "[build] on {node}: `{}` ended with {status}{}; no run was started (log: {})",
        kernmlops::trust::printable(command.as_bytes()),
        if tail.is_empty() {
            String::new()
        } else {
            format!(": {tail}")
        },
        log.display()
    )))
}

/// The last lines a command wrote to the log (after `start`), joined by
/// ` | ` into one printable line.
fn tail(log: &mut File, start: u64) -> String {
    let end = log.seek(SeekFrom::End(0)).unwrap_or(start);
    let from = end.saturating_sub(TAIL_BYTES).max(start);
    let mut bytes = Vec::new();
    if log.seek(SeekFrom::Start(from)).is_err() || log.read_to_end(&mut bytes).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("== "))
        .collect();
    let shown = &lines[lines.len().saturating_sub(TAIL_LINES)..];
    kernmlops::trust::printable(shown.join(" | ").as_bytes())
}

/// Running totals of a walk of the inputs, and their bounds.
struct Walk {
    files: usize,
    bytes: u64,
    max_files: usize,
    max_bytes: u64,
}

impl Walk {
    fn bounded(max_files: usize, max_bytes: u64) -> Self {
        Self {
            files: 0,
            bytes: 0,
            max_files,
            max_bytes,
        }
    }
}

/// The hash of the commands, the node and every input's path, kind,
/// executable bit and content.
pub fn hash(spec: &BuildSpec, base: &Path, node: &str, policy: &Policy) -> Result<String> {
    hash_bounded(
        spec,
        base,
        node,
        policy,
        Walk::bounded(MAX_INPUT_FILES, MAX_INPUT_BYTES),
    )
}

fn hash_bounded(
    spec: &BuildSpec,
    base: &Path,
    node: &str,
    policy: &Policy,
    mut walk: Walk,
) -> Result<String> {
    let mut h = Sha256::new();
    h.update(b"kernmlops build 1\0");
    h.update(node.as_bytes());
    h.update(b"\0");
    for c in &spec.commands {
        h.update(c.as_bytes());
        h.update(b"\0");
    }
    for input in &spec.inputs {
        h.update(b"input\0");
        h.update(input.as_bytes());
        h.update(b"\0");
        let path = base.join(input);
        hash_entry(&mut h, &path, Path::new(input), policy, &mut walk)?;
    }
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hashes one input entry (recursively for a folder), checking each file
/// and folder like a plugin.
fn hash_entry(
    h: &mut Sha256,
    path: &Path,
    shown: &Path,
    policy: &Policy,
    walk: &mut Walk,
) -> Result<()> {
    let meta = path.symlink_metadata().map_err(|e| {
        ExperimentError::Usage(format!(
            "[build] inputs: {}: {}; inputs are relative to the experiment file's folder",
            path.display(),
            kernmlops_sys::private::strip_os_error(&e)
        ))
    })?;
    walk.files += 1;
    if walk.files > walk.max_files {
        return Err(too_big(format!("more than {} files", walk.max_files)));
    }
    h.update(shown.as_os_str().as_encoded_bytes());
    h.update(b"\0");
    let kind = meta.file_type();
    if kind.is_symlink() {
        // Hashed as its text, never followed: a link out of the tree
        // cannot make the build read (or the hash depend on) other files.
        let target = std::fs::read_link(path).map_err(ExperimentError::io(path))?;
        h.update(b"link\0");
        h.update(target.as_os_str().as_encoded_bytes());
    } else if kind.is_dir() {
        check_trust(path, true, policy)?;
        h.update(b"dir\0");
        let mut names: Vec<std::ffi::OsString> = std::fs::read_dir(path)
            .map_err(ExperimentError::io(path))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()
            .map_err(ExperimentError::io(path))?;
        names.sort();
        for name in names {
            hash_entry(h, &path.join(&name), &shown.join(&name), policy, walk)?;
        }
    } else if kind.is_file() {
        walk.bytes += meta.len();
        if walk.bytes > walk.max_bytes {
            return Err(too_big(format!("more than {} bytes", walk.max_bytes)));
        }
        hash_file(h, path, policy)?;
    } else {
        // Sockets, fifos, devices: their presence only.
        h.update(b"other\0");
    }
    h.update(b"\0");
    Ok(())
}

fn too_big(what: String) -> ExperimentError {
    ExperimentError::Usage(format!(
        "[build] inputs hold {what}: name the source folders the commands read, not build output or data"
    ))
}

/// Hashes a regular file's executable bit and content, read from one
/// descriptor opened without following symlinks and checked first.
fn hash_file(h: &mut Sha256, path: &Path, policy: &Policy) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(ExperimentError::io(path))?;
    trust_result(path, kernmlops::trust::check_file(&file, policy), policy)?;
    let meta = file.metadata().map_err(ExperimentError::io(path))?;
    h.update(if meta.permissions().mode() & 0o111 != 0 {
        b"exec\0"
    } else {
        b"file\0"
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf).map_err(ExperimentError::io(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(())
}

fn check_trust(path: &Path, is_dir: bool, policy: &Policy) -> Result<()> {
    let checked = if is_dir {
        kernmlops::trust::check_dir_path(path, policy)
    } else {
        kernmlops::trust::check_file_path(path, policy)
    };
    trust_result(path, checked, policy)
}

/// A trust check's outcome: a warning under `--allow-insecure-plugins`,
/// else a refusal in one line.
fn trust_result(
    path: &Path,
    checked: std::result::Result<(), TrustError>,
    policy: &Policy,
) -> Result<()> {
    match checked {
        Ok(()) => Ok(()),
        Err(e @ (TrustError::Writable { .. } | TrustError::Owner { .. }))
            if policy.allow_insecure =>
        {
            eprintln!("warning: using [build] input although {e} (--allow-insecure-plugins)");
            Ok(())
        }
        Err(e) => Err(ExperimentError::Usage(format!(
            "refusing [build] input {}: {e}",
            kernmlops::trust::printable(path.as_os_str().as_encoded_bytes())
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(commands: &[&str], inputs: &[&str]) -> BuildSpec {
        BuildSpec {
            commands: commands.iter().map(|s| s.to_string()).collect(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn bad_tables_name_their_key() {
        for (s, key) in [
            (spec(&[], &[]), "commands"),
            (spec(&["  "], &[]), "commands"),
            (spec(&["make"], &["../src"]), "inputs"),
            (spec(&["make"], &["/etc"]), "inputs"),
            (spec(&["make"], &[""]), "inputs"),
        ] {
            assert_eq!(s.check().expect_err("refused").0, key, "{s:?}");
        }
        spec(&["make"], &["src", "./bench/x"])
            .check()
            .expect("valid");
        // The experiment file names the key, and refuses unknown ones.
        let parse = |b: &str| {
            crate::spec::Spec::parse(
                "e.toml",
                &format!("name = \"x\"\nbenchmark = \"fio\"\n[build]\n{b}"),
            )
        };
        let e = parse("commands = []\n").expect_err("refused").to_string();
        assert!(e.starts_with("e.toml: build.commands: empty"), "{e}");
        let e = parse("commands = [\"make\"]\ninputs = [\"../x\"]\n").expect_err("refused");
        assert!(e.to_string().starts_with("e.toml: build.inputs: "), "{e}");
        assert!(parse("commands = [\"make\"]\nbogus = 1\n").is_err());
        let ok = parse("commands = [\"make\"]\ninputs = [\"src\"]\n").expect("valid");
        assert_eq!(ok.build, Some(spec(&["make"], &["src"])));
    }

    #[test]
    fn hash_follows_content_commands_and_node_not_links() {
        let tmp = std::env::temp_dir().join(format!("kml-build-hash-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(tmp.join("src")).expect("mkdir");
        std::fs::write(tmp.join("src/a.c"), "int a;").expect("write");
        std::os::unix::fs::symlink("/etc/passwd", tmp.join("src/out")).expect("symlink");
        let policy = Policy::for_this_process(true);
        let s = spec(&["make"], &["src"]);
        let h = |s: &BuildSpec, node: &str| hash(s, &tmp, node, &policy).expect("hash");
        let first = h(&s, "n1");
        assert_eq!(first, h(&s, "n1"), "stable");
        assert_ne!(first, h(&s, "n2"), "the node counts");
        assert_ne!(
            first,
            h(&spec(&["make all"], &["src"]), "n1"),
            "commands count"
        );
        std::fs::write(tmp.join("src/a.c"), "int b;").expect("write");
        assert_ne!(first, h(&s, "n1"), "content counts");
        let missing = hash(&spec(&["make"], &["nope"]), &tmp, "n1", &policy);
        assert!(missing.is_err());
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn huge_inputs_are_refused_in_one_line() {
        let tmp = std::env::temp_dir().join(format!("kml-build-huge-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(tmp.join("src")).expect("mkdir");
        for n in 0..5 {
            std::fs::write(tmp.join(format!("src/{n}.c")), "0123456789").expect("write");
        }
        let policy = Policy::for_this_process(true);
        let s = spec(&["make"], &["src"]);
        let h = |files, bytes| hash_bounded(&s, &tmp, "n", &policy, Walk::bounded(files, bytes));
        h(6, 50).expect("within the bounds");
        for (files, bytes, what) in [
            (5, 1000, "more than 5 files"),
            (100, 49, "more than 49 bytes"),
        ] {
            let e = h(files, bytes).expect_err("too big").to_string();
            assert!(e.contains(what) && !e.contains('\n'), "{e}");
            assert!(e.starts_with("[build] inputs hold"), "{e}");
        }
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn a_failed_build_step_is_the_failing_node_s_line() {
        use std::os::unix::process::ExitStatusExt;
        let dir = ExpDir::new(PathBuf::from("/e"));
        let status = std::process::ExitStatus::from_raw(1 << 8);
        let node = |n: &str| format!("[build] on {n}: `make` ended with exit status: 2");
        let one = StepErrors {
            nodes: vec![node("n2")],
            srun: vec!["srun: error: n2: task 1: Exited with exit code 1".into()],
        };
        assert_eq!(step_failure(&dir, 2, status, &one), node("n2"));
        let two = StepErrors {
            nodes: vec![node("n1"), node("n2")],
            srun: vec![],
        };
        assert_eq!(
            step_failure(&dir, 2, status, &two),
            format!("{} (and on 1 more node(s))", node("n1"))
        );
        let none = StepErrors {
            nodes: vec![],
            srun: vec!["srun: error: Unable to create step".into()],
        };
        let e = step_failure(&dir, 2, status, &none);
        assert!(
            e.starts_with(
                "[build] on the job's 2 nodes: srun ended with exit status: 1: srun: error: Unable"
            ) && e.ends_with("(logs: /e/build)"),
            "{e}"
        );
    }

    #[test]
    fn node_names_become_safe_file_names() {
        assert_eq!(node_file_name("node-1.lab"), "node-1.lab");
        assert_eq!(node_file_name("../x/y"), "_x_y");
        assert_eq!(node_file_name(""), "node");
    }
}
