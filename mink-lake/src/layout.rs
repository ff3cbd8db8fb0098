//! How a mink table is laid out as an Iceberg table.
//!
//! * **Columns**: the table's columns, then `__bucket INT`, `__offset BIGINT` and
//!   `__timestamp TIMESTAMPTZ` (the row's bucket, log offset and commit time). The primary
//!   key, if any, is the Iceberg identifier.
//! * **Partition spec**: the partition keys (identity), then the bucket: `bucket[N](key)`
//!   when the bucket key is one column (mink's bucketing is Iceberg's bucket transform, so
//!   mink bucket `b` is Iceberg partition `bucket[N](key) = b` and any Iceberg engine prunes
//!   by key), else `identity(__bucket)`. Every data file belongs to one mink bucket.
//! * **Files**: `<table location>/data/<mink partition name>/bucket=<b>/<uuid>.parquet`.
//!   Names are UUIDs (never a per-process counter), and a bucket's files share a directory,
//!   so its split is found by path.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Array, Int64Array, RecordBatch, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema, SchemaRef, TimeUnit};
use iceberg::arrow::{arrow_schema_to_schema_auto_assign_ids, schema_to_arrow_schema};
use iceberg::spec::{Schema, Transform, UnboundPartitionSpec};
use mink_core::protocol::BucketId;
use mink_core::schema::normalize_batch;
use mink_core::table::{TableDescriptor, TablePath};

use crate::error::{LakeError, Result};

/// The lake column holding a row's bucket.
pub const BUCKET_COLUMN: &str = "__bucket";
/// The lake column holding a row's log offset.
pub const OFFSET_COLUMN: &str = "__offset";
/// The lake column holding a row's commit time.
pub const TIMESTAMP_COLUMN: &str = "__timestamp";

/// The time zone of lake timestamps (Iceberg `timestamptz`).
const UTC: &str = "+00:00";

/// The Arrow type a column has in the lake.
pub fn lake_field_type(data_type: &DataType) -> DataType {
    match data_type {
        // Iceberg stores timestamps in microseconds.
        DataType::Timestamp(TimeUnit::Second | TimeUnit::Millisecond, zone) => {
            DataType::Timestamp(TimeUnit::Microsecond, zone.clone())
        }
        other => other.clone(),
    }
}

/// The Iceberg schema of a table's lake table.
///
/// # Errors
/// [`LakeError::Layout`] when a column type has no Iceberg equivalent (`UInt64`, ...).
pub fn lake_schema(table: &TableDescriptor) -> Result<Schema> {
    let mut fields: Vec<Field> = table
        .schema()
        .fields()
        .iter()
        .map(|f| {
            f.as_ref()
                .clone()
                .with_data_type(lake_field_type(f.data_type()))
        })
        .collect();
    fields.push(Field::new(BUCKET_COLUMN, DataType::Int32, false));
    fields.push(Field::new(OFFSET_COLUMN, DataType::Int64, false));
    fields.push(Field::new(
        TIMESTAMP_COLUMN,
        DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into())),
        false,
    ));
    let layout_error = |e: iceberg::Error| LakeError::layout(&table.path, e.to_string());
    let schema =
        arrow_schema_to_schema_auto_assign_ids(&ArrowSchema::new(fields)).map_err(layout_error)?;
    if table.primary_key.is_empty() {
        return Ok(schema);
    }
    let identifier_ids = table
        .primary_key
        .iter()
        .map(|name| {
            schema.field_id_by_name(name).ok_or_else(|| {
                LakeError::layout(
                    &table.path,
                    format!("no lake column for key column '{name}'"),
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    schema
        .into_builder()
        .with_identifier_field_ids(identifier_ids)
        .build()
        .map_err(layout_error)
}

/// The partition spec of a table's lake table (see the module docs).
pub fn partition_spec(table: &TableDescriptor, schema: &Schema) -> Result<UnboundPartitionSpec> {
    let id_of = |name: &str| {
        schema
            .field_id_by_name(name)
            .ok_or_else(|| LakeError::layout(&table.path, format!("no lake column '{name}'")))
    };
    let mut spec = UnboundPartitionSpec::builder();
    for key in &table.partition_keys {
        spec = spec.add_partition_field(id_of(key)?, key.clone(), Transform::Identity)?;
    }
    spec = match table.bucket_key.as_slice() {
        [key] => spec.add_partition_field(
            id_of(key)?,
            format!("{key}_bucket"),
            Transform::Bucket(table.bucket_num),
        )?,
        _ => spec.add_partition_field(id_of(BUCKET_COLUMN)?, BUCKET_COLUMN, Transform::Identity)?,
    };
    Ok(spec.build())
}

/// The Arrow schema lake batches are written with (field ids in the metadata).
pub fn lake_arrow_schema(schema: &Schema) -> Result<SchemaRef> {
    Ok(Arc::new(schema_to_arrow_schema(schema)?))
}

/// A log batch as lake rows: the table's columns (cast to their lake types) plus the
/// bucket, offsets `base_offset..` and the commit time.
pub fn lake_batch(
    lake_schema: &SchemaRef,
    batch: &RecordBatch,
    bucket: u32,
    base_offset: i64,
    commit_timestamp_ms: i64,
) -> Result<RecordBatch> {
    let rows = batch.num_rows() as i64;
    let offsets = Int64Array::from_iter_values(base_offset..base_offset + rows);
    let timestamps = Int64Array::from(vec![commit_timestamp_ms; batch.num_rows()]);
    lake_rows(lake_schema, batch, bucket, &offsets, &timestamps)
}

/// Rows of one bucket as lake rows, each with its own log offset and commit time (ms):
/// the newest versions of a primary-key table's keys come from many log batches.
pub fn lake_rows(
    lake_schema: &SchemaRef,
    batch: &RecordBatch,
    bucket: u32,
    offsets: &Int64Array,
    commit_timestamps_ms: &Int64Array,
) -> Result<RecordBatch> {
    let rows = batch.num_rows();
    let bucket =
        i32::try_from(bucket).map_err(|_| LakeError::Config("bucket beyond i32".into()))?;
    let mut fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    fields.push(Field::new(BUCKET_COLUMN, DataType::Int32, false));
    columns.push(Arc::new(Int32Array::from(vec![bucket; rows])));
    fields.push(Field::new(OFFSET_COLUMN, DataType::Int64, false));
    columns.push(Arc::new(offsets.clone()));
    fields.push(Field::new(
        TIMESTAMP_COLUMN,
        DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into())),
        false,
    ));
    let micros = TimestampMicrosecondArray::from_iter_values(
        commit_timestamps_ms.values().iter().map(|ms| ms * 1000),
    );
    columns.push(Arc::new(micros.with_timezone(UTC)));
    let extended = RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), columns)?;
    Ok(normalize_batch(&extended, lake_schema)?)
}

