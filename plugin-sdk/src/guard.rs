//! Panic guards: every call from the host runs inside `catch_unwind`, so a
//! panicking plugin returns an error instead of aborting the host.

use std::{
    any::Any,
    panic::{catch_unwind, AssertUnwindSafe},
    time::Duration,
};

use abi_stable::{
    sabi_trait::TD_Opaque,
    std_types::{RResult, RStr, RString, RVec},
};
use kernmlops_plugin_api::{
    Batch, Benchmark, BenchmarkBox, BenchmarkDecl, BenchmarkStatus, Benchmark_TO, BpfProgramStats,
    ErrorKind, Graph, GraphBox, GraphDecl, GraphInput, Graph_TO, PluginError, PluginInfo,
    PluginResult, Probe, ProbeBox, ProbeDecl, Probe_TO, StartArgs, TableDecl,
    DATA_CONTRACT_VERSION,
};

use crate::{settings, BenchmarkImpl, GraphImpl, ProbeImpl};

/// Text of a panic payload.
fn panic_message(payload: Box<dyn Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_owned()
    }
}

thread_local! {
    /// Where the last panic on this thread happened, for the error message.
    static PANIC_LOCATION: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Replaces this plugin's panic hook (each plugin links its own std, so the
/// host's hook is untouched): a caught panic becomes one error line with its
/// location instead of a message and backtrace on stderr.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let location = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()));
            PANIC_LOCATION.with(|p| *p.borrow_mut() = location);
        }));
    });
}

/// Runs `f`, turning a panic or an error into an error string.
fn guarded<T>(what: &str, f: impl FnOnce() -> crate::Result<T>) -> PluginResult<T> {
    install_panic_hook();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => RResult::ROk(v),
        Ok(Err(e)) => RResult::RErr(PluginError::new(e.kind, e.message)),
        Err(payload) => {
            let at = PANIC_LOCATION
                .with(|p| p.borrow_mut().take())
                .map(|l| format!(" (at {l})"))
                .unwrap_or_default();
            RResult::RErr(PluginError::new(
                ErrorKind::PANIC,
                format!("{what} panicked: {}{at}", panic_message(payload)),
            ))
        }
    }
}

/// Whether a component panicked: its state may be half-updated, so it
/// refuses further calls.
#[derive(Debug, Default)]
struct Poison {
    panicked: bool,
}

impl Poison {
    /// Runs `f` as [`guarded`] does, refused with `refusal` (an error of
    /// kind panic) once the component panicked.
    fn guard<T>(
        &mut self,
        what: &str,
        refusal: impl FnOnce() -> String,
        f: impl FnOnce() -> crate::Result<T>,
    ) -> PluginResult<T> {
        if self.panicked {
            return RResult::RErr(PluginError::new(ErrorKind::PANIC, refusal()));
        }
        self.run(what, f)
    }

    /// Runs `f` as [`guarded`] does, even after a panic, noting a new one.
    fn run<T>(&mut self, what: &str, f: impl FnOnce() -> crate::Result<T>) -> PluginResult<T> {
        let r = guarded(what, f);
        if let RResult::RErr(e) = &r {
            if e.kind == ErrorKind::PANIC {
                self.panicked = true;
            }
        }
        r
    }
}

pub fn info(name: &str, version: &str, description: &str) -> PluginInfo {
    PluginInfo {
        name: name.into(),
        version: version.into(),
        description: description.into(),
        data_contract: DATA_CONTRACT_VERSION,
    }
}

pub fn list<T>(f: impl FnOnce() -> Vec<T>) -> PluginResult<RVec<T>> {
    guarded("listing components", || Ok(RVec::from(f())))
}

pub fn not_found<T>(what: &str, name: &str) -> PluginResult<T> {
    RResult::RErr(PluginError::new(
        ErrorKind::NOT_FOUND,
        format!("this plugin has no {what} named {name}"),
    ))
}

/// What creates a component of one kind from the host's arguments.
pub type Create<B> = fn(&StartArgs) -> PluginResult<B>;
/// What returns a component's default settings as TOML.
pub type Defaults = fn() -> PluginResult<RString>;
/// What checks settings for a component given as JSON.
pub type Check = fn(&str) -> PluginResult<()>;

