//! Finding and loading plugin `.so` files: the trust and ELF checks before
//! any plugin code runs ([`crate::trust`]), loading from the checked
//! descriptor, the ABI check, the declaration checks, conflicts between
//! plugins, and the registry of what the loaded plugins offer.
//!
//! A plugin that fails to load is recorded with its reason and skipped; the
//! others still load.
//!
//! Loading one file: open it (`O_RDONLY | O_CLOEXEC`), check its owner and
//! mode and those of every folder above it on descriptors, copy its bytes
//! from that descriptor into a private sealed memory file (`memfd_create`,
//! then `F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL`), check
//! that the copy is a complete shared library for this machine exporting
//! abi_stable's root module, and only then `dlopen("/proc/self/fd/N")` of
//! the copy. What is checked, hashed ([`Plugin::sha256`]) and loaded is one
//! set of bytes nobody can change: a plugin file overwritten in place (`cp`
//! over it, truncated) while the library is loaded no longer changes the
//! code under the running host (it died of SIGBUS, SIGSEGV or SIGILL).
//! Where the kernel refuses executable memory files (`vm.memfd_noexec =
//! 2`), the plugin is loaded from the checked descriptor itself, with a
//! warning.
//!
//! The copy's descriptor and the library are never closed: the root module
//! and everything it hands out refer into the library, and glibc recognises
//! an already-loaded library by that `/proc/self/fd/N` name, so the number
//! must never be reused for another file.

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::OsString,
    fmt,
    fs::File,
    io,
    os::{fd::AsRawFd, unix::ffi::OsStrExt, unix::fs::FileExt},
    path::{Path, PathBuf},
    sync::OnceLock,
};

use abi_stable::{
    abi_stability::abi_checking::{check_layout_compatibility, AbiInstability, ExpectedFound},
    library::{lib_header_from_raw_library, LibHeader, LibraryError, RawLibrary},
    std_types::{RResult, RVec},
    type_layout::{TLField, TLFieldOrFunction, TypeLayout},
    StableAbi,
};
use kernmlops_plugin_api::{
    BenchmarkBox, BenchmarkDecl, ErrorKind, GraphBox, GraphDecl, PluginError, PluginInfo,
    PluginMod_Ref, PluginResult, ProbeBox, ProbeDecl, StartArgs,
};
use sha2::{Digest, Sha256};

use kernmlops_plugin_api::spec::{validate_contract, validate_probe, ValidationError};

use crate::trust::{self, printable, Policy, Shown, TrustError};

/// The plugins shipped in this repository (`plugins/<name>`), by plugin
/// name. When a third-party plugin declares what one of these declares, the
/// third-party plugin is the one refused. A unit test keeps this list equal
/// to the `plugins/` folder.
pub const IN_TREE_PLUGINS: &[&str] = &[
    "block_io",
    "collapse_huge_pages",
    "cpu_time",
    "estimate",
    "file_data",
    "graphs",
    "hwmon",
    "memory_usage",
    "mm_rss_stat",
    "perf",
    "perf_power",
    "process_metadata",
    "process_trace",
    "procfs",
    "quanta_runtime",
    "rapl",
    "trace",
    "workloads",
];

/// The symbol abi_stable exports a root module under.
pub const ROOT_MODULE_SYMBOL: &str = abi_stable::library::ROOT_MODULE_LOADER_NAME;

/// Why a plugin file was refused. Each is one line; text that comes from a
/// plugin has its non-printable characters escaped.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("not a kernmlops plugin: {}", printable(.0.as_bytes()))]
    NotAPlugin(String),
    #[error("incompatible plugin ABI (rebuild it against this kernmlops's plugin API): {}", printable(.0.as_bytes()))]
    Abi(String),
    #[error("{}", printable(.0.to_string().as_bytes()))]
    Invalid(#[from] ValidationError),
    #[error("listing its components failed: {}", printable(.0.as_bytes()))]
    Listing(String),
    #[error("component {}: its default settings are not TOML: {}", printable(.probe.as_bytes()), printable(.message.as_bytes()))]
    ConfigDefaults { probe: String, message: String },
    #[error("{0}")]
    Trust(#[from] TrustError),
    #[error("{0}")]
    Conflict(Conflict),
    #[error("the dynamic loader refused it: {}", printable(.0.as_bytes()))]
    Open(String),
    /// Its private sealed copy could not be made.
    #[error("copying it: {0}")]
    Copy(String),
    #[error("reading the file: {0}")]
    Io(#[from] io::Error),
}

/// Two plugins declaring the same name. Which one is refused does not
/// depend on file names: a plugin shipped with kernmlops is kept against a
/// third-party one; otherwise both are refused, each naming the other.
#[derive(Debug)]
pub struct Conflict {
    /// "plugin name", "table", "probe", "benchmark" or "graph".
    pub what: &'static str,
    pub name: String,
    /// The other plugin's name and file.
    pub other: String,
    pub other_path: PathBuf,
    /// The other plugin ships with kernmlops and this one does not, so
    /// only this one is refused.
    pub displaced_by_in_tree: bool,
    /// Both plugins ship with kernmlops (two copies of one).
    pub both_in_tree: bool,
    /// Further conflicts of this plugin not described.
    pub more: usize,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, name, other) = (
            self.what,
            printable(self.name.as_bytes()),
            printable(self.other.as_bytes()),
        );
        let path = Shown(self.other_path.clone());
        if self.displaced_by_in_tree {
            write!(
                f,
                "declares {what} {name}, which belongs to plugin {other} shipped with kernmlops \
                 ({path}); the shipped plugin is kept and this one refused; fix: rename its {what}"
            )?;
        } else if self.both_in_tree {
            write!(
                f,
                "declares {what} {name}, as does {path} (plugin {other}): two copies of a plugin \
                 shipped with kernmlops, so both are refused; fix: remove one of them"
            )?;
        } else {
            write!(
                f,
                "declares {what} {name}, as does {path} (plugin {other}); neither ships with \
                 kernmlops, so both are refused; fix: remove or rename one of them"
            )?;
        }
        if self.more > 0 {
            write!(f, " (and {} more conflicts)", self.more)?;
        }
        Ok(())
    }
}

