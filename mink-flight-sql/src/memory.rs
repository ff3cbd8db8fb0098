//! What a call holds on a client's behalf, reserved in the server's SQL memory pool.
//!
//! Every statement's operators draw on one DataFusion memory pool
//! (`--sql-memory-limit`, see `mink_sql::session::runtime`). The buffers a client makes
//! the server hold outside any operator draw on it too, so that a flood of calls cannot
//! grow the server past the limit: each call is one consumer of the pool, its
//! [`CallMemory`], named after the call (`Flight SQL
//! /arrow.flight.protocol.FlightService/DoPut`), and in it are reserved, before they are
//! allocated:
//!
//! - the request message being received, from the moment its length prefix arrives
//!   (the server's [`super::metered`] layer), so that a call announcing a large message
//!   is refused before the message is buffered;
//! - the parameters a bind collects, and the handle answering it;
//! - a handle or ticket the client sends back, decoded, and its parameters bound;
//! - the ticket a FlightInfo answers;
//! - a batch being ingested or run as parameters of an update;
//! - the plans of a statement while it is planned (or, for an update, run), at
//!   [`PLANNING_BYTES_PER_SQL_BYTE`] per byte of its SQL.
//!
//! What a call keeps ([`CallMemory::keep`]) is released when the call ends: when its
//! answer has been handed to the connection and its request is gone. The message being
//! received ([`CallMemory::receive`]) is released when the next one arrives, or when the
//! call ends. What the call holds for a while ([`CallMemory::hold`], a batch being
//! written) is released when the [`Held`] is dropped.
//!
//! Sizes are what the server allocates, some counted more than once where two copies
//! may share memory, so the reservations err on the side of the pool. A reservation the
//! pool cannot grant fails the call with `RESOURCE_EXHAUSTED`, naming what did not fit
//! and the pool's largest consumers; the other calls and statements go on.

use std::sync::Arc;

use datafusion::error::DataFusionError;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use tonic::{Request, Status};

use crate::error::status;
use crate::limits::PLANNING_BYTES_PER_SQL_BYTE;

/// The memory one call holds, reserved in the SQL memory pool (see the module docs).
/// Clones share the reservations; they are released when the last is dropped.
#[derive(Debug, Clone)]
pub(crate) struct CallMemory {
    kept: Arc<MemoryReservation>,
    message: Arc<MemoryReservation>,
}

/// Memory held for a while, released when dropped.
#[derive(Debug)]
pub(crate) struct Held {
    _reservation: MemoryReservation,
}

impl CallMemory {
    /// The memory of a new call named `call`, in `pool`.
    pub(crate) fn new(pool: &Arc<dyn MemoryPool>, call: &str) -> Self {
        let kept = MemoryConsumer::new(format!("Flight SQL {call}")).register(pool);
        let message = kept.new_empty();
        Self {
            kept: Arc::new(kept),
            message: Arc::new(message),
        }
    }

    /// Reserves a request message of `bytes` about to be received, in place of the one
    /// before: once decoded, that one lives on in what the handler holds, which the
    /// handler reserves itself.
    ///
    /// # Errors
    /// `ResourceExhausted` when the pool cannot grant them.
    pub(crate) fn receive(&self, bytes: usize) -> Result<(), Status> {
        self.message.free();
        self.message
            .try_grow(bytes)
            .map_err(|error| exhausted(error, bytes, "a request message"))
    }

    /// The memory of the call `request` belongs to (the [`super::metered`] layer gives
    /// every call one).
    ///
    /// # Errors
    /// `Internal` when the call has none (a server built without the layer: a bug).
    pub(crate) fn of<T>(request: &Request<T>) -> Result<Self, Status> {
        request
            .extensions()
            .get::<Self>()
            .cloned()
            .ok_or_else(|| Status::internal("a Flight SQL call without its memory account"))
    }

    /// Reserves `bytes` for `what` until the call ends.
    ///
    /// # Errors
    /// `ResourceExhausted` when the pool cannot grant them.
    pub(crate) fn keep(&self, bytes: usize, what: &str) -> Result<(), Status> {
        self.kept
            .try_grow(bytes)
            .map_err(|error| exhausted(error, bytes, what))
    }

    /// Reserves what planning `sql` holds (its tokens, syntax tree and plans) until the
    /// answer is dropped: once the statement is planned, or has run.
    ///
    /// # Errors
    /// `ResourceExhausted` when the pool cannot grant it.
    pub(crate) fn planning(&self, sql: &str) -> Result<Held, Status> {
        let what = format!("the plans of a statement of {}", human(sql.len()));
        self.hold(PLANNING_BYTES_PER_SQL_BYTE * sql.len(), &what)
    }

    /// Reserves `bytes` for `what` until the answer is dropped.
    ///
    /// # Errors
    /// `ResourceExhausted` when the pool cannot grant them.
    pub(crate) fn hold(&self, bytes: usize, what: &str) -> Result<Held, Status> {
        let held = self.kept.new_empty();
        held.try_grow(bytes)
            .map_err(|error| exhausted(error, bytes, what))?;
        Ok(Held { _reservation: held })
    }

    /// The bytes the call holds now.
    #[cfg(test)]
    pub(crate) fn kept(&self) -> usize {
        self.kept.size()
    }
}

/// The status of a reservation the pool refused: `ResourceExhausted`, saying what did not
/// fit, then DataFusion's message naming the pool's largest consumers.
fn exhausted(error: DataFusionError, bytes: usize, what: &str) -> Status {
    status(error.context(format!(
        "no room in the server's SQL memory (--sql-memory-limit) for {what} ({})",
        human(bytes)
    )))
}

/// A size for a message: `12.5 MiB`, `300 B`.
fn human(bytes: usize) -> String {
    match bytes {
        0..1024 => format!("{bytes} B"),
        1024..1_048_576 => format!("{:.1} KiB", bytes as f64 / 1024.0),
        _ => format!("{:.1} MiB", bytes as f64 / 1_048_576.0),
    }
}

#[cfg(test)]
mod tests {
    use mink_sql::session::memory_pool;
    use tonic::Code;

    use super::*;

    #[test]
    fn a_call_keeps_until_it_ends_and_holds_until_dropped() {
        let pool = memory_pool(1 << 20);
        let call = CallMemory::new(&pool, "DoPut");
        call.keep(600 << 10, "parameters").expect("fits");
        let held = call.hold(300 << 10, "a batch").expect("fits");
        assert_eq!(pool.reserved(), 900 << 10);

        let refused = call.hold(200 << 10, "another batch").expect_err("full");
        assert_eq!(refused.code(), Code::ResourceExhausted, "{refused}");
        assert!(
            refused
                .message()
                .contains("SQL memory (--sql-memory-limit) for another batch (200.0 KiB)"),
            "{refused}"
        );
        assert!(
            refused.message().contains("Flight SQL DoPut"),
            "names the call: {refused}"
        );
        drop(held);
        assert_eq!(pool.reserved(), 600 << 10);
        let clone = call.clone();
        drop(call);
        assert_eq!(clone.kept(), 600 << 10, "kept while a clone lives");
        drop(clone);
        assert_eq!(pool.reserved(), 0);
    }

    #[test]
    fn sizes_read_in_units() {
        assert_eq!(human(300), "300 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(200 << 20), "200.0 MiB");
    }
}
