//! The OAuth2 client-credentials grant of the REST catalog (`POST /v1/oauth/tokens`) and
//! the bearer check of every other route.
//!
//! The client id and secret are mink's user and password (`--sql-user`,
//! `MINK_SQL_PASSWORD`); the token is one of [`mink_auth::Auth`]'s, live for
//! [`mink_auth::TOKEN_LIFETIME`]. With no login configured every request is accepted (the
//! port is then loopback only) and the token endpoint hands out tokens to anyone, so that
//! clients configured with a credential work either way.

use axum::Json;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use mink_auth::{Credentials, TOKEN_LIFETIME, basic_credentials};
use serde::Deserialize;
use serde_json::json;

use crate::error::RestError;
use crate::routes::Shared;

/// The form of a token request (RFC 6749 4.4).
#[derive(Debug, Deserialize)]
pub(crate) struct TokenRequest {
    grant_type: String,
    client_id: Option<String>,
    client_secret: Option<String>,
}

/// `POST /v1/oauth/tokens`: a bearer token for the right client credentials, in the
/// form body or (`client_secret_basic`) the `Authorization` header.
pub(crate) async fn issue_token(
    State(state): Shared,
    headers: axum::http::HeaderMap,
    axum::Form(request): axum::Form<TokenRequest>,
) -> Response {
    if request.grant_type != "client_credentials" {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            "only the client_credentials grant is supported",
        );
    }
    let credentials = match (request.client_id, request.client_secret) {
        (Some(id), Some(secret)) => Some(Credentials::new(id, secret)),
        _ => headers
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(basic_credentials),
    };
    let Some(credentials) = credentials else {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "give client_id and client_secret (mink's user and password)",
        );
    };
    match state.auth.issue_token(&credentials) {
        Some(token) => Json(json!({
            "access_token": token,
            "token_type": "bearer",
            "expires_in": TOKEN_LIFETIME.as_secs(),
            "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
        }))
        .into_response(),
        None => oauth_error(
            StatusCode::UNAUTHORIZED,
            "invalid_client",
            "wrong client id or secret",
        ),
    }
}

/// Lets a request through with a live bearer token (any request when no login is
/// configured).
pub(crate) async fn require_token(State(state): Shared, request: Request, next: Next) -> Response {
    let auth = &state.auth;
    if !auth.is_enabled() {
        return next.run(request).await;
    }
    let token = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    match token {
        Some(token) if auth.accepts_token(token.trim()) => next.run(request).await,
        Some(_) => RestError::unauthorized(
            "the bearer token is unknown or expired: get a new one from /v1/oauth/tokens",
        )
        .into_response(),
        None => RestError::unauthorized(
            "this catalog requires a bearer token: exchange mink's user and password for one \
             at /v1/oauth/tokens (client credentials)",
        )
        .into_response(),
    }
}

/// An OAuth2 error answer (RFC 6749 5.2).
fn oauth_error(status: StatusCode, error: &str, description: &str) -> Response {
    (
        status,
        Json(json!({ "error": error, "error_description": description })),
    )
        .into_response()
}
