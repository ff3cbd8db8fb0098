//! `mink-bench flight-sql`: the Flight SQL endpoint against the same queries run in
//! process.
//!
//! ```text
//! cargo run --release -p mink-bench -- flight-sql [--keys 100000] [--queries 2000]
//!     [--large-rows 3000000] [--dir DIR] [--no-sync]
//! ```
//!
//! An embedded node is served on a loopback port with the Flight SQL endpoint beside it
//! (plaintext, no authentication), over a primary-key table `bench.kv (id BIGINT, v
//! VARCHAR)` of `--keys` rows in 4 buckets. Two figures, each measured three ways:
//!
//! - *in process*: a [`MinkSession`] in this process plans and runs the statement
//!   (`sql` then `execute_stream`, one session for all statements, as `mink sql` does);
//! - *Flight SQL*: arrow-flight's Rust client in this process, `GetFlightInfo` then
//!   `DoGet`, over loopback TCP (every call of the endpoint loads the table list in a new
//!   session, plans the statement, and `DoGet` plans it again);
//! - *ADBC*: the ADBC Flight SQL driver from Python (`MINK_PYTHON`, else `python3`, with
//!   `pip install adbc-driver-flightsql pyarrow`), `cursor.execute` then
//!   `fetch_arrow_table`, timed in the Python process; skipped with a note when it cannot
//!   run.
//!
//! 1. **One-row query latency**, p50 and p99 of `--queries` point queries
//!    `SELECT id, v FROM bench.kv WHERE id = K` (a KV lookup; K varies) after 50 uncounted
//!    ones. Ratios: each client's latency over the in-process one.
//! 2. **Large result throughput**: `SELECT value AS id, lpad(CAST(value AS VARCHAR), 100,
//!    'x') AS pad FROM generate_series(1, N)` with N = `--large-rows` (default 3 000 000,
//!    about 324 MB of values: 108 bytes a row, the size MB/s counts; every string computed
//!    row by row), produced by DataFusion and read batch by batch. Ratios: each client's
//!    rate over the in-process one.
//!
//! ADBC also writes `--keys` rows (an id and a 16-byte string) into a new primary-key
//! table twice: by `cursor.executemany("INSERT INTO t VALUES (?, ?)", rows)` (a prepared
//! batch insert, what JDBC's `executeBatch` sends too) and by `adbc_ingest` (bulk
//! ingestion). Ratio: executemany's rate over the ingest's.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow_flight::sql::client::FlightSqlServiceClient;
use futures::TryStreamExt;
use mink_core::table::TablePath;
use mink_lake::storage::LakeStorage;
use mink_sql::session::MinkSession;
use object_store::local::LocalFileSystem;
use tonic::transport::Channel;

use crate::error::BenchError;
use crate::harness::{
    Latency, NodeArgs, Running, Scratch, Throughput, create_table, measure, paired_latency, python,
    report,
};

/// Arguments of `mink-bench flight-sql`.
#[derive(Debug, clap::Args)]
pub(crate) struct FlightSqlArgs {
    /// Rows of the table the point queries read.
    #[arg(long, default_value_t = 100_000)]
    keys: usize,
    /// Point queries measured per client.
    #[arg(long, default_value_t = 2000)]
    queries: usize,
    /// Rows of the large result.
    #[arg(long, default_value_t = 3_000_000)]
    large_rows: usize,
    #[command(flatten)]
    node: NodeArgs,
}

/// Uncounted point queries before each latency measurement.
const WARMUP: usize = 50;
/// Buckets of the table.
const BUCKETS: u32 = 4;
/// Bytes of one row of the large result: an 8-byte id and a 100-byte string.
const LARGE_ROW_BYTES: u64 = 108;
/// Bytes of a row the ADBC script inserts, about: an 8-byte id and a 16-byte string.
const INSERTED_ROW_BYTES: u64 = 24;
/// The point query; `{key}` is replaced by a key.
const POINT_QUERY: &str = "SELECT id, v FROM bench.kv WHERE id = {key}";

