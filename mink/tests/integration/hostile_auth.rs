//! One login for every port (issue 14, hostile clients): a `mink server` started with
//! `--sql-user` refuses every Flight call to its node port that does not carry the login
//! or a token it was exchanged for, serves TLS there with the same certificate flags, and
//! a server without a login refuses to listen beyond loopback. The client commands log
//! in to both ports with `--user` and MINK_PASSWORD (or MINK_SQL_PASSWORD).

use std::path::Path;
use std::process::Command;

use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, FlightData, Ticket};
use mink_client::{ConnectOptions, Credentials, MinkClient};
use mink_core::options::TableOptions;
use mink_core::protocol::{DropTable, action};
use prost::Message;
use tonic::Code;
use tonic::transport::Channel;

use crate::process::{ServerProcess, run_mink_with};
use crate::support::{events, events_table};

const USER: &str = "analyst";
const PASSWORD: &str = "s3cret";

/// A `mink server` with a login (and TLS when `args` ask for it).
fn start_server(data_dir: &Path, args: &[&str]) -> ServerProcess {
    let login = [("MINK_SQL_USER", USER), ("MINK_SQL_PASSWORD", PASSWORD)];
    ServerProcess::start_with(data_dir, args, &login)
}

fn login() -> ConnectOptions {
    ConnectOptions {
        credentials: Some(Credentials::new(USER, PASSWORD)),
        ..ConnectOptions::default()
    }
}

fn tls_args() -> [String; 4] {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tls");
    [
        "--sql-tls-cert".into(),
        dir.join("server.pem").display().to_string(),
        "--sql-tls-key".into(),
        dir.join("server.key").display().to_string(),
    ]
}

fn ca_path() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tls/ca.pem")
        .display()
        .to_string()
}

/// A raw Flight client of `addr`, sending `authorization` (if any) on every call.
async fn raw(addr: &str) -> FlightServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("url")
        .connect()
        .await
        .expect("connect");
    FlightServiceClient::new(channel)
}

fn with_auth<T>(message: T, authorization: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(value) = authorization {
        request
            .metadata_mut()
            .insert("authorization", value.parse().expect("header"));
    }
    request
}

/// The code of each raw call (DoGet, DoPut, DoAction drop_table, DoExchange,
/// ListActions) made with `authorization`.
async fn raw_codes(
    addr: &str,
    table: &str,
    authorization: Option<&str>,
) -> Vec<(&'static str, Code)> {
    let mut client = raw(addr).await;
    let code = |result: Result<_, tonic::Status>| match result {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    };
    let drop = DropTable {
        table: table.to_string(),
        if_exists: false,
        table_id: None,
    };
    let get = client
        .do_get(with_auth(Ticket::new(vec![1, 2, 3]), authorization))
        .await;
    let put = client
        .do_put(with_auth(
            futures::stream::iter([FlightData::default()]),
            authorization,
        ))
        .await;
    let action = client
        .do_action(with_auth(
            Action::new(action::DROP_TABLE, drop.encode_to_vec()),
            authorization,
        ))
        .await;
    let exchange = client
        .do_exchange(with_auth(
            futures::stream::iter([FlightData::default()]),
            authorization,
        ))
        .await;
    let list = client
        .list_actions(with_auth(arrow_flight::Empty {}, authorization))
        .await;
    vec![
        ("DoGet", code(get.map(|_| ()))),
        ("DoPut", code(put.map(|_| ()))),
        ("DoAction drop_table", code(action.map(|_| ()))),
        ("DoExchange", code(exchange.map(|_| ()))),
        ("ListActions", code(list.map(|_| ()))),
    ]
}

