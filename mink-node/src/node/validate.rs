//! Checks of a written batch against its table: the bucket address, the schema (names,
//! types, nulls), the key columns, and that every row routes to the bucket it is sent to.
//! And of a table's definition against the node's bounds on its size, as it is created
//! or gains a column.

use std::sync::Arc;

use arrow::array::RecordBatch;
use mink_core::protocol::{BucketId, TableDescriptorProto};
use mink_core::routing::row_addresses;
use mink_core::table::TableDescriptor;
use prost::Message;

use crate::error::{NodeError, Result};
use crate::flight::limits::{MAX_COLUMNS, MAX_DESCRIPTOR_BYTES, MAX_SCHEMA_VERSIONS};

/// Checks a table's definition, as it would be stored, against [`MAX_COLUMNS`] (of its
/// current schema), [`MAX_SCHEMA_VERSIONS`] and [`MAX_DESCRIPTOR_BYTES`].
pub(super) fn check_table_size(table: &TableDescriptor) -> Result<()> {
    let fields = table.schema().flattened_fields().len();
    if fields > MAX_COLUMNS {
        return Err(NodeError::InvalidArgument(format!(
            "table {} would have {fields} columns (nested fields counted): a table has at most \
             {MAX_COLUMNS} (MAX_COLUMNS)",
            table.path
        )));
    }
    let versions = table.schemas.len();
    if versions > MAX_SCHEMA_VERSIONS {
        return Err(NodeError::InvalidArgument(format!(
            "table {} would have {versions} schema versions: a table has at most \
             {MAX_SCHEMA_VERSIONS} (MAX_SCHEMA_VERSIONS), one per column added; create a new \
             table with the columns it needs",
            table.path
        )));
    }
    let bytes = TableDescriptorProto::from(table).encoded_len();
    if bytes > MAX_DESCRIPTOR_BYTES {
        return Err(NodeError::InvalidArgument(format!(
            "table {} would be described in {bytes} bytes (every schema version): a table's \
             description holds at most {MAX_DESCRIPTOR_BYTES} (MAX_DESCRIPTOR_BYTES)",
            table.path
        )));
    }
    Ok(())
}

pub(super) fn check_bucket_address(table: &TableDescriptor, bucket: &BucketId) -> Result<()> {
    if bucket.bucket >= table.bucket_num {
        return Err(NodeError::BucketNotFound(format!(
            "{bucket} (table {} has {} buckets)",
            table.path, table.bucket_num
        )));
    }
    if table.is_partitioned() != bucket.partition.is_some() {
        let expected = if table.is_partitioned() {
            "needs a partition"
        } else {
            "takes no partition"
        };
        return Err(NodeError::InvalidArgument(format!(
            "table {} {expected} in its bucket address",
            table.path
        )));
    }
    Ok(())
}

