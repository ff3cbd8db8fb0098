//! What every suite measures with: the node it measures, how it times, and how it
//! reports.
//!
//! A suite starts a [`Running`] node (a [`mink_node::Node`] in this process, served on a
//! loopback port and driven through a [`MinkClient`], so every figure includes the
//! Flight protocol) in a [`Scratch`] directory, as its [`NodeArgs`] say. It times each
//! piece of work with [`measure`] (progress to stderr), repeats what it compares with
//! [`timed_rounds`] and takes the [`median`], and times calls one by one, after uncounted
//! warm-up calls, with [`latency`], with [`paired_latency`] (a baseline call before each
//! measured one) or with [`interleaved_latency`] (several kinds of call taking turns).
//! Results go to stdout through [`report`]: a label, the figure (a [`Throughput`] or a
//! [`Latency`]) and its ratios to the baselines measured in the same run.
//!
//! The rows come from [`crate::data`]; the baselines' Parquet files from
//! [`write_parquet`] and [`read_parquet_buckets`]. Quantiles are by nearest rank
//! ([`nearest_rank`]): p50 and p99 of 500 samples are the 250th and the 495th.

use std::fmt;
use std::fs::File;
use std::future::Future;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use futures::future::{self, Either, try_join_all};
use futures::stream::{self, StreamExt, TryStreamExt};
use mink_client::MinkClient;
use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;
use mink_core::table::{TableDescriptor, TablePath};
use mink_flight_sql::{FlightSqlConfig, FlightSqlHandle};
use mink_kv::KvConfig;
use mink_lake::storage::LakeStorage;
use mink_lake::writer::writer_properties;
use mink_node::{Node, NodeConfig, NodeError};
use parquet::arrow::ArrowWriter;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::properties::WriterProperties;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::data::Data;
use crate::error::BenchError;

/// Uncounted calls before each latency measurement.
pub(crate) const CALL_WARMUP: usize = 20;
/// Rounds of the figures taken as medians.
pub(crate) const ROUNDS: usize = 3;
/// Batches per `append` call of each writer task of [`append_parts`].
pub(crate) const BATCHES_PER_CALL: usize = 4;
/// [`MinkClient::write`] calls in flight at once in [`write_batches`].
pub(crate) const WRITES_IN_FLIGHT: usize = 4;
/// `lake.freshness` of a table tiered only on demand: longer than any benchmark, so the
/// node's tiering service never gets to it.
pub(crate) const ON_DEMAND_FRESHNESS: Duration = Duration::from_secs(3600);

/// Where and how the benchmark's node runs.
#[derive(Debug, clap::Args)]
pub(crate) struct NodeArgs {
    /// An empty or new directory to work in, kept afterwards (default: a fresh directory
    /// under the system temp directory, removed at the end).
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
    /// Run mink without fsync (and, for `mink-bench log`, compare with an IPC file that
    /// is never synced).
    #[arg(long)]
    no_sync: bool,
    /// The KV store's block cache (`mink server --kv-cache`): bytes or a size.
    #[arg(long, value_name = "SIZE", value_parser = mink_sql::session::parse_size)]
    kv_cache: Option<usize>,
    /// The KV store's write buffer (`mink server --kv-write-buffer`): bytes or a size.
    #[arg(long, value_name = "SIZE", value_parser = mink_sql::session::parse_size)]
    kv_write_buffer: Option<usize>,
}

impl NodeArgs {
    pub(crate) fn sync(&self) -> bool {
        !self.no_sync
    }

    /// The node's configuration in `scratch`, with a log cache of `cache_bytes` per bucket.
    pub(crate) fn config(&self, scratch: &Scratch, cache_bytes: u64) -> NodeConfig {
        let mut config = NodeConfig::new(scratch.path.join("node"));
        config.log.sync = self.sync();
        config.log.cache_bytes = cache_bytes;
        config.kv = KvConfig::sized(self.kv_write_buffer, self.kv_cache);
        config
    }

