//! What a client learns about each column it is sent: the Flight SQL column metadata,
//! and the Arrow type the column travels in.
//!
//! Every column of a table's schema (`GetTables` with `include_schema`) and of a
//! statement's result (the FlightInfo, `GetSchema`, a prepared statement's dataset
//! schema and the `DoGet` stream) carries the keys Flight SQL defines in each field's
//! metadata, which the JDBC driver turns into `ResultSetMetaData` and `getColumns`, and
//! ADBC into `get_objects`' `xdbc_*` columns:
//!
//! | key                                   | value                                                        |
//! |---------------------------------------|--------------------------------------------------------------|
//! | `ARROW:FLIGHT:SQL:CATALOG_NAME`       | the catalog of the table the column reads, `""` if computed  |
//! | `ARROW:FLIGHT:SQL:DB_SCHEMA_NAME`     | its database, `""` if computed                               |
//! | `ARROW:FLIGHT:SQL:SCHEMA_NAME`        | the same: the key Flight SQL's Java (JDBC), C++ and Go (ADBC) libraries read |
//! | `ARROW:FLIGHT:SQL:TABLE_NAME`         | its table, `""` if computed                                  |
//! | `ARROW:FLIGHT:SQL:TYPE_NAME`          | the SQL type's name ([`sql_type`]): `BIGINT`, `VARCHAR`, ... |
//! | `ARROW:FLIGHT:SQL:PRECISION`          | its precision (JDBC's column size), `0` where none applies   |
//! | `ARROW:FLIGHT:SQL:SCALE`              | its scale, `0` where none applies                            |
//! | `ARROW:FLIGHT:SQL:IS_AUTO_INCREMENT`  | `0`: mink has no auto-increment                              |
//! | `ARROW:FLIGHT:SQL:IS_CASE_SENSITIVE`  | `1` for strings                                              |
//! | `ARROW:FLIGHT:SQL:IS_READ_ONLY`       | `0` for a column of a mink table (`INSERT`, `UPDATE` write it), `1` for `system`, `information_schema`, `t$lake`, `t$changelog` and computed columns |
//! | `ARROW:FLIGHT:SQL:IS_SEARCHABLE`      | `1`: any column can be filtered on                           |
//!
//! `FlightSql.proto` names the database key `DB_SCHEMA_NAME`; the libraries clients are
//! built on read and write `SCHEMA_NAME`, so both are sent. Booleans are `"1"` or
//! `"0"`, as those libraries write them.
//! Whether a column may hold nulls is the field's own nullability.
//!
//! **Types.** A column reaches the client in the type its table declares, and a
//! computed one in the same family: DataFusion computes some strings as `Utf8View` and
//! bytes as `BinaryView` (`substr`, `arrow_cast`, ...), which many clients do not map
//! (SQLAlchemy dialects take `string_view` for a BLOB). [`wire_type`] turns views into
//! `Utf8` and `Binary`, nested ones included, and [`to_wire`] casts a batch's view
//! columns; columns of other types pass untouched, so a table read costs nothing. The
//! cast copies a view column's bytes once, the copy its IPC encoding would make anyway.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::compute::{can_cast_types, cast};
use arrow::datatypes::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};
use arrow::error::ArrowError;
use datafusion::catalog::information_schema::INFORMATION_SCHEMA;
use mink_sql::ReadKind;
use mink_sql::system::SYSTEM_SCHEMA;

use crate::sql_types::sql_type;

