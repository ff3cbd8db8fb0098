//! mink in DataFusion: a catalog of mink tables whose scans are union splits.
//!
//! - [`catalog`]: every mink database as a schema, every table as a [`MinkTable`].
//! - [`table`]: planning a scan: one split per bucket (a union read, or a read of the
//!   KV store), filters pushed down.
//! - [`exec`]: [`MinkScanExec`], one partition per split.
//! - `split`: reading a split: lake Parquet from the object store, the tail from the
//!   bucket leader over Flight, merged by key.
//! - `filters`: DataFusion filters as mink column filters.
//! - [`system`]: `system.buckets` and `system.lake_snapshots`.
//! - `dml`: `INSERT`, `DELETE` and `UPDATE` as plans ending in a mink sink.
//! - [`changes`]: `table_changes('t', from, to)`, the rows changed between two lake
//!   snapshots.
//!
//! A query reads each bucket as it is when the query is planned: the lake below the
//! bucket's seam plus every change after it, exactly once (`spec/union-read.md`).

pub mod catalog;
pub mod changes;
mod dml;
pub mod exec;
mod filters;
mod split;
pub mod system;
pub mod table;

pub use catalog::{CATALOG_NAME, DEFAULT_DATABASE, MinkCatalog};
pub use changes::{TABLE_CHANGES, TableChanges};
pub use exec::MinkScanExec;
pub use split::CHANGELOG_COLUMNS;
pub use table::{MinkTable, ReadKind};
