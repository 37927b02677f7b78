//! A run folder's `manifest.json` as the experiment layer reads it: the
//! host's [`Manifest`] (read tolerantly, so keys an older version did not
//! write take their defaults) with what a roles run adds to it (`roles`,
//! `executor`). Nothing here looks a key up by its name: a field renamed
//! in the host's types is a compile error here, not a null column.

use std::{collections::BTreeMap, io::Read, path::Path};

use serde::{Deserialize, Serialize};

use kernmlops::manifest::{Manifest, RunClass, Status};

/// The largest `manifest.json` read.
pub const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// One role of a roles run, as the run's `manifest.json` records it under
/// `roles.<name>`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RoleEntry {
    /// The node it ran on.
    pub node: String,
    /// The address other roles reach it at.
    pub host: String,
    /// Its collection's folder, inside the run's folder.
    pub collection: String,
    pub benchmark: String,
    /// Its probes; `None`: the configuration's.
    pub probes: Option<Vec<String>>,
    /// Whether its figures are the run's result.
    pub result: bool,
    pub started: bool,
    pub ready_after_s: Option<f64>,
    /// Whether the run stopped it (rather than it ending by itself).
    pub stopped_by_run: bool,
    pub exit_code: Option<i32>,
    /// Its own collection's status and run class.
    pub status: Option<Status>,
    pub run_class: Option<RunClass>,
    /// Its collection recorded only its own benchmark's processes.
    pub filtered: bool,
}

/// What a roles run writes beside the host's keys.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
struct Additions {
    roles: BTreeMap<String, RoleEntry>,
    executor: Option<String>,
}

/// A run's `manifest.json`, typed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunManifest {
    pub manifest: Manifest,
    /// Each role of a roles run, by name (empty otherwise).
    pub roles: BTreeMap<String, RoleEntry>,
    /// The executor of a roles run (`local`).
    pub executor: Option<String>,
}

impl RunManifest {
    /// From the manifest's JSON: the host's keys through
    /// [`Manifest::from_value_tolerant`], the roles run's through
    /// [`RoleEntry`].
    pub fn from_value(value: serde_json::Value) -> serde_json::Result<Self> {
        let additions = Additions::deserialize(&value)?;
        Ok(Self {
            manifest: Manifest::from_value_tolerant(value)?,
            roles: additions.roles,
            executor: additions.executor,
        })
    }

    /// Reads `manifest.json` in `run_dir` (at most [`MAX_MANIFEST_BYTES`]).
    pub fn read(run_dir: &Path) -> std::io::Result<Self> {
        let path = run_dir.join("manifest.json");
        let mut text = String::new();
        std::fs::File::open(&path)?
            .take(MAX_MANIFEST_BYTES + 1)
            .read_to_string(&mut text)?;
        if text.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(std::io::Error::other(format!(
                "{}: larger than {MAX_MANIFEST_BYTES} bytes",
                path.display()
            )));
        }
        let value = serde_json::from_str(&text).map_err(std::io::Error::other)?;
        Self::from_value(value).map_err(std::io::Error::other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_roles_runs_manifest_reads_with_its_roles() {
        let m = RunManifest::from_value(serde_json::json!({
            "status": "failed", "run_class": "failed", "errors": ["role server was not ready"],
            "hostname": "vm", "executor": "local", "tables": {},
            "roles": {"server": {"node": "vm", "host": "127.0.0.1", "collection": "server",
                "benchmark": "script", "probes": null, "result": false, "started": true,
                "ready_after_s": null, "stopped_by_run": true, "exit_code": null,
                "status": "complete", "run_class": "baseline"}},
        }))
        .expect("valid");
        assert_eq!(m.manifest.status, Status::Failed);
        assert_eq!(m.manifest.hostname, "vm");
        assert_eq!(m.executor.as_deref(), Some("local"));
        let server = &m.roles["server"];
        assert_eq!(server.node, "vm");
        assert!(server.stopped_by_run && !server.result);
        assert_eq!(server.run_class, Some(RunClass::Baseline));
        // A run without roles has none; a wrong type is an error.
        let plain = RunManifest::from_value(serde_json::json!({"status": "complete"}));
        assert!(plain.expect("valid").roles.is_empty());
        let bad = serde_json::json!({"roles": {"a": {"started": "yes"}}});
        assert!(RunManifest::from_value(bad).is_err());
    }

    #[test]
    fn reading_is_bounded() {
        let dir = kernmlops_sys::private::TempDir::new("kml-run-files").expect("temp");
        assert!(RunManifest::read(dir.path()).is_err(), "no file");
        let f = std::fs::File::create(dir.path().join("manifest.json")).expect("file");
        f.set_len(MAX_MANIFEST_BYTES + 1).expect("size");
        let e = RunManifest::read(dir.path()).expect_err("too large");
        assert!(e.to_string().contains("larger than"), "{e}");
    }
}
