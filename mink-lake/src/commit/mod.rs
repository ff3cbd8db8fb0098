//! Committing a lake snapshot at Iceberg's metadata layer.
//!
//! An Iceberg snapshot is a tree of immutable files; committing one writes the new files
//! bottom-up and then swaps one pointer:
//!
//! ```text
//!  iceberg_tables.metadata_location ──swap──▶ 00042-<uuid>.metadata.json   (new snapshot, main ref)
//!                                                    │
//!                                   snap-<id>-0-<uuid>.avro                 (manifest list, v2)
//!                     ┌──────────────┬───────────────┼───────────────────┐
//!              carried forward   rewritten      new data manifest   new delete manifest
//!               (unchanged)    (EXISTING +        (ADDED data)        (ADDED deletes)
//!                              DELETED entries)
//! ```
//!
//! iceberg 0.10's `Transaction` can only `fast_append` data files, and it silently rebases
//! a commit onto whatever the table holds when it commits. mink needs more (position and
//! equality delete files, compaction's replace) and needs less forgiveness: a commit is
//! planned on a snapshot (the `parent`), and if the table moved on since, that is a
//! conflict the caller must see, never something to paper over. So [`commit_snapshot`]
//! builds the snapshot itself:
//!
//! 1. Reload the table; its current snapshot must still be `parent`.
//! 2. Carry forward every manifest of the parent that holds none of the removed files;
//!    rewrite each one that does (its other live entries as EXISTING with their snapshot id
//!    and sequence numbers, the removed ones as DELETED). Manifests left with no live file
//!    are dropped, as Java's Iceberg does.
//! 3. Merge the carried-forward manifests once there are enough of one kind (`merge`), then
//!    write the added data files and the added delete files to one new manifest each (of
//!    the table's default partition spec).
//! 4. Compute the summary (the `added-*`/`deleted-*`/`removed-*` counts of this snapshot
//!    and the parent's `total-*` plus or minus them), write the manifest list and build the
//!    new table metadata (AddSnapshot + main ref).
//! 5. Publish it ([`Lake::publish`]): with a SQL catalog, write the metadata file and
//!    compare-and-swap `iceberg_tables.metadata_location` in the catalog's database; with a
//!    REST catalog, send the two updates with `assert-ref-snapshot-id` of the parent. A lost
//!    race deletes every file the attempt wrote and is a [`LakeError::CommitConflict`].
//!
//! Every file is named with a fresh UUID, so concurrent or repeated attempts never
//! overwrite one another's files.
//!
//! The parts:
//!
//! - this module: [`SnapshotChanges`], [`commit_snapshot`] (steps 1 and 5) and the staging
//!   of one attempt, which remembers every file it writes so a failed attempt can delete
//!   them again (steps 3 and 4);
//! - `validate`: checking the added files against the table before anything is written;
//! - `foreign`: checking and committing other engines' commits ([`commit_foreign`]);
//! - `bounds`: the size bounds of those commits (summaries, a hosted table's metadata);
//! - [`limits`]: the bounds those commits are held to;
//! - `manifests`: carrying the parent's manifests forward and rewriting those that hold
//!   removed files (step 2), and the writer of every new manifest;
//! - `merge`: merging manifests so that planning reads few (step 3);
//! - `summary`: the snapshot summary's counts and totals (pure).

mod bounds;
mod foreign;
pub mod limits;
mod manifests;
mod merge;
mod summary;
mod validate;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use iceberg::Runtime;
use iceberg::spec::{
    DataFile, FormatVersion, MAIN_BRANCH, ManifestContentType, ManifestListWriter, Operation,
    Snapshot, SnapshotReference, SnapshotRetention, TableMetadata, TableMetadataBuildResult,
    TableMetadataBuilder,
};
use iceberg::table::Table;
use mink_core::clock::now_ms;
use tracing::debug;
use uuid::Uuid;

