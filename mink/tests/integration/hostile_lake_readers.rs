//! Lake upkeep under running readers (issue 47): expiry and orphan removal never delete
//! a file a running statement planned on, and the orphan grace protects in-flight commits.
//!
//! - Two slow readers hold a `SELECT *` open on a primary-key table whose lake keeps
//!   snapshots for one second: one over the server's Flight SQL endpoint (its lease is
//!   the server's own), one a SQL session of this process reading the warehouse itself,
//!   as `mink sql --connect` does (its lease is an object in the lake). Meanwhile an
//!   UPDATE, a tiering round, a compaction and an expiry run. Both readers finish with
//!   every row of the snapshot they planned on; once they are done and the node's hold of
//!   their plans has lapsed (`MINK_LAKE_LEASE_MS`), an expiry deletes the old files.
//! - `remove_orphan_files` with a grace under 24 hours is refused, over SQL and over the
//!   protocol; 24 hours is accepted.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::Int64Type;
use arrow_flight::error::FlightError;
use arrow_flight::sql::client::FlightSqlServiceClient;
use datafusion::execution::SendableRecordBatchStream;
use futures::{Stream, StreamExt};
use mink_client::MinkClient;
use mink_core::table::TablePath;
use mink_lake::storage::LakeStorage;
use mink_sql::session::MinkSession;
use object_store::local::LocalFileSystem;
use tonic::transport::Channel;

use crate::process::ServerProcess;
use crate::sql_ddl::column_u64;
use crate::sql_reads::{error, query};

/// Tiering rounds before the readers start: one data file each, more than the readers'
/// scan partitions take at once.
const ROUNDS: i64 = 40;
/// Rows each round adds.
const ROWS: i64 = 1000;
/// The lease period of the server under test (and so how long it holds a planned read).
const LEASE_MS: &str = "1500";

/// A SQL session of this process over the node at `address`, reading the lake's files
/// itself, with one target partition (its lake scan then reads four files at a time).
async fn session(address: &str) -> MinkSession {
    let client = MinkClient::connect(address).await.expect("connect");
    let storage = LakeStorage::new(Arc::new(LocalFileSystem::new()), "");
    let session = MinkSession::connect(client, storage)
        .await
        .expect("session");
    query(&session, "SET datafusion.execution.target_partitions = 1").await;
    session
}

/// The data files in the table's lake directory.
fn data_files(dir: &Path) -> Vec<PathBuf> {
    let data = dir.join("lake/warehouse/readers/t/data");
    walk(&data)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .collect()
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flat_map(|entry| {
            let path = entry.expect("entry").path();
            match path.is_dir() {
                true => walk(&path),
                false => vec![path],
            }
        })
        .collect()
}

/// What a reader saw: rows, the sum of their ids, and rows whose `v` is not the original.
#[derive(Debug, Default, PartialEq, Eq)]
struct Seen {
    rows: i64,
    id_sum: i64,
    updated: i64,
}

impl Seen {
    fn add(&mut self, batch: &RecordBatch) {
        let ids = batch.column(0).as_primitive::<Int64Type>();
        let values = batch.column(1).as_string::<i32>();
        self.rows += batch.num_rows() as i64;
        self.id_sum += ids.values().iter().sum::<i64>();
        self.updated += (0..values.len())
            .filter(|i| values.value(*i) != "original")
            .count() as i64;
    }

    /// Every row of the readers' snapshot: ids 1..=ROUNDS*ROWS, none updated.
    fn expected() -> Self {
        let n = ROUNDS * ROWS;
        Self {
            rows: n,
            id_sum: n * (n + 1) / 2,
            updated: 0,
        }
    }
}

/// Reads the first batch of `stream` (the read is planned and running), then waits.
async fn first<S, E>(stream: &mut S) -> Seen
where
    S: Stream<Item = Result<RecordBatch, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut seen = Seen::default();
    let batch = stream.next().await.expect("a first batch");
    seen.add(&batch.unwrap_or_else(|e| panic!("first batch: {e}")));
    seen
}

/// Reads the rest of `stream` into `seen`, slowly.
async fn rest<S, E>(stream: S, mut seen: Seen) -> Seen
where
    S: Stream<Item = Result<RecordBatch, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut stream = stream;
    while let Some(batch) = stream.next().await {
        seen.add(&batch.unwrap_or_else(|e| panic!("the slow reader failed: {e}")));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    seen
}

