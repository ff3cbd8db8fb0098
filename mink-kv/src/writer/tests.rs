//! The writer's changelogs (upserts, deletes, schema changes, key bounds), checked row by
//! row and against a model in random histories; commits, aborts and replays.

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type};

use super::*;
use crate::{KvConfig, KvStore};
use mink_log::LogError;
use mink_log::testing::table;

/// A changelog row as the tests read it: change type, key, value.
type Row = (&'static str, i64, Option<String>);

impl KvWriter {
    /// Commits and waits for the store's update.
    fn apply(&mut self, end_offset: i64) {
        self.commit(end_offset).unwrap();
        self.settle().unwrap();
    }
}

/// A store in a temporary directory and the writer of its one tablet.
struct Fixture {
    _dir: tempfile::TempDir,
    tablet: KvTablet,
    writer: KvWriter,
    table: Arc<TableDescriptor>,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let tablet = KvStore::open(dir.path(), &KvConfig::default())
            .unwrap()
            .tablet("b0")
            .unwrap();
        let table = table(&["id"]);
        let writer = KvWriter::new(tablet.clone(), Arc::clone(&table)).unwrap();
        Self {
            _dir: dir,
            tablet,
            writer,
            table,
        }
    }

    fn upsert(&mut self, rows: &[(i64, Option<&str>)]) -> Vec<Row> {
        let batch = whole_rows(&self.table, rows);
        self.prepare(WriteOp::Upsert(batch))
    }

    fn delete(&mut self, ids: &[i64]) -> Vec<Row> {
        self.prepare(WriteOp::Delete(keys(ids)))
    }

    /// The changelog of one write (empty when the write changes nothing).
    fn prepare(&mut self, op: WriteOp) -> Vec<Row> {
        let write = Write {
            op,
            table: Arc::clone(&self.table),
            stream: None,
            writer: None,
            sent: None,
        };
        self.writer
            .prepare(&write)
            .unwrap()
            .map_or_else(Vec::new, |stored| changelog_rows(&stored))
    }

    /// Every stored row, decoded, in key order.
    fn stored(&self) -> Vec<(i64, Option<String>)> {
        let values = self.tablet.prefix(&[]).unwrap();
        let batch = RowCodec::new(&self.table).unwrap().decode(&values).unwrap();
        id_and_value(&batch)
    }
}

fn whole_rows(table: &TableDescriptor, rows: &[(i64, Option<&str>)]) -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
        Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1))),
    ];
    RecordBatch::try_new(Arc::clone(table.schema()), columns).unwrap()
}

/// A delete batch: the key column only, as the node conforms a delete.
fn keys(ids: &[i64]) -> RecordBatch {
    let id: ArrayRef = Arc::new(Int64Array::from(ids.to_vec()));
    RecordBatch::try_from_iter(vec![("id", id)]).unwrap()
}

fn id_and_value(batch: &RecordBatch) -> Vec<(i64, Option<String>)> {
    let ids = batch
        .column_by_name("id")
        .unwrap()
        .as_primitive::<Int64Type>();
    let values = batch.column_by_name("v").unwrap().as_string::<i32>();
    (0..batch.num_rows())
        .map(|i| {
            (
                ids.value(i),
                values.is_valid(i).then(|| values.value(i).into()),
            )
        })
        .collect()
}

fn changelog_rows(stored: &StoredBatch) -> Vec<Row> {
    let changes = stored.changes.as_deref().expect("a change vector");
    assert_eq!(changes.len(), stored.batch.num_rows(), "one change per row");
    ChangeType::decode_vector(changes)
        .unwrap()
        .into_iter()
        .zip(id_and_value(&stored.batch))
        .map(|(change, (id, v))| (change.short_string(), id, v))
        .collect()
}

fn s(value: &str) -> Option<String> {
    Some(value.into())
}

