//! The block cache of stream objects: a history read fetches what it needs of a stream
//! object in blocks of [`BLOCK`] bytes, kept for the next reader, with a readahead that
//! grows while reads of the object go on in order (AutoMQ's catch-up reads: 512 KiB
//! growing to 32 MiB) and starts over on a read elsewhere.
//!
//! ```text
//!   read [start, end) ──▶ blocks first..=last ──▶ cached? ──no──▶ one ranged GET of the
//!                                                                 missing run (+ readahead)
//! ```

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt as _};
use quick_cache::Weighter;

use crate::error::{LogError, Result};

/// Bytes of a block: the least a GET fetches.
pub(crate) const BLOCK: u64 = 512 << 10;
/// Most blocks read ahead of a sequential reader (32 MiB).
const MAX_READAHEAD: u64 = 64;
/// Objects whose readers' progress is remembered; past it the memory starts over.
const TRACKED_OBJECTS: usize = 4096;

/// An object of the store as the cache reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CachedObject {
    pub(crate) path: StorePath,
    /// Its length in bytes.
    pub(crate) len: u64,
}

/// Blocks of stream objects, by object and block number, within a byte budget.
pub(crate) struct BlockCache {
    store: Arc<dyn ObjectStore>,
    blocks: quick_cache::sync::Cache<(StorePath, u64), Bytes, ByLength>,
    /// Per object, where its last read ended (a block number) and its readahead then.
    readers: Mutex<HashMap<StorePath, Readahead>>,
}

impl std::fmt::Debug for BlockCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockCache")
            .field("bytes", &self.blocks.weight())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Copy)]
struct Readahead {
    /// The block after the last one read.
    next: u64,
    /// Blocks fetched beyond a read that continues from `next`.
    blocks: u64,
}

#[derive(Debug, Clone)]
struct ByLength;

impl Weighter<(StorePath, u64), Bytes> for ByLength {
    fn weight(&self, _: &(StorePath, u64), block: &Bytes) -> u64 {
        block.len() as u64
    }
}

impl BlockCache {
    /// A cache of `budget` bytes of `store`'s objects.
    pub(crate) fn new(store: Arc<dyn ObjectStore>, budget: u64) -> Self {
        let estimated_blocks = usize::try_from(budget / BLOCK)
            .unwrap_or(usize::MAX)
            .max(16);
        Self {
            store,
            blocks: quick_cache::sync::Cache::with_weighter(estimated_blocks, budget, ByLength),
            readers: Mutex::default(),
        }
    }

    /// The bytes `range` of `object`.
    ///
    /// # Errors
    /// The store failed, or `range` is not inside the object.
    pub(crate) async fn read(&self, object: &CachedObject, range: Range<u64>) -> Result<Bytes> {
        if range.start >= range.end || range.end > object.len {
            return Err(LogError::Corrupt(format!(
                "bytes {range:?} are not inside stream object {} of {} bytes",
                object.path, object.len
            )));
        }
        let (first, last) = (range.start / BLOCK, (range.end - 1) / BLOCK);
        let continues = self.continues(&object.path, first, last);
        let last_block = (object.len - 1) / BLOCK;
        let mut blocks = Vec::with_capacity((last - first + 1) as usize);
        let mut next = first;
        while next <= last {
            if let Some(block) = self.blocks.get(&(object.path.clone(), next)) {
                blocks.push(block);
                next += 1;
                continue;
            }
            let mut run_end = next;
            while run_end < last
                && !self
                    .blocks
                    .contains_key(&(object.path.clone(), run_end + 1))
            {
                run_end += 1;
            }
            if run_end == last {
                run_end = (last + self.readahead(&object.path, continues)).min(last_block);
            }
            let fetched = self.fetch(object, next..run_end + 1).await?;
            for (number, block) in (next..).zip(fetched) {
                if number <= last {
                    blocks.push(block.clone());
                }
                self.blocks.insert((object.path.clone(), number), block);
            }
            next = run_end + 1;
        }
        Ok(assemble(&blocks, first, range))
    }

    /// Fetches blocks `numbers` of `object` with one ranged GET.
    async fn fetch(&self, object: &CachedObject, numbers: Range<u64>) -> Result<Vec<Bytes>> {
        let bytes = numbers.start * BLOCK..(numbers.end * BLOCK).min(object.len);
        let fetched = self
            .store
            .get_range(&object.path, bytes.clone())
            .await
            .map_err(|e| LogError::Store(format!("reading {bytes:?} of {}: {e}", object.path)))?;
        if fetched.len() as u64 != bytes.end - bytes.start {
            return Err(LogError::Corrupt(format!(
                "stream object {} is shorter than {} bytes",
                object.path, object.len
            )));
        }
        Ok((0..fetched.len())
            .step_by(BLOCK as usize)
            .map(|at| fetched.slice(at..(at + BLOCK as usize).min(fetched.len())))
            .collect())
    }