/// The column metadata keys Flight SQL defines (`FlightSql.proto`, `GetTables`).
pub(crate) const CATALOG_NAME: &str = "ARROW:FLIGHT:SQL:CATALOG_NAME";
pub(crate) const DB_SCHEMA_NAME: &str = "ARROW:FLIGHT:SQL:DB_SCHEMA_NAME";
/// [`DB_SCHEMA_NAME`] as the JDBC driver and ADBC's driver read it.
pub(crate) const SCHEMA_NAME: &str = "ARROW:FLIGHT:SQL:SCHEMA_NAME";
pub(crate) const TABLE_NAME: &str = "ARROW:FLIGHT:SQL:TABLE_NAME";
pub(crate) const TYPE_NAME: &str = "ARROW:FLIGHT:SQL:TYPE_NAME";
pub(crate) const PRECISION: &str = "ARROW:FLIGHT:SQL:PRECISION";
pub(crate) const SCALE: &str = "ARROW:FLIGHT:SQL:SCALE";
pub(crate) const IS_AUTO_INCREMENT: &str = "ARROW:FLIGHT:SQL:IS_AUTO_INCREMENT";
pub(crate) const IS_CASE_SENSITIVE: &str = "ARROW:FLIGHT:SQL:IS_CASE_SENSITIVE";
pub(crate) const IS_READ_ONLY: &str = "ARROW:FLIGHT:SQL:IS_READ_ONLY";
pub(crate) const IS_SEARCHABLE: &str = "ARROW:FLIGHT:SQL:IS_SEARCHABLE";

/// The databases whose tables statements cannot write: the node's state and
/// DataFusion's views of the catalog.
pub(crate) const READ_ONLY_DATABASES: [&str; 2] = [SYSTEM_SCHEMA, INFORMATION_SCHEMA];

/// The table a column reads its values from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ColumnOrigin {
    pub(crate) catalog: String,
    pub(crate) database: String,
    pub(crate) table: String,
    /// Whether statements can write the column (a mink table's, read as itself).
    pub(crate) writable: bool,
}

impl ColumnOrigin {
    /// A column of `catalog.database.table`: writable when it is a mink table read as
    /// itself (not `t$lake` or `t$changelog`), outside [`READ_ONLY_DATABASES`].
    pub(crate) fn new(catalog: &str, database: &str, table: &str) -> Self {
        let writable = catalog == mink_sql::CATALOG_NAME
            && !READ_ONLY_DATABASES.contains(&database)
            && matches!(ReadKind::of_name(table), Some((_, ReadKind::Union)));
        Self {
            catalog: catalog.to_string(),
            database: database.to_string(),
            table: table.to_string(),
            writable,
        }
    }
}

/// `field` as it travels to the client: of its [`wire_type`], with the Flight SQL column
/// metadata of a column read from `origin` (`None`: computed) added to its own.
pub(crate) fn wire_field(field: &Field, origin: Option<&ColumnOrigin>) -> Field {
    let data_type = wire_type(field.data_type());
    let sql = sql_type(&data_type);
    let flag = |set: bool| if set { "1" } else { "0" }.to_string();
    let name = |part: fn(&ColumnOrigin) -> &str| origin.map(part).unwrap_or_default().to_string();
    let mut metadata = field.metadata().clone();
    metadata.extend(HashMap::from([
        (CATALOG_NAME.to_string(), name(|o| &o.catalog)),
        (DB_SCHEMA_NAME.to_string(), name(|o| &o.database)),
        (SCHEMA_NAME.to_string(), name(|o| &o.database)),
        (TABLE_NAME.to_string(), name(|o| &o.table)),
        (TYPE_NAME.to_string(), sql.name.to_string()),
        (PRECISION.to_string(), sql.precision.to_string()),
        (SCALE.to_string(), sql.scale.to_string()),
        (IS_AUTO_INCREMENT.to_string(), flag(false)),
        (IS_CASE_SENSITIVE.to_string(), flag(sql.case_sensitive)),
        (
            IS_READ_ONLY.to_string(),
            flag(!origin.is_some_and(|o| o.writable)),
        ),
        (IS_SEARCHABLE.to_string(), flag(true)),
    ]));
    field
        .clone()
        .with_data_type(data_type)
        .with_metadata(metadata)
}

