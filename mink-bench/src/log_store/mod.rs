//! `mink-bench log-store`: the log on object storage (`mink server --log-store`), kept on
//! the local file system, against today's local log.
//!
//! ```text
//! cargo run --release -p mink-bench -- log-store [--rows 2000000]
//!     [--history-rows 10000000] [--intervals 0,2ms,5ms,20ms] [--writers 64]
//!     [--load-secs 5] [--pings 500] [--checkpoint-keys 1000000]
//!     [--checkpoint-interval 5s] [--checkpoint-load 20s] [--objects-duration 600s]
//!     [--figures visible,load,append,history,checkpoint,objects] [--dir DIR] [--no-sync]
//! ```
//!
//! Several embedded nodes run in this process at once, each served on a loopback port and
//! driven through `MinkClient`, so every figure includes the Flight protocol. The baseline,
//! *local*, keeps its log as without a store: segment files, an fsync per group commit.
//! Each *store* node keeps its log in a `file://` store of its own in the working directory
//! (`store-<interval>-wal`), one node per `--intervals` entry (its `--log-store-interval`; the
//! scheme's default, `mink_log::default_interval`, is always one of them and marked
//! `(default)`), with the default batch size, each WAL object and its directory fsynced
//! before its writes are acknowledged. With `--no-sync` no node fsyncs. The rows are the
//! `log` suite's (`crate::data`); 1 MB is 10^6 bytes. A throughput ratio is the store's
//! rate over the local log's (below 1 when the store is slower); a latency or time ratio is
//! the store's over the local log's (above 1 when the store is slower).
//!
//! The store nodes never fsync their local segments (the store holds what is durable),
//! so the kernel writes them back later: before each load run (figure 2), each timed
//! append (figure 3) and each step of figure 5, `sync` writes back every dirty page, so
//! that no step pays for the writeback of those before it. A step's own segments are
//! written back after it, untimed.
//!
//! A suite of its own rather than a flag of `log`: every figure here has the same
//! measurement on a local log as its baseline, in the same run (the `log` suite's baselines
//! are IPC files), and two of them (PUTs per second at each interval, the open that rebuilds
//! a log) exist only with a store.
//!
//! 1. **Write -> visible in SQL over ADBC**, p50 and p99, on idle nodes. Every node serves
//!    Flight SQL and holds a primary-key table `bench.visible (id BIGINT, v VARCHAR)` of one
//!    bucket. The ADBC Flight SQL driver from Python (`MINK_PYTHON`, else `python3`, with
//!    `pip install adbc-driver-flightsql pyarrow`) takes turns over the nodes, `--pings`
//!    turns after 20 uncounted ones: on each node an `INSERT` of one row (the turn's id),
//!    then `SELECT id, v FROM bench.visible WHERE id = <id>` until it returns the row.
//!    Timed in Python from before the INSERT to the row, and the INSERT alone (its
//!    acknowledgement); skipped with a note when the driver cannot run. Then a **one-row
//!    append's acknowledgement** through the Rust client (`append` of a 1-row batch to a
//!    log table of one bucket), the nodes taking turns the same way.
//! 2. **PUTs per second under load**, on 64 buckets and on 4: `--writers` writer tasks
//!    (writer `w` appends to bucket `w % buckets`), each appending one 100-row batch a call
//!    and waiting for its acknowledgement before the next, for `--load-secs`, to a fresh log
//!    table of each node in turn; three rounds. Per node: rows per second (the median of
//!    the rounds, its ratio the median of the rounds' ratios); the WAL objects created per
//!    second (the files under the store's `wal/`, counted before and after each run; the
//!    median of the rounds) and their mean size; the calls' acknowledgement latency, p50
//!    and p99 of every round's calls.
//! 3. **Append throughput**, 1 bucket and 8 buckets, as the `log` suite's: `--rows` rows in
//!    batches of 10 000, batch `i` to bucket `i % n`, one writer task per bucket, four
//!    batches a call. Three rounds, each appending to fresh tables of the local node, then of
//!    the store node at the default interval; each figure the median of its rounds, the
//!    ratio the median of the rounds' (each round's printed), with the CPU time per row the
//!    process used (all threads, every node's background work included).
//! 4. **Tail from the log cache**: the 1-bucket table of figure 3's last round (the log
//!    cache holds it whole) read from offset 0 to its high watermark by Scan and by the polls
//!    of a Tail session, on both nodes, in three rounds. Baseline: the local node's cached
//!    Scan (the `log` suite's `scan log cache`).
//! 5. **History**: a fresh local node and a fresh store node (default interval) each
//!    append `--history-rows` rows to a table of one bucket, four batches a call; the
//!    store node waits until every segment it sealed (at the default segment size) is a
//!    stream object in the store; both stop. Three rounds, the page cache dropped before
//!    each step (`sync`, then `3` written to `/proc/sys/vm/drop_caches`, which only root
//!    may; otherwise the figures say the cache was kept): the local node opened (its log
//!    intact), its table read by Scan from offset 0 (the catch-up read from cold segments),
//!    the node stopped; the store node's `log/` deleted, the node opened (its stream objects
//!    found, the rest of its log rebuilt from the WAL objects after the last checkpoint),
//!    its table read the same way (the sealed part from stream objects through the block
//!    cache, the rest from the rebuilt segment), the node stopped, and opened once more with
//!    its `log/` intact (which a store's open empties and rebuilds all the same). An open
//!    is timed from `Node::open` to a client connected to its port; each figure the median
//!    of its rounds, each ratio the median of the rounds'. The heading says what the store
//!    holds.
//! 6. **KV checkpoints**: two fresh store nodes (default interval), one writing KV
//!    checkpoints every `--checkpoint-interval` (and early when due), the other none. In
//!    each of three rounds, a fresh primary-key table of one bucket on each is loaded with
//!    `--checkpoint-keys` new keys, then takes upserts of random existing keys for
//!    `--checkpoint-load` (the same batches over and over, four 10 000-row writes in
//!    flight). The steady upserts' throughput with checkpoints against without (the median
//!    of the rounds' ratios); the bytes of every run the node wrote during them and in one
//!    pass after (its store's `kv/` listed every 200 ms; a run off the chain stays a
//!    minute) per byte upserted (the batches as IPC streams). Then three times each node is stopped, loses `log/` and `kv/`, and opens
//!    again (timed from `Node::open` to a client connected): the one with checkpoints
//!    restores the bucket's last checkpoint and replays the log after it, the other
//!    replays the whole log; a Snapshot of each holds every key. The restore's download
//!    and ingestion, and the replay of the log after it (the bucket's log open), are
//!    timed by the node itself; the rest of its open is mostly the log's rebuild from the
//!    store.
//! 7. **Objects per bucket** (only when asked for: `--figures objects`): a fresh store node
//!    with 1 MiB segments sealed after 10 s at the latest, and a log table of 64 buckets,
//!    each appended a 100-row batch every 100 ms by a writer of its own for
//!    `--objects-duration`; 15 s after, the stream objects each bucket's history is read
//!    from (`list_buckets`: median and max), the stream objects in the store, and the
//!    bytes of every stream object, pack and merged object written meanwhile (the store's
//!    `streams/` and `packs/` listed every 200 ms) per byte of the buckets' logs: above 1,
//!    the merges that rewrote the log once more.

