//! Bounds on the connections one port holds open, so a client cannot open thousands of
//! them (each with its own HTTP/2 streams, buffers and file descriptor) and take the
//! server's memory or descriptors from everyone else, nor keep the slots of the clients
//! after it by opening connections and sending nothing.
//!
//! ```text
//!  listener ──accept──> its address's share left? ──yes──> a permit left? ──yes──┐
//!                         (127.0.0.1, ::1 exempt)                                │
//!                              │ no                         │ no                 │
//!                              └────> closed at once; a warning at most once a   │
//!                                     second, with the count refused since        │
//!                                                                                 v
//!      LimitedConnection { stream, permit, address slot, first-bytes deadline } ──> tonic
//!      (TLS, HTTP/2; the permit and the slot return when the connection ends and
//!       tonic drops it; its port's first bytes not all in within FIRST_BYTES_TIMEOUT:
//!       its reads fail, it closes)
//! ```
//!
//! A connection over a limit is accepted and closed rather than left in the kernel's
//! backlog: the accept loop never waits, the client sees its connection end at once
//! instead of hanging until a deadline, and the connections within the limits are served
//! as before. The permit sits below TLS (tonic's `tls_config` wraps the
//! [`LimitedConnection`]), so a client that stalls its TLS handshake holds a permit too,
//! until the handshake's own timeout ([`crate::server_tls`]) or the first-bytes deadline
//! ends it.
//!
//! Three things end the connections of clients that do nothing (`crate::limits`):
//! - the **first-bytes deadline**: a connection whose port's first bytes have not all
//!   arrived [`FIRST_BYTES_TIMEOUT`] after it was accepted fails its reads, and the server
//!   above closes it. Every client mink serves speaks first (the HTTP/2 preface, a TLS
//!   hello, a Kafka request, an HTTP request line), so no honest one waits that long. How
//!   many bytes are due is the port's: a gRPC port wants the whole 24-byte HTTP/2 preface
//!   ([`GRPC_FIRST_BYTES`]), since the HTTP/2 handshake that reads it has no deadline of
//!   its own and a client that sent one byte of it would be kept for good; Kafka and the
//!   REST catalog want one ([`KAFKA_FIRST_BYTES`], [`HTTP1_FIRST_BYTES`]), their own
//!   request deadlines taking over from there. On a TLS port the bytes are TLS bytes,
//!   so there the deadline ends a connection that stalls before or in its handshake, not
//!   one that completes it and sends no preface;
//! - **TCP keepalive** on every accepted socket, so a peer that vanished (a crash, a NAT
//!   that forgot the flow) is found and its connection closed;
//! - the **per-address share** (`crate::addresses`): what one client does at most, it
//!   does to its own share of the port.
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
//! use mink_auth::{DEFAULT_MAX_CONNECTIONS, GRPC_FIRST_BYTES, Port, limit_connections};
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let accepted = futures::stream::unfold(listener, |listener| async move {
//!     let next = listener.accept().await.map(|(stream, _)| stream);
//!     Some((next, listener))
//! });
//! // Give this to tonic's `Server::serve_with_incoming`.
//! let mut incoming = Box::pin(limit_connections(
//!     Port::Node,
//!     accepted,
//!     DEFAULT_MAX_CONNECTIONS,
//!     GRPC_FIRST_BYTES,
//! ));
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
use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinHandle;
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tracing::{debug, warn};

use crate::Port;
use crate::addresses::{AddressCounts, AddressSlot};
use crate::limits::{
    FIRST_BYTES_TIMEOUT, TCP_KEEPALIVE_INTERVAL, TCP_KEEPALIVE_RETRIES, TCP_KEEPALIVE_TIME,
    per_address_limit,
};
#[cfg(doc)]
use crate::limits::{GRPC_FIRST_BYTES, HTTP1_FIRST_BYTES, KAFKA_FIRST_BYTES};

/// The least time between two warnings about refused connections.
const WARN_INTERVAL: Duration = Duration::from_secs(1);

/// The connections of `accepted` (a listener's accepted streams), at most
/// `max_connections` open at once and at most [`per_address_limit`] of them from one
/// address other than 127.0.0.1 and ::1: each comes with a permit (and its address's
/// slot) it holds until it is dropped, and one accepted over a limit is closed at once
/// (logged at most once a second). Each admitted one must send its first `first_bytes`
/// bytes (the port's: [`GRPC_FIRST_BYTES`], [`KAFKA_FIRST_BYTES`], [`HTTP1_FIRST_BYTES`])
/// within [`FIRST_BYTES_TIMEOUT`] and has TCP keepalive on. Errors of `accepted` pass
/// through. Each connection accepted, refused and open is counted under `port`'s label
/// (`mink_connections_*`).
pub fn limit_connections<S>(
    port: Port,
    accepted: S,
    max_connections: usize,
    first_bytes: usize,
) -> impl Stream<Item = io::Result<LimitedConnection>>
where
    S: Stream<Item = io::Result<TcpStream>>,
{
    let due = FirstBytesDue {
        bytes: first_bytes,
        within: FIRST_BYTES_TIMEOUT,
    };
    limit_with_deadline(port, accepted, max_connections, due)
}

/// [`limit_connections`] with `due` as the first bytes each connection owes.
fn limit_with_deadline<S>(
    port: Port,
    accepted: S,
    max_connections: usize,
    due: FirstBytesDue,
) -> impl Stream<Item = io::Result<LimitedConnection>>
where
    S: Stream<Item = io::Result<TcpStream>>,
{
    let mut gate = Gate {
        port,
        max_connections,
        permits: Arc::new(Semaphore::new(max_connections.min(Semaphore::MAX_PERMITS))),
        addresses: AddressCounts::new(per_address_limit(max_connections)),
        port_full: Refusals::new(),
        address_full: Refusals::new(),
    };
    accepted.filter_map(move |accepted| {
        let admitted = match accepted {
            Err(error) => Some(Err(error)),
            Ok(stream) => gate
                .admit(&stream)
                .map(|(permit, slot)| LimitedConnection::open(stream, permit, slot, due, port)),
        };
        future::ready(admitted)
    })
}

/// What a port's accepted connections pass: its permits, its addresses' shares, and the
/// refusals to report.
#[derive(Debug)]
struct Gate {
    port: Port,
    max_connections: usize,
    permits: Arc<Semaphore>,
    addresses: Arc<AddressCounts>,
    port_full: Refusals,
    address_full: Refusals,
}

impl Gate {
    /// The permit and address slot `stream` is admitted with, or `None` (the stream is
    /// then dropped, closing it) when its address holds its share, the port holds all its
    /// permits, or the peer is already gone.
    fn admit(&mut self, stream: &TcpStream) -> Option<(OwnedSemaphorePermit, Option<AddressSlot>)> {
        let port = self.port;
        let peer = match stream.peer_addr() {
            Ok(peer) => peer,
            Err(error) => {
                debug!(%port, %error, "an accepted connection ended before it was admitted");
                return None;
            }
        };
        let metrics = mink_metrics::metrics();
        let Ok(slot) = self.addresses.admit(peer.ip()) else {
            (metrics.connections_refused)
                .with_label_values(&[port.label(), "address_share"])
                .inc();
            if let Some(refused) = self.address_full.refuse() {
                let share = per_address_limit(self.max_connections);
                warn!(
                    %port, share, refused, last_peer = %peer,
                    "an address holds its {share} connections to {port}: closed its new ones at once"
                );
            }
            return None;
        };
        let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
            (metrics.connections_refused)
                .with_label_values(&[port.label(), "port_full"])
                .inc();
            if let Some(refused) = self.port_full.refuse() {
                let max_connections = self.max_connections;
                warn!(
                    %port, max_connections, refused, last_peer = %peer,
                    "{port} holds its {max_connections} connections (--max-connections): closed new ones at once"
                );
            }
            return None;
        };
        metrics.connections.with_label_values(&[port.label()]).inc();
        Some((permit, slot))
    }
}

/// `port`'s count of open connections, one higher.
fn opened(port: Port) -> mink_metrics::prometheus::IntGauge {
    let open = (mink_metrics::metrics().connections_open).with_label_values(&[port.label()]);
    open.inc();
    open
}

/// The first bytes a port's connections owe: how many, and how long after the accept.
#[derive(Debug, Clone, Copy)]
struct FirstBytesDue {
    bytes: usize,
    within: Duration,
}

/// A connection's first bytes still to come, and when they are due.
#[derive(Debug)]
struct FirstBytes {
    missing: usize,
    deadline: Pin<Box<Sleep>>,
}

/// An accepted connection holding one of its port's permits (and its address's slot)
/// until it is dropped. Its reads fail with `TimedOut` once its first-bytes deadline
/// passes before its port's first bytes have all been read.
#[derive(Debug)]
pub struct LimitedConnection {
    stream: TcpStream,
    first_bytes: Option<FirstBytes>,
    _permit: OwnedSemaphorePermit,
    _address: Option<AddressSlot>,
    /// Its port's count of open connections, one lower when it is dropped.
    open: mink_metrics::prometheus::IntGauge,
}

impl Drop for LimitedConnection {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl LimitedConnection {
    /// `stream` admitted with `permit` and `address`: Nagle off, TCP keepalive on, the
    /// first bytes `due`.
    fn open(
        stream: TcpStream,
        permit: OwnedSemaphorePermit,
        address: Option<AddressSlot>,
        due: FirstBytesDue,
        port: Port,
    ) -> io::Result<Self> {
        stream.set_nodelay(true)?;
        let keepalive = TcpKeepalive::new()
            .with_time(TCP_KEEPALIVE_TIME)
            .with_interval(TCP_KEEPALIVE_INTERVAL)
            .with_retries(TCP_KEEPALIVE_RETRIES);
        SockRef::from(&stream).set_tcp_keepalive(&keepalive)?;
        Ok(Self {
            stream,
            first_bytes: Some(FirstBytes {
                missing: due.bytes,
                deadline: Box::pin(tokio::time::sleep(due.within)),
            }),
            _permit: permit,
            _address: address,
            open: opened(port),
        })
    }

    /// The address of the connection's other end.
    pub fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.stream.peer_addr()
    }

    /// The error of a read once the first-bytes deadline has passed with some of the
    /// first bytes still missing, `None` before it or once they have all come.
    fn past_first_bytes(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        let first = self.first_bytes.as_mut()?;
        let missing = first.missing;
        first.deadline.as_mut().poll(cx).is_ready().then(|| {
            debug!(
                peer = ?self.stream.peer_addr().ok(), missing,
                "a connection did not send its first bytes in time: closed"
            );
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client's first bytes were {missing} short at its first-bytes deadline"
                ),
            )
        })
    }

    /// Counts `read` bytes against the first bytes due; once they have all come, the
    /// deadline is gone.
    fn count_first_bytes(&mut self, read: usize) {
        let Some(first) = self.first_bytes.as_mut() else {
            return;
        };
        first.missing = first.missing.saturating_sub(read);
        if first.missing == 0 {
            self.first_bytes = None;
        }
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
        let this = self.get_mut();
        if let Some(late) = this.past_first_bytes(cx) {
            return Poll::Ready(Err(late));
        }
        let filled = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        this.count_first_bytes(buf.filled().len() - filled);
        read
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

/// The refusals (connections, logins) since the last warning, and when that was.
#[derive(Debug)]
pub(crate) struct Refusals {
    unreported: u64,
    last_warned: Option<Instant>,
}

impl Refusals {
    pub(crate) const fn new() -> Self {
        Self {
            unreported: 0,
            last_warned: None,
        }
    }

    /// Counts one more refusal: the count to report when a warning is due (none this past
    /// [`WARN_INTERVAL`]), else `None`.
    pub(crate) fn refuse(&mut self) -> Option<u64> {
        self.unreported += 1;
        let now = Instant::now();
        if self
            .last_warned
            .is_some_and(|warned| now.duration_since(warned) < WARN_INTERVAL)
        {
            return None;
        }
        self.last_warned = Some(now);
        Some(std::mem::take(&mut self.unreported))
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
    use crate::limits::GRPC_FIRST_BYTES;

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
        let due = FirstBytesDue {
            bytes: 1,
            within: FIRST_BYTES_TIMEOUT,
        };
        echo_server_with(max, due).await
    }

    /// [`echo_server`] whose connections owe `due`.
    async fn echo_server_with(
        max: usize,
        due: FirstBytesDue,
    ) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let mut incoming = Box::pin(limit_with_deadline(
                Port::Node,
                accepted(listener),
                max,
                due,
            ));
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

    /// Whether the server has closed `stream` (read end of file or an error) within
    /// [`PATIENCE`].
    async fn closed(stream: &mut TcpStream) -> bool {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(PATIENCE, stream.read(&mut byte))
            .await
            .expect("the server neither answered nor closed the connection");
        matches!(read, Ok(0) | Err(_))
    }

    /// A connection to `addr` from the local address `from` (any of 127.0.0.0/8).
    async fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::new(from.parse().unwrap(), 0))
            .unwrap();
        socket.connect(addr).await.unwrap()
    }

    /// A first-bytes deadline of 300 ms for `bytes` bytes.
    fn due_soon(bytes: usize) -> FirstBytesDue {
        FirstBytesDue {
            bytes,
            within: Duration::from_millis(300),
        }
    }

    #[tokio::test]
    async fn a_silent_connection_is_closed_at_its_deadline_and_one_that_spoke_stays() {
        let (addr, server) = echo_server_with(4, due_soon(1)).await;
        let mut spoke = TcpStream::connect(addr).await.unwrap();
        assert!(echoes(&mut spoke).await);
        let mut silent = TcpStream::connect(addr).await.unwrap();
        assert!(closed(&mut silent).await, "the silent connection was kept");
        // Long past the deadline, the connection that spoke is served as before.
        assert!(echoes(&mut spoke).await);
        server.abort();
    }

    #[tokio::test]
    async fn a_connection_short_of_its_first_bytes_is_closed_at_its_deadline() {
        // The port wants 24 bytes (an HTTP/2 preface) within 300 ms.
        let (addr, server) = echo_server_with(4, due_soon(24)).await;
        let mut one_byte = TcpStream::connect(addr).await.unwrap();
        assert!(echoes(&mut one_byte).await, "the first byte was not served");
        let mut whole = TcpStream::connect(addr).await.unwrap();
        for _ in 0..24 {
            assert!(echoes(&mut whole).await);
        }
        assert!(
            closed(&mut one_byte).await,
            "a connection that sent 1 of its 24 first bytes was kept"
        );
        // Long past the deadline, the connection that sent all 24 is served as before.
        assert!(echoes(&mut whole).await);
        server.abort();
    }

    #[tokio::test]
    async fn an_address_over_its_share_is_closed_and_loopback_one_is_still_served() {
        // A port of 8 connections: one address holds at most 2.
        let (addr, server) = echo_server(8).await;
        let mut first = connect_from("127.0.0.2", addr).await;
        let mut second = connect_from("127.0.0.2", addr).await;
        assert!(echoes(&mut first).await && echoes(&mut second).await);
        let mut third = connect_from("127.0.0.2", addr).await;
        assert!(
            closed(&mut third).await,
            "a third connection from one address was kept"
        );
        // Another address has its own share; 127.0.0.1 is not counted.
        let mut other = connect_from("127.0.0.3", addr).await;
        assert!(echoes(&mut other).await);
        let mut locals = Vec::new();
        for _ in 0..3 {
            let mut local = TcpStream::connect(addr).await.unwrap();
            assert!(echoes(&mut local).await);
            locals.push(local);
        }
        // A connection of the address closed gives its place back.
        drop(first);
        let mut attempts = 0;
        while !echoes(&mut connect_from("127.0.0.2", addr).await).await {
            attempts += 1;
            assert!(attempts < 100, "the address's place never came back");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server.abort();
    }

    #[tokio::test]
    async fn an_admitted_connection_keeps_its_addresses_and_has_no_delay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = Box::pin(limit_connections(
            Port::Node,
            accepted(listener),
            1,
            GRPC_FIRST_BYTES,
        ));
        let client = TcpStream::connect(addr).await.unwrap();
        let connection = incoming.next().await.unwrap().unwrap();
        let info = connection.connect_info();
        assert_eq!(info.remote_addr(), Some(client.local_addr().unwrap()));
        assert_eq!(info.local_addr(), Some(addr));
        assert!(connection.stream.nodelay().unwrap());
        assert!(SockRef::from(&connection.stream).keepalive().unwrap());
        assert_eq!(
            SockRef::from(&connection.stream)
                .tcp_keepalive_time()
                .unwrap(),
            TCP_KEEPALIVE_TIME
        );
    }

    #[tokio::test]
    async fn no_permits_refuses_every_connection_and_accept_errors_pass_through() {
        let refused = futures::stream::iter([Err(io::Error::other("EMFILE"))]);
        let mut incoming = Box::pin(limit_connections(Port::Node, refused, 0, GRPC_FIRST_BYTES));
        let error = incoming.next().await.unwrap().unwrap_err();
        assert_eq!(error.to_string(), "EMFILE");

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = Box::pin(limit_connections(
            Port::Node,
            accepted(listener),
            0,
            GRPC_FIRST_BYTES,
        ));
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
