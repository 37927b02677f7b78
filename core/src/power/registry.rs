//! The power sources the loaded plugins offer, each checked by the plugin
//! API's rule (`validate_power_source`) and unique by name: a source that
//! fails the rule, or whose name another plugin also claims, is refused
//! with its reason (an in-tree plugin is kept against a third-party one);
//! the plugin's other components still load.

use kernmlops_plugin_api::{PowerSourceBox, PowerSourceDecl, StartArgs};

use crate::plugin::{Plugin, Registry, IN_TREE_PLUGINS};

/// In-tree meters in the order `auto` prefers them, before third-party
/// meters; modelled sources come last whatever their plugin.
pub const PREFERENCE: &[&str] = &["rapl", "perf_power", "hwmon"];

/// One installed power source.
#[derive(Debug)]
pub struct Installed<'a> {
    pub plugin: &'a Plugin,
    pub decl: PowerSourceDecl,
}

impl Installed<'_> {
    pub fn name(&self) -> &str {
        self.decl.name.as_str()
    }

    /// Its declared settings with defaults (TOML).
    pub fn defaults(&self) -> Result<String, String> {
        self.plugin.power_source_defaults(self.name())
    }

    /// Creates it with `config_json` as its settings.
    pub fn start(&self, config_json: &str) -> Result<PowerSourceBox, String> {
        let args = StartArgs::new(config_json).with_include_self(true);
        self.plugin
            .start_power_source(self.name(), &args)
            .map_err(|e| e.to_string())
    }
}

/// A source that was refused, with why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub name: String,
    pub plugin: String,
    pub reason: String,
}

/// Every power source of a registry.
#[derive(Debug, Default)]
pub struct PowerSources<'a> {
    pub sources: Vec<Installed<'a>>,
    pub refused: Vec<Refused>,
}

impl<'a> PowerSources<'a> {
    pub fn of(registry: &'a Registry) -> Self {
        let mut out = Self::default();
        let mut candidates: Vec<Installed<'a>> = Vec::new();
        for plugin in &registry.plugins {
            let decls = match plugin.power_sources() {
                Ok(d) => d,
                Err(e) => {
                    out.refused.push(Refused {
                        name: "*".into(),
                        plugin: plugin.name().to_owned(),
                        reason: format!("listing its power sources failed: {e}"),
                    });
                    continue;
                }
            };
            for decl in decls {
                match kernmlops_plugin_api::validate_power_source(&decl) {
                    Ok(()) => candidates.push(Installed { plugin, decl }),
                    Err(reason) => out.refused.push(Refused {
                        name: decl.name.to_string(),
                        plugin: plugin.name().to_owned(),
                        reason,
                    }),
                }
            }
        }
        // Names claimed twice: an in-tree plugin keeps its source against a
        // third-party one; otherwise both are refused.
        let mut kept: Vec<Installed<'a>> = Vec::new();
        for c in candidates {
            let in_tree = |i: &Installed<'_>| IN_TREE_PLUGINS.contains(&i.plugin.name());
            match kept.iter().position(|k| k.decl.name == c.decl.name) {
                None => kept.push(c),
                Some(i) => {
                    let k = &kept[i];
                    let (keep_old, keep_new) = match (in_tree(k), in_tree(&c)) {
                        (true, false) => (true, false),
                        (false, true) => (false, true),
                        _ => (false, false),
                    };
                    let clash = |loser: &Installed<'_>, other: &Installed<'_>| Refused {
                        name: loser.name().to_owned(),
                        plugin: loser.plugin.name().to_owned(),
                        reason: format!(
                            "power source {} is also offered by plugin {} ({}); {}",
                            loser.name(),
                            other.plugin.name(),
                            other.plugin.path.display(),
                            if keep_old || keep_new {
                                "the shipped plugin's is kept; fix: rename this one"
                            } else {
                                "both are refused; fix: remove or rename one of them"
                            }
                        ),
                    };
                    if !keep_new {
                        out.refused.push(clash(&c, k));
                    }
                    if !keep_old {
                        out.refused.push(clash(k, &c));
                        let old = kept.remove(i);
                        if keep_new {
                            kept.push(c);
                        }
                        drop(old);
                    }
                }
            }
        }
        kept.sort_by_key(|s| rank(s.name(), s.plugin.name()));
        out.sources = kept;
        out
    }

    pub fn find(&self, name: &str) -> Option<&Installed<'a>> {
        self.sources.iter().find(|s| s.name() == name)
    }

    pub fn refused(&self, name: &str) -> Option<&Refused> {
        self.refused.iter().find(|r| r.name == name)
    }

    pub fn names(&self) -> Vec<&str> {
        self.sources.iter().map(Installed::name).collect()
    }

    /// `(name, defaults TOML)` of every source, for the configuration.
    pub fn defaults(&self) -> Vec<(String, String)> {
        self.sources
            .iter()
            .map(|s| (s.name().to_owned(), s.defaults().unwrap_or_default()))
            .collect()
    }
}

/// Listing order: the preferred in-tree meters, then other in-tree
/// sources, then third-party ones, by name.
fn rank(name: &str, plugin: &str) -> (usize, bool, String) {
    let preferred = PREFERENCE
        .iter()
        .position(|p| *p == name)
        .unwrap_or(PREFERENCE.len());
    (
        preferred,
        !IN_TREE_PLUGINS.contains(&plugin),
        name.to_owned(),
    )
}
