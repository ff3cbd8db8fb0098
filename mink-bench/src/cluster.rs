//! `mink-bench cluster`: what a node's death costs a cluster (`mink server --cluster`).
//!
//! ```text
//! cargo run --release -p mink-bench -- cluster [--trials 10] [--lease 2s] [--buckets 6]
//!     [--rows-per-bucket 1000] [--primary-key] [--redirects 200] [--dir DIR]
//! ```
//!
//! Each trial runs a fresh cluster of three nodes in this process, over an etcd of its
//! own (Debian's `etcd-server` on `PATH`) and a `file://` log store in the working
//! directory, each node served on a loopback port and driven through `MinkClient`, which
//! follows NotLeader answers. A log table (`--primary-key`: a primary-key table) of
//! `--buckets` buckets gets `--rows-per-bucket` rows (keys) a bucket; then the node
//! leading the most buckets (not the one the client connected to) dies: it stops serving
//! and renewing its lease, as a killed process does. From that moment, each
//! of its buckets is written one row at a time (a call given up after 3 s, as on a node
//! gone) until a write is acknowledged: its failover. The trial's figure is its slowest
//! bucket's.
//!
//! Figure, p50 and p99 over the trials: the failover. The baseline is the lease
//! (`--lease`): a dead node's buckets wait it out whatever mink does (less up to a third:
//! etcd counts it from the node's last renewal, every third of it), so the failover's
//! ratio to it says what mink adds (the controller noticing, the drain of the dead node's
//! WAL, the new leaders' take-over: for a primary-key bucket, restoring its KV store from
//! its last checkpoint and replaying the log after it).
//!
//! A second figure, from the first trial's cluster before its node dies: what a request
//! sent to a node that does not lead its bucket costs. A new client connected to the
//! bucket's leader asks for its high watermark (`list_offsets`): the baseline; a new
//! client connected to another node asks the same, is answered NotLeader and follows it.
//! The difference is the redirect: one round trip to the first node and a connection to
//! the leader.
//!
//! A third: how long writing the table takes (`WRITE_ROWS` rows a write, one write at a
//! time, each spread over the buckets' leaders), the three-node cluster against a
//! one-node cluster of the same kind (same etcd, same log store, same client), run first
//! in each trial. Every node runs in this one process, on the same cores: this says what
//! spreading the buckets costs or gains on one machine, not what more machines give.
//!
//! A fourth, in the first trial too, on both clusters: a row written through the first
//! node (to its bucket's leader) and read back through the last node (a Scan of the
//! leader from the row's offset), from the write's start to the read's answer.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use mink_client::MinkClient;
use mink_core::options::{TableOptions, parse_duration};
use mink_core::protocol::{BucketId, list_offsets};
use mink_core::routing::split_rows_by_bucket;
use mink_core::table::{TableDescriptor, TablePath};
use mink_node::testing::{ClusterNode, Etcd};

use crate::error::BenchError;
use crate::harness::{Latency, Scratch, report};

