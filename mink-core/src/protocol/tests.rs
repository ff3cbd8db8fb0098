//! Round trips of the messages through prost.

use prost::Message;

use super::*;
use crate::filter::ColumnFilter;
use crate::table::TablePath;

// Used by the .proto check (tests/proto.rs) only.
use prost_reflect as _;
use protox as _;

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
        writer: Some(IdempotentWriter {
            producer_id: 1 << 62,
            first_sequence: 3,
            since: 40,
        }),
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
        replaced_rows_located: false,
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
            replaced_rows_located: true,
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
            replaced_rows: vec![3, 9],
        }],
        bucket: Some(bucket()),
    });
    round_trip(TableUnionRequest {
        table: "db.t".into(),
        filters: vec![ColumnFilter::new(
            "id",
            crate::filter::FilterOp::Gt,
            Some("3"),
        )],
    });
    round_trip(TableUnionSplits {
        splits: vec![UnionSplit::default(), UnionSplit::default()],
        elsewhere: vec![NotLeader::default()],
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
                replaced_rows: vec![],
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
        duplicate: false,
    });
}

#[test]
fn malformed_bytes_name_the_message() {
    let err = decode::<ReadTicket>("ticket", &[0xff, 0xff, 0xff]).unwrap_err();
    assert!(err.to_string().starts_with("malformed ticket"), "{err}");
}
