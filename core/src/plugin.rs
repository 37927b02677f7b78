//! Finding and loading plugin `.so` files: the ABI check, the declaration
//! checks, and the registry of probes the loaded plugins offer.
//!
//! A plugin that fails to load is recorded with its reason and skipped; the
//! others still load.

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    io::Read,
    path::{Path, PathBuf},
};

use abi_stable::{
    library::lib_header_from_path,
    std_types::{RResult, RVec},
};
use kernmlops_plugin_api::{
    BenchmarkBox, BenchmarkDecl, GraphBox, GraphDecl, PluginInfo, PluginMod_Ref, PluginResult,
    ProbeBox, ProbeDecl, StartArgs,
};
use sha2::{Digest, Sha256};

use crate::validate::{validate_contract, validate_table, ValidationError};

/// Why a plugin file was refused.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("not a kernmlops plugin: {0}")]
    NotAPlugin(String),
    #[error("incompatible plugin ABI (rebuild it against this kernmlops): {0}")]
    Abi(String),
    #[error("{0}")]
    Invalid(#[from] ValidationError),
    #[error("listing its probes failed: {0}")]
    Listing(String),
    #[error("probe {probe}: its default settings are not TOML: {message}")]
    ConfigDefaults { probe: String, message: String },
    #[error("a plugin named {name} is already loaded from {other}")]
    DuplicatePlugin { name: String, other: String },
    #[error("reading the file: {0}")]
    Io(#[from] std::io::Error),
}

/// A loaded, validated plugin.
pub struct Plugin {
    pub path: PathBuf,
    pub sha256: String,
    pub info: PluginInfo,
    pub probes: Vec<ProbeDecl>,
    /// Each probe's settings with defaults (TOML), by probe name.
    pub config_defaults: BTreeMap<String, String>,
    /// Workload benchmarks this plugin offers.
    pub benchmarks: Vec<BenchmarkDecl>,
    /// Each benchmark's settings with defaults (TOML), by name.
    pub benchmark_defaults: BTreeMap<String, String>,
    /// Graphs this plugin offers.
    pub graphs: Vec<GraphDecl>,
    module: PluginMod_Ref,
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.path)
            .field("name", &self.info.name)
            .finish_non_exhaustive()
    }
}

impl Plugin {
    /// Loads the plugin at `path`, checking its ABI and every declaration.
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        let sha256 = file_sha256(path)?;
        let header = lib_header_from_path(path).map_err(|e| LoadError::NotAPlugin(one_line(&e)))?;
        let module = header
            .init_root_module::<PluginMod_Ref>()
            .map_err(|e| LoadError::Abi(one_line(&e)))?;
        let info = (module.info())();
        validate_contract(info.data_contract)?;
        let probes = match (module.probes())() {
            RResult::ROk(p) => p.into_vec(),
            RResult::RErr(e) => return Err(LoadError::Listing(e.to_string())),
        };
        let mut config_defaults = BTreeMap::new();
        for probe in &probes {
            for table in probe.tables.iter() {
                validate_table(table)?;
            }
            let name = probe.name.to_string();
            config_defaults.insert(name.clone(), settings_defaults(&module, &name)?);
        }
        // Plugins built before benchmarks and graphs existed offer none.
        let benchmarks = optional_list(module.benchmarks())?;
        let mut benchmark_defaults = BTreeMap::new();
        for b in &benchmarks {
            let name = b.name.to_string();
            benchmark_defaults.insert(name.clone(), settings_defaults(&module, &name)?);
        }
        let graphs = optional_list(module.graphs())?;
        Ok(Self {
            path: path.to_owned(),
            sha256,
            info,
            probes,
            config_defaults,
            benchmarks,
            benchmark_defaults,
            graphs,
            module,
        })
    }

    pub fn name(&self) -> &str {
        self.info.name.as_str()
    }

    /// Creates, loads and attaches one of this plugin's probes.
    pub fn start_probe(&self, probe: &str, args: &StartArgs) -> Result<ProbeBox, String> {
        match (self.module.new_probe())(probe.into(), args) {
            RResult::ROk(p) => Ok(p),
            RResult::RErr(e) => Err(e.to_string()),
        }
    }
}

