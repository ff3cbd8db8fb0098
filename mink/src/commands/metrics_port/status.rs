//! What the status page draws (`/status.json`): the cluster's nodes, the tables with
//! their buckets, each table's write rate and lake lag now, and a bounded history of the
//! last hour's samples (one every [`SAMPLE_EVERY`], at most [`MAX_SAMPLES`]) that the port
//! takes while it runs, so a lag curve is there when someone opens the page.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mink_core::clock::now_ms;
use mink_core::protocol::{BucketList, BucketStatus, NotLeader};
use mink_core::table::TableDescriptor;
use mink_node::Node;
use serde::Serialize;
use tokio::task::JoinHandle;

/// How often the history is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);

/// The samples kept: an hour of them.
const MAX_SAMPLES: usize = 360;

/// The status now, with the history (the JSON the page polls).
#[derive(Debug, Serialize)]
pub(super) struct Status {
    node: NodeSummary,
    nodes: Vec<NodeSummary>,
    tables: Vec<TableStatus>,
    history: Vec<Sample>,
}

#[derive(Debug, Clone, Serialize)]
struct NodeSummary {
    id: String,
    address: Option<String>,
    live: bool,
    buckets: u32,
    /// This node's version (another node's is not known here).
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<&'static str>,
}

#[derive(Debug, Serialize)]
struct TableStatus {
    name: String,
    rows_per_second: f64,
    lag_offsets: i64,
    lag_seconds: f64,
    buckets: Vec<BucketFigures>,
}

/// A bucket's figures; only its leader (or `null` while it moves) for a bucket another
/// node leads.
#[derive(Debug, Default, Serialize)]
struct BucketFigures {
    partition: Option<String>,
    bucket: u32,
    leader: Option<String>,
    log_start: Option<i64>,
    high_watermark: Option<i64>,
    lake_offset: Option<i64>,
    lag_offsets: Option<i64>,
    lag_seconds: Option<f64>,
}

/// One sample of the history: each table's figures at `at` (ms since the Unix epoch).
#[derive(Debug, Clone, Serialize)]
struct Sample {
    at: i64,
    tables: BTreeMap<String, TableSample>,
}

#[derive(Debug, Clone, Copy, Serialize)]
struct TableSample {
    lag_seconds: f64,
    rows_per_second: f64,
    /// The table's rows written so far: the next sample's rate is the rows since.
    #[serde(skip)]
    rows_written: u64,
}

/// The last hour's samples.
#[derive(Debug, Default)]
pub(super) struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    fn push(&self, sample: Sample) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if samples.len() == MAX_SAMPLES {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// The samples taken after `since` (ms since the Unix epoch).
    fn samples_after(&self, since: i64) -> Vec<Sample> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let first = samples.partition_point(|sample| sample.at <= since);
        samples.range(first..).cloned().collect()
    }

    fn last(&self) -> Option<Sample> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.back().cloned()
    }
}

/// The sampling task; stopped when dropped.
#[derive(Debug)]
pub(super) struct Sampling(JoinHandle<()>);

