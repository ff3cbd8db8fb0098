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
//! 3. Write the added data files and the added delete files to one new manifest each (of
//!    the table's default partition spec).
//! 4. Compute the summary (the `added-*`/`deleted-*`/`removed-*` counts of this snapshot
//!    and the parent's `total-*` plus or minus them), write the manifest list and the new
//!    table metadata (AddSnapshot + main ref).
//! 5. Compare-and-swap `iceberg_tables.metadata_location` in the catalog's database. A
//!    lost swap deletes every file the attempt wrote and is a
//!    [`LakeError::CommitConflict`].
//!
//! Every file is named with a fresh UUID, so concurrent or repeated attempts never
//! overwrite one another's files.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use futures::{StreamExt, TryStreamExt, stream};
use iceberg::spec::{
    DataContentType, DataFile, FormatVersion, MAIN_BRANCH, Manifest, ManifestContentType,
    ManifestFile, ManifestListWriter, ManifestStatus, ManifestWriter, ManifestWriterBuilder,
    Operation, PartitionSpec, SchemaRef, Snapshot, SnapshotRef, SnapshotReference,
    SnapshotRetention, Struct, Summary, TableMetadata,
};
use iceberg::table::Table;
use iceberg::{Catalog, MetadataLocation, Runtime};
use tracing::{debug, warn};
use uuid::Uuid;

use crate::catalog::{CATALOG_NAME, Lake};
use crate::error::{LakeError, Result};

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
}

/// How many manifests are read at once when looking for removed files.
const MANIFEST_READS: usize = 8;

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
/// - [`LakeError::Layout`] when the changes do not fit the table: an added file of the
///   wrong content or with a partition value that does not fit the table's default partition
///   spec (added files are taken to be of that spec), a file both added
///   and removed, a removed file that is not live in `parent`, a table that is not format
///   version 2.
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
                show_snapshot(parent),
                show_snapshot(current_id)
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
    let expected = current.metadata_location_result()?;
    let mut attempt = Attempt::new(current)?;
    let staged = match attempt.stage(operation, changes).await {
        Ok(staged) => staged,
        Err(error) => {
            attempt.discard().await;
            return Err(error);
        }
    };
    let new_location = staged.location.to_string();
    // The table as it will be swapped in, built before the swap so that nothing can fail
    // once the commit is in (a caller that cleans up on error must not see a committed
    // snapshot as failed; a reload could also show a later commit).
    let committed = match Table::builder()
        .file_io(current.file_io().clone())
        .identifier(current.identifier().clone())
        .metadata_location(new_location.clone())
        .metadata(staged.metadata)
        .runtime(runtime)
        .build()
    {
        Ok(committed) => committed,
        Err(error) => {
            attempt.discard().await;
            return Err(error.into());
        }
    };
    match swap(lake, current, expected, &new_location).await {
        Ok(true) => {}
        Ok(false) => {
            attempt.discard().await;
            return Err(LakeError::CommitConflict {
                table: name,
                message: "another commit replaced the table's metadata first".into(),
            });
        }
        Err(error) => match metadata_location(lake, current).await {
            // The swap went through after all.
            Ok(Some(location)) if location == new_location => {}
            Ok(_) => {
                attempt.discard().await;
                return Err(error);
            }
            // Unknown outcome: the files may be committed, so they stay (an orphan is
            // harmless, a missing file is not).
            Err(_) => return Err(error),
        },
    }
    debug!(table = %name, snapshot_id = staged.snapshot_id, location = %new_location, "committed lake snapshot");
    Ok(committed)
}

fn show_snapshot(id: Option<i64>) -> String {
    id.map_or_else(|| "none".to_string(), |id| id.to_string())
}

/// Swaps the table's metadata location from `expected` to `new`; false when it was no
/// longer `expected`.
async fn swap(lake: &Lake, table: &Table, expected: &str, new: &str) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE iceberg_tables SET metadata_location = ?, previous_metadata_location = ? \
         WHERE catalog_name = ? AND table_namespace = ? AND table_name = ? \
         AND metadata_location = ?",
    )
    .bind(new)
    .bind(expected)
    .bind(CATALOG_NAME)
    .bind(table.identifier().namespace().join("."))
    .bind(table.identifier().name())
    .bind(expected)
    .execute(lake.database())
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The table's metadata location in the catalog (None: no such table).
async fn metadata_location(lake: &Lake, table: &Table) -> Result<Option<String>> {
    Ok(sqlx::query_scalar(
        "SELECT metadata_location FROM iceberg_tables \
         WHERE catalog_name = ? AND table_namespace = ? AND table_name = ?",
    )
    .bind(CATALOG_NAME)
    .bind(table.identifier().namespace().join("."))
    .bind(table.identifier().name())
    .fetch_optional(lake.database())
    .await?)
}

