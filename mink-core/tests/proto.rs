//! The prost messages of `mink_core::protocol` encode exactly as `node.proto` says.
//!
//! The .proto is compiled with protox (pure Rust, no `protoc`). For every message a Rust
//! value with every field set (each oneof variant in a case of its own) is encoded with
//! prost and decoded as a [`DynamicMessage`] of the descriptor, which must show:
//!
//! - no unknown fields, at any depth: the Rust struct has no field the .proto lacks;
//! - every field of the descriptor present: the .proto has no field the Rust struct lacks;
//! - each value where the Rust `Debug` output has it, under the same field name (a field
//!   renamed, or two numbers swapped, shows here);
//! - values of the declared type (see [`value_problem`]): the test values are chosen so
//!   that a mismatch of signedness, width, bool or bytes/string changes them;
//! - the same bytes when re-encoded (same wire types, same packing).
//!
//! The set of messages in the .proto must be the set of cases here, and the values of its
//! enum those of the Rust enum, so a message added on one side only fails.

#![expect(
    unused_crate_dependencies,
    reason = "an integration test crate sees every dependency of the library"
)]

use std::collections::{BTreeMap, BTreeSet};

use mink_core::filter::{ColumnFilter, FilterOp};
use mink_core::protocol::*;
use prost::Message;
use prost_reflect::{
    DescriptorPool, DynamicMessage, EnumDescriptor, FieldDescriptor, Kind, ReflectMessage, Value,
};

const PROTO: &str = "mink/node/v1/node.proto";
const PACKAGE: &str = "mink.node.v1";

fn pool() -> DescriptorPool {
    let mut compiler = protox::Compiler::new([concat!(env!("CARGO_MANIFEST_DIR"), "/proto")])
        .expect("the proto include directory");
    compiler
        .open_file(PROTO)
        .unwrap_or_else(|e| panic!("{PROTO} does not compile: {e:?}"));
    compiler.descriptor_pool()
}

/// One Rust value of a message, encoded.
struct Case {
    /// The message's name in the .proto.
    message: &'static str,
    bytes: Vec<u8>,
    /// The value's `Debug` output, where each field's value is looked up by name.
    debug: String,
}

fn case<M: Message + std::fmt::Debug>(message: &'static str, value: M) -> Case {
    Case {
        message,
        bytes: value.encode_to_vec(),
        debug: format!("{value:?}"),
    }
}

// Every field is set, with values the type checks of `value_problem` can tell apart:
// signed integers are negative and 64-bit ones outside the 32-bit range, unsigned
// integers are at least 2 and 64-bit ones above `u32::MAX`, bytes are not UTF-8. Values
// differ between the fields of a message, so a swap of two field numbers shows.

fn bucket() -> BucketId {
    BucketId {
        table: "db.t".into(),
        partition: Some("dt=2024-01-01".into()),
        bucket: 3,
    }
}

fn bucket_store() -> BucketStore {
    BucketStore {
        stream_objects: 10_000_000_060,
        stream_bytes: 10_000_000_061,
        wal_bytes: 10_000_000_062,
        kv_checkpoint_offset: Some(-10_000_000_063),
        kv_checkpoint_runs: 10_000_000_064,
        kv_checkpoint_bytes: 10_000_000_065,
        kv_checkpoint_written_at_ms: Some(-10_000_000_066),
        kv_pending_bytes: 10_000_000_067,
    }
}

fn filter() -> ColumnFilter {
    ColumnFilter::new("id", FilterOp::Gt, Some("3"))
}

fn scan() -> ScanRequest {
    ScanRequest {
        bucket: Some(bucket()),
        offset: -10_000_000_001,
        max_bytes: 10_000_000_002,
        columns: vec![2, 7],
    }
}

fn snapshot() -> SnapshotRequest {
    SnapshotRequest {
        bucket: Some(bucket()),
        columns: vec![4],
        batch_rows: 1024,
    }
}

fn limit_scan() -> LimitScanRequest {
    LimitScanRequest {
        bucket: Some(bucket()),
        limit: 10,
        columns: vec![5, 6],
    }
}

fn union() -> UnionRequest {
    UnionRequest {
        bucket: Some(bucket()),
        columns: vec![8],
        filters: vec![filter()],
    }
}

