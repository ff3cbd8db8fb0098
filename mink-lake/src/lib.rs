//! mink's lake: the Iceberg side of mink, shared by the node (tiering, Union and Lake
//! reads) and the SQL engine.
//!
//! - [`catalog`]: the SQL catalog and the object store, lake tables' lifecycle.
//! - [`storage`]: Iceberg's FileIO over `object_store`, so one store serves everything.
//! - [`layout`]: columns, partition spec and file layout of a lake table.
//! - [`predicate`]: column filters as an Iceberg predicate (file pruning).
//! - [`offsets`]: the per-bucket log offsets a snapshot was tiered up to.
//! - [`writer`]: writing a tiering round's files and committing its snapshot.
//! - [`commit`]: committing a snapshot at Iceberg's metadata layer, with our own
//!   compare-and-swap (adds, deletes and replaces; conflicts are never rebased).
//! - [`deletes`]: position and equality delete files.
//! - [`reader`]: planning a bucket's split and streaming its Parquet files.
//! - [`changes`]: the rows changed between two snapshots (incremental reads).
//! - [`upkeep`]: expiring snapshots, removing orphan files, what a table holds.

pub mod catalog;
pub mod changes;
pub mod commit;
pub mod deletes;
pub mod error;
pub mod layout;
pub mod offsets;
pub mod predicate;
pub mod reader;
pub mod storage;
pub mod upkeep;
pub mod writer;

pub use catalog::{Lake, LakeConfig, S3Options};
pub use error::{LakeError, Result};
/// Iceberg types that cross the crate's API.
pub use iceberg::spec::{DataFile, Operation, Struct};
pub use iceberg::table::Table as LakeTable;

// Used by the integration tests only.
#[cfg(test)]
use tempfile as _;
