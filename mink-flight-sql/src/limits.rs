//! The bounds of one Flight SQL call, in one place (`docs/security.md`, "Memory" and
//! "Request limits").
//!
//! A client controls the size of everything it sends: the messages of a call, the SQL
//! of a statement, the parameters it binds, the handles and tickets it sends back (which
//! carry the statement and its parameters, see [`super::handle`]), the batches it
//! ingests. Two kinds of bound hold them:
//!
//! - **the message**: no gRPC message is larger than [`MAX_MESSAGE_BYTES`] (refused by
//!   gRPC, `OUT_OF_RANGE`), and a statement's parameters, which travel back in one
//!   handle, are at most [`MAX_BOUND_PARAMETER_BYTES`] (refused, `RESOURCE_EXHAUSTED`);
//! - **the memory pool**: whatever a call holds on a client's behalf is reserved in the
//!   server's SQL memory pool (`--sql-memory-limit`) while it is held, so that all calls
//!   together stay within it: a call that does not fit fails alone with
//!   `RESOURCE_EXHAUSTED` (see [`super::memory`]).
//!
//! | what a call holds                               | bound                          | how     |
//! |-------------------------------------------------|--------------------------------|---------|
//! | one request message                             | [`MAX_MESSAGE_BYTES`] (256 MiB) | refused by gRPC (`OUT_OF_RANGE`) |
//! | calls open at once on one connection            | [`MAX_STREAMS_PER_CONNECTION`] (256) | HTTP/2 SETTINGS: the client waits |
//! | calls worked on at once per connection          | [`MAX_REQUESTS_PER_CONNECTION`] (256) | further calls queue |
//! | the headers of one call (read before the login) | [`MAX_HEADER_LIST_BYTES`] (64 KiB) | refused by HTTP/2 |
//! | one HTTP/2 frame                                | [`MAX_FRAME_BYTES`] (1 MiB) | HTTP/2 SETTINGS: the client sends smaller frames |
//! | the request message being received              | the pool, from its length prefix on, until the next message or the call's end | refused (`RESOURCE_EXHAUSTED`) |
//! | parameters bound to a prepared statement        | [`MAX_BOUND_PARAMETER_BYTES`] (256 MiB), and the pool: [`PARAMETER_COPIES`] times their bytes until the answer is sent | refused (`RESOURCE_EXHAUSTED`) |
//! | a statement handle or ticket sent back           | the pool: [`DECODED_COPIES`] times its bytes while its statement runs | refused (`RESOURCE_EXHAUSTED`) |
//! | a ticket a FlightInfo answers                   | the pool: [`ANSWER_COPIES`] times its parameters' or result's bytes until the answer is sent | refused (`RESOURCE_EXHAUSTED`) |
//! | a batch of an ingest or prepared update         | the pool: [`BATCH_COPIES`] times its bytes while it is written | refused (`RESOURCE_EXHAUSTED`) |
//! | the SQL of a statement planned                  | the pool: [`PLANNING_BYTES_PER_SQL_BYTE`] per byte of SQL while it is planned (an update: and run) | refused (`RESOURCE_EXHAUSTED`) |
//! | prepared statements, sessions                   | nothing is kept: handles carry the statement, session options are not stored | none |
//! | result streams running (the cancel registry)    | one entry per open `DoGet`, removed when it ends; its ticket is the call's message | the call's message |

/// The node protocol's bounds of a connection and a message, which the Flight SQL port
/// shares.
pub use mink_core::protocol::limits::{
    MAX_FRAME_BYTES, MAX_HEADER_LIST_BYTES, MAX_MESSAGE_BYTES, MAX_REQUESTS_PER_CONNECTION,
    MAX_STREAMS_PER_CONNECTION,
};

/// The most bytes of parameters (Arrow memory) one bind may carry: they travel back in
/// the statement handle, one message.
pub const MAX_BOUND_PARAMETER_BYTES: usize = MAX_MESSAGE_BYTES;

/// How many times a bind reserves its parameters' bytes: the batches received, the
/// handle answering the bind as Arrow IPC, and that handle in its answer message.
pub const PARAMETER_COPIES: usize = 3;

/// How many times a statement handle or ticket a client sends back is reserved beyond
/// its message: the decoded message's copy, its decoded parameters (or result), and the
/// values bound into the statement's plan.
pub const DECODED_COPIES: usize = 3;

/// How many times a ticket answered in a FlightInfo reserves the bytes it carries: the
/// ticket as Arrow IPC in its message, the ticket in the FlightInfo, and the FlightInfo
/// encoded for the wire.
pub const ANSWER_COPIES: usize = 3;

/// How many times a batch being written reserves its bytes beyond its message: the
/// decoded batch and the copy conformed to the table (or bound into a statement).
pub const BATCH_COPIES: usize = 2;

/// The bytes a statement's SQL is reserved at, per byte, while it is planned (an update
/// while it runs too): its tokens, its syntax tree, its logical and physical plans each
/// hold every list item again, many times the text's size. Measured on the server: 670
/// bytes per byte for a long `IN (...)` list, 1 400 for a long select list; a statement
/// of 1 MiB is thus refused under a pool of less than 1 GiB instead of growing the
/// server by as much.
pub const PLANNING_BYTES_PER_SQL_BYTE: usize = 1024;
