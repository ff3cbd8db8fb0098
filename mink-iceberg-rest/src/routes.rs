//! The routes of the REST catalog: config, namespaces, tables and commits.
//!
//! | route | answer |
//! |---|---|
//! | `GET /v1/config` | no defaults or overrides; the endpoints below |
//! | `POST /v1/oauth/tokens` | a bearer token (`oauth`) |
//! | `GET /v1/namespaces` | every mink database with a lake table |
//! | `GET`, `HEAD /v1/namespaces/{ns}` | the namespace (no properties) |
//! | `GET /v1/namespaces/{ns}/tables` | its tables (one page) |
//! | `GET`, `HEAD /v1/namespaces/{ns}/tables/{t}` | the table's metadata and file IO config |
//! | `POST /v1/namespaces/{ns}/tables/{t}` | a commit ([`commit_foreign`]) |
//!
//! An unknown path is a `404 NotFoundException`, another method of a known path a `406
//! UnsupportedOperationException`: mink's tables are created, altered and dropped through
//! mink's SQL.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::header::CONTENT_LENGTH;
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router, middleware};
use bytes::Bytes;
use iceberg::spec::TableMetadata;
use iceberg::{Catalog, NamespaceIdent, TableRequirement, TableUpdate};
use mink_auth::Auth;
use mink_core::table::TablePath;
use mink_lake::Lake;
use mink_lake::commit::commit_foreign;
use mink_node::Node;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::RestError;
use crate::oauth::{issue_token, require_token};

/// The largest request body taken (a commit names its snapshots, not their files).
pub(crate) const MAX_BODY_BYTES: usize = 1 << 20;

/// What every route reads: the node (for its lake), the login and the file IO properties
/// handed to clients.
pub(crate) struct CatalogState {
    pub(crate) node: Arc<Node>,
    pub(crate) auth: Auth,
    pub(crate) file_io: HashMap<String, String>,
}

pub(crate) type Shared = State<Arc<CatalogState>>;

/// The catalog's router.
pub(crate) fn router(state: CatalogState) -> Router {
    let state = Arc::new(state);
    let catalog = Router::new()
        .route("/v1/config", get(config))
        .route("/v1/namespaces", get(list_namespaces))
        .route(
            "/v1/namespaces/{namespace}",
            get(load_namespace).head(namespace_exists),
        )
        .route("/v1/namespaces/{namespace}/tables", get(list_tables))
        .route(
            "/v1/namespaces/{namespace}/tables/{table}",
            get(load_table).head(table_exists).post(commit_table),
        )
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            require_token,
        ));
    Router::new()
        .route("/v1/oauth/tokens", post(issue_token))
        .merge(catalog)
        .fallback(unknown_route)
        .method_not_allowed_fallback(unsupported_method)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(refuse_announced_large_bodies))
        .with_state(state)
}

/// Answers a request whose `Content-Length` is above [`MAX_BODY_BYTES`] at once, before
/// its body is read (the body limit alone stops a body only once that much has arrived).
async fn refuse_announced_large_bodies(request: Request, next: Next) -> Response {
    let announced = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    match announced {
        Some(length) if length > MAX_BODY_BYTES as u64 => RestError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "BadRequestException",
            format!("a request body of {length} bytes is above the limit of {MAX_BODY_BYTES}"),
        )
        .into_response(),
        _ => next.run(request).await,
    }
}

/// The endpoints a client may call (`GET /v1/config`'s `endpoints`).
const ENDPOINTS: [&str; 7] = [
    "GET /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}",
];

async fn config() -> Json<serde_json::Value> {
    Json(json!({ "defaults": {}, "overrides": {}, "endpoints": ENDPOINTS }))
}

async fn unknown_route(method: Method, uri: axum::http::Uri) -> RestError {
    RestError::not_found(format!(
        "mink's Iceberg REST catalog has no route {method} {}: it lists, loads and appends \
         to tables; create, alter and drop them through mink's SQL",
        uri.path()
    ))
}

async fn unsupported_method(method: Method, uri: axum::http::Uri) -> RestError {
    RestError::new(
        StatusCode::NOT_ACCEPTABLE,
        "UnsupportedOperationException",
        format!(
            "mink's Iceberg REST catalog does not serve {method} {}: mink's tables are \
             created, altered and dropped through mink's SQL",
            uri.path()
        ),
    )
}

async fn lake(state: &CatalogState) -> Result<&Lake, RestError> {
    Ok(state.node.lake().await?)
}

