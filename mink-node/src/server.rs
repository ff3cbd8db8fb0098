//! Serving a [`Node`] over Arrow Flight on a TCP socket, with its background work
//! (retention, tiering).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tracing::{info, warn};

use crate::error::{NodeError, Result};
use crate::flight::MinkFlightService;
use crate::flight::limits::{
    MAX_FRAME_BYTES, MAX_HEADER_LIST_BYTES, MAX_MESSAGE_BYTES, MAX_REQUESTS_PER_CONNECTION,
    MAX_STREAMS_PER_CONNECTION,
};
use crate::node::Node;
use crate::tiering::{check_lake_records, run_tiering};

/// How long a shutdown waits for the calls still running.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How often retention runs.
const RETENTION_INTERVAL: Duration = Duration::from_secs(30);

/// A running Flight server. Dropping it shuts the server down.
#[derive(Debug)]
pub struct ServerHandle {
    addr: SocketAddr,
    internal_addr: Option<SocketAddr>,
    shutdown: Option<oneshot::Sender<()>>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    background: Vec<JoinHandle<()>>,
}

/// How the node's port is served: its login, its TLS and its connection limits
/// (`docs/security.md`). Both the port and the internal one take their connections
/// through [`mink_auth::limit_connections`]: at most `max_connections` at once, a share of
/// them per client address (127.0.0.1 and ::1 exempt), a first byte due within
/// [`mink_auth::FIRST_BYTES_TIMEOUT`], TCP keepalive on.
#[derive(Debug)]
pub struct ServeOptions {
    /// The user and password every call must present (or the token a `Handshake`
    /// exchanged them for). `None`: every call is accepted, and only a loopback address
    /// may be served.
    pub credentials: Option<mink_auth::Credentials>,
    /// Serve TLS with this certificate and key instead of plaintext.
    pub tls: Option<mink_auth::TlsIdentity>,
    /// A loopback listener also served, in plaintext but with the same login, for this
    /// process's own clients (the Flight SQL endpoint): they hold no certificate
    /// authority to check the node's certificate against, and clients filling the
    /// node's port up to its limit do not cut them off. It has a limit of its own, of
    /// the same size.
    pub internal: Option<TcpListener>,
    /// The most connections the port holds open at once
    /// ([`mink_auth::limit_connections`]): one more is closed at once. Default
    /// [`mink_auth::DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            credentials: None,
            tls: None,
            internal: None,
            max_connections: mink_auth::DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl ServerHandle {
    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address of [`ServeOptions::internal`], when one was given.
    pub fn internal_addr(&self) -> Option<SocketAddr> {
        self.internal_addr
    }

    /// Stops accepting calls, ends Tail sessions and waits for running calls to finish,
    /// for up to [`SHUTDOWN_GRACE`]: a client holding a call open (a DoPut it sends
    /// nothing more on) does not hold the shutdown back longer.
    pub async fn shutdown(mut self) -> Result<()> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        for task in &self.background {
            task.abort();
        }
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut self.server).await {
            Ok(Ok(result)) => result.map_err(|e| NodeError::Io(std::io::Error::other(e))),
            Ok(Err(e)) => Err(NodeError::Io(std::io::Error::other(e))),
            Err(_) => {
                warn!(grace = ?SHUTDOWN_GRACE, "calls still running at shutdown are cut off");
                Ok(())
            }
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        for task in &self.background {
            task.abort();
        }
    }
}

/// Serves `node` on `listener` until the handle is shut down or dropped, without a
/// login: `listener` must be on a loopback address.
///
/// # Errors
/// A non-loopback listener, see [`serve_with`].
pub async fn serve(node: Arc<Node>, listener: TcpListener) -> Result<ServerHandle> {
    serve_with(node, listener, ServeOptions::default()).await
}

