//! `KeyMergeExec`: the key merge of a primary-key table's union read
//! (`spec/union-read.md`), over two inputs: the lake rows below the seams and the log
//! tails after them.
//!
//! ```text
//!              KeyMergeExec                    partition p of n emits:
//!             /            \                     lake partition p, minus the keys
//!   lake (Parquet scan)   tail (LogTailExec)     the tails changed, then every
//!   any partitioning      one partition per      n-th live tail batch
//!                         bucket, in log order
//! ```
//!
//! The tails of every bucket are collected once, whichever output partition runs first,
//! into one [`TailIndex`] (key -> last change), their memory reserved in the query's pool.
//! A key lives in one bucket, so one index over all tails drops from any lake row exactly
//! what its own bucket's tail would: the lake side can be split and regrouped by
//! DataFusion as it likes (files, byte ranges), and every partition probes the same
//! index. The tail side must keep log order inside a bucket, so the merge tells the
//! optimizer it gains nothing from repartitioning it.
//!
//! The merge does not filter: the index is built from the unfiltered tail (a filtered
//! tail would let an older lake version of a key that left the filter resurrect), and a
//! filter above the merge applies to lake and tail rows alike.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{SchemaRef, UInt8Type};
use datafusion_common::{DataFusionError, Result};
use datafusion_execution::TaskContext;
use datafusion_execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion_physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, Time,
};
use datafusion_physical_plan::stream::RecordBatchStreamAdapter;
use datafusion_physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    SendableRecordBatchStream,
};
use futures::future::{BoxFuture, FutureExt, Shared, try_join_all};
use futures::stream::{self, StreamExt, TryStreamExt};
use mink_core::key::KeyCodec;
use mink_core::merge::TailIndex;

use crate::external;

/// The tails' index, built once per execution and shared by every output partition.
type SharedIndex = Shared<BoxFuture<'static, Result<Arc<MergeIndex>, Arc<DataFusionError>>>>;

/// The merge of a lake input and a tail input (see the module docs).
#[derive(Debug)]
pub struct KeyMergeExec {
    lake: Arc<dyn ExecutionPlan>,
    tail: Arc<dyn ExecutionPlan>,
    codec: Arc<KeyCodec>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    index: Mutex<Option<SharedIndex>>,
}

impl KeyMergeExec {
    /// Merges `lake` (rows in the read schema, which holds the key columns) with `tail`
    /// (the same columns and the change type, each bucket's tail in log order in one
    /// partition).
    pub fn new(
        lake: Arc<dyn ExecutionPlan>,
        tail: Arc<dyn ExecutionPlan>,
        codec: Arc<KeyCodec>,
    ) -> Self {
        let properties = PlanProperties::new(
            datafusion_physical_expr::EquivalenceProperties::new(lake.schema()),
            datafusion_physical_plan::Partitioning::UnknownPartitioning(
                lake.output_partitioning().partition_count(),
            ),
            lake.pipeline_behavior(),
            lake.boundedness(),
        );
        Self {
            lake,
            tail,
            codec,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
            index: Mutex::new(None),
        }
    }

    /// The key columns, in encoding order.
    pub fn key_columns(&self) -> &[String] {
        self.codec.columns()
    }

    /// The shared index, its build started by the first partition that asks.
    fn index(&self, context: &Arc<TaskContext>) -> SharedIndex {
        let mut index = self.index.lock().unwrap_or_else(PoisonError::into_inner);
        index
            .get_or_insert_with(|| {
                let build = build_index(
                    Arc::clone(&self.tail),
                    Arc::clone(context),
                    Arc::clone(&self.codec),
                    self.schema(),
                    BuildMetrics::new(&self.metrics),
                );
                build.map(|built| built.map_err(Arc::new)).boxed().shared()
            })
            .clone()
    }
}

/// The tails' rows folded by key, their live rows, and their memory in the pool.
#[derive(Debug)]
struct MergeIndex {
    index: TailIndex,
    live: Vec<RecordBatch>,
    _memory: MemoryReservation,
}

/// What building the index reports: the tails' rows and distinct keys, and the time
/// from the start of the build to the index (reading the tails included).
#[derive(Debug)]
struct BuildMetrics {
    tail_rows: Count,
    tail_keys: Count,
    build_time: Time,
}

