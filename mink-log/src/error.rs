//! What a log tablet's reads and writes fail with.

/// Everything a log tablet can fail with.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// A read outside `[log_start, high_watermark]`.
    #[error(
        "offset {offset} of bucket {bucket} is out of range: the log holds [{log_start}, {high_watermark})"
    )]
    OffsetOutOfRange {
        /// The bucket read.
        bucket: String,
        /// The offset asked for.
        offset: i64,
        /// The first offset still retained.
        log_start: i64,
        /// The offset after the last durable row.
        high_watermark: i64,
    },
    /// A write that cannot be logged as given (refused by the log or by its changelog).
    #[error("{0}")]
    InvalidArgument(String),
    /// No space for the write (disk full, quota or file size limit): the write was rolled
    /// back, nothing acknowledged is lost.
    #[error("no space to write bucket {bucket} (disk full?): {source}")]
    DiskFull {
        /// The bucket being written.
        bucket: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Another I/O failure.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// Stored data that does not decode, or a changelog that does not match the log.
    #[error("corrupt log: {0}")]
    Corrupt(String),
    /// An Arrow codec failed.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// The tablet is closed, or the changelog's state (the KV store) is shutting down.
    #[error("{0} is shutting down")]
    ShuttingDown(String),
    /// The changelog hook failed to keep its state (the KV store) in line with the log.
    #[error(transparent)]
    Changelog(Box<dyn std::error::Error + Send + Sync>),
    /// The log store (`--log-store`) failed: the write was not acknowledged, and whether
    /// its WAL object landed is unknown when the message says so.
    #[error("log store: {0}")]
    Store(String),
    /// A newer writer of the log store (a node started later over the same store) took
    /// this one's place: this node acknowledges no more writes.
    #[error(
        "this node's log store writer (epoch {epoch}) was fenced by a newer writer: it acknowledges no more writes; restart it to take the store back"
    )]
    Fenced {
        /// This writer's epoch.
        epoch: u64,
    },
    /// The bucket was handed over to another node: this node writes it no more.
    #[error("bucket {bucket} was handed over to another node: this node writes it no more")]
    HandedOver {
        /// The bucket.
        bucket: String,
    },
}

/// Result with [`LogError`].
pub type Result<T, E = LogError> = std::result::Result<T, E>;

impl LogError {
    /// The same failure, for the next of several appends that failed together in one
    /// group commit (I/O errors are not `Clone`).
    pub fn for_another_waiter(&self) -> Self {
        match self {
            Self::DiskFull { bucket, source } => Self::DiskFull {
                bucket: bucket.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            Self::ShuttingDown(what) => Self::ShuttingDown(what.clone()),
            Self::Store(what) => Self::Store(what.clone()),
            Self::Fenced { epoch } => Self::Fenced { epoch: *epoch },
            Self::HandedOver { bucket } => Self::HandedOver {
                bucket: bucket.clone(),
            },
            other => Self::Io(std::io::Error::other(other.to_string())),
        }
    }
}
