//! Flight SQL metadata as JDBC and ADBC clients read it, over the real endpoint:
//! the column metadata of table schemas and of results (on every path a result's schema
//! reaches a client), results in their declared types (no view types), databases, table
//! types and `SHOW TABLES` agreeing, and `GetSqlInfo` claims checked against what the
//! service does. Asserted with arrow-flight's Flight SQL client in process, and through
//! the ADBC Python driver against the real binary (`tests/python/flight_sql_metadata.py`).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema};
use arrow_flight::error::FlightError;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{
    CommandGetDbSchemas, CommandGetTables, CommandStatementQuery, ProstMessageExt, SqlInfo,
};
use arrow_flight::{Action, CancelFlightInfoRequest, FlightDescriptor, FlightInfo};
use futures::TryStreamExt;
use mink_flight_sql::{FlightSqlConfig, FlightSqlHandle, serve};
use mink_lake::storage::LakeStorage;
use object_store::local::LocalFileSystem;
use prost::Message;
use tokio::net::TcpListener;
use tonic::Code;
use tonic::transport::Channel;

use crate::process::ServerProcess;
use crate::python::python;
use crate::support::TestNode;

const ORDERS: &str = "CREATE TABLE shop.orders (id BIGINT NOT NULL, name VARCHAR, \
                      price DECIMAL(10, 2), at TIMESTAMP, day DATE, ok BOOLEAN, ratio REAL, \
                      PRIMARY KEY (id)) WITH ('bucket.num' = '2')";
const ONE_ORDER: &str = "INSERT INTO shop.orders VALUES \
                         (1, 'widget', 9.99, TIMESTAMP '2024-01-02 03:04:05', \
                         DATE '2024-01-02', true, 0.5)";

/// The keys every column carries: Flight SQL's (`FlightSql.proto`), and `SCHEMA_NAME`,
/// which its Java (JDBC), C++ and Go (ADBC) libraries read for the database.
const KEYS: [&str; 11] = [
    "ARROW:FLIGHT:SQL:CATALOG_NAME",
    "ARROW:FLIGHT:SQL:DB_SCHEMA_NAME",
    "ARROW:FLIGHT:SQL:SCHEMA_NAME",
    "ARROW:FLIGHT:SQL:TABLE_NAME",
    "ARROW:FLIGHT:SQL:TYPE_NAME",
    "ARROW:FLIGHT:SQL:PRECISION",
    "ARROW:FLIGHT:SQL:SCALE",
    "ARROW:FLIGHT:SQL:IS_AUTO_INCREMENT",
    "ARROW:FLIGHT:SQL:IS_CASE_SENSITIVE",
    "ARROW:FLIGHT:SQL:IS_READ_ONLY",
    "ARROW:FLIGHT:SQL:IS_SEARCHABLE",
];

/// A node, its Flight SQL endpoint, and a client of it.
struct Endpoint {
    _node: TestNode,
    _handle: FlightSqlHandle,
    client: FlightSqlServiceClient<Channel>,
}

