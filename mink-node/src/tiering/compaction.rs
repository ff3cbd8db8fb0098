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
//! every file it planned (they go only with snapshot expiry, which mink does not run yet).
//!
//! A bucket is compacted automatically after a round when it has more than
//! eight files or, for a primary-key table, when a fifth of its lake rows are
//! deleted; [`compact_table`] compacts every bucket with more than one file or any
//! delete file.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use futures::TryStreamExt;
use mink_core::key::KeyCodec;
use mink_core::protocol::BucketId;
use mink_core::schema::normalize_batch;
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::Operation;
use mink_lake::commit::SnapshotChanges;
use mink_lake::layout::{BUCKET_COLUMN, OFFSET_COLUMN, TIMESTAMP_COLUMN, lake_arrow_schema};
use mink_lake::reader::{LakeSplit, SplitScope, plan_split, read_split};
use mink_lake::writer::{BucketWriter, delete_files};
use mink_lake::{DataFile, LakeTable};
use tracing::info;

use super::lake_index::{BucketIndex, MAX_FILES, split_by_bucket_dir};
use super::{commit_and_record, current_index, open_lake_table, reconcile, recorded_offsets};
use crate::error::{NodeError, Result};
use crate::node::{Failpoint, Node};

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
    let mut indexes = node.tiering.lock().await;
    let (table, lake, lake_table) = open_lake_table(node, path).await?;
    reconcile(node, &table, &lake_table).await?;
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
    let chosen: Vec<(BucketId, LakeSplit)> =
        split_by_bucket_dir(lake_table.metadata().location(), split, &table)?
            .into_iter()
            .filter(|(bucket, split)| match (selection, &due) {
                (Selection::All, _) => {
                    split.files.len() > 1 || split.files.iter().any(|f| !f.deletes.is_empty())
                }
                (Selection::Due, Some(due)) => due.contains(bucket),
                (Selection::Due, None) => split.files.len() > MAX_FILES,
            })
            .collect();
    if chosen.is_empty() {
        indexes.extend(index.map(|index| (table.table_id, index)));
        return Ok(CompactReport::default());
    }

    let rewrite = Rewrite::new(&table, &lake_table)?;
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
            let (files, keys, rows) = rewrite.bucket(node, &bucket, split).await?;
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
    let offsets = recorded_offsets(node, &table)?;
    let snapshot_id = commit_and_record(
        node,
        &table,
        &lake_table,
        Operation::Replace,
        changes,
        &offsets,
        [
            Failpoint::AbortBeforeCompactionCommit,
            Failpoint::AbortAfterCompactionCommit,
        ],
    )
    .await?;
    if let Some(mut index) = index {
        index.snapshot_id = Some(snapshot_id);
        indexes.insert(table.table_id, index);
    }
    info!(table = %path, snapshot_id, buckets = report.buckets, rows = report.rows,
        files_removed = report.files_removed, "compacted");
    report.snapshot_id = Some(snapshot_id);
    Ok(report)
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
}

impl<'a> Rewrite<'a> {
    fn new(table: &'a TableDescriptor, lake_table: &'a LakeTable) -> Result<Self> {
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
        })
    }

    /// A bucket's live rows as new files; returns them, the keys of their rows in order
    /// (primary-key tables) and the row count.
    async fn bucket(
        &self,
        node: &Node,
        bucket: &BucketId,
        split: LakeSplit,
    ) -> Result<(Vec<DataFile>, Vec<Box<[u8]>>, u64)> {
        let storage = node.lake().await?.storage();
        let mut writer = BucketWriter::new(self.lake_table, bucket)?;
        let mut keys = Vec::new();
        let mut rows = 0;
        let mut batches = read_split(storage, split, Arc::clone(&self.read_schema), Vec::new());
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
