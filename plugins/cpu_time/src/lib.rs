//! cpu_time: on-CPU time per process (tgid) per interval, accumulated in
//! the kernel by a `tp_btf/sched_switch` program that adds each run to its
//! process's total in a hash map: no record per context switch, so its cost
//! per switch is a map lookup and an atomic add. User space reads the
//! totals (one batched map read) at each interval's end, adds the part of
//! the runs still going on each CPU, and makes one row per process that
//! ran, plus one row for the idle tasks (`tgid` 0, `comm` `idle`).
//!
//! This is the activity the host splits energy by (`--power`): it starts
//! this probe itself with `interval = "0s"` (a row per process at every
//! drain) and drains it at each power slot's end. Processes shorter than an
//! interval are counted: their time stays in the map after they exit, and
//! an entry is removed only once its process is gone and it has not grown
//! for two intervals.

use std::{
    collections::HashMap,
    os::fd::AsFd,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use kernmlops_plugin_bpf::{
    bpf_probe, export_plugin,
    libbpf_rs::{libbpf_sys, MapCore, MapFlags, MapHandle, MapType},
    sdk::{
        record::{c_chars, set_c_chars},
        sys, BatchExt, HumanDuration, ProbeDecl, ProbeImpl, Record, StartArgs, TableDecl,
    },
    settings, Batch, BpfHooks, BpfProbe, Error, LoadContext, Open, Result,
};

/// One row of the `cpu_time` table, from `cpu_time.h`.
pub type Event = skel::types::cpu_time_event;
type Value = skel::types::cpu_time_value;
type CpuNow = skel::types::cpu_now;

/// `cpu_now.tgid` of a CPU running a task the filters leave out.
const UNRECORDED: u32 = u32::MAX;

settings! {
    /// `[probes.cpu_time]` settings.
    pub struct Settings {
        /// Length of the interval each row covers: "1s", "500ms"; "0s" makes
        /// a row per process at every drain (what energy attribution uses).
        pub interval: HumanDuration = HumanDuration::from_secs(1),
        /// Processes tracked at once (entries of the kernel's map); a run
        /// that finds it full is counted as a lost event.
        pub max_processes: u32 = 16384,
    }
    validate(s) {
        if s.max_processes < 64 {
            return Err(format!("max_processes: {} is below the minimum, 64", s.max_processes));
        }
        if !s.interval.get().is_zero() && s.interval.get() < Duration::from_millis(10) {
            return Err(format!("interval: {} is shorter than 10ms (0s: every drain)", s.interval));
        }
        Ok(())
    }
}

bpf_probe! {
    probe: CpuTimeBpf,
    name: "cpu_time",
    description: "On-CPU time per process per interval, from the scheduler (sched_switch), with the idle tasks' time",
    settings: Settings,
    hooks: custom,
    tables: [
        cpu_time(cpu_time_ring, cpu_time_event, rate = 1_000):
            "One row per process that ran in an interval, and one for the idle tasks (tgid 0)" {
            ts_uptime_us [us]: "end of the interval (CLOCK_BOOTTIME)",
            slot_start_us [us]: "start of the interval (CLOCK_BOOTTIME)",
            tgid: "process id; 0 for the idle tasks",
            comm: "the process's name (its main thread's comm); idle for tgid 0",
            cgroup_id: "cgroup v2 id (inode number of its folder), 0 when unknown",
            cgroup: "cgroup v2 path, like /system.slice/foo.service (cut at 127 bytes)",
            cpu_time_us [us]: "time the process's threads were on a CPU in the interval",
        },
    ],
}

/// The maps user space reads, created here and handed to the BPF object
/// before load (`reuse_fd`), since the SDK keeps the skeleton's own.
struct Maps {
    tgid_time: MapHandle,
    cpu_now: MapHandle,
}

/// The BPF side's hooks: they create the maps user space reads.
#[derive(Default)]
pub struct CpuTimeBpf {
    maps: Option<Maps>,
}

fn map_error(what: &str) -> impl Fn(kernmlops_plugin_bpf::libbpf_rs::Error) -> Error + '_ {
    move |e| Error::new(format!("{what}: {e}"))
}

