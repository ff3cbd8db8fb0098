//! Prepared statements: `?` placeholders numbered, and parameter batches read from the
//! client's `DoPut`.
//!
//! JDBC and ODBC write parameters as `?`; DataFusion numbers them `$1, $2, ...`. A
//! statement is prepared with each `?` outside quotes and comments rewritten to the next
//! `$n` (found by sqlparser's tokenizer, so `'?'` and `"?"` stay as they are). The
//! handle then carries that SQL and, once bound, the parameters (see
//! [`super::handle`]).
//!
//! An update runs once per parameter row, except the common case of a batch insert
//! (JDBC's `executeBatch`, ADBC's `executemany` of `INSERT INTO t VALUES (?, ?)`):
//! when the statement's only parameters are the values of its one `VALUES` row,
//! [`BatchInsert`] reads a whole batch of parameter rows in place of that `VALUES`, and
//! the batch is written in one execution.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow::datatypes::{Field, Schema};
use arrow_flight::FlightData;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use datafusion::catalog::MemTable;
use datafusion::common::Column;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::provider_as_source;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::expr::Placeholder;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, Values, WriteOp, cast};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use futures::{Stream, TryStreamExt};
use mink_core::ipc_guard::check_header;
use tonic::Status;

use crate::error::{arrow_status, invalid, put_stream_status};
use crate::limits::{MAX_BOUND_PARAMETER_BYTES, PARAMETER_COPIES};
use crate::memory::CallMemory;

/// `sql` with its `?` placeholders numbered `$1, $2, ...`; SQL that does not tokenize is
/// left as it is (planning reports the error).
pub(crate) fn positional(sql: &str) -> String {
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize_with_location() else {
        return sql.to_string();
    };
    let marks: HashSet<(u64, u64)> = tokens
        .iter()
        .filter(|t| matches!(&t.token, Token::Placeholder(p) if p == "?"))
        .map(|t| (t.span.start.line, t.span.start.column))
        .collect();
    if marks.is_empty() {
        return sql.to_string();
    }
    let mut out = String::with_capacity(sql.len() + marks.len() * 2);
    let (mut line, mut column, mut number) = (1, 1, 0);
    for c in sql.chars() {
        if c == '?' && marks.contains(&(line, column)) {
            number += 1;
            out.push_str(&format!("${number}"));
        } else {
            out.push(c);
        }
        if c == '\n' {
            (line, column) = (line + 1, 1);
        } else {
            column += 1;
        }
    }
    out
}

/// The parameters a client binds to a query: the batches of its `DoPut` as one batch,
/// `None` when it sent no rows. [`PARAMETER_COPIES`] times their bytes are kept in the
/// call's memory as they arrive: the batches, the handle answering the bind, and its
/// answer.
///
/// # Errors
/// `InvalidArgument` when the stream is not Arrow data; `ResourceExhausted` past
/// [`MAX_BOUND_PARAMETER_BYTES`], since the parameters travel back in the handle, one
/// message, or when the server's SQL memory cannot hold them.
pub(crate) async fn parameters(
    data: impl Stream<Item = Result<FlightData, Status>> + Send + Unpin + 'static,
    memory: &CallMemory,
) -> Result<Option<RecordBatch>, Status> {
    let mut stream = parameter_batches(data);
    let (mut batches, mut bytes) = (Vec::new(), 0);
    while let Some(batch) = stream.try_next().await? {
        let size = batch.get_array_memory_size();
        bytes += size;
        if bytes > MAX_BOUND_PARAMETER_BYTES {
            return Err(Status::resource_exhausted(format!(
                "parameters bound to a query are limited to {} MiB, since they travel in \
                 the statement handle: bind fewer rows",
                MAX_BOUND_PARAMETER_BYTES >> 20
            )));
        }
        memory.keep(PARAMETER_COPIES * size, "parameters bound to a statement")?;
        batches.push(batch);
    }
    let Some(first) = batches.first() else {
        return Ok(None);
    };
    let batch = concat_batches(first.schema_ref(), &batches).map_err(arrow_status)?;
    Ok(Some(batch))
}

