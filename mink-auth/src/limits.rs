//! The bounds every port of a mink server puts on its connections, in one place
//! (`docs/security.md`, "Connection limits"). They hold before any login: a client that
//! opens connections and sends nothing, or stalls its TLS handshake, or goes away without
//! closing, must not keep the slots of the clients that come after it.
//!
//! | limit                             | value      | how |
//! |-----------------------------------|------------|-----|
//! | [`DEFAULT_MAX_CONNECTIONS`]       | 1024       | a port's connections at once (`--max-connections`): one more is closed at once |
//! | [`MAX_CONNECTIONS_PER_ADDRESS`]   | 64, at most a quarter of the port's | one address's connections at once (an IPv6 address counts with its /64): one more is closed at once; 127.0.0.1 and ::1 are exempt |
//! | [`FIRST_BYTES_TIMEOUT`]           | 10 s       | a connection that has not sent its port's first bytes by then is closed |
//! | [`GRPC_FIRST_BYTES`]              | 24         | the first bytes due on a gRPC port: the whole HTTP/2 client preface (TLS bytes on a TLS port) |
//! | [`KAFKA_FIRST_BYTES`]             | 1          | the first bytes due on the Kafka port, whose login and first-request deadline take over from there |
//! | [`HTTP1_FIRST_BYTES`]             | 1          | the first bytes due on the Iceberg REST port, whose header-read timeout takes over from there |
//! | [`TLS_HANDSHAKE_TIMEOUT`]         | 10 s       | a gRPC port's TLS handshake not done by then is dropped |
//! | [`HEADER_READ_TIMEOUT`]           | 30 s       | an HTTP port's connection that leaves a request's headers (or, idle, any request) unsent this long is closed |
//! | [`TCP_KEEPALIVE_TIME`]            | 60 s       | TCP keepalive probes on every accepted socket: a peer gone without a word is found in about 90 s |
//! | [`HTTP2_KEEPALIVE_INTERVAL`]      | 60 s       | a gRPC port pings each connection this long quiet |
//! | [`HTTP2_KEEPALIVE_TIMEOUT`]       | 20 s       | a ping not answered by then closes the connection |
//! | [`MAX_LIVE_TOKENS`]               | 65 536     | bearer tokens a port keeps (12 h each): a new one past it ends the oldest not used lately, whose client handshakes again |
//!
//! Every port takes its connections through [`crate::limit_connections`], so the
//! connection counts, the first-bytes deadline and TCP keepalive hold on each of them (the
//! node, its internal port, Flight SQL, a worker, Kafka, the Iceberg REST catalog). The
//! TLS and HTTP/2 bounds hold on the gRPC ports, whose servers come from
//! [`crate::server_builder`] and [`crate::server_tls`]; Kafka and the REST catalog time
//! their own handshakes and requests.

use std::time::Duration;

/// How many connections a port holds open at once unless told otherwise (`mink server
/// --max-connections`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// The most connections one address holds open on one port at once (fewer when the port
/// holds fewer than four times as many, see [`per_address_limit`]). mink's own processes
/// and local clients connect from 127.0.0.1 or ::1, which this does not bound.
pub const MAX_CONNECTIONS_PER_ADDRESS: usize = 64;

/// How long a new connection may take to send its port's first bytes ([`GRPC_FIRST_BYTES`],
/// [`KAFKA_FIRST_BYTES`], [`HTTP1_FIRST_BYTES`]): a gRPC client sends the HTTP/2 preface
/// (or its TLS hello) at once, a Kafka client its first request, an HTTP client its
/// request line.
pub const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);

/// The bytes a connection to a gRPC port (the node, its internal port, Flight SQL, a
/// worker) sends by [`FIRST_BYTES_TIMEOUT`]: the whole HTTP/2 client preface
/// (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`). The server's HTTP/2 handshake, which reads it,
/// has no deadline of its own and its pings start only after it, so a client that sent
/// part of it would otherwise be kept for good. On a TLS port the bytes counted are TLS
/// bytes, of which a handshake alone sends more.
pub const GRPC_FIRST_BYTES: usize = 24;

/// The bytes a connection to the Kafka port sends by [`FIRST_BYTES_TIMEOUT`]: one. A
/// Kafka request is at least 14 bytes, but from its first byte the port's own login and
/// first-request deadline hold.
pub const KAFKA_FIRST_BYTES: usize = 1;

/// The bytes a connection to the Iceberg REST port sends by [`FIRST_BYTES_TIMEOUT`]: one.
/// From its first byte the port's own header-read timeout holds.
pub const HTTP1_FIRST_BYTES: usize = 1;

/// How long a gRPC port's TLS handshake may take (Kafka and the REST catalog use 10 s
/// too).
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an accepted socket may be quiet before TCP probes its peer.
pub const TCP_KEEPALIVE_TIME: Duration = Duration::from_secs(60);
/// The time between two TCP keepalive probes.
pub const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// The probes unanswered after which TCP closes the socket.
pub const TCP_KEEPALIVE_RETRIES: u32 = 3;

/// How long a gRPC connection may be quiet before the server pings it.
pub const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
/// How long the server waits for the answer to its ping before it closes the connection.
pub const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The most bearer tokens a port keeps live at once: each handshake (and each token the
/// Iceberg REST catalog issues) adds one for 12 hours, so a client looping on handshakes
/// would otherwise grow the server's memory for as long.
pub const MAX_LIVE_TOKENS: usize = 65_536;

/// The connections one address may hold on a port of `max_connections`: at most
/// [`MAX_CONNECTIONS_PER_ADDRESS`] and at most a quarter of the port's, so one address
/// never takes a small port whole; at least one.
pub fn per_address_limit(max_connections: usize) -> usize {
    MAX_CONNECTIONS_PER_ADDRESS.min(max_connections / 4).max(1)
}

/// An HTTP port's connection (the Iceberg REST catalog, metrics) that leaves a request's
/// headers (or, idle, any request) unsent this long is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_holds_at_most_a_quarter_of_a_port_and_at_most_the_bound() {
        assert_eq!(per_address_limit(DEFAULT_MAX_CONNECTIONS), 64);
        assert_eq!(per_address_limit(8), 2);
        assert_eq!(per_address_limit(3), 1);
        assert_eq!(per_address_limit(0), 1);
        assert_eq!(per_address_limit(usize::MAX), MAX_CONNECTIONS_PER_ADDRESS);
    }
}
