//! Kafka clients against a cluster: three `mink server --cluster` processes over a real
//! etcd, each serving Kafka, every node's Kafka port given as bootstrap servers.
//!
//! - Two kafka-python consumers of one group read every record of a six-partition topic
//!   while the node coordinating the group is killed (`kill -9`; it leads partitions
//!   too), started again, and another partition leader is killed, with writes going on
//!   throughout: nothing is skipped, and a consumer of the group started afterwards
//!   resumes from the offsets the group committed, reading only what came after.
//!   `MINK_KAFKA_CLUSTER_TRIALS` runs more trials (1 in CI) and prints the pause: the
//!   longest time no record arrived.
//! - An idempotent confluent-kafka producer writes 3 000 records over six partitions
//!   while a partition leader is killed: each acknowledged record is in the table once.
//! - Records produced into a primary-key table whose keys route rows to buckets other
//!   nodes lead are written through those nodes: every row is in the table.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cluster::sql_value;
use crate::cluster_lake::{Cluster, until_done};
use crate::kafka::{CLIENTS, assert_each_acknowledged_once};
use crate::python::python;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/kafka_cluster.py");
/// Partitions (buckets) of each topic.
const PARTITIONS: u32 = 6;

fn start_cluster() -> Cluster {
    Cluster::start(&["--kafka-listen", "127.0.0.1:0"])
}

/// Every live node's Kafka address, comma-separated.
fn bootstrap(cluster: &Cluster) -> String {
    let addresses: Vec<&str> = (cluster.live().into_iter())
        .filter_map(|i| cluster.nodes[i].as_ref()?.kafka_addr.as_deref())
        .collect();
    addresses.join(",")
}

/// A live node's SQL address.
fn any_address(cluster: &Cluster) -> String {
    cluster.addresses[cluster.live()[0]].clone()
}

/// Creates a log table with one BIGINT `value` column: a topic whose records are
/// numbers.
fn create_numbers(cluster: &Cluster, table: &str) {
    until_done(
        &any_address(cluster),
        &format!("CREATE TABLE {table} (\"value\" BIGINT) WITH ('bucket.num' = '{PARTITIONS}')"),
    );
}

/// Inserts the values `range` into `table`, a few at a time, through live nodes.
fn insert(cluster: &Cluster, table: &str, range: std::ops::Range<i64>) {
    let values: Vec<i64> = range.collect();
    for chunk in values.chunks(20) {
        let rows: Vec<String> = chunk.iter().map(|v| format!("({v})")).collect();
        until_done(
            &any_address(cluster),
            &format!("INSERT INTO {table} VALUES {}", rows.join(",")),
        );
        std::thread::sleep(Duration::from_millis(30));
    }
}

/// Runs a Python client script; its stdout lines as they come.
fn spawn_script(script: &str, args: &[&str]) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(python())
        .arg(script)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    (child, stdout)
}

/// Reads lines until one starts with `prefix`: the rest of it.
fn wait_for_line(stdout: &mut BufReader<std::process::ChildStdout>, prefix: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        let read = stdout.read_line(&mut line).expect("read");
        assert!(read > 0, "the client ended before it printed '{prefix}'");
        if let Some(rest) = line.strip_prefix(prefix) {
            return rest.trim().to_string();
        }
    }
}

/// Waits for the script and parses the JSON document of its last line.
fn finish(mut child: Child, mut stdout: BufReader<std::process::ChildStdout>) -> Value {
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).expect("read");
    let status = child.wait().expect("wait");
    let mut stderr = String::new();
    (child.stderr.take().expect("stderr"))
        .read_to_string(&mut stderr)
        .expect("stderr");
    assert!(status.success(), "{stderr}");
    serde_json::from_str(rest.lines().last().unwrap_or_default()).expect("json")
}

fn values(answer: &Value) -> Vec<i64> {
    serde_json::from_value(answer["values"].clone()).expect("values")
}

/// The node whose Kafka port is `address`.
fn node_at(cluster: &Cluster, address: &str) -> usize {
    (cluster.live().into_iter())
        .find(|&i| {
            cluster.nodes[i]
                .as_ref()
                .and_then(|n| n.kafka_addr.as_deref())
                == Some(address)
        })
        .unwrap_or_else(|| panic!("no live node serves Kafka on {address}"))
}

fn kill(cluster: &mut Cluster, i: usize) {
    cluster.nodes[i].take().expect("a live node").kill();
}

