//! process_metadata: who each task is (ids, name, command line, parent,
//! nice, cgroup, start time), for the tasks that exist when the probe starts
//! (read from `/proc`, the initial-records hook) and for every task created
//! or program executed while it runs (BPF on `sched_process_fork` and
//! `sched_process_exec`), whose records a fix-up hook completes in user
//! space (cgroup id -> path, NULs between arguments -> spaces).

use std::{
    collections::HashMap,
    fs::File,
    io::Read,
    path::{Path, PathBuf},
};

use kernmlops_plugin_bpf::{
    bpf_probe, export_plugin,
    sdk::{
        record::{c_chars, set_c_chars},
        sys::{self, cgroup::CgroupPaths},
        BatchExt, NoSettings, StartArgs,
    },
    Batch, BpfHooks, BpfProbe, LoadContext, Open, Records, Result,
};

/// One record of the `process_metadata` table, from `process_metadata.h`.
pub type Event = skel::types::process_metadata_event;

/// Labels of `source`, indexed by the `PROCESS_METADATA_*` values of
/// `process_metadata.h`.
pub const SOURCES: &[&str] = &["existing", "new"];
const SOURCE_EXISTING: u32 = 0;

/// Size of the field `f` selects, from the compiler.
const fn field_size<T, F>(_f: fn(&T) -> &F) -> usize {
    std::mem::size_of::<F>()
}

/// Longest command line kept, in bytes (`PROCESS_METADATA_CMDLINE_LEN`).
pub const CMDLINE_LEN: usize = field_size(|e: &Event| &e.cmdline);
// The README documents at least 4096 bytes.
const _: () = assert!(CMDLINE_LEN >= 4096);

bpf_probe! {
    probe: ProcessMetadata,
    name: "process_metadata",
    description: "Name, command line, parent, nice, cgroup and start time of every task",
    hooks: custom,
    tables: [
        process_metadata(metadata_ring, process_metadata_event, rate = 5_000):
            "One row per task found at start, task created or program executed" {
            ts_uptime_us [us]: "when the row was recorded (CLOCK_BOOTTIME)",
            pid: "thread id",
            tgid: "process id",
            ppid: "process id of the real parent",
            name: "the task's command name (comm)",
            cmdline: "the process's arguments joined by spaces, at most 4096 bytes",
            cmdline_truncated as bool: "the arguments were longer than cmdline holds",
            start_time_uptime_us [us]: "when the task started (CLOCK_BOOTTIME)",
            nice: "nice value, -20 to 19",
            cgroup_id: "cgroup v2 id (inode number of its folder)",
            cgroup: "cgroup v2 path, like /system.slice/foo.service",
            source as label(SOURCES): "existing (in /proc at start) or new (fork or exec while collecting)",
        },
    ],
}

/// The probe's user-space state: the cgroup paths it has learnt.
#[derive(Default)]
pub struct ProcessMetadata {
    cgroups: Option<CgroupPaths>,
}

impl ProcessMetadata {
    fn cgroups(&mut self) -> &mut CgroupPaths {
        self.cgroups.get_or_insert_with(CgroupPaths::new)
    }
}

impl BpfHooks for ProcessMetadata {
    fn before_load(
        &mut self,
        _open: &mut Open<Self>,
        cx: &mut LoadContext<'_, NoSettings>,
    ) -> Result<()> {
        if self.cgroups().mount().is_none() {
            cx.note("no cgroup2 file system is mounted: cgroup paths of new tasks are empty");
        }
        Ok(())
    }

    /// The tasks in `/proc` once the programs are attached: a task created
    /// in between has a row of each source rather than none.
    fn initial_records(&mut self, args: &StartArgs, batches: &mut [Batch]) -> Result<()> {
        let cgroups = self.cgroups();
        if let Some(batch) = batches.first_mut() {
            for rec in scan_proc(args, cgroups) {
                batch.push_record(&rec);
            }
        }
        Ok(())
    }

    /// Fills the cgroup path and joins the arguments of BPF records.
    fn fix_records(&mut self, _table: usize, records: &mut Records<'_>) -> Result<()> {
        let cgroups = self.cgroups();
        cgroups.learn(records.read::<Event>().iter().map(|e| e.cgroup_id));
        records.update(|e: &mut Event| {
            join_args(&mut e.cmdline);
            set_c_chars(&mut e.cgroup, cgroups.path(e.cgroup_id).as_bytes());
        });
        Ok(())
    }
}

