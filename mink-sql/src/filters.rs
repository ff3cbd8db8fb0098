//! DataFusion filters as mink column filters (pure translation, no I/O).
//!
//! A filter a mink scan takes is `column op literal` (either way round, `=`, `<>`, `<`,
//! `<=`, `>`, `>=`) or `column IS [NOT] NULL`. The scan prunes lake files and row groups
//! with it and applies it to every row it emits (lake and tail alike), so such a filter
//! is *exact* and DataFusion need not apply it again. Anything else (functions, `OR`,
//! columns on both sides, a literal whose text would not read back as the same value of
//! the column's type) is left to DataFusion.
//!
//! Values travel as text ([`ColumnFilter`]): a literal is turned into text with Arrow's
//! cast and accepted only when that text casts back to exactly the same value in the
//! column's type.

use arrow::array::{Array, StringArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Schema};
use datafusion::common::ScalarValue;
use datafusion::common::tree_node::TreeNode;
use datafusion::logical_expr::expr::InList;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator};
use mink_core::filter::{ColumnFilter, FilterOp};

/// The column filter `expr` is, when a mink scan can apply it exactly.
pub(crate) fn to_column_filter(expr: &Expr, schema: &Schema) -> Option<ColumnFilter> {
    match expr {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let (column, op, literal) = match (left.as_ref(), right.as_ref()) {
                (Expr::Column(column), Expr::Literal(value, _)) => (column, *op, value),
                (Expr::Literal(value, _), Expr::Column(column)) => (column, flip(*op)?, value),
                _ => return None,
            };
            let op = comparison(op)?;
            let field = schema.field_with_name(&column.name).ok()?;
            let text = exact_text(literal, field.data_type())?;
            Some(ColumnFilter::new(&column.name, op, Some(&text)))
        }
        Expr::IsNull(inner) => null_check(inner, FilterOp::IsNull, schema),
        Expr::IsNotNull(inner) => null_check(inner, FilterOp::IsNotNull, schema),
        _ => None,
    }
}

/// The values a filter allows a column, when it is `column IN (literal, ...)` (not
/// `NOT IN`) or `column = literal OR column = literal ...` (what DataFusion makes of a
/// short `IN` list), as text that reads back as the same values of the column's type:
/// a lookup takes them when the column is part of the primary key. `None` for anything
/// else, or when any value would not survive the trip.
pub(crate) fn in_list_values(expr: &Expr, schema: &Schema) -> Option<(String, Vec<String>)> {
    match expr {
        Expr::InList(InList {
            expr,
            list,
            negated: false,
        }) => {
            let Expr::Column(column) = expr.as_ref() else {
                return None;
            };
            let field = schema.field_with_name(&column.name).ok()?;
            let values = list
                .iter()
                .map(|item| match item {
                    Expr::Literal(value, _) => exact_text(value, field.data_type()),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?;
            Some((column.name.clone(), values))
        }
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Or,
            right,
        }) => {
            let (column, mut values) = in_list_values(left, schema)?;
            let (other, more) = in_list_values(right, schema)?;
            (column == other).then(|| {
                values.extend(more);
                (column, values)
            })
        }
        _ => {
            let filter = to_column_filter(expr, schema)?;
            let is_equality = matches!(filter.operator(), Ok(FilterOp::Eq));
            Some((filter.column, vec![filter.value?])).filter(|_| is_equality)
        }
    }
}

/// Whether the lake scan can prune with `expr` (any filter over the table's own columns
/// that gives the same answer every time: `IN`, `OR`, `LIKE`, casts, functions): it is
/// handed to DataFusion's Parquet scan, which keeps the row groups and pages that may
/// match, and applied again above the scan.
pub(crate) fn prunes_lake(expr: &Expr) -> bool {
    let planned_apart = expr.exists(|node| {
        Ok(matches!(
            node,
            Expr::ScalarSubquery(_)
                | Expr::Exists(_)
                | Expr::InSubquery(_)
                | Expr::OuterReferenceColumn(..)
                | Expr::Placeholder(_)
                | Expr::AggregateFunction(_)
                | Expr::WindowFunction(_)
        ))
    });
    !expr.is_volatile() && matches!(planned_apart, Ok(false))
}

