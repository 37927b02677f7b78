//! `kernmlops repair`: make the table files of a crashed (or disk-full)
//! collection readable again, in place, and bring its manifest up to date.
//!
//! It refuses a folder whose writer is alive (the run holds the folder's
//! lock), goes on past a file it cannot repair, rebuilds a missing or empty
//! `system_info.arrow`, and leaves no temporary file on any error.

use std::path::{Path, PathBuf};

use super::record::lock_dir;
use crate::{
    manifest::{Manifest, Status, TableEntry},
    sink::{self, RepairOutcome, SinkError},
    system_info::SystemInfo,
};

/// What happened to one file.
#[derive(Debug)]
pub enum FileRepair {
    /// Intact, or repaired in place.
    Done(RepairOutcome),
    /// `system_info.arrow` was missing or held nothing, and was written
    /// again from the manifest and this machine.
    Rebuilt,
    /// The file held not even its schema (the run died before writing it),
    /// so nothing was lost by removing it.
    Removed(String),
    /// Could not be repaired; the file is left as it was (or cut back to
    /// its last complete batch).
    Failed(String),
}

/// What [`repair_collection`] did.
#[derive(Debug, Default)]
pub struct RepairReport {
    pub files: Vec<(PathBuf, FileRepair)>,
    /// Why the manifest could not be updated, if it could not.
    pub manifest_error: Option<String>,
}

impl RepairReport {
    /// Files that could not be repaired.
    pub fn failures(&self) -> usize {
        self.files
            .iter()
            .filter(|(_, r)| matches!(r, FileRepair::Failed(_)))
            .count()
    }
}

/// Why a collection cannot be repaired at all.
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    #[error("{}: a running kernmlops{} is writing this collection (it holds the folder's lock); let it finish or stop it, then repair", dir.display(), pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    Running { dir: PathBuf, pid: Option<u32> },
    #[error("{}: {source}", dir.display())]
    Folder {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not a collection (no manifest.json); nothing was changed", dir.display())]
    NotACollection { dir: PathBuf },
}

const SYSTEM_INFO: &str = "system_info";

/// Repairs every table file of a collection and updates its manifest.
pub fn repair_collection(dir: &Path) -> Result<RepairReport, RepairError> {
    let folder = |source| RepairError::Folder {
        dir: dir.to_owned(),
        source,
    };
    let _lock = match lock_dir(dir) {
        Ok(l) => l,
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
            return Err(RepairError::Running {
                dir: dir.to_owned(),
                pid: Manifest::read(dir).ok().and_then(|m| m.pid),
            })
        }
        Err(e) => return Err(folder(e)),
    };
    // Only a collection is repaired: in any other folder an `.arrow` file
    // is someone else's, and repair must not touch it.
    match std::fs::symlink_metadata(dir.join("manifest.json")) {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            return Err(RepairError::NotACollection {
                dir: dir.to_owned(),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(RepairError::NotACollection {
                dir: dir.to_owned(),
            })
        }
        Err(e) => return Err(folder(e)),
    }
    let manifest = Manifest::read(dir).ok();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(folder)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "arrow"))
        .collect();
    files.sort();
    let mut report = RepairReport::default();
    let info_path = dir.join(format!("{SYSTEM_INFO}.arrow"));
    if !files.contains(&info_path) {
        if let Some(man) = &manifest {
            let rebuilt = rebuild_system_info(&info_path, man);
            report.files.push((info_path.clone(), rebuilt));
        }
    }
    for f in files {
        let outcome = match sink::repair(&f) {
            Ok(o) => FileRepair::Done(o),
            Err(e) if f == info_path && manifest.is_some() => match &manifest {
                Some(man) => {
                    let _ = std::fs::remove_file(&f);
                    match rebuild_system_info(&f, man) {
                        FileRepair::Failed(why) => FileRepair::Failed(format!("{e}; {why}")),
                        other => other,
                    }
                }
                None => FileRepair::Failed(e.to_string()),
            },
            Err(SinkError::NotArrow { reason, .. }) if holds_nothing(&f) => {
                match std::fs::remove_file(&f) {
                    Ok(()) => FileRepair::Removed(reason),
                    Err(e) => FileRepair::Failed(format!("{reason}; removing it: {e}")),
                }
            }
            Err(e) => FileRepair::Failed(e.to_string()),
        };
        report.files.push((f, outcome));
    }
    if let Some(mut man) = manifest {
        update_manifest(&mut man, &report);
        if let Err(e) = man.write(dir) {
            report.manifest_error = Some(format!("{}: {e}", dir.join("manifest.json").display()));
        }
    }
    Ok(report)
}

