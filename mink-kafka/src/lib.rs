//! mink's Kafka listener: Kafka clients read a table's log, follow it in consumer groups
//! and write into it (`mink server --kafka-listen`; `docs/kafka.md`).
//!
//! ```text
//!  Kafka client ──TCP/TLS──▶ connection (framing, SASL/PLAIN, one request at a time)
//!                                  │
//!     Metadata, FindCoordinator ───┤ cluster: one node leads every partition
//!     ListOffsets, OffsetCommit/Fetch ─ offsets: Earliest/Latest/Timestamp; committed offsets in meta.db
//!     Fetch ───────────────────────┤ fetch: Tail of each partition's bucket ──▶ records (log rows as record batches)
//!     Produce, InitProducerId ─────┤ produce: rows (records as rows) ──▶ node.write, idempotent sequences in meta.db
//!     Join/Sync/Heartbeat/Leave ───┘ groups: the classic group protocol, in memory
//! ```
//!
//! A topic is a table (`database.table`), a partition a bucket ([`topics`]), a Kafka
//! offset a log offset. Wire messages and record batches come from the `kafka-protocol`
//! crate (a patched copy, `vendor/README.md`); every size a client controls is bounded
//! ([`limits`]).

mod broker;
mod cluster;
mod compression;
mod connection;
mod error;
mod fetch;
mod groups;
mod limits;
mod offsets;
mod periodic;
mod produce;
mod records;
mod rows;
mod server;
mod topics;
mod versions;

pub use error::KafkaError;
pub use server::{KafkaHandle, KafkaOptions, ServeError, serve};
