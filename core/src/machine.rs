//! Kernel knobs a run sets, from the `[machine]` section: sysctls under
//! `/proc/sys`, files under `/sys`, and block devices' queue settings by
//! name. Every knob is resolved and checked before anything is written (the
//! file exists under `/proc/sys` or `/sys` once symlinks are resolved, is
//! writable, and the value is one the file offers where it lists its
//! choices, as `scheduler` does); then, one by one, the old value goes to
//! the run's undo journal, the new one is written and read back (the
//! kernel may round or clamp: the value read back is what is recorded).
//! A value the kernel refuses undoes the knobs already set and is one
//! error naming the file and the kernel's error.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The block-device queue settings `[machine.block.<disk>]` may set.
pub const BLOCK_KNOBS: &[&str] = &[
    "read_ahead_kb",
    "scheduler",
    "nr_requests",
    "rotational",
    "max_sectors_kb",
];

/// The longest value written to a kernel file.
const MAX_VALUE: usize = 4096;
/// The most knobs one run sets.
const MAX_KNOBS: usize = 1024;

/// Why a knob cannot be set.
#[derive(Debug, thiserror::Error)]
pub enum KnobError {
    #[error("machine.{name}: {why}")]
    Invalid { name: String, why: String },
    #[error("machine.{name}: {} does not exist on this machine", path.display())]
    Missing { name: String, path: PathBuf },
    #[error("machine.{name}: {} is outside /proc/sys and /sys", path.display())]
    Outside { name: String, path: PathBuf },
    #[error("machine.{name}: {} is not writable", path.display())]
    ReadOnly { name: String, path: PathBuf },
    #[error("machine.{name}: {value:?} is not one of {} offers: {}", path.display(), offered.join(", "))]
    NotOffered {
        name: String,
        path: PathBuf,
        value: String,
        offered: Vec<String>,
    },
    #[error("machine.{name}: the kernel refused {value:?} for {}: {}", path.display(), kernmlops_sys::private::strip_os_error(source))]
    Refused {
        name: String,
        path: PathBuf,
        value: String,
        source: io::Error,
    },
    #[error("machine.{name}: {}: {}", path.display(), kernmlops_sys::private::strip_os_error(source))]
    Io {
        name: String,
        path: PathBuf,
        source: io::Error,
    },
}

/// One knob: its name in the configuration (`sysctl.vm.swappiness`,
/// `sysfs.kernel/mm/...` with the path's slashes, `block.vda.read_ahead_kb`), the file it resolved
/// to, and the value to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Knob {
    pub name: String,
    pub path: PathBuf,
    pub value: String,
    /// How the value takes effect.
    pub how: How,
}

/// How a knob's value takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum How {
    /// Written to its file, read back, and the old value written back at
    /// the end.
    #[default]
    Write,
    /// `cpus`: the CPU list of the benchmark's cpuset cgroup, made by the
    /// run's guard and removed with it (`path` is the list of online CPUs
    /// it was checked against).
    Cpuset,
}

/// Where the kernel's trees are: `/sys` and `/proc/sys` on the machine, or
/// a tree a test writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roots {
    pub sys: PathBuf,
    pub proc_sys: PathBuf,
}

impl Roots {
    /// The machine's own `/sys` and `/proc/sys`.
    pub fn host() -> Self {
        Self {
            sys: PathBuf::from("/sys"),
            proc_sys: PathBuf::from("/proc/sys"),
        }
    }

    /// `<dir>/sys` and `<dir>/proc/sys`.
    pub fn under(dir: &Path) -> Self {
        Self {
            sys: dir.join("sys"),
            proc_sys: dir.join("proc/sys"),
        }
    }

    fn cpu(&self) -> PathBuf {
        self.sys.join("devices/system/cpu")
    }
}

/// A knob that was set: what was asked, what was there before, and what
/// the kernel kept.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Applied {
    pub name: String,
    pub path: PathBuf,
    pub requested: String,
    pub previous: String,
    pub value: String,
}

/// A TOML scalar as the text written to a kernel file (booleans as 1/0).
fn text(name: &str, v: &toml::Value) -> Result<String, KnobError> {
    let s = match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Boolean(b) => if *b { "1" } else { "0" }.to_owned(),
        toml::Value::Float(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{f:.0}"),
        other => {
            return Err(KnobError::Invalid {
                name: name.to_owned(),
                why: format!(
                    "expected a string, an integer or a boolean, not {}",
                    other.type_str()
                ),
            })
        }
    };
    if s.len() > MAX_VALUE || s.contains('\0') {
        return Err(KnobError::Invalid {
            name: name.to_owned(),
            why: format!("a value of at most {MAX_VALUE} bytes without NUL"),
        });
    }
    Ok(s)
}

/// A relative path of plain components (no `..`, no empty parts).
fn plain(name: &str, rel: &str) -> Result<PathBuf, KnobError> {
    let ok = !rel.is_empty()
        && !rel.starts_with('/')
        && rel
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'));
    if !ok {
        return Err(KnobError::Invalid {
            name: name.to_owned(),
            why: format!("{rel:?} is not a plain relative path (no leading /, no . or ..)"),
        });
    }
    Ok(PathBuf::from(rel))
}

/// Resolves `candidate` (symlinks followed, as sysfs needs) and requires it
/// under `/proc/sys` or `/sys` (the `roots`).
fn inside(name: &str, candidate: &Path, roots: &Roots) -> Result<PathBuf, KnobError> {
    let real = std::fs::canonicalize(candidate).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            KnobError::Missing {
                name: name.to_owned(),
                path: candidate.to_owned(),
            }
        } else {
            KnobError::Io {
                name: name.to_owned(),
                path: candidate.to_owned(),
                source: e,
            }
        }
    })?;
    let under =
        |root: &Path| std::fs::canonicalize(root).is_ok_and(|r| real.starts_with(&r) && real != r);
    if !(under(&roots.proc_sys) || under(&roots.sys)) {
        return Err(KnobError::Outside {
            name: name.to_owned(),
            path: real,
        });
    }
    Ok(real)
}

