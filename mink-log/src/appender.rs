//! The single writer of a tablet: group commit of appends.
//!
//! The appender takes every pending write, turns each into the batch the log stores (for
//! a primary-key table, its changelog: see [`Changelog`]), writes the frames, fsyncs
//! once, moves the high watermark, lets the changelog hook apply the writes (the KV
//! store), and only then acknowledges. The high watermark moves first so that the KV
//! store's applied offset, which a Snapshot names, is never above it.
//!
//! Frames are written at explicit positions (`pwrite` at the segment's known length),
//! never through the file cursor. A failed write or fsync cuts the segment back to its
//! length before the group (`set_len`) and aborts the hook, so the segment is byte for
//! byte what it was and the next group lands right after the last good frame: no hole of
//! zeros that recovery would take for a torn tail. A cut that fails itself is retried
//! before the next group writes anything.
//!
//! # The stop rule
//!
//! A client stream (a DoPut) queues its writes ahead of their acknowledgements, so the
//! writes after one that fails may already wait in the same group or a later one. The
//! client retries from the first write it got no ack for: none of the writes after it
//! may be written. Writes that carry a [`WriteStream`] (their [`Write::stream`]) keep
//! this rule:
//!
//! ```text
//!   group n:    [s:1] [s:2 refused] [t:7] [s:3]      s:3 not written: s stopped at s:2
//!   group n+1:  [s:4] [t:8]                          s:4 not written; t goes on
//!   group m:    [t:9] [u:1]  <- I/O error, cut back  t and u stopped: nothing written
//!   group m+1:  [t:10] [u:2] [v:1]                   only v:1 is written
//! ```
//!
//! * A write refused at append time stops its stream; a group that fails stops the
//!   stream of every write in it.
//! * Before a write is prepared, the appender checks its stream: a stopped stream's write
//!   is refused, takes no offset and leaves no byte.
//!
//! A DoPut writes one bucket, and its one appender takes the writes in the order they
//! were queued and sets and reads the flags itself, between and within groups: no write
//! queued after a failure of its stream is ever written, whichever group it lands in.
//! Writes before the failure are untouched, so those acknowledged read back once.
//!
//! # Durable means written
//!
//! An error answered to a write means it is not in the log and never will be: no write
//! is answered with an error once its group is durable. The only failure that can come
//! after that point is the KV store's update of a primary-key table's group (it runs
//! after the fsync, and beside the next group's write: see [`Changelog::commit`]). Such a
//! group is in the log, and log readers already see it; a restart replays it into the
//! store. So it is acknowledged, and the bucket is fenced instead:
//!
//! * the group whose update failed, and the group written while that update ran (durable
//!   too when the failure is found, at its own commit), are acknowledged;
//! * the store takes no more groups and answers no reads, since a read would miss
//!   acknowledged writes (mink-kv's `KvTablet::fence`);
//! * the bucket refuses every later write before writing anything, with `UNAVAILABLE`
//!   and the store's error ("restart the node");
//! * a restart replays the log from the store's applied offset, and the store holds
//!   every acknowledged write again.
//!
//! ```text
//!   group n:    written, fsynced, published | update n fails -> n acknowledged, fenced
//!   group n+1:  written, fsynced, published | finds n's failure -> n+1 acknowledged
//!   group n+2:  refused before a byte is written: "restart the node"
//! ```

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use mink_core::protocol::AppendAck;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{error, warn};

use super::cache::LogCache;
use super::changelog::replay;
use super::read::Source;
use super::recovery::{ActiveSegment, prepend_streamed, recover};
use super::segment::{self, CachedBatch, FrameHeader, StoredBatch};
use super::store::Sealed;
use super::writers::{Check, WriterBatch, Writers, check};
use super::{
    Applying, Changelog, LogConfig, LogState, Shared, Write, WriteOp, WriteStream, Writer, now_ms,
};
use crate::error::{LogError, Result};

