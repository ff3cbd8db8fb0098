//! `mink bench`: benchmark programs that print mink's figures as ratios against a baseline
//! measured in the same process, on the same disk, with the same data.
//!
//! # `mink bench log`
//!
//! ```text
//! cargo run --release -p mink-query -- bench log [--rows 2000000] [--dir DIR] [--no-sync]
//! ```
//!
//! An embedded node is served on a loopback port and driven through [`MinkClient`], so every
//! figure includes the Flight protocol. The data is `--rows` rows (default 2 000 000) of
//! `id i64, event_time timestamp(µs, UTC), name utf8 (20 chars), price f64, quantity i32`,
//! generated deterministically in batches of 10 000 rows. Byte rates count the data's size
//! as an Arrow IPC stream (the baseline file's length); 1 MB is 10^6 bytes. A throughput
//! ratio above 1 means mink is faster than its baseline; a latency ratio is mink's latency
//! over the baseline's, above 1 when mink is slower.
//!
//! 1. **Append throughput**, 1 bucket and 8 buckets. Each bucket has one writer task that
//!    sends its share of the batches (batch `i` goes to bucket `i % n`) four per
//!    [`MinkClient::append`] call; a call returns once its batches are durable. Baselines:
//!    the same batches written by one `arrow::ipc::writer::StreamWriter` to a file in the
//!    same directory, with `sync_data` after each batch (mink acknowledges only after an
//!    fsync, one per group commit), and with one `sync_data` at the end. With `--no-sync`
//!    mink does not fsync and the single baseline never does either.
//! 2. **Scan throughput** of the 1-bucket table from offset 0 to the high watermark, with
//!    the server's default answer size: first from the log cache (sized to hold the
//!    table), then from cold segments after a restart (the server is shut down, the node
//!    dropped and reopened on the same directory, so its cache is empty; the operating
//!    system's page cache is not dropped). Baseline: reading the baseline IPC file with
//!    `arrow::ipc::reader::StreamReader`.
//! 3. **Tail latency**: 500 appends of one 100-row batch (after 10 uncounted warm-up
//!    appends) while one tail reader on another task long-polls with `max_wait` 1 s. The
//!    writer waits for the reader to have each batch before it sends the next. Two
//!    latencies, p50 and p99: *ack -> tailer*, from the moment `append` returns the
//!    acknowledgement to the moment the reader's poll returns the batch (negative when the
//!    reader has it first: the node wakes readers and acknowledges writers at the same
//!    time), and *write -> tailer*, from just before `append` is called. Baseline for the
//!    latter: writing each of the same batches to an IPC file followed by `sync_data`.
//!
//! # `mink bench kv`
//!
//! ```text
//! cargo run --release -p mink-query -- bench kv [--keys 1000000] [--buckets 1] [--dir DIR] [--no-sync]
//! ```
//!
//! Primary-key tables, on the same kind of node and with the same schema, in a table
//! `bench.kv` with primary key `id` and `--buckets` buckets (default 1). Every upsert reads
//! the stored row of each of its keys (one KV get per row) to log `+I`, or `-U` and `+U`,
//! and updates the KV store (fjall) in the same group commit; the figures show what that
//! costs, and what reading the store costs.
//!
//! 1. **Upsert throughput**, in two phases, through [`MinkClient::write`] with four
//!    10 000-row batches in flight. *Load*: `--keys` keys (default 1 000 000; ids from 0,
//!    every key new). Then *10% updates*: `--keys / 2` rows in which every tenth row
//!    updates an existing key (distinct random keys, none updated twice, so the final rows
//!    do not depend on the order the writes land in) and the others insert new keys.
//!    Baseline of each phase: the same batches written the same way to a log table
//!    `bench.kv_log` with the same schema and no primary key; the ratio is the cost of the
//!    changelog and the KV store. The log table is written first, both phases, so its
//!    writes never overlap the KV store's background flushes and compactions (the update
//!    phase does pay for those the load leaves behind).
//! 2. **Lookup latency**, p50 and p99, of 2000 [`MinkClient::lookup`] calls of 1 key and
//!    500 calls of 100 keys (after 20 uncounted warm-up calls each), the keys drawn at
//!    random from the `--keys` loaded ones, so all exist. Baseline: a Scan of one batch of
//!    a small log table from the log cache, the cheapest round trip of the protocol: of a
//!    1-row batch against the 1-key lookups, of a 100-row batch against the 100-key ones,
//!    so both answers carry as many rows. Each lookup follows a baseline call, so both
//!    see the same conditions (background compactions, other processes).
//! 3. **Snapshot throughput**: [`MinkClient::snapshot`] of every bucket (all at once, in
//!    batches of 10 000 rows). Baseline: a Scan, from the log cache, of a log table
//!    `bench.kv_rows` holding exactly the snapshot's rows in the same batches (the first
//!    snapshot's batches, appended to it bucket for bucket) — not of the changelog, which
//!    also holds every overwritten version. Three rounds alternate a Scan and a Snapshot;
//!    each figure is the median of its rounds.
//!
//! # `mink bench lake`
//!
//! ```text
//! cargo run --release -p mink-query -- bench lake [--rows 2000000] [--buckets 4]
//!     [--write-rate 20000] [--dir DIR] [--no-sync]
//! ```
//!
//! The lake tier of log tables, on the same kind of node and with the same schema; the
//! node's lake is the embedded one (`<dir>/node/lake`: a SQLite catalog and a local
//! warehouse). Every table has `--buckets` buckets (default 4). The node's tiering service
//! runs throughout, but the table of figures 1 and 2 has a `lake.freshness` of an hour, so
//! the service never tiers it on its own.
//!
//! 1. **Tiering throughput**: `--rows` rows (default 2 000 000) are appended to the
//!    lake-enabled log table `bench.lake` (batch `i` to bucket `i % n`), then one
//!    [`MinkClient::tier`] round is timed: it reads each bucket's log, writes it as one
//!    zstd Parquet file per bucket (with the lake's columns `__bucket`, `__offset` and
//!    `__timestamp` added), commits one Iceberg snapshot and records it. Baseline: each
//!    bucket's rows written as one Parquet file by `parquet::arrow::ArrowWriter` with the
//!    lake writer's properties (zstd at its default level), in the same directory, one
//!    bucket after the other as the round does them. Neither fsyncs (the lake's local
//!    object store does not), so the ratio is the cost of the log read, the Iceberg
//!    metadata and the commit over the bare Parquet write. The file sizes are printed.
//! 2. **Union read** of that table once 99% of its rows are in the lake: `--rows / 100`
//!    more rows are appended (spread evenly over the buckets) and not tiered. Every bucket
//!    is read at once with [`MinkClient::union`] (the lake files below the seam, then the
//!    log), with all columns, then with only `price`. Baseline: the same rows read from
//!    plain Parquet files (the baseline files of figure 1, plus one file per bucket of the
//!    appended rows) by `ParquetRecordBatchReaderBuilder`, one blocking task per bucket,
//!    all at once, with the same projection (`ProjectionMask::roots`). Three rounds
//!    alternate a baseline read and a union read; each figure is the median of its rounds.
//!    All the files were just written, so both read from the operating system's page cache.
//! 3. **Freshness** at a steady write load: the table `bench.lake_fresh` has a
//!    `lake.freshness` of 2 s; one task writes it through [`MinkClient::write`] (1 000-row
//!    batches, round robin over the buckets) at `--write-rate` rows per second (default
//!    20 000) for 20 s, while the node's service tiers it (the service checks every
//!    500 ms; a table's first round is due one freshness interval after the service sees
//!    it). Every 200 ms a sampler reads each bucket's high watermark with
//!    [`MinkClient::list_offsets`]. After the writes, the seam of each bucket at each
//!    sample's time is taken from the lake's snapshot history: the latest Iceberg snapshot
//!    whose timestamp is not after the sample, and its `mink.bucket-offsets`. The lake lag
//!    of a bucket is its high watermark minus its seam, in rows (in steps of 1 000: a
//!    bucket gets whole batches), and in seconds of writing (rows over the bucket's share
//!    of the achieved write rate); printed are its p50, p99 and max over every sample of
//!    every bucket (samples from the start of the writes, before the first round
//!    included), the ratio of the p99 to the configured freshness, and the rounds
//!    committed while writing with the intervals between them. An Iceberg snapshot's
//!    timestamp is taken before its metadata file and the catalog commit are written and
//!    before the node records the round, so mink's reads see a round a little
//!    (milliseconds) after its timestamp, and the lag is understated by as much.
//!
//! # `mink bench pk-lake`
//!
//! The lake of primary-key tables: see the `pk_lake` module.
//!
//! # Every benchmark
//!
//! Results go to stdout, progress to stderr. The default directory is a fresh one under the
//! system temp directory, removed at the end; `--dir` must name an empty or new directory,
//! which is kept. `--no-sync` runs the node without fsync.

