//! Tiering across the leaders of a cluster: three `mink server --cluster` processes over
//! a real etcd, their lake's catalog in that etcd, each node serving it as an Iceberg REST
//! catalog (`--iceberg-rest-listen`).
//!
//! Random histories of writes through any node (SQL INSERT, UPDATE and DELETE, `mink
//! load`, Flight DoPut), nodes killed with `kill -9` (also while a `mink load` runs
//! through another node: its lost writes are sent again, written once) or paused past
//! their lease (`kill -STOP`) and started again, and tiering rounds run by any node (and
//! every second by the node owning the table's rounds), each step checked against a
//! model: the union read is the model, and after a round the lake alone is too, every
//! row tiered exactly once. At the end the node owning a table's rounds is killed and
//! the node taking them over tiers the writes after it with no call; `mink read` and the
//! ADBC driver read the model through every node, pyiceberg and DuckDB the last round
//! through every node's REST catalog, and a pyiceberg client's own table lives and goes
//! through one of them. A failure prints its seed; `MINK_CLUSTER_LAKE_SEEDS` runs more
//! histories (2 in CI, about 30 s each).
//!
//! The same cluster over TLS: SQL, ADBC and rounds through any node reach every bucket;
//! and with distributed SQL, workers read every bucket from its leader.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Int64Array, RecordBatch};
use mink_client::MinkClient;
use mink_core::table::TablePath;
use mink_node::testing::Etcd;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use tempfile::TempDir;

use crate::cluster::{cluster_warehouse, free_address, sql_value, start_process_with};
use crate::iceberg_rest::{a_guest_table_lives_and_goes, engines, ids_read};
use crate::process::{ServerProcess, WorkerProcess, run_mink, run_sql};
use crate::python::python;

/// Steps of one history.
const STEPS: usize = 40;
/// Keys of the primary-key table.
const KEYS: i64 = 40;

/// Three nodes over an etcd of their own, their lake's catalog in it: their processes
/// (`None`: killed) and their addresses. Each serves the REST catalog on a port of the
/// system's choosing (a port picked ahead, as the nodes' own, could be taken meanwhile).
pub(crate) struct Cluster {
    etcd: Etcd,
    store: TempDir,
    dirs: Vec<TempDir>,
    pub(crate) addresses: Vec<String>,
    pub(crate) nodes: Vec<Option<ServerProcess>>,
    /// The flags every node starts with, but its own.
    flags: Vec<String>,
    /// Where the lake's files are.
    warehouse: String,
}

impl Cluster {
    /// Starts the three nodes, each with the flags `more` too.
    pub(crate) fn start(more: &[&str]) -> Self {
        let store = tempfile::tempdir().expect("store");
        let mut cluster = Self {
            etcd: Etcd::start(),
            warehouse: cluster_warehouse(&store),
            store,
            dirs: (0..3).map(|_| tempfile::tempdir().expect("dir")).collect(),
            addresses: (0..3).map(|_| free_address()).collect(),
            nodes: (0..3).map(|_| None).collect(),
            flags: more.iter().map(|flag| flag.to_string()).collect(),
        };
        for i in 0..3 {
            cluster.start_node(i);
        }
        cluster
    }

    pub(crate) fn start_node(&mut self, i: usize) {
        let mut flags = vec!["--iceberg-rest-listen", "127.0.0.1:0"];
        flags.extend(self.flags.iter().map(String::as_str));
        self.nodes[i] = Some(start_process_with(
            &self.etcd,
            &self.store,
            &format!("n{i}"),
            &self.dirs[i],
            &self.addresses[i],
            &flags,
        ));
    }

    /// The URI of live node `i`'s REST catalog.
    fn rest_uri(&self, i: usize) -> String {
        let node = self.nodes[i].as_ref().expect("a live node");
        let rest = node.iceberg_rest_addr.as_ref().expect("a REST catalog");
        format!("http://{rest}")
    }

