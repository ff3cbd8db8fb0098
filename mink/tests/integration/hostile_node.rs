//! Hostile clients on the node port (issue 14): each case is a raw Flight call with a
//! hand-built ticket, action or DoPut stream against the real `mink server` binary. After
//! each the process still answers a Flight call, and for the memory cases its resident
//! memory stayed less than 1 GiB above its idle figure.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::ipc::writer::{
    CompressionContext, DictionaryTracker, IpcDataGenerator, IpcWriteOptions, StreamWriter,
};
use arrow::ipc::{CompressionType, MetadataVersion, root_as_message};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, FlightClient, FlightDescriptor, Ticket};
use futures::{StreamExt, TryStreamExt, stream};
use mink_client::MinkClient;
use mink_core::filter::{ColumnFilter, FilterOp};
use mink_core::options::TableOptions;
use mink_core::protocol::{
    AppendAck, BucketId, IdempotentWriter, LakeRequest, LiveRangeRequest, Lookup, PrefixLookup,
    ReadTicket, ScanRequest, SnapshotRequest, TableUnionRequest, TailRequest, UnionRequest,
    WriteHeader, action, read_ticket,
};
use mink_core::table::{TableDescriptor, TablePath};
use mink_node::flight::limits::MAX_ANSWER_BYTES;
use prost::Message;
use tonic::Code;

use crate::process::ServerProcess;
use crate::support::{events, events_table, lake_options};

/// How far above its idle figure the server's resident memory may grow during a case.
const RSS_HEADROOM_KIB: u64 = 1 << 20;

/// A `mink server` over a data directory of its own.
struct Server {
    process: ServerProcess,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Self {
        Self::start_with(&[])
    }

    /// A server with extra arguments.
    fn start_with(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let process = ServerProcess::start_with(dir.path(), args, &[]);
        Self {
            addr: process.addr.clone(),
            process,
            _dir: dir,
        }
    }

    async fn client(&self) -> MinkClient {
        MinkClient::connect(&self.addr).await.expect("connect")
    }

    async fn raw(&self) -> FlightClient {
        raw_client(&self.addr).await
    }

    /// The process has not exited and still answers a Flight call.
    async fn assert_alive(&mut self) {
        assert!(self.process.is_running(), "the server process exited");
        let tables = self.client().await.list_tables(None).await;
        assert!(tables.is_ok(), "list_tables after the case: {tables:?}");
    }

    fn assert_rss_below(&self, idle_kib: u64) {
        let rss = self.process.rss_kib();
        assert!(
            rss < idle_kib + RSS_HEADROOM_KIB,
            "resident memory grew from {idle_kib} KiB to {rss} KiB"
        );
    }
}

/// A bare Flight client of the node at `addr`, taking and sending messages of any size.
pub(crate) async fn raw_client(addr: &str) -> FlightClient {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("url")
        .connect()
        .await
        .expect("raw connect");
    let inner = FlightServiceClient::new(channel)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    FlightClient::new_from_inner(inner)
}

/// `(id BIGINT NOT NULL, name STRING, PRIMARY KEY (id))`, one bucket.
fn keyed_table(name: &str) -> TableDescriptor {
    keyed_table_with(name, TableOptions::default())
}

/// [`keyed_table`] with `options` (its bucket key and count set).
fn keyed_table_with(name: &str, options: TableOptions) -> TableDescriptor {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]);
    let options = TableOptions {
        bucket_num: 1,
        bucket_key: Some(vec!["id".into()]),
        ..options
    };
    TableDescriptor::new(
        TablePath::new("test", name),
        schema,
        vec!["id".into()],
        vec![],
        options,
    )
    .expect("valid table")
}

fn ticket(read: read_ticket::Read) -> Ticket {
    Ticket::new(ReadTicket { read: Some(read) }.encode_to_vec())
}

/// The code and message of a failed Flight call.
fn status_of(error: FlightError) -> (Code, String) {
    match error {
        FlightError::Tonic(status) => (status.code(), status.message().to_string()),
        other => (Code::Unknown, other.to_string()),
    }
}

/// Runs a DoGet to its end: the rows and bytes of the batches, or the failure.
async fn do_get(raw: &mut FlightClient, ticket: Ticket) -> Result<(usize, usize), (Code, String)> {
    let stream = raw.do_get(ticket).await.map_err(status_of)?;
    let batches: Vec<RecordBatch> = stream.try_collect().await.map_err(status_of)?;
    Ok((
        batches.iter().map(RecordBatch::num_rows).sum(),
        batches.iter().map(RecordBatch::get_array_memory_size).sum(),
    ))
}

/// Runs an action: its first result or the failure.
async fn do_action(
    raw: &mut FlightClient,
    kind: &str,
    body: Vec<u8>,
) -> Result<(), (Code, String)> {
    let results = raw
        .do_action(Action::new(kind, body))
        .await
        .map_err(status_of)?;
    let _: Vec<_> = results.try_collect().await.map_err(status_of)?;
    Ok(())
}

fn assert_refused(result: Result<impl std::fmt::Debug, (Code, String)>, needle: &str) {
    let (code, message) = result.expect_err("the request should be refused");
    assert_eq!(code, Code::InvalidArgument, "{message}");
    assert!(
        message.contains(needle),
        "'{message}' should mention '{needle}'"
    );
}

