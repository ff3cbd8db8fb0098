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
//! * **On object storage.** With a [`LogStore`] (`--log-store`), a group is made durable
//!   by a WAL object in the store instead of an fsync, sealed segments become stream
//!   objects that history is read from, and a node's logs are rebuilt from the store when
//!   it opens (the `store` module).
//! * **Retention.** With a `log.ttl`, whole sealed segments older than the TTL are deleted
//!   and `log_start` moves to the first remaining offset.
//! * **The changelog hook.** A primary-key table's writes become its changelog through a
//!   [`Changelog`] the tablet is opened with (mink-kv's `KvWriter`), which keeps the
//!   table's current rows in line with the log: the log depends on no store.
//!
//! The modules: `appender` (group commit, the stop rule), `segment` (the frame and index
//! formats), `recovery` (opening after a crash), `read` (batches from the cache or their
//! segments), `cache`, `sent` (batches stored as their client sent them), `write` (what a
//! write carries), `writers` (idempotent writers' batches written once), `changelog`
//! (the hook and its replay), `store` (the log on object
//! storage: WAL objects, stream objects, the block cache, fencing, checkpoints), `error`
//! ([`LogError`]).

mod appender;
mod cache;
mod changelog;
mod drain;
mod error;
mod read;
mod recovery;
mod segment;
mod sent;
mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod write;
mod writers;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use arrow::array::RecordBatch;
use mink_core::protocol::AppendAck;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::info;

use self::appender::{Appender, Request, WriteRequest};
use self::cache::LogCache;
pub use self::changelog::{Applying, Changelog, REPLAY_CHUNK};
pub use self::drain::drain;
pub use self::error::{LogError, Result};
use self::read::{Found, PlannedBatch, Source, read_planned};
pub use self::segment::{FrameHeader, Payload, StoredBatch};
pub use self::sent::{SentBatch, SentMessage};
use self::store::StreamObject;
pub use self::store::{
    DEFAULT_BATCH_BYTES, DEFAULT_CACHE_BYTES, KvChain, KvRun, KvRunEntries, KvRunWriter, LogStore,
    LogStoreConfig, StoreCrash, StoreFailpoint, check_store_url, default_interval,
};
pub use self::write::{Write, WriteOp, WriteStream, Writer, WriterTag};
use self::writers::Writers;
pub use self::writers::{MAX_RECALL_BYTES, MAX_WRITERS, WriterBatch};

/// Where a bucket's log is in its log store ([`LogTablet::store_usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreUsage {
    /// The stream objects its retained log is read from (a pack counted once).
    pub stream_objects: u64,
    /// The bytes of its retained log in them.
    pub stream_bytes: u64,
    /// The bytes of its log after them: in WAL objects only (a restart reads them from
    /// there), until the segment holding them is sealed and uploaded.
    pub wal_bytes: u64,
}

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
    /// The object store that is the log's durable home (`--log-store`); `None`: the
    /// local segments are, fsynced as `sync` says. With a store, the local segments are a
    /// copy of it and never fsynced; `sync` does not apply to them.
    pub store: Option<Arc<LogStore>>,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            sync: true,
            segment_bytes: 128 << 20,
            segment_max_age: Duration::from_secs(3600),
            cache_bytes: 32 << 20,
            store: None,
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
    /// The idempotent writer that wrote the batch, if one did.
    pub writer: Option<WriterTag>,
    /// Size of the batch in the log, in bytes.
    pub size: u64,
}

impl mink_core::log_range::OffsetBatch for LogBatch {
    fn base_offset(&self) -> i64 {
        self.base_offset
    }

    fn num_rows(&self) -> usize {
        self.batch.num_rows()
    }

