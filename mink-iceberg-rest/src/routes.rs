//! The routes of the REST catalog: config, namespaces, tables and commits.
//!
//! | route | answer |
//! |---|---|
//! | `GET /v1/config` | no defaults or overrides; the endpoints below |
//! | `POST /v1/oauth/tokens` | a bearer token (`oauth`) |
//! | `GET /v1/namespaces` | every mink database with a lake table, every hosted namespace |
//! | `POST /v1/namespaces` | a hosted namespace for the client's tables (`namespaces`) |
//! | `GET`, `HEAD /v1/namespaces/{ns}` | the namespace and its properties |
//! | `DELETE /v1/namespaces/{ns}` | an empty hosted namespace dropped |
//! | `GET /v1/namespaces/{ns}/tables` | its tables (one page) |
//! | `POST /v1/namespaces/{ns}/tables` | a table created in a hosted namespace (`tables`) |
//! | `GET`, `HEAD /v1/namespaces/{ns}/tables/{t}` | the table's metadata and file IO config |
//! | `POST /v1/namespaces/{ns}/tables/{t}` | a commit (`tables`) |
//! | `DELETE /v1/namespaces/{ns}/tables/{t}` | a hosted table dropped (files too if `purgeRequested`) |
//!
//! The spec's other routes answer as it documents for a catalog without them (`unserved`:
//! no views, `406 UnsupportedOperationException` for renames and the rest). An unknown path
//! is a `404 NotFoundException`, another method of a known path a `406
//! UnsupportedOperationException`: mink's own tables are created, altered and dropped
//! through mink's SQL.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::header::{CONNECTION, CONTENT_LENGTH, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router, middleware};
use mink_auth::Auth;
use mink_lake::Lake;
use serde_json::json;

use crate::error::{RestError, server_error};
use crate::limits::{BODY_READ_TIMEOUT, MAX_BODY_BYTES, MAX_TOKEN_BODY_BYTES};
use crate::node_tables::NodeTables;
use crate::oauth::{issue_token, require_token};
use crate::{namespaces, tables, unserved};

/// What every route reads: the node (its lake and databases), the login and the file IO
/// properties handed to clients.
pub(crate) struct CatalogState {
    pub(crate) node: Arc<dyn NodeTables>,
    pub(crate) auth: Auth,
    pub(crate) file_io: HashMap<String, String>,
    /// Held while a client's namespace or table is counted and created, so that
    /// concurrent creates cannot pass the count bounds together.
    pub(crate) creating: tokio::sync::Mutex<()>,
}

pub(crate) type Shared = State<Arc<CatalogState>>;

/// The catalog's router.
pub(crate) fn router(state: CatalogState) -> Router {
    let state = Arc::new(state);
    let catalog = Router::new()
        .route("/v1/config", get(config))
        .route(
            "/v1/namespaces",
            get(namespaces::list_namespaces).post(namespaces::create_namespace),
        )
        .route(
            "/v1/namespaces/{namespace}",
            get(namespaces::load_namespace)
                .head(namespaces::namespace_exists)
                .delete(namespaces::drop_namespace),
        )
        .route(
            "/v1/namespaces/{namespace}/tables",
            get(tables::list_tables).post(tables::create_table),
        )
        .route(
            "/v1/namespaces/{namespace}/tables/{table}",
            get(tables::load_table)
                .head(tables::table_exists)
                .post(tables::commit_table)
                .delete(tables::drop_table),
        )
        .merge(unserved::routes())
        // Outermost last: the token is checked before the body is read.
        .route_layer(middleware::from_fn(read_body_within_deadline))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            require_token,
        ));
    let login = Router::new()
        .route("/v1/oauth/tokens", post(issue_token))
        .route_layer(middleware::from_fn(read_body_within_deadline))
        .route_layer(DefaultBodyLimit::max(MAX_TOKEN_BODY_BYTES))
        .route_layer(middleware::from_fn_with_state(
            MAX_TOKEN_BODY_BYTES,
            refuse_announced_large_bodies,
        ));
    Router::new()
        .merge(login)
        .merge(catalog)
        .fallback(unknown_route)
        .method_not_allowed_fallback(unsupported_method)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(
            MAX_BODY_BYTES,
            refuse_announced_large_bodies,
        ))
        .with_state(state)
}

/// Answers a request whose `Content-Length` is above `limit` at once, before its body is
/// read (the body limit alone stops a body only once that much has arrived).
async fn refuse_announced_large_bodies(
    State(limit): State<usize>,
    request: Request,
    next: Next,
) -> Response {
    let announced = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    match announced {
        Some(length) if length > limit as u64 => RestError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "BadRequestException",
            format!("a request body of {length} bytes is above the limit of {limit}"),
        )
        .into_response(),
        _ => next.run(request).await,
    }
}

/// Reads a request's whole body (at most the limit a layer outside sets:
/// [`MAX_BODY_BYTES`], [`MAX_TOKEN_BODY_BYTES`] for a token) within [`BODY_READ_TIMEOUT`]
/// before its route sees it: a body still incomplete then is answered `408` and its
/// connection closed. A catalog route reads it only once the bearer token is checked, so
/// a client without one holds no connection for a body.
async fn read_body_within_deadline(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let read = Bytes::from_request(Request::from_parts(parts.clone(), body), &());
    match tokio::time::timeout(BODY_READ_TIMEOUT, read).await {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(rejection)) => RestError::new(
            rejection.status(),
            "BadRequestException",
            rejection.body_text(),
        )
        .into_response(),
        Err(_) => body_read_timed_out(),
    }
}

/// `408`, with `Connection: close` so hyper drops the connection and its unread body.
fn body_read_timed_out() -> Response {
    let mut response = RestError::new(
        StatusCode::REQUEST_TIMEOUT,
        "BadRequestException",
        format!(
            "the request body did not arrive within {} s",
            BODY_READ_TIMEOUT.as_secs()
        ),
    )
    .into_response();
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The endpoints a client may call (`GET /v1/config`'s `endpoints`).
const ENDPOINTS: [&str; 11] = [
    "GET /v1/{prefix}/namespaces",
    "POST /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "DELETE /v1/{prefix}/namespaces/{namespace}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "POST /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "DELETE /v1/{prefix}/namespaces/{namespace}/tables/{table}",
];

async fn config() -> Json<serde_json::Value> {
    Json(json!({ "defaults": {}, "overrides": {}, "endpoints": ENDPOINTS }))
}

async fn unknown_route(method: Method, uri: axum::http::Uri) -> RestError {
    RestError::not_found(format!(
        "mink's Iceberg REST catalog has no route {method} {}: it lists, loads and commits \
         to tables, and creates and drops namespaces and tables for its clients",
        uri.path()
    ))
}

async fn unsupported_method(method: Method, uri: axum::http::Uri) -> RestError {
    RestError::unsupported(format!(
        "mink's Iceberg REST catalog does not serve {method} {}: mink's own tables are \
         altered through mink's SQL",
        uri.path()
    ))
}

pub(crate) async fn lake(state: &CatalogState) -> Result<&Lake, RestError> {
    state
        .node
        .lake()
        .await
        .map_err(|e| server_error(e.to_string()))
}
