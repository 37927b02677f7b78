//! Arrow IPC file sinks: the only code that writes table files.
//!
//! Records are buffered raw and decoded into one record batch per flush.
//! A flush writes the batch and hands it to the kernel, so a crash or
//! SIGKILL loses at most one flush interval; the file then lacks its footer,
//! and [`repair`] rebuilds it from the complete batches before the cut.

use std::{
    fs::File,
    io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use arrow_array::RecordBatch;
use arrow_ipc::{
    reader::{FileReader, StreamReader},
    writer::FileWriter,
};
use arrow_schema::ArrowError;

use crate::decode::TableDecoder;

/// Errors of a sink, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Arrow { path: PathBuf, source: ArrowError },
}

/// Most rows in one record batch of a table file.
pub const BATCH_ROWS: usize = 64 * 1024;

/// When a sink flushes.
#[derive(Debug, Clone, Copy)]
pub struct FlushPolicy {
    pub interval: Duration,
    pub rows: u64,
}

impl Default for FlushPolicy {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            rows: 1 << 20,
        }
    }
}

/// One table's Arrow IPC file.
pub struct IpcSink {
    path: PathBuf,
    writer: FileWriter<BufWriter<File>>,
    decoder: TableDecoder,
    policy: FlushPolicy,
    pending: Vec<u8>,
    pending_rows: u64,
    last_flush: Instant,
    rows_written: u64,
    rows_rejected: u64,
    bytes_in: u64,
}

