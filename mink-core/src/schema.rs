//! Schema normalization: reading a batch written under an older schema version as if it
//! had been written under a newer one.
//!
//! Columns are matched by name. A column the batch lacks (added later) becomes all nulls;
//! a column whose type was promoted (`int` -> `bigint`, ...) is cast; a column the target
//! does not name is dropped. This is how the client reads a log whose batches carry
//! different `schema_id`s, and how the union read lines up lake and log rows.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions, new_null_array};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::SchemaRef;

use crate::{CoreError, Result};

/// Casts fail instead of turning a value they cannot convert into null.
const STRICT: CastOptions<'static> = CastOptions {
    safe: false,
    format_options: arrow::util::display::FormatOptions::new(),
};

/// The columns of `projection` (indexes in a table's current schema) that a batch of
/// `width` columns has, in order: a batch written under an older schema version lacks the
/// columns added since, which come after its own.
pub fn columns_within(projection: &[usize], width: usize) -> impl Iterator<Item = usize> + '_ {
    projection.iter().copied().filter(move |&i| i < width)
}

/// Rewrites `batch` to `target`: columns by name, nulls for missing ones, casts for
/// promoted types.
///
/// # Errors
/// [`CoreError::SchemaMismatch`] when a column is missing but not nullable in `target`,
/// or when a value cannot be cast (text that is not a number, an integer out of range).
pub fn normalize_batch(batch: &RecordBatch, target: &SchemaRef) -> Result<RecordBatch> {
    if batch.schema_ref() == target {
        return Ok(batch.clone());
    }
    let rows = batch.num_rows();
    let columns = target
        .fields()
        .iter()
        .map(|field| match batch.column_by_name(field.name()) {
            Some(column) if column.data_type() == field.data_type() => Ok(Arc::clone(column)),
            Some(column) => cast_with_options(column, field.data_type(), &STRICT).map_err(|e| {
                CoreError::SchemaMismatch(format!(
                    "column '{}' of type {} cannot be read as {}: {e}",
                    field.name(),
                    column.data_type(),
                    field.data_type()
                ))
            }),
            None if field.is_nullable() => Ok(new_null_array(field.data_type(), rows)),
            None => Err(CoreError::SchemaMismatch(format!(
                "batch has no column '{}' and it is not nullable",
                field.name()
            ))),
        })
        .collect::<Result<Vec<ArrayRef>>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(target),
        columns,
        &options,
    )?)
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, Int32Array, StringArray};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};

    use super::*;

    #[test]
    fn added_columns_are_null_and_promoted_types_cast() {
        let old = RecordBatch::try_from_iter(vec![
            ("a", Arc::new(Int32Array::from(vec![1, 2])) as ArrayRef),
            (
                "gone",
                Arc::new(StringArray::from(vec!["x", "y"])) as ArrayRef,
            ),
        ])
        .unwrap();
        let target = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Utf8, true),
        ]));
        let normalized = normalize_batch(&old, &target).unwrap();
        assert_eq!(normalized.schema(), target);
        assert_eq!(
            normalized.column(0).as_primitive::<Int64Type>().values(),
            &[1, 2]
        );
        assert_eq!(normalized.column(1).null_count(), 2);
    }

    #[test]
    fn a_value_that_does_not_fit_is_an_error_not_a_null() {
        let text = RecordBatch::try_from_iter(vec![(
            "a",
            Arc::new(StringArray::from(vec!["1", "x"])) as ArrayRef,
        )])
        .unwrap();
        let target = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)]));
        let err = normalize_batch(&text, &target).unwrap_err();
        assert!(err.to_string().contains("column 'a'"), "{err}");
    }

    #[test]
    fn same_schema_is_untouched_and_missing_required_column_errors() {
        let batch = RecordBatch::try_from_iter(vec![(
            "a",
            Arc::new(Int32Array::from(vec![1])) as ArrayRef,
        )])
        .unwrap();
        assert_eq!(normalize_batch(&batch, &batch.schema()).unwrap(), batch);
        let target = Arc::new(Schema::new(vec![Field::new("z", DataType::Int32, false)]));
        let err = normalize_batch(&batch, &target).unwrap_err();
        assert!(err.to_string().contains("'z'"), "{err}");
    }
}