pub(crate) async fn run(args: FlightSqlArgs) -> Result<(), BenchError> {
    if args.keys == 0 || args.queries == 0 {
        return Err(BenchError::Usage(
            "--keys and --queries must be positive".into(),
        ));
    }
    let scratch = Scratch::new(args.node.dir.clone())?;
    let config = args.node.config(&scratch, 64 << 20);
    println!(
        "mink-bench flight-sql: {} keys in {BUCKETS} buckets, {} point queries, {} rows of large result, {}",
        args.keys,
        args.queries,
        args.large_rows,
        args.node.describe(&config, &scratch)
    );
    let running = Running::start(config).await?;
    load(&running, args.keys).await?;
    let storage = LakeStorage::new(Arc::new(LocalFileSystem::new()), "");
    let endpoint = running.serve_flight_sql(storage.clone()).await?;
    let session = MinkSession::connect(running.client.clone(), storage).await?;
    let channel = Channel::from_shared(format!("http://{}", endpoint.addr()))
        .map_err(|e| BenchError::Connect(e.to_string()))?
        .connect()
        .await
        .map_err(|e| BenchError::Connect(e.to_string()))?;
    let mut client = FlightSqlServiceClient::new(channel);
    let large = format!(
        "SELECT value AS id, lpad(CAST(value AS VARCHAR), 100, 'x') AS pad \
         FROM generate_series(1, {})",
        args.large_rows
    );

    let point = |i: usize| POINT_QUERY.replace("{key}", &(i * 7919 % args.keys).to_string());
    let session = &session;
    let local_point = |i: usize| {
        let sql = point(i);
        async move { in_process(session, &sql).await }
    };
    let flight_point = |i: usize| {
        let (mut client, sql) = (client.clone(), point(i));
        async move { flight_sql(&mut client, &sql).await }
    };
    let what = "point queries, in process and through Flight SQL";
    let (local, remote) =
        paired_latency(what, WARMUP, args.queries, 1, local_point, flight_point).await?;
    let (rows, elapsed) = measure("large result, in process", in_process(session, &large)).await?;
    let large_local = Throughput::new(rows, rows as u64 * LARGE_ROW_BYTES, elapsed);
    let large_flight = flight_sql(&mut client, &large);
    let (rows, elapsed) = measure("large result, Flight SQL", large_flight).await?;
    let large_remote = Throughput::new(rows, rows as u64 * LARGE_ROW_BYTES, elapsed);
    let adbc = adbc(&format!("grpc://{}", endpoint.addr()), &args, &large);

    println!("One-row query (point lookup) latency:");
    report("  in process", local, &[]);
    report(
        "  Flight SQL (Rust client)",
        remote,
        &[remote.ratio_to(&local)],
    );
    println!(
        "Large result ({} MB):",
        args.large_rows as u64 * LARGE_ROW_BYTES / 1_000_000
    );
    report("  in process", large_local, &[]);
    let ratio = |t: &Throughput| format!("{:.2}", t.ratio_to(&large_local));
    report(
        "  Flight SQL (Rust client)",
        large_remote,
        &[ratio(&large_remote)],
    );
    match adbc {
        Ok(adbc) => {
            report(
                "  ADBC (Python) latency",
                adbc.latency,
                &[adbc.latency.ratio_to(&local)],
            );
            report(
                "  ADBC (Python) large result",
                adbc.large,
                &[ratio(&adbc.large)],
            );
            println!("Writing {} rows through ADBC:", args.keys);
            report("  adbc_ingest", adbc.ingest, &[]);
            let executemany = adbc.executemany;
            let ratio = format!("{:.2}", executemany.ratio_to(&adbc.ingest));
            report("  executemany (batch insert)", executemany, &[ratio]);
        }
        Err(why) => println!("  ADBC (Python): skipped: {why}"),
    }
    endpoint.shutdown().await?;
    running.stop().await?;
    Ok(())
}

