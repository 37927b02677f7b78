//! procfs: system state that costs one file read each, sampled at one
//! interval: pressure stall information, `/proc/vmstat`, per-CPU frequency,
//! `/proc/interrupts`, `/proc/softirqs`, `/proc/diskstats`, `/proc/net/dev`
//! and the benchmark cgroup's statistics. Plain Rust, no BPF: the kernel
//! keeps these counters already.
//!
//! Every file is opened once at start (a file this kernel lacks is a note,
//! not an error), then read from offset 0 at each sample into one reused
//! buffer. Counters are recorded raw with their increase since the
//! previous sample (`counters::Tracker`); a counter that goes backwards
//! gives a delta of 0 and is counted. Everything read is bounded: file
//! sizes (`files::MAX_FILE_BYTES`), keys, devices and CPUs per table.

pub mod counters;
pub mod files;
pub mod parse;
pub mod tables;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use kernmlops_plugin_sdk::{
    export_plugin, power::SysfsRoot, settings, sys, Batch, BatchExt, Error, HumanDuration,
    ProbeDecl, ProbeImpl, Result, Schedule, StartArgs, TableDecl,
};

use counters::Tracker;
use files::Source;
use parse::ALL_CPUS;
use tables::*;

/// Shortest sampling interval: below it the collector would spend its time
/// reading files.
const MIN_INTERVAL: Duration = Duration::from_millis(10);
/// Longest sampling interval.
const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// Keys per long table (`/proc/vmstat` has about 180, memory.stat 60).
pub const MAX_KEYS: usize = 4096;
/// Block devices or network interfaces per table.
pub const MAX_DEVICES: usize = 1024;
/// CPU ids (per-CPU tables and cpufreq files).
pub const MAX_CPUS: usize = 8192;

settings! {
    /// `[probes.procfs]` settings.
    pub struct Settings {
        /// Time between two samples of every file: "1s", "500ms", "2m" (10ms to 1h).
        pub interval: HumanDuration = HumanDuration::from_secs(1),
        /// Where sysfs is mounted, for cpufreq (tests point it at a tree they write).
        pub sysfs_root: SysfsRoot = SysfsRoot::default(),
    }
    validate(s) {
        let i = s.interval.get();
        if i < MIN_INTERVAL || i > MAX_INTERVAL {
            return Err(format!(
                "interval: {} is outside 10ms to 1h",
                s.interval
            ));
        }
        if !s.sysfs_root.path().is_absolute() {
            return Err(format!(
                "sysfs_root: {} is not an absolute path",
                s.sysfs_root.path().display()
            ));
        }
        Ok(())
    }
}

/// A cgroup file being sampled.
#[derive(Debug)]
struct CgroupFile {
    /// Index in [`CGROUP_FILES`].
    file: u32,
    source: Source,
    tracker: Tracker,
}

/// The running probe.
pub struct Procfs {
    schedule: Schedule,
    buf: Vec<u8>,
    key: String,
    cpus: Vec<u32>,
    pressure: Vec<(u32, Source)>,
    pressure_tracker: Tracker,
    vmstat: Option<Source>,
    vmstat_tracker: Tracker,
    cpufreq: Vec<(u32, Source)>,
    interrupts: Option<Source>,
    interrupts_tracker: Tracker,
    softirqs: Option<Source>,
    softirqs_tracker: Tracker,
    diskstats: Option<Source>,
    disk_tracker: Tracker,
    net_dev: Option<Source>,
    net_tracker: Tracker,
    cgroup: Vec<CgroupFile>,
    /// Lines or files whose content could not be read, per table.
    malformed: [u64; TABLES.len()],
    notes: Vec<String>,
}

/// `root`, canonical; the error names the setting's folder.
fn canonical(root: &Path) -> std::result::Result<PathBuf, String> {
    std::fs::canonicalize(root).map_err(|e| format!("{}: {e}", root.display()))
}

/// Opens `path` under `root`, or says why not in `notes` (`what` says what
/// is then missing).
fn open_or_note(path: &Path, root: &Path, what: &str, notes: &mut Vec<String>) -> Option<Source> {
    match Source::open(path, root) {
        Ok(s) => Some(s),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            notes.push(format!("{} does not exist: {what}", path.display()));
            None
        }
        Err(e) => {
            notes.push(format!("{} cannot be read ({e}): {what}", path.display()));
            None
        }
    }
}

/// Reads `source`, when open, into `buf`: the time of the read and the
/// text read, or `None` when it is not open, unreadable, or not text (then
/// counted in `malformed`).
fn read_sample<'b>(
    source: Option<&mut Source>,
    buf: &'b mut Vec<u8>,
    malformed: &mut u64,
) -> Option<(u64, &'b str)> {
    let source = source?;
    let ts = sys::clock::uptime_us();
    if !source.read(buf) {
        return None;
    }
    let text = files::text(buf, source.truncated > 0);
    if text.is_none() {
        *malformed += 1;
    }
    Some((ts, text?))
}

