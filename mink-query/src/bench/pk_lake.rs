//! `mink bench pk-lake`: the lake of primary-key tables.
//!
//! ```text
//! cargo run --release -p mink-query -- bench pk-lake [--keys 2000000] [--buckets 4]
//!     [--deleted 100000] [--dir DIR] [--no-sync]
//! ```
//!
//! One primary-key table (`id`) of `--keys` rows with a lake, tiered on demand. Keys
//! are changed by upserting new values of distinct keys drawn at random ("1%" is
//! `keys / 100` of them). After loading and tiering every key:
//!
//! 1. **Tiering round of 1% changed keys**, with the lake index warm (kept from the last
//!    round) and cold (after a restart, rebuilt by reading the lake's keys: the index
//!    cost included). Baselines: writing the changed rows as one Parquet file, and
//!    rewriting the whole table as Parquet (what a copy-on-write lake would do).
//! 2. **Lake read with `--deleted` position-deleted rows** (the keys changed so far): the
//!    snapshot's files read in process by mink's lake reader with the deletes applied,
//!    against the same files read without applying them. Then the compaction that folds
//!    the deletes, timed.
//! 3. **Union read with 1% of the keys changed in the tail** (upserted after the last
//!    round), against reading the same final rows as plain Parquet files (one per
//!    bucket, written from the union's answer).

use std::path::Path;

use std::time::Duration;

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use futures::stream::{self, StreamExt, TryStreamExt};
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::reader::{LakeSplit, SplitScope, plan_split, read_split};
use mink_lake::storage::LakeStorage;
use mink_node::NodeError;

use super::{
    Data, NodeArgs, ROUNDS, Running, Throughput, WRITES_IN_FLIGHT, XorShift, blocking, buckets_of,
    check_pk_table_args, check_rows, create_pk_lake_table, ipc_len, measure, median, megabytes,
    prepare, read_parquet_buckets, report, write_parquet,
};
use crate::error::CliError;

/// Arguments of `mink bench pk-lake`.
#[derive(Debug, clap::Args)]
pub(super) struct PkLakeArgs {
    /// Keys of the table, loaded in batches of 10 000.
    #[arg(long, default_value_t = 2_000_000)]
    keys: usize,
    /// Buckets of the table.
    #[arg(long, default_value_t = 4)]
    buckets: u32,
    /// Position-deleted rows in the lake for the lake read figure (at least 1% of the keys).
    #[arg(long, default_value_t = 100_000)]
    deleted: usize,
    #[command(flatten)]
    node: NodeArgs,
}

pub(super) async fn run(args: PkLakeArgs) -> Result<(), CliError> {
    check_pk_table_args(args.keys, args.buckets)?;
    let one_percent = args.keys / 100;
    if args.deleted > args.keys - 3 * one_percent {
        return Err(CliError::Usage(
            "--deleted must leave 3% of the keys unchanged".into(),
        ));
    }
    let (scratch, data, config) = prepare(&args.node, args.keys)?;
    println!(
        "mink bench pk-lake: {} keys ({} MB in memory), {} bucket{}, {}",
        data.rows,
        data.memory_bytes() / 1_000_000,
        args.buckets,
        if args.buckets == 1 { "" } else { "s" },
        args.node.describe(&config, &scratch)
    );
    let mut running = Running::start(config).await?;
    let table = create_pk_lake_table(&running, "pk_lake", &data, args.buckets).await?;
    let path = table.path.clone();
    let mut changes = Changes::new(args.keys);

    measure("upsert the keys", upsert(&running, &table, &data.batches)).await?;
    measure("tier the load", tier(&running, &path)).await?;

    let changed = changes.next(one_percent)?;
    upsert(&running, &table, &changed.batches).await?;
    let (_, warm) = measure("tier 1% changed keys, index warm", tier(&running, &path)).await?;

    let deleted = args.deleted.max(one_percent);
    let more = changes.next(deleted - one_percent)?;
    upsert(&running, &table, &more.batches).await?;
    tier(&running, &path).await?;
    lake_figure(&running, &path, data.rows, deleted).await?;

    running = running.restart().await?;
    let changed = changes.next(one_percent)?;
    upsert(&running, &table, &changed.batches).await?;
    let (_, cold) = measure("tier 1% changed keys, index cold", tier(&running, &path)).await?;
    tier_figure(&scratch.path, &data, &changed, warm, cold).await?;

    let tail = changes.next(one_percent)?;
    upsert(&running, &table, &tail.batches).await?;
    union_figure(&running, &table, data.rows, &scratch.path).await?;
    running.stop().await?;
    Ok(())
}

