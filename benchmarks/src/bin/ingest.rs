//! Host ingest benchmark: decode + route + Arrow IPC write of 48-byte
//! records on one core, the path every probe's data takes.
//!
//! `cargo run --release -p kernmlops-benchmarks --bin ingest [RECORDS] [DIR] [REPS]`
//!
//! Prints one JSON object with the median and the slowest of REPS runs (5).
//! DIR defaults to /dev/shm, so the figure is the host's cost and not the
//! disk's; pass a disk folder to include it.

use std::{path::PathBuf, time::Instant};

use anyhow::Context;
use kernmlops::{
    decode::TableDecoder,
    sink::{FlushPolicy, IpcSink},
};
use kernmlops_benchmarks::{cpu_seconds, median, Args};
use kernmlops_plugin_api::{ColumnDecl, ColumnKind, TableDecl};

const RECORD: usize = 48;
/// Records per drain, as a probe thread hands them over.
const DRAIN: usize = 65_536;

fn decl() -> TableDecl {
    let col = ColumnDecl::new;
    TableDecl {
        name: "bench".into(),
        description: "48-byte benchmark records".into(),
        record_size: RECORD as u32,
        columns: vec![
            col("ts_uptime_us", ColumnKind::U64, 0, 8),
            col("value_a", ColumnKind::U64, 8, 8),
            col("value_b", ColumnKind::U64, 16, 8),
            col("cpu", ColumnKind::U32, 24, 4),
            col("pid", ColumnKind::U32, 28, 4),
            col("tgid", ColumnKind::U32, 32, 4),
            col("flags", ColumnKind::U32, 36, 4),
            col("value_c", ColumnKind::I64, 40, 8),
        ]
        .into(),
    }
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::from_env();
    let records: usize = args.next_or(20_000_000).context("RECORDS")?;
    let dir: PathBuf = args.next_or("/dev/shm".into())?;
    let reps: usize = args.next_or(5).context("REPS")?;
    // As the host does at start-up.
    kernmlops::tune_allocator();
    let decl = decl();
    kernmlops_plugin_api::spec::validate_table(&decl)?;

    // One drain's worth of realistic records, reused.
    let mut drain = Vec::with_capacity(DRAIN * RECORD);
    for i in 0..DRAIN as u64 {
        drain.extend_from_slice(&(1_000_000 + i * 3).to_le_bytes());
        drain.extend_from_slice(&(i * 7).to_le_bytes());
        drain.extend_from_slice(&(i ^ 0x5555).to_le_bytes());
        drain.extend_from_slice(&((i % 2) as u32).to_le_bytes());
        drain.extend_from_slice(&(1000 + (i % 64) as u32).to_le_bytes());
        drain.extend_from_slice(&(1000 + (i % 16) as u32).to_le_bytes());
        drain.extend_from_slice(&0u32.to_le_bytes());
        drain.extend_from_slice(&(-(i as i64)).to_le_bytes());
    }

    // Decode alone.
    let decoder = TableDecoder::new(&decl, "bench");
    let t = Instant::now();
    let mut decoded = 0usize;
    while decoded < records {
        decoded += decoder.decode(&drain)?.num_rows();
    }
    let decode_rate = decoded as f64 / t.elapsed().as_secs_f64();

    // Decode + route + write, with the default flush policy.
    let mut rates = Vec::new();
    let mut cpu_rates = Vec::new();
    let mut bytes = 0;
    let mut rows = 0;
    for rep in 0..reps {
        let path = dir.join(format!("kml-ingest-{}-{rep}.arrow", std::process::id()));
        let cpu0 = cpu_seconds();
        let t = Instant::now();
        let mut sink = IpcSink::create(
            &path,
            TableDecoder::new(&decl, "bench"),
            FlushPolicy::default(),
        )?;
        let mut pushed = 0usize;
        while pushed < records {
            sink.push(&drain, DRAIN as u64)?;
            pushed += DRAIN;
        }
        let (written, finished) = sink.finish();
        finished?;
        rows = written;
        let wall = t.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu0;
        bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let _ = std::fs::remove_file(&path);
        rates.push(rows as f64 / wall);
        cpu_rates.push(rows as f64 / cpu);
    }
    let slowest = rates.iter().copied().fold(f64::INFINITY, f64::min);

    println!(
        "{}",
        serde_json::json!({
            "benchmark": "ingest",
            "record_bytes": RECORD,
            "records": rows,
            "decode_records_per_s": decode_rate.round(),
            "reps": reps,
            "dir": dir.display().to_string(),
            "ingest_records_per_s_median": median(&mut rates).round(),
            "ingest_records_per_s_slowest": slowest.round(),
            "ingest_records_per_cpu_s_median": median(&mut cpu_rates).round(),
            "file_mb": bytes as f64 / 1e6,
        })
    );
    Ok(())
}
