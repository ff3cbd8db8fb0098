//! Encoding answers as FlightData.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::ipc::MessageHeader;
use arrow::ipc::convert::try_schema_from_flatbuffer_bytes;
use arrow::ipc::writer::{
    CompressionContext, DictionaryTracker, IpcDataGenerator, IpcWriteOptions,
};
use arrow_flight::FlightData;
use bytes::Bytes;
use mink_core::ipc_stream::{self, IpcMessage};
use mink_core::protocol::ScanBatch;
#[cfg(doc)]
use mink_core::protocol::SnapshotBatch;
use mink_core::schema::columns_within;
use mink_core::table::TableDescriptor;
use prost::Message;

use crate::error::NodeError;
use mink_log::{LogBatch, LogFrame};

/// Turns batches into FlightData: projected, with a schema message whenever the schema
/// changes, and each batch's metadata ([`ScanBatch`], [`SnapshotBatch`]) in its
/// `app_metadata`.
///
/// A log batch as stored ([`LogFrame`]) is one Arrow IPC stream, and a FlightData is one
/// IPC message: when the projection keeps every column of the batch, its messages are sent
/// as they are stored, sliced out of the frame without a copy (announcing its schema when
/// it differs from the last one sent). Otherwise the batch is decoded, projected and
/// encoded.
pub(super) struct BatchEncoder {
    projection: Vec<usize>,
    schema: Option<SchemaRef>,
    /// The schema message of the last stored frame and its schema, decoded once.
    stored_schema: Option<(Bytes, SchemaRef)>,
    /// A stored frame sent dictionaries the tracker does not know of: the next encoded
    /// batch announces its schema again, which resets the receiver's dictionaries.
    stale_dictionaries: bool,
    generator: IpcDataGenerator,
    dictionaries: DictionaryTracker,
    compression: CompressionContext,
    options: IpcWriteOptions,
}

impl BatchEncoder {
    pub(super) fn new(projection: Vec<usize>) -> Self {
        Self {
            projection,
            schema: None,
            stored_schema: None,
            stale_dictionaries: false,
            generator: IpcDataGenerator::default(),
            dictionaries: DictionaryTracker::new(false),
            compression: CompressionContext::default(),
            options: IpcWriteOptions::default(),
        }
    }

    /// The schema message of `schema`, which also assigns the dictionary ids the batches
    /// after it use.
    fn schema_message(&mut self, schema: &SchemaRef) -> FlightData {
        self.schema = Some(Arc::clone(schema));
        self.dictionaries = DictionaryTracker::new(false);
        self.stale_dictionaries = false;
        let message = self.generator.schema_to_bytes_with_dictionary_tracker(
            schema,
            &mut self.dictionaries,
            &self.options,
        );
        FlightData::new().with_data_header(message.ipc_message)
    }

    /// The schema message that opens an answer of rows in `schema`.
    pub(super) fn start_with(&mut self, schema: &SchemaRef) -> FlightData {
        self.schema_message(schema)
    }

    /// The schema message that opens an answer.
    pub(super) fn start(&mut self, table: &TableDescriptor) -> Result<FlightData, NodeError> {
        let schema = Arc::new(table.schema().project(&self.projection)?);
        Ok(self.schema_message(&schema))
    }

    /// Encodes one batch, projected, with its `app_metadata`. The projection's indexes
    /// refer to the current schema; a batch of an older schema version keeps the columns
    /// it has.
    pub(super) fn encode(
        &mut self,
        batch: &RecordBatch,
        app_metadata: Vec<u8>,
    ) -> Result<Vec<FlightData>, NodeError> {
        let own: Vec<usize> = columns_within(&self.projection, batch.num_columns()).collect();
        let projected = batch.project(&own)?;
        let mut messages = Vec::new();
        if self.stale_dictionaries || self.schema.as_ref() != Some(projected.schema_ref()) {
            messages.push(self.schema_message(projected.schema_ref()));
        }
        let (dictionaries, data) = self.generator.encode(
            &projected,
            &mut self.dictionaries,
            &self.options,
            &mut self.compression,
        )?;
        messages.extend(dictionaries.into_iter().map(FlightData::from));
        messages.push(FlightData::from(data).with_app_metadata(app_metadata));
        Ok(messages)
    }

