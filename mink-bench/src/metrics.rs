//! `mink-bench metrics`: what metrics cost a node, and what a scrape costs.
//!
//! ```text
//! cargo run --release -p mink-bench -- metrics [--rows 1000000] [--tables 100]
//!     [--buckets 16] [--scrape-every-ms 1000] [--rounds 5] [--acks 1000]
//! ```
//!
//! An embedded node is served on a loopback port and driven through `MinkClient`, with
//! `--tables` lake tables of `--buckets` buckets beside the one written, so each scrape
//! reads and encodes as many bucket series as a node of that many tables exports.
//!
//! 1. **Scrape**: 20 scrapes after 3 uncounted ones, each what `/metrics` does on
//!    `mink server --metrics-listen` (the process's counters and histograms, the node's
//!    bucket gauges read now, encoded as Prometheus' text) without the HTTP round trip:
//!    its time (p50, p99) and its size.
//! 2. **The write path, scraped against not**: `--rounds` rounds, each of two runs whose
//!    order alternates from round to round: one while a task scrapes the node every
//!    `--scrape-every-ms` (1 s by default, fifteen times Prometheus' default rate), one
//!    with no scrape. Each run appends `--rows` rows (batches of 10 000, four a call) to a
//!    fresh 8-bucket table, one writer per bucket, then makes `--acks` (1 000) appends of
//!    one 100-row batch to one bucket (after 20 uncounted), timing each acknowledgement. Figures are
//!    medians over the rounds; ratios are scraped over not scraped, each round's ratio
//!    then their median (throughput: above 1 is faster scraped; latency: above 1 is
//!    slower scraped). The counters themselves are incremented either way (they cannot
//!    be turned off): their cost shows against a build without them (`mink-bench log` of
//!    an older commit, `docs/benchmarks.md`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use mink_core::protocol::BucketId;
use mink_core::table::TablePath;
use mink_node::Node;
use tokio::task::JoinHandle;

use crate::data::{Data, make_batch, seeded};
use crate::error::BenchError;
use crate::harness::{
    Latency, NodeArgs, ON_DEMAND_FRESHNESS, Running, append_parts, create_table, create_table_with,
    lake_options, latency, measure, prepare, report, report_rounds, split,
};

/// Arguments of `mink-bench metrics`.
#[derive(Debug, clap::Args)]
pub(crate) struct MetricsArgs {
    /// Rows each run appends, in batches of 10 000.
    #[arg(long, default_value_t = 1_000_000)]
    rows: usize,
    /// Lake tables beside the one written, whose buckets every scrape exports.
    #[arg(long, default_value_t = 100)]
    tables: u32,
    /// Buckets of each of those tables.
    #[arg(long, default_value_t = 16)]
    buckets: u32,
    /// How often the scraped runs scrape, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    scrape_every_ms: u64,
    /// Rounds of the write figure (each a scraped and an unscraped run).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Single small appends timed in each run.
    #[arg(long, default_value_t = 1000)]
    acks: usize,
    #[command(flatten)]
    node: NodeArgs,
}

/// Buckets of the table each run appends to.
const APPEND_BUCKETS: u32 = 8;
const ACK_WARMUP: usize = 20;
const ACK_ROWS: usize = 100;
const SCRAPE_WARMUP: usize = 3;
const SCRAPES: usize = 20;

pub(crate) async fn run(args: MetricsArgs) -> Result<(), BenchError> {
    let (scratch, data, config) = prepare(&args.node, args.rows)?;
    println!(
        "mink-bench metrics: {} rows a run, {} tables of {} buckets scraped; {}",
        args.rows,
        args.tables,
        args.buckets,
        args.node.describe(&config, &scratch)
    );
    let running = Running::start(config).await?;
    for table in 0..args.tables {
        let path = TablePath::new("bench", format!("scraped{table}"));
        let options = lake_options(args.buckets, ON_DEMAND_FRESHNESS);
        create_table_with(&running.client, &path, &data.schema, &[], options).await?;
    }
    scrape_figure(&running.node);
    write_figure(&running, &data, &args).await?;
    running.stop().await?;
    Ok(())
}

/// One scrape of the node, as the metrics port answers it: the text.
fn scrape(node: &Node) -> String {
    mink_metrics::encode(node.scraped_metrics())
}

