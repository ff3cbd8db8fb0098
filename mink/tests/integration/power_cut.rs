//! Power cuts: the real `mink server` with its whole data directory on a file system that
//! keeps only what POSIX promises ([`PowerLossFs`]: a file's data once the file is
//! fsynced, a name once its directory is), through random histories cut at random points,
//! then remounted, restarted and checked against a model.
//!
//! A history appends to a log table (in concurrent writes, so that they share group
//! commits), upserts and deletes in a primary-key table, runs tiering rounds, compactions
//! and snapshot expiries on both (each has a lake, and a `log.ttl` that lets each start's
//! retention remove the small segments their logs roll to), produces to a Kafka topic and
//! commits a group's offset, and creates and drops tables. A power cut comes between steps or while one is
//! under way (inside a round, a compaction, a group commit): the server is killed, every
//! write, create, rename and unlink not made durable is dropped, and the server starts
//! again. Then:
//!
//! - the node starts, and every table whose creation was acknowledged is there;
//! - every acknowledged log row reads back exactly once (union reads of every bucket), a
//!   row whose write the cut interrupted at most once;
//! - every primary key holds its acknowledged value, or the one a write the cut
//!   interrupted gave it, in the union read and in the KV store (snapshot reads) alike;
//! - every acknowledged Kafka record is in the topic once, and the group's committed
//!   offset is the last acknowledged commit (or the one the cut interrupted);
//! - a tiering round of each table succeeds, and pyiceberg then reads exactly the table
//!   from the lake, no row twice.
//!
//! The same histories run with the log in a store (`--log-store`) on the same file
//! system: the node's local segments are then never fsynced, and after each cut it
//! rebuilds every log from what the store kept (the small segments sealed as stream
//! objects, the WAL objects after them).
//!
//! CI runs [`HISTORIES`] histories, and [`STORE_HISTORIES`] with a store;
//! `MINK_POWER_CUT_HISTORIES=N` runs N of each, and `MINK_TEST_SEED` replays a printed
//! seed.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use futures::future::{BoxFuture, join_all};
use futures::{FutureExt, TryFutureExt};
use mink_client::MinkClient;
use mink_core::options::TableOptions;
use mink_core::protocol::{BucketId, list_offsets};
use mink_core::table::{TableDescriptor, TablePath};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::pk_support::{Cells, Key, State, lake_rows, lake_values, pk_keys, pk_lake_table};
use crate::power_loss_fs::PowerLossFs;
use crate::process::ServerProcess;
use crate::python::python;
use crate::support::{events, events_table, file_store_url, lake_options, seed};

/// Histories a CI run cuts (each cut is a restart on a file system written in Python).
const HISTORIES: u64 = 2;

/// Histories a CI run cuts with the log in a store.
const STORE_HISTORIES: u64 = 1;

/// Steps of a history.
const STEPS: usize = 14;

const KAFKA: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/python/power_cut_kafka.py"
);
const READ_LAKE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/python/read_lake_rows.py"
);

/// The Kafka topic (a log table of the `default` database) and the group committing to it.
const TOPIC: &str = "pings";
const GROUP: &str = "power-cut";

/// The server's lease period: expiries may drop what reads planned 100 ms ago.
const ENV: &[(&str, &str)] = &[("MINK_LAKE_LEASE_MS", "100")];

/// Kafka on; a small KV write buffer (8 KiB a bucket), so that primary-key rows reach the
/// KV store's files every few writes; the smallest log segments, so that logs roll and
/// retention removes segments.
const ARGS: &[&str] = &[
    "--kafka-listen",
    "127.0.0.1:0",
    "--kv-write-buffer",
    "64KiB",
    "--log-segment-size",
    "4KiB",
];

/// Values written with their acknowledgement held by the test, and values whose write a
/// power cut interrupted: there after the cut, or not, but never twice.
#[derive(Debug)]
struct Written<T> {
    acked: BTreeSet<T>,
    in_flight: BTreeSet<T>,
}

impl<T> Default for Written<T> {
    fn default() -> Self {
        Self {
            acked: BTreeSet::new(),
            in_flight: BTreeSet::new(),
        }
    }
}

