//! perf: hardware and software performance counters per CPU (TLB misses,
//! page faults, context switches, or any perf event named in the settings),
//! opened with `perf_event_open` and read from user space at a fixed
//! frequency. One table per counter with the cumulative count and the time
//! the counter was enabled and running, so multiplexing can be corrected.

pub use kernmlops_perf_events as events;

use std::{
    os::fd::{AsRawFd, OwnedFd},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use events::{EventSpec, Reading};
use kernmlops_plugin_sdk::{
    export_plugin, schedule::nap, settings, sys::clock::uptime_us, table, Batch, BatchExt, Error,
    ProbeDecl, ProbeImpl, Record, Result, StartArgs, TableDecl,
};
use serde::{Deserialize, Serialize};

/// One row: a counter's reading on one CPU.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub ts_uptime_us: u64,
    pub count: u64,
    pub time_enabled_ns: u64,
    pub time_running_ns: u64,
    pub cpu: u32,
    pub _pad: u32,
}

// SAFETY: repr(C), integers only, no padding (4 x u64, 2 x u32).
unsafe impl Record for Sample {}
const _: () = assert!(std::mem::size_of::<Sample>() == 40);

/// Counters by name: the table name, the events that implement it (the
/// first this machine has wins), and the kind of counter for notes.
const NAMED: &[(&str, &[&str], &str)] = &[
    ("dtlb_misses", &["dTLB-load-misses"], "data TLB load misses"),
    (
        "itlb_misses",
        &["iTLB-load-misses"],
        "instruction TLB load misses",
    ),
    (
        "tlb_flushes",
        &[
            // Intel (perf's and libpfm4's names alike).
            "tlb_flush.dtlb_thread",
            "tlb_flush.stlb_any",
            // AMD: perf's names, then libpfm4's.
            "ls_tlb_flush.all",
            "ls_tlb_flush",
            "TLB_FLUSHES:ALL",
        ],
        "TLB flushes",
    ),
    (
        "dtlb_walk_duration",
        &[
            // Cycles with a page walk under way: Skylake and later, then
            // Haswell and Broadwell (where walk_duration means that). On
            // Skylake walk_duration is an alias of walk_pending, a sum of
            // pending walks per cycle, so it is a last resort.
            "dtlb_load_misses.walk_active",
            "dtlb_load_misses.walk_duration",
            "dtlb_load_misses.walk_pending",
        ],
        "cycles spent in data TLB page walks",
    ),
    ("page_faults", &["page-faults"], "page faults"),
    (
        "context_switches",
        &["context-switches"],
        "context switches",
    ),
    ("cpu_migrations", &["cpu-migrations"], "task migrations"),
    ("minor_faults", &["minor-faults"], "minor page faults"),
    ("major_faults", &["major-faults"], "major page faults"),
];

const DEFAULT_COUNTERS: &[&str] = &[
    "dtlb_misses",
    "itlb_misses",
    "tlb_flushes",
    "dtlb_walk_duration",
    "page_faults",
    "context_switches",
];

settings! {
    /// `[probes.perf]` settings.
    pub struct Config {
        /// Counters by name: dtlb_misses, itlb_misses, tlb_flushes, dtlb_walk_duration,
        /// page_faults, context_switches, or any generic perf event name (see
        /// `kernmlops perf-list`). One table per counter; a counter this machine lacks
        /// is skipped with a note.
        pub counters: Vec<String> = DEFAULT_COUNTERS.iter().map(|s| (*s).to_owned()).collect(),
        /// Samples per second of every counter on every CPU.
        pub frequency_hz: f64 = 10.0,
        /// Extra counters, each a table name and a perf event, e.g.
        /// [[probes.perf.events]] name = "l2_misses" event = "cpu/event=0x24,umask=0x3f/"
        pub events: Vec<CustomEvent> = Vec::new(),
    }
    validate(c) {
        if !(c.frequency_hz > 0.0 && c.frequency_hz <= 10_000.0) {
            return Err(format!(
                "frequency_hz must be above 0 and at most 10000, not {}",
                c.frequency_hz
            ));
        }
        wanted(c).map(|_| ()).map_err(|e| e.message)
    }
}

