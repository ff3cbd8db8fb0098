//! The messages of datafusion-distributed's worker protocol (`worker.WorkerService`)
//! that the worker's guard reads before the worker does, as prost structs:
//! datafusion-distributed does not export them. Their fields and tags are those of its
//! `worker.proto`; a test client builds them too.

use prost::Message;
use prost::bytes::Bytes;

pub use datafusion_distributed::TaskKey;

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