/// A loaded, validated plugin.
pub struct Plugin {
    pub path: PathBuf,
    /// The SHA-256 of the bytes loaded (the sealed copy), computed on first
    /// use ([`Plugin::sha256`]): only plugins a run uses are hashed.
    digest: FileDigest,
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
    /// The library, loaded from `file`; never unloaded (see the module
    /// documentation).
    _library: &'static RawLibrary,
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.path)
            .field("name", &self.info.name)
            .finish_non_exhaustive()
    }
}

/// The SHA-256 of a loaded plugin's file, read from the descriptor it was
/// loaded from on first request, then cached. Only plugins a run uses are
/// hashed.
pub struct FileDigest {
    file: &'static File,
    /// Lower-case hex, or why the file could not be read.
    hex: OnceLock<Result<String, String>>,
}

impl FileDigest {
    fn new(file: &'static File) -> Self {
        Self {
            file,
            hex: OnceLock::new(),
        }
    }

    /// The digest as lower-case hex.
    pub fn get(&self) -> io::Result<&str> {
        match self.hex.get_or_init(|| hash_file(self.file)) {
            Ok(hex) => Ok(hex),
            Err(e) => Err(io::Error::other(e.clone())),
        }
    }
}

impl fmt::Debug for FileDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileDigest")
            .field("hex", &self.hex.get())
            .finish_non_exhaustive()
    }
}

fn hash_file(file: &File) -> Result<String, String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut offset = 0u64;
    loop {
        // Positional reads: the descriptor's offset is shared with nobody,
        // but this way it does not matter.
        let n = match file.read_at(&mut buf, offset) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("unavailable: reading the plugin file: {e}")),
        };
        h.update(&buf[..n]);
        offset += n as u64;
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

impl Plugin {
    /// Loads the plugin at `path`: trust and ELF checks, then the ABI check
    /// and every declaration. Problems skipped under
    /// `policy.allow_insecure` are added to `warnings`.
    pub fn load(
        path: &Path,
        policy: &Policy,
        warnings: &mut Vec<String>,
    ) -> Result<Self, LoadError> {
        let file = trust::open_file(path)?;
        if !file.metadata()?.is_file() {
            return Err(TrustError::NotRegular {
                path: Shown(path.to_owned()),
            }
            .into());
        }
        Self::from_file(file, path, policy, warnings)
    }

    /// Loads the plugin from an opened regular file; `path` is how it is
    /// named in messages and in the registry.
    fn from_file(
        file: File,
        path: &Path,
        policy: &Policy,
        warnings: &mut Vec<String>,
    ) -> Result<Self, LoadError> {
        let file = Self::prepare(file, path, policy, warnings)?;
        Self::from_prepared(file, path)
    }

    /// Everything before the library's code runs: the trust checks, the
    /// sealed private copy and the ELF check. Returns what to load. Runs
    /// for many plugins at once (see [`Registry::load_dir_with`]).
    fn prepare(
        file: File,
        path: &Path,
        policy: &Policy,
        warnings: &mut Vec<String>,
    ) -> Result<File, LoadError> {
        if let Err(e) = trust::check_file(&file, policy) {
            if !policy.allow_insecure {
                return Err(e.into());
            }
            warnings.push(format!(
                "plugin {} loaded although {e} (--allow-insecure-plugins)",
                Shown(path.to_owned())
            ));
        }
        let file = match sealed_copy(&file, path)? {
            Some(copy) => copy,
            None => {
                warnings.push(format!(
                    "plugin {} loaded from its file, not from a sealed copy: this kernel refuses \
                     executable memory files (vm.memfd_noexec = 2), so overwriting the file while \
                     it is loaded can crash kernmlops",
                    Shown(path.to_owned())
                ));
                file
            }
        };
        trust::check_elf(&file, ROOT_MODULE_SYMBOL)?;
        Ok(file)
    }

