//! The `system` schema: the node's state as tables, read fresh by every query.
//!
//! ```sql
//! SELECT * FROM system.buckets;         -- table_name, partition, bucket, leader, log_start,
//!                                       -- high_watermark, lake_log_end_offset, lake_snapshot_id
//! SELECT * FROM system.lake_snapshots;  -- table_name, snapshot_id, partition, bucket,
//!                                       -- log_end_offset, committed_at
//! SELECT * FROM system.lake_tables;     -- table_name, snapshots, manifests, data_files,
//!                                       -- delete_files, bytes, oldest_snapshot_at
//! SELECT * FROM system.log_store;       -- table_name, partition, bucket, high_watermark,
//!                                       -- stream_objects, stream_bytes, wal_bytes,
//!                                       -- kv_checkpoint_offset, kv_checkpoint_runs,
//!                                       -- kv_checkpoint_bytes, kv_checkpoint_written_at,
//!                                       -- kv_pending_bytes
//! SELECT * FROM system.nodes;           -- node_id, address, live, buckets, max_epoch
//! SELECT * FROM system.freshness;       -- table_name, partition, bucket, leader,
//!                                       -- leader_epoch, high_watermark,
//!                                       -- lake_log_end_offset, lag_offsets, lag_seconds,
//!                                       -- oldest_untiered_at
//! ```
//!
//! `freshness` has one row per bucket of every lake-enabled table: how far behind its
//! leader's log the lake is, in rows (`lag_offsets`) and in seconds (`lag_seconds`, the
//! age of its oldest row not yet tiered, from `oldest_untiered_at`; 0 and null when
//! every row is tiered). A union read is always fresh; these say how fresh a query of the
//! lake alone (`$lake`, another engine) is, and whether tiering keeps up.
//!
//! `lake_snapshots` has one row per bucket of every snapshot mink recorded (tiering rounds
//! and compactions), oldest first; its snapshot ids are those `table_changes` and
//! Iceberg engines take. `lake_tables` has one row per lake-enabled table: what its lake
//! table holds as of its current snapshot (the snapshots kept, the manifests planning
//! reads, the live files and their bytes), which lake upkeep keeps bounded. `log_store`
//! has one row per bucket of a node whose log is in a log store (none without one): the
//! stream objects its log is read from, the bytes only in WAL objects, and a primary-key
//! bucket's KV checkpoint (the offset its rows are at, its runs and bytes, when this node
//! last wrote one, the bytes waiting for the next). `nodes` has one row per node of the
//! cluster the node is a member of (`mink server --cluster`; none on a single node): its
//! id, the address it advertises (a live member's), whether it is live, the buckets
//! assigned to it and the highest epoch among them.

use std::any::Any;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray,
    TimestampMillisecondArray, UInt32Array, UInt64Array,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use mink_client::MinkClient;
use mink_core::clock::now_ms;
use mink_core::protocol::{BucketStatus, BucketStore, LakeTableStats};
use mink_core::table::TablePath;

use crate::split::external;

/// The name of the schema.
pub const SYSTEM_SCHEMA: &str = "system";

/// The `system` schema of one node.
#[derive(Debug)]
pub(crate) struct SystemSchema {
    client: MinkClient,
}

impl SystemSchema {
    pub(crate) fn new(client: MinkClient) -> Self {
        Self { client }
    }
}

/// The tables of the schema.
#[derive(Debug, Clone, Copy)]
enum SystemTable {
    Buckets,
    LakeSnapshots,
    LakeTables,
    LogStore,
    Nodes,
    Freshness,
}

