//! The Arrow Flight service of a bucket leader (`spec/reads.md`).
//!
//! | call       | request                          | answer                                    |
//! |------------|----------------------------------|-------------------------------------------|
//! | DoGet      | [`ReadTicket`] Scan              | schema, then batches with [`ScanBatch`]    |
//! | DoExchange | one [`TailRequest`] per message  | per request: schema, batches, [`TailEnd`]  |
//! | DoPut      | [`WriteHeader`] descriptor       | one [`AppendAck`] per batch, once durable  |
//! | DoAction   | see [`mink_core::protocol::action`] | one result                             |
//!
//! Projection happens here: `columns` are field indexes of the table's current schema, and
//! each batch is cut to those columns before it is encoded. A batch written under an older
//! schema version keeps its own columns (those it has of the projection); its
//! `schema_id` in [`ScanBatch`] tells the client how to normalize it.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use arrow::ipc::writer::{
    CompressionContext, DictionaryTracker, IpcDataGenerator, IpcWriteOptions,
};
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult, Ticket,
};
use bytes::Bytes;
use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt, TryStreamExt};
use mink_core::protocol::{
    AddColumn, BucketId, BucketList, CreateTable, DropTable, ListOffsets, ListTables, OffsetReply,
    ReadTicket, ScanBatch, ScanRequest, TableDescriptorProto, TableList, TableRef, TailEnd,
    TailRequest, WriteHeader, action, decode, read_ticket,
};
use mink_core::table::{TableDescriptor, TablePath};
use prost::Message;
use tonic::{Request, Response, Status, Streaming};

use crate::error::NodeError;
use crate::log::LogBatch;
use crate::node::Node;

/// Bytes a Scan or Tail returns when the request does not say.
pub const DEFAULT_MAX_BYTES: u64 = 8 << 20;
/// The longest wait a Tail may ask for.
pub const MAX_TAIL_WAIT: Duration = Duration::from_secs(60);
/// Appends of one DoPut stream in flight at once (they are group-committed together).
const PUT_PIPELINE: usize = 64;

type FlightStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The node's Flight service.
#[derive(Debug, Clone)]
pub struct MinkFlightService {
    node: Arc<Node>,
}

impl MinkFlightService {
    /// A service over `node`.
    pub fn new(node: Arc<Node>) -> Self {
        Self { node }
    }
}

fn required_bucket(bucket: Option<BucketId>, what: &str) -> Result<BucketId, NodeError> {
    bucket.ok_or_else(|| NodeError::InvalidArgument(format!("{what} names no bucket")))
}

/// Checks the projection against the current schema.
fn projection(table: &TableDescriptor, columns: &[u32]) -> Result<Vec<usize>, NodeError> {
    let width = table.schema().fields().len();
    if columns.is_empty() {
        return Ok((0..width).collect());
    }
    columns
        .iter()
        .map(|&c| {
            let index = c as usize;
            if index < width {
                Ok(index)
            } else {
                Err(NodeError::InvalidArgument(format!(
                    "column index {c} is out of range: table {} has {width} columns",
                    table.path
                )))
            }
        })
        .collect()
}

/// Turns log batches into FlightData: projected, with a schema message whenever the
/// schema changes, and [`ScanBatch`] metadata on each batch.
struct BatchEncoder {
    projection: Vec<usize>,
    schema: Option<SchemaRef>,
    generator: IpcDataGenerator,
    dictionaries: DictionaryTracker,
    compression: CompressionContext,
    options: IpcWriteOptions,
}

impl BatchEncoder {
    fn new(projection: Vec<usize>) -> Self {
        Self {
            projection,
            schema: None,
            generator: IpcDataGenerator::default(),
            dictionaries: DictionaryTracker::new(false),
            compression: CompressionContext::default(),
            options: IpcWriteOptions::default(),
        }
    }

    fn schema_message(&mut self, schema: &SchemaRef) -> FlightData {
        self.schema = Some(Arc::clone(schema));
        self.dictionaries = DictionaryTracker::new(false);
        SchemaAsIpc::new(schema, &self.options).into()
    }

    /// The schema message that opens an answer.
    fn start(&mut self, table: &TableDescriptor) -> Result<FlightData, NodeError> {
        let schema = Arc::new(table.schema().project(&self.projection)?);
        Ok(self.schema_message(&schema))
    }

