//! The stable ABI between the `kernmlops` host and its plugins.
//!
//! Every type that crosses a plugin boundary lives here and nothing else does:
//! this crate depends on `abi_stable` only, never on BPF or Arrow crates.
//!
//! # Evolution rules
//! - [`PluginMod`] is a prefix type: new fields go at the end only. Fields
//!   after the `last_prefix_field` are optional, so a host can load a plugin
//!   built before a field existed (the accessor returns `None`).
//! - Trait objects ([`Probe`], [`Graph`], [`Benchmark`]) may
//!   gain methods at the end only, after their `last_prefix_field`.
//! - Enumerations that must grow are plain integers with named constants
//!   ([`ColumnKind`], [`PowerScope`]), so an unknown value is a validation
//!   error, not undefined behaviour.
//! - Every entry point returns errors as values. A panic must never cross the
//!   boundary: `kernmlops-plugin-sdk` wraps every call in `catch_unwind`.
#![allow(non_camel_case_types)] // abi_stable generates `*_Ref` and `*_TO` names.
#![allow(non_local_definitions)] // emitted by `#[sabi_trait]`.

use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    sabi_trait,
    sabi_types::VersionStrings,
    std_types::{RBox, RResult, RStr, RString, RVec},
    StableAbi,
};

pub mod spec;

/// Version of the data contract between host and plugins (table layout
/// rules, record encoding). abi_stable checks the type layouts; this number
/// covers meaning that layouts cannot express. Bump on incompatible change.
pub const DATA_CONTRACT_VERSION: u32 = 1;

/// Name of the program a probe that stages records per CPU carries
/// (`KML_FLUSH_PROGRAM` in `kml.bpf.h`): the host runs it to send a CPU's
/// partial batch, so its runs in [`BpfProgramStats`] are not events.
pub const STAGE_FLUSH_PROGRAM: &str = "kml_flush";

/// Name of the timestamp column every time-series table must declare:
/// `CLOCK_BOOTTIME` in microseconds, as a `u64`.
pub const TIMESTAMP_COLUMN: &str = "ts_uptime_us";

/// Name of the column the host adds to every table.
pub const COLLECTION_ID_COLUMN: &str = "collection_id";

/// Declares the named values of an integer-coded enumeration (a
/// `#[repr(transparent)]` newtype of `u32`, declared beside it),
/// `NAME = value => "name"` for each, and its `name`: `None` for a value
/// this crate does not know, or with `else NAME` that value's name.
macro_rules! named_values {
    (
        $ty:ident $(else $other:ident)? {
            $($(#[doc = $doc:literal])* $konst:ident = $value:literal => $name:literal,)*
        }
    ) => {
        impl $ty {
            $(
                $(#[doc = $doc])*
                pub const $konst: Self = Self($value);
            )*

            named_values!(@name $($other)? { $($konst => $name,)* });
        }
    };
    (@name { $($konst:ident => $name:literal,)* }) => {
        /// Lowercase name, `None` for a value this crate does not know.
        pub fn name(self) -> Option<&'static str> {
            match self {
                $(Self::$konst => Some($name),)*
                _ => None,
            }
        }
    };
    (@name $other:ident { $($konst:ident => $name:literal,)* }) => {
        /// Lowercase name, for messages and manifests (that of the fallback
        /// value for one this crate does not know).
        pub fn name(self) -> &'static str {
            match self {
                $(Self::$konst => $name,)*
                _ => Self::$other.name(),
            }
        }
    };
}

/// What kind of failure a [`PluginError`] reports, so the host can act on
/// it without matching message text.
///
/// A plain integer, like [`ColumnKind`]: a kind the host does not know reads
/// as [`ErrorKind::OTHER`].
#[repr(transparent)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorKind(pub u32);

named_values! {
    ErrorKind else OTHER {
        /// Anything else.
        OTHER = 0 => "other",
        /// The plugin panicked; the component refuses further calls.
        PANIC = 1 => "panic",
        /// The user's settings for the component are wrong.
        CONFIG = 2 => "config",
        /// The caller lacks a privilege (root, CAP_BPF, CAP_PERFMON).
        PERMISSION = 3 => "permission",
        /// This machine or kernel lacks what the component needs.
        UNSUPPORTED = 4 => "unsupported",
        /// The kernel's BPF verifier rejected a program.
        VERIFIER = 5 => "verifier",
        /// Reading or writing a file or device failed.
        IO = 6 => "io",
        /// The component has no such sub-component (probe, graph, benchmark).
        NOT_FOUND = 7 => "not_found",
    }
}

/// An error crossing the boundary: a kind code and a message; the host adds
/// context (plugin and component name).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct PluginError {
    pub kind: ErrorKind,
    pub message: RString,
}

