//! Other engines through mink's Iceberg REST catalog (`mink server
//! --iceberg-rest-listen`): pyiceberg's `RestCatalog` and DuckDB's iceberg extension, logged
//! in with mink's user and password as OAuth2 client credentials, read every mink table
//! exactly as of its last tiering round (a primary-key table with its position deletes);
//! a pyiceberg append to a log table lands in the lake and mink's next round builds on it
//! without tiering anything twice; a primary-key table refuses it; badly formed requests
//! get the protocol's errors and the catalog goes on answering.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use mink_client::{ConnectOptions, Credentials, MinkClient};
use mink_core::table::TableDescriptor;
use serde_json::Value;

use crate::process::{ServerProcess, run_server};
use crate::python::python;
use crate::support::{events, events_table, lake_options};

pub(crate) const USER: &str = "lakeuser";
pub(crate) const PASSWORD: &str = "lake-s3cret";

fn pk_rows(table: &TableDescriptor, ids: impl Iterator<Item = i64>, tag: &str) -> RecordBatch {
    let ids: Vec<i64> = ids.collect();
    let names = ids.iter().map(|id| format!("{tag}{id}"));
    RecordBatch::try_new(
        Arc::clone(table.schema()),
        vec![
            Arc::new(Int64Array::from(ids.clone())),
            Arc::new(StringArray::from_iter_values(names)),
        ],
    )
    .expect("rows")
}

/// Runs one step of `iceberg_rest.py` against the catalog at `uri`; its JSON answer.
pub(crate) fn engines(uri: &str, step: &[&str]) -> Value {
    engines_with(uri, step, &[])
}

/// [`engines`] with more environment (`MINK_TEST_CA` for an `https://` catalog).
pub(crate) fn engines_with(uri: &str, step: &[&str], env: &[(&str, &str)]) -> Value {
    python_step("iceberg_rest.py", uri, step, env)
}

