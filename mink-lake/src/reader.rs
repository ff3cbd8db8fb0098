//! Reading the lake: a bucket's split of a snapshot, streamed from Parquet.
//!
//! The read path is mink's own (iceberg's scan is single-partition and holds whole files
//! per task): plan the snapshot's files with Iceberg, keep the bucket's (they share its
//! directory, see [`crate::layout`]), and stream each file from the object store with the
//! projection pushed into the Parquet reader. Nothing beyond one row group's batches is in
//! memory. The node's Union and Lake tickets and the SQL engine share it.

use std::sync::Arc;

use arrow::array::{BooleanArray, RecordBatch, Scalar};
use arrow::compute::and;
use arrow::compute::kernels::cmp;
use arrow::datatypes::{Schema, SchemaRef};
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use iceberg::expr::Predicate;
use iceberg::table::Table;
use mink_core::filter::{ColumnFilter, FilterOp};
use mink_core::protocol::BucketId;
use mink_core::schema::normalize_batch;
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::async_reader::ParquetObjectReader;
use parquet::file::metadata::ParquetMetaData;

use crate::error::{LakeError, Result};
use crate::layout::bucket_dir;
use crate::storage::LakeStorage;

/// One data file of a split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LakeFile {
    /// Its location.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its row count, when the manifest says.
    pub record_count: Option<u64>,
}

/// The lake files a read covers, in one snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LakeSplit {
    /// The snapshot planned on.
    pub snapshot_id: Option<i64>,
    /// Its data files.
    pub files: Vec<LakeFile>,
}

impl LakeSplit {
    /// Rows in the split, as far as the manifests say.
    pub fn record_count(&self) -> u64 {
        self.files.iter().filter_map(|f| f.record_count).sum()
    }
}

/// Which files of a snapshot a split takes.
#[derive(Debug, Clone)]
pub enum SplitScope {
    /// Every file.
    Table,
    /// The files of one partition of a partitioned table.
    Partition(String),
    /// The files of one bucket.
    Bucket(BucketId),
}

/// Plans a split of `snapshot_id`; with a predicate, files that cannot hold a matching row
/// (by partition values and column statistics) are left out.
///
/// # Errors
/// [`LakeError::SnapshotNotFound`] when the table has no such snapshot.
pub async fn plan_split(
    table: &Table,
    snapshot_id: i64,
    scope: &SplitScope,
    predicate: Option<Predicate>,
) -> Result<LakeSplit> {
    if table.metadata().snapshot_by_id(snapshot_id).is_none() {
        return Err(LakeError::SnapshotNotFound {
            table: table.identifier().to_string(),
            snapshot_id,
        });
    }
    let location = table.metadata().location();
    let prefix = match scope {
        SplitScope::Table => format!("{location}/"),
        SplitScope::Partition(partition) => format!("{location}/data/{partition}/"),
        SplitScope::Bucket(bucket) => format!("{location}/{}/", bucket_dir(bucket)),
    };
    let mut scan = table.scan().snapshot_id(snapshot_id).select_all();
    if let Some(predicate) = predicate {
        scan = scan.with_filter(predicate);
    }
    let scan = scan.build()?;
    let tasks: Vec<_> = scan.plan_files().await?.try_collect().await?;
    let files = tasks
        .into_iter()
        .filter(|task| task.data_file_path.starts_with(&prefix))
        .map(|task| LakeFile {
            path: task.data_file_path,
            size: task.file_size_in_bytes,
            record_count: task.record_count,
        })
        .collect();
    Ok(LakeSplit {
        snapshot_id: Some(snapshot_id),
        files,
    })
}

/// Streams a split's rows in `schema` (columns by name: a column a file lacks, added to
/// the table after the file was written, reads as null; columns not in `schema` are not
/// read at all). Row groups whose statistics rule out `filters` are skipped; the rows
/// read are not filtered here (the caller applies the filters exactly).
pub fn read_split(
    storage: &LakeStorage,
    split: LakeSplit,
    schema: SchemaRef,
    filters: Vec<ColumnFilter>,
) -> BoxStream<'static, Result<RecordBatch>> {
    let storage = storage.clone();
    let filters = Arc::new(filters);
    stream::iter(split.files)
        .then(move |file| {
            let storage = storage.clone();
            let schema = Arc::clone(&schema);
            let filters = Arc::clone(&filters);
            async move { open_file(&storage, &file, schema, &filters).await }
        })
        .try_flatten()
        .boxed()
}

/// The row groups of a file that may hold rows matching every filter, judged by their
/// min/max statistics. A filter that cannot be judged (no statistics, `<>`, nulls) keeps
/// every row group.
pub fn row_groups_to_read(
    metadata: &ParquetMetaData,
    arrow_schema: &Schema,
    filters: &[ColumnFilter],
) -> Vec<usize> {
    let row_groups = metadata.row_groups();
    let mut keep = vec![true; row_groups.len()];
    for filter in filters {
        let may_match = row_groups_may_match(metadata, arrow_schema, filter);
        for (keep, may) in keep.iter_mut().zip(may_match.iter()) {
            *keep &= may.unwrap_or(true);
        }
    }
    keep.iter()
        .enumerate()
        .filter(|(_, k)| **k)
        .map(|(i, _)| i)
        .collect()
}

