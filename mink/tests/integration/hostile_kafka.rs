//! Hostile Kafka clients (issue 47), in raw frames where real clients cannot send the
//! input: record counts, group and commit metadata, groups with committed offsets,
//! bytes before a login, idle sockets.
//!
//! Each test starts the real `mink server --kafka-listen 127.0.0.1:0`, sends what an
//! attacker would, and then proves the server still runs, the bound held (its RSS, the
//! size of `meta.db`) and a normal client is served with nothing acknowledged lost.
//! Requests are encoded by hand (Kafka's wire format is simple; the codec crate is
//! built for the server side only): [`Wire`] writes them, [`Answer`] reads answers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::process::{ServerProcess, run_mink_with};
use crate::python::python;

// Kafka's API keys and error codes used here.
const PRODUCE: i16 = 0;
const FETCH: i16 = 1;
const OFFSET_COMMIT: i16 = 8;
const OFFSET_FETCH: i16 = 9;
const JOIN_GROUP: i16 = 11;
const SASL_HANDSHAKE: i16 = 17;
const API_VERSIONS: i16 = 18;
const SASL_AUTHENTICATE: i16 = 36;
const NONE: i16 = 0;
const MESSAGE_TOO_LARGE: i16 = 10;
const OFFSET_METADATA_TOO_LARGE: i16 = 12;
const COORDINATOR_NOT_AVAILABLE: i16 = 15;
const INVALID_GROUP_ID: i16 = 24;
const INVALID_REQUEST: i16 = 42;

/// The bounds of `mink-kafka/src/limits.rs` the tests reach.
const MAX_BATCH_RECORDS: usize = 128 << 10;
const FETCH_CHUNK_ROWS: usize = 1024;
const MAX_MEMBER_BYTES: usize = 1 << 20;
const MAX_COORDINATOR_BYTES: usize = 64 << 20;
const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);
const MIN_SESSION_TIMEOUT_MS: i32 = 6_000;
const MAX_COMMITTED_GROUPS: usize = 100_000;
const OFFSETS_RETENTION: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// `mink server` serving Kafka on a loopback port, and that port.
fn kafka_server(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (ServerProcess, SocketAddr) {
    let args = [&["--kafka-listen", "127.0.0.1:0"], args].concat();
    let server = ServerProcess::start_with(dir, &args, env);
    let kafka = server.kafka_addr.clone().expect("a Kafka listener");
    (server, kafka.parse().expect("HOST:PORT"))
}

/// Runs SQL statements with `mink sql --connect`; the CSV output.
fn sql(server: &ServerProcess, statements: &[&str], env: &[(&str, &str)]) -> String {
    let mut args = vec!["sql", "--connect", server.addr.as_str(), "--format", "csv"];
    for statement in statements {
        args.extend(["-e", statement]);
    }
    let (ok, stdout, stderr) = run_mink_with(&args, env);
    assert!(ok, "{statements:?}: {stderr}");
    stdout
}

/// A Kafka request or record batch being written, big-endian as the protocol is.
#[derive(Default)]
struct Wire(Vec<u8>);

impl Wire {
    fn i8(self, v: i8) -> Self {
        self.raw(&v.to_be_bytes())
    }
    fn i16(self, v: i16) -> Self {
        self.raw(&v.to_be_bytes())
    }
    fn i32(self, v: i32) -> Self {
        self.raw(&v.to_be_bytes())
    }
    fn i64(self, v: i64) -> Self {
        self.raw(&v.to_be_bytes())
    }
    fn raw(mut self, bytes: &[u8]) -> Self {
        self.0.extend_from_slice(bytes);
        self
    }
    /// A STRING (an i16 length).
    fn string(self, s: &str) -> Self {
        self.i16(s.len() as i16).raw(s.as_bytes())
    }
    /// BYTES (an i32 length).
    fn bytes(self, b: &[u8]) -> Self {
        self.i32(b.len() as i32).raw(b)
    }
    /// An UNSIGNED_VARINT.
    fn uvarint(mut self, mut v: u64) -> Self {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
        self
    }
    /// A COMPACT_STRING (its length + 1 as an unsigned varint).
    fn compact(self, b: &[u8]) -> Self {
        self.uvarint(b.len() as u64 + 1).raw(b)
    }
    /// A request frame: its size, header v1 (or v2 with `flexible`), `body`.
    fn request(api: i16, version: i16, flexible: bool, body: Wire) -> Vec<u8> {
        let mut header = Wire::default()
            .i16(api)
            .i16(version)
            .i32(7)
            .string("hostile");
        if flexible {
            header = header.uvarint(0);
        }
        let frame = header.raw(&body.0).0;
        Wire::default().bytes(&frame).0
    }
}

/// An answer being read.
struct Answer<'a>(&'a [u8]);