/// The directory of a bucket's data files, relative to the table location.
pub fn bucket_dir(bucket: &BucketId) -> String {
    match &bucket.partition {
        Some(partition) => format!("data/{partition}/bucket={}", bucket.bucket),
        None => format!("data/bucket={}", bucket.bucket),
    }
}

/// The location of `table`'s lake table in `warehouse`: `<warehouse>/<database>/<table>`
/// (where the lake's SQL catalog creates it).
pub fn table_location(warehouse: &str, table: &TablePath) -> String {
    format!(
        "{}/{}/{}",
        warehouse.trim_end_matches('/'),
        table.database,
        table.name
    )
}

/// Whether a table property would have engines write the table's files elsewhere than its
/// location (`write.data.path`, `write.metadata.path`, `write.object-storage.path`, ...).
pub fn relocates_files(property: &str) -> bool {
    property.starts_with("write.") && property.ends_with(".path")
}

/// Checks that the lake file `file` lies inside its table's location `table_location`: a
/// file a manifest (or a node's split) names elsewhere, or with a `.`/`..` step or an
/// empty one, is refused before anything reads or commits it. A local location matches
/// with or without its `file:` scheme.
///
/// # Errors
/// [`LakeError::Layout`] naming the file and the location.
pub fn check_table_file(table: &TablePath, table_location: &str, file: &str) -> Result<()> {
    check_inside(table_location, file).map_err(|message| LakeError::layout(table, message))
}

/// [`check_table_file`] for a caller that names the table itself: the error is the
/// message naming the file and the location.
pub(crate) fn check_inside(table_location: &str, file: &str) -> Result<(), String> {
    let location = without_file_scheme(table_location).trim_end_matches('/');
    let inside = without_file_scheme(file)
        .strip_prefix(location)
        .and_then(|rest| rest.strip_prefix('/'))
        .is_some_and(|rest| rest.split('/').all(|step| !matches!(step, "" | "." | "..")));
    match inside && !location.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "lake file {file} is outside the table's location {table_location}"
        )),
    }
}

