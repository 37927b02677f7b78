//! BPF probes for kernmlops plugins. A probe is one C struct per table
//! (shared with the kernel in `src/bpf/<name>.h`), one BPF program, and a
//! [`bpf_probe!`] declaration: each table's record type, ring buffer,
//! expected rate and columns, one line per column (or, for a table whose
//! rows user space makes from the skeleton's maps, `from_maps` instead of
//! the ring: see [`BpfProbe::skel`]). The macro expands to the
//! skeleton module, the [`BpfSpec`] (default load: open, the common
//! tunables of `kml.bpf.h`, ring sizes), and, unless the probe brings its
//! own, empty [`BpfHooks`]. [`BpfProbe`] runs it: hooks before load, load
//! with the verifier log captured, attach each program (checked), drain the
//! rings into the host's batches, report losses and malformed records.
//!
//! ```ignore
//! kernmlops_plugin_bpf::bpf_probe! {
//!     probe: QuantaRuntime,
//!     name: "quanta_runtime",
//!     description: "Scheduler quanta: on-CPU run length and run-queue wait per task",
//!     tables: [
//!         quanta_runtime(runtime_ring, quanta_runtime_event, rate = 200_000):
//!             "One row per context switch: how long the switched-out task ran" {
//!             ts_uptime_us [us]: "when the quantum ended (CLOCK_BOOTTIME)",
//!             cpu: "CPU the task ran on",
//!         },
//!     ],
//! }
//! kernmlops_plugin_sdk::export_plugin! {
//!     description: "Scheduler quanta",
//!     probes: [BpfProbe<QuantaRuntime>],
//! }
//! ```

mod probe;
pub mod stage;

use std::{cell::OnceCell, collections::BTreeMap};

pub use kernmlops_plugin_sdk::{self as sdk, export_plugin, table, Batch, Error, Result};
use kernmlops_plugin_sdk::{settings::Settings, Record, StartArgs, TableDecl};
pub use libbpf_rs;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
pub use probe::{per_cpu_sum, BpfProbe};

/// One ring buffer map of a probe, feeding one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ring {
    /// The map's name in the BPF object.
    pub map: &'static str,
    /// Records per second the table is expected to take on a busy machine;
    /// sizes the ring when the run does not set `--ring-size`.
    pub rate: u64,
}

/// The common tunables every program gets from `kml.bpf.h`, set before
/// load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Common {
    pub filter_tgid: u32,
    pub filter_pid: u32,
    pub filter_cgroup_id: u64,
    pub filter_cgroup_descendants: bool,
    /// The collector's process, left out in the kernel; 0 keeps it.
    pub self_tgid: u32,
    /// Per table: wake the consumer once this many bytes wait in its ring.
    pub wakeup_bytes: [u64; MAX_TABLES],
    /// Per table: check the ring's fill level every `mask + 1` records.
    pub wakeup_mask: [u32; MAX_TABLES],
    /// Staged output in use (`KML_STAGED`); off where the flush program
    /// cannot be run on a chosen CPU.
    pub stage_on: bool,
    /// Per table: the bytes a staged batch goes out at (0: the stage's
    /// size, `KML_STAGE_BYTES`).
    pub stage_limit: [u32; MAX_TABLES],
}

/// Tables a probe may have (`KML_MAX_TABLES` in `kml.bpf.h`).
pub const MAX_TABLES: usize = 8;

/// The skeleton opened (not loaded) for probe `P`.
pub type Open<P> = <<P as BpfSpec>::Builder as SkelBuilder<'static>>::Output;
/// The skeleton loaded for probe `P`.
pub type Loaded<P> = <Open<P> as OpenSkel<'static>>::Output;

/// What [`bpf_probe!`] declares about a probe.
pub trait BpfSpec: Default + Send + 'static {
    /// The probe's name, as users type it in `--plugins`.
    const NAME: &'static str;
    const DESCRIPTION: &'static str;
    /// Per table, in table order: its ring, or `None` for a table whose
    /// rows the probe makes from its maps (declared `from_maps`).
    const RINGS: &'static [Option<Ring>];
    /// The probe's settings (`[probes.<name>]`).
    type Settings: Settings;
    /// The libbpf-cargo skeleton builder.
    type Builder: SkelBuilder<'static> + Default;

    /// The tables, in the order of [`Self::RINGS`].
    fn tables() -> Vec<TableDecl>;

    /// Sets the tunables of `kml.bpf.h` in the opened skeleton.
    fn set_common(open: &mut Open<Self>, common: &Common);
}

