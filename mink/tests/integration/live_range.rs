//! LiveRange, a union read's tail folded by the bucket's leader, against a model: random
//! histories of upserts, updates, deletes and re-inserts on one bucket of a primary-key
//! table, and after each write the live rows of
//!
//! - the whole log so far, a range the leader extends from its last fold;
//! - sometimes a range that ended earlier (shorter than the kept fold: folded apart);
//! - sometimes a range from an earlier write's end (another seam: the kept fold is
//!   replaced, and the next whole-log read folds afresh),
//!
//! each exactly the model's: the keys the range changed that are live at its end, with
//! their values then. Then the ticket's bad requests, each a clear error.

use std::collections::BTreeSet;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Int64Type;
use futures::TryStreamExt;
use mink_client::MinkClient;
use mink_core::protocol::BucketId;
use mink_core::table::TableDescriptor;
use rand::rngs::StdRng;
use rand::seq::IteratorRandom;
use rand::{Rng, SeedableRng};
use tonic::Code;

use crate::pk_support::{Cells, Key, State, lake_rows, lake_values, pk_keys, pk_lake_table};
use crate::support::{TestNode, seed};

/// Writes of a history.
const WRITES: usize = 40;

/// The table as of one write: the log's end then, and the keys each write touched.
struct Written {
    end: i64,
    state: State,
    touched: BTreeSet<Key>,
}

/// The model's live rows of the log range from write `from`'s end to write `to`'s end.
fn model_live(history: &[Written], from: usize, to: usize) -> Vec<(Key, Cells)> {
    let touched: BTreeSet<&Key> = history[from + 1..=to]
        .iter()
        .flat_map(|w| &w.touched)
        .collect();
    let state = &history[to].state;
    touched
        .into_iter()
        .filter_map(|key| state.get(key).map(|cells| (key.clone(), cells.clone())))
        .collect()
}

/// Checks LiveRange from write `from`'s end to write `to`'s end against the model.
async fn check_range(
    client: &MinkClient,
    bucket: &BucketId,
    history: &[Written],
    from: usize,
    to: usize,
    seed: u64,
) {
    let (start, end) = (history[from].end, history[to].end);
    let rows = live_rows(client, bucket, start, end).await;
    assert_eq!(
        rows,
        model_live(history, from, to),
        "seed {seed}: [{start}, {end})"
    );
}

async fn live_rows(
    client: &MinkClient,
    bucket: &BucketId,
    from: i64,
    to: i64,
) -> Vec<(Key, Cells)> {
    let batches: Vec<_> = client
        .live_range(bucket, from, to, &[])
        .await
        .expect("live tail")
        .try_collect()
        .await
        .expect("live rows");
    let mut rows: Vec<(Key, Cells)> = batches.iter().flat_map(lake_values).collect();
    rows.sort();
    rows
}

fn random_key(rng: &mut StdRng) -> Key {
    ("2024-01-01".into(), rng.random_range(0..30), 0)
}

fn random_cells(rng: &mut StdRng) -> Cells {
    (
        Some(format!("v{}", rng.random_range(0..1000))),
        rng.random_bool(0.9).then(|| rng.random_range(0..100)),
    )
}