impl Answer<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
    fn i16(&mut self) -> i16 {
        i16::from_be_bytes(self.take(2).try_into().unwrap())
    }
    fn i32(&mut self) -> i32 {
        i32::from_be_bytes(self.take(4).try_into().unwrap())
    }
    fn i64(&mut self) -> i64 {
        i64::from_be_bytes(self.take(8).try_into().unwrap())
    }
    fn string(&mut self) {
        let len = self.i16();
        self.take(len.max(0) as usize);
    }
    fn uvarint(&mut self) -> u64 {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let byte = self.take(1)[0];
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return v;
            }
            shift += 7;
        }
    }
    fn compact(&mut self) {
        let len = self.uvarint();
        self.take(len.saturating_sub(1) as usize);
    }
}

/// A connection speaking raw frames.
struct Client(TcpStream);

impl Client {
    fn connect(kafka: SocketAddr) -> Self {
        let stream = TcpStream::connect(kafka).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        Self(stream)
    }

    /// Sends a frame; the answer, after its size and correlation id.
    fn ask(&mut self, frame: &[u8]) -> Vec<u8> {
        self.0.write_all(frame).expect("send");
        let mut size = [0u8; 4];
        self.0.read_exact(&mut size).expect("an answer");
        let mut answer = vec![0u8; i32::from_be_bytes(size) as usize];
        self.0.read_exact(&mut answer).expect("the answer's bytes");
        answer.split_off(4)
    }
}

/// Whether the server closed `stream` within `wait` (rather than answer or hang).
fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
    stream.set_read_timeout(Some(wait)).expect("timeout");
    let mut buffer = [0u8; 64];
    matches!(stream.read(&mut buffer), Ok(0) | Err(_))
}

/// A v2 record batch of `count` records, its records gzip-compressed when `gzip`.
fn record_batch(records: &[u8], count: usize, gzip: bool) -> Vec<u8> {
    let records = if gzip {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(records).expect("gzip");
        encoder.finish().expect("gzip")
    } else {
        records.to_vec()
    };
    // From the attributes on: what the CRC covers.
    let covered = Wire::default()
        .i16(i16::from(gzip))
        .i32(count as i32 - 1)
        .i64(1_700_000_000_000)
        .i64(1_700_000_000_000)
        .i64(-1)
        .i16(-1)
        .i32(-1)
        .i32(count as i32)
        .raw(&records)
        .0;
    let after_length = Wire::default()
        .i32(-1)
        .i8(2)
        .raw(&crc32c(&covered).to_be_bytes())
        .raw(&covered)
        .0;
    Wire::default().i64(0).bytes(&after_length).0
}

/// One record with `value`, no key, no headers.
fn record(value: &[u8]) -> Vec<u8> {
    let zigzag = |v: usize| (v as u64) << 1;
    let body = Wire::default()
        .i8(0)
        .uvarint(0)
        .uvarint(0)
        .uvarint(1) // key: null (-1)
        .uvarint(zigzag(value.len()))
        .raw(value)
        .uvarint(0)
        .0;
    Wire::default().uvarint(zigzag(body.len())).raw(&body).0
}

