//! Running a declared BPF probe: open the skeleton, set the common tunables
//! and ring sizes, run the probe's before-load hook, load with libbpf's log
//! captured (the verifier's complaint ends up in the error), attach every
//! program that loads (each checked), then drain the ring buffers into the
//! host's batches, fix up records, and report lost and malformed records
//! per table.

use std::{
    mem::MaybeUninit,
    ptr::null_mut,
    sync::{
        atomic::{AtomicPtr, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use kernmlops_plugin_sdk::{
    api::{BpfProgramStats, ErrorKind},
    Batch, Error, ProbeDecl, ProbeImpl, Result, StartArgs, TableDecl,
};
use libbpf_rs::{
    skel::{OpenSkel, Skel, SkelBuilder},
    Link, MapCore, MapFlags, MapHandle, MapType, OpenObject, PrintLevel, RingBuffer,
    RingBufferBuilder,
};

use crate::{
    ring_bytes_for,
    stage::{self, Stages},
    wakeup_bytes, wakeup_check_every, BpfHooks, Common, Features, LoadContext, Loaded, Records,
    MAX_TABLES,
};

/// libbpf's messages for the current load, kept to put the verifier log in
/// the error. Each plugin links its own libbpf, so this is per plugin.
static LIBBPF_LOG: Mutex<String> = Mutex::new(String::new());
const LOG_KEEP: usize = 64 * 1024;

fn capture_libbpf_log(_level: PrintLevel, msg: String) {
    if let Ok(mut log) = LIBBPF_LOG.lock() {
        if log.len() + msg.len() > LOG_KEEP {
            let cut = (log.len() + msg.len())
                .saturating_sub(LOG_KEEP)
                .min(log.len());
            let cut = (cut..=log.len())
                .find(|&i| log.is_char_boundary(i))
                .unwrap_or(0);
            log.drain(..cut);
        }
        log.push_str(&msg);
    }
}

/// Turns a libbpf error into a message that says what to do, with the tail
/// of libbpf's log (the verifier's complaint) when there is one, and the
/// kind the host acts on.
fn explain(what: &str, e: &libbpf_rs::Error) -> Error {
    // SAFETY: geteuid has no preconditions.
    let is_root = unsafe { libc::geteuid() } == 0;
    let log = LIBBPF_LOG.lock().map(|l| l.clone()).unwrap_or_default();
    let (kind, headline) = if log.contains("PROG LOAD LOG") {
        // A verifier rejection comes back as EACCES, which reads like a
        // privilege problem: say what it is.
        (
            ErrorKind::VERIFIER,
            format!("{what}: the kernel's BPF verifier rejected a program ({e})"),
        )
    } else if e.kind() == libbpf_rs::ErrorKind::PermissionDenied {
        if is_root {
            // As root, EPERM means the kernel refuses the feature, not us.
            (ErrorKind::UNSUPPORTED, format!("{what}: {e:#}"))
        } else {
            (
                ErrorKind::PERMISSION,
                format!("{what}: {e:#} (needs root, or CAP_BPF and CAP_PERFMON; run with sudo)"),
            )
        }
    } else {
        (ErrorKind::OTHER, format!("{what}: {e:#}"))
    };
    let tail: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = &tail[tail.len().saturating_sub(12)..];
    if tail.is_empty() {
        Error::of(kind, headline)
    } else {
        Error::of(
            kind,
            format!("{headline}\nlibbpf log:\n  {}", tail.join("\n  ")),
        )
    }
}

/// Where a ring's callback appends: the batch of its table while `drain`
/// runs (null otherwise), and the count of records of the wrong size.
struct Slot {
    batch: AtomicPtr<Batch>,
    record_size: usize,
    malformed: AtomicU64,
}

/// A loaded and attached probe with its ring buffers.
///
/// Field order is drop order: the ring buffer and links go before the
/// skeleton, and the skeleton before the storage it borrows.
pub struct BpfProbe<P: BpfHooks> {
    ring: Option<RingBuffer<'static>>,
    links: Vec<Link>,
    lost: MapHandle,
    /// The per-CPU staging of a `KML_STAGED` program.
    stages: Option<Stages>,
    slots: Vec<Arc<Slot>>,
    skel: Option<Loaded<P>>,
    storage: *mut MaybeUninit<OpenObject>,
    hooks: P,
    tables: Vec<TableDecl>,
    notes: Vec<String>,
    /// The start arguments, until the initial-records hook has run at the
    /// first drain.
    initial_args: Option<StartArgs>,
}

// SAFETY: a BpfProbe owns everything it points to (libbpf objects, the leaked
// storage); none of it is tied to the thread that created it, and `&mut self`
// methods keep use to one thread at a time.
unsafe impl<P: BpfHooks> Send for BpfProbe<P> {}

impl<P: BpfHooks> BpfProbe<P> {
    /// The probe's hooks and state.
    pub fn hooks(&self) -> &P {
        &self.hooks
    }

    /// The loaded skeleton, until the probe is freed: a probe whose rows
    /// come from maps reads (and prunes) the skeleton's own maps here, sized
    /// in `before_load` (`set_max_entries`), instead of creating maps of its
    /// own and handing them to the object.
    pub fn skel(&self) -> Option<&Loaded<P>> {
        self.skel.as_ref()
    }

    /// Opens, configures and loads the skeleton in `storage`, running the
    /// before-load hook; returns the loaded skeleton, the notes, and whether
    /// it stages records (`KML_STAGED`, where the kernel lets the host send
    /// a CPU's partial batch).
    fn load(
        hooks: &mut P,
        storage: &'static mut MaybeUninit<OpenObject>,
        args: &StartArgs,
        settings: &P::Settings,
        tables: &[TableDecl],
    ) -> Result<(Loaded<P>, Vec<String>, bool)> {
        let mut open = P::Builder::default()
            .open(storage)
            .map_err(|e| explain(&format!("opening {}", P::NAME), &e))?;
        let mut common = Common {
            filter_tgid: args.filter_tgid,
            filter_pid: args.filter_pid,
            filter_cgroup_id: args.filter_cgroup_id,
            filter_cgroup_descendants: args.filter_cgroup_descendants,
            self_tgid: if args.include_self { 0 } else { args.self_tgid },
            wakeup_bytes: [0; MAX_TABLES],
            wakeup_mask: [0; MAX_TABLES],
            stage_on: true,
            stage_limit: [0; MAX_TABLES],
        };
        // Staged output (KML_STAGED): one stage per table, where the host
        // can send a quiet CPU's partial batch.
        let stage_entries = u32::try_from(tables.len().max(1)).unwrap_or(1);
        let mut stage_bytes = None;
        for mut map in open.open_object_mut().maps_mut() {
            let name = map.name().to_str().unwrap_or_default();
            if name == stage::HEAD_MAP || name == stage::DATA_MAP {
                if name == stage::DATA_MAP {
                    stage_bytes = Some(u64::from(map.value_size()));
                }
                map.set_max_entries(stage_entries)
                    .map_err(|e| explain(&format!("sizing {name}"), &e))?;
            }
        }
        let staged = stage_bytes.is_some();
        let cpus = libbpf_rs::num_possible_cpus().unwrap_or(1) as u64;
        let staged_ring = stage_bytes.map_or(0, |b| stage::ring_bytes_for_stages(cpus, b));
        let mut notes = Vec::new();
        for (i, (ring, table)) in P::RINGS.iter().zip(tables).enumerate().take(MAX_TABLES) {
            let Some(ring) = ring else {
                // Rows made from the maps: no ring to size or wake.
                continue;
            };
            let bytes = if args.ring_bytes == 0 {
                ring_bytes_for(ring.rate, table.record_size as usize).max(staged_ring)
            } else {
                // The host validates the size; clamp rather than fail.
                args.ring_bytes.clamp(4096, 1 << 30).next_power_of_two()
            };
            if let Some(stage) = stage_bytes {
                // Smaller batches where the ring cannot take every CPU's
                // full batch below its wake-up threshold.
                let batch =
                    stage::batch_bytes_for_ring(bytes, cpus, stage, table.record_size as u64);
                if u64::from(batch) < stage {
                    common.stage_limit[i] = batch;
                }
            }
            common.wakeup_bytes[i] = wakeup_bytes(bytes);
            common.wakeup_mask[i] = wakeup_check_every(bytes, table.record_size as usize) - 1;
            let obj = open.open_object_mut();
            let mut found = false;
            for mut map in obj.maps_mut() {
                if map.name().to_str() == Some(ring.map) && map.map_type() == MapType::RingBuf {
                    map.set_max_entries(u32::try_from(bytes).unwrap_or(1 << 30))
                        .map_err(|e| explain(&format!("sizing ring {}", ring.map), &e))?;
                    found = true;
                }
            }
            if !found {
                return Err(Error::new(format!(
                    "{}: the BPF object has no ring buffer map {} (declared for table {})",
                    P::NAME,
                    ring.map,
                    table.name
                )));
            }
        }
        if staged {
            if let Err(why) = kernmlops_sys::features::test_run_on_cpu() {
                common.stage_on = false;
                notes.push(format!(
                    "records go to the ring one at a time, not staged per CPU: {why}"
                ));
            }
        }
        P::set_common(&mut open, &common);
        let features = Features::default();
        let mut cx = LoadContext {
            args,
            settings,
            features: &features,
            notes: Vec::new(),
        };
        hooks.before_load(&mut open, &mut cx)?;
        notes.extend(cx.notes);
        let skel = open
            .load()
            .map_err(|e| explain(&format!("loading {}", P::NAME), &e))?;
        Ok((skel, notes, staged && common.stage_on))
    }

    fn attach(&mut self) -> Result<()> {
        let Some(skel) = self.skel.as_ref() else {
            return Err(Error::new("skeleton already dropped"));
        };
        for prog in skel.object().progs_mut() {
            let name = prog.name().to_string_lossy().into_owned();
            if !prog.autoload() || name == stage::FLUSH_PROGRAM {
                continue;
            }
            let link = prog
                .attach()
                .map_err(|e| explain(&format!("attaching {}/{name}", P::NAME), &e))?;
            self.links.push(link);
        }
        Ok(())
    }

    fn build_rings(&mut self) -> Result<()> {
        let Some(skel) = self.skel.as_ref() else {
            return Err(Error::new("skeleton already dropped"));
        };
        let maps: Vec<_> = skel.object().maps().collect();
        let mut builder = RingBufferBuilder::new();
        let mut rings = 0;
        for (ring, table) in P::RINGS.iter().zip(&self.tables) {
            let slot = Arc::new(Slot {
                batch: AtomicPtr::new(null_mut()),
                record_size: table.record_size as usize,
                malformed: AtomicU64::new(0),
            });
            // Every table has a slot, so slots stay in table order.
            self.slots.push(slot.clone());
            let Some(ring) = ring else {
                continue;
            };
            rings += 1;
            let map = maps
                .iter()
                .find(|m| m.name().to_str() == Some(ring.map))
                .ok_or_else(|| {
                    Error::new(format!("BPF object has no ring buffer map {}", ring.map))
                })?;
            builder
                .add(map, move |data: &[u8]| {
                    let p = slot.batch.load(Ordering::Relaxed);
                    if p.is_null() {
                        return 0;
                    }
                    // A sample holds one record, or a staged batch of whole
                    // records.
                    if data.is_empty() || data.len() % slot.record_size != 0 {
                        // Never pad or cut: the host reports it.
                        slot.malformed.fetch_add(1, Ordering::Relaxed);
                        return 0;
                    }
                    // SAFETY: `drain` stores a pointer to a batch it holds by
                    // `&mut` and clears it before returning; callbacks run only
                    // inside `poll`/`consume` called from `drain`.
                    let batch = unsafe { &mut *p };
                    batch.data.extend_from_slice(data);
                    batch.records += (data.len() / slot.record_size) as u64;
                    0
                })
                .map_err(|e| explain(&format!("opening ring buffer {}", ring.map), &e))?;
        }
        if rings > 0 {
            self.ring = Some(
                builder
                    .build()
                    .map_err(|e| explain("building ring buffers", &e))?,
            );
        }
        Ok(())
    }

    /// The staging of a `KML_STAGED` object loaded with staging on: its
    /// maps and flush program, which must come together.
    fn stages(skel: &Loaded<P>, tables: &[TableDecl], staged: bool) -> Result<Option<Stages>> {
        if !staged {
            return Ok(None);
        }
        let map = |name: &str| {
            skel.object()
                .maps()
                .find(|m| m.name() == name)
                .map(|m| {
                    MapHandle::try_from(&m).map_err(|e| explain(&format!("opening {name}"), &e))
                })
                .transpose()
        };
        let (Some(head), Some(data)) = (map(stage::HEAD_MAP)?, map(stage::DATA_MAP)?) else {
            return Ok(None);
        };
        let flush = skel
            .object()
            .progs()
            .find(|p| p.name() == stage::FLUSH_PROGRAM)
            .ok_or_else(|| {
                Error::new(format!(
                    "{}: the BPF object stages records (KML_STAGED) but has no {} program: add KML_FLUSH_PROGRAM",
                    P::NAME,
                    stage::FLUSH_PROGRAM
                ))
            })?;
        let flush = flush
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| Error::new(format!("{}: keeping kml_flush: {e}", P::NAME)))?;
        Ok(Some(Stages::new(
            head,
            data,
            flush,
            tables.iter().map(|t| t.record_size as usize).collect(),
        )))
    }

    fn lost_total(&self, table: u32) -> u64 {
        per_cpu_sum(&self.lost, table)
    }
}

/// The sum over CPUs of entry `key` of a per-CPU array of u64 counters (a
/// `kml_lost`-style map), 0 when the entry cannot be read.
pub fn per_cpu_sum(map: &MapHandle, key: u32) -> u64 {
    match map.lookup_percpu(&key.to_ne_bytes(), MapFlags::ANY) {
        Ok(Some(per_cpu)) => per_cpu
            .iter()
            .filter_map(|v| v.get(..8).and_then(|b| b.try_into().ok()))
            .map(u64::from_ne_bytes)
            .sum(),
        _ => 0,
    }
}

impl<P: BpfHooks> ProbeImpl for BpfProbe<P> {
    const NAME: &'static str = P::NAME;
    type Settings = P::Settings;

    fn decl() -> ProbeDecl {
        ProbeDecl {
            name: P::NAME.into(),
            description: P::DESCRIPTION.into(),
            tables: P::tables().into(),
        }
    }

    fn start(args: &StartArgs, settings: P::Settings) -> Result<Self> {
        let tables = P::tables();
        if tables.len() != P::RINGS.len() || tables.len() > MAX_TABLES {
            return Err(Error::new(format!(
                "{} declares {} tables and {} rings (at most {MAX_TABLES})",
                P::NAME,
                tables.len(),
                P::RINGS.len()
            )));
        }
        libbpf_rs::set_print(Some((PrintLevel::Info, capture_libbpf_log)));
        if let Ok(mut log) = LIBBPF_LOG.lock() {
            log.clear();
        }
        let mut hooks = P::default();
        let storage: *mut MaybeUninit<OpenObject> = Box::into_raw(Box::new(MaybeUninit::uninit()));
        // SAFETY: `storage` is a fresh allocation freed only in `Drop`, after
        // the skeleton that borrows it is gone.
        let loaded = Self::load(
            &mut hooks,
            unsafe { &mut *storage },
            args,
            &settings,
            &tables,
        );
        let (skel, notes, staged) = match loaded {
            Ok(l) => l,
            Err(e) => {
                // SAFETY: the failed load dropped everything that borrowed it.
                drop(unsafe { Box::from_raw(storage) });
                return Err(e);
            }
        };
        let lost = {
            let map = skel
                .object()
                .maps()
                .find(|m| m.name() == "kml_lost")
                .ok_or_else(|| Error::new("BPF object has no kml_lost map: include kml.bpf.h"));
            match map
                .and_then(|m| MapHandle::try_from(&m).map_err(|e| explain("opening kml_lost", &e)))
            {
                Ok(h) => h,
                Err(e) => {
                    drop(skel);
                    // SAFETY: the skeleton that borrowed it is dropped.
                    drop(unsafe { Box::from_raw(storage) });
                    return Err(e);
                }
            }
        };
        let stages = match Self::stages(&skel, &tables, staged) {
            Ok(s) => s,
            Err(e) => {
                drop(skel);
                // SAFETY: the skeleton that borrowed it is dropped.
                drop(unsafe { Box::from_raw(storage) });
                return Err(e);
            }
        };
        let mut probe = Self {
            ring: None,
            links: Vec::new(),
            lost,
            stages,
            slots: Vec::new(),
            skel: Some(skel),
            storage,
            hooks,
            tables,
            notes,
            initial_args: None,
        };
        probe.attach()?;
        probe.build_rings()?;
        // The initial records are made at the first drain, on the drain
        // thread: after the attach (so nothing falls between the two) but
        // not in the run's start-up.
        probe.initial_args = Some(args.clone());
        Ok(probe)
    }

    fn drain(&mut self, timeout: Duration, batches: &mut [Batch]) -> Result<()> {
        if batches.len() != self.slots.len() {
            return Err(Error::new(format!(
                "host passed {} batches for {} tables",
                batches.len(),
                self.slots.len()
            )));
        }
        if let Some(args) = self.initial_args.take() {
            let mut initial: Vec<Batch> = self.tables.iter().map(|_| Batch::default()).collect();
            self.hooks.initial_records(&args, &mut initial)?;
            for (batch, first) in batches.iter_mut().zip(initial) {
                batch.data.extend_from_slice(&first.data);
                batch.records += first.records;
            }
        }
        let starts: Vec<usize> = batches.iter().map(|b| b.data.len()).collect();
        let (polled, consumed) = match self.ring.as_ref() {
            Some(ring) => {
                for (slot, batch) in self.slots.iter().zip(batches.iter_mut()) {
                    slot.batch.store(batch as *mut Batch, Ordering::Relaxed);
                }
                // Wait for a wake-up (a ring past its threshold) or the
                // timeout, then take everything, since below-threshold
                // records do not wake us.
                let polled = ring.poll_raw(timeout);
                let flushed = match self.stages.as_mut() {
                    Some(stages) => stages.flush_stale(),
                    None => Ok(()),
                };
                let consumed = ring.consume_raw();
                for slot in &self.slots {
                    slot.batch.store(null_mut(), Ordering::Relaxed);
                }
                flushed?;
                (polled, consumed)
            }
            // Every table is made from the maps (the probe's own drain does
            // that); wait as a ring's poll would.
            None => {
                std::thread::sleep(timeout);
                (0, 0)
            }
        };
        if let Some(stages) = self.stages.as_mut() {
            for (i, (slot, batch)) in self.slots.iter().zip(batches.iter_mut()).enumerate() {
                let leftover = stages.take_leftover(i);
                if !leftover.is_empty() {
                    batch.records += (leftover.len() / slot.record_size) as u64;
                    batch.data.extend_from_slice(&leftover);
                }
            }
        }
        for (ret, what) in [(polled, "polling"), (consumed, "consuming")] {
            if ret < 0 && ret != -libc::EINTR {
                return Err(Error::new(format!(
                    "{what} ring buffers: {}",
                    std::io::Error::from_raw_os_error(-ret)
                )));
            }
        }
        for (i, (batch, start)) in batches.iter_mut().zip(starts).enumerate() {
            let record_size = self.tables[i].record_size as usize;
            if batch.data.len() > start {
                let mut records = Records::new(&mut batch.data[start..], record_size);
                self.hooks.fix_records(i, &mut records)?;
            }
            batch.lost_total = self.lost_total(i as u32);
            batch.malformed_total = self.slots[i].malformed.load(Ordering::Relaxed);
        }
        Ok(())
    }

    fn stop(&mut self) -> Result<()> {
        // Dropping a link detaches its program; the rings stay for the last
        // drain, which takes the partial batches sent here.
        self.links.clear();
        crate::stage::flush_all(self.stages.as_mut())
    }

    fn tables(&self) -> Vec<TableDecl> {
        self.tables.clone()
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    fn bpf_stats(&self) -> Vec<BpfProgramStats> {
        let Some(skel) = self.skel.as_ref() else {
            return Vec::new();
        };
        skel.object()
            .progs()
            .filter(|p| p.autoload())
            .filter_map(|p| {
                let info = program_info(p.as_fd())?;
                Some(BpfProgramStats {
                    name: p.name().to_string_lossy().into_owned().into(),
                    id: info.id,
                    run_cnt: info.run_cnt,
                    run_time_ns: info.run_time_ns,
                })
            })
            .collect()
    }
}

/// The kernel's `bpf_prog_info` of a loaded program.
fn program_info(fd: BorrowedFd<'_>) -> Option<libbpf_rs::libbpf_sys::bpf_prog_info> {
    // SAFETY: bpf_prog_info is plain old data; zero is a valid value.
    let mut info: libbpf_rs::libbpf_sys::bpf_prog_info = unsafe { std::mem::zeroed() };
    let mut len = u32::try_from(std::mem::size_of_val(&info)).ok()?;
    // SAFETY: `info` is writable for `len` bytes and `fd` is a program fd;
    // the kernel fills at most `len` bytes.
    let rc = unsafe {
        libbpf_rs::libbpf_sys::bpf_prog_get_info_by_fd(fd.as_raw_fd(), &mut info, &mut len)
    };
    (rc == 0).then_some(info)
}

impl<P: BpfHooks> Drop for BpfProbe<P> {
    fn drop(&mut self) {
        self.ring = None;
        self.links.clear();
        self.skel = None;
        // SAFETY: allocated by `Box::into_raw` in `start`; the skeleton that
        // borrowed it was dropped just above.
        drop(unsafe { Box::from_raw(self.storage) });
    }
}
