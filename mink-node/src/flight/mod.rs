//! The Arrow Flight service of a bucket leader (`docs/design.md#read-protocol`).
//!
//! | call       | request                          | answer                                    |
//! |------------|----------------------------------|-------------------------------------------|
//! | DoGet      | [`ReadTicket`] Scan              | schema, then batches with [`ScanBatch`](mink_core::protocol::ScanBatch)    |
//! | DoGet      | Snapshot, LimitScan on PK tables | schema, batches with [`SnapshotBatch`](mink_core::protocol::SnapshotBatch), a closing [`SnapshotBatch`](mink_core::protocol::SnapshotBatch) |
//! | DoGet      | LimitScan on log tables          | the last rows, as Scan                     |
//! | DoGet      | Union                            | schema, lake batches, log batches with [`ScanBatch`](mink_core::protocol::ScanBatch), a closing [`UnionPlan`](mink_core::protocol::UnionPlan) |
//! | DoGet      | Lake                             | schema, the snapshot's batches             |
//! | DoExchange | one [`TailRequest`](mink_core::protocol::TailRequest) per message  | per request: schema, batches, [`TailEnd`](mink_core::protocol::TailEnd)  |
//! | DoPut      | [`WriteHeader`] descriptor       | one [`AppendAck`](mink_core::protocol::AppendAck) per batch, once durable (append, upsert or delete) |
//! | DoAction   | see [`mink_core::protocol::action`] | one result                             |
//!
//! Projection happens here: `columns` are field indexes of the table's current schema, and
//! each batch is cut to those columns before it is encoded. A batch written under an older
//! schema version keeps its own columns (those it has of the projection); its
//! `schema_id` in [`ScanBatch`](mink_core::protocol::ScanBatch) tells the client how to normalize it. A projection must
//! name each column once and only columns the table has.
//!
//! Every size a client controls is clamped or refused by [`limits`]; compressed Arrow IPC
//! is refused before it is decoded ([`mink_core::ipc_guard`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use bytes::Bytes;
use futures::stream::{self, BoxStream};
use futures::{FutureExt, Stream, StreamExt, TryStreamExt};
use mink_core::protocol::{BucketId, ReadTicket, WriteHeader, decode, read_ticket};
use mink_core::table::TableDescriptor;
use prost::Message;
use tokio::sync::watch;
use tonic::{Request, Response, Status, Streaming};

mod actions;
mod encoder;
mod idempotent;
pub mod limits;
mod put;
mod reads;

use self::idempotent::{Numbered, Numbering};
use crate::error::NodeError;
use crate::node::Node;
use mink_log::WriteStream;

pub use limits::{DEFAULT_MAX_BYTES, MAX_TAIL_WAIT};

type FlightStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The node's Flight service.
#[derive(Debug, Clone)]
pub struct MinkFlightService {
    node: Arc<Node>,
    auth: Arc<mink_auth::Auth>,
    /// Turns true when the server shuts down: Tail sessions, which a client may hold
    /// open without a request for as long as it likes, end then.
    closing: Option<watch::Receiver<bool>>,
}

impl MinkFlightService {
    /// A service over `node`, accepting every call.
    pub fn new(node: Arc<Node>) -> Self {
        Self::with_auth(node, Arc::new(mink_auth::Auth::default()))
    }

    /// A service over `node` whose `Handshake` exchanges `auth`'s credentials for a
    /// token (the calls themselves are checked by `auth`'s interceptor, see
    /// [`crate::server::serve_with`]).
    pub fn with_auth(node: Arc<Node>, auth: Arc<mink_auth::Auth>) -> Self {
        Self {
            node,
            auth,
            closing: None,
        }
    }

    /// This service, its Tail sessions ended once `closing` turns true (or its sender is
    /// gone).
    pub fn closing_on(self, closing: watch::Receiver<bool>) -> Self {
        Self {
            closing: Some(closing),
            ..self
        }
    }

    /// Resolves once the server shuts down; never for a service without a signal.
    fn closed(&self) -> impl Future<Output = ()> + Send + 'static {
        let closing = self.closing.clone();
        async move {
            match closing {
                Some(mut closing) => {
                    let _ = closing.wait_for(|closing| *closing).await;
                }
                None => std::future::pending().await,
            }
        }
    }
}

fn required_bucket(bucket: Option<BucketId>, what: &str) -> Result<BucketId, NodeError> {
    bucket.ok_or_else(|| NodeError::InvalidArgument(format!("{what} names no bucket")))
}

/// Checks the projection against the current schema: unique indexes in range.
fn projection(table: &TableDescriptor, columns: &[u32]) -> Result<Vec<usize>, NodeError> {
    let width = table.schema().fields().len();
    limits::check_projection(&table.path.to_string(), width, columns)
}

fn flight_error_to_status(error: FlightError) -> Status {
    match error {
        FlightError::Tonic(status) => *status,
        other => Status::invalid_argument(format!("malformed Flight data: {other}")),
    }
}

#[tonic::async_trait]
impl FlightService for MinkFlightService {
    type HandshakeStream = FlightStream<HandshakeResponse>;
    type ListFlightsStream = FlightStream<FlightInfo>;
    type DoGetStream = FlightStream<FlightData>;
    type DoPutStream = FlightStream<PutResult>;
    type DoExchangeStream = FlightStream<FlightData>;
    type DoActionStream = FlightStream<arrow_flight::Result>;
    type ListActionsStream = FlightStream<ActionType>;

