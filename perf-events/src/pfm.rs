//! libpfm4, loaded at run time with `dlopen`: model-specific event names
//! (Intel, AMD and Arm core and uncore PMUs) turned into `perf_event_attr`
//! in process, and the event tables of the PMUs this machine has. Nothing is
//! needed at build time; without the library, generic and sysfs events still
//! work and callers say to install it.
//!
//! The declarations below mirror `/usr/include/perfmon/pfmlib.h` and
//! `pfmlib_perf_event.h` of libpfm 4.13 (ABI revision 0): the structure sizes
//! are checked against the header's `*_ABI0` constants at compile time, and
//! every structure is passed with its `size` field set, as the library
//! requires, so newer versions fill only what we know.

use std::{
    ffi::{c_char, c_int, c_uint, c_void, CStr, CString},
    sync::{Mutex, OnceLock},
};

use crate::{
    EventSpec, PerfEventAttr, Resolved, PERF_TYPE_HARDWARE, PERF_TYPE_HW_CACHE, PERF_TYPE_RAW,
    PERF_TYPE_SOFTWARE, PERF_TYPE_TRACEPOINT,
};

/// The library's soname, searched the usual way (`ld.so.conf`,
/// `LD_LIBRARY_PATH`).
pub const SONAME: &str = "libpfm.so.4";
/// Names another file to load instead of [`SONAME`] (tests use a missing
/// file to see the behaviour of a machine without libpfm4).
pub const PATH_ENV: &str = "KERNMLOPS_LIBPFM";
/// What a user without the library should do.
pub const INSTALL_HINT: &str =
    "install libpfm4 to resolve model-specific events (Debian and Ubuntu: apt-get install libpfm4)";

/// `pfm_err_t` codes of `pfmlib.h`.
pub const PFM_SUCCESS: c_int = 0;
pub const PFM_ERR_NOTFOUND: c_int = -4;
pub const PFM_ERR_UMASK: c_int = -6;

/// `pfm_os_t`: every perf_event attribute plus the PMU's own.
const PFM_OS_PERF_EVENT_EXT: c_int = 2;
/// Privilege levels for `dfl_plm`: kernel and user, as perf counts by
/// default. Only `exclude_*` bits follow from them, and those are not used.
const PFM_PLM0: c_int = 0x01;
const PFM_PLM3: c_int = 0x08;

/// `pfm_pmu_type_t`.
const PFM_PMU_TYPE_CORE: c_int = 1;
const PFM_PMU_TYPE_UNCORE: c_int = 2;
const PFM_PMU_TYPE_OS_GENERIC: c_int = 3;

/// `pfm_attr_t`.
const PFM_ATTR_UMASK: c_int = 1;
const PFM_ATTR_MOD_BOOL: c_int = 2;
const PFM_ATTR_MOD_INTEGER: c_int = 3;

/// PMU identifiers (`pfm_pmu_t`) are small integers that only grow
/// (`PFM_PMU_MAX` is 517 in 4.13); ids past the library's end are refused
/// with an error, so scanning this far covers newer versions too.
const PMU_ID_LIMIT: c_int = 4096;

/// `pfm_pmu_info_t`.
#[repr(C)]
struct PmuInfo {
    name: *const c_char,
    desc: *const c_char,
    size: usize,
    pmu: c_int,
    type_: c_int,
    nevents: c_int,
    first_event: c_int,
    max_encoding: c_int,
    num_cntrs: c_int,
    num_fixed_cntrs: c_int,
    /// Bit 0: present on this machine; bit 1: the architecture's default.
    flags: c_uint,
}

/// `pfm_event_info_t`.
#[repr(C)]
struct EventInfo {
    name: *const c_char,
    desc: *const c_char,
    equiv: *const c_char,
    size: usize,
    code: u64,
    pmu: c_int,
    dtype: c_int,
    idx: c_int,
    nattrs: c_int,
    reserved: c_int,
    flags: c_uint,
}

/// `pfm_event_attr_info_t`.
#[repr(C)]
struct AttrInfo {
    name: *const c_char,
    desc: *const c_char,
    equiv: *const c_char,
    size: usize,
    code: u64,
    type_: c_int,
    idx: c_int,
    ctrl: c_int,
    /// Bit 0: the default unit mask.
    flags: c_uint,
    /// A union of a u64, a string pointer and ints.
    defaults: u64,
}

