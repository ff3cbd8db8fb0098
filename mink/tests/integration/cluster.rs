//! Nodes of a cluster over a real etcd and one log store, each served on its own port:
//! the controller spreads a table's buckets over them, each node answers requests for
//! the others' buckets NotLeader with their address, and no acknowledged row is lost when
//! a node dies (its buckets drained from the store and taken over by the others) or
//! joins (buckets handed over to it).

use std::collections::BTreeMap;
use std::time::Duration;

use mink_client::{MinkClient, TableWriter, WriteKind};
use mink_core::protocol::BucketId;
use mink_core::routing::split_rows_by_bucket;
use mink_core::table::{TableDescriptor, TablePath};
use mink_node::testing::{ClusterNode, Etcd};
use tempfile::TempDir;
use tokio::time::Instant;

use crate::process::{ServerProcess, run_server, run_sql};
use crate::support::{events, events_table, file_store_url, first_column_ids};

/// How long the buckets of a node that died wait before they move.
const LEASE: Duration = Duration::from_secs(2);

/// How long a client call waits for its answer before the node is taken for gone.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// A client of the cluster: `MinkClient` follows NotLeader answers itself; a call a
/// paused node never answers is given up after a while, and the client connected again
/// (what it learned of the paused node's buckets forgotten).
struct Following {
    client: MinkClient,
    first: String,
}

impl Following {
    async fn new(address: &str) -> Self {
        Self {
            client: MinkClient::connect(address).await.expect("connect"),
            first: address.to_string(),
        }
    }

