//! cpu_time: on-CPU time per process (tgid) per interval, accumulated in
//! the kernel by a `tp_btf/sched_switch` program, with no record per
//! context switch and no clock read: the scheduler's own task clock, just
//! stamped into the tasks being switched, gives each run's length. Each CPU
//! keeps, in its own slot of a per-CPU array, who runs since when, its idle
//! time and the time of the last process that ran on it; that time goes
//! into the process's total in a hash map only when another process runs
//! there. A CPU alternating between one process and idle touches no shared
//! map.
//!
//! At each interval's end user space wakes a thread pinned to every CPU,
//! so each CPU switches and the runs going on are counted up to then,
//! reads the totals (one batched map read) and the per-CPU slots, and makes
//! one row per process that ran, plus one row for the idle tasks (`tgid`
//! 0, `comm` `idle`). Times are the scheduler's task time, which leaves out
//! interrupt and steal time.

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Condvar, Mutex},
    time::{Duration, Instant},
};

use kernmlops_plugin_bpf::{
    bpf_probe, export_plugin,
    libbpf_rs::{MapCore, MapFlags},
    sdk::{
        record::{c_chars, set_c_chars},
        sys, BatchExt, HumanDuration, ProbeDecl, ProbeImpl, Record, Schedule, StartArgs, TableDecl,
    },
    settings, Batch, BpfHooks, BpfProbe, Error, LoadContext, Open, Result,
};

/// One row of the `cpu_time` table, from `cpu_time.h`.
pub type Event = skel::types::cpu_time_event;
type Value = skel::types::cpu_time_value;
type CpuNow = skel::types::cpu_now;

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
        cpu_time(from_maps, cpu_time_event):
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

/// The BPF side's hooks: they size the processes' map from the settings.
#[derive(Default)]
pub struct CpuTimeBpf;

fn map_error(what: &str) -> impl Fn(kernmlops_plugin_bpf::libbpf_rs::Error) -> Error + '_ {
    move |e| Error::new(format!("{what}: {e}"))
}

impl BpfHooks for CpuTimeBpf {
    fn before_load(
        &mut self,
        open: &mut Open<Self>,
        cx: &mut LoadContext<'_, Settings>,
    ) -> Result<()> {
        open.maps
            .tgid_time
            .set_max_entries(cx.settings.max_processes)
            .map_err(map_error("sizing map tgid_time"))
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
    /// When the next read is due (every drain with a zero interval).
    schedule: Schedule,
    last_us: u64,
    seen: HashMap<u32, Seen>,
    cgroups: sys::cgroup::CgroupPaths,
    kicker: Kicker,
    notes: Vec<String>,
    /// The last read, taken when the probe stopped (while its program still
    /// counted), for the next drain; `Some` from then on.
    last_read: Option<Batch>,
}

/// What one CPU's slot of `cpu_now` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuView {
    /// Who runs there now (0 idle).
    pub tgid: u32,
    /// The idle task's time there.
    pub idle_ns: u64,
    /// Processes (0: none) whose time the CPU keeps, not yet in the map.
    pub pending: [(u32, u64); 8],
}

impl From<CpuNow> for CpuView {
    fn from(c: CpuNow) -> Self {
        let mut pending = [(0, 0); 8];
        for (slot, (t, ns)) in pending
            .iter_mut()
            .zip(c.pending_tgid.iter().zip(&c.pending_ns))
        {
            *slot = (*t, *ns);
        }
        Self {
            tgid: c.tgid,
            idle_ns: c.idle_ns,
            pending,
        }
    }
}

/// The on-CPU time per key (tgid; 0 for idle) up to every CPU's last
/// switch: the map's totals, and each CPU's pending and idle time.
pub fn totals(map: impl IntoIterator<Item = (u32, u64)>, cpus: &[CpuView]) -> HashMap<u32, u64> {
    let mut out: HashMap<u32, u64> = map.into_iter().collect();
    for c in cpus {
        *out.entry(0).or_default() += c.idle_ns;
        for &(tgid, ns) in c.pending.iter().filter(|p| p.0 != 0) {
            *out.entry(tgid).or_default() += ns;
        }
    }
    out
}