/// `pfm_perf_encode_arg_t`.
#[repr(C)]
struct PerfEncodeArg {
    attr: *mut PerfEventAttr,
    fstr: *mut *mut c_char,
    size: usize,
    idx: c_int,
    cpu: c_int,
    flags: c_int,
    pad0: c_int,
}

// The header's ABI revision 0 sizes (64-bit).
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(std::mem::size_of::<PmuInfo>() == 56);
    assert!(std::mem::size_of::<EventInfo>() == 64);
    assert!(std::mem::size_of::<AttrInfo>() == 64);
    assert!(std::mem::size_of::<PerfEncodeArg>() == 40);
};

/// `new()` for libpfm's info structs as the library wants them passed:
/// the string pointers (`$ptr`) null, `size` the struct's own size (the
/// library checks it), the integers (`$int`) zero and the `$field`s as
/// given.
macro_rules! blank_info {
    ($ty:ident { $($ptr:ident),+; $($int:ident),+ } $(, $field:ident: $v:expr)*) => {
        impl $ty {
            fn new() -> Self {
                Self {
                    $($ptr: std::ptr::null(),)+
                    size: std::mem::size_of::<Self>(),
                    $($int: 0,)+
                    $($field: $v,)*
                }
            }
        }
    };
}

blank_info!(PmuInfo { name, desc; pmu, type_, nevents, max_encoding, num_cntrs, num_fixed_cntrs, flags }, first_event: -1);
blank_info!(EventInfo { name, desc, equiv; code, pmu, dtype, idx, nattrs, reserved, flags });
blank_info!(AttrInfo { name, desc, equiv; code, type_, idx, ctrl, flags, defaults });

type InitializeFn = unsafe extern "C" fn() -> c_int;
type StrerrorFn = unsafe extern "C" fn(c_int) -> *const c_char;
type GetPmuInfoFn = unsafe extern "C" fn(c_int, *mut PmuInfo) -> c_int;
type GetEventNextFn = unsafe extern "C" fn(c_int) -> c_int;
type GetEventInfoFn = unsafe extern "C" fn(c_int, c_int, *mut EventInfo) -> c_int;
type GetEventAttrInfoFn = unsafe extern "C" fn(c_int, c_int, c_int, *mut AttrInfo) -> c_int;
type GetOsEventEncodingFn = unsafe extern "C" fn(*const c_char, c_int, c_int, *mut c_void) -> c_int;

/// The loaded and initialised library. The handle stays open for the life
/// of the process.
pub struct Libpfm {
    path: String,
    strerror: StrerrorFn,
    get_pmu_info: GetPmuInfoFn,
    get_event_next: GetEventNextFn,
    get_event_info: GetEventInfoFn,
    get_event_attr_info: GetEventAttrInfoFn,
    get_os_event_encoding: GetOsEventEncodingFn,
    /// libpfm4 keeps global state and does not promise thread safety:
    /// every call goes through this lock.
    lock: Mutex<()>,
}

impl std::fmt::Debug for Libpfm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Libpfm").field("path", &self.path).finish()
    }
}

/// What libpfm4 calls a PMU's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PmuKind {
    /// A processor core's counters.
    Core,
    /// Socket-level counters (caches, memory controllers, interconnect).
    Uncore,
    /// perf's own generic events (`perf`, `perf_raw`).
    OsGeneric,
    Unknown,
}

/// A PMU libpfm4 detected on this machine.
#[derive(Debug, Clone)]
pub struct PfmPmu {
    pub id: i32,
    /// libpfm4's name, e.g. `skl`, `amd64_fam19h_zen4`, `perf`.
    pub name: String,
    pub description: String,
    pub kind: PmuKind,
    pub nevents: i32,
    /// Generic and fixed counters (0 where libpfm4 does not say).
    pub counters: i32,
    pub fixed_counters: i32,
    first_event: c_int,
}

/// A unit mask of an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PfmUmask {
    pub name: String,
    pub description: String,
    /// The unit mask's code as libpfm4 keeps it (not always the final bits).
    pub code: u64,
    /// Used when the event is named without a unit mask.
    pub is_default: bool,
}