/// Arguments of `mink-bench cluster`.
#[derive(Debug, clap::Args)]
pub(crate) struct ClusterArgs {
    /// Clusters started, each losing one node.
    #[arg(long, default_value_t = 10)]
    trials: usize,
    /// The nodes' etcd lease (`--cluster-lease`).
    #[arg(long, default_value = "2s", value_parser = parse_lease)]
    lease: Duration,
    /// Buckets of the table.
    #[arg(long, default_value_t = 6)]
    buckets: u32,
    /// Rows written to each bucket before the node dies (keys, with `--primary-key`).
    #[arg(long, default_value_t = 1_000)]
    rows_per_bucket: i64,
    /// A primary-key table (its key `id`), not a log table.
    #[arg(long)]
    primary_key: bool,
    /// Requests timed for the redirect and the write -> visible figures (in the first
    /// trial).
    #[arg(long, default_value_t = 200)]
    redirects: usize,
    /// Working directory (default: a temporary one, removed after).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

/// Nodes of each trial's cluster.
const NODES: usize = 3;
/// Rows per write while the table is filled.
const WRITE_ROWS: usize = 50_000;
/// How long a write waits for its answer before its node is taken for gone.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a bucket may take to fail over before the trial is given up.
const MAX_FAILOVER: Duration = Duration::from_secs(120);

fn parse_lease(text: &str) -> Result<Duration, String> {
    parse_duration(text).ok_or_else(|| format!("'{text}' is not a duration (2s, 500ms)"))
}

pub(crate) async fn run(args: ClusterArgs) -> Result<(), BenchError> {
    if args.trials == 0 || args.buckets < NODES as u32 || args.rows_per_bucket < 1 {
        return Err(BenchError::Usage(format!(
            "--trials and --rows-per-bucket must be above 0 and --buckets at least {NODES}"
        )));
    }
    let scratch = Scratch::new(args.dir.clone())?;
    let etcd = Etcd::start();
    let mut failovers = Vec::with_capacity(args.trials);
    let (mut one_node_fills, mut fills) = (Vec::new(), Vec::new());
    let (mut one_node_visible, mut visible) = (Vec::new(), Vec::new());
    let mut redirects = None;
    for trial in 0..args.trials {
        let dir = scratch.path.join(format!("trial-{trial}"));
        let one_node = format!("{trial}-one");
        let one_node = Cluster::start(&etcd, &dir.join("one"), &one_node, 1, &args).await?;
        one_node_fills.push(one_node.filled_in);
        if trial == 0 {
            one_node_visible = one_node.write_to_visible(args.redirects).await?;
        }
        one_node.stop().await;
        let cluster = Cluster::start(&etcd, &dir, &trial.to_string(), NODES, &args).await?;
        fills.push(cluster.filled_in);
        if trial == 0 {
            redirects = Some(cluster.redirects(args.redirects).await?);
            visible = cluster.write_to_visible(args.redirects).await?;
        }
        let failover = cluster.failover().await?;
        eprintln!("trial {trial}: failover {failover:?}");
        failovers.push(failover);
    }
    let kind = match args.primary_key {
        true => "primary-key",
        false => "log",
    };
    println!(
        "# a node's death in a cluster of {NODES}, a {kind} table of {} buckets of {} rows, \
         lease {:?}, {} trials",
        args.buckets, args.rows_per_bucket, args.lease, args.trials
    );
    let lease = [args.lease];
    report_against(("lease", &lease), ("failover", &failovers), "the lease");
    let rows = args.rows_per_bucket * i64::from(args.buckets);
    println!("# writing the table's {rows} rows, {WRITE_ROWS} a write, one write at a time");
    let one_node = ("one node", one_node_fills.as_slice());
    report_against(one_node, ("three nodes", &fills), "one node's");
    println!(
        "# a row written through the first node, read back through the last, {} rows",
        args.redirects
    );
    let one_node = ("one node", one_node_visible.as_slice());
    report_against(one_node, ("three nodes", &visible), "one node's");
    if let Some((direct, redirected)) = redirects {
        println!("# a new client's list_offsets, {} requests", args.redirects);
        let redirected = ("sent to another node, redirected", redirected.as_slice());
        report_against(("sent to the leader", &direct), redirected, "the leader's");
    }
    Ok(())
}

/// `size` nodes `n0`, `n1`... of a cluster over `etcd` under prefix `/bench-<name>`,
/// their data and their `file://` log store under `dir`.
pub(crate) async fn start_nodes(
    etcd: &Etcd,
    dir: &Path,
    name: &str,
    size: usize,
    lease: Duration,
) -> Result<Vec<ClusterNode>, BenchError> {
    let prefix = format!("/bench-{name}");
    let store = dir.join("store");
    std::fs::create_dir_all(&store).map_err(|source| BenchError::Io {
        context: format!("creating {}", store.display()),
        source,
    })?;
    let mut nodes = Vec::with_capacity(size);
    for i in 0..size {
        let id = format!("n{i}");
        let node_dir = dir.join(&id);
        nodes.push(ClusterNode::start(etcd, &prefix, &store, &id, &node_dir, lease).await);
    }
    Ok(nodes)
}

/// Reports the times of `measured` against those of `baseline` (each a name and its
/// times), its ratio to them named `to`.
fn report_against(baseline: (&str, &[Duration]), measured: (&str, &[Duration]), to: &str) {
    let latency =
        |times: &[Duration]| Latency::new(times.iter().map(|t| t.as_secs_f64() * 1e3).collect());
    let (base, times) = (latency(baseline.1), latency(measured.1));
    let ratio = format!("to {to} {}", times.ratio_to(&base));
    report(&format!("{} (baseline)", baseline.0), base, &[]);
    report(measured.0, times, &[ratio]);
}

/// One trial's cluster, its table written.
struct Cluster {
    nodes: Vec<ClusterNode>,
    client: MinkClient,
    table: TableDescriptor,
    /// A row of each bucket, by its id.
    one_per_bucket: Vec<(BucketId, i64)>,
    rows_per_bucket: i64,
    /// How long writing the table took.
    filled_in: Duration,
}

impl Cluster {
    /// A cluster of `size` nodes over `etcd` under prefix `/bench-<name>`, its table
    /// written.
    async fn start(
        etcd: &Etcd,
        dir: &Path,
        name: &str,
        size: usize,
        args: &ClusterArgs,
    ) -> Result<Self, BenchError> {
        let nodes = start_nodes(etcd, dir, name, size, args.lease).await?;
        let client = MinkClient::connect(&nodes[0].address).await?;
        let table = table(args.buckets, args.primary_key)?;
        let table = client.create_table(&table, false).await?;
        let ids: Vec<i64> = (0..args.rows_per_bucket * i64::from(args.buckets)).collect();
        let one_per_bucket = first_id_of_each_bucket(&table, &ids)?;
        let filling = Instant::now();
        for chunk in ids.chunks(WRITE_ROWS) {
            client.write(&table, &rows(&table, chunk)?).await?;
        }
        let written: i64 = (client.list_buckets(&table.path).await?.iter())
            .map(|status| status.high_watermark)
            .sum();
        if written != ids.len() as i64 {
            return Err(BenchError::Mismatch(format!(
                "{written} rows in the logs after writing {}",
                ids.len()
            )));
        }
        let filled_in = filling.elapsed();
        eprintln!("{name}: {} rows written in {filled_in:?}", ids.len());
        Ok(Self {
            nodes,
            client,
            table,
            one_per_bucket,
            rows_per_bucket: args.rows_per_bucket,
            filled_in,
        })
    }

