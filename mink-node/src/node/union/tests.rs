//! Union plans and the log reads under them, on a real node over a temporary directory
//! (its embedded lake in it): a plan before any round and after one, a table's buckets
//! planned from one record, filters checked, buckets led elsewhere, the lake rows a
//! primary-key range replaces located, and the log range `[from, to)` read as planned.
//!
//! Tables are `db.<name> (id BIGINT, name TEXT)`; a log table's rows are written with
//! `id` = their offset, so a read's ids are the offsets it read.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use futures::TryStreamExt;
use mink_core::change::ChangeType;
use mink_core::filter::{ColumnFilter, FilterOp};
use mink_core::options::TableOptions;
use mink_core::protocol::{BucketId, NotLeader, UnionPlan};
use mink_core::table::{TableDescriptor, TablePath};
use mink_log::{LogBatch, LogStoreConfig};
use mink_scan::log_range::{LogRange, LogSource};

use super::{LocalLog, changelog_rows, check_filters, log_range};
use crate::error::NodeError;
use crate::tiering::tests::{bucket, users};
use crate::tiering::{TierReport, tier_table};
use crate::{Node, NodeConfig};

/// A node over a temporary directory (its embedded lake in it), its config changed by
/// `configure` first.
pub(super) async fn open_node(
    configure: impl FnOnce(&mut NodeConfig),
) -> (tempfile::TempDir, Arc<Node>) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = NodeConfig::new(dir.path());
    config.log.sync = false;
    configure(&mut config);
    let node = Node::open(config).await.unwrap();
    (dir, node)
}

/// Options of a lake-enabled table of `buckets` buckets.
fn with_lake(buckets: u32) -> TableOptions {
    TableOptions {
        bucket_num: buckets,
        lake_enabled: true,
        ..TableOptions::default()
    }
}

/// Creates `db.<name> (id BIGINT, name TEXT)`, keyed by `primary_key`.
pub(super) async fn create(
    node: &Node,
    name: &str,
    primary_key: &[&str],
    options: TableOptions,
) -> TableDescriptor {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]);
    let primary_key = primary_key.iter().map(|c| c.to_string()).collect();
    let table = TableDescriptor::new(
        TablePath::new("db", name),
        schema,
        primary_key,
        vec![],
        options,
    );
    node.create_table(table.unwrap(), false).await.unwrap()
}

/// Writes `(id, name)` rows to `bucket` in one batch: appended to a log table, upserted
/// into a primary-key table.
pub(super) async fn write(
    node: &Node,
    table: &TableDescriptor,
    bucket: &BucketId,
    rows: &[(i64, &str)],
) {
    let batch = users(table, rows);
    node.write(bucket, batch, false, None).await.unwrap();
}

/// Deletes the keys `ids` from `bucket` of a primary-key table, in one batch.
pub(super) async fn delete(node: &Node, table: &TableDescriptor, bucket: &BucketId, ids: &[i64]) {
    let rows: Vec<(i64, &str)> = ids.iter().map(|&id| (id, "")).collect();
    let batch = users(table, &rows);
    node.write(bucket, batch, true, None).await.unwrap();
}

/// Appends the rows `ids` (named after their id) to `bucket` of a log table, in one batch.
async fn append(
    node: &Node,
    table: &TableDescriptor,
    bucket: &BucketId,
    ids: std::ops::Range<i64>,
) {
    let names: Vec<String> = ids.clone().map(|id| format!("n{id}")).collect();
    let rows: Vec<(i64, &str)> = ids.zip(&names).map(|(id, n)| (id, n.as_str())).collect();
    write(node, table, bucket, &rows).await;
}

