//! Column filters as an Iceberg predicate, so planning a split prunes data files by
//! partition values and column statistics.
//!
//! The predicate is made for the schema of the snapshot planned, which Iceberg binds it
//! to: each literal has its lake column's Iceberg type there (a `TIMESTAMP` column of
//! nanoseconds is `timestamp_ns`, one of seconds is `timestamp`, in microseconds, see
//! [`crate::layout::lake_field_type`]), and a filter on a column that snapshot lacks
//! (added after it was written) is left out: its files read the column as NULL and keep
//! no statistics for it.
//!
//! Only what translates exactly is pushed: a filter on a column whose type has no Iceberg
//! literal here, or whose value does not convert to its lake type and back unchanged, is
//! left out of the predicate (the rows are still filtered exactly after reading, see
//! [`mink_core::filter`]). Pruning can only drop files, never rows that match.

use arrow::array::{Array, AsArray};
use arrow::compute::cast;
use arrow::datatypes::{
    Date32Type, Decimal128Type, Float32Type, Float64Type, Int32Type, Int64Type, Schema,
    Time64MicrosecondType, TimestampMicrosecondType, TimestampNanosecondType,
};
use iceberg::arrow::type_to_arrow_type;
use iceberg::expr::{Predicate, Reference};
use iceberg::spec::{Datum, PrimitiveType, Schema as LakeSchema, Type};
use mink_core::filter::{ColumnFilter, FilterOp};

/// Column filters that prune the files a lake read plans, translated with
/// [`to_predicate`] for the schema of the snapshot planned.
#[derive(Debug, Clone, Copy)]
pub struct Pruning<'a> {
    /// The filters, all applied (AND).
    pub filters: &'a [ColumnFilter],
    /// The table's schema: a value parses as its column's type there, as the exact
    /// filter over the rows read parses it.
    pub table_schema: &'a Schema,
}

/// The conjunction of the filters that translate for a snapshot whose schema is
/// `lake_schema`, or `None` when none does. Values parse as their column's type in
/// `table_schema` (the table's schema now), then become literals of the column's type in
/// `lake_schema`.
pub fn to_predicate(
    filters: &[ColumnFilter],
    table_schema: &Schema,
    lake_schema: &LakeSchema,
) -> Option<Predicate> {
    filters
        .iter()
        .filter_map(|filter| translate(filter, table_schema, lake_schema))
        .reduce(Predicate::and)
}

