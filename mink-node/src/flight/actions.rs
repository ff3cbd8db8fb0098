//! Flight actions: table admin, offsets and key lookups.

use std::time::Duration;

use arrow::array::RecordBatch;
use arrow_flight::Action;
use mink_core::protocol::{
    AddColumn, BucketId, CompactReply, CreateTable, DropTable, ExpireSnapshotsReply,
    LakeSnapshotList, LakeTableStats, ListNodes, ListOffsets, ListTables, Lookup, LookupReply,
    NodeList, OffsetReply, PrefixLookup, RemoveOrphanFiles, RemoveOrphanFilesReply,
    RewriteManifestsReply, TableChangesRequest, TableDescriptorProto, TableList, TableRef,
    TableUnionRequest, TableUnionSplits, TierReply, UnionRequest, UnionSplit, action, decode,
    decode_batch, encode_batch,
};
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::upkeep::DEFAULT_ORPHAN_GRACE;
use prost::Message;

use super::{MinkFlightService, limits, projection, required_bucket};
use crate::error::NodeError;
use crate::node::union::PlannedUnion;
use crate::tiering::{
    compact_table, expire_table_snapshots, lake_table_stats, remove_table_orphan_files,
    rewrite_table_manifests, tier_table,
};

impl MinkFlightService {
    /// Runs one action and returns its result body.
    pub(super) async fn run_action(&self, action: &Action) -> Result<Vec<u8>, NodeError> {
        let body = &action.body;
        let node = &self.node;
        let describe = |table: &TableDescriptor| TableDescriptorProto::from(table).encode_to_vec();
        Ok(match action.r#type.as_str() {
            action::CREATE_TABLE => {
                let request: CreateTable = decode("create_table", body)?;
                let proto = request.table.ok_or_else(|| {
                    NodeError::InvalidArgument("create_table carries no table".into())
                })?;
                let created = node
                    .create_table(TableDescriptor::try_from(proto)?, request.if_not_exists)
                    .await?;
                describe(&created)
            }
            action::DROP_TABLE => {
                let request: DropTable = decode("drop_table", body)?;
                let path = TablePath::parse(&request.table)?;
                node.drop_table(&path, request.if_exists, request.table_id)
                    .await?;
                Vec::new()
            }
            action::LIST_TABLES => {
                let request: ListTables = decode("list_tables", body)?;
                let tables = node.list_tables(request.database.as_deref());
                TableList {
                    tables: tables.iter().map(ToString::to_string).collect(),
                }
                .encode_to_vec()
            }
            action::DESCRIBE_TABLE => {
                let request: TableRef = decode("describe_table", body)?;
                describe(&*node.describe(&TablePath::parse(&request.table)?)?)
            }
            action::ADD_COLUMN => {
                let request: AddColumn = decode("add_column", body)?;
                describe(
                    &node
                        .add_column(&TablePath::parse(&request.table)?, request.field()?)
                        .await?,
                )
            }
            action::LIST_BUCKETS => {
                let request: TableRef = decode("list_buckets", body)?;
                node.list_led_buckets(&TablePath::parse(&request.table)?)?
                    .encode_to_vec()
            }
            action::LIST_NODES => {
                let _: ListNodes = decode("list_nodes", body)?;
                NodeList {
                    nodes: node.list_nodes().await?,
                }
                .encode_to_vec()
            }
            action::LIST_OFFSETS => {
                let request: ListOffsets = decode("list_offsets", body)?;
                let spec = request.spec.ok_or_else(|| {
                    NodeError::InvalidArgument(
                        "list_offsets needs Earliest, Latest or Timestamp".into(),
                    )
                })?;
                let bucket = required_bucket(request.bucket, "list_offsets")?;
                OffsetReply {
                    offset: node.list_offsets(&bucket, &spec)?,
                }
                .encode_to_vec()
            }
            action::TIER_TABLE => {
                let request: TableRef = decode("tier_table", body)?;
                let report = tier_table(node, &TablePath::parse(&request.table)?).await?;
                TierReply {
                    snapshot_id: report.snapshot_id,
                    rows: report.rows,
                    files: report.files,
                    repaired: report.repaired,
                    deleted_rows: report.deleted_rows,
                    delete_files: report.delete_files,
                }
                .encode_to_vec()
            }
            action::COMPACT_TABLE => {
                let request: TableRef = decode("compact_table", body)?;
                let report = compact_table(node, &TablePath::parse(&request.table)?).await?;
                CompactReply {
                    snapshot_id: report.snapshot_id,
                    buckets: report.buckets,
                    files_removed: report.files_removed,
                    files_written: report.files_written,
                    rows: report.rows,
                }
                .encode_to_vec()
            }
            action::EXPIRE_SNAPSHOTS => {
                let request: TableRef = decode("expire_snapshots", body)?;
                let path = TablePath::parse(&request.table)?;
                let report = expire_table_snapshots(node, &path).await?;
                ExpireSnapshotsReply {
                    expired_snapshots: report.expired,
                    data_files_deleted: report.data_files_deleted,
                    delete_files_deleted: report.delete_files_deleted,
                    manifests_deleted: report.manifests_deleted,
                    manifest_lists_deleted: report.manifest_lists_deleted,
                    metadata_files_deleted: report.metadata_files_deleted,
                }
                .encode_to_vec()
            }
            action::REMOVE_ORPHAN_FILES => {
                let request: RemoveOrphanFiles = decode("remove_orphan_files", body)?;
                let grace = request
                    .grace_ms
                    .map_or(DEFAULT_ORPHAN_GRACE, Duration::from_millis);
                let path = TablePath::parse(&request.table)?;
                let report = remove_table_orphan_files(node, &path, grace).await?;
                RemoveOrphanFilesReply {
                    removed: report.removed,
                    bytes: report.bytes,
                }
                .encode_to_vec()
            }
            action::REWRITE_MANIFESTS => {
                let request: TableRef = decode("rewrite_manifests", body)?;
                let report =
                    rewrite_table_manifests(node, &TablePath::parse(&request.table)?).await?;
                RewriteManifestsReply {
                    snapshot_id: report.snapshot_id,
                    manifests_replaced: report.manifests_replaced,
                    manifests_created: report.manifests_created,
                }
                .encode_to_vec()
            }
            action::LAKE_TABLE_STATS => {
                let request: TableRef = decode("lake_table_stats", body)?;
                let stats = lake_table_stats(node, &TablePath::parse(&request.table)?).await?;
                match stats {
                    Some(stats) => LakeTableStats {
                        exists: true,
                        snapshots: stats.snapshots,
                        manifests: stats.manifests,
                        data_files: stats.data_files,
                        delete_files: stats.delete_files,
                        bytes: stats.bytes,
                        oldest_snapshot_at: stats.oldest_snapshot_at,
                    },
                    None => LakeTableStats::default(),
                }
                .encode_to_vec()
            }
            action::LIST_LAKE_SNAPSHOTS => {
                let request: TableRef = decode("list_lake_snapshots", body)?;
                LakeSnapshotList {
                    snapshots: node.lake_snapshots(&TablePath::parse(&request.table)?)?,
                }
                .encode_to_vec()
            }
            action::PLAN_UNION => {
                let request: UnionRequest = decode("plan_union", body)?;
                let bucket = required_bucket(request.bucket, "plan_union")?;
                union_split(node.plan_union(&bucket, &request.filters).await?).encode_to_vec()
            }
            action::PLAN_TABLE_UNION => {
                let request: TableUnionRequest = decode("plan_table_union", body)?;
                let (planned, elsewhere) = node
                    .plan_table_union(&TablePath::parse(&request.table)?, &request.filters)
                    .await?;
                TableUnionSplits {
                    splits: planned.into_iter().map(union_split).collect(),
                    elsewhere,
                }
                .encode_to_vec()
            }
            action::PLAN_TABLE_CHANGES => {
                let request: TableChangesRequest = decode("plan_table_changes", body)?;
                node.plan_changes(
                    &TablePath::parse(&request.table)?,
                    request.from_snapshot_id,
                    request.to_snapshot_id,
                )
                .await?
                .to_wire()
                .encode_to_vec()
            }
            action::LOOKUP => {
                let request: Lookup = decode("lookup", body)?;
                let bucket = required_bucket(request.bucket, "lookup")?;
                let keys = decode_client_batch("lookup keys", &request.keys)?;
                self.key_reply(&bucket, keys, false, &request.columns)
                    .await?
            }
            action::PREFIX_LOOKUP => {
                let request: PrefixLookup = decode("prefix_lookup", body)?;
                let bucket = required_bucket(request.bucket, "prefix_lookup")?;
                let prefixes = decode_client_batch("lookup prefixes", &request.prefixes)?;
                self.key_reply(&bucket, prefixes, true, &request.columns)
                    .await?
            }
            other => {
                return Err(NodeError::InvalidArgument(format!(
                    "unknown action '{other}'"
                )));
            }
        })
    }

    /// The encoded [`LookupReply`] of a lookup or prefix lookup of at most
    /// [`limits::MAX_LOOKUP_KEYS`] keys.
    async fn key_reply(
        &self,
        bucket: &BucketId,
        keys: RecordBatch,
        prefix: bool,
        columns: &[u32],
    ) -> Result<Vec<u8>, NodeError> {
        let what = if prefix { "prefix_lookup" } else { "lookup" };
        limits::check_lookup_keys(what, keys.num_rows())?;
        let table = self.node.describe(&TablePath::parse(&bucket.table)?)?;
        let projection = projection(&table, columns)?;
        let found = self.node.lookup(bucket, keys, prefix).await?;
        let reply = LookupReply {
            rows: encode_batch(&found.rows.project(&projection)?)?,
            key_indices: found.key_indices,
        }
        .encode_to_vec();
        let metrics = mink_metrics::metrics();
        metrics.reads.with_label_values(&[what]).inc();
        (metrics.read_bytes.with_label_values(&[what])).inc_by(reply.len() as u64);
        Ok(reply)
    }
}