/// What a probe may do beyond the default load-attach-drain. Every hook has
/// a no-op default; `bpf_probe!` implements them all as no-ops unless the
/// declaration says `hooks: custom`.
pub trait BpfHooks: BpfSpec {
    /// Before load: decide which programs load (`set_autoload(false)`),
    /// size maps from the settings, record notes. Use the feature checks of
    /// [`LoadContext::features`] to decide up front instead of failing and
    /// retrying, as bcc's libbpf-tools do.
    fn before_load(
        &mut self,
        open: &mut Open<Self>,
        cx: &mut LoadContext<'_, Self::Settings>,
    ) -> Result<()> {
        let _ = (open, cx);
        Ok(())
    }

    /// Rows to put first in the tables, made once after the programs are
    /// attached (so a task created in between has a row from each side
    /// rather than none), at the first drain: `batches[i]` is table `i`'s.
    fn initial_records(&mut self, args: &StartArgs, batches: &mut [Batch]) -> Result<()> {
        let _ = (args, batches);
        Ok(())
    }

    /// Completes the records of table `table` drained from the kernel
    /// (paths from ids, say), before they reach the host.
    fn fix_records(&mut self, table: usize, records: &mut Records<'_>) -> Result<()> {
        let _ = (table, records);
        Ok(())
    }
}

/// The records of one table taken in one drain, for [`BpfHooks::fix_records`].
pub struct Records<'a> {
    data: &'a mut [u8],
    record_size: usize,
}

impl<'a> Records<'a> {
    pub(crate) fn new(data: &'a mut [u8], record_size: usize) -> Self {
        Self { data, record_size }
    }

    pub fn len(&self) -> usize {
        self.data.len() / self.record_size.max(1)
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Copies of the records as `R` (the table's record type).
    pub fn read<R: Record>(&self) -> Vec<R> {
        self.check::<R>();
        self.data
            .chunks_exact(self.record_size)
            // SAFETY: each chunk holds size_of::<R>() bytes (checked) and
            // every bit pattern is a valid `R`; no alignment is needed.
            .map(|c| unsafe { std::ptr::read_unaligned(c.as_ptr().cast::<R>()) })
            .collect()
    }

    /// Calls `f` on each record as `R` and writes it back.
    pub fn update<R: Record>(&mut self, mut f: impl FnMut(&mut R)) {
        self.check::<R>();
        for c in self.data.chunks_exact_mut(self.record_size) {
            // SAFETY: as in `read`.
            let mut r = unsafe { std::ptr::read_unaligned(c.as_ptr().cast::<R>()) };
            f(&mut r);
            // SAFETY: `Record` types have no padding: all bytes of `r` are
            // initialised, and `c` has exactly that many.
            let bytes = unsafe {
                std::slice::from_raw_parts((&r as *const R).cast::<u8>(), self.record_size)
            };
            c.copy_from_slice(bytes);
        }
    }

    fn check<R: Record>(&self) {
        assert_eq!(
            std::mem::size_of::<R>(),
            self.record_size,
            "the record type's size differs from the table's record size"
        );
    }
}

/// What [`BpfHooks::before_load`] gets: the run's arguments, the probe's
/// settings, the kernel's features, and where notes go.
pub struct LoadContext<'a, S> {
    pub args: &'a StartArgs,
    pub settings: &'a S,
    pub features: &'a Features,
    notes: Vec<String>,
}

impl<S> LoadContext<'_, S> {
    /// Records what the probe skips on this machine (one sentence). The
    /// host prints it, records it in the manifest, and fails the probe
    /// under `--strict`.
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }
}

