//! Log tablets: the durable, ordered log of one bucket.
//!
//! A [`LogTablet`] is an append-only sequence of Arrow batches. Every row gets the next
//! offset; a batch has `base_offset..=last_offset`, a commit timestamp (monotonic within
//! the bucket) and the `schema_id` it was written with.
//!
//! ```text
//!   writers ──append──▶ appender task ──group commit──▶ active segment ──fsync──▶ HW moves
//!                                                              │                  │
//!   readers ◀── log cache (recent batches, decoded) ◀──────────┘         Tail waiters wake
//!           ◀── sealed segments + offset index (readahead) for history
//! ```
//!
//! * **Durability.** One appender task per tablet takes every pending append, writes their
//!   frames, fsyncs once (group commit) and only then moves the high watermark and
//!   acknowledges. Readers never see past the high watermark, so nothing a crash can take
//!   back is ever observed. With `sync = false` the fsync is skipped (tests, benchmarks).
//! * **Recovery.** On open, sealed segments are read from their offset index and the active
//!   segment is scanned; a torn tail (a crash mid-write) is truncated.
//! * **Retention.** With a `log.ttl`, whole sealed segments older than the TTL are deleted
//!   and `log_start` moves to the first remaining offset.

mod cache;
mod segment;

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arrow::array::RecordBatch;
use mink_core::protocol::AppendAck;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{info, warn};

use self::cache::LogCache;
pub(crate) use self::segment::StoredBatch;
use self::segment::{FrameHeader, HEADER_LEN};
use crate::error::{NodeError, Result};

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
    /// Size of the batch in the log, in bytes.
    pub size: u64,
}

/// The log of one bucket.
#[derive(Debug)]
pub struct LogTablet {
    shared: Arc<Shared>,
    appends: mpsc::Sender<AppendRequest>,
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

#[derive(Debug)]
struct AppendRequest {
    stored: StoredBatch,
    schema_id: u32,
    reply: oneshot::Sender<Result<AppendAck>>,
}

/// Most appends one group commit takes.
const MAX_GROUP: usize = 256;

impl LogTablet {
    /// Opens (or creates) the log in `dir`, recovering it after a crash, and starts its
    /// appender task on the current tokio runtime.
    pub fn open(label: String, dir: &Path, config: LogConfig) -> Result<Self> {
        create_durable_dir(dir)?;
        let recovered = recover(&label, dir)?;
        let (watermark, _) = watch::channel(recovered.next_offset);
        let mut cache = LogCache::new(config.cache_bytes);
        cache.truncate_before(recovered.next_offset);
        let shared = Arc::new(Shared {
            label,
            dir: dir.to_path_buf(),
            state: RwLock::new(LogState {
                log_start: recovered.log_start,
                high_watermark: recovered.next_offset,
                active_segment: recovered.active.base,
                batches: recovered.batches,
                cache,
            }),
            watermark,
        });
        let (appends, requests) = mpsc::channel(1024);
        let appender = Appender {
            shared: Arc::clone(&shared),
            config,
            active: recovered.active,
            next_offset: recovered.next_offset,
            last_timestamp: recovered.last_timestamp,
        };
        tokio::spawn(appender.run(requests));
        Ok(Self { shared, appends })
    }

    /// Appends a batch; resolves once it is durable and visible, with its offsets.
    pub async fn append(
        &self,
        batch: RecordBatch,
        schema_id: u32,
        changes: Option<Vec<u8>>,
    ) -> Result<AppendAck> {
        if batch.num_rows() == 0 {
            return Err(NodeError::InvalidArgument(
                "an empty batch cannot be appended".into(),
            ));
        }
        let (reply, ack) = oneshot::channel();
        let request = AppendRequest {
            stored: StoredBatch { batch, changes },
            schema_id,
            reply,
        };
        let closed = || NodeError::ShuttingDown(format!("bucket {}", self.shared.label));
        self.appends.send(request).await.map_err(|_| closed())?;
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
        let plan = self.plan_read(offset, max_bytes)?;
        if plan.iter().all(|p| p.cached.is_some()) {
            return Ok(plan.into_iter().map(PlannedBatch::into_cached).collect());
        }
        let dir = self.shared.dir.clone();
        let label = self.shared.label.clone();
        tokio::task::spawn_blocking(move || read_planned(&dir, &label, plan))
            .await
            .map_err(|e| NodeError::Io(std::io::Error::other(e)))?
    }