/// An event of a PMU's table.
#[derive(Debug, Clone)]
pub struct PfmEvent {
    pub pmu: String,
    pub name: String,
    pub description: String,
    /// Another event this one is an alias of.
    pub equiv: Option<String>,
    /// The event's code (not the full encoding).
    pub code: u64,
    pub umasks: Vec<PfmUmask>,
    /// Modifier names (`e`, `i`, `c`, `u`, `k`, `period`, ...).
    pub modifiers: Vec<String>,
}

/// An event name encoded for `perf_event_open`.
#[derive(Debug, Clone)]
pub struct Encoded {
    pub spec: EventSpec,
    /// `pmu::EVENT:UMASK...`, as libpfm4 understood the name, without the
    /// modifiers it adds (`u=1`, `k=1`, ...).
    pub canonical: String,
    /// libpfm4's name of the PMU.
    pub pmu: String,
}

/// Why libpfm4 did not encode a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PfmError {
    /// libpfm4's error code (`PFM_ERR_*`).
    pub code: i32,
    pub message: String,
}

impl std::fmt::Display for PfmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PfmError {}

static LIBPFM: OnceLock<Result<Libpfm, String>> = OnceLock::new();

/// libpfm4, loaded and initialised on first use. The error says why it is
/// unavailable and ends with [`INSTALL_HINT`] when the library is missing.
pub fn libpfm() -> Result<&'static Libpfm, &'static str> {
    LIBPFM
        .get_or_init(Libpfm::load)
        .as_ref()
        .map_err(String::as_str)
}

/// The last `dlerror` message.
fn dlerror() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated message owned by the
    // C library, valid until the next dl* call on this thread; it is copied
    // at once.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-null, NUL-terminated (see above).
    unsafe { CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned()
}