/// Most writes one group commit takes.
const MAX_GROUP: usize = 256;

/// What a tablet asks of its appender, in order.
#[derive(Debug)]
pub(super) enum Request {
    /// A write.
    Write(WriteRequest),
    /// Seal the active segment after the writes before and refuse every write after: the
    /// bucket goes to another node ([`LogTablet::hand_over`](crate::LogTablet::hand_over)).
    HandOver(oneshot::Sender<Result<()>>),
}

/// One write waiting for its acknowledgement.
#[derive(Debug)]
pub(super) struct WriteRequest {
    pub(super) write: Write,
    pub(super) reply: oneshot::Sender<Result<AppendAck>>,
}

impl WriteRequest {
    /// Whether an earlier write of this write's stream was refused or failed.
    fn stream_stopped(&self) -> bool {
        self.write.stream.as_ref().is_some_and(WriteStream::stopped)
    }

    /// This write was refused or failed: no later write of its stream is written.
    fn stop_stream(&self) {
        if let Some(stream) = &self.write.stream {
            stream.stop();
        }
    }
}

/// Answers each write of a group with its outcome.
fn acknowledge(group: Vec<WriteRequest>, outcomes: Vec<Result<AppendAck>>) {
    for (request, outcome) in group.into_iter().zip(outcomes) {
        let _ = request.reply.send(outcome);
    }
}

/// What became of one write of a group.
#[derive(Debug)]
enum Outcome {
    /// Stored as this frame.
    Written(FrameHeader, Arc<CachedBatch>),
    /// Nothing to store (a delete of missing keys), at this offset.
    Nothing(i64),
    /// Written before, by an earlier attempt of its checked writer: that write, when it
    /// is known.
    Duplicate(Option<WriterBatch>),
    /// Refused; the rest of the group goes on.
    Refused(LogError),
}

/// The single writer of a tablet.
#[derive(Debug)]
pub(super) struct Appender {
    pub(super) shared: Arc<Shared>,
    pub(super) config: LogConfig,
    pub(super) active: ActiveSegment,
    pub(super) next_offset: i64,
    pub(super) last_timestamp: i64,
    pub(super) changelog: Option<Box<dyn Changelog>>,
    /// Set when the KV store could not be updated after a durable write: the bucket
    /// refuses writes until a restart replays the log into the store.
    pub(super) broken: Option<String>,
    /// Set when a failed group could not be cut back: the segment may hold bytes past
    /// `active.len`, and no group is written until the cut succeeds.
    pub(super) uncut: bool,
    /// The frames of the group being committed, for the log store.
    pub(super) group_frames: Vec<Bytes>,
    /// The last batch of each checked writer the group being committed wrote: the
    /// tablet's record of writers takes them once the group is durable.
    pub(super) group_writers: HashMap<i64, WriterBatch>,
    /// Set once the bucket is handed over to another node: every later write is refused.
    pub(super) handed_over: bool,
    /// Injected I/O failures (unit tests).
    #[cfg(test)]
    pub(super) faults: Faults,
}

/// I/O failures a unit test injects into the appender, as a full disk produces them.
#[cfg(test)]
#[derive(Debug, Default)]
pub(super) struct Faults {
    /// The active segment cannot grow past this length: a write across it stores the part
    /// that fits, then fails with `StorageFull`.
    pub(super) space: Option<u64>,
    /// Every fsync fails.
    pub(super) fail_sync: bool,
    /// Cutting a segment back fails this many more times.
    pub(super) fail_cuts: u32,
}

