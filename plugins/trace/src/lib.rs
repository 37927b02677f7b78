//! trace: typed tables from any tracepoint, kernel function or user
//! function named in configuration (`[probes.trace] events`), with no
//! build: one generic BPF object whose field fetches are planned here from
//! the tracepoint's format file or from BTF (`plan`), laid out as records
//! and tables (`layout`), and handed to the programs through a map.

pub mod check;
pub mod layout;
/// Tracepoint format files, shared with the host's `trace-list`.
pub use kernmlops_sys::trace_format as format;
pub mod plan;
pub mod presets;
pub mod spec;

use std::{
    collections::HashMap,
    mem::MaybeUninit,
    os::fd::AsFd,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use kernmlops_plugin_bpf::libbpf_rs::{
    self,
    skel::{OpenSkel, Skel, SkelBuilder},
    Link, MapCore, MapFlags, MapHandle, OpenObject, RingBuffer, RingBufferBuilder,
    TracepointCategory, TracepointOpts, UprobeOpts,
};
use kernmlops_plugin_bpf::stage::{self, Stages};
use kernmlops_plugin_sdk::{
    export_plugin, settings, sys::btf::Btf, Batch, Error, ProbeDecl, ProbeImpl, Result, StartArgs,
    TableDecl,
};

use crate::{
    layout::{
        lay_out, unmatched_table, CountLayout, Laid, COUNT_KEY, MAX_SLOTS, SLOT_OFFSET,
        UNMATCHED_RECORD, UNMATCHED_TABLE,
    },
    plan::{plan_event, EventPlan, Options, Sources},
    spec::{EventSpec, Kind, LongEvent, Target},
};

kernmlops_plugin_bpf::bpf_skel!();

/// What the probe traces when the settings name no event and no preset: a
/// quiet event every machine has, so `kernmlops check` and a bare
/// `--plugins trace` show the plugin working.
pub const DEFAULT_EVENTS: &[&str] = &["sched:sched_process_exec"];

settings! {
    /// `[probes.trace]` settings.
    pub struct Config {
        /// Events to trace, one table each: "sys:event" (a tracepoint, every field),
        /// "tp_btf:block_rq_insert(rq->__sector, rq->__data_len)" (BTF paths),
        /// "uprobe:/path/bin:symbol(arg0, str(arg1)) latency" (a user function),
        /// "syscalls:sys_enter_getppid count by=tgid interval=100ms" (counted per key
        /// and interval, not a row per event). See the trace plugin's README for the
        /// whole language. With no events, no presets and
        /// no [[probes.trace.event]]: "sched:sched_process_exec".
        pub events: Vec<String> = Vec::new(),
        /// Shipped sets of events to add: "sched", "block", "syscalls-open", "mm",
        /// "page_cache", "reclaim", "migration", "cpufreq", "net", "writeback",
        /// "syscalls" (an event this kernel lacks is left out with a note).
        pub presets: Vec<String> = Vec::new(),
        /// The long form, one [[probes.trace.event]] per event: event = "...", and
        /// optionally table = "name", fields = ["a->b", "n=str(arg1)"], ret, latency,
        /// mode = "count" with by = ["tgid"] and interval = "100ms", exit = "sys:event".
        pub event: Vec<LongEvent> = Vec::new(),
        /// Record the current task's command name (comm) in every row.
        pub comm: bool = true,
        /// Bytes kept of each string field, its NUL included (8 to 256); longer
        /// strings are cut and flagged in <field>_truncated.
        pub string_bytes: u32 = 64,
        /// Keys the kernel map of count-mode events holds, all such events together
        /// (16 to 1048576); an event whose key finds no room is counted lost.
        pub count_entries: u32 = 16384,
    }
    validate(c) {
        if !(8..=256).contains(&c.string_bytes) {
            return Err(format!("string_bytes must be 8 to 256, not {}", c.string_bytes));
        }
        if !(16..=1 << 20).contains(&c.count_entries) {
            return Err(format!("count_entries must be 16 to 1048576, not {}", c.count_entries));
        }
        match check::readable_tracefs() {
            // Where tracefs can be read (as root: every run), each event is
            // planned as `start` would, so a bad one is refused before a
            // collection is created.
            Some(_) => plan_all(c)
                .and_then(|(plans, _)| lay_out_all(&plans, c.comm))
                .map(drop)
                .map_err(|e| e.message),
            // Otherwise only the syntax, presets and count.
            None => {
                let (specs, _) = check::event_specs(c, &|_, _| true)?;
                check_count(specs.len())
            }
        }
    }
}

fn check_count(events: usize) -> std::result::Result<(), String> {
    if events > MAX_SLOTS {
        return Err(format!("{events} events: at most {MAX_SLOTS}"));
    }
    Ok(())
}

/// Refuses a kernel-function event before anything loads: fentry and
/// kprobes are what it would need, and why each is missing here.
fn refuse_kernel_function(spec: &EventSpec) -> Error {
    let name = match &spec.target {
        Target::Name(n) => n.as_str(),
        _ => "",
    };
    let fentry = kernmlops_sys_features::fentry_attachable(name);
    let kprobe = kernmlops_sys_features::kprobe_attachable(name);
    let why = match (&fentry, &kprobe) {
        (Err(f), Err(k)) => format!("fentry/fexit is refused ({f}) and kprobes too ({k})"),
        _ => "kernel functions are not attached by this version of the trace plugin yet".to_owned(),
    };
    Error::unsupported(format!(
        "trace event {:?}: {why}; what works here: {}",
        spec.text,
        check::WORKING_KINDS
    ))
}

use kernmlops_plugin_sdk::sys::features as kernmlops_sys_features;

/// The names of the folders in `dir` (none where it cannot be read).
fn subfolders(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().is_dir())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Plans every event of the settings (their own, their presets', or the
/// default), refusing one whose kind this kernel cannot attach; returns
/// the plans and notes (fields and preset events left out).
pub fn plan_all(config: &Config) -> Result<(Vec<EventPlan>, Vec<String>)> {
    let tracefs = kernmlops_plugin_sdk::sys::tracefs::tracefs_root();
    let exists = |system: &str, event: &str| {
        tracefs
            .as_deref()
            .is_some_and(|root| check::tracepoint_exists(root, system, event))
    };
    let (specs, mut notes) = check::event_specs(config, &exists).map_err(Error::config)?;
    check_count(specs.len()).map_err(Error::config)?;
    let needs_btf = specs.iter().any(|s| {
        matches!(
            s.kind,
            Kind::TpBtf | Kind::Fentry | Kind::Fexit | Kind::Func
        )
    });
    let btf = if needs_btf {
        Some(Btf::vmlinux().map_err(|e| Error::unsupported(format!("trace: reading BTF: {e}")))?)
    } else {
        None
    };
    let format = |system: &str, event: &str| {
        let root = tracefs.clone().ok_or_else(|| {
            "tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing)".to_owned()
        })?;
        if !check::tracepoint_exists(&root, system, event) {
            let names = subfolders(&root.join("events").join(system));
            return Err(if names.is_empty() {
                let systems = subfolders(&root.join("events"));
                format!(
                    "no tracepoint system {system}; nearest: {}",
                    plan::nearest(system, systems.iter().map(String::as_str), 8)
                )
            } else {
                format!(
                    "no tracepoint {system}:{event}; nearest in {system}: {}",
                    plan::nearest(event, names.iter().map(String::as_str), 8)
                )
            });
        }
        format::read(&root, system, event).map_err(|e| e.to_string())
    };
    let src = Sources {
        btf: btf.as_ref(),
        format: &format,
    };
    let opts = Options {
        string_bytes: config.string_bytes,
    };
    copies_needed(&specs.iter().collect::<Vec<_>>()).map_err(Error::config)?;
    let mut plans = Vec::new();
    for spec in &specs {
        if spec.kind.is_kernel_function() {
            return Err(refuse_kernel_function(spec));
        }
        if let Some(why) = check::kind_refusal(spec) {
            return Err(Error::unsupported(why));
        }
        let p = plan_event(spec, &src, opts).map_err(|e| Error::config(e.to_string()))?;
        notes.extend(p.skipped.iter().cloned());
        plans.push(p);
    }
    Ok((plans, notes))
}

/// Lays every planned event out as its record and table.
pub fn lay_out_all(plans: &[EventPlan], comm: bool) -> Result<Vec<Laid>> {
    plans
        .iter()
        .map(|p| {
            lay_out(p, comm)
                .map_err(|e| Error::config(format!("trace event {:?}: {e}", p.spec.text)))
        })
        .collect()
}

/// libbpf's messages during a load, for a verifier's refusal.
static LIBBPF_LOG: Mutex<String> = Mutex::new(String::new());

fn capture_libbpf_log(_level: libbpf_rs::PrintLevel, msg: String) {
    if let Ok(mut log) = LIBBPF_LOG.lock() {
        if log.len() < 1 << 20 {
            log.push_str(&msg);
        }
    }
}

fn bpf_error(what: &str, e: &libbpf_rs::Error) -> Error {
    let log = LIBBPF_LOG.lock().map(|l| l.clone()).unwrap_or_default();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(8)..].join(" | ");
    if tail.is_empty() {
        Error::new(format!("trace: {what}: {e:#}"))
    } else {
        Error::new(format!("trace: {what}: {e:#}; libbpf: {tail}"))
    }
}

/// Records taken by the ring callback, per table, until a drain hands them
/// to the host.
#[derive(Default)]
struct Pending {
    data: Vec<Vec<u8>>,
    records: Vec<u64>,
    sizes: Vec<usize>,
    /// Rows ordered by their time at each drain: not a joined event's,
    /// whose rows come in the order their calls returned.
    by_time: Vec<bool>,
    malformed: Vec<u64>,
}

/// Attach cookie of the tracepoint that ends a joined tracepoint event
/// (`TRACE_EXIT_COOKIE`).
const EXIT_COOKIE: u64 = 0x10000;

/// Copies of the classic tracepoint program (`TRACE_COPIES`): a
/// tracepoint takes a program once, so this many events can share one
/// tracepoint. Raw and BTF tracepoints have a program per slot.
pub const COPIES: usize = 4;

/// The classic tracepoints the events attach to ("sys:event"), one entry
/// per attachment.
fn attach_points(specs: &[&EventSpec]) -> Vec<String> {
    let mut out = Vec::new();
    for spec in specs {
        if let (Kind::Tracepoint, Target::Tracepoint { system, event }) = (&spec.kind, &spec.target)
        {
            out.push(format!("{system}:{event}"));
            if let Some((system, event)) = &spec.exit {
                out.push(format!("{system}:{event}"));
            }
        }
    }
    out
}

/// Copies needed of the classic tracepoint program; an error naming a
/// tracepoint more events share than there are copies.
fn copies_needed(specs: &[&EventSpec]) -> std::result::Result<usize, String> {
    let mut uses: HashMap<String, usize> = HashMap::new();
    for p in attach_points(specs) {
        *uses.entry(p).or_default() += 1;
    }
    if let Some((name, n)) = uses.iter().find(|(_, n)| **n > COPIES) {
        return Err(format!(
            "trace: {n} events attach to tracepoint {name}: at most {COPIES}"
        ));
    }
    Ok(uses.values().copied().max().unwrap_or(0))
}

/// The raw tracepoint programs of `progs` (`trace_raw_N`), one per slot,
/// borrowed with `$r` (`&` or `&mut`).
macro_rules! raw_programs {
    ($progs:expr, $($r:tt)+) => {
        [
            $($r)+ $progs.trace_raw_0,
            $($r)+ $progs.trace_raw_1,
            $($r)+ $progs.trace_raw_2,
            $($r)+ $progs.trace_raw_3,
            $($r)+ $progs.trace_raw_4,
            $($r)+ $progs.trace_raw_5,
            $($r)+ $progs.trace_raw_6,
            $($r)+ $progs.trace_raw_7,
            $($r)+ $progs.trace_raw_8,
            $($r)+ $progs.trace_raw_9,
            $($r)+ $progs.trace_raw_10,
            $($r)+ $progs.trace_raw_11,
            $($r)+ $progs.trace_raw_12,
            $($r)+ $progs.trace_raw_13,
            $($r)+ $progs.trace_raw_14,
            $($r)+ $progs.trace_raw_15,
        ]
    };
}

/// Whether some event attaches the user-function entry program, and
/// whether some attaches the exit program (a `uretprobe`, or a `uprobe`
/// joined with its exit).
fn user_probes_needed(events: &[(&EventPlan, &Laid)]) -> (bool, bool) {
    let user = |p: &EventPlan| matches!(p.spec.target, Target::User { .. });
    let entry = events
        .iter()
        .any(|(p, _)| user(p) && p.spec.kind == Kind::Uprobe);
    let exit = events.iter().any(|(p, l)| {
        user(p) && (p.spec.kind == Kind::Uretprobe || (p.spec.kind == Kind::Uprobe && l.joined))
    });
    (entry, exit)
}

/// Whether an event runs its slot's own raw tracepoint program.
fn raw_slot(spec: &EventSpec) -> bool {
    matches!(
        (&spec.kind, &spec.target),
        (Kind::TpBtf | Kind::RawTp, Target::Name(_))
    )
}

/// Copies a laid-out slot (`struct trace_slot`'s bytes) into the program's
/// read-only plan.
fn write_plan(plan: &mut skel::types::trace_slot, bytes: &[u8]) {
    let n = std::mem::size_of::<skel::types::trace_slot>().min(bytes.len());
    // SAFETY: trace_slot is a repr(C) struct of integers only, without
    // padding (layout's tests check its size), so any bytes are a valid
    // value, and `n` bytes fit both.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), std::ptr::from_mut(plan).cast::<u8>(), n);
    }
}