/// `schema` as it travels to the client: each field a [`wire_field`] of the origin at
/// its position in `origins` (a field past its end is computed).
pub(crate) fn wire_schema(schema: &Schema, origins: &[Option<ColumnOrigin>]) -> Schema {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, field)| wire_field(field, origins.get(i).and_then(Option::as_ref)))
        .collect();
    Schema::new_with_metadata(fields, schema.metadata().clone())
}

/// The type a column of `data_type` travels in: `Utf8View` as `Utf8`, `BinaryView` as
/// `Binary`, in lists, structs, maps and dictionaries too; any other type as itself.
/// A view nested where Arrow cannot cast it away stays a view.
pub(crate) fn wire_type(data_type: &DataType) -> DataType {
    let wire = without_views(data_type);
    match wire != *data_type && can_cast_types(data_type, &wire) {
        true => wire,
        false => data_type.clone(),
    }
}

fn without_views(data_type: &DataType) -> DataType {
    let field = |field: &FieldRef| -> FieldRef {
        Arc::new(
            field
                .as_ref()
                .clone()
                .with_data_type(without_views(field.data_type())),
        )
    };
    match data_type {
        DataType::Utf8View => DataType::Utf8,
        DataType::BinaryView => DataType::Binary,
        DataType::List(item) => DataType::List(field(item)),
        DataType::LargeList(item) => DataType::LargeList(field(item)),
        DataType::FixedSizeList(item, size) => DataType::FixedSizeList(field(item), *size),
        DataType::Struct(fields) => DataType::Struct(fields.iter().map(field).collect::<Fields>()),
        DataType::Map(entries, sorted) => DataType::Map(field(entries), *sorted),
        DataType::Dictionary(key, values) => {
            DataType::Dictionary(key.clone(), Box::new(without_views(values)))
        }
        other => other.clone(),
    }
}

