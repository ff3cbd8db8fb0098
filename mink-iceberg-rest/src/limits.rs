//! The bounds of the REST catalog's requests and of what its clients may create
//! (`docs/security.md`, "The Iceberg REST catalog"; `docs/iceberg-rest.md`, "Limits and
//! errors"), in one place. Each is refused, never clamped: a client learns the limit from
//! the error and nothing it was answered for is lost.
//!
//! | limit                    | value  | how |
//! |--------------------------|--------|-----|
//! | [`MAX_BODY_BYTES`]       | 1 MiB  | a larger body is `413` (announced: before it is read) |
//! | [`MAX_TOKEN_BODY_BYTES`] | 16 KiB | a larger token request is `413` (announced: before it is read) |
//! | [`BODY_READ_TIMEOUT`]    | 30 s   | a body not whole this long after its headers is `408`, the connection closed; a catalog route's body is read only after its bearer token is checked |
//! | [`MAX_NAMESPACES`]       | 1 000  | a client's new namespace while the catalog holds as many is `400` |
//! | [`MAX_HOSTED_TABLES`]    | 1 000  | a client's new table while hosted namespaces hold as many in all is `400` |
//!
//! The bounds of a commit's contents (snapshot summaries, snapshots per table, table
//! properties, the metadata file's size) are `mink_lake::commit::limits`'.

use std::time::Duration;

/// The largest request body taken (a commit names its snapshots, not their files).
pub(crate) const MAX_BODY_BYTES: usize = 1 << 20;

/// The largest body of a token request, read before any login: a client-credentials form
/// is well under 4 KiB.
pub(crate) const MAX_TOKEN_BODY_BYTES: usize = 16 << 10;

/// A request's body must have arrived whole this long after its headers (hyper's header
/// timeout covers only the headers, so a client trickling a body held its connection, and
/// with enough of them the port, for as long as it liked, before any login).
pub(crate) const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Namespaces the lake catalog may hold for a client to create another one (mink's own
/// databases count, but are never refused: they are created through mink's SQL).
pub(crate) const MAX_NAMESPACES: usize = 1_000;

/// Tables all hosted namespaces may hold together for a client to create another one
/// (each loaded table stays in the lake's cache with its manifests).
pub(crate) const MAX_HOSTED_TABLES: usize = 1_000;
