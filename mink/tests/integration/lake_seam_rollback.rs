//! A lake catalog that lost its last commit while `meta.db` kept its record (issue 48):
//! the real `mink server` restarted over a `catalog.db` put back as it was one round
//! earlier, as a SQLite catalog whose commit was not durable comes back after a power cut.
//! The start goes back to what the lake holds: reads plan on a snapshot the lake has and
//! read every row once, the next round tiers the lost rows again (once), and pyiceberg and
//! `mink sql --data-dir` read the catalog (a SQLite database in WAL mode) beside it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use mink_client::MinkClient;
use mink_core::protocol::{BucketId, TierReply};
use mink_core::table::{TableDescriptor, TablePath};

use crate::process::{ServerProcess, run_mink, run_sql};
use crate::python::python;
use crate::support::{events, events_table, first_column_ids, lake_options};

/// The files of the embedded catalog: the database and its write-ahead log and index.
fn catalog_files(dir: &Path) -> Vec<PathBuf> {
    ["catalog.db", "catalog.db-wal", "catalog.db-shm"]
        .iter()
        .map(|name| dir.join("lake").join(name))
        .collect()
}

/// Copies the catalog's files of the (stopped) server's data directory into `aside`.
fn save_catalog(data_dir: &Path, aside: &Path) {
    for file in catalog_files(data_dir) {
        if file.exists() {
            let name = file.file_name().expect("a name");
            std::fs::copy(&file, aside.join(name)).expect("save the catalog");
        }
    }
}

/// Puts the catalog saved in `aside` back, its later files gone.
fn restore_catalog(data_dir: &Path, aside: &Path) {
    for file in catalog_files(data_dir) {
        let saved = aside.join(file.file_name().expect("a name"));
        match saved.exists() {
            true => std::fs::copy(&saved, &file).map(|_| ()),
            false => std::fs::remove_file(&file).or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            }),
        }
        .expect("restore the catalog");
    }
}

/// `test.kv (id BIGINT, name STRING, PRIMARY KEY (id))`, two buckets, with a lake whose
/// rounds the test runs.
fn kv_table() -> TableDescriptor {
    let mut table = crate::lake_foreign::table();
    table.path = TablePath::new("test", "kv");
    table
}

/// `(id, name)` rows of `ids`, each named `name`.
fn kv_rows(table: &TableDescriptor, ids: std::ops::Range<i64>, name: &str) -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(ids.clone())),
        Arc::new(StringArray::from_iter_values(ids.map(|_| name))),
    ];
    RecordBatch::try_new(Arc::clone(table.schema()), columns).expect("rows")
}

/// Writes the rows `ids` to `lg` (a log table) and `keys` named `name` to `kv` (a
/// primary-key table).
async fn write(
    client: &MinkClient,
    (lg, kv): (&TableDescriptor, &TableDescriptor),
    ids: std::ops::Range<i64>,
    keys: std::ops::Range<i64>,
    name: &str,
) {
    let ids: Vec<i64> = ids.collect();
    client.write(lg, &events(lg, &ids)).await.expect("write");
    let rows = kv_rows(kv, keys, name);
    client.write(kv, &rows).await.expect("upsert");
}

/// A round of both tables; `lg`'s report.
async fn tier(client: &MinkClient, (lg, kv): (&TableDescriptor, &TableDescriptor)) -> TierReply {
    client.tier(&kv.path).await.expect("tier");
    client.tier(&lg.path).await.expect("tier")
}

/// The CSV lines (`id,name`) `mink sql` prints for the state of `test.kv`: 0..10 `c`,
/// 10..25 `a`, 25..75 `b`.
fn kv_expected() -> Vec<String> {
    let value = |id| match id {
        0..10 => "c",
        10..25 => "a",
        _ => "b",
    };
    (0..75).map(|id| format!("{id},{}", value(id))).collect()
}

/// The rows `statement` answers through `mink sql`, without the header.
fn sql_lines(address: &str, statement: &str) -> Vec<String> {
    let (ok, stdout, stderr) = run_sql(address, statement);
    assert!(ok, "{statement}: {stderr}");
    stdout.lines().skip(1).map(str::to_string).collect()
}

/// Every id the union reads of `table`'s buckets answer, sorted: each row once.
async fn union_ids(client: &MinkClient, table: &TableDescriptor) -> Vec<i64> {
    let mut ids = Vec::new();
    for bucket in 0..table.bucket_num {
        let answer = client
            .union(&BucketId::new(&table.path, bucket), &[0], &[])
            .await
            .expect("union");
        ids.extend(first_column_ids(&answer.batches));
    }
    ids.sort_unstable();
    ids
}

