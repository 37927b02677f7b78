//! Glue shared by every kernmlops plugin, so that a plugin's own code is its
//! BPF program, its table declarations and little else.
//!
//! - [`export_plugin!`] exports the ABI root module for a list of probes,
//!   wrapping every entry point so a panic becomes an error, never an abort.
//! - [`ProbeImpl`] is what a probe implements in plain Rust.
//! - [`bpf::BpfProbe`] loads a libbpf-cargo skeleton, attaches every program
//!   (checking each), drains its ring buffers into the host's batches and
//!   reads the per-table lost-event counters kept by `bpf/kml.bpf.h`.
//! - [`table::TableBuilder`] declares a table from the skeleton's generated
//!   event type, so offsets and sizes come from the compiler.

pub mod bpf;
mod guard;
pub mod indicator;
pub mod table;
pub mod testing;
pub mod workload;

use std::time::Duration;

pub use kernmlops_plugin_api as api;
pub use kernmlops_plugin_api::{Batch, ColumnKind, ProbeDecl, StartArgs, TableDecl};
/// Re-exported so plugins parse `StartArgs::config_json` without their own
/// dependency on it.
pub use serde_json;

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
/// [`api::ProbeBox`] with every call guarded against panics.
pub trait ProbeImpl: Sized + Send + 'static {
    /// The probe's name, as users type it in `--plugins`.
    const NAME: &'static str;

    /// The probe's settings with their defaults: the body of its
    /// `[probes.<name>]` table in TOML, with a comment per key. Empty when
    /// it has none. Keep it equal to the settings' `Default` (check with
    /// `testing::check_config_defaults`).
    const CONFIG_DEFAULTS: &'static str = "";

    /// The probe and the tables it produces, in the order of `drain`'s
    /// batches.
    fn decl() -> ProbeDecl;

    /// Creates, loads and attaches the probe.
    fn start(args: &StartArgs) -> Result<Self>;

    /// Waits up to `timeout` for data, then appends every available record to
    /// `batches[i]` for the i-th declared table.
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
}

/// A workload benchmark written in plain Rust. [`export_plugin!`] turns it
/// into an ABI [`api::BenchmarkBox`] with every call guarded against
/// panics. The host calls `is_configured`, `setup`, `launch`, then `poll`
/// until it reports an exit code, and `kill` at the end in every case.
pub trait BenchmarkImpl: Sized + Send + 'static {
    /// The benchmark's name, as users type it in `--benchmark`.
    const NAME: &'static str;
    /// One line saying what it runs.
    const DESCRIPTION: &'static str;
    /// Settings with defaults, as for [`ProbeImpl::CONFIG_DEFAULTS`]
    /// (`[benchmarks.<name>]`).
    const CONFIG_DEFAULTS: &'static str = "";

    /// Parses the settings (`args.config_json`), naming a bad key.
    fn new(args: &StartArgs) -> Result<Self>;
    /// Fails with what to install or configure when the software is missing.
    fn is_configured(&self) -> Result<()>;
    /// Prepares the machine (page cache, THP mode, data files).
    fn setup(&mut self) -> Result<()>;
    /// Starts the workload and returns at once.
    fn launch(&mut self) -> Result<()>;
    /// `Some(exit code)` once the workload has ended.
    fn poll(&mut self) -> Result<Option<i32>>;
    /// Stops the workload and everything it started; nothing stays running.
    fn kill(&mut self) -> Result<()>;

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

    fn new(args: &StartArgs) -> Result<Self>;
    /// Renders from `collection_dir` into `out_dir`, returning the files
    /// written (PNG and SVG).
    fn render(
        &mut self,
        collection_dir: &std::path::Path,
        out_dir: &std::path::Path,
    ) -> Result<Vec<std::path::PathBuf>>;
}

/// Not public API: used by the code [`export_plugin!`] generates.
#[doc(hidden)]
pub mod __private {
    pub use crate::guard::{
        benchmark_decl, graph_decl, info, list, new_benchmark, new_graph, new_probe, not_found,
    };
    pub use abi_stable;
    pub use kernmlops_plugin_api::{
        abi_stable::{
            prefix_type::PrefixTypeTrait,
            std_types::{RStr, RString, RVec},
        },
        BenchmarkBox, BenchmarkDecl, GraphBox, GraphDecl, PluginInfo, PluginMod, PluginMod_Ref,
        PluginResult, PowerSourceDecl, ProbeBox, ProbeDecl, StartArgs,
    };
}