use std::fmt;
use std::fs::File;
use std::future::Future;
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arrow::array::{
    Float64Array, Int32Array, Int64Array, RecordBatch, StringBuilder, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use futures::future::{self, try_join_all};
use futures::stream::{self, StreamExt, TryStreamExt};
use mink_client::{ClientError, MinkClient};
use mink_core::options::TableOptions;
use mink_core::protocol::list_offsets::Spec;
use mink_core::protocol::{BucketId, UnionPlan};
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::offsets::{BUCKET_OFFSETS_PROPERTY, BucketOffsets};
use mink_node::{Node, NodeConfig, NodeError};
use parquet::arrow::ArrowWriter;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;

use crate::embedded;
use crate::error::CliError;

mod flight_sql;
mod pk_lake;
mod sql;
mod table_changes;

/// Arguments of `mink bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    bench: Bench,
}

/// The benchmarks.
#[derive(Debug, clap::Subcommand)]
enum Bench {
    /// The log: append, scan and tail, against Arrow IPC files on the same disk.
    Log(LogArgs),
    /// Primary-key tables: upsert, lookup and snapshot, against log tables and Scan.
    Kv(KvArgs),
    /// The lake tier of log tables: tiering, union reads and freshness, against Parquet
    /// files and the configured freshness.
    Lake(LakeArgs),
    /// The lake of primary-key tables: tiering changed keys, reads with position deletes
    /// and union reads with a changed tail, against Parquet files.
    PkLake(pk_lake::PkLakeArgs),
    /// SQL over a primary-key table with a lake and a changed tail: the union read
    /// against DataFusion and DuckDB over Parquet and the naive plan; point queries.
    Sql(sql::SqlArgs),
    /// The incremental read of a primary-key table's lake: the changes of one tiering
    /// round against a full read of the lake as of it.
    TableChanges(table_changes::TableChangesArgs),
    /// The Flight SQL endpoint: one-row query latency and large-result throughput
    /// through arrow-flight's client and ADBC, against the same queries in process.
    FlightSql(flight_sql::FlightSqlArgs),
}

/// Arguments of `mink bench log`.
#[derive(Debug, clap::Args)]
struct LogArgs {
    /// Rows to write, in batches of 10 000.
    #[arg(long, default_value_t = 2_000_000)]
    rows: usize,
    #[command(flatten)]
    node: NodeArgs,
}

/// Arguments of `mink bench kv`.
#[derive(Debug, clap::Args)]
struct KvArgs {
    /// Keys to load, in batches of 10 000; half as many rows are upserted after.
    #[arg(long, default_value_t = 1_000_000)]
    keys: usize,
    /// Buckets of every table.
    #[arg(long, default_value_t = 1)]
    buckets: u32,
    #[command(flatten)]
    node: NodeArgs,
}

/// Arguments of `mink bench lake`.
#[derive(Debug, clap::Args)]
struct LakeArgs {
    /// Rows to tier, in batches of 10 000; a hundredth as many are appended after.
    #[arg(long, default_value_t = 2_000_000)]
    rows: usize,
    /// Buckets of every table.
    #[arg(long, default_value_t = 4)]
    buckets: u32,
    /// Rows per second written while the freshness is measured, in batches of 1 000.
    #[arg(long, default_value_t = 20_000)]
    write_rate: u32,
    #[command(flatten)]
    node: NodeArgs,
}

/// Where and how the benchmark's node runs.
#[derive(Debug, clap::Args)]
struct NodeArgs {
    /// An empty or new directory to work in, kept afterwards (default: a fresh directory
    /// under the system temp directory, removed at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Run mink without fsync (and, for `bench log`, compare with an IPC file that is
    /// never synced).
    #[arg(long)]
    no_sync: bool,
}

impl NodeArgs {
    fn sync(&self) -> bool {
        !self.no_sync
    }

    /// The node's configuration in `scratch`, with a log cache of `cache_bytes` per bucket.
    fn config(&self, scratch: &Scratch, cache_bytes: u64) -> NodeConfig {
        let mut config = NodeConfig::new(scratch.path.join("node"));
        config.log.sync = self.sync();
        config.log.cache_bytes = cache_bytes;
        config
    }

    /// How the node runs, for the heading of the results.
    fn describe(&self, config: &NodeConfig, scratch: &Scratch) -> String {
        format!(
            "fsync {}, log cache {} MB per bucket, dir {}",
            if self.sync() { "on" } else { "off" },
            config.log.cache_bytes >> 20,
            scratch.path.display()
        )
    }
}

/// Rows per batch of the throughput figures.
const BATCH_ROWS: usize = 10_000;
/// Batches per `append` call of each writer task.
const BATCHES_PER_CALL: usize = 4;
/// Bucket counts of the append figure.
const APPEND_BUCKETS: [u32; 2] = [1, 8];
/// Length of every `name` value.
const NAME_LEN: usize = 20;
/// Appends measured by the tail figure, after the uncounted warm-up ones.
const TAIL_BATCHES: usize = 500;
const TAIL_WARMUP: usize = 10;
const TAIL_ROWS: usize = 100;
/// `max_wait` of each tail poll.
const TAIL_WAIT: Duration = Duration::from_secs(1);
/// How long the writer waits for the tail reader to have its batch before giving up.
const TAIL_TIMEOUT: Duration = Duration::from_secs(10);
/// [`MinkClient::write`] calls in flight at once in the upsert figure.
const WRITES_IN_FLIGHT: usize = 4;
/// In the update phase, one row in this many updates an existing key.
const UPDATE_EVERY: usize = 10;
/// Lookup calls measured per lookup size: (keys per call, calls).
const LOOKUPS: [(usize, usize); 2] = [(1, 2000), (100, 500)];
/// Uncounted calls before each latency measurement of the lookup figure.
const CALL_WARMUP: usize = 20;
/// Rounds of the snapshot and union read figures; each throughput is the median of its
/// rounds.
const ROUNDS: usize = 3;
/// `lake.freshness` of the table tiered only on demand: longer than the benchmark, so the
/// node's tiering service never gets to it.
const ON_DEMAND_FRESHNESS: Duration = Duration::from_secs(3600);
/// One row in this many of the union read is in the log, the others in the lake.
const LOG_SHARE: usize = 100;
/// The column of the projected union read: `price`.
const PROJECTED_COLUMN: usize = 3;
/// `lake.freshness` of the table of the freshness figure.
const FRESHNESS: Duration = Duration::from_secs(2);
/// How long the freshness figure writes.
const FRESH_WRITING: Duration = Duration::from_secs(20);
/// Rows per write of the freshness figure.
const FRESH_BATCH_ROWS: usize = 1_000;
/// How often the freshness figure samples the high watermarks.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// Runs the benchmark the arguments name.
pub(crate) async fn run(args: BenchArgs) -> Result<(), CliError> {
    match args.bench {
        Bench::Log(args) => run_log(args).await,
        Bench::Kv(args) => run_kv(args).await,
        Bench::Lake(args) => run_lake(args).await,
        Bench::PkLake(args) => pk_lake::run(args).await,
        Bench::Sql(args) => sql::run(args).await,
        Bench::TableChanges(args) => table_changes::run(args).await,
        Bench::FlightSql(args) => flight_sql::run(args).await,
    }
}

/// The scratch directory, the generated rows and a node configuration whose log cache
/// holds them all.
fn prepare(node: &NodeArgs, rows: usize) -> Result<(Scratch, Data, NodeConfig), CliError> {
    let scratch = Scratch::new(node.dir.clone())?;
    eprintln!("bench: generating {rows} rows");
    let data = Data::generate(rows)?;
    let config = node.config(&scratch, 2 * data.memory_bytes() + (64 << 20));
    Ok((scratch, data, config))
}

async fn run_log(args: LogArgs) -> Result<(), CliError> {
    if args.rows == 0 {
        return Err(CliError::Usage("--rows must be at least 1".into()));
    }
    let sync = args.node.sync();
    // The cache holds the whole 1-bucket table, so its first scan is served from it.
    let (scratch, data, config) = prepare(&args.node, args.rows)?;
    println!(
        "mink bench log: {} rows ({} MB in memory) in batches of {BATCH_ROWS}, {}",
        data.rows,
        data.memory_bytes() / 1_000_000,
        args.node.describe(&config, &scratch)
    );
    let running = Running::start(config).await?;
    let ipc = append_figure(&running, &data, &scratch.path, sync).await?;
    let running = scan_figure(running, &data, &ipc).await?;
    tail_figure(&running, &data.schema, &scratch.path, sync).await?;
    running.stop().await?;
    Ok(())
}

/// The baseline IPC file of the append figure, read back by the scan figure.
#[derive(Debug)]
struct IpcFile {
    path: PathBuf,
    bytes: u64,
}

