//! Turning upserts and deletes into a changelog, and applying it to the store.
//!
//! Per row of an upsert: a new key gives `+I` (the new row); a key that exists gives `-U`
//! (the stored row) then `+U` (the new row). Per key of a delete: a stored key gives `-D`
//! (the stored row); a missing key gives nothing. Rows of one group of writes see each
//! other through an overlay that is applied to the store, with the applied offset, once
//! the log has the group durably.
//!
//! A key above every key stored or staged (the writer's key bound) is new without any
//! read: an ascending load, or the new keys of a mix, costs no lookup (see
//! [`StagedRows`]), and in a group that replaces no key no hash either. A write whose
//! keys ascend over a range that no source holds a key in is new as a whole, known from
//! one search per source rather than a read per key: the batches of an ascending load
//! that reach the node out of order (a client keeps several in flight) are. Other keys at
//! or below the bound are looked up one by one, in the group's overlay, then the store.
//!
//! At its commit a group's rows go to a job on the store's update threads, which makes
//! them one sorted run and adds it to the store's write buffer ([`super::buffer`]) while
//! the appender prepares and writes the next group (whose prepares see the updating
//! group's rows where they were staged); the job acknowledges the group's writes once its
//! rows are readable, then writes the buffer to fjall if it is due. So the store's work
//! and the log's take two cores rather than one after the other (the appender is the one
//! thread a bucket's writes go through: what can leave it, does):
//!
//! ```text
//!   appender:  prepare 1 | write+fsync 1 | prepare 2 | write+fsync 2 | prepare 3 ...
//!   update:                               | buffer 1 (ack 1) [flush]  | buffer 2 (ack 2)
//! ```
//!
//! The next commit waits for the update before it starts its own, so the store's applied
//! offset moves in log order and is never past the durable log.
//!
//! A write whose encoded key is longer than [`MAX_KEY_BYTES`] is refused here, as its
//! changelog is prepared: nothing of it is logged, and its stream stops (the appender's
//! stop rule). A replayed changelog row of such a key, logged before keys were bounded,
//! is left out of the store with an error logged (see "Keys the store cannot keep" in
//! [`super`]). An update that fails fences the tablet ([`KvTablet::fence`]).
//!
//! The writer follows the table's schema forward only. A write validated before a column
//! was added can reach the log after one validated after it; its rows are brought to the
//! newer schema (the new columns null, as for any row written before them), so every
//! changelog batch and stored row is in the newest schema the writer has seen.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::compute::interleave_record_batch;
use arrow::row::Rows;
use fjall::UserValue;
use itertools::Itertools as _;
use mink_core::change::ChangeType;
use mink_core::key::{KeyCodec, MAX_KEY_BYTES, RowCodec, Values};
use mink_core::schema::normalize_batch;
use mink_core::table::TableDescriptor;
use tokio::sync::oneshot;

use super::KvTablet;
use super::runs::{Entries, Run};
use super::threads::Submitted;
use crate::error::{KvError, Result};
use mink_log::{Applying, Changelog, LogBatch, StoredBatch, Write, WriteOp, Writer};

/// Keys and rows by key bytes; a fast hasher, since every written row goes through it.
type KeyMap = ahash::HashMap<Vec<u8>, Option<Vec<u8>>>;

/// The rows of writes on their way to the store, in two parts.
///
/// * `inserted`: rows of keys that were new, in parts sorted by key, each back to back in
///   one buffer, no key in two parts. They were known new without a read or a hash of
///   each key, and are staged without an allocation each: a write whose keys ascend over a
///   range no source holds a key in is one part (an ascending load is, even when its
///   batches reach the node out of order), and keys above every key before them join the
///   last part.
/// * `replaced`: every other key -> row (`None`: deleted). A key in both is the later
///   write's: `replaced` shadows `inserted`.
#[derive(Debug, Default)]
struct StagedRows {
    inserted: Vec<Entries>,
    replaced: KeyMap,
}

impl StagedRows {
    /// Room for every one of `keys` and `rows` to be inserted (the common case: new keys).
    fn for_rows(keys: &Rows, rows: &Values) -> Self {
        Self {
            inserted: vec![Entries::with_capacity(
                keys.num_rows(),
                keys.size() + rows.bytes(),
            )],
            replaced: KeyMap::default(),
        }
    }

