//! The mink node: the leader of every bucket of every table in one process.
//!
//! - [`log`]: log tablets, the durable per-bucket log.
//! - [`kv`]: KV tablets, the current rows of primary-key tables.
//! - [`metadata`]: tables and partitions in SQLite.
//! - [`node`]: tables, tablets, validated writes.
//! - [`flight`]: the Arrow Flight service of `spec/reads.md`.
//! - [`tiering`]: copying logs into the Iceberg lake, exactly once.
//! - [`union`]: planning Union reads (the lake below the seam, then the log).
//! - [`lake_plan`]: planning Lake reads and the changes between two lake snapshots.
//! - [`server`]: serving the node on a socket.

pub mod error;
pub mod flight;
pub mod kv;
pub mod lake_plan;
pub mod log;
pub mod metadata;
pub mod node;
pub mod server;
pub mod tiering;
pub mod union;

pub use error::{NodeError, Result};
pub use node::{Node, NodeConfig};
