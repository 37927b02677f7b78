//! Plugin trust: a plugin file or folder that someone else could change is
//! refused before any of its code runs, a damaged `.so` is refused with a
//! reason instead of crashing the host, and the good plugins beside them
//! still load.
//!
//! `fixture_constructor` has a library constructor that writes a marker
//! file when the dynamic loader maps it. Every refusal case checks that the
//! marker never appears; the first test shows that it does appear when the
//! plugin is loaded, so the check can fail.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use kernmlops_e2e::*;

/// A scratch folder for one test, handed back in a removable state and
/// removed when the test ends, pass or fail.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = temp_dir(&format!("trust-{name}"));
        chmod(&dir, 0o755);
        Self(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// A sub-folder (mode 0755) holding copies of built plugins.
    fn plugins(&self, name: &str, plugins: &[(&str, &str)]) -> PathBuf {
        let dir = self.path(name);
        std::fs::create_dir(&dir).expect("creating plugin folder");
        chmod(&dir, 0o755);
        for (package, file) in plugins {
            let to = dir.join(format!("{file}.so"));
            std::fs::copy(built_so(package), &to).expect("copying plugin");
            chmod(&to, 0o755);
        }
        dir
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Folders a test made unwritable or foreign-owned come back first.
        for entry in walk(&self.0) {
            if !entry.is_symlink() {
                let _ = std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o755));
            }
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_owned()];
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", path.display()));
}

/// `kernmlops ARGS` run from `cwd`, with the constructor fixture's marker
/// at `marker` and no plugin folder or sudo user from the environment.
fn kernmlops_in(cwd: &Path, args: &[&str], marker: &Path) -> Output {
    Command::new(kernmlops_bin())
        .args(args)
        .current_dir(cwd)
        .env("KERNMLOPS_TEST_MARKER", marker)
        .env_remove("KERNMLOPS_PLUGIN_DIR")
        .env_remove("SUDO_UID")
        .output()
        .expect("running kernmlops")
}

/// `kernmlops plugins --plugin-dir DIR`, which must succeed.
fn list_plugins(s: &Scratch, dir: &Path, extra: &[&str]) -> (String, String) {
    let mut args = vec!["plugins", "--plugin-dir", dir.to_str().expect("utf8")];
    args.extend_from_slice(extra);
    let out = kernmlops_in(&s.0, &args, &s.path("marker"));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "kernmlops plugins failed ({:?}):\n{stdout}\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

/// The line of the `refused:` section naming `path`.
fn refusal<'a>(stdout: &'a str, path: &Path) -> &'a str {
    let refused = stdout
        .split("\nrefused:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no refused section:\n{stdout}"));
    let shown = format!("  {}: ", path.display());
    refused
        .lines()
        .find(|l| l.starts_with(&shown))
        .unwrap_or_else(|| panic!("{} not refused:\n{stdout}", path.display()))
}

