//! The lake side of a union read: DataFusion's Parquet scan (`DataSourceExec` over a
//! `ParquetSource`) of the splits' data files, with Iceberg's position deletes applied.
//!
//! DataFusion prunes row groups and pages with the pushed predicate (statistics, page
//! index, bloom filters), reads files ahead and adapts files written under older schema
//! versions to the read schema by name (a column a file lacks reads as null). What it does
//! not know is Iceberg's delete files: each data file's deleted positions are read at
//! planning time ([`split_position_deletes`]) and handed to the scan as the file's
//! [`ParquetAccessPlan`], so deleted rows are never decoded. Building a row selection needs
//! the file's row groups, so the footer of every data file with deletes is read while
//! planning, into DataFusion's file-metadata cache, where the scan finds it again.
//!
//! Files are split by byte range (which a row selection survives) into more partitions
//! than the session has cores ([`PARTITIONS_PER_TARGET`]), and DataFusion's optimizer is
//! told to keep that grouping.
//!
//! Equality deletes (other engines write them; mink never does) apply to the data files
//! Iceberg's planning attached them to: the files that share a set of equality-delete
//! files get a scan of their own, with the equality columns added to its projection, under
//! an [`EqualityDeleteExec`] that drops the rows those files name.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion_common::Result;
use datafusion_common::config::TableParquetOptions;
use datafusion_datasource::PartitionedFile;
use datafusion_datasource::file_groups::{FileGroup, FileGroupPartitioner};
use datafusion_datasource::file_scan_config::FileScanConfigBuilder;
use datafusion_datasource::source::DataSourceExec;
use datafusion_datasource_parquet::metadata::DFParquetMetadata;
use datafusion_datasource_parquet::source::ParquetSource;
use datafusion_datasource_parquet::{
    CachedParquetFileReaderFactory, ParquetAccessPlan, ParquetFileReaderFactory, RowGroupAccess,
};
use datafusion_execution::TaskContext;
use datafusion_execution::cache::cache_manager::FileMetadataCache;
use datafusion_execution::object_store::ObjectStoreUrl;
use datafusion_execution::runtime_env::RuntimeEnv;
use datafusion_physical_expr::PhysicalExpr;
use datafusion_physical_plan::ExecutionPlan;
use datafusion_physical_plan::empty::EmptyExec;
use datafusion_physical_plan::union::UnionExec;
use futures::stream::{self, StreamExt, TryStreamExt};
use mink_lake::reader::{
    DeleteKind, EqualityFilter, GroupRows, LakeDeleteFile, LakeFile, LakeSplit, rows_per_group,
    split_position_deletes,
};
use mink_lake::storage::LakeStorage;
use mink_lake::upkeep::leases::Lease;
use object_store::ObjectStore;

use crate::equality::EqualityDeleteExec;
use crate::external;
use crate::fetch::ReservedReaderFactory;

/// How many footers of data files with deletes are read at once while planning.
const CONCURRENT_FOOTERS: usize = 16;

/// A lake scan reads in this many partitions per target partition of the session (one per
/// core by default). A partition fetches a row group's column chunks, then decodes them,
/// then fetches the next: with one partition per core, each core waits for every fetch
/// (a copy from the page cache for a local lake, a round trip for an object store); with
/// several, other partitions decode meanwhile. Each partition holds about one row
/// group's fetched chunks, reserved in the query's memory pool ([`crate::fetch`]).
/// Measured on 2 cores (`mink-bench sql`, 10M keys, 4 buckets, docs/benchmarks.md): about
/// 0.03 to 0.08 of DataFusion's time over the same rows as plain Parquet, within the VM's
/// noise per run but seen in every run.
const PARTITIONS_PER_TARGET: usize = 4;

/// What a lake scan reads.
#[derive(Debug)]
pub struct LakeScan<'a> {
    pub storage: &'a LakeStorage,
    /// The table's schema: what the scan's columns and predicate refer to.
    pub table_schema: SchemaRef,
    /// The columns read, by index in the table schema.
    pub projection: Vec<usize>,
    /// Prunes row groups and pages; rows are not filtered by it.
    pub predicate: Option<Arc<dyn PhysicalExpr>>,
}

/// Where a scan's files are read from: the store, its URL in DataFusion's runtime, the
/// runtime's cache of Parquet footers, and the leases that keep the files.
struct Store {
    store: Arc<dyn ObjectStore>,
    url: ObjectStoreUrl,
    footers: Arc<dyn FileMetadataCache>,
    leases: Vec<Lease>,
}

