//! mink's Prometheus metrics (`docs/operations.md` lists every one with its meaning).
//!
//! One registry per process, as Prometheus' own client libraries keep: a process is one
//! scrape target, and every crate of mink counts into the same families without a handle
//! passed down to it. [`metrics`] holds the counters and histograms that code increments as
//! it goes (writes, reads, statements, connections, tiering rounds, Kafka requests);
//! figures that are a state rather than a count (a bucket's offsets and lake lag, the
//! memory pool in use) are read when a scrape asks, by the scrape itself ([`encode`] takes
//! them as extra families), so they cost nothing between scrapes.
//!
//! Names follow Prometheus' conventions: a `mink_` prefix, base units (`_seconds`,
//! `_bytes`), `_total` on counters. Labels are bounded: a table's name (as many as there
//! are tables; a dropped table's series are removed with [`forget_table`]), and fixed sets
//! of kinds, outcomes, causes and ports. The one label a client chooses, a Kafka group id,
//! is exported for a bounded number of groups (`mink_kafka`'s lag).

use std::sync::LazyLock;

use prometheus::core::Collector;
use prometheus::proto::{self, LabelPair, MetricFamily, MetricType};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

pub use prometheus;

/// The content type of [`encode`]'s text (Prometheus' text exposition format 0.0.4).
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Latency buckets, in seconds: 0.5 ms to about 16 s, doubling.
fn latency_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(0.0005, 2.0, 16).expect("valid buckets")
}

/// Duration buckets of background work (tiering rounds, compactions), in seconds: 10 ms to
/// about 20 min, doubling.
fn work_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(0.01, 2.0, 18).expect("valid buckets")
}

/// Every counter and histogram of the process.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Rows written (appended, upserted or deleted by key), by table.
    pub write_rows: IntCounterVec,
    /// Bytes of the Arrow batches written, by table.
    pub write_bytes: IntCounterVec,
    /// From a write's arrival at its bucket to its acknowledgement (durable).
    pub write_seconds: Histogram,
    /// Writes refused or failed, by cause.
    pub write_failures: IntCounterVec,
    /// Reads of the node's read protocol, by kind.
    pub reads: IntCounterVec,
    /// Bytes of Arrow IPC those reads sent, by kind.
    pub read_bytes: IntCounterVec,
    /// SQL statements, by kind and outcome.
    pub statements: IntCounterVec,
    /// A statement's time from planning to its last row, by kind.
    pub statement_seconds: HistogramVec,
    /// Rows returned by SQL queries.
    pub statement_rows: IntCounter,
    /// Statements refused for memory (the pool of `--sql-memory-limit`).
    pub memory_refusals: IntCounter,
    /// Logins refused: a wrong user or password on any port.
    pub logins_refused: IntCounter,
    /// Connections accepted, by port.
    pub connections: IntCounterVec,
    /// Connections refused, by port and reason.
    pub connections_refused: IntCounterVec,
    /// Connections open now, by port.
    pub connections_open: IntGaugeVec,
    /// Tiering rounds of a table, by outcome.
    pub tiering_rounds: IntCounterVec,
    /// A tiering round's duration (those that tiered rows).
    pub tiering_seconds: Histogram,
    /// Rows tiered into the lake, by table.
    pub tiered_rows: IntCounterVec,
    /// Data and delete files tiering rounds wrote.
    pub tiered_files: IntCounter,
    /// Lake upkeep runs (compaction, snapshot expiry, orphan removal, manifest rewrite),
    /// by kind and outcome.
    pub upkeep_runs: IntCounterVec,
    /// An upkeep run's duration, by kind.
    pub upkeep_seconds: HistogramVec,
    /// Files upkeep removed (compacted away, orphans deleted), by kind.
    pub upkeep_files_removed: IntCounterVec,
    /// WAL objects the log store's writer put, by outcome.
    pub wal_puts: IntCounterVec,
    /// Bytes of the WAL objects put.
    pub wal_put_bytes: IntCounter,
    /// A WAL object's PUT (and, on a `file://` store, its fsync), from start to end.
    pub wal_put_seconds: Histogram,
    /// Objects of sealed segments uploaded, by kind (`stream`: one segment, `pack`:
    /// several buckets' small segments in one object).
    pub stream_uploads: IntCounterVec,
    /// Bytes of those uploads, by kind.
    pub stream_upload_bytes: IntCounterVec,
    /// Merges of small stream objects, by outcome.
    pub stream_merges: IntCounterVec,
    /// Stream objects those merges replaced.
    pub stream_objects_merged: IntCounter,
    /// KV checkpoints written to the log store.
    pub kv_checkpoints: IntCounterVec,
    /// Bytes of those checkpoints.
    pub kv_checkpoint_bytes: IntCounter,
    /// Kafka requests, by API.
    pub kafka_requests: IntCounterVec,
    /// Records produced through the Kafka port, by topic (table).
    pub kafka_produced_records: IntCounterVec,
    /// Records fetched through the Kafka port.
    pub kafka_fetched_records: IntCounter,
    /// Bytes of Kafka record batches sent to consumers.
    pub kafka_fetched_bytes: IntCounter,
}