/// Exports the plugin's root module.
///
/// ```ignore
/// kernmlops_plugin_sdk::export_plugin! {
///     description: "Scheduler run lengths and run-queue waits",
///     probes: [bpf::BpfProbe<QuantaRuntime>],
/// }
/// kernmlops_plugin_sdk::export_plugin! {
///     description: "Workloads",
///     probes: [],
///     benchmarks: [Redis, Memcached],
/// }
/// ```
/// The plugin's name and version are its crate's.
#[macro_export]
macro_rules! export_plugin {
    (description: $desc:expr, probes: [$($probe:ty),* $(,)?] $(,)?) => {
        $crate::export_plugin! { description: $desc, probes: [$($probe),*], benchmarks: [], graphs: [] }
    };
    (description: $desc:expr, probes: [$($probe:ty),* $(,)?], benchmarks: [$($bench:ty),* $(,)?] $(,)?) => {
        $crate::export_plugin! { description: $desc, probes: [$($probe),*], benchmarks: [$($bench),*], graphs: [] }
    };
    (description: $desc:expr, probes: [$($probe:ty),* $(,)?], graphs: [$($graph:ty),* $(,)?] $(,)?) => {
        $crate::export_plugin! { description: $desc, probes: [$($probe),*], benchmarks: [], graphs: [$($graph),*] }
    };
    (description: $desc:expr, probes: [$($probe:ty),* $(,)?], benchmarks: [$($bench:ty),* $(,)?], graphs: [$($graph:ty),* $(,)?] $(,)?) => {
        mod __kernmlops_plugin_export {
            #[allow(unused_imports)]
            use super::*;
            use $crate::__private as p;

            extern "C" fn info() -> p::PluginInfo {
                p::info(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"), $desc)
            }

            extern "C" fn probes() -> p::PluginResult<p::RVec<p::ProbeDecl>> {
                p::list(|| vec![$(<$probe as $crate::ProbeImpl>::decl()),*])
            }

            extern "C" fn new_probe(
                name: p::RStr<'_>,
                args: &p::StartArgs,
            ) -> p::PluginResult<p::ProbeBox> {
                $(
                    if name.as_str() == <$probe as $crate::ProbeImpl>::NAME {
                        return p::new_probe::<$probe>(args);
                    }
                )*
                p::not_found("probe", name.as_str())
            }

            extern "C" fn graphs() -> p::PluginResult<p::RVec<p::GraphDecl>> {
                p::list(|| vec![$(p::graph_decl::<$graph>()),*])
            }

            extern "C" fn new_graph(
                name: p::RStr<'_>,
                args: &p::StartArgs,
            ) -> p::PluginResult<p::GraphBox> {
                $(
                    if name.as_str() == <$graph as $crate::GraphImpl>::NAME {
                        return p::new_graph::<$graph>(args);
                    }
                )*
                let _ = args;
                p::not_found("graph", name.as_str())
            }

            extern "C" fn benchmarks() -> p::PluginResult<p::RVec<p::BenchmarkDecl>> {
                p::list(|| vec![$(p::benchmark_decl::<$bench>()),*])
            }

            extern "C" fn new_benchmark(
                name: p::RStr<'_>,
                args: &p::StartArgs,
            ) -> p::PluginResult<p::BenchmarkBox> {
                $(
                    if name.as_str() == <$bench as $crate::BenchmarkImpl>::NAME {
                        return p::new_benchmark::<$bench>(args);
                    }
                )*
                let _ = args;
                p::not_found("benchmark", name.as_str())
            }

            extern "C" fn power_sources() -> p::PluginResult<p::RVec<p::PowerSourceDecl>> {
                p::list(Vec::new)
            }

            extern "C" fn probe_config(name: p::RStr<'_>) -> p::PluginResult<p::RString> {
                $(
                    if name.as_str() == <$probe as $crate::ProbeImpl>::NAME {
                        return p::PluginResult::ROk(
                            <$probe as $crate::ProbeImpl>::CONFIG_DEFAULTS.into(),
                        );
                    }
                )*
                $(
                    if name.as_str() == <$bench as $crate::BenchmarkImpl>::NAME {
                        return p::PluginResult::ROk(
                            <$bench as $crate::BenchmarkImpl>::CONFIG_DEFAULTS.into(),
                        );
                    }
                )*
                p::not_found("component", name.as_str())
            }

            #[p::abi_stable::export_root_module]
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
                }
                .leak_into_prefix()
            }
        }
    };
}
