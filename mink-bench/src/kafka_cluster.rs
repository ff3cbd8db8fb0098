//! `mink-bench kafka-cluster`: Kafka clients of a cluster's brokers: produce -> consume
//! latency through three nodes against one, and a consumer group's pause when the node
//! coordinating it dies.
//!
//! ```text
//! cargo run --release -p mink-bench -- kafka-cluster [--pings 500] [--buckets 6]
//!     [--trials 10] [--lease 2s] [--dir DIR]
//! ```
//!
//! Two clusters run in this process, one after the other, over an etcd of their own
//! (Debian's `etcd-server` on `PATH`) and a `file://` log store in the working directory:
//! one node, then three, each node with a Kafka listener on a loopback port. A log table
//! `(value VARCHAR)` of `--buckets` partitions spreads over the nodes. confluent-kafka
//! from Python (`MINK_PYTHON`, else `python3`, with `pip install confluent-kafka`), given
//! every node as a bootstrap server, produces each ping alone (`acks=all`, flushed) to
//! partition `i % buckets` and times it until a consumer assigned every partition, waiting
//! at their ends, has it; one round over the partitions first is not timed.
//!
//! Figure: produce -> consume latency, p50 and p99, three brokers against one (the
//! baseline: a cluster of one, its log in the same store and its Kafka state in the same
//! etcd). Every node runs in this one process, on the same cores: this says what the
//! brokers' spread costs a client, not what more machines give.
//!
//! Second figure, over `--trials` fresh clusters of three (kafka-python too: `pip install
//! kafka-python`): two kafka-python consumers of one group read the table while a writer
//! appends a row to each bucket every 20 ms (through a node that stays); once they hold
//! their partitions and read, the node coordinating the group dies (it stops serving
//! Kafka and its node port and renews its lease no more, as a killed process does). The
//! group's pause is the longest time, from then until `2 x lease + 8 s` later, in which
//! neither consumer received a record. Its baseline is the lease: the dead node's broker
//! stays in the list until its lease ends, and its partitions (it leads a third) have no
//! new records until their buckets move.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arrow::array::{ArrayRef, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use mink_client::MinkClient;
use mink_core::options::parse_duration;
use mink_core::protocol::BucketId;
use mink_core::table::{TableDescriptor, TablePath};
use mink_node::testing::{ClusterNode, Etcd};
use tokio::net::TcpListener;

use crate::cluster::start_nodes;
use crate::error::BenchError;
use crate::harness::{Latency, Scratch, create_table, python, python_interpreter, report};

/// Arguments of `mink-bench kafka-cluster`.
#[derive(Debug, clap::Args)]
pub(crate) struct KafkaClusterArgs {
    /// Records whose produce -> consume latency is measured, on each cluster.
    #[arg(long, default_value_t = 500)]
    pings: usize,
    /// Partitions (buckets) of the table.
    #[arg(long, default_value_t = 6)]
    buckets: u32,
    /// Clusters whose group coordinator dies, for the group's pause.
    #[arg(long, default_value_t = 10)]
    trials: usize,
    /// The nodes' etcd lease (`--cluster-lease`).
    #[arg(long, default_value = "2s", value_parser = parse_lease)]
    lease: Duration,
    /// Working directory (default: a temporary one, removed after).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

fn parse_lease(text: &str) -> Result<Duration, String> {
    parse_duration(text).ok_or_else(|| format!("'{text}' is not a duration (2s, 500ms)"))
}

/// The pinging client: produces each ping, waits for the consumer to have it.
const SCRIPT: &str = r#"
import sys, time
from confluent_kafka import Consumer, Producer, TopicPartition
bootstrap, topic, partitions, pings = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-latency",
                     "enable.auto.commit": False, "fetch.wait.max.ms": 500, "fetch.min.bytes": 1})