impl Endpoint {
    async fn start() -> Self {
        let node = TestNode::start().await;
        let config = FlightSqlConfig {
            client: node.client.clone(),
            storage: LakeStorage::new(Arc::new(LocalFileSystem::new()), ""),
            credentials: None,
            tls: None,
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let handle = serve(config, listener).expect("serve");
        let channel = Channel::from_shared(format!("http://{}", handle.addr()))
            .expect("uri")
            .connect()
            .await
            .expect("connect");
        Self {
            _node: node,
            _handle: handle,
            client: FlightSqlServiceClient::new(channel),
        }
    }

    /// The schema `info` announced and the batches its tickets stream, each streamed
    /// in exactly that schema (metadata included).
    async fn redeem(
        &mut self,
        info: FlightInfo,
    ) -> Result<(Schema, Vec<RecordBatch>), FlightError> {
        let announced = info.clone().try_decode_schema()?;
        let mut batches = Vec::new();
        for ticket in info.endpoint.into_iter().filter_map(|e| e.ticket) {
            let streamed: Vec<RecordBatch> =
                self.client.do_get(ticket).await?.try_collect().await?;
            for batch in &streamed {
                assert_eq!(batch.schema().as_ref(), &announced, "streamed as announced");
            }
            batches.extend(streamed);
        }
        Ok((announced, batches))
    }

    /// Runs `sql` through the query path.
    async fn sql(&mut self, sql: &str) -> (Schema, Vec<RecordBatch>) {
        let info = self.client.execute(sql.to_string(), None).await;
        let info = info.unwrap_or_else(|e| panic!("{sql}: {e}"));
        self.redeem(info)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// The schema `GetSchema` answers for `sql`, without running it.
    async fn schema_of(&self, sql: &str) -> Schema {
        let command = CommandStatementQuery {
            query: sql.into(),
            transaction_id: None,
        };
        let descriptor = FlightDescriptor::new_cmd(command.as_any().encode_to_vec());
        let answer = self.client.inner().clone().get_schema(descriptor).await;
        Schema::try_from(answer.expect("GetSchema").into_inner()).expect("IPC schema")
    }

    /// `GetTables`: each table's (database, name, type) and, with `include_schema`,
    /// its schema.
    async fn tables(&mut self, command: CommandGetTables) -> Vec<(String, String, String, Schema)> {
        let include_schema = command.include_schema;
        let info = self.client.get_tables(command).await.expect("GetTables");
        let (_, batches) = self.redeem(info).await.expect("tables");
        let mut tables = Vec::new();
        for batch in batches {
            for row in 0..batch.num_rows() {
                let text = |column: usize| {
                    batch
                        .column(column)
                        .as_string::<i32>()
                        .value(row)
                        .to_string()
                };
                let schema = match include_schema {
                    true => {
                        let bytes = batch.column(4).as_binary::<i32>().value(row);
                        arrow::ipc::convert::try_schema_from_ipc_buffer(bytes).expect("schema")
                    }
                    false => Schema::empty(),
                };
                tables.push((text(1), text(2), text(3), schema));
            }
        }
        tables
    }

    /// The `GetSqlInfo` value of each of `infos`, as a one-value array.
    async fn sql_info(&mut self, infos: &[SqlInfo]) -> HashMap<u32, ArrayRef> {
        let info = self
            .client
            .get_sql_info(infos.to_vec())
            .await
            .expect("GetSqlInfo");
        let (_, batches) = self.redeem(info).await.expect("sql info");
        let mut values = HashMap::new();
        for batch in batches {
            let names = batch
                .column(0)
                .as_primitive::<arrow::datatypes::UInt32Type>();
            let unions = batch.column(1).as_union();
            for row in 0..batch.num_rows() {
                values.insert(names.value(row), unions.value(row));
            }
        }
        values
    }
}

/// A field's value for a metadata key (`<missing>` when absent).
fn key<'a>(field: &'a Field, name: &str) -> &'a str {
    let full = format!("ARROW:FLIGHT:SQL:{name}");
    field
        .metadata()
        .get(&full)
        .map_or("<missing>", String::as_str)
}

