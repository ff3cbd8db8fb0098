//! Namespaces: mink databases with lake tables, and the namespaces REST clients create for
//! their own tables (marked hosted, [`HOSTED_NAMESPACE_PROPERTY`]).
//!
//! A client may create a namespace (one level, a valid mink name, not that of a mink
//! database with tables; no `location` and no `mink.` property, which would place its
//! tables elsewhere or pose as mink's own) while the catalog holds fewer than
//! [`MAX_NAMESPACES`], and drop one it created once it is empty. A mink database's namespace is
//! never dropped here, and mink refuses to create a database's lake tables in a hosted
//! namespace.

use std::collections::HashMap;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use iceberg::{ErrorKind, NamespaceIdent};
use mink_core::table::TablePath;
use mink_lake::Lake;
use mink_lake::catalog::HOSTED_NAMESPACE_PROPERTY;
use serde::Deserialize;
use serde_json::json;

use crate::error::RestError;
use crate::limits::MAX_NAMESPACES;
use crate::routes::{CatalogState, Shared, lake};

/// A namespace of the path: one level, a valid mink name (multi-level namespaces are
/// joined by the unit separator and never exist here).
pub(crate) fn namespace(name: &str) -> Result<NamespaceIdent, RestError> {
    if TablePath::checked(name, "t").is_err() {
        return Err(RestError::no_such_namespace(name));
    }
    Ok(NamespaceIdent::new(name.to_string()))
}

/// The namespace of the path, checked to exist.
pub(crate) async fn checked_namespace(
    state: &CatalogState,
    name: &str,
) -> Result<NamespaceIdent, RestError> {
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

/// The namespace of the path, checked to exist and to be a hosted one (`what` is
/// refused in any other).
pub(crate) async fn hosted_namespace(
    state: &CatalogState,
    name: &str,
    what: &str,
) -> Result<NamespaceIdent, RestError> {
    let ident = checked_namespace(state, name).await?;
    if !lake(state).await?.is_hosted(&ident).await? {
        return Err(RestError::forbidden(format!(
            "namespace {name} is a mink database: {what} through mink's SQL"
        )));
    }
    Ok(ident)
}

/// The query of `GET /v1/namespaces` (its paging is not taken: one page holds them all).
#[derive(Deserialize)]
pub(crate) struct ListNamespacesQuery {
    /// The namespace to list the namespaces of (levels joined by the unit separator);
    /// absent or empty: the top level.
    parent: Option<String>,
}

/// `GET /v1/namespaces`: every namespace, all of one level. Under a `parent` (Spark's `SHOW
/// NAMESPACES IN mink.demo`), none; `404 NoSuchNamespaceException` for a parent that does
/// not exist, as the spec documents.
pub(crate) async fn list_namespaces(
    State(state): Shared,
    query: Result<Query<ListNamespacesQuery>, QueryRejection>,
) -> Result<Json<serde_json::Value>, RestError> {
    let Query(query) = query.map_err(|e| RestError::bad_request(e.body_text()))?;
    if let Some(parent) = query.parent.filter(|parent| !parent.is_empty()) {
        checked_namespace(&state, &parent).await?;
        return Ok(Json(json!({ "namespaces": [] })));
    }
    let namespaces = lake(&state).await?.catalog().list_namespaces(None).await?;
    let names: Vec<_> = namespaces.iter().map(|n| n.as_ref().clone()).collect();
    Ok(Json(json!({ "namespaces": names })))
}

pub(crate) async fn load_namespace(
    State(state): Shared,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, RestError> {
    let ident = namespace(&name)?;
    let namespace = lake(&state).await?.catalog().get_namespace(&ident).await?;
    Ok(Json(
        json!({ "namespace": ident.as_ref(), "properties": namespace.properties() }),
    ))
}

pub(crate) async fn namespace_exists(State(state): Shared, Path(name): Path<String>) -> StatusCode {
    match checked_namespace(&state, &name).await {
        Ok(_) => StatusCode::NO_CONTENT,
        Err(error) => error.status(),
    }
}

/// The body of `POST /v1/namespaces`.
#[derive(Deserialize)]
pub(crate) struct CreateNamespaceRequest {
    namespace: Vec<String>,
    #[serde(default)]
    properties: HashMap<String, String>,
}

pub(crate) async fn create_namespace(
    State(state): Shared,
    body: axum::body::Bytes,
) -> Result<Json<serde_json::Value>, RestError> {
    let request: CreateNamespaceRequest = serde_json::from_slice(&body)
        .map_err(|e| RestError::bad_request(format!("not a create-namespace request: {e}")))?;
    let [name] = request.namespace.as_slice() else {
        return Err(RestError::bad_request(format!(
            "namespace {:?}: mink's catalog holds one-level namespaces",
            request.namespace
        )));
    };
    TablePath::checked(name, "t").map_err(|e| RestError::bad_request(e.to_string()))?;
    if let Some(key) = request
        .properties
        .keys()
        .find(|key| *key == "location" || key.starts_with("mink."))
    {
        return Err(RestError::bad_request(format!(
            "namespace property {key} is not taken: tables live in the catalog's warehouse, \
             and mink. properties are mink's own"
        )));
    }
    if state.node.is_mink_database(name) {
        return Err(RestError::already_exists(format!(
            "namespace {name} is a mink database"
        )));
    }
    let lake = lake(&state).await?;
    let catalog = lake.catalog();
    let ident = NamespaceIdent::new(name.clone());
    let _creating = state.creating.lock().await;
    check_room_for_namespace(lake, &ident).await?;
    let mut properties = request.properties;
    properties.insert(HOSTED_NAMESPACE_PROPERTY.to_string(), "true".to_string());
    let created = catalog
        .create_namespace(&ident, properties)
        .await
        .map_err(|e| match e.kind() {
            ErrorKind::NamespaceAlreadyExists => {
                RestError::already_exists(format!("namespace {name} already exists"))
            }
            _ => e.into(),
        })?;
    Ok(Json(
        json!({ "namespace": ident.as_ref(), "properties": created.properties() }),
    ))
}

/// Refuses `ident` when the catalog holds it already (`409`, as a client creating one
/// twice expects) or holds [`MAX_NAMESPACES`] (`400`).
async fn check_room_for_namespace(lake: &Lake, ident: &NamespaceIdent) -> Result<(), RestError> {
    let namespaces = lake.catalog().list_namespaces(None).await?;
    if namespaces.contains(ident) {
        return Err(RestError::already_exists(format!(
            "namespace {} already exists",
            ident.join(".")
        )));
    }
    let count = namespaces.len();
    if count >= MAX_NAMESPACES {
        return Err(RestError::bad_request(format!(
            "the catalog holds {count} namespaces, the most a client may add to \
             ({MAX_NAMESPACES}): drop an empty one first"
        )));
    }
    Ok(())
}

pub(crate) async fn drop_namespace(
    State(state): Shared,
    Path(name): Path<String>,
) -> Result<StatusCode, RestError> {
    let ident = hosted_namespace(&state, &name, "databases are dropped").await?;
    let catalog = lake(&state).await?.catalog();
    if !catalog.list_tables(&ident).await?.is_empty() {
        return Err(RestError::new(
            StatusCode::CONFLICT,
            "NamespaceNotEmptyException",
            format!("namespace {name} still holds tables"),
        ));
    }
    catalog.drop_namespace(&ident).await?;
    Ok(StatusCode::NO_CONTENT)
}
