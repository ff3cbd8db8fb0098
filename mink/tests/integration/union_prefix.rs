//! A union read is a prefix of the writes while tiering moves the seam under it (issue 14,
//! reads): a writer appends ids in order to a one-bucket log table, a loop runs `CALL
//! system.tier` over Flight SQL, and two readers count the table at once, through SQL and
//! through the node's Union ticket. Every read must be exactly the ids `0..n` for an `n`
//! at least what was acknowledged before it began: a lake snapshot paired with the seam of
//! another round would skip rows (or repeat them).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Int64Type;
use mink_client::MinkClient;
use mink_core::protocol::BucketId;
use mink_flight_sql::client::FlightSqlConnection;

use crate::process::ServerProcess;
use crate::support::{events, events_table, lake_options};

/// Appends of the writer, and rows per append.
const APPENDS: i64 = 80;
const ROWS: i64 = 25;

/// Checks that `batches` hold exactly the ids `0..n`, each once, with `n` at least
/// `acknowledged`; returns `n`.
fn check_prefix(reader: &str, batches: &[RecordBatch], acknowledged: i64) -> i64 {
    let mut ids: Vec<i64> = batches
        .iter()
        .flat_map(|batch| {
            batch
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect();
    ids.sort_unstable();
    let n = ids.len() as i64;
    let expected: Vec<i64> = (0..n).collect();
    assert!(
        ids == expected,
        "{reader}: {n} rows are not the ids 0..{n} (first gap or repeat at {:?})",
        ids.iter().zip(&expected).position(|(a, b)| a != b)
    );
    assert!(
        n >= acknowledged,
        "{reader}: {n} rows, {acknowledged} were acknowledged before the read"
    );
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_union_read_is_a_prefix_of_the_writes_while_tiering_runs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start(dir.path());
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    // Tiered only by the loop below.
    let options = lake_options();
    let table = client
        .create_table(&events_table("prefix", 1, options), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    let sql = FlightSqlConnection::connect(&server.sql_addr, None, None)
        .await
        .expect("connect to Flight SQL");
    let acknowledged = Arc::new(AtomicI64::new(0));
    let done = Arc::new(AtomicBool::new(false));

    let writer = {
        let (client, table, bucket) = (client.clone(), table.clone(), bucket.clone());
        let (acknowledged, done) = (Arc::clone(&acknowledged), Arc::clone(&done));
        tokio::spawn(async move {
            for append in 0..APPENDS {
                let ids: Vec<i64> = (append * ROWS..(append + 1) * ROWS).collect();
                let rows = events(&table, &ids);
                client.append(&bucket, vec![rows]).await.expect("append");
                acknowledged.store((append + 1) * ROWS, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let tierer = {
        let (sql, done) = (sql.clone(), Arc::clone(&done));
        tokio::spawn(async move {
            let mut rounds = 0;
            while !done.load(Ordering::SeqCst) {
                sql.query("CALL system.tier('test.prefix')")
                    .await
                    .expect("CALL system.tier");
                rounds += 1;
            }
            rounds
        })
    };
    let sql_reader = {
        let (sql, acknowledged, done) = (sql.clone(), Arc::clone(&acknowledged), Arc::clone(&done));
        tokio::spawn(async move {
            let mut reads = 0;
            while !done.load(Ordering::SeqCst) {
                let before = acknowledged.load(Ordering::SeqCst);
                let (_, batches) = sql
                    .query("SELECT id FROM test.prefix")
                    .await
                    .expect("select");
                check_prefix("SQL", &batches, before);
                reads += 1;
            }
            reads
        })
    };
    let union_reader = {
        let (client, bucket) = (client.clone(), bucket.clone());
        let (acknowledged, done) = (Arc::clone(&acknowledged), Arc::clone(&done));
        tokio::spawn(async move {
            let mut reads = 0;
            while !done.load(Ordering::SeqCst) {
                let before = acknowledged.load(Ordering::SeqCst);
                let answer = client.union(&bucket, &[0], &[]).await.expect("union");
                check_prefix("Union ticket", &answer.batches, before);
                reads += 1;
            }
            reads
        })
    };
    writer.await.expect("writer");
    let rounds = tierer.await.expect("tier loop");
    let sql_reads = sql_reader.await.expect("SQL reader");
    let union_reads = union_reader.await.expect("Union reader");
    eprintln!("{rounds} tiering rounds, {sql_reads} SQL reads, {union_reads} Union reads");
    assert!(rounds >= 2 && sql_reads >= 2 && union_reads >= 2);

    // Once the writes stop, both readers see all of them, the last round tiered.
    sql.query("CALL system.tier('test.prefix')")
        .await
        .expect("tier");
    let (_, batches) = sql
        .query("SELECT id FROM test.prefix")
        .await
        .expect("select");
    assert_eq!(
        check_prefix("SQL", &batches, APPENDS * ROWS),
        APPENDS * ROWS
    );
    let answer = client.union(&bucket, &[0], &[]).await.expect("union");
    assert_eq!(
        check_prefix("Union ticket", &answer.batches, APPENDS * ROWS),
        APPENDS * ROWS
    );
}