/// A `SELECT *` over the server's Flight SQL endpoint, its stream open.
async fn flight_sql_reader(
    server: &ServerProcess,
) -> impl Stream<Item = Result<RecordBatch, FlightError>> + Unpin {
    let channel = Channel::from_shared(format!("http://{}", server.sql_addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut client = FlightSqlServiceClient::new(channel);
    let info = client
        .execute("SELECT id, v FROM readers.t".to_string(), None)
        .await
        .expect("execute");
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    client.do_get(ticket).await.expect("do_get")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_readers_keep_their_files_through_update_tier_compact_and_expiry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start_with_env(dir.path(), &[("MINK_LAKE_LEASE_MS", LEASE_MS)]);
    let writer = session(&server.addr).await;
    query(
        &writer,
        "CREATE TABLE readers.t (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id)) \
         WITH ('bucket.num' = '1', 'lake.enabled' = 'true', 'lake.freshness' = '1h', \
         'history.expire.max-snapshot-age-ms' = '1000')",
    )
    .await;
    for round in 0..ROUNDS {
        query(
            &writer,
            &format!(
                "INSERT INTO readers.t SELECT value + {}, 'original' FROM generate_series(1, {ROWS})",
                round * ROWS
            ),
        )
        .await;
        query(&writer, "CALL system.tier('readers.t')").await;
    }
    let files_before = data_files(dir.path());
    assert_eq!(files_before.len(), ROUNDS as usize, "one file a round");

    // Both readers plan on the last round's snapshot and read one batch.
    let reader = session(&server.addr).await;
    let mut local: SendableRecordBatchStream = reader
        .sql("SELECT id, v FROM readers.t")
        .await
        .expect("plan")
        .execute_stream()
        .await
        .expect("execute");
    let local_seen = first(&mut local).await;
    let mut remote = flight_sql_reader(&server).await;
    let remote_seen = first(&mut remote).await;

    // Every file of that snapshot is replaced, and its snapshot is old enough to expire.
    query(
        &writer,
        "UPDATE readers.t SET v = 'updated' WHERE id % 2 = 0",
    )
    .await;
    query(&writer, "CALL system.tier('readers.t')").await;
    let compacted = query(&writer, "CALL system.compact('readers.t')").await;
    assert!(column_u64(&compacted, "files_removed") > 0);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let expired = query(&writer, "CALL system.expire_snapshots('readers.t')").await;
    assert!(column_u64(&expired, "expired_snapshots_count") > 0);
    let kept = files_before.iter().filter(|f| f.exists()).count();
    assert_eq!(
        kept,
        files_before.len(),
        "the readers' snapshot keeps its files"
    );

    let local_seen = rest(local, local_seen).await;
    let remote_seen = rest(remote, remote_seen).await;
    assert_eq!(local_seen, Seen::expected(), "the session of this process");
    assert_eq!(remote_seen, Seen::expected(), "the Flight SQL reader");
    drop(reader);

    // Done reading: once the node's hold of the plans lapses, the old files go.
    let mut left = files_before.len();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        query(&writer, "CALL system.expire_snapshots('readers.t')").await;
        left = files_before.iter().filter(|f| f.exists()).count();
        if left == 0 {
            break;
        }
    }
    assert_eq!(
        left, 0,
        "the old snapshot's files are deleted once nothing reads them"
    );
    let leases = walk(&dir.path().join("lake/warehouse/readers/t/leases"));
    assert!(leases.is_empty(), "every lease deleted: {leases:?}");
    let after = query(
        &writer,
        "SELECT count(*) AS n, sum(CASE WHEN v = 'updated' THEN 1 ELSE 0 END) AS u FROM readers.t",
    )
    .await;
    let n = after[0].column(0).as_primitive::<Int64Type>().value(0);
    let u = after[0].column(1).as_primitive::<Int64Type>().value(0);
    assert_eq!((n, u), (ROUNDS * ROWS, ROUNDS * ROWS / 2), "nothing lost");

    // An orphan grace under a day is refused, over SQL and over the protocol.
    let message = error(
        &writer,
        "CALL system.remove_orphan_files('readers.t', '1h')",
    )
    .await;
    assert!(message.contains("at least 24 hours"), "{message}");
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    let path = TablePath::new("readers", "t");
    let status = client
        .remove_orphan_files(&path, Some(Duration::ZERO))
        .await
        .expect_err("a grace of 0s");
    assert!(status.to_string().contains("at least 24 hours"), "{status}");
    let orphans = query(
        &writer,
        "CALL system.remove_orphan_files('readers.t', '24h')",
    )
    .await;
    let removed: usize = orphans.iter().map(RecordBatch::num_rows).sum();
    assert_eq!(removed, 0, "nothing a day old");
    server.kill();
}