    /// The row staged for `key` (`Some(None)`: deleted), if any.
    fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        match self.replaced.get(key) {
            Some(row) => Some(row.as_deref()),
            None => self.inserted.iter().find_map(|part| part.get(key)),
        }
    }

    /// Whether a key from `first` to `last` is staged, deleted or not.
    fn holds_key_in(&self, first: &[u8], last: &[u8]) -> bool {
        (self.inserted.iter()).any(|part| part.holds_key_in(first, last))
            || (self.replaced.keys()).any(|key| (first..=last).contains(&key.as_slice()))
    }

    /// Stages the new row of `key`, which is above every key of the last part.
    fn insert(&mut self, key: &[u8], row: &[u8]) {
        if self.inserted.is_empty() {
            self.inserted.push(Entries::default());
        }
        let last = self.inserted.len() - 1;
        self.inserted[last].push((key, Some(row)));
    }

    /// The greatest key of the last part.
    fn last_inserted(&self) -> Option<&[u8]> {
        self.inserted.last().and_then(Entries::last_key)
    }

    /// The greatest inserted key.
    fn greatest_inserted(&self) -> Option<&[u8]> {
        self.inserted.iter().filter_map(Entries::last_key).max()
    }

    /// Takes in the rows of a later write.
    fn extend(&mut self, later: StagedRows) {
        for part in later.inserted.into_iter().filter(|part| !part.is_empty()) {
            match self.inserted.last_mut() {
                Some(last) if last.last_key() < part.first_key() => last.append(&part),
                _ => self.inserted.push(part),
            }
        }
        match self.replaced.is_empty() {
            true => self.replaced = later.replaced,
            false => self.replaced.extend(later.replaced),
        }
    }

    fn clear(&mut self) {
        *self = Self::default();
    }

    /// The staged rows as one sorted run: `replaced` sorted, merged over `inserted`.
    fn to_run(&self) -> Run {
        let mut replaced: Vec<_> = (self.replaced.iter())
            .map(|(key, row)| (key.as_slice(), row.as_deref()))
            .collect();
        replaced.sort_unstable_by_key(|(key, _)| *key);
        let replaced = Entries::from_sorted(&replaced);
        let sources: Vec<&Entries> = self.inserted.iter().chain([&replaced]).collect();
        Run::from_merged(&sources)
    }
}

/// The [`Changelog`] of a primary-key bucket.
#[derive(Debug)]
pub struct KvWriter {
    tablet: KvTablet,
    table: Arc<TableDescriptor>,
    keys: KeyCodec,
    rows: RowCodec,
    /// The writes prepared but not yet committed.
    overlay: StagedRows,
    /// The rows of the last committed group, which its update may still be adding to the
    /// store's write buffer.
    updating: Arc<StagedRows>,
    /// Their update, on the store's update threads.
    update: Option<Submitted<Result<()>>>,
    /// No key in the store, being written to it or staged is greater: a key above it is
    /// new without a read, as every key of an ascending load is. Deletes (and aborted
    /// groups) do not lower it.
    key_bound: Option<Vec<u8>>,
    applied: i64,
}

/// Where a changelog row comes from.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// Row `i` of the written batch.
    New(usize),
    /// Stored row `i` of the old rows read.
    Old(usize),
}

impl KvWriter {
    /// The writer of `tablet`, the store of `table`'s bucket.
    pub fn new(tablet: KvTablet, table: Arc<TableDescriptor>) -> Result<Self> {
        Ok(Self {
            keys: KeyCodec::new(&table)?,
            rows: RowCodec::new(&table)?,
            applied: tablet.applied_offset()?,
            key_bound: tablet.key_bound(),
            tablet,
            table,
            overlay: StagedRows::default(),
            updating: Arc::default(),
            update: None,
        })
    }

    /// Follows schema changes forward: new versions need their row codecs; an older
    /// descriptor (a write validated before the change) changes nothing.
    fn refresh(&mut self, table: &Arc<TableDescriptor>) -> Result<()> {
        if table.schemas.len() > self.table.schemas.len() {
            self.rows = RowCodec::new(table)?;
            self.table = Arc::clone(table);
        }
        Ok(())
    }

