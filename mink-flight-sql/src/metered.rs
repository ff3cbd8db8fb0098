//! The layer that gives every call its [`CallMemory`] and reserves in it the request
//! message being received.
//!
//! gRPC sends each message with a 5-byte prefix: a compression flag and the message's
//! length. tonic reads a whole message into one buffer before it decodes it, reserving
//! room for all of it as soon as the prefix arrives, so a client that announces large
//! messages on many calls at once makes the server hold them all before any handler
//! runs. [`Metered`] wraps the service: each call gets a [`CallMemory`] (in the request's
//! extensions, for the handlers), and its request body is read through
//! [`MeteredRequest`], which follows the prefixes as the bytes go by and reserves each
//! message's length in the pool before tonic sees the first byte of it:
//!
//! ```text
//! | 0 | len: u32 BE | message (len bytes) | 0 | len | message ... |
//!   ^ prefix read: the previous message's reservation is released,
//!     `len` is reserved, or the call fails with RESOURCE_EXHAUSTED
//! ```
//!
//! A message stays reserved until the next one's prefix arrives or the call ends: once
//! decoded it lives on in what the handler holds (a handle's bytes, a batch). The call's
//! answer body carries the [`CallMemory`] too, so what the call keeps, its last message
//! included, is released when its answer has been handed to the connection. A message
//! longer than [`MAX_MESSAGE_BYTES`] is not reserved: tonic refuses it (`OUT_OF_RANGE`).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use datafusion::execution::memory_pool::MemoryPool;
use http_body::{Frame, SizeHint};
use prost::bytes::Bytes;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, StdError, http};
use tonic::server::NamedService;

use crate::limits::MAX_MESSAGE_BYTES;
use crate::memory::CallMemory;

/// gRPC's message prefix: a compression flag and a big-endian `u32` length.
const PREFIX_BYTES: usize = 5;

/// A service whose calls each have a [`CallMemory`] in `pool` (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct Metered<S> {
    inner: S,
    pool: Arc<dyn MemoryPool>,
}

impl<S> Metered<S> {
    pub(crate) fn new(inner: S, pool: Arc<dyn MemoryPool>) -> Self {
        Self { inner, pool }
    }
}

impl<S: NamedService> NamedService for Metered<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<Body>> for Metered<S>
where
    S: Service<http::Request<Body>, Response = http::Response<B>, Error = Infallible>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<StdError>,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let memory = CallMemory::new(&self.pool, request.uri().path());
        let (mut parts, body) = request.into_parts();
        parts.extensions.insert(memory.clone());
        let body = Body::new(MeteredRequest::new(body, memory.clone()));
        let answer = self.inner.call(http::Request::from_parts(parts, body));
        Box::pin(async move {
            let answer = answer.await?;
            Ok(answer.map(|body| {
                let body = Box::pin(body);
                Body::new(Holding {
                    body,
                    _memory: memory,
                })
            }))
        })
    }
}

/// A request body whose messages are reserved in the call's memory as their prefixes
/// arrive.
#[derive(Debug)]
struct MeteredRequest {
    body: Body,
    memory: CallMemory,
    prefixes: Prefixes,
}

impl MeteredRequest {
    fn new(body: Body, memory: CallMemory) -> Self {
        Self {
            body,
            memory,
            prefixes: Prefixes::default(),
        }
    }

    /// Reserves the messages whose prefixes `data` completes, each in place of the one
    /// before (one tonic refuses is not reserved).
    fn reserve(&mut self, data: &[u8]) -> Result<(), Status> {
        for length in self.prefixes.read(data) {
            // tonic refuses a longer message (`OUT_OF_RANGE`) without buffering it.
            let buffered = if length <= MAX_MESSAGE_BYTES {
                length
            } else {
                0
            };
            self.memory.receive(buffered)?;
        }
        Ok(())
    }
}

impl http_body::Body for MeteredRequest {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.body).poll_frame(cx));
        if let Some(data) = frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref())
            && let Err(refused) = this.reserve(data)
        {
            return Poll::Ready(Some(Err(refused)));
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// An answer body that keeps its call's memory until it is dropped.
#[derive(Debug)]
struct Holding<B> {
    body: Pin<Box<B>>,
    _memory: CallMemory,
}

impl<B: http_body::Body> http_body::Body for Holding<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        self.get_mut().body.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Where a stream of gRPC messages is: inside a message's prefix, or inside its bytes.
#[derive(Debug, Default)]
struct Prefixes {
    prefix: [u8; PREFIX_BYTES],
    prefix_read: usize,
    message_left: usize,
}

impl Prefixes {
    /// Reads the next bytes of the stream; answers the lengths of the messages whose
    /// prefixes they complete, in order.
    fn read(&mut self, mut data: &[u8]) -> Vec<usize> {
        let mut lengths = Vec::new();
        while !data.is_empty() {
            if self.message_left > 0 {
                let skipped = self.message_left.min(data.len());
                self.message_left -= skipped;
                data = &data[skipped..];
                continue;
            }
            let taken = (PREFIX_BYTES - self.prefix_read).min(data.len());
            self.prefix[self.prefix_read..self.prefix_read + taken].copy_from_slice(&data[..taken]);
            self.prefix_read += taken;
            data = &data[taken..];
            if self.prefix_read == PREFIX_BYTES {
                let [_, length @ ..] = self.prefix;
                let length = u32::from_be_bytes(length) as usize;
                lengths.push(length);
                (self.prefix_read, self.message_left) = (0, length);
            }
        }
        lengths
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gRPC message of `length` bytes, prefix included.
    fn message(length: u32) -> Vec<u8> {
        let mut bytes = vec![0];
        bytes.extend(length.to_be_bytes());
        bytes.extend(std::iter::repeat_n(7, length as usize));
        bytes
    }

    #[test]
    fn prefixes_are_found_however_the_bytes_are_cut() {
        let stream: Vec<u8> = [message(3), message(0), message(300), message(1)].concat();
        for cut in [1, 2, 4, 5, 7, 64, stream.len()] {
            let mut prefixes = Prefixes::default();
            let lengths: Vec<usize> = stream
                .chunks(cut)
                .flat_map(|chunk| prefixes.read(chunk))
                .collect();
            assert_eq!(lengths, [3, 0, 300, 1], "chunks of {cut}");
        }
    }

    #[test]
    fn a_message_is_reserved_from_its_prefix_until_the_next() {
        let pool = mink_sql::session::memory_pool(1 << 20);
        let memory = CallMemory::new(&pool, "DoPut");
        let mut request = MeteredRequest::new(Body::empty(), memory);
        let big = message(600 << 10);
        request.reserve(&big[..PREFIX_BYTES]).expect("fits");
        assert_eq!(pool.reserved(), 600 << 10, "reserved before its bytes");
        request.reserve(&big[PREFIX_BYTES..]).expect("its bytes");
        request.reserve(&message(100)).expect("the next");
        assert_eq!(pool.reserved(), 100, "the first released");
        let refused = request
            .reserve(&message(2 << 20)[..PREFIX_BYTES])
            .expect_err("over the pool");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");
        assert!(
            refused
                .message()
                .contains("for a request message (2.0 MiB)"),
            "{refused}"
        );

        let mut request = MeteredRequest::new(Body::empty(), CallMemory::new(&pool, "DoGet"));
        let mut prefix = vec![0];
        prefix.extend(
            u32::try_from(MAX_MESSAGE_BYTES + 1)
                .expect("a u32")
                .to_be_bytes(),
        );
        request.reserve(&prefix).expect("left to tonic's refusal");
    }
}
