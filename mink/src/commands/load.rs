//! `mink load`: bulk-load a file into an existing table.
//!
//! ```text
//! mink load [--connect HOST:PORT | --data-dir DIR] --table T FILE
//!           [--format csv|parquet|json] [--batch-rows N]
//! ```
//!
//! The file is read in batches of `--batch-rows` rows, each batch is conformed to the
//! table's current schema and written to the table's buckets; the command returns once
//! every row is durable and prints one line:
//!
//! ```text
//! loaded 1000000 rows into default.events in 3.21s (311526 rows/s)
//! ```
//!
//! # Formats
//!
//! The format comes from `--format`, or else from the file's extension (`.csv`,
//! `.parquet`, `.json`, `.jsonl`, `.ndjson`).
//!
//! - **CSV** starts with a header row. Columns are matched to the table's by header name,
//!   in any order, and each value is parsed as the table column's type; an empty field is
//!   null.
//! - **Parquet** columns are matched by name; a column whose type differs from the table's
//!   is cast (`int` into a `bigint` column, ...), and a value the cast cannot represent is
//!   an error, never a silent null.
//! - **JSON** is newline-delimited: one object per row, keys matched to column names.
//!
//! In every format a column the file has and the table lacks is an error naming it: data is
//! never dropped silently. A column the table has and the file lacks is loaded as nulls
//! when it is nullable, and is an error when it is `NOT NULL`.
//!
//! # Pipeline
//!
//! ```text
//!   blocking thread                                 async task
//!  ┌───────────────────────────────┐  channel   ┌──────────────────────────────────────┐
//!  │ file ─ decode ─ conform to    │ ─────────> │ per-bucket queues ─ append (DoPut),  │
//!  │ the table schema ─ split into │  (bounded) │ at most one in flight per bucket;    │
//!  │ one part per bucket           │            │ acks count the loaded rows           │
//!  └───────────────────────────────┘            └──────────────────────────────────────┘
//! ```
//!
//! Decoding runs on a blocking thread so the runtime is never blocked on file I/O. The
//! writing is the client's [`TableWriter`]: a bucket has at most one append in flight,
//! parts that arrive while it is busy follow together, in file order, in its next one,
//! and different buckets are written concurrently. At most [`BATCHES_IN_FLIGHT`]
//! batches' worth of rows are queued or being written at once, which bounds memory.
//!
//! # Failures
//!
//! Rows already acknowledged stay loaded (there is no transaction), and the error says
//! how many:
//!
//! - When the file fails to decode or to conform (a CSV value that does not parse, a
//!   missing `NOT NULL` value), every row before the failing batch is still written, so
//!   the error can say that exactly the first N rows of the file were loaded.
//! - When a write fails, nothing more is sent; the writes in flight are awaited and the
//!   error counts the rows acknowledged.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::{FieldRef, Schema};
use arrow::error::ArrowError;
use indicatif::{ProgressBar, ProgressStyle};
use mink_client::{MinkClient, TableWriter, WriteFailed, WriteKind};
use mink_core::protocol::BucketId;
use mink_core::routing::split_by_bucket;
use mink_core::schema::normalize_batch;
use mink_core::table::{TableDescriptor, TablePath};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use tokio::sync::mpsc;

use crate::embedded::NodeArgs;
use crate::error::CliError;

/// Batches' worth of rows (`--batch-rows` each) that may be queued or being written at
/// once.
const BATCHES_IN_FLIGHT: usize = 4;
/// Decoded batches the reader may hold ready ahead of the writer.
const BATCHES_AHEAD: usize = 2;
/// Read buffer of CSV and JSON files.
const READ_BUFFER_BYTES: usize = 1 << 20;
/// Progress bar of a file measured in bytes (CSV, JSON).
const BYTES_TEMPLATE: &str =
    "{elapsed_precise} [{wide_bar}] {binary_bytes}/{binary_total_bytes} {msg}";
/// Progress bar of a file measured in rows (Parquet).
const ROWS_TEMPLATE: &str =
    "{elapsed_precise} [{wide_bar}] {human_pos}/{human_len} rows read {msg}";

