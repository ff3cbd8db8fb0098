//! The KV store's threads: pools of threads of their own that run the store's synchronous
//! work, one for its reads (lookups and the chunks of a snapshot) and one for the updates
//! of committed groups.
//!
//! fjall's calls are synchronous. Run here, they never block the async runtime's workers,
//! never queue behind the blocking pool's other work (segment reads, group commits,
//! retention), cost no thread start each, and no more of them run at once than a pool has
//! threads, however many clients read or buckets write: the others wait in the queue, in
//! order.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{self, Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::error::{NodeError, Result};

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
            .map_err(|_| NodeError::Kv("a KV store job panicked".into()))
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
                .map_err(|_| NodeError::Kv("a KV store job panicked".into()))?
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
            .map_err(|_| NodeError::ShuttingDown("the KV store's threads".into()))
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

#[cfg(test)]
mod tests {
    use super::*;

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
