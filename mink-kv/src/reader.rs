//! Snapshot reads: every row of a bucket's store in key order, as of one applied offset,
//! read a chunk at a time a little ahead of the consumer, a large bucket over two key
//! ranges at once.

use std::ops::Bound;
use std::sync::Arc;

use fjall::{Readable, Snapshot, UserKey, UserValue};
use futures::future;
use futures::stream::{self, BoxStream, StreamExt as _, TryStreamExt as _};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::runs::{Merged, Run};
use super::{KvTablet, decode_offset, kv_error};
use crate::error::{KvError, Result};

/// Rows a chunk's buffer is made for before any is read: a larger chunk (a client's
/// `batch_rows`) grows it as rows come, so memory follows the rows the store holds, not
/// the rows asked for. The default Snapshot batch fits at once.
const PREALLOCATED_ROWS: usize = 8192;

/// A chunk ends once its stored rows reach this many bytes, whatever rows it was asked
/// for: what a stalled reader holds (the chunks read ahead, a chunk being sent) stays
/// small however wide the rows. The default Snapshot batch (8192 rows) reaches it with
/// rows of 256 bytes; of 60-byte rows it is about a fourth of it.
pub const MAX_CHUNK_BYTES: usize = 2 << 20;

/// Chunks each key range of a Snapshot read holds read ahead of the one taken from it
/// (one more is being read): a stalled reader holds at most [`PARTS_AT_ONCE`] x
/// (`READ_AHEAD` + 1) chunks of about [`MAX_CHUNK_BYTES`]. Four rather than one keep both
/// read threads busier: a 1M-row Snapshot of one bucket 1.06-1.12x as fast
/// (docs/benchmarks.md).
const READ_AHEAD: usize = 4;

/// Key ranges a Snapshot read reads at once: the one its chunks are taken from and the
/// next.
const PARTS_AT_ONCE: usize = 2;

/// About how many chunks' rows a key range of a Snapshot read holds.
const PART_CHUNKS: usize = 4;

