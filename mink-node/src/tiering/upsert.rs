//! Tiering a primary-key table's bucket: the newest version of every key changed since
//! the last round, and position deletes of the lake rows those keys replace or remove.
//!
//! ```text
//!   log [from, to)  +I k1 | -U k2 +U k2' | -D k3          lake index: k2 -> (f0, 7)
//!        │ fold by key (TailIndex)                                    k3 -> (f1, 0)
//!        ▼
//!   data file   k1, k2'            (live last changes, in log order)
//!   deletes     (f0, 7), (f1, 0)   (the lake rows of every changed key)
//! ```
//!
//! After the round's snapshot the lake alone holds exactly the bucket's rows as of `to`,
//! so any Iceberg engine reads it correctly without a key merge.

use std::ops::Range;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use futures::TryStreamExt;
use mink_core::key::KeyCodec;
use mink_core::merge::TailIndex;
use mink_core::protocol::BucketId;
use mink_core::table::TableDescriptor;
use mink_lake::DataFile;
use mink_lake::deletes::write_position_deletes;
use mink_lake::layout::lake_rows;
use mink_lake::writer::BucketWriter;

use super::RoundTarget;
use super::lake_index::BucketIndex;
use crate::error::{NodeError, Result};
use crate::log::LogBatch;
use crate::node::Bucket;
use crate::union::{changelog_rows, log_range};

/// What one bucket adds to a round.
#[derive(Debug, Default)]
pub(super) struct BucketRound {
    pub(super) data_files: Vec<DataFile>,
    pub(super) delete_files: Vec<DataFile>,
    pub(super) rows: u64,
    pub(super) deleted_rows: u64,
}

/// Tiers the changes in `range` of a primary-key table's bucket log; `index` is moved
/// forward to the lake as it will be once the round commits.
pub(super) async fn tier_bucket(
    target: &RoundTarget<'_>,
    bucket_id: &BucketId,
    bucket: &Arc<Bucket>,
    range: Range<i64>,
    index: &mut BucketIndex,
) -> Result<BucketRound> {
    let (table, lake_table) = (target.table, target.lake_table);
    let codec = KeyCodec::new(table)?;
    let tail: Vec<LogBatch> = log_range(Arc::clone(bucket), range.start, range.end)
        .try_collect()
        .await?;
    let tail = tail
        .into_iter()
        .map(|batch| with_origins(table, batch))
        .collect::<Result<Vec<_>>>()?;
    let tail = TailIndex::new(&codec, tail)?;

    let deletes: Vec<(String, i64)> = tail
        .keys()
        .filter_map(|key| index.remove(key))
        .map(|(file, row)| (file.to_string(), row))
        .collect();

    let columns = table.schema().fields().len();
    let mut writer = BucketWriter::new(lake_table, bucket_id)?;
    let mut written_keys = Vec::new();
    let mut round = BucketRound::default();
    for live in tail.live_rows()? {
        let rows = live.project(&(0..columns).collect::<Vec<_>>())?;
        let offsets = live.column(columns).as_primitive::<Int64Type>();
        let commit_ms = live.column(columns + 1).as_primitive::<Int64Type>();
        let lake = lake_rows(
            &target.lake_schema,
            &rows,
            bucket_id.bucket,
            offsets,
            commit_ms,
        )?;
        writer.write(lake).await?;
        written_keys.extend(codec.encode(&rows)?.iter().map(|key| key.as_ref().into()));
        round.rows += rows.num_rows() as u64;
    }
    round.data_files = writer.close().await?;
    index.add_files(&round.data_files, written_keys)?;

    if !deletes.is_empty() {
        let partition = index.partition().cloned().ok_or_else(|| {
            NodeError::Corrupt(format!(
                "bucket {bucket_id} deletes lake rows it has no file of"
            ))
        })?;
        round.deleted_rows = deletes.len() as u64;
        round
            .delete_files
            .push(write_position_deletes(lake_table, bucket_id, &partition, deletes).await?);
    }
    Ok(round)
}

/// A changelog batch in the table's current schema, with each row's log offset and
/// commit time as two extra columns (the lake keeps both), and its change vector.
fn with_origins(table: &TableDescriptor, batch: LogBatch) -> Result<(RecordBatch, Vec<u8>)> {
    let (base_offset, commit_ms) = (batch.base_offset, batch.commit_timestamp);
    let (rows, changes) = changelog_rows(table, batch)?;
    let count = rows.num_rows() as i64;
    let offsets: ArrayRef = Arc::new(Int64Array::from_iter_values(
        base_offset..base_offset + count,
    ));
    let commit_ms: ArrayRef = Arc::new(Int64Array::from(vec![commit_ms; rows.num_rows()]));
    let mut fields = rows.schema().fields().to_vec();
    fields.push(Arc::new(Field::new("__log_offset", DataType::Int64, false)));
    fields.push(Arc::new(Field::new("__commit_ms", DataType::Int64, false)));
    let mut columns = rows.columns().to_vec();
    columns.extend([offsets, commit_ms]);
    Ok((
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?,
        changes,
    ))
}
