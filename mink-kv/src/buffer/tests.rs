//! The write buffer: reads over fjall and the buffered runs, flushes and their applied
//! offsets, failures that fence the tablet.

use futures::TryStreamExt as _;

use super::*;
use crate::{KvConfig, KvStore, KvTablet};

/// A run of `(key, row)` (`None`: deleted), keys and rows one byte each.
fn run(entries: &[(u8, Option<u8>)]) -> Arc<Run> {
    let entries: Vec<_> = (entries.iter())
        .map(|&(key, row)| (vec![key], row.map(|row| vec![row])))
        .collect();
    Arc::new(Run::from_owned(&entries))
}

fn store(limits: BufferLimits) -> (tempfile::TempDir, KvStore) {
    let dir = tempfile::tempdir().unwrap();
    let config = KvConfig {
        buffer: limits,
        ..KvConfig::default()
    };
    let store = KvStore::open(dir.path(), &config).unwrap();
    (dir, store)
}

/// Keys 1, 2, 3 in fjall (rows 1, 2, 3; offsets up to 3); then a group that writes 2
/// and 4 (up to 5) and one that deletes 3 (up to 7).
fn tablet_with_runs(store: &KvStore) -> KvTablet {
    let tablet = store.tablet("t").unwrap();
    tablet
        .buffer(run(&[(1, Some(1)), (2, Some(2)), (3, Some(3))]), 3)
        .unwrap();
    tablet.flush().unwrap();
    tablet
        .buffer(run(&[(2, Some(20)), (4, Some(40))]), 5)
        .unwrap();
    tablet.buffer(run(&[(3, None)]), 7).unwrap();
    tablet
}

/// Every read of the tablet agrees on its rows: `(key, row)`.
async fn rows(tablet: &KvTablet) -> Vec<(u8, u8)> {
    let chunks: Vec<Vec<u8>> = (tablet.snapshot().unwrap())
        .into_chunks(2, usize::MAX, |rows| {
            Ok::<_, KvError>(rows.iter().map(|row| row[0]).collect())
        })
        .try_collect()
        .await
        .unwrap();
    let rows: Vec<u8> = chunks.concat();
    let prefixed: Vec<u8> = (tablet.prefix(&[]).unwrap().iter())
        .map(|row| row[0])
        .collect();
    assert_eq!(rows, prefixed, "snapshot and prefix read");
    (1..=5u8)
        .filter_map(|key| Some((key, tablet.get(&[key]).unwrap()?[0])))
        .inspect(|(_, row)| assert!(rows.contains(row), "a get finds a snapshot's row"))
        .collect()
}

/// Enough keys that `get_many` splits fjall's reads over threads: each key's row is
/// found where it is (fjall, a run, deleted in a run, nowhere), in the keys' order.
#[test]
fn many_gets_read_each_key_where_it_is() {
    let (_dir, store) = store(BufferLimits::default());
    let tablet = store.tablet("t").unwrap();
    let key = |i: u16| i.to_be_bytes().to_vec();
    let rows = |keys: &mut dyn Iterator<Item = u16>, row: fn(u16) -> Option<Vec<u8>>| {
        let entries: Vec<_> = keys.map(|i| (key(i), row(i))).collect();
        Arc::new(Run::from_owned(&entries))
    };
    // Even keys below 2000 in fjall; every sixth replaced, every tenth deleted.
    tablet
        .buffer(
            rows(&mut (0..2000).step_by(2), |i| {
                Some(i.to_le_bytes().to_vec())
            }),
            1,
        )
        .unwrap();
    tablet.flush().unwrap();
    tablet
        .buffer(rows(&mut (0..2000).step_by(6), |_| Some(vec![6])), 2)
        .unwrap();
    tablet
        .buffer(rows(&mut (0..2000).step_by(10), |_| None), 3)
        .unwrap();
    let expected = |i: u16| match i {
        _ if i.is_multiple_of(10) || !i.is_multiple_of(2) || i >= 2000 => None,
        _ if i.is_multiple_of(6) => Some(vec![6]),
        _ => Some(i.to_le_bytes().to_vec()),
    };
    // Backwards, so the reads go in another order than the keys.
    let keys: Vec<Vec<u8>> = (0..2100).rev().map(key).collect();
    let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let found = tablet.get_many(&keys).unwrap();
    let found: Vec<Option<Vec<u8>>> = found
        .into_iter()
        .map(|row| row.map(|row| row.to_vec()))
        .collect();
    let expected: Vec<Option<Vec<u8>>> = (0..2100).rev().map(expected).collect();
    assert_eq!(found, expected);
}

