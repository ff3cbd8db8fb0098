//! The block cache of stream objects: a history read fetches what it needs of a stream
//! object in blocks of [`BLOCK`] bytes, kept for the next reader. A reader that goes on in
//! order has the blocks after its read fetched in the background, in windows that double
//! up to [`MAX_READAHEAD`] blocks (AutoMQ's catch-up reads: 512 KiB growing to 32 MiB),
//! so the next read finds them cached or landing while the last one's rows are decoded
//! and sent; a read elsewhere starts the readahead over.
//!
//! ```text
//!   read [start, end) ──▶ blocks first..=last ──▶ cached, or landing (wait) ──▶ else one
//!                                                 ranged GET of each missing run
//!                   └──▶ in order? less than half a window left ahead ──▶ background GET
//!                                                                  of the next window
//! ```

use std::collections::HashMap;
use std::ops::{Range, RangeInclusive};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt as _};
use quick_cache::Weighter;

use crate::error::{LogError, Result};

/// Bytes of a block: the least a GET fetches.
pub(crate) const BLOCK: u64 = 512 << 10;
/// Most blocks fetched ahead of a sequential reader at once (32 MiB).
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

type Blocks = quick_cache::sync::Cache<(StorePath, u64), Block, ByLength>;

/// A block of an object: a part of the GET that fetched it (its window, which stays whole
/// while any of its blocks is cached), so a read inside one window is a slice of it.
#[derive(Debug, Clone)]
struct Block {
    window: Bytes,
    /// Where in the window the block starts.
    at: usize,
    len: usize,
}

impl Block {
    fn bytes(&self) -> &[u8] {
        &self.window[self.at..self.at + self.len]
    }
}

/// Blocks of stream objects, by object and block number, within a byte budget.
pub(crate) struct BlockCache {
    store: Arc<dyn ObjectStore>,
    blocks: Arc<Blocks>,
    /// Per object, how its reader goes on.
    readers: Mutex<HashMap<StorePath, Reader>>,
}

impl std::fmt::Debug for BlockCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockCache")
            .field("bytes", &self.blocks.weight())
            .finish_non_exhaustive()
    }
}

/// The reader of an object, as the cache follows it.
#[derive(Debug)]
struct Reader {
    /// The block after the last one read.
    next: u64,
    /// Blocks of the last window fetched ahead (0: none yet).
    window: u64,
    /// The block after the last one fetched, or being fetched, ahead of the reader.
    ahead_to: u64,
    /// Windows still being fetched.
    landing: Vec<Landing>,
}

/// A window of blocks being fetched in the background.
#[derive(Debug, Clone)]
struct Landing {
    blocks: Range<u64>,
    /// Ready once its blocks are in the cache (or its GET failed).
    landed: Shared<BoxFuture<'static, ()>>,
}

#[derive(Debug, Clone)]
struct ByLength;

impl Weighter<(StorePath, u64), Block> for ByLength {
    fn weight(&self, _: &(StorePath, u64), block: &Block) -> u64 {
        block.len as u64
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
            blocks: Arc::new(Blocks::with_weighter(estimated_blocks, budget, ByLength)),
            readers: Mutex::default(),
        }
    }

    /// The bytes `range` of `object`. Runs on a Tokio runtime (the readahead spawns).
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
        let (in_order, landing) = self.follow(&object.path, first, last);
        for landing in landing {
            landing.landed.await;
        }
        let blocks = self.blocks_of(object, first..=last).await?;
        if in_order {
            self.read_ahead(object, last);
        }
        Ok(assemble(&blocks, first, range))
    }

    /// Blocks `numbers` of `object`, from the cache or by one GET of each missing run.
    async fn blocks_of(
        &self,
        object: &CachedObject,
        numbers: RangeInclusive<u64>,
    ) -> Result<Vec<Block>> {
        let (first, last) = numbers.into_inner();
        let cached = |number| self.blocks.get(&(object.path.clone(), number));
        let mut blocks = Vec::with_capacity((last - first + 1) as usize);
        let mut next = first;
        while next <= last {
            if let Some(block) = cached(next) {
                blocks.push(block);
                next += 1;
                continue;
            }
            let mut run_end = next + 1;
            while run_end <= last && cached(run_end).is_none() {
                run_end += 1;
            }
            for (number, block) in (next..).zip(fetch(&*self.store, object, next..run_end).await?) {
                self.blocks
                    .insert((object.path.clone(), number), block.clone());
                blocks.push(block);
            }
            next = run_end;
        }
        Ok(blocks)
    }

    /// Follows `object`'s reader to a read of blocks `first..=last`: whether it goes on in
    /// order (starts in the block the last read ended in, or the next; a read that does
    /// not starts the readahead over), and the windows landing that it needs.
    fn follow(&self, object: &StorePath, first: u64, last: u64) -> (bool, Vec<Landing>) {
        let mut readers = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        if readers.len() >= TRACKED_OBJECTS && !readers.contains_key(object) {
            readers.clear();
        }
        let reader = readers.entry(object.clone()).or_insert(Reader {
            next: u64::MAX,
            window: 0,
            ahead_to: 0,
            landing: Vec::new(),
        });
        let in_order = first == reader.next || first + 1 == reader.next;
        if !in_order {
            reader.window = 0;
            reader.ahead_to = 0;
        }
        reader.next = last + 1;
        reader
            .landing
            .retain(|landing| landing.landed.peek().is_none());
        let needed = (reader.landing.iter())
            .filter(|landing| landing.blocks.start <= last && first < landing.blocks.end)
            .cloned()
            .collect();
        (in_order, needed)
    }

    /// After an in-order read ending in block `last` of `object`: once less than half a
    /// window is fetched ahead of it, fetches the next window, twice the last (from one
    /// block up to [`MAX_READAHEAD`]), in the background.
    fn read_ahead(&self, object: &CachedObject, last: u64) {
        let end = object.len.div_ceil(BLOCK);
        let mut readers = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        let Some(reader) = readers.get_mut(&object.path) else {
            return;
        };
        let from = reader.ahead_to.max(last + 1);
        if from >= end || from - (last + 1) > reader.window / 2 {
            return;
        }
        reader.window = (reader.window * 2).clamp(1, MAX_READAHEAD);
        let blocks = from..(from + reader.window).min(end);
        reader.ahead_to = blocks.end;
        let (store, cache, object) = (
            Arc::clone(&self.store),
            Arc::clone(&self.blocks),
            object.clone(),
        );
        let window = blocks.clone();
        let fetching = tokio::spawn(async move {
            // A failed readahead is only a miss: the read that needs a block fetches it.
            if let Ok(fetched) = fetch(&*store, &object, window.clone()).await {
                for (number, block) in window.zip(fetched) {
                    cache.insert((object.path.clone(), number), block);
                }
            }
        });
        let landed = fetching.map(|_| ()).boxed().shared();
        reader.landing.push(Landing { blocks, landed });
    }
}

