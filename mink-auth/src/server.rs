//! The server side: the credentials a server was configured with, the tokens it issued,
//! the check every call passes and the answer to `Handshake`.
//!
//! Every call passes through [`Auth::check`] (a tonic interceptor) first; a call with
//! Basic credentials is accepted too, for clients that send them on every call. Tokens
//! live in this server's memory for [`TOKEN_LIFETIME`], at most [`MAX_LIVE_TOKENS`] of
//! them (a new one past it ends the oldest not in use); a restart ends them and clients
//! handshake again. With no credentials configured every call is accepted, and the
//! server only listens on a loopback address ([`crate::check_listen`]).

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use arrow_flight::HandshakeResponse;
use base64::Engine;
use futures::Stream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use crate::Credentials;
use crate::client::{AUTHORIZATION, BASE64};
use crate::limits::MAX_LIVE_TOKENS;

/// How long a token is accepted after its handshake.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// The stream a `Handshake` answers with.
pub type HandshakeStream = Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>;

/// The server's credentials (if any) and the tokens it has issued.
#[derive(Default)]
pub struct Auth {
    credentials: Option<Credentials>,
    tokens: Mutex<Tokens>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

impl Auth {
    /// Calls must present `credentials` (or a token they were exchanged for); `None`
    /// accepts every call.
    pub fn new(credentials: Option<Credentials>) -> Self {
        Self {
            credentials,
            tokens: Mutex::default(),
        }
    }

    /// Whether calls must authenticate.
    pub fn is_enabled(&self) -> bool {
        self.credentials.is_some()
    }

    /// Accepts a call carrying a valid token or the right credentials (any call, when
    /// no credentials are configured).
    ///
    /// # Errors
    /// `Unauthenticated`, saying what is missing or wrong.
    pub fn check(&self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(credentials) = &self.credentials else {
            return Ok(request);
        };
        match authorization(request.metadata())? {
            Authorization::Bearer(token) if self.is_live(&token) => Ok(request),
            Authorization::Bearer(_) => Err(Status::unauthenticated(
                "the bearer token is unknown or expired: handshake again",
            )),
            Authorization::Basic(given) if credentials.accepts(&given) => Ok(request),
            Authorization::Basic(_) => Err(Status::unauthenticated("wrong user or password")),
            Authorization::Missing => Err(Status::unauthenticated(
                "this server requires a user and password (handshake with basic credentials)",
            )),
        }
    }

    /// Answers a handshake that passed [`Auth::check`]: a new token for basic
    /// credentials, the same token for a bearer one; none when auth is off.
    ///
    /// # Errors
    /// A malformed authorization header.
    pub fn handshake(&self, metadata: &MetadataMap) -> Result<Option<String>, Status> {
        if !self.is_enabled() {
            return Ok(None);
        }
        match authorization(metadata)? {
            Authorization::Bearer(token) => Ok(Some(token)),
            Authorization::Basic(_) | Authorization::Missing => Ok(Some(self.issue())),
        }
    }

    /// The whole answer to a `Handshake` that passed [`Auth::check`]: one message whose
    /// payload is the token (empty when auth is off), and the token in the response's
    /// `authorization` header.
    ///
    /// # Errors
    /// A malformed authorization header.
    pub fn handshake_response(
        &self,
        metadata: &MetadataMap,
    ) -> Result<Response<HandshakeStream>, Status> {
        let token = self.handshake(metadata)?;
        let answer = HandshakeResponse {
            protocol_version: 0,
            payload: token.clone().unwrap_or_default().into_bytes().into(),
        };
        let stream: HandshakeStream = Box::pin(futures::stream::iter([Ok(answer)]));
        let mut response = Response::new(stream);
        if let Some(token) = token {
            attach_token(response.metadata_mut(), &token)?;
        }
        Ok(response)
    }

