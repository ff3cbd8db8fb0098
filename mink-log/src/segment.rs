//! Segment files: the durable form of a bucket's log.
//!
//! A segment is a file named by the offset of its first row (`00000000000000000042.log`)
//! holding a sequence of frames, one per batch:
//!
//! ```text
//! +---------+--------+-------------+--------------+------------------+-----------+-------+
//! | len u32 | crc u32| base i64    | records u32  | commit_ts i64    | schema u32| flags |
//! +---------+--------+-------------+--------------+------------------+-----------+-------+
//! | payload: [writer tag, 18 bytes, if flags & 2] [change vector, `records` bytes, if flags & 1] |
//! |          Arrow IPC stream                                                                   |
//! +------------------------------------------------------------------------------------------+
//! ```
//!
//! All integers are little endian; `crc` (CRC-32) covers everything after it. The writer
//! tag ([`WriterTag`]: producer id, epoch, first and last sequence) names the idempotent
//! writer that wrote the batch (a Kafka producer, a mink `TableWriter`); binaries from
//! before it refuse such frames. A crash can leave a torn last frame: [`scan_frames`]
//! stops at the first frame that is short or fails its checksum, and the caller truncates
//! the file there.
//!
//! A segment that is closed for writing ("sealed") gets an offset index beside it
//! (`.index`): one [`FrameHeader`] per frame with its file position, so opening a node does
//! not read its sealed segments at all. The active segment is scanned on open.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions, StreamWriter};
use bytes::Bytes;
use mink_core::ipc_stream;

use super::WriterTag;
use super::sent::SentMessage;
use crate::error::{LogError, Result};

/// Bytes of a frame header.
pub(crate) const HEADER_LEN: usize = 33;
const FLAG_CHANGES: u8 = 1;
const FLAG_WRITER: u8 = 2;
/// Bytes of an encoded [`WriterTag`].
const WRITER_TAG_LEN: usize = 18;
/// Bytes of one index entry.
const INDEX_ENTRY_LEN: usize = 40;

/// What a frame header says about its batch, plus where the frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Offset of the batch's first row.
    pub base_offset: i64,
    /// Number of rows.
    pub records: u32,
    /// Commit time, ms since the epoch.
    pub commit_timestamp: i64,
    /// Schema version of the batch.
    pub schema_id: u32,
    /// Whether a change vector precedes the Arrow data.
    pub has_changes: bool,
    /// Whether a writer tag precedes the change vector and the Arrow data.
    pub has_writer: bool,
    /// Position of the frame in its segment.
    pub position: u64,
    /// Payload length in bytes.
    pub payload_len: u32,
}

impl FrameHeader {
    /// Offset of the batch's last row.
    pub fn last_offset(&self) -> i64 {
        self.base_offset + i64::from(self.records) - 1
    }

    /// Bytes of the whole frame.
    pub fn frame_len(&self) -> u64 {
        HEADER_LEN as u64 + u64::from(self.payload_len)
    }

    fn encode_fields(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.base_offset.to_le_bytes());
        out.extend_from_slice(&self.records.to_le_bytes());
        out.extend_from_slice(&self.commit_timestamp.to_le_bytes());
        out.extend_from_slice(&self.schema_id.to_le_bytes());
        let mut flags = 0;
        if self.has_changes {
            flags |= FLAG_CHANGES;
        }
        if self.has_writer {
            flags |= FLAG_WRITER;
        }
        out.push(flags);
    }
}

/// A batch to store: decoded Arrow data plus its change vector and writer tag, and the
/// message a client sent the rows in, stored instead of encoding `batch` when it describes
/// it (see the `sent` module).
#[derive(Debug, Clone)]
pub struct StoredBatch {
    /// The rows.
    pub batch: RecordBatch,
    /// The change type of each row (primary-key tables).
    pub changes: Option<Vec<u8>>,
    /// The idempotent writer that wrote the batch, if one did.
    pub writer: Option<WriterTag>,
    /// The message the rows were sent in, when it describes `batch`.
    pub sent: Option<SentMessage>,
}

/// A frame's payload, not decoded: the Arrow IPC stream of its batch (which Flight reads
/// send as it is), its change vector and its writer tag.
#[derive(Debug, Clone)]
pub struct Payload {
    /// The batch as one Arrow IPC stream (its schema message, then its batch).
    pub ipc: Bytes,
    /// The change type of each row (primary-key tables).
    pub changes: Option<Vec<u8>>,
    /// The idempotent writer that wrote the batch, if one did.
    pub writer: Option<WriterTag>,
}

