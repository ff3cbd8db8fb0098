//! The REST catalog's error model: a status and `{"error": {"message", "type", "code"}}`,
//! with the exception type names clients map to their own errors.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use iceberg::ErrorKind;
use mink_lake::LakeError;
use serde_json::json;
use tracing::warn;

/// A failed request, answered in the protocol's error model.
#[derive(Debug)]
pub(crate) struct RestError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl RestError {
    pub(crate) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequestException", message)
    }

    pub(crate) fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "NotAuthorizedException", message)
    }

    /// `namespace` as the path names it (levels joined by the unit separator).
    pub(crate) fn no_such_namespace(namespace: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NoSuchNamespaceException",
            format!("namespace {} does not exist", dotted(namespace)),
        )
    }

    pub(crate) fn no_such_table(namespace: &str, table: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NoSuchTableException",
            format!("table {}.{table} does not exist", dotted(namespace)),
        )
    }

    pub(crate) fn no_such_view(namespace: &str, view: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NoSuchViewException",
            format!(
                "view {}.{view} does not exist: mink's catalog holds no views",
                dotted(namespace)
            ),
        )
    }

    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "ForbiddenException", message)
    }

    pub(crate) fn already_exists(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "AlreadyExistsException", message)
    }

    pub(crate) fn unsupported(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::NOT_ACCEPTABLE,
            "UnsupportedOperationException",
            message,
        )
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "NotFoundException", message)
    }

    /// The status alone (the answer to a `HEAD`).
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    /// The failure of a commit: a server error is `CommitStateUnknownException`, as the
    /// spec types a commit's `5xx` (Iceberg's clients take any `500`, `502`, `503` or `504`
    /// of a commit so, and keep the files it names).
    pub(crate) fn of_commit(self) -> Self {
        match self.status.is_server_error() {
            true => Self {
                kind: "CommitStateUnknownException",
                ..self
            },
            false => self,
        }
    }
}

/// A namespace of a path (levels joined by the unit separator, `0x1F`) as messages show it.
fn dotted(namespace: &str) -> String {
    namespace.replace('\u{1f}', ".")
}

impl From<LakeError> for RestError {
    fn from(error: LakeError) -> Self {
        let message = error.to_string();
        match &error {
            LakeError::CommitConflict { .. } => {
                Self::new(StatusCode::CONFLICT, "CommitFailedException", message)
            }
            LakeError::Refused { .. } => {
                Self::new(StatusCode::FORBIDDEN, "ForbiddenException", message)
            }
            LakeError::Iceberg(e) => match e.kind() {
                ErrorKind::TableNotFound => {
                    Self::new(StatusCode::NOT_FOUND, "NoSuchTableException", message)
                }
                ErrorKind::NamespaceNotFound => {
                    Self::new(StatusCode::NOT_FOUND, "NoSuchNamespaceException", message)
                }
                ErrorKind::DataInvalid | ErrorKind::PreconditionFailed => {
                    Self::bad_request(message)
                }
                _ => server_error(message),
            },
            _ => server_error(message),
        }
    }
}

impl From<iceberg::Error> for RestError {
    fn from(error: iceberg::Error) -> Self {
        LakeError::from(error).into()
    }
}

/// A failure of the server, not the request: logged, answered 500.
pub(crate) fn server_error(message: String) -> RestError {
    warn!(%message, "Iceberg REST request failed");
    RestError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "ServiceFailureException",
        message,
    )
}

impl IntoResponse for RestError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "code": self.status.as_u16(),
            }
        });
        (self.status, Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_things_name_their_namespace_levels_with_dots() {
        let table = RestError::no_such_table("demo\u{1f}events", "snapshots");
        assert_eq!(
            (table.status, table.kind),
            (StatusCode::NOT_FOUND, "NoSuchTableException")
        );
        assert_eq!(table.message, "table demo.events.snapshots does not exist");
        let namespace = RestError::no_such_namespace("demo\u{1f}events");
        assert_eq!(namespace.kind, "NoSuchNamespaceException");
        assert_eq!(namespace.message, "namespace demo.events does not exist");
        assert_eq!(
            RestError::no_such_view("demo", "v").kind,
            "NoSuchViewException"
        );
    }

    #[test]
    fn a_commit_failing_on_the_server_has_an_unknown_outcome() {
        let failed = RestError::from(LakeError::Config("the catalog is gone".into())).of_commit();
        assert_eq!(
            (failed.status, failed.kind),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "CommitStateUnknownException"
            )
        );
        // A refusal is known: nothing was committed.
        for (error, kind) in [
            (RestError::bad_request("no"), "BadRequestException"),
            (RestError::forbidden("no"), "ForbiddenException"),
            (RestError::no_such_table("t", "t"), "NoSuchTableException"),
        ] {
            assert_eq!(error.of_commit().kind, kind);
        }
    }
}
