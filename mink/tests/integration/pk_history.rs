//! Primary-key tables: random histories of upserts, deletes and re-inserts, with `kill -9`
//! restarts and a KV store rebuilt from the log (with a log store, the log too from the
//! store), checked after every step against a BTreeMap model; a consistent bootstrap
//! under concurrent writers; bad input.

use std::path::Path;
use std::time::Duration;

use mink_client::MinkClient;
use mink_core::protocol::{BucketId, list_offsets::Spec};
use mink_core::table::TableDescriptor;
use mink_kv::BufferLimits;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use tonic::Code;

use crate::pk_support::{Key, Model, fold_changelog, pk_keys, pk_rows, pk_table, values};
use crate::process::ServerProcess;
use crate::support::{
    LOST_DISK, TestNode, events, events_table, file_store_url, first_column_ids, remove_dirs, seed,
};

const DATES: [&str; 2] = ["2024-01-01", "2024-01-02"];

fn random_key(rng: &mut StdRng) -> Key {
    let dt = DATES.choose(rng).expect("dates").to_string();
    (dt, rng.random_range(0..25), rng.random_range(0..3))
}

/// Every bucket of the table that exists so far.
async fn buckets(client: &MinkClient, table: &TableDescriptor) -> Vec<BucketId> {
    client
        .list_buckets(&table.path)
        .await
        .expect("buckets")
        .into_iter()
        .map(|s| s.bucket.expect("id"))
        .collect()
}

async fn check(
    client: &MinkClient,
    table: &TableDescriptor,
    model: &Model,
    rng: &mut StdRng,
    step: usize,
) {
    let mut snapshot = Model::new();
    let mut folded = Model::new();
    for bucket in buckets(client, table).await {
        let answer = client.snapshot(&bucket, &[], 7).await.expect("snapshot");
        let rows: Vec<_> = answer.batches.iter().flat_map(values).collect();
        assert!(
            rows.windows(2).all(|w| w[0].0 < w[1].0),
            "step {step}: {bucket} snapshot is in key order"
        );
        let high_watermark = fold_changelog(client, &bucket, 0, &mut folded).await;
        assert_eq!(
            answer.log_offset, high_watermark,
            "step {step}: {bucket} snapshot offset"
        );
        snapshot.extend(rows);
    }
    assert_eq!(
        &snapshot, model,
        "step {step}: snapshot differs from the model"
    );
    assert_eq!(
        &folded, model,
        "step {step}: the folded changelog differs from the model"
    );

    let keys: Vec<Key> = (0..30).map(|_| random_key(rng)).collect();
    let found = client
        .lookup(table, &pk_keys(&keys), &[])
        .await
        .expect("lookup");
    let mut got: Vec<(usize, (Key, Option<String>))> = found
        .key_indices
        .iter()
        .map(|i| *i as usize)
        .zip(values(&found.rows))
        .collect();
    got.sort();
    let expected: Vec<(usize, (Key, Option<String>))> = keys
        .iter()
        .enumerate()
        .filter_map(|(i, k)| model.get(k).map(|v| (i, (k.clone(), v.clone()))))
        .collect();
    assert_eq!(got, expected, "step {step}: lookup");

    let prefixes: Vec<(String, i64)> = keys.iter().take(8).map(|k| (k.0.clone(), k.1)).collect();
    let prefix_batch = pk_keys(
        &prefixes
            .iter()
            .map(|(dt, id)| (dt.clone(), *id, 0))
            .collect::<Vec<_>>(),
    )
    .project(&[0, 1])
    .expect("prefix columns");
    let found = client
        .prefix_lookup(table, &prefix_batch, &[])
        .await
        .expect("prefix lookup");
    let mut got: Vec<(usize, Key)> = found
        .key_indices
        .iter()
        .map(|i| *i as usize)
        .zip(values(&found.rows).into_iter().map(|(k, _)| k))
        .collect();
    got.sort();
    let mut expected: Vec<(usize, Key)> = Vec::new();
    for (i, (dt, id)) in prefixes.iter().enumerate() {
        expected.extend(
            model
                .keys()
                .filter(|k| &k.0 == dt && k.1 == *id)
                .map(|k| (i, k.clone())),
        );
    }
    assert_eq!(got, expected, "step {step}: prefix lookup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_pk_histories_match_the_model() {
    random_pk_history("random_pk_histories_match_the_model", None).await;
}

/// The same histories with the log in a store on the local file system: half the times
/// the KV store is lost, the log goes with it (and at step 20 always: every history loses
/// its disk once), and the node rebuilds the log from the store, then the KV store from
/// the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_pk_histories_with_a_log_store_match_the_model() {
    let store = tempfile::tempdir().expect("store dir");
    let test = "random_pk_histories_with_a_log_store_match_the_model";
    random_pk_history(test, Some(store.path())).await;
}

