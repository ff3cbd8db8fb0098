//! `mink server`: one node leading every bucket, served over Arrow Flight until Ctrl-C or
//! SIGTERM.
//!
//! The first line on stdout is `mink node listening on HOST:PORT`, the second `mink
//! Flight SQL listening on HOST:PORT` (and, with `--kafka-listen`, the third `mink
//! Kafka listening on HOST:PORT`; with `--iceberg-rest-listen`, then `mink Iceberg REST
//! listening on HOST:PORT`; with `--metrics-listen`, then `mink metrics listening on
//! HOST:PORT`), so scripts and tests that pass `--listen
//! 127.0.0.1:0 --sql-listen 127.0.0.1:0` learn the ports. Flight SQL clients log in with
//! `--sql-user` and MINK_SQL_PASSWORD when they are set; without them the endpoint
//! accepts every call and must listen on a loopback address (see `mink_flight_sql`).
//! Every SQL statement runs in one memory pool of `--sql-memory-limit` (default: half the
//! machine's memory), and none reads or writes the server's files (`docs/security.md`).
//! Each port holds at most `--max-connections` connections at once (default 1024); one
//! more is closed as soon as it is accepted.
//! With `--demo` the node creates `demo.events` (a log table) and `demo.accounts` (a
//! primary-key table), both tiered into the lake every 10 s, and keeps writing to them,
//! so a new user has something to read at once, from the log and from the lake.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{
    ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::execution::memory_pool::MemoryPool;
use mink_client::{ConnectOptions, MinkClient};
use mink_core::options::TableOptions;
use mink_core::table::{TableDescriptor, TablePath};
use mink_flight_sql::{Credentials, FlightSqlConfig, FlightSqlHandle, ServeError, TlsIdentity};
use mink_kv::KvConfig;
use mink_lake::LakeConfig;
use mink_log::{LogConfig, LogStoreConfig};
use mink_node::Failpoint;
use mink_node::cluster::{ClusterConfig, ClusterTasks};
use mink_node::flight::limits::max_open_buckets;
use mink_node::server::{ServeOptions, serve_with};
use mink_node::{Node, NodeConfig};
use mink_sql::distributed::{DEFAULT_ROWS_PER_TASK, Distribution};
use mink_sql::session::{SqlRuntime, default_memory_limit, memory_pool, parse_size};
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::commands::metrics_port::{self, MetricsOptions, MetricsPort, Sources};
use crate::commands::sql::warehouse_storage;
use crate::embedded::{DEFAULT_DATA_DIR, read_file};
use crate::error::CliError;