/// Figure 1: append throughput to 1 and to 8 buckets, against IPC file writes.
async fn append_figure(
    running: &Running,
    data: &Data,
    dir: &Path,
    sync: bool,
) -> Result<IpcFile, CliError> {
    let modes = if sync {
        vec![Fsync::EachBatch, Fsync::AtEnd]
    } else {
        vec![Fsync::Never]
    };
    let mut baselines = Vec::new();
    let mut file = None;
    for mode in modes {
        let path = dir.join(format!("baseline-{mode:?}.arrows"));
        let (written, elapsed) = {
            let (path, batches) = (path.clone(), data.batches.clone());
            measure(
                mode.label(),
                blocking(move || write_ipc(&path, &batches, mode)),
            )
            .await?
        };
        let figure = Throughput::new(data.rows, written.bytes, elapsed);
        report(&format!("baseline {}", mode.label()), figure, &[]);
        baselines.push((mode.label(), figure));
        file.get_or_insert(IpcFile {
            path,
            bytes: written.bytes,
        });
    }
    let file = file.ok_or_else(|| CliError::Usage("no baseline was written".into()))?;
    for buckets in APPEND_BUCKETS {
        let table = create_table(
            &running.client,
            &log_table(buckets),
            buckets,
            &data.schema,
            &[],
        )
        .await?
        .path;
        let parts = split(&data.batches, buckets);
        let label = format!(
            "append {buckets} bucket{}",
            if buckets == 1 { "" } else { "s" }
        );
        let ((), elapsed) = measure(&label, append_parts(&running.client, &table, parts)).await?;
        let figure = Throughput::new(data.rows, file.bytes, elapsed);
        let ratios: Vec<String> = baselines
            .iter()
            .map(|(name, baseline)| format!("vs {name} {:.2}", figure.ratio_to(baseline)))
            .collect();
        report(&label, figure, &ratios);
    }
    Ok(file)
}

/// Figure 2: scan throughput from the log cache and from cold segments, against reading
/// the IPC file. Restarts the node; returns the restarted one.
async fn scan_figure(running: Running, data: &Data, ipc: &IpcFile) -> Result<Running, CliError> {
    let bucket = BucketId::new(&log_table(1), 0);
    let path = ipc.path.clone();
    let (rows, elapsed) = measure("read the IPC file", blocking(move || read_ipc(&path))).await?;
    check_rows("the IPC file", rows, data.rows)?;
    let baseline = Throughput::new(rows, ipc.bytes, elapsed);
    report("baseline IPC read", baseline, &[]);
    let (rows, elapsed) = measure(
        "scan from the log cache",
        scan_bucket(&running.client, &bucket),
    )
    .await?;
    check_rows("the cached scan", rows, data.rows)?;
    let figure = Throughput::new(rows, ipc.bytes, elapsed);
    let ratio = format!("vs IPC read {:.2}", figure.ratio_to(&baseline));
    report("scan log cache", figure, &[ratio]);
    let (running, _) = measure("restart the node", running.restart()).await?;
    let (rows, elapsed) =
        measure("scan cold segments", scan_bucket(&running.client, &bucket)).await?;
    check_rows("the cold scan", rows, data.rows)?;
    let figure = Throughput::new(rows, ipc.bytes, elapsed);
    let ratio = format!("vs IPC read {:.2}", figure.ratio_to(&baseline));
    report("scan cold segments", figure, &[ratio]);
    Ok(running)
}

/// Figure 3: latency from a write (its start, its acknowledgement) to a tail reader
/// having the batch.
async fn tail_figure(
    running: &Running,
    schema: &SchemaRef,
    dir: &Path,
    sync: bool,
) -> Result<(), CliError> {
    let table = create_table(
        &running.client,
        &TablePath::new("bench", "tail"),
        1,
        schema,
        &[],
    )
    .await?;
    let bucket = BucketId::new(&table.path, 0);
    let mut rng = XorShift::new(0x7a11);
    let batches = (0..TAIL_WARMUP + TAIL_BATCHES)
        .map(|i| make_batch(schema, (i * TAIL_ROWS) as i64, TAIL_ROWS, &mut rng))
        .collect::<Result<Vec<_>, _>>()?;
    let end = (batches.len() * TAIL_ROWS) as i64;
    let mut tailer = running.client.tail(&bucket, &[]).await?;
    let (received, mut receipts) = mpsc::unbounded_channel();
    let mut reader = JoinSet::new();
    reader.spawn(async move {
        let mut offset = 0;
        while offset < end {
            let answer = tailer.poll(offset, TAIL_WAIT, 0).await?;
            let now = Instant::now();
            for batch in &answer.batches {
                // The writer stops listening only when it has failed.
                let _ = received.send((batch.metadata.base_offset, now));
            }
            offset = answer.next_offset;
        }
        Ok::<(), CliError>(())
    });
    eprintln!("bench: tail latency, {TAIL_BATCHES} appends of {TAIL_ROWS} rows");
    let samples =
        match write_and_wait(&running.client, &bucket, batches.clone(), &mut receipts).await {
            Ok(samples) => samples,
            Err(error) => {
                // Report the reader's own failure when that is why the writer gave up.
                reader.abort_all();
                return match reader.join_next().await {
                    Some(Ok(Err(reader_error))) => Err(reader_error),
                    _ => Err(error),
                };
            }
        };
    if let Some(done) = reader.join_next().await {
        done.map_err(join_error)??;
    }
    let (ack_to_tail, write_to_tail): (Vec<f64>, Vec<f64>) =
        samples.into_iter().skip(TAIL_WARMUP).unzip();
    let mode = if sync { Fsync::EachBatch } else { Fsync::Never };
    let path = dir.join("baseline-tail.arrows");
    let written = blocking(move || write_ipc(&path, &batches, mode)).await?;
    let baseline = Latency::new(written.batch_ms.into_iter().skip(TAIL_WARMUP).collect());
    let write_to_tail = Latency::new(write_to_tail);
    let name = if sync { "IPC write+fsync" } else { "IPC write" };
    report(
        &format!("baseline {name}"),
        format!("{baseline}   (one {TAIL_ROWS}-row batch)"),
        &[],
    );
    report("tail ack -> tailer", Latency::new(ack_to_tail), &[]);
    let ratio = format!("vs {name} {}", write_to_tail.ratio_to(&baseline));
    report("tail write -> tailer", write_to_tail, &[ratio]);
    Ok(())
}

/// Appends each batch alone and waits for the tail reader to report it; returns, per
/// batch, (ack -> tailer, write start -> tailer) in milliseconds.
async fn write_and_wait(
    client: &MinkClient,
    bucket: &BucketId,
    batches: Vec<RecordBatch>,
    receipts: &mut mpsc::UnboundedReceiver<(i64, Instant)>,
) -> Result<Vec<(f64, f64)>, CliError> {
    let mut samples = Vec::with_capacity(batches.len());
    for batch in batches {
        let start = Instant::now();
        let acks = client.append(bucket, vec![batch]).await?;
        let acked = Instant::now();
        let [ack] = acks.as_slice() else {
            return Err(ClientError::Protocol(format!(
                "one batch sent, {} acknowledged",
                acks.len()
            ))
            .into());
        };
        let received = loop {
            match tokio::time::timeout(TAIL_TIMEOUT, receipts.recv()).await {
                Ok(Some((offset, at))) if offset == ack.base_offset => break at,
                Ok(Some(_earlier)) => {}
                Ok(None) => {
                    return Err(
                        ClientError::Protocol("the tail reader stopped early".into()).into(),
                    );
                }
                Err(_elapsed) => {
                    return Err(ClientError::Protocol(format!(
                        "the tail reader did not get offset {} within {TAIL_TIMEOUT:?}",
                        ack.base_offset
                    ))
                    .into());
                }
            }
        };
        samples.push((signed_ms(acked, received), signed_ms(start, received)));
    }
    Ok(samples)
}

async fn run_kv(args: KvArgs) -> Result<(), CliError> {
    if args.keys == 0 {
        return Err(CliError::Usage("--keys must be at least 1".into()));
    }
    if args.buckets == 0 {
        return Err(CliError::Usage("--buckets must be at least 1".into()));
    }
    let scratch = Scratch::new(args.node.dir.clone())?;
    eprintln!("bench: generating {} keys and their upserts", args.keys);
    let data = KvData::generate(args.keys)?;
    // Room for the largest log, so the Scan baselines are served from the cache.
    let memory = data.load.memory_bytes() + data.upserts.memory_bytes();
    let config = args.node.config(&scratch, 2 * memory + (64 << 20));
    println!(
        "mink bench kv: {} keys, then {} upserts ({} of existing keys) in batches of {BATCH_ROWS}, {} bucket{}, {}",
        data.load.rows,
        data.upserts.rows,
        data.updates,
        args.buckets,
        if args.buckets == 1 { "" } else { "s" },
        args.node.describe(&config, &scratch)
    );
    let running = Running::start(config).await?;
    let table = upsert_figure(&running, &data, args.buckets).await?;
    lookup_figure(&running, &table, data.load.rows).await?;
    snapshot_figure(&running, &table, data.final_rows()).await?;
    running.stop().await?;
    Ok(())
}

