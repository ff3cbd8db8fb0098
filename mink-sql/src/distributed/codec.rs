//! The codec a distributed plan travels with: [`EngineCodec`], mink-scan's
//! [`MinkCodec`] (the union read's nodes) plus [`UnionTasksExec`], whose buckets' plans
//! travel inside it, their lake scans' position deletes included.
//!
//! Each node's bytes start with one byte saying whose node follows, then its message.
//! The format is internal to processes of the same build.

use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::PhysicalExtensionCodec;
use datafusion_proto::protobuf::PhysicalPlanNode;
use mink_core::protocol::BucketId;
use mink_scan::codec::MinkCodec;
use mink_scan::tail::LogSource;
use prost::Message;

use super::tasks::{BucketRead, UnionTasksExec};

/// The first byte of a [`UnionTasksExec`]'s bytes.
const UNION_TASKS: u8 = 1;
/// The first byte of a node of [`MinkCodec`].
const MINK_SCAN: u8 = 2;

/// The most tasks a decoded read may be dealt to: far more than any stage has, so a
/// hostile plan cannot make a worker allocate without bound.
const MAX_TASKS: usize = 1 << 16;

/// Encodes and decodes the nodes of a distributed union read (see the module docs).
#[derive(Debug)]
pub struct EngineCodec {
    mink: MinkCodec,
}

impl EngineCodec {
    /// A codec whose decoded log tails read with `log`.
    pub fn new(log: Arc<dyn LogSource>) -> Self {
        Self {
            mink: MinkCodec::new(log),
        }
    }
}

impl PhysicalExtensionCodec for EngineCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        context: &TaskContext,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match buf.split_first() {
            Some((&UNION_TASKS, message)) => {
                let node = UnionTasksNode::decode(message).map_err(|e| malformed(&e))?;
                let buckets = node
                    .buckets
                    .into_iter()
                    .map(|read| {
                        let plan = read
                            .plan
                            .ok_or_else(|| malformed(&"a bucket without plan"))?;
                        Ok(BucketRead {
                            bucket: read.bucket.ok_or_else(|| malformed(&"a read's bucket"))?,
                            rows: read.rows,
                            plan: self.mink.from_proto(&plan, context)?,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                let tasks = usize::try_from(node.task_count)
                    .ok()
                    .filter(|tasks| *tasks <= MAX_TASKS)
                    .ok_or_else(|| malformed(&format!("{} tasks", node.task_count)))?;
                Ok(Arc::new(UnionTasksExec::try_new(
                    node.table, buckets, tasks,
                )?))
            }
            Some((&MINK_SCAN, message)) => self.mink.try_decode(message, inputs, context),
            _ => Err(malformed(&"no known node")),
        }
    }

    fn try_encode(&self, node: Arc<dyn ExecutionPlan>, buf: &mut Vec<u8>) -> Result<()> {
        let Some(read) = node.as_any().downcast_ref::<UnionTasksExec>() else {
            buf.push(MINK_SCAN);
            return self.mink.try_encode(node, buf);
        };
        let buckets = read
            .buckets()
            .iter()
            .map(|bucket| {
                Ok(BucketReadNode {
                    bucket: Some(bucket.bucket.clone()),
                    rows: bucket.rows,
                    plan: Some(self.mink.to_proto(Arc::clone(&bucket.plan))?),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let message = UnionTasksNode {
            table: read.table().to_string(),
            buckets,
            task_count: read.task_count() as u64,
        };
        buf.push(UNION_TASKS);
        message
            .encode(buf)
            .map_err(|e| DataFusionError::Internal(format!("encoding a distributed read: {e}")))
    }
}

/// A plan node in bytes that do not decode.
fn malformed(error: &dyn std::fmt::Display) -> DataFusionError {
    DataFusionError::Plan(format!(
        "a distributed plan node that does not decode: {error}"
    ))
}

#[derive(Clone, PartialEq, Message)]
struct UnionTasksNode {
    #[prost(string, tag = "1")]
    table: String,
    #[prost(message, repeated, tag = "2")]
    buckets: Vec<BucketReadNode>,
    #[prost(uint64, tag = "3")]
    task_count: u64,
}

#[derive(Clone, PartialEq, Message)]
struct BucketReadNode {
    #[prost(message, optional, tag = "1")]
    bucket: Option<BucketId>,
    #[prost(uint64, tag = "2")]
    rows: u64,
    #[prost(message, optional, tag = "3")]
    plan: Option<PhysicalPlanNode>,
}
