//! The size bounds of REST clients' commits ([`super::limits`]): an added snapshot's
//! summary, and what a hosted table's metadata may hold after a commit (snapshots,
//! properties, the metadata file's size). Each is `400` (Iceberg's `DataInvalid`), naming
//! the limit; a commit that leaves the table no larger than before is always taken, so a
//! table past a bound (an older one, say) can still be expired back under it.

use iceberg::spec::{Snapshot, TableMetadata};
use mink_core::table::TablePath;

use super::foreign::invalid;
use super::limits::{MAX_METADATA_BYTES, MAX_SNAPSHOTS, MAX_SUMMARY_BYTES, MAX_TABLE_PROPERTIES};
use crate::error::Result;

/// Checks that `snapshot`'s summary holds at most [`MAX_SUMMARY_BYTES`].
pub(super) fn check_summary(path: &TablePath, snapshot: &Snapshot) -> Result<()> {
    let bytes: usize = snapshot
        .summary()
        .additional_properties
        .iter()
        .map(|(key, value)| key.len() + value.len())
        .sum();
    match bytes > MAX_SUMMARY_BYTES {
        true => Err(invalid(
            path,
            format!(
                "the summary of snapshot {} holds {bytes} bytes, above the limit of \
                 {MAX_SUMMARY_BYTES}",
                snapshot.snapshot_id()
            ),
        )),
        false => Ok(()),
    }
}

/// Checks `next`, a hosted table's metadata after a commit, against the bounds of what it
/// may hold, each only where it grew from `current`.
pub(super) fn check_hosted_metadata(
    path: &TablePath,
    current: &TableMetadata,
    next: &TableMetadata,
) -> Result<()> {
    check_grown(
        path,
        "snapshots",
        current.snapshots().len(),
        next.snapshots().len(),
        MAX_SNAPSHOTS,
    )?;
    check_grown(
        path,
        "properties",
        current.properties().len(),
        next.properties().len(),
        MAX_TABLE_PROPERTIES,
    )?;
    check_grown(
        path,
        "bytes of metadata JSON",
        json_bytes(current)?,
        json_bytes(next)?,
        MAX_METADATA_BYTES,
    )
}

/// Refuses a count that grew from `before` to `after` past `limit`.
fn check_grown(
    path: &TablePath,
    what: &str,
    before: usize,
    after: usize,
    limit: usize,
) -> Result<()> {
    match after > limit && after > before {
        true => Err(invalid(
            path,
            format!(
                "the commit would leave the table {after} {what}, above the limit of {limit} \
                 (expire snapshots or remove what is unused first)"
            ),
        )),
        false => Ok(()),
    }
}

/// The size of `metadata` as the metadata file holds it.
fn json_bytes(metadata: &TableMetadata) -> Result<usize> {
    let bytes = serde_json::to_vec(metadata).map_err(|error| {
        iceberg::Error::new(
            iceberg::ErrorKind::DataInvalid,
            format!("table metadata does not serialize: {error}"),
        )
    })?;
    Ok(bytes.len())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use iceberg::TableUpdate;

    use super::super::commit_hosted;
    use super::*;
    use crate::catalog::fixture::lake_table;
    use crate::error::LakeError;

    /// `count` properties `p<first>`... as one `set-properties` update.
    fn properties(first: usize, count: usize) -> Vec<TableUpdate> {
        let updates: HashMap<_, _> = (first..first + count)
            .map(|i| (format!("p{i}"), "v".to_string()))
            .collect();
        vec![TableUpdate::SetProperties { updates }]
    }

    #[tokio::test]
    async fn a_hosted_table_keeps_at_most_its_bound_of_properties() {
        let dir = tempfile::tempdir().unwrap();
        let (lake, descriptor, table) = lake_table(dir.path()).await;
        let path = &descriptor.path;
        let had = table.metadata().properties().len();
        let room = MAX_TABLE_PROPERTIES - had;
        commit_hosted(&lake, path, &[], properties(0, room))
            .await
            .unwrap();
        let error = commit_hosted(&lake, path, &[], properties(room, 1))
            .await
            .unwrap_err();
        let LakeError::Iceberg(error) = error else {
            panic!("{error}")
        };
        assert!(
            error
                .message()
                .contains("1001 properties, above the limit of 1000"),
            "{error}"
        );
        assert_eq!(
            lake.load(path).await.unwrap().metadata().properties().len(),
            MAX_TABLE_PROPERTIES
        );
        // One that does not grow them is taken past the bound.
        let removals = vec![TableUpdate::RemoveProperties {
            removals: vec!["p0".to_string()],
        }];
        commit_hosted(&lake, path, &[], removals).await.unwrap();
    }

    #[test]
    fn a_bound_holds_only_where_a_commit_grows_the_table() {
        let path = TablePath::new("db", "t");
        assert!(check_grown(&path, "snapshots", 10, 10_000, MAX_SNAPSHOTS).is_ok());
        assert!(check_grown(&path, "snapshots", 10_000, 10_001, MAX_SNAPSHOTS).is_err());
        assert!(check_grown(&path, "snapshots", 10_005, 10_004, MAX_SNAPSHOTS).is_ok());
    }
}
