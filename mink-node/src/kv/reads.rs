//! The KV read executor: threads of their own that run the store's reads (lookups and
//! the chunks of a snapshot).
//!
//! fjall's reads are synchronous. Run here, they never block the async runtime's workers,
//! never queue behind the blocking pool's other work (segment reads, group commits,
//! retention), and no more of them run at once than there are threads, however many
//! clients read: the others wait in the queue, in order.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::error::{NodeError, Result};

type Job = Box<dyn FnOnce() + Send>;

/// A pool of KV read threads. Cheap to clone; the threads end once every clone is dropped.
#[derive(Debug, Clone)]
pub(crate) struct KvReads {
    jobs: Sender<Job>,
}

impl KvReads {
    /// Starts `threads` read threads (at least one).
    pub(crate) fn start(threads: usize) -> Result<Self> {
        let (jobs, queue) = channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for index in 0..threads.max(1) {
            let queue = Arc::clone(&queue);
            std::thread::Builder::new()
                .name(format!("mink-kv-read-{index}"))
                .spawn(move || serve(&queue))?;
        }
        Ok(Self { jobs })
    }

    /// Runs `read` on a read thread; resolves with its result.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        read: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (done, result) = oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = done.send(read());
        });
        self.jobs
            .send(job)
            .map_err(|_| NodeError::ShuttingDown("the KV read threads".into()))?;
        result
            .await
            .map_err(|_| NodeError::Kv("a KV read panicked".into()))?
    }
}

/// One read thread: runs jobs until the queue closes. A job that panics drops its answer
/// (its caller gets an error); the thread goes on.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_run_and_a_panicking_one_leaves_the_threads_serving() {
        let reads = KvReads::start(2).unwrap();
        assert_eq!(reads.run(|| Ok(41 + 1)).await.unwrap(), 42);
        let error = reads
            .run::<()>(|| panic!("a broken read"))
            .await
            .unwrap_err();
        assert!(error.to_string().contains("panicked"), "{error}");
        let answers = futures::future::join_all((0..8).map(|i| reads.run(move || Ok(i * 2)))).await;
        let answers: Vec<i32> = answers.into_iter().map(Result::unwrap).collect();
        assert_eq!(answers, [0, 2, 4, 6, 8, 10, 12, 14]);
    }
}