impl Metrics {
    fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| register(&registry, IntCounter::new(name, help));
        let counters = |name: &str, help: &str, labels: &[&str]| {
            register(&registry, IntCounterVec::new(Opts::new(name, help), labels))
        };
        let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
            let opts = HistogramOpts::new(name, help).buckets(buckets);
            register(&registry, Histogram::with_opts(opts))
        };
        let histograms = |name: &str, help: &str, labels: &[&str], buckets: Vec<f64>| {
            let opts = HistogramOpts::new(name, help).buckets(buckets);
            register(&registry, HistogramVec::new(opts, labels))
        };
        let metrics = Self {
            write_rows: counters(
                "mink_write_rows_total",
                "Rows written (appended, upserted or deleted by key).",
                &["table"],
            ),
            write_bytes: counters(
                "mink_write_bytes_total",
                "Bytes of the Arrow batches written.",
                &["table"],
            ),
            write_seconds: histogram(
                "mink_write_seconds",
                "From a write's arrival at its bucket to its durable acknowledgement.",
                latency_buckets(),
            ),
            write_failures: counters(
                "mink_write_failures_total",
                "Writes refused or failed, by cause.",
                &["cause"],
            ),
            reads: counters(
                "mink_reads_total",
                "Reads of the node's read protocol, by kind.",
                &["kind"],
            ),
            read_bytes: counters(
                "mink_read_bytes_total",
                "Bytes of Arrow IPC sent by reads, by kind.",
                &["kind"],
            ),
            statements: counters(
                "mink_sql_statements_total",
                "SQL statements, by kind and outcome.",
                &["kind", "outcome"],
            ),
            statement_seconds: histograms(
                "mink_sql_statement_seconds",
                "A SQL statement's time from planning to its last row.",
                &["kind"],
                latency_buckets(),
            ),
            statement_rows: counter(
                "mink_sql_rows_returned_total",
                "Rows returned by SQL queries.",
            ),
            memory_refusals: counter(
                "mink_sql_memory_refusals_total",
                "SQL statements refused for memory (--sql-memory-limit).",
            ),
            logins_refused: counter(
                "mink_logins_refused_total",
                "Logins refused (a wrong user or password, on any port).",
            ),
            connections: counters(
                "mink_connections_total",
                "Connections accepted, by port.",
                &["port"],
            ),
            connections_refused: counters(
                "mink_connections_refused_total",
                "Connections refused, by port and reason.",
                &["port", "reason"],
            ),
            connections_open: register(
                &registry,
                IntGaugeVec::new(
                    Opts::new("mink_connections_open", "Connections open now, by port."),
                    &["port"],
                ),
            ),
            tiering_rounds: counters(
                "mink_tiering_rounds_total",
                "Tiering rounds of a table, by outcome (tiered, idle, failed).",
                &["outcome"],
            ),
            tiering_seconds: histogram(
                "mink_tiering_round_seconds",
                "A tiering round's duration (rounds that tiered rows).",
                work_buckets(),
            ),
            tiered_rows: counters(
                "mink_tiered_rows_total",
                "Rows tiered into the lake.",
                &["table"],
            ),
            tiered_files: counter(
                "mink_tiered_files_total",
                "Data and delete files written by tiering rounds.",
            ),
            upkeep_runs: counters(
                "mink_lake_upkeep_runs_total",
                "Lake upkeep runs, by kind (compaction, expire_snapshots, remove_orphan_files, rewrite_manifests) and outcome (ok, idle, failed).",
                &["kind", "outcome"],
            ),
            upkeep_seconds: histograms(
                "mink_lake_upkeep_seconds",
                "A lake upkeep run's duration, by kind (runs that changed the lake).",
                &["kind"],
                work_buckets(),
            ),
            upkeep_files_removed: counters(
                "mink_lake_upkeep_files_removed_total",
                "Lake files upkeep removed, by kind: data and delete files compacted away; data, delete, manifest, manifest list and metadata files expired; orphans deleted; manifests merged.",
                &["kind"],
            ),
            wal_puts: counters(
                "mink_log_store_wal_puts_total",
                "WAL objects put to the log store, by outcome.",
                &["outcome"],
            ),
            wal_put_bytes: counter(
                "mink_log_store_wal_put_bytes_total",
                "Bytes of the WAL objects put to the log store.",
            ),
            wal_put_seconds: histogram(
                "mink_log_store_wal_put_seconds",
                "A WAL object's PUT (and fsync on a file:// store), start to end.",
                latency_buckets(),
            ),
            stream_uploads: counters(
                "mink_log_store_stream_uploads_total",
                "Objects of sealed segments uploaded to the log store, by kind (stream: one segment, pack: several).",
                &["kind"],
            ),
            stream_upload_bytes: counters(
                "mink_log_store_stream_upload_bytes_total",
                "Bytes of the stream objects and packs uploaded, by kind.",
                &["kind"],
            ),
            stream_merges: counters(
                "mink_log_store_stream_merges_total",
                "Merges of a bucket's small stream objects, by outcome.",
                &["outcome"],
            ),
            stream_objects_merged: counter(
                "mink_log_store_stream_objects_merged_total",
                "Stream objects replaced by merges.",
            ),
            kv_checkpoints: counters(
                "mink_kv_checkpoints_total",
                "KV store checkpoints written to the log store, by outcome.",
                &["outcome"],
            ),
            kv_checkpoint_bytes: counter(
                "mink_kv_checkpoint_bytes_total",
                "Bytes of the KV checkpoints written to the log store.",
            ),
            kafka_requests: counters(
                "mink_kafka_requests_total",
                "Kafka requests, by API.",
                &["api"],
            ),
            kafka_produced_records: counters(
                "mink_kafka_produced_records_total",
                "Records produced through the Kafka port, by topic.",
                &["topic"],
            ),
            kafka_fetched_records: counter(
                "mink_kafka_fetched_records_total",
                "Records fetched through the Kafka port.",
            ),
            kafka_fetched_bytes: counter(
                "mink_kafka_fetched_bytes_total",
                "Bytes of Kafka record batches sent to consumers.",
            ),
            registry,
        };
        // CPU, memory, file descriptors and threads of the process (Linux only).
        #[cfg(target_os = "linux")]
        (metrics.registry)
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("process metric names are unique");
        metrics
    }
}

