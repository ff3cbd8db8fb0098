//! The gRPC service clients reach: arrow-flight's Flight SQL dispatch of
//! [`MinkFlightSql`], plus the two Flight calls that dispatch leaves unanswered.
//!
//! - `GetSchema`: the schema a statement's result will have, without running it (DDL
//!   and `CALL` answer an empty schema and do not act); for a metadata command, the
//!   schema its FlightInfo announces. ADBC's `adbc_execute_schema` asks this.
//! - `PollFlightInfo`: the FlightInfo, complete at once (progress 1). Asking for a
//!   FlightInfo plans a query and does not run it (DML, DDL and `CALL` run then, see
//!   [`super::statement`]), so there is nothing to wait for.

use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::{Any, Command};
use arrow_flight::{
    Action, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest, PollInfo,
    SchemaResult, Ticket,
};
use prost::Message;
use tonic::{Request, Response, Status, Streaming};

use crate::error::{arrow_status, invalid};
use crate::handle::StatementHandle;
use crate::memory::CallMemory;
use crate::service::{MinkFlightSql, decode_handle, schema_bytes};

type Sql = MinkFlightSql;

/// mink's Flight SQL service as a Flight service.
#[derive(Debug)]
pub(crate) struct FlightSqlEndpoint(Sql);

impl FlightSqlEndpoint {
    pub(crate) fn new(service: MinkFlightSql) -> Self {
        Self(service)
    }
}

#[tonic::async_trait]
impl FlightService for FlightSqlEndpoint {
    type HandshakeStream = <Sql as FlightService>::HandshakeStream;
    type ListFlightsStream = <Sql as FlightService>::ListFlightsStream;
    type DoGetStream = <Sql as FlightService>::DoGetStream;
    type DoPutStream = <Sql as FlightService>::DoPutStream;
    type DoExchangeStream = <Sql as FlightService>::DoExchangeStream;
    type DoActionStream = <Sql as FlightService>::DoActionStream;
    type ListActionsStream = <Sql as FlightService>::ListActionsStream;

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        let memory = CallMemory::of(&request)?;
        let command = Any::decode(&*request.get_ref().cmd)
            .map_err(invalid)
            .and_then(|any| Command::try_from(any).map_err(invalid))?;
        let schema = match command {
            Command::CommandStatementQuery(query) => {
                let handle = StatementHandle::new(query.query);
                self.0.statement_schema(handle, &memory).await?
            }
            Command::CommandPreparedStatementQuery(query) => {
                let handle = decode_handle(&query.prepared_statement_handle, &memory)?;
                self.0.statement_schema(handle, &memory).await?
            }
            _ => {
                let info = FlightService::get_flight_info(&self.0, request).await?;
                info.into_inner()
                    .try_decode_schema()
                    .map_err(arrow_status)?
            }
        };
        Ok(Response::new(SchemaResult {
            schema: schema_bytes(&schema)?,
        }))
    }

    async fn poll_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        let info = FlightService::get_flight_info(&self.0, request).await?;
        Ok(Response::new(PollInfo {
            info: Some(info.into_inner()),
            flight_descriptor: None,
            progress: Some(1.0),
            expiration_time: None,
        }))
    }

    async fn handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        FlightService::handshake(&self.0, request).await
    }

    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        FlightService::list_flights(&self.0, request).await
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        FlightService::get_flight_info(&self.0, request).await
    }

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        FlightService::do_get(&self.0, request).await
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        FlightService::do_put(&self.0, request).await
    }

    async fn do_exchange(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        FlightService::do_exchange(&self.0, request).await
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        FlightService::do_action(&self.0, request).await
    }

    async fn list_actions(
        &self,
        request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        FlightService::list_actions(&self.0, request).await
    }
}
