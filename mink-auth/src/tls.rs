//! TLS from PEM files: a server's certificate and key, a client's certificate authority.

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

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

/// The server side of TLS with `identity`.
pub fn server_tls(identity: &TlsIdentity) -> ServerTlsConfig {
    ServerTlsConfig::new().identity(Identity::from_pem(
        &identity.certificate_pem,
        &identity.key_pem,
    ))
}

/// The client side: the server's certificate is checked against `ca_pem` (a PEM
/// certificate authority); without one, against the system's trusted roots.
pub fn client_tls(ca_pem: Option<&[u8]>) -> ClientTlsConfig {
    match ca_pem {
        Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)),
        None => ClientTlsConfig::new().with_native_roots(),
    }
}
