//! What every command starts from: the trust policy, the configuration
//! (defaults, then --config FILE or ./overrides.toml), the plugin folder
//! and its registry (for a run, only the plugins it needs).

use std::{
    path::{Path, PathBuf},
    sync::{Once, OnceLock},
};

use anyhow::{bail, Context as _, Result};
use kernmlops::{
    config::Config,
    plugin::{Needed, Registry},
    power::Selection,
    trust::{self, Policy},
};

/// Who may own plugins and files found in the current directory; set once
/// from `--allow-insecure-plugins` before anything is loaded.
static TRUST: OnceLock<Policy> = OnceLock::new();

fn trust_policy() -> &'static Policy {
    TRUST.get_or_init(Policy::default)
}

/// The configuration and plugin folder flag every command works from.
pub(crate) struct Context {
    pub(crate) cfg: Config,
    /// `--plugin-dir` (or `KERNMLOPS_PLUGIN_DIR`).
    pub(crate) plugin_flag: Option<PathBuf>,
}

impl Context {
    /// Sets the trust policy from `--allow-insecure-plugins`, undoes what a
    /// run that died left changed on the machine (as root), and loads the
    /// configuration: `config_flag`, else a safe `./overrides.toml`. With
    /// `resolve_commands`, the commands it names are resolved and checked.
    pub(crate) fn new(
        config_flag: Option<&Path>,
        plugin_flag: Option<PathBuf>,
        allow_insecure_plugins: bool,
        resolve_commands: bool,
    ) -> Result<Self> {
        kernmlops::collect::startup::mark("start");
        let _ = TRUST.set(Policy::for_this_process(allow_insecure_plugins));
        // A run that died left its machine changes recorded: undo them first.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            for line in kernmlops::undo::recover_abandoned() {
                eprintln!("warning: {}", trust::printable(line.as_bytes()));
            }
        }
        kernmlops::collect::startup::mark("abandoned runs undone");
        let cfg = load_config(config_flag, resolve_commands)?;
        kernmlops::collect::startup::mark("configuration read");
        Ok(Self { cfg, plugin_flag })
    }

    /// The plugin folder (see [`plugin_dir`]).
    pub(crate) fn plugin_dir(&self) -> Result<PathBuf> {
        plugin_dir(&self.cfg, self.plugin_flag.as_deref())
    }

    /// Loads the plugin folder (see [`load_registry`]).
    pub(crate) fn registry(&self) -> Result<Registry> {
        load_registry(&self.cfg, self.plugin_flag.as_deref(), &Needed::All)
    }

    /// Loads the plugins a `kernmlops run` of `probes` needs: those
    /// offering its probes and every probe configured in `[probes.*]`, and
    /// every third-party plugin; the whole folder when the run has a
    /// benchmark, records power or configures benchmarks or power sources
    /// (their plugins are not named after them). Also starts describing the
    /// machine for the run's `system_info`, while the plugins load.
    pub(crate) fn run_registry(
        &self,
        probes: &[String],
        benchmark: bool,
        power_flag: Option<&[String]>,
    ) -> Result<Registry> {
        let power = power_flag.map_or_else(|| self.cfg.power.sources.clone(), <[String]>::to_vec);
        let power_off = Selection::parse(&power).is_ok_and(|s| s.is_off());
        let needed = if benchmark
            || !power_off
            || !self.cfg.benchmarks.is_empty()
            || !self.cfg.power.settings.is_empty()
        {
            Needed::All
        } else {
            Needed::Probes(
                probes
                    .iter()
                    .cloned()
                    .chain(self.cfg.probes.keys().cloned())
                    .collect(),
            )
        };
        kernmlops::collect::startup::describe_system_early();
        load_registry(&self.cfg, self.plugin_flag.as_deref(), &needed)
    }

    /// Runs the rules of every configured probe and benchmark, and of those
    /// this run uses, on their settings (each plugin's `check_config`),
    /// before anything is set up.
    pub(crate) fn check_component_rules(
        &self,
        registry: &Registry,
        probes: &[String],
        benchmarks: &[String],
    ) -> Result<()> {
        Ok(self
            .cfg
            .check_component_rules(registry, probes, benchmarks)?)
    }
}

