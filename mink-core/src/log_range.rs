//! Reading a bucket's log range `[from, to)`, wherever the log is read from: the bucket's
//! own tablets at its leader, or Scans of the leader over Flight anywhere else. The read
//! goes chunk by chunk from `from`, each chunk starting where the last one ended; a chunk
//! holds whole stored batches, so its first batch can start before the range and its last
//! end after it, and each batch is trimmed to the range ([`trim`]).
//!
//! A log that ends before `to` is an error ([`CoreError::LogEndsEarly`]): a range is
//! planned below the high watermark, so a read that stops short of it would silently drop
//! rows the plan promised.

use std::future::Future;
use std::sync::Arc;

use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};

use crate::CoreError;

/// A batch of a log read: rows at consecutive offsets from its first.
pub trait OffsetBatch: Sized {
    /// The offset of the first row.
    fn base_offset(&self) -> i64;

    /// The rows it holds.
    fn num_rows(&self) -> usize;

    /// Rows `[start, start + len)` (both within the batch), with every per-row part (the
    /// offsets, the change vector) cut to match.
    fn slice(self, start: usize, len: usize) -> Self;
}

/// One read of the log at an offset: whole batches in log order, and the offset the next
/// read starts at.
#[derive(Debug)]
pub struct Chunk<B> {
    /// The batches read, the first holding the offset asked for.
    pub batches: Vec<B>,
    /// The offset after the last batch.
    pub next_offset: i64,
}

/// The part of `batch` inside `[from, to)`; `None` when no row is.
pub fn trim<B: OffsetBatch>(batch: B, from: i64, to: i64) -> Option<B> {
    let rows = i64::try_from(batch.num_rows()).unwrap_or(i64::MAX);
    let base = batch.base_offset();
    let start = from.saturating_sub(base).clamp(0, rows);
    let end = to.saturating_sub(base).clamp(0, rows);
    if end <= start {
        return None;
    }
    if start == 0 && end == rows {
        return Some(batch);
    }
    // Both are within 0..=rows, which came from a usize.
    Some(batch.slice(start as usize, (end - start) as usize))
}

/// The range `[from, to)` of `log` (a bucket, or where its log is, for errors), read
/// lazily: `read_at(offset)` reads one [`Chunk`] at `offset`, and the batches of each are
/// trimmed to the range.
///
/// # Errors
/// The stream yields `read_at`'s errors, and [`CoreError::LogEndsEarly`] (converted to
/// `E`) when a read at an offset below `to` finds no batch.
pub fn read<B, E, F, Fut>(
    log: impl std::fmt::Display,
    from: i64,
    to: i64,
    read_at: F,
) -> BoxStream<'static, Result<B, E>>
where
    B: OffsetBatch + Send + 'static,
    E: From<CoreError> + Send + 'static,
    F: Fn(i64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Chunk<B>, E>> + Send + 'static,
{
    // Named only in the error of a short log: shared by the reads, not copied per chunk.
    let log: Arc<str> = log.to_string().into();
    stream::try_unfold(from, move |offset| {
        let read = (offset < to).then(|| read_at(offset));
        let log = Arc::clone(&log);
        async move {
            let Some(read) = read else {
                return Ok::<_, E>(None);
            };
            let chunk = read.await?;
            if chunk.batches.is_empty() {
                return Err(CoreError::LogEndsEarly {
                    log: log.to_string(),
                    at: offset,
                    to,
                }
                .into());
            }
            let trimmed: Vec<Result<B, E>> = (chunk.batches.into_iter())
                .filter_map(|batch| trim(batch, offset, to))
                .map(Ok)
                .collect();
            Ok(Some((stream::iter(trimmed), chunk.next_offset)))
        }
    })
    .try_flatten()
    .boxed()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::TryStreamExt;

    use super::*;

    /// A batch as offsets only.
    #[derive(Debug, Clone, PartialEq)]
    struct Offsets(Vec<i64>);

    impl OffsetBatch for Offsets {
        fn base_offset(&self) -> i64 {
            self.0[0]
        }

        fn num_rows(&self) -> usize {
            self.0.len()
        }

        fn slice(self, start: usize, len: usize) -> Self {
            Self(self.0[start..start + len].to_vec())
        }
    }

    /// A log of batches of 4 rows from offset 0 to `end`, read 2 batches at a time.
    fn log_until(
        end: i64,
        reads: Arc<AtomicUsize>,
    ) -> impl Fn(i64) -> std::future::Ready<Result<Chunk<Offsets>, CoreError>> {
        move |offset| {
            reads.fetch_add(1, Ordering::Relaxed);
            let first = offset - offset % 4;
            let batches: Vec<Offsets> = (0..2)
                .map(|i| first + 4 * i)
                .filter(|&base| base < end)
                .map(|base| Offsets((base..(base + 4).min(end)).collect()))
                .collect();
            let next_offset = batches.last().map_or(offset, |b| b.0[b.0.len() - 1] + 1);
            std::future::ready(Ok(Chunk {
                batches,
                next_offset,
            }))
        }
    }

    async fn offsets(from: i64, to: i64, end: i64) -> (Result<Vec<i64>, CoreError>, usize) {
        let reads = Arc::new(AtomicUsize::new(0));
        let batches: Result<Vec<Offsets>, CoreError> =
            read("b", from, to, log_until(end, Arc::clone(&reads)))
                .try_collect()
                .await;
        let rows = batches.map(|batches| batches.into_iter().flat_map(|b| b.0).collect());
        (rows, reads.load(Ordering::Relaxed))
    }

    #[test]
    fn a_batch_is_trimmed_to_the_range() {
        let batch = || Offsets(vec![10, 11, 12, 13]);
        assert_eq!(trim(batch(), 0, 100), Some(batch()));
        assert_eq!(trim(batch(), 11, 13), Some(Offsets(vec![11, 12])));
        assert_eq!(trim(batch(), 13, 100), Some(Offsets(vec![13])));
        assert_eq!(trim(batch(), 14, 100), None);
        assert_eq!(trim(batch(), 0, 10), None);
        assert_eq!(trim(batch(), 12, 12), None);
        assert_eq!(trim(batch(), i64::MIN, i64::MAX), Some(batch()));
    }

    #[tokio::test]
    async fn every_offset_of_the_range_is_read_once_in_order() {
        for (from, to) in [(0, 24), (3, 21), (5, 6), (8, 16), (23, 24)] {
            let (rows, _) = offsets(from, to, 24).await;
            assert_eq!(
                rows.unwrap(),
                (from..to).collect::<Vec<_>>(),
                "[{from}, {to})"
            );
        }
    }

    #[tokio::test]
    async fn an_empty_range_reads_nothing() {
        let (rows, reads) = offsets(7, 7, 24).await;
        assert_eq!(rows.unwrap(), Vec::<i64>::new());
        assert_eq!(reads, 0);
    }

    #[tokio::test]
    async fn a_log_that_ends_before_the_range_does_is_an_error() {
        let (rows, _) = offsets(2, 30, 24).await;
        let error = rows.unwrap_err();
        assert!(
            matches!(error, CoreError::LogEndsEarly { at: 24, to: 30, .. }),
            "{error}"
        );
    }
}
