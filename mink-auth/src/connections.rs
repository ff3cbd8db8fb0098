//! A bound on the connections one port holds open at once, so a client cannot open
//! thousands of them (each with its own HTTP/2 streams, buffers and file descriptor) and
//! take the server's memory or descriptors from everyone else.
//!
//! ```text
//!  listener ──accept──> a permit left? ──yes──> LimitedConnection { stream, permit } ──> tonic
//!                            │                  (TLS, HTTP/2; the permit returns when the
//!                            │                   connection ends and tonic drops it)
//!                            └──no──> closed at once; a warning at most once a second,
//!                                     with the count refused since the last one
//! ```
//!
//! A connection over the limit is accepted and closed rather than left in the kernel's
//! backlog: the accept loop never waits, the client sees its connection end at once
//! instead of hanging until a deadline, and the connections within the limit are served
//! as before. The permit sits below TLS (tonic's `tls_config` wraps the
//! [`LimitedConnection`]), so a client that stalls its TLS handshake holds a permit too.
//!
//! Every connection admitted also has Nagle's algorithm turned off: small answers (an
//! ack, a FlightInfo, a one-row result) would otherwise wait for the client's delayed
//! ACK, about 40 ms each.
//!
//! The ports tonic does not serve (Kafka, the Iceberg REST catalog) run their accept loop
//! under a [`ListenerHandle`], which stops it on `shutdown` or drop.
//!
//! # Examples
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! use futures::StreamExt;
//! use mink_auth::{DEFAULT_MAX_CONNECTIONS, limit_connections};
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let accepted = futures::stream::unfold(listener, |listener| async move {
//!     let next = listener.accept().await.map(|(stream, _)| stream);
//!     Some((next, listener))
//! });
//! // Give this to tonic's `Server::serve_with_incoming`.
//! let mut incoming = Box::pin(limit_connections("the node", accepted, DEFAULT_MAX_CONNECTIONS));
//! let _first = incoming.next().await;
//! # Ok(())
//! # }
//! ```

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt, future};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError, watch};
use tokio::task::JoinHandle;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tracing::warn;

/// How many connections a port holds open at once unless told otherwise (`mink server
/// --max-connections`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// The least time between two warnings about refused connections.
const WARN_INTERVAL: Duration = Duration::from_secs(1);

/// The connections of `accepted` (a listener's accepted streams), at most
/// `max_connections` open at once: each comes with a permit it holds until it is
/// dropped, and one accepted while none is left is closed at once (logged at most once
/// a second). Errors of `accepted` pass through. `port` names the port in the log
/// (`the node`, `Flight SQL`).
pub fn limit_connections<S>(
    port: &'static str,
    accepted: S,
    max_connections: usize,
) -> impl Stream<Item = io::Result<LimitedConnection>>
where
    S: Stream<Item = io::Result<TcpStream>>,
{
    let permits = Arc::new(Semaphore::new(max_connections.min(Semaphore::MAX_PERMITS)));
    let mut refusals = Refusals::default();
    accepted.filter_map(move |accepted| {
        let admitted = match accepted {
            Err(error) => Some(Err(error)),
            Ok(stream) => match Arc::clone(&permits).try_acquire_owned() {
                Ok(permit) => Some(stream.set_nodelay(true).map(|()| LimitedConnection {
                    stream,
                    _permit: permit,
                })),
                Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => {
                    refusals.refuse(port, max_connections, stream.peer_addr().ok());
                    drop(stream);
                    None
                }
            },
        };
        future::ready(admitted)
    })
}

/// An accepted connection holding one of its port's permits until it is dropped.
#[derive(Debug)]
pub struct LimitedConnection {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl LimitedConnection {
    /// The address of the connection's other end.
    pub fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.stream.peer_addr()
    }
}

impl Connected for LimitedConnection {
    type ConnectInfo = TcpConnectInfo;

    /// The TCP stream's: the remote address stays visible to the services.
    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for LimitedConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for LimitedConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// The connections refused since the last warning, and when that was.
#[derive(Debug, Default)]
struct Refusals {
    unreported: u64,
    last_warned: Option<Instant>,
}

impl Refusals {
    fn refuse(&mut self, port: &'static str, max_connections: usize, peer: Option<SocketAddr>) {
        self.unreported += 1;
        let now = Instant::now();
        if self
            .last_warned
            .is_some_and(|warned| now.duration_since(warned) < WARN_INTERVAL)
        {
            return;
        }
        warn!(
            port,
            max_connections,
            refused = self.unreported,
            last_peer = ?peer,
            "{port} holds its {max_connections} connections (--max-connections): closed new ones at once"
        );
        self.unreported = 0;
        self.last_warned = Some(now);
    }
}

/// A port's running accept loop, stopped by [`ListenerHandle::shutdown`] or by dropping
/// the handle.
#[derive(Debug)]
pub struct ListenerHandle {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl ListenerHandle {
    /// Spawns `serve`, which is handed a receiver that turns `true` when the port is to
    /// stop (it then returns soon after).
    pub fn spawn<F>(addr: SocketAddr, serve: impl FnOnce(watch::Receiver<bool>) -> F) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(serve(stopped));
        Self { addr, stop, task }
    }

    /// The address the port is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting connections and waits for the accept loop to end.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = (&mut { self }.task).await;
    }
}

