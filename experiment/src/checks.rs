//! What an experiment checks before it trusts or runs anything: the files
//! and folders it takes commands from (checked like plugins), the commands
//! its configuration and variables name, and each run's configuration as
//! `kernmlops run` will check it.

use std::path::{Path, PathBuf};

use kernmlops::{
    config::{CommandError, Config, ConfigError},
    plugin::Registry,
    power::PowerError,
    trust::Policy,
};

use crate::{
    commands::{absolute, invalid, Env},
    record::{ExpDir, Record},
    spec::{self, Spec},
    ExperimentError, Result,
};

/// The base configuration: `--config FILE` with the experiment's
/// `[config]` merged on top. Each table's commands (`[benchmarks.script]
/// command`) are resolved against the folder of the file that holds them
/// and checked like plugins (`config::resolve_commands`), before the merge.
pub(crate) fn base_config(spec: &Spec, env: &Env, policy: &Policy) -> Result<toml::Table> {
    let mut base = match &env.config_file {
        None => toml::Table::new(),
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(ExperimentError::io(path))?;
            let mut table: toml::Table =
                toml::from_str(&text).map_err(|e: toml::de::Error| ExperimentError::Parse {
                    file: path.display().to_string(),
                    message: e.message().to_owned(),
                })?;
            resolve_table_commands(&mut table, &folder_of(path)?, policy).map_err(|e| {
                ExperimentError::Invalid {
                    file: path.display().to_string(),
                    key: "config".into(),
                    message: e.to_string(),
                }
            })?;
            table
        }
    };
    let mut own = spec.config.clone();
    resolve_table_commands(&mut own, &folder_of(Path::new(&spec.file))?, policy)
        .map_err(|e| invalid(spec, "config", e.to_string()))?;
    kernmlops::config::merge(&mut base, own);
    Ok(base)
}

/// The absolute folder holding `file`.
pub(crate) fn folder_of(file: &Path) -> Result<PathBuf> {
    let file = absolute(file)?;
    Ok(file.parent().unwrap_or(Path::new("/")).to_owned())
}

/// Resolves and checks the command settings of a configuration table (its
/// `benchmarks` section) against `base`; warnings are printed.
pub(crate) fn resolve_table_commands(
    table: &mut toml::Table,
    base: &Path,
    policy: &Policy,
) -> std::result::Result<(), CommandError> {
    let Some(toml::Value::Table(benchmarks)) = table.get_mut("benchmarks") else {
        return Ok(());
    };
    let sections = benchmarks.iter_mut().filter_map(|(name, v)| match v {
        toml::Value::Table(t) => Some((name, t)),
        _ => None,
    });
    let warnings = kernmlops::config::resolve_commands(sections, base, policy)?;
    for warning in warnings {
        eprintln!(
            "warning: {}",
            kernmlops::trust::printable(warning.as_bytes())
        );
    }
    Ok(())
}

/// Resolves and checks the commands variables set (a variable whose key is
/// a command setting, or a benchmark's whole table holding one), in each
/// of their levels, against the experiment file's folder: the plan, its
/// run ids and the record then hold the checked files' absolute paths.
pub(crate) fn resolve_variable_commands(
    spec: &Spec,
    variables: &mut [spec::Variable],
    policy: &Policy,
) -> Result<()> {
    let base = folder_of(Path::new(&spec.file))?;
    for var in variables.iter_mut() {
        for (bench, key) in kernmlops::config::COMMAND_SETTINGS {
            let whole = format!("benchmarks.{bench}");
            let one = format!("{whole}.{key}");
            if var.key != whole && var.key != one {
                continue;
            }
            for level in &mut var.levels {
                let Some(mut value) = spec::json_to_toml(&level.value) else {
                    continue;
                };
                let target = if var.key == one {
                    Some(&mut value)
                } else {
                    value.as_table_mut().and_then(|t| t.get_mut(*key))
                };
                let Some(target) = target else {
                    continue;
                };
                let warnings =
                    kernmlops::config::resolve_command(target, &base, policy).map_err(|m| {
                        invalid(
                            spec,
                            &format!("variables.{}", var.name),
                            format!("{one}: {m}"),
                        )
                    })?;
                for w in warnings {
                    eprintln!("warning: {}", kernmlops::trust::printable(w.as_bytes()));
                }
                level.value = spec::toml_to_json(&value);
            }
        }
    }
    Ok(())
}

/// What a run is checked with besides its configuration: the probes it
/// runs, its benchmark and its power sources.
pub(crate) struct Checked<'a> {
    pub probes: &'a [String],
    pub benchmark: &'a str,
    pub power: Option<&'a [String]>,
}

/// Checks one configuration as `kernmlops run` will, from the text it is
/// given (no file is written): its keys and types, every probe's and
/// benchmark's settings, the component rules (`check_config`) of the
/// configured components, the run's probes and its benchmark, and the power
/// options. The error is the host's.
pub(crate) fn check_config(
    registry: &Registry,
    config: &toml::Table,
    run: &Checked<'_>,
) -> std::result::Result<Config, RunConfigError> {
    let text = toml::to_string(config)?;
    let cfg = Config::from_text(RUN_CONFIG, text.as_bytes())?;
    cfg.probe_settings(registry.config_defaults())?;
    cfg.benchmark_settings(registry.benchmark_defaults())?;
    let benchmarks = [run.benchmark.to_owned()];
    cfg.check_component_rules(registry, run.probes, &benchmarks)?;
    let declared = kernmlops::power::registry::PowerSources::of(registry).defaults();
    let power = cfg.power_settings(declared.iter().map(|(n, t)| (n.as_str(), t.as_str())))?;
    kernmlops::power::PowerOptions::new(
        &cfg.power,
        run.power,
        None,
        Config::settings_json(&power),
    )?;
    Ok(cfg)
}