/// Figure 1: upsert throughput, loading new keys and then with 10% updates, against
/// writing the same batches to a log table. Returns the primary-key table, loaded.
async fn upsert_figure(
    running: &Running,
    data: &KvData,
    buckets: u32,
) -> Result<TableDescriptor, CliError> {
    let client = &running.client;
    let schema = &data.load.schema;
    let log_path = TablePath::new("bench", "kv_log");
    let log = create_table(client, &log_path, buckets, schema, &[]).await?;
    let kv_path = TablePath::new("bench", "kv");
    let kv = create_table(client, &kv_path, buckets, schema, &["id"]).await?;
    // Each phase with the rows of it that update a key: they log -U and +U, inserts +I.
    let (load, upserts) = (&data.load, &data.upserts);
    let phases = [
        ("load", "upsert load (all keys new)", load, 0),
        ("10% updates", "upsert 10% updates", upserts, data.updates),
    ];
    // The log table first, so its writes never share the machine with the KV store's
    // background work.
    let mut baselines = Vec::new();
    for (phase, _, rows, _) in phases {
        let write = write_batches(client, &log, &rows.batches);
        let ((), elapsed) = measure(&format!("log write: {phase}"), write).await?;
        baselines.push(Throughput::new(rows.rows, ipc_len(&rows.batches)?, elapsed));
    }
    check_logged(client, &log, data.load.rows + data.upserts.rows).await?;
    let mut changelog_rows = 0;
    for ((phase, label, rows, updates), baseline) in phases.into_iter().zip(baselines) {
        let write = write_batches(client, &kv, &rows.batches);
        let ((), elapsed) = measure(&format!("upsert: {phase}"), write).await?;
        changelog_rows += rows.rows + updates;
        check_logged(client, &kv, changelog_rows).await?;
        let figure = Throughput::new(rows.rows, baseline.bytes, elapsed);
        report(&format!("baseline log write: {phase}"), baseline, &[]);
        let ratio = format!("vs log write {:.2}", figure.ratio_to(&baseline));
        report(label, figure, &[ratio]);
    }
    Ok(kv)
}

/// Figure 2: lookup latency of 1 and of 100 random existing keys per call, against a Scan
/// of one cached batch of as many rows.
async fn lookup_figure(
    running: &Running,
    table: &TableDescriptor,
    keys: usize,
) -> Result<(), CliError> {
    let client = &running.client;
    let schema = table.schema();
    let ping_path = TablePath::new("bench", "ping");
    let ping = create_table(client, &ping_path, 1, schema, &[]).await?;
    let bucket = &BucketId::new(&ping.path, 0);
    let mut rng = XorShift::new(0x100c);
    // One batch per lookup size, each at the offset its ack gives.
    let batches = LOOKUPS
        .iter()
        .map(|&(rows, _)| make_batch(schema, 0, rows, &mut rng))
        .collect::<Result<Vec<_>, _>>()?;
    let acks = client.append(bucket, batches).await?;
    let key_schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    for (&(per_call, calls), ack) in LOOKUPS.iter().zip(&acks) {
        let offset = ack.base_offset;
        // max_bytes 1: a Scan answers with at least one batch, and here with only that one.
        let scan = move |_| async move {
            Ok::<_, CliError>(client.scan(bucket, offset, 1, &[]).await?.num_rows())
        };
        let lookups = &(0..CALL_WARMUP + calls)
            .map(|_| {
                let ids = (0..per_call).map(|_| (rng.next_u64() % keys as u64) as i64);
                let ids = Arc::new(Int64Array::from_iter_values(ids));
                RecordBatch::try_new(Arc::clone(&key_schema), vec![ids])
            })
            .collect::<Result<Vec<_>, _>>()?;
        let lookup = move |i: usize| async move {
            let found = client.lookup(table, &lookups[i], &[]).await?;
            Ok::<_, CliError>(found.rows.num_rows())
        };
        let label = format!(
            "lookup {per_call} key{}, {calls} calls",
            if per_call == 1 { "" } else { "s" }
        );
        let (baseline, figure) = paired_latency(&label, calls, per_call, scan, lookup).await?;
        let ratio = format!("vs scan {}", figure.ratio_to(&baseline));
        let name = format!("baseline scan {per_call}-row batch");
        report(&name, baseline, &[]);
        report(&label, figure, &[ratio]);
    }
    Ok(())
}

/// Figure 3: Snapshot throughput, against a Scan of a log table holding the same rows.
async fn snapshot_figure(
    running: &Running,
    table: &TableDescriptor,
    rows: usize,
) -> Result<(), CliError> {
    let client = &running.client;
    let snapshot = async || {
        let snapshots = buckets_of(table)
            .into_iter()
            .map(|bucket| async move { client.snapshot(&bucket, &[], BATCH_ROWS as u32).await });
        let (answers, elapsed) =
            measure("snapshot", async { Ok(try_join_all(snapshots).await?) }).await?;
        let snapshot_rows = answers.iter().map(|answer| answer.num_rows()).sum();
        check_rows("the snapshot", snapshot_rows, rows)?;
        Ok::<_, CliError>((answers, elapsed))
    };
    let (answers, elapsed) = snapshot().await?;
    let mut snapshots = vec![elapsed];
    let parts: Vec<Vec<RecordBatch>> = answers.into_iter().map(|a| a.batches).collect();
    let bytes = ipc_len(parts.iter().flatten())?;
    let copy_path = TablePath::new("bench", "kv_rows");
    let copy = create_table(client, &copy_path, table.bucket_num, table.schema(), &[]).await?;
    append_parts(client, &copy.path, parts).await?;
    let scan = async || {
        let scans = buckets_of(&copy)
            .into_iter()
            .map(|bucket| async move { scan_bucket(client, &bucket).await });
        let (scanned, elapsed) = measure("scan the same rows", async {
            Ok(try_join_all(scans).await?.into_iter().sum())
        })
        .await?;
        check_rows("the scan of the snapshot's rows", scanned, rows)?;
        Ok::<_, CliError>(elapsed)
    };
    // Alternate, so both see the same conditions.
    let mut scans = Vec::new();
    for round in 1..=ROUNDS {
        scans.push(scan().await?);
        if round < ROUNDS {
            snapshots.push(snapshot().await?.1);
        }
    }
    let figure = Throughput::new(rows, bytes, median(snapshots));
    let baseline = Throughput::new(rows, bytes, median(scans));
    report("baseline scan of the same rows", baseline, &[]);
    let ratio = format!("vs scan {:.2}", figure.ratio_to(&baseline));
    report("snapshot", figure, &[ratio]);
    Ok(())
}

async fn run_lake(args: LakeArgs) -> Result<(), CliError> {
    if args.rows == 0 {
        return Err(CliError::Usage("--rows must be at least 1".into()));
    }
    if args.buckets == 0 {
        return Err(CliError::Usage("--buckets must be at least 1".into()));
    }
    if args.write_rate == 0 {
        return Err(CliError::Usage("--write-rate must be at least 1".into()));
    }
    // The cache holds every bucket's log, so tiering and union reads find it there.
    let (scratch, data, config) = prepare(&args.node, args.rows)?;
    println!(
        "mink bench lake: {} rows ({} MB in memory) in batches of {BATCH_ROWS}, {} bucket{}, {}",
        data.rows,
        data.memory_bytes() / 1_000_000,
        args.buckets,
        if args.buckets == 1 { "" } else { "s" },
        args.node.describe(&config, &scratch)
    );
    let running = Running::start(config).await?;
    let path = TablePath::new("bench", "lake");
    let table = create_lake_table(
        &running.client,
        &path,
        args.buckets,
        &data.schema,
        ON_DEMAND_FRESHNESS,
    )
    .await?;
    let files = tier_figure(&running, &table, &data, &scratch.path).await?;
    union_figure(&running.client, &table, &data, files, &scratch.path).await?;
    freshness_figure(&running, &data.schema, args.buckets, args.write_rate).await?;
    running.stop().await?;
    Ok(())
}

/// Figure 1: one tiering round of the whole table, against writing its rows as Parquet
/// files. Returns the baseline files of each bucket (none for a bucket without rows).
async fn tier_figure(
    running: &Running,
    table: &TableDescriptor,
    data: &Data,
    dir: &Path,
) -> Result<Vec<Vec<PathBuf>>, CliError> {
    let parts = split(&data.batches, table.bucket_num);
    let append = append_parts(&running.client, &table.path, parts.clone());
    measure("append the rows", append).await?;
    let bytes = ipc_len(&data.batches)?;
    let files: Vec<Vec<PathBuf>> = parts
        .iter()
        .enumerate()
        .map(|(b, part)| {
            let path = dir.join(format!("baseline-bucket{b}.parquet"));
            if part.is_empty() { vec![] } else { vec![path] }
        })
        .collect();
    let write = {
        let files = files.clone();
        blocking(move || {
            files
                .iter()
                .zip(&parts)
                .flat_map(|(paths, part)| paths.iter().map(|path| write_parquet(path, part)))
                .sum::<Result<u64, CliError>>()
        })
    };
    let (file_bytes, elapsed) = measure("write the Parquet files", write).await?;
    let baseline = Throughput::new(data.rows, bytes, elapsed);
    let count = files.iter().flatten().count();
    report(
        "baseline Parquet write",
        format!("{baseline}   ({count} files, {})", megabytes(file_bytes)),
        &[],
    );
    let tier = async { Ok(running.client.tier(&table.path).await?) };
    let (reply, elapsed) = measure("tier the table (one round)", tier).await?;
    check_rows("the tiering round", reply.rows as usize, data.rows)?;
    let rounds = lake_rounds(running, &table.path).await?;
    let lake_bytes = rounds.last().map_or(0, |round| round.file_bytes);
    let figure = Throughput::new(data.rows, bytes, elapsed);
    let ratio = format!("vs Parquet write {:.2}", figure.ratio_to(&baseline));
    report(
        "tier (one round)",
        format!(
            "{figure}   ({} files, {})",
            reply.files,
            megabytes(lake_bytes)
        ),
        &[ratio],
    );
    Ok(files)
}

