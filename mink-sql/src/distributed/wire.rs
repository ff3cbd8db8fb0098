//! The messages of datafusion-distributed's worker protocol (`worker.WorkerService`)
//! that the worker's guard reads before the worker does, as prost structs:
//! datafusion-distributed does not export them. Their fields and tags are those of its
//! `worker.proto`; a test client builds them too. [`FlightDataHeader`] is the part of
//! Arrow Flight's `FlightData` that the check of another worker's answers reads.

use prost::Message;
use prost::bytes::Bytes;
use tonic::Status;

pub use datafusion_distributed::TaskKey;

/// A gRPC message's prefix: a compression flag, then its length (big-endian).
pub(crate) const GRPC_PREFIX: usize = 5;

/// The length a gRPC message's `prefix` declares, when the message is not compressed
/// (mink's calls never are) and is at most `max` bytes long.
///
/// # Errors
/// `InvalidArgument` for a compressed message, `OutOfRange` for a longer one.
pub(crate) fn message_length(prefix: [u8; GRPC_PREFIX], max: usize) -> Result<usize, Status> {
    let [flag, length @ ..] = prefix;
    if flag != 0 {
        return Err(Status::invalid_argument(
            "compressed gRPC messages are not accepted",
        ));
    }
    let length = usize::try_from(u32::from_be_bytes(length)).unwrap_or(usize::MAX);
    match length <= max {
        true => Ok(length),
        false => Err(Status::out_of_range(format!(
            "a message of {length} bytes: this call takes at most {max}"
        ))),
    }
}

/// `CoordinatorToWorkerMsg`, the message of a `CoordinatorChannel` call (its oneof of
/// one field is this optional field on the wire).
#[derive(Clone, PartialEq, Message)]
pub struct CoordinatorMessage {
    /// The task's plan.
    #[prost(message, optional, tag = "1")]
    pub set_plan: Option<SetPlan>,
}

/// `SetPlanRequest`: a task's plan.
#[derive(Clone, PartialEq, Message)]
pub struct SetPlan {
    /// The task.
    #[prost(message, optional, tag = "1")]
    pub task_key: Option<TaskKey>,
    /// How many tasks run the plan.
    #[prost(uint64, tag = "2")]
    pub task_count: u64,
    /// The encoded `PhysicalPlanNode` (a slice of the received message when decoded
    /// from one).
    #[prost(bytes = "bytes", tag = "3")]
    pub plan: Bytes,
}

/// `ExecuteTaskRequest`: partitions `partition_start..partition_end` of a task.
#[derive(Clone, PartialEq, Message)]
pub struct ExecuteTask {
    /// The task.
    #[prost(message, optional, tag = "1")]
    pub task_key: Option<TaskKey>,
    /// The first partition.
    #[prost(uint64, tag = "2")]
    pub partition_start: u64,
    /// The partition after the last.
    #[prost(uint64, tag = "3")]
    pub partition_end: u64,
}

/// Arrow Flight's `FlightData` (`Flight.proto`) read for its IPC header only: its other
/// fields (descriptor, app metadata, body) are skipped as unknown ones.
#[derive(Clone, PartialEq, Message)]
pub struct FlightDataHeader {
    /// The Arrow IPC message header (a `Message` flatbuffer).
    #[prost(bytes = "bytes", tag = "2")]
    pub data_header: Bytes,
}