/// Kernel feature checks, the same ones the host reports
/// (`kernmlops_sys::features`), evaluated on first use.
///
/// Names are looked up in the kernel's BTF as libbpf reads it (mapped from
/// `/sys/kernel/btf/vmlinux`, not copied: about 3 ms of CPU, against 10 ms
/// for reading and indexing it with `kernmlops_sys::btf`, which only
/// [`Features::btf_has_field`] needs). Every probe of a run starts at once,
/// each with its own checks, so this is paid once per probe that asks.
#[derive(Default)]
pub struct Features {
    btf: OnceCell<Option<libbpf_rs::btf::Btf<'static>>>,
    indexed_btf: OnceCell<Option<kernmlops_sys::btf::Btf>>,
    fentry: std::cell::RefCell<
        BTreeMap<String, std::result::Result<(), kernmlops_sys::features::FeatureError>>,
    >,
}

impl Features {
    fn btf(&self) -> Option<&libbpf_rs::btf::Btf<'static>> {
        self.btf
            .get_or_init(|| libbpf_rs::btf::Btf::from_vmlinux().ok())
            .as_ref()
    }

    fn indexed_btf(&self) -> Option<&kernmlops_sys::btf::Btf> {
        self.indexed_btf
            .get_or_init(|| kernmlops_sys::btf::Btf::vmlinux().ok())
            .as_ref()
    }

    /// The id of the first type of this name (and of this kind, when
    /// given) in the kernel's BTF.
    fn btf_id(&self, name: &str, kind: Option<u32>) -> Option<u32> {
        use libbpf_rs::AsRawLibbpf as _;
        let btf = self.btf()?.as_libbpf_object();
        let name = std::ffi::CString::new(name).ok()?;
        // SAFETY: `btf` is a live libbpf BTF (owned by `self`) and `name` a
        // NUL-terminated string; libbpf only reads both.
        let id = unsafe {
            match kind {
                Some(kind) => {
                    libbpf_rs::libbpf_sys::btf__find_by_name_kind(btf.as_ptr(), name.as_ptr(), kind)
                }
                None => libbpf_rs::libbpf_sys::btf__find_by_name(btf.as_ptr(), name.as_ptr()),
            }
        };
        u32::try_from(id).ok()
    }

    /// Whether an fentry/fexit program can attach to `kernel_function`
    /// here (the kernel allows trampolines, and the function is in BTF).
    pub fn fentry_attachable(
        &self,
        kernel_function: &str,
    ) -> std::result::Result<(), kernmlops_sys::features::FeatureError> {
        use kernmlops_sys::features::{fentry_attachable_id, FeatureError};
        self.fentry
            .borrow_mut()
            .entry(kernel_function.to_owned())
            .or_insert_with(|| {
                if self.btf().is_none() {
                    return Err(FeatureError::NoBtf {
                        why: "libbpf could not load the kernel's BTF".into(),
                    });
                }
                let id = self.btf_id(kernel_function, Some(libbpf_rs::libbpf_sys::BTF_KIND_FUNC));
                fentry_attachable_id(kernel_function, id)
            })
            .clone()
    }

    /// Whether tracefs has `events/<system>/<event>`.
    pub fn tracepoint_exists(&self, system: &str, event: &str) -> bool {
        kernmlops_sys::tracefs::tracepoint_exists(system, event)
    }

    /// Whether the syscall has enter and exit tracepoints here.
    pub fn syscall_tracepoints(&self, syscall: &str) -> bool {
        kernmlops_sys::tracefs::syscall_tracepoints_exist(syscall)
    }

    /// Whether the kernel's BTF has a type of this name (a struct, a
    /// function, `btf_trace_<tracepoint>` for a raw tracepoint).
    pub fn btf_has_type(&self, name: &str) -> bool {
        self.btf_id(name, None).is_some()
    }

    /// Whether the kernel's struct has this field (searching its anonymous
    /// members too).
    pub fn btf_has_field(&self, struct_name: &str, field: &str) -> bool {
        self.indexed_btf()
            .is_some_and(|b| b.has_struct_field(struct_name, field))
    }
}