impl<T: Ord + Clone + std::fmt::Debug> Written<T> {
    /// Checks what a read after a cut found and takes it as what was written.
    fn settle(&mut self, what: &str, found: Vec<T>) {
        let distinct: BTreeSet<T> = found.iter().cloned().collect();
        assert_eq!(distinct.len(), found.len(), "{what}: a value read twice");
        let lost: Vec<&T> = self.acked.difference(&distinct).collect();
        assert!(
            lost.is_empty(),
            "{what}: acknowledged values lost: {lost:?}"
        );
        let unknown: Vec<&T> = distinct
            .difference(&self.acked)
            .filter(|value| !self.in_flight.contains(*value))
            .collect();
        assert!(
            unknown.is_empty(),
            "{what}: values never written: {unknown:?}"
        );
        self.acked = distinct;
        self.in_flight.clear();
    }
}

/// What a call does to the model once acknowledged.
#[derive(Debug, Clone)]
enum Effect {
    /// Rows of the log table, by id.
    Logged(Vec<i64>),
    /// Primary keys set (`Some`) or deleted (`None`).
    Keyed(Vec<(Key, Option<Cells>)>),
    /// Values produced to the Kafka topic; the call reports which were acknowledged.
    Produced(Vec<i64>),
    /// The group's committed offset.
    Committed(i64),
    /// A table created.
    Created(TablePath),
    /// A table dropped.
    Dropped(TablePath),
    /// Lake work (a round, a compaction, an expiry): the check after a cut reads the lake.
    Lake,
}

/// What a call's answer acknowledged.
enum Acknowledged {
    /// Everything the call wrote.
    All,
    /// These values only (a Kafka producer's deliveries).
    Values(Vec<i64>),
}

/// One call of a step, and its effect once acknowledged.
struct Call {
    effect: Effect,
    run: BoxFuture<'static, Result<Acknowledged, String>>,
}

/// The tables as the test wrote them.
#[derive(Debug, Default)]
struct Model {
    rows: Written<i64>,
    keys: State,
    /// Keys a write the cut interrupted would have changed, and to what.
    keys_in_flight: BTreeMap<Key, Option<Cells>>,
    topic: Written<i64>,
    committed: Option<i64>,
    commit_in_flight: Option<i64>,
    tables: Written<TablePath>,
    /// The next log id, Kafka value and table number.
    next: i64,
}

impl Model {
    fn acknowledged(&mut self, effect: Effect, acknowledged: Acknowledged) {
        match (effect, acknowledged) {
            (Effect::Logged(ids), _) => self.rows.acked.extend(ids),
            (Effect::Keyed(changes), _) => {
                for (key, cells) in changes {
                    match cells {
                        Some(cells) => self.keys.insert(key, cells),
                        None => self.keys.remove(&key),
                    };
                }
            }
            (Effect::Produced(values), Acknowledged::Values(acked)) => {
                let acked: BTreeSet<i64> = acked.into_iter().collect();
                let (acked, in_flight) = values.into_iter().partition(|v| acked.contains(v));
                self.topic.acked.extend::<Vec<i64>>(acked);
                self.topic.in_flight.extend::<Vec<i64>>(in_flight);
            }
            (Effect::Produced(values), Acknowledged::All) => self.topic.acked.extend(values),
            (Effect::Committed(offset), _) => self.committed = Some(offset),
            (Effect::Created(path), _) => {
                self.tables.acked.insert(path);
            }
            (Effect::Dropped(path), _) => {
                self.tables.acked.remove(&path);
            }
            (Effect::Lake, _) => {}
        }
    }

    fn interrupted(&mut self, effect: Effect) {
        match effect {
            Effect::Logged(ids) => self.rows.in_flight.extend(ids),
            Effect::Keyed(changes) => self.keys_in_flight.extend(changes),
            Effect::Produced(values) => self.topic.in_flight.extend(values),
            Effect::Committed(offset) => self.commit_in_flight = Some(offset),
            // There after the cut, or not.
            Effect::Created(path) | Effect::Dropped(path) => {
                self.tables.acked.remove(&path);
                self.tables.in_flight.insert(path);
            }
            Effect::Lake => {}
        }
    }

