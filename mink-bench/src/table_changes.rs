//! `mink-bench table-changes`: the incremental read of a primary-key table's lake.
//!
//! ```text
//! cargo run --release -p mink-bench -- table-changes [--keys 2000000] [--buckets 4]
//!     [--dir DIR] [--no-sync]
//! ```
//!
//! One primary-key table (`id`) of `--keys` rows with a lake, loaded and tiered (snapshot
//! `from`); then 1% of its keys, drawn at random, get new values and are tiered in one
//! round (snapshot `to`: per bucket a data file of the new versions and a position-delete
//! file of the old ones). The figures: the changes from `from` to `to` (planned from the
//! manifests, the old versions read back from the rows the position deletes name, the new
//! versions; two rows per changed key), with the deleted rows whole (every column decoded
//! at their positions) and by key (only `id` decoded), each against a full read of `to`
//! (planned, every data file read with its deletes applied). All run in process through
//! mink's lake reader (`mink_lake::changes` and `mink_lake::reader`), planning included,
//! all columns; each is the median of three reads, alternating. The files were just written, so both read from
//! the operating system's page cache.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use futures::TryStreamExt;
use mink_lake::changes::{DeletedRows, plan_changes, read_changes};
use mink_lake::reader::{SplitScope, plan_split, read_split};
use mink_lake::storage::LakeStorage;
use mink_lake::{LakeError, LakeTable};
use mink_node::NodeError;

use crate::data::{Changes, ipc_len};
use crate::error::BenchError;
use crate::harness::{
    NodeArgs, ROUNDS, Running, Throughput, check_pk_table_args, check_rows, create_pk_lake_table,
    measure, median, prepare, report, row_count, tier, write_batches,
};

/// Arguments of `mink-bench table-changes`.
#[derive(Debug, clap::Args)]
pub(crate) struct TableChangesArgs {
    /// Keys of the table, loaded in batches of 10 000.
    #[arg(long, default_value_t = 2_000_000)]
    keys: usize,
    /// Buckets of the table.
    #[arg(long, default_value_t = 4)]
    buckets: u32,
    #[command(flatten)]
    node: NodeArgs,
}

pub(crate) async fn run(args: TableChangesArgs) -> Result<(), BenchError> {
    check_pk_table_args(args.keys, args.buckets)?;
    let (scratch, data, config) = prepare(&args.node, args.keys)?;
    println!(
        "mink-bench table-changes: {} keys ({} MB in memory), {} bucket{}, {}",
        data.rows,
        data.memory_bytes() / 1_000_000,
        args.buckets,
        if args.buckets == 1 { "" } else { "s" },
        args.node.describe(&config, &scratch)
    );
    let running = Running::start(config).await?;
    let table = create_pk_lake_table(&running, "table_changes", &data, args.buckets).await?;
    let path = table.path.clone();

    measure(
        "upsert the keys",
        write_batches(&running.client, &table, &data.batches),
    )
    .await?;
    let (from, _) = measure("tier the load", tier(&running, &path)).await?;
    let changed = Changes::new(args.keys).next(args.keys / 100)?;
    write_batches(&running.client, &table, &changed.batches).await?;
    let (to, _) = measure("tier 1% changed keys", tier(&running, &path)).await?;

    let lake = running.node.lake().await?;
    let lake_table = lake.load(&path).await.map_err(NodeError::from)?;
    let columns = Arc::clone(running.node.describe(&path)?.schema());
    let delta_rows = 2 * changed.rows;
    let key = table.primary_key.clone();
    let reads = [
        ("the changes, deleted rows whole", DeletedRows::Whole),
        (
            "the changes, deleted rows by key",
            DeletedRows::Identity(&key),
        ),
    ];
    let mut times = vec![Vec::new(); reads.len() + 1];
    let mut bytes = vec![0; reads.len() + 1];
    for _ in 0..ROUNDS {
        for (i, (what, deleted)) in reads.iter().enumerate() {
            let read = read_changes_of(&lake_table, lake.storage(), &columns, (from, to), *deleted);
            let (batches, elapsed) = measure(what, lake_read(read)).await?;
            check_rows(what, row_count(&batches), delta_rows)?;
            bytes[i] = ipc_len(&batches)?;
            times[i].push(elapsed);
        }
        let (batches, elapsed) = measure(
            "read the lake as of the round",
            lake_read(full(&lake_table, lake.storage(), &columns, to)),
        )
        .await?;
        check_rows("the full read", row_count(&batches), data.rows)?;
        bytes[reads.len()] = ipc_len(&batches)?;
        times[reads.len()].push(elapsed);
    }
    let times: Vec<Duration> = times.into_iter().map(median).collect();
    let full_time = times[reads.len()];
    let full_figure = Throughput::new(data.rows, bytes[reads.len()], full_time);
    report(
        "full lake read of the round",
        format!("{:.3} s   {full_figure}", full_time.as_secs_f64()),
        &[],
    );
    for (i, (what, _)) in reads.iter().enumerate() {
        report(
            what,
            format!(
                "{:.3} s   {}   ({delta_rows} rows for {} keys)",
                times[i].as_secs_f64(),
                Throughput::new(delta_rows, bytes[i], times[i]),
                changed.rows
            ),
            &[format!("vs full read {}", self::times(full_time, times[i]))],
        );
    }
    running.stop().await?;
    Ok(())
}

/// The changes from `from` to `to`, planned and read.
async fn read_changes_of(
    table: &LakeTable,
    storage: &LakeStorage,
    columns: &SchemaRef,
    (from, to): (i64, i64),
    deleted: DeletedRows<'_>,
) -> Result<Vec<RecordBatch>, LakeError> {
    let plan = plan_changes(table, from, to).await?;
    read_changes(storage, plan, columns, deleted)
        .try_collect()
        .await
}

/// Every row of snapshot `to`, planned and read.
async fn full(
    table: &LakeTable,
    storage: &LakeStorage,
    columns: &SchemaRef,
    to: i64,
) -> Result<Vec<RecordBatch>, LakeError> {
    let split = plan_split(table, to, &SplitScope::Table, None).await?;
    read_split(storage, split, Arc::clone(columns))
        .try_collect()
        .await
}

async fn lake_read(
    read: impl Future<Output = Result<Vec<RecordBatch>, LakeError>>,
) -> Result<Vec<RecordBatch>, BenchError> {
    Ok(read.await.map_err(NodeError::from)?)
}

/// `N.NNx faster` (or slower): how many times less time `figure` took than `baseline`.
fn times(baseline: Duration, figure: Duration) -> String {
    let ratio = baseline.as_secs_f64() / figure.as_secs_f64();
    match ratio >= 1.0 {
        true => format!("{ratio:.1}x faster"),
        false => format!("{:.1}x slower", 1.0 / ratio),
    }
}
