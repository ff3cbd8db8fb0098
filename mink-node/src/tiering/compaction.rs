//! Compaction: rewriting a bucket's lake files without their deleted rows.
//!
//! Every round of a primary-key table adds a small data file and a position-delete file
//! per changed bucket; reads get slower as they pile up. Compaction reads a bucket's live
//! rows (deletes applied) and writes them again as few files, in one Iceberg `replace`
//! snapshot that removes the old data and delete files: the table's rows do not change,
//! only their files. The snapshot carries the recorded `mink.bucket-offsets` forward, so
//! the tiering seam does not move.
//!
//! Old files are not deleted: a reader that planned on an older snapshot still finds
//! every file it planned. They go with the snapshots that name them, when snapshot expiry
//! removes those and no running read holds them ([`super::upkeep`]).
//!
//! A bucket is compacted automatically after a round when it has more than
//! eight files or, for a primary-key table, when a fifth of its lake rows are
//! deleted; [`compact_table`] compacts every bucket with more than one file or any
//! delete file.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use datafusion_execution::TaskContext;
use futures::TryStreamExt;
use mink_core::key::KeyCodec;
use mink_core::protocol::BucketId;
use mink_core::schema::normalize_batch;
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::Operation;
use mink_lake::commit::SnapshotChanges;
use mink_lake::layout::{BUCKET_COLUMN, OFFSET_COLUMN, TIMESTAMP_COLUMN, lake_arrow_schema};
use mink_lake::reader::{LakeSplit, SplitScope, plan_split};
use mink_lake::storage::LakeStorage;
use mink_lake::writer::{BucketWriter, delete_files};
use mink_lake::{DataFile, LakeTable};
use mink_scan::lake_scan::LakeScan;
use mink_scan::union::execute_in_order;
use tracing::info;

use super::{commit_and_record, current_index, open_lake_table, reconcile, recorded_offsets};
use crate::error::{NodeError, Result};
use crate::lake_index::{BucketIndex, MAX_FILES, split_by_bucket};
use crate::node::{Failpoint, Node};

/// Where a test crashes a `replace` commit (compaction's, and rewriting manifests'):
/// before it, and after it but before mink records it.
/// What a compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// The `replace` snapshot committed; `None` when no bucket needed it.
    pub snapshot_id: Option<i64>,
    /// Buckets compacted.
    pub buckets: u64,
    /// Data and delete files the snapshot removed.
    pub files_removed: u64,
    /// Data files written.
    pub files_written: u64,
    /// Live rows rewritten.
    pub rows: u64,
}

/// Which buckets to compact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Selection {
    /// Those due (too many files or deleted rows).
    Due,
    /// Every bucket with more than one file or any delete file.
    All,
}

/// Compacts every bucket of a table's lake that has more than one file or any deletes,
/// in one `replace` snapshot.
///
/// # Errors
/// [`NodeError::NoLake`] for a table without a lake; lake errors otherwise (nothing is
/// then committed, and the files written are deleted).
pub async fn compact_table(node: &Node, path: &TablePath) -> Result<CompactReport> {
    compact(node, path, Selection::All).await
}

/// Compacts the buckets due for it (after a tiering round).
pub(super) async fn compact_due(node: &Node, path: &TablePath) -> Result<CompactReport> {
    compact(node, path, Selection::Due).await
}

async fn compact(node: &Node, path: &TablePath, selection: Selection) -> Result<CompactReport> {
    super::metrics::upkeep("compaction", run_compaction(node, path, selection)).await
}

