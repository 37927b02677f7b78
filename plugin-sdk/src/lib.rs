//! Glue shared by every kernmlops plugin, so that a plugin's own code is its
//! probe, its table declarations and little else. This crate does not link
//! libbpf: BPF probes add `kernmlops-plugin-bpf`, which builds on it.
//!
//! - [`export_plugin!`] exports the ABI root module for a list of probes,
//!   benchmarks and graphs, wrapping every entry point so a panic becomes
//!   an error, never an abort.
//! - [`ProbeImpl`], [`BenchmarkImpl`], [`GraphImpl`]: what a component
//!   implements in plain Rust.
//! - [`table!`] declares a table from its record type, one line per column;
//!   [`Record`] and [`BatchExt`] push and read whole typed records.
//! - [`settings!`] declares a component's settings: defaults, comments,
//!   parsing and rules in one struct.
//! - [`workload`] runs benchmark commands in process groups; [`benchmark`]
//!   holds what a benchmark started and changed, and the machine settings
//!   every benchmark shares; [`indicator`] is the performance-indicator
//!   format of their results.

// Lets `settings!` name this crate the same way inside it as in plugins.
extern crate self as kernmlops_plugin_sdk;

pub mod benchmark;
pub mod graph;
mod guard;
pub mod indicator;
pub mod power;
pub mod record;
pub mod schedule;
pub mod settings;
pub mod table;
pub mod workload;

use std::time::Duration;

pub use kernmlops_plugin_api as api;
pub use kernmlops_plugin_api::{Batch, ColumnKind, ProbeDecl, StartArgs, TableDecl};
pub use kernmlops_sys as sys;
pub use power::PowerSourceImpl;
pub use record::{BatchExt, Record};
pub use schedule::Schedule;
/// Re-exported so plugins parse `StartArgs::config_json` without their own
/// dependency on it.
pub use serde_json;
pub use settings::{HumanDuration, NoSettings, Settings};

/// Error type of plugin code: a kind the host can act on and a message it
/// shows with its own context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: api::ErrorKind,
    pub message: String,
}

impl Error {
    /// An error of kind [`api::ErrorKind::OTHER`].
    pub fn new(msg: impl Into<String>) -> Self {
        Self::of(api::ErrorKind::OTHER, msg)
    }

    pub fn of(kind: api::ErrorKind, msg: impl Into<String>) -> Self {
        Self {
            kind,
            message: msg.into(),
        }
    }

    /// The user's settings are wrong.
    pub fn config(msg: impl Into<String>) -> Self {
        Self::of(api::ErrorKind::CONFIG, msg)
    }

