//! Arrow IPC file sinks: the only code that writes table files.
//!
//! Records are buffered raw and decoded into one record batch per flush.
//! A flush writes the batch and hands it to the kernel no later than one
//! flush interval after its oldest row arrived, whether or not more rows
//! follow, so a crash or SIGKILL loses at most that much; the file then
//! lacks its footer, and [`repair`] appends one in place.
//!
//! A write error (a full disk) poisons the sink: nothing more is written,
//! the torn bytes are cut off at once (freeing their space for the other
//! tables' footers), and [`IpcSink::finish`] closes the file at its last
//! complete batch, readable when the footer fits.

use std::{
    fs::File,
    io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write},
    os::{fd::AsRawFd, unix::fs::FileExt},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use arrow_array::RecordBatch;
use arrow_ipc::{
    convert::{try_fb_to_schema, IpcSchemaEncoder},
    reader::{FileReader, StreamReader},
    root_as_message,
    writer::{DictionaryTracker, FileWriter},
    Block, FooterBuilder, MessageHeader, MetadataVersion,
};
use arrow_schema::{ArrowError, Schema};

use crate::{decode::TableDecoder, files};

/// Errors of a sink or a repair, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {}", arrow_message(source))]
    Arrow { path: PathBuf, source: ArrowError },
    /// Not an Arrow IPC file (empty, cut before its schema, or another
    /// format): nothing in it can be recovered.
    #[error("{path}: {reason}")]
    NotArrow { path: PathBuf, reason: String },
    /// Appending the footer needs more free space than there is.
    #[error("{path}: closing it needs {needed} bytes free on its file system, which has {available}; free some space and run `kernmlops repair` again")]
    NoSpace {
        path: PathBuf,
        needed: u64,
        available: u64,
    },
}

impl SinkError {
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Self::Io {
            path: path.to_owned(),
            source,
        }
    }

    fn arrow(path: &Path) -> impl FnOnce(ArrowError) -> Self + '_ {
        move |source| Self::Arrow {
            path: path.to_owned(),
            source,
        }
    }

    /// True when the file system is full (or the quota reached).
    pub fn is_out_of_space(&self) -> bool {
        let io = match self {
            Self::NoSpace { .. } => return true,
            Self::Io { source, .. } => Some(source),
            Self::Arrow {
                source: ArrowError::IoError(_, e),
                ..
            } => Some(e),
            _ => None,
        };
        io.and_then(std::io::Error::raw_os_error)
            .is_some_and(|c| c == libc::ENOSPC || c == libc::EDQUOT)
    }
}

/// An Arrow error as a reader wants it: an I/O error as the system's own
/// words (`No space left on device`), without Arrow's `Io error:`.
fn arrow_message(e: &ArrowError) -> String {
    match e {
        ArrowError::IoError(_, io) => io.to_string(),
        other => other.to_string(),
    }
}

/// Most rows in one record batch of a table file.
pub const BATCH_ROWS: usize = 64 * 1024;

/// When a sink flushes.
#[derive(Debug, Clone, Copy)]
pub struct FlushPolicy {
    /// Longest time a row stays in memory before reaching the file.
    pub interval: Duration,
    /// Rows buffered per table before a flush; a full record batch
    /// ([`BATCH_ROWS`]) is flushed whatever this says.
    pub rows: u64,
}

impl Default for FlushPolicy {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            rows: BATCH_ROWS as u64,
        }
    }
}

/// The table file under the writer's buffer. It counts the bytes the
/// kernel took and, once a write failed, takes nothing more: bytes written
/// after a torn batch could only make the file harder to repair.
struct Tracked {
    file: File,
    written: u64,
    poisoned: bool,
}

