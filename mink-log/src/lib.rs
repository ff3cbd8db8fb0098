//! Log tablets: the durable, ordered log of one bucket.
//!
//! A [`LogTablet`] is an append-only sequence of Arrow batches. Every row gets the next
//! offset; a batch has `base_offset..=last_offset`, a commit timestamp (monotonic within
//! the bucket) and the `schema_id` it was written with.
//!
//! ```text
//!   writers ──append──▶ appender task ──group commit──▶ active segment ──fsync──▶ HW moves
//!                                                              │                  │
//!   readers ◀── log cache (recent batches, decoded and as stored) ◀┘     Tail waiters wake
//!           ◀── sealed segments + offset index (readahead) for history
//! ```
//!
//! * **Durability.** One appender task per tablet takes every pending append, writes their
//!   frames, fsyncs once (group commit) and only then moves the high watermark and
//!   acknowledges. Readers never see past the high watermark, so nothing a crash can take
//!   back is ever observed. With `sync = false` the fsync is skipped (tests, benchmarks).
//! * **Recovery.** On open, sealed segments are read from their offset index and the active
//!   segment is scanned; a torn tail (a crash mid-write) is truncated.
//! * **Reads.** [`LogTablet::read`] returns batches decoded; [`LogTablet::read_frames`]
//!   returns them as stored, one Arrow IPC stream each, which Scan and Tail send to
//!   clients without decoding or encoding them again.
//! * **Writes as sent.** A batch a client sent as an IPC message is stored as that
//!   message when it is stored unchanged ([`SentBatch`]), not encoded again.
//! * **Retention.** With a `log.ttl`, whole sealed segments older than the TTL are deleted
//!   and `log_start` moves to the first remaining offset.

mod appender;
mod cache;
mod error;
mod recovery;
mod segment;
mod sent;

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arrow::array::RecordBatch;
use bytes::Bytes;
use mink_core::protocol::AppendAck;
use mink_core::table::TableDescriptor;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::info;

use self::appender::{Appender, WriteRequest};
use self::cache::LogCache;
pub use self::error::{LogError, Result};
use self::segment::{CachedBatch, HEADER_LEN};
pub use self::segment::{FrameHeader, Payload, StoredBatch};
pub use self::sent::{SentBatch, SentMessage};

/// How a tablet stores its log.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// fsync before the high watermark moves. Turning this off risks losing acknowledged
    /// writes on a machine crash (not on a process crash).
    pub sync: bool,
    /// Roll to a new segment once the active one reaches this size.
    pub segment_bytes: u64,
    /// Roll to a new segment once the active one's first batch is this old, so retention
    /// can delete it.
    pub segment_max_age: Duration,
    /// Bytes of recent batches kept decoded in memory.
    pub cache_bytes: u64,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            sync: true,
            segment_bytes: 128 << 20,
            segment_max_age: Duration::from_secs(3600),
            cache_bytes: 32 << 20,
        }
    }
}

/// The last rows of a log, as [`LogTablet::last_rows`] found them: the batches from
/// `start` (a batch's first offset) below `end` (the high watermark then), less the first
/// `skip` rows of the first batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastRows {
    /// The first offset of the batch holding the first row.
    pub start: i64,
    /// The rows of that batch before the first row (fewer than the batch holds).
    pub skip: u64,
    /// The high watermark when they were found: rows from it on are not among them.
    pub end: i64,
}

/// One batch read from the log.
#[derive(Debug, Clone)]
pub struct LogBatch {
    /// Offset of the first row.
    pub base_offset: i64,
    /// Offset of the last row.
    pub last_offset: i64,
    /// Commit time, ms since the epoch.
    pub commit_timestamp: i64,
    /// The schema version the batch was written with.
    pub schema_id: u32,
    /// The rows.
    pub batch: RecordBatch,
    /// The change vector (primary-key tables).
    pub changes: Option<Vec<u8>>,
    /// The idempotent producer that wrote the batch, if one did.
    pub writer: Option<WriterTag>,
    /// Size of the batch in the log, in bytes.
    pub size: u64,
}