pub use self::foreign::{commit_foreign, commit_hosted};
use self::merge::MergePolicy;
pub use self::merge::{DEFAULT_MIN_COUNT_TO_MERGE, rewrite_would_merge};
use self::summary::{Metrics, summarize};
use self::validate::validate_added;
use crate::catalog::{Lake, Swap};
use crate::error::{LakeError, Result};
use crate::writer::delete_files;

/// What one snapshot changes.
#[derive(Debug, Default)]
pub struct SnapshotChanges {
    /// Data files the snapshot adds.
    pub added_data_files: Vec<DataFile>,
    /// Position or equality delete files the snapshot adds.
    pub added_delete_files: Vec<DataFile>,
    /// Locations of live data or delete files the snapshot removes (compaction's replace).
    pub removed_files: HashSet<String>,
    /// Summary properties (`mink.bucket-offsets` etc.). The computed counts and totals
    /// override properties of the same name.
    pub properties: HashMap<String, String>,
    /// Merge every carried-forward manifest into as few as their size allows, whatever the
    /// table's merge properties say (`rewrite_manifests`).
    pub rewrite_manifests: bool,
}

/// Commits one snapshot on top of `parent` (the snapshot the caller planned on); a table
/// that moved on is a conflict, never rebased. Returns the table as committed (its
/// current snapshot is the new one).
///
/// An empty [`SnapshotChanges`] is allowed: it commits a snapshot with the parent's files
/// and new properties.
///
/// # Errors
/// - [`LakeError::CommitConflict`] when the table's current snapshot is not `parent` (or
///   the table was dropped and created again), or another commit swapped the table's
///   metadata between the check and the swap. Nothing was committed, and the files this
///   attempt wrote are deleted.
/// - [`LakeError::Layout`] when the changes do not fit the table: an added file outside
///   the table's location, of the wrong content or with a partition value that does not
///   fit the table's default partition spec (added files are taken to be of that spec), a
///   file both added and removed, a removed file that is not live in `parent`, a table
///   that is not format version 2.
/// - [`LakeError::Iceberg`] when a manifest or metadata file cannot be read or written,
///   [`LakeError::Catalog`] when the catalog's database fails. Every error means nothing
///   was committed, except a [`LakeError::Catalog`] from the swap whose outcome could not
///   be checked: the snapshot may then be committed, and its files are left in place.
pub async fn commit_snapshot(
    lake: &Lake,
    table: &Table,
    parent: Option<i64>,
    operation: Operation,
    changes: SnapshotChanges,
) -> Result<Table> {
    let name = table.identifier().to_string();
    let current = lake.catalog().load_table(table.identifier()).await?;
    if current.metadata().uuid() != table.metadata().uuid() {
        return Err(LakeError::CommitConflict {
            table: name,
            message: "the table was dropped and created again since the commit was planned".into(),
        });
    }
    let current_id = current.metadata().current_snapshot_id();
    if current_id != parent {
        return Err(LakeError::CommitConflict {
            table: name,
            message: format!(
                "the commit was planned on snapshot {} but the table is now at snapshot {}",
                show_optional(parent),
                show_optional(current_id)
            ),
        });
    }
    commit_on(lake, &current, operation, changes).await
}

/// Commits on `current`, freshly loaded and checked to be at the planned parent.
async fn commit_on(
    lake: &Lake,
    current: &Table,
    operation: Operation,
    changes: SnapshotChanges,
) -> Result<Table> {
    let name = current.identifier().to_string();
    let runtime = Runtime::try_current()?;
    let mut attempt = Attempt::new(current)?;
    let (snapshot_id, next) = match attempt.stage(operation, changes).await {
        Ok(staged) => staged,
        Err(error) => {
            attempt.discard().await;
            return Err(error);
        }
    };
    let (metadata, location) = match lake.publish(current, next).await {
        Swap::Committed(metadata, location) => (*metadata, location),
        Swap::Lost(error) => {
            attempt.discard().await;
            return Err(error);
        }
        // Unknown outcome: the files may be committed, so they stay (an orphan is
        // harmless, a missing file is not).
        Swap::Unknown(error) => return Err(error),
    };
    debug!(table = %name, snapshot_id, %location, "committed lake snapshot");
    // Infallible with every part given; a caller that cleans up on error must not see a
    // committed snapshot as failed, so it is built without any further I/O.
    Ok(Table::builder()
        .file_io(current.file_io().clone())
        .identifier(current.identifier().clone())
        .metadata_location(location)
        .metadata(metadata)
        .runtime(runtime)
        .build()?)
}