/// Copies a C string owned by libpfm4 (static tables); empty for null.
fn string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libpfm4 returns NUL-terminated strings from its static tables,
    // valid for the life of the library, which is never unloaded.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl Libpfm {
    fn load() -> Result<Self, String> {
        let file = std::env::var(PATH_ENV).unwrap_or_else(|_| SONAME.to_owned());
        let c_file =
            CString::new(file.clone()).map_err(|_| format!("{PATH_ENV}={file:?}: not a path"))?;
        // SAFETY: c_file is a NUL-terminated path; dlopen has no other
        // preconditions. libpfm4's initialisers only set up static tables.
        let handle = unsafe { libc::dlopen(c_file.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!(
                "libpfm4 is not available ({}): {INSTALL_HINT}",
                dlerror()
            ));
        }
        let symbol = |name: &CStr| -> Result<*mut c_void, String> {
            // SAFETY: handle is a live handle from dlopen; name is
            // NUL-terminated.
            let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
            if p.is_null() {
                Err(format!(
                    "{file} lacks {} ({}): not a usable libpfm4; {INSTALL_HINT}",
                    name.to_string_lossy(),
                    dlerror()
                ))
            } else {
                Ok(p)
            }
        };
        // SAFETY: each symbol (this one and the six below) is the libpfm4
        // function of that name, whose C prototype (pfmlib.h,
        // pfmlib_perf_event.h) the function pointer type repeats.
        let initialize =
            unsafe { std::mem::transmute::<*mut c_void, InitializeFn>(symbol(c"pfm_initialize")?) };
        // SAFETY: see above.
        let strerror =
            unsafe { std::mem::transmute::<*mut c_void, StrerrorFn>(symbol(c"pfm_strerror")?) };
        // SAFETY: see above.
        let get_pmu_info = unsafe {
            std::mem::transmute::<*mut c_void, GetPmuInfoFn>(symbol(c"pfm_get_pmu_info")?)
        };
        // SAFETY: see above.
        let get_event_next = unsafe {
            std::mem::transmute::<*mut c_void, GetEventNextFn>(symbol(c"pfm_get_event_next")?)
        };
        // SAFETY: see above.
        let get_event_info = unsafe {
            std::mem::transmute::<*mut c_void, GetEventInfoFn>(symbol(c"pfm_get_event_info")?)
        };
        // SAFETY: see above.
        let get_event_attr_info = unsafe {
            std::mem::transmute::<*mut c_void, GetEventAttrInfoFn>(symbol(
                c"pfm_get_event_attr_info",
            )?)
        };
        // SAFETY: see above.
        let get_os_event_encoding = unsafe {
            std::mem::transmute::<*mut c_void, GetOsEventEncodingFn>(symbol(
                c"pfm_get_os_event_encoding",
            )?)
        };
        let path = loaded_path(initialize as *const c_void).unwrap_or(file);
        // SAFETY: pfm_initialize takes no arguments; it is called once per
        // process here (the OnceLock), and returns the same result if the
        // library was already initialised by someone else.
        let rc = unsafe { initialize() };
        let lib = Self {
            path,
            strerror,
            get_pmu_info,
            get_event_next,
            get_event_info,
            get_event_attr_info,
            get_os_event_encoding,
            lock: Mutex::new(()),
        };
        if rc != PFM_SUCCESS {
            return Err(format!(
                "libpfm4 ({}) did not initialise: {}",
                lib.path,
                lib.strerror(rc)
            ));
        }
        Ok(lib)
    }

    /// The file the library was loaded from, with its version where the
    /// file name carries one (`/usr/lib/x86_64-linux-gnu/libpfm.so.4.13.0`).
    pub fn path(&self) -> &str {
        &self.path
    }

    fn guard(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// libpfm4's message for an error code.
    pub fn strerror(&self, code: i32) -> String {
        // SAFETY: pfm_strerror accepts any code and returns a static string
        // (or null).
        string(unsafe { (self.strerror)(code) })
    }

    /// The PMUs libpfm4 detected on this machine (`perf` and `perf_raw`,
    /// perf's generic events, are always there on Linux).
    pub fn pmus(&self) -> Vec<PfmPmu> {
        let _g = self.guard();
        let mut out = Vec::new();
        for id in 0..PMU_ID_LIMIT {
            let mut info = PmuInfo::new();
            // SAFETY: info is a writable pfm_pmu_info_t with its size set.
            let rc = unsafe { (self.get_pmu_info)(id, &mut info) };
            if rc != PFM_SUCCESS || info.flags & 1 == 0 {
                continue;
            }
            out.push(PfmPmu {
                id,
                name: string(info.name),
                description: string(info.desc),
                kind: match info.type_ {
                    PFM_PMU_TYPE_CORE => PmuKind::Core,
                    PFM_PMU_TYPE_UNCORE => PmuKind::Uncore,
                    PFM_PMU_TYPE_OS_GENERIC => PmuKind::OsGeneric,
                    _ => PmuKind::Unknown,
                },
                nevents: info.nevents,
                counters: info.num_cntrs,
                fixed_counters: info.num_fixed_cntrs,
                first_event: info.first_event,
            });
        }
        out
    }

    /// Every event of `pmu` with its unit masks and modifiers.
    pub fn events(&self, pmu: &PfmPmu) -> Vec<PfmEvent> {
        let _g = self.guard();
        let mut out = Vec::new();
        let mut idx = pmu.first_event;
        // Bounded: a PMU has nevents events; guard against a library that
        // loops anyway.
        let limit = usize::try_from(pmu.nevents).unwrap_or(0) + 1;
        while idx >= 0 && out.len() < limit {
            let mut info = EventInfo::new();
            // SAFETY: info is a writable pfm_event_info_t with its size set.
            let rc = unsafe { (self.get_event_info)(idx, PFM_OS_PERF_EVENT_EXT, &mut info) };
            if rc == PFM_SUCCESS {
                let mut umasks = Vec::new();
                let mut modifiers = Vec::new();
                for a in 0..info.nattrs.max(0) {
                    let mut attr = AttrInfo::new();
                    // SAFETY: attr is a writable pfm_event_attr_info_t with
                    // its size set; a < nattrs of this event.
                    let rc = unsafe {
                        (self.get_event_attr_info)(idx, a, PFM_OS_PERF_EVENT_EXT, &mut attr)
                    };
                    if rc != PFM_SUCCESS {
                        continue;
                    }
                    match attr.type_ {
                        PFM_ATTR_UMASK => umasks.push(PfmUmask {
                            name: string(attr.name),
                            description: string(attr.desc),
                            code: attr.code,
                            is_default: attr.flags & 1 != 0,
                        }),
                        PFM_ATTR_MOD_BOOL | PFM_ATTR_MOD_INTEGER => {
                            modifiers.push(string(attr.name))
                        }
                        _ => {}
                    }
                }
                let equiv = string(info.equiv);
                out.push(PfmEvent {
                    pmu: pmu.name.clone(),
                    name: string(info.name),
                    description: string(info.desc),
                    equiv: (!equiv.is_empty()).then_some(equiv),
                    code: info.code,
                    umasks,
                    modifiers,
                });
            }
            // SAFETY: pfm_get_event_next takes any index and returns the
            // next one of the same PMU, or -1.
            idx = unsafe { (self.get_event_next)(idx) };
        }
        out
    }

    /// Encodes an event name as libpfm4 writes them (`TLB_FLUSH:STLB_ANY`,
    /// `skl::DTLB_LOAD_MISSES:WALK_DURATION`, `tlb_flush.stlb_any`,
    /// `PERF_COUNT_HW_CPU_CYCLES`) for the PMUs present here.
    pub fn encode(&self, name: &str) -> Result<Encoded, PfmError> {
        let c_name = CString::new(name).map_err(|_| PfmError {
            code: -2,
            message: format!("event {name:?} contains a NUL byte"),
        })?;
        let mut attr = PerfEventAttr {
            size: std::mem::size_of::<PerfEventAttr>() as u32,
            ..PerfEventAttr::default()
        };
        let mut fstr: *mut c_char = std::ptr::null_mut();
        let mut arg = PerfEncodeArg {
            attr: &mut attr,
            fstr: &mut fstr,
            size: std::mem::size_of::<PerfEncodeArg>(),
            idx: 0,
            cpu: -1,
            flags: 0,
            pad0: 0,
        };
        let rc = {
            let _g = self.guard();
            // SAFETY: c_name is NUL-terminated; arg is a pfm_perf_encode_arg_t
            // with its size set, pointing to a perf_event_attr whose `size`
            // says how many bytes libpfm4 may write (it copies at most that),
            // and to fstr, which it sets to a malloc'd string or leaves null.
            unsafe {
                (self.get_os_event_encoding)(
                    c_name.as_ptr(),
                    PFM_PLM0 | PFM_PLM3,
                    PFM_OS_PERF_EVENT_EXT,
                    (&mut arg as *mut PerfEncodeArg).cast::<c_void>(),
                )
            }
        };
        let full = if fstr.is_null() {
            String::new()
        } else {
            // SAFETY: libpfm4 set fstr to a NUL-terminated string it
            // allocated with malloc; it is copied, then freed once.
            let s = unsafe { CStr::from_ptr(fstr) }
                .to_string_lossy()
                .into_owned();
            // SAFETY: fstr came from malloc in libpfm4 and is freed once.
            unsafe { libc::free(fstr.cast::<c_void>()) };
            s
        };
        if rc != PFM_SUCCESS {
            return Err(PfmError {
                code: rc,
                message: format!("libpfm4 cannot encode {name:?}: {}", self.strerror(rc)),
            });
        }
        let canonical = canonical_name(&full);
        let pmu = canonical
            .split_once("::")
            .map(|(p, _)| p.to_owned())
            .unwrap_or_default();
        Ok(Encoded {
            spec: EventSpec {
                type_: attr.type_,
                config: attr.config,
                config1: attr.config1,
                config2: attr.config2,
            },
            canonical: if canonical.is_empty() {
                name.to_owned()
            } else {
                canonical
            },
            pmu,
        })
    }
}