impl SystemTable {
    const ALL: [Self; 6] = [
        Self::Buckets,
        Self::LakeSnapshots,
        Self::LakeTables,
        Self::LogStore,
        Self::Nodes,
        Self::Freshness,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Buckets => "buckets",
            Self::LakeSnapshots => "lake_snapshots",
            Self::LakeTables => "lake_tables",
            Self::LogStore => "log_store",
            Self::Nodes => "nodes",
            Self::Freshness => "freshness",
        }
    }

    fn schema(self) -> SchemaRef {
        let text = |name: &str, nullable| Field::new(name, DataType::Utf8, nullable);
        let int = |name: &str, nullable| Field::new(name, DataType::Int64, nullable);
        let count = |name: &str| Field::new(name, DataType::UInt64, false);
        let timestamp = |name: &str, nullable| {
            let utc = DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
            Field::new(name, utc, nullable)
        };
        let fields = match self {
            Self::Buckets => vec![
                text("table_name", false),
                text("partition", true),
                Field::new("bucket", DataType::UInt32, false),
                text("leader", false),
                int("log_start", false),
                int("high_watermark", false),
                int("lake_log_end_offset", false),
                int("lake_snapshot_id", true),
            ],
            Self::LakeSnapshots => vec![
                text("table_name", false),
                int("snapshot_id", false),
                text("partition", true),
                Field::new("bucket", DataType::UInt32, false),
                int("log_end_offset", false),
                timestamp("committed_at", false),
            ],
            Self::LakeTables => vec![
                text("table_name", false),
                count("snapshots"),
                count("manifests"),
                count("data_files"),
                count("delete_files"),
                count("bytes"),
                timestamp("oldest_snapshot_at", true),
            ],
            Self::LogStore => vec![
                text("table_name", false),
                text("partition", true),
                Field::new("bucket", DataType::UInt32, false),
                int("high_watermark", false),
                count("stream_objects"),
                count("stream_bytes"),
                count("wal_bytes"),
                int("kv_checkpoint_offset", true),
                count("kv_checkpoint_runs"),
                count("kv_checkpoint_bytes"),
                timestamp("kv_checkpoint_written_at", true),
                count("kv_pending_bytes"),
            ],
            Self::Nodes => vec![
                text("node_id", false),
                text("address", true),
                Field::new("live", DataType::Boolean, false),
                Field::new("buckets", DataType::UInt32, false),
                count("max_epoch"),
            ],
            Self::Freshness => vec![
                text("table_name", false),
                text("partition", true),
                Field::new("bucket", DataType::UInt32, false),
                text("leader", false),
                count("leader_epoch"),
                int("high_watermark", false),
                int("lake_log_end_offset", false),
                int("lag_offsets", false),
                Field::new("lag_seconds", DataType::Float64, false),
                timestamp("oldest_untiered_at", true),
            ],
        };
        Arc::new(Schema::new(fields))
    }
}

#[async_trait]
impl SchemaProvider for SystemSchema {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        SystemTable::ALL
            .iter()
            .map(|t| t.name().to_string())
            .collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        Ok(SystemTable::ALL
            .into_iter()
            .find(|table| table.name() == name)
            .map(|table| {
                Arc::new(SystemTableProvider {
                    table,
                    client: self.client.clone(),
                }) as Arc<dyn TableProvider>
            }))
    }

    fn table_exist(&self, name: &str) -> bool {
        SystemTable::ALL.iter().any(|table| table.name() == name)
    }
}

/// One system table: its rows are fetched from the node when it is scanned.
#[derive(Debug)]
pub(crate) struct SystemTableProvider {
    table: SystemTable,
    client: MinkClient,
}

#[async_trait]
impl TableProvider for SystemTableProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.table.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let batch = match self.table {
            SystemTable::Buckets => self.buckets().await?,
            SystemTable::LakeSnapshots => self.lake_snapshots().await?,
            SystemTable::LakeTables => self.lake_tables().await?,
            SystemTable::LogStore => self.log_store().await?,
            SystemTable::Nodes => self.nodes().await?,
            SystemTable::Freshness => self.freshness().await?,
        };
        Ok(MemorySourceConfig::try_new_exec(
            &[vec![batch]],
            self.schema(),
            projection.cloned(),
        )?)
    }
}

impl SystemTableProvider {
    /// Every bucket of every table, with its table's name.
    async fn bucket_statuses(&self) -> Result<Vec<(String, BucketStatus)>> {
        let tables = self.client.list_tables(None).await.map_err(external)?;
        self.bucket_statuses_of(tables).await
    }