/// An IPC stream of `batch`, LZ4-compressed, with every buffer's declared uncompressed
/// length forged to 2^50 bytes.
fn forged_lz4_stream(batch: &RecordBatch) -> Vec<u8> {
    let options = IpcWriteOptions::default()
        .try_with_compression(Some(CompressionType::LZ4_FRAME))
        .expect("lz4");
    let mut writer = StreamWriter::try_new_with_options(Vec::new(), batch.schema_ref(), options)
        .expect("writer");
    writer.write(batch).expect("write");
    let mut bytes = writer.into_inner().expect("finish");
    let mut at = 0;
    while at + 8 <= bytes.len() {
        let length = i32::from_le_bytes(bytes[at + 4..at + 8].try_into().expect("4 bytes"));
        if length <= 0 {
            break;
        }
        let header_end = at + 8 + length as usize;
        let message = root_as_message(&bytes[at + 8..header_end]).expect("message");
        let body = message.bodyLength() as usize;
        let buffers: Vec<(usize, usize)> = message
            .header_as_record_batch()
            .and_then(|b| b.buffers())
            .map(|buffers| {
                buffers
                    .iter()
                    .map(|b| (b.offset() as usize, b.length() as usize))
                    .collect()
            })
            .unwrap_or_default();
        for (offset, length) in buffers {
            if length >= 8 {
                let start = header_end + offset;
                bytes[start..start + 8].copy_from_slice(&(1i64 << 50).to_le_bytes());
            }
        }
        at = header_end + body;
    }
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_with_batch_rows_u32_max_is_clamped() {
    let mut server = Server::start();
    let client = server.client().await;
    let table = client
        .create_table(&keyed_table("snap"), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    let ids: Vec<i64> = (0..10).collect();
    client
        .append(&bucket, vec![events(&table, &ids)])
        .await
        .expect("upsert");

    let mut raw = server.raw().await;
    let read = read_ticket::Read::Snapshot(SnapshotRequest {
        bucket: Some(bucket.clone()),
        columns: vec![],
        batch_rows: u32::MAX,
    });
    let (rows, _) = do_get(&mut raw, ticket(read)).await.expect("snapshot");
    assert_eq!(rows, 10);
    server.assert_alive().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projection_repeating_one_column_is_refused() {
    let mut server = Server::start();
    let client = server.client().await;
    let table = client
        .create_table(&events_table("repeat", 1, TableOptions::default()), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    for chunk in (0..2000).collect::<Vec<i64>>().chunks(200) {
        client
            .append(&bucket, vec![events(&table, chunk)])
            .await
            .expect("append");
    }
    let idle = server.process.rss_kib();

    let mut raw = server.raw().await;
    let scan = |columns: Vec<u32>| {
        ticket(read_ticket::Read::Scan(ScanRequest {
            bucket: Some(bucket.clone()),
            offset: 0,
            max_bytes: 0,
            columns,
        }))
    };
    assert_refused(
        do_get(&mut raw, scan(vec![0; 200_000])).await,
        "more than once",
    );
    assert_refused(
        do_get(&mut raw, scan(vec![1, 0, 1])).await,
        "more than once",
    );
    assert_refused(do_get(&mut raw, scan(vec![u32::MAX])).await, "out of range");
    let tail = TailRequest {
        bucket: Some(bucket.clone()),
        offset: 0,
        columns: vec![0; 200_000],
        max_wait_ms: 0,
        min_bytes: 0,
        max_bytes: 0,
    };
    let message = arrow_flight::FlightData::new().with_app_metadata(tail.encode_to_vec());
    let answer = match raw.do_exchange(stream::iter([Ok(message)])).await {
        Ok(answer) => answer.try_collect::<Vec<_>>().await.map_err(status_of),
        Err(error) => Err(status_of(error)),
    };
    assert_refused(answer, "more than once");
    // A unique, in-range projection still reads.
    let (rows, _) = do_get(&mut raw, scan(vec![1, 0])).await.expect("scan");
    assert_eq!(rows, 2000);
    server.assert_rss_below(idle);
    server.assert_alive().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_range_tickets_with_hostile_ranges_and_projections_are_refused() {
    let mut server = Server::start();
    let client = server.client().await;
    let table = client
        .create_table(&keyed_table("live"), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    let ids: Vec<i64> = (0..100).collect();
    client
        .append(&bucket, vec![events(&table, &ids)])
        .await
        .expect("upsert");
    let mut raw = server.raw().await;
    let live = |from: i64, to: i64, columns: Vec<u32>| {
        ticket(read_ticket::Read::LiveRange(LiveRangeRequest {
            bucket: Some(bucket.clone()),
            from,
            to,
            columns,
        }))
    };
    assert_refused(
        do_get(&mut raw, live(i64::MIN, i64::MAX, vec![])).await,
        "at most",
    );
    assert_refused(
        do_get(&mut raw, live(i64::MAX, i64::MIN, vec![])).await,
        "at most",
    );
    assert_refused(
        do_get(&mut raw, live(0, 100, vec![0; 200_000])).await,
        "more than once",
    );
    assert_refused(
        do_get(&mut raw, live(0, 100, vec![u32::MAX])).await,
        "out of range",
    );
    let (code, message) = do_get(&mut raw, live(0, 1 << 20, vec![]))
        .await
        .expect_err("a range past the high watermark");
    assert_eq!(code, Code::OutOfRange, "{message}");
    let unknown = ReadTicket {
        read: Some(read_ticket::Read::LiveRange(LiveRangeRequest {
            bucket: None,
            from: 0,
            to: 0,
            columns: vec![],
        })),
    };
    let refused = do_get(&mut raw, Ticket::new(unknown.encode_to_vec())).await;
    assert_eq!(refused.expect_err("no bucket").0, Code::InvalidArgument);
    // The node still answers, and a good range reads its 100 live rows.
    let (rows, _) = do_get(&mut raw, live(0, 100, vec![1]))
        .await
        .expect("live tail");
    assert_eq!(rows, 100);
    server.assert_alive().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_ipc_from_a_client_is_refused_before_it_is_decoded() {
    let mut server = Server::start();
    let client = server.client().await;
    let table = client
        .create_table(&keyed_table("lz4"), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    client
        .append(&bucket, vec![events(&table, &[1, 2, 3])])
        .await
        .expect("upsert");
    let idle = server.process.rss_kib();
    let mut raw = server.raw().await;

    // lookup: the key batch, compressed, with a forged uncompressed length.
    let keys = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)])),
        vec![Arc::new(Int64Array::from(vec![1, 2, 3])) as ArrayRef],
    )
    .expect("keys");
    let lookup = Lookup {
        bucket: Some(bucket.clone()),
        keys: forged_lz4_stream(&keys),
        columns: vec![],
    };
    assert_refused(
        do_action(&mut raw, action::LOOKUP, lookup.encode_to_vec()).await,
        "compressed Arrow IPC",
    );
    server.assert_alive().await;

    // prefix_lookup, the same.
    let prefix = PrefixLookup {
        bucket: Some(bucket.clone()),
        prefixes: forged_lz4_stream(&keys),
        columns: vec![],
    };
    assert_refused(
        do_action(&mut raw, action::PREFIX_LOOKUP, prefix.encode_to_vec()).await,
        "compressed Arrow IPC",
    );
    server.assert_alive().await;

    // DoPut: a compressed batch is refused and nothing of it is written.
    let descriptor = FlightDescriptor::new_cmd(
        WriteHeader {
            bucket: Some(bucket.clone()),
            delete: false,
            writer: None,
        }
        .encode_to_vec(),
    );
    let options = IpcWriteOptions::default()
        .try_with_compression(Some(CompressionType::LZ4_FRAME))
        .expect("lz4");
    let data = FlightDataEncoderBuilder::new()
        .with_options(options)
        .with_flight_descriptor(Some(descriptor))
        .build(stream::iter([Ok(events(&table, &[7, 8, 9]))]));
    let answer = match raw.do_put(data).await {
        Ok(acks) => acks.try_collect::<Vec<_>>().await.map_err(status_of),
        Err(error) => Err(status_of(error)),
    };
    assert_refused(answer, "compressed Arrow IPC");
    let snapshot = client.snapshot(&bucket, &[], 0).await.expect("snapshot");
    let rows: usize = snapshot.batches.iter().map(RecordBatch::num_rows).sum();
    assert_eq!(rows, 3, "the compressed batch was written");

    // Uncompressed keys still look up.
    let lookup = Lookup {
        bucket: Some(bucket.clone()),
        keys: mink_core::protocol::encode_batch(&keys).expect("encode"),
        columns: vec![],
    };
    do_action(&mut raw, action::LOOKUP, lookup.encode_to_vec())
        .await
        .expect("lookup");
    server.assert_rss_below(idle);
    server.assert_alive().await;
}

/// A batch of `rows` events whose names are `width` bytes each.
fn wide_events(table: &TableDescriptor, first: i64, rows: usize, width: usize) -> RecordBatch {
    let ids: Vec<i64> = (first..first + rows as i64).collect();
    let name = "x".repeat(width);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids)),
        Arc::new(StringArray::from_iter_values(
            (0..rows).map(|_| name.as_str()),
        )),
    ];
    RecordBatch::try_new(Arc::clone(table.schema()), columns).expect("batch")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_and_tail_with_max_bytes_u64_max_answer_a_bounded_part() {
    let mut server = Server::start();
    let client = server.client().await;
    let table = client
        .create_table(&events_table("wide", 1, TableOptions::default()), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    // 96 batches of 1 MiB: far more than one answer may hold.
    const BATCHES: usize = 96;
    const ROWS: usize = 1024;
    for i in 0..BATCHES {
        client
            .append(
                &bucket,
                vec![wide_events(&table, (i * ROWS) as i64, ROWS, 1024)],
            )
            .await
            .expect("append");
    }
    let idle = server.process.rss_kib();
    let total_rows = BATCHES * ROWS;
    // The node answers at most MAX_ANSWER_BYTES of log, plus the first batch (each
    // batch here is a little over 1 MiB).
    let bound_rows = ((MAX_ANSWER_BYTES >> 20) as usize + 1) * ROWS;

    let mut raw = server.raw().await;
    let scan = ticket(read_ticket::Read::Scan(ScanRequest {
        bucket: Some(bucket.clone()),
        offset: 0,
        max_bytes: u64::MAX,
        columns: vec![],
    }));
    let (rows, _) = do_get(&mut raw, scan).await.expect("scan");
    assert!(
        rows > 0 && rows <= bound_rows && rows < total_rows,
        "scan answered {rows} rows"
    );
    server.assert_rss_below(idle);
    server.assert_alive().await;

    // Tail: max_bytes and min_bytes u64::MAX, a wait of u64::MAX ms. The data is there, so
    // the clamped min_bytes is met at once and the answer is bounded like Scan's.
    let tail = TailRequest {
        bucket: Some(bucket.clone()),
        offset: 0,
        columns: vec![],
        max_wait_ms: u64::MAX,
        min_bytes: u64::MAX,
        max_bytes: u64::MAX,
    };
    let message = arrow_flight::FlightData::new().with_app_metadata(tail.encode_to_vec());
    let answer = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        let answer = raw
            .do_exchange(stream::iter([Ok(message)]))
            .await
            .expect("exchange");
        answer.try_collect::<Vec<RecordBatch>>().await
    })
    .await
    .expect("the tail answered without waiting for u64::MAX bytes")
    .expect("tail");
    let rows: usize = answer.iter().map(RecordBatch::num_rows).sum();
    assert!(
        rows > 0 && rows <= bound_rows && rows < total_rows,
        "tail answered {rows} rows"
    );
    server.assert_rss_below(idle);
    server.assert_alive().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_after_a_failed_batch_of_a_do_put_is_written() {
    let mut server = Server::start();
    let client = server.client().await;
    let table = client
        .create_table(&events_table("put", 2, TableOptions::default()), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);

    // 64 batches in one stream to bucket 0; the 11th holds a row of bucket 1.
    const BAD: usize = 10;
    let candidates: Vec<i64> = (0..1000).collect();
    let column: ArrayRef = Arc::new(Int64Array::from(candidates.clone()));
    let buckets = mink_core::bucket::bucket_of_rows(&[column], 2).expect("buckets");
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for (id, b) in candidates.into_iter().zip(buckets) {
        if b == 0 {
            ours.push(id)
        } else {
            theirs.push(id)
        }
    }
    let batches: Vec<RecordBatch> = (0..64)
        .map(|i| {
            if i == BAD {
                events(&table, &[theirs[0]])
            } else {
                events(&table, &ours[i * 2..i * 2 + 2])
            }
        })
        .collect();
    let descriptor = FlightDescriptor::new_cmd(
        WriteHeader {
            bucket: Some(bucket.clone()),
            delete: false,
            writer: None,
        }
        .encode_to_vec(),
    );
    let data = FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(descriptor))
        .build(stream::iter(batches.into_iter().map(Ok)));
    let mut raw = server.raw().await;
    let mut acks = raw.do_put(data).await.expect("do_put");
    let mut acknowledged = 0;
    let failure = loop {
        match acks.next().await {
            Some(Ok(_)) => acknowledged += 1,
            Some(Err(error)) => break Some(status_of(error)),
            None => break None,
        }
    };
    drop(acks);
    let (code, message) = failure.expect("the bad batch fails the stream");
    assert_eq!(code, Code::InvalidArgument, "{message}");
    assert!(message.contains("belongs to bucket"), "{message}");
    assert_eq!(
        acknowledged, BAD,
        "every batch before the bad one is acknowledged"
    );

    // Give any write still in flight time to land, then count what the log holds.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let answer = client.scan(&bucket, 0, 0, &[]).await.expect("scan");
    assert_eq!(
        answer.num_rows(),
        BAD * 2,
        "only the acknowledged batches are in the log"
    );
    server.assert_alive().await;
}

