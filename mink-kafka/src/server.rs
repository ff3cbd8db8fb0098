//! The Kafka listener: accepting connections (bounded, optionally TLS) and serving each
//! in its own task.

use std::net::SocketAddr;
use std::sync::Arc;

use mink_node::Node;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::TcpListenerStream;
use tracing::{debug, info, warn};

use crate::broker::Broker;
use crate::connection::serve_connection;
use crate::limits::TLS_HANDSHAKE_TIMEOUT;

/// How the Kafka port is served.
#[derive(Debug)]
pub struct KafkaOptions {
    /// The address `Metadata` and `FindCoordinator` name as every partition's leader
    /// and every group's coordinator: what clients connect to after their first
    /// request. `None`: the listen address (refused when it is unspecified, 0.0.0.0).
    pub advertised: Option<String>,
    /// The user and password SASL/PLAIN must present; `None`: no login, and only a
    /// loopback address may be served.
    pub credentials: Option<mink_auth::Credentials>,
    /// Serve TLS with this certificate and key.
    pub tls: Option<mink_auth::TlsIdentity>,
    /// The most connections the port holds open at once.
    pub max_connections: usize,
}

impl Default for KafkaOptions {
    fn default() -> Self {
        Self {
            advertised: None,
            credentials: None,
            tls: None,
            max_connections: mink_auth::DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// Why the listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A configuration that cannot be served (an open port without a login, an
    /// unusable advertised address, a bad certificate).
    #[error("{0}")]
    Config(String),
    /// The listening socket.
    #[error("the Kafka listener: {0}")]
    Io(#[from] std::io::Error),
}

/// The consumer group lag of a Kafka listener, for metrics scrapes (`crate::lag`).
#[derive(Debug, Clone)]
pub struct GroupLag(Arc<Broker>);

impl GroupLag {
    /// The lag now, as a metric family.
    pub async fn scraped_metrics(&self) -> mink_metrics::prometheus::proto::MetricFamily {
        crate::lag::group_lag(&self.0).await
    }
}

/// A running Kafka listener; dropping it stops accepting connections.
#[derive(Debug)]
pub struct KafkaHandle {
    listener: mink_auth::ListenerHandle,
    advertised: String,
    broker: Arc<Broker>,
}

impl KafkaHandle {
    /// The address the listener is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.listener.addr()
    }

    /// What a metrics scrape reads of the listener: its consumer groups' lag.
    pub fn group_lag(&self) -> GroupLag {
        GroupLag(Arc::clone(&self.broker))
    }

    /// The address clients are told to connect to.
    pub fn advertised(&self) -> &str {
        &self.advertised
    }

    /// Stops accepting connections and closes the open ones.
    pub async fn shutdown(self) {
        self.listener.shutdown().await;
    }
}

/// Serves Kafka clients for `node` on `listener` until the handle is dropped.
///
/// # Errors
/// [`ServeError::Config`] for a non-loopback listener without credentials, an advertised
/// address that is unspecified or not `HOST:PORT`, a TLS identity that does not load, or
/// (in a cluster) an etcd that does not answer.
pub async fn serve(
    node: Arc<Node>,
    listener: TcpListener,
    options: KafkaOptions,
) -> Result<KafkaHandle, ServeError> {
    let addr = listener.local_addr()?;
    mink_auth::check_listen(
        mink_auth::Port::Kafka.name(),
        addr,
        options.credentials.as_ref(),
    )
    .map_err(|e| ServeError::Config(e.to_string()))?;
    let advertised = match options.advertised {
        Some(advertised) => advertised,
        None if addr.ip().is_unspecified() => {
            return Err(ServeError::Config(format!(
                "the Kafka listener on {addr} needs --kafka-advertised HOST:PORT: clients \
                 cannot connect to an unspecified address"
            )));
        }
        None => addr.to_string(),
    };
    let broker = Arc::new(Broker::new(node, &advertised, options.credentials).await?);
    let tls = options
        .tls
        .as_ref()
        .map(|identity| mink_auth::stream_tls(identity).map(TlsAcceptor::from))
        .transpose()
        .map_err(|e| ServeError::Config(format!("the Kafka listener's TLS: {e}")))?;
    if broker.requires_login() {
        info!(%addr, %advertised, tls = tls.is_some(), "mink serving Kafka; clients log in with SASL/PLAIN");
    } else {
        warn!(%addr, %advertised, tls = tls.is_some(), "mink serving Kafka without authentication (loopback only)");
    }
    let connections = mink_auth::limit_connections(
        mink_auth::Port::Kafka,
        TcpListenerStream::new(listener),
        options.max_connections,
        mink_auth::KAFKA_FIRST_BYTES,
    );
    let serving = Arc::clone(&broker);
    let listener = mink_auth::ListenerHandle::spawn(addr, |stopped| {
        accept(connections, serving, tls, stopped)
    });
    Ok(KafkaHandle {
        listener,
        advertised,
        broker,
    })
}

async fn accept(
    connections: impl futures::Stream<Item = std::io::Result<mink_auth::LimitedConnection>>,
    broker: Arc<Broker>,
    tls: Option<TlsAcceptor>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut connections = std::pin::pin!(connections);
    while let Some(connection) = mink_auth::next_connection(
        mink_auth::Port::Kafka.name(),
        &mut connections,
        &mut stopped,
    )
    .await
    {
        let serve = serve_one(connection, Arc::clone(&broker), tls.clone());
        mink_auth::spawn_until_stopped(&stopped, serve);
    }
}

async fn serve_one(
    connection: mink_auth::LimitedConnection,
    broker: Arc<Broker>,
    tls: Option<TlsAcceptor>,
) {
    match tls {
        None => run(connection, broker).await,
        Some(acceptor) => {
            match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(connection)).await {
                Ok(Ok(stream)) => run(stream, broker).await,
                Ok(Err(error)) => debug!(%error, "a Kafka client's TLS handshake failed"),
                Err(_) => debug!("a Kafka client's TLS handshake timed out"),
            }
        }
    }
}

async fn run<S: AsyncRead + AsyncWrite + Unpin>(stream: S, broker: Arc<Broker>) {
    if let Err(error) = serve_connection(stream, broker).await {
        debug!(%error, "Kafka connection closed");
    }
}
