//! What a worker (or the coordinator) checks in the answers of the workers it reads a
//! stage's output from, before datafusion-distributed decodes them ([`CheckedAnswers`]).
//!
//! A stage reads its input stages over `ExecuteTask` calls to the workers that a plan
//! names, and their answer is a stream of Arrow Flight `FlightData` messages: an Arrow
//! IPC header and a body each. arrow-ipc allocates the uncompressed length a compressed
//! buffer declares before it reads the buffer, so a plan naming an address its sender
//! serves, answering one batch whose LZ4 buffer declares 2^50 bytes, aborted the worker.
//! mink's coordinators ask every stage for uncompressed output (`Distribution`), so
//! the answers are read through a check that refuses any compressed IPC:
//!
//! ```text
//!   ExecuteTask answer:  | 0 | len: u32 BE | FlightData | 0 | len | FlightData | ... | trailers
//!                          ^ a flag other than 0, or len > MAX_ANSWER_MESSAGE_BYTES: refused
//!                                          ^ each message is held until whole, its data_header
//!                                            checked (ipc_guard::check_header), then passed on
//! ```
//!
//! A refusal ends the answer with a status naming the reason, `OUT_OF_RANGE` for a
//! message over `MAX_ANSWER_MESSAGE_BYTES` and `INVALID_ARGUMENT` otherwise: the stage
//! reading it fails, with the statement it belongs to, and the process goes on.
//! An answer that ends (or sends its trailers) within a message fails the same way, so
//! nothing is dropped silently. tonic reserves a message's declared length as soon as it
//! sees its prefix, so the bound on a message's length is checked before tonic sees it.
//! Answers of the other calls (a plan's acknowledgement, a probe) hold no IPC and pass
//! unread.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::TryFutureExt;
use http_body_util::{BodyExt, StreamBody};
use mink_core::ipc_guard::check_header;
use prost::Message as _;
use prost::bytes::{Bytes, BytesMut};
use tonic::Status;
use tonic::body::Body;
use tower::Service;

use super::limits::MAX_ANSWER_MESSAGE_BYTES;
use super::wire::{FlightDataHeader, GRPC_PREFIX as PREFIX, message_length};

/// The call whose answers carry another stage's output.
const EXECUTE_TASK: &str = "/worker.WorkerService/ExecuteTask";

/// A channel to a worker whose `ExecuteTask` answers are checked (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct CheckedAnswers<S> {
    inner: S,
}

impl<S> CheckedAnswers<S> {
    /// The channel `inner`, its answers checked.
    pub(crate) fn new(inner: S) -> Self {
        Self { inner }
    }
}

impl<S> Service<http::Request<Body>> for CheckedAnswers<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let carries_batches = request.uri().path() == EXECUTE_TASK;
        let answer = self.inner.call(request);
        Box::pin(answer.map_ok(move |response| match carries_batches {
            true => response.map(checked),
            false => response,
        }))
    }
}

/// `body`, an `ExecuteTask` answer, passed on message by message once each is checked.
fn checked(body: Body) -> Body {
    let frames = futures::stream::try_unfold(
        (body, Messages::default()),
        |(mut body, mut messages)| async move {
            let Some(frame) = body.frame().await.transpose()? else {
                messages.finish()?;
                return Ok::<_, Status>(None);
            };
            let frame = match frame.data_ref() {
                Some(data) => {
                    let whole = messages.feed(data)?;
                    frame.map_data(|_| whole)
                }
                None => {
                    messages.finish()?;
                    frame
                }
            };
            Ok::<_, Status>(Some((frame, (body, messages))))
        },
    );
    Body::new(StreamBody::new(frames))
}

/// The bytes of an answer not passed on yet: the start of a message not whole yet.
#[derive(Debug, Default)]
struct Messages {
    pending: BytesMut,
}

impl Messages {
    /// Takes `data`, the answer's next bytes: the messages it completes, checked, to pass
    /// on (none, when it completes none).
    fn feed(&mut self, data: &[u8]) -> Result<Bytes, Status> {
        self.pending.extend_from_slice(data);
        let mut whole = 0;
        while let Some(length) = self.next_length(whole)? {
            check_message(&self.pending[whole + PREFIX..whole + PREFIX + length])?;
            whole += PREFIX + length;
        }
        Ok(self.pending.split_to(whole).freeze())
    }

    /// The length of the message at `at` when it is whole; its prefix is judged as soon
    /// as it is there.
    fn next_length(&self, at: usize) -> Result<Option<usize>, Status> {
        let Some(&prefix) = self.pending.get(at..).and_then(<[u8]>::first_chunk) else {
            return Ok(None);
        };
        let length = message_length(prefix, MAX_ANSWER_MESSAGE_BYTES).map_err(|refused| {
            Status::new(
                refused.code(),
                format!("a worker's answer: {}", refused.message()),
            )
        })?;
        Ok((self.pending.len() - at - PREFIX >= length).then_some(length))
    }

    /// The answer ends, or its trailers come: no message may be left unfinished.
    fn finish(&self) -> Result<(), Status> {
        match self.pending.is_empty() {
            true => Ok(()),
            false => Err(Status::invalid_argument(format!(
                "a worker's answer ended within a message ({} bytes of it received)",
                self.pending.len()
            ))),
        }
    }
}

/// Checks one `FlightData` message: its IPC header must parse and not declare
/// compression (read as tonic reads it: the last `data_header` of the message counts).
fn check_message(message: &[u8]) -> Result<(), Status> {
    let data = FlightDataHeader::decode(message)
        .map_err(|e| Status::invalid_argument(format!("a worker's answer: {e}")))?;
    check_header(&data.data_header)
        .map_err(|e| Status::invalid_argument(format!("a worker's answer: {e}")))
}

#[cfg(test)]
mod tests;
