//! The live rows of a bucket's log range, folded where the log lives (the LiveRange read).
//!
//! A union read of a primary-key table whose plan located the lake rows its ranges replace
//! (`Node::locate_replaced_rows`) leaves those rows out of the lake scan by position, so
//! from each bucket's range it needs only the live rows: for each key the range changes,
//! its last change when that is `+I` or `+U` (steps 1 and 3 of
//! `docs/design.md#primary-key-tables-the-key-merge`). The leader answers them
//! ([`Node::live_range`]) instead of the whole changelog, so the reader neither receives a
//! key's older changes nor folds them.
//!
//! The fold is mink-core's [`LogRangeIndex`] over the range's key columns and offsets
//! (no other column is held): the index's live rows are the live offsets, in log order,
//! and the answer is the log read again with only those rows taken. Between two tiering
//! rounds a bucket's range only grows at its end and a log range never changes once
//! written, so each bucket keeps its last fold ([`FoldedRange`]) and the next read of the
//! same seam folds only the rows written since. A read of another seam (after a round)
//! folds its range afresh and replaces what was kept; a read of a shorter range than the
//! one kept (planned before it) folds apart and keeps nothing.
//!
//! What a bucket keeps is bounded by the longest range a LiveRange folds
//! ([`MAX_LIVE_RANGE_ROWS`]): its key columns and an offset per row, and a map entry per
//! key; it is freed with the bucket.

use std::sync::Arc;

