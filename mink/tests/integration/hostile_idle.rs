//! Clients that connect and do nothing, and a LimitScan that asks for more rows than a
//! log holds (issue 47).
//!
//! - The real `mink server` with `--max-connections 8` (so one address holds at most 2 of
//!   a port's connections): an attacker on 127.0.0.2 opens eight silent connections to
//!   the node port and to Flight SQL. Two of each are kept, the other six closed at once,
//!   and a client on 127.0.0.1 is served meanwhile. The two are closed once
//!   [`FIRST_BYTES_TIMEOUT`] has passed without a byte, the attacker's share comes back,
//!   and the local client is served again. Before, eight silent connections took a port
//!   for good. One of the two kept sends all but the last byte of the HTTP/2 preface and
//!   is closed at the deadline too: before, one byte of it kept a connection for good.
//! - With TLS, a client that starts its handshake and stalls it is closed at the TLS
//!   handshake timeout, on both ports.
//! - On the Iceberg REST port, a catalog request without a token that announces a body
//!   and never sends it is answered `401` at once: the body is read only after the token
//!   is checked (before, the client held its connection for the 30 s body deadline). A
//!   token request announcing more than 16 KiB is answered `413` at once.
//! - A LimitScan of `limit = 2^32 - 1` on a log table of 128 MiB answers every row, in
//!   order, while the server grows by a bounded amount (before, it held the whole bucket
//!   decoded and once more encoded); a limit that starts inside a batch answers the
//!   last rows exactly.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_flight::sql::client::FlightSqlServiceClient;
use mink_auth::{FIRST_BYTES_TIMEOUT, GRPC_FIRST_BYTES, TLS_HANDSHAKE_TIMEOUT};
use mink_client::MinkClient;
use mink_core::protocol::BucketId;
use mink_core::table::TableDescriptor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tonic::transport::Channel;

use crate::iceberg_rest::rest_server;
use crate::process::ServerProcess;
use crate::support::{events_table, first_column_ids};

/// The `--max-connections` of the server under test.
const MAX_CONNECTIONS: usize = 8;
/// The connections one address other than 127.0.0.1 may hold: a quarter of the port's.
const SHARE: usize = MAX_CONNECTIONS / 4;
/// Where the attacker connects from (127.0.0.1 is mink's own and is not counted).
const ATTACKER: &str = "127.0.0.2";
/// How long a test waits for the server to close a connection before it fails (never
/// reached when it works).
const PATIENCE: Duration = Duration::from_secs(30);
/// How long a connection the server kept is watched to see it stay open.
const KEPT_FOR: Duration = Duration::from_secs(1);
/// The client preface every HTTP/2 connection starts with.
const HTTP2_PREFACE: &[u8; GRPC_FIRST_BYTES] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_hold_only_their_address_share_until_the_first_bytes_deadline() {
    let dir = tempfile::tempdir().expect("temp dir");
    let limit = MAX_CONNECTIONS.to_string();
    let server = ServerProcess::start_with(dir.path(), &["--max-connections", &limit], &[]);
    let node = silent_attack(&server.addr, Port::Node);
    let sql = silent_attack(&server.sql_addr, Port::FlightSql);
    tokio::join!(node, sql);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_tls_handshake_is_closed_on_every_port() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tls = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tls");
    let (certificate, key) = (tls.join("server.pem"), tls.join("server.key"));
    let args = [
        "--sql-tls-cert",
        certificate.to_str().expect("path"),
        "--sql-tls-key",
        key.to_str().expect("path"),
    ];
    let server = ServerProcess::start_with(dir.path(), &args, &[]);
    let node = stall_tls_handshake(&server.addr);
    let sql = stall_tls_handshake(&server.sql_addr);
    let (node, sql) = tokio::join!(node, sql);
    for (port, held) in [("the node", node), ("Flight SQL", sql)] {
        assert!(
            held >= TLS_HANDSHAKE_TIMEOUT - Duration::from_secs(1),
            "{port} closed a stalled handshake after {held:?}, before its timeout"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_port_reads_no_body_before_the_token_and_a_small_one_for_a_token() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, _client, _uri) = rest_server(dir.path()).await;
    let addr = server.iceberg_rest_addr.as_deref().expect("REST");
    let catalog = "POST /v1/namespaces HTTP/1.1\r\nHost: mink\r\n\
                   Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n";
    let (status, took) = answer_to_headers(addr, catalog).await;
    assert_eq!(status, 401, "a catalog request without a token");
    assert!(
        took < FIRST_BYTES_TIMEOUT,
        "a catalog request without a token waited {took:?} for its body"
    );
    let token = "POST /v1/oauth/tokens HTTP/1.1\r\nHost: mink\r\n\
                 Content-Type: application/x-www-form-urlencoded\r\n\
                 Content-Length: 16385\r\n\r\n";
    let (status, took) = answer_to_headers(addr, token).await;
    assert_eq!(status, 413, "a token request of 16 KiB + 1");
    assert!(took < FIRST_BYTES_TIMEOUT, "answered after {took:?}");
}

/// Sends `headers` (a request whose body never comes) to `addr` and reads the answer
/// until the server closes the connection: its status and how long it took.
async fn answer_to_headers(addr: &str, headers: &str) -> (u16, Duration) {
    let mut stream = TcpStream::connect(addr).await.expect("connect REST");
    let sent = Instant::now();
    stream.write_all(headers.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut answer))
        .await
        .expect("the request was neither answered nor its connection closed")
        .expect("read the answer");
    let answer = String::from_utf8_lossy(&answer);
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer}"));
    (status, sent.elapsed())
}