/// Asserts `field` carries every key, its SQL type name, and the table it reads
/// (`""`: computed) with whether it is read-only.
fn assert_column(field: &Field, type_name: &str, table: &str, read_only: bool) {
    let name = field.name();
    let missing: Vec<&str> = KEYS
        .into_iter()
        .filter(|k| !field.metadata().contains_key(*k))
        .collect();
    assert!(missing.is_empty(), "{name} lacks {missing:?}");
    assert_eq!(key(field, "TYPE_NAME"), type_name, "{name}");
    assert_eq!(key(field, "TABLE_NAME"), table, "{name}");
    let database = key(field, "DB_SCHEMA_NAME");
    assert_eq!(
        key(field, "SCHEMA_NAME"),
        database,
        "{name}: both database keys"
    );
    let catalog = if table.is_empty() { "" } else { "mink" };
    assert_eq!(key(field, "CATALOG_NAME"), catalog, "{name}");
    assert_eq!(
        key(field, "IS_READ_ONLY"),
        if read_only { "1" } else { "0" },
        "{name}"
    );
    assert_eq!(key(field, "IS_AUTO_INCREMENT"), "0", "{name}");
    assert_eq!(key(field, "IS_SEARCHABLE"), "1", "{name}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_schema_describes_each_column_as_jdbc_reads_it() {
    let mut endpoint = Endpoint::start().await;
    endpoint.sql(ORDERS).await;
    let command = CommandGetTables {
        db_schema_filter_pattern: Some("shop".into()),
        include_schema: true,
        ..Default::default()
    };
    let tables = endpoint.tables(command).await;
    let [(database, table, table_type, schema)] = tables.as_slice() else {
        panic!("one table: {tables:?}");
    };
    assert_eq!(
        (database.as_str(), table.as_str(), table_type.as_str()),
        ("shop", "orders", "TABLE")
    );
    // (name, type name, precision, scale, nullable, case sensitive)
    let expected = [
        ("id", "BIGINT", "19", "0", false, "0"),
        ("name", "VARCHAR", "2147483647", "0", true, "1"),
        ("price", "DECIMAL", "10", "2", true, "0"),
        ("at", "TIMESTAMP", "29", "9", true, "0"),
        ("day", "DATE", "10", "0", true, "0"),
        ("ok", "BOOLEAN", "1", "0", true, "0"),
        ("ratio", "REAL", "24", "0", true, "0"),
    ];
    assert_eq!(schema.fields().len(), expected.len());
    for (field, (name, type_name, precision, scale, nullable, case_sensitive)) in
        schema.fields().iter().zip(expected)
    {
        assert_eq!(field.name(), name);
        assert_column(field, type_name, "orders", false);
        assert_eq!(key(field, "DB_SCHEMA_NAME"), "shop");
        assert_eq!(key(field, "PRECISION"), precision, "{name}");
        assert_eq!(key(field, "SCALE"), scale, "{name}");
        assert_eq!(key(field, "IS_CASE_SENSITIVE"), case_sensitive, "{name}");
        assert_eq!(field.is_nullable(), nullable, "{name}");
    }

    // The node's state: views, read-only, with their declared nullability.
    let command = CommandGetTables {
        db_schema_filter_pattern: Some("system".into()),
        table_name_filter_pattern: Some("buckets".into()),
        include_schema: true,
        ..Default::default()
    };
    let tables = endpoint.tables(command).await;
    let (_, _, table_type, schema) = &tables[0];
    assert_eq!(table_type, "VIEW");
    let bucket = schema.field_with_name("bucket").expect("bucket");
    assert_column(bucket, "INT UNSIGNED", "buckets", true);
    assert!(!bucket.is_nullable());
    assert!(
        schema
            .field_with_name("partition")
            .expect("partition")
            .is_nullable()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_carry_metadata_and_plain_types_on_every_path() {
    let mut endpoint = Endpoint::start().await;
    endpoint.sql(ORDERS).await;
    let (count, _) = endpoint.sql(ONE_ORDER).await;
    assert_column(count.field(0), "BIGINT UNSIGNED", "", true);

    let sql = "SELECT o.id, o.name AS label, upper(o.name) AS shout, \
               substr(o.name, 1, 2) AS head, \
               arrow_cast(arrow_cast(o.name, 'Binary'), 'BinaryView') AS raw, \
               make_array(substr(o.name, 1, 1)) AS initials, o.price \
               FROM shop.orders o WHERE o.id > 0";
    let check = |schema: &Schema, path: &str| {
        let field = |name: &str| schema.field_with_name(name).expect(name).clone();
        assert_column(&field("id"), "BIGINT", "orders", false);
        assert_eq!(key(&field("id"), "DB_SCHEMA_NAME"), "shop", "{path}");
        assert!(!field("id").is_nullable(), "{path}");
        assert_column(&field("label"), "VARCHAR", "orders", false);
        assert_column(&field("shout"), "VARCHAR", "", true);
        assert_column(&field("head"), "VARCHAR", "", true);
        assert_column(&field("raw"), "BYTEA", "", true);
        assert_column(&field("initials"), "ARRAY", "", true);
        assert_column(&field("price"), "DECIMAL", "orders", false);
        assert_eq!(
            (
                key(&field("price"), "PRECISION"),
                key(&field("price"), "SCALE")
            ),
            ("10", "2")
        );
        // Views arrive plain, nested ones too.
        assert_eq!(field("head").data_type(), &DataType::Utf8, "{path}");
        assert_eq!(field("raw").data_type(), &DataType::Binary, "{path}");
        let DataType::List(item) = field("initials").data_type().clone() else {
            panic!("{path}: a list");
        };
        assert_eq!(item.data_type(), &DataType::Utf8, "{path}");
    };

    // The query path: announced, and streamed as announced (`redeem` checks).
    let (announced, batches) = endpoint.sql(sql).await;
    check(&announced, "query");
    let batch = &batches[0];
    let column = |name: &str| Arc::clone(batch.column(announced.index_of(name).expect(name)));
    assert_eq!(column("head").as_string::<i32>().value(0), "wi");
    assert_eq!(column("raw").as_binary::<i32>().value(0), b"widget");
    assert_eq!(column("shout").as_string::<i32>().value(0), "WIDGET");

    // GetSchema, without running it.
    check(&endpoint.schema_of(sql).await, "GetSchema");

    // A prepared statement: its dataset schema, and the rows it streams.
    let mut prepared = endpoint
        .client
        .prepare(sql.to_string(), None)
        .await
        .expect("prepare");
    check(
        prepared.dataset_schema().expect("dataset schema"),
        "prepared",
    );
    let info = prepared.execute().await.expect("execute");
    let (streamed, _) = endpoint.redeem(info).await.expect("prepared rows");
    check(&streamed, "prepared execution");

    // The changelog's columns: read-only.
    let (changelog, _) = endpoint
        .sql("SELECT id, _change_type FROM shop.\"orders$changelog\"")
        .await;
    assert_column(changelog.field(0), "BIGINT", "orders$changelog", true);
    assert_column(changelog.field(1), "VARCHAR", "orders$changelog", true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn databases_table_types_and_show_tables_agree() {
    let mut endpoint = Endpoint::start().await;
    endpoint.sql(ORDERS).await;

    // `default` is there before it holds a table, and information_schema beside it.
    let info = endpoint
        .client
        .get_db_schemas(CommandGetDbSchemas::default())
        .await;
    let (_, batches) = endpoint
        .redeem(info.expect("GetDbSchemas"))
        .await
        .expect("schemas");
    let databases: Vec<String> = batches
        .iter()
        .flat_map(|b| {
            b.column(1)
                .as_string::<i32>()
                .iter()
                .flatten()
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        databases,
        ["default", "information_schema", "shop", "system"]
    );
    let (_, rows) = endpoint
        .sql("SELECT schema_name FROM information_schema.schemata ORDER BY 1")
        .await;
    let schemata: Vec<String> = strings(&rows, 0);
    // DataFusion's schemata leaves information_schema itself out.
    assert_eq!(schemata, ["default", "shop", "system"]);

    // Every table GetTables lists, SHOW TABLES lists under the same type, and back.
    let listed: BTreeSet<(String, String, String)> = endpoint
        .tables(CommandGetTables::default())
        .await
        .into_iter()
        .map(|(database, table, table_type, _)| (database, table, table_type))
        .collect();
    let (_, rows) = endpoint.sql("SHOW TABLES").await;
    let shown: BTreeSet<(String, String, String)> = strings(&rows, 1)
        .into_iter()
        .zip(strings(&rows, 2))
        .zip(strings(&rows, 3))
        .map(|((database, table), table_type)| {
            let table_type = match table_type.as_str() {
                "BASE TABLE" => "TABLE".to_string(),
                other => other.to_string(),
            };
            (database, table, table_type)
        })
        .collect();
    assert_eq!(listed, shown);
    assert!(listed.contains(&("shop".into(), "orders".into(), "TABLE".into())));
    assert!(listed.contains(&("system".into(), "buckets".into(), "VIEW".into())));
    assert!(listed.contains(&("information_schema".into(), "tables".into(), "VIEW".into())));

    // GetTableTypes answers exactly the types tables have, and filters by them.
    let info = endpoint
        .client
        .get_table_types()
        .await
        .expect("GetTableTypes");
    let (_, batches) = endpoint.redeem(info).await.expect("table types");
    let types: BTreeSet<String> = strings(&batches, 0).into_iter().collect();
    let used: BTreeSet<String> = listed.iter().map(|(_, _, t)| t.clone()).collect();
    assert_eq!(types, used);
    let views = endpoint
        .tables(CommandGetTables {
            table_types: vec!["VIEW".into()],
            ..Default::default()
        })
        .await;
    assert!(
        views
            .iter()
            .all(|(database, ..)| database == "system" || database == "information_schema")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_info_claims_only_what_the_service_does() {
    let mut endpoint = Endpoint::start().await;
    let values = endpoint
        .sql_info(&[
            SqlInfo::FlightSqlServerCancel,
            SqlInfo::SqlSupportsLikeEscapeClause,
            SqlInfo::SqlSearchStringEscape,
            SqlInfo::SqlIdentifierCase,
            SqlInfo::SqlQuotedIdentifierCase,
            SqlInfo::SqlExtraNameCharacters,
            SqlInfo::SqlSupportedSubqueries,
            SqlInfo::SqlMaxConnections,
            SqlInfo::SqlMaxStatementLength,
            SqlInfo::SqlTransactionsSupported,
        ])
        .await;
    let value = |info: SqlInfo| {
        values
            .get(&(info as u32))
            .unwrap_or_else(|| panic!("{info:?}"))
    };
    let flag = |info: SqlInfo| value(info).as_boolean().value(0);
    let text = |info: SqlInfo| value(info).as_string::<i32>().value(0).to_string();
    let int32 = |info: SqlInfo| value(info).as_primitive::<Int32Type>().value(0);
    let int64 = |info: SqlInfo| value(info).as_primitive::<Int64Type>().value(0);

    // Cancellation is served: a FlightInfo nobody reads is not running (NotFound), not
    // an unknown action.
    assert!(flag(SqlInfo::FlightSqlServerCancel));
    let info = endpoint
        .client
        .execute("SELECT 1".into(), None)
        .await
        .expect("info");
    let cancel = CancelFlightInfoRequest::new(info);
    let action = Action::new("CancelFlightInfo", cancel.encode_to_vec());
    let refused = endpoint
        .client
        .inner()
        .clone()
        .do_action(action)
        .await
        .expect_err("not running");
    assert_eq!(refused.code(), Code::NotFound);

    // LIKE ... ESCAPE with the escape it announces.
    assert!(flag(SqlInfo::SqlSupportsLikeEscapeClause));
    assert_eq!(text(SqlInfo::SqlSearchStringEscape), "\\");
    let (_, rows) = endpoint
        .sql(r"SELECT 'a%' LIKE 'a\%' ESCAPE '\', 'ab' LIKE 'a\%' ESCAPE '\'")
        .await;
    let matched = (
        rows[0].column(0).as_boolean().value(0),
        rows[0].column(1).as_boolean().value(0),
    );
    assert_eq!(matched, (true, false));

    // Unquoted names fold to lower case; quoted ones keep theirs and are told apart
    // (case sensitive: UNKNOWN, which Flight SQL's ODBC driver reads as such).
    assert_eq!(int32(SqlInfo::SqlIdentifierCase), 3, "LOWERCASE");
    assert_eq!(
        int32(SqlInfo::SqlQuotedIdentifierCase),
        0,
        "UNKNOWN: case sensitive"
    );
    endpoint.sql("SELECT MiXed FROM (SELECT 1 AS mixed)").await;
    endpoint
        .sql("SELECT \"MiXed\" FROM (SELECT 1 AS \"MiXed\")")
        .await;
    let other_case = endpoint
        .client
        .execute("SELECT \"mixed\" FROM (SELECT 1 AS \"MiXed\")".into(), None)
        .await;
    assert!(other_case.is_err(), "quoted names differ by case");

    // The characters an unquoted name may hold besides letters, digits and `_`.
    assert_eq!(text(SqlInfo::SqlExtraNameCharacters), "@$#");
    let (named, _) = endpoint.sql("SELECT 1 AS a@b$c#d").await;
    assert_eq!(named.field(0).name(), "a@b$c#d");

    // Subqueries in comparisons, EXISTS, IN and quantified comparisons (bits 0 to 3).
    assert_eq!(int32(SqlInfo::SqlSupportedSubqueries), 0b1111);
    let (_, rows) = endpoint
        .sql("SELECT 1 WHERE 1 = (SELECT 1) AND EXISTS (SELECT 1) AND 1 IN (SELECT 1) AND 2 > ALL (SELECT 1)")
        .await;
    assert_eq!(rows.iter().map(RecordBatch::num_rows).sum::<usize>(), 1);

    // Limits the service holds.
    let connections = i64::try_from(mink_auth::DEFAULT_MAX_CONNECTIONS).expect("fits");
    assert_eq!(int64(SqlInfo::SqlMaxConnections), connections);
    let statement = i64::try_from(mink_sql::session::limits::MAX_STATEMENT_BYTES).expect("fits");
    assert_eq!(int64(SqlInfo::SqlMaxStatementLength), statement);
    assert!(!flag(SqlInfo::SqlTransactionsSupported));
    let begin = endpoint
        .client
        .begin_transaction()
        .await
        .expect_err("no transactions");
    let FlightError::Tonic(status) = begin else {
        panic!("a status: {begin}");
    };
    assert_eq!(status.code(), Code::Unimplemented);
}

/// The strings of column `column` of `batches`.
fn strings(batches: &[RecordBatch], column: usize) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| {
            let strings = b.column(column).as_string::<i32>();
            (0..strings.len())
                .map(|i| strings.value(i).to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn the_adbc_driver_reads_type_names_tables_and_plain_strings() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start(dir.path());
    let output = std::process::Command::new(python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/flight_sql_metadata.py"
        ))
        .arg(server.sql_uri())
        .output()
        .expect("run python");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the ADBC client failed: {stderr}");
    let report = String::from_utf8_lossy(&output.stdout);
    eprintln!("ADBC reported: {report}");
    assert!(report.contains("\"get_objects_type_names\""), "{report}");
}