/// CRC-32C (Castagnoli), as record batches carry it.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for byte in bytes {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Produce v3 of one batch to partition 0 of `topic`: the partition's error code and
/// base offset.
fn produce(client: &mut Client, topic: &str, batch: &[u8]) -> (i16, i64) {
    let body = Wire::default()
        .i16(-1) // no transactional id
        .i16(-1) // acks=all
        .i32(30_000)
        .i32(1)
        .string(topic)
        .i32(1)
        .i32(0)
        .bytes(batch);
    let answer = client.ask(&Wire::request(PRODUCE, 3, false, body));
    let mut answer = Answer(&answer);
    assert_eq!(answer.i32(), 1, "one topic");
    answer.string();
    assert_eq!(answer.i32(), 1, "one partition");
    assert_eq!(answer.i32(), 0, "partition 0");
    (answer.i16(), answer.i64())
}

/// Fetch v4 of partition 0 of `topic` from `offset`, at most `max_bytes`: the error
/// code, the records' bytes, and the record count of each record batch in them.
fn fetch(client: &mut Client, topic: &str, offset: i64, max_bytes: i32) -> (i16, usize, Vec<i32>) {
    let body = Wire::default()
        .i32(-1) // replica id
        .i32(0) // max wait
        .i32(0) // min bytes
        .i32(max_bytes)
        .i8(0) // isolation: read uncommitted
        .i32(1)
        .string(topic)
        .i32(1)
        .i32(0)
        .i64(offset)
        .i32(max_bytes);
    let answer = client.ask(&Wire::request(FETCH, 4, false, body));
    let mut answer = Answer(&answer);
    answer.i32(); // throttle
    assert_eq!(answer.i32(), 1, "one topic");
    answer.string();
    assert_eq!(answer.i32(), 1, "one partition");
    answer.i32();
    let error = answer.i16();
    answer.i64(); // high watermark
    answer.i64(); // last stable offset
    let aborted = answer.i32();
    assert!(aborted <= 0, "no transactions");
    let size = answer.i32().max(0) as usize;
    let mut records = Answer(answer.take(size));
    let mut counts = Vec::new();
    while records.0.len() >= 61 {
        records.i64();
        let length = records.i32() as usize;
        let batch = records.take(length);
        counts.push(i32::from_be_bytes(batch[45..49].try_into().unwrap()));
    }
    (error, size, counts)
}