/// The parameter rows of a client's `DoPut`, batch by batch as they arrive (empty
/// batches skipped).
pub(crate) fn parameter_batches(
    data: impl Stream<Item = Result<FlightData, Status>> + Send + Unpin + 'static,
) -> impl Stream<Item = Result<RecordBatch, Status>> + Send + Unpin + 'static {
    record_batches(data)
        .map_err(put_stream_status)
        .try_filter(|batch| std::future::ready(batch.num_rows() > 0))
}

/// The record batches of a client's `DoPut` stream. Messages without an Arrow header
/// (a first message carrying only the command) are skipped.
pub(crate) fn record_batches(
    data: impl Stream<Item = Result<FlightData, Status>> + Send + Unpin + 'static,
) -> FlightRecordBatchStream {
    let data = data
        .try_filter(|message| std::future::ready(!message.data_header.is_empty()))
        .and_then(|message| {
            let checked = check_header(&message.data_header).map(|()| message);
            std::future::ready(checked.map_err(invalid))
        })
        .map_err(FlightError::from);
    FlightRecordBatchStream::new_from_flight_data(data)
}

/// An `INSERT` whose parameters all sit in the one row of one `VALUES`: it can read a
/// whole batch of parameter rows at once, in place of that `VALUES`.
///
/// The `VALUES` is replaced by a projection over the parameter batch: each `$n` becomes
/// column `n` of the batch, cast to the type the planner gave the parameter, and each
/// value is cast to its `VALUES` column's type. The rows are thus written column by
/// column, as an ingest writes them, not bound one at a time.
#[derive(Debug)]
pub(crate) struct BatchInsert<'a> {
    planned: &'a LogicalPlan,
    template: Values,
}

impl<'a> BatchInsert<'a> {
    /// `planned` as a batch insert; `None` when it is not one (the statement then runs
    /// once per parameter row).
    pub(crate) fn of(planned: &'a LogicalPlan) -> Option<Self> {
        let template = parameterized_values(planned)?;
        Some(Self { planned, template })
    }

    /// The statement reading every row of `parameters`.
    pub(crate) fn reading(&self, parameters: &RecordBatch) -> Result<LogicalPlan> {
        read_parameters(self.planned, &self.template, parameters)
    }
}

/// The `VALUES` holding every parameter of an `INSERT`, if they are all there, in its
/// only row.
fn parameterized_values(planned: &LogicalPlan) -> Option<Values> {
    let LogicalPlan::Dml(dml) = planned else {
        return None;
    };
    if !matches!(dml.op, WriteOp::Insert(_)) {
        return None;
    }
    let mut found = Vec::new();
    let mut elsewhere = false;
    let _ = planned.apply_with_subqueries(|node| {
        let parameterized = node.expressions().iter().any(has_placeholder);
        match node {
            LogicalPlan::Values(values) if parameterized && values.values.len() == 1 => {
                found.push(values.clone());
            }
            _ => elsewhere |= parameterized,
        }
        Ok(TreeNodeRecursion::Continue)
    });
    match <[Values; 1]>::try_from(found) {
        Ok([values]) if !elsewhere => Some(values),
        _ => None,
    }
}

fn has_placeholder(expr: &Expr) -> bool {
    expr.exists(|e| Ok(matches!(e, Expr::Placeholder(_))))
        .unwrap_or(true)
}

/// The relation the parameters are read from.
const PARAMETERS: &str = "parameters";

