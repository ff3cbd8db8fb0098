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

/// A TCP proxy in front of a node that can lose the node's answers: while it drops them,
/// what the client sends still reaches the node, and nothing comes back until the test
/// cuts every connection (as a node that died after it wrote, or a broken network).
struct AnswerDropper {
    address: String,
    dropping: Arc<std::sync::atomic::AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
}

impl AnswerDropper {
    async fn start(upstream: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        let dropping = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (cut, cuts) = tokio::sync::watch::channel(0);
        let dropping_answers = Arc::clone(&dropping);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let node = tokio::net::TcpStream::connect(&upstream)
                    .await
                    .expect("connect to the node");
                let (dropping, mut cuts) = (Arc::clone(&dropping_answers), cuts.clone());
                cuts.mark_unchanged();
                tokio::spawn(async move {
                    tokio::select! {
                        () = relay(client, node, dropping) => {}
                        _ = cuts.changed() => {}
                    }
                });
            }
        });
        Self {
            address,
            dropping,
            cut,
        }
    }

    /// From now on the node's answers are lost.
    fn drop_answers(&self) {
        self.dropping
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Closes every connection; the next ones carry answers again.
    fn cut(&self) {
        self.dropping
            .store(false, std::sync::atomic::Ordering::SeqCst);
        self.cut.send_modify(|cuts| *cuts += 1);
    }
}

/// Copies bytes both ways until either side closes; the node's are dropped while
/// `dropping` is set.
async fn relay(
    client: tokio::net::TcpStream,
    node: tokio::net::TcpStream,
    dropping: Arc<std::sync::atomic::AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut client_reads, mut client_writes) = client.into_split();
    let (mut node_reads, mut node_writes) = node.into_split();
    let requests = tokio::io::copy(&mut client_reads, &mut node_writes);
    let answers = async {
        let mut buffer = vec![0; 64 << 10];
        loop {
            let read = node_reads.read(&mut buffer).await?;
            if read == 0 {
                return Ok::<_, std::io::Error>(());
            }
            if !dropping.load(std::sync::atomic::Ordering::SeqCst) {
                client_writes.write_all(&buffer[..read]).await?;
            }
        }
    };
    let _ = tokio::join!(requests, answers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_answer_was_lost_is_sent_again_and_written_once() {
    let node = TestNode::start().await;
    let created = events_table("lost_answers", 2, TableOptions::default());
    let table = Arc::new(
        node.client
            .create_table(&created, false)
            .await
            .expect("create"),
    );
    let proxy = AnswerDropper::start(node.addr()).await;
    let client = mink_client::MinkClient::connect(&proxy.address)
        .await
        .expect("connect through the proxy");
    let mut writer = TableWriter::new(&client, Arc::clone(&table), WriteKind::Write, 10_000);
    let first: Vec<i64> = (0..100).collect();
    writer.write(&events(&table, &first)).await.expect("write");
    while writer.acknowledged_rows() < 100 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }

    // The next write lands, and its answer is lost: the writer sends it again.
    proxy.drop_answers();
    let second: Vec<i64> = (100..300).collect();
    writer.write(&events(&table, &second)).await.expect("write");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while rows_in(&node, &table).await.len() < 300 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the write never landed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(writer.acknowledged_rows(), 100, "its answer was lost");
    proxy.cut();
    assert_eq!(writer.finish().await.expect("finish"), 300);
    let mut written = rows_in(&node, &table).await;
    written.sort_unstable();
    assert_eq!(written, (0..300).collect::<Vec<i64>>(), "each row once");
}

/// Every id the table's buckets hold, bucket after bucket.
async fn rows_in(node: &TestNode, table: &mink_core::table::TableDescriptor) -> Vec<i64> {
    let mut ids = Vec::new();
    for bucket in 0..table.bucket_num {
        let bucket = BucketId::new(&table.path, bucket);
        let answer = node.client.scan(&bucket, 0, 0, &[]).await.expect("scan");
        let batches: Vec<_> = answer.batches.into_iter().map(|read| read.batch).collect();
        ids.extend(first_column_ids(&batches));
    }
    ids
}
