//! Planning Union reads (`spec/union-read.md`), and reading the log part of one: a
//! bucket's log from an offset to another ([`log_range`]), and a primary-key table's
//! changelog rows ([`changelog_rows`]), which tiering reads the same way.
//!
//! A Union plan is made per bucket at request time: the lake snapshot and the bucket's
//! `log_end_offset` from the latest recorded CommitLakeSnapshot, `log_from =
//! max(log_end_offset, log_start)` and `log_to` = the high watermark now. Fixing `log_to`
//! at plan time makes the read a consistent point-in-time result while writes go on.

use std::sync::Arc;

use mink_core::filter::{ColumnFilter, matches};
use mink_core::protocol::{BucketId, UnionPlan};
use mink_core::table::TableDescriptor;
use mink_lake::offsets::BucketOffsets;
use mink_lake::predicate::to_predicate;
use mink_lake::reader::{LakeSplit, SplitScope, plan_split};

use crate::error::{NodeError, Result};
use crate::node::{Bucket, Node};

/// A bucket's Union plan and the split of lake files it reads.
#[derive(Debug)]
pub struct PlannedUnion {
    /// The table as planned.
    pub table: Arc<TableDescriptor>,
    /// The bucket's tablets.
    pub bucket: Arc<Bucket>,
    /// The plan (sent to the client at the end of the answer).
    pub plan: UnionPlan,
    /// The lake files below the seam.
    pub split: LakeSplit,
}

impl Node {
    /// Plans a Union read of `bucket`; `filters` prune the lake files read.
    pub async fn plan_union(
        &self,
        bucket_id: &BucketId,
        filters: &[ColumnFilter],
    ) -> Result<PlannedUnion> {
        let (table, bucket) = self.bucket(bucket_id)?;
        check_filters(&table, filters)?;
        // The snapshot and its seam come from one record: read apart, a tiering round
        // recorded in between would pair one snapshot's files with the next one's seam.
        let record = self.metadata.latest_lake_snapshot(table.table_id)?;
        let (snapshot_id, lake_end, split) = match record.filter(|_| table.lake_enabled) {
            Some(record) => {
                let lake_end = BucketOffsets::from_json(&record.offsets)?.get(bucket_id);
                let split = if lake_end > 0 {
                    let lake_table = self.lake().await?.load(&table.path).await?;
                    let scope = SplitScope::Bucket(bucket_id.clone());
                    let predicate = to_predicate(filters, table.schema());
                    plan_split(&lake_table, record.snapshot_id, &scope, predicate).await?
                } else {
                    LakeSplit::default()
                };
                (Some(record.snapshot_id), lake_end, split)
            }
            None => (None, 0, LakeSplit::default()),
        };
        let (log_start, high_watermark) = bucket.log.offsets();
        let plan = UnionPlan {
            snapshot_id,
            lake_log_end_offset: lake_end,
            log_from: lake_end.max(log_start),
            log_to: high_watermark,
            lake_files: split.files.len() as u64,
        };
        Ok(PlannedUnion {
            table,
            bucket,
            plan,
            split,
        })
    }
}

/// Checks that filters name columns of the table and values of their types.
pub(crate) fn check_filters(table: &TableDescriptor, filters: &[ColumnFilter]) -> Result<()> {
    let empty = arrow::array::RecordBatch::new_empty(Arc::clone(table.schema()));
    matches(filters, &empty)?;
    Ok(())
}

/// The log batches of `[from, to)`, trimmed to the range, read lazily.
pub fn log_range(
    bucket: Arc<Bucket>,
    from: i64,
    to: i64,
) -> futures::stream::BoxStream<'static, Result<crate::log::LogBatch>> {
    use futures::{StreamExt, TryStreamExt};
    /// Bytes read from the log at a time.
    const READ_BYTES: u64 = 8 << 20;
    futures::stream::try_unfold(from, move |offset| {
        let bucket = Arc::clone(&bucket);
        async move {
            if offset >= to {
                return Ok::<_, NodeError>(None);
            }
            let batches = bucket.log.read(offset, READ_BYTES).await?;
            let Some(last) = batches.last() else {
                return Ok(None);
            };
            let next = last.last_offset + 1;
            let trimmed: Vec<Result<crate::log::LogBatch>> = batches
                .into_iter()
                .filter_map(|batch| trim(batch, offset, to))
                .map(Ok)
                .collect();
            Ok(Some((futures::stream::iter(trimmed), next)))
        }
    })
    .try_flatten()
    .boxed()
}

/// A primary-key table's changelog batch in the table's current schema, with its change
/// vector.
///
/// # Errors
/// [`NodeError::Corrupt`] for a batch without change types.
pub fn changelog_rows(
    table: &TableDescriptor,
    batch: crate::log::LogBatch,
) -> Result<(arrow::array::RecordBatch, Vec<u8>)> {
    let changes = batch.changes.ok_or_else(|| {
        NodeError::Corrupt(format!(
            "a batch of primary-key table {} without change types",
            table.path
        ))
    })?;
    Ok((
        mink_core::schema::normalize_batch(&batch.batch, table.schema())?,
        changes,
    ))
}

/// The part of a log batch inside `[from, to)`.
fn trim(mut batch: crate::log::LogBatch, from: i64, to: i64) -> Option<crate::log::LogBatch> {
    let start = (from - batch.base_offset).max(0) as usize;
    let end = ((to - batch.base_offset).max(0) as usize).min(batch.batch.num_rows());
    if end <= start {
        return None;
    }
    if start > 0 || end < batch.batch.num_rows() {
        batch.batch = batch.batch.slice(start, end - start);
        if let Some(changes) = &mut batch.changes {
            *changes = changes[start..end].to_vec();
        }
        batch.base_offset += start as i64;
        batch.last_offset = batch.base_offset + (end - start) as i64 - 1;
    }
    Some(batch)
}