    /// Loads a file [`Plugin::prepare`] returned: the ABI check and every
    /// declaration.
    fn from_prepared(file: File, path: &Path) -> Result<Self, LoadError> {
        // From here on the library's code runs. Never closed: see the
        // module documentation.
        let file: &'static File = Box::leak(Box::new(file));
        let fd_path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let library = RawLibrary::load_at(&fd_path).map_err(|e| LoadError::Open(one_line(&e)))?;
        let library: &'static RawLibrary = Box::leak(Box::new(library));
        // SAFETY: the library is never unloaded (leaked above), so the
        // 'static references in its header stay valid.
        let header =
            unsafe { lib_header_from_raw_library(library) }.map_err(|e| library_error(e, None))?;
        let module = header
            .init_root_module::<PluginMod_Ref>()
            .map_err(|e| library_error(e, Some(header)))?;

        let info = (module.info())();
        validate_contract(info.data_contract)?;
        let probes = match (module.probes())() {
            RResult::ROk(p) => p.into_vec(),
            RResult::RErr(e) => return Err(LoadError::Listing(e.to_string())),
        };
        let mut config_defaults = BTreeMap::new();
        let mut tables = BTreeSet::new();
        for probe in &probes {
            validate_probe(probe)?;
            for table in probe.tables.iter() {
                // Two probes of one plugin declaring the same table.
                if !tables.insert(table.name.as_str()) {
                    return Err(ValidationError::DuplicateTable {
                        table: table.name.to_string(),
                        owner: info.name.to_string(),
                    }
                    .into());
                }
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
            digest: FileDigest::new(file),
            info,
            probes,
            config_defaults,
            benchmarks,
            benchmark_defaults,
            graphs,
            module,
            _library: library,
        })
    }

    pub fn name(&self) -> &str {
        self.info.name.as_str()
    }

    /// The SHA-256 of the plugin's loaded bytes (lower-case hex), read from
    /// the sealed copy it was loaded from on the first call and cached.
    pub fn sha256(&self) -> io::Result<&str> {
        self.digest.get()
    }

    /// Whether this plugin is one shipped in this repository.
    pub fn is_in_tree(&self) -> bool {
        IN_TREE_PLUGINS.contains(&self.name())
    }

    /// Runs a component's own settings rules on the JSON object it would
    /// be given, without starting it (`Ok` for plugins built before
    /// components could be checked).
    pub fn check_config(&self, component: &str, config_json: &str) -> Result<(), PluginError> {
        match self.module.check_config() {
            None => Ok(()),
            Some(f) => match f(component.into(), config_json.into()) {
                RResult::ROk(()) => Ok(()),
                RResult::RErr(e) => Err(e),
            },
        }
    }

    /// Creates, loads and attaches one of this plugin's probes.
    pub fn start_probe(&self, probe: &str, args: &StartArgs) -> Result<ProbeBox, PluginError> {
        self.starter().start_probe(probe, args)
    }

    /// What starts this plugin's probes from any thread, for as long as the
    /// process lives (the library is never unloaded): a start the host
    /// gives up on can be left running on a thread of its own.
    pub fn starter(&self) -> ProbeStarter {
        ProbeStarter {
            module: self.module,
        }
    }

    /// Creates one of this plugin's graphs.
    pub fn start_graph(&self, name: &str, args: &StartArgs) -> Result<GraphBox, PluginError> {
        let Some(new) = self.module.new_graph() else {
            return Err(PluginError::new(
                ErrorKind::NOT_FOUND,
                format!("plugin {} offers no graphs", self.name()),
            ));
        };
        new(name.into(), args).into_result()
    }

    /// Creates one of this plugin's benchmarks with its settings.
    pub fn start_benchmark(
        &self,
        name: &str,
        args: &StartArgs,
    ) -> Result<BenchmarkBox, PluginError> {
        self.benchmark_starter().start_benchmark(name, args)
    }

    /// What creates this plugin's benchmarks from any thread, for as long
    /// as the process lives, like [`Plugin::starter`] for probes.
    pub fn benchmark_starter(&self) -> BenchmarkStarter {
        BenchmarkStarter {
            module: self.module,
            plugin: self.name().to_owned(),
        }
    }

    /// The power sources this plugin offers (none for plugins built before
    /// power sources existed), unchecked: `power::registry` checks them.
    pub fn power_sources(&self) -> Result<Vec<kernmlops_plugin_api::PowerSourceDecl>, String> {
        optional_list(self.module.power_sources()).map_err(|e| e.to_string())
    }

    /// A power source's declared settings (TOML, commented).
    pub fn power_source_defaults(&self, name: &str) -> Result<String, String> {
        settings_defaults(&self.module, name).map_err(|e| e.to_string())
    }

    /// Creates one of this plugin's power sources with its settings.
    pub fn start_power_source(
        &self,
        name: &str,
        args: &StartArgs,
    ) -> Result<kernmlops_plugin_api::PowerSourceBox, PluginError> {
        let Some(new) = self.module.new_power_source() else {
            return Err(PluginError::new(
                ErrorKind::UNSUPPORTED,
                format!(
                    "plugin {} was built before power sources could run (no new_power_source); rebuild it",
                    self.name()
                ),
            ));
        };
        new(name.into(), args).into_result()
    }

    /// Everything this plugin claims a name for, which no other loaded
    /// plugin may claim too, ordered by kind then name.
    fn claims(&self) -> BTreeSet<(u8, &'static str, &str)> {
        let mut out = BTreeSet::new();
        out.insert((0, "plugin name", self.name()));
        for p in &self.probes {
            for t in p.tables.iter() {
                out.insert((1, "table", t.name.as_str()));
            }
            out.insert((2, "probe", p.name.as_str()));
        }
        for b in &self.benchmarks {
            out.insert((3, "benchmark", b.name.as_str()));
        }
        for g in &self.graphs {
            out.insert((4, "graph", g.name.as_str()));
        }
        out
    }
}