    fn encode(
        &mut self,
        batch: &LogBatch,
        high_watermark: i64,
    ) -> Result<Vec<FlightData>, NodeError> {
        let width = batch.batch.num_columns();
        let own: Vec<usize> = self
            .projection
            .iter()
            .copied()
            .filter(|&i| i < width)
            .collect();
        let projected = batch.batch.project(&own)?;
        let mut messages = Vec::new();
        if self.schema.as_ref() != Some(projected.schema_ref()) {
            messages.push(self.schema_message(projected.schema_ref()));
        }
        let (dictionaries, data) = self.generator.encode(
            &projected,
            &mut self.dictionaries,
            &self.options,
            &mut self.compression,
        )?;
        messages.extend(dictionaries.into_iter().map(FlightData::from));
        let metadata = ScanBatch {
            base_offset: batch.base_offset,
            last_offset: batch.last_offset,
            commit_timestamp: batch.commit_timestamp,
            schema_id: batch.schema_id,
            changes: batch.changes.clone(),
            high_watermark,
        };
        messages.push(FlightData::from(data).with_app_metadata(metadata.encode_to_vec()));
        Ok(messages)
    }

    fn encode_all(
        &mut self,
        table: &TableDescriptor,
        batches: &[LogBatch],
        high_watermark: i64,
    ) -> Result<Vec<FlightData>, NodeError> {
        let mut messages = vec![self.start(table)?];
        for batch in batches {
            messages.extend(self.encode(batch, high_watermark)?);
        }
        Ok(messages)
    }
}

impl MinkFlightService {
    async fn scan(&self, request: ScanRequest) -> Result<Vec<FlightData>, NodeError> {
        let bucket = required_bucket(request.bucket, "Scan")?;
        let (table, tablet) = self.node.tablet(&bucket)?;
        let mut encoder = BatchEncoder::new(projection(&table, &request.columns)?);
        let max_bytes = non_zero_or(request.max_bytes, DEFAULT_MAX_BYTES);
        let batches = tablet.read(request.offset, max_bytes).await?;
        let (_, high_watermark) = tablet.offsets();
        encoder.encode_all(&table, &batches, high_watermark)
    }

    /// Answers one Tail poll: waits, reads, and closes the answer with [`TailEnd`].
    async fn tail(node: Arc<Node>, message: FlightData) -> Result<Vec<FlightData>, NodeError> {
        let request: TailRequest = decode("Tail request", &message.app_metadata)?;
        let bucket = required_bucket(request.bucket, "Tail")?;
        let (table, tablet) = node.tablet(&bucket)?;
        let mut encoder = BatchEncoder::new(projection(&table, &request.columns)?);
        let (log_start, high_watermark) = tablet.offsets();
        if request.offset < log_start || request.offset > high_watermark {
            return Err(NodeError::OffsetOutOfRange {
                bucket: bucket.to_string(),
                offset: request.offset,
                log_start,
                high_watermark,
            });
        }
        let max_wait = Duration::from_millis(request.max_wait_ms).min(MAX_TAIL_WAIT);
        tablet
            .wait_for(request.offset, request.min_bytes, max_wait)
            .await?;
        let max_bytes = non_zero_or(request.max_bytes, DEFAULT_MAX_BYTES);
        let batches = tablet.read(request.offset, max_bytes).await?;
        let (_, high_watermark) = tablet.offsets();
        let mut messages = encoder.encode_all(&table, &batches, high_watermark)?;
        let end = TailEnd {
            next_offset: batches.last().map_or(request.offset, |b| b.last_offset + 1),
            high_watermark,
        };
        messages.push(metadata_only(end.encode_to_vec()));
        Ok(messages)
    }

    fn run_action(&self, action: &Action) -> Result<Vec<u8>, NodeError> {
        let body = &action.body;
        let node = &self.node;
        let describe = |table: &TableDescriptor| TableDescriptorProto::from(table).encode_to_vec();
        Ok(match action.r#type.as_str() {
            action::CREATE_TABLE => {
                let request: CreateTable = decode("create_table", body)?;
                let proto = request.table.ok_or_else(|| {
                    NodeError::InvalidArgument("create_table carries no table".into())
                })?;
                let created =
                    node.create_table(TableDescriptor::try_from(proto)?, request.if_not_exists)?;
                describe(&created)
            }
            action::DROP_TABLE => {
                let request: DropTable = decode("drop_table", body)?;
                node.drop_table(&TablePath::parse(&request.table)?, request.if_exists)?;
                Vec::new()
            }
            action::LIST_TABLES => {
                let request: ListTables = decode("list_tables", body)?;
                let tables = node.list_tables(request.database.as_deref());
                TableList {
                    tables: tables.iter().map(ToString::to_string).collect(),
                }
                .encode_to_vec()
            }
            action::DESCRIBE_TABLE => {
                let request: TableRef = decode("describe_table", body)?;
                describe(&*node.describe(&TablePath::parse(&request.table)?)?)
            }
            action::ADD_COLUMN => {
                let request: AddColumn = decode("add_column", body)?;
                describe(&node.add_column(&TablePath::parse(&request.table)?, request.field()?)?)
            }
            action::LIST_BUCKETS => {
                let request: TableRef = decode("list_buckets", body)?;
                BucketList {
                    buckets: node.list_buckets(&TablePath::parse(&request.table)?)?,
                }
                .encode_to_vec()
            }
            action::LIST_OFFSETS => {
                let request: ListOffsets = decode("list_offsets", body)?;
                let spec = request.spec.ok_or_else(|| {
                    NodeError::InvalidArgument(
                        "list_offsets needs Earliest, Latest or Timestamp".into(),
                    )
                })?;
                let bucket = required_bucket(request.bucket, "list_offsets")?;
                OffsetReply {
                    offset: node.list_offsets(&bucket, &spec)?,
                }
                .encode_to_vec()
            }
            other => {
                return Err(NodeError::InvalidArgument(format!(
                    "unknown action '{other}'"
                )));
            }
        })
    }
}

