//! The lake on S3: tiering and union reads against a local S3-compatible server
//! ([`Moto`]).

use std::net::TcpListener;
use std::process::Command;
use std::sync::Arc;

use mink_client::MinkClient;
use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;
use mink_lake::{LakeConfig, S3Options};
use mink_node::{Node, NodeConfig};

use crate::moto::Moto;
use crate::pk_support::{lake_rows, lake_values, pk_keys, pk_lake_table};
use crate::support::{events, events_table, lake_options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiering_and_union_reads_on_s3() {
    let moto = Moto::start();
    moto.create_bucket("mink-lake");
    let dir = tempfile::tempdir().expect("temp dir");
    let options = S3Options {
        endpoint: Some(moto.endpoint.clone()),
        region: Some("us-east-1".into()),
        access_key_id: Some("testing".into()),
        secret_access_key: Some("testing".into()),
    };
    let catalog = format!("sqlite:{}/catalog.db?mode=rwc", dir.path().display());
    let lake = LakeConfig::s3("s3://mink-lake/warehouse", catalog, options).expect("s3 config");
    let store = lake.storage.store().expect("store");
    let mut config = NodeConfig::new(dir.path());
    config.lake = Some(lake);
    let node = Node::open(config).await.expect("open");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let handle = mink_node::server::serve(Arc::clone(&node), listener)
        .await
        .expect("serve");
    let client = MinkClient::connect(&handle.addr().to_string())
        .await
        .expect("connect");

    let table_options = lake_options();
    let table = client
        .create_table(&events_table("on_s3", 2, table_options), false)
        .await
        .expect("create");
    client
        .write(&table, &events(&table, &(0..300).collect::<Vec<_>>()))
        .await
        .expect("write");
    let report = client.tier(&table.path).await.expect("tier");
    assert_eq!(report.rows, 300);
    client
        .write(&table, &events(&table, &(300..350).collect::<Vec<_>>()))
        .await
        .expect("write");

    let mut ids = Vec::new();
    for bucket in 0..2 {
        let answer = client
            .union(&BucketId::new(&table.path, bucket), &[0], &[])
            .await
            .expect("union");
        assert!(
            answer.plan.lake_files > 0,
            "bucket {bucket} reads lake files from S3"
        );
        for batch in &answer.batches {
            let column = batch
                .column(0)
                .as_any()
                .downcast_ref::<arrow::array::Int64Array>()
                .expect("ids");
            ids.extend_from_slice(column.values());
        }
    }
    ids.sort_unstable();
    assert_eq!(ids, (0..350).collect::<Vec<i64>>());
    let lake_count: usize = client
        .lake(&table.path, None, None, &[0], &[])
        .await
        .expect("lake")
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert_eq!(lake_count, 300);

    // The data and metadata files really are in the bucket.
    use futures::TryStreamExt;
    let prefix = object_store::path::Path::from("warehouse");
    let objects: Vec<_> = store.list(Some(&prefix)).try_collect().await.expect("list");
    let names: Vec<String> = objects.iter().map(|o| o.location.to_string()).collect();
    assert!(names.iter().any(|n| n.ends_with(".parquet")), "{names:?}");
    assert!(
        names.iter().any(|n| n.ends_with(".metadata.json")),
        "{names:?}"
    );

    // `mink sql --connect` reads the lake files from S3 itself, given the warehouse.
    let address = handle.addr().to_string();
    let sql = |lake_args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mink"));
        command.args(["sql", "--connect", &address, "--format", "csv"]);
        command.args(lake_args);
        command.args(["-e", "SELECT count(*) AS n FROM test.on_s3"]);
        command.envs(moto.aws_env()).env("RUST_LOG", "warn");
        command.output().expect("run mink sql")
    };
    let output = sql(&["--lake-warehouse", "s3://mink-lake/warehouse"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.lines().any(|line| line == "350"),
        "{stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = sql(&[]);
    assert!(
        !output.status.success(),
        "without the warehouse the lake files cannot be read"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("s3://mink-lake"), "{stderr}");

    // A primary-key table: its round's position deletes live on S3 too.
    let pk = client
        .create_table(&pk_lake_table("pk_on_s3", 2), false)
        .await
        .expect("create");
    let key = |id: i64| ("d".to_string(), id, 0);
    let first: Vec<_> = (0..20)
        .map(|id| (key(id), (Some(format!("v{id}")), Some(id))))
        .collect();
    client
        .write(&pk, &lake_rows(&pk, &first))
        .await
        .expect("write");
    client.tier(&pk.path).await.expect("tier");
    let updates: Vec<_> = (0..5)
        .map(|id| (key(id), (Some("new".to_string()), None)))
        .collect();
    client
        .write(&pk, &lake_rows(&pk, &updates))
        .await
        .expect("upsert");
    client
        .delete(&pk, &pk_keys(&[key(19)]))
        .await
        .expect("delete");
    let round = client.tier(&pk.path).await.expect("tier");
    assert_eq!((round.rows, round.deleted_rows), (5, 6), "{round:?}");
    let mut expected: Vec<_> = first[5..19].to_vec();
    expected.extend(updates);
    expected.sort();
    let mut read: Vec<_> = client
        .lake(&pk.path, None, None, &[], &[])
        .await
        .expect("lake")
        .iter()
        .flat_map(lake_values)
        .collect();
    read.sort();
    assert_eq!(
        read, expected,
        "the lake on S3 applies its position deletes"
    );
    client.drop_table(&pk.path, false).await.expect("drop");

    client.drop_table(&table.path, false).await.expect("drop");
    let left: Vec<_> = store.list(Some(&prefix)).try_collect().await.expect("list");
    assert!(
        left.is_empty(),
        "dropping the table deletes its lake files: {left:?}"
    );
    handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_object_store_is_a_clear_error() {
    let closed = TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    let dir = tempfile::tempdir().expect("temp dir");
    let options = S3Options {
        endpoint: Some(format!("http://127.0.0.1:{closed}")),
        region: Some("us-east-1".into()),
        access_key_id: Some("testing".into()),
        secret_access_key: Some("testing".into()),
    };
    let catalog = format!("sqlite:{}/catalog.db?mode=rwc", dir.path().display());
    let mut config = NodeConfig::new(dir.path());
    config.lake = Some(LakeConfig::s3("s3://nowhere/warehouse", catalog, options).expect("config"));
    let node = Node::open(config).await.expect("open");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let handle = mink_node::server::serve(node, listener)
        .await
        .expect("serve");
    let client = MinkClient::connect(&handle.addr().to_string())
        .await
        .expect("connect");
    let table_options = TableOptions {
        lake_enabled: true,
        ..TableOptions::default()
    };
    let err = client
        .create_table(&events_table("nowhere", 1, table_options), false)
        .await
        .expect_err("the store is unreachable");
    assert_eq!(err.code(), Some(tonic::Code::Unavailable), "{err}");
    assert!(err.to_string().contains("lake"), "{err}");
    handle.shutdown().await.expect("shutdown");
}
