//! Errors at the wire: every failure of a Flight SQL call becomes a gRPC status whose
//! message is the error's text (the SQL error a client shows its user).
//!
//! | error                                             | code               |
//! |---------------------------------------------------|--------------------|
//! | SQL that does not parse, plan or type-check       | `InvalidArgument`  |
//! | a table (or table function) that does not exist   | `NotFound`         |
//! | a feature mink does not have                      | `Unimplemented`    |
//! | an error of the node, with the node's own code    | the node's code    |
//! | the node cannot be reached                        | `Unavailable`      |
//! | memory or disk exhausted                          | `ResourceExhausted`|
//! | anything else (I/O, internal errors)              | `Internal`         |

use datafusion::error::DataFusionError;
use mink_client::ClientError;
use tonic::{Code, Status};

/// Longest error message sent to a client; longer ones are cut (plans can be huge).
const MAX_MESSAGE_CHARS: usize = 4096;

/// The status a failed statement answers.
pub(crate) fn status(error: DataFusionError) -> Status {
    let code = code(&error);
    Status::new(code, bounded(error.to_string()))
}

/// A malformed request (a command, handle or parameter batch the protocol does not allow).
pub(crate) fn invalid(what: impl std::fmt::Display) -> Status {
    Status::invalid_argument(bounded(what.to_string()))
}

/// A failed call to the node, with the node's code.
pub(crate) fn client_status(error: ClientError) -> Status {
    Status::new(client_code(&error), bounded(error.to_string()))
}

/// An Arrow error while encoding or decoding batches at the wire.
pub(crate) fn arrow_status(error: arrow::error::ArrowError) -> Status {
    status(DataFusionError::ArrowError(Box::new(error), None))
}

fn code(error: &DataFusionError) -> Code {
    match error {
        DataFusionError::SQL(..) | DataFusionError::SchemaError(..) => Code::InvalidArgument,
        DataFusionError::Plan(message) if is_not_found(message) => Code::NotFound,
        DataFusionError::Plan(_) | DataFusionError::Configuration(_) => Code::InvalidArgument,
        DataFusionError::NotImplemented(_) | DataFusionError::Substrait(_) => Code::Unimplemented,
        DataFusionError::ResourcesExhausted(_) => Code::ResourceExhausted,
        DataFusionError::ArrowError(..) | DataFusionError::Execution(_) => Code::InvalidArgument,
        DataFusionError::ParquetError(_)
        | DataFusionError::ObjectStore(_)
        | DataFusionError::IoError(_)
        | DataFusionError::Internal(_)
        | DataFusionError::ExecutionJoin(_)
        | DataFusionError::Ffi(_) => Code::Internal,
        DataFusionError::External(source) => match source.downcast_ref::<ClientError>() {
            Some(client) => client_code(client),
            None => match source.downcast_ref::<DataFusionError>() {
                Some(inner) => code(inner),
                None => Code::Internal,
            },
        },
        DataFusionError::Context(_, inner) | DataFusionError::Diagnostic(_, inner) => code(inner),
        DataFusionError::Shared(inner) => code(inner),
        DataFusionError::Collection(errors) => errors.first().map_or(Code::Internal, code),
    }
}

/// The code of a node error as the node answered it.
fn client_code(error: &ClientError) -> Code {
    match error {
        ClientError::Status(status) => status.code(),
        ClientError::Connect { .. } => Code::Unavailable,
        ClientError::Core(_) | ClientError::Arrow(_) => Code::InvalidArgument,
        ClientError::Protocol(_) => Code::Internal,
    }
}

/// DataFusion's planner reports an unknown table or table function as a plan error
/// `table '...' not found`.
fn is_not_found(message: &str) -> bool {
    message.starts_with("table ") && message.ends_with(" not found")
        || message.starts_with("table function ") && message.ends_with(" not found")
}

fn bounded(mut message: String) -> String {
    if message.chars().count() > MAX_MESSAGE_CHARS {
        message = message.chars().take(MAX_MESSAGE_CHARS).collect();
        message.push_str(" ...");
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planner_errors_are_invalid_arguments_and_unknown_tables_not_found() {
        let plan = DataFusionError::Plan("No function matches 'nope'".into());
        assert_eq!(status(plan).code(), Code::InvalidArgument);
        let missing = DataFusionError::Plan("table 'mink.default.nope' not found".into());
        let missing = status(missing);
        assert_eq!(missing.code(), Code::NotFound);
        assert_eq!(
            missing.message(),
            "Error during planning: table 'mink.default.nope' not found"
        );
    }

    #[test]
    fn node_errors_keep_the_node_code_through_context() {
        let node = ClientError::from(Status::already_exists("table 'default.t' already exists"));
        let error = DataFusionError::External(Box::new(node)).context("creating t");
        assert_eq!(code(&error), Code::AlreadyExists);
        assert_eq!(
            code(&DataFusionError::NotImplemented("UNIQUE".into())),
            Code::Unimplemented
        );
    }

    #[test]
    fn long_messages_are_cut() {
        let message = status(DataFusionError::Plan("x".repeat(10_000)))
            .message()
            .len();
        assert!(message < MAX_MESSAGE_CHARS + 100, "{message}");
    }
}