/// Queues for upload the sealed segments a tablet opened with that are not in the log
/// store yet (a log rebuilt from WAL objects rolls into several).
fn upload_sealed_segments(shared: &Arc<Shared>) {
    let Some((store, key)) = &shared.store else {
        return;
    };
    let state = shared.read_state();
    let local = state.batches.iter().filter(|(_, segment)| {
        *segment != state.active_segment && !state.streamed.contains_key(segment)
    });
    let mut sealed: BTreeMap<i64, Vec<FrameHeader>> = BTreeMap::new();
    for (header, segment) in local {
        sealed.entry(*segment).or_default().push(*header);
    }
    for (base, frames) in sealed {
        store.upload(Sealed {
            key: key.clone(),
            dir: shared.dir.clone(),
            base,
            frames,
            tablet: Arc::downgrade(shared),
        });
    }
}

impl Appender {
    /// Recovers the log in `dir` (creating it if needed) and brings the changelog hook,
    /// if any, in line with it: the appender of that log, not yet running.
    pub(super) fn recover(
        label: String,
        dir: &Path,
        config: LogConfig,
        mut changelog: Option<Box<dyn Changelog>>,
    ) -> Result<Self> {
        mink_durable::create_dir_all(dir)?;
        let store = match &config.store {
            Some(store) => Some((Arc::clone(store), store.key_of(dir)?)),
            None => None,
        };
        let mut recovered = recover(&label, dir)?;
        let streamed = match &store {
            Some((store, key)) => {
                prepend_streamed(&label, &mut recovered, store.take_streamed(key))?
            }
            None => BTreeMap::new(),
        };
        if let Some(changelog) = &mut changelog {
            let source = Source {
                dir,
                label: &label,
                store: store.as_ref().map(|(store, _)| store.as_ref()),
            };
            replay(
                source,
                &recovered.batches,
                &streamed,
                recovered.next_offset,
                changelog.as_mut(),
            )?;
        }
        let (watermark, _) = watch::channel(recovered.next_offset);
        let mut cache = LogCache::new(config.cache_bytes);
        cache.truncate_before(recovered.next_offset);
        let shared = Arc::new(Shared {
            label,
            dir: dir.to_path_buf(),
            store,
            state: RwLock::new(LogState {
                log_start: recovered.log_start,
                high_watermark: recovered.next_offset,
                active_segment: recovered.active.base,
                batches: recovered.batches,
                streamed,
                cache,
            }),
            watermark,
            writers: Writers::default(),
        });
        upload_sealed_segments(&shared);
        Ok(Self {
            shared,
            config,
            active: recovered.active,
            next_offset: recovered.next_offset,
            last_timestamp: recovered.last_timestamp,
            changelog,
            broken: None,
            uncut: false,
            group_frames: Vec::new(),
            group_writers: HashMap::new(),
            handed_over: false,
            #[cfg(test)]
            faults: Faults::default(),
        })
    }

    pub(super) async fn run(mut self, mut requests: mpsc::Receiver<Request>) {
        loop {
            let next = match self.idle_seal_after() {
                None => requests.recv().await,
                Some(idle) => match tokio::time::timeout(idle, requests.recv()).await {
                    Ok(next) => next,
                    Err(_idle) => {
                        let Some((appender, ())) = self.blocking(Self::seal_idle).await else {
                            return;
                        };
                        self = appender;
                        continue;
                    }
                },
            };
            let (mut group, mut hand_over) = (Vec::new(), None);
            match next {
                None => break,
                Some(Request::Write(first)) => group.push(first),
                Some(Request::HandOver(reply)) => hand_over = Some(reply),
            }
            while hand_over.is_none() && !group.is_empty() && group.len() < MAX_GROUP {
                match requests.try_recv() {
                    Ok(Request::Write(request)) => group.push(request),
                    Ok(Request::HandOver(reply)) => hand_over = Some(reply),
                    Err(_) => break,
                }
            }
            if !group.is_empty() {
                let committed = self
                    .blocking(|appender| {
                        let outcome = appender.commit(&group);
                        (group, outcome)
                    })
                    .await;
                let Some((appender, (group, outcome))) = committed else {
                    return;
                };
                self = appender;
                self.answer(group, outcome);
            }
            if let Some(reply) = hand_over {
                let Some((appender, outcome)) = self.blocking(Self::hand_over).await else {
                    return;
                };
                self = appender;
                let _ = reply.send(outcome);
            }
        }
        // Dropping the changelog waits for its last update: not on a runtime thread.
        let _ = tokio::task::spawn_blocking(move || drop(self)).await;
    }