/// Arguments of `mink load`.
#[derive(Debug, clap::Args)]
pub(crate) struct LoadArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// The table to load into (`table` or `database.table`); it must exist.
    #[arg(long)]
    table: String,
    /// The file to load.
    file: PathBuf,
    /// The file's format [default: from the extension: .csv, .parquet, .json, .jsonl,
    /// .ndjson].
    #[arg(long, value_enum)]
    format: Option<FileFormat>,
    /// Rows per batch read from the file and written to the table.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    batch_rows: u32,
}

/// The formats `mink load` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum FileFormat {
    /// Comma-separated values with a header row.
    Csv,
    /// Apache Parquet.
    Parquet,
    /// Newline-delimited JSON: one object per line.
    Json,
}

impl FileFormat {
    /// The format a file's extension names (case-insensitive).
    ///
    /// # Errors
    /// [`CliError::Usage`] when the extension names none of the formats.
    fn from_path(path: &Path) -> Result<Self, CliError> {
        let extension = path
            .extension()
            .and_then(OsStr::to_str)
            .map(str::to_ascii_lowercase);
        match extension.as_deref() {
            Some("csv") => Ok(Self::Csv),
            Some("parquet") => Ok(Self::Parquet),
            Some("json" | "jsonl" | "ndjson") => Ok(Self::Json),
            _ => Err(CliError::Usage(format!(
                "cannot tell the format of {} from its extension (.csv, .parquet, .json, \
                 .jsonl or .ndjson); pass --format csv|parquet|json",
                path.display()
            ))),
        }
    }
}

/// Runs `mink load`.
///
/// # Errors
/// A bad argument, a file that cannot be opened, read or decoded, a file whose columns do
/// not match the table, a missing table, or a failed write. Once rows have been written
/// the error says how many were loaded.
pub(crate) async fn run(args: LoadArgs) -> Result<(), CliError> {
    let format = match args.format {
        Some(format) => format,
        None => FileFormat::from_path(&args.file)?,
    };
    let table = TablePath::parse(&args.table)?;
    // Open the file before reaching the node: a missing file fails without starting one.
    let file = open(&args.file).await?;
    let connection = args.node.connect().await?;
    let job = Job {
        file_path: args.file,
        format,
        batch_rows: args.batch_rows as usize,
    };
    let loaded = load(&connection.client, &table, file, job).await;
    let closed = connection.close().await;
    // Every row is durable once acknowledged: report the load even if closing fails.
    println!("{}", loaded?);
    closed
}

/// What to load, besides the table.
#[derive(Debug)]
struct Job {
    file_path: PathBuf,
    format: FileFormat,
    batch_rows: usize,
}

/// Opens the input file without blocking the runtime; a directory is refused.
async fn open(path: &Path) -> Result<File, CliError> {
    let context = || format!("opening {}", path.display());
    let file = tokio::fs::File::open(path)
        .await
        .map_err(CliError::io(context()))?;
    let metadata = file.metadata().await.map_err(CliError::io(context()))?;
    if metadata.is_dir() {
        return Err(CliError::Usage(format!(
            "{} is a directory, not a file",
            path.display()
        )));
    }
    Ok(file.into_std().await)
}

