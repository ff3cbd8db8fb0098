//! The prost structs of the wire messages, in the order of `node.proto`.

use prost::Message;

use crate::filter::ColumnFilter;
use crate::table::TablePath;

/// One bucket of one table (and partition, for partitioned tables).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Message)]
pub struct BucketId {
    /// `database.name`.
    #[prost(string, tag = "1")]
    pub table: String,
    /// The partition name (see [`crate::partition`]); absent for unpartitioned tables.
    #[prost(string, optional, tag = "2")]
    pub partition: Option<String>,
    /// The bucket within the table or partition.
    #[prost(uint32, tag = "3")]
    pub bucket: u32,
}

impl BucketId {
    /// A bucket of an unpartitioned table.
    pub fn new(table: &TablePath, bucket: u32) -> Self {
        Self {
            table: table.to_string(),
            partition: None,
            bucket,
        }
    }
}

impl std::fmt::Display for BucketId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.partition {
            Some(partition) => write!(f, "{}[{partition}]/{}", self.table, self.bucket),
            None => write!(f, "{}/{}", self.table, self.bucket),
        }
    }
}

/// A DoGet ticket.
#[derive(Clone, PartialEq, Message)]
pub struct ReadTicket {
    /// The read to run.
    #[prost(oneof = "read_ticket::Read", tags = "1, 2, 3, 4, 5, 6")]
    pub read: Option<read_ticket::Read>,
}

/// The reads a DoGet ticket can name.
pub mod read_ticket {
    /// One kind of read.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Read {
        /// Log batches from an offset.
        #[prost(message, tag = "1")]
        Scan(super::ScanRequest),
        /// Every row of a primary-key table's KV store, in key order.
        #[prost(message, tag = "2")]
        Snapshot(super::SnapshotRequest),
        /// The first rows of a KV store, or the last rows of a log table.
        #[prost(message, tag = "3")]
        LimitScan(super::LimitScanRequest),
        /// Lake snapshot plus log range of one bucket, merged.
        #[prost(message, tag = "4")]
        Union(super::UnionRequest),
        /// One lake snapshot of a table or partition.
        #[prost(message, tag = "5")]
        Lake(super::LakeRequest),
        /// The live rows of a primary-key table's changelog range.
        #[prost(message, tag = "6")]
        LiveRange(super::LiveRangeRequest),
    }
}

/// Scan { bucket, offset, max_bytes, columns }: log batches from `offset` up to the high
/// watermark, at most about `max_bytes` (at least one batch is always returned).
#[derive(Clone, PartialEq, Message)]
pub struct ScanRequest {
    /// The bucket to read.
    #[prost(message, optional, tag = "1")]
    pub bucket: Option<BucketId>,
    /// The first offset wanted; the batch holding it is returned whole.
    #[prost(int64, tag = "2")]
    pub offset: i64,
    /// Stop after this many bytes of Arrow data; 0 means the server default.
    #[prost(uint64, tag = "3")]
    pub max_bytes: u64,
    /// Field indexes of the current schema to return; empty means all.
    #[prost(uint32, repeated, tag = "4")]
    pub columns: Vec<u32>,
}

/// Snapshot { bucket, columns, batch_rows }: the KV store of a primary-key table's bucket
/// in key order, `batch_rows` rows per batch, each with a [`SnapshotBatch`].
#[derive(Clone, PartialEq, Message)]
pub struct SnapshotRequest {
    /// The bucket to read.
    #[prost(message, optional, tag = "1")]
    pub bucket: Option<BucketId>,
    /// Field indexes of the current schema; empty means all.
    #[prost(uint32, repeated, tag = "2")]
    pub columns: Vec<u32>,
    /// Rows per batch; 0 means the server default.
    #[prost(uint32, tag = "3")]
    pub batch_rows: u32,
}

/// LimitScan { bucket, limit, columns }: the first `limit` rows of a primary-key table's
/// KV store (with [`SnapshotBatch`]), or the last `limit` rows of a log table's log (with
/// [`ScanBatch`]).
#[derive(Clone, PartialEq, Message)]
pub struct LimitScanRequest {
    /// The bucket to read.
    #[prost(message, optional, tag = "1")]
    pub bucket: Option<BucketId>,
    /// How many rows.
    #[prost(uint32, tag = "2")]
    pub limit: u32,
    /// Field indexes of the current schema; empty means all.
    #[prost(uint32, repeated, tag = "3")]
    pub columns: Vec<u32>,
}

/// The metadata of one Snapshot batch: the changelog offset the KV store had reached, so a
/// Scan from there continues the snapshot with nothing missed and nothing doubled.
#[derive(Clone, PartialEq, Message)]
pub struct SnapshotBatch {
    /// Every change below this offset is in the snapshot, none at or above it.
    #[prost(int64, tag = "1")]
    pub log_offset: i64,
}

