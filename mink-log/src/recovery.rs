//! Opening a tablet's directory: sealed segments from their offset index, the active
//! segment scanned, a torn tail truncated; with a log store, the history in its stream
//! objects before them.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::path::Path;
use std::sync::Arc;

use tracing::warn;

use super::segment::{self, FrameHeader};
use super::store::StreamObject;
use crate::error::{LogError, Result};

/// The segment being appended to.
#[derive(Debug)]
pub(super) struct ActiveSegment {
    pub(super) base: i64,
    pub(super) file: File,
    pub(super) len: u64,
    pub(super) frames: Vec<FrameHeader>,
}

impl ActiveSegment {
    pub(super) fn create(dir: &Path, base: i64) -> Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(segment::segment_path(dir, base))?;
        // The segment's name must outlive a power cut before a frame in it is acknowledged.
        mink_durable::sync_dir(dir)?;
        Ok(Self {
            base,
            file,
            len: 0,
            frames: Vec::new(),
        })
    }
}

/// What recovery found on disk.
#[derive(Debug)]
pub(super) struct Recovered {
    pub(super) batches: VecDeque<(FrameHeader, i64)>,
    pub(super) log_start: i64,
    pub(super) next_offset: i64,
    pub(super) last_timestamp: i64,
    pub(super) active: ActiveSegment,
}

pub(super) fn recover(label: &str, dir: &Path) -> Result<Recovered> {
    let bases = segment::list_segments(dir)?;
    let mut batches = VecDeque::new();
    let mut next_offset = bases.first().copied().unwrap_or(0);
    let log_start = next_offset;
    for (i, &base) in bases.iter().enumerate() {
        if base != next_offset {
            return Err(LogError::Corrupt(format!(
                "bucket {label}: segment {base} follows a log that ends at {next_offset}"
            )));
        }
        let is_active = i + 1 == bases.len();
        let sealed_index = (!is_active)
            .then(|| segment::read_index(dir, base))
            .flatten();
        let frames = match sealed_index {
            Some(frames) => frames,
            None => {
                let path = segment::segment_path(dir, base);
                let outcome = segment::scan_frames(&path, base)?;
                if outcome.torn {
                    if !is_active {
                        return Err(LogError::Corrupt(format!(
                            "bucket {label}: sealed segment {base} is damaged at byte {}",
                            outcome.valid_len
                        )));
                    }
                    warn!(
                        bucket = label,
                        segment = base,
                        valid_len = outcome.valid_len,
                        "truncating a torn log range"
                    );
                    let file = OpenOptions::new().write(true).open(&path)?;
                    file.set_len(outcome.valid_len)?;
                    file.sync_all()?;
                }
                outcome.frames
            }
        };
        if let Some(last) = frames.last() {
            next_offset = last.last_offset() + 1;
        }
        batches.extend(frames.into_iter().map(|f| (f, base)));
    }
    let active = match bases.last() {
        Some(&base) => {
            let path = segment::segment_path(dir, base);
            // Not `append`: the appender writes at explicit positions.
            let file = OpenOptions::new().write(true).open(&path)?;
            let len = file.metadata()?.len();
            let frames = batches
                .iter()
                .filter(|(_, s)| *s == base)
                .map(|(f, _)| *f)
                .collect();
            let _ = std::fs::remove_file(segment::index_path(dir, base));
            ActiveSegment {
                base,
                file,
                len,
                frames,
            }
        }
        None => ActiveSegment::create(dir, 0)?,
    };
    let last_timestamp = batches.back().map_or(0, |(h, _)| h.commit_timestamp);
    Ok(Recovered {
        batches,
        log_start,
        next_offset,
        last_timestamp,
        active,
    })
}