/// The keys of a `sysctl` or `sysfs` table with their values, sorted: a
/// nested table (`vm.swappiness = 10` unquoted, or an experiment variable's
/// `machine.sysctl.vm.swappiness`) joins its keys with `sep`, so
/// `"vm.swappiness"` and `vm.swappiness` name the same sysctl.
fn flatten(t: &toml::Table, sep: char) -> Vec<(String, &toml::Value)> {
    fn walk<'a>(
        prefix: &str,
        t: &'a toml::Table,
        sep: char,
        depth: usize,
        out: &mut Vec<(String, &'a toml::Value)>,
    ) {
        for (k, v) in t {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}{sep}{k}")
            };
            match v {
                // Deeper than any kernel path: left to be refused as a value.
                toml::Value::Table(inner) if depth < 32 => walk(&key, inner, sep, depth + 1, out),
                _ => out.push((key, v)),
            }
        }
    }
    let mut out = Vec::new();
    walk("", t, sep, 0, &mut out);
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The keys `[machine]` may hold.
pub const SECTIONS: &[&str] = &[
    "block", "cpufreq", "cpus", "smt", "sysctl", "sysfs", "thp_mode",
];

/// The settings `[machine.cpufreq]` may hold, for every CPU frequency
/// policy.
pub const CPUFREQ_KNOBS: &[&str] = &["boost", "governor", "max_freq_khz", "min_freq_khz"];

/// The knobs of a configuration's `[machine]` table, resolved and checked
/// ([`resolve`], then [`check`]); any other key is an error.
pub fn knobs(machine: &toml::Table) -> Result<Vec<Knob>, KnobError> {
    knobs_in(machine, &Roots::host())
}

/// [`knobs`] against the trees `roots`.
pub fn knobs_in(machine: &toml::Table, roots: &Roots) -> Result<Vec<Knob>, KnobError> {
    if let Some(key) = machine.keys().find(|k| !SECTIONS.contains(&k.as_str())) {
        return Err(KnobError::Invalid {
            name: key.clone(),
            why: format!("unknown key (known: {})", SECTIONS.join(", ")),
        });
    }
    let knobs = resolve_in(machine, roots)?;
    check(&knobs)?;
    Ok(knobs)
}

/// The knobs of a `[machine]` table, in a stable order (sysctl, sysfs,
/// block; keys sorted within each; then cpufreq, smt, thp_mode, cpus),
/// resolved to files but not yet checked. Other keys are left to the
/// caller.
pub fn resolve(machine: &toml::Table) -> Result<Vec<Knob>, KnobError> {
    resolve_in(machine, &Roots::host())
}

/// [`resolve`] against the trees `roots`.
pub fn resolve_in(machine: &toml::Table, roots: &Roots) -> Result<Vec<Knob>, KnobError> {
    let mut out = Vec::new();
    let table = |key: &str| -> Result<Option<&toml::Table>, KnobError> {
        match machine.get(key) {
            None => Ok(None),
            Some(toml::Value::Table(t)) => Ok(Some(t)),
            Some(other) => Err(KnobError::Invalid {
                name: key.to_owned(),
                why: format!("expected a table, not {}", other.type_str()),
            }),
        }
    };
    if let Some(t) = table("sysctl")? {
        out.extend(sysctl_knobs(t, roots)?);
    }
    if let Some(t) = table("sysfs")? {
        out.extend(sysfs_knobs(t, roots)?);
    }
    if let Some(t) = table("block")? {
        out.extend(block_knobs(t, roots)?);
    }
    if let Some(t) = table("cpufreq")? {
        out.extend(cpufreq(t, roots)?);
    }
    if let Some(v) = machine.get("smt") {
        out.push(smt(v, roots)?);
    }
    if let Some(v) = machine.get("thp_mode") {
        out.extend(thp_mode(v, roots)?);
    }
    if let Some(v) = machine.get("cpus") {
        out.push(cpus(v, roots)?);
    }
    check_distinct(&out)?;
    Ok(out)
}

/// A knob that writes the text of `v` to `path`.
fn write_knob(name: String, path: PathBuf, v: &toml::Value) -> Result<Knob, KnobError> {
    Ok(Knob {
        value: text(&name, v)?,
        name,
        path,
        how: How::Write,
    })
}

/// `[machine.sysctl]`: each key a file under `/proc/sys`.
fn sysctl_knobs(t: &toml::Table, roots: &Roots) -> Result<Vec<Knob>, KnobError> {
    let mut out = Vec::new();
    for (key, v) in flatten(t, '.') {
        let name = format!("sysctl.{key}");
        let ok = !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'));
        if !ok {
            return Err(KnobError::Invalid {
                name,
                why: "a sysctl name is letters, digits, '.', '_', '-' (e.g. vm.swappiness)".into(),
            });
        }
        let rel = plain(&name, &key.replace('.', "/"))?;
        let path = inside(&name, &roots.proc_sys.join(rel), roots)?;
        out.push(write_knob(name, path, v)?);
    }
    Ok(out)
}

/// `[machine.sysfs]`: each key a file under `/sys`.
fn sysfs_knobs(t: &toml::Table, roots: &Roots) -> Result<Vec<Knob>, KnobError> {
    let mut out = Vec::new();
    for (key, v) in flatten(t, '/') {
        let name = format!("sysfs.{key}");
        let rel = plain(&name, &key)?;
        let path = inside(&name, &roots.sys.join(rel), roots)?;
        out.push(write_knob(name, path, v)?);
    }
    Ok(out)
}