/// `lookup`: rows by primary key, one store get per key.
#[derive(Clone, PartialEq, Message)]
pub struct Lookup {
    /// The bucket the keys belong to.
    #[prost(message, optional, tag = "1")]
    pub bucket: Option<BucketId>,
    /// An Arrow IPC stream of one batch holding the primary-key columns (by name).
    #[prost(bytes = "vec", tag = "2")]
    pub keys: Vec<u8>,
    /// Field indexes of the current schema to return; empty means all.
    #[prost(uint32, repeated, tag = "3")]
    pub columns: Vec<u32>,
}

/// `prefix_lookup`: rows whose key starts with a prefix (partition keys plus the bucket key
/// and possibly more key columns), one range scan per prefix.
#[derive(Clone, PartialEq, Message)]
pub struct PrefixLookup {
    /// The bucket the prefixes belong to.
    #[prost(message, optional, tag = "1")]
    pub bucket: Option<BucketId>,
    /// An Arrow IPC stream of one batch holding the prefix columns; their names must be
    /// the first key columns (partition keys, bucket key, rest of the primary key).
    #[prost(bytes = "vec", tag = "2")]
    pub prefixes: Vec<u8>,
    /// Field indexes of the current schema to return; empty means all.
    #[prost(uint32, repeated, tag = "3")]
    pub columns: Vec<u32>,
}

/// The answer of `lookup` and `prefix_lookup`.
#[derive(Clone, PartialEq, Message)]
pub struct LookupReply {
    /// An Arrow IPC stream of one batch: the rows found, projected.
    #[prost(bytes = "vec", tag = "1")]
    pub rows: Vec<u8>,
    /// For each row, the index of the request key (or prefix) it answers.
    #[prost(uint32, repeated, tag = "2")]
    pub key_indices: Vec<u32>,
}

/// Union { bucket, columns }: the bucket as it is now, lake rows below the seam plus the
/// log from the seam to the high watermark at plan time. The answer ends with a
/// metadata-only [`UnionPlan`].
#[derive(Clone, PartialEq, Message)]
pub struct UnionRequest {
    /// The bucket to read.
    #[prost(message, optional, tag = "1")]
    pub bucket: Option<BucketId>,
    /// Field indexes of the current schema; empty means all.
    #[prost(uint32, repeated, tag = "2")]
    pub columns: Vec<u32>,
    /// Only rows matching every filter (pushed into the lake scan, applied to every row).
    #[prost(message, repeated, tag = "3")]
    pub filters: Vec<ColumnFilter>,
}

/// The plan a Union answer followed.
#[derive(Clone, PartialEq, Message)]
pub struct UnionPlan {
    /// The lake snapshot read; absent when the table has no tiered snapshot.
    #[prost(int64, optional, tag = "1")]
    pub snapshot_id: Option<i64>,
    /// The bucket's log_end_offset recorded with that snapshot (the seam).
    #[prost(int64, tag = "2")]
    pub lake_log_end_offset: i64,
    /// First log offset read: max(lake_log_end_offset, log_start).
    #[prost(int64, tag = "3")]
    pub log_from: i64,
    /// End of the log read (exclusive): the high watermark at plan time.
    #[prost(int64, tag = "4")]
    pub log_to: i64,
    /// Lake data files read.
    #[prost(uint64, tag = "5")]
    pub lake_files: u64,
    /// For a primary-key table: the lake rows this log range replaces are located, as the
    /// `replaced_rows` of the split's files, so a reader leaves them out by position and
    /// needs not probe every lake row's key. Without it, every lake row's key is probed.
    #[prost(bool, tag = "6")]
    pub replaced_rows_located: bool,
}

impl UnionPlan {
    /// The offsets of its log range, `log_to - log_from`: 0 when the lake alone answers.
    pub fn log_range_len(&self) -> i64 {
        self.log_to - self.log_from
    }
}

/// A bucket's Union plan and its split: the lake files below the seam (pruned by the
/// request's filters), each with the delete files that apply to it. The answer of
/// `plan_union`, and each entry of [`TableUnionSplits`].
#[derive(Clone, PartialEq, Message)]
pub struct UnionSplit {
    /// The plan.
    #[prost(message, optional, tag = "1")]
    pub plan: Option<UnionPlan>,
    /// The lake data files to read.
    #[prost(message, repeated, tag = "2")]
    pub files: Vec<LakeFileRef>,
    /// The bucket planned.
    #[prost(message, optional, tag = "3")]
    pub bucket: Option<BucketId>,
}