impl BuildMetrics {
    fn new(metrics: &ExecutionPlanMetricsSet) -> Self {
        Self {
            tail_rows: MetricBuilder::new(metrics).counter("tail_rows", 0),
            tail_keys: MetricBuilder::new(metrics).counter("tail_keys", 0),
            build_time: MetricBuilder::new(metrics).subset_time("build_time", 0),
        }
    }
}

/// Collects every partition of `tail` (each batch reserved in the pool before it is
/// kept: a tail larger than the pool fails the query with `ResourcesExhausted`) and
/// indexes it.
async fn build_index(
    tail: Arc<dyn ExecutionPlan>,
    context: Arc<TaskContext>,
    codec: Arc<KeyCodec>,
    schema: SchemaRef,
    metrics: BuildMetrics,
) -> Result<Arc<MergeIndex>> {
    let _build_time = metrics.build_time.timer();
    let memory = MemoryConsumer::new("KeyMergeExec log tail").register(context.memory_pool());
    let partitions = (0..tail.output_partitioning().partition_count()).map(|partition| {
        let stream = tail.execute(partition, Arc::clone(&context));
        let memory = &memory;
        async move {
            let mut stream = stream?;
            let mut batches = Vec::new();
            while let Some(batch) = stream.try_next().await? {
                memory.try_grow(batch.get_array_memory_size())?;
                batches.push(batch);
            }
            Ok::<_, DataFusionError>(batches)
        }
    });
    let changes_at = schema.fields().len();
    let mut folded = Vec::new();
    for batch in try_join_all(partitions).await?.into_iter().flatten() {
        metrics.tail_rows.add(batch.num_rows());
        let changes = batch
            .column(changes_at)
            .as_primitive_opt::<UInt8Type>()
            .ok_or_else(|| DataFusionError::Internal("a tail without its change types".into()))?
            .values()
            .to_vec();
        let rows =
            RecordBatch::try_new(Arc::clone(&schema), batch.columns()[..changes_at].to_vec())?;
        folded.push((rows, changes));
    }
    let index = TailIndex::new(&codec, folded).map_err(external)?;
    metrics.tail_keys.add(index.len());
    let live = index.live_rows().map_err(external)?;
    Ok(Arc::new(MergeIndex {
        index,
        live,
        _memory: memory,
    }))
}

impl DisplayAs for KeyMergeExec {
    fn fmt_as(&self, _format: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyMergeExec: key=[{}]", self.codec.columns().join(", "))
    }
}

impl ExecutionPlan for KeyMergeExec {
    fn name(&self) -> &str {
        "KeyMergeExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.lake, &self.tail]
    }

    /// More lake partitions read the lake faster; the tail must stay in log order.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![true, false]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [lake, tail]: [Arc<dyn ExecutionPlan>; 2] = children.try_into().map_err(|_| {
            DataFusionError::Internal("KeyMergeExec takes a lake and a tail".into())
        })?;
        Ok(Arc::new(Self::new(lake, tail, Arc::clone(&self.codec))))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let index = self.index(&context);
        let lake = self.lake.execute(partition, context)?;
        let partitions = self.properties.partitioning.partition_count();
        let codec = Arc::clone(&self.codec);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let lake_rows = MetricBuilder::new(&self.metrics).counter("lake_rows", partition);
        let dropped =
            MetricBuilder::new(&self.metrics).counter("lake_rows_dropped_by_merge", partition);
        let stream = stream::once(async move {
            let index = index.await.map_err(DataFusionError::Shared)?;
            let live: Vec<Result<RecordBatch>> = index
                .live
                .iter()
                .skip(partition)
                .step_by(partitions.max(1))
                .cloned()
                .map(Ok)
                .collect();
            let output = baseline.clone();
            let merged = lake.and_then(move |batch| {
                let timer = baseline.elapsed_compute().timer();
                let kept = index.index.filter_lake(&codec, &batch).map_err(external);
                timer.done();
                if let Ok(kept) = &kept {
                    lake_rows.add(batch.num_rows());
                    dropped.add(batch.num_rows() - kept.num_rows());
                }
                std::future::ready(kept)
            });
            let output = merged
                .chain(stream::iter(live))
                .inspect_ok(move |batch| output.record_output(batch.num_rows()));
            Ok::<_, DataFusionError>(output)
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            stream,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
