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
    // Without a lake, a union read is the whole log.
    let (ok, stdout, stderr) = run_mink(&[
        "read",
        "--connect",
        &server.addr,
        "--table",
        "test.cli",
        "--mode",
        "union",
        "--format",
        "csv",
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout.lines().filter(|l| *l != "id,name").count(),
        ids.len()
    );
    assert!(stderr.contains("lake snapshot none"), "{stderr}");
}

/// Every id in the table, sorted.
async fn all_ids(client: &MinkClient, table: &mink_core::table::TableDescriptor) -> Vec<i64> {
    use arrow::array::AsArray;
    let mut ids = Vec::new();
    for status in client.list_buckets(&table.path).await.expect("buckets") {
        let bucket = status.bucket.expect("id");
        let mut offset = status.log_start;
        while offset < status.high_watermark {
            let answer = client.scan(&bucket, offset, 0, &[0]).await.expect("scan");
            for read in &answer.batches {
                let values = read
                    .batch
                    .column(0)
                    .as_primitive::<arrow::datatypes::Int64Type>();
                ids.extend_from_slice(values.values());
            }
            offset = answer.next_offset;
        }
    }
    ids.sort_unstable();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_reads_csv_json_and_parquet() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = tempfile::tempdir().expect("input dir");
    let server = ServerProcess::start(dir.path());
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    let table = client
        .create_table(&events_table("loaded", 4, TableOptions::default()), false)
        .await
        .expect("create");

    let csv = data.path().join("events.csv");
    let rows: String = (0..25_000).map(|i| format!("{i},event-{i}\n")).collect();
    std::fs::write(&csv, format!("id,name\n{rows}")).expect("csv");
    let json = data.path().join("events.jsonl");
    let rows: String = (25_000..26_000)
        .map(|i| format!("{{\"name\":\"j{i}\",\"id\":{i}}}\n"))
        .collect();
    std::fs::write(&json, rows).expect("json");
    let parquet = data.path().join("events.parquet");
    {
        let batch = events(&table, &(26_000..30_000).collect::<Vec<i64>>());
        let file = std::fs::File::create(&parquet).expect("parquet file");
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).expect("writer");
        writer.write(&batch).expect("write");
        writer.close().expect("close");
    }
    for file in [&csv, &json, &parquet] {
        let file = file.to_str().expect("utf-8 path");
        let (ok, stdout, stderr) = run_mink(&[
            "load",
            "--connect",
            &server.addr,
            "--table",
            "test.loaded",
            file,
        ]);
        assert!(ok, "{file}: {stderr}");
        assert!(stdout.starts_with("loaded "), "{stdout}");
    }
    assert_eq!(
        all_ids(&client, &table).await,
        (0..30_000).collect::<Vec<i64>>()
    );

    // Bad input: a value that is not a number, an unknown column, a missing file, and an
    // embedded node over a data directory the server holds.
    let bad = data.path().join("bad.csv");
    std::fs::write(&bad, "id,name\n1,a\nx,b\n").expect("csv");
    let extra = data.path().join("extra.csv");
    std::fs::write(&extra, "id,name,color\n1,a,red\n").expect("csv");
    let missing = std::path::PathBuf::from("/no/such/file.csv");
    for (file, complaint) in [
        (&bad, "error"),
        (&extra, "'color'"),
        (&missing, "/no/such/file.csv"),
    ] {
        let file = file.to_str().expect("path");
        let (ok, _, stderr) = run_mink(&[
            "load",
            "--connect",
            &server.addr,
            "--table",
            "test.loaded",
            file,
        ]);
        assert!(!ok && stderr.contains(complaint), "{file}: {stderr}");
    }
    let (ok, _, stderr) = run_mink(&[
        "load",
        "--data-dir",
        dir.path().to_str().expect("path"),
        "--table",
        "test.loaded",
        csv.to_str().expect("path"),
    ]);
    assert!(
        !ok && stderr.contains("in use by another mink process"),
        "{stderr}"
    );
    assert_eq!(
        all_ids(&client, &table).await,
        (0..30_000).collect::<Vec<i64>>(),
        "failed loads wrote nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_snapshot_prints_current_rows_in_key_order() {
    use crate::pk_support::{pk_keys, pk_rows, pk_table};
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start(dir.path());
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    let mut table = pk_table("cli_pk", 1);
    table.partition_keys.clear();
    let table = client.create_table(&table, false).await.expect("create");
    let rows: Vec<_> = [3, 1, 2]
        .iter()
        .map(|i| (("d".to_string(), *i, 0), Some(format!("v{i}"))))
        .collect();
    client
        .write(&table, &pk_rows(&table, &rows))
        .await
        .expect("upsert");
    client
        .write(
            &table,
            &pk_rows(&table, &[(("d".to_string(), 2, 0), Some("new".into()))]),
        )
        .await
        .expect("update");
    client
        .delete(&table, &pk_keys(&[("d".to_string(), 3, 0)]))
        .await
        .expect("delete");

    let (ok, stdout, stderr) = run_mink(&[
        "read",
        "--connect",
        &server.addr,
        "--table",
        "test.cli_pk",
        "--mode",
        "snapshot",
        "--columns",
        "id,v",
        "--format",
        "csv",
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "id,v\n1,v1\n2,new\n");
    assert!(stderr.contains("snapshot at log offset 6"), "{stderr}");

    let (ok, _, stderr) = run_mink(&[
        "read",
        "--connect",
        &server.addr,
        "--table",
        "test.cli",
        "--mode",
        "snapshot",
    ]);
    assert!(!ok, "{stderr}");
}