/// Loads the file into the table; returns the summary line.
async fn load(
    client: &MinkClient,
    path: &TablePath,
    file: File,
    job: Job,
) -> Result<String, CliError> {
    let table = Arc::new(client.describe_table(path).await?);
    let bar = ProgressBar::new(0);
    let started = Instant::now();
    let opened = {
        let table = Arc::clone(&table);
        let bar = bar.clone();
        let file_path = job.file_path.clone();
        tokio::task::spawn_blocking(move || {
            open_source(file, &file_path, job.format, &table, job.batch_rows, &bar)
        })
        .await
    };
    let (batches, count_rows) = match opened {
        Ok(Ok(opened)) => opened,
        Ok(Err(error)) => {
            bar.finish_and_clear();
            return Err(error);
        }
        Err(error) => {
            bar.finish_and_clear();
            let file = job.file_path.display();
            return Err(CliError::Usage(format!("opening {file} failed: {error}")));
        }
    };
    let (sender, mut receiver) = mpsc::channel(BATCHES_AHEAD);
    let reader = {
        let table = Arc::clone(&table);
        let bar = bar.clone();
        tokio::task::spawn_blocking(move || pump(batches, &table, count_rows, &bar, &sender))
    };
    let max_rows = BATCHES_IN_FLIGHT * job.batch_rows;
    let mut writer = TableWriter::new(client, Arc::clone(&table), WriteKind::Write, max_rows);
    let mut input_failure = None;
    while let Some(routed) = receiver.recv().await {
        match routed {
            // A writer that refuses more has failed: `finish` says why.
            Ok(routed) => match writer.write_routed(routed.parts).await {
                Ok(()) => {
                    let written = writer.acknowledged_rows();
                    bar.set_message(progress_message(written, started.elapsed()));
                }
                Err(_) => break,
            },
            Err(error) => {
                input_failure = Some(error);
                break;
            }
        }
    }
    // The receiver is gone: a reader still blocked on a full channel stops now.
    drop(receiver);
    let written = writer.finish().await;
    let read = reader.await;
    bar.finish_and_clear();
    let loaded_rows = match &written {
        Ok(rows) => *rows,
        Err(failed) => failed.acknowledged_rows,
    };
    let failure = match (written, input_failure, read) {
        (Err(failed), ..) => Some(Failure::Write(failed)),
        (Ok(_), Some(error), _) => Some(Failure::Input(error)),
        (Ok(_), None, Ok(())) => None,
        (Ok(_), None, Err(e)) => Some(Failure::Input(CliError::Usage(format!(
            "the reader failed: {e}"
        )))),
    };
    match failure {
        None => Ok(summary_line(loaded_rows, &table.path, started.elapsed())),
        Some(failure) => Err(CliError::Usage(format!(
            "cannot load {} into {}: {}",
            job.file_path.display(),
            table.path,
            failure.describe(loaded_rows)
        ))),
    }
}

/// The batches of an input file, as its decoder yields them.
type FileBatches = Box<dyn Iterator<Item = Result<RecordBatch, ArrowError>> + Send>;

/// Opens the file's decoder, checks the file's columns against the table's and sizes the
/// progress bar. Returns the batches and whether progress is counted in rows (else the
/// decoder counts bytes read).
fn open_source(
    mut file: File,
    file_path: &Path,
    format: FileFormat,
    table: &TableDescriptor,
    batch_rows: usize,
    bar: &ProgressBar,
) -> Result<(FileBatches, bool), CliError> {
    let display = file_path.display();
    let mismatch = |message: String| {
        CliError::Usage(format!(
            "{display} does not match table {}: {message}",
            table.path
        ))
    };
    let unreadable =
        |e: &dyn std::fmt::Display| CliError::Usage(format!("cannot read {display}: {e}"));
    match format {
        FileFormat::Csv => {
            let (header, _) = arrow::csv::reader::Format::default()
                .with_header(true)
                .infer_schema(&mut file, Some(0))
                .map_err(|e| unreadable(&e))?;
            if header.fields().is_empty() {
                return Err(CliError::Usage(format!(
                    "{display} is empty: a CSV file starts with a header row"
                )));
            }
            let names: Vec<&str> = header.fields().iter().map(|f| f.name().as_str()).collect();
            let schema = csv_schema(&names, table.schema()).map_err(mismatch)?;
            file.seek(SeekFrom::Start(0))
                .map_err(CliError::io(format!("reading {display}")))?;
            start_bytes(bar, &file)?;
            let input = BufReader::with_capacity(READ_BUFFER_BYTES, Counted::new(file, bar));
            let reader = arrow::csv::ReaderBuilder::new(Arc::new(schema))
                .with_header(true)
                .with_batch_size(batch_rows)
                .build_buffered(input)
                .map_err(|e| unreadable(&e))?;
            Ok((Box::new(reader), false))
        }
        FileFormat::Json => {
            start_bytes(bar, &file)?;
            let input = BufReader::with_capacity(READ_BUFFER_BYTES, Counted::new(file, bar));
            let fields: Vec<FieldRef> = table.schema().fields().iter().map(decodable).collect();
            let reader = arrow::json::ReaderBuilder::new(Arc::new(Schema::new(fields)))
                .with_batch_size(batch_rows)
                // A key the table has no column for is an error, not dropped.
                .with_strict_mode(true)
                .build(input)
                .map_err(|e| unreadable(&e))?;
            Ok((Box::new(reader), false))
        }
        FileFormat::Parquet => {
            let builder =
                ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| unreadable(&e))?;
            let names: Vec<&str> = builder
                .schema()
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect();
            check_columns(&names, table.schema()).map_err(mismatch)?;
            let rows = builder.metadata().file_metadata().num_rows();
            bar.set_style(bar_style(ROWS_TEMPLATE));
            bar.set_length(u64::try_from(rows).unwrap_or(0));
            let reader = builder
                .with_batch_size(batch_rows)
                .build()
                .map_err(|e| unreadable(&e))?;
            Ok((Box::new(reader), true))
        }
    }
}

