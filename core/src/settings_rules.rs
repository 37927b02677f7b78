//! A component's own settings rules (`PluginMod::check_config`: ranges,
//! non-empty lists), run while the configuration is checked, before any
//! set-up or collection.
//!
//! Transitional: [`Plugin`] keeps its root module private and offers no
//! `check_config` yet, so [`check`] finds the module of the plugin the
//! registry already loaded, by the name `plugin.rs` loaded it under
//! (`/proc/self/fd/N`), with `RTLD_NOLOAD`: it never loads a library and
//! never runs a constructor, so it reaches only code that passed the trust
//! and ELF checks. Replace the body of [`check`] with one call once
//! `Plugin` offers `check_config`.

use std::{
    ffi::CString,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use abi_stable::{library::LibHeader, std_types::RResult};
use kernmlops_plugin_api::PluginMod_Ref;

use crate::{
    config::{Config, ConfigError},
    plugin::{Plugin, Registry, ROOT_MODULE_SYMBOL},
};

/// Runs the rules of every configured probe and benchmark, and of the
/// `probes` and `benchmarks` a run uses, on their settings (each plugin's
/// `check_config`), as `kernmlops run` and `config show` do before anything
/// is set up.
pub fn check_all(
    cfg: &Config,
    registry: &Registry,
    probes: &[String],
    benchmarks: &[String],
) -> Result<(), ConfigError> {
    cfg.check_rules(
        "probes",
        registry.config_defaults(),
        probes,
        |name, json| match registry.find_probe(name) {
            Some((plugin, _)) => check(plugin, name, json),
            None => Ok(()),
        },
    )?;
    cfg.check_rules(
        "benchmarks",
        registry.benchmark_defaults(),
        benchmarks,
        |name, json| match registry.find_benchmark(name) {
            Ok((plugin, _)) => check(plugin, name, json),
            Err(_) => Ok(()),
        },
    )
}

/// Runs `component`'s own rules on `config_json` (the object it would get).
/// `Ok` for plugins built before components could be checked.
pub fn check(plugin: &Plugin, component: &str, config_json: &str) -> Result<(), String> {
    let Some(module) = loaded_module(plugin) else {
        return Err(format!(
            "plugin {}: its settings cannot be checked: the file {} changed since it was loaded; run again",
            plugin.name(),
            plugin.path.display()
        ));
    };
    match module.check_config() {
        None => Ok(()),
        Some(f) => match f(component.into(), config_json.into()) {
            RResult::ROk(()) => Ok(()),
            RResult::RErr(e) => Err(e.message.to_string()),
        },
    }
}

/// The root module of `plugin`, found among the libraries already loaded.
fn loaded_module(plugin: &Plugin) -> Option<PluginMod_Ref> {
    let meta = std::fs::metadata(&plugin.path).ok()?;
    let fds = std::fs::read_dir("/proc/self/fd").ok()?;
    let candidates: Vec<PathBuf> = fds
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|fd| {
            // stat follows the descriptor to its file without opening it.
            std::fs::metadata(fd)
                .is_ok_and(|m| m.is_file() && m.dev() == meta.dev() && m.ino() == meta.ino())
        })
        .collect();
    candidates
        .iter()
        .find_map(|fd| module_of_loaded(fd))
        .filter(|m| (m.info())().name.as_str() == plugin.name())
}

/// The root module of the library loaded as `name`, if one is.
fn module_of_loaded(name: &Path) -> Option<PluginMod_Ref> {
    let c_name = CString::new(name.as_os_str().as_encoded_bytes()).ok()?;
    let symbol = CString::new(ROOT_MODULE_SYMBOL).ok()?;
    // SAFETY: RTLD_NOLOAD returns a handle only to a library that is already
    // loaded (by this name or as the same file) and never maps or
    // initialises one.
    let handle = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return None;
    }
    // SAFETY: a valid handle and a NUL-terminated symbol name.
    let header = unsafe { libc::dlsym(handle, symbol.as_ptr()) }.cast::<LibHeader>();
    let module = if header.is_null() {
        None
    } else {
        // SAFETY: the symbol is the library's `LibHeader` static (the ELF
        // check and the load verified it exports it), and plugin.rs never
        // unloads a plugin, so the reference stays valid; the module was
        // initialised at load, so this runs no plugin code but its checks.
        unsafe { &*header }.init_root_module::<PluginMod_Ref>().ok()
    };
    // SAFETY: drops the reference RTLD_NOLOAD took; plugin.rs's own keeps
    // the library loaded.
    unsafe { libc::dlclose(handle) };
    module
}