/// Registers a metric of a name this crate chose (so unique): a clash is a bug here.
fn register<M: Collector + Clone + 'static>(
    registry: &Registry,
    metric: prometheus::Result<M>,
) -> M {
    let metric = metric.expect("a valid metric");
    registry
        .register(Box::new(metric.clone()))
        .expect("metric names are unique");
    metric
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

/// `ok` or `failed`: the outcome label of a result.
pub fn outcome<T, E>(result: &Result<T, E>) -> &'static str {
    if result.is_ok() { "ok" } else { "failed" }
}

/// Removes a dropped table's series from every family labelled by table.
pub fn forget_table(table: &str) {
    let metrics = metrics();
    for family in [
        &metrics.write_rows,
        &metrics.write_bytes,
        &metrics.tiered_rows,
        &metrics.kafka_produced_records,
    ] {
        // Absent (never written) is fine.
        let _ = family.remove_label_values(&[table]);
    }
}

/// A gauge family built by a scrape as it reads the figures: one series per label set
/// given. Built by hand rather than with `prometheus`' `GaugeVec`, whose children are
/// keyed by a hash of their label values run together (`("db.t", "12")` and
/// `("db.t1", "2")` are one child there).
#[derive(Debug)]
pub struct Gauges {
    labels: &'static [&'static str],
    family: MetricFamily,
}