impl PluginError {
    pub fn new(kind: ErrorKind, message: impl Into<RString>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for PluginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PluginError {}

/// What every entry point returns: a value or a [`PluginError`].
pub type PluginResult<T> = RResult<T, PluginError>;

/// The type of one column of a declared table.
///
/// A plain integer so that newer plugins can declare kinds an older host
/// does not know: the host rejects them by validation, naming the column.
#[repr(transparent)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ColumnKind(pub u32);

named_values! {
    ColumnKind {
        U8 = 1 => "u8", U16 = 2 => "u16", U32 = 3 => "u32", U64 = 4 => "u64",
        I8 = 5 => "i8", I16 = 6 => "i16", I32 = 7 => "i32", I64 = 8 => "i64",
        F32 = 9 => "f32", F64 = 10 => "f64",
        BOOL = 11 => "bool",
        /// Fixed-size byte buffer holding UTF-8 text, ended by the first NUL (or
        /// the buffer's end). Decoded to an Arrow `Utf8` column.
        STR = 12 => "str",
        /// An unsigned integer of `size` bytes (1, 2 or 4) mapped through the
        /// column's `labels` (value `i` is `labels[i]`). Decoded to `Utf8`.
        LABEL = 13 => "label",
    }
}

impl ColumnKind {
    /// The byte size a column of this kind must have, `None` when the
    /// declaration chooses it (`STR`, `LABEL`) or the kind is unknown.
    pub fn fixed_size(self) -> Option<u32> {
        Some(match self {
            Self::U8 | Self::I8 | Self::BOOL => 1,
            Self::U16 | Self::I16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 => 8,
            _ => return None,
        })
    }
}

/// One column of a declared table: where its value sits in a record.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct ColumnDecl {
    /// lowercase_snake_case, unit suffix where it has one (`_us`, `_bytes`).
    pub name: RString,
    pub kind: ColumnKind,
    /// Byte offset of the value inside a record.
    pub offset: u32,
    /// Byte size of the value inside a record.
    pub size: u32,
    /// Unit of the value (`us`, `bytes`, `pages`, `count`), empty if none.
    pub unit: RString,
    /// One line saying what the value is.
    pub description: RString,
    /// Labels for [`ColumnKind::LABEL`] columns, empty otherwise.
    pub labels: RVec<RString>,
}

impl ColumnDecl {
    /// A column at `offset` of `size` bytes, without unit, description or
    /// labels (set those with struct update syntax where needed).
    pub fn new(name: &str, kind: ColumnKind, offset: u32, size: u32) -> Self {
        Self {
            name: name.into(),
            kind,
            offset,
            size,
            unit: RString::new(),
            description: RString::new(),
            labels: RVec::new(),
        }
    }
}

/// A table a probe produces: fixed-size little-endian records.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct TableDecl {
    /// lowercase_snake_case, unique across every loaded plugin.
    pub name: RString,
    pub description: RString,
    /// Size of one record in bytes; records are packed back to back.
    pub record_size: u32,
    pub columns: RVec<ColumnDecl>,
}

/// A probe: something that attaches to the kernel and produces tables.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct ProbeDecl {
    pub name: RString,
    pub description: RString,
    pub tables: RVec<TableDecl>,
}

/// A graph: renders images from the tables of a collection.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct GraphDecl {
    pub name: RString,
    pub description: RString,
    /// Tables the graph reads; it is offered when all of them exist.
    pub tables: RVec<RString>,
    /// A column set: every table whose columns (besides `collection_id`)
    /// are exactly these is given to the graph too, and the graph is
    /// offered when there is one (tables named at run time, like the perf
    /// probe's one per counter). Empty when unused.
    pub tables_with_columns: RVec<RString>,
}