/// PlanTableUnion { table, filters }: every bucket's Union plan and split, as
/// `plan_union` plans each, all from the same recorded lake snapshot.
#[derive(Clone, PartialEq, Message)]
pub struct TableUnionRequest {
    /// `database.name`.
    #[prost(string, tag = "1")]
    pub table: String,
    /// Only rows matching every filter (they prune the lake files planned).
    #[prost(message, repeated, tag = "2")]
    pub filters: Vec<ColumnFilter>,
}

/// The answer of `plan_table_union`: one split per bucket of the table created so far,
/// partition by partition, in the order of `list_buckets`.
#[derive(Clone, PartialEq, Message)]
pub struct TableUnionSplits {
    /// The buckets' splits, each naming its bucket.
    #[prost(message, repeated, tag = "1")]
    pub splits: Vec<UnionSplit>,
    /// In a cluster, the buckets another node leads (or that are moving).
    #[prost(message, repeated, tag = "2")]
    pub elsewhere: Vec<NotLeader>,
}

/// A lake data file of a split.
#[derive(Clone, PartialEq, Message)]
pub struct LakeFileRef {
    /// Its location in the warehouse.
    #[prost(string, tag = "1")]
    pub path: String,
    /// Its size in bytes.
    #[prost(uint64, tag = "2")]
    pub size: u64,
    /// Its row count (before deletes), when known.
    #[prost(uint64, optional, tag = "3")]
    pub record_count: Option<u64>,
    /// The delete files that apply to it.
    #[prost(message, repeated, tag = "4")]
    pub deletes: Vec<LakeDeleteRef>,
    /// The positions of its rows that the split's log range replaces (a newer version or
    /// a delete of their keys), ascending; read like position deletes. Set with
    /// [`UnionPlan::replaced_rows_located`].
    #[prost(uint64, repeated, tag = "5")]
    pub replaced_rows: Vec<u64>,
}

/// A delete file applying to a lake data file.
#[derive(Clone, PartialEq, Message)]
pub struct LakeDeleteRef {
    /// Its location in the warehouse.
    #[prost(string, tag = "1")]
    pub path: String,
    /// Its size in bytes.
    #[prost(uint64, tag = "2")]
    pub size: u64,
    /// The columns of an equality-delete file; empty for a position-delete file.
    #[prost(string, repeated, tag = "3")]
    pub equality_columns: Vec<String>,
}

/// PlanTableChanges { table, from_snapshot_id, to_snapshot_id }: the changes of a
/// table's lake from one snapshot (excluded) to a newer one of its lineage (included).
#[derive(Clone, PartialEq, Message)]
pub struct TableChangesRequest {
    /// `database.name`.
    #[prost(string, tag = "1")]
    pub table: String,
    /// The snapshot the changes start after.
    #[prost(int64, tag = "2")]
    pub from_snapshot_id: i64,
    /// The snapshot they end at.
    #[prost(int64, tag = "3")]
    pub to_snapshot_id: i64,
}

/// The answer of `plan_table_changes`: every snapshot of the range, oldest first, with
/// the files it added. Empty when `from == to`.
#[derive(Clone, PartialEq, Message)]
pub struct TableChangesPlan {
    /// The snapshot the changes start after.
    #[prost(int64, tag = "1")]
    pub from_snapshot_id: i64,
    /// The snapshot they end at.
    #[prost(int64, tag = "2")]
    pub to_snapshot_id: i64,
    /// The snapshots, oldest first.
    #[prost(message, repeated, tag = "3")]
    pub snapshots: Vec<LakeSnapshotChanges>,
}

/// What one lake snapshot changed.
#[derive(Clone, PartialEq, Message)]
pub struct LakeSnapshotChanges {
    /// The snapshot.
    #[prost(int64, tag = "1")]
    pub snapshot_id: i64,
    /// Its Iceberg operation: `append`, `overwrite`, `delete` or `replace`.
    #[prost(string, tag = "2")]
    pub operation: String,
    /// The data files it added (their rows are inserts); none for a `replace`. Their
    /// `deletes` are empty.
    #[prost(message, repeated, tag = "3")]
    pub data_files: Vec<LakeFileRef>,
    /// The delete files it added (the rows they remove are deletes); none for a
    /// `replace`.
    #[prost(message, repeated, tag = "4")]
    pub delete_files: Vec<LakeDeleteRef>,
    /// How many files it removed (not counted for a `replace`): when not zero, no change set
    /// expresses the range and the reader reads `to_snapshot_id` in full.
    #[prost(uint64, tag = "5")]
    pub removed_files: u64,
    /// Its Iceberg sequence number: grows with commit order, unlike snapshot ids.
    #[prost(int64, tag = "6")]
    pub sequence_number: i64,
}

