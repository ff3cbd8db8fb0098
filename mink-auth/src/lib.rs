//! One login for every port of a mink server: the node's Flight service (`--listen`) and
//! the Flight SQL endpoint (`--sql-listen`) take the same user and password, exchanged
//! for a bearer token, and the same TLS certificate.
//!
//! ```text
//! client                                   server
//!   Handshake   authorization: Basic base64(user:password)
//!                                      ->  checks the credentials
//!               authorization: Bearer T <- a new random token T (also the payload)
//!   any call    authorization: Bearer T ->  checks T
//! ```
//!
//! - [`Auth`] is the server side: [`Auth::check`] is the tonic interceptor every call
//!   passes through, [`Auth::handshake_response`] answers `Handshake` with a token.
//! - [`login`] and [`basic_header`] are the client side: a handshake with basic
//!   credentials, answered by the bearer token every later call carries;
//!   [`CLIENT_MAX_FRAME_BYTES`] the HTTP/2 frames mink's clients take.
//! - [`server_tls`] and [`client_tls`] build tonic's TLS configuration from PEM files;
//!   [`stream_tls`] the same certificate for a port that is not gRPC (Kafka).
//! - [`check_listen`] is the rule for a server without credentials: it listens on a
//!   loopback address only, so nothing on the network reaches it unauthenticated.
//! - [`limit_connections`] bounds the connections a port holds open at once
//!   ([`DEFAULT_MAX_CONNECTIONS`]) and those of one address
//!   ([`MAX_CONNECTIONS_PER_ADDRESS`], 127.0.0.1 and ::1 exempt), below TLS; one over a
//!   bound is accepted and closed at once, so one client cannot open thousands and the
//!   accept loop never waits. A connection that has not sent its port's first bytes
//!   ([`GRPC_FIRST_BYTES`], [`KAFKA_FIRST_BYTES`], [`HTTP1_FIRST_BYTES`]) within
//!   [`FIRST_BYTES_TIMEOUT`] is closed, and TCP keepalive finds vanished peers.
//! - [`server_builder`] is where every gRPC port's server starts: HTTP/2 keepalive
//!   pings. [`limits`] holds every bound of this crate.
//!
//! This is what the ADBC Flight SQL driver (`username` / `password` options) and the
//! Flight SQL JDBC driver (`user` / `password` properties) do, so both ports answer them.

mod addresses;
mod client;
mod connections;
mod grpc;
mod http;
pub mod limits;
mod ports;
mod server;
mod tls;

use std::net::SocketAddr;

pub use client::{AUTHORIZATION, CLIENT_MAX_FRAME_BYTES, basic_header, bearer_header, login};
pub use connections::{
    LimitedConnection, ListenerHandle, limit_connections, next_connection, spawn_until_stopped,
};
pub use grpc::server_builder;
pub use http::serve_http;
pub use limits::{
    DEFAULT_MAX_CONNECTIONS, FIRST_BYTES_TIMEOUT, GRPC_FIRST_BYTES, HEADER_READ_TIMEOUT,
    HTTP1_FIRST_BYTES, KAFKA_FIRST_BYTES, MAX_CONNECTIONS_PER_ADDRESS, TLS_HANDSHAKE_TIMEOUT,
};
pub use ports::Port;
pub use server::{Auth, HandshakeStream, TOKEN_LIFETIME, attach_token, basic_credentials};
pub use tls::{TlsIdentity, client_tls, server_tls, stream_tls};

/// The user and password a client must present.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    user: String,
    password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// A user and its password.
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            user: user.into(),
            password: password.into(),
        }
    }

    /// The user.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The password.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// Whether `given` are these credentials. The comparison does not stop at the first
    /// byte that differs, so its time does not tell a guesser how much of a guess was
    /// right (only the lengths show). A refusal is counted (`mink_logins_refused_total`)
    /// and logged, at most once a second with the count since the last line.
    pub fn accepts(&self, given: &Credentials) -> bool {
        let accepted = same_bytes(self.user.as_bytes(), given.user.as_bytes())
            & same_bytes(self.password.as_bytes(), given.password.as_bytes());
        if !accepted {
            refused_login();
        }
        accepted
    }
}

/// Counts and (at most once a second) logs a refused login.
fn refused_login() {
    static REFUSALS: std::sync::Mutex<connections::Refusals> =
        std::sync::Mutex::new(connections::Refusals::new());
    mink_metrics::metrics().logins_refused.inc();
    let mut refusals = REFUSALS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(refused) = refusals.refuse() {
        tracing::warn!(refused, "refused logins: wrong user or password");
    }
}

fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// A server that would be reachable from the network without a login.
#[derive(Debug, thiserror::Error)]
#[error(
    "{service} on {addr} would be open to the network without authentication: listen on a \
     loopback address (127.0.0.1) or configure a user and password (--sql-user with \
     MINK_SQL_PASSWORD)"
)]
pub struct OpenToTheNetwork {
    /// What would be served (`the node`, `Flight SQL`).
    pub service: &'static str,
    /// The address asked for.
    pub addr: SocketAddr,
}

/// The loopback rule: without credentials, `addr` must be a loopback address.
///
/// # Errors
/// [`OpenToTheNetwork`] for a non-loopback address (`0.0.0.0`, a LAN address) without
/// credentials.
///
/// # Examples
///
/// ```
/// use mink_auth::{Credentials, check_listen};
///
/// let any = "0.0.0.0:9123".parse().unwrap();
/// assert!(check_listen("the node", any, None).is_err());
/// assert!(check_listen("the node", any, Some(&Credentials::new("ann", "pw"))).is_ok());
/// assert!(check_listen("the node", "127.0.0.1:9123".parse().unwrap(), None).is_ok());
/// ```
pub fn check_listen(
    service: &'static str,
    addr: SocketAddr,
    credentials: Option<&Credentials>,
) -> Result<(), OpenToTheNetwork> {
    if credentials.is_none() && !addr.ip().is_loopback() {
        return Err(OpenToTheNetwork { service, addr });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_print_the_password() {
        let shown = format!("{:?}", Credentials::new("ann", "s3cret"));
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn without_credentials_only_loopback_is_served() {
        let login = Credentials::new("ann", "pw");
        for open in ["0.0.0.0:1", "[::]:1", "192.168.1.2:1"] {
            let addr = open.parse().unwrap();
            let refused = check_listen("the node", addr, None).unwrap_err();
            assert!(refused.to_string().contains(open), "{refused}");
            assert!(check_listen("the node", addr, Some(&login)).is_ok());
        }
        for loopback in ["127.0.0.1:1", "[::1]:1"] {
            assert!(check_listen("the node", loopback.parse().unwrap(), None).is_ok());
        }
    }
}