/// The values of one column handed to a graph, in the one of `u64s`,
/// `i64s`, `f64s`, `texts` its `kind` names (nulls as 0, NaN or "").
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Default)]
pub struct GraphColumn {
    pub name: RString,
    /// `U64` (unsigned integers and booleans), `I64` (signed integers and
    /// timestamps), `F64` or `STR` (text, labels, dictionary text).
    pub kind: ColumnKind,
    /// The field's metadata (`unit`, `description`, ...) as a JSON object,
    /// with `arrow_type`, the column's type in the file.
    pub metadata_json: RString,
    pub u64s: RVec<u64>,
    pub i64s: RVec<i64>,
    pub f64s: RVec<f64>,
    pub texts: RVec<RString>,
    /// Which rows are null (empty when none is).
    pub nulls: RVec<bool>,
}

/// One table handed to a graph.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Default)]
pub struct GraphTable {
    pub name: RString,
    /// The schema's metadata as a JSON object.
    pub metadata_json: RString,
    pub rows: u64,
    pub columns: RVec<GraphColumn>,
}

/// What a graph renders from: the collection's manifest (or an
/// experiment's record) and the tables the graph asked for, read by the
/// host, so graph plugins need no Arrow reader of their own.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Default)]
pub struct GraphInput {
    /// The folder the data comes from, for titles and messages.
    pub dir: RString,
    /// `manifest.json` of a collection, or `experiment.json` of an
    /// experiment, as JSON text.
    pub manifest_json: RString,
    pub tables: RVec<GraphTable>,
}

/// A workload benchmark the host can run while collecting.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct BenchmarkDecl {
    pub name: RString,
    pub description: RString,
}

/// What a power source measures.
#[repr(transparent)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PowerScope(pub u32);

named_values! {
    PowerScope {
        PACKAGE = 1 => "package", CORE = 2 => "core", UNCORE = 3 => "uncore",
        DRAM = 4 => "dram", PLATFORM = 5 => "platform", DEVICE = 6 => "device",
    }
}

/// A power or energy source (RAPL, hwmon, a vendor's interface): its name,
/// scope and update interval. Its zones and readings come from the
/// started `PowerSource`; the host writes the `energy` and
/// `energy_attribution` tables from them, so a source declares no tables.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct PowerSourceDecl {
    pub name: RString,
    pub description: RString,
    pub scope: PowerScope,
    /// How often the underlying counter updates, in microseconds.
    pub update_interval_us: u64,
}

/// Static facts about a plugin.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct PluginInfo {
    /// The plugin's name (its crate name), unique among loaded plugins.
    pub name: RString,
    /// The plugin's own version.
    pub version: RString,
    pub description: RString,
    /// [`DATA_CONTRACT_VERSION`] the plugin was built with.
    pub data_contract: u32,
}

/// Records of one table, drained from a probe. The host owns the buffer and
/// hands it back cleared for the next drain, so it is allocated once.
#[repr(C)]
#[derive(StableAbi, Debug, Default)]
pub struct Batch {
    /// Packed records, `records * record_size` bytes.
    pub data: RVec<u8>,
    /// Number of records in `data`.
    pub records: u64,
    /// Cumulative count of events the probe lost for this table since it
    /// started (ring buffer full, map full). Monotonic.
    pub lost_total: u64,
    /// Cumulative count of records the probe received with a size other
    /// than the table's record size and therefore left out. Monotonic; the
    /// host reports it as an error of the table.
    pub malformed_total: u64,
}

/// Settings the host passes to a component when it creates it.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct StartArgs {
    /// The plugin's own settings as a JSON object (may be `{}`).
    pub config_json: RString,
    /// Bytes for each ring buffer (a power of two, multiple of the page size).
    pub ring_bytes: u64,
    /// Only record this thread group (process), 0 for all.
    pub filter_tgid: u32,
    /// Only record this thread, 0 for all.
    pub filter_pid: u32,
    /// Only record tasks in this cgroup v2 (its id, the inode number of its
    /// folder), 0 for all.
    pub filter_cgroup_id: u64,
    /// The collector's own process id. Probes leave its events out (in the
    /// kernel) unless `include_self` is set.
    pub self_tgid: u32,
    /// Record the collector's own process too (`--include-self`).
    pub include_self: bool,
    /// With `filter_cgroup_id`: also record tasks in cgroups below it.
    pub filter_cgroup_descendants: bool,
    /// The collection folder of the run (empty outside a run, e.g. in
    /// `kernmlops check`). Benchmarks keep their tools' output here.
    pub output_dir: RString,
    /// A folder that outlives the host (under `/run/kernmlops`), where a
    /// component records what it changes on the machine before changing it,
    /// so the next start of the host can undo it after a crash. Empty when
    /// there is none.
    pub state_dir: RString,
}