/// The configuration: the defaults, then `config_flag` (checked like a
/// plugin) or, without it, `./overrides.toml` when present and safe.
fn load_config(config_flag: Option<&Path>, resolve_commands: bool) -> Result<Config> {
    // A configuration can name commands that run as root (benchmarks):
    // --config FILE passes the plugins' checks or is refused, and without
    // it ./overrides.toml is the user's file only when present and safe.
    if let Some(path) = config_flag {
        let checked = trust::check_instructions(path, "--config", trust_policy());
        if let Some(warning) = checked.map_err(anyhow::Error::msg)? {
            eprintln!("warning: {warning}");
        }
    }
    let file = config_flag.map(Path::to_owned).or_else(|| {
        let here = PathBuf::from("overrides.toml");
        here.symlink_metadata().ok()?;
        match trust::check_file_path(&here, trust_policy()) {
            Ok(()) => Some(here),
            Err(e) if trust_policy().allow_insecure => {
                eprintln!(
                    "warning: using ./overrides.toml although {e} (--allow-insecure-plugins)"
                );
                Some(here)
            }
            Err(e) => {
                eprintln!("warning: ignoring ./overrides.toml: {e}");
                None
            }
        }
    });
    let mut cfg = Config::load(file.as_deref())?;
    // The commands a configuration names run as root: resolved against
    // the folder of the file that names them and checked like plugins,
    // before anything is created.
    if let (Some(file), true) = (&file, resolve_commands) {
        let absolute =
            std::path::absolute(file).with_context(|| format!("resolving {}", file.display()))?;
        let base = absolute.parent().unwrap_or(Path::new("/"));
        for warning in cfg.resolve_commands(base, trust_policy())? {
            eprintln!("warning: {}", trust::printable(warning.as_bytes()));
        }
    }
    Ok(cfg)
}

/// The plugin folder: the flag (or env), else the configured one relative to
/// the working directory, else the one of the workspace holding this binary.
fn plugin_dir(cfg: &Config, flag: Option<&Path>) -> Result<PathBuf> {
    if let Some(dir) = flag {
        if !dir.is_dir() {
            bail!("plugin folder {} does not exist", dir.display());
        }
        return Ok(dir.to_owned());
    }
    let configured = PathBuf::from(&cfg.collect.plugin_dir);
    if configured.is_absolute() {
        return Ok(configured);
    }
    // Found in the current directory: used only when it is safe.
    if configured.is_dir() {
        match trust::check_dir_path(&configured, trust_policy()) {
            Ok(()) => return Ok(configured),
            Err(_) if trust_policy().allow_insecure => return Ok(configured),
            Err(e) => eprintln!(
                "warning: ignoring plugin folder ./{} in the current directory: {e}",
                trust::printable(configured.as_os_str().as_encoded_bytes())
            ),
        }
    }
    let beside_binary = std::env::current_exe().ok().and_then(|exe| {
        exe.ancestors()
            .skip(1)
            .map(|d| d.join(&configured))
            .find(|d| d.is_dir())
    });
    beside_binary.with_context(|| {
        format!(
            "no plugin folder {:?} here or above the kernmlops binary; build plugins with `cargo xtask build-plugins` or pass --plugin-dir",
            cfg.collect.plugin_dir
        )
    })
}

/// Loads the plugin folder; prints its warnings (and, once, that trust
/// checks are off) on stderr.
fn load_registry(cfg: &Config, flag: Option<&Path>, needed: &Needed) -> Result<Registry> {
    let policy = trust_policy();
    if policy.allow_insecure {
        static WARNED: Once = Once::new();
        WARNED.call_once(|| {
            eprintln!(
                "warning: --allow-insecure-plugins: plugin files and folders that others can write, or that another user owns, are loaded anyway"
            )
        });
    }
    let dir = plugin_dir(cfg, flag)?;
    let reg = Registry::load_dir_for(&dir, policy, needed).with_context(|| {
        format!(
            "reading plugin folder {}",
            trust::printable(dir.as_os_str().as_encoded_bytes())
        )
    })?;
    for w in &reg.warnings {
        eprintln!("warning: {w}");
    }
    Ok(reg)
}

pub(crate) fn report_refused(reg: &Registry) {
    for (path, e) in &reg.failures {
        eprintln!(
            "warning: plugin {} refused: {e}",
            trust::printable(path.as_os_str().as_encoded_bytes())
        );
    }
}
