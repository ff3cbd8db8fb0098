//! Expiring snapshots: dropping old snapshots from a table's metadata, then deleting the
//! files only they referenced.
//!
//! ```text
//!  choose     expirable_snapshots: older than the maximum age, replaced more than the
//!             read grace ago, not among the newest kept, no branch or tag head, not
//!             one the caller keeps (mink's recorded seam)
//!  plan       the files of the expired snapshots that no kept snapshot reads (read
//!             before the commit, from the metadata that still names them)
//!  commit     new metadata without them, swapped in on the catalog (a conflict if the
//!             table moved on: nothing is deleted)
//!  delete     the planned files, then the metadata files older than the metadata log
//! ```
//!
//! A crash between the commit and the deletes leaves unreferenced files, which
//! [`super::remove_orphan_files`] deletes later.

use std::collections::{HashMap, HashSet};

use iceberg::spec::{DataContentType, SnapshotRef, TableMetadata};
use iceberg::table::Table;
use tracing::info;

use super::reachable::{Reachable, load_manifests, manifest_lists};
use super::retention::Retention;
use crate::catalog::Lake;
use crate::commit::commit_metadata;
use crate::error::{LakeError, Result};
use crate::writer::delete_files;

/// What an expiry did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpireReport {
    /// The snapshots expired.
    pub expired: Vec<i64>,
    /// Data files deleted.
    pub data_files_deleted: u64,
    /// Position and equality delete files deleted.
    pub delete_files_deleted: u64,
    /// Manifests deleted.
    pub manifests_deleted: u64,
    /// Manifest lists deleted.
    pub manifest_lists_deleted: u64,
    /// Metadata files deleted (older than the table's metadata log).
    pub metadata_files_deleted: u64,
}

/// The snapshots of `metadata` that expire at `now_ms` under `retention`, oldest first:
/// older than the maximum age, replaced by a newer snapshot more than the read grace ago,
/// not among the newest `min_snapshots_to_keep` of the main branch, not the head of a
/// branch or a tag, and not in `keep`.
pub fn expirable_snapshots(
    metadata: &TableMetadata,
    retention: &Retention,
    now_ms: i64,
    keep: &HashSet<i64>,
) -> Vec<i64> {
    let age_ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let too_old = now_ms.saturating_sub(age_ms(retention.max_snapshot_age));
    let replaced_before = now_ms.saturating_sub(age_ms(retention.read_grace()));
    let mut kept: HashSet<i64> = keep.clone();
    kept.extend(ref_heads(metadata));
    let mut ancestor = metadata.current_snapshot();
    for _ in 0..retention.min_snapshots_to_keep {
        let Some(snapshot) = ancestor else { break };
        kept.insert(snapshot.snapshot_id());
        ancestor = snapshot
            .parent_snapshot_id()
            .and_then(|parent| metadata.snapshot_by_id(parent));
    }
    // When each snapshot was replaced: the first commit made on top of it.
    let mut replaced_at: HashMap<i64, i64> = HashMap::new();
    for snapshot in metadata.snapshots() {
        if let Some(parent) = snapshot.parent_snapshot_id() {
            let at = replaced_at.entry(parent).or_insert(i64::MAX);
            *at = (*at).min(snapshot.timestamp_ms());
        }
    }
    let mut expired: Vec<&SnapshotRef> = metadata
        .snapshots()
        .filter(|s| !kept.contains(&s.snapshot_id()))
        .filter(|s| s.timestamp_ms() < too_old)
        .filter(|s| {
            let replaced = replaced_at.get(&s.snapshot_id()).copied();
            replaced.unwrap_or(s.timestamp_ms()) < replaced_before
        })
        .collect();
    expired.sort_by_key(|s| (s.timestamp_ms(), s.sequence_number()));
    expired.iter().map(|s| s.snapshot_id()).collect()
}

/// The snapshots every branch and tag points at. iceberg 0.10 keeps a table's refs
/// crate-private; their serialized form lists them.
fn ref_heads(metadata: &TableMetadata) -> HashSet<i64> {
    let serialized = serde_json::to_value(metadata).unwrap_or_default();
    let refs = serialized.get("refs").and_then(|refs| refs.as_object());
    let heads = refs.into_iter().flat_map(|refs| refs.values());
    heads
        .filter_map(|head| head.get("snapshot-id")?.as_i64())
        .chain(metadata.current_snapshot_id())
        .collect()
}

