//! memory_usage: the system's memory counters from `/proc/meminfo`, one row
//! per sample at a configurable interval. Plain Rust, no BPF: the kernel
//! already keeps these counters, and reading them costs one file read.
//!
//! The fields of `/proc/meminfo` depend on the kernel's version and
//! configuration, so the columns are decided when the probe starts, from the
//! running kernel's file: one u64 column per field, in bytes for `kB` fields
//! (`MemTotal` -> `mem_total_bytes`) and as a count for the others
//! (`HugePages_Total` -> `hugepages_total`). The declared table lists the
//! fields common to current kernels; [`ProbeImpl::tables`] returns the
//! run-time table.
//!
//! Records are `ts_uptime_us` followed by one little-endian u64 per field, in
//! the order of the kernel's file: column `i` (from 0, after the timestamp)
//! is at byte `8 * (i + 1)`. There is no C struct to take offsets from, since
//! the layout is only known at run time.

use std::{
    collections::HashMap,
    fs::File,
    io::{Read, Seek, SeekFrom},
    time::Duration,
};

use kernmlops_plugin_sdk::{
    api::TIMESTAMP_COLUMN, export_plugin, settings, sys, table::TableBuilder, Batch, BatchExt,
    ColumnKind, Error, HumanDuration, ProbeDecl, ProbeImpl, Result, Schedule, StartArgs, TableDecl,
};

const MEMINFO: &str = "/proc/meminfo";
const TABLE: &str = "memory_usage";
const TABLE_DESCRIPTION: &str = "One row per sample of /proc/meminfo";
/// Shortest sampling interval: below it the collector would spend its time
/// reading the file.
const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// Fields of `/proc/meminfo` found on current kernels with common
/// configurations (`kB` ones are in bytes in the table). The run-time table
/// has exactly the running kernel's fields, in its order.
const COMMON_FIELDS: &[(&str, bool)] = &[
    ("MemTotal", true),
    ("MemFree", true),
    ("MemAvailable", true),
    ("Buffers", true),
    ("Cached", true),
    ("SwapCached", true),
    ("Active", true),
    ("Inactive", true),
    ("Active(anon)", true),
    ("Inactive(anon)", true),
    ("Active(file)", true),
    ("Inactive(file)", true),
    ("Unevictable", true),
    ("Mlocked", true),
    ("SwapTotal", true),
    ("SwapFree", true),
    ("Dirty", true),
    ("Writeback", true),
    ("AnonPages", true),
    ("Mapped", true),
    ("Shmem", true),
    ("KReclaimable", true),
    ("Slab", true),
    ("SReclaimable", true),
    ("SUnreclaim", true),
    ("KernelStack", true),
    ("PageTables", true),
    ("NFS_Unstable", true),
    ("Bounce", true),
    ("WritebackTmp", true),
    ("CommitLimit", true),
    ("Committed_AS", true),
    ("VmallocTotal", true),
    ("VmallocUsed", true),
    ("VmallocChunk", true),
    ("Percpu", true),
    ("AnonHugePages", true),
    ("ShmemHugePages", true),
    ("ShmemPmdMapped", true),
    ("HugePages_Total", false),
    ("HugePages_Free", false),
    ("HugePages_Rsvd", false),
    ("HugePages_Surp", false),
    ("Hugepagesize", true),
    ("Hugetlb", true),
];

settings! {
    /// `[probes.memory_usage]` settings.
    pub struct Settings {
        /// Time between two samples of /proc/meminfo: "1s", "500ms", "2m" (at least 10ms).
        pub interval: HumanDuration = HumanDuration::from_secs(1),
    }
    validate(s) {
        if s.interval.get() < MIN_INTERVAL {
            return Err(format!(
                "interval: {} is shorter than the minimum, 10ms",
                s.interval
            ));
        }
        Ok(())
    }
}

