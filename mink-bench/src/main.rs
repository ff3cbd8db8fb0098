//! `mink-bench`: benchmark programs that print mink's figures as ratios against a baseline
//! measured in the same process, on the same disk, with the same data.
//!
//! ```text
//! cargo run --release -p mink-bench -- <suite> [flags]
//! ```
//!
//! The benchmarks are a binary of their own, not part of the production `mink` binary.
//! Each suite is a module, and all of them measure with one [`harness`] (timing, medians,
//! warm-up and paired latencies, quantiles, reporting, the scratch directory and the node
//! in this process) and write the rows of [`data`] (random, from fixed seeds):
//!
//! | suite | module | measures, against |
//! |---|---|---|
//! | `log` | [`log`] | append, scan and tail, against Arrow IPC files |
//! | `log-store` | [`log_store`] | the log on object storage (a `file://` store): write -> visible, PUTs per second, append, tail, catch-up read and open, against the local log |
//! | `kv` | [`kv`] | upsert, lookup and snapshot of primary-key tables, against log tables and Scan |
//! | `lake` | [`lake`] | tiering, union reads and freshness of log tables, against Parquet files |
//! | `lake-codecs` | [`lake_codecs`] | the lake files' codec: size and reads, against zstd(1) |
//! | `position-deletes` | [`position_deletes`] | the lake scan, and arrow-rs's reader by each way it can, leaving rows out by position, against the same reads leaving none out |
//! | `pk-lake` | [`pk_lake`] | the lake of primary-key tables, against Parquet files |
//! | `sql` | [`sql`] | SQL union reads and point queries, against DataFusion, DuckDB and the naive plan |
//! | `planning` | [`planning`] | a trivial union read after many tiering rounds, with lake upkeep off and on and on many buckets, against the first round, upkeep off and the fewest buckets |
//! | `table-changes` | [`table_changes`] | a round's changes, against a full lake read |
//! | `flight-sql` | [`flight_sql`] | the Flight SQL endpoint, against the same queries in process |
//! | `kafka` | [`kafka`] | Kafka clients consuming and producing, against Scan and ADBC ingest |
//! | `kafka-cluster` | [`kafka_cluster`] | produce -> consume latency through three brokers of a cluster, against one |
//!
//! # Every benchmark
//!
//! Results go to stdout, progress to stderr. The default directory is a fresh one under the
//! system temp directory, removed at the end; `--dir` must name an empty or new directory,
//! which is kept. `--no-sync` runs the node without fsync. A throughput ratio above 1
//! means mink is faster than its baseline; a latency ratio is mink's latency over the
//! baseline's, above 1 when mink is slower. 1 MB is 10^6 bytes.

mod cluster;
mod data;
mod error;
mod flight_sql;
mod harness;
mod ipc;
mod kafka;
mod kafka_cluster;
mod kv;
mod lake;
mod lake_codecs;
mod load;
mod log;
mod log_store;
mod metrics;
mod pk_lake;
mod planning;
mod position_deletes;
mod sql;
mod table_changes;
mod tpch;

use std::process::ExitCode;

use clap::Parser;

use crate::error::BenchError;

/// The allocator of the `mink` binary, so the figures are the ones users get.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mink-bench: mink's benchmarks, each figure with its ratio to a baseline measured in
/// the same run.
#[derive(Debug, Parser)]
#[command(name = "mink-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    bench: Bench,
}

/// The benchmarks.
#[derive(Debug, clap::Subcommand)]
enum Bench {
    /// The log: append, scan and tail, against Arrow IPC files on the same disk.
    Log(log::LogArgs),
    /// The log on object storage (`--log-store` on a `file://` store): write -> visible
    /// over ADBC, PUTs per second, append, tail, catch-up read and open, against the
    /// local log.
    LogStore(log_store::LogStoreArgs),
    /// Primary-key tables: upsert, lookup and snapshot, against log tables and Scan.
    Kv(kv::KvArgs),
    /// `mink load` of a Parquet file into a primary-key table, against the same load into
    /// a log table (runs the `mink` binary beside this program).
    Load(load::LoadArgs),
    /// The lake tier of log tables: tiering, union reads and freshness, against Parquet
    /// files and the configured freshness.
    Lake(lake::LakeArgs),
    /// The codec of the lake's Parquet files: size, write time and DataFusion's reads of
    /// the same rows with each codec every Iceberg reader takes, against zstd(1).
    LakeCodecs(lake_codecs::LakeCodecsArgs),
    /// The lake scan leaving rows out by position (a union read's replaced rows,
    /// Iceberg's position deletes), against the same scan leaving none out.
    PositionDeletes(position_deletes::PositionDeletesArgs),
    /// The lake of primary-key tables: tiering changed keys, reads with position deletes
    /// and union reads with a changed log range, against Parquet files.
    PkLake(pk_lake::PkLakeArgs),
    /// SQL over a primary-key table with a lake and a changed log range: the union read
    /// against DataFusion and DuckDB over Parquet and the naive plan; point queries.
    Sql(sql::SqlArgs),
    /// A trivial union read as tiering rounds accumulate, on few and many buckets:
    /// against its time after the first round and on the fewest buckets.
    Planning(planning::PlanningArgs),
    /// The incremental read of a primary-key table's lake: the changes of one tiering
    /// round against a full read of the lake as of it.
    TableChanges(table_changes::TableChangesArgs),
    /// The Flight SQL endpoint: one-row query latency and large-result throughput
    /// through arrow-flight's client and ADBC, against the same queries in process.
    FlightSql(flight_sql::FlightSqlArgs),
    /// Kafka clients on the log: consume against Scan, produce (acks=all) against ADBC
    /// ingest, and produce -> consume latency.
    Kafka(kafka::KafkaArgs),
    /// Kafka clients of a cluster's brokers: produce -> consume latency through three
    /// nodes against one.
    KafkaCluster(kafka_cluster::KafkaClusterArgs),
    /// What metrics cost: a scrape of a node with many buckets (time, size), and appends
    /// and their acknowledgements while it is scraped, against not.
    Metrics(metrics::MetricsArgs),
    /// A node's death in a cluster of three over etcd: how long until its buckets take
    /// writes again, against the lease.
    Cluster(cluster::ClusterArgs),
    /// The 22 TPC-H queries by the server alone and with 1, 2 and 4 workers in this
    /// process: the overhead of distribution (one worker distributes nothing).
    Tpch(tpch::TpchArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.bench)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the benchmark the arguments name.
async fn run(bench: Bench) -> Result<(), BenchError> {
    match bench {
        Bench::Log(args) => log::run(args).await,
        Bench::LogStore(args) => log_store::run(args).await,
        Bench::Kv(args) => kv::run(args).await,
        Bench::Load(args) => load::run(args).await,
        Bench::Lake(args) => lake::run(args).await,
        Bench::LakeCodecs(args) => lake_codecs::run(args).await,
        Bench::PositionDeletes(args) => position_deletes::run(args).await,
        Bench::PkLake(args) => pk_lake::run(args).await,
        Bench::Sql(args) => sql::run(args).await,
        Bench::Planning(args) => planning::run(args).await,
        Bench::TableChanges(args) => table_changes::run(args).await,
        Bench::FlightSql(args) => flight_sql::run(args).await,
        Bench::Kafka(args) => kafka::run(args).await,
        Bench::KafkaCluster(args) => kafka_cluster::run(args).await,
        Bench::Tpch(args) => tpch::run(args).await,
        Bench::Cluster(args) => cluster::run(args).await,
        Bench::Metrics(args) => metrics::run(args).await,
    }
}
