//! Walking an Arrow IPC stream message by message, without decoding a body.
//!
//! An IPC stream is a sequence of messages, each a `Message` flatbuffer (the header,
//! padded to 8 bytes) followed by its body of buffers, closed by an end-of-stream marker:
//!
//! ```text
//!  [0xffffffff][len][ header ][ body ] [0xffffffff][len][ header ][ body ] ... [0xffffffff][0]
//! ```
//!
//! A Flight `FlightData` carries exactly one such message: its `data_header` is the header,
//! its `data_body` the body. So the messages of a stored stream can be sent as they are,
//! a stream's headers can be judged before anything decodes them ([`crate::ipc_guard`]),
//! and the messages a client sent can be written into a stream as they are
//! ([`write_message`], [`END_OF_STREAM`]).
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use arrow::array::{Int64Array, RecordBatch};
//! use arrow::ipc::MessageHeader;
//! use mink_core::ipc_stream::messages;
//! use mink_core::protocol::encode_batch;
//!
//! let batch = RecordBatch::try_from_iter([("a", Arc::new(Int64Array::from(vec![1])) as _)])?;
//! let stream = encode_batch(&batch)?;
//! let kinds: Vec<MessageHeader> = messages(&stream).map(|m| m.map(|m| m.kind)).collect::<Result<_, _>>()?;
//! assert_eq!(kinds, [MessageHeader::Schema, MessageHeader::RecordBatch]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ops::Range;

use arrow::ipc::{MessageHeader, root_as_message};

use crate::{CoreError, Result};

const CONTINUATION: [u8; 4] = [0xff; 4];

/// The marker that ends a stream: a continuation and a header length of zero.
pub const END_OF_STREAM: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];

/// Bytes [`write_message`] writes for a message of a `header`-byte header and a
/// `body`-byte body.
pub fn message_len(header: usize, body: usize) -> usize {
    8 + header.next_multiple_of(8) + body
}

/// Appends one message to a stream: the continuation, the header's length, the header
/// padded with zeros to a multiple of 8 bytes (so the body starts 8-aligned, as the
/// format asks), and the body.
///
/// # Errors
///
/// [`CoreError::InvalidRequest`] when the header is 2 GiB or more.
pub fn write_message(out: &mut Vec<u8>, header: &[u8], body: &[u8]) -> Result<()> {
    let padded = header.len().next_multiple_of(8);
    let length = i32::try_from(padded)
        .map_err(|_| CoreError::InvalidRequest("an Arrow IPC header of 2 GiB or more".into()))?;
    out.reserve(message_len(header.len(), body.len()));
    out.extend_from_slice(&CONTINUATION);
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(header);
    out.resize(out.len() + padded - header.len(), 0);
    out.extend_from_slice(body);
    Ok(())
}

/// One message of an IPC stream: where its header and its body are in the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpcMessage {
    /// The `Message` flatbuffer, padding included.
    pub header: Range<usize>,
    /// The body: the message's buffers, empty for a schema.
    pub body: Range<usize>,
    /// What the message holds.
    pub kind: MessageHeader,
}

/// The messages of the IPC stream `bytes`, up to its end-of-stream marker (or its end).
/// A header that does not parse, or a message cut short, is an error and ends the walk;
/// nothing panics on garbage.
pub fn messages(bytes: &[u8]) -> impl Iterator<Item = Result<IpcMessage>> + '_ {
    let mut at = Some(0usize);
    std::iter::from_fn(move || {
        let start = at.filter(|&start| start < bytes.len())?;
        match next_message(bytes, start) {
            Ok(Some((message, end))) => {
                at = Some(end);
                Some(Ok(message))
            }
            Ok(None) => {
                at = None;
                None
            }
            Err(error) => {
                at = None;
                Some(Err(error))
            }
        }
    })
}