/// Arguments of `mink server`.
#[derive(Debug, clap::Args)]
pub(crate) struct ServerArgs {
    /// Where tables, logs and the lake are stored.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// Address of the node's Arrow Flight endpoint. Without `--sql-user` it must be a
    /// loopback address; with it, it takes the same login and TLS as Flight SQL.
    #[arg(long, default_value = "127.0.0.1:9123")]
    listen: String,
    /// Address of the Flight SQL endpoint (ADBC, JDBC, BI tools). Without `--sql-user`
    /// it must be a loopback address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    sql_listen: String,
    /// The user clients of every port (the node's and Flight SQL) log in as (or
    /// MINK_SQL_USER); with it, every call must authenticate (password from
    /// `--sql-password` or MINK_SQL_PASSWORD).
    #[arg(long)]
    sql_user: Option<String>,
    /// The password of `--sql-user` (prefer MINK_SQL_PASSWORD: arguments are visible to
    /// other users of the machine).
    #[arg(long)]
    sql_password: Option<String>,
    /// A PEM certificate (chain): serve both ports over TLS (with `--sql-tls-key`).
    #[arg(long, requires = "sql_tls_key")]
    sql_tls_cert: Option<PathBuf>,
    /// The PEM private key of `--sql-tls-cert`.
    #[arg(long, requires = "sql_tls_cert")]
    sql_tls_key: Option<PathBuf>,
    /// Serve Kafka clients on this address (off by default; `docs/kafka.md`): topics are
    /// tables, partitions buckets. Without `--sql-user` it must be a loopback address;
    /// with it, clients log in with SASL/PLAIN as that user; TLS as the other ports.
    #[arg(long, value_name = "HOST:PORT")]
    kafka_listen: Option<String>,
    /// The address Kafka clients are told to connect to (Metadata names it as every
    /// partition's leader); default: the `--kafka-listen` address.
    #[arg(long, value_name = "HOST:PORT", requires = "kafka_listen")]
    kafka_advertised: Option<String>,
    /// Serve the lake as an Iceberg REST catalog on this address (off by default;
    /// `docs/iceberg-rest.md`): other engines list, load and append to mink's lake tables
    /// through it. Without `--sql-user` it must be a loopback address; with it, clients
    /// exchange that user and password for a token at `/v1/oauth/tokens` (client
    /// credentials); TLS as the other ports.
    #[arg(long, value_name = "HOST:PORT")]
    iceberg_rest_listen: Option<String>,
    /// Serve Prometheus metrics (`/metrics`) and the status page (`/`) on this address
    /// (off by default; `docs/operations.md`). Without `--sql-user` it must be a loopback
    /// address; with it, every request carries that user and password as HTTP basic
    /// auth; TLS as the other ports.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_listen: Option<String>,
    /// Create demo tables and keep writing to them.
    #[arg(long)]
    demo: bool,
    /// Where the lake's warehouse is: `s3://bucket/prefix` for S3 (credentials, region and
    /// endpoint from the AWS_* environment variables), or an absolute path; default
    /// `<data-dir>/lake/warehouse`. With a REST catalog, where its tables' files are as
    /// this machine reaches them. Remembered in the data directory with `--lake-catalog`.
    #[arg(long)]
    lake_warehouse: Option<String>,
    /// The lake's Iceberg catalog: a SQL catalog's database (default
    /// `sqlite:<data-dir>/lake/catalog.db?mode=rwc`), `rest:URL` for an Iceberg REST
    /// catalog (another mink's `--iceberg-rest-listen`, say), whose OAuth2 client
    /// credentials are read from MINK_LAKE_CATALOG_CREDENTIAL as `client_id:secret` (and a
    /// private certificate authority of an https catalog from MINK_LAKE_CATALOG_CA), or
    /// `etcd://HOST:PORT[,...]/PREFIX` for a catalog in etcd (with `--cluster`, the default:
    /// the cluster's etcd under `<--cluster-prefix>/lake-catalog`; a cluster needs
    /// `--lake-warehouse` and refuses a SQLite catalog).
    /// Remembered in `<data-dir>/lake/catalog.json`: `mink sql --data-dir`, `mink load
    /// --data-dir` and later starts open the same lake, and another one is refused.
    #[arg(long)]
    lake_catalog: Option<String>,
    /// Acknowledge writes without fsync (faster; a machine crash can lose acknowledged
    /// writes, a process crash cannot). With a `file://` `--log-store`: its WAL objects
    /// are not fsynced; an S3 store is durable either way.
    #[arg(long)]
    no_sync: bool,
    /// Keep the log in an object store (`docs/log-store.md`): `file:///absolute/path`, or
    /// `s3://bucket/prefix` (credentials, region and endpoint from the AWS_* environment
    /// variables, as the lake's). A write is acknowledged once the WAL object holding it
    /// is in the store; a node that lost its disk rebuilds every log from it. Only for a
    /// new data directory; remembered in `<data-dir>/log-store`, so restarts, `mink sql
    /// --data-dir` and `mink load --data-dir` use it, and another store is refused.
    #[arg(long, value_name = "URL", value_parser = mink_log::check_store_url)]
    log_store: Option<String>,
    /// With `--log-store`: the least time between two WAL uploads, which bounds the
    /// node's PUTs per second (`500ms`, `1s`; default 0 on file://: each upload takes
    /// what gathered during the last; 250ms on S3).
    #[arg(long, value_name = "DURATION", value_parser = parse_interval, requires = "log_store")]
    log_store_interval: Option<Duration>,
    /// Run as a node of a cluster over etcd (`docs/cluster.md`):
    /// `etcd://HOST:PORT[,HOST:PORT...]`. The tables are in etcd, each bucket is led by
    /// one node the cluster's controller assigns it to, and buckets move between nodes
    /// through the log store: needs `--log-store` (one store for the whole cluster),
    /// `--node-id` and `--advertise`.
    #[arg(
        long,
        value_name = "etcd://HOST:PORT,...",
        value_parser = parse_cluster,
        requires_all = ["node_id", "advertise", "log_store"]
    )]
    cluster: Option<EtcdEndpoints>,
    /// With `--cluster`: this node's id, unique among the members (letters, digits, `-`
    /// and `_`); a node restarted keeps its id.
    #[arg(long, value_name = "ID", value_parser = parse_node_id, requires = "cluster")]
    node_id: Option<String>,
    /// With `--cluster`: the node port (`--listen`) as other nodes and clients reach it,
    /// `HOST:PORT`: NotLeader answers send clients there.
    #[arg(long, value_name = "HOST:PORT", requires = "cluster")]
    advertise: Option<String>,
    /// With `--cluster`: the keys of this cluster in etcd start with it (several clusters
    /// may share one etcd).
    #[arg(
        long,
        value_name = "PREFIX",
        default_value = "/mink",
        requires = "cluster"
    )]
    cluster_prefix: String,
    /// With `--cluster`: the time to live of the node's etcd lease: how long the buckets
    /// of a node that died wait before they move.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_lease, requires = "cluster")]
    cluster_lease: Duration,
    /// With `--cluster` and TLS on the node ports (`--sql-tls-cert`): the PEM certificate
    /// authority the other nodes' certificates are checked against, when this node calls
    /// them with its login (its Flight SQL endpoint and its tiering rounds read the
    /// buckets other nodes lead from them).
    #[arg(long, value_name = "FILE", requires = "cluster")]
    cluster_tls_ca: Option<PathBuf>,
    /// With `--log-store`: an upload starts before its interval is over once this much
    /// waits (default 8MiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size, requires = "log_store")]
    log_store_batch_size: Option<usize>,
    /// With `--log-store`: the memory the block cache keeps of stream objects for reads of
    /// history (default 256MiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size, requires = "log_store")]
    log_store_cache: Option<usize>,
    /// The size at which a bucket's log rolls to a new segment file: bytes or a size
    /// (default 128MiB, at least 4KiB). `log.ttl` retention removes whole segments, so
    /// smaller ones follow the TTL more closely, at the cost of more files.
    #[arg(long, value_name = "SIZE", value_parser = parse_segment_size)]
    log_segment_size: Option<u64>,
    /// The memory all SQL statements and the node's union reads together may use: bytes
    /// (1073741824) or a size (512MiB, 2GiB). A statement or read that needs more than is
    /// left fails alone (gRPC RESOURCE_EXHAUSTED); the node and other statements go on.
    /// Default: half the machine's memory.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    sql_memory_limit: Option<usize>,
    /// The memory primary-key tables' newest rows may take together before they are
    /// written to the KV store's files: bytes or a size (default 256MiB). A bucket's are
    /// written once they reach an eighth of it. They are in the log already: a crash
    /// loses none, the restart replays them.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    kv_write_buffer: Option<usize>,
    /// The memory the KV store keeps of its files' blocks, read by lookups and by upserts
    /// of stored keys: bytes or a size (default 256MiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    kv_cache: Option<usize>,
    /// With a log store: how often each primary-key bucket that changed writes its KV
    /// checkpoint to the store (`docs/log-store.md`; default 30s), from which a node that
    /// lost its disk restores the bucket's rows. Log retention keeps a bucket's log from
    /// its checkpoint on.
    #[arg(long, value_name = "DURATION", value_parser = parse_checkpoint_interval)]
    kv_checkpoint_interval: Option<Duration>,
    /// Run statements on these `mink worker`s (`HOST:PORT,...`) when they are worth it
    /// (`docs/scaling.md`): the Flight SQL endpoint becomes their coordinator, and calls
    /// them with `--sql-user`'s login. A worker that does not answer is left out until
    /// it does.
    #[arg(long, value_name = "HOST:PORT,...", value_delimiter = ',')]
    sql_workers: Vec<String>,
    /// With `--sql-workers`: the rows of a table's read per distributed task; a statement
    /// whose reads are all smaller runs on the server alone.
    #[arg(long, value_name = "ROWS", default_value_t = DEFAULT_ROWS_PER_TASK, requires = "sql_workers")]
    sql_task_rows: u64,
    /// With `--sql-workers`: the workers serve TLS (`mink worker --tls-cert`), their
    /// certificates checked against this PEM certificate authority.
    #[arg(long, value_name = "FILE", requires = "sql_workers")]
    sql_workers_tls_ca: Option<PathBuf>,
    /// The most connections each port (the node's, Flight SQL's, Kafka's) holds open at once. A
    /// connection beyond them is closed as soon as it is accepted (and logged), so one
    /// client cannot take the server's memory or file descriptors by opening thousands;
    /// keep it below the process's file limit (`ulimit -n`).
    #[arg(
        long,
        value_name = "N",
        default_value_t = mink_auth::DEFAULT_MAX_CONNECTIONS,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    max_connections: usize,
}

