//! The Flight SQL service: each call decoded by arrow-flight's [`FlightSqlService`] and
//! handed to the module that does the work: [`statement`](super::statement) (queries,
//! updates), [`prepared`] and [`handle`](super::handle) (prepared
//! statements), [`ingest`], [`metadata`],
//! [`sql_info`](super::sql_info), [`auth`](super::auth) (the handshake).
//!
//! Results leave as FlightInfo with one endpoint and no locations (the client fetches
//! from the server it asked), then as a `DoGet` stream of the ticket.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::metadata::{SqlInfoData, XdbcTypeInfoData};
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionCancelQueryRequest, ActionCancelQueryResult, ActionClosePreparedStatementRequest,
    ActionCreatePreparedStatementRequest, ActionCreatePreparedStatementResult, Any, Command,
    CommandGetCatalogs, CommandGetCrossReference, CommandGetDbSchemas, CommandGetExportedKeys,
    CommandGetImportedKeys, CommandGetPrimaryKeys, CommandGetSqlInfo, CommandGetTableTypes,
    CommandGetTables, CommandGetXdbcTypeInfo, CommandPreparedStatementQuery,
    CommandPreparedStatementUpdate, CommandStatementIngest, CommandStatementQuery,
    CommandStatementUpdate, DoPutPreparedStatementResult, ProstMessageExt, SqlInfo,
    TicketStatementQuery,
};
use arrow_flight::{
    Action, ActionType, CancelFlightInfoRequest, CancelFlightInfoResult, CancelStatus,
    FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, IpcMessage, SchemaAsIpc,
    Ticket as FlightTicket,
};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::TryStreamExt;
use prost::Message;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Auth, HandshakeStream};
use crate::error::{arrow_status, invalid, status};
use crate::handle::{StatementHandle, Ticket};
use crate::limits::{ANSWER_COPIES, DECODED_COPIES};
use crate::memory::CallMemory;
use crate::running::{DataStream, Running};
use crate::statement::Statements;
use crate::{ingest, metadata, prepared};

/// Flight's session actions, answered without keeping a session (every call is
/// independent): `SetSessionOptions` accepts every option, `CloseSession` closes.
const SET_SESSION_OPTIONS: &str = "SetSessionOptions";
const GET_SESSION_OPTIONS: &str = "GetSessionOptions";
const CLOSE_SESSION: &str = "CloseSession";
/// Flight's cancellation of a FlightInfo's streams.
const CANCEL_FLIGHT_INFO: &str = "CancelFlightInfo";
/// `CloseSessionResult { status: CLOSED }`.
const SESSION_CLOSED: [u8; 2] = [0x08, 0x01];

type DoGetStream = <MinkFlightSql as FlightService>::DoGetStream;
type DoActionStream = <MinkFlightSql as FlightService>::DoActionStream;

/// mink's Flight SQL service.
pub(crate) struct MinkFlightSql {
    statements: Statements,
    running: Running,
    auth: Arc<Auth>,
    sql_info: SqlInfoData,
    xdbc_types: XdbcTypeInfoData,
}

impl std::fmt::Debug for MinkFlightSql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MinkFlightSql")
            .field("statements", &self.statements)
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

impl MinkFlightSql {
    pub(crate) fn new(
        statements: Statements,
        running: Running,
        auth: Arc<Auth>,
        sql_info: SqlInfoData,
        xdbc_types: XdbcTypeInfoData,
    ) -> Self {
        Self {
            statements,
            running,
            auth,
            sql_info,
            xdbc_types,
        }
    }

    /// Plans a statement: its FlightInfo, whose ticket streams its result. The rows
    /// the ticket carries are kept in the call's memory until the answer is sent.
    async fn statement_info(
        &self,
        handle: StatementHandle,
        descriptor: FlightDescriptor,
        memory: &CallMemory,
    ) -> Result<Response<FlightInfo>, Status> {
        let _planning = memory.planning(&handle.sql)?;
        // DML and commands (DDL, `CALL`) run while they are planned.
        let planned = self.statements.plan(handle);
        let (schema, ticket) = self
            .running
            .call(async { planned.await.map_err(status) })
            .await?;
        memory.keep(
            ANSWER_COPIES * ticket.carried_bytes(),
            "the ticket of a FlightInfo",
        )?;
        let ticket = TicketStatementQuery {
            statement_handle: ticket.encode().map_err(arrow_status)?.into(),
        };
        info(&streamed_schema(schema)?, ticket.as_any(), descriptor)
    }

