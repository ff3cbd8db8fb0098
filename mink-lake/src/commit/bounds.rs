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
