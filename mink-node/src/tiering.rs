//! The tiering service: copies each lake-enabled table's log into its Iceberg table.
//!
//! A round, for one table:
//!
//! ```text
//!  1. reconcile   the lake's latest snapshot vs mink's record of it (repair a crash)
//!  2. per bucket  read the log [tiered offset, high watermark) -> Parquet data files
//!  3. pending     note the round's files in metadata (orphans are cleaned after a crash)
//!  4. commit      one Iceberg snapshot, summary `mink.bucket-offsets` = every bucket's end
//!  5. record      CommitLakeSnapshot in metadata, then forget the pending round
//! ```
//!
//! **Exactly once.** A crash before step 4 leaves files no snapshot references: step 1 of
//! the next round deletes them. A crash between 4 and 5 leaves a snapshot mink did not
//! record: step 1 finds it (mink is the only writer of the table, so a newer snapshot is
//! its own) and records it from its summary. Either way nothing is tiered twice and
//! nothing is skipped. Rounds run one at a time per node.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mink_core::protocol::BucketId;
use mink_core::schema::normalize_batch;
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::layout::{lake_arrow_schema, lake_batch};
use mink_lake::offsets::{BUCKET_OFFSETS_PROPERTY, BucketOffsets};
use mink_lake::writer::{BucketWriter, commit_round, delete_files};
use mink_lake::{DataFile, LakeTable as Table};
use tracing::{info, warn};

use crate::error::{NodeError, Result};
use crate::log::now_ms;
use crate::metadata::{LakeSnapshotRecord, PendingRound};
use crate::node::{Failpoint, Node};

/// How often the service looks for tables due for a round.
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// Bytes of log read at a time while tiering a bucket.
const READ_BYTES: u64 = 16 << 20;

/// What a round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierReport {
    /// The snapshot the round committed; `None` when there was nothing new to tier.
    pub snapshot_id: Option<i64>,
    /// Rows tiered.
    pub rows: u64,
    /// Data files written.
    pub files: u64,
    /// Whether a snapshot left unrecorded by a crash was recorded first.
    pub repaired: bool,
}

/// Runs one tiering round of a table now.
///
/// # Errors
/// [`NodeError::NoLake`] for a table without a lake; lake and log errors otherwise (the
/// round is then not recorded, and the next one starts over from the recorded offsets).
pub async fn tier_table(node: &Node, path: &TablePath) -> Result<TierReport> {
    let _round = node.tiering.lock().await;
    let table = node.describe(path)?;
    if !table.lake_enabled {
        return Err(NodeError::NoLake(path.to_string()));
    }
    let lake = node.lake().await?;
    let lake_table = lake.create_table(&table).await?;
    let mut report = TierReport {
        repaired: reconcile(node, &table, &lake_table).await?,
        ..TierReport::default()
    };
    let mut offsets = recorded_offsets(node, &table)?;
    let arrow_schema = lake_arrow_schema(lake_table.metadata().current_schema())?;
    let mut files = Vec::new();
    let mut written = Vec::new();
    let round = async {
        for status in node.list_buckets(path)? {
            let bucket = status.bucket.clone().ok_or_else(|| {
                NodeError::InvalidArgument("a bucket status without its bucket".into())
            })?;
            let tiered = offsets.get(&bucket);
            if tiered < status.log_start {
                warn!(bucket = %bucket, tiered, log_start = status.log_start,
                    "log retention removed rows before they were tiered; the lake misses them");
            }
            let from = tiered.max(status.log_start);
            if from >= status.high_watermark {
                continue;
            }
            let (rows, bucket_files) = tier_bucket(
                node,
                &table,
                &lake_table,
                &arrow_schema,
                &bucket,
                from,
                status.high_watermark,
            )
            .await?;
            written.extend(bucket_files.iter().map(|f| f.file_path().to_string()));
            files.extend(bucket_files);
            report.rows += rows;
            offsets.set(&bucket, status.high_watermark);
        }
        Ok::<_, NodeError>(())
    };
    if let Err(error) = round.await {
        delete_files(&lake_table, &written).await?;
        return Err(error);
    }
    if report.rows == 0 {
        return Ok(report);
    }
    report.files = files.len() as u64;
    let parent = lake_table.metadata().current_snapshot_id();
    node.metadata.set_pending_round(
        table.table_id,
        &PendingRound {
            parent_snapshot: parent,
            files: written.clone(),
        },
    )?;
    crash_at(node, Failpoint::AbortBeforeLakeCommit);
    let committed = match commit_round(lake, &lake_table, parent, files, &offsets).await {
        Ok(committed) => committed,
        Err(error) => {
            delete_files(&lake_table, &written).await?;
            node.metadata.clear_pending_round(table.table_id)?;
            return Err(error.into());
        }
    };
    crash_at(node, Failpoint::AbortAfterLakeCommit);
    let snapshot_id = committed
        .metadata()
        .current_snapshot_id()
        .ok_or_else(|| NodeError::Corrupt("a committed round without a snapshot".into()))?;
    node.metadata.record_lake_snapshot(
        table.table_id,
        &LakeSnapshotRecord {
            snapshot_id,
            offsets: offsets.to_json(),
            committed_at: now_ms(),
        },
    )?;
    node.metadata.clear_pending_round(table.table_id)?;
    info!(table = %path, snapshot_id, rows = report.rows, files = report.files, "tiered");
    report.snapshot_id = Some(snapshot_id);
    Ok(report)
}