/// The ids of `batches`, in order.
fn ids<'a>(batches: impl IntoIterator<Item = &'a RecordBatch>) -> Vec<i64> {
    batches
        .into_iter()
        .flat_map(|batch| {
            batch
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect()
}

/// `[from, to)` of `bucket`'s log as [`log_range`] reads it: each batch's base offset
/// and ids.
async fn read_range(node: &Node, bucket: &BucketId, from: i64, to: i64) -> Vec<(i64, Vec<i64>)> {
    let (_, tablets) = node.bucket(bucket).unwrap();
    let batches: Vec<LogBatch> = log_range(tablets, from, to).try_collect().await.unwrap();
    batches
        .iter()
        .map(|batch| (batch.base_offset, ids([&batch.batch])))
        .collect()
}

/// A tiering round of `table`, which must tier something.
async fn tier(node: &Node, table: &TableDescriptor) -> TierReport {
    let report = tier_table(node, &table.path).await.unwrap();
    assert!(report.snapshot_id.is_some(), "the round committed nothing");
    report
}

#[tokio::test]
async fn a_table_never_tiered_plans_no_snapshot_and_its_whole_log() {
    let (_dir, node) = open_node(|_| {}).await;
    let table = create(&node, "events", &[], with_lake(1)).await;
    let b = bucket(&table, 0);
    append(&node, &table, &b, 0..3).await;
    append(&node, &table, &b, 3..7).await;

    let planned = node.plan_union(&b, &[]).await.unwrap();
    assert_eq!(planned.id, b);
    assert_eq!(
        planned.plan,
        UnionPlan {
            snapshot_id: None,
            lake_log_end_offset: 0,
            log_from: 0,
            log_to: 7,
            lake_files: 0,
            replaced_rows_located: false,
        }
    );
    assert!(planned.split.files.is_empty());
}

#[tokio::test]
async fn a_table_without_a_lake_plans_from_the_log_start_its_retention_left() {
    let (_dir, node) = open_node(|config| config.log.segment_bytes = 1).await;
    let options = TableOptions {
        log_ttl: Some(Duration::from_millis(1)),
        ..TableOptions::default()
    };
    let table = create(&node, "events", &[], options).await;
    let b = bucket(&table, 0);
    for from in [0, 2, 4] {
        append(&node, &table, &b, from..from + 2).await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Each batch is a segment of its own; the active one (the last) stays.
    assert_eq!(node.enforce_retention().unwrap(), 2);

    let plan = node.plan_union(&b, &[]).await.unwrap().plan;
    assert_eq!((plan.snapshot_id, plan.lake_log_end_offset), (None, 0));
    assert_eq!((plan.log_from, plan.log_to), (4, 6));
}

#[tokio::test]
async fn a_plan_after_a_round_reads_the_lake_below_the_seam_and_the_log_to_the_high_watermark() {
    let (_dir, node) = open_node(|_| {}).await;
    let table = create(&node, "events", &[], with_lake(1)).await;
    let b = bucket(&table, 0);
    append(&node, &table, &b, 0..4).await;
    append(&node, &table, &b, 4..10).await;
    let round = tier(&node, &table).await;
    assert_eq!(round.rows, 10);
    append(&node, &table, &b, 10..15).await;

    let planned = node.plan_union(&b, &[]).await.unwrap();
    let files = planned.split.files.len() as u64;
    assert_eq!(
        planned.plan,
        UnionPlan {
            snapshot_id: round.snapshot_id,
            lake_log_end_offset: 10,
            log_from: 10,
            log_to: 15,
            lake_files: files,
            replaced_rows_located: false,
        }
    );
    assert_eq!((files, planned.split.record_count()), (round.files, 10));
    // The split is the bucket's lake files as the table's Lake read plans them.
    let (_, lake) = node.plan_lake(&table.path, None, None, &[]).await.unwrap();
    let paths = |files: &[mink_lake::reader::LakeFile]| {
        let mut paths: Vec<String> = files.iter().map(|f| f.path.clone()).collect();
        paths.sort();
        paths
    };
    assert_eq!(paths(&planned.split.files), paths(&lake.files));

    // Writes after the plan are not in its range: the log read stops at `log_to`.
    append(&node, &table, &b, 15..20).await;
    let range = LogRange {
        bucket: b.clone(),
        from: planned.plan.log_from,
        to: planned.plan.log_to,
    };
    let log = LocalLog {
        node: Arc::clone(&node),
    };
    let read: Vec<_> = log.read(&range, &[]).try_collect().await.unwrap();
    let rows: Vec<&RecordBatch> = read.iter().map(|batch| &batch.rows).collect();
    assert_eq!(ids(rows), (10..15).collect::<Vec<_>>());
    assert_eq!(node.plan_union(&b, &[]).await.unwrap().plan.log_to, 20);
}

#[tokio::test]
async fn a_table_plans_every_bucket_from_one_record_in_the_order_buckets_are_listed() {
    let (_dir, node) = open_node(|_| {}).await;
    let table = create(&node, "events", &[], with_lake(3)).await;
    let buckets: Vec<BucketId> = (0..3).map(|b| bucket(&table, b)).collect();
    for (b, rows) in buckets.iter().zip([2, 3, 4]) {
        append(&node, &table, b, 0..rows).await;
    }
    let round = tier(&node, &table).await;
    append(&node, &table, &buckets[1], 3..4).await;

    let (planned, elsewhere) = node.plan_table_union(&table.path, &[]).await.unwrap();
    assert!(elsewhere.is_empty());
    let listed: Vec<BucketId> = (node.list_buckets(&table.path).unwrap().into_iter())
        .map(|status| status.bucket.unwrap())
        .collect();
    assert_eq!(
        planned.iter().map(|p| p.id.clone()).collect::<Vec<_>>(),
        listed
    );
    let plans: Vec<(Option<i64>, i64, i64, i64)> = (planned.iter())
        .map(|p| {
            let plan = &p.plan;
            (
                plan.snapshot_id,
                plan.lake_log_end_offset,
                plan.log_from,
                plan.log_to,
            )
        })
        .collect();
    let snapshot = round.snapshot_id;
    assert_eq!(
        plans,
        [
            (snapshot, 2, 2, 2),
            (snapshot, 3, 3, 4),
            (snapshot, 4, 4, 4)
        ]
    );
    let lake_rows: Vec<u64> = planned.iter().map(|p| p.split.record_count()).collect();
    assert_eq!(
        lake_rows,
        [2, 3, 4],
        "each bucket's split has its own lake rows"
    );
    // Each bucket's plan is the one planned for it alone.
    for planned in &planned {
        let alone = node.plan_union(&planned.id, &[]).await.unwrap();
        assert_eq!(alone.plan, planned.plan, "{}", planned.id);
    }
}

#[tokio::test]
async fn a_filter_prunes_the_lake_files_of_a_plan() {
    let (_dir, node) = open_node(|_| {}).await;
    let table = create(&node, "events", &[], with_lake(1)).await;
    let b = bucket(&table, 0);
    append(&node, &table, &b, 0..10).await;
    tier(&node, &table).await;
    append(&node, &table, &b, 10..20).await;
    tier(&node, &table).await;

    let all = node.plan_union(&b, &[]).await.unwrap();
    assert_eq!(all.plan.lake_files, 2);
    let high = [ColumnFilter::new("id", FilterOp::GtEq, Some("15"))];
    let pruned = node.plan_union(&b, &high).await.unwrap();
    assert_eq!(pruned.plan.lake_files, 1);
    assert_eq!(pruned.split.record_count(), 10, "the second round's file");
    assert_eq!((pruned.plan.log_from, pruned.plan.log_to), (20, 20));
}

#[tokio::test]
async fn filters_on_unknown_columns_or_with_values_of_another_type_are_refused() {
    let (_dir, node) = open_node(|_| {}).await;
    let table = create(&node, "events", &[], with_lake(1)).await;
    let b = bucket(&table, 0);
    let refused = |filter: ColumnFilter| {
        let error = check_filters(&table, &[filter]).unwrap_err();
        assert!(matches!(error, NodeError::InvalidArgument(_)), "{error:?}");
        error.to_string()
    };
    let unknown = [ColumnFilter::new("nope", FilterOp::Eq, Some("1"))];
    assert_eq!(
        refused(unknown[0].clone()),
        "invalid request: filter on unknown column 'nope'"
    );
    let not_a_number = ColumnFilter::new("id", FilterOp::Lt, Some("x"));
    assert_eq!(
        refused(not_a_number),
        "invalid request: filter value 'x' is not a Int64 (column 'id')"
    );
    let valueless = ColumnFilter::new("name", FilterOp::Eq, None);
    assert_eq!(
        refused(valueless),
        "invalid request: filter on 'name' needs a value"
    );
    let fine = [
        ColumnFilter::new("id", FilterOp::Lt, Some("7")),
        ColumnFilter::new("name", FilterOp::IsNull, None),
    ];
    check_filters(&table, &fine).unwrap();

    // A plan checks them before anything else.
    let error = node.plan_union(&b, &unknown).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid request: filter on unknown column 'nope'"
    );
    let error = node.plan_table_union(&table.path, &unknown).await;
    assert!(
        matches!(error, Err(NodeError::InvalidArgument(_))),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_bucket_handed_over_to_another_node_is_not_planned_here() {
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let (_dir, node) = open_node(|config| config.log_store = Some(LogStoreConfig::new(url))).await;
    let table = create(&node, "events", &[], with_lake(2)).await;
    let (b0, b1) = (bucket(&table, 0), bucket(&table, 1));
    append(&node, &table, &b0, 0..2).await;
    append(&node, &table, &b1, 0..3).await;
    node.hand_over_bucket(&b1, "127.0.0.1:1", 3).await.unwrap();
    let not_leader = NotLeader {
        bucket: Some(b1.clone()),
        leader: Some("127.0.0.1:1".into()),
        epoch: 3,
    };

    let error = node.plan_union(&b1, &[]).await.unwrap_err();
    assert!(
        matches!(&error, NodeError::NotLeader(n) if *n == not_leader),
        "{error:?}"
    );
    let (planned, elsewhere) = node.plan_table_union(&table.path, &[]).await.unwrap();
    let planned: Vec<(BucketId, i64)> = (planned.into_iter())
        .map(|p| (p.id, p.plan.log_to))
        .collect();
    assert_eq!(planned, [(b0, 2)]);
    assert_eq!(elsewhere, [not_leader]);
}

/// The plan locates the lake rows its range replaces: the keys the range changes
/// (`changed_keys`), looked up in the lake index. A later plan of the same seam extends
/// what the last one located.
#[tokio::test]
async fn a_primary_key_plan_locates_the_lake_rows_its_range_replaces() {
    let (_dir, node) = open_node(|_| {}).await;
    let table = create(&node, "users", &["id"], with_lake(1)).await;
    let b = bucket(&table, 0);
    // Tiered in log order: key k at position k - 1.
    write(&node, &table, &b, &[(1, "a"), (2, "b"), (3, "c"), (4, "d")]).await;
    tier(&node, &table).await;
    // -U +U of key 2 (offsets 4, 5), -D of key 4 (6), +I of key 5 (7).
    write(&node, &table, &b, &[(2, "b2")]).await;
    delete(&node, &table, &b, &[4]).await;
    write(&node, &table, &b, &[(5, "e")]).await;

    let planned = node.plan_union(&b, &[]).await.unwrap();
    assert_eq!((planned.plan.log_from, planned.plan.log_to), (4, 8));
    assert!(planned.plan.replaced_rows_located);
    let replaced: Vec<&[u64]> = (planned.split.files.iter())
        .map(|file| file.replaced_rows.as_slice())
        .collect();
    assert_eq!(replaced, [[1, 3].as_slice()]);
    let snapshot = planned.plan.snapshot_id.unwrap();
    let kept = planned.bucket.located.prefix(snapshot, 4, 8).unwrap();
    assert_eq!((kept.from, kept.to), (4, 8));

    write(&node, &table, &b, &[(3, "c2")]).await;
    let planned = node.plan_union(&b, &[]).await.unwrap();
    assert_eq!(planned.split.files[0].replaced_rows, [1, 2, 3]);
    let kept = planned.bucket.located.prefix(snapshot, 4, 10).unwrap();
    assert_eq!((kept.from, kept.to), (4, 10));
}

#[tokio::test]
async fn a_log_range_reads_exactly_from_to_across_stored_batches() {
    let (_dir, node) = open_node(|_| {}).await;
    let table = create(&node, "events", &[], TableOptions::default()).await;
    let b = bucket(&table, 0);
    for ids in [0..4, 4..7, 7..12] {
        append(&node, &table, &b, ids).await;
    }
    let whole = read_range(&node, &b, 0, 12).await;
    assert_eq!(
        whole,
        [
            (0, (0..4).collect()),
            (4, (4..7).collect()),
            (7, (7..12).collect())
        ]
    );
    // From and to inside batches: the first and last are trimmed.
    let inside = read_range(&node, &b, 2, 9).await;
    assert_eq!(
        inside,
        [(2, vec![2, 3]), (4, vec![4, 5, 6]), (7, vec![7, 8])]
    );
    assert_eq!(read_range(&node, &b, 5, 6).await, [(5, vec![5])]);
    assert_eq!(read_range(&node, &b, 4, 7).await, [(4, vec![4, 5, 6])]);
    for empty in [0, 3, 12] {
        assert!(
            read_range(&node, &b, empty, empty).await.is_empty(),
            "at {empty}"
        );
    }
}

#[tokio::test]
async fn a_log_range_past_the_high_watermark_fails_where_the_log_ends() {
    let (_dir, node) = open_node(|_| {}).await;
    let table = create(&node, "events", &[], TableOptions::default()).await;
    let b = bucket(&table, 0);
    append(&node, &table, &b, 0..4).await;
    let (_, tablets) = node.bucket(&b).unwrap();

    let mut read = log_range(tablets, 2, 6);
    let first = read.try_next().await.unwrap().unwrap();
    assert_eq!((first.base_offset, ids([&first.batch])), (2, vec![2, 3]));
    let error = read.try_next().await.unwrap_err();
    assert!(matches!(error, NodeError::Corrupt(_)), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("ends at offset 4, before the end of the range read (6)"),
        "{error}"
    );
}

#[tokio::test]
async fn a_changelog_batch_keeps_its_change_vector_and_one_without_is_corrupt() {
    let (_dir, node) = open_node(|_| {}).await;
    let table = create(&node, "users", &["id"], TableOptions::default()).await;
    let b = bucket(&table, 0);
    write(&node, &table, &b, &[(1, "a")]).await;
    write(&node, &table, &b, &[(1, "b"), (2, "c")]).await;
    let (_, tablets) = node.bucket(&b).unwrap();
    let batches: Vec<LogBatch> = log_range(tablets, 0, 4).try_collect().await.unwrap();
    let second = batches.into_iter().nth(1).unwrap();

    let (rows, changes) = changelog_rows(&table, second.clone()).unwrap();
    let change = |c: ChangeType| c as u8;
    assert_eq!(
        changes,
        [
            ChangeType::UpdateBefore,
            ChangeType::UpdateAfter,
            ChangeType::Insert
        ]
        .map(change)
    );
    assert_eq!(rows, users(&table, &[(1, "a"), (1, "b"), (2, "c")]));

    let without = LogBatch {
        changes: None,
        ..second
    };
    let error = changelog_rows(&table, without).unwrap_err();
    assert!(matches!(error, NodeError::Corrupt(_)), "{error:?}");
    assert_eq!(
        error.to_string(),
        "corrupt log: a batch of primary-key table db.users without change types"
    );
}
