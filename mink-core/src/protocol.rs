//! Wire messages of the bucket leader's Flight protocol (`spec/reads.md`).
//!
//! Every message is protobuf (prost), carried in Flight's opaque byte fields:
//!
//! | Flight call   | carries                                  | message                      |
//! |---------------|------------------------------------------|------------------------------|
//! | DoGet         | `Ticket.ticket`                          | [`ReadTicket`]: Scan, Snapshot, LimitScan |
//! | DoExchange    | first message's `app_metadata`           | [`TailRequest`], one per poll |
//! | DoPut         | `FlightDescriptor.cmd`                   | [`WriteHeader`]              |
//! | DoPut reply   | `PutResult.app_metadata`                 | [`AppendAck`], one per batch |
//! | batch replies | `FlightData.app_metadata`                | [`ScanBatch`] / [`SnapshotBatch`] |
//! | end of a poll | data-less `FlightData.app_metadata`      | [`TailEnd`]                  |
//! | DoAction      | `Action.body` / `Result.body`            | see [`action`]               |
//!
//! Tables travel as [`TableDescriptorProto`], their schemas as Arrow IPC schema
//! flatbuffers, so any Arrow implementation can read them.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::{Field, Schema};
use arrow::ipc::convert::try_schema_from_flatbuffer_bytes;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions, StreamWriter};
use prost::Message;

use crate::filter::ColumnFilter;
use crate::table::{SchemaVersion, TableDescriptor, TablePath};
use crate::{CoreError, Result};

/// Names of the Flight actions and the messages they take and return.
pub mod action {
    /// [`super::CreateTable`] -> [`super::TableDescriptorProto`].
    pub const CREATE_TABLE: &str = "create_table";
    /// [`super::DropTable`] -> nothing.
    pub const DROP_TABLE: &str = "drop_table";
    /// [`super::ListTables`] -> [`super::TableList`].
    pub const LIST_TABLES: &str = "list_tables";
    /// [`super::TableRef`] -> [`super::TableDescriptorProto`].
    pub const DESCRIBE_TABLE: &str = "describe_table";
    /// [`super::AddColumn`] -> [`super::TableDescriptorProto`].
    pub const ADD_COLUMN: &str = "add_column";
    /// [`super::TableRef`] -> [`super::BucketList`].
    pub const LIST_BUCKETS: &str = "list_buckets";
    /// [`super::ListOffsets`] -> [`super::OffsetReply`].
    pub const LIST_OFFSETS: &str = "list_offsets";
    /// [`super::Lookup`] -> [`super::LookupReply`].
    pub const LOOKUP: &str = "lookup";
    /// [`super::PrefixLookup`] -> [`super::LookupReply`].
    pub const PREFIX_LOOKUP: &str = "prefix_lookup";
    /// [`super::TableRef`] -> [`super::TierReply`]: a tiering round now.
    pub const TIER_TABLE: &str = "tier_table";
    /// [`super::TableRef`] -> [`super::CompactReply`]: compacts every bucket of a table's
    /// lake that has more than one file or any deleted rows.
    pub const COMPACT_TABLE: &str = "compact_table";
    /// [`super::UnionRequest`] -> [`super::UnionSplit`]: a bucket's Union plan and the
    /// lake files it covers, for an engine that reads the lake and the tail itself.
    pub const PLAN_UNION: &str = "plan_union";
    /// [`super::TableRef`] -> [`super::LakeSnapshotList`]: the lake snapshots mink
    /// recorded for a table, oldest first.
    pub const LIST_LAKE_SNAPSHOTS: &str = "list_lake_snapshots";
    /// [`super::TableChangesRequest`] -> [`super::TableChangesPlan`]: what the lake
    /// snapshots between two snapshots of a table changed, and the files to read it from,
    /// for an engine that reads the changed rows itself.
    pub const PLAN_TABLE_CHANGES: &str = "plan_table_changes";
}

/// Decodes a protobuf message, naming it in the error.
pub fn decode<M: Message + Default>(what: &'static str, bytes: &[u8]) -> Result<M> {
    M::decode(bytes).map_err(|source| CoreError::Malformed { what, source })
}

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
    #[prost(oneof = "read_ticket::Read", tags = "1, 2, 3, 4, 5")]
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
        /// Lake snapshot plus log tail of one bucket, merged.
        #[prost(message, tag = "4")]
        Union(super::UnionRequest),
        /// One lake snapshot of a table or partition.
        #[prost(message, tag = "5")]
        Lake(super::LakeRequest),
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

