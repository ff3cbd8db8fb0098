//! Commits other engines send to mink's lake (through mink's Iceberg REST catalog), checked
//! and swapped in with the same compare-and-swap as mink's own.
//!
//! mink owns its lake tables: their schema, partitioning and properties change only
//! through mink's SQL, and a primary-key table's lake holds exactly one live row per key
//! (a foreign data file would duplicate keys that the union read merges away). What
//! another engine may do is append to a log table's lake, which tiering already takes in
//! its stride (it plans each round on the current snapshot and finds its own offsets on
//! the newest snapshot that carries them). So a foreign commit ([`commit_foreign`]) is
//! accepted when:
//!
//! - its requirements hold against the table as it is now (else a conflict);
//! - its updates are `add-snapshot` of `append` snapshots and `set-snapshot-ref` of
//!   `main` to one of them, nothing else (none: nothing is written);
//! - no added snapshot carries a `mink.` summary property (tiering takes the newest
//!   snapshot with `mink.bucket-offsets` for its own);
//! - each added snapshot builds on the current `main` snapshot and keeps every one of its
//!   manifests, and its manifest list, its manifests and their files lie inside the
//!   table's location, its new manifests hold data files only;
//! - the table is a log table.
//!
//! A table a REST client created in a namespace it created ([`commit_hosted`]; another mink
//! server using this one's catalog, say) is that client's: any update is taken, except a
//! new location, as long as the requirements hold and every file an added snapshot names
//! lies inside the table's location.
//!
//! The new metadata is published as mink's own metadata-only commits are
//! ([`commit_metadata`], as an expiry); a lost race is a conflict.

use std::collections::HashSet;
use std::sync::Arc;

use iceberg::spec::{
    DataContentType, MAIN_BRANCH, Manifest, ManifestContentType, ManifestFile, Operation, Snapshot,
    TableMetadata,
};
use iceberg::table::Table;
use iceberg::{TableRequirement, TableUpdate};
use mink_core::table::TablePath;

use super::commit_metadata;
use crate::catalog::Lake;
use crate::error::{LakeError, Result};
use crate::layout::{check_inside, relocates_files};

/// Checks and commits another engine's `requirements` and `updates` to the lake table
/// of `path`, one of mink's own; returns the table's metadata as committed and its location.
///
/// # Errors
/// - [`LakeError::CommitConflict`] when a requirement does not hold or another commit
///   swapped the table's metadata first (nothing was committed);
/// - [`LakeError::Refused`] for an update mink does not take from other engines (see the
///   module docs) or a file outside the table's location;
/// - [`LakeError::Iceberg`] when the table does not exist (`TableNotFound`), its files
///   cannot be read or the updates do not apply to its metadata; [`LakeError::Catalog`]
///   when the catalog's database fails.
pub async fn commit_foreign(
    lake: &Lake,
    path: &TablePath,
    requirements: &[TableRequirement],
    updates: Vec<TableUpdate>,
) -> Result<(TableMetadata, String)> {
    let current = checked(lake, path, requirements).await?;
    let mut added = HashSet::new();
    for update in &updates {
        match update {
            TableUpdate::AddSnapshot { snapshot } => {
                check_append(&current, snapshot)
                    .await
                    .map_err(|message| refused(path, message))?;
                added.insert(snapshot.snapshot_id());
            }
            TableUpdate::SetSnapshotRef {
                ref_name,
                reference,
            } if ref_name == MAIN_BRANCH && added.contains(&reference.snapshot_id) => {}
            other => {
                return Err(refused(
                    path,
                    format!(
                        "mink owns the schema, partitioning and properties of its lake \
                         tables: other engines may only append to a log table's lake \
                         (add-snapshot of an append, then set-snapshot-ref main to it), not {}",
                        update_name(other)
                    ),
                ));
            }
        }
    }
    apply(lake, &current, updates).await
}

/// Checks and commits `requirements` and `updates` of the REST client that created the
/// lake table of `path` (in a namespace it created, see the module docs); returns the
/// table's metadata as committed and its location.
///
/// # Errors
/// As [`commit_foreign`]'s; refused are a new location and a file outside the table's
/// location.
pub async fn commit_hosted(
    lake: &Lake,
    path: &TablePath,
    requirements: &[TableRequirement],
    updates: Vec<TableUpdate>,
) -> Result<(TableMetadata, String)> {
    let current = checked(lake, path, requirements).await?;
    for update in &updates {
        match update {
            TableUpdate::AddSnapshot { snapshot } => {
                check_files_inside(&current, snapshot)
                    .await
                    .map_err(|message| refused(path, message))?;
            }
            TableUpdate::SetLocation { .. } => {
                return Err(refused(
                    path,
                    "a table keeps the location the catalog gave it".to_string(),
                ));
            }
            TableUpdate::SetProperties { updates } => {
                if let Some(property) = updates.keys().find(|key| relocates_files(key)) {
                    return Err(refused(
                        path,
                        format!("table property {property} would write files elsewhere"),
                    ));
                }
            }
            _ => {}
        }
    }
    apply(lake, &current, updates).await
}

/// The table of `path`, loaded, if `requirements` hold against it.
async fn checked(
    lake: &Lake,
    path: &TablePath,
    requirements: &[TableRequirement],
) -> Result<Table> {
    let current = lake.load(path).await?;
    for requirement in requirements {
        requirement
            .check(Some(current.metadata()))
            .map_err(|error| LakeError::CommitConflict {
                table: path.to_string(),
                message: error.message().to_string(),
            })?;
    }
    Ok(current)
}