/// Starts a plugin's probes; see [`Plugin::starter`].
#[derive(Clone, Copy)]
pub struct ProbeStarter {
    module: PluginMod_Ref,
}

impl ProbeStarter {
    /// Creates, loads and attaches one of the plugin's probes.
    pub fn start_probe(&self, probe: &str, args: &StartArgs) -> Result<ProbeBox, PluginError> {
        (self.module.new_probe())(probe.into(), args).into_result()
    }
}

/// Creates a plugin's benchmarks; see [`Plugin::benchmark_starter`].
#[derive(Clone)]
pub struct BenchmarkStarter {
    module: PluginMod_Ref,
    plugin: String,
}

impl BenchmarkStarter {
    /// Creates one of the plugin's benchmarks with its settings.
    pub fn start_benchmark(
        &self,
        name: &str,
        args: &StartArgs,
    ) -> Result<BenchmarkBox, PluginError> {
        let Some(new) = self.module.new_benchmark() else {
            return Err(PluginError::new(
                ErrorKind::NOT_FOUND,
                format!("plugin {} offers no benchmarks", self.plugin),
            ));
        };
        new(name.into(), args).into_result()
    }
}

/// How often a copy is retried when the file changed while it was read.
const COPY_ATTEMPTS: usize = 3;

/// A private copy of the plugin file open as `file`: a memory file
/// (`memfd_create`, close-on-exec, executable) holding exactly its bytes,
/// sealed against any change (shrink, grow, write, and further seals).
/// The file must not change while it is read (size, modification and
/// change times compared before and after), or the copy is made again.
/// `Ok(None)` when the kernel refuses executable memory files.
fn sealed_copy(file: &File, path: &Path) -> Result<Option<File>, LoadError> {
    for _ in 0..COPY_ATTEMPTS {
        let Some(copy) = memfd(path)? else {
            return Ok(None);
        };
        let before = Stamp::of(file)?;
        let copied = copy_bytes(file, &copy)?;
        if Stamp::of(file)? != before || copied != before.size {
            continue;
        }
        let seals =
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor this function owns; F_ADD_SEALS
        // takes an integer argument.
        if unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(LoadError::Copy(format!(
                "sealing it: {}",
                kernmlops_sys::private::strip_os_error(&io::Error::last_os_error())
            )));
        }
        return Ok(Some(copy));
    }
    Err(LoadError::Copy(format!(
        "it changed while it was read, {COPY_ATTEMPTS} times (is it being rewritten?); \
         load it once it is complete, and replace plugins with a rename, not in place"
    )))
}

/// A new, empty, executable memory file named after the plugin file.
fn memfd(path: &Path) -> Result<Option<File>, LoadError> {
    use std::os::fd::FromRawFd;
    let base = path
        .file_name()
        .map(|n| printable(n.as_bytes()))
        .unwrap_or_default();
    // The name shows in /proc/<pid>/maps as "/memfd:kernmlops:<file>".
    let name: String = format!("kernmlops:{base}").chars().take(200).collect();
    let name = std::ffi::CString::new(name.replace('\0', "?")).unwrap_or_default();
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    let create = |extra: libc::c_uint| {
        // SAFETY: `name` is NUL-terminated and outlives the call.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), flags | extra) };
        if fd < 0 {
            Err(io::Error::last_os_error())
        } else {
            // SAFETY: a new descriptor nobody else owns.
            Ok(unsafe { File::from_raw_fd(fd) })
        }
    };
    // MFD_EXEC (Linux 6.3) keeps the file executable whatever
    // vm.memfd_noexec says by default; older kernels do not know the flag,
    // and their memory files are executable anyway.
    match create(libc::MFD_EXEC) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => match create(0) {
            Ok(f) => Ok(Some(f)),
            Err(e) => Err(memfd_error(&e)),
        },
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => Ok(None),
        Err(e) => Err(memfd_error(&e)),
    }
}

fn memfd_error(e: &io::Error) -> LoadError {
    LoadError::Copy(format!(
        "creating its private copy (memfd_create): {}",
        kernmlops_sys::private::strip_os_error(e)
    ))
}

/// Copies every byte of `from` (positional reads) to the start of `to`, a
/// new memory file; returns how many. The kernel copies from the page
/// cache into the memory file itself (`sendfile`: one copy, not two
/// through a buffer); reads and writes where it cannot.
fn copy_bytes(from: &File, to: &File) -> Result<u64, LoadError> {
    let mut offset: libc::off_t = 0;
    loop {
        // SAFETY: both descriptors are open files this function borrows;
        // sendfile reads `from` at `offset` (its own position untouched)
        // and writes at `to`'s position, 0 for a new memory file.
        let n = unsafe { libc::sendfile(to.as_raw_fd(), from.as_raw_fd(), &mut offset, 1 << 30) };
        if n > 0 {
            continue;
        }
        if n == 0 {
            return u64::try_from(offset).map_err(|_| LoadError::Copy("negative offset".into()));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EINVAL | libc::ENOSYS) if offset == 0 => {
                return copy_bytes_buffered(from, to)
            }
            _ => {
                return Err(LoadError::Copy(format!(
                    "writing its private copy: {}",
                    kernmlops_sys::private::strip_os_error(&e)
                )))
            }
        }
    }
}

