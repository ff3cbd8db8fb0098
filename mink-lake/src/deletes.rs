//! Delete files: removing rows from a lake table without rewriting its data files.
//!
//! An Iceberg v2 table deletes rows with delete files, committed like data files (see
//! [`crate::commit`]) and applied by every reader:
//!
//! * A **position delete** file lists `(file_path, pos)` pairs, sorted: row `pos` (0-based)
//!   of data file `file_path` is gone. It applies to data files of its partition whose
//!   data sequence number is at most its own. mink's tiering deletes the lake rows a key's
//!   newer version replaces this way: it knows each key's file and row, and position
//!   deletes are cheap for every engine to apply.
//! * An **equality delete** file holds rows of some columns (the equality ids): every
//!   row of an older data file (strictly lower sequence number) in its partition whose
//!   columns equal one of them is gone. Engines that do not know where a key lives
//!   (Flink's upserts) write these; [`delete_equality`] plays such an engine.
//!
//! Both are Parquet files named by a fresh UUID. A position delete file goes to its
//! bucket's directory; an equality delete file goes to the bucket directory of its
//! partition when the table has mink's layout (see [`crate::layout`]), else to
//! `<location>/data/`.

use std::sync::Arc;

use arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use iceberg::arrow::{
    RecordBatchPartitionSplitter, arrow_schema_to_schema, schema_to_arrow_schema,
};
use iceberg::metadata_columns::{delete_file_path_field, delete_file_pos_field};
use iceberg::spec::{
    DataContentType, DataFile, DataFileBuilder, Literal, NestedFieldRef, Operation, PartitionKey,
    PrimitiveLiteral, Schema, SchemaRef, Struct, Transform,
};
use iceberg::table::Table;
use iceberg::writer::base_writer::equality_delete_writer::{
    EqualityDeleteFileWriterBuilder, EqualityDeleteWriterConfig,
};
use iceberg::writer::file_writer::location_generator::FileNameGenerator;
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::file_writer::{FileWriter, FileWriterBuilder, ParquetWriterBuilder};
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use iceberg::{Error as IcebergError, ErrorKind};
use mink_core::partition::partition_names;
use mink_core::protocol::BucketId;
use mink_core::schema::normalize_batch;

use crate::catalog::Lake;
use crate::commit::{SnapshotChanges, commit_snapshot};
use crate::error::{LakeError, Result};
use crate::layout::{BUCKET_COLUMN, bucket_dir};
use crate::writer::{
    BucketLocation, TARGET_FILE_BYTES, UuidNames, delete_files, writer_properties,
};

/// The schema of a position delete file: `file_path` and `pos` with their reserved ids.
fn position_delete_schema() -> Result<SchemaRef> {
    Ok(Arc::new(
        Schema::builder()
            .with_fields([
                Arc::clone(delete_file_path_field()),
                Arc::clone(delete_file_pos_field()),
            ])
            .build()?,
    ))
}

/// Writes one position delete file in `bucket`'s directory: the rows `deletes` names
/// (`(data file location, row position)`), sorted by file and position, duplicates
/// dropped. The file belongs to lake partition `partition` of the table's default spec,
/// and names the one data file it references when there is one.
///
/// # Errors
/// [`LakeError::Layout`] for no deletes or a negative position; [`LakeError::Iceberg`]
/// when the file cannot be written.
pub async fn write_position_deletes(
    table: &Table,
    bucket: &BucketId,
    partition: &Struct,
    deletes: Vec<(String, i64)>,
) -> Result<DataFile> {
    let mut deletes = deletes;
    deletes.sort_unstable();
    deletes.dedup();
    let (Some((first, _)), Some((last, _))) = (deletes.first(), deletes.last()) else {
        return Err(LakeError::layout(
            table.identifier(),
            "no position deletes to write",
        ));
    };
    if let Some((path, pos)) = deletes.iter().find(|(_, pos)| *pos < 0) {
        return Err(LakeError::layout(
            table.identifier(),
            format!("negative position {pos} in {path}"),
        ));
    }
    let referenced = (first == last).then(|| first.clone());

    let schema = position_delete_schema()?;
    let batch = RecordBatch::try_new(
        Arc::new(schema_to_arrow_schema(&schema)?),
        vec![
            Arc::new(StringArray::from_iter_values(
                deletes.iter().map(|(path, _)| path.as_str()),
            )),
            Arc::new(Int64Array::from_iter_values(
                deletes.iter().map(|(_, pos)| *pos),
            )),
        ],
    )?;
    let metadata = table.metadata();
    let location = format!(
        "{}/{}/{}",
        metadata.location(),
        bucket_dir(bucket),
        UuidNames.generate_file_name()
    );
    let output = table.file_io().new_output(&location)?;
    let mut writer = ParquetWriterBuilder::new(writer_properties(), schema)
        .build(output)
        .await?;
    writer.write(&batch).await?;
    let mut builder = writer.close().await?.pop().ok_or_else(|| {
        LakeError::layout(
            table.identifier(),
            format!("position delete file {location} came out empty"),
        )
    })?;
    builder
        .content(DataContentType::PositionDeletes)
        .partition(partition.clone())
        .partition_spec_id(metadata.default_partition_spec_id())
        .referenced_data_file(referenced);
    build(builder)
}

