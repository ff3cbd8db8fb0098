//! Runs every `slt/*.slt` file against a fresh mink node served on 127.0.0.1:0 in this
//! process, one node per file, twice: through a [`MinkSession`] (the session `mink sql`
//! uses), then through the node's Flight SQL endpoint (what ADBC and JDBC clients use),
//! with the same expectations.
//!
//! ```text
//! cargo test -p sql-tests                          # run every file
//! cargo test -p sql-tests -- ddl                   # the files whose name contains "ddl"
//! cargo test -p sql-tests -- --complete            # rewrite the expected results
//! ```
//!
//! Results are compared as text: NULL is `NULL`, an empty string `(empty)`, every other
//! value as Arrow displays it. Column types are `I` (integers), `R` (floating point and
//! decimals) and `T` (everything else). A DML statement's count is its statement count
//! (`statement count 3`). `--complete` rewrites the files from the embedded run.
//!
//! What changes from run to run is written the same every time: in a plan, lake files as
//! `<directory>/*.parquet` ([`plan_lines`]); in rows, an Iceberg snapshot id (a column
//! named `snapshot_id`, as `CALL` and `system.lake_snapshots` answer it) as `SNAPSHOT_ID`,
//! since Iceberg makes them at random. Both backends plan [`PLANNED_PARTITIONS`]
//! partitions, not one per core, so a plan is the same on every machine.

#![expect(
    unused_crate_dependencies,
    reason = "a test crate sees every dependency of the package"
)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef, UInt64Type};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use async_trait::async_trait;
use mink_flight_sql::client::FlightSqlConnection;
use mink_flight_sql::{FlightSqlConfig, FlightSqlHandle};
use mink_lake::storage::LakeStorage;
use mink_node::server::{ServerHandle, serve};
use mink_node::{Node, NodeConfig};
use mink_sql::session::{MinkSession, SqlRuntime, default_memory_limit, memory_pool};
use object_store::local::LocalFileSystem;
use sqllogictest::{DBOutput, DefaultColumnType, Runner};

/// How statements reach the node.
#[derive(Clone)]
enum Backend {
    /// A session in this process.
    Embedded(Arc<MinkSession>),
    /// The Flight SQL endpoint, through the query path (as ADBC's `cursor.execute`).
    FlightSql(FlightSqlConnection),
}

impl Backend {
    /// A statement's result schema and batches, or its error message.
    async fn run(&self, sql: &str) -> Result<(SchemaRef, Vec<RecordBatch>), SqlError> {
        match self {
            Self::Embedded(session) => {
                let error = |e: datafusion::error::DataFusionError| SqlError(e.to_string());
                let frame = session.sql(sql).await.map_err(error)?;
                let schema = Arc::clone(frame.schema().inner());
                Ok((schema, frame.collect().await.map_err(error)?))
            }
            Self::FlightSql(connection) => {
                // The server's status message: the same SQL error text.
                let error = |e| SqlError(mink_client::ClientError::from(e).to_string());
                connection.query(sql).await.map_err(error)
            }
        }
    }
}

/// A node, as sqllogictest drives it.
struct MinkDb {
    backend: Backend,
}

/// A statement's failure: its message is what `statement error <regex>` matches.
#[derive(Debug)]
struct SqlError(String);

impl std::fmt::Display for SqlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SqlError {}

#[async_trait]
impl sqllogictest::AsyncDB for MinkDb {
    type Error = SqlError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, SqlError> {
        let (schema, batches) = self.backend.run(sql).await?;
        if schema.fields().is_empty() {
            return Ok(DBOutput::StatementComplete(0));
        }
        if let Some(count) = dml_count(&batches) {
            return Ok(DBOutput::StatementComplete(count));
        }
        let types = schema
            .fields()
            .iter()
            .map(|field| column_type(field.data_type()))
            .collect();
        let mut rows = Vec::new();
        for batch in &batches {
            rows.extend(format_rows(batch).map_err(|e| SqlError(e.to_string()))?);
        }
        mask_snapshot_ids(&schema, &mut rows);
        if is_plan(&schema) {
            rows = plan_lines(rows);
        }
        Ok(DBOutput::Rows { types, rows })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "mink"
    }

    async fn sleep(duration: std::time::Duration) {
        tokio::time::sleep(duration).await;
    }
}

