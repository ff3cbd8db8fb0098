//! The node's error type and its mapping to gRPC status codes.

use std::sync::Arc;

use datafusion_common::DataFusionError;
use mink_core::CoreError;
use mink_core::protocol::{ErrorDetail, NotLeader};
use mink_kv::KvError;
use mink_log::LogError;
use prost::Message as _;
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
    /// This node does not lead the bucket: another does (its address and epoch), or it is
    /// moving. Answered with the typed detail, so clients follow it.
    #[error("{}", not_leader_message(.0))]
    NotLeader(NotLeader),
    /// A request or batch that cannot be served as given.
    #[error("{0}")]
    InvalidArgument(String),
    /// A batch whose schema is not the table's.
    #[error("{0}")]
    SchemaMismatch(String),
    /// Another I/O failure.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// Stored data that does not decode.
    #[error("corrupt log: {0}")]
    Corrupt(String),
    /// A bucket's log failed or refused the request.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The KV store failed or refused the request.
    #[error(transparent)]
    Kv(#[from] KvError),
    /// The metadata database failed.
    #[error("metadata store: {0}")]
    Metadata(#[from] rusqlite::Error),
    /// A cluster's metadata in etcd could not be read or changed.
    #[error("cluster metadata (etcd): {0}")]
    ClusterMetadata(String),
    /// Another node of the cluster, called by this one, failed or could not be reached.
    #[error("another node of the cluster: {0}")]
    Peer(#[from] mink_client::ClientError),
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
    /// A write that may or may not be in the log: only an idempotent writer's retry can
    /// tell (it is written once).
    #[error(
        "{0}: the write may or may not be in the bucket's log (an idempotent writer's retry is written once)"
    )]
    OutcomeUnknown(String),
}

/// Result with [`NodeError`].
pub type Result<T, E = NodeError> = std::result::Result<T, E>;

impl From<CoreError> for NodeError {
    fn from(error: CoreError) -> Self {
        match error {
            CoreError::SchemaMismatch(message) => Self::SchemaMismatch(message),
            CoreError::Arrow(e) => Self::Arrow(e),
            // Rows below the high watermark the range was planned to are missing.
            ends @ CoreError::LogEndsEarly { .. } => Self::Corrupt(ends.to_string()),
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
    let error = match error.downcast::<LogError>() {
        Ok(log) => return NodeError::Log(*log),
        Err(other) => other,
    };
    let error = match error.downcast::<KvError>() {
        Ok(kv) => return NodeError::Kv(*kv),
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
            Self::NotLeader(NotLeader {
                leader: Some(_), ..
            }) => Code::FailedPrecondition,
            Self::NotLeader(NotLeader { leader: None, .. }) => Code::Unavailable,
            Self::TableExists(_) => Code::AlreadyExists,
            Self::TableReplaced(_) => Code::FailedPrecondition,
            Self::InvalidArgument(_) | Self::SchemaMismatch(_) => Code::InvalidArgument,
            Self::MemoryExhausted(_) => Code::ResourceExhausted,
            Self::ShuttingDown(_) | Self::ClusterMetadata(_) | Self::OutcomeUnknown(_) => {
                Code::Unavailable
            }
            // Its own code (`None`: it could not be reached, or broke the protocol).
            Self::Peer(error) => error.code().unwrap_or(Code::Unavailable),
            Self::DataDirLocked(_) | Self::NoLake(_) => Code::FailedPrecondition,
            Self::Lake(error) => lake_code(error),
            Self::Log(error) => log_code(error),
            Self::Kv(error) => kv_code(error),
            Self::Corrupt(_) => Code::DataLoss,
            Self::Io(_) | Self::Metadata(_) | Self::Arrow(_) | Self::Read(_) => Code::Internal,
        }
    }

    /// The `cause` label of a failed write in `mink_write_failures_total`.
    pub fn metric_cause(&self) -> &'static str {
        if let Self::NotLeader(_) = self {
            return "not_leader";
        }
        match self.code() {
            Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::OutOfRange => "invalid",
            Code::ResourceExhausted => "exhausted",
            Code::Unavailable => "unavailable",
            _ => "internal",
        }
    }
}

fn log_code(error: &LogError) -> Code {
    match error {
        LogError::OffsetOutOfRange { .. } => Code::OutOfRange,
        LogError::InvalidArgument(_) => Code::InvalidArgument,
        LogError::DiskFull { .. } => Code::ResourceExhausted,
        LogError::ShuttingDown(_)
        | LogError::Store(_)
        | LogError::Fenced { .. }
        | LogError::HandedOver { .. } => Code::Unavailable,
        LogError::Corrupt(_) => Code::DataLoss,
        LogError::Io(_) | LogError::Arrow(_) | LogError::Changelog(_) => Code::Internal,
    }
}

fn kv_code(error: &KvError) -> Code {
    match error {
        KvError::InvalidArgument(_) => Code::InvalidArgument,
        KvError::Core(error) => core_code(error),
        KvError::ShuttingDown(_) => Code::Unavailable,
        KvError::Corrupt(_) => Code::DataLoss,
        KvError::LogStore(error) => log_code(error),
        KvError::Store(_) | KvError::Io(_) | KvError::Arrow(_) => Code::Internal,
    }
}

/// The code of a core error, as [`NodeError::from`] maps it.
fn core_code(error: &CoreError) -> Code {
    match error {
        CoreError::Arrow(_) => Code::Internal,
        CoreError::LogEndsEarly { .. } => Code::DataLoss,
        CoreError::SchemaMismatch(_)
        | CoreError::InvalidTable(_)
        | CoreError::InvalidRequest(_)
        | CoreError::Malformed { .. }
        | CoreError::Bucket(_) => Code::InvalidArgument,
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
        match &error {
            NodeError::NotLeader(not_leader) => {
                let detail = ErrorDetail {
                    not_leader: Some(not_leader.clone()),
                };
                Status::with_details(error.code(), message, detail.encode_to_vec().into())
            }
            _ => Status::new(error.code(), message),
        }
    }
}

fn not_leader_message(not_leader: &NotLeader) -> String {
    let bucket = not_leader
        .bucket
        .as_ref()
        .map_or_else(String::new, ToString::to_string);
    match &not_leader.leader {
        Some(leader) => format!(
            "this node does not lead bucket {bucket}: {leader} does (epoch {})",
            not_leader.epoch
        ),
        None => format!("bucket {bucket} is moving between nodes: retry shortly"),
    }
}
