//! Snapshot reads: every row of a bucket's store in key order, as of one applied offset,
//! read a chunk at a time as the consumer asks for it.

use std::ops::Bound;
use std::sync::Arc;

use fjall::{Readable, Snapshot, UserKey, UserValue};
use futures::stream::{self, BoxStream, StreamExt as _};
use tokio::sync::mpsc;

use super::runs::{Merged, Run};
use super::{KvTablet, decode_offset, kv_error};
use crate::error::Result;

/// Rows a chunk's buffer is made for before any is read: a larger chunk (a client's
/// `batch_rows`) grows it as rows come, so memory follows the rows the store holds, not
/// the rows asked for. The default Snapshot batch fits at once.
const PREALLOCATED_ROWS: usize = 8192;

/// A chunk ends once its stored rows reach this many bytes, whatever rows it was asked
/// for: what a stalled reader holds (the chunks read ahead, a chunk being sent) stays
/// small however wide the rows.
pub const MAX_CHUNK_BYTES: usize = 8 << 20;

/// Chunks a Snapshot read holds read ahead of the one being converted and sent (one more
/// is being read).
const READ_AHEAD: usize = 1;

/// A point-in-time view of one KV tablet: the rows and the log offset they reflect.
pub struct SnapshotReader {
    snapshot: Snapshot,
    /// The write buffer's runs as of the snapshot: newer than fjall's rows.
    runs: Vec<Arc<Run>>,
    tablet: KvTablet,
    log_offset: i64,
}

impl std::fmt::Debug for SnapshotReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotReader")
            .field("tablet", &self.tablet.state.name)
            .field("log_offset", &self.log_offset)
            .finish_non_exhaustive()
    }
}

impl SnapshotReader {
    pub(super) fn new(tablet: &KvTablet) -> Result<Self> {
        let (buffered, snapshot) = tablet.view();
        let log_offset = match buffered.end_offset {
            Some(end_offset) => end_offset,
            None => {
                let applied = snapshot
                    .get(&tablet.store.tablets.applied, tablet.state.name.as_bytes())
                    .map_err(kv_error)?;
                decode_offset(applied.as_deref())?
            }
        };
        Ok(Self {
            log_offset,
            snapshot,
            runs: buffered.runs,
            tablet: tablet.clone(),
        })
    }

    /// Every change below this offset is in the snapshot, none at or above it.
    pub fn log_offset(&self) -> i64 {
        self.log_offset
    }

    /// The stored rows in key order as a stream of chunks of at most `chunk` rows and
    /// about [`MAX_CHUNK_BYTES`] (at most `limit` rows in all), each turned into a `T` by
    /// `convert`.
    ///
    /// Two kinds of short jobs on the store's read threads make the chunks: one reads a
    /// chunk's rows (continuing after the last key of the chunk before), one converts
    /// them. A task on the runtime reads chunk after chunk, each job started as soon as
    /// the one before is done, into a queue of [`READ_AHEAD`] chunks; the stream converts
    /// each as it takes it. So the store reads the next chunks while one is converted and
    /// sent, without waiting for the consumer to ask. A consumer that stops reading holds
    /// no thread at all, only the snapshot, its last key and the chunks read ahead; a few
    /// hundred stalled readers cannot starve the store's threads. Must be called within a
    /// Tokio runtime.
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
        let (read, chunks) = mpsc::channel(READ_AHEAD);
        tokio::spawn(cursor.read_all(read));
        stream::try_unfold((chunks, convert), move |(mut chunks, convert)| {
            let tablet = tablet.clone();
            async move {
                let Some(values) = chunks.recv().await.transpose()? else {
                    return Ok(None);
                };
                let (convert, item) = tablet
                    .queue_read(move || {
                        let mut convert = convert;
                        let item = convert(values);
                        Ok((convert, item))
                    })?
                    .await?;
                Ok(Some((item?, (chunks, convert))))
            }
        })
        .boxed()
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
    /// Reads chunk after chunk on the store's threads into `read`, until the last row, an
    /// error (sent on), or the stream that takes them is gone.
    async fn read_all(mut self, read: mpsc::Sender<Result<Vec<UserValue>>>) {
        while self.remaining > 0 {
            let tablet = self.reader.tablet.clone();
            let chunk = async {
                let reading = tablet.queue_read(move || {
                    let values = self.next_values()?;
                    Ok((self, values))
                });
                reading?.await
            };
            match chunk.await {
                Ok((_, None)) => return,
                Ok((cursor, Some(values))) => {
                    if read.send(Ok(values)).await.is_err() {
                        return;
                    }
                    self = cursor;
                }
                Err(error) => {
                    let _ = read.send(Err(error)).await;
                    return;
                }
            }
        }
    }

    /// The next chunk's stored rows; `None` past the last row.
    fn next_values(&mut self) -> Result<Option<Vec<UserValue>>> {
        let take = self.chunk.min(self.remaining);
        let (snapshot, rows) = (&self.reader.snapshot, &self.reader.tablet.state.rows);
        let (stored, start) = match &self.after {
            None => (snapshot.iter(rows), Bound::Unbounded),
            Some(key) => (
                snapshot.range(rows, (Bound::Excluded(key.clone()), Bound::Unbounded)),
                Bound::Excluded(key.as_ref()),
            ),
        };
        let stored = stored.map(fjall::Guard::into_inner);
        let merged = Merged::new(stored, &self.reader.runs, start).rows();
        let mut values = Vec::with_capacity(take.min(PREALLOCATED_ROWS));
        let (mut last, mut bytes) = (None, 0);
        for row in merged.take(take) {
            let (key, value) = row?;
            bytes += value.len();
            last = Some(key);
            values.push(value);
            if bytes >= MAX_CHUNK_BYTES {
                break;
            }
        }
        let exhausted = values.len() < take && bytes < MAX_CHUNK_BYTES;
        if exhausted {
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

    use crate::kv::{KvConfig, KvStore, KvTablet};

    /// A tablet holding the keys `0..keys`, key `k` with the value `k + 100`.
    fn tablet_with(keys: u8) -> (tempfile::TempDir, KvTablet) {
        let dir = tempfile::tempdir().unwrap();
        let tablet = KvStore::open(dir.path(), &KvConfig::default())
            .unwrap()
            .tablet("t")
            .unwrap();
        for k in 0..keys {
            tablet.state.rows.insert(vec![k], vec![k + 100]).unwrap();
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
        tablet.state.rows.insert(vec![5u8, 0], vec![0u8]).unwrap();
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

    #[tokio::test]
    async fn a_chunk_of_wide_rows_ends_at_its_byte_bound_and_the_next_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let tablet = KvStore::open(dir.path(), &KvConfig::default())
            .unwrap()
            .tablet("t")
            .unwrap();
        let wide = super::MAX_CHUNK_BYTES / 3 + 1;
        for k in 0..7u8 {
            tablet.state.rows.insert(vec![k], vec![k; wide]).unwrap();
        }
        let chunks: Vec<Vec<u8>> = tablet
            .snapshot()
            .unwrap()
            .into_chunks(1000, usize::MAX, |values| {
                Ok(values.iter().map(|v| v[0]).collect())
            })
            .try_collect()
            .await
            .unwrap();
        assert_eq!(chunks, [vec![0, 1, 2], vec![3, 4, 5], vec![6]]);

        // The limit still counts every row.
        let rows: Vec<usize> = tablet
            .snapshot()
            .unwrap()
            .into_chunks(1000, 4, |values| Ok(values.len()))
            .try_collect()
            .await
            .unwrap();
        assert_eq!(rows, [3, 1]);
    }
}