/// The smallest `--log-segment-size`: below it a segment would hold a write or two.
const MIN_LOG_SEGMENT_BYTES: u64 = 4 << 10;

/// A `--log-segment-size`: a size of at least [`MIN_LOG_SEGMENT_BYTES`].
fn parse_segment_size(text: &str) -> Result<u64, String> {
    let bytes = parse_size(text)? as u64;
    match bytes >= MIN_LOG_SEGMENT_BYTES {
        true => Ok(bytes),
        false => Err(format!("a log segment must be at least 4KiB, not {text}")),
    }
}

/// A `--log-store-interval`.
fn parse_interval(text: &str) -> Result<Duration, String> {
    mink_core::options::parse_duration(text)
        .ok_or_else(|| format!("'{text}' is not a duration (500ms, 1s)"))
}

/// A `--kv-checkpoint-interval`: a duration above zero.
fn parse_checkpoint_interval(text: &str) -> Result<Duration, String> {
    match parse_interval(text)? {
        Duration::ZERO => Err("a KV checkpoint interval must be above zero".into()),
        interval => Ok(interval),
    }
}

/// The etcd endpoints of a `--cluster`, `HOST:PORT` each.
#[derive(Debug, Clone)]
struct EtcdEndpoints(Vec<String>);

/// A `--cluster`: `etcd://` and its endpoints.
fn parse_cluster(text: &str) -> Result<EtcdEndpoints, String> {
    let endpoints = text
        .strip_prefix("etcd://")
        .ok_or_else(|| format!("'{text}': a cluster is etcd://HOST:PORT[,HOST:PORT...]"))?;
    let endpoints: Vec<String> = endpoints.split(',').map(str::to_string).collect();
    match endpoints.iter().all(|endpoint| endpoint.contains(':')) {
        true => Ok(EtcdEndpoints(endpoints)),
        false => Err(format!("'{text}': each etcd endpoint is HOST:PORT")),
    }
}

