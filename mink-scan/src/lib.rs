//! The union read (`docs/design.md#union-read`) as DataFusion physical plan nodes, one path for
//! every place it runs: the bucket leader's Union and Lake tickets execute the plan and
//! encode its batches for Flight; the SQL engine puts the same nodes under its own
//! operators.
//!
//! ```text
//!   FilterExec (exact filters; projection to the columns asked for)
//!     KeyMergeExec                          primary-key table: lake minus changed keys,
//!       DataSourceExec (ParquetSource)        then the log ranges' live rows
//!       LogRangeExec
//!   or UnionExec(DataSourceExec, LogRangeExec)   log table: lake rows, then range rows
//! ```
//!
//! - [`lake_scan`]: the lake side, DataFusion's own Parquet scan with Iceberg's position
//!   deletes as row selections and pruning from any predicate; [`equality`] applies
//!   other engines' equality deletes; [`fetch`] counts the row groups it fetches in the
//!   query's memory pool.
//! - [`log_range`]: the log side, over a [`log_range::LogSource`] (the leader's own log, or Flight
//!   Scans of it from the engine): a range's rows or changes, or its live rows as the
//!   leader folded them.
//! - [`merge`]: the key merge around mink-core's [`mink_core::merge::LogRangeIndex`].
//! - [`union`]: builds the tree from a table's planned splits.
//! - [`codec`]: the nodes as bytes, so a plan can be shipped to another process.
//! - [`filters`]: the wire form of filters ([`mink_core::filter::ColumnFilter`]) as
//!   physical expressions.
//!
//! The crate builds on DataFusion's physical layer only (`datafusion-physical-plan`,
//! `datafusion-datasource-parquet`), so the node does not pull in its SQL layer.

pub mod codec;
pub mod equality;
pub mod fetch;
pub mod filters;
pub mod lake_scan;
pub mod log_range;
pub mod merge;
pub mod union;

use datafusion_common::DataFusionError;
// Used by the integration tests only.
#[cfg(test)]
use {tempfile as _, tokio as _};

/// Any error of mink's crates, as DataFusion's.
pub fn external(error: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
    DataFusionError::External(Box::new(error))
}