impl BpfHooks for CpuTimeBpf {
    fn before_load(
        &mut self,
        open: &mut Open<Self>,
        cx: &mut LoadContext<'_, Settings>,
    ) -> Result<()> {
        let opts = libbpf_sys::bpf_map_create_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
            ..Default::default()
        };
        let tgid_time = MapHandle::create(
            MapType::Hash,
            Some("tgid_time"),
            4,
            std::mem::size_of::<Value>() as u32,
            cx.settings.max_processes,
            &opts,
        )
        .map_err(map_error("creating map tgid_time"))?;
        let cpu_now = MapHandle::create(
            MapType::PercpuArray,
            Some("cpu_now"),
            4,
            std::mem::size_of::<CpuNow>() as u32,
            1,
            &opts,
        )
        .map_err(map_error("creating map cpu_now"))?;
        open.maps
            .tgid_time
            .reuse_fd(tgid_time.as_fd())
            .map_err(map_error("handing map tgid_time to the program"))?;
        open.maps
            .cpu_now
            .reuse_fd(cpu_now.as_fd())
            .map_err(map_error("handing map cpu_now to the program"))?;
        self.maps = Some(Maps { tgid_time, cpu_now });
        Ok(())
    }
}

// SAFETY: repr(C) structs generated from cpu_time.h, integers and char
// arrays only, every gap filled by an explicit padding field.
unsafe impl Record for Value {}
// SAFETY: as above.
unsafe impl Record for CpuNow {}

/// A record of type `R` from the start of `bytes`, if long enough.
fn read_record<R: Record>(bytes: &[u8]) -> Option<R> {
    if bytes.len() < std::mem::size_of::<R>() {
        return None;
    }
    // SAFETY: at least size_of::<R>() bytes, every bit pattern is a valid
    // `R` (the `Record` contract), and read_unaligned needs no alignment.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<R>()) })
}

/// CLOCK_BOOTTIME in nanoseconds, `bpf_ktime_get_boot_ns`'s clock.
fn boottime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// What one process has accumulated, as last read.
#[derive(Debug, Clone)]
struct Seen {
    /// Its total, in ns, up to the last read (in-progress runs included).
    total_ns: u64,
    /// Reads in a row in which it did not grow.
    idle_reads: u32,
    comm: [i8; 16],
    cgroup_id: u64,
}

/// The probe: the BPF program plus the reading of its maps.
pub struct CpuTime {
    inner: BpfProbe<CpuTimeBpf>,
    interval: Duration,
    next_due: Instant,
    last_us: u64,
    seen: HashMap<u32, Seen>,
    cgroups: Cgroups,
    notes: Vec<String>,
}

/// The on-CPU time per key (tgid) from the map's totals and the runs going
/// on now (`running`: per CPU, since when and under which key), at `now_ns`.
pub fn totals(
    map: impl IntoIterator<Item = (u32, u64)>,
    running: &[(u64, u32)],
    now_ns: u64,
) -> HashMap<u32, u64> {
    let mut out: HashMap<u32, u64> = map.into_iter().collect();
    for &(since, key) in running {
        if since != 0 && key != UNRECORDED && now_ns > since {
            *out.entry(key).or_default() += now_ns - since;
        }
    }
    out
}