/// Fetches blocks `numbers` of `object` from `store` with one ranged GET.
async fn fetch(
    store: &dyn ObjectStore,
    object: &CachedObject,
    numbers: Range<u64>,
) -> Result<Vec<Block>> {
    let bytes = numbers.start * BLOCK..(numbers.end * BLOCK).min(object.len);
    let fetched = store
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
        .map(|at| Block {
            window: fetched.clone(),
            at,
            len: (fetched.len() - at).min(BLOCK as usize),
        })
        .collect())
}

/// The bytes `range` out of consecutive blocks starting with block `first`: a slice of
/// their window if they share one, else a copy.
fn assemble(blocks: &[Block], first: u64, range: Range<u64>) -> Bytes {
    let start = (range.start - first * BLOCK) as usize;
    let len = (range.end - range.start) as usize;
    if let Some((head, rest)) = blocks.split_first()
        && rest
            .iter()
            .all(|block| block.window.as_ptr() == head.window.as_ptr())
    {
        return head.window.slice(head.at + start..head.at + start + len);
    }
    let mut out = BytesMut::with_capacity(len);
    let mut skip = start;
    for block in blocks {
        let bytes = block.bytes();
        let take = (bytes.len() - skip).min(len - out.len());
        out.extend_from_slice(&bytes[skip..skip + take]);
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
    async fn a_read_inside_one_fetched_window_is_a_slice_of_it() {
        let (store, object) = store_with_object(3 * BLOCK).await;
        let cache = BlockCache::new(store, 64 << 20);
        let whole = cache.read(&object, 0..3 * BLOCK).await.unwrap();
        let across = cache.read(&object, BLOCK - 5..BLOCK + 5).await.unwrap();
        assert_eq!(across.as_ref(), expected(BLOCK - 5..BLOCK + 5));
        assert_eq!(
            across.as_ptr(),
            whole[BLOCK as usize - 5..].as_ptr(),
            "not copied"
        );
    }

    /// Waits until every window being fetched ahead of `object`'s reader has landed.
    async fn settle(cache: &BlockCache, object: &CachedObject) {
        let landing = {
            let readers = cache.readers.lock().unwrap();
            readers
                .get(&object.path)
                .map(|reader| reader.landing.clone())
        };
        for landing in landing.into_iter().flatten() {
            landing.landed.await;
        }
    }

    #[tokio::test]
    async fn an_in_order_reader_finds_its_blocks_fetched_ahead_in_growing_windows() {
        let len = 200 * BLOCK;
        let (store, object) = store_with_object(len).await;
        let cache = BlockCache::new(store, 1 << 30);
        let cached = |cache: &BlockCache| cache.blocks.len() as u64;
        let read = |block: u64| cache.read(&object, block * BLOCK..block * BLOCK + 10);
        read(0).await.unwrap();
        settle(&cache, &object).await;
        assert_eq!(cached(&cache), 1, "a first read fetches its block only");
        let mut windows = Vec::new();
        for block in 1..100 {
            let before = cached(&cache);
            read(block).await.unwrap();
            settle(&cache, &object).await;
            assert!(
                cache
                    .blocks
                    .get(&(object.path.clone(), block + 1))
                    .is_some(),
                "block {} is fetched before it is read",
                block + 1
            );
            if cached(&cache) > before {
                windows.push(cached(&cache) - before);
            }
        }
        assert_eq!(
            windows,
            [2, 2, 4, 8, 16, 32, 64, 64],
            "blocks fetched at each step (the first with block 1 itself)"
        );
        let before = cached(&cache);
        read(195).await.unwrap();
        settle(&cache, &object).await;
        assert_eq!(
            cached(&cache),
            before + 1,
            "a read elsewhere reads no ahead"
        );
        read(196).await.unwrap();
        settle(&cache, &object).await;
        assert_eq!(
            cached(&cache),
            before + 3,
            "and its readahead starts over (block 196, then one ahead)"
        );
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
