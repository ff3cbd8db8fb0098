//! Stream objects: a bucket's sealed segment, uploaded whole with its offset index, from
//! which its history is read with ranged GETs through the block cache.
//!
//! ```text
//! streams/<key>/<base>-<end>:  segment bytes | offset index | index_len u64 | "MINKSTR1"
//! ```
//!
//! `base` is the offset of its first row, `end` the offset after its last (20 digits
//! each). An object's bytes follow from the frames of `[base, end)` alone, which every
//! writer of the bucket has the same: a writer that finds its name taken finds the object
//! it would have uploaded. Writers may cut a bucket's log into segments differently (a
//! rebuilt log rolls where its frames fill a segment), so objects may overlap: a bucket's
//! history is the chain that starts at the lowest base and goes on, at each object's end,
//! with the object starting there that reaches furthest ([`chain`]).

use bytes::Bytes;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt as _};

use super::blocks::CachedObject;
use super::trailer;
use crate::error::{LogError, Result};
use crate::segment::{self, FrameHeader};

const MAGIC: &[u8; 8] = b"MINKSTR1";

/// A stream object of a bucket: the offsets it holds and where its segment bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StreamObject {
    /// The object in the store holding it: its own, or a pack.
    pub(crate) object: CachedObject,
    /// Where its segment bytes start in that object.
    pub(crate) at: u64,
    /// The offset of its first row.
    pub(crate) base: i64,
    /// The offset after its last row.
    pub(crate) end: i64,
}

/// Where a stream object's bytes are: `len` bytes from `at` in the object `path` of
/// `object_len` bytes (all of it, for one that is not in a pack).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placed {
    pub(crate) path: StorePath,
    pub(crate) object_len: u64,
    pub(crate) at: u64,
    pub(crate) len: u64,
}

/// The name of a stream object, after the bucket's `prefix` (`streams/<key>`).
pub(crate) fn name(base: i64, end: i64) -> String {
    format!("{}-{}", offset_name(base), offset_name(end))
}

/// An offset in an object's name: 20 digits, so names sort as offsets.
pub(crate) fn offset_name(offset: i64) -> String {
    format!("{offset:020}")
}

/// The offsets a stream object's name says it holds.
pub(crate) fn parse_name(name: &str) -> Option<(i64, i64)> {
    let (base, end) = name.split_once('-')?;
    let (base, end) = (base.parse().ok()?, end.parse().ok()?);
    (base < end).then_some((base, end))
}

/// A stream object of a sealed segment: its bytes and its frames.
pub(crate) fn encode(segment: &[u8], frames: &[FrameHeader]) -> Bytes {
    let index = segment::encode_index(frames);
    let mut out = Vec::with_capacity(segment.len() + index.len() + trailer::LEN as usize);
    out.extend_from_slice(segment);
    out.extend_from_slice(&index);
    trailer::append(&mut out, index.len(), MAGIC);
    Bytes::from(out)
}

/// Reads the index of the stream object `placed`, named for offsets `base..end`: the
/// object and its frames.
///
/// # Errors
/// The store failed, or the bytes are not a stream object of those offsets.
pub(crate) async fn open(
    store: &dyn ObjectStore,
    placed: Placed,
    (base, end): (i64, i64),
) -> Result<(StreamObject, Vec<FrameHeader>)> {
    let Placed {
        path,
        object_len,
        at,
        len,
    } = placed;
    let corrupt = |what: &str| LogError::Corrupt(format!("stream object {path} at {at}: {what}"));
    let read =
        |range: std::ops::Range<u64>| store.get_range(&path, at + range.start..at + range.end);
    let store_error = |e: object_store::Error| LogError::Store(format!("reading {path}: {e}"));
    let (segment_len, index) = trailer::read_part(len, MAGIC, read)
        .await
        .map_err(store_error)?
        .ok_or_else(|| corrupt("no valid trailer"))?;
    let frames = segment::decode_index(&index, base, segment_len)
        .filter(|frames| frames.last().map(|f| f.last_offset() + 1) == Some(end))
        .ok_or_else(|| corrupt("its index does not check out against its name"))?;
    let object = StreamObject {
        object: CachedObject {
            path,
            len: object_len,
        },
        at,
        base,
        end,
    };
    Ok((object, frames))
}

/// The objects a bucket's history is read from, of those listed (`(base, end)` each), each
/// with the offset it is read from: from the lowest base on, at each step the object that
/// holds the next offset and reaches furthest (a greedy cover, which reaches as far as
/// the objects together do). An object may start before the next offset: writers share
/// batch boundaries, so the next offset starts a batch in it too, and it is read from
/// there. Objects off the chain are not read; it ends at the first offset no object holds.
pub(crate) fn chain<T>(
    objects: impl IntoIterator<Item = ((i64, i64), T)>,
) -> Vec<(i64, (i64, i64), T)> {
    let mut objects: Vec<((i64, i64), T)> = objects.into_iter().collect();
    objects.sort_by_key(|((base, end), _)| (*base, std::cmp::Reverse(*end)));
    let mut chained = Vec::new();
    let Some(mut next) = objects.first().map(|((base, _), _)| *base) else {
        return chained;
    };
    let mut candidates = objects.into_iter().peekable();
    loop {
        // Of the objects starting at or before `next`, the one reaching furthest.
        let mut best: Option<((i64, i64), T)> = None;
        while let Some(((base, end), object)) = candidates.next_if(|((base, _), _)| *base <= next) {
            if end > next && best.as_ref().is_none_or(|((_, known), _)| end > *known) {
                best = Some(((base, end), object));
            }
        }
        let Some((offsets, object)) = best else {
            break;
        };
        chained.push((next, offsets, object));
        next = offsets.1;
    }
    chained
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_their_offsets() {
        assert_eq!(parse_name(&name(3, 17)), Some((3, 17)));
        for bad in ["", "3", "a-b", "5-5", "7-3", "1-2-3"] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_chain_reaches_as_far_as_the_objects_together_do() {
        let chained = |objects: &[(i64, i64)]| -> Vec<(i64, (i64, i64))> {
            chain(objects.iter().map(|o| (*o, ())))
                .into_iter()
                .map(|(from, offsets, ())| (from, offsets))
                .collect()
        };
        let objects = [(0, 10), (10, 20), (10, 30), (20, 40), (30, 50), (60, 70)];
        assert_eq!(
            chained(&objects),
            [(0, (0, 10)), (10, (10, 30)), (30, (30, 50))]
        );
        // A late upload cut elsewhere: read from inside it, on to the furthest.
        let objects = [(0, 60), (60, 130), (0, 100)];
        assert_eq!(chained(&objects), [(0, (0, 100)), (100, (60, 130))]);
        assert!(chained(&[]).is_empty());
    }
}