/// A bucket's planned Union read as it travels: its bucket, plan and lake files.
fn union_split(planned: PlannedUnion) -> UnionSplit {
    UnionSplit {
        files: planned.split.to_wire(),
        plan: Some(planned.plan),
        bucket: Some(planned.id),
    }
}

/// Decodes a client's IPC stream of one batch, refusing compressed IPC before the decoder
/// runs (it would allocate whatever uncompressed length the client declared).
fn decode_client_batch(what: &str, bytes: &[u8]) -> Result<RecordBatch, NodeError> {
    mink_core::ipc_guard::check_stream(bytes)?;
    Ok(decode_batch(what, bytes)?)
}

/// The actions `list_actions` describes.
pub(super) const ACTIONS: [(&str, &str); 18] = [
    (
        action::TIER_TABLE,
        "Run a tiering round of a table now (TableRef -> TierReply)",
    ),
    (
        action::CREATE_TABLE,
        "Create a table (CreateTable -> TableDescriptorProto)",
    ),
    (action::DROP_TABLE, "Drop a table and its log (DropTable)"),
    (action::LIST_TABLES, "List tables (ListTables -> TableList)"),
    (
        action::DESCRIBE_TABLE,
        "Describe a table (TableRef -> TableDescriptorProto)",
    ),
    (
        action::ADD_COLUMN,
        "Add a nullable column (AddColumn -> TableDescriptorProto)",
    ),
    (
        action::LIST_BUCKETS,
        "Buckets and their offsets (TableRef -> BucketList)",
    ),
    (
        action::LIST_NODES,
        "The cluster's nodes (ListNodes -> NodeList)",
    ),
    (
        action::LIST_OFFSETS,
        "Earliest, latest or timestamp offset (ListOffsets -> OffsetReply)",
    ),
    (
        action::LOOKUP,
        "Rows by primary key (Lookup -> LookupReply)",
    ),
    (
        action::PREFIX_LOOKUP,
        "Rows by key prefix (PrefixLookup -> LookupReply)",
    ),
    (
        action::PLAN_UNION,
        "A bucket's Union plan and lake files (UnionRequest -> UnionSplit)",
    ),
    (
        action::EXPIRE_SNAPSHOTS,
        "Expire the lake snapshots the table's retention no longer keeps (TableRef -> ExpireSnapshotsReply)",
    ),
    (
        action::REMOVE_ORPHAN_FILES,
        "Delete unreferenced files of a table's lake (RemoveOrphanFiles -> RemoveOrphanFilesReply)",
    ),
    (
        action::REWRITE_MANIFESTS,
        "Merge the manifests of a table's lake (TableRef -> RewriteManifestsReply)",
    ),
    (
        action::LAKE_TABLE_STATS,
        "What a table's lake holds (TableRef -> LakeTableStats)",
    ),
    (
        action::PLAN_TABLE_UNION,
        "Every bucket's Union plan and lake files, planned at once \
         (TableUnionRequest -> TableUnionSplits)",
    ),
    (
        action::PLAN_TABLE_CHANGES,
        "The lake files changed between two lake snapshots \
         (TableChangesRequest -> TableChangesPlan)",
    ),
];
