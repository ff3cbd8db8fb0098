//! The mink node: the leader of every bucket of every table in one process.
//!
//! The storage engine is below it: [`mink_log`] keeps each bucket's durable log, and
//! [`mink_kv`] the current rows of primary-key tables, fed by the log through its
//! changelog hook ([`mink_log::Changelog`]). The node holds the rest:
//!
//! - [`metadata`]: tables and partitions, in SQLite on one node, in etcd in a cluster.
//! - [`cluster`]: membership, the controller and bucket leadership over etcd.
//! - `node`: tables, tablets, validated writes, and the planning of Union and Lake reads:
//!   every method of [`Node`], one file per job. Its types are re-exported here
//!   ([`Node`], [`NodeConfig`], [`Bucket`], ...), its Union planning as [`union`].
//! - [`flight`]: the Arrow Flight service of `docs/design.md#read-protocol`.
//! - [`tiering`]: copying logs into the Iceberg lake, exactly once.
//! - `lake_index`: where each key's live lake row is, which tiering keeps for its
//!   position deletes and Union planning reads to locate the lake rows a read replaces.
//! - [`server`]: serving the node on a socket.

pub mod cluster;
pub mod error;
pub mod flight;
mod lake_index;
pub mod metadata;
mod node;
pub mod server;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tiering;

pub use error::{NodeError, Result};
pub use node::{
    Bucket, CheckpointPass, DEFAULT_KV_CHECKPOINT_INTERVAL, DEFAULT_MAX_BUCKET_NUM,
    DEFAULT_MAX_PARTITIONS, Failpoint, Node, NodeConfig, bucket_key, raise_open_file_limit, union,
};