    /// This machine lacks what the component needs.
    pub fn unsupported(msg: impl Into<String>) -> Self {
        Self::of(api::ErrorKind::UNSUPPORTED, msg)
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<String> for Error {
    fn from(s: String) -> Self {
        Self::new(s)
    }
}

impl From<&str> for Error {
    fn from(s: &str) -> Self {
        Self::new(s)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A probe written in plain Rust. [`export_plugin!`] turns it into an ABI
/// [`api::ProbeBox`] with every call guarded against panics. BPF probes do
/// not implement it by hand: `kernmlops-plugin-bpf`'s `bpf_probe!` does.
pub trait ProbeImpl: Sized + Send + 'static {
    /// The probe's name, as users type it in `--plugins`.
    const NAME: &'static str;

    /// The probe's settings (`[probes.<name>]`); [`NoSettings`] for none.
    /// Their `Default` is what `kernmlops config defaults` shows.
    type Settings: Settings;

    /// The probe and the tables it produces, in the order of `drain`'s
    /// batches.
    fn decl() -> ProbeDecl;

    /// Creates, loads and attaches the probe with its parsed and checked
    /// settings.
    fn start(args: &StartArgs, settings: Self::Settings) -> Result<Self>;

    /// Waits up to `timeout` for data, then appends every available record to
    /// `batches[i]` for the i-th table of [`ProbeImpl::tables`].
    fn drain(&mut self, timeout: Duration, batches: &mut [Batch]) -> Result<()>;

    /// Detaches from the kernel; a last `drain` follows.
    fn stop(&mut self) -> Result<()>;

    /// The tables this instance fills, in `drain`'s batch order: the
    /// declared ones unless the probe's settings choose its tables.
    fn tables(&self) -> Vec<TableDecl> {
        Self::decl().tables.into_vec()
    }

    /// What was skipped because this machine lacks it, one sentence each.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }

    /// The kernel's run-time statistics of the probe's BPF programs.
    fn bpf_stats(&self) -> Vec<api::BpfProgramStats> {
        Vec::new()
    }
}

/// A workload benchmark written in plain Rust. [`export_plugin!`] turns it
/// into an ABI [`api::BenchmarkBox`] with every call guarded against
/// panics. The host calls `is_configured`, `setup`, `launch`, then `poll`
/// until it reports an exit code, and `kill` at the end in every case.
///
/// What it starts and changes is kept in its [`benchmark::Run`], so `poll`
/// and `kill` need no code of its own.
pub trait BenchmarkImpl: Sized + Send + 'static {
    /// The benchmark's name, as users type it in `--benchmark`.
    const NAME: &'static str;
    /// One line saying what it runs.
    const DESCRIPTION: &'static str;

    /// The benchmark's settings (`[benchmarks.<name>]`), usually with the
    /// shared [`benchmark::MachineSettings`] flattened in; [`NoSettings`]
    /// for none. Their `Default` is what `kernmlops config defaults` shows.
    type Settings: Settings;

    /// Creates the benchmark with its parsed and checked settings; nothing
    /// runs yet.
    fn create(args: &StartArgs, settings: Self::Settings) -> Result<Self>;

    /// Parses the settings (`args.config_json`), naming the section and the
    /// bad key, and creates the benchmark: what the host's calls do.
    fn new(args: &StartArgs) -> Result<Self> {
        let settings =
            settings::parse::<Self::Settings>(&benchmark::section(Self::NAME), &args.config_json)?;
        Self::create(args, settings)
    }

    /// Fails with what to install or configure when the software is missing.
    fn is_configured(&self) -> Result<()>;
    /// Prepares the machine (page cache, data files).
    fn setup(&mut self) -> Result<()>;
    /// Starts the workload and returns at once.
    fn launch(&mut self) -> Result<()>;

    /// What the benchmark started and changed.
    fn run(&mut self) -> &mut benchmark::Run;

    /// `Some(exit code)` once the workload has ended.
    fn poll(&mut self) -> Result<Option<i32>> {
        self.run().poll()
    }

    /// Stops the workload and everything it started, and undoes what it
    /// changed; nothing stays running.
    fn kill(&mut self) -> Result<()> {
        self.run().kill()
    }

    /// The benchmark's own result once it has ended: a JSON object in the
    /// performance-indicator format (`name`, `component`, `@parameters`,
    /// `@result`, optional `overall_score`). `None` when it has none.
    fn result(&self) -> Result<Option<serde_json::Value>> {
        Ok(None)
    }
}

/// A graph written in plain Rust: renders images from the tables of a
/// collection folder. [`export_plugin!`] exports it with every call guarded.
pub trait GraphImpl: Sized + Send + 'static {
    /// The graph's name, as users see it in `kernmlops plugins`.
    const NAME: &'static str;
    /// One line saying what it shows.
    const DESCRIPTION: &'static str;
    /// Tables it reads; the host offers it when all of them exist.
    const TABLES: &'static [&'static str];
    /// A column set: every table whose columns (besides `collection_id`)
    /// are exactly these is given too (tables named at run time).
    const TABLES_WITH_COLUMNS: &'static [&'static str] = &[];

    fn new(args: &StartArgs) -> Result<Self>;
    /// Renders from the tables the host read (`data`) into `out_dir`,
    /// returning the files written (PNG and SVG).
    fn render(
        &mut self,
        data: graph::GraphData<'_>,
        out_dir: &std::path::Path,
    ) -> Result<Vec<std::path::PathBuf>>;
}