    /// How the node runs, for the heading of the results.
    pub(crate) fn describe(&self, config: &NodeConfig, scratch: &Scratch) -> String {
        format!(
            "fsync {}, log cache {} MB per bucket, KV cache {} MB, KV write buffer {} MB, dir {}",
            if self.sync() { "on" } else { "off" },
            config.log.cache_bytes >> 20,
            config.kv.cache_bytes >> 20,
            config.kv.buffer.node_bytes >> 20,
            scratch.path.display()
        )
    }
}

/// The scratch directory, the generated rows and a node configuration whose log cache
/// holds them all.
pub(crate) fn prepare(
    node: &NodeArgs,
    rows: usize,
) -> Result<(Scratch, Data, NodeConfig), BenchError> {
    eprintln!("bench: generating {rows} rows");
    prepare_data(node, Data::generate(rows)?)
}

/// [`prepare`] with rows generated by the caller.
pub(crate) fn prepare_data(
    node: &NodeArgs,
    data: Data,
) -> Result<(Scratch, Data, NodeConfig), BenchError> {
    let scratch = Scratch::new(node.dir.clone())?;
    let config = node.config(&scratch, 2 * data.memory_bytes() + (64 << 20));
    Ok((scratch, data, config))
}

/// Arguments of the suites over Parquet files of generated rows (`lake-codecs`,
/// `position-deletes`).
#[derive(Debug, clap::Args)]
pub(crate) struct FileRowsArgs {
    /// Rows written (for `lake-codecs`, with each codec).
    #[arg(long, default_value_t = 10_000_000)]
    pub(crate) rows: usize,
    /// Files the rows are split into (a bucket's files each).
    #[arg(long, default_value_t = 4)]
    pub(crate) files: u32,
    /// Working directory (empty or new; kept). Default: a temporary one.
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
}

impl FileRowsArgs {
    /// Checks the arguments, opens the working directory and generates the rows, saying
    /// so on stderr as suite `suite`, whose files are `files` (e.g. "files per codec").
    pub(crate) fn start(&self, suite: &str, files: &str) -> Result<(Scratch, Data), BenchError> {
        if self.rows == 0 || self.files == 0 {
            return Err(BenchError::Usage(
                "--rows and --files must be positive".into(),
            ));
        }
        let scratch = Scratch::new(self.dir.clone())?;
        let data = Data::generate(self.rows)?;
        eprintln!(
            "mink-bench {suite}: {} rows in {} {files}, in {}",
            self.rows,
            self.files,
            scratch.path.display()
        );
        Ok((scratch, data))
    }
}

/// The working directory; removed on drop when it was made for this run.
#[derive(Debug)]
pub(crate) struct Scratch {
    pub(crate) path: PathBuf,
    remove: bool,
}

