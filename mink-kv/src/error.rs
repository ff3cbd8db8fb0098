//! What the KV store's reads and updates fail with.

use mink_core::CoreError;
use mink_log::LogError;

/// Everything the KV store can fail with.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// fjall failed, a job of the store's threads panicked, or the store fell behind its
    /// log (the tablet is fenced until a restart).
    #[error("KV store: {0}")]
    Store(String),
    /// A write the store cannot keep (a key too long, an append to a primary-key table).
    #[error("{0}")]
    InvalidArgument(String),
    /// Stored data that does not decode, or a changelog batch without its change vector.
    #[error("corrupt log: {0}")]
    Corrupt(String),
    /// The store's threads are gone.
    #[error("{0} is shutting down")]
    ShuttingDown(String),
    /// An I/O failure (creating the store's directory, starting its threads).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A key or row that does not encode or decode.
    #[error(transparent)]
    Core(#[from] CoreError),
    /// An Arrow kernel failed.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// The log store failed a KV checkpoint's upload or read.
    #[error(transparent)]
    LogStore(Box<LogError>),
}

impl From<LogError> for KvError {
    fn from(error: LogError) -> Self {
        Self::LogStore(Box::new(error))
    }
}

/// Result with [`KvError`].
pub type Result<T, E = KvError> = std::result::Result<T, E>;

impl KvError {
    /// The same failure, for another waiter of one update (I/O errors are not `Clone`).
    pub(crate) fn for_another_waiter(&self) -> Self {
        match self {
            Self::ShuttingDown(what) => Self::ShuttingDown(what.clone()),
            other => Self::Io(std::io::Error::other(other.to_string())),
        }
    }
}

/// A failure of the store as the log's changelog hook ([`mink_log::Changelog`]): a write
/// the store refuses is refused by the log as it would refuse it itself; a failure to keep
/// the store in line with the log is the hook's failure.
impl From<KvError> for LogError {
    fn from(error: KvError) -> Self {
        match error {
            KvError::InvalidArgument(message) => Self::InvalidArgument(message),
            KvError::Core(CoreError::SchemaMismatch(message)) => Self::InvalidArgument(message),
            KvError::Core(CoreError::Arrow(error)) | KvError::Arrow(error) => Self::Arrow(error),
            KvError::Core(
                other @ (CoreError::InvalidTable(_)
                | CoreError::InvalidRequest(_)
                | CoreError::Malformed { .. }
                | CoreError::Bucket(_)),
            ) => Self::InvalidArgument(other.to_string()),
            KvError::Corrupt(message) => Self::Corrupt(message),
            KvError::Core(ends @ CoreError::LogEndsEarly { .. }) => Self::Corrupt(ends.to_string()),
            KvError::ShuttingDown(what) => Self::ShuttingDown(what),
            KvError::Io(error) => Self::Io(error),
            KvError::LogStore(error) => *error,
            store @ KvError::Store(_) => Self::Changelog(Box::new(store)),
        }
    }
}
