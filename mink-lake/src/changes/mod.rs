//! Incremental reads: the rows a lake table's snapshots changed between two snapshots.
//!
//! A consumer that has read a lake table as of snapshot `from` catches up to snapshot
//! `to` by applying the changes of every snapshot in between, instead of reading `to`
//! in full. Iceberg 0.10 has no incremental scan (`TableScan` reads one snapshot), so
//! the changes are built from the manifest layer: [`plan_changes`] finds what each snapshot
//! of the range added, [`read_changes`] streams the rows those files insert or delete.
//!
//! # The range
//!
//! The snapshots of `(from, to]`: `to` and its ancestors down to `from` (excluded),
//! oldest first, found with `iceberg::util::snapshot::ancestors_between`. That walk
//! silently goes to the root when `from` is not an ancestor of `to`; [`plan_changes`]
//! checks that it stopped at `from` and is an error ([`LakeError::NotAncestor`])
//! otherwise. `from == to` is an empty range: the cursor is caught up.
//!
//! # What each snapshot contributes
//!
//! Each snapshot's own manifest entries (added by it, ADDED or DELETED) say what it
//! did:
//!
//! | the snapshot                      | contributes                                        |
//! |-----------------------------------|----------------------------------------------------|
//! | adds a data file                  | an `insert` per row                                 |
//! | adds an equality-delete file      | a `delete` per row of the file: the equality columns, the others null |
//! | adds a position-delete file       | a `delete` per row it names: the row, read from its data file |
//! | is a `replace` (compaction)       | nothing: the same rows in other files              |
//! | removes a file, not a `replace`   | no change set can express it: [`ChangesPlan::needs_full_reload`] |
//!
//! Position deletes are what mink's own tiering writes for a primary-key table (see
//! [`crate::deletes`]): resolving them to the rows they remove (only the rows at those
//! positions are decoded, see [`crate::reader`]) is what makes such a table's rounds a
//! real change set rather than a full reload.
//!
//! # Applying the changes
//!
//! Snapshot by snapshot, oldest first: its deletes, then its inserts. [`read_changes`]
//! streams the rows in that order, each with its snapshot's sequence number (it grows
//! with commit order, ids do not): a reader that reorders them (an engine running in
//! parallel) restores the order by sequence number, then change type (`delete` <
//! `insert`).
//!
//! A delete removes the rows it identifies: for a primary-key table the row with its
//! key; for an equality delete the rows equal to it on its equality columns (the columns
//! the file holds); otherwise the row equal to it. A tiering round of a primary-key table
//! writes the new version of every changed key and position-deletes the old one:
//!
//! ```text
//!  lake at from     round S (overwrite)                    changes of S     state at S
//!  k1 a             data file:      k1 b, k4 d              delete k1 a      k1 b
//!  k2 c             position del:   (f0, 0), (f0, 1)        delete k2 c      k4 d
//!   (file f0)                                               insert k1 b
//!                                                           insert k4 d
//! ```
//!
//! Deletes first is right for every writer: equality deletes never apply to the data
//! files of their own snapshot, and a position delete naming a row its own snapshot
//! added is netted out: that row was never visible, so it is neither inserted nor
//! deleted. Across snapshots nothing is netted: a row inserted by one snapshot and
//! deleted by a later one in the range appears twice, as it happened.
//!
//! # Limits
//!
//! - A delete of a row an earlier delete already removed (two writers deleting the same
//!   row) appears twice; applying it by key is then only right if no snapshot between
//!   the two re-inserted the key. mink's tiering never does this.
//! - An equality delete carries only its equality columns, so a consumer keyed by the
//!   primary key can apply it only when those columns are the key.
//! - A snapshot that removes files outside a `replace` (an overwrite rewriting data
//!   files, a delete dropping whole files) cannot be expressed; expired snapshots are not
//!   in the lineage and make the range unknown ([`LakeError::SnapshotNotFound`]).

mod read;
#[cfg(test)]
mod tests;
mod wire;

use futures::{StreamExt, TryStreamExt, stream};
use iceberg::spec::{DataContentType, ManifestStatus, Operation, SnapshotRef};
use iceberg::table::Table;
use iceberg::util::snapshot::ancestors_between;

pub use self::read::{
    CHANGE_TYPE_COLUMN, DELETE, DeletedRows, INSERT, SEQUENCE_NUMBER_COLUMN, SNAPSHOT_ID_COLUMN,
    changes_schema, read_changes,
};
use crate::error::{LakeError, Result};
use crate::reader::{DeleteKind, LakeDeleteFile, equality_columns};

/// How many snapshots' manifests are read at once.
const SNAPSHOT_READS: usize = 8;

/// The changes of a lake table from one snapshot to a newer one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangesPlan {
    /// The snapshot the changes start after.
    pub from_snapshot_id: i64,
    /// The snapshot they end at.
    pub to_snapshot_id: i64,
    /// The snapshots of `(from, to]`, oldest first, each with what it changed. Empty
    /// when `from == to`.
    pub snapshots: Vec<ChangedSnapshot>,
}

/// What one snapshot changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangedSnapshot {
    /// The snapshot.
    pub snapshot_id: i64,
    /// Its Iceberg sequence number: grows with commit order, unlike snapshot ids.
    pub sequence_number: i64,
    /// Its operation.
    pub operation: Operation,
    /// The data files it added (their rows are inserts); none for a `replace`.
    pub added_files: Vec<AddedFile>,
    /// The delete files it added (the rows they remove are deletes); none for a
    /// `replace`.
    pub delete_files: Vec<LakeDeleteFile>,
    /// How many data or delete files it removed; not counted for a `replace`.
    pub removed_files: u64,
}