/// A written batch as the log cache keeps it: decoded, and as stored.
#[derive(Debug)]
pub(crate) struct CachedBatch {
    pub(crate) batch: RecordBatch,
    pub(crate) payload: Payload,
}

impl WriterTag {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.producer_id.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.first_sequence.to_le_bytes());
        out.extend_from_slice(&self.last_sequence.to_le_bytes());
    }

    fn decode(bytes: &[u8; WRITER_TAG_LEN]) -> Self {
        let (producer_id, rest) = bytes.split_at(8);
        let (epoch, rest) = rest.split_at(2);
        let (first_sequence, last_sequence) = rest.split_at(4);
        Self {
            producer_id: i64::from_le_bytes(producer_id.try_into().expect("8 bytes")),
            epoch: i16::from_le_bytes(epoch.try_into().expect("2 bytes")),
            first_sequence: i32::from_le_bytes(first_sequence.try_into().expect("4 bytes")),
            last_sequence: i32::from_le_bytes(last_sequence.try_into().expect("4 bytes")),
        }
    }
}

/// Encodes one frame: its bytes, and the batch as the log cache keeps it (the IPC stream
/// a slice of the frame). `header.has_changes`, `has_writer` and `payload_len` are filled
/// in by this function.
pub(crate) fn encode_frame(
    header: &mut FrameHeader,
    stored: StoredBatch,
) -> Result<(Bytes, CachedBatch)> {
    let mut frame = vec![0u8; 8];
    header.has_changes = stored.changes.is_some();
    header.has_writer = stored.writer.is_some();
    header.encode_fields(&mut frame);
    if let Some(writer) = &stored.writer {
        writer.encode(&mut frame);
    }
    if let Some(changes) = &stored.changes {
        frame.extend_from_slice(changes);
    }
    let ipc_start = frame.len();
    match stored
        .sent
        .as_ref()
        .filter(|sent| sent.describes(&stored.batch))
    {
        Some(sent) => write_as_sent(&mut frame, stored.batch.schema_ref(), sent)?,
        None => {
            let mut writer = StreamWriter::try_new(&mut frame, stored.batch.schema_ref())?;
            writer.write(&stored.batch)?;
            writer.finish()?;
        }
    }
    let payload_len = frame.len() - HEADER_LEN;
    header.payload_len = u32::try_from(payload_len)
        .map_err(|_| LogError::InvalidArgument("a batch larger than 4 GiB".into()))?;
    frame[0..4].copy_from_slice(&header.payload_len.to_le_bytes());
    let crc = crc32fast::hash(&frame[8..]);
    frame[4..8].copy_from_slice(&crc.to_le_bytes());
    let frame = Bytes::from(frame);
    let cached = CachedBatch {
        batch: stored.batch,
        payload: Payload {
            ipc: frame.slice(ipc_start..),
            changes: stored.changes,
            writer: stored.writer,
        },
    };
    Ok((frame, cached))
}

/// Appends the IPC stream of a batch as its client sent it: the schema's message, the
/// client's message, the end marker.
fn write_as_sent(frame: &mut Vec<u8>, schema: &SchemaRef, sent: &SentMessage) -> Result<()> {
    let schema = IpcDataGenerator::default().schema_to_bytes_with_dictionary_tracker(
        schema,
        &mut DictionaryTracker::new(false),
        &IpcWriteOptions::default(),
    );
    frame.reserve(
        ipc_stream::message_len(schema.ipc_message.len(), 0)
            + ipc_stream::message_len(sent.header().len(), sent.body().len())
            + ipc_stream::END_OF_STREAM.len(),
    );
    // A message too large for IPC is the client's: refused as the write.
    let refused = |e: mink_core::CoreError| LogError::InvalidArgument(e.to_string());
    ipc_stream::write_message(frame, &schema.ipc_message, &[]).map_err(refused)?;
    ipc_stream::write_message(frame, sent.header(), sent.body()).map_err(refused)?;
    frame.extend_from_slice(&ipc_stream::END_OF_STREAM);
    Ok(())
}

