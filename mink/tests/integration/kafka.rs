//! Kafka clients on the log: the real `mink server --kafka-listen` (or the listener over
//! an in-process node, where a test needs to run retention) reached by kafka-python and
//! confluent-kafka (librdkafka) through `tests/python/kafka_clients.py`, by kcat, and by
//! hand-made hostile frames.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;
use mink_log::LogConfig;
use serde_json::Value;

use crate::process::{ServerProcess, run_mink};
use crate::python::python;
use crate::support::{LOST_DISK, TestNode, events, events_table, file_store_url, remove_dirs};

pub(crate) const CLIENTS: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/kafka_clients.py");

/// Runs a `kafka_clients.py` command; its last line, as JSON.
fn clients(command: &str, bootstrap: &str, args: &[&str], env: &[(&str, &str)]) -> Value {
    let output = Command::new(python())
        .arg(CLIENTS)
        .args([command, bootstrap])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{command} failed: {stderr}\n{stdout}"
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{command}: {e}: {stdout}"))
}

/// `mink server` serving Kafka on a loopback port it chose.
fn kafka_server(
    dir: &std::path::Path,
    listen: &str,
    env: &[(&str, &str)],
) -> (ServerProcess, String) {
    kafka_server_with(dir, listen, &[], env)
}

/// [`kafka_server`] with more arguments.
fn kafka_server_with(
    dir: &std::path::Path,
    listen: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (ServerProcess, String) {
    let mut all = vec!["--kafka-listen", listen];
    all.extend(args);
    let server = ServerProcess::start_with(dir, &all, env);
    let bootstrap = server.kafka_addr.clone().expect("a Kafka listener");
    (server, bootstrap)
}

/// Runs statements with `mink sql --connect`; the output.
fn sql(server: &ServerProcess, statements: &[&str], env: &[(&str, &str)]) -> String {
    let mut args = vec!["sql", "--connect", server.addr.as_str(), "--format", "csv"];
    for statement in statements {
        args.extend(["-e", statement]);
    }
    let (ok, stdout, stderr) = crate::process::run_mink_with(&args, env);
    assert!(ok, "{statements:?}: {stderr}");
    stdout
}

fn values(records: &Value) -> Vec<(i64, i64, Option<String>, Option<String>)> {
    records
        .as_array()
        .expect("records")
        .iter()
        .map(|r| {
            (
                r["partition"].as_i64().unwrap(),
                r["offset"].as_i64().unwrap(),
                r["key"].as_str().map(str::to_string),
                r["value"].as_str().map(str::to_string),
            )
        })
        .collect()
}

#[test]
fn kafka_clients_read_log_and_primary_key_tables() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, bootstrap) = kafka_server(dir.path(), "127.0.0.1:0", &[]);
    sql(
        &server,
        &[
            "CREATE TABLE events (\"key\" VARCHAR, \"value\" VARCHAR) WITH ('bucket.num' = '2')",
            "INSERT INTO events VALUES ('a', 'one'), (NULL, 'two')",
            "CREATE TABLE shop.orders (id BIGINT, item VARCHAR, qty INT)",
            "INSERT INTO shop.orders VALUES (1, 'tea', 2), (2, 'line\nbreak', NULL)",
            "CREATE TABLE users (id BIGINT PRIMARY KEY, name VARCHAR) WITH ('bucket.num' = '1')",
            "INSERT INTO users VALUES (1, 'ann'), (2, 'bob')",
            "UPDATE users SET name = 'bo' WHERE id = 2",
            "DELETE FROM users WHERE id = 1",
        ],
        &[],
    );

    // A log table with key and value columns: both clients read the same records.
    let events = clients("read-all", &bootstrap, &["default.events"], &[]);
    let expected = vec![
        (0, 0, Some("a".to_string()), Some("one".to_string())),
        (0, 1, None, Some("two".to_string())),
    ];
    assert_eq!(values(&events["kafka_python"]), expected, "{events}");
    assert_eq!(values(&events["librdkafka"]), expected, "{events}");
    assert_eq!(events["ends"], serde_json::json!({"0": 2, "1": 0}));

    // Without a value column, a row is a JSON object (nulls left out).
    let orders = clients("read-all", &bootstrap, &["shop.orders"], &[]);
    let rows: Vec<Option<String>> = values(&orders["librdkafka"])
        .into_iter()
        .map(|r| r.3)
        .collect();
    assert_eq!(
        rows,
        [
            Some(r#"{"id":1,"item":"tea","qty":2}"#.to_string()),
            Some(r#"{"id":2,"item":"line\nbreak"}"#.to_string())
        ]
    );

    // A primary-key table is an upsert stream: -U is skipped, -D is a tombstone.
    let users = clients("read-all", &bootstrap, &["default.users"], &[]);
    let expected = vec![
        (
            0,
            0,
            Some(r#"{"id":1}"#.to_string()),
            Some(r#"{"id":1,"name":"ann"}"#.to_string()),
        ),
        (
            0,
            1,
            Some(r#"{"id":2}"#.to_string()),
            Some(r#"{"id":2,"name":"bob"}"#.to_string()),
        ),
        (
            0,
            3,
            Some(r#"{"id":2}"#.to_string()),
            Some(r#"{"id":2,"name":"bo"}"#.to_string()),
        ),
        (0, 4, Some(r#"{"id":1}"#.to_string()), None),
    ];
    assert_eq!(values(&users["kafka_python"]), expected, "{users}");
    assert_eq!(values(&users["librdkafka"]), expected, "{users}");
    assert_eq!(users["ends"], serde_json::json!({"0": 5}));

    // kcat (librdkafka as Debian ships it) reads the same upsert stream.
    let kcat = Command::new("kcat")
        .args([
            "-b",
            &bootstrap,
            "-C",
            "-t",
            "default.users",
            "-o",
            "beginning",
            "-e",
            "-Z",
        ])
        .args(["-f", "%p %o %k %s\\n"])
        .output()
        .expect("run kcat (scripts/test.sh installs it)");
    assert!(
        kcat.status.success(),
        "{}",
        String::from_utf8_lossy(&kcat.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&kcat.stdout),
        "0 0 {\"id\":1} {\"id\":1,\"name\":\"ann\"}\n\
         0 1 {\"id\":2} {\"id\":2,\"name\":\"bob\"}\n\
         0 3 {\"id\":2} {\"id\":2,\"name\":\"bo\"}\n\
         0 4 {\"id\":1} NULL\n"
    );

    // Offsets by time: the first row at or after a time; none after the last.
    let first = users["kafka_python"][0]["timestamp"].as_i64().unwrap();
    let last = users["kafka_python"][3]["timestamp"].as_i64().unwrap();
    let times = clients(
        "times",
        &bootstrap,
        &[
            "default.users",
            "0",
            &first.to_string(),
            &(last + 1).to_string(),
        ],
        &[],
    );
    assert_eq!(times["offsets"], serde_json::json!([0, 0, null]), "{times}");
}

#[test]
fn produced_records_are_rows_that_sql_reads() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, bootstrap) = kafka_server(dir.path(), "127.0.0.1:0", &[]);
    sql(
        &server,
        &[
            "CREATE TABLE events (\"key\" VARCHAR, \"value\" BIGINT, \"timestamp\" TIMESTAMP)",
            "CREATE TABLE users (id BIGINT PRIMARY KEY, name VARCHAR NOT NULL) WITH ('bucket.num' = '3')",
        ],
        &[],
    );
    let produced = clients(
        "produce",
        &bootstrap,
        &[
            "events",
            r#"[["a", "1", null], [null, "2", null], ["c", "not a number", null]]"#,
        ],
        &[],
    );
    let errors: Vec<&Value> = produced["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| &d["error"])
        .collect();
    assert_eq!(
        errors,
        [&Value::Null, &Value::Null, &Value::from("INVALID_RECORD")],
        "{produced}"
    );
    let rows = sql(
        &server,
        &[
            "SELECT \"key\", \"value\", \"timestamp\" IS NOT NULL AS t FROM events ORDER BY \"value\"",
        ],
        &[],
    );
    assert_eq!(rows, "key,value,t\na,1,true\n,2,true\n");

    // JSON objects upsert a primary-key table (each row to the bucket its key routes
    // to, whatever partition the producer chose); a tombstone deletes by key; a record
    // that does not fit is refused with nothing of it written.
    let produced = clients(
        "produce",
        &bootstrap,
        &[
            "default.users",
            r#"[[null, "{\"id\": 1, \"name\": \"ann\"}", null],
                [null, "{\"id\": 2, \"name\": \"bob\"}", null],
                [null, "{\"id\": 3, \"name\": \"cy\"}", null],
                ["{\"id\": 2}", null, null],
                [null, "{\"id\": 1, \"name\": \"anna\"}", null],
                [null, "{\"id\": 4}", null],
                [null, "{\"id\": 5, \"name\": \"x\", \"age\": 3}", null]]"#,
        ],
        &[],
    );
    let errors: Vec<&Value> = produced["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| &d["error"])
        .collect();
    let invalid = Value::from("INVALID_RECORD");
    assert_eq!(
        errors,
        [
            &Value::Null,
            &Value::Null,
            &Value::Null,
            &Value::Null,
            &Value::Null,
            &invalid,
            &invalid
        ],
        "{produced}"
    );
    let rows = sql(&server, &["SELECT id, name FROM users ORDER BY id"], &[]);
    assert_eq!(rows, "id,name\n1,anna\n3,cy\n");
}

#[test]
fn consumer_groups_share_partitions_and_resume_after_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let (server, bootstrap) = kafka_server(dir.path(), &listen, &[]);
    let inserts: Vec<String> = (0..40).map(|i| format!("({i}, 'v{i}')")).collect();
    sql(
        &server,
        &[
            "CREATE TABLE feed (id BIGINT, \"value\" VARCHAR) WITH ('bucket.num' = '4', 'bucket.key' = 'id')",
            &format!("INSERT INTO feed VALUES {}", inserts.join(", ")),
        ],
        &[],
    );
    let shared = clients("group-share", &bootstrap, &["feed", "readers", "40"], &[]);
    let assigned: Vec<Vec<i64>> = serde_json::from_value(shared["assigned"].clone()).unwrap();
    let mut all: Vec<i64> = assigned.concat();
    all.sort_unstable();
    assert_eq!(
        all,
        [0, 1, 2, 3],
        "the two members split the partitions: {shared}"
    );
    assert!(assigned.iter().all(|a| !a.is_empty()), "{shared}");
    let mut seen: Vec<String> = shared["seen"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|member| {
            member
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r[2].as_str().unwrap().to_string())
        })
        .collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 40, "{shared}");

    // The committed offsets survive a restart: the group reads only what came after.
    server.kill();
    let (server, bootstrap) = kafka_server(dir.path(), &listen, &[]);
    sql(
        &server,
        &["INSERT INTO feed VALUES (100, 'late'), (101, 'later')"],
        &[],
    );
    let resumed = clients("group-resume", &bootstrap, &["feed", "readers", "2"], &[]);
    let mut late: Vec<&str> = resumed["seen"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[2].as_str().unwrap())
        .collect();
    late.sort_unstable();
    assert_eq!(late, ["late", "later"], "{resumed}");
}

#[test]
fn a_waiting_consumer_is_woken_by_a_write() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, bootstrap) = kafka_server(dir.path(), "127.0.0.1:0", &[]);
    sql(&server, &["CREATE TABLE pings (\"value\" VARCHAR)"], &[]);
    let woken = clients("wake", &bootstrap, &["pings"], &[]);
    let latencies: Vec<f64> = serde_json::from_value(woken["latencies_ms"].clone()).unwrap();
    eprintln!("write -> waiting consumer, ms: {latencies:?}");
    assert_eq!(latencies.len(), 5, "{woken}");
    // The fetch waits up to 10 s; the write ends the wait at once.
    let mut sorted = latencies.clone();
    sorted.sort_by(f64::total_cmp);
    assert!(sorted[2] < 1000.0, "median {} ms: {woken}", sorted[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_below_log_start_is_out_of_range() {
    let node = TestNode::start_with(|config| {
        config.log = LogConfig {
            segment_bytes: 4 << 10,
            ..LogConfig::default()
        }
    })
    .await;
    let options = TableOptions {
        log_ttl: Some(Duration::from_millis(1)),
        ..TableOptions::default()
    };
    let table = node
        .client
        .create_table(&events_table("expiring", 1, options), false)
        .await
        .expect("create");
    for chunk in 0..20 {
        let ids: Vec<i64> = (chunk * 100..chunk * 100 + 100).collect();
        node.client
            .write(&table, &events(&table, &ids))
            .await
            .expect("write");
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(node.node().enforce_retention().expect("retention") > 0);
    let (log_start, _) = node
        .node()
        .bucket(&BucketId::new(&table.path, 0))
        .expect("bucket")
        .1
        .log
        .offsets();
    assert!(log_start > 0);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let kafka = mink_kafka::serve(
        Arc::clone(node.node()),
        listener,
        mink_kafka::KafkaOptions::default(),
    )
    .await
    .expect("serve Kafka");
    let bootstrap = kafka.addr().to_string();
    let answer = tokio::task::spawn_blocking(move || {
        clients("out-of-range", &bootstrap, &["test.expiring"], &[])
    })
    .await
    .expect("python");
    assert_eq!(answer["log_start"], log_start, "{answer}");
    assert_eq!(answer["outcome"], "OffsetOutOfRangeError", "{answer}");
}

#[test]
fn an_idempotent_producer_loses_and_repeats_nothing_across_a_kill() {
    idempotent_producer_across_a_kill(None);
}

/// The same with the log in a store on the local file system, and the disk lost with the
/// kill (`log/` and `kv/`): the producers' ids and sequence numbers are in the rebuilt log.
#[test]
fn an_idempotent_producer_loses_and_repeats_nothing_across_a_lost_disk() {
    let store = tempfile::tempdir().expect("store dir");
    idempotent_producer_across_a_kill(Some(store.path()));
}

/// An idempotent producer sends 3000 records while the server is killed (`kill -9`) after
/// 500 are acknowledged and restarted; with a `store`, the server keeps its log there and
/// loses its disk with the kill.
fn idempotent_producer_across_a_kill(store: Option<&std::path::Path>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let listen = format!("127.0.0.1:{}", free_port());
    let store_url = store.map(file_store_url);
    let store_args: Vec<&str> = match &store_url {
        Some(url) => vec!["--log-store", url, "--log-segment-size", "4KiB"],
        None => vec![],
    };
    let (server, bootstrap) = kafka_server_with(dir.path(), &listen, &store_args, &[]);
    sql(&server, &["CREATE TABLE counted (\"value\" BIGINT)"], &[]);
    let count = 3000;
    let mut producer = Command::new(python())
        .arg(CLIENTS)
        .args(["produce-loop", &bootstrap, "counted", &count.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python");
    let mut stdout = std::io::BufReader::new(producer.stdout.take().expect("stdout"));
    // Kill the server once some records are acknowledged, mid-stream.
    let mut line = String::new();
    loop {
        line.clear();
        let read = std::io::BufRead::read_line(&mut stdout, &mut line).expect("read");
        assert!(read > 0, "the producer ended before any acknowledgement");
        if line.starts_with("acked 500") {
            break;
        }
    }
    server.kill();
    if store.is_some() {
        remove_dirs(dir.path(), &LOST_DISK);
    }
    std::thread::sleep(Duration::from_millis(300));
    let (server, _) = kafka_server(dir.path(), &listen, &[]);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).expect("read");
    let status = producer.wait().expect("wait");
    let mut stderr = String::new();
    producer
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("stderr");
    assert!(status.success(), "{stderr}");
    let answer: Value =
        serde_json::from_str(rest.lines().last().unwrap_or_default()).expect("json");
    let acked: Vec<i64> = serde_json::from_value(answer["acked"].clone()).unwrap();
    assert!(acked.len() >= 500, "{answer}");
    eprintln!(
        "acknowledged {} of {count}; failed {}",
        acked.len(),
        answer["failed"]
    );

    let rows = sql(
        &server,
        &["SELECT \"value\" FROM counted ORDER BY \"value\""],
        &[],
    );
    assert_each_acknowledged_once(&rows, &acked);
}

/// `rows`, a CSV of ordered values under a header, holds every `acked` value and no
/// value twice.
pub(crate) fn assert_each_acknowledged_once(rows: &str, acked: &[i64]) {
    let written: Vec<i64> = rows
        .lines()
        .skip(1)
        .map(|v| v.parse().expect("a value"))
        .collect();
    let mut unique = written.clone();
    unique.dedup();
    assert_eq!(unique.len(), written.len(), "a record was written twice");
    for value in acked {
        assert!(
            written.binary_search(value).is_ok(),
            "acknowledged {value} is lost"
        );
    }
}

#[test]
fn the_kafka_port_takes_the_login_of_every_port() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Without a login, only loopback is served.
    let (ok, _, stderr) = run_mink(&[
        "server",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--sql-listen",
        "127.0.0.1:0",
        "--kafka-listen",
        "0.0.0.0:0",
    ]);
    assert!(!ok && stderr.contains("without authentication"), "{stderr}");

    let login = [("MINK_SQL_USER", "ann"), ("MINK_SQL_PASSWORD", "s3cret")];
    // With a login, any address is served, but clients must be told one they can reach.
    let (ok, _, stderr) = crate::process::run_mink_with(
        &[
            "server",
            "--data-dir",
            dir.path().to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--sql-listen",
            "127.0.0.1:0",
            "--kafka-listen",
            "0.0.0.0:0",
        ],
        &login,
    );
    assert!(
        !ok && stderr.contains("needs --kafka-advertised"),
        "{stderr}"
    );
    let (server, bootstrap) = kafka_server(dir.path(), "127.0.0.1:0", &login);
    let client_login = [("MINK_PASSWORD", "s3cret")];
    let mut args = vec!["sql", "--connect", server.addr.as_str(), "--user", "ann"];
    args.extend([
        "-e",
        "CREATE TABLE notes (\"value\" VARCHAR)",
        "-e",
        "INSERT INTO notes VALUES ('hi')",
    ]);
    let (ok, _, stderr) = crate::process::run_mink_with(&args, &client_login);
    assert!(ok, "{stderr}");
    let kafka_login = [
        ("MINK_KAFKA_USER", "ann"),
        ("MINK_KAFKA_PASSWORD", "s3cret"),
    ];
    let notes = clients("read-all", &bootstrap, &["default.notes"], &kafka_login);
    assert_eq!(
        values(&notes["kafka_python"]),
        [(0, 0, None, Some("hi".to_string()))]
    );
    assert_eq!(
        values(&notes["librdkafka"]),
        [(0, 0, None, Some("hi".to_string()))]
    );
    let refused = clients(
        "login-refused",
        &bootstrap,
        &[],
        &[("MINK_KAFKA_USER", "ann")],
    );
    assert!(
        !refused["outcome"].as_str().unwrap().starts_with("listed"),
        "{refused}"
    );
    // A client that does not log in is cut off at its first request past ApiVersions.
    let mut raw = TcpStream::connect(&bootstrap).expect("connect");
    raw.write_all(&metadata_v1(0)).expect("send");
    assert!(closed(&mut raw), "Metadata without a login was answered");
}

#[test]
fn the_kafka_port_serves_tls_with_the_certificate_of_every_port() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tls = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tls");
    let (cert, key) = (tls.join("server.pem"), tls.join("server.key"));
    let login = [("MINK_SQL_USER", "ann"), ("MINK_SQL_PASSWORD", "s3cret")];
    let server = ServerProcess::start_with(
        dir.path(),
        &[
            "--kafka-listen",
            "127.0.0.1:0",
            "--sql-tls-cert",
            cert.to_str().unwrap(),
            "--sql-tls-key",
            key.to_str().unwrap(),
        ],
        &login,
    );
    let bootstrap = server.kafka_addr.clone().expect("a Kafka listener");
    let ca = tls.join("ca.pem");
    let (ok, _, stderr) = crate::process::run_mink_with(
        &[
            "sql",
            "--connect",
            &server.addr,
            "--user",
            "ann",
            "--tls-ca",
            ca.to_str().unwrap(),
            "-e",
            "CREATE TABLE secrets (\"value\" VARCHAR)",
            "-e",
            "INSERT INTO secrets VALUES ('sealed')",
        ],
        &[("MINK_PASSWORD", "s3cret")],
    );
    assert!(ok, "{stderr}");
    let kafka_login = [
        ("MINK_KAFKA_USER", "ann"),
        ("MINK_KAFKA_PASSWORD", "s3cret"),
        ("MINK_KAFKA_CA", ca.to_str().unwrap()),
    ];
    let secrets = clients("read-all", &bootstrap, &["default.secrets"], &kafka_login);
    let expected = [(0, 0, None, Some("sealed".to_string()))];
    assert_eq!(values(&secrets["kafka_python"]), expected, "{secrets}");
    assert_eq!(values(&secrets["librdkafka"]), expected, "{secrets}");
    // Plaintext Kafka on the TLS port gets a TLS alert (record type 21), no answer.
    let mut raw = TcpStream::connect(&bootstrap).expect("connect");
    raw.write_all(&metadata_v1(0)).expect("send");
    raw.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut reply = [0u8; 64];
    let read = raw.read(&mut reply).unwrap_or(0);
    assert!(
        read == 0 || reply[0] == 21,
        "plaintext was answered: {:?}",
        &reply[..read]
    );
}

#[test]
fn hostile_kafka_requests_are_refused_and_the_port_still_answers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, bootstrap) = kafka_server(dir.path(), "127.0.0.1:0", &[]);
    sql(&server, &["CREATE TABLE victims (\"value\" VARCHAR)"], &[]);
    let frames: Vec<(&str, Vec<u8>)> = vec![
        ("a 2 GiB frame", i32::MAX.to_be_bytes().to_vec()),
        ("a negative size", (-5i32).to_be_bytes().to_vec()),
        (
            "a frame too short for a header",
            [&4i32.to_be_bytes()[..], &[0, 3, 0, 1]].concat(),
        ),
        (
            "an unknown API",
            frame(&[
                &0x7f00i16.to_be_bytes(),
                &0i16.to_be_bytes(),
                &7i32.to_be_bytes(),
                &(-1i16).to_be_bytes(),
            ]),
        ),
        ("two billion topics in 12 bytes", metadata_v1(i32::MAX)),
        (
            "a truncated request",
            frame(&[
                &3i16.to_be_bytes(),
                &1i16.to_be_bytes(),
                &7i32.to_be_bytes(),
                &100i16.to_be_bytes(),
            ]),
        ),
    ];
    for (what, bytes) in frames {
        let mut stream = TcpStream::connect(&bootstrap).expect("connect");
        stream.write_all(&bytes).expect("send");
        assert!(closed(&mut stream), "{what}: the connection stayed open");
    }
    // A served API at a version it is not served at gets Kafka's error code, not a
    // closed connection: Fetch v13 (topics by id; header v2, no client id, no tags).
    let mut stream = TcpStream::connect(&bootstrap).expect("connect");
    let fetch_v13 = frame(&[
        &1i16.to_be_bytes(),
        &13i16.to_be_bytes(),
        &9i32.to_be_bytes(),
        &(-1i16).to_be_bytes(),
        &[0],
    ]);
    stream.write_all(&fetch_v13).expect("send");
    let answer = read_answer(&mut stream);
    assert_eq!(&answer[..4], &9i32.to_be_bytes(), "the correlation id");
    // After the header's tags and throttle_time_ms: error_code UNSUPPORTED_VERSION.
    assert_eq!(&answer[9..11], &35i16.to_be_bytes(), "{answer:?}");
    // A compression bomb is refused; the next record is written.
    let bomb = clients("bomb", &bootstrap, &["victims"], &[]);
    assert_ne!(bomb["bomb"], "written", "{bomb}");
    assert_eq!(bomb["small_offset"], 0, "{bomb}");
    // After all of it the port still serves.
    let victims = clients("read-all", &bootstrap, &["default.victims"], &[]);
    assert_eq!(
        values(&victims["librdkafka"]),
        [(0, 0, None, Some("after the bomb".to_string()))]
    );
}

/// A request frame: its size, then `parts`.
fn frame(parts: &[&[u8]]) -> Vec<u8> {
    let body = parts.concat();
    [&(body.len() as i32).to_be_bytes()[..], &body].concat()
}

/// Metadata v1 asking for `topics` topics (and carrying none).
fn metadata_v1(topics: i32) -> Vec<u8> {
    frame(&[
        &3i16.to_be_bytes(),
        &1i16.to_be_bytes(),
        &1i32.to_be_bytes(),
        &(-1i16).to_be_bytes(),
        &topics.to_be_bytes(),
    ])
}

/// Whether the server closed the connection (rather than answer or hang).
fn closed(stream: &mut TcpStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut buffer = [0u8; 64];
    matches!(stream.read(&mut buffer), Ok(0) | Err(_))
}

/// One answer frame, without its size.
fn read_answer(stream: &mut TcpStream) -> Vec<u8> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).expect("an answer");
    let mut answer = vec![0u8; i32::from_be_bytes(size) as usize];
    stream.read_exact(&mut answer).expect("the answer's bytes");
    answer
}

/// A loopback port free now, for a server that must come back on the same one.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}
