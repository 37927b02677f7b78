//! What collecting cost, measured in every run: the kernel's run-time
//! statistics of every BPF program (turned on for the run and restored
//! after), the host's own CPU time and peak memory, and the cost per event
//! per probe. It goes into the manifest (`collector_overhead`), the
//! `collector_overhead` table and one line of the run's summary, so a
//! researcher can discard runs the collector disturbed.

use std::{os::fd::OwnedFd, sync::Arc, time::Instant};

use arrow_array::{ArrayRef, Float64Array, RecordBatch, StringArray, UInt64Array};
use kernmlops_plugin_api::BpfProgramStats;

pub use crate::manifest::{CollectorOverhead, ProbeCost, ProgramCost};
use crate::{
    decode::{self, HostColumn},
    manifest::per_event,
};

/// The table the figures go to.
pub const TABLE: &str = "collector_overhead";

/// The host's own resources since it started (`RUSAGE_SELF`).
#[derive(Debug, Clone, Copy, Default)]
struct SelfUsage {
    user_s: f64,
    system_s: f64,
    max_rss_bytes: u64,
}

impl SelfUsage {
    fn now() -> Self {
        // SAFETY: rusage is plain old data, filled by the call.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: a valid, writable rusage.
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Self {
            user_s: secs(ru.ru_utime),
            system_s: secs(ru.ru_stime),
            max_rss_bytes: u64::try_from(ru.ru_maxrss).unwrap_or(0) * 1024,
        }
    }
}

/// Measures a run: created before the probes attach, finished once their
/// threads have ended.
pub(super) struct CostMeter {
    /// Keeps the kernel's BPF statistics on while open; why not otherwise.
    stats: Result<OwnedFd, String>,
    started: Instant,
    usage: SelfUsage,
}

impl CostMeter {
    pub fn start() -> Self {
        Self {
            stats: kernmlops_sys::features::enable_bpf_stats().map_err(|e| e.to_string()),
            started: Instant::now(),
            usage: SelfUsage::now(),
        }
    }

    /// The run's cost, from each probe's program statistics and the rows
    /// written. Closes the statistics descriptor, which turns them back off.
    pub fn finish(self, probes: &[(String, Vec<BpfProgramStats>)], rows: u64) -> CollectorOverhead {
        let wall_s = self.started.elapsed().as_secs_f64();
        let now = SelfUsage::now();
        let bpf_stats = match &self.stats {
            Ok(_) => "enabled".to_owned(),
            Err(e) => {
                format!("could not be enabled ({e}): BPF program counts and times are missing")
            }
        };
        drop(self.stats);
        let mut programs = Vec::new();
        let mut per_probe = Vec::new();
        for (probe, stats) in probes {
            let (mut events, mut ns) = (0u64, 0u64);
            for s in stats {
                // The host runs a staged probe's flush program: its time is
                // the probe's cost, its runs are not events.
                if s.name.as_str() != kernmlops_plugin_api::STAGE_FLUSH_PROGRAM {
                    events += s.run_cnt;
                }
                ns += s.run_time_ns;
                programs.push(ProgramCost {
                    probe: probe.clone(),
                    program: s.name.to_string(),
                    events: s.run_cnt,
                    kernel_time_ns: s.run_time_ns,
                    ns_per_event: per_event(s.run_time_ns, s.run_cnt),
                });
            }
            if !stats.is_empty() {
                per_probe.push(ProbeCost {
                    probe: probe.clone(),
                    events,
                    kernel_time_ns: ns,
                    ns_per_event: per_event(ns, events),
                });
            }
        }
        let user_s = now.user_s - self.usage.user_s;
        let system_s = now.system_s - self.usage.system_s;
        CollectorOverhead {
            bpf_stats,
            wall_s,
            user_cpu_s: user_s,
            system_cpu_s: system_s,
            user_cpu_percent: if wall_s > 0.0 {
                100.0 * user_s / wall_s
            } else {
                0.0
            },
            peak_rss_bytes: now.max_rss_bytes,
            rows_written: rows,
            probes: per_probe,
            programs,
        }
    }
}

