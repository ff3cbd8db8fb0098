//! Errors at the wire: every failure of a Flight SQL call becomes a gRPC status whose
//! message is the error's text (the SQL error a client shows its user).
//!
//! | error                                             | code               |
//! |---------------------------------------------------|--------------------|
//! | SQL that does not parse, plan or type-check       | `InvalidArgument`  |
//! | a statement refused because it would touch the server's files (`COPY`, `CREATE EXTERNAL TABLE`, ...: a plan error) | `InvalidArgument` |
//! | a value the statement cannot compute (a cast that fails, division by zero, overflow) | `InvalidArgument` |
//! | malformed Arrow data from the client              | `InvalidArgument`  |
//! | a table (or table function) that does not exist   | `NotFound`         |
//! | a feature mink does not have                      | `Unimplemented`    |
//! | an error of the node, with the node's own code    | the node's code    |
//! | the node or the lake's object store cannot be reached | `Unavailable`  |
//! | a SQL worker cannot be reached or is lost during the statement (named in the message) | `Unavailable` |
//! | Arrow data of the node or lake the server cannot read | `Internal`    |
//! | memory or disk exhausted (a statement, or a buffer a call holds for its client, over the server's SQL memory pool: DataFusion's `ResourcesExhausted`, however deeply wrapped) | `ResourceExhausted`|
//! | anything else (I/O, internal errors)              | `Internal`         |

use arrow::error::ArrowError;
use arrow_flight::error::FlightError;
use datafusion::error::DataFusionError;
use datafusion::parquet::errors::ParquetError;
use mink_client::ClientError;
use mink_sql::distributed::is_worker_unavailable;
use tonic::{Code, Status};

/// Longest error message sent to a client; longer ones are cut (plans can be huge).
const MAX_MESSAGE_CHARS: usize = 4096;