export_plugin! {
    description: "Name, command line, parent, nice, cgroup and start time of every task",
    probes: [BpfProbe<ProcessMetadata>],
}

/// Turns the NULs between arguments into spaces; NULs after the last
/// argument stay (the string's end).
fn join_args(cmdline: &mut [i8]) {
    if let Some(last) = cmdline.iter().rposition(|&b| b != 0) {
        for b in &mut cmdline[..last] {
            if *b == 0 {
                *b = b' ' as i8;
            }
        }
    }
}

/// Reads at most `max` bytes of a file.
fn read_prefix(path: &Path, max: usize) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    File::open(path)
        .ok()?
        .take(max as u64)
        .read_to_end(&mut buf)
        .ok()?;
    Some(buf)
}

/// What `/proc/<pid>/task/<tid>/stat` says about a task.
#[derive(Debug, PartialEq, Eq)]
struct Stat {
    comm: Vec<u8>,
    ppid: u32,
    nice: i32,
    start_ticks: u64,
}

/// Parses a `stat` line: the comm is between the first `(` and the last
/// `)` (it may hold both), then fields 3 (state) onwards.
fn parse_stat(line: &[u8]) -> Option<Stat> {
    let open = line.iter().position(|&b| b == b'(')?;
    let close = line.iter().rposition(|&b| b == b')')?;
    let comm = line.get(open + 1..close)?.to_vec();
    let rest = std::str::from_utf8(line.get(close + 1..)?).ok()?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 of proc(5).
    let field = |n: usize| fields.get(n - 3).copied();
    Some(Stat {
        comm,
        ppid: field(4)?.parse().ok()?,
        nice: field(19)?.parse().ok()?,
        start_ticks: field(22)?.parse().ok()?,
    })
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&hz| hz > 0).unwrap_or(100)
}

fn numeric_entries(dir: &Path) -> Vec<u32> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Records for the tasks in `/proc` now that pass the filters. Tasks that
/// end while they are read are left out.
fn scan_proc(args: &StartArgs, cgroups: &CgroupPaths) -> Vec<Event> {
    let hz = clock_ticks_per_second();
    let mut out = Vec::new();
    let mut ids: HashMap<String, u64> = HashMap::new();
    let tgids = if args.filter_tgid != 0 {
        vec![args.filter_tgid]
    } else {
        numeric_entries(Path::new("/proc"))
    };
    let self_tgid = if args.include_self { 0 } else { args.self_tgid };
    for tgid in tgids {
        if tgid == self_tgid {
            continue;
        }
        let proc_dir = PathBuf::from(format!("/proc/{tgid}"));
        // One byte more than kept, to know whether it was cut.
        let Some(mut cmdline) = read_prefix(&proc_dir.join("cmdline"), CMDLINE_LEN + 1) else {
            continue;
        };
        let truncated = cmdline.len() > CMDLINE_LEN;
        cmdline.truncate(CMDLINE_LEN);
        let tids = if args.filter_pid != 0 {
            vec![args.filter_pid]
        } else {
            numeric_entries(&proc_dir.join("task"))
        };
        for tid in tids {
            let task_dir = proc_dir.join("task").join(tid.to_string());
            let Some(stat) = read_prefix(&task_dir.join("stat"), 4096)
                .as_deref()
                .and_then(parse_stat)
            else {
                continue;
            };
            let cgroup_text = std::fs::read_to_string(task_dir.join("cgroup")).unwrap_or_default();
            let cgroup = sys::cgroup::cgroup2_path_in(&cgroup_text).unwrap_or("");
            let cgroup_id = *ids
                .entry(cgroup.to_owned())
                .or_insert_with(|| cgroups.id_of(cgroup));
            if args.filter_cgroup_id != 0 && cgroup_id != args.filter_cgroup_id {
                continue;
            }
            // SAFETY: an all-zero record is a valid one (integers and
            // byte arrays).
            let mut e: Event = unsafe { std::mem::zeroed() };
            e.ts_uptime_us = sys::clock::uptime_us();
            e.start_time_uptime_us = stat.start_ticks.saturating_mul(1_000_000) / hz;
            e.cgroup_id = cgroup_id;
            e.pid = tid;
            e.tgid = tgid;
            e.ppid = stat.ppid;
            e.nice = stat.nice;
            e.source = SOURCE_EXISTING;
            e.cmdline_truncated = u8::from(truncated);
            // comm is at most TASK_COMM_LEN - 1 bytes, as the BPF side reads it.
            let comm_len = stat.comm.len().min(e.name.len() - 1);
            set_c_chars(&mut e.name, &stat.comm[..comm_len]);
            set_c_chars(&mut e.cmdline, &cmdline);
            join_args(&mut e.cmdline);
            set_c_chars(&mut e.cgroup, cgroup.as_bytes());
            out.push(e);
        }
    }
    out
}

