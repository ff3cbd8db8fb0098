//! `mink read`: the rows of one bucket (or every bucket) of a table, read over the node's
//! Flight protocol.
//!
//! - `--mode log` scans each bucket from `--from` (default: log_start) up to the high
//!   watermark seen when the read starts, then exits.
//! - `--mode tail` follows each bucket from `--from` (default: the high watermark) and
//!   prints batches as they are written, until interrupted.
//!
//! - `--mode snapshot` prints the current rows of a primary-key table's buckets in key
//!   order, and on stderr the changelog offset each snapshot reflects (a `--mode log
//!   --from` there continues it).
//!
//! - `--mode union` reads each bucket as it is now: its lake rows below the seam, then its
//!   log up to the high watermark (for a primary-key table, folded by key); the plan of
//!   each bucket (snapshot, seam, log range) goes to stderr.
//! - `--mode lake` reads the table's latest recorded lake snapshot (or `--partition`).

use std::time::Duration;

use mink_client::MinkClient;
use mink_core::protocol::BucketId;
use mink_core::table::{TableDescriptor, TablePath};
use tokio::sync::mpsc;

use crate::embedded::LoginArgs;
use crate::error::CliError;
use crate::output::{BatchPrinter, Format};

/// What to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ReadMode {
    /// Lake snapshot plus log range, merged.
    Union,
    /// The log from an offset up to the high watermark.
    Log,
    /// The Iceberg snapshot only.
    Lake,
    /// The current rows of a primary-key table.
    Snapshot,
    /// Follow the log as it grows.
    Tail,
}

/// Arguments of `mink read`.
#[derive(Debug, clap::Args)]
pub(crate) struct ReadArgs {
    /// Address of the node (`host:port`).
    #[arg(long)]
    connect: String,
    /// The table (`t` or `db.t`).
    #[arg(long)]
    table: String,
    /// Only this bucket (default: every bucket).
    #[arg(long)]
    bucket: Option<u32>,
    /// Only this partition of a partitioned table (`col=value/...`).
    #[arg(long)]
    partition: Option<String>,
    /// What to read.
    #[arg(long, value_enum)]
    mode: ReadMode,
    /// First offset to read.
    #[arg(long)]
    from: Option<i64>,
    /// Columns to return, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    columns: Vec<String>,
    /// How rows are printed.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// How to log in to the node.
    #[command(flatten)]
    login: LoginArgs,
}

pub(crate) async fn run(args: ReadArgs) -> Result<(), CliError> {
    let client = MinkClient::connect_with(&args.connect, &args.login.options()?).await?;
    let table = client
        .describe_table(&TablePath::parse(&args.table)?)
        .await?;
    let columns: Vec<u32> = table
        .column_indices(&args.columns)?
        .into_iter()
        .map(|i| i as u32)
        .collect();
    let buckets = select_buckets(&client, &table, &args).await?;
    let mut printer = BatchPrinter::new(args.format);
    match args.mode {
        ReadMode::Log => {
            for (bucket, log_start, _) in buckets {
                read_log(
                    &client,
                    &bucket,
                    args.from.unwrap_or(log_start),
                    &columns,
                    &mut printer,
                )
                .await?;
            }
            Ok(())
        }
        ReadMode::Tail => follow(&client, buckets, args.from, &columns, printer).await,
        ReadMode::Snapshot => {
            if !table.has_primary_key() {
                return Err(CliError::Usage(format!(
                    "table {} is a log table: --mode snapshot needs a primary key (use --mode log)",
                    table.path
                )));
            }
            for (bucket, _, _) in buckets {
                let answer = client.snapshot(&bucket, &columns, 0).await?;
                for batch in &answer.batches {
                    printer.print(batch)?;
                }
                eprintln!("{bucket}: snapshot at log offset {}", answer.log_offset);
            }
            Ok(())
        }
        ReadMode::Union => {
            for (bucket, _, _) in buckets {
                let answer = client.union(&bucket, &columns, &[]).await?;
                for batch in &answer.batches {
                    printer.print(batch)?;
                }
                let plan = &answer.plan;
                eprintln!(
                    "{bucket}: lake snapshot {} up to offset {} ({} files), log [{}, {})",
                    plan.snapshot_id
                        .map_or("none".to_string(), |s| s.to_string()),
                    plan.lake_log_end_offset,
                    plan.lake_files,
                    plan.log_from,
                    plan.log_to
                );
            }
            Ok(())
        }
        ReadMode::Lake => {
            let batches = client
                .lake(&table.path, args.partition.as_deref(), None, &columns, &[])
                .await?;
            for batch in &batches {
                printer.print(batch)?;
            }
            Ok(())
        }
    }
}