/// `bench.kv` with `keys` rows.
async fn load(running: &Running, keys: usize) -> Result<(), BenchError> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
    ]));
    let path = TablePath::new("bench", "kv");
    let table = create_table(&running.client, &path, BUCKETS, &schema, &["id"]).await?;
    for start in (0..keys).step_by(10_000) {
        let ids: Vec<i64> = (start..keys.min(start + 10_000))
            .map(|i| i as i64)
            .collect();
        let values = ids.iter().map(|i| format!("value-{i}"));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(ids.clone())),
                Arc::new(StringArray::from_iter_values(values)),
            ],
        )?;
        running.client.write(&table, &batch).await?;
    }
    Ok(())
}

/// Plans and runs `sql` in process; its rows.
async fn in_process(session: &MinkSession, sql: &str) -> Result<usize, BenchError> {
    let mut batches = session.sql(sql).await?.execute_stream().await?;
    let mut rows = 0;
    while let Some(batch) = batches.try_next().await? {
        rows += batch.num_rows();
    }
    Ok(rows)
}

/// Runs `sql` through the Flight SQL endpoint; its rows.
async fn flight_sql(
    client: &mut FlightSqlServiceClient<Channel>,
    sql: &str,
) -> Result<usize, BenchError> {
    let flight = |e: arrow_flight::error::FlightError| BenchError::Client(e.into());
    let info = client
        .execute(sql.to_string(), None)
        .await
        .map_err(flight)?;
    let mut rows = 0;
    for endpoint in info.endpoint {
        let Some(ticket) = endpoint.ticket else {
            continue;
        };
        let mut batches = client.do_get(ticket).await.map_err(flight)?;
        while let Some(batch) = batches.try_next().await.map_err(flight)? {
            rows += batch.num_rows();
        }
    }
    Ok(rows)
}

/// What the ADBC driver measured.
struct AdbcFigures {
    latency: Latency,
    large: Throughput,
    executemany: Throughput,
    ingest: Throughput,
}

/// The ADBC figures, from the Python driver; why not when it cannot run.
fn adbc(uri: &str, args: &FlightSqlArgs, large: &str) -> Result<AdbcFigures, String> {
    let mut script_args = vec![uri.to_string(), POINT_QUERY.to_string()];
    script_args.extend([args.keys, args.queries, WARMUP].map(|n| n.to_string()));
    script_args.push(large.to_string());
    let stdout = python(
        include_str!("flight_sql_adbc.py"),
        &script_args,
        "adbc-driver-flightsql pyarrow",
    )?;
    let mut lines = stdout.lines();
    let bad = || format!("unexpected output of the ADBC script: {stdout}");
    let large_line: Vec<&str> = lines.next().ok_or_else(bad)?.split(' ').collect();
    let (rows, seconds) = match large_line.as_slice() {
        ["large", rows, seconds] => (
            rows.parse::<usize>().map_err(|_| bad())?,
            seconds.parse::<f64>().map_err(|_| bad())?,
        ),
        _ => return Err(bad()),
    };
    let insert_line: Vec<&str> = lines.next().ok_or_else(bad)?.split(' ').collect();
    let (inserted, executemany, ingest) = match insert_line.as_slice() {
        ["insert", rows, executemany, ingest] => (
            rows.parse::<usize>().map_err(|_| bad())?,
            executemany.parse::<f64>().map_err(|_| bad())?,
            ingest.parse::<f64>().map_err(|_| bad())?,
        ),
        _ => return Err(bad()),
    };
    let latencies = lines
        .map(str::parse::<f64>)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| bad())?;
    let written = |seconds: f64| {
        Throughput::new(
            inserted,
            inserted as u64 * INSERTED_ROW_BYTES,
            Duration::from_secs_f64(seconds),
        )
    };
    Ok(AdbcFigures {
        latency: Latency::new(latencies),
        large: Throughput::new(
            rows,
            rows as u64 * LARGE_ROW_BYTES,
            Duration::from_secs_f64(seconds),
        ),
        executemany: written(executemany),
        ingest: written(ingest),
    })
}