/// The ports attacked, and how a client on 127.0.0.1 is served by each.
#[derive(Debug, Clone, Copy)]
enum Port {
    Node,
    FlightSql,
}

impl Port {
    /// Whether a new client of this port on `addr` connects and has a call answered.
    async fn serves(self, addr: &str) -> bool {
        let served = async {
            match self {
                Port::Node => match MinkClient::connect(addr).await {
                    Ok(client) => client.list_tables(None).await.is_ok(),
                    Err(_) => false,
                },
                Port::FlightSql => {
                    match Channel::from_shared(format!("http://{addr}"))
                        .expect("uri")
                        .connect()
                        .await
                    {
                        Ok(channel) => FlightSqlServiceClient::new(channel)
                            .get_catalogs()
                            .await
                            .is_ok(),
                        Err(_) => false,
                    }
                }
            }
        };
        tokio::time::timeout(PATIENCE, served)
            .await
            .expect("a call neither succeeded nor failed")
    }
}

/// The attack on one port: eight silent connections from [`ATTACKER`], of which the
/// server keeps [`SHARE`], one of them then sending all of the HTTP/2 preface but its last
/// byte, a local client served meanwhile, the kept ones closed at the first-bytes
/// deadline, and then both the attacker's share and the local client served.
async fn silent_attack(addr: &str, port: Port) {
    let target: SocketAddr = addr.parse().expect("address");
    let opened = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        silent.push(connect_from(ATTACKER, target).await);
    }
    let mut kept = kept_open(silent).await;
    assert_eq!(
        kept.len(),
        SHARE,
        "{port:?}: the server kept {} of {MAX_CONNECTIONS} connections from one address",
        kept.len()
    );
    kept[0]
        .write_all(&HTTP2_PREFACE[..GRPC_FIRST_BYTES - 1])
        .await
        .expect("send the preface but its last byte");
    assert!(
        port.serves(addr).await,
        "{port:?}: a local client was refused while an attacker held its share"
    );

    for mut connection in kept {
        assert!(
            closed_within(&mut connection, PATIENCE).await,
            "{port:?}: a silent connection was left open past the deadline"
        );
    }
    let held = opened.elapsed();
    assert!(
        held >= FIRST_BYTES_TIMEOUT,
        "{port:?}: silent connections closed after {held:?}, before the deadline"
    );

    // The attacker's places came back, and the local client is served as before.
    let again = kept_open(vec![connect_from(ATTACKER, target).await]).await;
    assert_eq!(
        again.len(),
        1,
        "{port:?}: the attacker's share never came back"
    );
    assert!(
        port.serves(addr).await,
        "{port:?}: a local client was refused after the silent connections were closed"
    );
}

/// Starts a TLS handshake with `addr` from [`ATTACKER`] and stalls it half way: how long
/// the server held the connection before closing it.
async fn stall_tls_handshake(addr: &str) -> Duration {
    let mut stream = connect_from(ATTACKER, addr.parse().expect("address")).await;
    let started = Instant::now();
    // A handshake record announcing a 512-byte ClientHello, of which one byte comes.
    stream
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .expect("send the start of a ClientHello");
    assert!(
        closed_within(&mut stream, PATIENCE).await,
        "{addr}: a stalled TLS handshake was left open"
    );
    started.elapsed()
}

/// A connection to `addr` from the local address `from` (any of 127.0.0.0/8).
async fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(from.parse().expect("address"), 0))
        .expect("bind the client's address");
    socket.connect(addr).await.expect("tcp connect")
}