    fn slice(mut self, start: usize, len: usize) -> Self {
        self.batch = self.batch.slice(start, len);
        self.changes = (self.changes.take()).map(|changes| changes[start..start + len].to_vec());
        self.base_offset += start as i64;
        self.last_offset = self.base_offset + len as i64 - 1;
        self
    }
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

/// The log of one bucket.
#[derive(Debug)]
pub struct LogTablet {
    shared: Arc<Shared>,
    writes: mpsc::Sender<Request>,
}

#[derive(Debug)]
struct Shared {
    label: String,
    dir: PathBuf,
    /// The log store the log is kept in, and the bucket's key there.
    store: Option<(Arc<LogStore>, String)>,
    state: RwLock<LogState>,
    watermark: watch::Sender<i64>,
    /// The last batch of each recent checked writer (see the `writers` module).
    writers: Writers,
}

#[derive(Debug)]
struct LogState {
    /// Every retained batch, oldest first, with the base offset of its segment.
    batches: VecDeque<(FrameHeader, i64)>,
    log_start: i64,
    high_watermark: i64,
    active_segment: i64,
    /// The sealed segments in the log store, by base offset: read from their stream
    /// objects, not from local files.
    streamed: BTreeMap<i64, Arc<StreamObject>>,
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
            .send(Request::Write(WriteRequest { write, reply }))
            .await
            .map_err(|_| closed())?;
        ack.await.map_err(|_| closed())?
    }

    /// Hands the bucket over to another node: seals its log after every write queued
    /// before, refuses every write after ([`LogError::HandedOver`]), and resolves once
    /// every frame is in a stream object of the log store, so the node that takes the
    /// bucket over reads its whole log from the store ([`LogStore::take_over`]). Its
    /// frames then hold none of this node's WAL objects back from a checkpoint.
    ///
    /// # Errors
    /// A bucket without a log store, a seal that failed, or a segment that could not be
    /// uploaded (the bucket stays here, refusing writes; a restart of the node takes it
    /// back from its WAL objects).
    pub async fn hand_over(&self) -> Result<()> {
        let Some((store, key)) = &self.shared.store else {
            return Err(LogError::InvalidArgument(format!(
                "bucket {} has no log store to be handed over through",
                self.shared.label
            )));
        };
        let closed = || LogError::ShuttingDown(format!("bucket {}", self.shared.label));
        let (reply, sealed) = oneshot::channel();
        self.writes
            .send(Request::HandOver(reply))
            .await
            .map_err(|_| closed())?;
        sealed.await.map_err(|_| closed())??;
        store.uploads_done().await?;
        let state = self.shared.read_state();
        if let Some((_, segment)) =
            (state.batches.iter()).find(|(_, segment)| !state.streamed.contains_key(segment))
        {
            return Err(LogError::Store(format!(
                "bucket {}: its segment at offset {segment} is not in the store",
                self.shared.label
            )));
        }
        store.release(key);
        Ok(())
    }

    /// The bucket is dropped: with a log store, no restart needs its frames any more, so
    /// they hold no WAL object back from the store's checkpoints, and its stream objects
    /// go after a grace (packs stay).
    pub fn forget(&self) {
        if let Some((store, key)) = &self.shared.store {
            store.forget(key);
        }
    }

    /// The directory the log is in (with a log store, its bucket's key there).
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// `(log_start, high_watermark)`.
    pub fn offsets(&self) -> (i64, i64) {
        let state = self.shared.read_state();
        (state.log_start, state.high_watermark)
    }

    /// Where the log is in its log store, for operators; `None` without a store.
    pub fn store_usage(&self) -> Option<StoreUsage> {
        self.shared.store.as_ref()?;
        let state = self.shared.read_state();
        let objects: HashSet<_> = (state.streamed.values())
            .map(|streamed| &streamed.object.path)
            .collect();
        let (mut stream_bytes, mut wal_bytes) = (0, 0);
        for (header, segment) in &state.batches {
            match state.streamed.contains_key(segment) {
                true => stream_bytes += header.frame_len(),
                false => wal_bytes += header.frame_len(),
            }
        }
        Some(StoreUsage {
            stream_objects: objects.len() as u64,
            stream_bytes,
            wal_bytes,
        })
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
        let shared = Arc::clone(&self.shared);
        tokio::task::spawn_blocking(move || read_planned(shared.source(), plan, convert))
            .await
            .map_err(|e| LogError::Io(std::io::Error::other(e)))?
    }