/// [`copy_bytes`] through a buffer.
fn copy_bytes_buffered(from: &File, to: &File) -> Result<u64, LoadError> {
    let mut buf = vec![0u8; 1 << 16];
    let mut offset = 0u64;
    loop {
        let n = match from.read_at(&mut buf, offset) {
            Ok(0) => return Ok(offset),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(LoadError::Io(e)),
        };
        to.write_all_at(&buf[..n], offset).map_err(|e| {
            LoadError::Copy(format!(
                "writing its private copy: {}",
                kernmlops_sys::private::strip_os_error(&e)
            ))
        })?;
        offset += n as u64;
    }
}

/// What changes when a file is written: its size and its modification and
/// change times.
#[derive(PartialEq, Eq)]
struct Stamp {
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(file: &File) -> Result<Self, LoadError> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata()?;
        Ok(Self {
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
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

/// An abi_stable loading error as one line a plugin author can act on.
fn library_error(e: LibraryError, header: Option<&LibHeader>) -> LoadError {
    match e {
        LibraryError::AbiInstability(report) => {
            let report = report.to_string();
            let line = header
                .and_then(LibHeader::layout)
                .and_then(|found| abi_difference(<PluginMod_Ref as StableAbi>::LAYOUT, found))
                .unwrap_or_else(|| abi_report_line(&report));
            LoadError::Abi(line)
        }
        LibraryError::IncompatibleVersionNumber {
            expected_version,
            actual_version,
            ..
        } => LoadError::Abi(format!(
            "built against plugin API {actual_version}, this kernmlops has {expected_version}"
        )),
        LibraryError::InvalidAbiHeader(_) => LoadError::Abi(
            "built with an abi_stable release incompatible with this kernmlops's (0.11)".into(),
        ),
        LibraryError::GetSymbolError { .. } => {
            LoadError::NotAPlugin(format!("it does not export {ROOT_MODULE_SYMBOL}"))
        }
        LibraryError::RootModule { err, .. } => LoadError::NotAPlugin(format!(
            "its root module failed to initialise: {}",
            one_line(&err)
        )),
        other => LoadError::NotAPlugin(one_line(&other)),
    }
}

/// The first difference abi_stable finds between the layout the host
/// expects and the plugin's, as "first difference at Type.field (reached
/// through ...): what: expected X, found Y", plus the first differing field
/// when the difference is in a whole type (its package, name or size).
pub fn abi_difference(expected: &'static TypeLayout, found: &'static TypeLayout) -> Option<String> {
    let errors = check_layout_compatibility(expected, found).err()?;
    let first = errors.errors.iter().find(|e| !e.errs.is_empty())?;
    // Each field on the stack belongs to the type reached so far; wrappers
    // from abi_stable itself (PrefixRef, RVec, NonNull, fn pointers) are
    // not worth naming.
    let (mut owner, mut owner_found) = (expected, found);
    let mut route = Vec::new();
    for step in first.stack_trace.iter() {
        if let ExpectedFound {
            expected: TLFieldOrFunction::Field(e),
            found: TLFieldOrFunction::Field(f),
        } = step
        {
            if !is_wrapper(owner) {
                route.push(format!("{}.{}", owner.name(), e.name()));
            }
            owner = e.layout();
            owner_found = f.layout();
        }
    }
    let at = route
        .last()
        .cloned()
        .unwrap_or_else(|| owner.name().to_owned());
    let mut line = format!("first difference at {at}");
    if route.len() > 1 {
        line.push_str(&format!(
            " (reached through {})",
            route[..route.len() - 1].join(", ")
        ));
    }
    line.push_str(": ");
    line.push_str(&describe(&first.errs[0]));
    if let Some(field) = first_differing_field(owner, owner_found) {
        line.push_str(&format!("; first differing field {}.{field}", owner.name()));
    }
    Some(single_line(&line, 600))
}

/// Types that only carry another one (`PrefixRef`, `RVec`, `NonNull`,
/// pointers, function pointers): they come from abi_stable or the standard
/// library, never from the plugin API.
fn is_wrapper(t: &TypeLayout) -> bool {
    matches!(
        t.package().as_str(),
        "abi_stable" | "std" | "core" | "alloc"
    )
}

/// The first field of two layouts of one type that differs in name or
/// type, as "name: expected X, found Y".
fn first_differing_field(expected: &TypeLayout, found: &TypeLayout) -> Option<String> {
    let (e, f) = (expected.get_fields()?, found.get_fields()?);
    let (mut e, mut f) = (e.iter(), f.iter());
    loop {
        match (e.next(), f.next()) {
            (Some(x), Some(y)) => {
                let (sx, sy) = (field_type(&x), field_type(&y));
                if x.name() != y.name() {
                    return Some(format!(
                        "{}: expected {}: {sx}, found {}: {sy}",
                        x.name(),
                        x.name(),
                        y.name()
                    ));
                }
                if sx != sy {
                    return Some(format!("{}: expected {sx}, found {sy}", x.name()));
                }
            }
            (Some(x), None) => {
                return Some(format!(
                    "{}: expected {}, missing",
                    x.name(),
                    field_type(&x)
                ))
            }
            (None, None) => return None,
            (None, Some(y)) => {
                return Some(format!(
                    "{}: not expected, found {}",
                    y.name(),
                    field_type(&y)
                ))
            }
        }
    }
}

/// A field's type, or its function pointer's signature.
fn field_type(f: &TLField) -> String {
    match f.function_range().iter().next() {
        Some(func) => single_line(func.to_string().lines().next().unwrap_or_default(), 120),
        None => single_line(&f.full_type().to_string(), 120),
    }
}

fn describe(err: &AbiInstability) -> String {
    use AbiInstability as AI;
    fn pair<T: fmt::Display>(what: &str, v: &ExpectedFound<T>) -> String {
        format!(
            "{what}: expected {}, found {}",
            single_line(&v.expected.to_string(), 120),
            single_line(&v.found.to_string(), 120)
        )
    }
    fn pair_dbg<T: fmt::Debug>(what: &str, v: &ExpectedFound<T>) -> String {
        format!(
            "{what}: expected {}, found {}",
            single_line(&format!("{:?}", v.expected), 120),
            single_line(&format!("{:?}", v.found), 120)
        )
    }
    match err {
        AI::Name(v) => pair("type", v),
        AI::Package(v) => pair("package", v),
        AI::PackageVersion(v) => pair("package version", v),
        AI::Size(v) => pair("size in bytes", v),
        AI::Alignment(v) => pair("alignment", v),
        AI::FieldCountMismatch(v) => pair("number of fields", v),
        AI::TooManyVariants(v) => pair("number of variants", v),
        AI::MismatchedPrefixSize(v) => pair("number of prefix fields", v),
        AI::UnexpectedField(v) => format!(
            "field: expected {}: {}, found {}: {}",
            v.expected.name(),
            field_type(&v.expected),
            v.found.name(),
            field_type(&v.found)
        ),
        AI::FieldLifetimeMismatch(v) => {
            format!("field {} refers to different lifetimes", v.expected.name())
        }
        AI::FnLifetimeMismatch(_) => "function pointers refer to different lifetimes".into(),
        AI::FnQualifierMismatch(_) => "function pointers differ in `unsafe` or ABI".into(),
        AI::GenericParamCount(v) => pair("generic parameters", v),
        AI::TLDataDiscriminant(v) => pair_dbg("kind of type", v),
        AI::MismatchedPrimitive(v) => pair_dbg("primitive", v),
        AI::UnexpectedVariant(v) => pair("variant", v),
        AI::ReprAttr(v) => pair_dbg("repr", v),
        AI::EnumDiscriminant(v) => pair_dbg("discriminant", v),
        AI::MismatchedExhaustiveness(v) => pair_dbg("exhaustiveness", v),
        AI::NonZeroness(v) => pair("non-zero", v),
        other => single_line(&format!("{other:?}"), 200),
    }
}

/// Fallback when the structured check is not available: the first
/// "Error:<what> Expected: <x> Found: <y>" of abi_stable's report, with the
/// type it was about.
fn abi_report_line(report: &str) -> String {
    let lines: Vec<&str> = report.lines().map(str::trim).collect();
    let Some(i) = lines.iter().position(|l| l.starts_with("Error:")) else {
        return single_line(report, 300);
    };
    let what = lines[i].trim_start_matches("Error:").trim();
    let after = |label: &str| {
        lines[i..]
            .iter()
            .position(|l| *l == label)
            .and_then(|j| lines.get(i + j + 1))
            .copied()
            .unwrap_or("?")
    };
    let ty = lines[..i]
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("type:"))
        .unwrap_or("?");
    single_line(
        &format!(
            "first difference at {ty}: {what}: expected {}, found {}",
            after("Expected:"),
            after("Found:")
        ),
        300,
    )
}

/// `text` on one line: whitespace runs collapsed, cut at `max` characters.
fn single_line(text: &str, max: usize) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match joined.char_indices().nth(max) {
        Some((cut, _)) => format!("{}...", &joined[..cut]),
        None => joined,
    }
}

/// An error's text on one line.
fn one_line(e: &dyn fmt::Display) -> String {
    single_line(&e.to_string(), 300)
}

/// Every plugin found in a directory: those loaded and those refused.
#[derive(Debug, Default)]
pub struct Registry {
    pub dir: PathBuf,
    pub plugins: Vec<Plugin>,
    pub failures: Vec<(PathBuf, LoadError)>,
    /// Entries that are not plugins but deserve a word (dangling or
    /// looping symlinks, folders named `*.so`), and problems loaded anyway
    /// under `--allow-insecure-plugins`; one line each.
    pub warnings: Vec<String>,
    /// `--allow-insecure-plugins`: ownership and permission problems were
    /// warnings, not refusals. Recorded in the run's manifest.
    pub allow_insecure: bool,
}

impl Registry {
    /// Loads every `*.so` in `dir` (symlinks followed), trusting root and
    /// the invoking user ([`Policy::for_this_process`] without
    /// `--allow-insecure-plugins`); see [`Registry::load_dir_with`].
    pub fn load_dir(dir: &Path) -> io::Result<Self> {
        Self::load_dir_with(dir, &Policy::default())
    }