impl StartArgs {
    /// Arguments with `config_json` as the component's settings and
    /// nothing else: no ring size, no filter, the calling process as the
    /// collector (left out of the records), no collection or state folder.
    /// The `with_*` methods set the rest.
    ///
    /// ```
    /// # use kernmlops_plugin_api::StartArgs;
    /// let args = StartArgs::new("{}").with_ring_bytes(1 << 20).with_include_self(true);
    /// assert_eq!(args.ring_bytes, 1 << 20);
    /// assert_eq!(args.self_tgid, std::process::id());
    /// ```
    pub fn new(config_json: &str) -> Self {
        Self {
            config_json: config_json.into(),
            ring_bytes: 0,
            filter_tgid: 0,
            filter_pid: 0,
            filter_cgroup_id: 0,
            self_tgid: std::process::id(),
            include_self: false,
            filter_cgroup_descendants: false,
            output_dir: RString::new(),
            state_dir: RString::new(),
        }
    }

    /// Bytes for each ring buffer.
    pub fn with_ring_bytes(mut self, ring_bytes: u64) -> Self {
        self.ring_bytes = ring_bytes;
        self
    }

    /// Only this thread group (0: all).
    pub fn with_filter_tgid(mut self, tgid: u32) -> Self {
        self.filter_tgid = tgid;
        self
    }

    /// Only this thread (0: all).
    pub fn with_filter_pid(mut self, pid: u32) -> Self {
        self.filter_pid = pid;
        self
    }

    /// Only tasks in the cgroup of this id (0: all), and with
    /// `descendants` those in cgroups below it too.
    pub fn with_filter_cgroup(mut self, cgroup_id: u64, descendants: bool) -> Self {
        self.filter_cgroup_id = cgroup_id;
        self.filter_cgroup_descendants = descendants;
        self
    }

    /// The collector's process id (the calling process unless set).
    pub fn with_self_tgid(mut self, tgid: u32) -> Self {
        self.self_tgid = tgid;
        self
    }

    /// Record the collector's own process too.
    pub fn with_include_self(mut self, include_self: bool) -> Self {
        self.include_self = include_self;
        self
    }

    /// The run's collection folder.
    pub fn with_output_dir(mut self, dir: &str) -> Self {
        self.output_dir = dir.into();
        self
    }

    /// The folder that outlives the host, for the undo log.
    pub fn with_state_dir(mut self, dir: &str) -> Self {
        self.state_dir = dir.into();
        self
    }
}

/// A running probe. Created by [`PluginMod::new_probe`], already attached.
#[sabi_trait]
pub trait Probe: Send {
    /// Waits up to `timeout_ms` for data, then appends every available
    /// record to `batches[i]` for the probe's i-th declared table and updates
    /// each batch's `lost_total`. `batches` has one entry per table.
    fn drain(&mut self, timeout_ms: u32, batches: &mut RVec<Batch>) -> PluginResult<()>;

    /// Detaches from the kernel. `drain` is called once more afterwards to
    /// collect what was still buffered.
    fn stop(&mut self) -> PluginResult<()>;

    /// The tables this running probe fills, in `drain`'s batch order. Most
    /// probes return their declared tables; a probe whose tables depend on
    /// its settings (one per configured counter, say) returns those. The
    /// host validates them like declared ones.
    fn tables(&self) -> RVec<TableDecl>;

    /// What the probe skipped because this machine lacks it (a hardware
    /// counter, a kernel function), one sentence each. The host prints and
    /// records them; `--strict` makes them errors.
    #[sabi(last_prefix_field)]
    fn notes(&self) -> RVec<RString>;

    /// The kernel's run-time statistics of the probe's BPF programs (empty
    /// for probes without BPF). The counts grow only while the kernel's BPF
    /// statistics are enabled, which the host does for the run.
    fn bpf_stats(&self) -> RVec<BpfProgramStats>;
}

/// The kernel's run-time statistics of one BPF program.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct BpfProgramStats {
    /// The program's name in its object (`handle_sched_switch`).
    pub name: RString,
    /// The kernel's id of the loaded program.
    pub id: u32,
    /// Times the program ran.
    pub run_cnt: u64,
    /// Total time it ran, in nanoseconds.
    pub run_time_ns: u64,
}

/// A boxed, ABI-stable [`Probe`].
pub type ProbeBox = Probe_TO<'static, RBox<()>>;