impl CollectorOverhead {
    /// The `collector_overhead` table: one row per BPF program and one for
    /// the host's user space.
    pub fn to_batch(
        &self,
        collection_id: &str,
        end_uptime_us: u64,
    ) -> Result<RecordBatch, arrow_schema::ArrowError> {
        let mut component = Vec::new();
        let mut program = Vec::new();
        let mut events = Vec::new();
        let mut kernel_ns = Vec::new();
        let mut user_ns = Vec::new();
        let mut per = Vec::new();
        let mut rss = Vec::new();
        for p in &self.programs {
            component.push(p.probe.clone());
            program.push(p.program.clone());
            events.push(p.events);
            kernel_ns.push(p.kernel_time_ns);
            user_ns.push(0u64);
            per.push(p.ns_per_event);
            rss.push(None);
        }
        component.push("host".to_owned());
        program.push("user_space".to_owned());
        events.push(self.rows_written);
        kernel_ns.push((self.system_cpu_s * 1e9) as u64);
        user_ns.push((self.user_cpu_s * 1e9) as u64);
        per.push(per_event(
            ((self.user_cpu_s + self.system_cpu_s) * 1e9) as u64,
            self.rows_written,
        ));
        rss.push(Some(self.peak_rss_bytes));
        let n = component.len();
        let col = HostColumn::new;
        decode::host_table(
            TABLE,
            "What collecting cost: one row per BPF program (kernel run time) and one for the host",
            collection_id,
            vec![
                col(
                    "ts_uptime_us",
                    "us",
                    "when the run ended (CLOCK_BOOTTIME)",
                    Arc::new(UInt64Array::from(vec![end_uptime_us; n])) as ArrayRef,
                ),
                col(
                    "component",
                    "",
                    "the probe whose BPF program this is, or host",
                    Arc::new(StringArray::from(component)),
                ),
                col(
                    "program",
                    "",
                    "the BPF program, or user_space for the host's own threads",
                    Arc::new(StringArray::from(program)),
                ),
                col(
                    "events",
                    "count",
                    "times the program ran; for the host, rows written",
                    Arc::new(UInt64Array::from(events)),
                ),
                col(
                    "kernel_time_ns",
                    "ns",
                    "time in the kernel: the program's run time, or the host's system CPU time",
                    Arc::new(UInt64Array::from(kernel_ns)),
                ),
                col(
                    "user_time_ns",
                    "ns",
                    "the host's user CPU time (0 for BPF programs)",
                    Arc::new(UInt64Array::from(user_ns)),
                ),
                col(
                    "ns_per_event",
                    "ns",
                    "time per event (per row for the host); null without events",
                    Arc::new(Float64Array::from(per)),
                )
                .nullable(),
                col(
                    "peak_rss_bytes",
                    "bytes",
                    "the host's largest resident set (host row only)",
                    Arc::new(UInt64Array::from(rss)),
                )
                .nullable(),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_event_cost_and_the_table() {
        let meter = CostMeter {
            stats: Err("test".into()),
            started: Instant::now(),
            usage: SelfUsage::default(),
        };
        let stats = vec![
            BpfProgramStats {
                name: "handle_sched_switch".into(),
                id: 7,
                run_cnt: 1000,
                run_time_ns: 140_000,
            },
            // Runs of the flush program are not events; its time counts.
            BpfProgramStats {
                name: "kml_flush".into(),
                id: 8,
                run_cnt: 10,
                run_time_ns: 10_000,
            },
        ];
        let o = meter.finish(&[("quanta_runtime".into(), stats)], 42);
        assert_eq!(o.probes[0].ns_per_event, Some(150.0));
        assert!(o.bpf_stats.starts_with("could not be enabled (test)"));
        assert!(
            o.summary()
                .contains("0.15 us/event in kernel (1000 events)"),
            "{}",
            o.summary()
        );
        let b = o.to_batch("c1", 5).expect("batch");
        assert_eq!(b.num_rows(), 3);
        let schema = b.schema();
        let unit = |n: &str| {
            schema
                .field_with_name(n)
                .expect("column")
                .metadata()
                .get("unit")
                .cloned()
                .unwrap_or_default()
        };
        assert_eq!(unit("kernel_time_ns"), "ns");
        assert_eq!(unit("ts_uptime_us"), "us");
    }
}
