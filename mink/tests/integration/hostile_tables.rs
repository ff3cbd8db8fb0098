//! Hostile clients on the node port (issue 47): the bytes a DoPut stream holds in flight,
//! and what a table's definition may hold, against the real `mink server` binary.
//!
//! - Four DoPut streams of 40 batches of 8 MiB to one bucket, whose client reads no
//!   acknowledgement for 2 s, keep the server within its memory pool (each stream holds
//!   at most `PUT_PIPELINE_BYTES` of batches, reserved in the pool) plus headroom; every
//!   batch is acknowledged and in the log. (With 64 MiB of messages in flight per stream
//!   instead of 16, the same case grew the server by 687 MiB instead of about 160.)
//! - A batch the pool cannot take while nothing of its stream is in flight is refused with
//!   `RESOURCE_EXHAUSTED` after the acknowledgements of the batches before it, which are
//!   in the log; nothing after it is.
//! - `create_table` over the node port takes only the options SQL's `WITH` takes: an
//!   Iceberg property outside the allow-list (`mink.table-id`) and a `lake.freshness` of
//!   0 are refused, as SQL refuses a freshness under a second. A table has at most
//!   `MAX_COLUMNS` columns, and its descriptor (every schema version, each a full copy of
//!   the columns) at most `MAX_DESCRIPTOR_BYTES`: the ADD COLUMN past it is refused and
//!   the table is left as it was.
//! - The buckets of the whole node are bounded by its open-file limit (each bucket keeps
//!   files open): under `ulimit -n 1300` and 8 connections a port, a server holds at
//!   most (1300 - `RESERVED_FILES` - `KV_CACHED_FILES` - 16) / `FILES_PER_BUCKET` = 64
//!   buckets. A table or a
//!   partition past them is refused naming `ulimit -n`, the server answers on and stays
//!   under its limit, a dropped table's buckets are taken again; restarted under a lower
//!   limit, with more buckets than its bound, it starts with every table and row.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow_flight::FlightDescriptor;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use futures::{StreamExt, stream};
use mink_client::MinkClient;
use mink_core::options::TableOptions;
use mink_core::protocol::{BucketId, WriteHeader, list_offsets};
use mink_core::table::{TableDescriptor, TablePath};
use mink_node::flight::limits::{
    FILES_PER_BUCKET, KV_CACHED_FILES, MAX_COLUMNS, MAX_DESCRIPTOR_BYTES, PUT_PIPELINE_BYTES,
    RESERVED_FILES,
};
use prost::Message;
use tonic::Code;

use crate::hostile_node::raw_client;
use crate::process::{ServerProcess, run_sql};
use crate::support::{events_table, lake_options};

/// Rows of one DoPut batch, each with a name of [`ROW_BYTES`].
const BATCH_ROWS: usize = 8;
const ROW_BYTES: usize = 1 << 20;
/// What the server may grow by beyond its pool: per stream, tonic's buffer of the next
/// message and a batch read and waiting for room (16 MiB); the log's cache of recent
/// batches (32 MiB); the allocator's own.
const HEADROOM_MIB: u64 = 128;

/// A batch of `events_table` rows `first..first + rows`, each name `row_bytes` long.
fn wide_events(table: &TableDescriptor, first: i64, rows: usize, row_bytes: usize) -> RecordBatch {
    let ids: Vec<i64> = (first..).take(rows).collect();
    let name = "x".repeat(row_bytes);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids)),
        Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
            name, rows,
        ))),
    ];
    RecordBatch::try_new(Arc::clone(table.schema()), columns).expect("batch")
}

/// Sends `batches` to bucket 0 of `table` in one DoPut stream, reading no
/// acknowledgement until `read_after` has passed: the acks then, and the failure that
/// ended the stream, if one did.
async fn put_without_reading(
    addr: &str,
    table: &TableDescriptor,
    batches: Vec<RecordBatch>,
    read_after: Duration,
) -> (usize, Option<(Code, String)>) {
    let header = WriteHeader {
        bucket: Some(BucketId::new(&table.path, 0)),
        delete: false,
        writer: None,
    };
    // Each batch one message, as large as it is (the encoder would cut it in 2 MiB ones).
    let data = FlightDataEncoderBuilder::new()
        .with_max_flight_data_size(usize::MAX)
        .with_flight_descriptor(Some(FlightDescriptor::new_cmd(header.encode_to_vec())))
        .build(stream::iter(batches.into_iter().map(Ok)));
    let mut raw = raw_client(addr).await;
    let mut acks = raw.do_put(data).await.expect("do_put");
    tokio::time::sleep(read_after).await;
    let mut acknowledged = 0;
    while let Some(answer) = acks.next().await {
        match answer {
            Ok(_) => acknowledged += 1,
            Err(FlightError::Tonic(status)) => {
                return (acknowledged, Some((status.code(), status.message().into())));
            }
            Err(other) => return (acknowledged, Some((Code::Unknown, other.to_string()))),
        }
    }
    (acknowledged, None)
}