/// The count a DML statement answers (one `count` row of type UInt64).
fn dml_count(batches: &[RecordBatch]) -> Option<u64> {
    let [batch] = batches else { return None };
    let field = batch.schema_ref().fields().first()?;
    if batch.num_columns() != 1 || field.name() != "count" || batch.num_rows() != 1 {
        return None;
    }
    let counts = batch.column(0).as_primitive_opt::<UInt64Type>()?;
    Some(counts.value(0))
}

/// Whether the result is an `EXPLAIN` (`plan_type`, `plan`).
fn is_plan(schema: &arrow::datatypes::Schema) -> bool {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    names == ["plan_type", "plan"]
}

/// An `EXPLAIN` result one plan line per row, as DataFusion's own slt files show plans: the
/// plan type alone, then `01)`, `02)`, ... with the indentation as dashes. A one-line plan
/// stays on the plan type's row. Lake files, whose paths change from run to run, are
/// written as `<directory>/*.parquet`.
fn plan_lines(rows: Vec<Vec<String>>) -> Vec<Vec<String>> {
    let mut lines = Vec::new();
    for row in rows {
        let [plan_type, plan] = row.as_slice() else {
            lines.push(row);
            continue;
        };
        let plan = stable_paths(plan);
        let plan_rows: Vec<&str> = plan.lines().collect();
        if plan_rows.len() == 1 {
            // A physical plan ends with a newline, which would be a blank line in the file.
            lines.push(vec![plan_type.clone(), plan.trim_end().to_string()]);
            continue;
        }
        lines.push(vec![plan_type.clone()]);
        for (i, line) in plan_rows.iter().enumerate() {
            let indent = line.len() - line.trim_start().len();
            lines.push(vec![format!(
                "{:02}){}{}",
                i + 1,
                "-".repeat(indent),
                line.trim_start()
            )]);
        }
    }
    lines
}

/// Every snapshot id of the rows as `SNAPSHOT_ID` (a null stays `NULL`).
fn mask_snapshot_ids(schema: &arrow::datatypes::Schema, rows: &mut [Vec<String>]) {
    const SNAPSHOT_ID: &str = "snapshot_id";
    let Ok(column) = schema.index_of(SNAPSHOT_ID) else {
        return;
    };
    for value in rows.iter_mut().filter_map(|row| row.get_mut(column)) {
        if value != "NULL" {
            *value = SNAPSHOT_ID.to_uppercase();
        }
    }
}

/// A plan with its lake files as `<path in the warehouse>/*.parquet`: the temporary
/// directory and the file names (UUIDs) change from run to run.
fn stable_paths(plan: &str) -> String {
    const SUFFIX: &str = ".parquet";
    let mut stable = String::with_capacity(plan.len());
    let mut rest = plan;
    while let Some(end) = rest.find(SUFFIX) {
        let (head, tail) = rest.split_at(end);
        let start = head.rfind(['[', ' ', ',']).map_or(0, |i| i + 1);
        let path = &head[start..];
        let in_warehouse = path.split_once("warehouse/").map_or(path, |(_, p)| p);
        let dir = in_warehouse.rsplit_once('/').map_or("", |(dir, _)| dir);
        stable.push_str(&head[..start]);
        stable.push_str(dir);
        stable.push_str("/*");
        stable.push_str(SUFFIX);
        rest = &tail[SUFFIX.len()..];
    }
    stable.push_str(rest);
    stable
}

fn column_type(data_type: &DataType) -> DefaultColumnType {
    if data_type.is_integer() {
        DefaultColumnType::Integer
    } else if data_type.is_floating()
        || matches!(
            data_type,
            DataType::Decimal128(..) | DataType::Decimal256(..)
        )
    {
        DefaultColumnType::FloatingPoint
    } else {
        DefaultColumnType::Text
    }
}

fn format_rows(batch: &RecordBatch) -> Result<Vec<Vec<String>>, arrow::error::ArrowError> {
    let options = FormatOptions::default().with_null("NULL");
    let formatters = batch
        .columns()
        .iter()
        .map(|column| ArrayFormatter::try_new(column.as_ref(), &options))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((0..batch.num_rows())
        .map(|row| {
            formatters
                .iter()
                .zip(batch.columns())
                .map(|(formatter, column)| {
                    let text = formatter.value(row).to_string();
                    match text.is_empty() && column.is_valid(row) {
                        true => "(empty)".to_string(),
                        false => text,
                    }
                })
                .collect()
        })
        .collect())
}