/// Figure 2: union reads of the table with one row in [`LOG_SHARE`] left in the log, all
/// columns and one, against reading the same rows from Parquet files.
async fn union_figure(
    client: &MinkClient,
    table: &TableDescriptor,
    data: &Data,
    mut files: Vec<Vec<PathBuf>>,
    dir: &Path,
) -> Result<(), CliError> {
    let tail = tail_parts(&data.schema, data.rows, table.bucket_num)?;
    let tail_rows: usize = tail.iter().flatten().map(RecordBatch::num_rows).sum();
    append_parts(client, &table.path, tail.clone()).await?;
    for ((b, part), paths) in tail.iter().enumerate().zip(&mut files) {
        if !part.is_empty() {
            let path = dir.join(format!("baseline-bucket{b}-tail.parquet"));
            let (file, part) = (path.clone(), part.clone());
            blocking(move || write_parquet(&file, &part)).await?;
            paths.push(path);
        }
    }
    let rows = data.rows + tail_rows;
    let all: Vec<&RecordBatch> = data.batches.iter().chain(tail.iter().flatten()).collect();
    let column = data.schema.field(PROJECTED_COLUMN).name();
    for (columns, what) in [
        (vec![], String::new()),
        (vec![PROJECTED_COLUMN], format!(", {column}")),
    ] {
        let projected = all
            .iter()
            .map(|batch| project(batch, &columns))
            .collect::<Result<Vec<_>, _>>()?;
        let bytes = ipc_len(&projected)?;
        drop(projected);
        let union_columns: Vec<u32> = columns.iter().map(|c| *c as u32).collect();
        // Alternate, so both see the same conditions.
        let (mut baselines, mut unions, mut plans) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let read = read_parquet_buckets(&files, &columns);
            let (read, elapsed) = measure(&format!("read the Parquet files{what}"), read).await?;
            check_rows("the Parquet files", read, rows)?;
            baselines.push(elapsed);
            let union = union_buckets(client, table, &union_columns);
            let ((read, bucket_plans), elapsed) =
                measure(&format!("union read{what}"), union).await?;
            check_rows("the union read", read, rows)?;
            unions.push(elapsed);
            plans = bucket_plans;
        }
        let log_rows: i64 = plans.iter().map(|plan| plan.log_to - plan.log_from).sum();
        check_rows(
            "the log part of the union read",
            log_rows as usize,
            tail_rows,
        )?;
        let lake_files: u64 = plans.iter().map(|plan| plan.lake_files).sum();
        let count = files.iter().flatten().count();
        let baseline = Throughput::new(rows, bytes, median(baselines));
        let figure = Throughput::new(rows, bytes, median(unions));
        report(
            &format!("baseline Parquet read{what}"),
            format!("{baseline}   ({count} files)"),
            &[],
        );
        let ratio = format!("vs Parquet read {:.2}", figure.ratio_to(&baseline));
        report(
            &format!("union read{what}"),
            format!("{figure}   ({lake_files} lake files + {log_rows} log rows)"),
            &[ratio],
        );
    }
    Ok(())
}

/// Figure 3: the lake's lag behind the log while one task writes at a steady rate and the
/// node's service tiers the table every [`FRESHNESS`].
async fn freshness_figure(
    running: &Running,
    schema: &SchemaRef,
    buckets: u32,
    write_rate: u32,
) -> Result<(), CliError> {
    let client = &running.client;
    let path = TablePath::new("bench", "lake_fresh");
    let table = create_lake_table(client, &path, buckets, schema, FRESHNESS).await?;
    let bucket_ids = buckets_of(&table);
    let writing = AtomicBool::new(true);
    let writer = async {
        let writes = write_at_rate(client, &table, write_rate).await;
        writing.store(false, Ordering::Relaxed);
        writes
    };
    let sampler = sample_high_watermarks(client, &bucket_ids, &writing);
    let what = format!("write {write_rate} rows/s for {FRESH_WRITING:?}, sampling the lag");
    let ((writes, samples), _) = measure(&what, future::try_join(writer, sampler)).await?;
    check_logged(client, &table, writes.rows).await?;
    let rounds = lake_rounds(running, &path).await?;
    let rate = writes.rows as f64 / writes.elapsed.as_secs_f64();
    let lags: Vec<f64> = samples
        .iter()
        .map(|sample| {
            let seam = rounds
                .iter()
                .rev()
                .find(|round| round.committed_ms <= sample.at_ms)
                .map_or(0, |round| round.offsets.get(&bucket_ids[sample.bucket]));
            (sample.high_watermark - seam) as f64
        })
        .collect();
    let committed: Vec<i64> = rounds
        .iter()
        .map(|round| round.committed_ms)
        .filter(|ms| (writes.from_ms..=writes.to_ms).contains(ms))
        .collect();
    let intervals = Spread::new(
        committed
            .windows(2)
            .map(|pair| (pair[1] - pair[0]) as f64 / 1e3)
            .collect(),
    );
    report(
        "writes",
        format!(
            "{:.1}k rows/s for {:.1} s in {FRESH_BATCH_ROWS}-row batches, lake.freshness {} s",
            rate / 1e3,
            writes.elapsed.as_secs_f64(),
            FRESHNESS.as_secs_f64()
        ),
        &[],
    );
    report(
        "tiering rounds while writing",
        format!(
            "{} committed, interval p50 {:.2} s, max {:.2} s",
            committed.len(),
            intervals.p50,
            intervals.max
        ),
        &[],
    );
    let rows = Spread::new(lags);
    report(
        "lake lag, rows per bucket",
        format!(
            "p50 {:>7.0}    p99 {:>7.0}    max {:>7.0}     ({} samples)",
            rows.p50, rows.p99, rows.max, rows.count
        ),
        &[],
    );
    // Each bucket gets an equal share of the batches.
    let seconds = rows.scaled(f64::from(buckets) / rate);
    let ratio = format!(
        "p99 / freshness {:.2}",
        seconds.p99 / FRESHNESS.as_secs_f64()
    );
    report(
        "lake lag, seconds",
        format!(
            "p50 {:>7.3} s  p99 {:>7.3} s  max {:>7.3} s",
            seconds.p50, seconds.p99, seconds.max
        ),
        &[ratio],
    );
    Ok(())
}

/// What [`write_at_rate`] wrote, and when.
#[derive(Debug)]
struct Writes {
    rows: usize,
    /// From the first write to the last acknowledgement.
    elapsed: Duration,
    /// The first write and the last acknowledgement, in ms since the epoch.
    from_ms: i64,
    to_ms: i64,
}

/// Writes the table through [`MinkClient::write`], [`FRESH_BATCH_ROWS`] rows a call, `rate`
/// rows per second for [`FRESH_WRITING`]. A late call is followed at once by the next
/// ones, so the average rate holds.
async fn write_at_rate(
    client: &MinkClient,
    table: &TableDescriptor,
    rate: u32,
) -> Result<Writes, CliError> {
    let period = Duration::from_secs_f64(FRESH_BATCH_ROWS as f64 / f64::from(rate));
    let calls = (FRESH_WRITING.as_secs_f64() / period.as_secs_f64()).ceil() as usize;
    let mut rng = XorShift::new(0xf7e5);
    let mut ticks = tokio::time::interval(period);
    let (start, from_ms) = (Instant::now(), epoch_ms());
    for call in 0..calls {
        let first_id = (call * FRESH_BATCH_ROWS) as i64;
        let batch = make_batch(table.schema(), first_id, FRESH_BATCH_ROWS, &mut rng)?;
        ticks.tick().await;
        client.write(table, &batch).await?;
    }
    Ok(Writes {
        rows: calls * FRESH_BATCH_ROWS,
        elapsed: start.elapsed(),
        from_ms,
        to_ms: epoch_ms(),
    })
}

/// A bucket's high watermark and when it was asked for.
#[derive(Debug)]
struct Sample {
    /// When, in ms since the epoch.
    at_ms: i64,
    /// Index of the bucket in the table's buckets.
    bucket: usize,
    high_watermark: i64,
}

/// Every [`SAMPLE_EVERY`] while `writing`, the high watermark of every bucket.
async fn sample_high_watermarks(
    client: &MinkClient,
    buckets: &[BucketId],
    writing: &AtomicBool,
) -> Result<Vec<Sample>, CliError> {
    let mut samples = Vec::new();
    let mut ticks = tokio::time::interval(SAMPLE_EVERY);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if !writing.load(Ordering::Relaxed) {
            return Ok(samples);
        }
        for (bucket, id) in buckets.iter().enumerate() {
            let at_ms = epoch_ms();
            let high_watermark = client.list_offsets(id, Spec::Latest(true)).await?;
            samples.push(Sample {
                at_ms,
                bucket,
                high_watermark,
            });
        }
    }
}