/// A staged snapshot: its files are written, the table does not point to them yet.
struct Staged {
    snapshot_id: i64,
    metadata: TableMetadata,
    location: MetadataLocation,
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
            return Err(LakeError::Layout {
                table: name,
                message: format!(
                    "metadata-layer commits support format version 2, the table has {}",
                    metadata.format_version()
                ),
            });
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

    fn layout_error(&self, message: String) -> LakeError {
        LakeError::Layout {
            table: self.name.clone(),
            message,
        }
    }

    /// Writes the snapshot's manifests, manifest list and table metadata.
    async fn stage(&mut self, operation: Operation, changes: SnapshotChanges) -> Result<Staged> {
        let table = self.table;
        let metadata = table.metadata();
        validate_added(metadata, &changes).map_err(|m| self.layout_error(m))?;
        let SnapshotChanges {
            added_data_files,
            added_delete_files,
            removed_files,
            properties,
        } = changes;

        let mut metrics = Metrics::default();
        let parent = metadata.current_snapshot();
        let mut manifests = match parent {
            Some(parent) => {
                self.carry_forward(parent, &removed_files, &mut metrics)
                    .await?
            }
            None if removed_files.is_empty() => Vec::new(),
            None => {
                return Err(self.layout_error(format!(
                    "cannot remove files from a table without a snapshot: {}",
                    sorted(removed_files.iter()).join(", ")
                )));
            }
        };
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
            let mut writer = self.manifest_writer(
                content,
                std::sync::Arc::clone(metadata.current_schema()),
                spec.clone(),
            )?;
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
        let new_metadata = metadata
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
            .build()?
            .metadata;
        let location = MetadataLocation::from_str(current_location)?
            .with_next_version()
            .with_new_metadata(&new_metadata);
        self.written.push(location.to_string());
        new_metadata.write_to(table.file_io(), &location).await?;
        Ok(Staged {
            snapshot_id: self.snapshot_id,
            metadata: new_metadata,
            location,
        })
    }

    /// The parent's manifests for the new snapshot: unchanged where they hold no removed
    /// file, rewritten where they do.
    async fn carry_forward(
        &mut self,
        parent: &SnapshotRef,
        removed: &HashSet<String>,
        metrics: &mut Metrics,
    ) -> Result<Vec<ManifestFile>> {
        let table = self.table;
        let list = table.manifest_list_reader(parent).load().await?;
        if removed.is_empty() {
            return Ok(list
                .entries()
                .iter()
                .filter(|m| has_live_files(m))
                .cloned()
                .collect());
        }
        let file_io = table.file_io();
        let loaded: Vec<(ManifestFile, Manifest)> = stream::iter(list.entries().iter().cloned())
            .map(|file| async move {
                let manifest = file.load_manifest(file_io).await?;
                Ok::<_, iceberg::Error>((file, manifest))
            })
            .buffered(MANIFEST_READS)
            .try_collect()
            .await?;
        let mut found = HashSet::new();
        let mut manifests = Vec::with_capacity(loaded.len());
        for (file, manifest) in loaded {
            let touched = manifest
                .entries()
                .iter()
                .any(|e| e.is_alive() && removed.contains(e.file_path()));
            if touched {
                // Kept even with no live file left: its DELETED entries record the removal.
                manifests.push(self.rewrite(manifest, removed, &mut found, metrics).await?);
            } else if has_live_files(&file) {
                manifests.push(file);
            }
        }
        let missing: Vec<&String> = removed.iter().filter(|p| !found.contains(*p)).collect();
        if !missing.is_empty() {
            return Err(self.layout_error(format!(
                "cannot remove files that are not live in snapshot {}: {}",
                parent.snapshot_id(),
                sorted(missing.into_iter()).join(", ")
            )));
        }
        Ok(manifests)
    }

