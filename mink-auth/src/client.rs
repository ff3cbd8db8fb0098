//! The client side: the `authorization` headers a client sends, the handshake that
//! exchanges a user and password for a bearer token, and the HTTP/2 frames a client takes.

use arrow_flight::HandshakeRequest;
use arrow_flight::flight_service_client::FlightServiceClient;
use base64::Engine;
use base64::alphabet::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use tonic::Status;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;

use crate::Credentials;

/// The header credentials and tokens travel in.
pub const AUTHORIZATION: &str = "authorization";

/// The largest HTTP/2 frame mink's clients take (their `SETTINGS_MAX_FRAME_SIZE`; HTTP/2's
/// default is 16 KiB): a server sends a Flight batch of a few MiB in a few frames rather
/// than hundreds, which made a Scan 1.3x (from the log cache) to 1.4x (from segments) as
/// fast (docs/benchmarks.md). What a server may have in flight is still bounded by the
/// client's receive windows, not by this.
pub const CLIENT_MAX_FRAME_BYTES: u32 = 1 << 20;

/// Base64 with or without padding: the Go Flight client (ADBC's driver) sends
/// credentials unpadded, the Rust and Java ones padded.
pub(crate) const BASE64: GeneralPurpose = GeneralPurpose::new(
    &STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// `Basic base64(user:password)`.
///
/// # Errors
/// `InvalidArgument`: the user or password does not fit in a header.
pub fn basic_header(credentials: &Credentials) -> Result<AsciiMetadataValue, Status> {
    let encoded = BASE64.encode(format!("{}:{}", credentials.user(), credentials.password()));
    format!("Basic {encoded}")
        .parse()
        .map_err(|_| Status::invalid_argument("the user and password do not fit in a header"))
}

/// `Bearer <token>`.
///
/// # Errors
/// `Internal`: the token is not a valid header value.
pub fn bearer_header(token: &str) -> Result<AsciiMetadataValue, Status> {
    format!("Bearer {token}")
        .parse()
        .map_err(|_| Status::internal("a token is not a valid header value"))
}

/// Logs in over `channel`: a `Handshake` carrying basic `credentials` (none: an
/// anonymous handshake, which a server without credentials answers with no token).
/// Returns the bearer token the server answered with, from the response's
/// `authorization` header or else its payload; `None` when the server has none to give.
///
/// # Errors
/// The server's status (`Unauthenticated: wrong user or password`; `Unimplemented` from
/// a server that has no handshake).
pub async fn login(
    channel: Channel,
    credentials: Option<&Credentials>,
) -> Result<Option<String>, Status> {
    let mut request = tonic::Request::new(futures::stream::iter([HandshakeRequest::default()]));
    if let Some(credentials) = credentials {
        request
            .metadata_mut()
            .insert(AUTHORIZATION, basic_header(credentials)?);
    }
    let mut client = FlightServiceClient::new(channel);
    let response = client.handshake(request).await?;
    let header = response
        .metadata()
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(|token| token.trim().to_string());
    // A refusal may also come in the stream.
    let message = response.into_inner().message().await?;
    let payload = message
        .map(|answer| String::from_utf8_lossy(&answer.payload).trim().to_string())
        .filter(|token| !token.is_empty());
    Ok(header.or(payload))
}
