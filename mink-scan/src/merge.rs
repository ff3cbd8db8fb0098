//! `KeyMergeExec`: the key merge of a primary-key table's union read
//! (`docs/design.md#union-read`), over two inputs: the lake rows below the seams and the log
//! ranges after them.
//!
//! ```text
//!              KeyMergeExec                    partition p of n emits:
//!             /            \                     lake partition p, minus the keys
//!   lake (Parquet scan)   range (LogRangeExec)     the log ranges changed, then every
//!   any partitioning      one partition per      n-th live range batch
//!                         bucket, in log order
//! ```
//!
//! The log ranges of every bucket are collected once, whichever output partition runs first
//! (for a probe, into one [`LogRangeIndex`]: key -> last change), their memory reserved in the
//! query's pool.
//! A key lives in one bucket, so one index over all ranges drops from any lake row exactly
//! what its own bucket's range would: the lake side can be split and regrouped by
//! DataFusion as it likes (files, byte ranges), and every partition probes the same
//! index. The log range side must keep log order inside a bucket, so the merge tells the
//! optimizer it gains nothing from repartitioning it.
//!
//! The merge does not filter: the index is built from the unfiltered range (a filtered
//! range would let an older lake version of a key that left the filter resurrect), and a
//! filter above the merge applies to lake and range rows alike.
//!
//! How the lake rows of the changed keys are left out ([`LakeMerge`]):
//!
//! - **by position** when the node located them while planning: its lake index maps each
//!   key to its lake row, so the keys of the log ranges become positions on the lake files,
//!   read like Iceberg's position deletes ([`mink_lake::reader::LakeFile::replaced_rows`]).
//!   The lake rows pass through untouched and the lake scan reads no key column it is not
//!   asked for. The log ranges come folded too: their leaders answer each range's live rows
//!   ([`crate::log_range::LogRangeRows::Live`]), so the merge only collects them and emits them
//!   after the lake, and nothing is folded or probed here.
//! - **by probe** otherwise (the node had no current index: after a restart before the
//!   first round, during a round, or a log range too long to locate): the log ranges' changes are
//!   folded into a [`LogRangeIndex`] and every lake row's key is looked up in it (a bitmap or
//!   hash set of plain values for a single integer key, encoded keys otherwise).
//!
//! The inputs: the lake's rows carry the merge's output columns, and for a probe the key
//! columns they lack after them; the log range's carry the output columns, and for a probe the
//! key columns they lack, then the change type.

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
use mink_core::merge::LogRangeIndex;

use crate::external;

/// The log ranges' index, built once per execution and shared by every output partition.
type SharedIndex = Shared<BoxFuture<'static, Result<Arc<MergeIndex>, Arc<DataFusionError>>>>;

/// How a key merge leaves out the lake rows whose keys the log ranges changed (see the module
/// docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LakeMerge {
    /// The lake scan skipped them by position: lake rows pass through.
    Positions,
    /// Each lake row's key is probed against the log ranges' index.
    Probe,
}

/// The merge of a lake input and a log range input (see the module docs).
#[derive(Debug)]
pub struct KeyMergeExec {
    lake: Arc<dyn ExecutionPlan>,
    log: Arc<dyn ExecutionPlan>,
    codec: Arc<KeyCodec>,
    merge: LakeMerge,
    /// The output: the first columns of each input.
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    index: Mutex<Option<SharedIndex>>,
}

impl KeyMergeExec {
    /// Merges `lake` with `range` (each bucket's range in log order in one partition) into
    /// rows of their first `columns` columns (the inputs' columns are in the module docs).
    ///
    /// # Errors
    /// An input with fewer columns.
    pub fn try_new(
        lake: Arc<dyn ExecutionPlan>,
        log: Arc<dyn ExecutionPlan>,
        codec: Arc<KeyCodec>,
        merge: LakeMerge,
        columns: usize,
    ) -> Result<Self> {
        // A probe's range carries the change types after the output columns.
        let range_columns = columns + usize::from(merge == LakeMerge::Probe);
        if lake.schema().fields().len() < columns || log.schema().fields().len() < range_columns {
            return Err(DataFusionError::Internal(format!(
                "a key merge of {columns} columns over inputs of fewer"
            )));
        }
        let schema = Arc::new(lake.schema().project(&(0..columns).collect::<Vec<_>>())?);
        let properties = PlanProperties::new(
            datafusion_physical_expr::EquivalenceProperties::new(Arc::clone(&schema)),
            datafusion_physical_plan::Partitioning::UnknownPartitioning(
                lake.output_partitioning().partition_count(),
            ),
            lake.pipeline_behavior(),
            lake.boundedness(),
        );
        Ok(Self {
            lake,
            log,
            codec,
            merge,
            schema,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
            index: Mutex::new(None),
        })
    }

