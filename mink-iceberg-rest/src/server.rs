//! The REST catalog's listener: an HTTP port of mink ([`mink_auth::serve_http`]: bounded
//! connections, TLS, header-read timeout) serving the catalog's routes.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::node_tables::NodeTables;
use crate::routes::{CatalogState, router};

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
    node: Arc<dyn NodeTables>,
    listener: TcpListener,
    options: IcebergRestOptions,
) -> Result<IcebergRestHandle, ServeError> {
    let app = router(CatalogState {
        node,
        auth: mink_auth::Auth::new(options.credentials.clone()),
        file_io: options.file_io,
        creating: tokio::sync::Mutex::new(()),
    });
    let handle = mink_auth::serve_http(
        mink_auth::Port::IcebergRest,
        listener,
        options.credentials.as_ref(),
        options.tls.as_ref(),
        options.max_connections,
        app,
    )
    .map_err(ServeError::Config)?;
    let (addr, tls) = (handle.addr(), options.tls.is_some());
    if options.credentials.is_some() {
        info!(%addr, tls, "mink serving the Iceberg REST catalog; clients log in at /v1/oauth/tokens");
    } else {
        warn!(%addr, tls, "mink serving the Iceberg REST catalog without authentication (loopback only)");
    }
    Ok(handle)
}