    /// Exchanges credentials for a token, as a client-credentials grant (the Iceberg REST
    /// catalog's `/v1/oauth/tokens`) does: `None` for wrong credentials. With no
    /// credentials configured any are accepted.
    pub fn issue_token(&self, given: &Credentials) -> Option<String> {
        match &self.credentials {
            Some(credentials) if !credentials.accepts(given) => None,
            _ => Some(self.issue()),
        }
    }

    /// Whether a bearer token is live (every token is, when auth is off).
    pub fn accepts_token(&self, token: &str) -> bool {
        !self.is_enabled() || self.is_live(token)
    }

    fn issue(&self) -> String {
        let bytes: [u8; 32] = rand::random();
        let token = bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let mut tokens = self.tokens.lock().unwrap_or_else(PoisonError::into_inner);
        tokens.insert(token.clone());
        token
    }

    fn is_live(&self, token: &str) -> bool {
        let mut tokens = self.tokens.lock().unwrap_or_else(PoisonError::into_inner);
        tokens.is_live(token)
    }
}

/// The live tokens, in the order they were issued in (or given a second chance): expired
/// ones go from the front, and past [`MAX_LIVE_TOKENS`] the first one not used since it
/// last came to the front makes room (a "second chance", as a CLOCK cache evicts), so a
/// client using its token keeps it however many others handshake.
#[derive(Debug, Default)]
struct Tokens {
    live: HashMap<String, Token>,
    queue: VecDeque<String>,
}

#[derive(Debug)]
struct Token {
    issued: Instant,
    used: bool,
}

impl Tokens {
    fn insert(&mut self, token: String) {
        let now = Instant::now();
        let mut chances = self.queue.len();
        while let Some(front) = self.queue.pop_front() {
            let Some(entry) = self.live.get_mut(&front) else {
                continue;
            };
            let full = self.queue.len() + 1 >= MAX_LIVE_TOKENS;
            if now.duration_since(entry.issued) >= TOKEN_LIFETIME {
                self.live.remove(&front);
            } else if !full {
                self.queue.push_front(front);
                break;
            } else if entry.used && chances > 0 {
                entry.used = false;
                chances -= 1;
                self.queue.push_back(front);
            } else {
                // Making room: its client handshakes again when it next calls.
                self.live.remove(&front);
            }
        }
        let entry = Token {
            issued: now,
            used: false,
        };
        self.live.insert(token.clone(), entry);
        self.queue.push_back(token);
    }