use arrow::array::{AsArray, Int64Array, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use futures::TryStreamExt;
use mink_core::key::KeyCodec;
use mink_core::merge::LogRangeIndex;
use mink_core::protocol::{BucketId, MAX_LIVE_RANGE_ROWS};
use mink_core::schema::columns_within;
use mink_core::table::TableDescriptor;
use tokio::sync::Mutex;

use super::{change_types, key_columns, log_range};
use crate::error::{NodeError, Result};
use crate::node::{Bucket, Node};
use mink_log::LogBatch;

/// The column of a fold's batches holding each row's log offset.
const OFFSET_COLUMN: &str = "__mink_offset";

/// A bucket's last fold of its range (see the module docs).
#[derive(Debug, Default)]
pub struct FoldedRange {
    kept: Mutex<Option<Folded>>,
}

/// The range `[from, to)` of a bucket's log folded by key.
#[derive(Debug)]
struct Folded {
    from: i64,
    to: i64,
    /// Over batches of the key columns and [`OFFSET_COLUMN`].
    index: LogRangeIndex,
    /// The live rows' offsets, ascending, once asked for.
    live: Option<Arc<Vec<i64>>>,
}

impl Node {
    /// The live rows of `bucket_id`'s log range `[from, to)` (see the module docs), in
    /// log order, columns `projection` of the current schema (a batch written under an
    /// older schema version keeps those it has, in that order).
    ///
    /// # Errors
    /// [`NodeError::InvalidArgument`] for a log table or a range longer than
    /// [`MAX_LIVE_RANGE_ROWS`]; [`mink_log::LogError::OffsetOutOfRange`] for a range outside the
    /// log.
    pub async fn live_range(
        &self,
        bucket_id: &BucketId,
        from: i64,
        to: i64,
        projection: &[usize],
    ) -> Result<Vec<LogBatch>> {
        let (table, bucket) = self.bucket(bucket_id)?;
        if !table.has_primary_key() {
            return Err(NodeError::InvalidArgument(format!(
                "LiveRange folds a primary-key table's changelog; {} is a log table",
                table.path
            )));
        }
        if to < from || to.saturating_sub(from) > MAX_LIVE_RANGE_ROWS {
            return Err(NodeError::InvalidArgument(format!(
                "LiveRange of [{from}, {to}): a range of at most {MAX_LIVE_RANGE_ROWS} offsets"
            )));
        }
        bucket.log.check_offset(from)?;
        bucket.log.check_offset(to)?;
        let live = bucket
            .folded
            .live_offsets(&table, &bucket, from, to)
            .await?;
        let mut rows = Vec::new();
        let mut batches = log_range(Arc::clone(&bucket), from, to);
        let mut next = 0;
        while let Some(batch) = batches.try_next().await? {
            let end = next + live[next..].partition_point(|&offset| offset <= batch.last_offset);
            if end > next {
                rows.push(taken(batch, projection, &live[next..end])?);
            }
            next = end;
        }
        Ok(rows)
    }
}

/// The rows of `batch` at `offsets` (ascending, all inside it), the columns of
/// `projection` it has.
fn taken(mut batch: LogBatch, projection: &[usize], offsets: &[i64]) -> Result<LogBatch> {
    let own: Vec<usize> = columns_within(projection, batch.batch.num_columns()).collect();
    let rows: UInt32Array = offsets
        .iter()
        .map(|&offset| (offset - batch.base_offset) as u32)
        .collect();
    batch.batch = take_record_batch(&batch.batch.project(&own)?, &rows)?;
    batch.changes = None;
    Ok(batch)
}

impl FoldedRange {
    /// The offsets of the live rows of `[from, to)` of `bucket`'s log, ascending.
    async fn live_offsets(
        &self,
        table: &TableDescriptor,
        bucket: &Arc<Bucket>,
        from: i64,
        to: i64,
    ) -> Result<Arc<Vec<i64>>> {
        let codec = KeyCodec::new(table)?;
        let mut kept = self.kept.lock().await;
        match kept.as_ref() {
            Some(folded) if folded.from == from && folded.to <= to => {}
            // A range planned before the one kept: folded apart.
            Some(folded) if folded.from == from => {
                let mut apart = Folded::new(&codec, from);
                apart.extend(&codec, table, bucket, to).await?;
                return apart.live_offsets();
            }
            // Another seam: what was kept is of no use.
            _ => *kept = None,
        }
        let folded = kept.get_or_insert_with(|| Folded::new(&codec, from));
        if let Err(error) = folded.extend(&codec, table, bucket, to).await {
            // What a failed fold holds is not trusted for the next read.
            *kept = None;
            return Err(error);
        }
        folded.live_offsets()
    }
}

impl Folded {
    fn new(codec: &KeyCodec, from: i64) -> Self {
        Self {
            from,
            to: from,
            index: LogRangeIndex::empty(codec),
            live: None,
        }
    }

    /// Folds in the rows `[self.to, to)` of `bucket`'s log. Each batch's rows are folded
    /// and counted at once, so a read dropped halfway leaves a fold of a shorter range.
    async fn extend(
        &mut self,
        codec: &KeyCodec,
        table: &TableDescriptor,
        bucket: &Arc<Bucket>,
        to: i64,
    ) -> Result<()> {
        let mut batches = log_range(Arc::clone(bucket), self.to, to);
        while let Some(batch) = batches.try_next().await? {
            let last_offset = batch.last_offset;
            let (keys, changes) = keys_and_offsets(codec, table, batch)?;
            self.index.push(codec, keys, changes)?;
            self.to = last_offset + 1;
            self.live = None;
        }
        match self.to < to {
            true => Err(NodeError::Read(format!(
                "the log ends at {} before the folded range's end {to}",
                self.to
            ))),
            false => Ok(()),
        }
    }

    fn live_offsets(&mut self) -> Result<Arc<Vec<i64>>> {
        if let Some(live) = &self.live {
            return Ok(Arc::clone(live));
        }
        let mut offsets = Vec::new();
        for rows in self.index.live_rows()? {
            let column = rows
                .column_by_name(OFFSET_COLUMN)
                .and_then(|c| c.as_primitive_opt::<Int64Type>())
                .ok_or_else(|| NodeError::Read("a fold without its offsets".into()))?;
            offsets.extend_from_slice(column.values());
        }
        let live = Arc::new(offsets);
        self.live = Some(Arc::clone(&live));
        Ok(live)
    }
}

/// A log batch's key columns and offsets, with its change vector.
fn keys_and_offsets(
    codec: &KeyCodec,
    table: &TableDescriptor,
    batch: LogBatch,
) -> Result<(RecordBatch, Vec<u8>)> {
    let changes = change_types(table, batch.changes)?;
    let keys = key_columns(&batch.batch, codec)?;
    let mut fields = keys.schema().fields().to_vec();
    fields.push(Arc::new(Field::new(OFFSET_COLUMN, DataType::Int64, false)));
    let mut columns = keys.columns().to_vec();
    let rows = batch.batch.num_rows() as i64;
    columns.push(Arc::new(Int64Array::from_iter_values(
        batch.base_offset..batch.base_offset + rows,
    )));
    let keys = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?;
    Ok((keys, changes))
}

#[cfg(test)]
mod tests;
