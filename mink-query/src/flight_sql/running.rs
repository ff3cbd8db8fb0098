//! Calls that run statements: counted while they run, and stopped when the server shuts
//! down. A shutdown first lets them finish for a grace period; then a result stream ends
//! with `Unavailable` ("the server is shutting down") and an update or ingest is
//! abandoned, so the node is never shut down under a statement still using it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow_flight::FlightData;
use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tonic::Status;

/// A stream of Flight data answering a `DoGet`.
pub(crate) type DataStream = Pin<Box<dyn Stream<Item = Result<FlightData, Status>> + Send>>;

/// The service's side: runs calls, counted and stoppable.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    count: Arc<AtomicUsize>,
    stop: watch::Receiver<bool>,
}

/// The handle's side: counts the running calls and stops them. Dropping it stops them
/// too.
#[derive(Debug)]
pub(crate) struct Stopper {
    count: Arc<AtomicUsize>,
    stop: watch::Sender<bool>,
}

/// A new pair.
pub(crate) fn running() -> (Running, Stopper) {
    let count = Arc::new(AtomicUsize::new(0));
    let (stop, stopped) = watch::channel(false);
    let running = Running {
        count: Arc::clone(&count),
        stop: stopped,
    };
    (running, Stopper { count, stop })
}

impl Running {
    /// Runs `call`, unless the server stops first.
    pub(crate) async fn call<T>(
        &self,
        call: impl Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        let _counted = Counted::enter(&self.count);
        let mut stop = self.stop.clone();
        tokio::select! {
            answer = call => answer,
            _ = stop.wait_for(|stopped| *stopped) => Err(stopping()),
        }
    }

    /// `data`, counted as long as it lives and ended with `Unavailable` if the server
    /// stops first.
    pub(crate) fn stream(&self, data: DataStream) -> DataStream {
        let state = (data, self.stop.clone(), Counted::enter(&self.count), false);
        Box::pin(futures::stream::unfold(
            state,
            |(mut data, mut stop, counted, stopped)| async move {
                if stopped {
                    return None;
                }
                let (next, stopped) = tokio::select! {
                    item = data.next() => (item, false),
                    _ = stop.wait_for(|stopped| *stopped) => (Some(Err(stopping())), true),
                };
                next.map(|item| (item, (data, stop, counted, stopped)))
            },
        ))
    }
}

impl Stopper {
    /// The calls running now.
    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Stops every running call (and every later one).
    pub(crate) fn stop(&self) {
        self.stop.send_replace(true);
    }
}

fn stopping() -> Status {
    Status::unavailable("the server is shutting down")
}

/// One running call, counted until dropped.
#[derive(Debug)]
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn enter(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(count))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn calls_are_counted_and_stopped() {
        let (running, stopper) = running();
        let endless: DataStream = Box::pin(futures::stream::pending());
        let mut stream = running.stream(endless);
        let call = tokio::spawn({
            let running = running.clone();
            async move {
                running
                    .call(std::future::pending::<Result<(), Status>>())
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(stopper.count(), 2);
        stopper.stop();
        let ended = stream.next().await.expect("an item").expect_err("stopped");
        assert_eq!(ended.code(), tonic::Code::Unavailable);
        assert!(stream.next().await.is_none());
        let abandoned = call.await.expect("joined").expect_err("stopped");
        assert_eq!(abandoned.code(), tonic::Code::Unavailable);
        drop(stream);
        assert_eq!(stopper.count(), 0);
    }
}