/// The text of a record's `char` field, for tests and messages.
pub fn text(field: &[i8]) -> String {
    String::from_utf8_lossy(&c_chars(field)).into_owned()
}

#[cfg(test)]
mod tests {
    use kernmlops_plugin_bpf::{
        sdk::{settings::parse, ColumnKind},
        BpfSpec,
    };

    use super::*;

    #[test]
    fn stat_fields_are_found_after_the_last_parenthesis() {
        let line = b"42 (a (b) c) S 7 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 25 5 1 0 12345 0 0";
        let stat = parse_stat(line).expect("parses");
        assert_eq!(
            stat,
            Stat {
                comm: b"a (b) c".to_vec(),
                ppid: 7,
                nice: 5,
                start_ticks: 12345,
            }
        );
        assert_eq!(parse_stat(b"42 (x) S"), None);
    }

    #[test]
    fn arguments_are_joined_by_spaces() {
        let mut buf = b"ls\0-l\0\0a b\0\0\0".map(|b| b as i8);
        join_args(&mut buf);
        assert_eq!(buf.map(|b| b as u8), *b"ls -l  a b\0\0\0");
        let mut empty = [0i8; 4];
        join_args(&mut empty);
        assert_eq!(empty, [0; 4]);
    }

    #[test]
    fn table_columns_match_the_header() {
        let tables = ProcessMetadata::tables();
        let t = &tables[0];
        assert_eq!(t.record_size as usize, std::mem::size_of::<Event>());
        let col = |n: &str| {
            t.columns
                .iter()
                .find(|c| c.name.as_str() == n)
                .unwrap_or_else(|| panic!("column {n}"))
        };
        assert_eq!(col("source").kind, ColumnKind::LABEL);
        let labels: Vec<&str> = col("source").labels.iter().map(|l| l.as_str()).collect();
        assert_eq!(labels, SOURCES);
        assert_eq!(col("nice").kind, ColumnKind::I32);
        assert_eq!(col("name").size as usize, field_size(|e: &Event| &e.name));
        assert_eq!(
            col("cgroup").size as usize,
            field_size(|e: &Event| &e.cgroup)
        );
        assert_eq!(col("cmdline_truncated").kind, ColumnKind::BOOL);
    }

    #[test]
    fn unknown_settings_are_refused_by_name() {
        let check = |json: &str| parse::<NoSettings>("[probes.process_metadata]", json);
        assert!(check("{}").is_ok());
        let e = check(r#"{"bogus":1}"#).expect_err("unknown key");
        assert!(e.message.contains("bogus"), "{e}");
    }

    #[test]
    fn the_proc_scan_makes_typed_records_of_this_process() {
        let args = kernmlops_plugin_bpf::sdk::StartArgs::new("{}")
            .with_filter_tgid(std::process::id())
            .with_self_tgid(0)
            .with_include_self(true);
        let rows = scan_proc(&args, &CgroupPaths::new());
        assert!(!rows.is_empty(), "this process has at least one thread");
        let me = &rows[0];
        assert_eq!(me.tgid, std::process::id());
        assert_eq!(me.source, SOURCE_EXISTING);
        assert!(
            text(&me.cmdline).contains("process_metadata"),
            "{}",
            text(&me.cmdline)
        );
        assert!(!text(&me.name).is_empty());
    }
}