/// One batch read from the log as it is stored: its frame header and its payload, the
/// batch an Arrow IPC stream not decoded.
#[derive(Debug, Clone)]
pub struct LogFrame {
    /// What the frame header says about the batch.
    pub header: FrameHeader,
    /// The batch as stored.
    pub payload: Payload,
}

impl LogFrame {
    /// The batch, decoded.
    pub fn decode(&self) -> Result<RecordBatch> {
        self.payload.decode(&self.header)
    }
}

/// An idempotent Kafka producer's batch: who wrote it and its sequence numbers. It is
/// stored in the batch's frame, atomically with the rows, so after a crash the log
/// itself tells whether a batch the producer sends again was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterTag {
    /// The producer id.
    pub producer_id: i64,
    /// The producer's epoch.
    pub epoch: i16,
    /// The sequence number of the batch's first record.
    pub first_sequence: i32,
    /// The sequence number of its last record.
    pub last_sequence: i32,
}

/// One write to a bucket, validated against its table.
#[derive(Debug)]
pub struct Write {
    /// What to do.
    pub op: WriteOp,
    /// The table as the write was validated against (its current schema version).
    pub table: Arc<TableDescriptor>,
    /// The DoPut stream the write belongs to; `None` for a write on its own.
    pub stream: Option<WriteStream>,
    /// The idempotent producer writing, stored with the batch; `None` for other writers.
    pub writer: Option<WriterTag>,
    /// The message the client sent the op's rows in, which the log stores as it is when
    /// it stores those rows unchanged.
    pub sent: Option<SentMessage>,
}

/// The kinds of write.
#[derive(Debug)]
pub enum WriteOp {
    /// Append rows to a log table.
    Append(RecordBatch),
    /// Upsert whole rows into a primary-key table.
    Upsert(RecordBatch),
    /// Delete rows of a primary-key table by key (the batch holds the key columns).
    Delete(RecordBatch),
}

/// The writes of one client stream (a DoPut) to a tablet, which stop at their first
/// failure: once one of them is refused or fails, the appender writes none of the later
/// ones (see the stop rule in the appender's module doc).
///
/// A write joins the stream by carrying it in [`Write::stream`]; the clones of one
/// `WriteStream` share one flag, so a DoPut makes one (the default) and gives each of its
/// writes a clone.
#[derive(Debug, Clone, Default)]
pub struct WriteStream(Arc<AtomicBool>);

