//! `mink-bench pk-lake`: the lake of primary-key tables, against Parquet files.
//!
//! ```text
//! cargo run --release -p mink-bench -- pk-lake [--keys 2000000] [--buckets 4]
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
//!    snapshot's files read in process by the union read's lake scan (`mink_scan`,
//!    DataFusion's Parquet scan) with the deletes applied, against the same files read
//!    without applying them, and against mink-lake's positioned reader (the lake index's)
//!    with the deletes applied. Then the compaction that folds the deletes, timed.
//! 3. **Union read with 1% of the keys changed in the log range** (upserted after the last
//!    round), against reading the same final rows as plain Parquet files (one per
//!    bucket, written from the union's answer), and against the same rows as Arrow IPC
//!    streams read as they arrive through loopback sockets, one per bucket at once (what
//!    any protocol over a socket could reach on the machine).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use datafusion::execution::TaskContext;
use futures::future::try_join_all;
use futures::stream::TryStreamExt;
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::reader::{LakeSplit, SplitScope, plan_split, read_split};
use mink_lake::storage::LakeStorage;
use mink_node::NodeError;
use mink_scan::lake_scan::LakeScan;
use mink_scan::union::execute_in_order;

use crate::data::{Changes, Data, ipc_len};
use crate::error::BenchError;
use crate::harness::{
    NodeArgs, Running, Throughput, blocking, buckets_of, check_pk_table_args, check_rows,
    create_pk_lake_table, measure, megabytes, prepare, read_parquet_buckets, report, row_count,
    tier, timed_rounds, write_batches, write_parquet,
};
use crate::ipc::{Fsync, read_ipc_through_loopback, write_ipc};

