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
//! [`bind_rows`] binds a whole batch of parameter rows as the rows of that `VALUES`,
//! and the batch is written in one execution.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow_flight::FlightData;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use datafusion::common::ParamValues;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, LogicalPlan, Values, WriteOp};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use futures::{Stream, TryStreamExt};
use mink_node::server::MAX_MESSAGE_BYTES;
use tonic::Status;

use crate::flight_sql::error::{arrow_status, invalid, put_stream_status};
use crate::flight_sql::ipc_guard::check_header;

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
/// `None` when it sent no rows.
///
/// # Errors
/// `InvalidArgument` when the stream is not Arrow data; `ResourceExhausted` past
/// [`MAX_MESSAGE_BYTES`], since the parameters travel back in the handle, one message.
pub(crate) async fn parameters(
    data: impl Stream<Item = Result<FlightData, Status>> + Send + Unpin + 'static,
) -> Result<Option<RecordBatch>, Status> {
    let mut stream = parameter_batches(data);
    let (mut batches, mut bytes) = (Vec::new(), 0);
    while let Some(batch) = stream.try_next().await? {
        bytes += batch.get_array_memory_size();
        if bytes > MAX_MESSAGE_BYTES {
            return Err(Status::resource_exhausted(format!(
                "parameters bound to a query are limited to {} MB, since they travel in \
                 the statement handle: bind fewer rows",
                MAX_MESSAGE_BYTES >> 20
            )));
        }
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

/// `planned` with every row of `rows` bound, as the rows of its `VALUES`, when it is an
/// `INSERT` whose parameters all sit in the one row of one `VALUES`; `None` otherwise
/// (the statement then runs once per row). Each row is bound by DataFusion's own
/// parameter binding, so values are checked and typed as they would be one at a time.
pub(crate) fn bind_rows(
    planned: &LogicalPlan,
    rows: &[ParamValues],
) -> Option<Result<LogicalPlan>> {
    let template = parameterized_values(planned)?;
    Some(bind_values(planned, &template, rows))
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

fn bind_values(
    planned: &LogicalPlan,
    template: &Values,
    rows: &[ParamValues],
) -> Result<LogicalPlan> {
    let mut bound = Vec::with_capacity(rows.len());
    let mut schema = Arc::clone(&template.schema);
    for values in rows {
        let LogicalPlan::Values(row) =
            LogicalPlan::Values(template.clone()).replace_params_with_values(values)?
        else {
            return Err(DataFusionError::Internal("binding changed VALUES".into()));
        };
        schema = row.schema;
        bound.extend(row.values);
    }
    let mut bound = Some(Values {
        schema,
        values: bound,
    });
    let plan = planned
        .clone()
        .transform_up_with_subqueries(|node| match node {
            LogicalPlan::Values(values) if values == *template => match bound.take() {
                Some(all) => Ok(Transformed::yes(LogicalPlan::Values(all))),
                None => Ok(Transformed::no(LogicalPlan::Values(values))),
            },
            other => Ok(Transformed::no(other)),
        })?;
    Ok(plan.data)
}

#[cfg(test)]
mod tests {
    use datafusion::common::ScalarValue;
    use datafusion::prelude::SessionContext;

    use super::*;

    async fn planned(sql: &str) -> LogicalPlan {
        let context = SessionContext::new();
        context
            .sql("CREATE TABLE t (id BIGINT, v VARCHAR)")
            .await
            .expect("create");
        let frame = context
            .sql(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        frame.logical_plan().clone()
    }

    fn rows(n: i64) -> Vec<ParamValues> {
        (0..n)
            .map(|i| {
                ParamValues::from(vec![
                    ScalarValue::Int64(Some(i)),
                    ScalarValue::Utf8(Some(format!("v{i}"))),
                ])
            })
            .collect()
    }

    fn values_rows(plan: &LogicalPlan) -> Vec<usize> {
        let mut rows = Vec::new();
        plan.apply_with_subqueries(|node| {
            if let LogicalPlan::Values(values) = node {
                rows.push(values.values.len());
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .expect("walk");
        rows
    }

    #[tokio::test]
    async fn a_batch_insert_binds_every_row_into_its_values() {
        let plan = planned("INSERT INTO t VALUES ($1, $2)").await;
        let bound = bind_rows(&plan, &rows(3))
            .expect("a batch insert")
            .expect("bound");
        assert_eq!(values_rows(&bound), [3]);
        assert!(!bound.expressions().iter().any(has_placeholder));
        let mixed = bind_rows(
            &planned("INSERT INTO t VALUES ($1, $2), (9, 'x')").await,
            &rows(2),
        );
        assert!(mixed.is_none(), "a second VALUES row: one row at a time");
        for sql in [
            "INSERT INTO t SELECT $1, $2",
            "INSERT INTO t SELECT column1, column2 FROM (VALUES ($1, $2)) WHERE $1 > 0",
            "SELECT * FROM (VALUES ($1, $2))",
        ] {
            assert!(bind_rows(&planned(sql).await, &rows(2)).is_none(), "{sql}");
        }
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
