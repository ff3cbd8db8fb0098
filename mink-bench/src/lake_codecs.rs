//! `mink-bench lake-codecs`: the codec of the lake's Parquet files, measured.
//!
//! ```text
//! cargo run --release -p mink-bench -- lake-codecs [--rows 10000000] [--files 4] [--dir DIR]
//! ```
//!
//! The rows of the `sql` suite (`id`, `event_time`, `name`, `price`, `quantity`) are
//! written as `--files` Parquet files with the lake writer's properties once per codec
//! every Iceberg reader takes (zstd at levels 1 and 3, snappy, LZ4_RAW, uncompressed),
//! and DataFusion answers the same queries over each set, strings read as `Utf8` as
//! mink's reader reads them: every column ([`QUERIES`]' first, the `sql` suite's
//! aggregate), one numeric column, and a filter. Each time is the median of
//! [`crate::harness::ROUNDS`]; the ratios are to zstd(1), the codec the lake used before
//! these figures chose LZ4_RAW (above 1: faster, or for the size, smaller).

use std::path::Path;
use std::time::{Duration, Instant};

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Int64Type;
use mink_lake::writer::writer_properties_with;
use parquet::basic::{Compression, ZstdLevel};

use crate::error::BenchError;
use crate::harness::{
    FileRowsArgs, blocking, megabytes, parquet_session, report, split, timed_rounds,
    write_parquet_with,
};

/// Arguments of `mink-bench lake-codecs`.
#[derive(Debug, clap::Args)]
pub(crate) struct LakeCodecsArgs {
    #[command(flatten)]
    files: FileRowsArgs,
}

/// The queries, by what they read: every column, one numeric column, a filter.
const QUERIES: [(&str, &str); 3] = [
    (
        "every column",
        "SELECT count(*), sum(quantity), max(name), max(event_time), sum(price) FROM t",
    ),
    ("count, sum(price)", "SELECT count(*), sum(price) FROM t"),
    (
        "quantity > 900",
        "SELECT count(*) FROM t WHERE quantity > 900",
    ),
];

/// What one codec's files cost: their size, the write, and each query.
struct CodecFigures {
    name: String,
    bytes: u64,
    write: Duration,
    queries: Vec<Duration>,
}

pub(crate) async fn run(args: LakeCodecsArgs) -> Result<(), BenchError> {
    let args = args.files;
    let (scratch, data) = args.start("lake-codecs", "files per codec")?;
    let parts = split(&data.batches, args.files);
    let codecs = [
        ("zstd(1)", Compression::ZSTD(ZstdLevel::default())),
        ("zstd(3)", Compression::ZSTD(ZstdLevel::try_new(3)?)),
        ("snappy", Compression::SNAPPY),
        ("lz4_raw", Compression::LZ4_RAW),
        ("uncompressed", Compression::UNCOMPRESSED),
    ];
    let mut figures = Vec::new();
    for (name, codec) in codecs {
        let dir = scratch.path.join(name);
        let (bytes, write) = write_files(&dir, &parts, codec).await?;
        let queries = query_times(&dir, name, args.rows).await?;
        figures.push(CodecFigures {
            name: name.to_string(),
            bytes,
            write,
            queries,
        });
    }
    print_figures(&figures);
    Ok(())
}

/// Writes each part as a file under `dir` with `codec`; their bytes and the write time.
async fn write_files(
    dir: &Path,
    parts: &[Vec<RecordBatch>],
    codec: Compression,
) -> Result<(u64, Duration), BenchError> {
    std::fs::create_dir_all(dir).map_err(BenchError::io(format!("creating {}", dir.display())))?;
    let start = Instant::now();
    let mut bytes = 0;
    for (file, part) in parts.iter().enumerate() {
        let path = dir.join(format!("part-{file}.parquet"));
        let part = part.clone();
        bytes += blocking(move || write_parquet_with(&path, &part, writer_properties_with(codec)))
            .await?;
    }
    Ok((bytes, start.elapsed()))
}

/// The median time of each of [`QUERIES`] over the files in `dir`; each must count
/// all `rows` rows (the filter, some of them).
async fn query_times(dir: &Path, codec: &str, rows: usize) -> Result<Vec<Duration>, BenchError> {
    let datafusion = parquet_session(dir, false).await?;
    let mut times = Vec::new();
    for (what, sql) in QUERIES {
        let label = format!("{codec}: {what}");
        let (answer, elapsed) = timed_rounds(&label, || async {
            Ok(datafusion.sql(sql).await?.collect().await?)
        })
        .await?;
        let count = answer
            .first()
            .and_then(|batch| batch.column(0).as_primitive_opt::<Int64Type>())
            .filter(|counts| counts.len() == 1)
            .map(|counts| counts.value(0));
        let expected = match what {
            "quantity > 900" => count.filter(|n| (1..rows as i64).contains(n)),
            _ => count.filter(|n| *n == rows as i64),
        };
        if expected.is_none() {
            return Err(BenchError::Mismatch(format!(
                "{label} counted {count:?} of {rows} rows"
            )));
        }
        times.push(elapsed);
    }
    Ok(times)
}

/// One line per codec and figure, each with its ratio to the first codec's.
fn print_figures(figures: &[CodecFigures]) {
    let Some(baseline) = figures.first() else {
        return;
    };
    let faster =
        |time: Duration, base: Duration| format!("{:.2}x", base.as_secs_f64() / time.as_secs_f64());
    for codec in figures {
        let smaller = format!("{:.2}x", baseline.bytes as f64 / codec.bytes as f64);
        report(
            &format!("{}: size", codec.name),
            megabytes(codec.bytes),
            &[smaller],
        );
        report(
            &format!("{}: write", codec.name),
            format!("{:.3} s", codec.write.as_secs_f64()),
            &[faster(codec.write, baseline.write)],
        );
        for (i, (what, _)) in QUERIES.iter().enumerate() {
            report(
                &format!("{}: {what}", codec.name),
                format!("{:.3} s", codec.queries[i].as_secs_f64()),
                &[faster(codec.queries[i], baseline.queries[i])],
            );
        }
    }
}
