//! The Iceberg REST catalog's answers to what does not exist, over raw HTTP to the real
//! server's `--iceberg-rest-listen` port, against the spec's error model and the errors it
//! documents per route (issue 49).
//!
//! - A table of a namespace that does not exist, or has several levels (`test%1Fevents`),
//!   is a missing table on every table route (load, `HEAD`, commit, drop, metrics):
//!   `404 NoSuchTableException`, so Iceberg's Java client (Spark's, Trino's) falls back to
//!   the metadata table `test.events.snapshots`. Spark and Trino do not run here (no
//!   Maven): this asserts the answers their client acts on, not the engines.
//! - The routes of a namespace (load, `HEAD`, drop, list and create tables, list
//!   namespaces under it, list views) answer a missing one `404 NoSuchNamespaceException`.
//! - The spec's routes mink does not serve: no views (`404 NoSuchViewException`), `406
//!   UnsupportedOperationException` for renames and the rest; an unknown path stays `404
//!   NotFoundException`.
//! - Every error body is `{"error": {"message", "type", "code"}}` with the status as code.

use serde_json::{Value, json};

use crate::hostile_lake_commits::{http, rest_token, tiered_table};
use crate::iceberg_rest::rest_server;

/// The table the requests are about (a tiered log table of the mink database `test`).
const TABLE: &str = "/v1/namespaces/test/tables/events";

