//! The errors a benchmark reports before `mink-bench` exits with a failure.

use mink_client::ClientError;
use mink_node::NodeError;

/// Why a benchmark failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BenchError {
    /// The node answered with an error, or could not be reached.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The node in this process failed.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// A bad argument.
    #[error("{0}")]
    Usage(String),
    /// An answer is not what the benchmark expected (a row count, another engine's
    /// answer), so its figure would mean nothing.
    #[error("{0}")]
    Mismatch(String),
    /// Reading or writing a local file failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A benchmark task panicked or was cancelled.
    #[error("a benchmark task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// An Arrow error (building or encoding a batch).
    #[error(transparent)]
    Arrow(#[from] arrow::error::ArrowError),
    /// A Parquet error (writing or reading a baseline file).
    #[error(transparent)]
    Parquet(#[from] parquet::errors::ParquetError),
    /// A model-level error (a bad table descriptor).
    #[error(transparent)]
    Core(#[from] mink_core::CoreError),
    /// A SQL statement failed (planning or execution).
    #[error("{0}")]
    Sql(#[from] datafusion::error::DataFusionError),
    /// The Flight SQL endpoint could not start or stop.
    #[error(transparent)]
    FlightSql(#[from] mink_flight_sql::ServeError),
    /// The Flight SQL endpoint could not be reached.
    #[error("connecting to Flight SQL: {0}")]
    Connect(String),
}

impl BenchError {
    /// An I/O error with what was being done.
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Self::Io { context, source }
    }
}