/// Figure 1: a scrape's time and size.
fn scrape_figure(node: &Node) {
    let mut samples = Vec::with_capacity(SCRAPES);
    let mut bytes = 0;
    for i in 0..SCRAPE_WARMUP + SCRAPES {
        let started = Instant::now();
        let text = scrape(node);
        if i >= SCRAPE_WARMUP {
            samples.push(started.elapsed().as_secs_f64() * 1e3);
            bytes = text.len();
        }
    }
    let series = scrape(node).lines().filter(|l| !l.starts_with('#')).count();
    report(
        "scrape",
        Latency::new(samples),
        &[format!("{} KB, {series} series", bytes / 1000)],
    );
}

/// The figures of one run of [`write_figure`].
struct Run {
    append: Duration,
    ack: Latency,
}

/// Figure 2: appends and acknowledgements, scraped against not, in interleaved rounds.
async fn write_figure(
    running: &Running,
    data: &Data,
    args: &MetricsArgs,
) -> Result<(), BenchError> {
    let every = Duration::from_millis(args.scrape_every_ms.max(1));
    let (mut scraped, mut unscraped) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        for scrape_this_run in [round % 2 == 0, round % 2 != 0] {
            let scraper = scrape_this_run.then(|| Scraper::start(&running.node, every));
            let name = format!(
                "run{round}_{}",
                if scrape_this_run { "scraped" } else { "plain" }
            );
            let run = write_run(running, data, &name, args.acks).await?;
            drop(scraper);
            match scrape_this_run {
                true => scraped.push(run),
                false => unscraped.push(run),
            }
        }
    }
    let appends: Vec<(Duration, Duration)> = (unscraped.iter().zip(&scraped))
        .map(|(u, s)| (u.append, s.append))
        .collect();
    report_rounds(
        ["append 8 buckets, not scraped", "append 8 buckets, scraped"],
        "not scraped",
        (data.rows, data.memory_bytes()),
        &appends,
    );
    // The median over the runs of each run's quantile.
    let quantile = |runs: &[Run], p99: bool| {
        let of = |run: &Run| if p99 { run.ack.p99 } else { run.ack.p50 };
        Latency::new(runs.iter().map(of).collect()).p50
    };
    for (label, p99) in [("p50", false), ("p99", true)] {
        let (s, u) = (quantile(&scraped, p99), quantile(&unscraped, p99));
        println!(
            "ack latency {label}: scraped {s:.3} ms, not scraped {u:.3} ms ({:.3}x)",
            s / u
        );
    }
    Ok(())
}

/// A run: `--rows` rows appended to a fresh 8-bucket table, then the acknowledgement
/// latency of single small appends.
async fn write_run(
    running: &Running,
    data: &Data,
    name: &str,
    acks: usize,
) -> Result<Run, BenchError> {
    let path = TablePath::new("bench", name);
    let table = create_table(&running.client, &path, APPEND_BUCKETS, &data.schema, &[]).await?;
    let parts = split(&data.batches, APPEND_BUCKETS);
    let ((), append) = measure(name, append_parts(&running.client, &path, parts)).await?;
    let bucket = BucketId::new(&path, 0);
    let mut rng = seeded(7);
    let batches = (0..ACK_WARMUP + acks)
        .map(|i| make_batch(&data.schema, (i * ACK_ROWS) as i64, ACK_ROWS, &mut rng))
        .collect::<Result<Vec<_>, _>>()?;
    let ack = latency(name, ACK_WARMUP, acks, ACK_ROWS, |i| {
        let (client, bucket, batch) = (running.client.clone(), bucket.clone(), batches[i].clone());
        async move {
            client.append(&bucket, vec![batch]).await?;
            Ok(ACK_ROWS)
        }
    })
    .await?;
    running.client.drop_table_instance(&table).await?;
    Ok(Run { append, ack })
}

/// A task scraping a node every so often, stopped when dropped.
struct Scraper(JoinHandle<()>);

impl Scraper {
    fn start(node: &Arc<Node>, every: Duration) -> Self {
        let node = Arc::clone(node);
        Self(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            loop {
                ticks.tick().await;
                // As the metrics port does: off the runtime's workers.
                let node = Arc::clone(&node);
                let scraped = tokio::task::spawn_blocking(move || scrape(&node)).await;
                std::hint::black_box(scraped.ok());
            }
        }))
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        self.0.abort();
    }
}
