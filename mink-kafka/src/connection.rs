//! One client connection: Kafka's framing, the login, and each request to its handler.
//!
//! ```text
//! frame   = size:i32 header body          (size bounded by MAX_REQUEST_BYTES)
//! header  = api_key api_version correlation_id client_id [tagged fields]
//! answer  = size:i32 correlation_id [tagged fields] body, in request order
//! ```
//!
//! Requests of one connection are answered one at a time, in order, as Kafka brokers do
//! (a Fetch's long poll holds its connection, never another's). With a login configured,
//! a connection may only ask `ApiVersions`, `SaslHandshake` (PLAIN) and
//! `SaslAuthenticate` until it has logged in; anything else closes it, as a Kafka broker
//! does, and so does a frame larger than [`MAX_LOGIN_REQUEST_BYTES`]. A connection must
//! send its first request (with a login configured: log in) within [`LOGIN_TIMEOUT`] of
//! its start, so sockets that say nothing hold a connection slot for seconds, not for
//! the [`IDLE_TIMEOUT`] a working client may pause between requests. A request at a version the listener does not serve is answered with
//! `UNSUPPORTED_VERSION` where its answer has a place for an error code; a frame that is
//! not Kafka's protocol, or an API the listener does not know, closes the connection.

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, FetchRequest, FindCoordinatorRequest, HeartbeatRequest,
    HeartbeatResponse, InitProducerIdRequest, JoinGroupRequest, JoinGroupResponse,
    LeaveGroupRequest, LeaveGroupResponse, ListOffsetsRequest, MetadataRequest,
    OffsetCommitRequest, OffsetFetchRequest, ProduceRequest, RequestHeader, ResponseHeader,
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
    SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;
use tracing::debug;

use crate::broker::Broker;
use crate::error::{KafkaError, Result};
use crate::limits::{
    IDLE_TIMEOUT, LOGIN_TIMEOUT, MAX_LOGIN_REQUEST_BYTES, MAX_REQUEST_BYTES, REQUEST_READ_TIMEOUT,
};
use crate::{cluster, fetch, offsets, produce, versions};

/// What a group request is answered by a broker that does not coordinate the group: the
/// client asks `FindCoordinator` again.
const NOT_COORDINATOR: i16 = ResponseError::NotCoordinator.code();

/// The one SASL mechanism served.
const PLAIN: &str = "PLAIN";

/// Serves one connection until the client closes it, it idles out, or it breaks the
/// protocol.
pub(crate) async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    broker: Arc<Broker>,
) -> Result<()> {
    let mut session = Session {
        logged_in: !broker.requires_login(),
        mechanism_chosen: false,
        login_failed: false,
        login_deadline: Some(Instant::now() + LOGIN_TIMEOUT),
    };
    while let Some(frame) = read_frame(&mut stream, &session.next_frame()).await? {
        let answer = answer(&broker, &mut session, frame).await?;
        if session.logged_in {
            session.login_deadline = None;
        }
        stream
            .write_all(&answer)
            .await
            .map_err(|e| KafkaError::Malformed(format!("writing an answer: {e}")))?;
        if session.login_failed {
            // As a Kafka broker does: one try per connection, so guessing a password
            // costs a connection (and its TLS handshake) each time.
            return Err(KafkaError::Malformed("a failed login".into()));
        }
    }
    Ok(())
}

/// Where a connection is in its login.
#[derive(Debug)]
struct Session {
    logged_in: bool,
    mechanism_chosen: bool,
    /// The connection's login was refused: it is closed after the answer.
    login_failed: bool,
    /// When the connection is closed unless it has sent its first request by then
    /// (with a login configured: has logged in); `None` once it has.
    login_deadline: Option<Instant>,
}

/// How the next request frame is read.
#[derive(Debug)]
struct FrameLimits {
    /// When the connection is closed if the frame has not begun.
    start_by: Instant,
    /// The longest the frame's bytes may take once its size has come (or before the
    /// login deadline).
    read_by: Option<Instant>,
    /// The largest frame.
    max_bytes: usize,
}

impl Session {
    /// Before a login, the frame must come by the login deadline and, with a login
    /// configured, be at most [`MAX_LOGIN_REQUEST_BYTES`] (what a client that has not
    /// proven who it is may make the server read and decode); after it, the frame may
    /// wait [`IDLE_TIMEOUT`] and be [`MAX_REQUEST_BYTES`].
    fn next_frame(&self) -> FrameLimits {
        let max_bytes = if self.logged_in {
            MAX_REQUEST_BYTES
        } else {
            MAX_LOGIN_REQUEST_BYTES
        };
        FrameLimits {
            start_by: self
                .login_deadline
                .unwrap_or_else(|| Instant::now() + IDLE_TIMEOUT),
            read_by: self.login_deadline,
            max_bytes,
        }
    }
}