/// Lake { table, partition, snapshot_id, columns }: one Iceberg snapshot of a table (or of
/// one partition), read by the node.
#[derive(Clone, PartialEq, Message)]
pub struct LakeRequest {
    /// `database.name`.
    #[prost(string, tag = "1")]
    pub table: String,
    /// Only this partition.
    #[prost(string, optional, tag = "2")]
    pub partition: Option<String>,
    /// The snapshot; the latest recorded one when absent.
    #[prost(int64, optional, tag = "3")]
    pub snapshot_id: Option<i64>,
    /// Field indexes of the current schema; empty means all.
    #[prost(uint32, repeated, tag = "4")]
    pub columns: Vec<u32>,
    /// Only rows matching every filter (pushed into the lake scan, applied to every row).
    #[prost(message, repeated, tag = "5")]
    pub filters: Vec<ColumnFilter>,
}

/// LiveRange { bucket, from, to, columns }: the live rows of a primary-key table's changelog
/// range `[from, to)`, a union read's tail folded by the bucket's leader: for each key the
/// range changes, its last change when that is `+I` or `+U`, in log order, as plain rows.
/// The range lies inside the bucket's log and spans at most [`MAX_LIVE_RANGE_ROWS`] offsets.
#[derive(Clone, PartialEq, Message)]
pub struct LiveRangeRequest {
    /// The bucket to read.
    #[prost(message, optional, tag = "1")]
    pub bucket: Option<BucketId>,
    /// The first offset of the range.
    #[prost(int64, tag = "2")]
    pub from: i64,
    /// The end of the range (exclusive).
    #[prost(int64, tag = "3")]
    pub to: i64,
    /// Field indexes of the current schema; empty means all.
    #[prost(uint32, repeated, tag = "4")]
    pub columns: Vec<u32>,
}

/// The longest range a LiveRange folds: the leader holds a range's changes in memory.
pub const MAX_LIVE_RANGE_ROWS: i64 = 1 << 20;

/// The answer of `tier_table`.
#[derive(Clone, PartialEq, Message)]
pub struct TierReply {
    /// The snapshot committed; absent when there was nothing new.
    #[prost(int64, optional, tag = "1")]
    pub snapshot_id: Option<i64>,
    /// Rows tiered.
    #[prost(uint64, tag = "2")]
    pub rows: u64,
    /// Data files written.
    #[prost(uint64, tag = "3")]
    pub files: u64,
    /// Whether a snapshot committed before a crash was recorded first.
    #[prost(bool, tag = "4")]
    pub repaired: bool,
    /// Lake rows deleted (replaced or removed keys of a primary-key table).
    #[prost(uint64, tag = "5")]
    pub deleted_rows: u64,
    /// Delete files written.
    #[prost(uint64, tag = "6")]
    pub delete_files: u64,
}

/// The answer of `list_lake_snapshots`.
#[derive(Clone, PartialEq, Message)]
pub struct LakeSnapshotList {
    /// Oldest first.
    #[prost(message, repeated, tag = "1")]
    pub snapshots: Vec<LakeSnapshotInfo>,
}

/// A lake snapshot mink recorded: a tiering round or a compaction.
#[derive(Clone, PartialEq, Message)]
pub struct LakeSnapshotInfo {
    /// The Iceberg snapshot.
    #[prost(int64, tag = "1")]
    pub snapshot_id: i64,
    /// When mink recorded it, ms since the epoch.
    #[prost(int64, tag = "2")]
    pub committed_at: i64,
    /// Each bucket's log offset it holds the rows below.
    #[prost(message, repeated, tag = "3")]
    pub buckets: Vec<BucketSeam>,
}

/// A bucket's seam in a lake snapshot.
#[derive(Clone, PartialEq, Message)]
pub struct BucketSeam {
    /// The partition name; absent for unpartitioned tables.
    #[prost(string, optional, tag = "1")]
    pub partition: Option<String>,
    /// The bucket.
    #[prost(uint32, tag = "2")]
    pub bucket: u32,
    /// The log offset tiered up to (exclusive).
    #[prost(int64, tag = "3")]
    pub log_end_offset: i64,
}

/// The answer of `compact_table`.
#[derive(Clone, PartialEq, Message)]
pub struct CompactReply {
    /// The `replace` snapshot committed; absent when no bucket needed compacting.
    #[prost(int64, optional, tag = "1")]
    pub snapshot_id: Option<i64>,
    /// Buckets compacted.
    #[prost(uint64, tag = "2")]
    pub buckets: u64,
    /// Data and delete files the snapshot removed.
    #[prost(uint64, tag = "3")]
    pub files_removed: u64,
    /// Data files written.
    #[prost(uint64, tag = "4")]
    pub files_written: u64,
    /// Live rows rewritten.
    #[prost(uint64, tag = "5")]
    pub rows: u64,
}

