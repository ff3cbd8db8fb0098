//! The client's pipelined table writer against a served node: each bucket's rows land in
//! the order written whatever the backpressure, and after a failed write nothing more is
//! sent and the rows acknowledged before are counted.

use std::sync::Arc;

use mink_client::{TableWriter, WriteKind};
use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;

use crate::support::{TestNode, events, events_table, first_column_ids};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bucket_gets_its_rows_in_the_order_written() {
    let node = TestNode::start().await;
    let table = node
        .client
        .create_table(&events_table("piped", 4, TableOptions::default()), false)
        .await
        .expect("create");
    let table = Arc::new(table);
    // Room for three batches: writes wait for acknowledgements and queue behind busy
    // buckets all along.
    let mut writer = TableWriter::new(&node.client, Arc::clone(&table), WriteKind::Write, 300);
    for batch in 0..200 {
        let ids: Vec<i64> = (batch * 100..(batch + 1) * 100).collect();
        writer.write(&events(&table, &ids)).await.expect("write");
    }
    assert_eq!(writer.finish().await.expect("finish"), 20_000);
    let mut all = Vec::new();
    for bucket in 0..4 {
        let bucket = BucketId::new(&table.path, bucket);
        let answer = node.client.scan(&bucket, 0, 0, &[]).await.expect("scan");
        let batches: Vec<_> = answer.batches.into_iter().map(|read| read.batch).collect();
        let ids = first_column_ids(&batches);
        assert!(ids.is_sorted(), "bucket {bucket} in order");
        all.extend(ids);
    }
    all.sort_unstable();
    assert_eq!(all, (0..20_000).collect::<Vec<i64>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failed_write_nothing_more_is_sent() {
    let node = TestNode::start().await;
    let created = events_table("dropped", 2, TableOptions::default());
    let table = Arc::new(
        node.client
            .create_table(&created, false)
            .await
            .expect("create"),
    );
    let mut writer = TableWriter::new(&node.client, Arc::clone(&table), WriteKind::Write, 1_000);
    writer
        .write(&events(&table, &[1, 2, 3, 4]))
        .await
        .expect("write");
    while writer.acknowledged_rows() < 4 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    node.client
        .drop_table(&table.path, false)
        .await
        .expect("drop");
    let mut refused = false;
    for batch in 0..50 {
        if writer
            .write(&events(&table, &[batch * 10, batch * 10 + 1]))
            .await
            .is_err()
        {
            refused = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let failed = writer.finish().await.expect_err("the table is gone");
    assert!(refused, "the writer refused writes after its failure");
    assert_eq!(failed.acknowledged_rows, 4);
    assert!(failed.failed_rows > 0);
    assert!(
        failed
            .to_string()
            .contains("4 rows were written before the failure"),
        "{failed}"
    );
}