/// Key ranges a Snapshot read is split into, at most.
const MAX_PARTS: usize = 1024;

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
    /// `convert`. The stream's error is `convert`'s, which the store's own convert into.
    ///
    /// Two kinds of short jobs on the store's read threads make the chunks: one reads a
    /// chunk's rows (continuing after the last key of the chunk before), one converts
    /// them. A bucket of many rows is read as consecutive key ranges ([`Self::part_bounds`]),
    /// [`PARTS_AT_ONCE`] at a time: a task on the runtime per range reads chunk after
    /// chunk, each job started as soon as the one before is done, into a queue of
    /// [`READ_AHEAD`] chunks, and the stream takes the ranges' chunks in key order and
    /// converts each. So the store reads the next chunks, of this range and the next, on
    /// both threads while one is converted and sent, without waiting for the consumer to
    /// ask. A consumer that stops reading holds no thread at all, only the snapshot and
    /// the chunks read ahead; a few hundred stalled readers cannot starve the store's
    /// threads. Must be called within a Tokio runtime.
    pub fn into_chunks<T, E, F>(
        self,
        chunk: usize,
        limit: usize,
        convert: F,
    ) -> BoxStream<'static, Result<T, E>>
    where
        T: Send + 'static,
        E: From<KvError> + Send + 'static,
        F: FnMut(Vec<UserValue>) -> Result<T, E> + Send + 'static,
    {
        let chunk = chunk.max(1);
        let tablet = self.tablet.clone();
        // Splitting reads fjall's first and last keys: on a read thread too.
        let split = async move {
            let (reader, bounds) = tablet
                .queue_read(move || {
                    let bounds = self.part_bounds(chunk);
                    Ok((self, bounds))
                })?
                .await?;
            let chunks: Result<BoxStream<'static, Result<T, E>>, E> =
                Ok(reader.read_parts(bounds, chunk, limit, convert));
            chunks
        };
        stream::once(split).try_flatten().boxed()
    }

    /// Where the key ranges of a read in parts begin, after the first (which starts at
    /// the first key): none for a bucket of fewer rows than two parts of
    /// [`PART_CHUNKS`] chunks. The bounds split the span from the first key to the last
    /// evenly, so ranges hold about as many rows where keys are spread evenly; any split
    /// reads every row once.
    fn part_bounds(&self, chunk: usize) -> Vec<UserKey> {
        let buffered: usize = self.runs.iter().map(|run| run.len()).sum();
        let rows = self.tablet.state.rows.approximate_len() + buffered;
        let parts = (rows / chunk.saturating_mul(PART_CHUNKS)).min(MAX_PARTS);
        if parts < 2 {
            return Vec::new();
        }
        let keyspace = &self.tablet.state.rows;
        // A key fjall fails to give is no bound; the read itself returns the error.
        let stored = |guard: Option<fjall::Guard>| guard.and_then(|guard| guard.key().ok());
        let first = (self.runs.iter().filter_map(|run| run.first_key()))
            .chain(stored(self.snapshot.first_key_value(keyspace)).as_deref())
            .min()
            .map(<[u8]>::to_vec);
        let last = (self.runs.iter().filter_map(|run| run.last_key()))
            .chain(stored(self.snapshot.last_key_value(keyspace)).as_deref())
            .max()
            .map(<[u8]>::to_vec);
        match (first, last) {
            (Some(first), Some(last)) if first < last => split_span(&first, &last, parts),
            _ => Vec::new(),
        }
    }

    /// [`Self::into_chunks`], reading the key ranges that `bounds` (ascending) begin,
    /// after the one before the first bound.
    fn read_parts<T, E, F>(
        self,
        bounds: Vec<UserKey>,
        chunk: usize,
        limit: usize,
        convert: F,
    ) -> BoxStream<'static, Result<T, E>>
    where
        T: Send + 'static,
        E: From<KvError> + Send + 'static,
        F: FnMut(Vec<UserValue>) -> Result<T, E> + Send + 'static,
    {
        let tablet = self.tablet.clone();
        let reader = Arc::new(self);
        let starts = std::iter::once(Bound::Unbounded)
            .chain(bounds.clone().into_iter().map(Bound::Included));
        let ends = bounds.into_iter().map(Some).chain(std::iter::once(None));
        let parts = starts.zip(ends).map(move |(from, end)| {
            let (read, chunks) = mpsc::channel(READ_AHEAD);
            let cursor = Cursor {
                reader: Arc::clone(&reader),
                from,
                end,
                remaining: limit,
                chunk,
            };
            tokio::spawn(cursor.read_all(read));
            future::ready(ReceiverStream::new(chunks))
        });
        let chunks = stream::iter(parts)
            .buffered(PARTS_AT_ONCE)
            .flatten()
            .boxed();
        stream::try_unfold(
            (chunks, convert, limit),
            move |(mut chunks, convert, remaining)| {
                let tablet = tablet.clone();
                async move {
                    if remaining == 0 {
                        return Ok(None);
                    }
                    let Some(mut values) = chunks.next().await.transpose()? else {
                        return Ok(None);
                    };
                    // Each range reads up to the limit: the first ranges' rows count.
                    values.truncate(remaining);
                    let remaining = remaining - values.len();
                    let (convert, item) = tablet
                        .queue_read(move || {
                            let mut convert = convert;
                            let item = convert(values);
                            Ok((convert, item))
                        })?
                        .await?;
                    Ok(Some((item?, (chunks, convert, remaining))))
                }
            },
        )
        .boxed()
    }
}