/// The answer of `expire_snapshots`.
#[derive(Clone, PartialEq, Message)]
pub struct ExpireSnapshotsReply {
    /// The snapshots expired.
    #[prost(int64, repeated, tag = "1")]
    pub expired_snapshots: Vec<i64>,
    /// Data files deleted.
    #[prost(uint64, tag = "2")]
    pub data_files_deleted: u64,
    /// Position and equality delete files deleted.
    #[prost(uint64, tag = "3")]
    pub delete_files_deleted: u64,
    /// Manifests deleted.
    #[prost(uint64, tag = "4")]
    pub manifests_deleted: u64,
    /// Manifest lists deleted.
    #[prost(uint64, tag = "5")]
    pub manifest_lists_deleted: u64,
    /// Metadata files deleted (older than the table's metadata log).
    #[prost(uint64, tag = "6")]
    pub metadata_files_deleted: u64,
}

/// RemoveOrphanFiles { table, grace_ms }: deletes the unreferenced files under a table's
/// lake location last modified more than `grace_ms` ago (at least 24 h; default: three days).
#[derive(Clone, PartialEq, Message)]
pub struct RemoveOrphanFiles {
    /// `database.name`.
    #[prost(string, tag = "1")]
    pub table: String,
    /// How old an unreferenced file must be to go, in milliseconds.
    #[prost(uint64, optional, tag = "2")]
    pub grace_ms: Option<u64>,
}

/// The answer of `remove_orphan_files`.
#[derive(Clone, PartialEq, Message)]
pub struct RemoveOrphanFilesReply {
    /// The locations of the files removed.
    #[prost(string, repeated, tag = "1")]
    pub removed: Vec<String>,
    /// Their bytes.
    #[prost(uint64, tag = "2")]
    pub bytes: u64,
}

/// The answer of `rewrite_manifests`.
#[derive(Clone, PartialEq, Message)]
pub struct RewriteManifestsReply {
    /// The `replace` snapshot committed; absent when the table has no snapshot yet.
    #[prost(int64, optional, tag = "1")]
    pub snapshot_id: Option<i64>,
    /// Manifests merged.
    #[prost(uint64, tag = "2")]
    pub manifests_replaced: u64,
    /// Manifests written by merging them.
    #[prost(uint64, tag = "3")]
    pub manifests_created: u64,
}

/// The answer of `lake_table_stats`: what a table's lake holds, as of its current
/// snapshot.
#[derive(Clone, PartialEq, Message)]
pub struct LakeTableStats {
    /// Whether the lake table exists yet (it is created by the table's first round).
    #[prost(bool, tag = "1")]
    pub exists: bool,
    /// Snapshots in the lake table's metadata.
    #[prost(uint64, tag = "2")]
    pub snapshots: u64,
    /// Manifests of the current snapshot.
    #[prost(uint64, tag = "3")]
    pub manifests: u64,
    /// Live data files.
    #[prost(uint64, tag = "4")]
    pub data_files: u64,
    /// Live delete files.
    #[prost(uint64, tag = "5")]
    pub delete_files: u64,
    /// Bytes of the live data and delete files.
    #[prost(uint64, tag = "6")]
    pub bytes: u64,
    /// When the oldest snapshot was committed, milliseconds since the epoch.
    #[prost(int64, optional, tag = "7")]
    pub oldest_snapshot_at: Option<i64>,
}

/// Tail { bucket, offset, columns, max_wait_ms, min_bytes }: a Scan that waits up to
/// `max_wait_ms` for the high watermark to pass `offset` and for `min_bytes` to arrive.
#[derive(Clone, PartialEq, Message)]
pub struct TailRequest {
    /// The bucket to follow.
    #[prost(message, optional, tag = "1")]
    pub bucket: Option<BucketId>,
    /// The next offset wanted.
    #[prost(int64, tag = "2")]
    pub offset: i64,
    /// Field indexes of the current schema; empty means all.
    #[prost(uint32, repeated, tag = "3")]
    pub columns: Vec<u32>,
    /// The longest wait for data.
    #[prost(uint64, tag = "4")]
    pub max_wait_ms: u64,
    /// Keep waiting (up to `max_wait_ms`) until this many bytes are available.
    #[prost(uint64, tag = "5")]
    pub min_bytes: u64,
    /// Upper bound of one answer; 0 means the server default.
    #[prost(uint64, tag = "6")]
    pub max_bytes: u64,
}

/// The metadata of one log batch, in its FlightData's `app_metadata`.
#[derive(Clone, PartialEq, Message)]
pub struct ScanBatch {
    /// Offset of the batch's first row.
    #[prost(int64, tag = "1")]
    pub base_offset: i64,
    /// Offset of the batch's last row (one offset per row).
    #[prost(int64, tag = "2")]
    pub last_offset: i64,
    /// When the batch was committed, milliseconds since the Unix epoch.
    #[prost(int64, tag = "3")]
    pub commit_timestamp: i64,
    /// The schema version the batch was written with.
    #[prost(uint32, tag = "4")]
    pub schema_id: u32,
    /// One [`crate::change::ChangeType`] byte per row; absent for append-only batches.
    #[prost(bytes = "vec", optional, tag = "5")]
    pub changes: Option<Vec<u8>>,
    /// The bucket's high watermark when the batch was sent.
    #[prost(int64, tag = "6")]
    pub high_watermark: i64,
}