impl Drop for ListenerHandle {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// The next connection of a port's [`limit_connections`] stream, or `None` once the port
/// is to stop (`stopped` turned `true`) or its listener ended. A connection that failed
/// to open is logged (at debug, naming `service`) and skipped.
pub async fn next_connection(
    service: &str,
    connections: &mut (impl Stream<Item = io::Result<LimitedConnection>> + Unpin),
    stopped: &mut watch::Receiver<bool>,
) -> Option<LimitedConnection> {
    loop {
        tokio::select! {
            _ = stopped.wait_for(|stop| *stop) => return None,
            next = connections.next() => match next? {
                Ok(connection) => return Some(connection),
                Err(error) => tracing::debug!(%error, "a connection to {service} failed to open"),
            },
        }
    }
}

/// Spawns the serving of one connection, ended early (the connection dropped) when the
/// port is to stop.
pub fn spawn_until_stopped(
    stopped: &watch::Receiver<bool>,
    serve: impl Future<Output = ()> + Send + 'static,
) {
    let mut stop = stopped.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.wait_for(|stop| *stop) => {}
            () = serve => {}
        }
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::task::JoinSet;

    use super::*;

    /// How long a test waits for the server before failing (never reached when it works).
    const PATIENCE: Duration = Duration::from_secs(10);

    /// The accepted streams of `listener`.
    fn accepted(listener: TcpListener) -> impl Stream<Item = io::Result<TcpStream>> {
        futures::stream::unfold(listener, |listener| async move {
            let next = listener.accept().await.map(|(stream, _)| stream);
            Some((next, listener))
        })
    }

    /// An echo server on 127.0.0.1:0 holding at most `max` connections; aborting the
    /// task drops its connections.
    async fn echo_server(max: usize) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let mut incoming =
                Box::pin(limit_connections("the test port", accepted(listener), max));
            let mut connections = JoinSet::new();
            while let Some(connection) = incoming.next().await {
                let mut connection = connection.unwrap();
                connections.spawn(async move {
                    let mut byte = [0u8; 1];
                    while let Ok(1) = connection.read(&mut byte).await {
                        if connection.write_all(&byte).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        (addr, server)
    }

    /// Whether the server answers a byte on `stream` (false: it closed the connection).
    async fn echoes(stream: &mut TcpStream) -> bool {
        let mut byte = [0u8; 1];
        if stream.write_all(b"x").await.is_err() {
            return false;
        }
        let read = tokio::time::timeout(PATIENCE, stream.read(&mut byte))
            .await
            .expect("the server neither answered nor closed the connection");
        matches!(read, Ok(1))
    }

    #[tokio::test]
    async fn a_connection_over_the_limit_is_closed_and_a_freed_permit_serves_the_next() {
        let (addr, server) = echo_server(2).await;
        let mut first = TcpStream::connect(addr).await.unwrap();
        let mut second = TcpStream::connect(addr).await.unwrap();
        assert!(echoes(&mut first).await);
        assert!(echoes(&mut second).await);

        // Both permits are held: the third connection is closed without a byte sent.
        let mut third = TcpStream::connect(addr).await.unwrap();
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(PATIENCE, third.read(&mut byte))
            .await
            .expect("the connection over the limit was left open");
        assert!(
            matches!(read, Ok(0) | Err(_)),
            "the third connection read {read:?}"
        );
        // The held ones are served as before.
        assert!(echoes(&mut first).await);

        // Dropping one frees its permit once the server sees it closed.
        drop(first);
        let mut attempts = 0;
        let mut next = loop {
            let mut next = TcpStream::connect(addr).await.unwrap();
            if echoes(&mut next).await {
                break next;
            }
            attempts += 1;
            assert!(
                attempts < 100,
                "no permit came back after a connection closed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(echoes(&mut second).await);
        assert!(echoes(&mut next).await);
        server.abort();
    }

    #[tokio::test]
    async fn an_admitted_connection_keeps_its_addresses_and_has_no_delay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = Box::pin(limit_connections("the test port", accepted(listener), 1));
        let client = TcpStream::connect(addr).await.unwrap();
        let connection = incoming.next().await.unwrap().unwrap();
        let info = connection.connect_info();
        assert_eq!(info.remote_addr(), Some(client.local_addr().unwrap()));
        assert_eq!(info.local_addr(), Some(addr));
        assert!(connection.stream.nodelay().unwrap());
    }

    #[tokio::test]
    async fn no_permits_refuses_every_connection_and_accept_errors_pass_through() {
        let refused = futures::stream::iter([Err(io::Error::other("EMFILE"))]);
        let mut incoming = Box::pin(limit_connections("the test port", refused, 0));
        let error = incoming.next().await.unwrap().unwrap_err();
        assert_eq!(error.to_string(), "EMFILE");

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = Box::pin(limit_connections("the test port", accepted(listener), 0));
        let admitted = tokio::spawn(async move { incoming.next().await.map(|next| next.is_ok()) });
        let mut client = TcpStream::connect(addr).await.unwrap();
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(PATIENCE, client.read(&mut byte))
            .await
            .expect("the refused connection was left open");
        assert!(matches!(read, Ok(0) | Err(_)), "read {read:?}");
        assert!(
            !admitted.is_finished(),
            "a connection was admitted without a permit"
        );
        admitted.abort();
    }
}
