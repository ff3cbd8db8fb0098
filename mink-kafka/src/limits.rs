//! The bounds of the Kafka port, in one place (`docs/kafka.md`, "Limits").
//!
//! | limit | value | how |
//! |---|---|---|
//! | [`MAX_REQUEST_BYTES`] | 64 MiB | a larger frame closes the connection (Kafka's `socket.request.max.bytes`) |
//! | [`MAX_LOGIN_REQUEST_BYTES`] | 512 KiB | with a login configured, a larger frame before it closes the connection (Kafka's `sasl.server.max.receive.size`) |
//! | [`LOGIN_TIMEOUT`] | 10 s | a connection that has not sent its first request (with a login configured: has not logged in) by then is closed |
//! | [`IDLE_TIMEOUT`] | 10 min | a connection with no request is closed (Kafka's `connections.max.idle.ms`) |
//! | [`REQUEST_READ_TIMEOUT`] | 30 s | a request whose bytes stall is dropped with its connection |
//! | [`TLS_HANDSHAKE_TIMEOUT`] | 10 s | a stalled TLS handshake is dropped |
//! | [`MAX_DECOMPRESSED_BYTES`] | 64 MiB | a produced batch that inflates past it is refused (`CORRUPT_MESSAGE`) |
//! | [`MAX_BATCH_RECORDS`] | 131 072 | a produced batch announcing more records is refused before it is inflated (`MESSAGE_TOO_LARGE`) |
//! | [`MAX_REQUEST_RECORDS`] | 262 144 | a Produce whose batches announce more records in all is refused whole (`MESSAGE_TOO_LARGE`) |
//! | [`MAX_FETCH_BYTES`] | 32 MiB | a Fetch's `max_bytes` and `partition_max_bytes` are clamped |
//! | [`FETCH_CHUNK_ROWS`] | 1 024 | a Fetch answer stops after the first chunk of rows past its byte bound |
//! | Fetch `max_wait_ms` | 60 s | clamped (the node's Tail bound) |
//! | [`MAX_OFFSET_METADATA_BYTES`] | 4 KiB | a committed offset's metadata beyond it is refused for its partition (`OFFSET_METADATA_TOO_LARGE`; Kafka's `offset.metadata.max.bytes`) |
//! | [`MAX_COMMITTED_GROUPS`] | 100 000 | a commit of a group with no committed offsets beyond it is refused (`COORDINATOR_NOT_AVAILABLE` for each partition) |
//! | [`OFFSETS_RETENTION`] | 7 days | a group without members and without a commit for that long loses its committed offsets in `meta.db` (Kafka's `offsets.retention.minutes`) |
//! | [`OFFSETS_EXPIRY_INTERVAL`] | 1 min | how often an OffsetCommit or an OffsetFetch looks for them |
//! | [`MAX_GROUP_ID_BYTES`] | 1 KiB | a join (`INVALID_GROUP_ID`), a commit (`INVALID_GROUP_ID` for each partition) or a fetch of committed offsets naming a longer group is refused |
//! | [`MAX_GROUPS`] | 10 000 | a new group beyond it is refused (`COORDINATOR_NOT_AVAILABLE`) |
//! | [`MAX_GROUP_MEMBERS`] | 1 000 | a join beyond it is refused (`GROUP_MAX_SIZE_REACHED`) |
//! | [`MAX_MEMBER_BYTES`] | 1 MiB | a join whose protocols (names and metadata), protocol type, member id and client id together are larger, or an assignment that is, is refused (`INVALID_REQUEST`) |
//! | [`MAX_COORDINATOR_BYTES`] | 64 MiB | a join or a leader's assignments that would take what every group holds past it is refused (`COORDINATOR_NOT_AVAILABLE`) |
//! | [`SESSION_TIMEOUTS`] | 6 s to 30 min | a join asking for another is refused (`INVALID_SESSION_TIMEOUT`; Kafka's `group.min/max.session.timeout.ms`) |
//! | [`MAX_REBALANCE_TIMEOUT`] | 5 min | clamped |
//! | [`GROUP_SWEEP_INTERVAL`] | 1 s | at most this often a group request first removes expired members and empty groups of every group |
//! | [`MAX_CACHED_PRODUCERS`] | 10 000 | the idle producers' last batches are dropped from memory (they are read again from `meta.db`) |
//! | [`PRODUCER_EXPIRATION`] | 1 day | a producer that wrote nothing for that long is forgotten in `meta.db` (Kafka's `producer.id.expiration.ms`) |
//! | [`PRODUCER_EXPIRY_INTERVAL`] | 1 min | how often an InitProducerId or a producer's first batch looks for them |
//! | connections | `--max-connections` | one more is closed at once |
//!
//! Every array and record count in a request is checked against the bytes that carry
//! it before anything is allocated (the patched codec crate, `vendor/README.md`); a
//! record count is also checked against [`MAX_BATCH_RECORDS`], since what a record
//! costs once decoded is not bounded by the bytes it took on the wire.

