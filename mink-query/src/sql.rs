//! `mink sql`: SQL over mink tables, against a running node or an embedded one.
//!
//! ```text
//! mink sql [--connect HOST:PORT | --data-dir DIR] [-e SQL]... [-f FILE] [--format table|csv|json]
//! mink sql --connect HOST:PORT          # an interactive shell
//! mink sql --flight-sql [grpc://|grpc+tls://]HOST:PORT [--user U] [--tls-ca FILE] [-e SQL]...
//! ```
//!
//! `--connect` reaches a node over its own protocol (port 9123) and plans the statements
//! in this process; `--flight-sql` sends them to a Flight SQL endpoint (a `mink server`'s
//! `--sql-listen`, port 50051, or any Flight SQL server), which plans and runs them: the
//! same path ADBC and JDBC clients take. With `--user`, the password comes from
//! MINK_SQL_PASSWORD.
//!
//! With neither `-e` nor `-f`, statements are read from the interactive shell (see
//! [`crate::repl`]), or from stdin when it is not a terminal. Each `-e` statement (then
//! the statements of `-f`, separated by `;`) runs in order in one session whose default catalog is `mink` and default schema `default`: tables are
//! `t`, `db.t` or `mink.db.t`. Every table is read by union splits (see `mink-provider`),
//! so a query sees each bucket as it is when the query is planned.
//!
//! Statements are run by [`MinkSession`]: queries and DML by DataFusion, DDL and `CALL`
//! by mink.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow_flight::error::FlightError;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use mink_client::ClientError;
use mink_lake::storage::LakeStorage;
use mink_lake::{LakeConfig, S3Options};
use mink_query::flight_sql::Credentials;
use mink_query::flight_sql::client::FlightSqlConnection;
use mink_query::session::MinkSession;
use object_store::local::LocalFileSystem;

use crate::embedded::NodeArgs;
use crate::error::CliError;
use crate::output::{BatchPrinter, Format};

/// Arguments of `mink sql`.
#[derive(Debug, clap::Args)]
pub(crate) struct SqlArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// A statement to run (repeatable; they run in order).
    #[arg(short = 'e', long = "execute")]
    statements: Vec<String>,
    /// A file of statements separated by `;`, run after the `-e` ones.
    #[arg(short = 'f', long = "file")]
    file: Option<PathBuf>,
    /// How results are printed.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// A Flight SQL endpoint to send the statements to instead (`host:port`,
    /// `grpc://host:port`, or `grpc+tls://host:port`).
    #[arg(long, conflicts_with_all = ["connect", "data_dir", "lake_warehouse"])]
    flight_sql: Option<String>,
    /// The user to log in to the Flight SQL endpoint as (password from MINK_SQL_PASSWORD).
    #[arg(long, requires = "flight_sql")]
    user: Option<String>,
    /// The PEM certificate authority a `grpc+tls://` endpoint's certificate is checked
    /// against.
    #[arg(long, requires = "flight_sql")]
    tls_ca: Option<PathBuf>,
    /// The server's lake warehouse when it is on S3 (`s3://bucket/prefix`, as given to
    /// `mink server --lake-warehouse`): queries read lake files from it directly, with
    /// credentials, region and endpoint from the AWS_* environment variables. Without it
    /// lake files are read from this machine's file system (the server's embedded lake).
    #[arg(long)]
    lake_warehouse: Option<String>,
}

pub(crate) async fn run(args: SqlArgs) -> Result<(), CliError> {
    let mut statements = args.statements.clone();
    if let Some(file) = &args.file {
        let text = std::fs::read_to_string(file)
            .map_err(CliError::io(format!("reading {}", file.display())))?;
        statements.extend(split_statements(&text));
    }
    let interactive = statements.is_empty() && std::io::stdin().is_terminal();
    if statements.is_empty() && !interactive {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(CliError::io("reading statements from stdin"))?;
        statements.extend(split_statements(&text));
    }
    if let Some(address) = &args.flight_sql {
        let target = SqlTarget::FlightSql(connect_flight_sql(address, &args).await?);
        return run_all(&target, &statements, interactive, args.format).await;
    }
    let connection = args.node.connect().await?;
    let result = async {
        let storage = lake_storage(args.lake_warehouse.as_deref())?;
        let session = MinkSession::connect(connection.client.clone(), storage).await?;
        run_all(
            &SqlTarget::Session(Box::new(session)),
            &statements,
            interactive,
            args.format,
        )
        .await
    }
    .await;
    connection.close().await?;
    result
}