/// A produced gzip batch announcing millions of 7-byte records (~100 KB on the wire,
/// 63 MB inflated) is refused before it is inflated, and the server does not grow; a
/// batch mink stores with hundreds of thousands of rows is fetched in chunks within a
/// small byte bound; normal produces and fetches go on, nothing acknowledged lost.
#[test]
fn record_counts_are_bounded_in_produce_and_fetch() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, kafka) = kafka_server(dir.path(), &[], &[]);
    sql(
        &server,
        &[
            "CREATE TABLE victims (\"value\" VARCHAR)",
            "CREATE TABLE wide (\"value\" VARCHAR)",
            "INSERT INTO wide SELECT 'v' || i FROM generate_series(1, 300000) t(i)",
        ],
        &[],
    );
    let mut client = Client::connect(kafka);
    let before = server.rss_kib();

    let records = 9_000_000;
    let bomb = record_batch(&record(b"").repeat(records), records, true);
    assert!(bomb.len() < 1 << 20, "{} bytes on the wire", bomb.len());
    let (error, _) = produce(&mut client, "default.victims", &bomb);
    assert_eq!(error, MESSAGE_TOO_LARGE, "a batch of {records} records");
    let just_over = MAX_BATCH_RECORDS + 1;
    let over = record_batch(&record(b"").repeat(just_over), just_over, true);
    assert_eq!(
        produce(&mut client, "default.victims", &over).0,
        MESSAGE_TOO_LARGE
    );
    let grown = server.rss_kib().saturating_sub(before);
    eprintln!("RSS {before} KiB before the record-count batches, grown by {grown} KiB");
    assert!(grown < 100 << 10, "the server grew by {grown} KiB");

    // A normal batch is written, and read back whole.
    let three = [record(b"a"), record(b"b"), record(b"c")].concat();
    let (error, base_offset) = produce(
        &mut client,
        "default.victims",
        &record_batch(&three, 3, false),
    );
    assert_eq!((error, base_offset), (NONE, 0));
    let (error, _, counts) = fetch(&mut client, "default.victims", 0, 1 << 20);
    assert_eq!((error, counts), (NONE, vec![3]));
    // A batch at the bound is written, and fetched whole in chunks.
    let at_bound = record_batch(
        &record(b"").repeat(MAX_BATCH_RECORDS),
        MAX_BATCH_RECORDS,
        true,
    );
    assert_eq!(
        produce(&mut client, "default.victims", &at_bound),
        (NONE, 3)
    );
    let (error, size, counts) = fetch(&mut client, "default.victims", 3, 32 << 20);
    assert_eq!(error, NONE);
    assert_eq!(counts.iter().sum::<i32>() as usize, MAX_BATCH_RECORDS);
    let grown = server.rss_kib().saturating_sub(before);
    eprintln!(
        "a batch of {MAX_BATCH_RECORDS} records produced and fetched ({size} bytes): RSS grown by {grown} KiB"
    );

    // A stored batch of 300 000 rows: one chunk answers a fetch of one byte, and a
    // fetch of at most 1 MiB holds one chunk more at most.
    let (error, size, counts) = fetch(&mut client, "default.wide", 0, 1);
    assert_eq!(error, NONE);
    assert_eq!(counts, [FETCH_CHUNK_ROWS as i32], "{size} bytes");
    let (_, size, counts) = fetch(&mut client, "default.wide", 0, 1 << 20);
    assert!(size < 2 << 20, "{size} bytes for a bound of 1 MiB");
    assert!(
        counts.iter().all(|c| *c as usize <= FETCH_CHUNK_ROWS),
        "{counts:?}"
    );
    let rows = sql(
        &server,
        &[
            "SELECT count(*) AS n FROM victims",
            "SELECT count(*) AS n FROM wide",
        ],
        &[],
    );
    assert_eq!(
        rows.split_whitespace().collect::<Vec<_>>(),
        ["n", &(3 + MAX_BATCH_RECORDS).to_string(), "n", "300000"]
    );
}

/// JoinGroup v0 of a new member to `group`, with one protocol carrying `metadata`: the
/// error code.
fn join(client: &mut Client, group: &str, metadata: &[u8]) -> i16 {
    let body = Wire::default()
        .string(group)
        .i32(MIN_SESSION_TIMEOUT_MS)
        .string("")
        .string("consumer")
        .i32(1)
        .string("range")
        .bytes(metadata);
    let answer = client.ask(&Wire::request(JOIN_GROUP, 0, false, body));
    Answer(&answer).i16()
}

/// 40 JoinGroups with 60 MiB of metadata each are refused and the server does not keep
/// them; members within the bound fill the coordinator's bytes, after which joins are
/// refused until their sessions expire, with nobody asking for their groups again.
#[test]
fn group_metadata_is_bounded_per_member_and_in_all() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, kafka) = kafka_server(dir.path(), &[], &[]);
    let mut client = Client::connect(kafka);
    let before = server.rss_kib();
    let huge = vec![7u8; 60 << 20];
    for _ in 0..40 {
        assert_eq!(join(&mut client, "hoarders", &huge), INVALID_REQUEST);
    }
    drop(huge);
    let grown = server.rss_kib().saturating_sub(before);
    eprintln!("RSS {before} KiB before 40 joins of 60 MiB, grown by {grown} KiB");
    assert!(grown < 300 << 10, "the server grew by {grown} KiB");

    // Each member within its bound, each in a group of its own (joins that complete at
    // once), until the coordinator's bytes are taken.
    let metadata = vec![1u8; MAX_MEMBER_BYTES - 1024];
    let fits = MAX_COORDINATOR_BYTES / MAX_MEMBER_BYTES;
    let mut joined = 0;
    for group in 0..fits + 2 {
        match join(&mut client, &format!("g{group}"), &metadata) {
            NONE => joined += 1,
            COORDINATOR_NOT_AVAILABLE => break,
            error => panic!("join {group}: error {error}"),
        }
    }
    assert!(
        (fits / 2..=fits).contains(&joined),
        "{joined} members joined"
    );
    let late = [2u8; 64 << 10];
    assert_eq!(join(&mut client, "late", &late), COORDINATOR_NOT_AVAILABLE);
    // Nobody heartbeats: their sessions end, and the coordinator has room again.
    std::thread::sleep(Duration::from_millis(MIN_SESSION_TIMEOUT_MS as u64 + 1_500));
    assert_eq!(join(&mut client, "late", &late), NONE);
    let grown = server.rss_kib().saturating_sub(before);
    eprintln!("{joined} members of 1 MiB joined; RSS grown by {grown} KiB since the start");
    assert!(grown < 400 << 10, "the server grew by {grown} KiB");
}

