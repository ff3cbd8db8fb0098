//! Statements counted and timed for `mink_sql_statements_total`,
//! `mink_sql_statement_seconds`, `mink_sql_rows_returned_total` and
//! `mink_sql_memory_refusals_total` (`mink_metrics`).
//!
//! A [`Recorded`] statement is counted when it is dropped, with the outcome it was
//! given: `ok`, `invalid` (the client's statement: a bad query, an unknown table),
//! `exhausted` (the memory pool refused it), `failed` (the server's error), or
//! `cancelled` when it ends with none (a client that stops reading a query's rows).

use std::time::Instant;

use datafusion::error::DataFusionError;
use tonic::{Code, Status};

use crate::error::code;
use crate::statement::StatementKind;

/// A statement being run, counted when dropped.
#[derive(Debug)]
pub(crate) struct Recorded {
    kind: StatementKind,
    started: Instant,
    outcome: &'static str,
}

impl Recorded {
    pub(crate) fn start(kind: StatementKind) -> Self {
        Self {
            kind,
            started: Instant::now(),
            outcome: "cancelled",
        }
    }

    /// The statement ended with `result`.
    pub(crate) fn finish<T>(mut self, result: &Result<T, Status>) {
        self.outcome = outcome(result.as_ref().err().map(Status::code));
    }

    /// The statement ended with `result`, a DataFusion error or not.
    pub(crate) fn finish_planned<T>(mut self, result: &Result<T, DataFusionError>) {
        self.outcome = outcome(result.as_ref().err().map(code));
    }

    /// A query answered `rows` more rows.
    pub(crate) fn returned(&self, rows: usize) {
        (mink_metrics::metrics().statement_rows).inc_by(rows as u64);
    }

    /// A query's rows ended with `error`, or (`None`) all were sent; the first end
    /// counts (a stream may still end after its error).
    pub(crate) fn ended(&mut self, error: Option<&DataFusionError>) {
        if self.outcome == "cancelled" {
            self.outcome = outcome(error.map(code));
        }
    }

    /// Not counted here: the statement goes on elsewhere (a query planned for a
    /// FlightInfo runs, and is counted, when its ticket is redeemed).
    pub(crate) fn continues(mut self) {
        self.outcome = "";
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        if self.outcome.is_empty() {
            return;
        }
        let metrics = mink_metrics::metrics();
        let kind = self.kind.label();
        (metrics.statements.with_label_values(&[kind, self.outcome])).inc();
        (metrics.statement_seconds.with_label_values(&[kind]))
            .observe(self.started.elapsed().as_secs_f64());
        if self.outcome == "exhausted" {
            metrics.memory_refusals.inc();
        }
    }
}

/// The outcome label of a statement that ended with an error of `code`, or none.
fn outcome(code: Option<Code>) -> &'static str {
    match code {
        None => "ok",
        Some(Code::ResourceExhausted) => "exhausted",
        Some(
            Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::Unimplemented
            | Code::PermissionDenied,
        ) => "invalid",
        Some(Code::Cancelled) => "cancelled",
        Some(_) => "failed",
    }
}