/// A `--node-id`.
fn parse_node_id(text: &str) -> Result<String, String> {
    match mink_core::table::is_plain_name(text) {
        true => Ok(text.to_string()),
        false => Err(format!(
            "'{text}': a node id is letters, digits, '-' and '_'"
        )),
    }
}

/// A `--cluster-lease`: at least a second (etcd counts leases in seconds).
fn parse_lease(text: &str) -> Result<Duration, String> {
    match parse_interval(text)? {
        lease if lease >= Duration::from_secs(1) => Ok(lease),
        _ => Err("a cluster lease is at least 1s".into()),
    }
}

/// The cluster `--cluster` and its flags name; the node calls the others with its own
/// login.
fn cluster_config(args: &ServerArgs) -> Result<Option<ClusterConfig>, CliError> {
    let (Some(endpoints), Some(node_id), Some(advertise)) =
        (&args.cluster, &args.node_id, &args.advertise)
    else {
        return Ok(None);
    };
    let peers = ConnectOptions {
        credentials: login(args)?.0,
        tls_ca: args.cluster_tls_ca.as_deref().map(read_file).transpose()?,
        ..ConnectOptions::default()
    };
    Ok(Some(ClusterConfig {
        endpoints: endpoints.0.clone(),
        prefix: args.cluster_prefix.clone(),
        node_id: node_id.clone(),
        advertise: advertise.clone(),
        lease: args.cluster_lease,
        peers,
    }))
}

/// The log store `--log-store` and its flags name.
fn log_store_config(args: &ServerArgs) -> Option<LogStoreConfig> {
    let url = args.log_store.clone()?;
    let defaults = LogStoreConfig::new(url);
    Some(LogStoreConfig {
        interval: args.log_store_interval.unwrap_or(defaults.interval),
        batch_bytes: args
            .log_store_batch_size
            .map_or(defaults.batch_bytes, |size| size as u64),
        cache_bytes: args
            .log_store_cache
            .map_or(defaults.cache_bytes, |size| size as u64),
        sync: !args.no_sync,
        ..defaults
    })
}