/// A key of a count event idle for this many of its intervals is removed
/// from the kernel map (a process that ended leaves room for others).
const IDLE_INTERVALS: u32 = 50;

/// One count event's interval clock.
struct CountSlot {
    slot: u16,
    table: usize,
    layout: CountLayout,
    row_size: usize,
    interval: Duration,
    due: Instant,
    gen: u64,
}

/// What a key's counters were at the last interval's end, per CPU.
struct KeySeen {
    counts: Vec<u64>,
    totals: Vec<u64>,
    idle: u32,
}

/// Count events: their slots and the kernel map's last values.
#[derive(Default)]
struct Counts {
    slots: Vec<CountSlot>,
    seen: HashMap<Vec<u8>, KeySeen>,
}

/// The running probe. Field order is drop order: ring and links before the
/// skeleton, the skeleton before its storage.
pub struct Trace {
    ring: Option<RingBuffer<'static>>,
    links: Vec<Link>,
    lost: Option<MapHandle>,
    /// Exits without their entry, per slot (`trace_unmatched`).
    unmatched: Option<MapHandle>,
    /// The joined events' slots with the unmatched exits already reported;
    /// empty when no event is joined (no `trace_unmatched_exits` table).
    unmatched_seen: Vec<(u32, u64)>,
    counts_map: Option<MapHandle>,
    /// Staged output of the first STAGE_SLOTS slots (None: records go to
    /// the ring one at a time).
    stages: Option<Stages>,
    counts: Counts,
    stopped: bool,
    skel: Option<skel::Loaded>,
    storage: *mut MaybeUninit<OpenObject>,
    pending: Arc<Mutex<Pending>>,
    tables: Vec<TableDecl>,
    notes: Vec<String>,
}

