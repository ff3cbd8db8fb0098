//! `MinkTable`: a mink table as a DataFusion table.
//!
//! A scan plans one union split per bucket through the bucket leader's `plan_union`
//! action (the recorded lake snapshot and seam, the high watermark now, the lake files
//! pruned by the pushed filters) and returns a [`MinkUnionExec`] reading them.

use std::any::Any;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use futures::future::try_join_all;
use mink_client::MinkClient;
use mink_core::key::key_columns;
use mink_core::protocol::UnionPlan;
use mink_core::table::TableDescriptor;
use mink_lake::reader::LakeSplit;
use mink_lake::storage::LakeStorage;

use crate::dml;
use crate::exec::MinkUnionExec;
use crate::filters::to_column_filter;
use crate::split::{SplitReader, UnionSplit, changelog_schema, external};

/// What a scan of a mink table reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadKind {
    /// `t`: the table as it is now (lake below each seam, log after it).
    Union,
    /// `t$lake`: the last tiering round only, as any Iceberg engine sees it.
    Lake,
    /// `t$changelog`: the log, with each row's change type, offset and commit time.
    Changelog,
}

impl ReadKind {
    /// The kind a table name asks for, and the table's own name: `t`, `t$lake` or
    /// `t$changelog`.
    pub fn of_name(name: &str) -> Option<(&str, Self)> {
        match name.rsplit_once('$') {
            None => Some((name, Self::Union)),
            Some((table, "lake")) => Some((table, Self::Lake)),
            Some((table, "changelog")) => Some((table, Self::Changelog)),
            Some(_) => None,
        }
    }
}

/// A mink table: its union read, bucket by bucket (or its lake, or its changelog).
#[derive(Debug)]
pub struct MinkTable {
    table: Arc<TableDescriptor>,
    kind: ReadKind,
    schema: SchemaRef,
    client: MinkClient,
    storage: LakeStorage,
}

impl MinkTable {
    /// The table `table` of the node `client` talks to, whose lake files are read from
    /// `storage`.
    pub fn new(
        table: TableDescriptor,
        kind: ReadKind,
        client: MinkClient,
        storage: LakeStorage,
    ) -> Self {
        let schema = match kind {
            ReadKind::Changelog => Arc::new(changelog_schema(table.schema())),
            ReadKind::Union | ReadKind::Lake => Arc::clone(table.schema()),
        };
        Self {
            table: Arc::new(table),
            kind,
            schema,
            client,
            storage,
        }
    }
}

