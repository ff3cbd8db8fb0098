//! mink's SQL engine: DataFusion over a catalog of mink tables whose scans are union
//! splits, and the [`session`] that runs every statement kind (queries, DML, DDL, `CALL`).
//!
//! - [`session`]: [`MinkSession`], one SQL session over a mink node; mink's own DDL
//!   (`CREATE TABLE ... WITH`, `DROP`, `ALTER ... ADD COLUMN`) and `CALL system.*`.
//! - [`catalog`]: every mink database as a schema, every table as a [`MinkTable`].
//! - [`table`]: planning a scan: one split per bucket (a union read, or a read of the
//!   KV store), filters pushed down.
//! - [`exec`]: [`MinkScanExec`], one partition per split.
//! - `union`: a union read as plan nodes: DataFusion's Parquet scan of the lake, the log
//!   tails from the bucket leaders over Flight, and the key merge.
//! - `split`: reading a split a partition at a time: the KV store's reads, changelogs,
//!   and union splits the plan nodes cannot read (equality deletes).
//! - `filters`: DataFusion filters as mink column filters.
//! - [`system`]: `system.buckets` and `system.lake_snapshots`.
//! - `dml`: `INSERT`, `DELETE` and `UPDATE` as plans ending in a mink sink.
//! - [`changes`]: `table_changes('t', from, to)`, the rows changed between two lake
//!   snapshots.
//! - [`distributed`]: statements run on `mink worker` processes (datafusion-distributed),
//!   a table's union read cut into tasks by bucket.
//!
//! A query reads each bucket as it is when the query is planned: the lake below the
//! bucket's seam plus every change after it, exactly once (`docs/design.md#union-read`).

pub mod catalog;
pub mod changes;
pub mod distributed;
mod dml;
pub mod exec;
mod filters;
pub mod session;
mod split;
pub mod system;
pub mod table;
mod union;

pub use catalog::{CATALOG_NAME, DEFAULT_DATABASE, MinkCatalog};
pub use changes::{TABLE_CHANGES, TableChanges};
pub use exec::MinkScanExec;
pub use session::MinkSession;
pub use split::CHANGELOG_COLUMNS;
pub use table::{MinkTable, ReadKind};