/// `[machine.block.<disk>]`: queue settings of a block device, disks and
/// keys sorted.
fn block_knobs(t: &toml::Table, roots: &Roots) -> Result<Vec<Knob>, KnobError> {
    let mut out = Vec::new();
    let mut disks: Vec<_> = t.iter().collect();
    disks.sort_by(|a, b| a.0.cmp(b.0));
    for (disk, settings) in disks {
        let ok = !disk.is_empty()
            && disk.len() <= 32
            && disk
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            && disk != "."
            && disk != "..";
        if !ok {
            return Err(KnobError::Invalid {
                name: format!("block.{disk}"),
                why: "a disk name such as vda, nvme0n1 or loop3".into(),
            });
        }
        let toml::Value::Table(settings) = settings else {
            return Err(KnobError::Invalid {
                name: format!("block.{disk}"),
                why: format!("expected a table of {}", BLOCK_KNOBS.join(", ")),
            });
        };
        let dev = roots.sys.join("block").join(disk);
        if !dev.exists() {
            return Err(KnobError::Missing {
                name: format!("block.{disk}"),
                path: dev,
            });
        }
        let mut keys: Vec<_> = settings.iter().collect();
        keys.sort_by(|a, b| a.0.cmp(b.0));
        for (key, v) in keys {
            let name = format!("block.{disk}.{key}");
            if !BLOCK_KNOBS.contains(&key.as_str()) {
                return Err(KnobError::Invalid {
                    name,
                    why: format!("not a block-device setting ({})", BLOCK_KNOBS.join(", ")),
                });
            }
            let path = inside(&name, &dev.join("queue").join(key), roots)?;
            out.push(write_knob(name, path, v)?);
        }
    }
    Ok(out)
}

/// `machine.thp_mode`: the THP `enabled` file; `""` sets nothing.
fn thp_mode(v: &toml::Value, roots: &Roots) -> Result<Option<Knob>, KnobError> {
    let mode = text("thp_mode", v)?;
    if mode.is_empty() {
        return Ok(None);
    }
    let name = "thp_mode".to_owned();
    let path = inside(&name, &roots.sys.join(THP_ENABLED), roots)?;
    Ok(Some(Knob {
        name,
        path,
        value: mode,
        how: How::Write,
    }))
}

/// No file is set twice, and there are at most [`MAX_KNOBS`] knobs.
fn check_distinct(out: &[Knob]) -> Result<(), KnobError> {
    for (i, k) in out.iter().enumerate() {
        if let Some(first) = out[..i].iter().find(|o| o.path == k.path) {
            return Err(KnobError::Invalid {
                name: k.name.clone(),
                why: format!(
                    "{} is set twice (also as machine.{})",
                    k.path.display(),
                    first.name
                ),
            });
        }
    }
    if out.len() > MAX_KNOBS {
        return Err(KnobError::Invalid {
            name: "machine".into(),
            why: format!("{} knobs; at most {MAX_KNOBS}", out.len()),
        });
    }
    Ok(())
}

/// The THP mode's file under `/sys`.
pub const THP_ENABLED: &str = "kernel/mm/transparent_hugepage/enabled";

/// The most CPUs a `cpus` list may name (the kernel's `NR_CPUS` limit).
const MAX_CPU: u32 = 8192;

fn invalid(name: &str, why: impl Into<String>) -> KnobError {
    KnobError::Invalid {
        name: name.to_owned(),
        why: why.into(),
    }
}

/// A CPU list as the kernel writes them (`0`, `2-3`, `0,4-7`), bounded.
pub fn parse_cpu_list(list: &str) -> Result<std::collections::BTreeSet<u32>, String> {
    let mut out = std::collections::BTreeSet::new();
    let list = list.trim();
    if list.is_empty() || list.len() > 4096 {
        return Err("a CPU list such as \"0\", \"2-3\" or \"0,4-7\"".into());
    }
    for part in list.split(',') {
        let (a, b) = part
            .trim()
            .split_once('-')
            .unwrap_or((part.trim(), part.trim()));
        let num = |t: &str| {
            t.parse::<u32>()
                .ok()
                .filter(|&n| n < MAX_CPU && !t.starts_with('+'))
                .ok_or_else(|| format!("{part:?} is not a CPU number or range (e.g. \"2-3\")"))
        };
        let (a, b) = (num(a)?, num(b)?);
        if a > b {
            return Err(format!("{part:?} is a range that ends before it starts"));
        }
        out.extend(a..=b);
    }
    Ok(out)
}

