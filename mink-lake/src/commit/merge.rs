//! Merging manifests, so that planning a read of the table reads few.
//!
//! Every commit adds a data manifest and a delete manifest; a table tiered every 30
//! seconds would otherwise name thousands of manifests after a day, and planning any read
//! reads every one. Like Java's Iceberg (`MergingSnapshotProducer`, on by default), a
//! commit merges the manifests it carries forward once there are enough of one kind:
//!
//! ```text
//!  carried forward (data, spec 0)          merged (this snapshot's id)
//!  m1: ADDED a (snapshot 7)       ──▶      EXISTING a (snapshot 7, its sequence numbers)
//!  m2: EXISTING b, DELETED c      ──▶      EXISTING b (c's removal is an older snapshot's)
//! ```
//!
//! Manifests are grouped by content and partition spec, and a group is merged when it
//! holds at least `commit.manifest.min-count-to-merge` manifests (mink's default:
//! [`DEFAULT_MIN_COUNT_TO_MERGE`]), packed into manifests of at most
//! `commit.manifest.target-size-bytes` (Iceberg's default, 8 MiB) each.
//! `commit.manifest-merge.enabled = false` turns it off; `rewrite_manifests` merges every
//! group of two or more whatever the count. The manifests a commit writes itself (for its
//! new files, and those rewritten to record its removals) are never merged in that
//! commit: each snapshot's additions and removals stay in manifests of its own, as the
//! incremental read ([`crate::changes`]) expects, and no file the commit wrote is left
//! unreferenced.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt, stream};
use iceberg::spec::{ManifestContentType, ManifestFile, TableMetadata};
use iceberg::table::Table;

use super::Attempt;
use crate::error::{LakeError, Result};

/// mink's default `commit.manifest.min-count-to-merge`: lower than Java's 100, because a
/// mink table commits every `lake.freshness` and planning reads every manifest.
pub const DEFAULT_MIN_COUNT_TO_MERGE: usize = 8;

/// Iceberg's default `commit.manifest.target-size-bytes`.
const DEFAULT_TARGET_SIZE_BYTES: u64 = 8 << 20;

/// How many manifests are read at once while merging.
const MANIFEST_READS: usize = 8;

/// When a commit merges the manifests it carries forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MergePolicy {
    /// A group of this many manifests (of one content and spec) or more is merged; `None`
    /// never merges.
    min_count: Option<usize>,
    /// A merged manifest stops taking manifests at this size.
    target_bytes: u64,
}

impl MergePolicy {
    /// The policy of a table's properties (Iceberg's names, mink's defaults).
    pub(super) fn of(metadata: &TableMetadata) -> Self {
        let properties = metadata.properties();
        let parse = |key: &str| {
            properties
                .get(key)
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let enabled = properties
            .get("commit.manifest-merge.enabled")
            .is_none_or(|v| !v.trim().eq_ignore_ascii_case("false"));
        let min_count = parse("commit.manifest.min-count-to-merge")
            .map_or(DEFAULT_MIN_COUNT_TO_MERGE, |n| n.max(2) as usize);
        Self {
            min_count: enabled.then_some(min_count),
            target_bytes: parse("commit.manifest.target-size-bytes")
                .unwrap_or(DEFAULT_TARGET_SIZE_BYTES),
        }
    }

    /// Merges every group of two manifests or more (`rewrite_manifests`).
    pub(super) fn everything(self) -> Self {
        Self {
            min_count: Some(2),
            ..self
        }
    }

    /// The bins carried-forward manifests fall into: grouped by content and partition spec,
    /// a group due for merging packed by size; a bin of one is kept as it is, a bin of more
    /// is merged into one manifest.
    fn bins(self, manifests: Vec<ManifestFile>) -> Vec<Vec<ManifestFile>> {
        let Some(min_count) = self.min_count else {
            return manifests.into_iter().map(|m| vec![m]).collect();
        };
        let mut groups: BTreeMap<(u8, i32), Vec<ManifestFile>> = BTreeMap::new();
        for manifest in manifests {
            let content = match manifest.content {
                ManifestContentType::Data => 0,
                ManifestContentType::Deletes => 1,
            };
            groups
                .entry((content, manifest.partition_spec_id))
                .or_default()
                .push(manifest);
        }
        groups
            .into_values()
            .flat_map(|group| match group.len() < min_count {
                true => group.into_iter().map(|m| vec![m]).collect(),
                false => pack(group, self.target_bytes),
            })
            .collect()
    }
}

/// Whether rewriting `table`'s manifests ([`super::SnapshotChanges::rewrite_manifests`])
/// would merge any: false for a table without a snapshot, or whose manifests are each
/// alone of their content and spec or too large to share a manifest.
///
/// # Errors
/// [`LakeError::Iceberg`] when the manifest list cannot be read.
pub async fn rewrite_would_merge(table: &Table) -> Result<bool> {
    let metadata = table.metadata();
    let Some(current) = metadata.current_snapshot() else {
        return Ok(false);
    };
    let list = table.manifest_list_reader(current).load().await?;
    let bins = MergePolicy::of(metadata)
        .everything()
        .bins(list.entries().to_vec());
    Ok(bins.iter().any(|bin| bin.len() > 1))
}

/// What a merge did, for the snapshot summary (Java's `manifests-*` counts).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct MergeCounts {
    /// Manifests written by merging.
    pub(super) created: usize,
    /// Manifests merged into them.
    pub(super) replaced: usize,
    /// Manifests carried forward as they were.
    pub(super) kept: usize,
}

