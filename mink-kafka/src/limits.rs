//! The bounds of the Kafka port, in one place (`docs/kafka.md`, "Limits").
//!
//! | limit | value | how |
//! |---|---|---|
//! | [`MAX_REQUEST_BYTES`] | 64 MiB | a larger frame closes the connection (Kafka's `socket.request.max.bytes`) |
//! | [`MAX_DECOMPRESSED_BYTES`] | 64 MiB | a produced batch that inflates past it is refused (`CORRUPT_MESSAGE`) |
//! | [`MAX_FETCH_BYTES`] | 32 MiB | a Fetch's `max_bytes` and `partition_max_bytes` are clamped |
//! | Fetch `max_wait_ms` | 60 s | clamped (the node's Tail bound) |
//! | [`IDLE_TIMEOUT`] | 10 min | a connection with no request is closed |
//! | [`REQUEST_READ_TIMEOUT`] | 30 s | a request whose bytes stall is dropped with its connection |
//! | [`TLS_HANDSHAKE_TIMEOUT`] | 10 s | a stalled TLS handshake is dropped |
//! | [`MAX_GROUPS`] | 10 000 | a new group beyond it is refused (`COORDINATOR_NOT_AVAILABLE`) |
//! | [`MAX_GROUP_MEMBERS`] | 1 000 | a join beyond it is refused (`GROUP_MAX_SIZE_REACHED`) |
//! | connections | `--max-connections` | one more is closed at once |
//!
//! Every array and record count in a request is checked against the bytes that carry
//! it before anything is allocated (the patched codec crate, `vendor/README.md`).

use std::time::Duration;

/// The largest request frame read.
pub(crate) const MAX_REQUEST_BYTES: usize = 64 << 20;
/// The most bytes one produced record batch may inflate to.
pub(crate) const MAX_DECOMPRESSED_BYTES: usize = 64 << 20;
/// The most record bytes one Fetch answer (and one of its partitions) holds; the batch
/// at the fetch offset is always sent whole so a consumer makes progress.
pub(crate) const MAX_FETCH_BYTES: u64 = mink_node::flight::limits::MAX_ANSWER_BYTES;
/// How long a connection may wait between requests.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the bytes of one request may take to arrive once its size has.
pub(crate) const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a TLS handshake may take.
pub(crate) const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most consumer groups the coordinator keeps in memory.
pub(crate) const MAX_GROUPS: usize = 10_000;
/// The most members of one group.
pub(crate) const MAX_GROUP_MEMBERS: usize = 1_000;

/// A Fetch's byte bound for a requested one (non-positive means the most).
pub(crate) fn fetch_bytes(requested: i32) -> u64 {
    u64::try_from(requested)
        .ok()
        .filter(|b| *b > 0)
        .map_or(MAX_FETCH_BYTES, |b| b.min(MAX_FETCH_BYTES))
}