    /// The schema a statement's rows will stream in, found without running it.
    pub(crate) async fn statement_schema(
        &self,
        handle: StatementHandle,
        memory: &CallMemory,
    ) -> Result<Schema, Status> {
        let _planning = memory.planning(&handle.sql)?;
        let schema = self.statements.schema(&handle).await.map_err(status)?;
        streamed_schema(schema)
    }

    /// Cancels the running result streams of the tickets `info` names.
    ///
    /// # Errors
    /// `NotFound` when none of them is running (never run, finished, or cancelled).
    fn cancel(&self, info: &FlightInfo) -> Result<CancelStatus, Status> {
        let cancelled: usize = info
            .endpoint
            .iter()
            .filter_map(|endpoint| endpoint.ticket.as_ref())
            .map(|ticket| self.running.cancel(&ticket.ticket))
            .sum();
        match cancelled {
            0 => Err(Status::not_found(
                "no result of that FlightInfo is being read (finished, or never fetched)",
            )),
            _ => Ok(CancelStatus::Cancelled),
        }
    }

    async fn session(&self) -> Result<mink_sql::session::MinkSession, Status> {
        self.statements.session().await.map_err(status)
    }
}

/// A FlightInfo of one endpoint (no locations: fetch from this server) whose ticket is
/// `ticket`.
fn info(
    schema: &Schema,
    ticket: Any,
    descriptor: FlightDescriptor,
) -> Result<Response<FlightInfo>, Status> {
    let endpoint = FlightEndpoint::new().with_ticket(FlightTicket::new(ticket.encode_to_vec()));
    let info = FlightInfo::new()
        .try_with_schema(schema)
        .map_err(arrow_status)?
        .with_endpoint(endpoint)
        .with_descriptor(descriptor)
        .with_ordered(true);
    Ok(Response::new(info))
}

/// The FlightInfo of a metadata command: its ticket is the command itself.
fn metadata_info(
    schema: &Schema,
    command: &impl ProstMessageExt,
    request: Request<FlightDescriptor>,
) -> Result<Response<FlightInfo>, Status> {
    info(schema, command.as_any(), request.into_inner())
}

/// The schema rows of `schema` stream in: [`flight_stream`] sends dictionary-encoded
/// columns as their values, so that is what a FlightInfo must announce. It is the
/// schema the encoder would send.
fn streamed_schema(schema: SchemaRef) -> Result<Schema, Status> {
    let encoder = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(futures::stream::empty());
    let schema = encoder
        .known_schema()
        .ok_or_else(|| Status::internal("the encoder knows no schema"))?;
    Ok(schema.as_ref().clone())
}

/// Record batches as Flight data, encoded as the client reads.
fn flight_stream(rows: SendableRecordBatchStream) -> DataStream {
    let schema = rows.schema();
    let rows = rows.map_err(|e| FlightError::Tonic(Box::new(status(e))));
    let data = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(rows)
        .map_err(Status::from);
    Box::pin(data)
}

/// Streams one computed batch.
fn batch_stream(batch: RecordBatch) -> Response<DoGetStream> {
    let schema: SchemaRef = batch.schema();
    Response::new(flight_stream(Box::pin(RecordBatchStreamAdapter::new(
        schema,
        futures::stream::iter([Ok(batch)]),
    ))))
}

pub(crate) fn schema_bytes(schema: &Schema) -> Result<prost::bytes::Bytes, Status> {
    let IpcMessage(bytes) = SchemaAsIpc::new(schema, &IpcWriteOptions::default())
        .try_into()
        .map_err(arrow_status)?;
    Ok(bytes)
}

/// The statement a handle names, [`DECODED_COPIES`] times its bytes kept in the call's
/// memory first.
pub(crate) fn decode_handle(bytes: &[u8], memory: &CallMemory) -> Result<StatementHandle, Status> {
    memory.keep(DECODED_COPIES * bytes.len(), "a statement handle")?;
    StatementHandle::decode(bytes).map_err(invalid)
}

#[tonic::async_trait]
impl FlightSqlService for MinkFlightSql {
    type FlightService = Self;

    async fn do_handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<HandshakeStream>, Status> {
        self.auth.handshake_response(request.metadata())
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let memory = CallMemory::of(&request)?;
        let handle = StatementHandle::new(query.query);
        self.statement_info(handle, request.into_inner(), &memory)
            .await
    }