impl Scratch {
    pub(crate) fn new(dir: Option<PathBuf>) -> Result<Self, BenchError> {
        let (path, remove) = match dir {
            Some(path) => {
                let used =
                    std::fs::read_dir(&path).is_ok_and(|mut entries| entries.next().is_some());
                if used {
                    return Err(BenchError::Usage(format!(
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
            .map_err(BenchError::io(format!("creating {}", path.display())))?;
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

/// A node served on a loopback port in this process, and a client of it.
#[derive(Debug)]
pub(crate) struct Running {
    config: NodeConfig,
    pub(crate) node: Arc<Node>,
    server: mink_node::server::ServerHandle,
    pub(crate) client: MinkClient,
}

impl Running {
    pub(crate) async fn start(config: NodeConfig) -> Result<Self, BenchError> {
        let node = Node::open(config.clone()).await?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(BenchError::io("binding a loopback port"))?;
        let server = mink_node::server::serve(Arc::clone(&node), listener).await?;
        let client = MinkClient::connect(&server.addr().to_string()).await?;
        Ok(Self {
            config,
            node,
            server,
            client,
        })
    }

    /// How the node was configured.
    pub(crate) fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// The server's address, as `mink --connect` takes it.
    pub(crate) fn address(&self) -> String {
        self.server.addr().to_string()
    }

    /// The Flight SQL endpoint over this node on a loopback port (plaintext, no login),
    /// reading the lake through `storage`.
    pub(crate) async fn serve_flight_sql(
        &self,
        storage: LakeStorage,
    ) -> Result<FlightSqlHandle, BenchError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(BenchError::io("binding a loopback port"))?;
        let config = FlightSqlConfig {
            client: self.client.clone(),
            storage,
            credentials: None,
            tls: None,
        };
        Ok(mink_flight_sql::serve(config, listener)?)
    }

    /// Shuts the server down and drops the node, which releases its data directory.
    pub(crate) async fn stop(self) -> Result<NodeConfig, BenchError> {
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
    pub(crate) async fn restart(self) -> Result<Self, BenchError> {
        let config = self.stop().await?;
        Self::start(config).await
    }
}

/// Runs `work`, reporting it on stderr; returns its output and how long it took.
pub(crate) async fn measure<T>(
    what: &str,
    work: impl Future<Output = Result<T, BenchError>>,
) -> Result<(T, Duration), BenchError> {
    eprintln!("bench: {what} ...");
    let start = Instant::now();
    let output = work.await?;
    let elapsed = start.elapsed();
    eprintln!("bench: {what}: {:.3} s", elapsed.as_secs_f64());
    Ok((output, elapsed))
}

/// How long some work took, and the CPU time the process used meanwhile.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timed {
    pub(crate) elapsed: Duration,
    /// On all the process's threads (the node's and the client's, background work
    /// included): what the work cost, however the machine schedules it.
    pub(crate) cpu: Duration,
}

/// Runs `work` as [`measure`] does; returns also the CPU time the process used meanwhile.
pub(crate) async fn measure_with_cpu<T>(
    what: &str,
    work: impl Future<Output = Result<T, BenchError>>,
) -> Result<(T, Timed), BenchError> {
    let cpu = process_cpu_time();
    let (output, elapsed) = measure(what, work).await?;
    let cpu = process_cpu_time().saturating_sub(cpu);
    Ok((output, Timed { elapsed, cpu }))
}

/// The CPU time the process has used so far, on all its threads.
fn process_cpu_time() -> Duration {
    let time = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(time.tv_sec).unwrap_or(0),
        u32::try_from(time.tv_nsec).unwrap_or(0),
    )
}

/// Runs `round` [`ROUNDS`] times; returns its last answer and the median time.
pub(crate) async fn timed_rounds<T, F, Round>(
    what: &str,
    mut round: Round,
) -> Result<(T, Duration), BenchError>
where
    Round: FnMut() -> F,
    F: Future<Output = Result<T, BenchError>>,
{
    let mut times = Vec::with_capacity(ROUNDS);
    let mut answer = None;
    for _ in 0..ROUNDS {
        let (output, elapsed) = measure(what, round()).await?;
        times.push(elapsed);
        answer = Some(output);
    }
    let answer = answer.ok_or_else(|| BenchError::Usage("no rounds".into()))?;
    Ok((answer, median(times)))
}

/// The medians of rounds' `(baseline, figure)` times: the baseline's and the figure's.
fn medians(rounds: &[(Duration, Duration)]) -> (Duration, Duration) {
    let (baselines, figures) = rounds.iter().copied().unzip();
    (median(baselines), median(figures))
}

/// The median of some durations (the upper one of an even count).
pub(crate) fn median(mut durations: Vec<Duration>) -> Duration {
    durations.sort();
    durations
        .get(durations.len() / 2)
        .copied()
        .unwrap_or_default()
}

/// Reports a figure measured in rounds against its baseline, each round's times
/// `(baseline, figure)` for `rows` rows of `bytes` bytes: each as the median of its rounds,
/// the figure with the median of the rounds' ratios (the baseline's time over the
/// figure's) and each round's.
pub(crate) fn report_rounds(
    [baseline_label, label]: [&str; 2],
    baseline_name: &str,
    (rows, bytes): (usize, u64),
    rounds: &[(Duration, Duration)],
) {
    let (baseline, figure) = medians(rounds);
    let (baseline, figure) = (
        Throughput::new(rows, bytes, baseline),
        Throughput::new(rows, bytes, figure),
    );
    report(baseline_label, baseline, &[]);
    report(label, figure, &[ratio_of_rounds(baseline_name, rounds)]);
}

/// The median of rounds' throughput ratios (the baseline's time over the figure's, each
/// round's times `(baseline, figure)`) and each round's, as [`report`] prints a ratio:
/// `vs NAME 0.45 (rounds 0.41, 0.45, 0.52)`.
pub(crate) fn ratio_of_rounds(baseline_name: &str, rounds: &[(Duration, Duration)]) -> String {
    let mut ratios: Vec<f64> = (rounds.iter())
        .map(|(base, figure)| base.as_secs_f64() / figure.as_secs_f64())
        .collect();
    let each: Vec<String> = ratios.iter().map(|ratio| format!("{ratio:.2}")).collect();
    ratios.sort_by(f64::total_cmp);
    let median_ratio = ratios.get(ratios.len() / 2).copied().unwrap_or_default();
    format!(
        "vs {baseline_name} {median_ratio:.2} (rounds {})",
        each.join(", ")
    )
}

/// Reports the CPU time per row of a figure measured in rounds and of its baseline, each
/// round's CPU times `(baseline, figure)` for `rows` rows: each the median of its rounds.
/// A steadier figure than the throughput, which moves with how the machine schedules.
pub(crate) fn report_cpu_per_row(
    label: &str,
    baseline_name: &str,
    rows: usize,
    rounds: &[(Duration, Duration)],
) {
    let per_row = |time: Duration| time.as_secs_f64() * 1e6 / rows.max(1) as f64;
    let (baseline, figure) = medians(rounds);
    let (baseline, figure) = (per_row(baseline), per_row(figure));
    let times = figure / baseline.max(f64::MIN_POSITIVE);
    println!(
        "{label:<31}: {figure:7.2} µs per row   {baseline_name} {baseline:.2} µs per row, {times:.1}x"
    );
}

/// Latencies of `calls` calls after `warmup` uncounted ones. Call `i` returns the rows it
/// got, which must be `rows`.
pub(crate) async fn latency<C, Call>(
    what: &str,
    warmup: usize,
    calls: usize,
    rows: usize,
    mut call: C,
) -> Result<Latency, BenchError>
where
    C: FnMut(usize) -> Call,
    Call: Future<Output = Result<usize, BenchError>>,
{
    let timed = async {
        let mut samples = Vec::with_capacity(calls);
        for i in 0..warmup + calls {
            let ms = timed_call(what, rows, call(i)).await?;
            if i >= warmup {
                samples.push(ms);
            }
        }
        Ok(Latency::new(samples))
    };
    Ok(measure(what, timed).await?.0)
}

/// Latencies of `calls` pairs of calls, a baseline call then a measured one, after
/// `warmup` uncounted pairs; pairing lets both see the same conditions. Call `i` of
/// either kind returns the rows it got, which must be `rows`.
pub(crate) async fn paired_latency<B, BaselineCall, M, MeasuredCall>(
    what: &str,
    warmup: usize,
    calls: usize,
    rows: usize,
    mut baseline: B,
    mut measured: M,
) -> Result<(Latency, Latency), BenchError>
where
    B: FnMut(usize) -> BaselineCall,
    BaselineCall: Future<Output = Result<usize, BenchError>>,
    M: FnMut(usize) -> MeasuredCall,
    MeasuredCall: Future<Output = Result<usize, BenchError>>,
{
    let call = |kind, i| match kind {
        0 => Either::Left(baseline(i)),
        _ => Either::Right(measured(i)),
    };
    match interleaved_latency(what, warmup, calls, rows, 2, call).await?[..] {
        [baseline, measured] => Ok((baseline, measured)),
        _ => Err(BenchError::Mismatch(format!("{what}: not two latencies"))),
    }
}

/// Latencies of `calls` turns, each a call of every one of `kinds` kinds in order (call
/// `(kind, i)`), after `warmup` uncounted turns; taking turns lets every kind see the same
/// conditions. Every call returns the rows it got, which must be `rows`. One latency per
/// kind, in order.
pub(crate) async fn interleaved_latency<C, Call>(
    what: &str,
    warmup: usize,
    calls: usize,
    rows: usize,
    kinds: usize,
    mut call: C,
) -> Result<Vec<Latency>, BenchError>
where
    C: FnMut(usize, usize) -> Call,
    Call: Future<Output = Result<usize, BenchError>>,
{
    let turns = async {
        let mut samples = vec![Vec::with_capacity(calls); kinds];
        for i in 0..warmup + calls {
            for (kind, of_kind) in samples.iter_mut().enumerate() {
                let ms = timed_call(what, rows, call(kind, i)).await?;
                if i >= warmup {
                    of_kind.push(ms);
                }
            }
        }
        Ok(samples.into_iter().map(Latency::new).collect())
    };
    Ok(measure(what, turns).await?.0)
}

/// Makes one call of [`latency`] or [`interleaved_latency`]; returns how long it took, in
/// milliseconds.
async fn timed_call(
    what: &str,
    rows: usize,
    call: impl Future<Output = Result<usize, BenchError>>,
) -> Result<f64, BenchError> {
    let start = Instant::now();
    let got = call.await?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    check_rows(what, got, rows)?;
    Ok(ms)
}

/// Runs blocking file I/O off the runtime's workers.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, BenchError> + Send + 'static,
) -> Result<T, BenchError> {
    tokio::task::spawn_blocking(work).await?
}

/// Checks that `what` returned the `expected` rows.
pub(crate) fn check_rows(what: &str, rows: usize, expected: usize) -> Result<(), BenchError> {
    if rows == expected {
        return Ok(());
    }
    Err(BenchError::Mismatch(format!(
        "{what} returned {rows} rows, expected {expected}"
    )))
}

/// Rows and bytes moved in some time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Throughput {
    pub(crate) rows: usize,
    pub(crate) bytes: u64,
    pub(crate) elapsed: Duration,
}

impl Throughput {
    pub(crate) fn new(rows: usize, bytes: u64, elapsed: Duration) -> Self {
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
    pub(crate) fn ratio_to(&self, baseline: &Self) -> f64 {
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
pub(crate) struct Latency {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
}

impl Latency {
    pub(crate) fn new(samples: Vec<f64>) -> Self {
        let spread = Spread::new(samples);
        Self {
            p50: spread.p50,
            p99: spread.p99,
        }
    }

    /// `p50 x, p99 y`: how many times `baseline`'s latencies these are.
    pub(crate) fn ratio_to(&self, baseline: &Self) -> String {
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
pub(crate) fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    let index = (p * sorted.len() as f64).ceil() as usize;
    sorted
        .get(index.saturating_sub(1))
        .copied()
        .unwrap_or(f64::NAN)
}

/// p50, p99 and max of some samples (NaN without samples).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spread {
    pub(crate) count: usize,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
}

impl Spread {
    pub(crate) fn new(mut samples: Vec<f64>) -> Self {
        samples.sort_by(f64::total_cmp);
        Self {
            count: samples.len(),
            p50: nearest_rank(&samples, 0.50),
            p99: nearest_rank(&samples, 0.99),
            max: nearest_rank(&samples, 1.0),
        }
    }

    /// Every figure multiplied by `factor`.
    pub(crate) fn scaled(self, factor: f64) -> Self {
        Self {
            count: self.count,
            p50: self.p50 * factor,
            p99: self.p99 * factor,
            max: self.max * factor,
        }
    }
}

/// Prints one result: its label, the figure, and its ratios to baselines, if any.
pub(crate) fn report(label: &str, figure: impl fmt::Display, ratios: &[String]) {
    if ratios.is_empty() {
        println!("{label:<31}: {figure}");
    } else {
        println!("{label:<31}: {figure}   ratio {}", ratios.join(", "));
    }
}

/// `bytes` as megabytes (10^6 bytes).
pub(crate) fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// Creates a table: a log table when `primary_key` is empty.
pub(crate) async fn create_table(
    client: &MinkClient,
    path: &TablePath,
    buckets: u32,
    schema: &SchemaRef,
    primary_key: &[&str],
) -> Result<TableDescriptor, BenchError> {
    let options = TableOptions {
        bucket_num: buckets,
        ..TableOptions::default()
    };
    create_table_with(client, path, schema, primary_key, options).await
}

pub(crate) async fn create_table_with(
    client: &MinkClient,
    path: &TablePath,
    schema: &SchemaRef,
    primary_key: &[&str],
    options: TableOptions,
) -> Result<TableDescriptor, BenchError> {
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
pub(crate) fn check_pk_table_args(keys: usize, buckets: u32) -> Result<(), BenchError> {
    if keys < 100 {
        return Err(BenchError::Usage("--keys must be at least 100".into()));
    }
    if buckets == 0 {
        return Err(BenchError::Usage("--buckets must be at least 1".into()));
    }
    Ok(())
}

/// Creates `bench.<name>`: a primary-key table (`id`) of `data`'s schema in `buckets`
/// buckets with a lake tiered only on demand.
pub(crate) async fn create_pk_lake_table(
    running: &Running,
    name: &str,
    data: &Data,
    buckets: u32,
) -> Result<TableDescriptor, BenchError> {
    let options = lake_options(buckets, ON_DEMAND_FRESHNESS);
    let path = TablePath::new("bench", name);
    create_table_with(&running.client, &path, &data.schema, &["id"], options).await
}

/// The options of a table in `buckets` buckets with a lake, tiered every `freshness` by
/// the node's service.
pub(crate) fn lake_options(buckets: u32, freshness: Duration) -> TableOptions {
    TableOptions {
        bucket_num: buckets,
        lake_enabled: true,
        lake_freshness: freshness,
        ..TableOptions::default()
    }
}

/// One tiering round that must commit; its snapshot.
pub(crate) async fn tier(running: &Running, path: &TablePath) -> Result<i64, BenchError> {
    let reply = running.client.tier(path).await?;
    reply
        .snapshot_id
        .ok_or_else(|| NodeError::Corrupt(format!("a round of {path} committed nothing")).into())
}

/// Every bucket of an unpartitioned table.
pub(crate) fn buckets_of(table: &TableDescriptor) -> Vec<BucketId> {
    (0..table.bucket_num)
        .map(|b| BucketId::new(&table.path, b))
        .collect()
}

/// Batch `i` goes to part `i % buckets`.
pub(crate) fn split(batches: &[RecordBatch], buckets: u32) -> Vec<Vec<RecordBatch>> {
    let buckets = buckets as usize;
    (0..buckets)
        .map(|b| batches.iter().skip(b).step_by(buckets).cloned().collect())
        .collect()
}

/// Appends part `b` to bucket `b`, one writer task per bucket, [`BATCHES_PER_CALL`]
/// batches per call.
pub(crate) async fn append_parts(
    client: &MinkClient,
    table: &TablePath,
    parts: Vec<Vec<RecordBatch>>,
) -> Result<(), BenchError> {
    let mut writers = JoinSet::new();
    for (bucket, part) in (0u32..).zip(parts) {
        let client = client.clone();
        let bucket = BucketId::new(table, bucket);
        writers.spawn(async move {
            for call in part.chunks(BATCHES_PER_CALL) {
                client.append(&bucket, call.to_vec()).await?;
            }
            Ok::<(), BenchError>(())
        });
    }
    while let Some(done) = writers.join_next().await {
        done??;
    }
    Ok(())
}

/// Writes `batches` to a table through [`MinkClient::write`], [`WRITES_IN_FLIGHT`] calls
/// at a time (an upsert, in a primary-key table).
pub(crate) async fn write_batches(
    client: &MinkClient,
    table: &TableDescriptor,
    batches: &[RecordBatch],
) -> Result<(), BenchError> {
    stream::iter(batches)
        .map(|batch| client.write(table, batch))
        .buffer_unordered(WRITES_IN_FLIGHT)
        .try_for_each(|_acks| future::ready(Ok(())))
        .await?;
    Ok(())
}

/// Scans a bucket from offset 0 to its high watermark; returns the rows read.
pub(crate) async fn scan_bucket(
    client: &MinkClient,
    bucket: &BucketId,
) -> Result<usize, BenchError> {
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

/// Checks that a table's buckets have logged `expected` rows in all.
pub(crate) async fn check_logged(
    client: &MinkClient,
    table: &TableDescriptor,
    expected: usize,
) -> Result<(), BenchError> {
    let buckets = client.list_buckets(&table.path).await?;
    let logged: i64 = buckets.iter().map(|b| b.high_watermark - b.log_start).sum();
    check_rows(
        &format!("the log of {}", table.path),
        logged as usize,
        expected,
    )
}

/// Creates the baseline file `path` for `batches`; returns their schema (the first
/// batch's) and the file.
pub(crate) fn create_file_for(
    path: &Path,
    batches: &[RecordBatch],
) -> Result<(SchemaRef, File), BenchError> {
    let schema = batches
        .first()
        .map(RecordBatch::schema)
        .ok_or_else(|| BenchError::Usage("nothing to write".into()))?;
    let file = File::create(path).map_err(BenchError::io(format!("writing {}", path.display())))?;
    Ok((schema, file))
}

/// Writes batches as one Parquet file with the lake writer's properties, without fsync;
/// returns the file's length.
pub(crate) fn write_parquet(path: &Path, batches: &[RecordBatch]) -> Result<u64, BenchError> {
    write_parquet_with(path, batches, writer_properties())
}

/// [`write_parquet`] with other writer properties.
pub(crate) fn write_parquet_with(
    path: &Path,
    batches: &[RecordBatch],
    properties: WriterProperties,
) -> Result<u64, BenchError> {
    let context = || format!("writing {}", path.display());
    let (schema, file) = create_file_for(path, batches)?;
    let mut writer = ArrowWriter::try_new(BufWriter::new(file), schema, Some(properties))?;
    for batch in batches {
        writer.write(batch)?;
    }
    writer.close()?;
    let metadata = std::fs::metadata(path).map_err(BenchError::io(context()))?;
    Ok(metadata.len())
}

/// A plain DataFusion session with the Parquet files of `dir` as table `t`, strings read
/// as `Utf8View` (DataFusion's default) or, without `views`, as `Utf8` like mink's tables.
pub(crate) async fn parquet_session(dir: &Path, views: bool) -> Result<SessionContext, BenchError> {
    let mut config = SessionConfig::new();
    config
        .options_mut()
        .execution
        .parquet
        .schema_force_view_types = views;
    let datafusion = SessionContext::new_with_config(config);
    let directory = dir.to_string_lossy().to_string();
    datafusion
        .register_parquet("t", &directory, ParquetReadOptions::default())
        .await?;
    Ok(datafusion)
}

/// Reads every bucket's Parquet files, one blocking task per bucket, all at once, only the
/// columns at `columns` (empty: all); returns the rows read.
pub(crate) async fn read_parquet_buckets(
    files: &[Vec<PathBuf>],
    columns: &[usize],
) -> Result<usize, BenchError> {
    let reads = files.iter().map(|paths| {
        let (paths, columns) = (paths.clone(), columns.to_vec());
        blocking(move || read_parquet(&paths, &columns))
    });
    Ok(try_join_all(reads).await?.into_iter().sum())
}

/// Reads Parquet files, only the columns at `columns` (empty: all); returns the rows.
fn read_parquet(paths: &[PathBuf], columns: &[usize]) -> Result<usize, BenchError> {
    let mut rows = 0;
    for path in paths {
        let file =
            File::open(path).map_err(BenchError::io(format!("reading {}", path.display())))?;
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

/// The Python the benchmarks run: `MINK_PYTHON`, else `python3`.
pub(crate) fn python_interpreter() -> String {
    std::env::var("MINK_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Runs `script` with `args` in the Python of `MINK_PYTHON` (else `python3`): its
/// stdout, or why it could not run (`packages` are what that Python needs, for the
/// message).
pub(crate) fn python(script: &str, args: &[String], packages: &str) -> Result<String, String> {
    let python = python_interpreter();
    let output = Command::new(&python)
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().last().unwrap_or_default();
        return Err(format!(
            "{python} failed ({last}); set MINK_PYTHON to a Python with `pip install {packages}`"
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Rows in some batches.
pub(crate) fn row_count(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::num_rows).sum()
}
