//! What a gRPC port's tonic server starts with, so every one (the node, its internal
//! port, Flight SQL, a worker) ends dead and silent connections the same way.
//!
//! tonic's own `tcp_keepalive` and `tcp_nodelay` apply only to the listener it binds
//! itself; mink's ports hand it [`crate::limit_connections`]' connections instead, which
//! set both on each socket they admit. What is left to the server is HTTP/2's own
//! keepalive: a connection quiet for [`HTTP2_KEEPALIVE_INTERVAL`] is pinged, and one that
//! does not answer within [`HTTP2_KEEPALIVE_TIMEOUT`] is closed.

use tonic::transport::Server;

use crate::limits::{HTTP2_KEEPALIVE_INTERVAL, HTTP2_KEEPALIVE_TIMEOUT};

/// A tonic server builder with HTTP/2 keepalive pings; each port adds its own bounds
/// (frame, stream and header sizes) and its TLS ([`crate::server_tls`]).
pub fn server_builder() -> Server {
    Server::builder()
        .http2_keepalive_interval(Some(HTTP2_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(HTTP2_KEEPALIVE_TIMEOUT))
}
