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
    MAX_HEADER_LIST_BYTES, MAX_REQUESTS_PER_CONNECTION, MAX_STREAMS_PER_CONNECTION,
};
use crate::node::Node;
use crate::tiering::run_tiering;

pub use crate::flight::limits::MAX_MESSAGE_BYTES;
/// How often retention runs.
const RETENTION_INTERVAL: Duration = Duration::from_secs(30);

/// A running Flight server. Dropping it shuts the server down.
#[derive(Debug)]
pub struct ServerHandle {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    background: Vec<JoinHandle<()>>,
}

impl ServerHandle {
    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting calls and waits for running ones to finish.
    pub async fn shutdown(mut self) -> Result<()> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        for task in &self.background {
            task.abort();
        }
        match (&mut self.server).await {
            Ok(result) => result.map_err(|e| NodeError::Io(std::io::Error::other(e))),
            Err(e) => Err(NodeError::Io(std::io::Error::other(e))),
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

/// Serves `node` on `listener` until the handle is shut down or dropped.
pub fn serve(node: Arc<Node>, listener: TcpListener) -> Result<ServerHandle> {
    let addr = listener.local_addr()?;
    let (shutdown, shutdown_signal) = oneshot::channel::<()>();
    let service = FlightServiceServer::new(MinkFlightService::new(Arc::clone(&node)))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let server = tokio::spawn(
        bounded_builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming(listener), async {
                let _ = shutdown_signal.await;
            }),
    );
    let background = vec![
        tokio::spawn(run_retention(Arc::clone(&node))),
        tokio::spawn(run_tiering(node)),
    ];
    info!(%addr, "mink node serving Arrow Flight");
    Ok(ServerHandle {
        addr,
        shutdown: Some(shutdown),
        server,
        background,
    })
}

/// A server builder with the per-connection bounds of [`crate::flight::limits`]: at most
/// [`MAX_STREAMS_PER_CONNECTION`] calls open at once (announced in the HTTP/2 SETTINGS,
/// so a client's further calls wait for one to end), [`MAX_REQUESTS_PER_CONNECTION`]
/// worked on at once, headers of [`MAX_HEADER_LIST_BYTES`] at most.
fn bounded_builder() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .concurrency_limit_per_connection(MAX_REQUESTS_PER_CONNECTION)
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
}

/// Accepted connections, with Nagle's algorithm off: small answers (acks, tail polls)
/// would otherwise wait for the client's delayed ACK, about 40 ms each.
fn incoming(
    listener: TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use futures::StreamExt;
    TcpListenerStream::new(listener).map(|stream| {
        let stream = stream?;
        stream.set_nodelay(true)?;
        Ok(stream)
    })
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