#[async_trait]
impl TableProvider for MinkTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        if self.kind == ReadKind::Changelog {
            return Ok(vec![
                TableProviderFilterPushDown::Unsupported;
                filters.len()
            ]);
        }
        Ok(filters
            .iter()
            .map(|expr| match to_column_filter(expr, self.table.schema()) {
                Some(_) => TableProviderFilterPushDown::Exact,
                None => TableProviderFilterPushDown::Unsupported,
            })
            .collect())
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if self.kind == ReadKind::Changelog {
            return self.scan_changelog(projection).await;
        }
        let schema = self.table.schema();
        let filters: Vec<_> = filters
            .iter()
            .filter_map(|expr| to_column_filter(expr, schema))
            .collect();
        let output: Vec<usize> = match projection {
            Some(projection) => projection.clone(),
            None => (0..schema.fields().len()).collect(),
        };
        // The projection, then what the filters and the key merge need besides.
        let mut read = output.clone();
        let filter_columns = filters.iter().map(|f| f.column.clone());
        let merge_columns = match self.table.has_primary_key() {
            true => key_columns(&self.table),
            false => Vec::new(),
        };
        for column in filter_columns.chain(merge_columns) {
            let index = schema.index_of(&column)?;
            if !read.contains(&index) {
                read.push(index);
            }
        }
        let buckets = self
            .client
            .list_buckets(&self.table.path)
            .await
            .map_err(external)?;
        let plans = buckets.into_iter().map(|status| {
            let filters = &filters;
            async move {
                let bucket = status
                    .bucket
                    .ok_or_else(|| DataFusionError::Internal("a bucket without its id".into()))?;
                let planned = self
                    .client
                    .plan_union(&bucket, filters)
                    .await
                    .map_err(external)?;
                let mut plan = planned
                    .plan
                    .ok_or_else(|| DataFusionError::Internal(format!("no plan for {bucket}")))?;
                if self.kind == ReadKind::Lake {
                    plan.log_to = plan.log_from;
                }
                Ok::<_, DataFusionError>(UnionSplit {
                    lake: LakeSplit::from_wire(plan.snapshot_id, planned.files),
                    bucket,
                    plan,
                })
            }
        });
        let splits = try_join_all(plans).await?;
        let reader = SplitReader {
            table: Arc::clone(&self.table),
            client: self.client.clone(),
            storage: self.storage.clone(),
            read_schema: Arc::new(schema.project(&read)?),
            output: (0..output.len()).collect(),
            filters,
            changelog: false,
            // Without a lake the KV store holds the current rows: no changelog to fold.
            kv_snapshot: self.kind == ReadKind::Union
                && self.table.has_primary_key()
                && !self.table.lake_enabled,
        };
        Ok(Arc::new(MinkUnionExec::try_new(reader, splits)?))
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.require_writable()?;
        if insert_op != InsertOp::Append {
            return Err(DataFusionError::NotImplemented(format!(
                "INSERT {insert_op} into {}: only INSERT INTO (append or upsert by key)",
                self.table.path
            )));
        }
        dml::insert(Arc::clone(&self.table), self.client.clone(), input)
    }

    async fn delete_from(
        &self,
        state: &dyn Session,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let matching = self.matching_rows(state, filters).await?;
        dml::delete(
            state,
            Arc::clone(&self.table),
            self.client.clone(),
            matching,
        )
    }

    async fn update(
        &self,
        state: &dyn Session,
        assignments: Vec<(String, Expr)>,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let matching = self.matching_rows(state, filters).await?;
        dml::update(
            state,
            Arc::clone(&self.table),
            self.client.clone(),
            matching,
            assignments,
        )
    }
}

impl MinkTable {
    /// The rows an `UPDATE` or `DELETE` changes: the scan applies the filters it takes
    /// (exactly), a DataFusion filter above it the others.
    async fn matching_rows(
        &self,
        state: &dyn Session,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.require_writable()?;
        let scan = self.scan(state, None, &filters, None).await?;
        let rest = filters
            .into_iter()
            .filter(|expr| to_column_filter(expr, self.table.schema()).is_none())
            .collect();
        dml::filtered(state, &self.table, scan, rest)
    }

    /// Writes go to the table itself, never to its `$lake` or `$changelog`.
    fn require_writable(&self) -> Result<()> {
        let suffix = match self.kind {
            ReadKind::Union => return Ok(()),
            ReadKind::Lake => "lake",
            ReadKind::Changelog => "changelog",
        };
        Err(DataFusionError::Plan(format!(
            "{}${suffix} is read-only: write to {} itself",
            self.table.path, self.table.path
        )))
    }

    /// `t$changelog`: every bucket's log from log_start to the high watermark now.
    async fn scan_changelog(
        &self,
        projection: Option<&Vec<usize>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let buckets = self
            .client
            .list_buckets(&self.table.path)
            .await
            .map_err(external)?;
        let splits = buckets
            .into_iter()
            .map(|status| {
                let bucket = status
                    .bucket
                    .ok_or_else(|| DataFusionError::Internal("a bucket without its id".into()))?;
                let plan = UnionPlan {
                    snapshot_id: None,
                    lake_log_end_offset: 0,
                    log_from: status.log_start,
                    log_to: status.high_watermark,
                    lake_files: 0,
                };
                Ok(UnionSplit {
                    bucket,
                    plan,
                    lake: LakeSplit::default(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let reader = SplitReader {
            table: Arc::clone(&self.table),
            client: self.client.clone(),
            storage: self.storage.clone(),
            read_schema: Arc::clone(self.table.schema()),
            output: match projection {
                Some(projection) => projection.clone(),
                None => (0..self.schema.fields().len()).collect(),
            },
            filters: Vec::new(),
            changelog: true,
            kv_snapshot: false,
        };
        Ok(Arc::new(MinkUnionExec::try_new(reader, splits)?))
    }
}