/// A graph renderer.
#[sabi_trait]
pub trait Graph: Send {
    /// Renders from the files of the collection in `collection_dir` into
    /// `out_dir`, returning the paths written. Graphs built with the
    /// current SDK render from [`Graph::render_input`] and refuse this.
    #[sabi(last_prefix_field)]
    fn render(
        &mut self,
        collection_dir: RStr<'_>,
        out_dir: RStr<'_>,
    ) -> PluginResult<RVec<RString>>;

    /// Renders from the tables the host read for the graph into `out_dir`,
    /// returning the paths written.
    fn render_input(
        &mut self,
        input: &GraphInput,
        out_dir: RStr<'_>,
    ) -> PluginResult<RVec<RString>>;
}

/// A boxed, ABI-stable [`Graph`].
pub type GraphBox = Graph_TO<'static, RBox<()>>;

/// State of a benchmark after [`Benchmark::poll`].
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchmarkStatus {
    /// True once the workload has ended.
    pub finished: bool,
    /// Exit code once finished (non-zero is a failed run).
    pub exit_code: i32,
}

/// A workload benchmark.
#[sabi_trait]
pub trait Benchmark: Send {
    /// Checks the software is there and the config is complete.
    fn is_configured(&self) -> PluginResult<()>;
    /// Prepares the machine (page cache, THP mode).
    fn setup(&mut self) -> PluginResult<()>;
    /// Starts the workload and returns immediately.
    fn launch(&mut self) -> PluginResult<()>;
    /// Reports whether the workload has ended.
    fn poll(&mut self) -> PluginResult<BenchmarkStatus>;
    /// Stops the workload and everything it started.
    #[sabi(last_prefix_field)]
    fn kill(&mut self) -> PluginResult<()>;

    /// The benchmark's own result once it has ended, as a JSON object in
    /// the performance-indicator format (`name`, `component`,
    /// `@parameters`, `@result`, optional `overall_score`); empty when it
    /// reports none.
    fn result(&self) -> PluginResult<RString>;
}

/// A boxed, ABI-stable [`Benchmark`].
pub type BenchmarkBox = Benchmark_TO<'static, RBox<()>>;

impl PowerScope {
    /// Every scope this crate knows, for messages and label columns, in
    /// the order of their values.
    pub const KNOWN: &'static [Self] = &[
        Self::PACKAGE,
        Self::CORE,
        Self::UNCORE,
        Self::DRAM,
        Self::PLATFORM,
        Self::DEVICE,
    ];
}

/// One zone of a running power source: a counter or sensor, what it
/// covers, and whether it is measured or modelled. A source's zones are
/// fixed once it has started.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct PowerZone {
    /// Unique within the source, lowercase: `package-0`, `dram-1`, `psys`.
    pub name: RString,
    /// What the zone covers. An unknown value is refused by the host.
    pub scope: PowerScope,
    /// The CPU socket (physical package id) the zone belongs to; -1 when
    /// it covers several sockets, or none.
    pub socket: i32,
    /// True for a meter's reading; false for a model's estimate, which the
    /// host never reports as measured.
    pub measured: bool,
    /// How often the zone's value changes, in microseconds. The host's
    /// slots are never shorter.
    pub update_interval_us: u64,
    /// The zone of the same source that contains this one (`core` inside
    /// `package-0`), empty when none: its energy is part of the parent's,
    /// and the two are never added.
    pub parent: RString,
    /// One line saying what the zone measures or models.
    pub description: RString,
}

/// One zone's reading, in the order of [`PowerSource::zones`].
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Default, PartialEq, Eq)]
pub struct PowerReading {
    /// When the zone was read (`CLOCK_BOOTTIME` microseconds).
    pub ts_uptime_us: u64,
    /// Energy since the source started, in microjoules, corrected for the
    /// counter's wrap-around: 0 at the first reading, never decreasing.
    pub energy_uj: u64,
    /// Empty when the zone was read; otherwise why it could not be (the
    /// file vanished, permission was lost, the counter went backwards). A
    /// zone that failed stays failed.
    pub error: RString,
}

/// A running power source, created by [`PluginMod::new_power_source`].
/// Sources are passive: the host calls `read` at each slot boundary.
#[sabi_trait]
pub trait PowerSource: Send {
    /// The zones, in the order of `read`'s readings; fixed once started.
    fn zones(&self) -> RVec<PowerZone>;