/// The entry of the component named `name`, or an error of kind not found
/// naming `what` it is.
pub fn lookup<F: Copy>(what: &str, entries: &[(&str, F)], name: &str) -> PluginResult<F> {
    match entries.iter().find(|(n, _)| *n == name) {
        Some((_, f)) => RResult::ROk(*f),
        None => not_found(what, name),
    }
}

/// The defaults of `S` as TOML ([`settings::defaults_toml`]).
pub fn settings_defaults<S: settings::Settings>() -> PluginResult<RString> {
    RResult::ROk(settings::defaults_toml::<S>().into())
}

pub fn probe_decl<P: ProbeImpl>() -> ProbeDecl {
    P::decl()
}

/// `[probes.<name>]`, the section a probe's settings errors name.
fn probe_section<P: ProbeImpl>() -> String {
    format!("[probes.{}]", P::NAME)
}

pub fn check_probe_config<P: ProbeImpl>(config_json: &str) -> PluginResult<()> {
    guarded("checking the settings", || {
        settings::parse::<P::Settings>(&probe_section::<P>(), config_json).map(|_| ())
    })
}

pub fn check_benchmark_config<B: BenchmarkImpl>(config_json: &str) -> PluginResult<()> {
    guarded("checking the settings", || {
        B::new(&StartArgs::new(config_json))
            .map(|_| ())
            .map_err(|mut e| {
                if e.kind == ErrorKind::OTHER {
                    e.kind = ErrorKind::CONFIG;
                }
                e
            })
    })
}

pub fn new_probe<P: ProbeImpl>(args: &StartArgs) -> PluginResult<ProbeBox> {
    guarded("starting the probe", || {
        let settings = settings::parse::<P::Settings>(&probe_section::<P>(), &args.config_json)?;
        P::start(args, settings)
    })
    .map(|p| {
        Probe_TO::from_value(
            Guarded {
                inner: p,
                poison: Poison::default(),
                batches: Vec::new(),
            },
            TD_Opaque,
        )
    })
}

/// A probe behind the ABI. After a panic it refuses further calls, since its
/// state may be half-updated.
struct Guarded<P> {
    inner: P,
    poison: Poison,
    /// Scratch space to expose the host's batches as a slice.
    batches: Vec<Batch>,
}

impl<P: ProbeImpl> Guarded<P> {
    fn call<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut P) -> crate::Result<T>,
    ) -> PluginResult<T> {
        let inner = &mut self.inner;
        self.poison.guard(
            what,
            || format!("{what}: the probe panicked earlier and is stopped"),
            || f(inner),
        )
    }
}

impl<P: ProbeImpl> Probe for Guarded<P> {
    fn drain(&mut self, timeout_ms: u32, batches: &mut RVec<Batch>) -> PluginResult<()> {
        // Move the host's batches into a Vec for the slice API and back, so
        // buffers keep their allocations.
        let mut scratch = std::mem::take(&mut self.batches);
        scratch.clear();
        scratch.extend(batches.drain(..));
        let r = self.call("draining", |p| {
            p.drain(Duration::from_millis(u64::from(timeout_ms)), &mut scratch)
        });
        batches.extend(scratch.drain(..));
        self.batches = scratch;
        r
    }

    fn stop(&mut self) -> PluginResult<()> {
        self.call("stopping", |p| p.stop())
    }

    fn tables(&self) -> RVec<TableDecl> {
        // A panic here leaves no tables, which the host reports.
        catch_unwind(AssertUnwindSafe(|| self.inner.tables()))
            .map(RVec::from)
            .unwrap_or_default()
    }

    fn notes(&self) -> RVec<RString> {
        catch_unwind(AssertUnwindSafe(|| self.inner.notes()))
            .map(|n| n.into_iter().map(RString::from).collect())
            .unwrap_or_else(|_| RVec::from(vec![RString::from("listing notes panicked")]))
    }

    fn bpf_stats(&self) -> RVec<BpfProgramStats> {
        // A panic here leaves no statistics; the host reports them missing.
        catch_unwind(AssertUnwindSafe(|| self.inner.bpf_stats()))
            .map(RVec::from)
            .unwrap_or_default()
    }
}

