//! The errors a `mink` command reports before exiting with a failure.

use mink_client::ClientError;
use mink_node::NodeError;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    /// The server answered with an error, or could not be reached.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The embedded node failed.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// The address given could not be reached, or did not answer as a mink node or a
    /// Flight SQL endpoint.
    #[error("{address}: {reason}")]
    Endpoint {
        /// The address dialled.
        address: String,
        /// What went wrong, with the underlying error's whole chain.
        reason: String,
    },
    /// A bad argument or input.
    #[error("{0}")]
    Usage(String),
    /// Reading or writing a local file failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// An Arrow error (decoding an input file, printing).
    #[error(transparent)]
    Arrow(#[from] arrow::error::ArrowError),
    /// A Parquet error (decoding an input file).
    #[error(transparent)]
    Parquet(#[from] parquet::errors::ParquetError),
    /// A model-level error (a bad table name).
    #[error(transparent)]
    Core(#[from] mink_core::CoreError),
    /// A SQL statement failed (planning or execution).
    #[error("{0}")]
    Sql(#[from] datafusion::error::DataFusionError),
}

impl CliError {
    /// An I/O error with what was being done.
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Self::Io { context, source }
    }
}
