//! `mink-bench position-deletes`: what leaving rows out by position costs the lake scan.
//!
//! ```text
//! cargo run --release -p mink-bench -- position-deletes [--rows 10000000] [--files 4] [--dir DIR]
//! ```
//!
//! A union read of a primary-key table leaves out the lake rows its range replaces by
//! position, as Iceberg's position deletes are (`mink_scan::lake_scan`: a row selection
//! per row group). The rows of the `sql` suite are written as `--files` Parquet files
//! with the lake writer's properties, and mink's lake scan (`LakeScan`, DataFusion's
//! Parquet scan) reads them with 0.1%, 1% and 10% of each file's rows left out, at
//! random positions, against the same scan leaving out none: a plain-encoded column
//! (`price`, what `count(*), sum(price)` reads), a dictionary-encoded one (`quantity`,
//! what the `sql` suite groups and filters by) and every column. Each time is the median
//! of [`crate::harness::ROUNDS`], planning included; a ratio below 1 (the scan's time
//! leaving none out over its time leaving some out) is the price of the positions.
//!
//! Then the same files read with arrow-rs's reader directly, one column at a time, 1% of
//! the rows left out by each of its two ways of applying a row selection
//! ([`RowSelectionPolicy`]): a queue of selectors (what it picks when the runs average 32
//! rows or more, and so what DataFusion's scan gets at 1%) and a boolean mask (decode
//! whole batches, then filter), and every row read then filtered by position with
//! arrow's filter kernel (what a reader of mink's own that knows each row's position
//! could do), against reading every row.

use std::fs::File;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::BooleanArray;
use arrow::compute::filter_record_batch;
use datafusion::physical_plan::collect;
use datafusion::prelude::SessionContext;
use mink_lake::reader::{GroupRows, LakeFile, LakeSplit, rows_per_group};
use mink_lake::storage::LakeStorage;
use mink_scan::lake_scan::LakeScan;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ParquetRecordBatchReaderBuilder, RowSelection, RowSelectionPolicy, RowSelector,
};
use rand::seq::index::sample;

use crate::data::seeded;
use crate::error::BenchError;
use crate::harness::{
    FileRowsArgs, blocking, report, row_count, split, timed_rounds, write_parquet,
};

/// Arguments of `mink-bench position-deletes`.
#[derive(Debug, clap::Args)]
pub(crate) struct PositionDeletesArgs {
    #[command(flatten)]
    files: FileRowsArgs,
}

/// The shares of each file's rows left out, per thousand rows.
const PER_MILLE_DELETED: [usize; 3] = [1, 10, 100];

pub(crate) async fn run(args: PositionDeletesArgs) -> Result<(), BenchError> {
    let args = args.files;
    let (scratch, data) = args.start("position-deletes", "files")?;
    let mut files = Vec::new();
    for (file, part) in split(&data.batches, args.files).into_iter().enumerate() {
        let path = scratch.path.join(format!("part-{file}.parquet"));
        let location = path.to_string_lossy().to_string();
        let rows = row_count(&part);
        let size = blocking(move || write_parquet(&path, &part)).await?;
        files.push(LakeFile {
            path: location,
            size,
            record_count: Some(rows as u64),
            partition: None,
            deletes: Vec::new(),
            replaced_rows: Vec::new(),
        });
    }
    let storage =
        LakeStorage::local(&scratch.path.to_string_lossy()).map_err(mink_scan::external)?;
    let every_column: Vec<usize> = (0..data.schema.fields().len()).collect();
    let price = data.schema.index_of("price")?;
    let quantity = data.schema.index_of("quantity")?;
    let projections = [
        ("price (plain)", vec![price]),
        ("quantity (dictionary)", vec![quantity]),
        ("every column", every_column),
    ];
    for (what, projection) in projections {
        let scan = LakeScan {
            storage: &storage,
            table_schema: Arc::clone(&data.schema),
            projection,
            predicate: None,
        };
        let whole = scan_time(&scan, &files, &format!("{what}, none left out")).await?;
        report(&format!("{what}: none left out"), seconds(whole), &[]);
        for per_mille in PER_MILLE_DELETED {
            let deleted = with_deleted(&files, per_mille);
            let label = format!("{what}: {:.1}% left out", per_mille as f64 / 10.0);
            let time = scan_time(&scan, &deleted, &label).await?;
            let ratio = whole.as_secs_f64() / time.as_secs_f64();
            report(
                &label,
                seconds(time),
                &[format!("vs none left out {ratio:.2}")],
            );
        }
    }
    let deleted = with_deleted(&files, 10);
    for (what, column) in [
        ("price (plain)", price),
        ("quantity (dictionary)", quantity),
    ] {
        let label = format!("arrow-rs, {what}, none left out");
        let whole = reader_time(&deleted, column, LeaveOut::Nothing, &label).await?;
        report(&label, seconds(whole), &[]);
        let ways = [
            (
                "selectors",
                LeaveOut::Selection(RowSelectionPolicy::Selectors),
            ),
            ("mask", LeaveOut::Selection(RowSelectionPolicy::Mask)),
            ("filter by position", LeaveOut::Filter),
        ];
        for (name, leave_out) in ways {
            let label = format!("arrow-rs, {what}, 1% left out, {name}");
            let time = reader_time(&deleted, column, leave_out, &label).await?;
            let ratio = whole.as_secs_f64() / time.as_secs_f64();
            report(
                &label,
                seconds(time),
                &[format!("vs none left out {ratio:.2}")],
            );
        }
    }
    Ok(())
}

