//! `mink-bench kv`: primary-key tables, against log tables and Scan.
//!
//! ```text
//! cargo run --release -p mink-bench -- kv [--keys 1000000] [--buckets 1] [--dir DIR] [--no-sync]
//!     [--kv-cache SIZE] [--kv-write-buffer SIZE]
//! ```
//!
//! Primary-key tables, on the same kind of node and with the same schema as `log`'s, in a table
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
//!    phase does pay for those the load leaves behind). Three rounds, each on fresh tables
//!    (`bench.kv_round1`, `bench.kv_round2`, then `bench.kv`; each round's log table is
//!    its name with `_log`, dropped once written, as are the first rounds' primary-key
//!    tables): each figure is the median of its rounds, its ratio the median of the
//!    rounds' ratios, printed with each round's. Each phase also prints the CPU time per
//!    row the process used during its writes and during the log table's (all threads, the
//!    node's background work and the client included; medians of the rounds): the work
//!    a row costs, steadier than the throughput.
//! 2. **Lookup latency**, p50 and p99, of 2000 [`MinkClient::lookup`] calls of 1 key and
//!    500 calls of 100 keys (after 20 uncounted warm-up calls each), the keys drawn at
//!    random from the `--keys` loaded ones, so all exist. Baseline: a Scan of one batch of
//!    a small log table from the log cache, the cheapest round trip of the protocol: of a
//!    1-row batch against the 1-key lookups, of a 100-row batch against the 100-key ones,
//!    so both answers carry as many rows. Each lookup follows a baseline call, so both
//!    see the same conditions (background compactions, other processes).
//!    Then the same 1-key lookups again (*under load*) while another primary-key table,
//!    `bench.kv_busy`, takes the load's batches as upserts, one write after another, over
//!    and over on the same node, the idle figure beside them.
//! 3. **Snapshot throughput**: [`MinkClient::snapshot_stream`] of every bucket (all at
//!    once, in batches of 10 000 rows), each batch let go of as it comes, as the Scan
//!    baseline's are. Baseline: a Scan, from the log cache, of a log table `bench.kv_rows`
//!    holding exactly the snapshot's rows in the same batches (an untimed snapshot's
//!    batches, appended to it bucket for bucket) — not of the changelog, which also holds
//!    every overwritten version. Three rounds alternate a Scan and a Snapshot; each figure
//!    is the median of its rounds.
//!
//! [`MinkClient::write`]: mink_client::MinkClient::write
//! [`MinkClient::lookup`]: mink_client::MinkClient::lookup
//! [`MinkClient::snapshot`]: mink_client::MinkClient::snapshot
//! [`MinkClient::snapshot_stream`]: mink_client::MinkClient::snapshot_stream

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use futures::TryStreamExt as _;
use futures::future::try_join_all;
use mink_client::MinkClient;
use mink_core::protocol::BucketId;
use mink_core::table::{TableDescriptor, TablePath};
use rand::Rng;
use rand::seq::SliceRandom;

use crate::data::{BATCH_ROWS, Data, ipc_len, make_batch, seeded};
use crate::error::BenchError;
use crate::harness::{
    CALL_WARMUP, NodeArgs, ROUNDS, Running, Scratch, Throughput, Timed, append_parts, buckets_of,
    check_logged, check_rows, create_table, measure, measure_with_cpu, median, paired_latency,
    report, report_cpu_per_row, report_rounds, scan_bucket, write_batches,
};

/// Arguments of `mink-bench kv`.
#[derive(Debug, clap::Args)]
pub(crate) struct KvArgs {
    /// Keys to load, in batches of 10 000; half as many rows are upserted after.
    #[arg(long, default_value_t = 1_000_000)]
    keys: usize,
    /// Buckets of every table.
    #[arg(long, default_value_t = 1)]
    buckets: u32,
    #[command(flatten)]
    node: NodeArgs,
}

/// In the update phase, one row in this many updates an existing key.
const UPDATE_EVERY: usize = 10;
/// Lookup calls measured per lookup size: (keys per call, calls).
const LOOKUPS: [(usize, usize); 2] = [(1, 2000), (100, 500)];