/// A FlightData that carries only `app_metadata`: its header is an IPC message of type
/// NONE, which Flight decoders pass through as "no payload".
fn metadata_only(app_metadata: Vec<u8>) -> FlightData {
    let mut builder = flatbuffers::FlatBufferBuilder::new();
    let mut message = arrow::ipc::MessageBuilder::new(&mut builder);
    message.add_version(arrow::ipc::MetadataVersion::V5);
    message.add_header_type(arrow::ipc::MessageHeader::NONE);
    message.add_bodyLength(0);
    let message = message.finish();
    builder.finish(message, None);
    FlightData::new()
        .with_data_header(builder.finished_data().to_vec())
        .with_app_metadata(app_metadata)
}

fn non_zero_or(value: u64, default: u64) -> u64 {
    if value == 0 { default } else { value }
}

fn flight_error_to_status(error: FlightError) -> Status {
    match error {
        FlightError::Tonic(status) => *status,
        other => Status::invalid_argument(format!("malformed Flight data: {other}")),
    }
}

const ACTIONS: [(&str, &str); 7] = [
    (
        action::CREATE_TABLE,
        "Create a table (CreateTable -> TableDescriptorProto)",
    ),
    (action::DROP_TABLE, "Drop a table and its log (DropTable)"),
    (action::LIST_TABLES, "List tables (ListTables -> TableList)"),
    (
        action::DESCRIBE_TABLE,
        "Describe a table (TableRef -> TableDescriptorProto)",
    ),
    (
        action::ADD_COLUMN,
        "Add a nullable column (AddColumn -> TableDescriptorProto)",
    ),
    (
        action::LIST_BUCKETS,
        "Buckets and their offsets (TableRef -> BucketList)",
    ),
    (
        action::LIST_OFFSETS,
        "Earliest, latest or timestamp offset (ListOffsets -> OffsetReply)",
    ),
];

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
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        Err(Status::unimplemented("the node needs no handshake"))
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
        let messages = match ticket.read {
            Some(read_ticket::Read::Scan(scan)) => self.scan(scan).await?,
            None => return Err(Status::invalid_argument("the ticket names no read")),
        };
        Ok(Response::new(
            stream::iter(messages.into_iter().map(Ok)).boxed(),
        ))
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
        let bucket = Arc::new(required_bucket(header.bucket, "DoPut")?);
        self.node.check_write_address(&bucket)?;
        let data = stream::once(async { Ok(first) })
            .chain(input.map_err(|status| FlightError::Tonic(Box::new(status))));
        let node = Arc::clone(&self.node);
        let acks = FlightRecordBatchStream::new_from_flight_data(data)
            .map_err(flight_error_to_status)
            .map(move |batch| {
                let node = Arc::clone(&node);
                let bucket = Arc::clone(&bucket);
                async move {
                    let ack = node.append(&bucket, batch?).await?;
                    Ok(PutResult {
                        app_metadata: Bytes::from(ack.encode_to_vec()),
                    })
                }
            })
            .buffered(PUT_PIPELINE);
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
            .boxed();
        Ok(Response::new(answers))
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        let body = self.run_action(request.get_ref())?;
        let result = arrow_flight::Result { body: body.into() };
        Ok(Response::new(stream::once(async { Ok(result) }).boxed()))
    }

    async fn list_actions(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        let actions = ACTIONS.map(|(name, description)| {
            Ok(ActionType {
                r#type: name.to_string(),
                description: description.to_string(),
            })
        });
        Ok(Response::new(stream::iter(actions).boxed()))
    }
}
