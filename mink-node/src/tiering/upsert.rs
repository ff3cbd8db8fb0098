//! Tiering a primary-key table's bucket: the newest version of every key changed since
//! the last round, and position deletes of the lake rows those keys replace or remove.
//!
//! ```text
//!   log [from, to)  +I k1 | -U k2 +U k2' | -D k3          lake index: k2 -> (f0, 7)
//!        │ fold by key (LogRangeIndex)                                    k3 -> (f1, 0)
//!        ▼
//!   data file   k1, k2'            (live last changes, in log order)
//!   deletes     (f0, 7), (f1, 0)   (the lake rows of every changed key)
//! ```
//!
//! After the round's snapshot the lake alone holds exactly the bucket's rows as of `to`,
//! so any Iceberg engine reads it correctly without a key merge.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use mink_core::key::KeyCodec;
use mink_core::merge::LogRangeIndex;
use mink_core::protocol::BucketId;
use mink_core::table::TableDescriptor;
use mink_lake::DataFile;
use mink_lake::deletes::write_position_deletes;
use mink_lake::layout::lake_rows;
use mink_lake::writer::BucketWriter;

use super::RoundTarget;
use crate::error::{NodeError, Result};
use crate::lake_index::BucketIndex;
use crate::node::union::changelog_rows;
use mink_log::LogBatch;

/// What one bucket adds to a round.
#[derive(Debug, Default)]
pub(super) struct BucketRound {
    pub(super) data_files: Vec<DataFile>,
    pub(super) delete_files: Vec<DataFile>,
    pub(super) rows: u64,
    pub(super) deleted_rows: u64,
}