fn row_groups_may_match(
    metadata: &ParquetMetaData,
    arrow_schema: &Schema,
    filter: &ColumnFilter,
) -> BooleanArray {
    let unknown = || BooleanArray::from(vec![None; metadata.num_row_groups()]);
    let judged = || -> Option<BooleanArray> {
        let op = filter.operator().ok()?;
        let field = arrow_schema.field_with_name(&filter.column).ok()?;
        let converter = StatisticsConverter::try_new(
            &filter.column,
            arrow_schema,
            metadata.file_metadata().schema_descr(),
        )
        .ok()?;
        let mins = converter.row_group_mins(metadata.row_groups()).ok()?;
        let maxes = converter.row_group_maxes(metadata.row_groups()).ok()?;
        let value = Scalar::new(filter.typed_value(field.data_type()).ok()?);
        let may = match op {
            FilterOp::Eq => and(
                &cmp::lt_eq(&mins, &value).ok()?,
                &cmp::gt_eq(&maxes, &value).ok()?,
            )
            .ok()?,
            FilterOp::Lt => cmp::lt(&mins, &value).ok()?,
            FilterOp::LtEq => cmp::lt_eq(&mins, &value).ok()?,
            FilterOp::Gt => cmp::gt(&maxes, &value).ok()?,
            FilterOp::GtEq => cmp::gt_eq(&maxes, &value).ok()?,
            FilterOp::NotEq | FilterOp::IsNull | FilterOp::IsNotNull => return None,
        };
        Some(may)
    };
    judged().unwrap_or_else(unknown)
}

async fn open_file(
    storage: &LakeStorage,
    file: &LakeFile,
    schema: SchemaRef,
    filters: &[ColumnFilter],
) -> Result<BoxStream<'static, Result<RecordBatch>>> {
    let reader = ParquetObjectReader::new(storage.store()?, storage.path(&file.path)?)
        .with_file_size(file.size);
    let builder = ParquetRecordBatchStreamBuilder::new(reader).await?;
    let row_groups = row_groups_to_read(builder.metadata(), builder.schema(), filters);
    let builder = builder.with_row_groups(row_groups);
    let file_fields = builder.schema().fields().clone();
    let wanted: Vec<usize> = file_fields
        .iter()
        .enumerate()
        .filter(|(_, f)| schema.field_with_name(f.name()).is_ok())
        .map(|(i, _)| i)
        .collect();
    let mask = ProjectionMask::roots(builder.parquet_schema(), wanted);
    let batches = builder.with_projection(mask).build()?;
    Ok(batches
        .map(move |batch| Ok(normalize_batch(&batch?, &schema)?))
        .boxed())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array};
    use parquet::arrow::ArrowWriter;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::file::properties::WriterProperties;

    use super::*;

    /// A file of ids 0..1000 in row groups of 100.
    fn metadata() -> (Arc<ParquetMetaData>, SchemaRef) {
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..1000));
        let batch = RecordBatch::try_from_iter(vec![("id", ids)]).unwrap();
        let mut bytes = Vec::new();
        let properties = WriterProperties::builder()
            .set_max_row_group_row_count(Some(100))
            .build();
        let mut writer =
            ArrowWriter::try_new(&mut bytes, batch.schema(), Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let builder = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes)).unwrap();
        (Arc::clone(builder.metadata()), Arc::clone(builder.schema()))
    }

    #[test]
    fn statistics_skip_row_groups_that_cannot_match() {
        let (metadata, schema) = metadata();
        let groups = |filters: &[ColumnFilter]| row_groups_to_read(&metadata, &schema, filters);
        assert_eq!(
            groups(&[ColumnFilter::new("id", FilterOp::Eq, Some("250"))]),
            vec![2]
        );
        assert_eq!(
            groups(&[ColumnFilter::new("id", FilterOp::Lt, Some("150"))]),
            vec![0, 1]
        );
        assert_eq!(
            groups(&[ColumnFilter::new("id", FilterOp::GtEq, Some("900"))]),
            vec![9]
        );
        assert_eq!(
            groups(&[
                ColumnFilter::new("id", FilterOp::Gt, Some("299")),
                ColumnFilter::new("id", FilterOp::LtEq, Some("400")),
            ]),
            vec![3, 4]
        );
        assert_eq!(
            groups(&[ColumnFilter::new("id", FilterOp::Eq, Some("5000"))]),
            Vec::<usize>::new()
        );
        // What cannot be judged keeps everything.
        assert_eq!(
            groups(&[ColumnFilter::new("id", FilterOp::NotEq, Some("1"))]).len(),
            10
        );
        assert_eq!(
            groups(&[ColumnFilter::new("other", FilterOp::Eq, Some("1"))]).len(),
            10
        );
        assert_eq!(groups(&[]).len(), 10);
    }
}