/// [`compact`] without its metrics.
async fn run_compaction(
    node: &Node,
    path: &TablePath,
    selection: Selection,
) -> Result<CompactReport> {
    let mut indexes = node.tiering.lock().await;
    let (table, lake, mut lake_table) = open_lake_table(node, path).await?;
    reconcile(node, &table, &mut lake_table).await?;
    let Some(snapshot_id) = lake_table.metadata().current_snapshot_id() else {
        return Ok(CompactReport::default());
    };
    let mut index = match table.has_primary_key() {
        true => Some(current_index(&mut indexes, lake, &table, &lake_table).await?),
        false => None,
    };
    let due: Option<HashSet<BucketId>> = index
        .as_ref()
        .map(|index| index.buckets_to_compact().into_iter().collect());
    if selection == Selection::Due && due.as_ref().is_some_and(HashSet::is_empty) {
        indexes.extend(index.map(|index| (table.table_id, index)));
        return Ok(CompactReport::default());
    }
    let split = plan_split(&lake_table, snapshot_id, &SplitScope::Table, None).await?;
    let chosen: Vec<(BucketId, LakeSplit)> = split_by_bucket(&lake_table, split, &table)?
        .into_iter()
        .filter(|(bucket, split)| selected(selection, due.as_ref(), bucket, split))
        .collect();
    if chosen.is_empty() {
        indexes.extend(index.map(|index| (table.table_id, index)));
        return Ok(CompactReport::default());
    }

    let rewrite = Rewrite::new(&table, &lake_table, node.read_context())?;
    let mut changes = SnapshotChanges::default();
    let mut report = CompactReport::default();
    let work = async {
        for (bucket, split) in chosen {
            for file in &split.files {
                changes.removed_files.insert(file.path.clone());
                changes
                    .removed_files
                    .extend(file.deletes.iter().map(|d| d.path.clone()));
            }
            let storage = node.lake().await?.storage();
            let (files, keys, rows) = rewrite.bucket(storage, &bucket, split).await?;
            if let Some(index) = index.as_mut() {
                let mut bucket_index = BucketIndex::default();
                bucket_index.add_files(&files, keys)?;
                *index.bucket_mut(&bucket) = bucket_index;
            }
            report.buckets += 1;
            report.rows += rows;
            changes.added_data_files.extend(files);
        }
        Ok::<_, NodeError>(())
    };
    if let Err(error) = work.await {
        // Best effort (failures are logged): the error to report is the work's.
        let _ = delete_files(&lake_table, &super::written_paths(&changes)).await;
        return Err(error);
    }
    report.files_removed = changes.removed_files.len() as u64;
    report.files_written = changes.added_data_files.len() as u64;
    let snapshot_id = commit_replace(node, &table, &lake_table, changes).await?;
    if let Some(mut index) = index {
        index.snapshot_id = Some(snapshot_id);
        indexes.insert(table.table_id, index);
    }
    info!(table = %path, snapshot_id, buckets = report.buckets, rows = report.rows,
        files_removed = report.files_removed, "compacted");
    report.snapshot_id = Some(snapshot_id);
    Ok(report)
}

/// Commits `changes` as a `replace` snapshot (the same rows, other files), keeping the
/// recorded tiering offsets, with the compaction's crash points.
pub(super) async fn commit_replace(
    node: &Node,
    table: &TableDescriptor,
    lake_table: &LakeTable,
    changes: SnapshotChanges,
) -> Result<i64> {
    let offsets = recorded_offsets(node, table)?;
    commit_and_record(
        node,
        table,
        lake_table,
        Operation::Replace,
        changes,
        &offsets,
        [
            Failpoint::AbortBeforeCompactionCommit,
            Failpoint::AbortAfterCompactionCommit,
        ],
    )
    .await
}

/// Whether a bucket with the files of `split` is compacted. `due` is the buckets the lake
/// index of a primary-key table finds due ([`BucketIndex`]); a log table has none.
fn selected(
    selection: Selection,
    due: Option<&HashSet<BucketId>>,
    bucket: &BucketId,
    split: &LakeSplit,
) -> bool {
    match (selection, due) {
        (Selection::All, _) => {
            split.files.len() > 1 || split.files.iter().any(|f| !f.deletes.is_empty())
        }
        (Selection::Due, Some(due)) => due.contains(bucket),
        (Selection::Due, None) => split.files.len() > MAX_FILES,
    }
}

/// Rewrites buckets of one table.
struct Rewrite<'a> {
    lake_table: &'a LakeTable,
    /// What lake files are written with.
    lake_schema: SchemaRef,
    /// What they are read as: the table's columns in its own types (so keys encode as
    /// the tail's do), then the lake's `__bucket`, `__offset` and `__timestamp`.
    read_schema: SchemaRef,
    codec: Option<KeyCodec>,
    /// What the reads run in (the node's reads' runtime: its memory pool and caches).
    context: Arc<TaskContext>,
}

