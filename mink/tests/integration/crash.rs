//! `kill -9` of the real `mink server` during a write stream: after a restart every
//! acknowledged batch reads back identically and no torn batch is visible.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use mink_client::MinkClient;
use mink_core::options::TableOptions;
use mink_core::protocol::{AppendAck, BucketId};

use crate::process::ServerProcess;
use crate::support::{events, events_table};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_writes_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start(dir.path());
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    let mut table = events_table("crash", 2, TableOptions::default());
    table.bucket_key.clear();
    let table = client.create_table(&table, false).await.expect("create");

    // Every batch sent: first id -> length (ids are unique across the test).
    let sent: Arc<Mutex<BTreeMap<i64, usize>>> = Arc::default();
    let acked: Arc<Mutex<Vec<(u32, AppendAck, i64)>>> = Arc::default();
    let mut writers = Vec::new();
    for writer in 0..2i64 {
        let (client, table, sent, acked) = (
            client.clone(),
            table.clone(),
            Arc::clone(&sent),
            Arc::clone(&acked),
        );
        writers.push(tokio::spawn(async move {
            let bucket = writer as u32;
            for round in 0i64.. {
                let firsts: Vec<i64> = (0..4)
                    .map(|k| (writer * 1_000_000_000) + (round * 4 + k) * 1000)
                    .collect();
                let batches: Vec<_> = firsts
                    .iter()
                    .map(|first| {
                        let len = 1 + (*first / 1000 % 300) as usize;
                        sent.lock().expect("lock").insert(*first, len);
                        events(&table, &(*first..*first + len as i64).collect::<Vec<_>>())
                    })
                    .collect();
                match client
                    .append(&BucketId::new(&table.path, bucket), batches)
                    .await
                {
                    Ok(acks) => {
                        let mut acked = acked.lock().expect("lock");
                        acked.extend(
                            acks.into_iter()
                                .zip(firsts)
                                .map(|(ack, first)| (bucket, ack, first)),
                        );
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.kill();
    for writer in writers {
        writer.await.expect("writer ends once the server is gone");
    }
    let acked = acked.lock().expect("lock").clone();
    assert!(
        acked.len() > 10,
        "the writers got going before the kill ({} acks)",
        acked.len()
    );

    let server = ServerProcess::start(dir.path());
    let client = MinkClient::connect(&server.addr).await.expect("reconnect");
    let sent = sent.lock().expect("lock").clone();
    for bucket in 0..2u32 {
        let bucket_id = BucketId::new(&table.path, bucket);
        let mut read: BTreeMap<i64, i64> = BTreeMap::new();
        let mut offset = 0;
        loop {
            let answer = client
                .scan(&bucket_id, offset, 0, &[])
                .await
                .expect("scan after restart");
            for batch in &answer.batches {
                let ids = batch
                    .batch
                    .column(0)
                    .as_primitive::<Int64Type>()
                    .values()
                    .to_vec();
                let first = ids[0];
                assert_eq!(
                    sent.get(&first),
                    Some(&ids.len()),
                    "batch at {} is a whole sent batch",
                    batch.metadata.base_offset
                );
                assert!(
                    ids.windows(2).all(|w| w[1] == w[0] + 1),
                    "batch rows are intact"
                );
                for (i, id) in ids.into_iter().enumerate() {
                    read.insert(batch.metadata.base_offset + i as i64, id);
                }
            }
            if answer.next_offset >= answer.high_watermark {
                break;
            }
            offset = answer.next_offset;
        }
        for (_, ack, first) in acked.iter().filter(|(b, ..)| *b == bucket) {
            for (i, offset) in (ack.base_offset..=ack.last_offset).enumerate() {
                assert_eq!(
                    read.get(&offset),
                    Some(&(first + i as i64)),
                    "acknowledged offset {offset} of bucket {bucket}"
                );
            }
        }
    }
    server.kill();
}

/// A full disk, made real with a file size limit on the server process (`ulimit -f`, with
/// SIGXFSZ ignored so the write fails with EFBIG instead of killing the process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_the_write_and_keeps_everything_acknowledged() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start_limited(dir.path(), 1024);
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    let table = client
        .create_table(&events_table("full", 1, TableOptions::default()), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    let mut acked = Vec::new();
    let error = loop {
        let first = acked.len() as i64 * 1000;
        let ids: Vec<i64> = (first..first + 1000).collect();
        match client.append(&bucket, vec![events(&table, &ids)]).await {
            Ok(acks) => acked.push(acks[0].clone()),
            Err(error) => break error,
        }
        assert!(acked.len() < 10_000, "the size limit never hit");
    };
    assert_eq!(
        error.code(),
        Some(tonic::Code::ResourceExhausted),
        "{error}"
    );
    assert!(error.to_string().contains("no space"), "{error}");

    // Still serving, with exactly the acknowledged rows.
    let check = |client: MinkClient| {
        let acked = acked.clone();
        let bucket = bucket.clone();
        async move {
            let mut offset = 0;
            let mut ids = Vec::new();
            loop {
                let answer = client.scan(&bucket, offset, 0, &[]).await.expect("scan");
                for batch in &answer.batches {
                    ids.extend_from_slice(
                        batch.batch.column(0).as_primitive::<Int64Type>().values(),
                    );
                }
                if answer.next_offset >= answer.high_watermark {
                    break;
                }
                offset = answer.next_offset;
            }
            assert_eq!(ids, (0..acked.len() as i64 * 1000).collect::<Vec<_>>());
            assert_eq!(
                acked.last().map(|a| a.last_offset + 1),
                Some(ids.len() as i64)
            );
        }
    };
    check(client.clone()).await;
    server.kill();
    let server = ServerProcess::start(dir.path());
    check(MinkClient::connect(&server.addr).await.expect("reconnect")).await;
}