    /// A new client's `list_offsets` of each bucket not led by the first node, `count`
    /// times: connected to its leader, and to the first node, redirected.
    async fn redirects(&self, count: usize) -> Result<(Vec<Duration>, Vec<Duration>), BenchError> {
        let elsewhere: Vec<(&BucketId, String)> = (self.one_per_bucket.iter())
            .map(|(bucket, _)| (bucket, self.client.leader_of(bucket)))
            .filter(|(_, leader)| *leader != self.nodes[0].address)
            .collect();
        if elsewhere.is_empty() {
            return Err(BenchError::Mismatch(
                "the first node leads every bucket: nothing to redirect".into(),
            ));
        }
        let (mut direct, mut redirected) = (Vec::new(), Vec::new());
        for i in 0..count {
            let (bucket, leader) = &elsewhere[i % elsewhere.len()];
            for (times, address) in [
                (&mut direct, leader),
                (&mut redirected, &self.nodes[0].address),
            ] {
                let started = Instant::now();
                let client = MinkClient::connect(address).await?;
                client
                    .list_offsets(bucket, list_offsets::Spec::Latest(true))
                    .await?;
                times.push(started.elapsed());
            }
        }
        Ok((direct, redirected))
    }

    /// `count` times, a new row appended to a bucket through the first node (its
    /// client), then read back through the last node (a client of its own, which
    /// learns each bucket's leader on its first read): from the write's start to the
    /// read's answer.
    async fn write_to_visible(&self, count: usize) -> Result<Vec<Duration>, BenchError> {
        let last = self.nodes.last().expect("a node");
        let reader = MinkClient::connect(&last.address).await?;
        let mut times = Vec::with_capacity(count);
        for i in 0..count {
            // The bucket's own first id, again: a log table takes it once more, a
            // primary-key table updates it.
            let (bucket, id) = &self.one_per_bucket[i % self.one_per_bucket.len()];
            let row = rows(&self.table, &[*id])?;
            let started = Instant::now();
            let acks = self.client.append(bucket, vec![row]).await?;
            let offset = acks.last().map_or(0, |ack| ack.last_offset);
            let read = reader.scan(bucket, offset, 0, &[]).await?;
            if read.num_rows() == 0 {
                return Err(BenchError::Mismatch(format!(
                    "the row written at {offset} of {bucket} is not read back"
                )));
            }
            times.push(started.elapsed());
        }
        Ok(times)
    }