/// Commits a change of `current`'s metadata alone (no new data or manifest files):
/// `edit` builds the new metadata from the current one, which the lake publishes
/// ([`Lake::publish`]). Returns the new metadata and its location.
///
/// # Errors
/// `edit`'s, and the publishing's: a [`LakeError::CommitConflict`] when the table moved on.
pub(crate) async fn commit_metadata(
    lake: &Lake,
    current: &Table,
    edit: impl FnOnce(TableMetadataBuilder) -> iceberg::Result<TableMetadataBuilder>,
) -> Result<(TableMetadata, String)> {
    commit_metadata_within(lake, current, edit, |_| Ok(())).await
}

/// [`commit_metadata`], refused with `bounds`' error if the metadata `edit` builds does
/// not pass it (nothing is written then).
pub(crate) async fn commit_metadata_within(
    lake: &Lake,
    current: &Table,
    edit: impl FnOnce(TableMetadataBuilder) -> iceberg::Result<TableMetadataBuilder>,
    bounds: impl FnOnce(&TableMetadata) -> Result<()>,
) -> Result<(TableMetadata, String)> {
    let builder = current
        .metadata()
        .clone()
        .into_builder(Some(current.metadata_location_result()?.to_string()));
    let next = edit(builder)?.build()?;
    bounds(&next.metadata)?;
    match lake.publish(current, next).await {
        Swap::Committed(metadata, location) => Ok((*metadata, location)),
        Swap::Lost(error) | Swap::Unknown(error) => Err(error),
    }
}

/// A snapshot id or sequence number for a message: `none` when absent.
fn show_optional(value: Option<i64>) -> String {
    value.map_or_else(|| "none".to_string(), |value| value.to_string())
}

/// One commit attempt and the files it wrote (deleted again if it fails).
struct Attempt<'a> {
    table: &'a Table,
    name: String,
    snapshot_id: i64,
    sequence_number: i64,
    commit_uuid: Uuid,
    manifests: u32,
    written: Vec<String>,
}

impl<'a> Attempt<'a> {
    fn new(table: &'a Table) -> Result<Self> {
        let metadata = table.metadata();
        let name = table.identifier().to_string();
        if metadata.format_version() != FormatVersion::V2 {
            return Err(LakeError::layout(
                &name,
                format!(
                    "metadata-layer commits support format version 2, the table has {}",
                    metadata.format_version()
                ),
            ));
        }
        Ok(Self {
            table,
            name,
            snapshot_id: new_snapshot_id(metadata),
            sequence_number: metadata.next_sequence_number(),
            commit_uuid: Uuid::now_v7(),
            manifests: 0,
            written: Vec::new(),
        })
    }

