//! The log on object storage (`mink server --log-store`), through the real binary:
//!
//! - a node that lost its disk (`kill -9`, then its `log/` and `kv/` deleted) restarts
//!   over the store it remembers and reads every acknowledged row back, exactly once, in
//!   SQL union reads, snapshots, key lookups and Kafka fetches; then tiers on from there;
//!   `mink sql --data-dir` opens the remembered store too;
//! - two nodes over one store: once the newer has opened, the older acknowledges nothing
//!   more, and nothing it was refused becomes visible anywhere;
//! - both on the local file system and on S3 ([`Moto`]);
//! - starts that would mix logs up are refused, saying why.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::Path;
use std::process::Command;

use mink_client::MinkClient;
use mink_core::protocol::BucketId;
use mink_core::table::TableDescriptor;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tempfile::TempDir;
use tonic::Code;

use crate::moto::Moto;
use crate::pk_support::{
    Cells, Key, State, delete_some_keys, lake_rows, lake_values, pk_keys, pk_lake_table,
};
use crate::power_cut::produce;
use crate::process::{ServerProcess, run_mink_with, run_server, run_sql};
use crate::support::{
    LOST_DISK, events, events_table, file_store_url, first_column_ids, lake_options, remove_dirs,
    seed,
};

/// The query of the log table's ids.
const LOG_IDS: &str = "SELECT id FROM test.lg";

/// The Kafka topic of the lost-disk tests: a log table of the `default` database.
const TOPIC: &str = "pings";

/// The lost-disk tests' servers: with a Kafka listener, and the smallest log segments,
/// so that buckets seal segments, which go to the store as stream objects, and a rebuilt
/// log is read from stream objects and WAL objects both.
const ARGS: [&str; 4] = [
    "--kafka-listen",
    "127.0.0.1:0",
    "--log-segment-size",
    "4KiB",
];

/// A log store the tests run servers over: a local directory, or a bucket of a moto
/// server.
struct Store {
    url: String,
    /// The S3 server of a store on S3.
    moto: Option<Moto>,
    /// The directory of a local store.
    dir: Option<TempDir>,
}

impl Store {
    fn local() -> Self {
        let dir = tempfile::tempdir().expect("store dir");
        Self {
            url: file_store_url(dir.path()),
            moto: None,
            dir: Some(dir),
        }
    }

    fn s3() -> Self {
        let moto = Moto::start();
        moto.create_bucket("mink-log");
        Self {
            url: "s3://mink-log/node".into(),
            moto: Some(moto),
            dir: None,
        }
    }

    /// The environment of a server over the store: where S3 is.
    fn env(&self) -> Vec<(&str, &str)> {
        self.moto.iter().flat_map(Moto::aws_env).collect()
    }

    /// Starts a server on a new data directory over the store, with `args`. On S3 it
    /// uploads every 20 ms, not every 250 (the default, for the cost of PUTs): each write
    /// waits for its upload.
    fn start_new(&self, data_dir: &Path, args: &[&str]) -> ServerProcess {
        let mut all = vec!["--log-store", self.url.as_str()];
        if self.moto.is_some() {
            all.extend(["--log-store-interval", "20ms"]);
        }
        all.extend(args);
        ServerProcess::start_with(data_dir, &all, &self.env())
    }

    /// Starts a server on a data directory that remembers the store, with `args` (no
    /// `--log-store`).
    fn restart(&self, data_dir: &Path, args: &[&str]) -> ServerProcess {
        ServerProcess::start_with(data_dir, args, &self.env())
    }
}

/// The tables of the lost-disk tests that the client writes: a log table and a primary-key
/// table, each with a lake. [`TOPIC`] is created beside them.
struct Tables {
    log: TableDescriptor,
    pk: TableDescriptor,
}

impl Tables {
    async fn create(server: &ServerProcess, client: &MinkClient) -> Self {
        let log = events_table("lg", 4, lake_options());
        let pk = pk_lake_table("pk", 2);
        let topic = format!("CREATE TABLE {TOPIC} (\"value\" VARCHAR) WITH ('bucket.num' = '1')");
        let (ok, _, stderr) = run_sql(&server.addr, &topic);
        assert!(ok, "{topic}: {stderr}");
        Self {
            log: client.create_table(&log, false).await.expect("create"),
            pk: client.create_table(&pk, false).await.expect("create"),
        }
    }
}

