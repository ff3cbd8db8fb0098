//! Primary keys too long for the KV store (issue 47), refused on every write path, and
//! what a write answered with an error means once its group is in the log.
//!
//! The KV store cannot keep a key of more than 65 535 bytes; a 70 000-byte key used to be
//! logged, then failed every flush of its bucket, and writes answered with that failure
//! came back after a restart. Against the real `mink server`: a 70 000-byte key written
//! through Flight SQL (an INSERT and a bulk ingest, over ADBC), through `mink sql`'s
//! INSERT and through DoPut is refused with `INVALID_ARGUMENT` naming the bound
//! (`MAX_KEY_BYTES`), and nothing of its write is stored; the longest key that fits is
//! written, updated, looked up and scanned. Megabytes more of upserts into the bucket,
//! keys near the bound among them, go through several flushes of a small write buffer;
//! before and after a `kill -9` and a restart, the table holds exactly what was
//! acknowledged (a model).

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::Int64Type;
use mink_client::MinkClient;
use mink_core::key::{KeyCodec, MAX_KEY_BYTES};
use mink_core::protocol::BucketId;
use mink_core::table::TableDescriptor;
use tonic::Code;

use crate::process::{ServerProcess, run_sql};
use crate::python::python;

/// The key of the issue: too long for the KV store.
const LONG_KEY: usize = 70_000;
/// The table the test writes, created through Flight SQL.
const TABLE: &str = "long_keys";
/// A write buffer that flushes a tablet every 512 KiB (an eighth of it).
const WRITE_BUFFER: &str = "4MiB";

/// The table's rows, as acknowledged: key -> v.
type Model = BTreeMap<String, i64>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_keys_are_refused_on_every_write_path_and_acknowledged_rows_survive_flushes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let args = ["--kv-write-buffer", WRITE_BUFFER];
    let mut server = ServerProcess::start_with(dir.path(), &args, &[]);
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    let fits = longest_fitting_key(&probe_table());

    flight_sql_refuses_long_keys(&server, fits);
    let table = created_table(&client).await;
    let mut model = Model::from([("y".repeat(fits), 2)]);

    mink_sql_and_doput_refuse_long_keys(&server, &client, &table).await;
    key_lookups_find_only_keys_that_fit(&client, &table, fits).await;

    upsert_megabytes(&client, &table, fits, &mut model).await;
    assert_eq!(snapshot(&client, &table).await, model, "before the restart");
    assert_eq!(sql_summary(&server.addr), summary(&model));

    assert!(server.is_running(), "the server survived every flush");
    server.kill();
    let server = ServerProcess::start_with(dir.path(), &args, &[]);
    let client = MinkClient::connect(&server.addr).await.expect("reconnect");
    assert_eq!(snapshot(&client, &table).await, model, "after kill -9");
    assert_eq!(sql_summary(&server.addr), summary(&model));
    let more = [("after".to_string(), 7)];
    client
        .write(&table, &rows(&table, &more))
        .await
        .expect("a write after the restart");
    model.extend(more);
    assert_eq!(snapshot(&client, &table).await, model, "written after");
}

/// `mink sql`'s INSERT (its engine in the client, writing over DoPut) and a DoPut of a
/// batch holding one long key among others: each refused whole, naming the bound.
async fn mink_sql_and_doput_refuse_long_keys(
    server: &ServerProcess,
    client: &MinkClient,
    table: &TableDescriptor,
) {
    let (ok, _, stderr) = run_sql(
        &server.addr,
        &format!("INSERT INTO {TABLE} VALUES (repeat('x', {LONG_KEY}), 1)"),
    );
    assert!(
        !ok && stderr.contains("MAX_KEY_BYTES"),
        "mink sql: {stderr}"
    );

    // DoPut: a batch holding one long key is refused whole.
    let refused = client
        .write(
            table,
            &rows(table, &[("short".into(), 1), ("x".repeat(LONG_KEY), 2)]),
        )
        .await
        .expect_err("a long key through DoPut");
    assert_eq!(refused.code(), Some(Code::InvalidArgument), "{refused}");
    assert!(refused.to_string().contains("row 1"), "{refused}");
    assert!(refused.to_string().contains("MAX_KEY_BYTES"), "{refused}");
}

/// A lookup of a key no write may store finds nothing (and reads no file); the longest
/// key that fits is found, as updated through Flight SQL.
async fn key_lookups_find_only_keys_that_fit(
    client: &MinkClient,
    table: &TableDescriptor,
    fits: usize,
) {
    let found = client
        .lookup(table, &keys(table, &["x".repeat(LONG_KEY)]), &[])
        .await
        .expect("lookup of a long key");
    assert_eq!(found.rows.num_rows(), 0);
    let found = client
        .lookup(table, &keys(table, &["y".repeat(fits)]), &[])
        .await
        .expect("lookup of the longest key");
    assert_eq!(values(&found.rows), [2], "the key at the bound, updated");
}

/// The table `long_keys.py` created, as the node describes it.
async fn created_table(client: &MinkClient) -> TableDescriptor {
    let tables = client.list_tables(None).await.expect("list tables");
    let path = tables
        .iter()
        .find(|path| path.name == TABLE)
        .expect("created");
    client.describe_table(path).await.expect("describe")
}