impl Payload {
    /// Splits the payload of a frame whose header is known, without decoding its batch.
    pub(crate) fn parse(header: &FrameHeader, payload: Bytes) -> Result<Self> {
        let corrupt = |what: &str| corrupt(header, what);
        let (writer, rest) = if header.has_writer {
            let tag = payload
                .first_chunk::<WRITER_TAG_LEN>()
                .ok_or_else(|| corrupt("writer tag cut short"))?;
            (Some(WriterTag::decode(tag)), WRITER_TAG_LEN)
        } else {
            (None, 0)
        };
        let (changes, ipc_start) = if header.has_changes {
            let end = rest + header.records as usize;
            let changes = payload
                .get(rest..end)
                .ok_or_else(|| corrupt("change vector cut short"))?;
            (Some(changes.to_vec()), end)
        } else {
            (None, rest)
        };
        Ok(Self {
            ipc: payload.slice(ipc_start..),
            changes,
            writer,
        })
    }

    /// Decodes the batch (zero-copy where the stored buffers are aligned).
    pub(crate) fn decode(&self, header: &FrameHeader) -> Result<RecordBatch> {
        let ipc_error = |e: arrow::error::ArrowError| corrupt(header, &format!("Arrow IPC: {e}"));
        let mut buffer = Buffer::from(self.ipc.clone());
        let batch = StreamDecoder::new()
            .decode(&mut buffer)
            .map_err(ipc_error)?
            .ok_or_else(|| corrupt(header, "no Arrow batch"))?;
        if batch.num_rows() != header.records as usize {
            return Err(corrupt(header, "row count differs from the header"));
        }
        Ok(batch)
    }
}

fn corrupt(header: &FrameHeader, what: &str) -> LogError {
    LogError::Corrupt(format!("batch at offset {}: {what}", header.base_offset))
}

/// Parses a frame header from the first [`HEADER_LEN`] bytes of `bytes`, checking the
/// payload's checksum when `bytes` holds the whole frame.
fn parse_header(bytes: &[u8], position: u64) -> Option<(FrameHeader, u32)> {
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    let i64_at = |i: usize| i64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    if bytes.len() < HEADER_LEN {
        return None;
    }
    let flags = bytes[32];
    let header = FrameHeader {
        payload_len: u32_at(0),
        base_offset: i64_at(8),
        records: u32_at(16),
        commit_timestamp: i64_at(20),
        schema_id: u32_at(28),
        has_changes: flags & FLAG_CHANGES != 0,
        has_writer: flags & FLAG_WRITER != 0,
        position,
    };
    let known = FLAG_CHANGES | FLAG_WRITER;
    (header.records > 0 && flags & !known == 0).then_some((header, u32_at(4)))
}

/// The result of scanning a segment: its valid frames and where valid data ends.
#[derive(Debug)]
pub(crate) struct ScanOutcome {
    pub(crate) frames: Vec<FrameHeader>,
    /// Length of the valid prefix of the file.
    pub(crate) valid_len: u64,
    /// Whether bytes after `valid_len` were found (a torn or corrupt tail).
    pub(crate) torn: bool,
}

/// Reads every frame of a segment, verifying checksums and offset continuity, and stops
/// at the first frame that is incomplete or corrupt.
pub(crate) fn scan_frames(path: &Path, expected_base: i64) -> Result<ScanOutcome> {
    let mut file = io::BufReader::with_capacity(1 << 20, File::open(path)?);
    let file_len = file.get_ref().metadata()?.len();
    let mut frames = Vec::new();
    let mut position = 0u64;
    let mut next_offset = expected_base;
    let mut buffer = Vec::new();
    loop {
        let mut head = [0u8; HEADER_LEN];
        if position + HEADER_LEN as u64 > file_len || file.read_exact(&mut head).is_err() {
            break;
        }
        let Some((header, crc)) = parse_header(&head, position) else {
            break;
        };
        if header.base_offset != next_offset || position + header.frame_len() > file_len {
            break;
        }
        buffer.resize(header.payload_len as usize, 0);
        if file.read_exact(&mut buffer).is_err() {
            break;
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&head[8..]);
        hasher.update(&buffer);
        if hasher.finalize() != crc {
            break;
        }
        next_offset = header.last_offset() + 1;
        position += header.frame_len();
        frames.push(header);
    }
    Ok(ScanOutcome {
        frames,
        valid_len: position,
        torn: position < file_len,
    })
}

