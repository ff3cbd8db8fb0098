//! Refusing compressed Arrow IPC from clients, before it is decoded.
//!
//! Decoding a compressed IPC buffer allocates the uncompressed size its message declares
//! before checking it (arrow-ipc 58), so one forged message declaring an absurd size would
//! abort the whole server. mink never compresses the IPC it puts in handles and tickets,
//! and Flight SQL clients send uncompressed batches unless told otherwise, so a message
//! that declares compression is refused instead.

use arrow::ipc::{MessageHeader, root_as_message};

/// Checks one IPC message header (a `Message` flatbuffer): it must parse and must not
/// declare compressed buffers.
pub(crate) fn check_header(header: &[u8]) -> Result<(), String> {
    let message =
        root_as_message(header).map_err(|e| format!("not an Arrow IPC message header: {e}"))?;
    let batch = match message.header_type() {
        MessageHeader::RecordBatch => message.header_as_record_batch(),
        MessageHeader::DictionaryBatch => message
            .header_as_dictionary_batch()
            .and_then(|dictionary| dictionary.data()),
        _ => None,
    };
    match batch.and_then(|batch| batch.compression()) {
        Some(_) => Err("compressed Arrow IPC is not accepted: send uncompressed batches".into()),
        None => Ok(()),
    }
}

/// Checks every message header of an IPC stream (each: an optional continuation marker,
/// the header's length, the header, the body).
pub(crate) fn check_stream(bytes: &[u8]) -> Result<(), String> {
    const CONTINUATION: [u8; 4] = [0xff; 4];
    let truncated = || "a truncated Arrow IPC stream".to_string();
    let mut at = 0;
    while at < bytes.len() {
        if bytes.get(at..at + 4) == Some(&CONTINUATION[..]) {
            at += 4;
        }
        let length: [u8; 4] = bytes
            .get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(truncated)?;
        let length = usize::try_from(i32::from_le_bytes(length)).map_err(|_| truncated())?;
        if length == 0 {
            return Ok(()); // the end-of-stream marker
        }
        let header = bytes.get(at + 4..at + 4 + length).ok_or_else(truncated)?;
        check_header(header)?;
        let body = root_as_message(header)
            .map_err(|e| e.to_string())?
            .bodyLength();
        let body = usize::try_from(body).map_err(|_| truncated())?;
        at = (at + 4 + length).checked_add(body).ok_or_else(truncated)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, RecordBatch};
    use arrow::ipc::CompressionType;
    use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};

    use super::*;

    fn stream(compression: Option<CompressionType>) -> Vec<u8> {
        let batch =
            RecordBatch::try_from_iter(vec![("a", Arc::new(Int64Array::from(vec![1, 2])) as _)])
                .unwrap();
        let options = IpcWriteOptions::default()
            .try_with_compression(compression)
            .unwrap();
        let mut writer =
            StreamWriter::try_new_with_options(Vec::new(), &batch.schema(), options).unwrap();
        writer.write(&batch).unwrap();
        writer.write(&batch).unwrap();
        writer.into_inner().unwrap()
    }

    #[test]
    fn plain_streams_pass_and_compressed_ones_do_not() {
        assert_eq!(check_stream(&stream(None)), Ok(()));
        let compressed = check_stream(&stream(Some(CompressionType::LZ4_FRAME)));
        assert!(compressed.unwrap_err().contains("compressed"));
    }

    #[test]
    fn a_truncated_or_garbled_stream_is_an_error_not_a_panic() {
        let plain = stream(None);
        for cut in [3, 7, 20, plain.len() / 2] {
            let _ = check_stream(&plain[..cut]);
        }
        assert!(check_stream(&[0xff, 0xff, 0xff, 0xff, 0x10, 0, 0, 0, 1, 2]).is_err());
        assert!(check_header(b"garbage").is_err());
    }
}