/// `mink sql --connect` to the server's Flight SQL port: `(success, stdout, stderr)`.
fn sql(server: &Server, statement: &str) -> (bool, String, String) {
    crate::process::run_sql(&server.process.sql_addr, statement)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_union_tail_over_the_memory_pool_fails_alone_and_kv_answers_stream() {
    let mut server = Server::start_with(&["--sql-memory-limit", "4MiB"]);
    let client = server.client().await;
    // Tiered only when the test says: a round would shrink the tail.
    let lake = lake_options();
    let create = |name: &str, options: &TableOptions| {
        let table = keyed_table_with(name, options.clone());
        let client = client.clone();
        async move { client.create_table(&table, false).await.expect("create") }
    };
    let tiered = create("tail", &lake).await;
    let untiered = create("untiered", &lake).await;
    let kv_only = create("kv", &TableOptions::default()).await;
    // One round below the tail, so its union reads must fold it.
    let first = wide_events(&tiered, -1, 1, 8);
    let tiered_bucket = BucketId::new(&tiered.path, 0);
    client
        .append(&tiered_bucket, vec![first])
        .await
        .expect("upsert");
    client.tier(&tiered.path).await.expect("tier");
    // 16 MiB of upserts in each: four times the pool.
    const BATCHES: usize = 16;
    const ROWS: usize = 1024;
    for table in [&tiered, &untiered, &kv_only] {
        let bucket = BucketId::new(&table.path, 0);
        for i in 0..BATCHES {
            let rows = wide_events(table, (i * ROWS) as i64, ROWS, 1024);
            client.append(&bucket, vec![rows]).await.expect("upsert");
        }
    }
    let idle = server.process.rss_kib();

    // The node's Union ticket folds the tail in the shared pool: refused past it.
    let mut raw = server.raw().await;
    let union = |table: &TableDescriptor| {
        ticket(read_ticket::Read::Union(UnionRequest {
            bucket: Some(BucketId::new(&table.path, 0)),
            columns: vec![],
            filters: vec![],
        }))
    };
    let (code, message) = do_get(&mut raw, union(&tiered))
        .await
        .expect_err("over the pool");
    assert_eq!(code, Code::ResourceExhausted, "{message}");
    assert!(message.contains("not enough memory"), "{message}");
    server.assert_alive().await;
    // So does the engine's union read of the same table (of its names: a count would
    // read the keys alone), and it fails alone.
    let (ok, _, stderr) = sql(&server, "SELECT max(name) FROM test.tail");
    assert!(!ok);
    assert!(stderr.contains("Resources exhausted"), "{stderr}");

    // Nothing tiered yet: the KV store answers the union, streamed, on both ports; and so
    // it does a table without a lake.
    let (rows, _) = do_get(&mut raw, union(&untiered))
        .await
        .expect("union from KV");
    assert_eq!(rows, BATCHES * ROWS);
    for table in ["untiered", "kv"] {
        let statement = format!("SELECT count(name) AS n FROM test.{table}");
        let (ok, stdout, stderr) = sql(&server, &statement);
        assert!(ok, "{stderr}");
        assert_eq!(stdout, format!("n\n{}\n", BATCHES * ROWS));
    }
    let (ok, stdout, stderr) = sql(&server, "SELECT 1 AS one");
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "one\n1\n");
    server.assert_rss_below(idle);
    server.assert_alive().await;
}

