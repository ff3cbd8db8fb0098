//! The routes of the Iceberg REST spec that mink's catalog does not serve, answered as the
//! spec documents for a catalog without them, not as unknown paths: Iceberg's Java client
//! reads a `404` on a table route as a missing table (before 1.11, whatever its type), so
//! `ALTER TABLE ... RENAME TO` answered `404 NotFoundException` said the table did not
//! exist.
//!
//! | route | answer |
//! |---|---|
//! | `GET /v1/namespaces/{ns}/views` | no views (`404 NoSuchNamespaceException` for a namespace that does not exist) |
//! | `GET`, `HEAD`, `POST`, `DELETE /v1/namespaces/{ns}/views/{v}` | `404 NoSuchViewException`: the catalog holds no views |
//! | `POST /v1/namespaces/{ns}/tables/{t}/metrics` | `204`: a scan's metrics report, taken and dropped (`404 NoSuchTableException` for a table that does not exist) |
//! | renames, registrations, namespace properties, multi-table transactions, scan planning, credentials, creating views | `406 UnsupportedOperationException` |
//!
//! None of them is in `GET /v1/config`'s endpoints, so the clients that read those (Iceberg
//! 1.7 and later) call none of them; older ones do: Spark's view resolution (Iceberg's SQL
//! extensions) loads a view of every name it reads (and must find none), and a metrics
//! report follows every scan (and fails with a warning in the client's log unless taken).

use std::future::{Ready, ready};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::error::RestError;
use crate::namespaces::checked_namespace;
use crate::routes::{CatalogState, Shared};
use crate::tables::existing_table;

/// The spec's routes mink does not serve, with their answers.
pub(crate) fn routes() -> Router<Arc<CatalogState>> {
    Router::new()
        .route(
            "/v1/namespaces/{namespace}/views",
            get(list_views).post(unsupported("views are not served")),
        )
        .route(
            "/v1/namespaces/{namespace}/views/{view}",
            get(no_such_view)
                .post(no_such_view)
                .delete(no_such_view)
                .head(no_view),
        )
        .route(
            "/v1/namespaces/{namespace}/tables/{table}/metrics",
            post(take_metrics),
        )
        .route(
            "/v1/tables/rename",
            post(unsupported(
                "tables are not renamed: mink's tables keep their names, and a client's \
                 hosted table is created anew",
            )),
        )
        .route(
            "/v1/views/rename",
            post(unsupported("views are not served")),
        )
        .route(
            "/v1/namespaces/{namespace}/register",
            post(unsupported(
                "tables are not registered: a client creates its tables in a hosted namespace",
            )),
        )
        .route(
            "/v1/namespaces/{namespace}/register-view",
            post(unsupported("views are not served")),
        )
        .route(
            "/v1/namespaces/{namespace}/properties",
            post(unsupported(
                "a namespace's properties are set when it is created",
            )),
        )
        .route(
            "/v1/transactions/commit",
            post(unsupported(
                "multi-table transactions are not served: commit to each table",
            )),
        )
        .route(
            "/v1/namespaces/{namespace}/tables/{table}/plan",
            post(unsupported(
                "scans are planned by the client: load the table and read its files",
            )),
        )
        .route(
            "/v1/namespaces/{namespace}/tables/{table}/plan/{plan}",
            get(unsupported("scans are planned by the client"))
                .delete(unsupported("scans are planned by the client")),
        )
        .route(
            "/v1/namespaces/{namespace}/tables/{table}/tasks",
            post(unsupported("scans are planned by the client")),
        )
        .route(
            "/v1/namespaces/{namespace}/tables/{table}/credentials",
            get(unsupported(
                "credentials are not vended: clients read the warehouse with their own",
            )),
        )
}

/// A handler answering `406 UnsupportedOperationException` with `why`.
fn unsupported(why: &'static str) -> impl Fn() -> Ready<RestError> + Clone + Send + Sync {
    move || {
        ready(RestError::unsupported(format!(
            "mink's Iceberg REST catalog: {why}"
        )))
    }
}

/// `GET .../views`: a namespace that exists holds no views.
async fn list_views(
    State(state): Shared,
    Path(namespace): Path<String>,
) -> Result<Json<serde_json::Value>, RestError> {
    checked_namespace(&state, &namespace).await?;
    Ok(Json(json!({ "identifiers": [] })))
}

async fn no_such_view(Path((namespace, view)): Path<(String, String)>) -> RestError {
    RestError::no_such_view(&namespace, &view)
}

/// `HEAD .../views/{v}`: the status of [`no_such_view`], without a body.
async fn no_view() -> StatusCode {
    StatusCode::NOT_FOUND
}

/// `POST .../metrics`: the report is dropped once its table is found (the body is read
/// within the catalog's bound, never parsed).
async fn take_metrics(
    State(state): Shared,
    Path((namespace, table)): Path<(String, String)>,
) -> Result<StatusCode, RestError> {
    existing_table(&state, &namespace, &table).await?;
    Ok(StatusCode::NO_CONTENT)
}