/// The next request frame; `None` when the client closed the connection or idled out.
async fn read_frame<S: AsyncRead + Unpin>(
    stream: &mut S,
    limits: &FrameLimits,
) -> Result<Option<Bytes>> {
    let mut size = [0u8; 4];
    match tokio::time::timeout_at(limits.start_by, stream.read_exact(&mut size)).await {
        Err(_idle) => return Ok(None),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Ok(Err(e)) => return Err(KafkaError::Malformed(format!("reading a request: {e}"))),
        Ok(Ok(_)) => {}
    }
    let size = i32::from_be_bytes(size);
    let max = limits.max_bytes;
    // api_key, api_version and correlation_id at least.
    let size = usize::try_from(size)
        .ok()
        .filter(|size| (8..=max).contains(size))
        .ok_or_else(|| {
            KafkaError::Malformed(format!(
                "a request of {size} bytes (a request holds 8 to {max})"
            ))
        })?;
    let stall_by = Instant::now() + REQUEST_READ_TIMEOUT;
    let read_by = limits.read_by.map_or(stall_by, |by| by.min(stall_by));
    let mut frame = vec![0u8; size];
    match tokio::time::timeout_at(read_by, stream.read_exact(&mut frame)).await {
        Ok(Ok(_)) => Ok(Some(Bytes::from(frame))),
        Ok(Err(e)) => Err(KafkaError::Malformed(format!("reading a request: {e}"))),
        Err(_) => Err(KafkaError::Malformed(format!(
            "a request's {size} bytes did not arrive in time"
        ))),
    }
}

/// The framed answer to one request frame.
async fn answer(broker: &Broker, session: &mut Session, mut frame: Bytes) -> Result<BytesMut> {
    let key = frame.clone().get_i16();
    let version = frame.clone().slice(2..).get_i16();
    let api = ApiKey::try_from(key)
        .map_err(|()| KafkaError::Malformed(format!("unknown API key {key}")))?;
    let valid = api.valid_versions();
    let beyond = version > valid.max && api != ApiKey::ApiVersions;
    if version < valid.min || beyond {
        return Err(KafkaError::Malformed(format!(
            "{api:?} v{version} is not a version of Kafka's protocol"
        )));
    }
    let header_version = api.request_header_version(version);
    let header = RequestHeader::decode(&mut frame, header_version).map_err(malformed)?;
    debug!(?api, version, client = ?header.client_id, "Kafka request");
    let metrics = mink_metrics::metrics();
    (metrics
        .kafka_requests
        .with_label_values(&[&format!("{api:?}")]))
    .inc();
    if !session.logged_in
        && !matches!(
            api,
            ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
        )
    {
        return Err(KafkaError::Malformed(format!(
            "{api:?} before logging in (SASL/PLAIN)"
        )));
    }
    let reply = Reply {
        api,
        version,
        correlation_id: header.correlation_id,
    };
    if api == ApiKey::ApiVersions {
        return api_versions(&reply);
    }
    if !versions::is_supported(api, version) {
        return unsupported(&reply);
    }
    let body = &mut frame;
    match api {
        ApiKey::Metadata => {
            reply.send(&cluster::metadata(broker, decode::<MetadataRequest>(body, version)?).await)
        }
        ApiKey::FindCoordinator => reply.send(
            &cluster::find_coordinator(
                broker,
                decode::<FindCoordinatorRequest>(body, version)?,
                version,
            )
            .await,
        ),
        ApiKey::ListOffsets => reply.send(
            &offsets::list_offsets(broker, decode::<ListOffsetsRequest>(body, version)?).await,
        ),
        ApiKey::Fetch => {
            reply.send(&fetch::fetch(broker, decode::<FetchRequest>(body, version)?).await)
        }
        ApiKey::Produce => {
            let request = decode::<ProduceRequest>(body, version)?;
            let acks = request.acks;
            let response = produce::produce(broker, request).await;
            if acks == 0 {
                // acks=0: the client waits for no answer.
                return Ok(BytesMut::new());
            }
            reply.send(&response)
        }
        ApiKey::InitProducerId => reply.send(
            &produce::init_producer_id(broker, &decode::<InitProducerIdRequest>(body, version)?)
                .await,
        ),
        ApiKey::OffsetCommit => reply
            .send(&offsets::commit(broker, decode::<OffsetCommitRequest>(body, version)?).await),
        ApiKey::OffsetFetch => reply.send(
            &offsets::fetch_committed(
                broker,
                decode::<OffsetFetchRequest>(body, version)?,
                version,
            )
            .await,
        ),
        ApiKey::JoinGroup => {
            let request = decode::<JoinGroupRequest>(body, version)?;
            if !broker.brokers.coordinates(&request.group_id).await {
                return refuse::<JoinGroupResponse>(&reply, |r| r.with_error_code(NOT_COORDINATOR));
            }
            reply.send(&broker.groups.join(request, version).await)
        }
        ApiKey::SyncGroup => {
            let request = decode::<SyncGroupRequest>(body, version)?;
            if !broker.brokers.coordinates(&request.group_id).await {
                return refuse::<SyncGroupResponse>(&reply, |r| r.with_error_code(NOT_COORDINATOR));
            }
            reply.send(&broker.groups.sync(request).await)
        }
        ApiKey::Heartbeat => {
            let request = decode::<HeartbeatRequest>(body, version)?;
            if !broker.brokers.coordinates(&request.group_id).await {
                return refuse::<HeartbeatResponse>(&reply, |r| r.with_error_code(NOT_COORDINATOR));
            }
            reply.send(&broker.groups.heartbeat(&request))
        }
        ApiKey::LeaveGroup => {
            let request = decode::<LeaveGroupRequest>(body, version)?;
            if !broker.brokers.coordinates(&request.group_id).await {
                return refuse::<LeaveGroupResponse>(&reply, |r| {
                    r.with_error_code(NOT_COORDINATOR)
                });
            }
            reply.send(&broker.groups.leave(&request, version))
        }
        ApiKey::SaslHandshake => reply.send(&sasl_handshake(
            session,
            &decode::<SaslHandshakeRequest>(body, version)?,
        )),
        ApiKey::SaslAuthenticate => {
            let request = decode::<SaslAuthenticateRequest>(body, version)?;
            reply.send(&sasl_authenticate(broker, session, &request))
        }
        other => Err(KafkaError::Internal(format!(
            "{other:?} is announced but not served"
        ))),
    }
}