impl<'a> Rewrite<'a> {
    fn new(
        table: &'a TableDescriptor,
        lake_table: &'a LakeTable,
        context: Arc<TaskContext>,
    ) -> Result<Self> {
        let lake_schema = lake_arrow_schema(lake_table.metadata().current_schema())?;
        let mut fields = table.schema().fields().to_vec();
        // By name: columns added to the table come after them in the lake.
        for column in [BUCKET_COLUMN, OFFSET_COLUMN, TIMESTAMP_COLUMN] {
            fields.push(Arc::new(lake_schema.field_with_name(column)?.clone()));
        }
        Ok(Self {
            lake_table,
            lake_schema,
            read_schema: Arc::new(Schema::new(fields)),
            codec: match table.has_primary_key() {
                true => Some(KeyCodec::new(table)?),
                false => None,
            },
            context,
        })
    }

    /// A bucket's live rows as new files; returns them, the keys of their rows in order
    /// (primary-key tables) and the row count.
    ///
    /// The rows are read by the union read's lake scan (`mink_scan`), its partitions in
    /// order, so the keys are in the order the rows are written.
    async fn bucket(
        &self,
        storage: &LakeStorage,
        bucket: &BucketId,
        split: LakeSplit,
    ) -> Result<(Vec<DataFile>, Vec<Box<[u8]>>, u64)> {
        let mut writer = BucketWriter::new(self.lake_table, bucket)?;
        let mut keys = Vec::new();
        let mut rows = 0;
        let scan = LakeScan {
            storage,
            table_schema: Arc::clone(&self.read_schema),
            projection: (0..self.read_schema.fields().len()).collect(),
            predicate: None,
        };
        let plan = scan.plan(&self.context, &[&split]).await?;
        let mut batches = execute_in_order(plan, Arc::clone(&self.context));
        while let Some(batch) = batches.try_next().await? {
            if let Some(codec) = &self.codec {
                keys.extend(codec.encode(&batch)?.iter().map(|key| key.as_ref().into()));
            }
            rows += batch.num_rows() as u64;
            writer
                .write(normalize_batch(&batch, &self.lake_schema)?)
                .await?;
        }
        Ok((writer.close().await?, keys, rows))
    }
}

#[cfg(test)]
mod tests {
    use mink_lake::reader::{DeleteKind, LakeDeleteFile, LakeFile};

    use super::super::tests::{D, log_batch};
    use super::super::tests::{TestLake, bucket, indexed, keys, located, table, two_rounds};
    use super::*;
    use crate::lake_index::LakeIndex;

    /// A data file of `rows` rows with `deletes` delete files.
    fn lake_file(number: usize, deletes: usize) -> LakeFile {
        LakeFile {
            path: format!("/wh/data/bucket=0/{number}.parquet"),
            size: 100,
            record_count: Some(10),
            partition: None,
            deletes: (0..deletes)
                .map(|d| LakeDeleteFile {
                    path: format!("/wh/data/bucket=0/{number}-del-{d}.parquet"),
                    size: 10,
                    kind: DeleteKind::Positions,
                })
                .collect(),
            replaced_rows: Vec::new(),
        }
    }

    /// A bucket's split of `files` data files, the first `with_deletes` of them with a
    /// delete file.
    fn split(files: usize, with_deletes: usize) -> LakeSplit {
        LakeSplit {
            snapshot_id: Some(1),
            files: (0..files)
                .map(|n| lake_file(n, usize::from(n < with_deletes)))
                .collect(),
        }
    }

    fn all(split: &LakeSplit) -> bool {
        selected(Selection::All, None, &bucket(&table(), 0), split)
    }

    #[test]
    fn compacting_all_leaves_a_bucket_of_one_file_without_deletes_alone() {
        assert!(!all(&split(1, 0)));
        assert!(!all(&split(0, 0)));
    }

    #[test]
    fn compacting_all_takes_a_bucket_of_several_files() {
        assert!(all(&split(2, 0)));
        assert!(all(&split(3, 0)));
    }