    /// Runs `work` on the appender on a blocking thread; `None` if the thread panicked
    /// (the appender is lost with it, and the tablet stops).
    async fn blocking<T: Send + 'static>(
        mut self,
        work: impl FnOnce(&mut Self) -> T + Send + 'static,
    ) -> Option<(Self, T)> {
        let joined = tokio::task::spawn_blocking(move || {
            let outcome = work(&mut self);
            (self, outcome)
        })
        .await;
        match joined {
            Ok(done) => Some(done),
            Err(e) => {
                error!(error = %e, "log appender stopped");
                None
            }
        }
    }

    /// Answers a committed group: at once, or once the KV store's update ends.
    fn answer(
        &self,
        group: Vec<WriteRequest>,
        outcome: Result<(Vec<Result<AppendAck>>, Applying)>,
    ) {
        match outcome {
            // Nothing left to apply (a log table): acknowledged now.
            Ok((outcomes, Applying(None))) => acknowledge(group, outcomes),
            // The KV store's update runs on while the next group is written; the
            // group is acknowledged once readers see it, or once the update failed:
            // it is durable all the same (see "Durable means written").
            Ok((outcomes, applying)) => {
                let label = self.shared.label.clone();
                tokio::spawn(async move {
                    if let Err(error) = applying.wait().await {
                        error!(bucket = %label, %error, "KV store update failed after a durable write: the bucket is fenced until a restart");
                    }
                    acknowledge(group, outcomes);
                });
            }
            Err(error) => {
                warn!(bucket = %self.shared.label, %error, "write failed and was rolled back");
                for request in group {
                    let _ = request.reply.send(Err(error.for_another_waiter()));
                }
            }
        }
    }

    /// Seals the active segment, so every frame is in a sealed one (uploaded as a stream
    /// object), and refuses every later write.
    fn hand_over(&mut self) -> Result<()> {
        self.handed_over = true;
        if self.uncut {
            self.cut_back()?;
        }
        match self.active.frames.is_empty() {
            true => Ok(()),
            false => self.seal(),
        }
    }

    /// How long the appender waits for a write before it seals its active segment: with a
    /// log store, a segment left open by a bucket that stopped writing would keep its WAL
    /// objects needed by every restart (no checkpoint could pass them) and its frames out
    /// of stream objects.
    fn idle_seal_after(&self) -> Option<Duration> {
        (self.shared.store.is_some() && !self.active.frames.is_empty())
            .then_some(self.config.segment_max_age)
    }

    /// Seals the active segment if its first batch is older than the segment's age limit
    /// (the segment is then uploaded as a stream object).
    fn seal_idle(&mut self) {
        if let Err(error) = self.roll_if_needed() {
            warn!(bucket = %self.shared.label, %error, "sealing an idle segment failed; retried at the next write");
        }
    }

    /// Writes a group, makes it durable, then publishes it. On an I/O error the segment
    /// is cut back to where it was, so the log stays exactly as acknowledged, and every
    /// stream with a write in the group stops (see the stop rule in the module doc). An
    /// error means that no write of the group is in the log.
    fn commit(&mut self, group: &[WriteRequest]) -> Result<(Vec<Result<AppendAck>>, Applying)> {
        let committed = self.commit_group(group);
        if committed.is_err() {
            group.iter().for_each(WriteRequest::stop_stream);
        }
        committed
    }

    fn commit_group(
        &mut self,
        group: &[WriteRequest],
    ) -> Result<(Vec<Result<AppendAck>>, Applying)> {
        if self.broken.is_none() {
            self.broken = self.changelog.as_deref().and_then(Changelog::failure);
        }
        if let Some(reason) = &self.broken {
            return Err(LogError::ShuttingDown(format!(
                "bucket {} (its KV store is behind its log after a failed update; restart \
                 the node: {reason})",
                self.shared.label
            )));
        }
        if self.handed_over {
            return Err(LogError::HandedOver {
                bucket: self.shared.label.clone(),
            });
        }
        if self.uncut {
            self.cut_back().map_err(|e| self.classify(e.into()))?;
        }
        self.roll_if_needed().map_err(|e| self.classify(e))?;
        let (start_len, start_frames, start_offset) =
            (self.active.len, self.active.frames.len(), self.next_offset);
        self.group_frames.clear();
        self.group_writers.clear();
        let written = self.write_group(group).and_then(|outcomes| {
            self.make_durable()?;
            Ok(outcomes)
        });
        let outcomes = match written {
            Ok(outcomes) => outcomes,
            Err(error) => {
                if let Some(changelog) = &mut self.changelog {
                    changelog.abort();
                }
                self.active.frames.truncate(start_frames);
                self.active.len = start_len;
                self.next_offset = start_offset;
                if let Err(e) = self.cut_back() {
                    warn!(bucket = %self.shared.label, error = %e, "could not cut back a failed write; retried before the next one");
                }
                return Err(self.classify(error));
            }
        };
        let end_offset = self.next_offset;
        let acks = self.publish(outcomes);
        (self.shared.writers).record(self.group_writers.drain().map(|(_, batch)| batch));
        let applying = match &mut self.changelog {
            None => Applying::done(),
            Some(changelog) => match changelog.commit(end_offset) {
                Ok(applying) => applying,
                Err(error) => {
                    // The group is durable, the KV store is behind the log: the group is
                    // acknowledged, the bucket fenced, and a restart replays the log.
                    error!(bucket = %self.shared.label, %error, "KV store update failed after a durable write: the bucket is fenced until a restart");
                    self.broken = Some(error.to_string());
                    Applying::done()
                }
            },
        };
        Ok((acks, applying))
    }

    /// Cuts the active segment back to its last good frame (`active.len`) and makes the
    /// cut durable; on failure `uncut` stays set.
    fn cut_back(&mut self) -> io::Result<()> {
        self.uncut = true;
        #[cfg(test)]
        if self.faults.fail_cuts > 0 {
            self.faults.fail_cuts -= 1;
            return Err(io::Error::other("injected: the cut fails"));
        }
        self.active.file.set_len(self.active.len)?;
        if self.syncs_locally() {
            self.sync()?;
        }
        self.uncut = false;
        Ok(())
    }

    /// Makes the group just written durable: in the log store when there is one (the
    /// local segment is a copy of it), else by an fsync of the segment if `sync` is on.
    fn make_durable(&mut self) -> Result<()> {
        match &self.shared.store {
            Some(_) if self.group_frames.is_empty() => Ok(()),
            Some((store, key)) => {
                let frames = std::mem::take(&mut self.group_frames);
                store.persist(key, frames, self.next_offset)
            }
            None if self.config.sync => Ok(self.sync()?),
            None => Ok(()),
        }
    }

    /// Whether the local segments are fsynced: without a log store, if `sync` is on.
    fn syncs_locally(&self) -> bool {
        self.config.sync && self.shared.store.is_none()
    }

    fn sync(&self) -> io::Result<()> {
        #[cfg(test)]
        if self.faults.fail_sync {
            return Err(io::Error::other("injected: fsync fails"));
        }
        self.active.file.sync_data()
    }

    /// Writes one frame at the end of the active segment's good frames.
    fn write_frame(&self, frame: &[u8]) -> io::Result<()> {
        #[cfg(test)]
        if let Some(space) = self.faults.space {
            let room = space.saturating_sub(self.active.len);
            if room < frame.len() as u64 {
                let fits = &frame[..room as usize];
                self.active.file.write_all_at(fits, self.active.len)?;
                return Err(io::ErrorKind::StorageFull.into());
            }
        }
        self.active.file.write_all_at(frame, self.active.len)
    }

    /// Makes written frames visible to readers and returns the acknowledgements.
    fn publish(&mut self, outcomes: Vec<Outcome>) -> Vec<Result<AppendAck>> {
        let high_watermark = self.next_offset;
        let mut state = self.shared.write_state();
        let acks = outcomes
            .into_iter()
            .map(|outcome| match outcome {
                Outcome::Written(header, stored) => {
                    state.batches.push_back((header, self.active.base));
                    // Both forms are kept: the decoded batch and its stored bytes.
                    let size =
                        u64::from(header.payload_len) + stored.batch.get_array_memory_size() as u64;
                    state.cache.insert(header.base_offset, stored, size);
                    Ok(AppendAck {
                        base_offset: header.base_offset,
                        last_offset: header.last_offset(),
                        high_watermark,
                        duplicate: false,
                    })
                }
                Outcome::Nothing(offset) => Ok(AppendAck {
                    base_offset: offset,
                    last_offset: offset - 1,
                    high_watermark,
                    duplicate: false,
                }),
                Outcome::Duplicate(earlier) => Ok(AppendAck {
                    base_offset: earlier.map_or(-1, |batch| batch.base_offset),
                    last_offset: earlier.map_or(-1, |batch| batch.last_offset),
                    high_watermark,
                    duplicate: true,
                }),
                Outcome::Refused(error) => Err(error),
            })
            .collect();
        state.high_watermark = high_watermark;
        state.active_segment = self.active.base;
        drop(state);
        self.shared.watermark.send_replace(high_watermark);
        acks
    }

    /// Prepares and writes every write of the group; only I/O errors fail the group. A
    /// refused write stops its stream, and the writes of a stopped stream are refused.
    fn write_group(&mut self, group: &[WriteRequest]) -> Result<Vec<Outcome>> {
        let mut outcomes = Vec::with_capacity(group.len());
        for request in group {
            if request.stream_stopped() {
                outcomes.push(Outcome::Refused(LogError::InvalidArgument(format!(
                    "not written: an earlier batch of this stream to bucket {} failed",
                    self.shared.label
                ))));
                continue;
            }
            let refuse = |error| {
                request.stop_stream();
                Outcome::Refused(error)
            };
            if let Some(Writer::Checked(tag)) = request.write.writer {
                let last = (self.group_writers.get(&tag.producer_id).copied())
                    .or_else(|| self.shared.writers.last(tag.producer_id));
                if let Check::Written(earlier) = check(last, tag) {
                    outcomes.push(Outcome::Duplicate(earlier));
                    continue;
                }
            }
            let stored = match self.prepare(&request.write) {
                Ok(Some(stored)) => stored,
                Ok(None) => {
                    self.record_writer(&request.write, self.next_offset, self.next_offset - 1);
                    outcomes.push(Outcome::Nothing(self.next_offset));
                    continue;
                }
                Err(error) => {
                    outcomes.push(refuse(error));
                    continue;
                }
            };
            self.last_timestamp = self.last_timestamp.max(now_ms());
            let records = u32::try_from(stored.batch.num_rows());
            let Ok(records) = records else {
                outcomes.push(refuse(LogError::InvalidArgument(
                    "a batch of more than 2^32 rows".into(),
                )));
                continue;
            };
            let mut header = FrameHeader {
                base_offset: self.next_offset,
                records,
                commit_timestamp: self.last_timestamp,
                schema_id: self.stored_schema_id(&request.write),
                has_changes: false,
                has_writer: false,
                position: self.active.len,
                payload_len: 0,
            };
            let (frame, cached) = segment::encode_frame(&mut header, stored)?;
            self.write_frame(&frame)?;
            self.active.len += frame.len() as u64;
            if self.shared.store.is_some() {
                self.group_frames.push(frame);
            }
            self.active.frames.push(header);
            self.next_offset = header.last_offset() + 1;
            self.record_writer(&request.write, header.base_offset, header.last_offset());
            outcomes.push(Outcome::Written(header, Arc::new(cached)));
        }
        Ok(outcomes)
    }

    /// Records, for the group, that `write` of a checked writer was written at
    /// `base_offset..=last_offset` (an empty range: it had nothing to store, and its
    /// number is known only here, not in the log).
    fn record_writer(&mut self, write: &Write, base_offset: i64, last_offset: i64) {
        if let Some(Writer::Checked(tag)) = write.writer {
            let batch = WriterBatch {
                tag,
                base_offset,
                last_offset,
            };
            self.group_writers.insert(tag.producer_id, batch);
        }
    }

    /// The schema version of what [`Appender::prepare`] stores for `write`: the write's
    /// for a log table, the changelog's (the newest it has seen) for a primary-key table.
    fn stored_schema_id(&self, write: &Write) -> u32 {
        match &self.changelog {
            Some(changelog) => changelog.schema_id(),
            None => write.table.current().schema_id,
        }
    }

    /// The batch a write stores: the batch itself for a log table, the changelog for a
    /// primary-key table; `None` when there is nothing to store.
    fn prepare(&mut self, write: &Write) -> Result<Option<StoredBatch>> {
        match (&mut self.changelog, &write.op) {
            (None, WriteOp::Append(batch)) => Ok(Some(StoredBatch {
                batch: batch.clone(),
                changes: None,
                writer: write.writer.map(Writer::tag),
                sent: write.sent.clone(),
            })),
            (None, WriteOp::Upsert(_) | WriteOp::Delete(_)) => {
                Err(LogError::InvalidArgument(format!(
                    "table {} has no primary key to upsert or delete by",
                    write.table.path
                )))
            }
            (Some(changelog), _) => changelog.prepare(write),
        }
    }

    fn roll_if_needed(&mut self) -> Result<()> {
        let Some(first) = self.active.frames.first() else {
            return Ok(());
        };
        let age = now_ms() - first.commit_timestamp;
        let max_age = i64::try_from(self.config.segment_max_age.as_millis()).unwrap_or(i64::MAX);
        if self.active.len < self.config.segment_bytes && age <= max_age {
            return Ok(());
        }
        self.seal()
    }

    /// Seals the active segment (its index written) and starts the next at the next
    /// offset; with a log store, the sealed one is queued for upload.
    fn seal(&mut self) -> Result<()> {
        // The index is written durably: the frames it names must be too, sync or not
        // (with a log store, a local log is rebuilt from the store on every open).
        if self.shared.store.is_none() {
            self.active.file.sync_data()?;
        }
        segment::write_index(&self.shared.dir, self.active.base, &self.active.frames)?;
        let sealed = std::mem::replace(
            &mut self.active,
            ActiveSegment::create(&self.shared.dir, self.next_offset)?,
        );
        if let Some((store, key)) = &self.shared.store {
            store.upload(Sealed {
                key: key.clone(),
                dir: self.shared.dir.clone(),
                base: sealed.base,
                frames: sealed.frames,
                tablet: Arc::downgrade(&self.shared),
            });
        }
        self.shared.write_state().active_segment = self.active.base;
        Ok(())
    }

    fn classify(&self, error: LogError) -> LogError {
        match error {
            LogError::Io(source)
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::StorageFull
                        | std::io::ErrorKind::FileTooLarge
                        | std::io::ErrorKind::QuotaExceeded
                ) =>
            {
                LogError::DiskFull {
                    bucket: self.shared.label.clone(),
                    source,
                }
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests;