/// `parts - 1` keys that split the span from `first` to `last` (`first < last`) into
/// `parts` ranges of about equal width: ascending, each above `first` and below `last`.
/// Keys are compared as bytes, so the span is measured on the eight bytes after the
/// keys' common prefix.
fn split_span(first: &[u8], last: &[u8], parts: usize) -> Vec<UserKey> {
    let common = first.iter().zip(last).take_while(|(a, b)| a == b).count();
    let word = |key: &[u8]| {
        let tail = &key[common..];
        let mut word = [0; 8];
        let len = tail.len().min(8);
        word[..len].copy_from_slice(&tail[..len]);
        u64::from_be_bytes(word)
    };
    let (low, high) = (word(first), word(last));
    let step = (high - low) / parts as u64;
    if step == 0 {
        return Vec::new();
    }
    (1..parts as u64)
        .map(|part| {
            let bound = [&first[..common], &(low + step * part).to_be_bytes()].concat();
            UserKey::from(bound)
        })
        .collect()
}

/// Where a chunked read of a snapshot's key range stands.
struct Cursor {
    reader: Arc<SnapshotReader>,
    /// Where the next chunk starts: the range's start, then after the last key read.
    from: Bound<UserKey>,
    /// Where the range ends, excluded (`None`: past the last key).
    end: Option<UserKey>,
    /// Rows still to return (0 once the range is exhausted).
    remaining: usize,
    chunk: usize,
}

impl Cursor {
    /// Reads chunk after chunk on the store's threads into `read`, until the range's last
    /// row, an error (sent on), or the stream that takes them is gone.
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

