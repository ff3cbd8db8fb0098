//! Statements counted and timed for `mink_sql_statements_total`,
//! `mink_sql_statement_seconds` and `mink_sql_rows_returned_total` (`mink_metrics`; the
//! memory pool's refusals are counted where they become a client's error,
//! `crate::error::status`).
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
    state: State,
}

/// Where a [`Recorded`] statement is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Running: dropped so, it was cancelled.
    Running,
    /// Ended, with this outcome label.
    Ended(&'static str),
    /// Counted elsewhere.
    Elsewhere,
}

impl Recorded {
    pub(crate) fn start(kind: StatementKind) -> Self {
        Self {
            kind,
            started: Instant::now(),
            state: State::Running,
        }
    }

    /// The statement ended with `result`.
    pub(crate) fn finish<T>(mut self, result: &Result<T, Status>) {
        self.state = State::Ended(outcome(result.as_ref().err().map(Status::code)));
    }

    /// The statement ended with `result`, a DataFusion error or not.
    pub(crate) fn finish_planned<T>(mut self, result: &Result<T, DataFusionError>) {
        self.state = State::Ended(outcome(result.as_ref().err().map(code)));
    }

    /// A query answered `rows` more rows.
    pub(crate) fn returned(&self, rows: usize) {
        (mink_metrics::metrics().statement_rows).inc_by(rows as u64);
    }

    /// A query's rows ended with `error`, or (`None`) all were sent; the first end
    /// counts (a stream may still end after its error).
    pub(crate) fn ended(&mut self, error: Option<&DataFusionError>) {
        if self.state == State::Running {
            self.state = State::Ended(outcome(error.map(code)));
        }
    }

    /// Not counted here: the statement goes on elsewhere (a query planned for a
    /// FlightInfo runs, and is counted, when its ticket is redeemed).
    pub(crate) fn continues(mut self) {
        self.state = State::Elsewhere;
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        let outcome = match self.state {
            State::Running => "cancelled",
            State::Ended(outcome) => outcome,
            State::Elsewhere => return,
        };
        let metrics = mink_metrics::metrics();
        let kind = self.kind.label();
        (metrics.statements.with_label_values(&[kind, outcome])).inc();
        (metrics.statement_seconds.with_label_values(&[kind]))
            .observe(self.started.elapsed().as_secs_f64());
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
