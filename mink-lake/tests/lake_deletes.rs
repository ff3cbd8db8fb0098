//! Metadata-layer commits on a real SQLite catalog and real Parquet files: position
//! deletes, a replace (compaction), equality deletes, conflicts. Iceberg's own reader is
//! the judge of what the table holds.

#![expect(
    unused_crate_dependencies,
    reason = "an integration test crate sees every dependency of the library"
)]

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::compute::filter_record_batch;
use arrow::compute::kernels::cmp::eq;
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use futures::TryStreamExt;
use iceberg::scan::FileScanTask;
use iceberg::spec::{DataContentType, DataFile, Literal, Operation, PrimitiveLiteral, Struct};
use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;
use mink_core::routing::split_by_bucket;
use mink_core::schema::normalize_batch;
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::commit::{SnapshotChanges, commit_snapshot};
use mink_lake::deletes::{delete_equality, write_position_deletes};
use mink_lake::layout::{BUCKET_COLUMN, lake_arrow_schema, lake_batch};
use mink_lake::offsets::{BUCKET_OFFSETS_PROPERTY, BucketOffsets};
use mink_lake::writer::{BucketWriter, commit_round};
use mink_lake::{Lake, LakeConfig, LakeError, LakeTable};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

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
        TablePath::new("db", "users"),
        schema,
        vec!["id".into()],
        vec![],
        options,
    )
    .unwrap()
}

fn rows(table: &TableDescriptor, ids: impl IntoIterator<Item = i64> + Clone) -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(ids.clone())),
        Arc::new(StringArray::from_iter_values(
            ids.into_iter().map(|i| format!("n{i}")),
        )),
    ];
    RecordBatch::try_new(Arc::clone(table.schema()), columns).unwrap()
}

async fn open() -> (tempfile::TempDir, Lake, TableDescriptor) {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(LakeConfig::embedded(dir.path()).unwrap())
        .await
        .unwrap();
    let table = table();
    lake.create_table(&table).await.unwrap();
    (dir, lake, table)
}

/// Tiers `batch` as one round; returns the committed table and the round's files.
async fn tier(
    lake: &Lake,
    table: &TableDescriptor,
    batch: &RecordBatch,
    offsets: &mut BucketOffsets,
) -> (LakeTable, Vec<DataFile>) {
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
    let committed = commit_round(lake, &lake_table, parent, files.clone(), offsets)
        .await
        .unwrap();
    (committed, files)
}

fn snapshot(table: &LakeTable) -> i64 {
    table.metadata().current_snapshot_id().unwrap()
}

