//! The figures of a node that are a state, not a count, read when a scrape asks
//! (`mink_metrics::encode` takes them): every bucket it leads with its offsets, its lake
//! seam and how far behind the lake is, in offsets and in seconds, and its leader epoch.

use mink_metrics::prometheus::core::Collector;
use mink_metrics::prometheus::proto::MetricFamily;
use mink_metrics::prometheus::{GaugeVec, IntGauge, IntGaugeVec, Opts};

use super::Node;
use crate::metadata::now_ms;

/// The labels of a bucket's series.
const BUCKET_LABELS: [&str; 3] = ["table", "partition", "bucket"];

impl Node {
    /// The node's bucket gauges as metric families, as of now.
    pub fn scraped_metrics(&self) -> Vec<MetricFamily> {
        let int_gauges = |name: &str, help: &str| {
            IntGaugeVec::new(Opts::new(name, help), &BUCKET_LABELS).expect("valid gauge")
        };
        let high_watermark = int_gauges(
            "mink_bucket_high_watermark",
            "The offset after a bucket's last durable row.",
        );
        let log_start = int_gauges(
            "mink_bucket_log_start",
            "The first offset still in a bucket's log.",
        );
        let epoch = int_gauges(
            "mink_bucket_leader_epoch",
            "The leader epoch this node leads a bucket in (0 on a single node).",
        );
        let lake_offset = int_gauges(
            "mink_bucket_lake_offset",
            "The log offset a lake table's bucket is tiered up to (the seam).",
        );
        let lag_offsets = int_gauges(
            "mink_bucket_lake_lag_offsets",
            "Rows of a bucket not yet in the lake (high watermark minus the seam).",
        );
        let lag_seconds = GaugeVec::new(
            Opts::new(
                "mink_bucket_lake_lag_seconds",
                "The age of a bucket's oldest row not yet in the lake (0 when all are).",
            ),
            &BUCKET_LABELS,
        )
        .expect("valid gauge");
        let led = IntGauge::new("mink_buckets_led", "Buckets this node leads.").expect("valid");
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
                led.inc();
                high_watermark
                    .with_label_values(&labels)
                    .set(status.high_watermark);
                log_start.with_label_values(&labels).set(status.log_start);
                epoch
                    .with_label_values(&labels)
                    .set(status.leader_epoch as i64);
                if table.lake_enabled {
                    let (offsets, seconds) = status.lake_lag(now);
                    lake_offset
                        .with_label_values(&labels)
                        .set(status.lake_log_end_offset);
                    lag_offsets.with_label_values(&labels).set(offsets);
                    lag_seconds.with_label_values(&labels).set(seconds);
                }
            }
        }
        let pool = IntGauge::new(
            "mink_node_memory_pool_bytes",
            "Bytes reserved in the node's memory pool (reads' plans and writes in flight).",
        )
        .expect("valid gauge");
        pool.set(self.memory_pool().reserved() as i64);
        let collectors: [&dyn Collector; 8] = [
            &high_watermark,
            &log_start,
            &epoch,
            &lake_offset,
            &lag_offsets,
            &lag_seconds,
            &led,
            &pool,
        ];
        collectors.iter().flat_map(|c| c.collect()).collect()
    }
}