/// `batch` in `schema`, a [`wire_schema`] of its own: each column whose type differs
/// is cast to the schema's, the others are kept as they are.
///
/// # Errors
/// A column cannot be cast (a bug: [`wire_type`] only picks casts Arrow has), or holds
/// nulls where the schema says it cannot.
pub(crate) fn to_wire(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, ArrowError> {
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(
            |(column, field)| match column.data_type() == field.data_type() {
                true => Ok(Arc::clone(column)),
                false => cast(column, field.data_type()),
            },
        )
        .collect::<Result<Vec<ArrayRef>, _>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(Arc::clone(schema), columns, &options)
}

#[cfg(test)]
mod tests {
    use arrow::array::{
        Array, AsArray, BinaryViewArray, Int64Array, ListBuilder, StringViewArray,
        StringViewBuilder,
    };

    use super::*;

    fn events() -> ColumnOrigin {
        ColumnOrigin::new("mink", "demo", "events")
    }

    #[test]
    fn only_a_mink_table_read_as_itself_is_writable() {
        assert!(events().writable);
        for (catalog, database, table) in [
            ("mink", "demo", "events$lake"),
            ("mink", "demo", "events$changelog"),
            ("mink", "system", "buckets"),
            ("mink", "information_schema", "tables"),
            ("other", "demo", "events"),
        ] {
            let origin = ColumnOrigin::new(catalog, database, table);
            assert!(!origin.writable, "{catalog}.{database}.{table}");
        }
    }

    fn value<'a>(field: &'a Field, key: &str) -> &'a str {
        field
            .metadata()
            .get(key)
            .map_or("<missing>", String::as_str)
    }

    #[test]
    fn a_table_column_names_its_table_and_type() {
        let field = wire_field(&Field::new("kind", DataType::Utf8, true), Some(&events()));
        for (key, expected) in [
            (CATALOG_NAME, "mink"),
            (DB_SCHEMA_NAME, "demo"),
            (SCHEMA_NAME, "demo"),
            (TABLE_NAME, "events"),
            (TYPE_NAME, "VARCHAR"),
            (PRECISION, "2147483647"),
            (SCALE, "0"),
            (IS_AUTO_INCREMENT, "0"),
            (IS_CASE_SENSITIVE, "1"),
            (IS_READ_ONLY, "0"),
            (IS_SEARCHABLE, "1"),
        ] {
            assert_eq!(value(&field, key), expected, "{key}");
        }
        assert!(field.is_nullable());
    }

    #[test]
    fn a_computed_column_has_every_key_with_empty_names_and_is_read_only() {
        let decimal = Field::new("total", DataType::Decimal128(10, 2), false);
        let field = wire_field(&decimal, None);
        assert_eq!(field.metadata().len(), 11, "every key");
        for key in [CATALOG_NAME, DB_SCHEMA_NAME, SCHEMA_NAME, TABLE_NAME] {
            assert_eq!(value(&field, key), "", "{key}");
        }
        assert_eq!(value(&field, TYPE_NAME), "DECIMAL");
        assert_eq!(value(&field, PRECISION), "10");
        assert_eq!(value(&field, SCALE), "2");
        assert_eq!(value(&field, IS_CASE_SENSITIVE), "0");
        assert_eq!(value(&field, IS_READ_ONLY), "1");
        assert!(!field.is_nullable(), "nullability is the field's own");
    }

    #[test]
    fn a_system_column_is_read_only_and_own_metadata_stays() {
        let system = ColumnOrigin::new("mink", "system", "buckets");
        let own = Field::new("bucket", DataType::UInt32, false)
            .with_metadata(HashMap::from([("mine".to_string(), "kept".to_string())]));
        let field = wire_field(&own, Some(&system));
        assert_eq!(value(&field, IS_READ_ONLY), "1");
        assert_eq!(value(&field, TYPE_NAME), "INT UNSIGNED");
        assert_eq!(value(&field, "mine"), "kept");
    }

    #[test]
    fn views_travel_as_plain_strings_and_bytes_however_nested() {
        let item = |t: DataType| Arc::new(Field::new("item", t, true));
        for (view, plain) in [
            (DataType::Utf8View, DataType::Utf8),
            (DataType::BinaryView, DataType::Binary),
            (
                DataType::List(item(DataType::Utf8View)),
                DataType::List(item(DataType::Utf8)),
            ),
            (
                DataType::Struct(vec![Field::new("x", DataType::Utf8View, true)].into()),
                DataType::Struct(vec![Field::new("x", DataType::Utf8, true)].into()),
            ),
            (
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8View)),
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            ),
        ] {
            assert_eq!(wire_type(&view), plain, "{view}");
        }
        for kept in [DataType::Utf8, DataType::LargeUtf8, DataType::Int64] {
            assert_eq!(wire_type(&kept), kept);
        }
    }

    #[test]
    fn a_batch_is_cast_where_its_schema_says_and_kept_elsewhere() {
        let mut lists = ListBuilder::new(StringViewBuilder::new());
        lists.values().append_value("a");
        lists.append(true);
        lists.append(false);
        let batch = RecordBatch::try_from_iter(vec![
            ("id", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef),
            (
                "text",
                Arc::new(StringViewArray::from(vec![
                    Some("a long string, not inlined"),
                    None,
                ])),
            ),
            (
                "bytes",
                Arc::new(BinaryViewArray::from(vec![b"x".as_ref(), b"y"])),
            ),
            ("list", Arc::new(lists.finish())),
        ])
        .unwrap();
        let schema = Arc::new(wire_schema(&batch.schema(), &[]));
        let wire = to_wire(&batch, &schema).unwrap();
        assert_eq!(wire.schema(), schema);
        assert!(Arc::ptr_eq(wire.column(0), batch.column(0)), "untouched");
        let text = wire.column(1).as_string::<i32>();
        assert_eq!(text.value(0), "a long string, not inlined");
        assert!(text.is_null(1));
        assert_eq!(wire.column(2).as_binary::<i32>().value(1), b"y");
        let list = wire.column(3).as_list::<i32>();
        assert_eq!(list.value(0).as_string::<i32>().value(0), "a");
        assert!(list.is_null(1));
    }
}