    /// Whether `key` is above every key stored or staged, `staged` (this write's rows so
    /// far) included: then it is new.
    fn above_bound(&self, staged: &StagedRows, key: &[u8]) -> bool {
        match staged.last_inserted() {
            Some(last) => key > last,
            None => self.key_bound.as_deref().is_none_or(|bound| key > bound),
        }
    }

    /// The store's rows of `keys` as of the groups committed before this one, read at
    /// once.
    fn stored_rows(&self, keys: &Rows) -> Result<Vec<Option<UserValue>>> {
        let keys: Vec<&[u8]> = keys.iter().map(|key| key.data()).collect();
        self.tablet.get_many(&keys)
    }

    /// The row of `key` as the group sees it so far; `stored`: the store's row of it.
    fn current(
        &self,
        staged: &StagedRows,
        key: &[u8],
        stored: Option<&UserValue>,
    ) -> Option<Vec<u8>> {
        if self.above_bound(staged, key) {
            return None;
        }
        let found = (staged.get(key))
            .or_else(|| self.overlay.get(key))
            .or_else(|| self.updating.get(key));
        match found {
            Some(row) => row.map(<[u8]>::to_vec),
            None => stored.map(|row| row.to_vec()),
        }
    }

    /// Stages the row of `key` (`None`: deleted) after the rows of `staged`.
    fn stage(&self, staged: &mut StagedRows, key: &[u8], row: Option<&[u8]>) {
        match row {
            Some(row) if self.above_bound(staged, key) => staged.insert(key, row),
            row => {
                // Deletes are staged for keys found, at or below the bound (replay too: the
                // store is a prefix of the log); one above it would shadow a later insert.
                debug_assert!(row.is_some() || !self.above_bound(staged, key));
                staged
                    .replaced
                    .insert(key.to_vec(), row.map(<[u8]>::to_vec));
            }
        }
    }

    /// Keeps a write's staged rows for the group's commit.
    fn keep(&mut self, staged: StagedRows) {
        if let Some(greatest) = staged.greatest_inserted()
            && self.key_bound.as_deref() < Some(greatest)
        {
            self.key_bound = Some(greatest.to_vec());
        }
        self.overlay.extend(staged);
    }

    /// Whether `keys` ascend over a range no source holds a key in, deleted or not (the
    /// group's staged rows, the updating group's, the store): then each is new, known
    /// without a read of it.
    fn all_new(&self, keys: &Rows) -> Result<bool> {
        let Some(end) = keys.num_rows().checked_sub(1) else {
            return Ok(true);
        };
        let (first, last) = (keys.row(0), keys.row(end));
        let (first, last) = (first.as_ref(), last.as_ref());
        let ascending = (keys.iter().tuple_windows()).all(|(a, b)| a.as_ref() < b.as_ref());
        if !ascending {
            return Ok(false);
        }
        if self.key_bound.as_deref().is_none_or(|bound| first > bound) {
            return Ok(true);
        }
        // The staged replaced keys are searched one by one: no longer than reading the
        // write's keys one by one would take.
        let replaced = self.overlay.replaced.len() + self.updating.replaced.len();
        if replaced > keys.num_rows()
            || self.overlay.holds_key_in(first, last)
            || self.updating.holds_key_in(first, last)
        {
            return Ok(false);
        }
        Ok(!self.tablet.holds_key_in(first, last)?)
    }

    /// The changelog of an upsert or delete; `None` when it changes nothing.
    fn changelog(&mut self, op: &WriteOp) -> Result<Option<StoredBatch>> {
        let (batch, upsert) = match op {
            WriteOp::Upsert(batch) => (batch, true),
            WriteOp::Delete(batch) => (batch, false),
            WriteOp::Append(_) => {
                return Err(KvError::InvalidArgument(format!(
                    "table {} has a primary key: write upserts or deletes",
                    self.table.path
                )));
            }
        };
        let keys = self.keys.encode(batch)?;
        self.keys.check_lengths(&keys).map_err(|error| {
            KvError::InvalidArgument(format!("not written to table {}: {error}", self.table.path))
        })?;
        if keys.num_rows() == 0 {
            return Ok(None);
        }
        let all_new = self.all_new(&keys)?;
        if !upsert {
            return match all_new {
                true => Ok(None),
                false => self.key_by_key(&keys, batch, None),
            };
        }
        // The rows in the writer's schema, which may be newer than the write's.
        let batch = normalize_batch(batch, self.table.schema())?;
        let rows = self.rows.encode(&batch, self.table.current().schema_id)?;
        match all_new {
            true => Ok(Some(self.insert_all(&keys, batch, &rows))),
            false => self.key_by_key(&keys, &batch, Some(&rows)),
        }
    }