/// Every row of a snapshot, as iceberg's own reader returns it (deletes applied).
async fn scan(table: &LakeTable, snapshot_id: i64) -> Vec<RecordBatch> {
    table
        .scan()
        .snapshot_id(snapshot_id)
        .build()
        .unwrap()
        .to_arrow()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

async fn scan_ids(table: &LakeTable, snapshot_id: i64) -> Vec<i64> {
    let mut ids: Vec<i64> = scan(table, snapshot_id)
        .await
        .iter()
        .flat_map(|b| {
            b.column_by_name("id")
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect();
    ids.sort_unstable();
    ids
}

async fn tasks(table: &LakeTable, snapshot_id: i64) -> Vec<FileScanTask> {
    table
        .scan()
        .snapshot_id(snapshot_id)
        .build()
        .unwrap()
        .plan_files()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

fn bucket_of(partition: &Struct) -> u32 {
    match partition.fields() {
        [Some(Literal::Primitive(PrimitiveLiteral::Int(b)))] => u32::try_from(*b).unwrap(),
        other => panic!("not a bucket partition: {other:?}"),
    }
}

/// The ids of a data file, in row order.
fn file_ids(path: &str) -> Vec<i64> {
    let file = std::fs::File::open(path).unwrap();
    ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap()
        .flat_map(|b| {
            b.unwrap()
                .column_by_name("id")
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect()
}

fn listing(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn metadata_dir(table: &LakeTable) -> std::path::PathBuf {
    Path::new(table.metadata().location()).join("metadata")
}

fn summary(table: &LakeTable, snapshot_id: i64) -> HashMap<String, String> {
    let snapshot = table.metadata().snapshot_by_id(snapshot_id).unwrap();
    snapshot.summary().additional_properties.clone()
}

#[tokio::test]
async fn position_deletes_hide_rows_and_a_stale_parent_is_a_conflict() {
    let (_dir, lake, table) = open().await;
    let mut offsets = BucketOffsets::default();
    let (appended, files) = tier(&lake, &table, &rows(&table, 0..30), &mut offsets).await;
    let first = snapshot(&appended);
    assert_eq!(
        scan_ids(&appended, first).await,
        (0..30).collect::<Vec<_>>()
    );

    // Delete rows 0 and 2 of one data file.
    let target = &files[0];
    let bucket = BucketId::new(&table.path, bucket_of(target.partition()));
    let ids = file_ids(target.file_path());
    let path = target.file_path().to_string();
    let deletes = write_position_deletes(
        &appended,
        &bucket,
        target.partition(),
        vec![(path.clone(), 2), (path.clone(), 0), (path.clone(), 2)],
    )
    .await
    .unwrap();
    assert_eq!(deletes.content_type(), DataContentType::PositionDeletes);
    assert_eq!(deletes.record_count(), 2);
    assert_eq!(deletes.referenced_data_file(), Some(path.clone()));
    assert!(
        deletes
            .file_path()
            .contains(&format!("/data/bucket={}/", bucket.bucket)),
        "{}",
        deletes.file_path()
    );

    let changes = SnapshotChanges {
        added_delete_files: vec![deletes],
        ..SnapshotChanges::default()
    };
    let deleted = commit_snapshot(&lake, &appended, Some(first), Operation::Delete, changes)
        .await
        .unwrap();
    let second = snapshot(&deleted);
    assert_eq!(
        deleted
            .metadata()
            .snapshot_by_id(second)
            .unwrap()
            .parent_snapshot_id(),
        Some(first)
    );
    let gone: HashSet<i64> = HashSet::from([ids[0], ids[2]]);
    let expected: Vec<i64> = (0..30).filter(|i| !gone.contains(i)).collect();
    assert_eq!(scan_ids(&deleted, second).await, expected);
    // The catalog agrees, and the first snapshot still reads as it was.
    let reloaded = lake.load(&table.path).await.unwrap();
    assert_eq!(snapshot(&reloaded), second);
    assert_eq!(
        scan_ids(&reloaded, first).await,
        (0..30).collect::<Vec<_>>()
    );

    let s = summary(&deleted, second);
    assert_eq!(
        deleted
            .metadata()
            .snapshot_by_id(second)
            .unwrap()
            .summary()
            .operation,
        Operation::Delete
    );
    assert_eq!(s["added-delete-files"], "1");
    assert_eq!(s["added-position-deletes"], "2");
    assert_eq!(s["total-records"], "30");
    assert_eq!(s["total-data-files"], files.len().to_string());
    assert_eq!(s["total-delete-files"], "1");
    assert_eq!(s["total-position-deletes"], "2");
    assert_eq!(s["total-equality-deletes"], "0");
    assert!(!s.contains_key("added-data-files"));
    assert!(!s.contains_key(BUCKET_OFFSETS_PROPERTY));

    // A commit planned on the first snapshot is a conflict and leaves nothing behind.
    let before = listing(&metadata_dir(&deleted));
    let more = write_position_deletes(&appended, &bucket, target.partition(), vec![(path, 1)])
        .await
        .unwrap();
    let changes = SnapshotChanges {
        added_delete_files: vec![more],
        ..SnapshotChanges::default()
    };
    let err = commit_snapshot(&lake, &appended, Some(first), Operation::Delete, changes)
        .await
        .unwrap_err();
    assert!(matches!(err, LakeError::CommitConflict { .. }), "{err}");
    assert!(err.to_string().contains(&first.to_string()), "{err}");
    assert_eq!(listing(&metadata_dir(&deleted)), before);
    assert_eq!(snapshot(&lake.load(&table.path).await.unwrap()), second);

    // A tiering round planned on the first snapshot is a conflict too (no rebase).
    let err = commit_round(&lake, &appended, Some(first), Vec::new(), &offsets)
        .await
        .unwrap_err();
    assert!(matches!(err, LakeError::CommitConflict { .. }), "{err}");
    assert_eq!(listing(&metadata_dir(&deleted)), before);
}

#[tokio::test]
async fn a_replace_keeps_the_rows_and_the_old_snapshot() {
    let (_dir, lake, table) = open().await;
    let mut offsets = BucketOffsets::default();
    tier(&lake, &table, &rows(&table, 0..40), &mut offsets).await;
    let (appended, files) = tier(&lake, &table, &rows(&table, 40..80), &mut offsets).await;

    // A position delete in one bucket, so the replace folds deletes too.
    let target = &files[0];
    let bucket = BucketId::new(&table.path, bucket_of(target.partition()));
    let deletes = write_position_deletes(
        &appended,
        &bucket,
        target.partition(),
        vec![(target.file_path().to_string(), 1)],
    )
    .await
    .unwrap();
    let deleted = commit_snapshot(
        &lake,
        &appended,
        Some(snapshot(&appended)),
        Operation::Delete,
        SnapshotChanges {
            added_delete_files: vec![deletes],
            ..SnapshotChanges::default()
        },
    )
    .await
    .unwrap();
    let before = snapshot(&deleted);
    let ids_before = scan_ids(&deleted, before).await;
    assert_eq!(ids_before.len(), 79);

    // The bucket's files: two data files (one per round) and the delete file.
    let bucket_tasks: Vec<FileScanTask> = tasks(&deleted, before)
        .await
        .into_iter()
        .filter(|t| bucket_of(t.partition.as_ref().unwrap()) == bucket.bucket)
        .collect();
    assert_eq!(bucket_tasks.len(), 2);
    let mut removed: HashSet<String> = HashSet::new();
    for task in &bucket_tasks {
        removed.insert(task.data_file_path.clone());
        removed.extend(task.deletes.iter().map(|d| d.file_path.clone()));
    }
    assert_eq!(removed.len(), 3);

    // Rewrite the bucket's live rows into one file.
    let arrow = lake_arrow_schema(deleted.metadata().current_schema()).unwrap();
    let mut writer = BucketWriter::new(&deleted, &bucket).unwrap();
    let mut live_rows = 0;
    for batch in scan(&deleted, before).await {
        let buckets = batch.column_by_name(BUCKET_COLUMN).unwrap();
        let mask = eq(
            buckets,
            &arrow::array::Int32Array::new_scalar(i32::try_from(bucket.bucket).unwrap()),
        )
        .unwrap();
        let live = normalize_batch(&filter_record_batch(&batch, &mask).unwrap(), &arrow).unwrap();
        live_rows += live.num_rows();
        writer.write(live).await.unwrap();
    }
    let rewritten = writer.close().await.unwrap();
    assert_eq!(rewritten.len(), 1);
    let removed_records: u64 = bucket_tasks.iter().filter_map(|t| t.record_count).sum();

    let replaced = commit_snapshot(
        &lake,
        &deleted,
        Some(before),
        Operation::Replace,
        SnapshotChanges {
            added_data_files: rewritten.clone(),
            removed_files: removed.clone(),
            ..SnapshotChanges::default()
        },
    )
    .await
    .unwrap();
    let after = snapshot(&replaced);
    assert_eq!(scan_ids(&replaced, after).await, ids_before);

    // The bucket is one file without deletes now; the other buckets are untouched.
    let after_tasks = tasks(&replaced, after).await;
    let in_bucket: Vec<&FileScanTask> = after_tasks
        .iter()
        .filter(|t| bucket_of(t.partition.as_ref().unwrap()) == bucket.bucket)
        .collect();
    assert_eq!(in_bucket.len(), 1);
    assert_eq!(in_bucket[0].data_file_path, rewritten[0].file_path());
    assert!(in_bucket[0].deletes.is_empty());
    assert_eq!(after_tasks.len(), files.len() * 2 - 1);

    let s = summary(&replaced, after);
    assert_eq!(
        replaced
            .metadata()
            .snapshot_by_id(after)
            .unwrap()
            .summary()
            .operation,
        Operation::Replace
    );
    assert_eq!(s["added-data-files"], "1");
    assert_eq!(s["deleted-data-files"], "2");
    assert_eq!(s["removed-delete-files"], "1");
    assert_eq!(s["removed-position-deletes"], "1");
    assert_eq!(s["deleted-records"], removed_records.to_string());
    assert_eq!(s["added-records"], live_rows.to_string());
    assert_eq!(
        s["total-records"],
        (80 - removed_records + live_rows as u64).to_string()
    );
    assert_eq!(s["total-data-files"], (files.len() * 2 - 1).to_string());
    assert_eq!(s["total-delete-files"], "0");
    assert_eq!(s["total-position-deletes"], "0");

    // The old snapshot still reads its old files, which are still there.
    assert_eq!(scan_ids(&replaced, before).await, ids_before);
    for path in &removed {
        assert!(Path::new(path).exists(), "{path}");
    }

    // Removing a file that is no longer live fails, and leaves no files behind.
    let listed = listing(&metadata_dir(&replaced));
    let err = commit_snapshot(
        &lake,
        &replaced,
        Some(after),
        Operation::Replace,
        SnapshotChanges {
            removed_files: removed,
            ..SnapshotChanges::default()
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(err, LakeError::Layout { .. }), "{err}");
    assert!(err.to_string().contains("not live"), "{err}");
    assert_eq!(listing(&metadata_dir(&replaced)), listed);
}

#[tokio::test]
async fn equality_deletes_remove_keys_until_they_are_written_again() {
    let (_dir, lake, table) = open().await;
    let mut offsets = BucketOffsets::default();
    let (appended, _) = tier(&lake, &table, &rows(&table, 0..30), &mut offsets).await;
    let first = snapshot(&appended);

    let doomed = [3_i64, 7, 11, 20, 21];
    let keys = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)])),
        vec![Arc::new(Int64Array::from(doomed.to_vec()))],
    )
    .unwrap();
    let deleted = delete_equality(&lake, &appended, &keys, &["id"])
        .await
        .unwrap();
    let second = snapshot(&deleted);
    let expected: Vec<i64> = (0..30).filter(|i| !doomed.contains(i)).collect();
    assert_eq!(scan_ids(&deleted, second).await, expected);
    assert_eq!(scan_ids(&deleted, first).await, (0..30).collect::<Vec<_>>());

    // One file per bucket the keys fall in, in that bucket's directory.
    let buckets: BTreeSet<u32> = split_by_bucket(&table, &rows(&table, doomed), 0)
        .unwrap()
        .into_iter()
        .map(|(b, _)| b.bucket)
        .collect();
    let delete_files: Vec<String> = tasks(&deleted, second)
        .await
        .iter()
        .flat_map(|t| {
            let bucket = bucket_of(t.partition.as_ref().unwrap());
            t.deletes.iter().map(move |d| {
                assert_eq!(d.equality_ids, Some(vec![1]));
                assert!(
                    d.file_path.contains(&format!("/data/bucket={bucket}/")),
                    "{}",
                    d.file_path
                );
                d.file_path.clone()
            })
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(delete_files.len(), buckets.len());

    let s = summary(&deleted, second);
    assert_eq!(
        deleted
            .metadata()
            .snapshot_by_id(second)
            .unwrap()
            .summary()
            .operation,
        Operation::Delete
    );
    assert!(!s.contains_key(BUCKET_OFFSETS_PROPERTY));
    assert_eq!(s["added-equality-deletes"], doomed.len().to_string());
    assert_eq!(s["added-delete-files"], buckets.len().to_string());
    assert_eq!(s["total-equality-deletes"], doomed.len().to_string());
    assert_eq!(s["total-records"], "30");

    // A later round writes key 3 again: newer data is not hit by the older delete.
    let (again, _) = tier(&lake, &table, &rows(&table, [3]), &mut offsets).await;
    let third = snapshot(&again);
    let mut expected = expected;
    expected.push(3);
    expected.sort_unstable();
    assert_eq!(scan_ids(&again, third).await, expected);
    let s = summary(&again, third);
    assert_eq!(s["total-records"], "31");
    assert_eq!(s["total-equality-deletes"], doomed.len().to_string());
    assert!(s.contains_key(BUCKET_OFFSETS_PROPERTY));

    // Keys without the partition source column are refused.
    let names = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("name", DataType::Utf8, true)])),
        vec![Arc::new(StringArray::from(vec!["n1"]))],
    )
    .unwrap();
    let err = delete_equality(&lake, &again, &names, &["name"])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("id_bucket"), "{err}");
}
