//! The metadata calls clients make on connect and browse with: catalogs, databases
//! (Flight SQL's "db schemas"), tables with their Arrow schemas, table types, primary
//! keys, foreign keys (mink has none) and the SQL types (XDBC type info).
//!
//! Everything is read from a fresh [`MinkSession`]'s catalog, so the answers list the
//! tables as they are now, including the `system` tables and DataFusion's
//! `information_schema`. Filtering by catalog, pattern and table type is done by
//! arrow-flight's builders, which implement the spec's `%` / `_` patterns.

use std::sync::{Arc, LazyLock};

use arrow::array::{Int32Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow_flight::error::FlightError;
use arrow_flight::sql::metadata::{XdbcTypeInfo, XdbcTypeInfoData, XdbcTypeInfoDataBuilder};
use arrow_flight::sql::{
    CommandGetCatalogs, CommandGetDbSchemas, CommandGetPrimaryKeys, CommandGetTableTypes,
    CommandGetTables, Nullable, Searchable, XdbcDataType,
};
use mink_client::MinkClient;
use mink_core::table::TablePath;
use mink_sql::{CATALOG_NAME, DEFAULT_DATABASE};
use tonic::Status;

use crate::error::{arrow_status, client_status, status};
use mink_sql::session::MinkSession;

/// The type of a user table.
const TABLE: &str = "TABLE";
/// The type of `system.*` and `information_schema.*`.
const SYSTEM_TABLE: &str = "SYSTEM TABLE";
/// Databases whose tables are [`SYSTEM_TABLE`]s.
const SYSTEM_DATABASES: [&str; 2] = ["system", "information_schema"];

/// `GetCatalogs`: mink's one catalog.
pub(crate) fn catalogs(session: &MinkSession) -> Result<RecordBatch, Status> {
    let mut builder = CommandGetCatalogs {}.into_builder();
    for catalog in session.context().catalog_names() {
        builder.append(catalog);
    }
    Ok(builder.build()?)
}

/// `GetDbSchemas`: the databases, `system` and `information_schema`.
pub(crate) fn db_schemas(
    session: &MinkSession,
    command: CommandGetDbSchemas,
) -> Result<RecordBatch, Status> {
    let mut builder = command.into_builder();
    for (catalog, database) in databases(session) {
        builder.append(&catalog, &database);
    }
    Ok(builder.build()?)
}

/// `GetTables`, with each table's Arrow schema when the command asks for it.
pub(crate) async fn tables(
    session: &MinkSession,
    command: CommandGetTables,
) -> Result<RecordBatch, Status> {
    let include_schema = command.include_schema;
    let mut builder = command.into_builder();
    let context = session.context();
    for (catalog_name, database) in databases(session) {
        let Some(schema) = context
            .catalog(&catalog_name)
            .and_then(|catalog| catalog.schema(&database))
        else {
            continue;
        };
        for table in schema.table_names() {
            // A table's schema costs a call to the node: only when asked for.
            let provider = match include_schema {
                true => schema.table(&table).await.map_err(status)?,
                false => None,
            };
            let table_schema = provider.map_or_else(|| Arc::new(Schema::empty()), |p| p.schema());
            builder.append(
                &catalog_name,
                &database,
                &table,
                table_type(&database),
                &table_schema,
            )?;
        }
    }
    Ok(builder.build()?)
}

/// `GetTableTypes`.
pub(crate) fn table_types() -> Result<RecordBatch, Status> {
    let mut builder = CommandGetTableTypes {}.into_builder();
    builder.append(TABLE);
    builder.append(SYSTEM_TABLE);
    Ok(builder.build()?)
}

/// The schema of `GetPrimaryKeys` answers.
pub(crate) fn primary_keys_schema() -> SchemaRef {
    static SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
        Arc::new(Schema::new(vec![
            Field::new("catalog_name", DataType::Utf8, true),
            Field::new("db_schema_name", DataType::Utf8, true),
            Field::new("table_name", DataType::Utf8, false),
            Field::new("column_name", DataType::Utf8, false),
            Field::new("key_name", DataType::Utf8, true),
            Field::new("key_sequence", DataType::Int32, false),
        ]))
    });
    Arc::clone(&SCHEMA)
}

/// `GetPrimaryKeys`: the primary-key columns of a mink table in key order (none for a
/// log table, a system table or another catalog).
pub(crate) async fn primary_keys(
    client: &MinkClient,
    command: CommandGetPrimaryKeys,
) -> Result<RecordBatch, Status> {
    let database = command.db_schema.as_deref().unwrap_or(DEFAULT_DATABASE);
    let other_catalog = command
        .catalog
        .as_deref()
        .is_some_and(|c| c != CATALOG_NAME);
    let columns = if other_catalog || SYSTEM_DATABASES.contains(&database) {
        Vec::new()
    } else {
        let path = TablePath::new(database, command.table.as_str());
        let table = client.describe_table(&path).await;
        table.map_err(client_status)?.primary_key
    };
    let rows = columns.len();
    let sequence = (1..).take(rows).collect::<Vec<i32>>();
    RecordBatch::try_new(
        primary_keys_schema(),
        vec![
            Arc::new(StringArray::from(vec![CATALOG_NAME; rows])),
            Arc::new(StringArray::from(vec![database; rows])),
            Arc::new(StringArray::from(vec![command.table.as_str(); rows])),
            Arc::new(StringArray::from(columns)),
            Arc::new(StringArray::from(vec![None::<&str>; rows])),
            Arc::new(Int32Array::from(sequence)),
        ],
    )
    .map_err(arrow_status)
}

