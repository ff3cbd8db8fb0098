//! Rebuilding a node's local logs from its store: every bucket's frames, as the WAL
//! objects of every earlier epoch hold them, appended to fresh segment files under `log/`.

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
    logs: HashMap<String, LocalLog>,
}

/// One bucket's log being rebuilt: its last segment, still growing.
#[derive(Debug)]
struct LocalLog {
    dir: PathBuf,
    segment_base: i64,
    segment_len: u64,
    frames: Vec<FrameHeader>,
    next_offset: i64,
}

impl Rebuild {
    /// Empties `root` (the node's `log/`): every log in it is rebuilt from the store.
    pub(crate) fn start(root: &Path, segment_bytes: u64) -> Result<Self> {
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
            logs: HashMap::new(),
        })
    }

    /// Appends one WAL section: `frames` of the bucket whose log directory is `key`.
    ///
    /// # Errors
    /// [`LogError::Corrupt`] for a key outside `log/`, or frames that are damaged or do not
    /// continue the bucket's log.
    pub(crate) fn append(&mut self, key: &str, frames: &[u8]) -> Result<()> {
        let relative = Path::new(key);
        if key.is_empty() || !relative.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(LogError::Corrupt(format!(
                "a WAL section of bucket key '{key}', not a directory under log/"
            )));
        }
        let log = match self.logs.get_mut(key) {
            Some(log) => log,
            None => {
                let dir = self.root.join(relative);
                std::fs::create_dir_all(&dir)?;
                self.logs.entry(key.to_string()).or_insert(LocalLog {
                    dir,
                    segment_base: -1,
                    segment_len: 0,
                    frames: Vec::new(),
                    next_offset: -1,
                })
            }
        };
        let expected = (log.next_offset >= 0).then_some(log.next_offset);
        let headers = segment::frames_in(frames, expected)
            .map_err(|e| LogError::Corrupt(format!("bucket {key}: {e}")))?;
        let Some(last) = headers.last() else {
            return Ok(());
        };
        if log.segment_base < 0 || log.segment_len >= self.segment_bytes {
            if log.segment_base >= 0 {
                segment::write_index(&log.dir, log.segment_base, &log.frames)?;
            }
            log.segment_base = headers[0].base_offset;
            log.segment_len = 0;
            log.frames.clear();
        }
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(segment::segment_path(&log.dir, log.segment_base))?
            .write_all(frames)?;
        log.next_offset = last.last_offset() + 1;
        log.frames.extend(headers.iter().map(|header| FrameHeader {
            position: header.position + log.segment_len,
            ..*header
        }));
        log.segment_len += frames.len() as u64;
        Ok(())
    }

    /// How many buckets' logs were rebuilt.
    pub(crate) fn buckets(&self) -> usize {
        self.logs.len()
    }
}