impl WriteStream {
    /// Whether a write of the stream was refused or failed.
    fn stopped(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// A write of the stream was refused or failed: none of the later ones is written.
    fn stop(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// What turns a primary-key table's writes into its changelog, and keeps the state the
/// changelog folds to (the KV store) in line with the log.
///
/// The appender calls [`Changelog::prepare`] for each write of a group (in the order they
/// are logged), then, once the group is durable, [`Changelog::commit`] — or
/// [`Changelog::abort`] when the group failed. A commit may update the state in the
/// background while the appender writes the next group: the group is acknowledged once
/// its [`Applying`] resolves, and the prepares after the commit see its writes already.
pub trait Changelog: Send + std::fmt::Debug + 'static {
    /// The changelog batch of one write, seeing every earlier write of the group;
    /// `None` when the write changes nothing.
    fn prepare(&mut self, write: &Write) -> Result<Option<StoredBatch>>;
    /// The schema version of the batches [`Changelog::prepare`] returns: the newest the
    /// changelog has seen, which may be newer than the write's.
    fn schema_id(&self) -> u32;
    /// The prepared writes are durable up to `end_offset`: apply them. Fails when the
    /// previous commit's update failed; the state then no longer follows the log
    /// ([`Changelog::failure`]).
    fn commit(&mut self, end_offset: i64) -> Result<Applying>;
    /// Why the state no longer follows the log, once an update of it failed: the
    /// appender writes no group after that (see the appender's module doc).
    fn failure(&self) -> Option<String>;
    /// Waits until every committed write is applied.
    fn settle(&mut self) -> Result<()>;
    /// The prepared writes failed: forget them.
    fn abort(&mut self);
    /// The offset up to which the durable log has been applied (or is being applied).
    fn applied_offset(&self) -> i64;
    /// Applies a durable changelog batch (recovery replays the log from
    /// [`Changelog::applied_offset`]); [`Changelog::commit`] follows the last one.
    fn replay(&mut self, batch: &LogBatch) -> Result<()>;
}

/// A commit's update of the changelog's state, which may still be running: resolves once
/// readers of the state see the commit's writes, with the update's error if it failed.
#[derive(Debug)]
pub struct Applying(Option<oneshot::Receiver<Result<()>>>);

impl Applying {
    /// An update that is already done.
    pub fn done() -> Self {
        Self(None)
    }

    /// An update that reports on `done` when it ends.
    pub fn pending(done: oneshot::Receiver<Result<()>>) -> Self {
        Self(Some(done))
    }

    async fn wait(self) -> Result<()> {
        match self.0 {
            None => Ok(()),
            Some(done) => done
                .await
                .unwrap_or_else(|_| Err(LogError::Changelog("the KV store update stopped".into()))),
        }
    }
}

/// The log of one bucket.
#[derive(Debug)]
pub struct LogTablet {
    shared: Arc<Shared>,
    writes: mpsc::Sender<WriteRequest>,
}

#[derive(Debug)]
struct Shared {
    label: String,
    dir: PathBuf,
    state: RwLock<LogState>,
    watermark: watch::Sender<i64>,
}

#[derive(Debug)]
struct LogState {
    /// Every retained batch, oldest first, with the base offset of its segment.
    batches: VecDeque<(FrameHeader, i64)>,
    log_start: i64,
    high_watermark: i64,
    active_segment: i64,
    cache: LogCache,
}

impl LogTablet {
    /// Opens (or creates) the log in `dir`, recovering it after a crash, brings the
    /// changelog hook (if any) in line with it, and starts its appender task on the
    /// current tokio runtime.
    pub fn open(
        label: String,
        dir: &Path,
        config: LogConfig,
        changelog: Option<Box<dyn Changelog>>,
    ) -> Result<Self> {
        let appender = Appender::recover(label, dir, config, changelog)?;
        Ok(Self::start(appender))
    }

    /// Starts `appender`'s task on the current tokio runtime: the tablet it writes.
    fn start(appender: Appender) -> Self {
        let shared = Arc::clone(&appender.shared);
        let (writes, requests) = mpsc::channel(1024);
        tokio::spawn(appender.run(requests));
        Self { shared, writes }
    }

    /// Writes to the log; resolves once the write is durable and visible, with its
    /// offsets (an empty range when the write changed nothing).
    ///
    /// A write that carries a [`Write::stream`] belongs to that stream: it takes its place
    /// in the tablet's queue on its first poll, and is not written if an earlier write of
    /// the stream was refused or failed.
    pub async fn write(&self, write: Write) -> Result<AppendAck> {
        let (WriteOp::Append(batch) | WriteOp::Upsert(batch) | WriteOp::Delete(batch)) = &write.op;
        if batch.num_rows() == 0 {
            return Err(LogError::InvalidArgument(
                "an empty batch cannot be written".into(),
            ));
        }
        let (reply, ack) = oneshot::channel();
        let closed = || LogError::ShuttingDown(format!("bucket {}", self.shared.label));
        self.writes
            .send(WriteRequest { write, reply })
            .await
            .map_err(|_| closed())?;
        ack.await.map_err(|_| closed())?
    }

    /// `(log_start, high_watermark)`.
    pub fn offsets(&self) -> (i64, i64) {
        let state = self.shared.read_state();
        (state.log_start, state.high_watermark)
    }

    /// Reads batches from `offset` up to the high watermark, stopping once `max_bytes` are
    /// collected (the first batch is always returned whole). The batch holding `offset` is
    /// returned whole, so its `base_offset` may be below `offset`.
    pub async fn read(&self, offset: i64, max_bytes: u64) -> Result<Vec<LogBatch>> {
        self.read_as(offset, max_bytes, LogBatch::from_found).await
    }

    /// [`LogTablet::read`], the batches as stored: nothing is decoded.
    pub async fn read_frames(&self, offset: i64, max_bytes: u64) -> Result<Vec<LogFrame>> {
        self.read_as(offset, max_bytes, LogFrame::from_found).await
    }

    /// Reads as [`LogTablet::read`] does, each batch turned into a `T` by `convert`.
    async fn read_as<T: Send + 'static>(
        &self,
        offset: i64,
        max_bytes: u64,
        convert: fn(&FrameHeader, Found) -> Result<T>,
    ) -> Result<Vec<T>> {
        let plan = self.plan_read(offset, max_bytes)?;
        if plan.iter().all(|p| p.cached.is_some()) {
            return plan
                .into_iter()
                .filter_map(|p| Some(convert(&p.header, Found::Cached(p.cached?))))
                .collect();
        }
        let dir = self.shared.dir.clone();
        let label = self.shared.label.clone();
        tokio::task::spawn_blocking(move || read_planned(&dir, &label, plan, convert))
            .await
            .map_err(|e| LogError::Io(std::io::Error::other(e)))?
    }

    /// Where the last `rows` rows below the high watermark lie (fewer when the log holds
    /// fewer): nothing is read, so a caller reads them a bounded piece at a time.
    pub fn last_rows(&self, rows: u64) -> LastRows {
        let state = self.shared.read_state();
        let end = state.high_watermark;
        let mut start = end;
        let mut covered = 0u64;
        for (header, _) in state.batches.iter().rev() {
            if covered >= rows {
                break;
            }
            if header.base_offset < end {
                covered += u64::from(header.records);
                start = header.base_offset;
            }
        }
        LastRows {
            start,
            skip: covered.saturating_sub(rows),
            end,
        }
    }

    /// Checks that `offset` lies in the log: from its start to the high watermark.
    ///
    /// # Errors
    /// [`LogError::OffsetOutOfRange`] otherwise.
    pub fn check_offset(&self, offset: i64) -> Result<()> {
        let state = self.shared.read_state();
        self.shared.check_offset(offset, &state)
    }

    fn plan_read(&self, offset: i64, max_bytes: u64) -> Result<Vec<PlannedBatch>> {
        let state = self.shared.read_state();
        self.shared.check_offset(offset, &state)?;
        let first = state
            .batches
            .partition_point(|(h, _)| h.last_offset() < offset);
        let mut plan = Vec::new();
        let mut bytes = 0u64;
        for (header, segment) in state.batches.range(first..) {
            if !plan.is_empty() && bytes + u64::from(header.payload_len) > max_bytes {
                break;
            }
            bytes += u64::from(header.payload_len);
            plan.push(PlannedBatch {
                header: *header,
                segment: *segment,
                cached: state.cache.get(header.base_offset),
            });
        }
        Ok(plan)
    }

    /// Waits until the high watermark passes `offset` with at least `min_bytes` available
    /// from it, or until `max_wait` is over. Returns early on neither condition being an
    /// error: an empty read after the wait is a normal answer.
    pub async fn wait_for(&self, offset: i64, min_bytes: u64, max_wait: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + max_wait;
        let mut watermark = self.shared.watermark.subscribe();
        loop {
            if self.bytes_available(offset) >= min_bytes.max(1) {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, watermark.changed()).await {
                Err(_elapsed) => return Ok(()),
                Ok(Ok(())) => {}
                Ok(Err(_closed)) => {
                    return Err(LogError::ShuttingDown(format!(
                        "bucket {}",
                        self.shared.label
                    )));
                }
            }
        }
    }

    fn bytes_available(&self, offset: i64) -> u64 {
        let state = self.shared.read_state();
        let first = state
            .batches
            .partition_point(|(h, _)| h.last_offset() < offset);
        state
            .batches
            .range(first..)
            .map(|(h, _)| u64::from(h.payload_len))
            .sum()
    }

    /// The first offset whose batch was committed at or after `timestamp_ms`; the high
    /// watermark when every batch is older.
    pub fn offset_for_timestamp(&self, timestamp_ms: i64) -> i64 {
        let state = self.shared.read_state();
        let index = state
            .batches
            .partition_point(|(h, _)| h.commit_timestamp < timestamp_ms);
        state
            .batches
            .get(index)
            .map_or(state.high_watermark, |(h, _)| {
                h.base_offset.max(state.log_start)
            })
    }

    /// Deletes the sealed segments whose every batch is older than `ttl` and, if
    /// `keep_from` is given, below it (the lower of the offset a KV store would replay
    /// from and the lake's recorded seam: rows not yet tiered stay); returns how many.
    pub fn enforce_retention(&self, ttl: Duration, keep_from: Option<i64>) -> Result<usize> {
        let cutoff = now_ms() - i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let mut state = self.shared.write_state();
        let mut removed = 0;
        while let Some(&(_, segment)) = state.batches.front() {
            if segment == state.active_segment {
                break;
            }
            let end = state.batches.partition_point(|(_, s)| *s == segment);
            let newest = state.batches[end - 1].0;
            let newest_end = newest.base_offset + i64::from(newest.records);
            if newest.commit_timestamp >= cutoff || keep_from.is_some_and(|keep| newest_end > keep)
            {
                break;
            }
            remove_segment_files(&self.shared.dir, segment)?;
            state.batches.drain(..end);
            state.log_start = state
                .batches
                .front()
                .map_or(state.high_watermark, |(h, _)| h.base_offset);
            let log_start = state.log_start;
            state.cache.truncate_before(log_start);
            removed += 1;
        }
        if removed > 0 {
            info!(bucket = %self.shared.label, removed, log_start = state.log_start, "retention removed segments");
        }
        Ok(removed)
    }
}

impl Shared {
    /// [`LogTablet::check_offset`] against `state`.
    fn check_offset(&self, offset: i64, state: &LogState) -> Result<()> {
        match offset < state.log_start || offset > state.high_watermark {
            true => Err(LogError::OffsetOutOfRange {
                bucket: self.label.clone(),
                offset,
                log_start: state.log_start,
                high_watermark: state.high_watermark,
            }),
            false => Ok(()),
        }
    }