pub(crate) async fn run(args: ServerArgs) -> Result<(), CliError> {
    let memory_limit = args.sql_memory_limit.unwrap_or_else(default_memory_limit);
    // One pool for SQL statements and the node's reads: neither can starve the process.
    let pool = memory_pool(memory_limit);
    info!(memory_limit, "memory pool of SQL statements and node reads");
    let mut config = NodeConfig::new(&args.data_dir);
    config.memory_pool = Arc::clone(&pool);
    config.kv = KvConfig::sized(args.kv_write_buffer, args.kv_cache);
    if let Some(interval) = args.kv_checkpoint_interval {
        config.kv_checkpoint_interval = interval;
    }
    let defaults = LogConfig::default();
    config.log = LogConfig {
        sync: !args.no_sync,
        segment_bytes: args.log_segment_size.unwrap_or(defaults.segment_bytes),
        ..defaults
    };
    config.log_store = log_store_config(&args);
    config.cluster = cluster_config(&args)?;
    let peers_tls_ca = (config.cluster.as_ref()).and_then(|cluster| cluster.peers.tls_ca.clone());
    // Every port holds up to --max-connections sockets; buckets get the files left.
    let ports = 2
        + u64::from(args.kafka_listen.is_some())
        + u64::from(args.iceberg_rest_listen.is_some())
        + u64::from(args.metrics_listen.is_some());
    config.max_open_buckets = mink_node::raise_open_file_limit()
        .map(|files| max_open_buckets(files, ports * args.max_connections as u64));
    let lake = lake_config(&args)?;
    let warehouse = lake.warehouse.clone();
    config.lake = Some(lake.clone());
    if let Ok(failpoint) = std::env::var("MINK_FAILPOINT") {
        config.failpoint = Some(Failpoint::parse(&failpoint).ok_or_else(|| {
            CliError::Usage(format!("unknown MINK_FAILPOINT '{failpoint}' (known: abort-before-lake-commit, abort-after-lake-commit, abort-before-compaction-commit, abort-after-compaction-commit, abort-during-create-table, abort-after-expiry-commit, abort-mid-wal-upload, abort-after-wal-upload, abort-after-stream-upload, the last three with an optional @N)"))
        })?);
    }
    let node = Node::open(config).await?;
    // A lake that cannot be opened (a bad catalog URI, credential or certificate) stops
    // the start, rather than the first round or read; one that opens is remembered.
    node.lake().await?;
    lake.remember(&args.data_dir)
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let listener = TcpListener::bind(&args.listen)
        .await
        .map_err(CliError::io(format!("cannot listen on {}", args.listen)))?;
    let (credentials, tls) = login(&args)?;
    let node_addr = listener
        .local_addr()
        .map_err(CliError::io(format!("cannot listen on {}", args.listen)))?;
    mink_auth::check_listen("the node", node_addr, credentials.as_ref())
        .map_err(|e| CliError::Usage(e.to_string()))?;
    // This process's own clients (Flight SQL, the demo writer) reach the node on a
    // loopback port of their own, in plaintext with the same login: they hold no
    // authority to check its certificate against, and clients filling the node's port
    // up to --max-connections do not cut Flight SQL off from the node.
    let internal = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(CliError::io("binding a loopback port"))?;
    let options = ServeOptions {
        credentials: credentials.clone(),
        tls,
        internal: Some(internal),
        max_connections: args.max_connections,
    };
    let handle = serve_with(Arc::clone(&node), listener, options).await?;
    let address = handle.addr();
    // In plaintext to the loopback port (its scheme says so), over TLS to the other nodes
    // of a cluster when `--cluster-tls-ca` names their authority.
    let engine_address = match handle.internal_addr() {
        Some(internal) => format!("http://{internal}"),
        None => address.to_string(),
    };
    let engine = ConnectOptions {
        credentials,
        tls_ca: peers_tls_ca,
        ..ConnectOptions::default()
    };
    let sql = serve_flight_sql(&args, pool, &warehouse, &engine_address, &engine).await?;
    let kafka = serve_kafka(&args, &node).await?;
    let kafka_line = kafka
        .as_ref()
        .map(|k| format!("mink Kafka listening on {}\n", k.addr()))
        .unwrap_or_default();
    let iceberg_rest = serve_iceberg_rest(&args, &node).await?;
    let iceberg_rest_line = iceberg_rest
        .as_ref()
        .map(|r| format!("mink Iceberg REST listening on {}\n", r.addr()))
        .unwrap_or_default();
    let sources = Sources {
        node: Some((Arc::clone(&node), address.to_string())),
        kafka: kafka.as_ref().map(|kafka| kafka.group_lag()),
    };
    let metrics = serve_metrics(&args, sources).await?;
    let metrics_line = metrics
        .as_ref()
        .map(|m| format!("mink metrics listening on {}\n", m.addr()))
        .unwrap_or_default();
    // One write, so a reader that stops after the first line never misses the others.
    print!(
        "mink node listening on {address}\nmink Flight SQL listening on {}\n{kafka_line}{iceberg_rest_line}{metrics_line}",
        sql.addr()
    );
    let mut cluster = ClusterTasks::start(&node);
    let demo = if args.demo {
        let client = MinkClient::connect_with(&engine_address, &engine).await?;
        let events = create_demo_table(&client).await?;
        let accounts = create_demo_accounts(&client).await?;
        println!(
            "demo: writing to {} and {} (try: mink sql --connect {address} -e \"SELECT count(*) FROM {}\")",
            events.path, accounts.path, events.path
        );
        Some(tokio::spawn(write_demo_rows(client, events, accounts)))
    } else {
        None
    };
    let lease_lost = async {
        match &mut cluster {
            Some(cluster) => cluster.lease_lost().await,
            None => std::future::pending().await,
        }
    };
    let lost = tokio::select! {
        () = wait_for_shutdown_signal() => false,
        () = lease_lost => true,
    };
    info!("shutting down");
    drop(metrics);
    drop(cluster);
    if let Some(demo) = demo {
        demo.abort();
    }
    if let Some(kafka) = kafka {
        kafka.shutdown().await;
    }
    if let Some(iceberg_rest) = iceberg_rest {
        iceberg_rest.shutdown().await;
    }
    sql.shutdown().await.map_err(flight_sql_error)?;
    handle.shutdown().await?;
    match lost {
        true => Err(CliError::Node(mink_node::NodeError::ClusterMetadata(
            "the node lost its lease in the cluster (etcd unreachable, or the process \
             paused past --cluster-lease): its buckets move to other nodes; start it again"
                .into(),
        ))),
        false => Ok(()),
    }
}

