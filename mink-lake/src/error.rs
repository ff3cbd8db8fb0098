//! The lake's error type.

/// What a lake operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum LakeError {
    /// The Iceberg catalog or table layer failed (unreachable catalog, conflict, ...).
    #[error("iceberg: {0}")]
    Iceberg(#[from] iceberg::Error),
    /// The object store failed (unreachable, missing file, ...).
    #[error("object store: {0}")]
    ObjectStore(#[from] object_store::Error),
    /// A Parquet file could not be read.
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// An Arrow kernel failed.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// The catalog database failed.
    #[error("catalog database: {0}")]
    Catalog(#[from] sqlx::Error),
    /// A model-level error.
    #[error(transparent)]
    Core(#[from] mink_core::CoreError),
    /// No such snapshot in the lake table.
    #[error("lake table {table} has no snapshot {snapshot_id}")]
    SnapshotNotFound {
        /// The table.
        table: String,
        /// The snapshot asked for.
        snapshot_id: i64,
    },
    /// An incremental read between two snapshots where the first is not an ancestor of
    /// the second: no lineage leads from one to the other.
    #[error(
        "lake table {table}: snapshot {from} is not an ancestor of snapshot {to}: \
         changes are read from an older snapshot to a newer one of the same lineage"
    )]
    NotAncestor {
        /// The table.
        table: String,
        /// The snapshot the changes would start after.
        from: i64,
        /// The snapshot they would end at.
        to: i64,
    },
    /// An incremental read of a range no change set can express: a snapshot in it removed
    /// files outside a `replace`. The consumer reads snapshot `to` in full instead.
    #[error(
        "snapshot {snapshot_id} ({operation}) removed {removed_files} files: the changes up \
         to snapshot {to} cannot be read as changes, read that snapshot in full instead"
    )]
    FullReloadNeeded {
        /// The first snapshot of the range that removed files.
        snapshot_id: i64,
        /// Its operation.
        operation: String,
        /// How many files it removed.
        removed_files: u64,
        /// The end of the range.
        to: i64,
    },
    /// The lake is configured wrongly.
    #[error("lake configuration: {0}")]
    Config(String),
    /// A commit was planned on a snapshot that is no longer the table's current one (or
    /// lost the race to swap the table's metadata). Nothing was committed; the caller plans
    /// again on the new state.
    #[error("lake table {table}: commit conflict: {message}")]
    CommitConflict {
        /// The table.
        table: String,
        /// What moved.
        message: String,
    },
    /// A change mink does not take from another engine (see
    /// [`crate::commit::commit_foreign`]), or one a REST catalog refused.
    #[error("lake table {table}: refused: {message}")]
    Refused {
        /// The table.
        table: String,
        /// Why.
        message: String,
    },
    /// The REST catalog could not be reached or answered with an error.
    #[error("REST catalog: {0}")]
    RestCatalog(String),
    /// A lake table's content does not fit what mink expects of it.
    #[error("lake table {table}: {message}")]
    Layout {
        /// The table.
        table: String,
        /// What is wrong.
        message: String,
    },
}

impl LakeError {
    /// A [`LakeError::Layout`]: `table`'s content does not fit what mink expects of it.
    pub fn layout(table: &(impl std::fmt::Display + ?Sized), message: impl Into<String>) -> Self {
        Self::Layout {
            table: table.to_string(),
            message: message.into(),
        }
    }
}

/// Result with [`LakeError`].
pub type Result<T, E = LakeError> = std::result::Result<T, E>;
