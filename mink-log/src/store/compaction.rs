//! Compaction of a bucket's stream objects: a bucket that seals small segments (a quiet
//! one sealing by age, say) would add an object, or a pack entry, per segment for as long
//! as its history is kept. Once it holds [`MIN_OBJECTS`] small ones in a row, they are
//! merged into one stream object of their own (`streams/<key>/<base>-<end>`, the
//! segments' frames one after the other, with one index), up to [`TARGET_BYTES`]. Only
//! objects of one size class (a power of 8 of bytes) are merged together, as an LSM's
//! tiers: eight merged objects of a class make one of the next, so a byte is rewritten
//! once per class it climbs (four or five times from a 4 KiB segment to 8 MiB), never
//! once per merge after it:
//!
//! * the tablet swaps the merged object in for them at once (the frames' places move,
//!   their offsets do not), so reads planned after it read the merged object, and reads
//!   planned before still find the old ones: those of the bucket's own are deleted after
//!   the upkeep's grace (pack entries stay with their pack);
//! * an open that finds both (a crash came between) reads the merged object, which
//!   reaches further (`stream::chain`), and the upkeep deletes the others;
//! * the WAL checkpoints do not move: the same frames are in stream objects before and
//!   after.
//!
//! So a bucket holds about one object per [`TARGET_BYTES`] of history, plus fewer than
//! [`MIN_OBJECTS`] small ones. A merged segment is removed by `log.ttl` as a whole, once
//! its newest row is past the ttl: rows stay up to its span longer.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use object_store::ObjectStoreExt as _;
use object_store::path::Path as StorePath;

use super::blocks::CachedObject;
use super::location::Location;
use super::open::{create, store_error};
use super::stream::{self, StreamObject};
use super::uploader::make_parent;
use super::{StoreCrash, StoreFailpoint};
use crate::Shared;
use crate::error::Result;
use crate::segment::FrameHeader;

/// Small objects in a row that are worth merging.
pub(crate) const MIN_OBJECTS: usize = 8;
/// A stream object this large is left alone.
const SMALL_BYTES: u64 = 8 << 20;
/// A merged object holds at most about this much.
const TARGET_BYTES: u64 = 64 << 20;

/// Small stream objects of a bucket, in a row, to merge: each with its segment's base
/// and frames.
#[derive(Debug)]
pub(crate) struct Parts {
    pub(crate) parts: Vec<(i64, Arc<StreamObject>, Vec<FrameHeader>)>,
}

impl Parts {
    /// The first run of at least [`MIN_OBJECTS`] small stream objects in a row among a
    /// bucket's `streamed` segments (base, object, frames), up to [`TARGET_BYTES`].
    pub(crate) fn find(
        streamed: impl IntoIterator<Item = (i64, Arc<StreamObject>, Vec<FrameHeader>)>,
    ) -> Option<Self> {
        let mut parts: Vec<(i64, Arc<StreamObject>, Vec<FrameHeader>)> = Vec::new();
        let mut bytes = 0;
        for (base, object, frames) in streamed {
            let len = segment_len(&frames);
            let follows = parts.last().is_none_or(|(_, last, _)| last.end == base);
            let whole = frames.first().map(|frame| frame.base_offset) == Some(object.base);
            let same_class = (parts.first())
                .is_none_or(|(_, _, first)| size_class(segment_len(first)) == size_class(len));
            if len >= SMALL_BYTES || !follows || !whole || !same_class || bytes + len > TARGET_BYTES
            {
                if parts.len() >= MIN_OBJECTS {
                    break;
                }
                parts.clear();
                bytes = 0;
                if len >= SMALL_BYTES || !whole {
                    continue;
                }
            }
            bytes += len;
            parts.push((base, object, frames));
        }
        (parts.len() >= MIN_OBJECTS).then_some(Self { parts })
    }

    /// The offsets the merged object holds.
    fn offsets(&self) -> (i64, i64) {
        let base = self.parts.first().map_or(0, |(base, ..)| *base);
        let end = self.parts.last().map_or(0, |(_, object, _)| object.end);
        (base, end)
    }
}

/// The size class of an object of `len` bytes: the power of 8 it is at least.
fn size_class(len: u64) -> u32 {
    len.max(1).ilog2() / 3
}

/// The bytes of a segment of `frames`.
fn segment_len(frames: &[FrameHeader]) -> u64 {
    frames
        .last()
        .map_or(0, |frame| frame.position + frame.frame_len())
}

/// Merges `parts` of bucket `key` into one stream object in the store and swaps it in
/// for them in `tablet`: the paths of the bucket's own objects it replaced, to delete
/// after a grace; none if the merged name was taken (a merge a crash cut short: the next
/// open reads that one) or the tablet moved on meanwhile (retention).
pub(crate) async fn merge(
    location: &Location,
    (key, tablet): (&str, &Shared),
    parts: Parts,
    failpoint: Option<StoreCrash>,
) -> Result<Vec<StorePath>> {
    let mut segment = BytesMut::new();
    let mut frames = Vec::new();
    for (_, object, part_frames) in &parts.parts {
        let shift = segment.len() as u64;
        let len = segment_len(part_frames);
        let range = object.at..object.at + len;
        let path = &object.object.path;
        let bytes = location.store.get_range(path, range).await;
        segment.extend_from_slice(&bytes.map_err(|e| store_error(&format!("reading {path}"), e))?);
        frames.extend(part_frames.iter().map(|frame| FrameHeader {
            position: frame.position + shift,
            ..*frame
        }));
    }
    let (base, end) = parts.offsets();
    let bytes: Bytes = stream::encode(&segment, &frames);
    let path = location.bucket_path("streams", key, &stream::name(base, end));
    make_parent(location, &path).await?;
    if !create(location, &path, bytes.clone()).await? {
        return Ok(Vec::new());
    }
    StoreCrash::at(failpoint, StoreFailpoint::AbortAfterMergedUpload);
    let merged = StreamObject {
        object: CachedObject {
            path,
            len: bytes.len() as u64,
        },
        at: 0,
        base,
        end,
    };
    let merged_path = merged.object.path.clone();
    if !tablet.merged(&parts, Arc::new(merged)) {
        // Retention moved the bucket on meanwhile: the merged object is garbage (it may
        // start before the new start).
        return Ok(vec![merged_path]);
    }
    Ok(parts
        .parts
        .into_iter()
        .filter(|(_, object, _)| object.at == 0 && is_own(&object.object.path, key))
        .map(|(_, object, _)| object.object.path.clone())
        .collect())
}

