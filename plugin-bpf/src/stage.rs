//! Staged output (`KML_STAGED` in `kml.bpf.h`): a program gathers records of
//! a high-rate table per CPU and sends them to the ring a batch at a time.
//! A CPU that goes quiet keeps a partial batch, so the host sends it: each
//! drain pass reads every CPU's stage header and runs the object's
//! `kml_flush` program on a CPU whose partial batch has waited
//! [`MAX_AGE`] without a full batch going out; stopping flushes every CPU.
//! A CPU taken offline cannot run the flush: when the probe stops, the host
//! reads its partial batches from the map instead (nothing can write them
//! any more), so they are not lost.

use std::{
    collections::BTreeSet,
    os::fd::{AsRawFd, OwnedFd},
    time::{Duration, Instant},
};

use kernmlops_plugin_sdk::{Error, Result};
use libbpf_rs::{MapCore, MapFlags, MapHandle};

/// The map of stage headers and the flush program in `kml.bpf.h`.
pub const HEAD_MAP: &str = "kml_stage_head";
pub const DATA_MAP: &str = "kml_stage_data";
pub const FLUSH_PROGRAM: &str = kernmlops_plugin_sdk::api::STAGE_FLUSH_PROGRAM;

/// How long a partial batch may wait on a quiet CPU before the host sends
/// it. With drain passes every `drain_interval` (100 ms), a staged record
/// reaches the ring within about two passes.
pub const MAX_AGE: Duration = Duration::from_millis(50);

/// The ring a staged table asks for on `cpus` possible CPUs with stages of
/// `stage_bytes`: every CPU's full batch together fit in a quarter of it
/// (its wake-up threshold), since a drain pass may send every CPU's batch
/// before it consumes; a power of two, at most 16 MiB (past that,
/// [`batch_bytes_for_ring`] makes the batches smaller).
pub fn ring_bytes_for_stages(cpus: u64, stage_bytes: u64) -> u64 {
    cpus.max(1)
        .saturating_mul(stage_bytes)
        .saturating_mul(4)
        .min(16 << 20)
        .next_power_of_two()
}

/// The batch size (`kml_stage_limit`) of a staged table with a ring of
/// `ring_bytes`: every CPU's batch together fit in a quarter of the ring,
/// in whole records, at least one record and at most the stage.
pub fn batch_bytes_for_ring(ring_bytes: u64, cpus: u64, stage_bytes: u64, record_size: u64) -> u32 {
    let record = record_size.max(1);
    let share = ring_bytes / cpus.max(1) / 4 / record * record;
    u32::try_from(share.clamp(record, stage_bytes.max(record))).unwrap_or(u32::MAX)
}

/// `struct kml_stage_head`: busy (u32), staged bytes (u32), batches sent (u64).
const HEAD_SIZE: usize = 16;

/// What the host last saw of one CPU's stage of one table.
#[derive(Clone, Copy, Default)]
struct Seen {
    batches: u64,
    /// When a partial batch was first seen with this `batches` count.
    pending_since: Option<Instant>,
}

/// The staging of one loaded probe.
pub struct Stages {
    head: MapHandle,
    data: MapHandle,
    flush: OwnedFd,
    /// Record size of each table.
    record_sizes: Vec<usize>,
    /// Per table, per possible CPU.
    seen: Vec<Vec<Seen>>,
    /// CPUs found offline (the flush cannot run there).
    offline: BTreeSet<usize>,
    /// Per table, records read from offline CPUs' stages at the stop, for
    /// the last drain.
    leftover: Vec<Vec<u8>>,
}

/// One CPU's header: staged bytes and batches sent.
fn parse_head(value: &[u8]) -> Option<(u32, u64)> {
    let head = value.get(..HEAD_SIZE)?;
    let len = u32::from_ne_bytes(head[4..8].try_into().ok()?);
    let batches = u64::from_ne_bytes(head[8..16].try_into().ok()?);
    Some((len, batches))
}

impl Stages {
    pub fn new(head: MapHandle, data: MapHandle, flush: OwnedFd, record_sizes: Vec<usize>) -> Self {
        let tables = record_sizes.len();
        Self {
            head,
            data,
            flush,
            record_sizes,
            seen: vec![Vec::new(); tables],
            offline: BTreeSet::new(),
            leftover: vec![Vec::new(); tables],
        }
    }

    fn tables(&self) -> u32 {
        u32::try_from(self.record_sizes.len()).unwrap_or(u32::MAX)
    }

    /// Per table, each CPU's (staged bytes, batches sent).
    fn heads(&self) -> Result<Vec<Vec<(u32, u64)>>> {
        (0..self.tables())
            .map(|table| {
                let per_cpu = self
                    .head
                    .lookup_percpu(&table.to_ne_bytes(), MapFlags::ANY)
                    .map_err(|e| Error::new(format!("reading {HEAD_MAP}: {e}")))?
                    .unwrap_or_default();
                Ok(per_cpu
                    .iter()
                    .map(|v| parse_head(v).unwrap_or_default())
                    .collect())
            })
            .collect()
    }

    /// Runs the flush program on `cpu`, noting it when the CPU is offline.
    fn flush_cpu(&mut self, cpu: usize) -> Result<()> {
        let mut opts = libbpf_rs::libbpf_sys::bpf_test_run_opts {
            sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_test_run_opts>() as _,
            flags: libbpf_rs::libbpf_sys::BPF_F_TEST_RUN_ON_CPU,
            cpu: u32::try_from(cpu).unwrap_or(u32::MAX),
            ..Default::default()
        };
        // SAFETY: `opts` is a valid bpf_test_run_opts with no buffers, and
        // `flush` is the fd of a loaded raw_tp program.
        let rc = unsafe {
            libbpf_rs::libbpf_sys::bpf_prog_test_run_opts(self.flush.as_raw_fd(), &mut opts)
        };
        if rc == -libc::ENXIO {
            self.offline.insert(cpu);
            return Ok(());
        }
        self.offline.remove(&cpu);
        if rc < 0 {
            return Err(Error::new(format!(
                "sending the staged records of CPU {cpu}: {}",
                std::io::Error::from_raw_os_error(-rc)
            )));
        }
        Ok(())
    }

