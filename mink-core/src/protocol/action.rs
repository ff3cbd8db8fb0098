//! Names of the Flight actions and the messages they take and return.

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
/// [`super::ListNodes`] -> [`super::NodeList`]: a cluster's members and the nodes its
/// buckets are assigned to.
pub const LIST_NODES: &str = "list_nodes";
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
/// [`super::TableRef`] -> [`super::ExpireSnapshotsReply`]: expires the lake snapshots
/// the table's retention no longer keeps and deletes the files only they referenced.
pub const EXPIRE_SNAPSHOTS: &str = "expire_snapshots";
/// [`super::RemoveOrphanFiles`] -> [`super::RemoveOrphanFilesReply`]: deletes the files
/// under a table's lake location that nothing references.
pub const REMOVE_ORPHAN_FILES: &str = "remove_orphan_files";
/// [`super::TableRef`] -> [`super::RewriteManifestsReply`]: merges the manifests of a
/// table's current lake snapshot in one `replace` snapshot.
pub const REWRITE_MANIFESTS: &str = "rewrite_manifests";
/// [`super::TableRef`] -> [`super::LakeTableStats`]: what a table's lake holds.
pub const LAKE_TABLE_STATS: &str = "lake_table_stats";
/// [`super::UnionRequest`] -> [`super::UnionSplit`]: a bucket's Union plan and the
/// lake files it covers, for an engine that reads the lake and the tail itself.
pub const PLAN_UNION: &str = "plan_union";
/// [`super::TableUnionRequest`] -> [`super::TableUnionSplits`]: every bucket's Union plan
/// and lake files, planned at once from one recorded lake snapshot (one read of the lake
/// table's manifests for the whole table).
pub const PLAN_TABLE_UNION: &str = "plan_table_union";
/// [`super::TableRef`] -> [`super::LakeSnapshotList`]: the lake snapshots mink
/// recorded for a table, oldest first.
pub const LIST_LAKE_SNAPSHOTS: &str = "list_lake_snapshots";
/// [`super::TableChangesRequest`] -> [`super::TableChangesPlan`]: what the lake
/// snapshots between two snapshots of a table changed, and the files to read it from,
/// for an engine that reads the changed rows itself.
pub const PLAN_TABLE_CHANGES: &str = "plan_table_changes";