    /// Every bucket of `tables`, with its table's name.
    async fn bucket_statuses_of(
        &self,
        tables: Vec<TablePath>,
    ) -> Result<Vec<(String, BucketStatus)>> {
        let mut rows = Vec::new();
        for table in tables {
            for status in self.client.list_buckets(&table).await.map_err(external)? {
                rows.push((table.to_string(), status));
            }
        }
        Ok(rows)
    }

    /// The columns that name each bucket of `rows`: table_name, partition, bucket and
    /// leader (the node the client reached it at).
    fn bucket_columns(&self, rows: &[(String, BucketStatus)]) -> Vec<ArrayRef> {
        let leaders = (rows.iter()).map(|(_, status)| match &status.bucket {
            Some(bucket) => self.client.leader_of(bucket),
            None => self.client.address().to_string(),
        });
        vec![
            Arc::new(StringArray::from_iter_values(rows.iter().map(|(t, _)| t))),
            Arc::new(StringArray::from_iter(rows.iter().map(|(_, s)| {
                s.bucket.as_ref().and_then(|b| b.partition.clone())
            }))),
            Arc::new(UInt32Array::from_iter_values(
                rows.iter()
                    .map(|(_, s)| s.bucket.as_ref().map_or(0, |b| b.bucket)),
            )),
            Arc::new(StringArray::from_iter_values(leaders)),
        ]
    }

