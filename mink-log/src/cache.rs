//! The log cache: the most recent batches of a bucket, decoded and as stored, so readers
//! at the tail never touch a segment file nor decode or encode a batch.

use std::collections::VecDeque;
use std::sync::Arc;

use super::segment::CachedBatch;

/// Recent batches by base offset, evicted oldest first beyond a byte budget.
#[derive(Debug)]
pub(crate) struct LogCache {
    batches: VecDeque<(i64, Arc<CachedBatch>, u64)>,
    bytes: u64,
    budget: u64,
}

impl LogCache {
    pub(crate) fn new(budget: u64) -> Self {
        Self {
            batches: VecDeque::new(),
            bytes: 0,
            budget,
        }
    }

    /// Adds the batch that starts at `base_offset` (always newer than every cached one).
    pub(crate) fn insert(&mut self, base_offset: i64, batch: Arc<CachedBatch>, bytes: u64) {
        self.batches.push_back((base_offset, batch, bytes));
        self.bytes += bytes;
        while self.bytes > self.budget {
            match self.batches.pop_front() {
                Some((_, _, evicted)) => self.bytes -= evicted,
                None => break,
            }
        }
    }

    /// The cached batch starting at `base_offset`.
    pub(crate) fn get(&self, base_offset: i64) -> Option<Arc<CachedBatch>> {
        let index = self
            .batches
            .binary_search_by_key(&base_offset, |(base, _, _)| *base)
            .ok()?;
        Some(Arc::clone(&self.batches[index].1))
    }

    /// Forgets batches below `log_start` (retention).
    pub(crate) fn truncate_before(&mut self, log_start: i64) {
        while let Some((base, _, bytes)) = self.batches.front() {
            if *base >= log_start {
                break;
            }
            self.bytes -= *bytes;
            self.batches.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::RecordBatch;

    use super::*;
    use crate::segment::Payload;

    fn batch() -> Arc<CachedBatch> {
        Arc::new(CachedBatch {
            batch: RecordBatch::new_empty(Arc::new(arrow::datatypes::Schema::empty())),
            payload: Payload {
                ipc: bytes::Bytes::new(),
                changes: None,
                writer: None,
            },
        })
    }

    #[test]
    fn evicts_oldest_beyond_budget() {
        let mut cache = LogCache::new(100);
        cache.insert(0, batch(), 60);
        cache.insert(10, batch(), 30);
        assert!(cache.get(0).is_some() && cache.get(10).is_some());
        cache.insert(20, batch(), 30);
        assert!(cache.get(0).is_none());
        assert!(cache.get(10).is_some() && cache.get(20).is_some());
        assert!(cache.get(15).is_none());
        cache.truncate_before(20);
        assert!(cache.get(10).is_none() && cache.get(20).is_some());
    }
}