fn read_parameters(
    planned: &LogicalPlan,
    template: &Values,
    parameters: &RecordBatch,
) -> Result<LogicalPlan> {
    // The parameter batch as a table whose column `$n` is named `pn`.
    let fields: Vec<Field> = (1..)
        .zip(parameters.schema().fields())
        .map(|(n, field)| Field::new(format!("p{n}"), field.data_type().clone(), true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(Arc::clone(&schema), parameters.columns().to_vec())?;
    let table = MemTable::try_new(schema, vec![vec![batch]])?;
    let scan = LogicalPlanBuilder::scan(PARAMETERS, provider_as_source(Arc::new(table)), None)?;
    let [row] = template.values.as_slice() else {
        return Err(DataFusionError::Internal(
            "a parameterized VALUES of one row".into(),
        ));
    };
    let columns = row
        .iter()
        .zip(template.schema.fields())
        .map(|(value, field)| {
            let read = value.clone().transform(|expr| match expr {
                Expr::Placeholder(placeholder) => Ok(Transformed::yes(parameter_column(
                    &placeholder,
                    parameters,
                )?)),
                other => Ok(Transformed::no(other)),
            })?;
            Ok(cast(read.data, field.data_type().clone()).alias(field.name()))
        })
        .collect::<Result<Vec<_>>>()?;
    let rows = scan.project(columns)?.build()?;
    let mut rows = Some(rows);
    let plan = planned
        .clone()
        .transform_up_with_subqueries(|node| match node {
            LogicalPlan::Values(values) if values == *template => match rows.take() {
                Some(rows) => Ok(Transformed::yes(rows)),
                None => Ok(Transformed::no(LogicalPlan::Values(values))),
            },
            other => Ok(Transformed::no(other)),
        })?;
    Ok(plan.data)
}

/// The column of the parameter batch a placeholder `$n` reads, as the parameter's type.
fn parameter_column(placeholder: &Placeholder, parameters: &RecordBatch) -> Result<Expr> {
    let n: usize = placeholder
        .id
        .strip_prefix('$')
        .and_then(|n| n.parse().ok())
        .filter(|n| (1..=parameters.num_columns()).contains(n))
        .ok_or_else(|| {
            DataFusionError::Plan(format!(
                "parameter {} is not bound: {} parameters were sent",
                placeholder.id,
                parameters.num_columns()
            ))
        })?;
    let column = Expr::Column(Column::new(Some(PARAMETERS), format!("p{n}")));
    Ok(match &placeholder.field {
        Some(field) => cast(column, field.data_type().clone()),
        None => column,
    })
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, Int32Array, StringArray};
    use arrow::datatypes::{Int64Type, UInt64Type};
    use arrow::ipc::CompressionType;
    use arrow::ipc::writer::IpcWriteOptions;
    use arrow_flight::encode::FlightDataEncoderBuilder;
    use datafusion::dataframe::DataFrame;
    use datafusion::prelude::SessionContext;
    use futures::StreamExt;

    use super::*;

    async fn context() -> SessionContext {
        let context = SessionContext::new();
        context
            .sql("CREATE TABLE t (id BIGINT, v VARCHAR)")
            .await
            .expect("create");
        context
    }

    async fn planned(context: &SessionContext, sql: &str) -> LogicalPlan {
        let frame = context
            .sql(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        frame.logical_plan().clone()
    }

    /// Three rows of parameters: ids 0, 1, 2 as Int32 (the table's column is BIGINT).
    fn parameters() -> RecordBatch {
        RecordBatch::try_from_iter(vec![
            ("0", Arc::new(Int32Array::from(vec![0, 1, 2])) as _),
            ("1", Arc::new(StringArray::from(vec!["a", "b", "c"])) as _),
        ])
        .expect("batch")
    }

    #[tokio::test]
    async fn a_batch_insert_reads_every_parameter_row() {
        let context = context().await;
        let sql = "INSERT INTO t VALUES ($1, upper($2)), ($1 + 10, 'x')";
        let mixed = planned(&context, sql).await;
        assert!(
            BatchInsert::of(&mixed).is_none(),
            "a second VALUES row: one row at a time"
        );

        let plan = planned(&context, "INSERT INTO t VALUES ($1 * 10, upper($2))").await;
        let bound = BatchInsert::of(&plan)
            .expect("a batch insert")
            .reading(&parameters())
            .expect("bound");
        let inserted = DataFrame::new(context.state(), bound)
            .collect()
            .await
            .expect("insert");
        assert_eq!(
            inserted[0].column(0).as_primitive::<UInt64Type>().value(0),
            3
        );
        let rows = context
            .sql("SELECT id, arrow_cast(v, 'Utf8') FROM t ORDER BY id")
            .await
            .expect("select")
            .collect()
            .await
            .expect("rows");
        let ids = rows[0].column(0).as_primitive::<Int64Type>();
        let values = rows[0].column(1).as_string::<i32>();
        assert_eq!(ids.values(), &[0, 10, 20]);
        assert_eq!(values.iter().flatten().collect::<Vec<_>>(), ["A", "B", "C"]);

        for sql in [
            "INSERT INTO t SELECT $1, $2",
            "INSERT INTO t SELECT column1, column2 FROM (VALUES ($1, $2)) WHERE $1 > 0",
            "SELECT * FROM (VALUES ($1, $2))",
        ] {
            let plan = planned(&context, sql).await;
            assert!(BatchInsert::of(&plan).is_none(), "{sql}");
        }
    }

    #[tokio::test]
    async fn a_parameter_the_batch_lacks_is_an_error() {
        let context = context().await;
        let plan = planned(&context, "INSERT INTO t VALUES ($1, $3)").await;
        let error = BatchInsert::of(&plan)
            .expect("a batch insert")
            .reading(&parameters())
            .expect_err("no $3");
        assert!(error.to_string().contains("$3 is not bound"), "{error}");
    }

    #[tokio::test]
    async fn bound_parameters_are_kept_in_the_memory_pool_or_refused() {
        let rows = RecordBatch::try_from_iter(vec![(
            "0",
            Arc::new(Int32Array::from_iter_values(0..25_000)) as _,
        )])
        .expect("100 KB of parameters");
        let size = rows.get_array_memory_size();
        let put = || async {
            let data = FlightDataEncoderBuilder::new()
                .build(futures::stream::iter([Ok(rows.clone())]))
                .map_err(Status::from)
                .collect::<Vec<_>>()
                .await;
            futures::stream::iter(data)
        };
        let pool = mink_sql::session::memory_pool(1 << 20);
        let memory = CallMemory::new(&pool, "DoPut");
        let bound = super::parameters(put().await, &memory).await.expect("fits");
        let bound = bound.expect("rows");
        assert_eq!(bound.num_rows(), 25_000);
        let decoded = bound.get_array_memory_size();
        assert_eq!(pool.reserved(), PARAMETER_COPIES * decoded);
        drop(memory);
        assert_eq!(pool.reserved(), 0, "released with the call");

        let small = mink_sql::session::memory_pool(2 * size);
        let memory = CallMemory::new(&small, "DoPut");
        let refused = super::parameters(put().await, &memory)
            .await
            .expect_err("over the pool");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");
        assert!(
            refused
                .message()
                .contains("parameters bound to a statement"),
            "{refused}"
        );
    }

    #[tokio::test]
    async fn compressed_batches_in_a_put_are_an_invalid_argument() {
        let encoded = |compression| async move {
            let options = IpcWriteOptions::default()
                .try_with_compression(compression)
                .expect("a codec");
            FlightDataEncoderBuilder::new()
                .with_options(options)
                .build(futures::stream::iter([Ok(parameters())]))
                .map_err(Status::from)
                .collect::<Vec<_>>()
                .await
        };
        let plain = parameter_batches(futures::stream::iter(encoded(None).await));
        let rows: Vec<RecordBatch> = plain.try_collect().await.expect("plain batches");
        assert_eq!(rows[0].num_rows(), 3);

        let compressed = encoded(Some(CompressionType::LZ4_FRAME)).await;
        let refused = parameter_batches(futures::stream::iter(compressed))
            .try_collect::<Vec<_>>()
            .await
            .expect_err("compressed");
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused}");
        assert!(
            refused
                .message()
                .contains("compressed Arrow IPC is not accepted"),
            "{refused}"
        );
    }

    #[test]
    fn question_marks_are_numbered_outside_quotes_and_comments() {
        assert_eq!(
            positional("SELECT * FROM t WHERE a = ? AND b IN (?, ?)"),
            "SELECT * FROM t WHERE a = $1 AND b IN ($2, $3)"
        );
        assert_eq!(
            positional("SELECT '?', \"?\" -- why?\n, ? /* ? */ FROM t WHERE x = ?"),
            "SELECT '?', \"?\" -- why?\n, $1 /* ? */ FROM t WHERE x = $2"
        );
        assert_eq!(positional("SELECT 'é', ?"), "SELECT 'é', $1");
        assert_eq!(
            positional("INSERT INTO t VALUES ($1, $2)"),
            "INSERT INTO t VALUES ($1, $2)"
        );
        assert_eq!(
            positional("SELECT 'unterminated ?"),
            "SELECT 'unterminated ?"
        );
    }
}