/// Sizes the progress bar by the file's bytes.
fn start_bytes(bar: &ProgressBar, file: &File) -> Result<(), CliError> {
    let metadata = file
        .metadata()
        .map_err(CliError::io("reading the file's size"))?;
    bar.set_style(bar_style(BYTES_TEMPLATE));
    bar.set_length(metadata.len());
    Ok(())
}

/// A progress-bar style from one of the templates above.
fn bar_style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// A reader that advances the progress bar by the bytes read through it.
#[derive(Debug)]
struct Counted<R> {
    inner: R,
    bar: ProgressBar,
}

impl<R> Counted<R> {
    fn new(inner: R, bar: &ProgressBar) -> Self {
        Self {
            inner,
            bar: bar.clone(),
        }
    }
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.bar.inc(read as u64);
        Ok(read)
    }
}

/// One batch of the file, conformed to the table schema and split by bucket.
#[derive(Debug)]
struct Routed {
    rows: usize,
    parts: Vec<(BucketId, RecordBatch)>,
}

/// The reader thread: decodes, conforms and splits every batch of the file and sends it
/// to the writer. Stops after the first error (which it sends) or once the writer is gone.
fn pump(
    batches: FileBatches,
    table: &TableDescriptor,
    count_rows: bool,
    bar: &ProgressBar,
    sender: &mpsc::Sender<Result<Routed, CliError>>,
) {
    let mut rows_read = 0usize;
    let mut round_robin = 0u32;
    for batch in batches {
        round_robin = round_robin.wrapping_add(1);
        let routed = match batch {
            Ok(batch) => {
                let rows = batch.num_rows();
                let routed = route(&batch, table, round_robin).map_err(|e| {
                    CliError::Usage(format!("rows {}-{}: {e}", rows_read + 1, rows_read + rows))
                });
                rows_read += rows;
                if count_rows {
                    bar.inc(rows as u64);
                }
                routed
            }
            Err(e) => Err(CliError::Usage(format!(
                "reading the batch from row {}: {e}",
                rows_read + 1
            ))),
        };
        let failed = routed.is_err();
        if routed.as_ref().is_ok_and(|r| r.rows == 0) {
            continue;
        }
        if sender.blocking_send(routed).is_err() || failed {
            return;
        }
    }
}

/// Conforms a decoded batch to the table's schema and splits it by bucket.
fn route(
    batch: &RecordBatch,
    table: &TableDescriptor,
    round_robin: u32,
) -> Result<Routed, CliError> {
    let conformed = normalize_batch(batch, table.schema())?;
    let parts = split_by_bucket(table, &conformed, round_robin)?;
    Ok(Routed {
        rows: conformed.num_rows(),
        parts,
    })
}

