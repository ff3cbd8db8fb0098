//! Column filters: the predicates a read can push down (`column op value`, combined with
//! AND).
//!
//! The lake prunes files with them (translated to an Iceberg predicate, see
//! `mink-lake`), and every emitted row is checked with [`matches()`], so a filter is always
//! exact. Values travel as text and are cast to the column's type, so one message shape
//! serves every type.

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, StringArray};
use arrow::compute::kernels::cmp;
use arrow::compute::{and_kleene, cast, is_not_null, is_null};
use arrow::datatypes::DataType;

use crate::{CoreError, Result};

/// A comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum FilterOp {
    /// `=`
    Eq = 0,
    /// `<>`
    NotEq = 1,
    /// `<`
    Lt = 2,
    /// `<=`
    LtEq = 3,
    /// `>`
    Gt = 4,
    /// `>=`
    GtEq = 5,
    /// `IS NULL`
    IsNull = 6,
    /// `IS NOT NULL`
    IsNotNull = 7,
}

/// `column op value`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ColumnFilter {
    /// The column, by name.
    #[prost(string, tag = "1")]
    pub column: String,
    /// The comparison.
    #[prost(enumeration = "FilterOp", tag = "2")]
    pub op: i32,
    /// The value as text, cast to the column's type; absent for IS \[NOT\] NULL.
    #[prost(string, optional, tag = "3")]
    pub value: Option<String>,
}

impl ColumnFilter {
    /// `column op value`.
    pub fn new(column: impl Into<String>, op: FilterOp, value: Option<&str>) -> Self {
        Self {
            column: column.into(),
            op: op as i32,
            value: value.map(str::to_string),
        }
    }

    /// The comparison; an error for an operator this build does not know.
    pub fn operator(&self) -> Result<FilterOp> {
        FilterOp::try_from(self.op)
            .map_err(|_| CoreError::InvalidRequest(format!("unknown filter operator {}", self.op)))
    }

    /// The value as a one-element array of `data_type`.
    ///
    /// # Errors
    /// [`CoreError::InvalidRequest`] when the value is missing or does not parse as the
    /// column's type.
    pub fn typed_value(&self, data_type: &DataType) -> Result<ArrayRef> {
        let text = self.value.as_deref().ok_or_else(|| {
            CoreError::InvalidRequest(format!("filter on '{}' needs a value", self.column))
        })?;
        let value = cast(&StringArray::from(vec![text]), data_type)?;
        if value.is_null(0) {
            return Err(CoreError::InvalidRequest(format!(
                "filter value '{text}' is not a {data_type} (column '{}')",
                self.column
            )));
        }
        Ok(value)
    }
}

/// Which rows of `batch` satisfy every filter (a null comparison is false).
///
/// # Errors
/// [`CoreError::InvalidRequest`] for a filter on a column the batch lacks or a value that
/// does not parse.
pub fn matches(filters: &[ColumnFilter], batch: &RecordBatch) -> Result<BooleanArray> {
    let mut result = BooleanArray::from(vec![true; batch.num_rows()]);
    for filter in filters {
        let column = batch.column_by_name(&filter.column).ok_or_else(|| {
            CoreError::InvalidRequest(format!("filter on unknown column '{}'", filter.column))
        })?;
        let one = match filter.operator()? {
            FilterOp::IsNull => is_null(column)?,
            FilterOp::IsNotNull => is_not_null(column)?,
            op => {
                let value = arrow::array::Scalar::new(filter.typed_value(column.data_type())?);
                match op {
                    FilterOp::Eq => cmp::eq(column, &value)?,
                    FilterOp::NotEq => cmp::neq(column, &value)?,
                    FilterOp::Lt => cmp::lt(column, &value)?,
                    FilterOp::LtEq => cmp::lt_eq(column, &value)?,
                    FilterOp::Gt => cmp::gt(column, &value)?,
                    FilterOp::GtEq => cmp::gt_eq(column, &value)?,
                    FilterOp::IsNull | FilterOp::IsNotNull => unreachable!("handled above"),
                }
            }
        };
        result = and_kleene(&result, &one)?;
    }
    // A null comparison does not match.
    Ok(result.iter().map(|v| Some(v == Some(true))).collect())
}

/// The rows of `batch` that satisfy every filter.
pub fn filter_batch(filters: &[ColumnFilter], batch: &RecordBatch) -> Result<RecordBatch> {
    if filters.is_empty() {
        return Ok(batch.clone());
    }
    Ok(arrow::compute::filter_record_batch(
        batch,
        &matches(filters, batch)?,
    )?)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int64Array;

    use super::*;

    fn batch() -> RecordBatch {
        RecordBatch::try_from_iter(vec![
            (
                "id",
                Arc::new(Int64Array::from(vec![Some(1), Some(5), None, Some(9)])) as ArrayRef,
            ),
            (
                "name",
                Arc::new(StringArray::from(vec!["a", "b", "c", "d"])) as ArrayRef,
            ),
        ])
        .unwrap()
    }

    fn rows(filters: &[ColumnFilter]) -> Vec<bool> {
        matches(filters, &batch())
            .unwrap()
            .iter()
            .map(|v| v.unwrap())
            .collect()
    }

    #[test]
    fn comparisons_and_conjunctions() {
        assert_eq!(
            rows(&[ColumnFilter::new("id", FilterOp::Gt, Some("1"))]),
            [false, true, false, true]
        );
        assert_eq!(
            rows(&[
                ColumnFilter::new("id", FilterOp::GtEq, Some("1")),
                ColumnFilter::new("id", FilterOp::Lt, Some("9")),
            ]),
            [true, true, false, false]
        );
        assert_eq!(
            rows(&[ColumnFilter::new("id", FilterOp::IsNull, None)]),
            [false, false, true, false]
        );
        assert_eq!(
            rows(&[ColumnFilter::new("id", FilterOp::NotEq, Some("5"))]),
            [true, false, false, true]
        );
        assert_eq!(
            rows(&[ColumnFilter::new("name", FilterOp::Eq, Some("c"))]),
            [false, false, true, false]
        );
        assert_eq!(rows(&[]), [true; 4]);
    }

    #[test]
    fn bad_filters_are_named() {
        let err = matches(
            &[ColumnFilter::new("nope", FilterOp::Eq, Some("1"))],
            &batch(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("'nope'"), "{err}");
        let err = matches(
            &[ColumnFilter::new("id", FilterOp::Eq, Some("x"))],
            &batch(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("'x'"), "{err}");
        let err = matches(&[ColumnFilter::new("id", FilterOp::Eq, None)], &batch()).unwrap_err();
        assert!(err.to_string().contains("needs a value"), "{err}");
    }
}