    /// The batches of writer `producer_id` in the log from `from` (or the log's start, if
    /// later) to the high watermark, oldest first, found by their tags; at most
    /// `max_bytes` of the log are read.
    ///
    /// # Errors
    /// A read failed, or the range holds more than `max_bytes` (nothing is returned then:
    /// the writer's batches past them are unknown).
    pub async fn batches_of_writer(
        &self,
        producer_id: i64,
        from: i64,
        max_bytes: u64,
    ) -> Result<Vec<WriterBatch>> {
        const CHUNK_BYTES: u64 = 8 << 20;
        let (log_start, high_watermark) = self.offsets();
        let (mut offset, mut read) = (from.clamp(log_start, high_watermark), 0u64);
        let mut found = Vec::new();
        while offset < high_watermark {
            let frames = self.read_frames(offset, CHUNK_BYTES).await?;
            for frame in &frames {
                read += frame.header.frame_len();
                if let Some(tag) = frame.payload.writer
                    && tag.producer_id == producer_id
                {
                    found.push(WriterBatch {
                        tag,
                        base_offset: frame.header.base_offset,
                        last_offset: frame.header.last_offset(),
                    });
                }
            }
            if read > max_bytes {
                return Err(LogError::InvalidArgument(format!(
                    "more than {max_bytes} bytes of bucket {} lie from offset {from} to its high watermark {high_watermark}: writer {producer_id}'s batches there are not looked for",
                    self.shared.label
                )));
            }
            offset = frames
                .last()
                .map_or(high_watermark, |frame| frame.header.last_offset() + 1);
        }
        Ok(found)
    }

    /// Bytes of the log from the batch holding `offset` (or the log's start) to the high
    /// watermark, from the frame headers: nothing is read.
    pub fn bytes_from(&self, offset: i64) -> u64 {
        let state = self.shared.read_state();
        let first = (state.batches).partition_point(|(header, _)| header.last_offset() < offset);
        (state.batches.range(first..))
            .map(|(header, _)| header.frame_len())
            .sum()
    }

    /// Before a checked writer's batches numbered from `first_sequence` are written: the
    /// batches of the writer the log holds from `since` on, which the tablet then
    /// remembers, when those may be among them (the tablet does not know the writer, or
    /// its last batch known is not below `first_sequence`); none otherwise. The appender
    /// answers a batch sent again with its earlier write; these name that write's
    /// offsets when the appender no longer knows them. See the `writers` module.
    ///
    /// # Errors
    /// As [`LogTablet::batches_of_writer`], with [`MAX_RECALL_BYTES`].
    pub async fn recall_writer(
        &self,
        producer_id: i64,
        first_sequence: i32,
        since: i64,
    ) -> Result<Vec<WriterBatch>> {
        let last = self.shared.writers.last(producer_id);
        if last.is_some_and(|last| last.tag.last_sequence < first_sequence) {
            return Ok(Vec::new());
        }
        let found = (self.batches_of_writer(producer_id, since, MAX_RECALL_BYTES)).await?;
        self.shared.writers.record(found.last().copied());
        Ok(found)
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
                stream: state.streamed.get(segment).cloned(),
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

    /// The commit time (ms since the epoch) of the batch holding `offset`; `None` for an
    /// offset at or past the high watermark or before the log's start.
    pub fn commit_time_at(&self, offset: i64) -> Option<i64> {
        let state = self.shared.read_state();
        if offset < state.log_start || offset >= state.high_watermark {
            return None;
        }
        let index = state
            .batches
            .partition_point(|(h, _)| h.last_offset() < offset);
        state.batches.get(index).map(|(h, _)| h.commit_timestamp)
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
            // A segment in the log store stays there (its upkeep is not the tablet's).
            if state.streamed.remove(&segment).is_none() {
                remove_segment_files(&self.shared.dir, segment)?;
            }
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
            if let Some((store, key)) = &self.shared.store {
                store.trim(key, state.log_start);
            }
        }
        Ok(removed)
    }
}

impl Shared {
    /// Where the tablet's batches are read from.
    fn source(&self) -> Source<'_> {
        Source {
            dir: &self.dir,
            label: &self.label,
            store: self.store.as_ref().map(|(store, _)| store.as_ref()),
        }
    }

    /// The sealed segment at `base` is in the log store as `object`: it is read from
    /// there from now on (unless retention removed it first).
    pub(crate) fn streamed(&self, base: i64, object: Arc<StreamObject>) {
        let mut state = self.write_state();
        if base >= state.log_start {
            state.streamed.insert(base, object);
        }
    }

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

pub(crate) use mink_core::clock::now_ms;

#[cfg(test)]
mod tests;