/// Ring size for a table expected to take `rate` records per second of
/// `record_size` bytes: room for an eighth of a second of records, a power
/// of two from 64 KiB to 16 MiB. The probe wakes the drain when its ring is
/// a quarter full, so at the declared rate the drain has at least 90 ms to
/// answer before anything is lost; a mapped ring counts twice its size in
/// the collector's RSS (the kernel maps its pages twice).
pub fn ring_bytes_for(rate: u64, record_size: usize) -> u64 {
    let want = rate.saturating_mul(record_size as u64) / 8;
    want.clamp(64 << 10, 16 << 20).next_power_of_two()
}

/// The wake-up threshold of a ring of `ring_bytes`: a quarter of it, so
/// the consumer is woken before the ring fills whatever its size.
pub fn wakeup_bytes(ring_bytes: u64) -> u64 {
    (ring_bytes / 4).max(1)
}

/// How often (a power of two of records) a ring's fill level is checked:
/// at most every 64 records, and at least four times before the records
/// between two checks could take the ring from its threshold to full.
pub fn wakeup_check_every(ring_bytes: u64, record_size: usize) -> u32 {
    let room = ring_bytes.saturating_sub(wakeup_bytes(ring_bytes));
    let records = room / (4 * record_size.max(1) as u64).max(1);
    let every = records.clamp(1, 64);
    // The largest power of two not above it.
    1u32 << (63 - every.leading_zeros())
}

/// Not public API: used by the code [`bpf_probe!`] and [`settings!`]
/// generate.
#[doc(hidden)]
pub mod __private {
    pub use kernmlops_plugin_sdk::{
        __private::serde, settings::NoSettings, table, ColumnKind, ProbeDecl, Record, TableDecl,
    };
}

/// `kernmlops_plugin_sdk::settings!` for BPF plugins, which depend on this
/// crate only.
#[macro_export]
macro_rules! settings {
    ($($body:tt)*) => {
        $crate::sdk::__settings_with_serde! { "kernmlops_plugin_bpf::__private::serde", $($body)* }
    };
}

/// Defines `mod skel`, the libbpf-cargo skeleton of `src/bpf/<plugin>.bpf.c`
/// that `kernmlops-plugin-build` generated into the calling crate's
/// `OUT_DIR`. [`bpf_probe!`] defines it; a probe implementing `ProbeImpl`
/// itself over its skeleton uses this macro alone.
#[macro_export]
macro_rules! bpf_skel {
    () => {
        /// The probe's libbpf-cargo skeleton, generated into `OUT_DIR`.
        #[allow(
            clippy::all,
            clippy::undocumented_unsafe_blocks,
            dead_code,
            missing_docs,
            non_camel_case_types,
            unused_imports
        )]
        pub mod skel {
            include!(concat!(env!("OUT_DIR"), "/kml_skel.rs"));
        }
    };
}

