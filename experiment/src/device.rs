//! The block device an experiment measures, from its file's `[device]`
//! section: a loop device the experiment creates (`loop_size`), or a device
//! the user names (`name`, with `directory`, a folder on it).
//!
//! ```toml
//! [device]
//! loop_size = "256m"       # a loop device with an ext4 file system
//! # name = "sdb"           # or: this device (/sys/block/sdb) ...
//! # directory = "/mnt/sdb" # ... and a folder on it
//! ```
//!
//! A variable's key `device.<setting>` (`read_ahead_kb`, `scheduler`,
//! `nr_requests`, `rotational`, `max_sectors_kb`) sets that queue setting
//! of the device: the run's configuration gets
//! `machine.block.<name>.<setting>`, so the host checks, journals, reads
//! back and restores it as any knob. `${device_dir}` in a string of the
//! configuration is the folder on the device (for loop devices, its mount
//! point). The plan and the run ids keep the placeholders, so a resumed
//! experiment, whose loop device may get another name, plans the same runs.
//!
//! The loop device's life: a fresh folder of mode 0700 under `/var/tmp`
//! (created exclusively: never one planted there), a sparse backing file
//! in it (created exclusively, mode 0600), `mkfs.ext4` on the file, then
//! `mount -o loop,nosuid,nodev` on a folder beside it. The loop device is
//! mount's, with autoclear: unmounting detaches it. [`ActiveDevice`]'s drop
//! unmounts (lazily if it is busy) and removes the folder, after the last
//! run, after a failure, after SIGINT or SIGTERM; a step that fails undoes
//! the steps before it. Only a SIGKILL of the experiment leaves the mount
//! (`findmnt /var/tmp/kernmlops-device-*` finds it). The local executor
//! only: Slurm's nodes would not have the device.

use std::{
    fs::OpenOptions,
    os::unix::fs::{DirBuilderExt, OpenOptionsExt},
    path::{Path, PathBuf},
    process::Command,
};

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::{ExperimentError, Result};

/// The variable-key prefix naming the device's queue settings.
pub const KEY: &str = "device";
/// What `${device_dir}` stands for in configuration strings.
pub const DIR_PLACEHOLDER: &str = "${device_dir}";
/// Smallest and largest loop device.
const MIN_LOOP: u64 = 16 << 20;
const MAX_LOOP: u64 = 64 << 30;

/// The file's `[device]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    /// Create a loop device of this size (`256m`, `1g`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loop_size: Option<String>,
    /// Or use this block device (its name under /sys/block).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The folder on the named device that `${device_dir}` stands for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directory: Option<String>,
}