// SAFETY: Trace owns everything it points to (libbpf objects, the storage
// it allocated); none of it is tied to the creating thread, and `&mut self`
// keeps use to one thread at a time.
unsafe impl Send for Trace {}

impl Drop for Trace {
    fn drop(&mut self) {
        self.ring = None;
        self.detach();
        self.lost = None;
        self.unmatched = None;
        self.counts_map = None;
        self.stages = None;
        self.skel = None;
        if !self.storage.is_null() {
            // SAFETY: allocated by Box in `start`; the skeleton borrowing it
            // is dropped above.
            drop(unsafe { Box::from_raw(self.storage) });
            self.storage = std::ptr::null_mut();
        }
    }
}

/// Slots whose records are staged per CPU (`TRACE_STAGE_SLOTS`) and the
/// stage's batch size (`TRACE_STAGE_BYTES`).
const STAGE_SLOTS: usize = 8;
const STAGE_BYTES: u64 = 8192;

/// The ring's size: `--ring-size`, or (auto) an eighth of a second of a
/// busy event's records, 256 KiB to 16 MiB, and room for every CPU's
/// staged batch below the wake-up threshold.
fn ring_bytes(args: &StartArgs, tables: &[TableDecl]) -> u32 {
    if args.ring_bytes != 0 {
        return u32::try_from(args.ring_bytes.clamp(4096, 1 << 30).next_power_of_two())
            .unwrap_or(1 << 30);
    }
    let per_event: u64 = tables.iter().map(|t| u64::from(t.record_size) + 8).sum();
    let cpus = libbpf_rs::num_possible_cpus().unwrap_or(1) as u64;
    (per_event * 100_000 / 8)
        .clamp(256 << 10, 16 << 20)
        .max(stage::ring_bytes_for_stages(cpus, STAGE_BYTES))
        .next_power_of_two()
        .try_into()
        .unwrap_or(16 << 20)
}