/// Runs one step of `tests/python/<script>` against the catalog at `uri`, with the login
/// and `env`; its JSON answer.
pub(crate) fn python_step(script: &str, uri: &str, step: &[&str], env: &[(&str, &str)]) -> Value {
    let output = Command::new(python())
        .envs(env.iter().copied())
        .arg(format!(
            "{}/tests/python/{script}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .args([uri, USER, PASSWORD])
        .args(step)
        .output()
        .expect("run python");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{step:?} failed: {stderr}");
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{step:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// The ids pyiceberg and DuckDB read from a table (checked to agree).
pub(crate) fn ids_read(answer: &Value, table: &str) -> Vec<i64> {
    let read = &answer["tables"][table];
    let ids = |engine: &str| -> Vec<i64> {
        serde_json::from_value(read[engine].clone())
            .unwrap_or_else(|e| panic!("{table} has no {engine} ids ({e}): {answer}"))
    };
    let pyiceberg = ids("pyiceberg");
    assert_eq!(
        pyiceberg,
        ids("duckdb"),
        "pyiceberg and DuckDB disagree on {table}"
    );
    pyiceberg
}

/// A server with the REST catalog and a login, a client logged in, and the catalog's URI.
pub(crate) async fn rest_server(dir: &std::path::Path) -> (ServerProcess, MinkClient, String) {
    let login = [("MINK_SQL_USER", USER), ("MINK_SQL_PASSWORD", PASSWORD)];
    let server = ServerProcess::start_with(dir, &["--iceberg-rest-listen", "127.0.0.1:0"], &login);
    let uri = format!(
        "http://{}",
        server.iceberg_rest_addr.as_ref().expect("REST")
    );
    let options = ConnectOptions {
        credentials: Some(Credentials::new(USER, PASSWORD)),
        ..ConnectOptions::default()
    };
    let client = MinkClient::connect_with(&server.addr, &options)
        .await
        .expect("connect");
    (server, client, uri)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_engines_read_and_append_through_the_rest_catalog() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_server, client, uri) = rest_server(dir.path()).await;

    // A log table: 100 rows tiered, 20 more in the log only.
    let log = client
        .create_table(&events_table("restlog", 2, lake_options()), false)
        .await
        .expect("create");
    client
        .write(&log, &events(&log, &(0..100).collect::<Vec<_>>()))
        .await
        .expect("write");
    assert_eq!(client.tier(&log.path).await.expect("tier").rows, 100);
    client
        .write(&log, &events(&log, &(100..120).collect::<Vec<_>>()))
        .await
        .expect("write");

    // A primary-key table: round 2 updates 10 keys and deletes 10 (position deletes);
    // later upserts stay in the log.
    let pk = client
        .create_table(&crate::lake_foreign::table(), false)
        .await
        .expect("create");
    client
        .write(&pk, &pk_rows(&pk, 0..50, "a"))
        .await
        .expect("write");
    client.tier(&pk.path).await.expect("tier");
    client
        .write(&pk, &pk_rows(&pk, 0..10, "b"))
        .await
        .expect("upsert");
    let gone = RecordBatch::try_new(
        Arc::new(pk.schema().project(&[0]).expect("id")),
        vec![Arc::new(Int64Array::from_iter_values(40..50))],
    )
    .expect("keys");
    client.delete(&pk, &gone).await.expect("delete");
    let second = client.tier(&pk.path).await.expect("tier");
    assert!(second.delete_files > 0, "{second:?}");
    client
        .write(&pk, &pk_rows(&pk, 50..55, "late"))
        .await
        .expect("upsert");

    let read = engines(&uri, &["read"]);
    assert_eq!(read["namespaces"], serde_json::json!(["test"]), "{read}");
    assert_eq!(
        ids_read(&read, "test.restlog"),
        (0..100).collect::<Vec<_>>()
    );
    assert_eq!(ids_read(&read, "test.foreign"), (0..40).collect::<Vec<_>>());
    assert_eq!(
        read["tables"]["test.foreign"]["snapshot"],
        serde_json::json!(second.snapshot_id.expect("round 2 committed"))
    );

    // pyiceberg appends 5 rows to the log table's lake; mink's next round tiers the 20
    // log rows only, on top of the foreign snapshot.
    let appended = engines(&uri, &["append", "test", "restlog", "1000", "5"]);
    let foreign = appended["snapshot"].as_i64().expect("a snapshot");
    let round = client.tier(&log.path).await.expect("tier after the append");
    assert_eq!(round.rows, 20, "{round:?}");
    let read = engines(&uri, &["read"]);
    let mut expected: Vec<i64> = (0..120).chain(1000..1005).collect();
    expected.sort_unstable();
    assert_eq!(ids_read(&read, "test.restlog"), expected);
    assert_ne!(
        read["tables"]["test.restlog"]["snapshot"],
        serde_json::json!(foreign)
    );

    // A primary-key table takes no foreign data files.
    let refused = engines(&uri, &["refused", "test", "foreign"]);
    let error = refused["error"].as_str().expect("the append was refused");
    assert!(error.contains("primary-key"), "{error}");
    assert_eq!(
        ids_read(&engines(&uri, &["read"]), "test.foreign"),
        (0..40).collect::<Vec<_>>()
    );

    let hostile = engines(&uri, &["hostile"]);
    let answers = &hostile["answers"];
    for (name, status, kind) in [
        ("no token", 401, "NotAuthorizedException"),
        ("made-up token", 401, "NotAuthorizedException"),
        ("wrong secret", 401, "invalid_client"),
        ("other grant", 400, "unsupported_grant_type"),
        ("unknown path", 404, "NotFoundException"),
        ("drop table", 403, "ForbiddenException"),
        ("replace table", 406, "UnsupportedOperationException"),
        ("create in a mink database", 403, "ForbiddenException"),
        ("drop a mink database", 403, "ForbiddenException"),
        ("namespace elsewhere", 400, "BadRequestException"),
        ("namespace escaping", 400, "BadRequestException"),
        ("nested namespace created", 400, "BadRequestException"),
        ("a mink database's namespace", 409, "AlreadyExistsException"),
        ("no such table", 404, "NoSuchTableException"),
        ("no such namespace", 404, "NoSuchNamespaceException"),
        ("nested namespace", 404, "NoSuchNamespaceException"),
        ("not json", 400, "BadRequestException"),
        ("schema change", 403, "ForbiddenException"),
        ("file outside", 403, "ForbiddenException"),
        ("mink's offsets", 403, "ForbiddenException"),
        ("stale requirement", 409, "CommitFailedException"),
        ("huge body", 413, "BadRequestException"),
    ] {
        assert_eq!(
            answers[name],
            serde_json::json!([status, kind]),
            "{name}: {answers}"
        );
    }
    assert_eq!(answers["config afterwards"], serde_json::json!([200, null]));
    // The node and the lake are untouched.
    let read = engines(&uri, &["read"]);
    assert_eq!(ids_read(&read, "test.restlog"), expected);

    // A client's own namespace and table: created, appended to, read, purged, dropped.
    a_guest_table_lives_and_goes(&uri, "test", dir.path());
}

/// pyiceberg creates a namespace and a table of its own through the REST catalog at
/// `uri`, appends to it, reads it, meets every refusal a hosted table has, purges it
/// (no file left under the warehouse `warehouse`) and drops the namespace, leaving the
/// lake with the mink database `database` alone.
pub(crate) fn a_guest_table_lives_and_goes(uri: &str, database: &str, warehouse: &std::path::Path) {
    let guest = engines(uri, &["guest"]);
    assert_eq!(
        guest["ids"],
        serde_json::json!((0..20).collect::<Vec<i64>>())
    );
    assert_eq!(guest["snapshots"], serde_json::json!(2), "{guest}");
    let answers = &guest["answers"];
    for (name, status, kind) in [
        ("location elsewhere", 400, "BadRequestException"),
        ("files elsewhere", 400, "BadRequestException"),
        ("escaping name", 400, "BadRequestException"),
        ("staged create", 406, "UnsupportedOperationException"),
        ("table exists", 409, "AlreadyExistsException"),
        ("namespace exists", 409, "AlreadyExistsException"),
        ("move the table", 403, "ForbiddenException"),
        (
            "drop a namespace with tables",
            409,
            "NamespaceNotEmptyException",
        ),
        ("a manifest list elsewhere", 403, "ForbiddenException"),
    ] {
        assert_eq!(
            answers[name],
            serde_json::json!([status, kind]),
            "{name}: {answers}"
        );
    }
    assert_eq!(
        guest["namespaces"],
        serde_json::json!([database]),
        "{guest}"
    );
    let location = guest["location"].as_str().expect("location");
    assert!(
        location.starts_with(&warehouse.display().to_string()),
        "{location}"
    );
    assert_eq!(files_under(std::path::Path::new(location)), 0, "purged");
}

/// How many files lie under `dir` (none if it does not exist).
fn files_under(dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .map(|entry| entry.expect("entry").path())
        .map(|path| match path.is_dir() {
            true => files_under(&path),
            false => 1,
        })
        .sum()
}

#[test]
fn an_open_rest_catalog_needs_a_login() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ok, _, stderr) = run_server(dir.path(), &["--iceberg-rest-listen", "0.0.0.0:0"], &[]);
    assert!(!ok, "an open catalog without a login must not start");
    assert!(
        stderr.contains("the Iceberg REST catalog") && stderr.contains("without authentication"),
        "{stderr}"
    );
}

#[test]
fn a_connection_that_sends_nothing_is_let_go() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Instant;

    let dir = tempfile::tempdir().expect("tempdir");
    let server =
        ServerProcess::start_with(dir.path(), &["--iceberg-rest-listen", "127.0.0.1:0"], &[]);
    let addr = server.iceberg_rest_addr.clone().expect("REST");
    let mut idle = TcpStream::connect(&addr).expect("connect");
    idle.set_read_timeout(Some(Duration::from_secs(90)))
        .expect("read timeout");
    let started = Instant::now();
    let mut buffer = [0; 64];
    // Closed by the first-bytes deadline every port has (10 s; the header-read timeout,
    // 30 s, for a client that sent part of a request), not by this side's 90 s.
    let read = idle.read(&mut buffer);
    let waited = started.elapsed();
    assert!(
        matches!(read, Ok(0)) || read.is_err() && waited < Duration::from_secs(80),
        "{read:?} after {waited:?}"
    );
    assert!(
        waited >= mink_auth::FIRST_BYTES_TIMEOUT - Duration::from_secs(1),
        "closed after {waited:?}"
    );
    // The catalog still answers.
    let mut client = TcpStream::connect(&addr).expect("connect");
    client
        .write_all(b"GET /v1/config HTTP/1.1\r\nHost: mink\r\nConnection: close\r\n\r\n")
        .expect("request");
    let mut answer = String::new();
    client.read_to_string(&mut answer).expect("answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}
