//! The SQL type of every Arrow type, as JDBC and ODBC clients name and size it.
//!
//! A Flight SQL client sees Arrow types; a JDBC or ODBC client, and a tool reflecting a
//! table through them, wants SQL types: a name (`VARCHAR`, `DECIMAL`), a size, a
//! scale. [`sql_type`] gives them for any Arrow type, once, for every answer that
//! describes a type: the column metadata of tables and results
//! ([`columns`](super::columns)) and `GetXdbcTypeInfo` ([`xdbc_types`]), which lists
//! the types a table can be created with under the same names.
//!
//! Names are SQL's, as mink's `CREATE TABLE` spells them, so a name read back creates
//! the same type (`TIMESTAMP WITH TIME ZONE` creates a UTC column, `+00:00`; a column of
//! another zone comes from Arrow data, an ingest or the demo's tables):
//!
//! | Arrow                                   | name                     | precision (JDBC column size)      | scale            |
//! |-----------------------------------------|--------------------------|-----------------------------------|------------------|
//! | `Boolean`                               | `BOOLEAN`                | 1                                 | 0                |
//! | `Int8` .. `Int64`, `UInt8` .. `UInt64`  | `TINYINT` .. `BIGINT` (`... UNSIGNED`) | decimal digits (3, 5, 10, 19; 20 for `BIGINT UNSIGNED`) | 0 |
//! | `Float32`, `Float64`                    | `REAL`, `DOUBLE`         | binary digits (24, 53)            | 0                |
//! | `Decimal*(p, s)`                        | `DECIMAL`                | p                                 | s                |
//! | `Utf8`, `LargeUtf8`, `Utf8View`         | `VARCHAR`                | unbounded (`i32::MAX`)            | 0                |
//! | `Binary`, `LargeBinary`, `BinaryView`   | `BYTEA`                  | unbounded (`i32::MAX`)            | 0                |
//! | `FixedSizeBinary(n)`                    | `BYTEA`                  | n                                 | 0                |
//! | `Date32`, `Date64`                      | `DATE`                   | 10 (`YYYY-MM-DD`)                 | 0                |
//! | `Time32`, `Time64`                      | `TIME`                   | characters of `HH:MM:SS.fff...`   | fraction digits  |
//! | `Timestamp(unit, None)`                 | `TIMESTAMP`              | characters of `YYYY-MM-DD HH:MM:SS.fff...` | fraction digits |
//! | `Timestamp(unit, Some(zone))`           | `TIMESTAMP WITH TIME ZONE` | the same, plus 6 (`+00:00`)     | fraction digits  |
//! | `Interval`, `Duration`                  | `INTERVAL`               | 0 (does not apply)                | 0                |
//! | lists, structs, maps, unions, `Null`    | `ARRAY`, `STRUCT`, `MAP`, `UNION`, `NULL` | 0                | 0                |
//!
//! A dictionary or run-end encoded column is described by its values. Floats count
//! binary digits (their radix is 2), as `GetXdbcTypeInfo`'s `num_prec_radix` says.

use arrow::datatypes::{DataType, TimeUnit};
use arrow_flight::error::FlightError;
use arrow_flight::sql::metadata::{XdbcTypeInfo, XdbcTypeInfoData, XdbcTypeInfoDataBuilder};
use arrow_flight::sql::{Nullable, Searchable, XdbcDataType};

/// Precision of a type whose values have no bound on their length.
const UNBOUNDED: i32 = i32::MAX;

/// How a JDBC or ODBC client sees one Arrow type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SqlType {
    /// The type's name, as `CREATE TABLE` takes it.
    pub(crate) name: &'static str,
    /// Its JDBC/ODBC type code.
    pub(crate) xdbc: XdbcDataType,
    /// JDBC's column size: the digits of a number, the characters of a date or time
    /// literal, the bytes of a fixed-size binary, [`UNBOUNDED`] for strings and
    /// bytes; 0 where it does not apply.
    pub(crate) precision: i32,
    /// Digits after the point (decimals) or fraction digits of seconds; 0 otherwise.
    pub(crate) scale: i32,
    /// The radix `precision` counts in: 10, 2 for floats, none for non-numbers.
    pub(crate) radix: Option<i32>,
    /// Whether comparing values tells upper from lower case (strings).
    pub(crate) case_sensitive: bool,
    /// Whether a literal of the type is written quoted (`'2024-01-01'`).
    pub(crate) quoted: bool,
    /// For integers, whether they are unsigned.
    pub(crate) unsigned: Option<bool>,
}