/// Tiers a bucket's log range (its batches in log order): writes the fold's rows and
/// deletes, and moves `index` forward to the lake as it will be once the round commits.
pub(super) async fn tier_range(
    target: &RoundTarget<'_>,
    bucket_id: &BucketId,
    range: Vec<LogBatch>,
    index: &mut BucketIndex,
) -> Result<BucketRound> {
    let lake_table = target.lake_table;
    let Fold {
        rows,
        keys,
        deletes,
    } = fold(
        target.table,
        &target.lake_schema,
        bucket_id.bucket,
        range,
        index,
    )?;

    let mut writer = BucketWriter::new(lake_table, bucket_id)?;
    let mut round = BucketRound::default();
    for lake in rows {
        round.rows += lake.num_rows() as u64;
        writer.write(lake).await?;
    }
    round.data_files = writer.close().await?;
    index.add_files(&round.data_files, keys)?;

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

/// What a bucket's log range folds to, before any lake I/O.
#[derive(Debug)]
struct Fold {
    /// The newest version of each changed key that is live, as lake rows of the bucket,
    /// in log order.
    rows: Vec<RecordBatch>,
    /// The key of each of those rows, in the same order.
    keys: Vec<Box<[u8]>>,
    /// The lake rows of every changed key, `(data file, position)`, in no order.
    deletes: Vec<(String, i64)>,
}

/// Folds a log range by key: the last change of each key, when it is live, as lake rows
/// (`lake_schema`, with each row's log offset and commit time), and the lake rows of every
/// changed key, which are taken out of `index`.
fn fold(
    table: &TableDescriptor,
    lake_schema: &SchemaRef,
    bucket: u32,
    range: Vec<LogBatch>,
    index: &mut BucketIndex,
) -> Result<Fold> {
    let codec = KeyCodec::new(table)?;
    let range = range
        .into_iter()
        .map(|batch| with_origins(table, batch))
        .collect::<Result<Vec<_>>>()?;
    let range = LogRangeIndex::new(&codec, range)?;

    let deletes: Vec<(String, i64)> = range
        .changed_keys(&codec)?
        .iter()
        .filter_map(|key| index.remove(key))
        .map(|(file, row)| (file.to_string(), row))
        .collect();

    let columns = table.schema().fields().len();
    let mut fold = Fold {
        rows: Vec::new(),
        keys: Vec::new(),
        deletes,
    };
    for live in range.live_rows()? {
        let rows = live.project(&(0..columns).collect::<Vec<_>>())?;
        let offsets = live.column(columns).as_primitive::<Int64Type>();
        let commit_ms = live.column(columns + 1).as_primitive::<Int64Type>();
        fold.rows
            .push(lake_rows(lake_schema, &rows, bucket, offsets, commit_ms)?);
        fold.keys
            .extend(codec.encode(&rows)?.iter().map(|key| key.as_ref().into()));
    }
    Ok(fold)
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

#[cfg(test)]
mod tests {
    use mink_lake::layout::{lake_arrow_schema, lake_schema};

    use super::super::tests::{
        D, I, LakeRow, UA, UB, indexed, key, keys, lake_values, log_batch, table,
    };
    use super::*;

    /// A fold's lake rows, the keys of those rows and its deletes.
    type Folded = (Vec<LakeRow>, Vec<Box<[u8]>>, Vec<(String, i64)>);

    /// Folds `range` into bucket 3 against `index`; returns the lake rows, their keys (in
    /// order) and the deletes (sorted).
    fn fold_range(index: &mut BucketIndex, range: Vec<LogBatch>) -> Folded {
        let t = table();
        let lake_schema = lake_arrow_schema(&lake_schema(&t).unwrap()).unwrap();
        let mut fold = fold(&t, &lake_schema, 3, range, index).unwrap();
        fold.deletes.sort_unstable();
        (lake_values(&fold.rows), fold.keys, fold.deletes)
    }

    /// A lake row of bucket 3 at `offset`, committed at `ms`.
    fn row(id: i64, name: &str, offset: i64, ms: i64) -> LakeRow {
        (id, Some(name.into()), 3, offset, ms * 1000)
    }

    fn at(path: &str, row: i64) -> (String, i64) {
        (path.to_string(), row)
    }

    /// An index with one file `f0` holding `ids` in order.
    fn lake_of(ids: &[i64]) -> BucketIndex {
        let mut index = BucketIndex::default();
        index
            .add(vec![indexed("f0", ids.len() as u64)], keys(&table(), ids))
            .unwrap();
        index
    }

    #[test]
    fn an_insert_then_an_update_of_a_new_key_tiers_only_the_newest_version() {
        let t = table();
        let mut index = BucketIndex::default();
        let range = vec![
            log_batch(&t, 10, 1_000, &[(I, 1, "a")]),
            log_batch(&t, 11, 2_000, &[(UB, 1, "a"), (UA, 1, "b")]),
        ];
        let (rows, written, deletes) = fold_range(&mut index, range);
        assert_eq!(rows, [row(1, "b", 12, 2_000)]);
        assert_eq!(written, keys(&t, &[1]));
        assert!(deletes.is_empty());
    }

    #[test]
    fn an_update_of_a_lake_key_writes_it_and_deletes_its_lake_row() {
        let t = table();
        let mut index = lake_of(&[1, 2]);
        let range = vec![log_batch(&t, 0, 5, &[(UB, 2, "b"), (UA, 2, "b2")])];
        let (rows, written, deletes) = fold_range(&mut index, range);
        assert_eq!(rows, [row(2, "b2", 1, 5)]);
        assert_eq!(written, keys(&t, &[2]));
        assert_eq!(deletes, [at("f0", 1)]);
        assert_eq!(index.remove(&key(&t, 2)), None, "taken out of the index");
        assert_eq!(
            index.remove(&key(&t, 1)),
            Some(("f0".into(), 0)),
            "untouched"
        );
    }

    #[test]
    fn a_deleted_lake_key_deletes_its_lake_row_and_writes_nothing() {
        let t = table();
        let mut index = lake_of(&[1, 2]);
        let range = vec![log_batch(&t, 0, 5, &[(D, 1, "a")])];
        let (rows, written, deletes) = fold_range(&mut index, range);
        assert_eq!((rows, written), (vec![], vec![]));
        assert_eq!(deletes, [at("f0", 0)]);
        assert_eq!(index.locations().len(), 1);
    }

    #[test]
    fn a_lake_key_inserted_again_and_deleted_deletes_its_lake_row_once() {
        let t = table();
        let mut index = lake_of(&[1]);
        let range = vec![
            log_batch(&t, 0, 5, &[(D, 1, "a"), (I, 1, "a2")]),
            log_batch(&t, 2, 6, &[(D, 1, "a2")]),
        ];
        let (rows, written, deletes) = fold_range(&mut index, range);
        assert_eq!((rows, written), (vec![], vec![]));
        assert_eq!(deletes, [at("f0", 0)]);
    }

    #[test]
    fn a_new_key_inserted_then_deleted_gives_nothing() {
        let t = table();
        let mut index = lake_of(&[1]);
        let range = vec![
            log_batch(&t, 0, 5, &[(I, 9, "x")]),
            log_batch(&t, 1, 6, &[(D, 9, "x")]),
        ];
        let (rows, written, deletes) = fold_range(&mut index, range);
        assert_eq!((rows, written, deletes), (vec![], vec![], vec![]));
        assert_eq!(index.locations().len(), 1, "the lake key is left alone");
    }

    #[test]
    fn a_delete_of_a_key_never_in_the_lake_gives_nothing() {
        let t = table();
        let mut index = BucketIndex::default();
        let range = vec![log_batch(&t, 0, 5, &[(D, 9, "x")])];
        let (rows, written, deletes) = fold_range(&mut index, range);
        assert_eq!((rows, written, deletes), (vec![], vec![], vec![]));
    }

    #[test]
    fn a_key_changed_many_times_is_one_row_of_its_last_change() {
        let t = table();
        let mut index = lake_of(&[1]);
        let range = vec![log_batch(
            &t,
            20,
            5,
            &[(UB, 1, "a"), (UA, 1, "b"), (UB, 1, "b"), (UA, 1, "c")],
        )];
        let (rows, written, deletes) = fold_range(&mut index, range);
        assert_eq!(rows, [row(1, "c", 23, 5)]);
        assert_eq!(written, keys(&t, &[1]));
        assert_eq!(deletes, [at("f0", 0)]);
    }

    #[test]
    fn update_befores_are_superseded_by_their_update_afters() {
        // -U rows carry the old values: the +U after them is what is tiered.
        let t = table();
        let mut index = lake_of(&[1, 2]);
        let range = vec![log_batch(
            &t,
            0,
            5,
            &[(UB, 1, "a"), (UB, 2, "b"), (UA, 1, "a2"), (UA, 2, "b2")],
        )];
        let (rows, _, deletes) = fold_range(&mut index, range);
        assert_eq!(rows, [row(1, "a2", 2, 5), row(2, "b2", 3, 5)]);
        assert_eq!(deletes, [at("f0", 0), at("f0", 1)]);
    }

    #[test]
    fn an_update_before_as_a_keys_last_change_removes_the_key() {
        // A -U is not live: when nothing follows it (a log cut between -U and +U, which
        // the leader never writes), the key's lake row goes and nothing replaces it.
        let t = table();
        let mut index = lake_of(&[1]);
        let range = vec![log_batch(&t, 0, 5, &[(UB, 1, "a")])];
        let (rows, written, deletes) = fold_range(&mut index, range);
        assert_eq!((rows, written), (vec![], vec![]));
        assert_eq!(deletes, [at("f0", 0)]);
    }

    #[test]
    fn interleaved_keys_are_tiered_in_the_log_order_of_their_last_change() {
        let t = table();
        let mut index = BucketIndex::default();
        let range = vec![
            log_batch(&t, 0, 1_000, &[(I, 1, "a"), (I, 2, "b"), (I, 3, "c")]),
            log_batch(
                &t,
                3,
                2_000,
                &[(UB, 1, "a"), (UA, 1, "a2"), (D, 2, "b"), (I, 4, "d")],
            ),
            log_batch(&t, 7, 3_000, &[(UB, 3, "c"), (UA, 3, "c2")]),
        ];
        let (rows, written, deletes) = fold_range(&mut index, range);
        assert_eq!(
            rows,
            [
                row(1, "a2", 4, 2_000),
                row(4, "d", 6, 2_000),
                row(3, "c2", 8, 3_000),
            ]
        );
        assert_eq!(written, keys(&t, &[1, 4, 3]));
        assert!(deletes.is_empty());
    }

    #[test]
    fn untouched_keys_of_a_batch_keep_their_own_offsets() {
        let t = table();
        let mut index = BucketIndex::default();
        let range = vec![
            log_batch(&t, 100, 1_000, &[(I, 1, "a"), (I, 2, "b"), (I, 3, "c")]),
            log_batch(&t, 103, 2_000, &[(UB, 2, "b"), (UA, 2, "b2")]),
        ];
        let (rows, written, _) = fold_range(&mut index, range);
        assert_eq!(
            rows,
            [
                row(1, "a", 100, 1_000),
                row(3, "c", 102, 1_000),
                row(2, "b2", 104, 2_000),
            ]
        );
        assert_eq!(written, keys(&t, &[1, 3, 2]));
    }

    #[test]
    fn changes_of_many_keys_delete_each_lake_row_they_replace_or_remove() {
        let t = table();
        let mut index = BucketIndex::default();
        index
            .add(vec![indexed("f0", 3)], keys(&t, &[1, 2, 3]))
            .unwrap();
        index
            .add(vec![indexed("f1", 2)], keys(&t, &[4, 5]))
            .unwrap();
        let range = vec![log_batch(
            &t,
            50,
            9,
            &[
                (D, 5, "e"),
                (UB, 1, "a"),
                (UA, 1, "a2"),
                (I, 6, "f"),
                (D, 3, "c"),
            ],
        )];
        let (rows, written, deletes) = fold_range(&mut index, range);
        assert_eq!(rows, [row(1, "a2", 52, 9), row(6, "f", 53, 9)]);
        assert_eq!(written, keys(&t, &[1, 6]));
        assert_eq!(deletes, [at("f0", 0), at("f0", 2), at("f1", 1)]);
        let left: Vec<(String, u32)> = index
            .locations()
            .into_values()
            .map(|(file, row)| (file.to_string(), row))
            .collect();
        assert_eq!(left, [("f0".to_string(), 1), ("f1".to_string(), 0)]);
    }

    #[test]
    fn a_batch_of_an_older_schema_is_tiered_in_the_current_one() {
        // Written before `name` was added: the lake row has it null.
        let t = table();
        let old = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let ids: ArrayRef = Arc::new(Int64Array::from(vec![7]));
        let mut batch = log_batch(&t, 4, 5, &[(I, 7, "")]);
        batch.batch = RecordBatch::try_new(old, vec![ids]).unwrap();
        let (rows, written, _) = fold_range(&mut BucketIndex::default(), vec![batch]);
        assert_eq!(rows, [(7, None, 3, 4, 5_000)]);
        assert_eq!(written, keys(&t, &[7]));
    }

    #[test]
    fn a_batch_without_change_types_is_corrupt() {
        let t = table();
        let lake_schema = lake_arrow_schema(&lake_schema(&t).unwrap()).unwrap();
        let mut batch = log_batch(&t, 0, 5, &[(I, 1, "a")]);
        batch.changes = None;
        let mut index = lake_of(&[1]);
        let error = fold(&t, &lake_schema, 0, vec![batch], &mut index).unwrap_err();
        assert!(matches!(error, NodeError::Corrupt(_)), "{error}");
        assert_eq!(index.locations().len(), 1, "the index is left as it was");
    }

    #[test]
    fn an_empty_tail_folds_to_nothing() {
        let mut index = lake_of(&[1]);
        let (rows, written, deletes) = fold_range(&mut index, Vec::new());
        assert_eq!((rows, written, deletes), (vec![], vec![], vec![]));
    }
}