fn null_check(inner: &Expr, op: FilterOp, schema: &Schema) -> Option<ColumnFilter> {
    let Expr::Column(column) = inner else {
        return None;
    };
    schema.field_with_name(&column.name).ok()?;
    Some(ColumnFilter::new(&column.name, op, None))
}

fn comparison(op: Operator) -> Option<FilterOp> {
    Some(match op {
        Operator::Eq => FilterOp::Eq,
        Operator::NotEq => FilterOp::NotEq,
        Operator::Lt => FilterOp::Lt,
        Operator::LtEq => FilterOp::LtEq,
        Operator::Gt => FilterOp::Gt,
        Operator::GtEq => FilterOp::GtEq,
        _ => return None,
    })
}

/// `literal op column` as `column op' literal`.
fn flip(op: Operator) -> Option<Operator> {
    Some(match op {
        Operator::Eq | Operator::NotEq => op,
        Operator::Lt => Operator::Gt,
        Operator::LtEq => Operator::GtEq,
        Operator::Gt => Operator::Lt,
        Operator::GtEq => Operator::LtEq,
        _ => return None,
    })
}

/// The literal as text that reads back as the same value of `column_type`; `None` for a
/// null (a comparison with null is never true: DataFusion handles it) or a value that
/// does not survive the trip.
fn exact_text(literal: &ScalarValue, column_type: &DataType) -> Option<String> {
    if literal.is_null() || !is_filterable(column_type) {
        return None;
    }
    let in_column_type = cast(&literal.to_array().ok()?, column_type).ok()?;
    if !same_value(literal, in_column_type.as_ref()) {
        return None;
    }
    let text = cast(&in_column_type, &DataType::Utf8).ok()?;
    let text = text.as_any().downcast_ref::<StringArray>()?;
    if text.is_null(0) {
        return None;
    }
    let text = text.value(0).to_string();
    let back = cast(&StringArray::from(vec![text.as_str()]), column_type).ok()?;
    (back.as_ref() == in_column_type.as_ref()).then_some(text)
}

/// Whether the literal, cast to the column's type, is still the literal (no rounding,
/// no truncation, no null): `id = 1.5` on an integer column is not `id = 1`.
fn same_value(literal: &ScalarValue, in_column_type: &dyn Array) -> bool {
    let Ok(back) = cast(in_column_type, &literal.data_type()) else {
        return false;
    };
    ScalarValue::try_from_array(&back, 0).is_ok_and(|back| back == *literal)
}

