//! Statement handles and tickets: stateless, so any server instance can answer any call.
//!
//! A prepared statement's handle *is* the statement: its SQL and, once the client has
//! bound them, its parameters. Binding parameters answers a new handle carrying them
//! (Flight SQL's `DoPutPreparedStatementResult`), so the server keeps nothing between
//! calls and closing a prepared statement frees nothing. The ticket of a statement's
//! FlightInfo is built the same way, plus the schema the FlightInfo announced: the
//! statement is planned again when the ticket is redeemed, and if a table changed in
//! between so that the rows would not have that schema, the ticket is refused rather
//! than streaming something else. For a statement that ran while it was planned (DML,
//! DDL, `CALL`) the ticket carries the statement's result instead, so the statement runs
//! exactly once however often the ticket is redeemed.
//!
//! ```text
//! handle = "mkh1" ++ protobuf { 1: sql, 2: parameters (Arrow IPC stream) }
//! ticket = "mkh1" ++ protobuf { 1: sql, 2: parameters, 4: announced schema (Arrow IPC stream), 5: nonce }
//!        | "mkh1" ++ protobuf { 3: result (Arrow IPC stream) }
//! ```
//!
//! The magic prefix tells a mink handle from any other bytes: a handle that does not
//! decode is answered `InvalidArgument`. The random nonce makes every `Run` ticket
//! unique, so that cancelling one client's query (which names its ticket) never
//! cancels another client's run of the same SQL.

use std::io::Cursor;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use mink_core::ipc_guard::check_stream;
use prost::Message;

/// The bytes every mink handle starts with (`1` is the format version).
const MAGIC: &[u8; 4] = b"mkh1";

/// A statement and its bound parameters: what a prepared-statement handle or a
/// statement ticket names.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StatementHandle {
    /// The SQL, with `$1, $2, ...` placeholders.
    pub(crate) sql: String,
    /// The bound parameters: one row per execution; column `i` is `$(i + 1)`.
    pub(crate) parameters: Option<RecordBatch>,
}

/// What a ticket of a statement's FlightInfo asks for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ticket {
    /// Run the statement and stream its rows, which have the announced schema.
    Run(StatementHandle, SchemaRef),
    /// Stream a result computed when the statement was planned.
    Computed(SchemaRef, Vec<RecordBatch>),
}

#[derive(Clone, PartialEq, prost::Message)]
struct HandleProto {
    #[prost(string, tag = "1")]
    sql: String,
    #[prost(bytes = "vec", tag = "2")]
    parameters: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    result: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    schema: Vec<u8>,
    #[prost(uint64, tag = "5")]
    nonce: u64,
}

impl StatementHandle {
    /// A statement with no parameters bound.
    pub(crate) fn new(sql: impl Into<String>) -> Self {
        Self {
            sql: sql.into(),
            parameters: None,
        }
    }

    /// The handle's bytes.
    ///
    /// # Errors
    /// The parameters cannot be IPC-encoded.
    pub(crate) fn encode(&self) -> Result<Vec<u8>, ArrowError> {
        encode(&self.proto()?)
    }

    /// The statement a handle names.
    ///
    /// # Errors
    /// The bytes are not a mink statement handle.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, String> {
        let proto = decode(bytes)?;
        if !proto.result.is_empty() || !proto.schema.is_empty() {
            return Err(unknown(bytes, &"a ticket is not a prepared statement"));
        }
        Self::from_proto(bytes, proto)
    }

    fn proto(&self) -> Result<HandleProto, ArrowError> {
        Ok(HandleProto {
            sql: self.sql.clone(),
            parameters: match &self.parameters {
                Some(batch) => ipc_bytes(batch.schema_ref(), std::slice::from_ref(batch))?,
                None => Vec::new(),
            },
            ..HandleProto::default()
        })
    }

    fn from_proto(bytes: &[u8], proto: HandleProto) -> Result<Self, String> {
        let parameters = if proto.parameters.is_empty() {
            None
        } else {
            let (_, batches) = ipc_batches(&proto.parameters).map_err(|e| unknown(bytes, &e))?;
            match <[RecordBatch; 1]>::try_from(batches) {
                Ok([batch]) => Some(batch),
                Err(_) => return Err(unknown(bytes, &"parameters are not one batch")),
            }
        };
        Ok(Self {
            sql: proto.sql,
            parameters,
        })
    }
}

impl Ticket {
    /// The Arrow memory of the rows the ticket carries: its parameters, or its result.
    pub(crate) fn carried_bytes(&self) -> usize {
        let batches = match self {
            Self::Run(handle, _) => handle.parameters.as_slice(),
            Self::Computed(_, batches) => batches.as_slice(),
        };
        batches.iter().map(RecordBatch::get_array_memory_size).sum()
    }

    /// The ticket's bytes.
    ///
    /// # Errors
    /// The parameters or the result cannot be IPC-encoded.
    pub(crate) fn encode(&self) -> Result<Vec<u8>, ArrowError> {
        let proto = match self {
            Self::Run(handle, schema) => HandleProto {
                schema: ipc_bytes(schema, &[])?,
                nonce: rand::random(),
                ..handle.proto()?
            },
            Self::Computed(schema, batches) => HandleProto {
                result: ipc_bytes(schema, batches)?,
                ..HandleProto::default()
            },
        };
        encode(&proto)
    }