#[test]
fn keys_above_and_below_the_stored_ones_are_told_apart_after_a_reopen() {
    let mut f = Fixture::new();
    f.upsert(&[(5, Some("a")), (7, Some("b"))]);
    f.writer.apply(2);
    // A new writer takes its key bound from the store.
    f.writer = KvWriter::new(f.tablet.clone(), Arc::clone(&f.table)).unwrap();
    let changes = f.upsert(&[(9, Some("c")), (7, Some("d")), (1, Some("e"))]);
    assert_eq!(
        changes,
        [
            ("+I", 9, s("c")),
            ("-U", 7, s("b")),
            ("+U", 7, s("d")),
            ("+I", 1, s("e")),
        ]
    );
    f.writer.apply(6);
    assert_eq!(f.delete(&[9, 10]), [("-D", 9, s("c"))]);
}

#[test]
fn new_keys_staged_in_order_are_seen_while_their_update_runs_and_stored_once() {
    let mut f = Fixture::new();
    f.upsert(&[(2, Some("a")), (4, Some("b"))]);
    // Committed, its update maybe still running: the next group sees its rows.
    f.writer.commit(2).unwrap();
    let changes = f.upsert(&[(6, Some("c")), (4, Some("d")), (5, Some("e")), (6, None)]);
    assert_eq!(
        changes,
        [
            ("+I", 6, s("c")),
            ("-U", 4, s("b")),
            ("+U", 4, s("d")),
            ("+I", 5, s("e")),
            ("-U", 6, s("c")),
            ("+U", 6, None),
        ]
    );
    assert_eq!(f.delete(&[2, 3]), [("-D", 2, s("a"))]);
    f.writer.apply(9);
    let stored = [(4, s("d")), (5, s("e")), (6, None)];
    assert_eq!(
        f.stored(),
        stored,
        "a key appended then replaced is stored once"
    );
}

#[test]
fn a_write_validated_before_a_column_was_added_is_upserted_in_the_newer_schema() {
    let mut f = Fixture::new();
    let older = Arc::clone(&f.table);
    let added = Field::new("w", DataType::Int64, true);
    let newer = Arc::new(older.with_added_column(added).unwrap());
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![1])),
        Arc::new(StringArray::from(vec!["a"])),
        Arc::new(Int64Array::from(vec![7])),
    ];
    let batch = RecordBatch::try_new(Arc::clone(newer.schema()), columns).unwrap();
    let write = |op, table: &Arc<TableDescriptor>| Write {
        op,
        table: Arc::clone(table),
        stream: None,
        writer: None,
        sent: None,
    };
    f.writer
        .prepare(&write(WriteOp::Upsert(batch), &newer))
        .unwrap();
    f.writer.apply(1);
    // Validated against the older schema, it reaches the log after the newer write.
    let older_rows = whole_rows(&older, &[(1, Some("b"))]);
    let stored = f
        .writer
        .prepare(&write(WriteOp::Upsert(older_rows), &older))
        .unwrap()
        .unwrap();
    assert_eq!(f.writer.schema_id(), newer.current().schema_id);
    assert_eq!(stored.batch.schema(), *newer.schema());
    assert_eq!(
        changelog_rows(&stored),
        [("-U", 1, s("a")), ("+U", 1, s("b"))]
    );
    let w = stored.batch.column(2).as_primitive::<Int64Type>();
    assert_eq!((w.value(0), w.is_null(1)), (7, true));
    f.writer.apply(3);
    let values = f.tablet.prefix(&[]).unwrap();
    let rows = RowCodec::new(&newer).unwrap().decode(&values).unwrap();
    assert_eq!(id_and_value(&rows), [(1, s("b"))]);
}

