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