/// Serves Flight SQL on `--sql-listen` for the node at `node_address`.
async fn serve_flight_sql(
    args: &ServerArgs,
    pool: Arc<dyn MemoryPool>,
    warehouse: &str,
    node_address: &str,
    node_login: &ConnectOptions,
) -> Result<FlightSqlHandle, CliError> {
    let (credentials, tls) = login(args)?;
    let storage = warehouse_storage(warehouse)?;
    let mut runtime = SqlRuntime::server(pool, &storage)
        .map_err(|e| CliError::Usage(format!("the SQL runtime: {e}")))?;
    if !args.sql_workers.is_empty() {
        let tls_ca = args
            .sql_workers_tls_ca
            .as_deref()
            .map(read_file)
            .transpose()?;
        let distribution = Distribution::new(
            &args.sql_workers,
            credentials.as_ref(),
            tls_ca.as_deref(),
            args.sql_task_rows,
        )
        .map_err(|e| CliError::Usage(format!("--sql-workers: {e}")))?;
        info!(workers = ?args.sql_workers, rows_per_task = args.sql_task_rows, "statements run on workers when worth it");
        runtime = runtime.with_distribution(distribution);
    }
    let config = FlightSqlConfig {
        client: MinkClient::connect_with(node_address, node_login).await?,
        storage,
        credentials,
        tls,
    };
    let listener = TcpListener::bind(&args.sql_listen)
        .await
        .map_err(CliError::io(format!(
            "cannot listen on {}",
            args.sql_listen
        )))?;
    mink_flight_sql::serve_in(config, runtime, listener, args.max_connections)
        .map_err(flight_sql_error)
}

/// Serves Kafka clients on `--kafka-listen`, with the login and TLS of every port.
async fn serve_kafka(
    args: &ServerArgs,
    node: &Arc<Node>,
) -> Result<Option<mink_kafka::KafkaHandle>, CliError> {
    let Some(listen) = &args.kafka_listen else {
        return Ok(None);
    };
    let (credentials, tls) = login(args)?;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(CliError::io(format!("cannot listen on {listen}")))?;
    let options = mink_kafka::KafkaOptions {
        advertised: args.kafka_advertised.clone(),
        credentials,
        tls,
        max_connections: args.max_connections,
    };
    mink_kafka::serve(Arc::clone(node), listener, options)
        .await
        .map(Some)
        .map_err(|e| CliError::Usage(e.to_string()))
}

