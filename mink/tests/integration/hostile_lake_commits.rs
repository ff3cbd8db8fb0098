//! Hostile commits through the Iceberg REST catalog (issue 47): foreign commits whose
//! fields later tiering rounds depend on, and rows other engines append to a log table.
//!
//! - Commits forged over raw HTTP (a snapshot stamped in the year 2100, a sequence number
//!   of 2^63-1, an unknown schema, a stale parent, a reused manifest list, updates of what
//!   mink owns) are each refused with the REST error model, naming the field; the table's
//!   snapshot does not move, the next tiering round succeeds and SQL reads every row.
//! - Rows pyiceberg appends to a log table's lake are read by SQL beside mink's own once a
//!   round records the snapshot holding them, and survive a compaction.
//! - `log.ttl` retention keeps a lake table's rows that are not tiered yet.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};

use mink_client::MinkClient;
use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;
use mink_core::table::{TableDescriptor, TablePath};
use serde_json::Value;

use crate::iceberg_rest::{PASSWORD, USER, python_step, rest_server};
use crate::process::{ServerProcess, run_mink_with};
use crate::support::{TestNode, events, events_table, first_column_ids, lake_options};

/// A log table of two buckets with 100 rows tiered and 20 in the log only, and the
/// snapshot of the round.
async fn tiered_table(client: &MinkClient, name: &str) -> (TableDescriptor, Option<i64>) {
    let table = client
        .create_table(&events_table(name, 2, lake_options()), false)
        .await
        .expect("create");
    let ids: Vec<i64> = (0..100).collect();
    client
        .write(&table, &events(&table, &ids))
        .await
        .expect("write");
    let round = client.tier(&table.path).await.expect("tier");
    assert_eq!(round.rows, 100, "{round:?}");
    let ids: Vec<i64> = (100..120).collect();
    client
        .write(&table, &events(&table, &ids))
        .await
        .expect("write");
    (table, round.snapshot_id)
}

/// Runs one step of `hostile_lake_commits.py` against the catalog at `uri`.
fn engine(uri: &str, step: &[&str]) -> Value {
    python_step("hostile_lake_commits.py", uri, step, &[])
}

