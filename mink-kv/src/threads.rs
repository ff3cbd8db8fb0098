//! The KV store's threads: pools of threads of their own that run the store's synchronous
//! work, one for its reads (lookups and the chunks of a snapshot) and one for the updates
//! of committed groups.
//!
//! fjall's calls are synchronous. Run here, they never block the async runtime's workers,
//! never queue behind the blocking pool's other work (segment reads, group commits,
//! retention), cost no thread start each, and no more of them run at once than a pool has
//! threads, however many clients read or buckets write: the others wait in the queue, in
//! order.
//!
//! One exception: many point reads at once (a lookup of many keys, the stored rows a group
//! of upserts replaces) and the ingestion of a large flush are split over the machine's
//! cores by [`split_over`], on threads started for them and ended with them, as the
//! waiting thread cannot hand them to a pool whose threads may all be waiting alike. Only
//! a pool thread or a bucket's appender splits its work, one split at a time, so the
//! threads started at once stay below (pool threads + buckets written) × cores.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, channel};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::oneshot;

use crate::error::{KvError, Result};

type Job = Box<dyn FnOnce() + Send>;

/// A pool of threads. Cheap to clone; the threads end once every clone is dropped.
#[derive(Debug, Clone)]
pub(crate) struct KvThreads {
    jobs: Sender<Job>,
}

/// A job submitted with [`KvThreads::submit`], whose result is waited for without a
/// runtime.
#[derive(Debug)]
pub(crate) struct Submitted<T>(mpsc::Receiver<T>);

impl<T> Submitted<T> {
    /// Blocks until the job is done; an error if it panicked.
    pub(crate) fn wait(self) -> Result<T> {
        self.0
            .recv()
            .map_err(|_| KvError::Store("a KV store job panicked".into()))
    }
}

impl KvThreads {
    /// Starts `threads` threads (at least one) named `name-N`.
    pub(crate) fn start(name: &str, threads: usize) -> Result<Self> {
        let (jobs, queue) = channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for index in 0..threads.max(1) {
            let queue = Arc::clone(&queue);
            std::thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || serve(&queue))?;
        }
        Ok(Self { jobs })
    }

    /// Runs `job` on a thread of the pool; resolves with its result.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.queue(job)?.await
    }

    /// Queues `job` on the pool now (not when the answer is first polled); the future
    /// resolves with its result.
    pub(crate) fn queue<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<impl Future<Output = Result<T>> + Send + 'static> {
        let (done, result) = oneshot::channel();
        self.send(Box::new(move || {
            let _ = done.send(job());
        }))?;
        Ok(async move {
            result
                .await
                .map_err(|_| KvError::Store("a KV store job panicked".into()))?
        })
    }

    /// Queues `job` on the pool; [`Submitted::wait`] blocks for its result.
    pub(crate) fn submit<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<Submitted<T>> {
        let (done, result) = mpsc::sync_channel(1);
        self.send(Box::new(move || {
            let _ = done.send(job());
        }))?;
        Ok(Submitted(result))
    }

    fn send(&self, job: Job) -> Result<()> {
        self.jobs
            .send(job)
            .map_err(|_| KvError::ShuttingDown("the KV store's threads".into()))
    }
}

/// One thread: runs jobs until the queue closes. A job that panics drops its answer (its
/// caller gets an error); the thread goes on.
fn serve(queue: &Mutex<Receiver<Job>>) {
    loop {
        let job = match queue.lock() {
            Ok(queue) => queue.recv(),
            Err(poisoned) => poisoned.into_inner().recv(),
        };
        let Ok(job) = job else {
            return;
        };
        let _ = catch_unwind(AssertUnwindSafe(job));
    }
}

/// The machine's cores (two where it cannot be told): the threads of each of the store's
/// pools, and the most threads a split uses.
pub(super) fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(2, usize::from))
}

/// How many pieces [`split_over`] cuts its items into per thread: a thread that starts
/// late, or loses its core for a while, leaves its pieces to the others.
const PIECES_PER_THREAD: usize = 8;