/// What the REST port answered a request: its status and, for an error, its type (checked
/// to be in the spec's error model with the status as its code).
async fn answer(addr: &str, token: &str, method: &str, path: &str, body: &str) -> (u16, Value) {
    let (status, text) = http(addr, method, path, Some(token), body).await;
    if status < 400 || method == "HEAD" {
        assert!(
            method != "HEAD" || text.is_empty(),
            "{method} {path}: {text}"
        );
        return (status, Value::Null);
    }
    let answer: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}"));
    let error = answer["error"]
        .as_object()
        .unwrap_or_else(|| panic!("{method} {path}: no error object: {answer}"));
    let mut keys: Vec<_> = error.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["code", "message", "type"],
        "{method} {path}: {answer}"
    );
    assert_eq!(error["code"], json!(status), "{method} {path}: {answer}");
    assert!(
        !error["message"].as_str().unwrap_or_default().is_empty(),
        "{method} {path}: {answer}"
    );
    (status, error["type"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_namespaces_and_tables_answer_as_the_spec_documents() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, client, _uri) = rest_server(dir.path()).await;
    let addr = server.iceberg_rest_addr.clone().expect("REST");
    tiered_table(&client, "events").await;
    let token = rest_token(&addr).await;
    let commit = r#"{"requirements": [], "updates": []}"#;
    let create = r#"{"name": "t", "schema": {"type": "struct", "schema-id": 0, "fields": []}}"#;

    let no_table = json!("NoSuchTableException");
    let no_namespace = json!("NoSuchNamespaceException");
    let no_view = json!("NoSuchViewException");
    let unsupported = json!("UnsupportedOperationException");
    let cases: Vec<(&str, String, &str, u16, Value)> = vec![
        // The table itself, for comparison.
        ("GET", TABLE.into(), "", 200, Value::Null),
        ("HEAD", TABLE.into(), "", 204, Value::Null),
        // Spark's `mink.test.events.snapshots`: table `snapshots` of namespace
        // `test.events` first; only NoSuchTableException makes the client load the
        // metadata table of `test.events` next.
        (
            "GET",
            "/v1/namespaces/test%1Fevents/tables/snapshots".into(),
            "",
            404,
            no_table.clone(),
        ),
        (
            "HEAD",
            "/v1/namespaces/test%1Fevents/tables/snapshots".into(),
            "",
            404,
            Value::Null,
        ),
        // Every route of one table, in a namespace that does not exist, of several
        // levels, or for a table that does not exist.
        (
            "GET",
            "/v1/namespaces/nothing/tables/events".into(),
            "",
            404,
            no_table.clone(),
        ),
        (
            "HEAD",
            "/v1/namespaces/nothing/tables/events".into(),
            "",
            404,
            Value::Null,
        ),
        (
            "GET",
            "/v1/namespaces/test/tables/nothing".into(),
            "",
            404,
            no_table.clone(),
        ),
        (
            "POST",
            "/v1/namespaces/nothing/tables/events".into(),
            commit,
            404,
            no_table.clone(),
        ),
        (
            "POST",
            "/v1/namespaces/test%1Fevents/tables/snapshots".into(),
            commit,
            404,
            no_table.clone(),
        ),
        (
            "POST",
            "/v1/namespaces/test/tables/nothing".into(),
            commit,
            404,
            no_table.clone(),
        ),
        (
            "DELETE",
            "/v1/namespaces/nothing/tables/events".into(),
            "",
            404,
            no_table.clone(),
        ),
        (
            "DELETE",
            "/v1/namespaces/test%1Fevents/tables/snapshots".into(),
            "",
            404,
            no_table.clone(),
        ),
        // A missing table of a mink database is missing before it is mink's.
        (
            "DELETE",
            "/v1/namespaces/test/tables/nothing".into(),
            "",
            404,
            no_table.clone(),
        ),
        ("DELETE", TABLE.into(), "", 403, json!("ForbiddenException")),
        // The routes of a namespace.
        (
            "GET",
            "/v1/namespaces/nothing".into(),
            "",
            404,
            no_namespace.clone(),
        ),
        (
            "GET",
            "/v1/namespaces/test%1Fevents".into(),
            "",
            404,
            no_namespace.clone(),
        ),
        (
            "HEAD",
            "/v1/namespaces/nothing".into(),
            "",
            404,
            Value::Null,
        ),
        ("HEAD", "/v1/namespaces/test".into(), "", 204, Value::Null),
        (
            "DELETE",
            "/v1/namespaces/nothing".into(),
            "",
            404,
            no_namespace.clone(),
        ),
        (
            "GET",
            "/v1/namespaces/nothing/tables".into(),
            "",
            404,
            no_namespace.clone(),
        ),
        (
            "GET",
            "/v1/namespaces/test%1Fevents/tables".into(),
            "",
            404,
            no_namespace.clone(),
        ),
        (
            "POST",
            "/v1/namespaces/nothing/tables".into(),
            create,
            404,
            no_namespace.clone(),
        ),
        (
            "GET",
            "/v1/namespaces?parent=nothing".into(),
            "",
            404,
            no_namespace.clone(),
        ),
        (
            "GET",
            "/v1/namespaces?parent=test%1Fevents".into(),
            "",
            404,
            no_namespace.clone(),
        ),
        // Views: none in any namespace.
        (
            "GET",
            "/v1/namespaces/test/views/events".into(),
            "",
            404,
            no_view.clone(),
        ),
        (
            "GET",
            "/v1/namespaces/test%1Fevents/views/snapshots".into(),
            "",
            404,
            no_view.clone(),
        ),
        (
            "HEAD",
            "/v1/namespaces/test/views/events".into(),
            "",
            404,
            Value::Null,
        ),
        (
            "DELETE",
            "/v1/namespaces/test/views/events".into(),
            "",
            404,
            no_view,
        ),
        (
            "GET",
            "/v1/namespaces/nothing/views".into(),
            "",
            404,
            no_namespace,
        ),
        // A scan's metrics report is taken for a table that exists.
        ("POST", format!("{TABLE}/metrics"), "{}", 204, Value::Null),
        (
            "POST",
            "/v1/namespaces/nothing/tables/events/metrics".into(),
            "{}",
            404,
            no_table,
        ),
        // The spec's routes mink does not serve.
        (
            "POST",
            "/v1/tables/rename".into(),
            r#"{"source": {"namespace": ["test"], "name": "events"},
                "destination": {"namespace": ["test"], "name": "renamed"}}"#,
            406,
            unsupported.clone(),
        ),
        (
            "POST",
            "/v1/namespaces/test/register".into(),
            r#"{"name": "t", "metadata-location": "/tmp/m.json"}"#,
            406,
            unsupported.clone(),
        ),
        (
            "POST",
            "/v1/namespaces/test/properties".into(),
            r#"{"removals": [], "updates": {"a": "b"}}"#,
            406,
            unsupported.clone(),
        ),
        (
            "POST",
            "/v1/transactions/commit".into(),
            r#"{"table-changes": []}"#,
            406,
            unsupported.clone(),
        ),
        (
            "POST",
            "/v1/namespaces/test/views".into(),
            "{}",
            406,
            unsupported.clone(),
        ),
        (
            "POST",
            format!("{TABLE}/plan"),
            "{}",
            406,
            unsupported.clone(),
        ),
        (
            "GET",
            format!("{TABLE}/credentials"),
            "",
            406,
            unsupported.clone(),
        ),
        // Another method of a served path, and a path of no route.
        ("PUT", TABLE.into(), "{}", 406, unsupported),
        (
            "GET",
            "/v1/nothing".into(),
            "",
            404,
            json!("NotFoundException"),
        ),
    ];
    let mut wrong = Vec::new();
    for (method, path, body, status, kind) in cases {
        let got = answer(&addr, &token, method, &path, body).await;
        if got != (status, kind.clone()) {
            wrong.push(format!(
                "{method} {path}: {got:?}, expected {:?}",
                (status, kind)
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // Listings: a namespace holds no namespaces and no views; no parent lists them all.
    for (path, expected) in [
        ("/v1/namespaces?parent=test", json!({"namespaces": []})),
        ("/v1/namespaces?parent=", json!({"namespaces": [["test"]]})),
        ("/v1/namespaces", json!({"namespaces": [["test"]]})),
        ("/v1/namespaces/test/views", json!({"identifiers": []})),
        (
            "/v1/namespaces/test/tables",
            json!({"identifiers": [{"namespace": ["test"], "name": "events"}]}),
        ),
    ] {
        let (status, body) = http(&addr, "GET", path, Some(&token), "").await;
        assert_eq!(status, 200, "{path}: {body}");
        let body: Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(body, expected, "{path}");
    }
    // The table is still there and mink's: the failed requests changed nothing.
    let (status, body) = http(&addr, "GET", TABLE, Some(&token), "").await;
    assert_eq!(status, 200, "{body}");
}
