//! The client's error type.

use arrow_flight::error::FlightError;
use mink_core::CoreError;
use mink_core::protocol::{ErrorDetail, NotLeader};
use prost::Message as _;
use tonic::Code;

/// What a client call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error status.
    #[error("{}: {}", .0.code(), .0.message())]
    Status(Box<tonic::Status>),
    /// The connection could not be made.
    #[error("cannot connect to {address}: {source}")]
    Connect {
        /// The address dialled.
        address: String,
        /// Why it failed.
        source: tonic::transport::Error,
    },
    /// The server sent something the protocol does not allow.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A model-level error (bad table definition, bucketing, decoding).
    #[error(transparent)]
    Core(#[from] CoreError),
    /// An Arrow error while building or decoding batches.
    #[error(transparent)]
    Arrow(#[from] arrow::error::ArrowError),
    /// A DoPut failed after its first messages were acknowledged: those are written, the
    /// failed one and the rest may be. Not followed to another leader as its error alone
    /// would be: sent again, the acknowledged ones would be written twice.
    #[error("{error} (after the first {acknowledged} messages of the DoPut were written)")]
    PartlyWritten {
        /// Messages acknowledged (batches, or pieces of a batch too large for one).
        acknowledged: usize,
        /// The failure.
        error: Box<ClientError>,
    },
}

impl ClientError {
    /// The gRPC code of a server error; `None` for errors raised by the client itself.
    pub fn code(&self) -> Option<Code> {
        match self {
            Self::Status(status) => Some(status.code()),
            Self::PartlyWritten { error, .. } => error.code(),
            Self::Connect { .. } | Self::Protocol(_) | Self::Core(_) | Self::Arrow(_) => None,
        }
    }

    /// The node does not lead the bucket the call addressed: who does (its address and
    /// epoch), or that it is moving (no address). From the status' typed detail, not
    /// from its code or message; `None` for [`ClientError::PartlyWritten`].
    pub fn not_leader(&self) -> Option<NotLeader> {
        let Self::Status(status) = self else {
            return None;
        };
        ErrorDetail::decode(status.details()).ok()?.not_leader
    }
}

impl From<tonic::Status> for ClientError {
    fn from(status: tonic::Status) -> Self {
        Self::Status(Box::new(status))
    }
}

impl From<FlightError> for ClientError {
    fn from(error: FlightError) -> Self {
        match error {
            FlightError::Tonic(status) => Self::Status(status),
            FlightError::Arrow(e) => Self::Arrow(e),
            other => Self::Protocol(other.to_string()),
        }
    }
}

/// Result with [`ClientError`].
pub type Result<T, E = ClientError> = std::result::Result<T, E>;