/// OffsetCommit v8 for partition 0 of `topic` at `offset` with `metadata`: the
/// partition's error code.
fn commit(client: &mut Client, group: &str, topic: &str, offset: i64, metadata: &[u8]) -> i16 {
    let body = Wire::default()
        .compact(group.as_bytes())
        .i32(-1) // no generation: a consumer that assigns itself
        .compact(b"")
        .uvarint(0) // no group instance id
        .uvarint(2) // one topic
        .compact(topic.as_bytes())
        .uvarint(2) // one partition
        .i32(0)
        .i64(offset)
        .i32(-1)
        .compact(metadata)
        .uvarint(0)
        .uvarint(0)
        .uvarint(0);
    let answer = client.ask(&Wire::request(OFFSET_COMMIT, 8, true, body));
    let mut answer = Answer(&answer);
    answer.uvarint(); // header tags
    answer.i32(); // throttle
    assert_eq!(answer.uvarint(), 2, "one topic");
    answer.compact();
    assert_eq!(answer.uvarint(), 2, "one partition");
    assert_eq!(answer.i32(), 0, "partition 0");
    answer.i16()
}

/// The bytes of `meta.db` and its write-ahead log.
fn meta_db_bytes(dir: &Path) -> u64 {
    ["meta.db", "meta.db-wal"]
        .iter()
        .filter_map(|name| std::fs::metadata(dir.join(name)).ok())
        .map(|file| file.len())
        .sum()
}

/// Three OffsetCommits with 60 MB of metadata are refused for their partition
/// (OFFSET_METADATA_TOO_LARGE) and `meta.db` does not grow; a commit within Kafka's 4
/// KiB is stored.
#[test]
fn commit_metadata_is_bounded() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, kafka) = kafka_server(dir.path(), &[], &[]);
    sql(&server, &["CREATE TABLE followed (\"value\" VARCHAR)"], &[]);
    let mut client = Client::connect(kafka);
    assert_eq!(
        commit(&mut client, "readers", "default.followed", 0, b"ok"),
        NONE
    );
    let before = meta_db_bytes(dir.path());
    let huge = vec![b'm'; 60_000_000];
    for _ in 0..3 {
        let error = commit(&mut client, "readers", "default.followed", 0, &huge);
        assert_eq!(error, OFFSET_METADATA_TOO_LARGE);
    }
    let grown = meta_db_bytes(dir.path()).saturating_sub(before);
    eprintln!("meta.db and its WAL: {before} bytes, grown by {grown} bytes");
    assert!(grown < 1 << 20, "meta.db grew by {grown} bytes");
    let error = commit(&mut client, "readers", "default.followed", 0, &[b'm'; 4096]);
    assert_eq!(error, NONE, "4 KiB of metadata");
    // A fetch of committed offsets naming a group over 1 KiB (30 000 bytes, near the
    // most a Kafka string holds) is refused before any store is asked; the port answers
    // the group's real offsets after.
    let huge_group = "g".repeat(30_000);
    let (_, error) = committed_or_error(&mut client, &huge_group, "default.followed");
    assert_eq!(error, INVALID_GROUP_ID);
    assert_eq!(committed(&mut client, "readers", "default.followed"), 0);
}