/// A random history of upserts, deletes, `kill -9` restarts and lost KV stores, checked
/// after every step; with a `store` (a directory), the log is kept in it and some restarts
/// lose the log too.
async fn random_pk_history(test: &str, store: Option<&Path>) {
    let seed = seed(test);
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("temp dir");
    // The KV store's write buffer written to its files after about every group, every
    // few groups, or only when the node stops.
    let buffer = ["1KiB", "16KiB", "256MiB"][rng.random_range(0..3)];
    // A block cache that holds a few blocks, or every block the history writes.
    let cache = ["16KiB", "256MiB"][rng.random_range(0..2)];
    println!("--kv-write-buffer {buffer} --kv-cache {cache}");
    let url = store.map(file_store_url);
    let mut flags = vec!["--kv-write-buffer", buffer, "--kv-cache", cache];
    if let Some(url) = &url {
        // Segments that seal every few writes: the store keeps them as stream objects,
        // which the log is rebuilt from and the KV store replays.
        flags.extend(["--log-store", url, "--log-segment-size", "4KiB"]);
    }
    let start = || ServerProcess::start_with(dir.path(), &flags, &[]);
    let mut server = start();
    let mut client = MinkClient::connect(&server.addr).await.expect("connect");
    let table = client
        .create_table(&pk_table("pk", 3), false)
        .await
        .expect("create");
    let mut model = Model::new();
    for step in 0..30 {
        // Every history has at least one crash and one lost KV store.
        let action = match step {
            10 => 85,
            20 => 95,
            _ => rng.random_range(0..100),
        };
        match action {
            0..50 => {
                let rows: Vec<(Key, Option<String>)> = (0..rng.random_range(1..40))
                    .map(|_| {
                        (
                            random_key(&mut rng),
                            rng.random_bool(0.8)
                                .then(|| format!("v{}", rng.random_range(0..1000))),
                        )
                    })
                    .collect();
                client
                    .write(&table, &pk_rows(&table, &rows))
                    .await
                    .expect("upsert");
                model.extend(rows);
            }
            50..80 => {
                // Deletes: mostly keys that exist, some that do not.
                let mut keys: Vec<Key> = model
                    .keys()
                    .filter(|_| rng.random_bool(0.3))
                    .cloned()
                    .collect();
                keys.extend((0..5).map(|_| random_key(&mut rng)));
                client
                    .delete(&table, &pk_keys(&keys))
                    .await
                    .expect("delete");
                for key in &keys {
                    model.remove(key);
                }
            }
            80..92 => {
                server.kill();
                server = start();
                client = MinkClient::connect(&server.addr).await.expect("reconnect");
            }
            _ => {
                // Lose the whole KV store (if there is one yet): the node rebuilds it from
                // the log; with a store, maybe the log too (the whole disk), which the node
                // rebuilds from the store first.
                let lose_log = store.is_some() && (step == 20 || rng.random_bool(0.5));
                server.kill();
                match lose_log {
                    true => {
                        println!("step {step}: the disk is lost");
                        remove_dirs(dir.path(), &LOST_DISK);
                    }
                    false => remove_dirs(dir.path(), &["kv"]),
                }
                server = start();
                client = MinkClient::connect(&server.addr).await.expect("reconnect");
            }
        }
        check(&client, &table, &model, &mut rng, step).await;
    }
}

