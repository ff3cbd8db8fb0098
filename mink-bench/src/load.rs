//! `mink-bench load`: `mink load` of a Parquet file into a primary-key table, against the
//! same load into a log table.
//!
//! ```text
//! cargo build --release -p mink -p mink-bench
//! target/release/mink-bench load [--rows 2000000] [--buckets 4] [--shuffled] [--mink PATH]
//!     [--dir DIR] [--no-sync]
//! ```
//!
//! `--rows` rows of the `log` suite's schema written as one Parquet file: ids from 0 in
//! ascending order, as a table exported from a database usually is, or with `--shuffled`
//! in a random order (every key then lands below the keys already loaded, where the
//! primary-key writer must look each one up). A node is served on a loopback port in this
//! process; the real `mink` binary (`--mink`, default: the `mink` beside this program)
//! loads the file with `mink load --connect`, first into a log table `bench.load_log_N`,
//! then into a primary-key table `bench.load_pk_N` (primary key `id`), both of
//! `--buckets` buckets, created for round N of three and dropped after it. Each load is
//! timed from the command's start to its exit (the file read, the writes and every
//! acknowledgement), and the rows logged are checked. Each figure is the median of its
//! rounds; ratio: the median of the rounds' ratios of the primary-key load's rows/s over
//! the log table's, printed with each round's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use arrow::datatypes::SchemaRef;
use mink_core::table::{TableDescriptor, TablePath};
use rand::seq::SliceRandom;

use crate::data::{Data, GENERATED_SEED, seeded};
use crate::error::BenchError;
use crate::harness::{
    NodeArgs, ROUNDS, Running, blocking, check_logged, create_table, prepare_data, report_rounds,
    write_parquet,
};

#[derive(Debug, clap::Args)]
pub(crate) struct LoadArgs {
    /// Rows in the Parquet file.
    #[arg(long, default_value_t = 2_000_000)]
    rows: usize,
    /// Buckets of both tables.
    #[arg(long, default_value_t = 4)]
    buckets: u32,
    /// The ids in a random order (default: ascending).
    #[arg(long)]
    shuffled: bool,
    /// The `mink` binary (default: the `mink` beside this program).
    #[arg(long)]
    mink: Option<PathBuf>,
    #[command(flatten)]
    node: NodeArgs,
}

pub(crate) async fn run(args: LoadArgs) -> Result<(), BenchError> {
    if args.rows == 0 || args.buckets == 0 {
        return Err(BenchError::Usage(
            "--rows and --buckets must be positive".into(),
        ));
    }
    let mink = match args.mink.clone() {
        Some(path) => path,
        None => beside_this_program("mink")?,
    };
    if !mink.is_file() {
        return Err(BenchError::Usage(format!(
            "no mink binary at {}: build it (cargo build --release -p mink) or pass --mink",
            mink.display()
        )));
    }
    eprintln!("bench: generating {} rows", args.rows);
    let mut ids: Vec<i64> = (0..args.rows as i64).collect();
    if args.shuffled {
        ids.shuffle(&mut seeded(0x10ad));
    }
    let data = Data::with_ids(&ids, GENERATED_SEED)?;
    let (scratch, data, config) = prepare_data(&args.node, data)?;
    let path = scratch.path.join("rows.parquet");
    let file = ParquetFile {
        bytes: write_parquet(&path, &data.batches)?,
        rows: data.rows,
        path,
    };
    eprintln!(
        "mink-bench load: {} rows ({} bytes of Parquet), ids {}, {} buckets, {}",
        file.rows,
        file.bytes,
        if args.shuffled {
            "shuffled"
        } else {
            "ascending"
        },
        args.buckets,
        args.node.describe(&config, &scratch)
    );
    let running = Running::start(config).await?;
    let mut rounds = Vec::with_capacity(ROUNDS);
    for round in 1..=ROUNDS {
        rounds.push(load_round(&running, &mink, &args, &data.schema, &file, round).await?);
    }
    let labels = [
        "baseline mink load, log table",
        "mink load, primary-key table",
    ];
    report_rounds(labels, "log table", (file.rows, file.bytes), &rounds);
    running.stop().await?;
    Ok(())
}

/// One round: `mink load` of `file` into a log table `bench.load_log_{round}`, then into
/// a primary-key table `bench.load_pk_{round}`, both created for it and dropped after.
/// Returns the two loads' times.
async fn load_round(
    running: &Running,
    mink: &Path,
    args: &LoadArgs,
    schema: &SchemaRef,
    file: &ParquetFile,
    round: usize,
) -> Result<(Duration, Duration), BenchError> {
    let client = &running.client;
    let log = TablePath::new("bench", format!("load_log_{round}"));
    let pk = TablePath::new("bench", format!("load_pk_{round}"));
    let log = create_table(client, &log, args.buckets, schema, &[]).await?;
    let pk = create_table(client, &pk, args.buckets, schema, &["id"]).await?;
    let log_time = mink_load(running, mink, &log, file).await?;
    let pk_time = mink_load(running, mink, &pk, file).await?;
    client.drop_table_instance(&log).await?;
    client.drop_table_instance(&pk).await?;
    Ok((log_time, pk_time))
}

/// The file the loads read.
struct ParquetFile {
    path: PathBuf,
    bytes: u64,
    rows: usize,
}

/// Runs `mink load` of `file` into `table`, checks the rows logged, and returns how long
/// it took.
async fn mink_load(
    running: &Running,
    mink: &Path,
    table: &TableDescriptor,
    file: &ParquetFile,
) -> Result<Duration, BenchError> {
    let mut command = Command::new(mink);
    command
        .args(["load", "--connect", &running.address(), "--table"])
        .arg(table.path.to_string())
        .arg(&file.path);
    eprintln!("bench: mink load into {} ...", table.path);
    let started = Instant::now();
    let output = blocking(move || {
        command
            .output()
            .map_err(BenchError::io("running mink load"))
    })
    .await?;
    let elapsed = started.elapsed();
    if !output.status.success() {
        return Err(BenchError::Mismatch(format!(
            "mink load into {} failed: {}",
            table.path,
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    eprintln!("bench: {}", String::from_utf8_lossy(&output.stdout).trim());
    check_logged(&running.client, table, file.rows).await?;
    Ok(elapsed)
}

/// The path of `name` in this program's directory.
fn beside_this_program(name: &str) -> Result<PathBuf, BenchError> {
    let this = std::env::current_exe().map_err(BenchError::io("finding this program"))?;
    Ok(this.with_file_name(name))
}
