//! The metadata calls clients make on connect and browse with: catalogs, databases
//! (Flight SQL's "db schemas"), tables with their Arrow schemas, table types, primary
//! keys, foreign keys (mink has none) and the SQL types (XDBC type info, see
//! [`sql_types`](super::sql_types)).
//!
//! Everything is read from a fresh [`MinkSession`]'s catalog, so the answers list the
//! tables as they are now, and agree with what SQL shows of the same catalog:
//!
//! | Flight SQL       | lists                                                      | as SQL shows it |
//! |------------------|------------------------------------------------------------|-----------------|
//! | `GetDbSchemas`   | `default` (always), every database holding a table, `system`, `information_schema` | `information_schema.schemata` (which, as DataFusion's, leaves `information_schema` itself out) |
//! | `GetTables`      | every table of those, typed `TABLE` (mink's tables) or `VIEW` (`system.*`, `information_schema.*`) | `SHOW TABLES` (`information_schema.tables`), `BASE TABLE` or `VIEW` |
//! | `GetTableTypes`  | `TABLE`, `VIEW`                                            |                 |
//!
//! A table's type is its provider's, the same `SHOW TABLES` reads, under the name JDBC
//! uses for it. A table's schema (`include_schema`) carries the Flight SQL column
//! metadata of each column ([`columns`](super::columns)). Filtering by catalog, pattern
//! and table type is done by arrow-flight's builders, which implement the spec's `%` /
//! `_` patterns; `GetTables` applies them before it loads a schema, which costs a call
//! to the node.

use std::sync::{Arc, LazyLock};

use arrow::array::{BooleanArray, Scalar};
use arrow::array::{Int32Array, RecordBatch, StringArray};
use arrow::compute::kernels::comparison::like;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow_flight::sql::{
    CommandGetCatalogs, CommandGetDbSchemas, CommandGetPrimaryKeys, CommandGetTableTypes,
    CommandGetTables,
};
use datafusion::catalog::information_schema::INFORMATION_SCHEMA;
use datafusion::catalog::{SchemaProvider, TableProvider};
use datafusion::common::TableReference;
use datafusion::datasource::TableType;
use datafusion::execution::SessionState;
use mink_client::MinkClient;
use mink_core::table::TablePath;
use mink_sql::{CATALOG_NAME, DEFAULT_DATABASE};
use tonic::Status;

use crate::columns::{ColumnOrigin, READ_ONLY_DATABASES, wire_schema};
use crate::error::{arrow_status, client_status, status};
use mink_sql::session::MinkSession;

/// The type of a mink table (SQL's `BASE TABLE`).
const TABLE: &str = "TABLE";
/// The type of the tables of `system` and `information_schema`.
const VIEW: &str = "VIEW";
/// The type of a session's temporary table (none is listed: a session lasts one call).
const LOCAL_TEMPORARY: &str = "LOCAL TEMPORARY";

/// `GetCatalogs`: mink's one catalog.
pub(crate) fn catalogs(session: &MinkSession) -> Result<RecordBatch, Status> {
    let mut builder = CommandGetCatalogs {}.into_builder();
    for catalog in session.context().catalog_names() {
        builder.append(catalog);
    }
    Ok(builder.build()?)
}

/// `GetDbSchemas`: the databases (see the module docs).
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

/// `GetTables`, with each table's Arrow schema and its columns' metadata when the
/// command asks for it.
pub(crate) async fn tables(
    session: &MinkSession,
    command: CommandGetTables,
) -> Result<RecordBatch, Status> {
    let state = session.context().state();
    let wanted = Wanted::of(&command);
    let include_schema = command.include_schema;
    let mut builder = command.into_builder();
    for (catalog, database) in databases(session) {
        let Some(schema) = schema_provider(&state, &catalog, &database) else {
            continue;
        };
        let mut names = schema.table_names();
        names.sort();
        for table in names {
            let Some(table_type) = schema.table_type(&table).await.map_err(status)? else {
                continue;
            };
            let table_type = flight_table_type(table_type);
            if !wanted.matches(&catalog, &database, &table, table_type)? {
                continue;
            }
            // A table's schema costs a call to the node: only when asked for.
            let table_schema = match include_schema {
                true => {
                    let provider = schema.table(&table).await.map_err(status)?;
                    provider.map_or_else(Schema::empty, |provider| {
                        column_schema(provider.as_ref(), &catalog, &database, &table)
                    })
                }
                false => Schema::empty(),
            };
            builder.append(&catalog, &database, &table, table_type, &table_schema)?;
        }
    }
    Ok(builder.build()?)
}

/// `GetTableTypes`: the types [`tables`] gives.
pub(crate) fn table_types() -> Result<RecordBatch, Status> {
    let mut builder = CommandGetTableTypes {}.into_builder();
    builder.append(TABLE);
    builder.append(VIEW);
    Ok(builder.build()?)
}

/// The name Flight SQL (and JDBC) give a table of type `table_type`.
fn flight_table_type(table_type: TableType) -> &'static str {
    match table_type {
        TableType::Base => TABLE,
        TableType::View => VIEW,
        TableType::Temporary => LOCAL_TEMPORARY,
    }
}

