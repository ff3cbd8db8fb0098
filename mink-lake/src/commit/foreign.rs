//! Commits other engines send to mink's lake (through mink's Iceberg REST catalog), checked
//! and swapped in with the same compare-and-swap as mink's own.
//!
//! mink owns its lake tables: their schema, partitioning and properties change only
//! through mink's SQL, and a primary-key table's lake holds exactly one live row per key
//! (a foreign data file would duplicate keys that the union read merges away). What
//! another engine may do is append to a log table's lake, which tiering already takes in
//! its stride (it plans each round on the current snapshot and finds its own offsets on
//! the newest snapshot that carries them).
//!
//! # What tiering depends on
//!
//! The snapshot another engine adds becomes the parent of mink's next commit, and Iceberg
//! checks every commit against its parent: a snapshot stamped in the year 2100 would make
//! each later round "before last snapshot timestamp", a sequence number of 2^63-1 each
//! later one "older than last sequence number". So every field a later commit builds on is
//! checked ([`check_lineage`]), not only the files:
//!
//! | field | must be | else |
//! |---|---|---|
//! | `parent-snapshot-id` | the table's current snapshot | `409` conflict |
//! | `snapshot-id` | positive, no snapshot's of the table | `400` |
//! | `sequence-number` | the table's last + 1 | `400` |
//! | `timestamp-ms` | not before the parent's, at most [`MAX_CLOCK_SKEW`] ahead of now | `400` |
//! | `schema-id` | the table's current schema | `409` if an older one, `400` if unknown |
//! | `manifest-list` | a new file inside the table's location | `400` if another snapshot's, `403` outside |
//! | each new manifest | of the default partition spec, added by this snapshot at its sequence number, data files only, all `ADDED` by it | `409` (older spec), `400`, `403` (deletes) |
//! | summary | no `mink.` property, at most [`MAX_SUMMARY_BYTES`](super::limits::MAX_SUMMARY_BYTES) | `403`, `400` |
//! | `set-snapshot-ref` | `main`, to the added snapshot, a branch with no retention of its own | `403` |
//!
//! Every other update (`set-current-schema`, `add-schema`, `remove-snapshots`,
//! `set-properties`, `assign-uuid`, `upgrade-format-version`, `set-location`, other refs
//! ...) is refused (`403`): mink's tiering, expiry and reads depend on all of them. So a
//! foreign commit ([`commit_foreign`]) is accepted when:
//!
//! - its requirements hold against the table as it is now (else a conflict);
//! - its updates are one `add-snapshot` of an `append` snapshot and `set-snapshot-ref` of
//!   `main` to it, nothing else (none: nothing is written);
//! - the snapshot's fields pass the table above, it keeps every manifest of the current
//!   `main` snapshot, and its manifest list, its manifests and their files lie inside the
//!   table's location;
//! - the table is a log table.
//!
//! A table a REST client created in a namespace it created ([`commit_hosted`]; another mink
//! server using this one's catalog, say) is that client's: any update is taken, except a
//! new location, as long as the requirements hold, every file an added snapshot names
//! lies inside the table's location, and each added snapshot's sequence number and
//! timestamp are ones later commits can follow (the next sequence number, a timestamp at
//! most [`MAX_CLOCK_SKEW`] ahead): another mink server tiers into such tables. Its
//! snapshot summaries, snapshots, properties and metadata file are bounded (`bounds`).
//!
//! A refusal names the field: `400` is an Iceberg `DataInvalid` error (what iceberg's own
//! metadata builder answers for a malformed snapshot), `409` a
//! [`LakeError::CommitConflict`] the client retries on the table as it is, `403` a
//! [`LakeError::Refused`].
//!
//! The new metadata is published as mink's own metadata-only commits are
//! ([`super::commit_metadata`], as an expiry); a lost race is a conflict.

use std::collections::HashSet;
use std::sync::Arc;

use iceberg::spec::{
    DataContentType, FormatVersion, MAIN_BRANCH, Manifest, ManifestContentType, ManifestFile,
    ManifestStatus, Operation, Snapshot, SnapshotReference, SnapshotRetention, TableMetadata,
};
use iceberg::table::Table;
use iceberg::{ErrorKind, TableRequirement, TableUpdate};
use mink_core::table::TablePath;