fn build(builder: DataFileBuilder) -> Result<DataFile> {
    Ok(builder.build().map_err(|e| {
        IcebergError::new(
            ErrorKind::DataInvalid,
            format!("describing a delete file: {e}"),
        )
    })?)
}

/// Writes equality delete files deleting the rows whose `equality_columns` equal a row of
/// `keys`, one file per lake partition (content EqualityDeletes, equality ids = the
/// columns' field ids). `keys` holds the equality columns and every source column of the
/// table's partition spec (for mink's `bucket[N](id)` spec, `id` alone suffices), by name;
/// they are cast to their lake types. No keys, no files.
///
/// # Errors
/// [`LakeError::Layout`] when `keys` has a column the table lacks, lacks an equality or
/// partition source column, or `equality_columns` is empty; [`LakeError::Core`] when a
/// key column cannot be cast to its lake type; [`LakeError::Iceberg`] when a file cannot
/// be written.
pub async fn write_equality_deletes(
    table: &Table,
    keys: &RecordBatch,
    equality_columns: &[&str],
) -> Result<Vec<DataFile>> {
    let metadata = table.metadata();
    let table_schema = metadata.current_schema();
    if equality_columns.is_empty() {
        return Err(LakeError::layout(
            table.identifier(),
            "equality deletes need equality columns",
        ));
    }
    // The keys' own schema: the table's fields of those names, with their ids.
    let fields = keys
        .schema()
        .fields()
        .iter()
        .map(|f| {
            table_schema
                .as_struct()
                .field_by_name(f.name())
                .map(Arc::clone)
                .ok_or_else(|| {
                    LakeError::layout(table.identifier(), format!("no lake column '{}'", f.name()))
                })
        })
        .collect::<Result<Vec<NestedFieldRef>>>()?;
    let id_of = |name: &str| fields.iter().find(|f| f.name == name).map(|f| f.id);
    let equality_ids = equality_columns
        .iter()
        .map(|name| {
            id_of(name).ok_or_else(|| {
                LakeError::layout(
                    table.identifier(),
                    format!("the keys lack equality column '{name}'"),
                )
            })
        })
        .collect::<Result<Vec<i32>>>()?;
    let spec = metadata.default_partition_spec();
    for field in spec.fields() {
        if !fields.iter().any(|f| f.id == field.source_id) {
            let source = table_schema
                .name_by_field_id(field.source_id)
                .unwrap_or("?");
            return Err(LakeError::layout(
                table.identifier(),
                format!(
                    "the keys lack column '{source}', the source of partition field '{}'",
                    field.name
                ),
            ));
        }
    }
    let key_schema: SchemaRef = Arc::new(
        Schema::builder()
            .with_schema_id(table_schema.schema_id())
            .with_fields(fields)
            .build()?,
    );
    let keys = normalize_batch(keys, &Arc::new(schema_to_arrow_schema(&key_schema)?))?;
    if keys.num_rows() == 0 {
        return Ok(Vec::new());
    }
    let parts: Vec<(Option<PartitionKey>, RecordBatch)> = if spec.is_unpartitioned() {
        vec![(None, keys)]
    } else {
        RecordBatchPartitionSplitter::try_new_with_computed_values(
            Arc::clone(&key_schema),
            Arc::clone(spec),
        )?
        .split(&keys)?
        .into_iter()
        .map(|(key, part)| (Some(key), part))
        .collect()
    };

    let mut files = Vec::new();
    for (partition, part) in parts {
        let directory = partition
            .as_ref()
            .and_then(|key| mink_bucket_dir(table, key, &part))
            .unwrap_or_else(|| "data".to_string());
        let config =
            EqualityDeleteWriterConfig::new(equality_ids.clone(), Arc::clone(&key_schema))?;
        let delete_schema = arrow_schema_to_schema(config.projected_arrow_schema_ref())?;
        let rolling = RollingFileWriterBuilder::new(
            ParquetWriterBuilder::new(writer_properties(), Arc::new(delete_schema)),
            TARGET_FILE_BYTES,
            table.file_io().clone(),
            BucketLocation::new(format!("{}/{directory}", metadata.location())),
            UuidNames,
        );
        let mut writer = EqualityDeleteFileWriterBuilder::new(rolling, config)
            .build(partition)
            .await?;
        writer.write(part).await?;
        files.extend(writer.close().await?);
    }
    Ok(files)
}

