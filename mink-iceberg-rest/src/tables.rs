//! Tables: listed, loaded and committed to in every namespace; created and dropped in the
//! namespaces REST clients created (mink's own tables are created and dropped through its
//! SQL).
//!
//! A commit to a mink table is another engine's, checked by
//! [`mink_lake::commit::commit_foreign`] (appends to log tables only, every field later
//! commits build on: `400` for a field out of range, `409` for a stale parent or schema,
//! `403` for what mink does not take); a commit to a table in a hosted namespace is its
//! creator's, checked by [`mink_lake::commit::commit_hosted`] (any update, its files inside
//! the table's location, each snapshot's sequence number the next and its timestamp not
//! ahead of the clock). A new table gets the location the
//! catalog chooses in its warehouse, and no property that would write its files elsewhere.
//!
//! Every route of one table answers a table of a missing namespace as a missing table,
//! `404 NoSuchTableException` ([`existing_table`]); the routes of a namespace's tables
//! (list, create) answer `404 NoSuchNamespaceException`.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use iceberg::spec::TableMetadata;
use iceberg::{ErrorKind, TableCreation};
use iceberg_catalog_rest::{CommitTableRequest, CreateTableRequest, LoadTableResult};
use mink_core::table::TablePath;
use mink_lake::Lake;
use mink_lake::commit::{commit_foreign, commit_hosted};
use mink_lake::layout::{relocates_files, table_location};
use serde::Deserialize;
use serde_json::json;

use crate::error::RestError;
use crate::limits::MAX_HOSTED_TABLES;
use crate::namespaces::{checked_namespace, hosted_namespace, namespace};
use crate::routes::{CatalogState, Shared, lake};

/// The table a path names, checked to have a lake table.
///
/// A table of a namespace that does not exist, or has several levels (`demo%1Fevents`,
/// which this catalog never holds), does not exist either: `404 NoSuchTableException`, as
/// the spec documents for loading, checking, committing to and dropping a table. Iceberg's
/// Java client (Spark's, Trino's) tries a metadata table on that exception only: Spark
/// loads `mink.demo.events.snapshots` as table `snapshots` of namespace `demo.events`
/// first, then as the `snapshots` metadata table of `demo.events`.
pub(crate) async fn existing_table(
    state: &CatalogState,
    namespace_name: &str,
    name: &str,
) -> Result<TablePath, RestError> {
    let missing = || RestError::no_such_table(namespace_name, name);
    namespace(namespace_name).map_err(|_| missing())?;
    let path = TablePath::new(namespace_name, name);
    if !lake(state).await?.exists(&path).await? {
        return Err(missing());
    }
    Ok(path)
}

