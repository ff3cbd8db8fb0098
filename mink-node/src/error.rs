//! The node's error type and its mapping to gRPC status codes.

use std::sync::Arc;

use datafusion_common::DataFusionError;
use mink_core::CoreError;
use tonic::{Code, Status};

/// Everything a node request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// No table of that name.
    #[error("table '{0}' does not exist")]
    TableNotFound(String),
    /// The table of that name is not the one the request meant (it was dropped and
    /// created again).
    #[error("{0}")]
    TableReplaced(String),
    /// A table of that name exists already.
    #[error("table '{0}' already exists")]
    TableExists(String),
    /// The table exists but not the bucket (or partition).
    #[error("bucket {0} does not exist")]
    BucketNotFound(String),
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
    /// A request or batch that cannot be served as given.
    #[error("{0}")]
    InvalidArgument(String),
    /// A batch whose schema is not the table's.
    #[error("{0}")]
    SchemaMismatch(String),
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
    /// Stored data that does not decode.
    #[error("corrupt log: {0}")]
    Corrupt(String),
    /// The KV store failed.
    #[error("KV store: {0}")]
    Kv(String),
    /// The metadata database failed.
    #[error("metadata store: {0}")]
    Metadata(#[from] rusqlite::Error),
    /// An Arrow kernel or codec failed.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// The node is shutting down or the bucket is closed.
    #[error("{0} is shutting down")]
    ShuttingDown(String),
    /// The lake (catalog, object store, Iceberg metadata) failed.
    #[error("lake: {0}")]
    Lake(#[from] mink_lake::LakeError),
    /// The table has no lake (Union/Lake reads of its lake, tiering).
    #[error("table {0} has no lake: create it with 'lake.enabled' = 'true'")]
    NoLake(String),
    /// A read would hold more memory than the node's memory pool has left.
    #[error("not enough memory for {0}")]
    MemoryExhausted(String),
    /// Another process holds the data directory.
    #[error("data directory {0} is in use by another mink process")]
    DataDirLocked(String),
    /// A read's plan failed in DataFusion itself (not in mink's code it runs).
    #[error("read: {0}")]
    Read(String),
}

/// Result with [`NodeError`].
pub type Result<T, E = NodeError> = std::result::Result<T, E>;

impl From<CoreError> for NodeError {
    fn from(error: CoreError) -> Self {
        match error {
            CoreError::SchemaMismatch(message) => Self::SchemaMismatch(message),
            CoreError::Arrow(e) => Self::Arrow(e),
            other @ (CoreError::InvalidTable(_)
            | CoreError::InvalidRequest(_)
            | CoreError::Malformed { .. }
            | CoreError::Bucket(_)) => Self::InvalidArgument(other.to_string()),
        }
    }
}

impl From<DataFusionError> for NodeError {
    /// A read plan's failure: an error of mink's own code the plan ran (a log read, the
    /// lake, a key or schema check) keeps its kind, so its gRPC code; a full memory pool
    /// is [`NodeError::MemoryExhausted`].
    fn from(error: DataFusionError) -> Self {
        if let DataFusionError::ResourcesExhausted(message) = error.find_root() {
            return Self::MemoryExhausted(message.clone());
        }
        match error {
            DataFusionError::External(inner) => from_external(inner),
            DataFusionError::Context(_, inner) => Self::from(*inner),
            DataFusionError::ArrowError(inner, _) => Self::Arrow(*inner),
            DataFusionError::ObjectStore(inner) => Self::Lake((*inner).into()),
            DataFusionError::ParquetError(inner) => Self::Lake((*inner).into()),
            DataFusionError::Shared(shared) => match Arc::try_unwrap(shared) {
                Ok(inner) => Self::from(inner),
                Err(shared) => Self::Read(shared.to_string()),
            },
            other => Self::Read(other.to_string()),
        }
    }
}

/// An error of mink's crates that went through a plan as [`DataFusionError::External`].
fn from_external(error: Box<dyn std::error::Error + Send + Sync>) -> NodeError {
    let error = match error.downcast::<NodeError>() {
        Ok(node) => return *node,
        Err(other) => other,
    };
    let error = match error.downcast::<mink_lake::LakeError>() {
        Ok(lake) => return NodeError::Lake(*lake),
        Err(other) => other,
    };
    match error.downcast::<CoreError>() {
        Ok(core) => NodeError::from(*core),
        Err(other) => NodeError::Read(other.to_string()),
    }
}

impl NodeError {
    /// The gRPC code a client sees for this error.
    pub fn code(&self) -> Code {
        match self {
            Self::TableNotFound(_) | Self::BucketNotFound(_) => Code::NotFound,
            Self::TableExists(_) => Code::AlreadyExists,
            Self::TableReplaced(_) => Code::FailedPrecondition,
            Self::OffsetOutOfRange { .. } => Code::OutOfRange,
            Self::InvalidArgument(_) | Self::SchemaMismatch(_) => Code::InvalidArgument,
            Self::DiskFull { .. } | Self::MemoryExhausted(_) => Code::ResourceExhausted,
            Self::ShuttingDown(_) => Code::Unavailable,
            Self::DataDirLocked(_) | Self::NoLake(_) => Code::FailedPrecondition,
            Self::Lake(error) => lake_code(error),
            Self::Corrupt(_) => Code::DataLoss,
            Self::Io(_) | Self::Metadata(_) | Self::Kv(_) | Self::Arrow(_) | Self::Read(_) => {
                Code::Internal
            }
        }
    }
}

impl NodeError {
    /// The same failure, for the next of several appends that failed together in one
    /// group commit (I/O errors are not `Clone`).
    pub(crate) fn for_another_waiter(&self) -> Self {
        match self {
            Self::DiskFull { bucket, source } => Self::DiskFull {
                bucket: bucket.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            Self::ShuttingDown(what) => Self::ShuttingDown(what.clone()),
            other => Self::Io(std::io::Error::other(other.to_string())),
        }
    }
}

fn lake_code(error: &mink_lake::LakeError) -> Code {
    use mink_lake::LakeError;
    match error {
        LakeError::SnapshotNotFound { .. } => Code::NotFound,
        LakeError::Core(_) | LakeError::NotAncestor { .. } => Code::InvalidArgument,
        LakeError::Refused { .. } => Code::PermissionDenied,
        LakeError::Config(_) | LakeError::Layout { .. } | LakeError::FullReloadNeeded { .. } => {
            Code::FailedPrecondition
        }
        // Another commit moved the table: the operation can be retried.
        LakeError::CommitConflict { .. } => Code::Aborted,
        // The catalog or the object store could not be reached or answered an error.
        LakeError::Iceberg(_)
        | LakeError::ObjectStore(_)
        | LakeError::Catalog(_)
        | LakeError::RestCatalog(_) => Code::Unavailable,
        LakeError::Parquet(_) | LakeError::Arrow(_) => Code::Internal,
    }
}

/// Longest message put into a status; longer ones are cut.
const MAX_STATUS_MESSAGE: usize = 4096;

impl From<NodeError> for Status {
    fn from(error: NodeError) -> Self {
        let mut message = error.to_string();
        if message.len() > MAX_STATUS_MESSAGE {
            let cut = message.floor_char_boundary(MAX_STATUS_MESSAGE);
            message.truncate(cut);
            message.push_str("...");
        }
        Status::new(error.code(), message)
    }
}
