//! Figure 7 of `mink-bench log-store`: how many objects a bucket's history takes in the
//! store after steady writes to many buckets, with small segments sealed by size and by
//! age, and what merging them costs (see the suite's documentation).

use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use mink_core::protocol::BucketId;
use mink_core::table::TablePath;
use tokio::task::JoinSet;

use super::{LogNode, NewFiles, NodeSetup, files_under};
use crate::data::Data;
use crate::error::BenchError;
use crate::harness::{NodeArgs, Scratch, create_table, megabytes};

/// Buckets of the figure's table.
const BUCKETS: u32 = 64;
/// Rows of each append.
const ROWS_PER_APPEND: usize = 100;
/// The pause of each bucket's writer between two appends.
const PAUSE: Duration = Duration::from_millis(100);
/// The segments of the figure's node: small, so buckets seal many.
const SEGMENT_BYTES: u64 = 1 << 20;
/// Their age limit (a quiet bucket seals its segment after this).
const SEGMENT_AGE: Duration = Duration::from_secs(10);

/// Prints figure 7: a table of [`BUCKETS`] buckets written for `duration`.
pub(super) async fn figure(
    args: &NodeArgs,
    scratch: &Scratch,
    duration: Duration,
) -> Result<(), BenchError> {
    let default = Some(mink_log::default_interval("file:///"));
    let mut setup = NodeSetup::new(args, scratch, "objects", default, 64 << 20)?;
    setup.config.log.segment_bytes = SEGMENT_BYTES;
    setup.config.log.segment_max_age = SEGMENT_AGE;
    let store = setup.store.clone().expect("a store node");
    let node = LogNode::open(setup).await?;
    let data = Data::generate(BUCKETS as usize * 10 * ROWS_PER_APPEND)?;
    let path = TablePath::new("bench", "objects");
    let client = &node.running.client;
    create_table(client, &path, BUCKETS, &data.schema, &[]).await?;
    let batches: Vec<RecordBatch> = (data.batches.iter())
        .flat_map(|batch| {
            (0..batch.num_rows() / ROWS_PER_APPEND)
                .map(|i| batch.slice(i * ROWS_PER_APPEND, ROWS_PER_APPEND))
        })
        .collect();
    let (streams, packs) = (
        NewFiles::start(store.join("streams")),
        NewFiles::start(store.join("packs")),
    );
    eprintln!("bench: writing {BUCKETS} buckets for {duration:?}");
    let started = Instant::now();
    let mut writers = JoinSet::new();
    for bucket in 0..BUCKETS {
        let (client, batches) = (client.clone(), batches.clone());
        let bucket = BucketId::new(&path, bucket);
        writers.spawn(async move {
            for batch in batches.iter().cycle() {
                if started.elapsed() >= duration {
                    break;
                }
                client.append(&bucket, vec![batch.clone()]).await?;
                tokio::time::sleep(PAUSE).await;
            }
            Ok::<(), BenchError>(())
        });
    }
    while let Some(done) = writers.join_next().await {
        done.map_err(|e| BenchError::Usage(format!("a writer: {e}")))??;
    }
    // The last segments sealed by age go up, and merges after them.
    tokio::time::sleep(SEGMENT_AGE + Duration::from_secs(5)).await;
    let written = streams.stop().await? + packs.stop().await?;
    let mut objects: Vec<u64> = Vec::new();
    let (mut log_bytes, mut segments) = (0, 0);
    for status in client.list_buckets(&path).await? {
        let store = status.store.unwrap_or_default();
        objects.push(store.stream_objects);
        log_bytes += store.stream_bytes + store.wal_bytes;
    }
    for (file, _) in files_under(store.join("streams")).await? {
        segments += u64::from(file.to_str().is_some_and(|name| !name.contains('#')));
    }
    objects.sort_unstable();
    let median = objects[objects.len() / 2];
    let max = objects.last().copied().unwrap_or_default();
    node.running.stop().await?;
    println!(
        "Objects: a log table of {BUCKETS} buckets, {ROWS_PER_APPEND}-row appends every \
         {PAUSE:?} per bucket for {duration:?}, segments of {} sealed after {SEGMENT_AGE:?} \
         at the latest ({} of log):",
        megabytes(SEGMENT_BYTES),
        megabytes(log_bytes)
    );
    println!("  objects per bucket read from : median {median}, max {max}");
    println!("  stream objects in the store  : {segments} (the replaced ones stay a minute)");
    println!(
        "  bytes uploaded per log byte  : {:.2} (stream objects, packs and merged objects; \
         above 1: merges rewriting the log)",
        written as f64 / log_bytes.max(1) as f64
    );
    Ok(())
}