#[test]
fn new_keys_below_the_greatest_are_inserted_whole_unless_their_range_holds_a_key() {
    let mut f = Fixture::new();
    f.upsert(&[(10, Some("a")), (20, Some("b"))]);
    f.writer.apply(2);
    f.tablet.flush().unwrap();
    f.upsert(&[(30, Some("c")), (40, Some("d"))]);
    f.writer.apply(4);
    // Between keys fjall holds, between keys of a run, staged in the group.
    assert_eq!(
        f.upsert(&[(11, Some("e")), (12, Some("f"))]),
        [("+I", 11, s("e")), ("+I", 12, s("f"))]
    );
    assert_eq!(
        f.upsert(&[(31, Some("g")), (39, None)]),
        [("+I", 31, s("g")), ("+I", 39, None)]
    );
    assert!(
        f.delete(&[13, 14]).is_empty(),
        "a range of no key deletes nothing"
    );
    // Ranges that hold a key, of fjall, of a run, staged, and a staged deletion.
    assert_eq!(
        f.upsert(&[(9, Some("h")), (11, Some("i"))]),
        [("+I", 9, s("h")), ("-U", 11, s("e")), ("+U", 11, s("i"))]
    );
    assert_eq!(
        f.upsert(&[(19, None), (21, Some("j"))]),
        [("+I", 19, None), ("+I", 21, s("j"))]
    );
    assert_eq!(f.delete(&[31]), [("-D", 31, s("g"))]);
    assert_eq!(
        f.upsert(&[(30, Some("k")), (31, Some("l"))]),
        [("-U", 30, s("c")), ("+U", 30, s("k")), ("+I", 31, s("l"))]
    );
    f.writer.apply(17);
    let stored = f.stored();
    assert_eq!(
        stored,
        [
            (9, s("h")),
            (10, s("a")),
            (11, s("i")),
            (12, s("f")),
            (19, None),
            (20, s("b")),
            (21, s("j")),
            (30, s("k")),
            (31, s("l")),
            (39, None),
            (40, s("d")),
        ]
    );
}

/// Random histories of writes against a model of the rows: ascending runs of keys
/// (new or not, below the greatest or above it), scattered keys, deletes, commits
/// waited for or not, flushes to fjall. Each write's changelog, and the stored rows
/// at each commit waited for, are the model's.
#[test]
fn random_histories_match_a_model_of_the_rows() {
    for seed in 0..64 {
        random_history(seed);
    }
}

fn random_history(seed: u64) {
    use rand::{Rng, SeedableRng, rngs::StdRng};
    const KEYS: i64 = 400;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut f = Fixture::new();
    let mut model = std::collections::BTreeMap::<i64, Option<String>>::new();
    let (mut offset, mut committed) = (0, 0);
    for step in 0..300 {
        let ids: Vec<i64> = match rng.random_range(0..3) {
            0 | 1 => {
                let (start, step) = (rng.random_range(0..KEYS), rng.random_range(1..4));
                (0..rng.random_range(1..30))
                    .map(|i| start + i * step)
                    .collect()
            }
            _ => (0..rng.random_range(1..8))
                .map(|_| rng.random_range(0..KEYS))
                .collect(),
        };
        let mut expected = Vec::new();
        let changes = if rng.random_bool(0.8) {
            let rows: Vec<(i64, Option<String>)> = (ids.iter())
                .map(|&id| (id, rng.random_bool(0.8).then(|| format!("{step}"))))
                .collect();
            for (id, row) in &rows {
                match model.insert(*id, row.clone()) {
                    Some(old) => expected.extend([("-U", *id, old), ("+U", *id, row.clone())]),
                    None => expected.push(("+I", *id, row.clone())),
                }
            }
            let rows: Vec<_> = (rows.iter())
                .map(|(id, row)| (*id, row.as_deref()))
                .collect();
            f.upsert(&rows)
        } else {
            for id in &ids {
                if let Some(old) = model.remove(id) {
                    expected.push(("-D", *id, old));
                }
            }
            f.delete(&ids)
        };
        assert_eq!(changes, expected, "seed {seed}, step {step}: {ids:?}");
        offset += changes.len() as i64;
        match rng.random_range(0..10) {
            0..3 if offset > committed => {
                f.writer.commit(offset).unwrap();
                committed = offset;
            }
            3 if offset > committed => {
                f.writer.apply(offset);
                committed = offset;
                let stored: Vec<_> = model.clone().into_iter().collect();
                assert_eq!(f.stored(), stored, "seed {seed}, step {step}");
            }
            4 => {
                f.writer.settle().unwrap();
                f.tablet.flush().unwrap();
            }
            _ => {}
        }
    }
}

#[test]
fn upsert_of_new_keys_gives_one_insert_per_row_in_batch_order() {
    let mut f = Fixture::new();
    let log = f.upsert(&[(2, Some("b")), (1, Some("a")), (3, None)]);
    assert_eq!(log, [("+I", 2, s("b")), ("+I", 1, s("a")), ("+I", 3, None)]);
}