fn lake() -> LakeRequest {
    LakeRequest {
        table: "db.lake".into(),
        partition: Some("dt=1".into()),
        snapshot_id: Some(-10_000_000_003),
        columns: vec![9],
        filters: vec![filter()],
    }
}

fn live_range() -> LiveRangeRequest {
    LiveRangeRequest {
        bucket: Some(bucket()),
        from: -10_000_000_030,
        to: -10_000_000_031,
        columns: vec![18, 19],
    }
}

fn union_plan() -> UnionPlan {
    UnionPlan {
        snapshot_id: Some(-10_000_000_004),
        lake_log_end_offset: -10_000_000_005,
        log_from: -10_000_000_006,
        log_to: -10_000_000_007,
        lake_files: 10_000_000_008,
        replaced_rows_located: true,
    }
}

fn union_split() -> UnionSplit {
    UnionSplit {
        plan: Some(union_plan()),
        files: vec![file_ref()],
        bucket: Some(bucket()),
    }
}

fn delete_ref() -> LakeDeleteRef {
    LakeDeleteRef {
        path: "s3://w/t/data/bucket=0/d.parquet".into(),
        size: 10_000_000_009,
        equality_columns: vec!["id".into()],
    }
}

fn file_ref() -> LakeFileRef {
    LakeFileRef {
        path: "s3://w/t/data/bucket=0/a.parquet".into(),
        size: 10_000_000_010,
        record_count: Some(10_000_000_011),
        deletes: vec![delete_ref()],
        replaced_rows: vec![10_000_000_060, 10_000_000_061],
    }
}

fn snapshot_changes() -> LakeSnapshotChanges {
    LakeSnapshotChanges {
        snapshot_id: -10_000_000_012,
        operation: "overwrite".into(),
        data_files: vec![file_ref()],
        delete_files: vec![delete_ref()],
        removed_files: 10_000_000_013,
        sequence_number: -10_000_000_014,
    }
}

fn seam() -> BucketSeam {
    BucketSeam {
        partition: Some("dt=2".into()),
        bucket: 11,
        log_end_offset: -10_000_000_015,
    }
}

fn snapshot_info() -> LakeSnapshotInfo {
    LakeSnapshotInfo {
        snapshot_id: -10_000_000_016,
        committed_at: -10_000_000_017,
        buckets: vec![seam()],
    }
}

fn schema_version() -> SchemaVersionProto {
    SchemaVersionProto {
        schema_id: 12,
        arrow_schema: vec![0xff, 0x01],
    }
}

fn lake_property() -> LakeProperty {
    LakeProperty {
        key: "history.expire.min-snapshots-to-keep".into(),
        value: "3".into(),
    }
}

fn descriptor() -> TableDescriptorProto {
    TableDescriptorProto {
        table_id: 10_000_000_018,
        database: "db".into(),
        name: "t".into(),
        schemas: vec![schema_version()],
        primary_key: vec!["pk".into()],
        partition_keys: vec!["dt".into()],
        bucket_key: vec!["bk".into()],
        bucket_num: 13,
        log_ttl_ms: Some(10_000_000_019),
        lake_enabled: true,
        lake_freshness_ms: 10_000_000_020,
        lake_properties: vec![lake_property()],
    }
}