/// A local location as a path: `file:///a/b` and `file:/a/b` are `/a/b`; other locations
/// are kept.
pub(crate) fn without_file_scheme(location: &str) -> &str {
    location
        .strip_prefix("file://")
        .or_else(|| location.strip_prefix("file:"))
        .unwrap_or(location)
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, StringArray, TimestampMillisecondArray};
    use arrow::datatypes::{Int64Type, TimestampMicrosecondType};
    use mink_core::options::TableOptions;

    use super::*;

    fn table(pk: &[&str], bucket_key: &[&str]) -> TableDescriptor {
        let schema = ArrowSchema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("dt", DataType::Utf8, false),
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        ]);
        let options = TableOptions {
            bucket_num: 4,
            bucket_key: Some(bucket_key.iter().map(|s| s.to_string()).collect()),
            ..TableOptions::default()
        };
        TableDescriptor::new(
            TablePath::new("db", "t"),
            schema,
            pk.iter().map(|s| s.to_string()).collect(),
            vec!["dt".into()],
            options,
        )
        .unwrap()
    }

    #[test]
    fn schema_has_the_bookkeeping_columns_and_the_key() {
        let schema = lake_schema(&table(&["id", "dt"], &["id"])).unwrap();
        let names: Vec<&str> = schema
            .as_struct()
            .fields()
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(
            names,
            ["id", "dt", "ts", "__bucket", "__offset", "__timestamp"]
        );
        assert_eq!(schema.identifier_field_ids().count(), 2);
    }

    #[test]
    fn single_key_tables_partition_by_bucket_transform_others_by_bucket_column() {
        let keyed = table(&["id", "dt"], &["id"]);
        let schema = lake_schema(&keyed).unwrap();
        let spec = partition_spec(&keyed, &schema).unwrap();
        let names: Vec<&str> = spec.fields().iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["dt", "id_bucket"]);
        assert_eq!(spec.fields()[1].transform, Transform::Bucket(4));

        let multi = table(&[], &["id", "ts"]);
        let schema = lake_schema(&multi).unwrap();
        let spec = partition_spec(&multi, &schema).unwrap();
        assert_eq!(spec.fields()[1].name, "__bucket");
        assert_eq!(spec.fields()[1].transform, Transform::Identity);
    }

    #[test]
    fn lake_batches_carry_offsets_and_microseconds() {
        let t = table(&[], &["id"]);
        let arrow = lake_arrow_schema(&lake_schema(&t).unwrap()).unwrap();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![1, 2])),
            Arc::new(StringArray::from(vec!["a", "b"])),
            Arc::new(TimestampMillisecondArray::from(vec![Some(5), None])),
        ];
        let batch = RecordBatch::try_new(Arc::clone(t.schema()), columns).unwrap();
        let lake = lake_batch(&arrow, &batch, 3, 100, 7).unwrap();
        assert_eq!(lake.schema(), arrow);
        let offsets = lake
            .column_by_name(OFFSET_COLUMN)
            .unwrap()
            .as_primitive::<Int64Type>();
        assert_eq!(offsets.values(), &[100, 101]);
        let ts = lake
            .column_by_name("ts")
            .unwrap()
            .as_primitive::<TimestampMicrosecondType>();
        assert_eq!(ts.value(0), 5000);
        let committed = lake
            .column_by_name(TIMESTAMP_COLUMN)
            .unwrap()
            .as_primitive::<TimestampMicrosecondType>();
        assert_eq!(committed.value(1), 7000);
    }

    #[test]
    fn lake_files_stay_inside_their_table() {
        let t = TablePath::new("db", "t");
        let location = table_location("/w/", &t);
        assert_eq!(location, "/w/db/t");
        for inside in [
            "/w/db/t/data/bucket=1/a.parquet",
            "file:///w/db/t/data/a.parquet",
            "file:/w/db/t/metadata/v1.json",
        ] {
            assert!(check_table_file(&t, &location, inside).is_ok(), "{inside}");
        }
        assert!(check_table_file(&t, "file:///w/db/t/", "/w/db/t/data/a.parquet").is_ok());
        for outside in [
            "/etc/passwd",
            "/w/db/t",
            "/w/db/t/",
            "/w/db/t2/data/a.parquet",
            "/w/db/t/../u/data/a.parquet",
            "/w/db/t/data/./a.parquet",
            "/w/db/t//etc/passwd",
            "s3://bucket/w/db/t/data/a.parquet",
            "",
        ] {
            let error = check_table_file(&t, &location, outside).expect_err(outside);
            assert!(
                error.to_string().contains("outside the table's location"),
                "{error}"
            );
        }
        assert!(check_table_file(&t, "", "/a").is_err());
        let s3 = table_location("s3://bucket/w", &t);
        assert!(check_table_file(&t, &s3, "s3://bucket/w/db/t/data/a.parquet").is_ok());
        assert!(check_table_file(&t, &s3, "s3://other/w/db/t/data/a.parquet").is_err());
    }

    #[test]
    fn bucket_dirs() {
        let mut id = BucketId::new(&TablePath::new("db", "t"), 2);
        assert_eq!(bucket_dir(&id), "data/bucket=2");
        id.partition = Some("dt=2024-01-01".into());
        assert_eq!(bucket_dir(&id), "data/dt=2024-01-01/bucket=2");
    }
}