    /// Every thousandth key written is found by a lookup: the buckets that moved serve
    /// their KV stores whole.
    async fn check_keys_served(&self) -> Result<(), BenchError> {
        let written = self.one_per_bucket.len() as i64 * self.rows_per_bucket;
        let keys: Vec<i64> = (0..written).step_by(1_000).collect();
        let key_schema = Arc::new(self.table.schema().project(&[0])?);
        let batch =
            RecordBatch::try_new(key_schema, vec![Arc::new(Int64Array::from(keys.clone()))])?;
        let found = self.client.lookup(&self.table, &batch, &[]).await?;
        if found.rows.num_rows() != keys.len() {
            return Err(BenchError::Mismatch(format!(
                "{} of {} keys found after the failover",
                found.rows.num_rows(),
                keys.len()
            )));
        }
        Ok(())
    }

    /// Kills the node leading the most buckets (the first node aside: the client's own);
    /// how long until every bucket it led took a write again.
    async fn failover(mut self) -> Result<Duration, BenchError> {
        let mut led: Vec<(String, Vec<BucketId>)> = Vec::new();
        for node in &self.nodes[1..] {
            let buckets = (self.one_per_bucket.iter())
                .map(|(bucket, _)| bucket.clone())
                .filter(|bucket| self.client.leader_of(bucket) == node.address)
                .collect();
            led.push((node.address.clone(), buckets));
        }
        led.sort_by_key(|(_, buckets): &(String, Vec<BucketId>)| std::cmp::Reverse(buckets.len()));
        let (dead, its_buckets) = led.remove(0);
        let victim = (self.nodes.iter())
            .position(|node| node.address == dead)
            .expect("a node");
        self.nodes.remove(victim).kill().await;
        let died = Instant::now();
        for (bucket, id) in (self.one_per_bucket.iter()).filter(|(b, _)| its_buckets.contains(b)) {
            let row = rows(&self.table, &[*id])?;
            loop {
                let sent = self.client.append(bucket, vec![row.clone()]);
                if let Ok(Ok(_)) = tokio::time::timeout(CALL_TIMEOUT, sent).await {
                    break;
                }
                if died.elapsed() > MAX_FAILOVER {
                    return Err(BenchError::Mismatch(format!(
                        "bucket {bucket} took no write for {MAX_FAILOVER:?} after its node died"
                    )));
                }
            }
        }
        let failover = died.elapsed();
        if self.table.has_primary_key() {
            self.check_keys_served().await?;
        }
        self.stop().await;
        Ok(failover)
    }

    async fn stop(self) {
        for node in self.nodes {
            node.kill().await;
        }
    }
}

/// `bench.failover (id BIGINT NOT NULL, v STRING)`, bucketed by id, its primary key
/// with `primary_key`.
fn table(buckets: u32, primary_key: bool) -> Result<TableDescriptor, BenchError> {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
    ]);
    let options = TableOptions {
        bucket_num: buckets,
        bucket_key: Some(vec!["id".into()]),
        ..TableOptions::default()
    };
    Ok(TableDescriptor::new(
        TablePath::new("bench", "failover"),
        schema,
        match primary_key {
            true => vec!["id".into()],
            false => vec![],
        },
        vec![],
        options,
    )?)
}

/// A batch of the table's rows with these ids.
fn rows(table: &TableDescriptor, ids: &[i64]) -> Result<RecordBatch, BenchError> {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids.to_vec())),
        Arc::new(StringArray::from_iter_values(
            ids.iter().map(|id| format!("row {id}")),
        )),
    ];
    Ok(RecordBatch::try_new(Arc::clone(table.schema()), columns)?)
}

/// Each bucket with the first of `ids` that goes to it.
fn first_id_of_each_bucket(
    table: &TableDescriptor,
    ids: &[i64],
) -> Result<Vec<(BucketId, i64)>, BenchError> {
    let parts = split_rows_by_bucket(table, &rows(table, ids)?, 0)?;
    Ok((parts.into_iter())
        .map(|part| (part.bucket, ids[part.rows[0] as usize]))
        .collect())
}