/// The message at `at` and where the next one starts; `None` at the end-of-stream marker.
fn next_message(bytes: &[u8], mut at: usize) -> Result<Option<(IpcMessage, usize)>> {
    let truncated = || CoreError::InvalidRequest("a truncated Arrow IPC stream".into());
    if bytes.get(at..at.saturating_add(4)) == Some(&CONTINUATION[..]) {
        at += 4;
    }
    let length: [u8; 4] = bytes
        .get(at..at.saturating_add(4))
        .and_then(|b| b.try_into().ok())
        .ok_or_else(truncated)?;
    let length = usize::try_from(i32::from_le_bytes(length)).map_err(|_| truncated())?;
    if length == 0 {
        return Ok(None);
    }
    let start = at + 4;
    let header = start..start.checked_add(length).ok_or_else(truncated)?;
    let message = root_as_message(bytes.get(header.clone()).ok_or_else(truncated)?)
        .map_err(|e| CoreError::InvalidRequest(format!("not an Arrow IPC message header: {e}")))?;
    let body_length = usize::try_from(message.bodyLength()).map_err(|_| truncated())?;
    let body = header.end..header.end.checked_add(body_length).ok_or_else(truncated)?;
    if body.end > bytes.len() {
        return Err(truncated());
    }
    let end = body.end;
    let kind = message.header_type();
    Ok(Some((IpcMessage { header, body, kind }, end)))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, RecordBatch};

    use super::*;
    use crate::protocol::encode_batch;

    fn stream() -> Vec<u8> {
        let batch =
            RecordBatch::try_from_iter(vec![("a", Arc::new(Int64Array::from(vec![1, 2])) as _)])
                .unwrap();
        encode_batch(&batch).unwrap()
    }

    #[test]
    fn the_messages_tile_the_stream_up_to_its_end_marker() {
        let stream = stream();
        let found: Vec<IpcMessage> = messages(&stream).collect::<Result<_>>().unwrap();
        assert_eq!(found.len(), 2);
        assert_eq!((found[0].header.start, found[0].body.len()), (8, 0));
        assert_eq!(found[1].header.start, found[0].body.end + 8);
        assert!(found[1].body.len() >= 16, "the two values, padded");
        assert_eq!(&stream[found[1].body.end..], END_OF_STREAM);
    }

    #[test]
    fn messages_written_again_make_a_stream_that_decodes_to_the_same_batch() {
        let stream = stream();
        let mut copy = Vec::new();
        for message in messages(&stream) {
            let message = message.unwrap();
            // A header one byte past a multiple of 8 (a flatbuffer may be followed by
            // anything): written again, it is padded again.
            let mut header = stream[message.header].to_vec();
            header.push(0);
            write_message(&mut copy, &header, &stream[message.body]).unwrap();
            assert_eq!(copy.len() % 8, 0);
        }
        copy.extend_from_slice(&END_OF_STREAM);
        let decode = |bytes: &[u8]| {
            arrow::ipc::reader::StreamReader::try_new(bytes, None)
                .unwrap()
                .collect::<std::result::Result<Vec<_>, _>>()
                .unwrap()
        };
        assert_eq!(decode(&copy), decode(&stream));
        assert_eq!(message_len(5, 16), 8 + 8 + 16);
    }

    #[test]
    fn garbage_and_cut_streams_are_errors_not_panics() {
        let stream = stream();
        for cut in 1..stream.len() {
            let _ = messages(&stream[..cut]).count();
        }
        let last = |bytes: &[u8]| messages(bytes).last().unwrap();
        assert!(last(&stream[..stream.len() - 12]).is_err());
        assert!(last(&[0xff, 0xff, 0xff, 0xff, 0xf0, 0xff, 0xff, 0xff]).is_err());
        assert!(last(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]).is_err());
        assert!(last(&[0xff, 0xff, 0xff, 0xff, 0x10, 0, 0, 0, 1, 2]).is_err());
        assert_eq!(messages(&[]).count(), 0);
    }
}