    /// Encodes one log batch with its [`ScanBatch`] metadata.
    pub(super) fn encode_log(
        &mut self,
        batch: &LogBatch,
        high_watermark: i64,
    ) -> Result<Vec<FlightData>, NodeError> {
        let metadata = ScanBatch {
            base_offset: batch.base_offset,
            last_offset: batch.last_offset,
            commit_timestamp: batch.commit_timestamp,
            schema_id: batch.schema_id,
            changes: batch.changes.clone(),
            high_watermark,
        };
        self.encode(&batch.batch, metadata.encode_to_vec())
    }

    /// A whole answer: the opening schema message, then each of `batches` encoded by
    /// `encode` ([`BatchEncoder::encode_log`] or [`BatchEncoder::encode_frame`]).
    pub(super) fn encode_all<B>(
        &mut self,
        table: &TableDescriptor,
        batches: &[B],
        encode: impl Fn(&mut Self, &B) -> Result<Vec<FlightData>, NodeError>,
    ) -> Result<Vec<FlightData>, NodeError> {
        let mut messages = vec![self.start(table)?];
        for batch in batches {
            messages.extend(encode(self, batch)?);
        }
        Ok(messages)
    }

    /// Encodes one log batch as stored, with its [`ScanBatch`] metadata: its own IPC
    /// messages when the projection keeps all its columns, else decoded and re-encoded.
    pub(super) fn encode_frame(
        &mut self,
        frame: &LogFrame,
        high_watermark: i64,
    ) -> Result<Vec<FlightData>, NodeError> {
        let header = &frame.header;
        let metadata = ScanBatch {
            base_offset: header.base_offset,
            last_offset: header.last_offset(),
            commit_timestamp: header.commit_timestamp,
            schema_id: header.schema_id,
            changes: frame.payload.changes.clone(),
            high_watermark,
        }
        .encode_to_vec();
        let ipc = &frame.payload.ipc;
        let corrupt = |what: String| {
            NodeError::Corrupt(format!("batch at offset {}: {what}", header.base_offset))
        };
        let messages: Vec<IpcMessage> = ipc_stream::messages(ipc)
            .collect::<Result<_, _>>()
            .map_err(|e| corrupt(e.to_string()))?;
        let [schema_message, rest @ .., batch_message] = messages.as_slice() else {
            return Err(corrupt("not a schema and a batch".into()));
        };
        if schema_message.kind != MessageHeader::Schema
            || batch_message.kind != MessageHeader::RecordBatch
            || rest
                .iter()
                .any(|m| m.kind != MessageHeader::DictionaryBatch)
        {
            return Err(corrupt("not a schema, dictionaries and a batch".into()));
        }
        let schema_header = ipc.slice(schema_message.header.clone());
        let schema = self.stored_schema(schema_header.clone())?;
        let width = schema.fields().len();
        if !columns_within(&self.projection, width).eq(0..width) {
            return self.encode(&frame.decode()?, metadata);
        }
        let mut out = Vec::with_capacity(messages.len());
        if self.schema.as_ref() != Some(&schema) {
            out.push(FlightData::new().with_data_header(schema_header));
            self.schema = Some(schema);
        }
        // The stored dictionaries replace the receiver's.
        self.stale_dictionaries |= !rest.is_empty();
        let message = |m: &IpcMessage| {
            FlightData::new()
                .with_data_header(ipc.slice(m.header.clone()))
                .with_data_body(ipc.slice(m.body.clone()))
        };
        out.extend(rest.iter().map(message));
        out.push(message(batch_message).with_app_metadata(metadata));
        Ok(out)
    }

    /// The schema of a stored frame from its schema message, decoded once per run of
    /// frames with the same one.
    fn stored_schema(&mut self, header: Bytes) -> Result<SchemaRef, NodeError> {
        if let Some((bytes, schema)) = &self.stored_schema
            && *bytes == header
        {
            return Ok(Arc::clone(schema));
        }
        let schema = Arc::new(try_schema_from_flatbuffer_bytes(&header)?);
        self.stored_schema = Some((header, Arc::clone(&schema)));
        Ok(schema)
    }
}

/// A FlightData that carries only `app_metadata`: its header is an IPC message of type
/// NONE, which Flight decoders pass through as "no payload".
pub(super) fn metadata_only(app_metadata: Vec<u8>) -> FlightData {
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
