//! Tail: long polls that wake on writes, time out empty, honour min_bytes, and serve a
//! consumer loop over one stream.

use std::time::{Duration, Instant};

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;
use tonic::Code;

use crate::support::{TestNode, events, events_table};

async fn one_bucket_table(
    node: &TestNode,
    name: &str,
) -> (mink_core::table::TableDescriptor, BucketId) {
    let table = node
        .client
        .create_table(&events_table(name, 1, TableOptions::default()), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    (table, bucket)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_reader_wakes_on_write() {
    let node = TestNode::start().await;
    let (table, bucket) = one_bucket_table(&node, "wake").await;
    let mut tailer = node.client.tail(&bucket, &[]).await.expect("tail");
    let poll = tokio::spawn(async move {
        let answer = tailer
            .poll(0, Duration::from_secs(30), 0)
            .await
            .expect("poll");
        (answer, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    node.client
        .append(&bucket, vec![events(&table, &[1, 2, 3])])
        .await
        .expect("append");
    let acked = Instant::now();
    let (answer, received) = poll.await.expect("poller");
    assert_eq!(answer.num_rows(), 3);
    assert_eq!((answer.next_offset, answer.high_watermark), (3, 3));
    // Woken by the write, not by the 30 s timeout.
    assert!(received.duration_since(acked) < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_poll_returns_empty_after_max_wait() {
    let node = TestNode::start().await;
    let (table, bucket) = one_bucket_table(&node, "idle").await;
    node.client
        .append(&bucket, vec![events(&table, &[1])])
        .await
        .expect("append");
    let mut tailer = node.client.tail(&bucket, &[]).await.expect("tail");
    let started = Instant::now();
    let answer = tailer
        .poll(1, Duration::from_millis(300), 0)
        .await
        .expect("poll");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(answer.num_rows(), 0);
    assert_eq!((answer.next_offset, answer.high_watermark), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_bytes_keeps_the_poll_waiting() {
    let node = TestNode::start().await;
    let (table, bucket) = one_bucket_table(&node, "min_bytes").await;
    node.client
        .append(&bucket, vec![events(&table, &[1])])
        .await
        .expect("append");
    let mut tailer = node.client.tail(&bucket, &[]).await.expect("tail");

    // Too few bytes, nothing more comes: the wait runs out, then what is there is returned.
    let started = Instant::now();
    let answer = tailer
        .poll(0, Duration::from_millis(400), 1 << 20)
        .await
        .expect("poll");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "min_bytes made it wait"
    );
    assert_eq!(answer.num_rows(), 1);

    // Enough bytes arrive during the wait: the poll returns with them before the deadline.
    let writer = {
        let (client, table, bucket) = (node.client.clone(), table.clone(), bucket.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let ids: Vec<i64> = (100..20_100).collect();
            client
                .append(&bucket, vec![events(&table, &ids)])
                .await
                .expect("append");
        })
    };
    let started = Instant::now();
    let answer = tailer
        .poll(1, Duration::from_secs(30), 100_000)
        .await
        .expect("poll");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(answer.num_rows(), 20_000);
    writer.await.expect("writer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stream_serves_a_consumer_loop_with_projection() {
    let node = TestNode::start().await;
    let (table, bucket) = one_bucket_table(&node, "consumer").await;
    let mut tailer = node.client.tail(&bucket, &[0]).await.expect("tail");
    let mut offset = 0;
    let mut seen = Vec::new();
    for round in 0..5i64 {
        let ids: Vec<i64> = (round * 10..round * 10 + 10).collect();
        node.client
            .append(&bucket, vec![events(&table, &ids)])
            .await
            .expect("append");
        let answer = tailer
            .poll(offset, Duration::from_secs(10), 0)
            .await
            .expect("poll");
        assert_eq!(
            answer.schema.fields().len(),
            1,
            "projected to the id column"
        );
        for read in &answer.batches {
            seen.extend_from_slice(read.batch.column(0).as_primitive::<Int64Type>().values());
        }
        offset = answer.next_offset;
    }
    assert_eq!(seen, (0..50).collect::<Vec<i64>>());

    let err = tailer
        .poll(offset + 5, Duration::from_millis(10), 0)
        .await
        .expect_err("past the watermark");
    assert_eq!(err.code(), Some(Code::OutOfRange), "{err}");
}

/// A consumer holding its Tail session open between polls does not hold a server's
/// shutdown back: `kill -TERM` ends the session and the process exits at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tail_session_does_not_hold_a_shutdown_back() {
    let dir = tempfile::tempdir().expect("dir");
    let mut server = crate::process::ServerProcess::start(dir.path());
    let client = mink_client::MinkClient::connect(&server.addr)
        .await
        .expect("connect");
    let table = client
        .create_table(&events_table("idle", 1, TableOptions::default()), false)
        .await
        .expect("create");
    let mut tailer = client
        .tail(&BucketId::new(&table.path, 0), &[])
        .await
        .expect("tail");
    let answer = tailer.poll(0, Duration::ZERO, 0).await.expect("poll");
    assert_eq!(answer.num_rows(), 0);
    server.terminate();
    let asked = Instant::now();
    while server.is_running() {
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "the server is still running with a Tail session open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(tailer);
}
