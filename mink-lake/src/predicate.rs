//! Column filters as an Iceberg predicate, so planning a split prunes data files by
//! partition values and column statistics.
//!
//! Only what translates exactly is pushed: a filter on a column whose type has no Iceberg
//! literal here is left out of the predicate (the rows are still filtered exactly after
//! reading, see [`mink_core::filter`]). Pruning can only drop files, never rows that match.

use arrow::array::{Array, AsArray};
use arrow::datatypes::{
    DataType, Date32Type, Float32Type, Float64Type, Int32Type, Int64Type, Schema, TimeUnit,
    TimestampMicrosecondType,
};
use iceberg::expr::{Predicate, Reference};
use iceberg::spec::Datum;
use mink_core::filter::{ColumnFilter, FilterOp};

/// The conjunction of the filters that translate, or `None` when none does.
pub fn to_predicate(filters: &[ColumnFilter], schema: &Schema) -> Option<Predicate> {
    filters
        .iter()
        .filter_map(|filter| translate(filter, schema))
        .reduce(Predicate::and)
}

fn translate(filter: &ColumnFilter, schema: &Schema) -> Option<Predicate> {
    let field = schema.field_with_name(&filter.column).ok()?;
    let reference = Reference::new(filter.column.clone());
    let op = filter.operator().ok()?;
    match op {
        FilterOp::IsNull => return Some(reference.is_null()),
        FilterOp::IsNotNull => return Some(reference.is_not_null()),
        _ => {}
    }
    let value = filter.typed_value(field.data_type()).ok()?;
    let datum = datum(value.as_ref())?;
    Some(match op {
        FilterOp::Eq => reference.equal_to(datum),
        FilterOp::NotEq => reference.not_equal_to(datum),
        FilterOp::Lt => reference.less_than(datum),
        FilterOp::LtEq => reference.less_than_or_equal_to(datum),
        FilterOp::Gt => reference.greater_than(datum),
        FilterOp::GtEq => reference.greater_than_or_equal_to(datum),
        FilterOp::IsNull | FilterOp::IsNotNull => return None,
    })
}

/// The Iceberg literal of a one-element array, for the types mink pushes down.
fn datum(value: &dyn Array) -> Option<Datum> {
    Some(match value.data_type() {
        DataType::Int8 | DataType::Int16 | DataType::Int32 => {
            let value = arrow::compute::cast(value, &DataType::Int32).ok()?;
            Datum::int(value.as_primitive::<Int32Type>().value(0))
        }
        DataType::Int64 => Datum::long(value.as_primitive::<Int64Type>().value(0)),
        DataType::Float32 => Datum::float(value.as_primitive::<Float32Type>().value(0)),
        DataType::Float64 => Datum::double(value.as_primitive::<Float64Type>().value(0)),
        DataType::Boolean => Datum::bool(value.as_boolean().value(0)),
        DataType::Utf8 => Datum::string(value.as_string::<i32>().value(0)),
        DataType::Date32 => Datum::date(value.as_primitive::<Date32Type>().value(0)),
        DataType::Timestamp(_, zone) => {
            let micros = arrow::compute::cast(
                value,
                &DataType::Timestamp(TimeUnit::Microsecond, zone.clone()),
            )
            .ok()?;
            let micros = micros.as_primitive::<TimestampMicrosecondType>().value(0);
            if zone.is_some() {
                Datum::timestamptz_micros(micros)
            } else {
                Datum::timestamp_micros(micros)
            }
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::Field;

    use super::*;

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("tags", DataType::new_list(DataType::Utf8, true), true),
        ])
    }

    #[test]
    fn translates_what_it_can() {
        let filters = [
            ColumnFilter::new("id", FilterOp::GtEq, Some("10")),
            ColumnFilter::new("name", FilterOp::Eq, Some("x")),
            ColumnFilter::new("tags", FilterOp::Eq, Some("y")),
        ];
        let predicate = to_predicate(&filters, &schema()).unwrap();
        let text = predicate.to_string();
        assert!(text.contains("id >= 10"), "{text}");
        assert!(text.contains("name = \"x\""), "{text}");
        assert!(!text.contains("tags"), "{text}");
        assert!(to_predicate(&filters[2..], &schema()).is_none());
        assert!(
            to_predicate(
                &[ColumnFilter::new("nope", FilterOp::IsNull, None)],
                &schema()
            )
            .is_none()
        );
    }
}