    /// Writes the snapshot's manifests and manifest list; returns its id and the table's
    /// next metadata (published by the caller).
    async fn stage(
        &mut self,
        operation: Operation,
        changes: SnapshotChanges,
    ) -> Result<(i64, TableMetadataBuildResult)> {
        let table = self.table;
        let metadata = table.metadata();
        validate_added(metadata, &changes).map_err(|m| LakeError::layout(&self.name, m))?;
        let SnapshotChanges {
            added_data_files,
            added_delete_files,
            removed_files,
            mut properties,
            rewrite_manifests,
        } = changes;

        let mut metrics = Metrics::default();
        let parent = metadata.current_snapshot();
        let manifests = match parent {
            Some(parent) => {
                self.carry_forward(parent, &removed_files, &mut metrics)
                    .await?
            }
            None if removed_files.is_empty() => Vec::new(),
            None => {
                return Err(LakeError::layout(
                    &self.name,
                    format!(
                        "cannot remove files from a table without a snapshot: {}",
                        sorted(removed_files.iter()).join(", ")
                    ),
                ));
            }
        };
        let policy = match rewrite_manifests {
            true => MergePolicy::of(metadata).everything(),
            false => MergePolicy::of(metadata),
        };
        let (mut manifests, merged) = self.merge(manifests, policy).await?;
        if merged.created > 0 {
            for (key, count) in [
                ("manifests-created", merged.created),
                ("manifests-replaced", merged.replaced),
                ("manifests-kept", merged.kept),
            ] {
                properties.insert(key.to_string(), count.to_string());
            }
        }
        // iceberg 0.10 keeps a DataFile's partition spec id crate-private, so added files
        // are taken to be of the default spec (their partition values are checked to fit it).
        let spec = metadata.default_partition_spec().as_ref().clone();
        for (content, files) in [
            (ManifestContentType::Data, added_data_files),
            (ManifestContentType::Deletes, added_delete_files),
        ] {
            if files.is_empty() {
                continue;
            }
            let mut writer =
                self.manifest_writer(content, Arc::clone(metadata.current_schema()), spec.clone())?;
            for file in files {
                metrics.add(&file);
                writer.add_file(file, self.sequence_number)?;
            }
            manifests.push(writer.write_manifest_file().await?);
        }

        let summary = summarize(operation, properties, &metrics, parent.map(|p| p.summary()));
        let list_path = format!(
            "{}/metadata/snap-{}-0-{}.avro",
            metadata.location(),
            self.snapshot_id,
            self.commit_uuid
        );
        let output = table.file_io().new_output(&list_path)?;
        self.written.push(list_path.clone());
        let mut list = ManifestListWriter::v2(
            output.writer().await?,
            self.snapshot_id,
            metadata.current_snapshot_id(),
            self.sequence_number,
        );
        list.add_manifests(manifests.into_iter())?;
        list.close().await?;

        let snapshot = Snapshot::builder()
            .with_snapshot_id(self.snapshot_id)
            .with_parent_snapshot_id(metadata.current_snapshot_id())
            .with_sequence_number(self.sequence_number)
            .with_timestamp_ms(now_ms())
            .with_manifest_list(list_path)
            .with_summary(summary)
            .with_schema_id(metadata.current_schema_id())
            .build();
        let current_location = table.metadata_location_result()?;
        let next = metadata
            .clone()
            .into_builder(Some(current_location.to_string()))
            .add_snapshot(snapshot)?
            .set_ref(
                MAIN_BRANCH,
                SnapshotReference::new(
                    self.snapshot_id,
                    SnapshotRetention::branch(None, None, None),
                ),
            )?
            .build()?;
        Ok((self.snapshot_id, next))
    }

    /// Deletes the files this attempt wrote. Best effort: the caller keeps the error
    /// that failed the attempt (an orphan is harmless; the failures are logged).
    async fn discard(&mut self) {
        let written = std::mem::take(&mut self.written);
        let _ = delete_files(self.table, &written).await;
    }
}

/// The paths, sorted (for stable error messages).
fn sorted<'a>(paths: impl Iterator<Item = &'a String>) -> Vec<&'a str> {
    let mut paths: Vec<&str> = paths.map(String::as_str).collect();
    paths.sort_unstable();
    paths
}

