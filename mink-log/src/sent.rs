//! Batches stored as their clients sent them.
//!
//! A DoPut's batch arrives as one Arrow IPC record batch message (a FlightData's header
//! and body), and the log stores each batch as an IPC stream of its own (a schema message,
//! the batch's message, the end marker). Encoding the decoded batch again would copy every
//! buffer twice for a message the client already sent; so the node keeps the message with
//! the batch it decoded ([`SentBatch`]), and the appender writes the message as it is
//! whenever the batch it stores is that batch unchanged: an append, or an upsert whose
//! changelog is the batch itself (keys all new).
//!
//! "Unchanged" is decided by identity, not by value: a [`SentMessage`] keeps the arrays it
//! was decoded into, and it stands for a stored batch only when that batch holds exactly
//! those arrays, in that order ([`SentMessage::describes`]). Relabelling a batch with the
//! table's schema keeps its arrays and so keeps the message; any change of the rows (a
//! cast, a changelog built row by row) makes new arrays, and the batch is encoded as before.
//! Decoding the stored message with the stored schema (the arrays' own types) gives the
//! arrays back, so readers see the very batch the node checked.
//!
//! A message is only kept when the stream format holds it as it is: metadata version V5,
//! a record batch whose declared body length is its body's, and no dictionary-encoded
//! column (its dictionaries would be other messages). Compressed messages never get this
//! far: every port refuses them ([`mink_core::ipc_guard`]).

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::DataType;
use arrow::ipc::{MessageHeader, MetadataVersion, root_as_message};
use arrow_flight::FlightData;
use bytes::Bytes;

/// A batch as a client sent it: decoded, and the IPC message it came in when the log can
/// store that message as it is.
#[derive(Debug, Clone)]
pub struct SentBatch {
    /// The rows.
    pub batch: RecordBatch,
    /// The message they were decoded from.
    pub message: Option<SentMessage>,
}

impl SentBatch {
    /// `batch`, decoded from the record batch message `data`.
    pub fn from_flight(data: FlightData, batch: RecordBatch) -> Self {
        let message = SentMessage::new(data, &batch);
        Self { batch, message }
    }
}

impl From<RecordBatch> for SentBatch {
    /// A batch that came in no message of its own (Kafka records, tests).
    fn from(batch: RecordBatch) -> Self {
        Self {
            batch,
            message: None,
        }
    }
}

/// One Arrow IPC record batch message a client sent, and the arrays decoded from it.
#[derive(Debug, Clone)]
pub struct SentMessage {
    header: Bytes,
    body: Bytes,
    columns: Vec<ArrayRef>,
}

impl SentMessage {
    /// The message `data` that `batch` was decoded from, when the stream format holds it
    /// as it is (see the module doc); `None` otherwise.
    fn new(data: FlightData, batch: &RecordBatch) -> Option<Self> {
        let message = root_as_message(&data.data_header).ok()?;
        let storable = message.version() == MetadataVersion::V5
            && message.header_type() == MessageHeader::RecordBatch
            && usize::try_from(message.bodyLength()).ok() == Some(data.data_body.len())
            && !batch
                .schema()
                .flattened_fields()
                .iter()
                .any(|field| matches!(field.data_type(), DataType::Dictionary(..)));
        storable.then(|| Self {
            header: data.data_header,
            body: data.data_body,
            columns: batch.columns().to_vec(),
        })
    }

    /// Whether `batch` holds exactly the arrays this message was decoded into.
    pub(crate) fn describes(&self, batch: &RecordBatch) -> bool {
        batch.num_columns() == self.columns.len()
            && batch
                .columns()
                .iter()
                .zip(&self.columns)
                .all(|(stored, sent)| ArrayRef::ptr_eq(stored, sent))
    }

    /// The message's `Message` flatbuffer.
    pub(crate) fn header(&self) -> &[u8] {
        &self.header
    }

