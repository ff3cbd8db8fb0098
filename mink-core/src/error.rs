//! The one error type of mink-core.

use arrow::error::ArrowError;

/// Everything that can be wrong with a table definition, a request or a batch, judged
/// without I/O. Each variant maps to one gRPC code at the wire.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// A table definition or option that cannot be accepted.
    #[error("invalid table definition: {0}")]
    InvalidTable(String),
    /// A request that names something impossible (a column index out of range, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A wire message that does not decode.
    #[error("malformed {what}: {source}")]
    Malformed {
        /// The kind of message that failed to decode.
        what: &'static str,
        /// The decoder's complaint.
        source: prost::DecodeError,
    },
    /// A batch whose schema does not match the table's.
    #[error("schema mismatch: {0}")]
    SchemaMismatch(String),
    /// Bucketing failed for the given rows.
    #[error(transparent)]
    Bucket(#[from] crate::bucket::BucketError),
    /// A log read that found no batch at `at`, below the `to` its range was planned to.
    #[error("the log of {log} ends at offset {at}, before the end of the range read ({to})")]
    LogEndsEarly {
        /// The log read: its bucket, or where it is.
        log: String,
        /// Where the log ended.
        at: i64,
        /// Where the range ends.
        to: i64,
    },
    /// An Arrow kernel failed.
    #[error(transparent)]
    Arrow(#[from] ArrowError),
}

/// Result with [`CoreError`].
pub type Result<T, E = CoreError> = std::result::Result<T, E>;