/// A table's schema as `GetTables` answers it: each column with its Flight SQL metadata.
fn column_schema(table: &dyn TableProvider, catalog: &str, database: &str, name: &str) -> Schema {
    let schema = table.schema();
    let origin = ColumnOrigin::new(catalog, database, name);
    let origins = vec![Some(origin); schema.fields().len()];
    wire_schema(&schema, &origins)
}

/// The filters of a `GetTables` command, applied before a table's schema is loaded
/// (arrow-flight's builder applies them again, to the same effect).
struct Wanted {
    catalog: Option<String>,
    database: Option<String>,
    table: Option<String>,
    types: Vec<String>,
}

impl Wanted {
    fn of(command: &CommandGetTables) -> Self {
        Self {
            catalog: command.catalog.clone(),
            database: command.db_schema_filter_pattern.clone(),
            table: command.table_name_filter_pattern.clone(),
            types: command.table_types.clone(),
        }
    }

    /// Whether a table passes the filters: the catalog named exactly, the database and
    /// table names matching their `LIKE` patterns, its type one of those asked for.
    fn matches(
        &self,
        catalog: &str,
        database: &str,
        table: &str,
        table_type: &str,
    ) -> Result<bool, Status> {
        let like_pattern = |pattern: &Option<String>, name: &str| -> Result<bool, Status> {
            let Some(pattern) = pattern else {
                return Ok(true);
            };
            let name = StringArray::from(vec![name]);
            let pattern = Scalar::new(StringArray::from(vec![pattern.as_str()]));
            let matched: BooleanArray = like(&name, &pattern).map_err(arrow_status)?;
            Ok(matched.value(0))
        };
        Ok(self.catalog.as_deref().is_none_or(|c| c == catalog)
            && (self.types.is_empty() || self.types.iter().any(|t| t == table_type))
            && like_pattern(&self.database, database)?
            && like_pattern(&self.table, table)?)
    }
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
    let columns = if other_catalog || READ_ONLY_DATABASES.contains(&database) {
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

/// Every `(catalog, database)` of the session: its catalogs' databases and
/// `information_schema`, which DataFusion serves in every catalog, sorted.
fn databases(session: &MinkSession) -> Vec<(String, String)> {
    let context = session.context();
    let information_schema = context.state().config().information_schema();
    let mut databases = Vec::new();
    for catalog_name in context.catalog_names() {
        if let Some(catalog) = context.catalog(&catalog_name) {
            let mut names = catalog.schema_names();
            if information_schema && !names.iter().any(|n| n == INFORMATION_SCHEMA) {
                names.push(INFORMATION_SCHEMA.to_string());
            }
            names.sort();
            databases.extend(names.into_iter().map(|name| (catalog_name.clone(), name)));
        }
    }
    databases
}

/// The provider of a database, `information_schema` included.
fn schema_provider(
    state: &SessionState,
    catalog: &str,
    database: &str,
) -> Option<Arc<dyn SchemaProvider>> {
    state
        .schema_for_ref(TableReference::full(catalog, database, ""))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_types_are_named_as_jdbc_names_them() {
        assert_eq!(flight_table_type(TableType::Base), TABLE);
        assert_eq!(flight_table_type(TableType::View), VIEW);
        assert_eq!(flight_table_type(TableType::Temporary), LOCAL_TEMPORARY);
        let listed = table_types().unwrap();
        assert_eq!(listed.num_rows(), 2);
    }

    #[test]
    fn tables_are_filtered_by_catalog_patterns_and_types() {
        let command = CommandGetTables {
            catalog: Some("mink".into()),
            db_schema_filter_pattern: Some("de%".into()),
            table_name_filter_pattern: Some("ev_nts".into()),
            table_types: vec![TABLE.into()],
            include_schema: true,
        };
        let wanted = Wanted::of(&command);
        assert!(wanted.matches("mink", "demo", "events", TABLE).unwrap());
        assert!(!wanted.matches("other", "demo", "events", TABLE).unwrap());
        assert!(!wanted.matches("mink", "system", "events", TABLE).unwrap());
        assert!(!wanted.matches("mink", "demo", "accounts", TABLE).unwrap());
        assert!(!wanted.matches("mink", "demo", "events", VIEW).unwrap());
        let everything = Wanted::of(&CommandGetTables::default());
        assert!(
            everything
                .matches("mink", "system", "buckets", VIEW)
                .unwrap()
        );
    }

    #[test]
    fn a_table_schema_carries_its_columns_metadata() {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let table = datafusion::datasource::MemTable::try_new(schema, vec![vec![]]).unwrap();
        let described = column_schema(&table, "mink", "demo", "events");
        let id = described.field(0);
        assert!(!id.is_nullable());
        assert_eq!(id.metadata()[crate::columns::TABLE_NAME], "events");
        assert_eq!(id.metadata()[crate::columns::TYPE_NAME], "BIGINT");
        assert_eq!(id.metadata()[crate::columns::IS_READ_ONLY], "0");
    }
}