/// The column name of a `/proc/meminfo` field: lowercase snake_case, words
/// split at case changes, digits and parentheses, `_bytes` appended for `kB`
/// fields. `HugePages_*` keep `hugepages` as one word, as in `Hugepagesize`.
///
/// `MemTotal` -> `mem_total_bytes`, `Active(anon)` -> `active_anon_bytes`,
/// `HugePages_Total` -> `hugepages_total`, `DirectMap4k` ->
/// `direct_map_4k_bytes`, `DirectMap2M` -> `direct_map_2m_bytes`,
/// `Committed_AS` -> `committed_as_bytes`, `KReclaimable` ->
/// `k_reclaimable_bytes`.
pub fn column_name(field: &str, in_kb: bool) -> String {
    let (mut out, rest) = match field.strip_prefix("HugePages_") {
        Some(rest) => (String::from("hugepages_"), rest),
        None => (String::new(), field),
    };
    let chars: Vec<char> = rest.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let prev = i.checked_sub(1).and_then(|p| chars.get(p)).copied();
        let next = chars.get(i + 1).copied();
        if c.is_ascii_alphanumeric() {
            let boundary = match prev {
                None => false,
                Some(p) if c.is_ascii_uppercase() => {
                    // "MemTotal", "DirectMap4k" | "KReclaimable" ("K" + "Reclaimable"),
                    // but not "2M" or "NFS".
                    p.is_ascii_lowercase()
                        || (p.is_ascii_uppercase() && next.is_some_and(|n| n.is_ascii_lowercase()))
                }
                Some(p) if c.is_ascii_digit() => p.is_ascii_alphabetic(),
                Some(_) => false,
            };
            if boundary && !out.is_empty() && !out.ends_with('_') {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('_') {
            // '(', ')', '_' and anything else separate words.
            out.push('_');
        }
    }
    while out.ends_with('_') {
        out.pop();
    }
    if in_kb {
        out.push_str("_bytes");
    }
    out
}

use sys::names::is_snake_case;

/// One field of `/proc/meminfo` and its column.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Field {
    /// The name in the file, before the colon.
    name: String,
    column: String,
    /// 1024 for `kB` fields (the column is in bytes), 1 for counts.
    scale: u64,
}

/// A line `Name:   123 kB` split into name, value and whether it is in kB;
/// `None` for a line of another shape.
fn parse_line(line: &str) -> Option<(&str, u64, Option<&str>)> {
    let (name, rest) = line.split_once(':')?;
    let mut words = rest.split_whitespace();
    let value = words.next()?.parse().ok()?;
    Some((name.trim(), value, words.next()))
}

/// The columns for the fields of a `/proc/meminfo` text, and a note for each
/// line that cannot be a column.
fn fields_of(text: &str) -> (Vec<Field>, Vec<String>) {
    let mut fields: Vec<Field> = Vec::new();
    let mut notes = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Some((name, _, unit)) = parse_line(line) else {
            notes.push(format!(
                "{MEMINFO} line {line:?} is not `Name: number [kB]`; skipped"
            ));
            continue;
        };
        let in_kb = match unit {
            None => false,
            Some("kB") => true,
            Some(other) => {
                notes.push(format!(
                    "{MEMINFO} field {name} has unknown unit {other:?}; skipped"
                ));
                continue;
            }
        };
        let column = column_name(name, in_kb);
        if !is_snake_case(&column) || column == TIMESTAMP_COLUMN {
            notes.push(format!(
                "{MEMINFO} field {name} gives no usable column name ({column:?}); skipped"
            ));
            continue;
        }
        if let Some(other) = fields.iter().find(|f| f.column == column) {
            notes.push(format!(
                "{MEMINFO} fields {} and {name} both map to column {column}; {name} skipped",
                other.name
            ));
            continue;
        }
        fields.push(Field {
            name: name.to_owned(),
            column,
            scale: if in_kb { 1024 } else { 1 },
        });
    }
    (fields, notes)
}

/// The table for `fields`: `ts_uptime_us`, then one u64 per field.
fn table_for(fields: &[Field]) -> TableDecl {
    let record_size = 8 * (fields.len() + 1);
    let t = TableBuilder::with_record_size(TABLE, TABLE_DESCRIPTION, record_size).column(
        TIMESTAMP_COLUMN,
        ColumnKind::U64,
        0,
        8,
        "us",
        "when the sample was taken (CLOCK_BOOTTIME)",
    );
    fields
        .iter()
        .enumerate()
        .fold(t, |t, (i, f)| {
            let (unit, what) = if f.scale == 1 {
                ("count", format!("{} in {MEMINFO}", f.name))
            } else {
                ("bytes", format!("{} in {MEMINFO}, in bytes", f.name))
            };
            t.column(&f.column, ColumnKind::U64, 8 * (i + 1), 8, unit, &what)
        })
        .build()
}