/// A connection from `from`, an address of 127.0.0.0/8 other than 127.0.0.1, where the
/// tests' attackers come from (mink's own processes and local clients come from
/// 127.0.0.1).
fn connect_from(from: [u8; 4], kafka: SocketAddr) -> TcpStream {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("runtime");
    let stream = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind(SocketAddr::from((from, 0))).expect("bind");
        socket.connect(kafka).await.expect("connect")
    });
    let stream = stream.into_std().expect("a std stream");
    stream.set_nonblocking(false).expect("blocking");
    stream
}

/// ApiVersions v0: whether it was answered with no error.
fn api_versions_answered(client: &mut Client) -> bool {
    let answer = client.ask(&Wire::request(API_VERSIONS, 0, false, Wire::default()));
    Answer(&answer).i16() == NONE
}

/// Logs in with SASL/PLAIN: whether the login was taken.
fn log_in(client: &mut Client, user: &str, password: &str) -> bool {
    let handshake = Wire::default().string("PLAIN");
    let answer = client.ask(&Wire::request(SASL_HANDSHAKE, 1, false, handshake));
    assert_eq!(Answer(&answer).i16(), NONE, "PLAIN is served");
    let token = format!("\0{user}\0{password}");
    let authenticate = Wire::default().bytes(token.as_bytes());
    let answer = client.ask(&Wire::request(SASL_AUTHENTICATE, 0, false, authenticate));
    Answer(&answer).i16() == NONE
}

/// With a login configured: connections from 127.0.0.2 on that say nothing, with one
/// that only asks ApiVersions and one that logged in filling `--max-connections`: the
/// first two kinds are closed after the login timeout and a client is served again;
/// the logged-in one is still served after it; a frame over 512 KiB before a login
/// closes its connection. The attackers come from one address each, within any
/// per-address share.
#[test]
fn idle_and_unauthenticated_connections_lose_their_slot() {
    let dir = tempfile::tempdir().expect("temp dir");
    let login = [("MINK_SQL_USER", "ann"), ("MINK_SQL_PASSWORD", "s3cret")];
    let (_server, kafka) = kafka_server(dir.path(), &["--max-connections", "9"], &login);
    let start = Instant::now();
    let mut working = Client::connect(kafka);
    assert!(log_in(&mut working, "ann", "s3cret"));
    let mut chatty = Client::connect(kafka);
    assert!(api_versions_answered(&mut chatty));
    let mut idle: Vec<TcpStream> = (2..9)
        .map(|host| connect_from([127, 0, 0, host], kafka))
        .collect();
    // Every slot is taken: one more is closed at once.
    std::thread::sleep(Duration::from_millis(300));
    let mut refused = TcpStream::connect(kafka).expect("connect");
    assert!(
        closed_within(&mut refused, Duration::from_secs(5)),
        "a tenth connection was kept"
    );
    // ApiVersions now and then does not keep a connection that never logs in.
    while start.elapsed() < LOGIN_TIMEOUT - Duration::from_secs(2) {
        std::thread::sleep(Duration::from_secs(2));
        assert!(api_versions_answered(&mut chatty));
    }
    for stream in &mut idle {
        assert!(
            closed_within(stream, Duration::from_secs(5)),
            "an idle connection was kept"
        );
    }
    assert!(
        closed_within(&mut chatty.0, Duration::from_secs(5)),
        "a connection without a login was kept"
    );
    assert!(start.elapsed() < LOGIN_TIMEOUT + Duration::from_secs(6));
    assert!(api_versions_answered(&mut working), "the logged-in client");
    let mut client = Client::connect(kafka);
    assert!(
        api_versions_answered(&mut client),
        "a client is served again"
    );
    // Before a login, a frame over 512 KiB closes the connection.
    let big = Wire::request(
        API_VERSIONS,
        0,
        false,
        Wire::default().raw(&vec![0u8; 600 << 10]),
    );
    // The server may close the connection before all of it is written.
    let _ = client.0.write_all(&big);
    assert!(
        closed_within(&mut client.0, Duration::from_secs(5)),
        "a 600 KiB frame before a login"
    );
}

/// OffsetFetch v1 for partition 0 of `topic`: the offset `group` committed (-1 for
/// none).
fn committed(client: &mut Client, group: &str, topic: &str) -> i64 {
    let (offset, error) = committed_or_error(client, group, topic);
    assert_eq!(error, NONE, "{group}'s offset");
    offset
}