/// Expires `expired` (from [`expirable_snapshots`] on `table` as loaded): commits the
/// table's metadata without them. The files only they referenced are planned before the
/// commit and deleted by [`Expiry::delete_unreferenced`] after it.
///
/// # Errors
/// - [`LakeError::Layout`] when the table's `gc.enabled` is false, or a snapshot to expire
///   is the current one; [`LakeError::SnapshotNotFound`] for an unknown one.
/// - [`LakeError::CommitConflict`] when the table moved on since it was loaded.
/// - Read and write errors of the metadata, and the catalog's. Nothing is expired then,
///   unless the swap's outcome could not be checked ([`LakeError::Catalog`]): it may be,
///   and the files stay (orphans, should it be).
pub async fn expire_snapshots(lake: &Lake, table: &Table, expired: &[i64]) -> Result<Expiry> {
    let name = table.identifier().to_string();
    let metadata = table.metadata();
    if !Retention::of(&name, metadata)?.gc_enabled {
        return Err(LakeError::layout(
            &name,
            "gc.enabled is false: its files may be shared, so mink expires nothing",
        ));
    }
    if let Some(unknown) = expired
        .iter()
        .find(|id| metadata.snapshot_by_id(**id).is_none())
    {
        return Err(LakeError::SnapshotNotFound {
            table: name,
            snapshot_id: *unknown,
        });
    }
    let expiring: HashSet<i64> = expired.iter().copied().collect();
    if metadata
        .current_snapshot_id()
        .is_some_and(|id| expiring.contains(&id))
    {
        return Err(LakeError::layout(
            &name,
            "the current snapshot cannot expire",
        ));
    }
    let mut expiry = Expiry {
        table: table.clone(),
        expired: expired.to_vec(),
        doomed: Doomed::default(),
        metadata: None,
    };
    if expired.is_empty() {
        return Ok(expiry);
    }
    let (gone, kept): (Vec<SnapshotRef>, Vec<SnapshotRef>) = metadata
        .snapshots()
        .cloned()
        .partition(|s| expiring.contains(&s.snapshot_id()));
    expiry.doomed = unreferenced_files(table, &gone, &kept).await?;

    let committed =
        commit_metadata(lake, table, |builder| Ok(builder.remove_snapshots(expired))).await?;
    expiry.metadata = Some(committed);
    Ok(expiry)
}

/// A committed expiry whose unreferenced files are still to delete.
#[derive(Debug)]
pub struct Expiry {
    table: Table,
    expired: Vec<i64>,
    doomed: Doomed,
    /// The metadata committed without the expired snapshots, and its location; `None`
    /// when nothing expired.
    metadata: Option<(TableMetadata, String)>,
}

impl Expiry {
    /// The snapshots expired.
    pub fn expired(&self) -> &[i64] {
        &self.expired
    }

    /// Keeps the files `snapshots` read, of those this expiry expired: a read planned on
    /// them between the choice of what to expire and the commit (a read naming an older
    /// snapshot itself). They are left for orphan removal once no lease holds them.
    ///
    /// # Errors
    /// The snapshots' manifest lists or manifests could not be read (nothing is deleted
    /// then).
    pub async fn spare(&mut self, snapshots: &HashSet<i64>) -> Result<()> {
        let spared: Vec<SnapshotRef> = self
            .expired
            .iter()
            .filter(|id| snapshots.contains(id))
            .filter_map(|id| self.table.metadata().snapshot_by_id(*id).cloned())
            .collect();
        if spared.is_empty() {
            return Ok(());
        }
        let read = Reachable::of(&self.table, &spared).await?;
        let doomed = &mut self.doomed;
        doomed
            .manifest_lists
            .retain(|path| !read.manifest_lists.contains(path));
        doomed
            .manifests
            .retain(|path| !read.manifests.contains(path));
        doomed.files.retain(|(path, _)| !read.files.contains(path));
        Ok(())
    }