/// A size such as `256m`: bytes, or `k`, `m`, `g` (powers of 1024).
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim().to_ascii_lowercase();
    let (digits, shift) = match t.as_bytes().last() {
        Some(b'k') => (&t[..t.len() - 1], 10),
        Some(b'm') => (&t[..t.len() - 1], 20),
        Some(b'g') => (&t[..t.len() - 1], 30),
        _ => (t.as_str(), 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

impl DeviceSpec {
    /// Checks the section; the message names the key.
    pub fn check(&self) -> std::result::Result<(), (String, String)> {
        let err = |k: &str, m: String| Err((k.to_owned(), m));
        match (&self.loop_size, &self.name) {
            (Some(_), Some(_)) | (None, None) => {
                return err(
                    "",
                    "give loop_size = \"256m\" (a loop device the experiment creates) or name = \"<disk>\" with directory".into(),
                )
            }
            (Some(size), None) => {
                if self.directory.is_some() {
                    return err("directory", "goes with name: a loop device's folder is its mount point".into());
                }
                match parse_size(size) {
                    Some(n) if (MIN_LOOP..=MAX_LOOP).contains(&n) => {}
                    _ => return err("loop_size", format!("{size:?}: give a size from 16m to 64g, such as \"256m\"")),
                }
            }
            (None, Some(name)) => {
                if name.is_empty()
                    || !name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
                    || name.starts_with('.')
                {
                    return err("name", format!("{name:?}: a block device's name under /sys/block, such as \"sdb\""));
                }
                match &self.directory {
                    Some(d) if d.starts_with('/') => {}
                    _ => return err("directory", "missing or not absolute: the folder on the device the workload uses".into()),
                }
            }
        }
        Ok(())
    }
}

/// The device while the experiment uses it; a loop device is unmounted
/// (and so detached) and its folder removed when this is dropped.
#[derive(Debug)]
pub struct ActiveDevice {
    /// The name under /sys/block (`loop3`).
    pub name: String,
    /// What `${device_dir}` stands for.
    pub dir: PathBuf,
    /// The private folder of a loop device (backing file and mount point).
    private: Option<PathBuf>,
    mounted: bool,
}

/// Why a system tool (`mkfs.ext4`, `mount`, `umount`) did not do its job.
#[derive(Debug, thiserror::Error)]
enum ToolError {
    #[error("{program}: {source}")]
    Start {
        program: String,
        source: std::io::Error,
    },
    /// It ran and failed; `said` is the first line of its error output.
    #[error("{program} failed ({status}): {said}")]
    Failed {
        program: String,
        status: std::process::ExitStatus,
        said: String,
    },
}

fn tool(program: &str, args: &[&std::ffi::OsStr]) -> std::result::Result<(), ToolError> {
    let out = Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| ToolError::Start {
            program: program.to_owned(),
            source,
        })?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    Err(ToolError::Failed {
        program: program.to_owned(),
        status: out.status,
        said: err.lines().next().unwrap_or("").trim().to_owned(),
    })
}

/// The source device of the mount at `dir`, from /proc/self/mountinfo.
fn mounted_device(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = dir.to_str()?;
    text.lines().rev().find_map(|l| {
        let fields: Vec<&str> = l.split(' ').collect();
        let sep = fields.iter().position(|f| *f == "-")?;
        (fields.get(4) == Some(&want)).then(|| fields.get(sep + 2).map(|s| s.to_string()))?
    })
}

impl ActiveDevice {
    /// Makes the device ready: checks a named one, creates a loop device.
    pub fn setup(spec: &DeviceSpec, file: &str) -> Result<Self> {
        let fail = |m: String| ExperimentError::Invalid {
            file: file.to_owned(),
            key: "device".into(),
            message: m,
        };
        if let Some(name) = &spec.name {
            if !Path::new("/sys/block").join(name).is_dir() {
                return Err(fail(format!(
                    "/sys/block/{name} does not exist on this machine"
                )));
            }
            let dir = PathBuf::from(spec.directory.clone().unwrap_or_default());
            if !dir.is_dir() {
                return Err(fail(format!("directory {} is not a folder", dir.display())));
            }
            return Ok(Self {
                name: name.clone(),
                dir,
                private: None,
                mounted: false,
            });
        }
        let size = spec
            .loop_size
            .as_deref()
            .and_then(parse_size)
            .unwrap_or(MIN_LOOP);
        let private = Path::new("/var/tmp").join(format!(
            "kernmlops-device-{:016x}",
            crate::rng::random_seed()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&private)
            .map_err(|e| fail(format!("{}: {e}", private.display())))?;
        // From here on, dropping `device` undoes what was done.
        let mut device = Self {
            name: String::new(),
            dir: private.join("mnt"),
            private: Some(private.clone()),
            mounted: false,
        };
        let backing = private.join("backing.img");
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&backing)
            .map_err(|e| fail(format!("{}: {e}", backing.display())))?;
        f.set_len(size)
            .map_err(|e| fail(format!("{}: {e}", backing.display())))?;
        drop(f);
        tool(
            "mkfs.ext4",
            &["-q", "-F", "-E", "nodiscard", "-m", "0"]
                .map(std::ffi::OsStr::new)
                .iter()
                .copied()
                .chain([backing.as_os_str()])
                .collect::<Vec<_>>(),
        )
        .map_err(|e| fail(e.to_string()))?;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&device.dir)
            .map_err(|e| fail(format!("{}: {e}", device.dir.display())))?;
        tool(
            "mount",
            &[
                std::ffi::OsStr::new("-o"),
                std::ffi::OsStr::new("loop,nosuid,nodev"),
                backing.as_os_str(),
                device.dir.as_os_str(),
            ],
        )
        .map_err(|e| fail(e.to_string()))?;
        device.mounted = true;
        let source = mounted_device(&device.dir).ok_or_else(|| {
            fail(format!(
                "no mount at {} after mounting",
                device.dir.display()
            ))
        })?;
        let name = source.trim_start_matches("/dev/").to_owned();
        if !name.starts_with("loop") || !Path::new("/sys/block").join(&name).is_dir() {
            return Err(fail(format!(
                "{} is mounted from {source}, not a loop device",
                device.dir.display()
            )));
        }
        device.name = name;
        Ok(device)
    }

    /// A planned configuration made concrete for this device: `device.<k>`
    /// becomes `machine.block.<name>.<k>`, `${device_dir}` the folder.
    pub fn materialize(&self, config: &Json) -> Json {
        materialize(config, &self.name, &self.dir.display().to_string())
    }
}