/// Not public API: used by the code [`export_plugin!`] generates.
#[doc(hidden)]
pub mod __private {
    pub use crate::guard::{
        benchmark_decl, check_benchmark_config, check_probe_config, graph_decl, info, list, lookup,
        new_benchmark, new_graph, new_probe, not_found, probe_decl, settings_defaults, Check,
        Create, Defaults,
    };
    pub use crate::guard::{check_power_source_config, new_power_source, power_source_decl};
    pub use abi_stable;
    pub use kernmlops_plugin_api::PowerSourceBox;
    pub use kernmlops_plugin_api::{
        abi_stable::{
            prefix_type::PrefixTypeTrait,
            std_types::{RStr, RString, RVec},
        },
        BenchmarkBox, BenchmarkDecl, GraphBox, GraphDecl, PluginInfo, PluginMod, PluginMod_Ref,
        PluginResult, PowerSourceDecl, ProbeBox, ProbeDecl, StartArgs,
    };
    pub use serde;

    /// `a == b` in a const context.
    pub const fn same_str(a: &str, b: &str) -> bool {
        let (a, b) = (a.as_bytes(), b.as_bytes());
        if a.len() != b.len() {
            return false;
        }
        let mut i = 0;
        while i < a.len() {
            if a[i] != b[i] {
                return false;
            }
            i += 1;
        }
        true
    }
}

