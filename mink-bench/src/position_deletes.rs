//! `mink-bench position-deletes`: what leaving rows out by position costs the lake scan.
//!
//! ```text
//! cargo run --release -p mink-bench -- position-deletes [--rows 10000000] [--files 4] [--dir DIR]
//! ```
//!
//! A union read of a primary-key table leaves out the lake rows its tail replaces by
//! position, as Iceberg's position deletes are (`mink_scan::lake_scan`: a row selection
//! per row group). The rows of the `sql` suite are written as `--files` Parquet files
//! with the lake writer's properties, and mink's lake scan (`LakeScan`, DataFusion's
//! Parquet scan) reads them with 0.1%, 1% and 10% of each file's rows left out, at
//! random positions, against the same scan leaving out none: one numeric column (what
//! `count(*), sum(price)` reads) and every column. Each time is the median of
//! [`crate::harness::ROUNDS`], planning included; a ratio below 1 (the scan's time
//! leaving none out over its time leaving some out) is the price of the positions.

use std::sync::Arc;
use std::time::Duration;

use datafusion::physical_plan::collect;
use datafusion::prelude::SessionContext;
use mink_lake::reader::{LakeFile, LakeSplit};
use mink_lake::storage::LakeStorage;
use mink_scan::lake_scan::LakeScan;
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
    let price = vec![data.schema.index_of("price")?];
    for (what, projection) in [("one column", price), ("every column", every_column)] {
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
    Ok(())
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