/// The status a failed statement answers.
pub(crate) fn status(error: DataFusionError) -> Status {
    let code = match is_worker_unavailable(&error) {
        true => Code::Unavailable,
        false => code(&error),
    };
    if code == Code::ResourceExhausted {
        // Every refusal of the memory pool a client is told of passes here.
        mink_metrics::metrics().memory_refusals.inc();
    }
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
pub(crate) fn arrow_status(error: ArrowError) -> Status {
    status(DataFusionError::ArrowError(Box::new(error), None))
}

/// A failure reading a client's `DoPut` stream: the client's own status when the
/// transport failed, otherwise Arrow data the server cannot decode.
pub(crate) fn put_stream_status(error: FlightError) -> Status {
    match error {
        FlightError::Tonic(status) => *status,
        other => invalid(format!("malformed Arrow data in the DoPut stream: {other}")),
    }
}

/// The gRPC code of a DataFusion error, however deeply wrapped.
pub(crate) fn code(error: &DataFusionError) -> Code {
    match error {
        DataFusionError::SQL(..) | DataFusionError::SchemaError(..) => Code::InvalidArgument,
        DataFusionError::Plan(message) if is_not_found(message) => Code::NotFound,
        DataFusionError::Plan(_) | DataFusionError::Configuration(_) => Code::InvalidArgument,
        DataFusionError::NotImplemented(_) | DataFusionError::Substrait(_) => Code::Unimplemented,
        DataFusionError::ResourcesExhausted(_) => Code::ResourceExhausted,
        DataFusionError::ArrowError(error, _) => arrow_code(error),
        // DataFusion reports values a function cannot compute as execution errors.
        DataFusionError::Execution(_) => Code::InvalidArgument,
        DataFusionError::ObjectStore(error) => object_store_code(error),
        DataFusionError::ParquetError(error) => match error.as_ref() {
            // A lake scan's reader refusing a fetch over the memory pool, say.
            ParquetError::External(source) => external_code(source.as_ref()),
            _ => Code::Internal,
        },
        DataFusionError::IoError(_)
        | DataFusionError::Internal(_)
        | DataFusionError::ExecutionJoin(_)
        | DataFusionError::Ffi(_) => Code::Internal,
        DataFusionError::External(source) => external_code(source.as_ref()),
        DataFusionError::Context(_, inner) | DataFusionError::Diagnostic(_, inner) => code(inner),
        DataFusionError::Shared(inner) => code(inner),
        DataFusionError::Collection(errors) => errors.first().map_or(Code::Internal, code),
    }
}

/// Arrow errors computing a statement's values are the statement's; errors reading or
/// writing Arrow data (the node's, the lake's, or the server's own answers) are the
/// server's.
fn arrow_code(error: &ArrowError) -> Code {
    match error {
        ArrowError::CastError(_)
        | ArrowError::ParseError(_)
        | ArrowError::ComputeError(_)
        | ArrowError::DivideByZero
        | ArrowError::ArithmeticOverflow(_)
        | ArrowError::InvalidArgumentError(_)
        | ArrowError::SchemaError(_)
        | ArrowError::CsvError(_)
        | ArrowError::JsonError(_)
        | ArrowError::AvroError(_) => Code::InvalidArgument,
        ArrowError::NotYetImplemented(_) => Code::Unimplemented,
        ArrowError::MemoryError(_) => Code::ResourceExhausted,
        ArrowError::ExternalError(source) => external_code(source.as_ref()),
        ArrowError::IoError(..)
        | ArrowError::IpcError(_)
        | ArrowError::ParquetError(_)
        | ArrowError::CDataInterface(_)
        | ArrowError::DictionaryKeyOverflowError
        | ArrowError::RunEndIndexOverflowError
        | ArrowError::OffsetOverflowError(_) => Code::Internal,
    }
}

/// An object store that does not answer may answer later; anything else it says (a
/// missing file, refused credentials) is the server's lake or configuration at fault.
fn object_store_code(error: &object_store::Error) -> Code {
    match error {
        object_store::Error::Generic { .. } => Code::Unavailable,
        _ => Code::Internal,
    }
}

/// The code of an error DataFusion or Arrow carries from elsewhere: the node's, or the
/// one of the DataFusion or Arrow error inside.
fn external_code(source: &(dyn std::error::Error + Send + Sync + 'static)) -> Code {
    if let Some(client) = source.downcast_ref::<ClientError>() {
        client_code(client)
    } else if let Some(inner) = source.downcast_ref::<DataFusionError>() {
        code(inner)
    } else if let Some(inner) = source.downcast_ref::<ArrowError>() {
        arrow_code(inner)
    } else if let Some(inner) = source.downcast_ref::<object_store::Error>() {
        object_store_code(inner)
    } else {
        Code::Internal
    }
}

/// The code of a node error as the node answered it.
fn client_code(error: &ClientError) -> Code {
    match error {
        ClientError::Status(status) => status.code(),
        ClientError::Connect { .. } => Code::Unavailable,
        ClientError::Core(_) | ClientError::Arrow(_) => Code::InvalidArgument,
        ClientError::Protocol(_) => Code::Internal,
        ClientError::PartlyWritten { error, .. } => client_code(error),
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
    fn computation_errors_are_the_statement_s_and_machine_errors_the_server_s() {
        let arrow = |e| DataFusionError::ArrowError(Box::new(e), None);
        assert_eq!(
            code(&arrow(ArrowError::DivideByZero)),
            Code::InvalidArgument
        );
        assert_eq!(
            code(&arrow(ArrowError::CastError("'x' is not a number".into()))),
            Code::InvalidArgument
        );
        assert_eq!(
            code(&arrow(ArrowError::MemoryError("1 TB".into()))),
            Code::ResourceExhausted
        );
        let io = std::io::Error::other("disk gone");
        assert_eq!(
            code(&arrow(ArrowError::IoError("reading".into(), io))),
            Code::Internal
        );
        let node = ClientError::from(Status::unavailable("node stopping"));
        assert_eq!(
            code(&arrow(ArrowError::ExternalError(Box::new(node)))),
            Code::Unavailable
        );
    }

    #[test]
    fn an_exhausted_memory_pool_is_resource_exhausted_however_wrapped() {
        let exhausted = || DataFusionError::ResourcesExhausted("Failed to allocate 1 MB".into());
        assert_eq!(status(exhausted()).code(), Code::ResourceExhausted);
        let shared = DataFusionError::Shared(std::sync::Arc::new(exhausted()));
        assert_eq!(code(&shared.context("sorting")), Code::ResourceExhausted);
        let in_arrow = ArrowError::ExternalError(Box::new(exhausted()));
        let external = DataFusionError::External(Box::new(in_arrow));
        assert_eq!(code(&external), Code::ResourceExhausted);
        let collected =
            DataFusionError::Collection(vec![exhausted(), DataFusionError::Internal("x".into())]);
        assert_eq!(code(&collected), Code::ResourceExhausted);
        let fetching =
            DataFusionError::ParquetError(Box::new(ParquetError::External(Box::new(exhausted()))));
        assert_eq!(code(&fetching), Code::ResourceExhausted);
    }

    #[test]
    fn a_lost_sql_worker_is_unavailable() {
        // As datafusion-distributed reports a plan it could not send.
        let error = DataFusionError::Execution(
            "Error sending plan to worker http://10.0.0.7:9125/: status: Unavailable, \
             message: \"SQL worker unavailable: http://10.0.0.7:9125/ cannot be reached\""
                .into(),
        );
        assert_eq!(status(error).code(), Code::Unavailable);
    }

    #[test]
    fn malformed_client_data_is_an_invalid_argument() {
        let malformed = FlightError::DecodeError("no schema before the first batch".into());
        assert_eq!(put_stream_status(malformed).code(), Code::InvalidArgument);
        let gone = FlightError::Tonic(Box::new(Status::cancelled("client went away")));
        assert_eq!(put_stream_status(gone).code(), Code::Cancelled);
    }

    #[test]
    fn long_messages_are_cut() {
        let message = status(DataFusionError::Plan("x".repeat(10_000)))
            .message()
            .len();
        assert!(message < MAX_MESSAGE_CHARS + 100, "{message}");
    }
}