consumer.assign([TopicPartition(topic, p, -1) for p in range(partitions)])
consumer.poll(0.5)
producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
for i in range(partitions + pings):
    marker = f"ping{i}".encode()
    sent = time.perf_counter()
    producer.produce(topic, value=marker, partition=i % partitions)
    producer.flush(10)
    while True:
        m = consumer.poll(1.0)
        if m is not None and not m.error() and m.value() == marker:
            break
    if i >= partitions:
        print(f"latency {(time.perf_counter() - sent) * 1e3}", flush=True)
consumer.close()
"#;

pub(crate) async fn run(args: KafkaClusterArgs) -> Result<(), BenchError> {
    if args.pings == 0 || args.buckets == 0 {
        return Err(BenchError::Usage(
            "--pings and --buckets must be positive".into(),
        ));
    }
    let scratch = Scratch::new(args.dir.clone())?;
    let etcd = Etcd::start();
    let one = latencies(&etcd, &scratch.path.join("one"), 1, &args).await?;
    let three = latencies(&etcd, &scratch.path.join("three"), 3, &args).await?;
    println!(
        "# produce -> consume latency of one record (acks=all), {} pings over {} partitions",
        args.pings, args.buckets
    );
    report("one broker (baseline)", one, &[]);
    let ratio = format!("to one broker's {}", three.ratio_to(&one));
    report("three brokers", three, &[ratio]);
    let mut pauses = Vec::with_capacity(args.trials);
    for trial in 0..args.trials {
        let dir = scratch.path.join(format!("pause-{trial}"));
        let pause = group_pause(&etcd, &dir, trial, &args).await?;
        eprintln!("trial {trial}: the group paused {pause:.2} s");
        pauses.push(pause * 1e3);
    }
    println!(
        "# a consumer group's longest pause when its coordinator's node dies, {} trials, lease {:?}",
        args.trials, args.lease
    );
    let lease = Latency::new(vec![args.lease.as_secs_f64() * 1e3]);
    report("the lease (baseline)", lease, &[]);
    let pauses = Latency::new(pauses);
    let ratio = format!("to the lease {}", pauses.ratio_to(&lease));
    report("the group's pause", pauses, &[ratio]);
    Ok(())
}

/// A cluster of `size` nodes under `dir`, each serving Kafka: the pings' latencies.
async fn latencies(
    etcd: &Etcd,
    dir: &Path,
    size: usize,
    args: &KafkaClusterArgs,
) -> Result<Latency, BenchError> {
    let nodes = start_nodes(etcd, dir, &format!("kafka-{size}"), size, args.lease).await?;
    let mut brokers = Vec::with_capacity(size);
    for node in &nodes {
        brokers.push(serve_kafka(node).await?);
    }
    let client = MinkClient::connect(&nodes[0].address).await?;
    let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("value", DataType::Utf8, true)]));
    let path = TablePath::new("bench", "pings");
    create_table(&client, &path, args.buckets, &schema, &[]).await?;
    wait_until_led(&client, &path, args.buckets).await?;
    let bootstrap: Vec<String> = brokers.iter().map(|b| b.addr().to_string()).collect();
    let script_args = vec![
        bootstrap.join(","),
        "bench.pings".to_string(),
        args.buckets.to_string(),
        args.pings.to_string(),
    ];
    eprintln!("bench: {} pings through {size} broker(s) ...", args.pings);
    let output = python(SCRIPT, &script_args, "confluent-kafka").map_err(BenchError::Usage)?;
    let latency = Latency::new(
        output
            .lines()
            .filter_map(|line| line.strip_prefix("latency ")?.parse().ok())
            .collect(),
    );
    for broker in brokers {
        broker.shutdown().await;
    }
    for node in nodes {
        node.kill().await;
    }
    Ok(latency)
}