mod checkpoint;
mod history;
mod load;
mod objects;
mod throughput;
mod visible;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;

use mink_log::{LogStoreConfig, default_interval};
use mink_node::NodeConfig;

use crate::data::{BATCH_ROWS, Data};
use crate::error::BenchError;
use crate::harness::{NodeArgs, Running, Scratch, blocking};

/// Arguments of `mink-bench log-store`.
#[derive(Debug, clap::Args)]
pub(crate) struct LogStoreArgs {
    /// Rows of the append and tail figures, in batches of 10 000.
    #[arg(long, default_value_t = 2_000_000)]
    rows: usize,
    /// Rows of the history figure (catch-up read and open).
    #[arg(long, default_value_t = 10_000_000)]
    history_rows: usize,
    /// The store nodes' intervals between WAL uploads (`--log-store-interval`),
    /// comma-separated; the scheme's default is added when missing.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = parse_interval,
        default_value = "0,2ms,5ms,20ms"
    )]
    intervals: Vec<Duration>,
    /// Writer tasks of the PUT figure.
    #[arg(long, default_value_t = 64)]
    writers: usize,
    /// Seconds each node is loaded in each round of the PUT figure.
    #[arg(long, default_value_t = 5)]
    load_secs: u64,
    /// Measured turns of the latency figures.
    #[arg(long, default_value_t = 500)]
    pings: usize,
    /// Keys of the KV checkpoint figure's bucket.
    #[arg(long, default_value_t = 1_000_000)]
    checkpoint_keys: usize,
    /// The KV checkpoint interval of the checkpoint figure's node that writes them.
    #[arg(long, value_parser = parse_interval, default_value = "5s")]
    checkpoint_interval: Duration,
    /// How long the checkpoint figure's steady upserts run on each node in each round.
    #[arg(long, value_parser = parse_interval, default_value = "20s")]
    checkpoint_load: Duration,
    /// How long the objects figure writes its buckets.
    #[arg(long, value_parser = parse_interval, default_value = "600s")]
    objects_duration: Duration,
    /// The figures to print, comma-separated (all by default; one alone, to profile it).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "visible,load,append,history,checkpoint"
    )]
    figures: Vec<Figure>,
    #[command(flatten)]
    node: NodeArgs,
}

