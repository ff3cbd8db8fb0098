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
use mink_log::{Applying, Changelog, LogBatch, StoredBatch, Write, WriteOp};

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
            writer: write.writer,
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
mod tests {
    use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use mink_core::options::TableOptions;
    use mink_core::table::TablePath;

    use super::*;
    use crate::{KvConfig, KvStore};
    use mink_log::LogError;

    /// A changelog row as the tests read it: change type, key, value.
    type Row = (&'static str, i64, Option<String>);

    /// `id BIGINT PRIMARY KEY, v TEXT`.
    fn table() -> Arc<TableDescriptor> {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
        ]);
        let table = TableDescriptor::new(
            TablePath::new("db", "t"),
            schema,
            vec!["id".into()],
            vec![],
            TableOptions::default(),
        );
        Arc::new(table.unwrap())
    }

    impl KvWriter {
        /// Commits and waits for the store's update.
        fn apply(&mut self, end_offset: i64) {
            self.commit(end_offset).unwrap();
            self.settle().unwrap();
        }
    }

    /// A store in a temporary directory and the writer of its one tablet.
    struct Fixture {
        _dir: tempfile::TempDir,
        tablet: KvTablet,
        writer: KvWriter,
        table: Arc<TableDescriptor>,
    }

    impl Fixture {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let tablet = KvStore::open(dir.path(), &KvConfig::default())
                .unwrap()
                .tablet("b0")
                .unwrap();
            let table = table();
            let writer = KvWriter::new(tablet.clone(), Arc::clone(&table)).unwrap();
            Self {
                _dir: dir,
                tablet,
                writer,
                table,
            }
        }

        fn upsert(&mut self, rows: &[(i64, Option<&str>)]) -> Vec<Row> {
            let batch = whole_rows(&self.table, rows);
            self.prepare(WriteOp::Upsert(batch))
        }

        fn delete(&mut self, ids: &[i64]) -> Vec<Row> {
            self.prepare(WriteOp::Delete(keys(ids)))
        }

        /// The changelog of one write (empty when the write changes nothing).
        fn prepare(&mut self, op: WriteOp) -> Vec<Row> {
            let write = Write {
                op,
                table: Arc::clone(&self.table),
                stream: None,
                writer: None,
                sent: None,
            };
            self.writer
                .prepare(&write)
                .unwrap()
                .map_or_else(Vec::new, |stored| changelog_rows(&stored))
        }

        /// Every stored row, decoded, in key order.
        fn stored(&self) -> Vec<(i64, Option<String>)> {
            let values = self.tablet.prefix(&[]).unwrap();
            let batch = RowCodec::new(&self.table).unwrap().decode(&values).unwrap();
            id_and_value(&batch)
        }
    }

    fn whole_rows(table: &TableDescriptor, rows: &[(i64, Option<&str>)]) -> RecordBatch {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1))),
        ];
        RecordBatch::try_new(Arc::clone(table.schema()), columns).unwrap()
    }

    /// A delete batch: the key column only, as the node conforms a delete.
    fn keys(ids: &[i64]) -> RecordBatch {
        let id: ArrayRef = Arc::new(Int64Array::from(ids.to_vec()));
        RecordBatch::try_from_iter(vec![("id", id)]).unwrap()
    }

    fn id_and_value(batch: &RecordBatch) -> Vec<(i64, Option<String>)> {
        let ids = batch
            .column_by_name("id")
            .unwrap()
            .as_primitive::<Int64Type>();
        let values = batch.column_by_name("v").unwrap().as_string::<i32>();
        (0..batch.num_rows())
            .map(|i| {
                (
                    ids.value(i),
                    values.is_valid(i).then(|| values.value(i).into()),
                )
            })
            .collect()
    }

    fn changelog_rows(stored: &StoredBatch) -> Vec<Row> {
        let changes = stored.changes.as_deref().expect("a change vector");
        assert_eq!(changes.len(), stored.batch.num_rows(), "one change per row");
        ChangeType::decode_vector(changes)
            .unwrap()
            .into_iter()
            .zip(id_and_value(&stored.batch))
            .map(|(change, (id, v))| (change.short_string(), id, v))
            .collect()
    }

    fn s(value: &str) -> Option<String> {
        Some(value.into())
    }

    #[test]
    fn keys_above_and_below_the_stored_ones_are_told_apart_after_a_reopen() {
        let mut f = Fixture::new();
        f.upsert(&[(5, Some("a")), (7, Some("b"))]);
        f.writer.apply(2);
        // A new writer takes its key bound from the store.
        f.writer = KvWriter::new(f.tablet.clone(), Arc::clone(&f.table)).unwrap();
        let changes = f.upsert(&[(9, Some("c")), (7, Some("d")), (1, Some("e"))]);
        assert_eq!(
            changes,
            [
                ("+I", 9, s("c")),
                ("-U", 7, s("b")),
                ("+U", 7, s("d")),
                ("+I", 1, s("e")),
            ]
        );
        f.writer.apply(6);
        assert_eq!(f.delete(&[9, 10]), [("-D", 9, s("c"))]);
    }

    #[test]
    fn new_keys_staged_in_order_are_seen_while_their_update_runs_and_stored_once() {
        let mut f = Fixture::new();
        f.upsert(&[(2, Some("a")), (4, Some("b"))]);
        // Committed, its update maybe still running: the next group sees its rows.
        f.writer.commit(2).unwrap();
        let changes = f.upsert(&[(6, Some("c")), (4, Some("d")), (5, Some("e")), (6, None)]);
        assert_eq!(
            changes,
            [
                ("+I", 6, s("c")),
                ("-U", 4, s("b")),
                ("+U", 4, s("d")),
                ("+I", 5, s("e")),
                ("-U", 6, s("c")),
                ("+U", 6, None),
            ]
        );
        assert_eq!(f.delete(&[2, 3]), [("-D", 2, s("a"))]);
        f.writer.apply(9);
        let stored = [(4, s("d")), (5, s("e")), (6, None)];
        assert_eq!(
            f.stored(),
            stored,
            "a key appended then replaced is stored once"
        );
    }

    #[test]
    fn a_write_validated_before_a_column_was_added_is_upserted_in_the_newer_schema() {
        let mut f = Fixture::new();
        let older = Arc::clone(&f.table);
        let added = Field::new("w", DataType::Int64, true);
        let newer = Arc::new(older.with_added_column(added).unwrap());
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![1])),
            Arc::new(StringArray::from(vec!["a"])),
            Arc::new(Int64Array::from(vec![7])),
        ];
        let batch = RecordBatch::try_new(Arc::clone(newer.schema()), columns).unwrap();
        let write = |op, table: &Arc<TableDescriptor>| Write {
            op,
            table: Arc::clone(table),
            stream: None,
            writer: None,
            sent: None,
        };
        f.writer
            .prepare(&write(WriteOp::Upsert(batch), &newer))
            .unwrap();
        f.writer.apply(1);
        // Validated against the older schema, it reaches the log after the newer write.
        let older_rows = whole_rows(&older, &[(1, Some("b"))]);
        let stored = f
            .writer
            .prepare(&write(WriteOp::Upsert(older_rows), &older))
            .unwrap()
            .unwrap();
        assert_eq!(f.writer.schema_id(), newer.current().schema_id);
        assert_eq!(stored.batch.schema(), *newer.schema());
        assert_eq!(
            changelog_rows(&stored),
            [("-U", 1, s("a")), ("+U", 1, s("b"))]
        );
        let w = stored.batch.column(2).as_primitive::<Int64Type>();
        assert_eq!((w.value(0), w.is_null(1)), (7, true));
        f.writer.apply(3);
        let values = f.tablet.prefix(&[]).unwrap();
        let rows = RowCodec::new(&newer).unwrap().decode(&values).unwrap();
        assert_eq!(id_and_value(&rows), [(1, s("b"))]);
    }

    #[test]
    fn new_keys_below_the_greatest_are_inserted_whole_unless_their_range_holds_a_key() {
        let mut f = Fixture::new();
        f.upsert(&[(10, Some("a")), (20, Some("b"))]);
        f.writer.apply(2);
        f.tablet.flush().unwrap();
        f.upsert(&[(30, Some("c")), (40, Some("d"))]);
        f.writer.apply(4);
        // Between keys fjall holds, between keys of a run, staged in the group.
        assert_eq!(
            f.upsert(&[(11, Some("e")), (12, Some("f"))]),
            [("+I", 11, s("e")), ("+I", 12, s("f"))]
        );
        assert_eq!(
            f.upsert(&[(31, Some("g")), (39, None)]),
            [("+I", 31, s("g")), ("+I", 39, None)]
        );
        assert!(
            f.delete(&[13, 14]).is_empty(),
            "a range of no key deletes nothing"
        );
        // Ranges that hold a key, of fjall, of a run, staged, and a staged deletion.
        assert_eq!(
            f.upsert(&[(9, Some("h")), (11, Some("i"))]),
            [("+I", 9, s("h")), ("-U", 11, s("e")), ("+U", 11, s("i"))]
        );
        assert_eq!(
            f.upsert(&[(19, None), (21, Some("j"))]),
            [("+I", 19, None), ("+I", 21, s("j"))]
        );
        assert_eq!(f.delete(&[31]), [("-D", 31, s("g"))]);
        assert_eq!(
            f.upsert(&[(30, Some("k")), (31, Some("l"))]),
            [("-U", 30, s("c")), ("+U", 30, s("k")), ("+I", 31, s("l"))]
        );
        f.writer.apply(17);
        let stored = f.stored();
        assert_eq!(
            stored,
            [
                (9, s("h")),
                (10, s("a")),
                (11, s("i")),
                (12, s("f")),
                (19, None),
                (20, s("b")),
                (21, s("j")),
                (30, s("k")),
                (31, s("l")),
                (39, None),
                (40, s("d")),
            ]
        );
    }

    /// Random histories of writes against a model of the rows: ascending runs of keys
    /// (new or not, below the greatest or above it), scattered keys, deletes, commits
    /// waited for or not, flushes to fjall. Each write's changelog, and the stored rows
    /// at each commit waited for, are the model's.
    #[test]
    fn random_histories_match_a_model_of_the_rows() {
        for seed in 0..64 {
            random_history(seed);
        }
    }

    fn random_history(seed: u64) {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        const KEYS: i64 = 400;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut f = Fixture::new();
        let mut model = std::collections::BTreeMap::<i64, Option<String>>::new();
        let (mut offset, mut committed) = (0, 0);
        for step in 0..300 {
            let ids: Vec<i64> = match rng.random_range(0..3) {
                0 | 1 => {
                    let (start, step) = (rng.random_range(0..KEYS), rng.random_range(1..4));
                    (0..rng.random_range(1..30))
                        .map(|i| start + i * step)
                        .collect()
                }
                _ => (0..rng.random_range(1..8))
                    .map(|_| rng.random_range(0..KEYS))
                    .collect(),
            };
            let mut expected = Vec::new();
            let changes = if rng.random_bool(0.8) {
                let rows: Vec<(i64, Option<String>)> = (ids.iter())
                    .map(|&id| (id, rng.random_bool(0.8).then(|| format!("{step}"))))
                    .collect();
                for (id, row) in &rows {
                    match model.insert(*id, row.clone()) {
                        Some(old) => expected.extend([("-U", *id, old), ("+U", *id, row.clone())]),
                        None => expected.push(("+I", *id, row.clone())),
                    }
                }
                let rows: Vec<_> = (rows.iter())
                    .map(|(id, row)| (*id, row.as_deref()))
                    .collect();
                f.upsert(&rows)
            } else {
                for id in &ids {
                    if let Some(old) = model.remove(id) {
                        expected.push(("-D", *id, old));
                    }
                }
                f.delete(&ids)
            };
            assert_eq!(changes, expected, "seed {seed}, step {step}: {ids:?}");
            offset += changes.len() as i64;
            match rng.random_range(0..10) {
                0..3 if offset > committed => {
                    f.writer.commit(offset).unwrap();
                    committed = offset;
                }
                3 if offset > committed => {
                    f.writer.apply(offset);
                    committed = offset;
                    let stored: Vec<_> = model.clone().into_iter().collect();
                    assert_eq!(f.stored(), stored, "seed {seed}, step {step}");
                }
                4 => {
                    f.writer.settle().unwrap();
                    f.tablet.flush().unwrap();
                }
                _ => {}
            }
        }
    }

    #[test]
    fn upsert_of_new_keys_gives_one_insert_per_row_in_batch_order() {
        let mut f = Fixture::new();
        let log = f.upsert(&[(2, Some("b")), (1, Some("a")), (3, None)]);
        assert_eq!(log, [("+I", 2, s("b")), ("+I", 1, s("a")), ("+I", 3, None)]);
    }

    #[test]
    fn upsert_of_stored_keys_gives_the_old_row_then_the_new_row() {
        let mut f = Fixture::new();
        f.upsert(&[(1, Some("a")), (2, Some("b"))]);
        f.writer.apply(2);
        let log = f.upsert(&[(2, Some("B")), (3, Some("c")), (1, None)]);
        assert_eq!(
            log,
            [
                ("-U", 2, s("b")),
                ("+U", 2, s("B")),
                ("+I", 3, s("c")),
                ("-U", 1, s("a")),
                ("+U", 1, None),
            ]
        );
    }

    #[test]
    fn upsert_of_an_identical_row_is_still_an_update_pair() {
        let mut f = Fixture::new();
        f.upsert(&[(1, Some("a"))]);
        f.writer.apply(1);
        assert_eq!(
            f.upsert(&[(1, Some("a"))]),
            [("-U", 1, s("a")), ("+U", 1, s("a"))]
        );
    }

    #[test]
    fn delete_of_a_stored_key_carries_the_whole_old_row() {
        let mut f = Fixture::new();
        f.upsert(&[(1, Some("a")), (2, Some("b")), (3, None)]);
        f.writer.apply(3);
        let log = f.delete(&[3, 1]);
        assert_eq!(log, [("-D", 3, None), ("-D", 1, s("a"))]);
    }

    #[test]
    fn delete_of_missing_keys_changes_nothing() {
        let mut f = Fixture::new();
        assert!(f.delete(&[7, 8]).is_empty());
        f.upsert(&[(1, Some("a"))]);
        f.writer.apply(1);
        assert!(f.delete(&[9]).is_empty());
        assert_eq!(
            f.delete(&[9, 1, 10]),
            [("-D", 1, s("a"))],
            "missing keys skipped"
        );
    }

    #[test]
    fn rows_of_one_batch_see_the_rows_before_them() {
        let mut f = Fixture::new();
        let log = f.upsert(&[(1, Some("a")), (1, Some("b")), (1, Some("c"))]);
        assert_eq!(
            log,
            [
                ("+I", 1, s("a")),
                ("-U", 1, s("a")),
                ("+U", 1, s("b")),
                ("-U", 1, s("b")),
                ("+U", 1, s("c")),
            ]
        );
        f.writer.apply(5);
        assert_eq!(f.stored(), [(1, s("c"))]);
    }

    #[test]
    fn a_key_deleted_twice_in_one_batch_is_deleted_once() {
        let mut f = Fixture::new();
        f.upsert(&[(1, Some("a"))]);
        f.writer.apply(1);
        assert_eq!(f.delete(&[1, 1]), [("-D", 1, s("a"))]);
    }

    #[test]
    fn writes_of_one_group_see_each_other_before_the_commit() {
        let mut f = Fixture::new();
        assert_eq!(f.upsert(&[(1, Some("a"))]), [("+I", 1, s("a"))]);
        assert_eq!(
            f.upsert(&[(1, Some("b"))]),
            [("-U", 1, s("a")), ("+U", 1, s("b"))]
        );
        assert_eq!(f.delete(&[1]), [("-D", 1, s("b"))]);
        assert_eq!(f.upsert(&[(1, Some("c"))]), [("+I", 1, s("c"))], "deleted");
        assert!(
            f.stored().is_empty(),
            "nothing reaches the store before the commit"
        );
        f.writer.apply(6);
        assert_eq!(f.stored(), [(1, s("c"))]);
    }

    #[test]
    fn commit_applies_the_group_and_its_offset_atomically() {
        let mut f = Fixture::new();
        f.upsert(&[(1, Some("a")), (2, Some("b")), (3, Some("c"))]);
        f.writer.apply(3);
        f.delete(&[2]);
        f.upsert(&[(3, Some("C"))]);
        f.writer.apply(6);
        assert_eq!(f.stored(), [(1, s("a")), (3, s("C"))]);
        assert_eq!(f.writer.applied_offset(), 6);
        assert_eq!(f.tablet.applied_offset().unwrap(), 6);
    }

    #[test]
    fn abort_forgets_the_prepared_group() {
        let mut f = Fixture::new();
        f.upsert(&[(1, Some("a"))]);
        f.writer.apply(1);
        f.upsert(&[(1, Some("b")), (2, Some("x"))]);
        f.delete(&[1]);
        f.writer.abort();
        assert_eq!(
            f.upsert(&[(1, Some("c")), (2, Some("y"))]),
            [("-U", 1, s("a")), ("+U", 1, s("c")), ("+I", 2, s("y"))]
        );
        assert_eq!(f.writer.applied_offset(), 1);
        assert_eq!(f.tablet.applied_offset().unwrap(), 1);
    }

    #[test]
    fn an_append_to_a_primary_key_table_is_refused() {
        let mut f = Fixture::new();
        let write = Write {
            op: WriteOp::Append(whole_rows(&f.table, &[(1, Some("a"))])),
            table: Arc::clone(&f.table),
            stream: None,
            writer: None,
            sent: None,
        };
        let error = f.writer.prepare(&write).unwrap_err();
        assert!(
            matches!(&error, LogError::InvalidArgument(m) if m.contains("has a primary key")),
            "{error}"
        );
    }

    #[test]
    fn a_row_stored_before_a_column_was_added_updates_with_the_column_null() {
        let mut f = Fixture::new();
        f.upsert(&[(1, Some("a"))]);
        f.writer.apply(1);
        f.table = Arc::new(
            f.table
                .with_added_column(Field::new("n", DataType::Int64, true))
                .unwrap(),
        );
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![1, 2])),
            Arc::new(StringArray::from(vec!["b", "c"])),
            Arc::new(Int64Array::from(vec![10, 20])),
        ];
        let batch = RecordBatch::try_new(Arc::clone(f.table.schema()), columns).unwrap();
        let write = Write {
            op: WriteOp::Upsert(batch),
            table: Arc::clone(&f.table),
            stream: None,
            writer: None,
            sent: None,
        };
        let stored = f.writer.prepare(&write).unwrap().unwrap();
        assert_eq!(stored.batch.schema(), *f.table.schema());
        assert_eq!(
            changelog_rows(&stored),
            [("-U", 1, s("a")), ("+U", 1, s("b")), ("+I", 2, s("c"))]
        );
        let n = stored.batch.column(2).as_primitive::<Int64Type>();
        assert_eq!(
            n.iter().collect::<Vec<_>>(),
            [None, Some(10), Some(20)],
            "the old row has no value for the added column"
        );
    }

    #[test]
    fn replaying_a_changelog_rebuilds_the_store_it_came_from() {
        let mut source = Fixture::new();
        let mut replica = Fixture::new();
        let writes = [
            WriteOp::Upsert(whole_rows(&source.table, &[(1, Some("a")), (2, Some("b"))])),
            WriteOp::Upsert(whole_rows(&source.table, &[(2, Some("B")), (3, None)])),
            WriteOp::Delete(keys(&[1, 4])),
            WriteOp::Upsert(whole_rows(&source.table, &[(1, Some("again"))])),
        ];
        let mut offset = 0;
        for op in writes {
            let write = Write {
                op,
                table: Arc::clone(&source.table),
                stream: None,
                writer: None,
                sent: None,
            };
            let stored = source.writer.prepare(&write).unwrap().unwrap();
            let rows = stored.batch.num_rows() as i64;
            replica
                .writer
                .replay(&LogBatch {
                    base_offset: offset,
                    last_offset: offset + rows - 1,
                    commit_timestamp: 0,
                    schema_id: 0,
                    batch: stored.batch,
                    changes: stored.changes,
                    writer: None,
                    size: 0,
                })
                .unwrap();
            offset += rows;
        }
        source.writer.apply(offset);
        replica.writer.apply(offset);
        let expected = [(1, s("again")), (2, s("B")), (3, None)];
        assert_eq!(source.stored(), expected);
        assert_eq!(replica.stored(), expected);
        assert_eq!(replica.tablet.applied_offset().unwrap(), offset);
    }

    #[test]
    fn replay_of_a_batch_without_a_change_vector_is_corrupt() {
        let mut f = Fixture::new();
        let batch = LogBatch {
            base_offset: 5,
            last_offset: 5,
            commit_timestamp: 0,
            schema_id: 0,
            batch: whole_rows(&f.table, &[(1, Some("a"))]),
            changes: None,
            writer: None,
            size: 0,
        };
        let error = f.writer.replay(&batch).unwrap_err();
        assert!(
            matches!(&error, LogError::Corrupt(m) if m.contains("offset 5")),
            "{error}"
        );
    }
}
