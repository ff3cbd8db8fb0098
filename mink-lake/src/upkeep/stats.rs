//! What a lake table holds (`system.lake_tables`).

use iceberg::spec::ManifestContentType;
use iceberg::table::Table;

use crate::error::Result;

/// Counts of one lake table, as of its current snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LakeTableStats {
    /// Snapshots in the table's metadata.
    pub snapshots: u64,
    /// Manifests of the current snapshot (what planning a read reads).
    pub manifests: u64,
    /// Live data files.
    pub data_files: u64,
    /// Live position and equality delete files.
    pub delete_files: u64,
    /// Bytes of the live data and delete files (the summary's `total-files-size`; 0 when a
    /// foreign commit left it out).
    pub bytes: u64,
    /// When the oldest snapshot was committed (milliseconds since the epoch).
    pub oldest_snapshot_at: Option<i64>,
}

impl LakeTableStats {
    /// The counts of `table` (reads its current manifest list).
    pub async fn of(table: &Table) -> Result<Self> {
        let metadata = table.metadata();
        let mut stats = Self {
            snapshots: metadata.snapshots().len() as u64,
            oldest_snapshot_at: metadata.snapshots().map(|s| s.timestamp_ms()).min(),
            ..Self::default()
        };
        let Some(current) = metadata.current_snapshot() else {
            return Ok(stats);
        };
        stats.bytes = current
            .summary()
            .additional_properties
            .get("total-files-size")
            .and_then(|total| total.parse().ok())
            .unwrap_or(0);
        let list = table.manifest_list_reader(current).load().await?;
        for manifest in list.entries() {
            stats.manifests += 1;
            let live = u64::from(manifest.added_files_count.unwrap_or(0))
                + u64::from(manifest.existing_files_count.unwrap_or(0));
            match manifest.content {
                ManifestContentType::Data => stats.data_files += live,
                ManifestContentType::Deletes => stats.delete_files += live,
            }
        }
        Ok(stats)
    }
}
