//! The Flight SQL endpoint, served on a loopback port over a real node and reached by
//! arrow-flight's Flight SQL client: statements through the query and update paths,
//! prepared statements whose handles any server answers, ingestion, metadata, error
//! codes and authentication. `mink sql --flight-sql` and the ADBC Python driver
//! (`tests/python/flight_sql_adbc.py`) run against the real binary.

use std::sync::Arc;

use arrow::array::{AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Int64Type, Schema, UInt64Type};
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{
    ActionCreatePreparedStatementRequest, ActionCreatePreparedStatementResult, Any,
    CommandGetDbSchemas, CommandGetPrimaryKeys, CommandGetTables, CommandPreparedStatementQuery,
    CommandPreparedStatementUpdate, CommandStatementIngest, CommandStatementQuery, ProstMessageExt,
    SqlInfo, TableDefinitionOptions, TableExistsOption, TableNotExistOption,
};
use arrow_flight::{
    Action, CancelFlightInfoRequest, CancelFlightInfoResult, CancelStatus, FlightData,
    FlightDescriptor, FlightInfo,
};
use futures::TryStreamExt;
use mink_core::table::TablePath;
use mink_flight_sql::client::FlightSqlConnection;
use mink_flight_sql::{
    Credentials, FlightSqlConfig, FlightSqlHandle, ServeError, TlsIdentity, serve,
};
use mink_lake::storage::LakeStorage;
use object_store::local::LocalFileSystem;
use prost::Message;
use tokio::net::TcpListener;
use tonic::Code;
use tonic::transport::Channel;

use crate::process::{ServerProcess, run_mink};
use crate::python::python;
use crate::support::TestNode;

type Client = FlightSqlServiceClient<Channel>;

const CREATE_KV: &str = "CREATE TABLE kv (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id)) \
                         WITH ('bucket.num' = '2', 'lake.enabled' = 'true')";

/// A node and a Flight SQL endpoint over it.
async fn start(credentials: Option<Credentials>) -> (TestNode, FlightSqlHandle) {
    let node = TestNode::start().await;
    let handle = serve_on(&node, credentials, "127.0.0.1:0")
        .await
        .expect("serve");
    (node, handle)
}

/// The endpoint's configuration over `node`: plaintext, with `credentials` if any.
fn config(node: &TestNode, credentials: Option<Credentials>) -> FlightSqlConfig {
    FlightSqlConfig {
        client: node.client.clone(),
        storage: LakeStorage::new(Arc::new(LocalFileSystem::new()), ""),
        credentials,
        tls: None,
    }
}

async fn serve_on(
    node: &TestNode,
    credentials: Option<Credentials>,
    address: &str,
) -> Result<FlightSqlHandle, ServeError> {
    let listener = TcpListener::bind(address).await.expect("bind");
    serve(config(node, credentials), listener)
}

async fn client(handle: &FlightSqlHandle) -> Client {
    let channel = Channel::from_shared(format!("http://{}", handle.addr()))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    FlightSqlServiceClient::new(channel)
}

/// Every batch of every endpoint of `info`, checked against the schema it announced.
async fn fetch(
    client: &mut Client,
    info: FlightInfo,
) -> Result<(Schema, Vec<RecordBatch>), FlightError> {
    let schema = info.clone().try_decode_schema()?;
    let mut batches = Vec::new();
    for endpoint in info.endpoint {
        assert!(
            endpoint.location.is_empty(),
            "fetched from the server asked"
        );
        let ticket = endpoint.ticket.expect("ticket");
        batches.extend(client.do_get(ticket).await?.try_collect::<Vec<_>>().await?);
    }
    for batch in &batches {
        assert_eq!(batch.schema().as_ref(), &schema, "streamed as announced");
    }
    Ok((schema, batches))
}

/// Runs `sql` through the query path: the announced schema and the rows.
async fn run(client: &mut Client, sql: &str) -> Result<(Schema, Vec<RecordBatch>), FlightError> {
    let info = client.execute(sql.to_string(), None).await?;
    fetch(client, info).await
}

async fn rows(client: &mut Client, sql: &str) -> Vec<RecordBatch> {
    run(client, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .1
}

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect()
}