/// The row groups a lake scan fetches count in the memory pool: a read of a column whose
/// one row group is larger than the whole pool fails alone, on both ports, and a read of
/// the small column of the same file does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lake_row_group_over_the_memory_pool_fails_alone() {
    use rand::{Rng, SeedableRng};

    let mut server = Server::start_with(&["--sql-memory-limit", "4MiB"]);
    let client = server.client().await;
    let options = lake_options();
    let table = client
        .create_table(&events_table("fetched", 1, options), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    // 16 MiB of distinct random names (neither a dictionary nor LZ4 shrinks them), tiered
    // into one row group: four times the pool.
    const BATCHES: usize = 16;
    const ROWS: usize = 1024;
    let mut random = rand::rngs::StdRng::seed_from_u64(7);
    for i in 0..BATCHES {
        let names: Vec<String> = (0..ROWS)
            .map(|_| {
                let bytes: [u8; 512] = random.random();
                bytes.iter().map(|b| format!("{b:02x}")).collect()
            })
            .collect();
        let ids: Vec<i64> = (0..ROWS).map(|row| (i * ROWS + row) as i64).collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(ids)),
            Arc::new(StringArray::from(names)),
        ];
        let batch = RecordBatch::try_new(Arc::clone(table.schema()), columns).expect("batch");
        client.append(&bucket, vec![batch]).await.expect("append");
    }
    client.tier(&table.path).await.expect("tier");

    let mut raw = server.raw().await;
    let union = |columns: Vec<u32>| {
        ticket(read_ticket::Read::Union(UnionRequest {
            bucket: Some(bucket.clone()),
            columns,
            filters: vec![],
        }))
    };
    let (code, message) = do_get(&mut raw, union(vec![1]))
        .await
        .expect_err("over the pool");
    assert_eq!(code, Code::ResourceExhausted, "{message}");
    let (rows, _) = do_get(&mut raw, union(vec![0])).await.expect("the ids");
    assert_eq!(rows, BATCHES * ROWS);
    server.assert_alive().await;

    let (ok, _, stderr) = sql(&server, "SELECT max(name) FROM test.fetched");
    assert!(!ok);
    assert!(stderr.contains("Resources exhausted"), "{stderr}");
    let (ok, stdout, stderr) = sql(&server, "SELECT max(id) AS m FROM test.fetched");
    assert!(ok, "{stderr}");
    assert_eq!(stdout, format!("m\n{}\n", BATCHES * ROWS - 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_snapshot_streams_nobody_reads_never_stall_writes() {
    let mut server = Server::start();
    let client = server.client().await;
    let table = client
        .create_table(&keyed_table("stalled"), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    // Far more than the transport's flow-control windows: every stream stalls its sender.
    for i in 0..32 {
        let rows = wide_events(&table, i * 1024, 1024, 256);
        client.append(&bucket, vec![rows]).await.expect("upsert");
    }
    let idle = server.process.rss_kib();

    // 600 Snapshot streams over three connections (each may hold 256), none read past
    // its first message: more than tokio's 512 blocking threads, had each stalled
    // stream held one.
    const STREAMS: usize = 600;
    let snapshot = || {
        ticket(read_ticket::Read::Snapshot(SnapshotRequest {
            bucket: Some(bucket.clone()),
            columns: vec![],
            batch_rows: 64,
        }))
    };
    // A connection's unread streams share its flow-control window: a wide window per
    // connection and a narrow one per stream, so every stream gets its first batch while
    // the server's sender of each stalls at once.
    let mut connections = Vec::new();
    for _ in 0..3 {
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
            .expect("url")
            .initial_connection_window_size(1 << 30)
            .initial_stream_window_size(1 << 16)
            .connect()
            .await
            .expect("raw connect");
        let inner = FlightServiceClient::new(channel).max_decoding_message_size(usize::MAX);
        connections.push(FlightClient::new_from_inner(inner));
    }
    let mut stalled = Vec::new();
    for i in 0..STREAMS {
        let raw = &mut connections[i % 3];
        let mut stream = raw.do_get(snapshot()).await.expect("snapshot");
        stream
            .next()
            .await
            .expect("a first batch")
            .expect("a batch");
        stalled.push(stream);
    }

    // Writes go on, each answered promptly.
    for i in 0..20 {
        let rows = events(&table, &[100_000 + i]);
        tokio::time::timeout(
            std::time::Duration::from_secs(20),
            client.append(&bucket, vec![rows]),
        )
        .await
        .expect("a write while snapshots stall")
        .expect("upsert");
    }
    // So do reads of other kinds, and a new snapshot read to its end.
    let answer = client.snapshot(&bucket, &[0], 0).await.expect("snapshot");
    assert_eq!(answer.num_rows(), 32 * 1024 + 20);
    server.assert_rss_below(idle);
    drop(stalled);
    server.assert_alive().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_action_refuses_a_body_that_is_not_its_message_and_plan_table_union_bad_input() {
    let mut server = Server::start();
    let client = server.client().await;
    let lake = lake_options();
    let table = client
        .create_table(&keyed_table_with("planned", lake), false)
        .await
        .expect("create");
    let mut raw = server.raw().await;
    // Bytes that are no protobuf message at all (a field with a reserved wire type).
    let garbage = vec![0xff; 64];
    for kind in [
        action::CREATE_TABLE,
        action::DROP_TABLE,
        action::DESCRIBE_TABLE,
        action::ADD_COLUMN,
        action::LIST_BUCKETS,
        action::LIST_NODES,
        action::LIST_OFFSETS,
        action::LOOKUP,
        action::PREFIX_LOOKUP,
        action::TIER_TABLE,
        action::COMPACT_TABLE,
        action::EXPIRE_SNAPSHOTS,
        action::REMOVE_ORPHAN_FILES,
        action::REWRITE_MANIFESTS,
        action::LAKE_TABLE_STATS,
        action::PLAN_UNION,
        action::PLAN_TABLE_UNION,
        action::LIST_LAKE_SNAPSHOTS,
        action::PLAN_TABLE_CHANGES,
    ] {
        let (code, message) = do_action(&mut raw, kind, garbage.clone())
            .await
            .expect_err(kind);
        assert_eq!(code, Code::InvalidArgument, "{kind}: {message}");
    }
    server.assert_alive().await;

    // plan_table_union: a table that does not exist, a name that is not one, a filter on
    // no column, a value of the wrong type, an unknown operator.
    let plan = |table: &str, filters: Vec<ColumnFilter>| {
        let request = TableUnionRequest {
            table: table.into(),
            filters,
        };
        request.encode_to_vec()
    };
    let name = table.path.to_string();
    let cases = [
        (plan("test.missing", vec![]), Code::NotFound),
        (plan("no dots or anything", vec![]), Code::InvalidArgument),
        (
            plan(
                &name,
                vec![ColumnFilter::new("nope", FilterOp::Eq, Some("1"))],
            ),
            Code::InvalidArgument,
        ),
        (
            plan(
                &name,
                vec![ColumnFilter::new("id", FilterOp::Eq, Some("x"))],
            ),
            Code::InvalidArgument,
        ),
        (
            plan(
                &name,
                vec![ColumnFilter {
                    column: "id".into(),
                    op: 999,
                    value: Some("1".into()),
                }],
            ),
            Code::InvalidArgument,
        ),
    ];
    for (body, expected) in cases {
        let (code, message) = do_action(&mut raw, action::PLAN_TABLE_UNION, body)
            .await
            .expect_err("refused");
        assert_eq!(code, expected, "{message}");
    }
    // A good request still plans.
    do_action(&mut raw, action::PLAN_TABLE_UNION, plan(&name, vec![]))
        .await
        .expect("plan_table_union");
    server.assert_alive().await;
}

/// The Union and Lake tickets' filters become the shared plan's predicates: each bad one
/// (no such column, a value not of the column's type, no value, an unknown operator) is
/// refused with INVALID_ARGUMENT before anything is read, and good ones still filter the
/// lake and the tail exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn union_and_lake_tickets_refuse_bad_filters_and_apply_good_ones() {
    let mut server = Server::start();
    let client = server.client().await;
    let lake = lake_options();
    let table = client
        .create_table(&keyed_table_with("filtered", lake), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    // Ids 0..100 in the lake, then 50..150 upserted into the tail.
    let lake_rows = wide_events(&table, 0, 100, 4);
    client
        .append(&bucket, vec![lake_rows])
        .await
        .expect("upsert");
    client.tier(&table.path).await.expect("tier");
    let tail_rows = wide_events(&table, 50, 100, 4);
    client
        .append(&bucket, vec![tail_rows])
        .await
        .expect("upsert");

    let union = |filters: Vec<ColumnFilter>| {
        ticket(read_ticket::Read::Union(UnionRequest {
            bucket: Some(bucket.clone()),
            columns: vec![],
            filters,
        }))
    };
    let lake_read = |filters: Vec<ColumnFilter>| {
        ticket(read_ticket::Read::Lake(LakeRequest {
            table: table.path.to_string(),
            partition: None,
            snapshot_id: None,
            columns: vec![],
            filters,
        }))
    };
    let bad = [
        ColumnFilter::new("nope", FilterOp::Eq, Some("1")),
        ColumnFilter::new("id", FilterOp::Gt, Some("x")),
        ColumnFilter::new("id", FilterOp::Eq, None),
        ColumnFilter {
            column: "id".into(),
            op: 999,
            value: Some("1".into()),
        },
    ];
    let mut raw = server.raw().await;
    for filter in bad {
        for read in [union(vec![filter.clone()]), lake_read(vec![filter.clone()])] {
            let (code, message) = do_get(&mut raw, read).await.expect_err("refused");
            assert_eq!(code, Code::InvalidArgument, "{filter:?}: {message}");
        }
    }
    server.assert_alive().await;

    // id >= 90 AND id < 120: ten lake rows' keys are all in the tail; the union answers
    // ids 90..120 once each, the lake alone 90..100.
    let good = vec![
        ColumnFilter::new("id", FilterOp::GtEq, Some("90")),
        ColumnFilter::new("id", FilterOp::Lt, Some("120")),
        ColumnFilter::new("name", FilterOp::IsNotNull, None),
    ];
    let (rows, _) = do_get(&mut raw, union(good.clone())).await.expect("union");
    assert_eq!(rows, 30);
    let (rows, _) = do_get(&mut raw, lake_read(good)).await.expect("lake");
    assert_eq!(rows, 10);
    server.assert_alive().await;
}

/// The messages of one DoPut to `bucket`: the schema, then one record batch message per
/// batch, each as `shape` leaves it.
fn put_messages(
    bucket: &BucketId,
    table: &TableDescriptor,
    batches: &[(RecordBatch, MessageShape)],
) -> Vec<arrow_flight::FlightData> {
    let header = WriteHeader {
        bucket: Some(bucket.clone()),
        delete: false,
        writer: None,
    };
    let schema: arrow_flight::FlightData =
        arrow_flight::SchemaAsIpc::new(table.schema(), &IpcWriteOptions::default()).into();
    let mut messages =
        vec![schema.with_descriptor(FlightDescriptor::new_cmd(header.encode_to_vec()))];
    for (batch, shape) in batches {
        let options = match shape {
            MessageShape::V4 => IpcWriteOptions::try_new(8, false, MetadataVersion::V4),
            _ => IpcWriteOptions::try_new(64, false, MetadataVersion::V5),
        }
        .expect("options");
        let (_, encoded) = IpcDataGenerator::default()
            .encode(
                batch,
                &mut DictionaryTracker::new(false),
                &options,
                &mut CompressionContext::default(),
            )
            .expect("encode");
        let mut data = arrow_flight::FlightData::from(encoded);
        match shape {
            MessageShape::LongerBody => {
                data.data_body = [&data.data_body[..], &[0xab; 24]].concat().into();
            }
            MessageShape::JunkAfterHeader => {
                data.data_header = [&data.data_header[..], b"junk"].concat().into();
            }
            MessageShape::Plain | MessageShape::V4 => {}
        }
        messages.push(data);
    }
    messages
}

/// How a client's record batch message departs from the plain one.
#[derive(Debug, Clone, Copy)]
enum MessageShape {
    Plain,
    /// A body longer than the header declares (the extra bytes belong to no buffer).
    LongerBody,
    /// A header followed by bytes that are not part of its flatbuffer.
    JunkAfterHeader,
    /// Arrow IPC metadata version 4.
    V4,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_batch_messages_of_every_shape_are_stored_and_read_back_exactly() {
    // The log stores a plain message as it was sent and encodes the others again: either
    // way every row reads back, from the log cache and from the segments after a restart,
    // for an append and for an upsert of new keys (whose changelog is the batch).
    let dir = tempfile::tempdir().expect("temp dir");
    let mut process = ServerProcess::start(dir.path());
    let client = MinkClient::connect(&process.addr).await.expect("connect");
    let log = client
        .create_table(&events_table("shapes", 1, TableOptions::default()), false)
        .await
        .expect("create");
    let keyed = client
        .create_table(&keyed_table("keyed_shapes"), false)
        .await
        .expect("create");
    let shapes = [
        MessageShape::Plain,
        MessageShape::LongerBody,
        MessageShape::JunkAfterHeader,
        MessageShape::V4,
        MessageShape::Plain,
    ];
    let ids = |i: usize| -> Vec<i64> { (i as i64 * 100..i as i64 * 100 + 50).collect() };
    let mut expected = Vec::new();
    for table in [&log, &keyed] {
        let bucket = BucketId::new(&table.path, 0);
        let batches: Vec<(RecordBatch, MessageShape)> = shapes
            .iter()
            .enumerate()
            .map(|(i, shape)| (events(table, &ids(i)), *shape))
            .collect();
        let mut raw = raw_client(&process.addr).await;
        let messages = put_messages(&bucket, table, &batches);
        let acks: Vec<_> = raw
            .do_put(stream::iter(messages.into_iter().map(Ok)))
            .await
            .expect("do_put")
            .try_collect()
            .await
            .expect("every batch acknowledged");
        assert_eq!(acks.len(), shapes.len());
        expected.push((bucket, batches));
    }
    let read_back = |answer: mink_client::ReadAnswer| -> Vec<RecordBatch> {
        answer.batches.into_iter().map(|b| b.batch).collect()
    };
    for restarted in [false, true] {
        let client = MinkClient::connect(&process.addr).await.expect("connect");
        for (bucket, batches) in &expected {
            let scanned = read_back(client.scan(bucket, 0, 0, &[]).await.expect("scan"));
            let sent: Vec<RecordBatch> = batches.iter().map(|(b, _)| b.clone()).collect();
            assert_eq!(scanned, sent, "{bucket} (restarted: {restarted})");
        }
        let snapshot = client
            .snapshot(&expected[1].0, &[], 0)
            .await
            .expect("snapshot");
        let rows: usize = snapshot.batches.iter().map(RecordBatch::num_rows).sum();
        assert_eq!(rows, 50 * shapes.len(), "restarted: {restarted}");
        if !restarted {
            process.kill();
            process = ServerProcess::start(dir.path());
        }
    }
    assert!(process.is_running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_do_put_with_a_second_schema_message_is_refused_after_the_batches_before_it() {
    let mut server = Server::start();
    let client = server.client().await;
    let table = client
        .create_table(
            &events_table("two_schemas", 1, TableOptions::default()),
            false,
        )
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    let mut messages = put_messages(
        &bucket,
        &table,
        &[
            (events(&table, &[1, 2]), MessageShape::Plain),
            (events(&table, &[3, 4]), MessageShape::Plain),
        ],
    );
    // The schema again, between the two batches.
    let schema = messages[0]
        .clone()
        .with_descriptor(FlightDescriptor::new_cmd(vec![]));
    messages.insert(2, schema);
    let mut raw = server.raw().await;
    let mut acks = raw
        .do_put(stream::iter(messages.into_iter().map(Ok)))
        .await
        .expect("do_put");
    assert!(matches!(acks.next().await, Some(Ok(_))), "the first batch");
    let (code, message) = status_of(acks.next().await.expect("an answer").unwrap_err());
    assert_eq!(code, Code::InvalidArgument, "{message}");
    assert!(message.contains("one schema message"), "{message}");
    drop(acks);
    let answer = client.scan(&bucket, 0, 0, &[]).await.expect("scan");
    assert_eq!(
        answer.num_rows(),
        2,
        "only the batch before the second schema"
    );
    server.assert_alive().await;
}

/// Connections that each announce an HTTP/2 frame of the largest size the node takes
/// (`MAX_FRAME_BYTES`, 1 MiB), send a few bytes of it and stall.
const STALLED_FRAMES: usize = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_clients_announcing_the_largest_frames_hold_only_what_they_sent() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut server = Server::start();
    server.assert_alive().await;
    let idle = server.process.rss_kib();
    let frame = mink_node::flight::limits::MAX_FRAME_BYTES.to_be_bytes();
    let mut stalled = Vec::with_capacity(STALLED_FRAMES);
    for _ in 0..STALLED_FRAMES {
        let mut connection = tokio::net::TcpStream::connect(&server.addr)
            .await
            .expect("connect");
        // The preface and empty SETTINGS; then, once the server's SETTINGS arrive, their
        // ACK (the node reads frames of its announced size only once it is acknowledged).
        connection
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            .await
            .expect("preface");
        let mut head = [0u8; 9];
        connection.read_exact(&mut head).await.expect("settings");
        assert_eq!(head[3], 4, "the server opens with its SETTINGS");
        let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        connection
            .read_exact(&mut vec![0; length])
            .await
            .expect("settings payload");
        connection
            .write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0])
            .await
            .expect("ack");
        // A DATA frame of 1 MiB on stream 1: its header and 1 KiB of it.
        let mut data = vec![frame[1], frame[2], frame[3], 0, 0, 0, 0, 0, 1];
        data.extend_from_slice(&[0x5a; 1024]);
        connection.write_all(&data).await.expect("a frame's start");
        stalled.push(connection);
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let rss = server.process.rss_kib();
    // Had the node filled a buffer of each announced frame it would hold 300 MiB more.
    assert!(
        rss < idle + (128 << 10),
        "resident memory grew from {idle} KiB to {rss} KiB with {STALLED_FRAMES} stalled frames"
    );
    // The node took the frames (one over its size would end the connection with a GOAWAY):
    // it answers with SETTINGS acknowledgements and window updates, and keeps the
    // connection.
    for connection in stalled.iter_mut().take(10) {
        let mut answered = Vec::new();
        let mut buffer = [0u8; 256];
        loop {
            let read = tokio::time::timeout(
                std::time::Duration::from_millis(100),
                connection.read(&mut buffer),
            );
            match read.await {
                Err(_) => break,
                Ok(Ok(0)) => panic!("the node closed a connection holding a frame of its size"),
                Ok(Ok(n)) => answered.extend_from_slice(&buffer[..n]),
                Ok(Err(error)) => panic!("reading a stalled connection: {error}"),
            }
        }
        let mut at = 0;
        while at + 9 <= answered.len() {
            let length = u32::from_be_bytes([0, answered[at], answered[at + 1], answered[at + 2]]);
            assert_ne!(answered[at + 3], 7, "a GOAWAY: {answered:?}");
            at += 9 + length as usize;
        }
        assert_eq!(at, answered.len(), "whole frames: {answered:?}");
    }
    server.assert_alive().await;
    drop(stalled);
    server.assert_alive().await;
}

/// A DoPut of one batch per slice of `batches` to `bucket` as `writer`; the
/// acknowledgements.
async fn put_as_writer(
    raw: &mut FlightClient,
    table: &TableDescriptor,
    bucket: &BucketId,
    batches: &[&[i64]],
    writer: IdempotentWriter,
) -> Result<Vec<AppendAck>, FlightError> {
    let header = WriteHeader {
        bucket: Some(bucket.clone()),
        delete: false,
        writer: Some(writer),
    };
    let batches: Vec<_> = batches.iter().map(|ids| Ok(events(table, ids))).collect();
    let data = FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(FlightDescriptor::new_cmd(header.encode_to_vec())))
        .build(stream::iter(batches));
    let acks: Vec<_> = raw.do_put(data).await?.try_collect().await?;
    Ok((acks.iter())
        .map(|ack| AppendAck::decode(ack.app_metadata.clone()).expect("an AppendAck"))
        .collect())
}

/// An idempotent writer's first DoPut, numbered from 0, naming `since`.
fn writer(producer_id: i64, since: i64) -> IdempotentWriter {
    IdempotentWriter {
        producer_id,
        first_sequence: 0,
        since,
    }
}

/// Writers a client makes up, each naming the log's start as where to look for its
/// earlier attempts, make the node search the whole log for each: the searches take
/// turns, each reads a bounded number of bytes, other writes go on meanwhile, and every
/// made-up writer's batch is written once (sent again, it is answered as a duplicate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_writers_searching_the_whole_log_take_turns_and_the_node_answers() {
    let mut server = Server::start();
    let client = server.client().await;
    let table = client
        .create_table(&events_table("searched", 1, TableOptions::default()), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    // A log of some 20 MB, past the size a search runs without a turn.
    for chunk in 0..20 {
        let ids: Vec<i64> = (chunk * 50_000..(chunk + 1) * 50_000).collect();
        client
            .append(&bucket, vec![events(&table, &ids)])
            .await
            .expect("append");
    }
    let idle = server.process.rss_kib();
    let searches = (0..24).map(|i| {
        let (table, bucket, addr) = (table.clone(), bucket.clone(), server.addr.clone());
        tokio::spawn(async move {
            let mut raw = raw_client(&addr).await;
            let made_up = writer(1 << 40 | i, 0);
            put_as_writer(&mut raw, &table, &bucket, &[&[2_000_000 + i]], made_up).await
        })
    });
    let searches: Vec<_> = searches.collect();
    // Meanwhile a plain write is answered.
    client
        .append(&bucket, vec![events(&table, &[3_000_000])])
        .await
        .expect("a write among the searches");
    for search in searches {
        let acks = search.await.expect("task").expect("a made-up writer's put");
        assert!(!acks[0].duplicate);
    }
    server.assert_rss_below(idle);
    // Sent again: found in the log, not written twice.
    let mut raw = server.raw().await;
    let again = put_as_writer(
        &mut raw,
        &table,
        &bucket,
        &[&[2_000_005]],
        writer(1 << 40 | 5, 0),
    )
    .await
    .expect("sent again");
    assert!(again[0].duplicate, "{again:?}");
    let high_watermark = client.list_offsets(&bucket, latest()).await.expect("hw");
    assert_eq!(high_watermark, 1_000_000 + 24 + 1, "each batch once");
    server.assert_alive().await;
}

/// A writer's numbers and `since` are the client's to choose: numbers that run past
/// `i32::MAX` are refused at the first that does (the batches before it written), a
/// `since` before the log or past its end is taken as its start or its end, and a
/// negative number is a number like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_s_numbers_and_since_at_their_bounds_are_answered() {
    let mut server = Server::start();
    let client = server.client().await;
    let table = client
        .create_table(&events_table("numbered", 1, TableOptions::default()), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    let mut raw = server.raw().await;
    let last_number = IdempotentWriter {
        first_sequence: i32::MAX,
        ..writer(7, 0)
    };
    let error = put_as_writer(&mut raw, &table, &bucket, &[&[1], &[2]], last_number)
        .await
        .expect_err("a number past i32::MAX");
    let FlightError::Tonic(status) = &error else {
        panic!("not a status: {error}");
    };
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    assert!(status.message().contains("new id"), "{status}");
    for (id, since) in [(8, i64::MIN), (9, i64::MAX)] {
        let acks = put_as_writer(&mut raw, &table, &bucket, &[&[id]], writer(id, since))
            .await
            .expect("a since outside the log");
        assert!(!acks[0].duplicate);
    }
    let lowest = IdempotentWriter {
        first_sequence: i32::MIN,
        ..writer(10, 0)
    };
    let acks = put_as_writer(&mut raw, &table, &bucket, &[&[10], &[11]], lowest)
        .await
        .expect("negative numbers");
    assert_eq!(acks.len(), 2);
    let high_watermark = client.list_offsets(&bucket, latest()).await.expect("hw");
    assert_eq!(
        high_watermark, 5,
        "1 before the refusal, 2 outside the log, 2 negative"
    );
    server.assert_alive().await;
}

fn latest() -> mink_core::protocol::list_offsets::Spec {
    mink_core::protocol::list_offsets::Spec::Latest(true)
}