    /// Loads every `*.so` in `dir` (symlinks followed), trusting the owners
    /// `policy` names. The folder itself must pass the trust checks, or
    /// nothing in it is loaded. Plugins that claim the same name (plugin,
    /// table, probe, benchmark, graph) are refused as [`Conflict`] says,
    /// whatever their file names.
    pub fn load_dir_with(dir: &Path, policy: &Policy) -> io::Result<Self> {
        let mut reg = Self {
            dir: dir.to_owned(),
            allow_insecure: policy.allow_insecure,
            ..Self::default()
        };
        let folder = trust::open_dir(dir)?;
        if let Err(e) = trust::check_dir(&folder, policy) {
            if !policy.allow_insecure {
                reg.failures.push((dir.to_owned(), e.into()));
                return Ok(reg);
            }
            reg.warnings.push(format!(
                "plugin folder {} used although {e} (--allow-insecure-plugins)",
                Shown(dir.to_owned())
            ));
        }
        let mut names: Vec<OsString> =
            std::fs::read_dir(format!("/proc/self/fd/{}", folder.as_raw_fd()))?
                .filter_map(|e| e.ok().map(|e| e.file_name()))
                .filter(|n| n.as_bytes().ends_with(b".so"))
                .collect();
        names.sort();
        // Checking and copying each file is most of the time a start-up
        // takes; it runs on a few threads, the files shared out in turn.
        // Loading the copies (the libraries' code runs) stays on this
        // thread, in name order, as do the messages.
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, PREPARE_THREADS)
            .min(names.len().max(1));
        let prepared: Vec<(PathBuf, Prepared)> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let (names, folder) = (&names, &folder);
                    scope.spawn(move || {
                        names
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| i % threads == t)
                            .map(|(i, name)| (i, prepare_entry(dir, folder, name, policy)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            let mut all: Vec<(usize, (PathBuf, Prepared))> = Vec::with_capacity(names.len());
            for w in workers {
                match w.join() {
                    Ok(done) => all.extend(done),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            all.sort_by_key(|(i, _)| *i);
            all.into_iter().map(|(_, p)| p).collect()
        });
        let mut candidates = Vec::new();
        for (path, outcome) in prepared {
            match outcome {
                Prepared::Skipped(warning) => reg.warnings.push(warning),
                Prepared::Failed(e, warnings) => {
                    reg.warnings.extend(warnings);
                    reg.failures.push((path, e));
                }
                Prepared::Ready(file, warnings) => {
                    reg.warnings.extend(warnings);
                    match Plugin::from_prepared(file, &path) {
                        Ok(p) => candidates.push(p),
                        Err(e) => reg.failures.push((path, e)),
                    }
                }
            }
        }
        reg.settle_conflicts(candidates);
        Ok(reg)
    }

    /// Keeps the candidates that claim no name another one claims; see
    /// [`Conflict`] for who is refused.
    fn settle_conflicts(&mut self, candidates: Vec<Plugin>) {
        let claims: Vec<_> = candidates.iter().map(Plugin::claims).collect();
        let mut conflicts: Vec<Vec<Conflict>> = candidates.iter().map(|_| Vec::new()).collect();
        for i in 0..candidates.len() {
            for j in i + 1..candidates.len() {
                // The first shared claim by kind then name: the same
                // whichever of the two comes first.
                let Some(&(_, what, name)) = claims[i].intersection(&claims[j]).next() else {
                    continue;
                };
                let (a, b) = (&candidates[i], &candidates[j]);
                let conflict = |this: &Plugin, other: &Plugin| Conflict {
                    what,
                    name: name.to_owned(),
                    other: other.name().to_owned(),
                    other_path: other.path.clone(),
                    displaced_by_in_tree: other.is_in_tree() && !this.is_in_tree(),
                    both_in_tree: other.is_in_tree() && this.is_in_tree(),
                    more: 0,
                };
                match (a.is_in_tree(), b.is_in_tree()) {
                    (true, false) => conflicts[j].push(conflict(b, a)),
                    (false, true) => conflicts[i].push(conflict(a, b)),
                    _ => {
                        conflicts[i].push(conflict(a, b));
                        conflicts[j].push(conflict(b, a));
                    }
                }
            }
        }
        for (p, mut found) in candidates.into_iter().zip(conflicts) {
            if found.is_empty() {
                self.plugins.push(p);
            } else {
                let mut first = found.remove(0);
                first.more = found.len();
                self.failures
                    .push((p.path.clone(), LoadError::Conflict(first)));
            }
        }
        self.failures.sort_by(|a, b| a.0.cmp(&b.0));
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
                    Shown(self.dir.clone()),
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
                        Shown(self.dir.clone()),
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
                            .map(|(p, e)| format!("{} ({e})", Shown(p.clone())))
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

/// A folder entry that is no plugin and only deserves a warning: a
/// dangling or looping symlink. `None` for real errors.
/// Most threads checking and copying plugin files at start-up.
const PREPARE_THREADS: usize = 4;

/// One `*.so` entry of a plugin folder, checked and copied.
enum Prepared {
    /// Not a plugin to load (a dangling link, not a regular file): a
    /// warning.
    Skipped(String),
    /// Refused, with the warnings so far.
    Failed(LoadError, Vec<String>),
    /// The sealed copy to load, with warnings.
    Ready(File, Vec<String>),
}

/// Opens `name` in `folder` (the folder `dir`) and runs
/// [`Plugin::prepare`] on it.
fn prepare_entry(
    dir: &Path,
    folder: &File,
    name: &std::ffi::OsStr,
    policy: &Policy,
) -> (PathBuf, Prepared) {
    let path = dir.join(name);
    let file = match trust::open_file_at(folder, name) {
        Ok(f) => f,
        Err(e) => {
            let outcome = match skipped_entry(&path, &e) {
                Some(warning) => Prepared::Skipped(warning),
                None => Prepared::Failed(e.into(), Vec::new()),
            };
            return (path, outcome);
        }
    };
    match file.metadata() {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            let warning = format!("ignoring {}: not a regular file", Shown(path.clone()));
            return (path, Prepared::Skipped(warning));
        }
        Err(e) => return (path, Prepared::Failed(e.into(), Vec::new())),
    }
    let mut warnings = Vec::new();
    let outcome = match Plugin::prepare(file, &path, policy, &mut warnings) {
        Ok(file) => Prepared::Ready(file, warnings),
        Err(e) => Prepared::Failed(e, warnings),
    };
    (path, outcome)
}

fn skipped_entry(path: &Path, e: &io::Error) -> Option<String> {
    let target = std::fs::read_link(path)
        .map(|t| Shown(t).to_string())
        .unwrap_or_else(|_| "?".into());
    match e.raw_os_error() {
        Some(libc::ENOENT) => Some(format!(
            "ignoring {}: dangling symlink to {target}; remove it or fix its target",
            Shown(path.to_owned())
        )),
        Some(libc::ELOOP) => Some(format!(
            "ignoring {}: symlink loop (it points to {target}); remove it",
            Shown(path.to_owned())
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi_stable::std_types::{RStr, RString};

    /// Two builds of one interface: `Column.size` changed from u32 to u64.
    mod old {
        use super::*;
        #[repr(C)]
        #[derive(StableAbi)]
        pub struct Column {
            pub name: RString,
            pub size: u32,
        }
        #[repr(C)]
        #[derive(StableAbi)]
        pub struct Table {
            pub name: RString,
            pub columns: RVec<Column>,
        }
        #[repr(C)]
        #[derive(StableAbi)]
        pub struct Root {
            pub tables: extern "C" fn(RStr<'_>) -> RResult<RVec<Table>, RString>,
        }
    }
    mod new {
        use super::*;
        #[repr(C)]
        #[derive(StableAbi)]
        pub struct Column {
            pub name: RString,
            pub size: u64,
        }
        #[repr(C)]
        #[derive(StableAbi)]
        pub struct Table {
            pub name: RString,
            pub columns: RVec<Column>,
        }
        #[repr(C)]
        #[derive(StableAbi)]
        pub struct Root {
            pub tables: extern "C" fn(RStr<'_>) -> RResult<RVec<Table>, RString>,
        }
    }

    #[test]
    fn an_abi_difference_is_one_line_naming_type_and_field() {
        let line = abi_difference(
            <old::Root as StableAbi>::LAYOUT,
            <new::Root as StableAbi>::LAYOUT,
        )
        .expect("layouts differ");
        assert_eq!(
            line,
            "first difference at Column.size (reached through Root.tables, Table.columns): \
             type: expected u32, found u64"
        );
        assert!(abi_difference(
            <old::Root as StableAbi>::LAYOUT,
            <old::Root as StableAbi>::LAYOUT
        )
        .is_none());
    }

    #[test]
    fn the_report_fallback_finds_the_first_error() {
        let report = "Compared <this>:\n    --- Type Layout ---\n    type:PrefixRef<'a, PluginMod>\n\
                      1 error(s)inside:\n    field_name:0\n    type:PluginMod\n\n\
                      Error:mismatched package\nExpected:\n    kernmlops-plugin-api\nFound:\n    other\n";
        assert_eq!(
            abi_report_line(report),
            "first difference at PluginMod: mismatched package: expected kernmlops-plugin-api, found other"
        );
    }

    #[test]
    fn in_tree_plugins_are_the_plugins_folder() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            eprintln!("SKIP: no {} (not a checkout)", dir.display());
            return;
        };
        let mut found: Vec<String> = entries
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("Cargo.toml")).ok())
            .filter_map(|text| {
                let manifest: toml::Table = text.parse().ok()?;
                Some(manifest.get("package")?.get("name")?.as_str()?.to_owned())
            })
            .collect();
        found.sort();
        assert_eq!(
            found, IN_TREE_PLUGINS,
            "plugin::IN_TREE_PLUGINS must list every plugins/<name> (the plugin name is the crate name)"
        );
    }

    #[test]
    fn conflicts_read_as_one_line_each() {
        let c = Conflict {
            what: "table",
            name: "process_trace".into(),
            other: "process_trace".into(),
            other_path: "/p/process_trace.so".into(),
            displaced_by_in_tree: true,
            both_in_tree: false,
            more: 1,
        };
        let text = LoadError::Conflict(c).to_string();
        assert!(!text.contains('\n'));
        assert!(
            text.contains("table process_trace")
                && text.contains("/p/process_trace.so")
                && text.contains("(and 1 more conflicts)"),
            "{text}"
        );
    }
}
