//! Turning upserts and deletes into a changelog, and applying it to the store.
//!
//! Per row of an upsert: a new key gives `+I` (the new row); a key that exists gives `-U`
//! (the stored row) then `+U` (the new row). Per key of a delete: a stored key gives `-D`
//! (the stored row); a missing key gives nothing. Rows of one group of writes see each
//! other through an overlay that is applied to the store, with the applied offset, in one
//! atomic batch once the log has the group durably.

use std::sync::Arc;

use arrow::compute::interleave_record_batch;
use mink_core::change::ChangeType;
use mink_core::key::{KeyCodec, RowCodec};
use mink_core::table::TableDescriptor;

use super::{KvTablet, kv_error};
use crate::error::{NodeError, Result};
use crate::log::{Changelog, LogBatch, StoredBatch, Write, WriteOp};

/// Keys and rows by key bytes; a fast hasher, since every written row goes through it.
type KeyMap = ahash::HashMap<Vec<u8>, Option<Vec<u8>>>;

/// The [`Changelog`] of a primary-key bucket.
#[derive(Debug)]
pub(crate) struct KvWriter {
    tablet: KvTablet,
    table: Arc<TableDescriptor>,
    keys: KeyCodec,
    rows: RowCodec,
    /// key -> row (`None`: deleted) for writes prepared but not yet committed.
    overlay: KeyMap,
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
    pub(crate) fn new(tablet: KvTablet, table: Arc<TableDescriptor>) -> Result<Self> {
        Ok(Self {
            keys: KeyCodec::new(&table)?,
            rows: RowCodec::new(&table)?,
            applied: tablet.applied_offset()?,
            tablet,
            table,
            overlay: KeyMap::default(),
        })
    }

    /// Follows schema changes: new versions need their row codecs.
    fn refresh(&mut self, table: &Arc<TableDescriptor>) -> Result<()> {
        if table.schemas.len() != self.table.schemas.len() {
            self.rows = RowCodec::new(table)?;
            self.table = Arc::clone(table);
        }
        Ok(())
    }

    /// The row stored under `key`, as the group sees it so far.
    fn current(&self, staged: &KeyMap, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(row) = staged.get(key).or_else(|| self.overlay.get(key)) {
            return Ok(row.clone());
        }
        Ok(self.tablet.get(key)?.map(|v| v.to_vec()))
    }

    /// The changelog of an upsert or delete; `None` when it changes nothing.
    fn changelog(&mut self, op: &WriteOp) -> Result<Option<StoredBatch>> {
        let (batch, upsert) = match op {
            WriteOp::Upsert(batch) => (batch, true),
            WriteOp::Delete(batch) => (batch, false),
            WriteOp::Append(_) => {
                return Err(NodeError::InvalidArgument(format!(
                    "table {} has a primary key: write upserts or deletes",
                    self.table.path
                )));
            }
        };
        let keys = self.keys.encode(batch)?;
        let mut new_rows = if upsert {
            self.rows.encode(batch, self.table.current().schema_id)?
        } else {
            Vec::new()
        };
        let mut staged = KeyMap::default();
        let mut old_rows: Vec<Vec<u8>> = Vec::new();
        let mut sources = Vec::new();
        let mut changes = Vec::new();
        for (row, key) in keys.iter().enumerate() {
            let key = key.as_ref();
            let old = self.current(&staged, key)?;
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
            let value = upsert.then(|| std::mem::take(&mut new_rows[row]));
            staged.insert(key.to_vec(), value);
        }
        if changes.is_empty() {
            return Ok(None);
        }
        let old = self.rows.decode(&old_rows)?;
        let changelog = if upsert {
            let indices: Vec<(usize, usize)> = sources
                .iter()
                .map(|source| match *source {
                    Source::New(row) => (0, row),
                    Source::Old(row) => (1, row),
                })
                .collect();
            interleave_record_batch(&[batch, &old], &indices)?
        } else {
            old
        };
        self.overlay.extend(staged);
        Ok(Some(StoredBatch {
            batch: changelog,
            changes: Some(changes),
        }))
    }
}

impl Changelog for KvWriter {
    fn prepare(&mut self, write: &Write) -> Result<Option<StoredBatch>> {
        self.refresh(&write.table)?;
        self.changelog(&write.op)
    }

    fn commit(&mut self, end_offset: i64) -> Result<()> {
        let store = &self.tablet.store;
        let mut batch = store.db.batch();
        for (key, row) in self.overlay.drain() {
            match row {
                Some(row) => batch.insert(&self.tablet.rows, key, row),
                None => batch.remove(&self.tablet.rows, key),
            }
        }
        batch.insert(
            &store.applied,
            self.tablet.name.as_bytes(),
            end_offset.to_le_bytes(),
        );
        batch.commit().map_err(kv_error)?;
        self.applied = end_offset;
        Ok(())
    }

    fn abort(&mut self) {
        self.overlay.clear();
    }

    fn applied_offset(&self) -> i64 {
        self.applied
    }

    fn replay(&mut self, batch: &LogBatch) -> Result<()> {
        let changes = batch.changes.as_deref().ok_or_else(|| {
            NodeError::Corrupt(format!(
                "batch at offset {} of a primary-key table has no change vector",
                batch.base_offset
            ))
        })?;
        let keys = self.keys.encode(&batch.batch)?;
        let rows = self.rows.encode(&batch.batch, batch.schema_id)?;
        for ((key, row), change) in keys.iter().zip(rows).zip(changes) {
            match ChangeType::from_byte(*change)? {
                ChangeType::Insert | ChangeType::UpdateAfter => {
                    self.overlay.insert(key.as_ref().to_vec(), Some(row));
                }
                ChangeType::Delete => {
                    self.overlay.insert(key.as_ref().to_vec(), None);
                }
                ChangeType::UpdateBefore => {}
            }
        }
        Ok(())
    }
}