/// What [`check_config`] calls the configuration it checks (no file is
/// written).
const RUN_CONFIG: &str = "the run's configuration";

/// Why [`check_config`] refuses a run's configuration: the host's error,
/// shown without the name of the (unwritten) file it may start with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunConfigError {
    #[error("{0}")]
    Text(#[from] toml::ser::Error),
    #[error("{}", without_source(.0))]
    Config(#[from] ConfigError),
    #[error("{}", without_source(.0))]
    Power(#[from] PowerError),
}

/// An error's message without the `the run's configuration: ` it starts
/// with when the configuration is named.
fn without_source(e: &dyn std::fmt::Display) -> String {
    let text = e.to_string();
    match text.strip_prefix(&format!("{RUN_CONFIG}: ")) {
        Some(rest) => rest.to_owned(),
        None => text,
    }
}

/// Checks a file the experiment takes commands from like a plugin (see
/// `trust::check_instructions`): refused in one line when others could
/// change it, or used with a warning under `--allow-insecure-plugins`.
pub(crate) fn check_trusted(path: &Path, what: &str, env: &Env) -> Result<()> {
    let policy = kernmlops::trust::Policy::for_this_process(env.allow_insecure_plugins);
    let checked = kernmlops::trust::check_instructions(path, what, &policy);
    if let Some(warning) = checked.map_err(ExperimentError::Usage)? {
        eprintln!("warning: {warning}");
    }
    Ok(())
}

/// Reads the record of an experiment whose runs this process carries out:
/// the record holds each run's configuration, and so the commands a
/// `script` benchmark runs as root.
pub(crate) fn read_trusted_record(dir: &ExpDir, env: &Env) -> Result<Record> {
    check_trusted(&dir.record(), "the experiment record", env)?;
    Record::read(dir)
}

/// Refuses an experiment folder another user owns or others can write
/// (and any folder above it), like a plugin folder, in one line with the
/// fix; under `--allow-insecure-plugins`, a warning. A folder that cannot
/// be opened passes: the command's own reading says why.
pub(crate) fn check_folder(root: &Path, env: &Env) -> Result<()> {
    use kernmlops::trust::TrustError;
    let policy = Policy::for_this_process(env.allow_insecure_plugins);
    match kernmlops::trust::check_dir_path(root, &policy) {
        Ok(()) | Err(TrustError::Io { .. }) => Ok(()),
        Err(e @ (TrustError::Writable { .. } | TrustError::Owner { .. }))
            if policy.allow_insecure =>
        {
            eprintln!(
                "warning: using experiment folder {} although {e} (--allow-insecure-plugins)",
                kernmlops::trust::printable(root.as_os_str().as_encoded_bytes())
            );
            Ok(())
        }
        Err(e) => Err(ExperimentError::Usage(format!(
            "refusing experiment folder {}: {e}",
            kernmlops::trust::printable(root.as_os_str().as_encoded_bytes())
        ))),
    }
}

/// Whether a folder without a record holds only what an interrupted start
/// of `experiment run` leaves (killed, or a full disk, before the record
/// was written): the layout's sub-folders with no collection or log, the
/// experiment lock, the copied experiment file and base configuration, run
/// configurations and temporary files of atomic writes. Such a folder is
/// started again as if it were empty.
pub(crate) fn only_start_leftovers(root: &Path) -> Result<bool> {
    let temporary = |n: &str| n.starts_with('.') || n.contains(".tmp");
    let names = |d: &Path| -> Result<Vec<String>> {
        std::fs::read_dir(d)
            .map_err(ExperimentError::io(d))?
            .map(|e| {
                e.map(|e| e.file_name().to_string_lossy().into_owned())
                    .map_err(ExperimentError::io(d))
            })
            .collect()
    };
    for name in names(root)? {
        let path = root.join(&name);
        let is_dir = path.symlink_metadata().is_ok_and(|m| m.is_dir());
        let ok = match name.as_str() {
            "experiment.toml" | "config.toml" => !is_dir,
            "locks" if is_dir => names(&path)?
                .iter()
                .all(|n| n == "experiment.lock" || temporary(n)),
            "configs" if is_dir => names(&path)?
                .iter()
                .all(|n| n.ends_with(".toml") || temporary(n)),
            "runs" | "logs" if is_dir => names(&path)?.is_empty(),
            n => !is_dir && temporary(n),
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Creates the folder of a new experiment (not its contents) and checks
/// it; a folder it created and refused is removed again.
pub(crate) fn create_folder(root: &Path, env: &Env) -> Result<()> {
    let existed = root.exists();
    std::fs::create_dir_all(root).map_err(ExperimentError::io(root))?;
    check_folder(root, env).inspect_err(|_| {
        if !existed {
            let _ = std::fs::remove_dir(root);
        }
    })
}