/// Everything acknowledged to the tests' writers.
#[derive(Debug, Default)]
struct Acked {
    /// The log table's ids.
    ids: Vec<i64>,
    /// The primary-key table.
    keys: State,
    /// The values the Kafka producer had acknowledged.
    produced: Vec<i64>,
    /// The next id or value.
    next: i64,
}

impl Acked {
    fn next(&mut self, count: i64) -> Range<i64> {
        let first = self.next;
        self.next += count;
        first..self.next
    }
}

fn random_key(rng: &mut StdRng) -> Key {
    let dt = ["2024-01-01", "2024-01-02"][rng.random_range(0..2)];
    (dt.into(), rng.random_range(0..40), rng.random_range(0..2))
}

/// A few random writes of each kind, each acknowledged: appends to the log table, upserts
/// and deletes of the primary-key table, and records produced over Kafka.
async fn write_randomly(
    client: &MinkClient,
    bootstrap: &str,
    tables: &Tables,
    acked: &mut Acked,
    rng: &mut StdRng,
) {
    for _ in 0..rng.random_range(2..6) {
        let ids = acked.next(rng.random_range(1..200));
        write_ids(client, &tables.log, ids, &mut acked.ids).await;
    }
    for _ in 0..rng.random_range(2..5) {
        let rows: BTreeMap<Key, Cells> = (0..rng.random_range(1..30))
            .map(|_| {
                let v = rng
                    .random_bool(0.8)
                    .then(|| format!("v{}", rng.random_range(0..1000)));
                (
                    random_key(rng),
                    (v, rng.random_bool(0.8).then(|| rng.random_range(0..1000))),
                )
            })
            .collect();
        let rows: Vec<(Key, Cells)> = rows.into_iter().collect();
        let batch = lake_rows(&tables.pk, &rows);
        client.write(&tables.pk, &batch).await.expect("upsert");
        acked.keys.extend(rows);
    }
    delete_some_keys(client, &tables.pk, &mut acked.keys, rng).await;
    let values = acked.next(rng.random_range(1..30));
    let produced = produce(bootstrap.to_string(), TOPIC, values.clone()).await;
    let produced = produced.expect("produce over Kafka");
    assert_eq!(
        produced,
        values.collect::<Vec<_>>(),
        "every record acknowledged"
    );
    acked.produced.extend(produced);
}

/// Writes rows of `ids` to the log table `table` (each to the bucket its id routes to);
/// once acknowledged, they join `acked`.
async fn write_ids(
    client: &MinkClient,
    table: &TableDescriptor,
    ids: Range<i64>,
    acked: &mut Vec<i64>,
) {
    let ids: Vec<i64> = ids.collect();
    let written = client.write(table, &events(table, &ids)).await;
    written.unwrap_or_else(|e| panic!("writing ids {ids:?}: {e}"));
    acked.extend(ids);
}

/// Connects to `server`, creates the log table `test.<name>` of two buckets and writes
/// `ids` to it: the client, the table and the ids acknowledged.
async fn create_and_write(
    server: &ServerProcess,
    name: &str,
    ids: Range<i64>,
) -> (MinkClient, TableDescriptor, Vec<i64>) {
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    let table = events_table(name, 2, Default::default());
    let table = client.create_table(&table, false).await.expect("create");
    let mut acked = Vec::new();
    write_ids(&client, &table, ids, &mut acked).await;
    (client, table, acked)
}

/// Tiers both tables with a lake.
async fn tier(client: &MinkClient, tables: &Tables) {
    for table in [&tables.log, &tables.pk] {
        client.tier(&table.path).await.expect("tier");
    }
}

/// The rows of `query`'s CSV answer through `mink sql --connect`, without the header.
fn sql_rows(server: &ServerProcess, query: &str) -> Vec<String> {
    csv_rows(run_sql(&server.addr, query), query)
}

/// The rows of a `mink sql --format csv` run's answer to `query` (`(success, stdout,
/// stderr)`), without the header.
fn csv_rows((ok, stdout, stderr): (bool, String, String), query: &str) -> Vec<String> {
    assert!(ok, "{query}: {stderr}");
    stdout.lines().skip(1).map(str::to_string).collect()
}

