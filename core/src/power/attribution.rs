//! Energy attributed to processes: a slot's energy of one scope is split
//! into an active part, in proportion to the CPUs' busy time over all their
//! time (busy + idle, both from the kernel), and idle; the active part goes
//! to processes in proportion to their on-CPU time. Idle energy is never
//! given to a process.
//!
//! Everything is in integers, and the split is exact: per slot and scope,
//! the processes' energy plus idle is the scope's energy to the microjoule
//! (largest remainders, so no microjoule is lost or made up by rounding).

use std::collections::BTreeMap;

use kernmlops_plugin_api::{ColumnKind, PluginError, TableDecl};

use super::CPU_TIME_PROBE;

/// Why energy cannot be attributed to processes in this run.
#[derive(Debug, thiserror::Error)]
pub enum AttributionError {
    #[error("no {CPU_TIME_PROBE} probe is installed (it ships as plugins/{CPU_TIME_PROBE})")]
    NotInstalled,
    #[error("the {CPU_TIME_PROBE} probe could not start: {0}")]
    Start(PluginError),
    #[error("the {CPU_TIME_PROBE} probe fills no table")]
    NoTable,
    #[error("table {table} has no {kind} column {column}")]
    NoColumn {
        table: String,
        kind: &'static str,
        column: String,
    },
}

/// One process's on-CPU time in a slot, with its names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessTime {
    pub tgid: u32,
    pub comm: String,
    pub cgroup_id: u64,
    pub cgroup: String,
    pub cpu_time_us: u64,
}

/// What ran in a slot: the processes (tgid order) and the CPUs' idle time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Activity {
    pub processes: Vec<ProcessTime>,
    pub idle_us: u64,
}

impl Activity {
    pub fn busy_us(&self) -> u64 {
        self.processes.iter().map(|p| p.cpu_time_us).sum()
    }
}

/// Splits `energy_uj` into one part per entry of `cpu_us` and an idle
/// part: the active energy is `energy * busy / (busy + idle)` (rounded
/// down), shared in proportion to `cpu_us` by largest remainders (ties to
/// the earlier entry); idle is the rest. The parts add up to `energy_uj`
/// exactly.
pub fn split_slot(energy_uj: u64, cpu_us: &[u64], idle_us: u64) -> (Vec<u64>, u64) {
    let busy: u128 = cpu_us.iter().map(|&c| u128::from(c)).sum();
    let all = busy + u128::from(idle_us);
    let energy = u128::from(energy_uj);
    let active = (energy * busy).checked_div(all).unwrap_or(0);
    let mut parts: Vec<u64> = Vec::with_capacity(cpu_us.len());
    let mut remainders: Vec<(u128, usize)> = Vec::with_capacity(cpu_us.len());
    let mut given: u128 = 0;
    for (i, &c) in cpu_us.iter().enumerate() {
        let exact = active * u128::from(c);
        let part = exact.checked_div(busy).unwrap_or(0);
        remainders.push((exact.checked_rem(busy).unwrap_or(0), i));
        given += part;
        // part <= active <= energy_uj, so it fits.
        parts.push(u64::try_from(part).unwrap_or(u64::MAX));
    }
    // Largest remainders first; each gets one microjoule until the active
    // energy is given out (fewer than one per entry are left).
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let left = active - given;
    for &(_, i) in remainders
        .iter()
        .take(usize::try_from(left).unwrap_or(usize::MAX))
    {
        parts[i] += 1;
    }
    let idle = energy_uj - u64::try_from(active).unwrap_or(energy_uj);
    (parts, idle)
}

/// Reads the `cpu_time` probe's rows by their declared columns.
#[derive(Debug, Clone)]
pub struct CpuTimeReader {
    record_size: usize,
    tgid: (usize, usize),
    comm: (usize, usize),
    cgroup_id: (usize, usize),
    cgroup: (usize, usize),
    cpu_time_us: (usize, usize),
}

impl CpuTimeReader {
    /// Finds the columns in the probe's table: `tgid` (u32), `comm` and
    /// `cgroup` (text), `cgroup_id` and `cpu_time_us` (u64).
    pub fn new(table: &TableDecl) -> Result<Self, AttributionError> {
        let find = |name: &str, kind: ColumnKind| {
            table
                .columns
                .iter()
                .find(|c| c.name.as_str() == name && c.kind == kind)
                .map(|c| (c.offset as usize, c.size as usize))
                .ok_or_else(|| AttributionError::NoColumn {
                    table: table.name.to_string(),
                    kind: kind.name().unwrap_or("?"),
                    column: name.to_owned(),
                })
        };
        Ok(Self {
            record_size: table.record_size as usize,
            tgid: find("tgid", ColumnKind::U32)?,
            comm: find("comm", ColumnKind::STR)?,
            cgroup_id: find("cgroup_id", ColumnKind::U64)?,
            cgroup: find("cgroup", ColumnKind::STR)?,
            cpu_time_us: find("cpu_time_us", ColumnKind::U64)?,
        })
    }