/// A set of CPUs as the kernel's shortest list (`0-3,6`).
pub fn format_cpu_list(cpus: &std::collections::BTreeSet<u32>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut it = cpus.iter().copied().peekable();
    while let Some(start) = it.next() {
        let mut end = start;
        while it.peek() == Some(&(end + 1)) {
            end += 1;
            it.next();
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    parts.join(",")
}

/// `cpus`: checked against the online CPUs before anything is set.
fn cpus(v: &toml::Value, roots: &Roots) -> Result<Knob, KnobError> {
    let name = "cpus";
    let text = match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        other => {
            return Err(invalid(
                name,
                format!(
                    "expected a CPU list such as \"2-3\", not {}",
                    other.type_str()
                ),
            ))
        }
    };
    let wanted = parse_cpu_list(&text).map_err(|e| invalid(name, e))?;
    let online_path = roots.cpu().join("online");
    let online_text = std::fs::read_to_string(&online_path).map_err(|source| KnobError::Io {
        name: name.to_owned(),
        path: online_path.clone(),
        source,
    })?;
    let online = parse_cpu_list(&online_text)
        .map_err(|e| invalid(name, format!("{}: {e}", online_path.display())))?;
    let missing: std::collections::BTreeSet<u32> = wanted.difference(&online).copied().collect();
    if !missing.is_empty() {
        let (s, are) = if missing.len() == 1 {
            ("", "is")
        } else {
            ("s", "are")
        };
        return Err(invalid(
            name,
            format!(
                "CPU{s} {} {are} not online on this machine (online: {})",
                format_cpu_list(&missing),
                online_text.trim()
            ),
        ));
    }
    Ok(Knob {
        name: name.to_owned(),
        path: online_path,
        value: format_cpu_list(&wanted),
        how: How::Cpuset,
    })
}

/// `smt = true | false | "on" | "off"`: `smt/control`, where the kernel
/// lets it be switched.
fn smt(v: &toml::Value, roots: &Roots) -> Result<Knob, KnobError> {
    let name = "smt";
    let value = match v {
        toml::Value::Boolean(b) => if *b { "on" } else { "off" }.to_owned(),
        toml::Value::String(s) if s == "on" || s == "off" => s.clone(),
        other => {
            return Err(invalid(
                name,
                format!("expected true, false, \"on\" or \"off\", not {other}"),
            ))
        }
    };
    let control = roots.cpu().join("smt/control");
    let path = inside(name, &control, roots).map_err(|e| match e {
        KnobError::Missing { path, .. } => invalid(
            name,
            format!(
                "this kernel has no SMT control ({} does not exist)",
                path.display()
            ),
        ),
        e => e,
    })?;
    let knob = Knob {
        name: name.to_owned(),
        path,
        value,
        how: How::Write,
    };
    let now = read(&knob)?;
    let now = now.trim();
    if !matches!(now, "on" | "off") {
        return Err(invalid(
            name,
            format!(
                "the kernel does not allow switching SMT here ({} says {now:?})",
                knob.path.display()
            ),
        ));
    }
    Ok(knob)
}

/// A cpufreq file's number (kHz).
fn khz(name: &str, path: &Path) -> Result<u64, KnobError> {
    let k = Knob {
        name: name.to_owned(),
        path: path.to_owned(),
        value: String::new(),
        how: How::Write,
    };
    let t = read(&k)?;
    t.trim().parse().map_err(|_| {
        invalid(
            name,
            format!(
                "{} holds {:?}, not a frequency in kHz",
                path.display(),
                t.trim()
            ),
        )
    })
}

/// `[machine.cpufreq]`: the same settings for every CPU frequency policy
/// (`cpufreq/policy<N>`), each policy's own knob (`cpufreq.policy0.governor`),
/// checked against what the policy offers: a governor it lists, a
/// frequency within its hardware range. `boost` is the global switch
/// (`cpufreq/boost`, or `intel_pstate/no_turbo` inverted, recorded as
/// `cpufreq.no_turbo`).
fn cpufreq(t: &toml::Table, roots: &Roots) -> Result<Vec<Knob>, KnobError> {
    if let Some(key) = t.keys().find(|k| !CPUFREQ_KNOBS.contains(&k.as_str())) {
        return Err(invalid(
            &format!("cpufreq.{key}"),
            format!("unknown key (known: {})", CPUFREQ_KNOBS.join(", ")),
        ));
    }
    let dir = roots.cpu().join("cpufreq");
    let policies = cpufreq_policies(&dir);
    let mut out = Vec::new();
    let keys: Vec<&String> = t.keys().filter(|k| *k != "boost").collect();
    if let Some(first) = keys.first() {
        if policies.is_empty() {
            return Err(invalid(
                &format!("cpufreq.{first}"),
                format!(
                    "this machine has no CPU frequency scaling (no cpufreq policy in {})",
                    dir.display()
                ),
            ));
        }
    }
    for (n, pdir) in &policies {
        if let Some(v) = t.get("governor") {
            out.push(governor(*n, pdir, v, roots)?);
        }
        out.extend(freq_range(t, *n, pdir, roots)?);
    }
    if let Some(v) = t.get("boost") {
        out.push(boost(v, &dir, roots)?);
    }
    Ok(out)
}

/// The cpufreq policies (`policy<N>` folders of `dir`), by number.
fn cpufreq_policies(dir: &Path) -> Vec<(u32, PathBuf)> {
    let mut policies: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let n = e
                        .file_name()
                        .to_str()?
                        .strip_prefix("policy")?
                        .parse()
                        .ok()?;
                    Some((n, e.path()))
                })
                .collect()
        })
        .unwrap_or_default();
    policies.sort();
    policies
}

/// `cpufreq.governor` for policy `n`: one of its available governors.
fn governor(n: u32, pdir: &Path, v: &toml::Value, roots: &Roots) -> Result<Knob, KnobError> {
    let name = format!("cpufreq.policy{n}.governor");
    let value = text(&name, v)?;
    let offered_path = pdir.join("scaling_available_governors");
    let offered: Vec<String> = std::fs::read_to_string(&offered_path)
        .map_err(|source| KnobError::Io {
            name: name.clone(),
            path: offered_path.clone(),
            source,
        })?
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let path = inside(&name, &pdir.join("scaling_governor"), roots)?;
    if !offered.contains(&value) {
        return Err(KnobError::NotOffered {
            name,
            path,
            value,
            offered,
        });
    }
    Ok(Knob {
        name,
        path,
        value,
        how: How::Write,
    })
}

/// `cpufreq.min_freq_khz` and `max_freq_khz` for policy `n`: within the
/// CPU's range, ordered so the range never inverts while they are set.
fn freq_range(t: &toml::Table, n: u32, pdir: &Path, roots: &Roots) -> Result<Vec<Knob>, KnobError> {
    let hw_min = || {
        khz(
            &format!("cpufreq.policy{n}"),
            &pdir.join("cpuinfo_min_freq"),
        )
    };
    let hw_max = || {
        khz(
            &format!("cpufreq.policy{n}"),
            &pdir.join("cpuinfo_max_freq"),
        )
    };
    let mut freqs = Vec::new();
    for (key, file) in [
        ("min_freq_khz", "scaling_min_freq"),
        ("max_freq_khz", "scaling_max_freq"),
    ] {
        let Some(v) = t.get(key) else { continue };
        let name = format!("cpufreq.policy{n}.{key}");
        let toml::Value::Integer(f) = v else {
            return Err(invalid(
                &name,
                format!("expected a frequency in kHz, not {}", v.type_str()),
            ));
        };
        let (lo, hi) = (hw_min()?, hw_max()?);
        if *f < 0 || (*f as u64) < lo || (*f as u64) > hi {
            return Err(invalid(
                &name,
                format!("{f} kHz is outside the CPU's range {lo}-{hi} kHz"),
            ));
        }
        let path = inside(&name, &pdir.join(file), roots)?;
        freqs.push((
            key,
            *f as u64,
            Knob {
                name,
                path,
                value: f.to_string(),
                how: How::Write,
            },
        ));
    }
    if let [(_, lo, _), (_, hi, _)] = freqs.as_slice() {
        if lo > hi {
            return Err(invalid(
                &format!("cpufreq.policy{n}.min_freq_khz"),
                format!("{lo} kHz is above max_freq_khz ({hi} kHz)"),
            ));
        }
        // Raising the range past the current maximum: the maximum first,
        // so the minimum is never above it in between.
        let now_max = khz(
            &format!("cpufreq.policy{n}"),
            &pdir.join("scaling_max_freq"),
        )?;
        if *lo > now_max {
            freqs.reverse();
        }
    }
    Ok(freqs.into_iter().map(|(_, _, k)| k).collect())
}