    /// The next chunk's stored rows; `None` past the range's last row.
    fn next_values(&mut self) -> Result<Option<Vec<UserValue>>> {
        let take = self.chunk.min(self.remaining);
        let (snapshot, rows) = (&self.reader.snapshot, &self.reader.tablet.state.rows);
        let end = match &self.end {
            Some(end) => Bound::Excluded(end.clone()),
            None => Bound::Unbounded,
        };
        let stored = snapshot.range(rows, (self.from.clone(), end));
        let stored = stored.map(fjall::Guard::into_inner);
        let start = self.from.as_ref().map(|key| key.as_ref());
        let merged = Merged::new(stored, &self.reader.runs, start)
            .rows()
            .take_while(|row| match (row, &self.end) {
                (Ok((key, _)), Some(end)) => key < end,
                _ => true,
            });
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
        if let Some(last) = last {
            self.from = Bound::Excluded(last);
        }
        Ok(Some(values))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use fjall::UserKey;
    use futures::TryStreamExt as _;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    use super::split_span;
    use crate::runs::Run;
    use crate::{KvConfig, KvError, KvStore, KvTablet};

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
                    Ok::<_, KvError>(values.iter().map(|v| v[0]).collect::<Vec<u8>>())
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
            .into_chunks(3, usize::MAX, |values| Ok::<_, KvError>(values.len()))
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
                Ok::<_, KvError>((values.len(), values.capacity()))
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
                Ok::<_, KvError>(values.iter().map(|v| v[0]).collect())
            })
            .try_collect()
            .await
            .unwrap();
        assert_eq!(chunks, [vec![0, 1, 2], vec![3, 4, 5], vec![6]]);

        // The limit still counts every row.
        let rows: Vec<usize> = tablet
            .snapshot()
            .unwrap()
            .into_chunks(1000, 4, |values| Ok::<_, KvError>(values.len()))
            .try_collect()
            .await
            .unwrap();
        assert_eq!(rows, [3, 1]);
    }

    #[tokio::test]
    async fn a_bucket_of_many_chunks_is_read_in_key_ranges_in_order() {
        let (_dir, tablet) = tablet_with(150);
        let reader = tablet.snapshot().unwrap();
        assert!(
            reader.part_bounds(3).len() > 4,
            "150 rows in chunks of 3 are split"
        );
        let values: Vec<u8> = reader
            .into_chunks(3, usize::MAX, |values| {
                Ok::<_, KvError>(values.iter().map(|v| v[0]).collect::<Vec<u8>>())
            })
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
            .concat();
        assert_eq!(values, (100..250).collect::<Vec<u8>>());
    }

    #[test]
    fn a_span_splits_into_ascending_bounds_inside_it() {
        let bounds = split_span(&[1, 0, 0], &[1, 200, 5], 4);
        let bounds: Vec<&[u8]> = bounds.iter().map(|bound| bound.as_ref()).collect();
        assert_eq!(bounds.len(), 3);
        assert!(bounds.is_sorted(), "{bounds:?}");
        assert!(
            bounds
                .iter()
                .all(|&b| b > [1, 0, 0].as_slice() && b < [1, 200, 5].as_slice())
        );
        // A first key that is a prefix of the last; a span too narrow to split.
        assert_eq!(
            split_span(&[7], &[7, 0, 0, 0, 0, 0, 0, 0, 0, 9], 2).len(),
            0
        );
        assert_eq!(split_span(&[7], &[7, 0, 0, 0, 0, 0, 0, 0, 1], 2).len(), 0);
        assert_eq!(
            split_span(&[7], &[7, 0, 0, 0, 0, 0, 0, 0, 2], 2),
            [UserKey::from([7, 0, 0, 0, 0, 0, 0, 0, 1])]
        );
    }

    /// Random stored rows, random runs over them (deletions too), random range bounds,
    /// chunk sizes and limits: a read in parts returns every current row once, in key
    /// order, up to the limit.
    #[tokio::test]
    async fn reads_in_key_ranges_return_the_rows_in_order_whatever_the_bounds() {
        for seed in 0..60 {
            let mut rng = StdRng::seed_from_u64(seed);
            let dir = tempfile::tempdir().unwrap();
            let tablet = KvStore::open(dir.path(), &KvConfig::default())
                .unwrap()
                .tablet("t")
                .unwrap();
            let key = |rng: &mut StdRng| vec![rng.random_range(0..4u8), rng.random::<u8>()];
            let mut model = BTreeMap::<Vec<u8>, Vec<u8>>::new();
            for _ in 0..rng.random_range(0..300) {
                let key = key(&mut rng);
                // Now and then a row wide enough for the chunks' byte bound.
                let width = match rng.random_bool(0.03) {
                    true => super::MAX_CHUNK_BYTES / 3,
                    false => 0,
                };
                let row = [&key[..], &[0], &vec![0; width]].concat();
                tablet.state.rows.insert(&key, &row).unwrap();
                model.insert(key.clone(), row);
            }
            for version in 1..=rng.random_range(0..4u8) {
                let mut entries: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
                for _ in 0..rng.random_range(0..100) {
                    let key = key(&mut rng);
                    let row = rng
                        .random_bool(0.8)
                        .then(|| [&key[..], &[version]].concat());
                    entries.insert(key, row);
                }
                for (key, row) in &entries {
                    match row {
                        Some(row) => model.insert(key.clone(), row.clone()),
                        None => model.remove(key),
                    };
                }
                let entries: Vec<_> = entries.into_iter().collect();
                tablet
                    .buffer(Arc::new(Run::from_owned(&entries)), i64::from(version))
                    .unwrap();
            }
            let mut bounds: Vec<Vec<u8>> =
                (0..rng.random_range(0..6)).map(|_| key(&mut rng)).collect();
            bounds.sort();
            bounds.dedup();
            let bounds = bounds.into_iter().map(UserKey::from).collect();
            let (chunk, limit) = (
                rng.random_range(1..8),
                match rng.random_bool(0.7) {
                    true => usize::MAX,
                    false => rng.random_range(0..200),
                },
            );
            let read: Vec<Vec<u8>> = tablet
                .snapshot()
                .unwrap()
                .read_parts(bounds, chunk, limit, move |values| {
                    assert!(!values.is_empty() && values.len() <= chunk);
                    Ok::<_, KvError>(
                        values
                            .iter()
                            .map(|value| value.to_vec())
                            .collect::<Vec<_>>(),
                    )
                })
                .try_collect::<Vec<_>>()
                .await
                .unwrap()
                .concat();
            let expected: Vec<Vec<u8>> = model.into_values().take(limit).collect();
            assert_eq!(read, expected, "seed {seed}");
        }
    }
}