fn basic(user: &str, password: &str) -> String {
    let header = mink_auth::basic_header(&Credentials::new(user, password)).expect("header");
    header.to_str().expect("ascii").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_port_answers_no_call_without_the_login() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = start_server(dir.path(), &[]);
    let client = MinkClient::connect_with(&server.addr, &login())
        .await
        .expect("log in to the node");
    let table = client
        .create_table(&events_table("guarded", 2, TableOptions::default()), false)
        .await
        .expect("create");
    client
        .write(&table, &events(&table, &[1, 2, 3]))
        .await
        .expect("write");
    let name = table.path.to_string();

    // No credentials, wrong ones, a made-up token: every call is refused before it runs.
    for authorization in [
        None,
        Some(basic(USER, "wrong")),
        Some(basic("mallory", PASSWORD)),
        Some("Bearer 0123456789abcdef".to_string()),
    ] {
        for (call, code) in raw_codes(&server.addr, &name, authorization.as_deref()).await {
            assert_eq!(code, Code::Unauthenticated, "{call} with {authorization:?}");
        }
    }
    // The refused drop_table dropped nothing.
    assert_eq!(
        client
            .describe_table(&table.path)
            .await
            .expect("still there")
            .table_id,
        table.table_id
    );
    // A client without the login is refused too, and a wrong login at once.
    let anonymous = MinkClient::connect(&server.addr).await.expect("connect");
    let refused = anonymous.list_tables(None).await.expect_err("no login");
    assert_eq!(refused.code(), Some(Code::Unauthenticated), "{refused}");
    let wrong = ConnectOptions {
        credentials: Some(Credentials::new(USER, "wrong")),
        ..ConnectOptions::default()
    };
    let refused = MinkClient::connect_with(&server.addr, &wrong)
        .await
        .expect_err("wrong password");
    assert!(
        refused.to_string().contains("wrong user or password"),
        "{refused}"
    );

    // With the right login (basic on each call, or the handshake's token) calls run.
    let right = basic(USER, PASSWORD);
    let codes = raw_codes(&server.addr, "test.missing", Some(&right)).await;
    for (call, code) in codes {
        assert_ne!(code, Code::Unauthenticated, "{call} with the login");
    }
    assert_eq!(
        client.list_tables(None).await.expect("list"),
        vec![table.path.clone()]
    );
    client
        .drop_table(&table.path, false)
        .await
        .expect("drop with the login");
    assert!(client.list_tables(None).await.expect("list").is_empty());

    // The Flight SQL endpoint's own calls to its node authenticate: its queries work.
    let env = [("MINK_PASSWORD", PASSWORD)];
    let (ok, stdout, stderr) = run_mink_with(
        &[
            "sql",
            "--connect",
            &server.sql_addr,
            "--user",
            USER,
            "--format",
            "csv",
            "-e",
            "CREATE TABLE t (id BIGINT NOT NULL, name VARCHAR)",
            "-e",
            "INSERT INTO t VALUES (1, 'one'), (2, 'two')",
            "-e",
            "SELECT count(*) AS n FROM t",
        ],
        &env,
    );
    assert!(ok, "{stderr}");
    assert!(stdout.ends_with("n\n2\n"), "{stdout}");
}

#[test]
fn every_client_command_logs_in_to_both_ports() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = start_server(dir.path(), &[]);
    let env = [("MINK_PASSWORD", PASSWORD)];
    let old_env = [("MINK_SQL_PASSWORD", PASSWORD)];

    // mink sql: the node's address and the Flight SQL address, told apart with the login.
    let (ok, _, stderr) = run_mink_with(
        &[
            "sql",
            "--connect",
            &server.addr,
            "--user",
            USER,
            "-e",
            "CREATE TABLE people (id BIGINT NOT NULL, name VARCHAR)",
        ],
        &env,
    );
    assert!(ok, "{stderr}");
    for addr in [&server.addr, &server.sql_addr] {
        for env in [&env, &old_env] {
            let (ok, stdout, stderr) = run_mink_with(
                &[
                    "sql",
                    "--connect",
                    addr,
                    "--user",
                    USER,
                    "--format",
                    "csv",
                    "-e",
                    "SELECT count(*) AS n FROM people",
                ],
                env,
            );
            assert!(ok, "{addr}: {stderr}");
            assert!(stdout.ends_with("n\n0\n"), "{addr}: {stdout}");
        }
        // Without --user: a clear error, naming the address and the flag.
        let (ok, stdout, stderr) =
            run_mink_with(&["sql", "--connect", addr, "-e", "SELECT 1"], &[]);
        assert!(!ok && stdout.is_empty(), "{addr}");
        assert!(
            stderr.contains(addr.as_str())
                && stderr.contains("requires a login")
                && stderr.contains("pass --user"),
            "{stderr}"
        );
        // --user without a password, and with a wrong one.
        let (ok, _, stderr) = run_mink_with(
            &["sql", "--connect", addr, "--user", USER, "-e", "SELECT 1"],
            &[],
        );
        assert!(!ok && stderr.contains("MINK_PASSWORD"), "{stderr}");
        let (ok, _, stderr) = run_mink_with(
            &["sql", "--connect", addr, "--user", USER, "-e", "SELECT 1"],
            &[("MINK_PASSWORD", "wrong")],
        );
        assert!(!ok && stderr.contains("wrong user or password"), "{stderr}");
    }

    // mink load and mink read against the node's address.
    let csv = dir.path().join("people.csv");
    std::fs::write(&csv, "id,name\n1,ann\n2,bob\n").expect("csv");
    let csv = csv.display().to_string();
    let (ok, _, stderr) = run_mink_with(
        &[
            "load",
            "--connect",
            &server.addr,
            "--user",
            USER,
            "--table",
            "people",
            &csv,
        ],
        &env,
    );
    assert!(ok, "{stderr}");
    let read = [
        "read",
        "--connect",
        server.addr.as_str(),
        "--table",
        "people",
        "--mode",
        "log",
        "--format",
        "csv",
    ];
    let mut logged_in = read.to_vec();
    logged_in.extend(["--user", USER]);
    let (ok, stdout, stderr) = run_mink_with(&logged_in, &old_env);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("1,ann") && stdout.contains("2,bob"),
        "{stdout}"
    );
    // Without the login both fail, with the server's refusal.
    let (ok, _, stderr) = run_mink_with(&read, &[]);
    assert!(
        !ok && stderr.contains("requires a user and password"),
        "{stderr}"
    );
    let (ok, _, stderr) = run_mink_with(
        &["load", "--connect", &server.addr, "--table", "people", &csv],
        &[],
    );
    assert!(
        !ok && stderr.contains("requires a user and password"),
        "{stderr}"
    );
    // And the rows were loaded once.
    let (ok, stdout, stderr) = run_mink_with(
        &[
            "sql",
            "--connect",
            &server.sql_addr,
            "--user",
            USER,
            "--format",
            "csv",
            "-e",
            "SELECT count(*) AS n FROM people",
        ],
        &env,
    );
    assert!(ok, "{stderr}");
    assert!(stdout.ends_with("n\n2\n"), "{stdout}");
}