/// The file behind `symbol`, as the dynamic loader found it, resolved to
/// the real file (whose name carries the version).
fn loaded_path(symbol: *const c_void) -> Option<String> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: info is writable; dladdr accepts any address.
    if unsafe { libc::dladdr(symbol, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader, valid
    // while the library is loaded (always).
    let name = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned();
    Some(
        std::fs::canonicalize(&name)
            .map(|p| p.display().to_string())
            .unwrap_or(name),
    )
}

/// `skl::TLB_FLUSH:STLB_ANY:e=0:i=0:u=1:k=1` -> `skl::TLB_FLUSH:STLB_ANY`:
/// the PMU, event and unit masks, without the modifiers libpfm4 spells out.
fn canonical_name(full: &str) -> String {
    let (pmu, rest) = match full.split_once("::") {
        Some((p, r)) => (Some(p), r),
        None => (None, full),
    };
    let kept: Vec<&str> = rest.split(':').filter(|part| !part.contains('=')).collect();
    match pmu {
        Some(p) => format!("{p}::{}", kept.join(":")),
        None => kept.join(":"),
    }
}

/// The kind of counter an encoded event is, in [`Resolved::kind`]'s words.
fn kind_of(spec: &EventSpec, pmu_kind: Option<PmuKind>) -> &'static str {
    if pmu_kind == Some(PmuKind::OsGeneric) || pmu_kind.is_none() {
        match spec.type_ {
            PERF_TYPE_HARDWARE => return "hardware",
            PERF_TYPE_SOFTWARE => return "software",
            PERF_TYPE_TRACEPOINT => return "tracepoint",
            PERF_TYPE_HW_CACHE => return "hw_cache",
            PERF_TYPE_RAW => return "raw",
            _ => {}
        }
    }
    "pmu"
}