#[test]
fn upsert_of_stored_keys_gives_the_old_row_then_the_new_row() {
    let mut f = Fixture::new();
    f.upsert(&[(1, Some("a")), (2, Some("b"))]);
    f.writer.apply(2);
    let log = f.upsert(&[(2, Some("B")), (3, Some("c")), (1, None)]);
    assert_eq!(
        log,
        [
            ("-U", 2, s("b")),
            ("+U", 2, s("B")),
            ("+I", 3, s("c")),
            ("-U", 1, s("a")),
            ("+U", 1, None),
        ]
    );
}

#[test]
fn upsert_of_an_identical_row_is_still_an_update_pair() {
    let mut f = Fixture::new();
    f.upsert(&[(1, Some("a"))]);
    f.writer.apply(1);
    assert_eq!(
        f.upsert(&[(1, Some("a"))]),
        [("-U", 1, s("a")), ("+U", 1, s("a"))]
    );
}

#[test]
fn delete_of_a_stored_key_carries_the_whole_old_row() {
    let mut f = Fixture::new();
    f.upsert(&[(1, Some("a")), (2, Some("b")), (3, None)]);
    f.writer.apply(3);
    let log = f.delete(&[3, 1]);
    assert_eq!(log, [("-D", 3, None), ("-D", 1, s("a"))]);
}

#[test]
fn delete_of_missing_keys_changes_nothing() {
    let mut f = Fixture::new();
    assert!(f.delete(&[7, 8]).is_empty());
    f.upsert(&[(1, Some("a"))]);
    f.writer.apply(1);
    assert!(f.delete(&[9]).is_empty());
    assert_eq!(
        f.delete(&[9, 1, 10]),
        [("-D", 1, s("a"))],
        "missing keys skipped"
    );
}

#[test]
fn rows_of_one_batch_see_the_rows_before_them() {
    let mut f = Fixture::new();
    let log = f.upsert(&[(1, Some("a")), (1, Some("b")), (1, Some("c"))]);
    assert_eq!(
        log,
        [
            ("+I", 1, s("a")),
            ("-U", 1, s("a")),
            ("+U", 1, s("b")),
            ("-U", 1, s("b")),
            ("+U", 1, s("c")),
        ]
    );
    f.writer.apply(5);
    assert_eq!(f.stored(), [(1, s("c"))]);
}

#[test]
fn a_key_deleted_twice_in_one_batch_is_deleted_once() {
    let mut f = Fixture::new();
    f.upsert(&[(1, Some("a"))]);
    f.writer.apply(1);
    assert_eq!(f.delete(&[1, 1]), [("-D", 1, s("a"))]);
}

#[test]
fn writes_of_one_group_see_each_other_before_the_commit() {
    let mut f = Fixture::new();
    assert_eq!(f.upsert(&[(1, Some("a"))]), [("+I", 1, s("a"))]);
    assert_eq!(
        f.upsert(&[(1, Some("b"))]),
        [("-U", 1, s("a")), ("+U", 1, s("b"))]
    );
    assert_eq!(f.delete(&[1]), [("-D", 1, s("b"))]);
    assert_eq!(f.upsert(&[(1, Some("c"))]), [("+I", 1, s("c"))], "deleted");
    assert!(
        f.stored().is_empty(),
        "nothing reaches the store before the commit"
    );
    f.writer.apply(6);
    assert_eq!(f.stored(), [(1, s("c"))]);
}

#[test]
fn commit_applies_the_group_and_its_offset_atomically() {
    let mut f = Fixture::new();
    f.upsert(&[(1, Some("a")), (2, Some("b")), (3, Some("c"))]);
    f.writer.apply(3);
    f.delete(&[2]);
    f.upsert(&[(3, Some("C"))]);
    f.writer.apply(6);
    assert_eq!(f.stored(), [(1, s("a")), (3, s("C"))]);
    assert_eq!(f.writer.applied_offset(), 6);
    assert_eq!(f.tablet.applied_offset().unwrap(), 6);
}

#[test]
fn abort_forgets_the_prepared_group() {
    let mut f = Fixture::new();
    f.upsert(&[(1, Some("a"))]);
    f.writer.apply(1);
    f.upsert(&[(1, Some("b")), (2, Some("x"))]);
    f.delete(&[1]);
    f.writer.abort();
    assert_eq!(
        f.upsert(&[(1, Some("c")), (2, Some("y"))]),
        [("-U", 1, s("a")), ("+U", 1, s("c")), ("+I", 2, s("y"))]
    );
    assert_eq!(f.writer.applied_offset(), 1);
    assert_eq!(f.tablet.applied_offset().unwrap(), 1);
}