/// Why a load stopped early.
#[derive(Debug)]
enum Failure {
    /// Reading the file failed; every row before the failing batch was written.
    Input(CliError),
    /// A write failed.
    Write(WriteFailed),
}

impl Failure {
    /// The error message, with what was loaded before the failure.
    fn describe(&self, loaded_rows: u64) -> String {
        match self {
            Self::Input(error) if loaded_rows == 0 => format!("{error}; nothing was loaded"),
            Self::Input(error) => {
                format!("{error}; the first {loaded_rows} rows of the file were loaded")
            }
            Self::Write(failed) => format!(
                "{}; {loaded_rows} rows were loaded before the failure (the {} rows of the \
                 failed write may be partly loaded)",
                failed.error, failed.failed_rows
            ),
        }
    }
}

/// The table schema in the CSV header's column order, as the decoder reads it (see
/// [`decodable`]).
///
/// # Errors
/// See [`check_columns`].
fn csv_schema(header: &[&str], table: &Schema) -> Result<Schema, String> {
    check_columns(header, table)?;
    let fields: Vec<FieldRef> = header
        .iter()
        .filter_map(|name| table.fields().find(name).map(|(_, field)| decodable(field)))
        .collect();
    Ok(Schema::new(fields))
}

/// The field a text decoder (CSV, JSON) reads a table column as: nullable, so a missing
/// value decodes to null and [`normalize_batch`] then refuses a null in a `NOT NULL`
/// column with an error naming the column (the decoders' own errors for it are obscure).
fn decodable(field: &FieldRef) -> FieldRef {
    Arc::new(field.as_ref().clone().with_nullable(true))
}

/// Checks the columns of a file against the table's schema.
///
/// # Errors
/// A message naming the columns when the file has a column the table lacks (it would be
/// dropped), names a column twice, or lacks a `NOT NULL` column of the table.
fn check_columns(file_columns: &[&str], table: &Schema) -> Result<(), String> {
    let quoted = |names: &[&str]| {
        names
            .iter()
            .map(|name| format!("'{name}'"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let extra: Vec<&str> = file_columns
        .iter()
        .copied()
        .filter(|name| table.field_with_name(name).is_err())
        .collect();
    if !extra.is_empty() {
        let columns: Vec<&str> = table.fields().iter().map(|f| f.name().as_str()).collect();
        return Err(format!(
            "the table has no column {} (its columns: {})",
            quoted(&extra),
            columns.join(", ")
        ));
    }
    let mut seen = BTreeSet::new();
    let repeated: Vec<&str> = file_columns
        .iter()
        .copied()
        .filter(|name| !seen.insert(*name))
        .collect();
    if !repeated.is_empty() {
        return Err(format!(
            "the file names column {} more than once",
            quoted(&repeated)
        ));
    }
    let missing: Vec<&str> = table
        .fields()
        .iter()
        .filter(|field| !field.is_nullable() && !file_columns.contains(&field.name().as_str()))
        .map(|field| field.name().as_str())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "the file has no column {}, which the table requires (NOT NULL)",
            quoted(&missing)
        ));
    }
    Ok(())
}

/// Rows per second; zero when no time has passed.
fn rows_per_second(rows: u64, elapsed: Duration) -> f64 {
    let seconds = elapsed.as_secs_f64();
    if seconds > 0.0 {
        rows as f64 / seconds
    } else {
        0.0
    }
}

/// The progress bar's message.
fn progress_message(rows: u64, elapsed: Duration) -> String {
    format!(
        "{rows} rows loaded ({:.0} rows/s)",
        rows_per_second(rows, elapsed)
    )
}

/// The line printed once the load is done.
fn summary_line(rows: u64, table: &TablePath, elapsed: Duration) -> String {
    format!(
        "loaded {rows} rows into {table} in {:.2}s ({:.0} rows/s)",
        elapsed.as_secs_f64(),
        rows_per_second(rows, elapsed)
    )
}

#[cfg(test)]
mod tests;