/// `cpufreq.boost`: cpufreq's `boost`, else `intel_pstate/no_turbo`.
fn boost(v: &toml::Value, dir: &Path, roots: &Roots) -> Result<Knob, KnobError> {
    let on = match v {
        toml::Value::Boolean(b) => *b,
        other => {
            return Err(invalid(
                "cpufreq.boost",
                format!("expected true or false, not {}", other.type_str()),
            ))
        }
    };
    let global = dir.join("boost");
    let pstate = roots.cpu().join("intel_pstate/no_turbo");
    let (name, path, value) = if global.exists() {
        ("cpufreq.boost", global, if on { "1" } else { "0" })
    } else if pstate.exists() {
        ("cpufreq.no_turbo", pstate, if on { "0" } else { "1" })
    } else {
        return Err(invalid(
            "cpufreq.boost",
            format!(
                "this machine has no boost switch (neither {} nor {})",
                global.display(),
                pstate.display()
            ),
        ));
    };
    let path = inside(name, &path, roots)?;
    Ok(Knob {
        name: name.to_owned(),
        path,
        value: value.to_owned(),
        how: How::Write,
    })
}

/// The choices a file lists with the current one in brackets
/// (`[mq-deadline] none`, `always [madvise] never`), or `None` for a plain
/// value.
pub fn choices(content: &str) -> Option<(Vec<String>, Option<String>)> {
    let words: Vec<&str> = content.split_whitespace().collect();
    if words.len() < 2 || !words.iter().any(|w| w.starts_with('[') && w.ends_with(']')) {
        return None;
    }
    let mut current = None;
    let offered = words
        .iter()
        .map(
            |w| match w.strip_prefix('[').and_then(|w| w.strip_suffix(']')) {
                Some(inner) => {
                    current = Some(inner.to_owned());
                    inner.to_owned()
                }
                None => (*w).to_owned(),
            },
        )
        .collect();
    Some((offered, current))
}

/// The value a kernel file holds: the bracketed choice of a list, else the
/// trimmed content.
pub fn current(content: &str) -> String {
    match choices(content) {
        Some((_, Some(c))) => c,
        _ => content.trim().to_owned(),
    }
}

fn read(knob: &Knob) -> Result<String, KnobError> {
    // A kernel file is small; bound the read all the same.
    use std::io::Read;
    let mut f = std::fs::File::open(&knob.path).map_err(|source| KnobError::Io {
        name: knob.name.clone(),
        path: knob.path.clone(),
        source,
    })?;
    let mut buf = String::new();
    Read::by_ref(&mut f)
        .take(64 * 1024)
        .read_to_string(&mut buf)
        .map_err(|source| KnobError::Io {
            name: knob.name.clone(),
            path: knob.path.clone(),
            source,
        })?;
    Ok(buf)
}

/// Checks every knob before any is set: the file is writable (its mode
/// has a write bit) and the value is one it offers where it lists them.
pub fn check(knobs: &[Knob]) -> Result<(), KnobError> {
    use std::os::unix::fs::PermissionsExt;
    for k in knobs.iter().filter(|k| k.how == How::Write) {
        let meta = std::fs::metadata(&k.path).map_err(|source| KnobError::Io {
            name: k.name.clone(),
            path: k.path.clone(),
            source,
        })?;
        if !meta.is_file() || meta.permissions().mode() & 0o222 == 0 {
            return Err(KnobError::ReadOnly {
                name: k.name.clone(),
                path: k.path.clone(),
            });
        }
        if let Some((offered, _)) = choices(&read(k)?) {
            if !offered.iter().any(|o| o == k.value.trim()) {
                return Err(KnobError::NotOffered {
                    name: k.name.clone(),
                    path: k.path.clone(),
                    value: k.value.clone(),
                    offered,
                });
            }
        }
    }
    Ok(())
}

fn write(knob: &Knob, value: &str) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&knob.path)?;
    f.write_all(value.as_bytes())
}

/// Sets the knobs written to files (not `cpus`, which the run's guard
/// sets) in order: for each, `journal(path, previous)` first (the
/// run's undo log, so the guardian or the next start writes it back), then
/// the value, then a read-back. On an error the knobs already set are
/// written back before it is returned.
pub fn apply(
    knobs: &[Knob],
    mut journal: impl FnMut(&Path, &str) -> io::Result<()>,
) -> Result<Vec<Applied>, KnobError> {
    let mut done: Vec<Applied> = Vec::with_capacity(knobs.len());
    for k in knobs.iter().filter(|k| k.how == How::Write) {
        let step = (|| {
            let previous = current(&read(k)?);
            journal(&k.path, &previous).map_err(|source| KnobError::Io {
                name: k.name.clone(),
                path: k.path.clone(),
                source,
            })?;
            write(k, &k.value).map_err(|source| KnobError::Refused {
                name: k.name.clone(),
                path: k.path.clone(),
                value: k.value.clone(),
                source,
            })?;
            Ok(Applied {
                name: k.name.clone(),
                path: k.path.clone(),
                requested: k.value.clone(),
                previous,
                value: current(&read(k)?),
            })
        })();
        match step {
            Ok(a) => done.push(a),
            Err(e) => {
                restore(&done);
                return Err(e);
            }
        }
    }
    Ok(done)
}

