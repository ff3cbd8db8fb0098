//! TLS from PEM files: a server's certificate and key, a client's certificate authority.

use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use crate::limits::TLS_HANDSHAKE_TIMEOUT;

/// A server certificate and its key, PEM-encoded.
#[derive(Clone)]
pub struct TlsIdentity {
    /// The certificate chain.
    pub certificate_pem: Vec<u8>,
    /// The private key.
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsIdentity").finish_non_exhaustive()
    }
}

/// The server side of TLS with `identity` for a gRPC port: a handshake not done within
/// [`TLS_HANDSHAKE_TIMEOUT`] is dropped, so a client that stalls it does not keep its
/// connection (tonic sets no timeout of its own).
pub fn server_tls(identity: &TlsIdentity) -> ServerTlsConfig {
    ServerTlsConfig::new()
        .identity(Identity::from_pem(
            &identity.certificate_pem,
            &identity.key_pem,
        ))
        .timeout(TLS_HANDSHAKE_TIMEOUT)
}

/// The client side: the server's certificate is checked against `ca_pem` (a PEM
/// certificate authority); without one, against the system's trusted roots.
pub fn client_tls(ca_pem: Option<&[u8]>) -> ClientTlsConfig {
    match ca_pem {
        Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)),
        None => ClientTlsConfig::new().with_native_roots(),
    }
}

/// The server side of TLS with `identity` for a port that is not gRPC (the Kafka
/// listener wraps each accepted connection with `tokio-rustls`): the same certificate
/// and key as [`server_tls`], TLS 1.2 and 1.3.
///
/// # Errors
/// A certificate or key that does not parse, or a key that does not fit the certificate.
pub fn stream_tls(identity: &TlsIdentity) -> Result<Arc<ServerConfig>, String> {
    let certificates = CertificateDer::pem_slice_iter(&identity.certificate_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the TLS certificate: {e}"))?;
    if certificates.is_empty() {
        return Err("the TLS certificate file holds no certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(&identity.key_pem)
        .map_err(|e| format!("the TLS private key: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certificates, key)
        .map_err(|e| format!("the TLS certificate and key: {e}"))?;
    Ok(Arc::new(config))
}
