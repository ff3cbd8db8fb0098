//! Tiering a log table's bucket: its rows of `[from, to)` appended as they are.

use futures::{Stream, TryStreamExt};
use mink_core::protocol::BucketId;
use mink_core::schema::normalize_batch;
use mink_lake::layout::lake_batch;
use mink_lake::writer::BucketWriter;

use super::RoundTarget;
use super::upsert::BucketRound;
use crate::error::Result;
use mink_log::LogBatch;

/// A log table's bucket log (its batches in log order, read one at a time) as data files.
pub(super) async fn tier_log(
    target: &RoundTarget<'_>,
    bucket_id: &BucketId,
    mut log: impl Stream<Item = Result<LogBatch>> + Unpin,
) -> Result<BucketRound> {
    let mut writer = BucketWriter::new(target.lake_table, bucket_id)?;
    let mut rows = 0u64;
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};
    use mink_lake::Operation;
    use mink_lake::commit::SnapshotChanges;

    use super::super::tests::{I, TestLake, bucket, log_batch, log_table};
    use super::*;

    /// A log table's batch at `base_offset` committed at `commit_ms`.
    fn batch(lake: &TestLake, base_offset: i64, commit_ms: i64, rows: &[(i64, &str)]) -> LogBatch {
        let rows: Vec<(u8, i64, &str)> = rows.iter().map(|(id, name)| (I, *id, *name)).collect();
        let mut batch = log_batch(&lake.table, base_offset, commit_ms, &rows);
        batch.changes = None;
        batch
    }

    /// Tiers `log` into bucket 0 and commits it; returns what the round did.
    async fn tier(lake: &mut TestLake, log: Vec<LogBatch>) -> BucketRound {
        let target = lake.target();
        let log = futures::stream::iter(log.into_iter().map(Ok));
        let mut round = tier_log(&target, &bucket(&lake.table, 0), log)
            .await
            .unwrap();
        let changes = SnapshotChanges {
            added_data_files: std::mem::take(&mut round.data_files),
            ..SnapshotChanges::default()
        };
        lake.commit(Operation::Append, changes).await;
        round
    }

    #[tokio::test]
    async fn a_log_tables_rows_are_appended_as_they_are_with_their_offsets_and_times() {
        let mut lake = TestLake::open_with(log_table()).await;
        let log = vec![
            batch(&lake, 10, 1_000, &[(1, "a"), (1, "a2")]),
            batch(&lake, 12, 2_000, &[(2, "b")]),
        ];
        let round = tier(&mut lake, log).await;
        assert_eq!((round.rows, round.deleted_rows), (3, 0));
        assert!(round.delete_files.is_empty());
        let s = |text: &str| Some(text.to_string());
        assert_eq!(
            lake.rows().await,
            [
                (1, s("a"), 0, 10, 1_000_000),
                (1, s("a2"), 0, 11, 1_000_000),
                (2, s("b"), 0, 12, 2_000_000),
            ]
        );
        assert_eq!(lake.bucket_split().await.files.len(), 1);
    }

    #[tokio::test]
    async fn a_log_table_batch_of_an_older_schema_is_appended_in_the_current_one() {
        let mut lake = TestLake::open_with(log_table()).await;
        let old = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let ids: ArrayRef = Arc::new(Int64Array::from(vec![7, 8]));
        let mut old_batch = batch(&lake, 0, 5, &[(7, ""), (8, "")]);
        old_batch.batch = RecordBatch::try_new(old, vec![ids]).unwrap();
        let round = tier(&mut lake, vec![old_batch]).await;
        assert_eq!(round.rows, 2);
        assert_eq!(
            lake.rows().await,
            [(7, None, 0, 0, 5_000), (8, None, 0, 1, 5_000)]
        );
    }

    #[tokio::test]
    async fn an_empty_log_writes_no_file() {
        let lake = TestLake::open_with(log_table()).await;
        let target = lake.target();
        let log = futures::stream::iter(Vec::<Result<LogBatch>>::new());
        let round = tier_log(&target, &bucket(&lake.table, 0), log)
            .await
            .unwrap();
        assert_eq!(round.rows, 0);
        assert!(round.data_files.is_empty());
    }
}