/// Declares a BPF probe over the skeleton of `src/bpf/<plugin>.bpf.c` (built
/// by `kernmlops-plugin-build`): its name, description, optional settings
/// type and custom hooks, and its tables, each with its ring buffer map,
/// record type (a struct of the `.h`), expected records per second, and
/// columns (see `kernmlops_plugin_sdk::table!` for the column syntax).
/// A table written `name(from_maps, record)` has no ring: the probe's own
/// `ProbeImpl` makes its rows from the skeleton's maps ([`BpfProbe::skel`]),
/// and [`BpfProbe`] only reports its losses (`kml_lost`).
///
/// Defines `mod skel` (the generated skeleton: `skel::types::<struct>`,
/// `skel::Open`, programs and maps) and implements [`BpfSpec`] for the probe
/// type. Without `hooks: custom` it also defines the probe type as a unit
/// struct with no-op [`BpfHooks`]; with it, the plugin defines the type
/// (`Default`) and implements `BpfHooks` itself.
#[macro_export]
macro_rules! bpf_probe {
    (
        probe: $probe:ident,
        name: $name:expr,
        description: $desc:expr,
        $(settings: $settings:ty,)?
        $(hooks: $custom:ident,)?
        tables: [
            $(
                $table:ident($($source:tt)*): $tdesc:literal
                { $($columns:tt)* }
            ),+ $(,)?
        ] $(,)?
    ) => {
        $crate::bpf_skel!();

        $crate::__bpf_probe_type!($probe $(, $custom)?);

        impl $crate::BpfSpec for $probe {
            const NAME: &'static str = $name;
            const DESCRIPTION: &'static str = $desc;
            const RINGS: &'static [::std::option::Option<$crate::Ring>] = &[
                $($crate::__bpf_ring!($($source)*),)+
            ];
            type Settings = $crate::__bpf_settings!($($settings)?);
            type Builder = skel::Builder;

            fn tables() -> ::std::vec::Vec<$crate::__private::TableDecl> {
                ::std::vec![
                    $(
                        $crate::__private::table!(
                            $crate::__bpf_record!($($source)*) => stringify!($table), $tdesc, { $($columns)* }
                        ),
                    )+
                ]
            }

            fn set_common(open: &mut $crate::Open<Self>, c: &$crate::Common) {
                if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
                    ro.kml_filter_tgid = c.filter_tgid;
                    ro.kml_filter_pid = c.filter_pid;
                    ro.kml_filter_cgroup_id = c.filter_cgroup_id;
                    ro.kml_filter_cgroup_descendants = u32::from(c.filter_cgroup_descendants);
                    ro.kml_stage_on = u32::from(c.stage_on);
                    ro.kml_stage_limit = c.stage_limit;
                    ro.kml_self_tgid = c.self_tgid;
                    ro.kml_wakeup_bytes = c.wakeup_bytes;
                    ro.kml_wakeup_mask = c.wakeup_mask;
                }
            }
        }

        $(
            // SAFETY: the skeleton's record types are `#[repr(C)]` structs of
            // integers and byte arrays generated from the `.h` shared with the
            // kernel, with every gap filled by explicit padding fields.
            unsafe impl $crate::__private::Record for $crate::__bpf_record!($($source)*) {}
        )+
    };
}

/// A table's ring in [`bpf_probe!`]: `None` for `from_maps`.
#[doc(hidden)]
#[macro_export]
macro_rules! __bpf_ring {
    (from_maps, $record:ident) => {
        ::std::option::Option::None
    };
    ($ring:ident, $record:ident, rate = $rate:expr) => {
        ::std::option::Option::Some($crate::Ring {
            map: stringify!($ring),
            rate: $rate,
        })
    };
}

/// A table's record type in [`bpf_probe!`], from the skeleton.
#[doc(hidden)]
#[macro_export]
macro_rules! __bpf_record {
    (from_maps, $record:ident) => {
        skel::types::$record
    };
    ($ring:ident, $record:ident, rate = $rate:expr) => {
        skel::types::$record
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __bpf_probe_type {
    ($probe:ident) => {
        /// The probe (declared with `bpf_probe!`).
        #[derive(Default)]
        pub struct $probe;

        impl $crate::BpfHooks for $probe {}
    };
    ($probe:ident, custom) => {};
}

#[doc(hidden)]
#[macro_export]
macro_rules! __bpf_settings {
    () => {
        $crate::__private::NoSettings
    };
    ($settings:ty) => {
        $settings
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_hold_an_eighth_of_a_second_within_bounds() {
        assert_eq!(ring_bytes_for(400_000, 24), 2 << 20);
        assert_eq!(ring_bytes_for(1, 24), 64 << 10);
        assert_eq!(ring_bytes_for(u64::MAX, 4096), 16 << 20);
    }

    #[test]
    fn fill_checks_come_before_the_ring_can_fill() {
        for ring in [4096u64, 16 << 10, 1 << 20, 16 << 20] {
            for rs in [16usize, 24, 48, 4680] {
                let every = wakeup_check_every(ring, rs);
                assert!(every.is_power_of_two() && (1..=64).contains(&every));
                let room = ring - wakeup_bytes(ring);
                assert!(
                    u64::from(every) * rs as u64 <= room.max(rs as u64),
                    "ring {ring}, record {rs}: checks every {every} records"
                );
            }
        }
        assert_eq!(wakeup_check_every(16 << 20, 24), 64);
        assert_eq!(wakeup_check_every(4096, 4680), 1);
    }
}