    async fn handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        // Basic credentials for a bearer token (none when the node has no login).
        self.auth.handshake_response(request.metadata())
    }

    async fn list_flights(
        &self,
        _request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        Err(Status::unimplemented(
            "list_flights: use the list_tables action",
        ))
    }

    async fn get_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Err(Status::unimplemented(
            "get_flight_info: build a Scan ticket directly",
        ))
    }

    async fn poll_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        Err(Status::unimplemented("poll_flight_info is not supported"))
    }

    async fn get_schema(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        Err(Status::unimplemented(
            "get_schema: use the describe_table action",
        ))
    }

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        let ticket: ReadTicket =
            decode("ticket", &request.get_ref().ticket).map_err(NodeError::from)?;
        let kind = read_kind(&ticket.read);
        let answer = match ticket.read {
            Some(read_ticket::Read::Scan(scan)) => {
                let messages = self.scan(scan).await?;
                stream::iter(messages.into_iter().map(Ok)).boxed()
            }
            Some(read_ticket::Read::Snapshot(snapshot)) => self.snapshot(snapshot)?,
            Some(read_ticket::Read::LimitScan(limit)) => self.limit_scan(limit).await?,
            Some(read_ticket::Read::Union(union)) => self.union(union).await?,
            Some(read_ticket::Read::Lake(lake)) => self.lake(lake).await?,
            Some(read_ticket::Read::LiveRange(live)) => self.live_range(live).await?,
            None => return Err(Status::invalid_argument("the ticket names no read")),
        };
        Ok(Response::new(counted(kind, answer)))
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        let mut input = request.into_inner();
        let first = input
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("DoPut stream is empty"))?;
        let descriptor = first.flight_descriptor.clone().ok_or_else(|| {
            Status::invalid_argument("DoPut needs a FlightDescriptor carrying a WriteHeader")
        })?;
        let header: WriteHeader =
            decode("write header", &descriptor.cmd).map_err(NodeError::from)?;
        let delete = header.delete;
        let bucket = Arc::new(required_bucket(header.bucket, "DoPut")?);
        self.node.check_write_address(&bucket)?;
        // Every message is checked before the decoder sees it: compressed IPC is refused.
        let data = stream::once(async { Ok(first) })
            .chain(input)
            .map(|data| data.and_then(put::check_flight_data))
            .map_err(|status| FlightError::Tonic(Box::new(status)));
        let batches = put::sent_batches(data).boxed();
        let name = format!("DoPut to {bucket}");
        let budget = put::Budget::new(self.node.memory_pool(), name, limits::PUT_PIPELINE_BYTES);
        let mut numbering = match header.writer {
            Some(writer) => Some(Numbering::start(&self.node, &bucket, writer).await?),
            None => None,
        };
        let node = Arc::clone(&self.node);
        let start = move |batch, stream: WriteStream| {
            let node = Arc::clone(&node);
            let bucket = Arc::clone(&bucket);
            let numbered = numbering.as_mut().map(Numbering::next).transpose();
            async move {
                let numbered = numbered?;
                let writer = numbered.as_ref().map(Numbered::writer);
                let ack = (node.write_as(&bucket, batch, delete, Some(&stream), writer)).await?;
                let ack = match &numbered {
                    Some(numbered) => numbered.acknowledged(ack),
                    None => ack,
                };
                Ok::<_, Status>(PutResult {
                    app_metadata: Bytes::from(ack.encode_to_vec()),
                })
            }
            .boxed()
        };
        let acks = put::Pipeline::new(batches, limits::PUT_PIPELINE, budget, start);
        Ok(Response::new(acks.boxed()))
    }

    async fn do_exchange(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        let node = Arc::clone(&self.node);
        let answers: BoxStream<'static, Result<FlightData, Status>> = request
            .into_inner()
            .and_then(move |message| {
                let node = Arc::clone(&node);
                async move { Ok(Self::tail(node, message).await?) }
            })
            .map_ok(|messages| stream::iter(messages.into_iter().map(Ok)))
            .try_flatten()
            .take_until(self.closed())
            .boxed();
        Ok(Response::new(answers))
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        let body = self.run_action(request.get_ref()).await?;
        let result = arrow_flight::Result { body: body.into() };
        Ok(Response::new(stream::once(async { Ok(result) }).boxed()))
    }

    async fn list_actions(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        let actions = actions::ACTIONS.map(|(name, description)| {
            Ok(ActionType {
                r#type: name.to_string(),
                description: description.to_string(),
            })
        });
        Ok(Response::new(stream::iter(actions).boxed()))
    }
}

/// The `kind` label of a read in `mink_reads_total` and `mink_read_bytes_total`.
fn read_kind(read: &Option<read_ticket::Read>) -> &'static str {
    match read {
        Some(read_ticket::Read::Scan(_)) => "scan",
        Some(read_ticket::Read::Snapshot(_)) => "snapshot",
        Some(read_ticket::Read::LimitScan(_)) => "limit_scan",
        Some(read_ticket::Read::Union(_)) => "union",
        Some(read_ticket::Read::Lake(_)) => "lake",
        Some(read_ticket::Read::LiveRange(_)) => "live_range",
        None => "none",
    }
}

/// `answer`, counted as one read of `kind` and its bytes as they are sent.
fn counted(
    kind: &'static str,
    answer: BoxStream<'static, Result<FlightData, Status>>,
) -> BoxStream<'static, Result<FlightData, Status>> {
    let metrics = mink_metrics::metrics();
    metrics.reads.with_label_values(&[kind]).inc();
    let sent = metrics.read_bytes.with_label_values(&[kind]);
    answer
        .inspect_ok(move |data| sent.inc_by((data.data_header.len() + data.data_body.len()) as u64))
        .boxed()
}