/// [`committed`] and the partition's error code.
fn committed_or_error(client: &mut Client, group: &str, topic: &str) -> (i64, i16) {
    let body = Wire::default()
        .string(group)
        .i32(1) // one topic
        .string(topic)
        .i32(1) // one partition
        .i32(0);
    let answer = client.ask(&Wire::request(OFFSET_FETCH, 1, false, body));
    let mut answer = Answer(&answer);
    assert_eq!(answer.i32(), 1, "one topic");
    answer.string();
    assert_eq!(answer.i32(), 1, "one partition");
    assert_eq!(answer.i32(), 0, "partition 0");
    let offset = answer.i64();
    answer.string(); // metadata
    (offset, answer.i16())
}

/// `kafka_committed_groups.py`: `fresh` groups with an offset committed in the stopped
/// server's `meta.db`, and `idle` with one committed at `idle_since` (ms since the
/// epoch).
fn fill_committed_groups(dir: &Path, topic: &str, fresh: usize, idle: &str, idle_since: u128) {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/kafka_committed_groups.py"
    );
    let output = std::process::Command::new(python())
        .arg(script)
        .arg(dir.join("meta.db"))
        .args([topic, &fresh.to_string(), idle, &idle_since.to_string()])
        .output()
        .expect("run python");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "kafka_committed_groups.py: {stderr}"
    );
}

/// Groups with committed offsets are bounded and expire. A server whose `meta.db` holds
/// the bound's number of groups (filled while it was stopped, most of them recorded
/// before their activity was) forgets, at its first OffsetCommit, the one idle for
/// longer than the retention; a new group takes its place, and the next new groups
/// (100 commits with 4 KiB of metadata each) are refused with COORDINATOR_NOT_AVAILABLE
/// and leave `meta.db` as it was. Existing groups commit and read theirs as before.
#[test]
fn groups_with_committed_offsets_are_bounded_and_expire() {
    let dir = tempfile::tempdir().expect("temp dir");
    let topic = "default.followed";
    let (server, kafka) = kafka_server(dir.path(), &[], &[]);
    sql(&server, &["CREATE TABLE followed (\"value\" VARCHAR)"], &[]);
    let mut client = Client::connect(kafka);
    assert_eq!(commit(&mut client, "readers", topic, 5, b""), NONE);
    server.kill();
    let idle_since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        - OFFSETS_RETENTION
        - Duration::from_secs(3600);
    // "readers", the fresh groups and the idle one: as many as the bound.
    let fresh = MAX_COMMITTED_GROUPS - 2;
    fill_committed_groups(dir.path(), topic, fresh, "idle", idle_since.as_millis());

    let (mut server, kafka) = kafka_server(dir.path(), &[], &[]);
    let mut client = Client::connect(kafka);
    assert_eq!(committed(&mut client, "idle", topic), -1, "the idle group");
    assert_eq!(commit(&mut client, "newcomer", topic, 1, b""), NONE);
    let before = meta_db_bytes(dir.path());
    let metadata = [b'm'; 4096];
    for n in 0..100 {
        let error = commit(&mut client, &format!("intruder-{n}"), topic, 1, &metadata);
        assert_eq!(error, COORDINATOR_NOT_AVAILABLE, "intruder-{n}");
    }
    let grown = meta_db_bytes(dir.path()).saturating_sub(before);
    eprintln!("meta.db and its WAL: {before} bytes, grown by {grown} bytes");
    assert!(grown < 64 << 10, "meta.db grew by {grown} bytes");
    assert_eq!(committed(&mut client, "intruder-0", topic), -1);
    assert_eq!(commit(&mut client, "readers", topic, 6, b""), NONE);
    assert_eq!(committed(&mut client, "readers", topic), 6);
    assert_eq!(
        committed(&mut client, &format!("fresh-{}", fresh - 1), topic),
        1
    );
    assert_eq!(committed(&mut client, "newcomer", topic), 1);
    assert!(server.is_running());
}