    /// Checks the primary-key table read after a cut and takes it as what was written.
    fn settle_keys(&mut self, found: State) {
        let keys: BTreeSet<&Key> = found
            .keys()
            .chain(self.keys.keys())
            .chain(self.keys_in_flight.keys())
            .collect();
        for key in keys {
            let (found, acked) = (found.get(key), self.keys.get(key));
            if found != acked {
                assert_eq!(
                    self.keys_in_flight.get(key).map(Option::as_ref),
                    Some(found),
                    "key {key:?}: read {found:?}, acknowledged {acked:?}, and no write in \
                     flight gave it that"
                );
            }
        }
        self.keys = found;
        self.keys_in_flight.clear();
    }

    fn next(&mut self, count: i64) -> std::ops::Range<i64> {
        let first = self.next;
        self.next += count;
        first..self.next
    }
}

/// The tables of a history.
struct Tables {
    log: TableDescriptor,
    pk: TableDescriptor,
    topic: TableDescriptor,
}

impl Tables {
    fn new() -> Self {
        let mut log = events_table("lg", 2, lake_options());
        let mut pk = pk_lake_table("pk", 2);
        for table in [&mut log, &mut pk] {
            // One snapshot kept: an expiry drops every older one.
            table
                .lake_properties
                .insert("history.expire.max-snapshot-age-ms".into(), "1".into());
            // Each start's retention removes every sealed segment the lake and the KV
            // store no longer need.
            table.log_ttl = Some(Duration::from_millis(1));
        }
        let schema = Schema::new(vec![Field::new("value", DataType::Utf8, true)]);
        let options = TableOptions {
            bucket_num: 1,
            ..TableOptions::default()
        };
        let path = TablePath::new("default", TOPIC);
        let topic = TableDescriptor::new(path, schema, vec![], vec![], options).expect("topic");
        Self { log, pk, topic }
    }

    fn lakes(&self) -> [&TableDescriptor; 2] {
        [&self.log, &self.pk]
    }
}

/// Where the server keeps its log.
#[derive(Debug, Clone, Copy)]
enum LogHome {
    /// In its data directory (segments fsynced on each group commit).
    DataDir,
    /// In a log store (`--log-store file://...`) beside the data directory, on the same
    /// file system: the local segments are never fsynced, the store's WAL objects are.
    Store,
}

impl LogHome {
    /// The server's arguments that put its log there.
    fn args(self, fs: &PowerLossFs) -> Vec<String> {
        match self {
            Self::DataDir => Vec::new(),
            Self::Store => vec![
                "--log-store".into(),
                file_store_url(&fs.path().join("store")),
            ],
        }
    }
}

/// The server on its power-loss file system (dropped in this order: the server first).
struct Node {
    process: Option<ServerProcess>,
    client: MinkClient,
    kafka: String,
    fs: PowerLossFs,
    log_home: LogHome,
}

impl Node {
    async fn start(fs: PowerLossFs, log_home: LogHome) -> Self {
        let mut args: Vec<String> = ARGS.iter().map(ToString::to_string).collect();
        args.extend(log_home.args(&fs));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let process = ServerProcess::start_with(&data_dir(&fs), &args, ENV);
        let client = MinkClient::connect(&process.addr).await.expect("connect");
        let kafka = process.kafka_addr.clone().expect("a Kafka listener");
        Self {
            process: Some(process),
            client,
            kafka,
            fs,
            log_home,
        }
    }

    /// Kills the server, drops everything not durable, and starts it again.
    async fn power_cut(self) -> Self {
        let Self {
            mut fs,
            process,
            log_home,
            ..
        } = self;
        tokio::task::block_in_place(|| {
            if let Some(process) = process {
                process.kill();
            }
            fs.power_cut();
        });
        Self::start(fs, log_home).await
    }
}

/// The server's data directory: one the server creates on the file system, so that the
/// cut tests its creation too.
fn data_dir(fs: &PowerLossFs) -> std::path::PathBuf {
    fs.path().join("data")
}