/// The end of one Tail answer: a data-less FlightData carries it.
#[derive(Clone, PartialEq, Message)]
pub struct TailEnd {
    /// The offset to ask for next.
    #[prost(int64, tag = "1")]
    pub next_offset: i64,
    /// The bucket's high watermark.
    #[prost(int64, tag = "2")]
    pub high_watermark: i64,
}

/// The DoPut descriptor: which bucket the following batches go to, and how.
///
/// On a log table every batch is appended. On a primary-key table a batch is an upsert
/// (whole rows), or with `delete` a batch of keys to delete (the primary-key columns;
/// other columns are ignored).
#[derive(Clone, PartialEq, Message)]
pub struct WriteHeader {
    /// The target bucket.
    #[prost(message, optional, tag = "1")]
    pub bucket: Option<BucketId>,
    /// The batches are keys to delete (primary-key tables only).
    #[prost(bool, tag = "2")]
    pub delete: bool,
    /// The idempotent writer sending the batches: each is written once, however often
    /// it is sent. Absent for a writer that does not retry.
    #[prost(message, optional, tag = "3")]
    pub writer: Option<IdempotentWriter>,
}

/// An idempotent writer's DoPut: its batches numbered, so that a retry of a DoPut whose
/// answer was lost writes none of them twice. The node answers a batch whose number the
/// writer's batches in the bucket have reached with the earlier write
/// ([`AppendAck::duplicate`]).
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub struct IdempotentWriter {
    /// The writer's id: random, and kept secret by the writer (a DoPut naming another
    /// writer's id could make the node take its batches for that writer's).
    #[prost(int64, tag = "1")]
    pub producer_id: i64,
    /// The number of the stream's first batch in the bucket (0 for the writer's first);
    /// each next message of the stream is one more. A writer sends its numbers in order:
    /// one at or below the last the node holds is taken for written.
    #[prost(int32, tag = "2")]
    pub first_sequence: i32,
    /// An offset of the bucket at or below every earlier attempt at these batches: where
    /// the node looks for them when it does not know the writer (it leads the bucket
    /// since). The bucket's high watermark before the writer's first write to it, then
    /// the end of its last acknowledged batch.
    #[prost(int64, tag = "3")]
    pub since: i64,
}

/// The acknowledgement of one written batch, sent only once it is durable.
#[derive(Clone, PartialEq, Message)]
pub struct AppendAck {
    /// Offset of the batch's first row.
    #[prost(int64, tag = "1")]
    pub base_offset: i64,
    /// Offset of the batch's last row.
    #[prost(int64, tag = "2")]
    pub last_offset: i64,
    /// The high watermark after the write.
    #[prost(int64, tag = "3")]
    pub high_watermark: i64,
    /// The batch was written before, by an earlier attempt of its idempotent writer, and
    /// not again: the offsets are that write's, or -1 when the node no longer knows them.
    #[prost(bool, tag = "4")]
    pub duplicate: bool,
}

/// A table and everything about it.
#[derive(Clone, PartialEq, Message)]
pub struct TableDescriptorProto {
    /// See [`TableDescriptor::table_id`](crate::table::TableDescriptor::table_id).
    #[prost(uint64, tag = "1")]
    pub table_id: u64,
    /// The database.
    #[prost(string, tag = "2")]
    pub database: String,
    /// The table name.
    #[prost(string, tag = "3")]
    pub name: String,
    /// Every schema version, oldest first.
    #[prost(message, repeated, tag = "4")]
    pub schemas: Vec<SchemaVersionProto>,
    /// Primary-key columns.
    #[prost(string, repeated, tag = "5")]
    pub primary_key: Vec<String>,
    /// Partition-key columns.
    #[prost(string, repeated, tag = "6")]
    pub partition_keys: Vec<String>,
    /// Bucket-key columns.
    #[prost(string, repeated, tag = "7")]
    pub bucket_key: Vec<String>,
    /// Number of buckets.
    #[prost(uint32, tag = "8")]
    pub bucket_num: u32,
    /// Log retention in milliseconds.
    #[prost(uint64, optional, tag = "9")]
    pub log_ttl_ms: Option<u64>,
    /// Whether the table is tiered.
    #[prost(bool, tag = "10")]
    pub lake_enabled: bool,
    /// Tiering interval in milliseconds.
    #[prost(uint64, tag = "11")]
    pub lake_freshness_ms: u64,
    /// Iceberg table properties the lake table is created with.
    #[prost(message, repeated, tag = "12")]
    pub lake_properties: Vec<LakeProperty>,
}