/// A counter of `[[probes.perf.events]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomEvent {
    /// Its table's name (lowercase_snake_case).
    pub name: String,
    /// The perf event: a name, `pmu/terms/`, `system:tracepoint` or `rHEX`.
    pub event: String,
}

/// A counter to open: its table name and the event candidates.
struct Wanted {
    table: String,
    candidates: Vec<String>,
    what: String,
}

/// The snake_case table name of a perf event name: `dTLB-load-misses` ->
/// `dtlb_load_misses`.
fn table_name(event: &str) -> String {
    event
        .chars()
        .map(|c| match c {
            'A'..='Z' => c.to_ascii_lowercase(),
            'a'..='z' | '0'..='9' => c,
            _ => '_',
        })
        .collect()
}

fn wanted(config: &Config) -> Result<Vec<Wanted>> {
    let generic = events::generic_events();
    let mut out: Vec<Wanted> = Vec::new();
    for name in &config.counters {
        let w = if let Some((table, candidates, what)) = NAMED.iter().find(|n| n.0 == name) {
            Wanted {
                table: (*table).to_owned(),
                candidates: candidates.iter().map(|s| (*s).to_owned()).collect(),
                what: (*what).to_owned(),
            }
        } else if let Some(g) = generic
            .iter()
            .find(|g| g.name.eq_ignore_ascii_case(name) || g.aliases.iter().any(|a| a == name))
        {
            Wanted {
                table: table_name(&g.name),
                candidates: vec![g.name.clone()],
                what: g.description.clone(),
            }
        } else {
            let known: Vec<&str> = NAMED.iter().map(|n| n.0).collect();
            return Err(Error::new(format!(
                "perf: unknown counter {name:?} in counters; use one of {} or a perf generic event name (kernmlops perf-list), or add a [[probes.perf.events]] entry with a name and an event",
                known.join(", ")
            )));
        };
        out.push(w);
    }
    for e in &config.events {
        out.push(Wanted {
            table: e.name.clone(),
            candidates: vec![e.event.clone()],
            what: e.event.clone(),
        });
    }
    for (i, w) in out.iter().enumerate() {
        if out[..i].iter().any(|o| o.table == w.table) {
            return Err(Error::new(format!(
                "perf: counter {} is configured twice",
                w.table
            )));
        }
    }
    if out.is_empty() {
        return Err(Error::new(
            "perf: no counter configured (counters is empty and there is no [[probes.perf.events]])",
        ));
    }
    Ok(out)
}

/// Resolves an event from the generic names and sysfs, else from libpfm4's
/// event tables for this CPU (model-specific names sysfs does not list),
/// in process: the event as named for messages, and its attribute.
fn resolve_candidate(
    root: &Path,
    candidate: &str,
) -> std::result::Result<Option<(String, events::Resolved)>, String> {
    Ok(events::resolve_event(root, candidate)?.map(|r| (candidate.to_owned(), r)))
}

/// What the machine lacks when none of `candidates` resolves.
fn missing(candidates: &[String]) -> String {
    events::why_missing(candidates)
}

fn table_decl(name: &str, description: &str) -> TableDecl {
    table!(Sample => name, description, {
        ts_uptime_us [us]: "when the counter was read (CLOCK_BOOTTIME)",
        cpu: "CPU the counter counts on",
        count [count]: "events counted on this CPU since the probe started",
        time_enabled_ns [ns]: "time the counter was enabled since the probe started",
        time_running_ns [ns]: "time the counter was on the PMU (less than enabled when multiplexed)",
    })
}

/// Whom the counters count: every task, one thread, some threads, or a
/// cgroup.
enum Target {
    /// (pid argument, inherit) for each counter per CPU; the counts are
    /// summed.
    Tasks(Vec<(i32, bool)>),
    Cgroup(OwnedFd),
}

