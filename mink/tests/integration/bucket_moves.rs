//! A bucket handed over through the log store, as a node of a cluster does when its
//! bucket moves: every request for it at the old leader (Scan, DoPut, lookups,
//! list_offsets) is answered NotLeader, with the leader's address and epoch in the
//! status' typed detail; once the bucket is taken over (here by the same node, as a node
//! that leads it again does), it serves every row it acknowledged, its KV store restored
//! from the store, and takes writes again.

use std::time::Duration;

use mink_client::{ClientError, ConnectOptions, MinkClient};
use mink_core::protocol::{BucketId, NotLeader, list_offsets};
use mink_log::LogStoreConfig;
use tonic::Code;

use crate::pk_support::{Key, pk_keys, pk_rows, pk_table, values};
use crate::support::{TestNode, events, events_table, file_store_url, first_column_ids};

/// The address the buckets are handed over to. Nothing listens there: a client
/// following the answer is refused, asks again until its `follow_for` is over, and then
/// returns the NotLeader itself, which the test reads.
const NEXT_LEADER: &str = "127.0.0.1:1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_handed_over_answers_not_leader_and_is_whole_once_taken_back() {
    let store = tempfile::tempdir().expect("store dir");
    let node = TestNode::start_with(|config| {
        config.log_store = Some(LogStoreConfig {
            node: Some("n1".into()),
            ..LogStoreConfig::new(file_store_url(store.path()))
        });
    })
    .await;
    let client = &node.client;
    let log_table = client
        .create_table(&events_table("moving", 1, Default::default()), false)
        .await
        .expect("create");
    let log_bucket = BucketId::new(&log_table.path, 0);
    let pk = client
        .create_table(&pk_table("moving_pk", 1), false)
        .await
        .expect("create");
    let pk_bucket = BucketId {
        partition: Some("dt=d1".into()),
        ..BucketId::new(&pk.path, 0)
    };
    let rows: Vec<(Key, Option<String>)> = (0..50)
        .map(|i| (("d1".to_string(), i, 0), Some(format!("v{i}"))))
        .collect();
    for ids in (0..200).collect::<Vec<i64>>().chunks(20) {
        client
            .append(&log_bucket, vec![events(&log_table, ids)])
            .await
            .expect("append");
    }
    client
        .append(&pk_bucket, vec![pk_rows(&pk, &rows)])
        .await
        .expect("upsert");

    for (bucket, epoch) in [(&log_bucket, 7), (&pk_bucket, 8)] {
        node.node()
            .hand_over_bucket(bucket, NEXT_LEADER, epoch)
            .await
            .expect("hand over");
    }
    let client = MinkClient::connect_with(
        node.client.address(),
        &ConnectOptions {
            follow_for: Some(Duration::from_millis(300)),
            ..ConnectOptions::default()
        },
    )
    .await
    .expect("connect");
    let client = &client;
    let expected = |bucket: &BucketId, epoch| NotLeader {
        bucket: Some(bucket.clone()),
        leader: Some(NEXT_LEADER.into()),
        epoch,
    };
    let scan = client.scan(&log_bucket, 0, 0, &[]).await;
    assert_not_leader(scan.map(drop), expected(&log_bucket, 7));
    let append = client
        .append(&log_bucket, vec![events(&log_table, &[1000])])
        .await;
    assert_not_leader(append.map(drop), expected(&log_bucket, 7));
    let offsets = client
        .list_offsets(&log_bucket, list_offsets::Spec::Latest(true))
        .await;
    assert_not_leader(offsets.map(drop), expected(&log_bucket, 7));
    let keys = pk_keys(&[("d1".into(), 1, 0)]);
    let lookup = client.lookup_in_bucket(&pk, &pk_bucket, &keys, &[]).await;
    assert_not_leader(lookup.map(drop), expected(&pk_bucket, 8));
    // What needs every bucket of a table on one node says which one is elsewhere.
    let error = node.node().list_buckets(&log_table.path).unwrap_err();
    assert!(error.to_string().contains(NEXT_LEADER), "{error}");
    let listed = node.node().list_led_buckets(&log_table.path).expect("list");
    assert!(listed.buckets.is_empty());
    assert_eq!(listed.elsewhere, [expected(&log_bucket, 7)]);

    // Taken back: every acknowledged row, and writes again; the primary-key bucket's
    // rows restored from the KV checkpoint its hand-over wrote, which reaches its end.
    for bucket in [&log_bucket, &pk_bucket] {
        node.node()
            .take_over_bucket(bucket, 8)
            .await
            .expect("take over");
        let (_, led) = node.node().bucket(bucket).expect("led again");
        assert_eq!(
            led.epoch, 8,
            "{bucket}: led in the epoch it was taken over in"
        );
    }
    let status = &node.node().list_buckets(&pk.path).expect("list")[0];
    let store = status.store.as_ref().expect("a bucket in the log store");
    assert_eq!(store.kv_checkpoint_offset, Some(status.high_watermark));
    let read = client.scan(&log_bucket, 0, 0, &[]).await.expect("scan");
    let batches: Vec<_> = read.batches.into_iter().map(|b| b.batch).collect();
    assert_eq!(first_column_ids(&batches), (0..200).collect::<Vec<_>>());
    let all_keys: Vec<Key> = rows.iter().map(|(key, _)| key.clone()).collect();
    let found = client
        .lookup_in_bucket(&pk, &pk_bucket, &pk_keys(&all_keys), &[])
        .await
        .expect("lookup");
    let mut found = values(&found.rows);
    found.sort();
    assert_eq!(found, rows);
    let acks = client
        .append(&log_bucket, vec![events(&log_table, &[200])])
        .await
        .expect("append after the take-over");
    assert_eq!(acks[0].base_offset, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_a_log_store_refuses_to_move_a_bucket() {
    let node = TestNode::start().await;
    let table = node
        .client
        .create_table(&events_table("staying", 1, Default::default()), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    let error = node
        .node()
        .hand_over_bucket(&bucket, NEXT_LEADER, 2)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("log store"), "{error}");
    let error = node.node().take_over_bucket(&bucket, 3).await.unwrap_err();
    assert!(
        error.to_string().contains("led by this node already"),
        "{error}"
    );
    let acks = (node.client)
        .append(&bucket, vec![events(&table, &[1])])
        .await
        .expect("the bucket stays led");
    assert_eq!(acks[0].base_offset, 0);
}

/// A call's error is NotLeader as the typed detail says, with the code that goes with it.
fn assert_not_leader(outcome: Result<(), ClientError>, expected: NotLeader) {
    let error = outcome.expect_err("answered NotLeader");
    assert_eq!(error.code(), Some(Code::FailedPrecondition), "{error}");
    assert_eq!(error.not_leader(), Some(expected), "{error}");
}