/// `k VARCHAR NOT NULL, v BIGINT, PRIMARY KEY (k)`, as `long_keys.py` creates it: the
/// key's encoding, before the table exists.
fn probe_table() -> TableDescriptor {
    use arrow::datatypes::{DataType, Field, Schema};
    let schema = Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("v", DataType::Int64, true),
    ]);
    let path = mink_core::table::TablePath::new("default", TABLE);
    let options = mink_core::options::TableOptions::default();
    TableDescriptor::new(path, schema, vec!["k".into()], vec![], options).expect("table")
}

/// The most characters a key of the table may have: its encoded key is at most
/// [`MAX_KEY_BYTES`], one character more is not.
fn longest_fitting_key(table: &TableDescriptor) -> usize {
    let codec = KeyCodec::new(table).expect("codec");
    let encoded = |len: usize| {
        let keys = codec
            .encode(&keys(table, &["y".repeat(len)]))
            .expect("encode");
        keys.row(0).as_ref().len()
    };
    let (mut fits, mut too_long) = (0, MAX_KEY_BYTES);
    while too_long - fits > 1 {
        let middle = (fits + too_long) / 2;
        match encoded(middle) <= MAX_KEY_BYTES {
            true => fits = middle,
            false => too_long = middle,
        }
    }
    fits
}

/// `long_keys.py`: the table created, a long key refused through an INSERT and through
/// bulk ingest, the key of `fits` characters inserted and updated.
fn flight_sql_refuses_long_keys(server: &ServerProcess, fits: usize) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/long_keys.py");
    let output = Command::new(python())
        .arg(script)
        .arg(server.sql_uri())
        .arg(TABLE)
        .arg(LONG_KEY.to_string())
        .arg(fits.to_string())
        .output()
        .expect("run python");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "long_keys.py failed: {stderr}");
    let answer = String::from_utf8_lossy(&output.stdout);
    let errors: serde_json::Value = serde_json::from_str(answer.trim()).expect("json");
    for path in ["insert", "ingest"] {
        let message = errors[path].as_str().expect("a message");
        assert!(message.contains("INVALID_ARGUMENT"), "{path}: {message}");
    }
}

/// Upserts a few megabytes into the table's one bucket, acknowledged ones into `model`:
/// 1 KiB keys, some written twice, and keys within a few bytes of the bound.
async fn upsert_megabytes(
    client: &MinkClient,
    table: &TableDescriptor,
    fits: usize,
    model: &mut Model,
) {
    for round in 0..6_i64 {
        let mut batch: Vec<(String, i64)> = (0..500)
            .map(|i| (format!("{:01024}", (round * 400 + i) % 2_600), round))
            .collect();
        let near_bound = (0..8).map(|i| ("z".repeat(fits - (round * 8 + i) as usize), round));
        batch.extend(near_bound);
        client
            .write(table, &rows(table, &batch))
            .await
            .expect("upsert");
        model.extend(batch);
    }
}

/// Every row of the table's bucket, from a Snapshot (the KV store).
async fn snapshot(client: &MinkClient, table: &TableDescriptor) -> Model {
    let bucket = BucketId {
        table: table.path.to_string(),
        partition: None,
        bucket: 0,
    };
    let answer = client.snapshot(&bucket, &[], 0).await.expect("snapshot");
    let mut read = Model::new();
    for batch in &answer.batches {
        let keys = batch.column(0).as_string::<i32>();
        let values = batch.column(1).as_primitive::<Int64Type>();
        for row in 0..batch.num_rows() {
            read.insert(keys.value(row).to_string(), values.value(row));
        }
    }
    read
}

/// `count, sum(v), max(length(k))` of the model, as `mink sql --format csv` prints it.
fn summary(model: &Model) -> String {
    let sum: i64 = model.values().sum();
    let longest = model.keys().map(String::len).max().unwrap_or(0);
    format!("{},{sum},{longest}", model.len())
}

/// [`summary`] of the table, read by `mink sql` (a union read of the log).
fn sql_summary(addr: &str) -> String {
    let statement = format!("SELECT count(*), sum(v), max(length(k)) FROM {TABLE}");
    let (ok, stdout, stderr) = run_sql(addr, &statement);
    assert!(ok, "{stderr}");
    stdout.lines().last().expect("a row").trim().to_string()
}

/// A batch of the table's rows.
fn rows(table: &TableDescriptor, rows: &[(String, i64)]) -> RecordBatch {
    let keys = StringArray::from_iter_values(rows.iter().map(|(k, _)| k));
    let values = Int64Array::from_iter_values(rows.iter().map(|(_, v)| *v));
    let columns: Vec<ArrayRef> = vec![Arc::new(keys), Arc::new(values)];
    RecordBatch::try_new(Arc::clone(table.schema()), columns).expect("rows")
}

/// A batch of keys of the table.
fn keys(table: &TableDescriptor, keys: &[String]) -> RecordBatch {
    rows(
        table,
        &keys.iter().map(|k| (k.clone(), 0)).collect::<Vec<_>>(),
    )
}

/// The `v` of each row found.
fn values(rows: &RecordBatch) -> Vec<i64> {
    rows.column(1).as_primitive::<Int64Type>().values().to_vec()
}