/// Puts the bucket's history in the log store (its stream objects, in order, with their
/// frames) before its recovered local log, which starts where they end: the stream
/// objects by segment base, for the tablet's state.
///
/// # Errors
/// [`LogError::Corrupt`] when the local log does not start where they end.
pub(super) fn prepend_streamed(
    label: &str,
    recovered: &mut Recovered,
    streamed: Vec<(Arc<StreamObject>, Vec<FrameHeader>)>,
) -> Result<BTreeMap<i64, Arc<StreamObject>>> {
    let first_frame = streamed.first().and_then(|(_, frames)| frames.first());
    let (Some(first_frame), Some((last, _))) = (first_frame, streamed.last()) else {
        return Ok(BTreeMap::new());
    };
    // An object of the chain may be read from a batch inside it (`stream::chain`).
    let (start, end) = (first_frame.base_offset, last.end);
    if end != recovered.log_start {
        return Err(LogError::Corrupt(format!(
            "bucket {label}: its stream objects end at offset {end}, its local log starts at {}",
            recovered.log_start
        )));
    }
    let mut objects = BTreeMap::new();
    for (object, frames) in streamed.into_iter().rev() {
        for frame in frames.into_iter().rev() {
            recovered.batches.push_front((frame, object.base));
        }
        objects.insert(object.base, object);
    }
    recovered.log_start = start;
    Ok(objects)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array, RecordBatch};

    use super::*;
    use crate::segment::{HEADER_LEN, StoredBatch, encode_frame, index_path, segment_path};

    /// Frames of batches of `counts` rows, the first at offset `base` and byte `start`;
    /// batch `b` is committed at `1_000 + b`.
    fn frames(base: i64, counts: &[u32], start: u64) -> (Vec<FrameHeader>, Vec<u8>) {
        let mut headers = Vec::new();
        let mut bytes = Vec::new();
        let mut offset = base;
        for &records in counts {
            let values: ArrayRef = Arc::new(Int64Array::from_iter_values(
                offset..offset + i64::from(records),
            ));
            let stored = StoredBatch {
                batch: RecordBatch::try_from_iter(vec![("v", values)]).unwrap(),
                changes: None,
                writer: None,
                sent: None,
            };
            let mut header = FrameHeader {
                base_offset: offset,
                records,
                commit_timestamp: 1_000 + offset,
                schema_id: 0,
                has_changes: false,
                has_writer: false,
                position: start + bytes.len() as u64,
                payload_len: 0,
            };
            bytes.extend(encode_frame(&mut header, stored).unwrap().0);
            headers.push(header);
            offset += i64::from(records);
        }
        (headers, bytes)
    }

    /// Writes a segment of batches of `counts` rows from `base`; with `sealed`, its index too.
    fn segment(dir: &Path, base: i64, counts: &[u32], sealed: bool) -> Vec<FrameHeader> {
        let (headers, bytes) = frames(base, counts, 0);
        std::fs::write(segment_path(dir, base), bytes).unwrap();
        if sealed {
            segment::write_index(dir, base, &headers).unwrap();
        }
        headers
    }

    /// `(base_offset, last_offset, segment)` of every recovered batch.
    fn batches(recovered: &Recovered) -> Vec<(i64, i64, i64)> {
        let batches = recovered.batches.iter();
        batches
            .map(|(h, s)| (h.base_offset, h.last_offset(), *s))
            .collect()
    }

    fn file_len(dir: &Path, base: i64) -> u64 {
        std::fs::metadata(segment_path(dir, base)).unwrap().len()
    }

    fn corruption(dir: &Path) -> String {
        match recover("t", dir).unwrap_err() {
            LogError::Corrupt(message) => message,
            other => panic!("expected Corrupt, got {other}"),
        }
    }

    #[test]
    fn an_empty_directory_starts_a_log_at_offset_zero() {
        let dir = tempfile::tempdir().unwrap();
        let recovered = recover("t", dir.path()).unwrap();
        assert!(recovered.batches.is_empty());
        assert_eq!((recovered.log_start, recovered.next_offset), (0, 0));
        assert_eq!(recovered.last_timestamp, 0);
        assert_eq!((recovered.active.base, recovered.active.len), (0, 0));
        assert_eq!(segment::list_segments(dir.path()).unwrap(), [0]);
        assert_eq!(file_len(dir.path(), 0), 0);
    }

    #[test]
    fn an_empty_segment_is_an_empty_log_at_its_base() {
        let dir = tempfile::tempdir().unwrap();
        segment(dir.path(), 0, &[], false);
        let recovered = recover("t", dir.path()).unwrap();
        assert!(recovered.batches.is_empty());
        assert_eq!((recovered.next_offset, recovered.active.len), (0, 0));
        assert!(recovered.active.frames.is_empty());
    }

    #[test]
    fn a_cleanly_ended_segment_is_recovered_whole() {
        let dir = tempfile::tempdir().unwrap();
        let headers = segment(dir.path(), 0, &[3, 1, 2], false);
        let len = file_len(dir.path(), 0);
        let recovered = recover("t", dir.path()).unwrap();
        assert_eq!(batches(&recovered), [(0, 2, 0), (3, 3, 0), (4, 5, 0)]);
        assert_eq!((recovered.log_start, recovered.next_offset), (0, 6));
        assert_eq!(recovered.last_timestamp, 1_004);
        assert_eq!(recovered.active.frames, headers);
        assert_eq!(recovered.active.len, len);
        assert_eq!(file_len(dir.path(), 0), len, "nothing truncated");
    }

    #[test]
    fn a_torn_last_frame_is_cut_back_to_the_last_whole_frame() {
        let (headers, bytes) = frames(0, &[3, 1, 2], 0);
        let last = headers[2].position as usize;
        for (what, keep) in [
            ("payload cut mid-way", bytes.len() - 5),
            ("payload missing", last + HEADER_LEN),
            ("header cut mid-way", last + HEADER_LEN - 1),
            ("partial length prefix", last + 2),
            ("one byte of the frame", last + 1),
        ] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(segment_path(dir.path(), 0), &bytes[..keep]).unwrap();
            let recovered = recover("t", dir.path()).unwrap();
            assert_eq!(batches(&recovered), [(0, 2, 0), (3, 3, 0)], "{what}");
            assert_eq!(recovered.next_offset, 4, "{what}");
            assert_eq!(recovered.last_timestamp, 1_003, "{what}");
            assert_eq!(recovered.active.len, last as u64, "{what}");
            assert_eq!(recovered.active.frames, headers[..2], "{what}");
            assert_eq!(file_len(dir.path(), 0), last as u64, "{what}: truncated");
            drop(recovered);
            let again = recover("t", dir.path()).unwrap();
            assert_eq!(batches(&again), [(0, 2, 0), (3, 3, 0)], "{what}: stable");
        }
    }

    #[test]
    fn a_last_frame_failing_its_checksum_is_cut_back() {
        let (headers, bytes) = frames(0, &[3, 1, 2], 0);
        let last = headers[2].position as usize;
        for (what, byte) in [
            ("a payload byte", bytes.len() - 5),
            ("the commit timestamp", last + 20),
            ("the checksum itself", last + 4),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let mut damaged = bytes.clone();
            damaged[byte] ^= 0x01;
            std::fs::write(segment_path(dir.path(), 0), &damaged).unwrap();
            let recovered = recover("t", dir.path()).unwrap();
            assert_eq!(batches(&recovered), [(0, 2, 0), (3, 3, 0)], "{what}");
            assert_eq!(file_len(dir.path(), 0), last as u64, "{what}");
        }
    }

    #[test]
    fn bytes_after_the_last_whole_frame_are_cut_off() {
        let (_, bytes) = frames(0, &[3, 1], 0);
        for (what, tail) in [("zeros", [0u8; 100]), ("garbage", [0xa5u8; 100])] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(segment_path(dir.path(), 0), [&bytes[..], &tail].concat()).unwrap();
            let recovered = recover("t", dir.path()).unwrap();
            assert_eq!(batches(&recovered), [(0, 2, 0), (3, 3, 0)], "{what}");
            assert_eq!(file_len(dir.path(), 0), bytes.len() as u64, "{what}");
        }
    }

    /// A hole of zeros followed by whole frames, as a crash can leave when a later write
    /// reached the disk before an earlier one. Recovery reads the hole as a torn tail (a
    /// zero header has no records) and truncates there, so the valid frames after the
    /// hole are dropped. That is the behaviour, asserted here on purpose; the appender
    /// never writes past its last good frame, so a failed write leaves no such hole (see
    /// `appender::tests`).
    #[test]
    fn a_hole_of_zeros_mid_segment_is_truncated_as_a_torn_tail_today() {
        let dir = tempfile::tempdir().unwrap();
        let (_, before) = frames(0, &[3], 0);
        let hole = vec![0u8; 4096];
        let (after, after_bytes) = frames(3, &[1, 2], (before.len() + hole.len()) as u64);
        let bytes = [&before[..], &hole, &after_bytes].concat();
        std::fs::write(segment_path(dir.path(), 0), &bytes).unwrap();
        assert_eq!(after[0].position as usize, before.len() + hole.len());

        let recovered = recover("t", dir.path()).unwrap();
        assert_eq!(
            batches(&recovered),
            [(0, 2, 0)],
            "frames after the hole dropped"
        );
        assert_eq!(recovered.next_offset, 3);
        assert_eq!(file_len(dir.path(), 0), before.len() as u64);
    }

    #[test]
    fn a_frame_that_does_not_continue_the_offsets_ends_the_segment() {
        let dir = tempfile::tempdir().unwrap();
        let (_, good) = frames(0, &[2, 2], 0);
        let (_, skipped) = frames(10, &[1], good.len() as u64);
        let bytes = [&good[..], &skipped].concat();
        std::fs::write(segment_path(dir.path(), 0), bytes).unwrap();
        let recovered = recover("t", dir.path()).unwrap();
        assert_eq!(batches(&recovered), [(0, 1, 0), (2, 3, 0)]);
        assert_eq!(file_len(dir.path(), 0), good.len() as u64);
    }

    #[test]
    fn sealed_segments_come_from_their_index_and_the_last_is_active() {
        let dir = tempfile::tempdir().unwrap();
        segment(dir.path(), 0, &[2, 2], true);
        segment(dir.path(), 4, &[3], true);
        let active = segment(dir.path(), 7, &[1, 1], false);
        let recovered = recover("t", dir.path()).unwrap();
        assert_eq!(
            batches(&recovered),
            [(0, 1, 0), (2, 3, 0), (4, 6, 4), (7, 7, 7), (8, 8, 7)]
        );
        assert_eq!((recovered.log_start, recovered.next_offset), (0, 9));
        assert_eq!(recovered.last_timestamp, 1_008);
        assert_eq!(recovered.active.base, 7);
        assert_eq!(recovered.active.frames, active);
        assert_eq!(recovered.active.len, file_len(dir.path(), 7));
    }

    #[test]
    fn a_sealed_segment_with_a_valid_index_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let sealed = segment(dir.path(), 0, &[2, 2], true);
        segment(dir.path(), 4, &[1], false);
        let path = segment_path(dir.path(), 0);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 5;
        bytes[last] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        let recovered = recover("t", dir.path()).unwrap();
        let from_sealed: Vec<FrameHeader> = recovered
            .batches
            .iter()
            .filter(|(_, s)| *s == 0)
            .map(|(h, _)| *h)
            .collect();
        assert_eq!(
            from_sealed, sealed,
            "the index is trusted; the damage is not seen"
        );
    }

    #[test]
    fn a_missing_index_is_rebuilt_by_scanning_the_sealed_segment() {
        let dir = tempfile::tempdir().unwrap();
        let sealed = segment(dir.path(), 0, &[2, 3, 1], false);
        segment(dir.path(), 6, &[1], false);
        let recovered = recover("t", dir.path()).unwrap();
        let rebuilt: Vec<FrameHeader> = recovered.batches.iter().map(|(h, _)| *h).collect();
        assert_eq!(rebuilt[..3], sealed);
        assert_eq!(batches(&recovered)[3], (6, 6, 6));
        assert_eq!(recovered.next_offset, 7);
        // Recovery keeps the rebuilt index in memory only: the file is not written back,
        // so every later open scans this segment again.
        assert!(!index_path(dir.path(), 0).exists());
    }

    #[test]
    fn a_stale_or_damaged_index_is_ignored_and_the_segment_scanned() {
        let (headers, bytes) = frames(0, &[2, 3, 1], 0);
        let (foreign, _) = frames(100, &[2, 3, 1], 0);
        type Damage = fn(&Path, &[FrameHeader], &[FrameHeader]);
        let cases: [(&str, Damage); 5] = [
            ("index of an earlier, shorter segment", |dir, headers, _| {
                segment::write_index(dir, 0, &headers[..2]).unwrap();
            }),
            ("index of frames of another base", |dir, _, foreign| {
                segment::write_index(dir, 0, foreign).unwrap();
            }),
            ("index failing its checksum", |dir, headers, _| {
                segment::write_index(dir, 0, headers).unwrap();
                let mut index = std::fs::read(index_path(dir, 0)).unwrap();
                index[3] ^= 0x10;
                std::fs::write(index_path(dir, 0), index).unwrap();
            }),
            ("index cut short", |dir, headers, _| {
                segment::write_index(dir, 0, headers).unwrap();
                let index = std::fs::read(index_path(dir, 0)).unwrap();
                std::fs::write(index_path(dir, 0), &index[..index.len() - 7]).unwrap();
            }),
            ("empty index file", |dir, _, _| {
                std::fs::write(index_path(dir, 0), b"").unwrap();
            }),
        ];
        for (what, damage) in cases {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(segment_path(dir.path(), 0), &bytes).unwrap();
            damage(dir.path(), &headers, &foreign);
            segment(dir.path(), 6, &[], false);
            let recovered = recover("t", dir.path()).unwrap();
            let found: Vec<FrameHeader> = recovered.batches.iter().map(|(h, _)| *h).collect();
            assert_eq!(found, headers, "{what}");
            assert_eq!(recovered.next_offset, 6, "{what}");
        }
    }

    #[test]
    fn a_torn_sealed_segment_is_corruption_not_a_tail() {
        let dir = tempfile::tempdir().unwrap();
        let (headers, bytes) = frames(0, &[2, 2], 0);
        std::fs::write(segment_path(dir.path(), 0), &bytes[..bytes.len() - 1]).unwrap();
        segment(dir.path(), 4, &[1], false);
        let message = corruption(dir.path());
        let at = headers[1].position;
        assert_eq!(
            message,
            format!("bucket t: sealed segment 0 is damaged at byte {at}")
        );
        assert_eq!(
            file_len(dir.path(), 0),
            bytes.len() as u64 - 1,
            "left as found"
        );
    }

    #[test]
    fn a_hole_in_a_sealed_segment_is_corruption_even_with_its_index() {
        let dir = tempfile::tempdir().unwrap();
        let (_, before) = frames(0, &[2], 0);
        let hole = [0u8; 64];
        let (_, after) = frames(2, &[2], (before.len() + hole.len()) as u64);
        std::fs::write(
            segment_path(dir.path(), 0),
            [&before[..], &hole, &after].concat(),
        )
        .unwrap();
        let (mut indexed, _) = frames(0, &[2, 2], 0);
        indexed[1].position += hole.len() as u64;
        segment::write_index(dir.path(), 0, &indexed).unwrap();
        segment(dir.path(), 4, &[], false);
        let message = corruption(dir.path());
        let at = before.len();
        assert_eq!(
            message,
            format!("bucket t: sealed segment 0 is damaged at byte {at}")
        );
    }

    #[test]
    fn a_gap_between_segments_is_corruption() {
        let dir = tempfile::tempdir().unwrap();
        segment(dir.path(), 0, &[3], true);
        segment(dir.path(), 5, &[1], false);
        assert_eq!(
            corruption(dir.path()),
            "bucket t: segment 5 follows a log that ends at 3"
        );
    }

    #[test]
    fn an_empty_active_segment_after_a_roll_continues_the_log() {
        let dir = tempfile::tempdir().unwrap();
        segment(dir.path(), 0, &[2, 3], true);
        segment(dir.path(), 5, &[], false);
        let recovered = recover("t", dir.path()).unwrap();
        assert_eq!(batches(&recovered), [(0, 1, 0), (2, 4, 0)]);
        assert_eq!(recovered.next_offset, 5);
        assert_eq!(recovered.last_timestamp, 1_002);
        assert_eq!((recovered.active.base, recovered.active.len), (5, 0));
        assert!(recovered.active.frames.is_empty());
    }

    #[test]
    fn a_whole_active_segment_torn_away_leaves_the_log_at_its_base() {
        let dir = tempfile::tempdir().unwrap();
        segment(dir.path(), 0, &[2], true);
        let (_, bytes) = frames(2, &[4], 0);
        std::fs::write(segment_path(dir.path(), 2), &bytes[..HEADER_LEN + 1]).unwrap();
        let recovered = recover("t", dir.path()).unwrap();
        assert_eq!(batches(&recovered), [(0, 1, 0)]);
        assert_eq!(recovered.next_offset, 2);
        assert_eq!((recovered.active.base, recovered.active.len), (2, 0));
        assert_eq!(file_len(dir.path(), 2), 0);
    }

    #[test]
    fn the_log_starts_at_the_first_retained_segment() {
        let dir = tempfile::tempdir().unwrap();
        segment(dir.path(), 10, &[2], true);
        segment(dir.path(), 12, &[3], false);
        let recovered = recover("t", dir.path()).unwrap();
        assert_eq!(batches(&recovered), [(10, 11, 10), (12, 14, 12)]);
        assert_eq!((recovered.log_start, recovered.next_offset), (10, 15));
    }

    /// A crash after a roll wrote the old segment's index but before the new segment
    /// existed: the indexed segment is the last one, so it is active again.
    #[test]
    fn the_last_segment_is_scanned_and_its_leftover_index_removed() {
        let dir = tempfile::tempdir().unwrap();
        let headers = segment(dir.path(), 0, &[2, 2], true);
        let recovered = recover("t", dir.path()).unwrap();
        assert_eq!(recovered.active.frames, headers);
        assert_eq!(recovered.next_offset, 4);
        assert!(!index_path(dir.path(), 0).exists());
    }
}