    /// The key columns' fields, in encoding order.
    pub fn key_schema(&self) -> &SchemaRef {
        self.codec.key_schema()
    }

    /// How the lake rows of changed keys are left out.
    pub fn merge(&self) -> LakeMerge {
        self.merge
    }

    /// How the log range's rows are folded: not at all when they are live rows.
    fn fold(&self) -> Option<Fold> {
        (self.merge == LakeMerge::Probe).then(|| Fold {
            codec: Arc::clone(&self.codec),
            columns: self.schema.fields().len(),
            log_keys: MetricBuilder::new(&self.metrics).counter("log_keys", 0),
        })
    }

    /// The shared index, its build started by the first partition that asks.
    fn index(&self, context: &Arc<TaskContext>) -> SharedIndex {
        let mut index = self.index.lock().unwrap_or_else(PoisonError::into_inner);
        index
            .get_or_insert_with(|| {
                let build = build_index(
                    Arc::clone(&self.log),
                    Arc::clone(context),
                    self.fold(),
                    BuildMetrics::new(&self.metrics),
                );
                build.map(|built| built.map_err(Arc::new)).boxed().shared()
            })
            .clone()
    }
}

/// The log ranges' live rows, their rows folded by key for a probe, and their memory in the
/// pool.
#[derive(Debug)]
struct MergeIndex {
    /// `None` when the log ranges came folded (a merge by position).
    index: Option<LogRangeIndex>,
    live: Vec<RecordBatch>,
    _memory: MemoryReservation,
}

/// How a probe's range is folded: by `codec`'s key, its live rows keeping their first
/// `columns` columns; the distinct keys are counted in `log_keys`.
#[derive(Debug)]
struct Fold {
    codec: Arc<KeyCodec>,
    columns: usize,
    log_keys: Count,
}

/// What building the index reports: the log ranges' rows (their live rows when they came
/// folded), and the time from the start of the build to the index (reading the log ranges
/// included).
#[derive(Debug)]
struct BuildMetrics {
    log_rows: Count,
    build_time: Time,
}

impl BuildMetrics {
    fn new(metrics: &ExecutionPlanMetricsSet) -> Self {
        Self {
            log_rows: MetricBuilder::new(metrics).counter("log_rows", 0),
            build_time: MetricBuilder::new(metrics).subset_time("build_time", 0),
        }
    }
}