/// A figure of the suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Figure {
    /// Write -> visible in SQL, and one-row acknowledgements.
    Visible,
    /// PUTs per second and throughput under many writers.
    Load,
    /// Append throughput, then reads of the appended rows from the log cache.
    Append,
    /// The catch-up read of history and the open.
    History,
    /// KV checkpoints: their cost under upserts, and a restore against a replay.
    Checkpoint,
    /// Objects per bucket after steady writes to many buckets (not by default: it runs
    /// for `--objects-duration`).
    Objects,
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    mink_core::options::parse_duration(text)
        .ok_or_else(|| format!("'{text}' is not a duration (0, 5ms, 1s)"))
}

pub(crate) async fn run(args: LogStoreArgs) -> Result<(), BenchError> {
    let counts = [
        args.rows,
        args.history_rows,
        args.writers,
        args.pings,
        args.checkpoint_keys,
    ];
    let durations = [
        args.checkpoint_interval,
        args.checkpoint_load,
        args.objects_duration,
    ];
    if counts.contains(&0) || args.load_secs == 0 || durations.iter().any(Duration::is_zero) {
        return Err(BenchError::Usage(
            "--rows, --history-rows, --writers, --load-secs, --pings, --checkpoint-keys, \
             --checkpoint-interval, --checkpoint-load and --objects-duration must be positive"
                .into(),
        ));
    }
    let scratch = Scratch::new(args.node.dir.clone())?;
    eprintln!("bench: generating {} rows", args.rows);
    let data = Data::generate(args.rows)?;
    // The cache holds the whole 1-bucket table, so the tail figure reads it from there.
    let cache_bytes = 2 * data.memory_bytes() + (64 << 20);
    let nodes = Nodes::open(&args.node, &scratch, cache_bytes, &args.intervals).await?;
    println!(
        "mink-bench log-store: {} rows ({} MB in memory) in batches of {BATCH_ROWS}, \
         {} history rows, store nodes at intervals {}, {}",
        data.rows,
        data.memory_bytes() / 1_000_000,
        args.history_rows,
        nodes
            .stores
            .iter()
            .map(|node| node.label.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        args.node.describe(nodes.local.running.config(), &scratch)
    );
    let figure = |figure| args.figures.contains(&figure);
    if figure(Figure::Visible) {
        visible::figure(&nodes, &data.schema, args.pings).await?;
    }
    if figure(Figure::Load) {
        let load = load::Load {
            writers: args.writers,
            duration: Duration::from_secs(args.load_secs),
        };
        load::figure(&nodes, &data.schema, &load).await?;
    }
    if figure(Figure::Append) {
        let store = nodes.default_store()?;
        throughput::append_figure(&nodes.local, store, &data).await?;
        throughput::tail_figure(&nodes.local, store, &data).await?;
    }
    nodes.stop().await?;
    drop(data);
    if figure(Figure::History) {
        history::figure(&args.node, &scratch, args.history_rows).await?;
    }
    if figure(Figure::Checkpoint) {
        let timing = (args.checkpoint_interval, args.checkpoint_load);
        checkpoint::figure(&args.node, &scratch, args.checkpoint_keys, timing).await?;
    }
    if figure(Figure::Objects) {
        objects::figure(&args.node, &scratch, args.objects_duration).await?;
    }
    Ok(())
}

/// A node of this suite: how it keeps its log, and the node running.
#[derive(Debug)]
pub(super) struct LogNode {
    /// `local`, or `store <interval>`.
    pub(super) label: String,
    /// The directory of its `file://` store; `None` for the local log.
    pub(super) store: Option<PathBuf>,
    pub(super) running: Running,
}

/// The baseline node and the store nodes, all running.
#[derive(Debug)]
pub(super) struct Nodes {
    pub(super) local: LogNode,
    /// One per interval, by interval.
    pub(super) stores: Vec<LogNode>,
    default_label: String,
}

impl Nodes {
    /// Opens the local node and a store node for every interval of `intervals` and the
    /// default one, each with a log cache of `cache_bytes` per bucket.
    async fn open(
        args: &NodeArgs,
        scratch: &Scratch,
        cache_bytes: u64,
        intervals: &[Duration],
    ) -> Result<Self, BenchError> {
        let default = default_interval("file:///");
        let mut intervals = intervals.to_vec();
        intervals.push(default);
        intervals.sort_unstable();
        intervals.dedup();
        let local =
            LogNode::open(NodeSetup::new(args, scratch, "local", None, cache_bytes)?).await?;
        let mut stores = Vec::with_capacity(intervals.len());
        for interval in intervals {
            let name = format!("store-{}", Interval(interval));
            let setup = NodeSetup::new(args, scratch, &name, Some(interval), cache_bytes)?;
            stores.push(LogNode::open(setup).await?);
        }
        Ok(Self {
            local,
            stores,
            default_label: store_label(default),
        })
    }

    /// Every node, the local one first.
    pub(super) fn all(&self) -> impl Iterator<Item = &LogNode> {
        std::iter::once(&self.local).chain(&self.stores)
    }

    /// The store node at the scheme's default interval.
    pub(super) fn default_store(&self) -> Result<&LogNode, BenchError> {
        (self.stores.iter())
            .find(|node| node.label == self.default_label)
            .ok_or_else(|| BenchError::Usage("no store node at the default interval".into()))
    }

    async fn stop(self) -> Result<(), BenchError> {
        self.local.running.stop().await?;
        for node in self.stores {
            node.running.stop().await?;
        }
        Ok(())
    }
}

/// How one node of the suite is configured: its data directory `<dir>/<name>` and, for a
/// store node, its store `<dir>/<name>-wal`.
#[derive(Debug, Clone)]
pub(super) struct NodeSetup {
    pub(super) label: String,
    pub(super) config: NodeConfig,
    pub(super) store: Option<PathBuf>,
}

impl NodeSetup {
    /// The node `name` in `scratch`, its log in a store at `interval` or, without one,
    /// local; a log cache of `cache_bytes` per bucket.
    pub(super) fn new(
        args: &NodeArgs,
        scratch: &Scratch,
        name: &str,
        interval: Option<Duration>,
        cache_bytes: u64,
    ) -> Result<Self, BenchError> {
        let mut config = args.config(scratch, cache_bytes);
        config.data_dir = scratch.path.join(name);
        let Some(interval) = interval else {
            return Ok(Self {
                label: "local".into(),
                config,
                store: None,
            });
        };
        let store = std::path::absolute(scratch.path.join(format!("{name}-wal")))
            .map_err(BenchError::io(format!("the store of {name}")))?;
        config.log_store = Some(LogStoreConfig {
            interval,
            sync: args.sync(),
            ..LogStoreConfig::new(format!("file://{}", store.display()))
        });
        Ok(Self {
            label: store_label(interval),
            config,
            store: Some(store),
        })
    }
}

impl LogNode {
    /// Opens the node `setup` configures.
    pub(super) async fn open(setup: NodeSetup) -> Result<Self, BenchError> {
        Ok(Self {
            label: setup.label,
            store: setup.store,
            running: Running::start(setup.config).await?,
        })
    }
}

/// `store <interval>`, `(default)` after the scheme's default.
fn store_label(interval: Duration) -> String {
    let default = if interval == default_interval("file:///") {
        " (default)"
    } else {
        ""
    };
    format!("store {}{default}", Interval(interval))
}

/// An interval as `--log-store-interval` takes it: `0`, `5ms`.
struct Interval(Duration);

impl fmt::Display for Interval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_millis() {
            0 => write!(f, "0"),
            millis => write!(f, "{millis}ms"),
        }
    }
}