fn assert_marker_absent(s: &Scratch, case: &str) {
    let marker = s.path("marker");
    assert!(
        !marker.exists(),
        "{case}: the refused plugin's constructor ran: {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
}

const GOOD: [(&str, &str); 2] = [
    ("quanta_runtime", "quanta_runtime"),
    ("process_trace", "process_trace"),
];

fn assert_good_ones_load(stdout: &str, case: &str) {
    for probe in ["probe quanta_runtime", "probe process_trace"] {
        assert!(
            stdout.contains(probe),
            "{case}: the good plugins must still load; {probe:?} missing:\n{stdout}"
        );
    }
}

#[test]
fn the_constructor_fixture_runs_when_its_folder_is_safe() {
    let s = Scratch::new("control");
    let dir = s.plugins("plugins", &[("fixture_constructor", "constructor")]);
    let (stdout, _) = list_plugins(&s, &dir, &[]);
    assert!(
        stdout.contains("fixture_constructor"),
        "the fixture loads:\n{stdout}"
    );
    let marker = std::fs::read_to_string(s.path("marker")).unwrap_or_default();
    assert!(
        marker.contains("constructor ran"),
        "the fixture's constructor must write the marker, or the other tests prove nothing"
    );
}

/// Each case: a safe folder with good plugins and one unsafe entry, the
/// path the refusal names, and the fix it must give.
#[test]
fn unsafe_or_damaged_plugin_files_are_refused_and_the_others_still_load() {
    type Setup = fn(&Scratch, &Path) -> (PathBuf, String);
    let cases: [(&str, Setup); 4] = [
        ("group-writable .so", |_, dir| {
            let so = dir.join("constructor.so");
            chmod(&so, 0o775);
            (so.clone(), format!("chmod g-w {}", so.display()))
        }),
        ("world-writable .so", |_, dir| {
            let so = dir.join("constructor.so");
            chmod(&so, 0o757);
            (so.clone(), format!("chmod o-w {}", so.display()))
        }),
        ("symlink into a world-writable folder", |s, dir| {
            let open = s.plugins("open", &[]);
            std::fs::rename(dir.join("constructor.so"), open.join("constructor.so"))
                .expect("moving the fixture");
            chmod(&open, 0o777);
            let link = dir.join("constructor.so");
            std::os::unix::fs::symlink(open.join("constructor.so"), &link).expect("symlink");
            (link, format!("chmod go-w {}", open.display()))
        }),
        ("truncated constructor fixture", |_, dir| {
            let so = dir.join("constructor.so");
            truncate(&so, 400 << 10);
            (so, "truncated".to_owned())
        }),
    ];
    for (case, setup) in cases {
        let s = Scratch::new("files");
        let mut plugins = GOOD.to_vec();
        plugins.push(("fixture_constructor", "constructor"));
        let dir = s.plugins("plugins", &plugins);
        let (path, fix) = setup(&s, &dir);
        let (stdout, _) = list_plugins(&s, &dir, &[]);
        assert_marker_absent(&s, case);
        let line = refusal(&stdout, &path);
        assert!(line.contains(&fix), "{case}: want {fix:?} in {line:?}");
        assert_good_ones_load(&stdout, case);
    }
}

fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(len))
        .unwrap_or_else(|e| panic!("truncating {}: {e}", path.display()));
}

/// What used to kill every command with SIGBUS (exit 135, no message).
#[test]
fn a_truncated_plugin_is_refused_with_a_reason_not_a_crash() {
    let s = Scratch::new("truncated");
    let mut plugins = GOOD.to_vec();
    plugins.extend([
        ("process_trace", "cut_100k"),
        ("process_trace", "cut_400k"),
        ("process_trace", "cut_800k"),
    ]);
    let dir = s.plugins("plugins", &plugins);
    for (file, len) in [("cut_100k", 100), ("cut_400k", 400), ("cut_800k", 800)] {
        truncate(&dir.join(format!("{file}.so")), len << 10);
    }
    let (stdout, _) = list_plugins(&s, &dir, &[]);
    for file in ["cut_100k", "cut_400k", "cut_800k"] {
        let line = refusal(&stdout, &dir.join(format!("{file}.so")));
        assert!(
            line.contains("damaged plugin file") && line.contains("truncated"),
            "{file}: {line:?}"
        );
    }
    assert_good_ones_load(&stdout, "truncated");
    // `run` gets as far as resolving its probes, with the damaged files
    // reported; before, it died loading them.
    let out = kernmlops_in(
        &s.0,
        &[
            "run",
            "--plugin-dir",
            dir.to_str().expect("utf8"),
            "--plugins",
            "no_such_probe",
        ],
        &s.path("marker"),
    );
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a clean error, not a signal: {stderr}"
    );
    assert!(
        stderr.contains("unknown plugin") && stderr.contains("cut_400k.so (damaged plugin file"),
        "{stderr}"
    );
}