/// How a read of one column leaves out a file's replaced rows.
#[derive(Debug, Clone, Copy)]
enum LeaveOut {
    /// It reads every row.
    Nothing,
    /// A row selection, applied as `policy` says.
    Selection(RowSelectionPolicy),
    /// Every row is read, then the replaced ones filtered out by position.
    Filter,
}

/// The median time of reading column `column` of `files` with arrow-rs's reader, one
/// file after another, leaving out their replaced rows as `leave_out` says.
async fn reader_time(
    files: &[LakeFile],
    column: usize,
    leave_out: LeaveOut,
    label: &str,
) -> Result<Duration, BenchError> {
    let expected: u64 = files
        .iter()
        .map(|f| match leave_out {
            LeaveOut::Nothing => f.record_count.unwrap_or(0),
            _ => f.record_count.unwrap_or(0) - f.replaced_rows.len() as u64,
        })
        .sum();
    let (rows, time) = timed_rounds(label, || {
        let files = files.to_vec();
        blocking(move || {
            let mut rows = 0;
            for file in &files {
                rows += read_column(file, column, leave_out)?;
            }
            Ok(rows)
        })
    })
    .await?;
    if rows as u64 != expected {
        return Err(BenchError::Mismatch(format!(
            "{label}: kept {rows} rows, expected {expected}"
        )));
    }
    Ok(time)
}

/// Reads column `column` of `file`, leaving out its replaced rows as `leave_out` says;
/// the rows kept.
fn read_column(file: &LakeFile, column: usize, leave_out: LeaveOut) -> Result<usize, BenchError> {
    let opened =
        File::open(&file.path).map_err(BenchError::io(format!("opening {}", file.path)))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(opened)?;
    let mask = ProjectionMask::roots(builder.parquet_schema(), [column]);
    let mut builder = builder.with_projection(mask);
    if let LeaveOut::Selection(policy) = leave_out {
        let rows = file.record_count.unwrap_or(0);
        builder = builder
            .with_row_selection(selection(rows, &file.replaced_rows))
            .with_row_selection_policy(policy);
    }
    let (mut position, mut kept) = (0, 0);
    let mut replaced = file.replaced_rows.as_slice();
    for batch in builder.build()? {
        let batch = batch?;
        kept += match leave_out {
            LeaveOut::Filter => {
                let end = position + batch.num_rows() as u64;
                let here = replaced.partition_point(|&p| p < end);
                let mut keep = vec![true; batch.num_rows()];
                for &p in &replaced[..here] {
                    keep[(p - position) as usize] = false;
                }
                replaced = &replaced[here..];
                position = end;
                filter_record_batch(&batch, &BooleanArray::from(keep))?.num_rows()
            }
            LeaveOut::Nothing | LeaveOut::Selection(_) => batch.num_rows(),
        };
    }
    Ok(kept)
}

/// The selection of a file of `rows` rows, read as one row group, that leaves out
/// `deleted` (ascending): mink-lake's, as the lake scan builds it per row group.
fn selection(rows: u64, deleted: &[u64]) -> RowSelection {
    let every = rows as usize;
    match rows_per_group(&[rows], deleted).pop() {
        Some(GroupRows::Some(selection)) => selection,
        Some(GroupRows::None) => vec![RowSelector::skip(every)].into(),
        Some(GroupRows::All) | None => vec![RowSelector::select(every)].into(),
    }
}

fn seconds(time: Duration) -> String {
    format!("{:.3} s", time.as_secs_f64())
}

/// `files`, each with `per_mille` of its rows left out at random positions.
fn with_deleted(files: &[LakeFile], per_mille: usize) -> Vec<LakeFile> {
    let mut random = seeded(per_mille as u64);
    files
        .iter()
        .map(|file| {
            let rows = file.record_count.unwrap_or(0) as usize;
            let mut positions: Vec<u64> = sample(&mut random, rows, rows * per_mille / 1000)
                .into_iter()
                .map(|p| p as u64)
                .collect();
            positions.sort_unstable();
            LakeFile {
                replaced_rows: positions,
                ..file.clone()
            }
        })
        .collect()
}

/// The median time of planning and running `scan` over `files` (one split), checking
/// it reads every row not left out.
async fn scan_time(
    scan: &LakeScan<'_>,
    files: &[LakeFile],
    label: &str,
) -> Result<Duration, BenchError> {
    let split = LakeSplit {
        snapshot_id: None,
        files: files.to_vec(),
    };
    let expected: u64 = files
        .iter()
        .map(|f| f.record_count.unwrap_or(0) - f.replaced_rows.len() as u64)
        .sum();
    let context = SessionContext::new().task_ctx();
    let (rows, time) = timed_rounds(label, || async {
        let plan = scan.plan(&context, &[&split]).await?;
        Ok(row_count(&collect(plan, Arc::clone(&context)).await?))
    })
    .await?;
    if rows as u64 != expected {
        return Err(BenchError::Mismatch(format!(
            "{label}: read {rows} rows, expected {expected}"
        )));
    }
    Ok(time)
}