    async fn buckets(&self) -> Result<RecordBatch> {
        let rows = self.bucket_statuses().await?;
        let mut columns = self.bucket_columns(&rows);
        columns.extend::<[ArrayRef; 4]>([
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|(_, s)| s.log_start),
            )),
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|(_, s)| s.high_watermark),
            )),
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|(_, s)| s.lake_log_end_offset),
            )),
            Arc::new(Int64Array::from_iter(
                rows.iter().map(|(_, s)| s.lake_snapshot_id),
            )),
        ]);
        Ok(RecordBatch::try_new(self.schema(), columns)?)
    }

    async fn freshness(&self) -> Result<RecordBatch> {
        let lake_tables = self.lake_enabled_tables().await?;
        let rows = self.bucket_statuses_of(lake_tables).await?;
        let now = now_ms();
        let lags: Vec<(i64, f64)> = rows.iter().map(|(_, s)| s.lake_lag(now)).collect();
        let mut columns = self.bucket_columns(&rows);
        columns.extend::<[ArrayRef; 6]>([
            Arc::new(UInt64Array::from_iter_values(
                rows.iter().map(|(_, s)| s.leader_epoch),
            )),
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|(_, s)| s.high_watermark),
            )),
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|(_, s)| s.lake_log_end_offset),
            )),
            Arc::new(Int64Array::from_iter_values(lags.iter().map(|l| l.0))),
            Arc::new(Float64Array::from_iter_values(lags.iter().map(|l| l.1))),
            Arc::new(
                TimestampMillisecondArray::from_iter(
                    rows.iter().map(|(_, s)| s.oldest_untiered_at_ms),
                )
                .with_timezone("UTC"),
            ),
        ]);
        Ok(RecordBatch::try_new(self.schema(), columns)?)
    }

    /// The lake-enabled tables.
    async fn lake_enabled_tables(&self) -> Result<Vec<TablePath>> {
        let mut tables = Vec::new();
        for table in self.client.list_tables(None).await.map_err(external)? {
            let described = self.client.describe_table(&table).await.map_err(external)?;
            if described.lake_enabled {
                tables.push(table);
            }
        }
        Ok(tables)
    }

    async fn lake_tables(&self) -> Result<RecordBatch> {
        let mut rows = Vec::new();
        for table in self.lake_enabled_tables().await? {
            let stats = self
                .client
                .lake_table_stats(&table)
                .await
                .map_err(external)?;
            rows.push((table.to_string(), stats));
        }
        let count = |get: fn(&LakeTableStats) -> u64| -> ArrayRef {
            Arc::new(UInt64Array::from_iter_values(
                rows.iter().map(|(_, s)| get(s)),
            ))
        };
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(rows.iter().map(|(t, _)| t))),
            count(|s| s.snapshots),
            count(|s| s.manifests),
            count(|s| s.data_files),
            count(|s| s.delete_files),
            count(|s| s.bytes),
            Arc::new(
                TimestampMillisecondArray::from_iter(
                    rows.iter().map(|(_, s)| s.oldest_snapshot_at),
                )
                .with_timezone("UTC"),
            ),
        ];
        Ok(RecordBatch::try_new(self.schema(), columns)?)
    }

    async fn lake_snapshots(&self) -> Result<RecordBatch> {
        let mut rows = Vec::new();
        for table in self.lake_enabled_tables().await? {
            for snapshot in self.client.lake_snapshots(&table).await.map_err(external)? {
                for seam in &snapshot.buckets {
                    rows.push((
                        table.to_string(),
                        snapshot.snapshot_id,
                        seam.clone(),
                        snapshot.committed_at,
                    ));
                }
            }
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.0))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(StringArray::from_iter(
                rows.iter().map(|r| r.2.partition.clone()),
            )),
            Arc::new(UInt32Array::from_iter_values(
                rows.iter().map(|r| r.2.bucket),
            )),
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|r| r.2.log_end_offset),
            )),
            Arc::new(
                TimestampMillisecondArray::from_iter_values(rows.iter().map(|r| r.3))
                    .with_timezone("UTC"),
            ),
        ];
        Ok(RecordBatch::try_new(self.schema(), columns)?)
    }

    async fn nodes(&self) -> Result<RecordBatch> {
        let nodes = self.client.list_nodes().await.map_err(external)?;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(
                nodes.iter().map(|n| &n.node_id),
            )),
            Arc::new(StringArray::from_iter(
                nodes.iter().map(|n| n.address.clone()),
            )),
            Arc::new(BooleanArray::from_iter(nodes.iter().map(|n| Some(n.live)))),
            Arc::new(UInt32Array::from_iter_values(
                nodes.iter().map(|n| n.buckets),
            )),
            Arc::new(UInt64Array::from_iter_values(
                nodes.iter().map(|n| n.max_epoch),
            )),
        ];
        Ok(RecordBatch::try_new(SystemTable::Nodes.schema(), columns)?)
    }

    async fn log_store(&self) -> Result<RecordBatch> {
        let rows: Vec<(String, BucketStatus, BucketStore)> = (self.bucket_statuses().await?)
            .into_iter()
            .filter_map(|(table, status)| {
                let store = status.store.clone()?;
                Some((table, status, store))
            })
            .collect();
        let count = |get: fn(&BucketStore) -> u64| -> ArrayRef {
            Arc::new(UInt64Array::from_iter_values(
                rows.iter().map(|r| get(&r.2)),
            ))
        };
        let bucket = |status: &BucketStatus| status.bucket.clone().unwrap_or_default();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.0))),
            Arc::new(StringArray::from_iter(
                rows.iter().map(|r| bucket(&r.1).partition),
            )),
            Arc::new(UInt32Array::from_iter_values(
                rows.iter().map(|r| bucket(&r.1).bucket),
            )),
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|r| r.1.high_watermark),
            )),
            count(|s| s.stream_objects),
            count(|s| s.stream_bytes),
            count(|s| s.wal_bytes),
            Arc::new(Int64Array::from_iter(
                rows.iter().map(|r| r.2.kv_checkpoint_offset),
            )),
            count(|s| s.kv_checkpoint_runs),
            count(|s| s.kv_checkpoint_bytes),
            Arc::new(
                TimestampMillisecondArray::from_iter(
                    rows.iter().map(|r| r.2.kv_checkpoint_written_at_ms),
                )
                .with_timezone("UTC"),
            ),
            count(|s| s.kv_pending_bytes),
        ];
        Ok(RecordBatch::try_new(self.schema(), columns)?)
    }
}