impl Drop for Sampling {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Every table of `node` with its buckets ([`Node::every_table_buckets`]), read off the
/// runtime's workers: the node's metadata may be etcd's, a round trip per table.
async fn every_table_buckets(node: &Arc<Node>) -> Vec<(Arc<TableDescriptor>, BucketList)> {
    let node = Arc::clone(node);
    tokio::task::spawn_blocking(move || node.every_table_buckets())
        .await
        .unwrap_or_default()
}

/// Samples `node` into `history` every [`SAMPLE_EVERY`] until dropped.
pub(super) fn sample(node: Arc<Node>, history: Arc<History>) -> Sampling {
    Sampling(tokio::spawn(async move {
        let mut ticks = tokio::time::interval(SAMPLE_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let listed = every_table_buckets(&node).await;
            let at = now_ms();
            let previous = history.last();
            let tables = (listed.into_iter())
                .map(|(table, listed)| {
                    let name = table.path.to_string();
                    let before = previous
                        .as_ref()
                        .and_then(|p| Some((p.at, *p.tables.get(&name)?)));
                    let sampled = table_sample(&name, table.lake_enabled, &listed, at, before);
                    (name, sampled)
                })
                .collect();
            history.push(Sample { at, tables });
        }
    }))
}

/// Table `name`'s figures at `at`, its write rate since its sample `before` (taken at
/// the time it is paired with), if there is one.
fn table_sample(
    name: &str,
    lake: bool,
    listed: &BucketList,
    at: i64,
    before: Option<(i64, TableSample)>,
) -> TableSample {
    let rows_written = (mink_metrics::metrics().write_rows)
        .with_label_values(&[name])
        .get();
    let rows_per_second = match before {
        Some((then, before)) if at > then => {
            let rows = rows_written.saturating_sub(before.rows_written);
            rows as f64 * 1000.0 / (at - then) as f64
        }
        _ => 0.0,
    };
    TableSample {
        lag_seconds: max_lag_seconds(&listed.buckets, at, lake),
        rows_per_second,
        rows_written,
    }
}

/// The status of `node` (whose node port is `address`) now, with the samples of
/// `history` after `since`.
pub(super) async fn now(node: &Arc<Node>, address: &str, history: &History, since: i64) -> Status {
    let listed = every_table_buckets(node).await;
    let at = now_ms();
    let last = history.last();
    let here = NodeSummary {
        id: (node.membership()).map_or_else(
            || "single node".to_string(),
            |membership| membership.config().node_id.clone(),
        ),
        address: Some(address.to_string()),
        live: true,
        buckets: listed.iter().map(|(_, l)| l.buckets.len() as u32).sum(),
        version: Some(env!("CARGO_PKG_VERSION")),
    };
    let tables = (listed.into_iter())
        .map(|(table, listed)| {
            let name = table.path.to_string();
            let rows_per_second = (last.as_ref())
                .and_then(|sample| sample.tables.get(&name))
                .map_or(0.0, |sample| sample.rows_per_second);
            table_status(
                name,
                rows_per_second,
                table.lake_enabled,
                listed,
                address,
                at,
            )
        })
        .collect();
    // A single node's list is itself; a node that cannot reach etcd shows only itself.
    let nodes = match node.list_nodes().await {
        Ok(nodes) if !nodes.is_empty() => (nodes.into_iter())
            .map(|info| NodeSummary {
                id: info.node_id,
                address: info.address,
                live: info.live,
                buckets: info.buckets,
                version: None,
            })
            .collect(),
        _ => vec![here.clone()],
    };
    Status {
        node: here,
        nodes,
        tables,
        history: history.samples_after(since),
    }
}

/// A table's figures: its buckets led here (at `address`) with theirs, the others with
/// their leader.
fn table_status(
    name: String,
    rows_per_second: f64,
    lake: bool,
    listed: BucketList,
    address: &str,
    at: i64,
) -> TableStatus {
    let led = (listed.buckets.iter()).map(|status| led_bucket(status, address, at, lake));
    let elsewhere = listed.elsewhere.into_iter().map(bucket_elsewhere);
    let mut buckets: Vec<BucketFigures> = led.chain(elsewhere).collect();
    buckets.sort_by(|a, b| (&a.partition, a.bucket).cmp(&(&b.partition, b.bucket)));
    TableStatus {
        name,
        rows_per_second,
        lag_offsets: (listed.buckets.iter())
            .filter(|_| lake)
            .map(|status| status.lake_lag(at).0)
            .sum(),
        lag_seconds: max_lag_seconds(&listed.buckets, at, lake),
        buckets,
    }
}

fn led_bucket(status: &BucketStatus, leader: &str, at: i64, lake: bool) -> BucketFigures {
    let (lag_offsets, lag_seconds) = status.lake_lag(at);
    let id = status.bucket.clone().unwrap_or_default();
    BucketFigures {
        partition: id.partition,
        bucket: id.bucket,
        leader: Some(leader.to_string()),
        log_start: Some(status.log_start),
        high_watermark: Some(status.high_watermark),
        lake_offset: lake.then_some(status.lake_log_end_offset),
        lag_offsets: lake.then_some(lag_offsets),
        lag_seconds: lake.then_some(lag_seconds),
    }
}

fn bucket_elsewhere(not_leader: NotLeader) -> BucketFigures {
    let id = not_leader.bucket.unwrap_or_default();
    BucketFigures {
        partition: id.partition,
        bucket: id.bucket,
        leader: not_leader.leader,
        ..BucketFigures::default()
    }
}

/// The largest lake lag in seconds among `buckets` (0 for a table without a lake).
fn max_lag_seconds(buckets: &[BucketStatus], at: i64, lake: bool) -> f64 {
    (buckets.iter())
        .filter(|_| lake)
        .map(|status| status.lake_lag(at).1)
        .fold(0.0, f64::max)
}