    /// Whether a read of blocks `first..=last` of `object` continues the last read of it
    /// (starting in the block that one ended in, or the next); a read that does not
    /// starts the readahead over.
    fn continues(&self, object: &StorePath, first: u64, last: u64) -> bool {
        let mut readers = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        if readers.len() >= TRACKED_OBJECTS && !readers.contains_key(object) {
            readers.clear();
        }
        let reader = readers.entry(object.clone()).or_insert(Readahead {
            next: u64::MAX,
            blocks: 0,
        });
        let continues = first == reader.next || first + 1 == reader.next;
        if !continues {
            reader.blocks = 0;
        }
        reader.next = last + 1;
        continues
    }

    /// The blocks to fetch ahead of a read of `object` that needs a GET: twice the last
    /// readahead (from one block up to [`MAX_READAHEAD`]) for a read that `continues`
    /// the last, none for another.
    fn readahead(&self, object: &StorePath, continues: bool) -> u64 {
        let mut readers = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        let Some(reader) = readers.get_mut(object).filter(|_| continues) else {
            return 0;
        };
        reader.blocks = (reader.blocks * 2).clamp(1, MAX_READAHEAD);
        reader.blocks
    }
}

/// The bytes `range` out of consecutive blocks starting with block `first`.
fn assemble(blocks: &[Bytes], first: u64, range: Range<u64>) -> Bytes {
    let start = (range.start - first * BLOCK) as usize;
    let len = (range.end - range.start) as usize;
    if let [block] = blocks {
        return block.slice(start..start + len);
    }
    let mut out = BytesMut::with_capacity(len);
    let mut skip = start;
    for block in blocks {
        let take = (block.len() - skip).min(len - out.len());
        out.extend_from_slice(&block[skip..skip + take]);
        skip = 0;
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use object_store::PutPayload;
    use object_store::memory::InMemory;

    use super::*;

    /// A store holding one object of `len` bytes, byte `i` being `i % 251`.
    async fn store_with_object(len: u64) -> (Arc<InMemory>, CachedObject) {
        let store = Arc::new(InMemory::new());
        let path = StorePath::from("streams/t1/b0/object");
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        store.put(&path, PutPayload::from(bytes)).await.unwrap();
        (store, CachedObject { path, len })
    }

    fn expected(range: Range<u64>) -> Vec<u8> {
        range.map(|i| (i % 251) as u8).collect()
    }

    #[tokio::test]
    async fn reads_return_the_bytes_asked_for_across_blocks() {
        let len = 5 * BLOCK + 123;
        let (store, object) = store_with_object(len).await;
        let cache = BlockCache::new(store, 64 << 20);
        for range in [
            0..10,
            BLOCK - 5..BLOCK + 5,
            3..4 * BLOCK + 7,
            len - 100..len,
            0..len,
        ] {
            let read = cache.read(&object, range.clone()).await.unwrap();
            assert_eq!(read.as_ref(), expected(range.clone()), "{range:?}");
        }
        for bad in [len - 1..len + 1, 5..5] {
            assert!(cache.read(&object, bad).await.is_err());
        }
    }

    #[tokio::test]
    async fn the_readahead_grows_on_sequential_reads_and_starts_over_elsewhere() {
        let len = 200 * BLOCK;
        let (store, object) = store_with_object(len).await;
        let cache = BlockCache::new(store, 1 << 30);
        let read = |block: u64| cache.read(&object, block * BLOCK..block * BLOCK + 10);
        read(0).await.unwrap();
        let cached = |cache: &BlockCache| cache.blocks.len() as u64;
        assert_eq!(cached(&cache), 1, "a first read fetches its block only");
        // Every block in order: each GET fetches twice the readahead of the last.
        let mut fetches = Vec::new();
        for block in 1..100 {
            let before = cached(&cache);
            read(block).await.unwrap();
            if cached(&cache) > before {
                fetches.push(cached(&cache) - before);
            }
        }
        assert_eq!(fetches, [2, 3, 5, 9, 17, 33, 65], "blocks per GET");
        let before = cached(&cache);
        read(180).await.unwrap();
        assert_eq!(
            cached(&cache),
            before + 1,
            "a read elsewhere reads no ahead"
        );
        read(181).await.unwrap();
        assert_eq!(cached(&cache), before + 3, "and its readahead starts over");
    }

    #[tokio::test]
    async fn the_cache_keeps_within_its_budget() {
        let (store, object) = store_with_object(40 * BLOCK).await;
        let cache = BlockCache::new(store, 8 * BLOCK);
        for block in 0..40 {
            cache
                .read(&object, block * BLOCK..block * BLOCK + 1)
                .await
                .unwrap();
        }
        assert!(
            cache.blocks.weight() <= 8 * BLOCK,
            "{}",
            cache.blocks.weight()
        );
    }
}
