//! Figure 2 of `mink-bench log-store`: PUTs per second, throughput and acknowledgement
//! latency of nodes under many writers, on many buckets and on few (see the suite's
//! documentation).

use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use mink_client::MinkClient;
use mink_core::protocol::BucketId;
use mink_core::table::TablePath;
use tokio::task::JoinSet;

use super::{LogNode, Nodes, wal_objects, write_back};
use crate::data::{ipc_len, make_batch, seeded};
use crate::error::BenchError;
use crate::harness::{
    Latency, ROUNDS, Throughput, check_logged, create_table, ratio_of_rounds, report,
};

/// Bucket counts of the figure.
const BUCKETS: [u32; 2] = [64, 4];
/// Rows of each writer's batch, one a call.
const CALL_ROWS: usize = 100;

/// How the nodes are loaded.
#[derive(Debug)]
pub(super) struct Load {
    /// Writer tasks.
    pub(super) writers: usize,
    /// How long each node is loaded in each round.
    pub(super) duration: Duration,
}

/// One node loaded once.
#[derive(Debug)]
struct Run {
    rows: usize,
    elapsed: Duration,
    /// Every call's acknowledgement latency, in milliseconds.
    latencies: Vec<f64>,
    /// WAL objects created meanwhile.
    created: Created,
}

/// Prints figure 2: every node of `nodes` loaded as `load` says, rows of `schema`.
pub(super) async fn figure(
    nodes: &Nodes,
    schema: &SchemaRef,
    load: &Load,
) -> Result<(), BenchError> {
    let mut rng = seeded(0x10ad);
    let batches = (0..load.writers)
        .map(|w| make_batch(schema, (w * CALL_ROWS) as i64, CALL_ROWS, &mut rng))
        .collect::<Result<Vec<_>, _>>()?;
    let row_bytes = ipc_len(&batches)? / (load.writers * CALL_ROWS) as u64;
    for buckets in BUCKETS {
        let mut runs: Vec<Vec<Run>> = nodes.all().map(|_| Vec::with_capacity(ROUNDS)).collect();
        for round in 1..=ROUNDS {
            for (node, of_node) in nodes.all().zip(&mut runs) {
                of_node.push(run(node, schema, buckets, round, &batches, load.duration).await?);
            }
        }
        println!(
            "Under load: {buckets} buckets, {} writers of one {CALL_ROWS}-row batch a call, \
             {} s a node in each of {ROUNDS} rounds:",
            load.writers,
            load.duration.as_secs()
        );
        report_runs(nodes, &runs, row_bytes);
    }
    Ok(())
}

/// Reports each node's runs beside the local node's (the first).
fn report_runs(nodes: &Nodes, runs: &[Vec<Run>], row_bytes: u64) {
    let Some(local) = runs.first() else {
        return;
    };
    let local_latency = pooled_latency(local);
    for (node, of_node) in nodes.all().zip(runs) {
        let Some(middle) = median_rate(of_node) else {
            continue;
        };
        let throughput =
            Throughput::new(middle.rows, middle.rows as u64 * row_bytes, middle.elapsed);
        let latency = pooled_latency(of_node);
        let label = &node.label;
        if node.store.is_none() {
            report(&format!("  {label}"), throughput, &[]);
            report(&format!("  {label}, ack"), latency, &[]);
            continue;
        }
        // Rates compared as times for the same rows: each run's rows over its elapsed.
        let as_times: Vec<(Duration, Duration)> = (local.iter().zip(of_node))
            .map(|(base, run)| (per_row(base), per_row(run)))
            .collect();
        report(
            &format!("  {label}"),
            throughput,
            &[ratio_of_rounds("local", &as_times)],
        );
        let ratio = format!("vs local {}", latency.ratio_to(&local_latency));
        report(&format!("  {label}, ack"), latency, &[ratio]);
        let mut puts: Vec<f64> = (of_node.iter())
            .map(|run| run.created.objects as f64 / run.elapsed.as_secs_f64())
            .collect();
        puts.sort_by(f64::total_cmp);
        let objects: u64 = of_node.iter().map(|run| run.created.objects).sum();
        let bytes: f64 = (of_node.iter())
            .map(|run| run.created.mean_bytes * run.created.objects as f64)
            .sum();
        let calls: usize = of_node.iter().map(|run| run.latencies.len()).sum();
        report(
            &format!("  {label}, PUTs"),
            format!(
                "{:>7.1} PUTs/s, {:.1} kB and {:.1} calls each",
                puts.get(puts.len() / 2).copied().unwrap_or_default(),
                bytes / 1e3 / objects.max(1) as f64,
                calls as f64 / objects.max(1) as f64,
            ),
            &[],
        );
    }
}