    #[test]
    fn compacting_all_takes_a_bucket_whose_only_file_has_deletes() {
        assert!(all(&split(1, 1)));
    }

    #[test]
    fn compacting_due_takes_exactly_the_buckets_the_lake_index_finds_due() {
        let t = table();
        let due = HashSet::from([bucket(&t, 1)]);
        let due_of = |number, split: &LakeSplit| {
            selected(Selection::Due, Some(&due), &bucket(&t, number), split)
        };
        assert!(
            due_of(1, &split(1, 0)),
            "the index's word, whatever the split"
        );
        assert!(
            !due_of(0, &split(20, 20)),
            "the index's word, whatever the split"
        );
        assert!(!due_of(2, &split(MAX_FILES + 1, 0)));
    }

    #[test]
    fn compacting_due_takes_a_log_tables_bucket_of_more_than_eight_files() {
        // A log table has no lake index: its deletes do not exist, only files count.
        let due = |split: &LakeSplit| selected(Selection::Due, None, &bucket(&table(), 0), split);
        assert_eq!(MAX_FILES, 8);
        assert!(!due(&split(8, 0)));
        assert!(due(&split(9, 0)));
        assert!(!due(&split(1, 1)));
    }

    /// A lake index of one table: bucket `n` holds `files[n]`, each `(rows, deleted)`:
    /// a file of `rows` keys of which the first `deleted` were removed.
    fn index_of(buckets: &[&[(u64, u64)]]) -> LakeIndex {
        let t = table();
        let mut index = LakeIndex::default();
        let mut id = 0;
        for (number, files) in buckets.iter().enumerate() {
            let bucket_index = index.bucket_mut(&bucket(&t, number as u32));
            for (f, &(rows, deleted)) in files.iter().enumerate() {
                let ids: Vec<i64> = (id..id + rows as i64).collect();
                id += rows as i64;
                let path = format!("b{number}-f{f}");
                bucket_index
                    .add(vec![indexed(&path, rows)], keys(&t, &ids))
                    .unwrap();
                for key in keys(&t, &ids[..deleted as usize]) {
                    assert!(bucket_index.remove(&key).is_some());
                }
            }
        }
        index
    }

    /// The numbers of the buckets an index finds due, sorted.
    fn due(index: &LakeIndex) -> Vec<u32> {
        let mut due: Vec<u32> = index
            .buckets_to_compact()
            .into_iter()
            .map(|b| b.bucket)
            .collect();
        due.sort_unstable();
        due
    }

    #[test]
    fn a_bucket_of_one_file_without_deletes_is_not_due() {
        assert_eq!(due(&index_of(&[&[(10, 0)]])), Vec::<u32>::new());
        assert_eq!(due(&index_of(&[&[]])), Vec::<u32>::new());
    }

    #[test]
    fn a_bucket_is_due_beyond_eight_files_with_live_rows() {
        let eight = [(10, 0); 8];
        let nine = [(10, 0); 9];
        assert_eq!(due(&index_of(&[&eight, &nine])), [1]);
    }

    #[test]
    fn a_file_whose_rows_are_all_deleted_does_not_count_toward_the_file_limit() {
        // 9 files, one of them dead: 8 that count; 1 of 81 rows deleted is under a fifth.
        let mut files = vec![(10, 0); 8];
        files.push((1, 1));
        assert_eq!(due(&index_of(&[&files])), Vec::<u32>::new());
    }

    #[test]
    fn a_bucket_is_due_once_a_fifth_of_its_rows_are_deleted() {
        let index = index_of(&[
            &[(10, 1)],
            &[(10, 2)],
            &[(5, 0), (5, 2)],
            &[(4, 4)],
            &[(100, 19)],
            &[(100, 20)],
        ]);
        assert_eq!(due(&index), [1, 2, 3, 5]);
    }

    #[test]
    fn an_index_of_no_buckets_finds_none_due() {
        assert!(LakeIndex::default().buckets_to_compact().is_empty());
    }
    /// The data and delete files of a split, as a compaction removes them.
    fn old_files(split: &LakeSplit) -> HashSet<String> {
        let files = split.files.iter();
        files
            .flat_map(|f| std::iter::once(&f.path).chain(f.deletes.iter().map(|d| &d.path)))
            .cloned()
            .collect()
    }