    /// Runs `call` until it succeeds (up to 30 s).
    async fn on_leader<T, F, Fut>(&mut self, bucket: &BucketId, call: F) -> T
    where
        F: Fn(MinkClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, mink_client::ClientError>>,
    {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let error = match tokio::time::timeout(CALL_TIMEOUT, call(self.client.clone())).await {
                Ok(Ok(answer)) => return answer,
                Ok(Err(error)) => Some(error),
                Err(_) => None,
            };
            assert!(Instant::now() < deadline, "{bucket}: {error:?}");
            if let Ok(client) = MinkClient::connect(&self.first).await {
                self.client = client;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Appends `ids` to the table, each row to its bucket's leader.
    async fn append(&mut self, table: &TableDescriptor, ids: &[i64]) {
        for part in split_rows_by_bucket(table, &events(table, ids), 0).expect("route") {
            let batch = part.batch;
            self.on_leader(&part.bucket, |client| {
                let (bucket, batch) = (part.bucket.clone(), batch.clone());
                async move { client.append(&bucket, vec![batch]).await }
            })
            .await;
        }
    }

    /// Every id of the table, bucket by bucket, each read from its leader.
    async fn ids(&mut self, table: &TableDescriptor) -> BTreeMap<u32, Vec<i64>> {
        let mut ids = BTreeMap::new();
        for bucket in 0..table.bucket_num {
            let id = BucketId::new(&table.path, bucket);
            let read = self
                .on_leader(&id, |client| {
                    let id = id.clone();
                    async move { client.scan(&id, 0, 0, &[]).await }
                })
                .await;
            let batches: Vec<_> = read.batches.into_iter().map(|b| b.batch).collect();
            ids.insert(bucket, first_column_ids(&batches));
        }
        ids
    }
}

/// Waits until the node at `address` leads a bucket of `table` (up to 30 s).
async fn leads_a_bucket_soon(address: &str, table: &TableDescriptor) {
    let client = MinkClient::connect(address).await.expect("connect");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for bucket in 0..table.bucket_num {
            let id = BucketId::new(&table.path, bucket);
            // A client of the node reads there unless told of another leader.
            let read = client.scan(&id, 0, 0, &[]).await;
            if read.is_ok() && client.leader_of(&id) == address {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{address} leads no bucket");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The model: each bucket's ids, in the order written.
fn model(table: &TableDescriptor, ids: &[i64]) -> BTreeMap<u32, Vec<i64>> {
    let mut model: BTreeMap<u32, Vec<i64>> = (0..table.bucket_num).map(|b| (b, vec![])).collect();
    for part in split_rows_by_bucket(table, &events(table, ids), 0).expect("route") {
        model
            .get_mut(&part.bucket.bucket)
            .expect("a bucket")
            .extend(first_column_ids(std::slice::from_ref(&part.batch)));
    }
    model
}

/// A node over each of `dirs`, `n0`, `n1`, ... by id, on `etcd` and the log store `store`.
async fn start_nodes(
    etcd: &Etcd,
    store: &TempDir,
    dirs: &[TempDir],
) -> BTreeMap<String, ClusterNode> {
    let mut nodes = BTreeMap::new();
    for (i, dir) in dirs.iter().enumerate() {
        let id = format!("n{i}");
        let node = ClusterNode::start(etcd, "/test", store.path(), &id, dir.path(), LEASE).await;
        nodes.insert(id, node);
    }
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buckets_spread_over_the_nodes_and_survive_a_node_dying_and_one_joining() {
    let etcd = Etcd::start();
    let store = tempfile::tempdir().expect("store");
    let dirs: Vec<TempDir> = (0..3).map(|_| tempfile::tempdir().expect("dir")).collect();
    let mut nodes = start_nodes(&etcd, &store, &dirs).await;
    let first = nodes["n0"].address.clone();
    let admin = MinkClient::connect(&first).await.expect("connect");
    let table = admin
        .create_table(&events_table("spread", 6, Default::default()), false)
        .await
        .expect("create");
    let mut following = Following::new(&first).await;
    let written: Vec<i64> = (0..120).collect();
    for ids in written.chunks(10) {
        following.append(&table, ids).await;
    }
    assert_eq!(following.ids(&table).await, model(&table, &written));
    // The buckets are spread: every node leads some, and a client of one node follows
    // the others' NotLeader answers to them.
    let mut leaders = BTreeMap::new();
    for bucket in 0..table.bucket_num {
        let id = BucketId::new(&table.path, bucket);
        admin
            .scan(&id, 0, 0, &[])
            .await
            .expect("scan on the leader");
        *leaders.entry(admin.leader_of(&id)).or_insert(0) += 1;
    }
    assert_eq!(leaders.len(), 3, "{leaders:?}");
    // A consumer of a bucket n1 leads, through n0.
    let consumed = (0..table.bucket_num)
        .map(|bucket| BucketId::new(&table.path, bucket))
        .find(|bucket| admin.leader_of(bucket) == nodes["n1"].address)
        .expect("n1 leads a bucket");
    let mut tailer = admin.tail(&consumed, &[]).await.expect("tail");
    let mut tailed = Vec::new();
    let expected = model(&table, &written)[&consumed.bucket].clone();
    tail_until(&mut tailer, &mut tailed, expected.len()).await;
    assert_eq!(tailed, expected);

    // n1 dies: its buckets are drained and led by the others, with every row.
    nodes.remove("n1").expect("n1").kill().await;
    let mut following = Following::new(&first).await;
    assert_eq!(following.ids(&table).await, model(&table, &written));
    let more: Vec<i64> = (120..180).collect();
    following.append(&table, &more).await;
    // The consumer follows its bucket to its new leader.
    let all: Vec<i64> = (0..180).collect();
    let expected = model(&table, &all)[&consumed.bucket].clone();
    tail_until(&mut tailer, &mut tailed, expected.len()).await;
    assert_eq!(tailed, expected);

    // n3 joins: it takes a share, handed over by the others.
    let dir = tempfile::tempdir().expect("dir");
    nodes.insert(
        "n3".into(),
        ClusterNode::start(&etcd, "/test", store.path(), "n3", dir.path(), LEASE).await,
    );
    leads_a_bucket_soon(&nodes["n3"].address, &table).await;
    assert_eq!(following.ids(&table).await, model(&table, &all));
    for (_, node) in nodes {
        node.kill().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_table_writer_writes_every_row_once_across_a_leader_s_death() {
    writes_across_a_death("n1").await;
}

/// The node a writer's client connected to dies: the client asks the other members it
/// learned of, and the writer goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_table_writer_goes_on_when_the_node_it_connected_to_dies() {
    writes_across_a_death("n0").await;
}

/// A pipelined `TableWriter` connected to n0 writes 6 000 rows while node `victim` dies;
/// every row lands once, in order, read back through a node that lives.
async fn writes_across_a_death(victim: &str) {
    let etcd = Etcd::start();
    let store = tempfile::tempdir().expect("store");
    let dirs: Vec<TempDir> = (0..3).map(|_| tempfile::tempdir().expect("dir")).collect();
    let mut nodes = start_nodes(&etcd, &store, &dirs).await;
    let first = nodes["n0"].address.clone();
    let client = MinkClient::connect(&first).await.expect("connect");
    let table = client
        .create_table(&events_table("written_once", 6, Default::default()), false)
        .await
        .expect("create");
    let table = std::sync::Arc::new(table);
    // Writes go on, pipelined, while the leader of some of their buckets dies: the
    // DoPuts it had in flight are sent again to the buckets' new leaders.
    let all: Vec<i64> = (0..6_000).collect();
    let mut writer = TableWriter::new(
        &client,
        std::sync::Arc::clone(&table),
        WriteKind::Write,
        500,
    );
    let writes = {
        let (table, all) = (std::sync::Arc::clone(&table), all.clone());
        tokio::spawn(async move {
            for ids in all.chunks(20) {
                if let Err(error) = writer.write(&events(&table, ids)).await {
                    // The write that stopped the writer is the one to know about.
                    panic!("write: {error}; the writer: {:?}", writer.finish().await);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            writer.finish().await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    nodes.remove(victim).expect("the victim").kill().await;
    let written = writes.await.expect("the writer's task");
    assert_eq!(written.expect("every write acknowledged"), 6_000);
    // A request about every bucket, through the writer's client, reaches them all.
    let buckets = client
        .list_buckets(&table.path)
        .await
        .expect("list_buckets");
    assert_eq!(buckets.len(), 6);
    let alive = &nodes.values().next().expect("a node alive").address;
    let mut following = Following::new(alive).await;
    assert_eq!(
        following.ids(&table).await,
        model(&table, &all),
        "each row once, in order"
    );
    for (_, node) in nodes {
        node.kill().await;
    }
}

/// Requests naming tables the cluster does not have make a node look for them in etcd
/// (a table created through another node may be new to it), at most every 100 ms however
/// many come: 2 000 of them, from 8 clients at once, read etcd a number of times that
/// grows with the time they took, not with their number; each is answered NotFound, and
/// a real table is read meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_for_missing_tables_read_etcd_at_most_every_100_ms() {
    let etcd = Etcd::start();
    let store = tempfile::tempdir().expect("store");
    let dir = tempfile::tempdir().expect("dir");
    let node = ClusterNode::start(&etcd, "/test", store.path(), "n0", dir.path(), LEASE).await;
    let client = MinkClient::connect(&node.address).await.expect("connect");
    let table = client
        .create_table(&events_table("present", 1, Default::default()), false)
        .await
        .expect("create");
    // The passes the create set off are over.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = etcd_ranges(&etcd.endpoint);
    let started = Instant::now();
    let askers = (0..8).map(|asker| {
        let address = node.address.clone();
        tokio::spawn(async move {
            let client = MinkClient::connect(&address).await.expect("connect");
            for request in 0..250 {
                let missing = TablePath::new("test", format!("missing{asker}x{request}"));
                let answer = client.scan(&BucketId::new(&missing, 0), 0, 0, &[]).await;
                let error = answer.expect_err("no such table");
                assert_eq!(error.code(), Some(tonic::Code::NotFound), "{error}");
            }
        })
    });
    let askers: Vec<_> = askers.collect();
    let present = client.scan(&BucketId::new(&table.path, 0), 0, 0, &[]).await;
    assert!(
        present.is_ok(),
        "a real table among the missing: {present:?}"
    );
    for asker in askers {
        asker.await.expect("an asker");
    }
    let periods = started.elapsed().as_millis() / 100 + 1;
    let ranges = etcd_ranges(&etcd.endpoint) - before;
    // A look reads the table list and each table's partitions, and the node's own
    // passes read etcd beside: a few dozen reads a period at most, not one a request.
    assert!(
        ranges < 20 * periods && ranges < 200,
        "{ranges} etcd reads for 2 000 requests in {periods} periods of 100 ms"
    );
    node.kill().await;
}

/// The reads etcd at `endpoint` has served (its `etcd_debugging_mvcc_range_total`).
fn etcd_ranges(endpoint: &str) -> u128 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(endpoint).expect("etcd");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
        .expect("ask etcd's metrics");
    let mut metrics = String::new();
    stream.read_to_string(&mut metrics).expect("etcd's metrics");
    let line = (metrics.lines())
        .find(|line| line.starts_with("etcd_debugging_mvcc_range_total "))
        .unwrap_or_else(|| panic!("no range counter among etcd's metrics"));
    let value = line.split_whitespace().nth(1).expect("a value");
    value.parse::<f64>().expect("a number") as u128
}

/// Polls `tailer` from the end of `tailed` until it holds `count` ids (up to 30 s).
async fn tail_until(tailer: &mut mink_client::Tailer, tailed: &mut Vec<i64>, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while tailed.len() < count {
        assert!(
            Instant::now() < deadline,
            "the consumer is stuck at {}",
            tailed.len()
        );
        let answer = tailer
            .poll(tailed.len() as i64, Duration::from_millis(500), 0)
            .await
            .expect("poll");
        for read in &answer.batches {
            tailed.extend(first_column_ids(std::slice::from_ref(&read.batch)));
        }
    }
}

/// The one value `mink sql --connect address` answers `query` with.
pub(crate) fn sql_value(address: &str, query: &str) -> String {
    let (ok, stdout, stderr) = run_sql(address, query);
    assert!(ok, "{query}: {stderr}");
    let rows: Vec<&str> = stdout.lines().skip(1).collect();
    assert_eq!(rows.len(), 1, "{query}: {stdout}");
    rows[0].to_string()
}

/// A free loopback port's address.
pub(crate) fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").to_string()
}

/// The lake warehouse of the cluster whose log store is `store`: beside it (the nodes'
/// lake catalog is in their etcd).
pub(crate) fn cluster_warehouse(store: &TempDir) -> String {
    store.path().join("warehouse").display().to_string()
}

/// `mink server --cluster` node `id` over `dir`, listening (and advertised) on `address`.
fn start_process(
    etcd: &Etcd,
    store: &TempDir,
    id: &str,
    dir: &TempDir,
    address: &str,
) -> ServerProcess {
    start_process_with(etcd, store, id, dir, address, &[])
}

/// [`start_process`] with more flags.
pub(crate) fn start_process_with(
    etcd: &Etcd,
    store: &TempDir,
    id: &str,
    dir: &TempDir,
    address: &str,
    more: &[&str],
) -> ServerProcess {
    let cluster = format!("etcd://{}", etcd.endpoint);
    let warehouse = cluster_warehouse(store);
    let store = file_store_url(store.path());
    let args = [
        "--lake-warehouse",
        &warehouse,
        "--cluster",
        &cluster,
        "--node-id",
        id,
        "--advertise",
        address,
        "--cluster-prefix",
        "/procs",
        "--cluster-lease",
        "2s",
        "--log-store",
        &store,
        "--log-segment-size",
        "4KiB",
    ];
    ServerProcess::start_listening(dir.path(), address, &[&args[..], more].concat())
}

/// Three `mink server` processes over a real etcd: a node killed with `kill -9` loses
/// nothing acknowledged, its buckets drained and led by the others; a paused node
/// (`kill -STOP` past its lease) that wakes acknowledges nothing more and exits, and
/// nothing it was sent becomes visible; a killed node started again takes a share back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_processes_fail_over_on_kill_and_pause_and_lose_nothing() {
    let etcd = Etcd::start();
    let store = tempfile::tempdir().expect("store");
    let dirs: Vec<TempDir> = (0..3).map(|_| tempfile::tempdir().expect("dir")).collect();
    let addresses: Vec<String> = (0..3).map(|_| free_address()).collect();
    let mut processes: BTreeMap<usize, ServerProcess> = (0..3)
        .map(|i| {
            (
                i,
                start_process(&etcd, &store, &format!("n{i}"), &dirs[i], &addresses[i]),
            )
        })
        .collect();
    let admin = MinkClient::connect(&addresses[0]).await.expect("connect");
    let table = admin
        .create_table(&events_table("failover", 6, Default::default()), false)
        .await
        .expect("create");
    let mut following = Following::new(&addresses[0]).await;
    let mut written: Vec<i64> = (0..60).collect();
    following.append(&table, &written).await;

    // kill -9 n1: its buckets take writes again once drained and led by the others.
    processes.remove(&1).expect("n1").kill();
    let killed = Instant::now();
    following
        .append(&table, &(60..120).collect::<Vec<_>>())
        .await;
    written.extend(60..120);
    eprintln!(
        "after kill -9, every bucket took writes again in {:?}",
        killed.elapsed()
    );
    assert_eq!(following.ids(&table).await, model(&table, &written));
    // SQL through one node reads every bucket from its leader, and system.buckets names
    // the two leaders left.
    let count = sql_value(&addresses[0], "SELECT count(*) FROM test.failover");
    assert_eq!(count, written.len().to_string());
    let leaders =
        "SELECT count(DISTINCT leader) FROM system.buckets WHERE table_name = 'test.failover'";
    assert_eq!(sql_value(&addresses[2], leaders), "2");
    // system.nodes: the two live members lead every bucket between them.
    let nodes = "SELECT string_agg(node_id, ',' ORDER BY node_id), sum(buckets) \
                 FROM system.nodes WHERE live";
    assert_eq!(sql_value(&addresses[0], nodes), "\"n0,n2\",6");

    // n2 pauses past its lease: its buckets move; woken, it acknowledges nothing and exits.
    let paused = processes.get(&2).expect("n2");
    let n2 = MinkClient::connect(&addresses[2]).await.expect("connect");
    // A client that learned n2 leads a bucket: a call to the paused node fails once n2
    // answers no ping (a write's outcome would be unknown: not retried), and a call after
    // finds the bucket's new leader. None waits for n2 to wake.
    let plain = MinkClient::connect(&addresses[0]).await.expect("connect");
    plain.list_buckets(&table.path).await.expect("list");
    let n2_bucket = (0..table.bucket_num)
        .map(|bucket| BucketId::new(&table.path, bucket))
        .find(|bucket| plain.leader_of(bucket) == addresses[2])
        .expect("n2 leads a bucket");
    paused.pause();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let read = tokio::time::timeout(Duration::from_secs(20), plain.scan(&n2_bucket, 0, 0, &[]));
        match read.await {
            Ok(Ok(_)) => break,
            Ok(Err(error)) => assert!(Instant::now() < deadline, "{error}"),
            Err(_) => panic!("a call to a paused node waited for it"),
        }
    }
    let mut following = Following::new(&addresses[0]).await;
    following
        .append(&table, &(120..180).collect::<Vec<_>>())
        .await;
    written.extend(120..180);
    processes.get(&2).expect("n2").resume();
    for bucket in 0..table.bucket_num {
        let id = BucketId::new(&table.path, bucket);
        let rows = events(&table, &[-1]);
        let part = split_rows_by_bucket(&table, &rows, 0).expect("route");
        if part[0].bucket == id {
            let sent = n2.append(&id, vec![part[0].batch.clone()]);
            let answer = tokio::time::timeout(CALL_TIMEOUT, sent).await;
            assert!(
                !matches!(answer, Ok(Ok(_))),
                "a node past its lease acknowledged a write"
            );
        }
    }
    let mut n2_process = processes.remove(&2).expect("n2");
    let deadline = Instant::now() + Duration::from_secs(30);
    while n2_process.is_running() {
        assert!(
            Instant::now() < deadline,
            "a node past its lease kept running"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(following.ids(&table).await, model(&table, &written));

    // n1 starts again over its data directory: it joins and leads a share again.
    processes.insert(
        1,
        start_process(&etcd, &store, "n1", &dirs[1], &addresses[1]),
    );
    leads_a_bucket_soon(&addresses[1], &table).await;
    following
        .append(&table, &(180..200).collect::<Vec<_>>())
        .await;
    written.extend(180..200);
    assert_eq!(following.ids(&table).await, model(&table, &written));
}

/// Bad cluster flags are refused before anything starts, saying why.
#[test]
fn bad_cluster_flags_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().expect("dir");
    let store = file_store_url(dir.path());
    let node = ["--node-id", "n1", "--advertise", "127.0.0.1:9"];
    let warehouse = dir.path().join("warehouse").display().to_string();
    let cases: [(Vec<&str>, &str); 6] = [
        (
            [
                &["--cluster", "http://127.0.0.1:2379", "--log-store", &store],
                &node[..],
            ]
            .concat(),
            "etcd://",
        ),
        (
            [
                &["--cluster", "etcd://nohost", "--log-store", &store],
                &node[..],
            ]
            .concat(),
            "HOST:PORT",
        ),
        (
            [&["--cluster", "etcd://127.0.0.1:2379"], &node[..]].concat(),
            "--log-store",
        ),
        (
            vec![
                "--cluster",
                "etcd://127.0.0.1:2379",
                "--log-store",
                &store,
                "--node-id",
                "a/b",
                "--advertise",
                "127.0.0.1:9",
            ],
            "node id",
        ),
        (
            [
                &["--cluster", "etcd://127.0.0.1:2379", "--log-store", &store],
                &node[..],
            ]
            .concat(),
            "--lake-warehouse",
        ),
        (
            [
                &["--cluster", "etcd://127.0.0.1:2379", "--log-store", &store],
                &[
                    "--lake-catalog",
                    "sqlite:/tmp/c.db",
                    "--lake-warehouse",
                    &warehouse,
                ],
                &node[..],
            ]
            .concat(),
            "one node's file",
        ),
    ];
    for (args, reason) in cases {
        let (ok, _, stderr) = run_server(dir.path(), &args, &[]);
        assert!(!ok && stderr.contains(reason), "{args:?}: {stderr}");
    }
}