use super::bounds::{check_hosted_metadata, check_summary};
use super::limits::{MAX_CLOCK_SKEW, MAX_SNAPSHOTS_PER_COMMIT};
use super::{commit_metadata_within, now_ms, show_optional};
use crate::catalog::Lake;
use crate::error::{LakeError, Result};
use crate::layout::{check_inside, relocates_files};

/// Checks and commits another engine's `requirements` and `updates` to the lake table
/// of `path`, one of mink's own; returns the table's metadata as committed and its location.
///
/// # Errors
/// - [`LakeError::CommitConflict`] when a requirement does not hold, the snapshot builds
///   on one that is no longer current or on an older schema or partition spec, or another
///   commit swapped the table's metadata first (nothing was committed);
/// - [`LakeError::Refused`] for an update mink does not take from other engines (see the
///   module docs) or a file outside the table's location;
/// - [`LakeError::Iceberg`] of kind `DataInvalid` for a snapshot field later commits could
///   not build on (see the module docs), or updates that do not apply to the metadata;
///   of kind `TableNotFound` when the table does not exist; other kinds when its files
///   cannot be read; [`LakeError::Catalog`] when the catalog's database fails.
pub async fn commit_foreign(
    lake: &Lake,
    path: &TablePath,
    requirements: &[TableRequirement],
    updates: Vec<TableUpdate>,
) -> Result<(TableMetadata, String)> {
    let current = checked(lake, path, requirements).await?;
    let mut added = HashSet::new();
    let mut written = Vec::new();
    for update in &updates {
        match update {
            TableUpdate::AddSnapshot { snapshot } => {
                if added.len() == MAX_SNAPSHOTS_PER_COMMIT {
                    return Err(refused(
                        path,
                        format!(
                            "a commit to a mink table adds at most {MAX_SNAPSHOTS_PER_COMMIT} \
                             snapshot"
                        ),
                    ));
                }
                check_lineage(path, current.metadata(), snapshot)?;
                check_summary(path, snapshot)?;
                let files = check_append(path, &current, snapshot).await?;
                written.extend(files.written(snapshot));
                added.insert(snapshot.snapshot_id());
            }
            TableUpdate::SetSnapshotRef {
                ref_name,
                reference,
            } if ref_name == MAIN_BRANCH && added.contains(&reference.snapshot_id) => {
                check_main_ref(path, reference)?;
            }
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
    sync_written(lake, &written).await?;
    apply(lake, &current, updates, |_| Ok(())).await
}

/// Checks and commits `requirements` and `updates` of the REST client that created the
/// lake table of `path` (in a namespace it created, see the module docs); returns the
/// table's metadata as committed and its location.
///
/// # Errors
/// As [`commit_foreign`]'s; refused are a new location and a file outside the table's
/// location, invalid an added snapshot's sequence number other than the next or a
/// timestamp too far ahead.
pub async fn commit_hosted(
    lake: &Lake,
    path: &TablePath,
    requirements: &[TableRequirement],
    updates: Vec<TableUpdate>,
) -> Result<(TableMetadata, String)> {
    let current = checked(lake, path, requirements).await?;
    let mut last_sequence_number = current.metadata().last_sequence_number();
    let mut written = Vec::new();
    for update in &updates {
        match update {
            TableUpdate::AddSnapshot { snapshot } => {
                if current.metadata().format_version() != FormatVersion::V1 {
                    check_sequence_number(path, last_sequence_number, snapshot)?;
                    last_sequence_number = snapshot.sequence_number();
                }
                check_timestamp(path, snapshot, None)?;
                check_summary(path, snapshot)?;
                let files = new_files(&current, snapshot)
                    .await
                    .map_err(|message| refused(path, message))?;
                written.extend(files.written(snapshot));
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
    sync_written(lake, &written).await?;
    apply(lake, &current, updates, |next| {
        check_hosted_metadata(path, current.metadata(), next)
    })
    .await
}

/// Makes the files a client wrote for its commit durable before the catalog names them
/// (`written`: [`NewFiles::written`]): pyiceberg, say, writes the warehouse's files
/// without an fsync, and a power cut after the commit must not leave the catalog naming
/// a manifest list that is gone ([`crate::storage::LakeStorage::sync_files`]).
async fn sync_written(lake: &Lake, written: &[String]) -> Result<()> {
    let locations: Vec<&str> = written.iter().map(String::as_str).collect();
    Ok(lake.storage().sync_files(&locations).await?)
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
            .map_err(|error| conflict(path, error.message().to_string()))?;
    }
    Ok(current)
}

/// Commits `updates`, checked, on `current` (none: nothing is written) if the metadata
/// they build passes `bounds`.
async fn apply(
    lake: &Lake,
    current: &Table,
    updates: Vec<TableUpdate>,
    bounds: impl FnOnce(&TableMetadata) -> Result<()>,
) -> Result<(TableMetadata, String)> {
    if updates.is_empty() {
        let location = current.metadata_location_result()?.to_string();
        return Ok((current.metadata().clone(), location));
    }
    let edit = |builder| {
        updates
            .into_iter()
            .try_fold(builder, |builder, update: TableUpdate| {
                update.apply(builder)
            })
    };
    commit_metadata_within(lake, current, edit, bounds).await
}

/// An update mink does not take (`403`).
fn refused(path: &TablePath, message: String) -> LakeError {
    LakeError::Refused {
        table: path.to_string(),
        message,
    }
}

/// A commit planned on a state of the table that is gone (`409`): the client reloads the
/// table and tries again.
fn conflict(path: &TablePath, message: String) -> LakeError {
    LakeError::CommitConflict {
        table: path.to_string(),
        message,
    }
}

/// A snapshot field later commits could not build on (`400`).
pub(super) fn invalid(path: &TablePath, message: String) -> LakeError {
    LakeError::Iceberg(iceberg::Error::new(
        ErrorKind::DataInvalid,
        format!("lake table {path}: {message}"),
    ))
}

/// Checks the fields of `snapshot` that mink's next commit builds on, against `metadata`
/// (the table it is added to; see the module docs).
fn check_lineage(path: &TablePath, metadata: &TableMetadata, snapshot: &Snapshot) -> Result<()> {
    let id = snapshot.snapshot_id();
    if snapshot.parent_snapshot_id() != metadata.current_snapshot_id() {
        return Err(conflict(
            path,
            format!(
                "parent-snapshot-id of snapshot {id} is {}, not the table's current snapshot {}",
                show_optional(snapshot.parent_snapshot_id()),
                show_optional(metadata.current_snapshot_id())
            ),
        ));
    }
    if id <= 0 || metadata.snapshot_by_id(id).is_some() {
        return Err(invalid(
            path,
            format!("snapshot-id {id} is taken or not positive: a new snapshot needs a new id"),
        ));
    }
    check_sequence_number(path, metadata.last_sequence_number(), snapshot)?;
    check_timestamp(
        path,
        snapshot,
        metadata.current_snapshot().map(|p| p.timestamp_ms()),
    )?;
    check_schema(path, metadata, snapshot)?;
    let list = snapshot.manifest_list();
    if let Some(other) = metadata.snapshots().find(|s| s.manifest_list() == list) {
        return Err(invalid(
            path,
            format!(
                "manifest-list {list} is snapshot {}'s: a new snapshot writes its own \
                 (expiring the other would delete it)",
                other.snapshot_id()
            ),
        ));
    }
    Ok(())
}

/// Checks that `snapshot`'s sequence number follows `last`, the table's last one.
fn check_sequence_number(path: &TablePath, last: i64, snapshot: &Snapshot) -> Result<()> {
    let next = last.checked_add(1);
    match Some(snapshot.sequence_number()) == next {
        true => Ok(()),
        false => Err(invalid(
            path,
            format!(
                "sequence-number {} of snapshot {} is not the table's next, {}",
                snapshot.sequence_number(),
                snapshot.snapshot_id(),
                show_optional(next)
            ),
        )),
    }
}

/// Checks that `snapshot`'s timestamp is at most [`MAX_CLOCK_SKEW`] ahead of the server's
/// clock and not before `parent_ms`, its parent's.
fn check_timestamp(path: &TablePath, snapshot: &Snapshot, parent_ms: Option<i64>) -> Result<()> {
    let timestamp = snapshot.timestamp_ms();
    let skew = i64::try_from(MAX_CLOCK_SKEW.as_millis()).unwrap_or(i64::MAX);
    let now = now_ms();
    if timestamp.saturating_sub(now) > skew {
        return Err(invalid(
            path,
            format!(
                "timestamp-ms {timestamp} of snapshot {} is {} ms ahead of the catalog's \
                 clock ({now}); at most {skew} ms are taken",
                snapshot.snapshot_id(),
                timestamp.saturating_sub(now)
            ),
        ));
    }
    match parent_ms {
        Some(parent) if timestamp < parent => Err(invalid(
            path,
            format!(
                "timestamp-ms {timestamp} of snapshot {} is before its parent's ({parent})",
                snapshot.snapshot_id()
            ),
        )),
        _ => Ok(()),
    }
}

/// Checks that `snapshot` was written with the table's current schema.
fn check_schema(path: &TablePath, metadata: &TableMetadata, snapshot: &Snapshot) -> Result<()> {
    let current = metadata.current_schema_id();
    match snapshot.schema_id() {
        Some(id) if id == current => Ok(()),
        Some(id) if metadata.schema_by_id(id).is_some() => Err(conflict(
            path,
            format!(
                "schema-id {id} of snapshot {} is an older schema: the table's is now {current}",
                snapshot.snapshot_id()
            ),
        )),
        Some(id) => Err(invalid(
            path,
            format!(
                "schema-id {id} of snapshot {} is no schema of the table (its schema is {current})",
                snapshot.snapshot_id()
            ),
        )),
        None => Err(invalid(
            path,
            format!(
                "snapshot {} has no schema-id (the table's schema is {current})",
                snapshot.snapshot_id()
            ),
        )),
    }
}

/// Checks that `set-snapshot-ref` keeps `main` a branch with no retention of its own, as
/// mink's commits leave it (its expiry follows the table's properties).
fn check_main_ref(path: &TablePath, reference: &SnapshotReference) -> Result<()> {
    match reference.retention == SnapshotRetention::branch(None, None, None) {
        true => Ok(()),
        false => Err(refused(
            path,
            format!(
                "set-snapshot-ref main: main stays a branch without retention settings of \
                 its own, not {:?}",
                reference.retention
            ),
        )),
    }
}

/// Checks that `snapshot` appends data files to `table`'s current snapshot, all inside
/// the table's location, in manifests of its own; returns what it adds.
async fn check_append(path: &TablePath, table: &Table, snapshot: &Snapshot) -> Result<NewFiles> {
    let metadata = table.metadata();
    if is_primary_key_table(metadata) {
        return Err(refused(
            path,
            "a primary-key table's lake takes no data files from other engines: its keys \
             would duplicate those mink tiers"
                .to_string(),
        ));
    }
    let operation = &snapshot.summary().operation;
    if *operation != Operation::Append {
        return Err(refused(
            path,
            format!(
                "other engines may only append to mink's lake, not commit a {} snapshot",
                operation.as_str()
            ),
        ));
    }
    let properties = &snapshot.summary().additional_properties;
    if let Some(property) = properties.keys().find(|key| key.starts_with(MINK_PREFIX)) {
        return Err(refused(
            path,
            format!(
                "snapshot summary property {property} is mink's own (tiering finds its \
                 offsets by it): other engines may not set it"
            ),
        ));
    }
    let files = new_files(table, snapshot)
        .await
        .map_err(|message| refused(path, message))?;
    if let Some(dropped) = files.dropped.first() {
        return Err(refused(
            path,
            format!("an append keeps every manifest of its parent, and this one drops {dropped}"),
        ));
    }
    for (manifest, entries) in &files.added {
        check_added_manifest(path, metadata, snapshot, manifest, entries)?;
    }
    Ok(files)
}

/// Checks a manifest `snapshot` adds: data files only, of the table's default partition
/// spec, every entry added by `snapshot` at its sequence number.
fn check_added_manifest(
    path: &TablePath,
    metadata: &TableMetadata,
    snapshot: &Snapshot,
    manifest: &ManifestFile,
    entries: &Manifest,
) -> Result<()> {
    let (id, sequence_number) = (snapshot.snapshot_id(), snapshot.sequence_number());
    let manifest_path = &manifest.manifest_path;
    if manifest.content != ManifestContentType::Data {
        return Err(refused(
            path,
            format!("an append adds data files only, and manifest {manifest_path} holds deletes"),
        ));
    }
    let spec = manifest.partition_spec_id;
    let default_spec = metadata.default_partition_spec_id();
    if spec != default_spec {
        let message = format!(
            "partition-spec-id {spec} of manifest {manifest_path} is not the table's \
             partition spec {default_spec}"
        );
        return Err(match metadata.partition_spec_by_id(spec) {
            Some(_) => conflict(path, message),
            None => invalid(path, message),
        });
    }
    if manifest.added_snapshot_id != id || manifest.sequence_number != sequence_number {
        return Err(invalid(
            path,
            format!(
                "manifest {manifest_path} is not snapshot {id}'s own: it was added by snapshot \
                 {} at sequence number {} (an append's new manifests are its own, at {sequence_number})",
                manifest.added_snapshot_id, manifest.sequence_number
            ),
        ));
    }
    for entry in entries.entries() {
        if entry.content_type() != DataContentType::Data {
            return Err(refused(
                path,
                format!(
                    "an append adds data files only, and {} holds deletes",
                    entry.file_path()
                ),
            ));
        }
        let own = entry.status() == ManifestStatus::Added
            && entry.snapshot_id() == Some(id)
            && entry.sequence_number() == Some(sequence_number);
        if !own {
            return Err(invalid(
                path,
                format!(
                    "data file {} in manifest {manifest_path} is not one snapshot {id} adds \
                     (status {:?}, snapshot {}, sequence number {})",
                    entry.file_path(),
                    entry.status(),
                    show_optional(entry.snapshot_id()),
                    show_optional(entry.sequence_number())
                ),
            ));
        }
    }
    Ok(())
}

/// What a snapshot changes against the table's current snapshot, at the manifest level.
struct NewFiles {
    /// The snapshot's manifests the current snapshot does not have, loaded.
    added: Vec<(ManifestFile, Manifest)>,
    /// The current snapshot's manifests the snapshot does not keep.
    dropped: Vec<String>,
}

impl NewFiles {
    /// The files a commit of `snapshot` writes: its manifest list, its new manifests and
    /// the files they add.
    fn written(&self, snapshot: &Snapshot) -> Vec<String> {
        let manifests = self.added.iter().flat_map(|(manifest, entries)| {
            let added = entries
                .entries()
                .iter()
                .filter(|entry| entry.status() == ManifestStatus::Added)
                .map(|entry| entry.file_path().to_string());
            std::iter::once(manifest.manifest_path.clone()).chain(added)
        });
        std::iter::once(snapshot.manifest_list().to_string())
            .chain(manifests)
            .collect()
    }
}

/// Reads `snapshot`'s manifest list and the manifests it adds to the table's current
/// snapshot, checking that the list, every manifest and every added manifest's files lie
/// inside the table's location (the current snapshot's files were checked when they came);
/// the message says which does not.
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use iceberg::spec::Summary;

    use super::super::{SnapshotChanges, commit_snapshot};
    use super::*;
    use crate::catalog::fixture::lake_table;

    /// The metadata of a lake table with one snapshot, and that snapshot.
    async fn one_snapshot() -> (tempfile::TempDir, TableMetadata, Snapshot) {
        let dir = tempfile::tempdir().unwrap();
        let (lake, _, table) = lake_table(dir.path()).await;
        let table = commit_snapshot(
            &lake,
            &table,
            None,
            Operation::Append,
            SnapshotChanges::default(),
        )
        .await
        .unwrap();
        let metadata = table.metadata().clone();
        let current = metadata.current_snapshot().unwrap().as_ref().clone();
        (dir, metadata, current)
    }

    /// A snapshot on `parent` of `metadata`, valid in every field but those `edit` changes.
    fn on(metadata: &TableMetadata, parent: &Snapshot, edit: impl FnOnce(&mut Fields)) -> Snapshot {
        let mut fields = Fields {
            id: parent.snapshot_id() + 1,
            parent: Some(parent.snapshot_id()),
            sequence_number: metadata.last_sequence_number() + 1,
            timestamp_ms: now_ms(),
            schema_id: Some(metadata.current_schema_id()),
            manifest_list: format!("{}/metadata/snap-new.avro", metadata.location()),
        };
        edit(&mut fields);
        Snapshot::builder()
            .with_snapshot_id(fields.id)
            .with_parent_snapshot_id(fields.parent)
            .with_sequence_number(fields.sequence_number)
            .with_timestamp_ms(fields.timestamp_ms)
            .with_manifest_list(fields.manifest_list)
            .with_summary(Summary {
                operation: Operation::Append,
                additional_properties: HashMap::new(),
            })
            .schema_id_opt(fields.schema_id)
            .build()
    }

    /// A change of a valid snapshot's fields.
    type Edit = Box<dyn FnOnce(&mut Fields)>;

    struct Fields {
        id: i64,
        parent: Option<i64>,
        sequence_number: i64,
        timestamp_ms: i64,
        schema_id: Option<i32>,
        manifest_list: String,
    }

    /// What `check_lineage` answers: `400` as "invalid", `409` as "conflict".
    fn verdict(
        metadata: &TableMetadata,
        snapshot: &Snapshot,
    ) -> Result<(), (&'static str, String)> {
        check_lineage(&TablePath::new("db", "t"), metadata, snapshot).map_err(|error| {
            let kind = match &error {
                LakeError::Iceberg(e) if e.kind() == ErrorKind::DataInvalid => "invalid",
                LakeError::CommitConflict { .. } => "conflict",
                _ => "other",
            };
            (kind, error.to_string())
        })
    }

    #[tokio::test]
    async fn every_field_a_later_commit_builds_on_is_checked() {
        let (_dir, metadata, parent) = one_snapshot().await;
        assert_eq!(verdict(&metadata, &on(&metadata, &parent, |_| {})), Ok(()));
        let reused = parent.manifest_list().to_string();
        let skew = i64::try_from(MAX_CLOCK_SKEW.as_millis()).unwrap();
        let cases: [(&str, Edit, &str); 10] = [
            (
                "invalid",
                Box::new(|f| f.timestamp_ms = 4_102_444_800_000),
                "timestamp-ms",
            ),
            (
                "invalid",
                Box::new(move |f| f.timestamp_ms += 2 * skew),
                "ahead",
            ),
            (
                "invalid",
                Box::new(|f| f.timestamp_ms = 0),
                "before its parent",
            ),
            (
                "invalid",
                Box::new(|f| f.sequence_number = i64::MAX),
                "sequence-number",
            ),
            (
                "invalid",
                Box::new(|f| f.sequence_number -= 1),
                "sequence-number",
            ),
            (
                "invalid",
                Box::new(|f| f.schema_id = Some(99)),
                "schema-id 99",
            ),
            ("invalid", Box::new(|f| f.schema_id = None), "no schema-id"),
            (
                "invalid",
                Box::new(|f| f.id = f.parent.unwrap()),
                "snapshot-id",
            ),
            (
                "conflict",
                Box::new(|f| f.parent = None),
                "parent-snapshot-id",
            ),
            (
                "invalid",
                Box::new(move |f| f.manifest_list = reused),
                "manifest-list",
            ),
        ];
        for (kind, edit, field) in cases {
            let (found, message) = verdict(&metadata, &on(&metadata, &parent, edit)).unwrap_err();
            assert_eq!(found, kind, "{message}");
            assert!(message.contains(field), "{field}: {message}");
        }
    }

    #[test]
    fn main_stays_a_branch_without_retention_of_its_own() {
        let path = TablePath::new("db", "t");
        let plain = SnapshotReference::new(1, SnapshotRetention::branch(None, None, None));
        assert!(check_main_ref(&path, &plain).is_ok());
        for retention in [
            SnapshotRetention::branch(Some(1), None, None),
            SnapshotRetention::branch(None, Some(1), None),
            SnapshotRetention::Tag {
                max_ref_age_ms: None,
            },
        ] {
            let reference = SnapshotReference::new(1, retention);
            assert!(matches!(
                check_main_ref(&path, &reference),
                Err(LakeError::Refused { .. })
            ));
        }
    }
}