#[test]
fn root_a_plugin_owned_by_another_user_is_refused() {
    if !require_root("root_a_plugin_owned_by_another_user_is_refused") {
        return;
    }
    let s = Scratch::new("owner");
    let mut plugins = GOOD.to_vec();
    plugins.push(("fixture_constructor", "constructor"));
    let dir = s.plugins("plugins", &plugins);
    let so = dir.join("constructor.so");
    // 65534 is nobody on Debian.
    std::os::unix::fs::chown(&so, Some(65534), Some(65534)).expect("chown nobody");
    let (stdout, _) = list_plugins(&s, &dir, &[]);
    assert_marker_absent(&s, "foreign owner");
    let line = refusal(&stdout, &so);
    assert!(
        line.contains("is owned by uid 65534")
            && line.contains(&format!("chown root:root {}", so.display())),
        "{line:?}"
    );
    assert_good_ones_load(&stdout, "foreign owner");

    // Sticky world-writable folders (like /tmp) above a plugin are fine
    // only while what is in them belongs to root or the invoking user: a
    // symlink to nobody's file in one is refused, to root's file loads.
    let sticky = s.plugins("sticky", &[]);
    std::fs::rename(&so, sticky.join("constructor.so")).expect("moving the fixture");
    chmod(&sticky, 0o1777);
    std::os::unix::fs::symlink(sticky.join("constructor.so"), &so).expect("symlink");
    let (stdout, _) = list_plugins(&s, &dir, &[]);
    assert_marker_absent(&s, "nobody's file in a sticky folder");
    let line = refusal(&stdout, &so);
    let target = sticky.join("constructor.so");
    assert!(
        line.contains(&format!("chown root:root {}", target.display())),
        "{line:?}"
    );
    std::os::unix::fs::chown(&target, Some(0), Some(0)).expect("chown root");
    let (stdout, _) = list_plugins(&s, &dir, &[]);
    assert!(
        stdout.contains("fixture_constructor") && s.path("marker").exists(),
        "root's plugin in a sticky folder loads:\n{stdout}"
    );
    std::fs::remove_file(s.path("marker")).expect("rm marker");
    std::fs::remove_file(&so).expect("rm symlink");

    // A foreign-owned folder refuses everything in it.
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).expect("chown nobody");
    let (stdout, _) = list_plugins(&s, &dir, &[]);
    assert_marker_absent(&s, "foreign folder");
    let line = refusal(&stdout, &dir);
    assert!(
        line.contains("folder") && line.contains("chown root:root"),
        "{line:?}"
    );
    std::os::unix::fs::chown(&dir, Some(0), Some(0)).expect("chown root");
}

/// The plugin folder itself, or a folder above it, that others can write:
/// nothing in it loads, and one line says which folder and how to fix it.
#[test]
fn an_unsafe_plugin_folder_is_refused_as_a_whole() {
    for (case, mode, fix, parent_mode) in [
        ("world-writable folder", 0o777, "chmod go-w", None),
        ("group-writable folder", 0o775, "chmod g-w", None),
        ("sticky world-writable folder", 0o1777, "chmod go-w", None),
        ("world-writable parent", 0o755, "chmod go-w", Some(0o777)),
    ] {
        let s = Scratch::new("folder");
        let parent = s.plugins("parent", &[]);
        let dir = parent.join("plugins");
        std::fs::create_dir(&dir).expect("mkdir");
        for (package, file) in GOOD.iter().chain(&[("fixture_constructor", "constructor")]) {
            std::fs::copy(built_so(package), dir.join(format!("{file}.so"))).expect("copy");
        }
        chmod(&dir, mode);
        let named = match parent_mode {
            Some(m) => {
                chmod(&parent, m);
                parent.clone()
            }
            None => dir.clone(),
        };
        let (stdout, _) = list_plugins(&s, &dir, &[]);
        assert_marker_absent(&s, case);
        let line = refusal(&stdout, &dir);
        let want = format!("{fix} {}", named.display());
        assert!(line.contains(&want), "{case}: want {want:?} in {line:?}");
        assert!(
            !stdout.contains("probe quanta_runtime"),
            "{case}: nothing in an unsafe folder loads:\n{stdout}"
        );
        // The printed fix is enough.
        chmod(&parent, 0o755);
        chmod(&dir, 0o755);
        std::fs::remove_file(dir.join("constructor.so")).expect("rm");
        let (stdout, _) = list_plugins(&s, &dir, &[]);
        assert_good_ones_load(&stdout, case);
    }
}