/// The bucket directory (relative to the table location) of a lake partition, when the
/// table has mink's layout: identity fields named after the partition keys, then the
/// bucket (`bucket[N](key)` or `identity(__bucket)`) last.
fn mink_bucket_dir(table: &Table, key: &PartitionKey, part: &RecordBatch) -> Option<String> {
    let spec = key.spec();
    let (bucket_field, partition_fields) = spec.fields().split_last()?;
    let bucket_source = key.schema().name_by_field_id(bucket_field.source_id)?;
    let bucket_transform = matches!(bucket_field.transform, Transform::Bucket(_))
        || (bucket_field.transform == Transform::Identity && bucket_source == BUCKET_COLUMN);
    let Some(Some(Literal::Primitive(PrimitiveLiteral::Int(bucket)))) = key.data().fields().last()
    else {
        return None;
    };
    if !bucket_transform || part.num_rows() == 0 {
        return None;
    }
    let partition = if partition_fields.is_empty() {
        None
    } else {
        let mut names = Vec::with_capacity(partition_fields.len());
        let mut columns = Vec::with_capacity(partition_fields.len());
        for field in partition_fields {
            let source = key.schema().name_by_field_id(field.source_id)?;
            if field.transform != Transform::Identity || field.name != source {
                return None;
            }
            names.push(field.name.clone());
            columns.push(part.column_by_name(source)?.slice(0, 1));
        }
        Some(partition_names(&names, &columns).ok()?.pop()?)
    };
    let bucket = BucketId {
        table: table.identifier().to_string(),
        partition,
        bucket: u32::try_from(*bucket).ok()?,
    };
    Some(bucket_dir(&bucket))
}

/// Deletes the rows whose `equality_columns` equal a row of `keys` (see
/// [`write_equality_deletes`]) in one Iceberg `delete` snapshot on top of the table's
/// current snapshot, as another engine would: the snapshot carries no mink properties.
///
/// # Errors
/// The errors of [`write_equality_deletes`] and [`commit_snapshot`] (a
/// [`LakeError::CommitConflict`] when the table moved on since `table` was loaded). The
/// delete files are removed again unless the commit's outcome is unknown
/// ([`LakeError::Catalog`]).
pub async fn delete_equality(
    lake: &Lake,
    table: &Table,
    keys: &RecordBatch,
    equality_columns: &[&str],
) -> Result<Table> {
    let files = write_equality_deletes(table, keys, equality_columns).await?;
    let paths: Vec<String> = files.iter().map(|f| f.file_path().to_string()).collect();
    let changes = SnapshotChanges {
        added_delete_files: files,
        ..SnapshotChanges::default()
    };
    let parent = table.metadata().current_snapshot_id();
    match commit_snapshot(lake, table, parent, Operation::Delete, changes).await {
        Ok(committed) => Ok(committed),
        Err(error) => {
            if !matches!(error, LakeError::Catalog(_)) {
                // The commit's error is the one to report; cleanup failures are logged.
                let _ = delete_files(table, &paths).await;
            }
            Err(error)
        }
    }
}