/// Aborts the process at `point` when the node is configured to (crash tests).
fn crash_at(node: &Node, point: Failpoint) {
    if node.failpoint() == Some(point) {
        warn!(?point, "failpoint: aborting the process");
        std::process::abort();
    }
}

/// The offsets of the latest recorded snapshot (all zero before the first round).
pub(crate) fn recorded_offsets(node: &Node, table: &TableDescriptor) -> Result<BucketOffsets> {
    match node.metadata.latest_lake_snapshot(table.table_id)? {
        Some(record) => Ok(BucketOffsets::from_json(&record.offsets)?),
        None => Ok(BucketOffsets::default()),
    }
}

/// Step 1: brings mink's record in line with the lake after a crash. Returns whether a
/// committed but unrecorded snapshot was recorded.
async fn reconcile(node: &Node, table: &TableDescriptor, lake_table: &Table) -> Result<bool> {
    let current = lake_table.metadata().current_snapshot();
    if let Some(pending) = node.metadata.pending_round(table.table_id)? {
        let committed = current.map(|s| s.snapshot_id()) != pending.parent_snapshot;
        if !committed {
            warn!(table = %table.path, files = pending.files.len(), "deleting the files of a round that was never committed");
            delete_files(lake_table, &pending.files).await?;
        }
        node.metadata.clear_pending_round(table.table_id)?;
    }
    let Some(current) = current else {
        return Ok(false);
    };
    let recorded = node.metadata.latest_lake_snapshot(table.table_id)?;
    if recorded.as_ref().map(|r| r.snapshot_id) == Some(current.snapshot_id()) {
        return Ok(false);
    }
    let Some(offsets) = current
        .summary()
        .additional_properties
        .get(BUCKET_OFFSETS_PROPERTY)
    else {
        return Ok(false);
    };
    BucketOffsets::from_json(offsets)?;
    warn!(table = %table.path, snapshot_id = current.snapshot_id(), "recording a lake snapshot committed before a crash");
    node.metadata.record_lake_snapshot(
        table.table_id,
        &LakeSnapshotRecord {
            snapshot_id: current.snapshot_id(),
            offsets: offsets.to_string(),
            committed_at: current.timestamp_ms(),
        },
    )?;
    Ok(true)
}

/// Step 2 for one bucket: the log `[from, to)` as data files.
async fn tier_bucket(
    node: &Node,
    table: &TableDescriptor,
    lake_table: &Table,
    arrow_schema: &arrow::datatypes::SchemaRef,
    bucket: &BucketId,
    from: i64,
    to: i64,
) -> Result<(u64, Vec<DataFile>)> {
    let (_, target) = node.bucket(bucket)?;
    let mut writer = BucketWriter::new(lake_table, bucket)?;
    let mut offset = from;
    let mut rows = 0u64;
    while offset < to {
        let batches = target.log.read(offset, READ_BYTES).await?;
        if batches.is_empty() {
            break;
        }
        for log_batch in batches {
            let start = (offset - log_batch.base_offset).max(0) as usize;
            let end =
                ((to - log_batch.base_offset).max(0) as usize).min(log_batch.batch.num_rows());
            if end <= start {
                continue;
            }
            let rows_in_range = log_batch.batch.slice(start, end - start);
            let current = normalize_batch(&rows_in_range, table.schema())?;
            let base = log_batch.base_offset + start as i64;
            let lake_rows = lake_batch(
                arrow_schema,
                &current,
                bucket.bucket,
                base,
                log_batch.commit_timestamp,
            )?;
            writer.write(lake_rows).await?;
            rows += (end - start) as u64;
            offset = log_batch.last_offset + 1;
        }
    }
    Ok((rows, writer.close().await?))
}

/// Runs due tiering rounds forever: each lake-enabled table every `lake.freshness`
/// (the first one freshness interval after the node starts or the table is created).
pub async fn run_tiering(node: Arc<Node>) {
    let mut last_round: std::collections::HashMap<u64, Instant> = std::collections::HashMap::new();
    let mut ticks = tokio::time::interval(CHECK_EVERY);
    loop {
        ticks.tick().await;
        for path in node.list_tables(None) {
            let Ok(table) = node.describe(&path) else {
                continue;
            };
            if !table.lake_enabled {
                continue;
            }
            // A table's first round comes one freshness interval after the node sees it.
            let since = last_round
                .entry(table.table_id)
                .or_insert_with(Instant::now);
            if since.elapsed() < table.lake_freshness {
                continue;
            }
            last_round.insert(table.table_id, Instant::now());
            if let Err(error) = tier_table(&node, &path).await {
                warn!(table = %path, %error, "tiering round failed; it is retried next time");
            }
        }
    }
}