fn status(error: FlightError) -> (Code, String) {
    match error {
        FlightError::Tonic(status) => (status.code(), status.message().to_string()),
        other => panic!("not a status: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_statement_kind_runs_through_both_paths() {
    let (_node, handle) = start(None).await;
    let client = &mut client(&handle).await;

    // DDL through the query path answers an empty result, and runs once.
    let (schema, batches) = run(client, CREATE_KV).await.expect("create");
    assert!(schema.fields().is_empty());
    assert!(batches.iter().all(|b| b.num_rows() == 0));

    // DML through the query path answers its count; through the update path, a count.
    let inserted = rows(client, "INSERT INTO kv VALUES (1, 'a'), (2, 'b'), (3, 'c')").await;
    assert_eq!(
        inserted[0].column(0).as_primitive::<UInt64Type>().value(0),
        3
    );
    let updated = client.execute_update("UPDATE kv SET v = 'z' WHERE id >= 2".into(), None);
    assert_eq!(updated.await.expect("update"), 2);
    let deleted = client.execute_update("DELETE FROM kv WHERE id = 3".into(), None);
    assert_eq!(deleted.await.expect("delete"), 1);

    // CALL answers its row through the query path; the union read sees lake and log.
    let tiered = rows(client, "CALL system.tier('kv')").await;
    assert_eq!(tiered[0].num_rows(), 1);
    client
        .execute_update("INSERT INTO kv VALUES (4, 'd')".into(), None)
        .await
        .expect("insert after tiering");
    assert_eq!(
        ids(&rows(client, "SELECT id, v FROM kv ORDER BY id").await),
        vec![1, 2, 4]
    );
    assert_eq!(
        ids(&rows(client, "SELECT id FROM \"kv$lake\" ORDER BY id").await),
        vec![1, 2]
    );

    // DDL through the update path.
    let altered = client
        .execute_update("ALTER TABLE kv ADD COLUMN n INT".into(), None)
        .await;
    assert_eq!(altered.expect("alter"), 0);
    let (schema, _) = run(client, "SELECT * FROM kv").await.expect("select");
    assert_eq!(schema.field(2).name(), "n");
}

/// The `count` a DML statement's FlightInfo streams, read by one `DoGet` of its ticket.
async fn changed(client: &mut Client, info: &FlightInfo) -> u64 {
    let (schema, batches) = fetch(client, info.clone()).await.expect("the count");
    assert_eq!(schema.fields().len(), 1, "{schema}");
    assert_eq!(schema.field(0).name(), "count");
    assert_eq!(schema.field(0).data_type(), &DataType::UInt64);
    assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 1);
    batches[0].column(0).as_primitive::<UInt64Type>().value(0)
}

/// The `v` of every row of `kv`, by id.
async fn values(client: &mut Client) -> Vec<(i64, String)> {
    let batches = rows(
        client,
        "SELECT id, arrow_cast(v, 'Utf8') FROM kv ORDER BY id",
    )
    .await;
    batches
        .iter()
        .flat_map(|batch| {
            let ids = batch.column(0).as_primitive::<Int64Type>();
            let values = batch.column(1).as_string::<i32>();
            ids.values()
                .iter()
                .zip(values.iter())
                .map(|(id, v)| (*id, v.unwrap_or_default().to_string()))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dml_through_the_query_path_writes_once_however_often_its_ticket_is_redeemed() {
    let (_node, handle) = start(None).await;
    let client = &mut client(&handle).await;
    rows(client, CREATE_KV).await;
    rows(client, "CREATE TABLE events (id BIGINT, v VARCHAR)").await;

    // A log table appends: an INSERT run at each DoGet would add its rows twice.
    let info = client
        .execute("INSERT INTO events VALUES (1, 'a'), (2, 'b')".into(), None)
        .await
        .expect("plan");
    assert_eq!(count(client, "events").await, 2, "written at GetFlightInfo");
    assert_eq!(changed(client, &info).await, 2);
    assert_eq!(
        changed(client, &info).await,
        2,
        "a retried DoGet: the same count"
    );
    assert_eq!(
        count(client, "events").await,
        2,
        "and nothing written again"
    );

    // A primary-key table: an UPDATE run again would append a second '!'.
    rows(client, "INSERT INTO kv VALUES (1, 'a'), (2, 'b'), (3, 'c')").await;
    let info = client
        .execute(
            "UPDATE kv SET v = concat(v, '!') WHERE id >= 2".into(),
            None,
        )
        .await
        .expect("plan");
    assert_eq!(changed(client, &info).await, 2);
    assert_eq!(changed(client, &info).await, 2);
    let updated = [(1, "a"), (2, "b!"), (3, "c!")].map(|(id, v)| (id, v.to_string()));
    assert_eq!(values(client).await, updated);

    // A DELETE run again would delete the row written between the two DoGets.
    let info = client
        .execute("DELETE FROM kv WHERE id = 3".into(), None)
        .await
        .expect("plan");
    assert_eq!(changed(client, &info).await, 1);
    let rewritten = client.execute_update("INSERT INTO kv VALUES (3, 'again')".into(), None);
    assert_eq!(rewritten.await.expect("insert"), 1);
    assert_eq!(changed(client, &info).await, 1);
    assert_eq!(
        ids(&rows(client, "SELECT id FROM kv ORDER BY id").await),
        [1, 2, 3]
    );

    // A prepared INSERT executed through the query path, its parameters bound.
    let mut insert = client
        .prepare("INSERT INTO events VALUES (?, ?)".into(), None)
        .await
        .expect("prepare");
    let bound = RecordBatch::try_from_iter(vec![
        ("0", Arc::new(Int64Array::from(vec![3])) as _),
        ("1", Arc::new(StringArray::from(vec!["c"])) as _),
    ])
    .expect("batch");
    insert.set_parameters(bound).expect("bind");
    let info = insert.execute().await.expect("execute");
    assert_eq!(changed(client, &info).await, 1);
    assert_eq!(changed(client, &info).await, 1);
    assert_eq!(count(client, "events").await, 3);

    // EXPLAIN ANALYZE runs what it explains: once, too.
    let info = client
        .execute(
            "EXPLAIN ANALYZE INSERT INTO events VALUES (4, 'd')".into(),
            None,
        )
        .await
        .expect("plan");
    for _ in 0..2 {
        let (_, batches) = fetch(client, info.clone()).await.expect("the analysis");
        assert!(batches.iter().any(|b| b.num_rows() > 0));
    }
    assert_eq!(count(client, "events").await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_carry_their_parameters_to_any_server() {
    let (node, first) = start(None).await;
    let second = serve_on(&node, None, "127.0.0.1:0")
        .await
        .expect("second server");
    let client = &mut client(&first).await;
    rows(client, CREATE_KV).await;

    // An update bound row by row: JDBC's `?` placeholders.
    let mut insert = client
        .prepare("INSERT INTO kv VALUES (?, ?)".into(), None)
        .await
        .expect("prepare insert");
    assert!(insert.dataset_schema().expect("schema").fields().is_empty());
    let parameters = RecordBatch::try_from_iter(vec![
        ("0", Arc::new(Int64Array::from(vec![10, 11, 12])) as _),
        ("1", Arc::new(StringArray::from(vec!["x", "y", "z"])) as _),
    ])
    .expect("batch");
    insert.set_parameters(parameters).expect("bind");
    assert_eq!(insert.execute_update().await.expect("insert"), 3);

    // A query prepared on one server, its parameters bound there, run on another.
    let mut select = client
        .prepare(
            "SELECT id, v FROM kv WHERE id > $1 ORDER BY id".into(),
            None,
        )
        .await
        .expect("prepare select");
    assert_eq!(
        select
            .parameter_schema()
            .expect("parameters")
            .field(0)
            .data_type(),
        &DataType::Int64
    );
    assert_eq!(select.dataset_schema().expect("schema").fields().len(), 2);
    let bound = RecordBatch::try_from_iter(vec![("0", Arc::new(Int64Array::from(vec![10])) as _)])
        .expect("batch");
    select.set_parameters(bound).expect("bind");
    let info = select.execute().await.expect("execute");
    let other = &mut self::client(&second).await;
    let (_, batches) = fetch(other, info)
        .await
        .expect("rows from the second server");
    assert_eq!(ids(&batches), vec![11, 12]);
    select.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingestion_appends_or_upserts_by_the_table_kind_and_creates_when_asked() {
    let (_node, handle) = start(None).await;
    let client = &mut client(&handle).await;
    rows(client, CREATE_KV).await;
    let batch = |from: i64, to: i64, tag: &str| {
        let ids: Vec<i64> = (from..to).collect();
        let values: Vec<String> = ids.iter().map(|i| format!("{tag}{i}")).collect();
        RecordBatch::try_from_iter(vec![
            ("id", Arc::new(Int64Array::from(ids)) as _),
            ("v", Arc::new(StringArray::from(values)) as _),
        ])
        .expect("batch")
    };
    let ingest = |table: &str, options: Option<TableDefinitionOptions>| CommandStatementIngest {
        table: table.into(),
        table_definition_options: options,
        ..Default::default()
    };
    // Two batches into the primary-key table: the second upserts half of the first.
    let batches = vec![Ok(batch(0, 100, "a")), Ok(batch(50, 150, "b"))];
    let written = client
        .execute_ingest(ingest("kv", None), futures::stream::iter(batches))
        .await
        .expect("ingest");
    assert_eq!(written, 200);
    let counted = rows(
        client,
        "SELECT count(*), count(*) FILTER (WHERE v LIKE 'b%') FROM kv",
    )
    .await;
    assert_eq!(
        counted[0].column(0).as_primitive::<Int64Type>().value(0),
        150
    );
    assert_eq!(
        counted[0].column(1).as_primitive::<Int64Type>().value(0),
        100
    );

    // A missing table: refused in append mode, created in create mode (a log table).
    let append = TableDefinitionOptions {
        if_not_exist: TableNotExistOption::Fail.into(),
        if_exists: TableExistsOption::Append.into(),
    };
    let refused = client
        .execute_ingest(
            ingest("fresh", Some(append)),
            futures::stream::iter(vec![Ok(batch(0, 5, "c"))]),
        )
        .await
        .expect_err("no such table");
    assert!(format!("{refused}").contains("does not exist"), "{refused}");
    let create = TableDefinitionOptions {
        if_not_exist: TableNotExistOption::Create.into(),
        if_exists: TableExistsOption::Fail.into(),
    };
    let stream = futures::stream::iter(vec![Ok(batch(0, 5, "c")), Ok(batch(0, 5, "d"))]);
    let created = client
        .execute_ingest(ingest("fresh", Some(create)), stream)
        .await;
    assert_eq!(created.expect("created"), 10);
    let counted = rows(client, "SELECT count(*) FROM fresh").await;
    assert_eq!(
        counted[0].column(0).as_primitive::<Int64Type>().value(0),
        10,
        "a log table appends"
    );

    // Replacing a primary-key table would lose its key: refused, the table kept.
    let replace = TableDefinitionOptions {
        if_not_exist: TableNotExistOption::Fail.into(),
        if_exists: TableExistsOption::Replace.into(),
    };
    let refused = client
        .execute_ingest(
            ingest("kv", Some(replace)),
            futures::stream::iter(vec![Ok(batch(0, 5, "r"))]),
        )
        .await
        .expect_err("replace a primary-key table");
    assert!(format!("{refused}").contains("primary key"), "{refused}");
    let counted = rows(client, "SELECT count(*) FROM kv").await;
    assert_eq!(
        counted[0].column(0).as_primitive::<Int64Type>().value(0),
        150
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_calls_describe_the_tables() {
    let (_node, handle) = start(None).await;
    let client = &mut client(&handle).await;
    rows(client, CREATE_KV).await;

    let info = client
        .get_sql_info(vec![SqlInfo::FlightSqlServerName, SqlInfo::SqlKeywords])
        .await;
    let (_, batches) = fetch(client, info.expect("sql info"))
        .await
        .expect("sql info rows");
    assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 2);

    let info = client.get_catalogs().await.expect("catalogs");
    let (_, catalogs) = fetch(client, info).await.expect("catalogs");
    assert_eq!(catalogs[0].column(0).as_string::<i32>().value(0), "mink");

    let info = client.get_db_schemas(CommandGetDbSchemas::default()).await;
    let (_, databases) = fetch(client, info.expect("schemas"))
        .await
        .expect("schemas");
    let names: Vec<&str> = databases[0]
        .column(1)
        .as_string::<i32>()
        .iter()
        .flatten()
        .collect();
    assert!(
        names.contains(&"default") && names.contains(&"system"),
        "{names:?}"
    );

    let tables = CommandGetTables {
        db_schema_filter_pattern: Some("def%".into()),
        include_schema: true,
        ..Default::default()
    };
    let info = client.get_tables(tables).await.expect("tables");
    let (_, tables) = fetch(client, info).await.expect("tables");
    assert_eq!(tables[0].num_rows(), 1);
    assert_eq!(tables[0].column(2).as_string::<i32>().value(0), "kv");
    assert_eq!(tables[0].column(3).as_string::<i32>().value(0), "TABLE");
    let schema_bytes = tables[0].column(4).as_binary::<i32>().value(0);
    let schema = arrow::ipc::convert::try_schema_from_ipc_buffer(schema_bytes).expect("schema");
    assert_eq!(
        schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>(),
        vec!["id", "v"]
    );

    let info = client.get_table_types().await.expect("table types");
    assert!(fetch(client, info).await.expect("table types").1[0].num_rows() >= 1);

    let keys = CommandGetPrimaryKeys {
        table: "kv".into(),
        ..Default::default()
    };
    let info = client.get_primary_keys(keys).await.expect("primary keys");
    let (_, keys) = fetch(client, info).await.expect("primary keys");
    assert_eq!(keys[0].column(3).as_string::<i32>().value(0), "id");

    let info = client
        .get_xdbc_type_info(Default::default())
        .await
        .expect("types");
    assert!(fetch(client, info).await.expect("types").1[0].num_rows() > 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_answers_the_right_code_and_the_sql_error() {
    let (_node, handle) = start(None).await;
    let client = &mut client(&handle).await;

    let (code, message) = status(run(client, "SELEC 1").await.expect_err("bad sql"));
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("SELEC"), "{message}");
    let (code, message) = status(
        run(client, "SELECT * FROM nope")
            .await
            .expect_err("no table"),
    );
    assert_eq!(code, Code::NotFound);
    assert!(message.contains("nope"), "{message}");
    let (code, _) = status(
        run(client, "SELECT no_such_function(1)")
            .await
            .expect_err("plan"),
    );
    assert_eq!(code, Code::InvalidArgument);

    // Nothing reaches the server's own files, on either path.
    let dir = tempfile::tempdir().expect("temp dir");
    let target = dir.path().join("stolen.csv");
    let copy = format!("COPY (SELECT 1) TO '{}' STORED AS CSV", target.display());
    let (code, message) = status(run(client, &copy).await.expect_err("copy"));
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("files on the server"), "{message}");
    let error = client
        .execute_update(copy, None)
        .await
        .expect_err("copy as an update");
    assert!(
        format!("{error}").contains("files on the server"),
        "{error}"
    );
    let external = format!(
        "CREATE EXTERNAL TABLE leak STORED AS CSV LOCATION '{}'",
        dir.path().display()
    );
    let (_, message) = status(run(client, &external).await.expect_err("external table"));
    assert!(message.contains("files on the server"), "{message}");
    assert!(!target.exists(), "COPY wrote {}", target.display());

    // A handle the server never issued, and a command that is not Flight SQL at all.
    let unknown = CommandPreparedStatementQuery {
        prepared_statement_handle: b"not a handle".to_vec().into(),
    };
    let mut flight = client.inner().clone();
    let descriptor = FlightDescriptor::new_cmd(unknown.as_any().encode_to_vec());
    let error = flight
        .get_flight_info(descriptor)
        .await
        .expect_err("unknown handle");
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(
        error.message().contains("unknown statement handle"),
        "{error}"
    );
    let garbage = FlightDescriptor::new_cmd(vec![0xff, 0x01, 0x02]);
    let error = flight
        .get_flight_info(garbage)
        .await
        .expect_err("malformed");
    assert_eq!(error.code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_credentials_calls_need_the_token_of_a_handshake() {
    let credentials = Credentials::new("analyst", "s3cret");
    let (_node, handle) = start(Some(credentials)).await;
    let client = &mut client(&handle).await;

    let (code, _) = status(run(client, "SELECT 1").await.expect_err("no token"));
    assert_eq!(code, Code::Unauthenticated);
    let refused = client
        .handshake("analyst", "wrong")
        .await
        .expect_err("wrong password");
    assert!(
        format!("{refused}").contains("wrong user or password"),
        "{refused}"
    );

    client
        .handshake("analyst", "s3cret")
        .await
        .expect("handshake");
    assert!(client.token().is_some());
    assert_eq!(
        ids(&rows(client, "SELECT CAST(7 AS BIGINT)").await),
        vec![7]
    );
    client.set_token("forged".into());
    let (code, _) = status(run(client, "SELECT 1").await.expect_err("forged token"));
    assert_eq!(code, Code::Unauthenticated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_credentials_only_loopback_is_served() {
    let node = TestNode::start().await;
    let error = serve_on(&node, None, "0.0.0.0:0")
        .await
        .expect_err("open to the network");
    assert!(matches!(error, ServeError::OpenToTheNetwork(_)), "{error}");
    let credentials = Credentials::new("analyst", "s3cret");
    serve_on(&node, Some(credentials), "0.0.0.0:0")
        .await
        .expect("with credentials any address");
}

#[test]
fn mink_sql_speaks_flight_sql_to_a_running_server() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start(dir.path());
    let address = format!("grpc://{}", server.sql_addr);
    let sql = |statements: &[&str]| {
        let mut args = vec!["sql", "--flight-sql", address.as_str(), "--format", "csv"];
        for statement in statements {
            args.extend(["-e", statement]);
        }
        run_mink(&args)
    };
    let (ok, _, stderr) = sql(&[
        "CREATE TABLE t (id BIGINT NOT NULL, name VARCHAR)",
        "INSERT INTO t VALUES (1, 'one'), (2, 'two')",
    ]);
    assert!(ok, "{stderr}");
    let (ok, stdout, stderr) = sql(&["SELECT id, name FROM t ORDER BY id"]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "id,name\n1,one\n2,two\n");
    let (ok, _, stderr) = sql(&["SELECT * FROM missing"]);
    assert!(!ok);
    assert!(
        stderr.contains("NotFound") || stderr.contains("not found"),
        "{stderr}"
    );
}

#[test]
fn the_adbc_python_driver_works_end_to_end() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start_with_env(
        dir.path(),
        &[
            ("MINK_SQL_USER", "analyst"),
            ("MINK_SQL_PASSWORD", "s3cret"),
        ],
    );
    let output = std::process::Command::new(python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/flight_sql_adbc.py"
        ))
        .arg(format!("grpc://{}", server.sql_addr))
        .args(["analyst", "s3cret"])
        .output()
        .expect("run python");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the ADBC client failed: {stderr}");
    let figures = String::from_utf8_lossy(&output.stdout);
    eprintln!("ADBC figures: {figures}");
    assert!(figures.contains("large_result_mb"), "{figures}");
}

/// `tests/tls`: a test certificate authority and a certificate it signed for
/// `localhost` and 127.0.0.1 (valid for a century; never use them elsewhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_served_when_given_a_certificate() {
    let node = TestNode::start().await;
    let mut config = config(&node, None);
    config.tls = Some(TlsIdentity {
        certificate_pem: include_bytes!("../tls/server.pem").to_vec(),
        key_pem: include_bytes!("../tls/server.key").to_vec(),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let handle = serve(config, listener).expect("serve tls");
    let port = handle.addr().port();

    let ca = include_bytes!("../tls/ca.pem");
    let secure = format!("grpc+tls://localhost:{port}");
    let connection = FlightSqlConnection::connect(&secure, None, Some(ca))
        .await
        .expect("tls connect");
    let (_, rows) = connection.execute("SELECT 1 AS one").await.expect("query");
    let batches: Vec<RecordBatch> = rows.try_collect().await.expect("rows");
    assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 1);

    // A plaintext client gets nowhere.
    let plain = format!("grpc://127.0.0.1:{port}");
    let refused = match FlightSqlConnection::connect(&plain, None, None).await {
        Ok(connection) => connection.execute("SELECT 1").await.map(|_| ()),
        Err(error) => Err(error),
    };
    assert!(refused.is_err(), "plaintext is refused");
}

/// Ten billion rows: a query that ends only if it is stopped.
const ENDLESS: &str = "SELECT a.value * b.value AS x FROM generate_series(1, 100000) a \
                       CROSS JOIN generate_series(1, 100000) b";

/// Waits until the server runs no statement.
async fn until_idle(handle: &FlightSqlHandle) {
    until_running(handle, 0).await;
}

/// Waits (at most 30 s) until the endpoint runs at most `statements` statements.
async fn until_running(handle: &FlightSqlHandle, statements: usize) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while handle.running_statements() > statements {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} statements still running",
            handle.running_statements()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A client reading the [`ENDLESS`] query, its first batch read, and the query's
/// FlightInfo.
async fn endless_rows(handle: &FlightSqlHandle) -> (Client, FlightRecordBatchStream, FlightInfo) {
    let mut client = client(handle).await;
    let info = client.execute(ENDLESS.into(), None).await.expect("plan");
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    let mut rows = client.do_get(ticket).await.expect("do_get");
    rows.try_next().await.expect("a batch").expect("rows");
    (client, rows, info)
}

/// Reads an endless result to its end, which must be an error: its code and message.
async fn ending(rows: &mut FlightRecordBatchStream) -> (Code, String) {
    loop {
        match rows.try_next().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the endless result ended without an error"),
            Err(error) => break status(error),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_flight_info_stops_that_query_only() {
    let (_node, handle) = start(None).await;
    let (client, mut cancelled, info) = endless_rows(&handle).await;
    let (_other_client, mut other, _) = endless_rows(&handle).await;
    let cancel = |info: FlightInfo| {
        Action::new(
            "CancelFlightInfo",
            CancelFlightInfoRequest::new(info).encode_to_vec(),
        )
    };
    let mut flight = client.inner().clone();
    let mut answers = flight
        .do_action(cancel(info.clone()))
        .await
        .expect("cancel")
        .into_inner();
    let answer = answers.message().await.expect("answer").expect("a result");
    let result = CancelFlightInfoResult::decode(answer.body).expect("result");
    assert_eq!(result.status(), CancelStatus::Cancelled);
    let ended = tokio::time::timeout(std::time::Duration::from_secs(60), ending(&mut cancelled))
        .await
        .expect("cancelled promptly");
    assert_eq!(ended.0, Code::Cancelled, "{}", ended.1);
    // The same SQL run by another client has a ticket of its own and runs on.
    other
        .try_next()
        .await
        .expect("still running")
        .expect("rows");
    drop(cancelled);
    // The cancelled statement leaves the endpoint once its stream has ended: then a second
    // cancel finds nothing.
    until_running(&handle, 1).await;
    let again = flight
        .do_action(cancel(info))
        .await
        .expect_err("nothing left");
    assert_eq!(again.code(), Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_stops_when_its_client_goes_away() {
    let (_node, handle) = start(None).await;
    let (client, rows, _) = endless_rows(&handle).await;
    assert_eq!(handle.running_statements(), 1);
    drop(rows);
    drop(client);
    until_idle(&handle).await;
    handle.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_a_statement_still_running_after_the_grace_period() {
    let (_node, handle) = start(None).await;
    let (client, mut rows, _) = endless_rows(&handle).await;
    let grace = std::time::Duration::from_millis(300);
    let shutdown = tokio::spawn(handle.shutdown_within(grace));
    // The client keeps reading: the rows end with the server's refusal, not silently.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(60), ending(&mut rows))
        .await
        .expect("stopped within the grace period");
    assert_eq!(ended.0, Code::Unavailable, "{}", ended.1);
    assert!(ended.1.contains("shutting down"), "{}", ended.1);
    drop(rows);
    drop(client);
    tokio::time::timeout(std::time::Duration::from_secs(30), shutdown)
        .await
        .expect("shut down")
        .expect("joined")
        .expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_update_runs_every_parameter_row_and_says_how_far_a_failure_got() {
    let (_node, handle) = start(None).await;
    let client = &mut client(&handle).await;
    rows(client, CREATE_KV).await;
    // Row `i` binds `v{i}`; one nullable schema for every batch.
    let parameters = |ids: Vec<Option<i64>>| {
        let values: Vec<String> = (0..ids.len()).map(|i| format!("v{i}")).collect();
        RecordBatch::try_from_iter_with_nullable(vec![
            ("0", Arc::new(Int64Array::from(ids)) as _, true),
            ("1", Arc::new(StringArray::from(values)) as _, true),
        ])
        .expect("batch")
    };
    let mut insert = client
        .prepare("INSERT INTO kv VALUES (?, ?)".into(), None)
        .await
        .expect("prepare");
    insert
        .set_parameters(parameters((0..400).map(Some).collect()))
        .expect("bind");
    assert_eq!(insert.execute_update().await.expect("400 rows"), 400);
    assert_eq!(count(client, "kv").await, 400);

    // Rows of one batch that share a key: the last one wins, as one at a time.
    insert
        .set_parameters(parameters(vec![Some(900), Some(900)]))
        .expect("bind");
    assert_eq!(insert.execute_update().await.expect("two rows"), 2);
    let v = rows(client, "SELECT v FROM kv WHERE id = 900").await;
    assert_eq!(v[0].column(0).as_string::<i32>().value(0), "v1");

    // A batch insert streamed in two batches; the second has a row without a key: the
    // first batch stays, and the error says so.
    let handle = CommandPreparedStatementUpdate {
        prepared_statement_handle: prepared_handle(client, "INSERT INTO kv VALUES (?, ?)").await,
    };
    let mut messages = encode(parameters((1000..1005).map(Some).collect())).await;
    let keyless = parameters(vec![Some(1005), None]);
    messages.extend(encode(keyless).await.split_off(1));
    let error = put(client, handle, messages).await.expect_err("a NULL key");
    assert!(
        error
            .message()
            .contains("after 5 parameter rows that changed 5 rows"),
        "{error}"
    );
    assert_eq!(count(client, "kv").await, 406);

    // Statements that are not a batch insert run once per row, and say how far they got.
    let mut by_row = client
        .prepare("INSERT INTO kv SELECT $1, $2".into(), None)
        .await
        .expect("prepare");
    let mut ids: Vec<Option<i64>> = (2000..2010).map(Some).collect();
    ids[5] = None;
    by_row.set_parameters(parameters(ids)).expect("bind");
    let (_, message) = status(by_row.execute_update().await.expect_err("a NULL key"));
    assert!(
        message.contains("after 5 parameter rows that changed 5 rows"),
        "{message}"
    );
    assert_eq!(count(client, "kv").await, 411);
    let mut update = client
        .prepare("UPDATE kv SET v = $2 WHERE id = $1".into(), None)
        .await
        .expect("prepare");
    update
        .set_parameters(parameters(vec![Some(1), Some(0), Some(77_777)]))
        .expect("bind");
    assert_eq!(update.execute_update().await.expect("update"), 2);
    let v = rows(client, "SELECT v FROM kv WHERE id IN (0, 1) ORDER BY id").await;
    let v = v[0].column(0).as_string::<i32>();
    assert_eq!((v.value(0), v.value(1)), ("v1", "v0"), "the values swapped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_ingest_says_what_it_wrote_and_drops_a_table_it_created() {
    let (_node, handle) = start(None).await;
    let client = &mut client(&handle).await;
    rows(client, CREATE_KV).await;
    let batch = |ids: Vec<Option<i64>>| {
        let values: Vec<String> = ids.iter().map(|i| format!("{i:?}")).collect();
        // One nullable schema for the whole stream.
        RecordBatch::try_from_iter_with_nullable(vec![
            ("id", Arc::new(Int64Array::from(ids)) as _, true),
            ("v", Arc::new(StringArray::from(values)) as _, true),
        ])
        .expect("batch")
    };
    let good = batch((0..10).map(Some).collect());
    let keyless = batch(vec![Some(10), None]);
    let ingest = |table: &str, if_not_exist: TableNotExistOption| CommandStatementIngest {
        table: table.into(),
        table_definition_options: Some(TableDefinitionOptions {
            if_not_exist: if_not_exist.into(),
            if_exists: TableExistsOption::Append.into(),
        }),
        ..Default::default()
    };
    let stream = futures::stream::iter(vec![Ok(good.clone()), Ok(keyless)]);
    let error = client
        .execute_ingest(ingest("kv", TableNotExistOption::Fail), stream)
        .await
        .expect_err("a NULL key");
    let (_, message) = status(error);
    assert!(
        message.contains("10 rows were written before the failure"),
        "{message}"
    );
    assert_eq!(count(client, "kv").await, 10);

    // Created by the ingest, then a batch of other columns the table cannot take (sent
    // with its own schema message): the table is gone.
    let extra = RecordBatch::try_from_iter(vec![
        ("id", Arc::new(Int64Array::from(vec![1])) as _),
        ("nope", Arc::new(Int64Array::from(vec![1])) as _),
    ])
    .expect("batch");
    let mut messages = encode(good).await;
    messages.extend(encode(extra).await);
    let error = put(
        client,
        ingest("fresh", TableNotExistOption::Create),
        messages,
    )
    .await
    .expect_err("a column the table lacks");
    let (code, message) = (error.code(), error.message().to_string());
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("was dropped again"), "{message}");
    let (code, _) = status(
        run(client, "SELECT * FROM fresh")
            .await
            .expect_err("dropped"),
    );
    assert_eq!(code, Code::NotFound);
}

/// An ADBC client that ingests one batch into a new table `fresh`, then waits.
const STALLED_INGEST: &str = r#"
import sys, time
import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa

schema = pa.schema([("id", pa.int64())])
def batches():
    yield pa.record_batch([pa.array([1])], schema=schema)
    time.sleep(600)
reader = pa.RecordBatchReader.from_batches(schema, batches())
with flight_sql.connect(sys.argv[1], autocommit=True) as conn, conn.cursor() as cursor:
    cursor.adbc_ingest("fresh", reader, mode="create")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_ingest_drops_the_table_it_created() {
    let (node, handle) = start(None).await;
    let mut client = std::process::Command::new(python())
        .args(["-c", STALLED_INGEST, &format!("grpc://{}", handle.addr())])
        .spawn()
        .expect("python");
    let fresh = TablePath::new("default", "fresh");
    let wait_until = async |what: &str, done: &dyn Fn(Option<i64>) -> bool| {
        for _ in 0..3000 {
            let rows = match node.client.list_buckets(&fresh).await {
                Ok(buckets) => Some(buckets.iter().map(|b| b.high_watermark).sum()),
                Err(_) => None,
            };
            if done(rows) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("table 'fresh' never {what}");
    };
    // Created and written to: the ingest is under way. Then the client dies.
    wait_until("held the batch", &|rows| rows == Some(1)).await;
    client.kill().expect("kill");
    client.wait().expect("reaped");
    wait_until("went away", &|rows| rows.is_none()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_arrow_data_in_a_put_is_an_invalid_argument() {
    let (_node, handle) = start(None).await;
    let client = &mut client(&handle).await;
    rows(client, CREATE_KV).await;
    // A record batch message without the schema message that must come first.
    let batch = RecordBatch::try_from_iter(vec![
        ("id", Arc::new(Int64Array::from(vec![1])) as _),
        ("v", Arc::new(StringArray::from(vec!["a"])) as _),
    ])
    .expect("batch");
    let headless = encode(batch).await.split_off(1);
    let command = CommandStatementIngest {
        table: "kv".into(),
        ..Default::default()
    };
    let error = put(client, command, headless).await.expect_err("no schema");
    assert_eq!(error.code(), Code::InvalidArgument, "{error}");
    assert!(error.message().contains("malformed Arrow data"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_whose_table_changed_since_planning_is_refused() {
    let (_node, handle) = start(None).await;
    let client = &mut client(&handle).await;
    rows(client, CREATE_KV).await;
    rows(client, "INSERT INTO kv VALUES (1, 'a')").await;
    let info = client
        .execute("SELECT * FROM kv".into(), None)
        .await
        .expect("plan");
    rows(client, "ALTER TABLE kv ADD COLUMN w INT").await;
    let error = fetch(client, info).await.expect_err("the schema moved");
    let (code, message) = status(error);
    assert_eq!(code, Code::FailedPrecondition);
    assert!(message.contains("run it again"), "{message}");
    assert_eq!(ids(&rows(client, "SELECT * FROM kv").await), vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dictionary_columns_are_announced_as_they_stream() {
    let (_node, handle) = start(None).await;
    let client = &mut client(&handle).await;
    // `fetch` checks every streamed batch against the announced schema.
    let (schema, batches) = run(
        client,
        "SELECT arrow_cast(column1, 'Dictionary(Int32, Utf8)') AS d \
         FROM (VALUES ('a'), ('b'), ('a'))",
    )
    .await
    .expect("dictionary rows");
    assert_eq!(schema.field(0).data_type(), &DataType::Utf8);
    assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_schema_runs_nothing_and_poll_flight_info_is_complete_at_once() {
    let (_node, handle) = start(None).await;
    let client = &mut client(&handle).await;
    rows(client, CREATE_KV).await;
    let mut flight = client.inner().clone();
    let statement = |sql: &str| {
        let command = CommandStatementQuery {
            query: sql.into(),
            transaction_id: None,
        };
        FlightDescriptor::new_cmd(command.as_any().encode_to_vec())
    };
    let mut schema_of = async |descriptor: FlightDescriptor| {
        let answer = flight.get_schema(descriptor).await?.into_inner();
        let schema = Schema::try_from(answer).expect("IPC schema");
        Ok::<_, tonic::Status>(
            schema
                .fields()
                .iter()
                .map(|f| (f.name().clone(), f.data_type().clone()))
                .collect::<Vec<_>>(),
        )
    };
    // Dictionaries as they stream: their values.
    let sql = "SELECT arrow_cast(v, 'Dictionary(Int32, Utf8)') AS d, id FROM kv";
    assert_eq!(
        schema_of(statement(sql)).await.expect("schema"),
        [("d".into(), DataType::Utf8), ("id".into(), DataType::Int64)]
    );
    let prepared = CommandPreparedStatementQuery {
        prepared_statement_handle: prepared_handle(client, "SELECT v FROM kv WHERE id = ?").await,
    };
    let descriptor = FlightDescriptor::new_cmd(prepared.as_any().encode_to_vec());
    assert_eq!(
        schema_of(descriptor).await.expect("prepared"),
        [("v".into(), DataType::Utf8)]
    );
    let ddl = "CREATE TABLE never (id BIGINT)";
    assert_eq!(schema_of(statement(ddl)).await.expect("DDL"), []);
    let bad = schema_of(statement("SELEC 1")).await.expect_err("bad SQL");
    assert_eq!(bad.code(), Code::InvalidArgument);
    let (code, _) = status(
        run(client, "SELECT * FROM never")
            .await
            .expect_err("not run"),
    );
    assert_eq!(code, Code::NotFound);

    rows(client, "INSERT INTO kv VALUES (7, 'seven')").await;
    let poll = flight
        .poll_flight_info(statement("SELECT id FROM kv"))
        .await
        .expect("poll")
        .into_inner();
    assert_eq!(poll.progress, Some(1.0));
    assert!(
        poll.flight_descriptor.is_none(),
        "complete: nothing to poll again"
    );
    let (_, batches) = fetch(client, poll.info.expect("info")).await.expect("rows");
    assert_eq!(ids(&batches), vec![7]);
}

/// The handle of a statement prepared by hand (arrow-flight's client keeps its own).
async fn prepared_handle(client: &Client, sql: &str) -> prost::bytes::Bytes {
    let request = ActionCreatePreparedStatementRequest {
        query: sql.into(),
        transaction_id: None,
    };
    let action = Action::new("CreatePreparedStatement", request.as_any().encode_to_vec());
    let mut flight = client.inner().clone();
    let mut results = flight
        .do_action(action)
        .await
        .expect("prepare")
        .into_inner();
    let result = results.message().await.expect("answer").expect("a result");
    let any = Any::decode(result.body).expect("Any");
    let prepared: ActionCreatePreparedStatementResult =
        any.unpack().expect("unpack").expect("a prepared statement");
    prepared.prepared_statement_handle
}

/// A batch as Flight data: its schema message, then the batch.
async fn encode(batch: RecordBatch) -> Vec<FlightData> {
    FlightDataEncoderBuilder::new()
        .build(futures::stream::iter([Ok(batch)]))
        .try_collect()
        .await
        .expect("encode")
}

/// A `DoPut` of `command` with `messages` as they are (arrow-flight's client would fix
/// what these tests break).
async fn put(
    client: &Client,
    command: impl ProstMessageExt,
    mut messages: Vec<FlightData>,
) -> Result<(), tonic::Status> {
    messages[0].flight_descriptor =
        Some(FlightDescriptor::new_cmd(command.as_any().encode_to_vec()));
    let mut flight = client.inner().clone();
    let answers = flight.do_put(futures::stream::iter(messages)).await?;
    answers.into_inner().try_collect::<Vec<_>>().await.map(drop)
}

async fn count(client: &mut Client, table: &str) -> i64 {
    let counted = rows(client, &format!("SELECT count(*) FROM {table}")).await;
    counted[0].column(0).as_primitive::<Int64Type>().value(0)
}
