//! Figure 6 of `mink-bench log-store`: KV checkpoints (see the suite's documentation):
//! what they cost a steady upsert load, and how fast a bucket is restored from one
//! against a replay of its whole log.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use mink_core::protocol::BucketId;
use mink_core::table::{TableDescriptor, TablePath};
use mink_kv::Restored;
use rand::Rng as _;

use super::{LogNode, NewFiles, NodeSetup};
use crate::data::{Data, ipc_len, seeded};
use crate::error::BenchError;
use crate::harness::{
    NodeArgs, ROUNDS, Running, Scratch, Throughput, blocking, check_rows, create_table, measure,
    median, megabytes, ratio_of_rounds, report, write_batches,
};

/// The log cache of the checkpoint nodes, per bucket.
const CACHE_BYTES: u64 = 64 << 20;
/// Update batches written between two looks at the clock in the steady phase.
const STEADY_CALLS: usize = 8;
/// The interval of the node without checkpoints: none is due in the run (with no base
/// written, its flushes keep no runs, so none is due early either).
const NEVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// The rows of the figure: the load (keys `0..keys`) and the updates (random existing
/// keys, half as many rows), written over and over for the steady phase.
struct Upserts {
    load: Data,
    updates: Data,
    /// Each update batch's bytes as an IPC stream.
    update_bytes: Vec<u64>,
}

impl Upserts {
    fn generate(keys: usize) -> Result<Self, BenchError> {
        let load = Data::generate(keys)?;
        let mut rng = seeded(0xc4ec);
        let ids: Vec<i64> = (0..keys / 2)
            .map(|_| rng.random_range(0..keys as i64))
            .collect();
        let updates = Data::with_ids(&ids, rng.random())?;
        let update_bytes = (updates.batches.iter())
            .map(|batch| ipc_len(std::iter::once(batch)))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            load,
            updates,
            update_bytes,
        })
    }
}

/// Rows and bytes of updates written, and for how long.
#[derive(Debug, Clone, Copy)]
struct Steady {
    rows: usize,
    bytes: u64,
    elapsed: Duration,
}

impl Steady {
    fn throughput(&self) -> Throughput {
        Throughput::new(self.rows, self.bytes, self.elapsed)
    }
}

