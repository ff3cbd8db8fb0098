//! A primary-key table's lake changed by another engine: an Iceberg `delete` snapshot of
//! equality deletes (written with mink-lake's `delete_equality`, as Spark or Flink would
//! write one) is honoured by mink's lake reads, and the next tiering round builds on it.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use mink_client::MinkClient;
use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::deletes::delete_equality;

use crate::process::ServerProcess;
use crate::support::TestNode;
use crate::support::lake_options;

/// `(id BIGINT, name STRING, PRIMARY KEY (id))` in two buckets, with a lake tiered on
/// demand.
pub(crate) fn table() -> TableDescriptor {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]);
    let options = TableOptions {
        bucket_num: 2,
        ..lake_options()
    };
    TableDescriptor::new(
        TablePath::new("test", "foreign"),
        schema,
        vec!["id".into()],
        vec![],
        options,
    )
    .expect("table")
}

fn rows(table: &TableDescriptor, rows: &[(i64, &str)]) -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
    ];
    RecordBatch::try_new(Arc::clone(table.schema()), columns).expect("batch")
}

fn contents(batches: &[RecordBatch]) -> BTreeMap<i64, String> {
    batches
        .iter()
        .flat_map(|b| {
            let ids = b.column(0).as_primitive::<Int64Type>().clone();
            let names = b.column(1).as_string::<i32>().clone();
            (0..b.num_rows()).map(move |i| (ids.value(i), names.value(i).to_string()))
        })
        .collect()
}

/// Every bucket's union read.
async fn union(client: &MinkClient, path: &TablePath) -> BTreeMap<i64, String> {
    let mut all = Vec::new();
    for bucket in 0..2 {
        let answer = client
            .union(&BucketId::new(path, bucket), &[], &[])
            .await
            .expect("union");
        all.extend(answer.batches);
    }
    contents(&all)
}

/// The lake at a snapshot (default: the last recorded round), checking no key is there
/// twice.
async fn read_lake(
    client: &MinkClient,
    path: &TablePath,
    snapshot: Option<i64>,
) -> BTreeMap<i64, String> {
    let batches = client
        .lake(path, None, snapshot, &[], &[])
        .await
        .expect("lake read");
    let rows = contents(&batches);
    assert_eq!(
        batches.iter().map(RecordBatch::num_rows).sum::<usize>(),
        rows.len(),
        "no key twice"
    );
    rows
}

fn expected(rows: impl IntoIterator<Item = (i64, String)>) -> BTreeMap<i64, String> {
    rows.into_iter().collect()
}

#[tokio::test]
async fn equality_deletes_of_another_engine_are_honoured() {
    let node = TestNode::start().await;
    let client = &node.client;
    let table = client.create_table(&table(), false).await.expect("create");
    let initial: Vec<(i64, String)> = (0..20).map(|id| (id, format!("v{id}"))).collect();
    let batch: Vec<(i64, &str)> = initial.iter().map(|(i, n)| (*i, n.as_str())).collect();
    client
        .write(&table, &rows(&table, &batch))
        .await
        .expect("write");
    let first = client.tier(&table.path).await.expect("tier");
    let first_snapshot = first.snapshot_id.expect("a snapshot");

    // Another engine deletes keys 3 and 7 from the lake, in one `delete` snapshot.
    let lake = node.node().lake().await.expect("lake");
    let lake_table = lake.load(&table.path).await.expect("lake table");
    let keys = RecordBatch::try_new(
        Arc::new(table.schema().project(&[0]).expect("id")),
        vec![Arc::new(Int64Array::from(vec![3, 7]))],
    )
    .expect("keys");
    let deleted = delete_equality(lake, &lake_table, &keys, &["id"])
        .await
        .expect("equality delete");
    let foreign_snapshot = deleted
        .metadata()
        .current_snapshot_id()
        .expect("a snapshot");

    // Read at that snapshot: the keys are gone; at mink's round they are not.
    let without =
        |gone: &[i64]| expected(initial.iter().filter(|(id, _)| !gone.contains(id)).cloned());
    let path = &table.path;
    assert_eq!(
        read_lake(client, path, Some(foreign_snapshot)).await,
        without(&[3, 7])
    );
    assert_eq!(
        read_lake(client, path, Some(first_snapshot)).await,
        without(&[])
    );

    // The next round commits on top of the foreign snapshot: its lake index is rebuilt
    // with the equality deletes applied, so updating key 5 and re-inserting key 7 leave
    // exactly one row per key.
    client
        .write(&table, &rows(&table, &[(5, "five"), (7, "seven")]))
        .await
        .expect("upsert");
    let second = client.tier(&table.path).await.expect("tier");
    assert_eq!(second.deleted_rows, 1, "only key 5's lake row is deleted");
    let mut now = without(&[3]);
    now.insert(5, "five".into());
    now.insert(7, "seven".into());
    assert_eq!(read_lake(client, path, None).await, now);

    // The union read agrees, through SQL too (the equality deletes still apply to the
    // first round's file), and so does it after a compaction folds the deletes.
    assert_eq!(union(client, path).await, now);
    assert_eq!(sql_rows(client).await, now);
    let session = crate::sql_reads::session(client).await;
    let plan = crate::sql_reads::query(&session, "EXPLAIN SELECT * FROM test.foreign").await;
    let plan = arrow::util::pretty::pretty_format_batches(&plan)
        .expect("plan")
        .to_string();
    assert!(plan.contains("EqualityDeleteExec: columns=[id]"), "{plan}");
    let compacted = client.compact(path).await.expect("compact");
    assert!(compacted.files_removed > 0, "{compacted:?}");
    assert_eq!(union(client, path).await, now);
    assert_eq!(sql_rows(client).await, now);
    assert_eq!(read_lake(client, path, None).await, now);
}

