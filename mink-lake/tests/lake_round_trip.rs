//! The lake on a real SQLite catalog and real Parquet files: create, tier two rounds,
//! plan bucket splits, read them back, evolve the schema.

#![expect(
    unused_crate_dependencies,
    reason = "an integration test crate sees every dependency of the library"
)]

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use futures::TryStreamExt;
use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;
use mink_core::routing::split_by_bucket;
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::layout::{lake_arrow_schema, lake_batch};
use mink_lake::offsets::{BUCKET_OFFSETS_PROPERTY, BucketOffsets};
use mink_lake::reader::{SplitScope, plan_split, read_split};
use mink_lake::writer::{BucketWriter, commit_round};
use mink_lake::{Lake, LakeConfig, LakeError};

fn table() -> TableDescriptor {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]);
    let options = TableOptions {
        bucket_num: 3,
        bucket_key: Some(vec!["id".into()]),
        lake_enabled: true,
        ..TableOptions::default()
    };
    TableDescriptor::new(
        TablePath::new("db", "events"),
        schema,
        vec![],
        vec![],
        options,
    )
    .unwrap()
}

fn rows(table: &TableDescriptor, ids: std::ops::Range<i64>) -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(ids.clone())),
        Arc::new(StringArray::from_iter_values(ids.map(|i| format!("n{i}")))),
    ];
    RecordBatch::try_new(Arc::clone(table.schema()), columns).unwrap()
}

/// Tiers `batch` as one round on top of `offsets`; returns the new snapshot id.
async fn tier(
    lake: &Lake,
    table: &TableDescriptor,
    batch: &RecordBatch,
    offsets: &mut BucketOffsets,
) -> i64 {
    let lake_table = lake.load(&table.path).await.unwrap();
    let arrow = lake_arrow_schema(lake_table.metadata().current_schema()).unwrap();
    let mut files = Vec::new();
    for (bucket, part) in split_by_bucket(table, batch, 0).unwrap() {
        let base = offsets.get(&bucket);
        let lake_rows = lake_batch(&arrow, &part, bucket.bucket, base, 1_700_000_000_000).unwrap();
        let mut writer = BucketWriter::new(&lake_table, &bucket).unwrap();
        writer.write(lake_rows).await.unwrap();
        files.extend(writer.close().await.unwrap());
        offsets.set(&bucket, base + part.num_rows() as i64);
    }
    let parent = lake_table.metadata().current_snapshot_id();
    let committed = commit_round(lake, &lake_table, parent, files, offsets)
        .await
        .unwrap();
    committed.metadata().current_snapshot_id().unwrap()
}

async fn bucket_ids(
    lake: &Lake,
    table: &TableDescriptor,
    snapshot: i64,
    bucket: u32,
    schema: Arc<Schema>,
) -> Vec<i64> {
    let lake_table = lake.load(&table.path).await.unwrap();
    let scope = SplitScope::Bucket(BucketId::new(&table.path, bucket));
    let split = plan_split(&lake_table, snapshot, &scope, None)
        .await
        .unwrap();
    let batches: Vec<RecordBatch> = read_split(lake.storage(), split, schema)
        .try_collect()
        .await
        .unwrap();
    let mut ids: Vec<i64> = batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    ids.sort_unstable();
    ids
}

#[tokio::test]
async fn tiered_rounds_read_back_per_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(LakeConfig::embedded(dir.path()).unwrap())
        .await
        .unwrap();
    let table = table();
    lake.create_table(&table).await.unwrap();
    lake.create_table(&table).await.unwrap(); // idempotent
    assert!(dir.path().join("lake/catalog.db").exists());

    let mut offsets = BucketOffsets::default();
    let first = tier(&lake, &table, &rows(&table, 0..100), &mut offsets).await;
    let second = tier(&lake, &table, &rows(&table, 100..150), &mut offsets).await;

    // The summary carries the complete offsets; each bucket's split has exactly its rows.
    let lake_table = lake.load(&table.path).await.unwrap();
    let summary = lake_table
        .metadata()
        .snapshot_by_id(second)
        .unwrap()
        .summary();
    let recorded =
        BucketOffsets::from_json(&summary.additional_properties[BUCKET_OFFSETS_PROPERTY]).unwrap();
    assert_eq!(recorded, offsets);
    let projected = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let mut all = Vec::new();
    for bucket in 0..3 {
        let ids = bucket_ids(&lake, &table, second, bucket, Arc::clone(&projected)).await;
        let expected: Vec<i64> = (0..150)
            .filter(|i| {
                let batch = rows(&table, *i..*i + 1);
                split_by_bucket(&table, &batch, 0).unwrap()[0].0.bucket == bucket
            })
            .collect();
        assert_eq!(ids, expected, "bucket {bucket}");
        all.extend(ids);
    }
    assert_eq!(all.len(), 150);
    // The first snapshot still reads as it was.
    let older: usize = {
        let split = plan_split(&lake_table, first, &SplitScope::Table, None)
            .await
            .unwrap();
        assert_eq!(split.record_count(), 100);
        let batches: Vec<RecordBatch> = read_split(lake.storage(), split, Arc::clone(&projected))
            .try_collect()
            .await
            .unwrap();
        batches.iter().map(RecordBatch::num_rows).sum()
    };
    assert_eq!(older, 100);
    let err = plan_split(&lake_table, 42, &SplitScope::Table, None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LakeError::SnapshotNotFound {
                snapshot_id: 42,
                ..
            }
        ),
        "{err}"
    );

    // A column added later reads as null from older files.
    lake.add_column(&table.path, &Field::new("score", DataType::Int64, true))
        .await
        .unwrap();
    let evolved = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("score", DataType::Int64, true),
    ]));
    let split = plan_split(
        &lake.load(&table.path).await.unwrap(),
        second,
        &SplitScope::Table,
        None,
    )
    .await
    .unwrap();
    let batches: Vec<RecordBatch> = read_split(lake.storage(), split, evolved)
        .try_collect()
        .await
        .unwrap();
    assert!(
        batches
            .iter()
            .all(|b| b.column(1).null_count() == b.num_rows())
    );

    lake.drop_table(&table.path).await.unwrap();
    assert!(!lake.exists(&table.path).await.unwrap());
}