/// Arguments of `mink-bench pk-lake`.
#[derive(Debug, clap::Args)]
pub(crate) struct PkLakeArgs {
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

pub(crate) async fn run(args: PkLakeArgs) -> Result<(), BenchError> {
    check_pk_table_args(args.keys, args.buckets)?;
    let one_percent = args.keys / 100;
    if args.deleted > args.keys - 3 * one_percent {
        return Err(BenchError::Usage(
            "--deleted must leave 3% of the keys unchanged".into(),
        ));
    }
    let (scratch, data, config) = prepare(&args.node, args.keys)?;
    println!(
        "mink-bench pk-lake: {} keys ({} MB in memory), {} bucket{}, {}",
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

    measure(
        "upsert the keys",
        write_batches(&running.client, &table, &data.batches),
    )
    .await?;
    measure("tier the load", tier(&running, &path)).await?;

    let changed = changes.next(one_percent)?;
    write_batches(&running.client, &table, &changed.batches).await?;
    let (_, warm) = measure("tier 1% changed keys, index warm", tier(&running, &path)).await?;

    let deleted = args.deleted.max(one_percent);
    let more = changes.next(deleted - one_percent)?;
    write_batches(&running.client, &table, &more.batches).await?;
    tier(&running, &path).await?;
    lake_figure(&running, &path, data.rows, deleted).await?;

    running = running.restart().await?;
    let changed = changes.next(one_percent)?;
    write_batches(&running.client, &table, &changed.batches).await?;
    let (_, cold) = measure("tier 1% changed keys, index cold", tier(&running, &path)).await?;
    tier_figure(&scratch.path, &data, &changed, warm, cold).await?;

    let range = changes.next(one_percent)?;
    write_batches(&running.client, &table, &range.batches).await?;
    union_figure(&running, &table, data.rows, &scratch.path).await?;
    running.stop().await?;
    Ok(())
}

/// Figure 1, from the rounds' times: against writing the changed rows and against
/// rewriting the whole table.
async fn tier_figure(
    dir: &Path,
    data: &Data,
    changed: &Data,
    warm: Duration,
    cold: Duration,
) -> Result<(), BenchError> {
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
/// them. Both reads run in process through the union read's lake scan, so the ratio is
/// the cost of applying the deletes alone.
async fn lake_figure(
    running: &Running,
    path: &TablePath,
    rows: usize,
    deleted: usize,
) -> Result<(), BenchError> {
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
        LakeReader::Scan,
        lake.storage(),
        &split,
        &schema,
        rows,
        "read the lake, deletes applied",
    );
    let with = with.await?;
    let positioned = lake_reads(
        LakeReader::Positioned,
        lake.storage(),
        &split,
        &schema,
        rows,
        "read the lake with mink-lake's positioned reader, deletes applied",
    );
    let positioned = positioned.await?;
    let without = lake_reads(
        LakeReader::Scan,
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
        &[
            format!(
                "vs deletes ignored {:.2} (by time)",
                without.elapsed.as_secs_f64() / with.elapsed.as_secs_f64()
            ),
            format!(
                "vs the positioned reader {:.2}",
                positioned.elapsed.as_secs_f64() / with.elapsed.as_secs_f64()
            ),
        ],
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
///
/// [`ROUNDS`]: crate::harness::ROUNDS
async fn lake_reads(
    reader: LakeReader,
    storage: &LakeStorage,
    split: &LakeSplit,
    schema: &SchemaRef,
    rows: usize,
    what: &str,
) -> Result<Throughput, BenchError> {
    let (batches, elapsed) = timed_rounds(what, || async {
        let batches = match reader {
            LakeReader::Scan => {
                let scan = LakeScan {
                    storage,
                    table_schema: Arc::clone(schema),
                    projection: (0..schema.fields().len()).collect(),
                    predicate: None,
                };
                let context = Arc::new(TaskContext::default());
                let plan = scan
                    .plan(&context, &[split])
                    .await
                    .map_err(NodeError::from)?;
                execute_in_order(plan, context)
                    .try_collect::<Vec<_>>()
                    .await
                    .map_err(NodeError::from)?
            }
            LakeReader::Positioned => read_split(storage, split.clone(), Arc::clone(schema))
                .try_collect::<Vec<_>>()
                .await
                .map_err(NodeError::from)?,
        };
        check_rows(what, row_count(&batches), rows)?;
        Ok(batches)
    })
    .await?;
    Ok(Throughput::new(rows, ipc_len(&batches)?, elapsed))
}

/// What reads the lake in [`lake_reads`].
#[derive(Debug, Clone, Copy)]
enum LakeReader {
    /// The union read's lake scan (DataFusion's Parquet scan, deletes as row selections).
    Scan,
    /// mink-lake's positioned reader (the lake index's and `table_changes`' reader).
    Positioned,
}

/// Figure 3: union reads of every bucket against the same rows as Parquet files.
async fn union_figure(
    running: &Running,
    table: &TableDescriptor,
    rows: usize,
    dir: &Path,
) -> Result<(), BenchError> {
    let (answers, union_time) = timed_rounds("union read", || async {
        let reads = buckets_of(table)
            .into_iter()
            .map(|bucket| async move { running.client.union(&bucket, &[], &[]).await });
        let answers = try_join_all(reads).await?;
        let read_rows: usize = answers.iter().map(|answer| answer.num_rows()).sum();
        check_rows("the union read", read_rows, rows)?;
        Ok(answers)
    })
    .await?;
    let tail_rows: i64 = answers.iter().map(|a| a.plan.log_range_len()).sum();
    let mut files = Vec::new();
    let mut streams = Vec::new();
    let mut bytes = 0;
    for (b, answer) in answers.into_iter().enumerate() {
        bytes += ipc_len(&answer.batches)?;
        if answer.batches.is_empty() {
            files.push(vec![]);
            continue;
        }
        let parquet = dir.join(format!("baseline-final-bucket{b}.parquet"));
        let stream = dir.join(format!("baseline-final-bucket{b}.arrows"));
        let (paths, batches) = ((parquet.clone(), stream.clone()), answer.batches);
        blocking(move || {
            write_parquet(&paths.0, &batches)?;
            write_ipc(&paths.1, &batches, Fsync::Never)
        })
        .await?;
        files.push(vec![parquet]);
        streams.push(stream);
    }
    let ((), baseline_time) = timed_rounds("read the final rows as Parquet", || async {
        let read = read_parquet_buckets(&files, &[]).await?;
        check_rows("the Parquet files", read, rows)
    })
    .await?;
    let ((), socket_time) = timed_rounds("the final rows as IPC through sockets", || async {
        let reads = streams
            .iter()
            .cloned()
            .map(|stream| blocking(move || read_ipc_through_loopback(&stream)));
        let read: usize = try_join_all(reads).await?.into_iter().sum();
        check_rows("the IPC streams", read, rows)
    })
    .await?;
    let baseline = Throughput::new(rows, bytes, baseline_time);
    let socket = Throughput::new(rows, bytes, socket_time);
    let figure = Throughput::new(rows, bytes, union_time);
    report("baseline Parquet read of the final rows", baseline, &[]);
    report(
        "baseline the final rows as IPC through sockets",
        socket,
        &[format!("vs Parquet read {:.2}", socket.ratio_to(&baseline))],
    );
    report(
        &format!("union read, {tail_rows} changes in the log range"),
        figure,
        &[
            format!("vs Parquet read {:.2}", figure.ratio_to(&baseline)),
            format!("vs IPC through sockets {:.2}", figure.ratio_to(&socket)),
        ],
    );
    Ok(())
}