/// One random write (upserts of new, live and deleted keys, or deletes), applied to
/// `state`; the keys it touched, and the bucket and log end it reported.
async fn random_write(
    rng: &mut StdRng,
    client: &MinkClient,
    table: &TableDescriptor,
    state: &mut State,
) -> (BTreeSet<Key>, Option<(BucketId, i64)>) {
    let keys: BTreeSet<Key> = (0..rng.random_range(1..8))
        .map(|_| match state.keys().choose(rng) {
            Some(key) if rng.random_bool(0.5) => key.clone(),
            _ => random_key(rng),
        })
        .collect();
    let acks = match rng.random_range(0..4) {
        0 => {
            let keys: Vec<Key> = keys.iter().cloned().collect();
            for key in &keys {
                state.remove(key);
            }
            client.delete(table, &pk_keys(&keys)).await.expect("delete")
        }
        _ => {
            let rows: Vec<(Key, Cells)> = keys
                .iter()
                .map(|k| (k.clone(), random_cells(rng)))
                .collect();
            state.extend(rows.iter().cloned());
            client
                .write(table, &lake_rows(table, &rows))
                .await
                .expect("upsert")
        }
    };
    // A delete of keys that never lived logs nothing: it touched no key.
    let logged = acks
        .into_iter()
        .find(|(_, ack)| ack.last_offset >= ack.base_offset)
        .map(|(bucket, ack)| (bucket, ack.last_offset + 1));
    match logged {
        Some(_) => (keys, logged),
        None => (BTreeSet::new(), None),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_ranges_are_the_model_folded_over_any_range() {
    let seed = seed("live_ranges_are_the_model_folded_over_any_range");
    let mut rng = StdRng::seed_from_u64(seed);
    let node = TestNode::start().await;
    let client = &node.client;
    let table = client
        .create_table(&pk_lake_table("live", 1), false)
        .await
        .expect("create");
    let mut state = State::new();
    let mut history = vec![Written {
        end: 0,
        state: State::new(),
        touched: BTreeSet::new(),
    }];
    let mut bucket = None;
    for write in 0..WRITES {
        let (touched, logged) = random_write(&mut rng, client, &table, &mut state).await;
        let end = match logged {
            Some((id, end)) => {
                bucket = Some(id);
                end
            }
            None => history[write].end,
        };
        history.push(Written {
            end,
            state: state.clone(),
            touched,
        });
        let Some(bucket) = &bucket else { continue };
        let now = history.len() - 1;
        let check = |from: usize, to: usize| check_range(client, bucket, &history, from, to, seed);
        check(0, now).await;
        if rng.random_bool(0.3) {
            check(0, rng.random_range(0..now)).await;
        }
        if rng.random_bool(0.3) {
            check(rng.random_range(0..now), now).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_live_range_requests_are_clear_errors() {
    let node = TestNode::start().await;
    let client = &node.client;
    let keyed = client
        .create_table(&pk_lake_table("live_bad", 1), false)
        .await
        .expect("create");
    let rows: Vec<(Key, Cells)> = (0..10)
        .map(|id| (("2024-01-01".into(), id, 0), (Some("v".into()), Some(id))))
        .collect();
    let acks = client
        .write(&keyed, &lake_rows(&keyed, &rows))
        .await
        .expect("upsert");
    let (bucket, ack) = acks.into_iter().next().expect("an ack");
    let end = ack.last_offset + 1;
    let log = client
        .create_table(
            &crate::support::events_table("live_log", 1, Default::default()),
            false,
        )
        .await
        .expect("create");
    let log_bucket = BucketId::new(&log.path, 0);
    let refused = |from: i64, to: i64, columns: Vec<u32>, bucket: BucketId| async move {
        match client.live_range(&bucket, from, to, &columns).await {
            Ok(_) => panic!("LiveRange [{from}, {to}) of {bucket} {columns:?} was answered"),
            Err(error) => (error.code().expect("a gRPC status"), error.to_string()),
        }
    };
    let cases = [
        (
            refused(0, 0, vec![], log_bucket).await,
            Code::InvalidArgument,
            "log table",
        ),
        (
            refused(5, 2, vec![], bucket.clone()).await,
            Code::InvalidArgument,
            "at most",
        ),
        (
            refused(-5, i64::MAX, vec![], bucket.clone()).await,
            Code::InvalidArgument,
            "at most",
        ),
        (
            refused(0, end + 1, vec![], bucket.clone()).await,
            Code::OutOfRange,
            "",
        ),
        (
            refused(-1, end, vec![], bucket.clone()).await,
            Code::OutOfRange,
            "",
        ),
        (
            refused(0, end, vec![u32::MAX], bucket.clone()).await,
            Code::InvalidArgument,
            "out of range",
        ),
    ];
    for ((code, message), want, needle) in cases {
        assert_eq!(code, want, "{message}");
        assert!(message.contains(needle), "{message} names {needle}");
    }
    // The node still answers, and a good range reads its live rows, whole or projected.
    assert_eq!(live_rows(client, &bucket, 0, end).await, rows);
    let projected: Vec<RecordBatch> = client
        .live_range(&bucket, 0, end, &[4, 1])
        .await
        .expect("a projected live tail")
        .try_collect()
        .await
        .expect("projected rows");
    let ids: Vec<i64> = projected
        .iter()
        .flat_map(|batch| {
            let names: Vec<&str> = batch
                .schema_ref()
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect();
            assert_eq!(names, ["n", "id"]);
            batch
                .column(1)
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect();
    assert_eq!(ids, (0..10).collect::<Vec<i64>>());
}