/// Whether a first read of `source` works and `check` accepts its text;
/// a note says why not.
fn first_read_ok(
    source: &mut Source,
    buf: &mut Vec<u8>,
    what: &str,
    notes: &mut Vec<String>,
    check: impl FnOnce(&str) -> bool,
) -> bool {
    let ok = source.read(buf);
    let text = ok.then(|| files::text(buf, source.truncated > 0)).flatten();
    match text {
        Some(t) if check(t) => true,
        Some(_) => {
            notes.push(format!(
                "{} has an unknown format: {what}",
                source.path.display()
            ));
            false
        }
        None => {
            let why = source
                .last_error
                .clone()
                .unwrap_or_else(|| "not text".into());
            notes.push(format!(
                "{} cannot be read ({why}): {what}",
                source.path.display()
            ));
            false
        }
    }
}

/// Every `cpu<N>` of `<sysfs>/devices/system/cpu` with a
/// `cpufreq/scaling_cur_freq`, in CPU order.
fn cpufreq_files(root: &Path, notes: &mut Vec<String>) -> Vec<(u32, Source)> {
    let dir = root.join("devices/system/cpu");
    let no_cpufreq = |dir: &Path| {
        format!(
            "no cpufreq on this machine (no {}/cpu*/cpufreq/scaling_cur_freq): procfs_cpufreq has no rows",
            dir.display()
        )
    };
    let mut cpus: Vec<u32> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str()?.strip_prefix("cpu")?.parse().ok())
            .take(MAX_CPUS)
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            notes.push(no_cpufreq(&dir));
            return Vec::new();
        }
        Err(e) => {
            notes.push(format!(
                "{} cannot be read ({e}): procfs_cpufreq has no rows",
                dir.display()
            ));
            return Vec::new();
        }
    };
    cpus.sort_unstable();
    let mut found = Vec::new();
    for cpu in cpus {
        let path = dir.join(format!("cpu{cpu}/cpufreq/scaling_cur_freq"));
        match Source::open(&path, root) {
            Ok(s) => found.push((cpu, s)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => notes.push(format!(
                "{} cannot be read ({e}): no frequency rows for CPU {cpu}",
                path.display()
            )),
        }
    }
    if found.is_empty() {
        notes.push(no_cpufreq(&dir));
    }
    found
}

/// The cgroup whose files `procfs_cgroup` samples: the benchmark's, else
/// the `--cgroup` filter's; `None` (no rows, no note) when the run has
/// neither.
fn run_cgroup(args: &StartArgs, notes: &mut Vec<String>) -> Option<PathBuf> {
    if let Some(dir) = files::benchmark_cgroup(&args.state_dir) {
        return Some(dir);
    }
    if args.filter_cgroup_id == 0 {
        return None;
    }
    match sys::cgroup::cgroup_dir_by_id(args.filter_cgroup_id) {
        Ok(dir) => Some(dir),
        Err(e) => {
            notes.push(format!(
                "the --cgroup filter's cgroup (id {}) was not found ({e}): procfs_cgroup has no rows",
                args.filter_cgroup_id
            ));
            None
        }
    }
}

