//! The Flight SQL endpoint: mink's SQL for ADBC and JDBC clients and BI tools.
//!
//! [Flight SQL] is SQL over Arrow Flight: a client sends a statement in a
//! `GetFlightInfo` call, gets back the result's schema and a ticket, and fetches the
//! rows, as Arrow record batches, with `DoGet`. The ADBC Flight SQL driver (Python, Go,
//! C, R, Java), the Arrow Flight SQL JDBC driver and the tools built on them (DBeaver,
//! BI tools through JDBC) speak it. [`serve`] runs the service on a TCP listener; `mink
//! server` serves it on `--sql-listen`.
//!
//! What it answers:
//!
//! - **Statements**, through both the query path (`GetFlightInfo` + `DoGet`, which ADBC's
//!   `cursor.execute` uses for every statement) and the update path (`DoPut`, answering
//!   a row count). Every statement [`MinkSession`](mink_sql::session::MinkSession) runs
//!   works through both: queries, DML, DDL, `CALL`. See [`statement`] for when each kind
//!   runs, and how results stream with bounded memory.
//! - **Prepared statements** with `?` or `$n` parameters and stateless handles: the SQL
//!   and the bound parameters travel in the handle, so any server answers any call
//!   ([`handle`], [`prepared`]).
//! - **Bulk ingestion** into a table, appended or upserted by the table's kind
//!   ([`ingest`]).
//! - **Metadata**: SQL info, catalogs, databases, tables with schemas, table types,
//!   primary keys, foreign keys (none), XDBC types ([`metadata`], [`sql_info`],
//!   [`sql_types`]). Every column of a table's schema and of a result carries Flight
//!   SQL's column metadata (type name, precision, scale, its table, ...), and travels
//!   in the type its table declares, never as a `Utf8View` ([`columns`], [`lineage`]).
//! - **`GetSchema` and `PollFlightInfo`**, which arrow-flight's dispatch leaves out
//!   ([`endpoint`]); **`CancelFlightInfo`** and `CancelQuery`, which stop the result
//!   streams of a FlightInfo ([`running`]).
//! - **Sessions**: `SetSessionOptions` and `CloseSession` are accepted; nothing is kept.
//! - **Authentication** with a user and password exchanged for a bearer token, and TLS
//!   ([`auth`], [`FlightSqlConfig`]).
//!
//! Whatever a call holds on its client's behalf (the message being received, bound
//! parameters, a handle or ticket sent back, the ticket answered, a batch being written)
//! is reserved in the SQL memory pool the statements draw on, while it is held: a call
//! that does not fit fails alone with `RESOURCE_EXHAUSTED` ([`memory`], [`metered`],
//! and every bound of a call in [`limits`]).
//!
//! Errors are gRPC statuses carrying the SQL error's text ([`error`]). [`client`] is the
//! other side, for `mink sql --flight-sql`.
//!
//! [Flight SQL]: https://arrow.apache.org/docs/format/FlightSql.html

mod auth;
pub mod client;
mod columns;
mod endpoint;
mod error;
mod handle;
mod ingest;
pub mod limits;
mod lineage;
mod memory;
mod metadata;
mod metered;
mod prepared;
mod recorded;
mod running;
mod service;
mod sql_info;
mod sql_types;
mod statement;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use mink_client::MinkClient;
use mink_lake::storage::LakeStorage;
use mink_sql::session::{SqlRuntime, default_memory_limit, memory_pool};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tracing::{info, warn};

pub use auth::{Credentials, TOKEN_LIFETIME};

use auth::Auth;
use endpoint::FlightSqlEndpoint;
use limits::MAX_MESSAGE_BYTES;
use metered::Metered;
use running::Stopper;
use service::MinkFlightSql;
use statement::Statements;

/// How long a shutdown waits for running calls.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// What the Flight SQL service serves, and how.
#[derive(Debug, Clone)]
pub struct FlightSqlConfig {
    /// The node whose tables are served.
    pub client: MinkClient,
    /// Where the lake's files are read.
    pub storage: LakeStorage,
    /// The user and password clients must present; `None` turns authentication off,
    /// and then only a loopback address may be served.
    pub credentials: Option<Credentials>,
    /// A PEM certificate (chain) and private key: serve TLS instead of plaintext.
    pub tls: Option<TlsIdentity>,
}