/// `work` done on `items` by this thread and up to `threads - 1` threads started for it;
/// the results in the order of `items`.
///
/// The items are cut into pieces that the threads take in turn until none is left, so
/// none waits for another's fixed share: the thread started last on a busy machine
/// (which began up to 2.5 ms late during the upserts of `mink-bench kv`) takes fewer
/// pieces. A thread that cannot be started leaves its pieces to the others; a piece that
/// fails or panics stops the taking, and the split returns its error (a panic is one too,
/// with one thread as with many).
pub(super) fn split_over<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    work: impl Fn(&[T]) -> Result<Vec<R>> + Sync,
) -> Result<Vec<R>> {
    if threads <= 1 {
        return catch_unwind(AssertUnwindSafe(|| work(items))).unwrap_or_else(panicked);
    }
    let piece_len = items.len().div_ceil(threads * PIECES_PER_THREAD).max(1);
    let pieces: Vec<&[T]> = items.chunks(piece_len).collect();
    let next = AtomicUsize::new(0);
    let take_pieces = || -> Result<Vec<(usize, Vec<R>)>> {
        let mut taken = Vec::new();
        loop {
            let index = next.fetch_add(1, Ordering::Relaxed);
            let Some(&piece) = pieces.get(index) else {
                return Ok(taken);
            };
            match catch_unwind(AssertUnwindSafe(|| work(piece))).unwrap_or_else(panicked) {
                Ok(results) => taken.push((index, results)),
                Err(error) => {
                    next.store(pieces.len(), Ordering::Relaxed);
                    return Err(error);
                }
            }
        }
    };
    let taken: Result<Vec<_>> = std::thread::scope(|scope| {
        let take_pieces = &take_pieces;
        let started: Vec<_> = (1..threads.min(pieces.len()))
            .filter_map(|_| {
                std::thread::Builder::new()
                    .name("mink-kv-split".into())
                    .spawn_scoped(scope, take_pieces)
                    .ok()
            })
            .collect();
        let mine = take_pieces();
        // Every thread is joined before the first error is returned.
        let others: Vec<_> = started.into_iter().map(|thread| thread.join()).collect();
        let mut taken = mine?;
        for other in others {
            taken.extend(other.unwrap_or_else(panicked)?);
        }
        Ok(taken)
    });
    let mut taken = taken?;
    taken.sort_unstable_by_key(|&(index, _)| index);
    let mut results = Vec::with_capacity(taken.iter().map(|(_, results)| results.len()).sum());
    for (_, piece_results) in taken {
        results.extend(piece_results);
    }
    Ok(results)
}

/// The error of a split's work that panicked.
fn panicked<T>(_: Box<dyn std::any::Any + Send>) -> Result<T> {
    Err(KvError::Store("a thread of the KV store panicked".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_work_keeps_the_order_of_its_items() {
        let doubled = |part: &[u32]| Ok(part.iter().map(|n| n * 2).collect());
        let items: Vec<u32> = (0..1000).collect();
        let expected: Vec<u32> = items.iter().map(|n| n * 2).collect();
        for threads in [0, 1, 2, 3, 7, 2000] {
            assert_eq!(
                split_over(&items, threads, doubled).unwrap(),
                expected,
                "{threads}"
            );
        }
        assert!(split_over(&[], 4, doubled).unwrap().is_empty());
        // The first pieces finish last: the results still come in the items' order.
        let early_pieces_slow = |part: &[u32]| {
            if part[0] < 100 {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            doubled(part)
        };
        assert_eq!(split_over(&items, 4, early_pieces_slow).unwrap(), expected);
    }

    #[test]
    fn a_failed_or_panicking_piece_stops_the_split_with_an_error() {
        let items: Vec<u32> = (0..1000).collect();
        for panics in [false, true] {
            let pieces_worked = AtomicUsize::new(0);
            let failed = split_over(&items, 2, |part: &[u32]| {
                pieces_worked.fetch_add(1, Ordering::Relaxed);
                if part.contains(&0) {
                    // The first piece fails once the other thread had time to start.
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    match panics {
                        true => panic!("a broken piece"),
                        false => return Err(KvError::Store("broken".into())),
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
                Ok(vec![0])
            });
            let error = failed.unwrap_err().to_string();
            let expected = if panics { "panicked" } else { "broken" };
            assert!(error.contains(expected), "{error}");
            // 16 pieces: the other thread works two or three while the first fails, then
            // stops. (A panic prints its backtrace first, which may take the others'
            // time: there only the error is checked.)
            if !panics {
                assert!(
                    pieces_worked.load(Ordering::Relaxed) < 16,
                    "the taking stopped"
                );
            }
        }
        let alone = split_over(&items, 1, |_: &[u32]| -> Result<Vec<u32>> {
            panic!("broken")
        });
        assert!(
            alone.unwrap_err().to_string().contains("panicked"),
            "one thread too"
        );
    }

    #[tokio::test]
    async fn jobs_run_and_a_panicking_one_leaves_the_threads_serving() {
        let threads = KvThreads::start("test", 2).unwrap();
        assert_eq!(threads.run(|| Ok(41 + 1)).await.unwrap(), 42);
        let error = threads
            .run::<()>(|| panic!("a broken job"))
            .await
            .unwrap_err();
        assert!(error.to_string().contains("panicked"), "{error}");
        let answers =
            futures::future::join_all((0..8).map(|i| threads.run(move || Ok(i * 2)))).await;
        let answers: Vec<i32> = answers.into_iter().map(Result::unwrap).collect();
        assert_eq!(answers, [0, 2, 4, 6, 8, 10, 12, 14]);
    }

    #[test]
    fn a_submitted_job_is_waited_for_without_a_runtime() {
        let threads = KvThreads::start("test", 1).unwrap();
        assert_eq!(threads.submit(|| 7).unwrap().wait().unwrap(), 7);
        let broken: Submitted<()> = threads.submit(|| panic!("a broken job")).unwrap();
        let error = broken.wait().unwrap_err();
        assert!(error.to_string().contains("panicked"), "{error}");
        assert_eq!(threads.submit(|| 8).unwrap().wait().unwrap(), 8);
    }
}
