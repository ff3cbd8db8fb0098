//! One client opening connection after connection (issue 14): the real `mink server`
//! with `--max-connections 8` holds eight connections on each port; a ninth is closed as
//! soon as it is accepted while the eight are still served, and once they are gone new
//! clients are served again. Flight SQL reaches the node on a port of its own, so
//! clients filling the node's port do not cut Flight SQL off.

use std::time::Duration;

use arrow_flight::sql::client::FlightSqlServiceClient;
use mink_client::MinkClient;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tonic::transport::Channel;

use crate::process::{ServerProcess, run_mink};

/// The `--max-connections` of the server under test.
const MAX_CONNECTIONS: usize = 8;

/// How long a step may wait for the server before the test fails (never reached when it
/// works: a refused connection is closed at once).
const PATIENCE: Duration = Duration::from_secs(20);

/// How often a new client is tried while the server notices closed connections.
const ATTEMPTS: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_port_holds_at_most_max_connections_and_closes_one_more() {
    let dir = tempfile::tempdir().expect("temp dir");
    let limit = MAX_CONNECTIONS.to_string();
    let server = ServerProcess::start_with(dir.path(), &["--max-connections", &limit], &[]);

    // The node's port: eight clients, each on a connection the server answered on.
    let mut node_clients = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        let client = MinkClient::connect(&server.addr).await.expect("connect");
        client
            .list_tables(None)
            .await
            .expect("a call within the limit");
        node_clients.push(client);
    }
    assert_closed_at_once(&server.addr).await;
    assert!(
        !node_call_served(&server.addr).await,
        "a ninth node client was served"
    );
    for client in &node_clients {
        client
            .list_tables(None)
            .await
            .expect("a held connection after the refusal");
    }
    // The Flight SQL port is counted apart, and its statements reach the node through
    // the process's own port, outside the node port's limit: served at the first try.
    assert_sql_answers(&server.sql_addr, 1).await;

    // The Flight SQL port: eight connections, each answered.
    let mut sql_clients = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        let mut client = sql_client(&server.sql_addr).await;
        client
            .get_catalogs()
            .await
            .expect("a Flight SQL call within the limit");
        sql_clients.push(client);
    }
    assert_closed_at_once(&server.sql_addr).await;
    for client in &mut sql_clients {
        client
            .get_catalogs()
            .await
            .expect("a held Flight SQL connection after the refusal");
    }

    // Once the clients are gone, their permits come back.
    drop(node_clients);
    let mut attempts = 0;
    while !node_call_served(&server.addr).await {
        attempts += 1;
        assert!(
            attempts < ATTEMPTS,
            "no node client served after the eight left"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(sql_clients);
    assert_sql_answers(&server.sql_addr, ATTEMPTS).await;
}

/// A raw TCP connection to `addr` is closed by the server without a byte sent.
async fn assert_closed_at_once(addr: &str) {
    let mut stream = TcpStream::connect(addr).await.expect("tcp connect");
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(PATIENCE, stream.read(&mut byte))
        .await
        .unwrap_or_else(|_| panic!("a connection to {addr} over the limit was left open"));
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "a connection to {addr} over the limit read {read:?}"
    );
}

/// Whether a new node client connects to `addr` and has a call answered.
async fn node_call_served(addr: &str) -> bool {
    let connected = tokio::time::timeout(PATIENCE, MinkClient::connect(addr))
        .await
        .expect("connecting neither succeeded nor failed");
    let Ok(client) = connected else {
        return false;
    };
    tokio::time::timeout(PATIENCE, client.list_tables(None))
        .await
        .expect("a call on a new connection neither succeeded nor failed")
        .is_ok()
}

async fn sql_client(addr: &str) -> FlightSqlServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect to Flight SQL");
    FlightSqlServiceClient::new(channel)
}

/// `mink sql --connect addr -e "SELECT 1"` answers 1 within `attempts` tries (the server
/// notices closed connections a moment after they close).
async fn assert_sql_answers(addr: &str, attempts: usize) {
    let addr = addr.to_string();
    let mut last = String::new();
    for _ in 0..attempts {
        let sql_addr = addr.clone();
        let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
            run_mink(&["sql", "--connect", &sql_addr, "-e", "SELECT 1"])
        })
        .await
        .expect("mink sql");
        if ok {
            assert!(stdout.contains('1'), "SELECT 1 printed {stdout}");
            return;
        }
        last = stderr;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("mink sql against {addr} kept failing: {last}");
}