/// Types whose values mink's filters compare (primitive, text, binary, temporal).
fn is_filterable(data_type: &DataType) -> bool {
    data_type.is_primitive()
        || matches!(
            data_type,
            DataType::Boolean
                | DataType::Utf8
                | DataType::LargeUtf8
                | DataType::Utf8View
                | DataType::Binary
                | DataType::LargeBinary
        )
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::{Field, TimeUnit};
    use datafusion::logical_expr::{col, lit};

    use super::*;

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("price", DataType::Float64, true),
            Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("tags", DataType::new_list(DataType::Utf8, true), true),
        ])
    }

    #[test]
    fn in_lists_of_literals_give_their_values() {
        let values = |expr: Expr| in_list_values(&expr, &schema());
        assert_eq!(
            values(col("id").in_list(vec![lit(1i64), lit(2i32)], false)),
            Some(("id".to_string(), vec!["1".to_string(), "2".to_string()]))
        );
        assert_eq!(values(col("id").in_list(vec![lit(1i64)], true)), None);
        assert_eq!(values(col("id").in_list(vec![lit(1.5)], false)), None);
        assert_eq!(values(col("id").in_list(vec![col("id")], false)), None);
        assert_eq!(
            values(col("id").eq(lit(1i64)).or(col("id").eq(lit(3i64)))),
            Some(("id".to_string(), vec!["1".to_string(), "3".to_string()]))
        );
        assert_eq!(
            values(col("id").eq(lit(1i64)).or(col("price").eq(lit(3.0)))),
            None
        );
        assert_eq!(
            values(col("id").gt(lit(1i64)).or(col("id").eq(lit(3i64)))),
            None
        );
    }

    fn filter(expr: Expr) -> Option<(String, FilterOp, Option<String>)> {
        to_column_filter(&expr, &schema())
            .map(|f| (f.column.clone(), f.operator().unwrap(), f.value.clone()))
    }

    fn some(
        column: &str,
        op: FilterOp,
        value: Option<&str>,
    ) -> Option<(String, FilterOp, Option<String>)> {
        Some((column.into(), op, value.map(str::to_string)))
    }

    #[test]
    fn comparisons_with_a_literal_either_way_round() {
        assert_eq!(
            filter(col("id").eq(lit(5i64))),
            some("id", FilterOp::Eq, Some("5"))
        );
        assert_eq!(
            filter(col("id").not_eq(lit(5i64))),
            some("id", FilterOp::NotEq, Some("5"))
        );
        assert_eq!(
            filter(col("id").lt(lit(5i64))),
            some("id", FilterOp::Lt, Some("5"))
        );
        assert_eq!(
            filter(lit(5i64).lt(col("id"))),
            some("id", FilterOp::Gt, Some("5"))
        );
        assert_eq!(
            filter(lit(5i64).gt_eq(col("id"))),
            some("id", FilterOp::LtEq, Some("5"))
        );
        assert_eq!(
            filter(col("name").eq(lit("a'b"))),
            some("name", FilterOp::Eq, Some("a'b"))
        );
        assert_eq!(
            filter(col("price").gt(lit(0.1f64))),
            some("price", FilterOp::Gt, Some("0.1"))
        );
    }

    #[test]
    fn null_checks() {
        assert_eq!(
            filter(col("name").is_null()),
            some("name", FilterOp::IsNull, None)
        );
        assert_eq!(
            filter(col("name").is_not_null()),
            some("name", FilterOp::IsNotNull, None)
        );
        assert_eq!(filter(lit(1i64).is_null()), None);
    }

    #[test]
    fn literals_of_another_type_only_when_exact() {
        // An Int32 literal on an Int64 column is the same value.
        assert_eq!(
            filter(col("id").eq(lit(5i32))),
            some("id", FilterOp::Eq, Some("5"))
        );
        // 1.5 is no integer: left to DataFusion.
        assert_eq!(filter(col("id").eq(lit(1.5f64))), None);
        assert_eq!(filter(col("id").eq(lit("x"))), None);
    }

    #[test]
    fn timestamps_read_back_exactly() {
        let at = ScalarValue::TimestampMicrosecond(Some(1_735_689_600_123_456), Some("UTC".into()));
        let (column, op, value) = filter(col("at").gt_eq(lit(at))).expect("pushed");
        assert_eq!((column.as_str(), op), ("at", FilterOp::GtEq));
        let back = cast(
            &arrow::array::StringArray::from(vec![value.unwrap()]),
            &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        )
        .unwrap();
        assert_eq!(
            ScalarValue::try_from_array(&back, 0).unwrap(),
            ScalarValue::TimestampMicrosecond(Some(1_735_689_600_123_456), Some("UTC".into()))
        );
    }

    #[test]
    fn everything_else_is_left_to_datafusion() {
        assert_eq!(filter(col("id").eq(col("id"))), None);
        assert_eq!(filter(col("id").eq(lit(ScalarValue::Int64(None)))), None);
        assert_eq!(
            filter(col("id").eq(lit(1i64)).or(col("id").eq(lit(2i64)))),
            None
        );
        assert_eq!(filter(col("id").like(lit("1%"))), None);
        assert_eq!(filter(col("missing").eq(lit(1i64))), None);
        assert_eq!(filter((col("id") + lit(1i64)).eq(lit(2i64))), None);
        assert_eq!(
            filter(col("tags").is_null()),
            some("tags", FilterOp::IsNull, None)
        );
    }
}
