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
    use arrow::datatypes::{DataType, Field, Schema};
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
}
