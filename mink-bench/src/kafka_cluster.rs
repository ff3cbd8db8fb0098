//! `mink-bench kafka-cluster`: Kafka clients of a cluster's brokers, three nodes against
//! one.
//!
//! ```text
//! cargo run --release -p mink-bench -- kafka-cluster [--pings 500] [--buckets 6]
//!     [--lease 10s] [--dir DIR]
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

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use mink_client::MinkClient;
use mink_core::options::parse_duration;
use mink_core::table::TablePath;
use mink_node::testing::Etcd;
use tokio::net::TcpListener;

use crate::cluster::start_nodes;
use crate::error::BenchError;
use crate::harness::{Latency, Scratch, create_table, python, report};

/// Arguments of `mink-bench kafka-cluster`.
#[derive(Debug, clap::Args)]
pub(crate) struct KafkaClusterArgs {
    /// Records whose produce -> consume latency is measured, on each cluster.
    #[arg(long, default_value_t = 500)]
    pings: usize,
    /// Partitions (buckets) of the table.
    #[arg(long, default_value_t = 6)]
    buckets: u32,
    /// The nodes' etcd lease (`--cluster-lease`).
    #[arg(long, default_value = "10s", value_parser = parse_lease)]
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
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(BenchError::io("binding a loopback port"))?;
        let kafka = mink_kafka::serve(
            Arc::clone(node.node()),
            listener,
            mink_kafka::KafkaOptions::default(),
        )
        .await
        .map_err(|e| BenchError::Usage(e.to_string()))?;
        brokers.push(kafka);
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