    async fn get_flight_info_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let memory = CallMemory::of(&request)?;
        let handle = decode_handle(&query.prepared_statement_handle, &memory)?;
        self.statement_info(handle, request.into_inner(), &memory)
            .await
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        metadata_info(&query.into_builder().schema(), &query, request)
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        metadata_info(&query.clone().into_builder().schema(), &query, request)
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        metadata_info(&query.clone().into_builder().schema(), &query, request)
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        metadata_info(&query.into_builder().schema(), &query, request)
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(&self.sql_info).schema();
        metadata_info(&schema, &query, request)
    }

    async fn get_flight_info_primary_keys(
        &self,
        query: CommandGetPrimaryKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        metadata_info(&metadata::primary_keys_schema(), &query, request)
    }

    async fn get_flight_info_exported_keys(
        &self,
        query: CommandGetExportedKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        metadata_info(&metadata::foreign_keys_schema(), &query, request)
    }

    async fn get_flight_info_imported_keys(
        &self,
        query: CommandGetImportedKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        metadata_info(&metadata::foreign_keys_schema(), &query, request)
    }

    async fn get_flight_info_cross_reference(
        &self,
        query: CommandGetCrossReference,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        metadata_info(&metadata::foreign_keys_schema(), &query, request)
    }

    async fn get_flight_info_xdbc_type_info(
        &self,
        query: CommandGetXdbcTypeInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder(&self.xdbc_types).schema();
        metadata_info(&schema, &query, request)
    }

    async fn get_flight_info_fallback(
        &self,
        command: Command,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Err(unknown_command(command))
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<FlightTicket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let memory = CallMemory::of(&request)?;
        let bytes = ticket.statement_handle.len();
        memory.keep(DECODED_COPIES * bytes, "a ticket")?;
        let statement = Ticket::decode(&ticket.statement_handle).map_err(invalid)?;
        let planning = match &statement {
            Ticket::Run(handle, _) => Some(memory.planning(&handle.sql)?),
            Ticket::Computed(..) => None,
        };
        let rows = self.statements.stream(statement).await?;
        drop(planning);
        let ticket = request.into_inner().ticket;
        Ok(Response::new(
            self.running.stream(ticket, flight_stream(rows)),
        ))
    }

    async fn do_get_catalogs(
        &self,
        _query: CommandGetCatalogs,
        _request: Request<FlightTicket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let session = self.session().await?;
        Ok(batch_stream(metadata::catalogs(&session)?))
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        _request: Request<FlightTicket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let session = self.session().await?;
        let batch = metadata::db_schemas(&session, query)?;
        Ok(batch_stream(batch))
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        _request: Request<FlightTicket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let session = self.session().await?;
        let batch = metadata::tables(&session, query).await?;
        Ok(batch_stream(batch))
    }

    async fn do_get_table_types(
        &self,
        _query: CommandGetTableTypes,
        _request: Request<FlightTicket>,
    ) -> Result<Response<DoGetStream>, Status> {
        Ok(batch_stream(metadata::table_types()?))
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _request: Request<FlightTicket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let batch = query.into_builder(&self.sql_info).build();
        Ok(batch_stream(batch.map_err(Status::from)?))
    }

    async fn do_get_primary_keys(
        &self,
        query: CommandGetPrimaryKeys,
        _request: Request<FlightTicket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let batch = metadata::primary_keys(self.statements.client(), query).await?;
        Ok(batch_stream(batch))
    }

    async fn do_get_exported_keys(
        &self,
        _query: CommandGetExportedKeys,
        _request: Request<FlightTicket>,
    ) -> Result<Response<DoGetStream>, Status> {
        Ok(batch_stream(RecordBatch::new_empty(
            metadata::foreign_keys_schema(),
        )))
    }

    async fn do_get_imported_keys(
        &self,
        _query: CommandGetImportedKeys,
        _request: Request<FlightTicket>,
    ) -> Result<Response<DoGetStream>, Status> {
        Ok(batch_stream(RecordBatch::new_empty(
            metadata::foreign_keys_schema(),
        )))
    }

    async fn do_get_cross_reference(
        &self,
        _query: CommandGetCrossReference,
        _request: Request<FlightTicket>,
    ) -> Result<Response<DoGetStream>, Status> {
        Ok(batch_stream(RecordBatch::new_empty(
            metadata::foreign_keys_schema(),
        )))
    }

    async fn do_get_xdbc_type_info(
        &self,
        query: CommandGetXdbcTypeInfo,
        _request: Request<FlightTicket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let batch = query.into_builder(&self.xdbc_types).build();
        Ok(batch_stream(batch.map_err(Status::from)?))
    }

    async fn do_get_fallback(
        &self,
        _request: Request<FlightTicket>,
        message: Any,
    ) -> Result<Response<DoGetStream>, Status> {
        Err(invalid(format!("unknown ticket type {}", message.type_url)))
    }

    async fn do_put_statement_update(
        &self,
        command: CommandStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let memory = CallMemory::of(&request)?;
        let handle = StatementHandle::new(command.query);
        let update = self
            .statements
            .update(&handle, futures::stream::empty(), &memory);
        self.running.call(update).await
    }

    async fn do_put_statement_ingest(
        &self,
        command: CommandStatementIngest,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let memory = CallMemory::of(&request)?;
        let ingest = ingest::ingest(
            self.statements.client(),
            &command,
            request.into_inner(),
            &memory,
        );
        self.running.call(ingest).await
    }

    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let memory = CallMemory::of(&request)?;
        let mut handle = decode_handle(&query.prepared_statement_handle, &memory)?;
        handle.parameters = prepared::parameters(request.into_inner(), &memory).await?;
        Ok(DoPutPreparedStatementResult {
            prepared_statement_handle: Some(handle.encode().map_err(arrow_status)?.into()),
        })
    }

    async fn do_put_prepared_statement_update(
        &self,
        query: CommandPreparedStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let memory = CallMemory::of(&request)?;
        let handle = decode_handle(&query.prepared_statement_handle, &memory)?;
        let parameters = prepared::parameter_batches(request.into_inner());
        let update = self.statements.update(&handle, parameters, &memory);
        self.running.call(update).await
    }

    async fn do_put_fallback(
        &self,
        _request: Request<PeekableFlightDataStream>,
        message: Any,
    ) -> Result<Response<<Self as FlightService>::DoPutStream>, Status> {
        Err(invalid(format!(
            "unknown DoPut command {}",
            message.type_url
        )))
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        if query.transaction_id.is_some() {
            return Err(Status::unimplemented("mink has no transactions"));
        }
        let _planning = CallMemory::of(&request)?.planning(&query.query)?;
        let sql = prepared::positional(&query.query);
        let (dataset, parameters) = self.statements.prepare(&sql).await.map_err(status)?;
        let handle = StatementHandle::new(sql).encode().map_err(arrow_status)?;
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: handle.into(),
            dataset_schema: schema_bytes(&streamed_schema(Arc::new(dataset))?)?,
            parameter_schema: schema_bytes(&parameters)?,
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<(), Status> {
        // Nothing is kept for a prepared statement; the handle must still be one.
        let memory = CallMemory::of(&request)?;
        decode_handle(&query.prepared_statement_handle, &memory).map(|_| ())
    }

    async fn do_action_fallback(
        &self,
        request: Request<Action>,
    ) -> Result<Response<DoActionStream>, Status> {
        let body = match request.get_ref().r#type.as_str() {
            SET_SESSION_OPTIONS | GET_SESSION_OPTIONS => Vec::new(),
            CLOSE_SESSION => SESSION_CLOSED.to_vec(),
            CANCEL_FLIGHT_INFO => {
                let cancel = CancelFlightInfoRequest::decode(request.get_ref().body.as_ref())
                    .map_err(invalid)?;
                let info = cancel.info.unwrap_or_default();
                CancelFlightInfoResult::new(self.cancel(&info)?).encode_to_vec()
            }
            other => return Err(invalid(format!("unknown action {other}"))),
        };
        let result = arrow_flight::Result { body: body.into() };
        Ok(Response::new(Box::pin(futures::stream::iter([Ok(result)]))))
    }

    async fn list_custom_actions(&self) -> Option<Vec<Result<ActionType, Status>>> {
        let action = |name: &str, description: &str| {
            Ok(ActionType {
                r#type: name.into(),
                description: description.into(),
            })
        };
        Some(vec![
            action(SET_SESSION_OPTIONS, "Accepted; every call is independent"),
            action(GET_SESSION_OPTIONS, "No options are kept"),
            action(CLOSE_SESSION, "Closes nothing: no session is kept"),
            action(
                CANCEL_FLIGHT_INFO,
                "Stops the result streams of a FlightInfo",
            ),
        ])
    }

    async fn do_action_cancel_query(
        &self,
        query: ActionCancelQueryRequest,
        _request: Request<Action>,
    ) -> Result<ActionCancelQueryResult, Status> {
        let info = FlightInfo::decode(query.info).map_err(invalid)?;
        // `CANCEL_RESULT_CANCELLED` is 1 like `CancelStatus::Cancelled` (arrow-flight does
        // not export the deprecated action's enum).
        let result = self.cancel(&info)? as i32;
        Ok(ActionCancelQueryResult { result })
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

fn unknown_command(command: Command) -> Status {
    invalid(format!("unknown command {}", command.into_any().type_url))
}
