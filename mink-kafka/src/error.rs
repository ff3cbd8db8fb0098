//! What can go wrong while answering a Kafka request, and the Kafka error code each
//! failure is answered with.

use kafka_protocol::ResponseError;
use mink_kv::KvError;
use mink_log::LogError;
use mink_node::NodeError;

/// A failure while serving one request (or one partition of it).
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// From the node: a missing table or bucket, an offset out of range, a refused write.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// Rows that could not be converted.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// From mink's core types (a change vector, a table name).
    #[error(transparent)]
    Core(#[from] mink_core::CoreError),
    /// A produced record that does not fit its table.
    #[error("invalid record: {0}")]
    InvalidRecord(String),
    /// A produced batch compressed with a codec the listener does not read.
    #[error("{0}")]
    UnsupportedCompression(String),
    /// A request that is not Kafka's protocol: the connection is closed.
    #[error("malformed request: {0}")]
    Malformed(String),
    /// Refused with a Kafka error of its own (a sequence out of order, an unknown
    /// partition, a transaction).
    #[error("{1}")]
    Refused(ResponseError, String),
    /// A single node's Kafka state, in its `meta.db`.
    #[error("the Kafka state: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The cluster's etcd, which keeps the Kafka state of a cluster.
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    /// A bug or an unexpected state.
    #[error("{0}")]
    Internal(String),
}

/// The result of serving a request.
pub(crate) type Result<T, E = KafkaError> = std::result::Result<T, E>;

impl KafkaError {
    /// The Kafka error code a client gets for this failure.
    pub fn code(&self) -> i16 {
        let error = match self {
            Self::Refused(error, _) => *error,
            Self::Node(NodeError::Log(LogError::OffsetOutOfRange { .. })) => {
                ResponseError::OffsetOutOfRange
            }
            Self::Node(NodeError::TableNotFound(_) | NodeError::BucketNotFound(_)) => {
                ResponseError::UnknownTopicOrPartition
            }
            Self::Node(
                NodeError::InvalidArgument(_)
                | NodeError::SchemaMismatch(_)
                | NodeError::Log(LogError::InvalidArgument(_))
                | NodeError::Kv(KvError::InvalidArgument(_) | KvError::Core(_)),
            )
            | Self::InvalidRecord(_)
            | Self::Arrow(_)
            | Self::Core(_) => ResponseError::InvalidRecord,
            Self::Node(
                NodeError::ShuttingDown(_)
                | NodeError::NotLeader(_)
                | NodeError::Log(LogError::ShuttingDown(_))
                | NodeError::Kv(KvError::ShuttingDown(_)),
            ) => ResponseError::NotLeaderOrFollower,
            // Retriable: an idempotent producer's retry is recognized (see `produce`). A
            // write forwarded to another node's bucket that failed may have landed too.
            Self::Node(NodeError::OutcomeUnknown(_) | NodeError::Peer(_)) => {
                ResponseError::RequestTimedOut
            }
            Self::Node(
                NodeError::Io(_)
                | NodeError::Corrupt(_)
                | NodeError::Log(LogError::DiskFull { .. } | LogError::Io(_) | LogError::Corrupt(_))
                | NodeError::Kv(KvError::Io(_) | KvError::Corrupt(_)),
            )
            | Self::Sqlite(_)
            | Self::Etcd(_) => ResponseError::KafkaStorageError,
            Self::UnsupportedCompression(_) => ResponseError::UnsupportedCompressionType,
            Self::Malformed(_) => ResponseError::CorruptMessage,
            Self::Node(_) | Self::Internal(_) => ResponseError::UnknownServerError,
        };
        error.code()
    }
}
