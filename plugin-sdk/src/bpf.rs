//! Running a libbpf-cargo skeleton as a probe: load with the verifier log
//! captured, attach every program (each checked), drain ring buffers into
//! the host's batches, and report lost events per table.

use std::{
    mem::MaybeUninit,
    ptr::null_mut,
    sync::{
        atomic::{AtomicPtr, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use libbpf_rs::{
    skel::Skel, ErrorKind, Link, MapCore, MapFlags, MapHandle, OpenObject, PrintLevel, RingBuffer,
    RingBufferBuilder,
};

use crate::{Batch, Error, ProbeDecl, ProbeImpl, Result, StartArgs};

/// What a BPF probe plugin provides; [`BpfProbe`] does the rest.
pub trait BpfSpec: Send + 'static {
    /// The probe's name, as users type it in `--plugins`.
    const NAME: &'static str;
    /// Settings with defaults, as for [`ProbeImpl::CONFIG_DEFAULTS`].
    const CONFIG_DEFAULTS: &'static str = "";
    /// Ring buffer map names, one per declared table, in table order.
    const RINGS: &'static [&'static str];
    /// The generated skeleton, loaded.
    type Skel: Skel<'static>;

    /// The probe and its tables, in the order of [`Self::RINGS`].
    fn decl() -> ProbeDecl;

    /// Opens the skeleton in `storage`, sets its tunables (use
    /// [`set_common_rodata!`](crate::set_common_rodata)) and ring sizes
    /// ([`size_rings`]) and loads it. Attaching is done by [`BpfProbe`].
    fn load(
        storage: &'static mut MaybeUninit<OpenObject>,
        args: &StartArgs,
    ) -> libbpf_rs::Result<Self::Skel>;
}

/// Sets the tunables every program gets from `bpf/kml.bpf.h`:
/// `set_common_rodata!(open_skel, args)`.
#[macro_export]
macro_rules! set_common_rodata {
    ($open:expr, $args:expr) => {{
        if let Some(ro) = $open.maps.rodata_data.as_deref_mut() {
            ro.kml_filter_tgid = $args.filter_tgid;
            ro.kml_filter_pid = $args.filter_pid;
            ro.kml_filter_cgroup_id = $args.filter_cgroup_id;
            ro.kml_self_tgid = $args.self_tgid;
            ro.kml_wakeup_bytes = $crate::bpf::wakeup_bytes($args.ring_bytes);
        }
    }};
}

/// Wake the consumer once a ring is a quarter full.
pub fn wakeup_bytes(ring_bytes: u64) -> u64 {
    (ring_bytes / 4).max(4096)
}

/// Sets every ring buffer map of an opened object to `args.ring_bytes`.
pub fn size_rings(obj: &mut libbpf_rs::OpenObject, args: &StartArgs) -> libbpf_rs::Result<()> {
    // The host validates the size; clamp rather than fail on a bad value.
    let bytes =
        u32::try_from(args.ring_bytes.clamp(4096, 1 << 30).next_power_of_two()).unwrap_or(1 << 30);
    for mut map in obj.maps_mut() {
        if map.map_type() == libbpf_rs::MapType::RingBuf {
            map.set_max_entries(bytes)?;
        }
    }
    Ok(())
}

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
/// of libbpf's log (the verifier's complaint) when there is one.
fn explain(what: &str, e: &libbpf_rs::Error) -> Error {
    // SAFETY: geteuid has no preconditions.
    let is_root = unsafe { libc::geteuid() } == 0;
    let hint = match e.kind() {
        // As root, EPERM means the kernel refuses the feature, not us.
        ErrorKind::PermissionDenied if !is_root => {
            " (needs root, or CAP_BPF and CAP_PERFMON; run with sudo)"
        }
        _ => "",
    };
    let log = LIBBPF_LOG.lock().map(|l| l.clone()).unwrap_or_default();
    // A verifier rejection comes back as EACCES, which reads like a
    // privilege problem: say what it is.
    let headline = if log.contains("PROG LOAD LOG") {
        format!("{what}: the kernel's BPF verifier rejected a program ({e})")
    } else {
        format!("{what}: {e:#}{hint}")
    };
    let tail: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = &tail[tail.len().saturating_sub(12)..];
    if tail.is_empty() {
        Error::new(headline)
    } else {
        Error::new(format!("{headline}\nlibbpf log:\n  {}", tail.join("\n  ")))
    }
}

/// A loaded and attached skeleton with its ring buffers.
///
/// Field order is drop order: the ring buffer and links go before the
/// skeleton, and the skeleton before the storage it borrows.
pub struct BpfProbe<S: BpfSpec> {
    ring: Option<RingBuffer<'static>>,
    links: Vec<Link>,
    lost: MapHandle,
    /// Where ring callbacks append: the batch of their table while `drain`
    /// runs, null otherwise.
    slots: Vec<Arc<AtomicPtr<Batch>>>,
    skel: Option<S::Skel>,
    storage: *mut MaybeUninit<OpenObject>,
}

// SAFETY: a BpfProbe owns everything it points to (libbpf objects, the leaked
// storage); none of it is tied to the thread that created it, and `&mut self`
// methods keep use to one thread at a time.
unsafe impl<S: BpfSpec> Send for BpfProbe<S> {}

impl<S: BpfSpec> BpfProbe<S> {
    fn open(args: &StartArgs) -> Result<Self> {
        libbpf_rs::set_print(Some((PrintLevel::Info, capture_libbpf_log)));
        if let Ok(mut log) = LIBBPF_LOG.lock() {
            log.clear();
        }
        let storage: *mut MaybeUninit<OpenObject> = Box::into_raw(Box::new(MaybeUninit::uninit()));
        // SAFETY: `storage` is a fresh allocation freed only in `Drop`, after
        // the skeleton that borrows it is gone.
        let skel = match S::load(unsafe { &mut *storage }, args) {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: the failed load dropped everything that borrowed it.
                drop(unsafe { Box::from_raw(storage) });
                return Err(explain(&format!("loading {}", S::NAME), &e));
            }
        };
        let mut probe = Self {
            ring: None,
            links: Vec::new(),
            lost: {
                let map = skel
                    .object()
                    .maps()
                    .find(|m| m.name() == "kml_lost")
                    .ok_or_else(|| {
                        Error::new("BPF object has no kml_lost map: include kml.bpf.h")
                    })?;
                MapHandle::try_from(&map).map_err(|e| explain("opening kml_lost", &e))?
            },
            slots: Vec::new(),
            skel: Some(skel),
            storage,
        };
        probe.attach()?;
        probe.build_rings(&S::decl())?;
        Ok(probe)
    }

    fn attach(&mut self) -> Result<()> {
        let Some(skel) = self.skel.as_ref() else {
            return Err(Error::new("skeleton already dropped"));
        };
        for prog in skel.object().progs_mut() {
            if !prog.autoload() {
                continue;
            }
            let name = prog.name().to_string_lossy().into_owned();
            let link = prog
                .attach()
                .map_err(|e| explain(&format!("attaching {}/{name}", S::NAME), &e))?;
            self.links.push(link);
        }
        Ok(())
    }

    fn build_rings(&mut self, decl: &ProbeDecl) -> Result<()> {
        let Some(skel) = self.skel.as_ref() else {
            return Err(Error::new("skeleton already dropped"));
        };
        if decl.tables.len() != S::RINGS.len() {
            return Err(Error::new(format!(
                "{} declares {} tables but names {} ring buffers",
                S::NAME,
                decl.tables.len(),
                S::RINGS.len()
            )));
        }
        let maps: Vec<_> = skel.object().maps().collect();
        let mut builder = RingBufferBuilder::new();
        for (ring_name, table) in S::RINGS.iter().zip(decl.tables.iter()) {
            let map = maps
                .iter()
                .find(|m| m.name() == *ring_name)
                .ok_or_else(|| {
                    Error::new(format!("BPF object has no ring buffer map {ring_name}"))
                })?;
            let slot = Arc::new(AtomicPtr::new(null_mut()));
            self.slots.push(slot.clone());
            let record_size = table.record_size as usize;
            builder
                .add(map, move |data: &[u8]| {
                    let p = slot.load(Ordering::Relaxed);
                    if p.is_null() {
                        return 0;
                    }
                    // SAFETY: `drain` stores a pointer to a batch it holds by
                    // `&mut` and clears it before returning; callbacks run only
                    // inside `poll`/`consume` called from `drain`.
                    let batch = unsafe { &mut *p };
                    if data.len() >= record_size {
                        batch.data.extend_from_slice(&data[..record_size]);
                    } else {
                        batch.data.extend_from_slice(data);
                        for _ in data.len()..record_size {
                            batch.data.push(0);
                        }
                    }
                    batch.records += 1;
                    0
                })
                .map_err(|e| explain(&format!("opening ring buffer {ring_name}"), &e))?;
        }
        self.ring = Some(
            builder
                .build()
                .map_err(|e| explain("building ring buffers", &e))?,
        );
        Ok(())
    }

    fn lost_total(&self, table: u32) -> u64 {
        match self.lost.lookup_percpu(&table.to_ne_bytes(), MapFlags::ANY) {
            Ok(Some(per_cpu)) => per_cpu
                .iter()
                .filter_map(|v| v.get(..8).and_then(|b| b.try_into().ok()))
                .map(u64::from_ne_bytes)
                .sum(),
            _ => 0,
        }
    }
}