impl Gauges {
    /// An empty family `name` whose series carry `labels`.
    pub fn new(name: &str, help: &str, labels: &'static [&'static str]) -> Self {
        let mut family = MetricFamily::default();
        family.set_name(name.to_string());
        family.set_help(help.to_string());
        family.set_field_type(MetricType::GAUGE);
        Self { labels, family }
    }

    /// Adds the series of label `values` (in the order of the family's labels).
    pub fn set(&mut self, values: &[&str], value: f64) {
        let labels = (self.labels.iter().zip(values))
            .map(|(name, value)| {
                let mut pair = LabelPair::default();
                pair.set_name(name.to_string());
                pair.set_value(value.to_string());
                pair
            })
            .collect();
        let mut gauge = proto::Gauge::default();
        gauge.set_value(value);
        let mut metric = proto::Metric::from_gauge(gauge);
        metric.set_label(labels);
        self.family.mut_metric().push(metric);
    }

    /// The family, as [`encode`] takes it.
    pub fn family(self) -> MetricFamily {
        self.family
    }
}

/// The process's metrics and `extra` (figures a scrape reads when it runs), in
/// Prometheus' text format.
pub fn encode(extra: Vec<MetricFamily>) -> String {
    let mut families = metrics().registry.gather();
    // A labelled family with no series yet (no table written) is left out: the text
    // format has no way to show it.
    families.extend(
        extra
            .into_iter()
            .filter(|family| !family.get_metric().is_empty()),
    );
    families.sort_by(|a, b| a.name().cmp(b.name()));
    let mut text = Vec::new();
    TextEncoder::new()
        .encode(&families, &mut text)
        .expect("text encoding of gathered families");
    String::from_utf8(text).expect("the text encoder writes UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_appear_in_the_text_with_their_labels() {
        metrics().write_rows.with_label_values(&["db.t"]).inc_by(3);
        let text = encode(Vec::new());
        assert!(
            text.contains("# TYPE mink_write_rows_total counter"),
            "{text}"
        );
        assert!(
            text.contains("mink_write_rows_total{table=\"db.t\"} 3"),
            "{text}"
        );
        forget_table("db.t");
        assert!(!encode(Vec::new()).contains("table=\"db.t\""));
    }

    #[test]
    fn a_scraped_family_without_series_is_left_out() {
        let empty = Gauges::new("mink_test_empty", "none", &["table"]);
        assert!(!encode(vec![empty.family()]).contains("mink_test_empty"));
    }

    #[test]
    fn scraped_series_whose_label_values_run_together_alike_stay_apart() {
        let mut gauges = Gauges::new("mink_test_offsets", "offsets", &["table", "bucket"]);
        gauges.set(&["db.t", "12"], 1.0);
        gauges.set(&["db.t1", "2"], 2.0);
        let text = encode(vec![gauges.family()]);
        assert!(
            text.contains("mink_test_offsets{table=\"db.t\",bucket=\"12\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("mink_test_offsets{table=\"db.t1\",bucket=\"2\"} 2"),
            "{text}"
        );
    }
}
