//! A table's union read cut into distributed tasks: [`UnionTasksExec`], one plan per
//! bucket (its lake scan, its tail and their merge, filtered and projected), the buckets
//! dealt to the tasks of the stage that reads them; and [`UnionTaskEstimator`], which
//! tells datafusion-distributed's planner how many tasks a read is worth.
//!
//! A bucket is never cut: its lake rows and the tail that replaces some of them are
//! merged in one task, so each task's rows are exactly its buckets' rows (buckets hold
//! disjoint keys). To the distributed planner the node is a leaf: it sees neither the
//! Parquet scans (whose position deletes would not survive DataFusion's own
//! serialization) nor the tails.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::EmptyRecordBatchStream;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use datafusion_distributed::{DistributedTaskContext, TaskEstimation, TaskEstimator};
use mink_core::protocol::BucketId;

/// One bucket's read: its plan and how many rows it holds at most (lake rows before
/// deletes plus log offsets), which sizes the tasks.
#[derive(Debug, Clone)]
pub struct BucketRead {
    pub bucket: BucketId,
    pub rows: u64,
    pub plan: Arc<dyn ExecutionPlan>,
}

/// A table's union read, its buckets dealt round-robin to `task_count` tasks; a task
/// executes its buckets' plans side by side (see the module docs).
#[derive(Debug)]
pub struct UnionTasksExec {
    table: String,
    buckets: Vec<BucketRead>,
    /// Each task's plan: its buckets' plans, side by side (none for a task left without
    /// a bucket, when the stage has more tasks than the read has buckets).
    tasks: Vec<Option<Arc<dyn ExecutionPlan>>>,
    properties: Arc<PlanProperties>,
}

impl UnionTasksExec {
    /// `table`'s read of `buckets` (at least one, all of one schema) in `task_count`
    /// tasks (at least one).
    ///
    /// # Errors
    /// No bucket, or buckets whose plans' schemas differ.
    pub fn try_new(table: String, buckets: Vec<BucketRead>, task_count: usize) -> Result<Self> {
        let Some(first) = buckets.first() else {
            return Err(DataFusionError::Internal(format!(
                "a distributed read of {table} without buckets"
            )));
        };
        let schema = first.plan.schema();
        let task_count = task_count.max(1);
        let tasks = (0..task_count)
            .map(|task| {
                let plans: Vec<_> = buckets
                    .iter()
                    .skip(task)
                    .step_by(task_count)
                    .map(|read| Arc::clone(&read.plan))
                    .collect();
                match plans.len() {
                    0 => Ok(None),
                    1 => Ok(plans.into_iter().next()),
                    _ => UnionExec::try_new(plans).map(Some),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let partitions = tasks
            .iter()
            .flatten()
            .map(|plan| plan.properties().partitioning.partition_count())
            .max()
            .unwrap_or(1);
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(Self {
            table,
            buckets,
            tasks,
            properties: Arc::new(properties),
        })
    }

    /// The table read.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The buckets read, in the order they are dealt to tasks.
    pub fn buckets(&self) -> &[BucketRead] {
        &self.buckets
    }

    /// How many tasks read the buckets.
    pub fn task_count(&self) -> usize {
        self.tasks.len()
    }

    /// Rows the buckets hold at most.
    fn rows(&self) -> u64 {
        self.buckets.iter().map(|read| read.rows).sum()
    }
}

impl DisplayAs for UnionTasksExec {
    fn fmt_as(&self, _format: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UnionTasksExec: table={}, tasks=[", self.table)?;
        let count = self.tasks.len();
        for task in 0..count {
            let buckets: Vec<String> = self
                .buckets
                .iter()
                .skip(task)
                .step_by(count)
                .map(|read| read.bucket.to_string())
                .collect();
            let separator = if task > 0 { ", " } else { "" };
            write!(f, "{separator}t{task}: {}", buckets.join(" "))?;
        }
        write!(f, "]")
    }
}

impl ExecutionPlan for UnionTasksExec {
    fn name(&self) -> &str {
        "UnionTasksExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    /// None: the buckets' plans travel inside the node (see the module docs).
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let task = DistributedTaskContext::from_ctx(&context);
        if task.task_count != self.tasks.len() {
            return Err(DataFusionError::Internal(format!(
                "the read of {} was planned in {} tasks, but runs as task {} of {}",
                self.table,
                self.tasks.len(),
                task.task_index,
                task.task_count
            )));
        }
        match &self.tasks[task.task_index] {
            Some(plan) if partition < plan.properties().partitioning.partition_count() => {
                plan.execute(partition, context)
            }
            _ => Ok(Box::pin(EmptyRecordBatchStream::new(self.schema()))),
        }
    }
}

/// How many tasks a union read is worth: one per `rows_per_task` rows it holds at most,
/// no more than it has buckets (the planner caps it further at the live workers).
#[derive(Debug, Clone, Copy)]
pub struct UnionTaskEstimator {
    pub rows_per_task: u64,
}

impl TaskEstimator for UnionTaskEstimator {
    fn task_estimation(
        &self,
        plan: &Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Option<TaskEstimation> {
        let read = plan.as_any().downcast_ref::<UnionTasksExec>()?;
        let worth = read.rows().div_ceil(self.rows_per_task.max(1));
        let tasks = usize::try_from(worth).unwrap_or(usize::MAX);
        Some(TaskEstimation::desired(tasks.clamp(1, read.buckets.len())))
    }

    fn scale_up_leaf_node(
        &self,
        plan: &Arc<dyn ExecutionPlan>,
        task_count: usize,
        _config: &ConfigOptions,
    ) -> Option<Arc<dyn ExecutionPlan>> {
        let read = plan.as_any().downcast_ref::<UnionTasksExec>()?;
        let scaled = UnionTasksExec::try_new(read.table.clone(), read.buckets.clone(), task_count);
        // try_new fails only for what this read already passed.
        scaled
            .ok()
            .map(|scaled| Arc::new(scaled) as Arc<dyn ExecutionPlan>)
    }
}
