//! The bounds lake upkeep keeps around readers and other engines' commits
//! (`docs/security.md`, "Lake files under readers"), in one place.
//!
//! Upkeep deletes files: expiry those only expired snapshots read, orphan removal those
//! no snapshot references. Two kinds of work in flight can still need such a file: a
//! read that planned on a snapshot (in the server, a `mink worker` or a `mink sql
//! --connect` client), and another engine's commit that wrote its files but has not yet
//! swapped its metadata in. Reads hold a lease ([`super::leases`]); commits are protected
//! by the orphan grace's floor, **refused** below it (a request naming a shorter grace is
//! an error, never clamped, so that nobody believes a shorter one ran).
//!
//! | limit                   | value | how     |
//! |-------------------------|-------|---------|
//! | [`MIN_ORPHAN_GRACE`]    | 24 h  | `remove_orphan_files` with a shorter grace is refused (Iceberg's Spark procedure refuses under 24 h too) |
//! | [`LEASE_PERIOD`]        | 5 min | a lease not renewed for this long lapses; the node keeps a snapshot it planned a read on this long before the reader's own lease is seen |
//! | [`LEASE_RENEWALS`]      | 5 per period | a running read rewrites its lease every period / 5 |
//! | [`LEASE_CLOCK_SKEW`]    | 5 min | a lease counts until its expiry time (the reader's clock) plus this, so clocks this far apart never drop a live one |
//!
//! Tests shorten the lease period and the skew with `MINK_LAKE_LEASE_MS`
//! ([`super::leases::LEASE_PERIOD_ENV`]).

use std::time::Duration;

/// The shortest orphan grace `remove_orphan_files` accepts: a file younger than this may
/// belong to a commit another engine is still writing (its data files land before its
/// manifests and its metadata swap). Iceberg's Spark procedure refuses an `older_than`
/// under 24 hours for the same reason; mink's default is 3 days
/// ([`super::DEFAULT_ORPHAN_GRACE`]).
pub const MIN_ORPHAN_GRACE: Duration = Duration::from_secs(24 * 3600);

/// How long a lease lasts without a renewal. A reader renews it [`LEASE_RENEWALS`] times a
/// period, so only a reader stalled (or gone) for a whole period loses it: its read may
/// then fail with `NOT_FOUND`, never return wrong rows. The node that planned a read holds
/// its snapshot as long (in memory) while the reader's own lease is written.
pub const LEASE_PERIOD: Duration = Duration::from_secs(300);

/// How many times a running read rewrites its lease per [`LEASE_PERIOD`].
pub const LEASE_RENEWALS: u32 = 5;

/// How far apart the clocks of a reader and the node running upkeep may be: a lease counts
/// until its expiry time plus this.
pub const LEASE_CLOCK_SKEW: Duration = Duration::from_secs(300);
