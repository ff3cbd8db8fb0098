//! LiveRange reads on a real node (`db.<name> (id BIGINT PRIMARY KEY, name TEXT)`, one
//! bucket): the live rows of a range against a model's fold of the same writes, the fold a
//! bucket keeps between reads, and the ranges refused.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use futures::TryStreamExt;
use mink_core::change::ChangeType;
use mink_core::options::TableOptions;
use mink_core::protocol::{BucketId, MAX_LIVE_RANGE_ROWS};
use mink_log::{LogBatch, LogError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::super::log_range;
use super::super::tests::{create, delete, open_node, write};
use crate::Node;
use crate::error::NodeError;
use crate::tiering::tests::bucket;

const I: u8 = ChangeType::Insert as u8;
const UB: u8 = ChangeType::UpdateBefore as u8;
const UA: u8 = ChangeType::UpdateAfter as u8;
const D: u8 = ChangeType::Delete as u8;

/// The live rows of `[from, to)` of `bucket`, as `(id, name)` in the order read.
async fn live(node: &Node, bucket: &BucketId, from: i64, to: i64) -> Vec<(i64, String)> {
    let batches = node.live_range(bucket, from, to, &[0, 1]).await.unwrap();
    batches.iter().flat_map(rows).collect()
}

/// The `(id, name)` rows of a batch.
fn rows(batch: &LogBatch) -> Vec<(i64, String)> {
    let ids = batch.batch.column(0).as_primitive::<Int64Type>();
    let names = batch.batch.column(1).as_string::<i32>();
    (ids.values().iter().zip(names.iter()))
        .map(|(&id, name)| (id, name.unwrap().to_string()))
        .collect()
}

/// The range `[from, to)` of the fold `bucket` keeps, if it keeps one.
fn kept(node: &Node, bucket: &BucketId) -> Option<(i64, i64)> {
    let (_, tablets) = node.bucket(bucket).unwrap();
    let kept = tablets.folded.kept.try_lock().unwrap();
    kept.as_ref().map(|folded| (folded.from, folded.to))
}

/// The live offsets the kept fold of `bucket` computed last, if any.
fn kept_live(node: &Node, bucket: &BucketId) -> Option<Arc<Vec<i64>>> {
    let (_, tablets) = node.bucket(bucket).unwrap();
    let kept = tablets.folded.kept.try_lock().unwrap();
    kept.as_ref().and_then(|folded| folded.live.clone())
}

/// A primary-key table's rows and changelog, as a model of the writes has them: each
/// upserted row a `+I`, or a `-U` of the old row and a `+U`; each deleted key there a `-D`
/// of its old row (the KV writer's changelog, `mink_kv`).
#[derive(Debug, Default)]
struct Model {
    rows: BTreeMap<i64, String>,
    /// `(change, id, name)` at each offset.
    changelog: Vec<(u8, i64, String)>,
}

impl Model {
    fn upsert(&mut self, rows: &[(i64, String)]) {
        for (id, name) in rows {
            match self.rows.insert(*id, name.clone()) {
                Some(old) => (self.changelog).extend([(UB, *id, old), (UA, *id, name.clone())]),
                None => self.changelog.push((I, *id, name.clone())),
            }
        }
    }

    fn delete(&mut self, ids: &[i64]) {
        for id in ids {
            if let Some(old) = self.rows.remove(id) {
                self.changelog.push((D, *id, old));
            }
        }
    }

    /// The live rows of `[from, to)`: each key's last change there, when a `+I` or a
    /// `+U`, in log order.
    fn live(&self, from: i64, to: i64) -> Vec<(i64, String)> {
        let mut last = BTreeMap::new();
        for offset in from..to {
            let (change, id, name) = &self.changelog[offset as usize];
            last.insert(*id, (offset, *change, name.clone()));
        }
        let mut live: Vec<(i64, i64, String)> = (last.into_iter())
            .filter(|(_, (_, change, _))| [I, UA].contains(change))
            .map(|(id, (offset, _, name))| (offset, id, name))
            .collect();
        live.sort_unstable();
        live.into_iter().map(|(_, id, name)| (id, name)).collect()
    }
}

/// Random upserts and deletes of a few keys, each followed by a LiveRange read: mostly of
/// the seam read last, to the high watermark or short of it (the kept fold extended, or a
/// shorter range folded apart), now and then of another seam (the fold replaced). Every
/// read is the model's fold of the same range; the log is the model's changelog.
#[tokio::test]
async fn live_ranges_over_random_histories_are_the_models_fold() {
    const SEEDS: u64 = 8;
    const STEPS: usize = 30;
    const KEYS: i64 = 8;
    let (_dir, node) = open_node(|_| {}).await;
    for seed in 0..SEEDS {
        let name = format!("history{seed}");
        let table = create(&node, &name, &["id"], TableOptions::default()).await;
        let b = bucket(&table, 0);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut model = Model::default();
        let mut from = 0;
        for step in 0..STEPS {
            if rng.random_bool(0.3) {
                let ids: Vec<i64> = (0..rng.random_range(1..=3))
                    .map(|_| rng.random_range(0..KEYS))
                    .collect();
                delete(&node, &table, &b, &ids).await;
                model.delete(&ids);
            } else {
                let rows: Vec<(i64, String)> = (0..rng.random_range(1..=4))
                    .map(|row| (rng.random_range(0..KEYS), format!("s{step}r{row}")))
                    .collect();
                let named: Vec<(i64, &str)> =
                    rows.iter().map(|(id, n)| (*id, n.as_str())).collect();
                write(&node, &table, &b, &named).await;
                model.upsert(&rows);
            }
            let context = format!("seed {seed} step {step}");
            let high_watermark = node.bucket(&b).unwrap().1.log.offsets().1;
            assert_eq!(high_watermark, model.changelog.len() as i64, "{context}");
            if rng.random_bool(0.25) {
                from = rng.random_range(0..=high_watermark);
            }
            let to = match rng.random_bool(0.75) {
                true => high_watermark,
                false => rng.random_range(from..=high_watermark),
            };
            let read = live(&node, &b, from, to).await;
            assert_eq!(read, model.live(from, to), "{context}: [{from}, {to})");
        }
        // The model's changelog is the log's: its fold above is the fold of the log.
        let (_, tablets) = node.bucket(&b).unwrap();
        let end = model.changelog.len() as i64;
        let batches: Vec<LogBatch> = log_range(tablets, 0, end).try_collect().await.unwrap();
        let logged: Vec<(u8, i64, String)> = (batches.iter())
            .flat_map(|batch| {
                let changes = batch.changes.clone().unwrap();
                changes.into_iter().zip(rows(batch))
            })
            .map(|(change, (id, name))| (change, id, name))
            .collect();
        assert_eq!(logged, model.changelog, "seed {seed}");
    }
}

#[tokio::test]
async fn a_bucket_keeps_its_fold_of_a_seam_for_the_next_read_and_replaces_it_for_another() {
    let (_dir, node) = open_node(|_| {}).await;
    let table = create(&node, "users", &["id"], TableOptions::default()).await;
    let b = bucket(&table, 0);
    let owned = |rows: &[(i64, &str)]| -> Vec<(i64, String)> {
        rows.iter().map(|(id, n)| (*id, n.to_string())).collect()
    };
    assert_eq!(kept(&node, &b), None);
    // +I of keys 1, 2, 3 (offsets 0 to 2).
    write(&node, &table, &b, &[(1, "a"), (2, "b"), (3, "c")]).await;
    assert_eq!(
        live(&node, &b, 0, 3).await,
        owned(&[(1, "a"), (2, "b"), (3, "c")])
    );
    assert_eq!(kept(&node, &b), Some((0, 3)));

    // -U +U of key 2 (3, 4), -D of key 1 (5), +I of key 4 (6).
    write(&node, &table, &b, &[(2, "b2")]).await;
    delete(&node, &table, &b, &[1]).await;
    write(&node, &table, &b, &[(4, "d")]).await;
    let longer = owned(&[(3, "c"), (2, "b2"), (4, "d")]);
    assert_eq!(live(&node, &b, 0, 7).await, longer);
    assert_eq!(kept(&node, &b), Some((0, 7)), "the kept fold extended");

    // The same range again: the kept fold's live offsets answer it, folded once.
    let folded = kept_live(&node, &b).unwrap();
    assert_eq!(*folded, [2, 4, 6]);
    assert_eq!(live(&node, &b, 0, 7).await, longer);
    assert!(Arc::ptr_eq(&folded, &kept_live(&node, &b).unwrap()));

    // A shorter range of the seam (planned before the longer one) is folded apart.
    let shorter = owned(&[(1, "a"), (3, "c"), (2, "b2")]);
    assert_eq!(live(&node, &b, 0, 5).await, shorter);
    assert_eq!(kept(&node, &b), Some((0, 7)));

    // Another seam (after a round): its range is folded afresh and kept instead.
    assert_eq!(live(&node, &b, 3, 7).await, owned(&[(2, "b2"), (4, "d")]));
    assert_eq!(kept(&node, &b), Some((3, 7)));
    assert_eq!(live(&node, &b, 5, 5).await, []);
    assert_eq!(kept(&node, &b), Some((5, 5)));
}

#[tokio::test]
async fn live_rows_have_the_projected_columns_only() {
    let (_dir, node) = open_node(|_| {}).await;
    let table = create(&node, "users", &["id"], TableOptions::default()).await;
    let b = bucket(&table, 0);
    write(&node, &table, &b, &[(1, "a"), (2, "b")]).await;
    write(&node, &table, &b, &[(1, "a2")]).await;

    let batches = node.live_range(&b, 0, 4, &[1]).await.unwrap();
    let names: Vec<(Vec<String>, Option<Vec<u8>>)> = (batches.iter())
        .map(|batch| {
            let schema = batch.batch.schema();
            let columns: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
            let names = batch.batch.column(0).as_string::<i32>();
            let names = names.iter().map(|n| n.unwrap().to_string());
            assert_eq!(columns, ["name"]);
            (names.collect(), batch.changes.clone())
        })
        .collect();
    // Key 2's +I in the first batch, key 1's +U in the second; plain rows, no changes.
    assert_eq!(
        names,
        [
            (vec!["b".to_string()], None),
            (vec!["a2".to_string()], None)
        ]
    );
}

#[tokio::test]
async fn a_log_table_or_a_range_too_long_or_outside_the_log_is_refused() {
    let (_dir, node) = open_node(|_| {}).await;
    let events = create(&node, "events", &[], TableOptions::default()).await;
    let e = bucket(&events, 0);
    write(&node, &events, &e, &[(1, "a")]).await;
    let error = node.live_range(&e, 0, 1, &[0]).await.unwrap_err();
    assert!(matches!(error, NodeError::InvalidArgument(_)), "{error:?}");
    assert_eq!(
        error.to_string(),
        "LiveRange folds a primary-key table's changelog; db.events is a log table"
    );

    let table = create(&node, "users", &["id"], TableOptions::default()).await;
    let b = bucket(&table, 0);
    write(&node, &table, &b, &[(1, "a"), (2, "b"), (3, "c")]).await;
    for (from, to) in [(2, 1), (0, MAX_LIVE_RANGE_ROWS + 1)] {
        let error = node.live_range(&b, from, to, &[0]).await.unwrap_err();
        assert!(matches!(error, NodeError::InvalidArgument(_)), "{error:?}");
        assert_eq!(
            error.to_string(),
            format!("LiveRange of [{from}, {to}): a range of at most 1048576 offsets")
        );
    }
    // The longest range passes the bound, and is outside this log.
    for (from, to, outside) in [
        (0, MAX_LIVE_RANGE_ROWS, MAX_LIVE_RANGE_ROWS),
        (0, 4, 4),
        (-1, 2, -1),
    ] {
        let error = node.live_range(&b, from, to, &[0]).await.unwrap_err();
        assert!(
            matches!(
                error,
                NodeError::Log(LogError::OffsetOutOfRange {
                    offset,
                    log_start: 0,
                    high_watermark: 3,
                    ..
                }) if offset == outside
            ),
            "[{from}, {to}): {error:?}"
        );
    }
    assert_eq!(kept(&node, &b), None, "nothing folded");
}