#[test]
fn allow_insecure_plugins_loads_with_warnings_but_still_checks_the_elf_file() {
    let s = Scratch::new("insecure");
    let mut plugins = GOOD.to_vec();
    plugins.extend([
        ("fixture_constructor", "constructor"),
        ("process_trace", "cut"),
    ]);
    let dir = s.plugins("plugins", &plugins);
    truncate(&dir.join("cut.so"), 300 << 10);
    chmod(&dir, 0o777);

    let (stdout, _) = list_plugins(&s, &dir, &[]);
    assert_marker_absent(&s, "without the flag");
    refusal(&stdout, &dir);

    let (stdout, stderr) = list_plugins(&s, &dir, &["--allow-insecure-plugins"]);
    assert_good_ones_load(&stdout, "--allow-insecure-plugins");
    assert!(
        std::fs::read_to_string(s.path("marker")).is_ok_and(|m| m.contains("constructor ran")),
        "the flag loads the unsafe plugin"
    );
    assert!(
        stderr.contains("warning: --allow-insecure-plugins")
            && stderr.contains(&format!(
                "plugin folder {} used although untrusted",
                dir.display()
            )),
        "{stderr}"
    );
    let line = refusal(&stdout, &dir.join("cut.so"));
    assert!(
        line.contains("truncated"),
        "the ELF check still applies: {line:?}"
    );
}

#[test]
fn dangling_and_looping_symlinks_get_a_warning_each() {
    let s = Scratch::new("links");
    let dir = s.plugins("plugins", &GOOD);
    let link = |name: &str, to: &Path| {
        std::os::unix::fs::symlink(to, dir.join(name)).expect("symlink");
    };
    link("dangling.so", &s.path("nowhere.so"));
    link("loop_a.so", &dir.join("loop_b.so"));
    link("loop_b.so", &dir.join("loop_a.so"));
    let (stdout, stderr) = list_plugins(&s, &dir, &[]);
    assert_good_ones_load(&stdout, "symlinks");
    for (name, what) in [
        ("dangling.so", "dangling symlink"),
        ("loop_a.so", "symlink loop"),
        ("loop_b.so", "symlink loop"),
    ] {
        let want = format!("warning: ignoring {}: {what}", dir.join(name).display());
        assert!(
            stderr.lines().any(|l| l.starts_with(&want)),
            "missing {want:?} in:\n{stderr}"
        );
    }
}

/// `./overrides.toml` and `./plugins` are used only when they are safe;
/// otherwise a warning says why they were ignored.
#[test]
fn unsafe_files_in_the_current_directory_are_ignored() {
    let s = Scratch::new("cwd");
    let overrides = s.path("overrides.toml");
    std::fs::write(&overrides, "[collect]\nduration = \"3s\"\n").expect("write");
    for (mode, used) in [(0o644, true), (0o664, false), (0o666, false)] {
        chmod(&overrides, mode);
        let out = kernmlops_in(&s.0, &["config", "show"], &s.path("marker"));
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{stderr}");
        assert_eq!(
            stdout.contains("duration = \"3s\""),
            used,
            "overrides.toml mode {mode:o}:\n{stdout}\n{stderr}"
        );
        if !used {
            assert!(
                stderr.contains("warning: ignoring ./overrides.toml: untrusted: file")
                    && stderr.contains("chmod"),
                "mode {mode:o}: {stderr}"
            );
        }
    }
    std::fs::remove_file(&overrides).expect("rm");

    let dir = s.plugins("plugins", &[("fixture_constructor", "constructor")]);
    chmod(&dir, 0o777);
    let out = kernmlops_in(&s.0, &["plugins"], &s.path("marker"));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_marker_absent(&s, "./plugins");
    assert!(
        stderr.contains(
            "warning: ignoring plugin folder ./plugins in the current directory: untrusted"
        ) && !stdout.contains(&dir.display().to_string()),
        "{stdout}\n{stderr}"
    );
}