/// The cgroup v2 folder whose inode is `id`, under the cgroup2 mount.
fn cgroup_dir(id: u64) -> Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mounts = std::fs::read_to_string("/proc/mounts")
        .map_err(|e| Error::new(format!("perf: reading /proc/mounts: {e}")))?;
    let root = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(2) == Some("cgroup2"))
        .and_then(|l| l.split_whitespace().nth(1))
        .ok_or_else(|| Error::new("perf: --cgroup given but no cgroup v2 is mounted"))?;
    let mut stack = vec![PathBuf::from(root)];
    while let Some(dir) = stack.pop() {
        if std::fs::metadata(&dir).is_ok_and(|m| m.ino() == id) {
            return Ok(dir);
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.filter_map(std::result::Result::ok) {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
    }
    Err(Error::new(format!(
        "perf: no cgroup v2 folder with id {id} under {root}"
    )))
}

fn target(args: &StartArgs) -> Result<Target> {
    if args.filter_cgroup_id != 0 {
        let dir = cgroup_dir(args.filter_cgroup_id)?;
        let f = std::fs::File::open(&dir)
            .map_err(|e| Error::new(format!("perf: opening {}: {e}", dir.display())))?;
        return Ok(Target::Cgroup(f.into()));
    }
    if args.filter_pid != 0 {
        let pid = i32::try_from(args.filter_pid)
            .map_err(|_| Error::new(format!("perf: pid {} out of range", args.filter_pid)))?;
        return Ok(Target::Tasks(vec![(pid, false)]));
    }
    if args.filter_tgid != 0 {
        let dir = format!("/proc/{}/task", args.filter_tgid);
        let threads: Vec<(i32, bool)> = std::fs::read_dir(&dir)
            .map_err(|e| Error::new(format!("perf: --tgid {}: {dir}: {e}", args.filter_tgid)))?
            .filter_map(std::result::Result::ok)
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .map(|tid| (tid, true))
            .collect();
        return Ok(Target::Tasks(threads));
    }
    Ok(Target::Tasks(vec![(-1, false)]))
}

/// An open counter: one descriptor per CPU and target task.
struct Counter {
    per_cpu: Vec<(u32, Vec<OwnedFd>)>,
}

impl Counter {
    fn open(spec: &EventSpec, cpus: &[u32], target: &Target) -> std::io::Result<Self> {
        let mut per_cpu = Vec::with_capacity(cpus.len());
        for &cpu in cpus {
            let cpu_arg = i32::try_from(cpu).map_err(std::io::Error::other)?;
            let fds = match target {
                Target::Tasks(tasks) => tasks
                    .iter()
                    .map(|&(pid, inherit)| events::open_counter(spec, pid, cpu_arg, inherit, 0))
                    .collect::<std::io::Result<Vec<_>>>()?,
                Target::Cgroup(fd) => vec![events::open_counter(
                    spec,
                    fd.as_raw_fd(),
                    cpu_arg,
                    false,
                    events::PERF_FLAG_PID_CGROUP,
                )?],
            };
            per_cpu.push((cpu, fds));
        }
        Ok(Self { per_cpu })
    }
}

/// Reads every counter once into `out[i]` (one batch per counter).
fn sample(counters: &[Counter], out: &mut [Batch]) -> Result<()> {
    for (counter, batch) in counters.iter().zip(out.iter_mut()) {
        for (cpu, fds) in &counter.per_cpu {
            let mut sum = Reading::default();
            for fd in fds {
                let r = events::read_counter(fd).map_err(|e| {
                    Error::new(format!("perf: reading a counter on CPU {cpu}: {e}"))
                })?;
                sum.count = sum.count.wrapping_add(r.count);
                sum.time_enabled_ns = sum.time_enabled_ns.wrapping_add(r.time_enabled_ns);
                sum.time_running_ns = sum.time_running_ns.wrapping_add(r.time_running_ns);
            }
            let row = Sample {
                ts_uptime_us: uptime_us(),
                count: sum.count,
                time_enabled_ns: sum.time_enabled_ns,
                time_running_ns: sum.time_running_ns,
                cpu: *cpu,
                _pad: 0,
            };
            batch.push_record(&row);
        }
    }
    Ok(())
}

/// The running probe.
pub struct Perf {
    tables: Vec<TableDecl>,
    notes: Vec<String>,
    counters: Vec<Counter>,
    period: Duration,
    start: Instant,
    /// Index of the next sample since `start`.
    next: u64,
    /// Rows taken but not yet handed to the host (the final sample at stop).
    pending: Vec<Batch>,
}

impl Perf {
    fn open(config: &Config, args: &StartArgs, root: &Path) -> Result<Self> {
        let cpus = events::online_cpus()
            .map_err(|e| Error::new(format!("perf: reading the online CPUs: {e}")))?;
        let target = target(args)?;
        let mut tables = Vec::new();
        let mut notes = Vec::new();
        let mut counters = Vec::new();
        for w in wanted(config)? {
            let mut found = None;
            for candidate in &w.candidates {
                found = resolve_candidate(root, candidate)
                    .map_err(|e| Error::new(format!("perf: counter {}: {e}", w.table)))?;
                if found.is_some() {
                    break;
                }
            }
            let Some((event, resolved)) = found else {
                notes.push(format!(
                    "PMU counter {} ({}) is not supported on this machine: {}: skipped (if the CPU has an equivalent, add a [[probes.perf.events]] entry with an event from `kernmlops perf-list`)",
                    w.table,
                    w.what,
                    missing(&w.candidates),
                ));
                continue;
            };
            let kind = match resolved.kind {
                "software" => "software counter",
                "pmu" | "raw" => "PMU counter",
                "tracepoint" => "tracepoint counter",
                _ => "hardware counter",
            };
            match Counter::open(&resolved.spec, &cpus, &target) {
                Ok(c) => {
                    tables.push(table_decl(
                        &w.table,
                        &format!(
                            "{} per CPU: {event} ({}, {})",
                            w.what, resolved.source, resolved.spec
                        ),
                    ));
                    counters.push(c);
                }
                Err(e) if events::is_unsupported(&e) => notes.push(format!(
                    "{kind} {} ({event}) is not supported on this machine: skipped",
                    w.table
                )),
                Err(e) => {
                    return Err(Error::new(format!(
                        "perf: opening counter {} ({event}, {}): {e}",
                        w.table, resolved.spec
                    )))
                }
            }
        }
        if counters.is_empty() {
            return Err(Error::new(format!(
                "perf: none of the configured counters can be counted here: {}",
                notes.join("; ")
            )));
        }
        let period = Duration::from_secs_f64(1.0 / config.frequency_hz);
        let mut probe = Self {
            tables,
            notes,
            counters,
            period,
            start: Instant::now(),
            next: 1,
            pending: Vec::new(),
        };
        // The first sample, at the start: the baseline of every count.
        let mut first = probe.empty_buffers();
        sample(&probe.counters, &mut first)?;
        probe.pending = first;
        Ok(probe)
    }

    /// When sample number `next` is due.
    fn due(&self) -> Option<Instant> {
        let offset = self.period.as_secs_f64() * self.next as f64;
        self.start
            .checked_add(Duration::try_from_secs_f64(offset).ok()?)
    }

    fn empty_buffers(&self) -> Vec<Batch> {
        self.counters.iter().map(|_| Batch::default()).collect()
    }
}

impl ProbeImpl for Perf {
    const NAME: &'static str = "perf";
    type Settings = Config;

    fn decl() -> ProbeDecl {
        let tables = DEFAULT_COUNTERS
            .iter()
            .filter_map(|name| NAMED.iter().find(|n| n.0 == *name))
            .map(|(table, candidates, what)| {
                table_decl(
                    table,
                    &format!("{what} per CPU: {}", candidates.join(" or ")),
                )
            })
            .collect::<Vec<_>>();
        ProbeDecl {
            name: Self::NAME.into(),
            description: "Performance counters per CPU, sampled: cumulative count with time enabled and running (tables: one per configured counter)".into(),
            tables: tables.into(),
        }
    }

    fn start(args: &StartArgs, config: Config) -> Result<Self> {
        Self::open(&config, args, Path::new(events::PMU_ROOT))
    }

    fn drain(&mut self, timeout: Duration, batches: &mut [Batch]) -> Result<()> {
        if batches.len() != self.tables.len() {
            return Err(Error::new(format!(
                "perf: host passed {} batches for {} tables",
                batches.len(),
                self.tables.len()
            )));
        }
        let mut taken = std::mem::take(&mut self.pending);
        if !self.counters.is_empty() {
            if taken.is_empty() {
                taken = self.empty_buffers();
            }
            let deadline = Instant::now() + timeout;
            while let Some(due) = self.due() {
                if due > deadline {
                    // Sleep out the rest of the timeout, as the host expects
                    // (a stop cuts it short).
                    let now = Instant::now();
                    if deadline > now {
                        nap(deadline - now);
                    }
                    break;
                }
                let now = Instant::now();
                if due > now && !nap(due - now) {
                    // Woken for a stop: the sample is not due yet.
                    break;
                }
                sample(&self.counters, &mut taken)?;
                // After a stall, skip the samples that are already late.
                let elapsed = self.start.elapsed().as_secs_f64();
                let behind = (elapsed / self.period.as_secs_f64()) as u64;
                self.next = (self.next + 1).max(behind + 1);
            }
        }
        for (sampled, batch) in taken.iter().zip(batches.iter_mut()) {
            batch.data.extend_from_slice(&sampled.data);
            batch.records += sampled.records;
        }
        Ok(())
    }

    fn stop(&mut self) -> Result<()> {
        if self.counters.is_empty() {
            return Ok(());
        }
        // A last sample, so the rows end at the stop, then close the counters.
        let mut last = self.empty_buffers();
        let r = sample(&self.counters, &mut last);
        self.pending = last;
        self.counters.clear();
        r
    }

    fn tables(&self) -> Vec<TableDecl> {
        self.tables.clone()
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }
}

export_plugin! {
    description: "Performance counters per CPU: TLB misses and flushes, page walks, page faults, context switches, or any perf event",
    probes: [Perf],
}

#[cfg(test)]
mod tests {
    use kernmlops_plugin_sdk::settings::parse;

    use super::*;

    fn parse_config(json: &str) -> Result<Config> {
        parse::<Config>("[probes.perf]", json)
    }

    #[test]
    fn shown_defaults_are_the_used_ones() {
        kernmlops_plugin_testing::check_settings_defaults::<Config>("[probes.perf]");
    }

    #[test]
    fn settings_are_checked() {
        assert!(parse_config("{}").is_ok());
        let e = parse_config(r#"{"countrs": []}"#).expect_err("unknown key");
        assert!(e.message.contains("countrs"), "{e}");
        assert!(parse_config(r#"{"frequency_hz": 0}"#).is_err());
        assert!(parse_config(r#"{"counters": ["nonsense"]}"#).is_err());
        assert!(parse_config(r#"{"counters": ["page_faults", "page_faults"]}"#).is_err());
        let c = parse_config(
            r#"{"counters": ["page_faults", "cpu-migrations"], "frequency_hz": 100,
                "events": [{"name": "my_table", "event": "cpu/event=0x08,umask=0x20/"}]}"#,
        )
        .expect("valid");
        let w = wanted(&c).expect("known counters");
        let tables: Vec<&str> = w.iter().map(|w| w.table.as_str()).collect();
        assert_eq!(tables, ["page_faults", "cpu_migrations", "my_table"]);
    }

    #[test]
    fn table_names_are_snake_case() {
        assert_eq!(table_name("dTLB-load-misses"), "dtlb_load_misses");
        assert_eq!(table_name("L1-dcache-loads"), "l1_dcache_loads");
    }

    #[test]
    fn records_are_packed_little_endian() {
        let s = Sample {
            ts_uptime_us: 1,
            count: 2,
            time_enabled_ns: 3,
            time_running_ns: 4,
            cpu: 5,
            _pad: 0,
        };
        let mut batch = Batch::default();
        batch.push_record(&s);
        assert_eq!(batch.data.len(), 40);
        assert_eq!(batch.data[std::mem::offset_of!(Sample, cpu)], 5);
        assert_eq!(batch.data[std::mem::offset_of!(Sample, count)], 2);
        assert_eq!(batch.records::<Sample>(), vec![s]);
    }
}