/// A committed tiering round, as the lake's snapshot history has it.
#[derive(Debug)]
struct LakeRound {
    /// The Iceberg snapshot's timestamp, in ms since the epoch.
    committed_ms: i64,
    /// Where each bucket's log was tiered up to (the seam).
    offsets: BucketOffsets,
    /// Bytes of the data files the round added.
    file_bytes: u64,
}

/// Every committed tiering round of a table, oldest first, from its Iceberg snapshots.
async fn lake_rounds(running: &Running, table: &TablePath) -> Result<Vec<LakeRound>, CliError> {
    let lake = running.node.lake().await?;
    let lake_table = lake.load(table).await.map_err(NodeError::from)?;
    let mut rounds = lake_table
        .metadata()
        .snapshots()
        .map(|snapshot| {
            let summary = &snapshot.summary().additional_properties;
            let offsets = summary.get(BUCKET_OFFSETS_PROPERTY).ok_or_else(|| {
                NodeError::Corrupt(format!(
                    "lake snapshot {} of {table} has no {BUCKET_OFFSETS_PROPERTY}",
                    snapshot.snapshot_id()
                ))
            })?;
            Ok(LakeRound {
                committed_ms: snapshot.timestamp_ms(),
                offsets: BucketOffsets::from_json(offsets).map_err(NodeError::from)?,
                file_bytes: summary
                    .get("added-files-size")
                    .and_then(|size| size.parse().ok())
                    .unwrap_or(0),
            })
        })
        .collect::<Result<Vec<_>, CliError>>()?;
    rounds.sort_by_key(|round| round.committed_ms);
    Ok(rounds)
}

/// `rows / LOG_SHARE` rows (at least one) with ids from `rows`: one batch per bucket, as
/// even as can be (none for a bucket left without rows).
fn tail_parts(
    schema: &SchemaRef,
    rows: usize,
    buckets: u32,
) -> Result<Vec<Vec<RecordBatch>>, CliError> {
    let (tail, buckets) = ((rows / LOG_SHARE).max(1), buckets as usize);
    let mut rng = XorShift::new(0x7a1e);
    let mut first_id = rows as i64;
    (0..buckets)
        .map(|b| {
            let count = tail / buckets + usize::from(b < tail % buckets);
            if count == 0 {
                return Ok(vec![]);
            }
            let batch = make_batch(schema, first_id, count, &mut rng)?;
            first_id += count as i64;
            Ok(vec![batch])
        })
        .collect()
}

/// Union reads of every bucket at once; returns the rows read and each bucket's plan.
async fn union_buckets(
    client: &MinkClient,
    table: &TableDescriptor,
    columns: &[u32],
) -> Result<(usize, Vec<UnionPlan>), CliError> {
    let reads = buckets_of(table).into_iter().map(|bucket| async move {
        let answer = client.union(&bucket, columns, &[]).await?;
        Ok::<_, CliError>((answer.num_rows(), answer.plan))
    });
    let answers = try_join_all(reads).await?;
    Ok((
        answers.iter().map(|(rows, _)| rows).sum(),
        answers.into_iter().map(|(_, plan)| plan).collect(),
    ))
}

/// Reads every bucket's Parquet files, one blocking task per bucket, all at once, only the
/// columns at `columns` (empty: all); returns the rows read.
async fn read_parquet_buckets(
    files: &[Vec<PathBuf>],
    columns: &[usize],
) -> Result<usize, CliError> {
    let reads = files.iter().map(|paths| {
        let (paths, columns) = (paths.clone(), columns.to_vec());
        blocking(move || read_parquet(&paths, &columns))
    });
    Ok(try_join_all(reads).await?.into_iter().sum())
}

/// Writes batches as one Parquet file with the lake writer's properties (zstd at its
/// default level), without fsync; returns the file's length.
fn write_parquet(path: &Path, batches: &[RecordBatch]) -> Result<u64, CliError> {
    let context = || format!("writing {}", path.display());
    let schema = batches
        .first()
        .map(RecordBatch::schema)
        .ok_or_else(|| CliError::Usage("nothing to write".into()))?;
    let file = File::create(path).map_err(CliError::io(context()))?;
    let properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build();
    let mut writer = ArrowWriter::try_new(BufWriter::new(file), schema, Some(properties))?;
    for batch in batches {
        writer.write(batch)?;
    }
    writer.close()?;
    let metadata = std::fs::metadata(path).map_err(CliError::io(context()))?;
    Ok(metadata.len())
}

/// Reads Parquet files, only the columns at `columns` (empty: all); returns the rows.
fn read_parquet(paths: &[PathBuf], columns: &[usize]) -> Result<usize, CliError> {
    let mut rows = 0;
    for path in paths {
        let file = File::open(path).map_err(CliError::io(format!("reading {}", path.display())))?;
        let mut builder = ParquetRecordBatchReaderBuilder::try_new(file)?;
        if !columns.is_empty() {
            let mask = ProjectionMask::roots(builder.parquet_schema(), columns.iter().copied());
            builder = builder.with_projection(mask);
        }
        for batch in builder.build()? {
            rows += batch?.num_rows();
        }
    }
    Ok(rows)
}

/// The columns of `batch` at `columns` (empty: all).
fn project(batch: &RecordBatch, columns: &[usize]) -> Result<RecordBatch, CliError> {
    match columns {
        [] => Ok(batch.clone()),
        columns => Ok(batch.project(columns)?),
    }
}

/// `bytes` as megabytes (10^6 bytes).
fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// Now, in ms since the epoch (the clock of Iceberg's snapshot timestamps).
fn epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Writes `batches` to a table through [`MinkClient::write`], [`WRITES_IN_FLIGHT`] calls
/// at a time.
async fn write_batches(
    client: &MinkClient,
    table: &TableDescriptor,
    batches: &[RecordBatch],
) -> Result<(), CliError> {
    stream::iter(batches)
        .map(|batch| client.write(table, batch))
        .buffer_unordered(WRITES_IN_FLIGHT)
        .try_for_each(|_acks| future::ready(Ok(())))
        .await?;
    Ok(())
}

/// Checks that a table's buckets have logged `expected` rows in all.
async fn check_logged(
    client: &MinkClient,
    table: &TableDescriptor,
    expected: usize,
) -> Result<(), CliError> {
    let buckets = client.list_buckets(&table.path).await?;
    let logged: i64 = buckets.iter().map(|b| b.high_watermark - b.log_start).sum();
    check_rows(
        &format!("the log of {}", table.path),
        logged as usize,
        expected,
    )
}

/// Latencies of `calls` pairs of calls, a baseline call then a measured one, after
/// [`CALL_WARMUP`] uncounted pairs; pairing lets both see the same conditions. Call `i`
/// of either kind returns the rows it got, which must be `rows`.
async fn paired_latency<B, BaselineCall, M, MeasuredCall>(
    what: &str,
    calls: usize,
    rows: usize,
    mut baseline: B,
    mut measured: M,
) -> Result<(Latency, Latency), CliError>
where
    B: FnMut(usize) -> BaselineCall,
    BaselineCall: Future<Output = Result<usize, CliError>>,
    M: FnMut(usize) -> MeasuredCall,
    MeasuredCall: Future<Output = Result<usize, CliError>>,
{
    let pairs = async {
        let mut samples = (Vec::with_capacity(calls), Vec::with_capacity(calls));
        for i in 0..CALL_WARMUP + calls {
            let baseline_ms = timed_call(what, rows, baseline(i)).await?;
            let measured_ms = timed_call(what, rows, measured(i)).await?;
            if i >= CALL_WARMUP {
                samples.0.push(baseline_ms);
                samples.1.push(measured_ms);
            }
        }
        Ok((Latency::new(samples.0), Latency::new(samples.1)))
    };
    Ok(measure(what, pairs).await?.0)
}

/// Makes one call of [`paired_latency`]; returns how long it took, in milliseconds.
async fn timed_call(
    what: &str,
    rows: usize,
    call: impl Future<Output = Result<usize, CliError>>,
) -> Result<f64, CliError> {
    let start = Instant::now();
    let got = call.await?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    check_rows(what, got, rows)?;
    Ok(ms)
}

/// The median of some durations (the upper one of an even count).
fn median(mut durations: Vec<Duration>) -> Duration {
    durations.sort();
    durations
        .get(durations.len() / 2)
        .copied()
        .unwrap_or_default()
}

/// Runs `work`, reporting it on stderr; returns its output and how long it took.
async fn measure<T>(
    what: &str,
    work: impl Future<Output = Result<T, CliError>>,
) -> Result<(T, Duration), CliError> {
    eprintln!("bench: {what} ...");
    let start = Instant::now();
    let output = work.await?;
    let elapsed = start.elapsed();
    eprintln!("bench: {what}: {:.3} s", elapsed.as_secs_f64());
    Ok((output, elapsed))
}