#[tokio::test]
async fn buffered_rows_read_as_stored_ones_before_and_after_a_flush() {
    let (_dir, store) = store(BufferLimits::default());
    let tablet = tablet_with_runs(&store);
    let expected = [(1, 1), (2, 20), (4, 40)];
    assert_eq!(rows(&tablet).await, expected);
    assert_eq!(tablet.key_bound(), Some(vec![4]));
    assert_eq!(tablet.applied_offset().unwrap(), 7);
    assert_eq!(tablet.flushed_offset().unwrap(), 3);

    tablet.flush().unwrap();
    assert_eq!(rows(&tablet).await, expected, "the deletion flushed too");
    assert!(tablet.state.buffered().runs.is_empty());
    assert_eq!(tablet.applied_offset().unwrap(), 7);
    assert_eq!(tablet.flushed_offset().unwrap(), 7);
    assert_eq!(store.tablets.buffered_bytes.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn runs_that_do_not_interleave_are_flushed_with_their_deletions() {
    let (_dir, store) = store(BufferLimits::default());
    let tablet = store.tablet("t").unwrap();
    tablet.buffer(run(&[(3, Some(3))]), 1).unwrap();
    tablet.flush().unwrap();
    tablet.buffer(run(&[(1, Some(1))]), 2).unwrap();
    tablet.buffer(run(&[(2, Some(2)), (3, None)]), 3).unwrap();
    tablet.flush().unwrap();
    assert!(tablet.state.buffered().runs.is_empty());
    assert_eq!(rows(&tablet).await, [(1, 1), (2, 2)], "3 deleted in fjall");
}

#[tokio::test]
async fn a_snapshot_taken_before_a_flush_reads_the_rows_it_was_taken_with() {
    let (_dir, store) = store(BufferLimits::default());
    let tablet = tablet_with_runs(&store);
    let snapshot = tablet.snapshot().unwrap();
    tablet.flush().unwrap();
    tablet.buffer(run(&[(1, None), (5, Some(50))]), 9).unwrap();
    assert_eq!(snapshot.log_offset(), 7);
    let read: Vec<Vec<u8>> = snapshot
        .into_chunks(10, usize::MAX, |rows| {
            Ok::<_, KvError>(rows.iter().map(|row| row[0]).collect())
        })
        .try_collect()
        .await
        .unwrap();
    assert_eq!(read.concat(), [1, 20, 40]);
    assert_eq!(rows(&tablet).await, [(2, 20), (4, 40), (5, 50)]);
}

#[test]
fn fjall_is_read_only_for_keys_at_or_below_the_greatest_it_may_hold() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = KvStore::open(dir.path(), &KvConfig::default()).unwrap();
        tablet_with_runs(&store).flush().unwrap();
    }
    let store = KvStore::open(dir.path(), &KvConfig::default()).unwrap();
    let tablet = store.tablet("t").unwrap();
    assert_eq!(
        tablet.key_bound(),
        Some(vec![4]),
        "fjall's last key, reopened"
    );
    // Rows fjall could not hold: written behind the tablet's back, above its bound.
    tablet.state.rows.insert([3], [33]).unwrap();
    tablet.state.rows.insert([5], [50]).unwrap();
    assert_eq!(
        tablet.get(&[3]).unwrap().unwrap()[0],
        33,
        "at or below: read"
    );
    assert_eq!(tablet.get(&[5]).unwrap(), None, "above: not read");
}

#[test]
fn runs_merge_as_they_come_and_a_lookup_searches_a_few() {
    let (_dir, store) = store(BufferLimits::default());
    let tablet = store.tablet("t").unwrap();
    for group in 0..64u8 {
        // Every group writes a new key and rewrites key 0.
        tablet
            .buffer(run(&[(0, Some(group)), (group + 1, Some(group))]), 1)
            .unwrap();
    }
    // At most three runs of each size, and sizes grow fourfold: 64 groups are 3 sizes.
    let runs = tablet.state.buffered().runs.len();
    assert!(runs <= 3 * (MERGE_FAN_IN - 1) + 1, "{runs} runs");
    assert_eq!(tablet.get(&[0]).unwrap().unwrap()[0], 63);
    assert_eq!(tablet.get(&[10]).unwrap().unwrap()[0], 9);
}

/// The run of `keys` (four-byte keys), each with the row `row` gives it.
fn run_of(keys: impl Iterator<Item = u32>, row: impl Fn(u32) -> Option<u8>) -> Arc<Run> {
    let entries: Vec<_> = keys
        .map(|key| (key.to_be_bytes().to_vec(), row(key).map(|row| vec![row])))
        .collect();
    Arc::new(Run::from_owned(&entries))
}

/// Runs of `count` keys from `first` on, each key's row the key's low byte.
fn ascending(first: u32, count: u32) -> Arc<Run> {
    run_of(first..first + count, |key| Some(key as u8))
}

