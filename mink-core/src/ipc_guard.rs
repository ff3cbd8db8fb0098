//! Refusing compressed Arrow IPC from clients, before it is decoded.
//!
//! An Arrow IPC message is a `Message` flatbuffer (the header) followed by a body of
//! buffers. A record batch (or dictionary batch) header may declare `compression`; each
//! of its buffers then starts with an 8-byte little-endian *uncompressed length*,
//! followed by the LZ4 or ZSTD frame:
//!
//! ```text
//!  stream:  [0xffffffff][len][ header (Message) ][ body ] [0xffffffff][len][header][body] ... [0xffffffff][0]
//!                              |                   |
//!                              |                   +-- buffer: [uncompressed length: i64][frame ...]
//!                              +-- RecordBatch { length, nodes, buffers, compression: LZ4_FRAME }
//! ```
//!
//! arrow-ipc allocates the declared uncompressed length before it looks at the frame, so
//! a single forged buffer declaring 2^50 bytes aborts the process that decodes it. mink
//! never compresses the IPC it sends in tickets, handles or DoPut streams, and Flight
//! clients send uncompressed batches unless told otherwise, so every port refuses a
//! message that declares compression, from the header alone, before any decoder runs.
//!
//! [`check_header`] judges one header (a Flight `FlightData.data_header`);
//! [`check_stream`] walks a whole IPC stream (a lookup's key batch) header by header
//! without decoding a body; [`check_embedded`] judges bytes that may be either or
//! neither (a bytes field of a plan, where DataFusion keeps nested literals as a bare
//! header and in-memory tables as streams). All are pure and never panic on garbage.
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use arrow::array::{Int64Array, RecordBatch};
//! use mink_core::ipc_guard::check_stream;
//! use mink_core::protocol::encode_batch;
//!
//! let batch = RecordBatch::try_from_iter([("a", Arc::new(Int64Array::from(vec![1])) as _)])?;
//! assert!(check_stream(&encode_batch(&batch)?).is_ok());
//! assert!(check_stream(&[0xff, 0xff, 0xff, 0xff, 0x10, 0, 0, 0, 1, 2]).is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use arrow::ipc::{MessageHeader, root_as_message};

use crate::ipc_stream::messages;
use crate::{CoreError, Result};

const REFUSED: &str = "compressed Arrow IPC is not accepted: send uncompressed batches";

/// Checks one IPC message header (a `Message` flatbuffer): it must parse and must not
/// declare compressed buffers.
///
/// # Errors
///
/// [`CoreError::InvalidRequest`] when the header does not parse or declares compression.
pub fn check_header(header: &[u8]) -> Result<()> {
    let message = root_as_message(header)
        .map_err(|e| CoreError::InvalidRequest(format!("not an Arrow IPC message header: {e}")))?;
    let batch = match message.header_type() {
        MessageHeader::RecordBatch => message.header_as_record_batch(),
        MessageHeader::DictionaryBatch => message
            .header_as_dictionary_batch()
            .and_then(|dictionary| dictionary.data()),
        _ => None,
    };
    match batch.and_then(|batch| batch.compression()) {
        Some(_) => Err(CoreError::InvalidRequest(REFUSED.into())),
        None => Ok(()),
    }
}

/// Checks every message header of an IPC stream (each: an optional continuation marker,
/// the header's length, the header, the body), stopping at the end-of-stream marker.
///
/// # Errors
///
/// [`CoreError::InvalidRequest`] when a header declares compression, does not parse, or
/// the stream is cut short.
pub fn check_stream(bytes: &[u8]) -> Result<()> {
    for message in messages(bytes) {
        check_header(&bytes[message?.header])?;
    }
    Ok(())
}