/// Encodes one batch as an Arrow IPC stream.
pub fn encode_batch(batch: &RecordBatch) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut writer = StreamWriter::try_new(&mut bytes, batch.schema_ref())?;
    writer.write(batch)?;
    writer.finish()?;
    drop(writer);
    Ok(bytes)
}

/// Decodes an Arrow IPC stream of exactly one batch.
pub fn decode_batch(what: &str, bytes: &[u8]) -> Result<RecordBatch> {
    let malformed = |e: &dyn std::fmt::Display| {
        CoreError::InvalidRequest(format!(
            "malformed {what} (an Arrow IPC stream of one batch): {e}"
        ))
    };
    let mut reader = StreamReader::try_new(bytes, None).map_err(|e| malformed(&e))?;
    match reader.next() {
        Some(batch) => batch.map_err(|e| malformed(&e)),
        None => Err(malformed(&"no batch")),
    }
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
}

/// A bucket's Union plan and its split: the lake files below the seam (pruned by the
/// request's filters), each with the delete files that apply to it.
#[derive(Clone, PartialEq, Message)]
pub struct UnionSplit {
    /// The plan.
    #[prost(message, optional, tag = "1")]
    pub plan: Option<UnionPlan>,
    /// The lake data files to read.
    #[prost(message, repeated, tag = "2")]
    pub files: Vec<LakeFileRef>,
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
    /// How many files it removed (not counted for a `replace`): when not zero, no delta
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
}

/// A table and everything about it.
#[derive(Clone, PartialEq, Message)]
pub struct TableDescriptorProto {
    /// See [`TableDescriptor::table_id`].
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

/// Encodes an Arrow schema as an IPC schema message (as Flight's `SchemaResult` does).
pub fn encode_schema(schema: &Schema) -> Vec<u8> {
    IpcDataGenerator::default()
        .schema_to_bytes_with_dictionary_tracker(
            schema,
            &mut DictionaryTracker::new(false),
            &IpcWriteOptions::default(),
        )
        .ipc_message
}

/// Decodes an IPC schema message.
pub fn decode_schema(bytes: &[u8]) -> Result<Schema> {
    try_schema_from_flatbuffer_bytes(bytes)
        .map_err(|e| CoreError::InvalidRequest(format!("malformed Arrow schema: {e}")))
}

impl From<&TableDescriptor> for TableDescriptorProto {
    fn from(table: &TableDescriptor) -> Self {
        Self {
            table_id: table.table_id,
            database: table.path.database.clone(),
            name: table.path.name.clone(),
            schemas: table
                .schemas
                .iter()
                .map(|v| SchemaVersionProto {
                    schema_id: v.schema_id,
                    arrow_schema: encode_schema(&v.schema),
                })
                .collect(),
            primary_key: table.primary_key.clone(),
            partition_keys: table.partition_keys.clone(),
            bucket_key: table.bucket_key.clone(),
            bucket_num: table.bucket_num,
            log_ttl_ms: table.log_ttl.map(|d| d.as_millis() as u64),
            lake_enabled: table.lake_enabled,
            lake_freshness_ms: table.lake_freshness.as_millis() as u64,
        }
    }
}

impl TryFrom<TableDescriptorProto> for TableDescriptor {
    type Error = CoreError;