/// Exports the plugin's root module. Every list is optional; the plugin's
/// name and version are its crate's.
///
/// ```ignore
/// kernmlops_plugin_sdk::export_plugin! {
///     description: "Scheduler run lengths and run-queue waits",
///     probes: [BpfProbe<QuantaRuntime>],
/// }
/// kernmlops_plugin_sdk::export_plugin! {
///     description: "Workloads",
///     benchmarks: [Redis, Memcached],
/// }
/// kernmlops_plugin_sdk::export_plugin! {
///     description: "RAPL energy counters",
///     power_sources: [Rapl],
/// }
/// ```
///
/// Plugins must unwind on panic (the SDK catches every panic at the
/// boundary); a plugin built with `panic = "abort"` does not compile.
#[macro_export]
macro_rules! export_plugin {
    (
        description: $desc:expr
        $(, probes: [$($probe:ty),* $(,)?])?
        $(, benchmarks: [$($bench:ty),* $(,)?])?
        $(, graphs: [$($graph:ty),* $(,)?])?
        $(, power_sources: [$($power:ty),* $(,)?])?
        $(,)?
    ) => {
        #[cfg(panic = "abort")]
        compile_error!(
            "kernmlops plugins must be built with panic = \"unwind\": the host catches a plugin's panics at the boundary, and with panic = \"abort\" one would kill the host"
        );

        mod __kernmlops_plugin_export {
            #[allow(unused_imports)]
            use super::*;
            use $crate::__private as p;

            extern "C" fn info() -> p::PluginInfo {
                p::info(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"), $desc)
            }

            $crate::__export_components! {
                probes, new_probe, "probe", ProbeDecl, ProbeBox, ProbeImpl, probe_decl,
                [$($($probe),*)?]
            }
            $crate::__export_components! {
                graphs, new_graph, "graph", GraphDecl, GraphBox, GraphImpl, graph_decl,
                [$($($graph),*)?]
            }
            $crate::__export_components! {
                benchmarks, new_benchmark, "benchmark", BenchmarkDecl, BenchmarkBox,
                BenchmarkImpl, benchmark_decl, [$($($bench),*)?]
            }
            $crate::__export_components! {
                power_sources, new_power_source, "power source", PowerSourceDecl,
                PowerSourceBox, PowerSourceImpl, power_source_decl, [$($($power),*)?]
            }

            extern "C" fn probe_config(name: p::RStr<'_>) -> p::PluginResult<p::RString> {
                let entries: &[(&str, p::Defaults)] = &[
                    $($((
                        <$probe as $crate::ProbeImpl>::NAME,
                        p::settings_defaults::<<$probe as $crate::ProbeImpl>::Settings>,
                    ),)*)?
                    $($((
                        <$bench as $crate::BenchmarkImpl>::NAME,
                        p::settings_defaults::<<$bench as $crate::BenchmarkImpl>::Settings>,
                    ),)*)?
                    $($((
                        <$power as $crate::PowerSourceImpl>::NAME,
                        p::settings_defaults::<<$power as $crate::PowerSourceImpl>::Settings>,
                    ),)*)?
                ];
                p::lookup("component", entries, name.as_str()).and_then(|defaults| defaults())
            }

            extern "C" fn check_config(
                name: p::RStr<'_>,
                config_json: p::RStr<'_>,
            ) -> p::PluginResult<()> {
                let entries: &[(&str, p::Check)] = &[
                    $($((<$probe as $crate::ProbeImpl>::NAME, p::check_probe_config::<$probe>),)*)?
                    $($((
                        <$bench as $crate::BenchmarkImpl>::NAME,
                        p::check_benchmark_config::<$bench>,
                    ),)*)?
                    $($((
                        <$power as $crate::PowerSourceImpl>::NAME,
                        p::check_power_source_config::<$power>,
                    ),)*)?
                ];
                p::lookup("component", entries, name.as_str())
                    .and_then(|check| check(config_json.as_str()))
            }

            // What abi_stable's `#[export_root_module]` expands to, written
            // out so a plugin needs no abi_stable dependency of its own: the
            // header the host finds by this symbol name (checked against
            // abi_stable's below), with the module's type layout.
            #[export_name = "_1as_0lib_1header_0root_bmodule_bloader"]
            pub static ROOT_MODULE_LOADER: p::abi_stable::library::LibHeader = {
                extern "C" fn erased() -> p::abi_stable::library::RootModuleResult {
                    p::abi_stable::library::__call_root_module_loader(root_module)
                }
                // SAFETY: `erased` returns the module of type `PluginMod_Ref`,
                // as `from_constructor` requires.
                unsafe {
                    p::abi_stable::library::LibHeader::from_constructor::<p::PluginMod_Ref>(
                        erased,
                        p::abi_stable::library::CheckTypeLayout::Yes,
                    )
                }
            };
            const _: () = assert!(
                p::same_str(
                    p::abi_stable::library::ROOT_MODULE_LOADER_NAME,
                    "_1as_0lib_1header_0root_bmodule_bloader",
                ),
                "abi_stable's root-module symbol changed: update export_plugin!",
            );

            pub fn root_module() -> p::PluginMod_Ref {
                use p::PrefixTypeTrait as _;
                p::PluginMod {
                    info,
                    probes,
                    new_probe,
                    graphs,
                    new_graph,
                    benchmarks,
                    new_benchmark,
                    power_sources,
                    probe_config,
                    check_config,
                    new_power_source,
                }
                .leak_into_prefix()
            }
        }
    };
}

/// One kind of component in [`export_plugin!`]: the root module's function
/// listing their declarations and the one creating one by name.
#[doc(hidden)]
#[macro_export]
macro_rules! __export_components {
    (
        $list:ident, $new:ident, $what:literal, $decl:ident, $boxed:ident, $impl:ident,
        $decl_of:ident, [$($t:ty),*]
    ) => {
        extern "C" fn $list() -> $crate::__private::PluginResult<
            $crate::__private::RVec<$crate::__private::$decl>,
        > {
            $crate::__private::list(|| vec![$($crate::__private::$decl_of::<$t>()),*])
        }

        extern "C" fn $new(
            name: $crate::__private::RStr<'_>,
            args: &$crate::__private::StartArgs,
        ) -> $crate::__private::PluginResult<$crate::__private::$boxed> {
            let entries: &[(&str, $crate::__private::Create<$crate::__private::$boxed>)] =
                &[$((<$t as $crate::$impl>::NAME, $crate::__private::$new::<$t>)),*];
            $crate::__private::lookup($what, entries, name.as_str()).and_then(|create| create(args))
        }
    };
}
