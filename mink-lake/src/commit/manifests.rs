//! The manifests of a new snapshot: the parent's, carried forward or rewritten, and the
//! writer of every manifest an attempt writes.
//!
//! A snapshot's manifest list names every manifest of the table's live files. A commit
//! that removes no file carries the parent's manifests forward as they are (dropping
//! those with no live file left). One that removes files reads every manifest of the
//! parent and rewrites each that holds a removed file:
//!
//! ```text
//!  parent manifest              rewritten manifest (this snapshot's id)
//!  ADDED    a.parquet   ──▶     EXISTING a.parquet   (its snapshot id and sequence numbers)
//!  EXISTING b.parquet   ──▶     DELETED  b.parquet   (b is removed)
//!  DELETED  c.parquet           (left out: deleted by an earlier snapshot)
//! ```
//!
//! A rewritten manifest is kept even when no live file is left in it: its DELETED entries
//! record the removal. Every removed file must be live in the parent.

use std::collections::HashSet;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt, stream};
use iceberg::spec::{
    Manifest, ManifestContentType, ManifestFile, ManifestStatus, ManifestWriter,
    ManifestWriterBuilder, PartitionSpec, SchemaRef, SnapshotRef,
};

use super::summary::Metrics;
use super::{Attempt, sorted};
use crate::error::{LakeError, Result};

/// How many manifests are read at once when looking for removed files.
const MANIFEST_READS: usize = 8;

impl Attempt<'_> {
    /// The parent's manifests for the new snapshot: unchanged where they hold no removed
    /// file, rewritten where they do. The removed files are counted into `metrics`.
    pub(super) async fn carry_forward(
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
            return Err(LakeError::layout(
                &self.name,
                format!(
                    "cannot remove files that are not live in snapshot {}: {}",
                    parent.snapshot_id(),
                    sorted(missing.into_iter()).join(", ")
                ),
            ));
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
            Arc::clone(&meta.schema),
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
                return Err(LakeError::layout(
                    &self.name,
                    format!("manifest entry of {path} has no snapshot id or sequence number"),
                ));
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

    /// A writer of one new manifest (`<location>/metadata/<commit uuid>-m<n>.avro`),
    /// recorded as written by this attempt.
    pub(super) fn manifest_writer(
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
}

/// Whether a manifest may hold live files (unknown counts: it may).
fn has_live_files(manifest: &ManifestFile) -> bool {
    manifest.has_added_files() || manifest.has_existing_files()
}