    /// Reads every zone: `readings` is cleared and gets one reading per
    /// zone. An error here fails every zone of the source.
    fn read(&mut self, readings: &mut RVec<PowerReading>) -> PluginResult<()>;

    /// What the source skipped because this machine lacks it, one
    /// sentence each.
    fn notes(&self) -> RVec<RString>;

    /// For a source with modelled zones: the model and its coefficients as
    /// a JSON object, recorded in the manifest; empty for a meter.
    #[sabi(last_prefix_field)]
    fn model(&self) -> RString;
}

/// A boxed, ABI-stable [`PowerSource`].
pub type PowerSourceBox = PowerSource_TO<'static, RBox<()>>;

/// Longest zone name, in bytes (the `zone` column of the `energy` table
/// holds it whole).
pub const MAX_ZONE_NAME: usize = 47;

/// The known scopes as a phrase, for messages.
fn known_scopes() -> String {
    PowerScope::KNOWN
        .iter()
        .filter_map(|s| s.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks a power source's declaration as the host does when it lists
/// sources: a snake_case name, a known scope, an update interval. Plugin
/// crates check themselves against the same rule in their tests.
pub fn validate_power_source(decl: &PowerSourceDecl) -> Result<(), String> {
    if let Some(problem) = kernmlops_sys::names::snake_case_problem(&decl.name) {
        return Err(format!(
            "power source name {:?} {problem}",
            decl.name.as_str()
        ));
    }
    if decl.scope.name().is_none() {
        return Err(format!(
            "power source {} declares unknown scope {} (known: {})",
            decl.name,
            decl.scope.0,
            known_scopes()
        ));
    }
    if decl.update_interval_us == 0 {
        return Err(format!(
            "power source {} declares an update interval of 0",
            decl.name
        ));
    }
    Ok(())
}

/// Checks the zones of a started power source as the host does before
/// using it: at least one zone; names unique, lowercase (letters, digits,
/// `-`, `_`, `.`), at most [`MAX_ZONE_NAME`] bytes; known scopes; an
/// update interval; a parent that is another zone of the source.
pub fn validate_power_zones(zones: &[PowerZone]) -> Result<(), String> {
    if zones.is_empty() {
        return Err("it has no zone".into());
    }
    for (i, z) in zones.iter().enumerate() {
        let name = z.name.as_str();
        let good = !name.is_empty()
            && name.len() <= MAX_ZONE_NAME
            && name
                .chars()
                .all(|c| matches!(c, 'a'..='z' | '0'..='9' | '-' | '_' | '.'));
        if !good {
            return Err(format!(
                "zone name {name:?} must be 1 to {MAX_ZONE_NAME} lowercase letters, digits, '-', '_' or '.'"
            ));
        }
        if zones[..i].iter().any(|o| o.name == z.name) {
            return Err(format!("zone {name} is declared twice"));
        }
        if z.scope.name().is_none() {
            return Err(format!(
                "zone {name} declares unknown scope {} (known: {})",
                z.scope.0,
                known_scopes()
            ));
        }
        if z.update_interval_us == 0 {
            return Err(format!("zone {name} declares an update interval of 0"));
        }
        if !z.parent.is_empty() && (z.parent == z.name || !zones.iter().any(|o| o.name == z.parent))
        {
            return Err(format!(
                "zone {name} names parent {:?}, which is not another zone of the source",
                z.parent.as_str()
            ));
        }
    }
    Ok(())
}

/// The root module every plugin exports (one per `.so`).
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginMod_Ref)))]
#[sabi(missing_field(option))]
pub struct PluginMod {
    pub info: extern "C" fn() -> PluginInfo,
    /// Probes this plugin offers, with the tables each declares.
    pub probes: extern "C" fn() -> PluginResult<RVec<ProbeDecl>>,
    /// Creates, loads and attaches the named probe.
    #[sabi(last_prefix_field)]
    pub new_probe: extern "C" fn(name: RStr<'_>, args: &StartArgs) -> PluginResult<ProbeBox>,
    /// Graphs this plugin offers.
    pub graphs: extern "C" fn() -> PluginResult<RVec<GraphDecl>>,
    pub new_graph: extern "C" fn(name: RStr<'_>, args: &StartArgs) -> PluginResult<GraphBox>,
    /// Workload benchmarks this plugin offers.
    pub benchmarks: extern "C" fn() -> PluginResult<RVec<BenchmarkDecl>>,
    pub new_benchmark:
        extern "C" fn(name: RStr<'_>, args: &StartArgs) -> PluginResult<BenchmarkBox>,
    /// Power sources this plugin offers; each runs as a probe of the same
    /// name through `new_probe`.
    pub power_sources: extern "C" fn() -> PluginResult<RVec<PowerSourceDecl>>,
    /// A probe's settings with their defaults: the body of its
    /// `[probes.<name>]` table in TOML, commented; empty when it has none.
    /// The host rejects keys that are not in it, or of another type.
    pub probe_config: extern "C" fn(name: RStr<'_>) -> PluginResult<RString>,
    /// Checks a component's settings (the JSON object the host would pass
    /// it) by the component's own rules (ranges, non-empty lists), without
    /// starting it, so a bad value is reported before anything runs. Errors
    /// are of kind `CONFIG` and name the key.
    pub check_config: extern "C" fn(name: RStr<'_>, config_json: RStr<'_>) -> PluginResult<()>,
    /// Creates one of the power sources of `power_sources` with its
    /// settings (the JSON object of its `[power.settings.<name>]`). The
    /// host reads it at each slot boundary and writes the `energy` table
    /// itself: a power source fills no table of its own and never runs as a
    /// probe.
    pub new_power_source:
        extern "C" fn(name: RStr<'_>, args: &StartArgs) -> PluginResult<PowerSourceBox>,
}

impl RootModule for PluginMod_Ref {
    declare_root_module_statics! {PluginMod_Ref}
    const BASE_NAME: &'static str = "kernmlops_plugin";
    const NAME: &'static str = "kernmlops_plugin";
    const VERSION_STRINGS: VersionStrings = abi_stable::package_version_strings!();
}

/// Re-exported so plugins and the host name one `abi_stable`.
pub use abi_stable;

#[cfg(test)]
mod power_tests {
    use super::*;

    fn zone(name: &str, scope: PowerScope, parent: &str) -> PowerZone {
        PowerZone {
            name: name.into(),
            scope,
            socket: 0,
            measured: true,
            update_interval_us: 1000,
            parent: parent.into(),
            description: "".into(),
        }
    }

    #[test]
    fn zones_are_checked_rule_by_rule() {
        let ok = [
            zone("package-0", PowerScope::PACKAGE, ""),
            zone("core-0", PowerScope::CORE, "package-0"),
        ];
        assert_eq!(validate_power_zones(&ok), Ok(()));
        for (zones, needle) in [
            (vec![], "no zone"),
            (vec![zone("Package", PowerScope::PACKAGE, "")], "lowercase"),
            (vec![zone(&"x".repeat(48), PowerScope::PACKAGE, "")], "47"),
            (
                vec![
                    zone("a", PowerScope::PACKAGE, ""),
                    zone("a", PowerScope::DRAM, ""),
                ],
                "twice",
            ),
            (
                vec![zone("board", PowerScope(42), "")],
                "zone board declares unknown scope 42 (known: package, core, uncore, dram, platform, device)",
            ),
            (vec![zone("core", PowerScope::CORE, "package")], "parent"),
            (vec![zone("core", PowerScope::CORE, "core")], "parent"),
        ] {
            let e = validate_power_zones(&zones).expect_err(needle);
            assert!(e.contains(needle), "{e:?} should mention {needle:?}");
        }
        let mut slow = zone("a", PowerScope::PACKAGE, "");
        slow.update_interval_us = 0;
        assert!(validate_power_zones(&[slow]).is_err());
    }

    #[test]
    fn declarations_need_a_name_a_known_scope_and_an_interval() {
        let decl = |name: &str, scope: PowerScope, us: u64| PowerSourceDecl {
            name: name.into(),
            description: "".into(),
            scope,
            update_interval_us: us,
        };
        assert_eq!(
            validate_power_source(&decl("rapl", PowerScope::PACKAGE, 1000)),
            Ok(())
        );
        assert!(validate_power_source(&decl("Rapl", PowerScope::PACKAGE, 1000)).is_err());
        assert!(validate_power_source(&decl("rapl", PowerScope(0), 1000))
            .expect_err("scope")
            .contains("unknown scope 0"));
        assert!(validate_power_source(&decl("rapl", PowerScope::PACKAGE, 0)).is_err());
        assert_eq!(PowerScope::KNOWN.len(), 6);
        assert!(PowerScope::KNOWN.iter().all(|s| s.name().is_some()));
    }
}