/// Checks bytes that may hold IPC, read both ways a decoder could read them: as one
/// message header and as a stream (its messages up to the first that does not parse).
/// Bytes that are neither pass: only a header that parses and declares compression is
/// refused.
///
/// # Errors
///
/// [`CoreError::InvalidRequest`] when, read either way, a header declares compression.
pub fn check_embedded(bytes: &[u8]) -> Result<()> {
    if root_as_message(bytes).is_ok() {
        check_header(bytes)?;
    }
    for message in messages(bytes).map_while(Result::ok) {
        check_header(&bytes[message.header])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, RecordBatch};

    use super::*;
    use crate::protocol::encode_batch;

    /// An IPC stream of one `a: Int64 = [1, 2]` batch, written by arrow-rs 58 with
    /// `IpcWriteOptions::try_with_compression(Some(LZ4_FRAME))` (mink-core builds arrow
    /// without a codec, so the bytes are kept here), with the first buffer's declared
    /// uncompressed length forged to 2^50.
    const FORGED_LZ4: &str = include_str!("ipc_guard/forged_lz4.hex");

    fn hex(text: &str) -> Vec<u8> {
        let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
        digits
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
            .collect()
    }

    fn plain() -> Vec<u8> {
        let batch =
            RecordBatch::try_from_iter(vec![("a", Arc::new(Int64Array::from(vec![1, 2])) as _)])
                .unwrap();
        encode_batch(&batch).unwrap()
    }

    /// The header of the stream's second message (the record batch).
    fn second_header(stream: &[u8]) -> &[u8] {
        let first = i32::from_le_bytes(stream[4..8].try_into().unwrap()) as usize;
        let at = 8 + first; // the schema message has no body
        let length = i32::from_le_bytes(stream[at + 4..at + 8].try_into().unwrap()) as usize;
        &stream[at + 8..at + 8 + length]
    }

    #[test]
    fn a_plain_stream_passes() {
        assert!(check_stream(&plain()).is_ok());
        assert!(check_header(second_header(&plain())).is_ok());
    }

    #[test]
    fn a_compressed_stream_is_refused_by_its_header() {
        let forged = hex(FORGED_LZ4);
        let err = check_stream(&forged).unwrap_err();
        assert!(err.to_string().contains("compressed Arrow IPC"), "{err}");
        let err = check_header(second_header(&forged)).unwrap_err();
        assert!(err.to_string().contains("compressed Arrow IPC"), "{err}");
    }

    #[test]
    fn embedded_ipc_is_refused_read_either_way_and_other_bytes_pass() {
        let forged = hex(FORGED_LZ4);
        for bytes in [&forged[..], second_header(&forged)] {
            let err = check_embedded(bytes).unwrap_err();
            assert!(err.to_string().contains("compressed Arrow IPC"), "{err}");
        }
        let stream = plain();
        assert!(check_embedded(&stream).is_ok());
        assert!(check_embedded(second_header(&stream)).is_ok());
        for garbage in [
            &b"a file path"[..],
            &[],
            &[0xff; 9],
            &stream[..stream.len() / 2],
        ] {
            assert!(check_embedded(garbage).is_ok());
        }
    }

    #[test]
    fn a_schema_header_passes() {
        let stream = plain();
        let first = i32::from_le_bytes(stream[4..8].try_into().unwrap()) as usize;
        assert!(check_header(&stream[8..8 + first]).is_ok());
    }

    #[test]
    fn an_empty_stream_is_accepted_and_an_end_marker_ends_it() {
        assert!(check_stream(&[]).is_ok());
        assert!(check_stream(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 9, 9]).is_ok());
    }

    #[test]
    fn garbage_and_cut_streams_are_errors_not_panics() {
        let stream = plain();
        for cut in 1..stream.len() {
            let _ = check_stream(&stream[..cut]);
        }
        // A body that runs past the end, a negative length, a huge length.
        assert!(check_stream(&stream[..stream.len() - 12]).is_err());
        assert!(check_stream(&[0xff, 0xff, 0xff, 0xff, 0xf0, 0xff, 0xff, 0xff]).is_err());
        assert!(check_stream(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]).is_err());
        assert!(check_stream(&[0xff, 0xff, 0xff, 0xff, 0x10, 0, 0, 0, 1, 2]).is_err());
        assert!(check_header(b"garbage").is_err());
        assert!(check_header(&[]).is_err());
    }
}