/// The rows in bucket 0 of `table`: its high watermark.
async fn rows_of(client: &MinkClient, table: &TableDescriptor) -> i64 {
    let bucket = BucketId::new(&table.path, 0);
    client
        .list_offsets(&bucket, list_offsets::Spec::Latest(true))
        .await
        .expect("list_offsets")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn do_put_streams_nobody_acknowledges_stay_within_the_memory_pool() {
    const STREAMS: usize = 4;
    const BATCHES: usize = 40;
    // The pool holds every stream's budget: no stream is refused, each waits for its acks.
    let pool_mib = ((STREAMS * PUT_PIPELINE_BYTES) >> 20) as u64 + 32;
    let dir = tempfile::tempdir().expect("temp dir");
    let limit = format!("{pool_mib}MiB");
    let args = ["--sql-memory-limit", &limit];
    let server = ServerProcess::start_with(dir.path(), &args, &[("MIMALLOC_PURGE_DELAY", "0")]);
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    let table = events_table("put", 1, TableOptions::default());
    let table = client.create_table(&table, false).await.expect("create");
    let batch = wide_events(&table, 0, BATCH_ROWS, ROW_BYTES);
    let server = Arc::new(server);
    let idle = server.rss_kib();
    let peak = Arc::new(AtomicU64::new(idle));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done, server) = (Arc::clone(&peak), Arc::clone(&done), Arc::clone(&server));
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(server.rss_kib(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let streams = (0..STREAMS).map(|_| {
        let batches = vec![batch.clone(); BATCHES];
        put_without_reading(&server.addr, &table, batches, Duration::from_secs(2))
    });
    let outcomes = futures::future::join_all(streams).await;
    done.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");
    let grown_mib = peak.load(Ordering::Relaxed).saturating_sub(idle) >> 10;
    println!("{STREAMS} DoPut streams of {BATCHES} x 8 MiB: the server grew by {grown_mib} MiB");
    for (acknowledged, failure) in outcomes {
        assert_eq!((acknowledged, failure), (BATCHES, None));
    }
    let rows = STREAMS * BATCHES * BATCH_ROWS;
    assert_eq!(
        rows_of(&client, &table).await,
        rows as i64,
        "every acked row"
    );
    assert!(
        grown_mib < pool_mib + HEADROOM_MIB,
        "the server grew by {grown_mib} MiB with a pool of {pool_mib} MiB"
    );
    assert_eq!(client.list_tables(None).await.expect("alive").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_do_put_batch_the_pool_cannot_take_is_refused_after_the_acks_before_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start_with(dir.path(), &["--sql-memory-limit", "16MiB"], &[]);
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    let table = events_table("too_big", 1, TableOptions::default());
    let table = client.create_table(&table, false).await.expect("create");
    let mut batches: Vec<RecordBatch> = (0..3)
        .map(|b| wide_events(&table, b * 4, 4, 1 << 10))
        .collect();
    batches.push(wide_events(&table, 100, 24, ROW_BYTES));
    batches.push(wide_events(&table, 200, 4, 1 << 10));
    let (acknowledged, failure) =
        put_without_reading(&server.addr, &table, batches, Duration::ZERO).await;
    let (code, message) = failure.expect("the 24 MiB batch is refused");
    assert_eq!(code, Code::ResourceExhausted, "{message}");
    assert!(message.contains("DoPut batch of"), "{message}");
    assert_eq!(acknowledged, 3, "the batches before it are acknowledged");
    assert_eq!(
        rows_of(&client, &table).await,
        12,
        "and only they are written"
    );
    // The pool is whole again: a batch that fits is written.
    let small = vec![wide_events(&table, 300, 4, 1 << 10)];
    let (acknowledged, failure) =
        put_without_reading(&server.addr, &table, small, Duration::ZERO).await;
    assert_eq!((acknowledged, failure), (1, None));
    assert_eq!(rows_of(&client, &table).await, 16);
}

/// The refusal of a client call: its code and message.
fn refusal<T: std::fmt::Debug>(result: mink_client::Result<T>) -> (Code, String) {
    let error = result.expect_err("the call should be refused");
    (error.code().unwrap_or(Code::Unknown), error.to_string())
}

fn assert_invalid<T: std::fmt::Debug>(result: mink_client::Result<T>, needle: &str) {
    let (code, message) = refusal(result);
    assert_eq!(code, Code::InvalidArgument, "{message}");
    assert!(
        message.contains(needle),
        "'{message}' should name '{needle}'"
    );
}

/// A log table of `columns` nullable BIGINT columns named `name_prefix` and a number.
fn table_of(name: &str, columns: usize, name_prefix: &str) -> TableDescriptor {
    let column = |i| Field::new(format!("{name_prefix}{i}"), DataType::Int64, true);
    let schema = Schema::new((0..columns).map(column).collect::<Vec<_>>());
    let (path, options) = (TablePath::new("test", name), TableOptions::default());
    TableDescriptor::new(path, schema, vec![], vec![], options).expect("valid table")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_table_and_add_column_take_only_what_sql_takes_and_are_bounded() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start(dir.path());
    let client = MinkClient::connect(&server.addr).await.expect("connect");

    let mut forged = events_table("forged", 1, lake_options());
    forged
        .lake_properties
        .insert("mink.table-id".into(), "7".into());
    assert_invalid(
        client.create_table(&forged, false).await,
        "unknown table option 'mink.table-id'",
    );
    let mut instant = events_table("instant", 1, lake_options());
    instant.lake_freshness = Duration::ZERO;
    assert_invalid(client.create_table(&instant, false).await, "lake.freshness");
    let (ok, _, stderr) = run_sql(
        &server.sql_addr,
        "CREATE TABLE test.fast (id BIGINT) WITH ('lake.enabled' = 'true', 'lake.freshness' = '10ms')",
    );
    assert!(!ok && stderr.contains("at least 1s"), "{stderr}");

    let too_wide = table_of("too_wide", MAX_COLUMNS + 1, "c");
    assert_invalid(client.create_table(&too_wide, false).await, "MAX_COLUMNS");
    let widest = client
        .create_table(&table_of("widest", MAX_COLUMNS, "c"), false)
        .await
        .expect("a table of MAX_COLUMNS columns");
    let one_more = Field::new("extra", DataType::Int64, true);
    assert_invalid(
        client.add_column(&widest.path, one_more).await,
        "MAX_COLUMNS",
    );

    // Every ADD COLUMN stores a full copy of the columns: with names of 5 000 bytes, 4 000
    // columns take about 20 MB a version, so the fourth version is over the bound.
    let long = "n".repeat(5000);
    let table = client
        .create_table(&table_of("long_names", 4000, &long), false)
        .await
        .expect("create");
    for i in 0..2 {
        let field = Field::new(format!("added{i}"), DataType::Int64, true);
        client.add_column(&table.path, field).await.expect("add");
    }
    let field = Field::new("added2", DataType::Int64, true);
    assert_invalid(
        client.add_column(&table.path, field).await,
        "MAX_DESCRIPTOR_BYTES",
    );
    let described = client.describe_table(&table.path).await.expect("describe");
    assert_eq!(
        described.schemas.len(),
        3,
        "the refused version is not stored"
    );
    let stored = mink_core::protocol::TableDescriptorProto::from(&described).encoded_len();
    assert!(stored <= MAX_DESCRIPTOR_BYTES, "{stored} bytes");
    assert_eq!(client.list_tables(None).await.expect("list").len(), 2);
}

/// A `mink server` whose process may open at most `files` files (`ulimit -n`, soft and
/// hard), with 8 connections a port; killed when dropped.
struct FileLimitedServer {
    child: Child,
    addr: String,
}

impl FileLimitedServer {
    const MAX_CONNECTIONS: u64 = 8;

    fn start(data_dir: &Path, files: u64) -> Self {
        let script = format!("ulimit -n {files} && exec \"$0\" \"$@\"");
        let connections = Self::MAX_CONNECTIONS.to_string();
        let mut child = Command::new("sh")
            .args(["-c", &script, env!("CARGO_BIN_EXE_mink"), "server"])
            .args(["--listen", "127.0.0.1:0", "--sql-listen", "127.0.0.1:0"])
            .args(["--max-connections", &connections, "--data-dir"])
            .arg(data_dir)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start mink server");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read a line");
        let addr = (line.trim().strip_prefix("mink node listening on "))
            .unwrap_or_else(|| panic!("the server did not start: {line:?}"))
            .to_string();
        std::thread::spawn(move || for _ in stdout.lines() {});
        Self { child, addr }
    }

    /// The buckets it may hold: what its file limit leaves beside two ports' connections.
    fn max_buckets(files: u64) -> u64 {
        let connections = 2 * Self::MAX_CONNECTIONS;
        (files - RESERVED_FILES - KV_CACHED_FILES - connections) / FILES_PER_BUCKET
    }

    /// The files it has open.
    fn open_files(&self) -> usize {
        let fds = format!("/proc/{}/fd", self.child.id());
        std::fs::read_dir(fds).expect("list fds").count()
    }
}

impl Drop for FileLimitedServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A log table partitioned by `day`, of 8 buckets.
fn daily_table(name: &str) -> TableDescriptor {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("day", DataType::Utf8, false),
    ]);
    let options = TableOptions {
        bucket_num: 8,
        bucket_key: Some(vec!["id".into()]),
        ..TableOptions::default()
    };
    let path = TablePath::new("test", name);
    TableDescriptor::new(path, schema, vec![], vec!["day".into()], options).expect("valid table")
}

