//! Calls that run statements: counted while they run, stopped when the server shuts
//! down, and result streams cancelled by ticket. A shutdown first lets them finish for a
//! grace period; then a result stream ends with `Unavailable` ("the server is shutting
//! down") and an update or ingest is abandoned, so the node is never shut down under a
//! statement still using it. A client's `CancelFlightInfo` ends the streams of the
//! tickets its FlightInfo names with `Cancelled` (every FlightInfo's ticket is unique,
//! see [`super::handle`], so no other client's stream is touched).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arrow_flight::FlightData;
use futures::{Stream, StreamExt};
use prost::bytes::Bytes;
use tokio::sync::watch;
use tonic::Status;

/// A stream of Flight data answering a `DoGet`.
pub(crate) type DataStream = Pin<Box<dyn Stream<Item = Result<FlightData, Status>> + Send>>;

/// The service's side: runs calls, counted and stoppable.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    count: Arc<AtomicUsize>,
    stop: watch::Receiver<bool>,
    streams: Arc<Streams>,
}

/// The result streams running, by a number of their own: their ticket and the switch
/// that cancels them.
#[derive(Debug, Default)]
struct Streams {
    next: AtomicU64,
    running: Mutex<HashMap<u64, (Bytes, watch::Sender<bool>)>>,
}

/// One registered result stream, unregistered when dropped.
#[derive(Debug)]
struct Registered {
    streams: Arc<Streams>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.streams
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
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
        streams: Arc::default(),
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

    /// `data`, the rows of `ticket`: counted as long as it lives, ended with
    /// `Unavailable` if the server stops first and with `Cancelled` if a client cancels
    /// the ticket.
    pub(crate) fn stream(&self, ticket: Bytes, data: DataStream) -> DataStream {
        let (cancel, cancelled) = watch::channel(false);
        let id = self.streams.next.fetch_add(1, Ordering::Relaxed);
        self.streams
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, (ticket, cancel));
        let registered = Registered {
            streams: Arc::clone(&self.streams),
            id,
        };
        // Dropped in this order: the ticket leaves the registry before the call stops
        // counting, so no statement is counted as gone while it can still be cancelled.
        let guards = (registered, Counted::enter(&self.count));
        let state = (data, self.stop.clone(), cancelled, guards, false);
        Box::pin(futures::stream::unfold(
            state,
            |(mut data, mut stop, mut cancelled, guards, ended)| async move {
                if ended {
                    return None;
                }
                let (next, ended) = tokio::select! {
                    item = data.next() => (item, false),
                    _ = stop.wait_for(|stopped| *stopped) => (Some(Err(stopping())), true),
                    _ = cancelled.wait_for(|cancelled| *cancelled) => {
                        (Some(Err(Status::cancelled("the query was cancelled"))), true)
                    }
                };
                next.map(|item| (item, (data, stop, cancelled, guards, ended)))
            },
        ))
    }

    /// Cancels the running streams of `ticket`; answers how many there were.
    pub(crate) fn cancel(&self, ticket: &[u8]) -> usize {
        let running = self
            .streams
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut cancelled = 0;
        for (_, cancel) in running.values().filter(|(t, _)| t.as_ref() == ticket) {
            cancel.send_replace(true);
            cancelled += 1;
        }
        cancelled
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
    async fn a_cancel_ends_the_streams_of_its_ticket_only() {
        let (running, stopper) = running();
        let endless = || -> DataStream { Box::pin(futures::stream::pending()) };
        let mut first = running.stream(Bytes::from_static(b"a"), endless());
        let mut other = running.stream(Bytes::from_static(b"b"), endless());
        assert_eq!(running.cancel(b"a"), 1);
        let ended = first.next().await.expect("an item").expect_err("cancelled");
        assert_eq!(ended.code(), tonic::Code::Cancelled);
        assert!(first.next().await.is_none());
        drop(first);
        assert_eq!(running.cancel(b"a"), 0, "unregistered once dropped");
        let pending = tokio::time::timeout(Duration::from_millis(50), other.next()).await;
        assert!(pending.is_err(), "the other ticket's stream runs on");
        assert_eq!(stopper.count(), 1);
    }

    #[tokio::test]
    async fn calls_are_counted_and_stopped() {
        let (running, stopper) = running();
        let endless: DataStream = Box::pin(futures::stream::pending());
        let mut stream = running.stream(Bytes::from_static(b"t"), endless);
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