impl<S: BpfSpec> ProbeImpl for BpfProbe<S> {
    const NAME: &'static str = S::NAME;
    const CONFIG_DEFAULTS: &'static str = S::CONFIG_DEFAULTS;

    fn decl() -> ProbeDecl {
        S::decl()
    }

    fn start(args: &StartArgs) -> Result<Self> {
        Self::open(args)
    }

    fn drain(&mut self, timeout: Duration, batches: &mut [Batch]) -> Result<()> {
        if batches.len() != self.slots.len() {
            return Err(Error::new(format!(
                "host passed {} batches for {} tables",
                batches.len(),
                self.slots.len()
            )));
        }
        let Some(ring) = self.ring.as_ref() else {
            return Err(Error::new("ring buffers are closed"));
        };
        for (slot, batch) in self.slots.iter().zip(batches.iter_mut()) {
            slot.store(batch as *mut Batch, Ordering::Relaxed);
        }
        // Wait for a wake-up (a ring past its threshold) or the timeout, then
        // take everything, since below-threshold records do not wake us.
        let polled = ring.poll_raw(timeout);
        let consumed = ring.consume_raw();
        for slot in &self.slots {
            slot.store(null_mut(), Ordering::Relaxed);
        }
        for (ret, what) in [(polled, "polling"), (consumed, "consuming")] {
            if ret < 0 && ret != -libc::EINTR {
                return Err(Error::new(format!(
                    "{what} ring buffers: {}",
                    std::io::Error::from_raw_os_error(-ret)
                )));
            }
        }
        for (i, batch) in batches.iter_mut().enumerate() {
            batch.lost_total = self.lost_total(i as u32);
        }
        Ok(())
    }

    fn stop(&mut self) -> Result<()> {
        // Dropping a link detaches its program; the rings stay for the last drain.
        self.links.clear();
        Ok(())
    }
}

impl<S: BpfSpec> Drop for BpfProbe<S> {
    fn drop(&mut self) {
        self.ring = None;
        self.links.clear();
        self.skel = None;
        // SAFETY: allocated by `Box::into_raw` in `open`; the skeleton that
        // borrowed it was dropped just above.
        drop(unsafe { Box::from_raw(self.storage) });
    }
}