pub fn benchmark_decl<B: BenchmarkImpl>() -> BenchmarkDecl {
    BenchmarkDecl {
        name: B::NAME.into(),
        description: B::DESCRIPTION.into(),
    }
}

pub fn new_benchmark<B: BenchmarkImpl>(args: &StartArgs) -> PluginResult<BenchmarkBox> {
    guarded("configuring the benchmark", || B::new(args)).map(|b| {
        Benchmark_TO::from_value(
            GuardedBenchmark {
                inner: b,
                poison: Poison::default(),
            },
            TD_Opaque,
        )
    })
}

/// A benchmark behind the ABI; after a panic it refuses every call but
/// `kill`, which is still tried so nothing stays running.
struct GuardedBenchmark<B> {
    inner: B,
    poison: Poison,
}

impl<B: BenchmarkImpl> GuardedBenchmark<B> {
    fn call<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut B) -> crate::Result<T>,
    ) -> PluginResult<T> {
        let inner = &mut self.inner;
        if what == "killing" {
            return self.poison.run(what, || f(inner));
        }
        self.poison.guard(
            what,
            || format!("{what}: the benchmark panicked earlier"),
            || f(inner),
        )
    }
}

impl<B: BenchmarkImpl> Benchmark for GuardedBenchmark<B> {
    fn is_configured(&self) -> PluginResult<()> {
        guarded("checking the benchmark", || self.inner.is_configured())
    }

    fn setup(&mut self) -> PluginResult<()> {
        self.call("setting up", |b| b.setup())
    }

    fn launch(&mut self) -> PluginResult<()> {
        self.call("launching", |b| b.launch())
    }

    fn poll(&mut self) -> PluginResult<BenchmarkStatus> {
        self.call("polling", |b| b.poll())
            .map(|code| BenchmarkStatus {
                finished: code.is_some(),
                exit_code: code.unwrap_or(0),
            })
    }

    fn kill(&mut self) -> PluginResult<()> {
        self.call("killing", |b| b.kill())
    }

    fn result(&self) -> PluginResult<RString> {
        guarded("reporting the result", || {
            Ok(self
                .inner
                .result()?
                .map(|v| RString::from(v.to_string()))
                .unwrap_or_default())
        })
    }
}

pub fn graph_decl<G: GraphImpl>() -> GraphDecl {
    GraphDecl {
        name: G::NAME.into(),
        description: G::DESCRIPTION.into(),
        tables: G::TABLES.iter().map(|t| RString::from(*t)).collect(),
        tables_with_columns: G::TABLES_WITH_COLUMNS
            .iter()
            .map(|c| RString::from(*c))
            .collect(),
    }
}

pub fn new_graph<G: GraphImpl>(args: &StartArgs) -> PluginResult<GraphBox> {
    guarded("preparing the graph", || G::new(args))
        .map(|g| Graph_TO::from_value(GuardedGraph { inner: g }, TD_Opaque))
}

/// A graph behind the ABI.
struct GuardedGraph<G> {
    inner: G,
}

impl<G: GraphImpl> Graph for GuardedGraph<G> {
    fn render(
        &mut self,
        collection_dir: RStr<'_>,
        _out_dir: RStr<'_>,
    ) -> PluginResult<RVec<RString>> {
        RResult::RErr(PluginError::new(
            ErrorKind::OTHER,
            format!(
                "graph {} renders from the host's data (render_input), not from the files of {collection_dir}",
                G::NAME
            ),
        ))
    }

    fn render_input(
        &mut self,
        input: &GraphInput,
        out_dir: RStr<'_>,
    ) -> PluginResult<RVec<RString>> {
        let inner = &mut self.inner;
        guarded("rendering", || {
            inner
                .render(
                    crate::graph::GraphData::new(input),
                    std::path::Path::new(out_dir.as_str()),
                )
                .map(|files| {
                    files
                        .iter()
                        .map(|f| RString::from(f.display().to_string()))
                        .collect()
                })
        })
    }
}

/// `[power.settings.<name>]`, the section a power source's settings errors
/// name.
fn power_section<S: crate::power::PowerSourceImpl>() -> String {
    crate::power::settings_section(S::NAME)
}