/// Waits until every bucket of the table has a leader: the controller assigned them.
async fn wait_until_led(
    client: &MinkClient,
    path: &TablePath,
    buckets: u32,
) -> Result<(), BenchError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match client.list_buckets(path).await {
            Ok(statuses) if statuses.len() == buckets as usize => return Ok(()),
            _ if tokio::time::Instant::now() > deadline => {
                return Err(BenchError::Mismatch(format!(
                    "the buckets of {path} were not all led within 60 s"
                )));
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The group's consumers: prints `coordinator HOST:PORT` once both hold partitions and
/// have read, `killed` on stdin marks the coordinator's death, `stop` ends it: prints
/// the longest time without a record from the death on, in seconds.
const GROUP_SCRIPT: &str = r#"
import sys, threading, time
import kafka
bootstrap, topic, group = sys.argv[1], sys.argv[2], sys.argv[3]
members = [kafka.KafkaConsumer(topic, bootstrap_servers=bootstrap.split(","), group_id=group,
                               auto_offset_reset="latest", session_timeout_ms=6000,
                               heartbeat_interval_ms=500, metadata_max_age_ms=1000,
                               reconnect_backoff_ms=100, reconnect_backoff_max_ms=500,
                               retry_backoff_ms=100) for _ in range(2)]
arrivals, lock, stop = [], threading.Lock(), threading.Event()
def read(member):
    while not stop.is_set():
        if member.poll(timeout_ms=100):
            with lock:
                arrivals.append(time.monotonic())
threads = [threading.Thread(target=read, args=(m,)) for m in members]
for thread in threads:
    thread.start()
while not (all(m.assignment() for m in members) and len(arrivals) > 10):
    time.sleep(0.1)
coordinator = members[0]._client.cluster.broker_metadata(members[0]._coordinator.coordinator_id)
print(f"coordinator {coordinator.host}:{coordinator.port}", flush=True)
sys.stdin.readline()
killed = time.monotonic()
sys.stdin.readline()
stop.set()
for thread in threads:
    thread.join()
times = [killed] + sorted(t for t in arrivals if t > killed) + [time.monotonic()]
print(f"pause {max(b - a for a, b in zip(times, times[1:]))}", flush=True)
"#;

/// One trial of the group's pause: a fresh cluster of three, its group coordinator's
/// node killed; the pause in seconds.
async fn group_pause(
    etcd: &Etcd,
    dir: &Path,
    trial: usize,
    args: &KafkaClusterArgs,
) -> Result<f64, BenchError> {
    let mut nodes: Vec<Option<ClusterNode>> =
        (start_nodes(etcd, dir, &format!("kafka-pause-{trial}"), 3, args.lease).await?)
            .into_iter()
            .map(Some)
            .collect();
    let mut brokers = Vec::with_capacity(nodes.len());
    for node in nodes.iter().flatten() {
        brokers.push(Some(serve_kafka(node).await?));
    }
    let first = nodes[0].as_ref().expect("started");
    let client = MinkClient::connect(&first.address).await?;
    let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new(
        "value",
        DataType::Int64,
        true,
    )]));
    let path = TablePath::new("bench", "events");
    let table = create_table(&client, &path, args.buckets, &schema, &[]).await?;
    wait_until_led(&client, &path, args.buckets).await?;
    let bootstrap: Vec<String> = (brokers.iter().flatten())
        .map(|b| b.addr().to_string())
        .collect();
    let mut script = Command::new(python_interpreter())
        .args([
            "-c",
            GROUP_SCRIPT,
            &bootstrap.join(","),
            "bench.events",
            "pause",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(BenchError::io(
            "running Python (MINK_PYTHON) with kafka-python",
        ))?;
    let mut stdout = BufReader::new(script.stdout.take().expect("piped"));
    let coordinator = tokio::task::spawn_blocking(move || {
        let line = next_line(&mut stdout, "coordinator ");
        (line, stdout)
    });
    // Rows flow to every bucket while the group reads, through a node that stays.
    let writing = Arc::new(AtomicBool::new(true));
    let writers = spawn_writers(&table, &nodes, &writing).await?;
    let (coordinator, mut stdout) = coordinator
        .await
        .map_err(|e| BenchError::Usage(e.to_string()))?;
    let coordinator = coordinator?;
    let dying = (brokers.iter())
        .position(|b| {
            b.as_ref()
                .is_some_and(|b| b.addr().to_string() == coordinator)
        })
        .ok_or_else(|| BenchError::Mismatch(format!("no broker at {coordinator}")))?;
    let mut stdin = script.stdin.take().expect("piped");
    tokio::time::sleep(Duration::from_secs(2)).await;
    writeln!(stdin, "killed").map_err(BenchError::io("telling the consumers"))?;
    stdin
        .flush()
        .map_err(BenchError::io("telling the consumers"))?;
    if let Some(broker) = brokers[dying].take() {
        broker.shutdown().await;
    }
    if let Some(node) = nodes[dying].take() {
        node.kill().await;
    }
    tokio::time::sleep(args.lease * 2 + Duration::from_secs(8)).await;
    writeln!(stdin, "stop").map_err(BenchError::io("telling the consumers"))?;
    drop(stdin);
    let pause = tokio::task::spawn_blocking(move || next_line(&mut stdout, "pause "))
        .await
        .map_err(|e| BenchError::Usage(e.to_string()))??;
    let _ = script.wait();
    writing.store(false, Ordering::Relaxed);
    for writer in writers {
        let _ = writer.await;
    }
    for broker in brokers.into_iter().flatten() {
        broker.shutdown().await;
    }
    for node in nodes.into_iter().flatten() {
        node.kill().await;
    }
    pause
        .parse()
        .map_err(|_| BenchError::Mismatch(format!("a bad pause: {pause}")))
}

/// A Kafka listener on a loopback port for `node`.
async fn serve_kafka(node: &ClusterNode) -> Result<mink_kafka::KafkaHandle, BenchError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(BenchError::io("binding a loopback port"))?;
    mink_kafka::serve(
        Arc::clone(node.node()),
        listener,
        mink_kafka::KafkaOptions::default(),
    )
    .await
    .map_err(|e| BenchError::Usage(e.to_string()))
}