impl LakeScan<'_> {
    /// The scan of `splits`' data files (one file group per split), and beside it one
    /// scan per set of equality-delete files that applies to some of them, under an
    /// [`EqualityDeleteExec`]; an empty plan when they have no file.
    ///
    /// # Errors
    /// A delete file or a footer could not be read.
    pub async fn plan(
        &self,
        context: &TaskContext,
        splits: &[&LakeSplit],
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.plan_holding(context, splits, Vec::new()).await
    }

    /// [`Self::plan`], the plan holding `leases` (on the splits' snapshots) for as long as
    /// it or a stream of it lives.
    ///
    /// # Errors
    /// As [`Self::plan`].
    pub async fn plan_holding(
        &self,
        context: &TaskContext,
        splits: &[&LakeSplit],
        leases: Vec<Lease>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let projected = Arc::new(self.table_schema.project(&self.projection)?);
        if splits.iter().all(|split| split.files.is_empty()) {
            return Ok(Arc::new(EmptyExec::new(projected)));
        }
        let runtime = context.runtime_env();
        let (url, store) = register_lake_store(&runtime, self.storage)?;
        let store = Store {
            store,
            url,
            footers: runtime.cache_manager.get_file_metadata_cache(),
            leases,
        };
        let mut plain = Vec::with_capacity(splits.len());
        // The files that equality deletes apply to, by the paths of those deletes.
        let mut by_equality: BTreeMap<Vec<&str>, (Vec<LakeDeleteFile>, Vec<PartitionedFile>)> =
            BTreeMap::new();
        for split in splits {
            let deleted = split_position_deletes(self.storage, split)
                .await
                .map_err(external)?;
            let opened: Vec<_> = split
                .files
                .iter()
                .map(|file| {
                    let positions = deleted.get(&file.path).map(Vec::as_slice);
                    self.partitioned_file(&store, file, positions)
                })
                .collect();
            let files: Vec<PartitionedFile> = stream::iter(opened)
                .buffered(CONCURRENT_FOOTERS)
                .try_collect()
                .await?;
            let mut group = Vec::new();
            for (file, scanned) in split.files.iter().zip(files) {
                let equality: Vec<&LakeDeleteFile> = file
                    .deletes
                    .iter()
                    .filter(|d| matches!(d.kind, DeleteKind::Equality { .. }))
                    .collect();
                if equality.is_empty() {
                    group.push(scanned);
                    continue;
                }
                let paths = equality.iter().map(|d| d.path.as_str()).collect();
                let deletes = equality.into_iter().cloned().collect();
                by_equality
                    .entry(paths)
                    .or_insert_with(|| (deletes, Vec::new()))
                    .1
                    .push(scanned);
            }
            if !group.is_empty() {
                plain.push(FileGroup::new(group));
            }
        }
        let mut scans = Vec::new();
        if !plain.is_empty() {
            scans.push(self.parquet(context, &store, plain, self.projection.clone())?);
        }
        for (deletes, files) in by_equality.into_values() {
            let filter = EqualityFilter::load(self.storage, &deletes)
                .await
                .map_err(external)?;
            // The equality columns are read too, then dropped by the filter.
            let mut read = self.projection.clone();
            let columns = filter
                .columns()
                .filter_map(|c| self.table_schema.index_of(c).ok());
            for column in columns.collect::<Vec<_>>() {
                if !read.contains(&column) {
                    read.push(column);
                }
            }
            let scan = self.parquet(context, &store, vec![FileGroup::new(files)], read)?;
            let filtered = EqualityDeleteExec::new(scan, Arc::new(filter), self.projection.len());
            scans.push(Arc::new(filtered));
        }
        UnionExec::try_new(scans)
    }

    /// DataFusion's Parquet scan of `groups`, columns `projection` of the table.
    fn parquet(
        &self,
        context: &TaskContext,
        store: &Store,
        groups: Vec<FileGroup>,
        projection: Vec<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let config = context.session_config().options();
        let options = TableParquetOptions {
            global: config.execution.parquet.clone(),
            ..TableParquetOptions::default()
        };
        let mut source = ParquetSource::new(Arc::clone(&self.table_schema))
            .with_table_parquet_options(options)
            .with_parquet_file_reader_factory(leased_reader_factory(
                context,
                Arc::clone(&store.store),
                store.leases.clone(),
            ));
        if let Some(predicate) = &self.predicate {
            source = source.with_predicate(Arc::clone(predicate));
        }
        // Split by byte range over more partitions than the session's (see
        // [`PARTITIONS_PER_TARGET`]); the groups are marked as the scan's own, so that
        // DataFusion's optimizer keeps them rather than splitting them again.
        let target = context.session_config().target_partitions() * PARTITIONS_PER_TARGET;
        let groups = FileGroupPartitioner::new()
            .with_target_partitions(target)
            .with_repartition_file_min_size(config.optimizer.repartition_file_min_size)
            .repartition_file_groups(&groups)
            .unwrap_or(groups);
        let scan = FileScanConfigBuilder::new(store.url.clone(), Arc::new(source))
            .with_file_groups(groups)
            .with_partitioned_by_file_group(true)
            .with_projection_indices(Some(projection))?
            .build();
        Ok(DataSourceExec::from_data_source(scan))
    }

    /// One data file for the scan: with its deleted positions as its access plan.
    async fn partitioned_file(
        &self,
        store: &Store,
        file: &LakeFile,
        deleted: Option<&[u64]>,
    ) -> Result<PartitionedFile> {
        // Lake files are never rewritten in place: the path is their identity, and their
        // modification time is left at the epoch.
        let mut scanned = PartitionedFile::new(String::new(), file.size);
        scanned.object_meta.location = self.storage.path(&file.path).map_err(external)?;
        let Some(deleted) = deleted.filter(|d| !d.is_empty()) else {
            return Ok(scanned);
        };
        let metadata = DFParquetMetadata::new(store.store.as_ref(), &scanned.object_meta)
            .with_file_metadata_cache(Some(Arc::clone(&store.footers)))
            .fetch_metadata()
            .await?;
        let row_counts: Vec<u64> = metadata
            .row_groups()
            .iter()
            .map(|group| u64::try_from(group.num_rows()).unwrap_or(0))
            .collect();
        Ok(scanned.with_extensions(Arc::new(access_plan(&row_counts, deleted))))
    }
}

