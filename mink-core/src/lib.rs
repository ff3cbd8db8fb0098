//! mink's pure model: everything about tables, changes and the read protocol that can be
//! said without I/O.
//!
//! - [`table`]: table descriptors, schema versions and their options.
//! - [`change`]: the change types of a primary-key changelog.
//! - [`bucket`]: which bucket a row belongs to (Iceberg's bucket transform).
//! - [`filter`]: column filters pushed down into reads.
//! - [`ipc_guard`]: refusing compressed Arrow IPC from clients before it is decoded.
//! - [`ipc_stream`]: walking an Arrow IPC stream message by message.
//! - [`key`]: memcomparable keys and stored rows of primary-key tables.
//! - [`merge`]: the key merge of a union read (lake rows plus changelog range).
//! - [`partition`]: partition names built from partition-key values.
//! - [`protocol`]: the wire messages of the bucket leader's Flight protocol.
//! - [`routing`]: which bucket and partition each row of a batch belongs to.
//! - [`schema`]: normalizing batches of older schema versions to a newer one.
//!
//! Nothing here touches a file, a socket or a runtime; the node, the client and the SQL
//! engine share it.

pub mod bucket;
pub mod change;
pub mod clock;
pub mod error;
pub mod filter;
pub mod ipc_guard;
pub mod ipc_stream;
pub mod key;
pub mod log_range;
pub mod merge;
pub mod options;
pub mod partition;
pub mod protocol;
pub mod routing;
pub mod schema;
pub mod table;

pub use error::{CoreError, Result};