    /// Whether `token` is live, marking it used.
    fn is_live(&mut self, token: &str) -> bool {
        match self.live.get_mut(token) {
            Some(entry) if entry.issued.elapsed() < TOKEN_LIFETIME => {
                entry.used = true;
                true
            }
            _ => false,
        }
    }
}

/// What a call's `authorization` header says.
#[derive(Debug, PartialEq)]
enum Authorization {
    Missing,
    Basic(Credentials),
    Bearer(String),
}

fn authorization(metadata: &MetadataMap) -> Result<Authorization, Status> {
    let Some(value) = metadata.get(AUTHORIZATION) else {
        return Ok(Authorization::Missing);
    };
    let malformed = || Status::unauthenticated("malformed authorization header");
    let value = value.to_str().map_err(|_| malformed())?;
    if let Some(token) = value.strip_prefix("Bearer ") {
        return Ok(Authorization::Bearer(token.trim().to_string()));
    }
    basic_credentials(value)
        .map(Authorization::Basic)
        .ok_or_else(malformed)
}

/// The credentials of a `Basic` authorization header's value (`Basic
/// base64(user:password)`); `None` for another scheme or a malformed value.
pub fn basic_credentials(value: &str) -> Option<Credentials> {
    let encoded = value.strip_prefix("Basic ")?;
    let decoded = BASE64.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some(Credentials::new(user, password))
}

/// Hands a client its token in the response's `authorization` header.
///
/// # Errors
/// The token is not a valid header value (it always is: hex digits).
pub fn attach_token(metadata: &mut MetadataMap, token: &str) -> Result<(), Status> {
    let value = crate::bearer_header(token)?;
    metadata.insert(AUTHORIZATION, value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(authorization: Option<&str>) -> Request<()> {
        let mut request = Request::new(());
        if let Some(value) = authorization {
            request
                .metadata_mut()
                .insert(AUTHORIZATION, value.parse().unwrap());
        }
        request
    }

    fn basic(user: &str, password: &str) -> String {
        format!("Basic {}", BASE64.encode(format!("{user}:{password}")))
    }

    #[test]
    fn client_credentials_are_exchanged_for_a_token_only_when_right() {
        let auth = Auth::new(Some(Credentials::new("ann", "pw")));
        assert_eq!(auth.issue_token(&Credentials::new("ann", "no")), None);
        let token = auth.issue_token(&Credentials::new("ann", "pw")).unwrap();
        assert!(auth.accepts_token(&token));
        assert!(!auth.accepts_token("made-up"));
        assert!(Auth::new(None).accepts_token("anything"));
    }

    #[test]
    fn past_the_bound_a_new_token_ends_the_oldest_not_in_use() {
        let auth = Auth::new(Some(Credentials::new("ann", "pw")));
        let issue = || auth.issue_token(&Credentials::new("ann", "pw")).unwrap();
        let (first, second, third) = (issue(), issue(), issue());
        for _ in 3..MAX_LIVE_TOKENS {
            issue();
        }
        // The first is in use: the second, the oldest not used, makes room.
        assert!(auth.accepts_token(&first), "within the bound");
        let newest = issue();
        assert!(auth.accepts_token(&first), "a token in use stays");
        assert!(!auth.accepts_token(&second), "the oldest unused made room");
        assert!(auth.accepts_token(&newest));
        // Then the third: the first now stands behind it.
        issue();
        assert!(!auth.accepts_token(&third));
        assert!(auth.accepts_token(&first));
        let tokens = auth.tokens.lock().unwrap();
        assert_eq!(tokens.live.len(), MAX_LIVE_TOKENS);
        assert_eq!(tokens.queue.len(), MAX_LIVE_TOKENS);
    }

    #[test]
    fn without_credentials_every_call_passes() {
        let auth = Auth::new(None);
        assert!(auth.check(request(None)).is_ok());
        assert_eq!(auth.handshake(request(None).metadata()).unwrap(), None);
    }

    #[test]
    fn a_handshake_with_the_credentials_issues_a_token_the_calls_then_carry() {
        let auth = Auth::new(Some(Credentials::new("ann", "s3cret:x1")));
        let good = basic("ann", "s3cret:x1");
        assert!(auth.check(request(Some(&good))).is_ok());
        let unpadded = good.trim_end_matches('=');
        assert_ne!(unpadded, good);
        assert!(auth.check(request(Some(unpadded))).is_ok());
        let token = auth
            .handshake(request(Some(&good)).metadata())
            .unwrap()
            .unwrap();
        assert_eq!(token.len(), 64);
        assert!(
            auth.check(request(Some(&format!("Bearer {token}"))))
                .is_ok()
        );

        for refused in [
            None,
            Some(basic("ann", "wrong")),
            Some(basic("bob", "s3cret:x1")),
            Some("Bearer nope".to_string()),
            Some("Digest x".to_string()),
            Some("Basic !!!".to_string()),
        ] {
            let status = auth.check(request(refused.as_deref())).unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{refused:?}");
        }
    }

    #[test]
    fn the_client_header_is_what_the_server_accepts() {
        let login = Credentials::new("ann", "pw");
        let auth = Auth::new(Some(login.clone()));
        let mut request = Request::new(());
        request
            .metadata_mut()
            .insert(AUTHORIZATION, crate::basic_header(&login).unwrap());
        let response = auth.handshake_response(request.metadata()).unwrap();
        let header = response.metadata().get(AUTHORIZATION).unwrap().clone();
        let mut call = Request::new(());
        call.metadata_mut().insert(AUTHORIZATION, header);
        assert!(auth.check(call).is_ok());
    }
}
