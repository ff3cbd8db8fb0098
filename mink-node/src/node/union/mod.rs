//! Planning Union reads (`docs/design.md#union-read`), and reading the log part of one: a
//! bucket's log from an offset to another ([`log_range`]), a primary-key range's live
//! rows folded here for a LiveRange read (`live`), the node's own logs as the log range source
//! of a union read's plan ([`LocalLog`]), and a primary-key table's changelog rows
//! ([`changelog_rows`]), which tiering reads the same way.
//!
//! A Union plan is made per bucket at request time: the lake snapshot and the bucket's
//! `log_end_offset` from the latest recorded CommitLakeSnapshot, `log_from =
//! max(log_end_offset, log_start)` and `log_to` = the high watermark now. Fixing `log_to`
//! at plan time makes the read a consistent point-in-time result while writes go on.
//!
//! [`Node::plan_table_union`] plans every bucket of a table at once, the way
//! [`Node::plan_union`] plans one: one read of the record, one load of the lake table
//! and one planning of its files (one read of the manifests), shared by the buckets. A
//! statement that reads a whole table plans it once, not once per bucket.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{BooleanArray, RecordBatch};
use arrow::compute::filter_record_batch;
use arrow::row::Rows;
use futures::future::try_join_all;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use mink_core::change::ChangeType;
use mink_core::filter::{ColumnFilter, matches};
use mink_core::key::KeyCodec;
use mink_core::log_range::Chunk;
use mink_core::protocol::{BucketId, NotLeader, UnionPlan};
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::offsets::BucketOffsets;
use mink_lake::predicate::Pruning;
use mink_lake::reader::{LakeSplit, plan_bucket_splits};
use mink_scan::external;
use mink_scan::log_range::{LogRange, LogRangeBatch, LogSource};

use crate::error::{NodeError, Result};
use crate::lake_index::{self, LocatedRows};
use crate::node::{Bucket, BucketTablets, Node};

mod live;
mod located;

pub use live::FoldedRange;
use located::Located;
pub use located::LocatedRange;

