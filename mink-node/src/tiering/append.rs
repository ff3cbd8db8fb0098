//! Tiering a log table's bucket: its rows of `[from, to)` appended as they are.

use std::ops::Range;
use std::sync::Arc;

use futures::TryStreamExt;
use mink_core::protocol::BucketId;
use mink_core::schema::normalize_batch;
use mink_lake::layout::lake_batch;
use mink_lake::writer::BucketWriter;

use super::RoundTarget;
use super::upsert::BucketRound;
use crate::error::Result;
use crate::node::Bucket;
use crate::union::log_range;

/// The log `[from, to)` of a log table's bucket as data files.
pub(super) async fn tier_bucket(
    target: &RoundTarget<'_>,
    bucket_id: &BucketId,
    bucket: &Arc<Bucket>,
    range: Range<i64>,
) -> Result<BucketRound> {
    let mut writer = BucketWriter::new(target.lake_table, bucket_id)?;
    let mut rows = 0u64;
    let mut log = log_range(Arc::clone(bucket), range.start, range.end);
    while let Some(batch) = log.try_next().await? {
        let current = normalize_batch(&batch.batch, target.table.schema())?;
        let lake_rows = lake_batch(
            &target.lake_schema,
            &current,
            bucket_id.bucket,
            batch.base_offset,
            batch.commit_timestamp,
        )?;
        writer.write(lake_rows).await?;
        rows += current.num_rows() as u64;
    }
    Ok(BucketRound {
        data_files: writer.close().await?,
        rows,
        ..BucketRound::default()
    })
}