/// True when `path` exists and does not end with an Arrow file's closing
/// magic: it lacks its footer (the disk filled before it was closed) and
/// `repair` must close it. A missing file lacks nothing.
pub(super) fn lacks_footer(path: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return false;
    };
    let mut tail = [0u8; 6];
    match f.seek(SeekFrom::End(-6)) {
        Ok(_) => !(f.read_exact(&mut tail).is_ok() && &tail == b"ARROW1"),
        // Shorter than the magic: not even a schema.
        Err(_) => true,
    }
}

/// True for a file with nothing to keep: empty, or the magic and part of a
/// schema at most.
fn holds_nothing(path: &Path) -> bool {
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    bytes.is_empty() || (bytes.len() < 4096 && bytes.starts_with(b"ARROW1"))
}

/// Writes `system_info.arrow` again: the collection's id and start from the
/// manifest, the rest from this machine now.
fn rebuild_system_info(path: &Path, man: &Manifest) -> FileRepair {
    let plugins: Vec<String> = man.plugins.iter().map(|p| p.name.clone()).collect();
    let written = SystemInfo::gather()
        .to_batch(
            &man.collection_id,
            man.start.uptime_us,
            man.start.unix_us,
            &plugins,
        )
        .map_err(|e| e.to_string())
        .and_then(|b| sink::write_table(path, &b).map_err(|e| e.to_string()));
    match written {
        Ok(()) => FileRepair::Rebuilt,
        Err(e) => FileRepair::Failed(format!("rebuilding it: {e}")),
    }
}

