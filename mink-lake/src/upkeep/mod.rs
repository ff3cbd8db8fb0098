//! Lake upkeep: keeping a lake table's history and files bounded, named as Iceberg's own
//! procedures.
//!
//! Every tiering round commits a snapshot; each snapshot writes a manifest list, manifests
//! and a metadata file, and compaction leaves the files it replaced for the readers of
//! older snapshots. Without upkeep all of it stays forever. Three procedures bound it:
//!
//! - **Expiring snapshots** ([`expire_snapshots`]): drops old snapshots from the table's
//!   metadata, then deletes every file only they referenced (their manifest lists, the
//!   manifests no kept snapshot names, the data and delete files no kept snapshot reads).
//!   What is kept comes from Iceberg's own table properties ([`Retention`]).
//! - **Removing orphan files** ([`remove_orphan_files`]): deletes files under the table's
//!   location that nothing references (left by a crash, by an expiry interrupted between
//!   its commit and its deletes, or metadata files that fell out of the metadata log),
//!   older than a grace period (at least [`limits::MIN_ORPHAN_GRACE`]) so that a commit
//!   in flight keeps its files.
//! - **Rewriting manifests**: a commit that merges every manifest
//!   ([`crate::commit::SnapshotChanges::rewrite_manifests`]); every commit also merges
//!   them once there are enough ([`crate::commit`]'s `merge`).
//!
//! Neither deletes a file a running read planned on: reads hold [`leases`] on their
//! snapshot, in whatever process they run, and both procedures keep what the leases hold.
//!
//! [`LakeTableStats`] counts what a table holds (`system.lake_tables`).

mod expire;
pub mod leases;
pub mod limits;
mod orphans;
mod reachable;
mod retention;
mod stats;

pub use expire::{ExpireReport, Expiry, expirable_snapshots, expire_snapshots};
pub use limits::MIN_ORPHAN_GRACE;
pub use orphans::{DEFAULT_ORPHAN_GRACE, OrphanReport, remove_orphan_files};
pub use retention::{DEFAULT_MAX_SNAPSHOT_AGE, READ_GRACE, Retention};
pub use stats::LakeTableStats;

#[cfg(test)]
mod tests;