impl CpuTime {
    /// Reads the totals and appends one row per process that ran since the
    /// last read, and the idle row.
    fn snapshot(&mut self, batch: &mut Batch) -> Result<()> {
        let maps = self
            .inner
            .hooks()
            .maps
            .as_ref()
            .ok_or_else(|| Error::new("the probe's maps were not created"))?;
        let mut described: HashMap<u32, Value> = HashMap::new();
        let entries = maps
            .tgid_time
            .lookup_batch(1024, MapFlags::ANY, MapFlags::ANY)
            .map_err(map_error("reading map tgid_time"))?;
        for (k, v) in entries {
            if let (Some(k), Some(v)) = (read_record::<u32>(&k), read_record::<Value>(&v)) {
                described.insert(k, v);
            }
        }
        // The map first, then who runs now: a switch in between is counted
        // at the next read, never twice.
        let running: Vec<(u64, u32)> = maps
            .cpu_now
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_error("reading map cpu_now"))?
            .unwrap_or_default()
            .iter()
            .filter_map(|b| read_record::<CpuNow>(b))
            .map(|c| (c.since_ns, c.tgid))
            .collect();
        let now_ns = boottime_ns();
        let now_us = now_ns / 1000;
        let totals = totals(
            described.iter().map(|(&k, v)| (k, v.cpu_ns)),
            &running,
            now_ns,
        );
        let running_keys: Vec<u32> = running.iter().map(|r| r.1).collect();
        self.cgroups.learn(described.values().map(|v| v.cgroup_id));
        let mut gone = Vec::new();
        let mut keys: Vec<u32> = totals.keys().copied().collect();
        keys.sort_unstable();
        if !keys.contains(&0) {
            keys.insert(0, 0);
        }
        for key in keys {
            let total = totals.get(&key).copied().unwrap_or(0);
            let value = described.get(&key);
            let seen = self.seen.entry(key).or_insert_with(|| Seen {
                total_ns: 0,
                idle_reads: 0,
                comm: [0; 16],
                cgroup_id: 0,
            });
            if let Some(v) = value {
                seen.comm = v.comm;
                seen.cgroup_id = v.cgroup_id;
            } else if key != 0 && seen.comm[0] == 0 {
                // Running since before its first switch: not in the map yet.
                let comm = std::fs::read(format!("/proc/{key}/comm")).unwrap_or_default();
                set_c_chars(&mut seen.comm, comm.trim_ascii_end());
            }
            // Totals only grow; a read that raced a switch is made good by
            // the next one.
            let delta_us = (total / 1000).saturating_sub(seen.total_ns / 1000);
            seen.total_ns = seen.total_ns.max(total);
            if delta_us == 0 && key != 0 {
                seen.idle_reads += 1;
                if seen.idle_reads >= 2
                    && value.is_some()
                    && !running_keys.contains(&key)
                    && !Path::new(&format!("/proc/{key}")).exists()
                {
                    gone.push(key);
                }
                continue;
            }
            seen.idle_reads = 0;
            let mut e = Event {
                ts_uptime_us: now_us,
                slot_start_us: self.last_us,
                cpu_time_us: delta_us,
                cgroup_id: seen.cgroup_id,
                tgid: key,
                ..Default::default()
            };
            if key == 0 {
                set_c_chars(&mut e.comm, b"idle");
            } else {
                e.comm = seen.comm;
                set_c_chars(&mut e.cgroup, self.cgroups.path(seen.cgroup_id).as_bytes());
            }
            batch.push_record(&e);
        }
        // Processes gone, whose totals stopped growing two reads ago: their
        // last run was counted.
        for key in gone {
            let _ = maps.tgid_time.delete(&key.to_ne_bytes());
            self.seen.remove(&key);
        }
        self.last_us = now_us;
        Ok(())
    }
}

impl ProbeImpl for CpuTime {
    const NAME: &'static str = "cpu_time";
    type Settings = Settings;

    fn decl() -> ProbeDecl {
        BpfProbe::<CpuTimeBpf>::decl()
    }

    fn start(args: &StartArgs, settings: Settings) -> Result<Self> {
        let interval = settings.interval.get();
        let inner = BpfProbe::<CpuTimeBpf>::start(args, settings)?;
        let started_us = sys::clock::uptime_us();
        kick_every_cpu();
        let mut notes = inner.notes();
        if !args.include_self && args.self_tgid != 0 {
            notes.push(format!(
                "the collector's own process ({}) is left out: its CPU time counts as neither busy nor idle",
                args.self_tgid
            ));
        }
        Ok(Self {
            inner,
            interval,
            next_due: Instant::now() + interval,
            last_us: started_us,
            seen: HashMap::new(),
            cgroups: Cgroups::new(),
            notes: notes
                .into_iter()
                .filter(|n| !n.starts_with("the collector's own process") || !args.include_self)
                .collect(),
        })
    }

    fn drain(&mut self, timeout: Duration, batches: &mut [Batch]) -> Result<()> {
        // The ring stays empty; this takes the loss count (map full).
        self.inner.drain(Duration::ZERO, batches)?;
        let [batch] = batches else {
            return Err(Error::new(format!(
                "host passed {} batches for 1 table",
                batches.len()
            )));
        };
        if !self.interval.is_zero() {
            let now = Instant::now();
            if now < self.next_due {
                let wait = self.next_due - now;
                if wait > timeout {
                    std::thread::sleep(timeout);
                    return Ok(());
                }
                std::thread::sleep(wait);
            }
            self.next_due += self.interval;
            let now = Instant::now();
            if self.next_due + self.interval < now {
                self.next_due = now + self.interval;
            }
        }
        self.snapshot(batch)
    }