/// 16 rows of `day`.
fn rows_of_day(table: &TableDescriptor, day: &str) -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(0..16)),
        Arc::new(StringArray::from_iter_values(std::iter::repeat_n(day, 16))),
    ];
    RecordBatch::try_new(Arc::clone(table.schema()), columns).expect("batch")
}

/// Writes the 16 rows of `day`; the buckets they went to.
async fn write_day(client: &MinkClient, table: &TableDescriptor, day: &str) -> Vec<BucketId> {
    let acks = client.write(table, &rows_of_day(table, day)).await;
    acks.expect("write").into_iter().map(|(id, _)| id).collect()
}

/// The rows in `buckets`, summed.
async fn rows_in(client: &MinkClient, buckets: &[BucketId]) -> i64 {
    let mut rows = 0;
    for id in buckets {
        let latest = list_offsets::Spec::Latest(true);
        rows += client.list_offsets(id, latest).await.expect("offsets");
    }
    rows
}

fn assert_over_open_buckets<T: std::fmt::Debug>(result: mink_client::Result<T>) {
    assert_invalid(result, "raise the limit (ulimit -n)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_holds_the_buckets_its_file_limit_allows_and_restarts_over_them() {
    const FILES: u64 = 1300;
    assert_eq!(FileLimitedServer::max_buckets(FILES), 64);
    let dir = tempfile::tempdir().expect("temp dir");
    let server = FileLimitedServer::start(dir.path(), FILES);
    let client = MinkClient::connect(&server.addr).await.expect("connect");

    // Seven tables of 8 buckets and one partition of 8: the 64 the bound allows.
    for i in 0..7 {
        let table = events_table(&format!("t{i}"), 8, TableOptions::default());
        client.create_table(&table, false).await.expect("create");
    }
    let daily = client
        .create_table(&daily_table("daily"), false)
        .await
        .expect("a partitioned table opens no bucket");
    let monday = write_day(&client, &daily, "mon").await;
    assert_over_open_buckets(client.write(&daily, &rows_of_day(&daily, "tue")).await);
    let one_more = events_table("one_more", 1, TableOptions::default());
    assert_over_open_buckets(client.create_table(&one_more, false).await);

    // The server answers, within its limit; a dropped table's buckets are taken again.
    let open = server.open_files();
    let connections = 2 * FileLimitedServer::MAX_CONNECTIONS;
    assert!(
        open as u64 + connections < FILES - KV_CACHED_FILES,
        "{open} files open under a limit of {FILES}"
    );
    assert_eq!(client.list_tables(None).await.expect("list").len(), 8);
    client
        .drop_table(&TablePath::new("test", "t6"), false)
        .await
        .expect("drop");
    let tuesday = write_day(&client, &daily, "tue").await;
    drop(server);

    // Under a lower limit the node holds more buckets than its bound of 54: it starts
    // with them all and opens no more.
    let server = FileLimitedServer::start(dir.path(), FILES - 20);
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    assert_eq!(client.list_tables(None).await.expect("list").len(), 7);
    assert_eq!(rows_in(&client, &monday).await, 16);
    assert_eq!(rows_in(&client, &tuesday).await, 16);
    assert_over_open_buckets(client.create_table(&one_more, false).await);
    assert_over_open_buckets(client.write(&daily, &rows_of_day(&daily, "wed")).await);
}
