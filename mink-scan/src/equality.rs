//! `EqualityDeleteExec`: the rows of a lake scan that no equality delete names.
//!
//! Its input scans the data files one set of equality-delete files applies to, in the read
//! columns followed by the equality columns the read lacks; each batch is filtered by the
//! loaded deletes ([`EqualityFilter`]: a hash probe per row, O(rows), where Iceberg's own
//! reader would evaluate `NOT (k = v1) AND NOT (k = v2) ...`) and cut back to the read
//! columns.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrow::compute::filter_record_batch;
use arrow::datatypes::SchemaRef;
use datafusion_common::{DataFusionError, Result};
use datafusion_execution::TaskContext;
use datafusion_physical_expr::EquivalenceProperties;
use datafusion_physical_plan::metrics::{
    BaselineMetrics, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion_physical_plan::stream::RecordBatchStreamAdapter;
use datafusion_physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties, SendableRecordBatchStream,
};
use futures::TryStreamExt;
use mink_lake::reader::EqualityFilter;

use crate::external;

/// A lake scan's rows minus those equality deletes name (see the module docs).
#[derive(Debug)]
pub struct EqualityDeleteExec {
    input: Arc<dyn ExecutionPlan>,
    filter: Arc<EqualityFilter>,
    /// The read columns: the input's first `kept` columns.
    kept: usize,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl EqualityDeleteExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, filter: Arc<EqualityFilter>, kept: usize) -> Self {
        let fields: Vec<_> = input.schema().fields().iter().take(kept).cloned().collect();
        let schema = Arc::new(arrow::datatypes::Schema::new(fields));
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(input.output_partitioning().partition_count()),
            input.pipeline_behavior(),
            input.boundedness(),
        );
        Self {
            input,
            filter,
            kept,
            schema,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// The deletes, as loaded.
    pub fn filter(&self) -> &EqualityFilter {
        &self.filter
    }

    /// How many of the input's columns (the read columns) are output.
    pub fn kept(&self) -> usize {
        self.kept
    }
}

impl DisplayAs for EqualityDeleteExec {
    fn fmt_as(&self, _format: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let columns: Vec<&str> = self.filter.columns().collect();
        write!(f, "EqualityDeleteExec: columns=[{}]", columns.join(", "))
    }
}

impl ExecutionPlan for EqualityDeleteExec {
    fn name(&self) -> &str {
        "EqualityDeleteExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [input]: [Arc<dyn ExecutionPlan>; 1] = children
            .try_into()
            .map_err(|_| DataFusionError::Internal("EqualityDeleteExec takes one input".into()))?;
        Ok(Arc::new(Self::new(
            input,
            Arc::clone(&self.filter),
            self.kept,
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let filter = Arc::clone(&self.filter);
        let schema = Arc::clone(&self.schema);
        let kept: Vec<usize> = (0..self.kept).collect();
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let deleted = MetricBuilder::new(&self.metrics).counter("rows_deleted", partition);
        let rows = self
            .input
            .execute(partition, context)?
            .and_then(move |batch| {
                let timer = baseline.elapsed_compute().timer();
                let live = filter.live(&batch).map_err(external).and_then(|live| {
                    let batch = match live {
                        Some(live) => {
                            deleted.add(live.false_count());
                            filter_record_batch(&batch, &live)?
                        }
                        None => batch,
                    };
                    Ok(batch.project(&kept)?)
                });
                timer.done();
                if let Ok(batch) = &live {
                    baseline.record_output(batch.num_rows());
                }
                std::future::ready(live)
            });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, rows)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
