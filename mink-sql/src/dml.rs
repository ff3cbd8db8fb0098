//! Writes through SQL: `INSERT`, and `DELETE` / `UPDATE` on primary-key tables.
//!
//! ```text
//!   INSERT INTO t ...        input rows ─────────────────────────────► MinkSink(write)
//!   DELETE FROM t WHERE p    union scan of t ─► filter p ────────────► MinkSink(delete by key)
//!   UPDATE t SET c = e ...   union scan of t ─► filter p ─► c := e ──► MinkSink(write)
//! ```
//!
//! Every plan ends in DataFusion's `DataSinkExec`, which answers one row with the count.
//! `INSERT` appends to a log table and upserts into a primary-key table; an `UPDATE` is an
//! upsert of the changed rows (so it cannot change key columns). The rows go through the
//! client's pipelined [`TableWriter`]: routed to their buckets, each bucket's in order,
//! buckets side by side, each write acknowledged once durable, and the statement ends
//! once every write did. A statement is not atomic across buckets (a failure can leave
//! earlier batches written).

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::DFSchema;
use datafusion::datasource::sink::{DataSink, DataSinkExec};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, cast, col};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use futures::TryStreamExt;
use mink_client::{MinkClient, TableWriter, WriteKind};
use mink_core::key::key_columns;
use mink_core::table::TableDescriptor;

use crate::split::external;

/// Rows a statement's writes hold queued or in flight at once (see [`TableWriter`]).
const ROWS_IN_FLIGHT: usize = 1 << 18;

/// Writes a statement's rows to a mink table.
#[derive(Debug)]
struct MinkSink {
    table: Arc<TableDescriptor>,
    client: MinkClient,
    op: WriteKind,
    /// The rows it takes: the table's, or its key columns' for a delete.
    schema: SchemaRef,
}

impl MinkSink {
    fn new(table: Arc<TableDescriptor>, client: MinkClient, op: WriteKind) -> Result<Self> {
        let schema = match op {
            WriteKind::Write => Arc::clone(table.schema()),
            WriteKind::Delete => {
                let keys = key_columns(&table)
                    .iter()
                    .map(|column| table.schema().index_of(column))
                    .collect::<Result<Vec<_>, _>>()?;
                Arc::new(table.schema().project(&keys)?)
            }
        };
        Ok(Self {
            table,
            client,
            op,
            schema,
        })
    }
}

impl DisplayAs for MinkSink {
    fn fmt_as(&self, _format: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            WriteKind::Write if self.table.has_primary_key() => "upsert",
            WriteKind::Write => "append",
            WriteKind::Delete => "delete",
        };
        write!(f, "MinkSink: {op} into {}", self.table.path)
    }
}

#[async_trait]
impl DataSink for MinkSink {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    async fn write_all(
        &self,
        mut data: SendableRecordBatchStream,
        _context: &Arc<TaskContext>,
    ) -> Result<u64> {
        let table = Arc::clone(&self.table);
        let mut writer = TableWriter::new(&self.client, table, self.op, ROWS_IN_FLIGHT);
        let read = loop {
            match data.try_next().await {
                // A writer that refuses more has failed: `finish` says why.
                Ok(Some(batch)) => match writer.write(&batch).await {
                    Ok(()) => {}
                    Err(_) => break Ok(()),
                },
                Ok(None) => break Ok(()),
                Err(error) => break Err(error),
            }
        };
        // What was read before a failing input is written before the statement ends. A
        // failed write answers its client error, whose code the SQL endpoint keeps.
        let written = writer
            .finish()
            .await
            .map_err(|failed| external(failed.error));
        read?;
        written
    }
}

/// The plan of `INSERT INTO table <input>`.
pub(crate) fn insert(
    table: Arc<TableDescriptor>,
    client: MinkClient,
    input: Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let sink = MinkSink::new(table, client, WriteKind::Write)?;
    Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), None)))
}

/// The plan of `DELETE FROM table WHERE filters`: the keys of the matching rows, deleted.
pub(crate) fn delete(
    state: &dyn Session,
    table: Arc<TableDescriptor>,
    client: MinkClient,
    matching: Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn ExecutionPlan>> {
    require_primary_key(&table, "DELETE")?;
    let keys: Vec<Expr> = key_columns(&table).into_iter().map(col).collect();
    let keys = project(state, &table, matching, keys)?;
    let sink = MinkSink::new(table, client, WriteKind::Delete)?;
    Ok(Arc::new(DataSinkExec::new(keys, Arc::new(sink), None)))
}

/// The plan of `UPDATE table SET assignments WHERE filters`: the matching rows with the
/// assignments applied, upserted.
pub(crate) fn update(
    state: &dyn Session,
    table: Arc<TableDescriptor>,
    client: MinkClient,
    matching: Arc<dyn ExecutionPlan>,
    assignments: Vec<(String, Expr)>,
) -> Result<Arc<dyn ExecutionPlan>> {
    require_primary_key(&table, "UPDATE")?;
    let keys = key_columns(&table);
    if let Some((column, _)) = assignments.iter().find(|(c, _)| keys.contains(c)) {
        return Err(DataFusionError::Plan(format!(
            "UPDATE cannot change '{column}': it is part of the primary key of {}",
            table.path
        )));
    }
    let columns: Vec<Expr> = table
        .schema()
        .fields()
        .iter()
        .map(|field| {
            let name = field.name();
            match assignments.iter().find(|(column, _)| column == name) {
                Some((_, value)) => cast(value.clone(), field.data_type().clone()),
                None => col(name),
            }
            .alias(name)
        })
        .collect();
    let updated = project(state, &table, matching, columns)?;
    let sink = MinkSink::new(table, client, WriteKind::Write)?;
    Ok(Arc::new(DataSinkExec::new(updated, Arc::new(sink), None)))
}

fn require_primary_key(table: &TableDescriptor, statement: &str) -> Result<()> {
    if table.has_primary_key() {
        return Ok(());
    }
    Err(DataFusionError::Plan(format!(
        "{statement} needs a primary key: {} is a log table (append-only)",
        table.path
    )))
}

fn df_schema(table: &TableDescriptor) -> Result<DFSchema> {
    DFSchema::try_from(table.schema().as_ref().clone())
}

/// The rows of `scan` (all columns of the table) that match every filter.
pub(crate) fn filtered(
    state: &dyn Session,
    table: &TableDescriptor,
    scan: Arc<dyn ExecutionPlan>,
    filters: Vec<Expr>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let Some(predicate) = conjunction(filters) else {
        return Ok(scan);
    };
    let predicate = state.create_physical_expr(predicate, &df_schema(table)?)?;
    Ok(Arc::new(FilterExec::try_new(predicate, scan)?))
}

/// `input` (in the table's schema) projected to named expressions.
fn project(
    state: &dyn Session,
    table: &TableDescriptor,
    input: Arc<dyn ExecutionPlan>,
    exprs: Vec<Expr>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let schema = df_schema(table)?;
    let physical: Vec<(Arc<dyn PhysicalExpr>, String)> = exprs
        .into_iter()
        .map(|expr| {
            let name = expr.schema_name().to_string();
            Ok((state.create_physical_expr(expr, &schema)?, name))
        })
        .collect::<Result<_>>()?;
    Ok(Arc::new(ProjectionExec::try_new(physical, input)?))
}
