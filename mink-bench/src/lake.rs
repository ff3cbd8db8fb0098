//! `mink-bench lake`: the lake tier of log tables, against Parquet files and the
//! configured freshness.
//!
//! ```text
//! cargo run --release -p mink-bench -- lake [--rows 2000000] [--buckets 4]
//!     [--write-rate 20000] [--dir DIR] [--no-sync]
//! ```
//!
//! The lake tier of log tables, on the same kind of node and with the same schema as `log`'s; the
//! node's lake is the embedded one (`<dir>/node/lake`: a SQLite catalog and a local
//! warehouse). Every table has `--buckets` buckets (default 4). The node's tiering service
//! runs throughout, but the table of figures 1 and 2 has a `lake.freshness` of an hour, so
//! the service never tiers it on its own.
//!
//! 1. **Tiering throughput**: `--rows` rows (default 2 000 000) are appended to the
//!    lake-enabled log table `bench.lake` (batch `i` to bucket `i % n`), then one
//!    [`MinkClient::tier`] round is timed: it reads each bucket's log, writes it as one
//!    Parquet file per bucket (with the lake's columns `__bucket`, `__offset` and
//!    `__timestamp` added), commits one Iceberg snapshot and records it. Baseline: each
//!    bucket's rows written as one Parquet file by `parquet::arrow::ArrowWriter` with the
//!    lake writer's properties, in the same directory, one bucket after the other as the
//!    round does them. The round fsyncs its files and the baseline does not, so the ratio
//!    is the cost of the log read, the Iceberg metadata, the fsyncs and the commit over
//!    the bare Parquet write. The file sizes are printed.
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

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use futures::future::{self, try_join_all};
use mink_client::MinkClient;
use mink_core::protocol::list_offsets::Spec;
use mink_core::protocol::{BucketId, UnionPlan};
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::offsets::{BUCKET_OFFSETS_PROPERTY, BucketOffsets};
use mink_node::NodeError;
use tokio::time::MissedTickBehavior;

use crate::data::{BATCH_ROWS, Data, ipc_len, make_batch, seeded};
use crate::error::BenchError;
use crate::harness::{
    NodeArgs, ON_DEMAND_FRESHNESS, ROUNDS, Running, Spread, Throughput, append_parts, blocking,
    buckets_of, check_logged, check_rows, create_table_with, lake_options, measure, median,
    megabytes, prepare, read_parquet_buckets, report, split, write_parquet,
};

/// Arguments of `mink-bench lake`.
#[derive(Debug, clap::Args)]
pub(crate) struct LakeArgs {
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

pub(crate) async fn run(args: LakeArgs) -> Result<(), BenchError> {
    if args.rows == 0 {
        return Err(BenchError::Usage("--rows must be at least 1".into()));
    }
    if args.buckets == 0 {
        return Err(BenchError::Usage("--buckets must be at least 1".into()));
    }
    if args.write_rate == 0 {
        return Err(BenchError::Usage("--write-rate must be at least 1".into()));
    }
    // The cache holds every bucket's log, so tiering and union reads find it there.
    let (scratch, data, config) = prepare(&args.node, args.rows)?;
    println!(
        "mink-bench lake: {} rows ({} MB in memory) in batches of {BATCH_ROWS}, {} bucket{}, {}",
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
) -> Result<Vec<Vec<PathBuf>>, BenchError> {
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
                .sum::<Result<u64, BenchError>>()
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
) -> Result<(), BenchError> {
    let log_range = log_parts(&data.schema, data.rows, table.bucket_num)?;
    let range_rows: usize = log_range.iter().flatten().map(RecordBatch::num_rows).sum();
    append_parts(client, &table.path, log_range.clone()).await?;
    for ((b, part), paths) in log_range.iter().enumerate().zip(&mut files) {
        if !part.is_empty() {
            let path = dir.join(format!("baseline-bucket{b}-log-range.parquet"));
            let (file, part) = (path.clone(), part.clone());
            blocking(move || write_parquet(&file, &part)).await?;
            paths.push(path);
        }
    }
    let rows = data.rows + range_rows;
    let all: Vec<&RecordBatch> = data
        .batches
        .iter()
        .chain(log_range.iter().flatten())
        .collect();
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
        let log_rows: i64 = plans.iter().map(UnionPlan::log_range_len).sum();
        check_rows(
            "the log part of the union read",
            log_rows as usize,
            range_rows,
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
) -> Result<(), BenchError> {
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
) -> Result<Writes, BenchError> {
    let period = Duration::from_secs_f64(FRESH_BATCH_ROWS as f64 / f64::from(rate));
    let calls = (FRESH_WRITING.as_secs_f64() / period.as_secs_f64()).ceil() as usize;
    let mut rng = seeded(0xf7e5);
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
) -> Result<Vec<Sample>, BenchError> {
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
async fn lake_rounds(running: &Running, table: &TablePath) -> Result<Vec<LakeRound>, BenchError> {
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
        .collect::<Result<Vec<_>, BenchError>>()?;
    rounds.sort_by_key(|round| round.committed_ms);
    Ok(rounds)
}

/// `rows / LOG_SHARE` rows (at least one) with ids from `rows`: one batch per bucket, as
/// even as can be (none for a bucket left without rows).
fn log_parts(
    schema: &SchemaRef,
    rows: usize,
    buckets: u32,
) -> Result<Vec<Vec<RecordBatch>>, BenchError> {
    let (log_rows, buckets) = ((rows / LOG_SHARE).max(1), buckets as usize);
    let mut rng = seeded(0x7a1e);
    let mut first_id = rows as i64;
    (0..buckets)
        .map(|b| {
            let count = log_rows / buckets + usize::from(b < log_rows % buckets);
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
) -> Result<(usize, Vec<UnionPlan>), BenchError> {
    let reads = buckets_of(table).into_iter().map(|bucket| async move {
        let answer = client.union(&bucket, columns, &[]).await?;
        Ok::<_, BenchError>((answer.num_rows(), answer.plan))
    });
    let answers = try_join_all(reads).await?;
    Ok((
        answers.iter().map(|(rows, _)| rows).sum(),
        answers.into_iter().map(|(_, plan)| plan).collect(),
    ))
}

/// The columns of `batch` at `columns` (empty: all).
fn project(batch: &RecordBatch, columns: &[usize]) -> Result<RecordBatch, BenchError> {
    match columns {
        [] => Ok(batch.clone()),
        columns => Ok(batch.project(columns)?),
    }
}

/// Now, in ms since the epoch (the clock of Iceberg's snapshot timestamps).
fn epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Creates a log table with a lake, tiered every `freshness` by the node's service.
async fn create_lake_table(
    client: &MinkClient,
    path: &TablePath,
    buckets: u32,
    schema: &SchemaRef,
    freshness: Duration,
) -> Result<TableDescriptor, BenchError> {
    let options = lake_options(buckets, freshness);
    create_table_with(client, path, schema, &[], options).await
}
