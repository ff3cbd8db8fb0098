//! The bounds a commit from another engine is held to (`docs/security.md`, "The Iceberg
//! REST catalog"), in one place.
//!
//! A snapshot another engine adds becomes the parent of mink's next commit, and Iceberg
//! builds every commit's metadata against its parent's fields: a timestamp more than a
//! minute before the last one is refused ("before last snapshot timestamp"), and so is a
//! sequence number not above the last. A foreign field out of range would therefore stop
//! every later tiering round of the table, so such commits are **refused** (`400
//! BadRequestException` naming the field), never clamped: the client retries with its
//! own fields right.
//!
//! | limit                 | value | how     |
//! |-----------------------|-------|---------|
//! | [`MAX_CLOCK_SKEW`]    | 30 s  | a snapshot `timestamp-ms` further ahead of the server's clock is refused |
//! | sequence number       | exactly the table's last + 1 | refused otherwise |
//! | snapshot timestamp    | not before its parent's | refused otherwise |
//! | [`MAX_SNAPSHOTS_PER_COMMIT`] | 1 | more `add-snapshot` updates in a commit to a mink table are refused |
//! | [`MAX_SUMMARY_BYTES`] | 64 KiB | an added snapshot whose summary (keys and values) is larger is refused |
//! | [`MAX_SNAPSHOTS`]     | 10 000 | a commit to a hosted table leaving it more snapshots (and more than before) is refused until snapshots are expired |
//! | [`MAX_TABLE_PROPERTIES`] | 1 000 | a commit to a hosted table leaving it more properties (and more than before) is refused |
//! | [`MAX_METADATA_BYTES`] | 16 MiB | a commit to a hosted table whose metadata JSON would be larger (and larger than before) is refused |
//!
//! A hosted table (one a REST client created in a namespace of its own) takes any update,
//! so without the last three its metadata file, rewritten and fsynced whole by every
//! commit, grew for good (schemas, specs and properties are kept forever, snapshots until
//! expired): each commit cost more I/O than the last. A commit that shrinks the table
//! (an expiry, say) is always taken.

use std::time::Duration;

/// How far ahead of the server's clock a foreign snapshot's `timestamp-ms` may be.
///
/// Iceberg lets a snapshot's timestamp lie up to one minute before the table's last one
/// (clock skew between writers); a bound of half that keeps mink's next commit, stamped
/// with the server's clock, always within Iceberg's tolerance of the foreign snapshot.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(30);

/// `add-snapshot` updates one commit to a mink table may carry: an append adds one
/// snapshot (a second one could only build on the first, which is not yet the table's).
pub const MAX_SNAPSHOTS_PER_COMMIT: usize = 1;

/// The bytes (keys and values) of an added snapshot's summary: mink's own summaries hold
/// a few counts; each is kept in the metadata file for as long as the snapshot.
pub const MAX_SUMMARY_BYTES: usize = 64 << 10;

/// Snapshots a hosted table may keep: past it, commits that add more are refused until
/// the client expires some.
pub const MAX_SNAPSHOTS: usize = 10_000;

/// Properties a hosted table may have.
pub const MAX_TABLE_PROPERTIES: usize = 1_000;

/// The size of a hosted table's metadata file (its JSON), which every commit rewrites.
pub const MAX_METADATA_BYTES: usize = 16 << 20;