/// Runs a `power_cut_kafka.py` command; its JSON answer, or why it failed.
async fn kafka(args: Vec<String>) -> Result<Value, String> {
    let output =
        tokio::task::spawn_blocking(move || Command::new(python()).arg(KAFKA).args(&args).output())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("run python: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    serde_json::from_str(stdout.trim()).map_err(|e| format!("{e}: {stdout}"))
}

/// Produces `values` (as text) to partition 0 of `topic` with confluent-kafka (acks=all);
/// the values the broker acknowledged, or why the producer failed.
pub(crate) async fn produce(
    bootstrap: String,
    topic: &str,
    values: std::ops::Range<i64>,
) -> Result<Vec<i64>, String> {
    let count = values.end - values.start;
    let args = [
        "produce",
        &bootstrap,
        topic,
        &values.start.to_string(),
        &count.to_string(),
    ];
    let answer = kafka(args.map(String::from).to_vec()).await?;
    let acked = answer["acked"].as_array().ok_or("no acked values")?;
    Ok(acked.iter().filter_map(Value::as_i64).collect())
}

fn random_cells(rng: &mut StdRng) -> Cells {
    let v = rng
        .random_bool(0.8)
        .then(|| format!("v{}", rng.random_range(0..1000)));
    (v, rng.random_bool(0.8).then(|| rng.random_range(0..1000)))
}

fn random_key(rng: &mut StdRng) -> Key {
    let dt = ["2024-01-01", "2024-01-02"][rng.random_range(0..2)];
    (
        dt.to_string(),
        rng.random_range(0..30),
        rng.random_range(0..2),
    )
}

/// The calls of a random step.
fn random_step(
    rng: &mut StdRng,
    model: &mut Model,
    client: &MinkClient,
    node: &Node,
    tables: &Tables,
) -> Vec<Call> {
    let lake_table = |rng: &mut StdRng| tables.lakes()[rng.random_range(0..2)].path.clone();
    match rng.random_range(0..100) {
        // Concurrent appends to the same buckets: one group commit carries several.
        0..22 => (0..3)
            .map(|_| {
                let ids: Vec<i64> = model.next(rng.random_range(1..40)).collect();
                let batch = events(&tables.log, &ids);
                let (client, table) = (client.clone(), tables.log.clone());
                call(Effect::Logged(ids), async move {
                    client.write(&table, &batch).await
                })
            })
            .collect(),
        22..40 => {
            let changes: BTreeMap<Key, Option<Cells>> = (0..rng.random_range(1..12))
                .map(|_| (random_key(rng), Some(random_cells(rng))))
                .collect();
            let rows: Vec<(Key, Cells)> = changes
                .iter()
                .map(|(key, cells)| (key.clone(), cells.clone().expect("upserts")))
                .collect();
            let batch = lake_rows(&tables.pk, &rows);
            let (client, table) = (client.clone(), tables.pk.clone());
            let effect = Effect::Keyed(changes.into_iter().collect());
            vec![call(
                effect,
                async move { client.write(&table, &batch).await },
            )]
        }
        40..48 => {
            let keys: BTreeSet<Key> = (0..rng.random_range(1..6))
                .map(|_| random_key(rng))
                .chain(model.keys.keys().take(2).cloned())
                .collect();
            let keys: Vec<Key> = keys.into_iter().collect();
            let batch = pk_keys(&keys);
            let (client, table) = (client.clone(), tables.pk.clone());
            let effect = Effect::Keyed(keys.into_iter().map(|key| (key, None)).collect());
            vec![call(
                effect,
                async move { client.delete(&table, &batch).await },
            )]
        }
        48..62 => {
            let (client, path) = (client.clone(), lake_table(rng));
            vec![call(Effect::Lake, async move { client.tier(&path).await })]
        }
        62..70 => {
            let (client, path) = (client.clone(), lake_table(rng));
            vec![call(
                Effect::Lake,
                async move { client.compact(&path).await },
            )]
        }
        70..76 => {
            let (client, path) = (client.clone(), lake_table(rng));
            vec![call(Effect::Lake, async move {
                client.expire_snapshots(&path).await
            })]
        }
        76..84 => {
            let values = model.next(rng.random_range(1..20));
            let run =
                produce(node.kafka.clone(), TOPIC, values.clone()).map_ok(Acknowledged::Values);
            vec![Call {
                effect: Effect::Produced(values.collect()),
                run: run.boxed(),
            }]
        }
        84..90 => {
            let offset = rng.random_range(0..=model.next);
            let args = vec![
                "commit".into(),
                node.kafka.clone(),
                TOPIC.into(),
                GROUP.into(),
                offset.to_string(),
            ];
            let run = async move { kafka(args).await.map(|_| Acknowledged::All) };
            vec![Call {
                effect: Effect::Committed(offset),
                run: run.boxed(),
            }]
        }
        _ => match model.tables.acked.iter().next().cloned() {
            Some(path) if rng.random_bool(0.3) => {
                let (client, dropped) = (client.clone(), path.clone());
                let drop = async move { client.drop_table(&dropped, false).await };
                vec![call(Effect::Dropped(path), drop)]
            }
            _ => {
                // A log table, or a primary-key table with a lake (a KV store and an
                // Iceberg table to create).
                let name = format!("t{}", model.next(1).start);
                let table = match rng.random_bool(0.5) {
                    true => events_table(&name, 1, TableOptions::default()),
                    false => pk_lake_table(&name, 1),
                };
                let (client, path) = (client.clone(), table.path.clone());
                let create = async move { client.create_table(&table, false).await };
                vec![call(Effect::Created(path), create)]
            }
        },
    }
}

/// A call of the client whose success acknowledges all it wrote.
fn call<T, E: std::fmt::Display>(
    effect: Effect,
    run: impl std::future::Future<Output = Result<T, E>> + Send + 'static,
) -> Call {
    Call {
        effect,
        run: run
            .map(|result| result.map(|_| Acknowledged::All).map_err(|e| e.to_string()))
            .boxed(),
    }
}

/// Runs a step's calls together; with `cut_after`, cuts the power that long after they
/// start (they may all have finished by then, or none). Calls that fail are in flight at
/// the cut; without a cut every call must succeed.
async fn run_step(
    mut node: Node,
    model: &mut Model,
    tables: &Tables,
    calls: Vec<Call>,
    cut_after: Option<Duration>,
    step: usize,
) -> Node {
    let (effects, runs): (Vec<Effect>, Vec<_>) = calls
        .into_iter()
        .map(|call| (call.effect, call.run))
        .unzip();
    let results = tokio::spawn(join_all(runs));
    if let Some(delay) = cut_after {
        tokio::time::sleep(delay).await;
        if let Some(process) = node.process.take() {
            tokio::task::block_in_place(|| process.kill());
        }
    }
    let results = tokio::time::timeout(Duration::from_secs(60), results)
        .await
        .unwrap_or_else(|_| panic!("step {step}: calls still running after a minute"))
        .expect("calls");
    if cut_after.is_some() {
        let interrupted = results.iter().filter(|result| result.is_err()).count();
        eprintln!(
            "step {step}: a power cut {cut_after:?} in, {interrupted} of {} calls interrupted",
            results.len()
        );
    }
    for (effect, result) in effects.into_iter().zip(results) {
        match result {
            Ok(acknowledged) => model.acknowledged(effect, acknowledged),
            Err(error) if cut_after.is_some() => {
                eprintln!("step {step}: interrupted by the cut: {effect:?}: {error}");
                model.interrupted(effect);
            }
            Err(error) => panic!("step {step}: {effect:?} failed: {error}"),
        }
    }
    match cut_after {
        Some(_) => {
            let node = node.power_cut().await;
            check(&node, model, tables, step).await;
            node
        }
        None => node,
    }
}

/// Every bucket of a table (of every partition).
async fn buckets(client: &MinkClient, table: &TableDescriptor, step: usize) -> Vec<BucketId> {
    let statuses = (client.list_buckets(&table.path).await)
        .unwrap_or_else(|e| panic!("step {step}: buckets of {}: {e}", table.path));
    statuses
        .into_iter()
        .map(|status| status.bucket.expect("a bucket id"))
        .collect()
}

/// Every id of a log table's union reads, bucket by bucket.
async fn log_ids(client: &MinkClient, table: &TableDescriptor, step: usize) -> Vec<i64> {
    let mut ids = Vec::new();
    for bucket in buckets(client, table, step).await {
        let answer = (client.union(&bucket, &[0], &[]).await)
            .unwrap_or_else(|e| panic!("step {step}: union of {bucket}: {e}"));
        for batch in &answer.batches {
            ids.extend(batch.column(0).as_primitive::<Int64Type>().values());
        }
    }
    ids
}

/// The primary-key table's rows, from the union reads and the KV store (which agree).
async fn pk_state(client: &MinkClient, table: &TableDescriptor, step: usize) -> State {
    let mut state = State::new();
    for bucket in buckets(client, table, step).await {
        let union = (client.union(&bucket, &[], &[]).await)
            .unwrap_or_else(|e| panic!("step {step}: union of {bucket}: {e}"));
        let snapshot = (client.snapshot(&bucket, &[], 0).await)
            .unwrap_or_else(|e| panic!("step {step}: snapshot of {bucket}: {e}"));
        let rows =
            |batches: &[RecordBatch]| -> State { batches.iter().flat_map(lake_values).collect() };
        let from_union = rows(&union.batches);
        assert_eq!(
            from_union.len(),
            union.num_rows(),
            "step {step}: a key twice in {bucket}'s union"
        );
        assert_eq!(
            rows(&snapshot.batches),
            from_union,
            "step {step}: {bucket}'s KV store and log disagree"
        );
        state.extend(from_union);
    }
    state
}

/// The Kafka topic's values, read from its table.
async fn topic_values(client: &MinkClient, table: &TableDescriptor, step: usize) -> Vec<i64> {
    let bucket = BucketId::new(&table.path, 0);
    let mut values = Vec::new();
    let mut offset = 0;
    loop {
        let answer = (client.scan(&bucket, offset, 0, &[]).await)
            .unwrap_or_else(|e| panic!("step {step}: scan of {bucket}: {e}"));
        for batch in &answer.batches {
            let column = batch.batch.column(0).as_string::<i32>();
            values.extend(
                column
                    .iter()
                    .flatten()
                    .map(|v| v.parse::<i64>().expect("a number")),
            );
        }
        if answer.next_offset >= answer.high_watermark {
            return values;
        }
        offset = answer.next_offset;
    }
}

/// The lake table's rows as pyiceberg reads them, each a JSON list of its own columns.
fn pyiceberg_rows(node: &Node, table: &TableDescriptor, step: usize) -> Vec<Value> {
    let output = Command::new(python())
        .arg(READ_LAKE)
        .arg(data_dir(&node.fs))
        .args([&table.path.database, &table.path.name])
        .output()
        .expect("run python");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "step {step}: pyiceberg failed: {stderr}"
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .skip(2)
        .map(|line| serde_json::from_str(line).expect("a JSON row"))
        .collect()
}

/// After a cut: what the restarted node holds against the model, settling what the cut
/// interrupted; then a round of each lake, read back by pyiceberg.
async fn check(node: &Node, model: &mut Model, tables: &Tables, step: usize) {
    let client = &node.client;
    let listed = (client.list_tables(None).await).expect("list tables");
    let created: Vec<TablePath> = listed
        .into_iter()
        .filter(|path| path.name.starts_with('t') && path.database == "test")
        .collect();
    model.tables.settle("tables", created);
    model
        .rows
        .settle("log rows", log_ids(client, &tables.log, step).await);
    model.settle_keys(pk_state(client, &tables.pk, step).await);
    model.topic.settle(
        "Kafka records",
        topic_values(client, &tables.topic, step).await,
    );

    let mut starts = Vec::new();
    for table in tables.lakes() {
        for bucket in buckets(client, table, step).await {
            let start = client.list_offsets(&bucket, list_offsets::Spec::Earliest(true));
            starts.push(format!("{bucket} {}", start.await.expect("log start")));
        }
    }
    eprintln!(
        "step {step}: log starts after retention: {}",
        starts.join(", ")
    );

    let args = ["committed", &node.kafka, TOPIC, GROUP]
        .map(String::from)
        .to_vec();
    let committed = kafka(args).await.expect("read the committed offset");
    let committed = committed["committed"].as_i64();
    assert!(
        committed == model.committed || committed.is_some() && committed == model.commit_in_flight,
        "step {step}: committed offset {committed:?}, acknowledged {:?}, in flight {:?}",
        model.committed,
        model.commit_in_flight
    );
    model.committed = committed;
    model.commit_in_flight = None;

    for table in tables.lakes() {
        (client.tier(&table.path).await)
            .unwrap_or_else(|e| panic!("step {step}: round of {}: {e}", table.path));
    }
    let rows = pyiceberg_rows(node, &tables.log, step);
    let mut ids: Vec<i64> = rows.iter().filter_map(|row| row[0].as_i64()).collect();
    ids.sort_unstable();
    let acked: Vec<i64> = model.rows.acked.iter().copied().collect();
    assert_eq!(ids, acked, "step {step}: the log table's lake");
    let mut rows = pyiceberg_rows(node, &tables.pk, step);
    rows.sort_by_key(Value::to_string);
    let mut expected: Vec<Value> = (model.keys.iter())
        .map(|((dt, id, seq), (v, n))| serde_json::json!([dt, id, seq, v, n]))
        .collect();
    expected.sort_by_key(Value::to_string);
    assert_eq!(rows, expected, "step {step}: the primary-key table's lake");
}

async fn history(seed: u64, log_home: LogHome) {
    let mut rng = StdRng::seed_from_u64(seed);
    let tables = Tables::new();
    let mut node = Node::start(PowerLossFs::mount(), log_home).await;
    for table in [&tables.log, &tables.pk, &tables.topic] {
        node.client
            .create_table(table, false)
            .await
            .expect("create");
    }
    let mut model = Model::default();
    for step in 0..STEPS {
        let client = node.client.clone();
        let calls = random_step(&mut rng, &mut model, &client, &node, &tables);
        // Half the cuts within a few milliseconds (inside appends and commits), half
        // within a few hundred (inside rounds and compactions).
        let cut_after = rng.random_bool(0.3).then(|| {
            let within = if rng.random_bool(0.5) { 20 } else { 400 };
            Duration::from_millis(rng.random_range(0..within))
        });
        node = run_step(node, &mut model, &tables, calls, cut_after, step).await;
        if rng.random_bool(0.1) {
            eprintln!("step {step}: a power cut between steps");
            node = node.power_cut().await;
            check(&node, &mut model, &tables, step).await;
        }
    }
    eprintln!("the last power cut");
    node = node.power_cut().await;
    check(&node, &mut model, &tables, STEPS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cuts_lose_nothing_acknowledged() {
    let test = "power_cuts_lose_nothing_acknowledged";
    histories(test, LogHome::DataDir, HISTORIES).await;
}

/// The same histories with the log in a store on the power-loss file system: what a cut
/// leaves of the store is all the node rebuilds its log from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cuts_with_a_log_store_lose_nothing_acknowledged() {
    let test = "power_cuts_with_a_log_store_lose_nothing_acknowledged";
    histories(test, LogHome::Store, STORE_HISTORIES).await;
}

/// Runs `MINK_POWER_CUT_HISTORIES` histories (else `in_ci`), from `test`'s seed on.
async fn histories(test: &str, log_home: LogHome, in_ci: u64) {
    let histories = std::env::var("MINK_POWER_CUT_HISTORIES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(in_ci);
    let first = seed(test);
    for n in 0..histories {
        let seed = first.wrapping_add(n);
        eprintln!(
            "history {n}: seed {seed} (replay with MINK_TEST_SEED={seed} MINK_POWER_CUT_HISTORIES=1)"
        );
        history(seed, log_home).await;
    }
}
