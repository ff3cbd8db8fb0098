//! Snapshot reads: every row of a bucket's store in key order, as of one applied offset,
//! read a chunk at a time as the consumer asks for it.

use std::ops::Bound;

use fjall::{Readable, Snapshot, UserKey, UserValue};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, StreamExt as _};

use super::{KvTablet, decode_offset, kv_error};
use crate::error::Result;

/// Rows a chunk's buffer is made for before any is read: a larger chunk (a client's
/// `batch_rows`) grows it as rows come, so memory follows the rows the store holds, not
/// the rows asked for. The default Snapshot batch fits at once.
const PREALLOCATED_ROWS: usize = 8192;

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

    /// The stored rows in key order as a stream of chunks of at most `chunk` rows (at
    /// most `limit` rows in all), each turned into a `T` by `convert`.
    ///
    /// Two short jobs on the store's read threads make each chunk: one reads its rows
    /// (continuing after the last key of the chunk before), one converts them. Reading a
    /// chunk is started when the stream is first polled, then as soon as the chunk before
    /// has been read, so the store reads chunk n + 1 on one thread while chunk n is
    /// converted on another and sent. A consumer that stops reading holds no thread at
    /// all, only the snapshot, its last key and one chunk read ahead; a few hundred
    /// stalled readers cannot starve the store's threads.
    pub fn into_chunks<T, F>(
        self,
        chunk: usize,
        limit: usize,
        convert: F,
    ) -> BoxStream<'static, Result<T>>
    where
        T: Send + 'static,
        F: FnMut(Vec<UserValue>) -> Result<T> + Send + 'static,
    {
        let tablet = self.tablet.clone();
        let cursor = Cursor {
            reader: self,
            after: None,
            remaining: limit,
            chunk: chunk.max(1),
        };
        let chunks = Chunks {
            next: Next::Unread(cursor),
            convert,
            tablet,
        };
        stream::try_unfold(chunks, |chunks| async move {
            let Chunks {
                next,
                convert,
                tablet,
            } = chunks;
            let reading = match next {
                Next::Unread(cursor) => match Next::start(cursor)? {
                    Next::Reading(reading) => reading,
                    _ => return Ok(None),
                },
                Next::Reading(reading) => reading,
                Next::Done => return Ok(None),
            };
            let (cursor, values) = reading.await?;
            let Some(values) = values else {
                return Ok(None);
            };
            let next = Next::start(cursor)?;
            let (convert, item) = tablet
                .queue_read(move || {
                    let mut convert = convert;
                    let item = convert(values);
                    Ok((convert, item))
                })?
                .await?;
            let chunks = Chunks {
                next,
                convert,
                tablet,
            };
            Ok(Some((item?, chunks)))
        })
        .boxed()
    }
}

/// A chunked read: its next chunk's rows, and how they become a `T`.
struct Chunks<F> {
    next: Next,
    convert: F,
    tablet: KvTablet,
}

/// The rows of a chunk being read on the store's threads, and the cursor after them.
type Reading = BoxFuture<'static, Result<(Cursor, Option<Vec<UserValue>>)>>;

/// The next chunk of a chunked read: not asked for yet, being read, or past the end.
enum Next {
    Unread(Cursor),
    Reading(Reading),
    Done,
}

impl Next {
    /// Starts reading the chunk after `cursor`, unless the read is over.
    fn start(mut cursor: Cursor) -> Result<Self> {
        if cursor.remaining == 0 {
            return Ok(Self::Done);
        }
        let tablet = cursor.reader.tablet.clone();
        let reading = tablet.queue_read(move || {
            let values = cursor.next_values()?;
            Ok((cursor, values))
        })?;
        Ok(Self::Reading(reading.boxed()))
    }
}

/// Where a chunked read of a snapshot stands.
struct Cursor {
    reader: SnapshotReader,
    /// The last key returned so far.
    after: Option<UserKey>,
    /// Rows still to return (0 once the store is exhausted).
    remaining: usize,
    chunk: usize,
}

impl Cursor {
    /// The next chunk's stored rows; `None` past the last row.
    fn next_values(&mut self) -> Result<Option<Vec<UserValue>>> {
        let take = self.chunk.min(self.remaining);
        let (snapshot, rows) = (&self.reader.snapshot, &self.reader.tablet.rows);
        let iter = match &self.after {
            None => snapshot.iter(rows),
            Some(key) => snapshot.range(rows, (Bound::Excluded(key.clone()), Bound::Unbounded)),
        };
        let mut values = Vec::with_capacity(take.min(PREALLOCATED_ROWS));
        let mut last = None;
        for guard in iter.take(take) {
            let (key, value) = guard.into_inner().map_err(kv_error)?;
            last = Some(key);
            values.push(value);
        }
        if values.len() < take {
            self.remaining = 0;
        } else {
            self.remaining -= values.len();
        }
        if values.is_empty() {
            return Ok(None);
        }
        self.after = last;
        Ok(Some(values))
    }
}

#[cfg(test)]
mod tests {
    use futures::TryStreamExt as _;

    use crate::kv::{KvStore, KvTablet};

    /// A tablet holding the keys `0..keys`, key `k` with the value `k + 100`.
    fn tablet_with(keys: u8) -> (tempfile::TempDir, KvTablet) {
        let dir = tempfile::tempdir().unwrap();
        let tablet = KvStore::open(dir.path()).unwrap().tablet("t").unwrap();
        for k in 0..keys {
            tablet.rows.insert(vec![k], vec![k + 100]).unwrap();
        }
        (dir, tablet)
    }

    #[tokio::test]
    async fn chunks_continue_after_the_last_key_and_stop_at_the_limit() {
        let (_dir, tablet) = tablet_with(10);
        let values = |chunk, limit| {
            let reader = tablet.snapshot().unwrap();
            reader
                .into_chunks(chunk, limit, |values| {
                    Ok(values.iter().map(|v| v[0]).collect::<Vec<u8>>())
                })
                .try_collect::<Vec<_>>()
        };
        let chunks = values(4, usize::MAX).await.unwrap();
        assert_eq!(
            chunks,
            [
                vec![100, 101, 102, 103],
                vec![104, 105, 106, 107],
                vec![108, 109]
            ]
        );
        assert_eq!(values(5, usize::MAX).await.unwrap().len(), 2);
        assert_eq!(
            values(4, 6).await.unwrap(),
            [vec![100, 101, 102, 103], vec![104, 105]]
        );
        assert!(values(4, 0).await.unwrap().is_empty());

        // The snapshot holds: rows written after it are not read.
        let reader = tablet.snapshot().unwrap();
        tablet.rows.insert(vec![5u8, 0], vec![0u8]).unwrap();
        let rows: Vec<usize> = reader
            .into_chunks(3, usize::MAX, |values| Ok(values.len()))
            .try_collect()
            .await
            .unwrap();
        assert_eq!(rows, [3, 3, 3, 1]);
    }

    #[tokio::test]
    async fn a_huge_chunk_allocates_for_the_rows_it_reads_not_the_rows_it_asks_for() {
        let (_dir, tablet) = tablet_with(3);
        let capacities: Vec<(usize, usize)> = tablet
            .snapshot()
            .unwrap()
            .into_chunks(usize::MAX, usize::MAX, |values| {
                Ok((values.len(), values.capacity()))
            })
            .try_collect()
            .await
            .unwrap();
        assert_eq!(capacities.len(), 1);
        let (rows, capacity) = capacities[0];
        assert_eq!(rows, 3);
        assert!(capacity <= super::PREALLOCATED_ROWS, "{capacity}");
    }
}