/// Runs blocking file I/O off the runtime's workers.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, CliError> + Send + 'static,
) -> Result<T, CliError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(join_error)?
}

fn join_error(error: tokio::task::JoinError) -> CliError {
    CliError::io("a benchmark task failed")(std::io::Error::other(error))
}

fn check_rows(what: &str, rows: usize, expected: usize) -> Result<(), CliError> {
    if rows == expected {
        return Ok(());
    }
    Err(ClientError::Protocol(format!("{what} returned {rows} rows, expected {expected}")).into())
}

/// A node served on a loopback port in this process, and a client of it.
#[derive(Debug)]
struct Running {
    config: NodeConfig,
    node: Arc<Node>,
    server: mink_node::server::ServerHandle,
    client: MinkClient,
}

impl Running {
    async fn start(config: NodeConfig) -> Result<Self, CliError> {
        let node = Node::open(config.clone())?;
        let server = embedded::start(Arc::clone(&node)).await?;
        let client = MinkClient::connect(&server.addr().to_string()).await?;
        Ok(Self {
            config,
            node,
            server,
            client,
        })
    }

    /// Shuts the server down and drops the node, which releases its data directory.
    async fn stop(self) -> Result<NodeConfig, CliError> {
        let Self {
            config,
            node,
            server,
            client,
        } = self;
        drop(client);
        server.shutdown().await?;
        // The server's aborted background task lets go of the node a moment later.
        let deadline = Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&node) > 1 {
            if Instant::now() > deadline {
                return Err(NodeError::DataDirLocked(config.data_dir.display().to_string()).into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(node);
        Ok(config)
    }

    /// Stops the node and opens it again on the same directory, with an empty log cache.
    async fn restart(self) -> Result<Self, CliError> {
        let config = self.stop().await?;
        Self::start(config).await
    }
}

/// `bench.log<buckets>`: the table of the append figure with that many buckets.
fn log_table(buckets: u32) -> TablePath {
    TablePath::new("bench", format!("log{buckets}"))
}

/// Creates a table: a log table when `primary_key` is empty.
async fn create_table(
    client: &MinkClient,
    path: &TablePath,
    buckets: u32,
    schema: &SchemaRef,
    primary_key: &[&str],
) -> Result<TableDescriptor, CliError> {
    let options = TableOptions {
        bucket_num: buckets,
        ..TableOptions::default()
    };
    create_table_with(client, path, schema, primary_key, options).await
}

/// Creates a log table with a lake, tiered every `freshness` by the node's service.
async fn create_lake_table(
    client: &MinkClient,
    path: &TablePath,
    buckets: u32,
    schema: &SchemaRef,
    freshness: Duration,
) -> Result<TableDescriptor, CliError> {
    let options = TableOptions {
        bucket_num: buckets,
        lake_enabled: true,
        lake_freshness: freshness,
        ..TableOptions::default()
    };
    create_table_with(client, path, schema, &[], options).await
}

async fn create_table_with(
    client: &MinkClient,
    path: &TablePath,
    schema: &SchemaRef,
    primary_key: &[&str],
    options: TableOptions,
) -> Result<TableDescriptor, CliError> {
    let descriptor = TableDescriptor::new(
        path.clone(),
        schema.as_ref().clone(),
        primary_key.iter().map(|c| c.to_string()).collect(),
        vec![],
        options,
    )?;
    Ok(client.create_table(&descriptor, false).await?)
}

/// The keys and buckets of a benchmark's primary-key table, checked.
fn check_pk_table_args(keys: usize, buckets: u32) -> Result<(), CliError> {
    if keys < 100 {
        return Err(CliError::Usage("--keys must be at least 100".into()));
    }
    if buckets == 0 {
        return Err(CliError::Usage("--buckets must be at least 1".into()));
    }
    Ok(())
}

/// Creates `bench.<name>`: a primary-key table (`id`) of `data`'s schema in `buckets`
/// buckets with a lake tiered only on demand.
async fn create_pk_lake_table(
    running: &Running,
    name: &str,
    data: &Data,
    buckets: u32,
) -> Result<TableDescriptor, CliError> {
    let options = TableOptions {
        bucket_num: buckets,
        lake_enabled: true,
        lake_freshness: ON_DEMAND_FRESHNESS,
        ..TableOptions::default()
    };
    let path = TablePath::new("bench", name);
    create_table_with(&running.client, &path, &data.schema, &["id"], options).await
}

/// Every bucket of an unpartitioned table.
fn buckets_of(table: &TableDescriptor) -> Vec<BucketId> {
    (0..table.bucket_num)
        .map(|b| BucketId::new(&table.path, b))
        .collect()
}

/// Batch `i` goes to part `i % buckets`.
fn split(batches: &[RecordBatch], buckets: u32) -> Vec<Vec<RecordBatch>> {
    let buckets = buckets as usize;
    (0..buckets)
        .map(|b| batches.iter().skip(b).step_by(buckets).cloned().collect())
        .collect()
}

/// Appends part `b` to bucket `b`, one writer task per bucket, [`BATCHES_PER_CALL`]
/// batches per call.
async fn append_parts(
    client: &MinkClient,
    table: &TablePath,
    parts: Vec<Vec<RecordBatch>>,
) -> Result<(), CliError> {
    let mut writers = JoinSet::new();
    for (bucket, part) in (0u32..).zip(parts) {
        let client = client.clone();
        let bucket = BucketId::new(table, bucket);
        writers.spawn(async move {
            for call in part.chunks(BATCHES_PER_CALL) {
                client.append(&bucket, call.to_vec()).await?;
            }
            Ok::<(), CliError>(())
        });
    }
    while let Some(done) = writers.join_next().await {
        done.map_err(join_error)??;
    }
    Ok(())
}

/// Scans a bucket from offset 0 to its high watermark; returns the rows read.
async fn scan_bucket(client: &MinkClient, bucket: &BucketId) -> Result<usize, CliError> {
    let (mut offset, mut rows) = (0, 0);
    loop {
        let answer = client.scan(bucket, offset, 0, &[]).await?;
        rows += answer.num_rows();
        offset = answer.next_offset;
        if offset >= answer.high_watermark {
            return Ok(rows);
        }
    }
}

/// When the baseline IPC writer calls `sync_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fsync {
    EachBatch,
    AtEnd,
    Never,
}

impl Fsync {
    fn label(self) -> &'static str {
        match self {
            Self::EachBatch => "IPC+fsync-per-batch",
            Self::AtEnd => "IPC+one-fsync",
            Self::Never => "IPC no fsync",
        }
    }
}

/// What [`write_ipc`] did.
#[derive(Debug)]
struct IpcWritten {
    bytes: u64,
    /// Time of each batch (written, flushed and, per [`Fsync::EachBatch`], synced), in ms.
    batch_ms: Vec<f64>,
}

/// Writes `batches` as one Arrow IPC stream to `path`.
fn write_ipc(path: &Path, batches: &[RecordBatch], fsync: Fsync) -> Result<IpcWritten, CliError> {
    let context = || format!("writing {}", path.display());
    let schema = batches
        .first()
        .map(RecordBatch::schema)
        .ok_or_else(|| CliError::Usage("nothing to write".into()))?;
    let file = File::create(path).map_err(CliError::io(context()))?;
    let mut writer = StreamWriter::try_new(BufWriter::new(file), &schema)?;
    let mut batch_ms = Vec::with_capacity(batches.len());
    for batch in batches {
        let start = Instant::now();
        writer.write(batch)?;
        if fsync == Fsync::EachBatch {
            writer.flush()?;
            writer
                .get_ref()
                .get_ref()
                .sync_data()
                .map_err(CliError::io(context()))?;
        }
        batch_ms.push(start.elapsed().as_secs_f64() * 1e3);
    }
    writer.finish()?;
    writer.flush()?;
    let file = writer.get_ref().get_ref();
    if fsync != Fsync::Never {
        file.sync_data().map_err(CliError::io(context()))?;
    }
    let bytes = file.metadata().map_err(CliError::io(context()))?.len();
    Ok(IpcWritten { bytes, batch_ms })
}

/// Reads an Arrow IPC stream file; returns its rows.
fn read_ipc(path: &Path) -> Result<usize, CliError> {
    let file = File::open(path).map_err(CliError::io(format!("reading {}", path.display())))?;
    let mut rows = 0;
    for batch in StreamReader::try_new_buffered(file, None)? {
        rows += batch?.num_rows();
    }
    Ok(rows)
}

/// Rows and bytes moved in some time.
#[derive(Debug, Clone, Copy)]
struct Throughput {
    rows: usize,
    bytes: u64,
    elapsed: Duration,
}

impl Throughput {
    fn new(rows: usize, bytes: u64, elapsed: Duration) -> Self {
        Self {
            rows,
            bytes,
            elapsed,
        }
    }

    fn rows_per_sec(&self) -> f64 {
        self.rows as f64 / self.elapsed.as_secs_f64()
    }

    /// How many times faster than `baseline` (by rows per second).
    fn ratio_to(&self, baseline: &Self) -> f64 {
        self.rows_per_sec() / baseline.rows_per_sec()
    }
}