    fn read_state(&self) -> std::sync::RwLockReadGuard<'_, LogState> {
        self.state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write_state(&self) -> std::sync::RwLockWriteGuard<'_, LogState> {
        self.state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Batches read at once while replaying the log into a changelog hook: the hook is
/// committed after each chunk ([`Changelog::replay`]).
pub const REPLAY_CHUNK: usize = 64;

#[derive(Debug, Clone)]
struct PlannedBatch {
    header: FrameHeader,
    segment: i64,
    cached: Option<Arc<CachedBatch>>,
}

/// A planned batch, found in the log cache or read from its segment.
enum Found {
    Cached(Arc<CachedBatch>),
    Read(Payload),
}

impl LogBatch {
    fn from_found(header: &FrameHeader, found: Found) -> Result<Self> {
        let (batch, payload) = match found {
            Found::Cached(cached) => (cached.batch.clone(), cached.payload.clone()),
            Found::Read(payload) => (payload.decode(header)?, payload),
        };
        Ok(Self {
            base_offset: header.base_offset,
            last_offset: header.last_offset(),
            commit_timestamp: header.commit_timestamp,
            schema_id: header.schema_id,
            batch,
            changes: payload.changes,
            writer: payload.writer,
            size: u64::from(header.payload_len),
        })
    }
}

impl LogFrame {
    fn from_found(header: &FrameHeader, found: Found) -> Result<Self> {
        let payload = match found {
            Found::Cached(cached) => cached.payload.clone(),
            Found::Read(payload) => payload,
        };
        Ok(Self {
            header: *header,
            payload,
        })
    }
}

/// Reads the planned batches that are not cached from their segments, each turned into a
/// `T` by `convert`. Consecutive frames of one segment are read with a single positioned
/// read (readahead over the whole span).
fn read_planned<T>(
    dir: &Path,
    label: &str,
    plan: Vec<PlannedBatch>,
    convert: fn(&FrameHeader, Found) -> Result<T>,
) -> Result<Vec<T>> {
    let mut result = Vec::with_capacity(plan.len());
    let mut index = 0;
    while index < plan.len() {
        if let Some(cached) = &plan[index].cached {
            result.push(convert(
                &plan[index].header,
                Found::Cached(Arc::clone(cached)),
            )?);
            index += 1;
            continue;
        }
        let segment = plan[index].segment;
        let run_end = plan[index..]
            .iter()
            .position(|p| p.cached.is_some() || p.segment != segment)
            .map_or(plan.len(), |n| index + n);
        let start = plan[index].header.position;
        let last = &plan[run_end - 1].header;
        let end = last.position + last.frame_len();
        let file = File::open(segment::segment_path(dir, segment)).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                LogError::Corrupt(format!(
                    "segment {segment} of bucket {label} was removed by retention during the read; read again from log_start"
                ))
            } else {
                e.into()
            }
        })?;
        let mut span = vec![0u8; usize::try_from(end - start).unwrap_or(usize::MAX)];
        file.read_exact_at(&mut span, start)?;
        let span = Bytes::from(span);
        for planned in &plan[index..run_end] {
            let from = (planned.header.position - start) as usize + HEADER_LEN;
            let payload = span.slice(from..from + planned.header.payload_len as usize);
            let payload = Payload::parse(&planned.header, payload)?;
            result.push(convert(&planned.header, Found::Read(payload))?);
        }
        index = run_end;
    }
    Ok(result)
}