impl CpuTime {
    /// Reads the totals and appends one row per process that ran since the
    /// last read, and the idle row.
    fn snapshot(&mut self, batch: &mut Batch) -> Result<()> {
        // Every CPU switches now, so what runs is counted up to here.
        self.kicker.kick();
        let maps = &self
            .inner
            .skel()
            .ok_or_else(|| Error::new("the probe's maps are gone (read after it was freed)"))?
            .maps;
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
        // The map first, then the CPUs: time moved from a CPU's pending
        // count into the map in between is counted at the next read, never
        // twice.
        let cpus: Vec<CpuView> = maps
            .cpu_now
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_error("reading map cpu_now"))?
            .unwrap_or_default()
            .iter()
            .filter_map(|b| read_record::<CpuNow>(b))
            .map(CpuView::from)
            .collect();
        let now_us = sys::clock::uptime_us();
        let totals = totals(described.iter().map(|(&k, v)| (k, v.cpu_ns)), &cpus);
        // Processes a CPU still holds time of, or runs.
        let running_keys: Vec<u32> = cpus
            .iter()
            .flat_map(|c| std::iter::once(c.tgid).chain(c.pending.iter().map(|p| p.0)))
            .collect();
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
        let kicker = Kicker::start();
        // The first switch on each CPU tells the program who runs there.
        kicker.kick();
        let started_us = sys::clock::uptime_us();
        let notes = inner.notes();
        Ok(Self {
            inner,
            schedule: Schedule::new(interval, interval),
            last_us: started_us,
            seen: HashMap::new(),
            cgroups: sys::cgroup::CgroupPaths::new(),
            kicker,
            notes,
            last_read: None,
        })
    }

    fn drain(&mut self, timeout: Duration, batches: &mut [Batch]) -> Result<()> {
        // The table has no ring: this takes the loss count (map full).
        self.inner.drain(Duration::ZERO, batches)?;
        let [batch] = batches else {
            return Err(Error::new(format!(
                "host passed {} batches for 1 table",
                batches.len()
            )));
        };
        if let Some(last) = &mut self.last_read {
            // Stopped: the read taken at the stop goes out once, nothing
            // after it (the detached program counts no more time).
            batch.data.extend_from_slice(&last.data);
            batch.records += last.records;
            last.data.clear();
            last.records = 0;
            return Ok(());
        }
        if self.schedule.wait(timeout) {
            self.snapshot(batch)?;
        }
        Ok(())
    }

    fn stop(&mut self) -> Result<()> {
        // The last slot is read before the program is detached, so it ends
        // at the stop with every CPU's time up to there.
        let mut last = Batch::default();
        let read = self.snapshot(&mut last);
        self.last_read = Some(last);
        self.inner.stop()?;
        read
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

/// One thread pinned to each online CPU (real-time priority where
/// allowed, so it preempts a busy CPU at once), woken together to make
/// every CPU switch.
struct Kicker {
    shared: Arc<KickState>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct KickState {
    /// (generation, threads that ran in it, quit)
    state: Mutex<(u64, usize, bool)>,
    wake: Condvar,
    done: Condvar,
}

impl Kicker {
    fn start() -> Self {
        let shared = Arc::new(KickState::default());
        let threads = online_cpus()
            .into_iter()
            .filter(|&cpu| cpu < libc::CPU_SETSIZE as usize)
            .filter_map(|cpu| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("kml-kick-{cpu}"))
                    .spawn(move || kick_thread(cpu, &shared))
                    .ok()
            })
            .collect();
        Self { shared, threads }
    }

    /// Wakes every thread and waits (at most 50 ms) until each has run.
    fn kick(&self) {
        let Ok(mut s) = self.shared.state.lock() else {
            return;
        };
        s.0 += 1;
        s.1 = 0;
        self.shared.wake.notify_all();
        let deadline = Instant::now() + Duration::from_millis(50);
        while s.1 < self.threads.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s = match self.shared.done.wait_timeout(s, left) {
                Ok((s, _)) => s,
                Err(_) => return,
            };
        }
    }
}

impl Drop for Kicker {
    fn drop(&mut self) {
        if let Ok(mut s) = self.shared.state.lock() {
            s.2 = true;
        }
        self.shared.wake.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn kick_thread(cpu: usize, shared: &KickState) {
    // SAFETY: cpu_set_t is plain data; CPU_SET stays inside it (cpu <
    // CPU_SETSIZE); sched_setaffinity and sched_setscheduler with pid 0
    // change this thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
        let param = libc::sched_param { sched_priority: 1 };
        libc::sched_setscheduler(0, libc::SCHED_FIFO, &param);
    }
    let mut seen = 0;
    let Ok(mut s) = shared.state.lock() else {
        return;
    };
    loop {
        while s.0 == seen && !s.2 {
            s = match shared.wake.wait(s) {
                Ok(s) => s,
                Err(_) => return,
            };
        }
        if s.2 {
            return;
        }
        seen = s.0;
        s.1 += 1;
        shared.done.notify_one();
    }
}

/// The online CPUs, from `/sys/devices/system/cpu/online` (`0-3,5`).
fn online_cpus() -> Vec<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    text.trim()
        .split(',')
        .flat_map(|part| match part.split_once('-') {
            Some((a, b)) => match (a.parse::<usize>(), b.parse::<usize>()) {
                (Ok(a), Ok(b)) => (a..=b).collect(),
                _ => Vec::new(),
            },
            None => part.parse().into_iter().collect(),
        })
        .collect()
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
    fn pending_and_idle_time_are_added_to_the_totals() {
        let cpu = |tgid, idle_ns, pending: &[(u32, u64)]| {
            let mut c = CpuView {
                tgid,
                idle_ns,
                pending: [(0, 0); 8],
            };
            c.pending[..pending.len()].copy_from_slice(pending);
            c
        };
        let t = totals(
            [(7, 1_000), (5, 10)],
            &[
                cpu(7, 40, &[(7, 30), (8, 2)]),
                cpu(0, 60, &[(5, 20)]),
                cpu(9, 0, &[]),
            ],
        );
        assert_eq!(t[&7], 1_030, "the map's total and the pending time");
        assert_eq!(t[&5], 30, "pending on another CPU");
        assert_eq!(t[&8], 2, "pending only");
        assert_eq!(t[&0], 100, "idle: each CPU's idle time");
        assert!(
            !t.contains_key(&9),
            "running since the last switch: not yet"
        );
    }
}
