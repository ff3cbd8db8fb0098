//! A mink server whose lake lives in another one's Iceberg REST catalog (`--lake-catalog
//! rest:URL`, over TLS with a private certificate authority, `MINK_LAKE_CATALOG_CA`): its tables in a namespace of their own, every tiering round, manifest merge
//! and expiry committed through the catalog, union reads exact against a model, other
//! engines reading its lake through the same catalog, a restart of the catalog (its tokens
//! gone) taken in stride, and its data directory remembering the catalog. And two lakes committing to one table at once: one wins, the other gets a
//! clean conflict, and the table holds exactly the winners' snapshots.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use mink_client::MinkClient;
use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::commit::{SnapshotChanges, commit_snapshot};
use mink_lake::{Lake, LakeConfig, LakeError, Operation};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::iceberg_rest::{PASSWORD, USER, engines_with, ids_read};
use crate::process::{ServerProcess, run_mink_with, run_server, run_sql};
use crate::support::{lake_options, seed};

const BUCKETS: u32 = 2;

/// `(id BIGINT, name STRING, PRIMARY KEY (id))` in two buckets, tiered on demand, its
/// snapshots expirable as soon as they are replaced.
fn kv_table(path: TablePath) -> TableDescriptor {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]);
    let options = TableOptions {
        bucket_num: BUCKETS,
        lake_properties: BTreeMap::from([(
            "history.expire.max-snapshot-age-ms".to_string(),
            "1".to_string(),
        )]),
        ..lake_options()
    };
    TableDescriptor::new(path, schema, vec!["id".into()], vec![], options).expect("table")
}

fn rows(table: &TableDescriptor, rows: &BTreeMap<i64, String>) -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(rows.keys().copied())),
        Arc::new(StringArray::from_iter_values(rows.values())),
    ];
    RecordBatch::try_new(Arc::clone(table.schema()), columns).expect("batch")
}

fn keys(table: &TableDescriptor, keys: &BTreeSet<i64>) -> RecordBatch {
    RecordBatch::try_new(
        Arc::new(table.schema().project(&[0]).expect("id")),
        vec![Arc::new(Int64Array::from_iter_values(keys.iter().copied()))],
    )
    .expect("keys")
}

/// Every bucket's union read, as `id -> name`.
async fn union_read(client: &MinkClient, table: &TableDescriptor) -> BTreeMap<i64, String> {
    let mut read = BTreeMap::new();
    for bucket in 0..BUCKETS {
        let answer = client
            .union(&BucketId::new(&table.path, bucket), &[0, 1], &[])
            .await
            .expect("union");
        for batch in &answer.batches {
            let ids = batch.column(0).as_primitive::<Int64Type>();
            let names = batch.column(1).as_string::<i32>();
            for row in 0..batch.num_rows() {
                let earlier = read.insert(ids.value(row), names.value(row).to_string());
                assert!(earlier.is_none(), "key {} read twice", ids.value(row));
            }
        }
    }
    read
}