/// How a lake scan opens its files in `store`: footers through the runtime's file-metadata
/// cache, fetched row groups reserved in `context`'s memory pool ([`crate::fetch`]).
pub fn reader_factory(
    context: &TaskContext,
    store: Arc<dyn ObjectStore>,
) -> Arc<dyn ParquetFileReaderFactory> {
    leased_reader_factory(context, store, Vec::new())
}

/// [`reader_factory`], holding `leases` while any reader may be created.
fn leased_reader_factory(
    context: &TaskContext,
    store: Arc<dyn ObjectStore>,
    leases: Vec<Lease>,
) -> Arc<dyn ParquetFileReaderFactory> {
    let footers = context
        .runtime_env()
        .cache_manager
        .get_file_metadata_cache();
    let cached = CachedParquetFileReaderFactory::new(store, footers);
    let pool = Arc::clone(context.memory_pool());
    Arc::new(ReservedReaderFactory::new(Arc::new(cached), pool, leases))
}

/// Registers the lake's store in `runtime` under the URL its scans name (a process that
/// runs plans made elsewhere, a worker, does it before it decodes one); answers the URL
/// and the store.
///
/// # Errors
/// The store could not be opened.
pub fn register_lake_store(
    runtime: &RuntimeEnv,
    storage: &LakeStorage,
) -> Result<(ObjectStoreUrl, Arc<dyn ObjectStore>)> {
    let store = storage.store().map_err(external)?;
    let url = store_url(storage);
    runtime.register_object_store(url.as_ref(), Arc::clone(&store));
    Ok((url, store))
}

/// The URL the lake's store is registered under in DataFusion's runtime: one per store
/// root, so sessions over different lakes never share one.
fn store_url(storage: &LakeStorage) -> ObjectStoreUrl {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    storage.url_prefix().hash(&mut hasher);
    let url = format!("mink-lake://{:016x}", hasher.finish());
    ObjectStoreUrl::parse(url).unwrap_or_else(|_| ObjectStoreUrl::local_filesystem())
}

/// The rows of a file with row groups of `row_counts` rows to read, `deleted` (ascending)
/// left out ([`rows_per_group`]): a row group none of whose rows is deleted is scanned
/// whole, one all of whose rows are is skipped, any other read through a selection.
fn access_plan(row_counts: &[u64], deleted: &[u64]) -> ParquetAccessPlan {
    let groups = rows_per_group(row_counts, deleted)
        .into_iter()
        .map(|rows| match rows {
            GroupRows::All => RowGroupAccess::Scan,
            GroupRows::None => RowGroupAccess::Skip,
            GroupRows::Some(selection) => RowGroupAccess::Selection(selection),
        })
        .collect();
    ParquetAccessPlan::new(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(access: &RowGroupAccess) -> Option<Vec<(bool, usize)>> {
        match access {
            RowGroupAccess::Selection(selection) => {
                Some(selection.iter().map(|s| (s.skip, s.row_count)).collect())
            }
            _ => None,
        }
    }

    #[test]
    fn deletes_become_selections_per_row_group() {
        // Groups of 3, 2 and 4 rows: positions 0-2, 3-4, 5-8.
        let plan = access_plan(&[3, 2, 4], &[1, 1, 3, 4, 8]);
        let groups = plan.inner();
        assert_eq!(
            runs(&groups[0]),
            Some(vec![(false, 1), (true, 1), (false, 1)])
        );
        assert!(matches!(groups[1], RowGroupAccess::Skip));
        assert_eq!(runs(&groups[2]), Some(vec![(false, 3), (true, 1)]));
    }

    #[test]
    fn groups_without_deletes_are_scanned_and_far_positions_ignored() {
        let plan = access_plan(&[2, 2], &[2, 9]);
        let groups = plan.inner();
        assert!(matches!(groups[0], RowGroupAccess::Scan));
        assert_eq!(runs(&groups[1]), Some(vec![(true, 1), (false, 1)]));
    }
}