impl fmt::Display for Throughput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rate = self.rows_per_sec();
        let rows = if rate >= 1e6 {
            format!("{:.2}M", rate / 1e6)
        } else {
            format!("{:.1}k", rate / 1e3)
        };
        let megabytes = self.bytes as f64 / 1e6 / self.elapsed.as_secs_f64();
        write!(f, "{rows:>7} rows/s {megabytes:>8.1} MB/s")
    }
}

/// p50 and p99 of latencies in milliseconds.
#[derive(Debug, Clone, Copy)]
struct Latency {
    p50: f64,
    p99: f64,
}

impl Latency {
    fn new(samples: Vec<f64>) -> Self {
        let spread = Spread::new(samples);
        Self {
            p50: spread.p50,
            p99: spread.p99,
        }
    }

    /// `p50 x, p99 y`: how many times `baseline`'s latencies these are.
    fn ratio_to(&self, baseline: &Self) -> String {
        format!(
            "p50 {:.2}, p99 {:.2}",
            self.p50 / baseline.p50,
            self.p99 / baseline.p99
        )
    }
}

impl fmt::Display for Latency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p50 {:>7.3} ms  p99 {:>7.3} ms", self.p50, self.p99)
    }
}

/// The `p` quantile (0 to 1) of sorted samples, by nearest rank; NaN without samples.
fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    let index = (p * sorted.len() as f64).ceil() as usize;
    sorted
        .get(index.saturating_sub(1))
        .copied()
        .unwrap_or(f64::NAN)
}

/// p50, p99 and max of some samples (NaN without samples).
#[derive(Debug, Clone, Copy)]
struct Spread {
    count: usize,
    p50: f64,
    p99: f64,
    max: f64,
}

impl Spread {
    fn new(mut samples: Vec<f64>) -> Self {
        samples.sort_by(f64::total_cmp);
        Self {
            count: samples.len(),
            p50: nearest_rank(&samples, 0.50),
            p99: nearest_rank(&samples, 0.99),
            max: nearest_rank(&samples, 1.0),
        }
    }

    /// Every figure multiplied by `factor`.
    fn scaled(self, factor: f64) -> Self {
        Self {
            count: self.count,
            p50: self.p50 * factor,
            p99: self.p99 * factor,
            max: self.max * factor,
        }
    }
}

/// Prints one result: its label, the figure, and its ratios to baselines, if any.
fn report(label: &str, figure: impl fmt::Display, ratios: &[String]) {
    if ratios.is_empty() {
        println!("{label:<31}: {figure}");
    } else {
        println!("{label:<31}: {figure}   ratio {}", ratios.join(", "));
    }
}

/// `to - from` in milliseconds, negative when `to` comes first.
fn signed_ms(from: Instant, to: Instant) -> f64 {
    match to.checked_duration_since(from) {
        Some(after) => after.as_secs_f64() * 1e3,
        None => -(from - to).as_secs_f64() * 1e3,
    }
}

/// The working directory; removed on drop when it was made for this run.
#[derive(Debug)]
struct Scratch {
    path: PathBuf,
    remove: bool,
}

impl Scratch {
    fn new(dir: Option<PathBuf>) -> Result<Self, CliError> {
        let (path, remove) = match dir {
            Some(path) => {
                let used =
                    std::fs::read_dir(&path).is_ok_and(|mut entries| entries.next().is_some());
                if used {
                    return Err(CliError::Usage(format!(
                        "--dir {} is not empty: give an empty or new directory",
                        path.display()
                    )));
                }
                (path, false)
            }
            None => {
                let nanos = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                let name = format!("mink-bench-{}-{nanos}", std::process::id());
                (std::env::temp_dir().join(name), true)
            }
        };
        std::fs::create_dir_all(&path)
            .map_err(CliError::io(format!("creating {}", path.display())))?;
        Ok(Self { path, remove })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.remove {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The rows of the throughput figures.
#[derive(Debug)]
struct Data {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    rows: usize,
}

impl Data {
    /// `rows` rows with ids from 0.
    fn generate(rows: usize) -> Result<Self, CliError> {
        let ids: Vec<i64> = (0..rows as i64).collect();
        Self::with_ids(&ids, 0x5eed)
    }

    /// Rows with these ids, the other columns drawn from `seed`.
    fn with_ids(ids: &[i64], seed: u64) -> Result<Self, CliError> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new(
                "event_time",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                false,
            ),
            Field::new("name", DataType::Utf8, false),
            Field::new("price", DataType::Float64, false),
            Field::new("quantity", DataType::Int32, false),
        ]));
        let mut rng = XorShift::new(seed);
        let batches = ids
            .chunks(BATCH_ROWS)
            .map(|chunk| make_rows(&schema, Int64Array::from(chunk.to_vec()), &mut rng))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            schema,
            batches,
            rows: ids.len(),
        })
    }

    /// Bytes the batches take in memory.
    fn memory_bytes(&self) -> u64 {
        self.batches
            .iter()
            .map(|b| b.get_array_memory_size() as u64)
            .sum()
    }
}

/// The batches of the upsert figure.
#[derive(Debug)]
struct KvData {
    /// The load: keys `0..keys`.
    load: Data,
    /// The update phase: every [`UPDATE_EVERY`]th row updates a key of the load (distinct
    /// keys, drawn at random), the others insert new keys from `keys` up.
    upserts: Data,
    /// Rows of `upserts` that update a key.
    updates: usize,
}

impl KvData {
    fn generate(keys: usize) -> Result<Self, CliError> {
        let load = Data::generate(keys)?;
        let rows = (keys / 2).max(1);
        let updates = rows.div_ceil(UPDATE_EVERY);
        let mut rng = XorShift::new(0xda7a);
        // A partial Fisher-Yates shuffle: the first `updates` keys become distinct random ones.
        let mut existing: Vec<i64> = (0..keys as i64).collect();
        for i in 0..updates {
            let j = i + (rng.next_u64() % (keys - i) as u64) as usize;
            existing.swap(i, j);
        }
        let mut next_new = keys as i64;
        let ids: Vec<i64> = (0..rows)
            .map(|row| {
                if row % UPDATE_EVERY == 0 {
                    existing[row / UPDATE_EVERY]
                } else {
                    next_new += 1;
                    next_new - 1
                }
            })
            .collect();
        Ok(Self {
            load,
            upserts: Data::with_ids(&ids, rng.next_u64())?,
            updates,
        })
    }

    /// Rows of the primary-key table once both phases are written.
    fn final_rows(&self) -> usize {
        self.load.rows + self.upserts.rows - self.updates
    }
}

/// Size of `batches` as one Arrow IPC stream, the byte count of the MB/s figures.
fn ipc_len<'a>(batches: impl IntoIterator<Item = &'a RecordBatch>) -> Result<u64, CliError> {
    let mut batches = batches.into_iter().peekable();
    let Some(first) = batches.peek() else {
        return Ok(0);
    };
    let mut writer = StreamWriter::try_new(ByteCount(0), &first.schema())?;
    for batch in batches {
        writer.write(batch)?;
    }
    writer.finish()?;
    Ok(writer.get_ref().0)
}

/// A writer that only counts the bytes written to it.
#[derive(Debug)]
struct ByteCount(u64);

impl io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `rows` rows with ids from `first_id`.
fn make_batch(
    schema: &SchemaRef,
    first_id: i64,
    rows: usize,
    rng: &mut XorShift,
) -> Result<RecordBatch, CliError> {
    let ids = Int64Array::from_iter_values(first_id..first_id + rows as i64);
    make_rows(schema, ids, rng)
}

/// Rows with these ids, the other columns drawn from `rng`.
fn make_rows(
    schema: &SchemaRef,
    ids: Int64Array,
    rng: &mut XorShift,
) -> Result<RecordBatch, CliError> {
    /// 2025-01-01T00:00:00Z.
    const START_US: i64 = 1_735_689_600_000_000;
    let rows = ids.len();
    let times = TimestampMicrosecondArray::from_iter_values(
        ids.values()
            .iter()
            .map(|id| START_US + id * 1_000 + (rng.next_u64() % 1_000) as i64),
    )
    .with_timezone("UTC");
    let mut names = StringBuilder::with_capacity(rows, rows * NAME_LEN);
    let mut name = String::with_capacity(NAME_LEN);
    for _ in 0..rows {
        name.clear();
        name.push_str("user_");
        while name.len() < NAME_LEN {
            name.push(char::from(b'a' + (rng.next_u64() % 26) as u8));
        }
        names.append_value(&name);
    }
    let prices = Float64Array::from_iter_values(
        (0..rows).map(|_| (rng.next_u64() % 1_000_000) as f64 / 100.0),
    );
    let quantities =
        Int32Array::from_iter_values((0..rows).map(|_| (rng.next_u64() % 1_000) as i32));
    Ok(RecordBatch::try_new(
        Arc::clone(schema),
        vec![
            Arc::new(ids),
            Arc::new(times),
            Arc::new(names.finish()),
            Arc::new(prices),
            Arc::new(quantities),
        ],
    )?)
}

/// xorshift64*: deterministic data without a dependency.
#[derive(Debug)]
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}