/// One task per bucket appending a row every 20 ms while `writing`, through the last
/// node (a write that fails, its bucket moving, is let go).
async fn spawn_writers(
    table: &TableDescriptor,
    nodes: &[Option<ClusterNode>],
    writing: &Arc<AtomicBool>,
) -> Result<Vec<tokio::task::JoinHandle<()>>, BenchError> {
    let through = nodes.iter().flatten().last().expect("a node");
    let client = Arc::new(MinkClient::connect(&through.address).await?);
    let schema = Arc::clone(table.schema());
    Ok((0..table.bucket_num)
        .map(|bucket| {
            let bucket = BucketId {
                table: table.path.to_string(),
                partition: None,
                bucket,
            };
            let (client, writing, schema) = (
                Arc::clone(&client),
                Arc::clone(writing),
                Arc::clone(&schema),
            );
            tokio::spawn(async move {
                let mut value = 0_i64;
                while writing.load(Ordering::Relaxed) {
                    let column: ArrayRef = Arc::new(Int64Array::from(vec![value]));
                    if let Ok(row) = RecordBatch::try_new(Arc::clone(&schema), vec![column]) {
                        let _ = client.append(&bucket, vec![row]).await;
                    }
                    value += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        })
        .collect())
}

/// Reads lines until one starts with `prefix`: the rest of it.
fn next_line(stdout: &mut impl BufRead, prefix: &str) -> Result<String, BenchError> {
    let mut line = String::new();
    loop {
        line.clear();
        let read = stdout
            .read_line(&mut line)
            .map_err(BenchError::io("reading the consumers' output"))?;
        if read == 0 {
            return Err(BenchError::Usage(format!(
                "the consumers ended before '{prefix}' (MINK_PYTHON needs kafka-python)"
            )));
        }
        if let Some(rest) = line.strip_prefix(prefix) {
            return Ok(rest.trim().to_string());
        }
    }
}