/// The ids of the log table in SQL rows.
fn parse_ids(rows: &[String]) -> Vec<i64> {
    rows.iter().map(|id| id.parse().expect("an id")).collect()
}

/// The values of every record of `topic`, fetched from offset 0 by kcat (librdkafka).
fn kafka_values(bootstrap: &str, topic: &str) -> Vec<String> {
    let kcat = Command::new("kcat")
        .args(["-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e"])
        .args(["-f", "%s\\n"])
        .output()
        .expect("run kcat (scripts/test.sh installs it)");
    let stderr = String::from_utf8_lossy(&kcat.stderr);
    assert!(kcat.status.success(), "kcat -C -t {topic}: {stderr}");
    String::from_utf8_lossy(&kcat.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Asserts that `found` holds each of `expected` once and nothing else; the message names
/// what is missing, doubled or never acknowledged.
fn assert_exactly<T: Ord + Clone + std::fmt::Debug>(
    found: Vec<T>,
    expected: impl IntoIterator<Item = T>,
    what: &str,
) {
    let expected: BTreeSet<T> = expected.into_iter().collect();
    let mut counts: BTreeMap<T, usize> = BTreeMap::new();
    for value in found {
        *counts.entry(value).or_default() += 1;
    }
    let missing: Vec<&T> = expected
        .iter()
        .filter(|v| !counts.contains_key(v))
        .collect();
    let doubled: Vec<&T> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(v, _)| v)
        .collect();
    let unknown: Vec<&T> = counts.keys().filter(|v| !expected.contains(v)).collect();
    assert!(
        missing.is_empty() && doubled.is_empty() && unknown.is_empty(),
        "{what}: of {} acknowledged, {} missing {missing:?}; read twice {doubled:?}; never \
         acknowledged {unknown:?}",
        expected.len(),
        missing.len()
    );
}

/// A primary-key row as `mink sql --format csv` prints it (a null as nothing).
fn csv_row(((dt, id, seq), (v, n)): (&Key, &Cells)) -> String {
    let v = v.clone().unwrap_or_default();
    let n = n.map(|n| n.to_string()).unwrap_or_default();
    format!("{dt},{id},{seq},{v},{n}")
}

/// Checks that the server holds exactly the acknowledged rows, read every way: SQL union
/// reads, the KV store's snapshots and key lookups, and Kafka fetches from offset 0.
async fn check_every_read(
    server: &ServerProcess,
    client: &MinkClient,
    tables: &Tables,
    acked: &Acked,
    when: &str,
) {
    let ids = acked.ids.iter().copied();
    let read = parse_ids(&sql_rows(server, LOG_IDS));
    assert_exactly(
        read,
        ids.clone(),
        &format!("{when}: the log table's ids in SQL"),
    );
    let rows = sql_rows(server, "SELECT dt, id, seq, v, n FROM test.pk");
    let keys = || {
        acked
            .keys
            .iter()
            .map(|(key, cells)| (key.clone(), cells.clone()))
    };
    let expected = keys().map(|(key, cells)| csv_row((&key, &cells)));
    assert_exactly(
        rows,
        expected,
        &format!("{when}: the primary-key table's rows in SQL"),
    );

    let mut snapshots = Vec::new();
    for status in client.list_buckets(&tables.pk.path).await.expect("buckets") {
        let bucket = status.bucket.expect("a bucket id");
        let snapshot = client.snapshot(&bucket, &[], 0).await.expect("snapshot");
        snapshots.extend(snapshot.batches.iter().flat_map(lake_values));
    }
    assert_exactly(
        snapshots,
        keys(),
        &format!("{when}: the KV store's snapshots"),
    );
    check_lookups(client, &tables.pk, &acked.keys, when).await;

    let bootstrap = server.kafka_addr.as_deref().expect("a Kafka listener");
    let fetched: Vec<i64> = kafka_values(bootstrap, "test.lg")
        .iter()
        .map(|row| {
            let row: serde_json::Value = serde_json::from_str(row).expect("a JSON row");
            row["id"].as_i64().expect("an id")
        })
        .collect();
    assert_exactly(
        fetched,
        ids,
        &format!("{when}: the log table's ids over Kafka"),
    );
    let topic = kafka_values(bootstrap, &format!("default.{TOPIC}"));
    let produced = acked.produced.iter().map(i64::to_string);
    assert_exactly(
        topic,
        produced,
        &format!("{when}: the topic's records over Kafka"),
    );
}

/// Looks up every key the table ever had, or might have had: those in `keys` are found
/// with their values, the others are not.
async fn check_lookups(client: &MinkClient, table: &TableDescriptor, keys: &State, when: &str) {
    let asked: Vec<Key> = (0..40)
        .flat_map(|id| {
            ["2024-01-01", "2024-01-02"]
                .into_iter()
                .flat_map(move |dt| (0..2).map(move |seq| (dt.to_string(), id, seq)))
        })
        .collect();
    let found = (client.lookup(table, &pk_keys(&asked), &[]).await).expect("lookup");
    let answers: Vec<(usize, (Key, Cells))> = (found.key_indices.iter())
        .map(|i| *i as usize)
        .zip(lake_values(&found.rows))
        .collect();
    let expected = (asked.iter().enumerate())
        .filter_map(|(i, key)| Some((i, (key.clone(), keys.get(key)?.clone()))));
    assert_exactly(
        answers,
        expected,
        &format!("{when}: key lookups (key index, row)"),
    );
}

/// Writes to a node over `store`, with a lake round between two rounds of writes; kills
/// it, deletes its log and KV store, restarts it over the store it remembers: every read
/// finds exactly the acknowledged rows. Then a lake round tiers the rebuilt log from
/// where the lake ends; and after a second loss `mink sql --data-dir` reads the rows.
async fn lost_disk(store: &Store, test: &str) {
    let mut rng = StdRng::seed_from_u64(seed(test));
    let dir = tempfile::tempdir().expect("data dir");
    let server = store.start_new(dir.path(), &ARGS);
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    let bootstrap = server.kafka_addr.clone().expect("a Kafka listener");
    let tables = Tables::create(&server, &client).await;
    let mut acked = Acked::default();
    write_randomly(&client, &bootstrap, &tables, &mut acked, &mut rng).await;
    tier(&client, &tables).await;
    write_randomly(&client, &bootstrap, &tables, &mut acked, &mut rng).await;
    server.kill();
    remove_dirs(dir.path(), &LOST_DISK);

    let server = store.restart(dir.path(), &ARGS);
    let client = MinkClient::connect(&server.addr).await.expect("reconnect");
    check_every_read(&server, &client, &tables, &acked, "after the lost disk").await;
    let bootstrap = server.kafka_addr.clone().expect("a Kafka listener");
    write_randomly(&client, &bootstrap, &tables, &mut acked, &mut rng).await;
    tier(&client, &tables).await;
    check_every_read(
        &server,
        &client,
        &tables,
        &acked,
        "after a round over the rebuilt log",
    )
    .await;

    // Rows past the lake's end, then the disk lost again: `mink sql --data-dir` reads
    // them from the store the directory remembers, as the server does.
    let ids = acked.next(50);
    write_ids(&client, &tables.log, ids, &mut acked.ids).await;
    server.kill();
    remove_dirs(dir.path(), &LOST_DISK);
    let data_dir = dir.path().to_str().expect("a path");
    let args = [
        "sql",
        "--data-dir",
        data_dir,
        "--format",
        "csv",
        "-e",
        LOG_IDS,
    ];
    let read = parse_ids(&csv_rows(run_mink_with(&args, &store.env()), LOG_IDS));
    let what = "mink sql --data-dir after a second lost disk: the log table's ids";
    assert_exactly(read, acked.ids.iter().copied(), what);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_its_disk_reads_every_row_back_from_a_local_store() {
    let test = "a_node_that_lost_its_disk_reads_every_row_back_from_a_local_store";
    lost_disk(&Store::local(), test).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_its_disk_reads_every_row_back_from_s3() {
    lost_disk(
        &Store::s3(),
        "a_node_that_lost_its_disk_reads_every_row_back_from_s3",
    )
    .await;
}

/// Copies the data directory of a stopped (`SIGSTOP`) server, as a second machine would
/// find it: all but its lock and its lake, whose catalog the first server's directory
/// remembers by path (the copy gets a lake of its own).
fn copy_data_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy");
    for entry in std::fs::read_dir(from).expect("read the data dir") {
        let entry = entry.expect("an entry");
        let name = entry.file_name();
        if ["LOCK", "lake"].iter().any(|skip| name == *skip) {
            continue;
        }
        let target = to.join(&name);
        match entry.file_type().expect("file type").is_dir() {
            true => copy_data_dir(&entry.path(), &target),
            false => {
                std::fs::copy(entry.path(), &target).expect("copy a file");
            }
        }
    }
}

/// The ids the union reads of every bucket of `table` find.
async fn union_ids(client: &MinkClient, table: &TableDescriptor) -> Vec<i64> {
    let mut ids = Vec::new();
    for bucket in 0..table.bucket_num {
        let answer = client
            .union(&BucketId::new(&table.path, bucket), &[0], &[])
            .await;
        ids.extend(first_column_ids(&answer.expect("union").batches));
    }
    ids
}

/// Checks that the union reads of every bucket of `table` find each of `acked` once and
/// nothing else.
async fn check_ids(client: &MinkClient, table: &TableDescriptor, acked: &[i64], what: &str) {
    let ids = union_ids(client, table).await;
    assert_exactly(ids, acked.iter().copied(), what);
}

/// Node A writes over `store`; frozen, its data directory is copied and node B starts on
/// the copy over the same store, fencing A. Thawed, A is refused every write; neither
/// node shows what A was refused; B writes on; A, restarted, takes the store back with
/// both nodes' rows.
async fn two_writers(store: &Store) {
    let (dir_a, dir_b) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let a = store.start_new(dir_a.path(), &[]);
    let (client_a, table, mut acked) = create_and_write(&a, "shared", 0..100).await;
    for first in [100, 200] {
        write_ids(&client_a, &table, first..first + 100, &mut acked).await;
    }

    a.pause();
    copy_data_dir(dir_a.path(), dir_b.path());
    let b = store.restart(dir_b.path(), &[]);
    a.resume();
    for first in [1000, 1100] {
        let refused = events(&table, &(first..first + 50).collect::<Vec<_>>());
        let error = client_a.write(&table, &refused).await;
        let error = error.expect_err("a write to A after B opened");
        assert!(
            error.code() == Some(Code::Unavailable) && error.to_string().contains("fenced"),
            "A's write after B opened: {:?}, not UNAVAILABLE saying A was fenced: {error}",
            error.code()
        );
    }
    check_ids(&client_a, &table, &acked, "A's reads once fenced").await;
    let client_b = MinkClient::connect(&b.addr).await.expect("connect to B");
    check_ids(&client_b, &table, &acked, "B's reads of A's rows").await;
    write_ids(&client_b, &table, 2000..2100, &mut acked).await;
    a.kill();
    b.kill();

    // A restarts, as its error says to: a third writer, which reads the store back.
    let c = store.restart(dir_a.path(), &[]);
    let client_c = MinkClient::connect(&c.addr)
        .await
        .expect("connect to A again");
    check_ids(&client_c, &table, &acked, "A restarted: both nodes' rows").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_node_acknowledges_nothing_more_on_a_local_store() {
    two_writers(&Store::local()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_node_acknowledges_nothing_more_on_s3() {
    two_writers(&Store::s3()).await;
}

/// Starts `mink server` over `data_dir` with `args`, which must fail, saying `reason`.
fn refused(data_dir: &Path, args: &[&str], reason: &str) {
    let (ok, _, stderr) = run_server(data_dir, args, &[]);
    assert!(!ok, "{args:?} started");
    assert!(
        stderr.contains(reason),
        "{args:?}: no '{reason}' in: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_that_would_mix_logs_up_are_refused() {
    let (store, other) = (Store::local(), Store::local());

    let fresh = tempfile::tempdir().expect("dir");
    refused(
        fresh.path(),
        &["--log-store", "file://relative/dir"],
        "not an absolute path",
    );
    refused(
        fresh.path(),
        &["--log-store", "gs://bucket/log"],
        "unknown scheme",
    );
    refused(
        fresh.path(),
        &["--log-store-interval", "20ms"],
        "--log-store <URL>",
    );
    let created: Vec<_> = std::fs::read_dir(fresh.path()).expect("dir").collect();
    assert!(
        created.is_empty(),
        "a refused store touches no data directory: {created:?}"
    );

    // A data directory with a local log: its rows are in no store. It keeps them.
    let local = tempfile::tempdir().expect("dir");
    let server = ServerProcess::start(local.path());
    let (_, table, acked) = create_and_write(&server, "local", 1..4).await;
    server.kill();
    refused(
        local.path(),
        &["--log-store", &store.url],
        "holds a local log",
    );
    let server = ServerProcess::start(local.path());
    let client = MinkClient::connect(&server.addr).await.expect("reconnect");
    check_ids(&client, &table, &acked, "the local log after the refusal").await;

    // A data directory that remembers another store.
    let remembering = tempfile::tempdir().expect("dir");
    store.start_new(remembering.path(), &[]).kill();
    refused(
        remembering.path(),
        &["--log-store", &other.url],
        "keeps its log in",
    );

    // A new data directory over a store that holds a log: its tables would take that
    // log's buckets (t1/b0, ...) for theirs.
    let second = tempfile::tempdir().expect("dir");
    refused(
        second.path(),
        &["--log-store", &store.url],
        "holds a log already",
    );
}

/// The next free place of `epoch`'s WAL sequence in the local store at `store` (after
/// its last object: the upkeep deletes the first ones once a checkpoint passes them).
fn next_wal_place(store: &Path, epoch: u64) -> std::path::PathBuf {
    let dir = store.join("wal").join(format!("{epoch:020}"));
    let next = std::fs::read_dir(&dir)
        .expect("the epoch's WAL objects")
        .filter_map(|entry| {
            let name = entry.expect("an entry").file_name();
            name.to_str()?.parse::<u64>().ok()
        })
        .max()
        .map_or(0, |last| last + 1);
    dir.join(format!("{next:020}"))
}

/// A power cut on a file system that keeps a new file's name before its bytes (ext4 can)
/// leaves the WAL object being uploaded torn: nothing in it was acknowledged. Every later
/// start skips it and reads the rest back, not only the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_wal_object_is_skipped_by_every_later_start() {
    let store = Store::local();
    let dir = tempfile::tempdir().expect("data dir");
    let server = store.start_new(dir.path(), &[]);
    let (_, table, mut acked) = create_and_write(&server, "torn", 0..100).await;
    server.kill();
    let store_dir = store.dir.as_ref().expect("a local store").path();
    std::fs::write(next_wal_place(store_dir, 1), b"MINKWAL1\0\0").expect("a torn object");

    for start in 1..=2 {
        let server = store.restart(dir.path(), &[]);
        let client = MinkClient::connect(&server.addr).await.expect("reconnect");
        check_ids(
            &client,
            &table,
            &acked,
            &format!("start {start} after the torn object"),
        )
        .await;
        write_ids(&client, &table, start * 100..start * 100 + 100, &mut acked).await;
        server.kill();
    }
}

/// The store's crash points (`MINK_FAILPOINT`), each reached after `@N` passes.
const STORE_FAILPOINTS: [&str; 3] = [
    "abort-mid-wal-upload",
    "abort-after-wal-upload",
    "abort-after-stream-upload",
];

/// A node crashed at each of the store's failpoints, after a random number of passes,
/// keeps every write it acknowledged, once, and nothing it was not sent; of a write cut
/// short, the part a bucket committed may stay. Each next start reads the store back and
/// writes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_at_the_stores_failpoints_lose_nothing_acknowledged() {
    let seed = seed("crashes_at_the_stores_failpoints_lose_nothing_acknowledged");
    let mut rng = StdRng::seed_from_u64(seed);
    let store = Store::local();
    let dir = tempfile::tempdir().expect("dir");
    let segments = ["--log-segment-size", "4KiB"];
    let server = store.start_new(dir.path(), &segments);
    let (_, table, mut acked) = create_and_write(&server, "crashes", 0..100).await;
    server.kill();
    let mut next = 100;
    for point in STORE_FAILPOINTS {
        let failpoint = format!("{point}@{}", rng.random_range(0..6));
        let env = [("MINK_FAILPOINT", failpoint.as_str())];
        let mut sent = Vec::new();
        // A start may crash while opening (its rebuilt segments are uploaded then).
        if let Some(mut server) = ServerProcess::try_start_with(dir.path(), &segments, &env) {
            let client = MinkClient::connect(&server.addr).await.expect("connect");
            while server.is_running() {
                assert!(next < 100_000, "{failpoint}: never reached");
                let ids: Vec<i64> = (next..next + 20).collect();
                next += 20;
                match client.write(&table, &events(&table, &ids)).await {
                    Ok(_) => acked.extend(ids),
                    Err(_) => sent.extend(ids),
                }
            }
        }
        let server = store.restart(dir.path(), &segments);
        let client = MinkClient::connect(&server.addr).await.expect("connect");
        let ids = union_ids(&client, &table).await;
        let read: BTreeSet<i64> = ids.iter().copied().collect();
        assert_eq!(read.len(), ids.len(), "{failpoint}: a row read twice");
        let missing: Vec<&i64> = acked.iter().filter(|id| !read.contains(id)).collect();
        assert!(
            missing.is_empty(),
            "{failpoint}: acknowledged ids lost: {missing:?}"
        );
        let unsent: Vec<&i64> = read
            .iter()
            .filter(|id| !acked.contains(id) && !sent.contains(id))
            .collect();
        assert!(
            unsent.is_empty(),
            "{failpoint}: ids never written: {unsent:?}"
        );
        acked = ids;
        write_ids(&client, &table, next..next + 20, &mut acked).await;
        next += 20;
        server.kill();
    }
}

/// The failpoints of KV checkpoints, compaction and the store's upkeep.
const UPKEEP_FAILPOINTS: [&str; 4] = [
    "abort-after-kv-run-upload",
    "abort-after-merged-upload",
    "abort-mid-upkeep-deletion",
    "abort-mid-kv-restore",
];

/// The servers of the upkeep crash test: checkpoints and segments sealed every few
/// writes, so the runs, the merges, the WAL checkpoints and the upkeep's deletions come
/// quickly.
const UPKEEP_ARGS: [&str; 4] = [
    "--kv-checkpoint-interval",
    "100ms",
    "--log-segment-size",
    "4KiB",
];

/// A primary-key table's rows as written: those acknowledged, and for keys whose last
/// write failed, every row they may hold (`None`: no row).
#[derive(Debug, Default)]
struct Upserted {
    rows: BTreeMap<Key, Cells>,
    uncertain: BTreeMap<Key, Vec<Option<Cells>>>,
}

impl Upserted {
    /// A write of `rows` (`None`: a delete) that succeeded or not.
    fn written(&mut self, rows: &[(Key, Option<Cells>)], acknowledged: bool) {
        for (key, row) in rows {
            if acknowledged {
                self.uncertain.remove(key);
            } else {
                let before = self.rows.get(key).cloned();
                let possible = self.uncertain.entry(key.clone()).or_insert(vec![before]);
                possible.push(row.clone());
            }
            match row {
                Some(cells) => self.rows.insert(key.clone(), cells.clone()),
                None => self.rows.remove(key),
            };
        }
    }

    /// Checks `read` (the table's rows) against the model: the acknowledged keys exactly,
    /// each uncertain one as one of its rows, which it holds from now on.
    fn check(&mut self, read: Vec<(Key, Cells)>, when: &str) {
        let read: BTreeMap<Key, Cells> = read.into_iter().collect();
        for (key, possible) in std::mem::take(&mut self.uncertain) {
            let found = read.get(&key).cloned();
            assert!(
                possible.contains(&found),
                "{when}: {key:?} holds {found:?}, none of {possible:?}"
            );
            match found {
                Some(cells) => self.rows.insert(key, cells),
                None => self.rows.remove(&key),
            };
        }
        assert_eq!(read, self.rows, "{when}: the acknowledged rows");
    }
}

/// Random upserts and deletes of a few dozen keys.
fn random_writes(rng: &mut StdRng) -> Vec<(Key, Option<Cells>)> {
    let rows: BTreeMap<Key, Option<Cells>> = (0..rng.random_range(1..20))
        .map(|_| {
            let cells = (
                Some(format!("v{}", rng.random_range(0..1000))),
                Some(rng.random_range(0..1000)),
            );
            (random_key(rng), rng.random_bool(0.85).then_some(cells))
        })
        .collect();
    rows.into_iter().collect()
}

/// Writes `rows` (upserts, then deletes of those without cells); whether both were
/// acknowledged.
async fn upsert_and_delete(
    client: &MinkClient,
    table: &TableDescriptor,
    rows: &[(Key, Option<Cells>)],
) -> bool {
    let upserts: Vec<(Key, Cells)> = (rows.iter())
        .filter_map(|(key, cells)| Some((key.clone(), cells.clone()?)))
        .collect();
    let deleted: Vec<Key> = (rows.iter())
        .filter(|(_, cells)| cells.is_none())
        .map(|(key, _)| key.clone())
        .collect();
    if !upserts.is_empty()
        && client
            .write(table, &lake_rows(table, &upserts))
            .await
            .is_err()
    {
        return false;
    }
    deleted.is_empty() || client.delete(table, &pk_keys(&deleted)).await.is_ok()
}

/// Every row of the table, from every bucket's Snapshot.
async fn pk_snapshot(client: &MinkClient, table: &TableDescriptor) -> Vec<(Key, Cells)> {
    let mut rows = Vec::new();
    for status in client.list_buckets(&table.path).await.expect("buckets") {
        let bucket = status.bucket.expect("a bucket id");
        let snapshot = client.snapshot(&bucket, &[], 0).await.expect("snapshot");
        rows.extend(snapshot.batches.iter().flat_map(lake_values));
    }
    rows
}

/// A node crashed at each failpoint of KV checkpoints, compaction and the store's upkeep,
/// after a random number of passes, while a primary-key table (without a lake) takes upserts and
/// deletes; each restart after a crash loses the disk, so the table's KV store is
/// restored from its checkpoint: every acknowledged write reads back, and a write whose
/// answer was lost is there whole or not at all. `abort-mid-kv-restore` crashes such a
/// restart itself, and the next one restores again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_in_the_stores_upkeep_lose_nothing_acknowledged() {
    let seed = seed("crashes_in_the_stores_upkeep_lose_nothing_acknowledged");
    let mut rng = StdRng::seed_from_u64(seed);
    let store = Store::local();
    let dir = tempfile::tempdir().expect("dir");
    let server = store.start_new(dir.path(), &UPKEEP_ARGS);
    let client = MinkClient::connect(&server.addr).await.expect("connect");
    let table = pk_lake_table("crashes", 2);
    let table = TableDescriptor {
        lake_enabled: false,
        ..table
    };
    let table = client.create_table(&table, false).await.expect("create");
    let mut upserted = Upserted::default();
    for _ in 0..20 {
        let rows = random_writes(&mut rng);
        let acknowledged = upsert_and_delete(&client, &table, &rows).await;
        upserted.written(&rows, acknowledged);
    }
    settle_and_kill(server).await;
    for point in UPKEEP_FAILPOINTS {
        // A restore passes its point once per run: the first is always there.
        let passes = match point {
            "abort-mid-kv-restore" => 0,
            _ => rng.random_range(0..2),
        };
        let failpoint = format!("{point}@{passes}");
        let env = [("MINK_FAILPOINT", failpoint.as_str())];
        remove_dirs(dir.path(), &LOST_DISK);
        if let Some(mut server) = ServerProcess::try_start_with(dir.path(), &UPKEEP_ARGS, &env) {
            let client = MinkClient::connect(&server.addr).await.expect("connect");
            let started = std::time::Instant::now();
            while server.is_running() {
                assert!(
                    started.elapsed().as_secs() < 120,
                    "{failpoint}: never reached"
                );
                let rows = random_writes(&mut rng);
                let acknowledged = upsert_and_delete(&client, &table, &rows).await;
                upserted.written(&rows, acknowledged);
            }
        }
        remove_dirs(dir.path(), &LOST_DISK);
        let server = store.restart(dir.path(), &UPKEEP_ARGS);
        let client = MinkClient::connect(&server.addr).await.expect("connect");
        let when = format!("seed {seed}, after {failpoint} and a lost disk");
        upserted.check(pk_snapshot(&client, &table).await, &when);
        settle_and_kill(server).await;
    }
}

/// Lets a checkpoint server write its runs of the last writes, then kills it.
async fn settle_and_kill(server: ServerProcess) {
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    server.kill();
}