    pub(crate) fn live(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_some())
            .collect()
    }

    /// A live node's address, chosen by `rng`.
    fn any(&self, rng: &mut StdRng) -> String {
        let live = self.live();
        self.addresses[*live.choose(rng).expect("a live node")].clone()
    }

    /// Waits until no bucket is assigned to a node that is not running: the controller
    /// saw its lease end and moved its buckets.
    pub(crate) fn wait_settled(&self) {
        let dead: Vec<String> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_none())
            .map(|i| format!("'n{i}'"))
            .collect();
        if dead.is_empty() {
            return;
        }
        let address = &self.addresses[self.live()[0]];
        let query = format!(
            "SELECT count(*) FROM system.nodes WHERE node_id IN ({})",
            dead.join(",")
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while sql_value(address, &query) != "0" {
            assert!(
                Instant::now() < deadline,
                "the buckets of a dead node never moved"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Runs `statement` through `address`, again while it fails (a bucket moving, a round
/// that met another node's commit), for up to 60 s; its output.
pub(crate) fn until_done(address: &str, statement: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (ok, stdout, stderr) = run_sql(address, statement);
        if ok {
            return stdout;
        }
        assert!(Instant::now() < deadline, "{statement}: {stderr}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `SELECT id, v` rows of `table` through `address`, as `id -> v`.
fn kv_rows(address: &str, table: &str) -> BTreeMap<i64, String> {
    let stdout = until_done(address, &format!("SELECT id, v FROM {table} ORDER BY id"));
    stdout
        .lines()
        .skip(1)
        .map(|line| {
            let (id, v) = line.split_once(',').expect("two columns");
            (id.parse().expect("an id"), v.trim_matches('"').to_string())
        })
        .collect()
}

/// The ids of `table` through `address`, each as often as it is there.
fn log_ids(address: &str, table: &str) -> Vec<i64> {
    let stdout = until_done(address, &format!("SELECT id FROM {table} ORDER BY id"));
    (stdout.lines().skip(1))
        .map(|id| id.parse().expect("an id"))
        .collect()
}

/// Appends `ids` to the log table through the node at `address`: with SQL's INSERT,
/// `mink load` of a CSV file, or Flight DoPut (`MinkClient::write`), as `how` says. Not
/// retried: a failed write may have written some of its rows.
fn append(
    address: &str,
    ids: &[i64],
    how: u32,
    runtime: &tokio::runtime::Runtime,
    scratch: &std::path::Path,
) -> &'static str {
    match how {
        0 => {
            let rows: Vec<String> = ids.iter().map(|id| format!("({id})")).collect();
            let statement = format!("INSERT INTO db.ev VALUES {}", rows.join(", "));
            let (ok, _, stderr) = run_sql(address, &statement);
            assert!(ok, "INSERT through {address}: {stderr}");
            "append (INSERT)"
        }
        1 => {
            let csv = scratch.join("ev.csv");
            let rows: String = ids.iter().map(|id| format!("{id}\n")).collect();
            std::fs::write(&csv, format!("id\n{rows}")).expect("csv");
            let csv = csv.to_str().expect("a UTF-8 path");
            let (ok, _, stderr) =
                run_mink(&["load", "--connect", address, "--table", "db.ev", csv]);
            assert!(ok, "mink load through {address}: {stderr}");
            "append (mink load)"
        }
        _ => {
            runtime.block_on(async {
                let client = MinkClient::connect(address).await.expect("connect");
                let table = client
                    .describe_table(&TablePath::new("db", "ev"))
                    .await
                    .expect("describe");
                let ids: ArrayRef = Arc::new(Int64Array::from(ids.to_vec()));
                let batch =
                    RecordBatch::try_new(Arc::clone(table.schema()), vec![ids]).expect("a batch");
                client.write(&table, &batch).await.expect("DoPut");
            });
            "append (DoPut)"
        }
    }
}

/// `mink load` of `ids` into db.ev through one node, in batches of 20 rows, while another
/// node is killed: the writes its buckets had in flight are sent again to their new
/// leaders, and the load ends with every row written once. Whether the node died before
/// the load ended.
fn load_through_a_death(
    cluster: &mut Cluster,
    rng: &mut StdRng,
    ids: &[i64],
    scratch: &std::path::Path,
) -> bool {
    let csv = scratch.join("loaded.csv");
    let rows: String = ids.iter().map(|id| format!("{id}\n")).collect();
    std::fs::write(&csv, format!("id\n{rows}")).expect("csv");
    let through = rng.random_range(0..3);
    let address = cluster.addresses[through].clone();
    let load = std::thread::spawn(move || {
        let csv = csv.to_str().expect("a UTF-8 path");
        let args = [
            "load",
            "--connect",
            &address,
            "--table",
            "db.ev",
            "--batch-rows",
            "20",
            csv,
        ];
        run_mink(&args)
    });
    std::thread::sleep(Duration::from_millis(rng.random_range(100..300)));
    let victim = (through + rng.random_range(1..3)) % 3;
    let during = !load.is_finished();
    cluster.nodes[victim].take().expect("live").kill();
    let (ok, _, stderr) = load.join().expect("the load's thread");
    assert!(
        ok,
        "mink load through n{through} while n{victim} died: {stderr}"
    );
    cluster.wait_settled();
    during
}

/// What the history wrote: the primary-key table's rows and the log table's ids.
#[derive(Debug, Default, PartialEq)]
struct Model {
    kv: BTreeMap<i64, String>,
    events: Vec<i64>,
}

/// What a read of the two tables sees.
#[derive(Clone, Copy)]
enum Read {
    /// The tables: their union reads.
    Tables,
    /// Their lakes alone (`t$lake`): the last tiering round.
    Lakes,
}

impl Model {
    /// The two tables as `read` through the node at `address` sees them.
    fn read(address: &str, read: Read) -> Self {
        let name = |table: &str| match read {
            Read::Tables => format!("db.{table}"),
            Read::Lakes => format!("db.\"{table}$lake\""),
        };
        Self {
            kv: kv_rows(address, &name("kv")),
            events: log_ids(address, &name("ev")),
        }
    }
}

fn values(rows: &[(i64, String)]) -> String {
    let rows: Vec<String> = rows
        .iter()
        .map(|(id, v)| format!("({id}, '{v}')"))
        .collect();
    rows.join(", ")
}

/// A few keys of the primary-key table, chosen by `rng`.
fn some_keys(rng: &mut StdRng) -> BTreeSet<i64> {
    (0..rng.random_range(1..6))
        .map(|_| rng.random_range(0..KEYS))
        .collect()
}

fn id_list(ids: &BTreeSet<i64>) -> String {
    ids.iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn history(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let scratch = tempfile::tempdir().expect("scratch");
    let mut cluster = Cluster::start(&[]);
    let lake = "'lake.enabled' = 'true', 'lake.freshness' = '1s'";
    until_done(
        &cluster.addresses[0],
        &format!(
            "CREATE TABLE db.kv (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id)) \
             WITH ('bucket.num' = '4', {lake})"
        ),
    );
    until_done(
        &cluster.addresses[1],
        &format!("CREATE TABLE db.ev (id BIGINT NOT NULL) WITH ('bucket.num' = '3', {lake})"),
    );
    let mut model = Model::default();
    let mut next_event = 0;
    for step in 0..STEPS {
        let what = match rng.random_range(0..8) {
            0 | 1 => {
                let rows: Vec<(i64, String)> = (0..rng.random_range(1..12))
                    .map(|_| {
                        let id = rng.random_range(0..KEYS);
                        (id, format!("s{step}k{id}"))
                    })
                    .collect::<BTreeMap<_, _>>()
                    .into_iter()
                    .collect();
                until_done(
                    &cluster.any(&mut rng),
                    &format!("INSERT INTO db.kv VALUES {}", values(&rows)),
                );
                model.kv.extend(rows);
                "upsert"
            }
            2 => {
                let ids = some_keys(&mut rng);
                until_done(
                    &cluster.any(&mut rng),
                    &format!("DELETE FROM db.kv WHERE id IN ({})", id_list(&ids)),
                );
                model.kv.retain(|id, _| !ids.contains(id));
                "delete"
            }
            3 => {
                let ids = some_keys(&mut rng);
                until_done(
                    &cluster.any(&mut rng),
                    &format!(
                        "UPDATE db.kv SET v = 'u{step}' WHERE id IN ({})",
                        id_list(&ids)
                    ),
                );
                for (_, v) in model.kv.iter_mut().filter(|(id, _)| ids.contains(id)) {
                    *v = format!("u{step}");
                }
                "update"
            }
            5 if cluster.live().len() == 3 => {
                let mut victim = cluster.nodes[rng.random_range(0..3)].take().expect("live");
                match rng.random_bool(0.5) {
                    true => {
                        victim.kill();
                        cluster.wait_settled();
                        "kill -9"
                    }
                    false => {
                        // Paused past its lease, its buckets move; woken, it exits.
                        victim.pause();
                        cluster.wait_settled();
                        victim.resume();
                        let deadline = Instant::now() + Duration::from_secs(30);
                        while victim.is_running() {
                            assert!(
                                Instant::now() < deadline,
                                "seed {seed}: a woken node ran on"
                            );
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        "kill -STOP past the lease"
                    }
                }
            }
            5 | 6 if cluster.live().len() < 3 => {
                let dead = (0..3).find(|&i| cluster.nodes[i].is_none());
                let dead = dead.expect("a node is down when not all three are live");
                cluster.start_node(dead);
                "restart"
            }
            4 | 6 => {
                let ids: Vec<i64> = (next_event..next_event + rng.random_range(1..30)).collect();
                next_event += ids.len() as i64;
                let through = cluster.any(&mut rng);
                let how = append(
                    &through,
                    &ids,
                    rng.random_range(0..3),
                    &runtime,
                    scratch.path(),
                );
                model.events.extend(ids);
                how
            }
            7 if cluster.live().len() == 3 && rng.random_bool(0.5) => {
                let ids: Vec<i64> = (next_event..next_event + 20_000).collect();
                next_event += ids.len() as i64;
                let during = load_through_a_death(&mut cluster, &mut rng, &ids, scratch.path());
                model.events.extend(ids);
                match during {
                    true => "kill -9 during a mink load",
                    false => "kill -9 after a mink load (it ended first)",
                }
            }
            _ => {
                check_a_round(
                    &cluster,
                    &mut rng,
                    &model,
                    &format!("seed {seed} step {step}"),
                );
                "round"
            }
        };
        eprintln!("seed {seed} step {step}: {what}");
        let reader = cluster.any(&mut rng);
        assert_eq!(
            Model::read(&reader, Read::Tables),
            model,
            "seed {seed} step {step} ({what})"
        );
    }
    // The node owning db.kv's rounds (leading its first bucket) dies: another takes the
    // role over with the bucket, and the writes after it are tiered with no call.
    let owner = sql_value(
        &cluster.addresses[cluster.live()[0]],
        "SELECT leader FROM system.buckets WHERE table_name = 'db.kv' AND bucket = 0",
    );
    if cluster.live().len() > 1 {
        let owner = (cluster
            .addresses
            .iter()
            .position(|address| *address == owner))
        .unwrap_or_else(|| panic!("seed {seed}: {owner} leads no bucket"));
        cluster.nodes[owner]
            .take()
            .expect("the owner is live")
            .kill();
        cluster.wait_settled();
        let rows: Vec<(i64, String)> = (0..3).map(|id| (id, format!("after{id}"))).collect();
        let through = cluster.any(&mut rng);
        until_done(
            &through,
            &format!("INSERT INTO db.kv VALUES {}", values(&rows)),
        );
        model.kv.extend(rows);
        eprintln!("seed {seed}: the owner of db.kv's rounds killed");
    }
    // The node owning each table's rounds tiers it by itself, every lake.freshness.
    let reader = cluster.any(&mut rng);
    let deadline = Instant::now() + Duration::from_secs(30);
    while Model::read(&reader, Read::Lakes) != model {
        assert!(
            Instant::now() < deadline,
            "seed {seed}: no node tiered the last writes"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    check_a_round(
        &cluster,
        &mut rng,
        &model,
        &format!("seed {seed} at the end"),
    );
    every_client_reads_the_model_through_every_node(&cluster, &model, seed);
    every_engine_reads_the_last_round_through_every_node(&cluster, &model, seed);
    // A REST client's own table, through one node's catalog, in the cluster's etcd.
    let rest = cluster.rest_uri(cluster.live()[0]);
    a_guest_table_lives_and_goes(&rest, "db", std::path::Path::new(&cluster.warehouse));
}

/// pyiceberg and DuckDB, through each live node's REST catalog, read the lake as the
/// last round left it: the model, at one snapshot of each table whichever node answers.
fn every_engine_reads_the_last_round_through_every_node(
    cluster: &Cluster,
    model: &Model,
    seed: u64,
) {
    let mut snapshots = BTreeSet::new();
    for i in cluster.live() {
        let answer = engines(&cluster.rest_uri(i), &["read"]);
        let through = format!("seed {seed}: pyiceberg and DuckDB through n{i}'s REST catalog");
        let keys: Vec<i64> = model.kv.keys().copied().collect();
        assert_eq!(ids_read(&answer, "db.kv"), keys, "{through}");
        let mut events = model.events.clone();
        events.sort_unstable();
        assert_eq!(ids_read(&answer, "db.ev"), events, "{through}");
        let snapshot = |table: &str| answer["tables"][table]["snapshot"].to_string();
        snapshots.insert((snapshot("db.kv"), snapshot("db.ev")));
    }
    assert_eq!(
        snapshots.len(),
        1,
        "seed {seed}: every node names the same snapshots: {snapshots:?}"
    );
}

/// Prints the rows `sys.argv[2]` answers through the Flight SQL endpoint `sys.argv[1]`,
/// one CSV line each, with the ADBC driver; over TLS when `sys.argv[3]` names the PEM
/// authority to check the endpoint's certificate against.
const ADBC_QUERY: &str = r#"
import sys
import adbc_driver_flightsql.dbapi as flight_sql

options = {}
if len(sys.argv) > 3:
    options["adbc.flight.sql.client_option.tls_root_certs"] = open(sys.argv[3]).read()
with flight_sql.connect(sys.argv[1], db_kwargs=options, autocommit=True) as conn, \
        conn.cursor() as cursor:
    cursor.execute(sys.argv[2])
    for row in cursor.fetchall():
        print(",".join(str(value) for value in row))
"#;

/// `mink read --connect` and the ADBC driver (each node's Flight SQL endpoint) read the
/// model through every live node, each bucket from its leader.
fn every_client_reads_the_model_through_every_node(cluster: &Cluster, model: &Model, seed: u64) {
    let events = |lines: &str| -> Vec<i64> {
        let mut ids: Vec<i64> = (lines.lines())
            .filter_map(|line| line.split(',').next()?.parse().ok())
            .collect();
        ids.sort_unstable();
        ids
    };
    for node in cluster.nodes.iter().flatten() {
        let (ok, stdout, stderr) = run_mink(&[
            "read",
            "--connect",
            &node.addr,
            "--table",
            "db.ev",
            "--mode",
            "log",
            "--format",
            "csv",
        ]);
        assert!(ok, "seed {seed}: mink read through {}: {stderr}", node.addr);
        assert_eq!(
            events(&stdout),
            model.events,
            "seed {seed}: mink read through {}",
            node.addr
        );
        let adbc = |query: &str| {
            let output = std::process::Command::new(python())
                .args(["-c", ADBC_QUERY, &node.sql_uri(), query])
                .output()
                .expect("run python");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                output.status.success(),
                "seed {seed}: ADBC through {}: {stderr}",
                node.addr
            );
            String::from_utf8_lossy(&output.stdout).into_owned()
        };
        let kv: BTreeMap<i64, String> = (adbc("SELECT id, v FROM db.kv ORDER BY id").lines())
            .map(|line| {
                let (id, v) = line.split_once(',').expect("two columns");
                (id.parse().expect("an id"), v.to_string())
            })
            .collect();
        assert_eq!(kv, model.kv, "seed {seed}: ADBC through {}", node.addr);
        assert_eq!(
            events(&adbc("SELECT id FROM db.ev")),
            model.events,
            "seed {seed}: ADBC through {}",
            node.addr
        );
    }
}

/// Runs a round of both tables through a node, then checks through another that the
/// lake alone holds the model: every row tiered once, none skipped.
fn check_a_round(cluster: &Cluster, rng: &mut StdRng, model: &Model, context: &str) {
    let through = cluster.any(rng);
    until_done(&through, "CALL system.tier('db.kv')");
    until_done(&through, "CALL system.tier('db.ev')");
    let reader = cluster.any(rng);
    assert_eq!(
        Model::read(&reader, Read::Lakes),
        *model,
        "{context}: the lakes after a round"
    );
}

/// Random histories (see the module docs).
#[test]
fn tiering_across_leaders_tiers_every_row_exactly_once_through_kills_and_restarts() {
    let seeds: u64 = std::env::var("MINK_CLUSTER_LAKE_SEEDS")
        .ok()
        .and_then(|seeds| seeds.parse().ok())
        .unwrap_or(2);
    for seed in 0..seeds {
        history(seed);
    }
}

/// A cluster over TLS: every node serves its port with a certificate and checks the
/// others' against `--cluster-tls-ca` when it calls them, as its Flight SQL endpoint and
/// its tiering rounds do: SQL through any node reads every bucket, and a round through
/// any node tiers every bucket.
#[test]
fn a_cluster_over_tls_reads_and_tiers_every_bucket_through_any_node() {
    let tls = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tls");
    let path = |name: &str| tls.join(name).display().to_string();
    let (cert, key, ca) = (path("server.pem"), path("server.key"), path("ca.pem"));
    let cluster = Cluster::start(&[
        "--sql-tls-cert",
        &cert,
        "--sql-tls-key",
        &key,
        "--cluster-tls-ca",
        &ca,
    ]);
    let sql = |node: usize, statement: &str| {
        let address = &cluster.addresses[node];
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (ok, stdout, stderr) = run_mink(&[
                "sql",
                "--connect",
                address,
                "--tls-ca",
                &ca,
                "--format",
                "csv",
                "-e",
                statement,
            ]);
            if ok {
                return stdout.lines().skip(1).collect::<Vec<_>>().join("\n");
            }
            assert!(
                Instant::now() < deadline,
                "{statement} through n{node}: {stderr}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    };
    sql(
        0,
        "CREATE TABLE db.t (id BIGINT NOT NULL) \
         WITH ('bucket.num' = '6', 'lake.enabled' = 'true', 'lake.freshness' = '1h')",
    );
    let rows: Vec<String> = (0..60).map(|id| format!("({id})")).collect();
    sql(1, &format!("INSERT INTO db.t VALUES {}", rows.join(", ")));
    let leaders = "SELECT count(DISTINCT leader) FROM system.buckets WHERE table_name = 'db.t'";
    assert_eq!(
        sql(2, leaders),
        "3",
        "the buckets are spread over the three nodes"
    );
    assert_eq!(sql(2, "SELECT count(*), sum(id) FROM db.t"), "60,1770");
    sql(0, "CALL system.tier('db.t')");
    assert_eq!(
        sql(1, "SELECT count(*), sum(id) FROM db.\"t$lake\""),
        "60,1770"
    );
    // Each node's own Flight SQL endpoint reads the others' buckets over TLS.
    for node in cluster.nodes.iter().flatten() {
        let uri = format!("grpc+tls://{}", node.sql_addr);
        let query = "SELECT count(*), sum(id) FROM db.t";
        let output = std::process::Command::new(python())
            .args(["-c", ADBC_QUERY, &uri, query, &ca])
            .output()
            .expect("run python");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "ADBC through {uri}: {stderr}");
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "60,1770");
    }
}

/// Distributed SQL over a cluster: a node's Flight SQL endpoint runs a statement on two
/// `mink worker`s whose tasks read each bucket's log from its leader (the worker's client
/// of the node follows NotLeader), and the answer is the whole table's.
#[test]
fn workers_read_every_bucket_of_a_cluster_from_its_leader() {
    let ports = [free_address(), free_address()];
    let workers_flag = ports.join(",");
    let cluster = Cluster::start(&["--sql-workers", &workers_flag, "--sql-task-rows", "1"]);
    until_done(
        &cluster.addresses[0],
        "CREATE TABLE db.w (id BIGINT NOT NULL, g BIGINT) WITH ('bucket.num' = '6')",
    );
    let rows: Vec<String> = (0..300).map(|id| format!("({id}, {})", id % 3)).collect();
    until_done(
        &cluster.addresses[1],
        &format!("INSERT INTO db.w VALUES {}", rows.join(", ")),
    );
    let warehouse = &cluster.warehouse;
    let node = format!("http://{}", cluster.addresses[0]);
    let _workers = ports.map(|port| {
        WorkerProcess::start(
            &[
                "--listen",
                &port,
                "--node",
                &node,
                "--lake-warehouse",
                warehouse,
            ],
            &[],
        )
    });
    let flight_sql = cluster.nodes[0].as_ref().expect("n0").sql_uri();
    let sql = |statement: &str| {
        let (ok, stdout, stderr) = run_mink(&[
            "sql",
            "--flight-sql",
            &flight_sql,
            "--format",
            "csv",
            "-e",
            statement,
        ]);
        assert!(ok, "{statement}: {stderr}");
        stdout.lines().skip(1).collect::<Vec<_>>().join(";")
    };
    let groups = "SELECT g, count(*), sum(id) FROM db.w GROUP BY g ORDER BY g";
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sql(&format!("EXPLAIN {groups}")).contains("DistributedExec") {
        assert!(Instant::now() < deadline, "the workers never joined");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(sql(groups), "0,100,14850;1,100,14950;2,100,15050");
}