/// The table's rows through SQL.
async fn sql_rows(client: &MinkClient) -> BTreeMap<i64, String> {
    let session = crate::sql_reads::session(client).await;
    let batches = crate::sql_reads::query(&session, "SELECT id, name FROM test.foreign").await;
    batches
        .iter()
        .flat_map(|batch| {
            let ids = batch.column(0).as_primitive::<Int64Type>().clone();
            let names = batch.column(1).as_string::<i32>().clone();
            (0..batch.num_rows()).map(move |i| (ids.value(i), names.value(i).to_string()))
        })
        .collect()
}

/// A round commits and the node crashes before recording it; then another engine
/// commits on top. On restart mink finds its own snapshot behind the foreign one, records
/// it, and tiers nothing twice; the round then records the lake as the other engine left
/// it, so union reads honour its delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_round_under_a_foreign_snapshot_is_recorded() {
    let dir = tempfile::tempdir().expect("temp dir");
    let events = crate::support::events_table("under_foreign", 2, lake_options());
    let crashing =
        ServerProcess::start_with_env(dir.path(), &[("MINK_FAILPOINT", "abort-after-lake-commit")]);
    let client = MinkClient::connect(&crashing.addr).await.expect("connect");
    let table = client.create_table(&events, false).await.expect("create");
    let ids: Vec<i64> = (0..40).collect();
    client
        .write(&table, &crate::support::events(&table, &ids))
        .await
        .expect("write");
    client
        .tier(&table.path)
        .await
        .expect_err("the node aborts after the commit");
    crashing.wait_for_exit();

    // Another engine deletes id 7 on top of mink's unrecorded snapshot.
    let lake = mink_lake::Lake::open(mink_lake::LakeConfig::embedded(dir.path()).expect("config"))
        .await
        .expect("lake");
    let lake_table = lake.load(&table.path).await.expect("lake table");
    let keys = RecordBatch::try_new(
        Arc::new(table.schema().project(&[0]).expect("id")),
        vec![Arc::new(Int64Array::from(vec![7]))],
    )
    .expect("keys");
    delete_equality(&lake, &lake_table, &keys, &["id"])
        .await
        .expect("equality delete");
    drop(lake);

    let server = ServerProcess::start(dir.path());
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    let report = client.tier(&table.path).await.expect("tier");
    assert!(
        report.repaired,
        "mink's snapshot behind the foreign one is recorded"
    );
    assert_eq!(report.rows, 0, "nothing is tiered twice: {report:?}");
    let mut union = Vec::new();
    for bucket in 0..2 {
        let answer = client
            .union(&BucketId::new(&table.path, bucket), &[0], &[])
            .await
            .expect("union");
        assert_eq!(
            answer.plan.log_from, answer.plan.log_to,
            "the seam is the crashed round's"
        );
        union.extend(crate::support::first_column_ids(&answer.batches));
    }
    union.sort_unstable();
    let kept: Vec<i64> = ids.into_iter().filter(|id| *id != 7).collect();
    assert_eq!(
        union, kept,
        "the foreign delete is recorded with mink's seam"
    );
    server.kill();
}