    /// Deletes the files only the expired snapshots referenced, then the metadata files
    /// older than the table's metadata log. Best effort: a file that cannot be deleted is
    /// logged and left, an orphan [`super::remove_orphan_files`] deletes later.
    pub async fn delete_unreferenced(self, lake: &Lake) -> ExpireReport {
        let Self {
            table,
            expired,
            doomed,
            metadata,
        } = self;
        let mut report = ExpireReport {
            manifest_lists_deleted: doomed.manifest_lists.len() as u64,
            manifests_deleted: doomed.manifests.len() as u64,
            ..ExpireReport::default()
        };
        for (_, content) in &doomed.files {
            match content {
                DataContentType::Data => report.data_files_deleted += 1,
                _ => report.delete_files_deleted += 1,
            }
        }
        let paths: Vec<String> = doomed
            .manifest_lists
            .into_iter()
            .chain(doomed.manifests)
            .chain(doomed.files.into_iter().map(|(path, _)| path))
            .collect();
        // Best effort: the failures are logged.
        let _ = delete_files(&table, &paths).await;
        if let Some((metadata, location)) = metadata {
            report.metadata_files_deleted =
                delete_old_metadata_files(lake, &metadata, &location).await;
        }
        info!(table = %table.identifier(), expired = expired.len(), data_files = report.data_files_deleted,
            delete_files = report.delete_files_deleted, manifests = report.manifests_deleted,
            "expired lake snapshots");
        report.expired = expired;
        report
    }
}

/// The files of the expiring snapshots that no kept snapshot reads.
#[derive(Debug, Default)]
struct Doomed {
    manifest_lists: Vec<String>,
    manifests: Vec<String>,
    files: Vec<(String, DataContentType)>,
}

async fn unreferenced_files(
    table: &Table,
    gone: &[SnapshotRef],
    kept: &[SnapshotRef],
) -> Result<Doomed> {
    let reachable = Reachable::of(table, kept).await?;
    let mut doomed = Doomed::default();
    let mut manifests = Vec::new();
    let mut seen = HashSet::new();
    for (snapshot, list) in gone.iter().zip(manifest_lists(table, gone).await?) {
        let list_path = snapshot.manifest_list();
        if !reachable.manifest_lists.contains(list_path) {
            doomed.manifest_lists.push(list_path.to_string());
        }
        for manifest in list {
            let path = &manifest.manifest_path;
            if !reachable.manifests.contains(path) && seen.insert(path.clone()) {
                doomed.manifests.push(path.clone());
                manifests.push(manifest);
            }
        }
    }
    let mut files = HashSet::new();
    for manifest in load_manifests(table, manifests).await? {
        for entry in manifest.entries() {
            let path = entry.file_path();
            if !reachable.files.contains(path) && files.insert(path.to_string()) {
                doomed
                    .files
                    .push((path.to_string(), entry.data_file().content_type()));
            }
        }
    }
    Ok(doomed)
}

/// Deletes the table's metadata files of versions older than every one its metadata log
/// (or `current`) names: nothing references them, and no commit can make them current
/// again (a commit in flight writes a newer version). Returns how many went; failures
/// are logged and leave orphans.
async fn delete_old_metadata_files(lake: &Lake, metadata: &TableMetadata, current: &str) -> u64 {
    let logged = metadata
        .metadata_log()
        .iter()
        .map(|l| l.metadata_file.as_str());
    let Some(oldest) = logged.chain([current]).filter_map(metadata_version).min() else {
        return 0;
    };
    let dir = format!("{}/metadata/", metadata.location());
    let listing = match super::orphans::list_files(lake, &dir).await {
        Ok(listing) => listing,
        Err(error) => {
            tracing::warn!(%dir, %error, "could not list old metadata files; left for orphan removal");
            return 0;
        }
    };
    let mut deleted = 0;
    for file in listing {
        if metadata_version(file.location.as_ref()).is_some_and(|version| version < oldest)
            && super::orphans::delete_file(lake, &file.location).await
        {
            deleted += 1;
        }
    }
    deleted
}

/// The version of a metadata file (`<location>/metadata/00042-<uuid>.metadata.json`).
fn metadata_version(path: &str) -> Option<u64> {
    let name = path.rsplit('/').next()?;
    if !name.contains(".metadata.json") {
        return None;
    }
    name.split_once('-')?.0.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metadata_file_has_the_version_of_its_name() {
        let dir = "/w/db/t/metadata";
        assert_eq!(
            metadata_version(&format!("{dir}/00042-1b2c.metadata.json")),
            Some(42)
        );
        assert_eq!(
            metadata_version(&format!("{dir}/00003-ab.gz.metadata.json")),
            Some(3)
        );
        assert_eq!(metadata_version(&format!("{dir}/snap-1-0-ab.avro")), None);
        assert_eq!(metadata_version(&format!("{dir}/v1.metadata.json")), None);
    }
}
