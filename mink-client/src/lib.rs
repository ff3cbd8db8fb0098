//! A typed async client of the mink node's Flight protocol (`docs/design.md#read-protocol`).
//!
//! ```no_run
//! # async fn example() -> mink_client::Result<()> {
//! use mink_client::MinkClient;
//! use mink_core::table::TablePath;
//!
//! let client = MinkClient::connect("127.0.0.1:9123").await?;
//! let table = client.describe_table(&TablePath::parse("events")?).await?;
//! for status in client.list_buckets(&table.path).await? {
//!     let bucket = status.bucket.expect("the node names every bucket");
//!     let answer = client.scan(&bucket, status.log_start, 0, &[]).await?;
//!     println!("{bucket}: {} batches", answer.batches.len());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! In a cluster, every call about one bucket goes to the node leading it, following the
//! NotLeader answers of the others ([`FOLLOW_FOR`]): a client connected to any node
//! reads and writes every bucket.
//!
//! Reads come back normalized: every batch has the schema of the read's first schema
//! message (the table's current schema, projected), whatever schema version it was
//! written with.

mod client;
mod error;
mod leaders;
mod pieces;
mod read;
mod writer;

pub use client::{ConnectOptions, MinkClient};
pub use error::{ClientError, Result};
pub use leaders::FOLLOW_FOR;
pub use mink_auth::Credentials;
pub use read::{LookupResult, ReadAnswer, ReadBatch, SnapshotAnswer, Tailer, UnionAnswer};
pub use writer::{TableWriter, WriteFailed, WriteKind};
