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
use mink_core::table::TableDescriptor;
use mink_lake::reader::LakeSplit;
use mink_lake::storage::LakeStorage;

use crate::dml;
use crate::exec::MinkUnionExec;
use crate::filters::to_column_filter;
use crate::split::{SplitReader, UnionSplit, external};

/// A mink table: its union read, bucket by bucket.
#[derive(Debug)]
pub struct MinkTable {
    table: Arc<TableDescriptor>,
    client: MinkClient,
    storage: LakeStorage,
}

impl MinkTable {
    /// The table `table` of the node `client` talks to, whose lake files are read from
    /// `storage`.
    pub fn new(table: TableDescriptor, client: MinkClient, storage: LakeStorage) -> Self {
        Self {
            table: Arc::new(table),
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
        Arc::clone(self.table.schema())
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
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
                let plan = planned
                    .plan
                    .ok_or_else(|| DataFusionError::Internal(format!("no plan for {bucket}")))?;
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
            output_columns: output.len(),
            filters,
        };
        Ok(Arc::new(MinkUnionExec::try_new(reader, splits)?))
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> Result<Arc<dyn ExecutionPlan>> {
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
        let scan = self.scan(state, None, &filters, None).await?;
        dml::delete(
            state,
            Arc::clone(&self.table),
            self.client.clone(),
            scan,
            filters,
        )
    }

    async fn update(
        &self,
        state: &dyn Session,
        assignments: Vec<(String, Expr)>,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let scan = self.scan(state, None, &filters, None).await?;
        dml::update(
            state,
            Arc::clone(&self.table),
            self.client.clone(),
            scan,
            assignments,
            filters,
        )
    }
}