    /// The message's buffers.
    pub(crate) fn body(&self) -> &[u8] {
        &self.body
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use arrow::array::{DictionaryArray, Int64Array, StringArray};
    use arrow::datatypes::{Field, Int32Type, Schema};
    use arrow::ipc::writer::{
        CompressionContext, DictionaryTracker, IpcDataGenerator, IpcWriteOptions,
    };
    use arrow_flight::utils::flight_data_to_arrow_batch;
    use mink_core::ipc_stream::messages;

    use super::*;
    use crate::segment::{FrameHeader, StoredBatch, encode_frame};

    fn rows(ids: &[i64]) -> RecordBatch {
        let names = StringArray::from_iter_values(ids.iter().map(|id| format!("row {id}")));
        RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef),
            ("name", Arc::new(names) as ArrayRef),
        ])
        .unwrap()
    }

    /// `batch` as a client sends it under `options`, and decoded as the node decodes it.
    fn sent_with(batch: &RecordBatch, options: &IpcWriteOptions) -> (FlightData, RecordBatch) {
        let (_, encoded) = IpcDataGenerator::default()
            .encode(
                batch,
                &mut DictionaryTracker::new(false),
                options,
                &mut CompressionContext::default(),
            )
            .unwrap();
        let data = FlightData::from(encoded);
        let decoded = flight_data_to_arrow_batch(&data, batch.schema(), &HashMap::new()).unwrap();
        (data, decoded)
    }

    fn sent(batch: &RecordBatch) -> SentBatch {
        let (data, decoded) = sent_with(batch, &IpcWriteOptions::default());
        SentBatch::from_flight(data, decoded)
    }

    /// The IPC stream of the frame `stored` is written as.
    fn stored_ipc(batch: RecordBatch, sent: Option<SentMessage>) -> Bytes {
        let mut header = FrameHeader {
            base_offset: 0,
            records: u32::try_from(batch.num_rows()).unwrap(),
            commit_timestamp: 0,
            schema_id: 0,
            has_changes: false,
            has_writer: false,
            position: 0,
            payload_len: 0,
        };
        let stored = StoredBatch {
            batch,
            changes: None,
            writer: None,
            sent,
        };
        let (_, cached) = encode_frame(&mut header, stored).unwrap();
        assert_eq!(cached.payload.decode(&header).unwrap(), cached.batch);
        cached.payload.ipc
    }

    /// The body of the stream's record batch message.
    fn batch_body(ipc: &[u8]) -> Vec<u8> {
        let message = messages(ipc).nth(1).unwrap().unwrap();
        assert_eq!(message.kind, MessageHeader::RecordBatch);
        ipc[message.body].to_vec()
    }

    #[test]
    fn a_batch_stored_unchanged_is_stored_as_the_message_it_came_in() {
        let SentBatch { batch, message } = sent(&rows(&[1, 2, 3]));
        let message = message.expect("a plain V5 message is kept");
        // Relabelled with the table's schema (other names, same arrays), as the node does.
        let schema = Arc::new(Schema::new(vec![
            Field::new("key", arrow::datatypes::DataType::Int64, false),
            Field::new("value", arrow::datatypes::DataType::Utf8, true),
        ]));
        let relabelled = RecordBatch::try_new(schema, batch.columns().to_vec()).unwrap();
        assert!(message.describes(&relabelled));

        let ipc = stored_ipc(relabelled.clone(), Some(message.clone()));
        assert_eq!(batch_body(&ipc), message.body());
        let encoded = stored_ipc(relabelled, None);
        assert_eq!(
            arrow::ipc::reader::StreamReader::try_new(&ipc[..], None)
                .unwrap()
                .next()
                .unwrap()
                .unwrap(),
            arrow::ipc::reader::StreamReader::try_new(&encoded[..], None)
                .unwrap()
                .next()
                .unwrap()
                .unwrap(),
        );
    }

    #[test]
    fn a_batch_that_is_not_the_sent_one_is_encoded() {
        let SentBatch { message, .. } = sent(&rows(&[1, 2, 3]));
        let message = message.unwrap();
        // Equal values, other arrays: a changelog built from the rows, say.
        let copy = rows(&[1, 2, 3]);
        assert!(!message.describes(&copy));
        let other = rows(&[7, 8]);
        let ipc = stored_ipc(other.clone(), Some(message));
        let decoded = arrow::ipc::reader::StreamReader::try_new(&ipc[..], None)
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(decoded.columns(), other.columns());
    }

    #[test]
    fn messages_the_stream_cannot_hold_as_they_are_are_not_kept() {
        let batch = rows(&[1, 2]);
        let (mut data, decoded) = sent_with(&batch, &IpcWriteOptions::default());
        data.data_body = [&data.data_body[..], &[0; 8]].concat().into();
        assert!(SentBatch::from_flight(data, decoded).message.is_none());

        let v4 = IpcWriteOptions::try_new(8, false, MetadataVersion::V4).unwrap();
        let (data, decoded) = sent_with(&batch, &v4);
        assert!(SentBatch::from_flight(data, decoded).message.is_none());

        let keys = DictionaryArray::<Int32Type>::from_iter(["a", "b", "a"]);
        let dictionary = RecordBatch::try_from_iter([("tag", Arc::new(keys) as ArrayRef)]).unwrap();
        // Whatever the message: a dictionary-encoded batch needs its dictionaries' too.
        let (data, _) = sent_with(&batch, &IpcWriteOptions::default());
        assert!(SentBatch::from_flight(data, dictionary).message.is_none());

        let garbage = FlightData::new().with_data_header(Bytes::from_static(b"not a message"));
        assert!(SentBatch::from_flight(garbage, batch).message.is_none());
    }
}
