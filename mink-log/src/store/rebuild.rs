//! Rebuilding a node's local logs from its store: every bucket's frames after its stream
//! objects, as the WAL objects of every earlier epoch hold them, appended to fresh segment
//! files under `log/`. The frames before are read from the stream objects.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Component, Path, PathBuf};

use crate::error::{LogError, Result};
use crate::segment::{self, FrameHeader};

/// The local logs being rebuilt.
#[derive(Debug)]
pub(crate) struct Rebuild {
    root: PathBuf,
    segment_bytes: u64,
    /// Per bucket key, where its stream objects end: its local log starts there.
    starts: HashMap<String, i64>,
    logs: HashMap<String, LocalLog>,
}

/// One bucket's log being rebuilt: its last segment, still growing.
#[derive(Debug)]
struct LocalLog {
    dir: PathBuf,
    segment_base: i64,
    segment_len: u64,
    frames: Vec<FrameHeader>,
    /// The offset after its last frame; `None` before the first.
    next_offset: Option<i64>,
}

impl Rebuild {
    /// Empties `root` (the node's `log/`): every log in it is rebuilt from the store, the
    /// log of each key in `starts` from the offset given (where its stream objects end).
    pub(crate) fn start(
        root: &Path,
        segment_bytes: u64,
        starts: HashMap<String, i64>,
    ) -> Result<Self> {
        mink_durable::create_dir_all(root)?;
        for entry in std::fs::read_dir(root)? {
            let path = entry?.path();
            match path.is_dir() {
                true => std::fs::remove_dir_all(&path)?,
                false => std::fs::remove_file(&path)?,
            }
        }
        Ok(Self {
            root: root.to_path_buf(),
            segment_bytes,
            starts,
            logs: HashMap::new(),
        })
    }

    /// Appends one WAL section: `frames` of the bucket whose log directory is `key`;
    /// returns the offset after its last frame (`None` for no frames).
    ///
    /// # Errors
    /// [`LogError::Corrupt`] for a key outside `log/`, or frames that are damaged or do not
    /// continue the bucket's log.
    pub(crate) fn append(&mut self, key: &str, frames: &[u8]) -> Result<Option<i64>> {
        let relative = Path::new(key);
        if key.is_empty()
            || !relative
                .components()
                .all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(LogError::Corrupt(format!(
                "a WAL section of bucket key '{key}', not a directory under log/"
            )));
        }
        let segment_bytes = self.segment_bytes;
        let log = self.log(key)?;
        let headers = segment::frames_in(frames, None)
            .map_err(|e| LogError::Corrupt(format!("bucket {key}: {e}")))?;
        // Frames the stream objects hold already are skipped.
        let skip = match log.next_offset {
            Some(next) => headers.partition_point(|h| h.base_offset < next),
            None => 0,
        };
        let end = headers.last().map(|last| last.last_offset() + 1);
        let (Some(first), Some(last)) = (headers.get(skip), headers.last()) else {
            return Ok(end);
        };
        if log
            .next_offset
            .is_some_and(|next| first.base_offset != next)
        {
            return Err(LogError::Corrupt(format!(
                "bucket {key}: a WAL section starts at offset {}, after a log that ends at {}",
                first.base_offset,
                log.next_offset.unwrap_or_default()
            )));
        }
        let from = first.position;
        let frames = &frames[from as usize..];
        if log.segment_base < 0 || log.segment_len >= segment_bytes {
            if log.segment_base >= 0 {
                segment::write_index(&log.dir, log.segment_base, &log.frames)?;
            }
            log.segment_base = first.base_offset;
            log.segment_len = 0;
            log.frames.clear();
        }
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(segment::segment_path(&log.dir, log.segment_base))?
            .write_all(frames)?;
        log.next_offset = Some(last.last_offset() + 1);
        log.frames
            .extend(headers[skip..].iter().map(|header| FrameHeader {
                position: header.position - from + log.segment_len,
                ..*header
            }));
        log.segment_len += frames.len() as u64;
        Ok(end)
    }

    /// The log of `key`, begun at its start if this is its first frame.
    fn log(&mut self, key: &str) -> Result<&mut LocalLog> {
        if !self.logs.contains_key(key) {
            let dir = self.root.join(key);
            std::fs::create_dir_all(&dir)?;
            let log = LocalLog {
                dir,
                segment_base: -1,
                segment_len: 0,
                frames: Vec::new(),
                next_offset: self.starts.get(key).copied(),
            };
            self.logs.insert(key.to_string(), log);
        }
        Ok(self.logs.get_mut(key).expect("inserted"))
    }

    /// How many buckets' logs were rebuilt from WAL objects.
    pub(crate) fn buckets(&self) -> usize {
        self.logs
            .values()
            .filter(|log| log.segment_base >= 0)
            .count()
    }

    /// Ends the rebuild: a bucket whose stream objects hold its whole log gets an empty
    /// segment where they end, so its local log starts there.
    pub(crate) fn finish(mut self) -> Result<()> {
        for (key, start) in std::mem::take(&mut self.starts) {
            let log = self.log(&key)?;
            if log.segment_base < 0 {
                std::fs::File::create(segment::segment_path(&log.dir, start))?;
            }
        }
        Ok(())
    }
}