impl Write for Tracked {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.poisoned {
            return Err(io::Error::other("an earlier write to this file failed"));
        }
        match self.file.write(buf) {
            Ok(n) => {
                self.written += n as u64;
                Ok(n)
            }
            Err(e) => {
                if e.kind() != io::ErrorKind::Interrupted {
                    self.poisoned = true;
                }
                Err(e)
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.poisoned {
            return Err(io::Error::other("an earlier write to this file failed"));
        }
        self.file.flush()
    }
}

/// One table's Arrow IPC file.
pub struct IpcSink {
    path: PathBuf,
    writer: FileWriter<BufWriter<Tracked>>,
    decoder: TableDecoder,
    policy: FlushPolicy,
    pending: Vec<u8>,
    pending_rows: u64,
    /// When the oldest pending row arrived.
    oldest_pending: Option<Instant>,
    rows_written: u64,
    rows_rejected: u64,
    bytes_in: u64,
    /// Length of the file up to the end of the last batch the kernel took.
    durable_len: u64,
    /// Set by the first write error: nothing is written after it.
    failed: bool,
}

impl IpcSink {
    /// Creates `path` and writes the schema, so even a table with no rows
    /// is a readable file. On failure no file is left behind. The file must
    /// not exist: it is created exclusively, never through a symlink
    /// (`files::create_new`), as the collection folder is new.
    pub fn create(
        path: &Path,
        decoder: TableDecoder,
        policy: FlushPolicy,
    ) -> Result<Self, SinkError> {
        let file = files::create_new(path).map_err(SinkError::io(path))?;
        let tracked = Tracked {
            file,
            written: 0,
            poisoned: false,
        };
        let made = FileWriter::try_new(
            BufWriter::with_capacity(1 << 20, tracked),
            &decoder.schema(),
        )
        .and_then(|mut w| w.flush().map(|()| w));
        let writer = match made {
            Ok(w) => w,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(SinkError::arrow(path)(e));
            }
        };
        let durable_len = writer.get_ref().get_ref().written;
        Ok(Self {
            path: path.to_owned(),
            writer,
            decoder,
            policy,
            pending: Vec::new(),
            pending_rows: 0,
            oldest_pending: None,
            rows_written: 0,
            rows_rejected: 0,
            bytes_in: 0,
            durable_len,
            failed: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn table(&self) -> &str {
        self.decoder.table()
    }

    /// Rows in the file so far: flushed and handed to the kernel.
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

    /// True once a write to the file failed.
    pub fn failed(&self) -> bool {
        self.failed
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
        if records == 0 {
            return Ok(());
        }
        self.pending.extend_from_slice(data);
        self.pending_rows += records;
        self.bytes_in += data.len() as u64;
        self.oldest_pending.get_or_insert_with(Instant::now);
        // A full record batch goes out at once: holding more only grows
        // the buffer (and the collector's RSS) without changing the file.
        if self.pending_rows >= self.policy.rows || self.pending_rows >= BATCH_ROWS as u64 {
            self.flush()?;
        }
        self.flush_if_due()
    }

    /// How long until pending rows must be flushed; `None` when nothing is
    /// pending.
    pub fn due_in(&self) -> Option<Duration> {
        self.oldest_pending
            .map(|t| self.policy.interval.saturating_sub(t.elapsed()))
    }

    /// Flushes when the oldest pending row has waited a flush interval.
    /// Called on every drain, so a table that stops getting rows still has
    /// them on disk in time.
    pub fn flush_if_due(&mut self) -> Result<(), SinkError> {
        if self.due_in() == Some(Duration::ZERO) {
            self.flush()?;
        }
        Ok(())
    }

    /// Decodes what is pending, writes it as record batches and hands them
    /// to the kernel. After a failure nothing more is written.
    pub fn flush(&mut self) -> Result<(), SinkError> {
        if self.failed {
            return Err(SinkError::Io {
                path: self.path.clone(),
                source: io::Error::other("an earlier write to this file failed"),
            });
        }
        if self.pending_rows == 0 {
            self.oldest_pending = None;
            return Ok(());
        }
        // Cache-sized record batches: large ones cost page faults on every
        // fresh allocation and help no reader.
        let chunk = BATCH_ROWS * self.decoder.record_size();
        let mut written = Ok(());
        for records in self.pending.chunks(chunk) {
            written = self
                .decoder
                .decode(records)
                .and_then(|batch| self.writer.write(&batch));
            if written.is_err() {
                break;
            }
        }
        if let Err(e) = written.and_then(|()| self.writer.flush()) {
            self.poison();
            self.cut_torn_bytes();
            return Err(SinkError::arrow(&self.path)(e));
        }
        self.durable_len = self.writer.get_ref().get_ref().written;
        self.rows_written += self.pending_rows;
        self.pending.clear();
        self.pending_rows = 0;
        self.oldest_pending = None;
        Ok(())
    }

    fn poison(&mut self) {
        self.failed = true;
        self.writer.get_mut().get_mut().poisoned = true;
    }

    /// After a failed write: cuts the file back to its last complete batch
    /// at once, so the space the torn bytes took (a full disk's last free
    /// blocks) is free again before the error stops the run, and the other
    /// tables' last rows and footers have room whichever thread closes its
    /// files first. [`IpcSink::finish`] cuts at the same length again and
    /// appends the footer.
    fn cut_torn_bytes(&self) {
        // Best effort: on failure the bytes stay until the finish's cut.
        let _ = self
            .writer
            .get_ref()
            .get_ref()
            .file
            .set_len(self.durable_len);
    }

    /// Flushes, writes the footer and syncs the file to disk. Returns the
    /// rows in the file and the first error, if any: after a write error
    /// the file is cut back to its last complete batch and closed with a
    /// footer when there is room for one (otherwise it stays a footer-less
    /// file that [`repair`] closes later). Either way the rows counted are
    /// on disk and nothing after them.
    pub fn finish(mut self) -> (u64, Result<(), SinkError>) {
        let error = match self.close() {
            Ok(()) => return (self.rows_written, Ok(())),
            Err(e) => e,
        };
        self.poison();
        let (path, durable_len, rows) = (self.path.clone(), self.durable_len, self.rows_written);
        // The poisoned writer writes nothing more when dropped.
        drop(self);
        let sealed = cut_and_seal(&path, durable_len);
        let error = match sealed {
            Ok(()) => error,
            Err(seal) => SinkError::Io {
                path: path.clone(),
                source: io::Error::other(format!(
                    "{}; it keeps {rows} rows but no footer ({}): run `kernmlops repair` on its folder once there is space",
                    one_line(&error),
                    one_line(&seal)
                )),
            },
        };
        (rows, Err(error))
    }

    fn close(&mut self) -> Result<(), SinkError> {
        self.flush()?;
        self.writer.finish().map_err(SinkError::arrow(&self.path))?;
        self.writer
            .get_ref()
            .get_ref()
            .file
            .sync_all()
            .map_err(SinkError::io(&self.path))
    }
}

/// An error's text without the file name it starts with.
fn one_line(e: &SinkError) -> String {
    match e {
        SinkError::Io { source, .. } => source.to_string(),
        SinkError::Arrow { source, .. } => arrow_message(source),
        SinkError::NotArrow { reason, .. } => reason.clone(),
        SinkError::NoSpace {
            needed, available, ..
        } => format!("closing it needs {needed} bytes free, the file system has {available}"),
    }
}

/// Cuts the file at `len` (the end of its last complete batch) and appends
/// the footer.
fn cut_and_seal(path: &Path, len: u64) -> Result<(), SinkError> {
    let file = files::open_in_place(path).map_err(SinkError::io(path))?;
    file.set_len(len).map_err(SinkError::io(path))?;
    repair_file(path, &file).map(|_| ())
}

/// Writes a whole table in one go (`system_info` and other host tables).
/// On failure the partial file is removed. The file must not exist (see
/// [`IpcSink::create`]).
pub fn write_table(path: &Path, batch: &RecordBatch) -> Result<(), SinkError> {
    let file = files::create_new(path).map_err(SinkError::io(path))?;
    let written = (|| {
        let mut w = FileWriter::try_new(BufWriter::new(file), &batch.schema())
            .map_err(SinkError::arrow(path))?;
        w.write(batch).map_err(SinkError::arrow(path))?;
        w.finish().map_err(SinkError::arrow(path))?;
        w.get_ref()
            .get_ref()
            .sync_all()
            .map_err(SinkError::io(path))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(path);
    }
    written
}

/// What [`repair`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepairOutcome {
    /// The file was complete.
    Intact { rows: u64 },
    /// The file lacked its footer: its complete batches were kept, anything
    /// after them cut, and a footer appended in place.
    Repaired { rows: u64, batches: u64 },
}

impl RepairOutcome {
    pub fn rows(&self) -> u64 {
        match self {
            Self::Intact { rows } | Self::Repaired { rows, .. } => *rows,
        }
    }
}

/// Makes an Arrow IPC file readable again after a crash or a full disk, in
/// place: an intact file is left alone; one cut short keeps every complete
/// record batch, loses what follows the last one and gets a footer
/// appended. No temporary file is made, so it needs no more free space
/// than the footer (it checks first, and says how much it needs), and on
/// any error the file is left as it was or cut back to its last complete
/// batch, which a later repair can still close. A symlink is refused, not
/// followed.
pub fn repair(path: &Path) -> Result<RepairOutcome, SinkError> {
    let file = files::open_in_place(path).map_err(SinkError::io(path))?;
    repair_file(path, &file)
}

/// Every record batch of an intact file, or `None` when the file does not
/// read back whole.
fn intact_rows(file: &File) -> Option<u64> {
    let reader = FileReader::try_new(file.try_clone().ok()?, None).ok()?;
    let mut rows = 0;
    for b in reader {
        rows += b.ok()?.num_rows() as u64;
    }
    Some(rows)
}

fn repair_file(path: &Path, file: &File) -> Result<RepairOutcome, SinkError> {
    if let Some(rows) = intact_rows(file) {
        return Ok(RepairOutcome::Intact { rows });
    }
    let len = file.metadata().map_err(SinkError::io(path))?.len();
    let scan = scan_messages(path, file, len)?;
    let (rows, decodable) = decodable_batches(path, file, scan.stream_start, &scan)?;
    let kept = &scan.batches[..decodable];
    let cut = kept.last().map_or(scan.schema_end, |b| b.end());
    let dictionaries: Vec<Block> = scan
        .dictionaries
        .iter()
        .filter(|d| d.end() <= cut)
        .map(Message::block)
        .collect();
    let batches: Vec<Block> = kept.iter().map(Message::block).collect();
    let tail = footer(&scan.schema, &dictionaries, &batches);

    let new_len = cut + tail.len() as u64;
    let (block, available) = free_space(file).map_err(SinkError::io(path))?;
    let blocks = |n: u64| n.div_ceil(block.max(1));
    let needed = blocks(new_len).saturating_sub(blocks(len)) * block;
    if needed > available {
        return Err(SinkError::NoSpace {
            path: path.to_owned(),
            needed,
            available,
        });
    }
    let sealed = (|| {
        file.set_len(cut)?;
        file.write_all_at(&tail, cut)?;
        file.sync_all()
    })();
    if let Err(e) = sealed {
        // Back to the last complete batch: a later repair can close it.
        let _ = file.set_len(cut);
        return Err(SinkError::io(path)(e));
    }
    match intact_rows(file) {
        Some(r) if r == rows => Ok(RepairOutcome::Repaired {
            rows,
            batches: batches.len() as u64,
        }),
        _ => {
            let _ = file.set_len(cut);
            Err(SinkError::NotArrow {
                path: path.to_owned(),
                reason: "the rebuilt file does not read back; it was left without a footer".into(),
            })
        }
    }
}

/// Block size and free bytes of the file's file system (reserved blocks
/// count for root, who may use them).
fn free_space(file: &File) -> io::Result<(u64, u64)> {
    // SAFETY: statvfs is plain old data, filled by the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a writable statvfs.
    if unsafe { libc::fstatvfs(file.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let blocks = if root { st.f_bfree } else { st.f_bavail };
    let size = st.f_frsize as u64;
    Ok((size, (blocks as u64).saturating_mul(size)))
}

/// One complete IPC message of a file: where it starts, the length of its
/// prefix and metadata, and of its body.
#[derive(Debug, Clone, Copy)]
struct Message {
    offset: u64,
    meta_len: u64,
    body_len: u64,
}

impl Message {
    fn end(&self) -> u64 {
        self.offset + self.meta_len + self.body_len
    }

    fn block(&self) -> Block {
        Block::new(
            self.offset as i64,
            self.meta_len as i32,
            self.body_len as i64,
        )
    }
}

/// The messages of a file up to the first incomplete one.
struct Scan {
    schema: Schema,
    stream_start: u64,
    schema_end: u64,
    dictionaries: Vec<Message>,
    batches: Vec<Message>,
}

/// The IPC file format: `ARROW1`, padding to the alignment, the stream format
/// (a schema message, then dictionary and record batch messages, each
/// `0xFFFFFFFF`, a metadata length, metadata and body), then the footer.
const MAGIC: &[u8; 6] = b"ARROW1";
const CONTINUATION: u32 = 0xFFFF_FFFF;

fn scan_messages(path: &Path, file: &File, len: u64) -> Result<Scan, SinkError> {
    let not_arrow = |reason: &str| SinkError::NotArrow {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    if len == 0 {
        return Err(not_arrow("empty file (the run ended before writing it)"));
    }
    let mut head = [0u8; 256];
    let n = read_up_to(file, &mut head, 0).map_err(SinkError::io(path))?;
    if n < MAGIC.len() || &head[..MAGIC.len()] != MAGIC {
        return Err(not_arrow("not an Arrow IPC file"));
    }
    // The magic is zero-padded to the writer's alignment (8 to 64 bytes).
    let stream_start = (MAGIC.len()..n).find(|&i| head[i] != 0).unwrap_or(n) as u64;
    let mut pos = stream_start;
    let mut schema = None;
    let mut schema_end = 0;
    let mut dictionaries = Vec::new();
    let mut batches = Vec::new();
    while let Some((msg, meta)) = read_message(file, pos, len).map_err(SinkError::io(path))? {
        let Ok(parsed) = root_as_message(&meta) else {
            break;
        };
        match parsed.header_type() {
            MessageHeader::Schema if schema.is_none() => {
                let Some(fb) = parsed.header_as_schema() else {
                    break;
                };
                schema = Some(try_fb_to_schema(fb).map_err(SinkError::arrow(path))?);
                schema_end = msg.end();
            }
            MessageHeader::DictionaryBatch if schema.is_some() => dictionaries.push(msg),
            MessageHeader::RecordBatch if schema.is_some() => batches.push(msg),
            _ => break,
        }
        pos = msg.end();
    }
    let schema = schema.ok_or_else(|| not_arrow("cut before its schema was written"))?;
    Ok(Scan {
        schema,
        stream_start,
        schema_end,
        dictionaries,
        batches,
    })
}

/// Reads as much of `buf` as the file holds at `offset`.
fn read_up_to(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The complete message at `pos` with its metadata, or `None` at the end
/// of the stream or at an incomplete message.
fn read_message(file: &File, pos: u64, len: u64) -> io::Result<Option<(Message, Vec<u8>)>> {
    let mut word = [0u8; 4];
    if read_up_to(file, &mut word, pos)? < 4 {
        return Ok(None);
    }
    let (prefix, meta) = if u32::from_le_bytes(word) == CONTINUATION {
        if read_up_to(file, &mut word, pos + 4)? < 4 {
            return Ok(None);
        }
        (8u64, i32::from_le_bytes(word))
    } else {
        // Before format version 0.15 the length came first.
        (4u64, i32::from_le_bytes(word))
    };
    let Ok(meta) = u64::try_from(meta) else {
        return Ok(None);
    };
    if meta == 0 || pos + prefix + meta > len {
        return Ok(None);
    }
    let mut bytes = vec![0u8; meta as usize];
    if read_up_to(file, &mut bytes, pos + prefix)? < bytes.len() {
        return Ok(None);
    }
    let body = match root_as_message(&bytes) {
        Ok(m) => u64::try_from(m.bodyLength()).ok(),
        Err(_) => None,
    };
    let Some(body_len) = body else {
        return Ok(None);
    };
    let msg = Message {
        offset: pos,
        meta_len: prefix + meta,
        body_len,
    };
    if msg.end() > len {
        return Ok(None);
    }
    Ok(Some((msg, bytes)))
}

/// How many of the scanned record batches decode, and their rows: a
/// complete message can still hold bytes that are not a batch.
fn decodable_batches(
    path: &Path,
    file: &File,
    stream_start: u64,
    scan: &Scan,
) -> Result<(u64, usize), SinkError> {
    let end = scan.batches.last().map_or(scan.schema_end, Message::end);
    let mut f = file.try_clone().map_err(SinkError::io(path))?;
    f.seek(SeekFrom::Start(stream_start))
        .map_err(SinkError::io(path))?;
    let reader = StreamReader::try_new(BufReader::new(f.take(end - stream_start)), None)
        .map_err(SinkError::arrow(path))?;
    let (mut rows, mut count) = (0u64, 0usize);
    for batch in reader.take(scan.batches.len()) {
        match batch {
            Ok(b) => {
                rows += b.num_rows() as u64;
                count += 1;
            }
            Err(_) => break,
        }
    }
    Ok((rows, count))
}

/// The end of an IPC file for these blocks: the end-of-stream marker, the
/// footer (schema, dictionary and record batch blocks), its length and
/// the magic, byte for byte what `FileWriter::finish` writes.
fn footer(schema: &Schema, dictionaries: &[Block], batches: &[Block]) -> Vec<u8> {
    let mut fbb = IpcSchemaEncoder::new().schema_to_fb(&Schema::empty());
    fbb.reset();
    let dictionaries = fbb.create_vector(dictionaries);
    let batches = fbb.create_vector(batches);
    let mut tracker = DictionaryTracker::new(true);
    let schema = IpcSchemaEncoder::new()
        .with_dictionary_tracker(&mut tracker)
        .schema_to_fb_offset(&mut fbb, schema);
    let root = {
        let mut b = FooterBuilder::new(&mut fbb);
        b.add_version(MetadataVersion::V5);
        b.add_schema(schema);
        b.add_dictionaries(dictionaries);
        b.add_recordBatches(batches);
        b.finish()
    };
    fbb.finish(root, None);
    let data = fbb.finished_data();
    let mut out = Vec::with_capacity(data.len() + 18);
    out.extend_from_slice(&CONTINUATION.to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&(data.len() as i32).to_le_bytes());
    out.extend_from_slice(MAGIC);
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use kernmlops_plugin_api::{ColumnDecl, ColumnKind, TableDecl};

    fn decoder() -> TableDecoder {
        tick_decoder("ticks")
    }

    /// The decoder of a table `name` of one `ts_uptime_us` column.
    pub(crate) fn tick_decoder(name: &str) -> TableDecoder {
        let decl = TableDecl {
            name: name.into(),
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

    fn never() -> FlushPolicy {
        FlushPolicy {
            interval: Duration::from_secs(3600),
            rows: 100,
        }
    }

    /// A complete file of `batches` batches of 100 rows, and its bytes.
    fn complete_file(dir: &Path, batches: u64) -> (PathBuf, Vec<u8>) {
        let path = dir.join("ticks.arrow");
        // A table file is created exclusively: a file of an earlier call goes first.
        let _ = std::fs::remove_file(&path);
        let mut sink = IpcSink::create(&path, decoder(), never()).expect("create");
        for chunk in 0..batches {
            sink.push(&records(chunk * 100..(chunk + 1) * 100), 100)
                .expect("push");
        }
        let (rows, done) = sink.finish();
        done.expect("finish");
        assert_eq!(rows, batches * 100);
        let bytes = std::fs::read(&path).expect("read");
        (path, bytes)
    }

    /// Where the footer of a complete file starts (its end-of-stream mark).
    fn footer_start(bytes: &[u8]) -> usize {
        let n = bytes.len();
        let footer_len =
            i32::from_le_bytes(bytes[n - 10..n - 6].try_into().expect("4 bytes")) as usize;
        n - 10 - footer_len - 8
    }

    #[test]
    fn a_planted_table_file_is_refused_not_followed() {
        let dir = tempdir("planted");
        let victim = dir.join("victim");
        std::fs::write(&victim, b"precious").expect("victim");
        let path = dir.join("ticks.arrow");
        std::os::unix::fs::symlink(&victim, &path).expect("symlink");
        let e = IpcSink::create(&path, decoder(), FlushPolicy::default())
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("exists already"), "{e}");
        let batch = RecordBatch::new_empty(decoder().schema());
        assert!(write_table(&path, &batch).is_err());
        let e = repair(&path).expect_err("a symlink").to_string();
        assert!(e.contains("symlink"), "{e}");
        assert_eq!(std::fs::read(&victim).expect("read"), b"precious");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn empty_table_is_a_readable_file() {
        let dir = tempdir("empty");
        let path = dir.join("ticks.arrow");
        let sink = IpcSink::create(&path, decoder(), FlushPolicy::default()).expect("create");
        let (rows, done) = sink.finish();
        done.expect("finish");
        assert_eq!(rows, 0);
        assert_eq!(
            repair(&path).expect("read"),
            RepairOutcome::Intact { rows: 0 }
        );
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn the_footer_repair_appends_is_the_writers_own() {
        let dir = tempdir("same");
        let (path, whole) = complete_file(&dir, 3);
        let cut = footer_start(&whole);
        std::fs::write(&path, &whole[..cut]).expect("cut the footer");
        assert_eq!(
            repair(&path).expect("repair"),
            RepairOutcome::Repaired {
                rows: 300,
                batches: 3
            }
        );
        assert_eq!(std::fs::read(&path).expect("read"), whole, "byte for byte");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn repairs_a_file_cut_anywhere_in_place() {
        let dir = tempdir("cut");
        let (_, empty) = complete_file(&dir, 0);
        let schema_end = footer_start(&empty);
        let (path, whole) = complete_file(&dir, 5);
        let end = footer_start(&whole);
        // A cut inside the schema leaves nothing to keep.
        std::fs::write(&path, &whole[..schema_end - 1]).expect("cut");
        let e = repair(&path).expect_err("no schema").to_string();
        assert!(e.contains("cut before its schema"), "{e}");
        // Every cut from the schema's end to the footer keeps the batches
        // that are complete before it, and never leaves another file.
        let mut last_rows = 0;
        for cut in (schema_end..=end).step_by(97).chain([end]) {
            std::fs::write(&path, &whole[..cut]).expect("cut");
            let rows = match repair(&path) {
                Ok(RepairOutcome::Repaired { rows, batches }) => {
                    assert_eq!(rows, batches * 100);
                    rows
                }
                other => panic!("cut at {cut}: {other:?}"),
            };
            assert!(rows >= last_rows, "a longer file kept fewer rows");
            last_rows = rows;
            assert_eq!(
                repair(&path).expect("again"),
                RepairOutcome::Intact { rows }
            );
            let names: Vec<_> = std::fs::read_dir(&dir).expect("dir").collect();
            assert_eq!(names.len(), 1, "repair made other files: {names:?}");
        }
        assert_eq!(last_rows, 500);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn unreadable_files_are_named_not_panicked_on() {
        let dir = tempdir("bad");
        let path = dir.join("x.arrow");
        for (bytes, needle) in [
            (&b""[..], "empty file"),
            (&b"PAR1 not arrow"[..], "not an Arrow IPC file"),
            (&b"ARROW1\0\0"[..], "cut before its schema"),
            (
                &b"ARROW1\0\0\xff\xff\xff\xff\x10\0\0\0garbage"[..],
                "cut before its schema",
            ),
        ] {
            std::fs::write(&path, bytes).expect("write");
            let e = repair(&path).expect_err("unreadable").to_string();
            assert!(e.contains(needle) && e.contains("x.arrow"), "{e}");
            assert_eq!(std::fs::read(&path).expect("read"), bytes, "left as it was");
        }
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn quiet_tables_flush_within_the_interval() {
        let dir = tempdir("quiet");
        let path = dir.join("ticks.arrow");
        let policy = FlushPolicy {
            interval: Duration::from_millis(50),
            rows: 1 << 20,
        };
        let mut sink = IpcSink::create(&path, decoder(), policy).expect("create");
        sink.push(&records(0..3), 3).expect("push");
        assert_eq!(sink.rows_written(), 0, "not yet due");
        assert!(sink
            .due_in()
            .is_some_and(|d| d <= Duration::from_millis(50)));
        std::thread::sleep(Duration::from_millis(60));
        sink.flush_if_due().expect("flush");
        assert_eq!(sink.rows_written(), 3, "flushed with no new rows");
        assert_eq!(sink.due_in(), None);
        // Killed now (no footer): every row is in the file.
        std::mem::forget(sink);
        assert_eq!(repair(&path).expect("repair").rows(), 3);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    /// A small tmpfs, filled by one sink until the disk is full: the sink
    /// stops, and the file keeps exactly the rows it counts, closed.
    #[test]
    fn root_full_disk_leaves_a_closed_file_with_the_rows_counted() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            let ci = matches!(std::env::var("CI").as_deref(), Ok("true" | "1"));
            assert!(
                !ci,
                "root_full_disk_leaves_a_closed_file_with_the_rows_counted needs root, and CI must run it"
            );
            eprintln!("SKIP root_full_disk_leaves_a_closed_file_with_the_rows_counted: needs root to mount a tmpfs");
            return;
        }
        let dir = tempdir("full");
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(mounted, "mounting a tmpfs on {}", dir.display());
        let path = dir.join("ticks.arrow");
        let policy = FlushPolicy {
            interval: Duration::from_secs(3600),
            rows: 1000,
        };
        let outcome = std::panic::catch_unwind(|| {
            let mut sink = IpcSink::create(&path, decoder(), policy).expect("create");
            let mut seq = 0;
            let err = loop {
                if let Err(e) = sink.push(&records(seq..seq + 1000), 1000) {
                    break e;
                }
                seq += 1000;
                assert!(seq < 10_000_000, "1 MiB never filled");
            };
            assert!(err.is_out_of_space(), "{err}");
            assert!(sink.failed());
            let (rows, done) = sink.finish();
            assert!(done.is_err(), "the first error is reported");
            assert_eq!(rows, seq, "the rows counted are the rows flushed");
            assert_eq!(
                repair(&path).expect("closed"),
                RepairOutcome::Intact { rows }
            );
        });
        let _ = std::process::Command::new("umount").arg(&dir).status();
        std::fs::remove_dir_all(&dir).expect("clean up");
        if let Err(p) = outcome {
            std::panic::resume_unwind(p);
        }
    }
}