/// One Iceberg table property of a lake table.
#[derive(Clone, PartialEq, Message)]
pub struct LakeProperty {
    /// The property (`history.expire.max-snapshot-age-ms`, ...).
    #[prost(string, tag = "1")]
    pub key: String,
    /// Its value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// One schema version.
#[derive(Clone, PartialEq, Message)]
pub struct SchemaVersionProto {
    /// The version.
    #[prost(uint32, tag = "1")]
    pub schema_id: u32,
    /// The Arrow IPC schema message.
    #[prost(bytes = "vec", tag = "2")]
    pub arrow_schema: Vec<u8>,
}

/// `create_table`: the table to create.
#[derive(Clone, PartialEq, Message)]
pub struct CreateTable {
    /// The new table; its `table_id` is ignored.
    #[prost(message, optional, tag = "1")]
    pub table: Option<TableDescriptorProto>,
    /// Succeed without change when a table of that name exists.
    #[prost(bool, tag = "2")]
    pub if_not_exists: bool,
}

/// `drop_table`.
#[derive(Clone, PartialEq, Message)]
pub struct DropTable {
    /// `database.name`.
    #[prost(string, tag = "1")]
    pub table: String,
    /// Succeed when no such table exists.
    #[prost(bool, tag = "2")]
    pub if_exists: bool,
    /// Drop it only while it is still this table (its `table_id`): a table dropped and
    /// created again under the same name is left alone.
    #[prost(uint64, optional, tag = "3")]
    pub table_id: Option<u64>,
}

/// `list_tables`.
#[derive(Clone, PartialEq, Message)]
pub struct ListTables {
    /// Only this database; every database when absent.
    #[prost(string, optional, tag = "1")]
    pub database: Option<String>,
}

/// The answer of `list_tables`.
#[derive(Clone, PartialEq, Message)]
pub struct TableList {
    /// `database.name` of every table, sorted.
    #[prost(string, repeated, tag = "1")]
    pub tables: Vec<String>,
}

/// A request naming one table.
#[derive(Clone, PartialEq, Message)]
pub struct TableRef {
    /// `database.name`.
    #[prost(string, tag = "1")]
    pub table: String,
}

/// `add_column`.
#[derive(Clone, PartialEq, Message)]
pub struct AddColumn {
    /// `database.name`.
    #[prost(string, tag = "1")]
    pub table: String,
    /// An Arrow IPC schema holding exactly the new field.
    #[prost(bytes = "vec", tag = "2")]
    pub field: Vec<u8>,
}

/// The state of one bucket, as `list_buckets` reports it.
#[derive(Clone, PartialEq, Message)]
pub struct BucketStatus {
    /// The bucket.
    #[prost(message, optional, tag = "1")]
    pub bucket: Option<BucketId>,
    /// The first offset still in the log.
    #[prost(int64, tag = "2")]
    pub log_start: i64,
    /// The offset after the last durable row.
    #[prost(int64, tag = "3")]
    pub high_watermark: i64,
    /// The log offset the bucket is tiered up to (the seam; 0 before any round).
    #[prost(int64, tag = "4")]
    pub lake_log_end_offset: i64,
    /// The recorded lake snapshot holding that seam; absent before any round.
    #[prost(int64, optional, tag = "5")]
    pub lake_snapshot_id: Option<i64>,
    /// Where the bucket is in the node's log store; absent without one.
    #[prost(message, optional, tag = "6")]
    pub store: Option<BucketStore>,
    /// The commit time of its oldest row not yet in the lake, in milliseconds since the
    /// Unix epoch; absent when every row is tiered or the table has no lake.
    #[prost(int64, optional, tag = "7")]
    pub oldest_untiered_at_ms: Option<i64>,
    /// The leader epoch its node leads it in (0 on a single node).
    #[prost(uint64, tag = "8")]
    pub leader_epoch: u64,
}

impl BucketStatus {
    /// How far behind the lake the bucket is at `now_ms`: its rows not yet tiered, and
    /// the age in seconds of the oldest of them (0 when every row is tiered).
    pub fn lake_lag(&self, now_ms: i64) -> (i64, f64) {
        let offsets = (self.high_watermark - self.lake_log_end_offset).max(0);
        let seconds =
            (self.oldest_untiered_at_ms).map_or(0.0, |at| (now_ms - at).max(0) as f64 / 1000.0);
        (offsets, seconds)
    }
}

/// A bucket in the log store (`mink server --log-store`), as `list_buckets` reports it.
#[derive(Clone, PartialEq, Message)]
pub struct BucketStore {
    /// The stream objects its retained log is read from (a pack counted once).
    #[prost(uint64, tag = "1")]
    pub stream_objects: u64,
    /// The bytes of its retained log in them.
    #[prost(uint64, tag = "2")]
    pub stream_bytes: u64,
    /// The bytes of its log after them, in WAL objects only until they are uploaded as a
    /// stream object.
    #[prost(uint64, tag = "3")]
    pub wal_bytes: u64,
    /// A primary-key bucket's KV checkpoint: the log offset its rows are at; absent
    /// without one.
    #[prost(int64, optional, tag = "4")]
    pub kv_checkpoint_offset: Option<i64>,
    /// The runs of that checkpoint's chain (a base and the increments after it).
    #[prost(uint64, tag = "5")]
    pub kv_checkpoint_runs: u64,
    /// Their bytes in the store.
    #[prost(uint64, tag = "6")]
    pub kv_checkpoint_bytes: u64,
    /// When this node wrote the checkpoint's last run, in milliseconds since the Unix
    /// epoch; absent if it has not since it opened.
    #[prost(int64, optional, tag = "7")]
    pub kv_checkpoint_written_at_ms: Option<i64>,
    /// The bytes of rows written to the KV store since, waiting for the next run.
    #[prost(uint64, tag = "8")]
    pub kv_pending_bytes: u64,
}

/// The answer of `list_buckets`: every bucket of every partition created so far.
#[derive(Clone, PartialEq, Message)]
pub struct BucketList {
    /// The buckets, sorted by partition then bucket.
    #[prost(message, repeated, tag = "1")]
    pub buckets: Vec<BucketStatus>,
    /// In a cluster, the buckets another node leads (or that are moving).
    #[prost(message, repeated, tag = "2")]
    pub elsewhere: Vec<NotLeader>,
}

/// `list_offsets { bucket, Earliest | Latest | Timestamp }`.
#[derive(Clone, PartialEq, Message)]
pub struct ListOffsets {
    /// The bucket.
    #[prost(message, optional, tag = "1")]
    pub bucket: Option<BucketId>,
    /// Which offset.
    #[prost(oneof = "list_offsets::Spec", tags = "2, 3, 4")]
    pub spec: Option<list_offsets::Spec>,
}

/// The offsets `list_offsets` can find.
pub mod list_offsets {
    /// Which offset to look up.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Spec {
        /// log_start.
        #[prost(bool, tag = "2")]
        Earliest(bool),
        /// The high watermark.
        #[prost(bool, tag = "3")]
        Latest(bool),
        /// The first offset with commit_timestamp >= this (ms since the epoch); the high
        /// watermark when every batch is older.
        #[prost(int64, tag = "4")]
        Timestamp(i64),
    }
}