/// A server certificate and its key, PEM-encoded (the node's port takes the same).
pub use mink_auth::TlsIdentity;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Authentication is off and the address is reachable from other machines.
    #[error(transparent)]
    OpenToTheNetwork(#[from] mink_auth::OpenToTheNetwork),
    /// The listener's address could not be read.
    #[error("the Flight SQL listener: {0}")]
    Io(#[from] std::io::Error),
    /// The TLS certificate or key was refused.
    #[error("Flight SQL TLS: {0}")]
    Tls(#[from] tonic::transport::Error),
    /// The server's metadata answers could not be built (a bug).
    #[error("Flight SQL metadata: {0}")]
    Metadata(#[from] arrow_flight::error::FlightError),
    /// The SQL runtime (its memory pool, its object stores) could not be built.
    #[error("Flight SQL runtime: {0}")]
    Runtime(#[from] datafusion::error::DataFusionError),
}

/// A running Flight SQL service. Dropping it stops the service.
#[derive(Debug)]
pub struct FlightSqlHandle {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    stopper: Stopper,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl FlightSqlHandle {
    /// The address the service listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The calls running a statement now (streaming a result, updating, ingesting).
    pub fn running_statements(&self) -> usize {
        self.stopper.count()
    }

    /// [`FlightSqlHandle::shutdown_within`] [`SHUTDOWN_GRACE`].
    ///
    /// # Errors
    /// The server failed.
    pub async fn shutdown(self) -> Result<(), ServeError> {
        self.shutdown_within(SHUTDOWN_GRACE).await
    }

    /// Stops accepting calls and lets running ones finish for `grace`; then stops the
    /// statements still running (a result still being read ends with `Unavailable`) and
    /// waits for the server to close for another `grace`. A client that stopped
    /// reading holds its stream open until its connection goes: after the second wait
    /// the server stops waiting for such connections (their statements are stopped).
    ///
    /// # Errors
    /// The server failed.
    pub async fn shutdown_within(mut self, grace: Duration) -> Result<(), ServeError> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        let finished = match tokio::time::timeout(grace, &mut self.server).await {
            Ok(finished) => finished,
            Err(_) => {
                let running = self.stopper.count();
                warn!(
                    running,
                    ?grace,
                    "stopping the Flight SQL statements still running"
                );
                self.stopper.stop();
                match tokio::time::timeout(grace, &mut self.server).await {
                    Ok(finished) => finished,
                    Err(_) => {
                        warn!("Flight SQL connections still open at shutdown are left behind");
                        self.server.abort();
                        return Ok(());
                    }
                }
            }
        };
        match finished {
            Ok(result) => Ok(result?),
            Err(e) => Err(ServeError::Io(std::io::Error::other(e))),
        }
    }
}

impl Drop for FlightSqlHandle {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

/// Serves Flight SQL on `listener` until the handle is shut down or dropped.
///
/// # Errors
/// See [`ServeError`]: notably, without credentials the listener must be on a loopback
/// address.
///
/// # Examples
///
/// ```no_run
/// # async fn example(client: mink_client::MinkClient, storage: mink_lake::storage::LakeStorage)
/// # -> Result<(), Box<dyn std::error::Error>> {
/// use mink_flight_sql::{Credentials, FlightSqlConfig, serve};
///
/// let listener = tokio::net::TcpListener::bind("0.0.0.0:50051").await?;
/// let config = FlightSqlConfig {
///     client,
///     storage,
///     credentials: Some(Credentials::new("analyst", "s3cret")),
///     tls: None,
/// };
/// let handle = serve(config, listener)?;
/// println!("Flight SQL on {}", handle.addr());
/// # Ok(())
/// # }
/// ```
pub fn serve(
    config: FlightSqlConfig,
    listener: TcpListener,
) -> Result<FlightSqlHandle, ServeError> {
    let runtime = SqlRuntime::server(memory_pool(default_memory_limit()), &config.storage)?;
    serve_in(
        config,
        runtime,
        listener,
        mink_auth::DEFAULT_MAX_CONNECTIONS,
    )
}

/// [`serve`], every statement's session in `runtime`: its memory pool is the limit of
/// all the service's statements together (`mink server --sql-memory-limit`), and of
/// what every call holds on its client's behalf ([`limits`]); it
/// refuses statements that touch files unless it is a local runtime. At most
/// `max_connections` connections are open at once (`mink server --max-connections`,
/// [`mink_auth::limit_connections`]): one more is closed at once.
///
/// # Errors
/// See [`ServeError`].
pub fn serve_in(
    config: FlightSqlConfig,
    runtime: SqlRuntime,
    listener: TcpListener,
    max_connections: usize,
) -> Result<FlightSqlHandle, ServeError> {
    let addr = listener.local_addr()?;
    mink_auth::check_listen("Flight SQL", addr, config.credentials.as_ref())?;
    let auth = Arc::new(Auth::new(config.credentials));
    let authenticated = auth.is_enabled();
    let (running, stopper) = running::running();
    let pool = Arc::clone(&runtime.runtime_env().memory_pool);
    let service = MinkFlightSql::new(
        Statements::new(config.client, config.storage, runtime),
        running,
        Arc::clone(&auth),
        sql_info::sql_info(max_connections)?,
        sql_types::xdbc_types()?,
    );
    let service = FlightServiceServer::new(FlightSqlEndpoint::new(service))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let service = tonic::service::interceptor::InterceptedService::new(service, move |request| {
        auth.check(request)
    });
    let service = Metered::new(service, pool);
    let mut builder = mink_auth::server_builder()
        .max_frame_size(limits::MAX_FRAME_BYTES)
        .max_concurrent_streams(limits::MAX_STREAMS_PER_CONNECTION)
        .concurrency_limit_per_connection(limits::MAX_REQUESTS_PER_CONNECTION)
        .http2_max_header_list_size(limits::MAX_HEADER_LIST_BYTES);
    if let Some(tls) = &config.tls {
        builder = builder.tls_config(mink_auth::server_tls(tls))?;
    }
    let (shutdown, shutdown_signal) = oneshot::channel::<()>();
    let server = tokio::spawn(builder.add_service(service).serve_with_incoming_shutdown(
        mink_auth::limit_connections(
            mink_auth::Port::FlightSql,
            TcpListenerStream::new(listener),
            max_connections,
            mink_auth::GRPC_FIRST_BYTES,
        ),
        async {
            let _ = shutdown_signal.await;
        },
    ));
    let tls = config.tls.is_some();
    if authenticated {
        info!(%addr, tls, max_connections, "serving Flight SQL; clients authenticate with a user and password");
    } else {
        warn!(%addr, tls, max_connections, "serving Flight SQL without authentication (loopback only)");
    }
    Ok(FlightSqlHandle {
        addr,
        shutdown: Some(shutdown),
        stopper,
        server,
    })
}