/// The frames of `bytes`, which must hold whole frames only, each continuing the offsets
/// from `expected_base` (`None`: from the first frame's) and passing its checksum: the
/// frames of a WAL object, whose bytes were stored whole.
///
/// # Errors
/// [`LogError::Corrupt`] for bytes that are not such frames.
pub(crate) fn frames_in(bytes: &[u8], expected_base: Option<i64>) -> Result<Vec<FrameHeader>> {
    let mut frames = Vec::new();
    let mut position = 0usize;
    let mut next_offset = expected_base;
    while position < bytes.len() {
        let rest = &bytes[position..];
        let corrupt = |what: &str| {
            LogError::Corrupt(format!(
                "the frame at byte {position} of a WAL section {what}"
            ))
        };
        let (header, crc) =
            parse_header(rest, position as u64).ok_or_else(|| corrupt("has no valid header"))?;
        let end = usize::try_from(header.frame_len())
            .ok()
            .filter(|&len| len <= rest.len())
            .ok_or_else(|| corrupt("is cut short"))?;
        if crc32fast::hash(&rest[8..end]) != crc {
            return Err(corrupt("fails its checksum"));
        }
        if next_offset.is_some_and(|next| next != header.base_offset) {
            return Err(corrupt(&format!(
                "starts at offset {}, not {}",
                header.base_offset,
                next_offset.unwrap_or_default()
            )));
        }
        next_offset = Some(header.last_offset() + 1);
        position += end;
        frames.push(header);
    }
    Ok(frames)
}

/// File name of the segment whose first row has `base_offset`.
pub(crate) fn segment_path(dir: &Path, base_offset: i64) -> PathBuf {
    dir.join(format!("{base_offset:020}.log"))
}

/// File name of a sealed segment's offset index.
pub(crate) fn index_path(dir: &Path, base_offset: i64) -> PathBuf {
    dir.join(format!("{base_offset:020}.index"))
}

/// The base offsets of the segments in `dir`, ascending.
pub(crate) fn list_segments(dir: &Path) -> Result<Vec<i64>> {
    let mut bases = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if let Some(base) = name.strip_suffix(".log").and_then(|s| s.parse().ok()) {
            bases.push(base);
        }
    }
    bases.sort_unstable();
    Ok(bases)
}

/// Writes the offset index of a sealed segment (fsynced, renamed into place, the directory
/// fsynced).
pub(crate) fn write_index(dir: &Path, base_offset: i64, frames: &[FrameHeader]) -> Result<()> {
    mink_durable::write_atomically(&index_path(dir, base_offset), &encode_index(frames))?;
    Ok(())
}

/// The offset index of a segment's frames: one entry per frame, then a CRC-32 of them.
pub(crate) fn encode_index(frames: &[FrameHeader]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(frames.len() * INDEX_ENTRY_LEN + 4);
    for frame in frames {
        frame.encode_fields(&mut bytes);
        bytes.extend_from_slice(&frame.position.to_le_bytes());
        bytes.extend_from_slice(&frame.payload_len.to_le_bytes());
        bytes.extend_from_slice(&[0u8; 3]);
    }
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes
}

/// Reads a sealed segment's offset index; `None` when it is missing or does not check out
/// against the segment's length (the caller scans the segment instead).
pub(crate) fn read_index(dir: &Path, base_offset: i64) -> Option<Vec<FrameHeader>> {
    let bytes = std::fs::read(index_path(dir, base_offset)).ok()?;
    let segment_len = std::fs::metadata(segment_path(dir, base_offset))
        .ok()?
        .len();
    decode_index(&bytes, base_offset, segment_len)
}

