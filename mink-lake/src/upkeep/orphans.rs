//! Removing orphan files: files under a table's location that no snapshot, no metadata
//! file of its log and no commit in flight references.
//!
//! Orphans come from a crash (a round's files before its commit, when no pending record
//! names them; an expiry's deletes after its commit), from a failed delete, and from other
//! engines' aborted commits. Only files older than a grace period go, so that a commit in
//! flight (another engine's, or one of a process that does not hold the tiering lock)
//! keeps the files it wrote before its swap: at least [`super::MIN_ORPHAN_GRACE`], as Iceberg's
//! Spark procedure requires, since such a commit writes its data files minutes before its
//! manifests name them.
//!
//! Lease objects ([`super::leases`]) are not orphans: their lapsed ones go with expiry.
//! A snapshot a read holds stays readable: while a lease names a snapshot the metadata no
//! longer has (an expiry spared its files for a read planned during it), nothing is
//! removed.

use std::collections::HashSet;
use std::time::Duration;

use futures::TryStreamExt;
use iceberg::table::Table;
use object_store::path::Path as StorePath;
use object_store::{ObjectMeta, ObjectStoreExt};
use tracing::{info, warn};

use super::leases::LEASES_DIR;
use super::reachable::Reachable;
use super::retention::Retention;
use crate::catalog::Lake;
use crate::error::{LakeError, Result};

/// How old an unreferenced file must be to be removed: Iceberg's own default for
/// `remove_orphan_files` (three days).
pub const DEFAULT_ORPHAN_GRACE: Duration = Duration::from_secs(3 * 24 * 3600);

/// What an orphan removal did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrphanReport {
    /// The locations of the files removed.
    pub removed: Vec<String>,
    /// Their bytes.
    pub bytes: u64,
}

/// Removes the files under `table`'s location that nothing references and that were last
/// modified before `older_than_ms`, unless a read holds a snapshot of `leased` that the
/// metadata no longer has (then nothing is removed).
///
/// This is the mechanism, with any cutoff: the node holds requests to
/// [`super::MIN_ORPHAN_GRACE`].
///
/// # Errors
/// [`LakeError::Layout`] when the table's `gc.enabled` is false; read errors of the
/// metadata or the listing (nothing is removed then). A file that cannot be removed is
/// logged and left.
pub async fn remove_orphan_files(
    lake: &Lake,
    table: &Table,
    older_than_ms: i64,
    leased: &HashSet<i64>,
) -> Result<OrphanReport> {
    let name = table.identifier().to_string();
    let metadata = table.metadata();
    if !Retention::of(&name, metadata)?.gc_enabled {
        return Err(LakeError::layout(
            &name,
            "gc.enabled is false: its files may be shared, so mink removes none",
        ));
    }
    if let Some(gone) = leased
        .iter()
        .find(|id| metadata.snapshot_by_id(**id).is_none())
    {
        info!(table = %name, snapshot_id = gone, "a read holds a snapshot expired under it; orphans are removed once it ends");
        return Ok(OrphanReport::default());
    }
    // Listed before the references are read: a file committed in between is referenced.
    let listing = list_files(lake, metadata.location()).await?;
    let snapshots: Vec<_> = metadata.snapshots().cloned().collect();
    let reachable = Reachable::of(table, &snapshots).await?;
    let storage = lake.storage();
    let referenced: HashSet<StorePath> = reachable
        .manifest_lists
        .iter()
        .chain(&reachable.manifests)
        .chain(&reachable.files)
        .map(String::as_str)
        .chain(
            metadata
                .metadata_log()
                .iter()
                .map(|l| l.metadata_file.as_str()),
        )
        .chain([table.metadata_location_result()?])
        // A location outside the store is not under the table's location either.
        .filter_map(|location| storage.path(location).ok())
        .collect();
    let leases = storage.path(&format!(
        "{}/{LEASES_DIR}",
        metadata.location().trim_end_matches('/')
    ))?;
    let mut report = OrphanReport::default();
    for file in listing {
        if referenced.contains(&file.location)
            || file.location.prefix_matches(&leases)
            || file.last_modified.timestamp_millis() >= older_than_ms
        {
            continue;
        }
        if delete_file(lake, &file.location).await {
            report
                .removed
                .push(location_of(storage.url_prefix(), &file.location));
            report.bytes += file.size;
        }
    }
    if !report.removed.is_empty() {
        info!(table = %name, files = report.removed.len(), bytes = report.bytes, "removed orphan lake files");
    }
    Ok(report)
}

/// The lake location of a store path.
fn location_of(url_prefix: &str, path: &StorePath) -> String {
    match url_prefix {
        "" => format!("/{path}"),
        prefix => format!("{prefix}{path}"),
    }
}

/// Every file under a location of the lake.
pub(super) async fn list_files(lake: &Lake, location: &str) -> Result<Vec<ObjectMeta>> {
    let storage = lake.storage();
    let prefix = storage.path(location.trim_end_matches('/'))?;
    Ok(storage.store()?.list(Some(&prefix)).try_collect().await?)
}

/// Deletes one file of the lake's store; false (and logged) when it could not be.
pub(super) async fn delete_file(lake: &Lake, path: &StorePath) -> bool {
    let deleted = match lake.storage().store() {
        Ok(store) => store.delete(path).await.map_err(LakeError::from),
        Err(error) => Err(error.into()),
    };
    match deleted {
        Ok(()) | Err(LakeError::ObjectStore(object_store::Error::NotFound { .. })) => true,
        Err(error) => {
            warn!(%path, %error, "could not delete an unreferenced lake file");
            false
        }
    }
}