/// A data file a snapshot added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedFile {
    /// Its location.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its row count.
    pub record_count: u64,
}

impl ChangesPlan {
    /// Whether the range holds no snapshot (the cursor is caught up).
    pub fn is_empty(&self) -> bool {
        self.snapshots.is_empty()
    }

    /// Whether no change set can express the range (a snapshot in it removed files outside a
    /// `replace`): the consumer reads `to` in full instead.
    pub fn needs_full_reload(&self) -> bool {
        self.full_reload_cause().is_some()
    }

    /// The first snapshot of the range no change set can express.
    pub fn full_reload_cause(&self) -> Option<&ChangedSnapshot> {
        self.snapshots.iter().find(|s| s.needs_full_reload())
    }

    /// Every data file the range added, oldest snapshot first.
    pub fn added_files(&self) -> impl Iterator<Item = &AddedFile> {
        self.snapshots.iter().flat_map(|s| &s.added_files)
    }

    /// Every delete file the range added, oldest snapshot first.
    pub fn delete_files(&self) -> impl Iterator<Item = &LakeDeleteFile> {
        self.snapshots.iter().flat_map(|s| &s.delete_files)
    }
}

impl ChangedSnapshot {
    /// Whether no change set can express the snapshot: it removed files and is not a
    /// `replace`.
    pub fn needs_full_reload(&self) -> bool {
        self.operation != Operation::Replace && self.removed_files > 0
    }
}

/// Plans the changes of `table` from snapshot `from` (excluded) to snapshot `to`
/// (included); see the [module docs](self). Only manifests are read.
///
/// # Errors
/// [`LakeError::SnapshotNotFound`] when the table has no snapshot `from` or `to`, or
/// no longer has one between them (expired);
/// [`LakeError::NotAncestor`] when `from` is not an ancestor of `to`;
/// [`LakeError::Iceberg`] when a manifest cannot be read; [`LakeError::Layout`] for an
/// equality-delete file naming a field its snapshot's schema lacks.
pub async fn plan_changes(table: &Table, from: i64, to: i64) -> Result<ChangesPlan> {
    let metadata = table.metadata_ref();
    let name = table.identifier().to_string();
    for snapshot_id in [from, to] {
        if metadata.snapshot_by_id(snapshot_id).is_none() {
            return Err(LakeError::SnapshotNotFound {
                table: name,
                snapshot_id,
            });
        }
    }
    let mut lineage: Vec<SnapshotRef> = ancestors_between(&metadata, to, Some(from)).collect();
    // The walk ends at `from` when it is an ancestor, else at the root or at a parent
    // that was expired.
    match lineage.last().map(|oldest| oldest.parent_snapshot_id()) {
        None => {}
        Some(Some(parent)) if parent == from => {}
        Some(Some(parent)) if metadata.snapshot_by_id(parent).is_none() => {
            return Err(LakeError::SnapshotNotFound {
                table: name,
                snapshot_id: parent,
            });
        }
        Some(_) => {
            return Err(LakeError::NotAncestor {
                table: name,
                from,
                to,
            });
        }
    }
    lineage.reverse();
    let snapshots = stream::iter(lineage)
        .map(|snapshot| changed_snapshot(table, snapshot))
        .buffered(SNAPSHOT_READS)
        .try_collect()
        .await?;
    Ok(ChangesPlan {
        from_snapshot_id: from,
        to_snapshot_id: to,
        snapshots,
    })
}

/// What `snapshot` changed, from the entries of the manifests it wrote.
async fn changed_snapshot(table: &Table, snapshot: SnapshotRef) -> Result<ChangedSnapshot> {
    let snapshot_id = snapshot.snapshot_id();
    let mut changed = ChangedSnapshot {
        snapshot_id,
        sequence_number: snapshot.sequence_number(),
        operation: snapshot.summary().operation.clone(),
        added_files: Vec::new(),
        delete_files: Vec::new(),
        removed_files: 0,
    };
    if changed.operation == Operation::Replace {
        return Ok(changed);
    }
    let metadata = table.metadata();
    let schema = snapshot.schema(metadata)?;
    let name = table.identifier().to_string();
    let list = table.manifest_list_reader(&snapshot).load().await?;
    // Only a manifest the snapshot wrote can hold entries it added or removed.
    for manifest in list
        .entries()
        .iter()
        .filter(|m| m.added_snapshot_id == snapshot_id)
    {
        let manifest = manifest.load_manifest(table.file_io()).await?;
        for entry in manifest.entries() {
            if entry.snapshot_id() != Some(snapshot_id) {
                continue;
            }
            let file = entry.data_file();
            match entry.status() {
                ManifestStatus::Existing => {}
                ManifestStatus::Deleted => changed.removed_files += 1,
                ManifestStatus::Added => match file.content_type() {
                    DataContentType::Data => changed.added_files.push(AddedFile {
                        path: file.file_path().to_string(),
                        size: file.file_size_in_bytes(),
                        record_count: file.record_count(),
                    }),
                    DataContentType::PositionDeletes => changed.delete_files.push(LakeDeleteFile {
                        path: file.file_path().to_string(),
                        size: file.file_size_in_bytes(),
                        kind: DeleteKind::Positions,
                    }),
                    DataContentType::EqualityDeletes => {
                        let columns = equality_columns(
                            &schema,
                            &file.equality_ids().unwrap_or_default(),
                            file.file_path(),
                            &name,
                        )?;
                        changed.delete_files.push(LakeDeleteFile {
                            path: file.file_path().to_string(),
                            size: file.file_size_in_bytes(),
                            kind: DeleteKind::Equality { columns },
                        });
                    }
                },
            }
        }
    }
    Ok(changed)
}