impl Plugin {
    /// Creates one of this plugin's graphs.
    pub fn start_graph(&self, name: &str, args: &StartArgs) -> Result<GraphBox, String> {
        let Some(new) = self.module.new_graph() else {
            return Err(format!("plugin {} offers no graphs", self.name()));
        };
        match new(name.into(), args) {
            RResult::ROk(g) => Ok(g),
            RResult::RErr(e) => Err(e.to_string()),
        }
    }

    /// Creates one of this plugin's benchmarks with its settings.
    pub fn start_benchmark(&self, name: &str, args: &StartArgs) -> Result<BenchmarkBox, String> {
        let Some(new) = self.module.new_benchmark() else {
            return Err(format!("plugin {} offers no benchmarks", self.name()));
        };
        match new(name.into(), args) {
            RResult::ROk(b) => Ok(b),
            RResult::RErr(e) => Err(e.to_string()),
        }
    }
}

/// A component list from a root-module field that older plugins lack.
fn optional_list<T>(
    field: Option<extern "C" fn() -> PluginResult<RVec<T>>>,
) -> Result<Vec<T>, LoadError> {
    match field.map(|f| f()) {
        Some(RResult::ROk(list)) => Ok(list.into_vec()),
        Some(RResult::RErr(e)) => Err(LoadError::Listing(e.to_string())),
        None => Ok(Vec::new()),
    }
}

/// A component's declared settings (TOML), checked to parse; empty for
/// plugins built before components declared settings.
fn settings_defaults(module: &PluginMod_Ref, name: &str) -> Result<String, LoadError> {
    let text = match module.probe_config().map(|f| f(name.into())) {
        Some(RResult::ROk(t)) => t.into_string(),
        Some(RResult::RErr(e)) => return Err(LoadError::Listing(e.to_string())),
        None => String::new(),
    };
    if let Err(e) = text.parse::<toml::Table>() {
        return Err(LoadError::ConfigDefaults {
            probe: name.to_owned(),
            message: e.message().to_owned(),
        });
    }
    Ok(text)
}

/// abi_stable's errors span many lines; keep the first meaningful ones.
fn one_line(e: &dyn fmt::Display) -> String {
    let text = e.to_string();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(3)
        .collect();
    lines.join(" ")
}

fn file_sha256(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The `.so` files in `dir`, sorted by name.
pub fn discover(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "so") && p.is_file())
        .collect();
    found.sort();
    Ok(found)
}

/// Every plugin found in a directory: those loaded and those refused.
#[derive(Debug, Default)]
pub struct Registry {
    pub dir: PathBuf,
    pub plugins: Vec<Plugin>,
    pub failures: Vec<(PathBuf, LoadError)>,
}

impl Registry {
    /// Loads every `.so` in `dir`. Table names must be unique across
    /// plugins: a later plugin redeclaring a table is refused.
    pub fn load_dir(dir: &Path) -> std::io::Result<Self> {
        let mut reg = Self {
            dir: dir.to_owned(),
            ..Self::default()
        };
        let mut owners: HashMap<String, String> = HashMap::new();
        for path in discover(dir)? {
            match Plugin::load(&path).and_then(|p| reg.check_unique(&p, &owners).map(|()| p)) {
                Ok(p) => {
                    for table in p.probes.iter().flat_map(|pr| pr.tables.iter()) {
                        owners.insert(table.name.to_string(), p.name().to_owned());
                    }
                    reg.plugins.push(p);
                }
                Err(e) => reg.failures.push((path, e)),
            }
        }
        Ok(reg)
    }