/// A bucket's Union plan and the split of lake files it reads.
#[derive(Debug)]
pub struct PlannedUnion {
    /// The table as planned.
    pub table: Arc<TableDescriptor>,
    /// The bucket planned.
    pub id: BucketId,
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
        let mut planned = self
            .plan_buckets(table, vec![(bucket_id.clone(), bucket)], filters)
            .await?;
        planned
            .pop()
            .ok_or_else(|| NodeError::BucketNotFound(bucket_id.to_string()))
    }

    /// Plans a Union read of every bucket of a table created so far that this node leads
    /// (every partition's, partition by partition), in the order of `list_buckets`;
    /// `filters` prune the lake files read. Each bucket's plan is the one
    /// [`Self::plan_union`] makes, all from the same recorded lake snapshot. In a cluster,
    /// also what requests for the other buckets are answered: their leaders plan them.
    pub async fn plan_table_union(
        &self,
        path: &TablePath,
        filters: &[ColumnFilter],
    ) -> Result<(Vec<PlannedUnion>, Vec<NotLeader>)> {
        let (table, buckets, elsewhere) = self.led_buckets(path)?;
        let planned = self.plan_buckets(table, buckets, filters).await?;
        Ok((planned, elsewhere))
    }

    /// Plans a Union read of each of `buckets` of `table`, from one read of the latest
    /// lake snapshot record and one planning of the lake table's files.
    async fn plan_buckets(
        &self,
        table: Arc<TableDescriptor>,
        buckets: BucketTablets,
        filters: &[ColumnFilter],
    ) -> Result<Vec<PlannedUnion>> {
        check_filters(&table, filters)?;
        // The snapshot and its seams come from one record: read apart, a tiering round
        // recorded in between would pair one snapshot's files with the next one's seam.
        // Released if planning fails, or when no split has a file to read.
        let (record, hold) = self.hold_latest_lake_snapshot(&table).await?;
        let (snapshot_id, seams) = match record.filter(|_| table.lake_enabled) {
            Some(record) => (
                Some(record.snapshot_id),
                BucketOffsets::from_json(&record.offsets)?,
            ),
            None => (None, BucketOffsets::default()),
        };
        let lake_ends: Vec<i64> = buckets.iter().map(|(id, _)| seams.get(id)).collect();
        // Every bucket may have lake files, tiered or not: rows other engines appended
        // to a log table's lake lie in the bucket their partition names, below its seam.
        let ids: Vec<BucketId> = buckets.iter().map(|(id, _)| id.clone()).collect();
        let mut splits = match snapshot_id {
            Some(snapshot_id) if !ids.is_empty() => {
                let lake_table = self.lake().await?.load(&table.path).await?;
                let pruning = Pruning {
                    filters,
                    table_schema: table.schema(),
                };
                plan_bucket_splits(&lake_table, snapshot_id, &ids, Some(pruning)).await?
            }
            _ => Vec::new(),
        }
        .into_iter();
        let mut planned: Vec<PlannedUnion> = buckets
            .into_iter()
            .zip(lake_ends)
            .map(|((id, bucket), lake_end)| {
                let split = splits.next().unwrap_or_default();
                // Read after the record: the high watermark is at or past the seam.
                let (log_start, high_watermark) = bucket.log.offsets();
                let plan = UnionPlan {
                    snapshot_id,
                    lake_log_end_offset: lake_end,
                    log_from: lake_end.max(log_start),
                    log_to: high_watermark,
                    lake_files: split.files.len() as u64,
                    replaced_rows_located: false,
                };
                PlannedUnion {
                    table: Arc::clone(&table),
                    id,
                    bucket,
                    plan,
                    split,
                }
            })
            .collect();
        if let Some(snapshot_id) = snapshot_id.filter(|_| table.has_primary_key()) {
            self.locate_replaced_rows(&table, snapshot_id, &mut planned)
                .await?;
        }
        if planned.iter().any(|p| !p.split.files.is_empty()) {
            hold.keep();
        }
        Ok(planned)
    }

    /// Marks in each planned split the lake rows its range replaces, so the read leaves
    /// them out by position instead of probing every lake row's key (`mink_scan::merge`):
    /// the log ranges' keys are read here, from the local log, and located with the table's
    /// lake index; what a bucket's last plan located of the same range is reused, so
    /// only the rows written since are read ([`located`]). Nothing is marked when the
    /// ranges are longer than [`MAX_LOCATED_RANGE_ROWS`], or when rows are left to locate
    /// and the lake index is not at hand for the planned snapshot
    /// ([`lake_index::locate_lake_rows`]); the read then probes.
    async fn locate_replaced_rows(
        &self,
        table: &TableDescriptor,
        snapshot_id: i64,
        planned: &mut [PlannedUnion],
    ) -> Result<()> {
        let log_rows: i64 = planned
            .iter()
            .filter(|p| p.merges())
            .map(|p| p.plan.log_range_len())
            .sum();
        if log_rows > MAX_LOCATED_RANGE_ROWS {
            return Ok(());
        }
        let mut merging: Vec<&mut PlannedUnion> =
            planned.iter_mut().filter(|p| p.merges()).collect();
        let kept: Vec<Located> = merging
            .iter()
            .map(|p| {
                let (from, to) = (p.plan.log_from, p.plan.log_to);
                p.bucket
                    .located
                    .prefix(snapshot_id, from, to)
                    .unwrap_or(Located {
                        snapshot_id,
                        from,
                        to: from,
                        rows: Arc::default(),
                    })
            })
            .collect();
        let located = self.locate_unlocated(table, snapshot_id, &merging, &kept);
        let Some(mut more) = located.await? else {
            return Ok(());
        };
        for (planned, kept) in merging.iter_mut().zip(kept) {
            let more = more.remove(&planned.id).unwrap_or_default();
            let located = kept.extended(planned.plan.log_to, more);
            for file in &mut planned.split.files {
                file.replaced_rows = located
                    .rows
                    .get(file.path.as_str())
                    .cloned()
                    .unwrap_or_default();
            }
            planned.bucket.located.keep(located);
        }
        for planned in planned.iter_mut() {
            planned.plan.replaced_rows_located = true;
        }
        Ok(())
    }

    /// The lake rows replaced by the part of each merging bucket's range that `kept` does
    /// not cover, by bucket (buckets with nothing left out); `None` when rows are left
    /// to locate and the lake index is not at hand.
    async fn locate_unlocated(
        &self,
        table: &TableDescriptor,
        snapshot_id: i64,
        merging: &[&mut PlannedUnion],
        kept: &[Located],
    ) -> Result<Option<HashMap<BucketId, LocatedRows>>> {
        let unlocated: Vec<(&PlannedUnion, i64)> = merging
            .iter()
            .zip(kept)
            .filter(|(p, kept)| kept.to < p.plan.log_to)
            .map(|(p, kept)| (&**p, kept.to))
            .collect();
        if unlocated.is_empty() {
            return Ok(Some(HashMap::new()));
        }
        // The keys are read only when there is an index to look them up in (it may still
        // be gone by the lookup: a round can take it meanwhile).
        if !lake_index::has_lake_index(self, table.table_id, snapshot_id) {
            return Ok(None);
        }
        // Each bucket's range read and encoded on a task of its own (on all cores).
        let reads = unlocated.iter().map(|(p, from)| {
            let (bucket, table) = (Arc::clone(&p.bucket), Arc::clone(&p.table));
            let (from, to) = (*from, p.plan.log_to);
            async move {
                tokio::spawn(async move {
                    let codec = KeyCodec::new(&table)?;
                    changed_keys(bucket, from, to, &codec).await
                })
                .await
                .map_err(|e| {
                    NodeError::Read(format!("the task reading a log range's keys failed: {e}"))
                })?
            }
        });
        let keys = try_join_all(reads).await?;
        let buckets: Vec<(&BucketId, &[Rows])> = unlocated
            .iter()
            .map(|(p, _)| &p.id)
            .zip(keys.iter().map(Vec::as_slice))
            .collect();
        let located = lake_index::locate_lake_rows(self, table.table_id, snapshot_id, &buckets);
        Ok(located.map(|located| {
            let ids = unlocated.iter().map(|(p, _)| p.id.clone());
            ids.zip(located).collect()
        }))
    }
}