    /// Sends the partial batches that have waited [`MAX_AGE`] on CPUs that
    /// sent no full batch meanwhile.
    pub fn flush_stale(&mut self) -> Result<()> {
        let now = Instant::now();
        let heads = self.heads()?;
        let mut due = Vec::new();
        for (seen, heads) in self.seen.iter_mut().zip(&heads) {
            seen.resize(heads.len(), Seen::default());
            for (cpu, (seen, &(len, batches))) in seen.iter_mut().zip(heads).enumerate() {
                if len == 0 {
                    *seen = Seen {
                        batches,
                        pending_since: None,
                    };
                    continue;
                }
                match seen.pending_since {
                    Some(since) if seen.batches == batches => {
                        if now.duration_since(since) >= MAX_AGE {
                            due.push(cpu);
                            seen.pending_since = None;
                        }
                    }
                    _ => {
                        *seen = Seen {
                            batches,
                            pending_since: Some(now),
                        }
                    }
                }
            }
        }
        due.sort_unstable();
        due.dedup();
        for cpu in due {
            self.flush_cpu(cpu)?;
        }
        Ok(())
    }

    /// Sends every CPU's partial batches (after the programs are detached).
    /// A stage held by a program still finishing is tried again briefly;
    /// an offline CPU's stage is read from the map.
    pub fn flush_all(&mut self) -> Result<()> {
        for attempt in 0..5 {
            let heads = self.heads()?;
            let mut pending: Vec<usize> = heads
                .iter()
                .flat_map(|h| h.iter().enumerate().filter(|(_, (len, _))| *len > 0))
                .map(|(cpu, _)| cpu)
                .filter(|cpu| !self.offline.contains(cpu))
                .collect();
            if pending.is_empty() {
                break;
            }
            pending.sort_unstable();
            pending.dedup();
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            for cpu in pending {
                self.flush_cpu(cpu)?;
            }
        }
        self.read_offline()
    }

    /// Takes the staged records of offline CPUs from the map.
    fn read_offline(&mut self) -> Result<()> {
        if self.offline.is_empty() {
            return Ok(());
        }
        let heads = self.heads()?;
        for (table, heads) in heads.iter().enumerate() {
            let size = self.record_sizes[table];
            let key = u32::try_from(table).unwrap_or(u32::MAX).to_ne_bytes();
            let data = self
                .data
                .lookup_percpu(&key, MapFlags::ANY)
                .map_err(|e| Error::new(format!("reading {DATA_MAP}: {e}")))?
                .unwrap_or_default();
            for &cpu in &self.offline {
                let len = heads.get(cpu).map_or(0, |h| h.0 as usize);
                if let Some(bytes) = data.get(cpu).and_then(|d| d.get(..len)) {
                    if size > 0 && len % size == 0 {
                        self.leftover[table].extend_from_slice(bytes);
                    }
                }
            }
        }
        Ok(())
    }

    /// The records of `table` read from offline CPUs at the stop.
    pub fn take_leftover(&mut self, table: usize) -> Vec<u8> {
        self.leftover
            .get_mut(table)
            .map(std::mem::take)
            .unwrap_or_default()
    }
}

/// [`Stages::flush_all`] for a probe whose records may not be staged
/// (`None`: nothing to send).
pub fn flush_all(stages: Option<&mut Stages>) -> Result<()> {
    stages.map_or(Ok(()), Stages::flush_all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staged_ring_holds_every_cpus_batch_in_a_quarter() {
        assert_eq!(ring_bytes_for_stages(2, 8192), 64 << 10);
        assert_eq!(ring_bytes_for_stages(384, 8192), 16 << 20);
        assert_eq!(ring_bytes_for_stages(0, 8192), 32 << 10);
        assert_eq!(ring_bytes_for_stages(1 << 20, 8192), 16 << 20);
    }

    #[test]
    fn a_small_ring_gets_batches_it_can_hold() {
        // 16 KiB ring, 2 CPUs, 32-byte records: 2 KiB batches.
        assert_eq!(batch_bytes_for_ring(16 << 10, 2, 8192, 32), 2048);
        // Whole records only.
        assert_eq!(batch_bytes_for_ring(16 << 10, 2, 8192, 48), 2016);
        // 16 MiB ring, 1024 CPUs: 4 KiB batches.
        assert_eq!(batch_bytes_for_ring(16 << 20, 1024, 8192, 32), 4096);
        // At least one record, however many CPUs.
        assert_eq!(batch_bytes_for_ring(16 << 10, 4096, 8192, 48), 48);
        // Never past the stage.
        assert_eq!(batch_bytes_for_ring(1 << 30, 2, 8192, 32), 8192);
    }

    #[test]
    fn parses_a_stage_header() {
        let mut v = vec![0u8; HEAD_SIZE + 8];
        v[4..8].copy_from_slice(&96u32.to_ne_bytes());
        v[8..16].copy_from_slice(&7u64.to_ne_bytes());
        assert_eq!(parse_head(&v), Some((96, 7)));
        assert_eq!(parse_head(&v[..8]), None);
    }
}