    fn check_unique(&self, p: &Plugin, owners: &HashMap<String, String>) -> Result<(), LoadError> {
        if let Some(other) = self.plugins.iter().find(|o| o.name() == p.name()) {
            return Err(LoadError::DuplicatePlugin {
                name: p.name().to_owned(),
                other: other.path.display().to_string(),
            });
        }
        for table in p.probes.iter().flat_map(|pr| pr.tables.iter()) {
            if let Some(owner) = owners.get(table.name.as_str()) {
                return Err(ValidationError::DuplicateTable {
                    table: table.name.to_string(),
                    owner: owner.clone(),
                }
                .into());
            }
        }
        Ok(())
    }

    /// The plugin offering the probe named `name`, with its declaration.
    pub fn find_probe(&self, name: &str) -> Option<(&Plugin, &ProbeDecl)> {
        self.plugins.iter().find_map(|p| {
            p.probes
                .iter()
                .find(|d| d.name.as_str() == name)
                .map(|d| (p, d))
        })
    }

    /// (probe name, default settings TOML) of every probe offered.
    pub fn config_defaults(&self) -> impl Iterator<Item = (&str, &str)> {
        self.plugins.iter().flat_map(|p| {
            p.config_defaults
                .iter()
                .map(|(n, t)| (n.as_str(), t.as_str()))
        })
    }

    /// (benchmark name, default settings TOML) of every benchmark offered.
    pub fn benchmark_defaults(&self) -> impl Iterator<Item = (&str, &str)> {
        self.plugins.iter().flat_map(|p| {
            p.benchmark_defaults
                .iter()
                .map(|(n, t)| (n.as_str(), t.as_str()))
        })
    }

    /// The plugin offering the benchmark `name`, or what is available.
    pub fn find_benchmark(&self, name: &str) -> Result<(&Plugin, &BenchmarkDecl), String> {
        self.plugins
            .iter()
            .find_map(|p| {
                p.benchmarks
                    .iter()
                    .find(|b| b.name.as_str() == name)
                    .map(|b| (p, b))
            })
            .ok_or_else(|| {
                let mut names: Vec<&str> = self
                    .plugins
                    .iter()
                    .flat_map(|p| p.benchmarks.iter().map(|b| b.name.as_str()))
                    .collect();
                names.sort_unstable();
                format!(
                    "unknown benchmark {name:?} in {}; available: {}",
                    self.dir.display(),
                    if names.is_empty() {
                        "none".to_owned()
                    } else {
                        names.join(", ")
                    }
                )
            })
    }

    /// Names of every probe offered, sorted.
    pub fn probe_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .plugins
            .iter()
            .flat_map(|p| p.probes.iter().map(|d| d.name.to_string()))
            .collect();
        names.sort();
        names
    }

    /// Resolves requested probe names, or explains what is missing.
    pub fn resolve<'a>(
        &'a self,
        names: &[String],
    ) -> Result<Vec<(&'a Plugin, &'a ProbeDecl)>, String> {
        let mut out = Vec::new();
        for name in names {
            match self.find_probe(name) {
                Some(found) => {
                    if out
                        .iter()
                        .any(|(_, d): &(&Plugin, &ProbeDecl)| d.name.as_str() == name)
                    {
                        return Err(format!("probe {name} is listed twice"));
                    }
                    out.push(found);
                }
                None => {
                    let available = self.probe_names();
                    let mut msg = format!(
                        "unknown plugin {name:?} in {}; available: {}",
                        self.dir.display(),
                        if available.is_empty() {
                            "none (build them with `cargo xtask build-plugins`)".to_owned()
                        } else {
                            available.join(", ")
                        }
                    );
                    if !self.failures.is_empty() {
                        let failed: Vec<String> = self
                            .failures
                            .iter()
                            .map(|(p, e)| format!("{} ({e})", p.display()))
                            .collect();
                        msg.push_str(&format!("; refused: {}", failed.join("; ")));
                    }
                    return Err(msg);
                }
            }
        }
        Ok(out)
    }
}