impl PlannedUnion {
    /// Whether the read merges a log range into lake rows.
    fn merges(&self) -> bool {
        self.plan.log_range_len() > 0 && !self.split.files.is_empty()
    }
}

/// The keys the log range `[from, to)` of a bucket changes, encoded by `codec`, a batch
/// of keys per log batch. A `-U` row is left out: the `+U` of the same key follows it in
/// its batch (the KV writer logs them in pairs), and each key looked up costs a probe of
/// the lake index.
async fn changed_keys(
    bucket: Arc<Bucket>,
    from: i64,
    to: i64,
    codec: &KeyCodec,
) -> Result<Vec<Rows>> {
    let mut batches = log_range(bucket, from, to);
    let mut keys = Vec::new();
    while let Some(batch) = batches.try_next().await? {
        let mut changed = key_columns(&batch.batch, codec)?;
        if let Some(changes) = &batch.changes {
            let before = ChangeType::UpdateBefore as u8;
            let changing: BooleanArray = changes.iter().map(|&c| Some(c != before)).collect();
            changed = filter_record_batch(&changed, &changing)?;
        }
        keys.push(codec.encode(&changed)?);
    }
    Ok(keys)
}

/// The key columns (`codec`'s, in its order) of a log batch.
fn key_columns(batch: &RecordBatch, codec: &KeyCodec) -> Result<RecordBatch> {
    let schema = batch.schema();
    let columns = codec
        .columns()
        .iter()
        .map(|column| schema.index_of(column))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(batch.project(&columns)?)
}

/// The most range rows a plan locates the replaced lake rows of
/// (`Node::locate_replaced_rows`): their keys are looked up on the planning task (about
/// 0.1 s per million) and their positions travel in the plan (about 4 bytes each).
const MAX_LOCATED_RANGE_ROWS: i64 = 1 << 20;

