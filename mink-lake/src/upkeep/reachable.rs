//! The files a set of snapshots reads.

use std::collections::HashSet;

use futures::{StreamExt, TryStreamExt, stream};
use iceberg::spec::{Manifest, ManifestFile, SnapshotRef};
use iceberg::table::Table;

use crate::error::Result;

/// How many manifest lists or manifests are read at once.
const READS: usize = 8;

/// What some snapshots of a table read: their manifest lists, their manifests and the
/// data and delete files live in them.
#[derive(Debug, Default)]
pub(super) struct Reachable {
    pub(super) manifest_lists: HashSet<String>,
    pub(super) manifests: HashSet<String>,
    pub(super) files: HashSet<String>,
}

impl Reachable {
    /// What `snapshots` of `table` read.
    pub(super) async fn of(table: &Table, snapshots: &[SnapshotRef]) -> Result<Self> {
        let mut reachable = Self::default();
        let lists = manifest_lists(table, snapshots).await?;
        let mut manifests = Vec::new();
        for (snapshot, list) in snapshots.iter().zip(lists) {
            reachable
                .manifest_lists
                .insert(snapshot.manifest_list().to_string());
            for manifest in list {
                if reachable.manifests.insert(manifest.manifest_path.clone()) {
                    manifests.push(manifest);
                }
            }
        }
        for manifest in load_manifests(table, manifests).await? {
            let live = manifest.entries().iter().filter(|entry| entry.is_alive());
            reachable
                .files
                .extend(live.map(|entry| entry.file_path().to_string()));
        }
        Ok(reachable)
    }
}

/// The manifests named by each snapshot's manifest list.
pub(super) async fn manifest_lists(
    table: &Table,
    snapshots: &[SnapshotRef],
) -> Result<Vec<Vec<ManifestFile>>> {
    Ok(stream::iter(snapshots.iter().cloned())
        .map(|snapshot| async move {
            let list = table.manifest_list_reader(&snapshot).load().await?;
            Ok::<_, iceberg::Error>(list.consume_entries().into_iter().collect::<Vec<_>>())
        })
        .buffered(READS)
        .try_collect()
        .await?)
}

/// The manifests, read.
pub(super) async fn load_manifests(
    table: &Table,
    manifests: Vec<ManifestFile>,
) -> Result<Vec<Manifest>> {
    let file_io = table.file_io();
    Ok(stream::iter(manifests)
        .map(|manifest| async move { manifest.load_manifest(file_io).await })
        .buffered(READS)
        .try_collect()
        .await?)
}