/// Serves `node` on `listener` with `options`' login, TLS and connection limit until the
/// handle is shut down or dropped. Every call passes [`mink_auth::Auth::check`] first;
/// `Handshake` exchanges the credentials for a bearer token.
///
/// Before the first call is served, the start checks its lake records
/// ([`check_lake_records`]): a seam the lake lost (its catalog's last commits) goes back to
/// what the lake holds, so that no read plans on a snapshot the lake does not have and log
/// retention, which keeps the log from the recorded seam on, never drops rows the lake
/// does not hold.
///
/// # Errors
/// `InvalidArgument` for a listener that is not on a loopback address when no
/// credentials are configured ([`mink_auth::check_listen`]); the TLS identity refused.
pub async fn serve_with(
    node: Arc<Node>,
    listener: TcpListener,
    options: ServeOptions,
) -> Result<ServerHandle> {
    let addr = listener.local_addr()?;
    mink_auth::check_listen("the node", addr, options.credentials.as_ref())
        .map_err(|e| NodeError::InvalidArgument(e.to_string()))?;
    check_lake_records(&node).await;
    let authenticated = options.credentials.is_some();
    let auth = Arc::new(mink_auth::Auth::new(options.credentials));
    let (closing, closing_signal) = tokio::sync::watch::channel(false);
    let service = FlightServiceServer::new(
        MinkFlightService::with_auth(Arc::clone(&node), Arc::clone(&auth))
            .closing_on(closing_signal),
    )
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let checked = Arc::clone(&auth);
    let service = tonic::service::interceptor::InterceptedService::new(service, move |request| {
        checked.check(request)
    });
    let (shutdown, shutdown_signal) = oneshot::channel::<()>();
    let mut builder = bounded_builder();
    let tls = options.tls.is_some();
    if let Some(identity) = &options.tls {
        builder = builder
            .tls_config(mink_auth::server_tls(identity))
            .map_err(|e| NodeError::InvalidArgument(format!("the node's TLS: {e}")))?;
    }
    let max_connections = options.max_connections;
    let internal_addr = match options.internal {
        Some(internal) => {
            let internal_addr = internal.local_addr()?;
            mink_auth::check_listen("the node", internal_addr, None)
                .map_err(|e| NodeError::InvalidArgument(e.to_string()))?;
            let mut signal = closing.subscribe();
            tokio::spawn(
                bounded_builder()
                    .add_service(service.clone())
                    .serve_with_incoming_shutdown(
                        mink_auth::limit_connections(
                            mink_auth::Port::NodeInternal,
                            TcpListenerStream::new(internal),
                            max_connections,
                            mink_auth::GRPC_FIRST_BYTES,
                        ),
                        async move {
                            let _ = signal.wait_for(|stop| *stop).await;
                        },
                    ),
            );
            Some(internal_addr)
        }
        None => None,
    };
    let server = tokio::spawn(builder.add_service(service).serve_with_incoming_shutdown(
        mink_auth::limit_connections(
            mink_auth::Port::Node,
            TcpListenerStream::new(listener),
            max_connections,
            mink_auth::GRPC_FIRST_BYTES,
        ),
        async move {
            let _ = shutdown_signal.await;
            let _ = closing.send(true);
        },
    ));
    let background = vec![
        tokio::spawn(run_retention(Arc::clone(&node))),
        tokio::spawn(run_kv_checkpoints(Arc::clone(&node))),
        tokio::spawn(run_tiering(node)),
    ];
    if authenticated {
        info!(%addr, tls, max_connections, "mink node serving Arrow Flight; clients authenticate with a user and password");
    } else {
        warn!(%addr, tls, max_connections, "mink node serving Arrow Flight without authentication (loopback only)");
    }
    Ok(ServerHandle {
        addr,
        internal_addr,
        shutdown: Some(shutdown),
        server,
        background,
    })
}

/// A server builder with the per-connection bounds of [`crate::flight::limits`]: at most
/// [`MAX_STREAMS_PER_CONNECTION`] calls open at once (announced in the HTTP/2 SETTINGS,
/// so a client's further calls wait for one to end), [`MAX_REQUESTS_PER_CONNECTION`]
/// worked on at once, headers of [`MAX_HEADER_LIST_BYTES`] at most, frames of
/// [`MAX_FRAME_BYTES`] at most; and every gRPC port's HTTP/2 keepalive
/// ([`mink_auth::server_builder`]).
fn bounded_builder() -> tonic::transport::Server {
    mink_auth::server_builder()
        .max_frame_size(MAX_FRAME_BYTES)
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .concurrency_limit_per_connection(MAX_REQUESTS_PER_CONNECTION)
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
}

/// Writes the KV checkpoints of the node's primary-key buckets (with a log store) every
/// interval, and when one is due before.
async fn run_kv_checkpoints(node: Arc<Node>) {
    let Some(interval) = node.kv_checkpoint_interval() else {
        return;
    };
    loop {
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = node.kv_checkpoint_due() => {}
        }
        let node = Arc::clone(&node);
        if let Err(error) = tokio::task::spawn_blocking(move || node.checkpoint_kv()).await {
            warn!(%error, "the KV checkpoint task failed");
        }
    }
}

async fn run_retention(node: Arc<Node>) {
    let mut ticks = tokio::time::interval(RETENTION_INTERVAL);
    loop {
        ticks.tick().await;
        let node = Arc::clone(&node);
        match tokio::task::spawn_blocking(move || node.enforce_retention()).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => warn!(%error, "retention failed"),
            Err(error) => warn!(%error, "retention task failed"),
        }
    }
}
