//! Random histories of concurrent appends, schema changes and restarts, checked after
//! every step against a model of each bucket's log, with the log in the data directory or
//! in a log store (where restarts may lose the disk); and `log.ttl` retention.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arrow::array::{Array, ArrayRef, AsArray, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int32Type, Int64Type};
use mink_client::MinkClient;
use mink_core::options::TableOptions;
use mink_core::protocol::{BucketId, list_offsets::Spec};
use mink_core::table::TableDescriptor;
use mink_log::LogStoreConfig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::Code;

use crate::support::{TestNode, events, events_table, file_store_url, seed};

/// Steps of a random history.
const STEPS: usize = 40;

/// One row as the model keeps it: id, name, and the column added mid-history.
type Row = (i64, Option<String>, Option<i32>);

/// An acknowledged batch: base offset, rows, and the wall-clock window of its append.
type AckedBatch = (i64, Vec<Row>, i64, i64);

/// What one bucket's log must contain.
#[derive(Debug, Default)]
struct BucketModel {
    rows: BTreeMap<i64, Row>,
    /// `(base_offset, earliest and latest possible commit time)` per acknowledged batch.
    batches: Vec<(i64, i64, i64)>,
    high_watermark: i64,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

fn batch_of(table: &TableDescriptor, rows: &[Row]) -> RecordBatch {
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0)));
    let names: ArrayRef = Arc::new(StringArray::from(
        rows.iter().map(|r| r.1.clone()).collect::<Vec<_>>(),
    ));
    let mut columns = vec![ids, names];
    if table.schema().fields().len() == 3 {
        columns.push(Arc::new(Int32Array::from(
            rows.iter().map(|r| r.2).collect::<Vec<_>>(),
        )));
    }
    RecordBatch::try_new(Arc::clone(table.schema()), columns).expect("batch")
}

fn rows_of(batch: &RecordBatch) -> Vec<Row> {
    let ids = batch
        .column_by_name("id")
        .map(|c| c.as_primitive::<Int64Type>().clone());
    let names = batch
        .column_by_name("name")
        .map(|c| c.as_string::<i32>().clone());
    let scores = batch
        .column_by_name("score")
        .map(|c| c.as_primitive::<Int32Type>().clone());
    (0..batch.num_rows())
        .map(|i| {
            (
                ids.as_ref().map_or(0, |c| c.value(i)),
                names
                    .as_ref()
                    .and_then(|c| c.is_valid(i).then(|| c.value(i).to_string())),
                scores
                    .as_ref()
                    .and_then(|c| c.is_valid(i).then(|| c.value(i))),
            )
        })
        .collect()
}

fn random_rows(rng: &mut StdRng, next_id: &mut i64, with_score: bool) -> Vec<Row> {
    let n = rng.random_range(1..300);
    (0..n)
        .map(|_| {
            *next_id += 1;
            let name = rng
                .random_bool(0.9)
                .then(|| format!("n{}", rng.random_range(0..1_000_000)));
            let score = (with_score && rng.random_bool(0.8)).then(|| rng.random_range(-100..100));
            (*next_id, name, score)
        })
        .collect()
}

/// Reads `[from, high watermark)` of a bucket with the given projection and max_bytes.
async fn read_range(
    client: &MinkClient,
    bucket: &BucketId,
    from: i64,
    max_bytes: u64,
    columns: &[u32],
) -> (BTreeMap<i64, Row>, Vec<(i64, i64)>) {
    let mut rows = BTreeMap::new();
    let mut batches = Vec::new();
    let mut offset = from;
    loop {
        let answer = client
            .scan(bucket, offset, max_bytes, columns)
            .await
            .expect("scan");
        for read in &answer.batches {
            let meta = &read.metadata;
            assert!(meta.base_offset <= offset.max(meta.base_offset));
            assert_eq!(
                meta.last_offset - meta.base_offset + 1,
                read.batch.num_rows() as i64
            );
            assert!(
                meta.last_offset < meta.high_watermark,
                "a row past the high watermark"
            );
            assert_eq!(read.batch.schema(), answer.schema, "batches are normalized");
            batches.push((meta.base_offset, meta.commit_timestamp));
            for (i, row) in rows_of(&read.batch).into_iter().enumerate() {
                let at = meta.base_offset + i as i64;
                if at >= from {
                    rows.insert(at, row);
                }
            }
        }
        if answer.next_offset >= answer.high_watermark {
            return (rows, batches);
        }
        assert!(answer.next_offset > offset, "a scan must make progress");
        offset = answer.next_offset;
    }
}