/// A run's time per row, as a duration (rows per second compared as times).
fn per_row(run: &Run) -> Duration {
    run.elapsed.div_f64(run.rows.max(1) as f64)
}

/// The run whose rate of rows is the median (the upper one of an even count).
fn median_rate(runs: &[Run]) -> Option<&Run> {
    let mut runs: Vec<&Run> = runs.iter().collect();
    runs.sort_by_key(|run| std::cmp::Reverse(per_row(run)));
    runs.get(runs.len() / 2).copied()
}

/// The latency of every call of every run.
fn pooled_latency(runs: &[Run]) -> Latency {
    Latency::new(
        runs.iter()
            .flat_map(|run| run.latencies.iter().copied())
            .collect(),
    )
}

/// Loads `node` once: one writer task per batch of `batches` appending it to a fresh log
/// table of `buckets` buckets for `duration`.
async fn run(
    node: &LogNode,
    schema: &SchemaRef,
    buckets: u32,
    round: usize,
    batches: &[RecordBatch],
    duration: Duration,
) -> Result<Run, BenchError> {
    let client = &node.running.client;
    let path = TablePath::new("bench", format!("load{buckets}_round{round}"));
    let table = create_table(client, &path, buckets, schema, &[]).await?;
    write_back().await?;
    let before = match &node.store {
        Some(store) => last_place(&wal_objects(store).await?),
        None => (0, 0),
    };
    eprintln!(
        "bench: {} writers on {buckets} buckets of {}, {} s ...",
        batches.len(),
        node.label,
        duration.as_secs()
    );
    let start = Instant::now();
    let mut writers = JoinSet::new();
    for (writer, batch) in (0u32..).zip(batches) {
        let bucket = BucketId::new(&path, writer % buckets);
        writers.spawn(write_until(
            client.clone(),
            bucket,
            batch.clone(),
            start + duration,
        ));
    }
    let (mut rows, mut latencies) = (0, Vec::new());
    while let Some(done) = writers.join_next().await {
        let (written, of_writer) = done??;
        rows += written;
        latencies.extend(of_writer);
    }
    let elapsed = start.elapsed();
    let created = match &node.store {
        Some(store) => created_since(&wal_objects(store).await?, before),
        None => Created::default(),
    };
    check_logged(client, &table, rows).await?;
    client.drop_table_instance(&table).await?;
    Ok(Run {
        rows,
        elapsed,
        latencies,
        created,
    })
}

/// The WAL objects a run created.
#[derive(Debug, Default, Clone, Copy)]
struct Created {
    /// How many (places taken, counting those the upkeep deleted since).
    objects: u64,
    /// The mean bytes of those still there.
    mean_bytes: f64,
}

/// The place of the last of `objects` (all of one writer's epoch in a run).
fn last_place(objects: &[((u64, u64), u64)]) -> (u64, u64) {
    objects
        .iter()
        .map(|object| object.0)
        .max()
        .unwrap_or_default()
}

/// What `objects` hold that was created after the place `before`.
fn created_since(objects: &[((u64, u64), u64)], before: (u64, u64)) -> Created {
    let last = last_place(objects);
    let new: Vec<u64> = (objects.iter())
        .filter(|(place, _)| *place > before)
        .map(|object| object.1)
        .collect();
    Created {
        objects: match last.0 == before.0 {
            true => last.1 - before.1,
            false => new.len() as u64,
        },
        mean_bytes: new.iter().sum::<u64>() as f64 / new.len().max(1) as f64,
    }
}

/// Appends `batch` to `bucket`, one call at a time, until `deadline`; the rows written and
/// each call's latency in milliseconds.
async fn write_until(
    client: MinkClient,
    bucket: BucketId,
    batch: RecordBatch,
    deadline: Instant,
) -> Result<(usize, Vec<f64>), BenchError> {
    let (mut rows, mut latencies) = (0, Vec::new());
    while Instant::now() < deadline {
        let call = Instant::now();
        client.append(&bucket, vec![batch.clone()]).await?;
        latencies.push(call.elapsed().as_secs_f64() * 1e3);
        rows += batch.num_rows();
    }
    Ok((rows, latencies))
}
