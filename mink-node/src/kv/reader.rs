//! Snapshot reads: every row of a bucket's store in key order, as of one applied offset.

use fjall::{Readable, Snapshot};

use super::{KvTablet, decode_offset, kv_error};
use crate::error::Result;

/// A point-in-time view of one KV tablet: the rows and the log offset they reflect.
pub struct SnapshotReader {
    snapshot: Snapshot,
    tablet: KvTablet,
    log_offset: i64,
}

impl std::fmt::Debug for SnapshotReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotReader")
            .field("tablet", &self.tablet.name)
            .field("log_offset", &self.log_offset)
            .finish_non_exhaustive()
    }
}

impl SnapshotReader {
    pub(super) fn new(tablet: &KvTablet) -> Result<Self> {
        let snapshot = tablet.store.db.snapshot();
        let applied = snapshot
            .get(&tablet.store.applied, tablet.name.as_bytes())
            .map_err(kv_error)?;
        Ok(Self {
            log_offset: decode_offset(applied.as_deref())?,
            snapshot,
            tablet: tablet.clone(),
        })
    }

    /// Every change below this offset is in the snapshot, none at or above it.
    pub fn log_offset(&self) -> i64 {
        self.log_offset
    }

    /// The stored rows in key order, `chunk` at a time, at most `limit` in all; `visit`
    /// returns `false` to stop early.
    pub fn for_each_chunk(
        &self,
        chunk: usize,
        limit: usize,
        mut visit: impl FnMut(Vec<fjall::UserValue>) -> Result<bool>,
    ) -> Result<()> {
        let mut values = Vec::with_capacity(chunk.min(limit));
        for guard in self.snapshot.iter(&self.tablet.rows).take(limit) {
            values.push(guard.value().map_err(kv_error)?);
            if values.len() == chunk && !visit(std::mem::take(&mut values))? {
                return Ok(());
            }
        }
        if !values.is_empty() {
            visit(values)?;
        }
        Ok(())
    }
}