    /// A manifest's live entries again, the removed ones marked DELETED. Entries deleted
    /// by earlier snapshots are left out.
    async fn rewrite(
        &mut self,
        manifest: Manifest,
        removed: &HashSet<String>,
        found: &mut HashSet<String>,
        metrics: &mut Metrics,
    ) -> Result<ManifestFile> {
        let (entries, meta) = manifest.into_parts();
        let mut writer = self.manifest_writer(
            meta.content,
            std::sync::Arc::clone(&meta.schema),
            meta.partition_spec.clone(),
        )?;
        for entry in entries {
            if entry.status() == ManifestStatus::Deleted {
                continue;
            }
            let path = entry.file_path();
            let (Some(snapshot_id), Some(sequence_number)) =
                (entry.snapshot_id(), entry.sequence_number())
            else {
                return Err(self.layout_error(format!(
                    "manifest entry of {path} has no snapshot id or sequence number"
                )));
            };
            let data_file = entry.data_file().clone();
            if removed.contains(path) {
                found.insert(path.to_string());
                metrics.remove(&data_file);
                writer.add_delete_file(data_file, sequence_number, entry.file_sequence_number)?;
            } else {
                writer.add_existing_file(
                    data_file,
                    snapshot_id,
                    sequence_number,
                    entry.file_sequence_number,
                )?;
            }
        }
        Ok(writer.write_manifest_file().await?)
    }

    /// A writer of one new manifest (`<location>/metadata/<commit uuid>-m<n>.avro`).
    fn manifest_writer(
        &mut self,
        content: ManifestContentType,
        schema: SchemaRef,
        spec: PartitionSpec,
    ) -> Result<ManifestWriter> {
        let path = format!(
            "{}/metadata/{}-m{}.avro",
            self.table.metadata().location(),
            self.commit_uuid,
            self.manifests
        );
        self.manifests += 1;
        let output = self.table.file_io().new_output(&path)?;
        self.written.push(path);
        let builder = ManifestWriterBuilder::new(output, Some(self.snapshot_id), schema, spec);
        Ok(match content {
            ManifestContentType::Data => builder.build_v2_data(),
            ManifestContentType::Deletes => builder.build_v2_deletes(),
        })
    }

    /// Deletes the files this attempt wrote (best effort: an orphan is harmless).
    async fn discard(&mut self) {
        for path in self.written.drain(..) {
            if let Err(error) = self.table.file_io().delete(&path).await {
                warn!(%path, %error, "could not delete a file of a failed lake commit");
            }
        }
    }
}

/// Whether a manifest may hold live files (unknown counts: it may).
fn has_live_files(manifest: &ManifestFile) -> bool {
    manifest.has_added_files() || manifest.has_existing_files()
}

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

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Checks the added files against the table (iceberg's manifest writer panics on a
/// partition value that does not fit its spec).
fn validate_added(metadata: &TableMetadata, changes: &SnapshotChanges) -> Result<(), String> {
    let mut paths = HashSet::new();
    for (file, data) in changes
        .added_data_files
        .iter()
        .map(|f| (f, true))
        .chain(changes.added_delete_files.iter().map(|f| (f, false)))
    {
        let path = file.file_path();
        match (data, file.content_type()) {
            (true, DataContentType::Data)
            | (false, DataContentType::PositionDeletes | DataContentType::EqualityDeletes) => {}
            (true, content) => {
                return Err(format!("added data file {path} has content {content:?}"));
            }
            (false, content) => {
                return Err(format!("added delete file {path} has content {content:?}"));
            }
        }
        if file.content_type() == DataContentType::EqualityDeletes
            && file.equality_ids().is_none_or(|ids| ids.is_empty())
        {
            return Err(format!("equality delete file {path} has no equality ids"));
        }
        if !paths.insert(path) {
            return Err(format!("file {path} is added twice"));
        }
        if changes.removed_files.contains(path) {
            return Err(format!("file {path} is both added and removed"));
        }
        let partition_type = metadata.default_partition_type();
        if !partition_fits(file.partition(), partition_type) {
            return Err(format!(
                "file {path} has partition {:?}, which does not fit the table's partition spec",
                file.partition()
            ));
        }
    }
    Ok(())
}

fn partition_fits(partition: &Struct, partition_type: &iceberg::spec::StructType) -> bool {
    partition.fields().len() == partition_type.fields().len()
        && partition
            .iter()
            .zip(partition_type.fields())
            .all(|(value, field)| match value {
                None => true,
                Some(value) => match (
                    field.field_type.as_primitive_type(),
                    value.as_primitive_literal(),
                ) {
                    (Some(ty), Some(literal)) => ty.compatible(&literal),
                    _ => false,
                },
            })
}

/// What a snapshot adds and removes, counted as Iceberg's summary counts it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Metrics {
    added_files_size: u64,
    removed_files_size: u64,
    added_data_files: u64,
    deleted_data_files: u64,
    added_records: u64,
    deleted_records: u64,
    added_position_delete_files: u64,
    removed_position_delete_files: u64,
    added_equality_delete_files: u64,
    removed_equality_delete_files: u64,
    added_position_deletes: u64,
    removed_position_deletes: u64,
    added_equality_deletes: u64,
    removed_equality_deletes: u64,
    changed_partitions: HashSet<Struct>,
}