    fn try_from(proto: TableDescriptorProto) -> Result<Self> {
        let schemas = proto
            .schemas
            .iter()
            .map(|v| {
                Ok(SchemaVersion {
                    schema_id: v.schema_id,
                    schema: Arc::new(decode_schema(&v.arrow_schema)?),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if schemas.is_empty() {
            return Err(CoreError::InvalidRequest(
                "a table descriptor needs at least one schema version".into(),
            ));
        }
        Ok(Self {
            table_id: proto.table_id,
            path: TablePath::new(proto.database, proto.name),
            schemas,
            primary_key: proto.primary_key,
            partition_keys: proto.partition_keys,
            bucket_key: proto.bucket_key,
            bucket_num: proto.bucket_num.max(1),
            log_ttl: proto.log_ttl_ms.map(Duration::from_millis),
            lake_enabled: proto.lake_enabled,
            lake_freshness: Duration::from_millis(proto.lake_freshness_ms),
        })
    }
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

impl AddColumn {
    /// The request for adding `field` to `table`.
    pub fn new(table: &TablePath, field: Field) -> Self {
        Self {
            table: table.to_string(),
            field: encode_schema(&Schema::new(vec![field])),
        }
    }

    /// The field to add.
    pub fn field(&self) -> Result<Field> {
        let schema = decode_schema(&self.field)?;
        match schema.fields().as_ref() {
            [field] => Ok(field.as_ref().clone()),
            _ => Err(CoreError::InvalidRequest(
                "add_column carries exactly one field".into(),
            )),
        }
    }
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
}

/// The answer of `list_buckets`: every bucket of every partition created so far.
#[derive(Clone, PartialEq, Message)]
pub struct BucketList {
    /// The buckets, sorted by partition then bucket.
    #[prost(message, repeated, tag = "1")]
    pub buckets: Vec<BucketStatus>,
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

#[cfg(test)]
mod tests {
    use arrow::datatypes::DataType;

    use super::*;
    use crate::options::TableOptions;

    fn round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(message: M) {
        let bytes = message.encode_to_vec();
        assert_eq!(decode::<M>("test", &bytes).unwrap(), message);
    }

    fn bucket() -> BucketId {
        BucketId {
            table: "db.t".into(),
            partition: Some("dt=2024-01-01".into()),
            bucket: 3,
        }
    }

    #[test]
    fn tickets_round_trip() {
        round_trip(ReadTicket {
            read: Some(read_ticket::Read::Scan(ScanRequest {
                bucket: Some(bucket()),
                offset: 42,
                max_bytes: 1 << 20,
                columns: vec![2, 0],
            })),
        });
        round_trip(TailRequest {
            bucket: Some(bucket()),
            offset: 7,
            columns: vec![],
            max_wait_ms: 500,
            min_bytes: 1024,
            max_bytes: 0,
        });
        round_trip(WriteHeader {
            bucket: Some(BucketId::new(&TablePath::new("a", "b"), 0)),
            delete: true,
        });
        round_trip(ReadTicket {
            read: Some(read_ticket::Read::Snapshot(SnapshotRequest {
                bucket: Some(bucket()),
                columns: vec![1],
                batch_rows: 1024,
            })),
        });
        round_trip(ReadTicket {
            read: Some(read_ticket::Read::LimitScan(LimitScanRequest {
                bucket: Some(bucket()),
                limit: 10,
                columns: vec![],
            })),
        });
        round_trip(SnapshotBatch { log_offset: 99 });
        round_trip(ReadTicket {
            read: Some(read_ticket::Read::Union(UnionRequest {
                bucket: Some(bucket()),
                columns: vec![0],
                filters: vec![ColumnFilter::new(
                    "id",
                    crate::filter::FilterOp::Gt,
                    Some("3"),
                )],
            })),
        });
        round_trip(ReadTicket {
            read: Some(read_ticket::Read::Lake(LakeRequest {
                table: "db.t".into(),
                partition: Some("dt=1".into()),
                snapshot_id: Some(77),
                columns: vec![],
                filters: vec![],
            })),
        });
        round_trip(UnionPlan {
            snapshot_id: Some(5),
            lake_log_end_offset: 10,
            log_from: 10,
            log_to: 20,
            lake_files: 2,
        });
        round_trip(TierReply {
            snapshot_id: None,
            rows: 0,
            files: 0,
            repaired: true,
            deleted_rows: 3,
            delete_files: 1,
        });
        round_trip(UnionSplit {
            plan: Some(UnionPlan {
                snapshot_id: Some(5),
                lake_log_end_offset: 10,
                log_from: 10,
                log_to: 20,
                lake_files: 1,
            }),
            files: vec![LakeFileRef {
                path: "s3://w/t/data/bucket=0/a.parquet".into(),
                size: 100,
                record_count: Some(7),
                deletes: vec![LakeDeleteRef {
                    path: "s3://w/t/data/bucket=0/d.parquet".into(),
                    size: 10,
                    equality_columns: vec!["id".into()],
                }],
            }],
        });
        round_trip(TableChangesRequest {
            table: "db.t".into(),
            from_snapshot_id: 3,
            to_snapshot_id: 5,
        });
        round_trip(TableChangesPlan {
            from_snapshot_id: 3,
            to_snapshot_id: 5,
            snapshots: vec![LakeSnapshotChanges {
                snapshot_id: 5,
                operation: "overwrite".into(),
                data_files: vec![LakeFileRef {
                    path: "s3://w/t/data/bucket=0/b.parquet".into(),
                    size: 50,
                    record_count: Some(2),
                    deletes: vec![],
                }],
                delete_files: vec![LakeDeleteRef {
                    path: "s3://w/t/data/bucket=0/p.parquet".into(),
                    size: 10,
                    equality_columns: vec![],
                }],
                removed_files: 0,
                sequence_number: 4,
            }],
        });
        round_trip(CompactReply {
            snapshot_id: Some(9),
            buckets: 2,
            files_removed: 7,
            files_written: 2,
            rows: 100,
        });
        round_trip(Lookup {
            bucket: Some(bucket()),
            keys: vec![1, 2, 3],
            columns: vec![0],
        });
        round_trip(PrefixLookup {
            bucket: Some(bucket()),
            prefixes: vec![4],
            columns: vec![],
        });
        round_trip(LookupReply {
            rows: vec![9],
            key_indices: vec![0, 0, 2],
        });
        for spec in [
            list_offsets::Spec::Earliest(true),
            list_offsets::Spec::Latest(true),
            list_offsets::Spec::Timestamp(1_700_000_000_000),
        ] {
            round_trip(ListOffsets {
                bucket: Some(bucket()),
                spec: Some(spec),
            });
        }
    }

    #[test]
    fn batch_metadata_round_trips() {
        round_trip(ScanBatch {
            base_offset: 100,
            last_offset: 199,
            commit_timestamp: 1_700_000_000_123,
            schema_id: 2,
            changes: Some(vec![0, 1, 2, 3]),
            high_watermark: 200,
        });
        round_trip(ScanBatch {
            changes: None,
            ..Default::default()
        });
        round_trip(TailEnd {
            next_offset: 5,
            high_watermark: 5,
        });
        round_trip(AppendAck {
            base_offset: 0,
            last_offset: 9,
            high_watermark: 10,
        });
    }

    #[test]
    fn descriptor_round_trips_through_proto() {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new(
                "ts",
                DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
        ]);
        let options = TableOptions {
            bucket_num: 8,
            log_ttl: Some(Duration::from_secs(3600)),
            ..TableOptions::default()
        };
        let table = TableDescriptor::new(
            TablePath::new("db", "t"),
            schema,
            vec!["id".into()],
            vec![],
            options,
        )
        .unwrap()
        .with_added_column(Field::new("v", DataType::Utf8, true))
        .unwrap();
        let proto = TableDescriptorProto::from(&table);
        round_trip(proto.clone());
        assert_eq!(TableDescriptor::try_from(proto).unwrap(), table);
    }

    #[test]
    fn add_column_carries_one_field() {
        let request = AddColumn::new(
            &TablePath::new("db", "t"),
            Field::new("x", DataType::Int32, true),
        );
        assert_eq!(request.field().unwrap().name(), "x");
        let bad = AddColumn {
            table: "db.t".into(),
            field: vec![1, 2, 3],
        };
        assert!(bad.field().is_err());
    }

    #[test]
    fn batches_round_trip_as_ipc_streams() {
        let batch = RecordBatch::try_from_iter(vec![(
            "a",
            Arc::new(arrow::array::Int32Array::from(vec![1, 2])) as arrow::array::ArrayRef,
        )])
        .unwrap();
        assert_eq!(
            decode_batch("keys", &encode_batch(&batch).unwrap()).unwrap(),
            batch
        );
        let err = decode_batch("keys", &[1, 2, 3]).unwrap_err();
        assert!(err.to_string().contains("malformed keys"), "{err}");
    }

    #[test]
    fn malformed_bytes_name_the_message() {
        let err = decode::<ReadTicket>("ticket", &[0xff, 0xff, 0xff]).unwrap_err();
        assert!(err.to_string().starts_with("malformed ticket"), "{err}");
    }
}