fn translate(
    filter: &ColumnFilter,
    table_schema: &Schema,
    lake_schema: &LakeSchema,
) -> Option<Predicate> {
    let field = table_schema.field_with_name(&filter.column).ok()?;
    // Absent when the column was added after the snapshot: nothing to prune by.
    let lake_field = lake_schema.field_by_name(&filter.column)?;
    let Type::Primitive(lake_type) = lake_field.field_type.as_ref() else {
        return None;
    };
    let reference = Reference::new(filter.column.clone());
    let op = filter.operator().ok()?;
    match op {
        FilterOp::IsNull => return Some(reference.is_null()),
        FilterOp::IsNotNull => return Some(reference.is_not_null()),
        _ => {}
    }
    let value = filter.typed_value(field.data_type()).ok()?;
    let datum = datum(value.as_ref(), lake_type)?;
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

/// A one-element array of a table column's type as a literal of the column's lake type:
/// cast to the Arrow type Iceberg reads `lake_type` as (seconds and milliseconds become
/// microseconds, `TINYINT` an `int`, ...). `None` for a type without a literal here (a
/// UUID) or a value the cast does not carry exactly (out of range, or finer than the lake
/// type): pruning by an approximation could drop a file holding a matching row.
fn datum(value: &dyn Array, lake_type: &PrimitiveType) -> Option<Datum> {
    let lake_value = cast(
        value,
        &type_to_arrow_type(&Type::Primitive(lake_type.clone())).ok()?,
    )
    .ok()
    .filter(|lake_value| !lake_value.is_null(0))?;
    let back = cast(&lake_value, value.data_type()).ok()?;
    if back.as_ref() != value {
        return None;
    }
    let value = lake_value.as_ref();
    Some(match lake_type {
        PrimitiveType::Boolean => Datum::bool(value.as_boolean().value(0)),
        PrimitiveType::Int => Datum::int(value.as_primitive::<Int32Type>().value(0)),
        PrimitiveType::Long => Datum::long(value.as_primitive::<Int64Type>().value(0)),
        PrimitiveType::Float => Datum::float(value.as_primitive::<Float32Type>().value(0)),
        PrimitiveType::Double => Datum::double(value.as_primitive::<Float64Type>().value(0)),
        // Iceberg's single-value form of a decimal: its unscaled value, big-endian.
        PrimitiveType::Decimal { .. } => {
            let unscaled = value.as_primitive::<Decimal128Type>().value(0);
            Datum::try_from_bytes(&unscaled.to_be_bytes(), lake_type.clone()).ok()?
        }
        PrimitiveType::Date => Datum::date(value.as_primitive::<Date32Type>().value(0)),
        PrimitiveType::Time => {
            Datum::time_micros(value.as_primitive::<Time64MicrosecondType>().value(0)).ok()?
        }
        PrimitiveType::Timestamp => {
            Datum::timestamp_micros(value.as_primitive::<TimestampMicrosecondType>().value(0))
        }
        PrimitiveType::Timestamptz => {
            Datum::timestamptz_micros(value.as_primitive::<TimestampMicrosecondType>().value(0))
        }
        PrimitiveType::TimestampNs => {
            Datum::timestamp_nanos(value.as_primitive::<TimestampNanosecondType>().value(0))
        }
        PrimitiveType::TimestamptzNs => {
            Datum::timestamptz_nanos(value.as_primitive::<TimestampNanosecondType>().value(0))
        }
        PrimitiveType::String => Datum::string(value.as_string::<i32>().value(0)),
        PrimitiveType::Binary => Datum::binary(value.as_binary::<i64>().value(0).iter().copied()),
        PrimitiveType::Fixed(_) => {
            Datum::fixed(value.as_fixed_size_binary().value(0).iter().copied())
        }
        PrimitiveType::Uuid => return None,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, TimestampSecondArray};
    use arrow::datatypes::{DataType, Field, TimeUnit};
    use iceberg::expr::Bind;
    use mink_core::options::TableOptions;
    use mink_core::table::{TableDescriptor, TablePath};

    use super::*;
    use crate::layout::lake_schema;

    /// 2024-01-01T12:00:00.001Z in seconds since the epoch, without the milliseconds.
    const NOON: i64 = 1_704_110_400;

    fn table(fields: Vec<Field>) -> TableDescriptor {
        let mut columns = vec![Field::new("id", DataType::Int64, false)];
        columns.extend(fields);
        let options = TableOptions {
            lake_enabled: true,
            ..TableOptions::default()
        };
        TableDescriptor::new(
            TablePath::new("db", "t"),
            Schema::new(columns),
            vec!["id".into()],
            Vec::new(),
            options,
        )
        .unwrap()
    }

    /// `column op value`'s predicate for the lake schema of a table holding `column` of
    /// `data_type`, checked to bind to that schema as a scan of the lake binds it.
    fn pushed(data_type: DataType, op: FilterOp, value: Option<&str>) -> Option<Predicate> {
        let table = table(vec![Field::new("c", data_type, true)]);
        let lake = lake_schema(&table).unwrap();
        let predicate = to_predicate(&[ColumnFilter::new("c", op, value)], table.schema(), &lake)?;
        predicate
            .bind(Arc::new(lake), true)
            .unwrap_or_else(|e| panic!("{predicate} does not bind: {e}"));
        Some(predicate)
    }

    fn c() -> Reference {
        Reference::new("c")
    }

    #[test]
    fn timestamps_of_every_unit_are_literals_of_their_lake_type() {
        let text = Some("2024-01-01T12:00:00");
        for zone in [None, Some("+00:00"), Some("UTC")] {
            let zoned = zone.is_some();
            let micros = |v| match zoned {
                true => Datum::timestamptz_micros(v),
                false => Datum::timestamp_micros(v),
            };
            let nanos = |v| match zoned {
                true => Datum::timestamptz_nanos(v),
                false => Datum::timestamp_nanos(v),
            };
            // Seconds and milliseconds are stored in microseconds, nanoseconds as they are.
            for (unit, datum) in [
                (TimeUnit::Second, micros(NOON * 1_000_000)),
                (TimeUnit::Millisecond, micros(NOON * 1_000_000)),
                (TimeUnit::Microsecond, micros(NOON * 1_000_000)),
                (TimeUnit::Nanosecond, nanos(NOON * 1_000_000_000)),
            ] {
                let data_type = DataType::Timestamp(unit, zone.map(Into::into));
                assert_eq!(
                    pushed(data_type.clone(), FilterOp::Gt, text),
                    Some(c().greater_than(datum)),
                    "{data_type}"
                );
            }
        }
        assert_eq!(
            pushed(
                DataType::Timestamp(TimeUnit::Millisecond, None),
                FilterOp::LtEq,
                Some("2024-01-01T12:00:00.001")
            ),
            Some(c().less_than_or_equal_to(Datum::timestamp_micros(NOON * 1_000_000 + 1000)))
        );
        assert_eq!(
            pushed(
                DataType::Timestamp(TimeUnit::Nanosecond, Some("+00:00".into())),
                FilterOp::Eq,
                Some("2024-01-01T12:00:00.000000001Z")
            ),
            Some(c().equal_to(Datum::timestamptz_nanos(NOON * 1_000_000_000 + 1)))
        );
    }

    #[test]
    fn other_types_are_literals_of_their_lake_type() {
        let cases = [
            (DataType::Boolean, "true", Datum::bool(true)),
            (DataType::Int8, "-128", Datum::int(-128)),
            (DataType::Int16, "32767", Datum::int(32767)),
            (DataType::Int32, "7", Datum::int(7)),
            (DataType::Int64, "-7", Datum::long(-7)),
            (DataType::Float32, "0.25", Datum::float(0.25)),
            (DataType::Float64, "-1.5", Datum::double(-1.5)),
            (DataType::Date32, "1969-12-31", Datum::date(-1)),
            (
                DataType::Time64(TimeUnit::Microsecond),
                "00:00:01.000002",
                Datum::time_micros(1_000_002).unwrap(),
            ),
            (DataType::Utf8, "ünï", Datum::string("ünï")),
            (DataType::LargeUtf8, "x", Datum::string("x")),
            (DataType::Utf8View, "x", Datum::string("x")),
            (DataType::Binary, "ab", Datum::binary(*b"ab")),
            (DataType::LargeBinary, "ab", Datum::binary(*b"ab")),
        ];
        for (data_type, text, datum) in cases {
            assert_eq!(
                pushed(data_type.clone(), FilterOp::NotEq, Some(text)),
                Some(c().not_equal_to(datum)),
                "{data_type}"
            );
        }
    }

    #[test]
    fn decimals_keep_their_scale() {
        for (text, unscaled) in [
            ("12.30", 1230_i128),
            ("-0.05", -5),
            ("99999999.99", 9_999_999_999),
        ] {
            let expected = Datum::try_from_bytes(
                &unscaled.to_be_bytes(),
                PrimitiveType::Decimal {
                    precision: 10,
                    scale: 2,
                },
            )
            .unwrap();
            assert_eq!(
                pushed(DataType::Decimal128(10, 2), FilterOp::GtEq, Some(text)),
                Some(c().greater_than_or_equal_to(expected)),
                "{text}"
            );
        }
    }

    #[test]
    fn null_checks_need_no_literal() {
        let types = [
            DataType::Timestamp(TimeUnit::Nanosecond, None),
            DataType::Decimal128(10, 2),
            DataType::Binary,
        ];
        for data_type in types {
            assert_eq!(
                pushed(data_type.clone(), FilterOp::IsNull, None),
                Some(c().is_null())
            );
            assert_eq!(
                pushed(data_type, FilterOp::IsNotNull, None),
                Some(c().is_not_null())
            );
        }
    }

    #[test]
    fn a_value_the_lake_type_does_not_hold_exactly_is_left_out() {
        // Seconds beyond what microseconds count: a wrapped or clamped literal would prune
        // the file holding the row.
        let beyond: ArrayRef = Arc::new(TimestampSecondArray::from(vec![i64::MAX / 10]));
        assert_eq!(datum(beyond.as_ref(), &PrimitiveType::Timestamp), None);
        let noon: ArrayRef = Arc::new(TimestampSecondArray::from(vec![NOON]));
        assert_eq!(
            datum(noon.as_ref(), &PrimitiveType::Timestamp),
            Some(Datum::timestamp_micros(NOON * 1_000_000))
        );
    }

    #[test]
    fn translates_what_it_can() {
        let table = table(vec![
            Field::new("name", DataType::Utf8, true),
            Field::new("tags", DataType::new_list(DataType::Utf8, true), true),
        ]);
        let lake = lake_schema(&table).unwrap();
        let filters = [
            ColumnFilter::new("id", FilterOp::GtEq, Some("10")),
            ColumnFilter::new("name", FilterOp::Eq, Some("x")),
            ColumnFilter::new("tags", FilterOp::Eq, Some("y")),
        ];
        let predicate = to_predicate(&filters, table.schema(), &lake).unwrap();
        assert_eq!(
            predicate,
            Reference::new("id")
                .greater_than_or_equal_to(Datum::long(10))
                .and(Reference::new("name").equal_to(Datum::string("x")))
        );
        assert!(to_predicate(&filters[2..], table.schema(), &lake).is_none());
        let unknown = [ColumnFilter::new("nope", FilterOp::IsNull, None)];
        assert!(to_predicate(&unknown, table.schema(), &lake).is_none());
    }

    #[test]
    fn a_column_the_snapshot_lacks_is_left_out() {
        // The snapshot was written before `n` was added: its files read `n` as NULL and
        // keep no statistics for it, so only the filters on older columns prune.
        let before = table(vec![Field::new("v", DataType::Utf8, true)]);
        let lake = lake_schema(&before).unwrap();
        let now = table(vec![
            Field::new("v", DataType::Utf8, true),
            Field::new("n", DataType::Int32, true),
        ]);
        let on_n = [
            ColumnFilter::new("n", FilterOp::IsNull, None),
            ColumnFilter::new("n", FilterOp::Eq, Some("5")),
        ];
        assert!(to_predicate(&on_n, now.schema(), &lake).is_none());
        let mixed = [
            ColumnFilter::new("n", FilterOp::Eq, Some("5")),
            ColumnFilter::new("v", FilterOp::Eq, Some("b")),
        ];
        let predicate = to_predicate(&mixed, now.schema(), &lake).unwrap();
        assert_eq!(predicate, Reference::new("v").equal_to(Datum::string("b")));
        predicate.bind(Arc::new(lake), true).unwrap();
    }
}