/// Writes every dirty page of the machine back (`sync`), so that the next step does not
/// pay for an earlier one's writeback: the store nodes never fsync their local segments.
pub(super) async fn write_back() -> Result<(), BenchError> {
    blocking(|| {
        let status = std::process::Command::new("sync")
            .status()
            .map_err(BenchError::io("running sync"))?;
        match status.success() {
            true => Ok(()),
            false => Err(BenchError::Usage(format!("sync failed: {status}"))),
        }
    })
    .await
}

/// The WAL objects in the store at `dir` now (every epoch's, fences included; the
/// store's upkeep deletes those behind a checkpoint): each one's place, `(epoch, seq)`,
/// and bytes.
pub(super) async fn wal_objects(dir: &Path) -> Result<Vec<((u64, u64), u64)>, BenchError> {
    let files = files_under(dir.join("wal")).await?;
    let place = |path: &Path| -> Option<(u64, u64)> {
        let seq = path.file_name()?.to_str()?.parse().ok()?;
        let epoch = path.parent()?.file_name()?.to_str()?.parse().ok()?;
        Some((epoch, seq))
    };
    Ok(files
        .iter()
        .filter_map(|(path, bytes)| Some((place(path)?, *bytes)))
        .collect())
}

/// Every file under `dir` and its length; none when `dir` is missing.
pub(super) async fn files_under(dir: PathBuf) -> Result<Vec<(PathBuf, u64)>, BenchError> {
    fn walk(dir: &Path, files: &mut Vec<(PathBuf, u64)>) -> std::io::Result<()> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            // The store's upkeep may delete a file between the listing and this look.
            let metadata = match entry.metadata() {
                Ok(metadata) => metadata,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            match metadata.is_dir() {
                true => walk(&entry.path(), files)?,
                false => files.push((entry.path(), metadata.len())),
            }
        }
        Ok(())
    }
    blocking(move || {
        let mut files = Vec::new();
        walk(&dir, &mut files).map_err(BenchError::io(format!("listing {}", dir.display())))?;
        Ok(files)
    })
    .await
}

