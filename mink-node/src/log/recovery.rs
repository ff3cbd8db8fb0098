//! Opening a tablet's directory: sealed segments from their offset index, the active
//! segment scanned, a torn tail truncated.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::path::Path;

use tracing::warn;

use super::segment::{self, FrameHeader};
use crate::error::{NodeError, Result};

/// Creates `dir` and its missing ancestors, fsyncing each parent that gained an entry, so
/// a new tablet directory survives a machine crash.
pub(super) fn create_durable_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_durable_dir(parent)?;
        std::fs::create_dir(dir).or_else(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Ok(()),
            _ => Err(e),
        })?;
        sync_dir(parent)?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

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
        sync_dir(dir)?;
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
            return Err(NodeError::Corrupt(format!(
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
                        return Err(NodeError::Corrupt(format!(
                            "bucket {label}: sealed segment {base} is damaged at byte {}",
                            outcome.valid_len
                        )));
                    }
                    warn!(
                        bucket = label,
                        segment = base,
                        valid_len = outcome.valid_len,
                        "truncating a torn log tail"
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
            let file = OpenOptions::new().append(true).open(&path)?;
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
