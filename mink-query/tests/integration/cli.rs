//! The `mink` binary's read command against a running `mink server`.

use mink_client::MinkClient;
use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;

use crate::process::{ServerProcess, run_mink};
use crate::support::{events, events_table};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_log_prints_every_bucket() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start(dir.path());
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    let table = client
        .create_table(&events_table("cli", 3, TableOptions::default()), false)
        .await
        .expect("create");
    let ids: Vec<i64> = (0..30).collect();
    client
        .write(&table, &events(&table, &ids))
        .await
        .expect("write");

    let (ok, stdout, stderr) = run_mink(&[
        "read",
        "--connect",
        &server.addr,
        "--table",
        "test.cli",
        "--mode",
        "log",
        "--format",
        "csv",
    ]);
    assert!(ok, "{stderr}");
    let mut lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.remove(0), "id,name");
    let mut read: Vec<i64> = lines
        .iter()
        .map(|l| l.split(',').next().expect("id").parse().expect("number"))
        .collect();
    read.sort_unstable();
    assert_eq!(read, ids);

    let (ok, stdout, _) = run_mink(&[
        "read",
        "--connect",
        &server.addr,
        "--table",
        "test.cli",
        "--bucket",
        "1",
        "--mode",
        "log",
        "--from",
        "1",
        "--columns",
        "name",
        "--format",
        "json",
    ]);
    assert!(ok);
    let answer = client
        .scan(&BucketId::new(&table.path, 1), 0, 0, &[])
        .await
        .expect("scan");
    assert_eq!(stdout.lines().count(), answer.num_rows() - 1);
    assert!(
        stdout.lines().all(|l| l.starts_with("{\"name\":\"event-")),
        "{stdout}"
    );

    let (ok, _, stderr) = run_mink(&[
        "read",
        "--connect",
        &server.addr,
        "--table",
        "test.nope",
        "--mode",
        "log",
    ]);
    assert!(!ok);
    assert!(stderr.contains("test.nope"), "{stderr}");
    let (ok, _, stderr) = run_mink(&[
        "read",
        "--connect",
        &server.addr,
        "--table",
        "test.cli",
        "--mode",
        "union",
    ]);
    assert!(!ok);
    assert!(stderr.contains("--mode union"), "{stderr}");
}