/// Serves the lake's Iceberg REST catalog on `--iceberg-rest-listen`, with the login and
/// TLS of every port. Clients of an S3 warehouse are told its endpoint and region (from
/// AWS_ENDPOINT_URL and AWS_REGION), never the server's keys: they bring their own.
async fn serve_iceberg_rest(
    args: &ServerArgs,
    node: &Arc<Node>,
) -> Result<Option<mink_iceberg_rest::IcebergRestHandle>, CliError> {
    let Some(listen) = &args.iceberg_rest_listen else {
        return Ok(None);
    };
    let (credentials, tls) = login(args)?;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(CliError::io(format!("cannot listen on {listen}")))?;
    let mut file_io = std::collections::HashMap::new();
    if args.lake_warehouse.is_some() {
        for (variable, property) in [
            ("AWS_ENDPOINT_URL", "s3.endpoint"),
            ("AWS_REGION", "s3.region"),
        ] {
            if let Ok(value) = std::env::var(variable) {
                file_io.insert(property.to_string(), value);
            }
        }
    }
    let options = mink_iceberg_rest::IcebergRestOptions {
        credentials,
        tls,
        max_connections: args.max_connections,
        file_io,
    };
    mink_iceberg_rest::serve(Arc::new(CatalogNode(Arc::clone(node))), listener, options)
        .map(Some)
        .map_err(|e| CliError::Usage(e.to_string()))
}

/// The node as its Iceberg REST catalog sees it: a lake and the names of its databases.
struct CatalogNode(Arc<Node>);

#[async_trait::async_trait]
impl mink_iceberg_rest::NodeTables for CatalogNode {
    async fn lake(&self) -> Result<&mink_lake::Lake, Box<dyn std::error::Error + Send + Sync>> {
        Ok(self.0.lake().await?)
    }

    fn is_mink_database(&self, name: &str) -> bool {
        !self.0.list_tables(Some(name)).is_empty()
    }
}

/// Serves metrics and the status page on `--metrics-listen`, with the login and TLS of
/// every port.
async fn serve_metrics(
    args: &ServerArgs,
    sources: Sources,
) -> Result<Option<MetricsPort>, CliError> {
    let Some(listen) = &args.metrics_listen else {
        return Ok(None);
    };
    let (credentials, tls) = login(args)?;
    let options = MetricsOptions {
        credentials,
        tls,
        max_connections: args.max_connections,
    };
    metrics_port::serve(listen, options, sources)
        .await
        .map(Some)
}

/// The login and TLS of every port: `--sql-user` with its password, `--sql-tls-cert`
/// and `--sql-tls-key`.
fn login(args: &ServerArgs) -> Result<(Option<Credentials>, Option<TlsIdentity>), CliError> {
    let user = args
        .sql_user
        .clone()
        .or_else(|| std::env::var("MINK_SQL_USER").ok());
    let credentials = match (user, sql_password(args)) {
        (Some(user), Some(password)) => Some(Credentials::new(user, password)),
        (None, None) => None,
        (Some(_), None) => {
            return Err(CliError::Usage(
                "--sql-user needs a password: set MINK_SQL_PASSWORD (or --sql-password)".into(),
            ));
        }
        (None, Some(_)) => {
            return Err(CliError::Usage(
                "a Flight SQL password needs --sql-user (or MINK_SQL_USER)".into(),
            ));
        }
    };
    let tls = tls_identity(args.sql_tls_cert.as_deref(), args.sql_tls_key.as_deref())?;
    Ok((credentials, tls))
}

/// The TLS identity of a port from its PEM `certificate` and `key` files, when both are
/// given.
pub(crate) fn tls_identity(
    certificate: Option<&Path>,
    key: Option<&Path>,
) -> Result<Option<TlsIdentity>, CliError> {
    let (Some(certificate), Some(key)) = (certificate, key) else {
        return Ok(None);
    };
    Ok(Some(TlsIdentity {
        certificate_pem: read_file(certificate)?,
        key_pem: read_file(key)?,
    }))
}

/// `--sql-password`, else MINK_SQL_PASSWORD.
fn sql_password(args: &ServerArgs) -> Option<String> {
    args.sql_password
        .clone()
        .or_else(|| std::env::var("MINK_SQL_PASSWORD").ok())
        .filter(|password| !password.is_empty())
}

fn flight_sql_error(error: ServeError) -> CliError {
    CliError::Usage(error.to_string())
}