    fn plan_read(&self, offset: i64, max_bytes: u64) -> Result<Vec<PlannedBatch>> {
        let state = self.shared.read_state();
        if offset < state.log_start || offset > state.high_watermark {
            return Err(NodeError::OffsetOutOfRange {
                bucket: self.shared.label.clone(),
                offset,
                log_start: state.log_start,
                high_watermark: state.high_watermark,
            });
        }
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
                    return Err(NodeError::ShuttingDown(format!(
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

    /// Deletes the sealed segments whose every batch is older than `ttl`; returns how many.
    pub fn enforce_retention(&self, ttl: Duration) -> Result<usize> {
        let cutoff = now_ms() - i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let mut state = self.shared.write_state();
        let mut removed = 0;
        while let Some(&(_, segment)) = state.batches.front() {
            if segment == state.active_segment {
                break;
            }
            let end = state.batches.partition_point(|(_, s)| *s == segment);
            let newest = state.batches[end - 1].0.commit_timestamp;
            if newest >= cutoff {
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

#[derive(Debug)]
struct PlannedBatch {
    header: FrameHeader,
    segment: i64,
    cached: Option<Arc<StoredBatch>>,
}

impl PlannedBatch {
    fn into_cached(self) -> LogBatch {
        let stored = self.cached.expect("checked by the caller");
        to_log_batch(&self.header, &stored)
    }
}

fn to_log_batch(header: &FrameHeader, stored: &StoredBatch) -> LogBatch {
    LogBatch {
        base_offset: header.base_offset,
        last_offset: header.last_offset(),
        commit_timestamp: header.commit_timestamp,
        schema_id: header.schema_id,
        batch: stored.batch.clone(),
        changes: stored.changes.clone(),
        size: u64::from(header.payload_len),
    }
}

/// Reads the planned batches that are not cached from their segments. Consecutive frames
/// of one segment are read with a single positioned read (readahead over the whole span).
fn read_planned(dir: &Path, label: &str, plan: Vec<PlannedBatch>) -> Result<Vec<LogBatch>> {
    let mut result = Vec::with_capacity(plan.len());
    let mut index = 0;
    while index < plan.len() {
        if let Some(stored) = &plan[index].cached {
            result.push(to_log_batch(&plan[index].header, stored));
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
                NodeError::Corrupt(format!(
                    "segment {segment} of bucket {label} was removed by retention during the read; read again from log_start"
                ))
            } else {
                e.into()
            }
        })?;
        let mut span = vec![0u8; usize::try_from(end - start).unwrap_or(usize::MAX)];
        file.read_exact_at(&mut span, start)?;
        for planned in &plan[index..run_end] {
            let from = (planned.header.position - start) as usize + HEADER_LEN;
            let payload = &span[from..from + planned.header.payload_len as usize];
            let stored = segment::decode_payload(&planned.header, payload)?;
            result.push(to_log_batch(&planned.header, &stored));
        }
        index = run_end;
    }
    Ok(result)
}

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
    Ok(())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Creates `dir` and its missing ancestors, fsyncing each parent that gained an entry, so
/// a new tablet directory survives a machine crash.
fn create_durable_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_durable_dir(parent)?;
        std::fs::create_dir(dir).or_else(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Ok(()),
            _ => Err(e),
        })?;
        sync_dir(parent)?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// The segment being appended to.
#[derive(Debug)]
struct ActiveSegment {
    base: i64,
    file: File,
    len: u64,
    frames: Vec<FrameHeader>,
}

impl ActiveSegment {
    fn create(dir: &Path, base: i64) -> Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(segment::segment_path(dir, base))?;
        sync_dir(dir)?;
        Ok(Self {
            base,
            file,
            len: 0,
            frames: Vec::new(),
        })
    }
}

/// What recovery found on disk.
#[derive(Debug)]
struct Recovered {
    batches: VecDeque<(FrameHeader, i64)>,
    log_start: i64,
    next_offset: i64,
    last_timestamp: i64,
    active: ActiveSegment,
}

fn recover(label: &str, dir: &Path) -> Result<Recovered> {
    let bases = segment::list_segments(dir)?;
    let mut batches = VecDeque::new();
    let mut next_offset = bases.first().copied().unwrap_or(0);
    let log_start = next_offset;
    for (i, &base) in bases.iter().enumerate() {
        if base != next_offset {
            return Err(NodeError::Corrupt(format!(
                "bucket {label}: segment {base} follows a log that ends at {next_offset}"
            )));
        }
        let is_active = i + 1 == bases.len();
        let sealed_index = (!is_active)
            .then(|| segment::read_index(dir, base))
            .flatten();
        let frames = match sealed_index {
            Some(frames) => frames,
            None => {
                let path = segment::segment_path(dir, base);
                let outcome = segment::scan_frames(&path, base)?;
                if outcome.torn {
                    if !is_active {
                        return Err(NodeError::Corrupt(format!(
                            "bucket {label}: sealed segment {base} is damaged at byte {}",
                            outcome.valid_len
                        )));
                    }
                    warn!(
                        bucket = label,
                        segment = base,
                        valid_len = outcome.valid_len,
                        "truncating a torn log tail"
                    );
                    let file = OpenOptions::new().write(true).open(&path)?;
                    file.set_len(outcome.valid_len)?;
                    file.sync_all()?;
                }
                outcome.frames
            }
        };
        if let Some(last) = frames.last() {
            next_offset = last.last_offset() + 1;
        }
        batches.extend(frames.into_iter().map(|f| (f, base)));
    }
    let active = match bases.last() {
        Some(&base) => {
            let path = segment::segment_path(dir, base);
            let file = OpenOptions::new().append(true).open(&path)?;
            let len = file.metadata()?.len();
            let frames = batches
                .iter()
                .filter(|(_, s)| *s == base)
                .map(|(f, _)| *f)
                .collect();
            let _ = std::fs::remove_file(segment::index_path(dir, base));
            ActiveSegment {
                base,
                file,
                len,
                frames,
            }
        }
        None => ActiveSegment::create(dir, 0)?,
    };
    let last_timestamp = batches.back().map_or(0, |(h, _)| h.commit_timestamp);
    Ok(Recovered {
        batches,
        log_start,
        next_offset,
        last_timestamp,
        active,
    })
}

/// The single writer of a tablet.
#[derive(Debug)]
struct Appender {
    shared: Arc<Shared>,
    config: LogConfig,
    active: ActiveSegment,
    next_offset: i64,
    last_timestamp: i64,
}

impl Appender {
    async fn run(mut self, mut requests: mpsc::Receiver<AppendRequest>) {
        while let Some(first) = requests.recv().await {
            let mut group = vec![first];
            while group.len() < MAX_GROUP {
                match requests.try_recv() {
                    Ok(request) => group.push(request),
                    Err(_) => break,
                }
            }
            let joined = tokio::task::spawn_blocking(move || {
                let outcome = self.commit(&group);
                (self, group, outcome)
            })
            .await;
            let (appender, group, outcome) = match joined {
                Ok(done) => done,
                Err(e) => {
                    warn!(error = %e, "log appender stopped");
                    return;
                }
            };
            self = appender;
            match outcome {
                Ok(acks) => {
                    for (request, ack) in group.into_iter().zip(acks) {
                        let _ = request.reply.send(Ok(ack));
                    }
                }
                Err(error) => {
                    warn!(bucket = %self.shared.label, %error, "append failed and was rolled back");
                    for request in group {
                        let _ = request.reply.send(Err(error.for_another_waiter()));
                    }
                }
            }
        }
    }

    /// Writes a group of appends, makes it durable, then publishes it. On an I/O error
    /// the segment is cut back to where it was, so the log stays exactly as acknowledged.
    fn commit(&mut self, group: &[AppendRequest]) -> Result<Vec<AppendAck>> {
        self.roll_if_needed().map_err(|e| self.classify(e))?;
        let (start_len, start_frames, start_offset) =
            (self.active.len, self.active.frames.len(), self.next_offset);
        let written = self.write_group(group);
        let written = written.and_then(|written| {
            if self.config.sync {
                self.active.file.sync_data()?;
            }
            Ok(written)
        });
        let written = match written {
            Ok(written) => written,
            Err(error) => {
                self.active.frames.truncate(start_frames);
                self.active.len = start_len;
                self.next_offset = start_offset;
                if let Err(e) = self.active.file.set_len(start_len) {
                    warn!(bucket = %self.shared.label, error = %e, "could not cut back a failed write");
                }
                return Err(self.classify(error));
            }
        };
        let mut state = self.shared.write_state();
        let mut acks = Vec::with_capacity(group.len());
        for (header, request) in written.iter().zip(group) {
            state.batches.push_back((*header, self.active.base));
            let stored = Arc::new(request.stored.clone());
            state
                .cache
                .insert(header.base_offset, stored, u64::from(header.payload_len));
            acks.push(AppendAck {
                base_offset: header.base_offset,
                last_offset: header.last_offset(),
                high_watermark: self.next_offset,
            });
        }
        state.high_watermark = self.next_offset;
        state.active_segment = self.active.base;
        drop(state);
        self.shared.watermark.send_replace(self.next_offset);
        Ok(acks)
    }

    fn write_group(&mut self, group: &[AppendRequest]) -> Result<Vec<FrameHeader>> {
        let mut written = Vec::with_capacity(group.len());
        for request in group {
            self.last_timestamp = self.last_timestamp.max(now_ms());
            let mut header = FrameHeader {
                base_offset: self.next_offset,
                records: u32::try_from(request.stored.batch.num_rows()).map_err(|_| {
                    NodeError::InvalidArgument("a batch of more than 2^32 rows".into())
                })?,
                commit_timestamp: self.last_timestamp,
                schema_id: request.schema_id,
                has_changes: false,
                position: self.active.len,
                payload_len: 0,
            };
            let frame = segment::encode_frame(&mut header, &request.stored)?;
            self.active.file.write_all(&frame)?;
            self.active.len += frame.len() as u64;
            self.active.frames.push(header);
            self.next_offset = header.last_offset() + 1;
            written.push(header);
        }
        Ok(written)
    }

    fn roll_if_needed(&mut self) -> Result<()> {
        let Some(first) = self.active.frames.first() else {
            return Ok(());
        };
        let age = now_ms() - first.commit_timestamp;
        let too_old =
            age > i64::try_from(self.config.segment_max_age.as_millis()).unwrap_or(i64::MAX);
        if self.active.len < self.config.segment_bytes && !too_old {
            return Ok(());
        }
        self.active.file.sync_data()?;
        segment::write_index(&self.shared.dir, self.active.base, &self.active.frames)?;
        self.active = ActiveSegment::create(&self.shared.dir, self.next_offset)?;
        Ok(())
    }

    fn classify(&self, error: NodeError) -> NodeError {
        match error {
            NodeError::Io(source)
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::StorageFull
                        | std::io::ErrorKind::FileTooLarge
                        | std::io::ErrorKind::QuotaExceeded
                ) =>
            {
                NodeError::DiskFull {
                    bucket: self.shared.label.clone(),
                    source,
                }
            }
            other => other,
        }
    }
}