/// Checks that a written batch has the table's current columns (names and types, nulls
/// only where allowed) and relabels it with the table's exact schema.
pub(super) fn conform_to_schema(
    table: &TableDescriptor,
    batch: RecordBatch,
) -> Result<RecordBatch> {
    let expected = table.schema();
    let actual = batch.schema();
    let describe = |fields: &arrow::datatypes::Fields| {
        fields
            .iter()
            .map(|f| format!("{} {}", f.name(), f.data_type()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let same_columns = expected.fields().len() == actual.fields().len()
        && expected
            .fields()
            .iter()
            .zip(actual.fields())
            .all(|(e, a)| e.name() == a.name() && e.data_type() == a.data_type());
    if !same_columns {
        return Err(NodeError::SchemaMismatch(format!(
            "batch columns ({}) do not match table {} (schema version {}: {})",
            describe(actual.fields()),
            table.path,
            table.current().schema_id,
            describe(expected.fields())
        )));
    }
    for (field, column) in expected.fields().iter().zip(batch.columns()) {
        if !field.is_nullable() && column.null_count() > 0 {
            return Err(NodeError::SchemaMismatch(format!(
                "column '{}' of table {} is NOT NULL but the batch has {} nulls in it",
                field.name(),
                table.path,
                column.null_count()
            )));
        }
    }
    Ok(RecordBatch::try_new(
        Arc::clone(expected),
        batch.columns().to_vec(),
    )?)
}

/// Checks a batch of keys to delete: it must hold every primary-key column with the
/// table's type and no nulls; other columns are ignored.
pub(super) fn conform_keys(table: &TableDescriptor, batch: RecordBatch) -> Result<RecordBatch> {
    let schema = table.schema();
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for name in &table.primary_key {
        let expected = schema.field_with_name(name)?;
        let column = batch.column_by_name(name).ok_or_else(|| {
            NodeError::SchemaMismatch(format!(
                "keys to delete from table {} need the primary-key column '{name}'",
                table.path
            ))
        })?;
        if column.data_type() != expected.data_type() {
            return Err(NodeError::SchemaMismatch(format!(
                "key column '{name}' of table {} is {}, not {}",
                table.path,
                expected.data_type(),
                column.data_type()
            )));
        }
        if column.null_count() > 0 {
            return Err(NodeError::InvalidArgument(format!(
                "key column '{name}' holds {} nulls; primary-key values cannot be null",
                column.null_count()
            )));
        }
        fields.push(expected.clone());
        columns.push(Arc::clone(column));
    }
    let schema = Arc::new(arrow::datatypes::Schema::new(fields));
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// Checks that every row belongs to the addressed bucket and partition.
pub(super) fn check_routing(
    table: &TableDescriptor,
    bucket: &BucketId,
    batch: &RecordBatch,
) -> Result<()> {
    let addresses = row_addresses(table, batch)?;
    let misrouted = addresses
        .buckets
        .iter()
        .flatten()
        .enumerate()
        .find(|(_, b)| **b != bucket.bucket);
    if let Some((row, actual)) = misrouted {
        return Err(NodeError::InvalidArgument(format!(
            "row {row} belongs to bucket {actual} of table {}, not bucket {}",
            table.path, bucket.bucket
        )));
    }
    if let (Some(names), Some(partition)) = (&addresses.partitions, &bucket.partition)
        && let Some((row, actual)) = names.iter().enumerate().find(|(_, n)| *n != partition)
    {
        return Err(NodeError::InvalidArgument(format!(
            "row {row} belongs to partition '{actual}' of table {}, not '{partition}'",
            table.path
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use arrow::array::{ArrayRef, Int32Array, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use mink_core::bucket::bucket_of_rows;
    use mink_core::options::TableOptions;
    use mink_core::table::{SchemaVersion, TablePath};

    use super::*;

    fn table(columns: usize) -> TableDescriptor {
        let fields: Vec<Field> = (0..columns)
            .map(|i| Field::new(format!("c{i}"), DataType::Int64, true))
            .collect();
        let path = TablePath::new("db", "t");
        TableDescriptor::new(
            path,
            Schema::new(fields),
            vec![],
            vec![],
            TableOptions::default(),
        )
        .unwrap()
    }

    fn refused(table: &TableDescriptor) -> String {
        match check_table_size(table) {
            Err(NodeError::InvalidArgument(message)) => message,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn columns_are_bounded_nested_fields_counted() {
        assert!(check_table_size(&table(MAX_COLUMNS)).is_ok());
        let message = refused(&table(MAX_COLUMNS + 1));
        assert!(message.contains("4097 columns"), "{message}");
        assert!(message.contains("MAX_COLUMNS"), "{message}");
        let wide = table(MAX_COLUMNS - 1);
        let inner = Field::new("inner", DataType::Int64, true);
        let nested = Field::new("s", DataType::Struct(vec![inner].into()), true);
        let message = refused(&wide.with_added_column(nested).unwrap());
        assert!(message.contains("4097 columns"), "{message}");
    }

    /// `table` with its current schema repeated as further versions, up to `versions`.
    fn with_versions(mut table: TableDescriptor, versions: usize) -> TableDescriptor {
        let current = table.current().clone();
        for schema_id in table.schemas.len()..versions {
            table.schemas.push(SchemaVersion {
                schema_id: u32::try_from(schema_id).unwrap(),
                schema: Arc::clone(&current.schema),
            });
        }
        table
    }

    #[test]
    fn schema_versions_are_bounded() {
        let mut table = table(1);
        for i in 1..MAX_SCHEMA_VERSIONS {
            let field = Field::new(format!("a{i}"), DataType::Int64, true);
            table = table.with_added_column(field).unwrap();
        }
        assert!(
            check_table_size(&table).is_ok(),
            "999 columns added one by one"
        );
        let one_more = Field::new("last", DataType::Int64, true);
        let message = refused(&table.with_added_column(one_more).unwrap());
        assert!(message.contains("1001 schema versions"), "{message}");
        assert!(message.contains("MAX_SCHEMA_VERSIONS"), "{message}");
    }

    #[test]
    fn a_descriptor_is_bounded_in_bytes() {
        // 4096 columns take about 200 KiB a version: 400 versions are over 64 MiB.
        let wide = with_versions(table(MAX_COLUMNS), 400);
        let message = refused(&wide);
        assert!(message.contains("MAX_DESCRIPTOR_BYTES"), "{message}");
    }

    /// `db.t (id BIGINT, dt TEXT, v TEXT)` in 4 buckets: keyed by `id` (or `id, dt`
    /// partitioned by `dt`), or a log table without a key.
    fn rows_table(primary_key: &[&str], partition_keys: &[&str]) -> TableDescriptor {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("dt", DataType::Utf8, true),
            Field::new("v", DataType::Utf8, true),
        ]);
        let options = TableOptions {
            bucket_num: 4,
            ..TableOptions::default()
        };
        let names = |columns: &[&str]| columns.iter().map(|c| c.to_string()).collect();
        TableDescriptor::new(
            TablePath::new("db", "t"),
            schema,
            names(primary_key),
            names(partition_keys),
            options,
        )
        .unwrap()
    }

    fn keyed() -> TableDescriptor {
        rows_table(&["id"], &[])
    }

    fn partitioned() -> TableDescriptor {
        rows_table(&["id", "dt"], &["dt"])
    }

    /// A batch of named columns, with a schema of nullable fields (as a client sends).
    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter_with_nullable(columns.into_iter().map(|(n, c)| (n, c, true)))
            .unwrap()
    }

    fn ids(values: &[Option<i64>]) -> ArrayRef {
        Arc::new(Int64Array::from(values.to_vec()))
    }

    fn texts(values: &[Option<&str>]) -> ArrayRef {
        Arc::new(StringArray::from(values.to_vec()))
    }

    /// The bucket of `id` in a table of 4 buckets keyed by it.
    fn bucket_of(id: i64) -> u32 {
        bucket_of_rows(&[ids(&[Some(id)])], 4).unwrap()[0]
    }

    /// Two ids that fall in different buckets of 4.
    fn ids_in_two_buckets() -> (i64, i64) {
        let other = (1..100).find(|id| bucket_of(*id) != bucket_of(0)).unwrap();
        (0, other)
    }

    fn address(bucket: u32, partition: Option<&str>) -> BucketId {
        BucketId {
            table: "db.t".into(),
            partition: partition.map(str::to_string),
            bucket,
        }
    }

    fn mismatch(result: Result<RecordBatch>) -> String {
        match result {
            Err(NodeError::SchemaMismatch(message)) => message,
            other => panic!("expected SchemaMismatch, got {other:?}"),
        }
    }

    fn invalid<T: std::fmt::Debug>(result: Result<T>) -> String {
        match result {
            Err(NodeError::InvalidArgument(message)) => message,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn a_bucket_address_within_the_table_is_accepted() {
        assert!(check_bucket_address(&keyed(), &address(0, None)).is_ok());
        assert!(check_bucket_address(&keyed(), &address(3, None)).is_ok());
        assert!(check_bucket_address(&partitioned(), &address(3, Some("dt=d0"))).is_ok());
    }

    #[test]
    fn a_bucket_past_the_tables_buckets_is_not_found() {
        match check_bucket_address(&keyed(), &address(4, None)) {
            Err(NodeError::BucketNotFound(message)) => {
                assert_eq!(message, "db.t/4 (table db.t has 4 buckets)");
            }
            other => panic!("expected BucketNotFound, got {other:?}"),
        }
    }

    #[test]
    fn a_partitioned_table_needs_a_partition_in_the_address_and_no_other_takes_one() {
        assert_eq!(
            invalid(check_bucket_address(&partitioned(), &address(0, None))),
            "table db.t needs a partition in its bucket address"
        );
        assert_eq!(
            invalid(check_bucket_address(&keyed(), &address(0, Some("dt=d0")))),
            "table db.t takes no partition in its bucket address"
        );
    }

    #[test]
    fn a_batch_of_the_tables_columns_is_relabelled_with_the_tables_schema() {
        let table = keyed();
        // The client's schema has the key nullable and no metadata: the table's has it
        // NOT NULL, and that is the schema the stored batch carries.
        let sent = batch(vec![
            ("id", ids(&[Some(1), Some(2)])),
            ("dt", texts(&[Some("d0"), None])),
            ("v", texts(&[None, None])),
        ]);
        assert!(sent.schema().field(0).is_nullable());
        let conformed = conform_to_schema(&table, sent.clone()).unwrap();
        assert!(Arc::ptr_eq(&conformed.schema(), table.schema()));
        assert_eq!(conformed.columns(), sent.columns());
    }

    #[test]
    fn a_batch_with_other_columns_is_a_schema_mismatch() {
        let table = keyed();
        let expected = "(schema version 0: id Int64, dt Utf8, v Utf8)";
        let id = ids(&[Some(1)]);
        let text = texts(&[Some("a")]);
        let message = mismatch(conform_to_schema(
            &table,
            batch(vec![("id", Arc::clone(&id)), ("dt", Arc::clone(&text))]),
        ));
        assert_eq!(
            message,
            format!("batch columns (id Int64, dt Utf8) do not match table db.t {expected}")
        );
        let renamed = batch(vec![
            ("id", Arc::clone(&id)),
            ("dt", Arc::clone(&text)),
            ("w", Arc::clone(&text)),
        ]);
        assert!(
            mismatch(conform_to_schema(&table, renamed)).contains("(id Int64, dt Utf8, w Utf8)")
        );
        let reordered = batch(vec![
            ("dt", Arc::clone(&text)),
            ("id", Arc::clone(&id)),
            ("v", Arc::clone(&text)),
        ]);
        assert!(
            mismatch(conform_to_schema(&table, reordered)).contains("(dt Utf8, id Int64, v Utf8)")
        );
        let narrower: ArrayRef = Arc::new(Int32Array::from(vec![1]));
        let retyped = batch(vec![
            ("id", narrower),
            ("dt", Arc::clone(&text)),
            ("v", Arc::clone(&text)),
        ]);
        assert!(
            mismatch(conform_to_schema(&table, retyped)).contains("(id Int32, dt Utf8, v Utf8)")
        );
        let wider = batch(vec![
            ("id", id),
            ("dt", Arc::clone(&text)),
            ("v", Arc::clone(&text)),
            ("w", text),
        ]);
        assert!(
            mismatch(conform_to_schema(&table, wider))
                .contains("(id Int64, dt Utf8, v Utf8, w Utf8)")
        );
    }

    #[test]
    fn a_batch_of_an_earlier_schema_version_is_a_mismatch_naming_the_current_one() {
        let table = keyed()
            .with_added_column(Field::new("w", DataType::Utf8, true))
            .unwrap();
        let old = batch(vec![
            ("id", ids(&[Some(1)])),
            ("dt", texts(&[None])),
            ("v", texts(&[None])),
        ]);
        assert_eq!(
            mismatch(conform_to_schema(&table, old)),
            "batch columns (id Int64, dt Utf8, v Utf8) do not match table db.t (schema version \
             1: id Int64, dt Utf8, v Utf8, w Utf8)"
        );
    }

    #[test]
    fn nulls_are_refused_in_not_null_columns_only() {
        let table = keyed();
        let null_key = batch(vec![
            ("id", ids(&[Some(1), None, None])),
            ("dt", texts(&[None, None, None])),
            ("v", texts(&[None, None, None])),
        ]);
        assert_eq!(
            mismatch(conform_to_schema(&table, null_key)),
            "column 'id' of table db.t is NOT NULL but the batch has 2 nulls in it"
        );
        let log = rows_table(&[], &[]);
        let null_everywhere = batch(vec![
            ("id", ids(&[None])),
            ("dt", texts(&[None])),
            ("v", texts(&[None])),
        ]);
        assert!(conform_to_schema(&log, null_everywhere).is_ok());
    }

    #[test]
    fn keys_to_delete_are_the_key_columns_in_key_order_other_columns_dropped() {
        let table = partitioned();
        let sent = batch(vec![
            ("v", texts(&[Some("x")])),
            ("dt", texts(&[Some("d0")])),
            ("id", ids(&[Some(7)])),
        ]);
        let keys = conform_keys(&table, sent).unwrap();
        let names: Vec<_> = keys
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["id", "dt"]);
        assert_eq!(keys.schema().field(0), table.schema().field(0));
        assert!(!keys.schema().field(0).is_nullable());
        assert_eq!(keys.column(0), &ids(&[Some(7)]));
        assert_eq!(keys.column(1), &texts(&[Some("d0")]));
    }

    #[test]
    fn keys_to_delete_need_every_key_column_of_its_type_without_nulls() {
        let table = partitioned();
        assert_eq!(
            mismatch(conform_keys(&table, batch(vec![("id", ids(&[Some(1)]))]))),
            "keys to delete from table db.t need the primary-key column 'dt'"
        );
        let narrower: ArrayRef = Arc::new(Int32Array::from(vec![1]));
        assert_eq!(
            mismatch(conform_keys(
                &table,
                batch(vec![("id", narrower), ("dt", texts(&[Some("d0")]))])
            )),
            "key column 'id' of table db.t is Int64, not Int32"
        );
        assert_eq!(
            invalid(conform_keys(
                &table,
                batch(vec![("id", ids(&[Some(1)])), ("dt", texts(&[None]))])
            )),
            "key column 'dt' holds 1 nulls; primary-key values cannot be null"
        );
    }

    #[test]
    fn rows_of_the_addressed_bucket_are_accepted() {
        let (id, _) = ids_in_two_buckets();
        let rows = batch(vec![("id", ids(&[Some(id), Some(id)]))]);
        assert!(check_routing(&keyed(), &address(bucket_of(id), None), &rows).is_ok());
        let empty = batch(vec![("id", ids(&[]))]);
        assert!(check_routing(&keyed(), &address(0, None), &empty).is_ok());
    }

    #[test]
    fn a_row_of_another_bucket_is_refused_naming_the_first() {
        let (here, there) = ids_in_two_buckets();
        let rows = batch(vec![("id", ids(&[Some(here), Some(there), Some(there)]))]);
        let bucket = bucket_of(here);
        assert_eq!(
            invalid(check_routing(&keyed(), &address(bucket, None), &rows)),
            format!(
                "row 1 belongs to bucket {} of table db.t, not bucket {bucket}",
                bucket_of(there)
            )
        );
    }

    #[test]
    fn a_row_of_another_partition_is_refused() {
        let table = partitioned();
        let rows = batch(vec![
            ("id", ids(&[Some(0), Some(0)])),
            ("dt", texts(&[Some("d0"), Some("d1")])),
        ]);
        // The bucket key is `id` alone: both rows are in the same bucket of their
        // partitions.
        let bucket = bucket_of(0);
        assert!(check_routing(&table, &address(bucket, Some("dt=d0")), &rows.slice(0, 1)).is_ok());
        assert_eq!(
            invalid(check_routing(
                &table,
                &address(bucket, Some("dt=d0")),
                &rows
            )),
            "row 1 belongs to partition 'dt=d1' of table db.t, not 'dt=d0'"
        );
    }

    #[test]
    fn a_log_tables_rows_go_to_any_bucket() {
        let log = rows_table(&[], &[]);
        let rows = batch(vec![("id", ids(&[Some(0), Some(1), Some(2)]))]);
        for bucket in 0..4 {
            assert!(check_routing(&log, &address(bucket, None), &rows).is_ok());
        }
    }

    #[test]
    fn rows_without_the_bucket_key_cannot_be_routed() {
        let rows = batch(vec![("v", texts(&[Some("x")]))]);
        assert_eq!(
            invalid(check_routing(&keyed(), &address(0, None), &rows)),
            "invalid request: the batch has no column 'id', which routes rows of table db.t"
        );
    }
}