/// Where statements run.
#[derive(Debug)]
pub(crate) enum SqlTarget {
    /// Planned and run in this process, over a node.
    Session(Box<MinkSession>),
    /// Sent to a Flight SQL endpoint.
    FlightSql(FlightSqlConnection),
}

impl SqlTarget {
    /// The rows of a statement, as they are produced.
    async fn rows(
        &self,
        statement: &str,
    ) -> Result<BoxStream<'static, Result<RecordBatch, CliError>>, CliError> {
        Ok(match self {
            Self::Session(session) => session
                .sql(statement)
                .await?
                .execute_stream()
                .await?
                .map_err(CliError::from)
                .boxed(),
            Self::FlightSql(connection) => {
                let (_, rows) = connection.execute(statement).await.map_err(flight_error)?;
                rows.map_err(flight_error).boxed()
            }
        })
    }
}

/// Runs the statements in order, or the interactive shell.
async fn run_all(
    target: &SqlTarget,
    statements: &[String],
    interactive: bool,
    format: Format,
) -> Result<(), CliError> {
    if interactive {
        return crate::repl::run(target, format).await;
    }
    for statement in statements {
        run_statement(target, statement, format).await?;
    }
    Ok(())
}

async fn connect_flight_sql(
    address: &str,
    args: &SqlArgs,
) -> Result<FlightSqlConnection, CliError> {
    let credentials = match &args.user {
        Some(user) => {
            let password = std::env::var("MINK_SQL_PASSWORD").map_err(|_| {
                CliError::Usage("--user needs the password in MINK_SQL_PASSWORD".into())
            })?;
            Some(Credentials::new(user, password))
        }
        None => None,
    };
    let tls_ca = match &args.tls_ca {
        Some(path) => {
            Some(std::fs::read(path).map_err(CliError::io(format!("reading {}", path.display())))?)
        }
        None => None,
    };
    FlightSqlConnection::connect(address, credentials.as_ref(), tls_ca.as_deref())
        .await
        .map_err(flight_error)
}

/// A Flight SQL failure, as the server's status (`InvalidArgument: ...`) when it is one.
fn flight_error(error: FlightError) -> CliError {
    CliError::Client(ClientError::from(error))
}

/// Where the session reads lake files: the S3 warehouse, or the local file system (lake
/// locations are then absolute paths).
pub(crate) fn lake_storage(warehouse: Option<&str>) -> Result<LakeStorage, CliError> {
    let Some(warehouse) = warehouse else {
        return Ok(LakeStorage::new(Arc::new(LocalFileSystem::new()), ""));
    };
    // The catalog stays on the server: only the store is used here.
    let config = LakeConfig::s3(warehouse, String::new(), S3Options::default())
        .map_err(|e| CliError::Usage(format!("--lake-warehouse: {e}")))?;
    Ok(config.storage)
}

/// Runs one statement, printing its rows; returns how many.
pub(crate) async fn run_statement(
    target: &SqlTarget,
    statement: &str,
    format: Format,
) -> Result<usize, CliError> {
    let mut batches = target.rows(statement).await?;
    let mut printer = BatchPrinter::new(format);
    let mut rows = 0;
    while let Some(batch) = batches.try_next().await? {
        rows += batch.num_rows();
        printer.print(&batch)?;
    }
    Ok(rows)
}

/// Whether `text` ends with a `;` outside quotes (a statement typed in the shell is
/// complete).
pub(crate) fn ends_statement(text: &str) -> bool {
    let mut quote: Option<char> = None;
    let mut last = None;
    for c in text.chars() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            _ => {}
        }
        if !c.is_whitespace() {
            last = Some((c, quote.is_none()));
        }
    }
    last == Some((';', true))
}

/// The non-empty statements of a script separated by `;` (a `;` inside quotes does not
/// separate).
pub(crate) fn split_statements(text: &str) -> Vec<String> {
    let mut statements = Vec::new();
    let mut current = String::new();
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, ';') => {
                statements.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    statements.push(current);
    statements
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_split_on_semicolons_outside_quotes() {
        assert_eq!(
            split_statements("SELECT 1; SELECT ';' ;\n\n SELECT \"a;b\" FROM t;"),
            vec!["SELECT 1", "SELECT ';'", "SELECT \"a;b\" FROM t"]
        );
        assert!(split_statements(" ; ;").is_empty());
    }

    #[test]
    fn a_statement_ends_with_a_semicolon_outside_quotes() {
        assert!(ends_statement("SELECT 1;\n"));
        assert!(ends_statement("SELECT\n 1 ;  "));
        assert!(!ends_statement("SELECT ';"));
        assert!(!ends_statement("SELECT 1"));
        assert!(ends_statement("SELECT ';';"));
    }
}