impl Metrics {
    fn add(&mut self, file: &DataFile) {
        self.added_files_size += file.file_size_in_bytes();
        let rows = file.record_count();
        match file.content_type() {
            DataContentType::Data => {
                self.added_data_files += 1;
                self.added_records += rows;
            }
            DataContentType::PositionDeletes => {
                self.added_position_delete_files += 1;
                self.added_position_deletes += rows;
            }
            DataContentType::EqualityDeletes => {
                self.added_equality_delete_files += 1;
                self.added_equality_deletes += rows;
            }
        }
        self.touch(file);
    }

    fn remove(&mut self, file: &DataFile) {
        self.removed_files_size += file.file_size_in_bytes();
        let rows = file.record_count();
        match file.content_type() {
            DataContentType::Data => {
                self.deleted_data_files += 1;
                self.deleted_records += rows;
            }
            DataContentType::PositionDeletes => {
                self.removed_position_delete_files += 1;
                self.removed_position_deletes += rows;
            }
            DataContentType::EqualityDeletes => {
                self.removed_equality_delete_files += 1;
                self.removed_equality_deletes += rows;
            }
        }
        self.touch(file);
    }

    fn touch(&mut self, file: &DataFile) {
        if !file.partition().fields().is_empty() {
            self.changed_partitions.insert(file.partition().clone());
        }
    }

    fn added_delete_files(&self) -> u64 {
        self.added_position_delete_files + self.added_equality_delete_files
    }

    fn removed_delete_files(&self) -> u64 {
        self.removed_position_delete_files + self.removed_equality_delete_files
    }
}