impl Attempt<'_> {
    /// The carried-forward manifests with every group due for merging merged (those this
    /// commit wrote are left as they are).
    pub(super) async fn merge(
        &mut self,
        manifests: Vec<ManifestFile>,
        policy: MergePolicy,
    ) -> Result<(Vec<ManifestFile>, MergeCounts)> {
        let mut counts = MergeCounts::default();
        let (mut merged, carried): (Vec<_>, Vec<_>) = manifests
            .into_iter()
            .partition(|m| m.added_snapshot_id == self.snapshot_id);
        counts.kept = merged.len();
        for bin in policy.bins(carried) {
            if bin.len() == 1 {
                counts.kept += 1;
                merged.extend(bin);
            } else {
                counts.replaced += bin.len();
                counts.created += 1;
                merged.push(self.merge_bin(bin).await?);
            }
        }
        Ok((merged, counts))
    }

    /// One manifest holding the live entries of `bin` (manifests of one content and spec,
    /// carried forward from older snapshots) as EXISTING; their removals are older
    /// snapshots' and are left out.
    async fn merge_bin(&mut self, bin: Vec<ManifestFile>) -> Result<ManifestFile> {
        let table = self.table;
        let metadata = table.metadata();
        let spec_id = bin[0].partition_spec_id;
        let spec = metadata.partition_spec_by_id(spec_id).ok_or_else(|| {
            LakeError::layout(
                &self.name,
                format!("a manifest of unknown partition spec {spec_id}"),
            )
        })?;
        let file_io = table.file_io();
        let loaded: Vec<_> = stream::iter(bin)
            .map(|file| async move { file.load_manifest(file_io).await })
            .buffered(MANIFEST_READS)
            .try_collect()
            .await?;
        let content = loaded[0].metadata().content;
        let mut writer = self.manifest_writer(
            content,
            Arc::clone(metadata.current_schema()),
            spec.as_ref().clone(),
        )?;
        for manifest in loaded {
            let (entries, _) = manifest.into_parts();
            for entry in entries.into_iter().filter(|entry| entry.is_alive()) {
                let (Some(snapshot_id), Some(sequence_number)) =
                    (entry.snapshot_id(), entry.sequence_number())
                else {
                    return Err(LakeError::layout(
                        &self.name,
                        format!(
                            "manifest entry of {} has no snapshot id or sequence number",
                            entry.file_path()
                        ),
                    ));
                };
                writer.add_existing_file(
                    entry.data_file().clone(),
                    snapshot_id,
                    sequence_number,
                    entry.file_sequence_number,
                )?;
            }
        }
        Ok(writer.write_manifest_file().await?)
    }
}

/// Packs manifests, in order, into bins of at most `target_bytes`; a manifest of that size
/// or more is a bin of its own, and the bin being filled stays open past it.
fn pack(manifests: Vec<ManifestFile>, target_bytes: u64) -> Vec<Vec<ManifestFile>> {
    let mut bins: Vec<Vec<ManifestFile>> = Vec::new();
    // The bin being filled and its bytes.
    let mut open: Option<(usize, u64)> = None;
    for manifest in manifests {
        let bytes = u64::try_from(manifest.manifest_length).unwrap_or(0);
        match open {
            Some((bin, used)) if used + bytes <= target_bytes => {
                bins[bin].push(manifest);
                open = Some((bin, used + bytes));
            }
            _ if bytes >= target_bytes => bins.push(vec![manifest]),
            _ => {
                open = Some((bins.len(), bytes));
                bins.push(vec![manifest]);
            }
        }
    }
    bins
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(length: i64) -> ManifestFile {
        ManifestFile {
            manifest_path: format!("m{length}.avro"),
            manifest_length: length,
            partition_spec_id: 0,
            content: ManifestContentType::Data,
            sequence_number: 1,
            min_sequence_number: 1,
            added_snapshot_id: 1,
            added_files_count: Some(1),
            existing_files_count: Some(0),
            deleted_files_count: Some(0),
            added_rows_count: Some(1),
            existing_rows_count: Some(0),
            deleted_rows_count: Some(0),
            partitions: None,
            key_metadata: None,
            first_row_id: None,
        }
    }

    fn lengths(bins: &[Vec<ManifestFile>]) -> Vec<Vec<i64>> {
        bins.iter()
            .map(|bin| bin.iter().map(|m| m.manifest_length).collect())
            .collect()
    }

    #[test]
    fn manifests_are_packed_in_order_up_to_the_target_size_and_big_ones_alone() {
        let bins = pack(
            vec![
                manifest(4),
                manifest(5),
                manifest(2),
                manifest(20),
                manifest(1),
            ],
            10,
        );
        assert_eq!(lengths(&bins), [vec![4, 5], vec![2, 1], vec![20]]);
    }
}