/// The schema of `GetExportedKeys`, `GetImportedKeys` and `GetCrossReference` answers.
pub(crate) fn foreign_keys_schema() -> SchemaRef {
    static SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
        let text = |name: &str, nullable: bool| Field::new(name, DataType::Utf8, nullable);
        Arc::new(Schema::new(vec![
            text("pk_catalog_name", true),
            text("pk_db_schema_name", true),
            text("pk_table_name", false),
            text("pk_column_name", false),
            text("fk_catalog_name", true),
            text("fk_db_schema_name", true),
            text("fk_table_name", false),
            text("fk_column_name", false),
            Field::new("key_sequence", DataType::Int32, false),
            text("fk_key_name", true),
            text("pk_key_name", true),
            Field::new("update_rule", DataType::UInt8, false),
            Field::new("delete_rule", DataType::UInt8, false),
        ]))
    });
    Arc::clone(&SCHEMA)
}

/// The SQL types mink's tables store, for `GetXdbcTypeInfo`.
pub(crate) fn xdbc_types() -> Result<XdbcTypeInfoData, FlightError> {
    use XdbcDataType as X;
    let mut builder = XdbcTypeInfoDataBuilder::new();
    // (name, type, column size, quoted literal, number radix)
    let types = [
        ("BOOLEAN", X::XdbcBit, 1, false, None),
        ("TINYINT", X::XdbcTinyint, 3, false, Some(10)),
        ("SMALLINT", X::XdbcSmallint, 5, false, Some(10)),
        ("INT", X::XdbcInteger, 10, false, Some(10)),
        ("BIGINT", X::XdbcBigint, 19, false, Some(10)),
        ("FLOAT", X::XdbcFloat, 24, false, Some(2)),
        ("DOUBLE", X::XdbcDouble, 53, false, Some(2)),
        ("DECIMAL", X::XdbcDecimal, 38, false, Some(10)),
        ("VARCHAR", X::XdbcVarchar, i32::MAX, true, None),
        ("BYTEA", X::XdbcVarbinary, i32::MAX, true, None),
        ("DATE", X::XdbcDate, 10, true, None),
        ("TIME", X::XdbcTime, 15, true, None),
        ("TIMESTAMP", X::XdbcTimestamp, 26, true, None),
    ];
    for (name, data_type, column_size, quoted, radix) in types {
        let quote = quoted.then(|| "'".to_string());
        builder.append(XdbcTypeInfo {
            type_name: name.into(),
            data_type,
            column_size: Some(column_size),
            literal_prefix: quote.clone(),
            literal_suffix: quote,
            create_params: (name == "DECIMAL")
                .then(|| vec!["precision".to_string(), "scale".to_string()]),
            nullable: Nullable::NullabilityNullable,
            case_sensitive: quoted,
            searchable: Searchable::Full,
            unsigned_attribute: radix.map(|_| false),
            fixed_prec_scale: name == "DECIMAL",
            auto_increment: radix.map(|_| false),
            local_type_name: Some(name.into()),
            minimum_scale: None,
            maximum_scale: None,
            sql_data_type: data_type,
            datetime_subcode: None,
            num_prec_radix: radix,
            interval_precision: None,
        });
    }
    builder.build()
}

/// Every `(catalog, database)` of the session.
fn databases(session: &MinkSession) -> Vec<(String, String)> {
    let context = session.context();
    let mut databases = Vec::new();
    for catalog_name in context.catalog_names() {
        if let Some(catalog) = context.catalog(&catalog_name) {
            let mut names = catalog.schema_names();
            names.sort();
            databases.extend(names.into_iter().map(|name| (catalog_name.clone(), name)));
        }
    }
    databases
}

fn table_type(database: &str) -> &'static str {
    if SYSTEM_DATABASES.contains(&database) {
        SYSTEM_TABLE
    } else {
        TABLE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_databases_hold_system_tables() {
        assert_eq!(table_type("system"), SYSTEM_TABLE);
        assert_eq!(table_type("information_schema"), SYSTEM_TABLE);
        assert_eq!(table_type("default"), TABLE);
    }

    #[test]
    fn every_stored_type_is_described() {
        let types = xdbc_types().unwrap().record_batch(None).unwrap();
        assert_eq!(types.num_rows(), 13);
    }
}