/// The snapshot summary: `properties`, then this snapshot's counts (where positive) and
/// the table's totals (the parent's totals, 0 where absent, plus or minus the counts).
fn summarize(
    operation: Operation,
    properties: HashMap<String, String>,
    metrics: &Metrics,
    parent: Option<&Summary>,
) -> Summary {
    let mut summary = properties;
    let counts = [
        ("added-files-size", metrics.added_files_size),
        ("removed-files-size", metrics.removed_files_size),
        ("added-data-files", metrics.added_data_files),
        ("deleted-data-files", metrics.deleted_data_files),
        ("added-records", metrics.added_records),
        ("deleted-records", metrics.deleted_records),
        ("added-delete-files", metrics.added_delete_files()),
        ("removed-delete-files", metrics.removed_delete_files()),
        (
            "added-position-delete-files",
            metrics.added_position_delete_files,
        ),
        (
            "removed-position-delete-files",
            metrics.removed_position_delete_files,
        ),
        (
            "added-equality-delete-files",
            metrics.added_equality_delete_files,
        ),
        (
            "removed-equality-delete-files",
            metrics.removed_equality_delete_files,
        ),
        ("added-position-deletes", metrics.added_position_deletes),
        ("removed-position-deletes", metrics.removed_position_deletes),
        ("added-equality-deletes", metrics.added_equality_deletes),
        ("removed-equality-deletes", metrics.removed_equality_deletes),
        (
            "changed-partition-count",
            metrics.changed_partitions.len() as u64,
        ),
    ];
    for (key, value) in counts {
        if value > 0 {
            summary.insert(key.to_string(), value.to_string());
        } else {
            summary.remove(key);
        }
    }
    let totals = [
        (
            "total-data-files",
            metrics.added_data_files,
            metrics.deleted_data_files,
        ),
        (
            "total-delete-files",
            metrics.added_delete_files(),
            metrics.removed_delete_files(),
        ),
        (
            "total-records",
            metrics.added_records,
            metrics.deleted_records,
        ),
        (
            "total-files-size",
            metrics.added_files_size,
            metrics.removed_files_size,
        ),
        (
            "total-position-deletes",
            metrics.added_position_deletes,
            metrics.removed_position_deletes,
        ),
        (
            "total-equality-deletes",
            metrics.added_equality_deletes,
            metrics.removed_equality_deletes,
        ),
    ];
    for (key, added, removed) in totals {
        let previous = parent.and_then(|s| s.additional_properties.get(key));
        let previous = match previous.map(|v| v.parse::<u64>()) {
            None => 0,
            Some(Ok(total)) => total,
            Some(Err(_)) => {
                warn!(property = key, value = ?previous, "malformed total in the parent snapshot's summary; left out");
                summary.remove(key);
                continue;
            }
        };
        let total = (previous + added).checked_sub(removed).unwrap_or_else(|| {
            warn!(
                property = key,
                previous, added, removed, "total below zero; the parent's summary undercounts"
            );
            0
        });
        summary.insert(key.to_string(), total.to_string());
    }
    Summary {
        operation,
        additional_properties: summary,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    use arrow::datatypes::{DataType, Field, Schema};
    use iceberg::spec::{DataFileBuilder, DataFileFormat, Literal};
    use mink_core::options::TableOptions;
    use mink_core::table::{TableDescriptor, TablePath};

    use super::*;
    use crate::catalog::LakeConfig;

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

    #[tokio::test]
    async fn a_lost_swap_is_a_conflict_and_leaves_no_files() {
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::open(LakeConfig::embedded(dir.path()).unwrap())
            .await
            .unwrap();
        let options = TableOptions {
            bucket_num: 2,
            bucket_key: Some(vec!["id".into()]),
            lake_enabled: true,
            ..TableOptions::default()
        };
        let descriptor = TableDescriptor::new(
            TablePath::new("db", "t"),
            Schema::new(vec![Field::new("id", DataType::Int64, false)]),
            vec![],
            vec![],
            options,
        )
        .unwrap();
        let stale = lake.create_table(&descriptor).await.unwrap();
        // A snapshot of properties only, on a table without one.
        let moved = commit_snapshot(&lake, &stale, None, Operation::Append, with_property("1"))
            .await
            .unwrap();
        let moved_id = moved.metadata().current_snapshot_id();
        assert!(moved_id.is_some());
        let metadata = Path::new(stale.metadata().location()).join("metadata");
        let before = listing(&metadata);

        // As if the other commit landed right after the parent check: the swap loses.
        let err = commit_on(&lake, &stale, Operation::Append, with_property("2"))
            .await
            .unwrap_err();
        assert!(matches!(err, LakeError::CommitConflict { .. }), "{err}");
        assert_eq!(listing(&metadata), before);
        let current = lake.load(&descriptor.path).await.unwrap();
        assert_eq!(current.metadata().current_snapshot_id(), moved_id);
        let summary = current.metadata().current_snapshot().unwrap().summary();
        assert_eq!(summary.additional_properties["k"], "1");
        assert_eq!(summary.additional_properties["total-records"], "0");
    }

    fn file(content: DataContentType, path: &str, rows: u64, size: u64, bucket: i32) -> DataFile {
        let mut builder = DataFileBuilder::default();
        builder
            .content(content)
            .file_path(path.to_string())
            .file_format(DataFileFormat::Parquet)
            .partition(Struct::from_iter([Some(Literal::int(bucket))]))
            .record_count(rows)
            .file_size_in_bytes(size);
        if content == DataContentType::EqualityDeletes {
            builder.equality_ids(Some(vec![1]));
        }
        builder.build().unwrap()
    }

    fn props(summary: &Summary) -> BTreeMap<&str, &str> {
        summary
            .additional_properties
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    #[test]
    fn first_append_counts_from_zero() {
        let mut metrics = Metrics::default();
        metrics.add(&file(DataContentType::Data, "a", 10, 100, 0));
        metrics.add(&file(DataContentType::Data, "b", 5, 50, 1));
        let summary = summarize(
            Operation::Append,
            HashMap::from([("mink.bucket-offsets".into(), "{}".into())]),
            &metrics,
            None,
        );
        assert_eq!(summary.operation, Operation::Append);
        assert_eq!(
            props(&summary),
            BTreeMap::from([
                ("added-data-files", "2"),
                ("added-files-size", "150"),
                ("added-records", "15"),
                ("changed-partition-count", "2"),
                ("mink.bucket-offsets", "{}"),
                ("total-data-files", "2"),
                ("total-delete-files", "0"),
                ("total-equality-deletes", "0"),
                ("total-files-size", "150"),
                ("total-position-deletes", "0"),
                ("total-records", "15"),
            ])
        );
    }

    #[test]
    fn deletes_and_removals_move_the_parent_totals() {
        let parent = Summary {
            operation: Operation::Append,
            additional_properties: HashMap::from([
                ("total-data-files".into(), "4".into()),
                ("total-delete-files".into(), "1".into()),
                ("total-records".into(), "100".into()),
                ("total-files-size".into(), "1000".into()),
                ("total-position-deletes".into(), "3".into()),
                ("added-data-files".into(), "4".into()),
            ]),
        };
        let mut metrics = Metrics::default();
        metrics.add(&file(DataContentType::Data, "new", 20, 200, 0));
        metrics.add(&file(DataContentType::PositionDeletes, "pd", 2, 10, 0));
        metrics.add(&file(DataContentType::EqualityDeletes, "ed", 4, 20, 1));
        metrics.remove(&file(DataContentType::Data, "old", 25, 300, 0));
        metrics.remove(&file(DataContentType::PositionDeletes, "old-pd", 3, 30, 0));
        let summary = summarize(Operation::Replace, HashMap::new(), &metrics, Some(&parent));
        let p = props(&summary);
        assert_eq!(p["added-data-files"], "1");
        assert_eq!(p["deleted-data-files"], "1");
        assert_eq!(p["deleted-records"], "25");
        assert_eq!(p["added-delete-files"], "2");
        assert_eq!(p["removed-delete-files"], "1");
        assert_eq!(p["added-position-deletes"], "2");
        assert_eq!(p["removed-position-deletes"], "3");
        assert_eq!(p["added-equality-deletes"], "4");
        assert_eq!(p["changed-partition-count"], "2");
        assert_eq!(p["total-data-files"], "4");
        assert_eq!(p["total-delete-files"], "2");
        assert_eq!(p["total-records"], "95");
        assert_eq!(p["total-files-size"], "900");
        assert_eq!(p["total-position-deletes"], "2");
        assert_eq!(p["total-equality-deletes"], "4");
    }

    #[test]
    fn computed_counts_override_properties_and_bad_totals_are_left_out() {
        let parent = Summary {
            operation: Operation::Append,
            additional_properties: HashMap::from([("total-records".into(), "many".into())]),
        };
        let mut metrics = Metrics::default();
        metrics.add(&file(DataContentType::Data, "a", 1, 1, 0));
        let summary = summarize(
            Operation::Append,
            HashMap::from([
                ("added-records".into(), "999".into()),
                ("deleted-records".into(), "7".into()),
                ("total-records".into(), "5".into()),
            ]),
            &metrics,
            Some(&parent),
        );
        let p = props(&summary);
        assert_eq!(p["added-records"], "1");
        assert!(!p.contains_key("deleted-records"));
        assert!(!p.contains_key("total-records"));
        assert_eq!(p["total-data-files"], "1");
    }

    #[test]
    fn partitions_must_fit_the_spec() {
        use iceberg::spec::{NestedField, PrimitiveType, StructType, Type};
        let int = StructType::new(vec![
            NestedField::optional(1000, "b", Type::Primitive(PrimitiveType::Int)).into(),
        ]);
        assert!(partition_fits(
            &Struct::from_iter([Some(Literal::int(1))]),
            &int
        ));
        assert!(partition_fits(&Struct::from_iter([None]), &int));
        assert!(!partition_fits(
            &Struct::from_iter([Some(Literal::long(1))]),
            &int
        ));
        assert!(!partition_fits(&Struct::empty(), &int));
    }
}