fn cases() -> Vec<Case> {
    use list_offsets::Spec;
    use read_ticket::Read;

    let ticket = |read| ReadTicket { read: Some(read) };
    let list_offsets = |spec| ListOffsets {
        bucket: Some(bucket()),
        spec: Some(spec),
    };
    vec![
        case("BucketId", bucket()),
        case("ReadTicket", ticket(Read::Scan(scan()))),
        case("ReadTicket", ticket(Read::Snapshot(snapshot()))),
        case("ReadTicket", ticket(Read::LimitScan(limit_scan()))),
        case("ReadTicket", ticket(Read::Union(union()))),
        case("ReadTicket", ticket(Read::Lake(lake()))),
        case("ReadTicket", ticket(Read::LiveRange(live_range()))),
        case("LiveRangeRequest", live_range()),
        case("ScanRequest", scan()),
        case("SnapshotRequest", snapshot()),
        case("LimitScanRequest", limit_scan()),
        case(
            "SnapshotBatch",
            SnapshotBatch {
                log_offset: -10_000_000_021,
            },
        ),
        case(
            "Lookup",
            Lookup {
                bucket: Some(bucket()),
                keys: vec![0xff, 0x02],
                columns: vec![14],
            },
        ),
        case(
            "PrefixLookup",
            PrefixLookup {
                bucket: Some(bucket()),
                prefixes: vec![0xff, 0x03],
                columns: vec![15],
            },
        ),
        case(
            "LookupReply",
            LookupReply {
                rows: vec![0xff, 0x04],
                key_indices: vec![16, 17],
            },
        ),
        case("UnionRequest", union()),
        case("UnionPlan", union_plan()),
        case("UnionSplit", union_split()),
        case(
            "TableUnionRequest",
            TableUnionRequest {
                table: "db.union".into(),
                filters: vec![filter()],
            },
        ),
        case(
            "TableUnionSplits",
            TableUnionSplits {
                splits: vec![union_split(), union_split()],
                elsewhere: vec![not_leader()],
            },
        ),
        case("LakeFileRef", file_ref()),
        case("LakeDeleteRef", delete_ref()),
        case(
            "TableChangesRequest",
            TableChangesRequest {
                table: "db.changes".into(),
                from_snapshot_id: -10_000_000_022,
                to_snapshot_id: -10_000_000_023,
            },
        ),
        case(
            "TableChangesPlan",
            TableChangesPlan {
                from_snapshot_id: -10_000_000_024,
                to_snapshot_id: -10_000_000_025,
                snapshots: vec![snapshot_changes()],
            },
        ),
        case("LakeSnapshotChanges", snapshot_changes()),
        case("LakeRequest", lake()),
        case("ColumnFilter", filter()),
        case(
            "TierReply",
            TierReply {
                snapshot_id: Some(-10_000_000_026),
                rows: 10_000_000_027,
                files: 10_000_000_028,
                repaired: true,
                deleted_rows: 10_000_000_029,
                delete_files: 10_000_000_030,
            },
        ),
        case(
            "LakeSnapshotList",
            LakeSnapshotList {
                snapshots: vec![snapshot_info()],
            },
        ),
        case("LakeSnapshotInfo", snapshot_info()),
        case("BucketSeam", seam()),
        case(
            "CompactReply",
            CompactReply {
                snapshot_id: Some(-10_000_000_031),
                buckets: 10_000_000_032,
                files_removed: 10_000_000_033,
                files_written: 10_000_000_034,
                rows: 10_000_000_035,
            },
        ),
        case("LakeProperty", lake_property()),
        case(
            "ExpireSnapshotsReply",
            ExpireSnapshotsReply {
                expired_snapshots: vec![-10_000_000_101],
                data_files_deleted: 10_000_000_102,
                delete_files_deleted: 10_000_000_103,
                manifests_deleted: 10_000_000_104,
                manifest_lists_deleted: 10_000_000_105,
                metadata_files_deleted: 10_000_000_106,
            },
        ),
        case(
            "RemoveOrphanFiles",
            RemoveOrphanFiles {
                table: "db.orphans".into(),
                grace_ms: Some(10_000_000_107),
            },
        ),
        case(
            "RemoveOrphanFilesReply",
            RemoveOrphanFilesReply {
                removed: vec!["/w/db/t/data/x.parquet".into()],
                bytes: 10_000_000_108,
            },
        ),
        case(
            "RewriteManifestsReply",
            RewriteManifestsReply {
                snapshot_id: Some(-10_000_000_109),
                manifests_replaced: 10_000_000_110,
                manifests_created: 10_000_000_111,
            },
        ),
        case(
            "LakeTableStats",
            LakeTableStats {
                exists: true,
                snapshots: 10_000_000_112,
                manifests: 10_000_000_113,
                data_files: 10_000_000_114,
                delete_files: 10_000_000_115,
                bytes: 10_000_000_116,
                oldest_snapshot_at: Some(-10_000_000_117),
            },
        ),
        case(
            "TailRequest",
            TailRequest {
                bucket: Some(bucket()),
                offset: -10_000_000_036,
                columns: vec![18],
                max_wait_ms: 10_000_000_037,
                min_bytes: 10_000_000_038,
                max_bytes: 10_000_000_039,
            },
        ),
        case(
            "ScanBatch",
            ScanBatch {
                base_offset: -10_000_000_040,
                last_offset: -10_000_000_041,
                commit_timestamp: -10_000_000_042,
                schema_id: 19,
                changes: Some(vec![0xff, 0x05]),
                high_watermark: -10_000_000_043,
            },
        ),
        case(
            "TailEnd",
            TailEnd {
                next_offset: -10_000_000_044,
                high_watermark: -10_000_000_045,
            },
        ),
        case(
            "WriteHeader",
            WriteHeader {
                bucket: Some(bucket()),
                delete: true,
                writer: Some(IdempotentWriter {
                    producer_id: -10_000_000_045,
                    first_sequence: -7,
                    since: -10_000_000_044,
                }),
            },
        ),
        case(
            "IdempotentWriter",
            IdempotentWriter {
                producer_id: -10_000_000_050,
                first_sequence: -8,
                since: -10_000_000_049,
            },
        ),
        case(
            "AppendAck",
            AppendAck {
                base_offset: -10_000_000_046,
                last_offset: -10_000_000_047,
                high_watermark: -10_000_000_048,
                duplicate: true,
            },
        ),
        case("TableDescriptorProto", descriptor()),
        case("SchemaVersionProto", schema_version()),
        case(
            "CreateTable",
            CreateTable {
                table: Some(descriptor()),
                if_not_exists: true,
            },
        ),
        case(
            "DropTable",
            DropTable {
                table: "db.drop".into(),
                if_exists: true,
                table_id: Some(10_000_000_049),
            },
        ),
        case(
            "ListTables",
            ListTables {
                database: Some("db".into()),
            },
        ),
        case(
            "TableList",
            TableList {
                tables: vec!["db.a".into(), "db.b".into()],
            },
        ),
        case(
            "TableRef",
            TableRef {
                table: "db.ref".into(),
            },
        ),
        case(
            "AddColumn",
            AddColumn {
                table: "db.add".into(),
                field: vec![0xff, 0x06],
            },
        ),
        case(
            "BucketStatus",
            BucketStatus {
                bucket: Some(bucket()),
                log_start: -10_000_000_050,
                high_watermark: -10_000_000_051,
                lake_log_end_offset: -10_000_000_052,
                lake_snapshot_id: Some(-10_000_000_053),
                store: Some(bucket_store()),
                oldest_untiered_at_ms: Some(-10_000_000_058),
                leader_epoch: 10_000_000_059,
            },
        ),
        case("BucketStore", bucket_store()),
        case(
            "BucketList",
            BucketList {
                buckets: vec![BucketStatus {
                    bucket: Some(bucket()),
                    log_start: -10_000_000_054,
                    high_watermark: -10_000_000_055,
                    lake_log_end_offset: -10_000_000_056,
                    lake_snapshot_id: Some(-10_000_000_057),
                    store: Some(bucket_store()),
                    oldest_untiered_at_ms: Some(-10_000_000_063),
                    leader_epoch: 10_000_000_064,
                }],
                elsewhere: vec![not_leader()],
            },
        ),
        case("ListOffsets", list_offsets(Spec::Earliest(true))),
        case("ListOffsets", list_offsets(Spec::Latest(true))),
        case(
            "ListOffsets",
            list_offsets(Spec::Timestamp(-10_000_000_058)),
        ),
        case(
            "OffsetReply",
            OffsetReply {
                offset: -10_000_000_059,
            },
        ),
        case(
            "ErrorDetail",
            ErrorDetail {
                not_leader: Some(not_leader()),
            },
        ),
        case("NotLeader", not_leader()),
        case("ListNodes", ListNodes {}),
        case(
            "NodeList",
            NodeList {
                nodes: vec![node_info()],
            },
        ),
        case("NodeInfo", node_info()),
    ]
}

