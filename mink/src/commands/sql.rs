//! `mink sql`: SQL over mink tables, through a running server or an embedded node.
//!
//! ```text
//! mink sql [--connect ADDRESS | --data-dir DIR] [-e SQL]... [-f FILE] [--format table|csv|json]
//!          [--user U] [--tls-ca FILE] [--lake-warehouse s3://bucket/prefix]
//! mink sql --connect ADDRESS            # an interactive shell
//! ```
//!
//! `--connect` takes either endpoint of a running `mink server`:
//!
//! - its **Flight SQL endpoint** (`--sql-listen`, port 50051), or any Flight SQL server:
//!   the statements are sent there and the server plans and runs them, the path ADBC and
//!   JDBC clients take.
//! - the **node** itself (`--listen`, port 9123), over mink's own Flight protocol: the
//!   statements are planned and run in this process by [`MinkSession`], which reads lake
//!   files itself (from `--lake-warehouse` on S3, else from this machine's file system).
//!
//! Both take the same login: `--user` (the password comes from MINK_PASSWORD, or
//! MINK_SQL_PASSWORD) and `--tls-ca`, the PEM authority the server's certificate is
//! checked against (a plain `host:port` is then reached over TLS; `grpc+tls://` without
//! `--tls-ca` trusts the system's roots). `grpc://host:port` and `grpc+tls://host:port`
//! name a Flight SQL endpoint. A plain `host:port` is asked once, after logging in (both
//! endpoints answer `Handshake` alike, so the answer does not hang on the login):
//!
//! ```text
//! Handshake (with --user)            -> refused                  the login's error
//! GetFlightInfo(CommandGetSqlInfo)   -> answered                 Flight SQL
//!                                    -> Unimplemented            the node (its Flight service has no GetFlightInfo)
//!                                    -> Unauthenticated          no --user, and the server requires one: an error saying so
//!                                    -> anything else, or no     an error naming the address
//!                                       answer within 10 s
//! ```
//!
//! `--flight-sql ADDRESS` is an alias of `--connect` that takes the address as a Flight
//! SQL endpoint without asking. `--lake-warehouse` goes with a node only: a Flight SQL
//! endpoint's server reads its own lake, so with one it is a usage error.
//!
//! With neither `-e` nor `-f`, statements are read from the interactive shell (see
//! [`crate::repl`]), or from stdin when it is not a terminal. Each `-e` statement (then
//! the statements of `-f`, separated by `;`) runs in order. Against a node they run in
//! one session whose default catalog is `mink` and default schema `default`: tables are
//! `t`, `db.t` or `mink.db.t`, and every table is read by union splits (see
//! `mink-sql`), so a query sees each bucket as it is when the query is planned.
//! [`MinkSession`] runs them: queries and DML by DataFusion, DDL and `CALL` by mink. A
//! Flight SQL server runs each statement in a session of its own.
//!
//! A session here is the user's own, over their own files: DataFusion's `COPY ... TO`
//! and `CREATE EXTERNAL TABLE` work (a server refuses them, see `docs/security.md`), and
//! its statements share a memory pool of half the machine's memory.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow_flight::error::FlightError;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use mink_client::ClientError;
use mink_flight_sql::client::FlightSqlConnection;
use mink_lake::storage::LakeStorage;
use mink_lake::{LakeConfig, S3Options};
use mink_sql::session::{MinkSession, SqlRuntime, default_memory_limit};
use object_store::local::LocalFileSystem;
use tonic::Code;

use crate::embedded::{DEFAULT_DATA_DIR, LoginArgs, NodeArgs};
use crate::error::CliError;
use crate::output::{BatchPrinter, Format};