impl Trace {
    fn load(
        &mut self,
        args: &StartArgs,
        laid: &[Laid],
        plans: &[EventPlan],
        count_entries: u32,
    ) -> Result<()> {
        if let Ok(mut log) = LIBBPF_LOG.lock() {
            log.clear();
        }
        libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Info, capture_libbpf_log)));
        // SAFETY: `storage` was allocated in `start` and is freed only in
        // Drop, after the skeleton.
        let storage = unsafe { &mut *self.storage };
        let mut open = skel::Builder::default()
            .open(storage)
            .map_err(|e| bpf_error("opening the BPF object", &e))?;
        let ring = ring_bytes(args, &self.tables);
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            ro.kml_filter_tgid = args.filter_tgid;
            ro.kml_filter_pid = args.filter_pid;
            ro.kml_filter_cgroup_id = args.filter_cgroup_id;
            ro.kml_filter_cgroup_descendants = u32::from(args.filter_cgroup_descendants);
            ro.kml_self_tgid = if args.include_self { 0 } else { args.self_tgid };
            ro.kml_wakeup_bytes[0] = u64::from(ring / 4);
            // Staged where the host can send a quiet CPU's partial batch,
            // in batches every CPU's of which fit below the wake-up
            // threshold.
            ro.trace_stage_on = u32::from(kernmlops_sys::features::test_run_on_cpu().is_ok());
            let cpus = libbpf_rs::num_possible_cpus().unwrap_or(1) as u64;
            let largest = self.tables.iter().map(|t| t.record_size).max().unwrap_or(1);
            ro.trace_stage_limit =
                stage::batch_bytes_for_ring(u64::from(ring), cpus, STAGE_BYTES, u64::from(largest));
            for (plan, l) in ro.trace_plan.iter_mut().zip(laid) {
                write_plan(plan, &l.slot);
            }
        }
        open.maps
            .trace_ring
            .set_max_entries(ring)
            .map_err(|e| bpf_error("sizing the ring", &e))?;
        // The join maps are preallocated (LRU): 4096 waiting entries of a
        // record each only where an event joins entry and exit.
        let waiting = if laid.iter().any(|l| l.joined) {
            4096
        } else {
            1
        };
        open.maps
            .trace_inflight
            .set_max_entries(waiting)
            .map_err(|e| bpf_error("sizing trace_inflight", &e))?;
        open.maps
            .trace_depth
            .set_max_entries(waiting)
            .map_err(|e| bpf_error("sizing trace_depth", &e))?;
        // Only the programs some event needs are loaded (and verified):
        // the copies of the tracepoint program, the user-probe programs.
        let specs: Vec<&EventSpec> = plans.iter().map(|p| &p.spec).collect();
        let tp = copies_needed(&specs).map_err(Error::config)?;
        for (i, prog) in [
            &mut open.progs.trace_tp,
            &mut open.progs.trace_tp_1,
            &mut open.progs.trace_tp_2,
            &mut open.progs.trace_tp_3,
        ]
        .into_iter()
        .enumerate()
        {
            prog.set_autoload(i < tp);
        }
        let (entry, exit) = user_probes_needed(&plans.iter().zip(laid).collect::<Vec<_>>());
        open.progs.trace_uprobe.set_autoload(entry);
        open.progs.trace_uretprobe.set_autoload(exit);
        // A raw tracepoint's program per slot: only those of the slots
        // that have one are loaded (and verified).
        for (i, prog) in raw_programs!(open.progs, &mut).into_iter().enumerate() {
            prog.set_autoload(specs.get(i).is_some_and(|s| raw_slot(s)));
        }
        let counted = if laid.iter().any(|l| l.count.is_some()) {
            count_entries
        } else {
            1
        };
        open.maps
            .trace_counts
            .set_max_entries(counted)
            .map_err(|e| bpf_error("sizing trace_counts", &e))?;
        let loaded = open
            .load()
            .map_err(|e| bpf_error("loading the generic programs", &e))?;
        for (i, l) in laid.iter().enumerate() {
            let key = u32::try_from(i).unwrap_or(0).to_ne_bytes();
            loaded
                .maps
                .trace_slots
                .update(&key, &l.slot, MapFlags::ANY)
                .map_err(|e| bpf_error("writing the fetch plans", &e))?;
        }
        let lost = MapHandle::try_from(&loaded.maps.trace_lost)
            .map_err(|e| bpf_error("opening trace_lost", &e))?;
        self.unmatched = Some(
            MapHandle::try_from(&loaded.maps.trace_unmatched)
                .map_err(|e| bpf_error("opening trace_unmatched", &e))?,
        );
        let counts = MapHandle::try_from(&loaded.maps.trace_counts)
            .map_err(|e| bpf_error("opening trace_counts", &e))?;
        let stages = Self::stages(&loaded, laid)?;
        self.skel = Some(loaded);
        self.stages = stages;
        self.lost = Some(lost);
        self.counts_map = Some(counts);
        let now = Instant::now();
        for (i, l) in laid.iter().enumerate() {
            if let Some(c) = &l.count {
                let interval = Duration::from_micros(c.interval_us);
                self.counts.slots.push(CountSlot {
                    slot: u16::try_from(i).unwrap_or(u16::MAX),
                    table: i,
                    layout: c.clone(),
                    row_size: l.table.record_size as usize,
                    interval,
                    due: now + interval,
                    gen: 1,
                });
            }
        }
        self.publish_generations();
        self.attach(laid, plans)?;
        self.build_ring()
    }

    /// The host's side of the staged output: the stage maps and the flush
    /// program, for the slots that stage.
    fn stages(loaded: &skel::Loaded, laid: &[Laid]) -> Result<Option<Stages>> {
        let on = loaded
            .maps
            .rodata_data
            .as_ref()
            .is_some_and(|ro| ro.trace_stage_on != 0);
        if !on {
            return Ok(None);
        }
        let head = MapHandle::try_from(&loaded.maps.kml_stage_head)
            .map_err(|e| bpf_error("opening kml_stage_head", &e))?;
        let data = MapHandle::try_from(&loaded.maps.kml_stage_data)
            .map_err(|e| bpf_error("opening kml_stage_data", &e))?;
        let flush = loaded
            .progs
            .kml_flush
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| Error::new(format!("trace: the flush program's fd: {e}")))?;
        let sizes = laid
            .iter()
            .take(STAGE_SLOTS)
            .map(|l| l.table.record_size as usize)
            .collect();
        Ok(Some(Stages::new(head, data, flush, sizes)))
    }

    fn attach(&mut self, laid: &[Laid], plans: &[EventPlan]) -> Result<()> {
        let Some(skel) = self.skel.as_ref() else {
            return Err(Error::new("trace: skeleton already dropped"));
        };
        let tp_progs = [
            &skel.progs.trace_tp,
            &skel.progs.trace_tp_1,
            &skel.progs.trace_tp_2,
            &skel.progs.trace_tp_3,
        ];
        let raw_progs = raw_programs!(skel.progs, &);
        // Attachments made so far per tracepoint: the next takes the next
        // copy.
        let mut uses: HashMap<String, usize> = HashMap::new();
        let mut next_copy = |name: String| {
            let n = uses.entry(name).or_default();
            *n += 1;
            (*n - 1).min(COPIES - 1)
        };
        for (i, (plan, l)) in plans.iter().zip(laid).enumerate() {
            let cookie = i as u64;
            let spec = &plan.spec;
            let fail = |e: libbpf_rs::Error| bpf_error(&format!("attaching {:?}", spec.text), &e);
            match (&spec.kind, &spec.target) {
                (Kind::Tracepoint, Target::Tracepoint { system, event }) => {
                    // The exit of a joined pair first: no entry waits for
                    // an exit that is not attached yet.
                    let exit = spec
                        .exit
                        .as_ref()
                        .map(|(s, e)| (s.clone(), e.as_str(), cookie | EXIT_COOKIE));
                    for (system, event, cookie) in exit.into_iter().chain(std::iter::once((
                        system.clone(),
                        event.as_str(),
                        cookie,
                    ))) {
                        let copy = next_copy(format!("{system}:{event}"));
                        let link = tp_progs[copy]
                            .attach_tracepoint_with_opts(
                                TracepointCategory::Custom(system),
                                event,
                                TracepointOpts {
                                    cookie,
                                    ..TracepointOpts::default()
                                },
                            )
                            .map_err(fail)?;
                        self.links.push(link);
                    }
                }
                (Kind::TpBtf | Kind::RawTp, Target::Name(name)) => {
                    // Its slot's own program: no cookie.
                    let prog = raw_progs
                        .get(i)
                        .ok_or_else(|| Error::new(format!("trace: no program for slot {i}")))?;
                    let link = prog.attach_raw_tracepoint(name).map_err(fail)?;
                    self.links.push(link);
                }
                (
                    Kind::Uprobe | Kind::Uretprobe,
                    Target::User {
                        path,
                        symbol,
                        offset,
                    },
                ) => {
                    let entry = spec.kind == Kind::Uprobe;
                    let exit = spec.kind == Kind::Uretprobe || l.joined;
                    // The exit first (and detached last): no entry waits
                    // for an exit not attached.
                    for (ret, on) in [(true, exit), (false, entry)] {
                        if !on {
                            continue;
                        }
                        let prog = if ret {
                            &skel.progs.trace_uretprobe
                        } else {
                            &skel.progs.trace_uprobe
                        };
                        let link = prog
                            .attach_uprobe_with_opts(
                                -1,
                                PathBuf::from(path),
                                usize::try_from(*offset).unwrap_or(0),
                                UprobeOpts {
                                    cookie,
                                    retprobe: ret,
                                    func_name: Some(symbol.clone()),
                                    ..UprobeOpts::default()
                                },
                            )
                            .map_err(fail)?;
                        self.links.push(link);
                    }
                }
                _ => return Err(refuse_kernel_function(spec)),
            }
        }
        Ok(())
    }

    fn build_ring(&mut self) -> Result<()> {
        let Some(skel) = self.skel.as_ref() else {
            return Err(Error::new("trace: skeleton already dropped"));
        };
        let pending = self.pending.clone();
        let mut builder = RingBufferBuilder::new();
        builder
            .add(&skel.maps.trace_ring, move |data: &[u8]| {
                let Ok(mut p) = pending.lock() else {
                    return 0;
                };
                let slot = data
                    .get(SLOT_OFFSET..SLOT_OFFSET + 2)
                    .map(|b| usize::from(u16::from_le_bytes([b[0], b[1]])));
                // A sample holds one record, or a staged batch of whole
                // records of one slot.
                let whole = |s: usize, size: usize| {
                    size >= SLOT_OFFSET + 2
                        && !data.is_empty()
                        && data.len() % size == 0
                        && data.chunks_exact(size).all(|r| {
                            usize::from(u16::from_le_bytes([r[SLOT_OFFSET], r[SLOT_OFFSET + 1]]))
                                == s
                        })
                };
                match slot {
                    Some(s) if s < p.sizes.len() && whole(s, p.sizes[s]) => {
                        p.data[s].extend_from_slice(data);
                        p.records[s] += (data.len() / p.sizes[s]) as u64;
                    }
                    Some(s) if s < p.sizes.len() => p.malformed[s] += 1,
                    _ => {
                        if let Some(m) = p.malformed.first_mut() {
                            *m += 1;
                        }
                    }
                }
                0
            })
            .map_err(|e| bpf_error("opening the ring", &e))?;
        let ring = builder
            .build()
            .map_err(|e| bpf_error("building the ring", &e))?;
        // SAFETY: the ring borrows the skeleton's map, which lives in
        // `self.skel` until Drop, where the ring is dropped first.
        self.ring =
            Some(unsafe { std::mem::transmute::<RingBuffer<'_>, RingBuffer<'static>>(ring) });
        Ok(())
    }

    /// Closes the interval of every count event that is due (all of them
    /// once stopped): its generation advanced (least and greatest latency
    /// start again), then one row per key whose count grew, from the
    /// differences of the kernel's per-CPU counters since the last
    /// interval.
    fn count_rows(&mut self, batches: &mut [Batch]) -> Result<()> {
        let now = Instant::now();
        let stopped = self.stopped;
        let due: Vec<usize> = (0..self.counts.slots.len())
            .filter(|&i| stopped || self.counts.slots[i].due <= now)
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        // The interval closing is generation `gen`; its extremes are in
        // half gen & 1, no longer written once the next generation starts.
        let closing: Vec<u64> = due.iter().map(|&i| self.counts.slots[i].gen).collect();
        for &i in &due {
            self.counts.slots[i].gen += 1;
        }
        self.publish_generations();
        let Some(map) = self.counts_map.as_ref() else {
            return Ok(());
        };
        let ts = kernmlops_plugin_sdk::sys::clock::uptime_us();
        let slot_of_key = |key: &[u8]| {
            key.get(SLOT_OFFSET - 8..SLOT_OFFSET - 6)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
        };
        for key in map.keys() {
            if key.len() != COUNT_KEY as usize {
                continue;
            }
            let Some(slot) = slot_of_key(&key) else {
                continue;
            };
            let Some(ci) = due
                .iter()
                .copied()
                .find(|&i| self.counts.slots[i].slot == slot)
            else {
                continue;
            };
            let Ok(Some(per_cpu)) = map.lookup_percpu(&key, MapFlags::ANY) else {
                continue;
            };
            let c = &self.counts.slots[ci];
            let gen = closing[due.iter().position(|&i| i == ci).unwrap_or(0)];
            let seen = self
                .counts
                .seen
                .entry(key.clone())
                .or_insert_with(|| KeySeen {
                    counts: vec![0; per_cpu.len()],
                    totals: vec![0; per_cpu.len()],
                    idle: 0,
                });
            let (mut count, mut total) = (0u64, 0u64);
            let (mut min, mut max) = (u64::MAX, 0u64);
            // Extremes of the closing generation, else (every event of the
            // interval came after its end, before this read) of the next.
            let (mut next_min, mut next_max) = (u64::MAX, 0u64);
            let half = |g: u64| usize::from(g & 1 == 1);
            for (cpu, v) in per_cpu.iter().enumerate() {
                let field = |i: usize| {
                    v.get(i * 8..i * 8 + 8)
                        .and_then(|b| b.try_into().ok())
                        .map_or(0, u64::from_ne_bytes)
                };
                let (n, t) = (field(0), field(1));
                if cpu >= seen.counts.len() {
                    seen.counts.resize(cpu + 1, 0);
                    seen.totals.resize(cpu + 1, 0);
                }
                let dn = n.wrapping_sub(seen.counts[cpu]);
                if dn == 0 {
                    continue;
                }
                count += dn;
                total = total.wrapping_add(t.wrapping_sub(seen.totals[cpu]));
                // count, total, min[2], max[2], gen[2]
                let (h, n_h) = (half(gen), half(gen + 1));
                if field(6 + h) == gen {
                    min = min.min(field(2 + h));
                    max = max.max(field(4 + h));
                } else if field(6 + n_h) == gen + 1 {
                    next_min = next_min.min(field(2 + n_h));
                    next_max = next_max.max(field(4 + n_h));
                }
                seen.counts[cpu] = n;
                seen.totals[cpu] = t;
            }
            if count == 0 {
                seen.idle += 1;
                if seen.idle >= IDLE_INTERVALS && map.delete(&key).is_ok() {
                    self.counts.seen.remove(&key);
                }
                continue;
            }
            seen.idle = 0;
            if min == u64::MAX {
                (min, max) = (next_min, next_max);
            }
            if min == u64::MAX {
                min = 0;
            }
            let mut row = vec![0u8; c.row_size];
            row[..8].copy_from_slice(&ts.to_le_bytes());
            for &(from, to, len) in &c.layout.copies {
                let (from, to, len) = (from as usize, to as usize, len as usize);
                if let (Some(dst), Some(src)) =
                    (row.get_mut(to..to + len), key.get(from..from + len))
                {
                    dst.copy_from_slice(src);
                }
            }
            let out = c.layout.count_out as usize;
            if let Some(dst) = row.get_mut(out..out + 8) {
                dst.copy_from_slice(&count.to_le_bytes());
            }
            if let Some(lat) = c.layout.latency_out {
                let lat = lat as usize;
                for (i, v) in [total, min, max].into_iter().enumerate() {
                    if let Some(dst) = row.get_mut(lat + i * 8..lat + i * 8 + 8) {
                        dst.copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
            if let Some(batch) = batches.get_mut(c.table) {
                batch.data.extend_from_slice(&row);
                batch.records += 1;
            }
        }
        for &i in &due {
            let c = &mut self.counts.slots[i];
            // The next end, without a catch-up burst after a late drain.
            let next = c.due + c.interval;
            c.due = if next <= now { now + c.interval } else { next };
        }
        Ok(())
    }

    /// Detaches every program, the last attached first: a joined event's
    /// entry goes before its exit, so no entry is left waiting (counted
    /// lost once a thread's entries pile up) for an exit already gone.
    fn detach(&mut self) {
        while let Some(link) = self.links.pop() {
            drop(link);
        }
    }

    /// Writes each count event's generation where its programs read it.
    fn publish_generations(&mut self) {
        let Some(bss) = self
            .skel
            .as_mut()
            .and_then(|s| s.maps.bss_data.as_deref_mut())
        else {
            return;
        };
        for c in &self.counts.slots {
            let slot = usize::from(c.slot) % MAX_SLOTS;
            // SAFETY: a u64 of the mapped .bss the programs read; volatile
            // so the store is not elided.
            unsafe { std::ptr::write_volatile(&mut bss.trace_count_gen[slot], c.gen) };
        }
    }

    fn lost_total(&self, slot: u32) -> u64 {
        per_cpu_sum(self.lost.as_ref(), slot)
    }

    /// One `trace_unmatched_exits` row per joined event whose exits without
    /// an entry grew since its last row, into `batch`.
    fn unmatched_rows(&mut self, batch: &mut Batch) {
        let ts = kernmlops_plugin_sdk::sys::clock::uptime_us();
        for i in 0..self.unmatched_seen.len() {
            let (slot, seen) = self.unmatched_seen[i];
            let now = per_cpu_sum(self.unmatched.as_ref(), slot);
            if now <= seen {
                continue;
            }
            self.unmatched_seen[i].1 = now;
            let mut row = [0u8; UNMATCHED_RECORD as usize];
            row[..8].copy_from_slice(&ts.to_le_bytes());
            row[8..16].copy_from_slice(&(now - seen).to_le_bytes());
            row[16..18].copy_from_slice(&u16::try_from(slot).unwrap_or(u16::MAX).to_le_bytes());
            batch.data.extend_from_slice(&row);
            batch.records += 1;
        }
    }
}

/// The sum over CPUs of a per-CPU u64 array's entry `slot` (0 when the map
/// is closed or the entry unreadable).
fn per_cpu_sum(map: Option<&MapHandle>, slot: u32) -> u64 {
    map.map_or(0, |m| kernmlops_plugin_bpf::per_cpu_sum(m, slot))
}

impl ProbeImpl for Trace {
    const NAME: &'static str = "trace";
    type Settings = Config;

    fn decl() -> ProbeDecl {
        ProbeDecl {
            name: Self::NAME.into(),
            description: "Any tracepoint or user function named in configuration, one typed table per event (tables: one per configured event)".into(),
            tables: Vec::new().into(),
        }
    }

    fn start(args: &StartArgs, config: Config) -> Result<Self> {
        let (plans, notes) = plan_all(&config)?;
        let laid = lay_out_all(&plans, config.comm)?;
        let mut tables: Vec<TableDecl> = laid.iter().map(|l| l.table.clone()).collect();
        let pending = Pending {
            data: tables.iter().map(|_| Vec::new()).collect(),
            records: vec![0; tables.len()],
            sizes: tables.iter().map(|t| t.record_size as usize).collect(),
            by_time: laid.iter().map(|l| !l.joined).collect(),
            malformed: vec![0; tables.len()],
        };
        // Joined events: their exits without an entry get a table of
        // their own, after the events' tables.
        let unmatched_seen: Vec<(u32, u64)> = (0u32..)
            .zip(&laid)
            .filter(|(_, l)| l.joined)
            .map(|(slot, _)| (slot, 0))
            .collect();
        if !unmatched_seen.is_empty() {
            if tables.iter().any(|t| t.name.as_str() == UNMATCHED_TABLE) {
                return Err(Error::config(format!(
                    "trace: an event's table is named {UNMATCHED_TABLE}, the table of joined events' unmatched exits: name the event otherwise"
                )));
            }
            tables.push(unmatched_table(&tables));
        }
        let mut probe = Trace {
            ring: None,
            links: Vec::new(),
            lost: None,
            unmatched: None,
            unmatched_seen,
            counts_map: None,
            stages: None,
            counts: Counts::default(),
            stopped: false,
            skel: None,
            storage: Box::into_raw(Box::new(MaybeUninit::uninit())),
            pending: Arc::new(Mutex::new(pending)),
            tables,
            notes,
        };
        if !plans.is_empty() {
            probe.load(args, &laid, &plans, config.count_entries)?;
        }
        Ok(probe)
    }

    fn drain(&mut self, timeout: Duration, batches: &mut [Batch]) -> Result<()> {
        if batches.len() != self.tables.len() {
            return Err(Error::new(format!(
                "trace: host passed {} batches for {} tables",
                batches.len(),
                self.tables.len()
            )));
        }
        // Wake for the next count interval's end.
        let timeout = match self.counts.slots.iter().map(|c| c.due).min() {
            Some(due) => timeout.min(due.saturating_duration_since(Instant::now())),
            None => timeout,
        };
        if let Some(ring) = self.ring.as_ref() {
            // A stop interrupts the wait with a signal (EINTR): not an error.
            let polled = ring.poll_raw(timeout);
            let flushed = match self.stages.as_mut() {
                Some(stages) => stages.flush_stale(),
                None => Ok(()),
            };
            let consumed = ring.consume_raw();
            flushed?;
            for (ret, what) in [(polled, "polling"), (consumed, "reading")] {
                if ret < 0 && ret != -libc::EINTR {
                    return Err(Error::new(format!(
                        "trace: {what} the ring: {}",
                        std::io::Error::from_raw_os_error(-ret)
                    )));
                }
            }
        } else if !timeout.is_zero() {
            kernmlops_plugin_sdk::schedule::nap(timeout);
        }
        let Ok(mut guard) = self.pending.lock() else {
            return Err(Error::new("trace: the ring's records are poisoned"));
        };
        let p = &mut *guard;
        for (i, batch) in batches.iter_mut().enumerate().take(p.data.len()) {
            if let Some(stages) = self.stages.as_mut() {
                // Records staged on CPUs gone offline, read at the stop.
                let leftover = stages.take_leftover(i);
                if !leftover.is_empty() && p.sizes[i] > 0 {
                    p.records[i] += (leftover.len() / p.sizes[i]) as u64;
                    p.data[i].extend_from_slice(&leftover);
                }
            }
            if p.by_time[i] {
                let size = p.sizes[i];
                sort_by_time(&mut p.data[i], size);
            }
            batch.data.extend_from_slice(&p.data[i]);
            batch.records += p.records[i];
            batch.malformed_total = p.malformed[i];
            p.data[i].clear();
            p.records[i] = 0;
        }
        let events = guard.data.len();
        drop(guard);
        self.count_rows(batches)?;
        if let Some(batch) = batches.get_mut(events) {
            self.unmatched_rows(batch);
        }
        for (i, batch) in batches.iter_mut().enumerate() {
            batch.lost_total = self.lost_total(i as u32);
        }
        Ok(())
    }

    fn stop(&mut self) -> Result<()> {
        self.detach();
        // The drain after the stop closes every count event's last interval
        // and takes the partial batches sent here.
        self.stopped = true;
        stage::flush_all(self.stages.as_mut())
    }

    fn tables(&self) -> Vec<TableDecl> {
        self.tables.clone()
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    fn bpf_stats(&self) -> Vec<kernmlops_plugin_sdk::api::BpfProgramStats> {
        let Some(skel) = self.skel.as_ref() else {
            return Vec::new();
        };
        skel.object()
            .progs()
            .filter_map(|p| {
                let info = program_info(p.as_fd())?;
                Some(kernmlops_plugin_sdk::api::BpfProgramStats {
                    name: p.name().to_string_lossy().into_owned().into(),
                    id: info.id,
                    run_cnt: info.run_cnt,
                    run_time_ns: info.run_time_ns,
                })
            })
            .collect()
    }
}

/// Orders one drain's records of a table (`size` bytes each) by their
/// time: staged batches of different CPUs arrive a batch at a time.
fn sort_by_time(data: &mut Vec<u8>, size: usize) {
    if size < 8 || data.len() % size != 0 || data.len() <= size {
        return;
    }
    let time = |r: &[u8]| u64::from_le_bytes([r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]]);
    let pairs = data.chunks_exact(size).zip(data.chunks_exact(size).skip(1));
    if pairs.clone().all(|(a, b)| time(a) <= time(b)) {
        return;
    }
    let mut rows: Vec<&[u8]> = data.chunks_exact(size).collect();
    rows.sort_by_key(|r| time(r));
    *data = rows.concat();
}

/// The kernel's `bpf_prog_info` of a loaded program (its run-time
/// statistics for `collector_overhead`).
fn program_info(fd: std::os::fd::BorrowedFd<'_>) -> Option<libbpf_rs::libbpf_sys::bpf_prog_info> {
    use std::os::fd::AsRawFd;
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

export_plugin! {
    description: "Trace anything by name: one typed table per tracepoint or user function named in [probes.trace] events",
    probes: [Trace],
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse_event;

    fn needed(events: &[&str]) -> std::result::Result<usize, String> {
        let specs: Vec<EventSpec> = events
            .iter()
            .map(|e| parse_event(e).expect("parses"))
            .collect();
        copies_needed(&specs.iter().collect::<Vec<_>>())
    }

    #[test]
    fn a_drains_records_are_ordered_by_time() {
        let rec = |ts: u64, tag: u8| {
            let mut r = vec![tag; 24];
            r[..8].copy_from_slice(&ts.to_le_bytes());
            r
        };
        // Two CPUs' batches: 5, 9 then 3, 7.
        let mut data = [rec(5, 1), rec(9, 2), rec(3, 3), rec(7, 4)].concat();
        sort_by_time(&mut data, 24);
        assert_eq!(data, [rec(3, 3), rec(5, 1), rec(7, 4), rec(9, 2)].concat());
        // Equal times keep their order; a ragged buffer is left alone.
        let mut same = [rec(1, 2), rec(1, 1)].concat();
        sort_by_time(&mut same, 24);
        assert_eq!(same, [rec(1, 2), rec(1, 1)].concat());
        let mut ragged = [rec(2, 0), rec(1, 0)].concat();
        ragged.push(0);
        let before = ragged.clone();
        sort_by_time(&mut ragged, 24);
        assert_eq!(ragged, before);
    }

    #[test]
    fn events_sharing_a_tracepoint_take_copies_of_its_program() {
        assert_eq!(needed(&["sched:sched_switch"]), Ok(1));
        // A joined pair's exit, and the same tracepoint recorded and
        // counted.
        assert_eq!(
            needed(&[
                "raw_syscalls:sys_enter(id) latency exit=raw_syscalls:sys_exit count",
                "raw_syscalls:sys_exit",
                "raw_syscalls:sys_enter",
                "tp_btf:sched_switch",
                "raw_tp:sched_switch count",
                "raw_tp:sched_switch count by=cpu",
                "raw_tp:sched_switch count by=pid",
                "raw_tp:sched_switch count by=comm",
            ]),
            Ok(2),
            "raw tracepoints take a program per slot, not a copy"
        );
        let five = [
            "sched:sched_switch",
            "sched:sched_switch count",
            "sched:sched_switch count by=cpu",
            "sched:sched_switch count by=pid",
            "sched:sched_switch count by=comm",
        ];
        let e = needed(&five).expect_err("five on one tracepoint");
        assert!(
            e.contains("5 events attach to tracepoint sched:sched_switch: at most 4"),
            "{e}"
        );
    }
}