#[test]
fn a_consumer_group_reads_every_record_while_its_coordinator_and_a_leader_die() {
    let trials: usize = std::env::var("MINK_KAFKA_CLUSTER_TRIALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let mut pauses = Vec::new();
    for trial in 0..trials {
        pauses.push(group_through_kills(trial));
    }
    pauses.sort_by(f64::total_cmp);
    let at = |q: f64| pauses[((pauses.len() - 1) as f64 * q).round() as usize];
    eprintln!(
        "the group's longest pause over {trials} trials: p50 {:.2} s, p99 {:.2} s",
        at(0.5),
        at(0.99)
    );
}

/// One trial: the group reads while its coordinator and a leader die; the longest time
/// no record arrived, in seconds.
fn group_through_kills(trial: usize) -> f64 {
    let mut cluster = start_cluster();
    let table = "db.events";
    create_numbers(&cluster, table);
    insert(&cluster, table, 0..200);
    let group = format!("readers-{trial}");
    let total = 600;
    let (child, mut stdout) = spawn_script(
        SCRIPT,
        &[
            "group",
            &bootstrap(&cluster),
            table,
            &group,
            &total.to_string(),
        ],
    );
    let coordinator = node_at(&cluster, &wait_for_line(&mut stdout, "coordinator "));
    kill(&mut cluster, coordinator);
    insert(&cluster, table, 200..400);
    cluster.wait_settled();
    cluster.start_node(coordinator);
    let leader = (coordinator + 1) % 3;
    kill(&mut cluster, leader);
    insert(&cluster, table, 400..total);
    let answer = finish(child, stdout);
    assert_eq!(answer["failures"], serde_json::json!([]), "{answer}");
    let read = values(&answer);
    for value in 0..total {
        assert!(read.contains(&value), "the group skipped {value}");
    }
    let pause = answer["max_gap"].as_f64().expect("max_gap");
    eprintln!(
        "trial {trial}: read {} records ({} distinct), longest pause {pause:.2} s",
        read.len(),
        total
    );
    // A consumer of the group started now reads what comes after its commits only.
    insert(&cluster, table, total..total + 50);
    let (child, stdout) = spawn_script(
        SCRIPT,
        &["resume", &bootstrap(&cluster), table, &group, "50"],
    );
    let mut resumed = values(&finish(child, stdout));
    resumed.sort_unstable();
    assert_eq!(resumed, (total..total + 50).collect::<Vec<_>>());
    pause
}

#[test]
fn an_idempotent_producer_writes_each_record_once_across_a_leader_s_death() {
    let mut cluster = start_cluster();
    let table = "db.counted";
    create_numbers(&cluster, table);
    let count = 3000;
    let (child, mut stdout) = spawn_script(
        CLIENTS,
        &[
            "produce-loop",
            &bootstrap(&cluster),
            table,
            &count.to_string(),
            &PARTITIONS.to_string(),
        ],
    );
    wait_for_line(&mut stdout, "acked 500");
    kill(&mut cluster, 1);
    let answer = finish(child, stdout);
    let acked: Vec<i64> = serde_json::from_value(answer["acked"].clone()).expect("acked");
    eprintln!(
        "acknowledged {} of {count}; failed {}",
        acked.len(),
        answer["failed"]
    );
    let address = any_address(&cluster);
    let rows = until_done(
        &address,
        &format!("SELECT \"value\" FROM {table} ORDER BY 1"),
    );
    assert_each_acknowledged_once(&rows, &acked);
    assert!(acked.len() >= 500);
}

#[test]
fn records_of_a_primary_key_table_reach_buckets_other_nodes_lead() {
    let cluster = start_cluster();
    let address = any_address(&cluster);
    until_done(
        &address,
        &format!(
            "CREATE TABLE db.kv (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id)) \
             WITH ('bucket.num' = '{PARTITIONS}')"
        ),
    );
    let keys = 60;
    let records: Vec<Value> = (0..keys)
        .map(|id| {
            let key = serde_json::json!({ "id": id }).to_string();
            let row = serde_json::json!({ "id": id, "v": format!("v{id}") }).to_string();
            serde_json::json!([key, row, null])
        })
        .collect();
    let records = Value::Array(records).to_string();
    let (child, stdout) = spawn_script(
        CLIENTS,
        &["produce", &bootstrap(&cluster), "db.kv", &records],
    );
    let answer = finish(child, stdout);
    let deliveries = answer["deliveries"].as_array().expect("deliveries");
    assert_eq!(deliveries.len(), keys as usize, "{answer}");
    for delivery in deliveries {
        assert_eq!(delivery["error"], Value::Null, "{answer}");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let query = "SELECT count(*) FROM db.kv WHERE v = concat('v', CAST(id AS VARCHAR))";
    while sql_value(&address, query) != keys.to_string() {
        assert!(
            Instant::now() < deadline,
            "the produced rows are not all in db.kv"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
