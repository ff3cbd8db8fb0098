//! mink's Kafka listener: Kafka clients read a table's log, follow it in consumer groups
//! and write into it (`mink server --kafka-listen`; `docs/kafka.md`).
//!
//! ```text
//!  Kafka client ──TCP/TLS──▶ connection (framing, SASL/PLAIN, one request at a time)
//!                                  │
//!     Metadata, FindCoordinator ───┤ cluster: each partition's leader, each group's coordinator (brokers)
//!     ListOffsets, OffsetCommit/Fetch ─ offsets: Earliest/Latest/Timestamp; committed offsets in the state
//!     Fetch ───────────────────────┤ fetch: Tail of each partition's bucket ──▶ records (log rows as record batches)
//!     Produce, InitProducerId ─────┤ produce: rows (records as rows) ──▶ node.write, idempotent sequences in the state
//!     Join/Sync/Heartbeat/Leave ───┘ groups: the classic group protocol, in memory
//! ```
//!
//! A topic is a table (`database.table`), a partition a bucket ([`topics`]), a Kafka
//! offset a log offset. A single node is the one broker; in a cluster every node is a
//! broker, leading the partitions whose buckets it leads and coordinating a share of the
//! groups ([`brokers`]), and the state (committed offsets, producer ids and last
//! batches) is in the cluster's etcd instead of the node's `meta.db` ([`state`]). Wire messages and record batches come from the `kafka-protocol`
//! crate (a patched copy, `vendor/README.md`); every size a client controls is bounded
//! ([`limits`]).

mod broker;
mod brokers;
mod cluster;
mod compression;
mod connection;
mod error;
mod fetch;
mod groups;
mod lag;
mod limits;
mod offsets;
mod periodic;
mod produce;
mod records;
mod rows;
mod server;
mod state;
mod topics;
mod versions;

pub use error::KafkaError;
pub use server::{GroupLag, KafkaHandle, KafkaOptions, ServeError, serve};