/// The manifest's tables as the files now hold them, the repair's failures
/// as errors, and `repaired` for a run that never completed.
fn update_manifest(man: &mut Manifest, report: &RepairReport) {
    for (f, outcome) in &report.files {
        let table = f
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let rows = match outcome {
            FileRepair::Done(o) => o.rows(),
            FileRepair::Rebuilt => 1,
            FileRepair::Removed(why) => {
                man.tables.remove(&table);
                man.errors.push(format!(
                    "repair: {}: {why}; removed",
                    f.file_name().unwrap_or_default().to_string_lossy()
                ));
                continue;
            }
            FileRepair::Failed(why) => {
                man.errors.push(format!("repair: {why}"));
                continue;
            }
        };
        let probe = if table == SYSTEM_INFO { "host" } else { "" };
        let entry = man
            .tables
            .entry(table.clone())
            .or_insert_with(|| TableEntry {
                probe: probe.into(),
                file: format!("{table}.arrow"),
                rows,
                lost_events: 0,
                needs_repair: false,
            });
        entry.rows = rows;
        entry.needs_repair = false;
    }
    if man.status == Status::Running {
        man.status = Status::Repaired;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{Instant, RunClass};

    fn manifest(id: &str) -> Manifest {
        Manifest {
            kernmlops_version: "test".into(),
            collection_id: id.into(),
            status: Status::Running,
            command: vec![],
            config: serde_json::Value::Null,
            hostname: "h".into(),
            kernel_release: "r".into(),
            kernel_version: "v".into(),
            kernel_features: serde_json::Value::Null,
            start: Instant::now(),
            end: None,
            plugins: vec![],
            refused_plugins: vec![],
            probes: vec![],
            tables: Default::default(),
            errors: vec![],
            run_class: RunClass::Running,
            benchmark: None,
            include_self: false,
            allow_insecure_plugins: false,
            collector_overhead: None,
            pid: Some(1),
            power: None,
            slurm: None,
            machine: Vec::new(),
        }
    }

    #[test]
    fn goes_past_bad_files_rebuilds_system_info_and_refuses_a_live_writer() {
        let dir = std::env::temp_dir().join(format!("kml-repair-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        manifest("20250101-000000-0123456789ab")
            .write(&dir)
            .expect("manifest");
        std::fs::write(dir.join("system_info.arrow"), b"").expect("empty system_info");
        std::fs::write(dir.join("empty.arrow"), b"").expect("empty table");
        std::fs::write(dir.join("alien.arrow"), b"PAR1 not ours, keep me").expect("alien");

        let held = lock_dir(&dir).expect("lock");
        let e = repair_collection(&dir).expect_err("locked").to_string();
        assert!(e.contains("a running kernmlops (pid 1)"), "{e}");
        drop(held);

        let report = repair_collection(&dir).expect("repair");
        let by_name = |n: &str| {
            report
                .files
                .iter()
                .find(|(p, _)| p.ends_with(n))
                .map(|(_, r)| r)
                .unwrap_or_else(|| panic!("{n} not in {report:?}"))
        };
        assert!(matches!(by_name("system_info.arrow"), FileRepair::Rebuilt));
        assert!(matches!(by_name("empty.arrow"), FileRepair::Removed(_)));
        assert!(matches!(by_name("alien.arrow"), FileRepair::Failed(_)));
        assert_eq!(report.failures(), 1);
        assert!(dir.join("alien.arrow").is_file(), "an unknown file is kept");
        let man = Manifest::read(&dir).expect("manifest");
        assert_eq!(man.status, Status::Repaired);
        assert_eq!(man.tables["system_info"].rows, 1);
        assert!(!man.tables.contains_key("empty"));
        let names: Vec<String> = std::fs::read_dir(&dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names
                .iter()
                .all(|n| !n.ends_with(".tmp") && !n.contains("repairing")),
            "temporary files left: {names:?}"
        );
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    /// After a full disk, the run's error line and the manifest name the
    /// table file left without its footer, and only that one.
    #[test]
    fn a_file_left_without_its_footer_is_named_in_the_manifest() {
        let dir = kernmlops_sys::private::TempDir::new("kml-footerless").expect("temp dir");
        let path = dir.path().to_owned();
        std::fs::write(path.join("closed.arrow"), b"ARROW1\0\0....ARROW1").expect("closed");
        std::fs::write(path.join("open.arrow"), b"ARROW1\0\0 a batch, no footer").expect("open");
        let mut man = manifest("20250101-000000-0123456789ab");
        for t in ["closed", "open"] {
            man.tables.insert(
                t.into(),
                TableEntry {
                    probe: "p".into(),
                    file: format!("{t}.arrow"),
                    rows: 7,
                    lost_events: 0,
                    needs_repair: false,
                },
            );
        }
        let mut record = super::super::record::RunRecord {
            dir: path.clone(),
            man,
            lock: None,
        };
        let line = record.write_failed("writing open.arrow: No space left on device");
        assert!(
            line.contains("without a footer: open.arrow")
                && !line.contains("closed.arrow")
                && line.contains(&format!("kernmlops repair {}", path.display())),
            "{line}"
        );
        assert!(record.man.tables["open"].needs_repair);
        assert!(!record.man.tables["closed"].needs_repair);
        record.man.write(&path).expect("manifest");
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path.join("manifest.json")).expect("read"))
                .expect("json");
        assert_eq!(json["tables"]["open"]["needs_repair"], true);
        assert!(json["tables"]["closed"].get("needs_repair").is_none());
        assert!(json["errors"][0]
            .as_str()
            .is_some_and(|e| e.contains("open.arrow")));
    }

    /// A folder without `manifest.json` is not a collection: repair refuses
    /// it and changes nothing, not even an empty `.arrow` file.
    #[test]
    fn a_folder_without_a_manifest_is_refused_and_left_as_it_was() {
        let dir = kernmlops_sys::private::TempDir::new("kml-repair-alien").expect("temp dir");
        let path = dir.path().to_owned();
        std::fs::write(path.join("empty.arrow"), b"").expect("empty file");
        std::fs::write(path.join("magic.arrow"), b"ARROW1").expect("magic only");
        let e = repair_collection(&path).expect_err("refused").to_string();
        assert!(
            e.contains("not a collection (no manifest.json)") && e.contains("nothing was changed"),
            "{e}"
        );
        assert!(!e.contains('\n'), "one line: {e}");
        assert!(path.join("empty.arrow").is_file(), "the empty file is kept");
        assert_eq!(
            std::fs::read(path.join("magic.arrow")).expect("read"),
            b"ARROW1"
        );
        let names: Vec<_> = std::fs::read_dir(&path).expect("dir").collect();
        assert_eq!(names.len(), 2, "nothing added or removed");
    }
}