    /// The ticket `bytes` encode.
    ///
    /// # Errors
    /// The bytes are not a mink ticket (a message saying so).
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, String> {
        let proto = decode(bytes)?;
        if !proto.result.is_empty() {
            let (schema, batches) = ipc_batches(&proto.result).map_err(|e| unknown(bytes, &e))?;
            return Ok(Self::Computed(schema, batches));
        }
        if proto.schema.is_empty() {
            return Err(unknown(bytes, &"a prepared statement is not a ticket"));
        }
        let (schema, _) = ipc_batches(&proto.schema).map_err(|e| unknown(bytes, &e))?;
        Ok(Self::Run(
            StatementHandle::from_proto(bytes, proto)?,
            schema,
        ))
    }
}

fn encode(proto: &HandleProto) -> Result<Vec<u8>, ArrowError> {
    let mut bytes = MAGIC.to_vec();
    proto
        .encode(&mut bytes)
        .map_err(|e| ArrowError::IpcError(e.to_string()))?;
    Ok(bytes)
}

fn decode(bytes: &[u8]) -> Result<HandleProto, String> {
    bytes
        .strip_prefix(MAGIC)
        .ok_or_else(|| unknown(bytes, &"not issued by a mink server"))
        .and_then(|rest| HandleProto::decode(rest).map_err(|e| unknown(bytes, &e)))
}

fn unknown(bytes: &[u8], why: &dyn std::fmt::Display) -> String {
    format!("unknown statement handle ({} bytes): {why}", bytes.len())
}

fn ipc_bytes(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Vec<u8>, ArrowError> {
    let mut writer = StreamWriter::try_new(Vec::new(), schema)?;
    for batch in batches {
        writer.write(batch)?;
    }
    writer.into_inner()
}

fn ipc_batches(bytes: &[u8]) -> Result<(SchemaRef, Vec<RecordBatch>), ArrowError> {
    check_stream(bytes).map_err(|e| ArrowError::IpcError(e.to_string()))?;
    let reader = StreamReader::try_new(Cursor::new(bytes), None)?;
    let schema = Arc::clone(&reader.schema());
    let batches = reader.collect::<Result<_, _>>()?;
    Ok((schema, batches))
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, StringArray, UInt64Array};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::ipc::CompressionType;
    use arrow::ipc::writer::IpcWriteOptions;

    use super::*;

    fn parameters() -> RecordBatch {
        RecordBatch::try_from_iter(vec![
            ("0", Arc::new(Int64Array::from(vec![7, 8])) as _),
            ("1", Arc::new(StringArray::from(vec![Some("a"), None])) as _),
        ])
        .unwrap()
    }

    #[test]
    fn a_handle_carries_its_sql_and_parameters() {
        let bare = StatementHandle::new("SELECT 1");
        assert_eq!(
            StatementHandle::decode(&bare.encode().unwrap()).unwrap(),
            bare
        );
        let bound = StatementHandle {
            sql: "SELECT * FROM t WHERE id = $1 AND name = $2".into(),
            parameters: Some(parameters()),
        };
        assert_eq!(
            StatementHandle::decode(&bound.encode().unwrap()).unwrap(),
            bound
        );
    }

    #[test]
    fn a_run_ticket_carries_its_statement_and_announced_schema() {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let statement = StatementHandle {
            sql: "SELECT id FROM t WHERE name = $2 OR id = $1".into(),
            parameters: Some(parameters()),
        };
        let ticket = Ticket::Run(statement.clone(), schema);
        let bytes = ticket.encode().unwrap();
        assert_eq!(Ticket::decode(&bytes).unwrap(), ticket);
        assert_ne!(ticket.encode().unwrap(), bytes, "every ticket is unique");
        assert!(StatementHandle::decode(&bytes).is_err());
        assert!(Ticket::decode(&statement.encode().unwrap()).is_err());
    }

    #[test]
    fn a_computed_ticket_carries_its_result_even_when_empty() {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "count",
            DataType::UInt64,
            true,
        )]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(UInt64Array::from(vec![3]))],
        )
        .unwrap();
        for batches in [vec![batch], vec![]] {
            let ticket = Ticket::Computed(Arc::clone(&schema), batches);
            assert_eq!(Ticket::decode(&ticket.encode().unwrap()).unwrap(), ticket);
        }
        let empty = Arc::new(Schema::empty());
        let ticket = Ticket::Computed(Arc::clone(&empty), vec![]);
        assert_eq!(Ticket::decode(&ticket.encode().unwrap()).unwrap(), ticket);
    }

    #[test]
    fn foreign_bytes_are_not_a_handle() {
        for bytes in [&b""[..], b"SELECT 1", b"mkh1\xff\xff\xff", b"mkh2"] {
            let error = StatementHandle::decode(bytes).unwrap_err();
            assert!(error.starts_with("unknown statement handle"), "{error}");
        }
        let computed = Ticket::Computed(Arc::new(Schema::empty()), vec![])
            .encode()
            .unwrap();
        assert!(StatementHandle::decode(&computed).is_err());
    }

    #[test]
    fn a_handle_with_compressed_parameters_is_refused_before_they_are_decoded() {
        let batch = parameters();
        let options = IpcWriteOptions::default()
            .try_with_compression(Some(CompressionType::LZ4_FRAME))
            .unwrap();
        let mut writer =
            StreamWriter::try_new_with_options(Vec::new(), batch.schema_ref(), options).unwrap();
        writer.write(&batch).unwrap();
        let proto = HandleProto {
            sql: "SELECT $1, $2".into(),
            parameters: writer.into_inner().unwrap(),
            ..HandleProto::default()
        };
        let error = StatementHandle::decode(&encode(&proto).unwrap()).unwrap_err();
        assert!(
            error.contains("compressed Arrow IPC is not accepted"),
            "{error}"
        );
    }
}
