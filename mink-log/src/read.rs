//! Reading planned batches: each from the log cache when it holds it, else from its
//! segment, consecutive frames of one segment with a single read: a positioned read of a
//! local segment, or a range of the stream object it became in the log store.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::{LogError, Result};
use crate::segment::{self, CachedBatch, FrameHeader, HEADER_LEN, Payload};
use crate::store::{LogStore, StreamObject};
use crate::{LogBatch, LogFrame};

/// A batch a read takes: where it is, and its cached form if the log cache holds it.
#[derive(Debug, Clone)]
pub(crate) struct PlannedBatch {
    pub(crate) header: FrameHeader,
    pub(crate) segment: i64,
    /// The stream object the segment became, if it is in the log store.
    pub(crate) stream: Option<Arc<StreamObject>>,
    pub(crate) cached: Option<Arc<CachedBatch>>,
}

/// Where a tablet's planned batches are read from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Source<'a> {
    /// The tablet's directory, holding its local segments.
    pub(crate) dir: &'a Path,
    /// The bucket, for errors.
    pub(crate) label: &'a str,
    /// The log store holding its stream objects, if any.
    pub(crate) store: Option<&'a LogStore>,
}

/// A planned batch, found in the log cache or read from its segment.
pub(crate) enum Found {
    Cached(Arc<CachedBatch>),
    Read(Payload),
}

impl LogBatch {
    pub(crate) fn from_found(header: &FrameHeader, found: Found) -> Result<Self> {
        let (batch, payload) = match found {
            Found::Cached(cached) => (cached.batch.clone(), cached.payload.clone()),
            Found::Read(payload) => (payload.decode(header)?, payload),
        };
        Ok(Self {
            base_offset: header.base_offset,
            last_offset: header.last_offset(),
            commit_timestamp: header.commit_timestamp,
            schema_id: header.schema_id,
            batch,
            changes: payload.changes,
            writer: payload.writer,
            size: u64::from(header.payload_len),
        })
    }
}

impl LogFrame {
    pub(crate) fn from_found(header: &FrameHeader, found: Found) -> Result<Self> {
        let payload = match found {
            Found::Cached(cached) => cached.payload.clone(),
            Found::Read(payload) => payload,
        };
        Ok(Self {
            header: *header,
            payload,
        })
    }
}

/// Reads the planned batches that are not cached from their segments, each turned into a
/// `T` by `convert`. Consecutive frames of one segment are read with a single read
/// (readahead over the whole span).
pub(crate) fn read_planned<T>(
    source: Source<'_>,
    plan: Vec<PlannedBatch>,
    convert: fn(&FrameHeader, Found) -> Result<T>,
) -> Result<Vec<T>> {
    let mut result = Vec::with_capacity(plan.len());
    let mut index = 0;
    while index < plan.len() {
        if let Some(cached) = &plan[index].cached {
            result.push(convert(
                &plan[index].header,
                Found::Cached(Arc::clone(cached)),
            )?);
            index += 1;
            continue;
        }
        let segment = plan[index].segment;
        let run_end = plan[index..]
            .iter()
            .position(|p| p.cached.is_some() || p.segment != segment)
            .map_or(plan.len(), |n| index + n);
        let start = plan[index].header.position;
        let last = &plan[run_end - 1].header;
        let end = last.position + last.frame_len();
        let span = match (&plan[index].stream, source.store) {
            (Some(stream), Some(store)) => store.read_stream(stream, start..end)?,
            _ => read_local(source, segment, start..end)?,
        };
        for planned in &plan[index..run_end] {
            let from = (planned.header.position - start) as usize + HEADER_LEN;
            let payload = span.slice(from..from + planned.header.payload_len as usize);
            let payload = Payload::parse(&planned.header, payload)?;
            result.push(convert(&planned.header, Found::Read(payload))?);
        }
        index = run_end;
    }
    Ok(result)
}

/// The bytes `range` of a local segment.
fn read_local(source: Source<'_>, segment: i64, range: std::ops::Range<u64>) -> Result<Bytes> {
    let file = File::open(segment::segment_path(source.dir, segment)).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            LogError::Corrupt(format!(
                "segment {segment} of bucket {} was removed by retention during the read; read again from log_start",
                source.label
            ))
        } else {
            e.into()
        }
    })?;
    let mut span = vec![0u8; usize::try_from(range.end - range.start).unwrap_or(usize::MAX)];
    file.read_exact_at(&mut span, range.start)?;
    Ok(Bytes::from(span))
}