/// [`ActiveDevice::materialize`] for a device `name` and folder `dir`.
pub fn materialize(config: &Json, name: &str, dir: &str) -> Json {
    fn strings(v: &mut Json, dir: &str) {
        match v {
            Json::String(s) if s.contains(DIR_PLACEHOLDER) => *s = s.replace(DIR_PLACEHOLDER, dir),
            Json::Array(a) => a.iter_mut().for_each(|x| strings(x, dir)),
            Json::Object(m) => m.values_mut().for_each(|x| strings(x, dir)),
            _ => {}
        }
    }
    let mut out = config.clone();
    strings(&mut out, dir);
    if let Json::Object(m) = &mut out {
        if let Some(Json::Object(settings)) = m.remove(KEY) {
            let machine = m
                .entry("machine")
                .or_insert_with(|| Json::Object(Default::default()));
            if let Json::Object(machine) = machine {
                let block = machine
                    .entry("block")
                    .or_insert_with(|| Json::Object(Default::default()));
                if let Json::Object(block) = block {
                    let disk = block
                        .entry(name.to_owned())
                        .or_insert_with(|| Json::Object(Default::default()));
                    if let Json::Object(disk) = disk {
                        disk.extend(settings);
                    }
                }
            }
        }
    }
    out
}

impl Drop for ActiveDevice {
    fn drop(&mut self) {
        if self.mounted {
            let dir = self.dir.as_os_str();
            if tool("umount", &[dir]).is_err() {
                // Busy (a workload's process still holding a file): detach
                // now, the kernel finishes when it lets go.
                if let Err(e) = tool("umount", &[std::ffi::OsStr::new("-l"), dir]) {
                    eprintln!(
                        "warning: the experiment's loop device at {} was not unmounted: {e}",
                        self.dir.display()
                    );
                    return;
                }
            }
            self.mounted = false;
        }
        if let Some(p) = self.private.take() {
            if let Err(e) = std::fs::remove_dir_all(&p) {
                eprintln!("warning: removing {}: {e}", p.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_sections_are_checked() {
        assert_eq!(parse_size("256m"), Some(256 << 20));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("2k"), Some(2048));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("99999999999999g"), None);
        let ok = |s: DeviceSpec| s.check().is_ok();
        let spec = |l: Option<&str>, n: Option<&str>, d: Option<&str>| DeviceSpec {
            loop_size: l.map(Into::into),
            name: n.map(Into::into),
            directory: d.map(Into::into),
        };
        assert!(ok(spec(Some("64m"), None, None)));
        assert!(ok(spec(None, Some("sdb"), Some("/mnt"))));
        assert!(!ok(spec(Some("1m"), None, None)), "too small");
        assert!(!ok(spec(Some("64m"), Some("sdb"), None)), "both");
        assert!(!ok(spec(None, None, None)), "neither");
        assert!(!ok(spec(None, Some("../sda"), Some("/mnt"))), "a path");
        assert!(!ok(spec(None, Some("sdb"), Some("mnt"))), "relative");
        assert!(!ok(spec(Some("64m"), None, Some("/mnt"))));
    }

    #[test]
    fn placeholders_become_the_device() {
        let planned = serde_json::json!({
            "device": {"read_ahead_kb": 128},
            "machine": {"sysctl": {"vm.swappiness": 10}},
            "benchmarks": {"fio": {"directory": "${device_dir}", "bs": "4k"}}
        });
        let run = materialize(&planned, "loop3", "/var/tmp/x/mnt");
        assert_eq!(
            run,
            serde_json::json!({
                "machine": {"sysctl": {"vm.swappiness": 10},
                            "block": {"loop3": {"read_ahead_kb": 128}}},
                "benchmarks": {"fio": {"directory": "/var/tmp/x/mnt", "bs": "4k"}}
            })
        );
        // Nothing to replace: unchanged.
        let plain = serde_json::json!({"benchmarks": {"fio": {"bs": "4k"}}});
        assert_eq!(materialize(&plain, "loop3", "/x"), plain);
    }
}