/// The lake the flags name, or the one the data directory remembers (see
/// [`LakeConfig::chosen`]); the server remembers it once it opened it.
/// The lake the flags name (a cluster's node: see [`LakeConfig::of_cluster_node`], its
/// default catalog in the cluster's etcd, under `<prefix>/lake-catalog`).
fn lake_config(args: &ServerArgs) -> Result<LakeConfig, CliError> {
    let (catalog, warehouse) = (args.lake_catalog.clone(), args.lake_warehouse.clone());
    let lake = match &args.cluster {
        Some(endpoints) => {
            let prefix = args.cluster_prefix.trim_end_matches('/');
            let cluster_catalog = format!("etcd://{}{prefix}/lake-catalog", endpoints.0.join(","));
            LakeConfig::of_cluster_node(&args.data_dir, catalog, warehouse, cluster_catalog)
        }
        None => LakeConfig::chosen(&args.data_dir, catalog, warehouse),
    };
    lake.map_err(|e| CliError::Usage(e.to_string()))
}

pub(crate) async fn wait_for_shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = ctrl_c => {}
                _ = terminate.recv() => {}
            }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
}

async fn create_demo_table(client: &MinkClient) -> Result<TableDescriptor, CliError> {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("kind", DataType::Utf8, true),
        Field::new("value", DataType::Float64, true),
    ]);
    let options = TableOptions {
        bucket_num: 4,
        bucket_key: Some(vec!["id".into()]),
        lake_enabled: true,
        lake_freshness: Duration::from_secs(10),
        ..TableOptions::default()
    };
    let table = TableDescriptor::new(
        TablePath::new("demo", "events"),
        schema,
        vec![],
        vec![],
        options,
    )?;
    Ok(client.create_table(&table, true).await?)
}

/// `demo.accounts`: a primary-key table whose balances keep changing.
async fn create_demo_accounts(client: &MinkClient) -> Result<TableDescriptor, CliError> {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("owner", DataType::Utf8, true),
        Field::new("balance", DataType::Float64, true),
    ]);
    let options = TableOptions {
        bucket_num: 4,
        lake_enabled: true,
        lake_freshness: Duration::from_secs(10),
        ..TableOptions::default()
    };
    let table = TableDescriptor::new(
        TablePath::new("demo", "accounts"),
        schema,
        vec!["id".into()],
        vec![],
        options,
    )?;
    Ok(client.create_table(&table, true).await?)
}

/// Accounts of the demo: updates land on these ids.
const DEMO_ACCOUNTS: i64 = 1000;

/// The balances of 50 accounts after the `round`-th half second.
fn demo_balances(table: &TableDescriptor, round: i64) -> Result<RecordBatch, CliError> {
    let ids: Vec<i64> = (0..50)
        .map(|i| (round * 37 + i * 19) % DEMO_ACCOUNTS)
        .collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids.clone())),
        Arc::new(StringArray::from_iter_values(
            ids.iter().map(|id| format!("owner{id}")),
        )),
        Arc::new(Float64Array::from_iter_values(
            ids.iter()
                .map(|id| ((id * 31 + round * 7) % 10_000) as f64 / 100.0),
        )),
    ];
    Ok(RecordBatch::try_new(Arc::clone(table.schema()), columns)?)
}

/// Every half second until aborted: 100 new events, and 50 account balances upserted.
async fn write_demo_rows(client: MinkClient, table: TableDescriptor, accounts: TableDescriptor) {
    const KINDS: [&str; 4] = ["click", "view", "purchase", "signup"];
    let mut next_id = 0i64;
    let mut round = 0i64;
    let mut ticks = tokio::time::interval(Duration::from_millis(500));
    loop {
        ticks.tick().await;
        round += 1;
        let upserted = match demo_balances(&accounts, round) {
            Ok(batch) => client
                .write(&accounts, &batch)
                .await
                .map(|_| ())
                .map_err(CliError::from),
            Err(error) => Err(error),
        };
        if let Err(error) = upserted {
            warn!(%error, "demo upsert failed");
        }
        let ids: Vec<i64> = (next_id..next_id + 100).collect();
        next_id += 100;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(ids.clone())),
            Arc::new(TimestampMicrosecondArray::from(vec![now; ids.len()]).with_timezone("UTC")),
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|i| KINDS[(*i % 4) as usize]),
            )),
            Arc::new(Float64Array::from_iter_values(
                ids.iter().map(|i| (*i % 97) as f64 * 1.5),
            )),
        ];
        let written = match RecordBatch::try_new(Arc::clone(table.schema()), columns) {
            Ok(batch) => client
                .write(&table, &batch)
                .await
                .map(|_| ())
                .map_err(CliError::from),
            Err(e) => Err(e.into()),
        };
        if let Err(error) = written {
            warn!(%error, "demo write failed");
        }
    }
}