/// The answer of `list_offsets`.
#[derive(Clone, PartialEq, Message)]
pub struct OffsetReply {
    /// The offset found.
    #[prost(int64, tag = "1")]
    pub offset: i64,
}

/// The typed detail of an error answer: the bytes of gRPC's `Status.details`.
#[derive(Clone, PartialEq, Message)]
pub struct ErrorDetail {
    /// The node does not lead the bucket the request addressed.
    #[prost(message, optional, tag = "1")]
    pub not_leader: Option<NotLeader>,
}

/// A node's answer to a request addressed to a bucket it does not lead.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct NotLeader {
    /// The bucket.
    #[prost(message, optional, tag = "1")]
    pub bucket: Option<BucketId>,
    /// Its leader's address (`host:port`, as the leader advertises it); `None` while the
    /// bucket moves.
    #[prost(string, optional, tag = "2")]
    pub leader: Option<String>,
    /// The epoch of that leadership (each move bumps it).
    #[prost(uint64, tag = "3")]
    pub epoch: u64,
}

/// `list_nodes`: the nodes of the cluster.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct ListNodes {}

/// The answer of `list_nodes`: a cluster's live members and every node a bucket is
/// assigned to, by id; none on a single node.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct NodeList {
    /// The nodes, by id.
    #[prost(message, repeated, tag = "1")]
    pub nodes: Vec<NodeInfo>,
}

/// A node of a cluster.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct NodeInfo {
    /// Its id (`--node-id`).
    #[prost(string, tag = "1")]
    pub node_id: String,
    /// The address it advertises; `None` for a node that is no live member.
    #[prost(string, optional, tag = "2")]
    pub address: Option<String>,
    /// Whether it is a live member (holds its etcd lease).
    #[prost(bool, tag = "3")]
    pub live: bool,
    /// The buckets assigned to it.
    #[prost(uint32, tag = "4")]
    pub buckets: u32,
    /// The highest epoch among them.
    #[prost(uint64, tag = "5")]
    pub max_epoch: u64,
}