/// Creates `table` (of one bucket) without its partitioning; the table and its bucket.
async fn create_unpartitioned(
    node: &TestNode,
    mut table: TableDescriptor,
) -> (TableDescriptor, BucketId) {
    table.partition_keys.clear();
    let table = node
        .client
        .create_table(&table, false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    (table, bucket)
}

/// An operation a writer made, as acknowledged: `(base_offset, empty, op)`.
type Acked = (i64, bool, Op);

#[derive(Debug, Clone)]
enum Op {
    Upsert(Vec<(Key, Option<String>)>),
    Delete(Vec<Key>),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_then_scan_is_a_consistent_bootstrap_under_concurrent_writers() {
    let seed = seed("snapshot_then_scan_is_a_consistent_bootstrap");
    let node = TestNode::start().await;
    let mut table = pk_table("bootstrap", 1);
    table.bucket_key = vec!["id".into()];
    let (table, bucket) = create_unpartitioned(&node, table).await;

    let mut writers = Vec::new();
    for writer in 0..3u64 {
        let (client, table) = (node.client.clone(), table.clone());
        writers.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed + writer);
            let mut acked: Vec<Acked> = Vec::new();
            for _ in 0..60 {
                let keys: Vec<Key> = (0..rng.random_range(1..8))
                    .map(|_| ("d".to_string(), rng.random_range(0..30), 0))
                    .collect();
                let (op, ack) = if rng.random_bool(0.7) {
                    let rows: Vec<_> = keys
                        .into_iter()
                        .map(|k| (k, Some(format!("w{writer}"))))
                        .collect();
                    let acks = client
                        .append(&BucketId::new(&table.path, 0), vec![pk_rows(&table, &rows)])
                        .await
                        .expect("upsert");
                    (Op::Upsert(rows), acks[0].clone())
                } else {
                    let acks = client
                        .delete_keys(&BucketId::new(&table.path, 0), vec![pk_keys(&keys)])
                        .await
                        .expect("delete");
                    (Op::Delete(keys), acks[0].clone())
                };
                acked.push((ack.base_offset, ack.last_offset < ack.base_offset, op));
            }
            acked
        }));
    }
    // Bootstrap while the writers run.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let snapshot = node
        .client
        .snapshot(&bucket, &[], 5)
        .await
        .expect("snapshot");
    let mut acked: Vec<Acked> = Vec::new();
    for writer in writers {
        acked.extend(writer.await.expect("writer"));
    }
    // The model: every acknowledged operation in log order (a no-op at offset X came
    // before whatever was logged at X).
    acked.sort_by_key(|(base, empty, _)| (*base, !*empty));
    let mut model = Model::new();
    for (_, _, op) in acked {
        match op {
            Op::Upsert(rows) => model.extend(rows),
            Op::Delete(keys) => keys.iter().for_each(|k| {
                model.remove(k);
            }),
        }
    }
    let mut state: Model = snapshot.batches.iter().flat_map(values).collect();
    fold_changelog(&node.client, &bucket, snapshot.log_offset, &mut state).await;
    assert_eq!(
        state, model,
        "snapshot + changelog from its offset = the final state"
    );
    let last: Model = node
        .client
        .snapshot(&bucket, &[], 0)
        .await
        .expect("snapshot")
        .batches
        .iter()
        .flat_map(values)
        .collect();
    assert_eq!(last, model);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_scan_reads_the_first_keys_or_the_last_log_rows() {
    let node = TestNode::start().await;
    let mut pk = pk_table("limit_pk", 1);
    pk.partition_keys.clear();
    pk.bucket_key = vec!["id".into()];
    let pk = node.client.create_table(&pk, false).await.expect("create");
    let rows: Vec<(Key, Option<String>)> = (0..50)
        .rev()
        .map(|i| (("d".to_string(), i, 0), None))
        .collect();
    node.client
        .write(&pk, &pk_rows(&pk, &rows))
        .await
        .expect("upsert");
    let first = node
        .client
        .limit_scan(&BucketId::new(&pk.path, 0), 5, &[1])
        .await
        .expect("limit scan");
    let ids = first_column_ids(&first);
    assert_eq!(ids, vec![0, 1, 2, 3, 4], "the first keys in key order");

    let log = node
        .client
        .create_table(&events_table("limit_log", 1, Default::default()), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&log.path, 0);
    node.client
        .append(
            &bucket,
            vec![
                events(&log, &(0..30).collect::<Vec<_>>()),
                events(&log, &(30..40).collect::<Vec<_>>()),
            ],
        )
        .await
        .expect("append");
    let last = node
        .client
        .limit_scan(&bucket, 15, &[0])
        .await
        .expect("limit scan");
    let ids = first_column_ids(&last);
    assert_eq!(
        ids,
        (25..40).collect::<Vec<i64>>(),
        "the last rows of the log"
    );
}