/// Prints figure 6 with a bucket of `keys` keys, nodes as `args` say, checkpoints every
/// `interval` on the node that writes them.
pub(super) async fn figure(
    args: &NodeArgs,
    scratch: &Scratch,
    keys: usize,
    (interval, duration): (Duration, Duration),
) -> Result<(), BenchError> {
    eprintln!("bench: generating {keys} keys and their updates");
    let upserts = Upserts::generate(keys)?;
    let default = Some(mink_log::default_interval("file:///"));
    let mut on = NodeSetup::new(args, scratch, "checkpoints-on", default, CACHE_BYTES)?;
    on.config.kv_checkpoint_interval = interval;
    on.label = "checkpoints on".into();
    let mut off = NodeSetup::new(args, scratch, "checkpoints-off", default, CACHE_BYTES)?;
    off.config.kv_checkpoint_interval = NEVER;
    off.label = "checkpoints off".into();
    let store = on.store.clone().expect("a store node");
    let (mut on_node, mut off_node) = (LogNode::open(on).await?, LogNode::open(off).await?);
    let mut rounds: Vec<(Steady, Steady, u64)> = Vec::with_capacity(ROUNDS);
    let mut table = None;
    for round in 0..ROUNDS {
        let path = TablePath::new("bench", format!("checkpoint_round{round}"));
        let on_table = load(&on_node, &path, &upserts).await?;
        let poller = NewFiles::start(store.join("kv"));
        let on = steady(&on_node, &on_table, &upserts, duration).await?;
        let last = checkpoint_all(&on_node.running).await;
        let uploaded = poller.stop().await?;
        let off_table = load(&off_node, &path, &upserts).await?;
        let off = steady(&off_node, &off_table, &upserts, duration).await?;
        eprintln!(
            "bench: round {round}: checkpoints on {}, off {}, {} uploaded (the last pass {last:?})",
            on.throughput(),
            off.throughput(),
            megabytes(uploaded)
        );
        rounds.push((off, on, uploaded));
        table = Some(path);
    }
    let table = table.expect("a round");
    println!(
        "KV checkpoints: a primary-key table of 1 bucket, {} keys loaded, then upserts of \
         random existing keys for {duration:?}; {ROUNDS} rounds, each on a fresh table; \
         checkpoints every {interval:?} on one node, none on the other:",
        upserts.load.rows,
    );
    let median_of = |get: &dyn Fn(&(Steady, Steady, u64)) -> f64| {
        let mut values: Vec<f64> = rounds.iter().map(get).collect();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let each = |get: &dyn Fn(&(Steady, Steady, u64)) -> f64| {
        (rounds.iter().map(|round| format!("{:.2}", get(round))))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let by_time = |pick: fn(&(Steady, Steady, u64)) -> Steady| {
        let mut steady: Vec<Steady> = rounds.iter().map(pick).collect();
        steady.sort_by(|a, b| {
            let rate = |s: &Steady| s.rows as f64 / s.elapsed.as_secs_f64();
            rate(a).total_cmp(&rate(b))
        });
        steady[steady.len() / 2].throughput()
    };
    report("  upserts, checkpoints off", by_time(|round| round.0), &[]);
    let ratio =
        |round: &(Steady, Steady, u64)| round.1.throughput().ratio_to(&round.0.throughput());
    report(
        "  upserts, checkpoints on",
        by_time(|round| round.1),
        &[format!(
            "vs off {:.2} (rounds {})",
            median_of(&ratio),
            each(&ratio)
        )],
    );
    let per_byte = |round: &(Steady, Steady, u64)| round.2 as f64 / round.1.bytes as f64;
    println!(
        "  KV checkpoint bytes uploaded : {:.2} per byte upserted (rounds {})",
        median_of(&per_byte),
        each(&per_byte)
    );

    let bucket = BucketId::new(&table, 0);
    let mut opens = Vec::with_capacity(ROUNDS);
    let mut restores = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let on_open;
        (on_node, on_open) = lose_disk(on_node).await?;
        let opened = on_node.running.node.bucket(&bucket)?.1;
        let restored = opened
            .restored
            .map(|restored| (restored, opened.log_opened_in));
        check_snapshot(&on_node.running, &bucket, keys).await?;
        let off_open;
        (off_node, off_open) = lose_disk(off_node).await?;
        check_snapshot(&off_node.running, &bucket, keys).await?;
        restores.push(restored.ok_or_else(|| {
            BenchError::Mismatch("the node with checkpoints did not restore the bucket".into())
        })?);
        opens.push((on_open, off_open));
    }
    let log_end = on_node.running.node.bucket(&bucket)?.1.log.offsets().1;
    on_node.running.stop().await?;
    off_node.running.stop().await?;
    let restored = restores[0].0;
    println!(
        "  a node that lost log/ and kv/ opens the {keys}-key bucket ({ROUNDS} rounds; its \
         checkpoint {} runs, {}, {} entries; the log {} rows):",
        restored.runs,
        megabytes(restored.bytes),
        restored.entries,
        log_end
    );
    let seconds = |time: Duration| format!("{:>9.3} s", time.as_secs_f64());
    let off_open = median(opens.iter().map(|open| open.1).collect());
    report("    open, whole log replayed", seconds(off_open), &[]);
    let on_open = median(opens.iter().map(|open| open.0).collect());
    report(
        "    open, checkpoint restored",
        seconds(on_open),
        &[format!("time {}", ratio_of_rounds("replay", &opens))],
    );
    let part =
        |get: fn(&(Restored, Duration)) -> Duration| median(restores.iter().map(get).collect());
    let (download, ingestion) = (part(|r| r.0.download), part(|r| r.0.ingestion));
    let replay = part(|r| r.1);
    report("      checkpoint download", seconds(download), &[]);
    report("      ingestion", seconds(ingestion), &[]);
    report("      replay after it", seconds(replay), &[]);
    let rest = on_open.saturating_sub(download + ingestion + replay);
    report("      rest: log rebuild", seconds(rest), &[]);
    Ok(())
}

/// Creates `path` (one bucket, primary key `id`) on `node` and loads its keys.
async fn load(
    node: &LogNode,
    path: &TablePath,
    upserts: &Upserts,
) -> Result<TableDescriptor, BenchError> {
    let client = &node.running.client;
    let schema = &upserts.load.schema;
    let table: TableDescriptor = create_table(client, path, 1, schema, &["id"]).await?;
    let what = format!("load {} keys, {}", upserts.load.rows, node.label);
    measure(&what, write_batches(client, &table, &upserts.load.batches)).await?;
    Ok(table)
}

/// Writes the update batches to `table` over and over, [`STEADY_CALLS`] at a time, for
/// `duration`.
async fn steady(
    node: &LogNode,
    table: &TableDescriptor,
    upserts: &Upserts,
    duration: Duration,
) -> Result<Steady, BenchError> {
    let client = &node.running.client;
    let started = Instant::now();
    let (mut rows, mut bytes) = (0, 0);
    let batches = upserts.updates.batches.iter().zip(&upserts.update_bytes);
    let mut batches = batches.cycle();
    while started.elapsed() < duration {
        let chunk: Vec<(&RecordBatch, &u64)> = batches.by_ref().take(STEADY_CALLS).collect();
        let written: Vec<RecordBatch> = chunk.iter().map(|(batch, _)| (*batch).clone()).collect();
        write_batches(client, table, &written).await?;
        rows += written.iter().map(RecordBatch::num_rows).sum::<usize>();
        bytes += chunk.iter().map(|(_, bytes)| **bytes).sum::<u64>();
    }
    Ok(Steady {
        rows,
        bytes,
        elapsed: started.elapsed(),
    })
}

/// Writes every bucket's next checkpoint run now (the node's own pass may run too).
async fn checkpoint_all(running: &Running) -> mink_node::CheckpointPass {
    let node = Arc::clone(&running.node);
    tokio::task::spawn_blocking(move || node.checkpoint_kv())
        .await
        .unwrap_or_default()
}

/// Stops `node`, deletes its `log/` and `kv/`, and opens it again: how long the open took.
async fn lose_disk(node: LogNode) -> Result<(LogNode, Duration), BenchError> {
    let LogNode {
        label,
        store,
        running,
    } = node;
    let config = running.stop().await?;
    let data_dir = config.data_dir.clone();
    blocking(move || {
        for dir in ["log", "kv"] {
            remove_dir(&data_dir.join(dir))?;
        }
        Ok(())
    })
    .await?;
    let what = format!("open, {label}, log/ and kv/ lost");
    let (running, open) = measure(&what, Running::start(config)).await?;
    let node = LogNode {
        label,
        store,
        running,
    };
    Ok((node, open))
}

/// Removes `dir` and everything in it. The node stopped in this process may still be
/// letting go of its KV store, whose background thread can finish a compaction (a new
/// file) meanwhile: a directory found not empty is removed again.
fn remove_dir(dir: &Path) -> Result<(), BenchError> {
    let mut attempts = 0;
    loop {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty && attempts < 50 => {
                attempts += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            removed => {
                return removed.map_err(BenchError::io(format!("removing {}", dir.display())));
            }
        }
    }
}

/// Checks that a Snapshot of `bucket` holds `rows` rows.
async fn check_snapshot(
    running: &Running,
    bucket: &BucketId,
    rows: usize,
) -> Result<(), BenchError> {
    let snapshot = running.client.snapshot(bucket, &[], 0).await?;
    let read: usize = snapshot.batches.iter().map(RecordBatch::num_rows).sum();
    check_rows("a Snapshot of the restored bucket", read, rows)
}
