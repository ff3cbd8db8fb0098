//! The figures of a node that are a state, not a count, read when a scrape asks
//! (`mink_metrics::encode` takes them): every bucket it leads with its offsets, its lake
//! seam and how far behind the lake is, in offsets and in seconds, and its leader epoch.

use arrow::array::{Array, RecordBatch};
use mink_core::table::TablePath;
use mink_metrics::Gauges;
use mink_metrics::prometheus::IntCounter;
use mink_metrics::prometheus::proto::MetricFamily;

use super::Node;
use crate::metadata::now_ms;

/// A table's series of `mink_write_rows_total` and `mink_write_bytes_total`, looked up
/// once when the node opens the table rather than at every write.
#[derive(Debug)]
pub(super) struct WriteCounters {
    rows: IntCounter,
    bytes: IntCounter,
}

impl WriteCounters {
    pub(super) fn of(table: &TablePath) -> Self {
        let metrics = mink_metrics::metrics();
        let label = [table.to_string()];
        Self {
            rows: metrics.write_rows.with_label_values(&label),
            bytes: metrics.write_bytes.with_label_values(&label),
        }
    }

    /// `batch` was written: its rows, and its bytes as Arrow in memory (each column's
    /// slice: a batch decoded from a client's message shares that message's buffers).
    pub(super) fn add(&self, batch: &RecordBatch) {
        self.rows.inc_by(batch.num_rows() as u64);
        let bytes: usize = (batch.columns().iter())
            .map(|column| column.to_data().get_slice_memory_size().unwrap_or(0))
            .sum();
        self.bytes.inc_by(bytes as u64);
    }
}

/// The labels of a bucket's series.
const BUCKET_LABELS: &[&str] = &["table", "partition", "bucket"];

impl Node {
    /// The node's bucket gauges as metric families, as of now. Reads the metadata of
    /// every table (etcd, in a cluster): run it off the async runtime's workers.
    pub fn scraped_metrics(&self) -> Vec<MetricFamily> {
        let bucket_gauges = |name, help| Gauges::new(name, help, BUCKET_LABELS);
        let mut high_watermark = bucket_gauges(
            "mink_bucket_high_watermark",
            "The offset after a bucket's last durable row.",
        );
        let mut log_start = bucket_gauges(
            "mink_bucket_log_start",
            "The first offset still in a bucket's log.",
        );
        let mut epoch = bucket_gauges(
            "mink_bucket_leader_epoch",
            "The leader epoch this node leads a bucket in (0 on a single node).",
        );
        let mut lake_offset = bucket_gauges(
            "mink_bucket_lake_offset",
            "The log offset a lake table's bucket is tiered up to (the seam).",
        );
        let mut lag_offsets = bucket_gauges(
            "mink_bucket_lake_lag_offsets",
            "Rows of a bucket not yet in the lake (high watermark minus the seam).",
        );
        let mut lag_seconds = bucket_gauges(
            "mink_bucket_lake_lag_seconds",
            "The age of a bucket's oldest row not yet in the lake (0 when all are).",
        );
        let mut led = 0;
        let now = now_ms();
        for (table, listed) in self.every_table_buckets() {
            let name = table.path.to_string();
            for status in &listed.buckets {
                let Some(id) = &status.bucket else { continue };
                let number = id.bucket.to_string();
                let labels = [
                    name.as_str(),
                    id.partition.as_deref().unwrap_or(""),
                    &number,
                ];
                led += 1;
                high_watermark.set(&labels, status.high_watermark as f64);
                log_start.set(&labels, status.log_start as f64);
                epoch.set(&labels, status.leader_epoch as f64);
                if table.lake_enabled {
                    let (offsets, seconds) = status.lake_lag(now);
                    lake_offset.set(&labels, status.lake_log_end_offset as f64);
                    lag_offsets.set(&labels, offsets as f64);
                    lag_seconds.set(&labels, seconds);
                }
            }
        }
        let mut buckets_led = Gauges::new("mink_buckets_led", "Buckets this node leads.", &[]);
        buckets_led.set(&[], f64::from(led));
        let mut pool = Gauges::new(
            "mink_node_memory_pool_bytes",
            "Bytes reserved in the node's memory pool (reads' plans and writes in flight).",
            &[],
        );
        pool.set(&[], self.memory_pool().reserved() as f64);
        [
            high_watermark,
            log_start,
            epoch,
            lake_offset,
            lag_offsets,
            lag_seconds,
            buckets_led,
            pool,
        ]
        .map(Gauges::family)
        .into()
    }
}