/// Retention never removes log a KV store would replay after a crash: a bucket's buffered
/// rows are written to the store's files before its expired segments go, so the store's
/// files reach at least the new start of the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_the_log_a_kv_store_replays_from() {
    // A write buffer that holds every row of the test.
    let node = TestNode::start_with(|config| config.kv.buffer = BufferLimits::default()).await;
    let mut table = pk_table("ttl", 1);
    table.log_ttl = Some(Duration::from_secs(1));
    let (table, bucket) = create_unpartitioned(&node, table).await;
    let mut model = Model::new();
    for chunk in 0..5 {
        let rows: Vec<(Key, Option<String>)> = (0..100)
            .map(|id| (("d".into(), id, 0), Some(format!("v{chunk}"))))
            .collect();
        node.client
            .append(&bucket, vec![pk_rows(&table, &rows)])
            .await
            .expect("upsert");
        model.extend(rows);
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // The active segment is now older than the TTL: this write starts a new segment.
    let fresh = [(("d".to_string(), 1000, 0), Some("fresh".to_string()))];
    node.client
        .append(&bucket, vec![pk_rows(&table, &fresh)])
        .await
        .expect("upsert");
    model.extend(fresh);
    let (_, kv) = node.node().kv_bucket(&bucket).expect("bucket");
    let kv = kv.expect("a primary-key bucket");
    assert_eq!(kv.flushed_offset().expect("offset"), 0, "all rows buffered");

    assert!(node.node().enforce_retention().expect("retention") >= 1);
    let earliest = node
        .client
        .list_offsets(&bucket, Spec::Earliest(true))
        .await
        .expect("earliest");
    assert!(earliest > 0, "expired segments are removed");
    assert!(
        kv.flushed_offset().expect("offset") >= earliest,
        "the store's files reach the start of the log"
    );
    let answer = node
        .client
        .snapshot(&bucket, &[], 1000)
        .await
        .expect("snapshot");
    let rows: Model = answer.batches.iter().flat_map(values).collect();
    assert_eq!(rows, model);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_key_requests_are_named() {
    let node = TestNode::start().await;
    let client = &node.client;
    let table = client
        .create_table(&pk_table("bad_pk", 2), false)
        .await
        .expect("create");
    let log = client
        .create_table(&events_table("bad_log", 1, Default::default()), false)
        .await
        .expect("create");

    // A null in a primary-key column.
    let with_null = {
        let rows = pk_rows(&table, &[(("2024-01-01".into(), 1, 0), None)]);
        let mut columns = rows.columns().to_vec();
        columns[2] = std::sync::Arc::new(arrow::array::Int32Array::from(vec![None::<i32>]));
        let fields: Vec<_> = rows
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        arrow::array::RecordBatch::try_new(
            std::sync::Arc::new(arrow::datatypes::Schema::new(fields)),
            columns,
        )
        .expect("batch")
    };
    let mut bucket = BucketId::new(&table.path, 0);
    bucket.partition = Some("dt=2024-01-01".into());
    let err = client
        .append(&bucket, vec![with_null])
        .await
        .expect_err("null key");
    assert_eq!(err.code(), Some(Code::InvalidArgument), "{err}");
    assert!(err.to_string().contains("'seq'"), "{err}");

    // Keys to delete without every key column.
    let missing = pk_keys(&[("2024-01-01".into(), 1, 0)])
        .project(&[0, 1])
        .expect("project");
    let err = client
        .delete_keys(&bucket, vec![missing])
        .await
        .expect_err("missing key column");
    assert!(err.to_string().contains("'seq'"), "{err}");

    // A delete and key reads on a log table.
    let err = client
        .delete_keys(&BucketId::new(&log.path, 0), vec![events(&log, &[1])])
        .await
        .expect_err("log delete");
    assert_eq!(err.code(), Some(Code::InvalidArgument), "{err}");
    assert!(err.to_string().contains("log table"), "{err}");
    let err = client
        .snapshot(&BucketId::new(&log.path, 0), &[], 0)
        .await
        .expect_err("log snapshot");
    assert!(err.to_string().contains("log table"), "{err}");

    // Columns that are not a prefix of the key (in the wrong order), and a prefix without
    // the bucket key.
    let not_prefix = pk_keys(&[("2024-01-01".into(), 1, 0)])
        .project(&[1, 0])
        .expect("project");
    let err = client
        .prefix_lookup(&table, &not_prefix, &[])
        .await
        .expect_err("bad prefix");
    assert_eq!(err.code(), Some(Code::InvalidArgument), "{err}");
    assert!(err.to_string().contains("not a key prefix"), "{err}");
    let too_short = pk_keys(&[("2024-01-01".into(), 1, 0)])
        .project(&[0])
        .expect("project");
    let err = client
        .prefix_lookup(&table, &too_short, &[])
        .await
        .expect_err("short prefix");
    assert!(err.to_string().contains("'id'"), "{err}");
    // Deleting from a partition with no rows changes nothing and does not create it.
    let acks = client
        .delete(&table, &pk_keys(&[("2031-01-01".into(), 1, 0)]))
        .await
        .expect("delete from an empty partition");
    assert!(
        acks.iter()
            .all(|(_, ack)| ack.last_offset < ack.base_offset)
    );
    let partitions: Vec<_> = client
        .list_buckets(&table.path)
        .await
        .expect("buckets")
        .into_iter()
        .filter_map(|s| s.bucket?.partition)
        .collect();
    assert!(
        partitions.is_empty(),
        "refused writes and deletes of missing rows create no partition: {partitions:?}"
    );
    // An upsert into a partitioned table is routed; a lookup of a partition with no rows
    // finds nothing.
    let found = client
        .lookup(&table, &pk_keys(&[("2030-01-01".into(), 1, 0)]), &[])
        .await
        .expect("lookup");
    assert_eq!(found.rows.num_rows(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn added_columns_read_as_null_for_older_rows_across_a_rebuild() {
    use arrow::array::{Array, AsArray};
    let dir = tempfile::tempdir().expect("temp dir");
    let mut server = ServerProcess::start(dir.path());
    let mut client = MinkClient::connect(&server.addr).await.expect("connect");
    let mut table = pk_table("evolving", 1);
    table.partition_keys.clear();
    let table = client.create_table(&table, false).await.expect("create");
    let old: Vec<(Key, Option<String>)> = (0..4)
        .map(|i| (("d".to_string(), i, 0), Some(format!("old{i}"))))
        .collect();
    client
        .write(&table, &pk_rows(&table, &old))
        .await
        .expect("upsert v0");
    let evolved = client
        .add_column(
            &table.path,
            arrow::datatypes::Field::new("w", arrow::datatypes::DataType::Int64, true),
        )
        .await
        .expect("add column");
    // Rewrite key 1 and add key 9 under the new schema.
    let new_rows = pk_rows(
        &table,
        &[
            (("d".to_string(), 1, 0), Some("new1".into())),
            (("d".to_string(), 9, 0), None),
        ],
    );
    let mut columns = new_rows.columns().to_vec();
    columns.push(std::sync::Arc::new(arrow::array::Int64Array::from(vec![
        10, 90,
    ])));
    let new_rows =
        arrow::array::RecordBatch::try_new(std::sync::Arc::clone(evolved.schema()), columns)
            .expect("v1 rows");
    client.write(&evolved, &new_rows).await.expect("upsert v1");
    for round in 0..2 {
        let answer = client
            .snapshot(&BucketId::new(&table.path, 0), &[1, 3, 4], 0)
            .await
            .expect("snapshot");
        let batch =
            arrow::compute::concat_batches(&answer.schema, &answer.batches).expect("concat");
        let ids = batch
            .column(0)
            .as_primitive::<arrow::datatypes::Int64Type>();
        let w = batch
            .column(2)
            .as_primitive::<arrow::datatypes::Int64Type>();
        let rows: Vec<(i64, Option<i64>)> = (0..batch.num_rows())
            .map(|i| (ids.value(i), w.is_valid(i).then(|| w.value(i))))
            .collect();
        assert_eq!(
            rows,
            vec![
                (0, None),
                (1, Some(10)),
                (2, None),
                (3, None),
                (9, Some(90))
            ],
            "round {round}"
        );
        // Then lose the KV store: it is rebuilt from batches of both schema versions.
        server.kill();
        std::fs::remove_dir_all(dir.path().join("kv")).expect("remove kv");
        server = ServerProcess::start(dir.path());
        client = MinkClient::connect(&server.addr).await.expect("reconnect");
    }
}