/// A positive snapshot id no snapshot of the table has.
fn new_snapshot_id(metadata: &TableMetadata) -> i64 {
    loop {
        let (high, low) = Uuid::now_v7().as_u64_pair();
        let id = ((high ^ low) & i64::MAX as u64) as i64;
        if id != 0 && metadata.snapshot_by_id(id).is_none() {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    use iceberg::spec::DataContentType;
    use mink_core::table::TableDescriptor;

    use super::*;
    use crate::catalog::fixture::{lake_table, one_row_file};

    fn listing(dir: &Path) -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }

    fn with_property(value: &str) -> SnapshotChanges {
        SnapshotChanges {
            properties: HashMap::from([("k".to_string(), value.to_string())]),
            ..SnapshotChanges::default()
        }
    }

    /// A lake table with one snapshot (of the property `k = 1` only) and what its
    /// metadata directory holds then.
    struct OneSnapshot {
        dir: tempfile::TempDir,
        lake: Lake,
        descriptor: TableDescriptor,
        /// The table as created, before the snapshot.
        stale: Table,
        /// The table as committed.
        table: Table,
        metadata: PathBuf,
        before: BTreeSet<String>,
    }

    impl OneSnapshot {
        async fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let (lake, descriptor, stale) = lake_table(dir.path()).await;
            let table = commit_snapshot(&lake, &stale, None, Operation::Append, with_property("1"))
                .await
                .unwrap();
            assert!(table.metadata().current_snapshot_id().is_some());
            let metadata = Path::new(stale.metadata().location()).join("metadata");
            let before = listing(&metadata);
            Self {
                dir,
                lake,
                descriptor,
                stale,
                table,
                metadata,
                before,
            }
        }

        /// Checks that the table is still at its one snapshot and no file was left.
        async fn assert_unchanged(&self) {
            assert_eq!(listing(&self.metadata), self.before);
            let current = self.lake.load(&self.descriptor.path).await.unwrap();
            assert_eq!(
                current.metadata().current_snapshot_id(),
                self.table.metadata().current_snapshot_id()
            );
        }
    }

    #[tokio::test]
    async fn a_lost_swap_is_a_conflict_and_leaves_no_files() {
        let f = OneSnapshot::new().await;
        // As if the other commit landed right after the parent check: the swap loses.
        let err = commit_on(&f.lake, &f.stale, Operation::Append, with_property("2"))
            .await
            .unwrap_err();
        assert!(matches!(err, LakeError::CommitConflict { .. }), "{err}");
        f.assert_unchanged().await;
        let current = f.lake.load(&f.descriptor.path).await.unwrap();
        let summary = current.metadata().current_snapshot().unwrap().summary();
        assert_eq!(summary.additional_properties["k"], "1");
        assert_eq!(summary.additional_properties["total-records"], "0");
    }

    #[tokio::test]
    async fn a_file_outside_the_table_is_refused_and_nothing_is_committed() {
        let f = OneSnapshot::new().await;
        let parent = f.table.metadata().current_snapshot_id();
        let location = f.table.metadata().location();
        let elsewhere = f.dir.path().join("elsewhere.parquet").display().to_string();
        let sibling = format!("{location}/../u/data/bucket=0/a.parquet");
        for (data, delete) in [
            (Some(elsewhere.as_str()), None),
            (Some(sibling.as_str()), None),
            (None, Some(elsewhere.as_str())),
        ] {
            let changes = SnapshotChanges {
                added_data_files: data
                    .map(|p| one_row_file(DataContentType::Data, p))
                    .into_iter()
                    .collect(),
                added_delete_files: delete
                    .map(|p| one_row_file(DataContentType::PositionDeletes, p))
                    .into_iter()
                    .collect(),
                ..SnapshotChanges::default()
            };
            let err = commit_snapshot(&f.lake, &f.table, parent, Operation::Append, changes)
                .await
                .unwrap_err();
            assert!(
                matches!(&err, LakeError::Layout { message, .. }
                    if message.contains("outside the table's location")),
                "{err}"
            );
        }
        f.assert_unchanged().await;
    }
}