/// Decodes an offset index ([`encode_index`]) of a segment that starts at `base_offset`
/// and holds `segment_len` bytes; `None` unless it checks out against both.
pub(crate) fn decode_index(
    bytes: &[u8],
    base_offset: i64,
    segment_len: u64,
) -> Option<Vec<FrameHeader>> {
    let (entries, crc) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
    if entries.len() % INDEX_ENTRY_LEN != 0
        || crc32fast::hash(entries) != u32::from_le_bytes(crc.try_into().ok()?)
    {
        return None;
    }
    let mut frames = Vec::with_capacity(entries.len() / INDEX_ENTRY_LEN);
    let mut expected_position = 0u64;
    let mut next_offset = base_offset;
    for entry in entries.chunks_exact(INDEX_ENTRY_LEN) {
        let mut head = [0u8; HEADER_LEN];
        head[8..].copy_from_slice(&entry[..HEADER_LEN - 8]);
        let position = u64::from_le_bytes(entry[25..33].try_into().ok()?);
        let payload_len = u32::from_le_bytes(entry[33..37].try_into().ok()?);
        head[0..4].copy_from_slice(&payload_len.to_le_bytes());
        let (header, _) = parse_header(&head, position)?;
        if position != expected_position || header.base_offset != next_offset {
            return None;
        }
        expected_position += header.frame_len();
        next_offset = header.last_offset() + 1;
        frames.push(header);
    }
    (expected_position == segment_len).then_some(frames)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array};

    use super::*;

    fn stored(values: &[i64], changes: Option<Vec<u8>>) -> StoredBatch {
        let column: ArrayRef = Arc::new(Int64Array::from(values.to_vec()));
        StoredBatch {
            batch: RecordBatch::try_from_iter(vec![("v", column)]).unwrap(),
            changes,
            writer: None,
            sent: None,
        }
    }

    fn header(base: i64, records: u32, position: u64) -> FrameHeader {
        FrameHeader {
            base_offset: base,
            records,
            commit_timestamp: 1_000 + base,
            schema_id: 1,
            has_changes: false,
            has_writer: false,
            position,
            payload_len: 0,
        }
    }

    fn write_segment(dir: &Path) -> (Vec<FrameHeader>, Vec<u8>) {
        let mut bytes = Vec::new();
        let mut frames = Vec::new();
        for (base, values, changes) in [
            (10, vec![1, 2, 3], None),
            (13, vec![4], Some(vec![0])),
            (14, vec![5, 6], None),
        ] {
            let mut h = header(base, values.len() as u32, bytes.len() as u64);
            bytes.extend(encode_frame(&mut h, stored(&values, changes)).unwrap().0);
            frames.push(h);
        }
        std::fs::write(segment_path(dir, 10), &bytes).unwrap();
        (frames, bytes)
    }

    #[test]
    fn frames_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let (frames, bytes) = write_segment(dir.path());
        let outcome = scan_frames(&segment_path(dir.path(), 10), 10).unwrap();
        assert_eq!(outcome.frames, frames);
        assert!(!outcome.torn);
        let second = frames[1];
        let start = (second.position as usize) + HEADER_LEN;
        let payload = Bytes::copy_from_slice(&bytes[start..start + second.payload_len as usize]);
        let decoded = Payload::parse(&second, payload).unwrap();
        assert_eq!(decoded.changes, Some(vec![0]));
        assert_eq!(decoded.decode(&second).unwrap().num_rows(), 1);
    }

    #[test]
    fn a_writer_tag_round_trips_with_and_without_changes() {
        let tag = WriterTag {
            producer_id: 7,
            epoch: -2,
            first_sequence: i32::MAX - 1,
            last_sequence: i32::MAX,
        };
        for changes in [None, Some(vec![0, 2])] {
            let rows = if changes.is_some() {
                vec![1, 2]
            } else {
                vec![3]
            };
            let tagged = StoredBatch {
                writer: Some(tag),
                ..stored(&rows, changes.clone())
            };
            let mut h = header(0, rows.len() as u32, 0);
            let (frame, cached) = encode_frame(&mut h, tagged).unwrap();
            let (parsed, _) = parse_header(&frame, 0).unwrap();
            assert!(parsed.has_writer);
            let decoded = Payload::parse(&parsed, frame.slice(HEADER_LEN..)).unwrap();
            assert_eq!(decoded.ipc, cached.payload.ipc);
            assert_eq!(decoded.decode(&parsed).unwrap().num_rows(), rows.len());
            assert_eq!((decoded.writer, decoded.changes), (Some(tag), changes));
        }
    }

    #[test]
    fn torn_and_corrupt_tails_stop_the_scan() {
        let dir = tempfile::tempdir().unwrap();
        let (frames, bytes) = write_segment(dir.path());
        let path = segment_path(dir.path(), 10);
        for cut in [1, HEADER_LEN + 3, frames[2].frame_len() as usize - 1] {
            std::fs::write(&path, &bytes[..bytes.len() - cut]).unwrap();
            let outcome = scan_frames(&path, 10).unwrap();
            assert_eq!(outcome.frames, frames[..2], "cut {cut}");
            assert!(outcome.torn);
            assert_eq!(outcome.valid_len, frames[2].position);
        }
        let mut flipped = bytes.clone();
        let last = flipped.len() - 5;
        flipped[last] ^= 0xff;
        std::fs::write(&path, &flipped).unwrap();
        assert_eq!(scan_frames(&path, 10).unwrap().frames, frames[..2]);
    }

    #[test]
    fn index_round_trips_and_rejects_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let (frames, bytes) = write_segment(dir.path());
        write_index(dir.path(), 10, &frames).unwrap();
        assert_eq!(read_index(dir.path(), 10).unwrap(), frames);
        std::fs::write(segment_path(dir.path(), 10), &bytes[..bytes.len() - 1]).unwrap();
        assert!(read_index(dir.path(), 10).is_none());
        assert_eq!(list_segments(dir.path()).unwrap(), vec![10]);
    }
}
