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
use mink_scan::log_range::LogSource;
use prost::Message;

use super::limits::MAX_TASK_COUNT;
use super::tasks::{BucketRead, UnionTasksExec};

/// The first byte of a [`UnionTasksExec`]'s bytes.
const UNION_TASKS: u8 = 1;
/// The first byte of a node of [`MinkCodec`].
const MINK_SCAN: u8 = 2;

/// Encodes and decodes the nodes of a distributed union read (see the module docs).
#[derive(Debug)]
pub struct EngineCodec {
    mink: MinkCodec,
}

impl EngineCodec {
    /// A codec whose decoded log ranges read with `log`.
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
                // A hostile plan cannot make a worker allocate without bound.
                let tasks = Some(node.task_count)
                    .filter(|count| *count <= MAX_TASK_COUNT)
                    .and_then(|count| usize::try_from(count).ok())
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

#[cfg(test)]
mod tests {
    use arrow::array::RecordBatch;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_plan::displayable;
    use datafusion::prelude::SessionContext;
    use datafusion_proto::bytes::{
        physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
    };
    use futures::stream::{self, BoxStream, StreamExt};
    use mink_scan::log_range::{LogRange, LogRangeBatch, LogRangeExec, LogRangeRows};

    use super::*;

    /// A log with nothing in it: plans are only encoded and decoded here.
    #[derive(Debug)]
    struct NoLog;

    impl LogSource for NoLog {
        fn read(&self, _: &LogRange, _: &[u32]) -> BoxStream<'static, Result<LogRangeBatch>> {
            stream::empty().boxed()
        }

        fn read_live(&self, _: &LogRange, _: &[u32]) -> BoxStream<'static, Result<RecordBatch>> {
            stream::empty().boxed()
        }
    }

    fn bucket_read(bucket: u32) -> BucketRead {
        let bucket = BucketId {
            table: "db.t".into(),
            partition: None,
            bucket,
        };
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let range = LogRange {
            bucket: bucket.clone(),
            from: 3,
            to: 9,
        };
        let tail = LogRangeExec::new(
            Arc::new(NoLog),
            vec![range],
            vec![0],
            schema,
            LogRangeRows::Log,
        );
        BucketRead {
            bucket,
            rows: 6,
            plan: Arc::new(tail),
        }
    }

    fn shown(plan: &Arc<dyn ExecutionPlan>) -> String {
        displayable(plan.as_ref()).indent(true).to_string()
    }

    #[test]
    fn a_read_in_tasks_round_trips_with_its_buckets_plans() {
        let buckets = (0..3).map(bucket_read).collect();
        let read: Arc<dyn ExecutionPlan> =
            Arc::new(UnionTasksExec::try_new("db.t".into(), buckets, 2).expect("read"));
        assert_eq!(
            shown(&read),
            "UnionTasksExec: table=db.t, tasks=[t0: db.t/0 db.t/2, t1: db.t/1]\n"
        );
        let codec = EngineCodec::new(Arc::new(NoLog));
        let bytes =
            physical_plan_to_bytes_with_extension_codec(Arc::clone(&read), &codec).expect("encode");
        let context = SessionContext::new().task_ctx();
        let decoded = physical_plan_from_bytes_with_extension_codec(&bytes, &context, &codec)
            .expect("decode");
        assert_eq!(shown(&decoded), shown(&read));
        let decoded = decoded
            .as_any()
            .downcast_ref::<UnionTasksExec>()
            .expect("a read in tasks");
        let plans: Vec<String> = decoded.buckets().iter().map(|b| shown(&b.plan)).collect();
        let wanted: Vec<String> = read
            .as_any()
            .downcast_ref::<UnionTasksExec>()
            .expect("a read in tasks")
            .buckets()
            .iter()
            .map(|b| shown(&b.plan))
            .collect();
        assert_eq!(plans, wanted);
    }

    #[test]
    fn bytes_that_are_no_node_are_refused() {
        let codec = EngineCodec::new(Arc::new(NoLog));
        let context = SessionContext::new().task_ctx();
        let huge = UnionTasksNode {
            table: "db.t".into(),
            buckets: Vec::new(),
            task_count: u64::MAX,
        };
        let mut too_many_tasks = vec![UNION_TASKS];
        huge.encode(&mut too_many_tasks).expect("encode");
        for bytes in [
            Vec::new(),
            vec![0xff; 9],
            vec![UNION_TASKS, 0xff],
            too_many_tasks,
        ] {
            let error = codec
                .try_decode(&bytes, &[], &context)
                .expect_err("not a node");
            assert!(error.to_string().contains("does not decode"), "{error}");
        }
    }
}