/// Writes each knob's previous value back, last set first; returns one line
/// per knob that could not be restored.
pub fn restore(applied: &[Applied]) -> Vec<String> {
    let mut failed = Vec::new();
    for a in applied.iter().rev() {
        let k = Knob {
            name: a.name.clone(),
            path: a.path.clone(),
            value: a.previous.clone(),
            how: How::Write,
        };
        if let Err(e) = write(&k, &a.previous) {
            failed.push(format!(
                "machine.{}: restoring {} to {:?}: {}",
                a.name,
                a.path.display(),
                a.previous,
                kernmlops_sys::private::strip_os_error(&e)
            ));
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tree::Tree;

    fn table(text: &str) -> toml::Table {
        text.parse().unwrap()
    }

    #[test]
    fn names_resolve_to_kernel_files() {
        let k = resolve(&table(
            "[sysctl]\n\"vm.swappiness\" = 10\n[sysfs]\n\"kernel/mm/transparent_hugepage/enabled\" = \"madvise\"\n",
        ))
        .unwrap();
        assert_eq!(k[0].name, "sysctl.vm.swappiness");
        assert_eq!(k[0].path, Path::new("/proc/sys/vm/swappiness"));
        assert_eq!(k[0].value, "10");
        assert_eq!(
            k[1].path,
            Path::new("/sys/kernel/mm/transparent_hugepage/enabled")
        );
    }

    #[test]
    fn paths_that_leave_the_kernel_trees_are_refused() {
        for bad in [
            "[sysfs]\n\"../etc/passwd\" = 1\n",
            "[sysfs]\n\"/etc/passwd\" = 1\n",
            "[sysctl]\n\"vm/../../etc\" = 1\n",
            "[sysctl]\n\"vm swappiness\" = 1\n",
            "[block]\n\"../sda\" = { read_ahead_kb = 1 }\n",
        ] {
            let e = resolve(&table(bad)).unwrap_err();
            assert!(matches!(e, KnobError::Invalid { .. }), "{bad}: {e}");
        }
        let e = resolve(&table("[sysctl]\n\"vm.no_such_knob\" = 1\n")).unwrap_err();
        assert!(matches!(e, KnobError::Missing { .. }), "{e}");
        let e = resolve(&table("[block.nosuchdisk0]\nread_ahead_kb = 128\n")).unwrap_err();
        assert!(
            e.to_string()
                .contains("/sys/block/nosuchdisk0 does not exist"),
            "{e}"
        );
        let e = resolve(&table("[sysctl]\n\"vm.swappiness\" = [1]\n")).unwrap_err();
        assert!(e.to_string().contains("not array"), "{e}");
    }

    #[test]
    fn nested_keys_name_the_same_files_as_quoted_ones() {
        let nested = resolve(&table(
            "[sysctl]\nvm.swappiness = 10\n[sysfs.kernel.mm.transparent_hugepage]\nenabled = \"madvise\"\n",
        ))
        .unwrap();
        let quoted = resolve(&table(
            "[sysctl]\n\"vm.swappiness\" = 10\n[sysfs]\n\"kernel/mm/transparent_hugepage/enabled\" = \"madvise\"\n",
        ))
        .unwrap();
        assert_eq!(nested, quoted);
        assert_eq!(nested[0].name, "sysctl.vm.swappiness");
        assert_eq!(
            nested[1].name,
            "sysfs.kernel/mm/transparent_hugepage/enabled"
        );
        // Both spellings at once: one file set twice.
        let e = resolve(&table(
            "[sysctl]\n\"vm.swappiness\" = 10\nvm.swappiness = 11\n",
        ))
        .unwrap_err();
        assert!(e.to_string().contains("is set twice"), "{e}");
        let e = knobs(&table("turbo = true\n")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "machine.turbo: unknown key (known: block, cpufreq, cpus, smt, sysctl, sysfs, thp_mode)"
        );
    }

    #[test]
    fn bracketed_choices_are_parsed() {
        let (offered, cur) = choices("always [madvise] never\n").unwrap();
        assert_eq!(offered, ["always", "madvise", "never"]);
        assert_eq!(cur.as_deref(), Some("madvise"));
        assert_eq!(current("[mq-deadline] none"), "mq-deadline");
        assert_eq!(current("60\n"), "60");
        assert_eq!(choices("4096\t8192"), None);
    }

    /// A crafted kernel tree (with `proc/sys` and the cpufreq folder).
    fn tree(name: &str) -> Tree {
        let t = Tree::new(&format!("machine-{name}"));
        std::fs::create_dir_all(t.0.join("proc/sys")).unwrap();
        std::fs::create_dir_all(t.0.join("sys/devices/system/cpu/cpufreq")).unwrap();
        t
    }

    /// What the machine tests need of a [`Tree`] beyond its files.
    trait KernelTree {
        fn roots(&self) -> Roots;
        /// Two cpufreq policies of 800-3000 MHz, under powersave.
        fn cpufreq(&self) -> &Self;
    }
    impl KernelTree for Tree {
        fn roots(&self) -> Roots {
            Roots::under(&self.0)
        }
        fn cpufreq(&self) -> &Self {
            for n in 0..2 {
                let p = format!("sys/devices/system/cpu/cpufreq/policy{n}");
                self.file(
                    &format!("{p}/scaling_available_governors"),
                    "performance powersave\n",
                )
                .file(&format!("{p}/scaling_governor"), "powersave\n")
                .file(&format!("{p}/cpuinfo_min_freq"), "800000\n")
                .file(&format!("{p}/cpuinfo_max_freq"), "3000000\n")
                .file(&format!("{p}/scaling_min_freq"), "800000\n")
                .file(&format!("{p}/scaling_max_freq"), "1000000\n");
            }
            self
        }
    }

    #[test]
    fn cpufreq_knobs_resolve_per_policy_against_what_it_offers() {
        let t = tree("cpufreq");
        t.cpufreq()
            .file("sys/devices/system/cpu/cpufreq/boost", "1\n");
        let roots = t.roots();
        let k = knobs_in(
            &table("[cpufreq]\ngovernor = \"performance\"\nmin_freq_khz = 2000000\nmax_freq_khz = 3000000\nboost = false\n"),
            &roots,
        )
        .unwrap();
        let names: Vec<&str> = k.iter().map(|k| k.name.as_str()).collect();
        // The maximum before the minimum: raising the minimum past the
        // current maximum (1000000) first would be refused.
        assert_eq!(
            names,
            [
                "cpufreq.policy0.governor",
                "cpufreq.policy0.max_freq_khz",
                "cpufreq.policy0.min_freq_khz",
                "cpufreq.policy1.governor",
                "cpufreq.policy1.max_freq_khz",
                "cpufreq.policy1.min_freq_khz",
                "cpufreq.boost",
            ]
        );
        assert_eq!(k[6].value, "0");
        // Lowering: the minimum first.
        let low = knobs_in(
            &table("[cpufreq]\nmin_freq_khz = 800000\nmax_freq_khz = 900000\n"),
            &roots,
        )
        .unwrap();
        assert_eq!(low[0].name, "cpufreq.policy0.min_freq_khz");
        // Set, read back and restored in the tree.
        let applied = apply(&k, |_, _| Ok(())).unwrap();
        assert_eq!(
            t.read("sys/devices/system/cpu/cpufreq/policy1/scaling_governor"),
            "performance"
        );
        assert_eq!(
            t.read("sys/devices/system/cpu/cpufreq/policy1/scaling_min_freq"),
            "2000000"
        );
        assert_eq!(applied[1].previous, "1000000");
        assert_eq!(applied[1].value, "3000000");
        assert!(restore(&applied).is_empty());
        assert_eq!(
            t.read("sys/devices/system/cpu/cpufreq/policy1/scaling_governor"),
            "powersave"
        );
        assert_eq!(
            t.read("sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq"),
            "1000000"
        );
        assert_eq!(t.read("sys/devices/system/cpu/cpufreq/boost"), "1");

        for (bad, want) in [
            (
                "governor = \"ondemand\"",
                format!("machine.cpufreq.policy0.governor: \"ondemand\" is not one of {} offers: performance, powersave", t.0.join("sys/devices/system/cpu/cpufreq/policy0/scaling_governor").display()),
            ),
            (
                "max_freq_khz = 4000000",
                "machine.cpufreq.policy0.max_freq_khz: 4000000 kHz is outside the CPU's range 800000-3000000 kHz".to_owned(),
            ),
            (
                "min_freq_khz = 2500000\nmax_freq_khz = 2000000",
                "machine.cpufreq.policy0.min_freq_khz: 2500000 kHz is above max_freq_khz (2000000 kHz)".to_owned(),
            ),
            (
                "turbo = true",
                "machine.cpufreq.turbo: unknown key (known: boost, governor, max_freq_khz, min_freq_khz)".to_owned(),
            ),
            (
                "max_freq_khz = \"fast\"",
                "machine.cpufreq.policy0.max_freq_khz: expected a frequency in kHz, not string".to_owned(),
            ),
        ] {
            let e = knobs_in(&table(&format!("[cpufreq]\n{bad}\n")), &roots).unwrap_err();
            assert_eq!(e.to_string(), want, "{bad}");
        }
    }

    #[test]
    fn without_cpufreq_or_a_boost_switch_each_is_one_line_naming_what_is_missing() {
        let t = tree("nocpufreq");
        let roots = t.roots();
        let dir = t.0.join("sys/devices/system/cpu/cpufreq");
        let e = knobs_in(&table("[cpufreq]\ngovernor = \"performance\"\n"), &roots).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "machine.cpufreq.governor: this machine has no CPU frequency scaling (no cpufreq policy in {})",
                dir.display()
            )
        );
        let e = knobs_in(&table("[cpufreq]\nboost = true\n"), &roots).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("machine.cpufreq.boost: this machine has no boost switch (neither "),
            "{e}"
        );
        // intel_pstate's switch, inverted, under its own name.
        t.file("sys/devices/system/cpu/intel_pstate/no_turbo", "0\n");
        let k = knobs_in(&table("[cpufreq]\nboost = false\n"), &roots).unwrap();
        assert_eq!(
            (k[0].name.as_str(), k[0].value.as_str()),
            ("cpufreq.no_turbo", "1")
        );
    }

    #[test]
    fn smt_is_switched_only_where_the_kernel_allows_it() {
        let t = tree("smt");
        let roots = t.roots();
        let control = t.0.join("sys/devices/system/cpu/smt/control");
        let e = knobs_in(&table("smt = false\n"), &roots).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "machine.smt: this kernel has no SMT control ({} does not exist)",
                control.display()
            )
        );
        t.file("sys/devices/system/cpu/smt/control", "notsupported\n");
        let e = knobs_in(&table("smt = false\n"), &roots).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("machine.smt: the kernel does not allow switching SMT here ({} says \"notsupported\")", control.display())
        );
        t.file("sys/devices/system/cpu/smt/control", "on\n");
        let k = knobs_in(&table("smt = false\n"), &roots).unwrap();
        assert_eq!((k[0].name.as_str(), k[0].value.as_str()), ("smt", "off"));
        let e = knobs_in(&table("smt = \"maybe\"\n"), &roots).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("machine.smt: expected true, false"),
            "{e}"
        );
    }

    #[test]
    fn cpus_are_checked_against_the_online_cpus() {
        let t = tree("cpus");
        t.file("sys/devices/system/cpu/online", "0-3\n");
        let roots = t.roots();
        let k = knobs_in(&table("cpus = \"3,2\"\n"), &roots).unwrap();
        assert_eq!((k[0].value.as_str(), k[0].how), ("2-3", How::Cpuset));
        let k = knobs_in(&table("cpus = 0\n"), &roots).unwrap();
        assert_eq!(k[0].value, "0");
        for (bad, want) in [
            (
                "\"4\"",
                "machine.cpus: CPU 4 is not online on this machine (online: 0-3)",
            ),
            (
                "\"2-9\"",
                "machine.cpus: CPUs 4-9 are not online on this machine (online: 0-3)",
            ),
            (
                "\"3-1\"",
                "machine.cpus: \"3-1\" is a range that ends before it starts",
            ),
            (
                "\"two\"",
                "machine.cpus: \"two\" is not a CPU number or range (e.g. \"2-3\")",
            ),
            (
                "\"\"",
                "machine.cpus: a CPU list such as \"0\", \"2-3\" or \"0,4-7\"",
            ),
            (
                "[1]",
                "machine.cpus: expected a CPU list such as \"2-3\", not array",
            ),
        ] {
            let e = knobs_in(&table(&format!("cpus = {bad}\n")), &roots).unwrap_err();
            assert_eq!(e.to_string(), want, "{bad}");
        }
        assert_eq!(
            format_cpu_list(&parse_cpu_list("0,2-4,6,7").unwrap()),
            "0,2-4,6-7"
        );
    }

    #[test]
    fn thp_mode_is_the_enabled_file_with_its_choices() {
        let t = tree("thp");
        t.file(
            "sys/kernel/mm/transparent_hugepage/enabled",
            "always [madvise] never\n",
        );
        let roots = t.roots();
        let k = knobs_in(&table("thp_mode = \"never\"\n"), &roots).unwrap();
        assert_eq!(k[0].name, "thp_mode");
        assert!(k[0].path.ends_with(THP_ENABLED));
        assert!(knobs_in(&table("thp_mode = \"\"\n"), &roots)
            .unwrap()
            .is_empty());
        let e = knobs_in(&table("thp_mode = \"sometimes\"\n"), &roots).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("machine.thp_mode: \"sometimes\" is not one of ")
                && e.to_string().ends_with("offers: always, madvise, never"),
            "{e}"
        );
        let e = knobs_in(
            &table("thp_mode = \"never\"\n[sysfs]\n\"kernel/mm/transparent_hugepage/enabled\" = \"always\"\n"),
            &roots,
        )
        .unwrap_err();
        assert!(e.to_string().contains("is set twice"), "{e}");
    }

    fn root() -> bool {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            return true;
        }
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "root test skipped under CI"
        );
        false
    }

    /// The root tests change the same sysctl: one at a time.
    static SYSCTL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Puts a sysctl back however the test ends.
    struct Keep(PathBuf, String);
    impl Drop for Keep {
        fn drop(&mut self) {
            let _ = std::fs::write(&self.0, &self.1);
        }
    }

    /// Holds the root sysctl tests one at a time and keeps `path`'s value,
    /// written back when the [`Keep`] drops; None (skip) when not root.
    fn sysctl_test(path: &Path) -> Option<(std::sync::MutexGuard<'static, ()>, String, Keep)> {
        let one = root().then(|| SYSCTL.lock().unwrap_or_else(|e| e.into_inner()))?;
        let before = value(path);
        Some((one, before.clone(), Keep(path.to_owned(), before)))
    }

    /// A setting's value, trimmed.
    fn value(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap().trim().to_owned()
    }

    #[test]
    fn root_a_sysctl_is_journalled_set_read_back_and_restored() {
        let path = PathBuf::from("/proc/sys/vm/swappiness");
        let Some((_one, before, _keep)) = sysctl_test(&path) else {
            return;
        };
        let want = if before == "17" { "18" } else { "17" };
        let knobs = resolve(&table(&format!("[sysctl]\n\"vm.swappiness\" = {want}\n"))).unwrap();
        check(&knobs).unwrap();
        let mut journal = Vec::new();
        let applied = apply(&knobs, |p, v| {
            journal.push((p.to_owned(), v.to_owned()));
            Ok(())
        })
        .unwrap();
        assert_eq!(journal, vec![(path.clone(), before.clone())]);
        assert_eq!(applied[0].value, want);
        assert_eq!(applied[0].previous, before);
        assert_eq!(value(&path), want);
        assert!(restore(&applied).is_empty());
        assert_eq!(value(&path), before);
    }

    #[test]
    fn root_the_value_read_back_is_what_the_kernel_kept() {
        // The kernel rounds fs.pipe-max-size up to a power of two pages.
        let path = PathBuf::from("/proc/sys/fs/pipe-max-size");
        let Some((_one, before, _keep)) = sysctl_test(&path) else {
            return;
        };
        let asked = before.parse::<u64>().unwrap() + 1;
        let knobs = resolve(&table(&format!(
            "[sysctl]\n\"fs.pipe-max-size\" = {asked}\n"
        )))
        .unwrap();
        let applied = apply(&knobs, |_, _| Ok(())).unwrap();
        let kept: u64 = applied[0].value.parse().unwrap();
        assert_eq!(applied[0].requested, asked.to_string());
        assert!(
            kept > asked && (kept / 4096).is_power_of_two() && kept % 4096 == 0,
            "asked {asked}, recorded {kept}"
        );
        assert_eq!(value(&path), applied[0].value);
        assert!(restore(&applied).is_empty());
        assert_eq!(value(&path), before);
    }

    #[test]
    fn root_a_refused_value_undoes_the_knobs_already_set() {
        let swap = PathBuf::from("/proc/sys/vm/swappiness");
        let ratio = PathBuf::from("/proc/sys/vm/dirty_ratio");
        let Some((_one, before, _keep)) = sysctl_test(&swap) else {
            return;
        };
        let want = if before == "17" { "18" } else { "17" };
        // swappiness is set first (sorted), then dirty_ratio refuses 1000 (at most 100).
        let knobs = resolve(&table(&format!(
            "[sysctl]\n\"vm.swappiness\" = {want}\n\"vm.dirty_ratio\" = 1000\n"
        )))
        .unwrap();
        assert_eq!(knobs[0].path, ratio);
        let knobs = vec![knobs[1].clone(), knobs[0].clone()];
        let e = apply(&knobs, |_, _| Ok(())).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("machine.sysctl.vm.dirty_ratio: the kernel refused \"1000\" for /proc/sys/vm/dirty_ratio: "),
            "{e}"
        );
        assert_eq!(value(&swap), before);
    }
}