/// A namespace of the path: one level, a mink database (multi-level namespaces are
/// joined by the unit separator and never exist here).
fn namespace(name: &str) -> Result<NamespaceIdent, RestError> {
    if name.is_empty() || name.contains('\u{1f}') {
        return Err(RestError::no_such_namespace(name));
    }
    Ok(NamespaceIdent::new(name.to_string()))
}

/// The mink table a path names, checked to have a lake table.
async fn existing_table(
    state: &CatalogState,
    namespace_name: &str,
    name: &str,
) -> Result<TablePath, RestError> {
    namespace(namespace_name)?;
    let path = TablePath::new(namespace_name, name);
    if !lake(state).await?.exists(&path).await? {
        return Err(RestError::no_such_table(namespace_name, name));
    }
    Ok(path)
}

async fn list_namespaces(State(state): Shared) -> Result<Json<serde_json::Value>, RestError> {
    let namespaces = lake(&state).await?.catalog().list_namespaces(None).await?;
    let names: Vec<_> = namespaces.iter().map(|n| n.as_ref().clone()).collect();
    Ok(Json(json!({ "namespaces": names })))
}

async fn checked_namespace(state: &CatalogState, name: &str) -> Result<NamespaceIdent, RestError> {
    let ident = namespace(name)?;
    if !lake(state)
        .await?
        .catalog()
        .namespace_exists(&ident)
        .await?
    {
        return Err(RestError::no_such_namespace(name));
    }
    Ok(ident)
}

async fn load_namespace(
    State(state): Shared,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, RestError> {
    let ident = checked_namespace(&state, &name).await?;
    Ok(Json(
        json!({ "namespace": ident.as_ref(), "properties": {} }),
    ))
}

async fn namespace_exists(State(state): Shared, Path(name): Path<String>) -> StatusCode {
    match checked_namespace(&state, &name).await {
        Ok(_) => StatusCode::NO_CONTENT,
        Err(error) => error.status(),
    }
}

async fn list_tables(
    State(state): Shared,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, RestError> {
    let ident = checked_namespace(&state, &name).await?;
    let tables = lake(&state).await?.catalog().list_tables(&ident).await?;
    let identifiers: Vec<_> = tables
        .iter()
        .map(|t| json!({ "namespace": t.namespace().as_ref(), "name": t.name() }))
        .collect();
    Ok(Json(json!({ "identifiers": identifiers })))
}

/// A table's metadata as `loadTable` and a commit answer it.
#[derive(Serialize)]
struct LoadTableResult<'a> {
    #[serde(rename = "metadata-location")]
    metadata_location: &'a str,
    metadata: &'a TableMetadata,
    #[serde(skip_serializing_if = "Option::is_none")]
    config: Option<&'a HashMap<String, String>>,
}

async fn load_table(
    State(state): Shared,
    Path((namespace_name, name)): Path<(String, String)>,
) -> Result<Response, RestError> {
    let path = existing_table(&state, &namespace_name, &name).await?;
    let table = lake(&state).await?.load(&path).await?;
    Ok(Json(LoadTableResult {
        metadata_location: table.metadata_location_result()?,
        metadata: table.metadata(),
        config: Some(&state.file_io),
    })
    .into_response())
}

async fn table_exists(
    State(state): Shared,
    Path((namespace_name, name)): Path<(String, String)>,
) -> StatusCode {
    match existing_table(&state, &namespace_name, &name).await {
        Ok(_) => StatusCode::NO_CONTENT,
        Err(error) => error.status(),
    }
}

/// The body of a commit (`CommitTableRequest`).
#[derive(Deserialize)]
struct CommitTableRequest {
    #[serde(default)]
    requirements: Vec<TableRequirement>,
    updates: Vec<TableUpdate>,
}

async fn commit_table(
    State(state): Shared,
    Path((namespace_name, name)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, RestError> {
    let request: CommitTableRequest = serde_json::from_slice(&body)
        .map_err(|e| RestError::bad_request(format!("not a commit request: {e}")))?;
    let path = existing_table(&state, &namespace_name, &name).await?;
    let (metadata, location) = commit_foreign(
        lake(&state).await?,
        &path,
        &request.requirements,
        request.updates,
    )
    .await?;
    Ok(Json(LoadTableResult {
        metadata_location: &location,
        metadata: &metadata,
        config: None,
    })
    .into_response())
}
