//! `mink`: run a node, query it, read a bucket, load a file.
//!
//! ```text
//! mink server [--data-dir DIR] [--listen 127.0.0.1:9123] [--sql-listen 127.0.0.1:50051] [--demo]
//! mink sql [--connect HOST:PORT | --data-dir DIR] [-e SQL]... [-f FILE] [--format table|csv|json]
//! mink read --connect HOST:PORT --table T [--bucket N] --mode union|log|lake|snapshot|tail
//!           [--from OFFSET] [--columns a,b]
//! mink load [--connect HOST:PORT | --data-dir DIR] --table T FILE
//! ```
//!
//! Each subcommand is a module of [`commands`]; [`repl`] is `mink sql`'s interactive loop,
//! [`output`] prints batches as tables, CSV or JSON, and [`embedded`] runs a node inside
//! the command over a data directory. The benchmarks are a binary of their own
//! (`mink-bench`, crate `mink-bench`).

#![cfg_attr(
    test,
    expect(
        unused_crate_dependencies,
        reason = "dev-dependencies serve the integration tests, not the unit tests"
    )
)]

mod commands;
mod embedded;
mod error;
mod output;
mod repl;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mink_sql::session::limits::STATEMENT_STACK_BYTES;

use crate::commands::{load, read, server, sql, worker};
use crate::error::CliError;

/// mink: a streaming table store with a lakehouse tier.
#[derive(Debug, Parser)]
#[command(name = "mink", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines on stderr are written: `text` for people, `json` (one object a
    /// line, with its fields) for log shippers. Levels and targets from RUST_LOG (default:
    /// `info`, with dependencies' routine messages below it).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The log filter without RUST_LOG: mink's events at INFO, a dependency's only from WARN
/// where it reports routine work at INFO (lsm-tree's recovery and ingestion on every
/// start).
const DEFAULT_LOG_FILTER: &str = "info,lsm_tree=warn";

/// Logs to stderr in `format`, filtered by RUST_LOG or [`DEFAULT_LOG_FILTER`].
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a node: every bucket of every table, served over Arrow Flight.
    Server(Box<server::ServerArgs>),
    /// Read one bucket (or every bucket) of a table.
    Read(read::ReadArgs),
    /// Bulk-load a CSV, Parquet or newline-delimited JSON file into a table.
    Load(load::LoadArgs),
    /// Run SQL against a node (or a Flight SQL endpoint): queries, DML, DDL, CALL.
    Sql(sql::SqlArgs),
    /// Run a worker of a server's distributed statements (`mink server --sql-workers`).
    Worker(worker::WorkerArgs),
}

/// mimalloc, as DataFusion's own CLI: the union read and every other query allocate and
/// free large Arrow buffers at a high rate, which glibc's allocator serves by mapping
/// fresh pages again and again (`docs/benchmarks.md`: 1.3x to 1.9x faster queries).
/// Built without transparent huge pages: the kernel would zero 2 MiB on each first touch
/// of a region mimalloc maps again (`docs/running.md`, Memory: writes 1.5x to 2.5x faster).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    // Statements are planned and run on the runtime's threads: their stacks hold the
    // deepest statement a client may send (mink_sql::session::limits).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(STATEMENT_STACK_BYTES)
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result: Result<(), CliError> = runtime.block_on(async {
        match cli.command {
            Command::Server(args) => server::run(*args).await,
            Command::Read(args) => read::run(args).await,
            Command::Load(args) => load::run(args).await,
            Command::Sql(args) => sql::run(args).await,
            Command::Worker(args) => worker::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