pub(crate) async fn run(args: KvArgs) -> Result<(), BenchError> {
    if args.keys == 0 {
        return Err(BenchError::Usage("--keys must be at least 1".into()));
    }
    if args.buckets == 0 {
        return Err(BenchError::Usage("--buckets must be at least 1".into()));
    }
    let scratch = Scratch::new(args.node.dir.clone())?;
    eprintln!("bench: generating {} keys and their upserts", args.keys);
    let data = KvData::generate(args.keys)?;
    // Room for the largest log, so the Scan baselines are served from the cache.
    let memory = data.load.memory_bytes() + data.upserts.memory_bytes();
    let config = args.node.config(&scratch, 2 * memory + (64 << 20));
    println!(
        "mink-bench kv: {} keys, then {} upserts ({} of existing keys) in batches of {BATCH_ROWS}, {} bucket{}, {}",
        data.load.rows,
        data.upserts.rows,
        data.updates,
        args.buckets,
        if args.buckets == 1 { "" } else { "s" },
        args.node.describe(&config, &scratch)
    );
    let running = Running::start(config).await?;
    let table = upsert_figure(&running, &data, args.buckets).await?;
    let ping = Ping::create(&running, table.schema()).await?;
    lookup_figure(&running, &ping, &table, data.load.rows, LOOKUPS.iter(), "").await?;
    let busy = create_table(
        &running.client,
        &TablePath::new("bench", "kv_busy"),
        args.buckets,
        &data.load.schema,
        &["id"],
    )
    .await?;
    let load = tokio::spawn(keep_upserting(
        running.client.clone(),
        busy,
        data.load.batches.clone(),
    ));
    let under_load = lookup_figure(
        &running,
        &ping,
        &table,
        data.load.rows,
        LOOKUPS.iter().take(1),
        " under upsert load",
    )
    .await;
    load.abort();
    if let Ok(Err(error)) = load.await {
        return Err(error);
    }
    under_load?;
    snapshot_figure(&running, &table, data.final_rows()).await?;
    running.stop().await?;
    Ok(())
}

/// Figure 1: upsert throughput, loading new keys and then with 10% updates, against
/// writing the same batches to a log table, in [`ROUNDS`] rounds on fresh tables: each
/// figure is the median of its rounds, each ratio the median of the rounds' ratios (this
/// machine's own rates move 2x-3x between runs, so one round says little). Returns the
/// last round's primary-key table, loaded.
async fn upsert_figure(
    running: &Running,
    data: &KvData,
    buckets: u32,
) -> Result<TableDescriptor, BenchError> {
    let client = &running.client;
    let mut rounds = Vec::with_capacity(ROUNDS);
    for round in 1..ROUNDS {
        let (times, kv) = upsert_round(client, data, buckets, &format!("kv_round{round}")).await?;
        client.drop_table_instance(&kv).await?;
        rounds.push(times);
    }
    let (times, kv) = upsert_round(client, data, buckets, "kv").await?;
    rounds.push(times);
    for (index, phase) in data.phases().into_iter().enumerate() {
        let times = |of: fn(&Timed) -> Duration| -> Vec<(Duration, Duration)> {
            (rounds.iter())
                .map(|round| (of(&round[index].log), of(&round[index].upsert)))
                .collect()
        };
        let size = (phase.rows.rows, ipc_len(&phase.rows.batches)?);
        let baseline_label = format!("baseline log write: {}", phase.name);
        report_rounds(
            [&baseline_label, phase.label],
            "log write",
            size,
            &times(|timed| timed.elapsed),
        );
        let cpu_label = format!("{}, CPU", phase.label);
        report_cpu_per_row(
            &cpu_label,
            "log write",
            phase.rows.rows,
            &times(|timed| timed.cpu),
        );
    }
    Ok(kv)
}

/// How long `read` takes over every bucket of `table` at once; each bucket's read returns
/// the rows it read, `rows` in all.
async fn read_buckets<Read, F>(
    what: &str,
    table: &TableDescriptor,
    rows: usize,
    read: Read,
) -> Result<Duration, BenchError>
where
    Read: FnMut(BucketId) -> F,
    F: Future<Output = Result<usize, BenchError>>,
{
    let reads = buckets_of(table).into_iter().map(read);
    let (read_rows, elapsed) = measure(what, async {
        Ok(try_join_all(reads).await?.into_iter().sum())
    })
    .await?;
    check_rows(what, read_rows, rows)?;
    Ok(elapsed)
}