/// Replays the durable log from the changelog hook's applied offset into it.
fn replay(
    label: &str,
    dir: &Path,
    batches: &VecDeque<(FrameHeader, i64)>,
    end: i64,
    changelog: &mut dyn Changelog,
) -> Result<()> {
    let applied = changelog.applied_offset();
    if applied == end {
        return Ok(());
    }
    let first = batches.partition_point(|(h, _)| h.base_offset < applied);
    if batches.get(first).map(|(h, _)| h.base_offset) != Some(applied) {
        return Err(LogError::Corrupt(format!(
            "bucket {label}: the KV store is at offset {applied}, which is not a batch boundary of the retained log"
        )));
    }
    let plan: Vec<PlannedBatch> = batches
        .range(first..)
        .map(|(header, segment)| PlannedBatch {
            header: *header,
            segment: *segment,
            cached: None,
        })
        .collect();
    info!(
        bucket = label,
        from = applied,
        to = end,
        "replaying the log into the KV store"
    );
    // A chunk at a time, each committed before the next is read (its update runs beside
    // that read): a whole log rebuilt into an empty store never sits in memory, and a
    // crash during the replay resumes after the last chunk applied.
    for chunk in plan.chunks(REPLAY_CHUNK) {
        let mut chunk_end = None;
        for batch in read_planned(dir, label, chunk.to_vec(), LogBatch::from_found)? {
            changelog.replay(&batch)?;
            chunk_end = Some(batch.last_offset + 1);
        }
        if let Some(chunk_end) = chunk_end {
            changelog.commit(chunk_end)?;
        }
    }
    if changelog.applied_offset() != end {
        changelog.commit(end)?;
    }
    changelog.settle()
}

/// Removes a sealed segment and its index, then fsyncs the directory before the next
/// segment goes: a power cut may bring back the last segment removed, never one whose
/// successor stays removed, so the log it leaves may start earlier but has no gap.
fn remove_segment_files(dir: &Path, base: i64) -> Result<()> {
    for path in [
        segment::segment_path(dir, base),
        segment::index_path(dir, base),
    ] {
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
    }
    mink_durable::sync_dir(dir)?;
    Ok(())
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests;
