//! The REST catalog's listener: connections bounded like mink's other ports, each served
//! in its own task (a TLS handshake with a timeout, then HTTP/1.1 by hyper with a
//! header-read timeout, so a client that connects and sends nothing is let go).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use mink_node::Node;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::TcpListenerStream;
use tracing::{debug, info, warn};

use crate::routes::{CatalogState, router};

/// A stalled TLS handshake is dropped after this long.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection that leaves a request's headers (or, idle, any request) unsent this long
/// is closed.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How the REST catalog is served.
#[derive(Debug)]
pub struct IcebergRestOptions {
    /// The client id and secret of the token endpoint and so of every request; `None`:
    /// no login, and only a loopback address may be served.
    pub credentials: Option<mink_auth::Credentials>,
    /// Serve HTTPS with this certificate and key.
    pub tls: Option<mink_auth::TlsIdentity>,
    /// The most connections the port holds open at once.
    pub max_connections: usize,
    /// The file IO properties a loaded table's `config` hands to clients (an S3
    /// endpoint and region; never the server's own keys).
    pub file_io: HashMap<String, String>,
}

impl Default for IcebergRestOptions {
    fn default() -> Self {
        Self {
            credentials: None,
            tls: None,
            max_connections: mink_auth::DEFAULT_MAX_CONNECTIONS,
            file_io: HashMap::new(),
        }
    }
}

/// Why the catalog could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A configuration that cannot be served (an open port without a login, a bad
    /// certificate).
    #[error("{0}")]
    Config(String),
    /// The listening socket.
    #[error("the Iceberg REST listener: {0}")]
    Io(#[from] std::io::Error),
}

/// A running REST catalog; dropping it stops accepting connections.
pub type IcebergRestHandle = mink_auth::ListenerHandle;

/// Serves the Iceberg REST catalog of `node`'s lake on `listener` until the handle is
/// dropped.
///
/// # Errors
/// [`ServeError::Config`] for a non-loopback listener without credentials or a TLS
/// identity that does not load.
pub fn serve(
    node: Arc<Node>,
    listener: TcpListener,
    options: IcebergRestOptions,
) -> Result<IcebergRestHandle, ServeError> {
    let addr = listener.local_addr()?;
    mink_auth::check_listen(
        "the Iceberg REST catalog",
        addr,
        options.credentials.as_ref(),
    )
    .map_err(|e| ServeError::Config(e.to_string()))?;
    let tls = options
        .tls
        .as_ref()
        .map(|identity| mink_auth::stream_tls(identity).map(TlsAcceptor::from))
        .transpose()
        .map_err(|e| ServeError::Config(format!("the Iceberg REST catalog's TLS: {e}")))?;
    if options.credentials.is_some() {
        info!(%addr, tls = tls.is_some(), "mink serving the Iceberg REST catalog; clients log in at /v1/oauth/tokens");
    } else {
        warn!(%addr, tls = tls.is_some(), "mink serving the Iceberg REST catalog without authentication (loopback only)");
    }
    let app = router(CatalogState {
        node,
        auth: mink_auth::Auth::new(options.credentials),
        file_io: options.file_io,
        creating: tokio::sync::Mutex::new(()),
    });
    let connections = mink_auth::limit_connections(
        "the Iceberg REST catalog",
        TcpListenerStream::new(listener),
        options.max_connections,
        mink_auth::HTTP1_FIRST_BYTES,
    );
    Ok(IcebergRestHandle::spawn(addr, |stopped| {
        accept(connections, tls, app, stopped)
    }))
}

/// Accepts connections (within the limit) and serves each in its own task: a TLS
/// handshake first (within [`TLS_HANDSHAKE_TIMEOUT`]), then HTTP/1.1 until the client
/// closes, the port stops, or the client leaves a request's headers unsent for
/// [`HEADER_READ_TIMEOUT`] (an idle connection too).
async fn accept(
    connections: impl futures::Stream<Item = std::io::Result<mink_auth::LimitedConnection>>,
    tls: Option<TlsAcceptor>,
    app: Router,
    mut stopped: watch::Receiver<bool>,
) {
    let mut connections = std::pin::pin!(connections);
    while let Some(connection) =
        mink_auth::next_connection("the Iceberg REST catalog", &mut connections, &mut stopped).await
    {
        let serve = serve_one(connection, tls.clone(), app.clone());
        mink_auth::spawn_until_stopped(&stopped, serve);
    }
}

async fn serve_one(
    connection: mink_auth::LimitedConnection,
    tls: Option<TlsAcceptor>,
    app: Router,
) {
    let Some(acceptor) = tls else {
        return serve_http(connection, app).await;
    };
    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(connection)).await {
        Ok(Ok(stream)) => serve_http(stream, app).await,
        Ok(Err(error)) => debug!(%error, "an Iceberg REST client's TLS handshake failed"),
        Err(_) => debug!("an Iceberg REST client's TLS handshake timed out"),
    }
}

async fn serve_http<S>(stream: S, app: Router)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app))
        .await;
    if let Err(error) = served {
        debug!(%error, "an Iceberg REST connection ended");
    }
}
