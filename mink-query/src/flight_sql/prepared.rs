//! Prepared statements: `?` placeholders numbered, and parameter batches read from the
//! client's `DoPut`.
//!
//! JDBC and ODBC write parameters as `?`; DataFusion numbers them `$1, $2, ...`. A
//! statement is prepared with each `?` outside quotes and comments rewritten to the next
//! `$n` (found by sqlparser's tokenizer, so `'?'` and `"?"` stay as they are). The
//! handle then carries that SQL and, once bound, the parameters (see
//! [`super::handle`]).

use std::collections::HashSet;

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow_flight::FlightData;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use futures::{Stream, TryStreamExt};
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
/// `InvalidArgument` when the stream is not Arrow data.
pub(crate) async fn parameters(
    data: impl Stream<Item = Result<FlightData, Status>> + Send + Unpin + 'static,
) -> Result<Option<RecordBatch>, Status> {
    let batches: Vec<RecordBatch> = parameter_batches(data).try_collect().await?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
