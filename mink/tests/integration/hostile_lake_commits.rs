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
//! - The REST port's bounds, in raw HTTP: a request body trickled slower than the 30 s
//!   deadline is answered `408` and its connection closed while other clients are served;
//!   1 000 hosted tables and 1 000 namespaces, no more (`400`); a mink database's name is
//!   taken (`409`); a snapshot summary over 64 KiB is refused; pyiceberg and DuckDB still
//!   read mink's table.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};

use futures::StreamExt;
use mink_client::MinkClient;
use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;
use mink_core::table::{TableDescriptor, TablePath};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::iceberg_rest::{PASSWORD, USER, python_step, rest_server};
use crate::process::{ServerProcess, run_mink_with};
use crate::support::{TestNode, events, events_table, first_column_ids, lake_options};

/// A log table of two buckets with 100 rows tiered and 20 in the log only, and the
/// snapshot of the round.
pub(crate) async fn tiered_table(
    client: &MinkClient,
    name: &str,
) -> (TableDescriptor, Option<i64>) {
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

/// One HTTP/1.1 request to the REST port at `addr` over a fresh connection (bearer
/// `token`, JSON or form `body`); the status and the body answered.
pub(crate) async fn http(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect REST");
    let login = token.map_or_else(String::new, |t| format!("Authorization: Bearer {t}\r\n"));
    let kind = match body.starts_with('{') {
        true => "application/json",
        false => "application/x-www-form-urlencoded",
    };
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: mink\r\nConnection: close\r\n{login}\
         Content-Type: {kind}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("answer");
    parse_answer(&answer)
}

/// The status and body of a whole HTTP/1.1 answer.
fn parse_answer(answer: &str) -> (u16, String) {
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer}"));
    let (_, body) = answer.split_once("\r\n\r\n").unwrap_or((answer, ""));
    (status, body.to_string())
}

/// A bearer token of the REST port, logged in as the test user.
pub(crate) async fn rest_token(addr: &str) -> String {
    let form = format!("grant_type=client_credentials&client_id={USER}&client_secret={PASSWORD}");
    let (status, body) = http(addr, "POST", "/v1/oauth/tokens", None, &form).await;
    assert_eq!(status, 200, "{body}");
    let token: Value = serde_json::from_str(&body).expect("token JSON");
    token["access_token"].as_str().expect("token").to_string()
}

/// Sends `(path, body)` POSTs, 8 at a time; the statuses and bodies in order.
async fn post_all(addr: &str, token: &str, requests: Vec<(String, String)>) -> Vec<(u16, String)> {
    futures::stream::iter(requests)
        .map(|(path, body)| async move { http(addr, "POST", &path, Some(token), &body).await })
        .buffered(8)
        .collect()
        .await
}

/// A create-table request of a one-column table `name`.
fn create_table_body(name: &str) -> String {
    serde_json::json!({
        "name": name,
        "schema": {"type": "struct", "schema-id": 0,
                   "fields": [{"id": 1, "name": "id", "required": true, "type": "long"}]},
    })
    .to_string()
}

/// A commit adding a snapshot whose summary holds 70 000 bytes to the table at `location`.
fn oversized_summary_commit(location: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis();
    serde_json::json!({
        "requirements": [],
        "updates": [{"action": "add-snapshot", "snapshot": {
            "snapshot-id": 1, "sequence-number": 1, "timestamp-ms": now,
            "manifest-list": format!("{location}/metadata/snap-1.avro"),
            "summary": {"operation": "append", "note": "x".repeat(70_000)},
            "schema-id": 0,
        }}],
    })
    .to_string()
}

/// Starts a token request whose body never arrives whole: headers announcing 1 000 bytes,
/// then 10 of them.
async fn slow_body(addr: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect REST");
    let head = "POST /v1/oauth/tokens HTTP/1.1\r\nHost: mink\r\n\
                Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\n\
                grant_type";
    stream.write_all(head.as_bytes()).await.expect("send");
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_port_bounds_slow_bodies_counts_and_summaries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client, uri) = rest_server(dir.path()).await;
    let addr = server.iceberg_rest_addr.clone().expect("REST");
    tiered_table(&client, "served").await;
    let mut slow = slow_body(&addr).await;
    let started = std::time::Instant::now();

    // Other clients are served meanwhile: 1 000 hosted tables, no more.
    let token = rest_token(&addr).await;
    let (status, body) = http(
        &addr,
        "POST",
        "/v1/namespaces",
        Some(&token),
        r#"{"namespace":["ns0"]}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let tables = (0..=1_000)
        .map(|i| {
            (
                "/v1/namespaces/ns0/tables".to_string(),
                create_table_body(&format!("t{i}")),
            )
        })
        .collect();
    let answers = post_all(&addr, &token, tables).await;
    let refused: Vec<_> = answers
        .iter()
        .filter(|(status, _)| *status != 200)
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].0, 400, "{refused:?}");
    assert!(refused[0].1.contains("(1000)"), "{refused:?}");

    // A snapshot summary over 64 KiB is refused, naming the limit.
    let created: Value = serde_json::from_str(&answers[0].1).expect("created JSON");
    let location = created["metadata"]["location"].as_str().expect("location");
    let commit = oversized_summary_commit(location);
    let (status, body) = http(
        &addr,
        "POST",
        "/v1/namespaces/ns0/tables/t0",
        Some(&token),
        &commit,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("summary") && body.contains("65536"), "{body}");

    // 1 000 namespaces (test, ns0 and 998 more), no more; test is a mink database.
    let namespaces = (1..=999)
        .map(|i| {
            (
                "/v1/namespaces".to_string(),
                format!(r#"{{"namespace":["ns{i}"]}}"#),
            )
        })
        .collect();
    let answers = post_all(&addr, &token, namespaces).await;
    let refused: Vec<_> = answers
        .iter()
        .filter(|(status, _)| *status != 200)
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0].0 == 400 && refused[0].1.contains("(1000)"),
        "{refused:?}"
    );
    // At the bound, a name taken (a mink database, a hosted namespace) is still 409.
    for taken in [r#"{"namespace":["test"]}"#, r#"{"namespace":["ns0"]}"#] {
        let (status, body) = http(&addr, "POST", "/v1/namespaces", Some(&token), taken).await;
        assert_eq!(status, 409, "{body}");
    }

    // The slow body is answered 408 at the deadline and its connection closed.
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(60), slow.read_to_string(&mut answer))
        .await
        .expect("the slow body's connection is closed")
        .expect("read");
    assert_eq!(parse_answer(&answer).0, 408, "{answer}");
    assert!(
        started.elapsed() >= Duration::from_secs(29),
        "{:?}",
        started.elapsed()
    );

    // pyiceberg and DuckDB still read mink's table.
    let read = python_step(
        "hostile_rest_port.py",
        &uri,
        &["read", "test", "served"],
        &[],
    );
    let ids: Vec<i64> = (0..100).collect();
    assert_eq!(read["pyiceberg"], serde_json::json!(ids), "{read}");
    assert_eq!(read["duckdb"], serde_json::json!(ids), "{read}");
}