use std::ops::RangeInclusive;
use std::time::Duration;

/// The largest request frame read.
pub(crate) const MAX_REQUEST_BYTES: usize = 64 << 20;
/// The largest request frame read before a login, when one is configured.
pub(crate) const MAX_LOGIN_REQUEST_BYTES: usize = 512 << 10;
/// How long a new connection may take to send its first request and, with a login
/// configured, to log in.
pub(crate) const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may wait between requests.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the bytes of one request may take to arrive once its size has.
pub(crate) const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a TLS handshake may take.
pub(crate) const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most bytes one produced record batch may inflate to.
pub(crate) const MAX_DECOMPRESSED_BYTES: usize = 64 << 20;
/// The most records one produced record batch may announce: a minimal record takes 7
/// bytes, so [`MAX_DECOMPRESSED_BYTES`] alone would let one batch become 9.6 million
/// rows, each costing hundreds of bytes to decode, convert and send back.
pub(crate) const MAX_BATCH_RECORDS: usize = 128 << 10;
/// The most records the batches of one Produce may announce in all.
pub(crate) const MAX_REQUEST_RECORDS: usize = 256 << 10;
/// The most record bytes one Fetch answer (and one of its partitions) holds; the
/// first chunk of rows at the fetch offset is always sent so a consumer makes progress.
pub(crate) const MAX_FETCH_BYTES: u64 = mink_core::protocol::limits::MAX_ANSWER_BYTES;
/// The rows of a stored batch a Fetch turns into one Kafka record batch at a time.
pub(crate) const FETCH_CHUNK_ROWS: usize = 1024;
/// The most bytes of metadata a committed offset may carry.
pub(crate) const MAX_OFFSET_METADATA_BYTES: usize = 4 << 10;
/// The most groups with committed offsets in `meta.db`: each takes a row per
/// partition it commits, so without a bound a client naming a new group in every
/// commit fills the disk long before [`OFFSETS_RETENTION`] frees anything.
pub(crate) const MAX_COMMITTED_GROUPS: usize = 100_000;
/// How long the committed offsets of a group without members outlive its last commit.
pub(crate) const OFFSETS_RETENTION: Duration = Duration::from_secs(7 * 24 * 60 * 60);
/// How often groups idle for [`OFFSETS_RETENTION`] are looked for.
pub(crate) const OFFSETS_EXPIRY_INTERVAL: Duration = Duration::from_secs(60);
/// The longest group id: it is held in memory and, with committed offsets, in `meta.db`.
pub(crate) const MAX_GROUP_ID_BYTES: usize = 1 << 10;
/// The most consumer groups the coordinator keeps in memory.
pub(crate) const MAX_GROUPS: usize = 10_000;
/// The most members of one group.
pub(crate) const MAX_GROUP_MEMBERS: usize = 1_000;
/// The most bytes one member's protocols, protocol type and ids (or its assignment) may
/// hold.
pub(crate) const MAX_MEMBER_BYTES: usize = 1 << 20;
/// The most bytes every group together holds: members' ids and protocols, assignments.
pub(crate) const MAX_COORDINATOR_BYTES: usize = 64 << 20;
/// The session timeouts a member may ask for, in milliseconds.
pub(crate) const SESSION_TIMEOUTS: RangeInclusive<i32> = 6_000..=1_800_000;
/// The longest a rebalance waits for members to join again.
pub(crate) const MAX_REBALANCE_TIMEOUT: Duration = Duration::from_secs(300);
/// How often the coordinator looks through every group for expired members.
pub(crate) const GROUP_SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// The most idempotent producers whose last batches are kept in memory.
pub(crate) const MAX_CACHED_PRODUCERS: usize = 10_000;
/// How long a producer that writes nothing keeps its last batches in `meta.db`.
pub(crate) const PRODUCER_EXPIRATION: Duration = Duration::from_secs(24 * 60 * 60);
/// How often idle producers are looked for.
pub(crate) const PRODUCER_EXPIRY_INTERVAL: Duration = Duration::from_secs(60);

/// A Fetch's byte bound for a requested one (non-positive means the most).
pub(crate) fn fetch_bytes(requested: i32) -> u64 {
    u64::try_from(requested)
        .ok()
        .filter(|b| *b > 0)
        .map_or(MAX_FETCH_BYTES, |b| b.min(MAX_FETCH_BYTES))
}