    #[tokio::test]
    async fn a_compacted_bucket_is_one_file_indexed_as_the_rebuilt_index_and_left_alone_next_time()
    {
        let mut lake = TestLake::open().await;
        let mut index = BucketIndex::default();
        two_rounds(&mut lake, &mut index).await;
        let t = Arc::clone(&lake.table);
        let bucket_id = bucket(&t, 0);

        let split = lake.bucket_split().await;
        assert_eq!(split.files.len(), 2);
        assert!(selected(Selection::All, None, &bucket_id, &split));
        let old = old_files(&split);
        assert_eq!(
            old.len(),
            3,
            "two data files and the second round's delete file"
        );

        let rewrite = Rewrite::new(&t, &lake.lake_table, Arc::new(TaskContext::default())).unwrap();
        let (files, written_keys, rows) = rewrite
            .bucket(lake.lake.storage(), &bucket_id, split)
            .await
            .unwrap();
        assert_eq!((files.len(), rows), (1, 4));
        let mut compacted = BucketIndex::default();
        compacted.add_files(&files, written_keys).unwrap();
        let new_file = files[0].file_path().to_string();
        lake.commit(
            Operation::Replace,
            SnapshotChanges {
                added_data_files: files,
                removed_files: old,
                ..SnapshotChanges::default()
            },
        )
        .await;

        let mut rebuilt = lake.rebuilt().await;
        let rebuilt = rebuilt.bucket_mut(&bucket_id);
        assert_eq!(rebuilt.locations(), compacted.locations());
        let live = located(&t, &compacted, 1..=6);
        assert_eq!(live.keys().copied().collect::<Vec<_>>(), [1, 2, 3, 5]);
        assert!(live.values().all(|(file, _)| *file == new_file));
        let mut rows: Vec<u32> = live.values().map(|(_, row)| *row).collect();
        rows.sort_unstable();
        assert_eq!(rows, [0, 1, 2, 3]);
        assert_eq!(
            compacted
                .files()
                .iter()
                .map(|f| (f.rows, f.live))
                .collect::<Vec<_>>(),
            [(4, 4)]
        );

        let split = lake.bucket_split().await;
        assert_eq!(split.files.len(), 1);
        assert!(split.files[0].deletes.is_empty());
        assert!(!selected(Selection::All, None, &bucket_id, &split));
    }

    #[tokio::test]
    async fn a_round_after_a_compaction_deletes_from_the_compacted_file() {
        let mut lake = TestLake::open().await;
        let mut index = BucketIndex::default();
        two_rounds(&mut lake, &mut index).await;
        let t = Arc::clone(&lake.table);
        let bucket_id = bucket(&t, 0);
        let split = lake.bucket_split().await;
        let old = old_files(&split);
        let rewrite = Rewrite::new(&t, &lake.lake_table, Arc::new(TaskContext::default())).unwrap();
        let (files, written_keys, _) = rewrite
            .bucket(lake.lake.storage(), &bucket_id, split)
            .await
            .unwrap();
        let mut index = BucketIndex::default();
        index.add_files(&files, written_keys).unwrap();
        let compacted = files[0].file_path().to_string();
        lake.commit(
            Operation::Replace,
            SnapshotChanges {
                added_data_files: files,
                removed_files: old,
                ..SnapshotChanges::default()
            },
        )
        .await;

        let round = vec![log_batch(&t, 8, 3_000, &[(D, 3, "c")])];
        let (deleted, written) = lake.tier(&mut index, round).await;
        assert_eq!((deleted, written.len()), (1, 1), "a delete file only");
        let mut rebuilt = lake.rebuilt().await;
        let rebuilt = rebuilt.bucket_mut(&bucket_id);
        assert_eq!(rebuilt.locations(), index.locations());
        let live = located(&t, rebuilt, 1..=6);
        assert_eq!(live.keys().copied().collect::<Vec<_>>(), [1, 2, 5]);
        assert!(live.values().all(|(file, _)| *file == compacted));
    }
}