fn decode<T: Decodable>(body: &mut Bytes, version: i16) -> Result<T> {
    T::decode(body, version).map_err(malformed)
}

fn malformed(error: anyhow::Error) -> KafkaError {
    KafkaError::Malformed(error.to_string())
}

/// What an answer needs from its request.
struct Reply {
    api: ApiKey,
    version: i16,
    correlation_id: i32,
}

impl Reply {
    /// `response`, framed with its header.
    fn send<R: Encodable>(&self, response: &R) -> Result<BytesMut> {
        self.send_at(response, self.version)
    }

    fn send_at<R: Encodable>(&self, response: &R, version: i16) -> Result<BytesMut> {
        let mut out = BytesMut::new();
        out.put_i32(0);
        ResponseHeader::default()
            .with_correlation_id(self.correlation_id)
            .encode(&mut out, self.api.response_header_version(version))
            .and_then(|()| response.encode(&mut out, version))
            .map_err(|e| KafkaError::Internal(format!("encoding a {:?} answer: {e}", self.api)))?;
        let size = i32::try_from(out.len() - 4)
            .map_err(|_| KafkaError::Internal("an answer over 2 GiB".into()))?;
        out[..4].copy_from_slice(&size.to_be_bytes());
        Ok(out)
    }
}

/// `ApiVersions`, at any version: a client asks it before it knows what the server
/// speaks, so a version above the served ones is answered at v0 with
/// `UNSUPPORTED_VERSION` and the served versions, and the client asks again.
fn api_versions(reply: &Reply) -> Result<BytesMut> {
    let response = ApiVersionsResponse::default().with_api_keys(versions::announced());
    if versions::is_supported(ApiKey::ApiVersions, reply.version) {
        reply.send(&response)
    } else {
        let refused = response.with_error_code(ResponseError::UnsupportedVersion.code());
        reply.send_at(&refused, 0)
    }
}