/// Resolves a model-specific event name with libpfm4. `Err` says why not:
/// libpfm4 is unavailable (with [`INSTALL_HINT`]), or its reason for this
/// name (unknown event, unknown unit mask for this CPU, ...).
pub fn resolve(name: &str) -> Result<Resolved, String> {
    let lib = libpfm()?;
    let enc = lib.encode(name).map_err(|e| e.message)?;
    let pmu_kind = lib
        .pmus()
        .into_iter()
        .find(|p| p.name == enc.pmu)
        .map(|p| p.kind);
    Ok(Resolved {
        kind: kind_of(&enc.spec, pmu_kind),
        source: format!("libpfm4 event {}", enc.canonical),
        spec: enc.spec,
    })
}

/// One line on libpfm4 here: where it was loaded from and which PMUs it
/// has tables for, or why it is unavailable.
pub fn summary() -> String {
    match libpfm() {
        Err(e) => e.to_owned(),
        Ok(lib) => {
            let pmus = lib.pmus();
            let names: Vec<&str> = pmus.iter().map(|p| p.name.as_str()).collect();
            let model_specific = pmus.iter().any(|p| p.kind != PmuKind::OsGeneric);
            format!(
                "libpfm4 {}: PMUs detected here: {}{}",
                lib.path(),
                names.join(", "),
                if model_specific {
                    String::new()
                } else {
                    format!(
                        " (perf's generic events only: libpfm4 has no event table for this CPU, {})",
                        crate::cpu_model()
                    )
                }
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_names_drop_modifiers() {
        assert_eq!(
            canonical_name("skl::TLB_FLUSH:STLB_ANY:e=0:i=0:c=0:t=0:u=1:k=1:mh=1"),
            "skl::TLB_FLUSH:STLB_ANY"
        );
        assert_eq!(
            canonical_name("perf::PERF_COUNT_HW_CACHE_DTLB:READ:MISS:u=1:k=1"),
            "perf::PERF_COUNT_HW_CACHE_DTLB:READ:MISS"
        );
        assert_eq!(canonical_name("X:u=1"), "X");
    }

    #[test]
    fn kinds_follow_the_attribute_type_for_generic_pmus() {
        let spec = |type_| EventSpec {
            type_,
            ..EventSpec::default()
        };
        assert_eq!(kind_of(&spec(0), Some(PmuKind::OsGeneric)), "hardware");
        assert_eq!(kind_of(&spec(1), Some(PmuKind::OsGeneric)), "software");
        assert_eq!(kind_of(&spec(3), Some(PmuKind::OsGeneric)), "hw_cache");
        assert_eq!(kind_of(&spec(4), Some(PmuKind::Core)), "pmu");
        assert_eq!(kind_of(&spec(11), Some(PmuKind::Uncore)), "pmu");
    }
}