fn node_info() -> NodeInfo {
    NodeInfo {
        node_id: "n1".into(),
        address: Some("node.example:9123".into()),
        live: true,
        buckets: 10_000_061,
        max_epoch: 10_000_000_062,
    }
}

fn not_leader() -> NotLeader {
    NotLeader {
        bucket: Some(bucket()),
        leader: Some("leader.example:9400".into()),
        epoch: 10_000_000_060,
    }
}

#[test]
fn every_message_encodes_as_the_proto_says() {
    let pool = pool();
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    for case in cases() {
        let name = format!("{PACKAGE}.{}", case.message);
        let Some(descriptor) = pool.get_message_by_name(&name) else {
            problems.push(format!("{name}: not in {PROTO}"));
            continue;
        };
        let dynamic = match DynamicMessage::decode(descriptor, case.bytes.as_slice()) {
            Ok(dynamic) => dynamic,
            Err(e) => {
                problems.push(format!("{name}: does not decode: {e}"));
                continue;
            }
        };
        check(&dynamic, &case.debug, &mut seen, &mut problems);
        if dynamic.encode_to_vec() != case.bytes {
            problems.push(format!("{name}: re-encodes to other bytes"));
        }
    }
    let never_set: Vec<_> = pool
        .all_messages()
        .flat_map(|m| m.fields().collect::<Vec<_>>())
        .map(|f| f.full_name().to_string())
        .filter(|f| !seen.contains(f))
        .collect();
    if !never_set.is_empty() {
        problems.push(format!("fields no case sets: {never_set:?}"));
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn every_message_of_the_proto_has_a_case() {
    let in_proto: BTreeSet<String> = pool()
        .all_messages()
        .map(|m| m.full_name().to_string())
        .collect();
    let covered: BTreeSet<String> = cases()
        .iter()
        .map(|c| format!("{PACKAGE}.{}", c.message))
        .collect();
    assert_eq!(in_proto, covered);
}

#[test]
fn filter_op_has_the_values_of_the_proto_enum() {
    let pool = pool();
    let enums: Vec<_> = pool.all_enums().map(|e| e.name().to_string()).collect();
    assert_eq!(enums, ["FilterOp"], "an enum of the .proto without a check");
    let proto_enum = pool
        .get_enum_by_name(&format!("{PACKAGE}.FilterOp"))
        .expect("FilterOp");
    let in_proto: BTreeMap<i32, String> = proto_enum
        .values()
        .map(|v| (v.number(), rust_variant(&proto_enum, v.number())))
        .collect();
    let in_rust: BTreeMap<i32, String> = (-16..256)
        .filter_map(|n| FilterOp::try_from(n).ok().map(|op| (n, format!("{op:?}"))))
        .collect();
    assert_eq!(in_proto, in_rust);
}

/// Checks one decoded message and the messages inside it, recording the fields it sets.
fn check(
    message: &DynamicMessage,
    debug: &str,
    seen: &mut BTreeSet<String>,
    problems: &mut Vec<String>,
) {
    let descriptor = message.descriptor();
    for unknown in message.unknown_fields() {
        problems.push(format!(
            "{}: field number {} is not in {PROTO}",
            descriptor.full_name(),
            unknown.number()
        ));
    }
    for field in descriptor.fields() {
        // prost packs repeated numbers; prost-reflect re-encodes them packed even so.
        let options = field.field_descriptor_proto().options.as_ref();
        if options.and_then(|o| o.packed) == Some(false) {
            problems.push(format!("{}: prost packs it", field.full_name()));
        }
        if in_real_oneof(&field) {
            continue;
        }
        if !message.has_field(&field) {
            problems.push(format!(
                "{}: not set (missing in the Rust struct, or the case leaves it at its default)",
                field.full_name()
            ));
        }
    }
    for oneof in descriptor.oneofs().filter(|o| !o.is_synthetic()) {
        if !oneof.fields().any(|f| message.has_field(&f)) {
            problems.push(format!("{}: no variant set", oneof.full_name()));
        }
    }
    for (field, value) in message.fields() {
        seen.insert(field.full_name().to_string());
        if let Some(problem) = value_problem(value) {
            problems.push(format!("{}: {problem}", field.full_name()));
        }
        let fragment = rust_debug(&field, value);
        if !debug.contains(&fragment) {
            problems.push(format!(
                "{}: `{fragment}` is not in the Rust value {debug}",
                field.full_name()
            ));
        }
        let nested = match value {
            Value::Message(m) => vec![m],
            Value::List(items) => items
                .iter()
                .filter_map(|v| match v {
                    Value::Message(m) => Some(m),
                    _ => None,
                })
                .collect(),
            _ => vec![],
        };
        for m in nested {
            check(m, debug, seen, problems);
        }
    }
}

/// Whether a value breaks the convention of the test values, which shows that the .proto
/// declares another type than the Rust struct encodes: a `uint64` read from an `int64`
/// is huge, an `int64` read from a `uint64` positive, a 64-bit integer read from a 32-bit
/// one in the 32-bit range, a `uint32` read from a `bool` is 1, `bytes` read from a
/// `string` are UTF-8.
fn value_problem(value: &Value) -> Option<String> {
    let ok = match value {
        Value::I32(v) => *v < 0,
        Value::I64(v) => *v < i64::from(i32::MIN),
        Value::U32(v) => *v >= 2,
        Value::U64(v) => *v > u64::from(u32::MAX) && *v < 1 << 63,
        Value::Bytes(v) => std::str::from_utf8(v).is_err(),
        Value::List(items) => return items.iter().find_map(value_problem),
        Value::Bool(_)
        | Value::String(_)
        | Value::EnumNumber(_)
        | Value::Message(_)
        | Value::F32(_)
        | Value::F64(_)
        | Value::Map(_) => true,
    };
    (!ok).then(|| format!("{value:?} is not a value the Rust side would have sent"))
}

/// How prost's derived `Debug` shows the field holding `value`: `name: value`,
/// `name: Some(value)` for an optional field, `Variant(value)` for a oneof member. Of a
/// message only the start is shown (`name: Some(BucketId {`): its fields are checked
/// one by one.
fn rust_debug(field: &FieldDescriptor, value: &Value) -> String {
    let (text, close) = match (field.kind(), value) {
        (Kind::Message(m), Value::List(_)) => (format!("[{} {{", m.name()), false),
        (Kind::Message(m), _) => (format!("{} {{", m.name()), false),
        (Kind::Enum(e), Value::EnumNumber(n)) => (rust_variant(&e, *n), true),
        (_, value) => (scalar_debug(value), true),
    };
    let close = if close { ")" } else { "" };
    if in_real_oneof(field) {
        format!("{}({text}{close}", camel_case(field.name()))
    } else if field.supports_presence() && !field.is_list() {
        format!("{}: Some({text}{close}", field.name())
    } else {
        format!("{}: {text}", field.name())
    }
}

fn scalar_debug(value: &Value) -> String {
    match value {
        Value::Bool(v) => v.to_string(),
        Value::I32(v) => v.to_string(),
        Value::I64(v) => v.to_string(),
        Value::U32(v) => v.to_string(),
        Value::U64(v) => v.to_string(),
        Value::String(v) => format!("{v:?}"),
        Value::Bytes(v) => format!("{:?}", v.to_vec()),
        Value::List(items) => {
            let items: Vec<_> = items.iter().map(scalar_debug).collect();
            format!("[{}]", items.join(", "))
        }
        other => format!("{other:?}"),
    }
}

fn in_real_oneof(field: &FieldDescriptor) -> bool {
    field.containing_oneof().is_some_and(|o| !o.is_synthetic())
}

/// The Rust variant prost names an enum value: `FILTER_OP_NOT_EQ` of `FilterOp` is
/// `NotEq`.
fn rust_variant(proto_enum: &EnumDescriptor, number: i32) -> String {
    let Some(value) = proto_enum.get_value(number) else {
        return number.to_string();
    };
    let prefix = format!("{}_", screaming_snake_case(proto_enum.name()));
    camel_case(value.name().strip_prefix(&prefix).unwrap_or(value.name()))
}

fn camel_case(snake: &str) -> String {
    snake
        .split('_')
        .map(|word| {
            let word = word.to_ascii_lowercase();
            let mut chars = word.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

fn screaming_snake_case(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

#[test]
fn the_test_reads_names_as_prost_does() {
    assert_eq!(camel_case("limit_scan"), "LimitScan");
    assert_eq!(screaming_snake_case("FilterOp"), "FILTER_OP");
}