/// The node's own log tablets, as the log range of a union read's plan (`mink_scan`'s
/// `LogRangeExec`): the Union ticket reads the log where it lives.
#[derive(Debug)]
pub(crate) struct LocalLog {
    pub(crate) node: Arc<Node>,
}

impl LogSource for LocalLog {
    /// The whole rows of each batch (the log range normalizes them to the read schema).
    fn read(
        &self,
        range: &LogRange,
        _columns: &[u32],
    ) -> BoxStream<'static, datafusion_common::Result<LogRangeBatch>> {
        let bucket = match self.node.bucket(&range.bucket) {
            Ok((_, bucket)) => bucket,
            Err(error) => return stream::once(async { Err(external(error)) }).boxed(),
        };
        log_range(bucket, range.from, range.to)
            .map(|batch| {
                let batch = batch.map_err(external)?;
                Ok(LogRangeBatch {
                    rows: batch.batch,
                    changes: batch.changes.unwrap_or_default(),
                    base_offset: batch.base_offset,
                    commit_timestamp: batch.commit_timestamp,
                })
            })
            .boxed()
    }

    fn read_live(
        &self,
        range: &LogRange,
        columns: &[u32],
    ) -> BoxStream<'static, datafusion_common::Result<RecordBatch>> {
        let (node, range) = (Arc::clone(&self.node), range.clone());
        let columns: Vec<usize> = columns.iter().map(|&c| c as usize).collect();
        let live = async move {
            let (from, to) = (range.from, range.to);
            node.live_range(&range.bucket, from, to, &columns).await
        };
        stream::once(live)
            .map_ok(|batches| {
                stream::iter(
                    batches
                        .into_iter()
                        .map(|batch| Ok::<_, NodeError>(batch.batch)),
                )
            })
            .try_flatten()
            .map_err(external)
            .boxed()
    }
}

/// Checks that filters name columns of the table and values of their types.
pub(crate) fn check_filters(table: &TableDescriptor, filters: &[ColumnFilter]) -> Result<()> {
    let empty = RecordBatch::new_empty(Arc::clone(table.schema()));
    matches(filters, &empty)?;
    Ok(())
}

/// The log batches of `[from, to)`, trimmed to the range, read lazily
/// ([`mink_core::log_range`]).
pub fn log_range(
    bucket: Arc<Bucket>,
    from: i64,
    to: i64,
) -> futures::stream::BoxStream<'static, Result<mink_log::LogBatch>> {
    /// Bytes read from the log at a time.
    const READ_BYTES: u64 = 8 << 20;
    let log = bucket.log.dir().display().to_string();
    mink_core::log_range::read(log, from, to, move |offset| {
        let bucket = Arc::clone(&bucket);
        async move {
            let batches = bucket.log.read(offset, READ_BYTES).await?;
            let next_offset = batches.last().map_or(offset, |last| last.last_offset + 1);
            Ok(Chunk {
                batches,
                next_offset,
            })
        }
    })
}

/// A primary-key table's changelog batch in the table's current schema, with its change
/// vector.
///
/// # Errors
/// [`NodeError::Corrupt`] for a batch without change types.
pub fn changelog_rows(
    table: &TableDescriptor,
    batch: mink_log::LogBatch,
) -> Result<(RecordBatch, Vec<u8>)> {
    let changes = change_types(table, batch.changes)?;
    Ok((
        mink_core::schema::normalize_batch(&batch.batch, table.schema())?,
        changes,
    ))
}

/// The change vector of a batch of primary-key table `table`.
///
/// # Errors
/// [`NodeError::Corrupt`] when it has none.
fn change_types(table: &TableDescriptor, changes: Option<Vec<u8>>) -> Result<Vec<u8>> {
    changes.ok_or_else(|| {
        NodeError::Corrupt(format!(
            "a batch of primary-key table {} without change types",
            table.path
        ))
    })
}

#[cfg(test)]
mod tests;