/// The rows of `bucket`'s snapshot, read as a stream: one batch held at a time.
async fn snapshot_rows(client: &MinkClient, bucket: &BucketId) -> Result<usize, BenchError> {
    let mut batches = client
        .snapshot_stream(bucket, &[], BATCH_ROWS as u32)
        .await?;
    let mut rows = 0;
    while let Some(batch) = batches.try_next().await? {
        rows += batch.num_rows();
    }
    Ok(rows)
}

/// A round's times of a phase of [`upsert_figure`]: of the log write, of the upserts.
struct PhaseTimes {
    log: Timed,
    upsert: Timed,
}

/// A phase of [`upsert_figure`].
struct Phase<'a> {
    name: &'static str,
    /// Of its figure.
    label: &'static str,
    rows: &'a Data,
    /// Rows that update a key.
    updates: usize,
}

/// One round of [`upsert_figure`]: a log table and a primary-key table `bench.{name}`,
/// created for it, take both phases, the log table first, so its writes never share the
/// machine with the KV store's background work (the update phase does pay for what the
/// load leaves behind). Drops the log table; returns, per phase, the log write's time and
/// the upserts', and the primary-key table, loaded.
async fn upsert_round(
    client: &MinkClient,
    data: &KvData,
    buckets: u32,
    name: &str,
) -> Result<(Vec<PhaseTimes>, TableDescriptor), BenchError> {
    let schema = &data.load.schema;
    let log_path = TablePath::new("bench", format!("{name}_log"));
    let log = create_table(client, &log_path, buckets, schema, &[]).await?;
    let kv_path = TablePath::new("bench", name);
    let kv = create_table(client, &kv_path, buckets, schema, &["id"]).await?;
    let mut log_times = Vec::new();
    for phase in data.phases() {
        let write = write_batches(client, &log, &phase.rows.batches);
        let what = format!("log write: {} ({name})", phase.name);
        let ((), timed) = measure_with_cpu(&what, write).await?;
        log_times.push(timed);
    }
    check_logged(client, &log, data.load.rows + data.upserts.rows).await?;
    client.drop_table_instance(&log).await?;
    let mut changelog_rows = 0;
    let mut times = Vec::new();
    for (phase, log) in data.phases().into_iter().zip(log_times) {
        let write = write_batches(client, &kv, &phase.rows.batches);
        let what = format!("upsert: {} ({name})", phase.name);
        let ((), upsert) = measure_with_cpu(&what, write).await?;
        // Rows that update a key log -U and +U, inserts +I.
        changelog_rows += phase.rows.rows + phase.updates;
        check_logged(client, &kv, changelog_rows).await?;
        times.push(PhaseTimes { log, upsert });
    }
    Ok((times, kv))
}

/// The baseline of the lookup figures: a log table `bench.ping` holding one batch per
/// lookup size of [`LOOKUPS`], of as many rows.
struct Ping {
    bucket: BucketId,
    /// The offset of each batch, in the order of [`LOOKUPS`].
    offsets: Vec<i64>,
}

impl Ping {
    async fn create(running: &Running, schema: &SchemaRef) -> Result<Self, BenchError> {
        let client = &running.client;
        let ping_path = TablePath::new("bench", "ping");
        let ping = create_table(client, &ping_path, 1, schema, &[]).await?;
        let bucket = BucketId::new(&ping.path, 0);
        let mut rng = seeded(0x9149);
        let batches = LOOKUPS
            .iter()
            .map(|&(rows, _)| make_batch(schema, 0, rows, &mut rng))
            .collect::<Result<Vec<_>, _>>()?;
        let acks = client.append(&bucket, batches).await?;
        let offsets = acks.iter().map(|ack| ack.base_offset).collect();
        Ok(Self { bucket, offsets })
    }
}