/// The connections of `connections` the server has not closed within [`KEPT_FOR`],
/// watched all at once.
async fn kept_open(connections: Vec<TcpStream>) -> Vec<TcpStream> {
    let watched = connections.into_iter().map(|mut connection| async move {
        (!closed_within(&mut connection, KEPT_FOR).await).then_some(connection)
    });
    futures::future::join_all(watched)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Whether the server closes `stream` within `wait`; what it sends meanwhile (an
/// HTTP/2 server's SETTINGS) is read and dropped.
async fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut buffer = [0u8; 1024];
    let reads = async {
        while let Ok(read) = stream.read(&mut buffer).await {
            if read == 0 {
                break;
            }
        }
    };
    tokio::time::timeout(wait, reads).await.is_ok()
}

/// Rows of the log table, and the bytes of each row's text.
const ROWS: usize = 64 * BATCH_ROWS;
const BATCH_ROWS: usize = 2048;
const TEXT_BYTES: usize = 1024;
/// Batches of one append.
const BATCHES_PER_APPEND: usize = 8;
/// What the server may grow by while it answers a LimitScan of the whole 128 MiB log:
/// the pieces it reads and encodes at a time (8 MiB each), tonic's buffers and the
/// allocator's own.
const GROWTH_BOUND_MIB: u64 = 64;

#[test]
fn a_limit_scan_past_the_log_streams_every_row_in_bounded_memory() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start(dir.path());
    let (client, bucket) = runtime.block_on(log_of_128_mib(&server.addr));
    let idle = server.rss_kib();

    let (answer, peak) = server.peak_rss_kib_while(idle, || {
        runtime.block_on(client.limit_scan(&bucket, u32::MAX, &[0, 1]))
    });
    let grown_mib = peak.saturating_sub(idle) >> 10;
    let ids = first_column_ids(&answer.expect("a LimitScan of 2^32 - 1 rows"));
    assert_eq!(ids.len(), ROWS, "every row of the log");
    assert!(
        ids.iter().copied().eq(0..ROWS as i64),
        "the rows in log order"
    );
    eprintln!("a LimitScan of the whole 128 MiB log: the server grew by {grown_mib} MiB");
    assert!(
        grown_mib < GROWTH_BOUND_MIB,
        "the server grew by {grown_mib} MiB answering a 128 MiB log (idle {idle} KiB)"
    );

    // A limit whose first row is inside a batch, read over several pieces.
    let cut = ROWS - 7 - 3 * BATCH_ROWS;
    let last = runtime
        .block_on(client.limit_scan(&bucket, cut as u32, &[0]))
        .expect("a LimitScan inside the log");
    let ids = first_column_ids(&last);
    assert!(
        ids.iter().copied().eq((ROWS - cut) as i64..ROWS as i64),
        "the last {cut} rows, got {} from {:?}",
        ids.len(),
        ids.first()
    );
}

/// A log table of one bucket holding [`ROWS`] rows of about 1 KiB each (128 MiB), ids
/// from 0 in log order, and a client of the node.
async fn log_of_128_mib(addr: &str) -> (MinkClient, BucketId) {
    let client = MinkClient::connect(addr).await.expect("connect");
    let table = client
        .create_table(&events_table("last_rows", 1, Default::default()), false)
        .await
        .expect("create");
    let bucket = BucketId::new(&table.path, 0);
    let text = "x".repeat(TEXT_BYTES);
    for append in 0..ROWS / (BATCH_ROWS * BATCHES_PER_APPEND) {
        let batches = (0..BATCHES_PER_APPEND)
            .map(|batch| {
                let first = (append * BATCHES_PER_APPEND + batch) * BATCH_ROWS;
                wide_rows(&table, first, &text)
            })
            .collect();
        client.append(&bucket, batches).await.expect("append");
    }
    (client, bucket)
}

/// [`BATCH_ROWS`] rows of `table` from id `first`, each with `text` as its name.
fn wide_rows(table: &TableDescriptor, first: usize, text: &str) -> RecordBatch {
    let ids = (first..first + BATCH_ROWS).map(|id| id as i64);
    let columns: Vec<ArrayRef> = vec![
        std::sync::Arc::new(Int64Array::from_iter_values(ids)),
        std::sync::Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
            text, BATCH_ROWS,
        ))),
    ];
    RecordBatch::try_new(std::sync::Arc::clone(table.schema()), columns).expect("batch")
}