fn cgroup_files(dir: &Path, notes: &mut Vec<String>) -> Vec<CgroupFile> {
    let Some(mount) = sys::cgroup::cgroup2_mount() else {
        notes.push("this machine has no cgroup v2 mount: procfs_cgroup has no rows".into());
        return Vec::new();
    };
    let mount = match canonical(&mount) {
        Ok(m) => m,
        Err(e) => {
            notes.push(format!(
                "the cgroup v2 mount cannot be read ({e}): procfs_cgroup has no rows"
            ));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (i, name) in CGROUP_FILES.iter().enumerate() {
        let path = dir.join(name);
        let controller = name.split('.').next().unwrap_or(name);
        let what = if name.ends_with(".pressure") {
            format!("no {name} rows (the kernel has no pressure stall information)")
        } else {
            format!("no {name} rows (the {controller} controller is not enabled for this cgroup)")
        };
        if let Some(source) = open_or_note(&path, &mount, &what, notes) {
            out.push(CgroupFile {
                file: i as u32,
                source,
                tracker: Tracker::new(MAX_KEYS, 1),
            });
        }
    }
    out
}

impl Procfs {
    /// Takes one sample of every file and appends its rows.
    fn sample(&mut self, batches: &mut [Batch]) {
        self.sample_pressure(&mut batches[T_PRESSURE]);
        self.sample_vmstat(&mut batches[T_VMSTAT]);
        self.sample_cpufreq(&mut batches[T_CPUFREQ]);
        self.sample_per_cpu(true, &mut batches[T_INTERRUPTS]);
        self.sample_per_cpu(false, &mut batches[T_SOFTIRQS]);
        self.sample_diskstats(&mut batches[T_DISKSTATS]);
        self.sample_net_dev(&mut batches[T_NET_DEV]);
        self.sample_cgroup(&mut batches[T_CGROUP]);
    }

    fn sample_pressure(&mut self, batch: &mut Batch) {
        for (resource, source) in &mut self.pressure {
            let ts = sys::clock::uptime_us();
            if !source.read(&mut self.buf) {
                continue;
            }
            let Some(psi) = files::text(&self.buf, false).and_then(parse::psi) else {
                self.malformed[T_PRESSURE] += 1;
                continue;
            };
            let name = RESOURCES[*resource as usize];
            let t = &mut self.pressure_tracker;
            let full = psi.full.unwrap_or_default();
            let row = PressureRow {
                ts_uptime_us: ts,
                some_avg10_pct: psi.some.avg10,
                some_avg60_pct: psi.some.avg60,
                some_avg300_pct: psi.some.avg300,
                some_total_us: psi.some.total_us,
                some_total_us_delta: t.delta(name, 0, psi.some.total_us, true).unwrap_or(0),
                full_avg10_pct: full.avg10,
                full_avg60_pct: full.avg60,
                full_avg300_pct: full.avg300,
                full_total_us: full.total_us,
                full_total_us_delta: t.delta(name, 1, full.total_us, true).unwrap_or(0),
                resource: *resource,
                _pad: 0,
            };
            batch.push_record(&row);
        }
    }

    fn sample_vmstat(&mut self, batch: &mut Batch) {
        let bad = &mut self.malformed[T_VMSTAT];
        let Some((ts, text)) = read_sample(self.vmstat.as_mut(), &mut self.buf, bad) else {
            return;
        };
        let t = &mut self.vmstat_tracker;
        let mut row = VmstatRow {
            ts_uptime_us: ts,
            value: 0,
            delta: 0,
            key: [0; VMSTAT_KEY_BYTES],
        };
        self.malformed[T_VMSTAT] += parse::key_values(text, |key, value| {
            if let Some(delta) = t.delta(key, 0, value, parse::vmstat_is_counter(key)) {
                row.value = value;
                row.delta = delta;
                set_text(&mut row.key, key);
                batch.push_record(&row);
            }
        });
    }

    fn sample_cpufreq(&mut self, batch: &mut Batch) {
        for (cpu, source) in &mut self.cpufreq {
            let ts = sys::clock::uptime_us();
            if !source.read(&mut self.buf) {
                continue;
            }
            let khz = files::text(&self.buf, false).and_then(|t| t.trim().parse().ok());
            let Some(khz) = khz else {
                self.malformed[T_CPUFREQ] += 1;
                continue;
            };
            batch.push_record(&CpufreqRow {
                ts_uptime_us: ts,
                khz,
                cpu: *cpu,
                _pad: 0,
            });
        }
    }

    fn sample_per_cpu(&mut self, interrupts: bool, batch: &mut Batch) {
        let (source, t, table) = if interrupts {
            (
                &mut self.interrupts,
                &mut self.interrupts_tracker,
                T_INTERRUPTS,
            )
        } else {
            (&mut self.softirqs, &mut self.softirqs_tracker, T_SOFTIRQS)
        };
        let bad = &mut self.malformed[table];
        let Some((ts, text)) = read_sample(source.as_mut(), &mut self.buf, bad) else {
            return;
        };
        let mut row = CpuCounterRow {
            ts_uptime_us: ts,
            value: 0,
            delta: 0,
            cpu: 0,
            key: [0; KEY_BYTES],
        };
        let bad = parse::per_cpu(
            text,
            interrupts,
            &mut self.cpus,
            &mut self.key,
            |key, cpu, value| {
                let slot = if cpu == ALL_CPUS { 0 } else { cpu as usize };
                if let Some(delta) = t.delta(key, slot, value, true) {
                    row.value = value;
                    row.delta = delta;
                    row.cpu = cpu;
                    set_text(&mut row.key, key);
                    batch.push_record(&row);
                }
            },
        );
        self.malformed[table] += bad.unwrap_or(1);
    }

    fn sample_diskstats(&mut self, batch: &mut Batch) {
        let bad = &mut self.malformed[T_DISKSTATS];
        let Some((ts, text)) = read_sample(self.diskstats.as_mut(), &mut self.buf, bad) else {
            return;
        };
        let t = &mut self.disk_tracker;
        self.malformed[T_DISKSTATS] += parse::diskstats(text, |d| {
            let mut row = DiskRow {
                ts_uptime_us: ts,
                values: d.stats,
                deltas: [0; parse::DISK_FIELDS],
                major: d.major,
                minor: d.minor,
                device: [0; DEVICE_BYTES],
            };
            for (i, (_, _, counter, _)) in DISK_COLUMNS.iter().enumerate() {
                if !counter {
                    continue;
                }
                match t.delta(d.name, i, d.stats[i], true) {
                    Some(delta) => row.deltas[i] = delta,
                    None => return,
                }
            }
            set_text(&mut row.device, d.name);
            batch.push_record(&row);
        });
    }

    fn sample_net_dev(&mut self, batch: &mut Batch) {
        let bad = &mut self.malformed[T_NET_DEV];
        let Some((ts, text)) = read_sample(self.net_dev.as_mut(), &mut self.buf, bad) else {
            return;
        };
        let t = &mut self.net_tracker;
        self.malformed[T_NET_DEV] += parse::net_dev(text, |name, values| {
            let mut row = NetRow {
                ts_uptime_us: ts,
                values: *values,
                deltas: [0; parse::NET_FIELDS],
                interface: [0; INTERFACE_BYTES],
            };
            for (i, &v) in values.iter().enumerate() {
                match t.delta(name, i, v, true) {
                    Some(delta) => row.deltas[i] = delta,
                    None => return,
                }
            }
            set_text(&mut row.interface, name);
            batch.push_record(&row);
        });
    }

    fn sample_cgroup(&mut self, batch: &mut Batch) {
        for f in &mut self.cgroup {
            let ts = sys::clock::uptime_us();
            if !f.source.read(&mut self.buf) {
                continue;
            }
            let Some(text) = files::text(&self.buf, f.source.truncated > 0) else {
                self.malformed[T_CGROUP] += 1;
                continue;
            };
            let mut row = CgroupRow {
                ts_uptime_us: ts,
                value: 0,
                delta: 0,
                file: f.file,
                key: [0; KEY_BYTES],
            };
            let t = &mut f.tracker;
            let name = CGROUP_FILES[f.file as usize];
            let mut push = |key: &str, value: u64, counter: bool| {
                if let Some(delta) = t.delta(key, 0, value, counter) {
                    row.value = value;
                    row.delta = delta;
                    set_text(&mut row.key, key);
                    batch.push_record(&row);
                }
            };
            let bad = match name {
                "cpu.stat" => parse::key_values(text, |k, v| push(k, v, true)),
                "memory.stat" => {
                    parse::key_values(text, |k, v| push(k, v, parse::memory_stat_is_counter(k)))
                }
                "io.stat" => parse::io_stat(text, &mut self.key, |k, v| push(k, v, true)),
                _ => match parse::psi(text) {
                    Some(psi) => {
                        push("some_total_us", psi.some.total_us, true);
                        if let Some(full) = psi.full {
                            push("full_total_us", full.total_us, true);
                        }
                        0
                    }
                    None => 1,
                },
            };
            self.malformed[T_CGROUP] += bad;
        }
    }

    /// Sources and their tables, for notes.
    fn sources(&self) -> Vec<(&'static str, &Source)> {
        let mut out: Vec<(&'static str, &Source)> = Vec::new();
        out.extend(self.pressure.iter().map(|(_, s)| (PRESSURE, s)));
        out.extend(self.vmstat.iter().map(|s| (VMSTAT, s)));
        out.extend(self.cpufreq.iter().map(|(_, s)| (CPUFREQ, s)));
        out.extend(self.interrupts.iter().map(|s| (INTERRUPTS, s)));
        out.extend(self.softirqs.iter().map(|s| (SOFTIRQS, s)));
        out.extend(self.diskstats.iter().map(|s| (DISKSTATS, s)));
        out.extend(self.net_dev.iter().map(|s| (NET_DEV, s)));
        out.extend(self.cgroup.iter().map(|f| (CGROUP, &f.source)));
        out
    }

    /// What happened during the run, one sentence each: resets, values
    /// over the limits, failed or cut reads, lines not understood.
    fn run_notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut trackers: Vec<(&str, &Tracker)> = vec![
            (PRESSURE, &self.pressure_tracker),
            (VMSTAT, &self.vmstat_tracker),
            (INTERRUPTS, &self.interrupts_tracker),
            (SOFTIRQS, &self.softirqs_tracker),
            (DISKSTATS, &self.disk_tracker),
            (NET_DEV, &self.net_tracker),
        ];
        trackers.extend(self.cgroup.iter().map(|f| (CGROUP, &f.tracker)));
        for (table, t) in trackers {
            if t.resets > 0 {
                out.push(format!(
                    "{table}: {} counter value(s) went backwards (a reset or a wrap): their delta is 0",
                    t.resets
                ));
            }
            if t.over_limit > 0 {
                out.push(format!(
                    "{table}: {} value(s) not recorded, past the limit of {MAX_KEYS} keys, {MAX_DEVICES} devices or {MAX_CPUS} CPUs",
                    t.over_limit
                ));
            }
        }
        for (table, s) in self.sources() {
            if s.failures > 0 {
                out.push(format!(
                    "{table}: {} read(s) of {} failed (last: {})",
                    s.failures,
                    s.path.display(),
                    s.last_error.as_deref().unwrap_or("?")
                ));
            }
            if s.truncated > 0 {
                out.push(format!(
                    "{table}: {} was longer than {} bytes in {} sample(s): the rest was not read",
                    s.path.display(),
                    files::MAX_FILE_BYTES,
                    s.truncated
                ));
            }
        }
        for (table, n) in TABLES.iter().zip(self.malformed) {
            if n > 0 {
                out.push(format!(
                    "{table}: {n} line(s) could not be read and were skipped"
                ));
            }
        }
        out
    }
}

impl ProbeImpl for Procfs {
    const NAME: &'static str = "procfs";
    type Settings = Settings;

    fn decl() -> ProbeDecl {
        ProbeDecl {
            name: Self::NAME.into(),
            description: "System state from /proc and /sys (pressure, vmstat, cpufreq, interrupts, softirqs, diskstats, net/dev) and the benchmark cgroup's statistics, sampled at an interval".into(),
            tables: tables::all().into(),
        }
    }

    fn start(args: &StartArgs, settings: Settings) -> Result<Self> {
        Self::start_in(args, settings, Path::new("/proc"))
    }

    fn drain(&mut self, timeout: Duration, batches: &mut [Batch]) -> Result<()> {
        if batches.len() != TABLES.len() {
            return Err(Error::new(format!(
                "host passed {} batches for {} tables",
                batches.len(),
                TABLES.len()
            )));
        }
        if self.schedule.wait(timeout) {
            self.sample(batches);
        }
        // Values past the limits are lost rows of their table.
        for (table, lost) in [
            (T_VMSTAT, self.vmstat_tracker.over_limit),
            (T_INTERRUPTS, self.interrupts_tracker.over_limit),
            (T_SOFTIRQS, self.softirqs_tracker.over_limit),
            (T_DISKSTATS, self.disk_tracker.over_limit),
            (T_NET_DEV, self.net_tracker.over_limit),
            (
                T_CGROUP,
                self.cgroup.iter().map(|f| f.tracker.over_limit).sum(),
            ),
        ] {
            batches[table].lost_total = lost;
        }
        Ok(())
    }

    fn stop(&mut self) -> Result<()> {
        Ok(())
    }

    fn tables(&self) -> Vec<TableDecl> {
        tables::all()
    }

    fn notes(&self) -> Vec<String> {
        let mut notes = self.notes.clone();
        notes.extend(self.run_notes());
        notes
    }
}

impl Procfs {
    /// Starts the probe on the procfs at `proc_root` (`/proc`; tests give
    /// a tree they wrote).
    pub fn start_in(args: &StartArgs, settings: Settings, proc_root: &Path) -> Result<Self> {
        let proc_root = canonical(proc_root).map_err(Error::new)?;
        let sysfs_root = canonical(settings.sysfs_root.path())
            .map_err(|e| Error::new(format!("sysfs_root: {e}")))?;
        let mut notes = Vec::new();
        let mut buf = Vec::new();
        let mut pressure = Vec::new();
        for (i, resource) in RESOURCES.iter().enumerate() {
            let path = proc_root.join("pressure").join(resource);
            let what = format!("no {resource} rows in {PRESSURE} (the kernel has no pressure stall information: CONFIG_PSI, or psi=0 at boot)");
            if let Some(mut s) = open_or_note(&path, &proc_root, &what, &mut notes) {
                if first_read_ok(&mut s, &mut buf, &what, &mut notes, |t| {
                    parse::psi(t).is_some()
                }) {
                    pressure.push((i as u32, s));
                }
            }
        }
        let mut plain = |name: &str, table: &str, check: &dyn Fn(&str) -> bool| {
            let what = format!("{table} has no rows");
            let mut s = open_or_note(&proc_root.join(name), &proc_root, &what, &mut notes)?;
            first_read_ok(&mut s, &mut buf, &what, &mut notes, check).then_some(s)
        };
        let vmstat = plain("vmstat", VMSTAT, &|t| {
            let mut pairs = 0;
            parse::key_values(t, |_, _| pairs += 1);
            pairs > 0
        });
        let interrupts = plain("interrupts", INTERRUPTS, &|t| {
            parse::per_cpu(t, true, &mut Vec::new(), &mut String::new(), |_, _, _| {}).is_some()
        });
        let softirqs = plain("softirqs", SOFTIRQS, &|t| {
            parse::per_cpu(t, false, &mut Vec::new(), &mut String::new(), |_, _, _| {}).is_some()
        });
        let disk_fields = std::cell::Cell::new(parse::DISK_FIELDS);
        let diskstats = plain("diskstats", DISKSTATS, &|t| {
            parse::diskstats(t, |d| disk_fields.set(disk_fields.get().min(d.fields)));
            true
        });
        let net_dev = plain("net/dev", NET_DEV, &|t| t.contains('|'));
        // Fields this kernel's diskstats lacks read as 0: say which.
        let fields = disk_fields.get();
        if let Some(s) = diskstats.as_ref().filter(|_| fields < parse::DISK_FIELDS) {
            let missing: Vec<&str> = DISK_COLUMNS[fields..].iter().map(|c| c.0).collect();
            notes.push(format!(
                "{} has {fields} fields per device on this kernel: {} are 0 in {DISKSTATS}",
                s.path.display(),
                missing.join(", ")
            ));
        }
        let cpufreq = cpufreq_files(&sysfs_root, &mut notes);
        let cgroup = run_cgroup(args, &mut notes)
            .map(|dir| cgroup_files(&dir, &mut notes))
            .unwrap_or_default();
        Ok(Self {
            schedule: Schedule::new(settings.interval.get(), Duration::ZERO),
            buf,
            key: String::new(),
            cpus: Vec::new(),
            pressure,
            pressure_tracker: Tracker::new(RESOURCES.len(), 2),
            vmstat,
            vmstat_tracker: Tracker::new(MAX_KEYS, 1),
            cpufreq,
            interrupts,
            interrupts_tracker: Tracker::new(MAX_KEYS, MAX_CPUS),
            softirqs,
            softirqs_tracker: Tracker::new(MAX_KEYS, MAX_CPUS),
            diskstats,
            disk_tracker: Tracker::new(MAX_DEVICES, parse::DISK_FIELDS),
            net_dev,
            net_tracker: Tracker::new(MAX_DEVICES, parse::NET_FIELDS),
            cgroup,
            malformed: [0; TABLES.len()],
            notes,
        })
    }
}

export_plugin! {
    description: "System state from /proc and /sys (pressure, vmstat, cpufreq, interrupts, softirqs, diskstats, net/dev) and the benchmark cgroup's statistics, sampled at an interval",
    probes: [Procfs],
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use kernmlops_plugin_sdk::{settings::parse, sys::private::TempDir};
    use kernmlops_plugin_testing::{require_root, start_args, Running};

    use super::*;

    fn settings(json: &str) -> Result<Settings> {
        parse::<Settings>("[probes.procfs]", json)
    }

    #[test]
    fn shown_defaults_are_the_used_ones() {
        kernmlops_plugin_testing::check_settings_defaults::<Settings>("[probes.procfs]");
    }

    #[test]
    fn settings_are_checked() {
        let s = settings("{}").expect("default");
        assert_eq!(s.interval.get(), Duration::from_secs(1));
        assert!(s.sysfs_root.is_real());
        for (json, word) in [
            (r#"{"interval":"5ms"}"#, "10ms"),
            (r#"{"interval":"2h"}"#, "1h"),
            (r#"{"sysfs_root":"sys"}"#, "absolute"),
            (r#"{"bogus":1}"#, "bogus"),
        ] {
            let e = settings(json).expect_err(json);
            assert!(e.message.contains(word), "{json}: {e}");
        }
    }

    /// Writes `files` (path relative to `root`, content) under `root`.
    fn write_tree(root: &Path, files: &[(&str, &str)]) {
        for (path, text) in files {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&path, text).expect("write");
        }
    }

    const PROC_WITHOUT_PSI: &[(&str, &str)] = &[
        ("vmstat", "nr_free_pages 100\npgfault 10\n"),
        (
            "interrupts",
            "      CPU0  CPU1\n  1:  5  6  IO-APIC 1-edge i8042\nLOC: 10 20 Local timer interrupts\nERR: 0\n",
        ),
        ("softirqs", "     CPU0 CPU1\n  HI: 1 2\n"),
        ("diskstats", "   8 0 sda 1 2 3 4 5 6 7 8 9 10 11\n"),
        (
            "net/dev",
            "Inter-| Receive | Transmit\n face |bytes|bytes\n  lo: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n",
        ),
    ];

    fn rows_by_key(run: &Running<Procfs>, table: &str) -> HashMap<String, Vec<(u64, u64)>> {
        let keys = run.column_str(table, "key");
        let values = run.column_u64(table, "value");
        let deltas = run.column_u64(table, "delta");
        let mut out: HashMap<String, Vec<(u64, u64)>> = HashMap::new();
        for ((k, v), d) in keys.into_iter().zip(values).zip(deltas) {
            out.entry(k).or_default().push((v, d));
        }
        out
    }

    /// A kernel without PSI (no /proc/pressure) and with the diskstats of
    /// Linux before 4.18: notes, no pressure rows, the other tables filled;
    /// deltas follow the file, a counter going backwards is a reset, a
    /// gauge going down is not.
    #[test]
    fn a_kernel_without_psi_is_a_note_and_deltas_follow_the_file() {
        let proc = TempDir::new("procfs-proc").expect("temp dir");
        let sys = TempDir::new("procfs-sys").expect("temp dir");
        write_tree(proc.path(), PROC_WITHOUT_PSI);
        let args = start_args(&format!(
            r#"{{"interval":"10ms","sysfs_root":"{}"}}"#,
            sys.path().display()
        ));
        let s = settings(&args.config_json).expect("settings");
        let probe = Procfs::start_in(&args, s, proc.path()).expect("start");
        let notes = probe.notes();
        for resource in RESOURCES {
            assert!(
                notes
                    .iter()
                    .any(|n| n.contains(&format!("pressure/{resource}"))
                        && n.contains("no pressure stall information")),
                "no note for {resource}: {notes:?}"
            );
        }
        assert!(
            notes
                .iter()
                .any(|n| n.contains("11 fields") && n.contains("flush_time_ms")),
            "{notes:?}"
        );
        assert!(notes.iter().any(|n| n.contains("no cpufreq")), "{notes:?}");
        let mut run = Running {
            tables: probe.tables(),
            batches: (0..TABLES.len()).map(|_| Batch::default()).collect(),
            probe,
        };
        run.drain_once(Duration::from_millis(100));
        write_tree(proc.path(), &[("vmstat", "nr_free_pages 90\npgfault 25\n")]);
        run.drain_once(Duration::from_millis(100));
        write_tree(proc.path(), &[("vmstat", "nr_free_pages 95\npgfault 3\n")]);
        run.drain_once(Duration::from_millis(100));
        assert_eq!(run.rows(PRESSURE), 0);
        let vm = rows_by_key(&run, VMSTAT);
        assert_eq!(vm["pgfault"], [(10, 0), (25, 15), (3, 0)]);
        assert_eq!(vm["nr_free_pages"], [(100, 0), (90, 0), (95, 5)]);
        let notes = run.probe.notes();
        assert!(
            notes
                .iter()
                .any(|n| n.starts_with(VMSTAT) && n.contains("1 counter value(s) went backwards")),
            "one reset (pgfault), the gauge is none: {notes:?}"
        );
        let irq = rows_by_key(&run, INTERRUPTS);
        assert_eq!(irq["1:i8042"].len(), 6, "two CPUs, three samples");
        assert_eq!(irq["ERR"].len(), 3);
        let cpus = run.column_u64(INTERRUPTS, "cpu");
        assert!(cpus.contains(&u64::from(ALL_CPUS)));
        assert_eq!(run.rows(SOFTIRQS), 6);
        assert_eq!(run.rows(DISKSTATS), 3);
        assert_eq!(run.column_u64(DISKSTATS, "write_time_ms"), [8, 8, 8]);
        assert_eq!(run.column_u64(DISKSTATS, "flushes_completed"), [0, 0, 0]);
        assert_eq!(run.column_str(NET_DEV, "interface"), ["lo", "lo", "lo"]);
        assert_eq!(run.column_u64(NET_DEV, "tx_compressed"), [16, 16, 16]);
        assert_eq!(run.column_u64(NET_DEV, "tx_compressed_delta"), [0, 0, 0]);
        assert_eq!(run.rows(CPUFREQ), 0);
        assert_eq!(run.rows(CGROUP), 0);
    }

    /// Keys past the limit are not recorded: counted as lost rows of the
    /// table and in a note.
    #[test]
    fn keys_past_the_limit_are_lost_rows() {
        let proc = TempDir::new("procfs-many").expect("temp dir");
        let vmstat: String = (0..MAX_KEYS + 5).map(|i| format!("k{i} {i}\n")).collect();
        let mut files = PROC_WITHOUT_PSI.to_vec();
        files[0] = ("vmstat", &vmstat);
        write_tree(proc.path(), &files);
        let args = start_args(r#"{"interval":"10ms"}"#);
        let s = settings(&args.config_json).expect("settings");
        let probe = Procfs::start_in(&args, s, proc.path()).expect("start");
        let mut run = Running {
            tables: probe.tables(),
            batches: (0..TABLES.len()).map(|_| Batch::default()).collect(),
            probe,
        };
        run.drain_once(Duration::from_millis(100));
        assert_eq!(run.rows(VMSTAT), MAX_KEYS as u64);
        assert_eq!(run.lost(VMSTAT), 5);
        let notes = run.probe.notes();
        assert!(
            notes
                .iter()
                .any(|n| n.starts_with(VMSTAT) && n.contains("5 value(s) not recorded")),
            "{notes:?}"
        );
    }

    /// cpufreq on a sysfs tree the test writes, shaped like the kernel's
    /// (`cpuN/cpufreq` a symlink to `../cpufreq/policyN`): one row per CPU
    /// with a frequency, new values at each sample, and a symlink leaving
    /// the root refused with a note.
    #[test]
    fn cpufreq_rows_come_from_the_sysfs_tree() {
        let sys = TempDir::new("procfs-cpufreq").expect("temp dir");
        let cpu = sys.path().join("devices/system/cpu");
        write_tree(
            sys.path(),
            &[
                (
                    "devices/system/cpu/cpu0/cpufreq/scaling_cur_freq",
                    "1800000\n",
                ),
                (
                    "devices/system/cpu/cpufreq/policy1/scaling_cur_freq",
                    "2400000\n",
                ),
                ("devices/system/cpu/cpu2/online", "1\n"),
                ("devices/system/cpu/cpu3/online", "1\n"),
                (
                    "devices/system/cpu/cpu10/cpufreq/scaling_cur_freq",
                    "1000\n",
                ),
            ],
        );
        std::fs::create_dir_all(cpu.join("cpu1")).expect("mkdir");
        std::os::unix::fs::symlink("../cpufreq/policy1", cpu.join("cpu1/cpufreq"))
            .expect("symlink");
        std::fs::create_dir_all(cpu.join("cpu3/cpufreq")).expect("mkdir");
        std::os::unix::fs::symlink("/proc/loadavg", cpu.join("cpu3/cpufreq/scaling_cur_freq"))
            .expect("symlink");
        let mut run = Running::<Procfs>::start(&format!(
            r#"{{"interval":"10ms","sysfs_root":"{}"}}"#,
            sys.path().display()
        ));
        let notes = run.probe.notes();
        assert!(
            notes
                .iter()
                .any(|n| n.contains("cpu3/cpufreq") && n.contains("outside")),
            "{notes:?}"
        );
        run.drain_once(Duration::from_millis(100));
        write_tree(
            sys.path(),
            &[(
                "devices/system/cpu/cpu0/cpufreq/scaling_cur_freq",
                "900000\n",
            )],
        );
        run.drain_once(Duration::from_millis(100));
        assert_eq!(run.column_u64(CPUFREQ, "cpu"), [0, 1, 10, 0, 1, 10]);
        assert_eq!(
            run.column_u64(CPUFREQ, "khz"),
            [1800000, 2400000, 1000, 900000, 2400000, 1000]
        );
        run.assert_recent_timestamps(CPUFREQ);
    }

    /// A cgroup v2 folder made by the test, removed (its processes killed)
    /// on drop.
    struct TestCgroup {
        dir: PathBuf,
        child: Option<std::process::Child>,
    }

    impl Drop for TestCgroup {
        fn drop(&mut self) {
            if let Some(mut c) = self.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
            let _ = std::fs::remove_dir(&self.dir);
        }
    }

    /// The cgroup part on a real cgroup with a busy process in it, found
    /// both ways a run names it: the benchmark's (the undo log in the
    /// state folder) and the --cgroup filter's id.
    #[test]
    fn root_cgroup_statistics_of_a_real_cgroup() {
        if !require_root("root_cgroup_statistics_of_a_real_cgroup") {
            return;
        }
        let mount = sys::cgroup::cgroup2_mount().expect("cgroup v2 mount");
        let dir = mount.join(format!("kml-procfs-test-{}", std::process::id()));
        std::fs::create_dir(&dir).expect("creating the test cgroup");
        let mut cg = TestCgroup {
            dir: dir.clone(),
            child: None,
        };
        let child = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .expect("spawning a busy loop");
        std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).expect("moving it in");
        cg.child = Some(child);
        let id = sys::cgroup::cgroup_id(&dir).expect("cgroup id");
        let state = TempDir::new("procfs-state").expect("temp dir");
        std::fs::write(
            state.join("undo.jsonl"),
            format!("{{\"cgroup\":\"{}\"}}\n", dir.display()),
        )
        .expect("undo log");
        let mut by_filter = start_args(r#"{"interval":"50ms"}"#);
        by_filter.filter_cgroup_id = id;
        let mut by_benchmark = start_args(r#"{"interval":"50ms"}"#);
        by_benchmark.state_dir = state.path().to_str().expect("utf8").into();
        for args in [by_filter, by_benchmark] {
            let mut run = Running::<Procfs>::start_with(&args);
            let notes = run.probe.notes();
            assert!(
                !notes.iter().any(|n| n.contains("cpu.stat")),
                "cpu.stat exists in every cgroup v2: {notes:?}"
            );
            for _ in 0..6 {
                run.drain_once(Duration::from_millis(100));
            }
            let files: Vec<&str> = run
                .column_u64(CGROUP, "file")
                .into_iter()
                .map(|i| CGROUP_FILES[i as usize])
                .collect();
            let keys = run.column_str(CGROUP, "key");
            let values = run.column_u64(CGROUP, "value");
            let deltas = run.column_u64(CGROUP, "delta");
            let usage: Vec<(u64, u64)> = (0..keys.len())
                .filter(|&i| files[i] == "cpu.stat" && keys[i] == "usage_usec")
                .map(|i| (values[i], deltas[i]))
                .collect();
            assert!(usage.len() >= 4, "usage_usec rows: {usage:?}");
            assert_eq!(usage[0].1, 0, "the first delta is 0");
            for w in usage.windows(2) {
                assert!(w[1].0 >= w[0].0, "usage_usec went back: {usage:?}");
                assert_eq!(
                    w[1].1,
                    w[1].0 - w[0].0,
                    "delta is the difference: {usage:?}"
                );
            }
            let used = usage.last().map_or(0, |u| u.0) - usage[0].0;
            assert!(
                used > 50_000,
                "the busy loop used {used} us of CPU in the samples"
            );
            if dir.join("cpu.pressure").exists() {
                assert!(
                    (0..keys.len())
                        .any(|i| files[i] == "cpu.pressure" && keys[i] == "some_total_us"),
                    "cpu.pressure rows"
                );
            }
        }
    }
}