pub(crate) async fn list_tables(
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

/// A table's metadata as `loadTable` and `createTable` answer it.
fn loaded(state: &CatalogState, location: &str, metadata: TableMetadata) -> Json<LoadTableResult> {
    Json(LoadTableResult {
        metadata_location: Some(location.to_string()),
        metadata,
        config: state.file_io.clone(),
        storage_credentials: None,
    })
}

pub(crate) async fn load_table(
    State(state): Shared,
    Path((namespace_name, name)): Path<(String, String)>,
) -> Result<Json<LoadTableResult>, RestError> {
    let path = existing_table(&state, &namespace_name, &name).await?;
    let table = lake(&state).await?.load(&path).await?;
    Ok(loaded(
        &state,
        table.metadata_location_result()?,
        table.metadata().clone(),
    ))
}

pub(crate) async fn table_exists(
    State(state): Shared,
    Path((namespace_name, name)): Path<(String, String)>,
) -> StatusCode {
    match existing_table(&state, &namespace_name, &name).await {
        Ok(_) => StatusCode::NO_CONTENT,
        Err(error) => error.status(),
    }
}

pub(crate) async fn create_table(
    State(state): Shared,
    Path(namespace_name): Path<String>,
    body: Bytes,
) -> Result<Json<LoadTableResult>, RestError> {
    let request: CreateTableRequest = serde_json::from_slice(&body)
        .map_err(|e| RestError::bad_request(format!("not a create-table request: {e}")))?;
    let ident = hosted_namespace(&state, &namespace_name, "tables are created").await?;
    let path = TablePath::checked(&namespace_name, &request.name)
        .map_err(|e| RestError::bad_request(e.to_string()))?;
    if request.stage_create == Some(true) {
        return Err(RestError::unsupported(
            "staged creates (stage-create) are not supported: create the table, then commit",
        ));
    }
    let lake = lake(&state).await?;
    let _creating = state.creating.lock().await;
    check_hosted_table_count(lake).await?;
    let warehouse_location = table_location(lake.warehouse(), &path);
    if let Some(location) = request
        .location
        .as_deref()
        .filter(|location| location.trim_end_matches('/') != warehouse_location)
    {
        return Err(RestError::bad_request(format!(
            "location {location}: tables live where the catalog places them \
             ({warehouse_location})"
        )));
    }
    if let Some(property) = request.properties.keys().find(|key| relocates_files(key)) {
        return Err(RestError::bad_request(format!(
            "table property {property} is not taken: a table's files live in its location"
        )));
    }
    let creation = TableCreation::builder()
        .name(request.name.clone())
        .location(warehouse_location)
        .schema(request.schema)
        .partition_spec_opt(request.partition_spec)
        .sort_order_opt(request.write_order)
        .properties(request.properties)
        .build();
    let table = lake
        .catalog()
        .create_table(&ident, creation)
        .await
        .map_err(|e| match e.kind() {
            ErrorKind::TableAlreadyExists => {
                RestError::already_exists(format!("table {path} already exists"))
            }
            _ => e.into(),
        })?;
    Ok(loaded(
        &state,
        table.metadata_location_result()?,
        table.metadata().clone(),
    ))
}

/// Refuses a new hosted table while hosted namespaces hold [`MAX_HOSTED_TABLES`] in all.
async fn check_hosted_table_count(lake: &Lake) -> Result<(), RestError> {
    let catalog = lake.catalog();
    let mut count = 0;
    for namespace in catalog.list_namespaces(None).await? {
        if lake.is_hosted(&namespace).await? {
            count += catalog.list_tables(&namespace).await?.len();
        }
    }
    if count >= MAX_HOSTED_TABLES {
        return Err(RestError::bad_request(format!(
            "the catalog's hosted namespaces hold {count} tables, the most it keeps for its \
             clients ({MAX_HOSTED_TABLES}): drop one first"
        )));
    }
    Ok(())
}

/// The query of `DELETE .../tables/{t}`.
#[derive(Deserialize)]
pub(crate) struct DropTableQuery {
    /// `true` in any case (pyiceberg sends `True`).
    #[serde(default, rename = "purgeRequested")]
    purge_requested: Option<String>,
}

pub(crate) async fn drop_table(
    State(state): Shared,
    Path((namespace_name, name)): Path<(String, String)>,
    query: Result<Query<DropTableQuery>, QueryRejection>,
) -> Result<StatusCode, RestError> {
    let Query(query) = query.map_err(|e| RestError::bad_request(e.body_text()))?;
    let path = existing_table(&state, &namespace_name, &name).await?;
    hosted_namespace(&state, &namespace_name, "tables are dropped").await?;
    let lake = lake(&state).await?;
    let purge = query
        .purge_requested
        .is_some_and(|purge| purge.eq_ignore_ascii_case("true"));
    match purge {
        true => lake.drop_table(&path).await?,
        false => lake.forget_table(&path).await?,
    }
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn commit_table(
    State(state): Shared,
    Path((namespace_name, name)): Path<(String, String)>,
    body: Bytes,
) -> Result<Json<serde_json::Value>, RestError> {
    let request: CommitTableRequest = serde_json::from_slice(&body)
        .map_err(|e| RestError::bad_request(format!("not a commit request: {e}")))?;
    let path = existing_table(&state, &namespace_name, &name).await?;
    let lake = lake(&state).await?;
    let commit = match lake.is_hosted(&namespace(&namespace_name)?).await? {
        true => commit_hosted(lake, &path, &request.requirements, request.updates).await,
        false => commit_foreign(lake, &path, &request.requirements, request.updates).await,
    };
    let (metadata, location) = commit.map_err(|e| RestError::from(e).of_commit())?;
    Ok(Json(
        json!({ "metadata-location": location, "metadata": metadata }),
    ))
}