#[test]
fn large_runs_of_an_ascending_load_stay_apart_and_small_ones_merge() {
    let (_dir, store) = store(BufferLimits::default());
    let tablet = store.tablet("t").unwrap();
    let apart = MIN_ENTRIES_APART as u32;
    for run in 0..12 {
        tablet.buffer(ascending(run * apart, apart), 1).unwrap();
    }
    assert_eq!(
        tablet.state.buffered().runs.len(),
        12,
        "large ascending runs apart"
    );
    for key in [0, apart - 1, 5 * apart + 7, 12 * apart - 1] {
        let row = tablet.get(&key.to_be_bytes()).unwrap();
        assert_eq!(row.unwrap().as_ref(), [key as u8], "{key}");
    }
    assert_eq!(tablet.get(&(12 * apart).to_be_bytes()).unwrap(), None);
    // Small ascending runs merge, as do large ones that interleave.
    for run in 0..64 {
        tablet
            .buffer(ascending(12 * apart + run * 10, 10), 1)
            .unwrap();
    }
    let runs = tablet.state.buffered().runs.len();
    assert!(runs <= 12 + 3 * (MERGE_FAN_IN - 1) + 1, "{runs} runs");
    for _ in 0..MERGE_FAN_IN {
        tablet.buffer(ascending(0, apart), 1).unwrap();
    }
    let runs_after = tablet.state.buffered().runs.len();
    assert!(runs_after <= runs + 1, "{runs} then {runs_after} runs");
    assert_eq!(
        tablet
            .get(&(12 * apart + 639).to_be_bytes())
            .unwrap()
            .unwrap()
            .as_ref(),
        [(12 * apart + 639) as u8]
    );
}

/// Groups of writes large enough that a flush of them is split by key (on a machine
/// of more than one core), with their offsets: inserts, deletes and updates across
/// the keys. The first is flushed on its own before the others.
fn large_groups() -> Vec<(Arc<Run>, i64)> {
    let rows = 4 * MIN_ROWS_PER_INGESTION as u32;
    let group =
        |keys: std::iter::StepBy<std::ops::Range<u32>>, row: Option<u8>| run_of(keys, |_| row);
    vec![
        (group((0..rows).step_by(2), Some(1)), 1),
        (group((1..rows).step_by(2), Some(2)), 2),
        (group((0..rows).step_by(3), None), 3),
        (group((0..rows).step_by(5), Some(3)), 4),
    ]
}

/// Flushes the first of [`large_groups`], then buffers the others.
fn buffer_large_groups(tablet: &KvTablet) {
    let groups = large_groups();
    tablet
        .buffer(Arc::clone(&groups[0].0), groups[0].1)
        .unwrap();
    tablet.flush().unwrap();
    for (run, offset) in &groups[1..] {
        tablet.buffer(Arc::clone(run), *offset).unwrap();
    }
}

/// The rows [`large_groups`] leave, in key order.
fn model_of_large_groups() -> Vec<Vec<u8>> {
    (0..4 * MIN_ROWS_PER_INGESTION as u32)
        .filter_map(|key| match key {
            _ if key % 5 == 0 => Some(3),
            _ if key % 3 == 0 => None,
            _ => Some(if key % 2 == 0 { 1 } else { 2 }),
        })
        .map(|row| vec![row])
        .collect()
}

/// fjall's rows, in key order.
fn fjall_rows(tablet: &KvTablet) -> Vec<Vec<u8>> {
    (tablet.state.rows.iter())
        .map(|entry| entry.into_inner().unwrap().1.to_vec())
        .collect()
}

/// fjall ends up with every row of a flush split by key, each key once, deletions
/// applied.
#[test]
fn a_large_flush_split_by_key_writes_each_row_once() {
    let (_dir, store) = store(BufferLimits::default());
    let tablet = store.tablet("t").unwrap();
    buffer_large_groups(&tablet);
    tablet.flush().unwrap();
    assert!(tablet.state.buffered().runs.is_empty());
    assert_eq!(tablet.flushed_offset().unwrap(), 4);
    let (stored, expected) = (fjall_rows(&tablet), model_of_large_groups());
    assert_eq!(stored.len(), expected.len());
    assert!(stored == expected, "fjall's rows are the model's");
}