impl SqlType {
    const fn new(name: &'static str, xdbc: XdbcDataType) -> Self {
        Self {
            name,
            xdbc,
            precision: 0,
            scale: 0,
            radix: None,
            case_sensitive: false,
            quoted: false,
            unsigned: None,
        }
    }

    const fn integer(name: &'static str, xdbc: XdbcDataType, digits: i32, unsigned: bool) -> Self {
        Self {
            precision: digits,
            radix: Some(10),
            unsigned: Some(unsigned),
            ..Self::new(name, xdbc)
        }
    }

    const fn float(name: &'static str, xdbc: XdbcDataType, bits: i32) -> Self {
        Self {
            precision: bits,
            radix: Some(2),
            ..Self::new(name, xdbc)
        }
    }

    const fn quoted(name: &'static str, xdbc: XdbcDataType, precision: i32, scale: i32) -> Self {
        Self {
            precision,
            scale,
            quoted: true,
            ..Self::new(name, xdbc)
        }
    }
}

/// The SQL type of `data_type` (see the module docs).
pub(crate) fn sql_type(data_type: &DataType) -> SqlType {
    use XdbcDataType as X;
    match data_type {
        DataType::Boolean => SqlType {
            precision: 1,
            ..SqlType::new("BOOLEAN", X::XdbcBit)
        },
        DataType::Int8 => SqlType::integer("TINYINT", X::XdbcTinyint, 3, false),
        DataType::Int16 => SqlType::integer("SMALLINT", X::XdbcSmallint, 5, false),
        DataType::Int32 => SqlType::integer("INT", X::XdbcInteger, 10, false),
        DataType::Int64 => SqlType::integer("BIGINT", X::XdbcBigint, 19, false),
        DataType::UInt8 => SqlType::integer("TINYINT UNSIGNED", X::XdbcTinyint, 3, true),
        DataType::UInt16 => SqlType::integer("SMALLINT UNSIGNED", X::XdbcSmallint, 5, true),
        DataType::UInt32 => SqlType::integer("INT UNSIGNED", X::XdbcInteger, 10, true),
        DataType::UInt64 => SqlType::integer("BIGINT UNSIGNED", X::XdbcBigint, 20, true),
        DataType::Float16 => SqlType::float("REAL", X::XdbcReal, 11),
        DataType::Float32 => SqlType::float("REAL", X::XdbcReal, 24),
        DataType::Float64 => SqlType::float("DOUBLE", X::XdbcDouble, 53),
        DataType::Decimal32(precision, scale)
        | DataType::Decimal64(precision, scale)
        | DataType::Decimal128(precision, scale)
        | DataType::Decimal256(precision, scale) => SqlType {
            precision: i32::from(*precision),
            scale: i32::from(*scale),
            radix: Some(10),
            unsigned: Some(false),
            ..SqlType::new("DECIMAL", X::XdbcDecimal)
        },
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => SqlType {
            case_sensitive: true,
            ..SqlType::quoted("VARCHAR", X::XdbcVarchar, UNBOUNDED, 0)
        },
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
            SqlType::quoted("BYTEA", X::XdbcVarbinary, UNBOUNDED, 0)
        }
        DataType::FixedSizeBinary(bytes) => SqlType::quoted("BYTEA", X::XdbcBinary, *bytes, 0),
        DataType::Date32 | DataType::Date64 => SqlType::quoted("DATE", X::XdbcDate, 10, 0),
        DataType::Time32(unit) | DataType::Time64(unit) => {
            let (fraction, digits) = fraction(*unit);
            SqlType::quoted("TIME", X::XdbcTime, 8 + fraction, digits)
        }
        DataType::Timestamp(unit, zone) => {
            let (fraction, digits) = fraction(*unit);
            match zone {
                None => SqlType::quoted("TIMESTAMP", X::XdbcTimestamp, 19 + fraction, digits),
                Some(_) => SqlType::quoted(
                    "TIMESTAMP WITH TIME ZONE",
                    X::XdbcTimestamp,
                    25 + fraction,
                    digits,
                ),
            }
        }
        DataType::Interval(_) | DataType::Duration(_) => SqlType::new("INTERVAL", X::XdbcInterval),
        DataType::List(_)
        | DataType::LargeList(_)
        | DataType::FixedSizeList(..)
        | DataType::ListView(_)
        | DataType::LargeListView(_) => SqlType::new("ARRAY", X::XdbcVarbinary),
        DataType::Struct(_) => SqlType::new("STRUCT", X::XdbcVarbinary),
        DataType::Map(..) => SqlType::new("MAP", X::XdbcVarbinary),
        DataType::Union(..) => SqlType::new("UNION", X::XdbcVarbinary),
        DataType::Dictionary(_, values) => sql_type(values),
        DataType::RunEndEncoded(_, values) => sql_type(values.data_type()),
        DataType::Null => SqlType::new("NULL", X::XdbcUnknownType),
    }
}

