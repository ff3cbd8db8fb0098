//! Checks of a written batch against its table: the bucket address, the schema (names,
//! types, nulls), the key columns, and that every row routes to the bucket it is sent to.

use std::sync::Arc;

use arrow::array::RecordBatch;
use mink_core::protocol::BucketId;
use mink_core::routing::row_addresses;
use mink_core::table::TableDescriptor;

use crate::error::{NodeError, Result};

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