/// Projects a model row to what a read of `columns` returns.
fn project(row: &Row, columns: &[u32], width: usize) -> Row {
    let keep = |i: u32| columns.is_empty() || columns.contains(&i);
    (
        if keep(0) { row.0 } else { 0 },
        if keep(1) { row.1.clone() } else { None },
        if keep(2) && width == 3 { row.2 } else { None },
    )
}

async fn check(
    client: &MinkClient,
    table: &TableDescriptor,
    models: &[BucketModel],
    rng: &mut StdRng,
    step: usize,
) {
    let width = table.schema().fields().len();
    for (b, model) in models.iter().enumerate() {
        let bucket = BucketId::new(&table.path, b as u32);
        let earliest = client
            .list_offsets(&bucket, Spec::Earliest(true))
            .await
            .expect("earliest");
        let latest = client
            .list_offsets(&bucket, Spec::Latest(true))
            .await
            .expect("latest");
        assert_eq!(
            (earliest, latest),
            (0, model.high_watermark),
            "step {step} bucket {b} offsets"
        );

        let (rows, batches) = read_range(client, &bucket, 0, 0, &[]).await;
        assert_eq!(
            rows, model.rows,
            "step {step} bucket {b}: full scan differs from the model"
        );
        let bases: Vec<i64> = batches.iter().map(|(base, _)| *base).collect();
        let model_bases: Vec<i64> = model.batches.iter().map(|(base, _, _)| *base).collect();
        assert_eq!(
            bases, model_bases,
            "step {step} bucket {b}: batch boundaries"
        );
        for ((_, ts), (base, earliest, latest)) in batches.iter().zip(&model.batches) {
            assert!(
                (*earliest..=*latest).contains(ts),
                "batch {base} committed at {ts}, outside [{earliest}, {latest}]"
            );
        }
        assert!(
            batches.windows(2).all(|w| w[0].1 <= w[1].1),
            "commit timestamps are monotonic"
        );

        // A partial read: random start, small max_bytes, random projection.
        let from = rng.random_range(0..=model.high_watermark);
        let columns: Vec<u32> = match rng.random_range(0..4) {
            0 => vec![],
            1 => vec![1],
            2 => vec![0],
            _ => (0..width as u32).rev().collect(),
        };
        let max_bytes = rng.random_range(1..20_000);
        let (rows, _) = read_range(client, &bucket, from, max_bytes, &columns).await;
        let expected: BTreeMap<i64, Row> = model
            .rows
            .range(from..)
            .map(|(o, r)| (*o, project(r, &columns, width)))
            .collect();
        assert_eq!(
            rows, expected,
            "step {step} bucket {b}: scan from {from} columns {columns:?}"
        );

        // list_offsets by timestamp against the batches' commit times.
        let mut probes: Vec<i64> = batches.iter().flat_map(|(_, ts)| [*ts, ts + 1]).collect();
        probes.extend([0, i64::MAX / 2]);
        for probe in probes {
            let expected = batches
                .iter()
                .find(|(_, ts)| *ts >= probe)
                .map_or(model.high_watermark, |(base, _)| *base);
            let found = client
                .list_offsets(&bucket, Spec::Timestamp(probe))
                .await
                .expect("timestamp");
            assert_eq!(
                found, expected,
                "step {step} bucket {b}: offset at timestamp {probe}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_histories_match_the_model() {
    random_history("random_histories_match_the_model", None).await;
}

/// The same histories with the log in a store on the local file system, in small
/// segments (which the store keeps as stream objects): half the restarts lose the disk
/// (the log and the KV store), and the last one always does; the node rebuilds its log
/// from the store, batch boundaries and commit times included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_histories_with_a_log_store_match_the_model() {
    let store = tempfile::tempdir().expect("store dir");
    let test = "random_histories_with_a_log_store_match_the_model";
    random_history(test, Some(store.path())).await;
}

/// Restarts the node; with `lose_disk`, deleting its log and KV store meanwhile.
async fn restart(node: &mut TestNode, lose_disk: bool, step: usize) {
    match lose_disk {
        true => {
            eprintln!("step {step}: a restart that loses the disk");
            node.restart_losing_disk().await;
        }
        false => node.restart().await,
    }
}

/// A random history of appends, a schema change and restarts over one table, checked
/// after every step; with a `store` (a directory), the log is kept in it and some
/// restarts lose the disk.
async fn random_history(test: &str, store: Option<&Path>) {
    let seed = seed(test);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut node = TestNode::start_with(|config| {
        if let Some(dir) = store {
            config.log_store = Some(LogStoreConfig::new(file_store_url(dir)));
            // Segments that seal every few writes: their uploads as stream objects, and
            // logs rebuilt from them and the WAL objects after.
            config.log.segment_bytes = 4 << 10;
        }
    })
    .await;
    let buckets = 3;
    let mut table = events_table("history", buckets, TableOptions::default());
    table.bucket_key.clear(); // round robin: the test chooses each batch's bucket
    let mut table = node
        .client
        .create_table(&table, false)
        .await
        .expect("create");
    let mut models: Vec<BucketModel> = (0..buckets).map(|_| BucketModel::default()).collect();
    let mut next_id = 0;
    for step in 0..STEPS {
        match rng.random_range(0..100) {
            0..70 => {
                // Several writers at once, each appending a few batches to one bucket.
                let writers = rng.random_range(1..=3);
                let mut tasks = Vec::new();
                for _ in 0..writers {
                    let bucket = rng.random_range(0..buckets);
                    let batches: Vec<Vec<Row>> = (0..rng.random_range(1..=4))
                        .map(|_| {
                            random_rows(&mut rng, &mut next_id, table.schema().fields().len() == 3)
                        })
                        .collect();
                    let client = node.client.clone();
                    let table = table.clone();
                    tasks.push(tokio::spawn(async move {
                        let before = now_ms();
                        let arrow: Vec<RecordBatch> =
                            batches.iter().map(|rows| batch_of(&table, rows)).collect();
                        let acks = client
                            .append(&BucketId::new(&table.path, bucket), arrow)
                            .await
                            .expect("append");
                        (bucket, batches, acks, before, now_ms())
                    }));
                }
                let mut results = Vec::new();
                for task in tasks {
                    results.push(task.await.expect("writer"));
                }
                let mut by_bucket: BTreeMap<u32, Vec<AckedBatch>> = BTreeMap::new();
                for (bucket, batches, acks, before, after) in results {
                    assert!(
                        acks.windows(2).all(|w| w[0].last_offset < w[1].base_offset),
                        "one stream's acks are ordered"
                    );
                    for (rows, ack) in batches.into_iter().zip(acks) {
                        assert_eq!(ack.last_offset - ack.base_offset + 1, rows.len() as i64);
                        by_bucket.entry(bucket).or_default().push((
                            ack.base_offset,
                            rows,
                            before,
                            after,
                        ));
                    }
                }
                for (bucket, mut batches) in by_bucket {
                    batches.sort_by_key(|(base, ..)| *base);
                    let model = &mut models[bucket as usize];
                    for (base, rows, before, after) in batches {
                        assert_eq!(
                            base, model.high_watermark,
                            "step {step}: acknowledged offsets are dense"
                        );
                        model.batches.push((base, before, after));
                        for (i, row) in rows.into_iter().enumerate() {
                            model.rows.insert(base + i as i64, row);
                        }
                        model.high_watermark = *model.rows.keys().last().expect("rows") + 1;
                    }
                }
            }
            70..90 => {
                let lose_disk = store.is_some() && rng.random_bool(0.5);
                restart(&mut node, lose_disk, step).await;
            }
            _ if table.schema().fields().len() == 2 => {
                table = node
                    .client
                    .add_column(&table.path, Field::new("score", DataType::Int32, true))
                    .await
                    .expect("add column");
                assert_eq!(table.current().schema_id, 1);
            }
            _ => node.restart().await,
        }
        check(&node.client, &table, &models, &mut rng, step).await;
    }
    if store.is_some() {
        restart(&mut node, true, STEPS).await;
        check(&node.client, &table, &models, &mut rng, STEPS).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_moves_log_start_past_expired_segments() {
    let node = TestNode::start().await;
    let options = TableOptions {
        log_ttl: Some(Duration::from_secs(1)),
        ..TableOptions::default()
    };
    let table = node
        .client
        .create_table(&events_table("ttl", 1, options), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    for chunk in 0..5 {
        let ids: Vec<i64> = (chunk * 100..chunk * 100 + 100).collect();
        node.client
            .append(&bucket, vec![events(&table, &ids)])
            .await
            .expect("append");
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // The active segment is now older than the TTL: this write starts a new segment.
    let fresh = node
        .client
        .append(&bucket, vec![events(&table, &[1000, 1001])])
        .await
        .expect("append");
    let removed = node.node().enforce_retention().expect("retention");
    assert!(removed >= 1, "expired segments are removed");
    let earliest = node
        .client
        .list_offsets(&bucket, Spec::Earliest(true))
        .await
        .expect("earliest");
    assert_eq!(earliest, fresh[0].base_offset);
    let err = node
        .client
        .scan(&bucket, 0, 0, &[])
        .await
        .expect_err("below log_start");
    assert_eq!(err.code(), Some(Code::OutOfRange), "{err}");
    assert!(err.to_string().contains("out of range"), "{err}");
    let answer = node
        .client
        .scan(&bucket, earliest, 0, &[])
        .await
        .expect("scan");
    let ids: Vec<i64> = answer
        .batches
        .iter()
        .flat_map(|b| rows_of(&b.batch))
        .map(|r| r.0)
        .collect();
    assert_eq!(ids, vec![1000, 1001]);
    let files = std::fs::read_dir(node.dir.path().join("log"))
        .expect("log dir")
        .count();
    assert_eq!(files, 1, "one table directory");
}

/// A log table with a dictionary column: each stored batch is sent with its own
/// dictionary messages, and reads back as written from the log cache, after a restart
/// (cold segments), through a Tail, and projected (decoded and encoded again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dictionary_columns_read_back_as_written() {
    let mut node = TestNode::start().await;
    let tag = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
    let schema = arrow::datatypes::Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("tag", tag, true),
    ]);
    let options = TableOptions {
        bucket_num: 1,
        ..TableOptions::default()
    };
    let path = mink_core::table::TablePath::new("test", "tags");
    let table = TableDescriptor::new(path, schema, vec![], vec![], options).expect("table");
    let table = node
        .client
        .create_table(&table, false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    let batch = |ids: Vec<i64>, tags: Vec<Option<&str>>| {
        let tags: arrow::array::DictionaryArray<Int32Type> = tags.into_iter().collect();
        let columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(ids)), Arc::new(tags)];
        RecordBatch::try_new(Arc::clone(table.schema()), columns).expect("batch")
    };
    let written = vec![
        batch(vec![1, 2, 3], vec![Some("a"), Some("b"), Some("a")]),
        batch(vec![4, 5], vec![Some("z"), None]),
        batch(vec![6], vec![Some("b")]),
    ];
    node.client
        .append(&bucket, written.clone())
        .await
        .expect("append");
    let tags_of = |batches: Vec<RecordBatch>| -> Vec<(i64, Option<String>)> {
        let mut rows = Vec::new();
        for batch in batches {
            let ids = batch.column(0).as_primitive::<Int64Type>().clone();
            let tags = arrow::compute::cast(batch.column(1), &DataType::Utf8).expect("cast");
            let tags = tags.as_string::<i32>();
            for row in 0..batch.num_rows() {
                let tag = tags.is_valid(row).then(|| tags.value(row).to_string());
                rows.push((ids.value(row), tag));
            }
        }
        rows
    };
    let expected = tags_of(written);
    let scan = async |node: &TestNode, columns: &[u32]| {
        let answer = node
            .client
            .scan(&bucket, 0, 0, columns)
            .await
            .expect("scan");
        answer
            .batches
            .into_iter()
            .map(|b| b.batch)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        tags_of(scan(&node, &[]).await),
        expected,
        "from the log cache"
    );
    assert_eq!(
        tags_of(scan(&node, &[0, 1]).await),
        expected,
        "all columns named"
    );
    let swapped = scan(&node, &[1, 0]).await;
    assert_eq!(swapped[0].schema().field(0).name(), "tag", "projected");
    node.restart().await;
    assert_eq!(
        tags_of(scan(&node, &[]).await),
        expected,
        "from cold segments"
    );
    let mut tail = node.client.tail(&bucket, &[]).await.expect("tail");
    let answer = tail
        .poll(0, Duration::from_millis(10), 0)
        .await
        .expect("poll");
    let tailed = answer.batches.into_iter().map(|b| b.batch).collect();
    assert_eq!(tags_of(tailed), expected, "through a Tail");
}