/// Whether `path` is one of bucket `key`'s own stream objects (not a pack).
fn is_own(path: &StorePath, key: &str) -> bool {
    let own = format!("streams/{key}/");
    path.as_ref().contains(&own)
}

impl Shared {
    /// The first run of small stream objects worth merging ([`Parts::find`]).
    pub(crate) fn mergeable(&self) -> Option<Parts> {
        let state = self.read_state();
        if state.streamed.len() < MIN_OBJECTS {
            return None;
        }
        let mut frames_of: std::collections::BTreeMap<i64, Vec<FrameHeader>> =
            std::collections::BTreeMap::new();
        for (header, segment) in &state.batches {
            if state.streamed.contains_key(segment) {
                frames_of.entry(*segment).or_default().push(*header);
            }
        }
        Parts::find(state.streamed.iter().filter_map(|(base, object)| {
            Some((*base, Arc::clone(object), frames_of.remove(base)?))
        }))
    }

    /// Reads `parts` from `merged` from now on, if they are all still read from where
    /// they were; whether it does.
    pub(crate) fn merged(&self, parts: &Parts, merged: Arc<StreamObject>) -> bool {
        let mut state = self.write_state();
        let unchanged = (parts.parts.iter()).all(|(base, object, _)| {
            (state.streamed.get(base)).is_some_and(|now| Arc::ptr_eq(now, object))
        });
        if !unchanged {
            return false;
        }
        let mut shifts = std::collections::HashMap::new();
        let mut shift = 0;
        for (base, _, frames) in &parts.parts {
            shifts.insert(*base, shift);
            shift += segment_len(frames);
            state.streamed.remove(base);
        }
        let merged_base = merged.base;
        for (header, segment) in &mut state.batches {
            if let Some(shift) = shifts.get(segment) {
                header.position += shift;
                *segment = merged_base;
            }
        }
        state.streamed.insert(merged_base, merged);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(base: i64, end: i64) -> Arc<StreamObject> {
        Arc::new(StreamObject {
            object: CachedObject {
                path: StorePath::from(format!("streams/t1/b0/{}", stream::name(base, end))),
                len: 100,
            },
            at: 0,
            base,
            end,
        })
    }

    fn frames(base: i64, end: i64, payload_len: u32) -> Vec<FrameHeader> {
        let mut position = 0;
        (base..end)
            .map(|offset| {
                let frame = FrameHeader {
                    base_offset: offset,
                    records: 1,
                    commit_timestamp: 0,
                    schema_id: 0,
                    has_changes: false,
                    has_writer: false,
                    position,
                    payload_len,
                };
                position += frame.frame_len();
                frame
            })
            .collect()
    }

    fn segments(count: i64, payload_len: u32) -> Vec<(i64, Arc<StreamObject>, Vec<FrameHeader>)> {
        (0..count)
            .map(|i| {
                (
                    i * 2,
                    object(i * 2, i * 2 + 2),
                    frames(i * 2, i * 2 + 2, payload_len),
                )
            })
            .collect()
    }

    #[test]
    fn runs_of_enough_small_objects_in_a_row_are_merged() {
        assert!(Parts::find(segments(MIN_OBJECTS as i64 - 1, 10)).is_none());
        let parts = Parts::find(segments(20, 10)).expect("a run");
        assert_eq!(parts.parts.len(), 20);
        assert_eq!(parts.offsets(), (0, 40));

        // A large one in the middle splits the run: the first part is too short.
        let mut mixed = segments(20, 10);
        mixed[3] = (6, object(6, 8), frames(6, 8, (SMALL_BYTES as u32) / 2 + 1));
        let parts = Parts::find(mixed).expect("the run after it");
        assert_eq!(parts.offsets(), (8, 40));

        // A merged object is not merged again with the smaller ones after it.
        let mut after_merge = segments(20, 10);
        after_merge[0] = (0, object(0, 2), frames(0, 2, 8 * 10 * 8));
        let parts = Parts::find(after_merge).expect("the run after it");
        assert_eq!(parts.offsets(), (2, 40));

        // Merged objects stay under the target.
        let big = Parts::find(segments(40, (TARGET_BYTES / 64) as u32)).expect("a run");
        let bytes: u64 = big
            .parts
            .iter()
            .map(|(_, _, frames)| segment_len(frames))
            .sum();
        assert!(bytes <= TARGET_BYTES, "{bytes}");
        assert!(big.parts.len() >= MIN_OBJECTS);
    }
}