/// The running probe.
pub struct MemoryUsage {
    /// When the next sample is due (the first at once).
    schedule: Schedule,
    fields: Vec<Field>,
    /// Field name -> index in `fields`, for lines out of the usual order.
    index: HashMap<String, usize>,
    file: File,
    text: String,
    values: Vec<u64>,
    record: Vec<u64>,
    notes: Vec<String>,
}

impl MemoryUsage {
    /// Reads `/proc/meminfo` again into `self.text`.
    fn read(&mut self) -> Result<()> {
        self.text.clear();
        self.file
            .seek(SeekFrom::Start(0))
            .and_then(|_| self.file.read_to_string(&mut self.text))
            .map_err(|e| Error::new(format!("reading {MEMINFO}: {e}")))?;
        Ok(())
    }

    /// Takes one sample and appends its row.
    fn sample(&mut self, batch: &mut Batch) -> Result<()> {
        let ts = sys::clock::uptime_us();
        self.read()?;
        // A field missing from a sample (never seen: the set is fixed for a
        // boot) reads as 0.
        self.values.fill(0);
        for (i, line) in self.text.lines().enumerate() {
            let Some((name, value, _)) = parse_line(line) else {
                continue;
            };
            let idx = match self.fields.get(i) {
                Some(f) if f.name == name => Some(i),
                _ => self.index.get(name).copied(),
            };
            if let Some(idx) = idx {
                self.values[idx] = value.saturating_mul(self.fields[idx].scale);
            }
        }
        // One record: the timestamp, then one u64 per field.
        self.record.clear();
        self.record.push(ts);
        self.record.extend_from_slice(&self.values);
        batch.push_record_of(&self.record);
        Ok(())
    }
}

impl ProbeImpl for MemoryUsage {
    const NAME: &'static str = "memory_usage";
    type Settings = Settings;

    fn decl() -> ProbeDecl {
        let fields: Vec<Field> = COMMON_FIELDS
            .iter()
            .map(|&(name, in_kb)| Field {
                name: name.to_owned(),
                column: column_name(name, in_kb),
                scale: if in_kb { 1024 } else { 1 },
            })
            .collect();
        ProbeDecl {
            name: Self::NAME.into(),
            description: "System memory counters from /proc/meminfo, sampled at an interval".into(),
            tables: vec![table_for(&fields)].into(),
        }
    }

    fn start(_args: &StartArgs, settings: Settings) -> Result<Self> {
        let interval = settings.interval.get();
        let file =
            File::open(MEMINFO).map_err(|e| Error::new(format!("opening {MEMINFO}: {e}")))?;
        let mut probe = Self {
            schedule: Schedule::new(interval, Duration::ZERO),
            fields: Vec::new(),
            index: HashMap::new(),
            file,
            text: String::new(),
            values: Vec::new(),
            record: Vec::new(),
            notes: Vec::new(),
        };
        probe.read()?;
        let (fields, notes) = fields_of(&probe.text);
        if fields.is_empty() {
            return Err(Error::new(format!(
                "{MEMINFO} has no field this probe can read"
            )));
        }
        probe.index = fields
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name.clone(), i))
            .collect();
        probe.values = vec![0; fields.len()];
        probe.fields = fields;
        probe.notes = notes;
        Ok(probe)
    }

    fn drain(&mut self, timeout: Duration, batches: &mut [Batch]) -> Result<()> {
        let [batch] = batches else {
            return Err(Error::new(format!(
                "host passed {} batches for 1 table",
                batches.len()
            )));
        };
        if self.schedule.wait(timeout) {
            self.sample(batch)?;
        }
        Ok(())
    }

    fn stop(&mut self) -> Result<()> {
        Ok(())
    }

    fn tables(&self) -> Vec<TableDecl> {
        vec![table_for(&self.fields)]
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }
}

