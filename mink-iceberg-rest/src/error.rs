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

    pub(crate) fn no_such_namespace(namespace: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NoSuchNamespaceException",
            format!("namespace {namespace} does not exist"),
        )
    }

    pub(crate) fn no_such_table(namespace: &str, table: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NoSuchTableException",
            format!("table {namespace}.{table} does not exist"),
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

impl From<mink_node::NodeError> for RestError {
    fn from(error: mink_node::NodeError) -> Self {
        server_error(error.to_string())
    }
}

fn server_error(message: String) -> RestError {
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