/// How long the probe of a plain `--connect host:port` may take, connection included.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Arguments of `mink sql`.
#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("endpoint").args(["connect", "flight_sql"]))]
pub(crate) struct SqlArgs {
    /// A running server to send the statements to: its Flight SQL endpoint (port 50051;
    /// or any Flight SQL server) or its node (port 9123), told apart by one probe.
    /// `grpc://host:port` and `grpc+tls://host:port` are Flight SQL without a probe.
    #[arg(long, value_name = "ADDRESS", conflicts_with = "data_dir")]
    connect: Option<String>,
    /// Data directory of a node to run inside this command (default ./mink-data).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// A statement to run (repeatable; they run in order).
    #[arg(short = 'e', long = "execute")]
    statements: Vec<String>,
    /// A file of statements separated by `;`, run after the `-e` ones.
    #[arg(short = 'f', long = "file")]
    file: Option<PathBuf>,
    /// How results are printed.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Alias of `--connect` that takes the address as a Flight SQL endpoint, without a
    /// probe (`host:port`, `grpc://host:port`, or `grpc+tls://host:port`).
    #[arg(long, value_name = "ADDRESS", conflicts_with_all = ["connect", "data_dir", "lake_warehouse"])]
    flight_sql: Option<String>,
    /// The user to log in as, to a node or a Flight SQL endpoint (password from
    /// MINK_PASSWORD, or MINK_SQL_PASSWORD).
    #[arg(long, requires = "endpoint")]
    user: Option<String>,
    /// Connect with TLS, checking the server's certificate against this PEM certificate
    /// authority (`grpc+tls://` without it: the system's trusted roots).
    #[arg(long, requires = "endpoint")]
    tls_ca: Option<PathBuf>,
    /// With a node's address or `--data-dir` only: the server's lake warehouse when it is
    /// on S3 (`s3://bucket/prefix`, as given to `mink server --lake-warehouse`). Queries
    /// read lake files from it directly, with credentials, region and endpoint from the
    /// AWS_* environment variables. Without it lake files are read from this machine's
    /// file system (the server's embedded lake). A Flight SQL endpoint's server reads its
    /// own lake.
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
    let node = match endpoint(&args).await? {
        Endpoint::FlightSql(connection) => {
            let target = SqlTarget::FlightSql(connection);
            return run_all(&target, &statements, interactive, args.format).await;
        }
        Endpoint::Node(node) => node,
    };
    let connection = node.connect().await?;
    let result = async {
        let storage = match (&args.lake_warehouse, &args.connect) {
            // The embedded node's lake, as its data directory remembers it.
            (None, None) => {
                let data_dir = args
                    .data_dir
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
                let lake = LakeConfig::of_data_dir(&data_dir)
                    .map_err(|e| CliError::Usage(e.to_string()))?;
                warehouse_storage(&lake.warehouse)?
            }
            (warehouse, _) => lake_storage(warehouse.as_deref())?,
        };
        // This user's own session: DataFusion's COPY and external tables work over
        // this machine's files, as the user's own (a server refuses them).
        let runtime = SqlRuntime::local(default_memory_limit())?;
        let session = MinkSession::connect_in(connection.client.clone(), storage, &runtime).await?;
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

/// Where the statements go, once the arguments are understood.
#[derive(Debug)]
enum Endpoint {
    /// A Flight SQL endpoint, connected (and logged in to, with `--user`).
    FlightSql(FlightSqlConnection),
    /// A node at an address, or embedded over a data directory.
    Node(NodeArgs),
}

/// How `--connect ADDRESS` is reached, decided before anything is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// A Flight SQL endpoint: a `grpc://` family scheme.
    FlightSql,
    /// The node's own protocol: a URL of another scheme (`http://host:port`).
    Node,
    /// A plain `host:port`: one probe tells.
    Probe,
}

/// How `address` is reached (a login does not change it: both endpoints take one).
fn route(address: &str) -> Route {
    match address.split_once("://") {
        Some(("grpc" | "grpc+tcp" | "grpc+tls", _)) => Route::FlightSql,
        Some(_) => Route::Node,
        None => Route::Probe,
    }
}

/// The endpoint the arguments name: `--flight-sql`, `--connect` (probed when it is a
/// plain `host:port`), or the embedded node over `--data-dir`.
async fn endpoint(args: &SqlArgs) -> Result<Endpoint, CliError> {
    if let Some(address) = &args.flight_sql {
        return Ok(Endpoint::FlightSql(
            connect_flight_sql(address, args).await?,
        ));
    }
    let node = |connect: Option<&String>| {
        Endpoint::Node(NodeArgs {
            connect: connect.cloned(),
            data_dir: args.data_dir.clone(),
            login: login_args(args),
        })
    };
    let Some(address) = &args.connect else {
        return Ok(node(None));
    };
    let connection = match route(address) {
        Route::Node => return Ok(node(Some(address))),
        Route::FlightSql => {
            refuse_lake_warehouse(address, args)?;
            connect_flight_sql(address, args).await?
        }
        Route::Probe => match probe(address, args).await? {
            Probed::Node => return Ok(node(Some(address))),
            Probed::FlightSql(connection) => {
                refuse_lake_warehouse(address, args)?;
                connection
            }
            Probed::NeedsLogin => {
                refuse_lake_warehouse(address, args)?;
                return Err(CliError::Endpoint {
                    address: address.clone(),
                    reason: "a server that requires a login: pass --user USER, with the \
                             password in MINK_PASSWORD"
                        .into(),
                });
            }
        },
    };
    Ok(Endpoint::FlightSql(connection))
}

/// `--lake-warehouse` is for a node's address: a Flight SQL endpoint's server reads its
/// own lake.
fn refuse_lake_warehouse(address: &str, args: &SqlArgs) -> Result<(), CliError> {
    match &args.lake_warehouse {
        Some(_) => Err(CliError::Usage(format!(
            "--lake-warehouse goes with a node's address, and {address} is a Flight SQL \
             endpoint: its server plans the statements and reads its own lake (drop \
             --lake-warehouse, or --connect to the node's address, port 9123 by default)"
        ))),
        None => Ok(()),
    }
}

/// What answered the probe of a plain `host:port`.
#[derive(Debug)]
enum Probed {
    /// A Flight SQL endpoint, connected without a login.
    FlightSql(FlightSqlConnection),
    /// A server that requires a login, and none was given.
    NeedsLogin,
    /// A plain Flight service that does not know Flight SQL: a mink node.
    Node,
}

/// Asks `address` once what it is (see [`FlightSqlConnection::ping`]), logged in with
/// the arguments' login when there is one, within [`PROBE_TIMEOUT`].
async fn probe(address: &str, args: &SqlArgs) -> Result<Probed, CliError> {
    let login = login_args(args);
    let credentials = login.credentials()?;
    let tls_ca = login.tls_ca()?;
    let ask = async {
        let connection =
            FlightSqlConnection::connect(address, credentials.as_ref(), tls_ca.as_deref()).await?;
        connection.ping().await.map(|()| connection)
    };
    let failure = |reason: String| CliError::Endpoint {
        address: address.to_string(),
        reason,
    };
    let Ok(answer) = tokio::time::timeout(PROBE_TIMEOUT, ask).await else {
        return Err(failure(format!(
            "no answer within {} s (is it a mink server's address?)",
            PROBE_TIMEOUT.as_secs()
        )));
    };
    match answer {
        Ok(connection) => Ok(Probed::FlightSql(connection)),
        Err(FlightError::Tonic(status)) => match status.code() {
            Code::Unimplemented => Ok(Probed::Node),
            Code::Unauthenticated if credentials.is_none() => Ok(Probed::NeedsLogin),
            // A refused login.
            Code::Unauthenticated => Err(flight_error(FlightError::Tonic(status))),
            // Whatever else it is, it is neither endpoint this command speaks to.
            code => Err(failure(format!(
                "answers neither as a Flight SQL endpoint nor as a mink node: {code}: {}",
                status.message()
            ))),
        },
        Err(error) => Err(failure(connect_failure(&error))),
    }
}

/// Why a connection could not be made, with the transport error's whole chain
/// (`transport error: tcp connect error: Connection refused (os error 111)`).
fn connect_failure(error: &FlightError) -> String {
    let FlightError::ExternalError(source) = error else {
        return format!("cannot connect: {error}");
    };
    let mut reason = format!("cannot connect: {source}");
    let mut cause = std::error::Error::source(source.as_ref());
    while let Some(error) = cause {
        // hyper and tonic wrap an error in one that says the same.
        let text = error.to_string();
        if !reason.ends_with(&text) {
            reason.push_str(": ");
            reason.push_str(&text);
        }
        cause = error.source();
    }
    reason
}

async fn connect_flight_sql(
    address: &str,
    args: &SqlArgs,
) -> Result<FlightSqlConnection, CliError> {
    let login = login_args(args);
    let credentials = login.credentials()?;
    let tls_ca = login.tls_ca()?;
    FlightSqlConnection::connect(address, credentials.as_ref(), tls_ca.as_deref())
        .await
        .map_err(|error| match error {
            // A mink node before logins answered the handshake `Unimplemented`.
            FlightError::Tonic(status) if status.code() == Code::Unimplemented => {
                CliError::Endpoint {
                    address: address.to_string(),
                    reason: "a mink node, not a Flight SQL endpoint: connect to the server's \
                             --sql-listen address (port 50051 by default), or to this one \
                             without a grpc:// scheme"
                        .into(),
                }
            }
            // The server answered: a refused login.
            FlightError::Tonic(_) => flight_error(error),
            FlightError::ExternalError(_)
            | FlightError::ProtocolError(_)
            | FlightError::Arrow(_)
            | FlightError::NotYetImplemented(_)
            | FlightError::DecodeError(_) => CliError::Endpoint {
                address: address.to_string(),
                reason: connect_failure(&error),
            },
        })
}

/// The login `mink sql` was given, as every client command takes it.
fn login_args(args: &SqlArgs) -> LoginArgs {
    LoginArgs {
        user: args.user.clone(),
        tls_ca: args.tls_ca.clone(),
    }
}

/// A Flight SQL failure, as the server's status (`InvalidArgument: ...`) when it is one.
fn flight_error(error: FlightError) -> CliError {
    CliError::Client(ClientError::from(error))
}

/// Where a session reads the lake's files when it knows the warehouse: the S3 warehouse,
/// or a store rooted at the local warehouse directory (nothing else of the disk).
pub(crate) fn warehouse_storage(warehouse: &str) -> Result<LakeStorage, CliError> {
    match warehouse.starts_with("s3://") {
        true => lake_storage(Some(warehouse)),
        false => LakeStorage::local(warehouse)
            .map_err(|e| CliError::Usage(format!("the lake warehouse: {e}"))),
    }
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
    Ok(config.storage.with_warehouse(config.warehouse))
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
    fn a_plain_address_is_probed_and_a_scheme_or_a_login_decides() {
        assert_eq!(route("127.0.0.1:50051"), Route::Probe);
        assert_eq!(route("db.example.com:9123"), Route::Probe);
        assert_eq!(route("grpc://127.0.0.1:50051"), Route::FlightSql);
        assert_eq!(route("grpc+tcp://127.0.0.1:50051"), Route::FlightSql);
        assert_eq!(route("grpc+tls://db.example.com:50051"), Route::FlightSql);
        assert_eq!(route("http://127.0.0.1:9123"), Route::Node);
    }

    #[test]
    fn a_connect_failure_carries_the_transport_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("{0}")]
        struct Wrapper(&'static str, #[source] Option<Box<Wrapper>>);
        let refused = Wrapper("connection refused", None);
        let connect = Wrapper("tcp connect error", Some(Box::new(refused)));
        let again = Wrapper("tcp connect error", Some(Box::new(connect)));
        let transport = Wrapper("transport error", Some(Box::new(again)));
        let error = FlightError::ExternalError(Box::new(transport));
        assert_eq!(
            connect_failure(&error),
            "cannot connect: transport error: tcp connect error: connection refused"
        );
        let error = FlightError::ProtocolError("unknown scheme http://".into());
        assert_eq!(
            connect_failure(&error),
            "cannot connect: Protocol error: unknown scheme http://"
        );
    }

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