    /// The activity in `data` (whole records): times added per process,
    /// tgid 0 as idle.
    pub fn read(&self, data: &[u8]) -> Activity {
        let mut by_tgid: BTreeMap<u32, ProcessTime> = BTreeMap::new();
        let mut idle_us = 0u64;
        for r in data.chunks_exact(self.record_size.max(1)) {
            let int = |(off, size): (usize, usize)| {
                let mut b = [0u8; 8];
                b[..size.min(8)].copy_from_slice(&r[off..off + size.min(8)]);
                u64::from_le_bytes(b)
            };
            let text = |(off, size): (usize, usize)| {
                let s = &r[off..off + size];
                let end = s.iter().position(|&b| b == 0).unwrap_or(size);
                String::from_utf8_lossy(&s[..end]).into_owned()
            };
            let tgid = int(self.tgid) as u32;
            let cpu = int(self.cpu_time_us);
            if tgid == 0 {
                idle_us += cpu;
                continue;
            }
            let p = by_tgid.entry(tgid).or_insert_with(|| ProcessTime {
                tgid,
                comm: String::new(),
                cgroup_id: 0,
                cgroup: String::new(),
                cpu_time_us: 0,
            });
            p.comm = text(self.comm);
            p.cgroup_id = int(self.cgroup_id);
            p.cgroup = text(self.cgroup);
            p.cpu_time_us += cpu;
        }
        Activity {
            processes: by_tgid.into_values().collect(),
            idle_us,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator, so the property test needs no crate.
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self, below: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % below.max(1)
        }
    }

    #[test]
    fn the_parts_add_up_to_the_energy_exactly() {
        let mut rng = Lcg(7);
        for _ in 0..20_000 {
            let n = rng.next(12) as usize;
            let cpu: Vec<u64> = (0..n)
                .map(|_| match rng.next(4) {
                    0 => 0,
                    1 => rng.next(10),
                    _ => rng.next(2_000_000),
                })
                .collect();
            let idle = if rng.next(3) == 0 {
                0
            } else {
                rng.next(4_000_000)
            };
            let energy = match rng.next(4) {
                0 => rng.next(10),
                1 => u64::MAX / 4 + rng.next(1 << 40),
                _ => rng.next(100_000_000),
            };
            let (parts, idle_uj) = split_slot(energy, &cpu, idle);
            let total: u128 =
                parts.iter().map(|&p| u128::from(p)).sum::<u128>() + u128::from(idle_uj);
            assert_eq!(total, u128::from(energy), "cpu {cpu:?} idle {idle}");
            for (p, c) in parts.iter().zip(&cpu) {
                if *c == 0 {
                    assert_eq!(*p, 0, "no CPU time, no energy");
                }
            }
        }
    }

    #[test]
    fn shares_follow_cpu_time_and_idle_keeps_the_rest() {
        // Half the CPU time busy: half the energy to processes, 3:1.
        let (parts, idle) = split_slot(1000, &[300, 100], 400);
        assert_eq!((parts, idle), (vec![375, 125], 500));
        // Largest remainder: 100 uJ over three equal processes.
        let (parts, idle) = split_slot(100, &[1, 1, 1], 0);
        assert_eq!((parts, idle), (vec![34, 33, 33], 0));
        // No activity measured: everything is idle.
        assert_eq!(split_slot(50, &[], 0), (vec![], 50));
        assert_eq!(split_slot(50, &[0, 0], 10), (vec![0, 0], 50));
    }

    #[test]
    fn rows_are_read_by_their_declared_columns() {
        let t = kernmlops_plugin_api::TableDecl {
            name: "cpu_time".into(),
            description: "".into(),
            record_size: 40,
            columns: [
                ("tgid", ColumnKind::U32, 0, 4),
                ("cpu_time_us", ColumnKind::U64, 4, 8),
                ("cgroup_id", ColumnKind::U64, 12, 8),
                ("comm", ColumnKind::STR, 20, 12),
                ("cgroup", ColumnKind::STR, 32, 8),
            ]
            .into_iter()
            .map(|(n, k, o, s)| kernmlops_plugin_api::ColumnDecl {
                name: n.into(),
                kind: k,
                offset: o,
                size: s,
                unit: "".into(),
                description: "".into(),
                labels: Default::default(),
            })
            .collect(),
        };
        let reader = CpuTimeReader::new(&t).expect("columns");
        let row = |tgid: u32, cpu: u64, comm: &str| {
            let mut r = vec![0u8; 40];
            r[0..4].copy_from_slice(&tgid.to_le_bytes());
            r[4..12].copy_from_slice(&cpu.to_le_bytes());
            r[12..20].copy_from_slice(&9u64.to_le_bytes());
            r[20..20 + comm.len()].copy_from_slice(comm.as_bytes());
            r[32..34].copy_from_slice(b"/a");
            r
        };
        let data = [
            row(5, 10, "sh"),
            row(0, 70, "idle"),
            row(5, 5, "sh"),
            row(3, 1, "x"),
        ]
        .concat();
        let a = reader.read(&data);
        assert_eq!(a.idle_us, 70);
        assert_eq!(a.busy_us(), 16);
        assert_eq!(a.processes[0].tgid, 3);
        assert_eq!(a.processes[1].cpu_time_us, 15);
        assert_eq!(a.processes[1].comm, "sh");
        assert_eq!(a.processes[1].cgroup, "/a");
        let mut missing = t.clone();
        missing.columns.truncate(2);
        assert_eq!(
            CpuTimeReader::new(&missing)
                .expect_err("no comm")
                .to_string(),
            "table cpu_time has no str column comm"
        );
    }
}