/// Figure 2: lookup latency of random existing keys, `sizes` (keys per call, calls),
/// against a Scan of one cached batch of as many rows; `condition` ends each label.
async fn lookup_figure(
    running: &Running,
    ping: &Ping,
    table: &TableDescriptor,
    keys: usize,
    sizes: impl Iterator<Item = &(usize, usize)>,
    condition: &str,
) -> Result<(), BenchError> {
    let client = &running.client;
    let bucket = &ping.bucket;
    let mut rng = seeded(0x100c);
    let key_schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    for (&(per_call, calls), &offset) in sizes.zip(&ping.offsets) {
        // max_bytes 1: a Scan answers with at least one batch, and here with only that one.
        let scan = move |_| async move {
            Ok::<_, BenchError>(client.scan(bucket, offset, 1, &[]).await?.num_rows())
        };
        let lookups = &(0..CALL_WARMUP + calls)
            .map(|_| {
                let ids = (0..per_call).map(|_| rng.random_range(0..keys as i64));
                let ids = Arc::new(Int64Array::from_iter_values(ids));
                RecordBatch::try_new(Arc::clone(&key_schema), vec![ids])
            })
            .collect::<Result<Vec<_>, _>>()?;
        let lookup = move |i: usize| async move {
            let found = client.lookup(table, &lookups[i], &[]).await?;
            Ok::<_, BenchError>(found.rows.num_rows())
        };
        let label = format!(
            "lookup {per_call} key{}, {calls} calls{condition}",
            if per_call == 1 { "" } else { "s" }
        );
        let (baseline, figure) =
            paired_latency(&label, CALL_WARMUP, calls, per_call, scan, lookup).await?;
        let ratio = format!("vs scan {}", figure.ratio_to(&baseline));
        let name = format!("baseline scan {per_call}-row batch{condition}");
        report(&name, baseline, &[]);
        report(&label, figure, &[ratio]);
    }
    Ok(())
}

/// Upserts `batches` into `table`, one write at a time, over and over until a write fails
/// (or the task is aborted): the load of the lookup figure's second part.
async fn keep_upserting(
    client: MinkClient,
    table: TableDescriptor,
    batches: Vec<RecordBatch>,
) -> Result<(), BenchError> {
    loop {
        for batch in &batches {
            client.write(&table, batch).await?;
        }
    }
}

/// Figure 3: Snapshot throughput, against a Scan of a log table holding the same rows.
async fn snapshot_figure(
    running: &Running,
    table: &TableDescriptor,
    rows: usize,
) -> Result<(), BenchError> {
    let client = &running.client;
    let batches = buckets_of(table)
        .into_iter()
        .map(|bucket| async move { client.snapshot(&bucket, &[], BATCH_ROWS as u32).await });
    let parts: Vec<Vec<RecordBatch>> = (try_join_all(batches).await?.into_iter())
        .map(|answer| answer.batches)
        .collect();
    let kept: usize = parts.iter().flatten().map(RecordBatch::num_rows).sum();
    check_rows("the snapshot", kept, rows)?;
    let bytes = ipc_len(parts.iter().flatten())?;
    let copy_path = TablePath::new("bench", "kv_rows");
    let copy = create_table(client, &copy_path, table.bucket_num, table.schema(), &[]).await?;
    append_parts(client, &copy.path, parts).await?;
    // Alternate, so both see the same conditions.
    let (mut scans, mut snapshots) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let scan = |bucket| async move { scan_bucket(client, &bucket).await };
        scans.push(read_buckets("scan the same rows", &copy, rows, scan).await?);
        let snapshot = |bucket| async move { snapshot_rows(client, &bucket).await };
        snapshots.push(read_buckets("snapshot", table, rows, snapshot).await?);
    }
    let figure = Throughput::new(rows, bytes, median(snapshots));
    let baseline = Throughput::new(rows, bytes, median(scans));
    report("baseline scan of the same rows", baseline, &[]);
    let ratio = format!("vs scan {:.2}", figure.ratio_to(&baseline));
    report("snapshot", figure, &[ratio]);
    Ok(())
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
    fn generate(keys: usize) -> Result<Self, BenchError> {
        let load = Data::generate(keys)?;
        let rows = (keys / 2).max(1);
        let updates = rows.div_ceil(UPDATE_EVERY);
        let mut rng = seeded(0xda7a);
        // A partial Fisher-Yates shuffle: `updates` distinct random keys.
        let mut keys_loaded: Vec<i64> = (0..keys as i64).collect();
        let (existing, _) = keys_loaded.partial_shuffle(&mut rng, updates);
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
            upserts: Data::with_ids(&ids, rng.random())?,
            updates,
        })
    }

    /// The two phases of the upsert figure, in order.
    fn phases(&self) -> [Phase<'_>; 2] {
        [
            Phase {
                name: "load",
                label: "upsert load (all keys new)",
                rows: &self.load,
                updates: 0,
            },
            Phase {
                name: "10% updates",
                label: "upsert 10% updates",
                rows: &self.upserts,
                updates: self.updates,
            },
        ]
    }

    /// Rows of the primary-key table once both phases are written.
    fn final_rows(&self) -> usize {
        self.load.rows + self.upserts.rows - self.updates
    }
}