#[test]
fn an_append_to_a_primary_key_table_is_refused() {
    let mut f = Fixture::new();
    let write = Write {
        op: WriteOp::Append(whole_rows(&f.table, &[(1, Some("a"))])),
        table: Arc::clone(&f.table),
        stream: None,
        writer: None,
        sent: None,
    };
    let error = f.writer.prepare(&write).unwrap_err();
    assert!(
        matches!(&error, LogError::InvalidArgument(m) if m.contains("has a primary key")),
        "{error}"
    );
}

#[test]
fn a_row_stored_before_a_column_was_added_updates_with_the_column_null() {
    let mut f = Fixture::new();
    f.upsert(&[(1, Some("a"))]);
    f.writer.apply(1);
    f.table = Arc::new(
        f.table
            .with_added_column(Field::new("n", DataType::Int64, true))
            .unwrap(),
    );
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![1, 2])),
        Arc::new(StringArray::from(vec!["b", "c"])),
        Arc::new(Int64Array::from(vec![10, 20])),
    ];
    let batch = RecordBatch::try_new(Arc::clone(f.table.schema()), columns).unwrap();
    let write = Write {
        op: WriteOp::Upsert(batch),
        table: Arc::clone(&f.table),
        stream: None,
        writer: None,
        sent: None,
    };
    let stored = f.writer.prepare(&write).unwrap().unwrap();
    assert_eq!(stored.batch.schema(), *f.table.schema());
    assert_eq!(
        changelog_rows(&stored),
        [("-U", 1, s("a")), ("+U", 1, s("b")), ("+I", 2, s("c"))]
    );
    let n = stored.batch.column(2).as_primitive::<Int64Type>();
    assert_eq!(
        n.iter().collect::<Vec<_>>(),
        [None, Some(10), Some(20)],
        "the old row has no value for the added column"
    );
}

#[test]
fn replaying_a_changelog_rebuilds_the_store_it_came_from() {
    let mut source = Fixture::new();
    let mut replica = Fixture::new();
    let writes = [
        WriteOp::Upsert(whole_rows(&source.table, &[(1, Some("a")), (2, Some("b"))])),
        WriteOp::Upsert(whole_rows(&source.table, &[(2, Some("B")), (3, None)])),
        WriteOp::Delete(keys(&[1, 4])),
        WriteOp::Upsert(whole_rows(&source.table, &[(1, Some("again"))])),
    ];
    let mut offset = 0;
    for op in writes {
        let write = Write {
            op,
            table: Arc::clone(&source.table),
            stream: None,
            writer: None,
            sent: None,
        };
        let stored = source.writer.prepare(&write).unwrap().unwrap();
        let rows = stored.batch.num_rows() as i64;
        replica
            .writer
            .replay(&LogBatch {
                base_offset: offset,
                last_offset: offset + rows - 1,
                commit_timestamp: 0,
                schema_id: 0,
                batch: stored.batch,
                changes: stored.changes,
                writer: None,
                size: 0,
            })
            .unwrap();
        offset += rows;
    }
    source.writer.apply(offset);
    replica.writer.apply(offset);
    let expected = [(1, s("again")), (2, s("B")), (3, None)];
    assert_eq!(source.stored(), expected);
    assert_eq!(replica.stored(), expected);
    assert_eq!(replica.tablet.applied_offset().unwrap(), offset);
}

#[test]
fn replay_of_a_batch_without_a_change_vector_is_corrupt() {
    let mut f = Fixture::new();
    let batch = LogBatch {
        base_offset: 5,
        last_offset: 5,
        commit_timestamp: 0,
        schema_id: 0,
        batch: whole_rows(&f.table, &[(1, Some("a"))]),
        changes: None,
        writer: None,
        size: 0,
    };
    let error = f.writer.replay(&batch).unwrap_err();
    assert!(
        matches!(&error, LogError::Corrupt(m) if m.contains("offset 5")),
        "{error}"
    );
}