pub fn power_source_decl<S: crate::power::PowerSourceImpl>() -> kernmlops_plugin_api::PowerSourceDecl
{
    kernmlops_plugin_api::PowerSourceDecl {
        name: S::NAME.into(),
        description: S::DESCRIPTION.into(),
        scope: S::SCOPE,
        update_interval_us: u64::try_from(S::UPDATE_INTERVAL.as_micros()).unwrap_or(u64::MAX),
    }
}

pub fn check_power_source_config<S: crate::power::PowerSourceImpl>(
    config_json: &str,
) -> PluginResult<()> {
    guarded("checking the settings", || {
        settings::parse::<S::Settings>(&power_section::<S>(), config_json).map(|_| ())
    })
}

pub fn new_power_source<S: crate::power::PowerSourceImpl>(
    args: &StartArgs,
) -> PluginResult<kernmlops_plugin_api::PowerSourceBox> {
    guarded("starting the power source", || {
        let settings = settings::parse::<S::Settings>(&power_section::<S>(), &args.config_json)?;
        let source = S::start(args, settings)?;
        let zones: Vec<kernmlops_plugin_api::PowerZone> =
            source.zones().iter().map(|z| z.to_abi()).collect();
        Ok(GuardedPower {
            failed: vec![None; zones.len()],
            last: vec![0; zones.len()],
            zones,
            inner: source,
            poison: Poison::default(),
            scratch: Vec::new(),
        })
    })
    .map(|p| kernmlops_plugin_api::PowerSource_TO::from_value(p, TD_Opaque))
}

/// A power source behind the ABI: its zones fixed at start, a failed zone
/// kept failed with its first error, energy checked never to decrease, and
/// after a panic every read refused.
struct GuardedPower<S> {
    inner: S,
    zones: Vec<kernmlops_plugin_api::PowerZone>,
    /// Per zone: why it failed, once it has.
    failed: Vec<Option<String>>,
    /// Per zone: the last energy returned.
    last: Vec<u64>,
    poison: Poison,
    scratch: Vec<crate::power::ZoneReading>,
}

impl<S: crate::power::PowerSourceImpl> kernmlops_plugin_api::PowerSource for GuardedPower<S> {
    fn zones(&self) -> RVec<kernmlops_plugin_api::PowerZone> {
        RVec::from(self.zones.clone())
    }

    fn read(
        &mut self,
        readings: &mut RVec<kernmlops_plugin_api::PowerReading>,
    ) -> PluginResult<()> {
        let now = kernmlops_sys::clock::uptime_us();
        let (inner, scratch) = (&mut self.inner, &mut self.scratch);
        let r = self.poison.guard(
            "reading",
            || "reading: the power source panicked earlier and is stopped".to_owned(),
            || {
                scratch.clear();
                inner.read(now, scratch)
            },
        );
        if let RResult::RErr(e) = r {
            return RResult::RErr(e);
        }
        if self.scratch.len() != self.zones.len() {
            return RResult::RErr(PluginError::new(
                ErrorKind::OTHER,
                format!(
                    "the source returned {} readings for {} zones",
                    self.scratch.len(),
                    self.zones.len()
                ),
            ));
        }
        readings.clear();
        for (i, reading) in self.scratch.drain(..).enumerate() {
            if self.failed[i].is_none() {
                match reading {
                    Ok(v) if v < self.last[i] => {
                        self.failed[i] = Some(format!(
                            "the source's energy went backwards from {} to {v} uJ",
                            self.last[i]
                        ));
                    }
                    Ok(v) => self.last[i] = v,
                    Err(e) => self.failed[i] = Some(e),
                }
            }
            readings.push(kernmlops_plugin_api::PowerReading {
                ts_uptime_us: now,
                energy_uj: self.last[i],
                error: self.failed[i].as_deref().unwrap_or("").into(),
            });
        }
        RResult::ROk(())
    }

    fn notes(&self) -> RVec<RString> {
        catch_unwind(AssertUnwindSafe(|| self.inner.notes()))
            .map(|n| n.into_iter().map(RString::from).collect())
            .unwrap_or_else(|_| RVec::from(vec![RString::from("listing notes panicked")]))
    }

    fn model(&self) -> RString {
        catch_unwind(AssertUnwindSafe(|| self.inner.model()))
            .ok()
            .flatten()
            .map(|m| RString::from(m.to_string()))
            .unwrap_or_default()
    }
}