/// How often [`NewFiles`] lists its directory (objects the upkeep deletes stay a minute
/// after they are left: none is missed).
const POLL: Duration = Duration::from_millis(200);

/// Lists a directory of a local store every [`POLL`] until stopped: the bytes of every
/// file it saw that was not there when it started (a local store's unfinished uploads,
/// named `<object>#<n>`, left out).
pub(super) struct NewFiles {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<u64, BenchError>>,
}

impl NewFiles {
    pub(super) fn start(dir: PathBuf) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let before: BTreeMap<_, _> = objects_under(&dir).await?.into_iter().collect();
            let mut seen = BTreeMap::new();
            loop {
                let done = *stopped.borrow_and_update();
                let objects = objects_under(&dir).await?.into_iter();
                seen.extend(objects.filter(|(path, _)| !before.contains_key(path)));
                if done {
                    return Ok(seen.values().sum());
                }
                let _ = tokio::time::timeout(POLL, stopped.changed()).await;
            }
        });
        Self { stop, task }
    }

    /// Stops listing: the bytes of the new files seen.
    pub(super) async fn stop(self) -> Result<u64, BenchError> {
        let _ = self.stop.send(true);
        self.task
            .await
            .map_err(|e| BenchError::Usage(format!("listing new objects: {e}")))?
    }
}

/// The objects under `dir` of a local store and their sizes.
async fn objects_under(dir: &Path) -> Result<Vec<(PathBuf, u64)>, BenchError> {
    let files = files_under(dir.to_path_buf()).await?;
    Ok(files
        .into_iter()
        .filter(|(path, _)| path.to_str().is_some_and(|name| !name.contains('#')))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_read_as_the_flag_takes_them() {
        assert_eq!(Interval(Duration::ZERO).to_string(), "0");
        assert_eq!(Interval(Duration::from_millis(5)).to_string(), "5ms");
        assert_eq!(parse_interval("20ms"), Ok(Duration::from_millis(20)));
        assert_eq!(parse_interval("0"), Ok(Duration::ZERO));
        assert!(parse_interval("soon").is_err());
        let default = default_interval("file:///");
        assert!(store_label(default).ends_with("(default)"));
    }
}