/// A node over a fresh directory, served on a loopback port, with its Flight SQL
/// endpoint on another.
struct TestNode {
    _dir: tempfile::TempDir,
    handle: ServerHandle,
    flight_sql: FlightSqlHandle,
    client: mink_client::MinkClient,
}

impl TestNode {
    async fn start() -> Result<Self, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let node = Node::open(NodeConfig::new(dir.path())).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let handle = serve(node, listener).await?;
        let client = mink_client::MinkClient::connect(&handle.addr().to_string()).await?;
        let config = FlightSqlConfig {
            client: client.clone(),
            storage: storage(),
            credentials: None,
            tls: None,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let flight_sql = mink_flight_sql::serve_in(
            config,
            runtime(),
            listener,
            mink_auth::DEFAULT_MAX_CONNECTIONS,
        )?;
        Ok(Self {
            _dir: dir,
            handle,
            flight_sql,
            client,
        })
    }

    /// How statements of one file reach this node.
    async fn backend(&self, flight_sql: bool) -> Result<Backend, Box<dyn std::error::Error>> {
        if flight_sql {
            let address = self.flight_sql.addr().to_string();
            let connection = FlightSqlConnection::connect(&address, None, None).await?;
            return Ok(Backend::FlightSql(connection));
        }
        let session = MinkSession::connect_in(self.client.clone(), storage(), &runtime()).await?;
        Ok(Backend::Embedded(Arc::new(session)))
    }

    async fn shutdown(self) -> Result<(), Box<dyn std::error::Error>> {
        self.flight_sql.shutdown().await?;
        self.handle.shutdown().await?;
        Ok(())
    }
}

/// Lake files are read from this machine's file system.
/// The partitions every statement plans, on any machine: CI's core count.
const PLANNED_PARTITIONS: usize = 2;

/// The runtime of both backends' sessions, planning [`PLANNED_PARTITIONS`] partitions.
fn runtime() -> SqlRuntime {
    SqlRuntime::server(memory_pool(default_memory_limit()), &storage())
        .expect("a server runtime over a local lake")
        .with_target_partitions(PLANNED_PARTITIONS)
}

fn storage() -> LakeStorage {
    LakeStorage::new(Arc::new(LocalFileSystem::new()), "")
}

/// The `.slt` files, sorted, whose names contain every name filter given.
fn slt_files(filters: &[String]) -> std::io::Result<Vec<PathBuf>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("slt");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|path| {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        name.ends_with(".slt") && filters.iter().all(|filter| name.contains(filter.as_str()))
    });
    files.sort();
    Ok(files)
}

/// Runs one file against a fresh node, through Flight SQL or embedded.
async fn run_file(
    path: &Path,
    complete: bool,
    flight_sql: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let node = TestNode::start().await?;
    let backend = node.backend(flight_sql).await?;
    let mut runner = Runner::new(move || {
        let backend = backend.clone();
        async move { Ok(MinkDb { backend }) }
    });
    let result = match complete {
        true => {
            runner
                .update_test_file(
                    path,
                    " ",
                    sqllogictest::default_validator,
                    sqllogictest::default_normalizer,
                    sqllogictest::strict_column_validator,
                )
                .await
        }
        false => runner.run_file_async(path).await.map_err(Into::into),
    };
    node.shutdown().await?;
    result
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let complete = args.iter().any(|arg| arg == "--complete");
    // libtest's own flags (--nocapture, --test-threads=...) are not name filters.
    let filters: Vec<String> = args
        .into_iter()
        .filter(|arg| !arg.starts_with("--"))
        .collect();
    let files = match slt_files(&filters) {
        Ok(files) => files,
        Err(error) => {
            eprintln!("cannot list the slt files: {error}");
            return ExitCode::FAILURE;
        }
    };
    let mut failed = 0;
    // Expectations are written from the embedded run only.
    let backends: &[bool] = if complete { &[false] } else { &[false, true] };
    for file in &files {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        for &flight_sql in backends {
            let through = if flight_sql { " (Flight SQL)" } else { "" };
            match run_file(file, complete, flight_sql).await {
                Ok(()) => println!("slt {name}{through} ... ok"),
                Err(error) => {
                    failed += 1;
                    println!("slt {name}{through} ... FAILED\n{error}");
                }
            }
        }
    }
    println!(
        "slt: {} files, {} runs, {failed} failed",
        files.len(),
        files.len() * backends.len()
    );
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