/// The ids `SELECT id FROM <table> ORDER BY id` returns over Flight SQL, with the login.
fn sql_ids(server: &ServerProcess, table: &str) -> Vec<i64> {
    let statement = format!("SELECT id FROM {table} ORDER BY id");
    let (ok, stdout, stderr) = run_mink_with(
        &[
            "sql",
            "--flight-sql",
            &server.sql_uri(),
            "--user",
            USER,
            "--format",
            "csv",
            "-e",
            &statement,
        ],
        &[("MINK_PASSWORD", PASSWORD)],
    );
    assert!(ok, "{statement}: {stderr}");
    stdout
        .lines()
        .skip(1)
        .map(|line| line.parse().unwrap_or_else(|e| panic!("{line}: {e}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_commits_are_refused_and_tiering_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client, uri) = rest_server(dir.path()).await;
    let (table, before) = tiered_table(&client, "forged").await;

    let forged = engine(&uri, &["forge", "test", "forged"]);
    let answers = &forged["answers"];
    for (name, status, kind, field) in [
        ("year 2100", 400, "BadRequestException", "timestamp-ms"),
        (
            "before the parent",
            400,
            "BadRequestException",
            "before its parent",
        ),
        (
            "sequence number 2^63-1",
            400,
            "BadRequestException",
            "sequence-number",
        ),
        (
            "sequence number reused",
            400,
            "BadRequestException",
            "sequence-number",
        ),
        ("unknown schema", 400, "BadRequestException", "schema-id 99"),
        (
            "stale parent",
            409,
            "CommitFailedException",
            "parent-snapshot-id",
        ),
        (
            "snapshot id taken",
            400,
            "BadRequestException",
            "snapshot-id",
        ),
        (
            "manifest list reused",
            400,
            "BadRequestException",
            "manifest-list",
        ),
        (
            "set-current-schema",
            403,
            "ForbiddenException",
            "set-current-schema",
        ),
        (
            "remove-snapshots",
            403,
            "ForbiddenException",
            "remove-snapshots",
        ),
        (
            "set-properties",
            403,
            "ForbiddenException",
            "set-properties",
        ),
        ("assign-uuid", 403, "ForbiddenException", "assign-uuid"),
        (
            "upgrade-format-version",
            403,
            "ForbiddenException",
            "upgrade-format-version",
        ),
        ("set-location", 403, "ForbiddenException", "set-location"),
    ] {
        let answer = &answers[name];
        assert_eq!(answer[0], status, "{name}: {answer}");
        assert_eq!(answer[1], kind, "{name}: {answer}");
        let message = answer[2].as_str().unwrap_or_default();
        assert!(message.contains(field), "{name}: {message}");
    }
    assert_eq!(forged["snapshot"], serde_json::json!(before), "{forged}");

    // The next round tiers the 20 log rows, and SQL reads every row once.
    let ids: Vec<i64> = (120..130).collect();
    client
        .write(&table, &events(&table, &ids))
        .await
        .expect("write");
    let round = client
        .tier(&table.path)
        .await
        .expect("tier after the forged commits");
    assert_eq!(round.rows, 30, "{round:?}");
    assert_eq!(
        sql_ids(&server, "test.forged"),
        (0..130).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_other_engines_append_are_read_by_sql() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client, uri) = rest_server(dir.path()).await;
    let (table, _) = tiered_table(&client, "appended").await;

    let appended = engine(&uri, &["append", "test", "appended", "1000", "5"]);
    assert_eq!(appended["rows"], serde_json::json!(105), "{appended}");
    // The rows join SQL reads with the round that records the snapshot holding them.
    assert_eq!(client.tier(&table.path).await.expect("tier").rows, 20);
    let expected: Vec<i64> = (0..120).chain(1000..1005).collect();
    assert_eq!(sql_ids(&server, "test.appended"), expected);

    // A compaction takes the foreign file into its bucket; nothing is lost or doubled.
    let compacted = client.compact(&table.path).await.expect("compact");
    assert!(compacted.files_removed > 0, "{compacted:?}");
    assert_eq!(sql_ids(&server, "test.appended"), expected);
}

/// `(dt STRING, id BIGINT NOT NULL, name STRING)` partitioned by `dt`, two buckets by id.
fn partitioned_table(name: &str) -> TableDescriptor {
    let schema = Schema::new(vec![
        Field::new("dt", DataType::Utf8, true),
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]);
    let options = TableOptions {
        bucket_num: 2,
        bucket_key: Some(vec!["id".into()]),
        ..lake_options()
    };
    TableDescriptor::new(
        TablePath::new("test", name),
        schema,
        vec![],
        vec!["dt".into()],
        options,
    )
    .expect("table")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_other_engines_append_to_a_partition_are_read_by_sql() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client, uri) = rest_server(dir.path()).await;
    let table = client
        .create_table(&partitioned_table("days"), false)
        .await
        .expect("create");
    let ids: Vec<i64> = (0..50).collect();
    let rows = RecordBatch::try_new(
        Arc::clone(table.schema()),
        vec![
            Arc::new(StringArray::from(vec!["2024-01-01"; ids.len()])),
            Arc::new(Int64Array::from(ids.clone())),
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|i| format!("e{i}")),
            )),
        ],
    )
    .expect("rows");
    client.write(&table, &rows).await.expect("write");
    assert_eq!(client.tier(&table.path).await.expect("tier").rows, 50);
    let step = ["append", "test", "days", "1000", "5", "dt", "2024-01-01"];
    assert_eq!(engine(&uri, &step)["rows"], serde_json::json!(55));
    // Nothing to tier, but the round records the lake as the other engine left it.
    let round = client.tier(&table.path).await.expect("tier");
    assert!(round.rows == 0 && round.snapshot_id.is_some(), "{round:?}");
    let expected: Vec<i64> = (0..50).chain(1000..1005).collect();
    assert_eq!(sql_ids(&server, "test.days"), expected);
}

/// Appends rows `chunks` x 2000 ids on to `bucket`, a chunk a batch (about 40 KiB each,
/// so the test node's 64 KiB segments roll every two).
async fn append_chunks(node: &TestNode, table: &TableDescriptor, chunks: std::ops::Range<i64>) {
    let bucket = BucketId::new(&table.path, 0);
    for chunk in chunks {
        let ids: Vec<i64> = (chunk * 2000..(chunk + 1) * 2000).collect();
        node.client
            .append(&bucket, vec![events(table, &ids)])
            .await
            .expect("append");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_rows_not_yet_tiered() {
    let node = TestNode::start().await;
    let options = TableOptions {
        log_ttl: Some(Duration::from_secs(1)),
        ..lake_options()
    };
    let table = node
        .client
        .create_table(&events_table("kept", 1, options), false)
        .await
        .expect("create");
    append_chunks(&node, &table, 0..5).await;
    assert_eq!(
        node.client.tier(&table.path).await.expect("tier").rows,
        10_000
    );
    append_chunks(&node, &table, 5..10).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Every batch is now older than the TTL: segments of tiered rows go, the others stay.
    append_chunks(&node, &table, 10..11).await;
    assert!(node.node().enforce_retention().expect("retention") >= 1);
    let round = node.client.tier(&table.path).await.expect("tier");
    assert_eq!(round.rows, 12_000, "{round:?}");
    let bucket = BucketId::new(&table.path, 0);
    let answer = node.client.union(&bucket, &[], &[]).await.expect("union");
    let mut ids = first_column_ids(&answer.batches);
    ids.sort_unstable();
    assert_eq!(ids, (0..22_000).collect::<Vec<_>>());
}
