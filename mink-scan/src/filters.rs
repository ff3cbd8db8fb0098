//! Filters in their wire form ([`ColumnFilter`]: `column op literal`, the form the node's
//! planning and read requests carry) as a DataFusion [`PhysicalExpr`], so that the node's
//! reads prune and filter with the same machinery as the engine's: a
//! `PruningPredicate` over row groups and pages, a `FilterExec` over rows.
//!
//! A comparison with null is null, which a filter treats as false: the same rows as
//! [`mink_core::filter::matches`].

use std::sync::Arc;

use arrow::datatypes::Schema;
use datafusion_common::{Result, ScalarValue};
use datafusion_expr_common::operator::Operator;
use datafusion_physical_expr::PhysicalExpr;
use datafusion_physical_expr::expressions::{
    BinaryExpr, Column, IsNotNullExpr, IsNullExpr, Literal,
};
use datafusion_physical_expr::utils::conjunction_opt;
use mink_core::filter::{ColumnFilter, FilterOp};

use crate::external;

/// The conjunction of `filters` over `schema`; `None` for no filter.
///
/// # Errors
/// A filter on a column `schema` lacks, an unknown operator, a missing value or one that
/// does not parse as the column's type.
pub fn physical_filter(
    filters: &[ColumnFilter],
    schema: &Schema,
) -> Result<Option<Arc<dyn PhysicalExpr>>> {
    let exprs = filters
        .iter()
        .map(|filter| one(filter, schema))
        .collect::<Result<Vec<_>>>()?;
    Ok(conjunction_opt(exprs))
}

fn one(filter: &ColumnFilter, schema: &Schema) -> Result<Arc<dyn PhysicalExpr>> {
    let index = schema.index_of(&filter.column)?;
    let column: Arc<dyn PhysicalExpr> = Arc::new(Column::new(&filter.column, index));
    let op = match filter.operator().map_err(external)? {
        FilterOp::IsNull => return Ok(Arc::new(IsNullExpr::new(column))),
        FilterOp::IsNotNull => return Ok(Arc::new(IsNotNullExpr::new(column))),
        FilterOp::Eq => Operator::Eq,
        FilterOp::NotEq => Operator::NotEq,
        FilterOp::Lt => Operator::Lt,
        FilterOp::LtEq => Operator::LtEq,
        FilterOp::Gt => Operator::Gt,
        FilterOp::GtEq => Operator::GtEq,
    };
    let data_type = schema.field(index).data_type();
    let value = ScalarValue::try_from_array(&filter.typed_value(data_type).map_err(external)?, 0)?;
    Ok(Arc::new(BinaryExpr::new(
        column,
        op,
        Arc::new(Literal::new(value)),
    )))
}

#[cfg(test)]
mod tests {
    use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};

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

    /// The rows `filters` keep, checked against mink-core's own evaluation of them.
    fn rows(filters: &[ColumnFilter]) -> Vec<bool> {
        let batch = batch();
        let expected: Vec<bool> = mink_core::filter::matches(filters, &batch)
            .unwrap()
            .iter()
            .map(|v| v.unwrap())
            .collect();
        let kept: Vec<bool> = match physical_filter(filters, batch.schema_ref()).unwrap() {
            None => vec![true; batch.num_rows()],
            Some(expr) => {
                let result = expr.evaluate(&batch).unwrap();
                let array = result.into_array(batch.num_rows()).unwrap();
                array.as_boolean().iter().map(|v| v == Some(true)).collect()
            }
        };
        assert_eq!(kept, expected, "{filters:?}");
        kept
    }

    #[test]
    fn every_operator_keeps_what_mink_core_keeps() {
        let gt = ColumnFilter::new("id", FilterOp::Gt, Some("1"));
        assert_eq!(rows(std::slice::from_ref(&gt)), [false, true, false, true]);
        for op in [
            FilterOp::Eq,
            FilterOp::NotEq,
            FilterOp::Lt,
            FilterOp::LtEq,
            FilterOp::GtEq,
        ] {
            rows(&[ColumnFilter::new("id", op, Some("5"))]);
        }
        assert_eq!(
            rows(&[ColumnFilter::new("id", FilterOp::IsNull, None)]),
            [false, false, true, false]
        );
        rows(&[ColumnFilter::new("id", FilterOp::IsNotNull, None)]);
        rows(&[ColumnFilter::new("name", FilterOp::Eq, Some("c")), gt]);
        assert_eq!(rows(&[]), [true; 4]);
    }

    #[test]
    fn bad_filters_are_errors_naming_them() {
        let schema = batch().schema();
        let cases = [
            (ColumnFilter::new("nope", FilterOp::Eq, Some("1")), "nope"),
            (ColumnFilter::new("id", FilterOp::Eq, Some("x")), "'x'"),
            (ColumnFilter::new("id", FilterOp::Eq, None), "needs a value"),
            (
                ColumnFilter {
                    op: 99,
                    ..ColumnFilter::new("id", FilterOp::Eq, Some("1"))
                },
                "unknown filter operator",
            ),
        ];
        for (filter, named) in cases {
            let error = physical_filter(&[filter], &schema).unwrap_err();
            assert!(error.to_string().contains(named), "{error}");
        }
    }
}
