//! `MinkTable`: a mink table as a DataFusion table.
//!
//! A scan plans one split per bucket. A union read's splits are planned by the node's
//! `plan_table_union` action, once for every bucket (the recorded lake snapshot and
//! seams, the high watermark now, the lake files pruned by the pushed filters, from one
//! read of the lake's manifests), and read by the union read's plan nodes
//! (`crate::union`); a primary-key table's point queries, bare `LIMIT`s and (without a
//! lake) full scans read its KV stores instead, with a [`MinkScanExec`]
//! (`MinkTable::plan_splits`).

use std::any::Any;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringArray};
use arrow::compute::cast;
use arrow::datatypes::{Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use mink_client::MinkClient;
use mink_core::filter::{ColumnFilter, FilterOp};
use mink_core::protocol::{BucketId, BucketStatus};
use mink_core::routing::split_rows_by_bucket;
use mink_core::table::TableDescriptor;
use mink_lake::reader::LakeSplit;
use mink_lake::storage::LakeStorage;
use mink_scan::union::read_columns;

use crate::dml;
use crate::exec::MinkScanExec;
use crate::filters::{in_list_values, prunes_lake, to_column_filter};
use crate::split::{Split, SplitReader, SplitSource, changelog_schema, external};
use crate::union::{UnionRead, UnionSplit};

/// Most keys one lookup read takes; a statement naming more is a union read.
const MAX_LOOKUP_KEYS: usize = 1024;

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
        let schema = self.table.schema();
        Ok(filters
            .iter()
            .map(|expr| {
                if to_column_filter(expr, schema).is_some() {
                    TableProviderFilterPushDown::Exact
                } else if self.key_in_list(expr).is_some() || prunes_lake(expr) {
                    // Used for a lookup or to prune the lake, applied again by DataFusion.
                    TableProviderFilterPushDown::Inexact
                } else {
                    TableProviderFilterPushDown::Unsupported
                }
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if self.kind == ReadKind::Changelog {
            return self.scan_changelog(projection).await;
        }
        let schema = self.table.schema();
        let key_lists: Vec<_> = filters
            .iter()
            .filter_map(|expr| self.key_in_list(expr))
            .collect();
        // The filters the scan answers exactly, and each as a mink column filter.
        let (exact, column_filters): (Vec<Expr>, Vec<_>) = filters
            .iter()
            .filter_map(|expr| Some((expr.clone(), to_column_filter(expr, schema)?)))
            .unzip();
        let output: Vec<usize> = match projection {
            Some(projection) => projection.clone(),
            None => (0..schema.fields().len()).collect(),
        };
        // The projection, then what the filters need besides (a key merge reads the key
        // columns itself).
        let read = read_columns(&self.table, &output, &column_filters)?;
        let planned = self.plan_splits(&column_filters, &key_lists, limit).await?;
        let reader = SplitReader {
            table: Arc::clone(&self.table),
            client: self.client.clone(),
            storage: self.storage.clone(),
            read_schema: Arc::new(schema.project(&read)?),
            output: (0..output.len()).collect(),
            filters: column_filters,
            changelog: false,
        };
        let splits = match planned {
            Planned::Splits(splits) => return Ok(Arc::new(MinkScanExec::try_new(reader, splits)?)),
            Planned::Union(splits) => splits,
        };
        let read = UnionRead {
            reader,
            splits,
            pruning: filters.to_vec(),
            exact,
        };
        read.plan(state).await
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
    /// `key IN (literal, ...)` on a primary-key column of a union read: the column and
    /// its values, for a lookup.
    fn key_in_list(&self, expr: &Expr) -> Option<(String, Vec<String>)> {
        let readable_by_key = self.kind == ReadKind::Union && self.table.has_primary_key();
        in_list_values(expr, self.table.schema())
            .filter(|(column, _)| readable_by_key && self.table.primary_key.contains(column))
    }

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
        let splits = self
            .bucket_splits(|status| SplitSource::Changelog {
                from: status.log_start,
                to: status.high_watermark,
            })
            .await?;
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
        };
        Ok(Arc::new(MinkScanExec::try_new(reader, splits)?))
    }

    /// One split per bucket, each read the cheapest way that gives the statement its
    /// rows. A primary-key table's KV store holds its current rows, so it answers
    /// predicates fixing the whole key (lookups), a bare `LIMIT` (its first rows) and,
    /// without a lake, the whole table (Snapshot); anything else is a union read.
    async fn plan_splits(
        &self,
        filters: &[ColumnFilter],
        key_lists: &[(String, Vec<String>)],
        limit: Option<usize>,
    ) -> Result<Planned> {
        if self.kind == ReadKind::Union && self.table.has_primary_key() {
            if let Some(keys) = point_keys(&self.table, filters, key_lists)? {
                return lookup_splits(&self.table, &keys).map(Planned::Splits);
            }
            let bare_limit = limit.filter(|_| filters.is_empty() && key_lists.is_empty());
            if let Some(limit) = bare_limit.and_then(|limit| u32::try_from(limit).ok()) {
                let splits = self.bucket_splits(|_| SplitSource::LimitScan { limit });
                return splits.await.map(Planned::Splits);
            }
            if !self.table.lake_enabled {
                let splits = self.bucket_splits(|_| SplitSource::KvSnapshot);
                return splits.await.map(Planned::Splits);
            }
        }
        self.union_splits(filters).await.map(Planned::Union)
    }

    /// Every bucket's split, reading what `source` says.
    async fn bucket_splits(
        &self,
        source: impl Fn(&BucketStatus) -> SplitSource,
    ) -> Result<Vec<Split>> {
        let buckets = self.buckets().await?;
        Ok(buckets
            .into_iter()
            .map(|(bucket, status)| Split {
                bucket,
                source: source(&status),
            })
            .collect())
    }

    /// Every bucket of the table created so far, with its offsets now.
    async fn buckets(&self) -> Result<Vec<(BucketId, BucketStatus)>> {
        let buckets = self
            .client
            .list_buckets(&self.table.path)
            .await
            .map_err(external)?;
        buckets
            .into_iter()
            .map(|status| {
                let bucket = status
                    .bucket
                    .clone()
                    .ok_or_else(|| DataFusionError::Internal("a bucket without its id".into()))?;
                Ok((bucket, status))
            })
            .collect()
    }

    /// Every bucket's union split, planned by the node at once (`t$lake`: the lake alone).
    async fn union_splits(&self, filters: &[ColumnFilter]) -> Result<Vec<UnionSplit>> {
        let planned = self
            .client
            .plan_table_union(&self.table.path, filters)
            .await
            .map_err(external)?;
        planned
            .into_iter()
            .map(|planned| {
                let bucket = planned.bucket.ok_or_else(|| {
                    DataFusionError::Internal("a union split without its bucket".into())
                })?;
                let plan = planned
                    .plan
                    .ok_or_else(|| DataFusionError::Internal(format!("no plan for {bucket}")))?;
                let lake = LakeSplit::from_wire(plan.snapshot_id, planned.files);
                let split = UnionSplit { bucket, plan, lake };
                Ok(match self.kind {
                    ReadKind::Lake => split.without_log_range(),
                    _ => split,
                })
            })
            .collect()
    }
}

/// How a scan's buckets are read: each by a [`MinkScanExec`] split (the KV store, the
/// log), or all by the union read's plan nodes.
#[derive(Debug)]
enum Planned {
    Splits(Vec<Split>),
    Union(Vec<UnionSplit>),
}

/// The primary keys the filters fix, when they fix every key column (`k = v` or
/// `k IN (v, ...)`) to at most [`MAX_LOOKUP_KEYS`] keys in all, as a batch of the key
/// columns.
fn point_keys(
    table: &TableDescriptor,
    filters: &[ColumnFilter],
    key_lists: &[(String, Vec<String>)],
) -> Result<Option<RecordBatch>> {
    // Every combination of the key columns' values, as text.
    let mut keys: Vec<Vec<&str>> = vec![Vec::new()];
    for column in &table.primary_key {
        let equal = filters
            .iter()
            .find(|f| f.column == *column && matches!(f.operator(), Ok(FilterOp::Eq)))
            .and_then(|f| f.value.as_deref());
        let values: Vec<&str> = match equal {
            Some(value) => vec![value],
            None => match key_lists.iter().find(|(name, _)| name == column) {
                Some((_, values)) => values.iter().map(String::as_str).collect(),
                None => return Ok(None),
            },
        };
        if keys.len() * values.len() > MAX_LOOKUP_KEYS {
            return Ok(None);
        }
        keys = keys
            .into_iter()
            .flat_map(|key| {
                values.iter().map(move |value| {
                    let mut key = key.clone();
                    key.push(*value);
                    key
                })
            })
            .collect();
    }
    // `k IN (1, 1)` names one key: read it once.
    keys.sort_unstable();
    keys.dedup();
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (i, column) in table.primary_key.iter().enumerate() {
        let field = table.schema().field_with_name(column)?;
        let text = StringArray::from_iter_values(keys.iter().map(|key| key[i]));
        columns.push(cast(&text, field.data_type())?);
        fields.push(field.clone());
    }
    Ok(Some(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?))
}

/// The lookup splits of `keys`: one per bucket they fall in.
fn lookup_splits(table: &TableDescriptor, keys: &RecordBatch) -> Result<Vec<Split>> {
    let parts = split_rows_by_bucket(table, keys, 0).map_err(external)?;
    Ok(parts
        .into_iter()
        .map(|part| Split {
            bucket: part.bucket,
            source: SplitSource::Lookup { keys: part.batch },
        })
        .collect())
}

#[cfg(test)]
mod tests;