export_plugin! {
    description: "System memory counters from /proc/meminfo, sampled at an interval",
    probes: [MemoryUsage],
}

#[cfg(test)]
mod tests {
    use kernmlops_plugin_sdk::settings::parse;

    use super::*;

    fn interval_from_config(json: &str) -> Result<Duration> {
        parse::<Settings>("[probes.memory_usage]", json).map(|s| s.interval.get())
    }

    #[test]
    fn shown_defaults_are_the_used_ones() {
        kernmlops_plugin_testing::check_settings_defaults::<Settings>("[probes.memory_usage]");
    }

    #[test]
    fn column_names_follow_the_documented_mapping() {
        for (field, in_kb, column) in [
            ("MemTotal", true, "mem_total_bytes"),
            ("MemAvailable", true, "mem_available_bytes"),
            ("SwapCached", true, "swap_cached_bytes"),
            ("Active(anon)", true, "active_anon_bytes"),
            ("Inactive(file)", true, "inactive_file_bytes"),
            ("HugePages_Total", false, "hugepages_total"),
            ("HugePages_Rsvd", false, "hugepages_rsvd"),
            ("Hugepagesize", true, "hugepagesize_bytes"),
            ("DirectMap4k", true, "direct_map_4k_bytes"),
            ("DirectMap2M", true, "direct_map_2m_bytes"),
            ("DirectMap1G", true, "direct_map_1g_bytes"),
            ("Committed_AS", true, "committed_as_bytes"),
            ("NFS_Unstable", true, "nfs_unstable_bytes"),
            ("KReclaimable", true, "k_reclaimable_bytes"),
            ("SUnreclaim", true, "s_unreclaim_bytes"),
            ("AnonHugePages", true, "anon_huge_pages_bytes"),
            ("ShmemPmdMapped", true, "shmem_pmd_mapped_bytes"),
            ("Percpu", true, "percpu_bytes"),
        ] {
            assert_eq!(column_name(field, in_kb), column, "{field}");
        }
    }

    #[test]
    fn fields_come_from_the_file_in_its_order() {
        let text = "MemTotal:       24684084 kB\nHugePages_Total:       3\n\
                    Odd line\nWeird:  5 MB\nDirectMap4k:       30720 kB\n";
        let (fields, notes) = fields_of(text);
        let columns: Vec<&str> = fields.iter().map(|f| f.column.as_str()).collect();
        assert_eq!(
            columns,
            ["mem_total_bytes", "hugepages_total", "direct_map_4k_bytes"]
        );
        assert_eq!(fields[0].scale, 1024);
        assert_eq!(fields[1].scale, 1);
        assert_eq!(notes.len(), 2, "{notes:?}");
    }

    #[test]
    fn every_field_of_this_kernel_gets_a_valid_column() {
        let text = std::fs::read_to_string(MEMINFO).expect("reading /proc/meminfo");
        let (fields, notes) = fields_of(&text);
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(fields.len(), text.lines().count());
        let t = table_for(&fields);
        assert_eq!(t.record_size as usize, 8 * (fields.len() + 1));
        assert!(t.columns.iter().all(|c| is_snake_case(&c.name)));
    }

    #[test]
    fn declared_table_is_valid() {
        let decl = MemoryUsage::decl();
        let t = &decl.tables[0];
        assert_eq!(t.columns[0].name.as_str(), TIMESTAMP_COLUMN);
        assert!(t.columns.iter().all(|c| is_snake_case(&c.name)));
        assert_eq!(t.record_size as usize, 8 * t.columns.len());
    }

    #[test]
    fn settings_are_checked() {
        assert_eq!(
            interval_from_config("{}").expect("default"),
            Duration::from_secs(1)
        );
        assert_eq!(
            interval_from_config(r#"{"interval":"500ms"}"#).expect("500ms"),
            Duration::from_millis(500)
        );
        let e = interval_from_config(r#"{"bogus":1}"#).expect_err("unknown key");
        assert!(e.message.contains("bogus"), "{e}");
        let e = interval_from_config(r#"{"interval":"5ms"}"#).expect_err("too short");
        assert!(e.message.contains("10ms"), "{e}");
        assert!(interval_from_config(r#"{"interval":"fast"}"#).is_err());
    }
}