/// The buckets to read with `(log_start, high_watermark)`.
async fn select_buckets(
    client: &MinkClient,
    table: &TableDescriptor,
    args: &ReadArgs,
) -> Result<Vec<(BucketId, i64, i64)>, CliError> {
    if let Some(bucket) = args.bucket
        && bucket >= table.bucket_num
    {
        return Err(CliError::Usage(format!(
            "table {} has {} buckets; there is no bucket {bucket}",
            table.path, table.bucket_num
        )));
    }
    let selected: Vec<_> = client
        .list_buckets(&table.path)
        .await?
        .into_iter()
        .filter_map(|status| {
            let bucket = status.bucket?;
            let wanted = args.bucket.is_none_or(|b| b == bucket.bucket)
                && (args.partition.is_none() || args.partition == bucket.partition);
            wanted.then_some((bucket, status.log_start, status.high_watermark))
        })
        .collect();
    if selected.is_empty() && args.partition.is_some() {
        return Err(CliError::Usage(format!(
            "table {} has no partition {:?} yet",
            table.path,
            args.partition.as_deref().unwrap_or_default()
        )));
    }
    Ok(selected)
}

/// Scans one bucket from `from` up to the high watermark seen by the first answer.
async fn read_log(
    client: &MinkClient,
    bucket: &BucketId,
    from: i64,
    columns: &[u32],
    printer: &mut BatchPrinter,
) -> Result<(), CliError> {
    let mut offset = from;
    let mut end = None;
    loop {
        let answer = client.scan(bucket, offset, 0, columns).await?;
        let stop_at = *end.get_or_insert(answer.high_watermark);
        for read in &answer.batches {
            let batch = &read.batch;
            // The first batch may start before `from`; batches past `stop_at` are skipped.
            let skip = (offset - read.metadata.base_offset).max(0) as usize;
            let keep =
                ((stop_at - read.metadata.base_offset).max(0) as usize).min(batch.num_rows());
            if keep > skip {
                printer.print(&batch.slice(skip, keep - skip))?;
            }
        }
        offset = answer.next_offset;
        if offset >= stop_at || answer.batches.is_empty() {
            return Ok(());
        }
    }
}

/// Follows every bucket, printing batches as they arrive, until Ctrl-C.
async fn follow(
    client: &MinkClient,
    buckets: Vec<(BucketId, i64, i64)>,
    from: Option<i64>,
    columns: &[u32],
    mut printer: BatchPrinter,
) -> Result<(), CliError> {
    let (sender, mut received) = mpsc::channel(16);
    let mut followers = tokio::task::JoinSet::new();
    for (bucket, _, high_watermark) in buckets {
        let mut tailer = client.tail(&bucket, columns).await?;
        let sender = sender.clone();
        let mut offset = from.unwrap_or(high_watermark);
        followers.spawn(async move {
            loop {
                let answer = tailer.poll(offset, Duration::from_secs(5), 0).await?;
                for read in answer.batches {
                    let skip = (offset - read.metadata.base_offset).max(0) as usize;
                    let rows = read.batch.slice(skip, read.batch.num_rows() - skip);
                    if sender.send(rows).await.is_err() {
                        return Ok::<(), CliError>(());
                    }
                }
                offset = answer.next_offset;
            }
        });
    }
    drop(sender);
    loop {
        tokio::select! {
            batch = received.recv() => match batch {
                Some(batch) => printer.print(&batch)?,
                None => break,
            },
            Some(done) = followers.join_next() => {
                if let Ok(Err(error)) = done {
                    return Err(error);
                }
            }
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    Ok(())
}