/// A crash between the parts of a split flush leaves fjall the rows of the parts that
/// landed under its old applied offset. The groups after that offset, buffered again
/// as the log's replay does, read and flush as if no part had landed.
#[tokio::test]
async fn a_crash_between_the_parts_of_a_flush_is_mended_by_the_replay() {
    let dir = tempfile::tempdir().unwrap();
    let groups = large_groups();
    {
        let store = KvStore::open(dir.path(), &KvConfig::default()).unwrap();
        let tablet = store.tablet("t").unwrap();
        buffer_large_groups(&tablet);
        // The parts from the first split key on land, the first does not.
        let runs = tablet.state.buffered().runs.clone();
        let split = Run::split_keys(&runs, 2)[0];
        ingest(&tablet.state.rows, &runs, Bound::Included(split), None).unwrap();
    }
    let store = KvStore::open(dir.path(), &KvConfig::default()).unwrap();
    let tablet = store.tablet("t").unwrap();
    assert_eq!(
        tablet.flushed_offset().unwrap(),
        1,
        "the old applied offset"
    );
    for (run, offset) in &groups[1..] {
        tablet.buffer(Arc::clone(run), *offset).unwrap();
    }
    let expected = model_of_large_groups();
    let read: Vec<Vec<u8>> = (tablet.prefix(&[]).unwrap().iter())
        .map(|row| row.to_vec())
        .collect();
    assert!(read == expected, "reads before the flush are the model's");
    let keys: Vec<Vec<u8>> = (0..4 * MIN_ROWS_PER_INGESTION as u32)
        .step_by(7)
        .map(|key| key.to_be_bytes().to_vec())
        .collect();
    let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let before = tablet.get_many(&keys).unwrap();
    tablet.flush().unwrap();
    assert!(
        fjall_rows(&tablet) == expected,
        "fjall's rows are the model's"
    );
    assert_eq!(
        tablet.get_many(&keys).unwrap(),
        before,
        "gets before and after"
    );
}

#[test]
fn a_tablet_over_its_limit_is_flushed_in_the_background_and_at_twice_it_at_once() {
    let (two, one) = (run(&[(1, Some(1)), (2, Some(2))]), run(&[(3, Some(3))]));
    let limit = two.bytes() + one.bytes();
    let many = run(&(4..40).map(|key| (key, Some(key))).collect::<Vec<_>>());
    assert!(many.bytes() >= 2 * limit);
    let (_dir, store) = store(BufferLimits {
        tablet_bytes: limit,
        node_bytes: usize::MAX,
    });
    let tablet = store.tablet("t").unwrap();
    tablet.buffer(two, 2).unwrap();
    assert!(tablet.flush_if_due().unwrap().is_none(), "under its limit");
    tablet.buffer(one, 3).unwrap();
    let flush = tablet.flush_if_due().unwrap().expect("at its limit");
    flush.wait().unwrap();
    assert_eq!(tablet.flushed_offset().unwrap(), 3);
    tablet.buffer(many, 9).unwrap();
    assert!(tablet.flush_if_due().unwrap().is_none(), "flushed at once");
    assert_eq!(tablet.flushed_offset().unwrap(), 9);
    assert_eq!(store.tablets.buffered_bytes.load(Ordering::Relaxed), 0);
}

#[test]
fn over_the_nodes_limit_the_largest_buffer_is_flushed() {
    let (two, one) = (run(&[(1, Some(1)), (2, Some(2))]), run(&[(1, Some(1))]));
    let (_dir, store) = store(BufferLimits {
        tablet_bytes: usize::MAX,
        node_bytes: two.bytes() + one.bytes(),
    });
    let one_bytes = one.bytes();
    let (large, small) = (
        store.tablet("large").unwrap(),
        store.tablet("small").unwrap(),
    );
    large.buffer(two, 2).unwrap();
    small.buffer(one, 1).unwrap();
    small.flush_if_due().unwrap().expect("due").wait().unwrap();
    assert_eq!(large.flushed_offset().unwrap(), 2, "the largest is flushed");
    assert_eq!(small.flushed_offset().unwrap(), 0);
    assert_eq!(
        store.tablets.buffered_bytes.load(Ordering::Relaxed),
        one_bytes
    );
}

#[test]
fn after_a_failed_flush_in_the_background_the_next_push_and_reads_fail() {
    let (_dir, store) = store(BufferLimits::default());
    let tablet = store.tablet("t").unwrap();
    tablet.state.fail("no space left".into());
    let error = tablet.buffer(run(&[(1, Some(1))]), 1).unwrap_err();
    assert!(error.to_string().contains("no space left"), "{error}");
    let error = tablet.snapshot().unwrap_err();
    assert!(error.to_string().contains("restart the node"), "{error}");
}

#[test]
fn a_dropped_tablet_flushes_nothing() {
    let (_dir, store) = store(BufferLimits::default());
    let tablet = tablet_with_runs(&store);
    store.drop_tablet(tablet.clone()).unwrap();
    tablet.flush().unwrap();
    assert_eq!(store.tablets.buffered_bytes.load(Ordering::Relaxed), 0);
    let again = store.tablet("t").unwrap();
    assert_eq!(again.applied_offset().unwrap(), 0);
    assert_eq!(again.get(&[2]).unwrap(), None);
}