/// The ids the lake alone holds of `table`, sorted.
async fn lake_ids(client: &MinkClient, table: &TableDescriptor) -> Vec<i64> {
    let batches = client
        .lake(&table.path, None, None, &[0], &[])
        .await
        .expect("lake");
    let mut ids = first_column_ids(&batches);
    ids.sort_unstable();
    ids
}

/// The snapshot every bucket of `table` plans its union reads on.
async fn recorded_snapshot(client: &MinkClient, table: &TablePath) -> Option<i64> {
    let buckets = client.list_buckets(table).await.expect("buckets");
    let snapshot = buckets[0].lake_snapshot_id;
    assert!(buckets.iter().all(|b| b.lake_snapshot_id == snapshot));
    snapshot
}

/// `read_lake_rows.py` of `test.lg`: the current snapshot's rows as pyiceberg reads them
/// through the catalog, the server running.
fn pyiceberg_lines(data_dir: &Path) -> Vec<String> {
    let output = Command::new(python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/read_lake_rows.py"
        ))
        .arg(data_dir)
        .args(["test", "lg"])
        .output()
        .expect("run python");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "pyiceberg failed: {stderr}");
    let answer = String::from_utf8_lossy(&output.stdout);
    answer.lines().skip(2).map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalog_that_lost_its_last_commit_is_tiered_again_from_the_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    let aside = tempfile::tempdir().expect("temp dir");
    let data_dir = dir.path();
    let server = ServerProcess::start(data_dir);
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    let lg = client
        .create_table(&events_table("lg", 2, lake_options()), false)
        .await
        .expect("create");
    let kv = client.create_table(&kv_table(), false).await.expect("kv");
    let tables = (&lg, &kv);
    write(&client, tables, 0..100, 0..50, "a").await;
    let kept = tier(&client, tables).await;
    assert_eq!(kept.rows, 100);

    // The catalog as it is after the first round, then a second round it will lose.
    server.kill();
    save_catalog(data_dir, aside.path());
    let server = ServerProcess::start(data_dir);
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    write(&client, tables, 100..250, 25..75, "b").await;
    assert_eq!(tier(&client, tables).await.rows, 150);
    // Rows only the log holds.
    write(&client, tables, 250..300, 0..10, "c").await;
    server.kill();

    // The catalog loses the second round; meta.db keeps its record.
    restore_catalog(data_dir, aside.path());
    let server = ServerProcess::start(data_dir);
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    // From the first call on (the start checks the lake's records before it serves),
    // reads plan on the snapshot the lake has, and read every row once.
    assert_eq!(recorded_snapshot(&client, &lg.path).await, kept.snapshot_id);
    let all: Vec<i64> = (0..300).collect();
    assert_eq!(union_ids(&client, &lg).await, all, "union: every row once");
    assert_eq!(
        lake_ids(&client, &lg).await,
        (0..100).collect::<Vec<_>>(),
        "the lake: the first round's rows"
    );
    let counts = "SELECT count(*), count(DISTINCT id) FROM test.lg";
    assert_eq!(sql_lines(&server.sql_addr, counts), ["300,300"]);
    let kv_state = "SELECT id, name FROM test.kv ORDER BY id";
    assert_eq!(sql_lines(&server.sql_addr, kv_state), kv_expected());

    // The next round tiers what the lake lost again, once.
    let again = tier(&client, tables).await;
    assert_eq!(again.rows, 200, "{again:?}");
    assert_eq!(
        lake_ids(&client, &lg).await,
        all,
        "the lake: every row once"
    );
    assert_eq!(union_ids(&client, &lg).await, all);
    let kv_lake = "SELECT id, name FROM test.\"kv$lake\" ORDER BY id";
    assert_eq!(sql_lines(&server.sql_addr, kv_lake), kv_expected());
    assert_eq!(sql_lines(&server.sql_addr, kv_state), kv_expected());
    // pyiceberg reads the catalog in WAL mode while the server runs.
    let expected: Vec<String> = {
        let mut lines: Vec<String> = (0..300)
            .map(|id| format!("[{id}, \"event-{id}\"]"))
            .collect();
        lines.sort();
        lines
    };
    assert_eq!(pyiceberg_lines(data_dir), expected);
    server.kill();

    // A second process on the data directory opens the same catalog.
    let data = data_dir.display().to_string();
    let statement = "SELECT count(*), count(DISTINCT id) FROM test.lg";
    let args = [
        "sql",
        "--data-dir",
        &data,
        "--format",
        "csv",
        "-e",
        statement,
    ];
    let (ok, stdout, stderr) = run_mink(&args);
    assert!(ok, "{stderr}");
    assert_eq!(stdout.lines().last(), Some("300,300"), "{stdout}");
}