#[test]
fn a_non_loopback_listen_without_a_login_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data_dir = dir.path().display().to_string();
    let output = Command::new(env!("CARGO_BIN_EXE_mink"))
        .args([
            "server",
            "--listen",
            "0.0.0.0:0",
            "--sql-listen",
            "127.0.0.1:0",
            "--data-dir",
            &data_dir,
        ])
        .env_remove("MINK_SQL_USER")
        .env_remove("MINK_SQL_PASSWORD")
        .env("RUST_LOG", "warn")
        .output()
        .expect("run mink server");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the node on 0.0.0.0:")
            && stderr.contains("would be open to the network without authentication")
            && stderr.contains("--sql-user"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty(), "it never listened");
}

#[test]
fn the_node_port_serves_tls_with_the_same_certificate() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tls = tls_args();
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
    let server = start_server(dir.path(), &tls);
    let ca = ca_path();
    let env = [("MINK_PASSWORD", PASSWORD)];

    // Both ports over TLS, checked against the test authority; the node's address is
    // told from the Flight SQL one through TLS and the login.
    let (ok, _, stderr) = run_mink_with(
        &[
            "sql",
            "--connect",
            &server.addr,
            "--user",
            USER,
            "--tls-ca",
            &ca,
            "-e",
            "CREATE TABLE secure (id BIGINT NOT NULL)",
            "-e",
            "INSERT INTO secure VALUES (7)",
        ],
        &env,
    );
    assert!(ok, "{stderr}");
    for addr in [&server.addr, &server.sql_addr] {
        let (ok, stdout, stderr) = run_mink_with(
            &[
                "sql",
                "--connect",
                addr,
                "--user",
                USER,
                "--tls-ca",
                &ca,
                "--format",
                "csv",
                "-e",
                "SELECT id FROM secure",
            ],
            &env,
        );
        assert!(ok, "{addr}: {stderr}");
        assert!(stdout.ends_with("id\n7\n"), "{addr}: {stdout}");
    }
    let (ok, stdout, stderr) = run_mink_with(
        &[
            "read",
            "--connect",
            &server.addr,
            "--user",
            USER,
            "--tls-ca",
            &ca,
            "--table",
            "secure",
            "--mode",
            "log",
            "--format",
            "csv",
        ],
        &env,
    );
    assert!(ok, "{stderr}");
    assert!(stdout.contains('7'), "{stdout}");
    // Plaintext to the TLS port gets nowhere.
    let (ok, _, _) = run_mink_with(
        &[
            "read",
            "--connect",
            &server.addr,
            "--user",
            USER,
            "--table",
            "secure",
            "--mode",
            "log",
        ],
        &env,
    );
    assert!(!ok);
}
