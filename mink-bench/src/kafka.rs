//! `mink-bench kafka`: Kafka clients on the log, against mink's own clients.
//!
//! ```text
//! cargo run --release -p mink-bench -- kafka [--rows 1000000] [--value-bytes 100]
//!     [--pings 500] [--dir DIR] [--no-sync]
//! ```
//!
//! An embedded node is served on loopback ports with its Flight SQL endpoint and its
//! Kafka listener beside it (plaintext, no authentication), over log tables `(key
//! VARCHAR, value VARCHAR)` of 4 buckets. The Kafka side is confluent-kafka (librdkafka)
//! from Python (`MINK_PYTHON`, else `python3`, with `pip install confluent-kafka
//! adbc-driver-flightsql pyarrow`), timed in the Python process:
//!
//! 1. **Consume**: `--rows` rows of `--value-bytes` bytes, written by the Rust client, read
//!    from the beginning by a consumer assigned every partition, and by kcat when it is
//!    installed (librdkafka without Python). Baseline: the same rows read by Scan with
//!    mink's Rust client in this process. Ratio: Kafka's rate over Scan's.
//! 2. **Produce**: the same number of records produced with `acks=all` (every record
//!    durable before its acknowledgement). Baseline: the same rows written by ADBC's
//!    `adbc_ingest` through Flight SQL. Ratio: Kafka's rate over ADBC's.
//! 3. **Produce → consume latency**, p50 and p99 of `--pings` records, each produced alone
//!    (`acks=all`, flushed) and timed until a consumer waiting at the end of the partition
//!    has it.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use mink_core::table::TablePath;
use mink_lake::storage::LakeStorage;
use object_store::local::LocalFileSystem;
use tokio::net::TcpListener;

use crate::error::BenchError;
use crate::harness::{
    Latency, NodeArgs, Running, Scratch, Throughput, create_table, measure, python, report,
};

/// Arguments of `mink-bench kafka`.
#[derive(Debug, clap::Args)]
pub(crate) struct KafkaArgs {
    /// Rows consumed and produced.
    #[arg(long, default_value_t = 1_000_000)]
    rows: usize,
    /// Bytes of each row's value.
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// Records whose produce -> consume latency is measured.
    #[arg(long, default_value_t = 500)]
    pings: usize,
    #[command(flatten)]
    node: NodeArgs,
}

/// Buckets (Kafka partitions) of each table.
const BUCKETS: u32 = 4;
/// Rows per batch the Rust client writes.
const WRITE_BATCH: usize = 10_000;

pub(crate) async fn run(args: KafkaArgs) -> Result<(), BenchError> {
    if args.rows == 0 || args.pings == 0 {
        return Err(BenchError::Usage(
            "--rows and --pings must be positive".into(),
        ));
    }
    let scratch = Scratch::new(args.node.dir.clone())?;
    let config = args.node.config(&scratch, 64 << 20);
    println!(
        "mink-bench kafka: {} rows of {} bytes in {BUCKETS} partitions, {} pings, {}",
        args.rows,
        args.value_bytes,
        args.pings,
        args.node.describe(&config, &scratch)
    );
    let running = Running::start(config).await?;
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, true),
        Field::new("value", DataType::Utf8, true),
    ]));
    let mut tables = Vec::new();
    for name in ["stream", "produced", "ingested"] {
        let path = TablePath::new("bench", name);
        tables.push(create_table(&running.client, &path, BUCKETS, &schema, &[]).await?);
    }
    let value = "x".repeat(args.value_bytes);
    for start in (0..args.rows).step_by(WRITE_BATCH) {
        let rows = WRITE_BATCH.min(args.rows - start);
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(StringArray::new_null(rows)),
                Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                    &value, rows,
                ))),
            ],
        )?;
        running.client.write(&tables[0], &batch).await?;
    }
    let row_bytes = args.value_bytes as u64;
    let (rows, elapsed) = measure(
        "Scan of every bucket, Rust client",
        scan_all(&running, &tables[0].path),
    )
    .await?;
    let scan = Throughput::new(rows, rows as u64 * row_bytes, elapsed);

    let endpoint = running
        .serve_flight_sql(LakeStorage::new(Arc::new(LocalFileSystem::new()), ""))
        .await?;
    let kafka = mink_kafka::serve(
        Arc::clone(&running.node),
        TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(BenchError::io("binding a loopback port"))?,
        mink_kafka::KafkaOptions::default(),
    )
    .await
    .map_err(|e| BenchError::Usage(e.to_string()))?;
    eprintln!("bench: confluent-kafka consume, produce, ADBC ingest and latency ...");
    let script_args = vec![
        kafka.addr().to_string(),
        format!("grpc://{}", endpoint.addr()),
        args.rows.to_string(),
        args.value_bytes.to_string(),
        args.pings.to_string(),
    ];
    let figures = python(
        include_str!("kafka_clients.py"),
        &script_args,
        "confluent-kafka adbc-driver-flightsql pyarrow",
    )
    .map_err(BenchError::Usage)?;
    let timed = |what: &str| -> Result<Throughput, BenchError> {
        let line = figures
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{what} ")))
            .ok_or_else(|| {
                BenchError::Usage(format!("no '{what}' in the script's output: {figures}"))
            })?;
        let (rows, seconds) = line
            .split_once(' ')
            .and_then(|(rows, seconds)| {
                Some((rows.parse::<usize>().ok()?, seconds.parse::<f64>().ok()?))
            })
            .ok_or_else(|| BenchError::Usage(format!("a bad '{what}' line: {line}")))?;
        Ok(Throughput::new(
            rows,
            rows as u64 * row_bytes,
            Duration::from_secs_f64(seconds),
        ))
    };
    let consume = timed("consume")?;
    let kcat = timed("kcat").ok();
    let produce = timed("produce")?;
    let ingest = timed("ingest")?;
    let latency = Latency::new(
        figures
            .lines()
            .filter_map(|line| line.strip_prefix("latency ")?.parse().ok())
            .collect(),
    );

    println!("Consume every row from the beginning:");
    report("  Scan (Rust client)", scan, &[]);
    report(
        "  Kafka consumer (confluent-kafka)",
        consume,
        &[format!("{:.2}", consume.ratio_to(&scan))],
    );
    match kcat {
        Some(kcat) => report(
            "  kcat (librdkafka, no Python)",
            kcat,
            &[format!("{:.2}", kcat.ratio_to(&scan))],
        ),
        None => println!("  kcat: skipped (not installed)"),
    }
    println!("Write {} rows, durable before acknowledged:", args.rows);
    report("  adbc_ingest (Flight SQL)", ingest, &[]);
    report(
        "  Kafka producer, acks=all (confluent-kafka)",
        produce,
        &[format!("{:.2}", produce.ratio_to(&ingest))],
    );
    println!("Produce -> consume latency of one record (acks=all; the consumer waits at the end):");
    report("  Kafka", latency, &[]);
    kafka.shutdown().await;
    endpoint.shutdown().await?;
    running.stop().await?;
    Ok(())
}

/// Reads every bucket of `path` from offset 0 up to its high watermark; the rows.
async fn scan_all(running: &Running, path: &TablePath) -> Result<usize, BenchError> {
    let mut rows = 0;
    for status in running.client.list_buckets(path).await? {
        let bucket = status.bucket.expect("a bucket id");
        let mut offset = status.log_start;
        while offset < status.high_watermark {
            let answer = running.client.scan(&bucket, offset, 0, &[]).await?;
            rows += answer.num_rows();
            offset = answer.next_offset;
        }
    }
    Ok(rows)
}