/// Collects every partition of `range` (each batch reserved in the pool before it is
/// kept: a log range larger than the pool fails the query with `ResourcesExhausted`), and
/// indexes it when it is to be folded (`fold`); else its rows are the live rows.
async fn build_index(
    log: Arc<dyn ExecutionPlan>,
    context: Arc<TaskContext>,
    fold: Option<Fold>,
    metrics: BuildMetrics,
) -> Result<Arc<MergeIndex>> {
    let _build_time = metrics.build_time.timer();
    let memory = MemoryConsumer::new("KeyMergeExec log range").register(context.memory_pool());
    let partitions = (0..log.output_partitioning().partition_count()).map(|partition| {
        let stream = log.execute(partition, Arc::clone(&context));
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
    let batches: Vec<RecordBatch> = try_join_all(partitions)
        .await?
        .into_iter()
        .flatten()
        .collect();
    metrics
        .log_rows
        .add(batches.iter().map(RecordBatch::num_rows).sum());
    let Some(Fold {
        codec,
        columns,
        log_keys,
    }) = fold
    else {
        return Ok(Arc::new(MergeIndex {
            index: None,
            live: batches,
            _memory: memory,
        }));
    };
    let range_schema = log.schema();
    let changes_at = range_schema.fields().len() - 1;
    let rows_schema = Arc::new(range_schema.project(&(0..changes_at).collect::<Vec<_>>())?);
    let mut changes = Vec::with_capacity(batches.len());
    for batch in batches {
        let types = batch
            .column(changes_at)
            .as_primitive_opt::<UInt8Type>()
            .ok_or_else(|| {
                DataFusionError::Internal("a log range without its change types".into())
            })?
            .values()
            .to_vec();
        let rows = RecordBatch::try_new(
            Arc::clone(&rows_schema),
            batch.columns()[..changes_at].to_vec(),
        )?;
        changes.push((rows, types));
    }
    let index = LogRangeIndex::new(&codec, changes).map_err(external)?;
    log_keys.add(index.len());
    let output: Vec<usize> = (0..columns).collect();
    let live = index.live_rows().map_err(external)?;
    let live = live
        .iter()
        .map(|batch| batch.project(&output))
        .collect::<Result<_, _>>()?;
    Ok(Arc::new(MergeIndex {
        index: Some(index),
        live,
        _memory: memory,
    }))
}

impl DisplayAs for KeyMergeExec {
    fn fmt_as(&self, _format: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let merge = match self.merge {
            LakeMerge::Positions => "positions",
            LakeMerge::Probe => "probe",
        };
        write!(
            f,
            "KeyMergeExec: key=[{}], lake_merge={merge}",
            self.codec.columns().join(", ")
        )
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
        vec![&self.lake, &self.log]
    }

    /// More lake partitions read the lake faster; the log range must stay in log order.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![true, false]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [lake, log]: [Arc<dyn ExecutionPlan>; 2] = children.try_into().map_err(|_| {
            DataFusionError::Internal("KeyMergeExec takes a lake and a log range".into())
        })?;
        let columns = self.schema.fields().len();
        let codec = Arc::clone(&self.codec);
        Ok(Arc::new(Self::try_new(
            lake, log, codec, self.merge, columns,
        )?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let index = self.index(&context);
        let lake = self.lake.execute(partition, context)?;
        let partitions = self.properties.partitioning.partition_count().max(1);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let lake_rows = MetricBuilder::new(&self.metrics).counter("lake_rows", partition);
        let lake = lake.inspect_ok(move |batch| lake_rows.add(batch.num_rows()));
        // This partition's share of the log ranges' live rows, once the index is built.
        let live = {
            let index = index.clone();
            stream::once(async move {
                let index = index.await.map_err(DataFusionError::Shared)?;
                let live = index.live.iter().skip(partition).step_by(partitions);
                Ok::<_, DataFusionError>(stream::iter(live.cloned().map(Ok).collect::<Vec<_>>()))
            })
            .try_flatten()
        };
        let merged = match self.merge {
            // The lake's rows need nothing from the log ranges: they flow while the log ranges are
            // read and folded (the build is polled beside them), then the live rows follow.
            LakeMerge::Positions => {
                let build_error = stream::once(index).filter_map(|built| {
                    std::future::ready(built.err().map(|e| Err(DataFusionError::Shared(e))))
                });
                stream::select(lake, build_error).chain(live).boxed()
            }
            LakeMerge::Probe => {
                let codec = Arc::clone(&self.codec);
                let output_columns: Vec<usize> = (0..self.schema.fields().len()).collect();
                let dropped = MetricBuilder::new(&self.metrics)
                    .counter("lake_rows_dropped_by_merge", partition);
                let baseline = baseline.clone();
                let probed = stream::once(async move {
                    let index = index.await.map_err(DataFusionError::Shared)?;
                    Ok::<_, DataFusionError>(lake.and_then(move |batch| {
                        let _timer = baseline.elapsed_compute().timer();
                        let kept = match &index.index {
                            Some(index) => index.filter_lake(&codec, &batch).map_err(external),
                            None => Err(DataFusionError::Internal(
                                "a key merge probes a log range it did not fold".into(),
                            )),
                        };
                        std::future::ready(kept.and_then(|kept| {
                            dropped.add(batch.num_rows() - kept.num_rows());
                            Ok(kept.project(&output_columns)?)
                        }))
                    }))
                })
                .try_flatten();
                probed.chain(live).boxed()
            }
        };
        let output = merged.inspect_ok(move |batch| baseline.record_output(batch.num_rows()));
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            output,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
