//! Encoding answers as FlightData.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::ipc::writer::{
    CompressionContext, DictionaryTracker, IpcDataGenerator, IpcWriteOptions,
};
use arrow_flight::{FlightData, SchemaAsIpc};
use mink_core::protocol::ScanBatch;
#[cfg(doc)]
use mink_core::protocol::SnapshotBatch;
use mink_core::table::TableDescriptor;
use prost::Message;

use crate::error::NodeError;
use crate::log::LogBatch;

/// Turns batches into FlightData: projected, with a schema message whenever the schema
/// changes, and each batch's metadata ([`ScanBatch`], [`SnapshotBatch`]) in its
/// `app_metadata`.
pub(super) struct BatchEncoder {
    projection: Vec<usize>,
    schema: Option<SchemaRef>,
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
        let width = batch.num_columns();
        let own: Vec<usize> = self
            .projection
            .iter()
            .copied()
            .filter(|&i| i < width)
            .collect();
        let projected = batch.project(&own)?;
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

    pub(super) fn encode_all(
        &mut self,
        table: &TableDescriptor,
        batches: &[LogBatch],
        high_watermark: i64,
    ) -> Result<Vec<FlightData>, NodeError> {
        let mut messages = vec![self.start(table)?];
        for batch in batches {
            messages.extend(self.encode_log(batch, high_watermark)?);
        }
        Ok(messages)
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