    fn stop(&mut self) -> Result<()> {
        self.inner.stop()
    }

    fn tables(&self) -> Vec<TableDecl> {
        self.inner.tables()
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    fn bpf_stats(&self) -> Vec<kernmlops_plugin_bpf::sdk::api::BpfProgramStats> {
        self.inner.bpf_stats()
    }
}

/// Makes every online CPU switch once, right after attach, so the program
/// learns who runs on each CPU: a thread pinned to each sleeps a
/// millisecond. Best effort: a CPU it cannot reach starts on its next
/// switch.
fn kick_every_cpu() {
    let Ok(text) = std::fs::read_to_string("/sys/devices/system/cpu/online") else {
        return;
    };
    let cpus: Vec<usize> = text
        .trim()
        .split(',')
        .flat_map(|part| match part.split_once('-') {
            Some((a, b)) => match (a.parse::<usize>(), b.parse::<usize>()) {
                (Ok(a), Ok(b)) => (a..=b).collect(),
                _ => Vec::new(),
            },
            None => part.parse().into_iter().collect(),
        })
        .collect();
    let threads: Vec<_> = cpus
        .into_iter()
        .filter(|&cpu| cpu < libc::CPU_SETSIZE as usize)
        .filter_map(|cpu| {
            std::thread::Builder::new()
                .name("kml-cpu-kick".into())
                .spawn(move || {
                    // SAFETY: cpu_set_t is plain data; CPU_SET stays inside
                    // it (cpu < CPU_SETSIZE); sched_setaffinity(0) pins
                    // this thread only.
                    unsafe {
                        let mut set: libc::cpu_set_t = std::mem::zeroed();
                        libc::CPU_SET(cpu, &mut set);
                        libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                })
                .ok()
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

/// Cgroup v2 ids to paths (relative to the mount), from walks of the
/// hierarchy made only when an unknown id shows up; ids not found are not
/// searched again.
struct Cgroups {
    mount: Option<PathBuf>,
    paths: HashMap<u64, String>,
    missing: std::collections::HashSet<u64>,
}

impl Cgroups {
    fn new() -> Self {
        let mut c = Self {
            mount: sys::cgroup::cgroup2_mount(),
            paths: HashMap::new(),
            missing: Default::default(),
        };
        c.walk();
        c
    }

    fn walk(&mut self) {
        use std::os::unix::fs::MetadataExt;
        let Some(mount) = self.mount.clone() else {
            return;
        };
        let mut stack = vec![mount.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue;
            };
            let rel = dir.strip_prefix(&mount).unwrap_or(Path::new(""));
            self.paths
                .insert(meta.ino(), format!("/{}", rel.to_string_lossy()));
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
        }
    }

    fn learn(&mut self, ids: impl IntoIterator<Item = u64>) {
        let unknown: Vec<u64> = ids
            .into_iter()
            .filter(|id| *id != 0 && !self.paths.contains_key(id) && !self.missing.contains(id))
            .collect();
        if unknown.is_empty() {
            return;
        }
        self.walk();
        for id in unknown {
            if !self.paths.contains_key(&id) {
                self.missing.insert(id);
            }
        }
    }

    fn path(&self, id: u64) -> &str {
        self.paths.get(&id).map_or("", String::as_str)
    }
}

/// The comm of a row, as text.
pub fn comm_of(e: &Event) -> String {
    String::from_utf8_lossy(&c_chars(&e.comm)).into_owned()
}

export_plugin! {
    description: "On-CPU time per process per interval, from the scheduler; what energy attribution splits energy by",
    probes: [CpuTime],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_tasks_are_credited_up_to_now() {
        let t = totals(
            [(0, 100), (7, 1_000)],
            &[(900, 7), (0, 9), (950, 0), (100, UNRECORDED), (2_000, 8)],
            1_000,
        );
        assert_eq!(t[&7], 1_100, "the map's total plus the run going on");
        assert_eq!(t[&0], 150, "idle counts like any key");
        assert!(
            !t.contains_key(&9),
            "a CPU with no switch yet credits nobody"
        );
        assert!(!t.contains_key(&UNRECORDED));
        assert!(!t.contains_key(&8), "a run starting after now adds nothing");
    }
}