/// A configuration or experiment file can name commands that run as root
/// (a `script` benchmark): `--config FILE` and `experiment run FILE` are
/// refused, in one line saying why and how to fix it, when others could
/// change the file, and used with a warning under `--allow-insecure-plugins`.
/// A safe file is used; a missing one is reported once by its reader.
#[test]
fn unsafe_config_and_experiment_files_are_refused() {
    let s = Scratch::new("instructions");
    let config = s.path("run.toml");
    std::fs::write(&config, "[collect]\nduration = \"3s\"\n").expect("write");
    let experiment = s.path("sweep.toml");
    std::fs::write(
        &experiment,
        "name = \"sweep\"\nbenchmark = \"script\"\nprobes = []\n\n\
         [config.benchmarks.script]\ncommand = [\"/bin/true\"]\n",
    )
    .expect("write");
    let (config_s, experiment_s) = (
        config.to_str().expect("utf8"),
        experiment.to_str().expect("utf8"),
    );
    let marker = s.path("marker");
    let plan = s.path("plan");
    let plan_s = plan.to_str().expect("utf8");
    let cases: [(&Path, Vec<&str>); 2] = [
        (&config, vec!["--config", config_s, "config", "show"]),
        (
            &experiment,
            vec![
                "experiment",
                "run",
                experiment_s,
                "--dir",
                plan_s,
                "--dry-run",
            ],
        ),
    ];
    for (file, args) in &cases {
        for (mode, used) in [(0o644, true), (0o664, false), (0o666, false)] {
            chmod(file, mode);
            let out = kernmlops_in(&s.0, args, &marker);
            let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
            assert_eq!(
                out.status.success(),
                used,
                "{args:?} mode {mode:o}:\n{stdout}\n{stderr}"
            );
            if used {
                continue;
            }
            let lines: Vec<&str> = stderr.lines().collect();
            assert!(
                lines.len() == 1
                    && lines[0].starts_with("error: refusing ")
                    && lines[0].contains("untrusted: file")
                    && lines[0].contains("fix: chmod"),
                "{args:?} mode {mode:o}:\n{stderr}"
            );
            let mut insecure = vec!["--allow-insecure-plugins"];
            insecure.extend(args.iter().copied());
            let out = kernmlops_in(&s.0, &insecure, &marker);
            let stderr = text(&out.stderr);
            assert!(
                out.status.success() && stderr.contains("(--allow-insecure-plugins)"),
                "{insecure:?} mode {mode:o}:\n{stderr}"
            );
        }
        chmod(file, 0o644);
    }
    let missing = s.path("missing.toml");
    let out = kernmlops_in(
        &s.0,
        &[
            "--config",
            missing.to_str().expect("utf8"),
            "config",
            "show",
        ],
        &marker,
    );
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success() && stderr.matches("No such file").count() == 1,
        "{stderr}"
    );
}

/// The record of an experiment folder holds every run's configuration (the
/// commands a `script` benchmark runs as root): `experiment resume` checks it
/// like the experiment file before it carries out any run.
#[test]
fn root_an_unsafe_experiment_record_is_refused_on_resume() {
    if !require_root("root_an_unsafe_experiment_record_is_refused_on_resume") {
        return;
    }
    let s = Scratch::new("record");
    let experiment = s.path("sweep.toml");
    std::fs::write(
        &experiment,
        "name = \"sweep\"\nbenchmark = \"script\"\nprobes = []\nrepeats = 1\n\n\
         [config.benchmarks.script]\ncommand = ['/bin/echo', '{\"name\": \"echo\", \"component\": \"echo\", \"@result\": {\"ops\": 1}}']\n",
    )
    .expect("write");
    let dir = s.path("sweep");
    let (experiment_s, dir_s) = (
        experiment.to_str().expect("utf8"),
        dir.to_str().expect("utf8"),
    );
    let marker = s.path("marker");
    let out = kernmlops_in(
        &s.0,
        &[
            "experiment",
            "run",
            experiment_s,
            "--dir",
            dir_s,
            "--no-graphs",
        ],
        &marker,
    );
    assert!(
        out.status.success(),
        "experiment run:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let record = dir.join("experiment.json");
    let resume = ["experiment", "resume", dir_s, "--no-graphs"];
    chmod(&record, 0o666);
    let out = kernmlops_in(&s.0, &resume, &marker);
    let stderr = text(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        !out.status.success()
            && lines.len() == 1
            && lines[0].starts_with("error: refusing the experiment record: ")
            && lines[0].contains("fix: chmod"),
        "resume with a world-writable record:\n{stderr}"
    );
    let mut insecure = vec!["--allow-insecure-plugins"];
    insecure.extend(resume);
    let out = kernmlops_in(&s.0, &insecure, &marker);
    let stderr = text(&out.stderr);
    assert!(
        out.status.success() && stderr.contains("(--allow-insecure-plugins)"),
        "{insecure:?}:\n{stderr}"
    );
    chmod(&record, 0o644);
    let out = kernmlops_in(&s.0, &resume, &marker);
    let stderr = text(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("refusing") && !stderr.contains("warning"),
        "resume with a safe record:\n{stderr}"
    );
}