/// `mink sql --connect ADDRESS -e STATEMENT`, which must succeed; its CSV output.
fn sql(address: &str, statement: &str) -> String {
    let (ok, stdout, stderr) = run_sql(address, statement);
    assert!(ok, "{statement}: {stderr}");
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_keeps_its_lake_in_the_first_ones_catalog() {
    let seed = seed("a_second_server_keeps_its_lake_in_the_first_ones_catalog");
    let mut rng = StdRng::seed_from_u64(seed);
    let first_dir = tempfile::tempdir().expect("tempdir");
    let second_dir = tempfile::tempdir().expect("tempdir");
    // A fixed port, so that the catalog can restart where the second server expects it.
    let rest_addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .to_string();
    // Over TLS, with a certificate a private authority signed.
    let tls = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tls");
    let (cert, key, ca) = (
        tls.join("server.pem").display().to_string(),
        tls.join("server.key").display().to_string(),
        tls.join("ca.pem").display().to_string(),
    );
    let start_first = || {
        ServerProcess::start_with(
            first_dir.path(),
            &[
                "--iceberg-rest-listen",
                &rest_addr,
                "--sql-tls-cert",
                &cert,
                "--sql-tls-key",
                &key,
            ],
            &[("MINK_SQL_USER", USER), ("MINK_SQL_PASSWORD", PASSWORD)],
        )
    };
    let mut first = start_first();
    let uri = format!("https://{rest_addr}");
    let catalog = format!("rest:{uri}");
    // Both servers on one machine: the second reaches the first's warehouse directly.
    let warehouse = first_dir
        .path()
        .join("lake/warehouse")
        .display()
        .to_string();
    let credential = format!("{USER}:{PASSWORD}");
    let lake_login = [
        ("MINK_LAKE_CATALOG_CREDENTIAL", credential.as_str()),
        ("MINK_LAKE_CATALOG_CA", ca.as_str()),
    ];
    let second = ServerProcess::start_with(
        second_dir.path(),
        &["--lake-catalog", &catalog, "--lake-warehouse", &warehouse],
        &lake_login,
    );
    let client = MinkClient::connect(&second.addr).await.expect("connect");
    let table = client
        .create_table(&kv_table(TablePath::new("second", "kv")), false)
        .await
        .expect("create");

    // Rounds of random upserts and deletes, each tiered through the first server's catalog.
    let mut model = BTreeMap::new();
    let mut last_round = None;
    for round in 0..5 {
        if round == 3 {
            // The catalog restarts: every token it issued is gone, and the second server
            // logs in again on its next call.
            first.kill();
            first = start_first();
        }
        let upserts: BTreeMap<i64, String> = (0..30)
            .map(|_| {
                let id = rng.random_range(0..100);
                (id, format!("r{round}-{id}"))
            })
            .collect();
        client
            .write(&table, &rows(&table, &upserts))
            .await
            .expect("upsert");
        model.extend(upserts);
        let gone: BTreeSet<i64> = (0..5).map(|_| rng.random_range(0..100)).collect();
        client
            .delete(&table, &keys(&table, &gone))
            .await
            .expect("delete");
        model.retain(|id, _| !gone.contains(id));
        let report = client.tier(&table.path).await.expect("tier");
        last_round = report.snapshot_id.or(last_round);
        assert_eq!(
            union_read(&client, &table).await,
            model,
            "seed {seed}, round {round}"
        );
    }
    let tiered = model.clone();
    // Later upserts stay in the log: the union read shows them, the lake does not.
    let late: BTreeMap<i64, String> = (100..105).map(|id| (id, format!("late-{id}"))).collect();
    client
        .write(&table, &rows(&table, &late))
        .await
        .expect("upsert");
    model.extend(late);
    assert_eq!(union_read(&client, &table).await, model, "seed {seed}");

    // Other engines read the second server's lake through the first one's catalog: its
    // last round, in a namespace of its own.
    let read = engines_with(&uri, &["read"], &[("MINK_TEST_CA", &ca)]);
    assert_eq!(read["namespaces"], serde_json::json!(["second"]), "{read}");
    assert_eq!(
        ids_read(&read, "second.kv"),
        tiered.keys().copied().collect::<Vec<_>>(),
        "seed {seed}"
    );
    assert_eq!(
        read["tables"]["second.kv"]["snapshot"],
        serde_json::json!(last_round.expect("a round committed"))
    );

    // Upkeep commits through the catalog too: merged manifests, expired snapshots.
    sql(&second.addr, "CALL system.rewrite_manifests('second.kv')");
    sql(&second.addr, "CALL system.expire_snapshots('second.kv')");
    assert_eq!(union_read(&client, &table).await, model, "seed {seed}");
    let lake_tables = sql(
        &second.addr,
        "SELECT snapshots FROM system.lake_tables WHERE table_name = 'second.kv'",
    );
    assert!(lake_tables.lines().any(|line| line == "1"), "{lake_tables}");

    // The data directory remembers its lake: after a crash, `mink sql --data-dir` opens the
    // same catalog without being told, and another lake for it is refused.
    second.kill();
    let data_dir = second_dir.path().display().to_string();
    let (ok, stdout, stderr) = run_mink_with(
        &[
            "sql",
            "--data-dir",
            &data_dir,
            "--format",
            "csv",
            "-e",
            "SELECT count(*) AS n FROM second.kv",
        ],
        &lake_login,
    );
    assert!(ok, "{stderr}");
    let count = model.len().to_string();
    assert!(stdout.lines().any(|line| line == count), "{stdout}");
    let other = format!("sqlite:{data_dir}/other.db?mode=rwc");
    let (ok, _, stderr) = run_server(second_dir.path(), &["--lake-catalog", &other], &[]);
    assert!(!ok, "another lake for the data directory must be refused");
    assert!(stderr.contains("remembered in"), "{stderr}");
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_lakes_committing_to_one_table_at_once_conflict_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server =
        ServerProcess::start_with(dir.path(), &["--iceberg-rest-listen", "127.0.0.1:0"], &[]);
    let catalog = format!(
        "rest:http://{}",
        server.iceberg_rest_addr.as_ref().expect("REST")
    );
    let warehouse = dir.path().join("lake/warehouse").display().to_string();
    let open = || async {
        let config = LakeConfig::local(&warehouse, catalog.clone()).expect("config");
        Lake::open(config).await.expect("open")
    };
    let (one, two) = (open().await, open().await);
    let path = TablePath::new("racers", "t");
    one.create_table(&kv_table(path.clone()))
        .await
        .expect("create");
    let changes = |writer: &str| SnapshotChanges {
        properties: HashMap::from([("writer".to_string(), writer.to_string())]),
        ..SnapshotChanges::default()
    };
    const RACES: usize = 8;
    // Races lost at the catalog's compare-and-swap (a 409 answer), not before the request.
    let mut lost_at_the_catalog = 0;
    for race in 0..RACES {
        let (mine, theirs) = (
            one.load(&path).await.expect("load"),
            two.load(&path).await.expect("load"),
        );
        let parent = mine.metadata().current_snapshot_id();
        assert_eq!(parent, theirs.metadata().current_snapshot_id());
        let (first, second) = tokio::join!(
            commit_snapshot(&one, &mine, parent, Operation::Append, changes("one")),
            commit_snapshot(&two, &theirs, parent, Operation::Append, changes("two")),
        );
        let winner = match (first, second) {
            (Ok(won), Err(LakeError::CommitConflict { message, .. }))
            | (Err(LakeError::CommitConflict { message, .. }), Ok(won)) => {
                lost_at_the_catalog += usize::from(message.contains("409"));
                won
            }
            other => panic!("race {race}: one commit must win, the other conflict: {other:?}"),
        };
        let snapshot = winner.metadata().current_snapshot().expect("committed");
        assert_eq!(snapshot.parent_snapshot_id(), parent, "race {race}");
    }
    assert!(lost_at_the_catalog > 0, "no race reached the catalog");
    // Exactly the winners, one after another.
    let table = one.load(&path).await.expect("load");
    let metadata = table.metadata();
    assert_eq!(metadata.snapshots().count(), RACES);
    let mut lineage = 0;
    let mut snapshot = metadata.current_snapshot().cloned();
    while let Some(current) = snapshot {
        lineage += 1;
        snapshot = current
            .parent_snapshot_id()
            .and_then(|id| metadata.snapshot_by_id(id).cloned());
    }
    assert_eq!(lineage, RACES);
}

#[test]
fn a_lake_catalog_that_cannot_be_opened_stops_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let not_a_certificate = dir.path().join("ca.pem");
    std::fs::write(&not_a_certificate, "not a certificate").expect("write");
    let server = |catalog: &str, env: &[(&str, &str)]| {
        let lake = [
            "--lake-catalog",
            catalog,
            "--lake-warehouse",
            "/nonexistent/warehouse",
        ];
        run_server(dir.path(), &lake, env)
    };
    let ca = not_a_certificate.display().to_string();
    let (ok, _, stderr) = server("rest:https://127.0.0.1:1", &[("MINK_LAKE_CATALOG_CA", &ca)]);
    assert!(
        !ok,
        "a certificate file without certificates must stop the start"
    );
    assert!(stderr.contains("MINK_LAKE_CATALOG_CA"), "{stderr}");
    let (ok, _, stderr) = server(
        "rest:http://127.0.0.1:1",
        &[("MINK_LAKE_CATALOG_CREDENTIAL", "no-colon")],
    );
    assert!(!ok, "a malformed credential must stop the start");
    assert!(stderr.contains("client_id:secret"), "{stderr}");
}
