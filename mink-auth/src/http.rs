//! The HTTP/1.1 ports (the Iceberg REST catalog, metrics and the status page): their
//! connections bounded like every port's ([`limit_connections`]), each served in its own
//! task: a TLS handshake first (within [`TLS_HANDSHAKE_TIMEOUT`]), then HTTP/1.1 by
//! hyper until the client closes, the port stops, or the client leaves a request's
//! headers unsent for [`HEADER_READ_TIMEOUT`] (an idle connection too).

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::TcpListenerStream;
use tracing::debug;

use crate::limits::{HEADER_READ_TIMEOUT, HTTP1_FIRST_BYTES, TLS_HANDSHAKE_TIMEOUT};
use crate::{
    Credentials, LimitedConnection, ListenerHandle, Port, TlsIdentity, check_listen,
    limit_connections, next_connection, spawn_until_stopped, stream_tls,
};

/// Serves `app` on `listener` as `port` until the handle is dropped: HTTPS with `tls`,
/// at most `max_connections` at once. `credentials` is the port's login (the app checks
/// it); without one, only a loopback address is served.
///
/// # Errors
/// A non-loopback listener without credentials, a TLS identity that does not load, or a
/// listener whose address cannot be read, as a message naming the port.
pub fn serve_http(
    port: Port,
    listener: TcpListener,
    credentials: Option<&Credentials>,
    tls: Option<&TlsIdentity>,
    max_connections: usize,
    app: Router,
) -> Result<ListenerHandle, String> {
    let addr = listener
        .local_addr()
        .map_err(|e| format!("{port}'s listener: {e}"))?;
    check_listen(port.name(), addr, credentials).map_err(|e| e.to_string())?;
    let tls = tls
        .map(|identity| stream_tls(identity).map(TlsAcceptor::from))
        .transpose()
        .map_err(|e| format!("{port}'s TLS: {e}"))?;
    let connections = limit_connections(
        port,
        TcpListenerStream::new(listener),
        max_connections,
        HTTP1_FIRST_BYTES,
    );
    Ok(ListenerHandle::spawn(addr, |stopped| {
        accept(port, connections, tls, app, stopped)
    }))
}

async fn accept(
    port: Port,
    connections: impl futures::Stream<Item = std::io::Result<LimitedConnection>>,
    tls: Option<TlsAcceptor>,
    app: Router,
    mut stopped: watch::Receiver<bool>,
) {
    let mut connections = std::pin::pin!(connections);
    while let Some(connection) = next_connection(port.name(), &mut connections, &mut stopped).await
    {
        spawn_until_stopped(&stopped, serve_one(connection, tls.clone(), app.clone()));
    }
}

async fn serve_one(connection: LimitedConnection, tls: Option<TlsAcceptor>, app: Router) {
    let Some(acceptor) = tls else {
        return serve_connection(connection, app).await;
    };
    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(connection)).await {
        Ok(Ok(stream)) => serve_connection(stream, app).await,
        Ok(Err(error)) => debug!(%error, "an HTTP client's TLS handshake failed"),
        Err(_) => debug!("an HTTP client's TLS handshake timed out"),
    }
}

async fn serve_connection<S>(stream: S, app: Router)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app))
        .await;
    if let Err(error) = served {
        debug!(%error, "an HTTP connection ended");
    }
}