    /// The changelog of an upsert of new keys alone: the batch, all `+I`.
    fn insert_all(&mut self, keys: &Rows, batch: RecordBatch, rows: &Values) -> StoredBatch {
        let mut staged = StagedRows::for_rows(keys, rows);
        for (key, row) in keys.iter().zip(rows.iter()) {
            staged.insert(key.as_ref(), row);
        }
        self.keep(staged);
        StoredBatch {
            changes: Some(vec![ChangeType::Insert as u8; batch.num_rows()]),
            batch,
            writer: None,
            sent: None,
        }
    }

    /// The changelog of an upsert (`new_rows`: its rows, encoded) or a delete (`None`),
    /// each key's current row read in turn; `None` when it changes nothing.
    fn key_by_key(
        &mut self,
        keys: &Rows,
        batch: &RecordBatch,
        new_rows: Option<&Values>,
    ) -> Result<Option<StoredBatch>> {
        let upsert = new_rows.is_some();
        let mut staged = match new_rows {
            Some(rows) => StagedRows::for_rows(keys, rows),
            None => StagedRows::default(),
        };
        let stored = self.stored_rows(keys)?;
        let mut old_rows: Vec<Vec<u8>> = Vec::new();
        let mut sources = Vec::with_capacity(keys.num_rows());
        let mut changes = Vec::with_capacity(keys.num_rows());
        for (row, key) in keys.iter().enumerate() {
            let key = key.as_ref();
            let old = self.current(&staged, key, stored[row].as_ref());
            match (old, upsert) {
                (Some(old), true) => {
                    sources.push(Source::Old(old_rows.len()));
                    old_rows.push(old);
                    sources.push(Source::New(row));
                    changes.extend([
                        ChangeType::UpdateBefore as u8,
                        ChangeType::UpdateAfter as u8,
                    ]);
                }
                (None, true) => {
                    sources.push(Source::New(row));
                    changes.push(ChangeType::Insert as u8);
                }
                (Some(old), false) => {
                    sources.push(Source::Old(old_rows.len()));
                    old_rows.push(old);
                    changes.push(ChangeType::Delete as u8);
                }
                (None, false) => continue,
            }
            let value = new_rows.map(|new_rows| new_rows.get(row));
            self.stage(&mut staged, key, value);
        }
        if changes.is_empty() {
            return Ok(None);
        }
        let changelog = if old_rows.is_empty() {
            // Every key new: the changelog is the batch, all +I.
            batch.clone()
        } else if upsert {
            let old = self.rows.decode(&old_rows)?;
            let indices: Vec<(usize, usize)> = sources
                .iter()
                .map(|source| match *source {
                    Source::New(row) => (0, row),
                    Source::Old(row) => (1, row),
                })
                .collect();
            interleave_record_batch(&[batch, &old], &indices)?
        } else {
            self.rows.decode(&old_rows)?
        };
        self.keep(staged);
        Ok(Some(StoredBatch {
            batch: changelog,
            changes: Some(changes),
            writer: None,
            sent: None,
        }))
    }
}

impl Changelog for KvWriter {
    fn prepare(&mut self, write: &Write) -> mink_log::Result<Option<StoredBatch>> {
        self.refresh(&write.table)?;
        let changelog = self.changelog(&write.op)?;
        // A changelog that is the written batch itself (new keys alone) is stored as the
        // client sent it; any other is encoded (see `SentMessage::describes`).
        Ok(changelog.map(|stored| StoredBatch {
            writer: write.writer.map(Writer::tag),
            sent: write.sent.clone(),
            ..stored
        }))
    }

