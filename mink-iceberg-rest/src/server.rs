//! The REST catalog's listener: connections bounded like mink's other ports, TLS
//! handshakes each in their own task (with a timeout), HTTP served by axum.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use mink_node::Node;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::TcpListenerStream;
use tracing::{debug, info, warn};

use crate::routes::{CatalogState, router};

/// A stalled TLS handshake is dropped after this long.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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
    });
    let connections = mink_auth::limit_connections(
        "the Iceberg REST catalog",
        TcpListenerStream::new(listener),
        options.max_connections,
    );
    Ok(IcebergRestHandle::spawn(addr, |stopped| async move {
        let (ready, accepted) = mpsc::channel(64);
        let mut until_stopped = stopped.clone();
        let handshakes = tokio::spawn(accept(connections, tls, ready, stopped));
        let shutdown = async move {
            let _ = until_stopped.wait_for(|stop| *stop).await;
        };
        let served = axum::serve(Accepted { addr, accepted }, app)
            .with_graceful_shutdown(shutdown)
            .await;
        if let Err(error) = served {
            warn!(%error, "the Iceberg REST catalog stopped");
        }
        handshakes.abort();
    }))
}

/// A connection ready for HTTP: plain, or TLS after its handshake.
type Connection = Pin<Box<dyn Io>>;

trait Io: AsyncRead + AsyncWrite + Send {}

impl<T: AsyncRead + AsyncWrite + Send> Io for T {}

/// Accepts connections (within the limit) and hands them to axum once ready; each TLS
/// handshake runs in its own task, so a stalled one holds up no other client.
async fn accept(
    connections: impl futures::Stream<Item = std::io::Result<mink_auth::LimitedConnection>>,
    tls: Option<TlsAcceptor>,
    ready: mpsc::Sender<(Connection, SocketAddr)>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut connections = std::pin::pin!(connections);
    while let Some(connection) =
        mink_auth::next_connection("the Iceberg REST catalog", &mut connections, &mut stopped).await
    {
        let Ok(peer) = connection.peer_addr() else {
            continue;
        };
        let ready = ready.clone();
        let Some(acceptor) = tls.clone() else {
            let _ = ready.send((Box::pin(connection), peer)).await;
            continue;
        };
        tokio::spawn(async move {
            match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(connection)).await {
                Ok(Ok(stream)) => {
                    let _ = ready.send((Box::pin(stream), peer)).await;
                }
                Ok(Err(error)) => debug!(%error, "an Iceberg REST client's TLS handshake failed"),
                Err(_) => debug!("an Iceberg REST client's TLS handshake timed out"),
            }
        });
    }
}

/// The connections [`accept`] made ready, as axum's listener.
struct Accepted {
    addr: SocketAddr,
    accepted: mpsc::Receiver<(Connection, SocketAddr)>,
}

impl axum::serve::Listener for Accepted {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(connection) => connection,
            // The acceptor stopped: so does serving, through the graceful shutdown.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}