/// The answer to an API the listener does not serve, or a version it does not serve
/// it at (a client that skipped `ApiVersions`): that API's answer with
/// `UNSUPPORTED_VERSION` where the version has a place for an error code, else an empty
/// one (which names no partition, and so fails the request). Any other API closes the
/// connection.
fn unsupported(reply: &Reply) -> Result<BytesMut> {
    use kafka_protocol::messages::*;
    debug!(api = ?reply.api, version = reply.version, "unsupported API or version");
    let code = ResponseError::UnsupportedVersion.code();
    match reply.api {
        ApiKey::Produce => refuse::<ProduceResponse>(reply, |r| r),
        ApiKey::Fetch => refuse::<FetchResponse>(reply, |r| r.with_error_code(code)),
        ApiKey::ListOffsets => refuse::<ListOffsetsResponse>(reply, |r| r),
        ApiKey::Metadata => refuse::<MetadataResponse>(reply, |r| r.with_error_code(code)),
        ApiKey::OffsetCommit => refuse::<OffsetCommitResponse>(reply, |r| r),
        ApiKey::OffsetFetch => refuse::<OffsetFetchResponse>(reply, |r| r.with_error_code(code)),
        ApiKey::FindCoordinator => {
            refuse::<FindCoordinatorResponse>(reply, |r| r.with_error_code(code))
        }
        ApiKey::JoinGroup => refuse::<JoinGroupResponse>(reply, |r| r.with_error_code(code)),
        ApiKey::Heartbeat => refuse::<HeartbeatResponse>(reply, |r| r.with_error_code(code)),
        ApiKey::LeaveGroup => refuse::<LeaveGroupResponse>(reply, |r| r.with_error_code(code)),
        ApiKey::SyncGroup => refuse::<SyncGroupResponse>(reply, |r| r.with_error_code(code)),
        ApiKey::SaslHandshake => {
            refuse::<SaslHandshakeResponse>(reply, |r| r.with_error_code(code))
        }
        ApiKey::SaslAuthenticate => {
            refuse::<SaslAuthenticateResponse>(reply, |r| r.with_error_code(code))
        }
        ApiKey::InitProducerId => {
            refuse::<InitProducerIdResponse>(reply, |r| r.with_error_code(code))
        }
        ApiKey::CreateTopics => refuse::<CreateTopicsResponse>(reply, |r| r),
        ApiKey::DeleteTopics => refuse::<DeleteTopicsResponse>(reply, |r| r),
        ApiKey::DescribeConfigs => refuse::<DescribeConfigsResponse>(reply, |r| r),
        ApiKey::DescribeGroups => refuse::<DescribeGroupsResponse>(reply, |r| r),
        ApiKey::ListGroups => refuse::<ListGroupsResponse>(reply, |r| r.with_error_code(code)),
        ApiKey::DescribeCluster => {
            refuse::<DescribeClusterResponse>(reply, |r| r.with_error_code(code))
        }
        ApiKey::AddPartitionsToTxn => {
            refuse::<AddPartitionsToTxnResponse>(reply, |r| r.with_error_code(code))
        }
        ApiKey::AddOffsetsToTxn => {
            refuse::<AddOffsetsToTxnResponse>(reply, |r| r.with_error_code(code))
        }
        ApiKey::EndTxn => refuse::<EndTxnResponse>(reply, |r| r.with_error_code(code)),
        other => Err(KafkaError::Malformed(format!(
            "{other:?} is not served by mink's Kafka listener"
        ))),
    }
}

/// `R` with the error `with_error` sets, or without it where the version has no place
/// for it.
fn refuse<R: Encodable + Default>(
    reply: &Reply,
    with_error: impl FnOnce(R) -> R,
) -> Result<BytesMut> {
    reply
        .send(&with_error(R::default()))
        .or_else(|_| reply.send(&R::default()))
}

fn sasl_handshake(session: &mut Session, request: &SaslHandshakeRequest) -> SaslHandshakeResponse {
    let offered =
        SaslHandshakeResponse::default().with_mechanisms(vec![StrBytes::from_static_str(PLAIN)]);
    if request.mechanism.as_str() == PLAIN {
        session.mechanism_chosen = true;
        offered
    } else {
        offered.with_error_code(ResponseError::UnsupportedSaslMechanism.code())
    }
}

/// SASL/PLAIN (RFC 4616): `authzid NUL authcid NUL password`, in one token.
fn sasl_authenticate(
    broker: &Broker,
    session: &mut Session,
    request: &SaslAuthenticateRequest,
) -> SaslAuthenticateResponse {
    let refuse = |error: ResponseError, message: &str| {
        SaslAuthenticateResponse::default()
            .with_error_code(error.code())
            .with_error_message(Some(StrBytes::from_string(message.to_string())))
    };
    if !session.mechanism_chosen {
        return refuse(
            ResponseError::IllegalSaslState,
            "SaslHandshake (PLAIN) comes first",
        );
    }
    // Whatever the outcome below but success, the connection ends after the answer.
    session.login_failed = true;
    let mut parts = request.auth_bytes.split(|b| *b == 0);
    let (Some(_authzid), Some(user), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return refuse(
            ResponseError::SaslAuthenticationFailed,
            "a malformed PLAIN token",
        );
    };
    let user = String::from_utf8_lossy(user);
    let password = String::from_utf8_lossy(password);
    if broker.accepts(&user, &password) {
        session.logged_in = true;
        session.login_failed = false;
        SaslAuthenticateResponse::default()
    } else {
        refuse(
            ResponseError::SaslAuthenticationFailed,
            "wrong user or password",
        )
    }
}