    fn schema_id(&self) -> u32 {
        self.table.current().schema_id
    }

    fn commit(&mut self, end_offset: i64) -> mink_log::Result<Applying> {
        let started = self.start_update(end_offset);
        if let Err(error) = &started {
            self.tablet.fence(error);
        }
        Ok(started?)
    }

    fn failure(&self) -> Option<String> {
        self.tablet.failure()
    }

    fn settle(&mut self) -> mink_log::Result<()> {
        Ok(self.wait_update()?)
    }

    fn abort(&mut self) {
        self.overlay.clear();
    }

    fn applied_offset(&self) -> i64 {
        self.applied
    }

    fn replay(&mut self, batch: &LogBatch) -> mink_log::Result<()> {
        Ok(self.replay_changes(batch)?)
    }
}

impl KvWriter {
    /// [`Changelog::replay`]: stages the rows of a durable changelog batch.
    fn replay_changes(&mut self, batch: &LogBatch) -> Result<()> {
        let changes = batch.changes.as_deref().ok_or_else(|| {
            KvError::Corrupt(format!(
                "batch at offset {} of a primary-key table has no change vector",
                batch.base_offset
            ))
        })?;
        let keys = self.keys.encode(&batch.batch)?;
        let rows = self.rows.encode(&batch.batch, batch.schema_id)?;
        let mut staged = StagedRows::for_rows(&keys, &rows);
        let mut too_long = 0;
        for ((key, row), change) in keys.iter().zip(rows.iter()).zip(changes) {
            if key.as_ref().len() > MAX_KEY_BYTES {
                too_long += 1;
                continue;
            }
            let row = match ChangeType::from_byte(*change)? {
                ChangeType::Insert | ChangeType::UpdateAfter => Some(row),
                ChangeType::Delete => None,
                ChangeType::UpdateBefore => continue,
            };
            self.stage(&mut staged, key.as_ref(), row);
        }
        if too_long > 0 {
            tracing::error!(
                bucket = self.tablet.state.name,
                offsets = %format!("{}..={}", batch.base_offset, batch.last_offset),
                rows = too_long,
                max_key_bytes = MAX_KEY_BYTES,
                "changelog rows whose key is too long for the KV store (logged before keys \
                 were bounded) are left out of it: they stay in the log and the lake"
            );
        }
        self.keep(staged);
        Ok(())
    }

    /// [`Changelog::settle`]: waits for the running update, if any.
    fn wait_update(&mut self) -> Result<()> {
        match self.update.take() {
            None => Ok(()),
            Some(update) => update.wait()?,
        }
    }

    /// [`Changelog::commit`]: waits for the group before's update, then starts this
    /// group's on the store's update threads. A failure of either fences the tablet.
    fn start_update(&mut self, end_offset: i64) -> Result<Applying> {
        self.wait_update()?;
        let rows = Arc::new(std::mem::take(&mut self.overlay));
        // The group before's rows are let go of on the update thread too (its replaced
        // rows one by one).
        let before = std::mem::replace(&mut self.updating, Arc::clone(&rows));
        let (done, applied) = oneshot::channel();
        let tablet = self.tablet.clone();
        let update = self.tablet.store.updates.submit(move || {
            drop(before);
            let buffered = tablet.buffer(Arc::new(rows.to_run()), end_offset);
            let _ = done.send(
                (buffered.as_ref())
                    .map(|_| ())
                    .map_err(|error| error.for_another_waiter().into()),
            );
            let updated = buffered.and_then(|()| tablet.flush_if_due().map(drop));
            if let Err(error) = &updated {
                tablet.fence(error);
            }
            updated
        })?;
        self.update = Some(update);
        self.applied = end_offset;
        Ok(Applying::pending(applied))
    }
}

impl Drop for KvWriter {
    /// The store is not let go of while an update writes to it, and the bucket's buffered
    /// rows are written to fjall, so that reopening it replays nothing.
    fn drop(&mut self) {
        if let Err(error) = self.wait_update().and_then(|()| self.tablet.flush()) {
            tracing::warn!(bucket = self.tablet.state.name, %error, "the last KV store update failed");
        }
    }
}

#[cfg(test)]
mod tests;