impl IpcSink {
    /// Creates `path` and writes the schema, so even a table with no rows
    /// is a readable file.
    pub fn create(
        path: &Path,
        decoder: TableDecoder,
        policy: FlushPolicy,
    ) -> Result<Self, SinkError> {
        let io = |source| SinkError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::create(path).map_err(io)?;
        let mut writer =
            FileWriter::try_new(BufWriter::with_capacity(1 << 20, file), &decoder.schema())
                .map_err(|source| SinkError::Arrow {
                    path: path.to_owned(),
                    source,
                })?;
        writer.flush().map_err(|source| SinkError::Arrow {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            path: path.to_owned(),
            writer,
            decoder,
            policy,
            pending: Vec::new(),
            pending_rows: 0,
            last_flush: Instant::now(),
            rows_written: 0,
            rows_rejected: 0,
            bytes_in: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn table(&self) -> &str {
        self.decoder.table()
    }

    /// Rows written to the file so far (flushed).
    pub fn rows_written(&self) -> u64 {
        self.rows_written
    }

    /// Rows accepted so far, flushed or not.
    pub fn rows_accepted(&self) -> u64 {
        self.rows_written + self.pending_rows
    }

    /// Records left out because their batch's size did not match the
    /// table's record size.
    pub fn rows_rejected(&self) -> u64 {
        self.rows_rejected
    }

    /// Accepts `data`, `records` whole records of this table, and flushes if
    /// due. A batch whose size is not `records` times the record size cannot
    /// be split into records safely: it is left out and counted in
    /// [`IpcSink::rows_rejected`], never padded or cut.
    pub fn push(&mut self, data: &[u8], records: u64) -> Result<(), SinkError> {
        let rs = self.decoder.record_size();
        if records.checked_mul(rs as u64) != Some(data.len() as u64) {
            self.rows_rejected += records.max(1);
            return Ok(());
        }
        self.pending.extend_from_slice(data);
        self.pending_rows += records;
        self.bytes_in += data.len() as u64;
        if self.pending_rows >= self.policy.rows
            || self.last_flush.elapsed() >= self.policy.interval
        {
            self.flush()?;
        }
        Ok(())
    }

    /// Decodes what is pending, writes it as one batch and hands it to the
    /// kernel.
    pub fn flush(&mut self) -> Result<(), SinkError> {
        self.last_flush = Instant::now();
        if self.pending_rows == 0 {
            return Ok(());
        }
        let arrow = |source| SinkError::Arrow {
            path: self.path.clone(),
            source,
        };
        // Cache-sized record batches: large ones cost page faults on every
        // fresh allocation and help no reader.
        let chunk = BATCH_ROWS * self.decoder.record_size();
        for records in self.pending.chunks(chunk) {
            let batch = self.decoder.decode(records).map_err(arrow)?;
            self.writer.write(&batch).map_err(arrow)?;
        }
        self.writer.flush().map_err(arrow)?;
        self.rows_written += self.pending_rows;
        self.pending.clear();
        self.pending_rows = 0;
        Ok(())
    }

    /// Flushes, writes the footer and syncs the file to disk.
    pub fn finish(mut self) -> Result<u64, SinkError> {
        self.flush()?;
        let path = self.path.clone();
        let arrow = |source| SinkError::Arrow {
            path: path.clone(),
            source,
        };
        self.writer.finish().map_err(arrow)?;
        let file = self
            .writer
            .into_inner()
            .map_err(arrow)?
            .into_inner()
            .map_err(|e| SinkError::Io {
                path: path.clone(),
                source: e.into_error(),
            })?;
        file.sync_all()
            .map_err(|source| SinkError::Io { path, source })?;
        Ok(self.rows_written)
    }
}

/// Writes a whole table in one go (used for `system_info`).
pub fn write_table(path: &Path, batch: &RecordBatch) -> Result<(), SinkError> {
    let arrow = |source| SinkError::Arrow {
        path: path.to_owned(),
        source,
    };
    let file = File::create(path).map_err(|source| SinkError::Io {
        path: path.to_owned(),
        source,
    })?;
    let mut w = FileWriter::try_new(BufWriter::new(file), &batch.schema()).map_err(arrow)?;
    w.write(batch).map_err(arrow)?;
    w.finish().map_err(arrow)?;
    Ok(())
}

/// What [`repair`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepairOutcome {
    /// The file was complete.
    Intact { rows: u64 },
    /// The file lacked its footer and was rebuilt from its complete batches.
    Repaired { rows: u64, batches: u64 },
}

/// Makes an Arrow IPC file readable again after a crash: an intact file is
/// left alone; one cut short is rebuilt from every complete record batch.
pub fn repair(path: &Path) -> Result<RepairOutcome, SinkError> {
    let io = |source| SinkError::Io {
        path: path.to_owned(),
        source,
    };
    let arrow = |source| SinkError::Arrow {
        path: path.to_owned(),
        source,
    };
    if let Ok(reader) = FileReader::try_new(File::open(path).map_err(io)?, None) {
        let mut rows = 0;
        let mut readable = true;
        for b in reader {
            match b {
                Ok(b) => rows += b.num_rows() as u64,
                Err(_) => readable = false,
            }
        }
        if readable {
            return Ok(RepairOutcome::Intact { rows });
        }
    }
    // The file format is magic ("ARROW1", zero-padded to the writer's
    // alignment), then the stream format, then the footer: read the stream
    // part up to the first incomplete message.
    let mut file = File::open(path).map_err(io)?;
    let mut head = [0u8; 64];
    let n = file.read(&mut head).map_err(io)?;
    if n < 6 || &head[..6] != b"ARROW1" {
        return Err(arrow(ArrowError::ParseError(
            "not an Arrow IPC file".into(),
        )));
    }
    let stream_start = (6..n).find(|&i| head[i] != 0).unwrap_or(n);
    file.seek(SeekFrom::Start(stream_start as u64))
        .map_err(io)?;
    let reader = StreamReader::try_new(BufReader::new(file), None).map_err(arrow)?;
    let schema = reader.schema();
    let batches: Vec<RecordBatch> = reader.map_while(Result::ok).collect();

    let tmp = path.with_extension("arrow.repairing");
    {
        let f = File::create(&tmp).map_err(io)?;
        let mut w = FileWriter::try_new(BufWriter::new(f), &schema).map_err(arrow)?;
        for b in &batches {
            w.write(b).map_err(arrow)?;
        }
        w.finish().map_err(arrow)?;
        let mut inner = w.into_inner().map_err(arrow)?;
        inner.flush().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)?;
    Ok(RepairOutcome::Repaired {
        rows: batches.iter().map(|b| b.num_rows() as u64).sum(),
        batches: batches.len() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernmlops_plugin_api::{ColumnDecl, ColumnKind, TableDecl};

    fn decoder() -> TableDecoder {
        let decl = TableDecl {
            name: "ticks".into(),
            description: "".into(),
            record_size: 8,
            columns: vec![ColumnDecl {
                name: "ts_uptime_us".into(),
                kind: ColumnKind::U64,
                offset: 0,
                size: 8,
                unit: "us".into(),
                description: "".into(),
                labels: vec![].into(),
            }]
            .into(),
        };
        TableDecoder::new(&decl, "test")
    }

    fn records(range: std::ops::Range<u64>) -> Vec<u8> {
        range.flat_map(|v| v.to_le_bytes()).collect()
    }

    fn tempdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kml-sink-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    #[test]
    fn empty_table_is_a_readable_file() {
        let dir = tempdir("empty");
        let path = dir.join("ticks.arrow");
        let sink = IpcSink::create(&path, decoder(), FlushPolicy::default()).expect("create");
        assert_eq!(sink.finish().expect("finish"), 0);
        assert_eq!(
            repair(&path).expect("read"),
            RepairOutcome::Intact { rows: 0 }
        );
    }

    #[test]
    fn repairs_a_file_cut_mid_batch() {
        let dir = tempdir("cut");
        let path = dir.join("ticks.arrow");
        let policy = FlushPolicy {
            interval: Duration::from_secs(3600),
            rows: 100,
        };
        let mut sink = IpcSink::create(&path, decoder(), policy).expect("create");
        for chunk in 0..5 {
            sink.push(&records(chunk * 100..(chunk + 1) * 100), 100)
                .expect("push");
        }
        // Simulate SIGKILL: no footer, and a torn last write.
        std::mem::forget(sink);
        let len = std::fs::metadata(&path).expect("stat").len();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        f.set_len(len - 20).expect("truncate");
        assert!(FileReader::try_new(File::open(&path).expect("open"), None).is_err());
        match repair(&path).expect("repair") {
            RepairOutcome::Repaired { rows, batches } => {
                assert_eq!((rows, batches), (400, 4), "the torn fifth batch is dropped");
            }
            other => panic!("expected a repair, got {other:?}"),
        }
        assert_eq!(
            repair(&path).expect("reread"),
            RepairOutcome::Intact { rows: 400 }
        );
    }
}