/// The characters a time's fraction of a second takes (its point included) and its
/// digits, at `unit`.
fn fraction(unit: TimeUnit) -> (i32, i32) {
    match unit {
        TimeUnit::Second => (0, 0),
        TimeUnit::Millisecond => (4, 3),
        TimeUnit::Microsecond => (7, 6),
        TimeUnit::Nanosecond => (10, 9),
    }
}

/// The Arrow types of the SQL types a table can be created with, each at its largest
/// size: what `GetXdbcTypeInfo` lists.
fn table_types() -> [DataType; 18] {
    let utc = Some("+00:00".into());
    [
        DataType::Boolean,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::UInt8,
        DataType::UInt16,
        DataType::UInt32,
        DataType::UInt64,
        DataType::Float32,
        DataType::Float64,
        DataType::Decimal128(38, 0),
        DataType::Utf8,
        DataType::Binary,
        DataType::Date32,
        DataType::Time64(TimeUnit::Nanosecond),
        DataType::Timestamp(TimeUnit::Nanosecond, None),
        DataType::Timestamp(TimeUnit::Nanosecond, utc),
    ]
}

/// The SQL types a table can be created with, for `GetXdbcTypeInfo`, named and sized as
/// [`sql_type`] describes columns.
///
/// # Errors
/// The builder refuses an entry (a bug).
pub(crate) fn xdbc_types() -> Result<XdbcTypeInfoData, FlightError> {
    let mut builder = XdbcTypeInfoDataBuilder::new();
    for data_type in table_types() {
        let sql = sql_type(&data_type);
        let quote = sql.quoted.then(|| "'".to_string());
        let decimal = matches!(data_type, DataType::Decimal128(..));
        let fraction = matches!(data_type, DataType::Time64(_) | DataType::Timestamp(..));
        builder.append(XdbcTypeInfo {
            type_name: sql.name.into(),
            data_type: sql.xdbc,
            column_size: Some(sql.precision),
            literal_prefix: quote.clone(),
            literal_suffix: quote,
            create_params: decimal.then(|| vec!["precision".to_string(), "scale".to_string()]),
            nullable: Nullable::NullabilityNullable,
            case_sensitive: sql.case_sensitive,
            searchable: Searchable::Full,
            unsigned_attribute: sql.unsigned,
            fixed_prec_scale: false,
            auto_increment: sql.radix.map(|_| false),
            local_type_name: Some(sql.name.into()),
            minimum_scale: (decimal || fraction).then_some(0),
            maximum_scale: match (decimal, fraction) {
                (true, _) => Some(sql.precision),
                (false, true) => Some(sql.scale),
                (false, false) => None,
            },
            sql_data_type: sql.xdbc,
            datetime_subcode: None,
            num_prec_radix: sql.radix,
            interval_precision: None,
        });
    }
    builder.build()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::AsArray;
    use arrow::datatypes::{Field, Int32Type};

    use super::*;

    #[test]
    fn numbers_are_sized_in_digits() {
        let int = sql_type(&DataType::Int64);
        assert_eq!((int.name, int.precision, int.scale), ("BIGINT", 19, 0));
        assert_eq!(int.radix, Some(10));
        let unsigned = sql_type(&DataType::UInt64);
        assert_eq!((unsigned.name, unsigned.precision), ("BIGINT UNSIGNED", 20));
        assert_eq!(unsigned.unsigned, Some(true));
        let decimal = sql_type(&DataType::Decimal128(12, 3));
        assert_eq!(
            (decimal.name, decimal.precision, decimal.scale),
            ("DECIMAL", 12, 3)
        );
        let double = sql_type(&DataType::Float64);
        assert_eq!(
            (double.name, double.precision, double.radix),
            ("DOUBLE", 53, Some(2))
        );
        assert_eq!(sql_type(&DataType::Float32).name, "REAL");
    }

    #[test]
    fn strings_are_unbounded_and_case_sensitive_whatever_their_layout() {
        for data_type in [DataType::Utf8, DataType::LargeUtf8, DataType::Utf8View] {
            let text = sql_type(&data_type);
            assert_eq!(text.name, "VARCHAR");
            assert_eq!(text.precision, i32::MAX);
            assert!(text.case_sensitive && text.quoted);
        }
        assert!(!sql_type(&DataType::Binary).case_sensitive);
        assert_eq!(sql_type(&DataType::FixedSizeBinary(16)).precision, 16);
    }

    #[test]
    fn dates_and_times_count_the_characters_of_their_literals() {
        let date = sql_type(&DataType::Date32);
        assert_eq!((date.name, date.precision), ("DATE", 10));
        // 2024-01-02 03:04:05.123456
        let micros = sql_type(&DataType::Timestamp(TimeUnit::Microsecond, None));
        assert_eq!(
            (micros.name, micros.precision, micros.scale),
            ("TIMESTAMP", 26, 6)
        );
        // 2024-01-02 03:04:05.123+00:00
        let zoned = sql_type(&DataType::Timestamp(
            TimeUnit::Millisecond,
            Some("UTC".into()),
        ));
        assert_eq!(
            (zoned.name, zoned.precision, zoned.scale),
            ("TIMESTAMP WITH TIME ZONE", 29, 3)
        );
        // 03:04:05
        let time = sql_type(&DataType::Time32(TimeUnit::Second));
        assert_eq!((time.name, time.precision, time.scale), ("TIME", 8, 0));
    }

    #[test]
    fn encodings_are_described_by_their_values_and_nesting_by_its_kind() {
        let dictionary = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        assert_eq!(sql_type(&dictionary).name, "VARCHAR");
        let run_ends = DataType::RunEndEncoded(
            Arc::new(Field::new("run_ends", DataType::Int32, false)),
            Arc::new(Field::new("values", DataType::Int64, true)),
        );
        assert_eq!(sql_type(&run_ends).name, "BIGINT");
        let list = DataType::List(Arc::new(Field::new("item", DataType::Int32, true)));
        assert_eq!(
            (sql_type(&list).name, sql_type(&list).precision),
            ("ARRAY", 0)
        );
        assert_eq!(sql_type(&DataType::Null).name, "NULL");
    }

    #[test]
    fn every_type_a_table_takes_is_listed_once_under_the_name_its_columns_carry() {
        let listed = xdbc_types().unwrap().record_batch(None).unwrap();
        let names: Vec<&str> = listed
            .column(0)
            .as_string::<i32>()
            .iter()
            .flatten()
            .collect();
        let expected: Vec<&str> = table_types().iter().map(|t| sql_type(t).name).collect();
        let mut sorted = expected.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            expected.len(),
            "one name per type: {expected:?}"
        );
        for name in expected {
            assert!(names.contains(&name), "{name} missing from {names:?}");
        }
        // The column size is the type's largest: a DECIMAL of 38 digits.
        let decimal = names.iter().position(|n| *n == "DECIMAL").unwrap();
        let sizes = listed.column(2).as_primitive::<Int32Type>();
        assert_eq!(sizes.value(decimal), 38);
    }
}