/// Commits `updates`, checked, on `current` (none: nothing is written).
async fn apply(
    lake: &Lake,
    current: &Table,
    updates: Vec<TableUpdate>,
) -> Result<(TableMetadata, String)> {
    if updates.is_empty() {
        let location = current.metadata_location_result()?.to_string();
        return Ok((current.metadata().clone(), location));
    }
    commit_metadata(lake, current, |builder| {
        updates
            .into_iter()
            .try_fold(builder, |builder, update| update.apply(builder))
    })
    .await
}

fn refused(path: &TablePath, message: String) -> LakeError {
    LakeError::Refused {
        table: path.to_string(),
        message,
    }
}

/// Checks that `snapshot` appends data files to `table`'s current snapshot, all inside
/// the table's location; the message says why not.
async fn check_append(table: &Table, snapshot: &Snapshot) -> Result<(), String> {
    let metadata = table.metadata();
    if is_primary_key_table(metadata) {
        return Err(
            "a primary-key table's lake takes no data files from other engines: its keys \
             would duplicate those mink tiers"
                .to_string(),
        );
    }
    let operation = &snapshot.summary().operation;
    if *operation != Operation::Append {
        return Err(format!(
            "other engines may only append to mink's lake, not commit a {} snapshot",
            operation.as_str()
        ));
    }
    let properties = &snapshot.summary().additional_properties;
    if let Some(property) = properties.keys().find(|key| key.starts_with(MINK_PREFIX)) {
        return Err(format!(
            "snapshot summary property {property} is mink's own (tiering finds its offsets \
             by it): other engines may not set it"
        ));
    }
    if snapshot.parent_snapshot_id() != metadata.current_snapshot_id() {
        return Err(format!(
            "snapshot {} builds on snapshot {:?}, not on the table's current snapshot {:?}",
            snapshot.snapshot_id(),
            snapshot.parent_snapshot_id(),
            metadata.current_snapshot_id()
        ));
    }
    let files = new_files(table, snapshot).await?;
    if let Some(dropped) = files.dropped.first() {
        return Err(format!(
            "an append keeps every manifest of its parent, and this one drops {dropped}"
        ));
    }
    for (manifest, entries) in &files.added {
        if manifest.content != ManifestContentType::Data {
            return Err(format!(
                "an append adds data files only, and manifest {} holds deletes",
                manifest.manifest_path
            ));
        }
        if let Some(entry) = entries
            .entries()
            .iter()
            .find(|entry| entry.content_type() != DataContentType::Data)
        {
            return Err(format!(
                "an append adds data files only, and {} holds deletes",
                entry.file_path()
            ));
        }
    }
    Ok(())
}

/// Checks that every file `snapshot` names lies inside `table`'s location; the message
/// says which does not.
async fn check_files_inside(table: &Table, snapshot: &Snapshot) -> Result<(), String> {
    new_files(table, snapshot).await.map(|_| ())
}

/// What a snapshot changes against the table's current snapshot, at the manifest level.
struct NewFiles {
    /// The snapshot's manifests the current snapshot does not have, loaded.
    added: Vec<(ManifestFile, Manifest)>,
    /// The current snapshot's manifests the snapshot does not keep.
    dropped: Vec<String>,
}

/// Reads `snapshot`'s manifest list and the manifests it adds to the table's current
/// snapshot, checking that the list, every manifest and every added manifest's files lie
/// inside the table's location (the current snapshot's files were checked when they came).
async fn new_files(table: &Table, snapshot: &Snapshot) -> Result<NewFiles, String> {
    let metadata = table.metadata();
    let location = metadata.location();
    check_inside(location, snapshot.manifest_list())?;
    let read =
        |error: iceberg::Error| format!("reading snapshot {}: {error}", snapshot.snapshot_id());
    let list = table
        .manifest_list_reader(&Arc::new(snapshot.clone()))
        .load()
        .await
        .map_err(read)?;
    let current: HashSet<String> = match metadata.current_snapshot() {
        Some(current) => table
            .manifest_list_reader(current)
            .load()
            .await
            .map_err(read)?
            .entries()
            .iter()
            .map(|manifest| manifest.manifest_path.clone())
            .collect(),
        None => HashSet::new(),
    };
    let kept: HashSet<&str> = list
        .entries()
        .iter()
        .map(|manifest| manifest.manifest_path.as_str())
        .collect();
    let mut dropped: Vec<String> = current
        .iter()
        .filter(|path| !kept.contains(path.as_str()))
        .cloned()
        .collect();
    dropped.sort_unstable();
    let mut added = Vec::new();
    for manifest in list.entries() {
        check_inside(location, &manifest.manifest_path)?;
        if current.contains(&manifest.manifest_path) {
            continue;
        }
        let entries = manifest
            .load_manifest(table.file_io())
            .await
            .map_err(read)?;
        for entry in entries.entries() {
            check_inside(location, entry.file_path())?;
        }
        added.push((manifest.clone(), entries));
    }
    Ok(NewFiles { added, dropped })
}

/// The prefix of the snapshot summary properties mink's own commits carry
/// ([`crate::offsets::BUCKET_OFFSETS_PROPERTY`]).
const MINK_PREFIX: &str = "mink.";

/// Whether the lake table is a primary-key table's: its schema has identifier fields.
fn is_primary_key_table(metadata: &TableMetadata) -> bool {
    metadata
        .current_schema()
        .identifier_field_ids()
        .next()
        .is_some()
}

/// The REST protocol's name of an update (`add-schema`, `set-properties`, ...).
fn update_name(update: &TableUpdate) -> String {
    serde_json::to_value(update)
        .ok()
        .and_then(|value| value.get("action")?.as_str().map(str::to_string))
        .unwrap_or_else(|| "this update".to_string())
}