/// Distinct keys in a random order, handed out a share at a time.
#[derive(Debug)]
pub(super) struct Changes {
    keys: Vec<i64>,
    next: usize,
    rng: XorShift,
}

impl Changes {
    pub(super) fn new(keys: usize) -> Self {
        let mut rng = XorShift::new(0xc4a9);
        let mut ids: Vec<i64> = (0..keys as i64).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        Self {
            keys: ids,
            next: 0,
            rng,
        }
    }

    /// New values for the next `count` keys.
    pub(super) fn next(&mut self, count: usize) -> Result<Data, CliError> {
        let ids = &self.keys[self.next..self.next + count];
        self.next += count;
        Data::with_ids(ids, self.rng.next_u64())
    }
}

/// Upserts batches, a few calls in flight.
pub(super) async fn upsert(
    running: &Running,
    table: &TableDescriptor,
    batches: &[RecordBatch],
) -> Result<(), CliError> {
    stream::iter(batches)
        .map(|batch| running.client.write(table, batch))
        .buffer_unordered(WRITES_IN_FLIGHT)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// One tiering round that must commit; its snapshot.
pub(super) async fn tier(running: &Running, path: &TablePath) -> Result<i64, CliError> {
    let reply = running.client.tier(path).await?;
    reply
        .snapshot_id
        .ok_or_else(|| NodeError::Corrupt(format!("a round of {path} committed nothing")).into())
}

/// Figure 1, from the rounds' times: against writing the changed rows and against
/// rewriting the whole table.
async fn tier_figure(
    dir: &Path,
    data: &Data,
    changed: &Data,
    warm: Duration,
    cold: Duration,
) -> Result<(), CliError> {
    let changed_file = dir.join("baseline-changed.parquet");
    let batches = changed.batches.clone();
    let write_changed = blocking(move || write_parquet(&changed_file, &batches));
    let (_, changed_elapsed) = measure("write the changed rows as Parquet", write_changed).await?;
    let table_file = dir.join("baseline-table.parquet");
    let batches = data.batches.clone();
    let rewrite = blocking(move || write_parquet(&table_file, &batches));
    let (bytes, rewrite_elapsed) = measure("rewrite the table as Parquet", rewrite).await?;
    let rows = changed.rows;
    report(
        "baseline Parquet write of the changed rows",
        format!("{:.3} s", changed_elapsed.as_secs_f64()),
        &[],
    );
    report(
        "baseline Parquet rewrite of the table",
        format!(
            "{:.3} s   ({})",
            rewrite_elapsed.as_secs_f64(),
            megabytes(bytes)
        ),
        &[],
    );
    for (what, elapsed) in [("index warm", warm), ("index rebuilt", cold)] {
        report(
            &format!("tier {rows} changed keys ({what})"),
            format!("{:.3} s", elapsed.as_secs_f64()),
            &[
                format!(
                    "vs changed-rows write {:.2}",
                    changed_elapsed.as_secs_f64() / elapsed.as_secs_f64()
                ),
                format!(
                    "vs table rewrite {:.2}",
                    rewrite_elapsed.as_secs_f64() / elapsed.as_secs_f64()
                ),
            ],
        );
    }
    Ok(())
}

/// Figure 2: the lake's files read with their `deleted` position-deleted rows applied,
/// against the same files read without applying them; then the compaction that folds
/// them. Both reads run in process through mink's lake reader, so the ratio is the cost
/// of applying the deletes alone.
async fn lake_figure(
    running: &Running,
    path: &TablePath,
    rows: usize,
    deleted: usize,
) -> Result<(), CliError> {
    let lake = running.node.lake().await?;
    let lake_table = lake.load(path).await.map_err(NodeError::from)?;
    let snapshot = lake_table
        .metadata()
        .current_snapshot_id()
        .ok_or_else(|| NodeError::Corrupt(format!("{path} has no lake snapshot")))?;
    let split = plan_split(&lake_table, snapshot, &SplitScope::Table, None)
        .await
        .map_err(NodeError::from)?;
    let deletes = split.delete_file_count();
    let mut ignored = split.clone();
    for file in &mut ignored.files {
        file.deletes.clear();
    }
    let schema = Arc::clone(running.node.describe(path)?.schema());
    let with = lake_reads(
        lake.storage(),
        &split,
        &schema,
        rows,
        "read the lake, deletes applied",
    );
    let with = with.await?;
    let without = lake_reads(
        lake.storage(),
        &ignored,
        &schema,
        rows + deleted,
        "read the lake's files, deletes ignored",
    );
    let without = without.await?;
    report(
        "lake files read, deletes ignored",
        format!("{without}   ({} data files)", split.files.len()),
        &[],
    );
    report(
        &format!("lake read, {deleted} rows position-deleted"),
        format!("{with}   ({deletes} delete files)"),
        &[format!(
            "vs deletes ignored {:.2} (by time)",
            without.elapsed.as_secs_f64() / with.elapsed.as_secs_f64()
        )],
    );
    let (reply, elapsed) = measure("compact the table", async {
        Ok(running.client.compact(path).await?)
    })
    .await?;
    report(
        "compaction of the table",
        format!(
            "{:.3} s   ({} files removed, {} written, {} rows)",
            elapsed.as_secs_f64(),
            reply.files_removed,
            reply.files_written,
            reply.rows
        ),
        &[],
    );
    Ok(())
}

/// The median of [`ROUNDS`] in-process reads of a lake split, expecting `rows` rows.
async fn lake_reads(
    storage: &LakeStorage,
    split: &LakeSplit,
    schema: &SchemaRef,
    rows: usize,
    what: &str,
) -> Result<Throughput, CliError> {
    let mut elapsed = Vec::new();
    let mut bytes = 0;
    for _ in 0..ROUNDS {
        let read = read_split(storage, split.clone(), Arc::clone(schema), Vec::new());
        let read = async {
            Ok(read
                .try_collect::<Vec<_>>()
                .await
                .map_err(NodeError::from)?)
        };
        let (batches, took) = measure(what, read).await?;
        let read_rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        check_rows(what, read_rows, rows)?;
        bytes = ipc_len(&batches)?;
        elapsed.push(took);
    }
    Ok(Throughput::new(rows, bytes, median(elapsed)))
}

/// Figure 3: union reads of every bucket against the same rows as Parquet files.
async fn union_figure(
    running: &Running,
    table: &TableDescriptor,
    rows: usize,
    dir: &Path,
) -> Result<(), CliError> {
    let mut unions = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..ROUNDS {
        let reads = buckets_of(table)
            .into_iter()
            .map(|bucket| async move { running.client.union(&bucket, &[], &[]).await });
        let read = async { Ok(futures::future::try_join_all(reads).await?) };
        let (read, elapsed) = measure("union read", read).await?;
        let read_rows: usize = read.iter().map(|answer| answer.num_rows()).sum();
        check_rows("the union read", read_rows, rows)?;
        unions.push(elapsed);
        answers = read;
    }
    let tail_rows: i64 = answers
        .iter()
        .map(|a| a.plan.log_to - a.plan.log_from)
        .sum();
    let mut files = Vec::new();
    let mut bytes = 0;
    for (b, answer) in answers.into_iter().enumerate() {
        let path = dir.join(format!("baseline-final-bucket{b}.parquet"));
        bytes += ipc_len(&answer.batches)?;
        if answer.batches.is_empty() {
            files.push(vec![]);
            continue;
        }
        let (file, batches) = (path.clone(), answer.batches);
        blocking(move || write_parquet(&file, &batches)).await?;
        files.push(vec![path]);
    }
    let mut baselines = Vec::new();
    for _ in 0..ROUNDS {
        let read = read_parquet_buckets(&files, &[]);
        let (read, elapsed) = measure("read the final rows as Parquet", read).await?;
        check_rows("the Parquet files", read, rows)?;
        baselines.push(elapsed);
    }
    let baseline = Throughput::new(rows, bytes, median(baselines));
    let figure = Throughput::new(rows, bytes, median(unions));
    report("baseline Parquet read of the final rows", baseline, &[]);
    report(
        &format!("union read, {tail_rows} changes in the tail"),
        figure,
        &[format!("vs Parquet read {:.2}", figure.ratio_to(&baseline))],
    );
    Ok(())
}
