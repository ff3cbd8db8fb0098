//! Arrow data inside the messages: record batches as IPC streams, schemas as IPC schema
//! messages.

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use arrow::ipc::convert::try_schema_from_flatbuffer_bytes;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions, StreamWriter};

use crate::{CoreError, Result};

/// Encodes one batch as an Arrow IPC stream.
pub fn encode_batch(batch: &RecordBatch) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut writer = StreamWriter::try_new(&mut bytes, batch.schema_ref())?;
    writer.write(batch)?;
    writer.finish()?;
    drop(writer);
    Ok(bytes)
}

/// Decodes an Arrow IPC stream of exactly one batch.
pub fn decode_batch(what: &str, bytes: &[u8]) -> Result<RecordBatch> {
    let malformed = |e: &dyn std::fmt::Display| {
        CoreError::InvalidRequest(format!(
            "malformed {what} (an Arrow IPC stream of one batch): {e}"
        ))
    };
    let mut reader = StreamReader::try_new(bytes, None).map_err(|e| malformed(&e))?;
    match reader.next() {
        Some(batch) => batch.map_err(|e| malformed(&e)),
        None => Err(malformed(&"no batch")),
    }
}

/// Encodes an Arrow schema as an IPC schema message (as Flight's `SchemaResult` does).
pub fn encode_schema(schema: &Schema) -> Vec<u8> {
    IpcDataGenerator::default()
        .schema_to_bytes_with_dictionary_tracker(
            schema,
            &mut DictionaryTracker::new(false),
            &IpcWriteOptions::default(),
        )
        .ipc_message
}

/// Decodes an IPC schema message.
pub fn decode_schema(bytes: &[u8]) -> Result<Schema> {
    try_schema_from_flatbuffer_bytes(bytes)
        .map_err(|e| CoreError::InvalidRequest(format!("malformed Arrow schema: {e}")))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn batches_round_trip_as_ipc_streams() {
        let batch = RecordBatch::try_from_iter(vec![(
            "a",
            Arc::new(arrow::array::Int32Array::from(vec![1, 2])) as arrow::array::ArrayRef,
        )])
        .unwrap();
        assert_eq!(
            decode_batch("keys", &encode_batch(&batch).unwrap()).unwrap(),
            batch
        );
        let err = decode_batch("keys", &[1, 2, 3]).unwrap_err();
        assert!(err.to_string().contains("malformed keys"), "{err}");
    }
}
